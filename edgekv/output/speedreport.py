"""The report's "explained speed" section: each measured token's time beside the speed model's parts.

For each measured configuration whose record holds the speed prediction (``prediction.speed``, schema 3): the
predicted parts of one decoded token (fixed graph cost, weights, output head, attention at the depth) stacked in
milliseconds, the measured time per token as a marker; decode speed against depth with the measured points, the
predicted line and the bandwidth roofline; and the residual table.  Records without a speed prediction (older
schemas) are left out of the plots and listed as such in the table, never filled in.
"""

from __future__ import annotations

from typing import Any

from edgekv.core.units import kv_label
from edgekv.output.inputs import KIND_PREDICT, speed_of
from edgekv.output.plots import measured_tick, new_figure, png_bytes, stacked_bars
from edgekv.records.frame import unset_none as _v
from edgekv.records.schema import Record

PART_ORDER = ("fixed", "weights", "output head", "attention")
COLORS = {"fixed": "#8c8c8c", "weights": "#4c72b0", "output head": "#c44e52", "attention": "#dd8452"}


def _kv(r: Record) -> str:
    return kv_label(r.settings.type_k, r.settings.type_v)


def _label(r: Record) -> str:
    s = r.settings
    kv = _kv(r)
    extra = [f"-ub {s.n_ubatch}"] if s.n_ubatch not in (None, 512) else []
    npl = _v(s.n_parallel)
    if npl:     # -npl: N sequences from an empty cache, each decoding from the end of its -p prompt
        return f"npl{npl} {kv}" + (f" ({', '.join(extra)})" if extra else "") + f" t{s.n_threads}"
    return f"d{s.n_depth} {kv}" + (f" ({', '.join(extra)})" if extra else "") + f" t{s.n_threads}"


def _pred(r: Record, test: str) -> Any:
    p = _v(r.prediction)
    sp = _v(p.speed) if p is not None else None
    return _v(getattr(sp, test)) if sp is not None else None


def _meas(r: Record, test: str) -> float | None:
    t = speed_of(r, test)
    return t.mean_ts if t is not None else None


def rows(recs: list[Record]) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        if r.status != "ok":
            continue
        row: dict[str, Any] = {"label": _label(r), "depth": r.settings.n_depth, "kv": r.settings.type_k, "record": r}
        for t in ("pp", "tg"):
            p = _pred(r, t)
            row[f"{t}_measured"] = _meas(r, t)
            row[f"{t}_predicted"] = p.tokens_per_s if p is not None else None
            row[f"{t}_parts"] = {x.name: x.s_per_token for x in p.parts} if p is not None else None
        tg = _pred(r, "tg")
        row["roofline"] = tg.roofline_tokens_per_s if tg is not None else None
        if row["tg_measured"] is not None or row["pp_measured"] is not None:
            out.append(row)
    return out


def table(recs: list[Record]) -> tuple[str, str, list[str], list[list[str]], list[str]] | None:
    rs = rows(recs)
    if not any(x["tg_predicted"] is not None or x["pp_predicted"] is not None for x in rs):
        return None
    headers = ["configuration", "tg measured t/s", "tg predicted t/s", "tg Δ %", "pp measured t/s",
               "pp predicted t/s", "pp Δ %", "tg share of roofline", "largest part of a decoded token"]
    body = []
    for x in rs:
        cells = [x["label"]]
        for t in ("tg", "pp"):
            m, p = x[f"{t}_measured"], x[f"{t}_predicted"]
            busy = "~" if p and _v(_v(_v(x["record"].prediction).speed).calibration_busy) else ""
            cells += [f"{m:.1f}" if m else "–", f"{busy}{p:.1f}" if p else "–",
                      f"{100 * (m - p) / p:+.1f}" if m and p else "–"]
        roof = x["roofline"]
        cells.append(f"{100 * x['tg_measured'] / roof:.0f} %" if roof and x["tg_measured"] else "–")
        parts = x["tg_parts"]
        if parts:
            top = max(parts, key=parts.get)
            cells.append(f"{top} ({100 * parts[top] / sum(parts.values()):.0f} %)")
        else:
            cells.append("– (no speed prediction in this record)")
        body.append(cells)
    after = any(_v(_v(_v(r.prediction).speed).predicted_after_measurement) is not None for r in
                (x["record"] for x in rs if x["tg_predicted"] is not None or x["pp_predicted"] is not None))
    when = ("predicted *after* the run (added to these records later, with a calibration of that later day: see the "
            "note at the top)" if after else "predicted *before* the run")
    intro = (f"Tokens/s of each run beside edgekv's speed model (`edgekv/core/speed.py`), {when} "
             "from the GGUF header, llama.cpp's graph size and this machine's calibration (`edgekv calibrate`); "
             "Δ = (measured − predicted) / predicted. The roofline is the measured read bandwidth over the bytes a "
             "decoded token reads (weights + KV cache at that depth)." + (
                 " ~ before a prediction: its calibration was taken while other work used the CPUs (its terms "
                 "passed their physical bounds; the prediction may be slower than this machine's own)."
                 if any(_v(_v(_v(x["record"].prediction).speed).calibration_busy) for x in rs) else ""))
    return "Explained speed", intro, headers, body, ["l"] + ["r"] * (len(headers) - 1)


def plots(recs: list[Record]) -> list[tuple[str, str, bytes]]:
    """(file stem, alt text, PNG) of the stacked decode parts and of decode speed vs depth."""
    rs = [x for x in rows(recs) if x["tg_parts"]]
    if not rs:
        return []

    def after(ax, i: int, y: int, _left: float) -> None:
        if rs[i]["tg_measured"]:
            measured_tick(ax, 1000 / rs[i]["tg_measured"], y, "measured" if i == 0 else None)

    out = []
    plt, fig, ax = stacked_bars([x["label"] for x in rs],
                                [[(k, 1000 * x["tg_parts"].get(k, 0.0)) for k in PART_ORDER] for x in rs], COLORS, after)
    ax.set_xlabel("ms per decoded token")
    ax.set_title("Explained decode: predicted parts vs measured time per token")
    ax.legend(fontsize=7, loc="lower right", framealpha=0.95)
    out.append(("explained_speed", "Explained decode: predicted parts and measured time per token", png_bytes(plt, fig)))

    plt, fig, axes = new_figure(1)
    ax = axes[0]
    for kv in sorted({x["kv"] for x in rs}):
        sub = sorted((x for x in rs if x["kv"] == kv), key=lambda x: x["depth"])
        line = ax.plot([x["depth"] for x in sub], [x["tg_predicted"] for x in sub], label=f"{kv} predicted")[0]
        ax.scatter([x["depth"] for x in sub if x["tg_measured"]], [x["tg_measured"] for x in sub if x["tg_measured"]],
                   color=line.get_color(), marker="o", label=f"{kv} measured")
        roof = [(x["depth"], x["roofline"]) for x in sub if x["roofline"]]
        if roof:
            ax.plot([d for d, _ in roof], [v for _, v in roof], color=line.get_color(), linestyle=":", linewidth=1,
                    label=f"{kv} bandwidth bound")
    ax.set_xlabel("depth (tokens in the cache)")
    ax.set_ylabel("decode tokens/s")
    ax.set_yscale("log")
    ax.set_title("Decode speed vs depth: measured, predicted, bandwidth bound")
    ax.legend(fontsize=6, ncol=2)
    out.append(("speed_model_vs_depth", "Decode speed vs depth: measured points, predicted line, bandwidth bound",
                png_bytes(plt, fig)))
    return out


def predicted_rows(recs: list[Record]) -> list[dict[str, Any]]:
    """Predict records (no run) that hold a speed prediction: one row per configuration."""

    out = []
    for r in recs:
        if r.kind != KIND_PREDICT or r.status != "ok":
            continue
        tg, pp = _pred(r, "tg"), _pred(r, "pp")
        if tg is None and pp is None:
            continue
        out.append({"n_ctx": r.settings.n_ctx, "kv": _kv(r),
                    "depth": (tg or pp).depth, "tg": tg, "pp": pp,
                    "roofline": tg.roofline_tokens_per_s if tg is not None else None})
    return out


def predicted_table(recs: list[Record]) -> tuple[str, str, list[str], list[list[str]], list[str]] | None:
    """The predicted speed of predict records: tg and pp at the depth, the decode bound, the dominant part."""
    rs = predicted_rows(recs)
    if not rs:
        return None
    tg_n = sorted({x["tg"].n_tokens for x in rs if x["tg"] is not None})
    pp_n = sorted({x["pp"].n_tokens for x in rs if x["pp"] is not None})
    headers = ["n_ctx", "K/V", "depth", "decode t/s" + (f" (tg{tg_n[0]})" if len(tg_n) == 1 else ""),
               "prefill t/s" + (f" (pp{pp_n[0]})" if len(pp_n) == 1 else ""), "decode bound t/s",
               "share of the bound", "largest part of a decoded token"]
    body = []
    for x in rs:
        tg, pp, roof = x["tg"], x["pp"], x["roofline"]
        cells = [f"{x['n_ctx']:,}", x["kv"], f"{x['depth']:,}", _ts(tg.tokens_per_s if tg else None),
                 _ts(pp.tokens_per_s if pp else None), _ts(roof),
                 f"{100 * tg.tokens_per_s / roof:.0f} %" if tg is not None and roof else "–"]
        if tg is not None and tg.parts:
            top = max(tg.parts, key=lambda p: p.s_per_token)
            cells.append(f"{top.name} ({100 * top.s_per_token / tg.s_per_token:.0f} %)")
        else:
            cells.append("–")
        body.append(cells)
    intro = ("Tokens/s **predicted** by edgekv's speed model (`edgekv/core/speed.py`) for llama-bench's tests at depth "
             "= the context minus the prompt: the GGUF header's shapes and weight types times the coefficients of "
             "the speed calibration named under Environment (graph nodes, matrix throughput per weight type, "
             "attention per K/V type and head geometry, measured through llama.cpp on synthetic models). Nothing "
             "here was run. The decode bound is the calibration's measured read bandwidth over the bytes a decoded "
             "token reads (weights + KV cache at that depth). On other hardware every coefficient changes: run "
             "`edgekv predict` there (it calibrates that machine first), or `edgekv bench` to measure.")
    return "Speed, predicted", intro, headers, body, ["r", "l"] + ["r"] * (len(headers) - 2)


def _ts(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def predicted_plot(recs: list[Record]) -> bytes | None:
    """Predicted decode and prefill tokens/s against the context (depth), one line per K/V type, with the bound."""
    rs = predicted_rows(recs)
    if len({x["n_ctx"] for x in rs}) < 2:
        return None

    plt, fig, axes = new_figure(2)
    for ax, test in zip(axes, ("tg", "pp")):
        for kv in dict.fromkeys(x["kv"] for x in rs):
            sub = sorted((x for x in rs if x["kv"] == kv and x[test] is not None), key=lambda x: x["n_ctx"])
            if not sub:
                continue
            line = ax.plot([x["n_ctx"] for x in sub], [x[test].tokens_per_s for x in sub], marker="o",
                           label=f"{kv} predicted")[0]
            roof = [(x["n_ctx"], x["roofline"]) for x in sub if test == "tg" and x["roofline"]]
            if roof:
                ax.plot([d for d, _ in roof], [v for _, v in roof], color=line.get_color(), linestyle=":",
                        linewidth=1, label=f"{kv} bandwidth bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (depth = context − prompt)")
        ax.set_ylabel(("decode" if test == "tg" else "prefill") + " tokens/s, predicted")
        ax.set_title(("Decode" if test == "tg" else "Prefill") + " speed vs context (predicted)")
        ax.legend(fontsize=6, ncol=2)
    return png_bytes(plt, fig)
