"""Predicted-only reports for models too large to download here: Bonsai 8B and Gemma 4 E4B.

Hugging Face is not reachable from every machine, and the KV figures these reports reproduce need only
the GGUF header.  So this script writes metadata-only GGUF headers (no tensors, a few hundred bytes)
from the models' public configuration values with ``gguf.GGUFWriter``, the way llama.cpp's
``convert_hf_to_gguf.py`` writes these keys, then runs the real CLI on them::

    edgekv predict reports/NAME/MODEL-shape.gguf -c ... -ctk f16,q8_0,q5_0,q4_0 --json > reports/NAME/predictions.json
    edgekv report reports/NAME/predictions.json -o reports/NAME --title "..."

and checks the published figures (the MiB llama.cpp prints) against the result.  Run from the
repository root:  ``.venv/bin/python bench/predicted_reports.py``.  With the real file at hand,
``edgekv predict bonsai-8b`` / ``edgekv predict gemma4-e4b`` (models.toml) read the real header instead.

Where the values come from (public configuration files; see also ../shared/reference/anchors.md):

* Bonsai 8B (prism-ml/Bonsai-8B-gguf) has the Qwen3-8B shape (Qwen/Qwen3-8B ``config.json``):
  ``num_hidden_layers`` 36, ``hidden_size`` 4096, ``num_attention_heads`` 32, ``num_key_value_heads`` 8,
  ``head_dim`` 128, ``max_position_embeddings`` 40960, ``rope_theta`` 1e6, ``rms_norm_eps`` 1e-6.
  Published: KV 4608.00 MiB with f16 and 1296.00 MiB with q4_0 at 32K (36 x 8 x 128 x 2 x 32768 x 2 B).
* Gemma 4 E4B (google/gemma-4-E4B ``config.json``, text part): 42 layers, ``hidden_size`` 2560,
  8 attention heads, 2 KV heads, ``head_dim`` 256 on sliding-window layers and ``global_head_dim`` 512
  on full-attention layers, ``sliding_window`` 512, every 6th layer full attention (``layer_types``),
  ``num_kv_shared_layers`` 18 (the last 18 layers reuse the KV of earlier ones), 131072 context.
  Published: 104/296/552 MiB with f16 and 29.25/83.25/155.25 MiB with q4_0 at 4K/16K/32K.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parent.parent
TYPES = "f16,q8_0,q5_0,q4_0"


def qwen3_8b(w: gguf.GGUFWriter) -> None:
    a = "qwen3"
    w.add_name("Bonsai 8B (Qwen3-8B shape, metadata only)")
    w.add_block_count(36)
    w.add_context_length(40960)
    w.add_embedding_length(4096)
    w.add_feed_forward_length(12288)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{a}.vocab_size", 151936)
    w.add_tokenizer_model("gpt2")


def gemma4_e4b(w: gguf.GGUFWriter) -> None:
    a = "gemma4"
    n_layer = 42
    w.add_name("Gemma 4 E4B (metadata only)")
    w.add_block_count(n_layer)
    w.add_context_length(131072)
    w.add_embedding_length(2560)
    w.add_feed_forward_length(10240)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 256)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_key_length(512)
    w.add_value_length(512)
    w.add_uint32(f"{a}.attention.key_length_swa", 256)
    w.add_uint32(f"{a}.attention.value_length_swa", 256)
    w.add_sliding_window(512)
    w.add_array(f"{a}.attention.sliding_window_pattern", [(il + 1) % 6 != 0 for il in range(n_layer)])
    w.add_uint32(f"{a}.attention.shared_kv_layers", 18)
    w.add_rope_freq_base(1_000_000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{a}.vocab_size", 262144)
    w.add_tokenizer_model("llama")


BONSAI_NOTE = """\
**Where the numbers come from.** `Bonsai-8B-shape.gguf` in this folder is a metadata-only GGUF header (no \
tensors) written by `bench/predicted_reports.py` with `gguf.GGUFWriter` from the public Qwen3-8B configuration \
that Bonsai 8B shares (Qwen/Qwen3-8B `config.json`): 36 layers, hidden size 4096, 32 attention heads, 8 KV heads, \
head dim 128, context 40960. `predictions.json` is `edgekv predict Bonsai-8B-shape.gguf -c 4096,8192,16384,32768,65536 \
-ctk f16,q8_0,q5_0,q4_0 --json`, with llama.cpp's command-line defaults (flash attention auto, 1 sequence). \
It reproduces the published figures: **4,608.00 MiB of KV with f16 and 1,296.00 MiB with q4_0 at 32K (3.56×)**. \
The KV size depends only on this shape, not on the 1-bit weights. With network access, \
`edgekv predict bonsai-8b` reads the real file's header over HTTP (its Q1_0 weights need a llama.cpp with Q1_0 \
support for `--engine`)."""

GEMMA_NOTE = """\
**Where the numbers come from.** `gemma-4-E4B-shape.gguf` in this folder is a metadata-only GGUF header (no \
tensors) written by `bench/predicted_reports.py` with `gguf.GGUFWriter` from the public Gemma 4 E4B \
configuration (google/gemma-4-E4B `config.json`, text part): 42 layers, 2 KV heads, head dim 256 on \
sliding-window layers and 512 on full-attention layers, sliding window 512, every 6th layer full attention, \
the last 18 layers reusing earlier layers' KV. So only 24 layers own a cache: 4 full-context ones and 20 with \
a 1,024-cell window. `predictions.json` is `edgekv predict gemma-4-E4B-shape.gguf -c 4096,16384,32768,131072 \
-ctk f16,q8_0,q5_0,q4_0 --json` (llama.cpp's defaults: flash attention auto, `--swa-full` off, 1 sequence). \
It reproduces the published figures: **104 / 296 / 552 MiB with f16 and 29.25 / 83.25 / 155.25 MiB with q4_0 \
at 4K / 16K / 32K**. With the real file, `edgekv predict gemma4-e4b --engine` reads its header over HTTP and \
asks llama.cpp too."""

# name -> (header file, architecture, writer, contexts, title, note,
#          published figures {(n_ctx, type): MiB as llama.cpp prints it})
MODELS = {
    "bonsai-8b-predicted": (
        "Bonsai-8B-shape.gguf", "qwen3", qwen3_8b, "4096,8192,16384,32768,65536",
        "Bonsai 8B (Qwen3-8B shape): KV cache predicted from metadata", BONSAI_NOTE,
        {(32768, "f16"): "4608.00", (32768, "q4_0"): "1296.00"},
    ),
    "gemma4-e4b-predicted": (
        "gemma-4-E4B-shape.gguf", "gemma4", gemma4_e4b, "4096,16384,32768,131072",
        "Gemma 4 E4B: KV cache predicted from metadata", GEMMA_NOTE,
        {(4096, "f16"): "104.00", (16384, "f16"): "296.00", (32768, "f16"): "552.00",
         (4096, "q4_0"): "29.25", (16384, "q4_0"): "83.25", (32768, "q4_0"): "155.25"},
    ),
}


def write_header(path: Path, arch: str, fill) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def edgekv(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def main(out_root: Path = ROOT / "reports") -> int:
    from edgekv.predict import llama_mib

    failures = 0
    for name, (fname, arch, fill, ctxs, title, note, published) in MODELS.items():
        d = out_root / name
        d.mkdir(parents=True, exist_ok=True)
        header = d / fname
        write_header(header, arch, fill)
        rel = header.relative_to(ROOT) if header.is_relative_to(ROOT) else header
        preds = edgekv("predict", str(rel), "-c", ctxs, "-ctk", TYPES, "--json")
        (d / "predictions.json").write_text(preds)
        rows = json.loads(preds)
        got = {(r["n_ctx"], r["type_k"]): llama_mib(r["kv_bytes"]) for r in rows}
        for key, want in published.items():
            ok = got.get(key) == want
            failures += not ok
            print(f"{name}: {key[1]:5s} @ {key[0]:6d}: predicted {got.get(key)} MiB, published {want} MiB "
                  f"{'ok' if ok else 'MISMATCH'}")
        rel_preds = (d / "predictions.json").relative_to(ROOT) if d.is_relative_to(ROOT) else d / "predictions.json"
        edgekv("report", str(rel_preds), "-o", str(d), "--title", title, "--note", note)
        print(f"{name}: report in {d}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "reports"))
