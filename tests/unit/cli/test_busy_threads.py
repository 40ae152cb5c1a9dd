"""Issue 68 point 2, a loaded machine: llama.cpp's threads meet at a barrier after every graph node, so with one of two
cores kept busy by another process two threads crawled (about 9 minutes a configuration, the calibration past its
deadline).  The sweep's default -t and the calibration's untimed fills take the cores other work leaves free.
Synthetic CPU counters (no llama.cpp)."""

from __future__ import annotations

import pytest

from edgekv.calibration.speedcal.orchestrate import fills_on
from edgekv.cli import benchrun
from edgekv.core.probe import ProbeContext, ProbeModel, ProbeParams
from edgekv.machine import load


def _others(monkeypatch, cores: float, window_s: float = 0.5) -> None:
    """Other processes use ``cores`` over every window: the machine's busy CPU time grows by that much a second more
    than edgekv's own (which stays put)."""
    clock = {"t": 0.0}
    monkeypatch.setattr(load.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(load.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    monkeypatch.setattr(load, "_busy_cpu_s", lambda: cores * clock["t"])
    monkeypatch.setattr(load, "_own_cpu_s", lambda: 0.0)


@pytest.mark.parametrize(("cores", "left"), [(0.0, 2), (0.3, 2), (0.45, 2), (0.6, 1), (1.0, 1), (1.2, 1), (2.0, 1)])
def test_threads_left_counts_out_each_core_other_work_keeps_busy(monkeypatch, cores, left):
    _others(monkeypatch, cores)
    n, used = load.threads_left(2)
    assert n == left and used == pytest.approx(cores)


def test_threads_left_never_goes_below_one_and_keeps_more_cores(monkeypatch):
    _others(monkeypatch, 3.0)
    assert load.threads_left(2)[0] == 1
    assert load.threads_left(16)[0] == 13


@pytest.mark.parametrize("unset", [None, 0])
def test_the_sweep_runs_on_the_free_cores_and_says_why(monkeypatch, unset):
    """-t 0 (the CLI's default) and no -t both mean llama.cpp's default count."""
    _others(monkeypatch, 1.0)
    monkeypatch.setattr(benchrun, "default_threads", lambda: 2)
    t, why = benchrun.free_threads(unset)
    assert t == 1
    assert why is not None and "-t 1, not 2" in why and "1.0 of the 2 cores" in why and "-t sets the count" in why


def test_a_quiet_machine_keeps_llama_cpps_default(monkeypatch):
    """The check can fail: with no other work the default stays (0: llama.cpp's own count), no line."""
    _others(monkeypatch, 0.05)
    monkeypatch.setattr(benchrun, "default_threads", lambda: 2)
    assert benchrun.free_threads(None) == (0, None)
    assert benchrun.free_threads(0) == (0, None)


def test_an_asked_thread_count_is_never_changed(monkeypatch):
    _others(monkeypatch, 1.0)
    assert benchrun.free_threads(2) == (2, None)


def _plan(n_threads: int, fill: int) -> list[ProbeModel]:
    ctx = ProbeContext(key="f16", n_threads=n_threads, fill_threads=fill, steps=[],
                       params=ProbeParams(n_ctx=512, n_batch=512, n_ubatch=512, type_k="f16", type_v="f16",
                                          flash_attn="auto"))
    return [ProbeModel(key="m", model_path="/nonexistent/m.gguf", contexts=[ctx])]


@pytest.mark.parametrize(("n_threads", "fill", "cores", "want"),
                         [(1, 2, 1, 1), (2, 2, 1, 2), (1, 2, 2, 2), (1, 2, 0, 2), (1, 4, 3, 3)])
def test_the_calibrations_fills_run_on_the_free_cores(n_threads, fill, cores, want):
    """A fill may not use a core other work keeps busy (``cores``: those left free; 0: as planned), and never runs
    on fewer threads than the context's timed runs."""
    out = fills_on(_plan(n_threads, fill), cores)
    assert out[0].contexts[0].fill_threads == want
