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
