"""Results as a pandas DataFrame: one row per configuration, flat columns with units, one column per provenance.

Column names end with their unit (``_bytes``, ``_mib``, ``_pct``, ``_s``, ``_tokens_per_s``) and, where the
same quantity can come from more than one source, with that source: ``_formula`` (predicted from the GGUF
header), ``_llamacpp_dryrun`` (llama.cpp's dry run), ``_llamacpp`` (llama.cpp's log in the measured run),
``_predicted`` (the whole-process model, :mod:`edgekv.core.memmodel`), ``_measured`` (the OS / timers).
Differences name both sides (``..._minus_formula_bytes``).  A column is empty (NaN/None) where its
source did not run.  :data:`COLUMNS` is the column list, in order.

:func:`frame_rows` is the one flattener of records into rows: ``edgekv.results_frame`` (notebooks) and
``edgekv report`` (its tables, plots and results.csv / results.json) both read its rows.  Savings against
f16 need the f16 record of the same configuration, so they are filled in over a list of records.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from msgspec import UNSET

from edgekv import heavy
from edgekv.core.llamalog import device_mib, off_device_text
from edgekv.core.units import MIB
from edgekv.records.results import KEY_SETTINGS, load_records
from edgekv.records.schema import Record, growth_minus_formula_bytes

COLUMNS = (
    # identity and settings (what was asked)
    "file", "kind", "status", "reason", "model_name", "model_sha256", "arch", "machine", "device", "engine", "n_ctx",
    "type_k", "type_v", "flash_attn", "n_seq_max", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "n_prompt",
    "n_gen", "n_depth", "repetitions", "no_mmap", "repack", "n_parallel", "time_utc",
    # the code that wrote the record (schema 4; None: unknown)
    "edgekv_commit", "edgekv_dirty",
    # what llama.cpp used
    "flash_attn_llamacpp", "n_ctx_llamacpp", "ops_off_device_llamacpp",
    # KV cache (every cache: KV + recurrent + state): formula, llama.cpp's dry run, llama.cpp's log in the measured run
    "kv_bytes_formula", "kv_mib_formula", "kv_mib_llamacpp_dryrun", "kv_mib_llamacpp", "kv_buffer_mib_llamacpp",
    "kv_cache_lines_llamacpp", "kv_matches_formula_llamacpp", "kv_diffs_llamacpp", "kv_on_device_llamacpp",
    "kv_saving_vs_f16_formula", "compute_mib_llamacpp", "output_mib_llamacpp",
    # whole process: predicted vs measured
    "peak_rss_bytes_predicted", "peak_rss_bytes_measured", "kernel_maxrss_bytes_measured", "peak_gpu_bytes_measured",
    "peak_rss_residual_bytes", "peak_rss_residual_pct",
    "context_anon_growth_bytes_measured", "context_anon_growth_minus_formula_bytes",
    "context_anon_growth_minus_formula_pct",
    "context_gpu_growth_bytes_measured", "gpu_compute_buffer_mib_llamacpp",
    "context_gpu_growth_minus_compute_minus_formula_bytes", "context_gpu_growth_minus_compute_minus_formula_pct",
    "anon_after_fill_bytes_measured", "file_after_fill_bytes_measured", "peak_footprint_bytes_measured",
    "peak_rss_saving_vs_f16_measured",
    # speed, measured (llama-bench's own average where it ran)
    "pp_n_tokens", "pp_tokens_per_s_mean", "pp_tokens_per_s_stdev", "pp_tokens_per_s_ci95_low",
    "pp_tokens_per_s_ci95_high", "pp_tokens_per_s_cv", "pp_n_samples", "pp_unstable",
    "tg_n_tokens", "tg_tokens_per_s_mean", "tg_tokens_per_s_stdev", "tg_tokens_per_s_ci95_low",
    "tg_tokens_per_s_ci95_high", "tg_tokens_per_s_cv", "tg_n_samples", "tg_unstable",
    "pp_tokens_per_s_llamabench", "tg_tokens_per_s_llamabench",
    # -npl: each sequence's decode while all decode (pp/tg above are then the aggregate of all sequences)
    "tg_seq_tokens_per_s_mean", "tg_seq_tokens_per_s_ci95_low", "tg_seq_tokens_per_s_ci95_high",
    # --llama-server: the client's time to first token and the rounds' throughput (prefill included)
    "ttft_p50_s_measured", "ttft_p95_s_measured", "serving_tokens_per_s_measured", "serving_failed_requests",
    "wall_s_measured",
    # speed, predicted before the run (edgekv.core.speed; schema 3): llama-bench's pp and tg at the record's depth
    "pp_tokens_per_s_predicted", "tg_tokens_per_s_predicted", "tg_roofline_tokens_per_s_predicted",
    "speed_calibration_id",
    # other work on the machine during the run (edgekv bench), measured
    "machine_busy", "others_cpu_share_pct",
    # quality, measured against the f16 cache
    "quality_status", "quality_error", "ppl", "ppl_err", "base_ppl", "ppl_delta_pct", "ppl_ratio", "kld_mean",
    "kld_mean_err", "kld_p99", "same_top_rate",
)


def unset_none(x: Any) -> Any:
    """A field a record does not hold (msgspec's UNSET) as None: shown as a dash, never filled in from another source."""
    return None if x is UNSET else x


_v = unset_none


def repack_of(settings: Any) -> bool:
    """A record's --repack (use_extra_bufts): records written before the setting existed ran llama.cpp's default, on."""
    v = unset_none(getattr(settings, "repack", UNSET))
    return True if v is None else bool(v)


def _mib_total(d: Any) -> float | None:
    """The sum of llama.cpp's per-buffer-type MiB; None where it printed none."""
    return sum(d.values()) if d is not None and d is not UNSET and d else None


def _mib_sum(d: Any) -> float | None:
    """That sum to llama.cpp's 0.01 MiB."""
    t = _mib_total(d)
    return None if t is None else round(t, 2)


def machine_label(rec: Record) -> str | None:
    """The machine a record was measured on: the ``machine`` column merge keeps, else the host name."""
    if _v(rec.machine):
        return str(rec.machine)
    return rec.environment.machine_id or None


def device_label(rec: Record) -> str:
    """'machine: devices (backends)', the column a multi-machine report shows; '-' for predictions."""
    if rec.kind == "predict":
        return "-"
    env = rec.environment
    devs = ", ".join(env.devices) if env.devices else (env.cpu_model or "?")
    back = "+".join(env.backends) if env.backends else None
    name = machine_label(rec)
    s = f"{devs} ({back})" if back else str(devs)
    return f"{name}: {s}" if name else s


def code_label(rec: Record) -> str:
    """The edgekv code that wrote a record, as reports and compare print it: ``3f32cba``, ``3f32cba-dirty``, or
    ``unknown`` (written before records carried it, or edgekv could not tell)."""
    env = rec.environment
    commit = _v(env.edgekv_commit)
    if not commit:
        return "unknown"
    return str(commit)[:7] + ("-dirty" if _v(env.edgekv_dirty) else "")


def _identity(rec: Record, file: str | None) -> dict[str, Any]:
    s, m, eff = rec.settings, rec.model, _v(rec.effective)
    return {
        "file": file, "kind": rec.kind, "status": rec.status, "reason": rec.reason, "model_name": _v(m.name),
        "model_sha256": _v(m.sha256), "arch": _v(m.arch), "machine": _v(rec.machine), "device": device_label(rec),
        "engine": s.engine, "n_ctx": s.n_ctx, "type_k": s.type_k, "type_v": s.type_v, "flash_attn": s.flash_attn,
        "n_seq_max": s.n_seq_max, "n_batch": s.n_batch, "n_ubatch": s.n_ubatch, "n_threads": s.n_threads,
        "n_gpu_layers": s.n_gpu_layers, "n_prompt": s.n_prompt, "n_gen": s.n_gen, "n_depth": s.n_depth,
        "repetitions": s.repetitions, "no_mmap": bool(_v(s.no_mmap)), "repack": repack_of(s),
        "n_parallel": _v(s.n_parallel),
        "time_utc": _v(rec.time_utc),
        "edgekv_commit": _v(rec.environment.edgekv_commit), "edgekv_dirty": _v(rec.environment.edgekv_dirty),
        "flash_attn_llamacpp": _v(eff.flash_attn) if eff is not None else None,
        # the context llama.cpp built: -c, or llama-bench's own (depth + its prompt test's tokens)
        "n_ctx_llamacpp": _v(eff.n_ctx) if eff is not None else None,
        "ops_off_device_llamacpp": off_device_text(off_device_of(rec)),
    }


def off_device_of(rec: Record) -> list[dict[str, Any]] | None:
    """The dry run's ops that the scheduler put off their offloaded layer's device (prediction.engine.off_device)."""
    pred = _v(rec.prediction)
    eng = _v(pred.engine) if pred is not None else None
    return _v(eng.off_device) if eng is not None else None


def _kv(rec: Record) -> dict[str, Any]:
    """The caches: formula, llama.cpp's dry run and its log in the run (KV + recurrent + state, as the formula's total)."""
    p = _v(rec.prediction)
    kv = p.formula.total_bytes if p is not None else None
    eng = _v(p.engine) if p is not None else None
    log, dif = _v(rec.llama_log), _v(rec.differences)
    eng_mib = _v(eng.kv_mib) if eng is not None else None
    run_mib = log.kv_mib if log is not None else None
    kv_bufs = _v(log.kv_buffers_mib) if log is not None else None
    rs_bufs = _v(log.rs_buffers_mib) if log is not None else None
    return {
        "kv_bytes_formula": kv, "kv_mib_formula": kv / MIB if kv is not None else None,
        "kv_mib_llamacpp_dryrun": (eng_mib + (_v(eng.recurrent_mib) or 0) + (_v(eng.state_mib) or 0)
                                   if eng_mib is not None else None),
        "kv_mib_llamacpp": run_mib + (_v(log.recurrent_mib) or 0) if run_mib is not None else None,
        "kv_buffer_mib_llamacpp": (round((_mib_total(kv_bufs) or 0) + (_mib_total(rs_bufs) or 0), 2)
                                   if kv_bufs is not None else None),
        "kv_cache_lines_llamacpp": (len(log.kv) if log is not None else 0) or None,
        "kv_matches_formula_llamacpp": _v(dif.llama_kv_matches_formula) if dif is not None else None,
        "kv_diffs_llamacpp": _v(dif.llama_kv_diffs) if dif is not None else None,
        # KV on a GPU: the host's anonymous memory does not hold it (compared with the device's growth instead)
        "kv_on_device_llamacpp": bool(device_mib(kv_bufs) + device_mib(rs_bufs)) if log is not None else None,
        "kv_saving_vs_f16_formula": None,          # filled in by frame_rows (needs the f16 record)
        "compute_mib_llamacpp": _mib_sum(log.compute_mib) if log is not None else None,
        "output_mib_llamacpp": _mib_sum(_v(log.output_mib)) if log is not None else None,
    }


def _pct(part: int | None, whole: int | None) -> float | None:
    return 100.0 * part / whole if part is not None and whole else None


def _process(rec: Record, kv: dict[str, Any]) -> dict[str, Any]:
    """Whole-process memory: predicted, measured by the OS, and what creating the context added (host, device)."""
    p, mem, dif, res = _v(rec.prediction), _v(rec.memory), _v(rec.differences), _v(rec.memory_residual)
    proc = _v(p.process) if p is not None else None
    kv_bytes = kv["kv_bytes_formula"]

    def m(name: str) -> Any:
        return _v(getattr(mem, name)) if mem is not None else None

    def d(name: str) -> Any:
        return _v(getattr(dif, name)) if dif is not None else None

    a_load, a_ctx = m("anon_after_load_bytes"), m("anon_after_context_bytes")
    growth = a_ctx - a_load if a_load is not None and a_ctx is not None else None
    gmf = None if kv["kv_on_device_llamacpp"] else growth_minus_formula_bytes(growth, kv_bytes)
    g_compute, g_gmf = d("gpu_compute_buffer_bytes"), d("context_gpu_growth_minus_compute_minus_formula_bytes")
    return {
        "peak_rss_bytes_predicted": proc.peak_rss_bytes if proc is not None else None,
        "peak_rss_bytes_measured": m("peak_rss_bytes"), "kernel_maxrss_bytes_measured": m("kernel_maxrss_bytes"),
        "peak_gpu_bytes_measured": m("peak_gpu_bytes"),
        "peak_rss_residual_bytes": res.peak_rss_bytes if res is not None else None,
        "peak_rss_residual_pct": res.peak_rss_pct if res is not None else None,
        "context_anon_growth_bytes_measured": growth, "context_anon_growth_minus_formula_bytes": gmf,
        "context_anon_growth_minus_formula_pct": _pct(gmf, kv_bytes),
        "context_gpu_growth_bytes_measured": d("context_gpu_growth_bytes"),
        "gpu_compute_buffer_mib_llamacpp": g_compute / MIB if g_compute is not None else None,
        "context_gpu_growth_minus_compute_minus_formula_bytes": g_gmf,
        "context_gpu_growth_minus_compute_minus_formula_pct": _pct(g_gmf, kv_bytes),
        "anon_after_fill_bytes_measured": m("anon_after_fill_bytes"),
        "file_after_fill_bytes_measured": m("file_after_fill_bytes"),
        "peak_footprint_bytes_measured": m("peak_footprint_bytes"),
        "peak_rss_saving_vs_f16_measured": None,   # filled in by frame_rows (needs the f16 record)
    }


def _speed(rec: Record) -> dict[str, Any]:
    """Tokens per second per test: mean, its 95% interval, spread and samples (measured)."""
    speed, out = _v(rec.speed), {}
    for test in ("pp", "tg"):
        t = _v(getattr(speed, test)) if speed is not None else None
        ci = (t.ci95_ts if t is not None else None) or [None, None]     # an older record's: fixed on upgrade (v4)
        out.update({
            f"{test}_n_tokens": t.n_tokens if t is not None else None,
            f"{test}_tokens_per_s_mean": t.mean_ts if t is not None else None,
            f"{test}_tokens_per_s_stdev": t.stdev_ts if t is not None else None,
            f"{test}_tokens_per_s_ci95_low": ci[0], f"{test}_tokens_per_s_ci95_high": ci[1],
            f"{test}_tokens_per_s_cv": t.cv if t is not None else None,
            f"{test}_n_samples": (len(t.samples_ts) or None) if t is not None else None,
            f"{test}_unstable": t.unstable if t is not None else None,
            f"{test}_tokens_per_s_llamabench": _v(t.llama_bench_avg_ts) if t is not None else None,
        })
    seq = _v(speed.tg_seq) if speed is not None else None
    ci = (seq.ci95_ts if seq is not None else None) or [None, None]
    out.update({"tg_seq_tokens_per_s_mean": seq.mean_ts if seq is not None else None,
                "tg_seq_tokens_per_s_ci95_low": ci[0], "tg_seq_tokens_per_s_ci95_high": ci[1]})
    sv = _v(rec.serving)
    out.update({"ttft_p50_s_measured": sv.ttft_p50_s if sv is not None else None,
                "ttft_p95_s_measured": sv.ttft_p95_s if sv is not None else None,
                "serving_tokens_per_s_measured": sv.throughput_ts if sv is not None else None,
                "serving_failed_requests": sv.n_failed if sv is not None else None})
    out.update(_speed_predicted(rec))
    load = _v(rec.load)
    out["wall_s_measured"] = rec.timing.wall_s if _v(rec.timing) is not None else None
    out["machine_busy"] = load.busy if load is not None else None
    out["others_cpu_share_pct"] = 100.0 * load.others_share_max if load is not None else None
    return out


def _speed_predicted(rec: Record) -> dict[str, Any]:
    """The speed model's tokens/s for the record's tests and the decode bound (predicted; None: not predicted)."""
    p = _v(rec.prediction)
    sp = _v(p.speed) if p is not None else None
    out: dict[str, Any] = {"speed_calibration_id": sp.calibration_id if sp is not None else None}
    for test in ("pp", "tg"):
        t = _v(getattr(sp, test)) if sp is not None else None
        out[f"{test}_tokens_per_s_predicted"] = t.tokens_per_s if t is not None else None
        if test == "tg":
            out["tg_roofline_tokens_per_s_predicted"] = t.roofline_tokens_per_s if t is not None else None
    return out


def _quality(rec: Record) -> dict[str, Any]:
    q = _v(rec.quality)
    st = q.quality if q is not None else None
    out: dict[str, Any] = {"quality_status": q.status if q is not None else None,
                           "quality_error": q.error if q is not None else None}
    for k in ("ppl", "ppl_err", "base_ppl", "ppl_ratio", "kld_mean", "kld_mean_err", "kld_p99", "same_top_rate"):
        out[k] = getattr(st, k) if st is not None else None
    ppl, base = out["ppl"], out["base_ppl"]
    out["ppl_delta_pct"] = 100.0 * (ppl / base - 1) if ppl and base else None
    return out


def row(rec: Record, file: str | None = None) -> dict[str, Any]:
    """One record -> one flat row (keys: :data:`COLUMNS`); the savings vs f16 stay empty (see :func:`frame_rows`)."""
    kv = _kv(rec)
    out = {**_identity(rec, file), **kv, **_process(rec, kv), **_speed(rec), **_quality(rec)}
    return {k: out[k] for k in COLUMNS}


def group_key(rec: Record) -> tuple:
    """Everything that must agree for an f16 record to be another record's baseline (all but the cache types)."""

    s = rec.settings
    rest = tuple(str(_v(getattr(s, k))) for k in KEY_SETTINGS if k not in ("type_k", "type_v", "quality", "repetitions"))
    rest += (str(repack_of(s)),)
    return (_v(rec.model.sha256) or _v(rec.model.path), device_label(rec), rec.kind, rest, _v(s.test))


def frame_rows(records: Sequence[Record], files: Sequence[str | None] | None = None) -> list[dict[str, Any]]:
    """Rows of :data:`COLUMNS`, one per record, in the order given, with the savings against the f16/f16 record of
    the same configuration (:func:`group_key`; the first such ok record in the order given)."""
    rows = [row(r, files[i] if files is not None else None) for i, r in enumerate(records)]
    keys = [group_key(r) for r in records]
    base: dict[tuple, dict[str, Any]] = {}
    for k, x in zip(keys, rows):
        if x["type_k"] == "f16" and x["type_v"] == "f16" and x["status"] == "ok":
            base.setdefault(k, x)
    for k, x in zip(keys, rows):
        b = base.get(k)
        if b is None or x["status"] != "ok":
            continue
        for col, saving in (("kv_bytes_formula", "kv_saving_vs_f16_formula"),
                            ("peak_rss_bytes_measured", "peak_rss_saving_vs_f16_measured")):
            if b[col] and x[col]:
                x[saving] = b[col] / x[col]
    return rows


def load_results(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Record]:
    """Every record of one or more edgekv results files (upgraded, strictly decoded)."""

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [r for p in paths for r in load_records(p)]


def results_frame(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """One row per configuration (:data:`COLUMNS`), for notebooks: ``edgekv.results_frame("sweep.jsonl")``."""
    pd = heavy.pandas()


    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    recs, files = [], []
    for p in paths:
        for r in load_records(p):
            recs.append(r)
            files.append(str(p))
    # nullable integer/boolean columns: a byte count stays an integer where another row has none
    return pd.DataFrame(frame_rows(recs, files), columns=list(COLUMNS)).convert_dtypes()
