#!/usr/bin/env python3
"""edgekv bench -npl vs llama-batched-bench: same llama.cpp source, same settings, same threads.

Target (issue 28, point 1): with N sequences decoded at once, edgekv's aggregate prefill and decode tokens/s are at
least 0.97x what llama-batched-bench reports for the same -c, -p (its -npp), -n (its -ntg), -npl, -ctk/-ctv, -fa,
-t, -b and -ub.

For every (model, cache type, N) the script runs, alternating the order over ``--rounds`` rounds, one
``edgekv bench -npl N`` case (a fresh child process through ``run_sweep``: what a user gets, memory sampled) and one
``llama-batched-bench -npl N,N,...`` run (``-r`` rows of the same N in one process: each row is one timed
repetition, as each of edgekv's repetitions is) built from the llama.cpp tree vendored in the installed
llama-cpp-python (tools/llama_tools.py).  By default llama-batched-bench runs on llama-cpp-python's own
libllama/libggml (``--libs python``), so both sides execute the same machine code.  All samples are pooled per side;
the ratio is edgekv mean / llama-batched-bench mean with Welch's 95 % interval.  The same records give the memory
columns: the measured peak RSS of each edgekv case beside the whole-process prediction for that ``-np``.

    python -m bench.parallel_vs_batched_bench                       # SmolLM2 and Gemma 3, -npl 1,2,4

One row per (model, cache type, N) goes to bench/results/parallel_vs_batched_bench/<machine-class>.jsonl
(bench/harness.py); ``--out`` also keeps the whole run as one JSON document.

Run it on a quiet machine: on 2 shared cores the noise is larger than the effect being measured.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench import harness as H
from edgekv.core.stats import summarize, welch
from edgekv.prediction.api import load_model
from edgekv.records.schema import encode
from edgekv.sweep.run import run_sweep
from edgekv.sweep.spec import sweep_spec
from tools.llama_tools import run_batched_bench, tool

NAME = "parallel_vs_batched_bench"
KEY = ("model", "type", "npl", "c", "p", "n", "t")
MIB = H.MIB

def run_edgekv(m, args, t: str, npl: int, env) -> dict:
    spec = sweep_spec(model=m, contexts=[args.c], pairs=[(t, t)], n_prompt=args.p, n_gen=args.n, repetitions=args.r,
                      n_threads=args.t, flash_attn=[args.fa], n_batch=args.b, n_ubatch=args.ub, n_parallel=[npl],
                      predict_speed=False)
    with tempfile.TemporaryDirectory() as d:
        rec = encode(run_sweep(spec, output=Path(d) / "r.jsonl", env=env).records[-1])
    if rec["status"] != "ok":
        raise SystemExit(f"edgekv failed: {rec['reason']}")
    return {"pp": rec["speed"]["pp"]["samples_ts"], "tg": rec["speed"]["tg"]["samples_ts"],
            "tg_seq": rec["speed"]["tg_seq"]["mean_ts"], "peak_rss_bytes": rec["memory"]["peak_rss_bytes"],
            "predicted_peak_rss_bytes": (rec["prediction"].get("process") or {}).get("peak_rss_bytes"),
            "kv_matches_formula": (rec.get("differences") or {}).get("llama_kv_matches_formula")}


def ratio(ek: list[float], bb: list[float]) -> dict:
    a, b = summarize(bb), summarize(ek)
    w = welch(bb, ek)
    return {"edgekv_mean": b["mean"], "batched_bench_mean": a["mean"], "ratio": b["mean"] / a["mean"],
            "ratio_ci95": [1 + x for x in w["change_ci95"]] if w["change_ci95"] else None, "edgekv": ek, "batched_bench": bb}


def measure(args) -> tuple[list[dict], list[float]]:
    from edgekv.machine.environment import collect

    exe, env, rows, load1 = tool("llama-batched-bench"), collect(), [], []
    for name in args.models.split(","):
        m = load_model(name)
        for t in args.ctk.split(","):
            for npl in (int(x) for x in args.npl.split(",")):
                ek: dict = {"pp": [], "tg": []}
                bb: dict = {"pp": [], "tg": []}
                mem = []
                for rnd in range(args.rounds):
                    for who in (("edgekv", "bb") if rnd % 2 == 0 else ("bb", "edgekv")):
                        load1.append(round(os.getloadavg()[0], 2))
                        if who == "edgekv":
                            r = run_edgekv(m, args, t, npl, env)
                            mem.append(r)
                            dst = ek
                        else:
                            r = run_batched_bench(exe, os.path.abspath(m.ref.path), args, t, npl)
                            dst = bb
                        for k in ("pp", "tg"):
                            dst[k] += r[k]
                row = {"model": m.shape.name or name, "type": t, "npl": npl, "pp": ratio(ek["pp"], bb["pp"]),
                       "tg": ratio(ek["tg"], bb["tg"]), "tg_seq": sum(x["tg_seq"] for x in mem) / len(mem),
                       "peak_rss_bytes": max(x["peak_rss_bytes"] for x in mem),
                       "predicted_peak_rss_bytes": mem[-1]["predicted_peak_rss_bytes"],
                       "kv_matches_formula": all(x["kv_matches_formula"] for x in mem)}
                rows.append(row)
                print(f"{row['model'][:24]:<24} {t:<5} npl {npl}: pp {row['pp']['ratio']:.3f} tg {row['tg']['ratio']:.3f} "
                      f"peak {row['peak_rss_bytes'] / MIB:.1f} MiB (predicted {row['predicted_peak_rss_bytes'] / MIB:.1f})",
                      flush=True)
    return rows, load1


def markdown(out: dict) -> str:
    st = out["settings"]
    lines = ["## Parallel sequences: `edgekv bench -npl` against `llama-batched-bench` (issue 28, target ≥ 0.97×)",
             "", "Command:", "",
             f"    {out['command']}", "",
             f"- `-c {st['c']} -p {st['p']} -n {st['n']} -r {st['r']} -t {st['t']} -fa {st['fa']} -b {st['b']} "
             f"-ub {st['ub']}`, not unified (each sequence its own stream, llama.cpp's default); llama-batched-bench "
             "gets the same values (`-npp`/`-ntg`), `-npl N` repeated `-r` times (one timed row each).",
             f"- llama-batched-bench built from the llama.cpp tree vendored in llama-cpp-python {out['llama_cpp_python']}, "
             + ("run on llama-cpp-python's own libllama/libggml (both sides execute the same machine code)."
                if st["libs"] == "python" else "run on the libraries built beside it."),
             f"- {st['rounds']} rounds, alternating which side goes first; every sample kept. Machine: "
             f"{out['machine']['cpu']}, {out['machine']['cores_logical']} logical CPUs; 1-minute load average before "
             f"each run: {min(out['load1'])}–{max(out['load1'])}.", "",
             "| model | K/V | npl | edgekv pp t/s | batched-bench pp t/s | ratio [95 % CI] | edgekv tg t/s | "
             "batched-bench tg t/s | ratio [95 % CI] | tg per sequence | peak RSS MiB (predicted) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        cells = []
        for k in ("pp", "tg"):
            x = r[k]
            ci = f" [{x['ratio_ci95'][0]:.3f}, {x['ratio_ci95'][1]:.3f}]" if x["ratio_ci95"] else ""
            cells += [f"{x['edgekv_mean']:.1f}", f"{x['batched_bench_mean']:.1f}", f"{x['ratio']:.3f}{ci}"]
        pred = r["predicted_peak_rss_bytes"]
        diff = (f"{r['peak_rss_bytes'] / MIB:.1f} ({pred / MIB:.1f}, {100 * (r['peak_rss_bytes'] - pred) / pred:+.2f} %)"
                if pred else f"{r['peak_rss_bytes'] / MIB:.1f}")
        lines.append(f"| {r['model']} | {r['type']} | {r['npl']} | " + " | ".join(cells) + f" | {r['tg_seq']:.1f} | {diff} |")
    sm = out["summary"]
    lines += ["", f"Geometric mean of the ratios: prefill **{sm['pp_geomean']:.3f}**, decode **{sm['tg_geomean']:.3f}**; "
              f"lowest: prefill {sm['pp_min']:.3f}, decode {sm['tg_min']:.3f}. KV bytes equal llama.cpp's in every "
              f"run: {sm['kv_all_match']}."]
    return "\n".join(lines) + "\n"


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' parallel-sequences table: per machine class, model, cache type and N, edgekv's aggregate prefill and
    decode over llama-batched-bench's (target at least 0.97×) and the peak RSS beside the prediction for ``-np N``."""
    out = []
    for mc, rs in by_machine.items():
        for r in rs:
            cells = []
            for k in ("pp", "tg"):
                x = r[k]
                ci = f" [{x['ratio_ci95'][0]:.3f}, {x['ratio_ci95'][1]:.3f}]" if x.get("ratio_ci95") else ""
                cells.append(f"{x['ratio']:.3f}{ci}" + ("" if x["ratio"] >= 0.97 else " ✗"))
            pred = r.get("predicted_peak_rss_bytes")
            mem = (f"{r['peak_rss_bytes'] / MIB:.1f} ({pred / MIB:.1f}, {100 * (r['peak_rss_bytes'] - pred) / pred:+.2f} %)"
                   if pred else f"{r['peak_rss_bytes'] / MIB:.1f}")
            out.append([f"`{mc}`", r["model"], r["type"], r["npl"], *cells, mem, H.identity_note([r])])
    return H.md_table(["machine class", "model", "K/V", "N", "prefill ratio [95 % CI]", "decode ratio [95 % CI]",
                       "peak RSS MiB (predicted)", "code"], out, "lllrrrrl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("-ctk", default="f16,q8_0")
    ap.add_argument("-npl", default="1,2,4")
    ap.add_argument("-c", type=int, default=4096)
    ap.add_argument("-b", type=int, default=2048)
    ap.add_argument("-ub", type=int, default=512)
    ap.add_argument("-fa", default="auto")
    ap.add_argument("--libs", choices=("python", "own"), default="python")
    H.add_timing(ap, p=128, n=32, r=3)
    H.add_common(ap)
    args = ap.parse_args()
    rows, load1 = measure(args)
    summary = {"pp_geomean": H.geomean([r["pp"]["ratio"] for r in rows]),
               "tg_geomean": H.geomean([r["tg"]["ratio"] for r in rows]),
               "pp_min": min(r["pp"]["ratio"] for r in rows), "tg_min": min(r["tg"]["ratio"] for r in rows),
               "kv_all_match": all(r["kv_matches_formula"] for r in rows)}
    keyed = [{**r, "c": args.c, "p": args.p, "n": args.n, "t": args.t} for r in rows]
    H.finish_run(NAME, args, rows, load1, summary, markdown, keyed, KEY)


if __name__ == "__main__":
    main()
