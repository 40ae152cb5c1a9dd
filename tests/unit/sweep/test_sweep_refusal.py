"""Issue 68 point 6: a configuration that will be refused (predicted not to fit the memory available) is never
calibrated for: the speed model's calibration covers only the configurations that will run, and a plan refused
whole measures nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgekv.sweep import run as sweep


def _plan(monkeypatch, unfit_keys: set[str]):
    asked: list[list[str]] = []

    def speeds(spec, todo, engine_results, emit):
        asked.append([c.key for c in todo])
        return {c.key: sweep.SpeedPrediction(calibration_id="cal") for c in todo}

    monkeypatch.setattr(sweep, "dry_runs", lambda spec, todo: {})
    monkeypatch.setattr(sweep, "process_predictions", lambda spec, todo: {})
    monkeypatch.setattr(sweep, "fit_check", lambda spec, c, proc: "too big; skipped" if c.key in unfit_keys else None)
    monkeypatch.setattr(sweep, "speed_predictions", speeds)
    monkeypatch.setattr(sweep, "SweepTracker", lambda *a, **k: None)
    events: list[tuple[str, dict]] = []
    spec = SimpleNamespace(engine="python", predict_speed=True, model=None, repack=None, min_repetitions=0, rep_budget_s=0.0)
    todo = [SimpleNamespace(key=k, params=None) for k in ("a", "b", "c")]
    say = sweep.listener_of(None, lambda k, d: events.append((k, d)))
    _, _, out, _ = sweep._plan_sweep(spec, todo, todo, set(), None, None, say, None)
    start = next(d for k, d in events if k == "start")
    return asked, out, start


def test_only_the_configurations_that_fit_are_calibrated_for(monkeypatch):
    asked, out, start = _plan(monkeypatch, {"b"})
    assert asked == [["a", "c"]]
    assert out["a"].calibration_id == "cal" and out["b"].calibration_id is None
    assert "not to fit" in out["b"].error
    assert set(start["unfit"]) == {"b"}


def test_a_plan_refused_whole_calibrates_nothing(monkeypatch):
    asked, out, _ = _plan(monkeypatch, {"a", "b", "c"})
    assert asked == [[]]         # and speed_predictions returns {} for no configuration, before calibrating
    assert all(out[k].calibration_id is None for k in "abc")


@pytest.mark.slow
def test_a_real_bench_whose_only_configuration_cannot_fit_is_refused_without_calibrating(smollm2_path, tmp_path):
    """The issue's own command, sized to twice this machine's memory in KV: refused in seconds, no speed calibration
    measured (nothing cached, measuring on)."""
    import os
    import subprocess
    import sys

    import psutil

    per_cell = 30 * 3 * 64 * 2 * 2            # SmolLM2's f16 K and V bytes a cell
    ctx = -(-2 * psutil.virtual_memory().total // per_cell // 256) * 256
    env = {**os.environ, "EDGEKV_HOME": str(tmp_path / "home"), "EDGEKV_SPEED_CALIBRATE": "auto"}
    p = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", str(smollm2_path), "-c", str(ctx), "-ctk", "f16",
                        "-o", str(tmp_path / "r.jsonl")], capture_output=True, text=True, env=env, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "predicted not to fit" in out, out
    assert "calibrating" not in out
    assert not list((tmp_path / "home" / "calibration").glob("*speed*"))
