"""Reports: Markdown, CSV, JSON, PNG plots and one self-contained HTML file.  Measures nothing.

Every figure is labelled with where it comes from:

* **predicted** -- edgekv's formula from the GGUF header (``prediction.formula``);
* **llama.cpp** -- llama.cpp's own figures: its dry run before the sweep (``prediction.engine``) and
  the ``llama_kv_cache: size`` lines of the measured run itself (``llama_log``);
* **measured** -- what the operating system measured for the run's process (``memory``: peak RSS,
  anonymous and file-backed pages, GPU memory through NVML, macOS footprint) and the timed tests
  (``speed``), and the quality pass (``quality``).

Every figure comes from the rows of :func:`edgekv.records.frame.frame_rows`, the flattener behind
``edgekv.results_frame``: :func:`build` decodes its inputs once (:func:`~edgekv.records.results.as_record`:
dicts or Records), makes those rows once, and the tables, the problems list, the plots and results.csv /
results.json read their columns.  results.csv / results.json keep their own column names (``kv_predicted_bytes``
where the frame says ``kv_bytes_formula``): they are the report's stable export format, older than the notebook
frame and read by users' scripts, so :data:`EXPORT` maps each to its frame column, once.  A value a record
does not hold is shown as ``–`` (never filled in from another source).  Rendering is deterministic: the same records give
byte-identical Markdown, CSV and JSON (no rendering timestamps, a stable sort, fixed float formatting); PNGs
carry no software/date metadata.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekv.core import units
from edgekv.core.cachetypes import CACHE_TYPES
from edgekv.core.units import MIB
from edgekv.edges.safepath import atomic_write
from edgekv.output.inputs import KIND_BENCH, KIND_LLAMA_BENCH, KIND_PREDICT
from edgekv.records import frame as F
from edgekv.records.frame import unset_none as _v
from edgekv.records.results import as_record
from edgekv.records.schema import Record

REPORT_FORMAT = 1
DASH = "–"

# -- results.csv / results.json: the report's export format, from the frame ----------------------------

# (results.csv column, frame column, digits the report prints it with; None: as it is).  The export's names
# are older than the notebook frame's (edgekv.records.frame.COLUMNS: unit and source in every name) and users'
# scripts read results.csv / results.json, so they stay as they are; this table is the one place the two sets
# of names meet.  The rounded figures are also what the tables and plots show.
EXPORT: tuple[tuple[str, str, int | None], ...] = (
    ("model", "model_name", None), ("model_sha256", "model_sha256", None), ("arch", "arch", None),
    ("device", "device", None), ("kind", "kind", None), ("status", "status", None), ("reason", "reason", None),
    ("n_ctx", "n_ctx", None), ("n_depth", "n_depth", None), ("type_k", "type_k", None), ("type_v", "type_v", None),
    ("flash_attn", "flash_attn", None), ("flash_attn_effective", "flash_attn_llamacpp", None),
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
# issue 19: other processes' share of the CPUs (edgekv.edges.load); only in results.json rows of records that have it
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


def _type_rank(t: str | None) -> tuple:
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
            _type_rank(s.type_k), _type_rank(s.type_v), rest, str(r.kind or ""), str(_v(r.time_utc) or ""))


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


# -- formatting ---------------------------------------------------------------------------------------

def fmt_mib_b(n: int | float | None) -> str:
    return DASH if n is None else f"{n / MIB:,.2f}"


def fmt_mib_number(x: float | None) -> str:
    """A figure already in MiB (fmt_mib_b and views.fmt_mib take bytes)."""
    return DASH if x is None else f"{x:,.2f}"


def fmt_x(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f}×"


def fmt_pct(x: float | None, nd: int = 1) -> str:
    return DASH if x is None else f"{x:+.{nd}f}%"


def _f1(x: float) -> str:
    s = f"{x:,.1f}"
    return "0.0" if s == "-0.0" else s


def fmt_ts(mean: float | None, lo: float | None, hi: float | None, unstable: bool = False) -> str:
    if mean is None:
        return DASH
    if lo is None or hi is None:
        return f"{_f1(mean)} (1 sample)"
    return f"{_f1(mean)} [{_f1(lo)}, {_f1(hi)}]" + (" !" if unstable else "")


def _ctx(n: Any) -> str:
    return DASH if n is None else str(n)


@dataclass
class Table:
    title: str
    intro: str
    headers: list[str]
    rows: list[list[str]]
    align: list[str] = field(default_factory=list)    # "l" or "r" per column


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)    # (file name, alt text)
    bullets: list[str] = field(default_factory=list)


# -- the document ---------------------------------------------------------------------------------------

def _varying(rows: list[dict[str, Any]], key: str) -> bool:
    return len({str(r[key]) for r in rows}) > 1


def _setting_cols(rows: list[dict[str, Any]], with_depth: bool) -> list[tuple[str, str]]:
    cols: list[tuple[str, str]] = []
    if _varying(rows, "device"):
        cols.append(("device", "device"))
    cols.append(("n_ctx", "n_ctx"))
    if with_depth:
        cols.append(("n_depth", "depth"))
    cols.append(("kv", "K / V"))
    for k, h in (("flash_attn", "-fa"), ("n_threads", "-t"), ("n_gpu_layers", "-ngl"), ("n_batch", "-b"),
                 ("n_ubatch", "-ub"), ("n_prompt", "-p"), ("n_gen", "-n")):
        if _varying(rows, k):
            cols.append((k, h))
    return cols


def _cells(row: dict[str, Any], cols: list[tuple[str, str]]) -> list[str]:
    out = []
    for k, _ in cols:
        if k == "kv":
            out.append(units.row_kv_label(row))
        elif k == "n_ctx":
            out.append(_ctx(row["n_ctx"]))
        else:
            out.append(DASH if row[k] is None else str(row[k]))
    return out


def _align(cols: list[tuple[str, str]], n_values: int) -> list[str]:
    return ["l" if k in ("device", "kv", "flash_attn") else "r" for k, _ in cols] + ["r"] * n_values


def _env_section(records: list[Record]) -> Section:
    measured = [r for r in records if r.kind != KIND_PREDICT]
    sec = Section("Environment")
    if not measured:
        cals = _calibrations(records)
        if not cals:
            sec.paragraphs.append("**Predicted only — nothing here was measured.** Every figure in this report comes "
                                  "from the GGUF header (edgekv's formula, and llama.cpp's own dry run where a column "
                                  "says so); no model was run and no machine was measured.")
            return sec
        sec.paragraphs.append("**Predicted only — no model here was run.** Every memory figure comes from the GGUF "
                              "header (edgekv's formula, and llama.cpp's own dry run where a column says so). The "
                              "speed figures are the speed model's (`edgekv/core/speed.py`): the header's shapes and "
                              "weight types times the coefficients of one machine's speed calibration "
                              f"({'; '.join(cals)}), which `edgekv calibrate` measured on small synthetic models "
                              "through llama.cpp; they describe that machine only.")
        return sec
    by_machine: dict[str, list[Record]] = {}
    for r in measured:
        by_machine.setdefault(F.device_label(r), []).append(r)
    labels = sorted(by_machine)
    fields = [
        ("machine", lambda e, rs: F.machine_label(rs[0]) or DASH),
        ("devices (backends)", lambda e, rs: F.device_label(rs[0]).split(": ", 1)[-1]),
        ("llama.cpp", lambda e, rs: " ".join(x for x in (
            f"commit {e.get('llama_cpp_commit')}" if e.get("llama_cpp_commit") else "",
            f"(llama-cpp-python {e.get('llama_cpp_python')})" if e.get("llama_cpp_python") else "",
            f"llama-bench build {e.get('llama_bench_build_number')}" if e.get("llama_bench_build_number") else "") if x)
         or DASH),
        ("edgekv", lambda e, rs: e.get("edgekv") or DASH),
        ("CPU", lambda e, rs: _cpu(e)),
        ("RAM", lambda e, rs: f"{e['ram_bytes'] / 1024**3:.1f} GiB" if e.get("ram_bytes") else DASH),
        ("GPU", lambda e, rs: _gpu(e)),
        ("OS", lambda e, rs: " ".join(str(x) for x in (e.get("os"), f"({e['arch']})" if e.get("arch") else "") if x) or DASH),
        ("Python", lambda e, rs: e.get("python") or DASH),
        ("power / governor", lambda e, rs: f"{e.get('power') or DASH} / {e.get('governor') or DASH}"),
        ("llama.cpp system info", lambda e, rs: f"`{e['system_info']}`" if e.get("system_info") else DASH),
        ("measured", lambda e, rs: _time_range(rs)),
        ("command", lambda e, rs: f"`{_argv(e)}`" if e.get("argv") else DASH),
        ("CI", lambda e, rs: "yes" if e.get("ci") else "no"),
    ]
    if any(rs[0].environment.get("extra_buffers_preflight") for rs in by_machine.values()):
        # records written before the preflight existed have no such row: their reports stay as they were
        fields.insert(-3, ("extra buffers (AMX, CPU_REPACK)", lambda e, rs: _extra_buffers(e, rs)))
    rows = []
    for name, fn in fields:
        cells = []
        for lab in labels:
            rs = by_machine[lab]
            cells.append(_md_safe(str(fn(rs[0].environment, rs))))
        rows.append([name] + cells)
    heads = [""] + [f"machine {i + 1}" for i in range(len(labels))] if len(labels) > 1 else ["", "value"]
    sec.tables.append(Table("", "", heads, rows, ["l"] * (len(labels) + 1)))
    nmeas = len(measured)
    sec.paragraphs.append(f"{nmeas} measured configuration{'s' if nmeas != 1 else ''}"
                          + (f" on {len(labels)} machines" if len(labels) > 1 else "") + ". Each configuration ran in a "
                          "fresh process; the environment is recorded by the run itself, not typed in.")
    return sec


def _calibrations(records: list[Record]) -> list[str]:
    """The speed calibrations behind the records' predicted speeds: `id` (machine)."""
    out = set()
    for r in records:
        p = _v(r.prediction)
        sp = _v(p.speed) if p is not None else None
        if sp is not None and (_v(sp.tg) is not None or _v(sp.pp) is not None):
            m = _v(sp.machine)
            out.add(f"`{sp.calibration_id}`" + (f" on {m}" if m else ""))
    return sorted(out)


def _extra_buffers(e: dict[str, Any], rs: list[Record]) -> str:
    """The extra-buffer preflight's verdict, and the --repack the configurations ran with."""
    pf = e.get("extra_buffers_preflight")
    if not isinstance(pf, dict):
        return DASH
    used = sorted({"1" if F.repack_of(r.settings) else "0" for r in rs})
    verdict = {True: "run here", False: "crash on this CPU" + (" (llama.cpp #20824)" if "AMX" in (
        pf.get("extra_buffers_mib") or {}) else ""), None: "unknown"}[pf.get("runs")]
    return f"kernels {verdict}: {pf.get('detail')}; measured with --repack {','.join(used)}"


def _cpu(e: dict[str, Any]) -> str:
    if not e.get("cpu_model"):
        return DASH
    cores = ""
    if e.get("cpu_count_logical"):
        cores = f", {e['cpu_count_logical']} logical"
        if e.get("cpu_count_physical"):
            cores += f" / {e['cpu_count_physical']} physical cores"
        else:
            cores += " cores"
    return f"{e['cpu_model']}{cores}"


def _gpu(e: dict[str, Any]) -> str:
    nv = e.get("nvidia")
    parts = []
    if isinstance(nv, dict):
        # edges/environment.nvidia_info stores them under "devices" ("gpus" in no record written by edgekv)
        for g in nv.get("devices") or nv.get("gpus") or []:
            if isinstance(g, dict):
                parts.append(f"{g.get('name')} ({(g.get('memory_total') or 0) / 1024**3:.0f} GiB)")
        if nv.get("driver"):
            parts.append(f"driver {nv['driver']}")
    if e.get("iogpu_wired_limit_mb") is not None:
        parts.append(f"iogpu.wired_limit_mb={e['iogpu_wired_limit_mb']}")
    return ", ".join(parts) or DASH


def _time_range(rs: list[Record]) -> str:
    ts = sorted(str(r.time_utc) for r in rs if _v(r.time_utc))
    if not ts:
        return DASH
    return ts[0] if ts[0] == ts[-1] else f"{ts[0]} … {ts[-1]}"


def _argv(e: dict[str, Any]) -> str:
    argv = list(e.get("argv") or [])
    if argv:
        argv[0] = os.path.basename(str(argv[0]))
    return " ".join(str(a) for a in argv)


def _md_safe(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _model_section(name: str, recs: list[Record]) -> Section:
    m = recs[0].model
    sec = Section(f"Model: {name}")
    # (value, its phrase): a fact is shown only where the record holds it
    candidates = (
        (_v(m.arch), lambda x: f"architecture `{x}`"),
        (_v(m.n_layer), lambda x: f"{x} layers"),
        (_v(m.n_head_kv), lambda x: f"KV heads {', '.join(map(str, x))}"),
        (_v(m.head_dim_k), lambda x: f"head dim {', '.join(map(str, x))}"),
        (_v(m.n_swa), lambda x: f"sliding window {x} on {_v(m.swa_layers)} layers"),
        (_v(m.shared_kv_layers), lambda x: f"{x} layers share another layer's KV"),
        (_v(m.n_ctx_train), lambda x: f"trained context {x}"),
        (_v(m.size_bytes), lambda x: f"weights {x / MIB:,.1f} MiB"),
        (m.path, lambda x: f"file `{os.path.basename(str(x))}`"),
        (m.sha256, lambda x: f"sha256 `{x}`"),
    )
    facts = [phrase(x) for x, phrase in candidates if x]
    if facts:
        sec.paragraphs.append("; ".join(facts) + ".")
    return sec


@dataclass(frozen=True)
class ColumnGroup:
    """Frame columns a table shows together, each with its heading and format; shown only when some row has a
    value in the ``when`` column (None: always; ``nonzero``: a value other than 0), so no column of dashes only."""

    cols: tuple[tuple[str, str, Callable[[Any], str]], ...]      # (heading, frame column, format)
    when: str | None = None
    nonzero: bool = False

    @property
    def heads(self) -> list[str]:
        return [h for h, _, _ in self.cols]

    def cells(self, row: dict[str, Any]) -> list[str]:
        return [fmt(row[col]) for _, col, fmt in self.cols]

    def shown(self, rows: list[dict[str, Any]]) -> bool:
        w = self.when
        return w is None or any(r[w] is not None and (bool(r[w]) or not self.nonzero) for r in rows)


def _grouped(rows: list[dict[str, Any]], groups: Sequence[ColumnGroup]) -> list[ColumnGroup]:
    return [g for g in groups if g.shown(rows)]


def _signed_mib(b: int | None) -> str:
    return DASH if b is None else f"{b / MIB:+,.2f}"


# the KV-cache table: predicted, llama.cpp (dry run, the run's own log), measured (OS, and a GPU's memory)
_KV_GROUPS = (
    ColumnGroup((("KV MiB, predicted (formula)", "kv_bytes_formula", fmt_mib_b),)),
    ColumnGroup((("KV MiB, llama.cpp dry run", "kv_mib_llamacpp_dryrun", fmt_mib_number),), "kv_mib_llamacpp_dryrun"),
    ColumnGroup((("KV MiB, llama.cpp in the run", "kv_mib_llamacpp", fmt_mib_number),
                 ("KV buffer MiB, llama.cpp", "kv_buffer_mib_llamacpp", fmt_mib_number)), "kv_mib_llamacpp"),
    # not "error": this is what llama.cpp allocates beside the KV cache (issue 19); a formula-vs-llama.cpp
    # mismatch is the only error and shows in the llama.cpp columns
    ColumnGroup((("context memory MiB, measured (OS)", "context_anon_growth_bytes_measured", fmt_mib_b),
                 ("beside the KV MiB (measured − predicted)", "context_anon_growth_minus_formula_bytes", _signed_mib),
                 ("beside the KV, % of KV", "context_anon_growth_minus_formula_pct", fmt_pct)),
                "context_anon_growth_bytes_measured"),
    ColumnGroup((("context GPU memory MiB, measured (device)", "context_gpu_growth_bytes_measured", fmt_mib_b),
                 ("GPU compute buffers MiB, llama.cpp", "gpu_compute_buffer_mib_llamacpp", fmt_mib_number),
                 ("GPU − compute − predicted MiB", "context_gpu_growth_minus_compute_minus_formula_bytes", _signed_mib),
                 ("GPU beside the KV, % of KV", "context_gpu_growth_minus_compute_minus_formula_pct", fmt_pct)),
                "context_gpu_growth_bytes_measured"),
    ColumnGroup((("KV saving vs f16, predicted", "kv_saving_vs_f16_formula", fmt_x),)),
)

# the whole-process table: what the OS measured, and llama.cpp's compute reservations beside it
_PROCESS_GROUPS = (
    ColumnGroup((("peak RSS MiB", "peak_rss_bytes_measured", fmt_mib_b),)),
    ColumnGroup((("anonymous MiB after fill", "anon_after_fill_bytes_measured", fmt_mib_b),
                 ("file-backed MiB after fill", "file_after_fill_bytes_measured", fmt_mib_b)),
                "anon_after_fill_bytes_measured"),
    ColumnGroup((("GPU MiB (NVML, this process)", "peak_gpu_bytes_measured", fmt_mib_b),), "peak_gpu_bytes_measured",
                nonzero=True),
    ColumnGroup((("footprint MiB (macOS)", "peak_footprint_bytes_measured", fmt_mib_b),),
                "peak_footprint_bytes_measured", nonzero=True),
    ColumnGroup((("compute buffers MiB, llama.cpp (reserved)", "compute_mib_llamacpp", fmt_mib_number),
                 ("peak RSS saving vs f16, measured", "peak_rss_saving_vs_f16_measured", fmt_x))),
)


def _table(title: str, intro: str, rows: list[dict[str, Any]], cols: list[tuple[str, str]],
           groups: Sequence[ColumnGroup]) -> Table:
    heads = [h for _, h in cols] + [h for g in groups for h in g.heads]
    body = [_cells(r, cols) + [c for g in groups for c in g.cells(r)] for r in rows]
    return Table(title, intro, heads, body, _align(cols, len(heads) - len(cols)))


def _kv_intro(ok: list[dict[str, Any]], has_engine: bool, has_run: bool, has_meas: bool, has_gpu: bool) -> str:
    intro = ("KV cache by context and cache type. *Predicted* is edgekv's formula from the GGUF header")
    if has_engine or has_run:
        intro += "; *llama.cpp* columns are llama.cpp's own `llama_kv_cache: size` figures"
        intro += (" (its dry run before the sweep, and the log of the measured run itself)" if has_run else
                  " from its dry run (nothing allocated)")
    if has_meas:
        intro += ("; *measured* is the growth of the process's anonymous memory when llama.cpp created the context "
                  "(the KV cache plus small output and scheduler buffers), from the OS. *Beside the KV* = measured − "
                  "predicted: those other buffers, also as a share of the predicted KV; it is not an error of the "
                  "prediction (that would be a llama.cpp column differing from the formula)")
    if has_gpu:
        intro += ("; where the cache lives on a GPU, *context GPU memory* is how much the device memory in use "
                  "(read by the run itself through ggml, e.g. cudaMemGetInfo, right after the load and right after "
                  "the context) grew when llama.cpp created the context: the KV buffers plus the compute buffers ggml "
                  "allocates whole on the device, so llama.cpp's device compute buffers are subtracted before the "
                  "comparison with the prediction; the device rounds each allocation up (CUDA on an H100: 2 MiB "
                  "steps), so a few MiB remain (the host-side measured columns then hold no KV)")
    intro += "."
    if any((r["kv_cache_lines_llamacpp"] or 0) > 1 for r in ok):
        intro += (" This model has several cache objects (e.g. full and sliding-window layers): llama.cpp prints one "
                  "size line per cache, each rounded to 0.01 MiB, so its columns (their sum) can differ by 0.01 from "
                  "the formula's exact total; the check against the formula compares each line and the cell counts.")
    return intro


_PROCESS_INTRO = (
    "Whole-process memory of each run, measured by the OS: the peak resident set over the whole run (model "
    "loaded, context created, cache filled to the test depth: sampled every 5 ms; the timed tests: read by "
    "the process itself after each repetition, so that sampling never slows them), leaving out only the "
    "moments the harness saves or restores its depth state; its anonymous "
    "(KV, compute and output buffers) and file-backed (memory-mapped weights) parts after the fill. "
    "Compute buffers are llama.cpp's reservations; only the pages a graph touches become resident.")


def _memory_tables(rows: list[dict[str, Any]]) -> list[Table]:
    ok = [r for r in rows if r["status"] == "ok" and r["kv_bytes_formula"] is not None]
    if not ok:
        return []
    depth_matters = any(len({x["n_depth"] for x in ok if (x["n_ctx"], x["type_k"], x["type_v"]) == k}) > 1
                        for k in {(x["n_ctx"], x["type_k"], x["type_v"]) for x in ok})
    groups = _grouped(ok, _KV_GROUPS)
    has_engine, has_run, has_meas, has_gpu = (g in groups for g in _KV_GROUPS[1:5])
    ttl = "KV cache: predicted" + (", llama.cpp" if has_engine or has_run else "") + (", measured" if has_meas else "")
    tables = [_table(ttl, _kv_intro(ok, has_engine, has_run, has_meas, has_gpu), ok, _setting_cols(ok, depth_matters),
                     groups)]
    proc = [r for r in ok if r["peak_rss_bytes_measured"] is not None]
    if proc:
        tables.append(_table("Process memory, measured", _PROCESS_INTRO, proc, _setting_cols(proc, depth_matters),
                             _grouped(proc, _PROCESS_GROUPS)))
    return tables


def _pivot_tables(rows: list[dict[str, Any]]) -> list[Table]:
    """The tables people circulate: per context, each cache type's figure and its saving vs f16."""
    ok = [r for r in rows if r["status"] == "ok" and r["kv_bytes_formula"] is not None and r["type_k"] == r["type_v"]]
    if not ok:
        return []
    # one value per (device, n_ctx, type): the first row in sort order (lowest depth, default settings first)
    types = sorted({r["type_k"] for r in ok}, key=_type_rank)
    devices = sorted({r["device"] for r in ok})
    multi = len(devices) > 1
    out = []
    for title, key, skey, intro in (
        ("KV cache per cache type, predicted", "kv_bytes_formula", "kv_saving_vs_f16_formula",
         "Predicted KV MiB (formula, from the GGUF header) and the saving against f16 in parentheses."),
        ("Peak RSS per cache type, measured", "peak_rss_bytes_measured", "peak_rss_saving_vs_f16_measured",
         "Measured peak resident memory of the whole process (MiB, OS) and the saving against f16 in parentheses."),
    ):
        cells: dict[tuple, dict[str, Any]] = {}
        for r in ok:
            if r[key] is None:
                continue
            cells.setdefault((r["device"], r["n_ctx"], r["type_k"]), r)
        if not cells:
            continue
        keys = sorted({(d, n) for d, n, _ in cells}, key=lambda x: (x[0], x[1] or 0))
        heads = (["device"] if multi else []) + ["n_ctx"] + types
        body = []
        for d, n in keys:
            line = ([d] if multi else []) + [_ctx(n)]
            for t in types:
                r = cells.get((d, n, t))
                if r is None:
                    line.append(DASH)
                else:
                    line.append(fmt_mib_b(r[key]) + ("" if t == "f16" or r[skey] is None else f" ({fmt_x(r[skey])})"))
            body.append(line)
        out.append(Table(title, intro, heads, body, (["l"] if multi else []) + ["r"] * (len(heads) - multi)))
    return out


def _speed_table(rows: list[dict[str, Any]]) -> list[Table]:
    sp = [r for r in rows if r["status"] == "ok" and r["n_parallel"] is None     # -npl: edgekv.output.parallelreport
          and (r["pp_tokens_per_s_mean"] is not None or r["tg_tokens_per_s_mean"] is not None)]
    if not sp:
        return []
    cols = _setting_cols(sp, True)
    pp_n = sorted({r["pp_n_tokens"] for r in sp if r["pp_n_tokens"]})
    tg_n = sorted({r["tg_n_tokens"] for r in sp if r["tg_n_tokens"]})
    pp_h = f"prefill t/s (pp{pp_n[0]})" if len(pp_n) == 1 else "prefill t/s"
    tg_h = f"decode t/s (tg{tg_n[0]})" if len(tg_n) == 1 else "decode t/s"
    heads = [h for _, h in cols] + [pp_h + " [95% CI]", tg_h + " [95% CI]", "samples"]
    any_busy = any(r["machine_busy"] for r in sp)
    if any_busy:
        heads.append("machine")
    body = []
    for r in sp:
        cells = []
        for t in ("pp", "tg"):
            cv = r[f"{t}_tokens_per_s_cv"]
            cells.append(fmt_ts(r[f"{t}_tokens_per_s_mean"], r[f"{t}_tokens_per_s_ci95_low"],
                                r[f"{t}_tokens_per_s_ci95_high"], cv is not None and cv >= 0.10)
                         + (" †" if r["ops_off_device_llamacpp"] else ""))
        n = sorted({x for x in (r["pp_n_samples"], r["tg_n_samples"]) if x})
        body.append(_cells(r, cols) + cells + ["/".join(map(str, n)) or DASH])
        if any_busy:
            body[-1].append(f"⚠️ busy ({_f1(r['others_cpu_share_pct'])}% of the CPUs to other work)"
                            if r["machine_busy"] else ("quiet" if r["machine_busy"] is not None else DASH))
    intro = ("Tokens per second measured at the given KV depth (the cache already holds *depth* tokens when the timed "
             "tests start): mean and the 95% confidence interval of the mean (Student t) over every repetition. "
             "`!` marks results whose standard deviation is at least 10% of the mean (a busy machine: rerun with more "
             "repetitions on a quiet one).")
    off = sorted({r["ops_off_device_llamacpp"] for r in sp if r["ops_off_device_llamacpp"]})
    if off:
        intro += (" `†`: llama.cpp's scheduler ran part of the graph on the CPU although the layers are offloaded (its "
                  "dry run's op placement, GGML_SCHED_DEBUG=2): " + "; ".join(off) + ". The device's backend has no "
                  "kernel for that op with these settings (e.g. flash attention over a K/V type a default CUDA build "
                  "does not compile), so those speeds are largely the CPU's.")
    if any_busy:
        intro += (" *busy*: other processes used at least 10% of the CPUs before or during that configuration "
                  "(sampled by edgekv bench): its speeds describe a shared machine; `edgekv compare` gives them no "
                  "verdict unless --force.")
    return [Table("Speed, measured", intro, heads, body, _align(cols, 3) + (["l"] if any_busy else []))]


def _quality_table(rows: list[dict[str, Any]]) -> list[Table]:
    q = [r for r in rows if r["quality_status"] == "ok" and (r["kld_mean"] is not None or r["ppl"] is not None)]
    if not q:
        return []
    cols = _setting_cols(q, False)
    heads = [h for _, h in cols] + ["PPL", "Δ PPL vs f16", "mean KLD vs f16", "KLD p99", "same top token",
                                    "KV saving vs f16, predicted"]
    body = []
    for r in q:
        ppl = DASH if r["ppl"] is None else (f"{r['ppl']:.4f}" + (f" ± {r['ppl_err']:.4f}" if r["ppl_err"] else ""))
        kld = DASH if r["kld_mean"] is None else (f"{r['kld_mean']:.6f}" +
                                                  (f" ± {r['kld_mean_err']:.6f}" if r["kld_mean_err"] else ""))
        body.append(_cells(r, cols) + [ppl, fmt_pct(r["ppl_delta_pct"], 2), kld,
                                       DASH if r["kld_p99"] is None else f"{r['kld_p99']:.6f}",
                                       DASH if r["same_top_rate"] is None else f"{100 * r['same_top_rate']:.2f}%",
                                       fmt_x(r["kv_saving_vs_f16_formula"])])
    intro = ("Quality cost of the cache type, measured: perplexity and the KL divergence of each token's distribution "
             "from the f16-cache baseline on the same model and text (± is the standard error). Δ PPL is against the "
             "baseline of the same pass.")
    return [Table("Quality, measured", intro, heads, body, _align(cols, 6))]


def _problems(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["status"] != "ok":
            out.append(f"{units.row_kv_label(r)} @ {_ctx(r['n_ctx'])}"
                       + (f" (-fa {r['flash_attn']})" if r["flash_attn"] not in (None, "auto") else "")
                       + f": **{r['status']}**: {_md_safe(str(r['reason'] or 'no reason recorded'))}")
        elif r["kv_matches_formula_llamacpp"] is False:
            out.append(f"{units.row_kv_label(r)} @ {_ctx(r['n_ctx'])}: llama.cpp's KV lines differ from the formula "
                       f"({_md_safe(str(r['kv_diffs_llamacpp']))}) — a bug in edgekv's prediction; please report it.")
        qs, reason = r["quality_status"], r["quality_error"]
        if qs not in (None, "ok"):
            out.append(f"{units.row_kv_label(r)} @ {_ctx(r['n_ctx'])}: quality {qs}"
                       + (f": {_md_safe(str(reason))}" if reason else ""))
    return out


@dataclass
class Document:
    title: str
    predicted_only: bool
    sections: list[Section]
    plots: dict[str, bytes]
    note: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)      # the frame's rows, report order, as printed
    records: list[Record] = field(default_factory=list)           # the records, report order


def build(records: Sequence[Record | dict[str, Any]], title: str | None = None, plots: bool = True,
          note: str | None = None) -> Document:
    """The report of these records (Records, or dicts decoded once with as_record): every table, problem and plot
    reads the frame's rows (:func:`report_rows`)."""
    if not records:
        from edgekv.errors import ResultsError

        raise ResultsError("no records to report on")
    recs = sort_records(typed(records))
    rows = report_rows(recs)
    models: dict[str, list[int]] = {}
    for i, r in enumerate(recs):
        models.setdefault(str(_v(r.model.name) or r.model.path or "model"), []).append(i)
    predicted_only = all(r.kind == KIND_PREDICT for r in recs)
    names = sorted(models)
    if title is None:
        title = f"edgekv report: {', '.join(names)}" + (" (predicted only)" if predicted_only else "")
    sections = [_env_section(recs)]
    images: dict[str, bytes] = {}
    for name in names:
        idx = models[name]
        mrows = [rows[i] for i in idx]
        mrecs = [recs[i] for i in idx]
        sec = _model_section(name, mrecs)
        sec.tables += _pivot_tables(mrows) + _memory_tables(mrows) + _speed_table(mrows) + _quality_table(mrows)
        sec.tables += _explained_memory(mrecs) + _explained_speed(mrecs) + _predicted_speed(mrecs)
        sec.tables += _parallel(mrows)
        if plots:
            from edgekv.output import plots as P

            slug = "" if len(names) == 1 else "-" + _slug(name)
            for fname, alt, png in P.all_plots(mrows, slug) + _explained_plot(mrecs, slug) + \
                    _explained_speed_plots(mrecs, slug) + _predicted_speed_plot(mrecs, slug) + \
                    _parallel_plot(mrows, slug):
                images[fname] = png
                sec.images.append((fname, alt))
        sec.bullets = _problems(mrows)
        sections.append(sec)
    sections.append(_legend(recs, predicted_only))
    return Document(title, predicted_only, sections, images, note.strip() if note and note.strip() else None,
                    rows, recs)


def _explained_memory(recs: list[Record]) -> list[Table]:
    """The explained-memory table (edgekv.output.memreport): measured peak vs the whole-process prediction's parts."""
    from edgekv.output.memreport import table

    t = table(recs)
    return [Table(*t)] if t is not None else []


def _explained_plot(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    from edgekv.output.memreport import plot

    png = plot(recs)
    return [(f"explained_memory{slug}.png", "Explained memory: predicted parts and measured peak RSS", png)] if png else []


def _explained_speed(recs: list[Record]) -> list[Table]:
    """The explained-speed table (edgekv.output.speedreport): measured tokens/s vs the speed model's prediction."""
    from edgekv.output.speedreport import table

    t = table(recs)
    return [Table(*t)] if t is not None else []


def _explained_speed_plots(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    from edgekv.output.speedreport import plots

    return [(f"{stem}{slug}.png", alt, png) for stem, alt, png in plots(recs)]


def _predicted_speed(recs: list[Record]) -> list[Table]:
    """The speed model's tokens/s of records that were not run (edgekv.output.speedreport)."""
    from edgekv.output.speedreport import predicted_table

    t = predicted_table(recs)
    return [Table(*t)] if t is not None else []


def _predicted_speed_plot(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    from edgekv.output.speedreport import predicted_plot

    png = predicted_plot(recs)
    return [(f"speed_predicted{slug}.png", "Decode and prefill speed vs context, predicted", png)] if png else []


def _parallel(rows: list[dict[str, Any]]) -> list[Table]:
    """Sequences at once (-npl) and the user's llama-server: throughput, latency and memory against N
    (edgekv.output.parallelreport)."""
    from edgekv.output.parallelreport import table

    t = table(rows)
    return [Table(*t)] if t is not None else []


def _parallel_plot(rows: list[dict[str, Any]], slug: str) -> list[tuple[str, str, bytes]]:
    from edgekv.output.parallelreport import plot

    png = plot(rows)
    return [(f"parallel{slug}.png", "Throughput, time to first token and memory against sequences at once", png)] \
        if png else []


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:40] or "model"


def _legend(recs: list[Record], predicted_only: bool) -> Section:
    sec = Section("How to read this report")
    sec.bullets = [
        "**predicted (formula)**: edgekv's KV-cache bytes from the GGUF header alone, following llama.cpp's rules "
        "(context padding, sliding-window and shared-KV layers, block sizes of the cache type).",
        "**llama.cpp**: figures llama.cpp printed itself — its dry run (`no_alloc`, nothing read or allocated) and, in a "
        "measured run, its own `llama_kv_cache: size` lines. A disagreement with the formula is an edgekv bug.",
    ]
    if not predicted_only:
        sec.bullets += [
            "**measured**: what the operating system measured for the run's process, and the timed tests. Values a run "
            f"did not record are shown as `{DASH}`; nothing is filled in from another source.",
            "Savings (×) divide the f16/f16 figure by the figure of the same configuration with the other cache type.",
        ]
    kinds = sorted({r.kind for r in recs})
    if KIND_LLAMA_BENCH in kinds:
        sec.bullets.append("Rows from llama-bench files carry speed only (llama-bench measures no memory); their context "
                           "is llama-bench's own (depth + test tokens).")
    sec.bullets.append("Files: `results.csv` and `results.json` (one row per configuration, every column above with units "
                       "in the names), the PNG plots, and `report.html` (this report in one self-contained file). "
                       "Regenerate with `edgekv report RESULTS.jsonl -o DIR`.")
    return sec


# -- Markdown -------------------------------------------------------------------------------------------

def md_table(t: Table) -> list[str]:
    out = []
    if t.title:
        out += [f"### {t.title}", ""]
    if t.intro:
        out += [t.intro, ""]
    al = t.align or ["r"] * len(t.headers)
    out.append("| " + " | ".join(_md_safe(h) for h in t.headers) + " |")
    out.append("|" + "|".join(":---" if a == "l" else "---:" for a in al) + "|")
    for row in t.rows:
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    return out


def banner(doc: Document) -> str:
    """The first line of a predicted-only report (Markdown): what nothing in it was, and where its figures come from."""
    if not has_speed_prediction(doc.rows):
        return "**Predicted only.** Nothing in this report was measured: the figures are computed from GGUF metadata."
    return ("**Predicted only.** No model in this report was run: the memory figures are computed from GGUF metadata, "
            "the speed figures from it and a short speed calibration of one machine (`edgekv calibrate`: small "
            "synthetic models with zero weights, run through llama.cpp).")


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    if doc.predicted_only:
        out += [f"> {banner(doc)}", ""]
    if doc.note:
        out += [doc.note, ""]
    for sec in doc.sections:
        out += [f"## {sec.title}", ""]
        for p in sec.paragraphs:
            out += [p, ""]
        for t in sec.tables:
            out += md_table(t)
        for fname, alt in sec.images:
            out += [f"![{alt}]({fname})", ""]
        if sec.bullets:
            out += [f"- {b}" for b in sec.bullets] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


# -- CSV / JSON -----------------------------------------------------------------------------------------

def render_csv(doc: Document) -> str:
    """results.csv: the frame's rows through :data:`EXPORT`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = export_columns(doc.rows)
    w.writerow(cols)
    for x in doc.rows:
        r = export_row(x)
        w.writerow(["" if r.get(c) is None else _csv_value(r[c]) for c in cols])
    return buf.getvalue()


def _csv_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def render_json(doc: Document) -> str:
    """results.json: the environments, and the frame's rows through :data:`EXPORT` (and :data:`EXPORT_LOAD`)."""
    envs: dict[str, dict[str, Any]] = {}
    for r in doc.records:
        if r.kind == KIND_PREDICT:
            continue
        envs.setdefault(F.device_label(r), {k: v for k, v in r.environment.items() if k not in ("argv", "time_utc")})
    obj = {
        "edgekv_report": REPORT_FORMAT, "title": doc.title, "predicted_only": doc.predicted_only,
        "environments": [{"device": k, **v} for k, v in sorted(envs.items())],
        "columns": list(export_columns(doc.rows)),
        "rows": [export_row(x) for x in doc.rows],
    }
    return json.dumps(obj, indent=1, sort_keys=False, ensure_ascii=False, default=str) + "\n"


# -- HTML -----------------------------------------------------------------------------------------------

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;max-width:1200px;margin:2em auto;
padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #d0d7de;padding-bottom:.3em}h2{margin-top:1.8em;border-bottom:1px solid #d0d7de}
h3{margin-top:1.4em}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top}th{background:#f3f5f7}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}td.l,th.l{text-align:left}tr:nth-child(even) td{background:#fafbfc}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:.6em 1em;border-radius:6px}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}code{background:#f3f5f7;padding:0 .25em;border-radius:3px;
font-size:90%}
""".strip()


def _inline_md(s: str) -> str:
    """The little Markdown the report uses in text (**bold**, *em*, `code`) as HTML."""
    s = html.escape(s.replace("\\|", "|"), quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"\*([^*]+)\*", r"<em>\1</em>", s)
    return s


def render_html(doc: Document) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{html.escape(doc.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
           f"<h1>{html.escape(doc.title)}</h1>"]
    if doc.predicted_only:
        out.append(f'<p class="note">{_inline_md(banner(doc))}</p>')
    if doc.note:
        out += [f"<p>{_inline_md(p)}</p>" for p in doc.note.split("\n\n")]
    for sec in doc.sections:
        out.append(f"<h2>{html.escape(sec.title)}</h2>")
        for p in sec.paragraphs:
            out.append(f"<p>{_inline_md(p)}</p>")
        for t in sec.tables:
            if t.title:
                out.append(f"<h3>{html.escape(t.title)}</h3>")
            if t.intro:
                out.append(f"<p>{_inline_md(t.intro)}</p>")
            al = t.align or ["r"] * len(t.headers)
            out.append("<table><thead><tr>" + "".join(f'<th class="{a}">{_inline_md(h)}</th>' for h, a in zip(t.headers, al))
                       + "</tr></thead><tbody>")
            for row in t.rows:
                out.append("<tr>" + "".join(f'<td class="{a}">{_inline_md(c)}</td>' for c, a in zip(row, al)) + "</tr>")
            out.append("</tbody></table>")
        for fname, alt in sec.images:
            png = doc.plots.get(fname)
            if png is None:
                continue
            b64 = base64.b64encode(png).decode("ascii")
            out.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'
                       f"<figcaption>{html.escape(alt)}</figcaption></figure>")
        if sec.bullets:
            out.append("<ul>" + "".join(f"<li>{_inline_md(b)}</li>" for b in sec.bullets) + "</ul>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


# -- writing the folder ---------------------------------------------------------------------------------

_PLOT_RE = re.compile(r"^(memory_vs_context|speed_vs_depth|kld|explained_memory|explained_speed|speed_model_vs_depth"
                      r"|speed_predicted)(-[a-z0-9-]+)?\.png$")


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, data)


def write_report(records: Sequence[Record | dict[str, Any]], outdir: str | os.PathLike, title: str | None = None,
                 plots: bool = True, note: str | None = None) -> dict[str, Any]:
    """Render every file of a report into ``outdir``; returns what was written."""
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        from edgekv.errors import UsageError

        raise UsageError(f"-o {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    doc = build(records, title=title, plots=plots, note=note)
    for old in out.iterdir():      # plots of an earlier report that this one no longer has
        if _PLOT_RE.match(old.name) and old.name not in doc.plots:
            old.unlink()
    files = {
        "README.md": render_markdown(doc).encode(),
        "results.csv": render_csv(doc).encode(),
        "results.json": render_json(doc).encode(),
        **doc.plots,
        "report.html": render_html(doc).encode(),
    }
    for name, data in files.items():
        _write(out / name, data)
    kinds: dict[str, int] = {}
    for r in doc.records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    return {
        "output": str(out), "title": doc.title, "predicted_only": doc.predicted_only, "records": len(records),
        "kinds": dict(sorted(kinds.items())), "files": [str(out / n) for n in files],
        "bytes": {n: len(d) for n, d in files.items()},
    }


__all__ = ["COLUMNS", "EXPORT", "Document", "build", "csv_rows", "render_csv", "render_html", "render_json",
           "render_markdown", "write_report", "KIND_BENCH"]
