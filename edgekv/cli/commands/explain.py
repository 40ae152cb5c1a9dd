"""``edgekv explain LOG``: the command (listed in :data:`edgekv.cli.main.COMMANDS`).

Reads a llama.cpp log (a file, or ``-`` for stdin) within fixed bounds, explains its memory
(:mod:`edgekv.core.explain`) and prints it (:mod:`edgekv.output.explainview`).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from edgekv.cli.options import make_console, print_json
from edgekv.core.explain import add_engine_compute, explain_lines
from edgekv.core.explaincheck import disagreements
from edgekv.core.explainschema import report
from edgekv.core.logconfig import read_bounded
from edgekv.core.predict import ContextParams
from edgekv.errors import UsageError
from edgekv.output.explainview import render_explain, to_json
from edgekv.prediction.api import load_model
from edgekv.runtime.engine import EngineSession

LOG_ARG = typer.Argument(..., metavar="LOG", show_default=False,
                         help="A llama.cpp log (llama-cli, llama-server, llama-bench -v, llama-cpp-python verbose=True); "
                              "- reads stdin.")


def explain(
    log: str = LOG_ARG,
    model_opt: Optional[str] = typer.Option(None, "-m", "--model", show_default=False,
                                            help="The model the log loaded (path, URL or hf://): its header makes the "
                                                 "prediction the full one."),
    engine: bool = typer.Option(False, "--engine", help="With -m and a CPU log: put the installed llama.cpp's own dry "
                                                         "run of the same context beside the compute buffers."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables (schema: docs/explain.md)."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when any KV or recurrent-state line, any per-device KV "
                                                      "buffer or the model buffers disagree with edgekv's prediction, "
                                                      "or the log is cut short (for CI: catch a llama.cpp upgrade "
                                                      "that changes memory). Without it the exit is 0 whatever the "
                                                      "comparison shows."),
) -> None:
    """What a llama.cpp log's memory is made of, edgekv's prediction of each buffer beside it, and why so much.

    Exit 0 when the log was explained (disagreements are shown, not failed on, unless --check), 1 when it cannot
    be explained or --check found a disagreement, 2 on a usage error."""
    bounded, name = _read(log)
    if engine and not model_opt:
        raise UsageError("--engine needs the model: pass -m MODEL (path, URL or hf://)")
    header_meta = weights = tensors = m = None
    if model_opt:
        m = load_model(model_opt)
        header_meta, weights, tensors = dict(m.header.metadata), m.weights_bytes, list(m.header.tensors)
    result = explain_lines(name, bounded.lines, header_meta, weights, tensors)
    if engine and m is not None:
        _engine_compute(m, result)
    result["read"] = {"bytes": bounded.bytes_read, "lines": bounded.lines_seen, "kept": len(bounded.lines),
                      "long_lines": bounded.long_lines, "binary_lines": bounded.binary_lines,
                      "stopped": bounded.stopped}
    failures = disagreements(report(result))
    result["check"] = {"requested": check, "ok": not failures, "disagreements": failures}
    if as_json:
        print_json(to_json(result))
    else:
        render_explain(make_console(), result)
    if check and failures:
        print(f"explain --check: {len(failures)} disagreement{'s' if len(failures) != 1 else ''} with edgekv's "
              f"prediction: {failures[0]}" + (" (and more, listed above)" if len(failures) > 1 else ""),
              file=sys.stderr)
        raise typer.Exit(1)


def _read(log: str):
    """The log's relevant lines, read within bounds (a file, or - for stdin), and the name to report it by."""
    if log == "-":
        return read_bounded(sys.stdin.buffer), "<stdin>"
    try:
        with open(log, "rb") as f:
            return read_bounded(f), log
    except IsADirectoryError:
        raise UsageError(f"{log}: is a directory; pass a llama.cpp log file (or - for stdin)") from None
    except OSError as e:
        raise UsageError(f"{log}: cannot read it ({e.strerror}); pass a llama.cpp log file (or - for stdin)") from None


def _engine_compute(m, result: dict) -> None:
    """llama.cpp's dry run of the log's context on the CPU backend, beside the compute buffers the log printed."""
    params = result["kv"].get("params")
    if params is None:
        raise UsageError("--engine: the log does not state the context (n_ctx, cache types) to dry-run")
    if any(c["backend"] != "CPU" for c in result["compute"]):
        raise UsageError("--engine runs llama.cpp's CPU backend: it predicts the compute buffers of a CPU log only")
    with EngineSession(m.ref.path, n_gpu_layers=0, header=m.header) as eng:
        (res,) = eng.run([ContextParams(**params)])
    add_engine_compute(result, dict(res.log.compute_buffers))
