"""Formula vs llama.cpp's own dry run on the two real models, over a grid of settings."""

from __future__ import annotations

import dataclasses
import itertools

import msgspec
import pytest

from edgekv.core.predict import STATUS_OK, ContextParams, predict
from edgekv.errors import EngineError
from edgekv.prediction.api import load_model
from edgekv.prediction.crosscheck import compare
from edgekv.runtime.engine import EngineSession

pytestmark = pytest.mark.slow      # the two real models through llama.cpp (fixtures taken by name)

GRID = [
    ContextParams(n_ctx=n, type_k=tk, type_v=tv, flash_attn=fa, swa_full=sf, n_seq_max=ns, kv_unified=u)
    for n, (tk, tv), fa, sf, ns, u in itertools.product(
        (1, 1000, 4096, 8448),
        # every cache type llama.cpp accepts appears as K and as V (q5_0 and q4_1 paired with each other both ways)
        (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f32", "bf16"), ("iq4_nl", "q5_1"),
         ("q5_0", "q4_1"), ("q4_1", "q5_0")),
        ("auto", "on", "off"),
        (False, True),
        (1, 2),
        (False, True),
    )
]


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma3_path"])
def test_formula_equals_engine_on_real_models(fixture, request):
    path = request.getfixturevalue(fixture)
    m = load_model(str(path))
    preds = [predict(m.shape, c) for c in GRID]
    runnable = [(c, p) for c, p in zip(GRID, preds) if not p.aborts]
    # memory only: the scheduler's node listing (speed's) off makes each context about 3.5 times quicker
    with EngineSession(str(path), header=m.header, graph_listing=False) as eng:
        results = eng.run([c for c, _ in runnable])
        assert eng.model_size_bytes == m.header.weights_bytes
    n_ok = 0
    for (c, p), r in zip(runnable, results):
        assert compare(p, r) == [], c
        n_ok += p.status == STATUS_OK
    # the grid includes refusals (quantized V with FA off) and successes
    assert 0 < n_ok < len(runnable)


def test_the_graph_listing_changes_no_memory_figure(smollm2_path):
    """graph_listing=False leaves every memory line as it was; only the scheduler's node listing goes."""
    m = load_model(str(smollm2_path))
    cs = [ContextParams(n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn="on"), ContextParams(n_ctx=1000)]
    got = {}
    for listing in (True, False):
        with EngineSession(str(smollm2_path), header=m.header, graph_listing=listing) as eng:
            got[listing] = eng.run(cs)
    for on, off in zip(got[True], got[False]):
        assert on.ok and "ops_tg" in on.log.graph and "ops_tg" not in off.log.graph   # the listing was on, then off
        assert {k: v for k, v in on.log.graph.items() if not k.startswith("ops_")} == off.log.graph
        assert dataclasses.replace(on.log, graph=None, placement=None) == dataclasses.replace(off.log, graph=None,
                                                                                              placement=None)
        # the process's own growth is the one figure apart: the listing's captured lines are this process's memory
        assert msgspec.structs.replace(on, log=off.log, host_growth_context_less_output_bytes=None) == \
            msgspec.structs.replace(off, host_growth_context_less_output_bytes=None)


def test_predicted_aborts_really_abort(smollm2_path):
    """n_ctx=1 with 2 sequences: the formula says llama.cpp aborts; the engine's child must die of it."""
    m = load_model(str(smollm2_path))
    c = ContextParams(n_ctx=1, n_seq_max=2)
    p = predict(m.shape, c)
    assert p.status == "invalid" and p.aborts
    with pytest.raises(EngineError, match="GGML_ASSERT"), EngineSession(str(smollm2_path), header=m.header) as eng:
        eng.run([c])
    # and a session keeps working for the runnable neighbour
    with EngineSession(str(smollm2_path), header=m.header) as eng:
        assert eng.run([ContextParams(n_ctx=2, n_seq_max=2)])[0].ok
