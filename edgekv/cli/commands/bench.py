"""``edgekv bench``: measured sweeps beside the predictions (listed in :data:`edgekv.cli.main.COMMANDS`).

The flags become the :class:`~edgekv.records.schema.Settings` every configuration shares, by name, and the grid and
run options beside them (edgekv.cli.benchrun.BenchArgs); edgekv.cli.benchrun plans, runs and shows the sweep.
"""

from __future__ import annotations

from typing import Optional

import typer
from msgspec import UNSET

from edgekv.cli.benchrun import BenchArgs, bench_command, check_quality_flags
from edgekv.cli.flags import (
    B_OPT,
    BENCH_CTK_OPT,
    BENCH_CTX_OPT,
    BENCH_NO_MMAP_OPT,
    CAL_TIMEOUT_OPT,
    CTV_OPT,
    FORCE_OPT,
    LLAMA_SERVER_OPT,
    MODEL_ARG,
    MODEL_OPT,
    NO_RETRY_OPT,
    NO_SPEED_MODEL_OPT,
    NPL_OPT,
    QUALITY_FLAG_OPT,
    REPACK_OPT,
    SWA_FULL_OPT,
    UB_OPT,
    UNIFIED_OPT,
    AsJson,
)
from edgekv.cli.options import make_console, pick_model, print_json
from edgekv.sweep.spec import bench_settings, engine_for, quality_settings

DEPTHS_OPT = typer.Option(None, "-d", "--n-depth", show_default=False,
                          help="KV depths to test at (default: context minus max(-p, -n)).")
N_PROMPT_OPT = typer.Option(None, "-p", "--n-prompt", show_default=False,
                            help="Prompt tokens per prefill test (default 128; --full: 512).")
N_GEN_OPT = typer.Option(None, "-n", "--n-gen", show_default=False,
                         help="Tokens per decode test (default 32; --full: 128).")
REPETITIONS_OPT = typer.Option(None, "-r", "--repetitions", show_default=False,
                               help="Repetitions of each test (default 5).")
FULL_OPT = typer.Option(False, "--full", help="The model's full sweep: its models.toml contexts (2K/4K/8K for "
                                             "the default model) with -p 512 -n 128 -r 5, like llama-bench.")
OUTPUT_OPT = typer.Option(None, "-o", "--output", show_default=False,
                          help="Results JSONL (appended; rerun the same command to resume).")
LLAMA_BENCH_OPT = typer.Option(None, "--llama-bench", show_default=False,
                               help="Run your own llama-bench binary instead of llama-cpp-python.")
CORPUS_OPT = typer.Option(None, "--corpus", show_default=False,
                          help="With --quality: pydoc (default, offline), wikitext-2 or a text file.")
CHUNKS_OPT = typer.Option(None, "--chunks", show_default=False,
                          help="With --quality: chunks per context size (default: 2).")


def bench(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    ctx_size: Optional[str] = BENCH_CTX_OPT,
    cache_type_k: Optional[str] = BENCH_CTK_OPT,
    cache_type_v: Optional[str] = CTV_OPT,
    flash_attn: str = typer.Option("auto", "-fa", "--flash-attn", help="on, off, auto (a list sweeps them)."),
    n_gpu_layers: int = typer.Option(-1, "-ngl", "--n-gpu-layers", help="Layers to offload (-1: all)."),
    threads: int = typer.Option(0, "-t", "--threads", help="Threads (default: physical cores, like llama.cpp)."),
    depths: Optional[str] = DEPTHS_OPT,
    n_prompt: Optional[int] = N_PROMPT_OPT,
    n_gen: Optional[int] = N_GEN_OPT,
    repetitions: Optional[int] = REPETITIONS_OPT,
    full: bool = FULL_OPT,
    batch_size: int = B_OPT,
    ubatch_size: int = UB_OPT,
    swa_full: bool = SWA_FULL_OPT,
    no_warmup: bool = typer.Option(False, "--no-warmup", help="Skip the warm-up run."),
    output: Optional[str] = OUTPUT_OPT,
    llama_bench: Optional[str] = LLAMA_BENCH_OPT,
    quality: bool = QUALITY_FLAG_OPT,
    corpus: Optional[str] = CORPUS_OPT,
    chunks: Optional[int] = CHUNKS_OPT,
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
    as_json: AsJson = False,
) -> None:
    """Measure memory and speed across cache types x contexts, each in a fresh process, beside the prediction."""
    name = pick_model(model, model_opt)
    check_quality_flags(quality, corpus, chunks)
    settings = bench_settings(  # what every configuration shares, by name; the grid below sets the rest per case
        engine=engine_for(llama_bench, llama_server), n_threads=threads, n_gpu_layers=n_gpu_layers, n_batch=batch_size,
        n_ubatch=ubatch_size, swa_full=swa_full, kv_unified=kv_unified, n_prompt=n_prompt, n_gen=n_gen,
        repetitions=repetitions, warmup=not no_warmup, no_mmap=True if no_mmap else UNSET,
        quality=quality_settings(corpus, chunks) if quality else None)
    args = BenchArgs(  # the grid's lists and how to run, by name
        model=name, settings=settings, ctx_size=ctx_size, cache_type_k=cache_type_k,
        cache_type_v=cache_type_v, flash_attn=flash_attn, depths=depths, n_parallel=n_parallel, repack=repack,
        full=full, output=output, llama_bench=llama_bench, llama_server=llama_server, timeout=timeout, force=force,
        no_retry=no_retry, no_speed_model=no_speed_model, calibration_timeout=calibration_timeout)
    code = bench_command(args, as_json, make_console, print_json)
    if code:
        raise typer.Exit(code)
