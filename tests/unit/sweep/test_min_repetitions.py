"""The default -r stops early only when its repetitions agree (core.benchwire.tight); a -r the user gives runs in full."""

from __future__ import annotations

from edgekv.core.benchwire import TIGHT_SPREAD, tight


def test_three_agreeing_repetitions_are_enough():
    assert tight([100, 101, 102], 3)
    assert not tight([100, 101], 3)                                   # fewer than the least
    assert not tight([100, 100, 100, 100, 100], 0)                    # 0: every repetition runs


def test_a_spread_past_the_bound_keeps_measuring():
    slow = int(100 * (1 + TIGHT_SPREAD)) + 1
    assert not tight([100, slow, 100], 3)
    assert tight([100, slow, 100, 100], 4) is False                   # the spread counts every sample so far
    assert tight([100, 102, 103], 3)



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
