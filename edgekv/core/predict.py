"""Predict the bytes llama.cpp allocates for a model's caches, from its shape alone.

Pure: no llama.cpp, no processes, no I/O.  Mirrors, for llama-cpp-python 0.3.36's vendored tree:

* context resolution          src/llama-context.cpp:100-305 (n_ctx padding, n_ctx_seq, n_batch/n_ubatch)
* refusals                    src/llama-context.cpp:3801-3871 (llama_init_from_model)
* KV cache tensors            src/llama-kv-cache.cpp:65-367
* iSWA cell count             src/llama-kv-cache-iswa.cpp:53-105
* recurrent state             src/llama-memory-recurrent.cpp:20-136
* DSA / DSA+iSWA / MSA        src/llama-kv-cache-dsa.cpp:14-54, llama-kv-cache-dsa-iswa.cpp:14-74,
                              llama-kv-cache-msa.cpp:13-50 (an indexer K cache beside the main one)
* hybrid with an indexer      src/llama-memory-hybrid-idx.cpp:23-73
* DeepSeek-V4                 src/llama-kv-cache-dsv4.cpp:883-1336 (window, CSA, HCA, indexer caches and
                              f32 compressor states)

The byte counts are the sums of ``ggml_nbytes`` that llama.cpp prints in its
``llama_kv_cache: size = ...`` and ``llama_memory_recurrent: size = ...`` lines.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgspec
from msgspec import UNSET

from edgekv.core.cachetypes import CacheType, cache_type
from edgekv.core.formula import Formula, FormulaCache
from edgekv.core.shape import (
    MEMORY_DSA,
    MEMORY_DSA_ISWA,
    MEMORY_DSV4,
    MEMORY_HYBRID,
    MEMORY_HYBRID_IDX,
    MEMORY_HYBRID_ISWA,
    MEMORY_ISWA,
    MEMORY_MSA,
    MEMORY_NONE,
    MEMORY_RECURRENT,
    MEMORY_UNSUPPORTED,
    ModelShape,
)
from edgekv.core.units import MIB
from edgekv.errors import UsageError

LLAMA_MAX_SEQ = 256
KV_PAD = 256          # GGML_PAD(n_ctx, 256) and the SWA cell padding

FLASH_ATTN_VALUES = ("auto", "on", "off")

STATUS_OK = "ok"
STATUS_INVALID = "invalid"
STATUS_UNSUPPORTED = "unsupported"



def pad(x: int, n: int = KV_PAD) -> int:
    return (x + n - 1) // n * n


def f32(x: float) -> float:
    """Round to float32, as llama.cpp's ``(float)bytes`` does before printing."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def llama_mib(n_bytes: int) -> str:
    """The MiB figure exactly as llama.cpp's ``size = %7.2f MiB`` prints it (float32 division)."""
    return f"{f32(n_bytes) / MIB:.2f}"


def mib(n_bytes: int | float) -> float:
    return n_bytes / MIB


@dataclass(frozen=True)
class ContextParams:
    """The context settings that decide cache memory, with llama.cpp's command-line defaults."""

    n_ctx: int = 4096                 # 0 = the model's trained context, as in llama.cpp
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"          # on | off | auto  (llama-cli/-server default: auto)
    swa_full: bool = False            # llama-cli/-server default; the C API and Llama() default to True
    n_seq_max: int = 1                # -np
    kv_unified: bool = False
    n_batch: int = 2048
    n_ubatch: int = 512
    n_rs_seq: int = 0

    def __post_init__(self) -> None:
        if self.flash_attn not in FLASH_ATTN_VALUES:
            raise UsageError(f"flash_attn must be one of on, off, auto (got '{self.flash_attn}')")
        cache_type(self.type_k)
        cache_type(self.type_v)
        if self.n_ctx < 0:
            raise UsageError(f"n_ctx must be positive (got {self.n_ctx})")
        if self.n_seq_max < 0 or self.n_batch < 0 or self.n_ubatch < 0 or self.n_rs_seq < 0:
            raise UsageError("n_seq_max, n_batch, n_ubatch and n_rs_seq must not be negative")


# The kinds of cache object, as they appear in ``caches``:
#   full, swa                      the attention KV cache(s) (MLA: K only)
#   recurrent                      f32 recurrent state (R and S)
#   dsa_indexer, msa_indexer,      a one-head indexer key cache beside the main one (MSA keeps V)
#   hybrid_indexer
#   dsv4_raw_full, dsv4_window     DeepSeek-V4's raw K cache pair (all its layers are sliding-window)
#   dsv4_csa, dsv4_hca             DeepSeek-V4's compressed K caches (1 row per 4 / per 128 tokens)
#   dsv4_indexer                   DeepSeek-V4's lightning-indexer K cache (1 row per 4 tokens)
#   dsv4_state                     DeepSeek-V4's f32 compressor states (name: csa, hca or lid)
MAIN_KINDS = ("full", "swa", "dsv4_raw_full", "dsv4_window")


class CachePrediction(msgspec.Struct, frozen=True):
    """One cache object llama.cpp creates (a frozen msgspec Struct, as :class:`KVPrediction`)."""

    kind: str                     # see above
    cells: int                    # cells per stream (rows per sequence for recurrent state)
    n_stream: int
    layers: list[int]
    type_k: str
    type_v: str
    k_bytes: int = 0
    v_bytes: int = 0
    r_bytes: int = 0
    s_bytes: int = 0
    state_bytes: int = 0          # dsv4_state: the kv + score tensors
    role: str | None = None       # what llama.cpp's log calls this object (for the comparison)
    name: str | None = None       # dsv4_state: csa | hca | lid
    width: int = 0                # dsv4_state: n_embd_state
    rs_seq: int = 0               # dsv4_state: rollback snapshots per stream
    per_layer: list[tuple[int, int, int, int, int]] = []

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.r_bytes + self.s_bytes + self.state_bytes


class LayerPrediction(msgspec.Struct, frozen=True):
    """One layer's share of the caches (``predict --layers``): its main cache, cells, row widths and bytes there;
    ``other``: its bytes in the other caches (indexer, compressed, state)."""

    index: int
    role: str
    cache: str | None
    cells: int
    k_width: int
    v_width: int
    k_bytes: int
    v_bytes: int
    r_bytes: int
    s_bytes: int
    other: dict[str, int] = msgspec.field(default_factory=dict)


@dataclass
class _LayerDraft:
    """A LayerPrediction while the caches are assigned to layers (filled in place, then frozen)."""

    index: int
    role: str
    cache: str | None = None
    cells: int = 0
    k_width: int = 0
    v_width: int = 0
    k_bytes: int = 0
    v_bytes: int = 0
    r_bytes: int = 0
    s_bytes: int = 0
    other: dict[str, int] = field(default_factory=dict)

    def frozen(self) -> LayerPrediction:
        return LayerPrediction(**asdict(self))


class KVPrediction(msgspec.Struct, frozen=True, kw_only=True):
    """llama.cpp's cache allocation for one model and context, as :func:`predict` derives it (a frozen msgspec
    Struct: ``msgspec.structs.replace`` derives another)."""

    status: str
    reason: str | None
    params: ContextParams
    arch: str
    memory: str
    n_ctx: int                    # requested (0 = trained)
    n_ctx_padded: int             # llama_n_ctx(): after GGML_PAD(256) and per-sequence rounding
    n_ctx_seq: int
    n_stream: int
    n_batch: int
    n_ubatch: int
    v_trans: bool                 # V stored transposed: flash attention explicitly off at cache creation
    flash_attn_effective: str     # after llama_init_from_model's own changes (Grok off, quantized V on)
    aborts: bool = False          # llama.cpp would abort the process (not just refuse) with these settings
    caches: list[CachePrediction] = []
    layers: list[LayerPrediction] = []
    notes: list[str] = []

    def to_dict(self, with_layers: bool = False) -> dict[str, object]:
        """The prediction as JSON data, the results record's ``prediction.formula`` (:func:`formula_block`):
        the Python API's (``import edgekv``) plain view; edgekv itself embeds the typed block."""
        return msgspec.to_builtins(formula_block(self, with_layers))

    @property
    def k_bytes(self) -> int:
        return sum(c.k_bytes for c in self.caches)

    @property
    def v_bytes(self) -> int:
        return sum(c.v_bytes for c in self.caches)

    @property
    def kv_bytes(self) -> int:
        """Attention K + V bytes (the ``llama_kv_cache: size`` lines summed)."""
        return self.k_bytes + self.v_bytes

    @property
    def recurrent_bytes(self) -> int:
        return sum(c.r_bytes + c.s_bytes for c in self.caches)

    @property
    def state_bytes(self) -> int:
        """DeepSeek-V4's f32 compressor states."""
        return sum(c.state_bytes for c in self.caches)

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.recurrent_bytes + self.state_bytes


def resolve_context(shape: ModelShape, p: ContextParams) -> tuple[int, int, int, int, int]:
    """(n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch) as llama_context's constructor resolves them."""
    n_seq = max(1, p.n_seq_max)
    n_ctx = p.n_ctx if p.n_ctx else shape.n_ctx_train
    n_batch = min(n_ctx, p.n_batch) if shape.causal else p.n_batch
    n_ubatch = min(n_batch, p.n_ubatch if p.n_ubatch else p.n_batch)
    n_ctx = pad(n_ctx)
    if p.kv_unified:
        n_ctx_seq = n_ctx
        n_stream = 1
    else:
        n_ctx_seq = pad(n_ctx // n_seq)
        n_ctx = n_ctx_seq * n_seq
        n_stream = n_seq
    return n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch


# Architectures whose last worst-case graph reservation uses a single-sequence ubatch of n_tokens
# tokens (llama_context::sched_reserve, [TAG_RESERVE_DIAG_DECAY], src/llama-context.cpp:716-722).
RESERVE_ONE_SEQ_ARCHS = frozenset({"kimi-linear", "minimax-01"})


def _refusal(shape: ModelShape, p: ContextParams, tk: CacheType, tv: CacheType, fa: str,
             n_ctx: int, n_batch: int, n_ubatch: int) -> str | None:
    """The reason llama_init_from_model() would return NULL (or abort) for these settings, or None."""
    if p.n_seq_max > LLAMA_MAX_SEQ:
        return f"n_seq_max must be <= {LLAMA_MAX_SEQ}"
    if p.n_batch == 0 and p.n_ubatch == 0:
        return "n_batch and n_ubatch cannot both be zero"
    if p.n_ctx == 0 and shape.n_ctx_train == 0:
        return "n_ctx and the model's trained context cannot both be zero"
    if (shape.is_mla or shape.arch == "deepseek4") and tk.name != tv.name:     # llama-context.cpp:3835-3838
        return f"model does not support different K ({tk.name}) and V ({tv.name}) cache types (MLA)"
    if tv.quantized and fa == "off":
        return "quantized V cache requires flash_attn to be enabled"
    trunk = [lay for lay in shape.layers if lay.index < shape.n_layer]
    if fa != "off" and tk.quantized:
        for lay in trunk:
            if lay.head_k % tk.block:
                return f"K cache type {tk.name} with block size {tk.block} does not divide n_embd_head_k={lay.head_k}"
    if fa != "off" and tv.quantized:
        for lay in trunk:
            if lay.head_v % tv.block:
                return f"V cache type {tv.name} with block size {tv.block} does not divide n_embd_head_v={lay.head_v}"
    if max(1, p.n_seq_max) > n_batch:
        # llama_context::output_reserve(n_seq_max): GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max),
        # where n_outputs_max defaults to the resolved batch size min(n_ctx, n_batch) (llama-context.cpp:2273)
        return (f"llama.cpp aborts: {p.n_seq_max} sequences need {p.n_seq_max} outputs but the batch holds "
                f"{n_batch} (min of n_ctx and -b)")
    n_seq = max(1, p.n_seq_max)
    if shape.arch == "t5" and not p.kv_unified and n_seq > 1:
        # the T5 decoder adds a relative-position bias of n_tokens rows to KQ (src/models/t5.cpp:146-151,
        # llama-graph.cpp:2717-2720), but build_attn_mha splits KQ into k->ne[3] = n_seq streams of
        # n_tokens / n_seq rows (llama-graph.cpp:2630-2635): ggml_add asserts ggml_can_repeat
        return (f"llama.cpp aborts: the t5 decoder's position bias cannot be split over {n_seq} KV streams; "
                "use --kv-unified or one sequence")
    n_tokens = min(n_ctx, n_ubatch)     # sched_reserve's worst case (src/llama-context.cpp:629)
    if (shape.arch in RESERVE_ONE_SEQ_ARCHS and not p.kv_unified and n_tokens % n_seq
            and any(lay.attn_cache for lay in shape.layers)):
        # graph_reserve(n_tokens, 1, ...) does not round n_tokens to a multiple of the KV streams, while
        # build_attn_mha splits q into k->ne[3] = n_seq streams of n_tokens / n_seq tokens
        # (src/llama-graph.cpp:2630-2635): the attention output loses rows and the residual add asserts.
        return (f"llama.cpp aborts: {shape.arch} reserves a {n_tokens}-token graph over {n_seq} KV streams "
                f"({n_tokens} is not a multiple of {n_seq}); use --kv-unified or a -ub divisible by -np")
    return None


def _effective_flash_attn(shape: ModelShape, p: ContextParams, tv: CacheType) -> tuple[str, list[str]]:
    """Flash attention as llama_init_from_model leaves it (the memory is built with this value), and the notes
    saying why it changed."""
    fa = p.flash_attn
    notes: list[str] = []
    if fa != "off" and shape.arch == "grok":
        fa = "off"
        notes.append("grok: llama.cpp forces flash attention off")
    if tv.quantized and fa == "auto":
        fa = "on"
    return fa, notes


def predict(shape: ModelShape, params: ContextParams | None = None, **overrides: Any) -> KVPrediction:
    """Predict llama.cpp's cache allocation for ``shape`` under ``params`` (llama.cpp CLI defaults): llama_context's
    cparams derivation step by step, each step llama.cpp's own."""
    p = replace(params or ContextParams(), **overrides) if overrides else (params or ContextParams())
    tk, tv = cache_type(p.type_k), cache_type(p.type_v)
    p = replace(p, type_k=tk.name, type_v=tv.name)

    fa, notes = _effective_flash_attn(shape, p, tv)
    v_trans = fa == "off"

    n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch = resolve_context(shape, p)
    notes = notes + list(shape.notes)
    pred = KVPrediction(
        status=STATUS_OK, reason=None, params=p, arch=shape.arch, memory=shape.memory, n_ctx=p.n_ctx,
        n_ctx_padded=n_ctx, n_ctx_seq=n_ctx_seq, n_stream=n_stream, n_batch=n_batch, n_ubatch=n_ubatch,
        v_trans=v_trans, flash_attn_effective=fa, notes=list(notes),
    )

    if shape.memory == MEMORY_UNSUPPORTED:
        return msgspec.structs.replace(pred, status=STATUS_UNSUPPORTED,
                                       reason=f"{shape.arch}: {shape.unsupported_reason}; measure it instead")
    refusal = shape.invalid_reason or _refusal(shape, p, tk, tv, fa, n_ctx, n_batch, n_ubatch)
    if refusal:
        return msgspec.structs.replace(pred, status=STATUS_INVALID, reason=refusal,
                                       aborts=refusal.startswith("llama.cpp aborts"))
    if shape.memory == MEMORY_NONE:
        return pred

    # -- attention caches ----------------------------------------------------------------------------
    try:
        caches, layer_preds = _attention_caches(shape, p, tk, tv, v_trans, n_ctx_seq, n_stream, n_ubatch, notes)
    except ValueError as e:
        return msgspec.structs.replace(pred, status=STATUS_INVALID, aborts=True,
                                       reason=f"llama.cpp aborts: {e} (ggml asserts when creating the cache tensor)")

    # -- recurrent state -----------------------------------------------------------------------------
    if shape.memory in (MEMORY_RECURRENT, MEMORY_HYBRID, MEMORY_HYBRID_ISWA, MEMORY_HYBRID_IDX):
        rec = _recurrent_cache(shape, p, layer_preds)
        # llama_memory_hybrid_idx creates its indexer cache after the hybrid's two (llama-memory-hybrid-idx.cpp:46-73)
        caches.insert(1 if shape.memory == MEMORY_HYBRID_IDX else len(caches), rec)

    # -- DeepSeek-V4 compressor states ---------------------------------------------------------------
    if shape.memory == MEMORY_DSV4:
        caches += _dsv4_states(shape, p, layer_preds)

    return msgspec.structs.replace(pred, caches=caches, layers=[lp.frozen() for lp in layer_preds], notes=notes)


def _recurrent_cache(shape: ModelShape, p: ContextParams, layer_preds: list[_LayerDraft]) -> CachePrediction:
    """The recurrent state (llama_memory_recurrent): an f32 r and s row per sequence (and rollback snapshot) on each
    recurrent layer; fills those layers' r/s bytes in ``layer_preds``."""
    mem_size = max(1, p.n_seq_max)
    n_rs_seq = p.n_rs_seq if shape.supports_rs_rollback else 0
    rows = mem_size * (1 + n_rs_seq)
    layers, r_bytes, s_bytes = [], 0, 0
    for lp, lay in zip(layer_preds, shape.layers):
        if lay.recr_state:
            rb = 4 * shape.n_embd_r * rows
            sb = 4 * shape.n_embd_s * rows
            layers.append(lay.index)
            r_bytes += rb
            s_bytes += sb
            lp.r_bytes, lp.s_bytes = rb, sb
            if lp.cache is None:
                lp.cache, lp.cells = "recurrent", mem_size
    # llama.cpp prints mem_size as cells
    return CachePrediction("recurrent", mem_size, 1, layers, "f32", "f32", r_bytes=r_bytes, s_bytes=s_bytes)


# DeepSeek-V4 compression ratios (src/llama-kv-cache-dsv4.cpp:16-17)
DSV4_CSA_RATIO = 4
DSV4_HCA_RATIO = 128


def _dsv4_comp_cells(n_ctx_seq: int, ratio: int) -> int:
    """GGML_PAD(dsv4_comp_size(kv_size, ratio), 256): ceil(kv_size / ratio), at least 1 (llama-kv-cache-dsv4.cpp:27-29)."""
    return pad(max(1, (n_ctx_seq + ratio - 1) // ratio))


def _swa_cells(shape: ModelShape, p: ContextParams, cells_full: int, n_ubatch: int, unified: bool) -> int:
    """size_swa of llama_kv_cache_iswa (llama-kv-cache-iswa.cpp:69-81) and llama_kv_cache_dsa_iswa (dsa-iswa.cpp:48-60)."""
    if p.swa_full:
        return cells_full
    n_seq = max(1, p.n_seq_max)
    return pad(min(cells_full, shape.n_swa * (n_seq if unified else 1) + n_ubatch))


def _kv_object(kind: str, role: str | None, cells: int, n_stream: int, tk: CacheType, tv: CacheType,
               entries: list[tuple[int, int, int]], has_v: bool) -> CachePrediction:
    """One llama_kv_cache: per layer a K tensor [k_w, cells, n_stream] and, unless K-only (MLA), a V tensor
    (src/llama-kv-cache.cpp:165-234).  ``entries`` are (layer, K width, V width as allocated)."""
    per_layer = []
    for il, k_w, v_w in entries:
        try:
            kb = tk.row_bytes(k_w) * cells * n_stream
            vb = tv.row_bytes(v_w) * cells * n_stream if has_v else 0
        except ValueError as e:
            raise ValueError(f"layer {il} ({kind} cache): {e}") from None
        per_layer.append((il, k_w, v_w, kb, vb))
    return CachePrediction(kind, cells, n_stream, [x[0] for x in per_layer], tk.name, tv.name,
                           k_bytes=sum(x[3] for x in per_layer), v_bytes=sum(x[4] for x in per_layer), role=role,
                           per_layer=per_layer)


def _dsv4_caches(shape: ModelShape, p: ContextParams, tk: CacheType, tv: CacheType, cells_full: int, n_ubatch: int,
                 entries: Callable[..., list[tuple[int, int, int]]]) -> list[CachePrediction]:
    """DeepSeek-V4's caches: the raw full and window caches, then the compressed CSA and HCA ones and the indexer."""
    # llama_kv_cache_dsv4 (src/llama-kv-cache-dsv4.cpp:1210-1336): every cache and state keeps one stream
    # per sequence even with --kv-unified (unified_raw / unified_compressed = false); all are K-only
    # (dsv4_make_k_only, 883-887)
    ns = max(1, p.n_seq_max)
    cells_swa = _swa_cells(shape, p, cells_full, n_ubatch, unified=False)
    csa_cells = _dsv4_comp_cells(cells_full, DSV4_CSA_RATIO)
    hca_cells = _dsv4_comp_cells(cells_full, DSV4_HCA_RATIO)
    main = [
        _kv_object("dsv4_raw_full", "full", cells_full, ns, tk, tv,
                   entries(lambda lay: lay.attn_cache and not lay.is_swa), False),
        _kv_object("dsv4_window", "swa", cells_swa, ns, tk, tv, entries(lambda lay: lay.attn_cache and lay.is_swa),
                   False),
    ]
    return main + [
        _kv_object("dsv4_csa", "csa", csa_cells, ns, tk, tv,
                   entries(lambda lay: lay.compress_ratio == DSV4_CSA_RATIO), False),
        _kv_object("dsv4_hca", "hca", hca_cells, ns, tk, tv,
                   entries(lambda lay: lay.compress_ratio == DSV4_HCA_RATIO), False),
        # hparams_lid: one head of indexer.key_length, full and SWA alike (1283-1288)
        _kv_object("dsv4_indexer", "indexer", csa_cells, ns, tk, tv,
                   entries(lambda lay: lay.compress_ratio == DSV4_CSA_RATIO, k_of=lambda lay: shape.indexer_head_k),
                   False),
    ]


def _kv_caches(shape: ModelShape, p: ContextParams, tk: CacheType, tv: CacheType, cells_full: int, n_stream: int,
               n_ubatch: int, has_v: bool, entries: Callable[..., list[tuple[int, int, int]]]) -> list[CachePrediction]:
    """The full (or main) cache, the indexer cache of the DSA/MSA/hybrid_idx memories and the SWA cache of the
    iSWA ones, in that order."""
    mem = shape.memory
    iswa = mem in (MEMORY_ISWA, MEMORY_HYBRID_ISWA, MEMORY_DSA_ISWA, MEMORY_DSV4)
    caches: list[CachePrediction] = []
    main_role = "main" if mem in (MEMORY_DSA, MEMORY_DSA_ISWA, MEMORY_MSA) else ("full" if iswa else None)
    full_pick = (lambda lay: lay.attn_cache and not lay.is_swa) if iswa else (lambda lay: lay.attn_cache)
    caches.append(_kv_object("full", main_role, cells_full, n_stream, tk, tv, entries(full_pick), has_v))
    if mem in (MEMORY_DSA, MEMORY_DSA_ISWA, MEMORY_MSA, MEMORY_HYBRID_IDX):
        # the indexer cache: a copy of the hparams with n_head_kv = 1 and n_embd_head_k_full = indexer.key_length
        # (llama-kv-cache-dsa.cpp:38-47, llama-kv-cache-msa.cpp:39-49); the SWA head size is not changed.
        # hybrid_idx caches key, gate and pooled value when kpool > 0 (llama-memory-hybrid-idx.cpp:53-73).
        # DSA and hybrid_idx caches are K-only (MLA); MSA keeps V, one head wide.
        width = shape.indexer_head_k * (3 if mem == MEMORY_HYBRID_IDX and shape.indexer_kpool > 0 else 1)
        idx_has_v = mem == MEMORY_MSA and has_v
        kind = {MEMORY_DSA: "dsa_indexer", MEMORY_DSA_ISWA: "dsa_indexer", MEMORY_MSA: "msa_indexer",
                MEMORY_HYBRID_IDX: "hybrid_indexer"}[mem]
        caches.append(_kv_object(
            kind, "indexer", cells_full, n_stream, tk, tv,
            entries(lambda lay: lay.indexer, k_of=lambda lay: lay.head_k if lay.is_swa else width,
                    v_of=lambda lay: lay.head_v, vmax=max((lay.head_v for lay in shape.layers), default=0)),
            idx_has_v))
    if iswa:
        cells_swa = _swa_cells(shape, p, cells_full, n_ubatch, unified=p.kv_unified)
        caches.append(_kv_object("swa", "swa", cells_swa, n_stream, tk, tv,
                                 entries(lambda lay: lay.attn_cache and lay.is_swa), has_v))
    return caches


def _assign_layers(caches: list[CachePrediction], layer_preds: list[_LayerDraft]) -> None:
    """Per layer: the first main-kind cache that holds it is its cache; the other caches' bytes go to ``other``."""
    by_layer = {lp.index: lp for lp in layer_preds}
    for c in caches:
        for il, k_w, v_w, kb, vb in c.per_layer:
            lp = by_layer[il]
            if lp.cache is None and c.kind in MAIN_KINDS:
                lp.cache, lp.cells, lp.k_width, lp.v_width, lp.k_bytes, lp.v_bytes = c.kind, c.cells, k_w, v_w, kb, vb
            else:
                lp.other[c.kind] = lp.other.get(c.kind, 0) + kb + vb


def _attention_caches(shape: ModelShape, p: ContextParams, tk: CacheType, tv: CacheType, v_trans: bool,
                      n_ctx_seq: int, n_stream: int, n_ubatch: int, notes: list[str]):
    """The llama_kv_cache objects create_memory() builds for this memory type (unified, SWA pair, hybrid), in the
    order llama.cpp creates (and logs) them, and the per-layer breakdown."""
    mem = shape.memory
    layer_preds = [_LayerDraft(lay.index, lay.role, k_width=lay.k_width) for lay in shape.layers]
    if mem in (MEMORY_RECURRENT, MEMORY_NONE):
        return [], layer_preds
    has_v = not shape.is_mla
    v_max = shape.n_embd_v_gqa_max

    def entries(pick, k_of=lambda lay: lay.k_width, v_of=None, vmax=v_max):
        v_of = v_of or (lambda lay: lay.v_width)
        return [(lay.index, k_of(lay), (vmax if v_trans else v_of(lay))) for lay in shape.layers if pick(lay)]

    if mem == MEMORY_DSV4:
        caches = _dsv4_caches(shape, p, tk, tv, n_ctx_seq, n_ubatch, entries)
    else:
        caches = _kv_caches(shape, p, tk, tv, n_ctx_seq, n_stream, n_ubatch, has_v, entries)
    _assign_layers(caches, layer_preds)
    if v_trans and shape.v_width_variable and has_v and any(c.layers for c in caches if c.kind in ('full', 'swa')):
        notes.append(
            f"flash attention is off and V widths differ across layers: llama.cpp pads every V row to {v_max}")
    return caches, layer_preds


def _dsv4_states(shape: ModelShape, p: ContextParams, layer_preds: list[_LayerDraft]) -> list[CachePrediction]:
    """llama_dsv4_comp_state x 3 (src/llama-kv-cache-dsv4.cpp:893-1000, created at 1313-1329): for each trunk layer
    (il < n_layer()) of its ratio, an f32 kv and an f32 score tensor of [n_embd_state, state_size,
    n_stream * (1 + n_rs_seq)], one stream per sequence.  The logged size is the buffer size; every tensor is a
    multiple of the 32-byte CPU alignment, so it equals the tensor bytes."""
    ns = max(1, p.n_seq_max)
    n_rs_seq = p.n_rs_seq if shape.supports_rs_rollback else 0
    planes = ns * (1 + n_rs_seq)
    head_k0 = shape.layers[0].head_k if shape.layers else 0       # hparams.n_embd_head_k() = n_embd_head_k(0)
    out = []
    for name, ratio, rows, width in (("csa", DSV4_CSA_RATIO, 2 * DSV4_CSA_RATIO, 2 * head_k0),
                                     ("hca", DSV4_HCA_RATIO, DSV4_HCA_RATIO, head_k0),
                                     ("lid", DSV4_CSA_RATIO, 2 * DSV4_CSA_RATIO, 2 * shape.indexer_head_k)):
        per = 2 * 4 * width * rows * planes
        layers = []
        for lay, lp in zip(shape.layers, layer_preds):
            if lay.index < shape.n_layer and lay.compress_ratio == ratio:
                layers.append(lay.index)
                lp.other["dsv4_state"] = lp.other.get("dsv4_state", 0) + per
        out.append(CachePrediction("dsv4_state", rows, ns, layers, "f32", "f32", state_bytes=per * len(layers),
                                   role=name, name=name, width=width, rs_seq=n_rs_seq))
    return out


def largest_fitting(fits, step: int, hi: int) -> int:
    """Largest multiple of ``step`` in [step, hi] for which the monotone predicate ``fits`` holds; 0 if none."""
    hi = hi // step * step
    if hi < step or not fits(step):
        return 0
    if fits(hi):
        return hi
    lo = step
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_context_for_budget(shape: ModelShape, budget_bytes: int, fixed_bytes: int, params: ContextParams,
                           step: int = KV_PAD, upper: int | None = None) -> int:
    """Largest n_ctx (multiple of ``step``) whose fixed_bytes + predicted cache bytes fit the budget.

    ``fixed_bytes`` covers what does not grow with context (weights, and any buffer the caller adds).
    Returns 0 when not even ``step`` tokens fit.  Cache bytes never shrink as n_ctx grows, so a
    binary search is exact.
    """

    def fits(n: int) -> bool:
        pr = predict(shape, replace(params, n_ctx=n))
        return pr.status == STATUS_OK and fixed_bytes + pr.total_bytes <= budget_bytes

    return largest_fitting(fits, step, upper or max(shape.n_ctx_train * 4, 1 << 20))


# -- the record's prediction.formula ------------------------------------------------------------------------------

def cache_block(c: CachePrediction) -> FormulaCache:
    """One cache: recurrent state adds its R and S bytes; a DeepSeek-V4 compressor state gives its rows, width,
    rollback snapshots and bytes (f32) in place of cells."""
    state = c.kind == "dsv4_state"
    recurrent = c.kind == "recurrent"
    return FormulaCache(
        kind=c.kind, cells=UNSET if state else c.cells, n_stream=c.n_stream, layers=len(c.layers),
        layer_ids=list(c.layers), type_k="f32" if state else c.type_k, type_v="f32" if state else c.type_v,
        k_bytes=c.k_bytes, v_bytes=c.v_bytes, bytes=c.bytes,
        r_bytes=c.r_bytes if recurrent else UNSET, s_bytes=c.s_bytes if recurrent else UNSET,
        name=c.name if state and c.name is not None else UNSET, state_rows=c.cells if state else UNSET,
        width=c.width if state else UNSET, rs_seq=c.rs_seq if state else UNSET, state_bytes=c.state_bytes if state else UNSET)


def formula_block(pred: KVPrediction, with_layers: bool = False, saving_vs_f16: Any = UNSET) -> Formula:
    """``prediction.formula``: the asked settings, what llama.cpp resolves them to, the status and the bytes
    (None unless ok); ``with_layers``: the per-layer breakdown (``predict --layers``)."""
    p, ok = pred.params, pred.status == STATUS_OK
    return Formula(
        n_ctx=p.n_ctx, n_ctx_padded=pred.n_ctx_padded, n_ctx_seq=pred.n_ctx_seq, type_k=p.type_k, type_v=p.type_v,
        flash_attn=p.flash_attn, flash_attn_effective=pred.flash_attn_effective, swa_full=p.swa_full,
        n_seq_max=p.n_seq_max, kv_unified=p.kv_unified, n_batch=pred.n_batch, n_ubatch=pred.n_ubatch,
        status=pred.status, reason=pred.reason, aborts=pred.aborts, memory=pred.memory,
        kv_bytes=pred.kv_bytes if ok else None, k_bytes=pred.k_bytes if ok else None,
        v_bytes=pred.v_bytes if ok else None, recurrent_bytes=pred.recurrent_bytes if ok else None,
        state_bytes=pred.state_bytes if ok else None, total_bytes=pred.total_bytes if ok else None,
        caches=[cache_block(c) for c in pred.caches] if ok else [],
        notes=list(pred.notes) if pred.notes else UNSET,
        layers=[msgspec.structs.asdict(x) for x in pred.layers] if with_layers else UNSET, saving_vs_f16=saving_vs_f16)
