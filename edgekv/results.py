"""THE results schema: one JSON object per configuration, one per line (JSONL).

Schema history (``schema_version``):

* 1 -- first version: ``settings`` (what was asked), ``effective`` (what llama.cpp did),
  ``prediction`` (formula + engine), ``llama_log`` (what llama.cpp reported in the measured run),
  ``memory`` (what the OS measured), ``speed`` (every sample, with summaries), ``timing``,
  ``differences``, ``environment``, optional ``quality``.
* 2 -- the whole-process prediction: ``prediction.process`` (``workload``, ``peak_rss_bytes``,
  ``device_bytes`` per device, ``parts``: name, bytes, source, where, kind, note; see
  :mod:`edgekv.memmodel`) and ``memory_residual`` (measured - predicted peak RSS, bytes and %);
  optional ``settings.no_mmap``.  v1 records are upgraded with ``prediction.process = None`` (never
  predicted) and no residual: nothing is invented for them.

Loading upgrades older records step by step (``UPGRADES``) and refuses records written by a newer
edgekv.  Writing is append-only: each record is one ``write()`` of one line on an ``O_APPEND``
descriptor followed by ``fsync``, so an interrupted sweep leaves complete lines plus at most one
torn last line, which loading ignores (and a resumed sweep redoes).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .errors import ResultsError

SCHEMA_VERSION = 2


def _v1_to_v2(r: dict[str, Any]) -> dict[str, Any]:
    """v1 records predicted no whole-process memory: mark it absent (None), add no residual."""
    r = dict(r)
    pred = dict(r.get("prediction") or {})
    pred.setdefault("process", None)
    r["prediction"] = pred
    r["schema_version"] = 2
    return r


# v -> function upgrading a v record to v+1, in order.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}

# The settings that identify a configuration: two records with equal values describe the same
# measurement (resume skips it; compare pairs them).
KEY_SETTINGS = (
    "engine", "n_ctx", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max", "kv_unified", "n_batch",
    "n_ubatch", "n_threads", "n_gpu_layers", "n_prompt", "n_gen", "n_depth", "repetitions", "warmup", "quality",
)

# Environment facts that must agree before records are merged into one file or compared without
# --force (the pyperf habit: never silently mix runs from different setups).
CHECKED_ENVIRONMENT = (
    "machine_id", "cpu_model", "cpu_count_logical", "os", "llama_cpp_python", "llama_cpp_commit", "backends",
    "devices",
)


def config_key(model_sha256: str | None, settings: dict[str, Any]) -> str:
    key = {"model_sha256": model_sha256, **{k: settings.get(k) for k in KEY_SETTINGS}}
    if settings.get("no_mmap"):          # only when set, so the keys of earlier records stay the same
        key["no_mmap"] = True
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def env_signature(env: dict[str, Any]) -> dict[str, Any]:
    return {k: env.get(k) for k in CHECKED_ENVIRONMENT}


def env_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for k in CHECKED_ENVIRONMENT:
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)!r} vs {b.get(k)!r}")
    return out


def upgrade(record: dict[str, Any], where: str) -> dict[str, Any]:
    v = record.get("schema_version")
    if not isinstance(v, int):
        raise ResultsError(f"{where}: no integer schema_version; not an edgekv result")
    if v > SCHEMA_VERSION:
        raise ResultsError(
            f"{where}: written by a newer edgekv (schema {v}, this edgekv reads up to {SCHEMA_VERSION}); "
            "upgrade edgekv (pip install -U edgekv)")
    while v < SCHEMA_VERSION:
        fn = UPGRADES.get(v)
        if fn is None:
            raise ResultsError(f"{where}: schema {v} has no upgrade path to {SCHEMA_VERSION}")
        record = fn(record)
        v = record["schema_version"]
    return record


def load(path: str | os.PathLike, tolerate_torn_tail: bool = True) -> list[dict[str, Any]]:
    """Load an edgekv JSONL results file (strict, with upgrades)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such results file") from None
    except IsADirectoryError:
        raise ResultsError(f"{p}: is a directory; pass a .jsonl results file") from None
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = i == len(lines) or (i == len(lines) - 1 and not lines[-1])
        try:
            obj = json.loads(line)
        except ValueError:
            if last and tolerate_torn_tail and not complete:
                break      # a write interrupted mid-line: the sweep will redo it
            raise ResultsError(f"{p}:{i}: not valid JSON; the results file is damaged") from None
        if not isinstance(obj, dict):
            raise ResultsError(f"{p}:{i}: expected a JSON object per line")
        out.append(upgrade(obj, f"{p}:{i}"))
    return out


def append(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record atomically (one write of one line, then fsync)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _heal_torn_tail(p)
    data = (json.dumps(record, sort_keys=False, default=_default) + "\n").encode()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _heal_torn_tail(p: Path) -> None:
    """If the last line was torn by an interruption, cut it off so appends stay line-aligned."""
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(p, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # find the start of the torn line
        pos = size - 1
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            k = buf.rfind(b"\n")
            if k >= 0:
                f.truncate(start + k + 1)
                return
            pos = start
        f.truncate(0)


def write_all(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Write a whole results file atomically (temp file + os.replace), e.g. for merge."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=_default) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
