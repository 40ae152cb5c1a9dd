"""GGUF metadata -> ModelShape, following llama.cpp's own loader.

This is a port of the memory-relevant parts of llama.cpp's ``llama_model::load_hparams`` (the
generic part, src/llama-model.cpp:1320-1470), each architecture's ``load_arch_hparams``
(src/models/*.cpp) and ``llama_model::create_memory`` (src/llama-model.cpp:2352), as vendored in
llama-cpp-python 0.3.36.  The references in comments point into that tree.  Where llama.cpp reads a
key, this reads the same key with the same default; where llama.cpp ignores a key for an
architecture, so does this.  docs/predict.md (The KV cache) states the rules.

This module is the shape builder: the generic ``load_hparams`` and ``create_memory``.  The key names and
architecture sets are in :mod:`edgekv.core.archtables`, the ``llama_hparams`` mirror in :mod:`edgekv.core.hparams`
and each architecture's ``load_arch_hparams`` in :mod:`edgekv.core.archrules`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from edgekv.core.archrules import ARCH_RULES, GLM_5_2_DEFAULT_INDEXER_TYPES
from edgekv.core.archtables import (
    HYBRID_ARCHS,
    K_ARCH,
    K_BLOCK_COUNT,
    K_CAUSAL,
    K_COMPRESS_RATIOS,
    K_CONTEXT_LENGTH,
    K_EMBEDDING_LENGTH,
    K_FF,
    K_FULL_ATTENTION_INTERVAL,
    K_HEAD_COUNT,
    K_HEAD_COUNT_KV,
    K_INDEXER_KEY_LENGTH,
    K_INDEXER_KPOOL,
    K_INDEXER_TOP_K,
    K_INDEXER_TYPES,
    K_KDA_HEAD_DIM,
    K_KEY_LENGTH,
    K_KEY_LENGTH_MLA,
    K_KEY_LENGTH_SWA,
    K_KV_LORA_RANK,
    K_LEADING_DENSE,
    K_NAME,
    K_NEXTN,
    K_NUM_LOOPS,
    K_RECURRENT_LAYERS,
    K_SHARED_KV_LAYERS,
    K_SHORTCONV_L_CACHE,
    K_SLIDING_WINDOW,
    K_SLIDING_WINDOW_PATTERN,
    K_SSM_CONV_KERNEL,
    K_SSM_GROUP_COUNT,
    K_SSM_INNER_SIZE,
    K_SSM_STATE_SIZE,
    K_TOKEN_SHIFT_COUNT,
    K_TOKENS,
    K_VALUE_LENGTH,
    K_VALUE_LENGTH_MLA,
    K_VALUE_LENGTH_SWA,
    K_VOCAB_SIZE,
    K_WKV_HEAD_SIZE,
    LLAMA_ARCHITECTURES,
    LLAMA_MAX_LAYERS,
    NO_CACHE_ARCHS,
    RECURRENT_ARCHS,
    RS_ROLLBACK_ARCHS,
    SPECIAL_MEMORY,
    UNSUPPORTED_CACHES,
    key,
)
from edgekv.core.hparams import HParams, is_int
from edgekv.core.metadata import ArraySummary
from edgekv.core.shape import (
    MEMORY_DSA,
    MEMORY_DSA_ISWA,
    MEMORY_DSV4,
    MEMORY_HYBRID,
    MEMORY_HYBRID_IDX,
    MEMORY_HYBRID_ISWA,
    MEMORY_ISWA,
    MEMORY_KV,
    MEMORY_MSA,
    MEMORY_NONE,
    MEMORY_RECURRENT,
    MEMORY_UNSUPPORTED,
    SWA_NONE,
    LayerShape,
    ModelShape,
)
from edgekv.errors import GGUFFormatError, MetadataError

# the tables' and rules' public names, importable from here as before the split
__all__ = [
    "ARCH_RULES",
    "GLM_5_2_DEFAULT_INDEXER_TYPES",
    "HYBRID_ARCHS",
    "K_ARCH",
    "K_BLOCK_COUNT",
    "K_CAUSAL",
    "K_COMPRESS_RATIOS",
    "K_CONTEXT_LENGTH",
    "K_EMBEDDING_LENGTH",
    "K_FF",
    "K_FULL_ATTENTION_INTERVAL",
    "K_HEAD_COUNT",
    "K_HEAD_COUNT_KV",
    "K_INDEXER_KEY_LENGTH",
    "K_INDEXER_KPOOL",
    "K_INDEXER_TOP_K",
    "K_INDEXER_TYPES",
    "K_KDA_HEAD_DIM",
    "K_KEY_LENGTH",
    "K_KEY_LENGTH_MLA",
    "K_KEY_LENGTH_SWA",
    "K_KV_LORA_RANK",
    "K_LEADING_DENSE",
    "K_NAME",
    "K_NEXTN",
    "K_NUM_LOOPS",
    "K_RECURRENT_LAYERS",
    "K_SHARED_KV_LAYERS",
    "K_SHORTCONV_L_CACHE",
    "K_SLIDING_WINDOW",
    "K_SLIDING_WINDOW_PATTERN",
    "K_SSM_CONV_KERNEL",
    "K_SSM_GROUP_COUNT",
    "K_SSM_INNER_SIZE",
    "K_SSM_STATE_SIZE",
    "K_TOKENS",
    "K_TOKEN_SHIFT_COUNT",
    "K_VALUE_LENGTH",
    "K_VALUE_LENGTH_MLA",
    "K_VALUE_LENGTH_SWA",
    "K_VOCAB_SIZE",
    "K_WKV_HEAD_SIZE",
    "LLAMA_ARCHITECTURES",
    "LLAMA_MAX_LAYERS",
    "NO_CACHE_ARCHS",
    "RECURRENT_ARCHS",
    "RS_ROLLBACK_ARCHS",
    "SPECIAL_MEMORY",
    "UNSUPPORTED_CACHES",
    "key",
    "shape_from_metadata",
]


def _n_vocab(meta: Mapping[str, Any], arch: str) -> int:
    v = meta.get(key(K_VOCAB_SIZE, arch))
    if is_int(v):
        return v
    toks = meta.get(K_TOKENS)
    if isinstance(toks, (list, ArraySummary)):
        return len(toks)
    return 0


# long: llama.cpp's load_hparams read in its order; one key after another
def shape_from_metadata(meta: Mapping[str, Any], source: str = "<model>",
                        value_types: Mapping[str, str] | None = None) -> ModelShape:
    """Build the ModelShape llama.cpp would build from this GGUF metadata.

    ``value_types`` (from the header reader) makes the loader as strict as llama.cpp about the GGUF
    type of each key; without it, any integer type is accepted.
    """
    arch = meta.get(K_ARCH)
    if not isinstance(arch, str):
        if K_ARCH in meta:
            raise GGUFFormatError(f"{source}: '{K_ARCH}' is not a string")
        raise MetadataError(f"{source}: required key '{K_ARCH}' is missing; this GGUF does not say what model it is")
    h = HParams(meta=meta, arch=arch, source=source, value_types=value_types)
    if arch not in LLAMA_ARCHITECTURES:
        # a newer llama.cpp may know it: the formula does not guess, --engine asks the installed llama.cpp
        return _unsupported_shape(h, meta.get(K_NAME), (
            f"architecture '{arch}' is not one llama-cpp-python 0.3.36's llama.cpp knows, so edgekv does not know "
            "which caches llama.cpp builds for it (use --engine to ask the installed llama.cpp)"))
    name = meta.get(K_NAME)

    if arch in UNSUPPORTED_CACHES and arch == "clip":
        return _unsupported_shape(h, name, UNSUPPORTED_CACHES[arch])

    # generic part of load_hparams (src/llama-model.cpp:1320-1470)
    h.n_ctx_train = h.u32(K_CONTEXT_LENGTH, required=True)
    h.n_embd = h.u32(K_EMBEDDING_LENGTH, required=True)
    h.causal = h.flag(K_CAUSAL, True)
    h.n_layer_all = h.u32(K_BLOCK_COUNT, required=True)
    if not 0 < h.n_layer_all <= LLAMA_MAX_LAYERS:
        raise MetadataError(f"{source}: '{h.k(K_BLOCK_COUNT)}' = {h.n_layer_all} is outside 1..{LLAMA_MAX_LAYERS}")
    h.n_layer_nextn = h.u32(K_NEXTN, 0)
    if h.n_layer_nextn > h.n_layer_all:
        raise MetadataError(f"{source}: '{h.k(K_NEXTN)}' = {h.n_layer_nextn} exceeds the block count {h.n_layer_all}")
    h.n_ff, _ = h.u32_or_arr(K_FF, None)
    h.n_head, _ = h.u32_or_arr(K_HEAD_COUNT, None)
    h.n_head_kv, _ = h.u32_or_arr(K_HEAD_COUNT_KV, h.n_head)     # defaults to a copy of head_count
    h.is_swa = [False] * h.n_layer_all
    h.is_recr = [arch in RECURRENT_ARCHS] * h.n_layer_all
    h.is_indexer_full = [False] * LLAMA_MAX_LAYERS       # llama-model.cpp:1385
    h.compress_ratios = [0] * LLAMA_MAX_LAYERS
    if h.n_head[0] > 0:
        h.head_k_full = h.u32(K_KEY_LENGTH, h.n_embd // h.n_head[0])
        h.head_v_full = h.u32(K_VALUE_LENGTH, h.n_embd // h.n_head[0])
    h.head_k_swa = h.u32(K_KEY_LENGTH_SWA, h.head_k_full)
    h.head_v_swa = h.u32(K_VALUE_LENGTH_SWA, h.head_v_full)
    h.n_vocab = _n_vocab(meta, arch)

    rule = ARCH_RULES.get(arch)
    if rule is not None:
        rule(h)

    if arch in UNSUPPORTED_CACHES:
        return _finish(h, name, MEMORY_UNSUPPORTED, UNSUPPORTED_CACHES[arch])
    if arch == "hy_v4" and h.indexer_top_k > 0:
        return _finish(h, name, MEMORY_DSA, None)          # llama-model.cpp:2494-2537
    if arch == "qwen4exp" and h.swa_type == SWA_NONE:
        return _finish(h, name, MEMORY_HYBRID_IDX, None)   # llama-model.cpp:2706-2712, 2734-2752
    if arch in SPECIAL_MEMORY:
        return _finish(h, name, SPECIAL_MEMORY[arch], None)
    if arch in NO_CACHE_ARCHS:
        return _finish(h, name, MEMORY_NONE, None)
    if arch in RECURRENT_ARCHS:
        return _finish(h, name, MEMORY_RECURRENT, None)
    if arch in HYBRID_ARCHS:
        return _finish(h, name, MEMORY_HYBRID_ISWA if h.swa_type != SWA_NONE else MEMORY_HYBRID, None)
    if h.swa_type != SWA_NONE:
        if not any(h.is_swa):
            raise MetadataError(
                f"{source}: {arch} uses sliding-window attention but no layer is marked SWA "
                f"('{h.k(K_SLIDING_WINDOW_PATTERN)}'); llama.cpp would abort")
        return _finish(h, name, MEMORY_ISWA, None)
    return _finish(h, name, MEMORY_KV, None)


def _unsupported_shape(h: HParams, name: Any, reason: str) -> ModelShape:
    return ModelShape(
        arch=h.arch, name=str(name or ""), n_layer_all=0, n_layer_nextn=0, n_embd=0, n_ctx_train=0,
        n_vocab=0, causal=True, memory=MEMORY_UNSUPPORTED, swa_type=SWA_NONE, n_swa=0, is_mla=False,
        head_k_mla=0, head_v_mla=0, n_embd_r=0, n_embd_s=0, supports_rs_rollback=False, layers=(),
        unsupported_reason=reason,
    )


def _n_embd_r(h: HParams) -> int:
    # src/llama-hparams.cpp n_embd_r()
    if h.wkv_head_size:
        return h.token_shift_count * h.n_embd
    if h.n_shortconv_l_cache:
        return h.n_embd * (h.n_shortconv_l_cache - 1)
    if h.n_embd_head_kda:
        return 3 * (h.ssm_d_conv - 1 if h.ssm_d_conv > 0 else 3) * h.n_head[0] * h.n_embd_head_kda
    return (h.ssm_d_conv - 1 if h.ssm_d_conv > 0 else 0) * (h.ssm_d_inner + 2 * h.ssm_n_group * h.ssm_d_state)


def _n_embd_s(h: HParams) -> int:
    # src/llama-hparams.cpp n_embd_s()
    if h.wkv_head_size:
        return h.n_embd * h.wkv_head_size
    if h.n_embd_head_kda:
        return h.n_embd_head_kda * h.n_embd_head_kda * h.n_head[0]
    if h.n_embd_head_la:
        return h.n_embd_head_la * h.n_embd_head_la * h.n_head[0]
    return h.ssm_d_state * h.ssm_d_inner


def _attn_filter(h: HParams, memory: str) -> Callable[[int], bool]:
    n_layer = h.n_layer
    if h.arch in ("hy_v4", "minimax-m3", "deepseek4"):
        # create_memory passes no layer filter for these (llama-model.cpp:2380-2395, 2498-2535, 2611-2627):
        # NextN layers get main-context cache too
        return lambda il: True
    if memory in (MEMORY_HYBRID, MEMORY_HYBRID_ISWA, MEMORY_HYBRID_IDX):
        # create_memory, hybrid branch (src/llama-model.cpp:2684-2712) and the hybrid defaults
        if h.arch == "falcon-h1":
            return lambda il: True
        if h.arch in ("nemotron_h", "nemotron_h_moe"):
            return lambda il: not h.is_recr[il] and h.n_ff[il] == 0
        if h.arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01", "glm5-next"):
            return lambda il: il < n_layer and not h.is_recr[il]
        return lambda il: not h.is_recr[il]
    # plain / iSWA: NextN layers are filtered out of the main context unless the "nextn" slot is a router
    if h.n_layer_nextn > 0 and n_layer > 0 and h.router_layer < 0:
        return lambda il: il < n_layer
    return lambda il: True


def _recr_filter(h: HParams, memory: str) -> Callable[[int], bool]:
    n_layer = h.n_layer
    if memory == MEMORY_RECURRENT:
        return lambda il: il < n_layer
    if h.arch == "falcon-h1":
        return lambda il: il < n_layer
    if h.arch in ("nemotron_h", "nemotron_h_moe"):
        return lambda il: il < n_layer and h.is_recr[il] and h.n_ff[il] == 0
    return lambda il: il < n_layer and h.is_recr[il]


def _indexer_filter(h: HParams, memory: str) -> Callable[[int], bool]:
    """Layers with an indexer key cache, as create_memory's filter_lid / filter_idx choose them."""
    n_layer = h.n_layer
    full = h.is_indexer_full
    if memory == MEMORY_DSA and h.arch == "hy_v4":
        return lambda il: bool(full[il])                                 # llama-model.cpp:2517
    if memory == MEMORY_DSA and h.arch == "glm-dsa":
        return lambda il: il < n_layer and bool(full[il])                # llama-model.cpp:2431
    if memory == MEMORY_DSA:
        return lambda il: il < n_layer                                   # deepseek32, llama-model.cpp:2431
    if memory == MEMORY_DSA_ISWA:
        return lambda il: il < n_layer and bool(full[il])                # llama-model.cpp:2568
    if memory == MEMORY_MSA:
        return lambda il: il >= h.n_layer_dense_lead                     # llama-model.cpp:2378-2379
    if memory == MEMORY_HYBRID_IDX and h.arch == "glm5-next":
        return lambda il: il < n_layer and not h.is_recr[il] and bool(full[il])   # llama-model.cpp:2457-2459
    if memory == MEMORY_HYBRID_IDX:
        return lambda il: il < n_layer and not h.is_recr[il]            # qwen4exp, llama-model.cpp:2706-2711
    if memory == MEMORY_DSV4:
        return lambda il: h.compress_ratios[il] == 4                     # filter_csa, llama-kv-cache-dsv4.cpp:1273-1279
    return lambda il: False


# long: per-layer arrays checked and assembled in llama.cpp's order; one check per hparam
def _finish(h: HParams, name: Any, memory: str, reason: str | None) -> ModelShape:
    n = h.n_layer_all
    for arr_name in ("n_head", "n_head_kv", "n_ff", "is_swa", "is_recr"):
        arr = getattr(h, arr_name)
        if len(arr) < n:
            arr.extend([arr[-1] if arr else 0] * (n - len(arr)))
    is_mla = h.head_k_mla != 0 and h.head_v_mla != 0
    attn = _attn_filter(h, memory) if memory not in (MEMORY_NONE, MEMORY_UNSUPPORTED, MEMORY_RECURRENT) else (lambda il: False)
    recr = (_recr_filter(h, memory) if memory in (MEMORY_RECURRENT, MEMORY_HYBRID, MEMORY_HYBRID_ISWA, MEMORY_HYBRID_IDX)
            else (lambda il: False))
    kv_from = h.n_layer_kv_from_start
    shares_kv = memory != MEMORY_UNSUPPORTED and h.arch in ("gemma3n", "gemma4")
    if shares_kv and kv_from < 2:
        # create_memory's reuse callback runs for every layer and first asserts n_layer_kv_from_start >= 2
        # (src/llama-model.cpp:2780-2782); gemma4 sets it to block_count - shared_kv_layers (gemma4.cpp:8-11)
        raise MetadataError(
            f"{h.source}: only {kv_from} layers own a KV cache ('{h.k(K_SHARED_KV_LAYERS)}'); llama.cpp needs at least 2")
    if memory == MEMORY_DSA and h.arch == "hy_v4" and h.n_layer_nextn > 0:
        # filter_lid calls is_indexer_full(il) for every layer, which aborts past n_layer() (llama-hparams.cpp:305-311)
        raise MetadataError(f"{h.source}: hy_v4 with an indexer and NextN layers: llama.cpp aborts creating the cache "
                            "(is_indexer_full out of bounds)")
    idx = _indexer_filter(h, memory)
    layers = []
    for il in range(n):
        is_swa = bool(h.is_swa[il])
        has_kv = kv_from < 0 or il < kv_from
        reuses = None
        if not has_kv and h.arch in ("gemma3n", "gemma4"):
            reuses = kv_from - (2 if is_swa else 1)
        layers.append(LayerShape(
            index=il,
            n_head=h.n_head[il],
            n_head_kv=h.n_head_kv[il],
            head_k=h.head_k_swa if is_swa else h.head_k_full,
            head_v=h.head_v_swa if is_swa else h.head_v_full,
            n_ff=h.n_ff[il],
            is_swa=is_swa,
            is_recurrent=bool(h.is_recr[il]),
            is_nextn=il >= h.n_layer and h.router_layer < 0,
            has_kv=has_kv,
            attn_cache=has_kv and attn(il),
            recr_state=recr(il),
            reuses=reuses,
            indexer=idx(il),
            compress_ratio=int(h.compress_ratios[il]) if memory == MEMORY_DSV4 else 0,
        ))
    if shares_kv:
        # A shared layer reads layer kv_from-2 if it is SWA, else kv_from-1, from the iSWA sub-cache of its
        # own kind; a target of the other kind is not in that sub-cache and llama_kv_cache's reuse pass
        # asserts (src/llama-kv-cache.cpp:268, src/llama-kv-cache-iswa.cpp:53-67).
        for lay in layers:
            if lay.reuses is not None and layers[lay.reuses].is_swa != lay.is_swa:
                kind = "SWA" if lay.is_swa else "full-attention"
                raise MetadataError(
                    f"{h.source}: shared-KV layer {lay.index} ({kind}) would reuse layer {lay.reuses}, which is "
                    f"not {kind} ('{h.k(K_SLIDING_WINDOW_PATTERN)}', '{h.k(K_SHARED_KV_LAYERS)}'); llama.cpp aborts")
    notes = list(h.notes)
    if memory == MEMORY_NONE:
        notes.append(f"{h.arch}: llama.cpp creates no KV cache for this architecture")
    return ModelShape(
        arch=h.arch,
        name=str(name or ""),
        n_layer_all=n,
        n_layer_nextn=h.n_layer_nextn,
        n_embd=h.n_embd,
        n_ctx_train=h.n_ctx_train,
        n_vocab=h.n_vocab,
        causal=h.causal,
        memory=memory,
        swa_type=h.swa_type,
        n_swa=h.n_swa,
        is_mla=is_mla,
        head_k_mla=h.head_k_mla,
        head_v_mla=h.head_v_mla,
        n_embd_r=_n_embd_r(h),
        n_embd_s=_n_embd_s(h),
        supports_rs_rollback=h.arch in RS_ROLLBACK_ARCHS,
        layers=tuple(layers),
        unsupported_reason=reason,
        notes=tuple(notes),
        indexer_head_k=h.indexer_head_size,
        indexer_kpool=h.indexer_kpool,
    )
