"""Declared dependencies equal imported ones: deptry (configured under [tool.deptry] in pyproject.toml) reads
edgekv/'s imports and pyproject's [project] dependencies; an undeclared import, a declared package nothing
imports, or a test-only package imported by edgekv fails here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Declared and not imported yet, on purpose. pandas is for `edgekv.results_frame` (issue 17 point 4, the records
# branch): once results_frame imports it, this test fails and the set must become empty.
NOT_YET_IMPORTED: set[str] = set()


def _exe() -> str:
    exe = Path(sys.executable).with_name("deptry")
    found = str(exe) if exe.exists() else shutil.which("deptry")
    if found is None:
        pytest.fail("deptry is not installed: pip install -e '.[test]'", pytrace=False)
    return found


def _deptry(tmp_path: Path) -> list[dict]:
    out = tmp_path / "deptry.json"
    r = subprocess.run([_exe(), ".", "--json-output", str(out), "--no-ansi"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert out.exists(), r.stdout + r.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_declared_dependencies_equal_imported_ones(tmp_path):
    issues = _deptry(tmp_path)
    unused = {i["module"] for i in issues if i["error"]["code"] == "DEP002"}
    other = [f"{i['location']['file']}:{i['location']['line']}: {i['error']['code']} {i['error']['message']}"
             for i in issues if i["error"]["code"] != "DEP002" or i["module"] not in NOT_YET_IMPORTED]
    assert not other, "\n".join(other)
    assert unused == NOT_YET_IMPORTED, (f"now imported: {sorted(NOT_YET_IMPORTED - unused)}; remove them from "
                                        "NOT_YET_IMPORTED in tests/checks/test_dependencies.py")


@pytest.mark.slow
def test_deptry_sees_an_undeclared_import(tmp_path):
    """The check itself can fail: a copy of the package with one undeclared import is refused."""
    pkg = tmp_path / "proj"
    shutil.copytree(ROOT / "edgekv", pkg / "edgekv", ignore=shutil.ignore_patterns("__pycache__", "models.toml"))
    shutil.copy(ROOT / "pyproject.toml", pkg / "pyproject.toml")
    (pkg / "edgekv" / "extra.py").write_text("import yaml  # installed (huggingface-hub needs it), not declared\n")
    r = subprocess.run([_exe(), ".", "--no-ansi"], cwd=pkg, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "edgekv/extra.py:1:8: DEP003 'yaml' imported but it is a transitive dependency" in r.stdout + r.stderr
