"""The report's "explained memory" section: every MiB of the measured peak, by part.

For each measured configuration whose record holds the whole-process prediction
(``prediction.process``, schema 2): the predicted parts stacked (runtime baseline, weights, KV, compute,
output, other), the measured peak RSS as a marker, and the *unexplained* rest (measured - predicted).
Records without a prediction (schema 1 files) are listed as such, never filled in.
"""

from __future__ import annotations

from typing import Any

import msgspec

from edgekv.core.memmodel import STACK_ORDER, stacked
from edgekv.core.units import MIB, kv_label
from edgekv.output.plots import measured_tick, png_bytes, stacked_bars
from edgekv.records.frame import unset_none as _v
from edgekv.records.schema import Process, Record

COLORS = {"baseline": "#8c8c8c", "weights": "#4c72b0", "KV": "#dd8452", "compute": "#55a868", "output": "#c44e52",
          "other": "#8172b3", "unexplained": "#ffffff"}


def _label(r: Record) -> str:
    s = r.settings
    kv = kv_label(s.type_k, s.type_v)
    extra = []
    if s.n_ubatch not in (None, 512):
        extra.append(f"-ub {s.n_ubatch}")
    if _v(s.no_mmap):
        extra.append("-lm none")
    if s.n_gpu_layers not in (None, -1):
        extra.append(f"-ngl {s.n_gpu_layers}")
    return f"{s.n_ctx} {kv}" + (f" ({', '.join(extra)})" if extra else "") + f" t{s.n_threads}"


def _process(r: Record) -> Process | None:
    p = _v(r.prediction)
    return _v(p.process) if p is not None else None


def explained(recs: list[Record]) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        proc, mem = _process(r), _v(r.memory)
        meas = mem.peak_rss_bytes if mem is not None else None
        if r.status != "ok" or not meas:
            continue
        row: dict[str, Any] = {"label": _label(r), "measured": meas, "predicted": None, "stack": None}
        if proc is not None and proc.peak_rss_bytes:
            row["predicted"] = proc.peak_rss_bytes
            row["stack"] = stacked(msgspec.to_builtins(_v(proc.parts) or []))
            row["workload"] = _v(proc.workload)
        out.append(row)
    return out


def table(recs: list[Record]) -> tuple[str, str, list[str], list[list[str]], list[str]] | None:
    """(title, intro, headers, rows, alignment) of the explained-memory table; None when no record holds a
    whole-process prediction.  The report wraps it in its ``Table``."""
    rows = explained(recs)
    if not any(x["stack"] is not None for x in rows):
        return None        # records from before the process model (schema 1): nothing to explain, nothing invented
    headers = ["configuration", *[f"{k} MiB" for k in STACK_ORDER], "predicted MiB", "measured peak MiB",
               "unexplained MiB", "unexplained %"]
    body = []
    for x in rows:
        if x["stack"] is None:
            body.append([x["label"], *["–"] * len(STACK_ORDER), "–", f"{x['measured'] / MIB:.1f}", "–",
                         "– (no prediction in this record)"])
            continue
        d = x["measured"] - x["predicted"]
        body.append([x["label"], *[f"{x['stack'][k] / MIB:.1f}" for k in STACK_ORDER], f"{x['predicted'] / MIB:.1f}",
                     f"{x['measured'] / MIB:.1f}", f"{d / MIB:+.1f}", f"{100 * d / x['predicted']:+.2f}"])
    wl = next((x.get("workload") for x in rows if x.get("workload")), "bench")
    after = any(_process(r) is not None and _v(_process(r).predicted_after_measurement) for r in recs)
    when = ("after the runs were measured (`tools/publish/explain_reports.py`, same settings and model)" if after
            else "before the run")
    intro = (f"Peak RSS of each run explained part by part: *predicted* {when} by edgekv's process model "
             f"(workload `{wl}`: runtime baseline measured once per environment, llama.cpp's host structures and "
             "compute buffer from its dry run for the graph the run reaches, weights/KV/work/output by formula), "
             "*measured* by the OS; *unexplained* = measured − predicted.")
    return "Explained memory", intro, headers, body, ["l"] + ["r"] * (len(headers) - 1)


def plot(recs: list[Record]) -> bytes | None:
    rows = [x for x in explained(recs) if x["stack"] is not None]
    if not rows:
        return None

    def after(ax, i: int, y: int, left: float) -> None:
        x = rows[i]
        gap = (x["measured"] - x["predicted"]) / MIB
        if gap > 0:
            ax.barh(y, gap, left=left, color=COLORS["unexplained"], edgecolor="black", hatch="///", linewidth=0.5,
                    label="unexplained" if i == 0 else None)
        measured_tick(ax, x["measured"] / MIB, y, "measured peak" if i == 0 else None)

    plt, fig, ax = stacked_bars([x["label"] for x in rows], [[(k, x["stack"][k] / MIB) for k in STACK_ORDER] for x in rows],
                                COLORS, after)
    ax.set_xlabel("MiB (host, resident)")
    ax.set_title("Explained memory: predicted parts vs measured peak RSS")
    top = max(max(x["measured"], x["predicted"]) for x in rows) / MIB
    ax.set_xlim(0, top * 1.42)          # room on the right for the legend, clear of the bars
    ax.legend(fontsize=7, loc="center right", framealpha=0.95)
    return png_bytes(plt, fig)
