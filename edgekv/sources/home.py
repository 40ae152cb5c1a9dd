"""What every model source shares: edgekv's home folder, the resolved ``ModelRef``, the Hugging Face
environment (HF_HUB_OFFLINE, HF_ENDPOINT, HF_HUB_CACHE, read at call time) and sha256 stamps of local files."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekv import heavy
from edgekv.sources.safepath import (
    atomic_write,
)

if TYPE_CHECKING:
    pass


def edgekv_home() -> Path:
    """Edgekv's cache/state directory: $EDGEKV_HOME, else ~/.cache/edgekv."""
    env = os.environ.get("EDGEKV_HOME")
    return Path(env) if env else Path.home() / ".cache" / "edgekv"


@dataclass(frozen=True)
class ModelRef:
    spec: str                   # what the user asked for
    path: str                   # a local file (complete, or header-only for remote sources)
    name: str                   # short display name
    source: str                 # local | pypi | hf-cache | hf | url
    complete: bool = True       # False when only the header is on disk
    shards: tuple[str, ...] = ()    # all files of a split model, in order (path is the first)
    origin: str = ""            # hf://repo/file@commit or the URL the bytes came from
    fetch: dict[str, Any] | None = field(default=None, compare=False)   # HTTP transfer of this call
    notes: tuple[str, ...] = ()     # one-line remarks for the user (where the header came from, ...)


# -- environment ------------------------------------------------------------------------------------

def _truthy(v: str) -> bool:
    return v.strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline() -> bool:
    """HF_HUB_OFFLINE (read now, not at import), else huggingface-hub's own setting."""
    v = os.environ.get("HF_HUB_OFFLINE")
    if v is not None:
        return _truthy(v)
    try:
        constants = heavy.huggingface_hub().constants
    except ImportError:  # pragma: no cover
        return False
    return bool(constants.HF_HUB_OFFLINE)


def hf_endpoint() -> str:
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    constants = heavy.huggingface_hub().constants

    return constants.ENDPOINT.rstrip("/")


def hf_cache_dir() -> str:
    """The Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else huggingface-hub's default."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return os.path.expanduser(env)
    home = os.environ.get("HF_HOME")
    if home:
        return os.path.join(os.path.expanduser(home), "hub")
    constants = heavy.huggingface_hub().constants

    return constants.HF_HUB_CACHE


def sha256_bytes(data: bytes) -> str:
    """The sha256 hex digest of bytes in memory (see :func:`sha256_file` for a file)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in chunks; :func:`verified_sha256` also stamps it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def _stamp_path(p: Path) -> Path:
    st = p.stat()
    key = hashlib.sha1(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    return edgekv_home() / "sha256" / key


def stamped_sha256(path: str | os.PathLike) -> str | None:
    """The sha256 :func:`verified_sha256` recorded for this exact file (path, size, mtime), if any."""
    try:
        stamp = _stamp_path(Path(path).resolve())
    except OSError:
        return None
    return stamp.read_text().strip() if stamp.is_file() else None


def verified_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, cached next to edgekv's state keyed by path, size and mtime."""
    p = Path(path).resolve()
    stamp = _stamp_path(p)
    if stamp.is_file():
        return stamp.read_text().strip()
    digest = sha256_file(p)
    atomic_write(stamp, digest)
    return digest
