"""The default -r stops early only when its repetitions agree (core.benchwire.tight); a -r the user gives runs in full."""

from __future__ import annotations

import math

from edgekv.core.benchwire import T975, TIGHT_HALF_WIDTH, tight
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
                               min_repetitions=least)
        w = bench_request(spec, case).workload
        assert (w.repetitions, w.min_repetitions) == (5, least)
