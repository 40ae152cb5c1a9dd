"""A decode's attention cost per cell against the calibration model's layer count and depth range (issue 26).

The speed calibration times each K/V pair's one-token attention on a GEOMETRY_LAYERS-layer model of the model's
heads (edgekv.orchestration.speedcal.attn_plan): two depths as two sequences of one context, their runs taken in turn,
the difference per head x (head_k + head_v) x cell.  This script times the same step on models of the same heads
with other layer counts and depth pairs, several rounds, so that a coefficient's spread on this machine and any
dependence on the layer count (how much of the cache the CPU's caches hold) can be read off:

    .venv/bin/python bench/attn_layers.py --configs 6:640:896,30:640:896,6:640:1664,30:640:1664 --rounds 3
    .venv/bin/python bench/attn_layers.py --geometry h32kv8k128v128 --configs 6:640:896,36:640:896 --rounds 2

``--configs``: LAYERS:SHALLOW:DEEP, each a model of that many layers timed from those two depths (five runs after one
warm-up, ``--reps``; runs of the calibration's tokens, ``--tokens``: speedcal.EVICT_TG_N behind an evicting head,
TG_N behind none).  ``--heads``: output heads to time each configuration with, in MB (default: the one the
calibration's decode steps run with, speedcal.evict_shape: a token then reads 1.25 x this CPU's last-level cache,
which evicts the K/V between tokens as a real model's weights do; 0: 256 rows, whose K/V stays in the caches):

    .venv/bin/python bench/attn_layers.py --configs 6:640:1664 --heads 0,40 --types f16,f16/off,q8_0 --rounds 2

``--types``: K/V types (K == V), each optionally /off for flash attention off.  Prints one line per round,
configuration, head and K/V type (edgekv's own probe, llama-cpp-python).  Run it on a quiet machine.
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
    from edgekv.core.speed import attn_units_tg, dense_view, kv_key, split_kv_path
    from edgekv.edges.tinymodel import drop_plan_models, plan_model
    from edgekv.orchestration import speedcal as sc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--geometry", default="h9kv3k64v64", help="query heads, KV heads, K and V head dims (SmolLM2's)")
    ap.add_argument("--configs", default="6:640:1664,30:640:1664", help="LAYERS:SHALLOW:DEEP, comma-separated")
    ap.add_argument("--types", default="f16,q8_0", help="K/V cache types (K == V), each optionally /off")
    ap.add_argument("--heads", default="", help="output heads in MB, comma-separated (default: the calibration's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=0, help="tokens a timed run (default: the calibration's)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs of each depth after one warm-up")
    a = ap.parse_args()
    configs = [tuple(int(v) for v in c.split(":")) for c in a.configs.split(",")]
    pairs = [(t.split("/")[0], t.split("/")[0], t.split("/")[1] if "/" in t else "auto") for t in a.types.split(",")]
    model_shape = sc.evict_shape(a.geometry) or sc.geometry_shape(a.geometry)
    e = model_shape["n_embd"]
    vocabs = ([max(256, round(float(mb) * 1e6 / sc._q8_bytes(e) / 256) * 256) for mb in a.heads.split(",")]
              if a.heads else [model_shape.get("n_vocab", 256)])     # 256: its own matrices evict the caches
    for it in range(a.rounds):
        for (layers, d0, d1), nv in ((c, v) for c in configs for v in vocabs):
            shape = {**model_shape, "n_layer": layers, "n_vocab": nv}
            n_tg = a.tokens or (sc.EVICT_TG_N if nv > 256 else sc.TG_N)
            name = f"attnl_{a.geometry}_{layers}_{nv}"
            n_ctx = max(4096, -(-(d1 + n_tg + 1) // 512) * 512)
            ctxs = [sc._ctx(kv_key(*p, a.geometry), a.threads,
                            [{**sc._step("tg", "tg", 0, n_tg, a.reps), "depths": [d0, d1]}], n_ctx=n_ctx,
                            type_k=p[0], type_v=p[1], flash_attn=p[2], n_seq=2) for p in pairs]
            model = {"key": name, "repack": True, "n_gpu_layers": 0,
                     **plan_model(name, **shape), "contexts": ctxs}
            t0 = time.monotonic()
            try:
                res = sc._run([model], None)
            finally:
                drop_plan_models([model])
            took = time.monotonic() - t0
            sh = sc._attn_speed_shape(shape)
            for p in pairs:
                r = sc._by(res, name, kv_key(*p, a.geometry))
                split, dense = split_kv_path(*p), dense_view(p[2])
                du = (attn_units_tg(sh, d1 + n_tg / 2, a.threads, split, dense=dense)
                      - attn_units_tg(sh, d0 + n_tg / 2, a.threads, split, dense=dense))
                s, d = statistics.median(r[f"tg{d0}"]["ns"]), statistics.median(r[f"tg{d1}"]["ns"])
                cell = (d - s) / 1e9 / n_tg / du
                head = sc._q8_bytes(nv * e) / 1e6
                print(f"round {it} {layers:3d} layers {d0:5d} -> {d1:5d} cells, head {head:6.1f} MB, {n_tg} x {a.reps}, "
                      f"{p[0]:5s} fa={p[2]:4s}: {cell * 1e12:6.1f} ps a cell (runs {s / 1e6:.1f} and {d / 1e6:.1f} ms, "
                      f"{took:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
