"""The suite never writes into the developer's EDGEKV_HOME: every test has its own (tests/conftest.py).

Proved on a nested pytest run: a test that writes through edgekv (in process and in a child process) runs with
EDGEKV_HOME pointing at a stand-in for the developer's home; with this suite's conftest the stand-in stays
empty, without it the same test writes there (so the check can fail).  Besides, the suite runs with its own HOME
(so edgekv's default home ~/.cache/edgekv is the session's, whatever else on the machine uses the developer's), and
conftest's session guard fails the run if anything was written into that default home; a nested run shows it does.
And a failed test leaves nothing running, and a child hears the SIGINT its test sends, even under a shell that
started pytest with SIGINT ignored (a background job); without the conftest, the same nested run shows both fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow      # each test runs an inner pytest session in a subprocess

ROOT = Path(__file__).resolve().parents[2]

INNER = '''
import os, subprocess, sys
from edgekv.sources.resolve import edgekv_home, verified_sha256

def test_writes_state():
    (edgekv_home() / "runs").mkdir(parents=True, exist_ok=True)
    (edgekv_home() / "runs" / "x.jsonl").write_text("{}\\n")
    verified_sha256(__file__)                       # a sha256 stamp under the home
    subprocess.run([sys.executable, "-c", "from edgekv.sources.resolve import edgekv_home; "
                    "edgekv_home().mkdir(parents=True, exist_ok=True); (edgekv_home() / 'child').write_text('1')"],
                   check=True)
'''


# a test that drops its own home and writes through edgekv's default (~/.cache/edgekv): the session guard in conftest
# fails the run, and the write lands in the suite's HOME, not the developer's
INNER_BAD = '''
from edgekv.sources.resolve import edgekv_home

def test_writes_into_the_default_home(monkeypatch):
    monkeypatch.delenv("EDGEKV_HOME")
    edgekv_home().mkdir(parents=True, exist_ok=True)
    (edgekv_home() / "oops").write_text("x")
'''

# the suite's HOME is its own: ~ is not the developer's
INNER_HOME = '''
import os
from pathlib import Path

def test_home_is_the_suites():
    assert Path.home() != Path(os.environ["REAL_HOME_FOR_TEST"])
    assert "edgekv-test-session-" in str(Path.home())
'''


# the developer's own settings (a traceback instead of one-line errors, another hub) never reach a test
INNER_ENV = '''
import os

def test_sees_no_developer_settings():
    leaked = sorted(k for k in os.environ if k in ("EDGEKV_DEBUG", "EDGEKV_SPEED_CALIBRATE_X", "HF_TOKEN", "HF_ENDPOINT"))
    assert leaked == [], leaked
'''


def _inner_run(tmp_path: Path, with_conftest: bool, inner: str = INNER,
               extra_env: dict[str, str] | None = None, preexec_fn=None) -> tuple[Path, subprocess.CompletedProcess]:
    dev_home = tmp_path / f"developer-home-{with_conftest}"
    dev_home.mkdir()
    d = tmp_path / f"inner-{with_conftest}"
    d.mkdir()
    (d / "test_inner.py").write_text(inner)
    env = {**os.environ, "EDGEKV_HOME": str(dev_home), "STAND_IN_HOME": str(dev_home),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), **(extra_env or {})}
    plugin = ["-p", "tests.conftest"] if with_conftest else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "--rootdir", str(d),
                        "-c", os.devnull, str(d / "test_inner.py")], cwd=d, env=env, capture_output=True, text=True,
                       timeout=300, **({"preexec_fn": preexec_fn} if preexec_fn else {}))
    return dev_home, r


def test_the_suite_leaves_the_developers_home_alone(tmp_path):
    dev_home, r = _inner_run(tmp_path, with_conftest=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in dev_home.rglob("*")) == []


def test_without_the_fixture_the_inner_test_does_write_there(tmp_path):
    dev_home, r = _inner_run(tmp_path, with_conftest=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"runs", "x.jsonl", "child", "sha256"} <= {p.name for p in dev_home.rglob("*")}


@pytest.mark.parametrize("with_conftest", [True, False])
def test_the_developers_settings_are_scrubbed(tmp_path, with_conftest):
    dev = {"EDGEKV_DEBUG": "1", "EDGEKV_SPEED_CALIBRATE_X": "1", "HF_TOKEN": "hf_x", "HF_ENDPOINT": "http://127.0.0.1:9"}
    _home, r = _inner_run(tmp_path, with_conftest, INNER_ENV, dev)
    assert r.returncode == (0 if with_conftest else 1), r.stdout + r.stderr


def test_a_write_into_the_default_home_fails_the_run(tmp_path):
    real_home = tmp_path / "real-home"
    real_home.mkdir()
    dev_home, r = _inner_run(tmp_path, with_conftest=True, inner=INNER_BAD, extra_env={"HOME": str(real_home)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout
    assert "edgekv: a test wrote into edgekv's default home ~/.cache/edgekv (no EDGEKV_HOME of its own): oops" in r.stdout
    assert list(real_home.rglob("*")) == [] and list(dev_home.rglob("*")) == []    # neither of the developer's homes


@pytest.mark.parametrize("with_conftest", [True, False])
def test_the_suite_has_its_own_home(tmp_path, with_conftest):
    _home, r = _inner_run(tmp_path, with_conftest, INNER_HOME, {"REAL_HOME_FOR_TEST": str(Path.home())})
    assert r.returncode == (0 if with_conftest else 1), r.stdout + r.stderr


def test_each_test_has_its_own_home(edgekv_home):
    import conftest

    from edgekv.sources.resolve import edgekv_home as home_now

    assert home_now() == edgekv_home
    assert conftest.DEVELOPER_HOME is None or Path(conftest.DEVELOPER_HOME).resolve() not in [edgekv_home.resolve(),
                                                                                            *edgekv_home.resolve().parents]
    assert [p.name for p in edgekv_home.iterdir() if not p.is_symlink()] == []


@pytest.mark.parametrize("n", [1, 2])
def test_state_does_not_leak_between_tests(n):
    from edgekv.sources.resolve import edgekv_home

    marker = edgekv_home() / "runs" / "leak"
    assert not marker.exists()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(n))


# run with SIGINT ignored, as a background job of a non-interactive shell starts it: one test fails while its child
# and that child's own-session grandchild (as edgekv starts llama-server) run; the other interrupts its child
INNER_PROCS = '''
import os, signal, subprocess, sys
from pathlib import Path

TREE = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
        "start_new_session=True); print(g.pid, flush=True); time.sleep(120)")

def test_fails_with_its_processes_running():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    Path(os.environ["PIDS_FILE"]).write_text(f"{p.pid} {p.stdout.readline()}")
    assert False, "failed with a child and a grandchild running"

def test_ctrl_c_reaches_the_child():
    p = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(30)"],
                         stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=15) != 0
'''


@pytest.mark.parametrize("with_conftest", [True, False])
def test_a_failed_test_leaves_nothing_running_and_its_child_hears_sigint(tmp_path, with_conftest):
    pids_file = tmp_path / f"pids-{with_conftest}"
    _home, r = _inner_run(tmp_path, with_conftest, INNER_PROCS, {"PIDS_FILE": str(pids_file)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    out = r.stdout + r.stderr
    procs = [psutil.Process(int(x)) for x in pids_file.read_text().split() if psutil.pid_exists(int(x))]
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:             # what the nested run left behind, without the conftest
        p.kill()
    if with_conftest:
        assert "1 failed, 1 passed" in out, out
        assert alive == [], [p.cmdline() for p in alive]
    else:
        assert "2 failed" in out, out
        assert len(alive) == 2, out
