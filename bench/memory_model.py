"""Accuracy of edgekv's whole-process memory model (edgekv/core/memmodel.py) against measured peak RSS.

Runs ``edgekv bench`` (one fresh process per configuration, memory sampled every 5 ms plus the
kernel's own maximum) on both real models -- SmolLM2-135M and Gemma 3 270M -- over f16/q8_0/q5_0/q4_0
at three contexts, and then variants at one context: ``-ub 256``, ``-t 1``, ``--no-mmap`` (llama.cpp's
``-lm none``) and ``--llama-bench`` (llama.cpp's own llama-bench built from the vendored tree; its
baseline is that binary's own).  Every
record carries the prediction made *before* the run (``prediction.process``, workload ``bench``) and
the residual (measured - predicted).  The table goes into bench/README.md between the
``memmodel:begin/end`` markers; the raw records stay in bench/results/memory_model/.

Target (issue 15): |measured - predicted| <= 3 % and <= 8 MiB on every configuration.

    .venv/bin/python bench/memory_model.py               # measure what is missing (resumes), then write the table
    .venv/bin/python bench/memory_model.py --table-only  # rewrite the table from the stored records

Peak RSS does not depend on the timing, so the timed part is kept short (-p 512 -n 16 -r 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "memory_model"
README = ROOT / "bench" / "README.md"
MIB = 1024 * 1024
TYPES = "f16,q8_0,q5_0,q4_0"
MODELS = {"smollm2-135m": "1024,2048,4096", "gemma3-270m": "1024,2048,4096"}
COMMON = ["-p", "512", "-n", "16", "-r", "1"]
VARIANTS = {
    "base": [],
    "ub256": ["-ub", "256"],
    "t1": ["-t", "1"],
    "nommap": ["--no-mmap"],
    "llamabench": ["--llama-bench"],      # the path of llama-bench built from the vendored tree is appended
    "large": [],                          # the trained context of SmolLM2 (8192), and Gemma at the same size
    "repack0": ["--repack", "0"],         # no extra buffer types (llama.cpp's -nr): Gemma's Q4_K matrices stay mapped
}
# Issue 27 point 6: zero-weight models (sparse files, edgekv.edges.tinymodel.write_sparse) of the two shapes the issue
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
    return [sys.executable, "-m", "edgekv.cli"]


def synthetic(name: str) -> str:
    """Write (once) the zero-weight GGUF of a SYNTHETIC shape under bench/.build/ (ignored by git); its path."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter

    from edgekv.edges.tinymodel import write_sparse

    arch, e, f, v, n_layer, h, kv, mat, emb, tied = SYNTHETIC[name]
    path = ROOT / "bench" / ".build" / "synthetic" / f"{name}.gguf"
    if path.exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(path, arch, use_temp_file=False)
    w.add_block_count(n_layer)
    w.add_context_length(8192)
    w.add_embedding_length(e)
    w.add_feed_forward_length(f)
    w.add_head_count(h)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(e // h)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(v)
    w.add_tokenizer_model("none")
    hd, t = e // h, []
    t.append(("token_embd.weight", (e, v), Q[emb]))
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (e,), Q.F32), (b + "ffn_norm.weight", (e,), Q.F32),
              (b + "attn_q.weight", (e, e), Q[mat]), (b + "attn_k.weight", (e, kv * hd), Q[mat]),
              (b + "attn_v.weight", (e, kv * hd), Q[mat]), (b + "attn_output.weight", (e, e), Q[mat]),
              (b + "ffn_gate.weight", (e, f), Q[mat]), (b + "ffn_up.weight", (e, f), Q[mat]),
              (b + "ffn_down.weight", (f, e), Q[mat])]
        if arch == "qwen2":
            t += [(b + "attn_q.bias", (e,), Q.F32), (b + "attn_k.bias", (kv * hd,), Q.F32),
                  (b + "attn_v.bias", (kv * hd,), Q.F32)]
    t.append(("output_norm.weight", (e,), Q.F32))
    if not tied:
        t.append(("output.weight", (e, v), Q[emb]))
    write_sparse(w, path, t)
    return str(path)


def run(model: str, variant: str) -> Path:
    out = OUT / f"{model}-{variant}.jsonl"
    if model in SYNTHETIC:
        ctx = SYNTHETIC_CTX
    else:
        ctx = MODELS[model] if variant == "base" else LARGE_CTX if variant == "large" else VARIANT_CTX
    types = TYPES if variant == "base" and model not in SYNTHETIC else VARIANT_TYPES
    extra = list(VARIANTS[variant])
    if variant == "llamabench":
        sys.path.insert(0, str(ROOT / "bench"))
        from llama_tools import tool

        extra.append(str(tool("llama-bench")))
    target = synthetic(model) if model in SYNTHETIC else model
    argv = edgekv() + ["bench", target, "-c", ctx, "-ctk", types, *COMMON, *extra, "-o", str(out), "--json"]
    print("+", " ".join(argv[2:]), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def rows() -> list[dict]:
    out = []
    for f in sorted(OUT.glob("*.jsonl")):
        model, variant = f.stem.rsplit("-", 1)
        for line in f.read_text().splitlines():
            r = json.loads(line)
            proc = (r.get("prediction") or {}).get("process") or {}
            meas = (r.get("memory") or {}).get("peak_rss_bytes")
            pred = proc.get("peak_rss_bytes")
            if r.get("status") != "ok" or not meas or not pred:
                continue
            s = r["settings"]
            out.append({"model": model, "variant": variant, "n_ctx": s["n_ctx"], "type": s["type_k"],
                        "ub": s["n_ubatch"], "t": s["n_threads"], "mmap": not s.get("no_mmap"),
                        "measured": meas, "predicted": pred, "diff": meas - pred, "pct": 100.0 * (meas - pred) / pred,
                        "kernel": (r.get("memory") or {}).get("kernel_maxrss_bytes")})
    return out


def table(rs: list[dict]) -> str:
    lines = ["| model | settings | n_ctx | K/V | measured peak RSS MiB | predicted MiB | measured − predicted | % "
             "| within target |",
             "|---|---|---:|---|---:|---:|---:|---:|:-:|"]
    for r in rs:
        ok = abs(r["pct"]) <= PCT_TARGET and abs(r["diff"]) <= MIB_TARGET * MIB
        sett = {"base": "defaults", "ub256": "-ub 256", "t1": "-t 1", "nommap": "--no-mmap (-lm none)",
                "llamabench": "--llama-bench", "large": "defaults", "repack0": "--repack 0"}[r["variant"]]
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


def write_readme(text: str) -> None:
    src = README.read_text()
    begin, end = "<!-- memmodel:begin -->", "<!-- memmodel:end -->"
    block = f"{begin}\n{text}\n{end}"
    if begin in src:
        pre, rest = src.split(begin, 1)
        src = pre + block + rest.split(end, 1)[1]
    else:
        src = src.rstrip("\n") + "\n\n" + block + "\n"
    README.write_text(src)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not a.table_only:
        for model in a.models.split(","):
            for v in a.variants.split(","):
                run(model, v)
    rs = rows()
    body = table(rs)
    print(body)
    header = ("## Whole-process memory: predicted vs measured peak RSS\n\n"
              "`bench/memory_model.py` (records in `bench/results/memory_model/`): every configuration in a fresh "
              "`edgekv bench` process (`-p 512 -n 16 -r 1`, depth = context − 512), the prediction "
              "(`prediction.process`, workload `bench`) made before the run from the runtime calibration, llama.cpp's "
              "dry run at `n_outputs_max` = 1 and the formula. Machine: 2-vCPU AMD EPYC VM, 24 GiB, no GPU. "
              "Target: |measured − predicted| ≤ 3 % and ≤ 8 MiB.\n")
    if rs:
        lo, hi = min(r["diff"] for r in rs) / MIB, max(r["diff"] for r in rs) / MIB
        over = [r for r in rs if r["diff"] < 0]
        sign = ("the model slightly under-predicts every run" if not over else
                f"the model slightly under-predicts every run but {len(over)} ("
                + ", ".join(sorted({f"{r['model']} {r['variant']}" for r in over}) ) + ": there the prediction is "
                "above the measured peak; for llama-bench on the sliding-window model the depth-state copy is counted "
                "for every cell the window cache can hold, which may be more than llama.cpp saves — not yet checked)")
        body += ("\n\n**What is left unexplained.** The residual lies between "
                 f"{lo:+.1f} and {hi:+.1f} MiB: {sign}. In edgekv's own runs' phase "
                 "readings (records: `memory.rss_*_bytes` at load, context, fill, end) the rest appears in three places. "
                 "At context creation, +0.2…+1.3 MiB beyond the KV cache and the host structures the dry run measured, "
                 "more with quantized caches: identified there but not yet parts are the attention-rotation Hadamard "
                 "matrices llama.cpp keeps on the host for quantized K/V (src/llama-kv-cache.cpp:344-362; 64²+128²+256² "
                 "floats = 0.34 MiB per cache object at head dim 256) and the cache's per-cell bookkeeping (about 48 B "
                 "per cell, and set nodes per used cell). During warm-up and fill, +0.2…+2.7 MiB (about 0.7-1.0 MiB of "
                 "it file-backed: code pages of the kernels the graphs run), growing with the context for reasons not "
                 "yet attributed. In the timed tests, about +0.5 MiB. Runs recorded before the depth-state read buffer "
                 "became a part (the Gemma base rows, whose sliding-window cache edgekv restores from a state file) "
                 "carry that buffer (0.1-1.8 MiB) in their residual too. Nothing is added as a constant: the rest is "
                 "shown as *unexplained* in the report.\n\n"
                 "**GPU: recorded, not re-measured.** No GPU was lent to this work. Against the H100 run recorded in "
                 "`tests/data/cuda-h100-smollm2.jsonl` (SmolLM2, `-ngl` all), the model's device weights (92.17 MiB: "
                 "CUDA row padding, 128-byte alignment, the tied output's second `token_embd`) and host-mapped weights "
                 "(28.69 MiB) equal llama.cpp's own `CUDA0`/`CPU_Mapped` buffer lines (`tests/test_memmodel.py`); the "
                 "device memory the context added was the KV + llama.cpp's compute reservation + 2.9…4.2 MiB. The CUDA "
                 "runtime (context, cuBLAS, ggml-cuda's pool: +76 MiB during the fill there) is not predicted.")
    write_readme(header + "\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
