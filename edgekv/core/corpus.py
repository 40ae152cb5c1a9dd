"""The text a quality pass scores: the file (:class:`CorpusFile`, resolved by edgekv.sources.corpus) and, once the
child has tokenised it, the record's ``corpus`` block (:class:`Corpus`, the same fields and its tokens).  Pure: the
types only."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edgekv.core.wire import desc


class CorpusFile(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A text file to score: its name (pydoc-3.11.7, wikitext-2 or the file's), the file whose bytes are tokenized,
    its length and sha256, and where it came from (builtin | hub | file, and in words)."""

    name: Annotated[str, desc("corpus name")]
    path: Annotated[str, desc("file read")]
    n_bytes: Annotated[int, desc("bytes")]
    sha256: Annotated[str, desc("sha256 of the file")]
    source: Annotated[str, desc("where it came from")]
    detail: Annotated[str, desc("how it was obtained")]


class Corpus(CorpusFile, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The text scored."""

    n_tokens: Annotated[int, desc("tokens after tokenisation")]
