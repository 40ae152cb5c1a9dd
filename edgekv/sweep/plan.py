"""``edgekv bench``'s defaults, its plan (how many configurations, how long, where results go) and its ETA.

The duration is predicted from a cost model of what each configuration does (load, warm-up, filling the cache to
the depth, then -r repetitions of -p prompt tokens and -n generated tokens at that depth), with per-token costs
that grow linearly with the depth (attention reads the whole cache), per cache type. The costs come from, in
order of preference:

1. earlier runs of the same model file on this machine (records under edgekv's runs folder and the output file:
   their measured wall time per configuration calibrates the model), else
2. a prior measured once with SmolLM2-135M (reports/smollm2-135m/sweep.jsonl), scaled by the
   model's weight bytes (the per-token matrix work) and its KV bytes per token (the per-depth attention work).

After every finished configuration the model is recalibrated on the measured wall times (per cache type once that
type has run, else across all types), so the remaining-time estimate tightens as the sweep goes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from edgekv.core.benchwire import expected_reps
from edgekv.core.predict import predict
from edgekv.machine.load import LoadMonitor, record_busy
from edgekv.records import results as R
from edgekv.records import schema as S

# -- defaults (issue 19: the first command answers in minutes) ------------------------------------------------

QUICK = {"n_prompt": 128, "n_gen": 32, "repetitions": 5}
FULL = {"n_prompt": 512, "n_gen": 128, "repetitions": 5}
QUICK_CONTEXTS = (1024, 2048)


def model_contexts(n_ctx_train: int, registry_contexts: Iterable[int] | None = None) -> list[int]:
    """The contexts ``predict`` shows and ``bench --full`` measures when -c is not given: the model's models.toml
    sweep, else 4K/16K/32K within the trained context, else the trained context, /2 and /4."""
    if registry_contexts:
        return list(registry_contexts)
    base = [4096, 16384, 32768]
    fit = [c for c in base if not n_ctx_train or c <= n_ctx_train]
    if len(fit) >= 2:
        return fit
    top = max(256, n_ctx_train // 256 * 256)
    return sorted({max(256, top // 4 // 256 * 256), max(256, top // 2 // 256 * 256), top})


def quick_contexts(n_ctx_train: int) -> list[int]:
    """``bench``'s default contexts: 1K and 2K (within the trained context, else its half and itself)."""
    fit = [c for c in QUICK_CONTEXTS if not n_ctx_train or c <= n_ctx_train]
    if len(fit) == len(QUICK_CONTEXTS):
        return fit
    top = max(256, n_ctx_train // 256 * 256)
    return sorted({max(256, top // 2 // 256 * 256), top})


# -- cost model -------------------------------------------------------------------------------------------------

# Prior per-token seconds on the reference machine for SmolLM2-135M (98.4 MB of weights, 23,040 bytes of f16 KV per
# token): a + b * depth/1000, for batched prompt processing ("pp") and single-token generation ("tg"), per cache
# type; fitted to reports/smollm2-135m/sweep.jsonl (1K/2K/4K, -p 512 -n 128).
_REF_WEIGHTS = 98_362_432
_REF_KV_PER_TOKEN = 23_040
_PRIOR = {
    #          pp a,   pp b,    tg a,   tg b
    "f16":   (0.0040, 0.0010, 0.0100, 0.0060),
    "q8_0":  (0.0050, 0.0060, 0.0095, 0.0065),
    "q5_0":  (0.0075, 0.0145, 0.0100, 0.0150),
    "q4_0":  (0.0055, 0.0120, 0.0100, 0.0110),
}
_ALIAS = {"q4_1": "q4_0", "iq4_nl": "q4_0", "q5_1": "q5_0", "bf16": "f16", "f32": "f16"}
_FILL_FACTOR = 0.75        # filling in big batches costs less per token than the timed -p tests at the same depth
_OVERHEAD_S = 2.0          # interpreter start, model load, context creation, parent bookkeeping


def _coef(type_k: str, type_v: str) -> tuple[float, float, float, float]:
    # the slower of K and V decides (their dequantisation runs in the same attention kernels)
    ks = [_PRIOR.get(_ALIAS.get(t, t), _PRIOR["q8_0"]) for t in (type_k, type_v)]
    return tuple(max(ks[0][i], ks[1][i]) for i in range(4))  # type: ignore[return-value]


def _tokens_cost(n: int, start_depth: int, a: float, b: float) -> float:
    return n * (a + b * (start_depth + n / 2) / 1000)


def prior_seconds(settings: S.Settings, weights_bytes: int, kv_f16_per_token: int, fill_from: int = 0) -> float:
    """Predicted wall seconds of one bench configuration (before calibration); its fill starts from ``fill_from``
    tokens restored."""
    pa, pb, ta, tb = _coef(settings.type_k, settings.type_v)
    ws = max(weights_bytes, 1) / _REF_WEIGHTS
    ks = max(kv_f16_per_token, 1) / _REF_KV_PER_TOKEN
    pa, ta, pb, tb = pa * ws, ta * ws, pb * ks, tb * ks
    d, p, n, r = settings.n_depth, settings.n_prompt, settings.n_gen, settings.repetitions
    t = _OVERHEAD_S * max(1.0, ws ** 0.5)
    if settings.warmup:
        t += _tokens_cost(p + 1, 0, pa, pb) if p else _tokens_cost(1, 0, ta, tb)
    t += _FILL_FACTOR * _tokens_cost(max(0, d - fill_from), min(fill_from, d), pa, pb)
    t += r * (_tokens_cost(p, d, pa, pb) + _tokens_cost(n, d, ta, tb))
    return t


def speed_seconds(settings: S.Settings, speed: S.SpeedPrediction | None, least: int = 0,
                  budget_s: float = 0.0, fill_from: int = 0) -> float | None:
    """Predicted wall seconds of one bench configuration from the speed model's prediction for it
    (``prediction.speed``: pp and tg at the configuration's depth, with the attention part of each), or None when
    there is none.  The fill (depth tokens from an empty cache) costs the prompt's non-attention time per token plus
    its attention part scaled to the fill's mean depth (attention is linear in the depth); one that starts from
    ``fill_from`` tokens restored fills only the rest.  ``least`` and ``budget_s``: each test's repetitions stop at
    the budget past the least (core.benchwire.expected_reps)."""
    if not speed or speed.error:
        return None
    p, n, d, r = settings.n_prompt, settings.n_gen, settings.n_depth, settings.repetitions
    pp = speed.pp if isinstance(speed.pp, S.SpeedTestPrediction) else None
    tg = speed.tg if isinstance(speed.tg, S.SpeedTestPrediction) else None
    if (p and not pp) or (n and not tg) or (d and not pp):
        return None

    def per_token(block: S.SpeedTestPrediction, depth: float) -> float:
        att = sum(x.s_per_token for x in block.parts if x.name == "attention")
        rest = block.s_per_token - att
        at = block.depth + block.n_tokens / 2
        return rest + (att * (depth / at) if at > 0 else 0.0)

    t = _OVERHEAD_S
    if settings.warmup:
        t += (p * per_token(pp, p / 2) if p and pp else 0.0) + (per_token(tg, 0) if n and tg else 0.0)
    if d > fill_from and pp:
        t += (d - fill_from) * per_token(pp, (d + fill_from) / 2)
    if p and pp:
        t += expected_reps(r, p * pp.s_per_token, least, budget_s) * p * pp.s_per_token
    if n and tg:
        t += expected_reps(r, n * tg.s_per_token, least, budget_s) * n * tg.s_per_token
    return t


def _type_key(s: S.Settings) -> str:
    return f"{s.type_k}/{s.type_v}"


@dataclass
class Planner:
    """Per-configuration estimates, recalibrated on measured wall times."""

    weights_bytes: int
    kv_f16_per_token: int
    history: list[tuple[str, float, float]] = field(default_factory=list)   # (type key, prior s, measured s)
    basis: str = "prior"
    t0: float = field(default_factory=time.monotonic)
    initial_total_s: float | None = None
    # the speed model's prediction per configuration (json of its settings -> prediction.speed): when there is
    # one, it is the cost model; the reference prior only stands in where the speed model predicted nothing
    speeds: dict[str, S.SpeedPrediction] = field(default_factory=dict)
    # the repetitions' stopping rule (SweepSpec.min_repetitions, rep_budget_s): what speed_seconds counts
    least: int = 0
    budget_s: float = 0.0
    # the tokens a configuration's fill starts from (edgekv.sweep.seeds), by settings_id: the rest is filled
    seeded: dict[str, int] = field(default_factory=dict)

    def prior(self, s: S.Settings) -> float:
        start = self.seeded.get(settings_id(s), 0)
        t = speed_seconds(s, self.speeds.get(settings_id(s)), self.least, self.budget_s, start)
        return t if t is not None else prior_seconds(s, self.weights_bytes, self.kv_f16_per_token, start)

    def learn(self, settings: S.Settings, wall_s: float) -> None:
        if wall_s and wall_s > 0:
            self.history.append((_type_key(settings), self.prior(settings), float(wall_s)))

    def scale(self, s: S.Settings) -> float:
        same = [(p, m) for k, p, m in self.history if k == _type_key(s)]
        use = same or [(p, m) for _k, p, m in self.history]
        if not use:
            return 1.0
        return sum(m for _p, m in use) / sum(p for p, _m in use)

    def estimate(self, s: S.Settings) -> float:
        return self.prior(s) * self.scale(s)

    def remaining(self, todo: Iterable[S.Settings]) -> float:
        return sum(self.estimate(s) for s in todo)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def settings_id(s: S.Settings) -> str:
    """A configuration's settings as one string (the key of its speed prediction in :class:`Planner`)."""
    return json.dumps(S.encode_block(s), sort_keys=True, default=str)


def kv_f16_per_token(model, params) -> int:
    p = predict(model.shape, replace(params, type_k="f16", type_v="f16"))
    return int((p.total_bytes or 0) / max(1, params.n_ctx))


def same_machine_history(output: Path, runs_dir: Path, model_sha: str | None, env: S.Environment,
                         limit: int = 200) -> list[S.BenchRecord]:
    """Earlier bench records of this model file on this machine (same CPU, threads and engine versions), typed;
    each has a ``timing`` block with a wall time (an absent or None block counts as no wall time)."""
    if not isinstance(env, S.Environment):
        raise TypeError(f"same_machine_history: env is a typed Environment (edgekv.records.schema.environment), "
                        f"not {type(env).__name__}")
    files = sorted(runs_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True) if runs_dir.is_dir() else []
    if output.exists() and output not in files:
        files.insert(0, output)
    out: list[S.BenchRecord] = []
    for f in files[:50]:
        try:
            recs = R.load_records(f)
        except Exception:   # another tool's file or a newer schema: not history we can use
            continue
        for r in recs:
            if not isinstance(r, S.BenchRecord) or r.status != "ok" or r.model.sha256 != model_sha:
                continue
            if R.env_differences(r.environment, env):
                continue
            if record_busy(r):
                continue          # a busy run's wall time says little about this machine
            if r.timing and r.timing.wall_s:
                out.append(r)
            if len(out) >= limit:
                return out
    return out


class SweepTracker:
    """The sweep's own bookkeeping, so that a sweep run from Python records what ``edgekv bench`` records: the
    time plan (a :class:`Planner` from the speed model or this machine's history, recalibrated per configuration)
    and the machine's load while each configuration ran (edgekv.machine.load), attached to every record as its
    ``plan`` and ``load`` blocks.  The CLI only prints what it holds."""

    def __init__(self, model, params, cases: list, speeds: dict[str, S.SpeedPrediction], output: Path, runs_dir: Path,
                 model_sha: str | None, env: S.Environment, least: int = 0, budget_s: float = 0.0,
                 seeded: dict[str, int] | None = None) -> None:
        self.planner = Planner(model.weights_bytes, kv_f16_per_token(model, params) if cases else 0, least=least,
                               budget_s=budget_s)
        self.planner.speeds = {settings_id(c.settings): speeds[c.key] for c in cases if speeds.get(c.key)}
        seeded = seeded or {}
        self.planner.seeded = {settings_id(c.settings): seeded[c.key] for c in cases if seeded.get(c.key)}
        modelled = bool(cases) and all(speed_seconds(c.settings, speeds.get(c.key)) is not None for c in cases)
        hist = same_machine_history(output, runs_dir, model_sha, env)
        for r in hist:
            self.planner.learn(r.settings, r.timing.wall_s)
        cal_id = next((b.calibration_id for b in speeds.values() if b.calibration_id), None)
        self.planner.basis = (
            f"calibrated on {len(hist)} earlier configurations of this model on this machine" if hist else
            f"the speed model's prefill and decode of each configuration at its depth (this machine's "
            f"calibration {cal_id}); recalibrated after each configuration" if modelled else
            "cost model of each configuration's prefill and decode at its depth, from a reference 2-core "
            "machine scaled to this model (no speed prediction); recalibrated after each configuration")
        self.todo: list[S.Settings] = [c.settings for c in cases]
        self.planner.initial_total_s = self.planner.remaining(self.todo)
        self.case_estimate: float | None = None
        self.monitor = None

    def case_started(self, settings: S.Settings) -> None:
        """Before a configuration: its estimate, and the load monitor started (it samples half a second first)."""
        self.case_estimate = self.planner.estimate(settings)
        self.monitor = LoadMonitor()
        self.monitor.start()

    def case_done(self, rec: S.BenchRecord, i: int) -> tuple[float, float, float]:
        """After configuration ``i`` (of the ``cases`` given, in order): ``load`` and ``plan`` attached to its record;
        (wall s, elapsed s, ETA s).  The planner learns from ``cases[i].settings``, the record's settings block
        (and, through :func:`settings_id`, the key of its speed prediction)."""
        raw = self.monitor.stop() if self.monitor is not None else None
        self.monitor = None
        load = msgspec.convert(raw, S.Load, strict=True) if raw is not None else None
        if load is not None:
            rec.load = load
        wall = ((rec.timing.wall_s if rec.timing else None) or (load.during.wall_s if load is not None else None)
                or 0.0)
        p = self.planner
        if rec.status == "ok":
            p.learn(self.todo[i], wall)
        rest = self.todo[i + 1:]
        remaining, elapsed = p.remaining(rest), p.elapsed()
        rec.plan = S.Plan(estimate_s=round(self.case_estimate, 1) if self.case_estimate is not None else None,
                          wall_s=round(wall, 1), sweep_elapsed_s=round(elapsed, 1),
                          remaining_eta_s=round(float(remaining), 1), remaining_configs=len(rest),
                          sweep_estimate_s=round(p.initial_total_s or 0.0, 1), basis=p.basis)
        return wall, elapsed, remaining

    def close(self) -> None:
        """Stop a load monitor left running (the sweep was interrupted mid-configuration)."""
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def plan_lines(n_cases: int, contexts: list[int], types: list[str], tests: tuple[int, int, int], total_s: float,
               basis: str, output: str, existing: int, full_hint: str | None,
               repack: list[bool] | None = None, unfit: dict[str, str] | None = None,
               depths: list[int] | None = None, n_parallel: list[int] | None = None) -> list[str]:
    """``tests``: (-p, -n, -r) of the configurations; ``depths``: the depths given with -d (None: each context minus
    the larger test); ``n_parallel``: -npl."""
    n_prompt, n_gen, repetitions = tests
    depth = "depth " + ("context - " + str(max(n_prompt, n_gen)) if not depths else
                        ", ".join(str(d) for d in depths))
    if n_parallel:
        depth = f"-npl {','.join(str(k) for k in n_parallel)} sequences at once from an empty cache"
    rp = "" if not repack or repack == [True] else ", --repack " + ",".join("1" if r else "0" for r in repack)
    lines = [
        f"Plan: {n_cases} configurations ({', '.join(types)} x {', '.join(str(c) for c in contexts)}; "
        f"-p {n_prompt} -n {n_gen} -r {repetitions}, {depth}{rp}), "
        "each in a fresh process" + (f"; {existing} already done, resuming" if existing else "") + ".",
        f"Estimated time: {fmt_duration(total_s)} ({basis}).",
        f"Results: {output}",
    ]
    if unfit:
        first = next(iter(unfit.values())).split("; skipped")[0]
        lines.insert(1, f"{len(unfit)} of {n_cases - existing} configurations predicted not to fit the memory available "
                        f"now (first: {first}): skipped (--force runs them).")
    if full_hint:
        lines.append(full_hint)
    return lines


def eta_accuracy(records: Iterable[S.Record]) -> list[dict[str, Any]]:
    """For a sweep's typed records (in order), the remaining-time estimate made after each configuration against the
    time the rest really took (records without a ``plan`` block are left out). Used by bench/first_run.py."""
    rows: list[dict[str, Any]] = []
    plans = [r.plan for r in records if r.plan]
    if not plans:
        return rows
    end = plans[-1].sweep_elapsed_s
    first = plans[0]
    rows.append({"after": 0, "estimated_s": first.sweep_estimate_s, "actual_s": end, "basis": first.basis})
    for i, p in enumerate(plans[:-1]):
        actual = end - p.sweep_elapsed_s
        rows.append({"after": i + 1, "estimated_s": p.remaining_eta_s, "actual_s": actual})
    for row in rows:
        e, a = row["estimated_s"], row["actual_s"]
        row["error"] = (e - a) / a if e is not None and a else None
    return rows


def dumps(x: Any) -> str:
    return json.dumps(x, indent=2)
