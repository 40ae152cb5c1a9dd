"""The schema of ``edgekv explain --json``: typed, versioned msgspec Structs (documented in docs/explain.md).

A CI job reads ``kv.lines[].match``, ``kv_buffers.rows[].match``, ``model.residual_pct`` and ``check.ok`` without
guessing.  :func:`report` validates the explanation against these types (a field of the wrong type is an error,
not a silent change of the output) and :data:`SCHEMA_VERSION` changes whenever a field changes meaning or goes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

SCHEMA_VERSION = 1


class KVLine(Struct, omit_defaults=True):
    """One cache size line llama.cpp printed (KV, recurrent state), with edgekv's figures beside it (as printed:
    two decimals of MiB, strings)."""
    role: str
    printed_mib: str
    match: bool = False
    why: str | None = None                    # set whenever match is false
    predicted_mib: str | None = None
    cells: int | None = None
    layers: int | None = None
    streams: int | None = None
    type_k: str | None = None
    type_v: str | None = None
    printed_k_mib: str | None = None
    printed_v_mib: str | None = None
    predicted_k_mib: str | None = None
    predicted_v_mib: str | None = None
    predicted_cells: int | None = None
    predicted_layers: int | None = None
    bytes: int | None = None
    cells_note: str | None = None
    method: str | None = None


class KVCheck(Struct):
    status: str                               # "predicted", "no KV size line in the log", "not predicted: ..."
    lines: list[KVLine] = []
    params: dict[str, Any] | None = None      # the context edgekv recovered (n_ctx, type_k, type_v, ...)


class KVBufferRow(Struct, omit_defaults=True):
    """A device's KV buffer line against the layers llama.cpp assigns that device."""
    device: str
    predicted_mib: str
    match: bool
    printed_mib: str | None = None            # None: predicted here, but the log prints no buffer
    bytes: int = 0
    why: str | None = None


class KVBuffers(Struct):
    status: str
    rows: list[KVBufferRow] = []


class BufferRow(Struct, omit_defaults=True):
    buffer: str
    kind: str
    mib: float
    same_pages_as: str | None = None          # a host mapped buffer whose pages a device mapping holds: not re-counted


class BufferGroup(Struct, omit_defaults=True):
    device: str                               # a device name, or "host"
    buffers: list[BufferRow]
    total_mib: float                          # each page once
    file_backed_mib: float | None = None      # host: the mapped model file (reclaimable)
    anonymous_mib: float | None = None        # host: what RAM must hold


class ModelCheck(Struct, omit_defaults=True):
    status: str                               # "predicted", or why not
    printed_mib: float = 0.0
    compared: str | None = None
    compared_mib: float | None = None
    predicted_mib: float | None = None
    residual_pct: float | None = None
    source: str | None = None
    rounding_mib: float | None = None
    unused_mib: float | None = None           # tensors llama.cpp ignores, taken off the file's bytes
    tensor_table: dict[str, Any] | None = None


class ComputeRow(Struct, omit_defaults=True):
    buffer: str
    backend: str
    printed_mib: float
    predicted_mib: float | None = None
    source: str | None = None
    residual_pct: float | None = None


class DeviceRow(Struct, omit_defaults=True):
    device: str
    printed_mib: float
    limit_mib: float | None = None
    limit: str | None = None
    fits: bool | None = None
    fit_withheld: str | None = None
    note: str | None = None


class Overhead(Struct, omit_defaults=True):
    status: str                               # "measured", or why the unaccounted column cannot be read as overhead
    mib: int | None = None                    # device memory in use beyond llama.cpp's buffers (measured rows only)


class BreakdownColumns(Struct):
    model: int
    context: int
    compute: int


class BreakdownRow(Struct, omit_defaults=True):
    """A row of llama.cpp's memory breakdown table at exit (whole MiB, as printed), with the same columns summed
    from the log's buffer lines (``edgekv``); ``match`` when each agrees within 1 MiB, None when no buffer line
    belongs to the row."""
    name: str
    kind: str                                 # "device", "host", or "extra" (a host-side row such as CPU_REPACK)
    source: str                               # "exit"
    self_mib: int = msgspec.field(name="self")
    model: int = 0
    context: int = 0
    compute: int = 0
    overhead: Overhead | None = None
    match: bool | None = None
    why: str | None = None
    edgekv: BreakdownColumns | None = None
    device: str | None = None
    total: int | None = None
    free: int | None = None
    unaccounted: int | None = None            # negative: the backend's free memory did not follow the allocations
    wrapped: bool | None = None               # printed as an unsigned wrap (2^44 MiB less the deficit)
    free_wrapped: bool | None = None


class Check(Struct):
    requested: bool                           # explain --check
    ok: bool                                  # no disagreement (what --check exits on)
    disagreements: list[str]


class ReadStats(Struct, omit_defaults=True):
    bytes: int
    lines: int
    kept: int
    long_lines: int = 0
    binary_lines: int = 0
    stopped: str | None = None


class ExplainReport(Struct, omit_defaults=True):
    schema_version: int
    source: str
    config: dict[str, Any]
    buffers: list[BufferGroup]
    kv: KVCheck
    model: ModelCheck
    compute: list[ComputeRow]
    devices: list[DeviceRow]
    kv_buffers: KVBuffers | None = None
    build: str | None = None
    llama_cpp_python: str | None = None
    why: str | None = None
    cut: str | None = None                    # set when the log ends before llama.cpp finished allocating
    notes: list[str] = []
    check: Check | None = None
    read: ReadStats | None = None
    breakdown: list[BreakdownRow] = []       # added in schema 1 (optional): absent when the log prints no table


def report(result: dict[str, Any]) -> ExplainReport:
    """The explanation as the typed report (raises msgspec.ValidationError on a field of the wrong type)."""
    return msgspec.convert({**result, "schema_version": SCHEMA_VERSION}, ExplainReport)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``explain --json`` (docs/explain.md shows it)."""
    return msgspec.json.schema(ExplainReport)
