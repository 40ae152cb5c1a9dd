"""The default -r stops early only when its repetitions agree (core.benchwire.tight) or a test past its least has run
its time budget (core.benchwire.enough); a -r the user gives runs in full."""

from __future__ import annotations

import math

from edgekv.core.benchwire import T975, TIGHT_HALF_WIDTH, enough, expected_reps, tight
from edgekv.core.stats import summarize


def test_three_agreeing_repetitions_are_enough():
    assert tight([100, 101, 102], 3)
    assert not tight([100, 101], 3)                                   # fewer than the least
    assert not tight([100, 100, 100, 100, 100], 0)                    # 0: every repetition runs


def test_a_wide_interval_keeps_measuring():
    assert not tight([100, 110, 100], 3)
    assert not tight([100, 110, 100, 100], 4)                         # every sample so far counts
    assert tight([100, 103, 101, 102], 3)


def test_the_bound_is_the_interval_the_record_shows():
    """tight() stops exactly when the records' own 95 % interval (core.stats.summarize, on the rates) is within
    TIGHT_HALF_WIDTH of the mean on the logarithm: just inside and just outside."""
    import scipy.stats

    assert all(abs(T975[df] - scipy.stats.t.ppf(0.975, df)) < 1e-5 for df in T975)
    for spread, want in ((0.030, True), (0.036, False)):
        ns = [100_000, int(100_000 * (1 + spread)), 100_000]
        rates = [1e9 / x for x in ns]
        lo, hi = summarize(rates)["ci95"]
        half = (math.log(hi) - math.log(lo)) / 2
        assert (half <= math.log1p(TIGHT_HALF_WIDTH)) is want is tight(ns, 3), (spread, half)


def test_the_child_request_carries_the_sweeps_least():
    from types import SimpleNamespace

    from edgekv.sweep.runners import bench_request
    from edgekv.sweep.spec import bench_settings

    st = bench_settings(n_threads=2, n_prompt=128, n_gen=32, n_depth=896)
    case = SimpleNamespace(settings=st, params=None)
    for least in (3, 0):
        spec = SimpleNamespace(model=SimpleNamespace(ref=SimpleNamespace(path="m.gguf"), shape=SimpleNamespace(memory="kv")),
                               min_repetitions=least, rep_budget_s=5.0 if least else 0.0)
        w = bench_request(spec, case).workload
        assert (w.repetitions, w.min_repetitions, w.rep_budget_s) == (5, least, 5.0 if least else 0.0)


def test_a_long_test_stops_at_its_least_once_it_has_run_its_budget():
    wide = [100, 130, 100]                                            # not tight
    assert not enough(wide, 3, 5.0, 4.9) and enough(wide, 3, 5.0, 5.0)
    assert not enough(wide[:2], 3, 5.0, 60.0)                         # never below the least
    assert not enough(wide, 3, 0.0, 60.0) and not enough(wide, 0, 5.0, 60.0)   # no budget, or -r given
    assert enough([100, 101, 102], 3, 5.0, 0.1)                       # tight stops it as before


def test_the_time_plan_counts_the_repetitions_the_budget_leaves():
    """expected_reps is the child's loop: a repetition starts while the test has run less than the budget."""
    for per_rep in (0.3, 1.0, 1.7, 2.5, 4.5, 9.0):
        ran, t = 0, 0.0
        while ran < 5:
            ran, t = ran + 1, t + per_rep
            if enough([100, 130, 100, 130, 100][:ran], 3, 5.0, t):          # never tight
                break
        assert expected_reps(5, per_rep, 3, 5.0) == ran, per_rep
    assert expected_reps(5, 9.0, 0, 5.0) == 5 and expected_reps(5, 9.0, 3, 0.0) == 5


def test_the_sweeps_plan_estimate_follows_the_budget():
    from edgekv.records import schema as S
    from edgekv.sweep.plan import speed_seconds
    from edgekv.sweep.spec import bench_settings

    st = bench_settings(n_threads=2, n_prompt=128, n_gen=32, n_depth=1920)
    def test(name: str, n: int, s: float) -> S.SpeedTestPrediction:
        return S.SpeedTestPrediction(test=name, n_tokens=n, depth=1920, s_per_token=s / n, tokens_per_s=n / s, parts=[],
                                     roofline_tokens_per_s=None, bytes_per_token=None, calibration_id="c")

    pp, tg = test("pp", 128, 4.5), test("tg", 32, 1.2)
    sp = S.SpeedPrediction(calibration_id="c", pp=pp, tg=tg)
    full, budget = speed_seconds(st, sp), speed_seconds(st, sp, 3, 5.0)
    assert full is not None and budget is not None
    assert abs((full - budget) - 2 * 4.5) < 1e-6                      # two prompt repetitions fewer, decode's all five
