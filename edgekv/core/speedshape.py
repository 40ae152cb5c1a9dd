"""The speed model's inputs: a model's speed shape (its weight groups as the backend holds them, its attention
layers, its graph's nodes) and this machine's calibration coefficients (:class:`Calibration`).  Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from edgekv.core.cachetypes import ggml_type_name
from edgekv.core.memmodel import (
    BUFT_AMX,
    BUFT_REPACK,
    Tensor,
    extra_buffer_of,
    extra_buffer_types,
    is_matrix_weight,
    tied_output,
)
from edgekv.core.shape import ModelShape

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
# width).  The width does not move the attention's cost per cell (AttnLayer.geometry); twice this width made a
# calibration's projections take minutes on two cores (docs/calibration-history.md)
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
        model's size at that width (weights of one size at every width made the wider model's scores spread so far
        that its softmax underflowed, edgekv.sources.tinymodel; docs/calibration-history.md, CAL_VERSION 17)."""
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
    matrices, so the cost of a graph node is measured at the model's own widths.
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


# the prompt sizes the calibration times graph nodes at (its two narrow models' prompts): node_pp_short_s, node_pp_s
NODE_PP_TOKENS = (32, 512)


class Calibration(msgspec.Struct):
    """This machine's coefficients (seconds), measured by edgekv.calibration.speedcal (a msgspec Struct, not frozen:
    the solver fills it in)."""

    id: str
    n_threads: int
    node_tg_s: float                                            # per graph node of a one-token graph
    node_pp_s: float                                            # per graph node of a prompt ubatch (NODE_PP_TOKENS[1])
    # outside the graph's nodes: per one-token graph (llama_decode's own work, the logits back to the host) and per
    # prompt ubatch (the batch's inputs: token ids, positions, the attention mask built on the host); 0 when a
    # calibration predates them
    token_tg_s: float = 0.0
    # per graph node of a prompt ubatch of NODE_PP_TOKENS[0] tokens (the CPU; CAL_VERSION 15): a node's work grows
    # with the ubatch's tokens (tens of times more at 512 than at 8), so a short ubatch does not pay a long one's;
    # 0: not measured (a GPU: its node cost is the model's own widths')
    node_pp_short_s: float = 0.0
    ubatch_pp_s: float = 0.0
    # a GPU calibration: the cost of a graph node at a model's own widths (body_geometry -> seconds), decode and
    # prompt ubatch, and of returning one logit to the host per decoded token
    node_tg_body_s: dict[str, float] = {}
    node_pp_body_s: dict[str, float] = {}
    vocab_tg_s: float = 0.0
    matvec_s_per_byte: dict[str, float] = {}
    # per weight type, the CPU mat-vec's cost per row beyond its bytes (ggml-cpu computes one dot product per row and
    # hands rows out in chunks of 64: a narrow model's many short rows cost more per byte than a wide one's); empty
    # on a GPU, whose node cost is measured at the model's own widths instead
    matvec_s_per_row: dict[str, float] = {}
    # per weight type, the mat-vec's time per byte and per row on models far larger than the CPU's caches (the CPU):
    # a token's matrices take at least their bytes and rows at these costs (the weights come from memory); the cost
    # per row while streaming is not the 48 MB models' (a narrow and a wide 384 MB model; CAL_VERSION 10)
    matvec_stream_s_per_byte: dict[str, float] = {}
    matvec_stream_s_per_row: dict[str, float] = {}
    matmul_s_per_byte: dict[str, float] = {}   # per ubatch: the weights streamed once
    matmul_s_per_flop: dict[str, float] = {}
    # per weight type, the CPU mat-mat's cost per dot product (a row times a column) beyond its FLOPs: ggml-cpu's
    # mat-mat is the mat-vec's dot product per row and column, so short rows cost more per FLOP; from the narrow
    # weight model's prompts beside the wide one's (empty on a GPU, and before CAL_VERSION 9)
    matmul_s_per_dot: dict[str, float] = {}
    # per weight type, a ubatch of a few columns (str(n) -> seconds per byte of the matrices): llama.cpp's mat-mul
    # with 2 or 4 columns (-npl sequences decoding together, a short last ubatch) is neither a mat-vec nor the
    # mat-mat the prompt coefficients describe
    matcols_s_per_byte: dict[str, dict[str, float]] = {}
    # the same ubatch's cost per row (its n dot products, one per column) beyond its bytes (the CPU): a narrow
    # model's short rows cost more per byte at a few columns too; from the narrow weight model's few-column prompts
    # beside the wide one's (CAL_VERSION 14; empty on a GPU)
    matcols_s_per_row: dict[str, dict[str, float]] = {}
    attn_tg_s: dict[str, float] = {}   # per head x (head_k + head_v) x cell, decode
    attn_pp_s: dict[str, float] = {}   # the same, per prompt token
    # the same, a prompt ubatch of fewer than FA_TILE_Q tokens over an F16/F32 cache on the CPU: llama.cpp's
    # per-query-row loop, not the tiled kernel attn_pp_s measures (CAL_VERSION 12); every other pair runs that
    # loop at any ubatch size, so attn_pp_s is its cost already
    attn_pp_rows_s: dict[str, float] = {}
    # the same, the tiled kernel's cost per cell deep in the cache (TILED_DEEP_DEPTHS), where on some CPUs it is
    # dearer than over the first cells attn_pp_s measures (which cache it falls out of is not shown); F16/F32 pairs
    # on the CPU (CAL_VERSION 13)
    attn_pp_deep_s: dict[str, float] = {}
    # the share of the tiled kernel's cost that a query tile pays whatever rows it holds (tile_factor): from a prompt
    # of PT_N tokens (short tiles) beside ATTN_PP_N's on the same depths; attn_pp_s and attn_pp_deep_s are then the
    # cost per row of full tiles; F16/F32 pairs on the CPU (CAL_VERSION 19; 0 = every row alike, as before)
    attn_pp_tile_share: dict[str, float] = {}
    # the same deep in the cache (the deep model's PT_N-token prompts beside its DEEP_PP_N ones), which attn_pp_deep_s
    # is then per row of full tiles of; where absent, the shallow share
    attn_pp_tile_share_deep: dict[str, float] = {}
    bandwidth_bytes_s: float | None = None
    notes: list[str] = []
    machine: str = ""                                           # the CPU and thread count it was measured on
    runtime: str = "llama-cpp-python"                           # the llama.cpp it was measured through
    # the ggml device every layer ran on ("CUDA0", "Metal", ...; "" = the CPU backend): a GPU calibration is its own,
    # taken with every layer offloaded, and predicts only configurations that offload every layer to that device
    device: str = ""
    # terms outside their physical bounds twice (edgekv.core.speedbounds: term -> why): left out of the
    # coefficients, and every prediction that needs one is withheld with the reason until a run measures it again
    dropped: dict[str, str] = {}

    @property
    def busy(self) -> bool:
        """Taken (in whole or in part) while other work used the CPUs: its coefficients are not this machine's."""
        return any(n.startswith("busy") for n in self.notes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        return cls(**{k: v for k, v in d.items() if k in cls.__struct_fields__})
