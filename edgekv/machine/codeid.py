"""The code identity a record carries: the edgekv commit that produced it and whether the tree had local changes
(like llama-bench's ``build_commit`` and pytest-benchmark's commit info).

Read from the git checkout edgekv runs from; an installed wheel has no checkout, so its identity is the
``EDGEKV_COMMIT`` environment variable when a packager sets one, else unknown (None), never a guess.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

COMMIT_ENV = "EDGEKV_COMMIT"
_HEX = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class CodeIdentity:
    commit: str | None      # the full commit id, or None when unknown
    dirty: bool | None      # tracked files under edgekv/ differ from that commit; None when unknown

    @property
    def short(self) -> str:
        """``3f32cba`` / ``3f32cba-dirty`` / ``unknown``: how reports and compare print it."""
        if not self.commit:
            return "unknown"
        return self.commit[:7] + ("-dirty" if self.dirty else "")


def _git(root: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5,
                           env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_identity() -> CodeIdentity:
    """This process's edgekv code identity (read once)."""
    env = os.environ.get(COMMIT_ENV, "").strip().lower()
    if env:
        return CodeIdentity(env if _HEX.fullmatch(env) else None, None)
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return CodeIdentity(None, None)
    head = _git(root, "rev-parse", "HEAD")
    if not head or not _HEX.fullmatch(head):
        return CodeIdentity(None, None)
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "edgekv")
    return CodeIdentity(head, None if status is None else bool(status))
