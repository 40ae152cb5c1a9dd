"""``edgekv predict``: exact KV bytes, the process's peak memory and its speed, predicted (listed in
:data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional

import typer

from edgekv.cli.flags import (
    B_OPT,
    BUDGET_OPT,
    CAL_TIMEOUT_OPT,
    CTK_OPT,
    CTV_OPT,
    CTX_OPT,
    DEVICE_MEMORY_OPT,
    DEVICE_OPT,
    KV_ONLY_OPT,
    MIN_TG_OPT,
    MODEL_ARG,
    MODEL_OPT,
    N_RS_SEQ_OPT,
    NGL_OPT,
    NP_OPT,
    PREDICT_DEPTH_OPT,
    PREDICT_LLAMA_BENCH_OPT,
    PREDICT_NO_MMAP_OPT,
    SPEED_OPT,
    SWA_FULL_OPT,
    UB_OPT,
    UNIFIED_OPT,
    WORKLOAD_OPT,
    AsJson,
    FlashAttn,
    OneRepack,
    Threads,
    device_flags,
    llama_bench_path,
    one_repack,
)
from edgekv.cli.options import (
    make_console,
    model_notes,
    pair_types,
    parse_flash_attn,
    parse_int_list,
    parse_size,
    parse_type_list,
    pick_model,
    print_json,
)
from edgekv.core.fit import size
from edgekv.core.memmodel import WORKLOADS
from edgekv.core.predict import ContextParams
from edgekv.errors import UsageError
from edgekv.machine.memory import available_memory
from edgekv.output.views import render_budget, render_predict
from edgekv.prediction.api import load_model, registry_sweep_defaults
from edgekv.prediction.rows import PredictRequest, run_predict
from edgekv.prediction.wholeprocess import ProcessSettings
from edgekv.sweep.plan import model_contexts


def predict(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    ctx_size: str = CTX_OPT,
    cache_type_k: str = CTK_OPT,
    cache_type_v: Optional[str] = CTV_OPT,
    flash_attn: FlashAttn = "auto",
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
    threads: Threads = 0,
    no_mmap: bool = PREDICT_NO_MMAP_OPT,
    kv_only: bool = KV_ONLY_OPT,
    repack: OneRepack = None,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the llama.cpp command each row assumes."),
    min_tg: Optional[float] = MIN_TG_OPT,
    depth: Optional[int] = PREDICT_DEPTH_OPT,
    llama_bench: Optional[str] = PREDICT_LLAMA_BENCH_OPT,
    speed: bool = SPEED_OPT,
    calibration_timeout: float = CAL_TIMEOUT_OPT,
    device: Optional[str] = DEVICE_OPT,
    device_memory: Optional[str] = DEVICE_MEMORY_OPT,
    as_json: AsJson = False,
) -> None:
    """Exact KV-cache bytes from the GGUF header, the whole llama.cpp process's peak memory, its speed here."""
    speed_flags, lb = _speed_flags(depth, min_tg, budget, kv_only, calibration_timeout), llama_bench_path(llama_bench)
    spec_name = pick_model(model, model_opt)
    _check_process_flags(workload, threads)
    # every flag is read before the model is: a bad one costs no download and stays one line
    given = parse_int_list(ctx_size, "-c/--ctx-size") if ctx_size else None
    flags = _read_flags(cache_type_k, cache_type_v, flash_attn, parallel, ubatch_size, batch_size, n_rs_seq, budget)
    m = load_model(spec_name)
    ctxs = given or _predict_contexts(None, spec_name, m)
    req = _predict_request(ctxs, flags, swa_full, parallel, kv_unified, ubatch_size, batch_size, n_rs_seq, workload,
                           threads, no_mmap, n_gpu_layers, repack)
    req.engine, req.kv_only, req.verbose = engine, kv_only, verbose
    req.measure_speed, req.calibration_timeout_s = speed, calibration_timeout
    (req.depth, req.min_tg), req.llama_bench = speed_flags, lb
    req.device, req.device_memory = device_flags(device, device_memory, kv_only)
    req.layers, req.with_layers_json = layers and not as_json, layers and as_json
    model_notes(m)
    out = run_predict(m, req, one_repack(repack))
    if as_json:
        print_json(out.to_json())
    else:
        _show_predict(m, req, out, engine)
    if m.shape.invalid_reason:      # every row says 'invalid' with the reason; no figure, and exit 1
        sys.stderr.write(f"edgekv: error: {m.ref.spec}: {m.shape.invalid_reason}; no figure given\n")
        raise typer.Exit(1)


def _show_predict(m, req, out, engine: bool) -> None:

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


def _read_flags(cache_type_k: str, cache_type_v: Optional[str], flash_attn: str, parallel: int, ubatch_size: int,
                batch_size: int, n_rs_seq: int, budget: Optional[str]) -> tuple[list[tuple[str, str]], str, Optional[int]]:
    """predict's flags that need no model, checked (one line naming the flag when one is wrong): the K/V pairs, -fa
    and the --budget bytes."""
    pairs = pair_types(parse_type_list(cache_type_k, "-ctk"),
                       parse_type_list(cache_type_v, "-ctv") if cache_type_v else None)
    fa = parse_flash_attn(flash_attn)
    if parallel < 1:
        raise UsageError("-np/--parallel must be at least 1")
    if ubatch_size < 1 or batch_size < 1:
        raise UsageError("-ub and -b must be at least 1")
    if n_rs_seq < 0:
        raise UsageError("--n-rs-seq must not be negative")
    return pairs, fa, _budget_bytes(budget) if budget else None


def _predict_request(ctxs: list[int], flags: tuple[list[tuple[str, str]], str, Optional[int]], swa_full: bool,
                     parallel: int, kv_unified: bool, ubatch_size: int, batch_size: int, n_rs_seq: int,
                     workload: str, threads: int, no_mmap: bool, n_gpu_layers: int, repack: Optional[str] = None):
    """predict's checked flags (:func:`_read_flags`) and contexts as a PredictRequest."""
    pairs, fa, budget_bytes = flags
    base = ContextParams(n_ctx=ctxs[0], type_k=pairs[0][0], type_v=pairs[0][1], flash_attn=fa, swa_full=swa_full,
                         n_seq_max=parallel, kv_unified=kv_unified, n_batch=batch_size, n_ubatch=ubatch_size,
                         n_rs_seq=n_rs_seq)
    configs = [replace(base, n_ctx=n, type_k=k, type_v=v) for n in ctxs for k, v in pairs]
    process = ProcessSettings(workload=workload, n_threads=threads, use_mmap=not no_mmap, n_gpu_layers=n_gpu_layers,
                              use_extra_bufts=one_repack(repack) is not False)
    return PredictRequest(base=base, configs=configs, pairs=pairs, n_gpu_layers=n_gpu_layers, process=process,
                          budget_bytes=budget_bytes)


def _budget_bytes(budget: str) -> int:
    """--budget SIZE, or ``auto``: the memory available now (edgekv.machine.memory; said on stderr)."""
    if budget.strip().lower() != "auto":
        return parse_size(budget, "--budget")
    avail = available_memory()
    if avail is None:
        raise UsageError("--budget auto: this machine's available memory cannot be read; give a size (16GiB)")
    sys.stderr.write(f"edgekv: --budget auto: {size(avail.bytes)} available now ({avail.source})\n")
    return avail.bytes


def _predict_contexts(ctx_size: Optional[str], spec_name: Optional[str], m) -> list[int]:
    """-c as given, else one rule from the model, shared with ``bench --full`` (issue 19)."""
    if ctx_size:
        return parse_int_list(ctx_size, "-c/--ctx-size")
    reg = registry_sweep_defaults(spec_name)
    return model_contexts(m.shape.n_ctx_train, reg.contexts if reg else None)
