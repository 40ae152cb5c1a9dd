"""An attention pair's decode term is timed in two windows of the calibration, and a third where they disagree
(edgekv.calibration.speedcal.windows): a slow stretch of the host no longer sets a term alone."""

from __future__ import annotations

import pytest

from edgekv.calibration import speedcal as S
from edgekv.calibration.speedcal import plans as P
from edgekv.calibration.speedcal.windows import decode_window, window_results
from tests.unit.core.test_speed import _fake_results, _own_home, _quiet

PAIRS = [("q8_0", "q8_0", "auto"), ("q4_0", "q4_0", "auto")]
G = "h9kv3k64v64"


def test_a_window_is_the_decode_steps_again_under_keys_of_its_own():
    first = P.attn_plan(PAIRS, 2, True, G, interleave=True)
    second = decode_window({G: PAIRS}, 2, True, "", True, 2)
    assert [m.key for m in second] == ["attnv_h9kv3k64v64.w2"]
    (m,) = second
    (v,) = [x for x in first if x.key == "attnv_h9kv3k64v64"]
    assert m.model_path == v.model_path         # the same file: no second model is written
    assert [c.key.split("/")[0] for c in m.contexts] == ["q4_0", "q8_0"]    # the pairs in reverse order
    assert {s.test for c in m.contexts for s in c.steps} == {"tg"}
    # the generic model (no geometry) has no second window: no prediction reads its decode term
    assert decode_window({None: [("f16", "f16", "auto")]}, 2, True, "", True, 2) == []
    # through llama-bench (steps in order of depth, then the shallowest again) likewise
    (lb,) = decode_window({G: [("q8_0", "q8_0", "auto")]}, 2, True, "", False, 3)
    assert lb.key == "attnv_h9kv3k64v64.w3" and [s.key for s in lb.contexts[0].steps] == ["tg128", "tg1152", "tg128b"]


def _windows(slow: dict[tuple[str, int], float], calls: list):
    """A runner whose decode runs of pair ``p`` in window ``w`` pay slow[(p, w)] times their depth's cost (window 1:
    the plan's own models; 2, 3: the ".w2", ".w3" copies)."""

    def run(plan, progress, timeout):
        calls.append(sorted(m.key for m in plan))
        out = _fake_results(plan)
        for r in out:
            w = int(r.model.rsplit(".w", 1)[1]) if ".w" in r.model else 1
            f = slow.get((r.context.split("/")[0], w), 1.0)
            if r.test == "tg" and f != 1.0:     # each run's cost of its depth (_fake_results: 1 ms + n/10 ms more)
                base = 1e6 * (1 + r.n / 10)
                r.ns = [int(base + f * (x - base)) for x in r.ns]
        return out

    return run


def _term(sc, pair):
    return sc.cal.attn_tg_s[f"{pair}/{pair}/fa=auto@{G}"]


@pytest.fixture
def home(monkeypatch, tmp_path):
    _own_home(monkeypatch, tmp_path)
    _quiet(monkeypatch)


def _calibrate(runner):
    return S.calibrate(2, True, [], PAIRS, ["avx2"], geometries=[G], runner=runner)


def test_two_windows_that_agree_give_their_mean_and_no_third_run(home):
    calls: list = []
    base = _calibrate(_windows({}, calls))
    assert len(calls) == 1 and "attnv_h9kv3k64v64.w2" in calls[0]
    S.calibrate(2, True, [], PAIRS, ["avx2"], geometries=[G], refresh=True, runner=_windows({("q8_0", 2): 1.04}, calls))
    nudged = S.cached(2, True)
    assert len(calls) == 2      # 4 % apart: within WINDOWS_AGREE, one child
    q8 = f"q8_0/q8_0/fa=auto@{G}"
    assert base.cal.attn_tg_s[q8] < nudged.attn_tg_s[q8] < base.cal.attn_tg_s[q8] * 1.04


def test_windows_that_disagree_are_timed_a_third_time_and_the_median_kept(home):
    calls: list = []
    plain = _calibrate(_windows({}, calls))
    calls.clear()
    # window 1 of q8_0 ran through a slow stretch of the host: its depth cost 60 % more; windows 2 and 3 quiet
    sc = S.calibrate(2, True, [], PAIRS, ["avx2"], geometries=[G], refresh=True,
                     runner=_windows({("q8_0", 1): 1.6}, calls))
    assert len(calls) == 2 and calls[1] == ["attnv_h9kv3k64v64.w3"]
    assert _term(sc, "q8_0") == pytest.approx(_term(plain, "q8_0"), rel=1e-9)     # the slow window is outvoted
    assert _term(sc, "q4_0") == pytest.approx(_term(plain, "q4_0"), rel=1e-9)
    assert "decode timed a third time where two windows disagreed: q8_0/q8_0/fa=auto@h9kv3k64v64" in sc.note
    # only the disagreeing pair's contexts are timed again
    assert "q4_0" not in sc.note.split("disagreed:")[1]


def test_a_window_that_measured_no_cost_is_timed_again(home):
    calls: list = []
    plain = _calibrate(_windows({}, calls))
    calls.clear()
    slow = {("q4_0", 2): 0.0}        # its deep runs as fast as its shallow ones: other work hid the cost
    sc = S.calibrate(2, True, [], PAIRS, ["avx2"], geometries=[G], refresh=True, runner=_windows(slow, calls))
    assert len(calls) == 2 and calls[1] == ["attnv_h9kv3k64v64.w3"]
    assert _term(sc, "q4_0") == pytest.approx(_term(plain, "q4_0"), rel=1e-9)


def test_window_results_come_back_under_the_models_own_keys():
    plan = decode_window({G: PAIRS}, 2, True, "", True, 2)
    res = window_results(_fake_results(plan), 2)
    assert {r.model for r in res} == {"attnv_h9kv3k64v64"}
    assert window_results(_fake_results(plan), 3) == []
