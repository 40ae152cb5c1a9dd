"""Every repository path edgekv/ names exists, and no message or comment points outside the repository.

Read from the source, like tests/checks/test_limits.py.  A path counts when it starts with one of the repository's own
folders (docs/, bench/, tests/, tools/, reports/, .ci/).  llama.cpp's source files (``tools/server/server-http.cpp``,
cited from the vendored tree) are llama.cpp's paths, not this repository's, and are left out by their suffix.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekv"
TEXT_SUFFIXES = {".py", ".json", ".toml"}

REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|bench|tests|tools|reports|\.ci)/[\w.*/-]*)")
LLAMA_CPP_SOURCES = (".cpp", ".h", ".c", ".cu", ".m", ".metal")
# a relative path that climbs out of the repository, or a machine's own folder
OUTSIDE = re.compile(r"(?<![\w.])\.\./|(?<![\w./-])/work/|\bshared/(?:reference|design)/")


def _clean(path: str) -> str:
    return re.sub(r"(?:/?\.\.\.|\.)+$", "", path).rstrip("/")


def problems(text: str, where: str, root: Path = ROOT) -> list[str]:
    """One line per missing repository path or pointer outside the repository in ``text``."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in REPO_PATH.finditer(line):
            path = _clean(m[1])
            if path.endswith(LLAMA_CPP_SOURCES) or not path:
                continue
            if not (any(root.glob(path)) if "*" in path else (root / path).exists()):
                out.append(f"{where}:{i}: {path} does not exist in the repository")
        if m := OUTSIDE.search(line):
            target = re.match(r"[^\s)'\"`]+", line[m.start():])
            out.append(f"{where}:{i}: points outside the repository ({target[0] if target else m[0]})")
    return out


def test_every_named_path_exists_and_none_points_outside():
    found = []
    for p in sorted(PKG.rglob("*")):
        if p.suffix in TEXT_SUFFIXES and p.is_file() and not p.is_symlink():
            found += problems(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_path_check_can_fail():
    text = ("see docs/nowhere.md and tests/checks/test_paths.py.\n"
            "(about 2x on the machines in ../shared/reference/amx.md)\n"
            "llama.cpp's tools/server/server-http.cpp:152, the cache's .../snapshots/<commit>/, docs/*.md\n")
    assert problems(text, "x.py") == [
        "x.py:1: docs/nowhere.md does not exist in the repository",
        "x.py:2: points outside the repository (../shared/reference/amx.md)",
    ]
