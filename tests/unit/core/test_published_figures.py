"""Published KV-cache figures, reproduced from GGUF headers written from public config values.

No llama.cpp here: the headers are written the way ``convert_hf_to_gguf.py`` writes these models'
metadata (keys, GGUF types, per-layer arrays), read back by edgekv's own streaming reader, and
predicted with llama.cpp's command-line defaults (flash attention auto, swa_full off, 1 sequence,
n_ubatch 512).  The expected MiB are the published ones (``../shared/reference/anchors.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekv.core.predict import ContextParams, llama_mib, predict
from edgekv.prediction.api import load_model
from tests.tiny.writer import write_gguf


def _qwen3_8b_metadata() -> list[list]:
    # Qwen/Qwen3-8B config.json: 36 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, 40960 ctx
    a = "qwen3"
    return [
        ["general.architecture", "string", a], ["general.name", "string", "Qwen3-8B-shaped (Bonsai 8B)"],
        [f"{a}.block_count", "uint32", 36], [f"{a}.context_length", "uint32", 40960],
        [f"{a}.embedding_length", "uint32", 4096], [f"{a}.feed_forward_length", "uint32", 12288],
        [f"{a}.attention.head_count", "uint32", 32], [f"{a}.attention.head_count_kv", "uint32", 8],
        [f"{a}.attention.key_length", "uint32", 128], [f"{a}.attention.value_length", "uint32", 128],
        [f"{a}.rope.freq_base", "float32", 1000000.0], [f"{a}.attention.layer_norm_rms_epsilon", "float32", 1e-6],
        ["tokenizer.ggml.model", "string", "gpt2"], [f"{a}.vocab_size", "uint32", 151936],
    ]


def _gemma4_e4b_metadata() -> list[list]:
    # google/gemma-4-E4B config: 42 layers, 2 KV heads, head_dim 256 (sliding) / 512 (global),
    # sliding_window 512, every 6th layer full attention, 18 KV-shared layers
    a = "gemma4"
    n_layer = 42
    return [
        ["general.architecture", "string", a], ["general.name", "string", "Gemma-4-E4B-shaped"],
        [f"{a}.block_count", "uint32", n_layer], [f"{a}.context_length", "uint32", 131072],
        [f"{a}.embedding_length", "uint32", 2560], [f"{a}.feed_forward_length", "uint32", 10240],
        [f"{a}.embedding_length_per_layer_input", "uint32", 256],
        [f"{a}.attention.head_count", "uint32", 8], [f"{a}.attention.head_count_kv", "uint32", 2],
        [f"{a}.attention.key_length", "uint32", 512], [f"{a}.attention.value_length", "uint32", 512],
        [f"{a}.attention.key_length_swa", "uint32", 256], [f"{a}.attention.value_length_swa", "uint32", 256],
        [f"{a}.attention.sliding_window", "uint32", 512],
        [f"{a}.attention.sliding_window_pattern", "array[bool]", [(il + 1) % 6 != 0 for il in range(n_layer)]],
        [f"{a}.attention.shared_kv_layers", "uint32", 18],
        [f"{a}.rope.freq_base", "float32", 1000000.0], [f"{a}.rope.freq_base_swa", "float32", 10000.0],
        [f"{a}.attention.layer_norm_rms_epsilon", "float32", 1e-6],
        ["tokenizer.ggml.model", "string", "llama"], [f"{a}.vocab_size", "uint32", 262144],
    ]


# (n_ctx, type) -> MiB as llama.cpp prints it, from the published figures
QWEN3_8B = {(32768, "f16"): "4608.00", (32768, "q4_0"): "1296.00"}
GEMMA4_E4B = {
    (4096, "f16"): "104.00", (16384, "f16"): "296.00", (32768, "f16"): "552.00",
    (4096, "q4_0"): "29.25", (16384, "q4_0"): "83.25", (32768, "q4_0"): "155.25",
}
MODELS = {"qwen3-8b": (_qwen3_8b_metadata, QWEN3_8B), "gemma4-e4b": (_gemma4_e4b_metadata, GEMMA4_E4B)}


@pytest.fixture(scope="module")
def headers(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("published")
    out = {}
    for name, (meta, _) in MODELS.items():
        md = meta()
        path = d / f"{name}.gguf"
        write_gguf(path, md[0][2], md, [])
        out[name] = path
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_published_figures_api(name, headers):
    m = load_model(str(headers[name]))
    for (n_ctx, t), want in MODELS[name][1].items():
        p = predict(m.shape, ContextParams(n_ctx=n_ctx, type_k=t, type_v=t))
        assert p.status == "ok"
        assert llama_mib(p.kv_bytes) == want, (n_ctx, t)


def test_gemma4_e4b_structure(headers):
    """The figures come out for the right reasons: 24 layers own KV (4 global, 20 SWA with 1024 cells)."""
    m = load_model(str(headers["gemma4-e4b"]))
    assert m.shape.memory == "iswa" and m.shape.n_swa == 512
    p = predict(m.shape, ContextParams(n_ctx=32768))
    full, swa = p.caches
    assert (full.layers, full.cells) == ([5, 11, 17, 23], 32768)
    assert (len(swa.layers), swa.cells) == (20, 1024)
    assert [lay.reuses for lay in m.shape.layers[24:]] == [22 if lay.is_swa else 23 for lay in m.shape.layers[24:]]


@pytest.mark.slow                   # predict measures the runtime baseline in a llama.cpp child
@pytest.mark.parametrize("name", sorted(MODELS))
def test_published_figures_cli(cli, name, headers):
    figures = MODELS[name][1]
    ctxs = sorted({n for n, _ in figures})
    types = sorted({t for _, t in figures})
    rc, out, err = cli("predict", headers[name], "-c", ",".join(map(str, ctxs)), "-ctk", ",".join(types), "--json")
    assert rc == 0, err
    formulas = [r["prediction"]["formula"] for r in json.loads(out)]      # kind-predict records
    got = {(f["n_ctx"], f["type_k"]): llama_mib(f["kv_bytes"]) for f in formulas}
    for key, want in figures.items():
        assert got[key] == want, key
