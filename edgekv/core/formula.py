"""The formula's prediction as the results record carries it (``prediction.formula``): :class:`Formula` and its
:class:`FormulaCache` entries, built from a :class:`~edgekv.core.predict.KVPrediction` by :func:`formula_block`.
The record embeds these types (edgekv.records.blocks); byte counts are None unless the status is ok.  Pure."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from edgekv.core.predict import STATUS_OK, CachePrediction, KVPrediction
from edgekv.core.wire import desc

OptInt = Union[int, None]
OptStr = Union[str, None]


class FormulaCache(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One KV cache of the formula (provenance: formula; :func:`edgekv.core.formula.cache_block`)."""

    kind: Annotated[Union[str, UnsetType], desc("cache kind: kv | swa | recurrent | dsv4_state | ...")] = UNSET
    cells: Annotated[Union[int, UnsetType], desc("cells (tokens) per stream (absent for state caches: see state_rows)")] = UNSET
    n_stream: Annotated[Union[int, UnsetType], desc("streams (sequences with their own cells)")] = UNSET
    layers: Annotated[Union[int, UnsetType], desc("layers in this cache")] = UNSET
    layer_ids: Annotated[Union[list[int], UnsetType], desc("layer indices")] = UNSET
    type_k: Annotated[Union[str, UnsetType], desc("K cache type")] = UNSET
    type_v: Annotated[Union[str, UnsetType], desc("V cache type")] = UNSET
    k_bytes: Annotated[Union[int, UnsetType], desc("K bytes")] = UNSET
    v_bytes: Annotated[Union[int, UnsetType], desc("V bytes")] = UNSET
    bytes: Annotated[Union[int, UnsetType], desc("all bytes of this cache")] = UNSET
    r_bytes: Annotated[Union[int, UnsetType], desc("recurrent R state bytes")] = UNSET
    s_bytes: Annotated[Union[int, UnsetType], desc("recurrent S state bytes")] = UNSET
    name: Annotated[Union[str, UnsetType], desc("state cache name")] = UNSET
    state_rows: Annotated[Union[int, UnsetType], desc("state rows")] = UNSET
    width: Annotated[Union[int, UnsetType], desc("state row width")] = UNSET
    rs_seq: Annotated[Union[int, UnsetType], desc("state sequences")] = UNSET
    state_bytes: Annotated[Union[int, UnsetType], desc("state bytes")] = UNSET


class Formula(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The KV prediction from the GGUF header (provenance: formula; :mod:`edgekv.core.predict`)."""

    n_ctx: Annotated[int, desc("context size asked")]
    n_ctx_padded: Annotated[int, desc("context size after llama.cpp's padding")]
    n_ctx_seq: Annotated[int, desc("cells per sequence")]
    type_k: Annotated[str, desc("K cache type")]
    type_v: Annotated[str, desc("V cache type")]
    flash_attn: Annotated[str, desc("flash attention asked")]
    flash_attn_effective: Annotated[str, desc("flash attention llama.cpp would use (on/off/auto)")]
    swa_full: Annotated[bool, desc("full-size SWA cache")]
    n_seq_max: Annotated[int, desc("parallel sequences")]
    kv_unified: Annotated[bool, desc("unified KV buffer")]
    n_batch: Annotated[int, desc("logical batch")]
    n_ubatch: Annotated[int, desc("physical batch")]
    status: Annotated[str, desc("ok | invalid | unsupported")]
    reason: Annotated[OptStr, desc("why not ok")]
    aborts: Annotated[bool, desc("llama.cpp would abort at context creation")]
    memory: Annotated[str, desc("cache family")]
    kv_bytes: Annotated[OptInt, desc("attention KV bytes (None unless status is ok)")]
    k_bytes: Annotated[OptInt, desc("K bytes")]
    v_bytes: Annotated[OptInt, desc("V bytes")]
    recurrent_bytes: Annotated[OptInt, desc("recurrent state bytes")]
    state_bytes: Annotated[Union[int, None, UnsetType], desc("other state bytes (DeepSeek-V4 style caches)")] = UNSET
    total_bytes: Annotated[OptInt, desc("KV + recurrent + state bytes: what llama.cpp allocates for the caches")]
    caches: Annotated[list[FormulaCache], desc("one entry per cache (empty unless status is ok)")]
    notes: Annotated[Union[list[str], UnsetType], desc("caveats of the prediction")] = UNSET
    layers: Annotated[Union[list[dict[str, Any]], UnsetType], desc("per-layer breakdown (predict --layers)")] = UNSET
    saving_vs_f16: Annotated[Union[float, None, UnsetType], desc("f16 cache bytes / these cache bytes (predict)")] = UNSET


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
        layers=[asdict(x) for x in pred.layers] if with_layers else UNSET, saving_vs_f16=saving_vs_f16)
