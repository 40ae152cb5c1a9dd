"""Corpora for the quality pass: the built-in default, wikitext-2 through a local stand-in for the hub, files."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import pytest

from edgekv.errors import CorpusError
from edgekv.sources.corpus import WIKITEXT2_MEMBER, pydoc_text, resolve_corpus, text_for_tokenizer


def test_pydoc_default_is_the_documented_serialisation():
    from pydoc_data.topics import topics

    c = resolve_corpus(None)
    data = Path(c.path).read_bytes()
    expected = ("\n\n".join(topics[k].rstrip() for k in sorted(topics)) + "\n").encode("utf-8")
    assert data == expected == pydoc_text().encode()
    assert c.n_bytes == len(data) > 400_000
    assert c.sha256 == hashlib.sha256(data).hexdigest()
    assert resolve_corpus("pydoc") == c                      # stable: same file, same digest
    assert c.source == "builtin" and c.name.startswith("pydoc-3.")


def test_text_for_tokenizer_drops_one_newline_like_llama_perplexity():
    assert text_for_tokenizer(b"abc\n\n") == b"abc\n"
    assert text_for_tokenizer(b"abc") == b"abc"


def test_text_file_corpus(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("Some text.\n")
    c = resolve_corpus(str(f))
    assert (c.name, c.n_bytes, c.source) == ("t.txt", 11, "file")


@pytest.mark.parametrize("data, message", [(b"", "is empty"), (b"\x00\x01\x02", "NUL byte at offset 0"),
                                           (b"ok\xc3", "not UTF-8"), (b" \n\t\n", "only whitespace")])
def test_bad_files_are_refused(tmp_path, data, message):
    f = tmp_path / "bad.txt"
    f.write_bytes(data)
    with pytest.raises(CorpusError, match=message):
        resolve_corpus(str(f))


def test_missing_file_or_directory(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        resolve_corpus(str(tmp_path / "nope.txt"))
    with pytest.raises(CorpusError, match="is a directory"):
        resolve_corpus(str(tmp_path))


# -- wikitext-2 through huggingface-hub, against a local server that answers like the hub ----------------

WIKI = " = Valkyria Chronicles III = \n\n Senjō no Valkyria 3 : Unrecorded Chronicles ...\n"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _zip() -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr(WIKITEXT2_MEMBER, WIKI.encode())
        z.writestr("wikitext-2-raw/wiki.train.raw", b"train")
    return b.getvalue()


class _Hub(http.server.BaseHTTPRequestHandler):
    body = _zip()
    requests: list[str] = []

    def _answer(self, with_body: bool) -> None:
        self.requests.append(f"{self.command} {self.path}")
        if self.path != "/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip":
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha256(self.body).hexdigest() + '"')
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if with_body:
            self.wfile.write(self.body)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))          # what edgekv.sources.resolve reads first
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "edgekv"))
    return tmp_path


def test_wikitext2_downloads_through_the_hub_client_and_caches(hub_cache, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        c = resolve_corpus("wikitext-2")
    finally:
        server.shutdown()
    assert c.name == "wikitext-2" and c.source == "hub"
    assert Path(c.path).read_bytes() == WIKI.encode()
    assert c.sha256 == hashlib.sha256(WIKI.encode()).hexdigest() and c.n_bytes == len(WIKI.encode())
    assert COMMIT in c.detail and WIKITEXT2_MEMBER in c.detail
    assert any(r.startswith("GET /datasets/ggml-org/ci/resolve/main/") for r in _Hub.requests)
    # the server is gone: huggingface-hub's cache answers (offline use after one download)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert resolve_corpus("wikitext-2").sha256 == c.sha256


def test_wikitext2_offline_without_cache_is_a_clear_error(hub_cache, monkeypatch):
    """Not in the cache and no hub: one line naming the file and the way out.  (With a refused connection
    instead of offline mode the error is the same, after huggingface-hub's five retries, about 25 s.)"""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")      # nothing listens on the discard port
    with pytest.raises(CorpusError) as e:
        resolve_corpus("wikitext-2")
    msg = str(e.value)
    assert "\n" not in msg
    assert "cannot download ggml-org/ci/wikitext-2-raw-v1.zip" in msg and "--corpus" in msg
