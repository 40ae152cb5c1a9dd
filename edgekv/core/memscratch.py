"""The CPU backend's per-graph scratch (the thread work buffer) of the whole-process model
(:mod:`edgekv.core.memmodel`).  Pure.

ggml-cpu.c ``ggml_graph_plan``: the largest per-node scratch, for a matrix product the activations converted to the
weight's vec_dot type (row_size(vec_dot, K x n_tokens)), plus one cache line per thread (ggml-cpu.cpp allocates it
with ``new uint8_t[work_size]``).  Without flash attention the largest is usually the attention scores converted
for V (:func:`kq_work_bytes`): n_kv x n_tokens x n_head, 18 MiB for SmolLM2's fill of 2048 cells in ubatches of 512.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from edgekv.core.memweights import T_F32, Tensor, is_matrix_weight, row_size, vec_dot_type
from edgekv.core.predict import pad

CACHE_LINE_SIZE = 64          # ggml-cpu.c CACHE_LINE_SIZE (x86, arm64)


def work_buffer_bytes(tensors: Sequence[Tensor], n_tokens: int, n_outputs: int, n_threads: int,
                      on_cpu: Any = None) -> int:
    """The CPU backend's per-graph scratch: the largest matrix product's converted activations
    (row_size(vec_dot_type, K x rows)), padded to 64, plus one cache line per thread."""
    best = 0
    for t in tensors:
        if not is_matrix_weight(t) and not (t.name.startswith("output") and len(t.shape) >= 2):
            continue
        if on_cpu is not None and not on_cpu(t):
            continue
        vd = vec_dot_type(t.ggml_type)
        if vd is None or vd == T_F32:
            continue
        rows = n_outputs if t.name.startswith("output") else n_tokens
        best = max(best, row_size(vd, t.shape[0] * rows))
    return work_scratch_bytes(best, n_threads)


def work_scratch_bytes(node_bytes: int, n_threads: int) -> int:
    """The work buffer ggml_graph_plan sizes for its largest node's scratch: padded to 64, plus a cache line per
    thread (0: no node needs one)."""
    return pad(node_bytes, 64) + CACHE_LINE_SIZE * max(1, n_threads) if node_bytes else 0


KQ_PAD = 256    # src/llama-kv-cache.cpp:1265 get_n_kv: the cells a graph attends over, padded to max(n_pad, 256)


def kq_work_bytes(type_v: int, caches: Iterable[tuple[int, int]], spans: Iterable[tuple[int, int]]) -> int:
    """The work buffer of attention without flash attention: llama.cpp multiplies V (stored transposed) by the
    softmaxed scores, an f32 tensor of n_kv x n_tokens x n_head (src/llama-graph.cpp build_attn_mha), and
    ggml_graph_plan converts it to V's vec_dot type first (ggml-cpu.c GGML_OP_MUL_MAT: row_size(vec_dot_type,
    nelements(src1)); an F32 V needs none).  The buffer grows to the largest graph the run computes (ggml-cpu.cpp
    reallocates it only upward), each step of the run a ubatch.  ``caches``: (cells, n_head) of each layer's cache;
    ``spans``: (first position, tokens) of each ubatch; a ubatch attends over min(cells, pad(end)) cells."""
    vd = vec_dot_type(type_v)
    if vd is None or vd == T_F32:
        return 0
    best = 0
    for cells, n_head in set(caches):
        for start, n in spans:
            n_kv = min(cells, max(KQ_PAD, pad(start + n, KQ_PAD)))
            best = max(best, n_kv * n * n_head)
    return row_size(vd, best) if best else 0

