"""Count a recorded decode bound again (issue 26), leaving the prediction as it was made.

Until 1 Dec 2026 edgekv.core.speed counted the K/V a decoded token reads as every cache-owning layer's at the whole
depth, where a sliding-window layer reads at most its window (and a layer that reads another layer's cache reads
those cells again): Gemma 3 270M's bound at 32K was 35 t/s under a predicted 39.  The committed reports' records were
made with that count.  This recounts them with :func:`edgekv.core.speed.kv_read_bytes`: the bandwidth is the one the
record's calibration measured (its bound x its bytes), the weights' bytes are the recorded bytes less the old K/V
count, so nothing is measured or predicted again.  Used by tools/publish/explain_reports.py and tools/publish/predicted_reports.py
(``--roofline-only``).
"""

from __future__ import annotations

import re

from edgekv.core.cachetypes import CACHE_TYPES
from edgekv.core.speed import SpeedShape, kv_read_bytes

_SHARE = re.compile(r"; \d+ % of the bandwidth bound \(\d+ t/s\)")


def old_kv_bytes(shape, type_k: str, type_v: str, depth: float) -> float:
    """The K/V bytes of one decoded token as edgekv counted them before 1 Dec 2026 (only to take them out again)."""
    per = sum(lay.k_width + lay.v_width for lay in shape.layers[:shape.n_layer] if lay.attn_cache)
    tk, tv = CACHE_TYPES[type_k], CACHE_TYPES[type_v]
    return per * (tk.block_bytes / tk.block + tv.block_bytes / tv.block) / 2 * depth


def recount(shape, sh: SpeedShape, type_k: str, type_v: str, depth: int, n_gen: int, bytes_per_token: float,
            roofline_ts: float, predicted_ts: float, explain: str | None) -> tuple[float, float, str | None]:
    """(bytes per token, bound t/s, explain line) of one decoded token's recorded prediction, counted again."""
    mean = depth + max(1, n_gen) / 2
    bandwidth = roofline_ts * bytes_per_token
    read = bytes_per_token - old_kv_bytes(shape, type_k, type_v, mean) + kv_read_bytes(sh, type_k, type_v, mean)
    roof = bandwidth / read
    if isinstance(explain, str):
        explain = _SHARE.sub(f"; {100 * predicted_ts / roof:.0f} % of the bandwidth bound ({roof:.0f} t/s)", explain)
    return read, roof, explain
