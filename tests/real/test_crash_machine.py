"""Every path a machine whose extra-buffer kernels crash takes (llama.cpp #20824 on some Intel AMX CPUs), run here
with real children that really die: EDGEKV_EMULATE_EXTRA_BUFT_CRASH=1 makes a child that loaded its model with the
extra buffer types on kill itself with SIGSEGV on its first decode of 2 or more tokens, as such a machine does
(edgekv.child.emulate).  Each test has its own EDGEKV_HOME: the emulated verdict is cached under its own key too.

On a real AMX machine tests/real/test_amx.py's hardware tests run as well; these run on every CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgekv.runtime.childside import EMULATE_CRASH_ENV

pytestmark = pytest.mark.slow


def _env(home) -> dict[str, str]:
    return {**os.environ, "EDGEKV_HOME": str(home), EMULATE_CRASH_ENV: "1"}


def _cli(home, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(home))


def test_the_preflight_sees_the_crash_and_names_the_buffer_it_died_with(tmp_path, monkeypatch):
    from edgekv.calibration.preflight import preflight

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    monkeypatch.setenv(EMULATE_CRASH_ENV, "1")
    pf = preflight()
    assert pf.runs is False and not pf.repack and "SIGSEGV" in pf.detail and "a batch of 2 tokens" in pf.detail
    # the buffers come from the child's own report before it died (llama.cpp's load lines), never "unknown"
    if pf.extra_buffers:
        named = ", ".join(f"{k} {v:.2f} MiB" for k, v in pf.extra_buffers.items())
        assert f"with {named}" in pf.detail and "no extra buffer" not in pf.detail, pf.detail
    again = preflight()
    assert again.runs is False and not again.remeasured          # cached under the emulation's own key
    monkeypatch.delenv(EMULATE_CRASH_ENV)
    assert preflight().runs is not False                          # the machine's own verdict is another one


def test_predict_follows_the_verdict_and_says_so(tmp_path, smollm2_path):
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads(r.stdout)[0]
    assert rec["settings"]["repack"] is False, rec["settings"]
    parts = {p["name"] for p in rec["prediction"]["process"]["parts"]}
    assert not any("copy)" in p for p in parts), parts              # no AMX / CPU_REPACK copy predicted
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16")
    assert r.returncode == 0 and "predicting --repack 0, the setting that runs here" in r.stdout, r.stdout
    # llama.cpp's default stays available, and is said to die here
    r = _cli(tmp_path, "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "--repack", "1")
    assert r.returncode == 0 and "dies on the first prompt batch here" in r.stdout, r.stdout


def test_bench_measures_with_repack_0_and_says_so(tmp_path, smollm2_path):
    out = tmp_path / "r.jsonl"
    r = _cli(tmp_path, "bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "32", "-n", "8", "-r",
             "1", "-t", "2", "--no-speed-model", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measuring with --repack 0, the setting that runs here" in r.stderr, r.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["status"] == "ok" and rec["settings"]["repack"] is False
    assert rec["prediction"]["speed"]["error"] == "not predicted (--no-speed-model)"
    # asked for, --repack 1 runs and dies as on such a machine: a failed record naming the signal, exit 1
    r = _cli(tmp_path, "bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "32", "-n", "8", "-r",
             "1", "-t", "2", "--no-speed-model", "--repack", "1", "-o", str(tmp_path / "r1.jsonl"))
    assert r.returncode == 1 and "--repack 1 runs as asked" in r.stderr, r.stderr[-2000:]
    rec = json.loads((tmp_path / "r1.jsonl").read_text().splitlines()[0])
    assert rec["status"] == "failed" and "SIGSEGV" in rec["reason"], rec["reason"]


def test_quality_refuses_a_bad_corpus_in_one_line_then_runs_with_repack_0(tmp_path, smollm2_path):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    r = _cli(tmp_path, "quality", str(smollm2_path), "-c", "256", "-ctk", "q8_0", "--corpus", str(short))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _cli(tmp_path, "quality", str(smollm2_path), "-c", "256", "-ctk", "q8_0", "--chunks", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measuring with --repack 0" in r.stderr
    (row,) = [x for x in json.loads(r.stdout) if x["settings"]["type_k"] == "q8_0"]
    assert row["status"] == "ok" and row["settings"]["repack"] is False, row


def test_info_and_calibrate_say_the_verdict(tmp_path):
    r = _cli(tmp_path, "info", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    pf = json.loads(r.stdout)["preflight"]
    assert pf["runs"] is False and pf["repack_default"] is False and "SIGSEGV" in pf["detail"]
    # calibrate follows it too: no child known to crash is started (the deadline stops it early here)
    r = _cli(tmp_path, "calibrate", "--calibration-timeout", "3", "-ctk", "f16")
    assert "calibrating --repack 0, the setting that runs here" in r.stderr, r.stderr[-2000:]
    assert "with -t 2, --repack 0:" in r.stderr.replace("-t 1,", "-t 2,") and "child died" not in r.stderr, r.stderr
