"""Results as a pandas DataFrame: one row per configuration, flat columns with units, one column per provenance.

Column names end with their unit (``_bytes``, ``_mib``, ``_s``, ``_tokens_per_s``) and, where the same
quantity can come from more than one source, with that source: ``_formula`` (predicted from the GGUF
header), ``_llamacpp_dryrun`` (llama.cpp's dry run), ``_llamacpp`` (llama.cpp's log in the measured run),
``_predicted`` (the whole-process model, :mod:`edgekv.core.memmodel`), ``_measured`` (the OS / timers).
Differences name both sides (``..._minus_formula_bytes``).  A column is empty (NaN/None) where its
source did not run.  :data:`COLUMNS` is the column list, in order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from msgspec import UNSET

from edgekv.records.schema import Record

MIB = 1024 * 1024

COLUMNS = (
    # identity and settings (what was asked)
    "file", "kind", "status", "model_name", "model_sha256", "arch", "machine", "engine", "n_ctx", "type_k", "type_v",
    "flash_attn", "n_seq_max", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "n_prompt", "n_gen", "n_depth",
    "repetitions", "no_mmap",
    # KV cache: formula, llama.cpp's dry run, llama.cpp's log in the measured run
    "kv_bytes_formula", "kv_mib_llamacpp_dryrun", "kv_mib_llamacpp", "kv_buffer_mib_llamacpp",
    "kv_matches_formula_llamacpp", "compute_mib_llamacpp", "output_mib_llamacpp",
    # whole process: predicted vs measured
    "peak_rss_bytes_predicted", "peak_rss_bytes_measured", "kernel_maxrss_bytes_measured", "peak_gpu_bytes_measured",
    "peak_rss_residual_bytes", "peak_rss_residual_pct",
    "context_anon_growth_bytes_measured", "context_anon_growth_minus_formula_bytes",
    # speed, measured (llama-bench's own average where it ran)
    "pp_tokens_per_s_mean", "pp_tokens_per_s_stdev", "pp_tokens_per_s_cv", "pp_unstable",
    "tg_tokens_per_s_mean", "tg_tokens_per_s_stdev", "tg_tokens_per_s_cv", "tg_unstable",
    "pp_tokens_per_s_llamabench", "tg_tokens_per_s_llamabench",
    "wall_s_measured",
    # quality, measured against the f16 cache
    "quality_status", "ppl", "ppl_ratio", "kld_mean", "kld_p99", "same_top_rate",
)


def _v(x: Any) -> Any:
    return None if x is UNSET else x


def _sum(d: Any) -> float | None:
    return None if d in (None, UNSET) else round(sum(d.values()), 2)


def row(rec: Record, file: str | None = None) -> dict[str, Any]:
    """One record -> one flat row (keys: :data:`COLUMNS`)."""
    s, m, p = rec.settings, rec.model, rec.prediction
    f = p.formula if p not in (None, UNSET) else None
    eng = _v(p.engine) if f is not None else None
    proc = _v(p.process) if f is not None else None
    log, mem, dif = _v(rec.llama_log), _v(rec.memory), _v(rec.differences)
    res, q = _v(rec.memory_residual), _v(rec.quality)
    speed = _v(rec.speed)
    out: dict[str, Any] = {
        "file": file, "kind": rec.kind, "status": rec.status, "model_name": _v(m.name), "model_sha256": _v(m.sha256),
        "arch": _v(m.arch), "machine": _v(rec.machine), "engine": s.engine, "n_ctx": s.n_ctx, "type_k": s.type_k,
        "type_v": s.type_v, "flash_attn": s.flash_attn, "n_seq_max": s.n_seq_max, "n_batch": s.n_batch,
        "n_ubatch": s.n_ubatch, "n_threads": s.n_threads, "n_gpu_layers": s.n_gpu_layers, "n_prompt": s.n_prompt,
        "n_gen": s.n_gen, "n_depth": s.n_depth, "repetitions": s.repetitions, "no_mmap": bool(_v(s.no_mmap)),
        "kv_bytes_formula": f.total_bytes if f is not None else None,
        "kv_mib_llamacpp_dryrun": eng.kv_mib if eng is not None else None,
        "kv_mib_llamacpp": log.kv_mib if log is not None else None,
        "kv_buffer_mib_llamacpp": _v(dif.kv_buffer_mib) if dif is not None else None,
        "kv_matches_formula_llamacpp": _v(dif.llama_kv_matches_formula) if dif is not None else None,
        "compute_mib_llamacpp": _sum(log.compute_mib) if log is not None else None,
        "output_mib_llamacpp": _sum(log.output_mib) if log is not None else None,
        "peak_rss_bytes_predicted": proc.peak_rss_bytes if proc is not None else None,
        "peak_rss_bytes_measured": mem.peak_rss_bytes if mem is not None else None,
        "kernel_maxrss_bytes_measured": mem.kernel_maxrss_bytes if mem is not None else None,
        "peak_gpu_bytes_measured": mem.peak_gpu_bytes if mem is not None else None,
        "peak_rss_residual_bytes": res.peak_rss_bytes if res is not None else None,
        "peak_rss_residual_pct": res.peak_rss_pct if res is not None else None,
        "context_anon_growth_bytes_measured": _v(dif.context_anon_growth_bytes) if dif is not None else None,
        "context_anon_growth_minus_formula_bytes":
            _v(dif.context_anon_growth_minus_formula_bytes) if dif is not None else None,
        "wall_s_measured": rec.timing.wall_s if _v(rec.timing) is not None else None,
        "quality_status": q.status if q is not None else None,
    }
    for test in ("pp", "tg"):
        t = _v(getattr(speed, test)) if speed is not None else None
        out[f"{test}_tokens_per_s_mean"] = t.mean_ts if t is not None else None
        out[f"{test}_tokens_per_s_stdev"] = t.stdev_ts if t is not None else None
        out[f"{test}_tokens_per_s_cv"] = t.cv if t is not None else None
        out[f"{test}_unstable"] = t.unstable if t is not None else None
        out[f"{test}_tokens_per_s_llamabench"] = _v(t.llama_bench_avg_ts) if t is not None else None
    stats = q.quality if q is not None else None
    for k in ("ppl", "ppl_ratio", "kld_mean", "kld_p99", "same_top_rate"):
        out[k] = getattr(stats, k) if stats is not None else None
    return {k: out[k] for k in COLUMNS}


def load_results(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Record]:
    """Every record of one or more edgekv results files (upgraded, strictly decoded)."""
    from edgekv.records.results import load_records

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [r for p in paths for r in load_records(p)]


def results_frame(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """One row per configuration (:data:`COLUMNS`), for notebooks: ``edgekv.results_frame("sweep.jsonl")``."""
    import pandas as pd

    from edgekv.records.results import load_records

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows = [row(r, str(p)) for p in paths for r in load_records(p)]
    # nullable integer/boolean columns: a byte count stays an integer where another row has none
    return pd.DataFrame(rows, columns=list(COLUMNS)).convert_dtypes()
