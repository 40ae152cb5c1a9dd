"""edgekv.sweep.seeds: which configuration of a sweep starts from which one's depth state, and what the time plan
leaves out (the real child's restore is tests/real/test_bench.py's)."""

from __future__ import annotations

from edgekv.prediction.api import load_model
from edgekv.records import schema as S
from edgekv.sweep.plan import prior_seconds, speed_seconds
from edgekv.sweep.run import expand
from edgekv.sweep.seeds import MAX_STATE_BYTES, DepthSeeds, plan_seeds, seeded_depths
from edgekv.sweep.spec import ENGINE_LLAMA_BENCH, bench_settings, sweep_spec

PAIRS = [("f16", "f16"), ("q4_0", "q4_0")]


def _cases(path, **kw):
    spec = sweep_spec(model=load_model(str(path)), contexts=[1024, 2048], pairs=PAIRS, n_prompt=128, n_gen=32, **kw)
    return spec, expand(spec, None)


def test_each_deeper_configuration_starts_from_the_shallower_one_of_its_cache(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    spec, cases = _cases(smollm2_path)
    plans = plan_seeds(spec, cases)
    by = {(c.settings.n_ctx, c.settings.type_k): c for c in cases}
    for t in ("f16", "q4_0"):
        small, big = by[(1024, t)], by[(2048, t)]
        assert plans[small.key].save and plans[small.key].donor is None
        assert plans[big.key].donor == small.key and plans[big.key].tokens == small.settings.n_depth == 896
        assert not plans[big.key].save                           # nothing deeper of that cache follows
    assert seeded_depths(plans) == {by[(2048, t)].key: 896 for t in ("f16", "q4_0")}
    # at run time: the 1K run saves into the sweep's folder under edgekv's home; the 2K run loads it once it was ok
    seeds = DepthSeeds(plans)
    small, big = by[(1024, "q4_0")], by[(2048, "q4_0")]
    first = seeds.request(small)
    assert first is not None and first.load is None and first.save.startswith(str(tmp_path / "tmp"))
    open(first.save, "wb").close()
    seeds.done(small, ok=True)
    second = seeds.request(big)
    assert second is not None and (second.load, second.tokens, second.save) == (first.save, 896, None)
    assert seeds.request(by[(2048, "f16")]) is None          # its donor has not run
    seeds.close()
    assert not list((tmp_path / "tmp").iterdir())


def test_a_failed_donor_leaves_a_whole_fill(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    spec, cases = _cases(smollm2_path)
    seeds = DepthSeeds(plan_seeds(spec, cases))
    small, big = cases[0], next(c for c in cases if c.settings.n_ctx == 2048 and c.settings.type_k == cases[0].settings.type_k)
    open(seeds.request(small).save, "wb").close()
    seeds.done(small, ok=False)
    assert seeds.request(big) is None and not list(seeds.folder.iterdir())
    seeds.close()


def test_only_plain_caches_of_edgekvs_engine_take_part(smollm2_path, gemma3_path, monkeypatch):
    spec, cases = _cases(gemma3_path)                 # sliding-window layers: a cache of two parts
    assert plan_seeds(spec, cases) == {}
    spec, cases = _cases(smollm2_path, engine=ENGINE_LLAMA_BENCH)
    assert plan_seeds(spec, cases) == {}
    spec, cases = _cases(smollm2_path, depths=[512])  # one depth: nothing shallower to start from
    assert plan_seeds(spec, cases) == {}
    monkeypatch.setattr("edgekv.sweep.seeds.MAX_STATE_BYTES", 1000)   # a state too large to write
    spec, cases = _cases(smollm2_path)
    assert plan_seeds(spec, cases) == {} and MAX_STATE_BYTES == 1 << 30


def test_the_time_plan_fills_only_what_is_not_restored():
    st = bench_settings(n_threads=2, n_prompt=128, n_gen=32, n_depth=1920)

    def test(name: str, n: int, s: float, parts: list) -> S.SpeedTestPrediction:
        return S.SpeedTestPrediction(test=name, n_tokens=n, depth=1920, s_per_token=s / n, tokens_per_s=n / s,
                                     parts=parts, roofline_tokens_per_s=None, bytes_per_token=None, calibration_id="c")

    att = S.SpeedPart(name="attention", s_per_token=0.02, source="test")
    sp = S.SpeedPrediction(calibration_id="c", pp=test("pp", 128, 3.2, [att]), tg=test("tg", 32, 1.2, []))
    whole, seeded = speed_seconds(st, sp), speed_seconds(st, sp, fill_from=896)
    # the fill's first 896 tokens: 896 x (0.005 s of the rest + 0.02 s x mean depth 448 / the prompt's 1984)
    assert abs((whole - seeded) - 896 * (0.005 + 0.02 * 448 / 1984)) < 1e-6
    assert prior_seconds(st, 98_362_432, 23_040, 896) < prior_seconds(st, 98_362_432, 23_040)
    assert speed_seconds(st, sp, fill_from=1920) < seeded           # no fill at all
