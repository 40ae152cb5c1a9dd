"""A matrix's decode cost per byte against its widths: the evidence for the speed model's cost per row (issue 26).

Writes zero-weight llama models (edgekv's own sparse calibration models; ``--values``: of values like a trained
model's, as the calibration writes since CAL_VERSION 8) of several widths -- hidden size, feed-
forward size, heads -- each with about ``--mb`` MB of matrices of one type, decodes each with this build's llama-bench
(``-p 0 -n 32 -r 5``) and fits the time per token, less the graph's nodes (``--node-us`` each, about 17 a layer), two
ways: bytes alone, and bytes plus rows (one dot product per row of every matrix; the output head's 256 rows
included).  A row is ggml's ne0 elements: ggml-cpu's mat-vec computes one dot product per row and hands rows out in
chunks of 64 (ggml-cpu.c, ggml_compute_forward_mul_mat).

    .venv/bin/python bench/matvec_widths.py --threads 2,1 --types Q4_1,Q8_0 --out bench/results/matvec_widths.csv
    .venv/bin/python bench/matvec_widths.py --threads 2,1 --types Q4_1 --values --prompt   # pp512 per token, -fa 1,
                                                                  # each model's f16 attention taken out (--attn-ps)
    .venv/bin/python bench/matvec_widths.py --threads 2 --types Q4_1 --values   # models of values, not zeros

Run it on a quiet machine; it prints each width's decode and the two fits' residuals, and writes the rows as CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# (n_embd, n_ff, n_head, n_head_kv): the calibration's wide and narrow weight models, SmolLM2's and Gemma 3 270M's
# widths, and wider and narrower ones
WIDTHS = ((1024, 4096, 8, 8), (512, 2048, 8, 8), (576, 1536, 9, 3), (640, 2048, 4, 1), (2048, 8192, 16, 4),
          (4096, 1024, 32, 8), (512, 512, 8, 8), (1536, 6144, 12, 4))
BYTES_PER_ELEMENT = {"Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q5_0": 22 / 32, "Q8_0": 34 / 32}
NODES_PER_LAYER = 17


def model(folder: Path, mat_type: str, e: int, f: int, h: int, kv: int, target: float, values: bool = False) -> dict:
    from edgekv.edges.tinymodel import write_llama

    hd = max(32, e // h)
    per_layer = (2 * e * h * hd + 2 * e * kv * hd + 3 * e * f) * BYTES_PER_ELEMENT[mat_type]
    n_layer = max(1, round(target / per_layer))
    path = folder / f"m_{mat_type}_{e}_{f}_{n_layer}.gguf"
    write_llama(path, n_embd=e, n_ff=f, n_layer=n_layer, n_head=h, n_head_kv=kv, mat_type=mat_type, head_dim=hd,
                values=values)
    out_bytes = 256 * e * BYTES_PER_ELEMENT[mat_type]
    return {"path": path, "type": mat_type, "n_embd": e, "n_ff": f, "n_layer": n_layer, "n_head": h, "head_dim": hd,
            "bytes": per_layer * n_layer + out_bytes, "rows": n_layer * (h * hd + 2 * kv * hd + 2 * e + 2 * f) + 256}


def decode_ms(exe: Path, env: dict, path: Path, threads: int, prompt: bool = False) -> tuple[float, float]:
    """Milliseconds per decoded token (or, ``prompt``, per 512-token prompt) and the relative spread."""
    test = ["-p", "512", "-n", "0", "-r", "3", "-fa", "1"] if prompt else ["-p", "0", "-n", "32", "-r", "5"]
    r = subprocess.run([str(exe), "-m", str(path), *test, "-t", str(threads), "-o", "jsonl"],
                       capture_output=True, text=True, env=env, check=True)
    j = next(json.loads(x) for x in r.stdout.splitlines() if x.startswith("{"))
    return (512 if prompt else 1) * 1e3 / j["avg_ts"], j["stddev_ts"] / j["avg_ts"]


def attn_ms(m: dict, ps_per_cell: float) -> float:
    """A pp512's attention per token at depth 0, as the speed model prices it: each token over half the prompt (plus
    the diagonal 64-cell tile of llama.cpp's tiled flash attention), per head x (head_k + head_v) x layer."""
    return 1e-9 * ps_per_cell * m["n_layer"] * m["n_head"] * 2 * m["head_dim"] * (512 / 2 + 32)


def fit(rows: list[dict], node_s: float) -> None:
    y = np.array([(r["ms"] - r.get("attn_ms", 0.0)) * 1e-3 - r["n_layer"] * NODES_PER_LAYER * node_s for r in rows])
    b = np.array([r["bytes"] for r in rows])
    n = np.array([r["rows"] for r in rows])
    for name, x in (("bytes", np.c_[b]), ("bytes + rows", np.c_[b, n])):
        c, *_ = np.linalg.lstsq(x, y, rcond=None)
        err = 100 * (x @ c / y - 1)
        coef = f"{1e-9 / c[0]:.1f} GB/s" + (f", {c[1] * 1e9:.1f} ns per row" if len(c) > 1 else "")
        print(f"  {name}: {coef}; residuals " + " ".join(f"{e:+.0f}" for e in err) + f" %, worst {abs(err).max():.1f} %")


def main() -> None:
    from llama_tools import tool, tool_env

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--types", default="Q4_1,Q8_0")
    ap.add_argument("--mb", type=float, default=64.0, help="MB of matrices per model (default %(default)s)")
    ap.add_argument("--node-us", type=float, default=0.6, help="a graph node's cost taken out first (us)")
    ap.add_argument("--out", type=Path, help="CSV of every width's decode")
    ap.add_argument("--values", action="store_true", help="models of values like a trained model's (what the speed "
                    "calibration decodes since CAL_VERSION 8), not zeros")
    ap.add_argument("--prompt", action="store_true", help="time a 512-token prompt instead (pp512; its attention over "
                    "the layers is taken out at --attn-ps per head x head dims x cell, then the fits are per token)")
    ap.add_argument("--attn-ps", default="29,59", help="with --prompt: the f16 prompt attention's cost per head x "
                    "(head_k + head_v) x cell in picoseconds, one per --threads entry (default %(default)s: SmolLM2's "
                    "geometry on this VM, 2 and 1 threads)")
    a = ap.parse_args()
    exe = tool("llama-bench")
    env = tool_env(exe)
    out = []
    with tempfile.TemporaryDirectory(prefix="edgekv-widths-") as tmp:
        for t in a.types.split(","):
            models = [model(Path(tmp), t, *w, a.mb * 1e6, a.values) for w in WIDTHS]
            for th, ps in zip((int(x) for x in a.threads.split(",")), (float(x) for x in a.attn_ps.split(","))):
                rows = []
                for m in models:
                    ms, sd = decode_ms(exe, env, m["path"], th, a.prompt)
                    if a.prompt:
                        ms /= 512
                    rows.append({**{k: v for k, v in m.items() if k != "path"}, "threads": th, "ms": ms, "sd": sd,
                                 "values": a.values, "attn_ms": attn_ms(m, ps) if a.prompt else 0.0})
                    print(f"{t} {m['n_embd']}/{m['n_ff']} x{m['n_layer']} -t {th}: {m['bytes'] / 1e6:.1f} MB, "
                          f"{m['rows']} rows, {ms:.2f} ms ({m['bytes'] / ms / 1e6:.1f} GB/s, sd {100 * sd:.1f} %)",
                          flush=True)
                fit(rows, a.node_us * 1e-6)
                out += rows
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)


if __name__ == "__main__":
    main()
