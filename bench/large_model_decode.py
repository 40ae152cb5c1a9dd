"""A large model's decode against the speed model: an 8B-shaped llama of values, run for real (issue 26).

The test models (SmolLM2 135M, Gemma 3 270M) fit in a few hundred MB; a user's 8B model reads 4-5 GB a token, which
no 48 MB calibration model describes: its matrices stream from memory.  This writes a llama of Qwen3 8B's widths
(36 layers, n_embd 4096, n_ff 12288, 32 query and 8 KV heads of 128, a 151,936-token vocabulary) with ``--type``
matrices under ``bench/.build/``, of values like a trained model's (``edgekv.edges.tinymodel.fill_values``, what the
speed calibration's own models hold since CAL_VERSION 8: about 7 GB on disk), or with ``--zeros`` as a sparse file of
zeros (about 7 GB apparent, nothing on disk; what this script ran before), then runs ``edgekv bench`` on it: each
configuration in a fresh process, the speed prediction made before the run stored beside the measurement.

    .venv/bin/python bench/large_model_decode.py --out bench/results/large_model_decode/values-8b-q4_k.jsonl
    .venv/bin/python bench/large_model_decode.py --zeros --out bench/results/large_model_decode/zero-8b-q4_k.jsonl
    .venv/bin/python bench/large_model_decode.py --shape 72b-4l --type Q4_0 \
        --out bench/results/large_model_decode/values-72b-4l-q4_0.jsonl

Needs about 5 GB of free memory (llama.cpp repacks the matrices into its CPU_REPACK buffer) and a few minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {"8b": {"n_embd": 4096, "n_ff": 12288, "n_layer": 36, "n_head": 32, "n_head_kv": 8, "n_vocab": 151936},
          # Qwen2.5 72B's widths (64 query and 8 KV heads of 128, n_embd 8192, n_ff 29568) on four of its 80 layers and
          # a 32K vocabulary: a 70B-class geometry's attention and projections, run for real (3.2 GB in Q4_0; its
          # n_ff is no multiple of 256, so no K-quant)
          "72b-4l": {"n_embd": 8192, "n_ff": 29568, "n_layer": 4, "n_head": 64, "n_head_kv": 8, "n_vocab": 32000}}


def main() -> None:
    from edgekv.edges.tinymodel import SPEED_MODELS_VERSION, write_llama

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--type", default="Q4_K", help="the matrices' ggml type (default %(default)s)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES), help="the widths (default %(default)s)")
    ap.add_argument("--zeros", action="store_true", help="zero weights in a sparse file, not values")
    ap.add_argument("--out", type=Path, required=True, help="the records (JSONL, appended; an interrupted run resumes)")
    a = ap.parse_args()
    folder = ROOT / "bench" / ".build"
    folder.mkdir(parents=True, exist_ok=True)
    kind = "zero" if a.zeros else "values"
    # the values' version in the name: a model of older values (tinymodel.SPEED_MODELS_VERSION) is not reused
    model = folder / (f"{kind}-{a.shape}-{a.type.lower()}" + ("" if a.zeros else f"-v{SPEED_MODELS_VERSION}") + ".gguf")
    if not model.is_file():
        part = model.with_suffix(".part")       # an interrupted write leaves no model that looks whole
        write_llama(part, mat_type=a.type.upper(), name=f"edgekv {kind} {a.shape} shape", values=not a.zeros,
                    **SHAPES[a.shape])
        part.replace(model)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "edgekv.cli", "bench", str(model), "-c", "1024", "-ctk", "f16,q8_0", "-p", "32",
            "-n", "16", "-r", "3", "-t", a.threads, "-o", str(a.out), "--json"]
    print("+", " ".join(argv[2:]), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    report(a.out)


def report(path: Path) -> None:
    for line in path.read_text().splitlines():
        r = json.loads(line)
        sp = (r.get("prediction") or {}).get("speed") or {}
        for test in ("tg", "pp"):
            meas = ((r.get("speed") or {}).get(test) or {}).get("mean_ts")
            pred = (sp.get(test) or {}).get("tokens_per_s")
            if meas and pred:
                s = r["settings"]
                print(f"{s['type_k']} depth {s['n_depth']} {test}: measured {meas:.2f} t/s, predicted {pred:.2f} "
                      f"({100 * (meas - pred) / pred:+.1f} %)")
        for p in (sp.get("tg") or {}).get("parts", []):
            print(f"    {p['name']}: {1e3 * p['s_per_token']:.1f} ms ({p['source']})")


if __name__ == "__main__":
    main()
