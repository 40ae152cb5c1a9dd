"""GGUF metadata -> ModelShape, following llama.cpp's own loader.

This is a port of the memory-relevant parts of llama.cpp's ``llama_model::load_hparams`` (the
generic part, src/llama-model.cpp:1320-1470), each architecture's ``load_arch_hparams``
(src/models/*.cpp) and ``llama_model::create_memory`` (src/llama-model.cpp:2352), as vendored in
llama-cpp-python 0.3.36.  The references in comments point into that tree.  Where llama.cpp reads a
key, this reads the same key with the same default; where llama.cpp ignores a key for an
architecture, so does this.  ``../shared/reference/llamacpp-memory.md`` §1 has the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gguf import Keys

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
    SWA_CHUNKED,
    SWA_NONE,
    SWA_STANDARD,
    SWA_SYMMETRIC,
    LayerShape,
    ModelShape,
)
from edgekv.errors import GGUFFormatError, MetadataError

LLAMA_MAX_LAYERS = 512   # src/llama-hparams.h

# Metadata keys: gguf-py's constants (the same spelling as llama.cpp's src/llama-arch.cpp LLM_KV_NAMES), with an
# {arch} placeholder; the three gguf 0.19 does not define are spelled out.
K_ARCH = Keys.General.ARCHITECTURE
K_NAME = Keys.General.NAME
K_CONTEXT_LENGTH = Keys.LLM.CONTEXT_LENGTH
K_EMBEDDING_LENGTH = Keys.LLM.EMBEDDING_LENGTH
K_BLOCK_COUNT = Keys.LLM.BLOCK_COUNT
K_NEXTN = Keys.LLM.NEXTN_PREDICT_LAYERS
K_FF = Keys.LLM.FEED_FORWARD_LENGTH
K_VOCAB_SIZE = Keys.LLM.VOCAB_SIZE
K_HEAD_COUNT = Keys.Attention.HEAD_COUNT
K_HEAD_COUNT_KV = Keys.Attention.HEAD_COUNT_KV
K_KEY_LENGTH = Keys.Attention.KEY_LENGTH
K_VALUE_LENGTH = Keys.Attention.VALUE_LENGTH
K_KEY_LENGTH_SWA = Keys.Attention.KEY_LENGTH_SWA
K_VALUE_LENGTH_SWA = Keys.Attention.VALUE_LENGTH_SWA
K_KEY_LENGTH_MLA = Keys.Attention.KEY_LENGTH_MLA
K_VALUE_LENGTH_MLA = Keys.Attention.VALUE_LENGTH_MLA
K_KV_LORA_RANK = Keys.Attention.KV_LORA_RANK
K_CAUSAL = Keys.Attention.CAUSAL
K_SLIDING_WINDOW = Keys.Attention.SLIDING_WINDOW
K_SLIDING_WINDOW_PATTERN = Keys.Attention.SLIDING_WINDOW_PATTERN
K_SHARED_KV_LAYERS = Keys.Attention.SHARED_KV_LAYERS
K_RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"   # not in gguf.Keys (gguf 0.19)
K_FULL_ATTENTION_INTERVAL = Keys.LLM.FULL_ATTENTION_INTERVAL
K_INDEXER_TOP_K = "{arch}.attention.indexer.top_k"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_KEY_LENGTH = "{arch}.attention.indexer.key_length"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_TYPES = "{arch}.attention.indexer.types"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_KPOOL = "{arch}.attention.indexer.kpool"   # not in gguf.Keys (gguf 0.19)
K_COMPRESS_RATIOS = "{arch}.attention.compress_ratios"   # not in gguf.Keys (gguf 0.19)
K_LEADING_DENSE = Keys.LLM.LEADING_DENSE_BLOCK_COUNT
K_NUM_LOOPS = "{arch}.num_loops"   # not in gguf.Keys (gguf 0.19)
K_SSM_CONV_KERNEL = Keys.SSM.CONV_KERNEL
K_SSM_INNER_SIZE = Keys.SSM.INNER_SIZE
K_SSM_STATE_SIZE = Keys.SSM.STATE_SIZE
K_SSM_GROUP_COUNT = Keys.SSM.GROUP_COUNT
K_WKV_HEAD_SIZE = Keys.WKV.HEAD_SIZE
K_TOKEN_SHIFT_COUNT = Keys.LLM.TOKEN_SHIFT_COUNT
K_SHORTCONV_L_CACHE = Keys.ShortConv.L_CACHE
K_KDA_HEAD_DIM = Keys.KDA.HEAD_DIM
K_TOKENS = Keys.Tokenizer.LIST

# Every architecture name llama.cpp 0.3.36's vendored tree knows (src/llama-arch.cpp LLM_ARCH_NAMES).
LLAMA_ARCHITECTURES: frozenset[str] = frozenset({
    "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
    "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3",
    "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3",
    "phimoe", "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma",
    "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba",
    "mamba2", "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
    "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr",
    "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais",
    "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6",
    "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch", "granite_swa",
    "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2", "bailingmoe3", "dots1", "dots3note",
    "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl",
    "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe",
    "seed_oss", "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5",
    "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
    "qwen3tts", "pockettts",
})

# create_memory(): res = nullptr (src/llama-model.cpp:2358-2374)
NO_CACHE_ARCHS = frozenset({
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1",
})

# llm_arch_is_recurrent / llm_arch_is_hybrid / llm_arch_supports_rs_rollback (src/llama-arch.cpp:1071-1140)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
RS_ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3",
})

# Caches with their own layout that edgekv does not model: measure them, don't guess.
UNSUPPORTED_CACHES: dict[str, str] = {
    "clip": "a vision/audio encoder (mmproj), not a text model with a KV cache",
    "gemma4-assistant": "draft model that shares its target's KV cache (needs the target context)",
    "dflash": "draft model whose cache depends on its target",
}

# create_memory() builds its own cache class for these (src/llama-model.cpp:2376-2630, 2684-2740)
SPECIAL_MEMORY: dict[str, str] = {
    "deepseek32": MEMORY_DSA,        # llama_kv_cache_dsa (2397-2450)
    "glm-dsa": MEMORY_DSA,
    "dots3note": MEMORY_DSA_ISWA,    # llama_kv_cache_dsa_iswa (2540-2590)
    "minimax-m3": MEMORY_MSA,        # llama_kv_cache_msa (2376-2396)
    "deepseek4": MEMORY_DSV4,        # llama_kv_cache_dsv4 (2591-2630)
    "glm5-next": MEMORY_HYBRID_IDX,  # llama_memory_hybrid_idx (2451-2493)
}


def key(template: str, arch: str) -> str:
    return template.replace("{arch}", arch)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class _HParams:
    """Mutable mirror of the llama_hparams fields that matter for memory."""

    meta: Mapping[str, Any]
    arch: str
    source: str
    value_types: Mapping[str, str] | None = None
    n_layer_all: int = 0
    n_layer_nextn: int = 0
    n_embd: int = 0
    n_ctx_train: int = 0
    n_vocab: int = 0
    causal: bool = True
    n_head: list[int] = field(default_factory=list)
    n_head_kv: list[int] = field(default_factory=list)
    n_ff: list[int] = field(default_factory=list)
    head_k_full: int = 0
    head_v_full: int = 0
    head_k_swa: int = 0
    head_v_swa: int = 0
    head_k_mla: int = 0
    head_v_mla: int = 0
    swa_type: str = SWA_NONE
    n_swa: int = 0
    is_swa: list[bool] = field(default_factory=list)
    is_recr: list[bool] = field(default_factory=list)
    n_layer_kv_from_start: int = -1
    router_layer: int = -1
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    wkv_head_size: int = 0
    token_shift_count: int = 2
    n_shortconv_l_cache: int = 0
    n_embd_head_kda: int = 0
    n_embd_head_la: int = 0
    indexer_top_k: int = 0
    indexer_head_size: int = 0
    indexer_kpool: int = 0
    is_indexer_full: list[bool] = field(default_factory=list)
    compress_ratios: list[int] = field(default_factory=list)
    n_layer_dense_lead: int = 0
    notes: list[str] = field(default_factory=list)

    # -- metadata access with llama.cpp's semantics ------------------------------------------------

    def k(self, template: str) -> str:
        return key(template, self.arch)

    def u32(self, template: str, default: int | None = None, required: bool = False) -> int:
        name = self.k(template)
        if name not in self.meta:
            if required:
                raise MetadataError(f"{self.source}: required key '{name}' is missing; llama.cpp cannot load this model")
            return default  # type: ignore[return-value]
        v = self.meta[name]
        self._check_type(name, ("uint32",))
        if isinstance(v, bool):
            return int(v)
        if not _is_int(v):
            raise MetadataError(f"{self.source}: key '{name}' should be an integer, found {type(v).__name__} {v!r}")
        if v < 0:
            raise MetadataError(f"{self.source}: key '{name}' = {v} is negative")
        return v

    def _check_type(self, name: str, allowed: tuple[str, ...]) -> None:
        """llama.cpp's GKV<T>::get_kv refuses a key stored with another GGUF type."""
        if self.value_types is None or name not in self.value_types:
            return
        t = self.value_types[name]
        if t not in allowed:
            raise MetadataError(
                f"{self.source}: key {name} has wrong type {t} but llama.cpp expects {allowed[0]}; it cannot load this model")

    def flag(self, template: str, default: bool) -> bool:
        name = self.k(template)
        if name in self.meta:
            self._check_type(name, ("bool",))
        v = self.meta.get(name, default)
        return bool(v)

    def u32_or_arr(self, template: str, fill: list[int] | None, required: bool = False) -> tuple[list[int], bool]:
        """get_key_or_arr(): a scalar repeated n_layer_all times, or an array of exactly that length."""
        name = self.k(template)
        n = self.n_layer_all
        if name not in self.meta:
            if required:
                raise MetadataError(f"{self.source}: required key '{name}' is missing; llama.cpp cannot load this model")
            return (list(fill) if fill is not None else [0] * n), False
        v = self.meta[name]
        if isinstance(v, ArraySummary):
            raise MetadataError(f"{self.source}: key '{name}' has {v.length} entries, expected {n}")
        if isinstance(v, list):
            self._check_type(name, ("array[uint32]", "array[int32]", "array[bool]"))
            if len(v) != n:
                raise MetadataError(
                    f"{self.source}: key '{name}' has wrong array length; expected {n}, got {len(v)} "
                    "(llama.cpp refuses this model)")
            out = []
            for x in v:
                if not (_is_int(x) or isinstance(x, bool)) or x < 0:
                    raise MetadataError(f"{self.source}: key '{name}' holds {x!r}, expected non-negative integers")
                out.append(int(x))
            return out, True
        return [self.u32(template)] * n, True

    def u32_or_arr_n(self, template: str, n: int, base: list[int], required: bool = False) -> list[int]:
        """get_key_or_arr(key, arr, n): an array must have exactly n entries (llama-model-loader.cpp:459-496);
        entries past n keep ``base``."""
        name = self.k(template)
        if name not in self.meta:
            if required:
                raise MetadataError(f"{self.source}: required key '{name}' is missing; llama.cpp cannot load this model")
            return list(base)
        v = self.meta[name]
        if isinstance(v, ArraySummary):
            raise MetadataError(f"{self.source}: key '{name}' has {v.length} entries, expected {n}")
        if isinstance(v, list):
            if len(v) != n:
                raise MetadataError(
                    f"{self.source}: key '{name}' has wrong array length; expected {n}, got {len(v)} "
                    "(llama.cpp refuses this model)")
            vals = [int(x) for x in self._int_list(name, v)]
        else:
            vals = [self.u32(template)] * n
        return vals + list(base[n:])

    def arr_n(self, template: str, base: list[int], required: bool = False) -> list[int]:
        """get_arr() into a per-layer std::array: the array's entries overwrite the first ones
        (llama-model-loader.cpp:351-400); a scalar is not an array."""
        name = self.k(template)
        v = self.meta.get(name)
        if isinstance(v, ArraySummary):
            raise MetadataError(f"{self.source}: key '{name}' has {v.length} entries; too long to read")
        if not isinstance(v, list):
            if required:
                raise MetadataError(f"{self.source}: array key '{name}' is missing; llama.cpp cannot load this model")
            return list(base)
        if len(v) > LLAMA_MAX_LAYERS:
            raise MetadataError(f"{self.source}: array length {len(v)} for key {name} exceeds max {LLAMA_MAX_LAYERS}")
        vals = [int(x) for x in self._int_list(name, v)]
        return vals + list(base[len(vals):])

    def _int_list(self, name: str, v: list) -> list[int]:
        out = []
        for x in v:
            if not (_is_int(x) or isinstance(x, bool)) or x < 0:
                raise MetadataError(f"{self.source}: key '{name}' holds {x!r}, expected non-negative integers")
            out.append(int(x))
        return out

    def bool_arr(self, template: str) -> list[bool] | None:
        """get_arr() into a per-layer array: None when absent or not an array.  Missing tail = 0."""
        name = self.k(template)
        v = self.meta.get(name)
        if not isinstance(v, list):
            return None
        if len(v) > LLAMA_MAX_LAYERS:
            raise MetadataError(f"{self.source}: array length {len(v)} for key {name} exceeds max {LLAMA_MAX_LAYERS}")
        out = [bool(x) for x in v]
        return out + [False] * max(0, self.n_layer_all - len(out))

    @property
    def n_layer(self) -> int:
        return self.n_layer_all - self.n_layer_nextn

    # -- llama_hparams helpers ----------------------------------------------------------------------

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        # src/llama-hparams.cpp:8-22
        for il in range(self.n_layer):
            if dense_first:
                self.is_swa[il] = n_pattern == 0 or (il % n_pattern != 0)
            else:
                self.is_swa[il] = n_pattern == 0 or (il % n_pattern < (n_pattern - 1))
        for il in range(self.n_layer, self.n_layer_all):
            self.is_swa[il] = False

    def load_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        # src/llama-model.cpp:3434-3441: a bool array wins, then a scalar period, then the arch default
        arr = self.bool_arr(K_SLIDING_WINDOW_PATTERN)
        if arr is not None:
            self.is_swa = arr[: self.n_layer_all]
            return
        n_pattern = self.u32(K_SLIDING_WINDOW_PATTERN, n_pattern)
        self.set_swa_pattern(n_pattern, dense_first)

    def require_swa_array(self) -> None:
        arr = self.bool_arr(K_SLIDING_WINDOW_PATTERN)
        if arr is None:
            raise MetadataError(
                f"{self.source}: {self.arch} needs '{self.k(K_SLIDING_WINDOW_PATTERN)}' as a per-layer array")
        self.is_swa = arr[: self.n_layer_all]

    def recr_by_head_count_kv(self, upto: int | None = None) -> None:
        for il in range(self.n_layer_all if upto is None else upto):
            self.is_recr[il] = self.n_head_kv[il] == 0

    def recr_by_interval(self, default_interval: int) -> None:
        # qwen3next.cpp / qwen35.cpp / qwen35moe.cpp / minimax-01.cpp
        name = self.k(K_RECURRENT_LAYERS)
        if name in self.meta:
            arr, _ = self.u32_or_arr(K_RECURRENT_LAYERS, None)
            self.is_recr = [bool(x) for x in arr]
            return
        interval = self.u32(K_FULL_ATTENTION_INTERVAL, default_interval)
        if interval == 0:
            raise MetadataError(f"{self.source}: '{self.k(K_FULL_ATTENTION_INTERVAL)}' is 0")
        for il in range(self.n_layer_all):
            self.is_recr[il] = il < self.n_layer and (il + 1) % interval != 0


# -- per-architecture rules (load_arch_hparams), memory-relevant parts only --------------------------

def _swa_if_window(n_pattern: int, dense_first: bool = False, forced_n_swa: int | None = None):
    """afmoe, mellum, olmo2, plamo3, smallthinker, laguna: SWA only when sliding_window > 0."""

    def rule(h: _HParams) -> None:
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

    def rule(h: _HParams) -> None:
        h.swa_type = SWA_STANDARD
        h.n_swa = h.u32(K_SLIDING_WINDOW, default_n_swa, required=window_required)
        h.load_swa_pattern(n_pattern, dense_first)

    return rule


def _swa_array(window_required: bool = True):
    """gemma4, granite_swa, mimo2, step35, spark2_5, maple: a per-layer bool array is required."""

    def rule(h: _HParams) -> None:
        h.swa_type = SWA_STANDARD
        h.require_swa_array()
        h.n_swa = h.u32(K_SLIDING_WINDOW, 0, required=window_required)

    return rule


def _gemma3(h: _HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.n_swa = n_swa
        h.swa_type = SWA_STANDARD
        h.load_swa_pattern(6)
    else:
        h.n_swa = n_swa or 0
        h.swa_type = SWA_NONE


def _gemma3n(h: _HParams) -> None:
    _swa_always(5, window_required=True)(h)
    h.n_layer_kv_from_start = 20          # gemma3n.cpp:7, hard-coded, no GGUF key


def _gemma4(h: _HParams) -> None:
    _swa_array()(h)
    shared = h.u32(K_SHARED_KV_LAYERS, 0)
    h.n_layer_kv_from_start = h.n_layer_all - shared
    h.head_k_swa = h.u32(K_KEY_LENGTH_SWA, required=True)
    h.head_v_swa = h.u32(K_VALUE_LENGTH_SWA, required=True)


def _llama4(h: _HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa == 0:
        h.swa_type = SWA_NONE
        h.n_swa = 0
    else:
        h.swa_type = SWA_CHUNKED
        h.n_swa = 8192                    # llama4.cpp:14: forced, the key only switches it off
        h.load_swa_pattern(4)


def _exaone4(h: _HParams) -> None:
    if h.n_layer == 64:                   # exaone4.cpp:4: only the 32B uses SWA
        h.swa_type = SWA_STANDARD
        h.n_swa = 4096
        h.load_swa_pattern(4)
    h.n_swa = h.u32(K_SLIDING_WINDOW, h.n_swa)


def _phi3(h: _HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.swa_type = SWA_NONE
        h.n_swa = 0
        h.set_swa_pattern(1)
        h.notes.append("phi3: llama.cpp disables sliding-window attention for Phi-3 (full-size cache on every layer)")


def _modern_bert(h: _HParams) -> None:
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa:
        h.swa_type = SWA_SYMMETRIC
        h.n_swa = n_swa
        h.load_swa_pattern(3, True)


def _gemma_embedding(h: _HParams) -> None:
    h.swa_type = SWA_SYMMETRIC
    h.load_swa_pattern(6)
    h.n_swa = h.u32(K_SLIDING_WINDOW, required=True)
    h.causal = False


def _mla(required: bool):
    def rule(h: _HParams) -> None:
        h.head_k_mla = h.u32(K_KEY_LENGTH_MLA, 0, required=required)
        h.head_v_mla = h.u32(K_VALUE_LENGTH_MLA, 0, required=required)

    return rule


def _hy_v4(h: _HParams) -> None:
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


def _indexer(h: _HParams) -> None:
    """deepseek32.cpp:22-24, glm-dsa.cpp:49-51, minimax-m3.cpp:9-13, dots3note.cpp:30-32: required keys."""
    h.indexer_head_size = h.u32(K_INDEXER_KEY_LENGTH, required=True)
    h.indexer_top_k = h.u32(K_INDEXER_TOP_K, required=True)


def _deepseek32(h: _HParams) -> None:
    _mla(False)(h)
    _indexer(h)
    h.n_layer_dense_lead = h.u32(K_LEADING_DENSE, 0)


# glm-dsa.cpp:6-27: GLM-5.2's indexer layout, used when n_ctx_train >= 1M and the GGUF has no indexer.types
GLM_5_2_DEFAULT_INDEXER_TYPES = [1, 1] + [1, 0, 0, 0] * 19


def _glm_dsa(h: _HParams) -> None:
    _deepseek32(h)
    # glm-dsa.cpp:59-66: GLM 5 / 5.1 (n_ctx_train < 1M) index every layer, GLM 5.2 uses its default table;
    # indexer.types (n_layer() entries) overrides either
    base = [1] * LLAMA_MAX_LAYERS if h.n_ctx_train < 1048576 else (
        GLM_5_2_DEFAULT_INDEXER_TYPES + [0] * (LLAMA_MAX_LAYERS - len(GLM_5_2_DEFAULT_INDEXER_TYPES)))
    h.is_indexer_full = [bool(x) for x in h.u32_or_arr_n(K_INDEXER_TYPES, h.n_layer, base)]


def _dots3note(h: _HParams) -> None:
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


def _minimax_m3(h: _HParams) -> None:
    # minimax-m3.cpp:3-13
    h.n_layer_dense_lead = h.u32(K_LEADING_DENSE, 0)
    _indexer(h)


def _deepseek4(h: _HParams) -> None:
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


def _qwen4exp(h: _HParams) -> None:
    # qwen4exp.cpp: SSM keys, indexer keys all required and non-zero, then the qwen3next layer rule
    _mamba2(h)
    for tmpl in (K_INDEXER_KEY_LENGTH, K_INDEXER_TOP_K):
        if not h.u32(tmpl, 0):
            raise MetadataError(f"{h.source}: '{h.k(tmpl)}' must be non-zero; llama.cpp refuses this model")
    h.indexer_head_size = h.u32(K_INDEXER_KEY_LENGTH)
    h.indexer_top_k = h.u32(K_INDEXER_TOP_K)
    h.recr_by_interval(4)


def _glm5_next(h: _HParams) -> None:
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


def _mamba1(h: _HParams) -> None:
    h.ssm_d_conv = h.u32(K_SSM_CONV_KERNEL, required=True)
    h.ssm_d_inner = h.u32(K_SSM_INNER_SIZE, required=True)
    h.ssm_d_state = h.u32(K_SSM_STATE_SIZE, required=True)


def _mamba2(h: _HParams) -> None:
    _mamba1(h)
    h.ssm_n_group = h.u32(K_SSM_GROUP_COUNT, required=True)


def _rwkv(h: _HParams) -> None:
    h.wkv_head_size = h.u32(K_WKV_HEAD_SIZE, required=True)
    h.token_shift_count = h.u32(K_TOKEN_SHIFT_COUNT, 2)


def _jamba(h: _HParams) -> None:
    _mamba1(h)
    h.recr_by_head_count_kv(upto=h.n_layer)     # jamba.cpp:11-13: only trunk layers (il < n_layer())


def _mamba2_hybrid(h: _HParams) -> None:
    """granitehybrid: mamba2 layers are those with head_count_kv == 0."""
    _mamba2(h)
    h.recr_by_head_count_kv(upto=h.n_layer)     # granite-hybrid.cpp:23-25: il < n_layer() only


def _plamo2(h: _HParams) -> None:
    _mamba2(h)
    # plamo2.cpp:15-16 reads these again even when head_count[0] == 0
    h.head_k_full = h.u32(K_KEY_LENGTH, h.head_k_full)
    h.head_v_full = h.u32(K_VALUE_LENGTH, h.head_v_full)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _falcon_h1(h: _HParams) -> None:
    _mamba2(h)
    h.is_recr = [True] * h.n_layer_all


def _nemotron_h(h: _HParams) -> None:
    _mamba2(h)
    for il in range(h.n_layer_all):
        h.is_recr[il] = il < h.n_layer and h.n_head_kv[il] == 0 and h.n_ff[il] == 0


def _lfm2(h: _HParams) -> None:
    h.n_shortconv_l_cache = h.u32(K_SHORTCONV_L_CACHE, required=True)
    h.recr_by_head_count_kv(upto=h.n_layer)
    n_swa = h.u32(K_SLIDING_WINDOW, None)
    if n_swa is not None and n_swa > 0:
        h.n_swa = n_swa
        h.swa_type = SWA_STANDARD
        for il in range(h.n_layer):
            h.is_swa[il] = not h.is_recr[il]


def _lfm2moe(h: _HParams) -> None:
    h.n_shortconv_l_cache = h.u32(K_SHORTCONV_L_CACHE, required=True)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _gated_delta_net(h: _HParams) -> None:
    """qwen3next, qwen35, qwen35moe: every 4th layer is full attention unless told otherwise."""
    _mamba2(h)
    h.recr_by_interval(4)


def _minimax01(h: _HParams) -> None:
    h.n_embd_head_la = h.head_k_full      # minimax-01.cpp:9
    h.recr_by_interval(8)


def _kda(h: _HParams, v_is_lora_rank: bool) -> None:
    """kimi-linear, kimi-k3, bailingmoe3: KDA recurrent layers + MLA attention layers."""
    _mla(True)(h)
    h.ssm_d_conv = h.u32(K_SSM_CONV_KERNEL, required=True)
    h.n_embd_head_kda = h.u32(K_KDA_HEAD_DIM, required=True)
    if v_is_lora_rank:
        h.head_v_full = h.u32(K_KV_LORA_RANK, required=True)
    # kimi-linear.cpp:17-19, kimi-k3.cpp:31-33, bailingmoe3.cpp:36-38: il < n_layer() only; NextN layers
    # keep is_recr = 0 and so fall into the hybrid attention filter (!is_recr)
    h.recr_by_head_count_kv(upto=h.n_layer)


def _nanbeige(h: _HParams) -> None:
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


def _granite_switch(h: _HParams) -> None:
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


def _non_causal(h: _HParams) -> None:
    h.causal = False


ARCH_RULES: dict[str, Callable[[_HParams], None]] = {
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


def _n_vocab(meta: Mapping[str, Any], arch: str) -> int:
    v = meta.get(key(K_VOCAB_SIZE, arch))
    if _is_int(v):
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
    h = _HParams(meta=meta, arch=arch, source=source, value_types=value_types)
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


def _unsupported_shape(h: _HParams, name: Any, reason: str) -> ModelShape:
    return ModelShape(
        arch=h.arch, name=str(name or ""), n_layer_all=0, n_layer_nextn=0, n_embd=0, n_ctx_train=0,
        n_vocab=0, causal=True, memory=MEMORY_UNSUPPORTED, swa_type=SWA_NONE, n_swa=0, is_mla=False,
        head_k_mla=0, head_v_mla=0, n_embd_r=0, n_embd_s=0, supports_rs_rollback=False, layers=(),
        unsupported_reason=reason,
    )


def _n_embd_r(h: _HParams) -> int:
    # src/llama-hparams.cpp n_embd_r()
    if h.wkv_head_size:
        return h.token_shift_count * h.n_embd
    if h.n_shortconv_l_cache:
        return h.n_embd * (h.n_shortconv_l_cache - 1)
    if h.n_embd_head_kda:
        return 3 * (h.ssm_d_conv - 1 if h.ssm_d_conv > 0 else 3) * h.n_head[0] * h.n_embd_head_kda
    return (h.ssm_d_conv - 1 if h.ssm_d_conv > 0 else 0) * (h.ssm_d_inner + 2 * h.ssm_n_group * h.ssm_d_state)


def _n_embd_s(h: _HParams) -> int:
    # src/llama-hparams.cpp n_embd_s()
    if h.wkv_head_size:
        return h.n_embd * h.wkv_head_size
    if h.n_embd_head_kda:
        return h.n_embd_head_kda * h.n_embd_head_kda * h.n_head[0]
    if h.n_embd_head_la:
        return h.n_embd_head_la * h.n_embd_head_la * h.n_head[0]
    return h.ssm_d_state * h.ssm_d_inner


def _attn_filter(h: _HParams, memory: str) -> Callable[[int], bool]:
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


def _recr_filter(h: _HParams, memory: str) -> Callable[[int], bool]:
    n_layer = h.n_layer
    if memory == MEMORY_RECURRENT:
        return lambda il: il < n_layer
    if h.arch == "falcon-h1":
        return lambda il: il < n_layer
    if h.arch in ("nemotron_h", "nemotron_h_moe"):
        return lambda il: il < n_layer and h.is_recr[il] and h.n_ff[il] == 0
    return lambda il: il < n_layer and h.is_recr[il]


def _indexer_filter(h: _HParams, memory: str) -> Callable[[int], bool]:
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
def _finish(h: _HParams, name: Any, memory: str, reason: str | None) -> ModelShape:
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
