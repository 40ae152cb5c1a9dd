"""Issue 19's targets for the first command: how long `edgekv bench` takes with no arguments (target: at most
5 minutes on a quiet 2-core machine), how long `edgekv bench --full` takes, and how close the plan's estimate and
the remaining-time estimate after each configuration came to what the sweep really took (target: within ±25 %
after the first configuration).

It runs the command as a user would (stdout piped, as in CI) in a fresh edgekv home, so the time is a first run's:
the model's fetch, the speed calibration and the sweep (``--home`` reuses a home, and its calibration, instead).
It times it, records the load average before and after and the busy-machine marks edgekv stored in each record,
then reads the plan blocks of the records.

    python -m bench.first_run
    python -m bench.first_run --full
    python -m bench.first_run --results-of RUN.jsonl --wall 250    # analyse an earlier run instead

One row per command goes to bench/results/first_run/<machine-class>.jsonl (bench/harness.py); ``--out`` also keeps
the whole run (with the command's output) as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness as H
from edgekv.machine.load import record_busy
from edgekv.records import results as R
from edgekv.sweep.plan import eta_accuracy, fmt_duration

NAME = "first_run"
KEY = ("command", "busy")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args) -> dict:
    out = Path(tempfile.mkdtemp(prefix="edgekv-first-run-")) / "run.jsonl"
    cmd = H.edgekv_argv() + ["bench", "-o", str(out)] + (["--full"] if args.full else []) + args.extra
    home = args.home or tempfile.mkdtemp(prefix="edgekv-first-run-home-")
    before = _load()
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EDGEKV_HOME": home})
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    shown = " ".join(["edgekv", "bench"] + (["--full"] if args.full else []) + args.extra)
    return {"command": shown, "wall_s": round(wall, 1), "loadavg_before": before, "loadavg_after": _load(),
            "stdout": p.stdout, "results": str(out)}


def analyse(results: str, wall: float | None) -> dict:
    recs = [r for r in R.load_records(results) if r.kind == "bench"]
    incomplete = bool(recs) and bool(recs[-1].plan and recs[-1].plan.remaining_configs)
    # an interrupted sweep: what "the rest" took is unknown, so no ETA comparison
    rows = [] if incomplete else eta_accuracy(recs)
    busy = [r for r in recs if record_busy(r)]
    after_first = [x for x in rows if x["after"] >= 1 and x["actual_s"] and x["actual_s"] > 0]
    return {
        "configurations": len(recs), "busy_configurations": len(busy), "incomplete": incomplete,
        "estimates_made": [r.plan.estimate_s if r.plan else None for r in recs],
        "walls": [r.plan.wall_s if r.plan else None for r in recs],
        "max_others_cpu_share": max(((r.load.others_share_max if r.load else None) or 0.0) for r in recs) if recs else None,
        "plan_estimate_s": rows[0]["estimated_s"] if rows else None,
        "sweep_elapsed_s": rows[0]["actual_s"] if rows else None, "wall_s": wall, "eta": rows,
        "eta_within_25pct_after_first": all(abs(x["error"]) <= 0.25 for x in after_first) if after_first else None,
        "worst_eta_error_after_first": max((abs(x["error"]) for x in after_first), default=None),
    }


def markdown(res: dict) -> str:
    a = res["analysis"]
    if a["incomplete"]:
        return (f"- `{res.get('command', 'edgekv bench')}`: interrupted after {a['configurations']} configurations "
                f"({a['busy_configurations']} marked busy, other work up to {100 * (a['max_others_cpu_share'] or 0):.0f} % "
                f"of the CPUs); per configuration, estimate before it vs its wall time: "
                + ", ".join(f"{fmt_duration(e)} vs {fmt_duration(w)}" for e, w in zip(a["estimates_made"], a["walls"]))
                + ".\n")
    lines = [f"- `{res.get('command', 'edgekv bench')}`: **{fmt_duration(a['wall_s'])}** wall "
             f"({a['configurations']} configurations; load average before {res.get('loadavg_before')}, after "
             f"{res.get('loadavg_after')}; {a['busy_configurations']} configurations marked busy, other work up to "
             f"{100 * (a['max_others_cpu_share'] or 0):.0f} % of the CPUs).",
             f"  Plan's estimate {fmt_duration(a['plan_estimate_s'])} vs {fmt_duration(a['sweep_elapsed_s'])} taken; "
             "remaining-time estimate after each configuration vs the time the rest took: "
             + ", ".join(f"{x['after']}: {fmt_duration(x['estimated_s'])} vs {fmt_duration(x['actual_s'])} "
                         f"({100 * x['error']:+.0f} %)" for x in a["eta"][1:] if x["error"] is not None) + "."]
    return "\n".join(lines) + "\n"


def result_row(res: dict) -> dict:
    """The row a run keeps: its command, wall time, load and the plan's accuracy (not the command's output)."""
    a = res["analysis"]
    return {"command": res.get("command", "edgekv bench"), "busy": bool(a["busy_configurations"]),
            "wall_s": a["wall_s"], "loadavg_before": res.get("loadavg_before"), "loadavg_after": res.get("loadavg_after"),
            "analysis": a}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="time `edgekv bench --full` instead of the default")
    ap.add_argument("--results-file", "--results-of", dest="results_of", help="analyse this results file instead "
                    "of running (an earlier run's -o)")
    ap.add_argument("--wall", type=float, help="with --results-of: the wall time the run took")
    ap.add_argument("--out", help="also write the whole run as one JSON document here")
    ap.add_argument("--home", help="run in this edgekv home (its calibration and models reused: not a first run); "
                                   "default: a fresh one, deleted afterwards")
    ap.add_argument("extra", nargs="*", help="more edgekv bench arguments (after --)")
    H.add_common(ap)
    args = ap.parse_args()
    res = {"command": "edgekv bench" + (" --full" if args.full else "")} if args.results_of else run(args)
    res["analysis"] = analyse(args.results_of or res["results"], args.wall if args.results_of else res["wall_s"])
    print(markdown(res), end="")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    path = H.save(NAME, args.machine or H.this_machine(), [result_row(res)], KEY, args.results)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
