"""Write a tiny GGUF (header + tensor-info table, sparse data) from a spec.

A spec is plain JSON (see ``tests/tiny/specs.json``)::

    {"arch": "llama",
     "metadata": [["general.architecture", "string", "llama"], ["llama.block_count", "uint32", 4], ...],
     "tensors":  [["token_embd.weight", [128, 256], "f32"], ...]}

Metadata entries carry their exact GGUF type (llama.cpp refuses ``key X has wrong type``):
``uint32``, ``int32``, ``float32``, ``bool``, ``string``, ``uint64`` or ``array[uint32|int32|float32|bool|string]``.
Tensor shapes are in ggml order (``ne0`` first), as llama.cpp prints them.  Only the header is
written; the file is then extended (sparse) to the size its tensor table implies, so a 100 MB
"model" costs a few KB of disk.  llama.cpp's dry run (``no_alloc``, ``load_mode=NONE``) never reads
tensor data.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from edgekv.sources.tinymodel import tensor_nbytes as _tensor_nbytes
from edgekv.sources.tinymodel import write_sparse, write_table

SCALAR_TYPES = {
    "uint8": GGUFValueType.UINT8, "int8": GGUFValueType.INT8,
    "uint16": GGUFValueType.UINT16, "int16": GGUFValueType.INT16,
    "uint32": GGUFValueType.UINT32, "int32": GGUFValueType.INT32,
    "uint64": GGUFValueType.UINT64, "int64": GGUFValueType.INT64,
    "float32": GGUFValueType.FLOAT32, "float64": GGUFValueType.FLOAT64,
    "bool": GGUFValueType.BOOL, "string": GGUFValueType.STRING,
}

TENSOR_TYPES = {t.name.lower(): t for t in GGMLQuantizationType}


def tensor_nbytes(ne: Sequence[int], type_name: str) -> int:
    return _tensor_nbytes(type_name, ne, TENSOR_TYPES[type_name])


def add_kv(w: GGUFWriter, key: str, type_name: str, value: Any) -> None:
    if type_name.startswith("array[") and type_name.endswith("]"):
        sub = SCALAR_TYPES[type_name[6:-1]]
        w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=sub)
        return
    vt = SCALAR_TYPES[type_name]
    if vt == GGUFValueType.BOOL:
        value = bool(value)
    elif vt in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        value = float(value)
    elif vt != GGUFValueType.STRING:
        value = int(value)
    w.add_key_value(key, value, vt)


def add_metadata(w: GGUFWriter, metadata: Iterable[Sequence[Any]]) -> None:
    for k, t, v in metadata:
        if k == "general.architecture":
            continue            # GGUFWriter adds it itself, first
        add_kv(w, k, t, v)


def write_gguf(path: str | os.PathLike, arch: str, metadata: Iterable[Sequence[Any]],
               tensors: Iterable[Sequence[Any]], header_only: bool = False) -> int:
    """Write the GGUF; return the file size (the implied full size, mostly a hole; ``header_only``: the header's,
    the file holding the metadata and tensor table alone)."""
    path = Path(path)
    w = GGUFWriter(path, arch, use_temp_file=False)
    add_metadata(w, metadata)
    table = [(name, ne, TENSOR_TYPES[type_name]) for name, ne, type_name in tensors]
    if header_only:
        return write_table(w, table)[0]
    return write_sparse(w, path, table)


def write_spec(path: str | os.PathLike, spec: dict[str, Any]) -> int:
    return write_gguf(path, spec["arch"], spec["metadata"], spec["tensors"])
