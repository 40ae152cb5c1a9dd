"""Hugging Face: ``hf://OWNER/REPO/FILE.gguf[@REVISION]`` specs, the hub cache, the HEAD call
(``get_hf_file_metadata``), header-only resolution, ``hf_hub_download`` for ``models pull``, and dataset files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from edgekv import heavy
from edgekv.errors import SourceError, UsageError
from edgekv.sources.gguf_header import (
    GGUFHeader,
    parse_split_name,
    read_header_file,
    split_count,
    split_file_name,
)
from edgekv.sources.headercache import (
    cached_commit,
    cached_header,
    fetch_note,
    hf_header_path,
    hf_repo_dir,
    merge_stats,
    ref_file,
    store_header,
    write_header_file,
)
from edgekv.sources.hfref import HfFile
from edgekv.sources.home import ModelRef, hf_cache_dir, hf_endpoint, offline, stamped_sha256
from edgekv.sources.remote import (
    HTTP_TIMEOUT_S,
    Deadline,
    ServerUnavailable,
    fetch_header,
    http_error,
    network_errors,
    offline_error,
    unreachable,
)
from edgekv.sources.safepath import (
    COMMIT_RE,
    SHA256_RE,
    check_commit,
    check_relpath,
    check_repo_id,
    check_revision,
)

# -- spec parsing -------------------------------------------------------------------------------------

def parse_hf_spec(spec: str) -> HfFile:
    """``hf://OWNER/REPO/PATH/FILE.gguf[@REVISION]``."""
    body = spec[len("hf://"):]
    rev = "main"
    if "@" in body:
        body, rev = body.rsplit("@", 1)
    parts = body.split("/")
    if len(parts) < 3 or not all(parts) or not rev:
        raise UsageError(f"'{spec}': write hf://OWNER/REPO/FILE.gguf or hf://OWNER/REPO/FILE.gguf@REVISION")
    return checked_hf_file(HfFile("/".join(parts[:2]), "/".join(parts[2:]), rev), spec)


def checked_hf_file(f: HfFile, what: str) -> HfFile:
    """``f`` after validating every part that becomes a path (repo, revision, file name)."""
    check_repo_id(f.repo, what)
    check_revision(f.revision, what)
    check_relpath(f.filename, what)
    return f


def hf_file_from_url(url: str) -> HfFile | None:
    """A Hugging Face ``/resolve/`` or ``/blob/`` URL on the configured endpoint, as an HfFile."""
    u = urlsplit(url)
    try:
        ep = urlsplit(hf_endpoint())
    except Exception:  # pragma: no cover
        return None
    if (u.scheme, u.netloc) != (ep.scheme, ep.netloc) and u.netloc not in ("huggingface.co", "hf.co"):
        return None
    parts = [unquote(p) for p in u.path.split("/") if p]
    if len(parts) >= 5 and parts[2] in ("resolve", "blob"):
        return checked_hf_file(HfFile(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), parts[3]), url)
    return None


# -- Hugging Face -------------------------------------------------------------------------------------

def hf_cached_file(f: HfFile, revision: str | None = None) -> str | None:
    """The complete file in the Hugging Face cache (no network), or None."""
    hf = heavy.huggingface_hub()

    try:
        p = hf.try_to_load_from_cache(f.repo, f.filename, cache_dir=hf_cache_dir(), revision=revision or f.revision)
    except Exception:  # a malformed cache must not break resolution
        return None
    return p if isinstance(p, str) and os.path.isfile(p) else None


def _status(e: Exception) -> int:
    response = getattr(e, "response", None)
    return response.status_code if response is not None else 0


def _hub_error(e: Exception, f: HfFile, display: str) -> SourceError:
    """One error line for huggingface-hub's HTTP errors (gated, missing repository / revision / file, any other
    status), the same for the HEAD that checks a file and for the download."""
    hf = heavy.huggingface_hub()

    if isinstance(e, hf.errors.GatedRepoError):
        return SourceError(f"{display}: {f.repo} is gated; accept its terms on the website, then 'hf auth login' "
                           "or set HF_TOKEN")
    if isinstance(e, hf.errors.RepositoryNotFoundError):
        return SourceError(f"{display}: repository {f.repo} not found on {hf_endpoint()} (or it is private: log in "
                           "with 'hf auth login')")
    if isinstance(e, hf.errors.RevisionNotFoundError):
        return SourceError(f"{display}: revision '{f.revision}' not found in {f.repo}")
    if isinstance(e, hf.errors.RemoteEntryNotFoundError):
        return SourceError(f"{display}: {f.filename} not found in {f.repo} at revision {f.revision}")
    return http_error(_status(e), "", display)


def _hf_head(f: HfFile, display: str, deadline: Deadline | None = None):
    dl = deadline or Deadline()
    return dl.run(display, _hf_head_now, f, display, dl)


def _hf_head_now(f: HfFile, display: str, dl: Deadline):
    """The hub's HEAD for a file: (commit, etag, size, location, headers for the range GETs)."""
    hf = heavy.huggingface_hub()

    ep = hf_endpoint()
    url = hf.hf_hub_url(f.repo, f.filename, revision=f.revision, endpoint=ep)
    try:
        meta = hf.get_hf_file_metadata(url, timeout=min(HTTP_TIMEOUT_S, max(dl.left(), 0.05)), endpoint=ep)
    except hf.errors.HfHubHTTPError as e:
        status = _status(e)
        if status >= 500:
            raise ServerUnavailable(f"HTTP {status}") from None
        raise _hub_error(e, f, display) from None
    if not meta.commit_hash:
        raise SourceError(f"{display}: {ep} did not send X-Repo-Commit; is HF_ENDPOINT a Hugging Face hub?")
    check_commit(meta.commit_hash, f"{display}: X-Repo-Commit from {ep}")
    headers = hf.utils.build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(ep).netloc:
        headers.pop("authorization", None)   # never send the token to a CDN
    return meta.commit_hash, meta.etag, meta.size, meta.location, headers


@dataclass(frozen=True)
class _HfAsk:
    """What resolve_hf was asked for, as each of its numbered steps needs it."""
    f: HfFile
    spec: str
    display: str
    name: str
    sha256: str | None
    size: int | None


def resolve_hf(f: HfFile, spec: str, *, sha256: str | None = None, size: int | None = None,
               display_name: str | None = None, display: str | None = None) -> ModelRef:
    display = display or (spec if spec.startswith("hf://") else f.spec)
    checked_hf_file(f, display)
    dl = Deadline()
    ask = _HfAsk(f, spec, display, display_name or f.filename.rsplit("/", 1)[-1], sha256, size)
    is_commit = bool(COMMIT_RE.fullmatch(f.revision))

    # 1. the complete file, when the Hugging Face cache has it (all files of a split)
    if is_commit or offline():
        ref = _from_hf_cache(ask, f.revision)
        if ref:
            return ref

    # 2. the commit, from the hub or (offline, unreachable) from edgekv's refs
    commit, head, why_offline = _hf_commit(ask, is_commit, dl)
    if head is not None and not is_commit:
        ref = _from_hf_cache(ask, commit)     # 1. again, at the commit the branch or tag names now
        if ref:
            return ref

    # 3. the header, cached or fetched
    fc = HfFile(f.repo, f.filename, commit)
    h, first_path, stats = _hf_header(ask, fc, head, why_offline, dl)

    # 4. the headers of a split model's other files, cached or fetched
    paths = [first_path]
    n = split_count(h)
    if n > 1:
        split_paths, split_stats = _hf_split_headers(ask, fc, n, why_offline, dl)
        paths += split_paths
        stats += split_stats
    fetch = merge_stats(stats)
    return ModelRef(spec=spec, path=str(first_path), name=ask.name, source="hf", complete=False,
                    shards=tuple(str(p) for p in paths) if n > 1 else (), origin=f"hf://{f.repo}/{f.filename}@{commit}",
                    fetch=fetch, notes=(fetch_note(display, fetch, first_path),))


def _from_hf_cache(ask: _HfAsk, revision: str) -> ModelRef | None:
    """1. The complete file at ``revision`` from the Hugging Face cache (every file of a split), or None."""
    f, display, sha256 = ask.f, ask.display, ask.sha256
    first = hf_cached_file(f, revision)
    if first is None:
        return None
    if sha256:
        if blob_sha(first) not in (None, sha256):
            return None     # another file (the branch moved on): not the one asked for
        if stamped_sha256(first) not in (None, sha256):
            raise SourceError(f"{first}: its content does not have sha256 {sha256} (checked by 'edgekv models "
                              "pull'); delete it from the Hugging Face cache and pull again")
    files = [first]
    parsed = parse_split_name(f.filename.rsplit("/", 1)[-1])
    if parsed and parsed[2] > 1:
        prefix, _, n = parsed
        for i in range(1, n):
            p = hf_cached_file(f.sibling(split_file_name(prefix, i, n)), revision)
            if p is None:
                return None
            files.append(p)
    return ModelRef(spec=ask.spec, path=first, name=ask.name, source="hf-cache", complete=True,
                    shards=tuple(files) if len(files) > 1 else (), origin=f"hf://{f.repo}/{f.filename}@{revision}",
                    notes=(f"{display}: the complete file from the Hugging Face cache",))


def _hf_commit(ask: _HfAsk, is_commit: bool, dl: Deadline) -> tuple[str, tuple | None, str | None]:
    """2. The commit of the revision: from the hub's HEAD (recorded in edgekv's refs for a branch or tag), else from
    those refs.  Returns (commit, the HEAD's answer or None, why the hub was not asked or not reached, or None)."""
    f, display = ask.f, ask.display
    commit = cached_commit(f.repo, f.revision)
    head = None
    why_offline = None
    if offline():
        why_offline = "HF_HUB_OFFLINE is set"
    elif not (is_commit and cached_header(hf_header_path(f, f.revision))):
        try:
            head = _hf_head(f, display, dl)
        except network_errors() as e:
            why_offline = unreachable(urlsplit(hf_endpoint()).netloc, e)
        else:
            commit = head[0]
            if not is_commit:
                write_header_file(ref_file(f.repo, f.revision), commit.encode())
    if commit is None:
        raise offline_error(display, f"the header of {f.repo}/{f.filename} at '{f.revision}' is not cached under "
                             f"{hf_repo_dir(f.repo)}", why_offline or "the revision is unknown")
    return commit, head, why_offline


def _hf_header(ask: _HfAsk, fc: HfFile, head: tuple | None, why_offline: str | None,
               dl: Deadline) -> tuple[GGUFHeader, Path, list[dict[str, Any]]]:
    """3. The header of ``fc`` (the file at its commit), cached or fetched with the HEAD's answer ``head``:
    (header, its path in edgekv's cache, the fetch's transfer stats)."""
    display, commit = ask.display, fc.revision
    if head is not None:
        _check_identity(display, head[1], head[2], ask.sha256, ask.size)
    first_path = hf_header_path(fc, commit)
    stats: list[dict[str, Any]] = []
    cached = cached_header(first_path)
    if cached is None:
        if head is None:
            raise offline_error(display, f"its header is not cached under {first_path.parent}",
                                 why_offline or "no network")
        h, data, st = fetch_header(head[3], head[4], display, deadline=dl)
        store_header(first_path, data, {"source": display, "commit": commit, "etag": head[1],
                                         "size": head[2], **st})
        stats.append(st)
    else:
        _check_identity(display, cached.get("etag"), cached.get("size"), ask.sha256, ask.size)
        h = read_header_file(first_path)
    return h, first_path, stats


def _hf_split_headers(ask: _HfAsk, fc: HfFile, n: int, why_offline: str | None,
                      dl: Deadline) -> tuple[list[Path], list[dict[str, Any]]]:
    """4. The headers of files 2..n of the split model whose first file is ``fc``, cached or fetched:
    (their paths in edgekv's cache, the fetches' transfer stats)."""
    display, commit = ask.display, fc.revision
    parsed = parse_split_name(fc.filename.rsplit("/", 1)[-1])
    if parsed is None or parsed[2] != n or parsed[1] != 0:
        raise SourceError(f"{display}: a split model ({n} files); name its first file, "
                          "PREFIX-00001-of-%05d.gguf" % n)
    prefix = parsed[0]
    paths: list[Path] = []
    stats: list[dict[str, Any]] = []
    for i in range(1, n):
        sib = fc.sibling(split_file_name(prefix, i, n))
        p = hf_header_path(sib, commit)
        paths.append(p)
        if cached_header(p) is not None:
            continue
        sdisplay = f"hf://{sib.repo}/{sib.filename}@{commit}"
        if offline() or why_offline:
            raise offline_error(display, f"the header of {sib.filename} is not cached",
                                 why_offline or "HF_HUB_OFFLINE is set")
        try:
            shead = _hf_head(sib, sdisplay, dl)
        except network_errors() as e:
            raise SourceError(f"{sdisplay}: {unreachable(urlsplit(hf_endpoint()).netloc, e)}") from None
        _, sdata, sst = fetch_header(shead[3], shead[4], sdisplay, deadline=dl)
        store_header(p, sdata, {"source": sdisplay, "commit": commit, "etag": shead[1], "size": shead[2], **sst})
        stats.append(sst)
    return paths, stats


def blob_sha(path: str) -> str | None:
    """The Hugging Face cache names LFS blobs by their sha256: read it from the symlink target."""
    name = Path(os.path.realpath(path)).name
    return name if SHA256_RE.fullmatch(name) else None


def _check_identity(display: str, etag: str | None, size: int | None, sha256: str | None, want_size: int | None) -> None:
    """The hub's X-Linked-Etag of an LFS file is its sha256: check it before trusting a remote header."""
    if sha256 and etag and SHA256_RE.fullmatch(etag) and etag != sha256:
        raise SourceError(f"{display}: the hub serves a different file (sha256 {etag}) than models.toml pins "
                          f"({sha256}); pin the revision in models.toml or update its sha256")
    if want_size and size and size != want_size:
        raise SourceError(f"{display}: the hub's file is {size:,} bytes, models.toml says {want_size:,}")


def split_siblings(f: HfFile) -> list[HfFile]:
    parsed = parse_split_name(f.filename.rsplit("/", 1)[-1])
    if parsed is None or parsed[2] == 1:
        return [f]
    prefix, index, n = parsed
    if index != 0:
        raise UsageError(f"{f.spec}: is file {index + 1} of a split model; name the first, "
                         f"{split_file_name(prefix, 0, n)}")
    return [f.sibling(split_file_name(prefix, i, n)) for i in range(n)]


def hf_download(f: HfFile, display: str) -> str:
    hf = heavy.huggingface_hub()

    if not offline() and not (COMMIT_RE.fullmatch(f.revision) and hf_cached_file(f)):
        try:    # the hub's X-Repo-Commit names a folder of the cache: check it before huggingface-hub uses it
            _hf_head(f, display)
        except network_errors():
            pass    # hf_hub_download reports it (or uses the cache)
    try:
        return hf.hf_hub_download(f.repo, f.filename, revision=f.revision, cache_dir=hf_cache_dir(),
                                  endpoint=hf_endpoint(), local_files_only=offline())
    except (hf.errors.LocalEntryNotFoundError, hf.errors.OfflineModeIsEnabled):
        why = "HF_HUB_OFFLINE is set" if offline() else f"{urlsplit(hf_endpoint()).netloc} cannot be reached"
        raise SourceError(f"{display}: {why} and {f.filename} is not in the Hugging Face cache "
                          f"({hf_cache_dir()}); connect and run 'edgekv models pull' again") from None
    except hf.errors.HfHubHTTPError as e:
        raise _hub_error(e, f, display) from None
    except network_errors() as e:
        raise SourceError(f"{display}: download failed ({type(e).__name__}: {e}); run it again to resume") from None
    except ValueError as e:     # huggingface-hub's own path checks (an invalid commit or file name)
        raise SourceError(f"{display}: huggingface-hub refused the download ({str(e)[:200]})") from None


# -- files on the Hugging Face hub (datasets) ---------------------------------------------------------

@dataclass(frozen=True)
class HubFile:
    path: Path          # the file in huggingface-hub's cache
    repo_id: str
    filename: str
    revision: str       # the commit the hub resolved
    endpoint: str


def hub_file(repo_id: str, filename: str, repo_type: str = "dataset", revision: str = "main") -> HubFile:
    """Download one file from the Hugging Face hub through huggingface-hub (cached; reused offline).

    ``HF_ENDPOINT`` is read at call time (not at import), so a mirror or a local test server can be
    chosen per call; ``HF_HUB_OFFLINE=1`` uses the cache only.
    """
    hf = heavy.huggingface_hub()

    endpoint = hf_endpoint()
    where = f"{repo_id}/{filename} ({repo_type}) from {endpoint}"
    check_repo_id(repo_id, where)
    check_revision(revision, where)
    check_relpath(filename, where)
    try:
        local = hf.hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=endpoint,
                                   cache_dir=hf_cache_dir(), local_files_only=offline())
    except hf.errors.LocalEntryNotFoundError:
        raise SourceError(f"cannot download {where} and it is not in the huggingface-hub cache "
                          "(offline, or HF_HUB_OFFLINE=1?)") from None
    except (hf.errors.RepositoryNotFoundError, hf.errors.EntryNotFoundError):
        raise SourceError(f"{where}: no such repository or file on the hub") from None
    except hf.errors.HfHubHTTPError as e:
        raise SourceError(f"cannot download {where}: {str(e).splitlines()[0]}") from None
    except OSError as e:  # connection and file-system errors huggingface-hub lets through
        raise SourceError(f"cannot download {where}: {e}") from None
    p = Path(local)
    # The cache layout is .../snapshots/<commit>/<filename>: the commit the hub resolved.
    snapshot = p.parents[len(Path(filename).parts) - 1]
    return HubFile(path=p, repo_id=repo_id, filename=filename, revision=snapshot.name, endpoint=endpoint)
