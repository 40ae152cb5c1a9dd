"""Reading what ``report``, ``compare`` and ``merge`` are given, and writing merged files.

Three kinds of input file are accepted, detected from their content (never from their name):

* edgekv results (JSONL, :mod:`edgekv.records.results`; strict loading with upgrades),
* llama-bench ``-o json`` / ``-o jsonl`` output (through :func:`edgekv.orchestration.llamabench.load_llama_bench_file`:
  speed only, no memory),
* ``edgekv predict --json`` output (a JSON list of prediction rows, or ``{"predictions": [...]}``):
  records of kind ``predict`` that hold a prediction and nothing measured.

Every record that comes back has the same layout (``settings``, ``model``, ``environment``, ...), so the
presentation code never has to know where it came from, and knows from ``kind`` what was measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET

from edgekv.errors import ResultsError
from edgekv.records import results as R
from edgekv.records import schema as S

KIND_BENCH = "bench"
KIND_LLAMA_BENCH = "llama-bench"
KIND_PREDICT = "predict"

# Torn last lines (an interrupted write) left out by strict loads, for the CLI to print one line each.
NOTES: list[str] = []


def drain_notes() -> list[str]:
    out = list(NOTES)
    NOTES.clear()
    return out


def load_any(path: str | os.PathLike, skipped: list[R.Skipped] | None = None) -> list[dict[str, Any]]:
    """Load one input file of any accepted kind as a list of records.

    Without ``skipped`` an unusable line of an edgekv results file refuses the file with one line
    naming ``file:line`` (a torn last line is left out and noted in :data:`NOTES`); with a list,
    unusable lines are left out and described there (``report`` says how many and why).
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
        if items and all(isinstance(x, dict) and "schema_version" in x for x in items):
            # `edgekv quality --json` (records of kind quality) and predict output written as records:
            # upgraded and decoded strictly like the lines of a results file
            return [R.check_record(R.upgrade(x, f"{p}:{i}"), f"{p}:{i}") for i, x in enumerate(items, 1)]
        if items and all(isinstance(x, dict) and x.get("source") == "formula" for x in items):
            return predict_records(items, p)
        if items and all(isinstance(x, dict) and "samples_ts" in x for x in items):
            from edgekv.orchestration.llamabench import load_llama_bench_file

            return load_llama_bench_file(p)
        if not items:
            raise ResultsError(f"{p}: an empty JSON list; no results in it")
        raise ResultsError(f"{p}: a JSON list that is neither llama-bench output nor edgekv predict --json output")
    if isinstance(first, dict):
        if "schema_version" in first:
            return _load_results(p, skipped)
        if "samples_ts" in first:
            from edgekv.orchestration.llamabench import load_llama_bench_file

            return load_llama_bench_file(p)
        if isinstance(first.get("predictions"), list):
            preds = first["predictions"]       # predict --budget --json: records beside the budget; older: rows
            if preds and all(isinstance(x, dict) and "schema_version" in x for x in preds):
                return [R.check_record(R.upgrade(x, f"{p}:{i}"), f"{p}:{i}") for i, x in enumerate(preds, 1)]
            return predict_records(preds, p)
    raise ResultsError(f"{p}: neither edgekv results, llama-bench JSON/JSONL nor edgekv predict --json output")


def _load_results(p: Path, skipped: list[R.Skipped] | None) -> list[dict[str, Any]]:
    if skipped is not None:
        return R.load(p, skipped=skipped)
    mine: list[R.Skipped] = []
    recs = R.load(p, skipped=mine)
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


def load_many(paths: Sequence[str | os.PathLike], skipped: list[R.Skipped] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        out.extend(load_any(p, skipped))
    return out


_FORMULA_SKIP = ("model", "arch", "weights_bytes", "source", "saving_vs_f16", "engine", "layers")


def predict_records(rows: Iterable[dict[str, Any]], source: str | os.PathLike) -> list[dict[str, Any]]:
    """``edgekv predict --json`` rows as records of kind ``predict`` (prediction only, nothing measured)."""
    out = []
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict) or "n_ctx" not in r or "type_k" not in r:
            raise ResultsError(f"{source}: prediction {i} has no n_ctx/type_k; not edgekv predict --json output")
        formula = {k: v for k, v in r.items() if k not in _FORMULA_SKIP}
        model_path = str(r.get("model") or "")
        settings = {k: None for k in R.KEY_SETTINGS}
        settings.update({k: r.get(k) for k in ("n_ctx", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max",
                                               "kv_unified", "n_batch", "n_ubatch")})
        prediction: dict[str, Any] = {"formula": formula}
        if r.get("engine") is not None:
            prediction["engine"] = r["engine"]
        out.append({
            "schema_version": R.SCHEMA_VERSION, "kind": KIND_PREDICT, "config_key": None,
            "status": "ok" if r.get("status") == "ok" else "skipped", "reason": r.get("reason"),
            "source_file": str(source),
            "model": {"path": model_path, "name": Path(model_path).stem if model_path else None, "arch": r.get("arch"),
                      "sha256": None, "size_bytes": r.get("weights_bytes")},
            "settings": settings,
            "prediction": prediction,
            "environment": {},
        })
    return out


# -- typed blocks --------------------------------------------------------------------------------------
#
# The measured blocks (memory, llama_log, differences, speed, quality, effective) are read as the schema's
# types (:mod:`edgekv.records.schema`): attributes, no guessing.  ``settings``, ``model`` and ``prediction``
# are still read from the plain dict: records of kind ``predict`` (from ``predict --json``) do not decode as a
# whole :class:`~edgekv.records.schema.Record` yet, and every bench record carries a ``load`` block
# (edgekv.edges.load) the schema does not name yet.  When both decode, the readers take ``Record`` attributes.

T = TypeVar("T")


def unset_none(x: Any) -> Any:
    """A field a record does not hold (msgspec's UNSET) as None: shown as a dash, never filled in."""
    return None if x is UNSET else x


def typed_block(rec: dict[str, Any], name: str, typ: type[T]) -> T | None:
    """``rec[name]`` decoded strictly as the schema's type; None where the record holds no such block."""
    v = rec.get(name)
    if v is None or isinstance(v, msgspec.Struct):
        return v
    try:
        return msgspec.convert(v, typ, strict=True)
    except msgspec.ValidationError as e:
        raise ResultsError(f"{rec.get('source_file') or 'record'}: {name}: {e}; not a usable edgekv result") from None


def memory_of(rec: dict[str, Any]) -> S.Memory | None:
    return typed_block(rec, "memory", S.Memory)


def llama_log_of(rec: dict[str, Any]) -> S.LlamaLog | None:
    return typed_block(rec, "llama_log", S.LlamaLog)


def differences_of(rec: dict[str, Any]) -> S.Differences | None:
    return typed_block(rec, "differences", S.Differences)


def speed_of(rec: dict[str, Any], test: str) -> S.SpeedTest | None:
    speed = typed_block(rec, "speed", S.Speed)
    return unset_none(getattr(speed, test)) if speed is not None else None


def quality_of(rec: dict[str, Any]) -> S.Quality | None:
    """The quality pass of a record (``status``, ``error``, ``quality``: the statistics, None unless ok)."""
    return typed_block(rec, "quality", S.Quality)


def effective_of(rec: dict[str, Any]) -> S.Effective | None:
    return typed_block(rec, "effective", S.Effective)


# -- machines ----------------------------------------------------------------------------------------

def machine_label(rec: dict[str, Any]) -> str | None:
    """The machine a record was measured on: the ``machine`` column merge keeps, else the host name."""
    m = rec.get("machine")
    if m:
        return str(m)
    env = rec.get("environment") or {}
    return env.get("machine_id") or None


def device_label(rec: dict[str, Any]) -> str:
    """'machine: devices (backends)', the column a multi-machine report shows; '-' for predictions."""
    if rec.get("kind") == KIND_PREDICT:
        return "-"
    env = rec.get("environment") or {}
    devs = env.get("devices")
    devs = ", ".join(str(d) for d in devs) if isinstance(devs, list) else (devs or env.get("cpu_model") or "?")
    back = env.get("backends")
    back = "+".join(str(b) for b in back) if isinstance(back, list) else back
    name = machine_label(rec)
    s = f"{devs} ({back})" if back else str(devs)
    return f"{name}: {s}" if name else s


def merge_files(paths: Sequence[str | os.PathLike], output: str | os.PathLike) -> list[dict[str, Any]]:
    """Several machines' results into one file: every row kept, in input order, each with a ``machine``.

    The output is written atomically (temp file + rename), so it may also be one of the inputs.
    """
    records: list[dict[str, Any]] = []
    for p in paths:
        for r in load_any(p):
            if not r.get("machine"):
                label = machine_label(r)
                if label:
                    r = {**r, "machine": label}
            records.append(r)
    R.write_all(output, records)
    return records
