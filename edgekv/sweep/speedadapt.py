"""A far miss acted on (issue 68): when a configuration bench just measured lands FAR_MISS times away from its speed
prediction on a quiet machine, the rest of the plan's predictions of that test are scaled by what it measured,
before the next configuration runs, and both records say so (``prediction.speed.far_miss`` on the one that missed,
``prediction.speed.adjusted`` on each one scaled).

The factor is measured / predicted tokens/s of the configuration that missed, applied to the later configurations'
own (unscaled) predictions: of the same K/V pair where one of that pair missed (attention at depth is the pair's
own term), else of every later configuration (the fixed and weight terms are shared).  A busy run's measurement
says little about this machine and moves nothing; a later far miss replaces the factor it would use.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import msgspec

from edgekv.machine.load import record_busy
from edgekv.records.schema import SpeedAdjustment, SpeedPrediction, SpeedTestPrediction

FAR_MISS = 2.0
TESTS = ("pp", "tg")


def _pair(case: Any) -> tuple[str, str, str]:
    s = case.settings
    return (str(s.type_k), str(s.type_v), str(s.flash_attn))


def scaled(t: SpeedTestPrediction, factor: float) -> SpeedTestPrediction:
    """A predicted test with its tokens/s multiplied by ``factor`` (its parts' seconds divided by it)."""
    return msgspec.structs.replace(t, tokens_per_s=t.tokens_per_s * factor, s_per_token=t.s_per_token / factor,
                                   parts=[msgspec.structs.replace(p, s_per_token=p.s_per_token / factor)
                                          for p in t.parts])


@dataclass
class SpeedAdapter:
    """The sweep's speed predictions (case key -> block, the dict the sweep attaches from), adjusted as the
    configurations are measured (:meth:`after`)."""

    speeds: dict[str, SpeedPrediction]
    original: dict[str, SpeedPrediction] = field(default_factory=dict)
    by_pair: dict[tuple[str, tuple[str, str, str]], SpeedAdjustment] = field(default_factory=dict)
    any_pair: dict[str, SpeedAdjustment] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.original = {k: copy.deepcopy(v) for k, v in self.speeds.items() if v is not None}

    def after(self, rec: Any, case: Any, later: list[Any]) -> list[SpeedAdjustment]:
        """Act on ``rec`` (the record of ``case``, just measured): for each test it measured FAR_MISS away from its
        own unscaled prediction on a quiet machine, scale the ``later`` configurations' predictions of that test;
        returns the adjustments made (also on ``rec.prediction.speed.far_miss``)."""
        base = self.original.get(case.key)
        if rec.status != "ok" or base is None or record_busy(rec) or not later:
            return []
        made = []
        for test in TESTS:
            p, m = getattr(base, test, None), getattr(getattr(rec, "speed", None), test, None)
            p, m = (p.tokens_per_s if p else None), (getattr(m, "mean_ts", None) if m else None)
            if not p or not m or 1 / FAR_MISS < m / p < FAR_MISS:
                continue
            adj = SpeedAdjustment(action="scaled", test=test, factor=m / p, config_key=case.key,
                                  note=f"{test} measured {m:.1f} tokens/s against {p:.1f} predicted on a quiet machine: "
                                       f"the rest of the plan's {test} predictions scaled by {m / p:.2f}")
            self.by_pair[(test, _pair(case))] = adj
            self.any_pair[test] = adj
            made.append(adj)
        if made:
            speed = rec.prediction.speed
            if isinstance(speed, SpeedPrediction):
                speed.far_miss = made[-1]
            for c in later:
                self._apply(c)
        return made

    def _apply(self, case: Any) -> None:
        """A later configuration's prediction: its own, each test scaled by the factor that applies to it."""
        base = self.original.get(case.key)
        if base is None:
            return
        out, adjs = copy.deepcopy(base), []
        for test in TESTS:
            t = getattr(base, test, None)
            adj = self.by_pair.get((test, _pair(case))) or self.any_pair.get(test)
            if isinstance(t, SpeedTestPrediction) and adj is not None:
                setattr(out, test, scaled(t, adj.factor))
                adjs.append(adj)
        if adjs:
            out.adjusted = adjs
            self.speeds[case.key] = out
