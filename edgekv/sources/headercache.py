"""The header cache under ``edgekv_home()/headers``: GGUF header bytes of remote models, their fetch metadata,
and the commits that Hugging Face revisions resolved to, so that a second run needs no network."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from edgekv.sources.home import edgekv_home
from edgekv.sources.safepath import (
    COMMIT_RE,
    atomic_write,
    check_commit,
    check_relpath,
    check_repo_id,
    check_revision,
    inside,
    ref_name,
    safe_segment,
)

if TYPE_CHECKING:
    from edgekv.sources.hfref import HfFile



# -- the header cache ---------------------------------------------------------------------------------

def _headers_root() -> Path:
    return edgekv_home() / "headers"


def hf_repo_dir(repo: str) -> Path:
    check_repo_id(repo, repo)
    return _headers_root() / "hf" / repo.replace("/", "--")


def hf_header_path(f: HfFile, commit: str) -> Path:
    what = f"hf://{f.repo}/{f.filename}"
    p = hf_repo_dir(f.repo) / check_commit(commit, what) / check_relpath(f.filename, what)
    inside(_headers_root(), p, what)
    return p


def url_file_name(url: str) -> str:
    """The file name a URL ends with, when it is one safe path segment, else 'model.gguf'."""
    return safe_segment(unquote(urlsplit(url).path.rsplit("/", 1)[-1]), "model.gguf")


def url_header_path(url: str) -> Path:
    key = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    p = _headers_root() / "url" / key / url_file_name(url)
    inside(_headers_root(), p, url)
    return p


def _meta_path(p: Path) -> Path:
    return p.with_name(p.name + ".json")


def cached_header(p: Path) -> dict[str, Any] | None:
    """The metadata of a complete cached header file, or None."""
    inside(_headers_root(), p, str(p))
    try:
        meta = json.loads(_meta_path(p).read_text())
        if p.stat().st_size != meta["stored_bytes"]:
            return None
        return meta
    except (OSError, ValueError, KeyError):
        return None


def write_header_file(p: Path, data: bytes) -> None:
    atomic_write(p, data, root=_headers_root())


def store_header(p: Path, data: bytes, meta: dict[str, Any]) -> None:
    write_header_file(p, data)
    meta = {**meta, "stored_bytes": len(data), "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_header_file(_meta_path(p), json.dumps(meta, indent=1).encode())   # written last: marks the header complete


def ref_file(repo: str, revision: str) -> Path:
    check_revision(revision, f"{repo}@{revision}")
    p = hf_repo_dir(repo) / "refs" / ref_name(revision)
    inside(_headers_root(), p, f"{repo}@{revision}")
    return p


def cached_commit(repo: str, revision: str) -> str | None:
    if COMMIT_RE.fullmatch(revision):
        return revision
    try:
        c = ref_file(repo, revision).read_text().strip()
    except OSError:
        return None
    return c if COMMIT_RE.fullmatch(c) else None


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not stats:
        return None
    out = {"bytes_received": sum(s["bytes_received"] for s in stats), "requests": sum(s["requests"] for s in stats),
           "seconds": round(sum(s["seconds"] for s in stats), 4),
           "file_size": sum((s.get("file_size") or 0) for s in stats), "files": len(stats)}
    return out


def fetch_note(display: str, fetch: dict[str, Any] | None, cache_path: Path) -> str:
    if fetch is None:
        return f"{display}: header from edgekv's cache ({cache_path.parent})"
    return (f"{display}: read the header over HTTP: {fetch['bytes_received']:,} bytes in {fetch['requests']} "
            f"request(s), {fetch['seconds']:.2f} s, of a {fetch['file_size']:,}-byte model; cached in {cache_path.parent}")
