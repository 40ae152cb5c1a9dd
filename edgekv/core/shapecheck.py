"""Shapes llama.cpp refuses to load: a header that declares one model and holds the tensors of another.

llama.cpp builds the expected dimensions of every tensor from the hyperparameters and refuses a file
whose tensors differ (``check_tensor_dims`` in src/llama-model-loader.cpp: "tensor '...' has wrong
shape"), so a header with zero or absurd head counts, a head size the embedding cannot have, or a
width that overflows never gets a context.  :func:`validate_shape` finds those cases from the
header alone, before any figure is given: the K and V caches' widths must be the widths of the
model's own ``attn_k``/``attn_v`` projections, and every attention layer needs heads of a size.
``predict`` then answers ``invalid`` with the reason (checked against llama.cpp's dry run in
tests/real/test_hostile_headers.py), never a number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from edgekv.core.shape import ModelShape

MAX_WIDTH = (1 << 31) - 1       # ggml tensor rows are int64, but no llama.cpp cache row is wider than int32


def validate_shape(shape: ModelShape, tensors: Mapping[str, tuple[int, ...]] | None = None) -> str | None:
    """Why llama.cpp would refuse this model (one line), or None; ``tensors``: the header's tensor name -> shape."""
    if shape.is_mla:
        return None         # MLA caches come from kv_lora_rank / rope dims, not from attn_k/attn_v
    if shape.unsupported_reason:
        return None         # edgekv does not know this architecture's keys: it has no shape to judge (unsupported)
    tensors = tensors or {}
    emb = tensors.get("token_embd.weight")
    if emb is not None and len(emb) == 2 and emb[0] != shape.n_embd:
        return (f"llama.cpp refuses to load this model: embedding_length is {shape.n_embd} but tensor "
                f"'token_embd.weight' has shape {list(emb)}")
    for lay in shape.layers:
        if not lay.attn_cache:
            continue
        i = lay.index
        bad = _projection_mismatch(lay, tensors)
        if bad:
            return bad
        if lay.n_head_kv == 0:
            continue        # no K/V heads: a layer llama.cpp gives zero-width rows (deci, jamba, ...)
        if lay.n_head == 0:
            return (f"llama.cpp refuses to load this model: layer {i} has {lay.n_head_kv} K/V heads but "
                    "head_count 0")
        if lay.head_k == 0 or lay.head_v == 0:
            return (f"llama.cpp refuses to load this model: layer {i} has key/value heads of size "
                    f"{lay.head_k}/{lay.head_v} (embedding_length {shape.n_embd} over head_count {lay.n_head})")
        if lay.k_width > MAX_WIDTH or lay.v_width > MAX_WIDTH or lay.n_head * lay.head_k > MAX_WIDTH:
            return (f"llama.cpp refuses to load this model: layer {i}'s K/V widths "
                    f"({lay.n_head_kv} heads × {lay.head_k}/{lay.head_v}) overflow")
    return None


def _projection_mismatch(lay, tensors: dict[str, tuple[int, ...]]) -> str | None:
    """The layer's attn_k/attn_v rows against the cache widths its hyperparameters give."""
    i = lay.index
    for proj, width, what in (("attn_k", lay.k_width, "head_count_kv × key_length"),
                              ("attn_v", lay.v_width, "head_count_kv × value_length")):
        dims = tensors.get(f"blk.{i}.{proj}.weight")
        if dims is None or len(dims) != 2:
            continue        # fused QKV, or no such projection: nothing to compare
        if dims[1] != width:
            return (f"llama.cpp refuses to load this model: tensor 'blk.{i}.{proj}.weight' has shape "
                    f"{list(dims)}, but the header's hyperparameters need {width} rows "
                    f"({what}: {lay.n_head_kv} × {lay.head_k if proj == 'attn_k' else lay.head_v})")
    return None
