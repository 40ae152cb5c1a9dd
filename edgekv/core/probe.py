"""The speed calibration's probe protocol: the plan edgekv asks a probe to time and the rows it gets back.

Shared by the side that plans and solves (edgekv.calibration.speedcal), the in-process probe that runs a plan
inside a child (edgekv.child.speedprobe) and the probe through the user's own llama-bench
(edgekv.calibration.lbprobe).  The plan crosses to the child as JSON on its stdin and the rows come back as JSON
on its event pipe: :func:`to_wire` and the ``*_from`` functions encode and decode them with msgspec, strictly.

A plan is a list of :class:`ProbeModel`: a calibration model (a file edgekv writes, edgekv.sources.tinymodel), each
with contexts (:class:`ProbeContext`: the llama.cpp context parameters and thread counts), each with steps
(:class:`ProbeStep`: a prompt of ``n`` tokens, "pp", or ``n`` generated tokens, "tg", timed ``reps`` times from a
cache filled to ``depth``).  Every timed step comes back as one :class:`ProbeResult` per depth.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

import msgspec

from edgekv.core.wire import decoder
from edgekv.core.wire import to_wire as to_wire


class ProbeStep(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One timed step: ``reps`` runs (after ``warmup`` untimed ones) of a ``test`` of ``n`` tokens from a cache of
    ``depth`` cells; ``depths``: the in-process probe's sequences at those depths, their runs taken in turn (the
    results are named ``key`` + depth).  ``turn``: consecutive steps of a context with the same one (and the same
    depths, warm-up and reps) are taken in turn with each other too, run i of each step at each depth before run
    i + 1 of any, so a stretch in which the machine runs slower or faster falls on all of them alike (a ratio of
    two steps, speedcal.solve.solve_tile_share, then keeps its meaning)."""

    key: str
    test: str                       # "pp" (a prompt) or "tg" (generated tokens)
    n: int
    reps: int
    depth: int = 0
    warmup: int = 1
    depths: list[int] | None = None
    turn: str = ""


class ProbeParams(msgspec.Struct, kw_only=True):
    """The llama.cpp context parameters of a calibration context (edgekv.core.predict.ContextParams' names)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    flash_attn: str
    n_seq_max: int = 1


class ProbeContext(msgspec.Struct, kw_only=True):
    """A calibration context: its timed runs on ``n_threads``, its untimed cache fills on ``fill_threads``."""

    key: str
    n_threads: int
    fill_threads: int
    steps: list[ProbeStep]
    params: ProbeParams


class ProbeModel(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A calibration model and its contexts.  ``model_path`` and ``write`` are edgekv.sources.tinymodel.plan_model's
    (the file and what to write there; the probe recomputes the path from ``write``, so a plan never chooses one);
    ``type``, ``shape`` and ``body`` name what a weight or body model stands for."""

    key: str
    model_path: str
    contexts: list[ProbeContext]
    write: dict[str, Any] | None = None
    repack: bool = True
    n_gpu_layers: int = 0
    type: str = ""
    shape: dict[str, Any] | None = None
    body: str = ""

    def file_entry(self) -> dict[str, Any]:
        """The fields edgekv.sources.tinymodel's plan functions read (plan_model_file, drop_plan_models)."""
        return {"model_path": self.model_path, "write": self.write}


class ProbeRequest(msgspec.Struct, kw_only=True):
    models: list[ProbeModel]


class ProbeResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One timed step of one context of one model: each timed run in nanoseconds, llama.cpp's graph sizes for the
    context (``graph: nodes = ...`` and the scheduler's listing), ``in_turn`` when run i of each depth was taken one
    after the other (the solver pairs them), and the thread counts llama.cpp held for the runs and for the fill."""

    model: str = ""
    context: str = ""
    step: str
    ns: list[int]
    test: str = ""
    depth: int = 0
    n: int = 0
    graph: dict[str, int] | None = None
    in_turn: bool = False
    threads: int | None = None
    fill_threads: int | None = None


class ProbeReply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the in-process probe reports: every result, or why it stopped."""

    ok: bool
    results: list[ProbeResult] = []
    reason: str = ""


Plan = list[ProbeModel]
Results = list[ProbeResult]


request_from = decoder(ProbeRequest)
reply_from = decoder(ProbeReply)


def results_of(rows: Iterable[Any]) -> Results:
    """Result rows as :class:`ProbeResult` (rows read back from a cached calibration's JSON are converted;
    ValidationError on a row that is not one)."""
    return [r if isinstance(r, ProbeResult) else msgspec.convert(r, ProbeResult) for r in rows]


def readable_results(rows: Any) -> Results:
    """The rows of a cached calibration's ``raw`` list that are results, the others skipped (files of older
    versions, or hand-edited ones, stay readable)."""
    out = []
    for r in rows if isinstance(rows, list) else []:
        try:
            out.append(r if isinstance(r, ProbeResult) else msgspec.convert(r, ProbeResult))
        except msgspec.ValidationError:
            continue
    return out


def by_step(results: Iterable[Any], model: str, context: str | None = None) -> dict[str, ProbeResult]:
    """The results of one model (and one of its contexts), by step name."""
    return {r.step: r for r in results_of(results) if r.model == model and (context is None or r.context == context)}


def median_s(ns: list[int]) -> float:
    """The median of timed runs in nanoseconds, in seconds."""
    return statistics.median(ns) / 1e9
