"""ruff, as configured in pyproject.toml, is part of the suite: code that does not pass it does not land."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "edgekv", "tests", "bench"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_dead_code():
    """vulture finds no unused code in edgekv/ (its uses counted in edgekv, tests and bench); the names it
    cannot see used (typer commands, ctypes struct fields, serialised dataclass fields) are in
    tests/vulture_whitelist.py, each with where it is used."""
    r = subprocess.run([sys.executable, "-m", "vulture", "edgekv", "tests", "bench", "tests/vulture_whitelist.py",
                        "--min-confidence", "60"], cwd=ROOT, capture_output=True, text=True)
    found = [ln for ln in r.stdout.splitlines() if ln.startswith("edgekv/")]
    assert r.returncode in (0, 3) and not r.stderr.strip(), r.stdout + r.stderr
    assert not found, "unused code (remove it, or add it to tests/vulture_whitelist.py saying where it is used):\n" + \
        "\n".join(found)
