"""A prompt's cost per FLOP against the matrices' widths: is the mat-mat of an 8B model's widths priced by the
calibration's 1024/4096 models? (issue 26)

``bench/large_model_decode.py`` ran an 8B-shaped llama of values (Qwen3 8B's widths, Q4_K) at half the prefill the speed
model predicted, while its decode came within 3 %.  This times llama-bench's pp32 and pp256 (``-n 0 -r 3``) on
llamas of Q4_K values (``edgekv.edges.tinymodel.write_llama``) at the calibration's widths (1024/4096: 8 and 64
layers) and at Qwen3 8B's (4096/12288, 8 query and 2 KV heads per 1024: 1 and 3 layers), each model's slope between
the two prompts as GFLOP/s of its matrices, and what the cached calibration prices that slope at (the speed
model's ``prompt_weights_s``: 2 x params x c_flop + rows x c_dot, the bytes taken as zero, which cancel in the slope).
llama.cpp computes the last layer's feed-forward for the last token only in a prompt, so a one- or three-layer
model's slope is lower than a deep model's per layer; the price does the same.

    .venv/bin/python bench/prompt_widths.py                 # -t 2, Q4_K
    .venv/bin/python bench/prompt_widths.py --threads 1 --type Q8_0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name: (n_embd, n_ff, n_layer, n_head, n_head_kv)
MODELS = {"1024/4096 x8": (1024, 4096, 8, 8, 8), "1024/4096 x64": (1024, 4096, 64, 8, 8),
          "4096/12288 x1": (4096, 12288, 1, 32, 8), "4096/12288 x3": (4096, 12288, 3, 32, 8)}


def main() -> None:
    from llama_tools import tool, tool_env

    from edgekv.edges.tinymodel import write_llama
    from edgekv.orchestration.speedcal import cached

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type", default="Q4_K", help="the matrices' ggml type (default %(default)s)")
    a = ap.parse_args()
    exe = tool("llama-bench")     # this llama-cpp-python's llama.cpp, built once under bench/.build/
    env = tool_env(exe)
    cal = cached(a.threads, True)
    with tempfile.TemporaryDirectory(prefix="edgekv-prompt-widths-") as tmp:
        for name, (e, f, n_layer, h, hkv) in MODELS.items():
            path = Path(tmp) / "m.gguf"
            write_llama(path, n_embd=e, n_ff=f, n_layer=n_layer, n_head=h, n_head_kv=hkv, mat_type=a.type.upper(),
                        values=True)
            params = n_layer * (2 * e * e + 2 * e * (e * hkv // h) + 3 * e * f)
            rows = n_layer * (2 * e + 2 * (e * hkv // h) + 2 * f + e)
            out = subprocess.run([str(exe), "-m", str(path), "-p", "32,256", "-n", "0", "-r", "3", "-t", str(a.threads),
                                  "-o", "jsonl"], capture_output=True, text=True, env=env, check=True).stdout
            t = {j["n_prompt"]: j["avg_ns"] / 1e9 for j in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
            slope = (t[256] - t[32]) / (256 - 32)
            line = (f"{a.type} {name} -t {a.threads}: {params / 1e6:.0f}M params, {rows} rows; pp32 {t[32] * 1e3:.1f} ms, "
                    f"pp256 {t[256] * 1e3:.1f} ms; slope {slope * 1e3:.3f} ms a token = {2 * params / slope / 1e9:.0f} GFLOP/s")
            key = next((k for k in (cal.matmul_s_per_flop if cal else {}) if k.split("+")[0] == a.type.lower()), None)
            if cal and key:     # the speed model's own pricing, the last layer's feed-forward a mat-vec per prompt
                from edgekv.core.speed import WeightGroup, prompt_weights_s

                g = WeightGroup(key, 0, params, False, rows, 0, 3 * e * f, 2 * f + e)
                priced = (prompt_weights_s(g, cal, 256, 1) - prompt_weights_s(g, cal, 32, 1)) / (256 - 32)
                line += f"; calibration {cal.id} ({key}) prices it at {priced * 1e3:.3f} ms"
            print(line, flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
