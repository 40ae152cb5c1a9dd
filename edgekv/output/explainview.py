"""``edgekv explain``'s tables: the configuration, the buffers per device, the KV lines checked, the answer."""

from __future__ import annotations

from typing import Any

import msgspec
from rich.table import Table

from edgekv.core.explainschema import ExplainReport, report
from edgekv.output.breakdownview import render_breakdown

CONFIG_LABELS = (("arch", "architecture"), ("name", "model"), ("layers", "layers"), ("heads", "heads"),
                 ("kv_heads", "KV heads"), ("head_dim_k", "head dim K"), ("head_dim_v", "head dim V"),
                 ("sliding_window", "sliding window"), ("file_type", "file type"), ("file_size", "file size"),
                 ("n_ctx", "n_ctx"), ("n_batch", "n_batch"), ("n_ubatch", "n_ubatch"), ("n_seq_max", "sequences"),
                 ("type_k", "cache K"), ("type_v", "cache V"), ("flash_attn", "flash attention"),
                 ("flash_attn_resolved", "flash attention (resolved)"), ("offloaded", "layers offloaded"),
                 ("backends", "backends"), ("mmap", "mmap"))


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    """The result as ``explain --json`` prints it: the typed, versioned report (edgekv.core.explainschema), so every
    field has the type docs/explain.md states."""
    return msgspec.to_builtins(report(result))


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items())
    return str(v)


def _config_table(r: ExplainReport) -> Table:
    cfg = r.config
    t = Table(title="Configuration recovered from the log", show_header=False)
    t.add_column("what")
    t.add_column("value")
    build = r.build or (f"llama-cpp-python {r.llama_cpp_python}" if r.llama_cpp_python
                        else "not in the log (llama-cpp-python, ollama and LM Studio print none)")
    t.add_row("llama.cpp build", build)
    for key, label in CONFIG_LABELS:
        if key in cfg:
            t.add_row(label, _fmt(cfg[key]))
    if "weight_types" in cfg:
        t.add_row("tensor types", _fmt(cfg["weight_types"]))
    for d in cfg.get("devices", []):
        free = f", {d['free_mib']} MiB free" if d["free_mib"] is not None else ""
        t.add_row("device", f"{d['name']} ({d['description']}{free})")
    return t


def _buffer_table(r: ExplainReport) -> Table:
    t = Table(title="Buffers llama.cpp allocated, by device (MiB, as printed)")
    for c in ("device", "buffer", "kind", "MiB"):
        t.add_column(c, justify="right" if c == "MiB" else "left")
    for g in r.buffers:
        for row in g.buffers:
            kind = row.kind + (f" (the pages of {row.same_pages_as}: counted once)" if row.same_pages_as else "")
            t.add_row(g.device, row.buffer, kind, f"{row.mib:.2f}")
        split = (f"{g.file_backed_mib:.2f} file-backed (the mapped model file), {g.anonymous_mib:.2f} anonymous"
                 if g.file_backed_mib else "")
        t.add_row(g.device, "[b]total[/b]", split, f"[b]{g.total_mib:.2f}[/b]")
    return t


def _kv_table(r: ExplainReport) -> Table:
    t = Table(title=f"KV cache lines: llama.cpp vs edgekv ({r.kv.status})")
    for c in ("cache", "cells", "layers", "K/V", "llama.cpp MiB", "edgekv MiB", ""):
        t.add_column(c)
    for x in r.kv.lines:
        mark = "[green]=[/green]" if x.match else f"[red]≠[/red] {x.why or ''}"
        t.add_row(x.role, str(x.cells or ""), str(x.layers or ""), f"{x.type_k}/{x.type_v}", x.printed_mib,
                  x.predicted_mib or "-", mark)
    return t


def _model_and_compute(con: Any, r: ExplainReport) -> None:
    m = r.model
    if m.predicted_mib is not None and m.residual_pct is not None:
        con.print(f"Model buffers: {m.compared} {m.compared_mib:.2f} MiB (llama.cpp), {m.predicted_mib:.2f} MiB "
                  f"of tensors ({m.source}): residual {m.residual_pct:+.3f} %")
    else:
        con.print(f"Model buffers: {m.status}")
    for c in r.compute:
        if c.predicted_mib is not None:
            con.print(f"Compute buffer {c.buffer}: {c.printed_mib:.2f} MiB (llama.cpp), {c.predicted_mib:.2f} "
                      f"MiB ({c.source}): residual {c.residual_pct:+.3f} %")
        else:
            con.print(f"Compute buffer {c.buffer}: {c.printed_mib:.2f} MiB (llama.cpp); not predicted: edgekv "
                      "takes compute buffers from llama.cpp's own dry run (explain -m MODEL --engine, CPU logs)")


def _devices_and_notes(con: Any, r: ExplainReport) -> None:
    kb = r.kv_buffers
    for x in kb.rows if kb else []:
        mark = "=" if x.match else f"≠ {x.why or ''}"
        con.print(f"KV buffer {x.device}: {x.printed_mib or '(none printed)'} MiB (llama.cpp), {x.predicted_mib} MiB "
                  f"(edgekv, {kb.status.removeprefix('predicted: ')}) {mark}")
    if r.cut:
        con.print(f"[b]{r.cut}[/b]")
    for d in r.devices:
        if d.limit_mib is not None and d.fits is not None:
            verdict = "fits" if d.fits else "does NOT fit"
            con.print(f"{d.device}: {d.printed_mib:.2f} MiB printed, {verdict} in {d.limit_mib:.2f} MiB ({d.limit})")
        elif d.fit_withheld:
            con.print(f"{d.device}: {d.printed_mib:.2f} MiB printed; no fit verdict: {d.fit_withheld}")
        if d.note and d.device != "host":
            con.print(f"  {d.note}")
    render_breakdown(con, r.breakdown)                  # llama.cpp's breakdown table at exit (breakdownview)
    for n in r.notes:
        con.print(f"note: {n}")
    if r.check and r.check.requested:
        for f in r.check.disagreements:
            con.print(f"[red]disagrees:[/red] {f}")
    rd = r.read
    if rd and (rd.stopped or rd.long_lines or rd.binary_lines):
        con.print(f"note: read {rd.lines} lines; {rd.long_lines} over-long, {rd.binary_lines} binary"
                  + (f"; {rd.stopped}" if rd.stopped else ""))


def render_explain(con: Any, result: dict[str, Any]) -> None:
    """The explanation as tables and lines, from the typed report ``--json`` prints."""
    r = report(result)
    con.print(_config_table(r))
    con.print(_buffer_table(r))
    if r.kv.lines:
        con.print(_kv_table(r))
    else:
        con.print(f"KV cache: {r.kv.status}")
    _model_and_compute(con, r)
    _devices_and_notes(con, r)
    if r.why:
        con.print(f"[b]Why so much:[/b] {r.why}")
