"""The ``edgekv`` command: the typer app, its root options and the entry point.

Each command lives in its own module of edgekv/cli/commands/ (a thin adapter from llama.cpp-style flags to edgekv's
functions) and is registered here by name, in the order ``edgekv --help`` lists them.  Every command has ``--json``.
Errors edgekv raises on purpose become one line on stderr and exit 2 (usage) or 1 (failure); ``EDGEKV_DEBUG=1``
shows tracebacks instead.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

import typer

from edgekv.cli.commands.bench import bench
from edgekv.cli.commands.calibrate import calibrate, info
from edgekv.cli.commands.compare import compare
from edgekv.cli.commands.explain import explain
from edgekv.cli.commands.inspect import inspect
from edgekv.cli.commands.merge import merge
from edgekv.cli.commands.models import models_app
from edgekv.cli.commands.predict import predict
from edgekv.cli.commands.quality import quality
from edgekv.cli.commands.report import report
from edgekv.cli.signals import handled, interrupted_by, interrupted_code, signalled, signalled_code
from edgekv.errors import EdgekvError, UsageError
from edgekv.version import __version__

app = typer.Typer(
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


# the commands, in the order of `edgekv --help` (README's command table is checked against it)
app.command(name="inspect")(inspect)
app.command(name="predict")(predict)
app.command(name="bench")(bench)
app.command(name="info")(info)
app.command(name="calibrate")(calibrate)
app.command(name="report")(report)
app.command(name="compare")(compare)
app.command(name="merge")(merge)
app.add_typer(models_app, name="models")
app.command(name="quality")(quality)
app.command(name="explain")(explain)


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
