#!/usr/bin/env python3
"""``edgekv explain --json`` on every public llama.cpp log of the corpus (tests/data/logs), summed per backend.

For each log it records what explain reproduced: the KV and recurrent-state size lines (exact or not), the model
buffers against the tensors' bytes (within 0.5 %, or why the log allows no comparison), the per-device KV buffer
lines (how many the log prints, how many explain predicted and checked), and llama.cpp's own memory breakdown
table where the log has one (rows whose model / context / compute edgekv reproduces).  A log explain refuses is
recorded with its one-line reason.  Nothing here depends on the machine but the code, so a run anywhere gives the
same rows; they are filed under the machine class like every harness's.

    python -m bench.explain_corpus                 # every log in tests/data/logs
    python -m bench.explain_corpus --logs DIR      # another folder of logs

One row a log goes to bench/results/explain_corpus/<machine-class>.jsonl (bench/harness.py), from which
tools/render_tables.py renders the docs' ``explain-corpus`` table (docs/explain.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench import harness as H
from edgekv.core.explainschema import ExplainReport, report

NAME = "explain_corpus"
KEY = ("log",)
LOGS = H.ROOT / "tests" / "data" / "logs"
BACKENDS = {"metal": "Metal", "cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "sycl": "SYCL", "cann": "CANN",
            "cpu": "CPU"}
ORDER = ("Metal", "CUDA", "ROCm", "Vulkan", "SYCL", "CANN", "CPU")


def backend_of(name: str) -> str:
    return BACKENDS.get(name.split("-", 1)[0], "other")


def _device_kv(r: ExplainReport) -> tuple[int, int, int]:
    """(per-device KV lines printed, predicted, matching): a cache split over two or more memories prints one
    ``KV buffer size`` line per device; explain's ``kv_buffers.rows`` carry the prediction of each device's line from
    llama.cpp's layer split (a row with no printed line is a device edgekv puts KV on that the log does not)."""
    lines = [b for g in r.buffers for b in g.buffers if b.kind == "KV"]
    devices = {g.device for g in r.buffers if any(b.kind == "KV" for b in g.buffers)}
    # several contexts in one log also print KV lines on several devices: a split shows more buffer lines than caches
    caches = [x for x in r.kv.lines if x.role != "recurrent"]
    printed = len(lines) if len(devices) > 1 and len(lines) > len(caches) else 0
    pred = r.kv_buffers.rows if printed and r.kv_buffers else []
    return printed, len(pred), sum(1 for x in pred if x.match)


def summarise(name: str, result: dict[str, Any] | None, refused: str | None = None) -> dict[str, Any]:
    """One log's row from explain's JSON, read as the typed report (or the reason it was refused)."""
    row: dict[str, Any] = {"log": name, "backend": backend_of(name)}
    if result is None:
        row.update(refused=refused)
        return row
    r = report(result)
    kv = [x for x in r.kv.lines if x.role != "recurrent"]
    rs = [x for x in r.kv.lines if x.role == "recurrent"]
    m = r.model
    printed, predicted, matched = _device_kv(r)
    bd = r.breakdown
    kvb = [x for x in (r.kv_buffers.rows if r.kv_buffers else []) if x.printed_mib is not None]
    row.update(arch=r.config.get("arch"), build=r.build,
               kv_lines=len(kv), kv_exact=sum(1 for x in kv if x.match),
               rs_lines=len(rs), rs_exact=sum(1 for x in rs if x.match),
               kv_status=r.kv.status,
               model_status=m.status, model_residual_pct=m.residual_pct,
               model_within=(abs(m.residual_pct) <= max(0.5, 100 * (m.rounding_mib or 0) / m.predicted_mib)
                             if m.residual_pct is not None and m.predicted_mib else None),
               device_kv_lines=printed, device_kv_predicted=predicted, device_kv_matching=matched,
               kv_buffer_devices=len({g.device for g in r.buffers if any(b.kind == "KV" for b in g.buffers)}),
               kv_buffer_predicted=len(kvb), kv_buffer_exact=sum(1 for x in kvb if x.match),
               breakdown_rows=len(bd), breakdown_matching=sum(1 for x in bd if x.match),
               breakdown_overhead=[{"row": x.name, "mib": x.overhead.mib if x.overhead else None,
                                    "status": x.overhead.status if x.overhead else None}
                                   for x in bd if x.kind == "device"])
    if r.notes:
        row["notes"] = r.notes
    return row


def explain_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``edgekv explain PATH --json`` as a subprocess of this checkout: (result, None) or (None, its one line)."""
    p = subprocess.run([*H.edgekv_argv(), "explain", str(path), "--json"], capture_output=True, text=True,
                       cwd=H.ROOT, timeout=300)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return json.loads(p.stdout), None


def run(logs: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(logs.glob("*.log")):
        r, why = explain_json(path)
        rows.append(summarise(path.name, r, why))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=Path, default=LOGS, help="the folder of logs (default tests/data/logs)")
    H.add_common(ap)
    a = ap.parse_args(argv)
    rows = run(a.logs)
    path = H.save(NAME, a.machine or H.this_machine(), rows, KEY, a.results)
    print(f"{len(rows)} logs -> {path}")
    return 0


# -- the docs' table -----------------------------------------------------------------------------------------------

def _per_backend(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        b = out.setdefault(r["backend"], {"logs": 0, "refused": 0, "kv": [0, 0], "rs": [0, 0], "model_in": 0,
                                          "model_n": 0, "res": [], "model_not": 0, "dev": [0, 0, 0], "bd": [0, 0],
                                          "kvb": [0, 0, 0]})
        b["logs"] += 1
        if r.get("refused"):
            b["refused"] += 1
            continue
        b["kv"][0] += r["kv_exact"]
        b["kv"][1] += r["kv_lines"]
        b["rs"][0] += r["rs_exact"]
        b["rs"][1] += r["rs_lines"]
        if r["model_residual_pct"] is not None:
            b["model_n"] += 1
            b["model_in"] += bool(r["model_within"])
            b["res"].append(r["model_residual_pct"])
        else:
            b["model_not"] += 1
        for i, k in enumerate(("device_kv_lines", "device_kv_predicted", "device_kv_matching")):
            b["dev"][i] += r[k]
        for i, k in enumerate(("kv_buffer_devices", "kv_buffer_predicted", "kv_buffer_exact")):
            b["kvb"][i] += r.get(k, 0)
        b["bd"][0] += r["breakdown_matching"]
        b["bd"][1] += r["breakdown_rows"]
    return out


def _cells(name: str, b: dict[str, Any]) -> list[Any]:
    res = b["res"]
    lo, hi = (f"{min(res):+.2f} %", f"{max(res):+.2f} %") if res else ("none", "none")
    span = lo if lo == hi else f"{lo} to {hi}"
    return [f"`{name}`", b["logs"], b["refused"] or "", f"{b['kv'][0]} / {b['kv'][1]}",
            f"{b['rs'][0]} / {b['rs'][1]}" if b["rs"][1] else "", f"{b['model_in']} / {b['model_n']} ({span})",
            b["model_not"] or "", f"{b['kvb'][2]} / {b['kvb'][1]} of {b['kvb'][0]}" if b["kvb"][0] else "",
            f"{b['dev'][2]} / {b['dev'][1]} of {b['dev'][0]}" if b["dev"][0] else "",
            f"{b['bd'][0]} / {b['bd'][1]}" if b["bd"][1] else ""]


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' explain-corpus table: one row a backend, from the latest run (every machine class gives the same
    rows; the newest file wins)."""
    rows = max(by_machine.values(), key=lambda rs: max(r.get("time_utc", "") for r in rs))
    per = _per_backend(rows)
    body = [_cells(name, per[name]) for name in (*ORDER, *sorted(set(per) - set(ORDER))) if name in per]
    tot = _per_backend([{**r, "backend": "all"} for r in rows])["all"]
    body.append([f"**{c}**" if c != "" else "" for c in _cells("all", tot)])
    table = H.md_table(["backend", "logs", "refused", "KV lines exact", "recurrent exact",
                        "model buffers within 0.5 % (residuals)", "model: no comparison", "KV buffer per device "
                        "exact / predicted of printed", "of them, caches split over devices", "breakdown rows reproduced"], body,
                       "lrrrrlrrrr")
    why = Counter(r["model_status"].split(":")[0] for r in rows if not r.get("refused")
                  and r["model_residual_pct"] is None)
    note = "; ".join(f"{k} ({n})" for k, n in why.most_common())
    return table + f"\n\nModel buffers with no comparison: {note}.\n\n*{len(rows)} logs; {H.identity_note(rows)}.*"


if __name__ == "__main__":
    sys.exit(main())
