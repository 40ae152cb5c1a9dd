"""An output head streamed from memory: does its cost per row add to its bytes, or hide behind them? (issue 26)

The speed model prices a group of matrices at max(bytes x c_byte + rows x c_row, bytes x c_stream): the kernels'
work on a 48 MB model partly in the CPU's caches, or the bytes at the rate llama.cpp streams the type from a 384 MB
model, whichever is slower.  Gemma 3 270M's output head is 178 MB of q8_0 in 262,144 rows of 640, and its decode on
two threads is predicted too fast in every round since round 8.  This script writes four one-layer llamas of values
(edgekv's own calibration writer, q8_0): a head of 262,144 rows of 640 (A) and one of the same bytes in 65,536 rows
of 2,560 (B), each beside the same body with a 256-entry vocabulary (C, D); decodes each with this build's
llama-bench (``-p 0 -n 32 -r 5``), in turn, three rounds, and prints each head's time (A - C, B - D) beside what the
cached calibration's rule (max) and the additive rule (max of the byte costs + rows x c_row) predict for it.

    .venv/bin/python bench/head_rows.py --threads 2,1
    .venv/bin/python bench/head_rows.py --threads 2 --body 18     # and a body behind the head (below)

``--body N``: two more models with N layers of Gemma 3 270M's widths in q5_0 (about 43 MB of matrices, the type of
most of Gemma's), one with the 262,144-row head (E) and one with the 256-entry vocabulary (F).  E - A is the N
layers' time (less A's one q8_0 layer) behind a head that evicts the caches every token, F - C the same alone: the
speed model prices them alike.

Run it on a quiet machine, after a calibration of the thread counts (``edgekv calibrate smollm2-135m -t 2``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = {"A": (640, 262144, 4), "B": (2560, 65536, 8), "C": (640, 256, 4), "D": (2560, 256, 8)}
Q8_0_BYTES = 34 / 32


def main() -> None:
    from llama_tools import tool, tool_env

    from edgekv.edges.tinymodel import write_llama
    from edgekv.orchestration.speedcal import cached

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--body", type=int, default=0, help="also a body of this many q5_0 layers behind the head (E, F)")
    a = ap.parse_args()
    exe = tool("llama-bench")
    env = tool_env(exe)
    threads = [int(x) for x in a.threads.split(",")]
    ms: dict[tuple[int, str], list[float]] = {}
    order = "ACBD" + ("EF" if a.body else "")
    with tempfile.TemporaryDirectory(prefix="edgekv-head-") as tmp:
        for k, (e, v, h) in MODELS.items():
            write_llama(Path(tmp) / f"{k}.gguf", n_embd=e, n_ff=2048, n_layer=1, n_head=h, n_head_kv=h,
                        mat_type="Q8_0", n_vocab=v, out_type="Q8_0", values=True)
        if a.body:
            for k, v in (("E", 262144), ("F", 256)):
                write_llama(Path(tmp) / f"{k}.gguf", n_embd=640, n_ff=2048, n_layer=a.body, n_head=4, n_head_kv=1,
                            head_dim=256, mat_type="Q5_0", n_vocab=v, out_type="Q8_0", values=True)
        for r in range(a.rounds):
            for t in threads:
                for k in order:
                    out = subprocess.run([str(exe), "-m", str(Path(tmp) / f"{k}.gguf"), "-p", "0", "-n", "32", "-r", "5",
                                          "-t", str(t), "-o", "jsonl"], capture_output=True, text=True, env=env,
                                         check=True).stdout
                    j = next(json.loads(x) for x in out.splitlines() if x.startswith("{"))
                    ms.setdefault((t, k), []).append(j["avg_ns"] / 32e6)
                    print(f"round {r} -t {t} {k}: {j['avg_ns'] / 32e6:.3f} ms a token", flush=True)
    def ms_of(t: int, k: str) -> float:
        return statistics.median(ms[(t, k)])

    for t in threads:
        m = {k: ms_of(t, k) for k in MODELS}
        cal = cached(t, True)
        for head, body, (e, v, _h) in (("A", "C", MODELS["A"]), ("B", "D", MODELS["B"])):
            nbytes, rows = e * v * Q8_0_BYTES, v
            line = f"-t {t}: head {head} ({v} rows of {e}, {nbytes / 1e6:.1f} MB): {m[head] - m[body]:.2f} ms measured"
            if cal and "q8_0" in cal.matvec_stream_s_per_byte:
                from edgekv.core.speed import WeightGroup, matvec_s

                mv, row = nbytes * cal.matvec_s_per_byte["q8_0"], rows * cal.matvec_s_per_row.get("q8_0", 0.0)
                st = nbytes * cal.matvec_stream_s_per_byte["q8_0"]
                model = matvec_s(WeightGroup("q8_0", int(nbytes), e * v, True, rows), cal)
                line += (f"; calibration {cal.id}: the speed model {1e3 * model:.2f} ms (max rule, the stream's own "
                         f"rows since CAL_VERSION 10), max rule on the bytes alone {1e3 * max(mv + row, st):.2f} ms, "
                         f"additive {1e3 * (max(mv, st) + row):.2f} ms")
            print(line)
        if a.body:
            behind, alone = ms_of(t, "E") - ms_of(t, "A"), ms_of(t, "F") - ms_of(t, "C")
            print(f"-t {t}: {a.body} q5_0 layers (640/2048) less one q8_0 layer: {behind:.2f} ms behind the 178 MB head, "
                  f"{alone:.2f} ms alone (E - A, F - C)")


if __name__ == "__main__":
    main()
