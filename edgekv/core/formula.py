"""The formula's prediction as the results record carries it (``prediction.formula``): :class:`Formula` and its
:class:`FormulaCache` entries, built from a :class:`~edgekv.core.predict.KVPrediction` by
:func:`edgekv.core.predict.formula_block`.  The record embeds these types (edgekv.records.blocks); byte counts are
None unless the status is ok.  Pure."""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from edgekv.core.wire import desc

OptInt = Union[int, None]
OptStr = Union[str, None]


class FormulaCache(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One KV cache of the formula (provenance: formula; :func:`edgekv.core.predict.cache_block`)."""

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
