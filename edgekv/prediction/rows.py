"""What ``edgekv predict`` computes, before anything is shown: one typed record (kind ``predict``,
:func:`edgekv.records.schema.predict_record`) per configuration.

Each record holds edgekv's formula (:mod:`edgekv.core.predict`), and with ``engine`` llama.cpp's own dry run
beside it (:class:`edgekv.runtime.engine.EngineSession`, compared line by line by
:mod:`edgekv.prediction.crosscheck`); :func:`run_predict` adds the whole-process prediction
(:mod:`edgekv.prediction.wholeprocess`), the ``--budget`` table (:mod:`edgekv.prediction.budget`),
the cost of llama-cpp-python's ``Llama()`` defaults and the per-layer prediction.  The terminal views
(:mod:`edgekv.output.views`) only render what comes back.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from msgspec import UNSET

from edgekv.calibration.baseline import runtime_baseline
from edgekv.calibration.preflight import repack_choice
from edgekv.core.fit import fits, size
from edgekv.core.llamacmd import llama_cpp_args, shell_line
from edgekv.core.predict import STATUS_OK, ContextParams, KVPrediction, formula_block, predict
from edgekv.core.speed import MissingCalibration, predict_tg
from edgekv.errors import EngineError
from edgekv.machine import memory as machine_memory  # read as machine_memory.available_memory: a test can stand in for it
from edgekv.machine.environment import default_threads
from edgekv.prediction.api import LoadedModel, llama_python_defaults_cost
from edgekv.prediction.budget import budget_table
from edgekv.prediction.crosscheck import engine_block, extra_buffer_check, extra_buffer_line
from edgekv.prediction.devicefit import metal_lines, metal_rows
from edgekv.prediction.speed import (
    SpeedInputs,
    calibration_for,
    offload_device,
    predict_speeds,
    swa_cells_of,
    with_graph,
)
from edgekv.prediction.wholeprocess import process_blocks
from edgekv.records.results import KEY_SETTINGS
from edgekv.records.schema import Process, Record, SpeedPrediction, encode, predict_record
from edgekv.runtime.engine import EngineSession
from edgekv.sweep.predictions import binary_baseline


def _dry_runs(m: LoadedModel, configs: list[ContextParams], preds: list[KVPrediction], n_gpu_layers: int):
    """(llama.cpp's dry-run result per configuration, None where it would abort; llama.cpp's weights bytes)."""
    # settings llama.cpp aborts on would take the whole dry-run process down: never send them
    runnable = [c for c, p in zip(configs, preds) if not p.aborts]
    with EngineSession(m.ref.path, n_gpu_layers=n_gpu_layers, header=m.header) as eng:
        done = iter(eng.run(runnable)) if runnable else iter(())
        results = [None if p.aborts else next(done) for p in preds]
        return results, eng.model_size_bytes      # llama_model_size(): llama.cpp's own weights figure


def _engine_blocks(m: LoadedModel, configs: list[ContextParams], preds: list[KVPrediction],
                   n_gpu_layers: int) -> list[dict[str, Any]]:
    """``prediction.engine`` per configuration: llama.cpp's dry run beside the formula, with its weights figure."""
    results, engine_weights = _dry_runs(m, configs, preds, n_gpu_layers)
    out = []
    for p, res in zip(preds, results):
        block = (engine_block(p, res, m.weights_bytes) if res is not None else
                 {"ok": False, "error": "not run: llama.cpp would abort", "match": True, "diffs": []})
        out.append({**block, "weights_bytes": engine_weights})
    return out


def _saving_vs_f16(shape: Any, c: ContextParams, p: KVPrediction, f16: dict[int, KVPrediction]) -> float | None:
    """f16 cache bytes / these cache bytes at the same context (formula), None where either is not ok."""
    if c.n_ctx not in f16:
        f16[c.n_ctx] = predict(shape, replace(c, type_k="f16", type_v="f16"))
    base = f16[c.n_ctx]
    return (round(base.total_bytes / p.total_bytes, 3)
            if p.status == STATUS_OK and base.status == STATUS_OK and p.total_bytes else None)


def predict_records(m: LoadedModel, configs: list[ContextParams], engine: bool = False, n_gpu_layers: int = -1,
                    with_layers: bool = False, processes: list[Process | None] | None = None) -> list[Record]:
    """One ``edgekv predict --json`` record (kind ``predict``) per configuration: the formula and its saving
    against f16; with ``engine`` llama.cpp's dry run beside it; with ``processes`` (one per configuration,
    None where not predicted) the whole-process prediction."""
    shape = m.shape
    preds = [predict(shape, c) for c in configs]
    engines = _engine_blocks(m, configs, preds, n_gpu_layers) if engine else None
    f16: dict[int, KVPrediction] = {}
    return [predict_record(model_path=m.ref.path, arch=shape.arch, weights_bytes=m.weights_bytes,
                           formula=formula_block(p, with_layers, _saving_vs_f16(shape, c, p, f16)),
                           engine=engines[i] if engines is not None else UNSET,
                           process=processes[i] if processes is not None else UNSET, key_settings=KEY_SETTINGS)
            for i, (c, p) in enumerate(zip(configs, preds))]


@dataclass
class PredictRequest:
    """Everything ``edgekv predict`` was asked for, flags already checked."""

    base: ContextParams
    configs: list[ContextParams]
    pairs: list[tuple[str, str]]
    engine: bool = False
    n_gpu_layers: int = -1
    layers: bool = False            # the per-layer table (terminal) or per-record layers (with_layers_json)
    with_layers_json: bool = False
    process: Any = None             # procpredict.ProcessSettings (workload, threads, mmap, GPU layers)
    kv_only: bool = False           # caches only: no whole-process prediction
    budget_bytes: int | None = None
    verbose: bool = False           # -v: print the llama.cpp command of every row
    depth: int | None = None        # -d: the depth the speed is predicted at (None: the context minus -p)
    n_prompt: int = 512             # the predicted tests: llama-bench's pp512 and tg128 at that depth
    n_gen: int = 128
    speed: bool = True              # predict tokens/s too, from this machine's cached calibration
    measure_speed: bool = False     # --speed: calibrate first what the cache lacks (bounded by calibration_timeout_s)
    calibration_timeout_s: float = 180.0
    min_tg: float | None = None     # --budget with --min-tg: decode at full depth at least this fast
    llama_bench: str | None = None  # --llama-bench: speed calibrated through that binary, the process over its baseline
    device: str | None = None       # --device metal: also answer for a Mac with device_memory bytes
    device_memory: int | None = None


@dataclass
class PredictOutcome:
    """What ``edgekv predict`` shows: typed records, notes and the optional tables, computed before rendering."""

    records: list[Record]
    process_notes: list[str] = field(default_factory=list)
    extra_buffers: dict[str, Any] | None = None  # --engine: the AMX/CPU_REPACK copies, formula and llama.cpp
    budget: list[Any] | None = None          # budget.BudgetRow per cache pair (--budget)
    device_fit: list[dict[str, Any]] | None = None   # --device metal: each configuration on a Mac (devicefit)
    # (n_ctx, bytes with llama.cpp's command-line defaults, bytes with llama-cpp-python's Llama() defaults)
    defaults_cost: tuple[int, int, int] | None = None
    layer_params: ContextParams | None = None
    layer_prediction: KVPrediction | None = None
    speed_model: Any = None                  # ({(K, V): SpeedShape}, Calibration, threads) when speed was predicted

    def to_json(self) -> Any:
        """What ``--json`` prints: the list of records; with ``--budget`` ``{"predictions": [records],
        "budget": [rows]}`` (a budget row answers a question about a cache pair, not one configuration, so it
        stays beside the records, never inside one)."""
        recs = [encode(r) for r in self.records]
        if self.budget is None and self.device_fit is None:
            return recs
        out: dict[str, Any] = {"predictions": recs}
        if self.budget is not None:
            out["budget"] = [msgspec.to_builtins(b) for b in self.budget]
        if self.device_fit is not None:
            out["device_fit"] = self.device_fit
        return out


def _defaults_cost(m: LoadedModel, base: ContextParams, recs: list[Record]) -> tuple[int, int, int] | None:
    ok = [r.prediction.formula for r in recs if r.prediction.formula.status == STATUS_OK]
    if not ok:
        return None
    last = max(ok, key=lambda f: f.n_ctx_padded)
    cost = llama_python_defaults_cost(m.shape, replace(base, n_ctx=last.n_ctx, type_k="f16", type_v="f16"))
    return (last.n_ctx, cost[0], cost[1]) if cost else None


def _command_lines(out: PredictOutcome, m: LoadedModel, req: PredictRequest) -> None:
    """Each record's llama.cpp arguments (``llama_cpp_args``): the context settings and the process settings the
    whole-process prediction assumed."""
    p = req.process
    for r in out.records:
        f = r.prediction.formula
        st = {"n_ctx": f.n_ctx, "type_k": f.type_k, "type_v": f.type_v, "flash_attn": req.base.flash_attn,
              "n_batch": req.base.n_batch, "n_ubatch": req.base.n_ubatch, "n_seq_max": req.base.n_seq_max,
              "kv_unified": req.base.kv_unified, "swa_full": req.base.swa_full, "n_threads": p.n_threads,
              "n_gpu_layers": req.n_gpu_layers, "no_mmap": not p.use_mmap, "repack": p.use_extra_bufts}
        r.llama_cpp_args = llama_cpp_args(st, m.ref.path)
        if req.verbose:
            out.process_notes.append("llama.cpp: " + shell_line("llama-server", r.llama_cpp_args))


def _fit_marks(out: PredictOutcome) -> None:
    """Each predicted process checked against the memory available now (edgekv.core.fit): ``fits`` and the figure
    used in its record, and one note naming those that do not fit."""
    avail = machine_memory.available_memory()
    if avail is None:
        return
    out_of: list[str] = []
    for r in out.records:
        proc = r.prediction.process
        if proc is UNSET or proc is None or not proc.peak_rss_bytes:
            continue
        proc.fits, proc.available_bytes, proc.available_source = fits(proc.peak_rss_bytes, avail.bytes), avail.bytes, \
            avail.source
        if not proc.fits:
            f = r.prediction.formula
            out_of.append(f"{f.n_ctx}/{f.type_k if f.type_k == f.type_v else f.type_k + '/' + f.type_v}")
    if out_of:
        out.process_notes.append(f"does not fit this machine now ({size(avail.bytes)} available, {avail.source}; "
                                 f"predicted peak + margin): {', '.join(out_of)}")


def _remeasure_command(llama_bench: str | None) -> str:
    """The command that measures predict's speed calibration again."""
    return f"edgekv calibrate --llama-bench {llama_bench}" if llama_bench else "edgekv calibrate"


def _calibrating_line(llama_bench: str | None, deadline: float | None):
    """A progress callback for predict --speed: on stderr, what the calibration measures and the time left before
    its deadline (a line when the step changes, at most every 10 s)."""
    via, again = f" through {llama_bench}" if llama_bench else "", _remeasure_command(llama_bench)
    last = [0.0]

    def progress(step: str) -> None:
        now = time.monotonic()
        if last[0] and now - last[0] < 10:
            return
        if not last[0]:
            sys.stderr.write(f"edgekv: calibrating this machine's speed{via} (once per environment and thread count; "
                             f"'{again}' re-measures) ...\n")
        left = f", {max(0.0, deadline - now):.0f} s left" if deadline is not None else ""
        sys.stderr.write(f"edgekv: calibrating: {step}{left}\n")
        last[0] = now

    return progress


def _waiting_line() -> None:
    sys.stderr.write("edgekv: another edgekv process is measuring this machine's speed: waiting for its result\n")


def resolve_repack(req: PredictRequest, asked: bool | None) -> list[str]:
    """Set ``req.process.use_extra_bufts`` from the one repack choice (edgekv.calibration.preflight.repack_choice):
    ``asked`` (--repack) when given, else llama.cpp's default unless this environment's extra-buffer preflight saw
    those kernels kill its probe.  The preflight is probed once per environment (a few seconds, cached) when the
    choice needs it; --kv-only probes nothing.  Returns the notes that say what was chosen and why."""
    choice = repack_choice(None if asked is None else [asked], req.llama_bench,
                           probe=not (req.kv_only or asked is not None))
    req.process.use_extra_bufts = choice.values[0]
    return choice.predict_notes()


def speed_depth(n_ctx: int, req: PredictRequest) -> int:
    """The depth a row's speed is predicted at: -d, else the context minus the prompt (the cache full at the end
    of the test, as bench fills it)."""
    if req.depth is not None:
        return min(req.depth, max(0, n_ctx - 1))
    return max(0, n_ctx - max(req.n_prompt, req.n_gen))


def _speeds(out: PredictOutcome, m: LoadedModel, req: PredictRequest,
            known: dict[tuple[str, str], dict[str, int]] | None = None) -> None:
    """``prediction.speed`` in every record (edgekv.core.speed): pp and tg at the row's depth with this machine's
    calibration (measured now when absent: a progress line on stderr), or the reason there is none.  ``known``: the
    graph sizes per K/V pair the whole-process prediction's dry run already gave."""
    def none(why: str) -> None:
        for r in out.records:
            r.prediction.speed = SpeedPrediction(calibration_id=None, error=why)
        out.process_notes.append(f"no speed prediction: {why}")

    if req.kv_only:
        return none("--kv-only (the speed model needs llama.cpp's graph size from its dry run)")
    if not m.header.tensors:
        return none("the file has no tensor table (the speed model reads the weights a token touches from it)")
    device, why = offload_device(req.n_gpu_layers, m.shape.n_layer, _offload_device(out))
    if why:
        return none(why)
    ok = [r for r in out.records if r.prediction.formula.status == STATUS_OK]
    if not ok:
        return
    graphs = _graphs(m, req, sorted({(r.prediction.formula.type_k, r.prediction.formula.type_v) for r in ok}), known)
    if not graphs:
        return none("llama.cpp's dry run did not give its graph size for this model")
    p = req.process

    threads = p.n_threads or default_threads()
    xs = []
    for r in ok:
        f = r.prediction.formula
        xs.append(SpeedInputs(threads, req.n_prompt, req.n_gen, speed_depth(f.n_ctx, req), req.base.n_batch,
                              req.base.n_ubatch, f.type_k, f.type_v, req.base.flash_attn, p.use_extra_bufts,
                              device=device, swa_cells=swa_cells_of(f)))
    feats = runtime_baseline().cpu_features
    base, cal, _note, blocks = predict_speeds(m, feats, p.use_extra_bufts, device, next(iter(graphs.values())),
                                              [(x, graphs.get((x.type_k, x.type_v))) for x in xs],
                                              lambda sh, ys: _calibration(out, sh, ys, feats, req))
    for r, block in zip(ok, blocks):
        r.prediction.speed = block
    if cal is not None:
        out.speed_model = ({pair: with_graph(base, g) for pair, g in graphs.items()}, cal, threads)


def _calibration(out: PredictOutcome, sh: Any, xs: list[Any], feats: list[str], req: PredictRequest) -> tuple[Any, str]:
    """This machine's calibration for ``xs``: what is cached, or with --speed measured now within its deadline; the
    notes say why there is none, or what the calibration did."""
    deadline = time.monotonic() + req.calibration_timeout_s if req.measure_speed else None
    cal, note = calibration_for(sh, xs, feats, progress=_calibrating_line(req.llama_bench, deadline),
                                allow_busy=True, llama_bench=req.llama_bench, measure=req.measure_speed,
                                deadline=deadline, on_wait=_waiting_line)
    if cal is None:
        out.process_notes.append(f"no speed prediction: {note}")
    elif note:
        out.process_notes.append(f"speed calibration: {note}")
    if cal is not None and cal.notes:
        out.process_notes.append("speed calibration: " + "; ".join(cal.notes) + " (re-measure on a quiet machine: "
                                 f"'{_remeasure_command(req.llama_bench)}')")
    return cal, note


class _MinTg:
    """--min-tg for the budget search: predicted decode tokens/s at a context's full depth (the context minus -n)."""

    def __init__(self, floor: float, speed_model: Any, req: PredictRequest, shape: Any = None):
        self.floor, self.model, self.req, self.shape = floor, speed_model, req, shape

    def __call__(self, type_k: str, type_v: str, n_ctx: int) -> float | None:
        if self.model is None:
            return None
        shapes, cal, _threads = self.model
        sh = shapes.get((type_k, type_v))
        if sh is None:            # no dry run of this K/V pair: its graph size is unknown
            return None
        b = self.req.base
        # the sliding-window cache of this context (its cells decide how a decoded token's threads split it)
        swa = (swa_cells_of(predict(self.shape, replace(b, n_ctx=n_ctx, type_k=type_k, type_v=type_v)))
               if self.shape is not None and self.shape.n_swa else 0)
        try:
            return predict_tg(sh, cal, max(0, n_ctx - self.req.n_gen), self.req.n_gen, type_k, type_v,
                              b.flash_attn, 1, swa, b.n_batch, b.n_ubatch).tokens_per_s
        except MissingCalibration:
            return None


def _offload_device(out: PredictOutcome) -> str | None:
    """The GPU device the process predictions put bytes on (llama.cpp's name, e.g. CUDA0), None when none."""
    for r in out.records:
        proc = r.prediction.process
        if proc is not UNSET and proc is not None and proc.device_bytes not in (UNSET, None) and proc.device_bytes:
            return next(iter(proc.device_bytes))
    return None


def _graphs(m: LoadedModel, req: PredictRequest, pairs: list[tuple[str, str]],
            known: dict[tuple[str, str], dict[str, int]] | None = None) -> dict[tuple[str, str], dict[str, int]]:
    """llama.cpp's graph size (nodes of the prompt and one-token graphs) for this model per K/V type pair: a
    quantized cache adds nodes of its own (SmolLM2: 936 with f16, 1296 with q8_0, q5_0 or q4_0).  The pairs ``known``
    lacks (the whole-process prediction's dry run holds every pair it ran) from one dry-run session of their own."""
    got = {p: g for p, g in (known or {}).items() if p in pairs}
    todo = [p for p in pairs if p not in got]
    if not todo:
        return got
    cs = [replace(req.base, n_ctx=min(req.base.n_ctx or 4096, 4096), type_k=tk, type_v=tv) for tk, tv in todo]
    try:
        with EngineSession(m.ref.path, n_gpu_layers=req.n_gpu_layers, header=m.header,
                           use_extra_bufts=req.process.use_extra_bufts) as eng:
            res = eng.run(cs)
    except EngineError:
        return got
    return {**got, **{p: r.log.graph for p, r in zip(todo, res) if r.ok and r.log.graph}}


def run_predict(m: LoadedModel, req: PredictRequest, repack: bool | None = True) -> PredictOutcome:
    """Compute everything ``edgekv predict`` prints: formula records (and llama.cpp's dry run), the
    whole-process prediction, the budget table, and the notes the view adds under the table."""
    # --engine runs on a header-only file too (llama.cpp's dry run reads no tensor data: edgekv.runtime.engine
    # loadable_path gives it a sparse stand-in; the shape headers of the predicted reports rely on it): warned, not refused
    processes, notes = None, []
    repack_notes = resolve_repack(req, repack)
    seen: dict[str, Any] = {}
    if not req.kv_only:
        # --llama-bench: the process of that binary's build (its own runtime baseline), like bench --llama-bench
        processes, notes = process_blocks(m, req.configs, req.process, seen=seen,
                                          baseline=binary_baseline(req.llama_bench) if req.llama_bench else None)
    notes = ([m.incomplete] if m.incomplete else []) + notes
    out = PredictOutcome(predict_records(m, req.configs, engine=req.engine, n_gpu_layers=req.n_gpu_layers,
                                         with_layers=req.with_layers_json, processes=processes), notes)
    if m.incomplete:                    # the --json records say it too
        for r in out.records:
            r.model.incomplete = m.incomplete
    if not req.process.use_extra_bufts:     # --repack 0 (asked, or the preflight's): the records say it, as bench's
        for r in out.records:
            r.settings.repack = False
    _command_lines(out, m, req)
    out.process_notes.extend(repack_notes)
    if processes is not None:
        _fit_marks(out)
    if req.speed:
        _speeds(out, m, req, seen.get("graphs"))
    if req.engine and m.header.tensors:
        out.extra_buffers = extra_buffer_check(m, runtime_baseline().cpu_features, req.process.use_extra_bufts)
        out.process_notes.append(extra_buffer_line(out.extra_buffers))
    if req.budget_bytes is not None:
        p = req.process
        floor = _MinTg(req.min_tg, out.speed_model, req, m.shape) if req.min_tg is not None else None
        out.budget = budget_table(m, req.base, req.pairs, req.budget_bytes, n_gpu_layers=req.n_gpu_layers, min_tg=floor,
                                  workload=p.workload, n_threads=p.n_threads, use_mmap=p.use_mmap,
                                  use_extra_bufts=p.use_extra_bufts)
    if req.device == "metal" and req.device_memory:
        out.device_fit = metal_rows(out.records, req.device_memory)
        out.process_notes.extend(metal_lines(out.device_fit))
    out.defaults_cost = _defaults_cost(m, req.base, out.records)
    if req.layers:
        first = next((r.prediction.formula for r in out.records if r.prediction.formula.status == STATUS_OK), None)
        if first:
            out.layer_params = replace(req.base, n_ctx=first.n_ctx, type_k=first.type_k, type_v=first.type_v)
            out.layer_prediction = predict(m.shape, out.layer_params)
    return out
