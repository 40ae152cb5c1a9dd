"""The speed calibration never stands in front of an answer: predict answers from the header and what is cached,
a measurement has a deadline, and two edgekv processes never measure at once (issue 63)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def _env(home, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGEKV_SPEED_CALIBRATE"}    # auto: measuring allowed
    return {**env, "EDGEKV_HOME": str(home), **extra}


def _cli(home, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(home))


def _speed_files(home) -> list[str]:
    folder = home / "calibration"
    return sorted(p.name for p in folder.glob("*speed*")) if folder.is_dir() else []


def test_predict_never_calibrates_by_itself_and_says_why_speed_is_missing(tmp_path, smollm2_path):
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16,q4_0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "calibrating" not in r.stderr and not [f for f in _speed_files(tmp_path) if f.endswith(".json")]
    note = next(x for x in r.stdout.splitlines() if "no speed prediction" in x)
    assert "'edgekv calibrate'" in note and "--speed" in note, note
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "--json")
    sp = json.loads(r.stdout)[0]["prediction"]["speed"]
    assert sp["calibration_id"] is None and "edgekv calibrate" in sp["error"], sp


def test_predict_speed_measures_within_its_deadline(tmp_path, smollm2_path):
    t0 = time.monotonic()
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "--speed",
             "--calibration-timeout", "4", "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    assert "calibrating" in r.stderr and "s left" in r.stderr, r.stderr
    sp = json.loads(r.stdout)[0]["prediction"]["speed"]
    assert sp["calibration_id"] is None and "deadline" in sp["error"], sp
    assert took < 4 + 60, took          # the deadline, plus start-up and the dry run on a loaded machine


def test_a_second_process_waits_for_the_first_and_gives_up_at_its_deadline(tmp_path, smollm2_path, monkeypatch):
    from edgekv.calibration.lock import measuring
    from edgekv.prediction.speed import SPEED_LOCK

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    with measuring(SPEED_LOCK):             # "another edgekv process" measuring this machine's speed
        r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "--speed",
                 "--calibration-timeout", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "another edgekv process is measuring this machine's speed: waiting" in r.stderr, r.stderr
    assert "calibrating:" not in r.stderr                   # it never measured beside the other one
    note = next(x for x in r.stdout.splitlines() if "no speed prediction" in x)
    assert "still measuring" in note and "deadline" in note, note


def test_bench_no_speed_model_skips_the_calibration(tmp_path, smollm2_path):
    out = tmp_path / "r.jsonl"
    r = _cli(tmp_path, "bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "16", "-n", "4",
             "-r", "1", "-t", "2", "--no-speed-model", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "calibrating" not in r.stderr and not [f for f in _speed_files(tmp_path) if f.endswith(".json")]
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["prediction"]["speed"]["error"] == "not predicted (--no-speed-model)"


def test_bench_goes_on_without_speed_past_the_calibration_deadline(tmp_path, smollm2_path):
    out = tmp_path / "r.jsonl"
    r = _cli(tmp_path, "bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "16", "-n", "4",
             "-r", "1", "-t", "2", "--calibration-timeout", "3", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stderr.splitlines() if "no speed predictions:" in x)
    assert "deadline" in line and "--no-speed-model" in line, line
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["status"] == "ok" and "deadline" in rec["prediction"]["speed"]["error"], rec["prediction"]["speed"]


def test_a_ci_job_carries_its_calibrations_in_one_file(tmp_path):
    a, b, bundle = tmp_path / "a", tmp_path / "b", tmp_path / "calibration.json"
    assert _cli(a, "info", "--json").returncode == 0          # the runtime baseline and the preflight, cached in a
    r = _cli(a, "calibrate", "--export", str(bundle), "--json")
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout)["exported"]
    assert n >= 2 and bundle.is_file()
    r = _cli(b, "calibrate", "--import", str(bundle), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["imported"] == n, r.stderr
    assert sorted(p.name for p in (b / "calibration").glob("*.json")) == \
        sorted(p.name for p in (a / "calibration").glob("*.json") if not p.name.endswith("-verified.json"))
    # a bundle that is not one is refused in one line, and nothing is written
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": 3}')
    r = _cli(tmp_path / "c", "calibrate", "--import", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(bad) in r.stderr, r.stderr
    assert not list((tmp_path / "c").glob("calibration/*.json"))
