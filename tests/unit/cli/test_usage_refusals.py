"""Flags a command refuses in one line before it starts anything: no llama.cpp child, no calibration, no note
first (in-process; the fast tier's guard fails a test whose command starts a llama.cpp child).  The real runs of
the same commands are in tests/real/test_calibration_policy.py and tests/real/test_crash_machine.py."""

from __future__ import annotations

from edgekv.runtime.childside import EMULATE_CRASH_ENV


def test_bad_calibration_flags_are_one_line(tmp_path, sparse_models, cli, monkeypatch):
    monkeypatch.delenv("EDGEKV_SPEED_CALIBRATE")          # auto: measuring allowed
    for args in (["bench", str(sparse_models["smollm2"]), "--calibration-timeout", "0"],
                 ["calibrate", "--calibration-timeout", "-1"],
                 ["calibrate", "--export", str(tmp_path / "a.json"), "--import", str(tmp_path / "b.json")]):
        r = cli(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert r.stderr.startswith("edgekv: error:"), r.stderr


def test_bench_refuses_bad_input_in_one_line_before_any_note(tmp_path, sparse_models, cli, monkeypatch):
    """On a machine whose extra-buffer kernels crash (emulated: tests/real/test_crash_machine.py), a context too small
    for its depth is refused before the preflight could say anything."""
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(EMULATE_CRASH_ENV, "1")
    r = cli("bench", str(sparse_models["smollm2"]), "-c", "512", "-d", "600")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "does not fit" in r.stderr, r.stderr
