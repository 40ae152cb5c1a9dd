#!/usr/bin/env python3
"""edgekv quality against llama-perplexity from the same llama.cpp source: agreement and speed.

For each context size, on the same model, corpus file, context, chunk count, batch and threads:

1. ``llama-perplexity`` plain runs, one per cache type: PPL (``Final estimate``) and its decode speed;
2. ``llama-perplexity --kl-divergence-base FILE`` with f16/f16, then ``--kl-divergence`` per cache
   type: llama's KLD statistics (its base is stored as 16-bit scaled log-probabilities);
3. ``edgekv.quality.run.measure`` (timed): the same configurations side by side in one process;
4. ``edgekv.quality.run.measure(..., emulate_llama=True)``: the same pass, also reproducing llama's
   16-bit base arithmetic on the same logits.

Checks: PPL within 0.01 % of llama-perplexity's; the emulated statistics equal llama's to its
printed precision (same logits, same arithmetic); edgekv's exact statistics differ from llama's by
no more than the 16-bit base can move them, measured per token as ``d_t`` = KLD(16-bit base) −
KLD(exact): mean KLD within ``mean|d_t|``, every order statistic (median, percentiles, max) within
``max|d_t|`` (each value moves by at most that much, so each order statistic does too), plus
llama's print rounding.

llama-perplexity comes from ``--llama-perplexity PATH`` or ``$EDGEKV_LLAMA_PERPLEXITY``, a build
directory (``--llama-build DIR`` or ``$EDGEKV_LLAMA_BUILD``), or is built once from the llama.cpp tree
vendored in the installed llama-cpp-python's sdist (``tools/llama_tools.py``).

    python -m bench.quality_vs_perplexity -c 512,4096 --chunks 32,4 -t 2

One row per (context, cache type) goes to bench/results/quality_vs_perplexity/<machine-class>.jsonl
(bench/harness.py), from which tools/render_tables.py renders the docs' ``quality-vs-perplexity`` table; ``--out``
also keeps the whole run (with llama-perplexity's figures and timings) as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness as H
from edgekv.calibration.preflight import preflight
from edgekv.core.wire import to_wire
from edgekv.quality.run import measure, plan
from edgekv.records.schema import encode_block
from edgekv.sources.corpus import resolve_corpus
from edgekv.sources.resolve import resolve_model
from tools.llama_tools import llama_cpp_python_version, tool

NAME = "quality_vs_perplexity"
KEY = ("model", "corpus", "n_ctx", "chunks", "type", "threads")

PPL_TOL = 1e-4          # 0.01 %


# -- llama-perplexity: find or build ------------------------------------------------------------------

def find_llama_perplexity(args: argparse.Namespace) -> Path:
    exe = args.llama_perplexity or os.environ.get("EDGEKV_LLAMA_PERPLEXITY")
    if exe:
        p = Path(exe)
        if not p.is_file():
            sys.exit(f"quality_vs_perplexity: {p}: no such file")
        return p
    build = args.llama_build or os.environ.get("EDGEKV_LLAMA_BUILD")
    if build:
        for cand in (Path(build) / "bin" / "llama-perplexity", Path(build) / "llama-perplexity"):
            if cand.is_file():
                return cand
        sys.exit(f"quality_vs_perplexity: no llama-perplexity under {build} (looked in bin/)")
    return tool("llama-perplexity")          # built once from the vendored tree under bench/.build/


# -- running and parsing llama-perplexity ---------------------------------------------------------------

def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_llama(exe: Path, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{exe.parent}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    cpu0, t0 = _cpu_children(), time.perf_counter()
    if not preflight().repack:       # llama.cpp's AMX kernels crash on this CPU: the setting edgekv uses (issue 25)
        argv = [*argv, "--no-repack"]
    p = subprocess.run([str(exe), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    wall, cpu = time.perf_counter() - t0, _cpu_children() - cpu0
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        sys.exit(f"llama-perplexity failed ({p.returncode}):\n{out[-3000:]}")
    return {"argv": [exe.name, *argv], "wall_s": wall, "cpu_s": cpu, "log": out}


def _f(pattern: str, text: str, group: int = 1) -> float | None:
    m = re.search(pattern, text)
    return float(m[group]) if m else None


def parse_kld(out: str) -> dict[str, float | None]:
    num = r"(-?[\d.]+(?:e[-+]\d+)?)"
    pct = 0.01
    return {
        "ppl": _f(rf"Mean PPL\(Q\) +: +{num}", out),
        "base_ppl": _f(rf"Mean PPL\(base\) +: +{num}", out),
        "ln_ppl_ratio": _f(rf"Mean ln\(PPL\(Q\)/PPL\(base\)\) +: +{num}", out),
        "ln_ppl_ratio_err": _f(rf"Mean ln\(PPL\(Q\)/PPL\(base\)\) +: +{num} ± +{num}", out, 2),
        "kld_mean": _f(rf"Mean +KLD: +{num}", out),
        "kld_mean_err": _f(rf"Mean +KLD: +{num} ± +{num}", out, 2),
        "kld_max": _f(rf"Maximum KLD: +{num}", out),
        "kld_p999": _f(rf"99\.9% +KLD: +{num}", out),
        "kld_p99": _f(rf"99\.0% +KLD: +{num}", out),
        "kld_p95": _f(rf"95\.0% +KLD: +{num}", out),
        "kld_p90": _f(rf"90\.0% +KLD: +{num}", out),
        "kld_median": _f(rf"Median +KLD: +{num}", out),
        "delta_p_mean": (_f(rf"Mean +Δp: +{num}", out) or 0.0) * pct,
        "delta_p_rms": (_f(rf"RMS Δp +: +{num}", out) or 0.0) * pct,
        "same_top_rate": (_f(rf"Same top p: +{num}", out) or 0.0) * pct,
    }


# printed precision of each llama figure (absolute, in edgekv's units), half a unit of the last digit
PRINT_HALF_UNIT = {"ppl": 5e-7, "base_ppl": 5e-7, "ln_ppl_ratio": 5e-7, "kld_mean": 5e-7, "kld_max": 5e-7, "kld_p999": 5e-7,
                   "kld_p99": 5e-7, "kld_p95": 5e-7, "kld_p90": 5e-7, "kld_median": 5e-7, "delta_p_mean": 5e-6,
                   "delta_p_rms": 5e-6, "same_top_rate": 5e-6}
ORDER_STATS = ("kld_max", "kld_p999", "kld_p99", "kld_p95", "kld_p90", "kld_median")


# -- one context size ----------------------------------------------------------------------------------

def run_ctx(exe: Path, model: str, corpus, n_ctx: int, chunks: int, types: list[str], args) -> dict[str, Any]:
    common = ["-m", model, "-f", corpus.path, "-c", str(n_ctx), "--chunks", str(chunks), "-b", str(args.batch),
              "-ub", str(args.ubatch), "-t", str(args.threads), "-fa", "auto"]
    rec: dict[str, Any] = {"n_ctx": n_ctx, "chunks": chunks, "types": types}
    say = lambda s: print(f"[-c {n_ctx}] {s}", file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        base_file = str(Path(tmp) / "base.kld")
        say("llama-perplexity --kl-divergence-base (f16/f16)")
        base = run_llama(exe, [*common, "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", base_file])
        rec["llama_base"] = {k: v for k, v in base.items() if k != "log"}
        rec["llama_base"]["ppl"] = _f(r"Final estimate: PPL = ([\d.]+)", base["log"])
        rec["llama_base"]["base_file_bytes"] = os.path.getsize(base_file)
        rec["llama_kld"] = {}
        for t in types:
            say(f"llama-perplexity --kl-divergence -ctk {t} -ctv {t}")
            r = run_llama(exe, [*common, "-ctk", t, "-ctv", t, "--kl-divergence", "--kl-divergence-base", base_file])
            rec["llama_kld"][t] = {**{k: v for k, v in r.items() if k != "log"}, **parse_kld(r["log"])}
    rec["llama_plain"] = {}
    if not args.no_plain:
        for t in types:
            say(f"llama-perplexity -ctk {t} -ctv {t}")
            r = run_llama(exe, [*common, "-ctk", t, "-ctv", t])
            rec["llama_plain"][t] = {**{k: v for k, v in r.items() if k != "log"},
                                     "ppl": _f(r"Final estimate: PPL = ([\d.]+)", r["log"]),
                                     "ppl_err": _f(r"Final estimate: PPL = [\d.]+ \+/- ([\d.]+)", r["log"])}
    kw = dict(n_batch=args.batch, n_ubatch=args.ubatch, n_threads=args.threads, flash_attn="auto")
    say("edgekv quality (timed)")
    cpu0, t0 = _cpu_children(), time.perf_counter()
    rows = [encode_block(r) for r in measure(model, types, corpus, n_ctx, chunks, **kw)]
    rec["edgekv"] = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_children() - cpu0,
                     "rows": {r["type_k"]: r for r in rows}}
    say("edgekv quality (with llama's 16-bit base emulated)")
    rows = [encode_block(r) for r in measure(model, types, corpus, n_ctx, chunks, emulate_llama=True, **kw)]
    rec["edgekv_emulated"] = {r["type_k"]: r["quality"] for r in rows}
    return rec


# -- comparison -----------------------------------------------------------------------------------------

def compare(rec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"n_ctx": rec["n_ctx"], "chunks": rec["chunks"], "types": {}}
    ok_all = True
    for t in rec["types"]:
        q = rec["edgekv"]["rows"][t]["quality"]
        em = rec["edgekv_emulated"][t]["llama_uint16"]
        ex2 = rec["edgekv_emulated"][t]
        ll = rec["llama_kld"][t]
        res: dict[str, Any] = {}
        # PPL: exact (edgekv) vs llama plain run (%.4f) and vs the KLD run's Mean PPL(Q) (%.6f)
        ppl_refs = {"kld_run": ll["ppl"]}
        if rec["llama_plain"].get(t):
            ppl_refs["plain_run"] = rec["llama_plain"][t]["ppl"]
        res["ppl"] = {"edgekv": q["ppl"], **{f"llama_{k}": v for k, v in ppl_refs.items()},
                      **{f"rel_diff_{k}": (q["ppl"] / v - 1 if v else None) for k, v in ppl_refs.items()}}
        res["ppl"]["ok"] = all(v is not None and abs(q["ppl"] / v - 1) <= PPL_TOL for v in ppl_refs.values())
        # deterministic: the timed pass and the emulating pass give the same exact figures
        res["repeatable"] = all(q[k] == ex2[k] for k in ("ppl", "kld_mean", "kld_max", "same_top_rate"))
        # emulated vs llama: same arithmetic; differences only from printing and float32 libm details
        emu = {}
        for k, half in PRINT_HALF_UNIT.items():
            if ll.get(k) is None:
                continue
            tol = half + 2e-6 * abs(ll[k]) + 1e-7
            d = em[k] - ll[k]
            emu[k] = {"edgekv_emulated": em[k], "llama": ll[k], "diff": d, "tol": tol, "ok": abs(d) <= tol}
        res["emulated_vs_llama"] = emu
        # exact vs llama: within what the 16-bit base can move each statistic
        mean_d, max_d = em["kld_abs_diff_mean"], em["kld_abs_diff_max"]
        exact = {}
        for k in ("kld_mean", *ORDER_STATS):
            if ll.get(k) is None:
                continue
            bound = (mean_d if k == "kld_mean" else max_d) + PRINT_HALF_UNIT[k] + 2e-6 * abs(ll[k])
            d = q[k] - ll[k]
            exact[k] = {"edgekv": q[k], "llama": ll[k], "diff": d, "bound": bound, "ok": abs(d) <= bound}
        res["exact_vs_llama"] = exact
        res["kld_abs_diff_mean"], res["kld_abs_diff_max"] = mean_d, max_d
        res["ok"] = res["ppl"]["ok"] and res["repeatable"] and all(v["ok"] for v in emu.values()) and \
            all(v["ok"] for v in exact.values())
        ok_all &= res["ok"]
        out["types"][t] = res
    # speed: the same tokens through the same decode, end to end
    n_types = len(rec["types"])
    n_eval = rec["chunks"] * rec["n_ctx"]
    e = rec["edgekv"]
    e_tokens = (n_types + 1) * n_eval                      # baseline + every type
    kld_flow = [rec["llama_base"], *rec["llama_kld"].values()]
    speed = {
        "edgekv_wall_s": e["wall_s"], "edgekv_cpu_s": e["cpu_s"], "edgekv_tokens": e_tokens,
        "edgekv_tokens_per_s": e_tokens / e["wall_s"],
        "llama_kld_flow_wall_s": sum(r["wall_s"] for r in kld_flow), "llama_kld_flow_cpu_s": sum(r["cpu_s"] for r in kld_flow),
        "llama_kld_flow_tokens": (n_types + 1) * n_eval,
    }
    speed["llama_kld_flow_tokens_per_s"] = speed["llama_kld_flow_tokens"] / speed["llama_kld_flow_wall_s"]
    speed["ratio_vs_kld_flow_wall"] = speed["edgekv_tokens_per_s"] / speed["llama_kld_flow_tokens_per_s"]
    speed["ratio_vs_kld_flow_cpu"] = speed["llama_kld_flow_cpu_s"] / e["cpu_s"]
    if rec["llama_plain"]:
        plain = list(rec["llama_plain"].values())
        speed["llama_plain_wall_s"] = sum(r["wall_s"] for r in plain)
        speed["llama_plain_cpu_s"] = sum(r["cpu_s"] for r in plain)
        speed["llama_plain_tokens"] = n_types * n_eval
        speed["llama_plain_tokens_per_s"] = speed["llama_plain_tokens"] / speed["llama_plain_wall_s"]
        speed["ratio_vs_plain_wall"] = speed["edgekv_tokens_per_s"] / speed["llama_plain_tokens_per_s"]
        speed["ratio_vs_plain_cpu"] = (speed["llama_plain_cpu_s"] / speed["llama_plain_tokens"]) / (e["cpu_s"] / e_tokens)
    out["speed"] = speed
    out["ok"] = ok_all
    return out


# -- report ---------------------------------------------------------------------------------------------

def markdown(report: dict[str, Any]) -> str:
    m = report["meta"]
    lines = [
        "## Quality: `edgekv quality` against `llama-perplexity`",
        "",
        "Command:",
        "",
        f"    {m['command']}",
        "",
        f"- Model: {m['model_name']} (`{Path(m['model']).name}`); corpus `{m['corpus']['name']}` "
        f"({m['corpus']['n_bytes']:,} bytes, sha256 `{m['corpus']['sha256'][:16]}…`); "
        f"-b {m['batch']} -ub {m['ubatch']} -t {m['threads']} -fa auto; baseline f16/f16.",
        f"- llama-perplexity: `{m['llama_perplexity_version']}`, built from the llama.cpp tree vendored by "
        f"llama-cpp-python {m['llama_cpp_python']} (the library edgekv drives).",
        f"- Machine: {m['machine']}. **{m['machine_note']}**",
        "",
    ]
    for c in report["contexts"]:
        s = c["speed"]
        lines += [f"### -c {c['n_ctx']}, {c['chunks']} chunks", "",
                  "| K/V | PPL edgekv | PPL llama (plain run) | rel. diff | KLD mean edgekv | KLD mean llama | "
                  "bound | 99.9% edgekv | 99.9% llama | max edgekv | max llama | bound | same top edgekv | llama | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for t, r in c["types"].items():
            p = r["ppl"]
            ex = r["exact_vs_llama"]
            llp = p.get("llama_plain_run", p["llama_kld_run"])
            rel = p.get("rel_diff_plain_run", p["rel_diff_kld_run"])
            st = report["raw"][c["n_ctx"]]["edgekv"]["rows"][t]["quality"]["same_top_rate"]
            st_l = report["raw"][c["n_ctx"]]["llama_kld"][t]["same_top_rate"]
            lines.append(
                f"| {t} | {p['edgekv']:.4f} | {llp:.4f} | {rel:+.1e} | {ex['kld_mean']['edgekv']:.6f} | "
                f"{ex['kld_mean']['llama']:.6f} | ±{ex['kld_mean']['bound']:.1e} | {ex['kld_p999']['edgekv']:.6f} | "
                f"{ex['kld_p999']['llama']:.6f} | {ex['kld_max']['edgekv']:.6f} | {ex['kld_max']['llama']:.6f} | "
                f"±{ex['kld_max']['bound']:.1e} | {100 * st:.2f} % | {100 * st_l:.2f} % | {'✓' if r['ok'] else '✗'} |")
        worst_emu = max(abs(v["diff"]) / v["tol"] for r in c["types"].values() for v in r["emulated_vs_llama"].values())
        lines += ["",
                  f"llama's 16-bit arithmetic reproduced on edgekv's logits matches every llama figure to within "
                  f"{worst_emu:.2f}× its tolerance (llama's print rounding + 2e-6 relative).",
                  "",
                  f"Speed ({c['chunks'] * c['n_ctx']:,} tokens per configuration, {len(c['types'])} types + baseline): "
                  f"edgekv {s['edgekv_tokens_per_s']:.0f} tok/s end to end ({s['edgekv_wall_s']:.0f} s); "
                  f"llama-perplexity KLD workflow (base file + {len(c['types'])} KLD runs) "
                  f"{s['llama_kld_flow_tokens_per_s']:.0f} tok/s → ratio **{s['ratio_vs_kld_flow_wall']:.2f}** "
                  f"(CPU time ratio {s['ratio_vs_kld_flow_cpu']:.2f})"
                  + (f"; plain PPL runs {s['llama_plain_tokens_per_s']:.0f} tok/s → ratio **{s['ratio_vs_plain_wall']:.2f}** "
                     f"(CPU time ratio {s['ratio_vs_plain_cpu']:.2f})"
                     if "ratio_vs_plain_wall" in s else "") + ".",
                  ""]
        raw = report["raw"][c["n_ctx"]]
        pass_rss = next((r["pass"]["peak_rss_bytes"] for r in raw["edgekv"]["rows"].values()
                         if r.get("pass") and r["pass"].get("peak_rss_bytes")), None)
        base_bytes = raw["llama_base"].get("base_file_bytes")
        if pass_rss and base_bytes:
            lines[-1:] = [f"Memory: edgekv's pass (one process: the model, the f16 context and {len(c['types'])} candidate "
                          f"contexts, one batch of logits each) peaked at {pass_rss / 2**20:.0f} MiB RSS and writes no "
                          f"file; llama-perplexity's KLD workflow wrote a {base_bytes / 2**20:.0f} MiB base-logits file "
                          f"for these {c['chunks'] * c['n_ctx']:,} tokens, which grows with the corpus "
                          f"({base_bytes / (c['chunks'] * (c['n_ctx'] - 1 - c['n_ctx'] // 2)):,.0f} bytes per scored "
                          "token here).", ""]
    lines += [
        "How to read it:",
        "- PPL must agree within 0.01 %: the logits are the same (same library, same batches), so the",
        "  differences are float rounding.",
        "- KLD: llama-perplexity stores the f16 baseline as uint16 log-probabilities with a step of",
        "  (max − max(min, max−16))/65535 ≤ 16/65535 ≈ 2.4e-4 nats and skips tokens whose base",
        "  log-probability is ≤ −16; edgekv keeps the baseline's float32 logits and sums the whole",
        "  vocabulary in float64. Per token that moves the KLD by d_t, with |d_t| ≤ (s_t/2)·Σ p·|ln(p/q)+1|",
        "  plus the skipped tail. The script measures d_t exactly by replaying llama's 16-bit arithmetic on",
        "  the same logits (`emulate_llama=True`): the mean KLD can move by at most mean|d_t|, and the median,",
        "  percentiles and maximum by at most max|d_t| (\"bound\" columns, plus llama's print rounding).",
        "- The replayed arithmetic matches llama's printed figures to their last digit, which shows the",
        "  remaining difference is the 16-bit base and nothing else.",
        "- Speed: both sides evaluate the baseline and every type on the same tokens. The KLD workflow",
        "  is what llama-perplexity needs for these figures; plain PPL runs (no base file, no KLD) are the",
        "  strictest comparison. Each llama run also loads the model and tokenizes again.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default=None, help="pydoc (default), wikitext-2 or a text file")
    ap.add_argument("-c", "--ctx-size", default="512,4096")
    ap.add_argument("--chunks", default="32,4", help="chunks per context size (one value, or one per -c)")
    ap.add_argument("-ctk", "--cache-types", default="f16,q8_0,q5_0,q4_0")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-b", "--batch", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch", type=int, default=512)
    ap.add_argument("--llama-perplexity", help="path of a llama-perplexity binary (else $EDGEKV_LLAMA_PERPLEXITY)")
    ap.add_argument("--llama-build", help="a llama.cpp build directory (else $EDGEKV_LLAMA_BUILD)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain llama-perplexity PPL runs")
    ap.add_argument("--machine-note", default="", help="e.g. 'busy shared machine: indicative timings'")
    ap.add_argument("--out", help="also write the whole run as one JSON document here")
    H.add_common(ap)
    args = ap.parse_args()

    ctxs = [int(x) for x in args.ctx_size.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    if len(chunks) == 1:
        chunks = chunks * len(ctxs)
    if len(chunks) != len(ctxs):
        sys.exit("--chunks: give one value or one per -c")
    types = [t.strip() for t in args.cache_types.split(",") if t.strip()]
    exe = find_llama_perplexity(args)
    env = dict(os.environ, LD_LIBRARY_PATH=str(exe.parent))
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env)
    ver_line = next((x for x in (version.stdout + version.stderr).splitlines() if x.startswith("version")), "unknown")
    model = resolve_model(args.model)
    corpus = resolve_corpus(args.corpus)

    raw: dict[int, Any] = {}
    contexts = []
    for n, k in zip(ctxs, chunks):
        raw[n] = run_ctx(exe, model.path, corpus, n, k, types, args)
        contexts.append(compare(raw[n]))
        print(json.dumps({"n_ctx": n, "ok": contexts[-1]["ok"], "speed": contexts[-1]["speed"]}, indent=1), file=sys.stderr)
    import psutil

    meta = {
        "command": H.command_line(),
        "model": model.path, "model_name": model.name, "corpus": to_wire(corpus),
        "batch": args.batch, "ubatch": args.ubatch, "threads": args.threads,
        "llama_perplexity": str(exe), "llama_perplexity_version": ver_line,
        "llama_cpp_python": llama_cpp_python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
                   f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.system()} {platform.release()}, "
                   f"load average {os.getloadavg()[0]:.1f} at the end",
        "machine_note": args.machine_note or "timings from one run",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "plans": {n: plan(10**9, n, args.batch, k) for n, k in zip(ctxs, chunks)},
    }
    report = {"meta": meta, "contexts": contexts, "raw": raw, "ok": all(c["ok"] for c in contexts)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(markdown(report))
    run = {"command": meta["command"], "llama_cpp_python": meta["llama_cpp_python"],
           "settings": {k: meta[k] for k in ("batch", "ubatch", "threads", "llama_perplexity_version")}}
    path = H.save_run(NAME, args.machine or H.this_machine(), run, result_rows(report), KEY, args.results)
    print(f"agreement: {'OK' if report['ok'] else 'FAILED'}; rows in {path}", file=sys.stderr)
    return 0 if report["ok"] else 1


def result_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (context, cache type) of a run's report: the agreement figures and the context's speed."""
    m, out = report["meta"], []
    for c in report["contexts"]:
        raw = report["raw"][c["n_ctx"]] if c["n_ctx"] in report["raw"] else report["raw"][str(c["n_ctx"])]
        for t, r in c["types"].items():
            emu = max((abs(v["diff"]) / v["tol"] for v in r["emulated_vs_llama"].values()), default=None)
            out.append({"model": m["model_name"], "corpus": m["corpus"]["name"], "n_ctx": c["n_ctx"],
                        "chunks": c["chunks"], "type": t, "threads": m["threads"], "ok": r["ok"], "ppl": r["ppl"],
                        "exact_vs_llama": r["exact_vs_llama"], "emulated_worst_of_tol": emu,
                        "repeatable": r["repeatable"],
                        "same_top": raw["edgekv"]["rows"][t]["quality"]["same_top_rate"],
                        "same_top_llama": raw["llama_kld"][t]["same_top_rate"], "speed": c["speed"]})
    return out


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' quality-vs-perplexity table: edgekv's PPL and KLD against llama-perplexity's, per machine class,
    context and cache type, with the bound the 16-bit base allows."""
    out = []
    for mc, rs in by_machine.items():
        for r in rs:
            p, ex = r["ppl"], r["exact_vs_llama"]
            llp = p.get("llama_plain_run", p["llama_kld_run"])
            rel = p.get("rel_diff_plain_run", p["rel_diff_kld_run"])
            out.append([f"`{mc}`", r["model"], r["n_ctx"], r["chunks"], r["type"], f"{p['edgekv']:.4f}", f"{llp:.4f}",
                        f"{rel:+.1e}", f"{ex['kld_mean']['edgekv']:.6f}", f"{ex['kld_mean']['llama']:.6f}",
                        f"±{ex['kld_mean']['bound']:.1e}", f"{ex['kld_max']['edgekv']:.6f}", f"{ex['kld_max']['llama']:.6f}",
                        f"±{ex['kld_max']['bound']:.1e}", "✓" if r["ok"] else "✗", H.identity_note([r])])
    return H.md_table(["machine class", "model", "ctx", "chunks", "K/V", "PPL edgekv", "PPL llama", "rel. diff",
                       "KLD mean edgekv", "KLD mean llama", "bound", "KLD max edgekv", "KLD max llama", "bound", "ok",
                       "code"], out, "llrrlrrrrrrrrrcl")


def render_summary(by_machine: dict[str, list[dict]], n_ctx: int = 4096) -> str:
    """README's quality table: at ``n_ctx``, each cache type's PPL beside llama-perplexity's, its change against the
    f16 cache, the mean KLD against f16 and how often the top token stays the same."""
    out = []
    for mc, rs in by_machine.items():
        base = {(r["model"], r["chunks"]): r["ppl"]["edgekv"] for r in rs if r["n_ctx"] == n_ctx and r["type"] == "f16"}
        for r in (r for r in rs if r["n_ctx"] == n_ctx):
            p, f16 = r["ppl"], base.get((r["model"], r["chunks"]))
            out.append([f"`{mc}`", r["model"], r["n_ctx"], r["type"], f"{p['edgekv']:.4f}",
                        f"{p.get('llama_plain_run', p['llama_kld_run']):.4f}",
                        f"{100 * (p['edgekv'] / f16 - 1):+.2f} %" if f16 else "",
                        f"{r['exact_vs_llama']['kld_mean']['edgekv']:.6f}", f"{100 * r['same_top']:.2f} %"])
    return H.md_table(["machine class", "model", "n_ctx", "K/V", "PPL edgekv", "PPL llama-perplexity", "Δ PPL vs f16",
                       "mean KLD vs f16", "same top token"], out, "llrlrrrrr")


if __name__ == "__main__":
    sys.exit(main())
