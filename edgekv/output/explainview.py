"""``edgekv explain``'s tables: the configuration, the buffers per device, the KV lines checked, the answer."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from edgekv.output.breakdownview import render_breakdown

CONFIG_LABELS = (("arch", "architecture"), ("name", "model"), ("layers", "layers"), ("heads", "heads"),
                 ("kv_heads", "KV heads"), ("head_dim_k", "head dim K"), ("head_dim_v", "head dim V"),
                 ("sliding_window", "sliding window"), ("file_type", "file type"), ("file_size", "file size"),
                 ("n_ctx", "n_ctx"), ("n_batch", "n_batch"), ("n_ubatch", "n_ubatch"), ("n_seq_max", "sequences"),
                 ("type_k", "cache K"), ("type_v", "cache V"), ("flash_attn", "flash attention"),
                 ("flash_attn_resolved", "flash attention (resolved)"), ("offloaded", "layers offloaded"),
                 ("backends", "backends"), ("mmap", "mmap"))


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    """The result as plain JSON (it already is; kept as the one place the shape of ``--json`` is decided)."""
    return result


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items())
    return str(v)


def _config_table(r: dict[str, Any]) -> Table:
    cfg = r["config"]
    t = Table(title="Configuration recovered from the log", show_header=False)
    t.add_column("what")
    t.add_column("value")
    build = r.get("build") or (f"llama-cpp-python {r['llama_cpp_python']}" if r.get("llama_cpp_python")
                               else "not in the log (llama-cpp-python, ollama and LM Studio print none)")
    t.add_row("llama.cpp build", build)
    for key, label in CONFIG_LABELS:
        if key in cfg:
            t.add_row(label, _fmt(cfg[key]))
    if cfg.get("weight_types"):
        t.add_row("tensor types", _fmt(cfg["weight_types"]))
    for d in cfg.get("devices", []):
        free = f", {d['free_mib']} MiB free" if d.get("free_mib") is not None else ""
        t.add_row("device", f"{d['name']} ({d['description']}{free})")
    return t


def _buffer_table(r: dict[str, Any]) -> Table:
    t = Table(title="Buffers llama.cpp allocated, by device (MiB, as printed)")
    for c in ("device", "buffer", "kind", "MiB"):
        t.add_column(c, justify="right" if c == "MiB" else "left")
    for g in r["buffers"]:
        for row in g["buffers"]:
            t.add_row(g["device"], row["buffer"], row["kind"], f"{row['mib']:.2f}")
        t.add_row(g["device"], "[b]total[/b]", "", f"[b]{g['total_mib']:.2f}[/b]")
    return t


def _kv_table(r: dict[str, Any]) -> Table:
    t = Table(title=f"KV cache lines: llama.cpp vs edgekv ({r['kv']['status']})")
    for c in ("cache", "cells", "layers", "K/V", "llama.cpp MiB", "edgekv MiB", ""):
        t.add_column(c)
    for x in r["kv"]["lines"]:
        mark = "[green]=[/green]" if x.get("match") else f"[red]≠[/red] {x.get('why', '')}"
        t.add_row(x.get("role", "kv"), str(x.get("cells", "")), str(x.get("layers", "")),
                  f"{x.get('type_k')}/{x.get('type_v')}", x.get("printed_mib", ""), x.get("predicted_mib", "-"), mark)
    return t


def render_explain(con: Any, r: dict[str, Any]) -> None:
    con.print(_config_table(r))
    con.print(_buffer_table(r))
    if r["kv"]["lines"]:
        con.print(_kv_table(r))
    else:
        con.print(f"KV cache: {r['kv']['status']}")
    m = r["model"]
    if "predicted_mib" in m:
        con.print(f"Model buffers: {m['compared']} {m['compared_mib']:.2f} MiB (llama.cpp), {m['predicted_mib']:.2f} MiB "
                  f"of tensors ({m['source']}): residual {m['residual_pct']:+.3f} %")
    else:
        con.print(f"Model buffers: {m['status']}")
    for c in r["compute"]:
        if c.get("predicted_mib") is not None:
            con.print(f"Compute buffer {c['buffer']}: {c['printed_mib']:.2f} MiB (llama.cpp), {c['predicted_mib']:.2f} "
                      f"MiB ({c['source']}): residual {c['residual_pct']:+.3f} %")
        else:
            con.print(f"Compute buffer {c['buffer']}: {c['printed_mib']:.2f} MiB (llama.cpp); not predicted: edgekv "
                      "takes compute buffers from llama.cpp's own dry run (explain -m MODEL --engine, CPU logs)")
    for d in r["devices"]:
        if "limit_mib" in d:
            verdict = "fits" if d["fits"] else "does NOT fit"
            con.print(f"{d['device']}: {d['printed_mib']:.2f} MiB printed, {verdict} in {d['limit_mib']:.2f} MiB "
                      f"({d['limit']})")
        if d.get("note") and d["device"] != "host":
            con.print(f"  {d['note']}")
    render_breakdown(con, r)                            # llama.cpp's breakdown table at exit (breakdownview)
    for n in r.get("notes", []):
        con.print(f"note: {n}")
    rd = r.get("read") or {}
    if rd.get("stopped") or rd.get("long_lines") or rd.get("binary_lines"):
        con.print(f"note: read {rd['lines']} lines; {rd['long_lines']} over-long, {rd['binary_lines']} binary"
                  + (f"; {rd['stopped']}" if rd.get("stopped") else ""))
    if r.get("why"):
        con.print(f"[b]Why so much:[/b] {r['why']}")
