"""The speed calibration's errors, and the switch that says whether predict and bench may measure on their own."""

from __future__ import annotations

import os
from typing import Any

SPEED_CALIBRATE_ENV = "EDGEKV_SPEED_CALIBRATE"    # auto (default): measure what a prediction needs; cached: never


class CalibrationError(RuntimeError):
    pass


class PartlyMeasured(CalibrationError):
    """A run failed (a full disk, a type llama.cpp refused) after the graph nodes and attention were measured and
    solved into ``cal`` (``raw``: their timings): calibrate caches those before it reports the error, so that the
    next run measures only the rest."""

    def __init__(self, why: str, cal: Any, raw: list[Any]):
        super().__init__(why)
        self.cal, self.raw = cal, raw


class CalibrationTimeout(CalibrationError):
    """The calibration passed its deadline.  ``measured``: what it had measured and solved before (in words; "" for
    nothing); ``cal``/``raw``: that calibration and its timings when some of it may be kept (None otherwise)."""

    def __init__(self, why: str, measured: str = "", cal: Any = None, raw: list[Any] | None = None):
        super().__init__(why)
        self.measured, self.cal, self.raw = measured, cal, raw or []


class Disturbed(CalibrationError):
    """A measurement that found no cost where there must be one: other work on the machine hid it.  Refused, never
    cached (calibrate measures once more on a machine that was quiet meanwhile)."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"the speed calibration {what} (other work on the machine disturbed it): not cached; run "
                         "'edgekv calibrate' on a quiet machine")


def auto_measure() -> bool:
    """Whether predict and bench may calibrate on their own (EDGEKV_SPEED_CALIBRATE=auto, the default) or only
    use what is cached (=cached: a CI job that must not spend a minute measuring; the test suite)."""
    mode = os.environ.get(SPEED_CALIBRATE_ENV, "auto").strip().lower()
    if mode not in ("auto", "cached"):
        raise CalibrationError(f"{SPEED_CALIBRATE_ENV}={mode!r}: use auto or cached")
    return mode == "auto"
