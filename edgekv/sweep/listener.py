"""What a measured sweep says while it runs, to whoever listens (``edgekv bench``'s monitor, a test, the API):
a :class:`SweepListener`, one typed method per kind of news.

:class:`QuietListener` ignores everything (subclass it and override what you need).  :class:`EventListener` turns
each call back into the ``on_event(kind, data)`` pair that older callers of
:func:`edgekv.sweep.run.run_sweep` pass (``on_event=``), so that they keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edgekv.records.schema import Environment, Record, SpeedPrediction
    from edgekv.sweep.plan import SweepTracker
    from edgekv.sweep.spec import Case


@dataclass(frozen=True)
class SweepPlan:
    """The sweep's plan, said once before the first case: how many configurations there are and are still to do
    (``retry`` of them failed before), where the records go, what will not fit now, the speed predictions, the
    extra-buffer choice (``repack``: the values the sweep runs) and the tracker that holds the time estimate."""

    total: int
    todo: list[Case]
    output: str
    existing: int
    env: Environment
    model_sha256: str | None
    retry: int
    unfit: dict[str, str]
    speeds: dict[str, SpeedPrediction]
    tracker: SweepTracker
    repack: list[bool]


@dataclass(frozen=True)
class CaseDone:
    """A finished case: its index among the cases to do, its record, and the times (its own wall time, the sweep's
    elapsed time and the estimate of what is left)."""

    i: int
    n: int
    case: Case
    record: Record
    wall_s: float
    elapsed_s: float
    remaining_s: float | None


class SweepListener(Protocol):
    def on_note(self, message: str) -> None:
        """One line worth saying (a results file's tail repaired, the extra-buffer fallback, the calibration)."""

    def on_calibrate(self, step: str, left_s: float) -> None:
        """The speed calibration measured ``step``; ``left_s`` before its deadline."""

    def on_plan(self, plan: SweepPlan) -> None:
        """The plan, before the first case."""

    def on_case(self, i: int, n: int, case: Case) -> None:
        """Case ``i`` of ``n`` starts."""

    def on_child(self, event: dict[str, Any]) -> None:
        """An event of the process measuring the case (its phase, progress, a log line)."""

    def on_record(self, done: CaseDone) -> None:
        """A case's record, before it is written."""

    def on_done(self, i: int, n: int, record: Record) -> None:
        """A case's record was written."""


class QuietListener:
    """A listener that ignores everything: subclass it and override what you need."""

    def on_note(self, message: str) -> None:
        pass

    def on_calibrate(self, step: str, left_s: float) -> None:
        pass

    def on_plan(self, plan: SweepPlan) -> None:
        pass

    def on_case(self, i: int, n: int, case: Case) -> None:
        pass

    def on_child(self, event: dict[str, Any]) -> None:
        pass

    def on_record(self, done: CaseDone) -> None:
        pass

    def on_done(self, i: int, n: int, record: Record) -> None:
        pass


class EventListener(QuietListener):
    """The typed calls as the ``(kind, data)`` events of ``run_sweep(on_event=...)``: note, calibrate, start, case,
    child, record and done, with the keys they always had."""

    def __init__(self, on_event: Callable[[str, dict[str, Any]], None]) -> None:
        self.on_event = on_event

    def on_note(self, message: str) -> None:
        self.on_event("note", {"message": message})

    def on_calibrate(self, step: str, left_s: float) -> None:
        self.on_event("calibrate", {"step": step, "left_s": left_s})

    def on_plan(self, plan: SweepPlan) -> None:
        self.on_event("start", {"total": plan.total, "todo": len(plan.todo), "todo_cases": plan.todo,
                                "output": plan.output, "existing": plan.existing, "env": plan.env,
                                "model_sha256": plan.model_sha256, "retry": plan.retry, "unfit": plan.unfit,
                                "speeds": plan.speeds, "tracker": plan.tracker})

    def on_case(self, i: int, n: int, case: Case) -> None:
        self.on_event("case", {"i": i, "n": n, "case": case})

    def on_child(self, event: dict[str, Any]) -> None:
        self.on_event("child", event)

    def on_record(self, done: CaseDone) -> None:
        self.on_event("record", {"i": done.i, "case": done.case, "record": done.record, "wall_s": done.wall_s,
                                 "elapsed_s": done.elapsed_s, "remaining_s": done.remaining_s})

    def on_done(self, i: int, n: int, record: Record) -> None:
        self.on_event("done", {"i": i, "n": n, "record": record})


def listener_of(listener: SweepListener | None, on_event: Callable[[str, dict[str, Any]], None] | None) -> SweepListener:
    """The listener a sweep talks to: the one given, else the ``on_event`` callback's adapter, else a quiet one."""
    if listener is not None:
        return listener
    return EventListener(on_event) if on_event is not None else QuietListener()
