"""The speed calibration: this machine's coefficients for :mod:`edgekv.core.speed`, measured through the llama.cpp
edgekv drives (llama-cpp-python in one child process, or the user's own llama-bench: edgekv.orchestration.lbprobe),
cached under ``EDGEKV_HOME/calibration/`` keyed by the environment fingerprint (for llama-bench: that binary), the
thread count and the ``--repack`` setting, re-measured when any of them changes.

What it measures, each on models edgekv writes itself (:func:`edgekv.edges.tinymodel.plan_model`; nothing
of the user's model is needed), whose weights are values like a trained model's, not zeros: on x86 llama.cpp's
kernels convert every block's fp16 scales through a lookup table, and a model of zeros decoded SmolLM2's shape
about 20 % faster than SmolLM2 itself (:func:`edgekv.edges.tinymodel.fill_values`):

* the fixed cost of a graph node: decode and a 512-token prompt on two narrow models (n_embd 64) of 2 and 34
  layers; the time difference over llama.cpp's own node-count difference (its ``graph: nodes = ...`` line);
* per K/V cache type pair and flash-attention setting, the attention cost per head x head dim x cell: decode at
  depths 640 and 1664 and a 256-token prompt at depths 0 and 1024, shallow-deep-shallow (:func:`attn_plan`), on
  a 12-layer model with 8 query and 2 KV heads, and on 6 layers of each model's own head geometry (a wide
  geometry over shallower differences of the same work: :func:`attn_steps`);
* per weight type (as the CPU backend holds it: repacked or not, the rules of core/memmodel), the mat-vec cost
  per byte (decode) and the mat-mat cost per byte streamed and per FLOP (prompts of 256 and 32 tokens) on a
  model of 24-64 MB of matrices of that type; on the CPU also the mat-vec's cost per row and the mat-mat's per dot
  product, from the decode and the same prompts of a second model of about the same bytes in rows half as long
  (:data:`NARROW_WIDTHS`), and the rate llama.cpp
  streams the type from memory, from the decode of a third of STREAM_TARGET_BYTES (far larger than the caches);
* the machine's read bandwidth, independently (:func:`edgekv.edges.bandwidth.read_bandwidth`), for the roofline.

Types a model needs and the calibration lacks are measured on demand (a few seconds each), never guessed.  A
calibration taken while other work used the CPUs is refused (not cached), and says so.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from edgekv.core.speed import (
    GEOMETRY_MAX_EMBD,
    NODE_PP_TOKENS,
    SPEED_MODEL_VERSION,
    TILED_DEEP_DEPTHS,
    TILED_SHALLOW_END,
    Calibration,
    kv_key,
    prompt_attn_coef,
    prompt_node_s,
    row_loop_path,
    tile_factor,
    tiled_prompt_path,
    weight_key,
)
from edgekv.orchestration.calibrate import fingerprint, fingerprint_key, store_path, write_json

CAL_VERSION = 20          # 2: wide attention geometries over a hidden size of at most GEOMETRY_MAX_EMBD; 3: a few columns;
# 4: the cost of a token and of a ubatch outside the graph's nodes; 5: each attention difference's depths timed in turn;
# 6: a node is one a backend runs (the scheduler's listing), not a view; 7: the CPU mat-vec's cost per row and
# streaming rate; 8: models of values like a trained model's, not zeros (edgekv.edges.tinymodel.fill_values);
# 9: the CPU mat-mat's cost per dot product (the narrow weight model's prompts); 10: the streaming rate's cost per
# row (a narrow 384 MB model beside the wide one); 11: the prompts' coefficients are the matrices' less the last
# layer's feed-forward, which llama.cpp computes for the last token only (WeightGroup.tail_*); 12: an F16/F32
# cache's prompt attention under FA_TILE_Q tokens (llama.cpp's per-row loop, not its tiled kernel: attn_pp_rows_s);
# 13: the tiled kernel's cost per cell deep in the cache (attn_pp_deep_s, a one-layer model of each geometry);
# 14: a few-column ubatch's cost per row beside its bytes (matcols_s_per_row, the narrow weight model's 2- and
# 4-token prompts); 15: a prompt ubatch's node cost at NODE_PP_TOKENS[0] tokens beside NODE_PP_TOKENS[1]
# (node_pp_short_s: the narrow models' short prompts); 16: each geometry's calibration model has the model's own
# hidden size (up to GEOMETRY_MAX_EMBD = 8192, was 1024), named in the geometry where it is not n_head x head_k;
# 17: every calibration model's weights centred and of RMS edgekv.edges.tinymodel.weight_rms (a trained model's size
# at its width, whatever the type; SPEED_MODELS_VERSION 3): the attention's cost per cell no longer depends on the
# width or the weight type through a softmax that underflows; 18: each geometry's decode attention timed with the
# CPU's caches evicted between tokens (evict_shape) and, without flash attention, over the whole padded view;
# 19: the tiled kernel's share of cost per query tile, whatever rows it holds (attn_pp_tile_share: PT_N-token prompts);
# 20: a geometry's model at most GEOMETRY_MAX_EMBD = 4096 wide and at most GEOMETRY_LAYERS x WIDE_LAYER_UNITS of
# attention work per cell, 4x the generic model's (fewer layers for the widest heads)
# 12 layers: enough K/V at depth that the cache is read the way a real model's is (a 2-layer model's cache sits in
# L2 and its attention runs up to 2x faster per cell than SmolLM2's); narrow matrices so the fill stays quick
ATTN_SHAPE = {"n_embd": 512, "n_ff": 256, "n_layer": 12, "n_head": 8, "n_head_kv": 2, "mat_type": "Q8_0"}
NODE_SHAPES = {"nodes_a": {"n_embd": 64, "n_ff": 128, "n_layer": 2, "n_head": 2, "n_head_kv": 2, "mat_type": "Q8_0"},
               "nodes_b": {"n_embd": 64, "n_ff": 128, "n_layer": 34, "n_head": 2, "n_head_kv": 2, "mat_type": "Q8_0"}}
ATTN_TG_DEPTHS = (640, 1664)   # both in the split-KV regime of an f16 cache (a view of 512 cells or more)
ATTN_PP_DEPTHS = (0, TILED_SHALLOW_END)
# the tiled kernel deep in the cache (F16/F32 pairs on the CPU): a 512-token prompt (llama.cpp's default ubatch) at
# TILED_DEEP_DEPTHS on a one-layer model of the geometry (the cost per cell there is a layer's own; one layer keeps
# the fill to 8192 cells at a few seconds, 15-20 for Qwen3 8B's 32 x 128 heads); five runs at each depth: on the
# 2-vCPU VM one depth's three runs came out 150 or 200 ms together from one minute to the next (bench/README.md)
DEEP_PP_N = 512
DEEP_LAYERS = 1
DEEP_REPS = 5
# a layer of Qwen3 8B's 32 x (128 + 128) heads: 8192 units of attention work a cell, the most a layer does in a
# calibration that keeps its full form.  A geometry whose layer does more takes fewer layers in its model
# (geometry_shape) and fewer deep runs (at least 3), each of them that much longer: the same timed work (Qwen2.5 72B's
# 64 x 128 heads: 3 layers, and 3 deep runs of twice the 8B's)
WIDE_LAYER_UNITS = 32 * 2 * 128
ATTN_PP_N = 256
PP_ROWS_N = 32            # a prompt under edgekv.core.speed.FA_TILE_Q tokens: an F16/F32 cache's per-row loop
# A pair whose prompts run llama.cpp's per-query-row flash-attention loop at every size (a quantized or mixed cache on
# the CPU, row_loop_path) costs the same per row and cell from 32 to 256 tokens (six layers of SmolLM2's heads between
# depths 0 and 1024: q8_0 143-146 ps, q5_0 382-390, q4_0 245-248, bench/prompt_tiles.py --type), so its prompt
# steps are ROW_LOOP_PP_N tokens, a quarter of ATTN_PP_N's time; its decode steps start at depth ROW_LOOP_TG_START,
# not ATTN_TG_DEPTHS[0] (they have no split-KV regime to reach): filling a cache runs that same loop over every cell
# before it (q5_0 filling 640 and 1664 cells took about 4 of its 9 s), and the same 1024 cells from 128 cost the same
# per cell (q5_0 409-437 ps from 128, 424-431 from 640; q4_0 285-288 and 276-281, bench/attn_layers.py).  Its
# prompts stay on the geometry's own model over ATTN_PP_DEPTHS: run after the decode steps on the evicting model,
# over their fill, they came out 10 % cheaper a cell on one thread (Gemma 3's heads, q4_0: 373 against 412-413 ps
# on its own model at either depth range) and predicted that prefill 15 % too fast (bench/README.md)
ROW_LOOP_PP_N = 64
ROW_LOOP_TG_START = 128
# a prompt of one and a half query tiles a head: every head's second tile is short (more so where llama.cpp's chunks
# cut it), beside ATTN_PP_N's on the same depths the tiled kernel's cost per tile separates from its cost per row
PT_N = 96
# a geometry's model: six layers, fewer where six would do more attention work per cell than six of WIDE_LAYER_UNITS
# (4x the generic model's): its decode steps cannot shrink below a 256-cell difference (attn_steps), so more work a
# cell is more time, not more signal (Qwen2.5 72B's 64 x 128 heads: three layers, Bonsai 8B's 32 x 128 keep six)
GEOMETRY_LAYERS = 6
TG_N = 32                 # generated tokens per timed decode run (5 runs per attention step, the median kept)
PP_SHORT_N, PP_N = NODE_PP_TOKENS
MM_N = (256, 32)
# their runs (after one warm-up): a prompt of 256 tokens over 48 MB of weights is compute-bound and repeats within
# 1 % (the 2-vCPU Xeon VM: 333.0, 333.1, 331.5 ms), so two runs where three were (bench/README.md, calibration time)
MM_REPS = 2
# the weight models' decodes: 11 runs each (a run of 32 tokens takes 0.1-0.2 s).  The mat-vec's cost per row is solved
# from the narrow and the wide model's decodes, which differ by about 20 %; with 5 runs, their runs spreading +-7 % on
# the 2-vCPU VM, eight calibrations within six minutes gave SmolLM2's q4_1 3.7-11.7 ns a row (bench/README.md)
WEIGHT_TG_REPS = 11
MM_COLS = (2, 4)          # a ubatch of a few columns: -npl sequences decoding together (one timed graph per run)
MM_COLS_REPS = 9
WEIGHT_TARGET_BYTES = 48 * 1024 * 1024
# the CPU mat-vec's cost per row: a second weight model of each type, of about the same bytes in rows of 512 elements
# (the wide model's are 1024 and 4096): twice the rows per byte.  On two threads of a 2-vCPU EPYC VM a q4_1 model of
# SmolLM2's widths (576/1536) decoded at 12.6 GB/s where the wide model ran at 18.7, and bytes + rows fitted seven
# widths from 512 to 4096 within 8 % where bytes alone missed by up to 42 % (bench/README.md, the speed model)
NARROW_WIDTHS = {"n_embd": 512, "n_ff": 2048, "n_head": 8}
# and the rate it streams a type from memory: the wide widths, about 8x a large L3 (a 48 MB model sits partly in a
# 32 MiB L3: its repacked q4_K decoded at 100 GB/s of kernel work, while an 8B model of it streamed 28 GB/s,
# bench/README.md); 4 runs of 8 tokens, no warm-up (reading 384 MB takes 10-40 ms a token on two cores: on the 2-vCPU
# Xeon VM, 8-token runs of the three large models spread as 16-token ones did, +-3 %, the first no slower than the rest
# (its pages were written a moment before; repacked types are copied at load), and a type's three took 7 of the 9.6 s
# its large models cost a calibration with a warm-up and 3 runs of 16 tokens: bench/README.md, calibration time)
STREAM_TARGET_BYTES = 384 * 1024 * 1024
STREAM_N = 8
STREAM_REPS = 4
# and its cost per row while it streams: a narrow 384 MB model of rows of 512 (and ffn_down's of 8192, so that 384 MB
# takes 30-50 layers, not 130-160 of NARROW_WIDTHS' small layers).  On two threads of the 2-vCPU EPYC VM, 384 MB of
# q5_0 at eight widths fitted bytes + rows within 4.6 % at 26.5 GB/s + 13.0 ns a row, where the 48 MB models' fit
# had 10.0 ns: Gemma 3's 68 MB body (rows of 640) decoded 25 % slower than the 48 MB coefficients priced it
# (bench/README.md, the speed model)
STREAM_NARROW_WIDTHS = {"n_embd": 512, "n_ff": 8192, "n_head": 8}
# and a third of an 8B model's widths (a few layers of large matrices): both 384 MB models above run hundreds of
# small matrices, and bytes + rows solved from those two alone priced the large matrices too slowly.  On two threads
# of the 2-vCPU EPYC VM, Q4_K llamas of about 384 MB decoded at 32-35 GB/s of matrices at n_embd 1024 (287
# matrices) and 48-50 GB/s at 4096/12288 (28 matrices); an 8B llama of Qwen3's widths (4.26 GB of Q4_K) at depth 0
# took 86 ms a token against 106 priced from the two small-matrix models (-19 %); bytes + rows fitted by least
# squares over four such models (1024/4096, 2048/8192, 4096/12288, 512/8192) came within 7 % of each and priced
# the 8B's weights at about 87 ms (bench/README.md, round 24)
STREAM_BIG_WIDTHS = {"n_embd": 4096, "n_ff": 12288, "n_head": 32}
# A GPU calibration (every layer offloaded): a GPU reads 48 MB in microseconds, less than the graph's own launches, so
# its weight models are wide and about 1 GiB (the bytes then dominate a token), and its attention differences span
# 15K cells (a tiny model's cache at 1K cells is read in a microsecond); filling 16K cells takes a GPU well under a
# second
DEVICE_WEIGHT_TARGET_BYTES = 1024 * 1024 * 1024
DEVICE_ATTN_TG_DEPTHS = (1024, 16384)
DEVICE_ATTN_PP_DEPTHS = (0, 8192)
# a GPU returns every decoded token's logits to the host: a narrow model with Gemma 3's vocabulary beside nodes_a
VOCAB_SHAPE = {**NODE_SHAPES["nodes_a"], "n_vocab": 262144}
BODY_PP_N = 512
# a cached calibration is checked against the machine as it is now: the decode of its own weight model of the model's
# main weight type, timed again (a second or two); when that takes DRIFT_LIMIT more or less time than it did, the
# machine has changed under it (a 2-vCPU VM measured its q4_1 decode 0.71x and its q8_0 prompt 1.05x the time of
# four hours before, bench/README.md) and everything is measured again
DRIFT_LIMIT = 0.20
# ... at most once in this many seconds: a calibration measured, or last found to hold, that recently (its
# -verified.json beside it) is used as it is.  The sentinel's decode takes 1.1-1.6 s, the largest share of a cached
# `edgekv predict`'s speed work; the VM of bench/README.md drifted over tens of minutes, not seconds.
DRIFT_RECHECK_S = 300.0
# A real model's weights (tens of MB and more) stream through the CPU's caches between one token's read of a layer's
# K/V and the next token's, so its decode reads the cache from memory; the geometry models' narrow matrices would
# leave their K/V in the last-level cache.  On the CPU a geometry's decode steps therefore run on a copy of its model
# whose output head is EVICT_FACTOR x that cache (the OS's figure, edgekv.edges.environment.last_level_cache_bytes;
# EVICT_DEFAULT_BYTES where it gives none, at most EVICT_MAX_BYTES), read once a token after the last layer.  On the
# 2-vCPU EPYC VM (32 MiB L3), six layers of SmolLM2's heads with a 40 MB head cost 63-65 ps a cell (f16), 59-60 (f16
# without flash attention) and 96 (q8_0) against 52-53, 38-39 and 95 with a 0.15 MB head; SmolLM2 itself measured
# about 69 for f16 (bench/README.md)
# its decode runs: the head's read from memory makes each run of 32 tokens spread more on a shared VM (Gemma 3's
# geometry: 63-76 ms against the difference of 20 ms it times), so more of them than the other steps' five
EVICT_TG_REPS = 9
# and each run is EVICT_TG_N tokens, not TG_N: most of a run's time is the head's read (on a 2-vCPU Xeon at 18 GB/s a
# 134 MB head, EVICT_MAX_BYTES's, is 7 ms of a 10 ms token), which the difference of two depths takes out,
# so the difference's spread is the same with half the tokens (nine rounds each, six layers of SmolLM2's heads: f16
# 433-436 ps a cell from 16-token runs, 435-438 from 32; q4_0 287-294 and 281-284) and the steps take half the time:
# the four K/V pairs' evicting decode steps 26 s instead of 42 (bench/attn_layers.py --tokens, bench/README.md)
EVICT_TG_N = 16
# the generic model's decode steps (no geometry: its f16 cost prices the node and weight models' own attention, a few
# per cent of their time) run EVICT_TG_N tokens too: the same difference of two depths, half the time
GENERIC_TG_N = EVICT_TG_N
EVICT_FACTOR = 1.25
EVICT_DEFAULT_BYTES = 48 * 1024 * 1024
# (tried on the Xeon: a 64 MiB cap, with warm-ups of one token, made runs of 40-110 ms that were still speeding up
# over their first several after a fill, and round xeon4 priced quantized decodes 10-42 % too slow, bench/README.md)
EVICT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_KV = (("f16", "f16"), ("q8_0", "q8_0"), ("q5_0", "q5_0"), ("q4_0", "q4_0"))


SPEED_CALIBRATE_ENV = "EDGEKV_SPEED_CALIBRATE"    # auto (default): measure what a prediction needs; cached: never


class CalibrationError(RuntimeError):
    pass


class PartlyMeasured(CalibrationError):
    """The weight models' run failed (a full disk, a type llama.cpp refused) after the graph nodes and attention were
    measured and solved into ``cal`` (``raw``: their timings): calibrate caches those before it reports the error,
    so that the next run measures only the rest."""

    def __init__(self, why: str, cal: Calibration, raw: list[dict]):
        super().__init__(why)
        self.cal, self.raw = cal, raw


class Disturbed(CalibrationError):
    """A measurement that found no cost where there must be one: other work on the machine hid it.  Refused, never
    cached (calibrate measures once more first: _measure_or_again)."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"the speed calibration {what} (other work on the machine disturbed it): not cached; run "
                         "'edgekv calibrate' on a quiet machine")


def auto_measure() -> bool:
    """Whether predict and bench may calibrate on their own (EDGEKV_SPEED_CALIBRATE=auto, the default) or only
    use what is cached (=cached: a CI job that must not spend a minute measuring; the test suite)."""
    mode = os.environ.get(SPEED_CALIBRATE_ENV, "auto").strip().lower()
    if mode not in ("auto", "cached"):
        raise CalibrationError(f"{SPEED_CALIBRATE_ENV}={mode!r}: use auto or cached")
    return mode == "auto"


def weight_shape(type_name: str, device: str = "", narrow: bool = False, stream: bool = False,
                 big: bool = False) -> dict[str, Any]:
    """A llama model of about WEIGHT_TARGET_BYTES of ``type_name`` matrices (n_embd 1024, n_ff 4096; K-quants
    need rows of 256; ``narrow``: NARROW_WIDTHS, for the cost per row; ``stream``: STREAM_TARGET_BYTES of the
    wide widths, for the streaming rate, or with ``narrow`` of STREAM_NARROW_WIDTHS, for its cost per row, or with
    ``big`` of STREAM_BIG_WIDTHS, large matrices); for a GPU (``device``) about DEVICE_WEIGHT_TARGET_BYTES of
    n_embd 4096, n_ff 16384 (heads of 128, which every flash-attention kernel has)."""
    from gguf import GGMLQuantizationType

    from edgekv.core.cachetypes import ggml_type_info

    qt = GGMLQuantizationType[type_name.upper()]
    _name, blk, size = ggml_type_info(int(qt))
    e, f, target, heads = (4096, 16384, DEVICE_WEIGHT_TARGET_BYTES, 32) if device else (1024, 4096, WEIGHT_TARGET_BYTES, 8)
    if narrow or big:
        w = STREAM_BIG_WIDTHS if big else STREAM_NARROW_WIDTHS if stream else NARROW_WIDTHS
        e, f, heads = w["n_embd"], w["n_ff"], w["n_head"]
    if stream:
        target = STREAM_TARGET_BYTES
    per_layer = (4 * e * e + 3 * e * f) * size / blk
    if big and per_layer > 1.5 * target:        # F32: one layer of 4096/12288 is 872 MB; a square one 470
        f = e
        per_layer = 7 * e * e * size / blk
    n_layer = max(1, min(48 if narrow or stream else 8, round(target / per_layer)))
    return {"n_embd": e, "n_ff": f, "n_layer": n_layer, "n_head": heads, "n_head_kv": heads, "mat_type": qt.name}


@dataclass
class SpeedCalibration:
    cal: Calibration
    remeasured: bool = False
    note: str = ""


def _key(n_threads: int, repack: bool, llama_bench: str | None = None, device: str = "") -> tuple[str, dict[str, Any]]:
    base = fingerprint("llama-bench", llama_bench) if llama_bench else fingerprint("python")
    fp = {**base, "speed": CAL_VERSION, "model": SPEED_MODEL_VERSION, "threads": n_threads, "repack": repack}
    if device:      # a GPU calibration: also the cards and their driver (a new card or driver re-measures)
        from edgekv.orchestration.calibrate import gpu_identity

        fp.update({"device": device, **gpu_identity()})
    return fingerprint_key(fp), fp


def _path(n_threads: int, repack: bool, llama_bench: str | None = None, device: str = ""):
    # the user's binary names the file only through a hash of its path (untrusted input never chooses a path); a
    # device name is llama.cpp's (CUDA0, Metal, Vulkan0): used when it is plain letters and digits, else hashed
    who = ("binary-" + hashlib.sha256(os.path.abspath(llama_bench).encode()).hexdigest()[:10]) if llama_bench else "python"
    dev = ""
    if device:
        dev = "-" + (device if re.fullmatch(r"[A-Za-z0-9]{1,32}", device)
                     else "dev" + hashlib.sha256(device.encode()).hexdigest()[:10])
    return store_path(f"{who}-speed-t{int(n_threads)}-r{int(bool(repack))}{dev}")


def runtime_name(llama_bench: str | None) -> str:
    """What a calibration was measured through, as its records say."""
    return f"llama-bench at {os.path.abspath(llama_bench)}" if llama_bench else "llama-cpp-python"


Runner = Callable[..., list[dict]]    # (plan, progress) -> the probe's results


def _runner(llama_bench: str | None) -> Runner:
    """The probe that runs a plan: edgekv's own child through llama-cpp-python, or the user's llama-bench."""
    if not llama_bench:
        return _run
    from edgekv.orchestration.lbprobe import ProbeError, run_probe

    def run(models: list[dict[str, Any]], progress: Callable[[str], None] | None) -> list[dict]:
        try:
            return run_probe(llama_bench, models, progress)
        except ProbeError as e:
            raise CalibrationError(f"the speed calibration through {llama_bench} failed: {e}") from None

    return run


def _median_s(ns: list[int]) -> float:
    return statistics.median(ns) / 1e9


def _run(models: list[dict[str, Any]], progress: Callable[[str], None] | None, timeout: float = 600.0) -> list[dict]:
    from edgekv.edges.process import run_child, worker_argv

    def on_event(ev: dict[str, Any]) -> None:
        if progress and ev.get("event") == "progress":
            progress(str(ev.get("step")))

    res = run_child(worker_argv("speed_probe"), {"models": models}, timeout=timeout, on_event=on_event)
    r = res.result or {}
    if not res.ok or not r.get("ok"):
        raise CalibrationError(f"the speed calibration failed: {r.get('reason') or res.failure_reason() or 'no result'}")
    return r["results"]


def _ctx(key: str, n_threads: int, steps: list[dict[str, Any]], n_ctx: int = 4096, n_batch: int = 512,
         type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto", n_seq: int = 1) -> dict[str, Any]:
    """A calibration context; ``n_seq`` sequences each get their own KV stream of ``n_ctx`` cells.  Its untimed cache
    fills run on every core llama.cpp would use by default (``fill_threads``: Gemma 3's needs at -t 1 from nothing
    took 112 s filling on one thread, 94-97 s on two, the 2-vCPU Xeon VM: bench/README.md), its timed runs and their
    warm-ups on ``n_threads``."""
    from edgekv.edges.environment import default_threads

    return {"key": key, "n_threads": n_threads, "fill_threads": max(n_threads, default_threads()), "steps": steps,
            "params": {"n_ctx": n_ctx * n_seq, "n_batch": n_batch, "n_ubatch": n_batch, "type_k": type_k,
                       "type_v": type_v, "flash_attn": flash_attn, "n_seq_max": n_seq}}


def _one_cpu_thread(n_threads: int, device: str) -> bool:
    """A CPU calibration on one thread: its steps' constants, chosen at two, shrink (run_tokens, attn_reps)."""
    return not device and n_threads <= 1


def run_tokens(n: int, n_threads: int, device: str = "") -> int:
    """The tokens of a CPU decode step's timed run: ``n`` (the constants above, chosen at two threads), half of it at
    one thread.  One thread takes about twice as long over each token, so its run of half the tokens lasts as long as
    the two-thread run (a run's error is mostly the machine's jitter over its duration).  On the 2-vCPU Xeon VM
    Gemma 3's needs at -t 1 took 153 s from nothing with whole runs, 112 s with half (fills on one thread), and two
    rounds' -t 1 rows came within -7.5 ... +5.1 % (bench/README.md, calibration at -t 1)."""
    return max(4, n // 2) if _one_cpu_thread(n_threads, device) else n


def attn_reps(reps: int, n_threads: int, device: str = "") -> int:
    """The timed runs of a CPU attention decode or deep prompt step: ``reps`` (chosen at two threads), about half at
    one thread (at least 3, a median's).  One thread's runs of them spread less, having no barrier between ops: on the
    2-vCPU Xeon VM a median absolute deviation of 0.3 % a run for the evicting decode steps and 0.1-0.15 % for the
    deep prompts, against 0.8 and 0.6 % on two threads, so five and three runs pin the median better than nine and
    five did there (bench/README.md, calibration at -t 1)."""
    return max(3, (reps + 1) // 2) if _one_cpu_thread(n_threads, device) else reps


def _step(key: str, test: str, depth: int, n: int, reps: int, warmup: int = 1) -> dict[str, Any]:
    return {"key": key, "test": test, "depth": depth, "n": n, "reps": reps, "warmup": warmup}


def _attn_units(shape: dict[str, Any]) -> int:
    hd = shape.get("head_dim") or shape["n_embd"] // shape["n_head"]
    return shape["n_layer"] * shape["n_head"] * 2 * hd


def _ngl(device: str) -> int:
    """The calibration models' n_gpu_layers: every layer on the GPU for a device calibration, none otherwise."""
    return -1 if device else 0


def base_plan(n_threads: int, repack: bool, device: str = "") -> list[dict[str, Any]]:
    from edgekv.edges.tinymodel import plan_model

    models = []
    for name, shape in NODE_SHAPES.items():
        models.append({"key": name, "repack": repack, "n_gpu_layers": _ngl(device),
                       **plan_model(name, **shape),
                       "contexts": [_ctx("f16", n_threads, [_step("tg", "tg", 0, 32, 5, 2), _step("pp", "pp", 0, PP_N, 3),
                                                            _step("ps", "pp", 0, PP_SHORT_N, 5, 2)], n_ctx=1024)]})
    if device:
        models.append({"key": "nodes_v", "repack": repack, "n_gpu_layers": -1,
                       **plan_model("nodes_v", **VOCAB_SHAPE),
                       "contexts": [_ctx("f16", n_threads, [_step("tg", "tg", 0, 32, 5, 2)], n_ctx=1024)]})
    return models


def body_shape(body: str) -> dict[str, Any]:
    """The body probe of a model's widths (edgekv.core.speed.body_geometry: "e576f1536h9kv3d64l30"): a llama model of
    those widths and layers, Q8_0 matrices, zero weights."""
    m = re.fullmatch(r"e(\d+)f(\d+)h(\d+)kv(\d+)d(\d+)l(\d+)", body)
    if not m:
        raise CalibrationError(f"bad model widths {body!r}")
    e, f, h, kv, d, n = (int(x) for x in m.groups())
    return {"n_embd": e, "n_ff": f, "n_layer": n, "n_head": h, "n_head_kv": kv, "head_dim": d, "mat_type": "Q8_0"}


def body_plan(bodies: Iterable[str], n_threads: int, repack: bool) -> list[dict[str, Any]]:
    """A GPU calibration's body probes: a decode of 32 tokens and a 512-token prompt at depth 0, every layer offloaded."""
    from edgekv.edges.tinymodel import plan_model

    steps = [_step("tg", "tg", 0, TG_N, 5, 2), _step("pp", "pp", 0, BODY_PP_N, 9, 2)]
    return [{"key": f"body_{b}", "body": b, "repack": repack, "n_gpu_layers": -1,
             **plan_model(f"body_{b}", **body_shape(b)),
             "contexts": [_ctx("f16", n_threads, steps, n_ctx=1024)]} for b in bodies]


def geometry_shape(geometry: str | None) -> dict[str, Any]:
    """The attention calibration model of a geometry ("h9kv3k64v64": query heads, KV heads, K and V head dims):
    GEOMETRY_LAYERS layers of it (fewer past WIDE_LAYER_UNITS a layer), narrow Q8_0 matrices; None: the generic model
    (ATTN_SHAPE)."""
    if geometry is None:
        return dict(ATTN_SHAPE)
    m = re.fullmatch(r"h(\d+)kv(\d+)k(\d+)v(\d+)(?:e(\d+))?", geometry)
    if not m:
        raise CalibrationError(f"bad attention geometry {geometry!r}")
    h, kv, hk, hv = (int(x) for x in m.groups()[:4])
    e = int(m[5]) if m[5] else min(h * hk, GEOMETRY_MAX_EMBD)
    if hk != hv or h % max(1, kv) or (h * hk) % 32 or hk % 32 or not 32 <= e <= GEOMETRY_MAX_EMBD or e % 32:
        raise CalibrationError(f"no calibration model for the attention geometry {geometry} (K and V head dims must be "
                               "equal multiples of 32, the query heads a multiple of the KV heads, the hidden size a "
                               f"multiple of 32 up to {GEOMETRY_MAX_EMBD})")
    # the model's own hidden size, so that its projections are the model's (with weights of a trained model's size
    # at that width, edgekv.edges.tinymodel.weight_rms, the width leaves the cost per cell alone:
    # bench/attn_widths.py); the feed-forward stays narrow (its width changes nothing there) so that filling the
    # cache stays quick
    per_layer = _attn_units({"n_layer": 1, "n_head": h, "head_dim": hk})
    layers = max(1, min(GEOMETRY_LAYERS, GEOMETRY_LAYERS * WIDE_LAYER_UNITS // per_layer))
    return {"n_embd": e, "n_ff": 256, "n_layer": layers, "n_head": h, "n_head_kv": kv, "head_dim": hk,
            "mat_type": "Q8_0"}


def _q8_bytes(n: float) -> float:
    return n * 34 / 32


def stream_bytes(shape: dict[str, Any]) -> float:
    """The bytes of a calibration model's Q8_0 matrices that one decoded token reads (its layers and output head)."""
    e, h, kv, f = shape["n_embd"], shape["n_head"], shape["n_head_kv"], shape["n_ff"]
    hd = shape.get("head_dim") or e // h
    layer = e * h * hd * 2 + e * kv * hd * 2 + 3 * e * f
    return _q8_bytes(shape["n_layer"] * layer + e * shape.get("n_vocab", 256))


def evict_vocab(shape: dict[str, Any], llc_bytes: int | None) -> int:
    """The vocabulary whose Q8_0 output head makes a token of the model ``shape`` read EVICT_FACTOR x a last-level
    cache of ``llc_bytes`` (EVICT_DEFAULT_BYTES where None) in all, in whole 256s; 256 where its own matrices
    already do (a wide geometry's)."""
    target = min(EVICT_MAX_BYTES, EVICT_FACTOR * llc_bytes if llc_bytes else EVICT_DEFAULT_BYTES)
    head = target - stream_bytes({**shape, "n_vocab": 0})
    return max(256, -(-int(head / _q8_bytes(shape["n_embd"])) // 256) * 256)


def evict_shape(geometry: str) -> dict[str, Any] | None:
    """The model a geometry's decode steps run on (the CPU): geometry_shape with an output head that evicts the
    last-level cache between tokens (evict_vocab) and a Q8_0 token embedding of the same rows, so that the file stays
    small; None where the geometry's own model reads enough to evict it (Bonsai 8B's 32 x 128 heads at a hidden size
    of 4096: 287 MB a token)."""
    from edgekv.edges.environment import last_level_cache_bytes

    shape = geometry_shape(geometry)
    nv = evict_vocab(shape, last_level_cache_bytes())
    return {**shape, "n_vocab": nv, "embd_type": "Q8_0"} if nv > 256 else None


@dataclass(frozen=True)
class AttnSteps:
    tg_depths: tuple[int, int]
    pp_depths: tuple[int, int]
    pp_n: int


def attn_steps(geometry: str | None, split: bool, device: str = "", rows: bool = False) -> AttnSteps:
    """The depths and prompt size of one K/V pair's attention steps at a geometry (``split``: llama.cpp's
    split-KV decode path, f16/f32; ``rows``: its prompts run the per-row loop at every size, row_loop_path: decode
    steps from ROW_LOOP_TG_START, prompts of ROW_LOOP_PP_N tokens).  A geometry whose cell costs s times the
    generic model's (more heads x head dims over its layers: Qwen3 8B's 32 x 128 is s = 4) takes decode depth
    differences 1/s as deep, so that each difference times the same work as the generic model's, and filling the
    cache costs about 1/s^2 as much; its decode steps start at depth ROW_LOOP_TG_START (128) unless split-KV needs a
    view of 512 cells or more (whose differences stay
    whole 256-cell chunks of the padded view, edgekv.core.speed.decode_cells), and its prompts are half as long
    over a depth difference 2/s as deep (the same work again).  Without this, that geometry's four K/V pairs took
    239 s on two cores (bench/README.md), over the issue's 90 s.  A GPU (``device``) takes the DEVICE_ depths for
    every geometry: its fill is quick and its cells cheap."""
    if device:
        return AttnSteps(DEVICE_ATTN_TG_DEPTHS, DEVICE_ATTN_PP_DEPTHS, ATTN_PP_N)
    s = _attn_units(geometry_shape(geometry)) / _attn_units(ATTN_SHAPE)
    (t0, t1), (p0, p1) = ATTN_TG_DEPTHS, ATTN_PP_DEPTHS
    if s <= 1:
        start = ROW_LOOP_TG_START if rows else t0
        return AttnSteps((start, start + t1 - t0), ATTN_PP_DEPTHS, ROW_LOOP_PP_N if rows else ATTN_PP_N)
    dt = max(256, round((t1 - t0) / s / 256) * 256)
    dp = max(128, round(2 * (p1 - p0) / s / 128) * 128)
    start = t0 if split else ROW_LOOP_TG_START
    return AttnSteps((start, start + dt), (p0, p0 + dp), min(ATTN_PP_N // 2, ROW_LOOP_PP_N) if rows else ATTN_PP_N // 2)


def _in_order(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps through llama-bench, which has one sequence: in order of depth (the child extends one fill from step to
    step), then each kind's shallowest again (dropping cells costs nothing): each difference is taken shallow, deep,
    shallow, so a machine that slows or speeds up steadily meanwhile does not bias it."""
    again = []
    for kind in ("tg", "pp", "ps", "pt"):
        mine = [st for st in steps if st["key"].startswith(kind)]
        if mine:
            first = min(mine, key=lambda st: st["depth"])
            again.append({**first, "key": first["key"] + "b"})
    return sorted(steps, key=lambda st: st["depth"]) + again


def attn_plan(pairs: Iterable[tuple[str, str, str]], n_threads: int, repack: bool,
              geometry: str | None = None, device: str = "", interleave: bool = False) -> list[dict[str, Any]]:
    """The attention steps of each K/V pair at a geometry.  ``interleave`` (edgekv's own probe; llama-bench cannot):
    the shallow and the deep depth as two sequences of one context, their runs taken in turn.  On the CPU a
    geometry's decode steps run on a model whose output head evicts the caches between tokens (evict_shape: model
    "attnv_" + geometry), its prompt steps on the geometry's own model (a prompt reads its cells once per ubatch;
    with that head the f16 prompt's cost per cell came out 26 % lower, 14.2 against 19.1 ps, further from
    SmolLM2's own, bench/README.md)."""
    from edgekv.core.speed import split_kv_path
    from edgekv.edges.tinymodel import plan_model

    evicting = None if device or geometry is None else evict_shape(geometry)
    evict = evicting is not None
    ctxs: list[dict[str, Any]] = []
    ctxs_tg: list[dict[str, Any]] = []
    for tk, tv, fa in pairs:
        a = attn_steps(geometry, split_kv_path(tk, tv, fa, device), device, row_loop_path(tk, tv, fa, device))
        tg_depths, pp_depths = a.tg_depths, a.pp_depths
        n_ctx = max(4096, -(-(max(tg_depths[1] + TG_N, pp_depths[1] + a.pp_n) + 1) // 512) * 512)
        # a pair whose long prompts run the tiled kernel: a short prompt too, over the same depths ("ps" steps)
        tiled = tiled_prompt_path(tk, tv, fa, device)
        reps, n_tg = (EVICT_TG_REPS, EVICT_TG_N) if evict else (5, TG_N if device else GENERIC_TG_N)
        n_tg, reps = run_tokens(n_tg, n_threads, device), attn_reps(reps, n_threads, device)
        if interleave:
            tg = [{**_step("tg", "tg", 0, n_tg, reps), "depths": list(tg_depths)}]
            pp = [{**_step("pp", "pp", 0, a.pp_n, 3), "depths": list(pp_depths)}]
            pp += [{**_step("ps", "pp", 0, PP_ROWS_N, 3), "depths": list(pp_depths)}] if tiled else []
            pp += [{**_step("pt", "pp", 0, PT_N, 3), "depths": list(pp_depths)}] if tiled and not device else []
        else:
            tg = [_step(f"tg{d}", "tg", d, n_tg, reps) for d in tg_depths]
            pp = [_step(f"pp{d}", "pp", d, a.pp_n, 3) for d in pp_depths]
            pp += [_step(f"ps{d}", "pp", d, PP_ROWS_N, 3) for d in pp_depths if tiled]
            pp += [_step(f"pt{d}", "pp", d, PT_N, 3) for d in pp_depths if tiled and not device]
        for dest, steps in ([(ctxs_tg, tg), (ctxs, pp)] if evict else [(ctxs, tg + pp)]):
            dest.append(_ctx(kv_key(tk, tv, fa, geometry), n_threads, steps if interleave else _in_order(steps),
                             n_ctx=n_ctx, type_k=tk, type_v=tv, flash_attn=fa, n_seq=2 if interleave else 1))
    name = "attn" if geometry is None else f"attn_{geometry}"
    out = [{"key": name, "repack": repack, "n_gpu_layers": _ngl(device),
            **plan_model(name, **geometry_shape(geometry)), "contexts": ctxs}]
    if ctxs_tg:
        out.append({"key": f"attnv_{geometry}", "repack": repack, "n_gpu_layers": 0,
                    **plan_model(f"attnv_{geometry}", **evicting),
                    "contexts": ctxs_tg})
    deep = [p for p in pairs if geometry is not None and tiled_prompt_path(*p, device)]
    if deep:
        out.append(deep_plan(deep, n_threads, repack, geometry, interleave))
    return out


def deep_plan(pairs: list[tuple[str, str, str]], n_threads: int, repack: bool, geometry: str,
              interleave: bool = False) -> dict[str, Any]:
    """The tiled kernel deep in the cache for the given F16/F32 pairs of a geometry: DEEP_PP_N-token prompts at
    both TILED_DEEP_DEPTHS on a DEEP_LAYERS-layer model of it, and PT_N-token ones (short query tiles: the share of
    the cost per tile deep in the cache) (interleaved as attn_plan's steps; through llama-bench in order of depth,
    then the shallow ones again)."""
    from edgekv.edges.tinymodel import plan_model

    d0, d1 = TILED_DEEP_DEPTHS
    n_ctx = -(-(d1 + DEEP_PP_N + 1) // 512) * 512
    shape = deep_shape(geometry)
    reps = attn_reps(max(3, min(DEEP_REPS, round(DEEP_REPS * WIDE_LAYER_UNITS / _attn_units(shape)))), n_threads)
    ctxs = []
    for tk, tv, fa in pairs:
        if interleave:
            steps = [{**_step("pd", "pp", 0, DEEP_PP_N, reps), "depths": [d0, d1]}]
            steps += [{**_step("td", "pp", 0, PT_N, reps), "depths": [d0, d1]}]
            ctxs.append(_ctx(kv_key(tk, tv, fa, geometry), n_threads, steps, n_ctx=n_ctx, type_k=tk, type_v=tv,
                             flash_attn=fa, n_seq=2))
            continue
        steps = [_step(f"{k}{d}", "pp", d, n, reps) for d in (d0, d1) for k, n in (("pd", DEEP_PP_N), ("td", PT_N))]
        steps += [_step(f"{k}{d0}b", "pp", d0, n, reps) for k, n in (("pd", DEEP_PP_N), ("td", PT_N))]
        ctxs.append(_ctx(kv_key(tk, tv, fa, geometry), n_threads, steps, n_ctx=n_ctx, type_k=tk, type_v=tv,
                         flash_attn=fa))
    name = f"attnd_{geometry}"
    return {"key": name, "repack": repack, "n_gpu_layers": 0, **plan_model(name, **shape), "contexts": ctxs}


def deep_shape(geometry: str) -> dict[str, Any]:
    return {**geometry_shape(geometry), "n_layer": DEEP_LAYERS}


def weight_plan(types: Iterable[str], n_threads: int, repack: bool, device: str = "") -> list[dict[str, Any]]:

    out = []
    for t in types:
        wide = _wide_model(t, n_threads, repack, device)
        if device:
            out.append(wide)
            continue
        # the CPU: the narrow model's decode before and after the wide one's (the cost per row; a machine that
        # drifts meanwhile moves both alike), then the large ones' (the streaming rate and its cost per row)
        # (its prompts too, before the wide one's: the mat-mat's cost per dot product, and a few columns' per row)
        narrow, tg = weight_shape(t, narrow=True), _step("tg", "tg", 0, run_tokens(TG_N, n_threads), WEIGHT_TG_REPS, 2)
        stream = weight_shape(t, stream=True)
        st = _step("tg", "tg", 0, run_tokens(STREAM_N, n_threads), STREAM_REPS, 0)
        out += [_decode_only(f"wn_{t.lower()}", f"wn_{t.lower()}", t, narrow, tg, n_threads, repack,
                             [_step(f"pp{n}", "pp", 0, n, MM_REPS) for n in MM_N] + _cols_steps()), wide,
                _decode_only(f"wnb_{t.lower()}", f"wn_{t.lower()}", t, narrow, tg, n_threads, repack, _cols_steps()),
                _decode_only(f"ws_{t.lower()}", f"ws_{t.lower()}", t, stream, st, n_threads, repack),
                _decode_only(f"wsn_{t.lower()}", f"wsn_{t.lower()}", t, weight_shape(t, narrow=True, stream=True), st,
                             n_threads, repack),
                _decode_only(f"wsb_{t.lower()}", f"wsb_{t.lower()}", t, weight_shape(t, stream=True, big=True), st,
                             n_threads, repack)]
    return out


def _wide_model(t: str, n_threads: int, repack: bool, device: str = "") -> dict[str, Any]:
    """The weight model of type ``t`` at the wide widths: its decode, prompts and few-column steps."""
    from edgekv.edges.tinymodel import plan_model

    shape = weight_shape(t, device)
    steps = [_step("tg", "tg", 0, run_tokens(TG_N, n_threads, device), WEIGHT_TG_REPS, 2)]
    steps += [_step(f"pp{n}", "pp", 0, n, MM_REPS) for n in MM_N]
    steps += _cols_steps()
    name = f"w_{t.lower()}" + ("_dev" if device else "")
    return {"key": f"w_{t.lower()}", "type": t.lower(), "repack": repack, "n_gpu_layers": _ngl(device),
            **plan_model(name, **shape), "shape": shape,
            "contexts": [_ctx("f16", n_threads, steps, n_ctx=512)]}


def _cols_steps() -> list[dict[str, Any]]:
    """A weight model's few-column prompts (MM_COLS tokens: one graph of a decode step's width)."""
    return [_step(f"pp{n}", "pp", 0, n, MM_COLS_REPS, 2) for n in MM_COLS]


def _decode_only(key: str, file: str, t: str, shape: dict[str, Any], step: dict[str, Any], n_threads: int,
                 repack: bool, more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A CPU weight model timed by one decode step (and ``more`` steps: the narrow model's prompts) (``file``: the
    calibration model's name, shared by two keys that time the same model twice)."""
    from edgekv.edges.tinymodel import plan_model

    return {"key": key, "type": t.lower(), "repack": repack, "n_gpu_layers": 0,
            **plan_model(file, **shape), "shape": shape,
            "contexts": [_ctx("f16", n_threads, [step, *(more or [])], n_ctx=512)]}


def _by(results: list[dict], model: str, ctx: str | None = None) -> dict[str, dict]:
    return {r["step"]: r for r in results if r["model"] == model and (ctx is None or r["context"] == ctx)}


def solve_nodes(results: list[dict], attn_tg: float = 0.0, attn_pp: float = 0.0,
                attn_short: float = 0.0) -> tuple[float, float, float, float, float]:
    """(seconds per node of a one-token graph, seconds per node of a PP_N-token prompt ubatch, seconds per token and
    per ubatch outside the nodes, seconds per node of a PP_SHORT_N-token ubatch) from the two narrow models, less
    their own attention (``attn_tg``/``attn_pp``/``attn_short``: the f16 coefficients, over the cells each token
    reads; the short prompt's is llama.cpp's per-row loop).  The short ubatch's node cost is 0.0 where the results
    do not hold it (a plan before CAL_VERSION 15).  The per-token and per-ubatch costs are the narrow 2-layer
    model's time less its nodes' (on a GPU about 90 us a token: llama_decode's own work; on two CPU cores a few
    us): at least zero, since a machine's noise can hide a small constant, never make it negative."""
    a, b = _by(results, "nodes_a"), _by(results, "nodes_b")
    ga, gb = _ops(a["tg"]["graph"]), _ops(b["tg"]["graph"])
    sa, sb = NODE_SHAPES["nodes_a"], NODE_SHAPES["nodes_b"]
    per_layer = sa["n_head"] * 2 * (sa["n_embd"] // sa["n_head"])
    dl = sb["n_layer"] - sa["n_layer"]
    tg = ((_median_s(b["tg"]["ns"]) - _median_s(a["tg"]["ns"])) / 32 - dl * per_layer * 16 * attn_tg) \
        / max(1, gb["nodes_tg"] - ga["nodes_tg"])
    pp = (_median_s(b["pp"]["ns"]) - _median_s(a["pp"]["ns"]) - dl * per_layer * PP_N * (PP_N / 2) * attn_pp) \
        / max(1, gb["nodes_pp"] - ga["nodes_pp"])
    short = 0.0
    if "ps" in a and "ps" in b:
        short = (_median_s(b["ps"]["ns"]) - _median_s(a["ps"]["ns"])
                 - dl * per_layer * PP_SHORT_N * (PP_SHORT_N / 2) * attn_short) / max(1, gb["nodes_pp"] - ga["nodes_pp"])
        if short <= 0:
            raise Disturbed("measured no cost for a deeper graph under a short prompt")
    if tg <= 0 or pp <= 0:
        # 32 more layers cannot be free: other work hid their cost; a zero would predict graphs as costing nothing
        raise Disturbed("measured no cost for a deeper graph")
    own_tg = sa["n_layer"] * per_layer * 16 * attn_tg                # the 2-layer model's attention at mean depth 16
    own_pp = sa["n_layer"] * per_layer * PP_N * (PP_N / 2) * attn_pp
    tg0 = max(0.0, _median_s(a["tg"]["ns"]) / 32 - ga["nodes_tg"] * tg - own_tg)
    pp0 = max(0.0, _median_s(a["pp"]["ns"]) - ga["nodes_pp"] * pp - own_pp)
    return tg, pp, tg0, pp0, short


def _ops(graph: dict[str, int] | None) -> dict[str, int]:
    """A calibration model's graph sizes as the speed model counts them: ``nodes_tg``/``nodes_pp`` are the nodes a
    backend runs (core.speed.run_nodes), from llama.cpp's scheduler listing (GGML_SCHED_DEBUG=2 at the probe's
    count context)."""
    from edgekv.core.speed import run_nodes

    tg, pp = run_nodes(graph)
    if tg is None or pp is None:
        raise CalibrationError("llama.cpp did not list its graph's nodes (the scheduler's GGML_SCHED_DEBUG=2 listing "
                               "after 'graph: nodes = ...')")
    return {"nodes_tg": tg, "nodes_pp": pp}


def solve_vocab(results: list[dict], cal: Calibration) -> float:
    """Seconds per logit a decoded token returns to the host (a GPU's copy of the logits): the wide-vocabulary
    narrow model less nodes_a, less its larger output matrix (read at the Q8_0 mat-vec cost); at least zero."""
    a, v = _by(results, "nodes_a"), _by(results, "nodes_v")
    if "tg" not in v:
        return 0.0
    e, dv = VOCAB_SHAPE["n_embd"], VOCAB_SHAPE["n_vocab"] - 256
    out_bytes = _q8_bytes(e * dv)
    dt = (_median_s(v["tg"]["ns"]) - _median_s(a["tg"]["ns"])) / TG_N \
        - (_ops(v["tg"]["graph"])["nodes_tg"] - _ops(a["tg"]["graph"])["nodes_tg"]) * cal.node_tg_s
    return max(0.0, (dt - out_bytes * cal.matvec_s_per_byte["q8_0"]) / dv)


def _probe_shape(model_path: str, graph: dict[str, int] | None, cpu_features: list[str], repack: bool):
    """The speed shape of one of the calibration's own models (its header as edgekv wrote it)."""
    from edgekv.core.arch import shape_from_metadata
    from edgekv.core.speed import speed_shape
    from edgekv.edges.gguf_header import read_header_file

    _ops(graph)            # the nodes that run must have been listed: a shape without them would price no nodes
    header = read_header_file(model_path)
    shape = shape_from_metadata(header.metadata, model_path, header.value_types)
    return speed_shape(shape, list(header.tensors), cpu_features, repack, graph)


def solve_bodies(results: list[dict], plan: list[dict[str, Any]], cal: Calibration) -> None:
    """Fill cal's node costs at each body probe's widths: its decode and prompt time less what the rest of the model
    predicts (the token or ubatch cost, its logits, its Q8_0 weights and output, its attention at depth 0), over its
    graph's nodes."""
    from edgekv.core.speed import attn_units_tg

    f16 = kv_key("f16", "f16", "auto")
    for m in plan:
        r = _by(results, m["key"])
        sh = _probe_shape(m["model_path"], r["tg"]["graph"], [], False)
        w_bytes = sum(x.bytes for x in sh.groups)
        # the prompt's last-layer feed-forward runs for its last token only (WeightGroup.tail_*): a mat-vec
        tail_bytes = sum(x.tail_bytes for x in sh.groups if not x.output)
        body_params = sum(x.params - x.tail_params for x in sh.groups if not x.output)
        o_bytes = sum(x.bytes for x in sh.groups if x.output) + tail_bytes
        units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
        t_tg = _median_s(r["tg"]["ns"]) / TG_N - cal.token_tg_s - sh.n_vocab * cal.vocab_tg_s \
            - w_bytes * cal.matvec_s_per_byte["q8_0"] - attn_units_tg(sh, TG_N / 2, cal.n_threads, False) * cal.attn_tg_s[f16]
        t_pp = _median_s(r["pp"]["ns"]) - cal.ubatch_pp_s - (w_bytes - o_bytes) * cal.matmul_s_per_byte["q8_0"] \
            - 2.0 * body_params * BODY_PP_N * cal.matmul_s_per_flop["q8_0"] - o_bytes * cal.matvec_s_per_byte["q8_0"] \
            - units * BODY_PP_N * (BODY_PP_N / 2) * cal.attn_pp_s[f16]
        if t_tg <= 0 or t_pp <= 0:
            raise Disturbed(f"of the model widths {m['body']} measured no cost for the graph's nodes")
        cal.node_tg_body_s[m["body"]] = t_tg / sh.nodes_tg
        cal.node_pp_body_s[m["body"]] = t_pp / sh.nodes_pp


def _attn_speed_shape(shape: dict[str, Any]):
    from edgekv.core.speed import AttnLayer, SpeedShape

    hd = shape.get("head_dim") or shape["n_embd"] // shape["n_head"]
    return SpeedShape((), tuple(AttnLayer(shape["n_head"], hd, hd, None, shape["n_head_kv"])
                                for _ in range(shape["n_layer"])), None, None)


def _shallow(r: dict[str, dict], key: str) -> float:
    """The shallow step's time: the mean of its runs before and after the deep step (when both were taken)."""
    both = [_median_s(r[k]["ns"]) for k in (key, key + "b") if k in r]
    return sum(both) / len(both)


def _difference_s(r: dict[str, dict], deep: str, shallow: str) -> float:
    """How much longer a run of step ``deep`` takes than one of step ``shallow`` (seconds).  Runs taken in turn (the
    in-process probe's two sequences, "in_turn") are paired, each deep run with the shallow run just before it, and
    the median of those differences kept: a stretch in which the VM runs slower or faster lengthens both runs of a
    pair and falls out.  Over seven calibrations of one day on the 2-vCPU Xeon (their recorded runs solved both ways,
    bench/README.md) that took the spread of q8_0's decode attention at SmolLM2's heads from 10.2 to 4.4 % (141-186 ps
    a cell to 143-161) and of f16 without flash attention from 10.0 to 6.0 % (SmolLM2) and 11.3 to 4.4 % (Gemma 3),
    left the other pairs' within two points either way, and moved no pair's mean by more than about 5 %.  Runs taken in
    sequence (llama-bench: all of one depth, then the other, then the first again) cannot be paired: the difference
    of the medians, the shallow one the mean of before and after."""
    a, b = r[shallow], r[deep]
    if a.get("in_turn") and b.get("in_turn") and len(a["ns"]) == len(b["ns"]) and shallow + "b" not in r:
        return _median_s([y - x for x, y in zip(a["ns"], b["ns"])])
    return _median_s(b["ns"]) - _shallow(r, shallow)


def _attn_results(results: list[dict], key: str) -> tuple[str | None, dict[str, Any], dict[str, dict]]:
    """(geometry, its calibration model's shape, that model's steps by name) of one K/V pair's attention key."""
    geometry = key.split("@")[1] if "@" in key else None
    if geometry is None:
        return None, geometry_shape(None), _by(results, "attn", key)
    # the decode steps from the evicting model where the plan had one (attn_plan), the rest from the geometry's own
    return geometry, geometry_shape(geometry), {**_by(results, f"attn_{geometry}", key),
                                                **_by(results, f"attnv_{geometry}", key)}


def _prompt_cell_cost(r: dict[str, dict], step: str, depths: tuple[int, int], n: int, units: int) -> float:
    """Seconds per head x (head_k + head_v) x cell of an n-token prompt step timed at two depths (``step`` + depth;
    _difference_s: paired where the runs were taken in turn), over ``units`` of its model."""
    d0, d1 = depths
    return _difference_s(r, f"{step}{d1}", f"{step}{d0}") / n / units / (d1 - d0)


def solve_attn(results: list[dict], key: str, n_threads: int = 1, device: str = "") -> tuple[float, float]:
    """(decode, prompt) seconds per head x (head_k + head_v) x cell for one K/V pair and geometry (``key``: its
    kv_key; decode: the cells the slowest thread reads, edgekv.core.speed.decode_cells)."""
    from edgekv.core.speed import attn_units_tg, dense_view, split_kv_path

    geometry, shape, r = _attn_results(results, key)
    units = _attn_units(shape)
    tk, tv, fa = key.split("/")[0], key.split("/")[1], key.split("fa=")[1].split("@")[0]
    sh, split = _attn_speed_shape(shape), split_kv_path(tk, tv, fa, device)
    a = attn_steps(geometry, split, device, row_loop_path(tk, tv, fa, device))
    d0, d1 = a.tg_depths
    dense = dense_view(fa)
    n = int(r[f"tg{d1}"]["n"])      # the step's own tokens a run (EVICT_TG_N on an evicting model)
    du = (attn_units_tg(sh, d1 + n / 2, n_threads, split, dense=dense)
          - attn_units_tg(sh, d0 + n / 2, n_threads, split, dense=dense))
    tg = _difference_s(r, f"tg{d1}", f"tg{d0}") / n / du
    pp = _prompt_cell_cost(r, "pp", a.pp_depths, int(r[f"pp{a.pp_depths[1]}"]["n"]), units)
    if tg <= 0 or pp <= 0:
        # deeper attention cannot be free: other work on the machine hid its cost; never cache a zero
        raise Disturbed(f"of {key} measured no cost for a deeper cache")
    return tg, pp


def solve_attn_rows(results: list[dict], key: str, device: str = "") -> float:
    """Seconds per head x (head_k + head_v) x cell of a prompt under FA_TILE_Q tokens for one K/V pair and
    geometry whose longer prompts run the tiled kernel (the plan's "ps" steps: llama.cpp's per-query-row loop)."""
    geometry, shape, r = _attn_results(results, key)
    rows = _prompt_cell_cost(r, "ps", attn_steps(geometry, True, device).pp_depths, PP_ROWS_N, _attn_units(shape))
    if rows <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache under a short prompt")
    return rows


def solve_tile_share(results: list[dict], key: str, n_threads: int, deep: bool = False) -> float:
    """The share of one F16/F32 pair's tiled prompt attention that a query tile pays whatever rows it holds
    (edgekv.core.speed.tile_factor) at a geometry: the plan's PT_N-token prompt ("pt" steps: short tiles) beside its
    longer one over the same depths.  Between 0 (the kernel's cost follows the rows) and 1 (the tiles).  On the
    2-vCPU EPYC VM a one-layer model of SmolLM2's 9 heads cost 27.7 ps a row and cell in 512-token prompts (full
    tiles), 30.8 at 128 (a third more tiles) and 39.7-42.2 at 64 and 96 (four fifths and two thirds more) between
    depths 4096 and 8192 (bench/README.md).  ``deep``: the deep model's steps at TILED_DEEP_DEPTHS ("td" beside
    "pd")."""
    from edgekv.core.speed import tile_ratio

    geometry, shape, r = _attn_results(results, key)
    a = attn_steps(geometry, True)
    long_n, depths, steps = a.pp_n, a.pp_depths, ("pp", "pt")
    if deep:
        shape, r = deep_shape(geometry), _by(results, f"attnd_{geometry}", key)
        long_n, depths, steps = DEEP_PP_N, TILED_DEEP_DEPTHS, ("pd", "td")
    units, h = _attn_units(shape), shape["n_head"]
    y_long = _prompt_cell_cost(r, steps[0], depths, long_n, units)
    y_short = _prompt_cell_cost(r, steps[1], depths, PT_N, units)
    r_long, r_short = tile_ratio(long_n, h, n_threads), tile_ratio(PT_N, h, n_threads)
    if y_long <= 0 or y_short <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache under a prompt of short tiles")
    q = y_short / y_long
    den = (r_short - 1) - q * (r_long - 1)
    if den <= 1e-9:
        return 0.0
    return min(1.0, max(0.0, (q - 1) / den))


def solve_attn_deep(results: list[dict], key: str) -> float:
    """Seconds per head x (head_k + head_v) x cell of the tiled kernel between TILED_DEEP_DEPTHS, for one F16/F32
    pair and geometry (the deep_plan's "pd" steps)."""
    geometry = key.split("@")[1]
    r = _by(results, f"attnd_{geometry}", key)
    deep = _prompt_cell_cost(r, "pd", TILED_DEEP_DEPTHS, DEEP_PP_N, _attn_units(deep_shape(geometry)))
    if deep <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache in the tiled kernel")
    return deep


def _prompt_attn_f16(cal: Calibration, units: int, n: int) -> float:
    """The generic f16 attention of a weight model's ``n``-token prompt from depth 0 (``units``: its heads x
    head dims over its layers): the tiled kernel's coefficient, or the per-row loop's under FA_TILE_Q tokens."""
    coef = prompt_attn_coef(cal, n, tiled_prompt_path("f16", "f16", "auto", cal.device))
    return n * units * (n / 2) * coef.get(kv_key("f16", "f16", "auto"), 0.0)


def solve_weights(results: list[dict], plan: list[dict[str, Any]], cal: Calibration, cpu_features: list[str],
                  repack: bool) -> None:
    """Fill cal's mat-vec and mat-mat coefficients for each weight model of ``plan`` (the node and attention costs
    already in ``cal`` are taken out first; on the CPU the narrow model's decode beside the wide one's gives the
    cost per row)."""
    feats, rp = ([], False) if cal.device else (cpu_features, repack)     # a GPU: no CPU extra buffer applies
    for m in (x for x in plan if x["key"].startswith("w_")):
        r = _by(results, m["key"])
        sh = _probe_shape(m["model_path"], r["tg"]["graph"], feats, rp)
        mats = [g for g in sh.groups if not g.output]
        outs = [g for g in sh.groups if g.output]
        key = mats[0].key
        # a prompt computes the last layer's feed-forward for its last token only (WeightGroup.tail_*): the
        # coefficients are those of the rest, the body (a 5-layer wide model's last FFN is 15 % of its matrices)
        body = [g.split()[0] for g in mats]
        w_bytes, w_params = sum(g.bytes for g in body), sum(g.params for g in body)
        narrow = next((x for x in plan if x["key"] == "wn_" + m["key"][2:]), None)
        nd = _decode_of(results, narrow, feats, rp, cal, {g.key for g in sh.groups},
                        again="wnb_" + m["key"][2:]) if narrow else None
        mv, row = _solve_matvec(key, (sh, _decode_rest(r, sh, cal)), nd)
        cal.matvec_s_per_byte[key] = mv
        if outs and outs[0].key not in cal.matvec_s_per_byte:
            cal.matvec_s_per_byte[outs[0].key] = mv
        if narrow:
            cal.matvec_s_per_row[key] = row
            if outs:
                cal.matvec_s_per_row.setdefault(outs[0].key, row)
        stream = [next((x for x in plan if x["key"] == f"{p}_{m['key'][2:]}"), None) for p in ("ws", "wsn", "wsb")]
        if stream[0]:
            st, st_row = _stream_coefficients(results, stream[0], stream[1:], feats, rp, cal, {g.key for g in sh.groups})
            cal.matvec_stream_s_per_byte[key] = st
            cal.matvec_stream_s_per_row[key] = st_row
            if outs:
                cal.matvec_stream_s_per_byte.setdefault(outs[0].key, st)
                cal.matvec_stream_s_per_row.setdefault(outs[0].key, st_row)
        # the output head and the last layer's feed-forward: one mat-vec per prompt
        o_mv = _once_mv(sh, mv, row)
        (n1, t1), (n2, t2) = _prompt_rest(r, sh, cal, o_mv, key)
        slope = (t1 - t2) / (n1 - n2)
        per_flop, per_dot = _solve_matmul(key, (w_params, sum(g.rows for g in body), slope),
                                          _narrow_slope(results, narrow, nd[0], cal, mv, row) if narrow and nd else None)
        per_byte = max((t1 - n1 * slope) / w_bytes, 0.0)
        cal.matmul_s_per_flop[key] = per_flop
        cal.matmul_s_per_byte[key] = per_byte
        if narrow:
            cal.matmul_s_per_dot[key] = per_dot
            if outs:
                cal.matmul_s_per_dot.setdefault(outs[0].key, per_dot)
        n_cols = _cols_rest(results, narrow, nd[0], cal, mv, row, again="wnb_" + m["key"][2:]) if narrow and nd else {}
        cols, cols_row = {}, {}
        for n, w in _cols_rest(results, m, sh, cal, mv, row).items():
            cols[n], cols_row[n] = _solve_bytes_rows(f"{key} ({n} columns)", w, n_cols.get(n))
        cal.matcols_s_per_byte[key] = cols
        if outs and outs[0].key not in cal.matcols_s_per_byte:
            cal.matcols_s_per_byte[outs[0].key] = dict(cols)
        if n_cols:
            cal.matcols_s_per_row[key] = cols_row
            if outs:
                cal.matcols_s_per_row.setdefault(outs[0].key, dict(cols_row))


def _prompt_rest(r: dict[str, dict], sh, cal: Calibration, o_mv: float, key: str) -> list[tuple[int, float]]:
    """A weight model's MM_N prompts as (tokens, seconds of its matrices): each less the graph's nodes, the
    ubatch's own cost, the output head's one mat-vec (``o_mv``) and the f16 attention over the prompt."""
    units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
    rest = [(n, _median_s(r[f"pp{n}"]["ns"]) - sh.nodes_pp * prompt_node_s(cal, n) - cal.ubatch_pp_s - o_mv
             - _prompt_attn_f16(cal, units, n)) for n in MM_N]
    (n1, t1), (n2, t2) = rest
    if t1 <= t2:
        raise Disturbed(f"of {key} weights measured a {n1}-token prompt no slower than a {n2}-token one")
    return rest


def _narrow_slope(results: list[dict], m: dict[str, Any], sh, cal: Calibration, mv: float,
                  row: float) -> tuple[int, int, float] | None:
    """(multiply-adds per column, rows, seconds per column) of the narrow weight model's prompts (``sh``: its speed
    shape, as _decode_of read it), or None where it was not prompted (a calibration cached before CAL_VERSION 9)."""
    r = _by(results, m["key"])
    if any(f"pp{n}" not in r for n in MM_N):
        return None
    mats = [g for g in sh.groups if not g.output]
    o_mv = _once_mv(sh, mv, row)
    (n1, t1), (n2, t2) = _prompt_rest(r, sh, cal, o_mv, m["key"])
    body = [g.split()[0] for g in mats]
    return sum(g.params for g in body), sum(g.rows for g in body), (t1 - t2) / (n1 - n2)


def _cols_rest(results: list[dict], m: dict[str, Any], sh, cal: Calibration, mv: float,
               row: float, again: str = "") -> dict[str, tuple[int, int, float]]:
    """A weight model's MM_COLS prompts (str(n) -> (bytes, rows, seconds) of its matrices less the last layer's
    feed-forward): each less the graph's nodes at a decode step's cost, the token's own cost, the output head's and
    that feed-forward's one mat-vec and the f16 attention over the prompt; ``again``: the key under which the same
    model was prompted a second time (the narrow one after the wide one: the mean of both is taken, as for its
    decode); {} where the model was not prompted so (a narrow model of a plan before CAL_VERSION 14)."""
    runs = [x for x in (_by(results, m["key"]), _by(results, again) if again else {})
            if all(f"pp{n}" in x for n in MM_COLS)]
    if not runs:
        return {}
    mats = [g for g in sh.groups if not g.output]
    body = [g.split()[0] for g in mats]
    o_mv = _once_mv(sh, mv, row)
    units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
    out = {}
    for n in MM_COLS:     # one graph of n tokens: a decode step's nodes, the output head once
        t = sum(_median_s(r[f"pp{n}"]["ns"]) for r in runs) / len(runs) - sh.nodes_pp * cal.node_tg_s \
            - cal.token_tg_s - o_mv - _prompt_attn_f16(cal, units, n)
        if t <= 0:
            raise Disturbed(f"of {m['type']} weights measured no cost for a {n}-column mat-mul ({m['key']})")
        out[str(n)] = (sum(g.bytes for g in body), sum(g.rows for g in body), t)
    return out


def _once_mv(sh, mv: float, row: float) -> float:
    """What a calibration model's prompt computes for its last token only, as one mat-vec: the output head and the
    last layer's feed-forward matrices (WeightGroup.tail_*)."""
    return sum(g.bytes * mv + g.rows * row if g.output else g.tail_bytes * mv + g.tail_rows * row for g in sh.groups)


def _solve_matmul(key: str, wide: tuple[int, int, float], narrow: tuple[int, int, float] | None) -> tuple[float, float]:
    """(seconds per FLOP, seconds per dot product) of a type's mat-mat, from the seconds each prompt column costs on
    the wide and the narrow model (params, rows, seconds per column): slope = 2 x params x c_flop + rows x c_dot.
    ggml-cpu's mat-mat for a type llamafile's sgemm does not take (q4_1, the K-quants unrepacked) is the mat-vec's
    dot product once per row and column (ggml-cpu.c, ggml_compute_forward_mul_mat_one_chunk, 16 x 16 blocks), so a
    narrow model's short rows cost more per FLOP: on two threads of the 2-vCPU EPYC VM SmolLM2's widths ran its
    q4_1 prompt 23 % slower per byte than the wide model's (bench/README.md, the speed model).  As for the mat-vec,
    a dot cost that noise makes negative is zero (the wide model then prices its FLOPs alone)."""
    pw, rw, sw = wide
    if narrow is None:
        return sw / (2.0 * pw), 0.0
    pn, rn, sn = narrow
    det = 2.0 * pw * rn - 2.0 * pn * rw
    dot = (2.0 * pw * sn - 2.0 * pn * sw) / det if det else 0.0
    if dot <= 0:
        return sw / (2.0 * pw), 0.0
    flop = (sw - rw * dot) / (2.0 * pw)
    if flop <= 0:
        raise Disturbed(f"of {key} weights measured dot products that cost more than the wide model's whole prompt")
    return flop, dot


def _decode_rest(r: dict[str, dict], sh, cal: Calibration) -> float:
    """A weight model's decode time per token (of the tokens its step timed) less what is not its matrices: the
    graph's nodes, the token's own cost and the f16 attention at the decode's mean depth."""
    from edgekv.core.speed import attn_units_tg

    f16 = kv_key("f16", "f16", "auto")
    n_tokens = int(r["tg"]["n"])
    return _median_s(r["tg"]["ns"]) / n_tokens - sh.nodes_tg * cal.node_tg_s - cal.token_tg_s \
        - attn_units_tg(sh, n_tokens / 2, cal.n_threads, not cal.device) * cal.attn_tg_s.get(f16, 0.0)


def _decode_of(results: list[dict], m: dict[str, Any], feats: list[str], repack: bool, cal: Calibration,
               wide_keys: set[str], again: str = "") -> tuple[Any, float]:
    """(speed shape, decode time of its matrices) of a type's narrow or large weight model, whose matrices the CPU
    backend must hold as it holds the wide model's (``wide_keys``), or the two do not measure the same kernel;
    ``again``: the key under which the same model was timed a second time (the mean of both is taken)."""
    r = _by(results, m["key"])
    sh = _probe_shape(m["model_path"], r["tg"]["graph"], feats, repack)
    keys = {g.key for g in sh.groups}
    if keys != wide_keys:
        raise CalibrationError(f"the {m['key']} weight model is held as {', '.join(sorted(keys))}, not as "
                               f"{', '.join(sorted(wide_keys))}: it does not time the same kernel")
    ts = [_decode_rest(x, sh, cal) for x in (r, _by(results, again) if again else {}) if "tg" in x]
    return sh, sum(ts) / len(ts)


def _stream_coefficients(results: list[dict], m: dict[str, Any], more: list[dict[str, Any] | None], feats: list[str],
                         repack: bool, cal: Calibration, wide_keys: set[str]) -> tuple[float, float]:
    """(seconds per byte, seconds per row) of a type's large weight models' decodes (less their nodes, token and
    attention): the rate llama.cpp streams that type's matrices from memory, or computes them where that is
    slower.  With the narrow and the big large model (``more``; None where a plan lacks one) bytes + rows fitted
    by least squares over all of them (STREAM_BIG_WIDTHS; two models: the exact solve); with none (a plan before
    CAL_VERSION 10) the bytes alone."""
    pts = []
    for x in [m, *(x for x in more if x)]:
        sh, t = _decode_of(results, x, feats, repack, cal, wide_keys)
        if t <= 0:
            raise Disturbed(f"of {m['type']} weights' large model {x['key']} measured no cost for reading them")
        pts.append((sum(g.bytes for g in sh.groups), sum(g.rows for g in sh.groups), t))
    if len(pts) == 1:
        return pts[0][2] / pts[0][0], 0.0
    return _fit_bytes_rows(f"{m['type']} (from memory)", pts)


def _fit_bytes_rows(key: str, pts: list[tuple[int, int, float]]) -> tuple[float, float]:
    """(seconds per byte, seconds per row) fitted by least squares to models' (bytes, rows, seconds), each weighed
    by its own time (relative residuals); a row cost the noise makes negative is zero (the first model's time
    over its bytes, as _solve_bytes_rows)."""
    import numpy as np

    a = np.array([[b / t, r / t] for b, r, t in pts], dtype=np.float64)
    (per_byte, row), *_ = np.linalg.lstsq(a, np.ones(len(pts)), rcond=None)
    if row <= 0:
        per_byte, row = pts[0][2] / pts[0][0], 0.0
    if per_byte <= 0:
        raise Disturbed(f"of {key} weights measured rows that cost more than a large model's whole decode")
    return float(per_byte), float(row)


def _solve_matvec(key: str, wide: tuple[Any, float], narrow: tuple[Any, float] | None) -> tuple[float, float]:
    """(seconds per byte, seconds per row) of a type's mat-vec: from the wide model alone (no row term: a GPU) or
    from the wide and the narrow model's decodes, t = bytes x c_byte + rows x c_row.  A row cost the machine's noise
    makes negative is zero (the wide model then prices its bytes alone); a byte cost at or below zero is refused."""
    (sw, tw), (sn, tn) = wide, narrow or (None, 0.0)
    return _solve_bytes_rows(key, (sum(g.bytes for g in sw.groups), sum(g.rows for g in sw.groups), tw),
                             (sum(g.bytes for g in sn.groups), sum(g.rows for g in sn.groups), tn) if narrow else None)


def _solve_bytes_rows(key: str, wide: tuple[int, int, float],
                      narrow: tuple[int, int, float] | None) -> tuple[float, float]:
    """(seconds per byte, seconds per row) from a wide and a narrow model's (bytes, rows, seconds): t = bytes x
    c_byte + rows x c_row (:func:`_solve_matvec`)."""
    bw, rw, tw = wide
    if tw <= 0:
        raise Disturbed(f"of {key} weights measured no cost for reading them")
    if narrow is None:
        return tw / bw, 0.0
    bn, rn, tn = narrow
    if tn <= 0:
        raise Disturbed(f"of {key} weights' narrow model measured no cost for reading them")
    det = bw * rn - bn * rw
    row = (bw * tn - bn * tw) / det
    if row <= 0:
        return tw / bw, 0.0
    per_byte = (tw - rw * row) / bw
    if per_byte <= 0:
        raise Disturbed(f"of {key} weights measured rows that cost more than the wide model's whole decode")
    return per_byte, row


def _attn_needed(cal: Calibration, pairs: Iterable[tuple[str, str, str]],
                 geometries: Iterable[str | None]) -> dict[str | None, list[tuple[str, str, str]]]:
    """Per geometry (None: the generic model), the K/V pairs not calibrated yet."""
    out: dict[str | None, list[tuple[str, str, str]]] = {}
    for g in dict.fromkeys(geometries):
        want = [p for p in dict.fromkeys(pairs) if kv_key(*p, g) not in cal.attn_tg_s
                or (tiled_prompt_path(*p, cal.device) and (kv_key(*p, g) not in cal.attn_pp_rows_s
                                                           or (g is not None and kv_key(*p, g) not in cal.attn_pp_deep_s)))]
        if want:
            out[g] = want
    return out


def _types_needed(cal: Calibration, weight_types: Iterable[str], cpu_features: list[str], repack: bool) -> list[str]:
    """Weight types (ggml names) whose key, as the CPU backend would hold the calibration model's matrices (a GPU
    calibration: as the type itself), is not calibrated yet."""
    from edgekv.core.memmodel import extra_buffer_of, extra_buffer_types

    out = []
    extra = extra_buffer_types(cpu_features, repack)
    for t in dict.fromkeys(x.lower() for x in weight_types):
        k = t if cal.device else weight_key(t, extra_buffer_of(_Probe(t, weight_shape(t)), extra, cpu_features))
        row_missing = not cal.device and (k not in cal.matvec_s_per_row or k not in cal.matvec_stream_s_per_byte
                                          or k not in cal.matvec_stream_s_per_row or k not in cal.matmul_s_per_dot
                                          or k not in cal.matcols_s_per_row)
        if k not in cal.matmul_s_per_flop or k not in cal.matcols_s_per_byte or row_missing:
            out.append(t)
    return out


@dataclass(frozen=True)
class _Probe:
    """A calibration matrix as memmodel's eligibility rules see it (n_embd x n_ff of the type)."""

    type_name: str
    shape_d: dict

    @property
    def name(self) -> str:
        return "blk.0.ffn_up.weight"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.shape_d["n_embd"], self.shape_d["n_ff"])

    @property
    def ggml_type(self) -> int:
        from gguf import GGMLQuantizationType

        return int(GGMLQuantizationType[self.type_name.upper()])

    @property
    def n_bytes(self) -> int:
        return 0


def _read_cache(path, key: str, refresh: bool) -> tuple[Calibration | None, str, list[dict]]:
    """The cached calibration when it was taken in this environment (None when absent, stale, unreadable or
    ``refresh``), the note that says why a cached one was not used, and its raw timings (the drift sentinel's
    reference)."""
    cal, note, raw = None, "", []
    if not refresh:
        try:
            c = json.loads(path.read_text())
            if c.get("key") == key:
                cal = Calibration.from_dict(c["calibration"])
                raw = c["raw"] if isinstance(c.get("raw"), list) else []
            else:
                note = "the calibration was taken in another environment (its fingerprint changed): re-measured"
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            note = f"the calibration in {path} was unreadable: re-measured"
    return cal, note, raw


def check_drift(raw: list[dict], weight_type: str, n_threads: int, repack: bool, run: Runner,
                device: str = "") -> float | None:
    """How long the calibration's own decode of its ``weight_type`` weight model takes now, as a multiple of the time
    it took when calibrated (``raw``: the calibration's timings); None when the calibration holds no such timing."""
    name = f"w_{weight_type.lower()}"
    then = [r for r in raw if isinstance(r, dict) and r.get("model") == name and r.get("step") == "tg" and r.get("ns")]
    if not then:
        return None
    from edgekv.edges.tinymodel import drop_plan_models

    plan = [_wide_model(weight_type, n_threads, repack, device)]     # the wide model alone: no 384 MB model written
    ctx = plan[0]["contexts"][0]
    ctx["steps"] = [st for st in ctx["steps"] if st["key"] == "tg"]      # its decode step alone
    try:
        now = _by(run(plan, None), name).get("tg")
    finally:
        drop_plan_models(plan)
    if not now or not now.get("ns"):
        return None
    return _median_s(now["ns"]) / _median_s(then[-1]["ns"])


def _now() -> float:
    return time.time()


def _verified_path(path):
    """Where the calibration cached at ``path`` records when it was last measured or found to hold (a file of its
    own: rewriting the calibration's file for that could lose what another edgekv process cached meanwhile)."""
    return path.with_name(path.stem + "-verified.json")


def _verified_recently(path, cal_id: str) -> bool:
    """Whether calibration ``cal_id``, cached at ``path``, was measured or found to hold by its sentinel within
    DRIFT_RECHECK_S."""
    try:
        v = json.loads(_verified_path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(v, dict) or v.get("id") != cal_id:
        return False
    t = v.get("unix")
    return isinstance(t, (int, float)) and 0 <= _now() - t < DRIFT_RECHECK_S


def _mark_verified(path, cal_id: str) -> None:
    """Record that calibration ``cal_id`` (cached at ``path``) was measured or found to hold now; OSError when it
    cannot be written."""
    write_json(_verified_path(path), {"id": cal_id, "unix": _now()})


def _drifted(cal: Calibration, raw: list[dict], sentinel: str, n_threads: int, repack: bool, run: Runner,
             device: str, path=None) -> str:
    """Why the cached ``cal`` is measured again (the machine now runs its sentinel DRIFT_LIMIT faster or slower), or
    "" when it still holds (measured or checked within DRIFT_RECHECK_S: not timed again; found to hold: ``path``,
    its cache file, says so)."""
    if path is not None and _verified_recently(path, cal.id):
        return ""
    try:
        ratio = check_drift(raw, sentinel, n_threads, repack, run, device)
    except CalibrationError:
        return ""
    if ratio is None or abs(ratio - 1.0) <= DRIFT_LIMIT:
        if ratio is not None and path is not None:
            with contextlib.suppress(OSError):      # not recorded: the next run times it again
                _mark_verified(path, cal.id)
        return ""
    # the limit is on the time, so the words are too: "18 % slower" of a decode that took 1.22x the time read as
    # within a limit of 20 %
    return (f"this machine now takes {ratio:.2f}x the time to decode the calibration's {sentinel} weight model that it "
            f"took when it was calibrated ({cal.id}; more than ±{100 * DRIFT_LIMIT:.0f} % apart): re-measured")


def _still_holds(cal: Calibration, note: str, measure: bool, sentinel: str | None,
                 drifted: Callable[[str], str]) -> tuple[Calibration | None, str]:
    """The cached ``cal`` when it may be used (None: measure again) and the note: a busy calibration is measured
    again, or (measuring off) used and named; one whose ``sentinel`` weight type now decodes DRIFT_LIMIT faster or
    slower (``drifted``) is measured again."""
    if cal.busy:
        if measure:     # never reuse figures a busy machine gave: this run measures again
            return None, "the cached calibration was taken while other work used the CPUs: re-measured"
        return cal, (f"the cached calibration was taken while other work used the CPUs and {SPEED_CALIBRATE_ENV}=cached: "
                     "its predictions are marked; 'edgekv calibrate' re-measures")
    if measure and sentinel and sentinel in cal.matvec_s_per_byte:
        why = drifted(sentinel)
        if why:
            return None, why
    return cal, note


def _named(cal: Calibration | None, key: str, n_threads: int, runtime: str, device: str = "") -> Calibration:
    """``cal``, or a new one with nothing measured yet, with its machine (and GPU) and runtime named."""
    if cal is None:
        # the key's head, the second, and 4 random hex digits: two calibrations begun in the same second (two edgekv
        # processes) are two, and never merge each other's coefficients (_merge_cached)
        cal = Calibration(id=key[:12] + time.strftime("-%Y%m%d%H%M%S-") + secrets.token_hex(2), n_threads=n_threads,
                          node_tg_s=0.0, node_pp_s=0.0, runtime=runtime, device=device)
    if not cal.machine:     # calibrations cached before the field existed name their machine too
        from edgekv.edges.environment import cpu_model, nvidia_info

        cal.machine = f"{cpu_model()}, {n_threads} thread{'s' if n_threads != 1 else ''}"
        if device:
            names = [str(d.get("name")) for d in (nvidia_info() or {}).get("devices") or [] if d.get("name")]
            cal.machine = f"{device} ({', '.join(names) or 'GPU'}) every layer offloaded; host {cal.machine}"
    return cal


def _uncached_error(new: bool, want: dict[str | None, list[tuple[str, str, str]]],
                    want_types: list[str]) -> CalibrationError:
    """The refusal when measuring is off (EDGEKV_SPEED_CALIBRATE=cached) and something asked for is not cached."""
    what = ["this machine"] if new else [kv_key(*p, g) for g, ps in want.items() for p in ps] + want_types
    named = ", ".join(what[:3]) + (f" and {len(what) - 3} more" if len(what) > 3 else "")
    return CalibrationError(f"no speed calibration of {named} here yet")


def _measure_missing(cal: Calibration, new: bool, want: dict[str | None, list[tuple[str, str, str]]],
                     want_types: list[str], n_threads: int, repack: bool, feats: list[str],
                     progress: Callable[[str], None] | None, run: Runner = _run,
                     want_bodies: list[str] = (), interleave: bool = False) -> list[dict]:
    """Measure what is missing (one child per plan) and solve it into ``cal`` in dependency order: the attention
    pairs first, then the graph nodes (which subtract the f16 attention) and bandwidth, then the weight types, then
    (a GPU) the logits' copy and the node cost at each model's widths (which subtract Q8_0's weights).  Returns the
    probe's own timings (kept beside the coefficients, the evidence they were solved from)."""
    from edgekv.edges.tinymodel import drop_plan_models, sweep_speed_models

    sweep_speed_models()        # what killed calibrations and older versions left in the speed folder
    ran: list[dict[str, Any]] = []      # every plan's models: their files (cut to headers) are deleted at the end
    try:
        return _measure_plans(cal, new, want, want_types, n_threads, repack, feats, progress, run, want_bodies,
                              interleave, ran)
    finally:
        drop_plan_models(ran)


def _measure_plans(cal: Calibration, new: bool, want: dict[str | None, list[tuple[str, str, str]]],
                   want_types: list[str], n_threads: int, repack: bool, feats: list[str],
                   progress: Callable[[str], None] | None, run: Runner, want_bodies: list[str], interleave: bool,
                   ran: list[dict[str, Any]]) -> list[dict]:
    from edgekv.edges.bandwidth import read_bandwidth

    dev, raw, base = cal.device, [], []
    if new or want:
        plan = base_plan(n_threads, repack, dev) if new else []
        for g, ps in want.items():
            plan += attn_plan(ps, n_threads, repack, g, dev, interleave=interleave)
        ran += plan
        res = run(plan, progress)
        raw += res
        base = res
        for g, ps in want.items():
            for p in ps:
                k = kv_key(*p, g)
                cal.attn_tg_s[k], cal.attn_pp_s[k] = solve_attn(res, k, n_threads, dev)
                if tiled_prompt_path(*p, dev):
                    cal.attn_pp_rows_s[k] = solve_attn_rows(res, k, dev)
                    if g is not None:
                        cal.attn_pp_deep_s[k] = solve_attn_deep(res, k)
                    if not dev:     # the coefficients per row of full tiles, each step's own tiles taken out
                        share = cal.attn_pp_tile_share[k] = solve_tile_share(res, k, n_threads)
                        h = geometry_shape(g)["n_head"]
                        cal.attn_pp_s[k] /= tile_factor(share, attn_steps(g, True).pp_n, h, n_threads)
                        if k in cal.attn_pp_deep_s:
                            deep = cal.attn_pp_tile_share_deep[k] = solve_tile_share(res, k, n_threads, deep=True)
                            cal.attn_pp_deep_s[k] /= tile_factor(deep, DEEP_PP_N, h, n_threads)
        if new:
            f16 = kv_key("f16", "f16", "auto")
            (cal.node_tg_s, cal.node_pp_s, cal.token_tg_s, cal.ubatch_pp_s,
             short) = solve_nodes(res, cal.attn_tg_s.get(f16, 0.0), cal.attn_pp_s.get(f16, 0.0),
                                  cal.attn_pp_rows_s.get(f16, 0.0))
            cal.node_pp_short_s = 0.0 if dev else short     # a GPU prices nodes at the model's own widths
            if dev:     # the host's bandwidth is not the GPU's, and edgekv has no GPU copy of its own to time
                cal.notes.append(f"roofline: {dev}'s read bandwidth is not measured (no decode bound on a GPU)")
            else:
                cal.bandwidth_bytes_s = read_bandwidth(n_threads)
    if want_types:
        plan = weight_plan(want_types, n_threads, repack, dev)
        ran += plan
        try:
            res = run(plan, progress)
        except CalibrationError as e:
            if raw and not dev:     # what was measured before is kept (a GPU's logits copy needs its Q8_0 first)
                raise PartlyMeasured(str(e), cal, raw) from None
            raise
        raw += res
        solve_weights(res, plan, cal, feats, repack)     # reads the models' headers
    if dev and new:
        cal.vocab_tg_s = solve_vocab(base, cal)
    if want_bodies:
        plan = body_plan(want_bodies, n_threads, repack)
        ran += plan
        res = run(plan, progress)
        raw += res
        solve_bodies(res, plan, cal)
    return raw


def _measure_or_again(cal: Calibration, *args: Any, **kw: Any) -> tuple[Calibration, list[dict], str]:
    """_measure_missing, and once more from ``cal`` as it was when a difference came out as other work hides one (a
    deeper cache or graph measured no slower: Disturbed): a compiler or a test on the same cores for a few seconds is
    not a reason to fail (on 28 Nov a fresh-clone CI beside a build of llama-bench on the same two cores refused f16's
    short prompt so).  A second disturbance is the error.  Returns (the calibration measured into, the raw timings,
    a note for the output saying what disturbed the first try, or "")."""
    before = copy.deepcopy(cal)
    try:
        return cal, _measure_missing(cal, *args, **kw), ""
    except Disturbed as e:
        return before, _measure_missing(before, *args, **kw), \
            f" (the first try was disturbed: the speed calibration {e.what}; measured again)"


def _check_load(cal: Calibration, load: dict[str, Any], allow_busy: bool) -> str:
    """Refuse a calibration taken while other work used the CPUs, or (``allow_busy``) note it in ``cal``; returns
    what the output adds ("" when the machine was quiet)."""
    if load.get("busy") and not allow_busy:
        raise CalibrationError(f"the speed calibration ran while other work used "
                               f"{100 * load.get('others_share_max', 0):.0f} % of the CPUs: not cached; run it again "
                               "on a quiet machine ('edgekv calibrate')")
    if not load.get("busy"):
        return ""
    cal.notes.append(f"busy: other work used {100 * load.get('others_share_max', 0):.0f} % of the CPUs")
    return (f" while other work used {100 * load.get('others_share_max', 0):.0f} % of the CPUs: its predictions are "
            "marked, and the next run measures again")


def _measured(new: bool, want: dict[str | None, list[tuple[str, str, str]]], want_types: list[str],
              want_bodies: list[str], device: str) -> str:
    """What a calibration run measures, in words: "graph nodes, bandwidth, f16/f16/fa=auto, q4_1"."""
    return ", ".join(x for x in ([("graph nodes" + ("" if device else ", bandwidth"))] if new else [])
                     + [", ".join(kv_key(*p, g) for p in ps) for g, ps in want.items()]
                     + ([", ".join(want_types)] if want_types else [])
                     + ([f"widths {', '.join(want_bodies)}"] if want_bodies else []))


def _keep_partial(e: PartlyMeasured, load: dict[str, Any], path, key: str, fp: dict[str, Any], new: bool,
                  want: dict[str | None, list[tuple[str, str, str]]], want_types: list[str]) -> CalibrationError:
    """The error of a run whose weight models failed, the graph nodes and attention it measured before that cached
    (not when other work used the CPUs meanwhile, nor when the cache cannot be written): the next run measures only
    the weight types."""
    kept = _measured(new, want, [], [], e.cal.device)
    if load.get("busy"):
        return CalibrationError(f"{e}; what it measured before ({kept}) is not cached: other work used the CPUs")
    try:
        _cache(path, key, fp, e.cal, e.raw)
    except OSError as w:
        return CalibrationError(f"{e}; what it measured before ({kept}) is not cached either ({w.strerror})")
    return CalibrationError(f"{e}; what it measured before ({kept}) is cached: the next run measures "
                            f"{', '.join(want_types)} alone")


def calibrate(n_threads: int, repack: bool = True, weight_types: Iterable[str] = (),
              kv_pairs: Iterable[tuple[str, str, str]] = (), cpu_features: list[str] | None = None,
              refresh: bool = False, progress: Callable[[str], None] | None = None,
              allow_busy: bool = False, geometries: Iterable[str] = (), measure: bool = True,
              llama_bench: str | None = None, device: str = "", bodies: Iterable[str] = (),
              sentinel: str | None = None, deadline: float | None = None) -> SpeedCalibration:
    """The cached calibration for this environment, thread count and --repack, with every weight type and K/V pair
    (for each attention geometry in ``geometries``) asked for measured (only what is missing is measured;
    everything when absent, stale or ``refresh``).  ``measure`` False: only what is cached, and CalibrationError
    naming what is missing (EDGEKV_SPEED_CALIBRATE=cached).  ``llama_bench``: measured through the user's own
    llama-bench at that path, cached apart (keyed by that binary).  ``device``: a GPU calibration, every layer of
    every calibration model offloaded to that ggml device (CUDA0, Metal), cached apart (keyed by it, the cards
    and their driver); ``bodies``: the widths (edgekv.core.speed.body_geometry) of the models it will predict, whose
    node cost a GPU calibration measures on a probe of those widths.  ``sentinel``: a weight type whose decode is
    timed again to check that a cached calibration still describes the machine (DRIFT_LIMIT; only when measuring)."""
    from edgekv.edges.load import LoadMonitor

    key, fp = _key(n_threads, repack, llama_bench, device)
    path = _path(n_threads, repack, llama_bench, device)
    cal, note, raw = _read_cache(path, key, refresh)
    if cal is not None:
        cal, note = _still_holds(cal, note, measure, sentinel,
                                 lambda t: _drifted(cal, raw, t, n_threads, repack, _runner(llama_bench), device, path))
    feats = list(cpu_features or [])
    pairs = list(kv_pairs) or [(k, v, "auto") for k, v in DEFAULT_KV]
    new = cal is None
    cal = _named(cal, key, n_threads, runtime_name(llama_bench), device)
    want = _attn_needed(cal, pairs, list(geometries))
    if new:     # the generic model's f16: what the node and weight models' own attention costs
        want.setdefault(None, []).append(("f16", "f16", "auto"))
    want_bodies = [b for b in dict.fromkeys(bodies) if b and b not in cal.node_tg_body_s] if device else []
    # the logits' copy and the body probes subtract Q8_0 weights: a GPU calibration measures that type first
    want_types = _types_needed(cal, list(weight_types) + (["q8_0"] if device and (new or want_bodies) else []), feats,
                               repack)
    if not new and not want and not want_types and not want_bodies:
        return SpeedCalibration(cal, False, note)
    if not measure:
        raise _uncached_error(new, want, want_types + want_bodies)
    mon = LoadMonitor(before_s=0.3)
    mon.start()
    t0 = time.monotonic()
    # edgekv's own probe takes each attention difference's depths in turn (two sequences of one context)
    try:
        cal, raw, again = _measure_or_again(cal, new, want, want_types, n_threads, repack, feats, progress,
                                            _runner(llama_bench), want_bodies, interleave=llama_bench is None)
    except PartlyMeasured as e:
        raise _keep_partial(e, mon.stop(), path, key, fp, new, want, want_types) from None
    load = mon.stop()
    measured = "measured " + _measured(new, want, want_types, want_bodies, device) + \
        f" in {time.monotonic() - t0:.0f} s{again}"
    measured += _check_load(cal, load, allow_busy)
    try:
        _cache(path, key, fp, cal, raw)
    except OSError as e:
        note = (note + "; " if note else "") + f"not cached ({e.strerror})"
    return SpeedCalibration(cal, True, "; ".join(x for x in (note, measured) if x))


def _cache(path, key: str, fp: dict[str, Any], cal: Calibration, raw: list[dict]) -> None:
    """Write ``cal`` and its timings ``raw`` to the cache at ``path``, with what another process cached meanwhile
    (_merge_cached); OSError when it cannot be written."""
    raw = _merge_cached(cal, path, key) + raw
    write_json(path, {"key": key, "fingerprint": fp, "calibration": cal.to_dict(), "raw": raw})
    _mark_verified(path, cal.id)        # just measured: the drift sentinel need not time it for DRIFT_RECHECK_S


def _merge_cached(cal: Calibration, path, key: str) -> list[dict]:
    """Keep what another edgekv process cached meanwhile for the same calibration (two predictions that each
    measured a different type must not erase each other's): its coefficients this run did not measure.  Returns
    the cached file's raw timings of the same calibration (to keep beside this run's)."""
    try:
        c = json.loads(path.read_text())
        other = Calibration.from_dict(c["calibration"]) if c.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if other is None or other.id != cal.id:
        return []
    for name in ("matvec_s_per_byte", "matvec_s_per_row", "matvec_stream_s_per_byte", "matvec_stream_s_per_row",
                 "matmul_s_per_byte",
                 "matmul_s_per_flop", "matmul_s_per_dot", "matcols_s_per_byte", "matcols_s_per_row", "attn_tg_s",
                 "attn_pp_s", "attn_pp_rows_s",
                 "attn_pp_deep_s", "attn_pp_tile_share", "attn_pp_tile_share_deep",
                 "node_tg_body_s", "node_pp_body_s"):
        mine = getattr(cal, name)
        for k, v in getattr(other, name).items():
            mine.setdefault(k, v)
    cal.notes.extend(n for n in other.notes if n not in cal.notes)
    raw = c.get("raw")
    return raw if isinstance(raw, list) else []


def cached(n_threads: int, repack: bool = True, llama_bench: str | None = None, device: str = "") -> Calibration | None:
    key, _fp = _key(n_threads, repack, llama_bench, device)
    try:
        c = json.loads(_path(n_threads, repack, llama_bench, device).read_text())
        return Calibration.from_dict(c["calibration"]) if c.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
