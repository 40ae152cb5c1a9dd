"""What a llama-server process holds beyond the runtime baseline and llama.cpp's dry run (part of the whole-process
model, :mod:`edgekv.core.memmodel`), and the size of ggml's graph metadata.  Pure."""

from __future__ import annotations

from edgekv.core.mempart import SRC_FORMULA, ProcessPart

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


def server_parts(n_slots: int, n_vocab: int, n_tensors: int = 0, arch: str = "", n_ubatch: int = 512) -> list[ProcessPart]:
    """What a llama-server holds beyond the runtime baseline and llama.cpp's dry run once its ``n_slots`` slots have
    served a request (the bench's warmup request, then rounds of ``n_slots`` concurrent ones)."""
    parts = [ProcessPart("llama-server samplers", n_slots * n_vocab * TOKEN_DATA_BYTES, SRC_FORMULA,
                  note=f"{n_slots} slot(s), each with its sampler's {n_vocab} candidates: common/sampling.cpp:155 "
                       "set_logits cur.resize(n_vocab) of 12-byte llama_token_data, made anew for every request "
                       "(tools/server/server-context.cpp:1764 common_sampler_init; the old one is freed) and sampled "
                       "in place (the chain logit-bias -> top-k -> dist, src/llama-sampler.cpp:681; top_k <= 128 "
                       "sorts in place, :198): the one n_vocab-sized allocation per slot; on the heap, as glibc's "
                       "mmap threshold has risen past it while the model loaded")]
    if n_tensors:
        nodes = graph_max_nodes(arch, n_tensors, n_ubatch)
        parts.append(ProcessPart("graph of the last decode", ggml_graph_meta_bytes(nodes), SRC_FORMULA,
                          note=f"src/llama-context.cpp:2458 get_gf_res_prev: a second llm_graph_result beside the "
                               f"reserved one, made by the first llama_decode (the server's warmup, "
                               f"common/common.cpp:1416): its metadata buffer for {nodes} nodes is zero-filled "
                               "(src/llama-graph.cpp:1348; ggml_tensor_overhead() x nodes + the graph's hash set); "
                               "a ubatch without outputs (a prompt longer than -ub) adds one more, gf_res_prev[0]"))
    parts.append(ProcessPart("llama-server code pages", SERVER_CODE_PAGES_BYTES, SRC_SERVER_MEASURED, kind="file",
                      note="text pages run while serving that neither the baseline (taken as the model file opens) "
                           "nor the dry run touched: libllama-common, libllama-server-impl, libc and the CPU "
                           "kernels (smaps, this build; see SERVER_CODE_PAGES_BYTES)"))
    n_threads = n_slots + SERVER_HTTP_EXTRA_THREADS
    parts.append(ProcessPart("llama-server HTTP threads", n_threads * (SERVER_THREAD_ARENA_BYTES + SERVER_THREAD_STACK_BYTES),
                      SRC_FORMULA,
                      note=f"{n_threads} HTTP pool threads (-np + 4, tools/server/server-http.cpp:152) that have "
                           "served a connection: glibc's per-thread malloc arena (48 KiB touched) and stack pages "
                           "(20 KiB) each"))
    return parts


