"""results.csv / results.json: the report's export format, from the frame.  Measures nothing.

results.csv / results.json keep their own column names (``kv_predicted_bytes`` where the frame says
``kv_bytes_formula``): they are the report's stable export format, older than the notebook frame and read by users'
scripts, so :data:`EXPORT` maps each to its frame column, once.  :func:`report_rows` are the frame's rows
(:func:`edgekv.records.frame.frame_rows`) in the report's order (:func:`sort_key`), rounded as the report prints them,
which the report's tables, plots and exports all read (:mod:`edgekv.output.report`, :mod:`edgekv.output.render`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edgekv.core.cachetypes import CACHE_TYPES
from edgekv.records import frame as F
from edgekv.records.frame import unset_none as _v
from edgekv.records.results import as_record
from edgekv.records.schema import Record

# (results.csv column, frame column, digits the report prints it with; None: as it is).  The export's names
# are older than the notebook frame's (edgekv.records.frame.COLUMNS: unit and source in every name) and users'
# scripts read results.csv / results.json, so they stay as they are; this table is the one place the two sets
# of names meet.  The rounded figures are also what the tables and plots show.
EXPORT: tuple[tuple[str, str, int | None], ...] = (
    ("model", "model_name", None), ("model_sha256", "model_sha256", None), ("arch", "arch", None),
    ("device", "device", None), ("kind", "kind", None), ("status", "status", None), ("reason", "reason", None),
    ("n_ctx", "n_ctx", None), ("n_depth", "n_depth", None), ("type_k", "type_k", None), ("type_v", "type_v", None),
    ("flash_attn", "flash_attn", None), ("flash_attn_effective", "flash_attn_llamacpp", None),
    ("n_ctx_effective", "n_ctx_llamacpp", None),
    ("n_threads", "n_threads", None), ("n_gpu_layers", "n_gpu_layers", None), ("n_batch", "n_batch", None),
    ("n_ubatch", "n_ubatch", None), ("n_prompt", "n_prompt", None), ("n_gen", "n_gen", None),
    ("repetitions", "repetitions", None),
    ("kv_predicted_bytes", "kv_bytes_formula", None), ("kv_predicted_mib", "kv_mib_formula", 2),
    ("kv_engine_mib", "kv_mib_llamacpp_dryrun", 2), ("kv_llama_run_mib", "kv_mib_llamacpp", 2),
    ("kv_llama_cache_lines", "kv_cache_lines_llamacpp", None), ("kv_buffer_mib", "kv_buffer_mib_llamacpp", 2),
    ("kv_llama_matches_formula", "kv_matches_formula_llamacpp", None),
    ("kv_saving_vs_f16_predicted", "kv_saving_vs_f16_formula", 3),
    ("context_growth_measured_bytes", "context_anon_growth_bytes_measured", None),
    ("context_growth_minus_predicted_bytes", "context_anon_growth_minus_formula_bytes", None),
    ("context_growth_error_pct", "context_anon_growth_minus_formula_pct", 2),
    ("kv_on_device", "kv_on_device_llamacpp", None), ("context_gpu_growth_bytes", "context_gpu_growth_bytes_measured", None),
    ("gpu_compute_buffer_mib", "gpu_compute_buffer_mib_llamacpp", 2),
    ("context_gpu_growth_minus_predicted_bytes", "context_gpu_growth_minus_compute_minus_formula_bytes", None),
    ("context_gpu_growth_error_pct", "context_gpu_growth_minus_compute_minus_formula_pct", 2),
    ("peak_rss_bytes", "peak_rss_bytes_measured", None), ("kernel_maxrss_bytes", "kernel_maxrss_bytes_measured", None),
    ("anon_after_fill_bytes", "anon_after_fill_bytes_measured", None),
    ("file_after_fill_bytes", "file_after_fill_bytes_measured", None), ("peak_gpu_bytes", "peak_gpu_bytes_measured", None),
    ("peak_footprint_bytes", "peak_footprint_bytes_measured", None), ("compute_buffer_mib", "compute_mib_llamacpp", 2),
    ("peak_rss_saving_vs_f16_measured", "peak_rss_saving_vs_f16_measured", 3),
    *((f"{t}{c}", f"{t}{f}", nd) for t in ("pp_", "tg_") for c, f, nd in (
        ("n_tokens", "n_tokens", None), ("ts_mean", "tokens_per_s_mean", 3), ("ts_ci95_low", "tokens_per_s_ci95_low", 3),
        ("ts_ci95_high", "tokens_per_s_ci95_high", 3), ("ts_cv", "tokens_per_s_cv", 4), ("samples", "n_samples", None))),
    ("quality_status", "quality_status", None), ("ppl", "ppl", 4), ("ppl_err", "ppl_err", 4), ("base_ppl", "base_ppl", 4),
    ("ppl_delta_pct", "ppl_delta_pct", 3), ("kld_mean", "kld_mean", 6), ("kld_mean_err", "kld_mean_err", 6),
    ("kld_p99", "kld_p99", 6), ("same_top_rate", "same_top_rate", 5), ("time_utc", "time_utc", None),
)
# issue 19: other processes' share of the CPUs (edgekv.machine.load); only in results.json rows of records that have it
EXPORT_LOAD: tuple[tuple[str, str, int | None], ...] = (
    ("machine_busy", "machine_busy", None), ("others_cpu_share_pct", "others_cpu_share_pct", 1))
# issue 26: the speed model's prediction; results.csv gains these columns only when a record holds one, so reports of
# records without a speed prediction keep their columns
EXPORT_SPEED: tuple[tuple[str, str, int | None], ...] = (
    ("pp_ts_predicted", "pp_tokens_per_s_predicted", 3), ("tg_ts_predicted", "tg_tokens_per_s_predicted", 3),
    ("tg_roofline_ts_predicted", "tg_roofline_tokens_per_s_predicted", 3),
    ("speed_calibration_id", "speed_calibration_id", None))
# issue 28: sequences decoded at once (-npl) and each one's decode rate; only when a record ran several
EXPORT_PARALLEL: tuple[tuple[str, str, int | None], ...] = (
    ("engine", "engine", None), ("n_parallel", "n_parallel", None), ("tg_seq_ts_mean", "tg_seq_tokens_per_s_mean", 3),
    ("ttft_p50_s", "ttft_p50_s_measured", 4), ("ttft_p95_s", "ttft_p95_s_measured", 4),
    ("serving_ts", "serving_tokens_per_s_measured", 3), ("failed_requests", "serving_failed_requests", None))
# issue 30: ops llama.cpp's scheduler ran on the CPU although their layer is offloaded; only when a record has some
EXPORT_OFF_DEVICE: tuple[tuple[str, str, int | None], ...] = (("ops_off_device", "ops_off_device_llamacpp", None),)
COLUMNS = tuple(c for c, _, _ in EXPORT)
_DIGITS = {f: nd for _, f, nd in EXPORT + EXPORT_LOAD + EXPORT_SPEED + EXPORT_PARALLEL if nd is not None}


def _r(x: Any, nd: int = 4) -> Any:
    """Round floats for stable text; leave everything else as it is."""
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        return round(x, nd)
    return x


def type_rank(t: str | None) -> tuple:
    ct = CACHE_TYPES.get(str(t))
    return (-ct.bits_per_element, ct.name) if ct else (0.0, str(t))


def sort_key(r: Record | dict[str, Any]) -> tuple:
    """The report's order: model, machine, context, depth, cache types (widest first), other settings."""
    r = as_record(r)
    s, m = r.settings, r.model
    rest = tuple("" if _v(v) is None else str(_v(v)) for v in
                 (s.flash_attn, s.n_threads, s.n_gpu_layers, s.n_batch, s.n_ubatch, s.n_prompt, s.n_gen, s.swa_full,
                  s.n_seq_max, s.kv_unified, s.engine, s.test, s.n_parallel))
    return (str(_v(m.name) or ""), str(_v(m.sha256) or ""), F.device_label(r), s.n_ctx or 0, s.n_depth or 0,
            type_rank(s.type_k), type_rank(s.type_v), rest, str(r.kind or ""), str(_v(r.time_utc) or ""))


def typed(records: Sequence[Record | dict[str, Any]]) -> list[Record]:
    """Every input as a :class:`Record` (a dict upgraded and strictly decoded), once."""
    return [as_record(r, f"record {i}") for i, r in enumerate(records, 1)]


def sort_records(records: Sequence[Record]) -> list[Record]:
    return sorted(records, key=sort_key)


def report_rows(recs: Sequence[Record]) -> list[dict[str, Any]]:
    """The frame's rows (:func:`edgekv.records.frame.frame_rows`) of records in report order, each figure rounded to
    the digits the report prints (:data:`EXPORT`), so that the tables, the plots and results.csv agree."""
    return [{k: _r(v, _DIGITS[k]) if k in _DIGITS else v for k, v in x.items()} for x in F.frame_rows(recs)]


def export_row(x: dict[str, Any]) -> dict[str, Any]:
    """One frame row as a results.csv / results.json row (:data:`EXPORT`)."""
    out = {c: x[f] for c, f, _ in EXPORT}
    if x["machine_busy"] is not None:
        out.update({c: x[f] for c, f, _ in EXPORT_LOAD})
    if _row_has_speed(x):
        out.update({c: x[f] for c, f, _ in EXPORT_SPEED})
    if x["n_parallel"] is not None:
        out.update({c: x[f] for c, f, _ in EXPORT_PARALLEL})
    if x["ops_off_device_llamacpp"]:
        out.update({c: x[f] for c, f, _ in EXPORT_OFF_DEVICE})
    return out


def export_columns(rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """results.csv's columns: :data:`EXPORT`'s, and the optional groups only when a row holds them (so reports of
    records without them keep their bytes)."""
    return (COLUMNS + (tuple(c for c, _, _ in EXPORT_SPEED) if has_speed_prediction(rows) else ())
            + (tuple(c for c, _, _ in EXPORT_PARALLEL) if any(x["n_parallel"] is not None for x in rows) else ())
            + (tuple(c for c, _, _ in EXPORT_OFF_DEVICE) if any(x["ops_off_device_llamacpp"] for x in rows) else ()))


def _row_has_speed(x: dict[str, Any]) -> bool:
    return x["pp_tokens_per_s_predicted"] is not None or x["tg_tokens_per_s_predicted"] is not None


def has_speed_prediction(rows: Sequence[dict[str, Any]]) -> bool:
    return any(_row_has_speed(x) for x in rows)


def csv_rows(records: Sequence[Record | dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of results.csv / results.json for these records (sorted as the report sorts them)."""
    return [export_row(x) for x in report_rows(sort_records(typed(records)))]


__all__ = ["COLUMNS", "EXPORT", "csv_rows"]
