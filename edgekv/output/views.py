"""Terminal views for ``inspect`` and ``predict``: JSON-ready dicts and rich tables.

Measures and computes nothing: ``predict``'s rows, dry runs and notes come from
:mod:`edgekv.prediction.rows`; every figure is labelled with where it comes from (formula, engine).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import msgspec
from msgspec import UNSET
from rich.table import Table

from edgekv.core.llamalog import off_device_text
from edgekv.core.predict import STATUS_OK, STATUS_UNSUPPORTED, ContextParams, KVPrediction, llama_mib
from edgekv.core.shape import MEMORY_DSV4, MEMORY_HYBRID, MEMORY_HYBRID_IDX, MEMORY_HYBRID_ISWA, MEMORY_RECURRENT, ModelShape
from edgekv.core.speed import NODE_PP_TOKENS
from edgekv.core.units import MIB, kv_label
from edgekv.output.benchview import speed_marks_legend
from edgekv.prediction.api import LoadedModel
from edgekv.prediction.budget import BudgetRow
from edgekv.prediction.rows import PredictOutcome
from edgekv.records.schema import Process, Record

MEMORY_DESCRIPTION = {
    "kv": "one KV cache",
    "iswa": "a full-context KV cache plus a sliding-window KV cache",
    "hybrid": "a KV cache for the attention layers plus f32 recurrent state",
    "hybrid_iswa": "full and sliding-window KV caches plus f32 recurrent state",
    "recurrent": "f32 recurrent state only (no KV cache)",
    "none": "no cache (llama.cpp creates none for this architecture)",
    "unsupported": "a cache layout edgekv does not model",
    "dsa": "DSA: an MLA cache plus a one-head indexer key cache",
    "dsa_iswa": "DSA (MLA + indexer key cache) for the full layers plus a sliding-window MLA cache",
    "msa": "MSA: a KV cache plus a one-head indexer K/V cache",
    "hybrid_idx": "a KV cache for the attention layers, f32 recurrent state and a K-only indexer cache",
    "dsv4": "DeepSeek-V4: a sliding-window K cache, CSA/HCA compressed K caches, an indexer K cache and "
            "f32 compressor states",
}


def ranges(ids: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    if not ids:
        return "-"
    out, start, prev = [], ids[0], ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def fmt_mib(n_bytes: int | float | None, digits: int = 2) -> str:
    if n_bytes is None:
        return "-"
    return f"{n_bytes / MIB:,.{digits}f}"


# -- inspect ------------------------------------------------------------------------------------------

def inspect_dict(m: LoadedModel) -> dict[str, Any]:
    h, s = m.header, m.shape
    return {
        "model": m.ref.path,
        "name": s.name or m.ref.name,
        "source": m.ref.source,
        "origin": m.ref.origin or None,
        "complete": m.ref.complete,
        "files": [sh.source for sh in h.shards] or [m.ref.path],
        "gguf": {
            "version": h.version, "n_tensors": len(h.tensors), "n_metadata": len(h.metadata),
            "alignment": h.alignment, "header_bytes": h.header_bytes, "data_offset": h.data_offset,
            "file_size": h.file_size, "file_type": h.metadata.get("general.file_type"),
        },
        "weights_bytes": h.weights_bytes,
        "weights_by_type": h.weights_by_type(),
        "shape": shape_dict(s),
        "layer_roles": {role: s.layers_where(role) for role in sorted({x.role for x in s.layers})},
    }


def shape_dict(s: ModelShape) -> dict[str, Any]:
    """``edgekv info --json``'s shape: every field, each layer with its role and widths, and the trunk's n_layer."""
    d = msgspec.structs.asdict(s)
    d["layers"] = [dict(asdict(lay), role=lay.role, k_width=lay.k_width, v_width=lay.v_width) for lay in s.layers]
    d["n_layer"] = s.n_layer
    d["notes"] = list(s.notes)
    return d


def render_info(con, info: dict[str, Any]) -> None:
    """``edgekv info``: one line per fact, each saying where it comes from."""
    con.print(f"llama-cpp-python {info.get('llama_cpp_python') or '?'}")
    con.print("CPU features (llama.cpp's system info): " + (", ".join(info["cpu_features"]) or "none reported"))
    con.print("Extra buffer types of this build: " + (", ".join(info["extra_buffer_types"]) or "none") +
              " (weights copied for faster kernels; --repack 0 turns them off)")
    b = info.get("runtime_baseline_bytes")
    con.print(f"Runtime baseline: {b / MIB:.1f} MiB ({info.get('runtime_baseline_note')})" if b else
              f"Runtime baseline: not measured ({info.get('runtime_baseline_note')})")
    for label, pf in (("Preflight (llama-cpp-python)", info["preflight"]), ("Preflight (llama-bench)", info.get("llama_bench"))):
        if not pf:
            continue
        verdict = {True: "the extra buffer types run here", False: "their kernels CRASH here",
                   None: "could not tell"}[pf.get("runs")]
        default = "--repack 1 (llama.cpp's default)" if pf.get("repack_default") else "--repack 0"
        con.print(f"{label}: {verdict} ({pf.get('detail')}); bench and quality measure with {default}",
                  highlight=False, markup=False)


def render_inspect(con, m: LoadedModel) -> None:
    h, s = m.header, m.shape
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("Model", f"{m.ref.path}" + (f"  ({s.name})" if s.name else ""))
    if m.ref.origin:
        t.add_row("From", m.ref.origin + ("" if m.ref.complete else "  (header only; weights not downloaded)"))
    if h.shards:
        t.add_row("Split", f"{len(h.shards)} files read as one model")
    t.add_row("Architecture", f"{s.arch}: {MEMORY_DESCRIPTION.get(s.memory, s.memory)}")
    if s.unsupported_reason:
        t.add_row("Not modelled", s.unsupported_reason)
    nextn = f", {s.n_layer_nextn} NextN/MTP" if s.n_layer_nextn else ""
    t.add_row("Layers", f"{s.n_layer_all} ({s.n_layer} trunk{nextn})")
    t.add_row("Embedding", f"{s.n_embd}, vocab {s.n_vocab or '?'}, trained context {s.n_ctx_train}")
    if s.layers:
        heads = sorted({x.n_head for x in s.layers})
        kv_heads = sorted({x.n_head_kv for x in s.layers})
        t.add_row("Heads", f"{_set(heads)} query, {_set(kv_heads)} KV" + _gqa(heads, kv_heads))
        hk = sorted({x.head_k for x in s.layers if x.attn_cache or not s.layers[0].attn_cache})
        hv = sorted({x.head_v for x in s.layers if x.attn_cache or not s.layers[0].attn_cache})
        t.add_row("Head dims", f"K {_set(hk)}, V {_set(hv)}")
    roles = {role: s.layers_where(role) for role in ("full", "swa", "shared", "recurrent", "attn+recurrent", "nextn", "none")}
    for role, label in (("full", "Full attention"), ("swa", "Sliding window"), ("shared", "Shared KV"),
                        ("recurrent", "Recurrent"), ("attn+recurrent", "Attn+recurrent"), ("nextn", "NextN/MTP"),
                        ("none", "No cache")):
        ids = roles[role]
        if not ids:
            continue
        extra = ""
        if role == "swa":
            extra = f"  (window {s.n_swa}, {s.swa_type})"
        elif role == "shared":
            reuse = sorted({x.reuses for x in s.layers if x.reuses is not None})
            extra = f"  (reuse layer {_set(reuse)}; no bytes of their own)"
        elif role in ("recurrent", "attn+recurrent"):
            extra = f"  (f32 state: {s.n_embd_r} + {s.n_embd_s} floats per layer per sequence)"
        t.add_row(label, f"{len(ids)} layers: {ranges(ids)}{extra}")
    idx = [x.index for x in s.layers if x.indexer]
    if idx and s.memory == MEMORY_DSV4:
        for ratio, label in ((4, "CSA (1/4)"), (128, "HCA (1/128)")):
            ids = [x.index for x in s.layers if x.compress_ratio == ratio]
            if ids:
                t.add_row(label, f"{len(ids)} layers: {ranges(ids)}  (compressed K cache, f32 compressor state)")
    if idx:
        t.add_row("Indexer", f"{len(idx)} layers: {ranges(idx)}  (one key head of {s.indexer_head_k})")
    if s.is_mla:
        t.add_row("MLA", f"K only, {s.layers[0].k_width} elements per cell (latent + rope); "
                         f"key_length_mla {s.head_k_mla}, value_length_mla {s.head_v_mla}")
    by_type = ", ".join(f"{k} {fmt_mib(v)} MiB" for k, v in h.weights_by_type().items())
    t.add_row("Weights", f"{fmt_mib(h.weights_bytes)} MiB ({by_type})")
    t.add_row("GGUF", f"v{h.version}, {len(h.tensors)} tensors, {len(h.metadata)} keys, header "
                      f"{fmt_mib(h.header_bytes)} MiB, file {fmt_mib(h.file_size)} MiB")
    for note in s.notes:
        t.add_row("Note", note)
    con.print(t)


def _set(vals: list[int]) -> str:
    return str(vals[0]) if len(vals) == 1 else "/".join(map(str, vals))


def _gqa(heads: list[int], kv: list[int]) -> str:
    if len(heads) == 1 and len(kv) == 1 and kv[0]:
        r = heads[0] // kv[0] if heads[0] % kv[0] == 0 else None
        if kv[0] == heads[0]:
            return " (MHA)"
        if kv[0] == 1:
            return " (MQA)"
        if r:
            return f" (GQA {r}:1)"
    return ""


# -- predict ------------------------------------------------------------------------------------------

def _same_cell(match: bool | None) -> str:
    return "n/a" if match is None else "[green]✓[/]" if match else "[red]✗[/]"


def _has_state(shape: ModelShape) -> bool:
    return shape.memory in (MEMORY_RECURRENT, MEMORY_HYBRID, MEMORY_HYBRID_ISWA, MEMORY_HYBRID_IDX, MEMORY_DSV4)


def _predict_table(con, title: str, has_rec: bool, engine: bool, proc_cols: list[str]):
    """The predict table's columns; returns (table, whether the reserved sum is shown)."""

    t = Table(title=title, title_justify="left")
    # an 80-column terminal gets short headers (issue 19: "(formu…" was cut); the footnotes say what each is
    narrow = con.width < 110
    t.add_column("n_ctx", justify="right")
    t.add_column("K/V", justify="left")
    t.add_column("KV MiB\nformula" if narrow else "KV MiB\n(formula)", justify="right")
    if has_rec:
        t.add_column("state\nMiB" if narrow else "state MiB\n(formula)", justify="right")
    t.add_column("vs\nf16" if narrow else "vs f16", justify="right")
    if engine:
        t.add_column("KV MiB\nllama" if narrow else "KV MiB\n(llama.cpp)", justify="right")
        t.add_column("same", justify="center")
        t.add_column("compute\nMiB" if narrow else "compute MiB\n(llama.cpp)", justify="right")
    # the reserved sum (weights + every buffer llama.cpp reserves) is not what the process uses; when the
    # process peak is shown, a narrow terminal keeps only the peak (--json and wide terminals have both)
    show_reserved = engine and not (narrow and proc_cols)
    if show_reserved:
        t.add_column("reserved\nMiB" if narrow else "reserved MiB\n(weights+all)", justify="right")
    for name in proc_cols:
        # narrow: the legend under the table names the workload and says these are predicted
        t.add_column(("peak RSS\nMiB" if name.startswith("peak RSS") else name.split(" MiB")[0] + "\nMiB") if narrow
                     else name, justify="right")
    return t, show_reserved


def _v(x: Any) -> Any:
    """A field the record does not hold (msgspec's UNSET) as None: shown as a dash, never filled in."""
    return None if x is UNSET else x


def _predict_cells(rec: Record, shape: ModelShape, has_rec: bool, engine: bool,
                   show_reserved: bool) -> tuple[list[str], str, bool]:
    """(cells, note, beyond the trained context) of one predict record, process columns left out."""
    f = rec.prediction.formula
    n = str(f.n_ctx) if f.n_ctx_padded == f.n_ctx else f"{f.n_ctx}→{f.n_ctx_padded}"
    note, beyond = "", False
    if f.status != STATUS_OK:
        note = f"[yellow]{f.status}: {f.reason}[/]"
    elif f.n_ctx_seq > shape.n_ctx_train and shape.n_ctx_train:
        note, beyond = "beyond trained context", True
    cells = [n, kv_label(f.type_k, f.type_v)]
    if f.status == STATUS_OK:
        cells.append(llama_mib(f.kv_bytes))
        if has_rec:
            cells.append(llama_mib(f.recurrent_bytes + (_v(f.state_bytes) or 0)))
        saving = _v(f.saving_vs_f16)
        cells.append(f"{saving:.2f}×" if saving else "-")
    else:
        cells += ["-"] * (3 if has_rec else 2)
    if engine:
        e = rec.prediction.engine
        if e.ok:
            cells += [f"{e.kv_mib:.2f}", _same_cell(e.match), f"{sum(e.compute_mib.values()):.2f}"]
            cells += [fmt_mib(_v(e.total_bytes))] if show_reserved else []
            if e.match is False:
                note = (note + " " if note else "") + "[red]" + "; ".join(e.diffs[:2]) + "[/]"
            off = off_device_text(_v(e.off_device))
            if off:
                # llama.cpp's scheduler (GGML_SCHED_DEBUG=2 in the dry run): an op the device cannot run goes to the CPU
                note = (note + " " if note else "") + f"[yellow]{off}[/]"
        else:
            cells += ["-", _same_cell(e.match), "-"] + (["-"] if show_reserved else [])
            if f.status == STATUS_OK:
                note = f"[red]llama.cpp: {e.error}[/]"
    return cells, note, beyond


def render_predict(con, m: LoadedModel, base: ContextParams, out: PredictOutcome, engine: bool) -> None:
    """The predict table and its footnotes, from the records :func:`edgekv.prediction.rows.run_predict`
    computed."""
    shape, recs = m.shape, out.records
    has_rec = _has_state(shape)
    proc_cols = process_columns(recs)
    t, show_reserved = _predict_table(con, f"{shape.name or m.ref.name} ({shape.arch}): cache memory predicted from "
                                      "the GGUF header", has_rec, engine, proc_cols)
    with_speed = any(_speed_of(r, "tg") is not None or _speed_of(r, "pp") is not None for r in recs)
    if with_speed:
        t.add_column("tg t/s\n(pred.)", justify="right")
        t.add_column("pp t/s\n(pred.)", justify="right")
    warn_ctx = False
    table_rows = []
    for r in recs:
        cells, note, beyond = _predict_cells(r, shape, has_rec, engine, show_reserved)
        proc = _v(r.prediction.process)
        if proc is not None and _v(proc.fits) is False:
            note = (note + " " if note else "") + "[red]does not fit here[/]"
        warn_ctx |= beyond
        speed = [_ts_cell(_speed_of(r, "tg"), r), _ts_cell(_speed_of(r, "pp"), r)] if with_speed else []
        table_rows.append((cells + process_cells(r, proc_cols) + speed, note))
    has_notes = any(note for _, note in table_rows)
    if has_notes:
        t.add_column("note")
    for cells, note in table_rows:
        t.add_row(*cells, *([note] if has_notes else []))
    con.print(t)
    process_legend(con, recs)
    if with_speed:
        speed_legend(con, recs)
    _predict_footnotes(con, m, base, out, engine, warn_ctx)
    if out.layer_prediction is not None and out.layer_params is not None:
        render_layers(con, out.layer_prediction, out.layer_params)


def _predict_footnotes(con, m: LoadedModel, base: ContextParams, out: PredictOutcome, engine: bool,
                       warn_ctx: bool) -> None:
    formulas, shape = [r.prediction.formula for r in out.records], m.shape
    fa_note = {"auto": "-fa auto", "on": "-fa on", "off": "-fa off"}[base.flash_attn]
    con.print(f"Settings: {fa_note}, --swa-full {'on' if base.swa_full else 'off'}, -np {base.n_seq_max}"
              f"{', --kv-unified' if base.kv_unified else ''}, -ub {base.n_ubatch}, -b {base.n_batch} "
              f"(llama.cpp's command-line defaults unless given).")
    con.print(f"Weights: {fmt_mib(m.weights_bytes)} MiB from the tensor table. MiB figures are printed the way "
              "llama.cpp prints its `llama_kv_cache: size` line.")
    if engine:
        con.print("llama.cpp columns come from its own dry run (no weights read, nothing allocated); "
                  "✓ means every figure in its cache lines equals the formula's.")
        if any(f.status == STATUS_UNSUPPORTED for f in formulas):
            con.print("n/a: edgekv does not model this cache; the KV and total columns are llama.cpp's own figures.")
        if any(len(f.caches) > 1 for f in formulas):
            con.print("This model has several cache objects: llama.cpp prints one size line per cache, each rounded "
                      "to 0.01 MiB, so its column (their sum) can differ by 0.01 from the formula's exact total.")
    if out.defaults_cost:
        n_ctx, cli_bytes, py_bytes = out.defaults_cost
        con.print(f"Note: llama-cpp-python's Llama() defaults (flash_attn=False, swa_full=True) would allocate "
                  f"{llama_mib(py_bytes)} MiB instead of {llama_mib(cli_bytes)} MiB at n_ctx {n_ctx} with f16.")
    if warn_ctx:
        con.print(f"Note: the model was trained for {shape.n_ctx_train} tokens; llama.cpp allocates larger "
                  "contexts anyway and warns.")
    for note in sorted({n for f in formulas for n in (_v(f.notes) or [])}):
        con.print(f"Note: {note}")


def _process(rec: Record) -> Process | None:
    """The record's whole-process prediction; None where it was not asked (--kv-only) or not predicted."""
    return _v(rec.prediction.process)


def process_columns(recs: list[Record]) -> list[str]:
    """Column titles for the whole-process prediction (peak RSS, and memory per device when offloaded)."""
    if all(r.prediction.process is UNSET for r in recs):       # --kv-only: not asked
        return []
    procs = [p for p in map(_process, recs) if p is not None]
    wl = _v(procs[0].workload) or "generate" if procs else "generate"
    cols = [f"peak RSS MiB\n(predicted,\n{wl})"]
    devs = sorted({d for p in procs for d in (_v(p.device_bytes) or {})})
    cols += [f"{d} MiB\n(predicted)" for d in devs]
    return cols


def process_cells(rec: Record, cols: list[str]) -> list[str]:
    if not cols:
        return []
    p = _process(rec)
    if p is None:
        return ["-"] * len(cols)
    out = [fmt_mib(p.peak_rss_bytes) if p.peak_rss_bytes is not None else "no baseline"]
    devices = _v(p.device_bytes) or {}
    for c in cols[1:]:
        b = devices.get(c.split(" MiB")[0])
        out.append(fmt_mib(b) if b is not None else "-")
    return out


def _speed_of(rec: Record, test: str) -> Any:
    sp = _v(rec.prediction.speed)
    return _v(getattr(sp, test)) if sp is not None else None


def _ts_cell(t: Any, rec: Record | None = None) -> str:
    """A predicted tokens/s; "~" before it when its calibration was taken under load, "withheld" where edgekv
    withheld it (edgekv.output.benchview.speed_marks_legend)."""
    sp = _v(rec.prediction.speed) if rec is not None else None
    if t is None:
        err = _v(sp.error) if sp is not None else None
        return "withheld" if isinstance(err, str) and err.startswith("withheld") else "-"
    v = t.tokens_per_s
    mark = "~" if sp is not None and _v(sp.calibration_busy) else ""
    return mark + (f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def speed_legend(con, recs: list[Record]) -> None:
    """What the predicted t/s columns are: the tests, the depth, the calibration; and what dominates decode."""
    rows = [(r, _speed_of(r, "tg"), _speed_of(r, "pp")) for r in recs]
    rows = [x for x in rows if x[1] is not None or x[2] is not None]
    if not rows:
        return
    r0, tg0, pp0 = rows[0]
    sp = _v(r0.prediction.speed)
    tests = " and ".join(x for x in ((f"tg{tg0.n_tokens}" if tg0 else ""), (f"pp{pp0.n_tokens}" if pp0 else "")) if x)
    depths = sorted({(t or p).depth for _r, t, p in rows})
    dtxt = f"depth {depths[0]}" if len(depths) == 1 else "depth = the context minus the prompt (-d sets it)"
    con.print(f"t/s (predicted): llama-bench's {tests} at {dtxt}, on this machine (speed model, calibration "
              f"{sp.calibration_id}{', taken while other work used the CPUs' if _v(sp.calibration_busy) else ''}; "
              "edgekv calibrate); not measured: 'edgekv bench' measures them.", highlight=False)
    last = max(rows, key=lambda x: x[0].prediction.formula.n_ctx)
    for line in speed_marks_legend(recs):
        con.print(line, highlight=False)
    if last[1] is not None and _v(sp.explain):
        f = last[0].prediction.formula
        con.print(f"Decode at {f.n_ctx}/{f.type_k}: {_v(_v(last[0].prediction.speed).explain)}.", highlight=False)


def process_legend(con, recs: list[Record]) -> None:
    procs = [p for p in map(_process, recs) if p is not None]
    if not procs:
        return
    p = max(procs, key=lambda q: q.peak_rss_bytes or 0)
    parts = ", ".join(f"{q.name} {fmt_mib(q.bytes)}" + ("" if q.where == "host" else f" on {q.where}")
                      for q in (_v(p.parts) or []))
    con.print(f"Peak RSS (predicted) = the whole process at its peak for the '{p.workload}' workload: {parts} "
              "(largest row; `--json` lists every part with its source).")


def render_layers(con, p: KVPrediction, params: ContextParams) -> None:
    t = Table(title=f"Per layer at n_ctx {params.n_ctx}, {params.type_k}/{params.type_v}", title_justify="left")
    other = any(lp.other for lp in p.layers)
    cols = ["layer", "role", "cache", "cells", "K width", "V width", "K bytes", "V bytes", "R+S bytes"]
    for col in cols + (["other caches (bytes)"] if other else []):
        t.add_column(col, justify="right" if col not in ("role", "cache", "other caches (bytes)") else "left")
    for lp in p.layers:
        row = [str(lp.index), lp.role, lp.cache or "-", str(lp.cells or "-"), str(lp.k_width), str(lp.v_width),
               f"{lp.k_bytes:,}", f"{lp.v_bytes:,}", f"{lp.r_bytes + lp.s_bytes:,}"]
        if other:
            row.append(", ".join(f"{k} {v:,}" for k, v in lp.other.items()) or "-")
        t.add_row(*row)
    con.print(t)


def render_budget(con, m: LoadedModel, budget_bytes: int, rows: list[BudgetRow]) -> None:
    wl = rows[0].workload if rows else "generate"
    speed = any(_v(r.predicted_tg_tokens_per_s) is not None for r in rows)
    t = Table(title=f"Largest context whose predicted peak RSS fits {fmt_mib(budget_bytes)} MiB "
                    f"(workload: {wl}){' and decodes fast enough (--min-tg)' if speed else ''}", title_justify="left")
    for col in ("K/V", "max n_ctx", "KV MiB", "weights MiB", "compute MiB", "peak RSS MiB") + (
            ("tg t/s (pred.)",) if speed else ()) + ("note",):
        t.add_column(col, justify="left" if col in ("K/V", "note") else "right")
    for r in rows:
        kv = kv_label(r.type_k, r.type_v)
        if r.max_n_ctx:
            peak, low = _v(r.peak_rss_bytes), _v(r.lower_bound_bytes)
            peak_cell = fmt_mib(peak) if peak is not None else f"≥ {fmt_mib(low)}" if low is not None else "-"
            compute = _v(r.compute_bytes)
            ts = _v(r.predicted_tg_tokens_per_s)
            t.add_row(kv, str(r.max_n_ctx), fmt_mib(_v(r.cache_bytes)), fmt_mib(_v(r.weights_bytes)),
                      "-" if compute is None else fmt_mib(compute), peak_cell,
                      *([f"{ts:.1f}" if ts is not None else "-"] if speed else []), r.note)
        else:
            t.add_row(kv, "does not fit" if r.max_n_ctx == 0 else "no answer", "-", "-", "-", "-",
                      *(["-"] if speed else []), r.note)
    con.print(t)
    if rows:
        con.print(f"Workload '{wl}': {rows[0].workload_means}. Peak RSS = runtime baseline + llama.cpp's "
                  "host structures + weights + caches + the workload's compute buffer + work and output buffers.")


def render_calibration(con, sc) -> None:
    """``edgekv calibrate``: the coefficients the speed model will use, in units a reader can check."""

    cal = sc.cal
    con.print(f"Speed calibration {cal.id} (-t {cal.n_threads}, through {cal.runtime}): {sc.note or 'cached'}",
              highlight=False)
    short = (f"{cal.node_pp_short_s * 1e6:.2f} us at {NODE_PP_TOKENS[0]} tokens, " if cal.node_pp_short_s else "")
    con.print(f"Graph node: {cal.node_tg_s * 1e6:.2f} us per node of a one-token graph, {short}"
              f"{cal.node_pp_s * 1e6:.2f} us per node of a {NODE_PP_TOKENS[1]}-token prompt ubatch; outside the nodes "
              f"{cal.token_tg_s * 1e6:.0f} us per token, {cal.ubatch_pp_s * 1e6:.0f} us per ubatch.", highlight=False)
    if cal.device:
        con.print(f"On {cal.machine or cal.device}: {cal.vocab_tg_s * 1e9:.2f} ns per logit returned to the host; graph "
                  "nodes at a model's own widths: " + (", ".join(f"{b} {cal.node_tg_body_s[b] * 1e6:.2f} / "
                                                                 f"{cal.node_pp_body_s.get(b, 0) * 1e6:.2f} us"
                                                                 for b in sorted(cal.node_tg_body_s)) or "none yet")
                  + " (decode / prompt).", highlight=False)
    if cal.bandwidth_bytes_s:
        con.print(f"Read bandwidth: {cal.bandwidth_bytes_s / 1e9:.1f} GB/s ({cal.n_threads} threads, measured).",
                  highlight=False)
    t = Table(title=f"Weights (on {cal.device})" if cal.device else "Weights (as the CPU backend holds them)",
              title_justify="left")
    for col in ("type", "decode GB/s", "ns per row", "from memory GB/s", "from memory ns per row", "4 columns ×",
                "prompt GFLOP/s",
                "prompt ns per dot", "prompt ms per GB streamed"):
        t.add_column(col, justify="left" if col == "type" else "right")
    for k in sorted(cal.matvec_s_per_byte):
        mv = cal.matvec_s_per_byte[k]
        fl = cal.matmul_s_per_flop.get(k)
        sb = cal.matmul_s_per_byte.get(k)
        c4 = cal.matcols_s_per_byte.get(k, {}).get("4")     # a 4-column step (-npl 4) against one mat-vec
        row = cal.matvec_s_per_row.get(k)       # the CPU mat-vec's cost per row beyond its bytes (none on a GPU)
        st = cal.matvec_stream_s_per_byte.get(k)    # 384 MB models of the type: as fast as it streams from memory
        st_row = cal.matvec_stream_s_per_row.get(k)
        t.add_row(k, f"{1e-9 / mv:.1f}", f"{row * 1e9:.1f}" if row is not None else "-",
                  f"{1e-9 / st:.1f}" if st else "-", f"{st_row * 1e9:.1f}" if st_row is not None else "-",
                  f"{c4 / mv:.2f}" if c4 else "-", f"{1e-9 / fl:.1f}" if fl else "-",
                  f"{cal.matmul_s_per_dot[k] * 1e9:.2f}" if k in cal.matmul_s_per_dot else "-",
                  f"{sb * 1e12:.3g}" if sb is not None else "-")
    con.print(t)
    a = Table(title="Attention per head x (head_k + head_v) x cell", title_justify="left")
    # decode (tg) and prompt (pp) in llama-bench's words, so that the table fits 80 columns; the fourth column: a
    # prompt ubatch under 64 tokens over an F16/F32 cache (llama.cpp's per-row loop, not its tiled kernel); the fifth:
    # that tiled kernel's cost per cell deep in the cache (TILED_DEEP_DEPTHS); "-" where every prompt runs the
    # per-row loop (a quantized cache) or on a GPU; the last: the tiled kernel's share of cost per query tile,
    # whatever rows it holds (its pp columns are then per row of full tiles)
    for col in ("K/V, flash attention", "tg ps", "pp ps", "pp <64 ps", "pp deep ps", "tile"):
        a.add_column(col, justify="left" if col.startswith("K/V") else "right")
    for k in sorted(cal.attn_tg_s):      # picoseconds: a GPU's cell costs are a thousandth of a CPU's
        rows, deep, tile = cal.attn_pp_rows_s.get(k), cal.attn_pp_deep_s.get(k), cal.attn_pp_tile_share.get(k)
        a.add_row(k, f"{cal.attn_tg_s[k] * 1e12:.3g}", f"{cal.attn_pp_s.get(k, 0) * 1e12:.3g}",
                  f"{rows * 1e12:.3g}" if rows is not None else "-", f"{deep * 1e12:.3g}" if deep is not None else "-",
                  f"{100 * tile:.0f}%" if tile is not None else "-")
    con.print(a)
    for n in cal.notes:
        con.print(f"[yellow]Note: {n}[/]")
