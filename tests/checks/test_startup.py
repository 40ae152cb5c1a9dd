"""Start-up: `edgekv --help`, importing the CLI and a cached `predict` stay quick, and load no heavy module.

Measured on a 2-core AVX2 EPYC VM while other work loaded it (load average about 5), with each command's module
imported only when it is dispatched (edgekv.cli.main.command): `import edgekv.cli.main` took 0.09 to 0.10 s (python
-X importtime, cumulative; 0.8 to 0.9 s when it imported every command) and `edgekv --help` 0.36 to 0.63 s of wall
time; a cached `edgekv predict smollm2-135m -c 4096` (its header, runtime baseline and llama.cpp's dry run in a child)
took 3.5 to 3.8 s at load average 2.  The budgets below leave several times that; what `import edgekv.cli.main`
loads is also checked by name (no command's module, no heavy module), which no machine's load can blur."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow       # fresh interpreters in subprocesses

ROOT = Path(__file__).resolve().parents[2]
IMPORT_BUDGET_S = 1.0
HELP_BUDGET_S = 3.0
PREDICT_BUDGET_S = 12.0
# never loaded by `import edgekv.cli.main` (numpy is: gguf, which reads every header, needs it)
NOT_AT_STARTUP = {"llama_cpp", "pandas", "scipy", "matplotlib", "huggingface_hub", "httpx2"}


def import_time_s(code: str, module: str) -> float:
    """Cumulative import time of `module` while a fresh interpreter runs `code` (python -X importtime)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(rf"^import time:\s+\d+ \|\s+(\d+) \| {re.escape(module)}$", r.stderr, re.M)
    assert m, r.stderr[-2000:]
    return int(m[1]) / 1e6


def loaded(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    r = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(r.stdout.split())


def heavy_loaded(code: str) -> set[str]:
    """Which of NOT_AT_STARTUP a fresh interpreter has loaded after running `code`."""
    return NOT_AT_STARTUP & {m.split(".")[0] for m in loaded(code)}


def test_importing_the_cli_is_quick_and_light():
    best = min(import_time_s("import edgekv.cli.main", "edgekv.cli.main") for _ in range(3))
    assert best <= IMPORT_BUDGET_S, f"import edgekv.cli.main: {best:.2f} s, over the {IMPORT_BUDGET_S} s budget"
    mods = loaded("import edgekv.cli.main")
    assert NOT_AT_STARTUP & {m.split(".")[0] for m in mods} == set()
    # the app, its signals and errors: no command's module (each is imported when it is dispatched)
    assert {m for m in mods if m.startswith("edgekv.")} == {"edgekv.cli", "edgekv.cli.main", "edgekv.cli.signals",
                                                           "edgekv.errors", "edgekv.version"}
    # and one command loads its own module, not the others'
    mods = loaded("from edgekv.cli.main import command; command('compare')")
    assert "edgekv.cli.commands.compare" in mods and not {"edgekv.cli.commands.bench", "edgekv.sweep.run"} & mods


def test_help_is_quick():
    walls = []
    for _ in range(3):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "edgekv.cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        walls.append(time.monotonic() - t0)
        assert r.returncode == 0 and "Usage: edgekv" in r.stdout, r.stderr[-2000:]
    assert min(walls) <= HELP_BUDGET_S, f"edgekv --help: {min(walls):.2f} s at best, over {HELP_BUDGET_S} s"


def test_a_cached_predict_is_quick(smollm2_path):
    """`edgekv predict MODEL -c 4096` once what it measures is cached (the first call measures this environment's
    runtime baseline): the header read, the formula, llama.cpp's dry run and the whole-process rows."""
    argv = [sys.executable, "-m", "edgekv.cli", "predict", str(smollm2_path), "-c", "4096"]
    first = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    walls = []
    for _ in range(2):
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
        walls.append(time.monotonic() - t0)
        assert r.returncode == 0 and "4096" in r.stdout, r.stderr[-2000:]
    assert min(walls) <= PREDICT_BUDGET_S, f"cached predict: {min(walls):.2f} s at best, over {PREDICT_BUDGET_S} s"


def test_the_startup_checks_see_a_heavy_import():
    """Both checks can fail: importing llama_cpp at start-up is seen by name, and its time is counted."""
    assert heavy_loaded("import edgekv.cli.main, llama_cpp") == {"llama_cpp"}
    assert import_time_s("import edgekv.cli.main, llama_cpp", "llama_cpp") > 0
