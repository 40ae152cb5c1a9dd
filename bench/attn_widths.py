"""Attention's cost per cell against the model's width at one head geometry (issue 26).

The speed calibration times each K/V pair's attention on a six-layer model of the model's heads; up to CAL_VERSION 15
its hidden size was at most 1024, since 16 it is the model's own (at most ``edgekv.core.speed.GEOMETRY_MAX_EMBD``)
because of what this script shows. It times the same heads in llama-bench (pp32 through llama.cpp's per-row flash-
attention loop, or a decode with ``--test tg``) on llamas of values whose n_embd differs (``--widths
N_EMBD/N_FF/TYPE,...``), at two depths, and prints each one's cost per head x (K + V dims) x cell x layer: what a
wider model pays for the same attention.

    .venv/bin/python bench/attn_widths.py                                   # pp32, f16, 1024/2048/4096, d256 -> d992
    .venv/bin/python bench/attn_widths.py --test tg --types f16,q8_0 --widths 1024/256/Q8_0,4096/256/Q8_0
    .venv/bin/python bench/attn_widths.py --threads 1 --widths 1024/256/Q8_0,4096/256/Q8_0

Run it on a quiet machine; each width writes a model under a temporary folder and removes it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _width(spec: str) -> tuple[int, int, str]:
    m = re.fullmatch(r"(\d+)/(\d+)/([A-Za-z0-9_]+)", spec)
    if not m:
        raise SystemExit(f"attn_widths.py: --widths entry {spec!r} is not N_EMBD/N_FF/TYPE (e.g. 4096/256/Q8_0)")
    return int(m[1]), int(m[2]), m[3].upper()


def main() -> None:
    from llama_tools import tool, tool_env

    from edgekv.edges.tinymodel import write_llama
    from edgekv.orchestration import speedcal as sc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--geometry", default="h32kv8k128v128", help="query heads, KV heads, K and V head dims (Qwen3 8B's)")
    ap.add_argument("--widths", default="1024/256/Q8_0,2048/256/Q8_0,4096/256/Q8_0", help="N_EMBD/N_FF/TYPE, comma-separated")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--depths", default="256,992", help="two depths (llama-bench -d)")
    ap.add_argument("--test", choices=("pp", "tg"), default="pp", help="a prompt (per-row loop) or a 32-token decode")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of --test pp (the per-row loop: under 64, or any "
                    "for a quantized cache)")
    ap.add_argument("--types", default="f16", help="K/V cache types (K == V)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    g = sc.geometry_shape(a.geometry)          # validated before anything is built from it
    d0, d1 = (int(x) for x in a.depths.split(","))
    exe = tool("llama-bench")
    env = tool_env(exe)
    units = g["n_head"] * 2 * g["head_dim"] * a.layers
    n_tok = a.prompt if a.test == "pp" else 32
    test = ["-p", str(n_tok), "-n", "0"] if a.test == "pp" else ["-p", "0", "-n", "32"]
    for n_embd, n_ff, mat in map(_width, a.widths.split(",")):
        with tempfile.TemporaryDirectory(prefix="edgekv-attn-widths-") as tmp:
            path = Path(tmp) / "m.gguf"
            write_llama(path, n_embd=n_embd, n_ff=n_ff, n_layer=a.layers, n_head=g["n_head"], n_head_kv=g["n_head_kv"],
                        head_dim=g["head_dim"], mat_type=mat, values=True)
            for t in a.types.split(","):
                out = subprocess.run([str(exe), "-m", str(path), *test, "-d", f"{d0},{d1}", "-r", "5", "-t",
                                      str(a.threads), "-ctk", t, "-ctv", t, "-o", "jsonl"],
                                     capture_output=True, text=True, env=env, check=True).stdout
                ns = {j["n_depth"]: j["avg_ns"] / 1e9 for j in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
                cell = (ns[d1] - ns[d0]) / n_tok / ((d1 - d0) * units)
                print(f"{a.geometry} n_embd {n_embd} n_ff {n_ff} {mat} x{a.layers} {a.test}{n_tok} {t} -t {a.threads}: "
                      f"d{d0} {ns[d0] * 1e3:.1f} ms, d{d1} {ns[d1] * 1e3:.1f} ms; {cell * 1e12:.1f} ps a cell", flush=True)


if __name__ == "__main__":
    main()
