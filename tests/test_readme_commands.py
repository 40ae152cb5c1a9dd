"""README.md's command list (its "## Commands" table) and `edgekv --help` name the same commands, in the same
order, and each listed command's --help runs; README's two commands at the top are the install-and-bench line and
exactly the test line .ci/run runs."""

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


def test_the_two_commands_open_the_readme_and_ci_runs_the_second():
    text = README.read_text()
    first = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S)
    assert first, f"{README}: no bash block"
    assert first.group(1).splitlines() == [BENCH_LINE, TEST_LINE]
    assert text.index(first.group(0)) < text.index("\n## "), "the two commands come before the first section"
    ci = [x for x in (ROOT / ".ci" / "run").read_text().splitlines() if x.strip()]
    assert ci[-1] == TEST_LINE


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
