"""README.md's command list (its "## Commands" table) and `edgekv --help` name the same commands, in the same
order, and each listed command's --help runs; README's two commands at the top are the install-and-bench line and
the test line, which .ci/run runs in two stages (the fast tier first, then the slow one) that together are exactly it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from edgekv.cli.main import app, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH_LINE = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/edgekv bench"
TEST_LINE = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -q"
# .ci/run's stages: README's pytest command with one marker expression each; "not slow" then "slow" are complements,
# so their union is every test README's line runs, and the fast tier stops at its first failure.
STAGES = ('-m "not slow" -x', "-m slow")


def ci_problem(test_line: str, ci_text: str) -> str | None:
    """Why .ci/run's text does not run exactly `test_line` (None when it does): errexit on (a failed stage, or
    pytest's exit 5 for nothing collected, fails the run), then the line's install, then its pytest command once per
    stage in STAGES' order, as the script's last lines."""
    install, sep, pytest_cmd = test_line.rpartition(" && ")
    assert sep and "pytest" in pytest_cmd, test_line
    lines = [x.strip() for x in ci_text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    if "set -euo pipefail" not in lines:
        return "no `set -euo pipefail`: a failed stage or pytest's exit 5 would pass"
    want = [install, *(f"{pytest_cmd} {stage}" for stage in STAGES)]
    if lines[-len(want):] != want:
        return f"the last lines are {lines[-len(want):]}, not {want}"
    return None


def test_the_two_commands_open_the_readme_and_ci_runs_the_second():
    text = README.read_text()
    first = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S)
    assert first, f"{README}: no bash block"
    assert first.group(1).splitlines() == [BENCH_LINE, TEST_LINE]
    assert text.index(first.group(0)) < text.index("\n## "), "the two commands come before the first section"
    assert ci_problem(TEST_LINE, (ROOT / ".ci" / "run").read_text()) is None


@pytest.mark.parametrize("change", [
    lambda t: t.replace('-m "not slow" -x', '-m "not slow and not gpu" -x'),   # a tier nobody runs
    lambda t: t.replace("\n.venv/bin/python -m pytest -q -m slow", ""),          # the slow stage dropped
    lambda t: t.replace(" -x\n", "\n"),                                           # the fast tier does not stop
    lambda t: t.replace("set -euo pipefail", "set -uo pipefail"),                # a failed stage passes
    lambda t: t.replace("pip install -q -e '.[test]'\n", "pip install -q -e .\n"),  # not README's install
], ids=["other-marker", "no-slow-stage", "no-x", "no-errexit", "other-install"])
def test_the_ci_check_fails_on_a_run_script_that_differs(change):
    text = (ROOT / ".ci" / "run").read_text()
    changed = change(text)
    assert changed != text
    assert ci_problem(TEST_LINE, changed) is not None


def readme_commands() -> dict[str, list[str]]:
    """{command: [subcommands]} from the first column of the table under '## Commands'."""
    text = README.read_text()
    m = re.search(r"^## Commands\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, f"{README}: no '## Commands' section"
    out: dict[str, list[str]] = {}
    for row in re.findall(r"^\| `edgekv ([^`]+)` \|", m.group(1), re.M):
        name, _, rest = row.partition(" ")
        sub = rest.split()[0].replace("\\|", "|").split("|") if name == "models" else []
        out[name] = sub
    return out


def help_commands(argv: list[str], capsys) -> list[str]:
    """The commands `edgekv [argv] --help` prints, in its order (names from click, checked in the printed text)."""
    assert main([*argv, "--help"]) == 0
    printed = capsys.readouterr().out
    group = typer.main.get_command(app)
    ctx = group.make_context("edgekv", ["--help"], resilient_parsing=True)
    for part in argv:
        group = group.get_command(ctx, part)
    names = [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]
    for n in names:
        assert re.search(rf"^\W*{n}\s", printed, re.M), f"{n} not in the help text:\n{printed}"
    return names


def test_readme_lists_exactly_the_commands_of_edgekv_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    listed = readme_commands()
    assert list(listed) == help_commands([], capsys)
    assert listed["models"] == help_commands(["models"], capsys)


@pytest.mark.parametrize("argv", [[c] for c in readme_commands()]
                         + [["models", s] for s in readme_commands().get("models", [])], ids=" ".join)
def test_each_listed_command_has_help(argv, capsys):
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: edgekv {' '.join(argv)} " in out
