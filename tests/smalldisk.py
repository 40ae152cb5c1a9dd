"""A real small disk for a test: a tmpfs mounted over a folder in a mount namespace of the child's own (``unshare -m``:
the mount goes with the process and no one else sees it), so that writing there fills it for real (ENOSPC)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def run_on_small_disk(folder: Path, size: str, code: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -c code folder *args`` with a tmpfs of ``size`` ("1m", "200m") mounted over ``folder``; the test
    is skipped where no namespace or mount can be made (no unshare, not permitted)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux) to mount a small filesystem in a namespace of its own")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {folder}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {probe.stderr.strip()[:120]}")
    return subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs {folder} && exec "$@"',
                           "sh", sys.executable, "-c", code, str(folder), *args],
                          capture_output=True, text=True, timeout=timeout)
