"""Discover a loadable tiny GGUF for every llama.cpp architecture family, by asking llama.cpp.

llama.cpp refuses a model unless every tensor its architecture declares is present with the exact
shape, even in a dry run.  Rather than hand-writing ~150 tensor lists, this tool starts from the
family's memory-relevant metadata (``FAMILIES`` below) and loads the file with ``no_alloc=True,
load_mode=NONE`` in a loop, reading llama.cpp's error each time:

* ``key not found in model: K``            -> add K from ``KEY_DEFAULTS`` (by key suffix)
* ``key K has wrong type T but expected U`` -> rewrite K with type U
* ``missing tensor 'X'``                    -> add X (shape guessed from a sibling layer, or [1])
* ``tensor 'X' has wrong shape; expected A`` -> give X shape A

When the model loads, it also creates contexts (FA auto/off, quantized cache, 2 sequences) so that
graph reservation is known to work for the family.  Each family runs in its own child process
(a GGML_ASSERT aborts the whole process).  The result is ``specs.json`` next to this file, which
``tests/real/test_families.py`` turns back into GGUF files with ``writer.py``.

**Regenerate specs.json whenever llama-cpp-python is upgraded** (tensor names, shapes and required
keys follow the vendored llama.cpp)::

    .venv/bin/python -m tests.tiny.discover            # all families
    .venv/bin/python -m tests.tiny.discover gemma4 lfm2-swa   # some families (others are kept)

Only the memory-relevant metadata in ``FAMILIES`` is chosen by hand; everything else llama.cpp
asked for is a neutral default and is recorded in the spec with its type.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SPECS_PATH = os.path.join(HERE, "specs.json")
MAX_STEPS = 4000

# ----------------------------------------------------------------------------------------------------
# Families: architecture + the metadata that decides its cache.  Keys are suffixes of "{arch}.";
# full keys (containing a dot before any arch prefix, e.g. "tokenizer.ggml.model") are written as-is.
# Python value -> GGUF type: int -> uint32, float -> float32, bool -> bool, str -> string,
# list[bool] -> array[bool], list[int] -> array[int32] (override with an explicit (type, value)).
# ----------------------------------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "context_length": 8192,
    "embedding_length": 128,
    "block_count": 4,
    "feed_forward_length": 256,
    "attention.head_count": 2,
    "vocab_size": 256,
}


def fam(arch: str, note: str, memory: str, base: bool = True, tensors: dict[str, list[int]] | None = None,
        moe: bool = False, **meta: Any) -> dict[str, Any]:
    """A family: ``meta`` keys use ``__`` for ``.``; ``tensors`` seeds tensors llama.cpp only inspects
    (``{i}`` = every layer), e.g. ones whose shape selects a variant; ``moe`` adds expert sizes.
    ``memory`` is the memory type edgekv must read, or "aborts" for a model that loads but whose
    contexts llama.cpp aborts creating (no context is created during discovery)."""
    m = dict(BASE) if base else {}
    if moe:
        m.update({"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 64})
    for k, v in meta.items():
        k = k.replace("__", ".")
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    return {"arch": arch, "note": note, "memory": memory, "meta": m, "tensors": tensors or {}}


def seed_tensors(family: dict[str, Any]) -> list[list[Any]]:
    n = family["meta"].get("block_count", 1)
    out = []
    for name, ne in family["tensors"].items():
        for i in range(n) if "{i}" in name else [0]:
            out.append([name.replace("{i}", str(i)), list(ne), "f32"])
    return out


def swa_pattern(n_layer: int, period: int, dense_first: bool = False) -> list[bool]:
    """llama_hparams::set_swa_pattern as a bool array."""
    if dense_first:
        return [il % period != 0 for il in range(n_layer)]
    return [il % period < period - 1 for il in range(n_layer)]


L4_SWA_PERIOD4 = swa_pattern(4, 4)            # [T, T, T, F]

# MLA geometry at tiny scale: latent (kv_lora_rank) 64 + rope 32 = 96 K elements per cell, head dims 64
MLA = dict(attention__head_count_kv=1, attention__key_length=96, attention__value_length=64,
           attention__key_length_mla=64, attention__value_length_mla=64, attention__kv_lora_rank=64,
           attention__q_lora_rank=64, rope__dimension_count=32)
INDEXER = dict(attention__indexer__head_count=4, attention__indexer__key_length=64, attention__indexer__top_k=2048)

FAMILIES: dict[str, dict[str, Any]] = {
    # -- dense: MHA / GQA / MQA, scalar or per-layer head_count_kv, explicit K/V head dims -------------
    "llama-mha": fam("llama", "dense MHA (head_count_kv absent = head_count)", "kv"),
    "llama-gqa": fam("llama", "dense GQA, 4 heads / 2 KV heads", "kv", embedding_length=256,
                     attention__head_count=4, attention__head_count_kv=2),
    "llama-mqa": fam("llama", "dense MQA, 1 KV head", "kv", attention__head_count_kv=1),
    "qwen3-kv-len": fam("qwen3", "explicit key_length/value_length (128) != n_embd/n_head", "kv",
                        attention__head_count=4, attention__head_count_kv=2, attention__key_length=128,
                        attention__value_length=128),
    "deci-per-layer-kv": fam("deci", "per-layer head_count_kv array [2,1,0,2] (0 = linear-attention layer, empty K/V)",
                             "kv", attention__head_count_kv=[2, 1, 0, 2]),
    "openelm-per-layer": fam("openelm", "per-layer head_count and head_count_kv arrays", "kv",
                             attention__head_count=[2, 2, 4, 4], attention__head_count_kv=[1, 1, 2, 2],
                             attention__key_length=64, attention__value_length=64,
                             feed_forward_length=[256, 256, 384, 384]),
    "mimo2-kv-dims": fam("mimo2", "K head dim 96 != V head dim 64, SWA from a bool array", "iswa",
                         attention__head_count=2, attention__head_count_kv=1, attention__key_length=96,
                         attention__value_length=64, attention__sliding_window=128,
                         attention__sliding_window_pattern=L4_SWA_PERIOD4),
    "llama-hd80": fam("llama", "head dim 80 with 1 KV head: K/V rows of 80 elements, not a multiple of the 32-element "
                      "quantized blocks", "kv", embedding_length=160, attention__head_count_kv=1,
                      rope__dimension_count=80),
    "grok": fam("grok", "grok: llama.cpp forces flash attention off", "kv", moe=True),
    # -- sliding window / iSWA -----------------------------------------------------------------------
    "gemma2": fam("gemma2", "SWA, default period 2", "iswa", attention__sliding_window=128,
                  attention__key_length=64, attention__value_length=64),
    "gemma2-default-window": fam("gemma2", "SWA, window key absent: llama.cpp's default 4096", "iswa"),
    "gemma3": fam("gemma3", "SWA, default period 6", "iswa", block_count=7, attention__sliding_window=128,
                  attention__head_count_kv=1),
    "gemma3-period": fam("gemma3", "SWA, scalar sliding_window_pattern 3", "iswa", block_count=6,
                         attention__sliding_window=128, attention__sliding_window_pattern=3),
    "gemma3-no-window": fam("gemma3", "sliding_window 0: no SWA, plain cache", "kv", attention__sliding_window=0),
    "gemma3n": fam("gemma3n", "SWA period 5, only the first 20 layers own KV (hard-coded), the rest reuse",
                   "iswa", block_count=22, attention__sliding_window=128, attention__head_count_kv=1,
                   embedding_length_per_layer_input=64),
    "gemma4": fam("gemma4", "SWA bool array, SWA head dim 64 vs global 128, 2 shared-KV layers (reusing layers 2 "
                  "and 3), per-layer KV heads", "iswa", block_count=6, attention__head_count=2,
                  attention__head_count_kv=[1, 2, 1, 2, 1, 2],
                  attention__key_length=128, attention__value_length=128, attention__key_length_swa=64,
                  attention__value_length_swa=64, attention__sliding_window=128,
                  attention__sliding_window_pattern=[True, False, True, False, True, False],
                  attention__shared_kv_layers=2, embedding_length_per_layer_input=64),
    "gemma4-bad-reuse": fam("gemma4", "shared-KV layer 4 (SWA) would reuse layer 2, a full-attention layer: the "
                            "model loads, every context aborts", "aborts", block_count=6, attention__head_count_kv=1,
                            attention__key_length=128, attention__value_length=128, attention__key_length_swa=64,
                            attention__value_length_swa=64, attention__sliding_window=128,
                            attention__sliding_window_pattern=[True, True, False, True, True, False],
                            attention__shared_kv_layers=2, embedding_length_per_layer_input=64),
    "gemma4-no-shared": fam("gemma4", "Gemma 4 without shared_kv_layers: every layer owns KV", "iswa", block_count=4,
                            attention__head_count_kv=1, attention__key_length=128, attention__value_length=128,
                            attention__key_length_swa=64, attention__value_length_swa=64,
                            attention__sliding_window=128, attention__sliding_window_pattern=L4_SWA_PERIOD4,
                            embedding_length_per_layer_input=64),
    "cohere2": fam("cohere2", "SWA, period 4", "iswa", attention__sliding_window=128),
    "cohere2moe": fam("cohere2moe", "SWA, period 4 dense-first", "iswa", attention__sliding_window=128,
                      attention__layer_norm_epsilon=1e-5,
                      moe=True),
    "gpt-oss": fam("gpt-oss", "SWA, period 2", "iswa", attention__sliding_window=128, attention__head_count=4,
                   attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                   moe=True),
    "llama4-chunked": fam("llama4", "chunked attention, window forced to 8192, period 4", "iswa",
                          expert_count=4, expert_used_count=1, expert_feed_forward_length=64),
    "llama4-no-chunk": fam("llama4", "sliding_window 0 switches chunking off: plain cache", "kv",
                           attention__sliding_window=0, expert_count=4, expert_used_count=1, expert_feed_forward_length=64),
    "exaone4": fam("exaone4", "30-layer-style EXAONE 4: no SWA even with a sliding_window key", "kv",
                   attention__sliding_window=128),
    "exaone4-64": fam("exaone4", "64 layers: the only size llama.cpp gives SWA (window from the key), period 4",
                      "iswa", block_count=64, embedding_length=64, attention__head_count=1, feed_forward_length=64,
                      attention__sliding_window=128),
    "phi3-swa-disabled": fam("phi3", "sliding_window present but llama.cpp disables SWA for phi3", "kv",
                             attention__sliding_window=128),
    "afmoe": fam("afmoe", "SWA if window > 0, period 4", "iswa", attention__sliding_window=128,
                 moe=True),
    "olmo2": fam("olmo2", "SWA if window > 0, period 4", "iswa", attention__sliding_window=128),
    "olmo2-dense": fam("olmo2", "no window: plain cache", "kv"),
    "smallthinker": fam("smallthinker", "SWA if window > 0, window forced to 4096, period 4 dense-first", "iswa",
                        attention__sliding_window=128, moe=True, expert_gating_func=2),
    "laguna": fam("laguna", "SWA if window > 0, period 4 dense-first", "iswa", attention__sliding_window=128,
                  tensors={"blk.{i}.attn_gate.weight": [128, 2]},
                  moe=True),
    "mellum": fam("mellum", "SWA if window > 0, period 4", "iswa", attention__sliding_window=128,
                  moe=True),
    "plamo3": fam("plamo3", "SWA if window > 0, period 8", "iswa", block_count=8, attention__sliding_window=128),
    "granite-swa": fam("granite_swa", "SWA bool array", "iswa", attention__sliding_window=128,
                       attention__sliding_window_pattern=[True, False, True, False]),
    "step35": fam("step35", "SWA bool array", "iswa", attention__sliding_window=128,
                  attention__sliding_window_pattern=L4_SWA_PERIOD4, moe=True),
    "spark2-5": fam("spark2_5", "SWA bool array", "iswa", attention__sliding_window=128,
                    attention__sliding_window_pattern=L4_SWA_PERIOD4),
    "maple": fam("maple", "SWA bool array", "iswa", attention__sliding_window=128,
                 attention__sliding_window_pattern=L4_SWA_PERIOD4, moe=True),
    "exaone-moe": fam("exaone-moe", "SWA period 4", "iswa", attention__sliding_window=128,
                      moe=True),
    "muse-glimmer": fam("muse-glimmer", "SWA period 4", "iswa", attention__sliding_window=128),
    # -- MLA ------------------------------------------------------------------------------------------
    "deepseek2-mla": fam("deepseek2", "MLA: K only (kv_lora_rank 64 + rope 32 = 96 per cell), no V", "kv",
                         attention__head_count_kv=1, attention__key_length=96, attention__value_length=64,
                         attention__key_length_mla=64, attention__value_length_mla=64, attention__kv_lora_rank=64,
                         attention__q_lora_rank=64, rope__dimension_count=32, moe=True),
    "deepseek2-old": fam("deepseek2", "old DeepSeek-V2 GGUF without *_mla keys: full MHA cache, K 96 != V 64", "kv",
                         attention__key_length=96, attention__value_length=64, attention__kv_lora_rank=64,
                         attention__q_lora_rank=64, rope__dimension_count=32, moe=True),
    # -- NextN / MTP ----------------------------------------------------------------------------------
    "glm4moe-nextn": fam("glm4moe", "1 NextN/MTP layer: never cached in the main context", "kv",
                         nextn_predict_layers=1, attention__head_count_kv=1, moe=True),
    # -- hybrid recurrent -----------------------------------------------------------------------------
    "qwen3next": fam("qwen3next", "gated delta net, every 4th layer attention (default)", "hybrid",
                     attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                     ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=32, ssm__time_step_rank=4,
                     ssm__group_count=2, moe=True),
    "qwen35-interval": fam("qwen35", "full_attention_interval 2", "hybrid", attention__head_count_kv=1,
                           attention__key_length=64, attention__value_length=64, full_attention_interval=2,
                           ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=32, ssm__time_step_rank=4,
                           ssm__group_count=2),
    "qwen35-recurrent-layers": fam("qwen35", "recurrent_layers array", "hybrid", attention__head_count_kv=1,
                                   attention__key_length=64, attention__value_length=64,
                                   attention__recurrent_layers=[True, False, True, False],
                                   ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=32,
                                   ssm__time_step_rank=4, ssm__group_count=2),
    "qwen35-nextn": fam("qwen35", "default interval + 1 MTP layer", "hybrid", block_count=5, nextn_predict_layers=1,
                        attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                        ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=32, ssm__time_step_rank=4,
                        ssm__group_count=2),
    "qwen35moe": fam("qwen35moe", "MoE gated delta net", "hybrid", attention__head_count_kv=1,
                     attention__key_length=64, attention__value_length=64, ssm__conv_kernel=4, ssm__inner_size=128,
                     ssm__state_size=32, ssm__time_step_rank=4, ssm__group_count=2, expert_count=4,
                     expert_used_count=2),
    "jamba": fam("jamba", "mamba1 layers where head_count_kv == 0", "hybrid", attention__head_count_kv=[0, 1, 0, 1],
                 ssm__conv_kernel=4, ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8),
    "lfm2": fam("lfm2", "shortconv layers where head_count_kv == 0", "hybrid", attention__head_count_kv=[0, 2, 0, 2],
                shortconv__l_cache=3),
    "lfm2-swa": fam("lfm2", "lfm2 with a sliding window: attention layers are SWA (hybrid iSWA)", "hybrid_iswa",
                    attention__head_count_kv=[0, 2, 0, 2], shortconv__l_cache=3, attention__sliding_window=128),
    "lfm2moe": fam("lfm2moe", "MoE lfm2", "hybrid", attention__head_count_kv=[0, 2, 0, 2], shortconv__l_cache=3,
                   moe=True),
    "granitehybrid": fam("granitehybrid", "mamba2 layers where head_count_kv == 0", "hybrid",
                         attention__head_count_kv=[0, 2, 0, 0], ssm__conv_kernel=4, ssm__inner_size=256,
                         ssm__state_size=16, ssm__time_step_rank=8, ssm__group_count=1),
    "nemotron-h": fam("nemotron_h", "mamba2 (kv 0, ff 0), attention (ff 0), MLP-only (ff > 0) layers", "hybrid",
                      attention__head_count_kv=[0, 2, 0, 0], feed_forward_length=[0, 0, 256, 0],
                      ssm__conv_kernel=4, ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8,
                      ssm__group_count=1),
    "falcon-h1": fam("falcon-h1", "every layer has attention KV and mamba2 state", "hybrid",
                     ssm__conv_kernel=4, ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8,
                     ssm__group_count=1),
    "plamo2": fam("plamo2", "mamba2 layers where head_count_kv == 0", "hybrid", attention__head_count_kv=[0, 2, 0, 2],
                  attention__key_length=64, attention__value_length=64, ssm__conv_kernel=4, ssm__inner_size=256,
                  ssm__state_size=16, ssm__time_step_rank=8, ssm__group_count=0),
    "kimi-linear": fam("kimi-linear", "KDA recurrent layers + MLA attention layers", "hybrid",
                       attention__head_count_kv=[0, 1, 0, 1], attention__key_length=96, attention__value_length=64,
                       attention__key_length_mla=64, attention__value_length_mla=64, attention__kv_lora_rank=64,
                       rope__dimension_count=32, ssm__conv_kernel=4, kda__head_dim=64, expert_count=4,
                       expert_used_count=2),
    "minimax-01": fam("minimax-01", "lightning-attention layers, full_attention_interval 2", "hybrid",
                      full_attention_interval=2, moe=True),
    "bailingmoe3": fam("bailingmoe3", "KDA + MLA", "hybrid", attention__head_count_kv=[0, 1, 0, 1],
                       attention__key_length=96, attention__value_length=64, attention__key_length_mla=64,
                       attention__value_length_mla=64, attention__kv_lora_rank=64, rope__dimension_count=32,
                       ssm__conv_kernel=4, kda__head_dim=64, moe=True),
    "kimi-k3": fam("kimi-k3", "KDA + MLA, V head = kv_lora_rank", "hybrid", attention__head_count_kv=[0, 1, 0, 1],
                   attention__key_length=96, attention__value_length=64, attention__key_length_mla=64,
                   attention__value_length_mla=64, attention__kv_lora_rank=64, rope__dimension_count=32,
                   ssm__conv_kernel=4, kda__head_dim=64, moe=True),
    "jamba-nextn": fam("jamba", "jamba + 1 NextN layer: llama.cpp marks recurrent layers only below n_layer(), so the "
                       "NextN layer (head_count_kv 0) lands in the attention cache with 0-width K/V", "hybrid",
                       nextn_predict_layers=1, attention__head_count_kv=[0, 1, 0, 0], ssm__conv_kernel=4,
                       ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8),
    "granitehybrid-nextn": fam("granitehybrid", "granitehybrid + 1 NextN layer (head_count_kv 0)", "hybrid",
                               nextn_predict_layers=1, attention__head_count_kv=[0, 2, 0, 0], ssm__conv_kernel=4,
                               ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8, ssm__group_count=1),
    # -- pure recurrent -------------------------------------------------------------------------------
    "mamba": fam("mamba", "mamba1 state", "recurrent", attention__head_count=0, ssm__conv_kernel=4,
                 ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8),
    "mamba2": fam("mamba2", "mamba2 state", "recurrent", attention__head_count=0, ssm__conv_kernel=4,
                  ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8, ssm__group_count=1),
    "rwkv6": fam("rwkv6", "RWKV6 token shift + WKV state", "recurrent", attention__head_count=0, wkv__head_size=64,
                 tensors={"blk.{i}.time_mix_lerp_fused.weight": [1]}),
    "rwkv7": fam("rwkv7", "RWKV7 token shift + WKV state", "recurrent", attention__head_count=0, wkv__head_size=64,
                 attention__gate_lora_rank=32),
    # -- no cache -------------------------------------------------------------------------------------
    "bert": fam("bert", "encoder: no KV cache", "none", tokenizer__ggml__token_type_count=2, attention__causal=False),
    "modern-bert": fam("modern-bert", "encoder with symmetric SWA: no KV cache", "none",
                       attention__sliding_window=128, attention__causal=False),
    "gemma-embedding": fam("gemma-embedding", "embedding model: no KV cache", "none", attention__sliding_window=128),
    "dream": fam("dream", "diffusion LM: no KV cache", "none"),
    # -- caches llama.cpp builds from several objects (indexer, compressed, compressor state) ----------
    "deepseek32": fam("deepseek32", "DSA: MLA cache + indexer key cache", "dsa", moe=True, expert_shared_count=1,
                      expert_gating_func=2, **MLA, **INDEXER),
    "glm-dsa": fam("glm-dsa", "DSA: MLA cache + indexer key cache", "dsa", moe=True, expert_shared_count=1,
                   **MLA, **INDEXER),
    "hy-v4-dsa": fam("hy_v4", "indexer.top_k > 0: DSA cache", "dsa", moe=True, expert_shared_count=1,
                     expert_gating_func=2,
                     hyper_connection__count=4, hyper_connection__epsilon=1e-6, hyper_connection__magnitude=2.0,
                     attention__indexer__types=[1, 0, 1, 0], **MLA, **INDEXER),
    "hy-v4-dense": fam("hy_v4", "no indexer (all full-attention checkpoint): a plain MLA cache", "kv", moe=True,
                       expert_shared_count=1, expert_gating_func=2, hyper_connection__count=4, hyper_connection__epsilon=1e-6,
                       hyper_connection__magnitude=2.0, **MLA),
    "minimax-m3": fam("minimax-m3", "MSA cache with an indexer key cache", "msa", moe=True,
                      expert_shared_count=1, expert_gating_func=2, attention__head_count_kv=1,
                      attention__indexer__head_count=1, attention__indexer__key_length=64,
                      attention__indexer__top_k=16, attention__indexer__block_size=4,
                      attention__indexer__local_blocks=1, rope__dimension_count=64),
    "dots3note": fam("dots3note", "DSA + iSWA cache", "dsa_iswa", moe=True, expert_shared_count=1,
                     expert_gating_func=2, leading_dense_block_count=1, attention__kv_lora_rank_swa=64,
                     attention__key_length_swa=96, attention__value_length_swa=64, attention__key_length_mla_swa=64,
                     attention__value_length_mla_swa=64, rope__freq_base_swa=10000.0, attention__sliding_window=128,
                     attention__sliding_window_pattern=[False, True, False, True],
                     attention__indexer__types=[1, 0, 1, 0], **MLA, **INDEXER),
    "deepseek4": fam("deepseek4", "DeepSeek-V4 compressed cache", "dsv4", moe=True, expert_shared_count=1,
                     expert_gating_func=4, expert_weights_scale=1.0, expert_weights_norm=True,
                     attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                     rope__dimension_count=32, attention__q_lora_rank=64, attention__sliding_window=128,
                     swiglu_clamp_exp=10.0, attention__output_group_count=2, attention__output_lora_rank=32,
                     attention__compress_ratios=[0, 0, 4, 128], attention__compress_rope_freq_base=160000.0,
                     hyper_connection__count=4, hyper_connection__sinkhorn_iterations=2,
                     hyper_connection__epsilon=1e-6, hash_layer_count=0, **INDEXER),
    "qwen4exp": fam("qwen4exp", "hybrid cache with a QSA indexer", "hybrid_idx", moe=True,
                    attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                    ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=32, ssm__time_step_rank=4,
                    ssm__group_count=2, rope__dimension_sections=[8, 8, 8, 8], hyper_connection__count=4,
                    hyper_connection__low_rank=8, hyper_connection__sinkhorn_iterations=2,
                    hyper_connection__epsilon=1e-6, attention__indexer__head_count=2,
                    attention__indexer__key_length=64, attention__indexer__top_k=2048,
                    attention__compress_ratios=[4, 4, 4, 4]),
    "glm5-next": fam("glm5-next", "KDA + MLA + DSA indexer (hybrid_idx); dims of llama.cpp's own test fixture",
                     "hybrid_idx", moe=True, expert_shared_count=1, attention__head_count=1,
                     attention__head_count_kv=[1, 0, 1, 0], attention__key_length=512, attention__value_length=512,
                     attention__key_length_mla=192, attention__value_length_mla=128, attention__kv_lora_rank=512,
                     attention__q_lora_rank=512, rope__dimension_count=0, ssm__conv_kernel=4, kda__head_dim=128,
                     attention__indexer__head_count=64, attention__indexer__key_length=128,
                     attention__indexer__top_k=131072, attention__indexer__kpool=4, hyper_connection__count=4,
                     hyper_connection__sinkhorn_iterations=2, hyper_connection__epsilon=1e-6),
    # -- draft models whose cache belongs to their target: the formula must say "unsupported" ----------
    "dflash": fam("dflash", "draft model without its own embeddings/output: llama.cpp needs the target context",
                  "unsupported", target_layers=[0, 1]),
    "dflash-own-embd": fam("dflash", "DFlash draft carrying token_embd/output: llama.cpp builds a plain cache alone",
                           "unsupported", target_layers=[0, 1],
                           tensors={"token_embd.weight": [128, 256], "output.weight": [128, 256]}),
    "gemma4-assistant": fam("gemma4-assistant", "draft model sharing its target's KV cache", "unsupported",
                            embedding_length_out=256,
                            attention__head_count_kv=1, attention__key_length=64, attention__value_length=64,
                            attention__key_length_swa=64, attention__value_length_swa=64,
                            attention__sliding_window=128, attention__sliding_window_pattern=L4_SWA_PERIOD4),
    # -- other architectures with a plain cache (a sample: each has something of its own) --------------
    "t5": fam("t5", "encoder-decoder: the decoder's self-attention cache", "kv", decoder_block_count=4,
              attention__relative_buckets_count=32,
              tensors={"enc.blk.0.attn_rel_b.weight": [2, 32], "dec.blk.0.attn_rel_b.weight": [2, 32]}),
    "hrm-text": fam("hrm_text", "block_count = cache slots (1 layer x 2 H-cycles x (1 L-cycle + 1))", "kv",
                    hrm__layers_per_stack=1, hrm__h_cycles=2, hrm__l_cycles=1),
    "minicpm3": fam("minicpm3", "low-rank Q/KV without MLA keys: full K (96) / V (64) cache", "kv",
                    attention__key_length=96, attention__value_length=64, attention__q_lora_rank=64,
                    attention__kv_lora_rank=64, rope__dimension_count=32),
    "mistral4": fam("mistral4", "derives from deepseek2: MLA K-only cache", "kv", moe=True, expert_shared_count=1,
                    **MLA),
    "eagle3": fam("eagle3", "EAGLE-3 draft head carrying token_embd/output (without them llama.cpp needs the "
                  "target context): a plain cache of its own layer", "kv", block_count=1, target_layers=[0, 1, 2],
                  target_hidden_size=128, tensors={"token_embd.weight": [128, 256], "output.weight": [128, 256]}),
    "llama-embed": fam("llama-embed", "embedding llama: still a KV cache", "kv"),
    "falcon": fam("falcon", "falcon, 1 KV head", "kv", attention__head_count_kv=1),
    "bloom": fam("bloom", "ALiBi, no RoPE", "kv"),
    "qwen3vl": fam("qwen3vl", "M-RoPE sections", "kv", attention__head_count_kv=1, rope__dimension_sections=[8, 12, 12, 0]),
    "nemotron-h-moe": fam("nemotron_h_moe", "nemotron_h with MoE layers", "hybrid", moe=True,
                          attention__head_count_kv=[0, 2, 0, 0], feed_forward_length=[0, 0, 256, 0],
                          ssm__conv_kernel=4, ssm__inner_size=256, ssm__state_size=16, ssm__time_step_rank=8,
                          ssm__group_count=1, expert_shared_feed_forward_length=64),
    "rwkv6qwen2": fam("rwkv6qwen2", "RWKV6 on a Qwen2 body, 1 token shift", "recurrent", attention__head_count_kv=1,
                      wkv__head_size=64, token_shift_count=1, tensors={"blk.{i}.time_mix_lerp_fused.weight": [1]}),
    "arwkv7": fam("arwkv7", "RWKV7 time mix on a transformer body", "recurrent", attention__head_count_kv=1,
                  wkv__head_size=64, attention__gate_lora_rank=32, token_shift_count=1),
    # -- others ---------------------------------------------------------------------------------------
    "nanbeige-loops": fam("nanbeige", "num_loops 2: 4 physical layers run twice, 8 cached layers", "kv", num_loops=2,
                          attention__head_count_kv=1),
    "graniteswitch": fam("graniteswitch", "llama.cpp appends a one-head router layer with its own K/V", "kv",
                         attention__head_count_kv=1, adapters__count=1, adapters__lora_rank=8,
                         adapters__token_ids_activate=[200], adapters__token_ids_substitute=[201]),
}


# ----------------------------------------------------------------------------------------------------
# Defaults for keys llama.cpp asks for that do not decide the cache (by key suffix after "{arch}.")
# ----------------------------------------------------------------------------------------------------

KEY_DEFAULTS: dict[str, tuple[str, Any]] = {
    "attention.layer_norm_rms_epsilon": ("float32", 1e-6),
    "attention.layer_norm_epsilon": ("float32", 1e-5),
    "attention.group_norm_epsilon": ("float32", 1e-5),
    "attention.group_norm_groups": ("uint32", 2),
    "rope.freq_base": ("float32", 10000.0),
    "rope.freq_base_swa": ("float32", 10000.0),
    "rope.dimension_count": ("uint32", 64),
    "rope.dimension_sections": ("array[int32]", [8, 8, 16, 0]),
    "expert_count": ("uint32", 4),
    "expert_used_count": ("uint32", 2),
    "expert_shared_count": ("uint32", 1),
    "expert_feed_forward_length": ("uint32", 64),
    "expert_shared_feed_forward_length": ("uint32", 64),
    "expert_weights_scale": ("float32", 1.0),
    "expert_weights_norm": ("bool", True),
    "expert_gating_func": ("uint32", 1),
    "expert_group_count": ("uint32", 0),
    "expert_group_used_count": ("uint32", 0),
    "leading_dense_block_count": ("uint32", 1),
    "moe_every_n_layers": ("uint32", 1),
    "interleave_moe_layer_step": ("uint32", 1),
    "attention.q_lora_rank": ("uint32", 64),
    "attention.kv_lora_rank": ("uint32", 64),
    "attention.decay_lora_rank": ("uint32", 32),
    "attention.iclr_lora_rank": ("uint32", 32),
    "attention.value_residual_mix_lora_rank": ("uint32", 32),
    "attention.gate_lora_rank": ("uint32", 32),
    "attention.relative_buckets_count": ("uint32", 32),
    "attention.clamp_kqv": ("float32", 8.0),
    "attention.max_alibi_bias": ("float32", 8.0),
    "attention.scale": ("float32", 0.125),
    "attention.output_scale": ("float32", 1.0),
    "attention.value_scale": ("float32", 1.0),
    "attention.temperature_length": ("uint32", 8192),
    "attention.temperature_scale": ("float32", 0.1),
    "attention.causal": ("bool", True),
    "ssm.conv_kernel": ("uint32", 4),
    "ssm.inner_size": ("uint32", 256),
    "ssm.state_size": ("uint32", 16),
    "ssm.time_step_rank": ("uint32", 4),
    "ssm.group_count": ("uint32", 1),
    "ssm.dt_b_c_rms": ("bool", False),
    "wkv.head_size": ("uint32", 64),
    "time_mix_extra_dim": ("uint32", 32),
    "time_decay_extra_dim": ("uint32", 64),
    "rescale_every_n_layers": ("uint32", 0),
    "token_shift_count": ("uint32", 2),
    "shortconv.l_cache": ("uint32", 3),
    "kda.head_dim": ("uint32", 64),
    "kda.gate_lower_bound": ("float32", -5.0),
    "attn_res.block_size": ("uint32", 2),
    "activation.situ_beta": ("float32", 1.0),
    "activation.situ_linear_beta": ("float32", 1.0),
    "expert_latent_length": ("uint32", 64),
    "adapters.router_gain": ("float32", 1.0),
    "swiglu_clamp_exp": ("float32", 7.0),
    "swiglu_clamp_shexp": ("float32", 7.0),
    "logit_scale": ("float32", 1.0),
    "embedding_scale": ("float32", 1.0),
    "residual_scale": ("float32", 1.0),
    "attn_logit_softcapping": ("float32", 50.0),
    "final_logit_softcapping": ("float32", 30.0),
    "router_logit_softcapping": ("float32", 30.0),
    "use_parallel_residual": ("bool", False),
    "swin_norm": ("bool", False),
    "full_attention_interval": ("uint32", 4),
    "hyper_connection.sinkhorn_iterations": ("uint32", 2),
    "hyper_connection.epsilon": ("float32", 1e-6),
    "attention.indexer.kpool_select_tail": ("bool", True),
    "attention.sliding_window": ("uint32", 64),
    "embedding_length_per_layer_input": ("uint32", 64),
    "decoder_start_token_id": ("uint32", 0),
    "pooling_type": ("uint32", 0),
    "decoder_block_count": ("uint32", 4),
}


def _gguf_type(v: Any) -> str:
    if isinstance(v, tuple):
        return v[0]
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "uint32"
    if isinstance(v, float):
        return "float32"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        if all(isinstance(x, bool) for x in v):
            return "array[bool]"
        if all(isinstance(x, int) for x in v):
            return "array[int32]"
        if all(isinstance(x, float) for x in v):
            return "array[float32]"
    raise ValueError(f"cannot infer a GGUF type for {v!r}")


def seed_metadata(family: dict[str, Any]) -> list[list[Any]]:
    arch = family["arch"]
    md: list[list[Any]] = [["general.architecture", "string", arch], ["general.name", "string", f"tiny {arch}"],
                           ["tokenizer.ggml.model", "string", "none"]]
    for k, v in family["meta"].items():
        full = k if k.startswith(("general.", "tokenizer.")) else f"{arch}.{k}"
        t = _gguf_type(v)
        md.append([full, t, v[1] if isinstance(v, tuple) else v])
    return md


# ----------------------------------------------------------------------------------------------------
# child: the discovery loop
# ----------------------------------------------------------------------------------------------------

RE_KEY_MISSING = re.compile(r"(?:array )?key not found in model: (\S+)")
RE_KEY_TYPE = re.compile(r"key (\S+) has wrong type (\S+) but expected type (\S+)")
RE_ARR_ELEM = re.compile(r"(\S+) has wrong array element type (\S+)")
RE_TENSOR_MISSING = re.compile(r"missing tensor '([^']+)'|tensor '([^']+)' not found")
RE_TENSOR_SHAPE = re.compile(r"tensor '([^']+)' has wrong shape; expected ([\d, ]+), got")
RE_BLK = re.compile(r"^blk\.(\d+)\.(.*)$")
RE_REQUESTED = re.compile(r"create_tensor: loading tensor (\S+)")
RE_TOO_MANY = re.compile(r"wrong number of tensors; expected (\d+), got (\d+)")

GGUF_TYPE_NAMES = {"u8": "uint8", "i8": "int8", "u16": "uint16", "i16": "int16", "u32": "uint32", "i32": "int32",
                   "f32": "float32", "bool": "bool", "str": "string", "arr": "array", "u64": "uint64",
                   "i64": "int64", "f64": "float64"}


def _convert(value: Any, type_name: str) -> Any:
    if type_name == "bool":
        return bool(value)
    if type_name.startswith("float"):
        return float(value)
    if type_name == "string":
        return str(value)
    return int(value)


def _error_lines(lines: list[tuple[int, str]]) -> list[str]:
    return [t.strip() for lvl, t in lines if lvl >= 3 and t.strip()]


def fix_from_error(spec: dict[str, Any], err: str, requested: list[str]) -> str | None:
    """Change ``spec`` to get past llama.cpp's error ``err``; return what was done, None if unknown.

    ``requested`` lists the tensors llama.cpp asked for in this attempt (its debug log).
    """
    arch = spec["arch"]
    md = spec["metadata"]
    tensors = spec["tensors"]
    m = RE_TOO_MANY.search(err)
    if m:   # the file has tensors llama.cpp no longer asks for (a branch changed): drop them
        want = set(requested)
        extra = [t[0] for t in tensors if t[0] not in want]
        if not extra:
            return None
        spec["tensors"] = [t for t in tensors if t[0] in want]
        return f"dropped unused {extra}"
    m = RE_TENSOR_SHAPE.search(err)
    if m:
        name, ne = m[1], [int(x) for x in m[2].replace(" ", "").split(",") if x]
        if 0 in ne:   # a size key the family must set is absent (llama.cpp would assert on it)
            spec["zero_dim"] = f"{name} expected {ne}: a size key is missing from the family"
            return None
        for t in tensors:
            if t[0] == name:
                if t[1] == ne:
                    return None
                t[1] = ne
                return f"shape {name} = {ne}"
        return None
    m = RE_TENSOR_MISSING.search(err)
    if m:
        name = m[1] or m[2]
        if any(t[0] == name for t in tensors):
            return None
        ne = [1]
        b = RE_BLK.match(name)
        if b:   # a sibling layer's tensor of the same kind is the best guess
            for t in tensors:
                bb = RE_BLK.match(t[0])
                if bb and bb[2] == b[2]:
                    ne = list(t[1])
        tensors.append([name, ne, "f32"])
        return f"tensor {name}"
    m = RE_KEY_TYPE.search(err)
    if m:
        key, want = m[1], GGUF_TYPE_NAMES.get(m[3], m[3])
        for e in md:
            if e[0] == key:
                if want == "array" or e[1] == want:
                    return None
                e[1], e[2] = want, _convert(e[2], want)
                return f"type {key} = {want}"
        return None
    m = RE_ARR_ELEM.search(err)
    if m:
        return None
    m = RE_KEY_MISSING.search(err)
    if m:
        key = m[1]
        if any(e[0] == key for e in md):
            return None
        suffix = key[len(arch) + 1:] if key.startswith(arch + ".") else key
        if suffix not in KEY_DEFAULTS:
            return None
        t, v = KEY_DEFAULTS[suffix]
        md.append([key, t, v])
        return f"key {key} = {v!r} ({t})"
    return None


CONTEXT_CHECKS = [
    dict(n_ctx=1000, flash_attn="auto"),
    dict(n_ctx=1000, flash_attn="off"),
    dict(n_ctx=1000, flash_attn="on", type_k="q4_0", type_v="q4_0"),
    dict(n_ctx=1000, flash_attn="off", n_seq_max=2, swa_full=False),
]


def child(name: str, progress_path: str, seed_path: str | None = None) -> int:
    from edgekv.core.predict import ContextParams
    from edgekv.runtime.engine import DryRunner, model_params
    from tests.tiny.writer import write_spec

    family = FAMILIES[name]
    spec: dict[str, Any] = {"arch": family["arch"], "note": family["note"], "memory": family["memory"],
                            "metadata": seed_metadata(family), "tensors": seed_tensors(family)}
    if seed_path:
        with open(seed_path) as f:
            spec = json.load(f)
    requested: list[str] = []
    runner = DryRunner()
    lc = runner.llama_cpp
    with tempfile.TemporaryDirectory(prefix="edgekv-discover-") as td:
        path = os.path.join(td, f"{name}.gguf")
        for step in range(MAX_STEPS):
            with open(progress_path, "w") as f:
                json.dump({"spec": spec, "step": step}, f)
            write_spec(path, spec)
            runner.cap.take()
            model = lc.llama_model_load_from_file(path.encode(), model_params(0, True))
            lines = runner.cap.take()
            requested = [m[1] for _, t in lines for m in [RE_REQUESTED.search(t)] if m]
            if model:
                runner.model = model
                break
            errs = _error_lines(lines)
            err = next((e for e in errs if "error loading model" in e), errs[-1] if errs else "no error message")
            did = fix_from_error(spec, err, requested)
            if did is None:
                print(json.dumps({"ok": False, "stage": "load", "error": spec.pop("zero_dim", err), "errors": errs[-6:]}))
                return 1
        else:
            print(json.dumps({"ok": False, "stage": "load", "error": f"no model after {MAX_STEPS} steps"}))
            return 1
        # graph reservation for a few settings (a failure here is an abort, seen by the parent)
        present = {t[0] for t in spec["tensors"]}
        optional_absent = [n for n in dict.fromkeys(requested) if n not in present]
        shape = None
        if family["memory"] not in ("aborts", "unsupported"):
            from edgekv.core.predict import predict
            from edgekv.prediction.api import load_model

            shape = load_model(path).shape
        for c in CONTEXT_CHECKS if family["memory"] != "aborts" else []:
            if shape is not None and predict(shape, ContextParams(**c)).aborts:
                continue        # edgekv says llama.cpp aborts here (tests/real/test_families.py checks that)
            with open(progress_path, "w") as f:
                json.dump({"spec": spec, "step": "context", "context": c, "optional_absent": optional_absent}, f)
            r = runner.context(ContextParams(**c))
            # others may be refused (grok: quantized V, FA forced off); a cache edgekv does not model may
            # be refused outright (a draft model without its target)
            if not r.ok and c is CONTEXT_CHECKS[0] and family["memory"] != "unsupported":
                print(json.dumps({"ok": False, "stage": "context", "error": r.error, "context": c}))
                return 1
        runner.close()
    with open(progress_path, "w") as f:
        json.dump({"spec": spec, "step": "done"}, f)
    print(json.dumps({"ok": True}))
    return 0


# ----------------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------------

def discover(name: str, timeout: float = 300.0) -> tuple[dict[str, Any] | None, str]:
    """Run the discovery child; when graph reservation crashes with the file's tensors, the architecture
    probably uses an optional tensor unconditionally: add every optional tensor llama.cpp asked for
    (shapes then get fixed by the child) and try again."""
    seed = None
    tried: set[str] = set()
    for _attempt in range(4):
        spec, why, last = _discover_once(name, seed, timeout)
        if spec is not None:
            return spec, why
        if not (last and last.get("step") == "context" and last.get("optional_absent")):
            return None, why
        add = [n for n in last["optional_absent"] if n not in tried]
        if not add:
            return None, why
        tried.update(add)
        seed = last["spec"]
        seed["tensors"] = seed["tensors"] + [[n, [1], "f32"] for n in add]
    return None, why


def _discover_once(name: str, seed: dict[str, Any] | None,
                   timeout: float) -> tuple[dict[str, Any] | None, str, dict[str, Any] | None]:
    with tempfile.TemporaryDirectory(prefix="edgekv-discover-") as td:
        prog = os.path.join(td, "progress.json")
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        root = os.path.dirname(os.path.dirname(HERE))
        argv = [sys.executable, "-m", "tests.tiny.discover", "--child", name, prog]
        if seed is not None:
            seed_path = os.path.join(td, "seed.json")
            with open(seed_path, "w") as f:
                json.dump(seed, f)
            argv.append(seed_path)
        p = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        last = None
        if os.path.exists(prog):
            with open(prog) as f:
                last = json.load(f)
        out = [x for x in p.stdout.splitlines() if x.startswith("{")]
        res = json.loads(out[-1]) if out else None
        if res and res.get("ok") and last and last.get("step") == "done":
            return last["spec"], "ok", last
        why = res.get("error") if res else None
        if not why:
            tail = [x for x in p.stderr.splitlines() if x.strip()]
            asserts = [x for x in tail if "GGML_ASSERT" in x or "error" in x.lower() or "terminate" in x]
            why = f"child died (rc {p.returncode}) at step {last.get('step') if last else '?'}" + \
                  (f" {last.get('context')}" if last and last.get("context") else "") + \
                  f": {(asserts or tail or ['?'])[-1][:300]}"
        elif res:
            why = f"{res.get('stage')}: {why}" + (f" {res.get('context')}" if res.get("context") else "")
        return None, why, last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("families", nargs="*", help="family names (default: all)")
    ap.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.child:
        return child(*a.child)
    if a.list:
        for n, f in FAMILIES.items():
            print(f"{n:28} {f['arch']:16} {f['memory']:12} {f['note']}")
        return 0
    names = a.families or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        ap.error(f"unknown families: {unknown}")
    specs: dict[str, Any] = {}
    if os.path.exists(SPECS_PATH):
        with open(SPECS_PATH) as f:
            specs = json.load(f).get("families", {})
    specs = {k: v for k, v in specs.items() if k in FAMILIES}
    failed = {}
    for n in names:
        t0 = time.time()
        spec, why = discover(n)
        dt = time.time() - t0
        if spec is None:
            failed[n] = why
            specs.pop(n, None)
            print(f"FAIL {n:28} {dt:5.1f}s {why}", flush=True)
        else:
            specs[n] = spec
            print(f"ok   {n:28} {dt:5.1f}s {len(spec['tensors'])} tensors, {len(spec['metadata'])} keys", flush=True)
    import llama_cpp

    out = {
        "comment": "Generated by `python -m tests.tiny.discover` against llama-cpp-python "
                   f"{llama_cpp.__version__}; regenerate after upgrading it. Tensor shapes are ggml ne order.",
        "llama_cpp_python": llama_cpp.__version__,
        "families": {k: specs[k] for k in FAMILIES if k in specs},
    }
    with open(SPECS_PATH, "w") as f:
        f.write(_dump(out))
    if failed:
        print(f"\n{len(failed)} families failed:")
        for n, why in failed.items():
            print(f"  {n}: {why}")
    return 1 if failed else 0


def _dump(out: dict[str, Any]) -> str:
    """JSON with one metadata entry / tensor per line: reviewable diffs when llama.cpp changes."""
    lines = ["{"]
    lines.append(f'  "comment": {json.dumps(out["comment"])},')
    lines.append(f'  "llama_cpp_python": {json.dumps(out["llama_cpp_python"])},')
    lines.append('  "families": {')
    fams = list(out["families"].items())
    for i, (n, s) in enumerate(fams):
        lines.append(f"    {json.dumps(n)}: {{")
        for k in ("arch", "note", "memory"):
            lines.append(f"      {json.dumps(k)}: {json.dumps(s[k])},")
        lines.append('      "metadata": [')
        lines.append(",\n".join(f"        {json.dumps(e)}" for e in s["metadata"]))
        lines.append("      ],")
        lines.append('      "tensors": [')
        lines.append(",\n".join(f"        {json.dumps(t)}" for t in s["tensors"]))
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(fams) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
