"""An attention pair's decode term timed in more than one window of the calibration.

Paired, interleaved runs take out a stretch in which the machine runs slower or faster for both depths of a pair, but
not a slower stretch as a whole: a decode difference timed while the host was slow stays slow in every run of that
stretch (docs/calibration-history.md, "Two windows, not one", has the figures).

So each pair's decode steps run twice in one calibration child, the second time after the rest of the plan (the
graph nodes when they are measured too) and in the reverse order of pairs, as models keyed ``<model>.w2``.  Two
windows within WINDOWS_AGREE of each other give their mean.  Where they disagree (or one measured no cost), a third
window, in a child of its own, is timed, and the median of the three is kept.  The raw timings of every window stay
beside the coefficients, the evidence they were solved from."""

from __future__ import annotations

import statistics

import msgspec

from edgekv.calibration.speedcal.errors import Disturbed
from edgekv.calibration.speedcal.plans import attn_plan
from edgekv.calibration.speedcal.solve import solve_attn_tg
from edgekv.core.probe import ProbeModel, ProbeResult, Results, results_of
from edgekv.core.speed import Calibration, kv_key

# two windows this far apart (relative to the smaller) are not trusted as a pair: a third is timed.  On a quiet
# machine back-to-back windows of q8_0 spread up to 11 %: 10 % keeps a third window the exception there
WINDOWS_AGREE = 0.10

Pairs = dict[str | None, list[tuple[str, str, str]]]


def window_key(model: str, window: int) -> str:
    """A window's copy of a calibration model's key (the model file is the same)."""
    return f"{model}.w{window}"


def decode_window(attn: Pairs, n_threads: int, repack: bool, device: str, interleave: bool,
                  window: int) -> list[ProbeModel]:
    """The decode steps of attn_plan for every geometry's pairs, again, the pairs in reverse order (each pair's
    windows then lie further apart), keyed window_key(model, ``window``).  Not the generic model's (no geometry):
    its decode term only takes the node and weight models' own attention out of theirs, a few cells deep, and no
    prediction reads it."""
    out = []
    for g, ps in attn.items():
        if g is None:
            continue
        for m in attn_plan(list(reversed(ps)), n_threads, repack, g, device, interleave=interleave):
            ctxs = [msgspec.structs.replace(c, steps=[s for s in c.steps if s.test == "tg"]) for c in m.contexts]
            ctxs = [c for c in ctxs if c.steps]
            if ctxs:
                out.append(msgspec.structs.replace(m, key=window_key(m.key, window), contexts=ctxs))
    return out


def window_results(results: Results, window: int) -> list[ProbeResult]:
    """A window's results under their models' own keys (what the solvers look up)."""
    tail = window_key("", window)
    return [msgspec.structs.replace(r, model=r.model.removesuffix(tail)) for r in results_of(results)
            if r.model.endswith(tail)]


def _term(results: Results, key: str, n_threads: int, device: str) -> float | None:
    try:
        return solve_attn_tg(results, key, n_threads, device)
    except (Disturbed, KeyError):        # no cost for a deeper cache, or a window without the pair's steps
        return None


def agree(a: float | None, b: float | None) -> bool:
    """Whether two windows' terms may be averaged."""
    return a is not None and b is not None and max(a, b) <= min(a, b) * (1 + WINDOWS_AGREE)


def settle_two(results: Results, attn: Pairs, cal: Calibration, n_threads: int) -> Pairs:
    """With the first window solved into ``cal`` (solve_pairs), the second window's decode terms from ``results``:
    each pair whose two agree takes their mean; the pairs that do not are returned, to be timed a third time."""
    second = window_results(results, 2)
    out: Pairs = {}
    for g, ps in attn.items():
        for p in ps if g is not None else ():
            k = kv_key(*p, g)
            a, b = cal.attn_tg_s[k], _term(second, k, n_threads, cal.device)
            if agree(a, b) and b is not None:
                cal.attn_tg_s[k] = (a + b) / 2
            else:
                out.setdefault(g, []).append(p)
    return out


def settle_three(results: Results, third: Results, attn: Pairs, cal: Calibration, n_threads: int) -> list[str]:
    """The pairs of ``attn`` (those whose two windows disagreed) given the median of their three windows' decode
    terms; returns what the calibration's note says of each ("q8_0/q8_0/fa=auto@...: 1.74, 1.93, 1.80e-10 s")."""
    second, third_ = window_results(results, 2), window_results(third, 3)
    said = []
    for g, ps in attn.items():
        for p in ps:
            k = kv_key(*p, g)
            terms = [t for t in (cal.attn_tg_s[k], _term(second, k, n_threads, cal.device),
                                 _term(third_, k, n_threads, cal.device)) if t is not None]
            cal.attn_tg_s[k] = statistics.median(terms)
            said.append(f"{k} {', '.join(f'{t:.3g}' for t in terms)}")
    return said

