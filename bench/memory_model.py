"""Accuracy of edgekv's whole-process memory model (edgekv/core/memmodel.py) against measured peak RSS.

Runs ``edgekv bench`` (one fresh process per configuration, memory sampled every 5 ms plus the
kernel's own maximum) on both real models -- SmolLM2-135M and Gemma 3 270M -- over f16/q8_0/q5_0/q4_0
at three contexts, and then variants at one context: ``-ub 256``, ``-t 1``, ``--no-mmap`` (llama.cpp's
``-lm none``) and ``--llama-bench`` (llama.cpp's own llama-bench built from the vendored tree; its
baseline is that binary's own).  Every
record carries the prediction made *before* the run (``prediction.process``, workload ``bench``) and
the residual (measured - predicted).  The raw records go to bench/.build/memory_model/<machine-class>/<commit>/ (ignored by
git); one row a configuration goes to bench/results/memory_model/<machine-class>.jsonl (bench/harness.py), from which
tools/render_tables.py renders the docs' ``memory-model`` table.

Target (issue 15): |measured - predicted| <= 3 % and <= 8 MiB on every configuration.

    python -m bench.memory_model               # measure (one edgekv bench per model and variant), write the rows
    python -m bench.memory_model --table-only  # no measuring: the rows from the records in --out
    python -m bench.memory_model --table-only --out DIR   # rows from records made elsewhere (a lent GPU machine)

Peak RSS does not depend on the timing, so the timed part is kept short (-p 512 -n 16 -r 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench import harness as H

ROOT = H.ROOT
NAME = "memory_model"
OUT = H.BUILD / NAME
KEY = ("model", "variant", "n_ctx", "type", "ub", "t", "mmap", "ngl")
MIB = H.MIB
TYPES = "f16,q8_0,q5_0,q4_0"
MODELS = {"smollm2-135m": "1024,2048,4096", "gemma3-270m": "1024,2048,4096"}
COMMON = ["-p", "512", "-n", "16", "-r", "1", "--no-speed-model"]   # bytes only: no speed calibration per variant
VARIANTS = {
    "base": [],
    "ub256": ["-ub", "256"],
    "t1": ["-t", "1"],
    "nommap": ["--no-mmap"],
    "llamabench": ["--llama-bench"],      # the path of llama-bench built from the vendored tree is appended
    "large": [],                          # the trained context of SmolLM2 (8192), and Gemma at the same size
    "repack0": ["--repack", "0"],         # no extra buffer types (llama.cpp's -nr): Gemma's Q4_K matrices stay mapped
    "faoff": ["-fa", "off"],              # attention over the whole padded view, its own compute buffer
}
# the variants as the tables name them (GPU runs: -ngl all / -ngl N, read from records made on a lent machine)
SETTINGS = {"base": "defaults", "ub256": "-ub 256", "t1": "-t 1", "nommap": "--no-mmap (-lm none)",
            "llamabench": "--llama-bench", "large": "defaults", "repack0": "--repack 0", "faoff": "-fa off",
            "nglall": "-ngl all"}
# Issue 27 point 6: zero-weight models (sparse files, edgekv.sources.tinymodel.write_llama) of the two shapes the issue
# names: a llama with Q4_0 matrices (re-laid by CPU_REPACK on AVX2) and a Q8_0 token embedding tied as the output,
# and a qwen2 shape with Q8_0 weights and an untied output.  (arch, n_embd, n_ff, n_vocab, n_layer, n_head, n_head_kv,
# matrix type, embedding type, tied)
SYNTHETIC = {
    "llama-q4_0-tied": ("llama", 1024, 2816, 49152, 40, 16, 8, "Q4_0", "Q8_0", True),
    "qwen2-q8_0-untied": ("qwen2", 896, 4864, 151936, 12, 14, 2, "Q8_0", "Q8_0", False),
    # issue 65 point 5 (run it with --variants ub256): 24 heads of 64 over 6 KV heads, n_ff 4096
    "llama-1536-q4_0-tied": ("llama", 1536, 4096, 49152, 20, 24, 6, "Q4_0", "Q8_0", True),
}
SYNTHETIC_CTX = "1024,2048"
LARGE_CTX = "8192"
VARIANT_CTX = "2048"
VARIANT_TYPES = "f16,q4_0"
PCT_TARGET, MIB_TARGET = 3.0, 8.0


def edgekv() -> list[str]:
    return H.edgekv_argv()


def synthetic(name: str) -> str:
    """Write (once) the zero-weight GGUF of a SYNTHETIC shape under bench/.build/ (ignored by git); its path."""
    from edgekv.sources.tinymodel import write_llama

    arch, e, f, v, n_layer, h, kv, mat, emb, tied = SYNTHETIC[name]
    path = H.BUILD / "synthetic" / f"{name}.gguf"
    if path.exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_llama(path, n_embd=e, n_ff=f, n_layer=n_layer, n_head=h, n_head_kv=kv, mat_type=mat, n_vocab=v,
                out_type=emb, embd_type=emb, name=f"edgekv synthetic {name}", arch=arch, tied=tied,
                n_ctx_train=8192, rms_eps=1e-6)
    return str(path)


def run(model: str, variant: str, outdir: Path) -> Path:
    out = outdir / f"{model}-{variant}.jsonl"
    if model in SYNTHETIC:
        ctx = SYNTHETIC_CTX
    else:
        ctx = MODELS[model] if variant == "base" else LARGE_CTX if variant == "large" else VARIANT_CTX
    types = TYPES if variant == "base" and model not in SYNTHETIC else VARIANT_TYPES
    extra = list(VARIANTS[variant])
    if variant == "llamabench":
        from tools.llama_tools import tool

        extra.append(str(tool("llama-bench")))
    target = synthetic(model) if model in SYNTHETIC else model
    argv = edgekv() + ["bench", target, "-c", ctx, "-ctk", types, *COMMON, *extra, "-o", str(out), "--json"]
    print("+", " ".join(argv[2:]), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def rows(outdir: Path, machine: str | None = None) -> list[dict]:
    out = []
    for f in sorted(outdir.glob("*.jsonl")):
        model, variant = f.stem.rsplit("-", 1)
        for line in f.read_text().splitlines():
            r = json.loads(line)
            proc = (r.get("prediction") or {}).get("process") or {}
            meas = (r.get("memory") or {}).get("peak_rss_bytes")
            pred = proc.get("peak_rss_bytes")
            if r.get("status") != "ok" or not meas or not pred:
                continue
            s = r["settings"]
            out.append({"machine": machine or H.machine_class(r.get("environment") or {}), "time_utc": r.get("time_utc"),
                        **H.record_identity(r),
                        "model": model, "variant": variant, "n_ctx": s["n_ctx"], "type": s["type_k"],
                        "ub": s["n_ubatch"], "t": s["n_threads"], "mmap": not s.get("no_mmap"),
                        "ngl": s.get("n_gpu_layers"), "gpu_peak": (r.get("memory") or {}).get("peak_gpu_bytes"),
                        "measured": meas, "predicted": pred, "diff": meas - pred, "pct": 100.0 * (meas - pred) / pred,
                        "kernel": (r.get("memory") or {}).get("kernel_maxrss_bytes")})
    return out


def table(rs: list[dict]) -> str:
    lines = ["| model | settings | n_ctx | K/V | measured peak RSS MiB | predicted MiB | measured − predicted | % "
             "| within target |",
             "|---|---|---:|---|---:|---:|---:|---:|:-:|"]
    for r in rs:
        ok = abs(r["pct"]) <= PCT_TARGET and abs(r["diff"]) <= MIB_TARGET * MIB
        sett = _settings(r["variant"])
        lines.append(f"| {r['model']} | {sett} | {r['n_ctx']} | {r['type']} | {r['measured'] / MIB:.1f} | "
                     f"{r['predicted'] / MIB:.1f} | {r['diff'] / MIB:+.1f} MiB | {r['pct']:+.2f} % | {'✓' if ok else '✗'} |")
    if rs:
        worst = max(rs, key=lambda r: abs(r["diff"]))
        worst_pct = max(rs, key=lambda r: abs(r["pct"]))
        n_ok = sum(1 for r in rs if abs(r["pct"]) <= PCT_TARGET and abs(r["diff"]) <= MIB_TARGET * MIB)
        lines += ["", f"{n_ok} of {len(rs)} configurations within ±{PCT_TARGET:g} % and ±{MIB_TARGET:g} MiB. "
                      f"Worst residual: {worst['diff'] / MIB:+.1f} MiB ({worst['model']}, {worst['variant']}, "
                      f"{worst['n_ctx']}, {worst['type']}); worst relative: {worst_pct['pct']:+.2f} %."]
    return "\n".join(lines)


def save(rs: list[dict], results: Path = H.RESULTS, machine: str | None = None) -> list[Path]:
    """The rows into bench/results/memory_model/<class>.jsonl, one file per machine class the records came from."""
    by: dict[str, list[dict]] = {}
    for r in rs:
        by.setdefault(machine or r["machine"], []).append(r)
    return [H.save(NAME, m, x, KEY, results) for m, x in sorted(by.items())]


def _settings(variant: str) -> str:
    """How the tables name a variant: ``ngl15`` (a partial offload read from a GPU run's records) is ``-ngl 15``."""
    if variant.startswith("ngl") and variant[3:].isdigit():
        return f"-ngl {variant[3:]}"
    return SETTINGS.get(variant, variant)


def _within(r: dict) -> bool:
    return abs(r["pct"]) <= PCT_TARGET and abs(r["diff"]) <= MIB_TARGET * MIB


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' memory-model table: per machine class and model, how many configurations are within the target,
    the median and the worst residual of the peak RSS."""
    out = []
    for m, rs in by_machine.items():
        for model in sorted({r["model"] for r in rs}):
            sub = [r for r in rs if r["model"] == model]
            worst = max(sub, key=lambda r: abs(r["diff"]))
            med = statistics.median(abs(r["diff"]) / MIB for r in sub)
            sett = _settings(worst["variant"])
            out.append([f"`{m}`", model, f"{sum(map(_within, sub))} of {len(sub)}", f"{med:.1f} MiB",
                        f"{worst['diff'] / MIB:+.1f} MiB ({worst['pct']:+.2f} %; {sett}, {worst['n_ctx']}, {worst['type']})",
                        H.identity_note(sub)])
    return H.md_table(["machine class", "model", f"within ±{PCT_TARGET:g} % and ±{MIB_TARGET:g} MiB",
                       "median abs. residual", "worst residual", "code"], out, "llrrll")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-only", action="store_true", help="no measuring: the rows from the records in --out")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, help="the records' folder (default bench/.build/memory_model/<class>/<commit>: "
                                             "a run resumes its own code's records only)")
    H.add_common(ap)
    a = ap.parse_args()
    out = a.out or H.records_dir(OUT, a.machine or H.this_machine())
    out.mkdir(parents=True, exist_ok=True)
    if not a.table_only:
        for model in a.models.split(","):
            for v in a.variants.split(","):
                run(model, v, out)
    rs = rows(out, a.machine)
    print(table(rs))
    for path in save(rs, a.results, a.machine):
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
