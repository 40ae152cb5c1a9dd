"""Measured sweeps: model x cache types x contexts (x depths), one fresh child process per case.

For each configuration the parent records three sources side by side (see
../shared/design/architecture.md): the **formula** prediction, **llama.cpp's** own figures (a dry
run before the sweep, and the log of the measured run itself), and what the **OS measured** (peak
RSS sampled every 5 ms (during the timed tests the child reads its own after each repetition, so that
sampling never slows them), the kernel's own maximum from ``os.wait4``, anonymous vs file-backed pages,
macOS footprint, NVML GPU memory).  Each record is appended atomically as soon as its configuration
finishes, so an interrupted sweep resumes where it stopped, repeating nothing.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekv.core.llamacmd import llama_cpp_args
from edgekv.core.llamalog import KVCacheLine, LlamaMemoryLog, device_mib
from edgekv.core.predict import MIB, STATUS_OK, ContextParams, KVPrediction, predict
from edgekv.core.shape import MEMORY_KV
from edgekv.edges.engine import EngineResult
from edgekv.edges.environment import default_threads
from edgekv.edges.home import edgekv_home, verified_sha256
from edgekv.edges.machine_memory import memory_watchdog
from edgekv.errors import ResultsError, UsageError
from edgekv.orchestration.api import LoadedModel
from edgekv.orchestration.crosscheck import compare, engine_block, engine_lines
from edgekv.orchestration.plan import SweepTracker
from edgekv.records import results as R
from edgekv.records.schema import growth_minus_formula_bytes, speed_test
from edgekv.records.schema import model_block as schema_model_block

ENGINE_PYTHON = "llama-cpp-python"
ENGINE_LLAMA_BENCH = "llama-bench"
ENGINE_SERVER = "llama-server"
BATCHED_NOT_PREDICTED = ("the speed model predicts one sequence at a depth; -npl's sequences decoded at once are measured, "
                         "not predicted")


@dataclass
class SweepSpec:
    model: LoadedModel
    contexts: list[int]
    pairs: list[tuple[str, str]]
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])
    depths: list[int] | None = None          # None: each context minus max(n_prompt, n_gen)
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 5
    n_threads: int = 0
    n_gpu_layers: int = -1
    n_batch: int = 2048
    n_ubatch: int = 512
    swa_full: bool = False
    n_seq_max: int = 1
    kv_unified: bool = False
    warmup: bool = True
    timeout_s: float = 3600.0
    engine: str = ENGINE_PYTHON
    llama_bench: str | None = None
    llama_server: str | None = None          # --llama-server PATH: the user's server, one process per configuration
    quality: dict[str, Any] | None = None
    use_mmap: bool = True
    # --repack 0,1: the CPU backend's extra buffer types (AMX, CPU_REPACK).  None: llama.cpp's default (1) unless
    # the extra-buffer preflight found that their kernels crash here (then 0, said before the plan)
    repack: list[bool] | None = None
    repack_note: str | None = None           # why the sweep runs with --repack 0 when the user did not ask
    preflight: Any = None                    # the extra-buffer preflight's verdict (edgekv.orchestration.preflight)
    retry_failed: bool = True                # resume measures failed configurations again (--no-retry: off)
    force_fit: bool = False                  # --force: run configurations predicted not to fit the memory available
    predict_speed: bool = True               # the speed model's prediction in every record (calibrating when needed)
    # -npl 1,2,4: sequences decoded at once (llama-batched-bench's pl; each case's n_seq_max), each with -p prompt
    # and -n generated tokens from an empty cache; None: the single-sequence workload at a depth
    n_parallel: list[int] | None = None


@dataclass
class Case:
    index: int
    settings: dict[str, Any]
    params: ContextParams
    key: str
    prediction: KVPrediction


def default_depth(n_ctx: int, n_prompt: int, n_gen: int) -> int:
    """Fill the cache so the timed tests end at the context size: "context C" really holds ~C tokens."""
    return max(0, n_ctx - max(n_prompt, n_gen))


def _depths(spec: SweepSpec, n_ctx: int, npl: int | None) -> list[int]:
    """The depths one context is measured at, checked against it (one line naming the flags when they do not fit)."""
    if npl is not None:            # llama-batched-bench: every test starts from an empty cache, N sequences in -c cells
        need = npl * (spec.n_prompt + spec.n_gen)
        if need > n_ctx:
            raise UsageError(f"-npl {npl} with -p {spec.n_prompt} -n {spec.n_gen} needs {need} cells, more than -c {n_ctx}: "
                             "raise -c or lower -npl, -p or -n")
        return [0]
    depths = spec.depths if spec.depths is not None else [default_depth(n_ctx, spec.n_prompt, spec.n_gen)]
    for d in depths:
        if d + max(spec.n_prompt, spec.n_gen) > n_ctx:
            raise UsageError(
                f"-d {d} with -p {spec.n_prompt} -n {spec.n_gen} does not fit in -c {n_ctx}: "
                "depth + tokens per test must not exceed the context")
    return depths


def expand(spec: SweepSpec, model_sha: str | None) -> list[Case]:
    cases = []
    threads = spec.n_threads or default_threads()
    if spec.n_parallel is not None and spec.depths:
        raise UsageError("-d does not apply with -npl: like llama-batched-bench, each test starts from an empty cache")
    grid = [(n_ctx, npl) for n_ctx in spec.contexts for npl in (spec.n_parallel or [None])]
    for n_ctx, npl in grid:
        n_seq = spec.n_seq_max if npl is None else npl
        for d in _depths(spec, n_ctx, npl):
            for fa, rp in ((fa, rp) for rp in (spec.repack or [True]) for fa in spec.flash_attn):
                for tk, tv in spec.pairs:
                    params = ContextParams(n_ctx=n_ctx, type_k=tk, type_v=tv, flash_attn=fa, swa_full=spec.swa_full,
                                           n_seq_max=n_seq, kv_unified=spec.kv_unified,
                                           n_batch=spec.n_batch, n_ubatch=spec.n_ubatch)
                    settings = {
                        "engine": spec.engine, "n_ctx": n_ctx, "type_k": tk, "type_v": tv, "flash_attn": fa,
                        "swa_full": spec.swa_full, "n_seq_max": n_seq, "kv_unified": spec.kv_unified,
                        "n_batch": spec.n_batch, "n_ubatch": spec.n_ubatch, "n_threads": threads,
                        "n_gpu_layers": spec.n_gpu_layers, "n_prompt": spec.n_prompt, "n_gen": spec.n_gen,
                        "n_depth": d, "repetitions": spec.repetitions, "warmup": spec.warmup,
                        "quality": _quality_key(spec.quality), "repack": rp,
                    }
                    if npl is not None:
                        settings["n_parallel"] = npl
                    if not spec.use_mmap:
                        settings["no_mmap"] = True
                    cases.append(Case(len(cases), settings, params, R.config_key(model_sha, settings),
                                      predict(spec.model.shape, params)))
    return cases


def _quality_key(q: dict[str, Any] | None) -> Any:
    if not q:
        return None
    from edgekv.orchestration.quality import SWEEP_CHUNKS

    return {"corpus": q.get("corpus") or "pydoc", "chunks": int(q.get("chunks") or SWEEP_CHUNKS)}


def default_output(spec: SweepSpec, cases: list[Case]) -> Path:
    h = hashlib.sha256("|".join(c.key for c in cases).encode()).hexdigest()[:10]
    stem = Path(spec.model.ref.path).stem.replace(" ", "_")
    return edgekv_home() / "runs" / f"{stem}-{h}.jsonl"


model_block = schema_model_block      # the one serialiser of the model block lives with the schema


def _log_from_dict(d: dict[str, Any]) -> LlamaMemoryLog:
    d = dict(d)
    caches = [KVCacheLine(**x) for x in d.pop("caches", [])]
    log = LlamaMemoryLog(**d)
    log.caches = caches
    return log


def _prediction_block(pred: KVPrediction, eng: EngineResult | None) -> dict[str, Any]:
    out: dict[str, Any] = {"formula": pred.to_dict()}
    if eng is not None:
        out["engine"] = engine_block(pred, eng)
    return out


def _speed_block(samples: dict[str, Any]) -> dict[str, Any]:
    return {test: speed_test(v["n_tokens"], v["samples_ns"], v["samples_ts"]) for test, v in samples.items()}


def build_record(spec: SweepSpec, case: Case, env: dict[str, Any], model: dict[str, Any], eng: EngineResult | None,
                 child, wall_s: float, status: str, reason: str | None) -> dict[str, Any]:
    from edgekv.version import __version__

    rec: dict[str, Any] = {
        "schema_version": R.SCHEMA_VERSION,
        "kind": "bench",
        "config_key": case.key,
        "status": status,
        "reason": reason,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "edgekv": __version__,
        "model": model,
        "settings": case.settings,
        "prediction": _prediction_block(case.prediction, eng),
        "environment": env,
        "llama_cpp_args": llama_cpp_args(case.settings, model.get("path")),
    }
    res = (child.result or {}) if child is not None else {}
    if res:
        ctx_log = _log_from_dict(res["ctx_log"]) if "ctx_log" in res else None
        load_log = res.get("load_log") or {}
        rec["effective"] = dict(res.get("effective") or {})
        if ctx_log is not None:
            rec["effective"].update({
                "flash_attn": ctx_log.fa_resolved or ("enabled" if case.prediction.flash_attn_effective == "on" else
                                                       "disabled" if case.prediction.flash_attn_effective == "off" else None),
                "flash_attn_forced_for_quantized_v": ctx_log.fa_forced_for_quantized_v,
            })
            rec["llama_log"] = {
                "kv": engine_lines(EngineResult(case.params, True, None, ctx_log)),
                "kv_mib": round(ctx_log.kv_mib_total, 2),
                "recurrent_mib": round(ctx_log.recurrent_mib_total, 2),
                "kv_buffers_mib": ctx_log.kv_buffers, "rs_buffers_mib": ctx_log.rs_buffers,
                "compute_mib": ctx_log.compute_buffers, "output_mib": ctx_log.output_buffers,
                "model_buffers_mib": load_log.get("model_buffers"), "gpu_layers": load_log.get("gpu_layers"),
                "device_notes": res.get("device_notes") or [],
            }
        rec["speed"] = _speed_block(res.get("samples") or {})
        rec["timing"] = {**(res.get("timing") or {}), "wall_s": wall_s}
        llama_s = sum((res.get("timing") or {}).get(k, 0.0) for k in
                      ("load_s", "context_s", "warmup_s", "fill_s", "pp_s", "tg_s"))
        rec["timing"]["llama_s"] = llama_s
        rec["timing"]["harness_s"] = max(0.0, wall_s - llama_s)
        rec["restore"] = res.get("restore")
        if res.get("snapshot_bytes"):
            rec["snapshot_bytes"] = res["snapshot_bytes"]
    if child is not None:
        rec["memory"] = memory_block(child, res)
        if res and rec.get("llama_log"):
            rec["differences"] = differences(case, rec)
    return rec


HARNESS_PHASES = frozenset({"snapshot", "restore"})   # the harness's own state save/restore, not the model's


def memory_block(child, res: dict[str, Any]) -> dict[str, Any]:
    cps = res.get("checkpoints") or {}
    peaks = dict(child.phase_peaks)
    # The working set of a model in use at this context: every phase of the run (load, context, warm-up,
    # fill, the timed tests) except the moments the harness saves and restores its depth state (caches
    # that cannot be truncated back to depth), when llama.cpp passes one layer's rows through a buffer.
    work = [v for k, v in peaks.items() if k not in HARNESS_PHASES]
    m = {
        "peak_rss_bytes": max(work) if work else child.peak_rss_bytes,
        "peak_rss_all_phases_bytes": child.peak_rss_bytes,
        "kernel_maxrss_bytes": child.kernel_maxrss_bytes,
        "peak_footprint_bytes": child.peak_footprint_bytes,
        "peak_gpu_bytes": child.peak_gpu_bytes,
        "phase_peaks_bytes": peaks,
        "gpu_phase_peaks_bytes": dict(getattr(child, "gpu_phase_peaks", None) or {}) or None,
        "n_samples": child.n_samples,
        "sample_interval_mean_s": child.wall_s / child.n_samples if child.n_samples else None,
        "sample_interval_max_s": child.sample_interval_max_s,
        # during the timed tests the parent does not sample (it would slow llama.cpp down); the child reads its
        # own RSS after each repetition instead
        "timed_unsampled_s": getattr(child, "timed_unsampled_s", None),
        "n_child_samples": getattr(child, "n_child_samples", None),
    }
    for name, cp in cps.items():
        m[f"rss_{name}_bytes"] = cp.get("rss")
        m[f"anon_{name}_bytes"] = cp.get("anon")
        if cp.get("gpu_used") is not None:
            m[f"gpu_used_{name}_bytes"] = cp["gpu_used"]
    if cps.get("after_fill"):
        rss, anon = cps["after_fill"].get("rss"), cps["after_fill"].get("anon")
        if rss is not None and anon is not None:
            m["file_after_fill_bytes"] = rss - anon
    return m


def differences(case: Case, rec: dict[str, Any]) -> dict[str, Any]:
    """Measured minus predicted, where both exist.

    The KV (and recurrent) buffers are cleared when llama.cpp creates them, so they are resident from
    the moment the context exists: the anonymous memory the context adds should be the predicted cache
    bytes plus small buffers.  Compute buffers are reservations: only the pages a graph touches become
    resident, so their measured share is reported, not compared.
    """
    pred = case.prediction
    log = rec["llama_log"]
    mem = rec.get("memory") or {}
    d: dict[str, Any] = {}
    if pred.status == STATUS_OK:
        # llama.cpp's own cache lines in the measured run vs the formula, field by field
        eng = EngineResult(case.params, True, None, LlamaMemoryLog(caches=[KVCacheLine(**_line(x)) for x in log["kv"]]))
        diffs = compare(pred, eng)
        d["llama_kv_matches_formula"] = not diffs
        if diffs:
            d["llama_kv_diffs"] = diffs
        # "KV buffer size = %8.2f MiB": the real allocation, printed to 0.01 MiB (alignment and, on CUDA,
        # quantized-row padding can make it larger than the tensors' sum)
        kv_buf = sum((log.get("kv_buffers_mib") or {}).values()) + sum((log.get("rs_buffers_mib") or {}).values())
        d["kv_buffer_mib"] = round(kv_buf, 2)
        d["kv_buffer_minus_formula_mib"] = round(kv_buf - pred.total_bytes / MIB, 2)
        a_load, a_ctx, a_fill = (mem.get(f"anon_{k}_bytes") for k in ("after_load", "after_context", "after_fill"))
        if a_load is not None and a_ctx is not None:
            d["context_anon_growth_bytes"] = a_ctx - a_load
            d["context_anon_growth_minus_formula_bytes"] = growth_minus_formula_bytes(a_ctx - a_load, pred.total_bytes)
        compute = sum((log.get("compute_mib") or {}).values())
        # KV on a GPU (CUDA, Vulkan, ...): the device memory in use (read by the child itself right after the
        # load and right after the context) grows by the KV buffers and the compute buffers, which ggml
        # allocates whole on a device (no lazy pages there)
        g_load, g_ctx = mem.get("gpu_used_after_load_bytes"), mem.get("gpu_used_after_context_bytes")
        dev_kv = device_mib(log.get("kv_buffers_mib")) + device_mib(log.get("rs_buffers_mib"))
        if dev_kv and g_load is not None and g_ctx is not None:
            dev_compute = device_mib(log.get("compute_mib"))
            growth = g_ctx - g_load
            d["context_gpu_growth_bytes"] = growth
            d["gpu_compute_buffer_bytes"] = int(round(dev_compute * MIB))
            d["context_gpu_growth_minus_compute_minus_formula_bytes"] = (
                growth - d["gpu_compute_buffer_bytes"] - pred.total_bytes)
        if a_ctx is not None and a_fill is not None:
            d["fill_anon_growth_bytes"] = a_fill - a_ctx
            if compute:
                d["compute_buffer_bytes"] = int(round(compute * MIB))
    return d


def _line(x: dict[str, Any]) -> dict[str, Any]:
    return {"kind": x["kind"], "role": x.get("role"), "mib": x["mib"], "cells": x["cells"], "layers": x.get("layers", 0),
            "seqs": x.get("seqs", 1), "streams": x.get("streams"), "type_k": x.get("type_k"), "type_v": x.get("type_v"),
            "k_mib": x.get("k_mib"), "v_mib": x.get("v_mib"), "r_mib": x.get("r_mib"), "s_mib": x.get("s_mib")}


# -- the sweep ----------------------------------------------------------------------------------------

@dataclass
class SweepResult:
    output: Path
    records: list[dict[str, Any]]
    skipped_existing: int
    wall_s: float
    interrupted: bool = False
    new: int = 0                      # how many of ``records`` (the last ones) this run wrote


def check_resumable(existing: list[dict[str, Any]], env: dict[str, Any], model_sha: str | None, output: Path,
                    force: bool, model_name: str | None = None) -> None:
    """Refuse (one line, unless ``--force``) to append to a file holding another model or environment."""
    for r in existing:
        other = (r.get("model") or {}).get("sha256")
        if model_sha and other and other != model_sha and not force:
            name = (r.get("model") or {}).get("name") or "another model"
            raise ResultsError(
                f"{output} holds results of another model ({name}, sha256 {other[:12]}…); this run measures "
                f"{model_name or 'a different model'} (sha256 {model_sha[:12]}…); write to a new file with -o, "
                "or pass --force to append anyway")
        diffs = R.env_differences(r.get("environment") or {}, env)
        if diffs and not force:
            raise ResultsError(
                f"{output} holds results from another environment ({diffs[0]}); write to a new file with -o, "
                "or pass --force to append anyway")


def run_sweep(spec: SweepSpec, output: Path | None = None, env: dict[str, Any] | None = None, force: bool = False,
              on_event: Callable[[str, dict[str, Any]], None] | None = None) -> SweepResult:
    t0 = time.perf_counter()
    emit = on_event or (lambda kind, data: None)
    m = spec.model
    if not m.ref.complete:
        raise UsageError(f"{m.ref.spec}: only the header is available; measured runs need the whole model "
                         "(edgekv models pull NAME)")
    m.require_whole("edgekv bench")
    sha = verified_sha256(m.ref.path)
    resolve_repack(spec, emit)
    cases = expand(spec, sha)
    output = Path(output) if output else default_output(spec, cases)
    writer = R.ResultsWriter(output)    # writable, locked for the whole sweep, tail repaired: before measuring
    try:
        return _run_locked(spec, writer, cases, sha, env, force, emit, t0)
    finally:
        writer.close()


def resume_keys(existing: list[dict[str, Any]], retry_failed: bool = True) -> tuple[set[str], set[str]]:
    """(configurations already done, configurations whose last record failed) of a results file: a rerun measures
    the failed ones again (a crash, a timeout on a busy machine, an OOM kill whose cause was fixed) unless
    ``retry_failed`` is off (``--no-retry``); ``ok`` and deliberately ``skipped`` ones stay done."""
    last = {r.get("config_key"): r.get("status") for r in existing if r.get("config_key")}
    failed = {k for k, st in last.items() if st == "failed"}
    return (set(last) - failed if retry_failed else set(last)), failed


def resolve_repack(spec: SweepSpec, emit: Callable[[str, dict[str, Any]], None]) -> None:
    """``spec.repack`` when the user gave none: llama.cpp's default unless the extra-buffer preflight (cached per
    environment) saw its kernels kill the probe here; a ``--repack 1`` asked on such a machine is said too."""
    from edgekv.orchestration.preflight import preflight

    pf = preflight("binary", spec.llama_bench) if spec.engine == ENGINE_LLAMA_BENCH else preflight()
    spec.preflight = pf
    if spec.repack is None:
        spec.repack = [pf.repack]
        if not pf.repack:
            spec.repack_note = pf.fallback_line
            emit("note", {"message": spec.repack_note})
    elif True in spec.repack and not pf.repack:
        emit("note", {"message": f"{pf.crash_cause}: --repack 1 runs as asked, and every configuration that runs a "
                                 f"prompt batch is expected to fail there ({pf.detail})"})


def _sweep_environment(spec: SweepSpec, writer: R.ResultsWriter, env: dict[str, Any] | None, sha: str | None,
                       force: bool, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """The environment phase: the writer's notes said, the environment collected (with the extra-buffer
    preflight's block) and the records already in the file checked as resumable against it."""
    from edgekv.edges.environment import collect

    for note in writer.notes:
        emit("note", {"message": note})
    env = env or collect()
    if spec.preflight is not None:
        env = {**env, "extra_buffers_preflight": spec.preflight.environment_block()}
    check_resumable(writer.existing, env, sha, writer.path, force, model_name=spec.model.shape.name or spec.model.ref.name)
    return env


def _plan_sweep(spec: SweepSpec, cases: list[Case], todo: list[Case], retry: set[str], env: dict[str, Any],
                sha: str | None, emit: Callable[[str, dict[str, Any]], None],
                output: Path) -> tuple[dict[str, EngineResult], dict[str, Any], dict[str, Any], SweepTracker]:
    """The plan phase, said in the ``start`` event: llama.cpp's dry runs, the whole-process and speed predictions,
    what will not fit, and the time plan.  Returns the dry runs, the process predictions and the speed predictions
    by case key, and the tracker that attaches ``load`` and ``plan`` to each record."""
    from edgekv.edges.home import edgekv_home

    # llama.cpp's dry runs and the whole-process predictions come first: the plan says what will not fit
    engine_results = _dry_runs(spec, todo) if spec.engine != ENGINE_LLAMA_BENCH else {}
    processes = process_predictions(spec, todo)
    speeds = speed_predictions(spec, todo, engine_results, emit) if spec.predict_speed else {}
    unfit = {c.key: why for c in todo if (why := fit_check(spec, c, processes.get(c.key)))}
    tracker = SweepTracker(spec.model, todo[0].params if todo else None, todo, speeds, output, edgekv_home() / "runs",
                           sha, env or {})
    emit("start", {"total": len(cases), "todo": len(todo), "todo_cases": todo, "output": str(output),
                   "existing": len(cases) - len(todo), "env": env, "model_sha256": sha,
                   "retry": sum(1 for c in todo if c.key in retry), "unfit": unfit, "speeds": speeds,
                   "tracker": tracker})
    return engine_results, processes, speeds, tracker


def _run_python_case(spec: SweepSpec, case: Case, env: dict[str, Any], model: dict[str, Any], eng: EngineResult | None,
                     gpu_probe: Any, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """One case through llama-cpp-python in a fresh bench child, its outcome as a record."""
    from edgekv.edges.process import run_child, worker_argv

    m = spec.model
    payload = {"model_path": os.path.abspath(m.ref.path), "settings": case.settings,
               "restore": "truncate" if m.shape.memory == MEMORY_KV else "snapshot"}
    t = time.perf_counter()
    child = run_child(worker_argv("bench"), payload, timeout=spec.timeout_s, sample_memory=True,
                      gpu_probe=gpu_probe, on_event=lambda ev: emit("child", ev),
                      watchdog=memory_watchdog)
    wall = time.perf_counter() - t
    status, reason, failure = child_outcome(child, case)
    rec = build_record(spec, case, env, model, eng, child, wall, status, reason)
    if failure is not None:
        rec["failure"] = failure
    return rec


def _case_record(spec: SweepSpec, case: Case, env: dict[str, Any], model: dict[str, Any], eng: EngineResult | None,
                 proc: Any, gpu_probe: Any, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """One case's record: skipped (refused by the formula or llama.cpp, or not fitting now) or run by its engine."""
    unfit_now = fit_check(spec, case, proc)
    if case.prediction.status != STATUS_OK or (eng is not None and not eng.ok):
        reason = case.prediction.reason if case.prediction.status != STATUS_OK else f"llama.cpp: {eng.error}"
        return build_record(spec, case, env, model, eng, None, 0.0, "skipped", reason)
    if unfit_now:             # read again right before it: other programs take memory meanwhile
        return build_record(spec, case, env, model, eng, None, 0.0, "skipped", unfit_now)
    if spec.engine == ENGINE_LLAMA_BENCH:
        from edgekv.orchestration.llamabench import run_llama_bench_case

        base = build_record(spec, case, env, model, None, None, 0.0, "ok", None)
        return run_llama_bench_case(spec, case, env, base, gpu_probe, emit)
    if spec.engine == ENGINE_SERVER:
        from edgekv.orchestration.serving import run_server_case

        base = build_record(spec, case, env, model, eng, None, 0.0, "ok", None)
        return run_server_case(spec, case, base, gpu_probe, emit)
    return _run_python_case(spec, case, env, model, eng, gpu_probe, emit)


def _run_locked(spec: SweepSpec, writer: R.ResultsWriter, cases: list[Case], sha: str | None,
                env: dict[str, Any] | None, force: bool, emit: Callable[[str, dict[str, Any]], None],
                t0: float) -> SweepResult:
    """The sweep under the results lock: environment, plan, then each case still to do, its record appended as
    soon as it is known (a KeyboardInterrupt stops the loop; the records written so far stay)."""
    from edgekv.edges.environment import nvml_process_probe

    output = writer.path
    env = _sweep_environment(spec, writer, env, sha, force, emit)
    existing = writer.existing
    done_keys, retry = resume_keys(existing, spec.retry_failed)
    todo = [c for c in cases if c.key not in done_keys]
    engine_results, processes, speeds, tracker = _plan_sweep(spec, cases, todo, retry, env, sha, emit, output)

    model = model_block(spec.model, sha)
    gpu_probe = nvml_process_probe()
    records: list[dict[str, Any]] = []
    interrupted = False
    quality = None
    if spec.quality:
        from edgekv.orchestration.quality import for_sweep

        quality = for_sweep(spec, todo)
    try:
        for i, case in enumerate(todo):
            tracker.case_started(case.settings)
            emit("case", {"i": i, "n": len(todo), "case": case})
            rec = _case_record(spec, case, env, model, engine_results.get(case.key), processes.get(case.key), gpu_probe,
                               emit)
            attach_process(rec, processes.get(case.key) if rec["status"] != "skipped" else None)
            attach_speed(rec, speeds.get(case.key))
            if quality is not None and rec["status"] == "ok":
                rec["quality"] = quality(case, emit)
            wall, elapsed, remaining = tracker.case_done(rec, i)      # the record's load and plan blocks
            emit("record", {"i": i, "case": case, "record": rec, "wall_s": wall, "elapsed_s": elapsed,
                            "remaining_s": remaining})
            writer.append(rec)
            records.append(rec)
            emit("done", {"i": i, "n": len(todo), "record": rec})
    except KeyboardInterrupt:
        interrupted = True
    finally:
        tracker.close()
    return SweepResult(output, existing + records, len(cases) - len(todo), time.perf_counter() - t0, interrupted,
                       new=len(records))


def fit_check(spec: SweepSpec, case: Case, proc: Any) -> str | None:
    """Why a configuration is not started (its predicted peak plus the margin exceeds the memory available now,
    edgekv.core.fit), or None: it fits, nothing is known of the machine, or ``--force``.  Without a whole-process
    prediction the cache and the weights stand in for it, and the line says so."""
    from edgekv.core.fit import fits, unfit_reason
    from edgekv.edges.machine_memory import available_memory

    if spec.force_fit or case.prediction.status != STATUS_OK:
        return None
    peak = getattr(proc, "peak_rss_bytes", None)
    basis = "predicted peak"
    if not peak:
        peak, basis = case.prediction.total_bytes + spec.model.weights_bytes, "KV cache + weights (no whole-process prediction)"
    avail = available_memory()
    if avail is None or fits(peak, avail.bytes):
        return None
    return unfit_reason(peak, avail.bytes, avail.source, basis)


def child_outcome(child, case: Case) -> tuple[str, str | None, dict[str, Any] | None]:
    """(status, reason, failure block) of a measured child: ok; skipped when llama.cpp refused the context; else
    failed, with where and why (edgekv.core.diagnose): the phase, the signal, the last llama.cpp lines, and a
    known cause (llama.cpp's AMX crash, an OOM kill the kernel counted, the deadline)."""
    from edgekv.core.diagnose import diagnose

    res = child.result or {}
    if child.ok and res.get("status") == "ok":
        return "ok", None, None
    if child.ok and res.get("status") == "failed" and "effective" not in res and res.get("ctx_log"):
        return "skipped", f"llama.cpp refused the context: {res.get('reason')}", None
    if child.stopped_reason:            # the watchdog stopped it: say where, keep what was measured before
        d = diagnose(child.last_phase, None, None, False, child.log_tail, case.settings.get("n_prompt"))
        d.cause, d.cause_text = "memory-watchdog", child.stopped_reason
        return "failed", f"{child.stopped_reason} in {d.phase}" if d.phase else child.stopped_reason, d.to_dict()
    if child.ok:                        # the child said why (a llama.cpp error it caught): keep its words
        d = diagnose(child.last_phase, None, 0, False, child.log_tail, case.settings.get("n_prompt"))
        return "failed", res.get("reason") or "failed", d.to_dict()
    d = diagnose(child.last_phase, child.signal_name, None if child.signal is not None else child.returncode,
                 child.timed_out, child.log_tail, case.settings.get("n_prompt"), child.oom_kills_rose,
                 last_error=child.last_error())
    return "failed", d.line(), d.to_dict()


def _dry_runs(spec: SweepSpec, todo: list[Case]) -> dict[str, EngineResult]:
    """llama.cpp's own prediction for every configuration, from one dry-run session."""
    from edgekv.edges.engine import EngineSession
    from edgekv.errors import EngineError

    run = [c for c in todo if not c.prediction.aborts]
    if not run:
        return {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.n_gpu_layers, header=spec.model.header) as eng:
            res = eng.run([c.params for c in run])
    except EngineError:
        return {}
    return {c.key: r for c, r in zip(run, res)}


def process_predictions(spec: SweepSpec, todo: list[Case]) -> dict[str, Any]:
    """The whole-process prediction (workload ``bench``) for every configuration to run, keyed by case key.

    The runtime baseline is this environment's calibration (the llama-bench binary alone with
    ``--llama-bench``); llama.cpp's dry run supplies the workload's compute buffers."""
    from edgekv.core.memmodel import WORKLOAD_BENCH
    from edgekv.edges.engine import EngineSession
    from edgekv.errors import EngineError
    from edgekv.orchestration.calibrate import runtime_baseline
    from edgekv.orchestration.procpredict import ProcessSettings, predict_processes

    run = [c for c in todo if c.prediction.status == STATUS_OK and not c.prediction.aborts]
    if not run:
        return {}
    if spec.engine == ENGINE_LLAMA_BENCH:
        return _llama_bench_processes(spec, run)
    # the user's llama-server: the same process model over that binary's own runtime baseline
    baseline = runtime_baseline("binary", spec.llama_server) if spec.engine == ENGINE_SERVER else runtime_baseline()
    if spec.engine == ENGINE_SERVER:
        baseline.cpu_features = baseline.cpu_features or runtime_baseline().cpu_features
    out: dict[str, Any] = {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.n_gpu_layers, header=spec.model.header) as eng:
            for c in run:
                st = c.settings
                settings = ProcessSettings(workload=WORKLOAD_BENCH, n_threads=st["n_threads"], use_mmap=spec.use_mmap,
                                           use_extra_bufts=st.get("repack", True) is not False,
                                           n_gpu_layers=spec.n_gpu_layers, n_prompt=st["n_prompt"], n_gen=st["n_gen"],
                                           n_depth=st["n_depth"], n_parallel=st.get("n_parallel"),
                                           server_slots=st["n_seq_max"] if spec.engine == ENGINE_SERVER else 0,
                                           # the worker restores these caches from a state file (run_sweep's restore)
                                           restores_state_file=spec.model.shape.memory != MEMORY_KV and st["n_depth"] > 0)
                out[c.key] = predict_processes(spec.model, [c.params], settings, baseline, eng)[0]
    except EngineError as e:
        return {c.key: {"error": str(e)} for c in run}
    return out


def _llama_bench_processes(spec: SweepSpec, run: list[Case]) -> dict[str, Any]:
    """llama-bench runs one process per test with a context of depth + test tokens (swa_full off, one
    sequence) and keeps the depth state in memory: the prediction is the larger of the two processes, over
    the binary's own baseline."""
    from edgekv.core.memmodel import WORKLOAD_BENCH
    from edgekv.edges.engine import EngineSession
    from edgekv.errors import EngineError
    from edgekv.orchestration.calibrate import runtime_baseline
    from edgekv.orchestration.procpredict import ProcessSettings, predict_processes

    baseline = runtime_baseline("binary", spec.llama_bench)
    # the CPU features (which weights the CPU backend repacks) are the machine's: the Python runtime reports them
    baseline.cpu_features = baseline.cpu_features or runtime_baseline().cpu_features
    out: dict[str, Any] = {}
    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.n_gpu_layers, header=spec.model.header) as eng:
            for c in run:
                st = c.settings
                best = None
                for test, count in (("pp", st["n_prompt"]), ("tg", st["n_gen"])):
                    if count <= 0:
                        continue
                    params = replace(c.params, n_ctx=st["n_depth"] + count, swa_full=False, n_seq_max=1,
                                     kv_unified=False)
                    settings = ProcessSettings(workload=WORKLOAD_BENCH, n_threads=st["n_threads"], use_mmap=spec.use_mmap,
                                               use_extra_bufts=st.get("repack", True) is not False,
                                               n_gpu_layers=spec.n_gpu_layers,
                                               n_prompt=count if test == "pp" else 0, n_gen=count if test == "tg" else 0,
                                               n_depth=st["n_depth"], keeps_depth_state=st["n_depth"] > 0)
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
                      emit: Callable[[str, dict[str, Any]], None]) -> dict[str, dict[str, Any]]:
    """``prediction.speed`` for every configuration to run (edgekv.core.speed), keyed by case key.  The
    calibration is this machine's (cached; what it lacks is measured now, and that is said before the plan);
    llama.cpp's graph size comes from the configuration's dry run (one is run when the sweep has none)."""
    from edgekv.orchestration.calibrate import runtime_baseline
    from edgekv.orchestration.speedpredict import SpeedInputs, calibration_for, model_speed_shape, speed_block

    run = [c for c in todo if c.prediction.status == STATUS_OK and not c.prediction.aborts]
    out: dict[str, dict[str, Any]] = {c.key: {"calibration_id": None, "error": BATCHED_NOT_PREDICTED}
                                      for c in run if c.settings.get("n_parallel")}
    run = [c for c in run if not c.settings.get("n_parallel")]
    if not run:
        return out
    graph = next((r.log.graph for r in engine_results.values() if r.ok and r.log.graph), None)
    if graph is None:
        graph = _graph_from_dry_run(spec, run[0])
    feats = runtime_baseline().cpu_features
    groups: dict[tuple[int, bool], list[Case]] = {}
    for c in run:
        x = SpeedInputs.from_settings(c.settings)
        groups.setdefault((x.n_threads, x.repack), []).append(c)
    for (_threads, repack), cases in groups.items():
        sh = model_speed_shape(spec.model, feats, repack, graph)
        xs = [SpeedInputs.from_settings(c.settings) for c in cases]
        def progress(step: str, started: list[str] = []) -> None:  # noqa: B006 - one list per group, on purpose
            if not started:       # the first measurement: say why the plan is a minute away
                emit("note", {"message": "calibrating this machine's speed for the speed model (once per environment, "
                                         "thread count and --repack; about a minute, several for wide attention heads; "
                                         "'edgekv calibrate' re-measures)"})
                started.append(step)
            emit("calibrate", {"step": step})

        cal, note = calibration_for(sh, xs, feats, progress=progress, allow_busy=True)
        if note:
            emit("note", {"message": f"speed calibration: {note}"})
        for c, x in zip(cases, xs):
            out[c.key] = speed_block(sh, cal, x, note if cal is None else None)
    return out


def _graph_from_dry_run(spec: SweepSpec, case: Case) -> dict[str, int] | None:
    from edgekv.edges.engine import EngineSession
    from edgekv.errors import EngineError

    try:
        with EngineSession(spec.model.ref.path, n_gpu_layers=spec.n_gpu_layers, header=spec.model.header) as eng:
            (r,) = eng.run([case.params])
        return r.log.graph if r.ok else None
    except EngineError:
        return None


def attach_speed(rec: dict[str, Any], block: dict[str, Any] | None) -> None:
    """``prediction.speed`` and the residual (measured - predicted, %) in a record."""
    from edgekv.orchestration.speedpredict import residual

    if block is None or rec["status"] == "skipped":
        rec["prediction"].setdefault("speed", None)
        return
    rec["prediction"]["speed"] = block
    res = residual(rec)
    if res is not None:
        rec["speed_residual"] = res


def attach_process(rec: dict[str, Any], proc: Any) -> None:
    """``prediction.process`` and the residual (measured - predicted) in a record."""
    if proc is None:                    # skipped, or not predictable (invalid cache): predicted nothing
        rec["prediction"].setdefault("process", None)
        return
    if isinstance(proc, dict):          # the dry run failed: say so, predict nothing
        rec["prediction"]["process"] = {"peak_rss_bytes": None, "error": proc.get("error")}
        return
    d = proc.to_dict()
    rec["prediction"]["process"] = d
    measured = (rec.get("memory") or {}).get("peak_rss_bytes")
    if measured and d.get("peak_rss_bytes"):
        diff = measured - d["peak_rss_bytes"]
        rec["memory_residual"] = {"peak_rss_bytes": diff, "peak_rss_pct": round(100.0 * diff / d["peak_rss_bytes"], 3),
                                  "workload": d["workload"]}
