"""Reading GGUF headers over HTTP: deadlines, range requests that grow until the tensor-info table is
complete, errors as one line, and plain ``https://`` URLs.  Every request goes through huggingface-hub's HTTP
session (its proxy, certificate and offline settings)."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

from edgekv import heavy
from edgekv.errors import EdgekvError, SourceError, UsageError
from edgekv.sources.gguf_header import (
    GGUFHeader,
    parse_split_name,
    read_header,
    read_header_file,
    split_count,
    split_file_name,
)
from edgekv.sources.headercache import cached_header, fetch_note, merge_stats, store_header, url_file_name, url_header_path
from edgekv.sources.home import ModelRef, offline

FIRST_RANGE_BYTES = 2 * 1024 * 1024      # first range request; the header of most models fits
MAX_RANGE_BYTES = 32 * 1024 * 1024       # largest single range request
MAX_HEADER_BYTES = 512 * 1024 * 1024     # give up: no real GGUF header is this large
HTTP_TIMEOUT_S = 30.0                    # read timeout of one socket read (and of huggingface-hub's HEAD)
CONNECT_TIMEOUT_S = 10.0
DEFAULT_FETCH_TIMEOUT_S = 60.0           # the whole header fetch of one model (HEAD + range GETs)
FETCH_TIMEOUT_ENV = "EDGEKV_FETCH_TIMEOUT"
MAX_REDIRECTS = 20                       # httpx's cap, which huggingface-hub's session keeps


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
        httpx2 = heavy.httpx2()

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
    httpx2 = heavy.httpx2()

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

def http_error(status: int, reason: str, display: str) -> SourceError:
    if status == 404:
        return SourceError(f"{display}: not found (HTTP 404); check the repo, file name and revision")
    if status in (401, 403):
        return SourceError(f"{display}: access denied (HTTP {status}); the repo may be gated or private: "
                           "accept its terms on the website, then 'hf auth login' or set HF_TOKEN")
    if status == 416:
        return SourceError(f"{display}: the server refused the byte range (HTTP 416); the file is empty "
                           "or shorter than a GGUF header")
    return SourceError(f"{display}: HTTP {status} {reason}".rstrip())


class ServerUnavailable(SourceError):
    """HTTP 5xx from the hub: like a network failure, edgekv falls back to what is cached."""


def unreachable(host: str, e: BaseException) -> str:
    if isinstance(e, ServerUnavailable):
        return f"{host} answered {e}"
    return f"{host} cannot be reached ({type(e).__name__}: {e})"


def _timeout_errors() -> tuple[type[BaseException], ...]:
    httpx2 = heavy.httpx2()

    return (httpx2.TimeoutException,)


def network_errors() -> tuple[type[BaseException], ...]:
    httpx2 = heavy.httpx2()
    hf = heavy.huggingface_hub()

    return (httpx2.TransportError, hf.errors.OfflineModeIsEnabled, ServerUnavailable)


class RangeReader:
    """A read-only file over HTTP range requests, for :func:`edgekv.sources.gguf_header.read_header`.

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
        hf = heavy.huggingface_hub()

        end = start + length - 1
        if self.total is not None:
            end = min(end, self.total - 1)
        headers = {**self.headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        data = bytearray()
        dl = self.deadline
        with hf.get_session().stream("GET", self.url, headers=headers, timeout=dl.timeout(),
                                     follow_redirects=True) as r:
            self.requests += 1
            if r.status_code >= 400:
                raise http_error(r.status_code, r.reason_phrase, self.display)
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
    except network_errors() as e:
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


def offline_error(display: str, what: str, why: str) -> SourceError:
    todo = ("unset HF_HUB_OFFLINE to fetch it" if "HF_HUB_OFFLINE" in why
            else "run it again with a network connection (it is cached after one online run)")
    return SourceError(f"{display}: {why}, and {what}; {todo}")


# -- plain URLs -----------------------------------------------------------------------------------

def _url_head(url: str, display: str, deadline: Deadline | None = None) -> tuple[str | None, int | None]:
    """ETag and size from a HEAD request; (None, None) when the server does not answer HEAD."""
    dl = deadline or Deadline()
    return dl.run(display, _url_head_now, url, display, dl)


def _url_head_now(url: str, display: str, dl: Deadline) -> tuple[str | None, int | None]:
    hf = heavy.huggingface_hub()

    r = hf.get_session().head(url, headers={"Accept-Encoding": "identity"}, timeout=dl.timeout(),
                              follow_redirects=True)
    if r.status_code in (403, 405, 501):
        return None, None   # no HEAD (signed URLs answer 403 to it): the GET reports any real error
    if r.status_code >= 500:
        raise ServerUnavailable(f"HTTP {r.status_code}")
    if r.status_code >= 400:
        raise http_error(r.status_code, r.reason_phrase, display)
    size = r.headers.get("Content-Length")
    return r.headers.get("ETag"), int(size) if size and size.isdigit() else None


def resolve_url(url: str, spec: str) -> ModelRef:
    display = url
    name = url_file_name(url)
    path = url_header_path(url)
    dl = Deadline()
    cached = cached_header(path)
    etag = size = None
    why = None
    if offline():
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            etag, size = _url_head(url, display, dl)
        except network_errors() as e:
            why = unreachable(urlsplit(url).netloc, e)
    stats: list[dict[str, Any]] = []
    notes: list[str] = []
    usable = cached is not None and (why is not None or (etag is not None and cached.get("etag") == etag
                                                         and cached.get("file_size") == size))
    if not usable:
        if why is not None:
            raise offline_error(display, f"its header is not cached under {path.parent}", why)
        h, data, st = fetch_header(url, {}, display, deadline=dl)
        store_header(path, data, {"source": url, **st, "etag": st.get("etag") or etag})
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
            if cached_header(sp) is not None:
                continue
            if why is not None:
                raise offline_error(display, f"the header of {sname} is not cached", why)
            _, sdata, sst = fetch_header(surl, {}, surl, deadline=dl)
            store_header(sp, sdata, {"source": surl, **sst})
            stats.append(sst)
    fetch = merge_stats(stats)
    notes.insert(0, fetch_note(display, fetch, path))
    return ModelRef(spec=spec, path=str(path), name=name, source="url", complete=False,
                    shards=tuple(str(p) for p in paths) if n > 1 else (), origin=url, fetch=fetch, notes=tuple(notes))
