"""Issue 68 point 2, the bias: a prompt deep in an f16 cache was priced with the first TILED_SHALLOW_END cells of every
query row's scan at the shallow rate and only the cells past them at the dearer one, so every prefill between 1024
and 8192 cells came out too fast.  Synthetic calibrations (no llama.cpp): every cell of a scan at its scan's rate."""

from __future__ import annotations

import pytest

from edgekv.core.speed import (
    TILED_DEEP_DEPTHS,
    TILED_SHALLOW_END,
    AttnLayer,
    Calibration,
    SpeedShape,
    kv_key,
    predict_pp,
)
from edgekv.core.speedcost import tiled_cell_rate

SHALLOW, DEEP = 22e-12, 40e-12          # SmolLM2's heads on the 2-vCPU EPYC (bench/README.md)
LAY = AttnLayer(n_head=9, head_k=64, head_v=64, window=None, n_head_kv=3)
SH = SpeedShape((), (LAY,) * 30, 900, 950)


def _cal() -> Calibration:
    k = kv_key("f16", "f16", "auto", LAY.geometry)
    return Calibration(id="c", n_threads=2, node_tg_s=1e-6, node_pp_s=45e-6, node_pp_short_s=4e-6,
                       attn_tg_s={k: 65e-12}, attn_pp_s={k: SHALLOW}, attn_pp_rows_s={k: 80e-12},
                       attn_pp_deep_s={k: DEEP})


def _attn(depth: int) -> float:
    r = predict_pp(SH, _cal(), depth, 512, 2048, 512, "f16", "f16", "auto")
    return next(p.s_per_token for p in r.parts if p.name == "attention")


def _old(scan: float) -> float:
    """The position-integral pricing before issue 68 (per unit)."""
    a, b = TILED_SHALLOW_END, TILED_DEEP_DEPTHS[0]
    if scan <= a:
        return SHALLOW * scan
    at = tiled_cell_rate(min(scan, b), SHALLOW, DEEP)
    return SHALLOW * a + (min(scan, b) - a) * (SHALLOW + at) / 2 + DEEP * max(0.0, scan - b)


UNITS = 30 * 9 * 128


@pytest.mark.parametrize("depth", [0, 256, 512])
def test_a_shallow_prompt_is_priced_as_before(depth):
    assert _attn(depth) == pytest.approx(UNITS * SHALLOW * (depth + 256))


@pytest.mark.parametrize("depth,more", [(1536, 0.15), (3584, 0.37), (8192, 0.16)])
def test_a_deep_prompt_prices_every_cell_of_its_scan_at_the_scans_rate(depth, more):
    """bench's default first run prefills 512 tokens at depth 1536 (ctx 2048): a mean scan of 1792 cells, each at
    the rate a quarter up the ramp; the old pricing was 15 % cheaper there, 37 % at ctx 4096 and 16 % at 8192+."""
    scan = depth + 256
    got = _attn(depth)
    assert got == pytest.approx(UNITS * scan * tiled_cell_rate(scan, SHALLOW, DEEP))
    assert got / (UNITS * _old(scan)) - 1 == pytest.approx(more, abs=0.01)
