"""A local stand-in for the Hugging Face hub and a plain file server, over real HTTP on 127.0.0.1.

Two servers, like the real thing: the *hub* answers ``/{repo}/resolve/{revision}/{file}`` the way
huggingface.co answers for LFS files -- a 302 to the *CDN* carrying ``X-Repo-Commit``,
``X-Linked-Etag`` (the file's sha256) and ``X-Linked-Size``, or a 404 with ``X-Error-Code``
(RepoNotFound, RevisionNotFound, EntryNotFound) -- and the CDN (another origin, so huggingface-hub
does not follow the redirect on its HEAD) serves the bytes with ``Accept-Ranges``, ``ETag``,
``Range`` -> 206 and ``Content-Range``.  The hub also serves plain URLs:

* ``/files/NAME``    range-capable static file;
* ``/norange/NAME``  ignores ``Range`` and answers 200 with the whole file (a server without ranges);
* ``/page.html``     an HTML page (not a GGUF).

Every request is logged and every body byte sent is counted, per path, so tests can assert how much
of a model crossed the wire.  ``cut_after[sha256] = n`` drops the next whole-file download of a blob
after ``n`` bytes, to exercise resuming.

Hostile behaviour, for tests/real/test_hostile.py (everything still on 127.0.0.1 only):

* ``/any/ANYTHING``           ``any_file`` with ranges, whatever the (URL-encoded) name says;
* ``/drip/NAME``              a normal status line and headers, then the body one byte every ``drip_s``;
* ``/driphead/NAME``          the status line and headers themselves one byte every ``drip_s`` (HEAD too);
* ``/loop/NAME``              a 302 to itself, forever;
* ``/stall/NAME``             no answer at all for a minute;
* ``/gzip/NAME``              the range gzip-compressed, with ``Content-Encoding: gzip``;
* ``/badcr/MODE/NAME``        a 206 whose Content-Range does not match: MODE start, end, total or star
                              (``star``: ``bytes a-b/*``, which is legal and must work);
* ``/lielen/MODE/NAME``       a 206 whose Content-Length lies: MODE short or long;
* hub ``commit_override``     the X-Repo-Commit the hub sends for every repo (``../../x``, ``/etc``);
* hub ``drip_head``           the hub's /resolve/ answer dripped like ``/driphead/``;
* ``drip_cdn``                the CDN's range bodies dripped like ``/drip/``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# huggingface-hub (2.x) asks the endpoint for its agent-harness list once per process, on its own
TELEMETRY = "/api/agent-harnesses"
HTML = b"<!DOCTYPE html><html><head><title>Not a model</title></head><body>hello</body></html>\n"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


@dataclass
class Repo:
    commit: str
    files: dict[str, Path]
    shas: dict[str, str] = field(default_factory=dict)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.plain: dict[str, Path] = {}
        self.blobs: dict[str, Path] = {}        # sha256 -> file, served by the CDN
        self.cut_after: dict[str, int] = {}     # sha256 -> drop the next whole-file GET after this many bytes
        self.fail_with: int | None = None       # answer every hub /resolve/ request with this status (5xx)
        self.any_file: Path | None = None       # served by /any/ANYTHING
        self.drip_s = 1.0                       # seconds between bytes of /drip/ and /driphead/
        self.commit_override: str | None = None
        self.drip_head = False
        self.drip_cdn = False                   # the CDN's range bodies dripped like /drip/
        self.sent: Counter[str] = Counter()     # body bytes sent, by request path (without query)
        self.log: list[tuple[str, str, str | None]] = []    # (method, path, Range header)
        self.lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []

    # -- setup --
    def add_repo(self, repo: str, files: dict[str, Path], commit: str | None = None,
                 shas: dict[str, str] | None = None) -> str:
        commit = commit or hashlib.sha1(repo.encode()).hexdigest()
        r = Repo(commit, dict(files))
        for name, p in files.items():
            sha = (shas or {}).get(name) or file_sha256(p)
            r.shas[name] = sha
            self.blobs[sha] = p
        self.repos[repo] = r
        return commit

    def add_plain(self, name: str, path: Path) -> str:
        self.plain[name] = path
        return f"{self.endpoint}/files/{name}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self.hub_server = ThreadingHTTPServer(("127.0.0.1", 0), type("Hub", (Handler,), {"role": "hub"}))
        self.cdn_server = ThreadingHTTPServer(("127.0.0.1", 0), type("Cdn", (Handler,), {"role": "cdn"}))
        for srv in (self.hub_server, self.cdn_server):
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self._servers.append(srv)
        return self

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub_server.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self.cdn_server.server_address[1]}"

    # -- accounting --
    def reset(self) -> None:
        with self.lock:
            self.sent.clear()
            self.log.clear()

    def bytes_sent(self, prefix: str = "") -> int:
        with self.lock:
            return sum(v for k, v in self.sent.items() if k.startswith(prefix) and k != TELEMETRY)

    def requests(self, prefix: str = "", method: str | None = None) -> list[tuple[str, str, str | None]]:
        """Requests logged since the last reset, leaving out huggingface-hub's own telemetry call."""
        with self.lock:
            return [x for x in self.log if x[1].startswith(prefix) and (method is None or x[0] == method)
                    and x[1] != TELEMETRY]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub
    role: str

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    def _record(self) -> str:
        path = urlsplit(self.path).path
        with self.fake.lock:
            self.fake.log.append((self.command, path, self.headers.get("Range")))
        return path

    def _simple(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False,
                ctype: str = "application/json") -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self._write(urlsplit(self.path).path, body)

    def _write(self, path: str, data: bytes) -> bool:
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        with self.fake.lock:
            self.fake.sent[path] += len(data)
        return True

    def _handle(self, head: bool) -> None:
        path = self._record()
        if self.role == "cdn":
            m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            if not m or m[1] not in self.fake.blobs:
                return self._simple(404, b'{"error":"no such blob"}', head=head)
            cut = None
            if not head and not self.headers.get("Range"):
                with self.fake.lock:
                    cut = self.fake.cut_after.pop(m[1], None)
            if self.fake.drip_cdn and not head:
                return self._drip_range(path, self.fake.blobs[m[1]])
            return self._serve_file(path, self.fake.blobs[m[1]], head, ranges=True, etag=f'"{m[1]}"', cut=cut)
        if path.startswith("/files/"):
            p = self.fake.plain.get(unquote(path[len("/files/"):]))
            if p is None:
                return self._simple(404, b"Not Found", head=head, ctype="text/plain")
            return self._serve_file(path, p, head, ranges=True, etag=f'"{os.path.getsize(p):x}-plain"')
        if path.startswith("/norange/"):
            p = self.fake.plain.get(unquote(path[len("/norange/"):]))
            if p is None:
                return self._simple(404, b"Not Found", head=head, ctype="text/plain")
            return self._serve_file(path, p, head, ranges=False, etag=None)
        if path == "/page.html":
            return self._simple(200, HTML, head=head, ctype="text/html")
        hostile = self._hostile(path, head)
        if hostile is not False:
            return None
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self._simple(404, b'{"error":"not found"}', head=head)
        if self.fake.fail_with:
            return self._simple(self.fake.fail_with, b'{"error":"unavailable"}', head=head)
        if self.fake.drip_head:
            return self._drip_head()
        repo_id, rev, filename = unquote(m[1]), unquote(m[2]), unquote(m[3])
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            return self._simple(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)
        if rev not in ("main", repo.commit):
            return self._simple(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, head)
        if filename not in repo.files:
            return self._simple(404, b'{"error":"Entry not found"}',
                                {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, head)
        sha = repo.shas[filename]
        size = os.path.getsize(repo.files[filename])
        self._simple(302, b"", {
            "Location": f"{self.fake.cdn}/cdn/{sha}?name={filename.rsplit('/', 1)[-1]}",
            "X-Repo-Commit": self.fake.commit_override or repo.commit, "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": str(size),
            "ETag": f'"{hashlib.sha1(sha.encode()).hexdigest()}"',
        }, head)

    def _serve_file(self, path: str, p: Path, head: bool, ranges: bool, etag: str | None,
                    cut: int | None = None) -> None:
        size = os.path.getsize(p)
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range") if ranges else None
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m[1]) >= size:
                return self._simple(416, b"", {"Content-Range": f"bytes */{size}"}, head)
            start = int(m[1])
            end = min(int(m[2]) if m[2] else size - 1, size - 1)
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if ranges:
            self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        if etag:
            self.send_header("ETag", etag)
        self.end_headers()
        if head:
            return
        with open(p, "rb") as f:
            f.seek(start)
            left = end - start + 1
            if cut is not None:         # a dropped connection in the middle of the body
                left = cut
            while left > 0:
                b = f.read(min(left, 1 << 16))
                if not b or not self._write(path, b):
                    self.close_connection = True
                    return
                left -= len(b)
        if cut is not None:
            self.wfile.flush()
            self.connection.shutdown(2)
            self.close_connection = True

    # -- hostile answers ---------------------------------------------------------------------------

    def _plain_file(self, name: str) -> Path | None:
        return self.fake.plain.get(unquote(name))

    def _drip(self, data: bytes, path: str) -> None:
        for i in range(len(data)):
            time.sleep(self.fake.drip_s)
            try:
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
            except OSError:
                break
            with self.fake.lock:
                self.fake.sent[path] += 1
        self.close_connection = True

    def _drip_range(self, path: str, p: Path) -> None:
        size = os.path.getsize(p)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", (self.headers.get("Range") or "").strip())
        start = int(m[1]) if m else 0
        end = min(int(m[2]) if m and m[2] else size - 1, size - 1)
        self.send_response(206)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        with open(p, "rb") as f:
            f.seek(start)
            self._drip(f.read(min(end - start + 1, 4096)), path)

    def _drip_head(self) -> None:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Padding: "
                + b"x" * 4000 + b"\r\n\r\n")
        self._drip(head, urlsplit(self.path).path)

    def _hostile(self, path: str, head: bool) -> bool | None:
        """Serve a hostile route; False when ``path`` is not one."""
        parts = path.split("/", 3)     # '', route, a, rest
        route = parts[1] if len(parts) > 1 else ""
        if route == "any":
            if self.fake.any_file is None:
                return self._simple(404, b"", head=head) or None
            return self._serve_file(path, self.fake.any_file, head, ranges=True, etag='"any"') or None
        if route == "loop":
            return self._simple(302, b"", {"Location": path}, head) or None
        if route == "driphead":
            return self._drip_head()
        if route == "stall":        # accept, read the request, answer nothing for a minute
            time.sleep(60)
            self.close_connection = True
            return None
        if route not in ("drip", "gzip", "badcr", "lielen"):
            return False
        mode = parts[2] if route in ("badcr", "lielen") else ""
        name = (parts[3] if route in ("badcr", "lielen") else "/".join(parts[2:])) if len(parts) > 2 else ""
        p = self._plain_file(name)
        if p is None:
            return self._simple(404, b"Not Found", head=head, ctype="text/plain") or None
        size = os.path.getsize(p)
        if route == "drip" and head:
            return self._serve_file(path, p, head=True, ranges=True, etag='"drip"') or None
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", (self.headers.get("Range") or "").strip())
        start = int(m[1]) if m else 0
        end = min(int(m[2]) if m and m[2] else size - 1, size - 1)
        with open(p, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        headers = {"Accept-Ranges": "bytes", "Content-Range": f"bytes {start}-{end}/{size}"}
        if route == "gzip":
            body = gzip.compress(body, 1)
            headers["Content-Encoding"] = "gzip"
        elif route == "badcr":
            headers["Content-Range"] = {
                "start": f"bytes {start + 1}-{end}/{size}",
                "end": f"bytes {start}-{end + 4096}/{size + 4096}",
                "total": f"bytes {start}-{end}/{end}",
                "star": f"bytes {start}-{end}/*",
            }[mode]
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        n = len(body)
        if route == "lielen":
            n = n - 1000 if mode == "short" else n + 1000
        self.send_header("Content-Length", str(n))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return None
        if route == "drip":
            self._drip(body, path)
            return None
        self._write(path, body)
        if route == "lielen":
            self.wfile.flush()
            self.close_connection = True
        return None
