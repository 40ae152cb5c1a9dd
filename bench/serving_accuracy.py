#!/usr/bin/env python3
"""The user's llama-server against edgekv's prediction and against the same workload in-process.

Targets (issue 28, point 3), per model and -np N (default 1 and 4), CPU:

* memory: the llama-server process's measured peak RSS within ±3 % and ±8 MiB of the whole-process prediction
  made before it started (edgekv's process model for ``-np N`` over that binary's own runtime baseline);
* speed: the aggregate decode tokens/s of N concurrent requests through the server within 10 % of ``edgekv bench
  -npl N`` in-process on the same settings (the HTTP layer, the server's sampling and its scheduling are what
  differ).

Each (model, N) runs ``--rounds`` rounds alternating which side goes first: one ``edgekv bench --llama-server``
configuration (a fresh server) and one ``edgekv bench -npl N`` configuration (a fresh child process), both through
``run_sweep``, so both are exactly what a user gets.  The llama-server is the one built from the llama.cpp tree
vendored in llama-cpp-python (tools/llama_tools.py), unless ``--llama-server`` names another.

    python -m bench.serving_accuracy

One row per (model, N) goes to bench/results/serving_accuracy/<machine-class>.jsonl (bench/harness.py), from which
tools/render_tables.py renders the docs' ``serving`` table; ``--out`` also keeps the whole run as one JSON document.

Run it on a quiet machine: the speed comparison is noise-bound on 2 shared cores.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench import harness as H
from edgekv.prediction.api import load_model
from edgekv.records.schema import encode
from edgekv.sweep.run import ENGINE_SERVER, run_sweep
from edgekv.sweep.spec import sweep_spec
from tools.llama_tools import tool

NAME = "serving_accuracy"
KEY = ("model", "np", "c", "p", "n", "t", "ctk")
MIB = H.MIB

def one(m, args, npl: int, server: str | None, env) -> dict:
    spec = sweep_spec(model=m, contexts=[args.c], pairs=[(args.ctk, args.ctk)], n_prompt=args.p, n_gen=args.n,
                      repetitions=args.r, n_threads=args.t, n_parallel=[npl], predict_speed=False,
                      engine=ENGINE_SERVER if server else "llama-cpp-python", llama_server=server)
    with tempfile.TemporaryDirectory() as d:
        rec = encode(run_sweep(spec, output=Path(d) / "r.jsonl", env=env).records[-1])
    if rec["status"] != "ok":
        raise SystemExit(f"{'llama-server' if server else 'edgekv -npl'} failed: {rec['reason']}")
    sv = rec.get("serving") or {}
    return {"tg": rec["speed"]["tg"]["samples_ts"], "peak": rec["memory"]["peak_rss_bytes"],
            "predicted": (rec["prediction"].get("process") or {}).get("peak_rss_bytes"),
            "ttft_p50_s": sv.get("ttft_p50_s"), "ttft_p95_s": sv.get("ttft_p95_s"),
            "kv_match": (rec.get("differences") or {}).get("llama_kv_matches_formula")}


def measure(args) -> tuple[list[dict], list[float]]:
    from edgekv.machine.environment import collect

    server, env, rows, load1 = args.llama_server or str(tool("llama-server")), collect(), [], []
    for name in args.models.split(","):
        m = load_model(name)
        for npl in (int(x) for x in args.np.split(",")):
            srv, inproc = [], []
            for rnd in range(args.rounds):
                for who in (("server", "npl") if rnd % 2 == 0 else ("npl", "server")):
                    load1.append(round(os.getloadavg()[0], 2))
                    (srv if who == "server" else inproc).append(one(m, args, npl, server if who == "server" else None,
                                                                    env))
            s_tg = [x for r in srv for x in r["tg"]]
            i_tg = [x for r in inproc for x in r["tg"]]
            peak = max(r["peak"] for r in srv)
            pred = srv[-1]["predicted"]
            row = {"model": m.shape.name or name, "np": npl, "server_peak": peak, "server_predicted": pred,
                   "residual_mib": (peak - pred) / MIB if pred else None,
                   "residual_pct": 100 * (peak - pred) / pred if pred else None,
                   "server_tg": sum(s_tg) / len(s_tg), "inproc_tg": sum(i_tg) / len(i_tg),
                   "inproc_peak": max(r["peak"] for r in inproc), "inproc_predicted": inproc[-1]["predicted"],
                   "ttft_p50_s": srv[-1]["ttft_p50_s"], "ttft_p95_s": srv[-1]["ttft_p95_s"],
                   "kv_match": all(r["kv_match"] for r in srv + inproc)}
            row["tg_ratio"] = row["server_tg"] / row["inproc_tg"]
            rows.append(row)
            print(f"{row['model'][:24]:<24} np {npl}: server peak {peak / MIB:.1f} MiB (predicted {pred / MIB:.1f}, "
                  f"{row['residual_pct']:+.2f} %); decode {row['server_tg']:.1f} vs in-process {row['inproc_tg']:.1f} "
                  f"= {row['tg_ratio']:.3f}", flush=True)
    return rows, load1


def markdown(out: dict) -> str:
    st = out["settings"]
    lines = ["## Serving: the user's llama-server against the prediction and against `-npl` in-process "
             "(issue 28, targets ±3 % and ±8 MiB; decode within 10 %)", "",
             "Command:", "", f"    {out['command']}", "",
             f"- `-c {st['c']} -p {st['p']} -n {st['n']} -r {st['r']} -t {st['t']} -ctk {st['ctk']} -ctv {st['ctk']}`, "
             "-fa auto, -b 2048 -ub 512, not unified. llama-server: `edgekv bench --llama-server` (a fresh server "
             "with -np N, N concurrent streamed requests per repetition); in-process: `edgekv bench -npl N`.",
             f"- llama-server built from the llama.cpp tree vendored in llama-cpp-python {out['llama_cpp_python']} "
             "(no web UI). Machine: "
             f"{out['machine']['cpu']}, {out['machine']['cores_logical']} logical CPUs; 1-minute load average before each "
             f"run: {min(out['load1'])}–{max(out['load1'])}; {st['rounds']} rounds alternating which side goes first.",
             "", "| model | -np N | server peak RSS MiB | predicted MiB | residual | in-process peak (predicted) MiB | "
             "server decode t/s, all | in-process decode t/s, all | ratio | server TTFT p50 / p95 s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['model']} | {r['np']} | {r['server_peak'] / MIB:.1f} | {r['server_predicted'] / MIB:.1f} | "
                     f"{r['residual_mib']:+.1f} MiB ({r['residual_pct']:+.2f} %) | {r['inproc_peak'] / MIB:.1f} "
                     f"({r['inproc_predicted'] / MIB:.1f}) | {r['server_tg']:.1f} | {r['inproc_tg']:.1f} | "
                     f"{r['tg_ratio']:.3f} | {r['ttft_p50_s']:.3f} / {r['ttft_p95_s']:.3f} |")
    sm = out["summary"]
    lines += ["", f"Largest memory residual: **{sm['worst_residual_pct']:+.2f} %** ({sm['worst_residual_mib']:+.1f} MiB); "
              f"decode ratio server / in-process: geometric mean **{sm['tg_ratio_geomean']:.3f}**, range "
              f"{sm['tg_ratio_min']:.3f}–{sm['tg_ratio_max']:.3f}. KV bytes equal llama.cpp's in every run: "
              f"{sm['kv_all_match']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--np", default="1,4")
    ap.add_argument("-ctk", default="f16")
    ap.add_argument("-c", type=int, default=4096)
    ap.add_argument("--llama-server", help="a llama-server binary (default: built from the vendored tree)")
    H.add_timing(ap, p=128, n=64, r=3)
    H.add_common(ap)
    args = ap.parse_args()
    rows, load1 = measure(args)
    worst = max(rows, key=lambda r: abs(r["residual_pct"] or 0))
    ratios = [r["tg_ratio"] for r in rows]
    summary = {"worst_residual_pct": worst["residual_pct"], "worst_residual_mib": worst["residual_mib"],
               "tg_ratio_geomean": H.geomean(ratios),
               "tg_ratio_min": min(ratios), "tg_ratio_max": max(ratios), "kv_all_match": all(r["kv_match"] for r in rows)}
    keyed = [{**r, "c": args.c, "p": args.p, "n": args.n, "t": args.t, "ctk": args.ctk} for r in rows]
    H.finish_run(NAME, args, rows, load1, summary, markdown, keyed, KEY)


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' serving table: llama-server's measured peak RSS against the prediction, and its decode against
    ``edgekv bench -npl`` in-process, per machine class, model, threads and -np."""
    out = []
    for m, rs in by_machine.items():
        for r in rs:
            out.append([f"`{m}`", r["model"], r["t"], r["np"], f"{r['server_peak'] / MIB:.1f}",
                        f"{r['server_predicted'] / MIB:.1f}", f"{r['residual_mib']:+.1f} MiB ({r['residual_pct']:+.2f} %)",
                        f"{r['server_tg']:.1f}", f"{r['inproc_tg']:.1f}", f"{r['tg_ratio']:.3f}",
                        f"{r['ttft_p50_s']:.3f} / {r['ttft_p95_s']:.3f}", H.identity_note([r])])
    return H.md_table(["machine class", "model", "-t", "-np", "server peak RSS MiB", "predicted MiB", "residual",
                       "server decode t/s", "in-process decode t/s", "ratio", "TTFT p50 / p95 s", "code"], out,
                      "llrrrrrrrrrl")


if __name__ == "__main__":
    main()
