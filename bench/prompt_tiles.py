"""A prompt's attention cost per query row against the ubatch's size: llama.cpp's query tiles (issue 26).

llama.cpp's tiled flash-attention kernel (ggml-cpu/ops.cpp) hands the n x n_head query rows of a layer out in chunks
(four a thread) and cuts a 64-row query tile at a chunk's end and at a head's; every tile then packs its K/V tile
and runs both GEMMs and the softmax over all 64 rows, however many it holds.  So the cost per row depends on how the
rows fall into tiles (edgekv.core.speed.fa_tiles): SmolLM2's 9 heads at 128 tokens on two threads run 24 tiles for
18 full ones' rows, at 512 tokens 72 for 72.  This script times prompts of several sizes on a model of a geometry's
heads, each at two depths, and prints the cost per row and cell beside the tile count per full tiles' rows; the
calibration's share of cost per tile (speedcal.solve_tile_share) is what makes the two columns agree:

    .venv/bin/python bench/prompt_tiles.py --sizes 64,96,128,192,256,320,384,512 --depths 4096,8192
    .venv/bin/python bench/prompt_tiles.py --geometry h4kv1k256v256e640 --sizes 64,100,128,512

``--layers``: the model's layer count (1, as the calibration's deep model).  ``--type``: the K/V cache type (K == V,
f16 by default; a quantized cache runs llama.cpp's per-row loop at every size, whose cost per row and cell should
not depend on the prompt's size: the tile columns then do not apply):

    .venv/bin/python bench/prompt_tiles.py --type q5_0 --layers 6 --sizes 64,128,256 --depths 0,1024

Prints one line per size and round (edgekv's own probe, llama-cpp-python).  Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from edgekv.core.speed import fa_tiles, kv_key, tile_ratio
    from edgekv.edges.tinymodel import drop_plan_models, plan_model
    from edgekv.orchestration import speedcal as sc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--geometry", default="h9kv3k64v64", help="query heads, KV heads, K and V head dims (SmolLM2's)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--sizes", default="64,96,128,256,512", help="prompt sizes (tokens), comma-separated")
    ap.add_argument("--depths", default="4096,8192", help="the two depths each prompt is timed at")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type", default="f16", help="K/V cache type (K == V)")
    a = ap.parse_args()
    sizes = [int(v) for v in a.sizes.split(",")]
    d0, d1 = (int(v) for v in a.depths.split(","))
    shape = {**sc.geometry_shape(a.geometry), "n_layer": a.layers}
    name = f"attnt_{a.geometry}_{a.layers}"
    steps = [sc._step(f"p{n}_{d}_{it}", "pp", d, n, 5) for it in range(a.rounds) for n in sizes for d in (d0, d1)]
    ctx = sc._ctx(kv_key(a.type, a.type, "auto", a.geometry), a.threads, steps,
                  n_ctx=-(-(d1 + max(sizes) + 1) // 512) * 512, type_k=a.type, type_v=a.type)
    model = {"key": name, "repack": True, "n_gpu_layers": 0,
             **plan_model(name, **shape), "contexts": [ctx]}
    t0 = time.monotonic()
    try:
        r = sc._by(sc._run([model], None), name)
    finally:
        drop_plan_models([model])
    print(f"{a.geometry}, {a.layers} layer(s), {a.type} cache, {a.threads} threads, depths {d0} -> {d1} "
          f"({time.monotonic() - t0:.1f} s)")
    units, h = sc._attn_units(shape), shape["n_head"]
    for n in sizes:
        ratio = tile_ratio(n, h, a.threads)
        for it in range(a.rounds):
            s, d = (statistics.median(r[f"p{n}_{x}_{it}"]["ns"]) / 1e9 for x in (d0, d1))
            cell = (d - s) / n / units / (d1 - d0)
            print(f"round {it} {n:4d} tokens: {fa_tiles(n, h, a.threads):4d} tiles, {ratio:.3f} x full tiles' rows, "
                  f"{cell * 1e12:6.1f} ps a row and cell (runs {s * 1e3:.1f} and {d * 1e3:.1f} ms)", flush=True)


if __name__ == "__main__":
    main()
