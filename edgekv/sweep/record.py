"""A sweep's record of one finished configuration: the formula and llama.cpp's predictions, llama.cpp's log of
the measured run, what the OS measured, measured minus predicted, and the outcome of the child (ok, skipped or
failed, with where and why); the whole-process and speed predictions are attached to it with their residuals."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from msgspec import UNSET

from edgekv.core.benchwire import REPLY_FAILED, REPLY_OK, BenchReply, BenchSamples, Checkpoint, Samples, reply_from
from edgekv.core.diagnose import Diagnosis, diagnose
from edgekv.core.llamacmd import llama_cpp_args
from edgekv.core.llamalog import KVCacheLine, LlamaMemoryLog, device_mib
from edgekv.core.predict import STATUS_OK, KVPrediction, formula_block
from edgekv.core.units import MIB
from edgekv.prediction.crosscheck import compare, engine_block, engine_lines
from edgekv.prediction.speed import residual
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.records.frame import unset_none
from edgekv.records.schema import growth_minus_formula_bytes, speed_test
from edgekv.runtime.engine import EngineResult
from edgekv.sweep.spec import Case, SweepSpec
from edgekv.version import __version__


def decode_reply(child) -> tuple[BenchReply | None, str | None]:
    """The bench child's reply, decoded strictly where it enters the sweep (None: it sent none), and why not where
    what it sent is not a :class:`~edgekv.core.benchwire.BenchReply` (one line, said as the case's reason)."""
    if child is None or child.result is None:
        return None, None
    try:
        return reply_from(child.result), None
    except msgspec.ValidationError as e:
        return None, (f"the bench child's reply is not one this edgekv reads ({e}): the child and the parent come from "
                      "different edgekv installs; reinstall edgekv")


def _prediction_block(pred: KVPrediction, eng: EngineResult | None) -> S.Prediction:
    formula = formula_block(pred)
    if eng is None:
        return S.Prediction(formula=formula)
    return S.Prediction(formula=formula, engine=msgspec.convert(engine_block(pred, eng), S.Engine, strict=True))


def _speed_test(v: Samples | None) -> Any:
    return UNSET if v is None else speed_test(v.n_tokens, v.samples_ns, v.samples_ts)


def _speed_block(samples: BenchSamples) -> S.Speed:
    return S.Speed(pp=_speed_test(samples.pp), tg=_speed_test(samples.tg), tg_seq=_speed_test(samples.tg_seq))


def cache_lines(res: EngineResult) -> list[S.CacheLine]:
    """llama.cpp's cache lines of a parsed log as the schema's :class:`~edgekv.records.schema.CacheLine`."""
    return [msgspec.convert(x, S.CacheLine, strict=True) for x in engine_lines(res)]


def build_record(spec: SweepSpec, case: Case, env: S.Environment, model: S.Model, eng: EngineResult | None,
                 child, wall_s: float, status: str, reason: str | None, res: BenchReply | None = None) -> S.BenchRecord:
    """One case's record: what was asked and predicted, then (``child``: the parent's view of the measured child,
    ``res``: the child's reply) what was measured."""
    rec = S.BenchRecord(
        schema_version=R.SCHEMA_VERSION, config_key=case.key, status=status, reason=reason,
        time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), edgekv=__version__, model=model,
        settings=case.settings, prediction=_prediction_block(case.prediction, eng), environment=env,
        llama_cpp_args=llama_cpp_args(S.encode_block(case.settings), model.path))
    if res is not None:
        _measured_blocks(rec, case, res, wall_s)
    if child is not None:
        rec.memory = memory_block(child, res)
        if res is not None and rec.llama_log not in (UNSET, None):
            rec.differences = differences(case, rec)
    return rec


def _effective_block(case: Case, res: BenchReply) -> S.Effective:
    """The sizes llama.cpp chose and, from its log, the flash attention it resolved."""
    e, ctx_log = res.effective, res.ctx_log
    out = S.Effective() if e is None else S.Effective(
        n_ctx=e.n_ctx, n_batch=e.n_batch, n_ubatch=e.n_ubatch, n_seq_max=e.n_seq_max,
        n_ctx_seq=UNSET if e.n_ctx_seq is None else e.n_ctx_seq)
    if ctx_log is not None:
        fa = case.prediction.flash_attn_effective
        out.flash_attn = ctx_log.fa_resolved or ("enabled" if fa == "on" else "disabled" if fa == "off" else None)
        out.flash_attn_forced_for_quantized_v = ctx_log.fa_forced_for_quantized_v
    return out


def _timing_block(res: BenchReply, wall_s: float) -> S.Timing:
    t = res.timing
    v = lambda x: UNSET if x is None else x       # noqa: E731 - a phase the run did not reach: absent
    llama_s = t.llama_s()
    return S.Timing(import_s=v(t.import_s), load_s=v(t.load_s), context_s=v(t.context_s), warmup_s=v(t.warmup_s),
                    fill_s=v(t.fill_s), fill_from=v(t.fill_from), pp_s=v(t.pp_s), tg_s=v(t.tg_s),
                    child_total_s=v(t.child_total_s), timed_s=v(t.timed_s), wall_s=wall_s, llama_s=llama_s,
                    harness_s=max(0.0, wall_s - llama_s))


def _measured_blocks(rec: S.BenchRecord, case: Case, res: BenchReply, wall_s: float) -> None:
    """What the child measured and llama.cpp printed: ``effective``, ``llama_log``, ``speed``, ``timing``."""
    ctx_log = res.ctx_log
    if ctx_log is not None:
        load_log = res.load_log
        rec.llama_log = S.LlamaLog(
            kv=cache_lines(EngineResult(case.params, ok=True, log=ctx_log)),
            kv_mib=round(ctx_log.kv_mib_total, 2), recurrent_mib=round(ctx_log.recurrent_mib_total, 2),
            kv_buffers_mib=ctx_log.kv_buffers, rs_buffers_mib=ctx_log.rs_buffers, compute_mib=ctx_log.compute_buffers,
            output_mib=ctx_log.output_buffers, model_buffers_mib=load_log.model_buffers if load_log else None,
            gpu_layers=list(load_log.gpu_layers) if load_log and load_log.gpu_layers else None,
            device_notes=list(res.device_notes))
    rec.effective = _effective_block(case, res)
    rec.speed = _speed_block(res.samples)
    rec.timing = _timing_block(res, wall_s)
    rec.restore = res.restore
    if res.snapshot_bytes:
        rec.snapshot_bytes = res.snapshot_bytes


HARNESS_PHASES = frozenset({"snapshot", "restore"})   # the harness's own state save/restore, not the model's


def _reading(c: Checkpoint | None) -> tuple[Any, Any, Any]:
    """A checkpoint's (rss, anon, gpu_used) as the record holds them: absent where the run did not get there (and
    the device memory absent where there is no accelerator)."""
    if c is None:
        return UNSET, UNSET, UNSET
    return c.rss, c.anon, UNSET if c.gpu_used is None else c.gpu_used


def memory_block(child, res: BenchReply | None) -> S.Memory:
    peaks = dict(child.phase_peaks)
    # The working set of a model in use at this context: every phase of the run (load, context, warm-up,
    # fill, the timed tests) except the moments the harness saves and restores its depth state (caches
    # that cannot be truncated back to depth), when llama.cpp passes one layer's rows through a buffer.
    work = [v for k, v in peaks.items() if k not in HARNESS_PHASES]
    m = S.Memory(
        peak_rss_bytes=max(work) if work else child.peak_rss_bytes,
        peak_rss_all_phases_bytes=child.peak_rss_bytes,
        kernel_maxrss_bytes=child.kernel_maxrss_bytes,
        peak_footprint_bytes=child.peak_footprint_bytes,
        peak_gpu_bytes=child.peak_gpu_bytes,
        phase_peaks_bytes=peaks,
        gpu_phase_peaks_bytes=dict(getattr(child, "gpu_phase_peaks", None) or {}) or None,
        n_samples=child.n_samples,
        sample_interval_mean_s=child.wall_s / child.n_samples if child.n_samples else None,
        sample_interval_max_s=child.sample_interval_max_s,
        # during the timed tests the parent does not sample (it would slow llama.cpp down); the child reads its
        # own RSS after each repetition instead
        timed_unsampled_s=getattr(child, "timed_unsampled_s", None),
        n_child_samples=getattr(child, "n_child_samples", None))
    if res is None:
        return m
    cps = res.checkpoints
    m.rss_start_bytes, m.anon_start_bytes, m.gpu_used_start_bytes = _reading(cps.start)
    m.rss_after_load_bytes, m.anon_after_load_bytes, m.gpu_used_after_load_bytes = _reading(cps.after_load)
    m.rss_after_context_bytes, m.anon_after_context_bytes, m.gpu_used_after_context_bytes = _reading(cps.after_context)
    m.rss_after_fill_bytes, m.anon_after_fill_bytes, m.gpu_used_after_fill_bytes = _reading(cps.after_fill)
    m.rss_end_bytes, m.anon_end_bytes, m.gpu_used_end_bytes = _reading(cps.end)
    fill = cps.after_fill
    if fill is not None and fill.rss is not None and fill.anon is not None:
        m.file_after_fill_bytes = fill.rss - fill.anon
    return m


def differences(case: Case, rec: S.BenchRecord) -> S.Differences:
    """Measured minus predicted, where both exist.

    The KV (and recurrent) buffers are cleared when llama.cpp creates them, so they are resident from
    the moment the context exists: the anonymous memory the context adds should be the predicted cache
    bytes plus small buffers.  Compute buffers are reservations: only the pages a graph touches become
    resident, so their measured share is reported, not compared.
    """
    pred = case.prediction
    log = rec.llama_log
    mem = rec.memory if isinstance(rec.memory, S.Memory) else S.Memory(peak_rss_bytes=None, kernel_maxrss_bytes=None,
                                                                      peak_gpu_bytes=None)
    d = S.Differences()
    if pred.status != STATUS_OK:
        return d
    # llama.cpp's own cache lines in the measured run vs the formula, field by field
    eng = EngineResult(case.params, ok=True, log=LlamaMemoryLog(caches=[_line(x) for x in log.kv]))
    diffs = compare(pred, eng)
    d.llama_kv_matches_formula = not diffs
    if diffs:
        d.llama_kv_diffs = diffs
    # "KV buffer size = %8.2f MiB": the real allocation, printed to 0.01 MiB (alignment and, on CUDA,
    # quantized-row padding can make it larger than the tensors' sum)
    kv_buf = sum((_mapping(log.kv_buffers_mib)).values()) + sum((_mapping(log.rs_buffers_mib)).values())
    d.kv_buffer_mib = round(kv_buf, 2)
    d.kv_buffer_minus_formula_mib = round(kv_buf - pred.total_bytes / MIB, 2)
    a_load, a_ctx, a_fill = (unset_none(x) for x in (mem.anon_after_load_bytes, mem.anon_after_context_bytes,
                                                     mem.anon_after_fill_bytes))
    if a_load is not None and a_ctx is not None:
        d.context_anon_growth_bytes = a_ctx - a_load
        d.context_anon_growth_minus_formula_bytes = growth_minus_formula_bytes(a_ctx - a_load, pred.total_bytes)
    compute = sum(_mapping(log.compute_mib).values())
    # KV on a GPU (CUDA, Vulkan, ...): the device memory in use (read by the child itself right after the
    # load and right after the context) grows by the KV buffers and the compute buffers, which ggml
    # allocates whole on a device (no lazy pages there)
    g_load, g_ctx = unset_none(mem.gpu_used_after_load_bytes), unset_none(mem.gpu_used_after_context_bytes)
    dev_kv = device_mib(_mapping(log.kv_buffers_mib)) + device_mib(_mapping(log.rs_buffers_mib))
    if dev_kv and g_load is not None and g_ctx is not None:
        dev_compute = device_mib(_mapping(log.compute_mib))
        growth = g_ctx - g_load
        d.context_gpu_growth_bytes = growth
        d.gpu_compute_buffer_bytes = int(round(dev_compute * MIB))
        d.context_gpu_growth_minus_compute_minus_formula_bytes = growth - d.gpu_compute_buffer_bytes - pred.total_bytes
    if a_ctx is not None and a_fill is not None:
        d.fill_anon_growth_bytes = a_fill - a_ctx
        if compute:
            d.compute_buffer_bytes = int(round(compute * MIB))
    return d


def _mapping(x: Any) -> dict[str, float]:
    return unset_none(x) or {}


def _int(block: Any, name: str) -> Any:
    return unset_none(getattr(block, name))


def _line(x: S.CacheLine) -> KVCacheLine:
    v = lambda k: _int(x, k)     # noqa: E731 - a field the line does not hold: None
    return KVCacheLine(kind=x.kind, role=v("role"), mib=x.mib, cells=x.cells, layers=v("layers") or 0, seqs=1,
                       streams=v("streams"), type_k=v("type_k"), type_v=v("type_v"), k_mib=v("k_mib"),
                       v_mib=v("v_mib"), r_mib=v("r_mib"), s_mib=v("s_mib"))


def child_outcome(child, case: Case, res: BenchReply | None) -> tuple[str, str | None, S.Failure | None]:
    """(status, reason, failure block) of a measured child: ok; skipped when llama.cpp refused the context; else
    failed, with where and why (edgekv.core.diagnose): the phase, the signal, the last llama.cpp lines, and a
    known cause (llama.cpp's AMX crash, an OOM kill the kernel counted, the deadline)."""
    res = res or BenchReply(status="")
    n_prompt = case.settings.n_prompt
    if child.ok and res.status == REPLY_OK:
        return "ok", None, None
    if child.ok and res.status == REPLY_FAILED and res.effective is None and res.ctx_log is not None:
        return "skipped", f"llama.cpp refused the context: {res.reason}", None
    if child.stopped_reason:            # the watchdog stopped it: say where, keep what was measured before
        d = diagnose(child.last_phase, None, None, False, child.log_tail, n_prompt)
        d.cause, d.cause_text = "memory-watchdog", child.stopped_reason
        return "failed", f"{child.stopped_reason} in {d.phase}" if d.phase else child.stopped_reason, failure_block(d)
    if child.ok:                        # the child said why (a llama.cpp error it caught): keep its words
        d = diagnose(child.last_phase, None, 0, False, child.log_tail, n_prompt)
        return "failed", res.reason or "failed", failure_block(d)
    d = diagnose(child.last_phase, child.signal_name, None if child.signal is not None else child.returncode,
                 child.timed_out, child.log_tail, n_prompt, child.oom_kills_rose, last_error=child.last_error())
    return "failed", d.line(), failure_block(d)


def failure_block(d: Diagnosis) -> S.Failure:
    """A :class:`~edgekv.core.diagnose.Diagnosis` as the record's ``failure`` block, field by field."""
    return S.Failure(phase=d.phase, signal=d.signal, exit_code=d.exit_code, timed_out=d.timed_out, cause=d.cause,
                     cause_text=d.cause_text, log_tail=list(d.log_tail), last_error=d.last_error)


def attach_speed(rec: S.BenchRecord, block: S.SpeedPrediction | None) -> None:
    """``prediction.speed`` and the residual (measured - predicted, %) in a record."""
    if block is None or rec.status == "skipped":
        if rec.prediction.speed is UNSET:
            rec.prediction.speed = None
        return
    rec.prediction.speed = block
    res = residual(rec)
    if res is not None:
        rec.speed_residual = res


def attach_process(rec: S.BenchRecord, proc: Any) -> None:
    """``prediction.process`` and the residual (measured - predicted) in a record."""
    if proc is None:                    # skipped, or not predictable (invalid cache): predicted nothing
        if rec.prediction.process is UNSET:
            rec.prediction.process = None
        return
    if isinstance(proc, dict):          # the dry run failed: say so, predict nothing
        rec.prediction.process = S.Process(peak_rss_bytes=None, error=proc.get("error"))
        return
    p = rec.prediction.process = S.process_block(proc)
    measured = rec.memory.peak_rss_bytes if isinstance(rec.memory, S.Memory) else None
    if measured and p.peak_rss_bytes:
        diff = measured - p.peak_rss_bytes
        rec.memory_residual = S.MemoryResidual(peak_rss_bytes=diff, peak_rss_pct=round(100.0 * diff / p.peak_rss_bytes, 3),
                                               workload=p.workload)
