"""The ``edgekv`` command: the typer app, its root options and the entry point.

Each command lives in its own module of edgekv/cli/commands/ (a thin adapter from llama.cpp-style flags to edgekv's
functions), listed here by name in :data:`COMMANDS` and imported when it is dispatched.  Every command has ``--json``.
Errors edgekv raises on purpose become one line on stderr and exit 2 (usage) or 1 (failure); ``EDGEKV_DEBUG=1``
shows tracebacks instead.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from typing import TYPE_CHECKING, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from edgekv.cli.signals import handled, interrupted_by, interrupted_code, signalled, signalled_code
from edgekv.errors import EdgekvError, UsageError
from edgekv.version import __version__

if TYPE_CHECKING:
    from typer.core import _click as click  # the click typer's groups are written against (typer vendors it)

# The commands, in the order of `edgekv --help` (README's command table is checked against it): name -> (module of
# edgekv/cli/commands/, its typer function or sub-app, the first paragraph of its help).  A command's module is
# imported when the command is dispatched, so `edgekv --help` and each command load only their own code; the
# summaries are what the help lists without importing them (tests/unit/cli/test_commands.py checks them against the
# commands' own help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": ("inspect", "inspect",
                "Architecture, layers, heads, head dims, SWA/shared/MLA/recurrent layers, weights by type."),
    "predict": ("predict", "predict",
                "Exact KV-cache bytes from the GGUF header, the whole llama.cpp process's peak memory, its speed here."),
    "bench": ("bench", "bench",
              "Measure memory and speed across cache types x contexts, each in a fresh process, beside the prediction."),
    "info": ("calibrate", "info",
             "This machine as llama.cpp sees it: CPU features, extra buffer types, runtime baseline, preflight."),
    "calibrate": ("calibrate", "calibrate",
                  "Measure this machine's speed coefficients for the speed model; predict and bench use them."),
    "report": ("report", "report",
               "Write README.md, results.csv, results.json, PNG plots and a self-contained report.html."),
    "compare": ("compare", "compare",
                "Pair configurations, test every metric, print Markdown; exit 1 on a significant regression."),
    "merge": ("merge", "merge", "Several machines' results into one file: every row kept, each with its machine."),
    "quality": ("quality", "quality",
                "Perplexity and KL divergence of quantized KV caches against the f16 KV cache (same model, same "
                "tokens)."),
    "explain": ("explain", "explain",
                "What a llama.cpp log's memory is made of, edgekv's prediction of each buffer beside it, and why so "
                "much."),
    "models": ("models", "models_app", "The models.toml registry: list, show, pull."),
}


@functools.cache
def command(name: str) -> click.Command:
    """The click command of one of edgekv's COMMANDS, its module imported now (the one lazy import of edgekv's
    commands: tests/checks/test_layers.py)."""
    module, attr, _ = COMMANDS[name]
    obj = getattr(importlib.import_module(f"edgekv.cli.commands.{module}"), attr)
    if isinstance(obj, typer.Typer):            # a group of its own (models)
        cmd = typer.main.get_command(obj)
    else:
        one = typer.Typer(add_completion=False)
        one.command(name=name)(obj)
        cmd = typer.main.get_command(one)
    cmd.name = name
    return cmd


class _Commands(TyperGroup):
    """edgekv's command group: COMMANDS, each loaded when dispatched, then any command registered on the app."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(n for n in super().list_commands(ctx) if n not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing:       # `edgekv --help`: the summary, without importing the command's module
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][2])
        return command(cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="What a GGUF model costs under llama.cpp: predicted, reported by llama.cpp, and measured.",
)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print edgekv's version and exit."),
    fetch_timeout: Optional[float] = typer.Option(
        None, "--fetch-timeout", metavar="SECONDS", show_default=False,
        help="Deadline for reading one remote model's header (HEAD + range requests); default 60, "
             "or $EDGEKV_FETCH_TIMEOUT."),
) -> None:
    if fetch_timeout is not None:
        if not 0 < fetch_timeout <= 86400:
            raise UsageError(f"--fetch-timeout {fetch_timeout:g}: give a number of seconds, more than 0")
        os.environ["EDGEKV_FETCH_TIMEOUT"] = repr(fetch_timeout)
    if version:
        typer.echo(f"edgekv {__version__}")
        raise typer.Exit(0)


# -- entry point --------------------------------------------------------------------------------------

def _misread_short_flag(argv: list[str]) -> str | None:
    """click reads ``-ctx 4096`` as ``-c tx``; say so instead of "'tx' is not a whole number" (issue 19)."""

    for a in argv:
        if a == "--":
            break
        flag = a.split("=", 1)[0]
        if re.fullmatch(r"-c[a-z_]+", flag) and flag not in ("-ctk", "-ctv"):
            return (f"{flag}: no such option; the context size is -c or --ctx-size (e.g. -c 4096), "
                    "the cache types -ctk/-ctv")
    return None


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("EDGEKV_DEBUG", "") not in ("", "0")
    cmd = typer.main.get_command(app)
    bad = _misread_short_flag(list(sys.argv[1:] if argv is None else argv))
    if bad is not None:
        sys.stderr.write(f"edgekv: error: {bad}\n")
        return 2

    try:
        with handled():                 # SIGTERM / SIGHUP: like Ctrl-C (edgekv.cli.signals)
            rc = cmd.main(args=argv, prog_name="edgekv", standalone_mode=False)
        return signalled_code(rc if isinstance(rc, int) else 0)
    except typer.Exit as e:
        return signalled_code(e.exit_code)
    except typer.Abort:
        if signalled():                 # click's form of it: KeyboardInterrupt -> Abort (signalled_code)
            return signalled_code(130)
        sys.stderr.write("edgekv: aborted\n")
        return 130
    except KeyboardInterrupt:
        sys.stderr.write(f"edgekv: interrupted ({interrupted_by()})\n")
        return interrupted_code()
    except typer.TyperException as e:  # click usage errors (bad flag, missing value, ...)
        if debug:
            raise
        code = getattr(e, "exit_code", 2)
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        if not msg.strip():     # no arguments: the help was printed (click's NoArgsIsHelpError)
            return code
        ctx = getattr(e, "ctx", None)
        where = f"'{ctx.command_path} --help'" if ctx is not None else "'edgekv --help'"
        sys.stderr.write(f"edgekv: error: {msg} (see {where})\n")
        return code
    except EdgekvError as e:
        if debug:
            raise
        sys.stderr.write(f"edgekv: error: {e}\n")
        return e.exit_code
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: still one line, with the way to see more
        if debug:
            raise
        sys.stderr.write(f"edgekv: internal error: {type(e).__name__}: {e} (set EDGEKV_DEBUG=1 for the traceback)\n")
        return 1


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
