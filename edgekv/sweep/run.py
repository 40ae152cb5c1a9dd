"""Measured sweeps: model x cache types x contexts (x depths), one fresh child process per case.

For each configuration the parent records three sources side by side (docs/bench.md): the
**formula** prediction, **llama.cpp's** own figures (a dry
run before the sweep, and the log of the measured run itself), and what the **OS measured** (peak
RSS sampled every 5 ms (during the timed tests the child reads its own after each repetition, so that
sampling never slows them), the kernel's own maximum from ``os.wait4``, anonymous vs file-backed pages,
macOS footprint, NVML GPU memory).  Each record is appended atomically as soon as its configuration
finishes, so an interrupted sweep resumes where it stopped, repeating nothing.

This module runs the sweep: the cases, the plan, the loop.  The spec and its cases are
edgekv.sweep.spec, the predictions made before the sweep runs edgekv.sweep.predictions, and
each finished case's record edgekv.sweep.record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from edgekv.calibration.preflight import RepackChoice, repack_choice
from edgekv.core.predict import STATUS_OK, predict
from edgekv.errors import ResultsError, UsageError
from edgekv.machine.environment import collect, default_threads, nvml_process_probe
from edgekv.quality.run import for_sweep
from edgekv.records import results as R
from edgekv.records.schema import (
    BenchRecord,
    Environment,
    ExtraBuffersPreflight,
    Record,
    SpeedPrediction,
    encode,
    encode_block,
    environment,
)
from edgekv.records.schema import model_block as schema_model_block
from edgekv.runtime.engine import EngineResult
from edgekv.sources.home import edgekv_home, verified_sha256
from edgekv.sweep.listener import CaseDone, SweepListener, SweepPlan, listener_of
from edgekv.sweep.plan import SweepTracker
from edgekv.sweep.predictions import dry_runs, fit_check, process_predictions, speed_predictions
from edgekv.sweep.record import attach_process, attach_speed, build_record
from edgekv.sweep.runners import CaseContext, CaseRunner, runner_for
from edgekv.sweep.seeds import DepthSeeds, plan_seeds, seeded_depths
from edgekv.sweep.spec import ENGINE_LLAMA_BENCH, Case, SweepSpec
from edgekv.sweep.spec import ENGINE_PYTHON as ENGINE_PYTHON  # re-exported: callers build a SweepSpec from here
from edgekv.sweep.spec import ENGINE_SERVER as ENGINE_SERVER  # re-exported, likewise
from edgekv.sweep.speedadapt import SpeedAdapter


def default_depth(n_ctx: int, n_prompt: int, n_gen: int) -> int:
    """Fill the cache so the timed tests end at the context size: "context C" really holds ~C tokens."""
    return max(0, n_ctx - max(n_prompt, n_gen))


def _depths(spec: SweepSpec, n_ctx: int, npl: int | None) -> list[int]:
    """The depths one context is measured at, checked against it (one line naming the flags when they do not fit)."""
    n_prompt, n_gen = spec.settings.n_prompt or 0, spec.settings.n_gen or 0
    if npl is not None:            # llama-batched-bench: every test starts from an empty cache, N sequences in -c cells
        check_parallel(n_ctx, npl, n_prompt, n_gen)
        return [0]
    depths = spec.depths if spec.depths is not None else [default_depth(n_ctx, n_prompt, n_gen)]
    check_depths(n_ctx, depths, n_prompt, n_gen)
    return depths


def check_parallel(n_ctx: int, npl: int, n_prompt: int, n_gen: int) -> None:
    """One line naming the flags when -npl sequences of -p and -n tokens do not fit in the context."""
    need = npl * (n_prompt + n_gen)
    if need > n_ctx:
        raise UsageError(f"-npl {npl} with -p {n_prompt} -n {n_gen} needs {need} cells, more than -c {n_ctx}: "
                         "raise -c or lower -npl, -p or -n")


def check_depths(n_ctx: int, depths: list[int], n_prompt: int, n_gen: int) -> None:
    """One line naming the flags when a depth and a test's tokens do not fit in the context."""
    for d in depths:
        if d + max(n_prompt, n_gen) > n_ctx:
            raise UsageError(
                f"-d {d} with -p {n_prompt} -n {n_gen} does not fit in -c {n_ctx}: "
                "depth + tokens per test must not exceed the context")


def expand(spec: SweepSpec, model_sha: str | None) -> list[Case]:
    """The spec's cases: its shared settings with each value of the grid (contexts, depths, -fa, --repack, pairs)."""
    cases = []
    threads = spec.settings.n_threads or default_threads()
    if spec.n_parallel is not None and spec.depths:
        raise UsageError("-d does not apply with -npl: like llama-batched-bench, each test starts from an empty cache")
    grid = [(n_ctx, npl) for n_ctx in spec.contexts for npl in (spec.n_parallel or [None])]
    for n_ctx, npl in grid:
        n_seq = spec.settings.n_seq_max if npl is None else npl
        for d in _depths(spec, n_ctx, npl):
            for fa, rp in ((fa, rp) for rp in (spec.repack or [True]) for fa in spec.flash_attn):
                for tk, tv in spec.pairs:
                    settings = msgspec.structs.replace(
                        spec.settings, engine=spec.engine, n_ctx=n_ctx, type_k=tk, type_v=tv, flash_attn=fa,
                        n_seq_max=n_seq, n_threads=threads, n_depth=d, repack=rp,
                        n_parallel=npl if npl is not None else UNSET)
                    params = settings.context_params()
                    cases.append(Case(len(cases), settings, params, R.config_key(model_sha, encode_block(settings)),
                                      predict(spec.model.shape, params)))
    return cases


def default_output(spec: SweepSpec, cases: list[Case]) -> Path:
    h = hashlib.sha256("|".join(c.key for c in cases).encode()).hexdigest()[:10]
    stem = Path(spec.model.ref.path).stem.replace(" ", "_")
    return edgekv_home() / "runs" / f"{stem}-{h}.jsonl"


model_block = schema_model_block      # the one serialiser of the model block lives with the schema


# -- the sweep ----------------------------------------------------------------------------------------

@dataclass
class SweepResult:
    output: Path
    records: list[Record]
    skipped_existing: int
    wall_s: float
    interrupted: bool = False
    new: int = 0                      # how many of ``records`` (the last ones) this run wrote

    @property
    def lines(self) -> list[dict[str, Any]]:
        """The records as the results file holds them: one plain JSON object each (:func:`~edgekv.records.schema.encode`)."""
        return [encode(r) for r in self.records]


def check_resumable(existing: list[Record], env: Environment, model_sha: str | None, output: Path,
                    force: bool, model_name: str | None = None) -> None:
    """Refuse (one line, unless ``--force``) to append to a file holding another model or environment."""
    for r in existing:
        other = r.model.sha256
        if model_sha and other and other != model_sha and not force:
            name = r.model.name or "another model"
            raise ResultsError(
                f"{output} holds results of another model ({name}, sha256 {other[:12]}…); this run measures "
                f"{model_name or 'a different model'} (sha256 {model_sha[:12]}…); write to a new file with -o, "
                "or pass --force to append anyway")
        diffs = R.env_differences(r.environment, env)
        if diffs and not force:
            raise ResultsError(
                f"{output} holds results from another environment ({diffs[0]}); write to a new file with -o, "
                "or pass --force to append anyway")


def run_sweep(spec: SweepSpec, output: Path | None = None, env: dict[str, Any] | Environment | None = None,
              force: bool = False, on_event: Callable[[str, dict[str, Any]], None] | None = None, *,
              listener: SweepListener | None = None, runner: CaseRunner | None = None) -> SweepResult:
    """Measure every case of ``spec`` still to do in ``output`` (default: a file under edgekv's runs), each record
    appended as soon as it is known.  ``listener`` hears the plan, each case and each record (``on_event``: the same
    as ``(kind, data)`` events); ``runner``: what measures a case (default: the spec's engine's)."""
    t0 = time.perf_counter()
    say = listener_of(listener, on_event)
    m = spec.model
    if not m.ref.complete:
        raise UsageError(f"{m.ref.spec}: only the header is available; measured runs need the whole model "
                         "(edgekv models pull NAME)")
    m.require_whole("edgekv bench")
    sha = verified_sha256(m.ref.path)
    expand(spec, sha)           # the grid's refusals (-d, -npl) first: a refusal of bad input needs no llama.cpp probe
    choice = repack_choice(spec.repack, spec.llama_bench if spec.engine == ENGINE_LLAMA_BENCH else None)
    spec = dataclasses.replace(spec, repack=choice.values)      # the caller's spec stays as given
    cases = expand(spec, sha)
    output = Path(output) if output else default_output(spec, cases)
    writer = R.ResultsWriter(output)    # writable, locked for the whole sweep, tail repaired: before measuring
    try:
        return _run_locked(spec, choice, writer, cases, sha, env, force, say, runner or runner_for(spec.engine), t0)
    finally:
        writer.close()


def resume_keys(existing: list[Record], retry_failed: bool = True) -> tuple[set[str], set[str]]:
    """(configurations already done, configurations whose last record failed) of a results file: a rerun measures
    the failed ones again (a crash, a timeout on a busy machine, an OOM kill whose cause was fixed) unless
    ``retry_failed`` is off (``--no-retry``); ``ok`` and deliberately ``skipped`` ones stay done."""
    last = {r.config_key: r.status for r in existing if r.config_key}
    failed = {k for k, st in last.items() if st == "failed"}
    return (set(last) - failed if retry_failed else set(last)), failed


def _sweep_environment(spec: SweepSpec, choice: RepackChoice, writer: R.ResultsWriter,
                       env: dict[str, Any] | Environment | None, sha: str | None, force: bool,
                       say: SweepListener) -> Environment:
    """The environment phase: the writer's notes said, the environment collected (with the extra-buffer
    preflight's block) and the records already in the file checked as resumable against it."""
    for note in writer.notes:
        say.on_note(note)
    env = env if isinstance(env, Environment) else environment(env or collect())
    if choice.preflight is not None:
        env = msgspec.structs.replace(env, extra_buffers_preflight=msgspec.convert(
            choice.preflight.environment_block(), ExtraBuffersPreflight, strict=True))
    check_resumable(writer.existing, env, sha, writer.path, force, model_name=spec.model.shape.name or spec.model.ref.name)
    return env


def _plan_sweep(spec: SweepSpec, cases: list[Case], todo: list[Case], retry: set[str], env: Environment,
                sha: str | None, say: SweepListener, output: Path,
                seeded: dict[str, int] | None = None,
                ) -> tuple[dict[str, EngineResult], dict[str, Any], dict[str, Any], SweepTracker]:
    """The plan phase, said to the listener (``on_plan``): llama.cpp's dry runs, the whole-process and speed predictions,
    what will not fit, and the time plan.  Returns the dry runs, the process predictions and the speed predictions
    by case key, and the tracker that attaches ``load`` and ``plan`` to each record."""
    # llama.cpp's dry runs and the whole-process predictions come first: the plan says what will not fit
    engine_results = dry_runs(spec, todo) if spec.engine != ENGINE_LLAMA_BENCH else {}
    processes = process_predictions(spec, todo)
    unfit = {c.key: why for c in todo if (why := fit_check(spec, c, processes.get(c.key)))}
    # the speed model calibrates for what will run: a refusal never waits on a measurement (issue 68)
    speeds = (speed_predictions(spec, [c for c in todo if c.key not in unfit], engine_results, say)
              if spec.predict_speed else
              {c.key: SpeedPrediction(calibration_id=None, error="not predicted (--no-speed-model)") for c in todo})
    speeds.update({k: SpeedPrediction(calibration_id=None, error="not predicted: predicted not to fit the memory "
                                                                  "available") for k in unfit if k not in speeds})
    tracker = SweepTracker(spec.model, todo[0].params if todo else None, todo, speeds, output, edgekv_home() / "runs",
                           sha, env, spec.min_repetitions, spec.rep_budget_s, seeded)
    say.on_plan(SweepPlan(total=len(cases), todo=todo, output=str(output), existing=len(cases) - len(todo), env=env,
                          model_sha256=sha, retry=sum(1 for c in todo if c.key in retry), unfit=unfit, speeds=speeds,
                          tracker=tracker, repack=list(spec.repack or [True])))
    return engine_results, processes, speeds, tracker


def _case_record(cx: CaseContext, runner: CaseRunner, case: Case, eng: EngineResult | None, proc: Any) -> BenchRecord:
    """One case's record: skipped (refused by the formula or llama.cpp, or not fitting now) or run by its engine's
    runner."""
    spec, env, model = cx.spec, cx.env, cx.model
    unfit_now = fit_check(spec, case, proc)
    if case.prediction.status != STATUS_OK or (eng is not None and not eng.ok):
        reason = case.prediction.reason if case.prediction.status != STATUS_OK else f"llama.cpp: {eng.error}"
        return build_record(spec, case, env, model, eng, None, 0.0, "skipped", reason)
    if unfit_now:             # read again right before it: other programs take memory meanwhile
        return build_record(spec, case, env, model, eng, None, 0.0, "skipped", unfit_now)
    return runner.run(cx, case, eng)


def _run_locked(spec: SweepSpec, choice: RepackChoice, writer: R.ResultsWriter, cases: list[Case], sha: str | None,
                env: dict[str, Any] | None, force: bool, say: SweepListener, runner: CaseRunner,
                t0: float) -> SweepResult:
    """The sweep under the results lock: environment, plan, then each case still to do, its record appended as
    soon as it is known (a KeyboardInterrupt stops the loop; the records written so far stay)."""
    output = writer.path
    env = _sweep_environment(spec, choice, writer, env, sha, force, say)
    note = choice.measure_note()
    if note:        # the inputs were accepted: now the fallback (or the crash ahead) is worth a line
        say.on_note(note)
    existing = writer.existing
    done_keys, retry = resume_keys(existing, spec.retry_failed)
    todo = [c for c in cases if c.key not in done_keys]
    seeds = DepthSeeds(plan_seeds(spec, todo) if getattr(runner, "seeds_depth", False) else {})
    engine_results, processes, speeds, tracker = _plan_sweep(spec, cases, todo, retry, env, sha, say, output,
                                                             seeded_depths(seeds.plans))

    model = model_block(spec.model, sha)
    cx = CaseContext(spec, env, model, nvml_process_probe(), say, seeds)
    records: list[Record] = []
    interrupted = False
    quality = None
    if spec.settings.quality is not None:
        quality = for_sweep(spec, todo)

    adapt = SpeedAdapter(speeds)        # a far miss on a quiet machine rescales the rest of the plan (issue 68)
    try:
        for i, case in enumerate(todo):
            tracker.case_started(case.settings)
            say.on_case(i, len(todo), case)
            rec = _case_record(cx, runner, case, engine_results.get(case.key), processes.get(case.key))
            attach_process(rec, processes.get(case.key) if rec.status != "skipped" else None)
            attach_speed(rec, speeds.get(case.key))
            if quality is not None and rec.status == "ok":
                rec.quality = quality(case, say)
            wall, elapsed, remaining = tracker.case_done(rec, i)      # the record's load and plan blocks
            for adj in adapt.after(rec, case, todo[i + 1:]):
                say.on_note(f"speed model: {adj.note}")
            say.on_record(CaseDone(i, len(todo), case, rec, wall, elapsed, remaining))
            writer.append(rec)
            records.append(rec)
            say.on_done(i, len(todo), rec)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        tracker.close()
        seeds.close()
    return SweepResult(output, existing + records, len(cases) - len(todo), time.perf_counter() - t0, interrupted,
                       new=len(records))
