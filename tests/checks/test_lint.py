"""ruff, as configured in pyproject.toml, is part of the suite: code that does not pass it does not land."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "edgekv", "tests", "bench", "tools"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_no_dead_code(tmp_path):
    """vulture finds no unused code in edgekv/ (its uses counted in edgekv, tests, bench and tools); the names it
    cannot see used (typer commands, ctypes struct fields, serialised dataclass fields) are in
    tests/vulture_whitelist.py, each with where it is used."""
    # the results schema's fields are read by name (JSON, results_frame, JSON Schema): whitelist them from the types
    import msgspec

    from edgekv.core import explainschema as E
    from edgekv.records import schema as S

    # (every block in its namespace, the core's embedded ones included), and explain --json's report
    # (edgekv/core/explainschema.py), read by name the same way
    types = [t for mod in (S, E) for t in vars(mod).values() if isinstance(t, type) and issubclass(t, msgspec.Struct)
             and (mod is S or t.__module__.startswith("edgekv.core.explainschema"))]
    fields = sorted({f.name for t in types for f in msgspec.structs.fields(t)})
    generated = tmp_path / "schema_fields_whitelist.py"
    generated.write_text("".join(f"_.{n}  # edgekv/records/schema.py field\n" for n in fields))
    # not bench/.build (ignored by git: a checkout's build outputs and, in older checkouts, a vendored llama.cpp whose
    # uses would hide edgekv's unused names)
    r = subprocess.run([sys.executable, "-m", "vulture", "edgekv", "tests", "bench", "tools", "tests/vulture_whitelist.py",
                        str(generated), "--min-confidence", "60", "--exclude", "bench/.build"], cwd=ROOT,
                       capture_output=True, text=True)
    found = [ln for ln in r.stdout.splitlines() if ln.startswith("edgekv/")]
    assert r.returncode in (0, 3) and not r.stderr.strip(), r.stdout + r.stderr
    assert not found, "unused code (remove it, or add it to tests/vulture_whitelist.py saying where it is used):\n" + \
        "\n".join(found)


def test_tracked_links_stay_inside_the_repository():
    """A symlink committed by mistake (a worktree's `bench/.build -> /elsewhere`) would replace a checkout's build
    folder; every tracked link must be relative and resolve inside the repository."""
    import os
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in out.splitlines() if line.startswith("120000 ")]
    bad = []
    for rel in links:
        target = os.readlink(ROOT / rel)
        inside = (ROOT / rel).parent.joinpath(target).resolve().is_relative_to(ROOT)
        if os.path.isabs(target) or not inside:
            bad.append(f"{rel} -> {target}")
    assert not bad, "tracked symlinks pointing outside the repository (git rm --cached them):\n" + "\n".join(bad)
