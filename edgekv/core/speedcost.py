"""The speed model's costs of attention and of weights: which kernel path a K/V pair takes in llama.cpp, the cells
a token or a prompt reads, and the seconds a weight group costs a token or a ubatch at the calibration's
coefficients (edgekv.core.speed puts them together).  Pure."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from edgekv.core.cachetypes import CACHE_TYPES
from edgekv.core.kvcells import swa_decode_cells
from edgekv.core.shape import SWA_STANDARD
from edgekv.core.speedshape import AttnLayer, Calibration, SpeedShape, WeightGroup


def depth_eff(depth: float, lay: AttnLayer) -> float:
    return min(depth, lay.window) if lay.window else depth


def split_kv_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether one-token attention runs the CPU backend's split-KV path (ggml-cpu/ops.cpp:9490: F16/F32 K == V, the
    cache view at least 512 cells; split over cells, one chunk per thread) rather than one query row per task.  On
    a GPU (``device``) no CPU thread reads the cache: the cells count as they are."""
    return not device and flash_attn != "off" and type_k == type_v and type_k in ("f16", "f32")


def dense_view(flash_attn: str) -> bool:
    """Whether attention runs without flash attention (-fa off): llama.cpp then multiplies the query by the whole
    cache view (get_n_kv: the used extent padded to 256) and takes the softmax over all of it, masked cells too
    (llama-graph.cpp build_attn_mha), so its cost follows the padded view, not the cells a query sees: a decoded
    token's time stands still across each 256 cells of depth (docs/calibration-history.md)."""
    return flash_attn == "off"


# GGML_FA_TILE_Q (ggml-cpu/common.h:9): the query rows of one tile of the CPU's tiled flash-attention kernel, which
# a prompt ubatch runs only when it has at least that many tokens (ggml-cpu/ops.cpp:9546)
FA_TILE_Q = 64


def tiled_prompt_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether a prompt ubatch of FA_TILE_Q tokens or more runs the CPU backend's tiled flash-attention kernel
    (ggml-cpu/ops.cpp:9546: F16/F32 K == V, Q in F32).  A shorter ubatch over such a cache, and any ubatch over
    another, runs the per-query-row loop (ops.cpp:8843): a pp32 over an f16 cache costs several times more per
    cell than a pp512.  The pairs are split-KV's (:func:`split_kv_path`)."""
    return split_kv_path(type_k, type_v, flash_attn, device)


def row_loop_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether every prompt over this K/V pair runs the CPU backend's per-query-row flash-attention loop, whatever
    its size (ops.cpp:8843: flash attention on, and not :func:`tiled_prompt_path`'s F16/F32 K == V)."""
    return not device and flash_attn != "off" and not tiled_prompt_path(type_k, type_v, flash_attn, device)


# The tiled kernel's cost per cell: the calibration measures it over scans of up to TILED_SHALLOW_END cells
# (attn_pp_s) and between scans of TILED_DEEP_DEPTHS[0] and [1] cells (attn_pp_deep_s); between the two it is taken
# as linear in the scan's length, and beyond the deep step constant: deep in the cache a cell costs more once a
# layer's K/V no longer fits the core's caches, and where that step falls depends on them
# (docs/calibration-history.md)
TILED_SHALLOW_END = 1024
TILED_DEEP_DEPTHS = (4096, 8192)


def tiled_cell_rate(depth: float, shallow: float, deep: float) -> float:
    """The tiled kernel's cost per cell of a query row that scans ``depth`` cells: ``shallow`` up to
    TILED_SHALLOW_END, ``deep`` from TILED_DEEP_DEPTHS[0] on, linear between."""
    a, b = TILED_SHALLOW_END, TILED_DEEP_DEPTHS[0]
    if depth <= a:
        return shallow
    if depth >= b:
        return deep
    return shallow + (deep - shallow) * (depth - a) / (b - a)


def tiled_cells_cost(depth: float, shallow: float, deep: float) -> float:
    """The tiled kernel's cost of one query row over ``depth`` cells (in the units of the coefficients): every cell
    of the scan at the rate of a scan that long (:func:`tiled_cell_rate`).  The kernel scans a head's K/V once per
    query tile, in the same order each time: once that K/V no longer fits a cache level, a least-recently-used cache
    keeps none of it for the next tile, so the first cells of a long scan miss as the last ones do.  (Until issue
    68 the first TILED_SHALLOW_END cells of every scan were priced at the shallow rate and only the cells past them
    at the dearer one: a prompt at a depth between 1024 and 8192 cells was priced too fast, by up to 37 % of its
    attention with SmolLM2's 22 and 40 ps on a two-core AVX2 machine.)  With shallow == deep it is shallow x depth."""
    return depth * tiled_cell_rate(depth, shallow, deep)


@lru_cache(maxsize=4096)
def fa_tiles(n: int, n_head: int, n_threads: int) -> int:
    """The query tiles llama.cpp's tiled flash-attention kernel runs for one layer of an ``n``-token ubatch over
    ``n_head`` query heads on ``n_threads`` threads: the n x n_head query rows go out in chunks, four a thread
    (ggml-cpu/ops.cpp:9529-9544; one a thread on one thread), and a tile of FA_TILE_Q rows ends early at a chunk's
    end and at a head's (ops.cpp:9160-9170).  A short tile costs about what a full one does: the K/V tile is packed
    and both GEMMs and the softmax run over all FA_TILE_Q rows whatever the rows filled (ops.cpp:9249-9330).
    SmolLM2's 9 heads at 128 tokens on two threads: 24 tiles for 18 full ones' rows."""
    nr = n * n_head
    if nr <= 0:
        return 0
    nth = max(1, n_threads)
    size = -(-nr // (nth * 4))
    nchunk = -(-nr // size)
    if nth == 1 or nchunk < nth:
        nchunk = nth
    dr = -(-nr // nchunk)
    tiles = 0
    for c in range(nchunk):
        ir, end = dr * c, min(dr * c + dr, nr)
        while ir < end:
            ir += min(FA_TILE_Q, end - ir, n - ir % n)
            tiles += 1
    return tiles


def tile_ratio(n: int, n_head: int, n_threads: int) -> float:
    """The rows of the tiles llama.cpp's tiled kernel runs (:func:`fa_tiles` x FA_TILE_Q) over the ubatch's query
    rows: 1.0 where every tile is full."""
    return fa_tiles(n, n_head, n_threads) * FA_TILE_Q / (n * n_head) if n > 0 and n_head > 0 else 1.0


def tile_factor(share: float, n: int, n_head: int, n_threads: int) -> float:
    """What one layer's tiled prompt attention costs against the same rows in full tiles: ``share`` of the kernel's
    work is per tile (:func:`fa_tiles`, whatever its rows), the rest per query row (the mask each row converts,
    its query copied in).  1.0 where every tile is full or the share is unknown (0)."""
    if share <= 0 or n <= 0:
        return 1.0
    return share * tile_ratio(n, n_head, n_threads) + (1.0 - share)


def prompt_attn_coef(cal: Calibration, n: int, tiled: bool) -> dict[str, float]:
    """The calibration's attention coefficients for a prompt ubatch of ``n`` tokens per sequence (``tiled``:
    :func:`tiled_prompt_path` of its K/V pair)."""
    return cal.attn_pp_rows_s if tiled and n < FA_TILE_Q else cal.attn_pp_s


def _pad256(n: float) -> int:
    return max(256, -(-int(n) // 256) * 256)


def decode_cells(used: float, n_head: int, n_threads: int, split: bool, dense: bool = False) -> float:
    """Cells of one layer's one-token attention as the slowest thread sees them, times the thread count: the
    cost is that thread's.  Split-KV: each thread takes a contiguous chunk of the padded view (masked cells at
    its end are skipped).  Otherwise llama.cpp hands out query heads in small chunks as threads free up; an odd
    head count could leave one thread a head more, but 9 heads on 2 threads measure no slower per head than the
    calibration's 8, so the cells count as they are.  ``dense`` (no flash
    attention, :func:`dense_view`): the padded view, split evenly over rows."""
    if dense:
        return float(_pad256(used))
    nth = max(1, n_threads)
    if split and _pad256(used) >= 512:
        chunk = -(-_pad256(used) // nth)
        return nth * min(used, chunk)
    return used


@dataclass(frozen=True)
class SwaRing:
    """A sliding-window cache placed as llama.cpp places it (edgekv.core.kvcells): its cells per stream
    (llama_kv_cache_iswa's size_swa), the ubatches of the prompt that filled it and the tokens decoded after."""
    cells: int
    fill: tuple[int, ...]
    n_gen: int


def attn_units_tg(sh: SpeedShape, depth: float, n_threads: int, split: bool,
                  coef: dict[str, float] | None = None, kv: str = "", ring: SwaRing | None = None,
                  dense: bool = False) -> float:
    """Sum over attention layers of n_head x (head_k + head_v) x the cells the slowest thread reads (x threads);
    with ``coef`` each layer's term is multiplied by its geometry's coefficient (``kv`` + "@" + geometry).  With
    ``ring`` a standard sliding-window layer counts the cells of its ring inside the window, as the threads split
    them (:func:`edgekv.core.kvcells.swa_decode_cells`), not min(depth, window) cells split evenly.  ``dense``: no
    flash attention, each layer over its whole padded view (:func:`dense_view`)."""
    out = 0.0
    for lay in sh.attn:
        if lay.window and ring is not None and ring.cells and sh.swa_type == SWA_STANDARD:
            cells = swa_decode_cells(ring.cells, lay.window, ring.fill, ring.n_gen, n_threads, split, dense=dense)
        else:
            cells = decode_cells(depth_eff(depth, lay), lay.n_head, n_threads, split, dense)
        out += lay.n_head * (lay.head_k + lay.head_v) * cells * (coef[f"{kv}@{lay.geometry}"] if coef is not None else 1.0)
    return out


def attn_units_at(sh: SpeedShape, depth: float, coef: dict[str, float] | None = None, kv: str = "",
                dense: tuple[float, int] | None = None) -> float:
    """Sum over attention layers of n_head x (head_k + head_v) x the cells a query row reads at ``depth``; with
    ``dense`` = (the ubatch's last cell, its tokens), no flash attention: every row over the layer's padded view
    (:func:`dense_view`; a sliding-window layer's cache holds its window and a ubatch)."""
    def cells(lay: AttnLayer) -> float:
        if dense is None:
            return depth_eff(depth, lay)
        end, n = dense
        return _pad256(min(end, lay.window + n) if lay.window else end)

    return sum(lay.n_head * (lay.head_k + lay.head_v) * cells(lay)
               * (coef[f"{kv}@{lay.geometry}"] if coef is not None else 1.0) for lay in sh.attn)


def tiled_attn_s(sh: SpeedShape, depth: float, cal: Calibration, kv: str, n: int = 0) -> float:
    """Seconds of one prompt token's attention at ``depth`` cells in the tiled kernel (:func:`tiled_cells_cost` of
    each layer's geometry; a calibration without the deep coefficient, a GPU's, prices every cell alike), in an
    ``n``-token ubatch whose short query tiles cost what full ones do (:func:`tile_factor`)."""
    out = 0.0
    for lay in sh.attn:
        k = f"{kv}@{lay.geometry}"
        share = cal.attn_pp_tile_share.get(k, 0.0)
        c = cal.attn_pp_s[k] * tile_factor(share, n, lay.n_head, cal.n_threads)
        deep = cal.attn_pp_deep_s.get(k, cal.attn_pp_s[k]) \
            * tile_factor(cal.attn_pp_tile_share_deep.get(k, share), n, lay.n_head, cal.n_threads)
        out += lay.n_head * (lay.head_k + lay.head_v) * tiled_cells_cost(depth_eff(depth, lay), c, deep)
    return out


def kv_read_bytes(sh: SpeedShape, type_k: str, type_v: str, depth: float) -> float:
    """The bytes of K and V that one decoded token's attention reads at ``depth``: each attention layer its cells (a
    sliding-window layer at most its window, as :func:`depth_eff`; a layer that reads another layer's cache, as Gemma
    3n's shared-KV tail does, reads those cells again) x its K and V row bytes per cell in the cache's types.  0 for
    a type edgekv does not know the block size of."""
    tk, tv = CACHE_TYPES.get(type_k), CACHE_TYPES.get(type_v)
    if tk is None or tv is None:
        return 0.0
    per_k, per_v = tk.block_bytes / tk.block, tv.block_bytes / tv.block
    return sum(depth_eff(depth, lay) * (lay.n_head_kv or lay.n_head) * (lay.head_k * per_k + lay.head_v * per_v)
               for lay in sh.attn)


MATMUL_LINEAR_FROM = 32      # from this many columns on, a ubatch's weights follow the prompt coefficients


def matvec_compute_s(g: WeightGroup, cal: Calibration) -> float:
    """A group's mat-vec as the calibration's weight models (about 48 MB, partly in the CPU's caches) price it: its
    bytes, and on the CPU one dot product per row (a GPU calibration prices the widths in its node cost)."""
    return g.bytes * cal.matvec_s_per_byte[g.key] + g.rows * cal.matvec_s_per_row.get(g.key, 0.0)


def stream_s(g: WeightGroup, cal: Calibration, rows: bool = True) -> float:
    """A group's bytes at the rate llama.cpp streams its type from memory, and (``rows``: a mat-vec) one dot product
    per row at the cost it has while streaming (0 where not calibrated: a GPU).  A ubatch of several columns pays
    its dot products in the mat-mat's own terms, so its floor is the bytes alone.  The output head, one matrix,
    pays its rows too: a head of many short rows decodes measurably slower than one of the same bytes in fewer long
    rows (docs/calibration-history.md)."""
    return g.bytes * cal.matvec_stream_s_per_byte.get(g.key, 0.0) \
        + (g.rows * cal.matvec_stream_s_per_row.get(g.key, 0.0) if rows else 0.0)


def matvec_s(g: WeightGroup, cal: Calibration) -> float:
    """Seconds one decoded token spends in group ``g``'s matrices: the kernels' work (matvec_compute_s), or on the CPU,
    where that is faster than llama.cpp streams the type from memory (a large model, whose matrices no cache
    holds), the bytes and rows at the streaming costs."""
    return max(matvec_compute_s(g, cal), stream_s(g, cal))


def weights_s(g: WeightGroup, cal: Calibration, n: int) -> float:
    """Seconds one ubatch of ``n`` tokens spends in group ``g``'s matrices: a mat-vec for one token (matvec_s); for a few
    columns the measured cost of its bytes and rows (linear between the measured column counts, and up to the prompt model at
    MATMUL_LINEAR_FROM); from MATMUL_LINEAR_FROM columns on, the bytes streamed plus the FLOPs.  Never less than
    the bytes at the rate llama.cpp streams the type from memory (a ubatch reads its weights once)."""
    return max(ubatch_weights_s(g, cal, n), stream_s(g, cal, rows=n <= 1))


def ubatch_weights_s(g: WeightGroup, cal: Calibration, n: int) -> float:
    def linear(k: int) -> float:
        return (g.bytes * cal.matmul_s_per_byte[g.key] + 2.0 * g.params * k * cal.matmul_s_per_flop[g.key]
                + g.rows * k * cal.matmul_s_per_dot.get(g.key, 0.0))

    if n <= 1:
        return matvec_s(g, cal)
    if n >= MATMUL_LINEAR_FROM:
        return linear(n)
    pts = [(1, matvec_s(g, cal))]
    per_row = cal.matcols_s_per_row.get(g.key, {})
    pts += sorted((int(k), g.bytes * v + g.rows * per_row.get(k, 0.0))
                  for k, v in cal.matcols_s_per_byte.get(g.key, {}).items() if 1 < int(k) < MATMUL_LINEAR_FROM)
    pts.append((MATMUL_LINEAR_FROM, linear(MATMUL_LINEAR_FROM)))
    # the points span 1 .. MATMUL_LINEAR_FROM and 1 < n < MATMUL_LINEAR_FROM: the segment that holds n
    i = next(j for j in range(1, len(pts)) if n <= pts[j][0])
    (k0, t0), (k1, t1) = pts[i - 1], pts[i]
    return t0 + (t1 - t0) * (n - k0) / (k1 - k0)


def prompt_weights_s(g: WeightGroup, cal: Calibration, n: int, n_out: int) -> float:
    """Seconds a prompt ubatch of ``n`` tokens, ``n_out`` of them computing logits, spends in group ``g``'s matrices:
    the last layer's feed-forward matrices only for the output tokens (none in a ubatch without the prompt's last
    token), the rest for every token."""
    if not g.tail_params:
        return weights_s(g, cal, n)
    body, tail = g.split()
    return weights_s(body, cal, n) + (weights_s(tail, cal, n_out) if n_out else 0.0)


def ubatches(n_prompt: int, n_batch: int, n_ubatch: int) -> list[int]:
    """The ubatch sizes llama.cpp splits a prompt of n tokens into (batches of n_batch, each in ubatches)."""
    out: list[int] = []
    left = n_prompt
    while left > 0:
        b = min(left, n_batch)
        left -= b
        while b > 0:
            u = min(b, n_ubatch)
            out.append(u)
            b -= u
    return out
