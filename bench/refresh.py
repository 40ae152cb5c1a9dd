"""Refresh this machine class's rows in bench/results/: every accuracy harness, one after the other, at settings that
take about 77 minutes on the slowest 2-core class measured (an AVX2-only EPYC: memory_model 24, speed_model 32), each
filing its rows under the same machine class.

    python -m bench.refresh --list          # print the plan (the commands and their estimated minutes); run nothing
    python -m bench.refresh                 # run it, then: python -m tools.render_tables
    python -m bench.refresh --only speed_model,memory_model

The settings are smaller than each harness's defaults (fewer depths, models, rounds): the rows say what they
measured (depth, cache type, settings), so a table never claims more than its rows hold.  The first refresh on a
machine also downloads the two models and builds llama.cpp's tools from the vendored tree once (tools/llama_tools.py),
which is not part of the estimate.  Run it on a quiet machine: speed rows taken under load are marked busy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import NamedTuple

from bench import harness as H


class Step(NamedTuple):
    harness: str
    args: tuple[str, ...]
    minutes: int          # what it took on the slowest class measured: a quiet 2-core AVX2 EPYC (x86-avx2-epyc-2cpu)


PLAN: tuple[Step, ...] = (
    # memory_model without "large" (SmolLM2 q4_0 at -c 8192 fills its context for 10 minutes) and, since it records
    # bytes, without the speed calibration each variant paid (26.6 min with both): 24.2 min without them
    Step("memory_model", ("--variants", "base,ub256,t1,nommap,llamabench,repack0,faoff"), 24),
    Step("speed_model", ("--models", "smollm2-135m", "--depths", "512,4096"), 32),
    Step("bench_vs_llama_bench", ("-c", "2048", "-ctk", "f16,q4_0", "-r", "3", "--rounds", "1"), 4),   # 6.5 min at 2 rounds
    Step("parallel_vs_batched_bench", ("--models", "smollm2-135m", "-ctk", "f16", "--rounds", "2"), 2),
    Step("serving_accuracy", ("--models", "smollm2-135m", "--rounds", "2"), 2),
    Step("quality_vs_perplexity", ("-c", "512", "--chunks", "8", "-ctk", "f16,q8_0,q4_0", "-t", "2"), 7),
    Step("first_run", (), 5),
    Step("explain_corpus", (), 1),        # parses the logs of tests/data/logs: no model run
)


def command(step: Step, machine: str | None) -> list[str]:
    """The command line of one step (``--machine`` files every harness's rows under the same class)."""
    return [sys.executable, "-m", f"bench.{step.harness}", *step.args, *(["--machine", machine] if machine else [])]


def _shown(argv: list[str]) -> str:
    return " ".join(["python", *argv[1:]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", "--dry-run", dest="list", action="store_true",
                    help="print the plan and its estimated minutes; run nothing")
    ap.add_argument("--only", help="comma-separated harnesses to run (default: all)")
    ap.add_argument("--machine", help="the machine class to file every row under (default: this machine's)")
    a = ap.parse_args(argv)
    steps = PLAN
    if a.only:
        names = a.only.split(",")
        unknown = sorted(set(names) - {s.harness for s in PLAN})
        if unknown:
            ap.error(f"--only: unknown harness {', '.join(unknown)}; known: {', '.join(s.harness for s in PLAN)}")
        steps = tuple(s for s in PLAN if s.harness in names)
    machine = a.machine or (None if a.list else H.this_machine())
    print(f"refresh: {len(steps)} harnesses, about {sum(s.minutes for s in steps)} minutes on a quiet 2-core AVX2 machine "
          "(faster CPUs take less)" + (f"; rows filed under {machine}" if machine else ""))
    for s in steps:
        print(f"  ~{s.minutes:>2} min  {_shown(command(s, machine))}")
    if a.list:
        return 0
    load1 = os.getloadavg()[0]
    if load1 > 0.3 * (os.cpu_count() or 1):
        print(f"refresh: the 1-minute load is {load1:.2f}: speed rows measured now will be marked busy", file=sys.stderr)
    failed = []
    for s in steps:
        t0 = time.monotonic()
        rc = subprocess.call(command(s, machine), cwd=H.ROOT)
        print(f"refresh: {s.harness} exited {rc} after {(time.monotonic() - t0) / 60:.1f} min", flush=True)
        if rc:
            failed.append(s.harness)
    if failed:
        print(f"refresh: failed: {', '.join(failed)} (their earlier rows are kept)", file=sys.stderr)
        return 1
    print("refresh: done; render the tables with: python -m tools.render_tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
