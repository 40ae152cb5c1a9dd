"""What ``edgekv predict`` computes, before anything is shown: one row per configuration.

Each row holds edgekv's formula (:mod:`edgekv.core.predict`), and with ``engine`` llama.cpp's own dry run
beside it (:class:`edgekv.edges.engine.EngineSession`, compared line by line by
:mod:`edgekv.orchestration.crosscheck`); :func:`run_predict` adds the whole-process prediction
(:mod:`edgekv.orchestration.procpredict`), the ``--budget`` table (:mod:`edgekv.orchestration.budget`),
the cost of llama-cpp-python's ``Llama()`` defaults and the per-layer prediction.  The terminal views
(:mod:`edgekv.output.views`) only render what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from edgekv.core.predict import STATUS_OK, ContextParams, KVPrediction, predict
from edgekv.orchestration.api import LoadedModel, llama_python_defaults_cost
from edgekv.orchestration.crosscheck import engine_block


def _dry_runs(m: LoadedModel, configs: list[ContextParams], preds: list[KVPrediction], n_gpu_layers: int):
    """(llama.cpp's dry-run result per configuration, None where it would abort; llama.cpp's weights bytes)."""
    from edgekv.edges.engine import EngineSession

    # settings llama.cpp aborts on would take the whole dry-run process down: never send them
    runnable = [c for c, p in zip(configs, preds) if not p.aborts]
    with EngineSession(m.ref.path, n_gpu_layers=n_gpu_layers, header=m.header) as eng:
        done = iter(eng.run(runnable)) if runnable else iter(())
        results = [None if p.aborts else next(done) for p in preds]
        return results, eng.model_size_bytes      # llama_model_size(): llama.cpp's own weights figure


def predict_rows(m: LoadedModel, configs: list[ContextParams], engine: bool = False, n_gpu_layers: int = -1,
                 with_layers: bool = False) -> list[dict[str, Any]]:
    """One ``edgekv predict --json`` row per configuration: the formula, its saving against f16 and, with
    ``engine``, llama.cpp's dry run beside it."""
    # TODO(issue 17): these rows become Records of kind ``predict`` once edgekv.records.schema lands
    shape = m.shape
    preds = [predict(shape, c) for c in configs]
    f16_cache: dict[tuple, KVPrediction] = {}
    engine_results = None
    if engine:
        engine_results, engine_weights = _dry_runs(m, configs, preds, n_gpu_layers)
    rows = []
    for i, (c, p) in enumerate(zip(configs, preds)):
        key = (c.n_ctx,)
        if key not in f16_cache:
            f16_cache[key] = predict(shape, replace(c, type_k="f16", type_v="f16"))
        base = f16_cache[key]
        row = {"model": m.ref.path, "arch": shape.arch, **p.to_dict(with_layers=with_layers),
               "weights_bytes": m.weights_bytes, "source": "formula"}
        row["saving_vs_f16"] = (round(base.total_bytes / p.total_bytes, 3)
                                if p.status == STATUS_OK and base.status == STATUS_OK and p.total_bytes else None)
        if engine_results is not None:
            res = engine_results[i]
            row["engine"] = (engine_block(p, res, m.weights_bytes) if res is not None else
                             {"ok": False, "error": "not run: llama.cpp would abort", "match": True, "diffs": []})
            row["engine"]["weights_bytes"] = engine_weights
        rows.append(row)
    return rows


@dataclass
class PredictRequest:
    """Everything ``edgekv predict`` was asked for, flags already checked."""

    base: ContextParams
    configs: list[ContextParams]
    pairs: list[tuple[str, str]]
    engine: bool = False
    n_gpu_layers: int = -1
    layers: bool = False            # the per-layer table (terminal) or per-row layers (with_layers_json)
    with_layers_json: bool = False
    process: Any = None             # procpredict.ProcessSettings (workload, threads, mmap, GPU layers)
    kv_only: bool = False           # caches only: no whole-process prediction
    budget_bytes: int | None = None


@dataclass
class PredictOutcome:
    """What ``edgekv predict`` shows: rows, notes and the optional tables, computed before rendering."""

    rows: list[dict[str, Any]]
    process_notes: list[str] = field(default_factory=list)
    budget: list[dict[str, Any]] | None = None
    # (n_ctx, bytes with llama.cpp's command-line defaults, bytes with llama-cpp-python's Llama() defaults)
    defaults_cost: tuple[int, int, int] | None = None
    layer_params: ContextParams | None = None
    layer_prediction: KVPrediction | None = None


def _defaults_cost(m: LoadedModel, base: ContextParams, rows: list[dict[str, Any]]) -> tuple[int, int, int] | None:
    ok_rows = [r for r in rows if r["status"] == STATUS_OK]
    if not ok_rows:
        return None
    last = max(ok_rows, key=lambda r: r["n_ctx_padded"])
    cost = llama_python_defaults_cost(m.shape, replace(base, n_ctx=last["n_ctx"], type_k="f16", type_v="f16"))
    return (last["n_ctx"], cost[0], cost[1]) if cost else None


def run_predict(m: LoadedModel, req: PredictRequest) -> PredictOutcome:
    """Compute everything ``edgekv predict`` prints: formula rows (and llama.cpp's dry run), the
    whole-process prediction, the budget table, and the notes the view adds under the table."""
    rows = predict_rows(m, req.configs, engine=req.engine, n_gpu_layers=req.n_gpu_layers,
                        with_layers=req.with_layers_json)
    out = PredictOutcome(rows)
    if not req.kv_only:
        from edgekv.orchestration.procpredict import attach_process_rows

        out.process_notes = attach_process_rows(m, req.configs, rows, req.process)
    if req.budget_bytes is not None:
        from edgekv.orchestration.budget import budget_table

        p = req.process
        out.budget = budget_table(m, req.base, req.pairs, req.budget_bytes, n_gpu_layers=req.n_gpu_layers,
                                  workload=p.workload, n_threads=p.n_threads, use_mmap=p.use_mmap)
    out.defaults_cost = _defaults_cost(m, req.base, rows)
    if req.layers:
        first = next((r for r in rows if r["status"] == STATUS_OK), None)
        if first:
            out.layer_params = replace(req.base, n_ctx=first["n_ctx"], type_k=first["type_k"], type_v=first["type_v"])
            out.layer_prediction = predict(m.shape, out.layer_params)
    return out
