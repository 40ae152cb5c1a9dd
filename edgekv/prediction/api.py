"""High-level functions shared by the CLI and by ``import edgekv``."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from edgekv.core.arch import shape_from_metadata
from edgekv.core.predict import STATUS_OK, ContextParams, KVPrediction
from edgekv.core.predict import predict as _predict
from edgekv.core.shape import ModelShape
from edgekv.core.shapecheck import validate_shape
from edgekv.errors import UsageError
from edgekv.sources.gguf_header import GGUFHeader, merge_split_headers, read_header_file, split_count
from edgekv.sources.home import ModelRef
from edgekv.sources.resolve import DEFAULT_MODEL, local_split_paths, registry_or_none, resolve_model


@dataclass
class LoadedModel:
    ref: ModelRef
    header: GGUFHeader
    shape: ModelShape

    @property
    def weights_bytes(self) -> int:
        return self.header.weights_bytes

    @property
    def incomplete(self) -> str | None:
        """For a local file (or split) shorter than its header's tensor table needs (an interrupted download, a file
        cut after its header): one line with the bytes present and expected; None otherwise.  A remote model's
        header cache is header-only by design (``ref.complete`` False) and says nothing."""
        if not self.ref.complete or not self.header.tensors:
            return None
        n = len(self.header.shards)
        files = list(self.ref.shards) or (local_split_paths(self.ref.path, n) if n > 1 else [self.ref.path])
        try:
            present = sum(os.path.getsize(p) for p in files)
        except OSError:
            return None
        need = self.header.file_size
        if present >= need:
            return None
        name = self.ref.spec or self.ref.path
        if present <= self.header.data_offset:         # cut right after its header: a header-only file
            return f"{name}: the header only ({_size(present)} of {_size(need)}): the prediction uses the header only"
        return (f"{name}: only {_size(present)} of {_size(need)} present: tensor data missing "
                "(an interrupted download?); the prediction uses the header only")

    def require_whole(self, what: str) -> None:
        """Refuse, in one line, to run llama.cpp on a model whose tensor data is not all here."""
        if self.incomplete:
            raise UsageError(f"{self.incomplete.split(': the prediction')[0].split('; the prediction')[0]}; {what} "
                             "needs the whole file: "
                             "download it again (edgekv models pull NAME for a registry model)")


def _size(n: int) -> str:
    """Bytes as a person reads a download's size (decimal units, as file managers and browsers show them)."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.2f} {unit}" if unit == "GB" else f"{n / f:.1f} {unit}"
    return f"{n} B"


def _checked_shape(shape: ModelShape, header) -> ModelShape:
    """The shape with ``invalid_reason`` set when llama.cpp would refuse the file (edgekv.core.shapecheck)."""
    why = validate_shape(shape, {t.name: t.shape for t in header.tensors} if header is not None else None)
    return msgspec.structs.replace(shape, invalid_reason=why) if why else shape


def load_model(spec: str | None) -> LoadedModel:
    """Resolve a MODEL argument and read its header and shape (no llama.cpp involved).

    MODEL is a path, a models.toml name, ``hf://OWNER/REPO/FILE.gguf[@REV]`` or an https URL; remote
    models need only their header (see :mod:`edgekv.sources.resolve`).  A split GGUF is read as one model.
    """
    ref = resolve_model(spec)
    header = read_header_file(ref.path)
    n = split_count(header)
    if n > 1:
        paths = ref.shards or local_split_paths(ref.path, n)
        header = merge_split_headers([header] + [read_header_file(p) for p in paths[1:]])
    shape = shape_from_metadata(header.metadata, ref.path, header.value_types)
    shape = _checked_shape(shape, header)
    return LoadedModel(ref, header, shape)


def predict(model: str | LoadedModel | ModelShape | None = None, n_ctx: int = 4096, type_k: str = "f16",
            type_v: str | None = None, flash_attn: str = "auto", swa_full: bool = False, n_seq_max: int = 1,
            kv_unified: bool = False, n_batch: int = 2048, n_ubatch: int = 512) -> KVPrediction:
    """Predict llama.cpp's cache bytes for a model file (path or known name) at one setting.

    Defaults are llama.cpp's command-line defaults.  ``type_v`` follows ``type_k`` when omitted.
    """
    if isinstance(model, ModelShape):
        shape = model
    elif isinstance(model, LoadedModel):
        shape = model.shape
    else:
        shape = load_model(model).shape
    params = ContextParams(n_ctx=n_ctx, type_k=type_k, type_v=type_v or type_k, flash_attn=flash_attn,
                           swa_full=swa_full, n_seq_max=n_seq_max, kv_unified=kv_unified, n_batch=n_batch,
                           n_ubatch=n_ubatch)
    return _predict(shape, params)


def registry_sweep_defaults(spec: str | None):
    """The models.toml sweep defaults for a registry name (the default model included), else None."""
    reg = registry_or_none()
    entry = reg.get(spec or DEFAULT_MODEL) if reg is not None else None
    return entry.sweep if entry is not None else None


# llama-cpp-python's Llama() differs from llama.cpp's command line (reference §5.1):
# flash_attn=False (an explicit DISABLE: V padded, quantized V refused) and swa_full=True.
LLAMA_PY_DEFAULTS: dict[str, Any] = {"flash_attn": "off", "swa_full": True}


def llama_python_defaults_cost(shape: ModelShape, params: ContextParams) -> tuple[int, int] | None:
    """(bytes with llama.cpp CLI defaults, bytes with Llama() defaults) when they differ, else None."""
    a = _predict(shape, params)
    b = _predict(shape, replace(params, **LLAMA_PY_DEFAULTS))
    if a.status != STATUS_OK or b.status != STATUS_OK or a.total_bytes == b.total_bytes:
        return None
    return a.total_bytes, b.total_bytes
