"""PNG plots for reports (matplotlib, Agg backend).  Measures nothing; draws the report's rows of the results
frame (:func:`edgekv.output.export.report_rows`: :data:`edgekv.records.frame.COLUMNS`, rounded as printed).

* memory vs context: the prediction as a line per cache type, llama.cpp's own figures and the OS
  measurements as points (never joined to the prediction);
* tokens/s vs KV depth, prefill and decode, with 95% intervals;
* mean KL divergence per cache type, when quality was measured.

PNGs are written without Software/date metadata so that the same rows give the same bytes with the
same matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from edgekv import heavy
from edgekv.core.cachetypes import CACHE_TYPES
from edgekv.core.units import MIB, row_kv_label

# one fixed colour per cache type, in every plot of every report
_COLORS = {
    "f32": "#7f7f7f", "f16": "#1f77b4", "bf16": "#17becf", "q8_0": "#2ca02c", "q5_1": "#bcbd22", "q5_0": "#ff7f0e",
    "q4_1": "#9467bd", "iq4_nl": "#8c564b", "q4_0": "#d62728",
}


def kv_color(kv: str) -> str:
    return _COLORS.get(kv.split("/")[0], "#333333")


def _order(kvs) -> list[str]:
    def rank(kv: str):
        ct = CACHE_TYPES.get(kv.split("/")[0])
        return (-(ct.bits_per_element if ct else 0), kv)
    return sorted(kvs, key=rank)


def new_figure(ncols: int):
    plt = heavy.pyplot()
    plt.rcParams.update(plt.rcParamsDefault)
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "svg.hashsalt": "edgekv",
                         "path.simplify": False})
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 3.8), dpi=100, squeeze=False)
    return plt, fig, axes[0]


def stacked_bars(labels: list[str], stacks: list[list[tuple[str, float]]], colors: dict[str, str],
                 after: Callable[[object, int, int, float], None]):
    """A figure of one horizontal bar a row (top to bottom), its (part, width) stacks in order, each part in its
    colour and named once in the legend (on the top bar); ``after(ax, i, y, end)`` draws what row ``i`` adds past the
    end of its parts.  Returns (plt, fig, ax) for the caller's axis labels and legend."""
    plt, fig, axes = new_figure(1)
    ax = axes[0]
    fig.set_size_inches(8.0, 0.32 * len(labels) + 1.6)
    ys = list(range(len(labels)))[::-1]
    for i, (y, parts) in enumerate(zip(ys, stacks)):
        left = 0.0
        for k, w in parts:
            ax.barh(y, w, left=left, color=colors[k], edgecolor="none", label=k if i == 0 else None)
            left += w
        after(ax, i, y, left)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    return plt, fig, ax


def measured_tick(ax, x: float, y: int, label: str | None) -> None:
    """The measured value of a stacked bar's row: a black tick."""
    ax.plot([x], [y], marker="|", color="black", markersize=14, markeredgewidth=2, label=label)


def png_bytes(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _ctx_axis(ax, ctxs: list[int]) -> None:
    """Contexts on a log2 axis, labelled with their values (4096, 16384, ...)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ctxs)
    ax.set_xticklabels([f"{c // 1024}K" if c % 1024 == 0 and c >= 1024 else str(c) for c in ctxs])
    ax.xaxis.set_minor_locator(heavy.pyplot().NullLocator())
    ax.set_xlabel("context (n_ctx, tokens)")


def _device_groups(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({r["device"] for r in rows})


def memory_plot(rows: list[dict[str, Any]]) -> bytes | None:
    ok = [r for r in rows if r["status"] == "ok" and r["kv_bytes_formula"] is not None and r["n_ctx"]]
    if not ok:
        return None
    measured = [r for r in ok if r["peak_rss_bytes_measured"] is not None]
    plt, fig, axes = new_figure(2 if measured else 1)
    ax = axes[0]
    devices = _device_groups(ok)
    markers = ["o", "s", "^", "D", "v", "P"]
    for kv in _order({row_kv_label(r) for r in ok}):
        rs = sorted({(r["n_ctx"], r["kv_bytes_formula"]) for r in ok if row_kv_label(r) == kv})
        ax.plot([x for x, _ in rs], [y / MIB for _, y in rs], "-", color=kv_color(kv), lw=1.6, label=f"{kv} predicted")
        eng = sorted({(r["n_ctx"], r["kv_mib_llamacpp_dryrun"]) for r in ok
                      if row_kv_label(r) == kv and r["kv_mib_llamacpp_dryrun"] is not None})
        if eng and not measured:
            ax.plot([x for x, _ in eng], [y for _, y in eng], "x", color=kv_color(kv), ms=7, ls="none",
                    label=f"{kv} llama.cpp dry run")
        for di, dev in enumerate(devices):
            pts = sorted((r["n_ctx"], r["context_anon_growth_bytes_measured"]) for r in ok
                         if row_kv_label(r) == kv and r["device"] == dev and r["context_anon_growth_bytes_measured"] is not None)
            if pts:
                ax.plot([x for x, _ in pts], [y / MIB for _, y in pts], markers[di % len(markers)], color=kv_color(kv),
                        ms=5, ls="none", mfc="none",
                        label=f"{kv} context growth" + (f" ({dev.split(':')[0]})" if len(devices) > 1 else ""))
    _ctx_axis(ax, sorted({r["n_ctx"] for r in ok}))
    ax.set_ylabel("MiB")
    # the points are what creating the context added to the process (KV + output and scheduler buffers),
    # measured by the OS: the KV cache alone is never measured on its own
    ax.set_title("Predicted KV (lines) vs measured context growth (points)" if measured
                 else "KV cache, predicted")
    ax.legend(fontsize=7, ncol=2)
    if measured:
        ax = axes[1]
        for kv in _order({row_kv_label(r) for r in measured}):
            for di, dev in enumerate(devices):
                pts = sorted((r["n_ctx"], r["peak_rss_bytes_measured"]) for r in measured
                             if row_kv_label(r) == kv and r["device"] == dev)
                if pts:
                    ax.plot([x for x, _ in pts], [y / MIB for _, y in pts], markers[di % len(markers)] + "--",
                            color=kv_color(kv), ms=5, lw=0.8,
                            label=kv + (f" ({dev.split(':')[0]})" if len(devices) > 1 else ""))
        _ctx_axis(ax, sorted({r["n_ctx"] for r in measured}))
        ax.set_ylabel("MiB")
        ax.set_title("Peak RSS of the run, measured (OS)")
        ax.legend(fontsize=7, ncol=2)
    return png_bytes(plt, fig)


def speed_plot(rows: list[dict[str, Any]]) -> bytes | None:
    sp = [r for r in rows if r["status"] == "ok" and r["n_parallel"] is None
          and (r["pp_tokens_per_s_mean"] is not None or r["tg_tokens_per_s_mean"] is not None)]
    if not sp:
        return None
    plt, fig, axes = new_figure(2)
    devices = _device_groups(sp)
    for ax, test, title in ((axes[0], "pp", "Prefill"), (axes[1], "tg", "Decode")):
        for kv in _order({row_kv_label(r) for r in sp}):
            for di, dev in enumerate(devices):
                pts = sorted((r["n_depth"] or 0, r[f"{test}_tokens_per_s_mean"], r[f"{test}_tokens_per_s_ci95_low"],
                              r[f"{test}_tokens_per_s_ci95_high"]) for r in sp
                             if row_kv_label(r) == kv and r["device"] == dev and r[f"{test}_tokens_per_s_mean"] is not None)
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ys = [p[1] for p in pts]
                lo = [p[1] - p[2] if p[2] is not None else 0 for p in pts]
                hi = [p[3] - p[1] if p[3] is not None else 0 for p in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-" if di == 0 else "s--", color=kv_color(kv), ms=4, lw=1,
                            capsize=3, label=kv + (f" ({dev.split(':')[0]})" if len(devices) > 1 else ""))
        ax.set_xlabel("KV depth (tokens already in the cache)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{title}, measured (mean, 95% CI)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    return png_bytes(plt, fig)


def kld_plot(rows: list[dict[str, Any]]) -> bytes | None:
    q = [r for r in rows if r["quality_status"] == "ok" and r["kld_mean"] is not None]
    if not q:
        return None
    plt, fig, axes = new_figure(1)
    ax = axes[0]
    ctxs = sorted({r["n_ctx"] or 0 for r in q})
    kvs = _order({row_kv_label(r) for r in q})
    width = 0.8 / max(1, len(ctxs))
    for ci, n in enumerate(ctxs):
        xs, ys, es, cs = [], [], [], []
        for ki, kv in enumerate(kvs):
            r = next((r for r in q if row_kv_label(r) == kv and (r["n_ctx"] or 0) == n), None)
            if r is None:
                continue
            xs.append(ki + (ci - (len(ctxs) - 1) / 2) * width)
            ys.append(r["kld_mean"])
            es.append(r["kld_mean_err"] or 0)
            cs.append(kv_color(kv))
        ax.bar(xs, ys, width=width * 0.9, yerr=es, color=cs, alpha=0.4 + 0.6 * (ci + 1) / len(ctxs), capsize=3,
               label=f"n_ctx {n}" if len(ctxs) > 1 else None)
    ax.set_xticks(range(len(kvs)))
    ax.set_xticklabels(kvs)
    ax.set_ylabel("mean KL divergence vs f16 cache (nats)")
    ax.set_title("Quality cost per cache type, measured (± standard error)")
    if len(ctxs) > 1:
        ax.legend(fontsize=7)
    return png_bytes(plt, fig)


def all_plots(rows: list[dict[str, Any]], slug: str = "") -> list[tuple[str, str, bytes]]:
    out = []
    for name, alt, fn in (("memory_vs_context", "Memory vs context per cache type", memory_plot),
                          ("speed_vs_depth", "Tokens per second vs KV depth", speed_plot),
                          ("kld", "Mean KL divergence per cache type", kld_plot)):
        png = fn(rows)
        if png is not None:
            out.append((f"{name}{slug}.png", alt, png))
    return out
