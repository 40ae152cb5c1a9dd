"""The seam between a sweep and what measures one of its cases: a :class:`CaseRunner` per engine.

The sweep (edgekv.sweep.run) asks the runner of its spec's engine for each case's record: edgekv's own
child through llama-cpp-python (:class:`PythonRunner`), the user's llama-bench (:class:`LlamaBenchRunner`) or
llama-server (:class:`ServerRunner`).  :class:`ReplayRunner` answers from recorded runs of the python engine: the
parent's view of the child (the memory it sampled, the phases, how the child ended) and the child's
:class:`~edgekv.core.benchwire.BenchReply`, one JSON file per case, named by its configuration key.  The record it
builds goes through the same decoding, failure classification and record building as a live run.

Recording: with ``EDGEKV_RECORD_REPLIES=DIR`` set, the python runner also writes each case's run to
``DIR/<replay key>.json``: the configuration key of its settings alone (:func:`replay_key`), so that a recording
stays valid for a model file written again (tools/record_replies.py records a tiny model's cases that way).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import msgspec

from edgekv.core.benchwire import BenchRequest, DepthSeed, to_wire
from edgekv.core.shape import MEMORY_KV
from edgekv.errors import UsageError
from edgekv.machine.memory import memory_watchdog
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.runtime.engine import EngineResult
from edgekv.runtime.process import ChildResult, run_child, worker_argv
from edgekv.sweep.listener import SweepListener
from edgekv.sweep.llamabench import run_llama_bench_case
from edgekv.sweep.record import build_record, child_outcome, decode_reply
from edgekv.sweep.seeds import DepthSeeds
from edgekv.sweep.serving import run_server_case
from edgekv.sweep.spec import ENGINE_LLAMA_BENCH, ENGINE_PYTHON, ENGINE_SERVER, Case, SweepSpec

RECORD_ENV = "EDGEKV_RECORD_REPLIES"


@dataclass(frozen=True)
class CaseContext:
    """What every case of a sweep shares: the spec, the environment and model blocks of its records, the GPU
    memory probe and the sweep's listener (which hears the measuring process's events)."""

    spec: SweepSpec
    env: S.Environment
    model: S.Model
    gpu_probe: Any
    say: SweepListener
    seeds: DepthSeeds | None = None      # the depth states handed between its cases (edgekv.sweep.seeds)


class CaseRunner(Protocol):
    """Measures one case that the formula and llama.cpp's dry run accepted and that fits now; its record."""

    def run(self, cx: CaseContext, case: Case, eng: EngineResult | None) -> S.BenchRecord: ...


# -- edgekv's child through llama-cpp-python, live or replayed ---------------------------------------------------

class RecordedRun(msgspec.Struct, kw_only=True):
    """One case's run as a replay file holds it: its replay key and settings (to check the file against the case)
    and the parent's view of the child, whose ``result`` is the child's reply as it arrived."""

    replay_key: str
    settings: S.Settings
    child: ChildResult


def replay_key(case: Case) -> str:
    """The name of a case's replay file: the configuration key of its settings, without the model's sha256."""
    return R.config_key(None, S.encode_block(case.settings))


def bench_request(spec: SweepSpec, case: Case, seed: DepthSeed | None = None) -> BenchRequest:
    """The bench child's request for a case: the model file, the context parameters, the workload, how the
    cache goes back to its depth (truncated where llama.cpp can remove tokens exactly, else a snapshot) and the
    depth state it starts from or leaves (``seed``)."""
    m = spec.model
    work = msgspec.structs.replace(case.settings.workload(), min_repetitions=spec.min_repetitions,
                                   rep_budget_s=spec.rep_budget_s)
    return BenchRequest(model_path=os.path.abspath(m.ref.path), params=case.params, workload=work,
                        restore="truncate" if m.shape.memory == MEMORY_KV else "snapshot", seed=seed)


def record_from_child(cx: CaseContext, case: Case, eng: EngineResult | None, child: ChildResult,
                      wall: float) -> S.BenchRecord:
    """A case's record from its child: the reply decoded strictly (one line when it does not read), the outcome
    classified, the blocks built."""
    reply, unreadable = decode_reply(child)
    status, reason, failure = ("failed", unreadable, None) if unreadable else child_outcome(child, case, reply)
    rec = build_record(cx.spec, case, cx.env, cx.model, eng, child, wall, status, reason, reply)
    if failure is not None:
        rec.failure = failure
    return rec


def _save_run(directory: str, case: Case, child: ChildResult) -> None:
    """The case's run written for replay (its events left out: the record does not read them)."""
    key = replay_key(case)
    path = Path(directory) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = RecordedRun(replay_key=key, settings=case.settings, child=replace(child, events=[], stdout=None,
                                                                                stderr=None))
    path.write_bytes(msgspec.json.format(msgspec.json.encode(run), indent=1) + b"\n")


class PythonRunner:
    """One fresh ``python -m edgekv.child.worker bench`` per case, its memory sampled by the parent; a deeper case
    starts from the depth state a shallower one of the same cache left (``cx.seeds``)."""

    seeds_depth = True          # the sweep plans depth states for this runner (edgekv.sweep.seeds)

    def run(self, cx: CaseContext, case: Case, eng: EngineResult | None) -> S.BenchRecord:
        t = time.perf_counter()
        seed = cx.seeds.request(case) if cx.seeds is not None else None
        child = run_child(worker_argv("bench"), to_wire(bench_request(cx.spec, case, seed)), timeout=cx.spec.timeout_s,
                          sample_memory=True, gpu_probe=cx.gpu_probe, on_event=cx.say.on_child,
                          watchdog=memory_watchdog)
        wall = time.perf_counter() - t
        if os.environ.get(RECORD_ENV):
            _save_run(os.environ[RECORD_ENV], case, child)
        rec = record_from_child(cx, case, eng, child, wall)
        if cx.seeds is not None:
            cx.seeds.done(case, rec.status == "ok")
        return rec


class ReplayRunner:
    """The python engine's runs answered from ``directory``'s recorded runs (tests/data/replies/...), one per
    replay key (:func:`replay_key`); a case without one is a UsageError naming the file to record."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def load(self, case: Case) -> RecordedRun:
        key = replay_key(case)
        path = self.directory / f"{key}.json"
        try:
            run = msgspec.json.decode(path.read_bytes(), type=RecordedRun)
        except FileNotFoundError:
            raise UsageError(f"{path}: no recorded run of this configuration; record it with "
                             f"{RECORD_ENV}={self.directory} (tools/record_replies.py)") from None
        except msgspec.ValidationError as e:
            raise UsageError(f"{path}: not a recorded run ({e}); record it again") from None
        if run.replay_key != key or run.settings != case.settings:
            raise UsageError(f"{path}: it records other settings than this case's; record it again")
        return run

    def run(self, cx: CaseContext, case: Case, eng: EngineResult | None) -> S.BenchRecord:
        child = self.load(case).child
        return record_from_child(cx, case, eng, child, child.wall_s)


# -- the user's llama.cpp tools -------------------------------------------------------------------------------------

class LlamaBenchRunner:
    """One llama-bench process per test of the case (edgekv.sweep.llamabench)."""

    def run(self, cx: CaseContext, case: Case, eng: EngineResult | None) -> S.BenchRecord:
        base = build_record(cx.spec, case, cx.env, cx.model, None, None, 0.0, "ok", None)
        return run_llama_bench_case(cx.spec, case, cx.env, base, cx.gpu_probe, cx.say)


class ServerRunner:
    """One llama-server process per case, driven over HTTP (edgekv.sweep.serving)."""

    def run(self, cx: CaseContext, case: Case, eng: EngineResult | None) -> S.BenchRecord:
        base = build_record(cx.spec, case, cx.env, cx.model, eng, None, 0.0, "ok", None)
        return run_server_case(cx.spec, case, base, cx.gpu_probe, cx.say)


RUNNERS: dict[str, Callable[[], CaseRunner]] = {ENGINE_PYTHON: PythonRunner, ENGINE_LLAMA_BENCH: LlamaBenchRunner,
                                               ENGINE_SERVER: ServerRunner}


def runner_for(engine: str) -> CaseRunner:
    """The runner of an engine (the spec's ``engine``)."""
    return RUNNERS[engine]()
