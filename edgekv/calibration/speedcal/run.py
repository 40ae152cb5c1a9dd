"""Running a speed calibration plan: the runner seam and the two probes behind it (edgekv's own child, through
llama-cpp-python, and the user's llama-bench), each run bounded by the calibration's deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from edgekv.calibration.lbprobe import ProbeError, run_probe
from edgekv.calibration.speedcal.errors import CalibrationError
from edgekv.core.probe import ProbeModel, ProbeRequest, ProbeResult, reply_from, to_wire
from edgekv.runtime.process import run_child, worker_argv

RUN_TIMEOUT_S = 600.0       # one plan's child at most (a calibration's longest plan takes a few minutes)
NO_DEADLINE = float("inf")
Progress = Callable[[str], None]


class Runner(Protocol):
    """What measures a plan: (plan, progress, timeout) -> one result per timed step and depth; ``timeout``: the
    seconds the calibration has left (inf without a deadline; a runner keeps its own limits within it).  Raises
    CalibrationError when the plan could not be measured (a child that died, timed out or refused a model)."""

    def __call__(self, plan: list[ProbeModel], progress: Progress | None, timeout: float) -> list[ProbeResult]: ...


def child_runner(plan: list[ProbeModel], progress: Progress | None, timeout: float = RUN_TIMEOUT_S) -> list[ProbeResult]:
    """The plan measured by edgekv's own probe (``python -m edgekv.child.worker speed_probe``), in one child."""
    def on_event(ev: dict) -> None:
        if progress and ev.get("event") == "progress":
            progress(str(ev.get("step")))

    payload = to_wire(ProbeRequest(models=list(plan)))
    res = run_child(worker_argv("speed_probe"), payload, timeout=min(timeout, RUN_TIMEOUT_S), on_event=on_event)
    try:
        reply = reply_from(res.result) if res.result is not None else None
    except msgspec.ValidationError as e:
        raise CalibrationError(f"the speed calibration failed: the probe's reply is not one ({e})") from None
    if not res.ok or reply is None or not reply.ok:
        why = (reply.reason if reply else "") or res.failure_reason() or "no result"
        raise CalibrationError(f"the speed calibration failed: {why}")
    return reply.results


def llama_bench_runner(llama_bench: str) -> Runner:
    """A runner that measures each plan through the user's llama-bench at ``llama_bench``."""
    def run(plan: list[ProbeModel], progress: Progress | None, timeout: float = NO_DEADLINE) -> list[ProbeResult]:
        try:
            return run_probe(llama_bench, plan, progress, timeout)
        except ProbeError as e:
            raise CalibrationError(f"the speed calibration through {llama_bench} failed: {e}") from None

    return run


def runner_for(llama_bench: str | None) -> Runner:
    """The probe that runs a plan: edgekv's own child through llama-cpp-python, or the user's llama-bench."""
    return llama_bench_runner(llama_bench) if llama_bench else child_runner


class Bounded:
    """A runner held to an absolute deadline (``time.monotonic()``; None: none): each run's timeout is the time left
    (inf without a deadline), and ``expired`` says whether the deadline has passed."""

    def __init__(self, run: Runner, deadline: float | None):
        self.run, self.deadline = run, deadline

    def left(self) -> float:
        return NO_DEADLINE if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def __call__(self, plan: list[ProbeModel], progress: Progress | None) -> list[ProbeResult]:
        left = self.left()
        if left <= 0:
            raise CalibrationError("the deadline passed before this run")
        return self.run(plan, progress, left)
