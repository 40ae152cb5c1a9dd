"""What ``edgekv bench`` says while it runs: the plan first, then one plain line per finished configuration
(key figures, elapsed and remaining time, a busy-machine mark), with rich's progress bar on a terminal.

It listens to :func:`edgekv.sweep.run.run_sweep`'s events and prints; the sweep itself attaches each
record's ``load`` (other processes' CPU share before and during the configuration, edgekv.machine.load) and ``plan``
(the estimate made for this configuration, the remaining-time estimate after it, the sweep's elapsed time) blocks
(edgekv.sweep.plan.SweepTracker), so the ETA's accuracy can be checked afterwards from the results file
alone (bench/first_run.py), whoever ran the sweep.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import psutil

from edgekv.cli.options import pair_types, parse_fa_list, parse_int_list, parse_repack_list, parse_type_list
from edgekv.cli.signals import interrupted_by, interrupted_code
from edgekv.core.cachetypes import DEFAULT_SWEEP_TYPES
from edgekv.core.diagnose import exit_status
from edgekv.core.units import MIB, kv_label
from edgekv.errors import UsageError
from edgekv.machine.environment import default_threads
from edgekv.machine.load import BUSY_SHARE, Window, busy_note, threads_left
from edgekv.output.benchview import Progress, case_label, case_work, render_summary
from edgekv.output.inputs import compared_kv
from edgekv.prediction.api import load_model, registry_sweep_defaults
from edgekv.records.results import latest
from edgekv.records.schema import Record, Settings, Speed, encode, encode_block
from edgekv.sweep.plan import FULL, QUICK, fmt_duration, model_contexts, plan_lines, quick_contexts
from edgekv.sweep.run import check_depths, check_parallel, run_sweep
from edgekv.sweep.spec import SweepSpec

if TYPE_CHECKING:
    from edgekv.sweep.listener import CaseDone, SweepPlan
    from edgekv.sweep.run import SweepResult
    from edgekv.sweep.spec import Case


def _rate(speed: Speed | None, test: str) -> str | None:
    v = getattr(speed, test) if speed else None
    if not v or v.mean_ts is None:
        return None
    ci = v.ci95_ts
    half = f"±{(ci[1] - ci[0]) / 2:.1f}" if ci else ""
    return f"{test} {v.mean_ts:.1f}{half} t/s" + (" (unstable)" if v.unstable else "")


def case_line(i: int, n: int, rec: Record, wall_s: float, elapsed_s: float, remaining_s: float | None) -> str:
    parts = []
    sp, pred = rec.speed or None, rec.prediction or None
    psp = pred.speed if pred and pred.speed else None
    for t in ("pp", "tg"):
        r = _rate(sp, t)
        if r:
            p = getattr(psp, t) if psp else None
            p = p.tokens_per_s if p else None
            busy = " ~, from a calibration taken under load" if p and psp.calibration_busy else ""
            held = " (prediction withheld)" if not p and psp and str(psp.error or "").startswith("withheld") else ""
            parts.append(r + (f" (predicted {p:.1f}{busy})" if p else held))
    seq = sp.tg_seq.mean_ts if sp and sp.tg_seq else None
    if seq is not None:
        parts.append(f"{seq:.1f} t/s per sequence ({rec.settings.n_parallel} at once)")
    sv = rec.serving or None
    if sv and sv.ttft_p50_s is not None:
        parts.append(f"TTFT p50 {sv.ttft_p50_s:.2f} s, p95 {sv.ttft_p95_s:.2f} s"
                     + (f", {sv.n_failed} of {sv.n_requests} requests failed" if sv.n_failed else ""))
    mem = rec.memory or None
    if mem and mem.peak_rss_bytes:
        pp = pred.process.peak_rss_bytes if pred and pred.process else None
        parts.append(f"peak RSS {mem.peak_rss_bytes / MIB:.1f} MiB" + (f" (predicted {pp / MIB:.1f})" if pp else ""))
    n_ctx, f = compared_kv(rec)
    same = rec.differences.llama_kv_matches_formula if rec.differences else None
    if f is not None:
        at = f" at llama-bench's n_ctx {n_ctx}" if n_ctx != rec.settings.n_ctx else ""
        parts.append(f"KV {f / MIB:.2f} MiB{at}" + {True: " (= llama.cpp)", False: " (llama.cpp differs!)"}.get(same, ""))
    if rec.status != "ok":
        parts = [f"{rec.status}: {rec.reason}"]
    tail = f"{fmt_duration(wall_s)}; elapsed {fmt_duration(elapsed_s)}"
    if remaining_s is not None and i < n:
        tail += f", about {fmt_duration(remaining_s)} left"
    busy = busy_note(encode_block(rec.load) if rec.load else None)
    return f"[{i}/{n}] {case_label(rec.settings)}: " + ", ".join(parts) + f" | {tail}" + (f"  [{busy}]" if busy else "")


class BenchMonitor:
    def __init__(self, spec, out_con, bar_con, contexts: list[int], full_hint: str | None) -> None:
        self.spec = spec
        self.out = out_con                      # the plan and the per-configuration lines
        self.prog = Progress(bar_con)           # rich bar, only on a terminal
        self.contexts = contexts
        self.full_hint = full_hint
        self.todo: list[Settings] = []
        self.calibration_said = float("-inf")

    def __enter__(self) -> BenchMonitor:
        self.prog.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.prog.__exit__(*exc)

    def _print(self, line: str) -> None:
        if self.prog.enabled and self.out is self.prog.p.console:
            self.prog.p.console.print(line, highlight=False, markup=False)
        else:
            self.out.print(line, highlight=False, markup=False, soft_wrap=True)

    # the sweep's listener (edgekv.sweep.listener.SweepListener)
    def on_note(self, message: str) -> None:
        """One line each, e.g. the repair of a results file's last line."""
        self.prog.p.console.print(f"edgekv: {message}", markup=False, highlight=False)

    def on_calibrate(self, step: str, left_s: float) -> None:
        """What the speed calibration measures, and the time left: a line every 15 s."""
        now = time.monotonic()
        if now - self.calibration_said >= 15:
            self.prog.p.console.print(f"edgekv: calibrating: {step} ({left_s:.0f} s left)", markup=False,
                                      highlight=False)
            self.calibration_said = now

    def on_plan(self, plan: SweepPlan) -> None:

        self._start(plan)
        self.prog.plan(sum(case_work(c.settings) for c in plan.todo) or 1)

    def on_case(self, i: int, n: int, case: Case) -> None:
        self.prog.case(i, n, case.settings)

    def on_child(self, event: dict[str, Any]) -> None:
        self.prog.child(event)

    def on_record(self, done: CaseDone) -> None:
        self._print(case_line(done.i + 1, len(self.todo), done.record, done.wall_s, done.elapsed_s, done.remaining_s))

    def on_done(self, i: int, n: int, record: Record) -> None:
        self.prog.done()

    def _start(self, plan: SweepPlan) -> None:
        """The plan's lines: the sweep's tracker (edgekv.sweep.plan.SweepTracker) holds the estimate."""
        if plan.existing or plan.retry:
            again = f"; {plan.retry} failed earlier, measured again (--no-retry keeps them)" if plan.retry else ""
            self.prog.p.console.print(f"Resuming {plan.output}: {plan.existing} of {plan.total} "
                                      f"configurations already done{again}.", highlight=False, markup=False)
        planner = plan.tracker.planner
        self.todo = plan.tracker.todo
        types = (list(dict.fromkeys(kv_label(s.type_k, s.type_v) for s in self.todo))
                 or [f"{k}" for k, _v in self.spec.pairs])
        s0 = self.todo[0] if self.todo else self.spec.settings
        tests = (s0.n_prompt, s0.n_gen, s0.repetitions)
        for line in plan_lines(plan.total, self.contexts, types, tests, planner.initial_total_s or 0.0, planner.basis,
                               plan.output, plan.existing, self.full_hint, repack=plan.repack,
                               unfit=plan.unfit, depths=self.spec.depths, n_parallel=self.spec.n_parallel):
            self._print(line)
        w = Window()
        time.sleep(0.3)
        now = w.close()
        if now["others_share"] >= BUSY_SHARE:
            self._print(f"Note: other work is using {100 * now['others_share']:.0f} % of the {psutil.cpu_count()} CPUs "
                        "right now: the configurations will take longer than estimated, and each one measured while "
                        "the machine is busy is marked so.")


# -- the bench command's work between parsing its flags and rendering the results --------------------------------

@dataclass
class BenchArgs:
    """``edgekv bench``'s flags as typer parsed them: the settings every configuration shares (``n_prompt``,
    ``n_gen`` and ``repetitions`` None when not given: the quick or ``--full`` defaults), the grid's lists as given
    (None: not given), and how to run; see ``edgekv bench --help``."""

    model: str | None
    settings: Settings
    ctx_size: str | None
    cache_type_k: str | None
    cache_type_v: str | None
    flash_attn: str
    depths: str | None
    n_parallel: str | None
    repack: str | None
    full: bool
    output: str | None
    llama_bench: str | None
    llama_server: str | None
    timeout: float
    force: bool
    no_retry: bool
    no_speed_model: bool
    calibration_timeout: float


def check_quality_flags(quality: bool, corpus: str | None, chunks: int | None) -> None:
    """--corpus and --chunks, refused without --quality or below 1 (before the settings take their defaults)."""
    if (corpus is not None or chunks is not None) and not quality:
        raise UsageError("--corpus and --chunks choose the quality pass: add --quality")
    if chunks is not None and chunks < 1:
        raise UsageError("--chunks must be at least 1")


# the default -r 5 may stop after 3 repetitions of a test that agree (core.benchwire.tight), or of a test that has
# run REP_BUDGET_S seconds by then (core.benchwire.enough: the quick sweep's long prompts deep in a quantized cache,
# 1.7 to 4.5 s a repetition on 2 AVX2 cores, whose fourth and fifth repetitions took 21 of its 234 s); a -r given
# runs in full
MIN_REPETITIONS = 3
REP_BUDGET_S = 5.0


def bench_spec(a: BenchArgs) -> tuple[SweepSpec, list[int], str | None]:
    """The sweep the flags ask for (registry defaults, --full, checks), its contexts, and the hint naming the full
    sweep when the quick default runs."""

    reg_defaults = registry_sweep_defaults(a.model)
    cache_type_k = a.cache_type_k
    if cache_type_k is None:
        cache_type_k = ",".join(reg_defaults.cache_types if reg_defaults else DEFAULT_SWEEP_TYPES)
    pairs = pair_types(parse_type_list(cache_type_k, "-ctk"),
                       parse_type_list(a.cache_type_v, "-ctv") if a.cache_type_v else None)
    fas = parse_fa_list(a.flash_attn)
    defaults = FULL if a.full else QUICK
    st = msgspec.structs.replace(a.settings, **{k: v for k, v in defaults.items() if getattr(a.settings, k) is None})
    _check(a, st)
    # every flag is read before the model is: a bad one costs no download
    given_ctxs = parse_int_list(a.ctx_size, "-c/--ctx-size") if a.ctx_size else None
    deps = parse_int_list(a.depths, "-d/--n-depth", minimum=0) if a.depths else None
    repack = parse_repack_list(a.repack)
    npls = parse_int_list(a.n_parallel, "-npl") if a.n_parallel else None
    for c in given_ctxs or []:
        for k in npls or []:
            check_parallel(c, k, st.n_prompt or 0, st.n_gen or 0)
        if deps is not None and not npls:
            check_depths(c, deps, st.n_prompt or 0, st.n_gen or 0)
    m = load_model(a.model)
    full_ctxs = model_contexts(m.shape.n_ctx_train, reg_defaults.contexts if reg_defaults else None)
    if given_ctxs:
        ctxs = given_ctxs
    elif a.full:
        ctxs = full_ctxs
    else:
        ctxs = quick_contexts(m.shape.n_ctx_train)
    threads, busy_hint = free_threads(st.n_threads)
    if busy_hint:           # only then does the count differ from the one asked for (the record keeps the default)
        st = msgspec.structs.replace(st, n_threads=threads)
    spec = SweepSpec(model=m, contexts=ctxs, pairs=pairs, settings=st, flash_attn=fas, depths=deps,
                     repack=repack,
                     n_parallel=parse_int_list(a.n_parallel, "-npl") if a.n_parallel else [1] if a.llama_server else None,
                     timeout_s=a.timeout, llama_bench=a.llama_bench, llama_server=a.llama_server,
                     retry_failed=not a.no_retry, force_fit=a.force, predict_speed=not a.no_speed_model,
                     calibration_timeout_s=a.calibration_timeout,
                     min_repetitions=MIN_REPETITIONS if a.settings.repetitions is None else 0,
                     rep_budget_s=REP_BUDGET_S if a.settings.repetitions is None else 0.0)
    full_hint = None
    if not a.full and not a.ctx_size and st.n_prompt == QUICK["n_prompt"] and st.n_gen == QUICK["n_gen"]:
        full_hint = (f"The full sweep ({', '.join(str(c) for c in full_ctxs)}; -p {FULL['n_prompt']} -n {FULL['n_gen']} "
                     f"-r {FULL['repetitions']}) is 'edgekv bench --full'.")
    return spec, ctxs, "\n".join(x for x in (busy_hint, full_hint) if x) or None


def free_threads(asked: int | None) -> tuple[int, str | None]:
    """(-t for the sweep, the line that says why it is not the default): the count asked for, else (-t 0 or none)
    llama.cpp's default less each core other work keeps busy now (edgekv.machine.load.threads_left); 0: the
    default."""
    if asked:
        return asked, None
    n = default_threads()
    t, used = threads_left(n)
    if t >= n or used is None:
        return 0, None
    return t, (f"-t {t}, not {n}: other work kept {used:.1f} of the {n} cores busy just now, and llama.cpp's threads "
               "wait for each other after every step (-t sets the count).")


def _check(a: BenchArgs, st: Settings) -> None:
    """The flags' values and combinations edgekv refuses, one line each (before the model is loaded)."""
    for name, v, lo in (("-p", st.n_prompt, 0), ("-n", st.n_gen, 0), ("-r", st.repetitions, 1), ("-t", st.n_threads, 0),
                        ("-b", st.n_batch, 1), ("-ub", st.n_ubatch, 1)):
        if v < lo:
            raise UsageError(f"{name} must be at least {lo}")
    if st.n_prompt == 0 and st.n_gen == 0:
        raise UsageError("-p and -n cannot both be 0: there would be nothing to measure")
    if not a.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds (got {a.timeout:g})")
    if not a.calibration_timeout > 0:
        raise UsageError(f"--calibration-timeout must be a positive number of seconds (got {a.calibration_timeout:g})")
    quality = st.quality is not None
    if a.llama_bench is not None and not (os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)):
        raise UsageError(f"--llama-bench: {a.llama_bench} is not an executable file")
    if a.llama_server is not None:
        if not (os.path.isfile(a.llama_server) and os.access(a.llama_server, os.X_OK)):
            raise UsageError(f"--llama-server: {a.llama_server} is not an executable file")
        if a.llama_bench is not None or quality or a.depths:
            raise UsageError("--llama-server measures N concurrent requests from an empty cache (-npl): drop "
                             + ("--llama-bench" if a.llama_bench else "--quality" if quality else "-d"))
    if a.n_parallel is not None:
        if a.depths:
            raise UsageError("-d does not apply with -npl: like llama-batched-bench, each test starts from an empty cache")
        if a.llama_bench is not None:
            raise UsageError("-npl runs through llama-cpp-python (llama-bench has no parallel sequences); "
                             "drop --llama-bench, or -npl")
        if quality:
            raise UsageError("--quality scores one sequence: drop it with -npl")
        if max(parse_int_list(a.n_parallel, "-npl")) > 256:
            raise UsageError("-npl: at most 256 sequences (llama.cpp's LLAMA_MAX_SEQ)")


def run_bench(a: BenchArgs, as_json: bool, console: Callable[..., Any]) -> SweepResult:
    """Plan, run and record the sweep, saying what happens on ``console(stderr=...)``'s consoles."""

    spec, ctxs, full_hint = bench_spec(a)
    err = console(stderr=True)
    # the plan and one line per configuration: on stdout when it is not a terminal (CI logs, | tee), else stderr
    out = err if as_json or sys.stdout.isatty() else console()
    with BenchMonitor(spec, out, err, ctxs, full_hint) as mon:
        return run_sweep(spec, output=a.output, force=a.force, listener=mon)


def bench_command(a: BenchArgs, as_json: bool, console: Callable[..., Any], print_json: Callable[[Any], None]) -> int:
    """``edgekv bench``: the sweep run, its records shown (or printed as JSON) and its exit status."""
    res = run_bench(a, as_json, console)
    if as_json:
        print_json([encode(r) for r in latest(res.records)])   # a configuration measured again: its newest record
    else:
        render_summary(console(), res.records, str(res.output))
    return finish(res, console(stderr=True))      # 130 interrupted; 1 unless all started were measured


def finish(res: SweepResult, err) -> int:
    """bench's exit status, its closing line on ``err`` when not 0: 130 interrupted (resume by rerunning), else
    :func:`exit_line`'s (README: Exit status)."""
    if res.interrupted:
        err.print(interrupted_line(res))
        return interrupted_code()
    code, line = exit_line(res)
    if line:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    return code


def exit_line(res: SweepResult) -> tuple[int, str | None]:
    """bench's exit status (edgekv.core.diagnose.exit_status) and the one closing line saying why it is not 0."""

    new = res.records[len(res.records) - res.new:] if res.new else []
    code, why = exit_status([str(r.status) for r in new], sum(1 for r in res.records if r.status == "ok"))
    if not code:
        return 0, None
    first = next((r for r in new if r.status not in ("ok", "skipped")), None) or (new[0] if new else None)
    where = f" (first: {case_label(first.settings)}: {first.reason})" if first else ""
    return code, f"edgekv: {why}{where}; exit {code}"


def interrupted_line(res: SweepResult) -> str:
    return (f"Interrupted ({interrupted_by()}): {len(res.records) - res.skipped_existing} configurations saved to "
            f"{res.output}; "
            "run the same command again to resume.")
