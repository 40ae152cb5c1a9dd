"""Issue 68 point 6: SIGTERM while a command runs outside its own Ctrl-C handler (bench's calibration, before the
sweep's loop) exits 143, not Ctrl-C's 130.  Real processes and real signals; the command that stands in for the
calibration sleeps (no llama.cpp: the fast tier), the real calibration's case is tests/real/test_signals.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# a command registered on edgekv's own app, which blocks as a calibration does; main() runs it as the CLI does
CHILD = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the disposition edgekv starts from, whatever ours was
signal.signal(signal.SIGINT, signal.default_int_handler)
from edgekv.cli.main import app, main

@app.command(name="sleepy")
def sleepy() -> None:
    print("ready", flush=True)
    time.sleep(60)

sys.exit(main(["sleepy"]))
"""


def _run_and_signal(sig: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        return p.returncode, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)       # the whole group, whatever is left of it
        except ProcessLookupError:
            pass
        p.wait()


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP"),
                                           (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_outside_a_commands_own_handler_exits_128_plus_its_number(sig, code, name):
    rc, err = _run_and_signal(sig)
    assert rc == code, err
    assert "Traceback" not in err
    if sig != signal.SIGINT:
        assert f"interrupted ({name})" in err


def test_signalled_code_leaves_other_statuses_alone(monkeypatch):
    from edgekv.cli import signals

    monkeypatch.setattr(signals, "_received", [signal.SIGTERM])
    assert signals.signalled_code(130) == 143
    assert signals.signalled_code(1) == 1 and signals.signalled_code(0) == 0
    monkeypatch.setattr(signals, "_received", [])
    assert signals.signalled_code(130) == 130          # Ctrl-C stays Ctrl-C
