"""Reading what ``report``, ``compare`` and ``merge`` are given, and writing merged files.

Every accepted input comes back as typed :class:`edgekv.records.schema.Record` objects, detected from the
file's content (never from its name):

* edgekv results (JSONL, :func:`edgekv.records.results.load_records`: upgrades, then strict decoding),
* a JSON list of records (``edgekv quality --json``, ``edgekv predict --json``), or such a list under
  ``"predictions"`` (``edgekv predict --budget --json``, beside its budget): each upgraded and decoded strictly
  like a line of a results file,
* llama-bench ``-o json`` / ``-o jsonl`` output (:func:`edgekv.sweep.llamabench.load_llama_bench_file`:
  records of kind ``llama-bench``, speed only, no memory),
* the prediction rows an older ``edgekv predict --json`` printed (a JSON list of rows with
  ``source == "formula"``, or ``{"predictions": [...]}``): records of kind ``predict``
  (:func:`edgekv.records.schema.predict_record`) that hold a prediction and nothing measured.

Every record has the same typed layout (``settings``, ``model``, ``prediction``, ``environment``, ...), so the
presentation code reads attributes, never has to know where a record came from, and knows from ``kind``
what was measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from edgekv.errors import ResultsError
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.records.frame import machine_label, unset_none
from edgekv.sweep.llamabench import load_llama_bench_file

KIND_BENCH = "bench"
KIND_LLAMA_BENCH = "llama-bench"
KIND_PREDICT = "predict"

# Torn last lines (an interrupted write) left out by strict loads, for the CLI to print one line each.
NOTES: list[str] = []


def drain_notes() -> list[str]:
    out = list(NOTES)
    NOTES.clear()
    return out


def load_any(path: str | os.PathLike, skipped: list[R.Skipped] | None = None, history: bool = False) -> list[S.Record]:
    """Load one input file of any accepted kind as a list of :class:`~edgekv.records.schema.Record`.

    Without ``skipped`` an unusable line of an edgekv results file refuses the file with one line
    naming ``file:line`` (a torn last line is left out and noted in :data:`NOTES`); with a list,
    unusable lines are left out and described there (``report`` says how many and why).  A results file gives the
    newest record of each configuration (:func:`edgekv.records.results.latest`); ``history`` keeps every line (merge).
    """
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ResultsError(f"{p}: is a directory; pass a results file (.jsonl)") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{p}: not a text file; pass edgekv results, llama-bench JSON/JSONL or edgekv predict --json")\
            from None
    first = _first_object(text)
    if first is None:
        raise ResultsError(f"{p}: empty; no results in it")
    if isinstance(first, list):
        items = first
        if _all_records(items):
            # `edgekv quality --json` (records of kind quality) and `edgekv predict --json` (kind predict):
            # upgraded and decoded strictly like the lines of a results file
            return [R.as_record(x, f"{p}:{i}") for i, x in enumerate(items, 1)]
        if items and all(isinstance(x, dict) and x.get("source") == "formula" for x in items):
            return predict_records(items, p)
        if items and all(isinstance(x, dict) and "samples_ts" in x for x in items):
            return load_llama_bench_file(p)
        if not items:
            raise ResultsError(f"{p}: an empty JSON list; no results in it")
        raise ResultsError(f"{p}: a JSON list that is neither llama-bench output nor edgekv predict --json output")
    if isinstance(first, dict):
        if "schema_version" in first:
            recs = _load_results(p, skipped)
            return recs if history else R.latest(recs)
        if "samples_ts" in first:
            return load_llama_bench_file(p)
        preds = first.get("predictions")
        if isinstance(preds, list):     # `predict --budget --json`: records beside the budget; older: prediction rows
            if _all_records(preds):
                return [R.as_record(x, f"{p}: prediction {i}") for i, x in enumerate(preds, 1)]
            return predict_records(preds, p)
    raise ResultsError(f"{p}: neither edgekv results, llama-bench JSON/JSONL nor edgekv predict --json output")


def _all_records(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(x, dict) and "schema_version" in x for x in items)


def _load_results(p: Path, skipped: list[R.Skipped] | None) -> list[S.Record]:
    if skipped is not None:
        return R.load_records(p, skipped=skipped)
    mine: list[R.Skipped] = []
    recs = R.load_records(p, skipped=mine)
    bad = [x for x in mine if not x.why.startswith("torn last line")]
    if bad:
        more = f" (and {len(bad) - 1} more unusable lines)" if len(bad) > 1 else ""
        raise ResultsError(f"{bad[0]}{more}; fix or remove the line ('edgekv report' skips such lines and says so)")
    NOTES.extend(f"{x}: left out" for x in mine)
    return recs


def _first_object(text: str) -> Any:
    """The whole file as JSON if it is one JSON document, else its first JSON object line (JSONL)."""
    s = text.strip()
    if not s:
        return None
    try:
        return json.loads(s)
    except ValueError:
        pass
    for line in s.split("\n")[:50]:      # past a damaged first line or two
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return "not json"


def load_many(paths: Sequence[str | os.PathLike], skipped: list[R.Skipped] | None = None) -> list[S.Record]:
    out: list[S.Record] = []
    for p in paths:
        out.extend(load_any(p, skipped))
    return out


# The keys of an older `predict --json` row that are not formula fields (the rest are
# :class:`~edgekv.records.schema.Formula` fields, ``saving_vs_f16`` and ``layers`` included), and the settings
# a row names.
_ROW_KEYS = ("model", "arch", "weights_bytes", "source", "engine", "process")
_ROW_SETTINGS = ("n_ctx", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max", "kv_unified", "n_batch", "n_ubatch")


def predict_records(rows: Iterable[Any], source: str | os.PathLike) -> list[S.Record]:
    """Rows of an older ``edgekv predict --json`` as records of kind ``predict`` (prediction only, nothing measured),
    built by :func:`edgekv.records.schema.predict_record`.

    Strict: a row key that is neither a formula field nor one of ``_ROW_KEYS``, or a value of the wrong type,
    refuses the file in one line naming the file, the row and the key."""
    formula_keys = set(S.Formula.__struct_fields__)
    out = []
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict) or "n_ctx" not in r or "type_k" not in r:
            raise ResultsError(f"{source}: prediction {i} has no n_ctx/type_k; not edgekv predict --json output")
        where = f"{source}: prediction {i}"
        unknown = [k for k in r if k not in formula_keys and k not in _ROW_KEYS]
        if unknown:
            raise ResultsError(f"{where}: {unknown[0]}: unknown key in an edgekv predict --json row; written by another "
                               "tool or a newer edgekv (upgrade edgekv, or remove the key)")
        made = {k: r[k] for k in ("engine", "process") if r.get(k) is not None}   # None: not asked, left out
        try:
            out.append(S.predict_record(
                model_path=str(r.get("model") or ""), arch=r.get("arch"), weights_bytes=r.get("weights_bytes"),
                formula={k: v for k, v in r.items() if k in formula_keys}, **made,
                settings={k: r.get(k) for k in _ROW_SETTINGS}, source_file=str(source), key_settings=R.KEY_SETTINGS))
        except msgspec.ValidationError as e:
            # the loader's wording: 'prediction.formula.n_ctx: expected int, got str; ...'
            raise ResultsError(f"{where}: {S._explain(str(e))}") from None
    return out


# -- typed blocks --------------------------------------------------------------------------------------
#
# Every record is a :class:`~edgekv.records.schema.Record`: ``settings``, ``model``, ``prediction`` and the
# measured blocks are read as attributes (``rec.settings.n_ctx``, ``rec.memory.peak_rss_bytes``); a block a
# record does not hold is msgspec's ``UNSET`` (:func:`unset_none` shows it as None, a dash: never filled in).
# ``environment`` is typed too (:class:`~edgekv.records.schema.Environment`); what a platform exposes beyond its keys
# is under ``environment.extra``.
# The machine and device labels live with the one flattener (:mod:`edgekv.records.frame`).


def speed_of(rec: S.Record, test: str) -> S.SpeedTest | None:
    """One speed test (``pp``, ``tg``, ``pg``) of a record; None where it was not run."""
    speed = unset_none(rec.speed)
    return unset_none(getattr(speed, test)) if speed is not None else None


def compared_kv(rec: S.Record) -> tuple[int, int | None]:
    """The context whose KV llama.cpp's lines were checked against, and the formula's bytes for it: ``-c`` for a
    run edgekv sized itself; for llama-bench, which sizes each test's context as depth + its tokens and ignores
    ``-c``, its first test's context (the one whose lines the record shows)."""
    lb = unset_none(rec.llama_bench)
    ctxs = unset_none(lb.contexts) if lb is not None else None
    if ctxs:
        return ctxs[0].n_ctx, ctxs[0].formula_kv_bytes
    pred = unset_none(rec.prediction)
    return rec.settings.n_ctx, pred.formula.total_bytes if pred is not None else None


def merge_files(paths: Sequence[str | os.PathLike], output: str | os.PathLike) -> list[S.Record]:
    """Several machines' results into one file: every row kept, in input order, each with a ``machine``.

    The output is written atomically (temp file + rename), so it may also be one of the inputs.
    """
    records: list[S.Record] = []
    for p in paths:
        for r in load_any(p, history=True):
            if not r.machine:
                label = machine_label(r)
                if label:
                    r = msgspec.structs.replace(r, machine=label)
            records.append(r)
    R.write_all(output, records)
    return records
