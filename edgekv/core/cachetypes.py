"""The KV cache types llama.cpp accepts, with their block sizes taken from gguf's own tables.

llama.cpp's ``-ctk/-ctv`` accept exactly these names (common/arg.cpp ``kv_cache_types``).  The
(block size, bytes per block) pairs come from ``gguf.GGML_QUANT_SIZES``, which mirrors ggml's
``type_traits`` table, so there is one source of truth for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgekv.errors import UsageError

# llama.cpp's accepted cache types, in the order its --help lists them.
CACHE_TYPE_NAMES: tuple[str, ...] = (
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
)

# The four types the issue tracker and the published figures talk about.
DEFAULT_SWEEP_TYPES: tuple[str, ...] = ("f16", "q8_0", "q5_0", "q4_0")


@dataclass(frozen=True)
class CacheType:
    name: str
    ggml_id: int
    block: int          # elements per block
    block_bytes: int    # bytes per block

    @property
    def quantized(self) -> bool:
        # llama.cpp's ggml_is_quantized(): every block type (blck > 1) is quantized.
        return self.block > 1

    def row_bytes(self, n_elements: int) -> int:
        """ggml_row_size(): bytes of a row of ``n_elements``.  ggml asserts divisibility."""
        if n_elements % self.block:
            raise ValueError(f"{n_elements} elements is not a multiple of {self.name}'s block of {self.block}")
        return n_elements // self.block * self.block_bytes

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.block_bytes / self.block


def _build() -> dict[str, CacheType]:
    out = {}
    for name in CACHE_TYPE_NAMES:
        qt = GGMLQuantizationType[name.upper()]
        block, block_bytes = GGML_QUANT_SIZES[qt]
        out[name] = CacheType(name, int(qt), block, block_bytes)
    return out


CACHE_TYPES: dict[str, CacheType] = _build()
_BY_ID = {ct.ggml_id: ct for ct in CACHE_TYPES.values()}


def cache_type(name: str | CacheType) -> CacheType:
    """Look a cache type up by llama.cpp's spelling (case-insensitive)."""
    if isinstance(name, CacheType):
        return name
    key = str(name).strip().lower()
    try:
        return CACHE_TYPES[key]
    except KeyError:
        raise UsageError(
            f"unknown cache type '{name}': llama.cpp accepts {', '.join(CACHE_TYPE_NAMES)}"
        ) from None


# Tensor (weight) types: the vendored ggml's enum (ggml/include/ggml.h:390-433, GGML_TYPE_COUNT = 43).  gguf 0.19
# knows every one of them except Q2_0 (id 42: 64 weights in 18 bytes, ggml/src/ggml-common.h:187-192); the ids
# ggml removed (4, 5, 31-33, 36-38) have block size 0 there, and gguf.cpp refuses a tensor of any of them or of
# an id >= GGML_TYPE_COUNT (ggml/src/gguf.cpp:730-745).
GGML_TYPE_COUNT = 43
_EXTRA_GGML_TYPES = {42: ("q2_0", 64, 18)}
REMOVED_GGML_TYPES = {4: "q4_2", 5: "q4_3", 31: "q4_0_4_4", 32: "q4_0_4_8", 33: "q4_0_8_8",
                      36: "iq4_nl_4_4", 37: "iq4_nl_4_8", 38: "iq4_nl_8_8"}


class UnknownTensorType(ValueError):
    """A tensor type id the vendored llama.cpp cannot read."""


def ggml_type_info(ggml_id: int) -> tuple[str, int, int]:
    """(name, elements per block, bytes per block) of a tensor type, as the vendored ggml sizes it."""
    i = int(ggml_id)
    if i in _EXTRA_GGML_TYPES:
        return _EXTRA_GGML_TYPES[i]
    if i in REMOVED_GGML_TYPES:
        raise UnknownTensorType(
            f"ggml type {i} ({REMOVED_GGML_TYPES[i]}) was removed from llama.cpp; it refuses files that use it")
    try:
        qt = GGMLQuantizationType(i)
        block, block_bytes = GGML_QUANT_SIZES[qt]
    except (ValueError, KeyError):
        raise UnknownTensorType(
            f"ggml type {i} is not a type llama.cpp knows (the vendored ggml has types 0-{GGML_TYPE_COUNT - 1}): "
            "the file was written for a llama.cpp fork or a newer ggml, and its weights cannot be sized") from None
    return qt.name.lower(), block, block_bytes


def ggml_type_name(ggml_id: int) -> str:
    """Name of any ggml tensor type (for weights), as llama.cpp prints it (q4_K, f16, ...)."""
    try:
        return ggml_type_info(ggml_id)[0].replace("_k", "_K")
    except UnknownTensorType:
        return f"type{ggml_id}"


def tensor_nbytes(ggml_id: int, shape: tuple[int, ...] | list[int]) -> int:
    """ggml_nbytes() of a contiguous tensor with dims ``shape`` (ne0 first)."""
    name, block, block_bytes = ggml_type_info(ggml_id)
    n = 1
    for d in shape:
        n *= int(d)
    ne0 = int(shape[0]) if len(shape) else 1
    if ne0 % block:
        raise ValueError(f"tensor row of {ne0} elements is not a multiple of the {name} block ({block})")
    return n // block * block_bytes
