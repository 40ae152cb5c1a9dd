"""``edgekv info`` and ``edgekv calibrate``: this machine as llama.cpp sees it, and its speed calibration
(listed in :data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekv.calibration.baseline import runtime_baseline
from edgekv.calibration.info import machine_info
from edgekv.calibration.lock import LockTimeout, measuring
from edgekv.calibration.preflight import repack_choice
from edgekv.calibration.speedcal import CalibrationError, export_calibrations, import_calibrations
from edgekv.calibration.speedcal import calibrate as run_calibration
from edgekv.cli.flags import AsJson, FlashAttn, OneRepack, Threads, llama_bench_path, one_repack
from edgekv.cli.options import make_console, parse_flash_attn, parse_type_list, print_json
from edgekv.core.wire import to_wire
from edgekv.errors import UsageError
from edgekv.machine.environment import default_threads
from edgekv.output.views import render_calibration, render_info
from edgekv.prediction.api import load_model
from edgekv.prediction.speed import SPEED_LOCK, dry_run_device, model_speed_shape, offload_device, weight_types
from edgekv.sources.tinymodel import probe_model_path

# calibrate's own options, typed as predict's shared ones are (edgekv.cli.flags)
CalTimeout = Annotated[float, typer.Option("--calibration-timeout", metavar="SECONDS",
                                           help="Stop measuring after this long (nothing half-measured is cached).")]
ExportFile = Annotated[Optional[Path], typer.Option(
    "--export", metavar="FILE", show_default=False,
    help="Write every calibration cached here to FILE (for a CI cache) and measure nothing.")]
ImportFile = Annotated[Optional[Path], typer.Option(
    "--import", metavar="FILE", show_default=False,
    help="Read calibrations from a FILE written by --export into this machine's cache.")]
CalTypes = Annotated[str, typer.Option("-ctk", "--cache-type-k",
                                       help="K/V cache types to calibrate (comma-separated; V follows K).")]
AllowBusy = Annotated[bool, typer.Option("--allow-busy", help="Keep a calibration taken while other work used the CPUs "
                                                              "(marked busy) instead of refusing it.")]
CalLlamaBench = Annotated[Optional[str], typer.Option(
    "--llama-bench", show_default=False,
    help="Measure through your own llama-bench binary (what 'edgekv bench --llama-bench' predicts from) instead of "
         "llama-cpp-python.")]
CalGpuLayers = Annotated[int, typer.Option(
    "-ngl", "--n-gpu-layers",
    help="0: the CPU; -1: every layer on the GPU (the calibration that predict and bench use when they offload every "
         "layer).")]
CalModel = Annotated[Optional[str], typer.Argument(show_default=False,
                                                   help="Also calibrate the weight types this model uses (path or name).")]


def info(
    llama_bench: Optional[str] = typer.Option(None, "--llama-bench", show_default=False,
                                              help="Also run the preflight on your own llama-bench binary."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again instead of reading the cached calibration."),
    as_json: AsJson = False,
) -> None:
    """This machine as llama.cpp sees it: CPU features, extra buffer types, runtime baseline, preflight.

    The extra buffer types (AMX, CPU_REPACK) and whether their kernels run here (the preflight), each measured
    once per environment and cached."""
    llama_bench_path(llama_bench)      # checked: an executable file
    res = machine_info(llama_bench, refresh)
    if as_json:
        print_json(res)
    else:
        render_info(make_console(), res)


def calibrate(
    model: CalModel = None,
    threads: Threads = 0,
    cache_type_k: CalTypes = "f16,q8_0,q5_0,q4_0",
    flash_attn: FlashAttn = "auto",
    repack: OneRepack = None,
    allow_busy: AllowBusy = False,
    llama_bench: CalLlamaBench = None,
    n_gpu_layers: CalGpuLayers = 0,
    timeout: CalTimeout = 600.0,
    export: ExportFile = None,
    import_: ImportFile = None,
    as_json: AsJson = False,
) -> None:
    """Measure this machine's speed coefficients for the speed model; predict and bench use them.

    Cached per environment, thread count and --repack. How long it takes: docs/speed-model.md."""
    if export is not None or import_ is not None:
        return _move_calibrations(export, import_, as_json)
    if threads < 0:
        raise UsageError("-t/--threads must be 0 (physical cores) or more")
    if timeout <= 0:
        raise UsageError("--calibration-timeout must be a positive number of seconds")
    llama_bench_path(llama_bench)      # checked: an executable file
    n = threads or default_threads()
    fa = parse_flash_attn(flash_attn)
    con = make_console(stderr=True)
    rp = _repack(one_repack(repack), llama_bench, con)
    pairs = [(t, t, fa) for t in parse_type_list(cache_type_k, "-ctk")]
    feats = runtime_baseline().cpu_features
    device = _calibration_device(model, n_gpu_layers)
    types, geometries, bodies = _calibration_targets(model, feats, rp, device)
    con.print(f"Calibrating speed{' through ' + llama_bench if llama_bench else ''}{' on ' + device if device else ''} "
              f"with -t {n}, --repack {int(rp)}: "
              f"{', '.join(p[0] for p in pairs)}"
              + (f"; weight types {', '.join(types)}" if types else "") + " ...", highlight=False)
    deadline = time.monotonic() + timeout
    try:
        with measuring(SPEED_LOCK, deadline, lambda: con.print("  another edgekv process is measuring: waiting for it",
                                                               highlight=False)):
            sc = run_calibration(n, rp, types, pairs, feats, refresh=True, allow_busy=allow_busy,
                                 geometries=geometries, llama_bench=llama_bench, device=device, bodies=bodies,
                                 deadline=deadline,
                                 progress=lambda step: con.print(f"  {step} ({max(0.0, deadline - time.monotonic()):.0f}"
                                                                 " s left)", highlight=False) if not as_json else None)
    except (CalibrationError, LockTimeout) as e:
        raise UsageError(str(e)) from None
    if as_json:
        print_json(to_wire(sc.cal))
        return

    render_calibration(make_console(), sc)


def _repack(asked: bool | None, llama_bench: str | None, con) -> bool:
    """The --repack a calibration measures with: the one repack choice (edgekv.calibration.preflight.repack_choice:
    as asked, else llama.cpp's default unless the extra-buffer preflight saw those kernels crash here; then 0, said:
    a calibration must not start a child known to crash)."""
    choice = repack_choice(None if asked is None else [asked], llama_bench, probe=asked is None)
    pf = choice.preflight
    if choice.fell_back and pf is not None:
        con.print(f"edgekv: {pf.crash_cause}: calibrating --repack 0, the setting that runs here ({pf.detail})",
                  highlight=False, markup=False)
    return choice.values[0]


def _move_calibrations(export: Path | None, import_: Path | None, as_json: bool) -> None:
    """calibrate --export FILE / --import FILE: the calibration cache in one file, for a CI job to keep."""
    if export is not None and import_ is not None:
        raise UsageError("--export and --import: give one of them")
    try:
        n = export_calibrations(export) if export is not None else import_calibrations(import_)
    except CalibrationError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{export or import_}: {e.strerror or e}") from None
    what = {"exported": n} if export is not None else {"imported": n}
    if as_json:
        print_json({**what, "file": str(export or import_)})
    else:
        verb = "wrote" if export is not None else "read"
        make_console().print(f"{verb} {n} calibration file(s) {'to' if export is not None else 'from'} "
                             f"{export or import_}", highlight=False, markup=False)


def _calibration_targets(model: str | None, feats: list[str], repack: bool, device: str) -> tuple[list, list, list]:
    """(weight types, attention geometries, GPU body widths) a calibration measures: the model's, or with no model
    the generic attention model alone."""
    if not model:
        return [], [None], []

    sh = model_speed_shape(load_model(model), feats, repack, None, device)
    return weight_types(sh), sorted({lay.geometry for lay in sh.attn}), [sh.body] if device and sh.body else []


def _calibration_device(model: str | None, n_gpu_layers: int) -> str:
    """calibrate -ngl: "" for the CPU; the GPU llama.cpp offloads every layer to for -1 (from a dry run of the model,
    or of edgekv's probe model); a usage error for a partial offload or a build with no GPU."""
    if n_gpu_layers == 0:
        return ""

    m = load_model(model or str(probe_model_path()))
    device, why = offload_device(n_gpu_layers, m.shape.n_layer, dry_run_device(m, n_gpu_layers))
    if why:
        raise UsageError(f"-ngl: {why}")
    if not device:
        raise UsageError(f"-ngl {n_gpu_layers}: this llama.cpp build put no layer on a GPU (no GPU backend, or no GPU "
                         "found); calibrate without -ngl for the CPU")
    return device
