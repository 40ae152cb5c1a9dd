"""Issue 68 point 1: a prediction from a calibration taken under load is marked ("~", not dimmed) on the first
screen, in predict's table and in reports, and a withheld one says "withheld" with its reason in the legend."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from edgekv.output import benchview as BV
from edgekv.records import results as R
from edgekv.records.schema import SpeedPrediction, SpeedTestPrediction

RUN = Path(__file__).parents[2] / "data" / "v1" / "reports-smollm2-135m-sweep.jsonl"


def _test(test: str, ts: float) -> SpeedTestPrediction:
    return SpeedTestPrediction(test=test, tokens_per_s=ts, depth=512, n_tokens=32, s_per_token=1 / ts, parts=[],
                               roofline_tokens_per_s=None, bytes_per_token=None, calibration_id="c")


@pytest.fixture
def rec():
    r = next(x for x in R.load_records(RUN) if x.status == "ok")
    sp = SpeedPrediction(calibration_id="c", tg=_test("tg", 33.3), pp=_test("pp", 83.0))
    return msgspec.structs.replace(r, prediction=msgspec.structs.replace(r.prediction, speed=sp))


def _with_speed(r, **kw):
    sp = msgspec.structs.replace(r.prediction.speed, **kw)
    return msgspec.structs.replace(r, prediction=msgspec.structs.replace(r.prediction, speed=sp))


def test_a_quiet_calibrations_prediction_is_dimmed_only(rec):
    cell = BV.predicted_cell(rec, "tg")
    assert cell.startswith("\n[dim]") and BV.BUSY_MARK not in cell
    assert BV.speed_marks_legend([rec]) == []


def test_a_busy_calibrations_prediction_is_marked_and_explained(rec):
    busy = _with_speed(rec, calibration_busy=True)
    cell = BV.predicted_cell(busy, "tg")
    assert cell.startswith(f"\n[yellow]{BV.BUSY_MARK}[/][dim]")          # the mark itself is not dimmed
    (line,) = BV.speed_marks_legend([rec, busy])
    assert line.startswith(f"{BV.BUSY_MARK} before a prediction: its calibration was taken while other work")
    from edgekv.output.views import _ts_cell

    assert _ts_cell(busy.prediction.speed.tg, busy).startswith("~")
    assert not _ts_cell(rec.prediction.speed.tg, rec).startswith("~")


def test_a_withheld_prediction_says_so_with_its_reason(rec):
    why = "withheld: a decode of 2.4 tokens/s is 54x below its roofline (130 tokens/s from the measured read bandwidth)"
    held = _with_speed(rec, tg=None, pp=None, error=why)
    assert BV.predicted_cell(held, "tg") == f"\n[yellow]{BV.WITHHELD}[/]"
    assert BV.speed_marks_legend([held]) == [f"withheld: no prediction shown: {why}."]
    other = _with_speed(rec, tg=None, pp=None, error="not predicted (--no-speed-model)")
    assert BV.predicted_cell(other, "tg") == "" and BV.speed_marks_legend([other]) == []


def test_the_line_each_configuration_prints_says_so_too(rec):
    from edgekv.cli.benchrun import case_line

    assert "~" not in case_line(0, 1, rec, 1.0, 1.0, None)
    busy = case_line(0, 1, _with_speed(rec, calibration_busy=True), 1.0, 1.0, None)
    assert "(predicted 33.3 ~, from a calibration taken under load)" in busy
    held = _with_speed(rec, tg=None, pp=None, error="withheld: a dropped term")
    assert "(prediction withheld)" in case_line(0, 1, held, 1.0, 1.0, None)
