"""The GitHub workflow cannot run here: keep it valid with two linters from PyPI, and keep its commands real.

    .venv/bin/actionlint .github/workflows/edgekv.yml        # syntax, expressions, shellcheck on run: blocks
    .venv/bin/zizmor --offline .github/workflows/edgekv.yml  # security: pinned actions, injection, permissions
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "edgekv.yml"


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    exe = str(here) if here.exists() else shutil.which(name)
    if exe is None:
        msg = f"{name} is not installed (pip install -e '.[test]' installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


@pytest.mark.slow                   # the linters run in subprocesses
@pytest.mark.parametrize("argv", [["actionlint", "-no-color"], ["zizmor", "--offline", "--no-progress"]])
def test_workflow_lints_clean(argv):
    exe = _tool(argv[0])
    r = subprocess.run([exe, *argv[1:], str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflow_shape():
    wf = yaml.safe_load(WORKFLOW.read_text())
    on = wf.get("on", wf.get(True))          # YAML 1.1 reads the key `on` as True
    assert "push" in on
    sweep = wf["jobs"]["sweep"]
    runners = {m["os"] for m in sweep["strategy"]["matrix"]["include"]}
    assert {"ubuntu-latest", "macos-14"} <= runners
    compare = wf["jobs"]["compare"]
    assert compare["needs"] == "sweep"
    text = WORKFLOW.read_text()
    for words in ("edgekv bench", "edgekv merge", "edgekv compare", "edgekv report", "GITHUB_STEP_SUMMARY",
                  "upload-artifact", "download-artifact", "gh run download", "EDGEKV_MACHINE_ID"):
        assert words in text, words


def test_every_edgekv_command_in_the_workflow_exists(cli):
    """Each `edgekv CMD --flags` line parses with today's CLI (its --help), so the workflow cannot drift."""
    text = WORKFLOW.read_text().replace("$SWEEP_ARGS", re.search(r'SWEEP_ARGS: "([^"]+)"', WORKFLOW.read_text())[1])
    seen = set()
    for m in re.finditer(r"^\s*(?:run: )?(?:[\w-]+=\$\(\s*)?edgekv (\w+)([^\n|>&;]*)", text, re.M):
        cmd, rest = m[1], m[2]
        seen.add(cmd)
        r = cli(cmd, "--help", env={"COLUMNS": "300"})
        assert r.returncode == 0, cmd
        help_text = r.stdout
        for tok in shlex.split(rest.replace("\\", " ")):
            if tok.startswith("-") and not tok.startswith("--title="):
                assert tok in help_text, f"edgekv {cmd}: {tok} is not an option any more"
    assert {"predict", "bench", "report", "merge", "compare"} <= seen
