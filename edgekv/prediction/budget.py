"""--budget: the largest context (multiple of 256) whose predicted *process peak* fits the budget.

The answer comes from the whole-process prediction (:mod:`edgekv.core.memmodel` through
:mod:`edgekv.prediction.wholeprocess`): runtime baseline + llama.cpp's host structures + weights + caches + the
compute buffer of the workload's graph + work and output buffers.  Caches and compute buffers grow with
the context, so a binary search is exact.  The search stops at the model's trained context and every
row says so when it stopped there.  Without llama.cpp's dry run, or without a runtime baseline, the row
says what is missing instead of answering from a partial sum.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Union

import msgspec
from msgspec import UNSET, Struct, UnsetType

from edgekv.calibration.baseline import runtime_baseline
from edgekv.core.memmodel import WORKLOAD_HELP
from edgekv.core.predict import KV_PAD, STATUS_OK, ContextParams, largest_fitting, max_context_for_budget, predict
from edgekv.core.units import MIB
from edgekv.errors import EngineError
from edgekv.prediction.api import LoadedModel
from edgekv.prediction.wholeprocess import ProcessSettings, predict_processes
from edgekv.records.schema import Process, process_block
from edgekv.runtime.engine import EngineSession

OptInt = Union[int, None, UnsetType]


class BudgetRow(Struct, kw_only=True, forbid_unknown_fields=True):
    """One ``--budget`` answer: the largest context for one cache pair (``predict --budget --json``'s ``budget``).

    Absent fields (``UNSET``) are the ones a branch cannot give: no peak without a runtime baseline, a
    ``lower_bound_bytes`` only when llama.cpp's dry run failed, a ``process`` only when the search found a context."""

    budget_bytes: int
    cap: int
    workload: str
    workload_means: str
    type_k: str
    type_v: str
    max_n_ctx: Union[int, None]                 # None: no answer; 0: nothing fits
    peak_rss_bytes: OptInt = UNSET              # predicted peak at max_n_ctx (None: not predicted)
    device_bytes: Union[dict[str, int], UnsetType] = UNSET
    cache_bytes: OptInt = UNSET                 # formula, at max_n_ctx
    compute_bytes: OptInt = UNSET               # llama.cpp's dry run (host compute buffer)
    weights_bytes: OptInt = UNSET
    lower_bound_bytes: OptInt = UNSET           # runtime + weights + caches when there are no compute buffers
    predicted_tg_tokens_per_s: Union[float, None, UnsetType] = UNSET   # --min-tg: decode at max_n_ctx (predicted)
    total_bytes: OptInt = UNSET
    process: Union[Process, UnsetType] = UNSET  # the whole-process prediction at max_n_ctx
    source: Union[str, UnsetType] = UNSET       # where the answer comes from
    note: str = ""


def _typed(rows: list[dict[str, Any]]) -> list[BudgetRow]:
    return [msgspec.convert(r, BudgetRow, strict=True) for r in rows]


def _baseline_rows(pairs: list[tuple[str, str]], common: dict[str, Any], baseline,
                   budget_bytes: int) -> list[dict[str, Any]] | None:
    """The rows when the runtime baseline alone settles the answer (unknown, or over the budget); else None."""
    rows: list[dict[str, Any]] = []
    if baseline.bytes is None:
        for tk, tv in pairs:
            rows.append({**common, "type_k": tk, "type_v": tv, "max_n_ctx": None, "peak_rss_bytes": None,
                         "note": f"no answer: {baseline.note} (the runtime baseline is unknown)"})
        return rows
    if budget_bytes < baseline.bytes:
        for tk, tv in pairs:
            rows.append({**common, "type_k": tk, "type_v": tv, "max_n_ctx": 0, "peak_rss_bytes": None,
                         "note": f"nothing fits: the runtime alone needs {baseline.bytes / MIB:.0f} MiB"})
        return rows
    return None


def _lower_bound_rows(m: LoadedModel, base: ContextParams, pairs: list[tuple[str, str]], budget_bytes: int,
                      fixed: int, cap: int, trained: int, common: dict[str, Any], weights_note: str,
                      error: EngineError) -> list[dict[str, Any]]:
    """The rows without llama.cpp's dry run: no compute buffers, so each answer (from the runtime baseline, the
    weights and the caches: ``fixed`` + caches) is labelled as the bound it is."""
    rows: list[dict[str, Any]] = []
    for tk, tv in pairs:
        params = replace(base, type_k=tk, type_v=tv)
        best = max_context_for_budget(m.shape, budget_bytes, fixed, params, upper=cap)
        notes = [weights_note] if weights_note else []
        row = {**common, "type_k": tk, "type_v": tv, "max_n_ctx": best, "peak_rss_bytes": None,
               "weights_bytes": m.weights_bytes, "compute_bytes": None,
               "source": "lower bound: runtime baseline + weights + caches (no compute buffers)"}
        if best:
            kv = predict(m.shape, replace(params, n_ctx=best)).total_bytes
            row.update({"cache_bytes": kv, "lower_bound_bytes": fixed + kv, "total_bytes": None})
            if best == cap:
                notes.append(f"capped at the trained context ({cap}): the search stops there"
                             if trained else f"capped at the search limit ({cap})")
        notes.append(f"an upper bound on the context: the compute buffers are not counted, llama.cpp's dry run "
                     f"failed ({error})")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def _process_lookup(m: LoadedModel, params: ContextParams, settings, baseline, session):
    """n_ctx -> the whole-process prediction of ``params`` at that context (None where there is none), memoised."""
    seen: dict[int, Any] = {}

    def proc_at(n: int):
        if n not in seen:
            seen[n] = predict_processes(m, [replace(params, n_ctx=n)], settings, baseline, session)[0]
        return seen[n]

    return proc_at


def _nothing_fits_note(m: LoadedModel, params: ContextParams, tk: str, tv: str, min_tg) -> str:
    """Why not even the smallest context (KV_PAD tokens) is an answer: refused, no speed prediction, or too big."""
    pr = predict(m.shape, replace(params, n_ctx=KV_PAD))
    slow = min_tg is not None and min_tg(tk, tv, KV_PAD) is None
    return (pr.reason if pr.status != STATUS_OK else
            f"no speed prediction for {tk}/{tv}" if slow else
            f"not even {KV_PAD} tokens fit" + (f" and decode at {min_tg.floor:g} t/s"
                                               if min_tg is not None else ""))


def _process_row(m: LoadedModel, params: ContextParams, tk: str, tv: str, proc_at, budget_bytes: int, cap: int,
                 trained: int, common: dict[str, Any], weights_note: str, min_tg) -> dict[str, Any]:
    """One cache pair's row: the largest context whose predicted process peak fits the budget (and, with ``min_tg``,
    decodes fast enough), by bisection over the memoised process predictions ``proc_at``."""
    def fits(n: int) -> bool:
        p = proc_at(n)
        if p is None or p.peak_rss_bytes is None or p.peak_rss_bytes > budget_bytes:
            return False
        if min_tg is None:
            return True
        ts = min_tg(tk, tv, n)
        return ts is not None and ts >= min_tg.floor

    best = largest_fitting(fits, KV_PAD, cap)
    row: dict[str, Any] = {**common, "type_k": tk, "type_v": tv, "max_n_ctx": best}
    notes = [weights_note] if weights_note else []
    if best:
        p = proc_at(best)
        kv = predict(m.shape, replace(params, n_ctx=best))
        parts = {q.name: q.bytes for q in p.host_parts()}
        row.update({"peak_rss_bytes": p.peak_rss_bytes, "device_bytes": p.device_bytes,
                    "cache_bytes": kv.total_bytes,
                    "compute_bytes": sum(q.bytes for q in p.host_parts() if q.name == "compute buffer"),
                    "weights_bytes": sum(v for k, v in parts.items() if k.startswith("weights")),
                    "total_bytes": p.peak_rss_bytes, "process": process_block(p),
                    "source": "whole-process prediction (memmodel)"})
        if best == cap:
            notes.append(f"capped at the trained context ({cap}): the search stops there, larger contexts "
                         "were not tried" if trained else f"capped at the search limit ({cap})")
        if min_tg is not None:
            ts = min_tg(tk, tv, best)
            row["predicted_tg_tokens_per_s"] = ts
            mem_best = largest_fitting(lambda n: (proc_at(n) is not None and proc_at(n).peak_rss_bytes is not None
                                                  and proc_at(n).peak_rss_bytes <= budget_bytes), KV_PAD, cap)
            if mem_best > best:
                notes.append(f"limited by --min-tg {min_tg.floor:g}: {mem_best} tokens would fit in memory, "
                             f"but decode at full depth is predicted below that")
    else:
        row.update({"peak_rss_bytes": None, "cache_bytes": None, "compute_bytes": None, "total_bytes": None})
        notes.append(_nothing_fits_note(m, params, tk, tv, min_tg))
    row["note"] = "; ".join(n for n in notes if n)
    return row


def budget_table(m: LoadedModel, base: ContextParams, pairs: list[tuple[str, str]], budget_bytes: int,
                 n_gpu_layers: int = -1, cap: int | None = None, workload: str = "generate", n_threads: int = 0,
                 use_mmap: bool = True, baseline=None, min_tg=None, use_extra_bufts: bool = True) -> list[BudgetRow]:
    """One row per cache pair: the formula, the dry run and the process model side by side.

    ``min_tg``: (type_k, type_v, n_ctx) -> predicted decode tokens/s at that context's full depth, or None when
    it is not predicted; with it, a context counts only when its peak fits **and** it decodes at least
    ``min_tg.floor`` tokens/s (--min-tg).  Decode slows as the context grows, so the search stays a bisection."""
    trained = m.shape.n_ctx_train or 0
    cap = cap or trained or (1 << 20)
    cap = max(KV_PAD, cap // KV_PAD * KV_PAD)
    baseline = baseline if baseline is not None else runtime_baseline()
    settings = ProcessSettings(workload=workload, n_threads=n_threads, use_mmap=use_mmap, n_gpu_layers=n_gpu_layers,
                               use_extra_bufts=use_extra_bufts)
    common = {"budget_bytes": budget_bytes, "cap": cap, "workload": workload,
              "workload_means": WORKLOAD_HELP.get(workload, "")}
    weights_note = ("" if m.header.tensors else
                    "metadata-only header (no tensor table): weights unknown, counted as 0 MiB")
    settled = _baseline_rows(pairs, common, baseline, budget_bytes)
    if settled is not None:
        return _typed(settled)
    try:
        session = EngineSession(m.ref.path, n_gpu_layers=n_gpu_layers, header=m.header,
                                use_extra_bufts=use_extra_bufts).__enter__()
    except EngineError as e:
        # no compute buffers without llama.cpp: answer from what is known, labelled as the bound it is
        return _typed(_lower_bound_rows(m, base, pairs, budget_bytes, baseline.bytes + m.weights_bytes, cap, trained,
                                        common, weights_note, e))
    rows: list[dict[str, Any]] = []
    try:
        for tk, tv in pairs:
            params = replace(base, type_k=tk, type_v=tv)
            proc_at = _process_lookup(m, params, settings, baseline, session)
            rows.append(_process_row(m, params, tk, tv, proc_at, budget_bytes, cap, trained, common, weights_note,
                                     min_tg))
    finally:
        session.__exit__(None, None, None)
    return _typed(rows)
