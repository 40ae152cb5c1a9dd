"""Terminal display for ``edgekv bench``: progress with ETA while it runs, a summary table after."""

from __future__ import annotations

import threading
from typing import Any

from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from edgekv.core.llamalog import off_device_text
from edgekv.core.predict import llama_mib
from edgekv.core.units import MIB, kv_label
from edgekv.machine.load import record_busy
from edgekv.output.inputs import compared_kv, speed_of
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.records.frame import off_device_of, unset_none


def case_label(s: S.Settings) -> str:
    kv = kv_label(s.type_k, s.type_v)
    fa = "" if s.flash_attn == "auto" else f" fa={s.flash_attn}"
    rp = " repack=0" if s.repack is False else ""
    if s.n_parallel:
        return f"{kv} @ {s.n_ctx} (npl {s.n_parallel}){fa}{rp}"
    return f"{kv} @ {s.n_ctx} (d{s.n_depth}){fa}{rp}"


def case_work(s: S.Settings) -> int:
    """Rough work units (tokens) of one configuration, for the ETA; model load counts as 300."""
    warm = (s.n_prompt + 1) if s.warmup else 0
    chunks = (s.quality.chunks if s.quality else None) or 0
    quality = 2 * s.n_ctx * chunks     # its share of the group's pass (baseline + its own context)
    k = s.n_parallel or 1       # -npl: k prompts, and k tokens per decode step (cheaper than k steps)
    return 300 + warm + s.n_depth + s.repetitions * (k * s.n_prompt + 4 * s.n_gen) + quality


class Progress:
    """rich progress on stderr; silent when stderr is not a terminal."""

    def __init__(self, console) -> None:
        self.enabled = console.is_terminal
        self.p = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), TextColumn("ETA"),
                              TimeRemainingColumn(), console=console, disable=not self.enabled, transient=False,
                              # one redraw a second: each redraw is CPU taken from llama.cpp's threads while it is timed
                              refresh_per_second=1)
        self.task = None
        self.lock = threading.Lock()
        self.base = 0
        self.cur: S.Settings | None = None
        self.label = ""
        self.i = self.n = 0

    def __enter__(self) -> Progress:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.p.__exit__(*exc)

    def plan(self, work: int) -> None:
        """The bar for the sweep's work (:func:`case_work` summed over the cases to do)."""
        with self.lock:
            self.task = self.p.add_task("starting", total=max(1, work))

    def case(self, i: int, n: int, s: S.Settings) -> None:
        """Case ``i`` (0-based) of ``n`` starts."""
        with self.lock:
            self.cur = s
            self.i, self.n = i + 1, n
            self.label = case_label(s)
            self._desc("load")

    def child(self, ev: dict[str, Any]) -> None:
        """An event of the process measuring the case."""
        with self.lock:
            self._child(ev)

    def done(self) -> None:
        """The case's record was written: its share of the bar done."""
        with self.lock:
            if self.cur is not None and self.task is not None:
                self.base += case_work(self.cur)
                self.p.update(self.task, completed=self.base)

    def _desc(self, phase: str) -> None:
        if self.task is not None:
            self.p.update(self.task, description=f"[{self.i}/{self.n}] {self.label}: {phase}")

    def _child(self, ev: dict[str, Any]) -> None:
        s = self.cur
        if s is None or self.task is None:
            return
        phase = ev.get("phase", "")
        done = self.base + 300
        if phase == "quality":
            if ev.get("event") == "progress":
                self._desc(f"quality -c {ev.get('n_ctx')}: chunk {ev.get('chunks_done')}/{ev.get('n_chunks')}")
            elif ev.get("event") == "phase":
                self._desc("quality (perplexity, KLD vs f16)")
            return
        if ev.get("event") == "progress" and phase == "fill":
            done += ((s.n_prompt + 1) if s.warmup else 0) + ev.get("done", 0)
            self._desc(f"fill {ev.get('done')}/{ev.get('total')}")
            self.p.update(self.task, completed=done)
        elif ev.get("event") == "phase":
            if phase in ("pp", "tg"):
                r = ev.get("rep", 1)
                done += ((s.n_prompt + 1) if s.warmup else 0) + s.n_depth
                done += (r - 1) * (s.n_prompt + 4 * s.n_gen) if phase == "pp" else \
                    s.repetitions * s.n_prompt + (r - 1) * 4 * s.n_gen
                self._desc(f"{phase} {r}/{ev.get('reps')}")
                self.p.update(self.task, completed=done)
            else:
                self._desc(phase)


def _ts(speed: dict[str, S.SpeedTest | None], test: str, pred: str = "") -> str:
    """A measured test's cell, ``pred`` (:func:`predicted_cell`) under it."""
    v = speed.get(test)
    if v is None or v.mean_ts is None:
        return "-" + pred
    ci = v.ci95_ts
    half = f"±{(ci[1] - ci[0]) / 2:.1f}" if ci else ""
    warn = " !" if v.unstable else ""
    return f"{v.mean_ts:.1f}{half}{warn}{pred}"


def predicted_ts(r: S.Record, test: str) -> float | None:
    """The speed model's tokens/s for a test in a record (None: not predicted)."""
    pred = unset_none(r.prediction)
    sp = unset_none(pred.speed) if pred is not None else None
    t = unset_none(getattr(sp, test)) if sp is not None else None
    return t.tokens_per_s if t is not None else None


BUSY_MARK = "~"
WITHHELD = "withheld"


def predicted_cell(r: S.Record, test: str) -> str:
    """The line under a measured tokens/s: the speed model's prediction, dimmed, with BUSY_MARK (not dimmed) when
    its calibration was taken while other work used the CPUs; WITHHELD where edgekv withheld it (a term outside
    its physical bounds); "" where nothing was predicted."""
    sp = _speed_block(r)
    if sp is None:
        return ""
    v = predicted_ts(r, test)
    if v is not None:
        return f"\n{'[yellow]' + BUSY_MARK + '[/]' if unset_none(sp.calibration_busy) else ''}[dim]{v:.1f}[/]"
    return f"\n[yellow]{WITHHELD}[/]" if withheld_reason(r) else ""


def _speed_block(r: S.Record) -> S.SpeedPrediction | None:
    pred = unset_none(r.prediction)
    return unset_none(pred.speed) if pred is not None else None


def withheld_reason(r: S.Record) -> str | None:
    """Why the speed model withheld a record's prediction (edgekv.core.speedbounds), None when it did not."""
    sp = _speed_block(r)
    err = unset_none(sp.error) if sp is not None else None
    return err if isinstance(err, str) and err.startswith("withheld") else None


def speed_marks_legend(records: list[S.Record]) -> list[str]:
    """The legend lines of BUSY_MARK and WITHHELD, for the marks the records' rows show."""
    out = []
    if any(sp is not None and unset_none(sp.calibration_busy) for sp in map(_speed_block, records)):
        out.append(f"{BUSY_MARK} before a prediction: its calibration was taken while other work used the CPUs; its "
                   "terms passed their physical bounds, but the prediction may be slower than this machine's own "
                   "('edgekv calibrate' on a quiet machine measures it anew).")
    reasons = list(dict.fromkeys(w for r in records if (w := withheld_reason(r))))
    if reasons:
        out.append(f"{WITHHELD}: no prediction shown: {reasons[0]}"
                   + (f" (and {len(reasons) - 1} more reasons: --json)" if len(reasons) > 1 else "") + ".")
    return out


def off_device(r: S.Record) -> str | None:
    """What llama.cpp's dry run placed off the offloaded layers' device (prediction.engine.off_device), as a phrase."""
    return off_device_text(off_device_of(r))


def off_device_note(records: list[S.Record]) -> str | None:
    """One line when some configuration runs ops on the CPU although its layers are offloaded."""
    rows = [(r, off_device(r)) for r in records]
    rows = [(r, t) for r, t in rows if t]
    if not rows:
        return None
    what = sorted({t for _, t in rows})
    kvs = sorted({kv_label(r.settings.type_k, r.settings.type_v) for r, _ in rows})
    return (f"†: llama.cpp's scheduler runs part of the graph on the CPU although the layers are offloaded ({'; '.join(what)}; "
            f"K/V {', '.join(kvs)}): the device has no kernel for it with these settings (a default CUDA build compiles "
            "flash attention only for the K/V pairs its system info lists as FA_QUANTS), so those rows' speeds are "
            "largely the CPU's")


def predicted_peak(r: S.Record) -> int | None:
    pred = unset_none(r.prediction)
    proc = unset_none(pred.process) if pred is not None else None
    return proc.peak_rss_bytes if proc is not None else None


def _quality_cells(q: S.Quality | None) -> list[str]:
    if q is None:
        return ["-", "-"]
    if q.status != "ok" or q.quality is None:
        return ["-", f"[yellow]{q.status}[/]"]
    v = q.quality
    return [f"{v.ppl:.4f}", f"{v.kld_mean:.6f} ± {v.kld_mean_err:.6f}"]


_WIDE = (("n_ctx", "right"), ("depth", "right"), ("K/V", "left"), ("KV MiB\nformula", "right"),
         ("KV MiB\nllama.cpp", "right"), ("same", "center"), ("peak RSS\nMiB", "right"),
         ("anon\nMiB", "right"), ("pp t/s", "right"), ("tg t/s", "right"), ("status", "left"))
# below 110 columns (an 80-column terminal): depth, llama.cpp's KV and anon go; ✓ beside the formula's KV
# says llama.cpp printed the same bytes (issue 19)
_NARROW = (("n_ctx", "right"), ("K/V", "left"), ("KV MiB\n= llama", "right"), ("peak\nRSS MiB", "right"),
           ("pp t/s", "right"), ("tg t/s", "right"), ("status", "left"))


def _summary_row(r: S.Record, narrow: bool, with_gpu: bool, with_quality: bool) -> list[str]:
    s = r.settings
    n_ctx, total = compared_kv(r)
    kv = kv_label(s.type_k, s.type_v)
    log, mem, diff = unset_none(r.llama_log), unset_none(r.memory), unset_none(r.differences)
    match = unset_none(diff.llama_kv_matches_formula) if diff is not None else None
    same = {True: "[green]✓[/]", False: "[red]✗[/]"}.get(match, "-")
    formula_mib = llama_mib(total) if total is not None else "-"
    llama_kv = f"{log.kv_mib + (unset_none(log.recurrent_mib) or 0):.2f}" if log is not None else "-"
    if r.status != "ok" and (log is None or not log.kv):     # llama.cpp allocated no cache: nothing to compare
        llama_kv, same = "-", "-"
    peak_b = mem.peak_rss_bytes if mem is not None else None
    anon_b = unset_none(mem.anon_after_fill_bytes) if mem is not None else None
    peak_p = predicted_peak(r)
    peak = (f"{peak_b / MIB:.1f}" if peak_b else "-") + (f"\n[dim]{peak_p / MIB:.1f}[/]" if peak_p else "")
    anon = f"{anon_b / MIB:.1f}" if anon_b else "-"
    status = r.status if r.status == "ok" else f"[yellow]{r.status}: {r.reason}[/]"
    if off_device(r):
        status += " [yellow]†[/]"
    if record_busy(r):
        status += f" [yellow]busy {100 * r.load.others_share_max:.0f}%[/]"
    sp = {t: speed_of(r, t) for t in ("pp", "tg")}
    pp, tg = _ts(sp, "pp", predicted_cell(r, "pp")), _ts(sp, "tg", predicted_cell(r, "tg"))
    npl = unset_none(s.n_parallel)
    seq = speed_of(r, "tg_seq")
    if npl and seq is not None and seq.mean_ts is not None:
        tg += f"\n{seq.mean_ts:.1f} /seq"
    depth = f"npl {npl}" if npl else str(s.n_depth)
    row = [str(n_ctx), depth, kv, formula_mib, llama_kv, same, peak, anon, pp, tg, status]
    if narrow:
        row = [str(n_ctx), kv, f"{formula_mib} {same}", peak, pp, tg, status]
    if with_gpu:
        g = mem.peak_gpu_bytes if mem is not None else None
        gc = unset_none(diff.context_gpu_growth_bytes) if diff is not None else None
        row += [f"{g / MIB:.1f}" if g else "-", f"{gc / MIB:.1f}" if gc is not None else "-"]
    if with_quality:
        row += _quality_cells(unset_none(r.quality))
    return row


def _gpu_seen(r: S.Record) -> bool:
    mem, diff = unset_none(r.memory), unset_none(r.differences)
    return bool(mem is not None and mem.peak_gpu_bytes) or (
        diff is not None and unset_none(diff.context_gpu_growth_bytes) is not None)


def render_summary(con, records: list[S.Record | dict[str, Any]], output: str) -> None:
    """The table after a bench: one row per record (Records, or the sweep's plain record dicts: decoded once here)."""

    if not records:
        return
    records = R.latest([R.as_record(r, f"{output}: record {i}") for i, r in enumerate(records, 1)])
    m = records[0].model
    t = Table(title=f"{m.name} ({unset_none(m.arch)}): measured, beside the prediction", title_justify="left")
    narrow = con.width < 110
    for col, j in _NARROW if narrow else _WIDE:
        t.add_column(col, justify=j)
    with_gpu = any(_gpu_seen(r) for r in records)
    if with_gpu:
        t.add_column("GPU MiB\npeak", justify="right")
        t.add_column("GPU MiB\ncontext", justify="right")
    with_quality = any(unset_none(r.quality) is not None for r in records)
    if with_quality:
        t.add_column("PPL", justify="right")
        t.add_column("KLD vs f16", justify="right")
    for r in records:
        t.add_row(*_summary_row(r, narrow, with_gpu, with_quality))
    con.print(t)
    busy_rows = any(record_busy(r) for r in records)
    unstable = any(v is not None and v.unstable for r in records for v in (speed_of(r, "pp"), speed_of(r, "tg")))
    _summary_legend(con, narrow, with_gpu, with_quality, busy_rows, unstable)
    for line in speed_marks_legend(records):
        con.print(f"[yellow]{line}[/]", highlight=False)
    if any(unset_none(r.settings.n_parallel) for r in records):
        con.print("npl N: N sequences at once from an empty cache (-npl); pp and tg are tokens/s of all of them, /seq "
                  "what each one gets." + (" llama-server rows: the server process's memory sampled from outside; pp "
                  "from the server's own prompt_ms, tg all requests' tokens/s while all of them decode, measured by "
                  "the client; time to first token in the lines above and in --json (serving)."
                  if any(unset_none(r.serving) is not None for r in records) else ""))
    if any(compared_kv(r)[0] != r.settings.n_ctx for r in records):
        con.print("llama-bench sizes each test's context itself (depth + the test's tokens; it has no -c): those rows' "
                  "n_ctx and KV are its prompt test's context, the formula predicted for that context.")
    note = repack_note(records)
    if note:
        con.print(f"[yellow]{note}[/]", highlight=False)
    note = off_device_note(records)
    if note:
        con.print(f"[yellow]{note}[/]", highlight=False)
    con.print(f"Results: {output}")


def repack_note(records: list[S.Record]) -> str | None:
    """One line when the records were measured with --repack 0 because the extra-buffer preflight saw llama.cpp's
    AMX/CPU_REPACK kernels crash on this machine (the environment block says so), else None."""
    for r in records:
        pf = unset_none(r.environment.extra_buffers_preflight)
        if pf is not None and pf.runs is False and unset_none(r.settings.repack) is False:
            bufs = ", ".join(pf.extra_buffers_mib) or "extra buffer"
            return (f"--repack 0: llama.cpp's {bufs} kernels crash on this CPU" +
                    (" (llama.cpp #20824)" if "AMX" in bufs else "") + f" ({pf.detail}); measured without "
                    "those weight copies, the setting that runs here: decode is slower than llama.cpp's AMX path "
                    "where it works (docs/hardware.md)")
    return None


def _summary_legend(con, narrow: bool, with_gpu: bool, with_quality: bool, busy_rows: bool, unstable: bool) -> None:
    con.print("KV MiB: formula = predicted from the GGUF header; llama.cpp = its own `llama_kv_cache: size` lines in this "
              "run. Peak RSS = OS-measured peak of the run's process (sampled every 5 ms; during the timed tests read "
              "by the process itself after each repetition); anon = its anonymous pages "
              "after the cache was filled (KV, compute and output buffers; the weights are file-backed). t/s: mean ± "
              "95% interval over the repetitions. Under peak RSS, pp and tg, dimmed: edgekv's prediction made before "
              "the run (whole-process memory model; speed model with this machine's calibration, "
              "'edgekv calibrate')." + (
                  " GPU MiB: peak = the process's GPU memory (NVML, sampled); context = device memory the context "
                  "added (KV and compute buffers), read by the run right after the load and after the context."
                  if with_gpu else "") + (
                  " PPL and KLD: perplexity and mean KL divergence against the f16 cache on the same tokens "
                  "(llama-perplexity's method; edgekv quality)." if with_quality else ""))
    if narrow:
        con.print("(narrow layout: ✓ = llama.cpp's own KV size lines give the same bytes; widen the terminal or use "
                  "--json for depth, llama.cpp's figure and anonymous memory)")
    if busy_rows:
        con.print("[yellow]busy N%: other processes used N% of the CPUs before or during that configuration "
                  "(edgekv.machine.load); its speeds describe a shared machine, not this one: rerun on a quiet machine.[/]")
    if unstable:
        con.print("[yellow]! marks results whose standard deviation is at least 10% of the mean: the machine was busy "
                  "or the run too short; rerun with more repetitions (-r) on a quiet machine.[/]")
