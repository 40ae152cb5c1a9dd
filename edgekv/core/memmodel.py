"""Whole-process memory of a llama.cpp process: the peak it reaches, as named parts.

Pure: no llama.cpp, no processes, no I/O.  The edges (:mod:`edgekv.orchestration.procpredict`) gather the inputs --
the runtime baseline (measured once per environment, :mod:`edgekv.orchestration.calibrate`), llama.cpp's own dry
run (compute buffers reserved for the *workload's* graph through ``n_outputs_max``, and the host
memory the dry-run process grew by while llama.cpp read the header and built its tensors), the GGUF
tensor table and the cache formula -- and this module adds them up by llama.cpp's rules.

Every part names its ``source``: ``formula`` (computed here from the header), ``llama.cpp`` (its dry
run), ``measured`` (the runtime calibration, or the dry-run process's own growth).

What becomes *resident* on a CPU (vendored llama.cpp 0c1e570, paths under vendor/llama.cpp/):

* weights, mmap (default): the mapped tensor data is file-backed and every page is read by the first
  graph that runs (src/llama-model-loader.cpp load_all_data; llama-mmap.cpp): all tensor bytes.
* the mapping after loading: llama.cpp keeps mapped only the span from the first to the last tensor it left in
  the mapping (the CPU tensors not repacked; on Metal the offloaded ones too) and unmaps the pages before and
  after it once every tensor is loaded (src/llama-model-loader.cpp:1778-1788 ``unmap_fragment``, mmaps_used
  :1666-1668; llama-mmap.cpp:518-560 rounds the span out to whole pages; a no-op on Windows).  A repacked
  ``output.weight`` at the end of the file (Q4_K 8B models: 334 MiB) is read while loading and gone before the
  context exists: the process peaks either while loading (the whole mapping and the repacked copies, nothing
  of the context yet) or later without those pages, whichever is larger.
* weights, ``--no-mmap``: one anonymous CPU buffer holding the tensors that are not repacked.
* CPU_REPACK: tensors whose type the CPU backend re-lays for its GEMM kernels get an anonymous copy
  (ggml/src/ggml-cpu/repack.cpp ``ggml_repack_get_optimal_repack_type``: q4_0, q4_K, iq4_nl, mxfp4 with
  AVX2 and q2_K with AVX512 on x86, when ne[1] % 8 == 0; matrix weights only, never token_embd, which
  is read by GET_ROWS).  With mmap the original pages are still read while repacking, so they stay
  resident as well.
* AMX (Intel Xeons since Sapphire Rapids, a build with ``__AMX_INT8__`` and ``__AVX512VNNI__``: its system info
  says ``AMX_INT8 = 1``): the CPU backend offers its extra buffer types in a fixed order, AMX first, then
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
* KV cache / recurrent state: cleared when created (llama-kv-cache.cpp ``ggml_backend_buffer_clear``),
  so all of it is resident from the start.
* compute buffer: ggml-alloc reserves the worst graph for n_ubatch tokens and n_outputs_max outputs
  (llama-context.cpp:896-898), but the pages a CPU graph writes are those of the graph that runs;
  the dry run with ``n_outputs_max`` set to the workload's outputs per ubatch reserves exactly that
  graph, so its size is the resident share.  A GPU backend allocates the reservation whole, at the
  process's own ``n_outputs_max`` (default n_batch).
* thread work buffer: ggml-cpu.c ``ggml_graph_plan``: the largest per-node scratch, for a matrix
  product the activations converted to the weight's vec_dot type (row_size(vec_dot, K x n_tokens)),
  plus one cache line per thread (ggml-cpu.cpp allocates it with ``new uint8_t[work_size]``).  Without
  flash attention the largest is usually the attention scores converted for V (``kq_work_bytes``):
  n_kv x n_tokens x n_head, 18 MiB for SmolLM2's fill of 2048 cells in ubatches of 512.
* output buffer: n_vocab floats per output row the workload keeps (llama-context.cpp:2120-2143,
  ``output_reserve``): 1 row per sequence for generation, n_batch rows for perplexity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from edgekv.core.predict import pad
from edgekv.core.units import MIB

WORKLOAD_GENERATE = "generate"
WORKLOAD_PERPLEXITY = "perplexity"
WORKLOAD_BENCH = "bench"
WORKLOADS = (WORKLOAD_GENERATE, WORKLOAD_PERPLEXITY, WORKLOAD_BENCH)
WORKLOAD_HELP = {
    WORKLOAD_GENERATE: "llama-cli / llama-server: prompt in -b/-ub batches, one output per sequence",
    WORKLOAD_PERPLEXITY: "llama-perplexity / edgekv quality: logits for every token of a batch",
    WORKLOAD_BENCH: "edgekv bench / llama-bench: random prompt and single-token decodes, one output per batch",
}

SRC_FORMULA = "formula"
SRC_LLAMA = "llama.cpp dry run"
SRC_LLAMA_MEASURED = "measured (llama.cpp dry-run process)"
SRC_CALIBRATION = "measured (runtime calibration)"

HOST = "host"

CACHE_LINE_SIZE = 64          # ggml-cpu.c CACHE_LINE_SIZE (x86, arm64)
GLIBC_MMAP_THRESHOLD_MAX = 32 * MIB   # glibc malloc: DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; larger blocks are always mapped

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


# -- workloads ----------------------------------------------------------------------------------------

def workload_outputs(workload: str, n_batch: int, n_ubatch: int, n_seq_max: int = 1) -> tuple[int, int]:
    """(outputs per ubatch the graph computes, output rows the output buffer holds) for a workload."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    n_seq = max(1, n_seq_max)
    if workload == WORKLOAD_PERPLEXITY:
        return n_ubatch, max(n_batch, n_seq)
    return min(n_ubatch, n_seq), n_seq


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


# -- llama-server ------------------------------------------------------------------------------------
#
# What a llama-server process (vendored llama.cpp 0c1e570) holds at its peak beyond what the runtime baseline (the
# binary at the moment it opens its model) and llama.cpp's dry run (model and first context, no decode) account
# for.  Found with strace -k (which call grew the heap / mapped memory), heaptrack (what is live at the end of a
# run), /proc/PID/pagemap (which pages of a buffer are resident) and /proc/PID/smaps (per mapping), on the bench's
# own sequence: a warmup request, then rounds of -np concurrent streamed /completion requests.

TOKEN_DATA_BYTES = 12        # sizeof(llama_token_data): id, logit, p

# ggml's graph metadata (ggml/src/ggml.c): ggml_tensor_overhead() = sizeof(ggml_object) + sizeof(ggml_tensor)
GGML_OBJECT_BYTES = 32       # sizeof(struct ggml_object), ggml.c:958
GGML_TENSOR_OVERHEAD = 368   # ggml_tensor_overhead(), ggml.c:1466 (32 + sizeof(struct ggml_tensor) = 336)
GGML_CGRAPH_BYTES = 96       # sizeof(struct ggml_cgraph), ggml-impl.h:341
GGML_MEM_ALIGN = 16
_GGML_HASH_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101,
                     262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757,
                     268435459, 536870923, 1073741827, 2147483659)   # ggml.c:6640 ggml_hash_size

# src/llama-context.cpp:2396-2422 graph_max_nodes: max(n_tokens * a, n_tensors * b) for these architectures
# (DeepSeek-V4-style DFlash drafts too, not told apart here); every other one: max(1024, 8 * n_tensors)
_GRAPH_NODES = {
    **{a: (160, 64) for a in ("kimi-k3", "glm5-next")},
    "hrm_text": (80, 64),
    **{a: (40, 32) for a in ("qwen3next", "kimi-linear", "bailingmoe3", "qwen35", "qwen35moe", "qwen4exp",
                             "deepseek4", "nanbeige", "minimax-01", "minimax-m3", "hy_v4")},
}

# Code pages: the text of the server's own libraries that it runs once it serves (libllama-common: model/context
# init, warmup, common_sampler, chat templates; libllama-server-impl: slots, tasks, HTTP routes, streaming; libc,
# libmtmd) and of the CPU backend's kernels (the dry run computes nothing), net of the libllama/ggml-base pages the
# dry-run process counts that the server had touched before its baseline.  smaps Rss per library, baseline ->
# after the bench's requests, this build: libllama-common +832 KiB, libllama-server-impl +320, libc +128, libmtmd
# +64, libggml-cpu +640 (SmolLM2, q4_1) / +832 (Gemma 3, q4_0 repacked) of which the dry run touches 176,
# libllama +852 (dry run +1032), libggml-base +32/+104 (dry run +124): 1.50 / 1.76 MiB.  A constant of this build:
# other builds and backends differ (a per-binary calibration after one request would measure it).
SERVER_CODE_PAGES_BYTES = 1_650 * 1024
SRC_SERVER_MEASURED = "measured (llama-server smaps, this build)"
# glibc gives every thread that mallocs its own arena (up to 8 x cores arenas; malloc/arena.c arena_get2): a fresh
# 64 MiB-aligned heap of which what the thread touches stays resident.  llama-server's HTTP pool has
# max(-np + 4, cores - 1) threads (tools/server/server-http.cpp:152, :528); a connection is served by one of them
# for its life, and a client's new connections land on whichever is free, so after a few rounds every pool thread
# has served one: its arena (smaps: 48-56 KiB each) and the pages its stack grew by (44 -> 64 KiB).
SERVER_THREAD_ARENA_BYTES = 48 * 1024
SERVER_THREAD_STACK_BYTES = 20 * 1024
SERVER_HTTP_EXTRA_THREADS = 4


def ggml_hash_size(n: int) -> int:
    """ggml.c ggml_hash_size: the smallest tabled prime >= n."""
    return next((p for p in _GGML_HASH_PRIMES if p >= n), n | 1)


def ggml_graph_meta_bytes(max_nodes: int) -> int:
    """bytes of llm_graph_result::buf_compute_meta for a graph of ``max_nodes`` nodes (src/llama-graph.cpp:1348):
    ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false) (ggml.c:7460-7480)."""
    def pad(x: int, a: int) -> int:
        return -(-x // a) * a

    h = ggml_hash_size(2 * max_nodes)
    p = GGML_CGRAPH_BYTES                         # the offsets ggml_graph_nbytes steps through (incr_ptr_aligned)
    p = pad(p, 8) + 8 * max_nodes                 # nodes
    p = pad(p, 8) + 8 * max_nodes                 # leafs
    p = pad(p, 4) + 4 * h                         # use_counts
    p = pad(p, 8) + 8 * h                         # visited hash keys
    p = pad(p, 4) + 4 * ((h + 31) >> 5)           # bitset
    return GGML_TENSOR_OVERHEAD * max_nodes + GGML_OBJECT_BYTES + pad(p, GGML_MEM_ALIGN)


def graph_max_nodes(arch: str, n_tensors: int, n_tokens: int) -> int:
    """llama_context::graph_max_nodes (src/llama-context.cpp:2396) without LoRA or backend samplers; n_tokens is
    min(n_ctx, n_ubatch) (:629)."""
    if arch in _GRAPH_NODES:
        per_token, per_tensor = _GRAPH_NODES[arch]
        return max(n_tokens * per_token, per_tensor * n_tensors)
    return max(1024, 8 * n_tensors)


def server_parts(n_slots: int, n_vocab: int, n_tensors: int = 0, arch: str = "", n_ubatch: int = 512) -> list[Part]:
    """What a llama-server holds beyond the runtime baseline and llama.cpp's dry run once its ``n_slots`` slots have
    served a request (the bench's warmup request, then rounds of ``n_slots`` concurrent ones)."""
    parts = [Part("llama-server samplers", n_slots * n_vocab * TOKEN_DATA_BYTES, SRC_FORMULA,
                  note=f"{n_slots} slot(s), each with its sampler's {n_vocab} candidates: common/sampling.cpp:155 "
                       "set_logits cur.resize(n_vocab) of 12-byte llama_token_data, made anew for every request "
                       "(tools/server/server-context.cpp:1764 common_sampler_init; the old one is freed) and sampled "
                       "in place (the chain logit-bias -> top-k -> dist, src/llama-sampler.cpp:681; top_k <= 128 "
                       "sorts in place, :198): the one n_vocab-sized allocation per slot; on the heap, as glibc's "
                       "mmap threshold has risen past it while the model loaded")]
    if n_tensors:
        nodes = graph_max_nodes(arch, n_tensors, n_ubatch)
        parts.append(Part("graph of the last decode", ggml_graph_meta_bytes(nodes), SRC_FORMULA,
                          note=f"src/llama-context.cpp:2458 get_gf_res_prev: a second llm_graph_result beside the "
                               f"reserved one, made by the first llama_decode (the server's warmup, "
                               f"common/common.cpp:1416): its metadata buffer for {nodes} nodes is zero-filled "
                               "(src/llama-graph.cpp:1348; ggml_tensor_overhead() x nodes + the graph's hash set); "
                               "a ubatch without outputs (a prompt longer than -ub) adds one more, gf_res_prev[0]"))
    parts.append(Part("llama-server code pages", SERVER_CODE_PAGES_BYTES, SRC_SERVER_MEASURED, kind="file",
                      note="text pages run while serving that neither the baseline (taken as the model file opens) "
                           "nor the dry run touched: libllama-common, libllama-server-impl, libc and the CPU "
                           "kernels (smaps, this build; see SERVER_CODE_PAGES_BYTES)"))
    n_threads = n_slots + SERVER_HTTP_EXTRA_THREADS
    parts.append(Part("llama-server HTTP threads", n_threads * (SERVER_THREAD_ARENA_BYTES + SERVER_THREAD_STACK_BYTES),
                      SRC_FORMULA,
                      note=f"{n_threads} HTTP pool threads (-np + 4, tools/server/server-http.cpp:152) that have "
                           "served a connection: glibc's per-thread malloc arena (48 KiB touched) and stack pages "
                           "(20 KiB) each"))
    return parts


# -- the model ----------------------------------------------------------------------------------------

@dataclass
class Part:
    name: str
    bytes: int
    source: str
    where: str = HOST            # "host" or a ggml device name (CUDA0, Metal, ...)
    kind: str = "anonymous"      # anonymous | file | device
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MappedFile:
    """One GGUF file as llama.cpp maps it: where its data section starts and each tensor's offset in it."""
    data_offset: int
    offsets: dict[str, int]


@dataclass
class ProcessInputs:
    workload: str
    n_ubatch: int
    n_batch: int
    n_seq_max: int
    n_threads: int
    tensors: Sequence[Tensor]
    n_vocab: int
    n_layer: int
    cpu_features: Sequence[str] = ()
    use_mmap: bool = True
    use_extra_bufts: bool = True                # llama-bench --repack (off: no AMX, no CPU_REPACK copy)
    n_gpu_layers: int = 0                       # layers actually offloaded (0 on a CPU-only build)
    gpu_device: str | None = None               # e.g. "CUDA0"
    baseline_bytes: int | None = None
    baseline_note: str = ""
    kv_host_bytes: int = 0                      # formula, layers on the CPU (or all with -nkvo)
    kv_device_bytes: int = 0                    # formula, layers on the device
    compute_workload: dict[str, int] | None = field(default_factory=dict)   # dry run at the workload's n_outputs_max
    compute_note: str = ""                      # why compute_workload is None
    compute_reserved: dict[str, int] = field(default_factory=dict)   # dry run at the process's own n_outputs_max
    host_structures_bytes: int | None = None    # dry-run process growth: vocab, tensor metadata, code pages
    host_structures_note: str = ""
    state_copy_bytes: int = 0                   # llama-bench keeps the depth state in memory (cstate.buf)
    restore_buffer_bytes: int = 0               # edgekv bench's state-file restore: the read buffer malloc keeps
    kq_work_bytes: int = 0                      # without flash attention: the scores converted for V (kq_work_bytes)
    server_slots: int = 0                       # llama-server: slots in use at once (-np), 0: not a server
    arch: str = ""                              # general.architecture (llama-server: its graph's node budget)
    gpu_runtime_device_bytes: int | None = None  # the GPU runtime beside llama.cpp's buffers (calibration), device
    gpu_runtime_host_bytes: int | None = None    # ... and on the host
    gpu_runtime_note: str = ""
    gpu_graph_host_bytes_per_node: float | None = None   # CUDA graphs of one-token decodes (calibration)
    graph_nodes_tg: int | None = None           # llama.cpp's one-token graph (its dry run's "graph: nodes =" line)
    files: Sequence[MappedFile] = ()            # the mapping's layout (empty: unknown, nothing unmapped is modelled)
    page_size: int = 4096                       # the OS page (0: llama.cpp unmaps nothing, as on Windows)


@dataclass
class ProcessPrediction:
    workload: str
    peak_rss_bytes: int | None
    device_bytes: dict[str, int]
    parts: list[Part]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "peak_rss_bytes": self.peak_rss_bytes,
                "device_bytes": dict(self.device_bytes), "parts": [p.to_dict() for p in self.parts],
                "notes": list(self.notes)}

    def host_parts(self) -> list[Part]:
        return [p for p in self.parts if p.where == HOST]


def _is_host_buffer(name: str) -> bool:
    """ggml buffer types that live in host memory: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host (pinned)."""
    return name.upper().startswith("CPU") or name.endswith("_Host")


EXTRA_NOTES = {
    BUFT_AMX: "{n} tensors packed for the AMX kernels (an anonymous copy; the mapped pages were read while packing)",
    BUFT_REPACK: "{n} tensors re-laid for the CPU GEMM kernels",
}


def _measured_parts(x: ProcessInputs, notes: list[str]) -> list[Part]:
    """The parts measured rather than derived: the runtime baseline and llama.cpp's host structures."""
    parts: list[Part] = []
    if x.baseline_bytes is None:
        notes.append("no runtime baseline: " + (x.baseline_note or "calibration failed") +
                     "; peak_rss_bytes is not predicted")
    else:
        parts.append(Part("runtime baseline", x.baseline_bytes, SRC_CALIBRATION, note=x.baseline_note))
    if x.host_structures_bytes is not None:
        parts.append(Part("llama.cpp host structures", x.host_structures_bytes, SRC_LLAMA_MEASURED,
                          note=x.host_structures_note or "vocabulary, tensor and graph metadata, code pages "
                                                         "touched while loading"))
    return parts


def _host_weight_parts(x: ProcessInputs, host: list[Tensor]) -> list[Part]:
    """The weights on the host: the file mapping (or the anonymous CPU buffer) and the extra buffer types' copies."""
    parts: list[Part] = []
    extra = extra_buffer_types(x.cpu_features, x.use_extra_bufts)
    in_extra = sum(t.n_bytes for t in host if extra_buffer_of(t, extra, x.cpu_features) is not None)
    if x.use_mmap:
        # every tensor's pages are read: the CPU ones by the graph, the repacked and offloaded ones while
        # loading (copied out of the mapping); llama.cpp unmaps only the ranges outside the CPU tensors
        mapped = sum(t.n_bytes for t in host)
        parts.append(Part("weights (mmap)", mapped, SRC_FORMULA, kind="file",
                          note=f"{len(host)} tensors read through the file mapping"))
    else:
        parts.append(Part("weights (--no-mmap)", sum(t.n_bytes for t in host) - in_extra, SRC_FORMULA,
                          note="CPU model buffer: tensors read into anonymous memory"))
    tied_host = not (x.gpu_device and tensor_on_gpu("output.weight", x.n_layer, x.n_gpu_layers))
    for buft, (b, n) in extra_buffer_bytes(host, x.cpu_features, x.use_extra_bufts, tied_host).items():
        parts.append(Part(f"weights ({buft} copy)", b, SRC_FORMULA, note=EXTRA_NOTES[buft].format(n=n)))
    return parts


def _kept_in_mapping(x: ProcessInputs, t: Tensor, on_gpu: set[str], extra: Sequence[str]) -> bool:
    """Whether llama.cpp leaves ``t`` in the file mapping (a CPU_Mapped tensor; Metal maps offloaded ones too)."""
    if t.name in on_gpu:
        return (x.gpu_device or "").upper().startswith(("METAL", "MTL"))
    return extra_buffer_of(t, extra, x.cpu_features) is None


def unmapped_after_load(x: ProcessInputs, host: Sequence[Tensor]) -> tuple[int, list[str]]:
    """(host tensor bytes llama.cpp unmaps once loaded, their names): the pages of each mapping before its first
    and after its last kept tensor, rounded inwards to whole pages (src/llama-model-loader.cpp:1778-1788)."""
    if not (x.use_mmap and x.files and x.page_size):
        return 0, []
    extra = extra_buffer_types(x.cpu_features, x.use_extra_bufts)
    by_name = {t.name: t for t in x.tensors}
    host_names = {t.name for t in host}
    on_gpu = set(by_name) - host_names
    pg, total, names = x.page_size, 0, []
    for f in x.files:
        spans = {n: (f.data_offset + off, f.data_offset + off + by_name[n].n_bytes)
                 for n, off in f.offsets.items() if n in by_name}
        kept = [spans[n] for n in spans if _kept_in_mapping(x, by_name[n], on_gpu, extra)]
        if kept:
            first, last = min(a for a, _ in kept) // pg * pg, -(-max(b for _, b in kept) // pg) * pg
        else:
            first, last = max((b for _, b in spans.values()), default=0), 0     # nothing kept: all of it goes
        for n, (a, b) in spans.items():
            gone = max(0, min(b, first) - a) + (max(0, b - max(a, last)) if last else 0)
            if n in host_names and gone:
                total += min(gone, b - a)
                names.append(n)
    return total, names


def _phase_parts(x: ProcessInputs, parts: list[Part], host: list[Tensor], load_parts: int) -> list[Part]:
    """The mapping's pages llama.cpp unmaps after loading, as a negative part; and, when the process peaks while
    loading (the whole mapping and the repacked copies resident, the context not yet created), what of them the
    peak still holds."""
    gone, names = unmapped_after_load(x, host)
    if not gone:
        return []
    what = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    out = [Part("weights (mmap) unmapped after loading", -gone, SRC_FORMULA, kind="file",
                note=f"{what}: read while loading, then unmapped (outside the tensors left in the mapping)")]
    context = sum(p.bytes for p in parts[load_parts:] if p.where == HOST)
    if gone > context:
        out.append(Part("weights (mmap) until loaded", gone - context, SRC_FORMULA, kind="file",
                        note=f"the process peaks while loading: these pages were still mapped and the context's "
                             f"{context / MIB:.1f} MiB not yet allocated"))
    return out


def _device_weight_parts(x: ProcessInputs, on_gpu: list[Tensor]) -> list[Part]:
    """The offloaded layers' weights on the GPU device (none when nothing is offloaded)."""
    if not (on_gpu and x.gpu_device):
        return []
    dev_w = sum(device_alloc_bytes(t, x.gpu_device) for t in on_gpu)
    tied = not any(t.name == "output.weight" for t in x.tensors)
    note = f"{x.n_gpu_layers} layers offloaded"
    if tied and tensor_on_gpu("output.weight", x.n_layer, x.n_gpu_layers):
        # tied embeddings: the output layer loads token_embd again, on the output layer's device
        emb = [t for t in x.tensors if t.name == "token_embd.weight"]
        dev_w += sum(device_alloc_bytes(t, x.gpu_device) for t in emb)
        note += "; token_embd duplicated there as the (tied) output layer"
    return [Part("weights", dev_w, SRC_FORMULA, where=x.gpu_device, kind="device", note=note)]


def _kv_parts(x: ProcessInputs) -> list[Part]:
    """The KV cache on the host and, when some of it is offloaded, on the device."""
    parts = [Part("KV cache", x.kv_host_bytes, SRC_FORMULA, note="cleared at creation: all resident")]
    if x.kv_device_bytes and x.gpu_device:
        parts.append(Part("KV cache", x.kv_device_bytes, SRC_FORMULA, where=x.gpu_device, kind="device"))
    return parts


def _compute_parts(x: ProcessInputs, n_out_ubatch: int, notes: list[str]) -> list[Part]:
    """The compute buffers: on the host the pages the workload's graph touches, pinned and device buffers whole."""
    parts: list[Part] = []
    if x.compute_workload is None:
        notes.append("compute buffer unknown (" + (x.compute_note or "no dry run") + "); peak_rss_bytes is not predicted")
    for buft, b in sorted((x.compute_workload or {}).items()):
        if _is_host_buffer(buft) and not buft.endswith("_Host"):
            parts.append(Part("compute buffer", b, SRC_LLAMA,
                              note=f"{buft}: graph reserved for {n_out_ubatch} output(s) per ubatch of "
                                   f"{x.n_ubatch} (the pages a CPU graph touches)"))
    for buft, b in sorted(x.compute_reserved.items()):
        if buft.endswith("_Host"):     # pinned host memory: resident whole
            parts.append(Part("compute buffer", b, SRC_LLAMA, note=f"{buft}: pinned, allocated whole"))
        elif not _is_host_buffer(buft):
            parts.append(Part("compute buffer", b, SRC_LLAMA, where=buft, kind="device",
                              note="a device allocates the whole reservation"))
    return parts


def _host_buffer_parts(x: ProcessInputs, host: list[Tensor], n_out_ubatch: int, out_rows: int) -> list[Part]:
    """The smaller host buffers: the threads' work buffer, the state buffers of a restored depth, the logits and
    llama-server's own allocations."""
    parts: list[Part] = []
    host_tokens_on_cpu = x.n_gpu_layers < x.n_layer + 1 or not x.gpu_device
    if host_tokens_on_cpu:
        work = work_buffer_bytes(host if x.gpu_device else x.tensors, x.n_ubatch, n_out_ubatch, x.n_threads)
        kq = work_scratch_bytes(x.kq_work_bytes, x.n_threads)
        if kq > work:
            parts.append(Part("thread work buffer", kq, SRC_FORMULA,
                              note=f"attention scores converted for V without flash attention (the largest ubatch x "
                                   f"cells of the run), {x.n_threads} threads"))
        elif work:
            parts.append(Part("thread work buffer", work, SRC_FORMULA,
                              note=f"largest activation conversion for {x.n_ubatch} tokens, {x.n_threads} threads"))
    if x.restore_buffer_bytes:
        parts.append(Part("depth-state read buffer", x.restore_buffer_bytes, SRC_FORMULA,
                          note="edgekv bench restores sliding-window/recurrent caches from a state file: "
                               "llama_state_seq_load_file reads one layer's rows at a time into a buffer "
                               "(src/llama-context.cpp llama_io_read_file::read_to_tensor) that glibc's malloc keeps "
                               "once its mmap threshold has risen to that size (at most 32 MiB)"))
    if x.state_copy_bytes:
        parts.append(Part("depth state copy", x.state_copy_bytes, SRC_FORMULA,
                          note="llama-bench keeps llama_state_seq_get_data of the filled cache in memory "
                               "(tools/llama-bench/llama-bench.cpp cstate.buf)"))
    parts.append(Part("output buffer", x.n_vocab * 4 * out_rows, SRC_FORMULA,
                      note=f"logits for {out_rows} row(s) of {x.n_vocab} tokens"))
    if x.server_slots:
        parts += server_parts(x.server_slots, x.n_vocab, len(x.tensors), x.arch, x.n_ubatch)
    return parts


def predict_process(x: ProcessInputs) -> ProcessPrediction:
    """Peak resident memory of the process (and memory per device) for one configuration: one Part per
    allocation of the process, in llama.cpp's allocation order."""
    n_out_ubatch, out_rows = workload_outputs(x.workload, x.n_batch, x.n_ubatch, x.n_seq_max)
    notes: list[str] = []
    parts = _measured_parts(x, notes)
    on_gpu = [t for t in x.tensors if tensor_on_gpu(t.name, x.n_layer, x.n_gpu_layers)]
    gpu_names = {t.name for t in on_gpu}
    host = [t for t in x.tensors if t.name not in gpu_names]
    parts += _host_weight_parts(x, host)
    parts += _device_weight_parts(x, on_gpu)
    load_parts = len(parts)
    parts += _kv_parts(x)
    parts += _compute_parts(x, n_out_ubatch, notes)
    parts += _host_buffer_parts(x, host, n_out_ubatch, out_rows)
    device: dict[str, int] = {}
    if x.gpu_device and x.n_gpu_layers > 0:
        parts += gpu_runtime_parts(x)
        if x.gpu_runtime_device_bytes is None:
            notes.append(f"{x.gpu_device}: llama.cpp's buffers only (weights, KV, compute); the backend's own runtime "
                         "(CUDA context, cuBLAS workspace, ggml-cuda's pool) is not predicted: "
                         + (x.gpu_runtime_note or "not calibrated"))
    parts += _phase_parts(x, parts, host, load_parts)
    for p in parts:
        if p.where != HOST:
            device[p.where] = device.get(p.where, 0) + p.bytes
    known = x.baseline_bytes is not None and x.compute_workload is not None
    peak = sum(p.bytes for p in parts if p.where == HOST) if known else None
    if x.host_structures_bytes is None:
        notes.append("llama.cpp's host structures were not measured (no dry run)")
    return ProcessPrediction(x.workload, peak, device, parts, notes)


def gpu_runtime_parts(x: ProcessInputs) -> list[Part]:
    """The GPU backend's own memory beside llama.cpp's buffers (edgekv.orchestration.calibrate.device_runtime,
    measured once per environment on the probe model): on the device the CUDA context, cuBLAS's workspace,
    ggml-cuda's pool (ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_pool_vmm: grown in steps, never returned), loaded
    kernels and CUDA graphs; on the host the driver's and the libraries' own memory once they run."""
    name = "CUDA runtime" if (x.gpu_device or "").upper().startswith("CUDA") else "GPU runtime"
    out = []
    if x.gpu_runtime_device_bytes is not None:
        out.append(Part(name, x.gpu_runtime_device_bytes, SRC_CALIBRATION, where=x.gpu_device or HOST, kind="device",
                        note="context, cuBLAS workspace, memory pool, kernels, graphs: " + x.gpu_runtime_note))
    if x.gpu_runtime_host_bytes is not None:
        out.append(Part(f"{name} (host side)", max(0, x.gpu_runtime_host_bytes), SRC_CALIBRATION,
                        note="driver and libraries once a batch has run on the device: " + x.gpu_runtime_note))
    if x.gpu_graph_host_bytes_per_node is not None and x.graph_nodes_tg:
        out.append(Part("CUDA graphs (host side)", int(x.gpu_graph_host_bytes_per_node * x.graph_nodes_tg),
                        SRC_CALIBRATION, note=f"single-token decodes captured as CUDA graphs: {x.graph_nodes_tg} nodes "
                                              f"x {x.gpu_graph_host_bytes_per_node:.0f} B per node (two probes)"))
    return out


# -- presentation helpers ---------------------------------------------------------------------------

STACK_ORDER = ("baseline", "weights", "KV", "compute", "output", "other")


def stack_category(part_name: str) -> str:
    n = part_name.lower()
    if n.startswith("runtime baseline"):
        return "baseline"
    if n.startswith("weights"):
        return "weights"
    if n.startswith("kv") or "recurrent" in n:
        return "KV"
    if n.startswith("compute"):
        return "compute"
    if n.startswith("output"):
        return "output"
    return "other"


def stacked(parts: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Host parts summed into the report's stack categories."""
    out = {k: 0 for k in STACK_ORDER}
    for p in parts:
        if p.get("where", HOST) == HOST:
            out[stack_category(p["name"])] += int(p["bytes"])
    return out
