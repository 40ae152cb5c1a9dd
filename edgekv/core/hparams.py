"""A mutable mirror of the ``llama_hparams`` fields that matter for memory, read with llama.cpp's semantics.

Each accessor reads a metadata key as llama.cpp's model loader does (src/llama-model-loader.cpp): the same type
check, the same default, the same refusal of a wrong array length.  The per-architecture rules
(:mod:`edgekv.core.archrules`) fill it; :mod:`edgekv.core.arch` turns it into a ModelShape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekv.core.archtables import (
    K_FULL_ATTENTION_INTERVAL,
    K_RECURRENT_LAYERS,
    K_SLIDING_WINDOW_PATTERN,
    LLAMA_MAX_LAYERS,
    key,
)
from edgekv.core.metadata import ArraySummary
from edgekv.core.shape import SWA_NONE
from edgekv.errors import MetadataError


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class HParams:
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
        if not is_int(v):
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
                if not (is_int(x) or isinstance(x, bool)) or x < 0:
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
            if not (is_int(x) or isinstance(x, bool)) or x < 0:
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

