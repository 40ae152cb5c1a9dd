"""Sequences decoded at once (``edgekv bench -npl``) and the user's llama-server (``--llama-server``) in a report:
throughput, time to first token and memory against N.  Measures nothing; reads the report's frame rows
(:func:`edgekv.output.export.report_rows`)."""

from __future__ import annotations

from typing import Any

from edgekv.core.units import MIB, row_kv_label
from edgekv.output.plots import kv_color, new_figure, png_bytes

DASH = "–"


def _ts(mean: float | None, lo: float | None, hi: float | None) -> str:
    if mean is None:
        return DASH
    return f"{mean:,.1f}" + (f" [{lo:,.1f}, {hi:,.1f}]" if lo is not None and hi is not None else "")


def _s(x: float | None) -> str:
    return DASH if x is None else f"{x:.3f}"


def _mib(b: float | None) -> str:
    return DASH if b is None else f"{b / MIB:,.1f}"


def _peak(r: dict[str, Any]) -> str:
    meas, pred = r["peak_rss_bytes_measured"], r["peak_rss_bytes_predicted"]
    if meas is None:
        return DASH
    if not pred:
        return _mib(meas)
    return f"{_mib(meas)} ({_mib(pred)}, {100 * (meas - pred) / pred:+.1f} %)"


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ok = [r for r in rows if r["n_parallel"] is not None and r["status"] == "ok"]
    return sorted(ok, key=lambda r: (str(r["engine"]), r["n_ctx"] or 0, row_kv_label(r), r["n_parallel"]))


def table(rows: list[dict[str, Any]]) -> tuple[str, str, list[str], list[list[str]], list[str]] | None:
    ok = _rows(rows)
    if not ok:
        return None
    server = any(r["engine"] == "llama-server" for r in ok)
    heads = ["engine", "n_ctx", "K/V", "N at once", "prefill t/s, all [95% CI]", "decode t/s, all [95% CI]",
             "decode t/s per sequence"]
    heads += ["TTFT p50 / p95 s", "failed requests"] if server else []
    heads += ["peak RSS MiB (predicted, residual)"]
    body = []
    for r in ok:
        cells = [str(r["engine"]), str(r["n_ctx"]), row_kv_label(r), str(r["n_parallel"]),
                 _ts(r["pp_tokens_per_s_mean"], r["pp_tokens_per_s_ci95_low"], r["pp_tokens_per_s_ci95_high"]),
                 _ts(r["tg_tokens_per_s_mean"], r["tg_tokens_per_s_ci95_low"], r["tg_tokens_per_s_ci95_high"]),
                 _ts(r["tg_seq_tokens_per_s_mean"], None, None)]
        if server:
            is_srv = r["engine"] == "llama-server"
            cells += [f"{_s(r['ttft_p50_s_measured'])} / {_s(r['ttft_p95_s_measured'])}" if is_srv else DASH,
                      str(r["serving_failed_requests"]) if is_srv else DASH]
        body.append(cells + [_peak(r)])
    intro = ("N sequences at once, each with -p prompt tokens then -n generated tokens from an empty cache in one -c "
             "context with -np N (llama-batched-bench's workload; `llama-cpp-python`: in edgekv's own child process). "
             "*all*: tokens of every sequence per second (prefill: N·p over the time of the whole prompt batch; "
             "decode: N·n over the decode steps); *per sequence*: what each one sees while the others decode beside "
             "it. Peak RSS beside the whole-process prediction for that -np, made before the run.")
    if server:
        intro += (" `llama-server`: the user's server started with -np N and driven by N concurrent streamed "
                  "requests (prompt as token ids, EOS ignored, no prompt cache) per repetition; prefill from the "
                  "server's own `prompt_ms` (llama.cpp), decode all requests' tokens per second while all of them "
                  "decode (client), "
                  "TTFT from sending a request to its first streamed token, the HTTP layer included.")
    align = ["l", "r", "l", "r", "r", "r", "r"] + (["r", "r"] if server else []) + ["r"]
    return "Sequences at once and serving, measured", intro, heads, body, align


def plot(rows: list[dict[str, Any]]) -> bytes | None:
    ok = _rows(rows)
    if not ok or len({r["n_parallel"] for r in ok}) < 2:
        return None

    server = any(r["ttft_p50_s_measured"] is not None for r in ok)
    plt, fig, axes = new_figure(3 if server else 2)
    groups = sorted({(str(r["engine"]), row_kv_label(r), r["n_ctx"]) for r in ok})
    for engine, kv, n_ctx in groups:
        g = sorted((r for r in ok if (str(r["engine"]), row_kv_label(r), r["n_ctx"]) == (engine, kv, n_ctx)),
                   key=lambda r: r["n_parallel"])
        xs = [r["n_parallel"] for r in g]
        style = dict(color=kv_color(kv), marker="o" if engine != "llama-server" else "s",
                     ls="-" if engine != "llama-server" else "--", ms=4, lw=1,
                     label=f"{kv} @ {n_ctx}" + (f" ({engine})" if len({e for e, _, _ in groups}) > 1 else ""))
        axes[0].plot(xs, [r["tg_tokens_per_s_mean"] for r in g], **style)
        peak = [r["peak_rss_bytes_measured"] / MIB if r["peak_rss_bytes_measured"] else None for r in g]
        axes[-1].plot(xs, peak, **style)
        pred = [(x, r["peak_rss_bytes_predicted"] / MIB) for x, r in zip(xs, g) if r["peak_rss_bytes_predicted"]]
        if pred:
            axes[-1].plot([p[0] for p in pred], [p[1] for p in pred], color=kv_color(kv), ls=":", lw=1)
        if server and engine == "llama-server":
            axes[1].plot(xs, [r["ttft_p50_s_measured"] for r in g], **style)
    axes[0].set_title("Decode, all sequences (measured)")
    axes[0].set_ylabel("tokens/s")
    axes[-1].set_title("Peak RSS (measured; dotted: predicted)")
    axes[-1].set_ylabel("MiB")
    if server:
        axes[1].set_title("Time to first token, p50 (llama-server)")
        axes[1].set_ylabel("seconds")
    for ax in axes:
        ax.set_xlabel("sequences at once (-npl; server: -np and concurrent requests)")
        ax.set_xticks(sorted({r["n_parallel"] for r in ok}))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    return png_bytes(plt, fig)
