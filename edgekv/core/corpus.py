"""The text a quality pass scores: the file (:class:`CorpusFile`, resolved by edgekv.edges.corpus) and, once the
child has tokenised it, the record's ``corpus`` block (:class:`Corpus`, the same fields and its tokens).  Pure: the
types only."""

from __future__ import annotations

import msgspec

from edgekv.core.wire import doc


class CorpusFile(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A text file to score: its name, where it is, its bytes and their sha256, and where it came from."""

    name: doc(str, "corpus name")                          # pydoc-3.11.7 | wikitext-2 | the file's name
    path: doc(str, "file read")                            # the file whose bytes are tokenized
    n_bytes: doc(int, "bytes")
    sha256: doc(str, "sha256 of the file")
    source: doc(str, "where it came from")                 # builtin | hub | file
    detail: doc(str, "how it was obtained")                # where it came from, in words


class Corpus(CorpusFile, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The text scored."""

    n_tokens: doc(int, "tokens after tokenisation")
