"""A sweep's record of one finished configuration: the formula and llama.cpp's predictions, llama.cpp's log of
the measured run, what the OS measured, measured minus predicted, and the outcome of the child (ok, skipped or
failed, with where and why); the whole-process and speed predictions are attached to it with their residuals."""

from __future__ import annotations

import time
from typing import Any

from edgekv.core.llamacmd import llama_cpp_args
from edgekv.core.llamalog import KVCacheLine, LlamaMemoryLog, device_mib
from edgekv.core.predict import STATUS_OK, KVPrediction
from edgekv.core.units import MIB
from edgekv.edges.engine import EngineResult
from edgekv.orchestration.crosscheck import compare, engine_block, engine_lines
from edgekv.orchestration.sweepspec import Case, SweepSpec
from edgekv.records import results as R
from edgekv.records.schema import growth_minus_formula_bytes, speed_test


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
