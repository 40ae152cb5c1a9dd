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
frame and read by users' scripts, so :data:`edgekv.output.export.EXPORT` maps each to its frame column, once.  A
value a record does not hold is shown as ``–`` (never filled in from another source).  Rendering is deterministic: the
same records give byte-identical Markdown, CSV and JSON (no rendering timestamps, a stable sort, fixed float
formatting); PNGs carry no software/date metadata.

This module builds the report's document (:func:`build`) and writes its folder (:func:`write_report`);
:mod:`edgekv.output.envsection` writes its Environment section (machines, builds, the edgekv commit);
:mod:`edgekv.output.export` makes the rows (order, rounding, results.csv / results.json columns) and
:mod:`edgekv.output.render` turns the document into Markdown, CSV, JSON and HTML.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekv.core import units
from edgekv.core.units import MIB
from edgekv.errors import ResultsError, UsageError
from edgekv.output import memreport, parallelreport, speedreport
from edgekv.output import plots as P
from edgekv.output.envsection import env_section
from edgekv.output.export import report_rows, sort_records, type_rank, typed
from edgekv.output.inputs import KIND_BENCH, KIND_LLAMA_BENCH, KIND_PREDICT
from edgekv.output.render import (
    DASH,
    Document,
    Section,
    Table,
    md_safe,
    render_csv,
    render_html,
    render_json,
    render_markdown,
)
from edgekv.records.frame import unset_none as _v
from edgekv.records.schema import Record
from edgekv.sources.safepath import atomic_write

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
                  "comparison with the prediction; the device rounds each allocation up (CUDA in 2 MiB steps where "
                  "measured), so a few MiB remain (the host-side measured columns then hold no KV)")
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
    types = sorted({r["type_k"] for r in ok}, key=type_rank)
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
                       + f": **{r['status']}**: {md_safe(str(r['reason'] or 'no reason recorded'))}")
        elif r["kv_matches_formula_llamacpp"] is False:
            out.append(f"{units.row_kv_label(r)} @ {_ctx(r['n_ctx'])}: llama.cpp's KV lines differ from the formula "
                       f"({md_safe(str(r['kv_diffs_llamacpp']))}) — a bug in edgekv's prediction; please report it.")
        qs, reason = r["quality_status"], r["quality_error"]
        if qs not in (None, "ok"):
            out.append(f"{units.row_kv_label(r)} @ {_ctx(r['n_ctx'])}: quality {qs}"
                       + (f": {md_safe(str(reason))}" if reason else ""))
    return out


def build(records: Sequence[Record | dict[str, Any]], title: str | None = None, plots: bool = True,
          note: str | None = None) -> Document:
    """The report of these records (Records, or dicts decoded once with as_record): every table, problem and plot
    reads the frame's rows (:func:`edgekv.output.export.report_rows`)."""
    if not records:
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
    sections = [env_section(recs)]
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
    t = memreport.table(recs)
    return [Table(*t)] if t is not None else []


def _explained_plot(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    png = memreport.plot(recs)
    return [(f"explained_memory{slug}.png", "Explained memory: predicted parts and measured peak RSS", png)] if png else []


def _explained_speed(recs: list[Record]) -> list[Table]:
    """The explained-speed table (edgekv.output.speedreport): measured tokens/s vs the speed model's prediction."""
    t = speedreport.table(recs)
    return [Table(*t)] if t is not None else []


def _explained_speed_plots(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    return [(f"{stem}{slug}.png", alt, png) for stem, alt, png in speedreport.plots(recs)]


def _predicted_speed(recs: list[Record]) -> list[Table]:
    """The speed model's tokens/s of records that were not run (edgekv.output.speedreport)."""

    t = speedreport.predicted_table(recs)
    return [Table(*t)] if t is not None else []


def _predicted_speed_plot(recs: list[Record], slug: str) -> list[tuple[str, str, bytes]]:
    png = speedreport.predicted_plot(recs)
    return [(f"speed_predicted{slug}.png", "Decode and prefill speed vs context, predicted", png)] if png else []


def _parallel(rows: list[dict[str, Any]]) -> list[Table]:
    """Sequences at once (-npl) and the user's llama-server: throughput, latency and memory against N
    (edgekv.output.parallelreport)."""
    t = parallelreport.table(rows)
    return [Table(*t)] if t is not None else []


def _parallel_plot(rows: list[dict[str, Any]], slug: str) -> list[tuple[str, str, bytes]]:
    png = parallelreport.plot(rows)
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


__all__ = ["build", "write_report", "KIND_BENCH"]
