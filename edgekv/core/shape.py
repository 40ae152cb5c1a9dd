"""ModelShape: everything about a model that decides llama.cpp's cache memory, and nothing else.

Built from GGUF metadata by :mod:`edgekv.core.arch`; consumed by :mod:`edgekv.core.predict`.  Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

# How llama.cpp's create_memory() builds the model's memory (src/llama-model.cpp).
MEMORY_KV = "kv"                    # one llama_kv_cache
MEMORY_ISWA = "iswa"                # llama_kv_cache_iswa: a full cache and a SWA cache
MEMORY_HYBRID = "hybrid"            # llama_memory_hybrid: KV cache + recurrent state
MEMORY_HYBRID_ISWA = "hybrid_iswa"  # llama_memory_hybrid_iswa
MEMORY_RECURRENT = "recurrent"      # llama_memory_recurrent only
MEMORY_NONE = "none"                # no cache at all (encoders, diffusion LMs)
MEMORY_DSA = "dsa"                  # llama_kv_cache_dsa: an MLA cache plus a one-head indexer K cache
MEMORY_DSA_ISWA = "dsa_iswa"        # llama_kv_cache_dsa_iswa: a DSA cache for full layers plus a SWA cache
MEMORY_MSA = "msa"                  # llama_kv_cache_msa: a KV cache plus a one-head indexer K/V cache
MEMORY_HYBRID_IDX = "hybrid_idx"    # llama_memory_hybrid_idx: hybrid plus a K-only indexer cache
MEMORY_DSV4 = "dsv4"                # llama_kv_cache_dsv4: window, CSA, HCA, indexer caches + f32 compressor states
MEMORY_UNSUPPORTED = "unsupported"  # a cache edgekv does not model (draft models, future cache kinds)

SWA_NONE = "none"
SWA_STANDARD = "standard"
SWA_CHUNKED = "chunked"
SWA_SYMMETRIC = "symmetric"


@dataclass(frozen=True)
class LayerShape:
    index: int
    n_head: int
    n_head_kv: int
    head_k: int          # n_embd_head_k(il): key head dim (SWA or full)
    head_v: int          # n_embd_head_v(il)
    n_ff: int
    is_swa: bool
    is_recurrent: bool
    is_nextn: bool       # MTP/NextN layer: never cached in the main context
    has_kv: bool         # hparams.has_kv(il): False for the shared-KV tail of Gemma 3n/4
    attn_cache: bool     # gets K (and V) tensors in the main context's attention cache
    recr_state: bool     # gets R/S tensors in the recurrent state
    reuses: int | None   # shared-KV layers: the layer whose cache they read
    indexer: bool = False      # gets a row in the indexer key cache (DSA, MSA, hybrid_idx, DSV4 lightning indexer)
    compress_ratio: int = 0    # DeepSeek-V4: 4 = CSA layer, 128 = HCA layer, 0 = window only

    @property
    def k_width(self) -> int:
        """n_embd_k_gqa(il): K elements per cell."""
        return self.head_k * self.n_head_kv

    @property
    def v_width(self) -> int:
        """n_embd_v_gqa(il): V elements per cell."""
        return self.head_v * self.n_head_kv

    @property
    def role(self) -> str:
        if self.is_nextn:
            return "nextn"
        if not self.has_kv:
            return "shared"
        if self.attn_cache and self.recr_state:
            return "attn+recurrent"
        if self.recr_state:
            return "recurrent"
        if self.attn_cache:
            return "swa" if self.is_swa else "full"
        return "none"


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    """A model's cache-deciding facts (a frozen msgspec Struct: ``msgspec.structs.replace`` derives another)."""

    arch: str
    name: str
    n_layer_all: int         # {arch}.block_count (plus any layer llama.cpp adds, e.g. a router)
    n_layer_nextn: int
    n_embd: int
    n_ctx_train: int
    n_vocab: int
    causal: bool
    memory: str              # one of MEMORY_*
    swa_type: str
    n_swa: int
    is_mla: bool
    head_k_mla: int
    head_v_mla: int
    n_embd_r: int            # recurrent conv/shift state elements per layer per sequence (f32)
    n_embd_s: int            # recurrent SSM/WKV state elements per layer per sequence (f32)
    supports_rs_rollback: bool
    layers: tuple[LayerShape, ...]
    unsupported_reason: str | None = None
    invalid_reason: str | None = None   # why llama.cpp would refuse to load it (edgekv.core.shapecheck)
    notes: tuple[str, ...] = ()
    indexer_head_k: int = 0  # {arch}.attention.indexer.key_length
    indexer_kpool: int = 0   # glm5-next: {arch}.attention.indexer.kpool (key, gate and pooled value cached)

    @property
    def n_layer(self) -> int:
        """llama.cpp's n_layer(): trunk layers (block_count minus NextN/MTP layers)."""
        return self.n_layer_all - self.n_layer_nextn

    @property
    def n_embd_v_gqa_max(self) -> int:
        return max((lay.v_width for lay in self.layers), default=0)

    @property
    def v_width_variable(self) -> bool:
        """hparams.is_n_embd_v_gqa_variable(): some layer's V width differs from layer 0's."""
        if not self.layers:
            return False
        v0 = self.layers[0].v_width
        return any(lay.v_width != v0 for lay in self.layers)

    def layers_where(self, role: str) -> list[int]:
        return [lay.index for lay in self.layers if lay.role == role]

