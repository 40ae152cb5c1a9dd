"""The speed model: llama.cpp's prefill and decode tokens/s predicted from the model's header, its settings and a
calibration of this machine (:mod:`edgekv.calibration.speedcal`).  Pure: no I/O, no llama.cpp.

One token of decode (a one-token graph) costs

    t_tg(d) = nodes_tg * c_node                               fixed: llama.cpp's graph, one node after another
                                                              (the nodes a backend runs: views cost nothing)
            + sum over weight groups  bytes_g * c_matvec[g]  weights: each matrix read once (MoE: the active experts)
                                 + rows_g * c_row[g]         and one dot product per row of it (CPU), or at
                                                              least bytes_g * c_stream[g] + rows_g * c_srow[g]:
                                                              as fast as llama.cpp streams that type from memory
                                                              (the output head: its bytes alone)
            + output matrix bytes * c_matvec[output]          output head (and its rows: one per vocabulary entry)
                                 + n_vocab * c_row[output]
            + sum over attention layers  n_head * (head_k + head_v) * depth_eff * c_attn_tg[K/V, fa]

and one ubatch of ``n`` prompt tokens at depth ``d``

    t_ub(n, d) = nodes_pp * c_node_pp
               + sum over weight groups  bytes_g * a_matmul[g] + 2 * params_g * n * b_matmul[g]
                                         + rows_g * n * c_dot[g]  (CPU: one dot product per row and column)
               + sum over attention layers  n_head * (head_k + head_v) * n * (d + n / 2)_eff * c_attn_pp[K/V, fa]
                                         (CPU, F16/F32 K == V: c_attn_pp_rows[K/V, fa] when n < 64, the
                                          per-query-row loop rather than the tiled kernel)

with the output head computed once per prompt (llama.cpp computes logits for the last token only).  ``depth_eff``
is the depth a layer attends over: the whole cache for a full-attention layer, at most the window for a sliding
window layer (the CPU kernel skips masked cells).  Every coefficient is measured by the calibration on this
machine, at this thread count, through the llama.cpp edgekv drives; nothing is typed in from a spec sheet.

The roofline beside it: decode cannot be faster than ``bandwidth / bytes read per token`` (the weights a token
reads plus the K/V each attention layer reads at that depth: a sliding-window layer at most its window, a layer
that reads another's cache those cells again), with the bandwidth measured, not looked up.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

from edgekv.core.shape import SWA_STANDARD
from edgekv.core.speedbounds import dropped_reason, needed_terms
from edgekv.core.speedcost import (  # noqa: F401  (the speed model's names, in one place)
    FA_TILE_Q,
    MATMUL_LINEAR_FROM,
    TILED_DEEP_DEPTHS,
    TILED_SHALLOW_END,
    SwaRing,
    attn_units_at,
    attn_units_tg,
    decode_cells,
    dense_view,
    depth_eff,
    fa_tiles,
    kv_read_bytes,
    matvec_compute_s,
    matvec_s,
    prompt_attn_coef,
    prompt_weights_s,
    row_loop_path,
    split_kv_path,
    stream_s,
    tile_factor,
    tile_ratio,
    tiled_attn_s,
    tiled_cells_cost,
    tiled_prompt_path,
    ubatches,
    weights_s,
)
from edgekv.core.speedshape import (  # noqa: F401
    BODY_PROBE_BYTES,
    GEOMETRY_MAX_EMBD,
    NODE_PP_TOKENS,
    SPEED_MODEL_VERSION,
    AttnLayer,
    Calibration,
    SpeedShape,
    WeightGroup,
    body_geometry,
    kv_key,
    run_nodes,
    speed_shape,
    weight_key,
)
from edgekv.core.wire import desc


class MissingCalibration(ValueError):
    """A weight type or K/V pair the calibration has not measured: no guess is made."""

    def __init__(self, what: str, keys: list[str]):
        self.what, self.keys = what, keys
        super().__init__(f"no speed prediction for {what} {', '.join(keys)}: the calibration has not measured it")


class DroppedTerm(MissingCalibration):
    """A term the prediction needs was dropped as outside its physical bounds (edgekv.core.speedbounds)."""

    def __init__(self, why: str):
        ValueError.__init__(self, why)
        self.what, self.keys = "a dropped term", []


def missing(cal: Calibration, sh: SpeedShape, type_k: str, type_v: str, flash_attn: str) -> tuple[list[str], list[str]]:
    """(weight keys, K/V keys) the prediction needs and the calibration lacks."""
    w = sorted({g.key for g in sh.groups if g.key not in cal.matvec_s_per_byte or g.key not in cal.matmul_s_per_flop
                or g.key not in cal.matcols_s_per_byte
                or (not cal.device and (g.key not in cal.matvec_s_per_row or g.key not in cal.matvec_stream_s_per_byte
                                        or g.key not in cal.matvec_stream_s_per_row or g.key not in cal.matmul_s_per_dot
                                        or g.key not in cal.matcols_s_per_row))})
    rows = tiled_prompt_path(type_k, type_v, flash_attn, cal.device)
    a = sorted({k for k in attn_keys(sh, type_k, type_v, flash_attn) if k not in cal.attn_tg_s or k not in cal.attn_pp_s
                or (rows and (k not in cal.attn_pp_rows_s or k not in cal.attn_pp_deep_s))})
    return w, a


def attn_keys(sh: SpeedShape, type_k: str, type_v: str, flash_attn: str) -> list[str]:
    """The calibration keys of the model's attention: one per K/V pair and layer geometry."""
    return list(dict.fromkeys(kv_key(type_k, type_v, flash_attn, lay.geometry) for lay in sh.attn))


class SpeedPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One part of a predicted token's time (edgekv.core.speed)."""

    name: Annotated[str, desc("fixed | weights | output head | attention")]
    s_per_token: Annotated[float, desc("seconds per token")]
    source: Annotated[str, desc("how it was obtained (the calibrated coefficient and the model's figure)")]


class SpeedTestPrediction(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Predicted speed of one test (pp or tg) at a depth."""

    test: Annotated[str, desc("pp | tg")]
    tokens_per_s: Annotated[float, desc("predicted tokens/s")]
    depth: Annotated[int, desc("cells in the cache when the test starts")]
    n_tokens: Annotated[int, desc("prompt or generated tokens")]
    s_per_token: Annotated[float, desc("sum of the parts")]
    parts: Annotated[list[SpeedPart], desc("the parts, seconds per token")]
    roofline_tokens_per_s: Annotated[Union[float, None], desc("decode bound: measured read bandwidth / bytes read per token")]
    bytes_per_token: Annotated[Union[float, None], desc("bytes a decoded token reads (weights + KV at the mean depth)")]
    calibration_id: Annotated[str, desc("the calibration the coefficients come from")]


def _require(sh: SpeedShape, cal: Calibration, type_k: str, type_v: str, flash_attn: str, nodes: int | None,
             test: str = "tg") -> None:
    """MissingCalibration naming what a prediction needs and does not have (a term dropped as outside its physical
    bounds, edgekv.core.speedbounds; a type, a K/V pair, the graph size)."""
    if cal.dropped:
        why = dropped_reason(cal, needed_terms(sh, type_k, type_v, flash_attn, test))
        if why:
            raise DroppedTerm(why)
    wk, ak = missing(cal, sh, type_k, type_v, flash_attn)
    if wk:
        raise MissingCalibration("weight type", wk)
    if ak:
        raise MissingCalibration("K/V cache", ak)
    if nodes is None:
        raise MissingCalibration("graph size of", ["this model (llama.cpp's dry run did not list its graph's nodes)"])
    if cal.device and not sh.body:
        raise MissingCalibration("model widths", ["of this architecture on a GPU (its layers are not one llama-shaped "
                                                  "geometry the body probe reproduces)"])
    if cal.device and (sh.body not in cal.node_tg_body_s or sh.body not in cal.node_pp_body_s):
        raise MissingCalibration("model widths", [sh.body])


def node_cost(sh: SpeedShape, cal: Calibration, test: str) -> tuple[float, str]:
    """(seconds per graph node, where it comes from): on a GPU measured at this model's widths, on the CPU the
    narrow models' cost (a CPU's per-node work is thread synchronisation, its width-bound work the weights')."""
    if cal.device:
        c = (cal.node_tg_body_s if test == "tg" else cal.node_pp_body_s)[sh.body]
        return c, f"{c * 1e6:.2f} us at this model's widths"
    c = cal.node_tg_s if test == "tg" else cal.node_pp_s
    return c, f"{c * 1e6:.2f} us"




def prompt_node_s(cal: Calibration, n: int) -> float:
    """Seconds per graph node of an ``n``-token prompt ubatch on the CPU: linear in the tokens through the two
    measured sizes (NODE_PP_TOKENS; below the first, toward a one-token graph's node cost, never under it), as a
    node's element-wise work is; a calibration without the short size (a GPU's) prices every ubatch's nodes alike."""
    if not cal.node_pp_short_s:
        return cal.node_pp_s
    (n0, c0), (n1, c1) = (NODE_PP_TOKENS[0], cal.node_pp_short_s), (NODE_PP_TOKENS[1], cal.node_pp_s)
    if n < n0:
        return cal.node_tg_s + (c0 - cal.node_tg_s) * max(0, n - 1) / (n0 - 1)
    return max(cal.node_tg_s, c0 + (c1 - c0) * (n - n0) / (n1 - n0))


def predict_tg(sh: SpeedShape, cal: Calibration, depth: int, n_gen: int, type_k: str, type_v: str,
               flash_attn: str, n_seq: int = 1, swa_cells: int = 0, n_batch: int = 2048,
               n_ubatch: int = 512) -> SpeedTestPrediction:
    """Decode tokens/s of ``n_gen`` tokens generated from ``depth`` cells (llama-bench's tg at depth); with
    ``n_seq`` sequences decoding together (-npl, each its own KV stream), each step one ubatch of a token per
    sequence, and the rate is all sequences' tokens (llama-batched-bench's S_TG).  ``swa_cells``: the cells of
    a sliding-window cache (0: none, or not known), filled by a prompt of ``depth`` tokens in ``n_batch`` /
    ``n_ubatch`` pieces, whose ring decides what each thread reads (one sequence)."""
    _require(sh, cal, type_k, type_v, flash_attn, sh.nodes_tg, "tg")
    n = max(1, n_seq)
    mean_depth = depth + max(1, n_gen) / 2
    c_node, c_src = node_cost(sh, cal, "tg")
    t_vocab = n * sh.n_vocab * cal.vocab_tg_s          # each sequence's logits back to the host
    parts = [SpeedPart("fixed", (sh.nodes_tg * c_node + cal.token_tg_s + t_vocab) / n,
                       f"{sh.nodes_tg} graph nodes that run x {c_src} + {cal.token_tg_s * 1e6:.0f} us"
                       + (f" + {sh.n_vocab} logits to the host {t_vocab * 1e6 / n:.0f} us" if t_vocab else "")
                       + (f" per step of {n} tokens" if n > 1 else " per token"))]
    w = sum(weights_s(g, cal, n) for g in sh.groups if not g.output) / n
    parts.append(SpeedPart("weights", w, ", ".join(_matvec_source(g, cal) for g in sh.groups if not g.output)
                           + (f"; {n} columns per step" if n > 1 else "")))
    o = sum(weights_s(g, cal, n) for g in sh.groups if g.output) / n
    if o:
        parts.append(SpeedPart("output head", o, ", ".join(_matvec_source(g, cal) for g in sh.groups if g.output)))
    kv = kv_key(type_k, type_v, flash_attn)
    if sh.attn:
        split = split_kv_path(type_k, type_v, flash_attn, cal.device)
        ring = (SwaRing(swa_cells, tuple(ubatches(depth, n_batch, n_ubatch)), max(1, n_gen))
                if swa_cells and n == 1 and sh.swa_type == SWA_STANDARD else None)
        dense = dense_view(flash_attn)
        t_att = attn_units_tg(sh, mean_depth, cal.n_threads, split, cal.attn_tg_s, kv, ring, dense)
        parts.append(SpeedPart("attention", t_att,
                               f"{type_k}/{type_v} at mean depth {mean_depth:.0f}" + (" in each sequence" if n > 1 else "")
                               + ("; no flash attention: over the whole padded view" if dense else "")
                               + (f"; sliding-window layers over a ring of {swa_cells} cells" if ring else "")))
    t = sum(p.s_per_token for p in parts)
    read = sum(g.bytes for g in sh.groups) / n + kv_read_bytes(sh, type_k, type_v, mean_depth)
    roof = cal.bandwidth_bytes_s / read if cal.bandwidth_bytes_s and read else None
    return SpeedTestPrediction(test="tg", tokens_per_s=1.0 / t, depth=depth, n_tokens=n_gen, s_per_token=t, parts=parts,
                               roofline_tokens_per_s=roof, bytes_per_token=read, calibration_id=cal.id)


def _matvec_source(g: WeightGroup, cal: Calibration) -> str:
    """Where a group's decode time comes from: "q4_1 66.3 MB at 27.1 GB/s + 155520 rows x 15.2 ns"."""
    row = cal.matvec_s_per_row.get(g.key, 0.0)
    if stream_s(g, cal) > matvec_compute_s(g, cal):
        s_row = cal.matvec_stream_s_per_row.get(g.key, 0.0)
        return (f"{g.key} {g.bytes / 1e6:.1f} MB streamed from memory at {1e-9 / cal.matvec_stream_s_per_byte[g.key]:.1f} GB/s"
                + (f" + {g.rows} rows x {s_row * 1e9:.1f} ns" if s_row and g.rows else ""))
    return (f"{g.key} {g.bytes / 1e6:.1f} MB at {1e-9 / cal.matvec_s_per_byte[g.key]:.1f} GB/s"
            + (f" + {g.rows} rows x {row * 1e9:.1f} ns" if row and g.rows else ""))




def predict_pp(sh: SpeedShape, cal: Calibration, depth: int, n_prompt: int, n_batch: int, n_ubatch: int,
               type_k: str, type_v: str, flash_attn: str, n_seq: int = 1) -> SpeedTestPrediction:
    """Prefill tokens/s of a prompt of ``n_prompt`` tokens processed at ``depth`` (llama-bench's pp at depth); with
    ``n_seq`` sequences (-npl) their prompts go in one batch (llama-batched-bench's S_PP over all of them), each
    token attending to its own sequence's cells, the last token of each sequence computing logits."""
    _require(sh, cal, type_k, type_v, flash_attn, sh.nodes_pp, "pp")
    kv = kv_key(type_k, type_v, flash_attn)
    n_seq = max(1, n_seq)
    fixed = weights = attn = 0.0
    c_node, c_src = node_cost(sh, cal, "pp")
    ubs = ubatches(n_seq * n_prompt, n_batch, n_ubatch)
    for i, n in enumerate(ubs):
        fixed += sh.nodes_pp * (c_node if cal.device else prompt_node_s(cal, n)) + cal.ubatch_pp_s
        weights += sum(prompt_weights_s(g, cal, n, n_seq if i == len(ubs) - 1 else 0) for g in sh.groups if not g.output)
    if not cal.device and cal.node_pp_short_s and ubs:
        c_src = f"{prompt_node_s(cal, ubs[0]) * 1e6:.2f} us at {ubs[0]} tokens"
    d = float(depth)
    tiled, short, deep, short_tiles = tiled_prompt_path(type_k, type_v, flash_attn, cal.device), 0, False, False
    for n in ubatches(n_prompt, n_batch, n_ubatch):      # each sequence's tokens over its own cells
        if sh.attn and tiled and n >= FA_TILE_Q:
            attn += n_seq * n * tiled_attn_s(sh, d + n / 2, cal, kv, n)
            short_tiles |= any(tile_factor(cal.attn_pp_tile_share.get(f"{kv}@{lay.geometry}", 0.0), n, lay.n_head,
                                           cal.n_threads) > 1.0 for lay in sh.attn)
            deep |= d + n > TILED_SHALLOW_END
        elif sh.attn:
            attn += n_seq * n * attn_units_at(sh, d + n / 2, prompt_attn_coef(cal, n, tiled), kv,
                                            (d + n, n) if dense_view(flash_attn) else None)
            short += tiled and n < FA_TILE_Q
        d += n
    out = sum(weights_s(g, cal, n_seq) for g in sh.groups if g.output)
    p = float(max(1, n_prompt * n_seq))
    parts = [SpeedPart("fixed", fixed / p, f"{sh.nodes_pp} graph nodes that run per ubatch x {c_src} "
                                           f"+ {cal.ubatch_pp_s * 1e6:.0f} us"),
             SpeedPart("weights", weights / p,
                       ", ".join(f"{g.key} {2 * g.params / 1e9:.2f} GFLOP/token at "
                                 f"{1e-9 / cal.matmul_s_per_flop[g.key]:.1f} GFLOP/s"
                                 + (f" + {g.rows} dot products x {cal.matmul_s_per_dot[g.key] * 1e9:.1f} ns"
                                    if cal.matmul_s_per_dot.get(g.key) and g.rows else "")
                                 for g in sh.groups if not g.output))]
    if out:
        parts.append(SpeedPart("output head", out / p, "the last token's logits only"
                               + (f" (of each of {n_seq} sequences)" if n_seq > 1 else "")))
    if sh.attn:
        parts.append(SpeedPart("attention", attn / p, f"{type_k}/{type_v} from depth {depth}"
                               + ("; no flash attention: every row over the whole padded view"
                                  if dense_view(flash_attn) else "")
                               + (f"; {short} ubatch(es) under {FA_TILE_Q} tokens run llama.cpp's per-row loop, "
                                  "not its tiled kernel" if short else "")
                               + (f"; the tiled kernel's scans past {TILED_SHALLOW_END} cells priced, every cell, "
                                  f"toward its cost {TILED_DEEP_DEPTHS[0]}-{TILED_DEEP_DEPTHS[1]} deep" if deep else "")
                               + ("; query tiles cut short at llama.cpp's chunk and head ends priced as full ones "
                                  "(their per-tile share)" if short_tiles else "")))
    t = sum(x.s_per_token for x in parts)
    return SpeedTestPrediction(test="pp", tokens_per_s=1.0 / t, depth=depth, n_tokens=n_prompt * n_seq, s_per_token=t,
                               parts=parts, roofline_tokens_per_s=None, bytes_per_token=None, calibration_id=cal.id)


def explain(pred: SpeedTestPrediction, measured_ts: float | None = None) -> str:
    """One line naming the part that dominates a token's time (and how far a measured decode is from the
    roofline)."""
    if not pred.parts:
        return ""
    top = max(pred.parts, key=lambda p: p.s_per_token)
    share = top.s_per_token / pred.s_per_token
    line = f"{top.name}: {100 * share:.0f} % of a token's predicted time ({top.source})"
    if pred.test == "tg" and pred.roofline_tokens_per_s:
        got = measured_ts or pred.tokens_per_s
        line += f"; {100 * got / pred.roofline_tokens_per_s:.0f} % of the bandwidth bound " \
                f"({pred.roofline_tokens_per_s:.0f} t/s)"
    return line
