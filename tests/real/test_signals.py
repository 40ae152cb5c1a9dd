"""Issue 27 point 7: SIGTERM/SIGHUP like Ctrl-C, no orphaned measuring child even when edgekv is SIGKILLed, and a
full disk while appending a record is one line with no torn record."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from edgekv.records import results as R
from tests.procs import default_signals

pytestmark = pytest.mark.slow      # signals to a running edgekv bench and its measuring child

ARGS = ["-c", "1024", "-d", "896", "-ctk", "f16,q8_0", "-p", "128", "-n", "32", "-r", "3", "-t", "2"]


def _bench(out, *extra, args=ARGS):
    """edgekv bench hearing every signal these tests send, whatever the shell that started pytest ignores."""
    return subprocess.Popen([sys.executable, "-m", "edgekv.cli", "bench", *args, "-o", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals(signal.SIGTERM, signal.SIGHUP))


def _measuring_child(parent: psutil.Process, timeout: float = 300, busy_s: float = 0.5) -> psutil.Process:
    """The bench child (``edgekv.child.worker ... bench``) once it has used ``busy_s`` of CPU."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for c in parent.children(recursive=True):
            try:
                cmd = c.cmdline()
            except psutil.Error:
                continue
            if cmd and cmd[-1] == "bench" and c.cpu_times().user > busy_s:
                return c
        time.sleep(0.1)
    raise AssertionError("no measuring child appeared")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_like_ctrl_c(tmp_path, sig, code):
    out = tmp_path / "r.jsonl"
    p = _bench(out)
    child = _measuring_child(psutil.Process(p.pid))
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert f"Interrupted ({signal.Signals(sig).name})" in err and "run the same command again to resume" in err
    assert "Traceback" not in err
    child.wait(timeout=10)                       # stopped with its parent's sweep, not left running
    assert not child.is_running()


def test_the_measuring_child_dies_with_its_parent_even_on_sigkill(tmp_path):
    # one long prompt batch fills the cache (-b 4096): tens of seconds in which the child writes nothing to its
    # parent, so nothing but the kernel can tell it that its parent is gone
    p = _bench(tmp_path / "k.jsonl", args=["-c", "4096", "-d", "3968", "-b", "4096", "-ctk", "f16", "-p", "128", "-n",
                                          "32", "-r", "1", "-t", "2"])
    child = _measuring_child(psutil.Process(p.pid), busy_s=4.0)       # past the load, inside the fill
    p.kill()                                     # SIGKILL: no handler of edgekv's runs
    p.wait(timeout=30)
    try:
        child.wait(timeout=10)                   # PR_SET_PDEATHSIG: the kernel kills it
    except psutil.TimeoutExpired:
        child.kill()
        raise AssertionError("the measuring child outlived edgekv by 10 s") from None
    assert not child.is_running()


def test_a_full_disk_is_one_line_and_leaves_no_torn_record(smollm2_path, tmp_path, monkeypatch, capsys):
    from edgekv.cli.main import main

    calls = {"n": 0}
    real = R._write_record

    def write(fd, record, where="results"):
        calls["n"] += 1
        if calls["n"] == 2:                      # the second record: half of it reaches the disk, then ENOSPC
            os.write(fd, b'{"schema_version": 2, "kind": "bench", "torn')
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, record, where)

    monkeypatch.setattr(R, "_write_record", write)
    out = tmp_path / "d.jsonl"
    code = main(["bench", str(smollm2_path), "-c", "512", "-d", "64", "-ctk", "f16,q8_0,q4_0", "-p", "16", "-n", "4",
                 "-r", "1", "-t", "2", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if "no space left on device" in x)
    assert "1 records kept, the 2nd not written" in line and "Traceback" not in err
    assert out.read_bytes().endswith(b"\n")
    assert [r["status"] for r in R.load(out)] == ["ok"]        # strict load: no torn line stays behind


def test_sigterm_during_the_calibration_exits_143_and_leaves_no_child(smollm2_path, tmp_path):
    """Issue 68 point 6: SIGTERM while bench calibrates (before its sweep's own Ctrl-C handler) is SIGTERM's 143,
    not Ctrl-C's 130, and the calibration's child is stopped with it."""
    # nothing cached, and measuring on (the suite runs with EDGEKV_SPEED_CALIBRATE=cached): bench calibrates first
    env = {**os.environ, "EDGEKV_HOME": str(tmp_path / "home"), "EDGEKV_SPEED_CALIBRATE": "auto"}
    p = subprocess.Popen([sys.executable, "-m", "edgekv.cli", "bench", str(smollm2_path), "-c", "1024", "-ctk", "f16",
                          "-p", "64", "-n", "16", "-r", "1", "-t", "2", "-o", str(tmp_path / "r.jsonl")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if "calibrating" in line:
                break
        assert any("calibrating" in x for x in seen), "".join(seen)
        time.sleep(2)
        kids = psutil.Process(p.pid).children(recursive=True)
        p.send_signal(signal.SIGTERM)
        rest = p.stdout.read()
        p.wait(timeout=60)
        assert p.returncode == 143, "".join(seen) + rest
        assert "Traceback" not in rest and "SIGTERM" in rest
        for k in kids:
            try:
                k.wait(timeout=10)
            except psutil.TimeoutExpired:
                raise AssertionError(f"the calibration's child {k.pid} outlived edgekv") from None
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
