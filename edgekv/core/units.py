"""The small concepts every layer prints: byte units and the K/V cache-type label (one home each)."""

from __future__ import annotations

from collections.abc import Mapping

MIB = 1024 * 1024


def kv_label(type_k: object, type_v: object) -> str:
    """"q8_0" when K and V share a type, else "q8_0/f16" (K first), as llama.cpp's -ctk/-ctv."""
    return str(type_k) if type_k == type_v else f"{type_k}/{type_v}"


def row_kv_label(row: Mapping[str, object]) -> str:
    """:func:`kv_label` of a results row (a frame row or a record's settings as a dict)."""
    return kv_label(row["type_k"], row["type_v"])


def mib_to_bytes(mib: float) -> int:
    """llama.cpp prints buffer sizes in MiB with two decimals: the nearest byte count."""
    return int(round(mib * MIB))
