"""Measure and publish the committed reports of the two real models: reports/smollm2-135m/, reports/gemma3-270m/.

For each model: a measured sweep (``edgekv bench``: f16/q8_0/q5_0/q4_0 x several contexts, each in a
fresh process, with the formula and llama.cpp's own figures beside the OS measurements; with
and the quality pass, ``--quality``), its raw results kept as
``reports/NAME/sweep.jsonl``, then ``edgekv report`` renders the folder.  The sweep resumes: run the
same command again after an interruption.

Run it on a quiet machine (nothing else running): the timings are part of the report.

    python -m tools.publish.publish_reports                    # both models, full settings (~30-60 min on 2 cores)
    python -m tools.publish.publish_reports --models smollm2-135m
    python -m tools.publish.publish_reports --quick --out /tmp/r  # tiny settings, to check the pipeline

Full settings: llama-bench's test sizes (-p 512 -n 128 -r 5) at the contexts of models.toml's sweep
(SmolLM2: 2048/4096/8192, Gemma 3 270M: 4096/16384/32768); the KV depth is each context minus 512, so
"context C" really holds about C tokens when the timed tests run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TYPES = "f16,q8_0,q5_0,q4_0"

MODELS = {
    "smollm2-135m": {"title": "SmolLM2-135M-Instruct (Q4_1): KV cache types measured", "contexts": "2048,4096,8192"},
    "gemma3-270m": {"title": "Gemma 3 270M (Q4_K_M): KV cache types measured", "contexts": "4096,16384,32768"},
}
FULL = {"n_prompt": 512, "n_gen": 128, "repetitions": 5}
QUICK = {"n_prompt": 16, "n_gen": 8, "repetitions": 2, "contexts": "512,1024", "types": "f16,q4_0"}


def edgekv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], cwd=ROOT, check=True, text=True,
                          stdout=subprocess.PIPE)


def publish(name: str, out_root: Path, quick: bool, with_quality: bool, contexts: str | None,
            chunks: int | None = None, repetitions: int | None = None, n_gen: int | None = None) -> dict:
    cfg = MODELS[name]
    d = out_root / name
    d.mkdir(parents=True, exist_ok=True)
    sweep = d / "sweep.jsonl"
    s = dict(QUICK if quick else FULL)
    if repetitions:
        s["repetitions"] = repetitions       # a reduced re-measure: the note names the exact command
    if n_gen:
        s["n_gen"] = n_gen
    ctxs = contexts or (QUICK["contexts"] if quick else cfg["contexts"])
    types = QUICK["types"] if quick else TYPES
    shown = ["bench", name, "-c", ctxs, "-ctk", types, "-p", str(s["n_prompt"]), "-n", str(s["n_gen"]),
             "-r", str(s["repetitions"])] + (["--quality"] if with_quality else [])
    if with_quality and chunks:
        shown += ["--chunks", str(chunks)]
    print(f"{name}: edgekv {' '.join(shown)} -o {sweep}", flush=True)
    edgekv(*shown, "-o", str(sweep), "--json")
    quality_note = ("Quality (perplexity and KL divergence against the f16 cache, on the built-in pydoc corpus) was "
                    "measured in the same sweep (`--quality`)." if with_quality else
                    "Quality was not measured (`--no-quality`).")
    note = (f"Measured with `edgekv {' '.join(shown)} -o sweep.jsonl` (each configuration in a fresh process; the raw results "
            f"are `sweep.jsonl` in this folder, and `edgekv report sweep.jsonl -o .` with this title and note renders "
            f"this folder again). "
            f"{quality_note} Produced by `tools/publish/publish_reports.py`.")
    if quick:
        note = "**Quick settings (a pipeline check, not figures to publish).** " + note
    res = json.loads(edgekv("report", str(sweep), "-o", str(d), "--title", cfg["title"], "--note", note,
                            "--json").stdout)
    print(f"{name}: {res['records']} configurations -> {d}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of: " + ", ".join(MODELS))
    ap.add_argument("--out", type=Path, default=ROOT / "reports", help="folder holding one folder per model")
    ap.add_argument("--quick", action="store_true", help="tiny settings: checks the pipeline, figures not for publishing")
    ap.add_argument("--contexts", help="override the contexts (comma list)")
    ap.add_argument("--no-quality", action="store_true", help="skip the quality pass")
    ap.add_argument("--chunks", type=int, help="quality chunks per context (edgekv bench's default: 2)")
    ap.add_argument("-r", "--repetitions", type=int, help="override -r (a reduced re-measure; the report says so)")
    ap.add_argument("-n", "--n-gen", type=int, help="override -n")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if not a.quick and load > 0.5:
        print(f"warning: load average {load:.2f}: other work is running, the timings will be too low and noisy",
              file=sys.stderr)
    for n in names:
        publish(n, a.out, a.quick, not a.no_quality, a.contexts, a.chunks, a.repetitions, a.n_gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
