"""Untrusted strings never choose a path: validation of every part edgekv builds a cache path from.

What reaches a file name comes from URLs, hf:// specs, a models.toml anyone may share, or the answers
of a server (a hub's ``X-Repo-Commit``).  Each part is checked here before it is joined to a cache
root, and the joined path is resolved and checked to lie inside that root before anything is opened
(for writing, and for reading a cached header offline):

* a commit is exactly 40 lowercase hex characters;
* an ``owner/repo`` passes huggingface-hub's own ``validate_repo_id``;
* a revision (branch, tag, ``refs/pr/N``) has no control characters, no ``.``/``..`` segment and a
  bounded length, and is stored under a name that is either its URL-quoted form or a hash;
* a file name is a relative path of safe segments: no ``..`` or ``.``, not absolute, no NUL or other
  control character, no backslash, each segment at most 255 bytes and the whole at most 1024.

Anything else is refused with one line that names the offending part (:class:`UnsafePath`).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from edgekv import heavy
from edgekv.errors import EdgekvError

MAX_SEGMENT_BYTES = 255       # NAME_MAX on Linux, macOS and Windows file systems
MAX_PATH_BYTES = 1024         # a relative file name inside a repo
MAX_REVISION_CHARS = 255

COMMIT_RE = re.compile(r"[0-9a-f]{40}")        # a full git commit id
SHA256_RE = re.compile(r"[0-9a-f]{64}")        # a sha256 hex digest


class UnsafePath(EdgekvError, ValueError):
    """An untrusted string would choose where edgekv reads or writes (exit 1)."""


def _show(s: str) -> str:
    r = repr(s)
    return r if len(r) <= 120 else r[:100] + "…'"


def _bad_char(s: str) -> str | None:
    for ch in s:
        if ch == "\x00":
            return "a NUL byte"
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co") or ch in "\u2028\u2029":
            return f"the control character U+{ord(ch):04X}"
    return None


def check_commit(commit: object, what: str) -> str:
    """A 40-hex commit (what the hub must send as X-Repo-Commit), else :class:`UnsafePath`."""
    if not isinstance(commit, str) or not COMMIT_RE.fullmatch(commit):
        raise UnsafePath(f"{what}: commit {_show(str(commit))} is not 40 lowercase hex characters; refusing to use it")
    return commit


def check_repo_id(repo: str, what: str) -> str:
    """owner/name, by huggingface-hub's own validator (no '..', '--', slashes beyond one, length)."""
    hf_utils = heavy.huggingface_hub().utils

    bad = _bad_char(repo)
    if bad:
        raise UnsafePath(f"{what}: repository id {_show(repo)} contains {bad}")
    if repo.count("/") != 1:
        raise UnsafePath(f"{what}: repository id {_show(repo)} must be OWNER/NAME")
    try:
        hf_utils.validate_repo_id(repo)
    except hf_utils.HFValidationError as e:
        reason = str(e).splitlines()[0].rstrip(".")
        raise UnsafePath(f"{what}: repository id {_show(repo)} is not valid ({reason})") from None
    return repo


def check_revision(revision: str, what: str) -> str:
    """A branch, tag or commit name that may travel to the hub and name a ref file."""
    bad = _bad_char(revision)
    if bad:
        raise UnsafePath(f"{what}: revision {_show(revision)} contains {bad}")
    if not revision or len(revision) > MAX_REVISION_CHARS:
        raise UnsafePath(f"{what}: revision {_show(revision)} is empty or longer than {MAX_REVISION_CHARS} characters")
    if revision.startswith("/") or any(seg in ("", ".", "..") for seg in revision.split("/")):
        raise UnsafePath(f"{what}: revision {_show(revision)} has an empty, '.' or '..' segment")
    return revision


def check_relpath(name: str, what: str, kind: str = "file name") -> str:
    """A relative path of safe segments (as a repo file name), else :class:`UnsafePath`."""
    bad = _bad_char(name)
    if bad:
        raise UnsafePath(f"{what}: {kind} {_show(name)} contains {bad}")
    if not name:
        raise UnsafePath(f"{what}: empty {kind}")
    if "\\" in name:
        raise UnsafePath(f"{what}: {kind} {_show(name)} contains a backslash")
    if name.startswith("/") or os.path.isabs(name) or re.match(r"[A-Za-z]:", name):
        raise UnsafePath(f"{what}: {kind} {_show(name)} is an absolute path")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath(f"{what}: {kind} {_show(name)} is longer than {MAX_PATH_BYTES} bytes")
    for seg in name.split("/"):
        if seg in ("", ".", ".."):
            raise UnsafePath(f"{what}: {kind} {_show(name)} has an empty, '.' or '..' segment")
        if len(seg.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise UnsafePath(f"{what}: {kind} {_show(name)} has a segment longer than {MAX_SEGMENT_BYTES} bytes")
    return name


def safe_segment(name: str, fallback: str) -> str:
    """``name`` when it is one safe path segment, else ``fallback`` (for display-only names)."""
    try:
        check_relpath(name, "", "")
    except UnsafePath:
        return fallback
    return name if "/" not in name else fallback


def ref_name(revision: str) -> str:
    """The file name a revision's ref is stored under: its quoted form, or a hash when that is too long."""
    q = quote(revision, safe="")
    if q in (".", "..") or len(q) > 200:
        return "sha256-" + hashlib.sha256(revision.encode("utf-8", "surrogatepass")).hexdigest()
    return q


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` resolved, after checking it lies inside ``root`` (symlinks followed), else UnsafePath."""
    r = Path(os.path.realpath(root))
    p = Path(os.path.realpath(path))
    if p != r and r not in p.parents:
        raise UnsafePath(f"{what}: {path} resolves to {p}, outside edgekv's cache {r}; refusing to use it")
    return p


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, *, root: Path | None = None, what: str | None = None,
                suffix: str = ".tmp") -> Iterator[Path]:
    """A fresh temporary path beside ``path`` to write a whole file to; when the block ends without an
    exception the file is flushed to disk (fsync) and moved onto ``path`` (``os.replace``), else removed.

    The temporary name is unique (``tempfile.mkstemp`` in the same folder), so two writers of one file never
    share it; the file gets the permissions a plain ``open(path, "w")`` would give.  With ``root``, ``path``
    must lie inside it (UnsafePath otherwise), checked before and after its folder is created."""
    p = Path(path)
    if root is not None:
        inside(root, p, what or str(p))         # before anything is created
    p.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        inside(root, p, what or str(p))         # again: a directory on the way may be a symlink
    fd, name = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=suffix)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str, *, root: Path | None = None,
                 what: str | None = None) -> Path:
    """Write the whole file ``path`` atomically (see :func:`atomic_path`); ``str`` data is written as UTF-8."""
    with atomic_path(path, root=root, what=what) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)
