"""Physical bounds on the speed calibration's terms and on the predictions made from them (issue 68).  Pure: no I/O.

A calibration measured while other work used the CPUs can come out several times too slow in one term (llama.cpp's
threads wait at every graph node for a thread the OS has descheduled; a paired difference whose deep runs were the
disturbed ones), and a prediction built on it then shows a 135M model decoding at 2.4 tokens/s.  Each term is checked
against what it cannot exceed given the other things edgekv measured on the same machine:

* a one-token graph's node does less work than a prompt ubatch's (NODE_PP_TOKENS[0] tokens) over the same thread
  barriers, so it cannot cost NODE_TG_OVER_SHORT times as much (about a quarter on two cores; alike where barriers
  dominate both);
* a decoded token's attention is one query row a head over the cells; a prompt token's is the same row, so (CPU,
  flash attention) the
  decode coefficient of a K/V pair cannot be DECODE_OVER_PROMPT times its prompt coefficient (the decode steps read
  the cache from memory once a token, the prompt steps once a 64-row query tile, largely from the caches: quiet
  two-core AVX2 EPYCs measure 3.6x to 7.8x for f16, so the bound sits at twice the largest ratio seen, and an
  inflated decode term (5 to 14x on a busy machine) still lands far past it);
* a weight type's mat-vec on the 48 MB model (partly in the CPU's caches) cannot be MATVEC_OVER_STREAM times slower a
  byte than the same type streamed from memory (the 384 MB models);
* a type streamed from memory cannot run below 1/STREAM_OVER_BANDWIDTH of the measured read bandwidth;
* a decoded token's graph and weights (its attention apart) cannot take ROOF_LIMIT times as long as its weights'
  bytes take at the measured read bandwidth: SmolLM2 135M's take two to three times as long on two cores; the 2.4
  tokens/s a busy calibration predicted was about fifty.

A term outside its bound is measured once more, then dropped (``Calibration.dropped``: term -> why); a prediction
that needs a dropped term is withheld with the reason.  Terms are named ``field`` or ``field:key``
(``attn_tg_s:f16/f16/fa=auto@h9kv3k64v64``).
"""

from __future__ import annotations

from edgekv.core.speedshape import NODE_PP_TOKENS, Calibration, SpeedShape, kv_key

NODE_TG_OVER_SHORT = 2.0
DECODE_OVER_PROMPT = 16.0
MATVEC_OVER_STREAM = 3.0
STREAM_OVER_BANDWIDTH = 8.0
ROOF_LIMIT = 10.0
ROOF_MIN_BYTES = 32 * 1024 * 1024
NODE_TERM = "node_tg_s"


def term_checks(cal: Calibration) -> dict[str, str]:
    """The terms of ``cal`` outside their physical bounds (term -> why, in words)."""
    out: dict[str, str] = {}
    if cal.device:          # a GPU's prompts and decodes run other kernels; its weights have no streaming models
        return out
    short = cal.node_pp_short_s
    if short and cal.node_tg_s > NODE_TG_OVER_SHORT * short:
        out[NODE_TERM] = (f"a one-token graph's node measured {cal.node_tg_s * 1e6:.1f} us, {cal.node_tg_s / short:.1f}x "
                          f"a {NODE_PP_TOKENS[0]}-token ubatch's {short * 1e6:.1f} us over the same thread barriers")
    for k, tg in cal.attn_tg_s.items():
        pp = cal.attn_pp_s.get(k)
        # without flash attention a prompt multiplies its rows by the cache in one mat-mat: far cheaper a row
        if pp and "fa=off" not in k and tg > DECODE_OVER_PROMPT * pp:
            out[f"attn_tg_s:{k}"] = (f"{k} decode attention measured {tg * 1e12:.0f} ps a cell, {tg / pp:.1f}x its "
                                     f"prompt's {pp * 1e12:.0f} ps (at most {DECODE_OVER_PROMPT:.0f}x: one query row "
                                     "a head either way)")
    for k, mv in cal.matvec_s_per_byte.items():
        st = cal.matvec_stream_s_per_byte.get(k)
        if st and mv > MATVEC_OVER_STREAM * st:
            out[f"matvec_s_per_byte:{k}"] = (f"{k} weights read at {1e-9 / mv:.1f} GB/s from a 48 MB model, "
                                             f"{mv / st:.1f}x slower than from memory ({1e-9 / st:.1f} GB/s)")
    bw = cal.bandwidth_bytes_s
    for k, st in cal.matvec_stream_s_per_byte.items():
        if bw and st * bw > STREAM_OVER_BANDWIDTH:
            out[f"matvec_stream_s_per_byte:{k}"] = (f"{k} weights streamed at {1e-9 / st:.2f} GB/s, below 1/"
                                                    f"{STREAM_OVER_BANDWIDTH:.0f} of the measured read bandwidth "
                                                    f"({bw / 1e9:.1f} GB/s)")
    return out


def base_term(term: str) -> bool:
    """Whether a term is measured by the calibration's base plan (its graph nodes, bandwidth and the generic model's
    f16 attention): re-measuring it measures that plan again."""
    return term == NODE_TERM or (term.startswith("attn_") and "@" not in term)


def drop_terms(cal: Calibration, terms: dict[str, str], keep_reason: bool = True) -> None:
    """Remove ``terms`` from ``cal`` (a dict term's entry; the node term stays, named in ``cal.dropped``), each one's
    reason kept in ``cal.dropped`` unless ``keep_reason`` is off (a term dropped to be measured again)."""
    for term, why in terms.items():
        field_, _, key = term.partition(":")
        if key:
            getattr(cal, field_, {}).pop(key, None)
            if field_ == "attn_tg_s":       # the pair is measured again as a whole
                for f in ("attn_pp_s", "attn_pp_rows_s", "attn_pp_deep_s"):
                    getattr(cal, f).pop(key, None)
            if field_.startswith("matvec"):  # the weight type is measured again as a whole
                for f in ("matvec_s_per_byte", "matvec_stream_s_per_byte", "matmul_s_per_flop", "matcols_s_per_byte"):
                    getattr(cal, f).pop(key, None)
        if keep_reason:
            cal.dropped[term] = why


def needed_terms(sh: SpeedShape, type_k: str, type_v: str, flash_attn: str, test: str) -> list[str]:
    """The checked terms a ``test`` ("tg" or "pp") prediction of ``sh`` with that K/V pair uses."""
    out = [NODE_TERM] if test == "tg" else []
    prefix = "attn_tg_s" if test == "tg" else "attn_pp_s"
    out += [f"{prefix}:{kv_key(type_k, type_v, flash_attn, lay.geometry)}" for lay in sh.attn]
    out += [f"attn_tg_s:{kv_key(type_k, type_v, flash_attn, lay.geometry)}" for lay in sh.attn if test == "pp"]
    for g in sh.groups:
        out += [f"matvec_s_per_byte:{g.key}", f"matvec_stream_s_per_byte:{g.key}"]
    return list(dict.fromkeys(out))


def dropped_reason(cal: Calibration, terms: list[str]) -> str | None:
    """Why a prediction that needs ``terms`` is withheld (the first dropped one), or None."""
    for t in terms:
        if t in cal.dropped:
            return (f"withheld: the calibration's {t.partition(':')[0]} term was outside its physical bound twice "
                    f"({cal.dropped[t]}) and was dropped; the next run measures it again")
    return None


def roofline_miss(sh: SpeedShape, parts: list[tuple[str, float]], bandwidth: float | None) -> str | None:
    """Why a decode prediction (its parts as (name, seconds per token)) is implausible against its roofline, or
    None.  Its attention is left out (a deep quantized cache legitimately decodes tens of times below the roofline,
    and its terms have their own bound): the rest of a token, its graph and its weights, may not take ROOF_LIMIT times
    as long as its weights' bytes at the measured read bandwidth.  A model whose weights are under ROOF_MIN_BYTES is
    not held to it: its graph's thread barriers, not its bytes, bound it."""
    w = sum(g.bytes for g in sh.groups)
    if not bandwidth or w < ROOF_MIN_BYTES:
        return None
    rest, roof = sum(t for name, t in parts if name != "attention"), w / bandwidth
    if rest <= ROOF_LIMIT * roof:
        return None
    return (f"its graph and weights take {rest * 1e3:.1f} ms a decoded token, {rest / roof:.0f}x the {roof * 1e3:.1f} ms "
            f"its {w / 1e6:.0f} MB of weights take at the measured read bandwidth ({bandwidth / 1e9:.1f} GB/s; at most "
            f"{ROOF_LIMIT:.0f}x)")


def blamed_terms(parts: list[tuple[str, float]], sh: SpeedShape) -> dict[str, str]:
    """The terms of a decode prediction's largest part but its attention (its parts as (name, seconds per token)):
    the one a prediction far below its roofline (:func:`roofline_miss`) is re-measured, then dropped, for."""
    parts = [p for p in parts if p[0] != "attention"]
    if not parts:
        return {}
    name = max(parts, key=lambda p: p[1])[0]
    if name in ("weights", "output head"):
        return {f"matvec_s_per_byte:{g.key}": "" for g in sh.groups if g.output == (name == "output head")}
    return {NODE_TERM: ""}
