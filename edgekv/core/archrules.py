"""Each architecture's ``load_arch_hparams`` (llama.cpp src/models/*.cpp), memory-relevant parts only.

``ARCH_RULES`` maps an architecture name to the function that reads its own keys into :class:`HParams` after the
generic part of ``load_hparams``; an architecture without an entry has no keys of its own that change memory.
References point into the llama.cpp tree vendored in llama-cpp-python 0.3.36.
"""

from __future__ import annotations

from collections.abc import Callable

from edgekv.core.archtables import (
    K_COMPRESS_RATIOS,
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
    K_NUM_LOOPS,
    K_SHARED_KV_LAYERS,
    K_SHORTCONV_L_CACHE,
    K_SLIDING_WINDOW,
    K_SLIDING_WINDOW_PATTERN,
    K_SSM_CONV_KERNEL,
    K_SSM_GROUP_COUNT,
    K_SSM_INNER_SIZE,
    K_SSM_STATE_SIZE,
    K_TOKEN_SHIFT_COUNT,
    K_VALUE_LENGTH,
    K_VALUE_LENGTH_MLA,
    K_VALUE_LENGTH_SWA,
    K_WKV_HEAD_SIZE,
    LLAMA_MAX_LAYERS,
)
from edgekv.core.hparams import HParams
from edgekv.core.metadata import ArraySummary
from edgekv.core.shape import SWA_CHUNKED, SWA_NONE, SWA_STANDARD, SWA_SYMMETRIC
from edgekv.errors import MetadataError


def _swa_if_window(n_pattern: int, dense_first: bool = False, forced_n_swa: int | None = None):
    """afmoe, mellum, olmo2, plamo3, smallthinker, laguna: SWA only when sliding_window > 0."""

    def rule(h: HParams) -> None:
        n_swa = h.u32(K_SLIDING_WINDOW, 0)
        if n_swa > 0:
            h.n_swa = forced_n_swa if forced_n_swa is not None else n_swa
            h.swa_type = SWA_STANDARD
            h.load_swa_pattern(n_pattern, dense_first)
        else:
            h.n_swa = n_swa
            h.swa_type = SWA_NONE

    return rule


def _swa_always(n_pattern: int, dense_first: bool = False, default_n_swa: int = 0, window_required: bool = False):
    """gemma2, cohere2, cohere2moe, gpt-oss, exaone-moe, muse-glimmer, gemma3n: always SWA."""

    def rule(h: HParams) -> None:
        h.swa_type = SWA_STANDARD
        h.n_swa = h.u32(K_SLIDING_WINDOW, default_n_swa, required=window_required)
        h.load_swa_pattern(n_pattern, dense_first)

    return rule


def _swa_array(window_required: bool = True):
    """gemma4, granite_swa, mimo2, step35, spark2_5, maple: a per-layer bool array is required."""

    def rule(h: HParams) -> None:
        h.swa_type = SWA_STANDARD
        h.require_swa_array()
        h.n_swa = h.u32(K_SLIDING_WINDOW, 0, required=window_required)

    return rule


def _gemma3(h: HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.n_swa = n_swa
        h.swa_type = SWA_STANDARD
        h.load_swa_pattern(6)
    else:
        h.n_swa = n_swa or 0
        h.swa_type = SWA_NONE


def _gemma3n(h: HParams) -> None:
    _swa_always(5, window_required=True)(h)
    h.n_layer_kv_from_start = 20          # gemma3n.cpp:7, hard-coded, no GGUF key


def _gemma4(h: HParams) -> None:
    _swa_array()(h)
    shared = h.u32(K_SHARED_KV_LAYERS, 0)
    h.n_layer_kv_from_start = h.n_layer_all - shared
    h.head_k_swa = h.u32(K_KEY_LENGTH_SWA, required=True)
    h.head_v_swa = h.u32(K_VALUE_LENGTH_SWA, required=True)


def _llama4(h: HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa == 0:
        h.swa_type = SWA_NONE
        h.n_swa = 0
    else:
        h.swa_type = SWA_CHUNKED
        h.n_swa = 8192                    # llama4.cpp:14: forced, the key only switches it off
        h.load_swa_pattern(4)


def _exaone4(h: HParams) -> None:
    if h.n_layer == 64:                   # exaone4.cpp:4: only the 32B uses SWA
        h.swa_type = SWA_STANDARD
        h.n_swa = 4096
        h.load_swa_pattern(4)
    h.n_swa = h.u32(K_SLIDING_WINDOW, h.n_swa)


def _phi3(h: HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.swa_type = SWA_NONE
        h.n_swa = 0
        h.set_swa_pattern(1)
        h.notes.append("phi3: llama.cpp disables sliding-window attention for Phi-3 (full-size cache on every layer)")


def _modern_bert(h: HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa:
        h.swa_type = SWA_SYMMETRIC
        h.n_swa = n_swa
        h.load_swa_pattern(3, True)


def _gemma_embedding(h: HParams) -> None:
    h.swa_type = SWA_SYMMETRIC
    h.load_swa_pattern(6)
    h.n_swa = h.u32(K_SLIDING_WINDOW, required=True)
    h.causal = False


def _mla(required: bool):
    def rule(h: HParams) -> None:
        h.head_k_mla = h.u32(K_KEY_LENGTH_MLA, 0, required=required)
        h.head_v_mla = h.u32(K_VALUE_LENGTH_MLA, 0, required=required)

    return rule


def _hy_v4(h: HParams) -> None:
    _mla(True)(h)
    h.indexer_top_k = h.u32(K_INDEXER_TOP_K, 0)
    # hy-v4.cpp:45-62: DSA only when indexer.top_k > 0; indexer.types (n_layer() long) marks the layers that
    # own an indexer, default none; layer 0 must own one
    if h.indexer_top_k > 0:
        h.indexer_head_size = h.u32(K_INDEXER_KEY_LENGTH, 0)
        h.is_indexer_full = [bool(x) for x in h.u32_or_arr_n(K_INDEXER_TYPES, h.n_layer, [0] * LLAMA_MAX_LAYERS)]
        if not h.is_indexer_full[0]:
            raise MetadataError(f"{h.source}: hy_v4: layer 0 must own an indexer ('{h.k(K_INDEXER_TYPES)}'); "
                                "llama.cpp refuses this model")


def _indexer(h: HParams) -> None:
    """deepseek32.cpp:22-24, glm-dsa.cpp:49-51, minimax-m3.cpp:9-13, dots3note.cpp:30-32: required keys."""
    h.indexer_head_size = h.u32(K_INDEXER_KEY_LENGTH, required=True)
    h.indexer_top_k = h.u32(K_INDEXER_TOP_K, required=True)


def _deepseek32(h: HParams) -> None:
    _mla(False)(h)
    _indexer(h)
    h.n_layer_dense_lead = h.u32(K_LEADING_DENSE, 0)


# glm-dsa.cpp:6-27: GLM-5.2's indexer layout, used when n_ctx_train >= 1M and the GGUF has no indexer.types
GLM_5_2_DEFAULT_INDEXER_TYPES = [1, 1] + [1, 0, 0, 0] * 19


def _glm_dsa(h: HParams) -> None:
    _deepseek32(h)
    # glm-dsa.cpp:59-66: GLM 5 / 5.1 (n_ctx_train < 1M) index every layer, GLM 5.2 uses its default table;
    # indexer.types (n_layer() entries) overrides either
    base = [1] * LLAMA_MAX_LAYERS if h.n_ctx_train < 1048576 else (
        GLM_5_2_DEFAULT_INDEXER_TYPES + [0] * (LLAMA_MAX_LAYERS - len(GLM_5_2_DEFAULT_INDEXER_TYPES)))
    h.is_indexer_full = [bool(x) for x in h.u32_or_arr_n(K_INDEXER_TYPES, h.n_layer, base)]


def _dots3note(h: HParams) -> None:
    # dots3note.cpp:14-33: MLA (required), SWA from a required bool array, indexer.types a required array
    _mla(True)(h)
    h.n_layer_dense_lead = h.u32(K_LEADING_DENSE, required=True)
    h.swa_type = SWA_STANDARD
    h.n_swa = h.u32(K_SLIDING_WINDOW, required=True)
    arr = h.bool_arr(K_SLIDING_WINDOW_PATTERN)
    if arr is None:
        raise MetadataError(
            f"{h.source}: array key '{h.k(K_SLIDING_WINDOW_PATTERN)}' is missing; llama.cpp cannot load this model")
    h.is_swa = arr[: h.n_layer_all]
    _indexer(h)
    h.is_indexer_full = [bool(x) for x in h.arr_n(K_INDEXER_TYPES, [0] * LLAMA_MAX_LAYERS, required=True)]


def _minimax_m3(h: HParams) -> None:
    # minimax-m3.cpp:3-13
    h.n_layer_dense_lead = h.u32(K_LEADING_DENSE, 0)
    _indexer(h)


def _deepseek4(h: HParams) -> None:
    # deepseek4.cpp:30-74 (the NextN probe at 20-26 needs the tensor table: a GGUF that declares NextN layers
    # without their tensors is read as having them)
    h.n_swa = h.u32(K_SLIDING_WINDOW, required=True)
    _indexer(h)
    name = h.k(K_COMPRESS_RATIOS)
    v = h.meta.get(name)
    n = v.length if isinstance(v, ArraySummary) else len(v) if isinstance(v, list) else 0
    if n < h.n_layer_all:
        raise MetadataError(f"{h.source}: DeepSeek-V4 '{name}' is shorter than block_count; llama.cpp refuses this model")
    h.compress_ratios = h.arr_n(K_COMPRESS_RATIOS, [0] * LLAMA_MAX_LAYERS)
    h.swa_type = SWA_STANDARD
    h.set_swa_pattern(0)
    for il in range(h.n_layer, h.n_layer_all):
        h.is_swa[il] = True


def _qwen4exp(h: HParams) -> None:
    # qwen4exp.cpp: SSM keys, indexer keys all required and non-zero, then the qwen3next layer rule
    _mamba2(h)
    for tmpl in (K_INDEXER_KEY_LENGTH, K_INDEXER_TOP_K):
        if not h.u32(tmpl, 0):
            raise MetadataError(f"{h.source}: '{h.k(tmpl)}' must be non-zero; llama.cpp refuses this model")
    h.indexer_head_size = h.u32(K_INDEXER_KEY_LENGTH)
    h.indexer_top_k = h.u32(K_INDEXER_TOP_K)
    h.recr_by_interval(4)


def _glm5_next(h: HParams) -> None:
    # glm5-next.cpp: MLA + KDA; recurrent layers are those with head_count_kv == 0 (all n_layer_all layers)
    _mla(True)(h)
    h.ssm_d_conv = h.u32(K_SSM_CONV_KERNEL, required=True)
    h.n_embd_head_kda = h.u32(K_KDA_HEAD_DIM, required=True)
    h.recr_by_head_count_kv()
    _indexer(h)
    h.indexer_kpool = h.u32(K_INDEXER_KPOOL, required=True)
    if not (h.indexer_kpool > 1 and h.indexer_top_k % h.indexer_kpool == 0):
        raise MetadataError(f"{h.source}: glm5-next needs indexer.kpool > 1 dividing indexer.top_k; llama.cpp aborts")
    h.is_indexer_full = [bool(x) for x in h.u32_or_arr_n(K_INDEXER_TYPES, h.n_layer, [1] * LLAMA_MAX_LAYERS)]


def _mamba1(h: HParams) -> None:
    h.ssm_d_conv = h.u32(K_SSM_CONV_KERNEL, required=True)
    h.ssm_d_inner = h.u32(K_SSM_INNER_SIZE, required=True)
    h.ssm_d_state = h.u32(K_SSM_STATE_SIZE, required=True)


def _mamba2(h: HParams) -> None:
    _mamba1(h)
    h.ssm_n_group = h.u32(K_SSM_GROUP_COUNT, required=True)


def _rwkv(h: HParams) -> None:
    h.wkv_head_size = h.u32(K_WKV_HEAD_SIZE, required=True)
    h.token_shift_count = h.u32(K_TOKEN_SHIFT_COUNT, 2)


def _jamba(h: HParams) -> None:
    _mamba1(h)
    h.recr_by_head_count_kv(upto=h.n_layer)     # jamba.cpp:11-13: only trunk layers (il < n_layer())


def _mamba2_hybrid(h: HParams) -> None:
    """granitehybrid: mamba2 layers are those with head_count_kv == 0."""
    _mamba2(h)
    h.recr_by_head_count_kv(upto=h.n_layer)     # granite-hybrid.cpp:23-25: il < n_layer() only


def _plamo2(h: HParams) -> None:
    _mamba2(h)
    # plamo2.cpp:15-16 reads these again even when head_count[0] == 0
    h.head_k_full = h.u32(K_KEY_LENGTH, h.head_k_full)
    h.head_v_full = h.u32(K_VALUE_LENGTH, h.head_v_full)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _falcon_h1(h: HParams) -> None:
    _mamba2(h)
    h.is_recr = [True] * h.n_layer_all


def _nemotron_h(h: HParams) -> None:
    _mamba2(h)
    for il in range(h.n_layer_all):
        h.is_recr[il] = il < h.n_layer and h.n_head_kv[il] == 0 and h.n_ff[il] == 0


def _lfm2(h: HParams) -> None:
    h.n_shortconv_l_cache = h.u32(K_SHORTCONV_L_CACHE, required=True)
    h.recr_by_head_count_kv(upto=h.n_layer)
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.n_swa = n_swa
        h.swa_type = SWA_STANDARD
        for il in range(h.n_layer):
            h.is_swa[il] = not h.is_recr[il]


def _lfm2moe(h: HParams) -> None:
    h.n_shortconv_l_cache = h.u32(K_SHORTCONV_L_CACHE, required=True)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _gated_delta_net(h: HParams) -> None:
    """qwen3next, qwen35, qwen35moe: every 4th layer is full attention unless told otherwise."""
    _mamba2(h)
    h.recr_by_interval(4)


def _minimax01(h: HParams) -> None:
    h.n_embd_head_la = h.head_k_full      # minimax-01.cpp:9
    h.recr_by_interval(8)


def _kda(h: HParams, v_is_lora_rank: bool) -> None:
    """kimi-linear, kimi-k3, bailingmoe3: KDA recurrent layers + MLA attention layers."""
    _mla(True)(h)
    h.ssm_d_conv = h.u32(K_SSM_CONV_KERNEL, required=True)
    h.n_embd_head_kda = h.u32(K_KDA_HEAD_DIM, required=True)
    if v_is_lora_rank:
        h.head_v_full = h.u32(K_KV_LORA_RANK, required=True)
    # kimi-linear.cpp:17-19, kimi-k3.cpp:31-33, bailingmoe3.cpp:36-38: il < n_layer() only; NextN layers
    # keep is_recr = 0 and so fall into the hybrid attention filter (!is_recr)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _nanbeige(h: HParams) -> None:
    n_loops = h.u32(K_NUM_LOOPS, 1)
    if n_loops < 1:
        raise MetadataError(f"{h.source}: '{h.k(K_NUM_LOOPS)}' must be at least 1")
    phys = h.n_layer
    if phys * n_loops > LLAMA_MAX_LAYERS:
        raise MetadataError(f"{h.source}: {phys} layers x {n_loops} loops exceeds llama.cpp's {LLAMA_MAX_LAYERS}")
    if n_loops > 1:
        total = phys * n_loops
        for name in ("n_head", "n_head_kv", "n_ff", "is_swa", "is_recr"):
            arr = getattr(h, name)
            arr.extend([arr[0]] * max(0, total - len(arr)))
            for j in range(1, n_loops):
                for i in range(phys):
                    arr[i + j * phys] = arr[i]
            setattr(h, name, arr[:total] if len(arr) >= total else arr)
        h.n_layer_all = total
        h.notes.append(f"nanbeige: {phys} physical layers run {n_loops} times; each pass has its own cache")


def _granite_switch(h: HParams) -> None:
    # load_arch_tensors appends a single-head router layer at index n_layer() (granite-switch.cpp:57-71)
    n_real = h.n_layer
    h.router_layer = n_real
    h.n_layer_all = n_real + 1
    h.n_layer_nextn = 1
    for name, val in (("n_head", 1), ("n_head_kv", 1), ("n_ff", 0), ("is_swa", False), ("is_recr", False)):
        arr = getattr(h, name)
        arr = arr[:n_real] + [val]
        setattr(h, name, arr)
    h.notes.append("graniteswitch: llama.cpp adds a one-head router layer with its own K/V")


def _non_causal(h: HParams) -> None:
    h.causal = False


ARCH_RULES: dict[str, Callable[[HParams], None]] = {
    # sliding window
    "gemma2": _swa_always(2, default_n_swa=4096),
    "gemma3": _gemma3,
    "gemma3n": _gemma3n,
    "gemma4": _gemma4,
    "cohere2": _swa_always(4, window_required=True),
    "cohere2moe": _swa_always(4, dense_first=True, window_required=True),
    "gpt-oss": _swa_always(2, window_required=True),
    "exaone4": _exaone4,
    "exaone-moe": _swa_always(4, default_n_swa=128, window_required=True),
    "muse-glimmer": _swa_always(4, window_required=True),
    "afmoe": _swa_if_window(4),
    "mellum": _swa_if_window(4),
    "olmo2": _swa_if_window(4),
    "plamo3": _swa_if_window(8),
    "smallthinker": _swa_if_window(4, dense_first=True, forced_n_swa=4096),
    "laguna": _swa_if_window(4, dense_first=True),
    "llama4": _llama4,
    "phi3": _phi3,
    "granite_swa": _swa_array(),
    "mimo2": _swa_array(),
    "step35": _swa_array(),
    "spark2_5": _swa_array(),
    "maple": _swa_array(),
    "modern-bert": _modern_bert,
    "gemma-embedding": _gemma_embedding,
    # MLA
    "deepseek2": _mla(False),
    "mistral4": _mla(False),       # llama_model_mistral4 derives from llama_model_deepseek2
    "hy_v4": _hy_v4,
    "deepseek32": _deepseek32,
    "glm-dsa": _glm_dsa,
    "dots3note": _dots3note,
    "minimax-m3": _minimax_m3,
    "deepseek4": _deepseek4,
    "qwen4exp": _qwen4exp,
    "glm5-next": _glm5_next,
    # recurrent
    "mamba": _mamba1,
    "mamba2": _mamba2,
    "rwkv6": _rwkv,
    "rwkv6qwen2": _rwkv,
    "rwkv7": _rwkv,
    "arwkv7": _rwkv,
    # hybrid
    "jamba": _jamba,
    "granitehybrid": _mamba2_hybrid,
    "plamo2": _plamo2,
    "falcon-h1": _falcon_h1,
    "nemotron_h": _nemotron_h,
    "nemotron_h_moe": _nemotron_h,   # derives from llama_model_nemotron_h
    "lfm2": _lfm2,
    "lfm2moe": _lfm2moe,
    "qwen3next": _gated_delta_net,
    "qwen35": _gated_delta_net,
    "qwen35moe": _gated_delta_net,
    "minimax-01": _minimax01,
    "kimi-linear": lambda h: _kda(h, v_is_lora_rank=False),
    "kimi-k3": lambda h: _kda(h, v_is_lora_rank=True),
    "bailingmoe3": lambda h: _kda(h, v_is_lora_rank=False),
    # others
    "nanbeige": _nanbeige,
    "graniteswitch": _granite_switch,
    "dream": _non_causal,
    "llada": _non_causal,
    "llada-moe": _non_causal,
    "rnd1": _non_causal,
}
