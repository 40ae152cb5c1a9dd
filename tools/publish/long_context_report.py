"""The 1M-token table: KV and state at 128K, 256K and 1M tokens for the shapes long-context articles compare.

Writes ``reports/long-context-1m-predicted/``: for each model a metadata-only GGUF header built from its
published configuration (with the tensor table the vendored llama.cpp asks for, ``shape_headers.py``;
every tensor f32, since only the caches are reported here), then::

    edgekv predict MODEL-shape.gguf -c 131072,262144,1048576 -ctk f16,q8_0,q4_0 --engine --json

so every row carries edgekv's formula and llama.cpp's own dry run (nothing read, nothing allocated), which
must agree.  The README sets llama.cpp's allocation against the per-token formula the articles use
(layers x KV heads x head size x 2 x bytes x tokens) and says where they differ, with the numbers.
Run from the repository root:  ``python -m tools.publish.long_context_report``.

Configurations (public ``config.json`` values; the GGUF keys are what ``convert_hf_to_gguf.py`` writes):

* Qwen2.5-72B (a 72B Qwen GQA shape): 80 layers, hidden 8192, 64 heads, 8 KV heads x 128, FFN 29568,
  vocab 152064, context 32768.
* DeepSeek-V3: 61 layers + 1 MTP layer, hidden 7168, 128 heads, MLA with kv_lora_rank 512 and a 64-dim
  RoPE key (cached K row 576, no V), q_lora_rank 1536, first 3 layers dense (FFN 18432), then 256 routed
  experts (8 used, FFN 2048) + 1 shared, vocab 129280, context 163840.
* Qwen3.5-397B-A17B: 60 layers, every 4th full attention (15 layers, 2 KV heads x 256), the other 45
  Gated DeltaNet (16 key heads, 64 value heads, head size 128, conv kernel 4), 512 experts (10 used, FFN
  1024) + a shared expert, vocab 248320, context 262144.
* DeepSeek-V4-Flash: 43 layers, hidden 4096, 64 heads, 1 KV head x 512, sliding window 128,
  compress_ratios 0,0 then 4,128 alternating (21 CSA layers, 20 HCA layers), lightning indexer 64 heads x
  128 (top-k 512), q/o LoRA 1024, 8 output groups, hyper-connections x4, 256 experts (6 used, FFN 2048) + 1
  shared, vocab 129280, context 1048576.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from msgspec import UNSET

from tools.shape_headers import discover_tensors, kv, write_header

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "reports" / "long-context-1m-predicted"
CONTEXTS = (131072, 262144, 1048576)
TYPES = ("f16", "q8_0", "q4_0")
GIB = 1024 ** 3


def qwen25_72b() -> list[list]:
    return kv("qwen2", {
        "general.name": "Qwen2.5-72B shape (metadata only)", "block_count": 80, "context_length": 32768,
        "embedding_length": 8192, "feed_forward_length": 29568, "attention.head_count": 64,
        "attention.head_count_kv": 8, "rope.freq_base": 1_000_000.0, "attention.layer_norm_rms_epsilon": 1e-6,
        "vocab_size": 152064, "tokenizer.ggml.model": "none"})


def deepseek_v3() -> list[list]:
    return kv("deepseek2", {
        "general.name": "DeepSeek-V3 shape (metadata only)", "block_count": 62, "nextn_predict_layers": 1,
        "context_length": 163840, "embedding_length": 7168, "feed_forward_length": 18432,
        "attention.head_count": 128, "attention.head_count_kv": 1,
        # llama.cpp's MLA layout: the cached K row is kv_lora_rank + rope (576), V is its first 512
        "attention.key_length": 576, "attention.value_length": 512,
        "attention.key_length_mla": 192, "attention.value_length_mla": 128,
        "attention.q_lora_rank": 1536, "attention.kv_lora_rank": 512, "rope.dimension_count": 64,
        "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-6,
        "leading_dense_block_count": 3, "expert_count": 256, "expert_used_count": 8, "expert_shared_count": 1,
        "expert_feed_forward_length": 2048, "expert_weights_scale": 2.5, "expert_weights_norm": True,
        "expert_gating_func": 2, "vocab_size": 129280, "tokenizer.ggml.model": "none"})


def qwen35_397b() -> list[list]:
    return kv("qwen35moe", {
        "general.name": "Qwen3.5-397B-A17B shape (metadata only)", "block_count": 60, "context_length": 262144,
        "embedding_length": 4096, "feed_forward_length": 1024, "attention.head_count": 32,
        "attention.head_count_kv": 2, "attention.key_length": 256, "attention.value_length": 256,
        "full_attention_interval": 4, "rope.dimension_count": 64, "rope.dimension_sections": [11, 11, 10, 0],
        "rope.freq_base": 10_000_000.0, "attention.layer_norm_rms_epsilon": 1e-6,
        # Gated DeltaNet: conv kernel 4, key head size 128 (state), 16 key heads (groups), 64 value heads
        # (time-step rank), inner size 64 x 128
        "ssm.conv_kernel": 4, "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 64,
        "ssm.inner_size": 8192,
        "expert_count": 512, "expert_used_count": 10, "expert_feed_forward_length": 1024,
        "expert_shared_feed_forward_length": 1024, "vocab_size": 248320, "tokenizer.ggml.model": "none"})


def deepseek_v4_flash() -> list[list]:
    return kv("deepseek4", {
        "general.name": "DeepSeek-V4-Flash shape (metadata only)", "block_count": 43, "context_length": 1048576,
        "embedding_length": 4096, "feed_forward_length": 2048, "attention.head_count": 64,
        "attention.head_count_kv": 1, "attention.key_length": 512, "attention.value_length": 512,
        "rope.dimension_count": 64, "rope.freq_base": 10000.0, "attention.q_lora_rank": 1024,
        "attention.sliding_window": 128, "attention.output_group_count": 8, "attention.output_lora_rank": 1024,
        "attention.compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
        "attention.compress_rope_freq_base": 160000.0,
        "attention.indexer.head_count": 64, "attention.indexer.key_length": 128, "attention.indexer.top_k": 512,
        "hyper_connection.count": 4, "hyper_connection.sinkhorn_iterations": 20, "hyper_connection.epsilon": 1e-6,
        # the published model routes its first 3 layers by token hash (num_hash_layers 3); that adds an i32
        # token->expert table per layer and changes no cache, so this header leaves it out
        "hash_layer_count": 0, "expert_count": 256, "expert_used_count": 6, "expert_shared_count": 1,
        "expert_feed_forward_length": 2048, "expert_weights_scale": 1.5, "expert_weights_norm": True,
        "expert_gating_func": 4, "swiglu_clamp_exp": 10.0, "attention.layer_norm_rms_epsilon": 1e-6,
        "vocab_size": 129280, "tokenizer.ggml.model": "none"})


# name -> (header file, architecture, metadata, a tiny family with the same memory type, the articles'
#          per-token bytes at f16 and what they count)
MODELS = {
    "Qwen2.5-72B": ("Qwen2.5-72B-shape.gguf", "qwen2", qwen25_72b, "llama-gqa",
                    80 * 8 * 128 * 2 * 2, "80 layers x 8 KV heads x 128 x (K+V) x 2 bytes"),
    "DeepSeek-V3": ("DeepSeek-V3-shape.gguf", "deepseek2", deepseek_v3, "deepseek2-mla",
                    61 * (512 + 64) * 2, "61 layers x (512 latent + 64 RoPE) x 2 bytes"),
    "Qwen3.5-397B-A17B": ("Qwen3.5-397B-A17B-shape.gguf", "qwen35moe", qwen35_397b, "qwen35moe",
                          15 * 2 * 256 * 2 * 2, "15 attention layers x 2 KV heads x 256 x (K+V) x 2 bytes"),
    "DeepSeek-V4-Flash": ("DeepSeek-V4-Flash-shape.gguf", "deepseek4", deepseek_v4_flash, "deepseek4",
                          None, "(no per-token formula: compressed caches)"),
}


def edgekv(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f}"


LABELS = {spec[0]: model for model, spec in MODELS.items()}     # header file -> the model's label in the tables


def label(rec: Any) -> str:
    """A record's model label: the script's name for the header file the record names (records carry no label
    of their own; the strict schema has no such field)."""
    return LABELS[Path(rec.model.path).name]


def load(path: Path) -> list:
    """predictions.json as typed records (kind ``predict``), strictly decoded."""
    from edgekv.records.results import as_record

    return [as_record(x, f"{path}:{i}") for i, x in enumerate(json.loads(path.read_text()), 1)]


def find(recs: list, m: str, n: int = 1048576, t: str = "f16") -> Any:
    return next(x for x in recs if label(x) == m and x.settings.n_ctx == n and x.settings.type_k == t)


def by_kind(formula: Any) -> dict[str, int]:
    """Bytes per cache kind of one record's formula (``prediction.formula``)."""
    out: dict[str, int] = {}
    for c in formula.caches:
        out[c.kind] = out.get(c.kind, 0) + c.bytes
    return out


KIND_LABEL = {
    "full": "KV (attention)", "swa": "KV (window)", "recurrent": "recurrent state (f32)",
    "dsv4_raw_full": "raw K (non-window layers)", "dsv4_window": "raw K window", "dsv4_csa": "CSA compressed K (1/4)",
    "dsv4_hca": "HCA compressed K (1/128)", "dsv4_indexer": "indexer K (1/4)", "dsv4_state": "compressor state (f32)",
    "dsa_indexer": "indexer K", "msa_indexer": "indexer K/V", "hybrid_indexer": "indexer K",
}


def main(out: Path = OUT, only: list[str] | None = None) -> int:
    """Regenerate the headers and dry runs of ``only`` (default: every model; the others' rows are kept from
    predictions.json), then README.md and results.csv from all rows."""
    out.mkdir(parents=True, exist_ok=True)
    from edgekv.records.results import as_record
    from edgekv.records.schema import encode

    keep = only is not None and (out / "predictions.json").exists()      # the other models' records are kept
    old = load(out / "predictions.json") if keep else []
    recs: list = []
    failures = 0
    for model, (fname, arch, meta, family, _per_token, _what) in MODELS.items():
        if only is not None and model not in only:
            recs += [r for r in old if label(r) == model]
            continue
        header = out / fname
        write_header(header, discover_tensors(family, arch, meta()))
        rel = header.relative_to(ROOT) if header.is_relative_to(ROOT) else header
        got = json.loads(edgekv("predict", str(rel), "-c", ",".join(map(str, CONTEXTS)), "-ctk", ",".join(TYPES),
                                "--engine", "--json"))
        recs += [as_record(x, f"predict {rel}:{i}") for i, x in enumerate(got, 1)]
    for r in recs:
        f, e = r.prediction.formula, r.prediction.engine
        ok = r.status == "ok" and e.ok and e.match is True
        failures += not ok
        print(f"{label(r):18s} {f.n_ctx:8d} {f.type_k:5s} formula {gib(f.total_bytes)} GiB  "
              f"llama.cpp {'agrees' if ok else 'DIFFERS: ' + '; '.join(e.diffs or [str(e.error)])}")
    (out / "predictions.json").write_text(json.dumps([encode(r) for r in recs], indent=1) + "\n")
    (out / "results.csv").write_text(results_csv(recs))
    (out / "README.md").write_text(readme(recs))
    print(f"report in {out}")
    return 1 if failures else 0


def results_csv(recs: list) -> str:
    kinds = sorted({c.kind for r in recs for c in r.prediction.formula.caches})
    f = io.StringIO()
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["model", "arch", "n_ctx", "type_k", "type_v", "total_bytes_formula", "kv_bytes_formula",
                "recurrent_bytes_formula", "state_bytes_formula", "llama_cpp_mib_sum", "llama_cpp_matches"]
               + [f"{k}_bytes" for k in kinds])
    for r in recs:
        p, e = r.prediction.formula, r.prediction.engine
        k = by_kind(p)
        w.writerow([label(r), r.model.arch, p.n_ctx, p.type_k, p.type_v, p.total_bytes, p.kv_bytes,
                    p.recurrent_bytes, p.state_bytes, f"{e.kv_mib + e.recurrent_mib + e.state_mib:.2f}", e.match]
                   + [k.get(x, 0) for x in kinds])
    return f.getvalue()


def readme(recs: list) -> str:
    L = ["# KV cache and state at 128K, 256K and 1M tokens: predicted, with llama.cpp's dry run", "",
         "> **Predicted only.** Nothing here was measured: every figure comes from GGUF headers (edgekv's formula) "
         "and from llama.cpp's own dry run on them (`no_alloc`: nothing read, nothing allocated).", "",
         "Four shapes that long-context articles compare, each a metadata-only GGUF header in this folder written by "
         "`tools/publish/long_context_report.py` from the published configuration (see the script's docstring for every "
         "value), with the tensor table the vendored llama.cpp (llama-cpp-python 0.3.36) asks for. For each: "
         "`edgekv predict HEADER -c 131072,262144,1048576 -ctk f16,q8_0,q4_0 --engine --json` (llama.cpp's defaults: "
         "flash attention auto, one sequence, `-ub 512`). `predictions.json` holds every row, with every cache "
         "object and llama.cpp's printed lines; `results.csv` the same per cache kind. **In all "
         f"{len(recs)} configurations llama.cpp's dry run printed exactly the formula's figures.**", "",
         "GiB = 2^30 bytes. The articles quote \"GB\" for 1,000,000 tokens of f16 computed with the per-token "
         "formula; llama.cpp's 1M is 1,048,576 tokens.", "",
         "## Totals (all caches and state), GiB", "",
         "| model | n_ctx | f16 | q8_0 | q4_0 | llama.cpp = formula |", "|:---|---:|---:|---:|---:|:---:|"]
    models = list(dict.fromkeys(label(r) for r in recs))
    for m in models:
        for n in CONTEXTS:
            cells = []
            agree = True
            for t in TYPES:
                r = find(recs, m, n, t)
                cells.append(gib(r.prediction.formula.total_bytes))
                agree &= bool(r.prediction.engine.match)
            L.append(f"| {m} | {n:,} | " + " | ".join(cells) + f" | {'✓' if agree else '✗'} |")
    L += ["", "## Where the bytes go at 1,048,576 tokens, f16", "",
          "| model | cache object (llama.cpp) | cells per sequence | layers | GiB |", "|:---|:---|---:|---:|---:|"]
    for m in models:
        for c in find(recs, m).prediction.formula.caches:
            name = KIND_LABEL.get(c.kind, c.kind) + (f" ({c.name})" if c.name is not UNSET else "")
            cells = c.cells if c.cells is not UNSET else c.state_rows
            L.append(f"| {m} | {name} | {cells:,} | {c.layers} | {gib(c.bytes)} |")
    L += ["", "## llama.cpp's allocation against the articles' per-token formula (f16)", "",
          "| model | the articles' formula | per token | x 1,000,000 tokens (GiB) | x 1,048,576 (GiB) | "
          "llama.cpp at 1,048,576 (GiB) |", "|:---|:---|---:|---:|---:|---:|"]
    for m in models:
        _f, _a, _meta, _fam, per_token, what = MODELS[m]
        total = find(recs, m).prediction.formula.total_bytes
        if per_token:
            L.append(f"| {m} | {what} | {per_token:,} B | {gib(per_token * 1_000_000)} | {gib(per_token * 1048576)} "
                     f"| {gib(total)} |")
        else:
            L.append(f"| {m} | {what} | - | - | - | {gib(total)} |")
    L += ["", "## Where llama.cpp differs from the simple formulas", ""] + differences(recs) + [""]
    return "\n".join(L)


def differences(recs: list) -> list[str]:
    def row(m: str, n: int = 1048576, t: str = "f16") -> Any:
        return find(recs, m, n, t).prediction.formula

    out = []
    q = row("Qwen2.5-72B")
    out.append(f"- **Tokens, not GB.** The articles multiply by 1,000,000 tokens and print GiB as \"GB\"; llama.cpp's "
               f"1M context is 1,048,576 cells (a multiple of 256, so no padding here). For the 72B GQA shape that is "
               f"{gib(327680 * 1_000_000)} GiB (the articles' ~305 GB) against llama.cpp's {gib(q.total_bytes)} "
               "GiB: the same bytes per token, 4.9 % more tokens. Padding matters below 1M: a context that is not a "
               "multiple of 256 is rounded up, per sequence.")
    d = row("DeepSeek-V3")
    out.append(f"- **MLA and the MTP layer.** DeepSeek-V3 caches one 576-wide K row per layer and no V (llama.cpp "
               f"refuses K and V types that differ). The GGUF has 62 blocks, but the NextN/MTP block gets no cache in "
               f"the main context (`il < n_layer()`, llama-model.cpp create_memory), so 61 layers: "
               f"{gib(d.total_bytes)} GiB, exactly the per-token formula at 1,048,576 tokens. With q4_0 the row "
               f"of 576 is 18 blocks of 32: {gib(row('DeepSeek-V3', t='q4_0').total_bytes)} GiB.")
    s = row("Qwen3.5-397B-A17B")
    s128 = row("Qwen3.5-397B-A17B", 131072, "q4_0")
    k = by_kind(s)
    out.append(f"- **f32 recurrent state.** Qwen3.5-397B-A17B caches K and V only on its 15 full-attention layers "
               f"({gib(k.get('full'))} GiB at 1M), but llama.cpp also keeps the 45 Gated DeltaNet layers' state in "
               f"f32, whatever `-ctk` says: {k.get('recurrent', 0):,} bytes per sequence (conv rows (4-1) x 12,288 "
               f"and a 128 x 8,192 state per layer), constant in context. The articles leave it out. It is multiplied "
               f"by the sequences (`-np`) and by `1 + n_rs_seq` when rollback snapshots are on (`--n-rs-seq`, set by "
               f"llama-server's MTP/EAGLE3/DFlash drafting); at 128K with q4_0 it is "
               f"{100 * s128.recurrent_bytes / s128.total_bytes:.1f} % of the total.")
    v = row("DeepSeek-V4-Flash")
    kv4 = by_kind(v)
    out.append(f"- **DeepSeek-V4: window, compressed and indexer caches, and f32 compressor state.** llama.cpp "
               f"builds (llama-kv-cache-dsv4.cpp) a raw K window on all 43 layers of "
               f"pad(128 + n_ubatch) = 768 cells ({gib(kv4.get('dsv4_window'))} GiB), a CSA cache of one row per 4 "
               f"tokens on the 21 ratio-4 layers ({gib(kv4.get('dsv4_csa'))} GiB), an HCA cache of one row per 128 "
               f"tokens on the 20 ratio-128 layers ({gib(kv4.get('dsv4_hca'))} GiB), a lightning-indexer K cache of "
               f"128 per row at 1/4 on the CSA layers ({gib(kv4.get('dsv4_indexer'))} GiB), and f32 compressor "
               f"states ({kv4.get('dsv4_state', 0):,} bytes). Total {gib(v.total_bytes)} GiB at 1M with f16 "
               f"({gib(row('DeepSeek-V4-Flash', t='q4_0').total_bytes)} GiB with q4_0). The indexer alone is "
               f"{100 * kv4.get('dsv4_indexer', 0) / v.total_bytes:.0f} % of it; a formula that counts only the "
               "compressed KV misses it. Every cache keeps one stream per sequence even with `--kv-unified`, and the "
               "compressed cell counts are rounded up to a multiple of 256 (an 8K context still gets 256 HCA rows).")
    out.append("- **Window caches** are sized `pad(n_swa + n_ubatch, 256)` per sequence (here 128 + 512 -> 768 "
               "cells), not `n_swa`: a larger `-ub` grows them.")
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path, default=OUT)
    ap.add_argument("--models", help=f"comma list of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--render-only", action="store_true", help="rewrite README.md and results.csv from predictions.json")
    a = ap.parse_args()
    sys.exit(main(a.out, [] if a.render_only else a.models.split(",") if a.models else None))
