"""README.md's command list (its "## Commands" table) and `edgekv --help` name the same commands, in the same
order, and each listed command's --help runs; README's two commands at the top are the install-and-bench line and
exactly the test line, which .ci/run runs in two stages (the fast tier first, then the slow one) that together are
exactly it.  Every command README.md, docs/ and bench/README.md show in a code block parses with its program's own
parser (edgekv's click commands, the harnesses' and tools' argparse), in-process; the slow tier runs each harness's
--help as shown and the cheap commands for real."""

from __future__ import annotations

import inspect
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

try:                                    # typer 0.29+ carries its own click
    from typer._click import exceptions as click_errors
except ImportError:                     # pragma: no cover - older typer on click
    from click import exceptions as click_errors

from edgekv.cli.main import app, main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCH_LINE = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/edgekv bench"
TEST_LINE = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -q"
# .ci/run's stages: README's pytest command with one marker expression each; "not slow" then "slow" are complements,
# so their union is every test README's line runs, and the fast tier stops at its first failure, on two workers
# (pytest-xdist: its tests run no llama.cpp, so they may share the cores); each prints what took its time
# (docs/development.md, Test tiers).
STAGES = ('-m "not slow" -x -n 2 --durations=15', "-m slow --durations=30")


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
    lambda t: t.replace("\n.venv/bin/python -m pytest -q -m slow --durations=30", ""),  # the slow stage dropped
    lambda t: t.replace(" -x ", " "),                                             # the fast tier does not stop
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


# -- every command README.md, docs/ and bench/README.md show --------------------------------------------------------

DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SEPARATORS = {"&&", "||", "|", ";"}
_OURS = ("bench.", "tools.", "edgekv.cli")


def _harnesses() -> list[str]:
    skip = {"__init__", "harness"}
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in skip)


def _lines(lang: str, body: str) -> list[str]:
    """The command lines of one code block: a console block's ``$ `` lines, every line of a shell block."""
    body = body.replace("\\\n", " ")
    if lang == "console":
        return [x[2:] for x in body.splitlines() if x.startswith("$ ")]
    if lang in ("bash", "sh", "shell", ""):
        return [x for x in body.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    return []


def _commands(line: str) -> list[list[str]]:
    """The edgekv / python -m bench|tools commands on one shell line (comments, pipes and && split off; a leading
    VAR=value dropped; ``.venv/bin/`` stripped; ``<harness>`` expanded to every harness)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, cur = [], []
    for w in [*words, ";"]:
        if w in _SEPARATORS:
            while cur and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", cur[0]):
                cur.pop(0)
            if cur:
                cur[0] = cur[0].removeprefix(".venv/bin/")
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    keep = []
    for c in out:
        if c[0] == "edgekv" or (c[0] in ("python", "python3") and len(c) > 1 and
                                (c[1] == "-m" and c[2].startswith(_OURS) or c[1].startswith(("bench/", "tools/")))):
            if any("<harness>" in w for w in c):
                keep += [[w.replace("<harness>", h) for w in c] for h in _harnesses()]
            else:
                keep.append(c)
    return keep


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) for every command the pages show in a code block."""
    out = []
    for page in DOC_PAGES:
        for lang, body in _FENCE.findall(page.read_text(encoding="utf-8")):
            for line in _lines(lang, body):
                out += [(page.relative_to(ROOT).as_posix(), c) for c in _commands(line)]
    return out


class _Parsed(Exception):
    pass


def parse_python_module(module: str, args: list[str], monkeypatch) -> None:
    """Parse ``python -m MODULE ARGS`` with the module's own argparse parser, in-process, without running it: an
    unknown flag or a bad value exits 2 with argparse's message (raised here as SystemExit(2))."""
    import argparse
    import importlib

    real = argparse.ArgumentParser.parse_args

    def parse_only(self, argv=None, namespace=None):
        real(self, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.setattr(sys, "argv", [module, *args])
    mod = importlib.import_module(module)
    with pytest.raises((_Parsed, SystemExit)) as e:
        mod.main(args) if "argv" in inspect.signature(mod.main).parameters else mod.main()
    if e.type is SystemExit:
        assert e.value.code in (0, None), f"python -m {module} {' '.join(args)}: exit {e.value.code}"


def parse_edgekv(args: list[str]) -> None:
    """Parse ``edgekv ARGS`` with click, without running the command: the command, every flag and every value of a
    fixed set must be what edgekv takes (a placeholder such as MODEL or FILE is accepted as any argument is)."""
    cmd = typer.main.get_command(app)
    name, rest = "edgekv", list(args)
    while True:
        try:
            ctx = cmd.make_context(name, rest)
        except typer.Exit as e:                 # --help, --version: printed, exit 0
            assert e.exit_code == 0
            return
        if not hasattr(cmd, "resolve_command"):     # a command, not a group
            return
        protected = vars(ctx).get("_protected_args") or vars(ctx).get("protected_args") or []   # click 8.1 / 8.2+
        rest = [*protected, *ctx.args]
        if not rest:
            return
        name, cmd, rest = cmd.resolve_command(ctx, rest)
        assert cmd is not None, f"edgekv {' '.join(args)}: no command {name}"


SHOWN = shown_commands()


def test_the_pages_show_commands_of_every_kind():
    kinds = {("edgekv" if c[0] == "edgekv" else c[2].split(".")[0] if c[1] == "-m" else "path") for _, c in SHOWN}
    assert {"edgekv", "bench", "tools"} <= kinds, kinds
    assert any(c[:3] == ["python", "-m", "bench.refresh"] for _, c in SHOWN)


def test_a_command_that_cannot_run_fails_here(monkeypatch):
    """The checks below can fail: development.md's old form (a harness run by its path), an unknown flag, an unknown
    edgekv command."""
    with pytest.raises(AssertionError, match="run them as modules"):
        _check_form(["python", "bench/speed_model.py", "--help"])
    with pytest.raises(AssertionError, match="--depthz 512: exit 2"):
        parse_python_module("bench.speed_model", ["--depthz", "512"], monkeypatch)
    with pytest.raises(click_errors.UsageError, match="No such option: --no-such-flag"):
        parse_edgekv(["bench", "--no-such-flag"])
    with pytest.raises(click_errors.UsageError, match="No such command"):
        parse_edgekv(["benhc", "MODEL"])
    with pytest.raises(click_errors.UsageError, match="No such command"):
        parse_edgekv(["models", "pul", "qwen3-8b"])


def _check_form(c: list[str]) -> None:
    assert c[1] == "-m" or not c[1].startswith("bench/"), (
        f"{' '.join(c)}: a harness run by its path cannot import bench (ModuleNotFoundError): run them as modules, "
        "python -m bench.NAME")


@pytest.mark.parametrize("page,argv", SHOWN, ids=[f"{p}: {' '.join(c)}"[:120] for p, c in SHOWN])
def test_each_shown_command_parses(page, argv, monkeypatch, capsys):
    """Every command a page shows is one its program takes: edgekv's parsed by click, a harness's or a tool's by its
    own argparse parser (in-process; nothing measured)."""
    if argv[0] == "edgekv":
        parse_edgekv(argv[1:])
        return
    _check_form(argv)
    if argv[1:3] == ["-m", "edgekv.cli"]:
        parse_edgekv(argv[3:])
    elif argv[1] == "-m":
        parse_python_module(argv[2], argv[3:], monkeypatch)
    else:
        assert (ROOT / argv[1]).is_file(), f"{page}: {argv[1]} does not exist"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")     # runpy, a module imported before
@pytest.mark.parametrize("fresh", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in-process", "subprocess"])
@pytest.mark.parametrize("module", [f"bench.{h}" for h in _harnesses()] + ["tools.render_tables"])
def test_each_harness_help_runs_as_shown(module, fresh, monkeypatch, capsys):
    """``python -m bench.NAME --help`` from the repository root, as docs/development.md shows it: run as ``__main__``
    in this process, and in a fresh interpreter (a subprocess, slow)."""
    if fresh:
        p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]
        return
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    out = capsys.readouterr()
    assert e.value.code in (0, None) and "usage:" in out.out, out.err[-2000:]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")     # runpy, a module imported before
@pytest.mark.parametrize("fresh", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in-process", "subprocess"])
def test_the_short_commands_run_for_real(fresh, monkeypatch, capsys):
    """The cheap ones run as shown: the refresh plan and the tables' check, as ``__main__`` in this process, and in a
    fresh interpreter (a subprocess, slow)."""
    from tools.render_tables import history

    for args in (["bench.refresh", "--list"], *([["tools.render_tables", "--check"]] if history() else [])):
        if fresh:
            p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, (args, p.stdout[-1000:], p.stderr[-2000:])
            continue
        with monkeypatch.context() as m:
            m.chdir(ROOT)
            m.setattr(sys, "argv", list(args))
            try:
                runpy.run_module(args[0], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                code = e.code
        out = capsys.readouterr()
        assert code in (0, None), (args, out.out[-1000:], out.err[-2000:])
