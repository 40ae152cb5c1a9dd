"""The in-process probe takes the steps of one turn in turn with each other (edgekv.core.probe.ProbeStep.turn),
through a recording stand-in for llama.cpp's memory calls: the order of the runs is the point, and the real runs
of the same plan are tests/unit/core/test_speed.py's."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from edgekv.calibration.speedcal import plans as P
from edgekv.child import speedprobe as SP
from edgekv.core.probe import ProbeStep


class _Memory:
    """llama.cpp's sequence positions, as the probe reads and trims them."""

    def __init__(self) -> None:
        self.pos: dict[int, int] = {}

    def llama_memory_seq_pos_max(self, mem, s):
        return self.pos.get(s, -1)

    def llama_memory_seq_rm(self, mem, s, p0, p1):
        self.pos[s] = min(self.pos.get(s, -1), p0 - 1)
        return True

    def llama_n_threads(self, ctx):
        return 2


def _run(monkeypatch, steps: list[ProbeStep]):
    L, runs, said = _Memory(), [], []

    def decode(L_, ctx, work, what):
        s, d, n = work
        L.pos[s] = d + n - 1
        runs.append((what, s, d, n))
        return 1000 + len(runs)

    monkeypatch.setattr(SP, "seq_tokens", lambda L_, runner, s, d, n, gen: (s, d, n))
    monkeypatch.setattr(SP, "decode_timed", decode)
    runner = SimpleNamespace(ctx=None, filled_on=None, filling=contextlib.nullcontext)
    ev = SimpleNamespace(emit=lambda kind, **kw: said.append(kw["step"]))
    return SP._probe_steps(L, runner, None, steps, "m/c", ev), runs, said


def test_a_turns_steps_run_in_turn_and_each_keeps_its_own_pairs(monkeypatch):
    """A turn of two prompt steps over depths (0, 1024): after the deep sequence's fill, run i is the first step
    shallow, then deep, then the second step shallow, then deep, before run i + 1; each step's results keep their
    own runs, the warm-up dropped, paired (in_turn).  A step of another turn is taken on its own."""
    steps = [P.step("pp", "pp", 0, 256, 2, depths=[0, 1024], turn="pp"),
             P.step("pt", "pp", 0, 96, 2, depths=[0, 1024], turn="pp"),
             P.step("tg", "tg", 0, 8, 2, depths=[0, 1024])]
    res, runs, said = _run(monkeypatch, steps)
    assert said == ["m/c/pp+pt", "m/c/tg"]
    assert runs[0] == ("filling the cache", 1, 0, 1024)
    one = [("processing a prompt", 0, 0, 256), ("processing a prompt", 1, 1024, 256),
           ("processing a prompt", 0, 0, 96), ("processing a prompt", 1, 1024, 96)]
    assert runs[1:13] == one * 3
    assert runs[13:] == [("generating", 0, 0, 8), ("generating", 1, 1024, 8)] * 3
    by = {r.step: r for r in res}
    assert list(by) == ["pp0", "pp1024", "pt0", "pt1024", "tg0", "tg1024"]
    assert by["pp0"].ns == [1006, 1010] and by["pp1024"].ns == [1007, 1011]     # run 1 of each, the warm-up out
    assert by["pt0"].ns == [1008, 1012] and by["pt1024"].ns == [1009, 1013]
    assert all(r.in_turn and r.threads == 2 for r in res)


def test_steps_join_a_turn_only_with_the_same_depths_and_runs():
    """Consecutive steps of one turn join it; a step without a turn, or with other depths or reps, is its own."""
    a = P.step("pp", "pp", 0, 256, 3, depths=[0, 1024], turn="pp")
    b = P.step("ps", "pp", 0, 32, 3, depths=[0, 1024], turn="pp")
    assert [[s.key for s in g] for g in SP._turns([a, b])] == [["pp", "ps"]]
    for other in (P.step("ps", "pp", 0, 32, 3, depths=[0, 1024]),
                  P.step("ps", "pp", 0, 32, 3, depths=[0, 512], turn="pp"),
                  P.step("ps", "pp", 0, 32, 5, depths=[0, 1024], turn="pp"),
                  P.step("ps", "pp", 1024, 32, 3, turn="pp")):
        assert [[s.key for s in g] for g in SP._turns([a, other])] == [["pp"], ["ps"]]


def test_the_interleaved_plan_takes_the_long_and_the_short_tile_prompt_in_one_turn():
    """An f16 cache's interleaved long and short-tile prompts share a turn, so the tile share, their ratio, is
    timed in the same stretches of the machine; the short-row prompt follows on its own, and a quantized cache has
    the long prompt alone.  The deep model's two prompts share a turn too."""
    (m,) = P.attn_plan([("f16", "f16", "auto")], 2, False, interleave=True)
    (c,) = m.contexts
    assert [[s.key for s in g] for g in SP._turns(c.steps) if g[0].test == "pp"] == [["pp", "pt"], ["ps"]]
    assert [(s.key, s.reps) for s in c.steps if s.test == "pp"] == [("pp", P.PP_TURN_REPS), ("pt", P.PP_TURN_REPS),
                                                                     ("ps", 3)]
    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 2, False, interleave=True)
    assert [[s.key for s in g] for g in SP._turns(m.contexts[0].steps) if g[0].test == "pp"] == [["pp"]]
    deep = P.deep_plan([("f16", "f16", "auto")], 2, False, "h8kv2k64v64", interleave=True)
    assert [[s.key for s in g] for g in SP._turns(deep.contexts[0].steps)] == [["pd", "td"]]
