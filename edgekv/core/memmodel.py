"""Whole-process memory of a llama.cpp process: the peak it reaches, as named parts.

Pure: no llama.cpp, no processes, no I/O.  The edges (:mod:`edgekv.prediction.wholeprocess`) gather the inputs --
the runtime baseline (measured once per environment, :mod:`edgekv.calibration.baseline`), llama.cpp's own dry
run (compute buffers reserved for the *workload's* graph through ``n_outputs_max``, and the host
memory the dry-run process grew by while llama.cpp read the header and built its tensors), the GGUF
tensor table and the cache formula -- and this module adds them up by llama.cpp's rules.  Where each weight goes
is :mod:`edgekv.core.memweights`, the CPU backend's scratch :mod:`edgekv.core.memscratch`, llama-server's own
allocations :mod:`edgekv.core.memserver`; their public names are importable from here as well.

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
* the extra buffer types' copies (CPU_REPACK, AMX): :mod:`edgekv.core.memweights`.
* KV cache / recurrent state: cleared when created (llama-kv-cache.cpp ``ggml_backend_buffer_clear``),
  so all of it is resident from the start.
* compute buffer: ggml-alloc reserves the worst graph for n_ubatch tokens and n_outputs_max outputs
  (llama-context.cpp:896-898), but the pages a CPU graph writes are those of the graph that runs;
  the dry run with ``n_outputs_max`` set to the workload's outputs per ubatch reserves exactly that
  graph, so its size is the resident share.  A GPU backend allocates the reservation whole, at the
  process's own ``n_outputs_max`` (default n_batch).
* thread work buffer: :mod:`edgekv.core.memscratch`.
* output buffer: n_vocab floats per output row the workload keeps (llama-context.cpp:2120-2143,
  ``output_reserve``): 1 row per sequence for generation, n_batch rows for perplexity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

# the rules the parts are built from live in their own modules; their names stay importable from here
from edgekv.core.mempart import HOST as HOST
from edgekv.core.mempart import SRC_CALIBRATION as SRC_CALIBRATION
from edgekv.core.mempart import SRC_FORMULA as SRC_FORMULA
from edgekv.core.mempart import SRC_LLAMA as SRC_LLAMA
from edgekv.core.mempart import SRC_LLAMA_MEASURED as SRC_LLAMA_MEASURED
from edgekv.core.mempart import ProcessPart as ProcessPart
from edgekv.core.memscratch import CACHE_LINE_SIZE as CACHE_LINE_SIZE
from edgekv.core.memscratch import KQ_PAD as KQ_PAD
from edgekv.core.memscratch import kq_work_bytes as kq_work_bytes
from edgekv.core.memscratch import work_buffer_bytes as work_buffer_bytes
from edgekv.core.memscratch import work_scratch_bytes as work_scratch_bytes
from edgekv.core.memserver import ggml_graph_meta_bytes as ggml_graph_meta_bytes
from edgekv.core.memserver import graph_max_nodes as graph_max_nodes
from edgekv.core.memserver import server_parts as server_parts
from edgekv.core.memweights import BUFT_AMX as BUFT_AMX
from edgekv.core.memweights import BUFT_REPACK as BUFT_REPACK
from edgekv.core.memweights import T_BF16 as T_BF16
from edgekv.core.memweights import T_F16 as T_F16
from edgekv.core.memweights import T_F32 as T_F32
from edgekv.core.memweights import T_Q4_0 as T_Q4_0
from edgekv.core.memweights import T_Q4_K as T_Q4_K
from edgekv.core.memweights import T_Q8_0 as T_Q8_0
from edgekv.core.memweights import Tensor as Tensor
from edgekv.core.memweights import amx_alloc_bytes as amx_alloc_bytes
from edgekv.core.memweights import amx_supported as amx_supported
from edgekv.core.memweights import device_alloc_bytes as device_alloc_bytes
from edgekv.core.memweights import extra_buffer_bytes as extra_buffer_bytes
from edgekv.core.memweights import extra_buffer_of as extra_buffer_of
from edgekv.core.memweights import extra_buffer_types as extra_buffer_types
from edgekv.core.memweights import is_matrix_weight as is_matrix_weight
from edgekv.core.memweights import layer_of as layer_of
from edgekv.core.memweights import repacked as repacked
from edgekv.core.memweights import row_size as row_size
from edgekv.core.memweights import tensor_on_gpu as tensor_on_gpu
from edgekv.core.memweights import tied_output as tied_output
from edgekv.core.memweights import vec_dot_type as vec_dot_type
from edgekv.core.units import MIB as MIB

WORKLOAD_GENERATE = "generate"
WORKLOAD_PERPLEXITY = "perplexity"
WORKLOAD_BENCH = "bench"
WORKLOADS = (WORKLOAD_GENERATE, WORKLOAD_PERPLEXITY, WORKLOAD_BENCH)
WORKLOAD_HELP = {
    WORKLOAD_GENERATE: "llama-cli / llama-server: prompt in -b/-ub batches, one output per sequence",
    WORKLOAD_PERPLEXITY: "llama-perplexity / edgekv quality: logits for every token of a batch",
    WORKLOAD_BENCH: "edgekv bench / llama-bench: random prompt and single-token decodes, one output per batch",
}

GLIBC_MMAP_THRESHOLD_MAX = 32 * MIB   # glibc malloc: DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; larger blocks are always mapped


# -- workloads ----------------------------------------------------------------------------------------

def workload_outputs(workload: str, n_batch: int, n_ubatch: int, n_seq_max: int = 1) -> tuple[int, int]:
    """(outputs per ubatch the graph computes, output rows the output buffer holds) for a workload."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    n_seq = max(1, n_seq_max)
    if workload == WORKLOAD_PERPLEXITY:
        return n_ubatch, max(n_batch, n_seq)
    return min(n_ubatch, n_seq), n_seq


# -- the model ----------------------------------------------------------------------------------------

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
    compute_graph: tuple[int, int] | None = None   # (tokens, cells) of the graph compute_workload was reserved for
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


class ProcessPrediction(msgspec.Struct, frozen=True):
    """The whole process's predicted peak resident bytes (None: not predicted), bytes per device and the parts
    summed; the record's ``prediction.process`` is built from it (:func:`edgekv.records.blocks.process_block`)."""

    workload: str
    peak_rss_bytes: int | None
    device_bytes: dict[str, int]
    parts: list[ProcessPart]
    notes: list[str] = []

    def host_parts(self) -> list[ProcessPart]:
        return [p for p in self.parts if p.where == HOST]


def _is_host_buffer(name: str) -> bool:
    """ggml buffer types that live in host memory: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host (pinned)."""
    return name.upper().startswith("CPU") or name.endswith("_Host")


EXTRA_NOTES = {
    BUFT_AMX: "{n} tensors packed for the AMX kernels (an anonymous copy; the mapped pages were read while packing)",
    BUFT_REPACK: "{n} tensors re-laid for the CPU GEMM kernels",
}


def _measured_parts(x: ProcessInputs, notes: list[str]) -> list[ProcessPart]:
    """The parts measured rather than derived: the runtime baseline and llama.cpp's host structures."""
    parts: list[ProcessPart] = []
    if x.baseline_bytes is None:
        notes.append("no runtime baseline: " + (x.baseline_note or "calibration failed") +
                     "; peak_rss_bytes is not predicted")
    else:
        parts.append(ProcessPart("runtime baseline", x.baseline_bytes, SRC_CALIBRATION, note=x.baseline_note))
    if x.host_structures_bytes is not None:
        parts.append(ProcessPart("llama.cpp host structures", x.host_structures_bytes, SRC_LLAMA_MEASURED,
                          note=x.host_structures_note or "vocabulary, tensor and graph metadata, code pages "
                                                         "touched while loading"))
    return parts


def _host_weight_parts(x: ProcessInputs, host: list[Tensor]) -> list[ProcessPart]:
    """The weights on the host: the file mapping (or the anonymous CPU buffer) and the extra buffer types' copies."""
    parts: list[ProcessPart] = []
    extra = extra_buffer_types(x.cpu_features, x.use_extra_bufts)
    in_extra = sum(t.n_bytes for t in host if extra_buffer_of(t, extra, x.cpu_features) is not None)
    if x.use_mmap:
        # every tensor's pages are read: the CPU ones by the graph, the repacked and offloaded ones while
        # loading (copied out of the mapping); llama.cpp unmaps only the ranges outside the CPU tensors
        mapped = sum(t.n_bytes for t in host)
        parts.append(ProcessPart("weights (mmap)", mapped, SRC_FORMULA, kind="file",
                          note=f"{len(host)} tensors read through the file mapping"))
    else:
        parts.append(ProcessPart("weights (--no-mmap)", sum(t.n_bytes for t in host) - in_extra, SRC_FORMULA,
                          note="CPU model buffer: tensors read into anonymous memory"))
    tied_host = not (x.gpu_device and tensor_on_gpu("output.weight", x.n_layer, x.n_gpu_layers))
    for buft, (b, n) in extra_buffer_bytes(host, x.cpu_features, x.use_extra_bufts, tied_host).items():
        parts.append(ProcessPart(f"weights ({buft} copy)", b, SRC_FORMULA, note=EXTRA_NOTES[buft].format(n=n)))
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


def _phase_parts(x: ProcessInputs, parts: list[ProcessPart], host: list[Tensor], load_parts: int) -> list[ProcessPart]:
    """The mapping's pages llama.cpp unmaps after loading, as a negative part; and, when the process peaks while
    loading (the whole mapping and the repacked copies resident, the context not yet created), what of them the
    peak still holds."""
    gone, names = unmapped_after_load(x, host)
    if not gone:
        return []
    what = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    out = [ProcessPart("weights (mmap) unmapped after loading", -gone, SRC_FORMULA, kind="file",
                note=f"{what}: read while loading, then unmapped (outside the tensors left in the mapping)")]
    context = sum(p.bytes for p in parts[load_parts:] if p.where == HOST)
    if gone > context:
        out.append(ProcessPart("weights (mmap) until loaded", gone - context, SRC_FORMULA, kind="file",
                        note=f"the process peaks while loading: these pages were still mapped and the context's "
                             f"{context / MIB:.1f} MiB not yet allocated"))
    return out


def _device_weight_parts(x: ProcessInputs, on_gpu: list[Tensor]) -> list[ProcessPart]:
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
    return [ProcessPart("weights", dev_w, SRC_FORMULA, where=x.gpu_device, kind="device", note=note)]


def _kv_parts(x: ProcessInputs) -> list[ProcessPart]:
    """The KV cache on the host and, when some of it is offloaded, on the device."""
    parts = [ProcessPart("KV cache", x.kv_host_bytes, SRC_FORMULA, note="cleared at creation: all resident")]
    if x.kv_device_bytes and x.gpu_device:
        parts.append(ProcessPart("KV cache", x.kv_device_bytes, SRC_FORMULA, where=x.gpu_device, kind="device"))
    return parts


def _compute_parts(x: ProcessInputs, n_out_ubatch: int, notes: list[str]) -> list[ProcessPart]:
    """The compute buffers: on the host the pages the workload's graph touches, pinned and device buffers whole."""
    parts: list[ProcessPart] = []
    if x.compute_workload is None:
        notes.append("compute buffer unknown (" + (x.compute_note or "no dry run") + "); peak_rss_bytes is not predicted")
    tokens, cells = x.compute_graph or (x.n_ubatch, 0)
    over = f" over {cells} cells" if cells else ""
    for buft, b in sorted((x.compute_workload or {}).items()):
        if _is_host_buffer(buft) and not buft.endswith("_Host"):
            parts.append(ProcessPart("compute buffer", b, SRC_LLAMA,
                              note=f"{buft}: graph reserved for {n_out_ubatch} output(s) per ubatch of "
                                   f"{tokens}{over} (the pages a CPU graph touches)"))
    for buft, b in sorted(x.compute_reserved.items()):
        if buft.endswith("_Host"):     # pinned host memory: resident whole
            parts.append(ProcessPart("compute buffer", b, SRC_LLAMA, note=f"{buft}: pinned, allocated whole"))
        elif not _is_host_buffer(buft):
            parts.append(ProcessPart("compute buffer", b, SRC_LLAMA, where=buft, kind="device",
                              note="a device allocates the whole reservation"))
    return parts


def _host_buffer_parts(x: ProcessInputs, host: list[Tensor], n_out_ubatch: int, out_rows: int) -> list[ProcessPart]:
    """The smaller host buffers: the threads' work buffer, the state buffers of a restored depth, the logits and
    llama-server's own allocations."""
    parts: list[ProcessPart] = []
    host_tokens_on_cpu = x.n_gpu_layers < x.n_layer + 1 or not x.gpu_device
    if host_tokens_on_cpu:
        work = work_buffer_bytes(host if x.gpu_device else x.tensors, x.n_ubatch, n_out_ubatch, x.n_threads)
        kq = work_scratch_bytes(x.kq_work_bytes, x.n_threads)
        if kq > work:
            parts.append(ProcessPart("thread work buffer", kq, SRC_FORMULA,
                              note=f"attention scores converted for V without flash attention (the largest ubatch x "
                                   f"cells of the run), {x.n_threads} threads"))
        elif work:
            parts.append(ProcessPart("thread work buffer", work, SRC_FORMULA,
                              note=f"largest activation conversion for {x.n_ubatch} tokens, {x.n_threads} threads"))
    if x.restore_buffer_bytes:
        parts.append(ProcessPart("depth-state read buffer", x.restore_buffer_bytes, SRC_FORMULA,
                          note="edgekv bench restores sliding-window/recurrent caches from a state file: "
                               "llama_state_seq_load_file reads one layer's rows at a time into a buffer "
                               "(src/llama-context.cpp llama_io_read_file::read_to_tensor) that glibc's malloc keeps "
                               "once its mmap threshold has risen to that size (at most 32 MiB)"))
    if x.state_copy_bytes:
        parts.append(ProcessPart("depth state copy", x.state_copy_bytes, SRC_FORMULA,
                          note="llama-bench keeps llama_state_seq_get_data of the filled cache in memory "
                               "(tools/llama-bench/llama-bench.cpp cstate.buf)"))
    parts.append(ProcessPart("output buffer", x.n_vocab * 4 * out_rows, SRC_FORMULA,
                      note=f"logits for {out_rows} row(s) of {x.n_vocab} tokens"))
    if x.server_slots:
        parts += server_parts(x.server_slots, x.n_vocab, len(x.tensors), x.arch, x.n_ubatch)
    return parts


def predict_process(x: ProcessInputs) -> ProcessPrediction:
    """Peak resident memory of the process (and memory per device) for one configuration: one ProcessPart per
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


def gpu_runtime_parts(x: ProcessInputs) -> list[ProcessPart]:
    """The GPU backend's own memory beside llama.cpp's buffers (edgekv.calibration.baseline.device_runtime,
    measured once per environment on the probe model): on the device the CUDA context, cuBLAS's workspace,
    ggml-cuda's pool (ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_pool_vmm: grown in steps, never returned), loaded
    kernels and CUDA graphs; on the host the driver's and the libraries' own memory once they run."""
    name = "CUDA runtime" if (x.gpu_device or "").upper().startswith("CUDA") else "GPU runtime"
    out = []
    if x.gpu_runtime_device_bytes is not None:
        out.append(ProcessPart(name, x.gpu_runtime_device_bytes, SRC_CALIBRATION, where=x.gpu_device or HOST, kind="device",
                        note="context, cuBLAS workspace, memory pool, kernels, graphs: " + x.gpu_runtime_note))
    if x.gpu_runtime_host_bytes is not None:
        out.append(ProcessPart(f"{name} (host side)", max(0, x.gpu_runtime_host_bytes), SRC_CALIBRATION,
                        note="driver and libraries once a batch has run on the device: " + x.gpu_runtime_note))
    if x.gpu_graph_host_bytes_per_node is not None and x.graph_nodes_tg:
        out.append(ProcessPart("CUDA graphs (host side)", int(x.gpu_graph_host_bytes_per_node * x.graph_nodes_tg),
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
