#!/usr/bin/env python3
"""edgekv bench vs llama-bench: same llama.cpp source, same configurations, same threads.

Target (issue #3): edgekv's prefill and decode tokens/s are at least 0.97x what llama-bench
reports, and the harness's own time is a small share of the sweep's wall time.

For every configuration (context, cache type) the script runs, in alternating order over
``--rounds`` rounds, one ``edgekv bench`` case (a fresh child process, exactly what a user gets)
and ``llama-bench`` built from the llama.cpp tree vendored in the installed llama-cpp-python
(tools/llama_tools.py), with the same depth, -p, -n, -r, -t, -b, -ub and -fa.  All samples of all
rounds are pooled per side; the ratio is edgekv mean / llama-bench mean with a Welch test.
By default llama-bench runs on llama-cpp-python's own libllama/libggml (``--libs python``), so both
sides execute the same machine code and the ratio isolates the harness; ``--libs own`` uses the
libraries built beside llama-bench (same source, possibly different compiler flags).

    python -m bench.bench_vs_llama_bench                    # SmolLM2, 2048/4096, f16/q8_0/q4_0
    python -m bench.bench_vs_llama_bench -c 4096 -ctk f16 --rounds 3 --out /tmp/x.json

One row per (context, cache type) goes to bench/results/bench_vs_llama_bench/<machine-class>.jsonl
(bench/harness.py), from which tools/render_tables.py renders the docs' ``bench-vs-llama-bench`` table; ``--out``
also keeps the whole run as one JSON document.

Run it on a quiet machine: on 2 shared cores the noise is larger than the effect being measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import harness as H
from edgekv.calibration.preflight import preflight
from edgekv.core.stats import summarize, welch
from edgekv.prediction.api import load_model
from edgekv.records.schema import encode
from edgekv.runtime.process import run_child
from edgekv.sweep.run import default_depth, run_sweep
from edgekv.sweep.spec import sweep_spec
from tools.llama_tools import llama_bench_env, tool

NAME = "bench_vs_llama_bench"
KEY = ("model", "n_ctx", "type", "p", "n", "t")


def run_edgekv(m, n_ctx, t, args, env) -> dict:
    spec = sweep_spec(model=m, contexts=[n_ctx], pairs=[(t, t)], n_prompt=args.p, n_gen=args.n, repetitions=args.r,
                      n_threads=args.t, flash_attn=[args.fa])
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = run_sweep(spec, output=Path(d) / "r.jsonl", env=env)
        sweep_wall = time.perf_counter() - t0
    rec = encode(res.records[-1])
    if rec["status"] != "ok":
        raise SystemExit(f"edgekv failed: {rec['reason']}")
    return {"pp": rec["speed"]["pp"]["samples_ts"], "tg": rec["speed"]["tg"]["samples_ts"],
            "case_wall_s": rec["timing"]["wall_s"], "llama_s": rec["timing"]["llama_s"],
            "harness_s": rec["timing"]["harness_s"], "sweep_wall_s": sweep_wall}


def run_llama_bench(exe, model_path, n_ctx, t, args) -> dict:
    d = default_depth(n_ctx, args.p, args.n)
    argv = [str(exe), "-m", model_path, "-p", str(args.p), "-n", str(args.n), "-d", str(d), "-ctk", t, "-ctv", t,
            "-fa", args.fa, "-t", str(args.t), "-r", str(args.r), "-b", "2048", "-ub", "512", "-o", "jsonl"]
    # the --repack edgekv's side measures with: llama.cpp's default, or 0 where its AMX kernels crash (issue 25)
    argv += ["--repack", "1" if preflight().repack else "0"]
    res = run_child(argv, stdin_data=b"", capture_output=True, env=llama_bench_env(exe, args.libs), timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"llama-bench failed: {res.failure_reason()}\n{res.stderr_tail}")
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    out = {"wall_s": res.wall_s, "build_commit": rows[0]["build_commit"]}
    for row in rows:
        out["pp" if row["n_prompt"] > 0 else "tg"] = row["samples_ts"]
    return out



def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def stats_row(lb: list[float], ek: list[float], lb_rounds: list[list[float]], ek_rounds: list[list[float]]) -> dict:
    """Pooled ratio of means with Welch's 95 % interval, and the per-round paired ratios (each round ran both
    sides back to back, so a round disturbed by something else on the machine moves both or shows up alone)."""
    a, b = summarize(lb), summarize(ek)
    w = welch(lb, ek)
    per_round = [_mean(e) / _mean(q) for e, q in zip(ek_rounds, lb_rounds)]
    return {"llama_bench": lb, "edgekv": ek, "llama_bench_mean": a["mean"], "edgekv_mean": b["mean"],
            "ratio": b["mean"] / a["mean"], "ratio_ci95": [1 + x for x in w["change_ci95"]] if w["change_ci95"] else None,
            "p_value": w["p_value"], "round_ratios": per_round, "round_ratio_median": _median(per_round)}


def markdown(out: dict) -> str:
    st, sm = out["settings"], out["summary"]
    lines = [
        "## Speed: `edgekv bench` against `llama-bench` (issue 3, target ≥ 0.97×)",
        "",
        "Command:",
        "",
        f"    {out['command']}",
        "",
        f"- Model {st['model']}, `-p {st['p']} -n {st['n']} -r {st['r']} -t {st['t']} -fa {st['fa']} -b 2048 -ub 512`, "
        "depth = context − max(p, n) on both sides.",
        f"- llama-bench: commit `{out['rows'][0]['llama_bench_commit']}`, built from the llama.cpp tree vendored in "
        f"llama-cpp-python {out['llama_cpp_python']}, run on "
        + ("llama-cpp-python's own libllama/libggml (`--libs python`: both sides execute the same machine code)."
           if st["libs"] == "python" else "the libraries built beside it (`--libs own`)."),
        f"- Each of {st['rounds']} rounds runs one `edgekv bench` case (a fresh child process through `run_sweep`, "
        "memory sampling on: what a user gets) and one `llama-bench` run back to back, alternating which goes "
        "first; every sample is kept.",
        f"- Machine: {out['machine']['cpu']}, {out['machine']['cores_logical']} logical CPUs, {out['machine']['os']}; "
        f"1-minute load average before each run: {min(out['load1'])}–{max(out['load1'])}.",
        "",
        "| ctx | depth | K/V | test | edgekv t/s | llama-bench t/s | ratio of means [95 % CI] | per-round ratios "
        "| median round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        for k in ("pp", "tg"):
            x = r[k]
            ci = f"[{x['ratio_ci95'][0]:.3f}, {x['ratio_ci95'][1]:.3f}]" if x["ratio_ci95"] else ""
            rr = ", ".join(f"{v:.3f}" for v in x["round_ratios"])
            test = f"pp{st['p']}" if k == "pp" else f"tg{st['n']}"
            lines.append(f"| {r['n_ctx']} | {r['depth']} | {r['type']} | {test} | {x['edgekv_mean']:.1f} | "
                         f"{x['llama_bench_mean']:.1f} | {x['ratio']:.3f} {ci} | {rr} | {x['round_ratio_median']:.3f} |")
    lines += [
        "",
        f"Geometric mean of the ratios of means: prefill **{sm['pp_ratio_geomean']:.3f}**, decode "
        f"**{sm['tg_ratio_geomean']:.3f}**; of the median round ratios: prefill {sm['pp_round_median_geomean']:.3f}, "
        f"decode {sm['tg_round_median_geomean']:.3f}. Lowest ratio of means: prefill {sm['pp_ratio_min']:.3f}, "
        f"decode {sm['tg_ratio_min']:.3f}.",
        "",
        f"Harness share: **{100 * sm['harness_share_of_case_wall']:.1f} %** of each case's wall time (process start, "
        "imports, result assembly: everything outside llama.cpp calls), "
        f"**{100 * sm['harness_share_of_sweep_wall']:.1f} %** of the sweep's wall time (adding the llama.cpp dry run "
        "that gives the engine's own figures).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-c", default="2048,4096")
    ap.add_argument("-ctk", default="f16,q8_0,q4_0")
    ap.add_argument("-fa", default="auto")
    ap.add_argument("--libs", choices=("python", "own"), default="python",
                    help="llama-bench on llama-cpp-python's own shared libraries (default) or on those built beside it")
    H.add_timing(ap, p=512, n=128, r=5)
    H.add_common(ap)
    args = ap.parse_args()

    from edgekv.machine.environment import collect

    m = load_model(args.model)
    exe = tool("llama-bench")
    env = collect()
    ctxs = [int(x) for x in args.c.split(",")]
    types = args.ctk.split(",")
    rows, load1 = [], []
    for n_ctx in ctxs:
        for t in types:
            ek = {"pp": [], "tg": []}
            lb = {"pp": [], "tg": []}
            ek_rounds = {"pp": [], "tg": []}
            lb_rounds = {"pp": [], "tg": []}
            walls = {"case": 0.0, "llama": 0.0, "harness": 0.0, "sweep": 0.0, "lb": 0.0}
            commit = None
            for rnd in range(args.rounds):
                order = ("edgekv", "llama-bench") if rnd % 2 == 0 else ("llama-bench", "edgekv")
                for who in order:
                    load1.append(round(os.getloadavg()[0], 2))
                    if who == "edgekv":
                        r = run_edgekv(m, n_ctx, t, args, env)
                        walls["case"] += r["case_wall_s"]
                        walls["llama"] += r["llama_s"]
                        walls["harness"] += r["harness_s"]
                        walls["sweep"] += r["sweep_wall_s"]
                        dst, dst_rounds = ek, ek_rounds
                    else:
                        r = run_llama_bench(exe, os.path.abspath(m.ref.path), n_ctx, t, args)
                        walls["lb"] += r["wall_s"]
                        commit = r["build_commit"]
                        dst, dst_rounds = lb, lb_rounds
                    for k in ("pp", "tg"):
                        dst[k] += r[k]
                        dst_rounds[k].append(r[k])
                print(f"  {n_ctx} {t} round {rnd + 1}/{args.rounds} done (load {load1[-1]})", file=sys.stderr, flush=True)
            row = {"n_ctx": n_ctx, "type": t, "depth": default_depth(n_ctx, args.p, args.n),
                   "llama_bench_commit": commit, "walls_s": walls}
            for k in ("pp", "tg"):
                row[k] = stats_row(lb[k], ek[k], lb_rounds[k], ek_rounds[k])
            rows.append(row)
            print(f"{n_ctx:>6} {t:<5} pp {row['pp']['edgekv_mean']:8.1f} vs {row['pp']['llama_bench_mean']:8.1f}"
                  f" = {row['pp']['ratio']:.3f}   tg {row['tg']['edgekv_mean']:7.1f} vs {row['tg']['llama_bench_mean']:7.1f}"
                  f" = {row['tg']['ratio']:.3f}", flush=True)
    case_wall = sum(r["walls_s"]["case"] for r in rows)
    sweep_wall = sum(r["walls_s"]["sweep"] for r in rows)
    harness = sum(r["walls_s"]["harness"] for r in rows)

    summary = {
        "pp_ratio_geomean": H.geomean([r["pp"]["ratio"] for r in rows]),
        "tg_ratio_geomean": H.geomean([r["tg"]["ratio"] for r in rows]),
        "pp_round_median_geomean": H.geomean([r["pp"]["round_ratio_median"] for r in rows]),
        "tg_round_median_geomean": H.geomean([r["tg"]["round_ratio_median"] for r in rows]),
        "pp_ratio_min": min(r["pp"]["ratio"] for r in rows),
        "tg_ratio_min": min(r["tg"]["ratio"] for r in rows),
        "harness_share_of_case_wall": harness / case_wall,
        "harness_share_of_sweep_wall": (harness + sweep_wall - case_wall) / sweep_wall,
    }
    keyed = [{"model": args.model, "p": args.p, "n": args.n, "t": args.t, **r} for r in rows]
    H.finish_run(NAME, args, rows, load1, summary, markdown, keyed, KEY)


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' bench-vs-llama-bench table: edgekv's tokens/s over llama-bench's, per machine class, context,
    cache type and test, with the per-round ratios' median."""
    out = []
    for m, rs in by_machine.items():
        for r in rs:
            for k in ("pp", "tg"):
                x = r[k]
                ci = f" [{x['ratio_ci95'][0]:.3f}, {x['ratio_ci95'][1]:.3f}]" if x.get("ratio_ci95") else ""
                out.append([f"`{m}`", r["model"], r["n_ctx"], r["depth"], r["type"], f"{k}{r['p' if k == 'pp' else 'n']}",
                            f"{x['edgekv_mean']:.1f}", f"{x['llama_bench_mean']:.1f}", f"{x['ratio']:.3f}{ci}",
                            f"{statistics.median(x['round_ratios']):.3f}" if x.get("round_ratios") else "–",
                            H.identity_note([r])])
    return H.md_table(["machine class", "model", "ctx", "depth", "K/V", "test", "edgekv t/s", "llama-bench t/s",
                       "ratio of means [95 % CI]", "median round ratio", "code"], out, "llrrllrrrrl")


if __name__ == "__main__":
    main()
