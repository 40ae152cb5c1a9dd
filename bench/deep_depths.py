"""The speed model beyond the rounds' depths: llama-bench's pp512 and tg128 at depths 512 to 8192 against the
prediction (issue 26, point 7's depths 4K and 8K).

``bench/speed_model.py`` checks depths 512 and 2048 (each configuration in a fresh ``edgekv bench`` process; a round
takes about 15 minutes on two cores).  This runs the user's llama-bench (this build's, ``bench/llama_tools.py``) on a
registry model over ``--depths`` in one process per K/V type (``-p 512 -n 128 -r R -d D1,D2,...``), then asks
``edgekv predict`` for the same depths (with ``--calibration llama-bench``, the default since 27 Nov 23:10, the
calibration measured through that same llama-bench, as ``predict --llama-bench`` does; ``python``: llama-cpp-python's,
which the runs before then used; either is the cached one of ``-t``, measured first when missing), and writes
one CSV row per (type, test, depth): measured and predicted tokens/s, the residual, and the predicted attention's
share.  The CSV is written under a ``.part`` name and renamed when whole.

    .venv/bin/python bench/deep_depths.py smollm2-135m --out bench/results/deep_depths_smollm2.csv
    .venv/bin/python bench/deep_depths.py gemma3-270m -ctk f16,q8_0 --out bench/results/deep_depths_gemma3.csv

Run it on a quiet machine: the residuals are the model's, not the load's.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIELDS = ["model", "type", "test", "depth", "measured_ts", "predicted_ts", "residual_pct", "attention_ms",
          "predicted_ms", "calibration_id"]


def _predict(model: str, types: list[str], depth: int, threads: str, llama_bench: str | None) -> list[dict]:
    argv = [sys.executable, "-m", "edgekv.cli", "predict", model, "-c", str(depth + 640), "-ctk", ",".join(types),
            "-d", str(depth), "-t", threads, "--json"] + (["--llama-bench", llama_bench] if llama_bench else [])
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    from llama_tools import tool, tool_env

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a registry name (edgekv models) or a .gguf path")
    ap.add_argument("-ctk", "--cache-type-k", default="f16,q8_0", help="K/V types, comma-separated (K = V)")
    ap.add_argument("--depths", default="512,2048,4096,8192")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-r", "--repetitions", default="3")
    ap.add_argument("--calibration", choices=("llama-bench", "python"), default="llama-bench",
                    help="whose speed calibration predicts: this llama-bench's (the runtime measured here) or "
                         "llama-cpp-python's (deep in the cache the two builds' f16 prompts differ, bench/README.md)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    types = [t.strip() for t in a.cache_type_k.split(",") if t.strip()]
    depths = [int(d) for d in a.depths.split(",")]
    # the prediction first: it resolves the model's file (a registry name) and calibrates what is missing
    exe = tool("llama-bench")
    lb = str(exe) if a.calibration == "llama-bench" else None
    preds = {d: _predict(a.model, types, d, a.threads, lb) for d in depths}
    path = preds[depths[0]][0]["model"]["path"]
    measured: dict[tuple[str, str, int], float] = {}
    for t in types:
        argv = [str(exe), "-m", path, "-p", "512", "-n", "128", "-d", ",".join(map(str, depths)), "-r", a.repetitions,
                "-t", a.threads, "-ctk", t, "-ctv", t, "-o", "jsonl"]
        print("+", " ".join(argv[1:]), flush=True)
        out = subprocess.run(argv, capture_output=True, text=True, env=tool_env(exe), check=True)
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                measured[(t, "pp" if r["n_prompt"] else "tg", int(r["n_depth"]))] = float(r["avg_ts"])
    rows = []
    for d in depths:
        for rec in preds[d]:
            t = rec["settings"]["type_k"]
            for test in ("pp", "tg"):
                sp = rec["prediction"]["speed"][test]
                m = measured[(t, test, d)]
                att = sum(p["s_per_token"] for p in sp["parts"] if p["name"] == "attention")
                rows.append({"model": a.model, "type": t, "test": test, "depth": d, "measured_ts": f"{m:.2f}",
                             "predicted_ts": f"{sp['tokens_per_s']:.2f}",
                             "residual_pct": f"{100 * (m / sp['tokens_per_s'] - 1):+.1f}",
                             "attention_ms": f"{att * 1e3:.2f}", "predicted_ms": f"{1e3 / sp['tokens_per_s']:.2f}",
                             "calibration_id": sp.get("calibration_id", "")})
                print(f"{t:5} {test} d{d:>5}: measured {m:7.2f} t/s, predicted {sp['tokens_per_s']:7.2f} "
                      f"({rows[-1]['residual_pct']} %), attention {rows[-1]['attention_ms']} of "
                      f"{rows[-1]['predicted_ms']} ms", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    part = a.out.with_suffix(a.out.suffix + ".part")
    with part.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    part.replace(a.out)


if __name__ == "__main__":
    main()
