"""Text corpora for the quality pass (perplexity and KL divergence).

Every corpus ends up as a file on disk whose exact bytes are what gets tokenized, so that
``llama-perplexity -f FILE`` can be given the very same bytes.  Three kinds:

``pydoc`` (the default; no download)
    The documentation topics that ship with every CPython (``pydoc_data.topics.topics``, about
    465 KB of English prose), serialised in a documented, stable order: the keys sorted by Python's
    default string order, each text with trailing whitespace removed, joined by one blank line
    (``"\\n\\n"``), and one final ``"\\n"``; encoded as UTF-8.  The text differs between Python
    versions, so the name records the version (``pydoc-3.11.7``) and the sha256 pins the bytes.
``wikitext-2``
    The raw test split of WikiText-2 (``wikitext-2-raw/wiki.test.raw``), the corpus of llama.cpp's
    published perplexity figures, taken from the same archive llama.cpp's
    ``scripts/get-wikitext-2.sh`` downloads (``ggml-org/ci`` dataset, ``wikitext-2-raw-v1.zip``),
    through huggingface-hub and cached.
any text file
    Used as is.

Like ``llama-perplexity -f``, one trailing ``"\\n"`` is removed before tokenizing
(common/arg.cpp, ``-f``); :func:`text_for_tokenizer` does exactly that.  The recorded byte length
and sha256 are those of the file.
"""

from __future__ import annotations

import os
import platform
import zipfile
from pathlib import Path

from edgekv.core.corpus import CorpusFile
from edgekv.errors import CorpusError, SourceError
from edgekv.sources.home import edgekv_home, sha256_bytes
from edgekv.sources.hub import hub_file
from edgekv.sources.safepath import atomic_write

DEFAULT_CORPUS = "pydoc"
WIKITEXT2 = "wikitext-2"
WIKITEXT2_REPO = "ggml-org/ci"
WIKITEXT2_ARCHIVE = "wikitext-2-raw-v1.zip"
WIKITEXT2_MEMBER = "wikitext-2-raw/wiki.test.raw"
CORPUS_NAMES = (DEFAULT_CORPUS, WIKITEXT2)



def pydoc_text() -> str:
    """The CPython documentation topics in edgekv's documented order (see the module docstring)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].rstrip() for k in sorted(topics)) + "\n"


def _cache_dir() -> Path:
    d = edgekv_home() / "corpora"
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_text(data: bytes, what: str) -> None:
    """Refuse what llama-perplexity would silently accept: an empty file or binary data."""
    if not data:
        raise CorpusError(f"{what} is empty; the quality pass needs text (at least two contexts' worth of tokens)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise CorpusError(f"{what} is not a text file (NUL byte at offset {nul}); pass a UTF-8 text file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{what} is not UTF-8 text (invalid byte at offset {e.start}); pass a UTF-8 text file") from None
    if not data.strip():
        raise CorpusError(f"{what} holds only whitespace; the quality pass needs text")


def text_for_tokenizer(data: bytes) -> bytes:
    """The bytes llama-perplexity tokenizes for ``-f FILE``: the file less one trailing newline."""
    return data[:-1] if data.endswith(b"\n") else data


def _pydoc() -> CorpusFile:
    data = pydoc_text().encode("utf-8")
    name = f"pydoc-{platform.python_version()}"
    digest = sha256_bytes(data)
    path = _cache_dir() / f"{name}-{digest[:12]}.txt"
    if not path.is_file() or path.stat().st_size != len(data):
        atomic_write(path, data)
    return CorpusFile(name=name, path=str(path), n_bytes=len(data), sha256=digest, source="builtin",
                  detail=f"pydoc_data.topics of Python {platform.python_version()}, sorted keys joined by blank lines")


def _wikitext2() -> CorpusFile:

    try:
        hf = hub_file(WIKITEXT2_REPO, WIKITEXT2_ARCHIVE, repo_type="dataset")
    except SourceError as e:
        raise CorpusError(f"wikitext-2: {e}; or download {WIKITEXT2_ARCHIVE} yourself "
                          f"(llama.cpp's scripts/get-wikitext-2.sh) and pass --corpus wikitext-2-raw/wiki.test.raw") from None
    path = _cache_dir() / f"wikitext-2-raw-test-{hf.revision[:12]}.txt"
    if not path.is_file():
        try:
            with zipfile.ZipFile(hf.path) as z:
                data = z.read(WIKITEXT2_MEMBER)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise CorpusError(f"wikitext-2: {hf.path} is not the expected archive ({e}); delete it and retry") from None
        atomic_write(path, data)
    data = path.read_bytes()
    check_text(data, "wikitext-2")
    return CorpusFile(name=WIKITEXT2, path=str(path), n_bytes=len(data), sha256=sha256_bytes(data), source="hub",
                  detail=f"{hf.endpoint}/datasets/{WIKITEXT2_REPO} {WIKITEXT2_ARCHIVE}@{hf.revision}:{WIKITEXT2_MEMBER}")


def _file(spec: str) -> CorpusFile:
    p = Path(spec).expanduser()
    if p.is_dir():
        raise CorpusError(f"--corpus {spec}: is a directory; pass a text file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CorpusError(f"--corpus {spec}: {e.strerror or e}") from None
    check_text(data, f"--corpus {spec}")
    return CorpusFile(name=p.name, path=str(p.resolve()), n_bytes=len(data), sha256=sha256_bytes(data), source="file",
                  detail=str(p.resolve()))


def resolve_corpus(spec: str | os.PathLike | None = None) -> CorpusFile:
    """``None``/``"pydoc"``: the built-in default; ``"wikitext-2"``; else a path to a text file."""
    if spec is None or str(spec) in ("", DEFAULT_CORPUS):
        return _pydoc()
    s = str(spec)
    if s.lower() in (WIKITEXT2, "wikitext2", "wikitext-2-raw"):
        return _wikitext2()
    if not Path(s).expanduser().exists():
        raise CorpusError(f"--corpus {s}: no such file, and not a corpus name ({', '.join(CORPUS_NAMES)})")
    return _file(s)
