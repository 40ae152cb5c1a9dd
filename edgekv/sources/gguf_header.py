"""Streaming GGUF header reader.

Reads the GGUF header -- metadata and the tensor-info table -- from any byte source with a
``read(n)`` method: a whole file, a file cut right after the tensor-info table (what a range request
of the first few MB returns), or a remote reader that fetches ranges on demand (``remote.py``).

``gguf.GGUFReader`` memory-maps the whole file and builds every tensor, so it fails on a truncated
file and cannot stream; the parsing is therefore ours, while the type enums and block-size tables
(``GGUFValueType``, and the tensor block sizes through :func:`edgekv.core.cachetypes.ggml_type_info`) come from the
``gguf`` package.

Memory stays bounded whatever the input says: nothing is pre-allocated from a count read from the
file, large arrays (the tokenizer's 150K-entry token lists) are walked and summarised instead of
kept, and absurd counts or lengths raise :class:`GGUFFormatError` before anything is allocated.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from gguf import GGUFValueType

from edgekv.core.cachetypes import UnknownTensorType, ggml_type_info, ggml_type_name
from edgekv.core.metadata import ArraySummary
from edgekv.errors import GGUFFormatError, GGUFTruncatedError, ModelNotFound

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32          # GGUF_DEFAULT_ALIGNMENT in ggml/src/gguf.cpp
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64

# Sanity limits (issue 18), each checked before anything is allocated or walked.  They are far above
# anything a real model has (the largest tokenizers hold ~260K tokens and ~500K merges; a 671B MoE has
# ~1,100 tensors; chat templates are ~100 KB) and keep reading a hostile header bounded in time and
# memory: about 100 MiB of RSS and seconds, whatever the header declares.
MAX_STRING_BYTES = 16 * 1024 * 1024     # one metadata string
MAX_KEPT_STRING_BYTES = 64 * 1024 * 1024    # all metadata strings kept in memory together
MAX_KEPT_VALUES = 1 << 21               # all array items kept in memory together
MAX_METADATA_BYTES = 512 * 1024 * 1024  # the metadata section (what is walked, kept or not)
MAX_HEADER_BYTES = MAX_METADATA_BYTES + 64 * 1024 * 1024    # metadata + the tensor-info table
MAX_KV_COUNT = 1 << 16
MAX_TENSOR_COUNT = 1 << 17
MAX_ARRAY_LEN = 1 << 24                 # items of one array of scalars or strings
MAX_NESTED_ARRAY_LEN = 1 << 16          # items of one array of arrays
ARRAY_KEEP_LIMIT = 8192                 # arrays longer than this are summarised, not kept
MAX_NESTED_ARRAY_DEPTH = 2

_SCALAR_FMT = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]          # ne0 first, as ggml stores it
    ggml_type: int
    offset: int                     # relative to the start of the data section
    n_bytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFHeader:
    source: str
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: list[TensorInfo]
    alignment: int
    header_bytes: int               # bytes up to the end of the tensor-info table
    data_offset: int                # header_bytes padded to the alignment
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shards(self) -> list[GGUFHeader]:
        """The per-file headers of a split model (:func:`merge_split_headers`); empty for one file."""
        return self.extra.get("shards", [])

    @property
    def tensor_data_bytes(self) -> int:
        """Bytes the tensor data section spans (the last tensor's end; summed over a split's files)."""
        if self.shards:
            return sum(s.tensor_data_bytes for s in self.shards)
        return max((t.offset + t.n_bytes for t in self.tensors), default=0)

    @property
    def file_size(self) -> int:
        """The size a complete file must have for llama.cpp to accept it (all files of a split)."""
        if self.shards:
            return sum(s.file_size for s in self.shards)
        return self.data_offset + self.tensor_data_bytes

    @property
    def weights_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def weights_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type_name] = out.get(t.type_name, 0) + t.n_bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class _Stream:
    """Sequential reader over a buffer refilled in large blocks, with precise truncation errors.

    Parsing works on an in-memory window (``struct.unpack_from``), so walking a 262K-entry token
    array costs well under a second, while memory stays at one block plus the largest single item.
    """

    BLOCK = 1 << 20

    def __init__(self, f: BinaryIO, name: str, size_hint: int | None):
        self.f = f
        self.name = name
        self.size_hint = size_hint
        self.buf = b""
        self.off = 0          # read position inside buf
        self.base = 0         # absolute offset of buf[0]
        self.kept_bytes = 0   # metadata string bytes kept (MAX_KEPT_STRING_BYTES)
        self.kept_values = 0  # array items kept (MAX_KEPT_VALUES)

    @property
    def pos(self) -> int:
        return self.base + self.off

    def _truncated(self, n: int, what: str) -> GGUFTruncatedError:
        end = self.size_hint if self.size_hint is not None else self.base + len(self.buf)
        return GGUFTruncatedError(
            f"{self.name}: ends at {end} bytes, inside the GGUF header ({what} at offset {self.pos}); "
            "the file is cut short or corrupt", needed=self.pos + n)

    def _ensure(self, n: int, what: str) -> None:
        avail = len(self.buf) - self.off
        if avail >= n:
            return
        if self.pos + n > MAX_HEADER_BYTES:
            raise GGUFFormatError(f"{self.name}: the GGUF header runs past {MAX_HEADER_BYTES >> 20} MiB ({what} at "
                                  f"offset {self.pos}); no model has a header this large, the file is corrupt")
        if self.size_hint is not None and self.pos + n > self.size_hint:
            raise self._truncated(n, what)
        parts = [self.buf[self.off:]]
        need = n - avail
        want = max(need, self.BLOCK)
        if self.size_hint is not None:
            want = min(want, self.size_hint - (self.base + len(self.buf)))
            want = max(want, need)
        got = 0
        while got < need:
            b = self.f.read(want - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        self.base += self.off
        self.buf = b"".join(parts)
        self.off = 0
        if len(self.buf) < n:
            raise self._truncated(n, what)

    def read(self, n: int, what: str) -> bytes:
        self._ensure(n, what)
        b = self.buf[self.off:self.off + n]
        self.off += n
        return b

    def skip(self, n: int, what: str) -> None:
        while n > 0:
            step = min(n, self.BLOCK)
            self._ensure(step, what)
            self.off += step
            n -= step

    def unpack(self, st: struct.Struct, what: str):
        self._ensure(st.size, what)
        v = st.unpack_from(self.buf, self.off)[0]
        self.off += st.size
        return v

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)

    def string(self, what: str, max_bytes: int = MAX_STRING_BYTES) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > max_bytes:
            raise GGUFFormatError(f"{self.name}: absurd string length {n} for {what} at offset {at} (at most "
                                  f"{max_bytes} bytes); the file is corrupt")
        self.kept_bytes += n
        if self.kept_bytes > MAX_KEPT_STRING_BYTES:
            raise GGUFFormatError(f"{self.name}: the metadata strings exceed {MAX_KEPT_STRING_BYTES >> 20} MiB "
                                  f"(at {what}, offset {at}); no model has this much, the file is corrupt")
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int, what: str) -> None:
        """Walk ``count`` GGUF strings without decoding or keeping them."""
        unpack_from = _U64.unpack_from
        remaining = count
        while remaining:
            buf, off, end = self.buf, self.off, len(self.buf)
            while remaining and off + 8 <= end:
                (n,) = unpack_from(buf, off)
                if n > MAX_STRING_BYTES:
                    raise GGUFFormatError(
                        f"{self.name}: absurd string length {n} in {what} at offset {self.base + off}; the file is corrupt")
                if off + 8 + n > end:
                    break
                off += 8 + n
                remaining -= 1
            self.off = off
            if remaining:
                # the next item straddles the window: make it whole (or fail as truncated)
                (n,) = (self.unpack(_U64, f"length in {what}"),)
                if n > MAX_STRING_BYTES:
                    raise GGUFFormatError(
                        f"{self.name}: absurd string length {n} in {what} at offset {self.pos - 8}; the file is corrupt")
                self.skip(n, what)
                remaining -= 1


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR_STRUCT = {t: struct.Struct("<" + f) for t, f in _SCALAR_FMT.items()}


def _value_type(code: int, name: str, key: str, at: int) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise GGUFFormatError(f"{name}: unknown GGUF value type {code} for key '{key}' at offset {at}") from None


def _read_value(s: _Stream, vtype: GGUFValueType, key: str, depth: int = 0) -> tuple[Any, str]:
    if vtype == GGUFValueType.STRING:
        return s.string(f"value of '{key}'"), "string"
    if vtype in _SCALAR_FMT:
        return s.unpack(_SCALAR_STRUCT[vtype], f"value of '{key}'"), vtype.name.lower()
    if vtype == GGUFValueType.ARRAY:
        if depth >= MAX_NESTED_ARRAY_DEPTH:
            raise GGUFFormatError(f"{s.name}: arrays nested too deep in key '{key}'")
        at = s.pos
        itype = _value_type(s.u32(f"array type of '{key}'"), s.name, key, at)
        n = s.u64(f"array length of '{key}'")
        cap = MAX_NESTED_ARRAY_LEN if itype == GGUFValueType.ARRAY else MAX_ARRAY_LEN
        if n > cap:
            raise GGUFFormatError(f"{s.name}: absurd array length {n} for key '{key}' at offset {at} (at most {cap} "
                                  f"items of {itype.name.lower()}); the file is corrupt")
        min_item = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(itype) or struct.calcsize(
            "<" + _SCALAR_FMT.get(itype, "B"))
        if at + n * min_item > MAX_METADATA_BYTES or (s.size_hint is not None and at + n * min_item > s.size_hint):
            raise GGUFFormatError(f"{s.name}: array '{key}' at offset {at} declares {n} items, at least {n * min_item} "
                                  "bytes, more than the file or edgekv's metadata cap "
                                  f"({MAX_METADATA_BYTES >> 20} MiB) holds; the file is corrupt")
        type_name = f"array[{itype.name.lower()}]"
        keep = n <= ARRAY_KEEP_LIMIT
        if keep:
            s.kept_values += n
            if s.kept_values > MAX_KEPT_VALUES:
                raise GGUFFormatError(f"{s.name}: the metadata arrays keep more than {MAX_KEPT_VALUES} items (at key "
                                      f"'{key}', offset {at}); no model has this many, the file is corrupt")
        if itype in _SCALAR_FMT:
            fmt = _SCALAR_FMT[itype]
            size = struct.calcsize("<" + fmt)
            if keep:
                data = s.read(n * size, f"array '{key}'")
                return list(struct.unpack(f"<{n}{fmt}", data)), type_name
            s.skip(n * size, f"array '{key}'")
            return ArraySummary(itype.name.lower(), n), type_name
        if itype == GGUFValueType.STRING and not keep:
            s.skip_strings(n, f"array '{key}'")
            return ArraySummary("string", n), type_name
        if not keep:
            s.kept_values += ARRAY_KEEP_LIMIT    # what a walked (not kept) array of arrays may still hold
        values: list[Any] = []
        for _ in range(n):
            v, _t = _read_value(s, itype, key, depth + 1)
            if keep:
                values.append(v)
        return (values if keep else ArraySummary(itype.name.lower(), n)), type_name
    raise GGUFFormatError(f"{s.name}: unsupported value type {vtype} for key '{key}'")


def read_header(f: BinaryIO, name: str = "<stream>", size_hint: int | None = None) -> GGUFHeader:
    """Parse a GGUF header from a binary stream positioned at its start.

    ``size_hint``: the number of bytes available, when known (a local file's size); reads past it
    raise :class:`GGUFTruncatedError` without touching the stream.
    """
    s = _Stream(f, name, size_hint)
    version, n_tensors, n_kv = _read_preamble(s, name)
    metadata, value_types, alignment = _read_metadata(s, name, n_kv)
    tensors = _read_tensor_infos(s, name, n_tensors, alignment)
    header_bytes = s.pos
    data_offset = (header_bytes + alignment - 1) // alignment * alignment
    return GGUFHeader(
        source=name, version=version, metadata=metadata, value_types=value_types, tensors=tensors,
        alignment=alignment, header_bytes=header_bytes, data_offset=data_offset,
    )


def _read_preamble(s: _Stream, name: str) -> tuple[int, int, int]:
    """Magic, version, tensor count and metadata count, each checked as llama.cpp checks it."""
    try:
        magic = s.read(4, "magic")
    except GGUFTruncatedError:
        raise GGUFFormatError(f"{name}: not a GGUF file (shorter than 4 bytes)") from None
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(
            f"{name}: not a GGUF file (starts with {magic!r}, expected b'GGUF'); pass a .gguf model")
    raw_version = s.read(4, "version")
    version = struct.unpack("<I", raw_version)[0]
    if version & 0xFFFF == 0 and struct.unpack(">I", raw_version)[0] in (1, 2, 3):
        raise GGUFFormatError(f"{name}: big-endian GGUF; llama.cpp on this machine reads little-endian files only")
    if version == 1:
        raise GGUFFormatError(f"{name}: GGUF version 1 is obsolete and llama.cpp no longer reads it; re-convert the model")
    if version not in (2, 3):
        raise GGUFFormatError(f"{name}: unsupported GGUF version {version} (llama.cpp reads versions 2 and 3)")

    n_tensors = s.u64("tensor count")
    n_kv = s.u64("metadata count")
    if n_tensors > MAX_TENSOR_COUNT:
        raise GGUFFormatError(f"{name}: absurd tensor count {n_tensors}; the file is corrupt")
    if n_kv > MAX_KV_COUNT:
        raise GGUFFormatError(f"{name}: absurd metadata count {n_kv}; the file is corrupt")
    return version, n_tensors, n_kv


def _read_metadata(s: _Stream, name: str, n_kv: int) -> tuple[dict[str, Any], dict[str, str], int]:
    """The ``n_kv`` metadata pairs, their GGUF value types, and the checked ``general.alignment``."""
    metadata: dict[str, Any] = {}
    value_types: dict[str, str] = {}
    for _ in range(n_kv):
        key = s.string("metadata key")
        at = s.pos
        vtype = _value_type(s.u32(f"type of '{key}'"), name, key, at)
        value, tname = _read_value(s, vtype, key)
        if key in metadata:
            raise GGUFFormatError(f"{name}: duplicate metadata key '{key}'")
        if s.pos > MAX_METADATA_BYTES:
            raise GGUFFormatError(f"{name}: the metadata runs past {MAX_METADATA_BYTES >> 20} MiB (at key '{key}'); "
                                  "no model has this much, the file is corrupt")
        metadata[key] = value
        value_types[key] = tname

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and value_types["general.alignment"] != "uint32":
        raise GGUFFormatError(f"{name}: general.alignment must be uint32, is {value_types['general.alignment']}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"{name}: general.alignment = {alignment!r} is not a power of two")
    return metadata, value_types, alignment


def _read_tensor_infos(s: _Stream, name: str, n_tensors: int, alignment: int) -> list[TensorInfo]:
    """The tensor-info table: names, shapes, types, and offsets that must follow each other as gguf.cpp requires."""
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    expected_offset = 0
    for i in range(n_tensors):
        tname = s.string(f"name of tensor {i}", max_bytes=GGML_MAX_NAME - 1)
        if len(tname.encode()) >= GGML_MAX_NAME:
            raise GGUFFormatError(f"{name}: tensor name '{tname[:80]}' is too long (ggml allows {GGML_MAX_NAME - 1} bytes)")
        n_dims = s.u32(f"dimension count of tensor '{tname}'")
        if n_dims > GGML_MAX_DIMS:
            raise GGUFFormatError(f"{name}: tensor '{tname}' has {n_dims} dimensions (ggml allows {GGML_MAX_DIMS})")
        dims = tuple(s.u64(f"dimension of tensor '{tname}'") for _ in range(n_dims))
        at = s.pos
        type_id = s.u32(f"type of tensor '{tname}'")
        offset = s.u64(f"offset of tensor '{tname}'")
        try:
            tyname, block, block_bytes = ggml_type_info(type_id)
        except UnknownTensorType as e:
            raise GGUFFormatError(f"{name}: tensor '{tname}' (offset {at}): {e}") from None
        n_el = 1
        for d in dims:
            n_el *= d
        if n_el >= 1 << 62:
            raise GGUFFormatError(f"{name}: tensor '{tname}' has absurd dimensions {dims}")
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise GGUFFormatError(
                f"{name}: tensor '{tname}' row of {ne0} is not a multiple of the {tyname} (ggml type {type_id}) block "
                f"size {block}; llama.cpp refuses this file")
        if tname in seen:
            raise GGUFFormatError(f"{name}: duplicate tensor name '{tname}'")
        seen.add(tname)
        if offset != expected_offset:
            # gguf.cpp requires the data of each tensor to follow the previous one, padded to the alignment
            hint = ""
            if tensors and ggml_type_info(tensors[-1].ggml_type)[1] > 1:
                prev = tensors[-1]
                pname = ggml_type_info(prev.ggml_type)[0]
                hint = (f" (the previous tensor '{prev.name}' is ggml type {prev.ggml_type}, {pname}: if the file was "
                        f"written with another block layout for that type id, e.g. by a llama.cpp fork, llama.cpp "
                        f"cannot read it)")
            raise GGUFFormatError(
                f"{name}: tensor '{tname}' has offset {offset}, expected {expected_offset}; llama.cpp refuses this "
                f"file{hint}")
        nbytes = n_el // block * block_bytes
        expected_offset += (nbytes + alignment - 1) // alignment * alignment
        tensors.append(TensorInfo(tname, dims, type_id, offset, nbytes))
    return tensors


def read_header_file(path: str | os.PathLike) -> GGUFHeader:
    """Read the header of a local file (complete or cut after the tensor-info table)."""
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
        f = open(p, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise ModelNotFound(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ModelNotFound(f"{p}: is a directory, not a GGUF file") from None
    except PermissionError:
        raise ModelNotFound(f"{p}: permission denied") from None
    with f:
        h = read_header(f, name=p, size_hint=size)
    h.extra["available_bytes"] = size
    return h


# -- split GGUFs ---------------------------------------------------------------------------------------
# llama.cpp's llama_split_path(): "%s-%05d-of-%05d.gguf"; gguf-split writes split.no / split.count /
# split.tensors.count into every file, and the full metadata only into the first.

KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS = "split.tensors.count"
_SPLIT_NAME = re.compile(r"(?P<prefix>.*)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf")


def split_file_name(prefix: str, index: int, count: int) -> str:
    """Name of split file ``index`` (0-based), as llama.cpp's llama_split_path() spells it."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def parse_split_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, 0-based index, count) for a name like ``x-00002-of-00003.gguf``, else None."""
    m = _SPLIT_NAME.fullmatch(name)
    if not m:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        return None
    return m["prefix"], no - 1, count


def split_count(header: GGUFHeader) -> int:
    """split.count of a header (1 for an ordinary single-file model)."""
    v = header.metadata.get(KEY_SPLIT_COUNT)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 1 else 1


def merge_split_headers(headers: list[GGUFHeader]) -> GGUFHeader:
    """One model from the headers of all files of a split GGUF, in order.

    Metadata comes from the first file (llama.cpp reads it from there); tensors from every file;
    ``file_size`` and ``tensor_data_bytes`` sum over the files; ``shards`` keeps each file's header.
    The checks are llama.cpp's: the first file is split 0, each file says its own index and the same
    count, and the files hold exactly ``split.tensors.count`` distinct tensors.
    """
    if not headers:
        raise GGUFFormatError("no split files given")
    first = headers[0]
    n = split_count(first)
    if len(headers) == 1 and n == 1:
        return first
    if n != len(headers):
        raise GGUFFormatError(f"{first.source}: split.count is {n} but {len(headers)} files were given")
    seen: dict[str, str] = {}
    tensors: list[TensorInfo] = []
    for i, h in enumerate(headers):
        no = h.metadata.get(KEY_SPLIT_NO)
        cnt = h.metadata.get(KEY_SPLIT_COUNT)
        if no != i:
            raise GGUFFormatError(
                f"{h.source}: {KEY_SPLIT_NO} is {no!r}, expected {i}"
                + ("; pass the first file (-00001-of-...) of a split model" if i == 0 else ""))
        if cnt != n:
            raise GGUFFormatError(f"{h.source}: {KEY_SPLIT_COUNT} is {cnt!r}, the first file says {n}")
        for t in h.tensors:
            if t.name in seen:
                raise GGUFFormatError(f"{h.source}: tensor '{t.name}' is also in {seen[t.name]}")
            seen[t.name] = h.source
            tensors.append(t)
    expected = first.metadata.get(KEY_SPLIT_TENSORS)
    if isinstance(expected, int) and expected != len(tensors):
        raise GGUFFormatError(
            f"{first.source}: {KEY_SPLIT_TENSORS} is {expected} but the {n} files hold {len(tensors)} tensors")
    return GGUFHeader(
        source=first.source, version=first.version, metadata=first.metadata, value_types=first.value_types,
        tensors=tensors, alignment=first.alignment, header_bytes=sum(h.header_bytes for h in headers),
        data_offset=first.data_offset,
        extra={"shards": list(headers),
               "available_bytes": sum(h.extra.get("available_bytes", h.file_size) for h in headers)},
    )
