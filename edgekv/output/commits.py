"""Pick one edgekv commit's records out of a results file, for ``edgekv compare FILE --baseline A --compare B``
(like llama.cpp's ``compare-llama-bench.py -b/-c``).

Every record written by schema 4 or later names the edgekv commit that wrote it (``environment.edgekv_commit``)
and whether its files had local changes (``edgekv_dirty``).  A commit is given by a prefix of its id (at least 4
hex digits, as git abbreviates); ``COMMIT-dirty`` asks for the records written with local changes.  Without the
suffix the records of the commit as committed are taken, or its dirty ones when it has no others.  A prefix that
matches no commit, or several, is refused in one line naming the commits the file holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from edgekv.errors import UsageError
from edgekv.records.frame import code_label, unset_none
from edgekv.records.schema import Record

_SPEC = re.compile(r"[0-9a-f]{4,40}")


def _commit(rec: Record) -> str | None:
    c = unset_none(rec.environment.edgekv_commit)
    return str(c).lower() if c else None


def commits_in(records: Sequence[Record]) -> list[str]:
    """The distinct code labels of these records (``3f32cba``, ``3f32cba-dirty``, ``unknown``), in order of first
    appearance."""
    return list(dict.fromkeys(code_label(r) for r in records))


def _held(records: Sequence[Record]) -> str:
    known = [c for c in commits_in(records) if c != "unknown"]
    unknown = sum(1 for r in records if not _commit(r))
    held = f"commits there: {', '.join(known)}" if known else "no record there names its commit"
    if unknown and known:
        held += f"; {unknown} record{'s' if unknown != 1 else ''} name none (written before records carried it)"
    return held


def select(records: Sequence[Record], spec: str, flag: str, name: str) -> tuple[list[Record], str]:
    """The records of ``name`` that the commit ``spec`` wrote, and that commit's label; else a one-line UsageError
    naming ``flag``."""
    text = spec.strip().lower()
    want_dirty = text.endswith("-dirty")
    prefix = text.removesuffix("-dirty")
    if not _SPEC.fullmatch(prefix):
        raise UsageError(f"{flag} {spec!r}: not a commit id (4 to 40 hex digits, optionally followed by -dirty)")
    found = sorted({c for r in records if (c := _commit(r)) and c.startswith(prefix)})
    if not found:
        raise UsageError(f"{flag} {spec}: no record of {name} was written by that commit ({_held(records)})")
    if len(found) > 1:
        raise UsageError(f"{flag} {spec}: ambiguous in {name}, it matches {', '.join(c[:12] for c in found)}; "
                         "give more digits")
    mine = [r for r in records if _commit(r) == found[0]]
    dirty = [r for r in mine if unset_none(r.environment.edgekv_dirty)]
    clean = [r for r in mine if not unset_none(r.environment.edgekv_dirty)]
    if want_dirty and not dirty:
        raise UsageError(f"{flag} {spec}: {name} holds no record of {found[0][:7]} with local changes "
                         f"({_held(records)})")
    chosen = dirty if want_dirty or not clean else clean
    return chosen, code_label(chosen[0])


def newest_other(records: Sequence[Record], label: str, flag: str, name: str) -> tuple[list[Record], str]:
    """The records of the commit (a code label other than ``label``) measured last in ``name``: what ``--compare``
    defaults to when one file is given."""
    last: dict[str, str] = {}
    for r in records:
        lab = code_label(r)
        if lab not in ("unknown", label):
            last[lab] = max(last.get(lab, ""), str(unset_none(r.time_utc) or ""))
    if not last:
        raise UsageError(f"{flag}: {name} holds no other commit than {label} to compare with ({_held(records)})")
    newest = max(last, key=lambda lab: (last[lab], lab))
    return [r for r in records if code_label(r) == newest], newest
