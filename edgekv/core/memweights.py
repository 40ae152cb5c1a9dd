"""Where llama.cpp puts each weight tensor, and how many bytes each buffer gives it (part of the whole-process model,
:mod:`edgekv.core.memmodel`).  Pure: no llama.cpp, no I/O.

Rules of the vendored llama.cpp 0c1e570 (paths under vendor/llama.cpp/):

* CPU_REPACK: tensors whose type the CPU backend re-lays for its GEMM kernels get an anonymous copy
  (ggml/src/ggml-cpu/repack.cpp ``ggml_repack_get_optimal_repack_type``: q4_0, q4_K, iq4_nl, mxfp4 with
  AVX2 and q2_K with AVX512 on x86, when ne[1] % 8 == 0; matrix weights only, never token_embd, which
  is read by GET_ROWS).  With mmap the original pages are still read while repacking, so they stay
  resident as well.
* AMX (a CPU with AMX-INT8 and a build with ``__AMX_INT8__`` and ``__AVX512VNNI__``: its system info says
  ``AMX_INT8 = 1``): the CPU backend offers its extra buffer types in a fixed order, AMX first, then
  CPU_REPACK (ggml/src/ggml-cpu/ggml-cpu.cpp:42-71 ``ggml_backend_cpu_get_extra_buffer_types``), and llama.cpp gives
  each weight the first buffer type whose ``supports_op`` accepts the op it is used with
  (src/llama-model-loader.cpp:1067-1078 ``select_weight_buft``; the probe op is a MUL_MAT of the weight by a
  512-token f32 activation, :927-960).  AMX accepts a contiguous MUL_MAT (never MUL_MAT_ID, never GET_ROWS) of
  Q4_0/Q4_1/Q8_0 (ne0 % 32), Q4_K/Q5_K/Q6_K/IQ4_XS (ne0 % 256) or F16 (ne0 % 16) weights whose ne1 % 32 == 0
  (ggml-cpu/amx/amx.cpp:145-190).  Its copy is packed: ne1 rows of ``get_row_size`` bytes
  (amx/mmq.cpp:245-260, 2267-2287): the block bytes, plus an int32 per block for Q8_0, plus 4 bytes per block for
  Q4_K/Q5_K, plus 2 for IQ4_XS; F16 is copied as it is.  A tied output layer (no ``output.weight``) is a duplicate
  of token_embd that the output layer uses in a MUL_MAT, so it gets its own packed copy (the load log says
  ``amx repack tensor token_embd.weight``), while token_embd itself stays in the mapping.  With mmap the original
  pages are read while packing and stay resident, as for CPU_REPACK.
* ``use_extra_bufts = false`` (llama-bench ``--repack 0``, llama-cli ``-nr``) removes the extra buffer types
  altogether, AMX and CPU_REPACK alike (src/llama-model.cpp:1109-1125 ``make_cpu_buft_list``).
* a GPU device: the single-device layer split (src/llama-model.cpp:1589-1597) and CUDA's per-tensor padding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

# ggml type ids (ggml/include/ggml.h enum ggml_type) used by the rules below
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_Q8_K = 10, 11, 12, 13, 14, 15
T_IQ4_NL, T_IQ4_XS, T_BF16, T_MXFP4 = 20, 23, 30, 39

# (elements per block, bytes per block) of the vec_dot types activations are converted to
# (ggml/src/ggml-common.h block_q8_0 / block_q8_1 / block_q8_K)
_BLOCKS = {T_F32: (1, 4), T_F16: (1, 2), T_BF16: (1, 2), T_Q8_0: (32, 34), T_Q8_1: (32, 36), T_Q8_K: (256, 292)}

# weight type -> vec_dot_type (ggml/src/ggml-cpu/ggml-cpu.c type_traits_cpu)
_Q8_0_DOT = {T_Q4_0, T_Q5_0, T_Q8_0, T_IQ4_NL, T_MXFP4}
_Q8_1_DOT = {T_Q4_1, T_Q5_1}
_KQ_DOT = {T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_IQ4_XS}


def vec_dot_type(ggml_type: int) -> int | None:
    if ggml_type in _Q8_0_DOT:
        return T_Q8_0
    if ggml_type in _Q8_1_DOT:
        return T_Q8_1
    if ggml_type in _KQ_DOT:
        return T_Q8_K
    if ggml_type in (T_F16, T_BF16):
        return ggml_type
    if ggml_type == T_F32:
        return T_F32
    return T_Q8_K if ggml_type > T_Q8_K else T_Q8_0   # i-quants: q8_K; anything else: the common case


def row_size(ggml_type: int, n: int) -> int:
    blk, size = _BLOCKS[ggml_type]
    return -(-n // blk) * size


class Tensor(Protocol):
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_bytes: int


# -- weights ------------------------------------------------------------------------------------------

# tensors llama.cpp reads by GGML_OP_GET_ROWS, a row per token, never in a matrix product (llama-arch.cpp
# LLM_TENSOR_INFOS): the extra buffer types (CPU_REPACK, AMX) do not take them and a decoded token reads one row
GET_ROWS_TENSORS = ("token_embd", "position_embd", "token_types", "per_layer_token_embd", "d2t", "markov_w1",
                    "selector_predecessor", "selector_successor")
GET_ROWS_BLOCK_TENSORS = ("attn_compressor_ape", "indexer_compressor_ape", "attn_rel_b", "ffn_gate_tid2eid",
                          "nextn.embed_tokens")


def is_get_rows(name: str) -> bool:
    base = name.removesuffix(".weight").removesuffix(".bias")
    if base in GET_ROWS_TENSORS:
        return True
    parts = base.split(".", 2)       # blk.N.NAME, enc.blk.N.NAME, dec.blk.N.NAME
    if parts[0] in ("enc", "dec"):
        parts = base.split(".", 3)[1:]
    return len(parts) == 3 and parts[0] == "blk" and parts[2] in GET_ROWS_BLOCK_TENSORS


def is_matrix_weight(t: Tensor) -> bool:
    """A weight that enters a matrix product (MUL_MAT / MUL_MAT_ID): 2-D or stacked experts, not a table read
    by GET_ROWS (the token embedding, Gemma 3n/4's per-layer embeddings: :data:`GET_ROWS_TENSORS`) nor
    norms/biases (1-D)."""
    return len([d for d in t.shape if d > 1]) >= 2 and not is_get_rows(t.name)


def repacked(t: Tensor, cpu_features: Iterable[str]) -> bool:
    """Whether the CPU backend keeps a CPU_REPACK copy of this tensor (x86 and arm64 rules)."""
    if not is_matrix_weight(t) or len(t.shape) < 2:
        return False
    f = {x.lower() for x in cpu_features}
    ne1 = t.shape[1]
    avx2, avx512 = "avx2" in f, "avx512" in f
    neon_i8mm = "neon" in f and "matmul_int8" in f
    neon_dot = "neon" in f and "dotprod" in f
    if t.ggml_type == T_Q4_0:
        return ((avx2 and ne1 % 8 == 0) or ((neon_i8mm or neon_dot) and ne1 % 4 == 0))
    if t.ggml_type == T_Q4_K:
        return (avx2 or neon_i8mm or neon_dot) and ne1 % 8 == 0
    if t.ggml_type == T_Q2_K:
        return avx512 and ne1 % 8 == 0
    if t.ggml_type in (T_IQ4_NL, T_MXFP4):
        return (avx2 and ne1 % 8 == 0) or (neon_dot and ne1 % 4 == 0)
    if t.ggml_type in (T_Q5_K, T_Q6_K):
        return (neon_i8mm or neon_dot) and ne1 % 8 == 0
    if t.ggml_type == T_Q8_0:
        return (neon_i8mm or neon_dot) and ne1 % 4 == 0
    return False


# -- extra buffer types (AMX, CPU_REPACK) ----------------------------------------------------------------

BUFT_AMX = "AMX"
BUFT_REPACK = "CPU_REPACK"
TENSOR_ALIGNMENT = 32          # ggml/src/ggml-impl.h: both extra buffer types align tensors to it
AMX_TILE_N = 16                # ggml-cpu/amx/common.h TILE_N: supports_op wants ne1 % (2 * TILE_N)
# (block elements, block bytes, extra bytes per block in the packed row): amx/mmq.cpp get_row_size
_AMX_ROW = {T_Q4_0: (32, 18, 0), T_Q4_1: (32, 20, 0), T_Q8_0: (32, 34, 4),
            T_Q4_K: (256, 144, 4), T_Q5_K: (256, 176, 4), T_Q6_K: (256, 210, 0), T_IQ4_XS: (256, 136, 2)}
_AMX_F16_ALIGN = 16


def extra_buffer_types(cpu_features: Iterable[str], use_extra_bufts: bool = True) -> tuple[str, ...]:
    """The CPU backend's extra buffer types, in llama.cpp's order, from its system info's features (lower-case:
    ``amx_int8``, ``avx512_vnni``, ``repack``); none with ``use_extra_bufts`` off (``--repack 0``)."""
    if not use_extra_bufts:
        return ()
    f = {x.lower() for x in cpu_features}
    out = []
    if "amx_int8" in f and "avx512_vnni" in f:
        out.append(BUFT_AMX)
    if "repack" in f:
        out.append(BUFT_REPACK)
    return tuple(out)


def amx_supported(t: Tensor) -> bool:
    """amx.cpp supports_op for the MUL_MAT llama.cpp probes the weight with."""
    if not is_matrix_weight(t) or any(d != 1 for d in t.shape[2:]) or "_exps" in t.name:
        return False                        # GET_ROWS, norms, and MUL_MAT_ID experts never go there
    k, n = t.shape[0], t.shape[1]
    if n % (2 * AMX_TILE_N):
        return False
    if t.ggml_type == T_F16:
        return k % _AMX_F16_ALIGN == 0
    row = _AMX_ROW.get(t.ggml_type)
    return row is not None and k % row[0] == 0


def amx_alloc_bytes(t: Tensor) -> int:
    """ggml_backend_amx_get_alloc_size: ne1 packed rows (F16 and other types: the tensor's own bytes)."""
    row = _AMX_ROW.get(t.ggml_type)
    if row is None:
        return t.n_bytes
    blk, size, extra = row
    return t.shape[1] * (t.shape[0] // blk) * (size + extra)


def extra_buffer_of(t: Tensor, extra: Sequence[str], cpu_features: Iterable[str]) -> str | None:
    """The extra buffer type llama.cpp puts a host weight in (the first in ``extra`` that supports it), or None:
    the plain CPU buffer (the file mapping, or the anonymous model buffer with --no-mmap)."""
    for buft in extra:
        if buft == BUFT_AMX and amx_supported(t):
            return BUFT_AMX
        if buft == BUFT_REPACK and repacked(t, cpu_features):
            return BUFT_REPACK
    return None


@dataclass(frozen=True)
class _TiedOutput:
    """token_embd as the output layer uses it (llama.cpp's TENSOR_DUPLICATED): a MUL_MAT weight of its own."""
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_bytes: int


def tied_output(tensors: Sequence[Tensor]) -> Tensor | None:
    """The output layer's duplicate of token_embd when the file has no ``output.weight`` (tied embeddings)."""
    if any(t.name == "output.weight" for t in tensors):
        return None
    emb = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if emb is None or len(emb.shape) < 2:
        return None
    return _TiedOutput("output.weight", tuple(emb.shape), emb.ggml_type, emb.n_bytes)


def extra_buffer_bytes(tensors: Sequence[Tensor], cpu_features: Iterable[str], use_extra_bufts: bool = True,
                       tied_on_host: bool = True) -> dict[str, tuple[int, int]]:
    """{buffer type: (bytes llama.cpp allocates, tensors)} of the extra buffers, as its load log prints them
    (``load_tensors: AMX model buffer size = ...``): each tensor's alloc size padded to the buffer's alignment."""
    feats = list(cpu_features)
    extra = extra_buffer_types(feats, use_extra_bufts)
    out: dict[str, tuple[int, int]] = {}
    if not extra:
        return out
    tied = tied_output(tensors) if tied_on_host else None
    for t in list(tensors) + ([tied] if tied is not None else []):
        buft = extra_buffer_of(t, extra, feats)
        if buft is None:
            continue
        size = amx_alloc_bytes(t) if buft == BUFT_AMX else t.n_bytes
        b, n = out.get(buft, (0, 0))
        out[buft] = (b + -(-size // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT, n + 1)
    return out


def layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        try:
            return int(name.split(".")[1])
        except (IndexError, ValueError):
            return None
    return None


def tensor_on_gpu(name: str, n_layer: int, n_gpu_layers: int) -> bool:
    """llama.cpp's single-device split (src/llama-model.cpp:1589-1597): layer il is offloaded iff
    il >= n_layer + 1 - n_gpu_layers; the output layer counts as layer n_layer; the input layer
    (token_embd) always stays on the CPU."""
    if n_gpu_layers <= 0:
        return False
    first = max(0, n_layer + 1 - n_gpu_layers)
    il = layer_of(name)
    if il is not None:
        return il >= first
    if name.startswith("token_embd"):
        return False
    return n_layer >= first            # output, output_norm: the output "layer"


CUDA_ALIGNMENT = 128          # ggml-cuda.cu buffer type alignment
CUDA_MATRIX_ROW_PADDING = 512  # ggml-cuda/common.cuh MATRIX_ROW_PADDING


def device_alloc_bytes(t: Tensor, device: str) -> int:
    """Bytes a device buffer gives a weight tensor: on CUDA a quantized tensor whose rows are not a multiple
    of 512 gets one padded row (ggml-cuda.cu get_alloc_size), and every tensor is aligned to 128 bytes."""
    size = t.n_bytes
    if device.upper().startswith("CUDA"):
        ne0 = t.shape[0] if t.shape else 0
        n_rows = 1
        for d in t.shape[1:]:
            n_rows *= d
        quantized = t.ggml_type not in (T_F32, T_F16, T_BF16)
        if quantized and ne0 and ne0 % CUDA_MATRIX_ROW_PADDING:
            row_bytes = t.n_bytes // n_rows
            size += (CUDA_MATRIX_ROW_PADDING - ne0 % CUDA_MATRIX_ROW_PADDING) * row_bytes // ne0
        size = -(-size // CUDA_ALIGNMENT) * CUDA_ALIGNMENT
    return size

