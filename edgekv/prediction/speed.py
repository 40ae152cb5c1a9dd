"""Speed predictions for a model: gathers the inputs of :mod:`edgekv.core.speed` from their edges (the header's
tensor table, llama.cpp's graph size from its dry run, the CPU features, this machine's calibration) and returns
the ``prediction.speed`` block a record carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from edgekv.calibration.lock import LockTimeout, measuring
from edgekv.calibration.speedcal import SPEED_CALIBRATE_ENV, CalibrationError, auto_measure, calibrate
from edgekv.core.predict import ContextParams
from edgekv.core.speed import Calibration, MissingCalibration, SpeedShape, explain, predict_pp, predict_tg, run_nodes, speed_shape
from edgekv.core.speedbounds import blamed_terms, drop_terms, roofline_miss
from edgekv.errors import EngineError
from edgekv.prediction.wholeprocess import gpu_device_of
from edgekv.records.schema import Record, Settings, SpeedPrediction, SpeedResidual
from edgekv.runtime.engine import EngineSession

UNIFIED_NOT_PREDICTED = ("no speed prediction for -npl with --kv-unified: every token's attention runs over all "
                         "sequences' cells of the shared buffer, which the speed model does not describe yet")


def _expert_counts(meta: dict[str, Any], arch: str) -> tuple[int, int]:
    def num(k: str) -> int:
        v = meta.get(f"{arch}.{k}")
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    return num("expert_used_count"), num("expert_count")


def model_speed_shape(m, cpu_features: list[str], repack: bool, graph: dict[str, int] | None,
                      device: str = "") -> SpeedShape:
    """The speed shape of a loaded model (edgekv.prediction.api.LoadedModel); ``device``: every layer offloaded
    to that GPU, so no matrix sits in a CPU extra buffer."""
    used, count = _expert_counts(m.header.metadata or {}, m.shape.arch)
    feats, rp = ([], False) if device else (cpu_features, repack)
    return speed_shape(m.shape, list(m.header.tensors), feats, rp, graph, used, count)


def with_graph(sh: SpeedShape, graph: dict[str, int] | None) -> SpeedShape:
    """``sh`` with llama.cpp's graph size of one configuration (its own dry run: a quantized cache adds nodes)."""
    if not graph:
        return sh

    tg, pp = run_nodes(graph)
    return replace(sh, nodes_tg=tg, nodes_pp=pp)


def offload_device(n_gpu_layers: int, n_layer: int, device: str | None) -> tuple[str, str | None]:
    """(the ggml device a speed prediction is calibrated on, or "" for the CPU; the reason there is none).  The
    speed model describes one device running every layer: the CPU (nothing offloaded, or a build without a GPU
    backend) or a GPU holding every layer (-ngl -1, or at least the layers plus the output); a partial offload
    (the layers split between the CPU and the GPU, with the transfers between them) is not predicted."""
    if not device or n_gpu_layers == 0:
        return "", None
    if n_gpu_layers < 0 or n_gpu_layers >= n_layer + 1:
        return device, None
    return device, (f"-ngl {n_gpu_layers} offloads part of the model's {n_layer} layers to {device}: the speed model "
                    "describes every layer on one device (-ngl 0 or -ngl -1), not a split")


def weight_types(sh: SpeedShape) -> list[str]:
    return sorted({g.key.split("+")[0] for g in sh.groups})


def main_weight_type(sh: SpeedShape) -> str | None:
    """The weight type of most of the bytes a decoded token reads (the calibration's drift sentinel)."""
    by: dict[str, float] = {}
    for g in sh.groups:
        by[g.key.split("+")[0]] = by.get(g.key.split("+")[0], 0.0) + g.bytes
    return max(by, key=by.__getitem__) if by else None


def dry_run_device(m, n_gpu_layers: int) -> str | None:
    """The GPU llama.cpp puts a model's buffers on with ``n_gpu_layers`` (one dry run: no weights read), None on a
    build without a GPU backend or when the dry run fails."""
    if n_gpu_layers == 0:
        return None
    try:
        with EngineSession(m.ref.path, n_gpu_layers=n_gpu_layers, header=m.header) as eng:
            (r,) = eng.run([ContextParams(n_ctx=512)])
    except EngineError:
        return None
    return gpu_device_of(r.log.compute_buffers) if r.ok else None


@dataclass
class SpeedInputs:
    """What a sweep or predict asks the speed model (one configuration's settings)."""

    n_threads: int
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    flash_attn: str
    repack: bool = True
    n_parallel: int = 0         # -npl N: N prompts from an empty cache, then N sequences decoding together
    kv_unified: bool = False
    device: str = ""            # every layer offloaded to this ggml device (CUDA0, ...); "" = the CPU
    swa_cells: int = 0          # cells per stream of the sliding-window cache (the formula's), 0: none

    @classmethod
    def from_settings(cls, s: Settings) -> SpeedInputs:
        return cls(int(s.n_threads), int(s.n_prompt or 0), int(s.n_gen or 0), int(s.n_depth or 0),
                   int(s.n_batch or 2048), int(s.n_ubatch or 512), s.type_k, s.type_v,
                   str(s.flash_attn or "auto"), s.repack is not False, int(s.n_parallel or 0), bool(s.kv_unified))


def swa_cells_of(formula: Any) -> int:
    """Cells per stream of a formula prediction's sliding-window cache (llama_kv_cache_iswa's size_swa; a
    KVPrediction's or a record's caches), 0 when it has none."""
    for c in getattr(formula, "caches", None) or ():
        if getattr(c, "kind", None) == "swa" and isinstance(getattr(c, "cells", None), int):
            return int(c.cells)
    return 0


def speed_block(sh: SpeedShape, cal: Calibration | None, x: SpeedInputs, why_none: str | None = None) -> SpeedPrediction:
    """``prediction.speed`` for one configuration: pp and tg at its depth, or the reason there is none."""
    if cal is None:
        return SpeedPrediction(calibration_id=None, error=why_none or "no speed calibration")
    if x.n_parallel > 1 and x.kv_unified:
        return SpeedPrediction(calibration_id=cal.id, error=UNIFIED_NOT_PREDICTED)
    # -npl: every sequence's prompt from an empty cache, its decode from the end of its prompt (llama-batched-bench)
    n_seq = max(1, x.n_parallel)
    pp_depth, tg_depth = (0, x.n_prompt) if x.n_parallel else (x.n_depth, x.n_depth)
    try:
        out = SpeedPrediction(calibration_id=cal.id)
        if cal.machine:
            out.machine = cal.machine
        out.calibrated_with = cal.runtime
        if cal.busy:
            out.calibration_busy = True
        if x.n_prompt > 0:
            out.pp = predict_pp(sh, cal, pp_depth, x.n_prompt, x.n_batch, x.n_ubatch, x.type_k, x.type_v,
                                x.flash_attn, n_seq)
        if x.n_gen > 0:
            tg = predict_tg(sh, cal, tg_depth, x.n_gen, x.type_k, x.type_v, x.flash_attn, n_seq, x.swa_cells,
                            x.n_batch, x.n_ubatch)

            far = roofline_miss(sh, [(q.name, q.s_per_token) for q in tg.parts], cal.bandwidth_bytes_s)
            if far:
                return SpeedPrediction(calibration_id=cal.id, error=f"withheld: {far}")
            out.tg = tg
            out.explain = explain(tg)
        return out
    except MissingCalibration as e:
        return SpeedPrediction(calibration_id=cal.id, error=str(e))


def predict_speeds(m, cpu_features: list[str], repack: bool, device: str, graph: dict[str, int] | None,
                   runs: list[tuple[SpeedInputs, dict[str, int] | None]],
                   calibration: Callable[[SpeedShape, list[SpeedInputs]], tuple[Calibration | None, str]],
                   ) -> tuple[SpeedShape, Calibration | None, str, list[SpeedPrediction]]:
    """The speed model over configurations of one thread count, --repack and device, for predict and the sweep:
    (the model's speed shape with llama.cpp's graph size ``graph``; this machine's calibration for them and its note,
    from ``calibration``; each run's ``prediction.speed``).  A run's own graph size, when it has one, replaces
    ``graph`` (a quantized cache adds nodes: SmolLM2 936 with f16, 1296 with q8_0)."""
    sh = model_speed_shape(m, cpu_features, repack, graph, device)
    cal, note = calibration(sh, [x for x, _ in runs])
    return sh, cal, note, [speed_block(with_graph(sh, g), cal, x, note) for x, g in runs]


def roofline_blame(sh: SpeedShape, cal: Calibration, xs: list[SpeedInputs]) -> dict[str, str]:
    """The terms of the largest part of each decode prediction of ``xs`` that lies far below its roofline
    (edgekv.core.speedbounds.roofline_miss), each with why; {} when every one is plausible or none is predicted."""
    out: dict[str, str] = {}
    for x in xs:
        if x.n_gen <= 0 or (x.n_parallel > 1 and x.kv_unified):
            continue
        try:
            tg = predict_tg(sh, cal, x.n_prompt if x.n_parallel else x.n_depth, x.n_gen, x.type_k, x.type_v,
                            x.flash_attn, max(1, x.n_parallel), x.swa_cells, x.n_batch, x.n_ubatch)
        except MissingCalibration:
            continue
        parts = [(p.name, p.s_per_token) for p in tg.parts]
        why = roofline_miss(sh, parts, cal.bandwidth_bytes_s)
        if why:
            for t in blamed_terms(parts, sh):
                out.setdefault(t, why)
    return out


def residual(rec: Record) -> SpeedResidual | None:
    """``speed_residual``: measured - predicted tokens/s, % of predicted, per test."""
    pred = rec.prediction.speed if rec.prediction else None
    meas = rec.speed or None
    out: dict[str, float | None] = {}
    for t in ("pp", "tg"):
        p = getattr(pred, t) if pred else None
        m = getattr(meas, t) if meas else None
        p, m = p.tokens_per_s if p else None, m.mean_ts if m else None
        out[f"{t}_pct"] = round(100.0 * (m - p) / p, 2) if p and m else None
    return SpeedResidual(**out) if any(v is not None for v in out.values()) else None


SPEED_LOCK = "speed-calibration"      # one measurer of this machine's speed at a time (edgekv.calibration.lock)


def calibration_for(sh: SpeedShape, xs: list[SpeedInputs], cpu_features: list[str], progress=None,
                    allow_busy: bool = False, llama_bench: str | None = None, measure: bool = True,
                    deadline: float | None = None, on_wait=None) -> tuple[Calibration | None, str]:
    """This machine's calibration with everything the configurations ``xs`` need, through llama-cpp-python or
    (``llama_bench``) the user's llama-bench; (None, why) when it cannot be had.  ``measure`` False: only what is
    cached (predict without --speed).  Measuring holds the calibration lock (another edgekv process measuring is
    waited for, ``on_wait`` said once) and stops at ``deadline`` (a ``time.monotonic()`` time)."""
    if not xs:
        return None, "nothing to predict"
    threads = {x.n_threads for x in xs}
    repacks = {x.repack for x in xs}
    devices = {x.device for x in xs}
    if len(threads) > 1 or len(repacks) > 1 or len(devices) > 1:
        # one calibration per (threads, repack, device); the sweep calls this per group
        raise ValueError("calibration_for: one thread count, --repack setting and device at a time")
    pairs = sorted({(x.type_k, x.type_v, x.flash_attn) for x in xs})
    geometries = sorted({lay.geometry for lay in sh.attn})

    def run(measuring_now: bool, **kw: Any):
        return calibrate(next(iter(threads)), next(iter(repacks)), weight_types(sh), pairs, cpu_features,
                         progress=progress, allow_busy=allow_busy, geometries=geometries, measure=measuring_now,
                         llama_bench=llama_bench, device=next(iter(devices)), bodies=[sh.body] if sh.body else [],
                         sentinel=main_weight_type(sh), **kw)

    try:
        auto = auto_measure()           # the variable is checked even when predict measures nothing
    except CalibrationError as e:
        return None, str(e)
    try:
        if not measure or not auto:
            try:
                sc = run(False)
            except CalibrationError as e:
                how = (f"{SPEED_CALIBRATE_ENV}=cached" if measure else
                       "'edgekv calibrate' measures it in about a minute, or add --speed")
                return None, f"{e} ({how})"
        else:
            with measuring(SPEED_LOCK, deadline, on_wait):
                sc = run(True, deadline=deadline)
                blamed = roofline_blame(sh, sc.cal, xs)
                if blamed:      # a decode far below its roofline: its largest part's terms measured once more
                    sc = run(True, deadline=deadline, forget=blamed)
                    still = roofline_blame(sh, sc.cal, xs)
                    if still:   # and then dropped: the predictions that need them are withheld with the reason

                        drop_terms(sc.cal, still)
                    sc.note = "; ".join(x for x in (sc.note, f"{', '.join(blamed)} measured again: a decode far "
                                                    "below its roofline" + (", still: dropped" if still else ""))
                                        if x)
    except LockTimeout as e:
        return None, f"{e}: no speed predictions"
    except CalibrationError as e:
        return None, str(e)
    except (OSError, ValueError) as e:
        return None, f"the speed calibration failed: {e}"
    return sc.cal, sc.note
