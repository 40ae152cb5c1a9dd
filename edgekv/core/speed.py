"""The speed model: llama.cpp's prefill and decode tokens/s predicted from the model's header, its settings and a
calibration of this machine (:mod:`edgekv.orchestration.speedcal`).  Pure: no I/O, no llama.cpp.

One token of decode (a one-token graph) costs

    t_tg(d) = nodes_tg * c_node                               fixed: llama.cpp's graph, one node after another
                                                              (the nodes a backend runs: views cost nothing)
            + sum over weight groups  bytes_g * c_matvec[g]  weights: each matrix read once (MoE: the active experts)
                                 + rows_g * c_row[g]         and one dot product per row of it (CPU), or at
                                                              least bytes_g * c_stream[g] + rows_g * c_srow[g]:
                                                              as fast as llama.cpp streams that type from memory
                                                              (the output head: its bytes alone)
            + output matrix bytes * c_matvec[output]          output head (and its rows: one per vocabulary entry)
                                 + n_vocab * c_row[output]
            + sum over attention layers  n_head * (head_k + head_v) * depth_eff * c_attn_tg[K/V, fa]

and one ubatch of ``n`` prompt tokens at depth ``d``

    t_ub(n, d) = nodes_pp * c_node_pp
               + sum over weight groups  bytes_g * a_matmul[g] + 2 * params_g * n * b_matmul[g]
                                         + rows_g * n * c_dot[g]  (CPU: one dot product per row and column)
               + sum over attention layers  n_head * (head_k + head_v) * n * (d + n / 2)_eff * c_attn_pp[K/V, fa]
                                         (CPU, F16/F32 K == V: c_attn_pp_rows[K/V, fa] when n < 64, the
                                          per-query-row loop rather than the tiled kernel)

with the output head computed once per prompt (llama.cpp computes logits for the last token only).  ``depth_eff``
is the depth a layer attends over: the whole cache for a full-attention layer, at most the window for a sliding
window layer (the CPU kernel skips masked cells).  Every coefficient is measured by the calibration on this
machine, at this thread count, through the llama.cpp edgekv drives; nothing is typed in from a spec sheet.

The roofline beside it: decode cannot be faster than ``bandwidth / bytes read per token`` (the weights a token
reads plus the K/V each attention layer reads at that depth: a sliding-window layer at most its window, a layer
that reads another's cache those cells again), with the bandwidth measured, not looked up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from edgekv.core.cachetypes import CACHE_TYPES, ggml_type_name
from edgekv.core.memmodel import (
    BUFT_AMX,
    BUFT_REPACK,
    Tensor,
    extra_buffer_of,
    extra_buffer_types,
    is_matrix_weight,
    tied_output,
)
from edgekv.core.shape import SWA_STANDARD, ModelShape

SPEED_MODEL_VERSION = 1


def weight_key(type_name: str, buft: str | None) -> str:
    """A calibration key for a weight type as the CPU backend holds it: ``q4_0``, ``q4_0+repack``, ``q4_0+amx``."""
    t = type_name.lower()
    return t + {None: "", BUFT_REPACK: "+repack", BUFT_AMX: "+amx"}[buft]


def kv_key(type_k: str, type_v: str, flash_attn: str, geometry: str | None = None) -> str:
    return f"{type_k}/{type_v}/fa={flash_attn}" + (f"@{geometry}" if geometry else "")


@dataclass(frozen=True)
class WeightGroup:
    key: str              # weight_key
    bytes: int            # bytes a decoded token reads
    params: int           # multiply-adds per token (elements of the matrices it uses)
    output: bool = False  # the output head (computed once per prompt, every decoded token)
    rows: int = 0         # rows of the matrices a decoded token reads (one dot product each; MoE: the active experts)
    # of these, the last layer's feed-forward matrices: in a prompt llama.cpp computes them for the output tokens
    # only (the model builders' ``inp_out_ids``: after the last layer's attention, ``ggml_get_rows`` keeps the rows
    # whose logits are wanted, the last token's), so a ubatch without the last token skips them
    tail_bytes: int = 0
    tail_params: int = 0
    tail_rows: int = 0

    def split(self) -> tuple[WeightGroup, WeightGroup]:
        """(the group less its last-layer feed-forward matrices, those matrices as a group of their own)."""
        return (WeightGroup(self.key, self.bytes - self.tail_bytes, self.params - self.tail_params, self.output,
                            self.rows - self.tail_rows),
                WeightGroup(self.key, self.tail_bytes, self.tail_params, False, self.tail_rows))


# the widest hidden size an attention calibration model takes (its fills and decodes run the projections of that
# width).  The width does not move the attention's cost per cell (AttnLayer.geometry: 43, 42 and 44 ps at 1024, 2048
# and 4096); at 8192 (Qwen2.5 72B's) the projections made its calibration take 170 s on two cores (bench/README.md)
GEOMETRY_MAX_EMBD = 4096


@dataclass(frozen=True)
class AttnLayer:
    n_head: int
    head_k: int
    head_v: int
    window: int | None    # sliding window (cells), None = the whole cache
    n_head_kv: int = 0
    n_embd: int = 0       # the model's hidden size (0: unknown, taken as n_head x head_k)

    @property
    def geometry(self) -> str:
        """The attention geometry a calibration is measured for: query heads, KV heads, K and V head dims (how
        much K/V one layer reads per cell decides which cache level serves it, so the cost per cell is measured
        on this geometry, not scaled from another), and the hidden size where it is not n_head x head_k ("e640"):
        the calibration model has the model's own (at most GEOMETRY_MAX_EMBD), so that its projections are the
        model's.  The width does not move the attention's cost per cell once the model's weights are of a trained
        model's size at that width (bench/attn_widths.py since CAL_VERSION 17: 43, 42 and 44 ps at 1024, 2048 and
        4096 for Qwen3 8B's heads; with CAL_VERSION 16's weights, of one size at every width, 42, 55 and 67 ps:
        the wider model's scores spread so far that its softmax underflowed, edgekv.edges.tinymodel)."""
        g = f"h{self.n_head}kv{self.n_head_kv}k{self.head_k}v{self.head_v}"
        e = min(self.n_embd, GEOMETRY_MAX_EMBD)
        return g + (f"e{e}" if e and e % 32 == 0 and e != self.n_head * self.head_k else "")


@dataclass(frozen=True)
class SpeedShape:
    """What the speed of a model depends on, from its header (and llama.cpp's graph size)."""

    groups: tuple[WeightGroup, ...]
    attn: tuple[AttnLayer, ...]
    nodes_tg: int | None
    nodes_pp: int | None
    notes: tuple[str, ...] = ()
    body: str = ""        # the model's widths as a GPU calibration names them (body_geometry), "" when not llama-shaped
    n_vocab: int = 0      # logits a decoded token returns to the host
    swa_type: str = ""    # the sliding window's kind (edgekv.core.shape.SWA_*): "standard" is placed as a ring


BODY_PROBE_BYTES = 1 << 30      # a body probe holds at most about this many bytes of Q8_0 matrices


def body_geometry(shape: ModelShape) -> str:
    """The widths of a model's layers as a GPU calibration's body probe reproduces them: hidden size, feed-forward
    size, query and KV heads, head dim, and the probe's layer count (the model's, at most BODY_PROBE_BYTES of Q8_0
    matrices): "e576f1536h9kv3d64l30".  On a GPU a small model's kernels run far below the rates of large
    matrices, so the cost of a graph node is measured at the model's own widths (bench/README.md, the H100 run).
    "" when the layers are not one llama-shaped geometry (no attention cache, K and V heads of different dims,
    layers of different widths)."""
    lays = [lay for lay in shape.layers[:shape.n_layer] if lay.attn_cache]
    if not lays or len({(x.n_head, x.n_head_kv, x.head_k, x.head_v, x.n_ff) for x in lays}) != 1:
        return ""
    x = lays[0]
    if x.head_k != x.head_v or not x.n_ff or not shape.n_embd or x.head_k % 32 or shape.n_embd % 32 or x.n_ff % 32:
        return ""
    per_layer = (2 * shape.n_embd * x.n_head * x.head_k + 2 * shape.n_embd * x.n_head_kv * x.head_k
                 + 3 * shape.n_embd * x.n_ff) * 34 / 32
    layers = min(shape.n_layer, max(2, int(BODY_PROBE_BYTES // per_layer)))
    return f"e{shape.n_embd}f{x.n_ff}h{x.n_head}kv{x.n_head_kv}d{x.head_k}l{layers}"


def _type_name(ggml_type: int) -> str:
    return ggml_type_name(ggml_type).lower()


def speed_shape(shape: ModelShape, tensors: Sequence[Tensor], cpu_features: Iterable[str], repack: bool = True,
                nodes: dict[str, int] | None = None, expert_used: int = 0, expert_count: int = 0) -> SpeedShape:
    """The weight groups a token reads (by type and the buffer llama.cpp puts each matrix in: the rules of
    :func:`edgekv.core.memmodel.extra_buffer_of`), the attention layers and the graph size."""
    feats = list(cpu_features)
    extra = extra_buffer_types(feats, repack)
    acc: dict[tuple[str, bool], list[int]] = {}     # (key, output) -> [bytes, params, rows, and the last layer's FFN's]
    tail = f"blk.{shape.n_layer - 1}.ffn_"
    notes: list[str] = []
    frac = expert_used / expert_count if expert_used and expert_count else 1.0
    tied = tied_output(tensors)
    for t in list(tensors) + ([tied] if tied is not None else []):
        if not is_matrix_weight(t):
            continue
        key = weight_key(_type_name(t.ggml_type), extra_buffer_of(t, extra, feats))
        n = 1
        for d in t.shape:
            n *= int(d)
        rows = n // max(1, int(t.shape[0]))         # ggml's ne1 x ne2 x ...: a row is ne0 elements
        b = t.n_bytes
        if "_exps" in t.name and frac < 1.0:
            n, b, rows = int(n * frac), int(b * frac), int(rows * frac)
        out = t.name.startswith("output.")
        g = acc.setdefault((key, out), [0, 0, 0, 0, 0, 0])
        g[0] += b
        g[1] += n
        g[2] += rows
        if t.name.startswith(tail) and shape.n_layer > 0:
            g[3] += b
            g[4] += n
            g[5] += rows
    if frac < 1.0:
        notes.append(f"MoE: {expert_used} of {expert_count} experts read per token")
    groups = tuple(WeightGroup(k, *v[:2], out, v[2], *v[3:]) for (k, out), v in sorted(acc.items()))
    attn = tuple(AttnLayer(lay.n_head, lay.head_k, lay.head_v, shape.n_swa if lay.is_swa and shape.n_swa else None,
                           lay.n_head_kv, int(shape.n_embd or 0))
                 for lay in shape.layers[:shape.n_layer] if lay.attn_cache or lay.reuses is not None)
    ops_tg, ops_pp = run_nodes(nodes)
    return SpeedShape(groups, attn, ops_tg, ops_pp, tuple(notes), body_geometry(shape),
                      int(shape.n_vocab or 0), shape.swa_type)


def run_nodes(graph: dict[str, int] | None) -> tuple[int | None, int | None]:
    """(one-token graph, prompt graph): the nodes of llama.cpp's graphs that a backend runs, from the scheduler's
    listing in its dry run (llamalog.graph_ops); a view (VIEW, RESHAPE, PERMUTE, TRANSPOSE) is computed by no
    backend, and a quantized cache adds mostly views (SmolLM2: 936 -> 1296 nodes, 576 -> 696 that run).  None
    where the dry run did not list them."""
    g = graph or {}
    return g.get("ops_tg"), g.get("ops_pp")


@dataclass
class Calibration:
    """This machine's coefficients (seconds), measured by edgekv.orchestration.speedcal."""

    id: str
    n_threads: int
    node_tg_s: float                                            # per graph node of a one-token graph
    node_pp_s: float                                            # per graph node of a prompt ubatch (NODE_PP_TOKENS[1])
    # outside the graph's nodes: per one-token graph (llama_decode's own work, the logits back to the host) and per
    # prompt ubatch (the batch's inputs: token ids, positions, the attention mask built on the host); 0 when a
    # calibration predates them
    token_tg_s: float = 0.0
    # per graph node of a prompt ubatch of NODE_PP_TOKENS[0] tokens (the CPU; CAL_VERSION 15): a node's work grows
    # with the ubatch's tokens (on the 2-vCPU EPYC VM about 1 us at 8 tokens, 4 at 32, 10 at 128 and 40-50 at 512),
    # so a short ubatch does not pay a long one's; 0: not measured (a GPU: its node cost is the model's own widths')
    node_pp_short_s: float = 0.0
    ubatch_pp_s: float = 0.0
    # a GPU calibration: the cost of a graph node at a model's own widths (body_geometry -> seconds), decode and
    # prompt ubatch, and of returning one logit to the host per decoded token
    node_tg_body_s: dict[str, float] = field(default_factory=dict)
    node_pp_body_s: dict[str, float] = field(default_factory=dict)
    vocab_tg_s: float = 0.0
    matvec_s_per_byte: dict[str, float] = field(default_factory=dict)
    # per weight type, the CPU mat-vec's cost per row beyond its bytes (ggml-cpu computes one dot product per row and
    # hands rows out in chunks of 64: a narrow model's many short rows cost more per byte than a wide one's); empty
    # on a GPU, whose node cost is measured at the model's own widths instead
    matvec_s_per_row: dict[str, float] = field(default_factory=dict)
    # per weight type, the mat-vec's time per byte and per row on models far larger than the CPU's caches (the CPU):
    # a token's matrices take at least their bytes and rows at these costs (the weights come from memory); the cost
    # per row while streaming is not the 48 MB models' (a narrow and a wide 384 MB model; CAL_VERSION 10)
    matvec_stream_s_per_byte: dict[str, float] = field(default_factory=dict)
    matvec_stream_s_per_row: dict[str, float] = field(default_factory=dict)
    matmul_s_per_byte: dict[str, float] = field(default_factory=dict)   # per ubatch: the weights streamed once
    matmul_s_per_flop: dict[str, float] = field(default_factory=dict)
    # per weight type, the CPU mat-mat's cost per dot product (a row times a column) beyond its FLOPs: ggml-cpu's
    # mat-mat is the mat-vec's dot product per row and column, so short rows cost more per FLOP; from the narrow
    # weight model's prompts beside the wide one's (empty on a GPU, and before CAL_VERSION 9)
    matmul_s_per_dot: dict[str, float] = field(default_factory=dict)
    # per weight type, a ubatch of a few columns (str(n) -> seconds per byte of the matrices): llama.cpp's mat-mul
    # with 2 or 4 columns (-npl sequences decoding together, a short last ubatch) is neither a mat-vec nor the
    # mat-mat the prompt coefficients describe
    matcols_s_per_byte: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same ubatch's cost per row (its n dot products, one per column) beyond its bytes (the CPU): a narrow
    # model's short rows cost more per byte at a few columns too (on the 2-vCPU EPYC VM a second column cost 2.24 ms
    # on the wide q4_1 model, 2.75-2.83 on the narrow one of about its bytes, 3.66-4.01 on SmolLM2, bench/README.md);
    # from the narrow weight model's few-column prompts beside the wide one's (CAL_VERSION 14; empty on a GPU)
    matcols_s_per_row: dict[str, dict[str, float]] = field(default_factory=dict)
    attn_tg_s: dict[str, float] = field(default_factory=dict)   # per head x (head_k + head_v) x cell, decode
    attn_pp_s: dict[str, float] = field(default_factory=dict)   # the same, per prompt token
    # the same, a prompt ubatch of fewer than FA_TILE_Q tokens over an F16/F32 cache on the CPU: llama.cpp's
    # per-query-row loop, not the tiled kernel attn_pp_s measures (CAL_VERSION 12); every other pair runs that
    # loop at any ubatch size, so attn_pp_s is its cost already
    attn_pp_rows_s: dict[str, float] = field(default_factory=dict)
    # the same, the tiled kernel's cost per cell deep in the cache (TILED_DEEP_DEPTHS), where on a 2-vCPU EPYC it is
    # dearer than over the first cells attn_pp_s measures (which cache it falls out of is not shown); F16/F32 pairs
    # on the CPU (CAL_VERSION 13)
    attn_pp_deep_s: dict[str, float] = field(default_factory=dict)
    # the share of the tiled kernel's cost that a query tile pays whatever rows it holds (tile_factor): from a prompt
    # of PT_N tokens (short tiles) beside ATTN_PP_N's on the same depths; attn_pp_s and attn_pp_deep_s are then the
    # cost per row of full tiles; F16/F32 pairs on the CPU (CAL_VERSION 19; 0 = every row alike, as before)
    attn_pp_tile_share: dict[str, float] = field(default_factory=dict)
    # the same deep in the cache (the deep model's PT_N-token prompts beside its DEEP_PP_N ones), which attn_pp_deep_s
    # is then per row of full tiles of; where absent, the shallow share
    attn_pp_tile_share_deep: dict[str, float] = field(default_factory=dict)
    bandwidth_bytes_s: float | None = None
    notes: list[str] = field(default_factory=list)
    machine: str = ""                                           # the CPU and thread count it was measured on
    runtime: str = "llama-cpp-python"                           # the llama.cpp it was measured through
    # the ggml device every layer ran on ("CUDA0", "Metal", ...; "" = the CPU backend): a GPU calibration is its own,
    # taken with every layer offloaded, and predicts only configurations that offload every layer to that device
    device: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def busy(self) -> bool:
        """Taken (in whole or in part) while other work used the CPUs: its coefficients are not this machine's."""
        return any(n.startswith("busy") for n in self.notes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class MissingCalibration(ValueError):
    """A weight type or K/V pair the calibration has not measured: no guess is made."""

    def __init__(self, what: str, keys: list[str]):
        self.what, self.keys = what, keys
        super().__init__(f"no speed prediction for {what} {', '.join(keys)}: the calibration has not measured it")


def missing(cal: Calibration, sh: SpeedShape, type_k: str, type_v: str, flash_attn: str) -> tuple[list[str], list[str]]:
    """(weight keys, K/V keys) the prediction needs and the calibration lacks."""
    w = sorted({g.key for g in sh.groups if g.key not in cal.matvec_s_per_byte or g.key not in cal.matmul_s_per_flop
                or g.key not in cal.matcols_s_per_byte
                or (not cal.device and (g.key not in cal.matvec_s_per_row or g.key not in cal.matvec_stream_s_per_byte
                                        or g.key not in cal.matvec_stream_s_per_row or g.key not in cal.matmul_s_per_dot
                                        or g.key not in cal.matcols_s_per_row))})
    rows = tiled_prompt_path(type_k, type_v, flash_attn, cal.device)
    a = sorted({k for k in attn_keys(sh, type_k, type_v, flash_attn) if k not in cal.attn_tg_s or k not in cal.attn_pp_s
                or (rows and (k not in cal.attn_pp_rows_s or k not in cal.attn_pp_deep_s))})
    return w, a


def attn_keys(sh: SpeedShape, type_k: str, type_v: str, flash_attn: str) -> list[str]:
    """The calibration keys of the model's attention: one per K/V pair and layer geometry."""
    return list(dict.fromkeys(kv_key(type_k, type_v, flash_attn, lay.geometry) for lay in sh.attn))


@dataclass
class SpeedPart:
    name: str
    s_per_token: float
    source: str


@dataclass
class SpeedPrediction:
    test: str                       # "tg" or "pp"
    tokens_per_s: float
    depth: int
    n_tokens: int
    parts: list[SpeedPart]
    roofline_tokens_per_s: float | None = None
    bytes_per_token: float | None = None
    calibration_id: str = ""

    @property
    def s_per_token(self) -> float:
        return sum(p.s_per_token for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["s_per_token"] = self.s_per_token
        return d


def _depth_eff(depth: float, lay: AttnLayer) -> float:
    return min(depth, lay.window) if lay.window else depth


def split_kv_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether one-token attention runs the CPU backend's split-KV path (ggml-cpu/ops.cpp:9490: F16/F32 K == V, the
    cache view at least 512 cells; split over cells, one chunk per thread) rather than one query row per task.  On
    a GPU (``device``) no CPU thread reads the cache: the cells count as they are."""
    return not device and flash_attn != "off" and type_k == type_v and type_k in ("f16", "f32")


def dense_view(flash_attn: str) -> bool:
    """Whether attention runs without flash attention (-fa off): llama.cpp then multiplies the query by the whole
    cache view (get_n_kv: the used extent padded to 256) and takes the softmax over all of it, masked cells too
    (llama-graph.cpp build_attn_mha), so its cost follows the padded view, not the cells a query sees.  On the
    2-vCPU EPYC VM a decoded token's time stood still from depth 0 to 192 (a view of 256) and from 256 to 448 (512)
    on a model of SmolLM2's heads (bench/README.md)."""
    return flash_attn == "off"


# GGML_FA_TILE_Q (ggml-cpu/common.h:9): the query rows of one tile of the CPU's tiled flash-attention kernel, which
# a prompt ubatch runs only when it has at least that many tokens (ggml-cpu/ops.cpp:9546)
FA_TILE_Q = 64


def tiled_prompt_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether a prompt ubatch of FA_TILE_Q tokens or more runs the CPU backend's tiled flash-attention kernel
    (ggml-cpu/ops.cpp:9546: F16/F32 K == V, Q in F32).  A shorter ubatch over such a cache, and any ubatch over
    another, runs the per-query-row loop (ops.cpp:8843): a pp32 over an f16 cache costs several times more per
    cell than a pp512 (bench/README.md).  The pairs are split-KV's (:func:`split_kv_path`)."""
    return split_kv_path(type_k, type_v, flash_attn, device)


def row_loop_path(type_k: str, type_v: str, flash_attn: str, device: str = "") -> bool:
    """Whether every prompt over this K/V pair runs the CPU backend's per-query-row flash-attention loop, whatever
    its size (ops.cpp:8843: flash attention on, and not :func:`tiled_prompt_path`'s F16/F32 K == V)."""
    return not device and flash_attn != "off" and not tiled_prompt_path(type_k, type_v, flash_attn, device)


# The tiled kernel's cost per cell: the calibration measures it over the first TILED_SHALLOW_END cells (attn_pp_s)
# and from TILED_DEEP_DEPTHS[0] to [1] (attn_pp_deep_s); between the two it is taken as linear in the depth, and
# beyond the deep step constant.  On a 2-vCPU EPYC (1 MB L2 a core) SmolLM2's heads cost 21-29 ps a cell over the
# first 1024 cells and 23-42 (median 31) between 4096 and 8192 on a one-layer model of its heads; SmolLM2 itself
# measured 34 and 41 there (bench/README.md, the tiled kernel deep in the cache); where the step falls depends on
# the core's caches
TILED_SHALLOW_END = 1024
TILED_DEEP_DEPTHS = (4096, 8192)


def tiled_cells_cost(depth: float, shallow: float, deep: float) -> float:
    """The tiled kernel's cost of one query row over ``depth`` cells (the integral of its cost per cell, in the
    units of the coefficients): ``shallow`` per cell up to TILED_SHALLOW_END, ``deep`` from TILED_DEEP_DEPTHS[0]
    on, linear between.  With shallow == deep it is shallow x depth."""
    a, b = TILED_SHALLOW_END, TILED_DEEP_DEPTHS[0]
    if depth <= a:
        return shallow * depth
    if depth <= b:
        at = shallow + (deep - shallow) * (depth - a) / (b - a)
        return shallow * a + (depth - a) * (shallow + at) / 2
    return shallow * a + (b - a) * (shallow + deep) / 2 + deep * (depth - b)


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
    head count could leave one thread a head more, but SmolLM2's 9 heads on 2 threads measure no slower per head
    than the calibration's 8 (bench/README.md, speed model), so the cells count as they are.  ``dense`` (no flash
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
    from edgekv.core.kvcells import swa_decode_cells

    out = 0.0
    for lay in sh.attn:
        if lay.window and ring is not None and ring.cells and sh.swa_type == SWA_STANDARD:
            cells = swa_decode_cells(ring.cells, lay.window, ring.fill, ring.n_gen, n_threads, split, dense=dense)
        else:
            cells = decode_cells(_depth_eff(depth, lay), lay.n_head, n_threads, split, dense)
        out += lay.n_head * (lay.head_k + lay.head_v) * cells * (coef[f"{kv}@{lay.geometry}"] if coef is not None else 1.0)
    return out


def _attn_units(sh: SpeedShape, depth: float, coef: dict[str, float] | None = None, kv: str = "",
                dense: tuple[float, int] | None = None) -> float:
    """Sum over attention layers of n_head x (head_k + head_v) x the cells a query row reads at ``depth``; with
    ``dense`` = (the ubatch's last cell, its tokens), no flash attention: every row over the layer's padded view
    (:func:`dense_view`; a sliding-window layer's cache holds its window and a ubatch)."""
    def cells(lay: AttnLayer) -> float:
        if dense is None:
            return _depth_eff(depth, lay)
        end, n = dense
        return _pad256(min(end, lay.window + n) if lay.window else end)

    return sum(lay.n_head * (lay.head_k + lay.head_v) * cells(lay)
               * (coef[f"{kv}@{lay.geometry}"] if coef is not None else 1.0) for lay in sh.attn)


def _tiled_attn_s(sh: SpeedShape, depth: float, cal: Calibration, kv: str, n: int = 0) -> float:
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
        out += lay.n_head * (lay.head_k + lay.head_v) * tiled_cells_cost(_depth_eff(depth, lay), c, deep)
    return out


def kv_read_bytes(sh: SpeedShape, type_k: str, type_v: str, depth: float) -> float:
    """The bytes of K and V that one decoded token's attention reads at ``depth``: each attention layer its cells (a
    sliding-window layer at most its window, as :func:`_depth_eff`; a layer that reads another layer's cache, as Gemma
    3n's shared-KV tail does, reads those cells again) x its K and V row bytes per cell in the cache's types.  0 for
    a type edgekv does not know the block size of."""
    tk, tv = CACHE_TYPES.get(type_k), CACHE_TYPES.get(type_v)
    if tk is None or tv is None:
        return 0.0
    per_k, per_v = tk.block_bytes / tk.block, tv.block_bytes / tv.block
    return sum(_depth_eff(depth, lay) * (lay.n_head_kv or lay.n_head) * (lay.head_k * per_k + lay.head_v * per_v)
               for lay in sh.attn)


def _require(sh: SpeedShape, cal: Calibration, type_k: str, type_v: str, flash_attn: str, nodes: int | None) -> None:
    """MissingCalibration naming what a prediction needs and does not have (a type, a K/V pair, the graph size)."""
    wk, ak = missing(cal, sh, type_k, type_v, flash_attn)
    if wk:
        raise MissingCalibration("weight type", wk)
    if ak:
        raise MissingCalibration("K/V cache", ak)
    if nodes is None:
        raise MissingCalibration("graph size of", ["this model (llama.cpp's dry run did not list its graph's nodes)"])
    if cal.device and not sh.body:
        raise MissingCalibration("model widths", ["of this architecture on a GPU (its layers are not one llama-shaped "
                                                  "geometry the body probe reproduces)"])
    if cal.device and (sh.body not in cal.node_tg_body_s or sh.body not in cal.node_pp_body_s):
        raise MissingCalibration("model widths", [sh.body])


def node_cost(sh: SpeedShape, cal: Calibration, test: str) -> tuple[float, str]:
    """(seconds per graph node, where it comes from): on a GPU measured at this model's widths, on the CPU the
    narrow models' cost (a CPU's per-node work is thread synchronisation, its width-bound work the weights')."""
    if cal.device:
        c = (cal.node_tg_body_s if test == "tg" else cal.node_pp_body_s)[sh.body]
        return c, f"{c * 1e6:.2f} us at this model's widths"
    c = cal.node_tg_s if test == "tg" else cal.node_pp_s
    return c, f"{c * 1e6:.2f} us"


# the prompt sizes the calibration times graph nodes at (its two narrow models' prompts): node_pp_short_s, node_pp_s
NODE_PP_TOKENS = (32, 512)


def prompt_node_s(cal: Calibration, n: int) -> float:
    """Seconds per graph node of an ``n``-token prompt ubatch on the CPU: linear in the tokens through the two
    measured sizes (NODE_PP_TOKENS; below the first, toward a one-token graph's node cost, never under it), as a
    node's element-wise work is; a calibration without the short size (a GPU's) prices every ubatch's nodes alike."""
    if not cal.node_pp_short_s:
        return cal.node_pp_s
    (n0, c0), (n1, c1) = (NODE_PP_TOKENS[0], cal.node_pp_short_s), (NODE_PP_TOKENS[1], cal.node_pp_s)
    if n < n0:
        return cal.node_tg_s + (c0 - cal.node_tg_s) * max(0, n - 1) / (n0 - 1)
    return max(cal.node_tg_s, c0 + (c1 - c0) * (n - n0) / (n1 - n0))


MATMUL_LINEAR_FROM = 32      # from this many columns on, a ubatch's weights follow the prompt coefficients


def matvec_compute_s(g: WeightGroup, cal: Calibration) -> float:
    """A group's mat-vec as the calibration's weight models (about 48 MB, partly in the CPU's caches) price it: its
    bytes, and on the CPU one dot product per row (a GPU calibration prices the widths in its node cost)."""
    return g.bytes * cal.matvec_s_per_byte[g.key] + g.rows * cal.matvec_s_per_row.get(g.key, 0.0)


def stream_s(g: WeightGroup, cal: Calibration, rows: bool = True) -> float:
    """A group's bytes at the rate llama.cpp streams its type from memory, and (``rows``: a mat-vec) one dot product
    per row at the cost it has while streaming (0 where not calibrated: a GPU).  A ubatch of several columns pays
    its dot products in the mat-mat's own terms, so its floor is the bytes alone.  The output head, one matrix,
    pays its rows too: on two threads of the 2-vCPU EPYC VM a 178 MB q8_0 head of 262,144 rows of 640 (Gemma 3's)
    decoded 1.12 ms (27 Nov) and 1.34 ms (29 Nov) a token slower than one of the same bytes in 65,536 rows of 2,560,
    5.7 and 6.8 ns a row (bench/head_rows.py, bench/README.md); from CAL_VERSION 10 to 20 the head had its bytes
    alone, which matched on 27 Nov only because that day's streaming rate per byte was priced slow."""
    return g.bytes * cal.matvec_stream_s_per_byte.get(g.key, 0.0) \
        + (g.rows * cal.matvec_stream_s_per_row.get(g.key, 0.0) if rows else 0.0)


def matvec_s(g: WeightGroup, cal: Calibration) -> float:
    """Seconds one decoded token spends in group ``g``'s matrices: the kernels' work (matvec_compute_s), or on the CPU,
    where that is faster than llama.cpp streams the type from memory (a large model: an 8B model's 4.3 GB of
    q4_K at 100 GB/s of kernel work measured 28 GB/s, bench/README.md), the bytes and rows at the streaming costs."""
    return max(matvec_compute_s(g, cal), stream_s(g, cal))


def weights_s(g: WeightGroup, cal: Calibration, n: int) -> float:
    """Seconds one ubatch of ``n`` tokens spends in group ``g``'s matrices: a mat-vec for one token (matvec_s); for a few
    columns the measured cost of its bytes and rows (linear between the measured column counts, and up to the prompt model at
    MATMUL_LINEAR_FROM); from MATMUL_LINEAR_FROM columns on, the bytes streamed plus the FLOPs.  Never less than
    the bytes at the rate llama.cpp streams the type from memory (a ubatch reads its weights once)."""
    return max(_ubatch_weights_s(g, cal, n), stream_s(g, cal, rows=n <= 1))


def _ubatch_weights_s(g: WeightGroup, cal: Calibration, n: int) -> float:
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


def predict_tg(sh: SpeedShape, cal: Calibration, depth: int, n_gen: int, type_k: str, type_v: str,
               flash_attn: str, n_seq: int = 1, swa_cells: int = 0, n_batch: int = 2048,
               n_ubatch: int = 512) -> SpeedPrediction:
    """Decode tokens/s of ``n_gen`` tokens generated from ``depth`` cells (llama-bench's tg at depth); with
    ``n_seq`` sequences decoding together (-npl, each its own KV stream), each step one ubatch of a token per
    sequence, and the rate is all sequences' tokens (llama-batched-bench's S_TG).  ``swa_cells``: the cells of
    a sliding-window cache (0: none, or not known), filled by a prompt of ``depth`` tokens in ``n_batch`` /
    ``n_ubatch`` pieces, whose ring decides what each thread reads (one sequence)."""
    _require(sh, cal, type_k, type_v, flash_attn, sh.nodes_tg)
    n = max(1, n_seq)
    mean_depth = depth + max(1, n_gen) / 2
    c_node, c_src = node_cost(sh, cal, "tg")
    t_vocab = n * sh.n_vocab * cal.vocab_tg_s          # each sequence's logits back to the host
    parts = [SpeedPart("fixed", (sh.nodes_tg * c_node + cal.token_tg_s + t_vocab) / n,
                       f"{sh.nodes_tg} graph nodes that run x {c_src} + {cal.token_tg_s * 1e6:.0f} us"
                       + (f" + {sh.n_vocab} logits to the host {t_vocab * 1e6 / n:.0f} us" if t_vocab else "")
                       + (f" per step of {n} tokens" if n > 1 else " per token"))]
    w = sum(weights_s(g, cal, n) for g in sh.groups if not g.output) / n
    parts.append(SpeedPart("weights", w, ", ".join(_matvec_source(g, cal) for g in sh.groups if not g.output)
                           + (f"; {n} columns per step" if n > 1 else "")))
    o = sum(weights_s(g, cal, n) for g in sh.groups if g.output) / n
    if o:
        parts.append(SpeedPart("output head", o, ", ".join(_matvec_source(g, cal) for g in sh.groups if g.output)))
    kv = kv_key(type_k, type_v, flash_attn)
    if sh.attn:
        split = split_kv_path(type_k, type_v, flash_attn, cal.device)
        ring = (SwaRing(swa_cells, tuple(ubatches(depth, n_batch, n_ubatch)), max(1, n_gen))
                if swa_cells and n == 1 and sh.swa_type == SWA_STANDARD else None)
        dense = dense_view(flash_attn)
        t_att = attn_units_tg(sh, mean_depth, cal.n_threads, split, cal.attn_tg_s, kv, ring, dense)
        parts.append(SpeedPart("attention", t_att,
                               f"{type_k}/{type_v} at mean depth {mean_depth:.0f}" + (" in each sequence" if n > 1 else "")
                               + ("; no flash attention: over the whole padded view" if dense else "")
                               + (f"; sliding-window layers over a ring of {swa_cells} cells" if ring else "")))
    t = sum(p.s_per_token for p in parts)
    read = sum(g.bytes for g in sh.groups) / n + kv_read_bytes(sh, type_k, type_v, mean_depth)
    roof = cal.bandwidth_bytes_s / read if cal.bandwidth_bytes_s and read else None
    return SpeedPrediction("tg", 1.0 / t, depth, n_gen, parts, roof, read, cal.id)


def _matvec_source(g: WeightGroup, cal: Calibration) -> str:
    """Where a group's decode time comes from: "q4_1 66.3 MB at 27.1 GB/s + 155520 rows x 15.2 ns"."""
    row = cal.matvec_s_per_row.get(g.key, 0.0)
    if stream_s(g, cal) > matvec_compute_s(g, cal):
        s_row = cal.matvec_stream_s_per_row.get(g.key, 0.0)
        return (f"{g.key} {g.bytes / 1e6:.1f} MB streamed from memory at {1e-9 / cal.matvec_stream_s_per_byte[g.key]:.1f} GB/s"
                + (f" + {g.rows} rows x {s_row * 1e9:.1f} ns" if s_row and g.rows else ""))
    return (f"{g.key} {g.bytes / 1e6:.1f} MB at {1e-9 / cal.matvec_s_per_byte[g.key]:.1f} GB/s"
            + (f" + {g.rows} rows x {row * 1e9:.1f} ns" if row and g.rows else ""))


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


def predict_pp(sh: SpeedShape, cal: Calibration, depth: int, n_prompt: int, n_batch: int, n_ubatch: int,
               type_k: str, type_v: str, flash_attn: str, n_seq: int = 1) -> SpeedPrediction:
    """Prefill tokens/s of a prompt of ``n_prompt`` tokens processed at ``depth`` (llama-bench's pp at depth); with
    ``n_seq`` sequences (-npl) their prompts go in one batch (llama-batched-bench's S_PP over all of them), each
    token attending to its own sequence's cells, the last token of each sequence computing logits."""
    _require(sh, cal, type_k, type_v, flash_attn, sh.nodes_pp)
    kv = kv_key(type_k, type_v, flash_attn)
    n_seq = max(1, n_seq)
    fixed = weights = attn = 0.0
    c_node, c_src = node_cost(sh, cal, "pp")
    ubs = ubatches(n_seq * n_prompt, n_batch, n_ubatch)
    for i, n in enumerate(ubs):
        fixed += sh.nodes_pp * (c_node if cal.device else prompt_node_s(cal, n)) + cal.ubatch_pp_s
        weights += sum(prompt_weights_s(g, cal, n, n_seq if i == len(ubs) - 1 else 0) for g in sh.groups if not g.output)
    if not cal.device and cal.node_pp_short_s and ubs:
        c_src = f"{prompt_node_s(cal, ubs[0]) * 1e6:.2f} us at {ubs[0]} tokens"
    d = float(depth)
    tiled, short, deep, short_tiles = tiled_prompt_path(type_k, type_v, flash_attn, cal.device), 0, False, False
    for n in ubatches(n_prompt, n_batch, n_ubatch):      # each sequence's tokens over its own cells
        if sh.attn and tiled and n >= FA_TILE_Q:
            attn += n_seq * n * _tiled_attn_s(sh, d + n / 2, cal, kv, n)
            short_tiles |= any(tile_factor(cal.attn_pp_tile_share.get(f"{kv}@{lay.geometry}", 0.0), n, lay.n_head,
                                           cal.n_threads) > 1.0 for lay in sh.attn)
            deep |= d + n > TILED_SHALLOW_END
        elif sh.attn:
            attn += n_seq * n * _attn_units(sh, d + n / 2, prompt_attn_coef(cal, n, tiled), kv,
                                            (d + n, n) if dense_view(flash_attn) else None)
            short += tiled and n < FA_TILE_Q
        d += n
    out = sum(weights_s(g, cal, n_seq) for g in sh.groups if g.output)
    p = float(max(1, n_prompt * n_seq))
    parts = [SpeedPart("fixed", fixed / p, f"{sh.nodes_pp} graph nodes that run per ubatch x {c_src} "
                                           f"+ {cal.ubatch_pp_s * 1e6:.0f} us"),
             SpeedPart("weights", weights / p,
                       ", ".join(f"{g.key} {2 * g.params / 1e9:.2f} GFLOP/token at "
                                 f"{1e-9 / cal.matmul_s_per_flop[g.key]:.1f} GFLOP/s"
                                 + (f" + {g.rows} dot products x {cal.matmul_s_per_dot[g.key] * 1e9:.1f} ns"
                                    if cal.matmul_s_per_dot.get(g.key) and g.rows else "")
                                 for g in sh.groups if not g.output))]
    if out:
        parts.append(SpeedPart("output head", out / p, "the last token's logits only"
                               + (f" (of each of {n_seq} sequences)" if n_seq > 1 else "")))
    if sh.attn:
        parts.append(SpeedPart("attention", attn / p, f"{type_k}/{type_v} from depth {depth}"
                               + ("; no flash attention: every row over the whole padded view"
                                  if dense_view(flash_attn) else "")
                               + (f"; {short} ubatch(es) under {FA_TILE_Q} tokens run llama.cpp's per-row loop, "
                                  "not its tiled kernel" if short else "")
                               + (f"; the tiled kernel's cells past {TILED_SHALLOW_END} priced toward its cost "
                                  f"{TILED_DEEP_DEPTHS[0]}-{TILED_DEEP_DEPTHS[1]} deep" if deep else "")
                               + ("; query tiles cut short at llama.cpp's chunk and head ends priced as full ones "
                                  "(their per-tile share)" if short_tiles else "")))
    t = sum(x.s_per_token for x in parts)
    return SpeedPrediction("pp", 1.0 / t, depth, n_prompt * n_seq, parts, None, None, cal.id)


def explain(pred: SpeedPrediction, measured_ts: float | None = None) -> str:
    """One line naming the part that dominates a token's time (and how far a measured decode is from the
    roofline)."""
    if not pred.parts:
        return ""
    top = max(pred.parts, key=lambda p: p.s_per_token)
    share = top.s_per_token / pred.s_per_token
    line = f"{top.name}: {100 * share:.0f} % of a token's predicted time ({top.source})"
    if pred.test == "tg" and pred.roofline_tokens_per_s:
        got = measured_ts or pred.tokens_per_s
        line += f"; {100 * got / pred.roofline_tokens_per_s:.0f} % of the bandwidth bound " \
                f"({pred.roofline_tokens_per_s:.0f} t/s)"
    return line
