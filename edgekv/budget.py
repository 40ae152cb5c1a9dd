"""--budget: the largest context (multiple of 256) whose weights + caches + compute + output fit.

The cache bytes come from the formula (checked against llama.cpp elsewhere); the compute and output
buffers can only come from llama.cpp, so each candidate context is dry-run through one
:class:`~edgekv.engine.EngineSession`.  All of these grow with the context, so a binary search is
exact.  The search stops at the model's trained context.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .api import LoadedModel
from .errors import EngineError
from .predict import KV_PAD, MIB, STATUS_OK, ContextParams, largest_fitting, max_context_for_budget, predict


def budget_table(m: LoadedModel, base: ContextParams, pairs: list[tuple[str, str]], budget_bytes: int,
                 n_gpu_layers: int = -1, cap: int | None = None) -> list[dict[str, Any]]:
    from .engine import EngineSession

    shape = m.shape
    cap = cap or shape.n_ctx_train or (1 << 20)
    cap = max(KV_PAD, cap // KV_PAD * KV_PAD)
    rows: list[dict[str, Any]] = []
    try:
        session = EngineSession(m.ref.path, n_gpu_layers=n_gpu_layers, header=m.header).__enter__()
    except EngineError as e:
        session = None
        engine_error = str(e)
    try:
        for tk, tv in pairs:
            params = replace(base, type_k=tk, type_v=tv)
            upper = max_context_for_budget(shape, budget_bytes, m.weights_bytes, params, upper=cap)
            row: dict[str, Any] = {"type_k": tk, "type_v": tv, "budget_bytes": budget_bytes, "cap": cap}
            if session is None:
                row.update(_formula_only(m, params, upper))
                row["note"] = f"compute buffer unknown ({engine_error}); weights + caches only"
                rows.append(row)
                continue
            probe = _Probe(session, shape, params)

            def fits(n: int, probe: _Probe = probe) -> bool:
                ok, cache_b, extra = probe.measure(n)
                return ok and m.weights_bytes + cache_b + extra <= budget_bytes

            best = largest_fitting(fits, KV_PAD, upper)
            if best:
                _, cache_b, extra = probe.measure(best)
                row.update({"max_n_ctx": best, "cache_bytes": cache_b, "compute_bytes": extra,
                            "weights_bytes": m.weights_bytes, "total_bytes": m.weights_bytes + cache_b + extra,
                            "source": "formula caches + llama.cpp compute/output buffers"})
                if best == cap:
                    row["note"] = f"capped at the trained context ({cap})"
            else:
                row.update({"max_n_ctx": 0, "cache_bytes": None, "compute_bytes": None, "total_bytes": None})
                pr = predict(shape, replace(params, n_ctx=KV_PAD))
                row["note"] = pr.reason if pr.status != STATUS_OK else "not even 256 tokens fit"
            rows.append(row)
    finally:
        if session is not None:
            session.__exit__(None, None, None)
    return rows


class _Probe:
    """Cache bytes (formula) and compute + output bytes (llama.cpp) at one context, memoised."""

    def __init__(self, session, shape, params: ContextParams):
        self.session, self.shape, self.params = session, shape, params
        self.seen: dict[int, tuple[bool, int, int]] = {}

    def measure(self, n: int) -> tuple[bool, int, int]:
        if n not in self.seen:
            pr = predict(self.shape, replace(self.params, n_ctx=n))
            if pr.status != STATUS_OK or pr.aborts:
                self.seen[n] = (False, 0, 0)
                return self.seen[n]
            res = self.session.run([replace(self.params, n_ctx=n)])[0]
            if not res.ok:
                self.seen[n] = (False, 0, 0)
            else:
                extra = int(round((res.log.compute_mib_total + res.log.output_mib_total) * MIB))
                self.seen[n] = (True, pr.total_bytes, extra)
        return self.seen[n]


def _formula_only(m: LoadedModel, params: ContextParams, upper: int) -> dict[str, Any]:
    if not upper:
        return {"max_n_ctx": 0, "cache_bytes": None, "compute_bytes": None, "total_bytes": None}
    pr = predict(m.shape, replace(params, n_ctx=upper))
    return {"max_n_ctx": upper, "cache_bytes": pr.total_bytes, "compute_bytes": None,
            "weights_bytes": m.weights_bytes, "total_bytes": m.weights_bytes + pr.total_bytes,
            "source": "formula (weights + caches)"}
