"""The speed calibration's probe plans: which models edgekv writes, which contexts and steps each is timed by.

Every constant below trades calibration time against the spread of what it solves; docs/calibration-history.md
says, for each, what was measured to choose it.  A plan is a list of :class:`edgekv.core.probe.ProbeModel`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from gguf import GGMLQuantizationType

from edgekv.calibration.speedcal.errors import CalibrationError
from edgekv.core.cachetypes import ggml_type_info
from edgekv.core.probe import ProbeContext, ProbeModel, ProbeParams, ProbeStep
from edgekv.core.speed import (
    GEOMETRY_MAX_EMBD,
    NODE_PP_TOKENS,
    TILED_DEEP_DEPTHS,
    TILED_SHALLOW_END,
    kv_key,
    row_loop_path,
    split_kv_path,
    tiled_prompt_path,
)
from edgekv.machine.environment import default_threads, last_level_cache_bytes
from edgekv.sources.tinymodel import plan_model

# 12 layers: enough K/V at depth that the cache is read the way a real model's is (a 2-layer model's cache sits in
# the L2 cache and its attention runs faster per cell than a real model's); narrow matrices so the fill stays quick
ATTN_SHAPE = {"n_embd": 512, "n_ff": 256, "n_layer": 12, "n_head": 8, "n_head_kv": 2, "mat_type": "Q8_0"}
NODE_SHAPES = {"nodes_a": {"n_embd": 64, "n_ff": 128, "n_layer": 2, "n_head": 2, "n_head_kv": 2, "mat_type": "Q8_0"},
               "nodes_b": {"n_embd": 64, "n_ff": 128, "n_layer": 34, "n_head": 2, "n_head_kv": 2, "mat_type": "Q8_0"}}
ATTN_TG_DEPTHS = (640, 1664)   # both in the split-KV regime of an f16 cache (a view of 512 cells or more)
ATTN_PP_DEPTHS = (0, TILED_SHALLOW_END)
# the tiled kernel deep in the cache (F16/F32 pairs on the CPU): a 512-token prompt (llama.cpp's default ubatch) at
# TILED_DEEP_DEPTHS on a one-layer model of the geometry (the cost per cell there is a layer's own; one layer keeps
# the fill quick); five runs at each depth, since three runs of one depth can move together from minute to minute
DEEP_PP_N = 512
DEEP_LAYERS = 1
DEEP_REPS = 5
# a layer of 32 x (128 + 128) heads: the most attention work a cell that a layer does in a calibration that keeps its
# full form.  A geometry whose layer does more takes fewer layers in its model (geometry_shape) and fewer deep runs
# (at least 3), each of them that much longer: the same timed work
WIDE_LAYER_UNITS = 32 * 2 * 128
ATTN_PP_N = 256
PP_ROWS_N = 32            # a prompt under edgekv.core.speed.FA_TILE_Q tokens: an F16/F32 cache's per-row loop
# A pair whose prompts run llama.cpp's per-query-row flash-attention loop at every size (row_loop_path) costs the
# same per row and cell from 32 to 256 tokens, so its prompt steps are ROW_LOOP_PP_N tokens; its decode steps start
# at ROW_LOOP_TG_START (they have no split-KV regime to reach, and filling a cache runs that same slow loop over every
# cell before it).  Its prompts stay on the geometry's own model: run after the evicting decode steps they came out
# cheaper a cell than on their own model
ROW_LOOP_PP_N = 64
ROW_LOOP_TG_START = 128
# a prompt of one and a half query tiles a head: every head's second tile is short (more so where llama.cpp's chunks
# cut it), beside ATTN_PP_N's on the same depths the tiled kernel's cost per tile separates from its cost per row
PT_N = 96
# runs of each of a pair's prompt steps (edgekv's own probe).  The tile share is the ratio of the long and the
# short-tile prompt's differences, which a slower stretch of the machine starting between the two steps moved by a
# third: they are taken in one turn, five runs each rather than three (docs/calibration-history.md, version 22)
PP_TURN_REPS = 5
# a geometry's model: six layers, fewer where six would do more attention work per cell than six of WIDE_LAYER_UNITS:
# its decode steps cannot shrink below a 256-cell difference (attn_steps), so more work a cell is more time, not more
# signal
GEOMETRY_LAYERS = 6
TG_N = 32                 # generated tokens per timed decode run (5 runs per attention step, the median kept)
PP_SHORT_N, PP_N = NODE_PP_TOKENS
MM_N = (256, 32)
MM_REPS = 2               # a compute-bound prompt over a weight model repeats within about 1 %: two runs suffice
# the weight models' decodes: the mat-vec's cost per row is solved from the narrow and the wide model's decodes,
# which differ by about a fifth, so their medians need more runs than a difference of that size would alone
WEIGHT_TG_REPS = 11
MM_COLS = (2, 4)          # a ubatch of a few columns: -npl sequences decoding together (one timed graph per run)
MM_COLS_REPS = 9
WEIGHT_TARGET_BYTES = 48 * 1024 * 1024
# the CPU mat-vec's cost per row: a second weight model of each type, of about the same bytes in rows of 512
# elements (the wide model's are 1024 and 4096): twice the rows per byte.  Bytes alone mispriced narrow models
NARROW_WIDTHS = {"n_embd": 512, "n_ff": 2048, "n_head": 8}
# and the rate it streams a type from memory: the wide widths, far larger than a large last-level cache; 4 runs of 8
# tokens, no warm-up (the model's pages were just written, and repacked types are copied at load)
STREAM_TARGET_BYTES = 384 * 1024 * 1024
STREAM_N = 8
STREAM_REPS = 4
# and its cost per row while it streams: a narrow 384 MB model of rows of 512 (ffn_down's of 8192, so that it takes
# tens of layers, not hundreds of small ones)
STREAM_NARROW_WIDTHS = {"n_embd": 512, "n_ff": 8192, "n_head": 8}
# and a third of an 8B model's widths (a few layers of large matrices): bytes + rows solved from the two
# small-matrix models alone priced large matrices too slowly
STREAM_BIG_WIDTHS = {"n_embd": 4096, "n_ff": 12288, "n_head": 32}
# A GPU calibration (every layer offloaded): a GPU reads 48 MB in microseconds, less than the graph's own launches, so
# its weight models are wide and about 1 GiB (the bytes then dominate a token), and its attention differences span
# 15K cells (a tiny model's cache at 1K cells is read in a microsecond); filling 16K cells takes a GPU under a second
DEVICE_WEIGHT_TARGET_BYTES = 1024 * 1024 * 1024
DEVICE_ATTN_TG_DEPTHS = (1024, 16384)
DEVICE_ATTN_PP_DEPTHS = (0, 8192)
# a GPU returns every decoded token's logits to the host: a narrow model with a 262144-entry vocabulary beside nodes_a
VOCAB_SHAPE = {**NODE_SHAPES["nodes_a"], "n_vocab": 262144}
BODY_PP_N = 512
# A real model's weights stream through the CPU's caches between one token's read of a layer's K/V and the next
# token's, so its decode reads the cache from memory; the geometry models' narrow matrices would leave their K/V in
# the last-level cache.  On the CPU a geometry's decode steps therefore run on a copy of its model whose output head
# is EVICT_FACTOR x that cache (the OS's figure, edgekv.machine.environment.last_level_cache_bytes; EVICT_DEFAULT_BYTES
# where it gives none, at most EVICT_MAX_BYTES), read once a token after the last layer
# the head's read from memory spreads each run more than the other steps' five; six in each of the two windows
# (edgekv.calibration.speedcal.windows), twelve in all where one window of nine was taken before
EVICT_TG_REPS = 6
# each evicting run is EVICT_TG_N tokens, not TG_N: most of a run is the head's read, which the difference of two
# depths takes out, so the difference spreads the same with half the tokens in half the time
EVICT_TG_N = 16
# the generic model's decode steps (its f16 cost prices the node and weight models' own attention) likewise
GENERIC_TG_N = EVICT_TG_N
EVICT_FACTOR = 1.25
EVICT_DEFAULT_BYTES = 48 * 1024 * 1024
EVICT_MAX_BYTES = 128 * 1024 * 1024        # a larger head made runs still speeding up over their first several
DEFAULT_KV = (("f16", "f16"), ("q8_0", "q8_0"), ("q5_0", "q5_0"), ("q4_0", "q4_0"))


def weight_shape(type_name: str, device: str = "", narrow: bool = False, stream: bool = False,
                 big: bool = False) -> dict[str, Any]:
    """A llama model of about WEIGHT_TARGET_BYTES of ``type_name`` matrices (n_embd 1024, n_ff 4096; K-quants
    need rows of 256; ``narrow``: NARROW_WIDTHS, for the cost per row; ``stream``: STREAM_TARGET_BYTES of the
    wide widths, for the streaming rate, or with ``narrow`` of STREAM_NARROW_WIDTHS, for its cost per row, or with
    ``big`` of STREAM_BIG_WIDTHS, large matrices); for a GPU (``device``) about DEVICE_WEIGHT_TARGET_BYTES of
    n_embd 4096, n_ff 16384 (heads of 128, which every flash-attention kernel has)."""

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


def context(key: str, n_threads: int, steps: list[ProbeStep], n_ctx: int = 4096, n_batch: int = 512,
            type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto", n_seq: int = 1) -> ProbeContext:
    """A calibration context; ``n_seq`` sequences each get their own KV stream of ``n_ctx`` cells.  Its untimed cache
    fills run on every core llama.cpp would use by default (``fill_threads``: a one-thread calibration would spend
    most of its time filling), its timed runs and their warm-ups on ``n_threads``."""
    return ProbeContext(key=key, n_threads=n_threads, fill_threads=max(n_threads, default_threads()), steps=steps,
                        params=ProbeParams(n_ctx=n_ctx * n_seq, n_batch=n_batch, n_ubatch=n_batch, type_k=type_k,
                                           type_v=type_v, flash_attn=flash_attn, n_seq_max=n_seq))


def step(key: str, test: str, depth: int, n: int, reps: int, warmup: int = 1,
         depths: list[int] | None = None, turn: str = "") -> ProbeStep:
    """A timed step (:class:`edgekv.core.probe.ProbeStep`)."""
    return ProbeStep(key=key, test=test, depth=depth, n=n, reps=reps, warmup=warmup, depths=depths, turn=turn)


def one_cpu_thread(n_threads: int, device: str) -> bool:
    """A CPU calibration on one thread: its steps' constants, chosen at two, shrink (run_tokens, attn_reps)."""
    return not device and n_threads <= 1


def run_tokens(n: int, n_threads: int, device: str = "") -> int:
    """The tokens of a CPU decode step's timed run: ``n`` (the constants above, chosen at two threads), half of it at
    one thread.  One thread takes about twice as long over each token, so its run of half the tokens lasts as long as
    the two-thread run (a run's error is mostly the machine's jitter over its duration)."""
    return max(4, n // 2) if one_cpu_thread(n_threads, device) else n


def attn_reps(reps: int, n_threads: int, device: str = "") -> int:
    """The timed runs of a CPU attention decode or deep prompt step: ``reps`` (chosen at two threads), about half at
    one thread (at least 3, a median's).  One thread's runs spread less, having no barrier between ops."""
    return max(3, (reps + 1) // 2) if one_cpu_thread(n_threads, device) else reps


def attn_units(shape: dict[str, Any]) -> int:
    """Heads x (head_k + head_v) over a calibration model's layers: its attention work per cell."""
    hd = shape.get("head_dim") or shape["n_embd"] // shape["n_head"]
    return shape["n_layer"] * shape["n_head"] * 2 * hd


def n_gpu_layers(device: str) -> int:
    """The calibration models' n_gpu_layers: every layer on the GPU for a device calibration, none otherwise."""
    return -1 if device else 0


def model(key: str, dims: dict[str, Any], contexts: list[ProbeContext], repack: bool, ngl: int = 0,
          file: str | None = None, **more: Any) -> ProbeModel:
    """A plan entry: the calibration model of the shape ``dims`` (named ``file``, default ``key``) and its
    contexts."""
    m = plan_model(file or key, **dims)
    return ProbeModel(key=key, model_path=m["model_path"], write=m["write"], contexts=contexts, repack=repack,
                      n_gpu_layers=ngl, **more)


def base_plan(n_threads: int, repack: bool, device: str = "") -> list[ProbeModel]:
    """The graph nodes' models (and on a GPU the logits' copy)."""
    out = [model(name, shape, [context("f16", n_threads, [step("tg", "tg", 0, 32, 5, 2), step("pp", "pp", 0, PP_N, 3),
                                                          step("ps", "pp", 0, PP_SHORT_N, 5, 2)], n_ctx=1024)],
                 repack, n_gpu_layers(device)) for name, shape in NODE_SHAPES.items()]
    if device:
        out.append(model("nodes_v", VOCAB_SHAPE, [context("f16", n_threads, [step("tg", "tg", 0, 32, 5, 2)], n_ctx=1024)],
                         repack, -1))
    return out


def body_shape(body: str) -> dict[str, Any]:
    """The body probe of a model's widths (edgekv.core.speed.body_geometry: "e576f1536h9kv3d64l30"): a llama model of
    those widths and layers, Q8_0 matrices."""
    m = re.fullmatch(r"e(\d+)f(\d+)h(\d+)kv(\d+)d(\d+)l(\d+)", body)
    if not m:
        raise CalibrationError(f"bad model widths {body!r}")
    e, f, h, kv, d, n = (int(x) for x in m.groups())
    return {"n_embd": e, "n_ff": f, "n_layer": n, "n_head": h, "n_head_kv": kv, "head_dim": d, "mat_type": "Q8_0"}


def body_plan(bodies: Iterable[str], n_threads: int, repack: bool) -> list[ProbeModel]:
    """A GPU calibration's body probes: a decode of 32 tokens and a 512-token prompt at depth 0, every layer offloaded."""
    steps = [step("tg", "tg", 0, TG_N, 5, 2), step("pp", "pp", 0, BODY_PP_N, 9, 2)]
    return [model(f"body_{b}", body_shape(b), [context("f16", n_threads, steps, n_ctx=1024)], repack, -1, body=b)
            for b in bodies]


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
    # at that width, edgekv.sources.tinymodel.weight_rms, the width leaves the cost per cell alone); the feed-forward
    # stays narrow (its width changes nothing there) so that filling the cache stays quick
    per_layer = attn_units({"n_layer": 1, "n_head": h, "head_dim": hk})
    layers = max(1, min(GEOMETRY_LAYERS, GEOMETRY_LAYERS * WIDE_LAYER_UNITS // per_layer))
    return {"n_embd": e, "n_ff": 256, "n_layer": layers, "n_head": h, "n_head_kv": kv, "head_dim": hk,
            "mat_type": "Q8_0"}


def q8_bytes(n: float) -> float:
    """The bytes of ``n`` Q8_0 values."""
    return n * 34 / 32


def stream_bytes(shape: dict[str, Any]) -> float:
    """The bytes of a calibration model's Q8_0 matrices that one decoded token reads (its layers and output head)."""
    e, h, kv, f = shape["n_embd"], shape["n_head"], shape["n_head_kv"], shape["n_ff"]
    hd = shape.get("head_dim") or e // h
    layer = e * h * hd * 2 + e * kv * hd * 2 + 3 * e * f
    return q8_bytes(shape["n_layer"] * layer + e * shape.get("n_vocab", 256))


def evict_vocab(shape: dict[str, Any], llc_bytes: int | None) -> int:
    """The vocabulary whose Q8_0 output head makes a token of the model ``shape`` read EVICT_FACTOR x a last-level
    cache of ``llc_bytes`` (EVICT_DEFAULT_BYTES where None) in all, in whole 256s; 256 where its own matrices
    already do (a wide geometry's)."""
    target = min(EVICT_MAX_BYTES, EVICT_FACTOR * llc_bytes if llc_bytes else EVICT_DEFAULT_BYTES)
    head = target - stream_bytes({**shape, "n_vocab": 0})
    return max(256, -(-int(head / q8_bytes(shape["n_embd"])) // 256) * 256)


def evict_shape(geometry: str) -> dict[str, Any] | None:
    """The model a geometry's decode steps run on (the CPU): geometry_shape with an output head that evicts the
    last-level cache between tokens (evict_vocab) and a Q8_0 token embedding of the same rows, so that the file stays
    small; None where the geometry's own model reads enough to evict it (32 x 128 heads at a hidden size of 4096)."""
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
    generic model's (more heads x head dims over its layers: 32 x 128 heads are s = 4) takes decode depth
    differences 1/s as deep, so that each difference times the same work as the generic model's, and filling the
    cache costs about 1/s^2 as much; its decode steps start at depth ROW_LOOP_TG_START unless split-KV needs a view
    of 512 cells or more (whose differences stay whole 256-cell chunks of the padded view,
    edgekv.core.speed.decode_cells), and its prompts are half as long over a depth difference 2/s as deep (the same
    work again).  A GPU (``device``) takes the DEVICE_ depths for every geometry: its fill is quick and its cells
    cheap."""
    if device:
        return AttnSteps(DEVICE_ATTN_TG_DEPTHS, DEVICE_ATTN_PP_DEPTHS, ATTN_PP_N)
    s = attn_units(geometry_shape(geometry)) / attn_units(ATTN_SHAPE)
    (t0, t1), (p0, p1) = ATTN_TG_DEPTHS, ATTN_PP_DEPTHS
    if s <= 1:
        start = ROW_LOOP_TG_START if rows else t0
        return AttnSteps((start, start + t1 - t0), ATTN_PP_DEPTHS, ROW_LOOP_PP_N if rows else ATTN_PP_N)
    dt = max(256, round((t1 - t0) / s / 256) * 256)
    dp = max(128, round(2 * (p1 - p0) / s / 128) * 128)
    start = t0 if split else ROW_LOOP_TG_START
    return AttnSteps((start, start + dt), (p0, p0 + dp), min(ATTN_PP_N // 2, ROW_LOOP_PP_N) if rows else ATTN_PP_N // 2)


def in_order(steps: list[ProbeStep]) -> list[ProbeStep]:
    """Steps through llama-bench, which has one sequence: in order of depth (the child extends one fill from step to
    step), then each kind's shallowest again (dropping cells costs nothing): each difference is taken shallow, deep,
    shallow, so a machine that slows or speeds up steadily meanwhile does not bias it."""
    again = []
    for kind in ("tg", "pp", "ps", "pt"):
        mine = [st for st in steps if st.key.startswith(kind)]
        if mine:
            first = min(mine, key=lambda st: st.depth)
            again.append(msgspec.structs.replace(first, key=first.key + "b"))
    return sorted(steps, key=lambda st: st.depth) + again


def _pair_steps(tk: str, tv: str, fa: str, a: AttnSteps, n_threads: int, device: str, evict: bool,
                interleave: bool) -> tuple[list[ProbeStep], list[ProbeStep]]:
    """One K/V pair's (decode, prompt) steps over the depths of ``a``: a pair whose long prompts run the tiled kernel
    takes a short prompt ("ps") and one of short tiles ("pt") over the same depths."""
    tiled = tiled_prompt_path(tk, tv, fa, device)
    reps, n_tg = (EVICT_TG_REPS, EVICT_TG_N) if evict else (5, TG_N if device else GENERIC_TG_N)
    n_tg, reps = run_tokens(n_tg, n_threads, device), attn_reps(reps, n_threads, device)
    prompts = [("pp", a.pp_n, True), ("ps", PP_ROWS_N, tiled), ("pt", PT_N, tiled and not device)]
    if interleave:
        tg = [step("tg", "tg", 0, n_tg, reps, depths=list(a.tg_depths))]
        # the long and the short-tile prompt in one turn (PP_TURN_REPS): the tile share is their ratio
        # (solve_tile_share); the short-row prompt after them, on its own
        joint = {"pp", "pt"} if tiled and not device else set()
        pp = [step(k, "pp", 0, n, attn_reps(PP_TURN_REPS, n_threads) if k in joint else 3,
                   depths=list(a.pp_depths), turn="pp" if k in joint else "")
              for k, n, on in (prompts[0], prompts[2], prompts[1]) if on]
    else:
        tg = [step(f"tg{d}", "tg", d, n_tg, reps) for d in a.tg_depths]
        pp = [step(f"{k}{d}", "pp", d, n, 3) for k, n, on in prompts if on for d in a.pp_depths]
    return tg, pp


def attn_plan(pairs: Iterable[tuple[str, str, str]], n_threads: int, repack: bool,
              geometry: str | None = None, device: str = "", interleave: bool = False) -> list[ProbeModel]:
    """The attention steps of each K/V pair at a geometry.  ``interleave`` (edgekv's own probe; llama-bench cannot):
    the shallow and the deep depth as two sequences of one context, their runs taken in turn.  On the CPU a
    geometry's decode steps run on a model whose output head evicts the caches between tokens (evict_shape: model
    "attnv_" + geometry), its prompt steps on the geometry's own model (a prompt reads its cells once per ubatch;
    with that head the prompt's cost per cell came out further from a real model's)."""
    pairs = list(pairs)
    evicting = None if device or geometry is None else evict_shape(geometry)
    ctxs: list[ProbeContext] = []
    ctxs_tg: list[ProbeContext] = []
    for tk, tv, fa in pairs:
        a = attn_steps(geometry, split_kv_path(tk, tv, fa, device), device, row_loop_path(tk, tv, fa, device))
        n_ctx = max(4096, -(-(max(a.tg_depths[1] + TG_N, a.pp_depths[1] + a.pp_n) + 1) // 512) * 512)
        tg, pp = _pair_steps(tk, tv, fa, a, n_threads, device, evicting is not None, interleave)
        for dest, steps in ([(ctxs_tg, tg), (ctxs, pp)] if evicting else [(ctxs, tg + pp)]):
            dest.append(context(kv_key(tk, tv, fa, geometry), n_threads, steps if interleave else in_order(steps),
                                n_ctx=n_ctx, type_k=tk, type_v=tv, flash_attn=fa, n_seq=2 if interleave else 1))
    name = "attn" if geometry is None else f"attn_{geometry}"
    out = [model(name, geometry_shape(geometry), ctxs, repack, n_gpu_layers(device))]
    if ctxs_tg:
        out.append(model(f"attnv_{geometry}", evicting, ctxs_tg, repack))
    deep = [p for p in pairs if geometry is not None and tiled_prompt_path(*p, device)]
    if deep:
        out.append(deep_plan(deep, n_threads, repack, geometry, interleave))
    return out


def deep_plan(pairs: list[tuple[str, str, str]], n_threads: int, repack: bool, geometry: str,
              interleave: bool = False) -> ProbeModel:
    """The tiled kernel deep in the cache for the given F16/F32 pairs of a geometry: DEEP_PP_N-token prompts at
    both TILED_DEEP_DEPTHS on a DEEP_LAYERS-layer model of it, and PT_N-token ones (short query tiles: the share of
    the cost per tile deep in the cache) (interleaved as attn_plan's steps; through llama-bench in order of depth,
    then the shallow ones again)."""
    d0, d1 = TILED_DEEP_DEPTHS
    n_ctx = -(-(d1 + DEEP_PP_N + 1) // 512) * 512
    shape = deep_shape(geometry)
    reps = attn_reps(max(3, min(DEEP_REPS, round(DEEP_REPS * WIDE_LAYER_UNITS / attn_units(shape)))), n_threads)
    kinds = (("pd", DEEP_PP_N), ("td", PT_N))
    ctxs = []
    for tk, tv, fa in pairs:
        if interleave:
            steps = [step(k, "pp", 0, n, reps, depths=[d0, d1], turn="pd") for k, n in kinds]
        else:
            steps = [step(f"{k}{d}", "pp", d, n, reps) for d in (d0, d1) for k, n in kinds]
            steps += [step(f"{k}{d0}b", "pp", d0, n, reps) for k, n in kinds]
        ctxs.append(context(kv_key(tk, tv, fa, geometry), n_threads, steps, n_ctx=n_ctx, type_k=tk, type_v=tv,
                            flash_attn=fa, n_seq=2 if interleave else 1))
    return model(f"attnd_{geometry}", shape, ctxs, repack)


def deep_shape(geometry: str) -> dict[str, Any]:
    return {**geometry_shape(geometry), "n_layer": DEEP_LAYERS}


def weight_plan(types: Iterable[str], n_threads: int, repack: bool, device: str = "") -> list[ProbeModel]:
    """Each weight type's models: on a GPU the wide one; on the CPU the narrow model's decode before and after the
    wide one's (the cost per row; a machine that drifts meanwhile moves both alike), its prompts too (the mat-mat's
    cost per dot product, and a few columns' per row), then the large ones' (the streaming rate and its cost per
    row)."""
    out = []
    for t in types:
        wide = wide_model(t, n_threads, repack, device)
        if device:
            out.append(wide)
            continue
        tl = t.lower()
        narrow, tg = weight_shape(t, narrow=True), step("tg", "tg", 0, run_tokens(TG_N, n_threads), WEIGHT_TG_REPS, 2)
        st = step("tg", "tg", 0, run_tokens(STREAM_N, n_threads), STREAM_REPS, 0)
        out += [_decode_only(f"wn_{tl}", f"wn_{tl}", t, narrow, tg, n_threads, repack,
                             [step(f"pp{n}", "pp", 0, n, MM_REPS) for n in MM_N] + cols_steps()), wide,
                _decode_only(f"wnb_{tl}", f"wn_{tl}", t, narrow, tg, n_threads, repack, cols_steps()),
                _decode_only(f"ws_{tl}", f"ws_{tl}", t, weight_shape(t, stream=True), st, n_threads, repack),
                _decode_only(f"wsn_{tl}", f"wsn_{tl}", t, weight_shape(t, narrow=True, stream=True), st, n_threads,
                             repack),
                _decode_only(f"wsb_{tl}", f"wsb_{tl}", t, weight_shape(t, stream=True, big=True), st, n_threads,
                             repack)]
    return out


def wide_model(t: str, n_threads: int, repack: bool, device: str = "", decode_only: bool = False) -> ProbeModel:
    """The weight model of type ``t`` at the wide widths: its decode, prompts and few-column steps (``decode_only``:
    its decode step alone, the drift sentinel's)."""
    shape = weight_shape(t, device)
    steps = [step("tg", "tg", 0, run_tokens(TG_N, n_threads, device), WEIGHT_TG_REPS, 2)]
    if not decode_only:
        steps += [step(f"pp{n}", "pp", 0, n, MM_REPS) for n in MM_N] + cols_steps()
    return model(f"w_{t.lower()}", shape, [context("f16", n_threads, steps, n_ctx=512)], repack, n_gpu_layers(device),
                 file=f"w_{t.lower()}" + ("_dev" if device else ""), type=t.lower(), shape=shape)


def cols_steps() -> list[ProbeStep]:
    """A weight model's few-column prompts (MM_COLS tokens: one graph of a decode step's width)."""
    return [step(f"pp{n}", "pp", 0, n, MM_COLS_REPS, 2) for n in MM_COLS]


def _decode_only(key: str, file: str, t: str, shape: dict[str, Any], first: ProbeStep, n_threads: int,
                 repack: bool, more: list[ProbeStep] | None = None) -> ProbeModel:
    """A CPU weight model timed by one decode step (and ``more`` steps: the narrow model's prompts) (``file``: the
    calibration model's name, shared by two keys that time the same model twice)."""
    return model(key, shape, [context("f16", n_threads, [first, *(more or [])], n_ctx=512)], repack, file=file,
                 type=t.lower(), shape=shape)
