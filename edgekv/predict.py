"""Predict the bytes llama.cpp allocates for a model's caches, from its shape alone.

Pure: no llama.cpp, no processes, no I/O.  Mirrors, for llama-cpp-python 0.3.36's vendored tree:

* context resolution          src/llama-context.cpp:100-305 (n_ctx padding, n_ctx_seq, n_batch/n_ubatch)
* refusals                    src/llama-context.cpp:3801-3871 (llama_init_from_model)
* KV cache tensors            src/llama-kv-cache.cpp:65-367
* iSWA cell count             src/llama-kv-cache-iswa.cpp:53-105
* recurrent state             src/llama-memory-recurrent.cpp:20-136

The byte counts are the sums of ``ggml_nbytes`` that llama.cpp prints in its
``llama_kv_cache: size = ...`` and ``llama_memory_recurrent: size = ...`` lines.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .cachetypes import CacheType, cache_type
from .errors import UsageError
from .shape import (
    MEMORY_HYBRID,
    MEMORY_HYBRID_ISWA,
    MEMORY_ISWA,
    MEMORY_NONE,
    MEMORY_RECURRENT,
    MEMORY_UNSUPPORTED,
    ModelShape,
)

LLAMA_MAX_SEQ = 256
KV_PAD = 256          # GGML_PAD(n_ctx, 256) and the SWA cell padding

FLASH_ATTN_VALUES = ("auto", "on", "off")

STATUS_OK = "ok"
STATUS_INVALID = "invalid"
STATUS_UNSUPPORTED = "unsupported"

MIB = 1024 * 1024


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


@dataclass
class CachePrediction:
    kind: str                     # full | swa | recurrent
    cells: int                    # cells per stream (rows per sequence for recurrent state)
    n_stream: int
    layers: list[int]
    type_k: str
    type_v: str
    k_bytes: int = 0
    v_bytes: int = 0
    r_bytes: int = 0
    s_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.r_bytes + self.s_bytes

    def log_line_mib(self) -> str:
        return llama_mib(self.bytes)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind, "cells": self.cells, "n_stream": self.n_stream, "layers": len(self.layers),
            "layer_ids": list(self.layers), "type_k": self.type_k, "type_v": self.type_v,
            "k_bytes": self.k_bytes, "v_bytes": self.v_bytes, "bytes": self.bytes,
        }
        if self.kind == "recurrent":
            d["r_bytes"] = self.r_bytes
            d["s_bytes"] = self.s_bytes
        return d


@dataclass
class LayerPrediction:
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


@dataclass
class KVPrediction:
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
    caches: list[CachePrediction] = field(default_factory=list)
    layers: list[LayerPrediction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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
    def total_bytes(self) -> int:
        return self.kv_bytes + self.recurrent_bytes

    def to_dict(self, with_layers: bool = False) -> dict[str, Any]:
        p = self.params
        d: dict[str, Any] = {
            "n_ctx": p.n_ctx,
            "n_ctx_padded": self.n_ctx_padded,
            "n_ctx_seq": self.n_ctx_seq,
            "type_k": p.type_k,
            "type_v": p.type_v,
            "flash_attn": p.flash_attn,
            "flash_attn_effective": self.flash_attn_effective,
            "swa_full": p.swa_full,
            "n_seq_max": p.n_seq_max,
            "kv_unified": p.kv_unified,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "status": self.status,
            "reason": self.reason,
            "aborts": self.aborts,
            "memory": self.memory,
            "kv_bytes": self.kv_bytes if self.status == STATUS_OK else None,
            "k_bytes": self.k_bytes if self.status == STATUS_OK else None,
            "v_bytes": self.v_bytes if self.status == STATUS_OK else None,
            "recurrent_bytes": self.recurrent_bytes if self.status == STATUS_OK else None,
            "total_bytes": self.total_bytes if self.status == STATUS_OK else None,
            "caches": [c.to_dict() for c in self.caches] if self.status == STATUS_OK else [],
        }
        if self.notes:
            d["notes"] = list(self.notes)
        if with_layers:
            d["layers"] = [asdict(x) for x in self.layers]
        return d


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
    if (shape.is_mla or shape.arch == "deepseek4") and tk.name != tv.name:
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


def predict(shape: ModelShape, params: ContextParams | None = None, **overrides: Any) -> KVPrediction:
    """Predict llama.cpp's cache allocation for ``shape`` under ``params`` (llama.cpp CLI defaults)."""
    p = replace(params or ContextParams(), **overrides) if overrides else (params or ContextParams())
    tk, tv = cache_type(p.type_k), cache_type(p.type_v)
    p = replace(p, type_k=tk.name, type_v=tv.name)

    # flash attention as llama_init_from_model leaves it (the memory is built with this value)
    fa = p.flash_attn
    notes: list[str] = []
    if fa != "off" and shape.arch == "grok":
        fa = "off"
        notes.append("grok: llama.cpp forces flash attention off")
    if tv.quantized and fa == "auto":
        fa = "on"
    v_trans = fa == "off"

    n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch = resolve_context(shape, p)
    pred = KVPrediction(
        status=STATUS_OK, reason=None, params=p, arch=shape.arch, memory=shape.memory, n_ctx=p.n_ctx,
        n_ctx_padded=n_ctx, n_ctx_seq=n_ctx_seq, n_stream=n_stream, n_batch=n_batch, n_ubatch=n_ubatch,
        v_trans=v_trans, flash_attn_effective=fa, notes=notes + list(shape.notes),
    )

    if shape.memory == MEMORY_UNSUPPORTED:
        pred.status, pred.reason = STATUS_UNSUPPORTED, f"{shape.arch}: {shape.unsupported_reason}; measure it instead"
        return pred
    refusal = shape.invalid_reason or _refusal(shape, p, tk, tv, fa, n_ctx, n_batch, n_ubatch)
    if refusal:
        pred.status, pred.reason = STATUS_INVALID, refusal
        pred.aborts = refusal.startswith("llama.cpp aborts")
        return pred
    if shape.memory == MEMORY_NONE:
        return pred

    # -- attention caches ----------------------------------------------------------------------------
    has_attn = shape.memory not in (MEMORY_RECURRENT,)
    iswa = shape.memory in (MEMORY_ISWA, MEMORY_HYBRID_ISWA)
    cells_full = n_ctx_seq
    if iswa:
        if p.swa_full:
            cells_swa = cells_full
        else:
            n_seq = max(1, p.n_seq_max)
            cells_swa = pad(min(cells_full, shape.n_swa * (n_seq if p.kv_unified else 1) + n_ubatch))
    else:
        cells_swa = cells_full
    v_max = shape.n_embd_v_gqa_max

    full = CachePrediction("full", cells_full, n_stream, [], tk.name, tv.name)
    swa = CachePrediction("swa", cells_swa, n_stream, [], tk.name, tv.name)
    layer_preds: list[LayerPrediction] = []
    for lay in shape.layers:
        kb = vb = 0
        which = None
        cells = 0
        if has_attn and lay.attn_cache:
            target = swa if (iswa and lay.is_swa) else full
            which, cells = target.kind, target.cells
            k_w = lay.k_width
            v_w = v_max if v_trans else lay.v_width
            try:
                kb = tk.row_bytes(k_w) * cells * n_stream
                vb = 0 if shape.is_mla else tv.row_bytes(v_w) * cells * n_stream
            except ValueError as e:
                pred.status = STATUS_INVALID
                pred.reason = f"llama.cpp aborts: layer {lay.index}: {e} (ggml asserts when creating the cache tensor)"
                pred.aborts = True
                return pred
            target.layers.append(lay.index)
            target.k_bytes += kb
            target.v_bytes += vb
        layer_preds.append(LayerPrediction(
            lay.index, lay.role, which, cells, lay.k_width, (v_max if v_trans else lay.v_width) if which else 0,
            kb, vb, 0, 0))

    if v_trans and shape.v_width_variable and not shape.is_mla and (full.layers or swa.layers):
        pred.notes.append(
            f"flash attention is off and V widths differ across layers: llama.cpp pads every V row to {v_max}")

    caches = []
    if iswa:
        # llama_kv_cache_iswa creates the non-SWA cache first, then the SWA one; both always exist
        caches = [full, swa]
    elif has_attn:
        caches = [full]

    # -- recurrent state -----------------------------------------------------------------------------
    if shape.memory in (MEMORY_RECURRENT, MEMORY_HYBRID, MEMORY_HYBRID_ISWA):
        mem_size = max(1, p.n_seq_max)
        n_rs_seq = p.n_rs_seq if shape.supports_rs_rollback else 0
        rows = mem_size * (1 + n_rs_seq)
        rec = CachePrediction("recurrent", mem_size, 1, [], "f32", "f32")   # llama.cpp prints mem_size as cells
        for lp, lay in zip(layer_preds, shape.layers):
            if lay.recr_state:
                rb = 4 * shape.n_embd_r * rows
                sb = 4 * shape.n_embd_s * rows
                rec.layers.append(lay.index)
                rec.r_bytes += rb
                rec.s_bytes += sb
                lp.r_bytes, lp.s_bytes = rb, sb
                if lp.cache is None:
                    lp.cache, lp.cells = "recurrent", mem_size
        caches.append(rec)

    pred.caches = caches
    pred.layers = layer_preds
    return pred


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
