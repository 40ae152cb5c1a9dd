"""The speed calibration as a whole (:func:`calibrate`): what is cached and still holds, what is missing, measuring
it through a runner within a deadline, one attempt more only when a quiet machine was disturbed, and caching the
result."""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from gguf import GGMLQuantizationType

from edgekv.calibration.speedcal.errors import (
    CalibrationError,
    CalibrationTimeout,
    Disturbed,
    PartlyMeasured,
)
from edgekv.calibration.speedcal.plans import DEFAULT_KV, attn_plan, base_plan, body_plan, weight_plan, weight_shape
from edgekv.calibration.speedcal.run import Bounded, Progress, Runner, runner_for
from edgekv.calibration.speedcal.solve import (
    solve_base,
    solve_bodies,
    solve_pairs,
    solve_vocab,
    solve_weights,
)
from edgekv.calibration.speedcal.store import (
    calibration_key,
    calibration_path,
    drifted,
    read_cache,
    runtime_name,
    still_holds,
    write_cache,
)
from edgekv.calibration.speedcal.windows import decode_window, settle_three, settle_two
from edgekv.core.memmodel import extra_buffer_of, extra_buffer_types
from edgekv.core.probe import ProbeModel, ProbeResult, results_of
from edgekv.core.speed import Calibration, kv_key, tiled_prompt_path, weight_key
from edgekv.core.speedbounds import base_term, drop_terms, term_checks
from edgekv.machine.environment import cpu_model, default_threads, nvidia_info
from edgekv.machine.load import LoadMonitor, threads_left
from edgekv.sources.tinymodel import drop_plan_models, sweep_speed_models

Pairs = dict[str | None, list[tuple[str, str, str]]]


@dataclass
class SpeedCalibration:
    cal: Calibration
    remeasured: bool = False
    note: str = ""


@dataclass
class Wanted:
    """What a run measures: the graph nodes (and bandwidth) of a new calibration, K/V pairs per geometry (None: the
    generic model), weight types, and a GPU's body probes."""

    new: bool = False
    attn: Pairs = field(default_factory=dict)
    types: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)

    def nothing(self) -> bool:
        return not (self.new or self.attn or self.types or self.bodies)

    def words(self, device: str = "") -> str:
        """In words: "graph nodes, bandwidth, f16/f16/fa=auto, q4_1"."""
        return ", ".join(x for x in ([("graph nodes" + ("" if device else ", bandwidth"))] if self.new else [])
                         + [", ".join(kv_key(*p, g) for p in ps) for g, ps in self.attn.items()]
                         + ([", ".join(self.types)] if self.types else [])
                         + ([f"widths {', '.join(self.bodies)}"] if self.bodies else []))


@dataclass
class Job:
    """How a run measures: its threads, --repack, the CPU's features, progress, the bounded runner, and whether the
    probe takes each attention difference's depths in turn (edgekv's own probe; llama-bench cannot)."""

    n_threads: int
    repack: bool
    feats: list[str]
    progress: Progress | None
    run: Bounded
    interleave: bool
    # the cores the untimed cache fills may use: the cores other work leaves free when the run starts (a fill on a
    # core another process keeps busy holds every thread up at each step; edgekv.machine.load.threads_left)
    fill_threads: int = 0
    said: list[str] = field(default_factory=list)     # what the calibration's note adds (a third window's terms)


def attn_needed(cal: Calibration, pairs: Iterable[tuple[str, str, str]], geometries: Iterable[str | None]) -> Pairs:
    """Per geometry (None: the generic model), the K/V pairs not calibrated yet."""
    out: Pairs = {}
    for g in dict.fromkeys(geometries):
        want = [p for p in dict.fromkeys(pairs) if kv_key(*p, g) not in cal.attn_tg_s
                or (tiled_prompt_path(*p, cal.device) and (kv_key(*p, g) not in cal.attn_pp_rows_s
                                                           or (g is not None and kv_key(*p, g) not in cal.attn_pp_deep_s)))]
        if want:
            out[g] = want
    return out


def types_needed(cal: Calibration, weight_types: Iterable[str], cpu_features: list[str], repack: bool) -> list[str]:
    """Weight types (ggml names) whose key, as the CPU backend would hold the calibration model's matrices (a GPU
    calibration: as the type itself), is not calibrated yet."""
    out = []
    extra = extra_buffer_types(cpu_features, repack)
    for t in dict.fromkeys(x.lower() for x in weight_types):
        k = t if cal.device else weight_key(t, extra_buffer_of(_Probe(t, weight_shape(t)), extra, cpu_features))
        row_missing = not cal.device and (k not in cal.matvec_s_per_row or k not in cal.matvec_stream_s_per_byte
                                          or k not in cal.matvec_stream_s_per_row or k not in cal.matmul_s_per_dot
                                          or k not in cal.matcols_s_per_row)
        if k not in cal.matmul_s_per_flop or k not in cal.matcols_s_per_byte or row_missing:
            out.append(t)
    return out


@dataclass(frozen=True)
class _Probe:
    """A calibration matrix as memmodel's eligibility rules see it (n_embd x n_ff of the type)."""

    type_name: str
    shape_d: dict

    @property
    def name(self) -> str:
        return "blk.0.ffn_up.weight"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.shape_d["n_embd"], self.shape_d["n_ff"])

    @property
    def ggml_type(self) -> int:

        return int(GGMLQuantizationType[self.type_name.upper()])

    @property
    def n_bytes(self) -> int:
        return 0


def named(cal: Calibration | None, key: str, n_threads: int, runtime: str, device: str = "") -> Calibration:
    """``cal``, or a new one with nothing measured yet, with its machine (and GPU) and runtime named."""
    if cal is None:
        # the key's head, the second, and 4 random hex digits: two calibrations begun in the same second (two edgekv
        # processes) are two, and never merge each other's coefficients (store.merge_cached)
        cal = Calibration(id=key[:12] + time.strftime("-%Y%m%d%H%M%S-") + secrets.token_hex(2), n_threads=n_threads,
                          node_tg_s=0.0, node_pp_s=0.0, runtime=runtime, device=device)
    if not cal.machine:     # calibrations cached before the field existed name their machine too

        cal.machine = f"{cpu_model()}, {n_threads} thread{'s' if n_threads != 1 else ''}"
        if device:
            names = [str(d.get("name")) for d in (nvidia_info() or {}).get("devices") or [] if d.get("name")]
            cal.machine = f"{device} ({', '.join(names) or 'GPU'}) every layer offloaded; host {cal.machine}"
    return cal


def _uncached_error(want: Wanted) -> CalibrationError:
    """The refusal when measuring is off (EDGEKV_SPEED_CALIBRATE=cached) and something asked for is not cached."""
    what = ["this machine"] if want.new else \
        [kv_key(*p, g) for g, ps in want.attn.items() for p in ps] + want.types + want.bodies
    named_ = ", ".join(what[:3]) + (f" and {len(what) - 3} more" if len(what) > 3 else "")
    return CalibrationError(f"no speed calibration of {named_} here yet")


def measure_missing(cal: Calibration, want: Wanted, job: Job) -> list[ProbeResult]:
    """Measure what is missing (one child per plan) and solve it into ``cal`` in dependency order: the attention
    pairs first, then the graph nodes (which subtract the f16 attention) and bandwidth, then the weight types, then
    (a GPU) the logits' copy and the node cost at each model's widths (which subtract Q8_0's weights).  Returns the
    probe's own timings (kept beside the coefficients, the evidence they were solved from)."""
    sweep_speed_models()        # what killed calibrations and older versions left in the speed folder
    ran: list[ProbeModel] = []      # every plan's models: their files (cut to headers) are deleted at the end
    try:
        return _measure_plans(cal, want, job, ran)
    finally:
        drop_plan_models([m.file_entry() for m in ran])


def fills_on(plan: list[ProbeModel], cores: int) -> list[ProbeModel]:
    """The plan with its contexts' untimed fills on at most ``cores`` threads (never fewer than a context's timed
    runs use; 0: as planned)."""
    if cores <= 0:
        return plan
    return [msgspec.structs.replace(m, contexts=[
        msgspec.structs.replace(c, fill_threads=max(c.n_threads, min(c.fill_threads, cores))) for c in m.contexts])
        for m in plan]


def _run_plan(job: Job, plan: list[ProbeModel], ran: list[ProbeModel], cal: Calibration, raw: list[ProbeResult],
              done: Wanted, keep: bool) -> list[ProbeResult]:
    """One plan's results; when it fails, CalibrationTimeout if the deadline passed, PartlyMeasured if what was
    measured before may be kept (``keep``), else the error."""
    plan = fills_on(plan, job.fill_threads)
    ran += plan
    try:
        return results_of(job.run(plan, job.progress))
    except CalibrationError as e:
        kept = bool(raw) and keep
        if job.run.expired():
            raise CalibrationTimeout(str(e), done.words(cal.device), cal if kept else None, raw) from None
        if kept:
            raise PartlyMeasured(str(e), cal, raw) from None
        raise


def _measure_plans(cal: Calibration, want: Wanted, job: Job, ran: list[ProbeModel]) -> list[ProbeResult]:
    dev, raw, base, done = cal.device, [], [], Wanted()
    if want.new or want.attn:
        # each pair's decode steps in two windows, the graph nodes between them (edgekv.calibration.speedcal.windows)
        plan = [m for g, ps in want.attn.items()
                for m in attn_plan(ps, job.n_threads, job.repack, g, dev, interleave=job.interleave)]
        plan += base_plan(job.n_threads, job.repack, dev) if want.new else []
        plan += decode_window(want.attn, job.n_threads, job.repack, dev, job.interleave, 2)
        base = _run_plan(job, plan, ran, cal, raw, done, keep=False)
        raw += base
        solve_pairs(base, want.attn, cal, job.n_threads)
        if split := settle_two(base, want.attn, cal, job.n_threads):
            third = _run_plan(job, decode_window(split, job.n_threads, job.repack, dev, job.interleave, 3), ran, cal,
                              raw, done, keep=False)
            raw += third
            job.said.append("decode timed a third time where two windows disagreed: "
                            + "; ".join(settle_three(base, third, split, cal, job.n_threads)))
        if want.new:
            solve_base(base, cal, job.n_threads)
        done = Wanted(want.new, want.attn)
    if want.types:
        plan = weight_plan(want.types, job.n_threads, job.repack, dev)
        # what was measured before is kept (a GPU's logits copy needs its Q8_0 first)
        res = _run_plan(job, plan, ran, cal, raw, done, keep=not dev)
        raw += res
        solve_weights(res, plan, cal, job.feats, job.repack)     # reads the models' headers
        done = Wanted(done.new, done.attn, want.types)
    if dev and want.new:
        cal.vocab_tg_s = solve_vocab(base, cal)
    if want.bodies:
        plan = body_plan(want.bodies, job.n_threads, job.repack)
        res = _run_plan(job, plan, ran, cal, raw, done, keep=False)
        raw += res
        solve_bodies(res, plan, cal)
    return raw


@dataclass
class _Store:
    path: Path
    key: str
    fp: dict[str, Any]


def _check_load(cal: Calibration, load: dict[str, Any], allow_busy: bool) -> str:
    """Refuse a calibration taken while other work used the CPUs, or (``allow_busy``) note it in ``cal``; returns
    what the output adds ("" when the machine was quiet)."""
    share = f"{100 * load.get('others_share_max', 0):.0f} % of the CPUs"
    if load.get("busy") and not allow_busy:
        raise CalibrationError(f"the speed calibration ran while other work used {share}: not cached; run it again "
                               "on a quiet machine ('edgekv calibrate')")
    if not load.get("busy"):
        return ""
    cal.notes.append(f"busy: other work used {share}")
    return (f" while other work used {share}: its predictions are marked; its terms passed their physical bounds "
            "and are kept")


def _busy_kept(cal: Calibration, load: dict[str, Any]) -> None:
    """What an unfinished run keeps of ``cal``: its terms within their physical bounds (the others dropped, measured
    again next time), marked busy when other work used the CPUs meanwhile."""
    drop_terms(cal, term_checks(cal))
    if load.get("busy") and not cal.busy:
        cal.notes.append(f"busy: other work used {100 * load.get('others_share_max', 0):.0f} % of the CPUs")


def _keep_partial(e: PartlyMeasured, load: dict[str, Any], store: _Store, want: Wanted) -> CalibrationError:
    """The error of a run whose weight models failed, the graph nodes and attention it measured before that cached
    (those within their physical bounds, marked busy when other work used the CPUs meanwhile; not when the cache
    cannot be written): the next run measures only the weight types."""
    kept = Wanted(want.new, want.attn).words(e.cal.device)
    _busy_kept(e.cal, load)
    try:
        write_cache(store.path, store.key, store.fp, e.cal, e.raw)
    except OSError as w:
        return CalibrationError(f"{e}; what it measured before ({kept}) is not cached either ({w.strerror})")
    return CalibrationError(f"{e}; what it measured before ({kept}) is cached: the next run measures "
                            f"{', '.join(want.types)} alone")


def _keep_timeout(e: CalibrationTimeout, load: dict[str, Any], store: _Store, budget: float) -> CalibrationTimeout:
    """The error of a run that passed its deadline (``budget``: the seconds it had), what it measured and solved
    before cached as _keep_partial does."""
    head = f"the speed calibration passed its {budget:.0f} s deadline" if budget >= 1 else \
        "the speed calibration passed its deadline"
    head += f" after measuring {e.measured}" if e.measured else " before it measured anything"
    tail = ""
    if e.cal is not None and e.measured:
        _busy_kept(e.cal, load)
        try:
            write_cache(store.path, store.key, store.fp, e.cal, e.raw)
            tail = "; what it measured is cached: the next run measures the rest"
        except OSError as w:
            tail = f"; what it measured is not cached either ({w.strerror})"
    return CalibrationTimeout(f"{head}; no speed predictions (edgekv calibrate measures it on a quiet machine){tail}",
                              e.measured)


def _measure(cal: Calibration, want: Wanted, job: Job, allow_busy: bool, store: _Store,
             budget: float) -> tuple[Calibration, list[ProbeResult], str, dict[str, Any]]:
    """measure_missing under a LoadMonitor: (the calibration measured into, the raw timings, a note saying what
    disturbed a first attempt or "", the load).  A difference that came out as other work hides one (Disturbed) is
    measured once more from ``cal`` as it was, only when the machine was quiet during the first attempt (a moment's
    disturbance) and the deadline has not passed: under load there is one attempt, never a loop."""
    again = ""
    for attempt in (1, 2):
        before, said = copy.deepcopy(cal), len(job.said)
        mon = LoadMonitor(before_s=0.3)
        mon.start()
        try:
            raw = measure_missing(cal, want, job)
            return cal, raw, again, mon.stop()
        except Disturbed as e:
            load = mon.stop()
            if attempt == 2 or load.get("busy") or job.run.expired():
                raise
            cal, again = before, f" (the first try was disturbed: the speed calibration {e.what}; measured again)"
            del job.said[said:]
        except PartlyMeasured as e:
            raise _keep_partial(e, mon.stop(), store, want) from None
        except CalibrationTimeout as e:
            raise _keep_timeout(e, mon.stop(), store, budget) from None
    raise AssertionError("unreachable")


def _forget(cal: Calibration, terms: dict[str, str]) -> bool:
    """Take ``terms`` (dropped before, or blamed now) out of ``cal`` to be measured again; whether the base plan
    must run again for them."""
    if not terms:
        return False
    cal.dropped.clear()
    drop_terms(cal, terms, keep_reason=False)
    return any(base_term(t) for t in terms)


def _check_terms(cal: Calibration, raw: list[ProbeResult], load: dict[str, Any],
                 remeasure: Callable[[Calibration, bool], tuple[Calibration, list[ProbeResult], str, dict[str, Any]]],
                 expired: Callable[[], bool]) -> tuple[Calibration, list[ProbeResult], str, dict[str, Any]]:
    """Every term of ``cal`` checked against its physical bounds (edgekv.core.speedbounds.term_checks): those
    outside them measured once more (``remeasure(cal, base)``: ``base`` when the base plan must run again, busy or
    quiet), and any still outside dropped with the reason.  Returns (cal, raw, what the output adds, the load of
    both measurements)."""
    bad = term_checks(cal)
    if not bad:
        return cal, raw, "", load
    if expired():
        drop_terms(cal, bad)
        return cal, raw, f"; dropped {', '.join(bad)} (outside their physical bounds; no time to measure them again)", load
    drop_terms(cal, bad, keep_reason=False)
    cal, raw2, _, load2 = remeasure(cal, any(base_term(t) for t in bad))
    still = term_checks(cal)
    drop_terms(cal, still)
    load = {**load, "busy": bool(load.get("busy") or load2.get("busy")),
            "others_share_max": max(load.get("others_share_max", 0), load2.get("others_share_max", 0))}
    note = f"; {', '.join(bad)} measured again (outside their physical bounds)"
    if still:
        note += f", still outside: dropped ({'; '.join(still.values())}), its predictions withheld"
    return cal, raw + raw2, note, load


def wanted(cal: Calibration, new: bool, pairs: list[tuple[str, str, str]], geometries: Iterable[str],
           weight_types: Iterable[str], bodies: Iterable[str], feats: list[str], repack: bool) -> Wanted:
    """What a calibration run must measure for ``cal`` (``new``: nothing cached)."""
    attn = attn_needed(cal, pairs, list(geometries))
    if new:     # the generic model's f16: what the node and weight models' own attention costs
        attn.setdefault(None, []).append(("f16", "f16", "auto"))
    dev = cal.device
    want_bodies = [b for b in dict.fromkeys(bodies) if b and b not in cal.node_tg_body_s] if dev else []
    # the logits' copy and the body probes subtract Q8_0 weights: a GPU calibration measures that type first
    types = types_needed(cal, list(weight_types) + (["q8_0"] if dev and (new or want_bodies) else []), feats, repack)
    return Wanted(new, attn, types, want_bodies)


def calibrate(n_threads: int, repack: bool = True, weight_types: Iterable[str] = (),
              kv_pairs: Iterable[tuple[str, str, str]] = (), cpu_features: list[str] | None = None,
              refresh: bool = False, progress: Callable[[str], None] | None = None,
              allow_busy: bool = False, geometries: Iterable[str] = (), measure: bool = True,
              llama_bench: str | None = None, device: str = "", bodies: Iterable[str] = (),
              sentinel: str | None = None, runner: Runner | None = None,
              deadline: float | None = None, forget: dict[str, str] | None = None) -> SpeedCalibration:
    """The cached calibration for this environment, thread count and --repack, with every weight type and K/V pair
    (for each attention geometry in ``geometries``) asked for measured (only what is missing is measured;
    everything when absent, stale or ``refresh``).  ``measure`` False: only what is cached, and CalibrationError
    naming what is missing (EDGEKV_SPEED_CALIBRATE=cached).  ``llama_bench``: measured through the user's own
    llama-bench at that path, cached apart (keyed by that binary).  ``device``: a GPU calibration, every layer of
    every calibration model offloaded to that ggml device (CUDA0, Metal), cached apart (keyed by it, the cards
    and their driver); ``bodies``: the widths (edgekv.core.speed.body_geometry) of the models it will predict, whose
    node cost a GPU calibration measures on a probe of those widths.  ``sentinel``: a weight type whose decode is
    timed again to check that a cached calibration still describes the machine (DRIFT_LIMIT; only when measuring).
    ``runner``: what measures each plan (default: edgekv's own child, or ``llama_bench``'s).  ``deadline``: an
    absolute time.monotonic() time; each run's timeout is at most the time left, and past it CalibrationTimeout
    says what was measured (that part cached, unless other work used the CPUs).  ``forget``: terms
    (edgekv.core.speedbounds) measured again whatever is cached (a prediction far below its roofline blames them);
    every term is checked against its physical bounds, measured once more when outside them, then dropped."""
    run = Bounded(runner or runner_for(llama_bench), deadline)
    budget = max(0.0, deadline - time.monotonic()) if deadline is not None else 0.0
    key, fp = calibration_key(n_threads, repack, llama_bench, device)
    store = _Store(calibration_path(n_threads, repack, llama_bench, device), key, fp)
    cal, note, raw = read_cache(store.path, key, refresh)
    if cal is not None:
        cached_cal = cal
        cal, note = still_holds(cal, note, measure, sentinel, lambda t: drifted(
            cached_cal, raw, t, n_threads, repack, run, device, store.path))
    feats = list(cpu_features or [])
    new = cal is None
    cal = named(cal, key, n_threads, runtime_name(llama_bench), device)
    pairs = list(kv_pairs) or [(k, v, "auto") for k, v in DEFAULT_KV]

    def want_of(c: Calibration, fresh: bool) -> Wanted:
        return wanted(c, fresh, pairs, geometries, weight_types, bodies, feats, repack)

    new = _forget(cal, {**cal.dropped, **(forget or {})} if measure else {}) or new
    want = want_of(cal, new)
    if not new and want.nothing():
        return SpeedCalibration(cal, False, note)
    if not measure:
        raise _uncached_error(want)
    if run.expired():
        raise _keep_timeout(CalibrationTimeout("", ""), {}, store, budget)
    t0 = time.monotonic()
    job = Job(n_threads, repack, feats, progress, run, interleave=llama_bench is None,
              fill_threads=0 if device else threads_left(default_threads(), 0.3)[0])
    cal, raw, disturbed, load = _measure(cal, want, job, allow_busy, store, budget)
    cal, raw, bounds, load = _check_terms(cal, raw, load, lambda c, fresh: _measure(
        c, want_of(c, fresh), job, allow_busy, store, budget), job.run.expired)
    measured = f"measured {want.words(device)} in {time.monotonic() - t0:.0f} s{disturbed}{bounds}"
    measured += "".join(f"; {x}" for x in job.said)
    measured += _check_load(cal, load, allow_busy)
    try:
        write_cache(store.path, key, fp, cal, raw)
    except OSError as e:
        note = (note + "; " if note else "") + f"not cached ({e.strerror})"
    return SpeedCalibration(cal, True, "; ".join(x for x in (note, measured) if x))
