"""What a sweep predicts before it runs: llama.cpp's dry runs, the whole-process prediction and the speed model's
prediction of every configuration to run, and whether each fits the memory available now."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgekv.calibration.baseline import runtime_baseline
from edgekv.core.fit import fits, unfit_reason
from edgekv.core.memmodel import WORKLOAD_BENCH
from edgekv.core.predict import STATUS_OK, ContextParams
from edgekv.core.shape import MEMORY_KV
from edgekv.errors import EngineError
from edgekv.machine import memory as machine_memory  # read as machine_memory.available_memory: a test can stand in for it
from edgekv.prediction.speed import (
    SpeedInputs,
    calibration_for,
    offload_device,
    predict_speeds,
    swa_cells_of,
)
from edgekv.prediction.wholeprocess import ProcessSettings, gpu_device_of, predict_processes
from edgekv.records.frame import unset_none
from edgekv.records.schema import SpeedPrediction
from edgekv.runtime.engine import EngineResult, EngineSession
from edgekv.sweep.listener import SweepListener
from edgekv.sweep.llamabench import accepts
from edgekv.sweep.spec import ENGINE_LLAMA_BENCH, ENGINE_SERVER, Case, SweepSpec


def fit_check(spec: SweepSpec, case: Case, proc: Any) -> str | None:
    """Why a configuration is not started (its predicted peak plus the margin exceeds the memory available now,
    edgekv.core.fit), or None: it fits, nothing is known of the machine, or ``--force``.  Without a whole-process
    prediction the cache and the weights stand in for it, and the line says so."""
    if spec.force_fit or case.prediction.status != STATUS_OK:
        return None
    peak = getattr(proc, "peak_rss_bytes", None)
    basis = "predicted peak"
    if not peak:
        peak, basis = case.prediction.total_bytes + spec.model.weights_bytes, "KV cache + weights (no whole-process prediction)"
    avail = machine_memory.available_memory()
    if avail is None or fits(peak, avail.bytes):
        return None
    return unfit_reason(peak, avail.bytes, avail.source, basis)


def dry_runs(spec: SweepSpec, todo: list[Case]) -> dict[str, EngineResult]:
    """llama.cpp's own prediction for every configuration, from one dry-run session."""
    run = [c for c in todo if not c.prediction.aborts]
    if not run:
        return {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.settings.n_gpu_layers, header=spec.model.header) as eng:
            res = eng.run([c.params for c in run])
    except EngineError:
        return {}
    return {c.key: r for c, r in zip(run, res)}


def process_predictions(spec: SweepSpec, todo: list[Case]) -> dict[str, Any]:
    """The whole-process prediction (workload ``bench``) for every configuration to run, keyed by case key.

    The runtime baseline is this environment's calibration (the llama-bench binary alone with
    ``--llama-bench``); llama.cpp's dry run supplies the workload's compute buffers."""
    run = [c for c in todo if c.prediction.status == STATUS_OK and not c.prediction.aborts]
    if not run:
        return {}
    if spec.engine == ENGINE_LLAMA_BENCH:
        return _llama_bench_processes(spec, run)
    # the user's llama-server: the same process model over that binary's own runtime baseline
    baseline = binary_baseline(spec.llama_server) if spec.engine == ENGINE_SERVER else runtime_baseline()
    out: dict[str, Any] = {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.settings.n_gpu_layers, header=spec.model.header) as eng:
            for c in run:
                st = c.settings
                settings = ProcessSettings(workload=WORKLOAD_BENCH, n_threads=st.n_threads, use_mmap=spec.use_mmap,
                                           use_extra_bufts=st.repack is not False,
                                           n_gpu_layers=spec.settings.n_gpu_layers, n_prompt=st.n_prompt, n_gen=st.n_gen,
                                           n_depth=st.n_depth, n_parallel=unset_none(st.n_parallel),
                                           server_slots=st.n_seq_max if spec.engine == ENGINE_SERVER else 0,
                                           # the worker restores these caches from a state file (run_sweep's restore)
                                           restores_state_file=spec.model.shape.memory != MEMORY_KV and st.n_depth > 0)
                out[c.key] = predict_processes(spec.model, [c.params], settings, baseline, eng)[0]
    except EngineError as e:
        return {c.key: {"error": str(e)} for c in run}
    return out


def binary_baseline(binary: str):
    """A llama.cpp binary's own runtime baseline; the CPU features (which weights the CPU backend repacks) are
    the machine's, and the Python runtime reports them where the binary does not."""
    baseline = runtime_baseline("binary", binary)
    baseline.cpu_features = baseline.cpu_features or runtime_baseline().cpu_features
    return baseline


def _llama_bench_processes(spec: SweepSpec, run: list[Case]) -> dict[str, Any]:
    """llama-bench runs one process per test with a context of depth + test tokens (swa_full off, one
    sequence) and keeps the depth state in memory: the prediction is the larger of the two processes, over
    the binary's own baseline."""
    baseline = binary_baseline(spec.llama_bench)
    out: dict[str, Any] = {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.settings.n_gpu_layers, header=spec.model.header) as eng:
            for c in run:
                st = c.settings
                best = None
                for test, count in (("pp", st.n_prompt), ("tg", st.n_gen)):
                    if count <= 0:
                        continue
                    params = replace(c.params, n_ctx=st.n_depth + count, swa_full=False, n_seq_max=1,
                                     kv_unified=False)
                    settings = ProcessSettings(workload=WORKLOAD_BENCH, n_threads=st.n_threads, use_mmap=spec.use_mmap,
                                               use_extra_bufts=st.repack is not False,
                                               n_gpu_layers=spec.settings.n_gpu_layers,
                                               n_prompt=count if test == "pp" else 0, n_gen=count if test == "tg" else 0,
                                               n_depth=st.n_depth, keeps_depth_state=st.n_depth > 0)
                    p = predict_processes(spec.model, [params], settings, baseline, eng)[0]
                    if p is not None and (best is None or (p.peak_rss_bytes or 0) > (best.peak_rss_bytes or 0)):
                        best = p
                if best is not None:
                    best.notes.append("llama-bench: the larger of its pp and tg processes")
                    out[c.key] = best
    except EngineError as e:
        return {c.key: {"error": str(e)} for c in run}
    return out


def speed_predictions(spec: SweepSpec, todo: list[Case], engine_results: dict[str, EngineResult],
                      say: SweepListener) -> dict[str, SpeedPrediction]:
    """``prediction.speed`` for every configuration to run (edgekv.core.speed), keyed by case key.  The
    calibration is this machine's (cached; what it lacks is measured now, and that is said before the plan);
    llama.cpp's graph size comes from the configuration's dry run (one is run when the sweep has none)."""
    # what will run: llama-bench skips the cache types it refuses, so they are neither calibrated nor predicted
    run = [c for c in todo if c.prediction.status == STATUS_OK and not c.prediction.aborts
           and (spec.llama_bench is None or accepts(c.settings))]
    out: dict[str, SpeedPrediction] = {}
    if not run:
        return out
    own = {**engine_results, **_graph_runs(spec, [c for c in run if not _has_graph(engine_results.get(c.key))])}
    dry = next((r for r in own.values() if r.ok and r.log.graph), None)
    graph = dry.log.graph if dry is not None else None
    # the GPU llama.cpp put the dry run's buffers on: every layer there is the GPU form, a split is not predicted
    device, why = offload_device(spec.settings.n_gpu_layers, spec.model.shape.n_layer,
                                 gpu_device_of(dry.log.compute_buffers) if dry is not None else None)
    if why:
        return {c.key: SpeedPrediction(calibration_id=None, error=why) for c in run}
    feats = runtime_baseline().cpu_features
    groups: dict[tuple[int, bool], list[Case]] = {}
    for c in run:
        x = SpeedInputs.from_settings(c.settings)
        groups.setdefault((x.n_threads, x.repack), []).append(c)
    deadline = time.monotonic() + spec.calibration_timeout_s      # one deadline for every group's calibration
    for (_threads, repack), cases in groups.items():
        runs = [(replace(SpeedInputs.from_settings(c.settings), device=device, swa_cells=swa_cells_of(c.prediction)),
                 own[c.key].log.graph if _has_graph(own.get(c.key)) else None) for c in cases]
        # a --llama-bench sweep is predicted from a calibration measured through that binary (its build's kernels)
        _sh, cal, note, blocks = predict_speeds(
            spec.model, feats, repack, device, graph, runs,
            lambda sh, xs: calibration_for(sh, xs, feats, progress=_progress(spec, say, deadline), allow_busy=True,
                                           llama_bench=spec.llama_bench, deadline=deadline,
                                           on_wait=lambda: say.on_note("another edgekv process is measuring this "
                                                                       "machine's speed: waiting for its result")))
        if note:
            say.on_note(f"speed calibration: {note}" if cal is not None else
                        f"no speed predictions: {note}; measuring without them (--no-speed-model skips the "
                        "calibration)")
        out.update(zip((c.key for c in cases), blocks))
    return out


def _progress(spec: SweepSpec, say: SweepListener, deadline: float) -> Callable[[str], None]:
    """The calibration's progress as the sweep's events: why the plan waits (once), then each step measured with
    the time left before the calibration's deadline."""
    started: list[str] = []

    def progress(step: str) -> None:
        left = max(0.0, deadline - time.monotonic())
        if not started:       # the first measurement: say why the plan is a minute away
            via = f" through {spec.llama_bench}" if spec.llama_bench else ""
            again = "edgekv calibrate --llama-bench PATH" if spec.llama_bench else "edgekv calibrate"
            say.on_note(f"calibrating this machine's speed for the speed model{via} (once per "
                        "environment, thread count and --repack; about a minute, at most "
                        f"{spec.calibration_timeout_s:.0f} s (--calibration-timeout); '{again}' "
                        "re-measures, --no-speed-model skips it)")
            started.append(step)
        say.on_calibrate(step, left)

    return progress


def _has_graph(r: EngineResult | None) -> bool:
    return r is not None and r.ok and bool(r.log.graph)


def _graph_runs(spec: SweepSpec, cases: list[Case]) -> dict[str, EngineResult]:
    """llama.cpp's dry run of the configurations that have none (a --llama-bench sweep), for their graph sizes and
    the devices of their buffers: one per distinct setting but the context size (a quantized cache adds nodes:
    SmolLM2 936 with f16, 1296 with q4_0), in one session; the cases it could not run are left out."""
    setting = {c.key: replace(c.params, n_ctx=0) for c in cases}
    firsts: dict[ContextParams, Case] = {}
    for c in cases:
        firsts.setdefault(setting[c.key], c)
    if not firsts:
        return {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.settings.n_gpu_layers, header=spec.model.header) as eng:
            res = dict(zip(firsts, eng.run([c.params for c in firsts.values()])))
    except EngineError:
        return {}
    return {c.key: res[setting[c.key]] for c in cases if _has_graph(res[setting[c.key]])}
