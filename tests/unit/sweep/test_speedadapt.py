"""Issue 68 point 1: a configuration measured far (2x) from its prediction on a quiet machine rescales the rest of the
plan's predictions before the next configuration runs, and the records say so."""

from __future__ import annotations

from types import SimpleNamespace

from edgekv.records.schema import SpeedPart, SpeedPrediction, SpeedTestPrediction
from edgekv.sweep.speedadapt import SpeedAdapter


def _t(test: str, ts: float) -> SpeedTestPrediction:
    return SpeedTestPrediction(test=test, tokens_per_s=ts, depth=512, n_tokens=32, s_per_token=1 / ts,
                               parts=[SpeedPart(name="attention", s_per_token=1 / ts, source="x")],
                               roofline_tokens_per_s=None, bytes_per_token=None, calibration_id="c")


def _case(key: str, tk: str):
    return SimpleNamespace(key=key, settings=SimpleNamespace(type_k=tk, type_v=tk, flash_attn="auto"))


def _rec(speed: SpeedPrediction, tg: float, pp: float, busy: bool = False):
    return SimpleNamespace(status="ok", prediction=SimpleNamespace(speed=speed),
                           speed=SimpleNamespace(tg=SimpleNamespace(mean_ts=tg), pp=SimpleNamespace(mean_ts=pp)),
                           load=SimpleNamespace(busy=busy))


def _plan():
    cases = [_case("a", "f16"), _case("b", "f16"), _case("c", "q8_0")]
    speeds = {c.key: SpeedPrediction(calibration_id="c", tg=_t("tg", 4.6), pp=_t("pp", 80.0)) for c in cases}
    return cases, speeds


def test_a_far_miss_scales_the_rest_of_the_plan_and_both_records_say_so():
    cases, speeds = _plan()
    ad = SpeedAdapter(speeds)
    made = ad.after(_rec(speeds["a"], tg=33.3, pp=64.6), cases[0], cases[1:])
    assert [(m.test, m.action) for m in made] == [("tg", "scaled")]          # pp was within 2x: left alone
    assert speeds["a"].far_miss.factor == 33.3 / 4.6 and speeds["a"].far_miss.config_key == "a"
    for k in "bc":                        # the next configurations' decode predictions now say what was measured
        assert abs(speeds[k].tg.tokens_per_s - 33.3) < 1e-6 and speeds[k].pp.tokens_per_s == 80.0
        assert abs(speeds[k].tg.parts[0].s_per_token - 1 / 33.3) < 1e-9
        assert speeds[k].adjusted[0].note.startswith("tg measured 33.3 tokens/s against 4.6 predicted")


def test_a_pairs_own_miss_takes_precedence_and_factors_never_compound():
    cases, speeds = _plan()
    ad = SpeedAdapter(speeds)
    ad.after(_rec(speeds["a"], tg=33.3, pp=80.0), cases[0], cases[1:])      # f16: 7.2x
    ad.after(_rec(speeds["b"], tg=10.0, pp=80.0), cases[1], cases[2:])      # f16 again, against its own 4.6: 2.2x
    assert abs(speeds["c"].tg.tokens_per_s - 10.0) < 1e-6                    # the latest any-pair factor, once
    assert len(speeds["c"].adjusted) == 1


def test_a_busy_or_close_measurement_moves_nothing():
    cases, speeds = _plan()
    ad = SpeedAdapter(speeds)
    assert ad.after(_rec(speeds["a"], tg=33.3, pp=80.0, busy=True), cases[0], cases[1:]) == []
    assert ad.after(_rec(speeds["a"], tg=8.0, pp=80.0), cases[0], cases[1:]) == []       # 1.7x: not far
    assert speeds["b"].tg.tokens_per_s == 4.6 and not speeds["b"].adjusted
