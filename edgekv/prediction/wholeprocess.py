"""Whole-process predictions: gathers the inputs of :mod:`edgekv.core.memmodel` from their edges.

* the runtime baseline from :mod:`edgekv.calibration.baseline` (measured once per environment, cached);
* llama.cpp's dry run (:class:`edgekv.runtime.engine.EngineSession`): the compute buffers reserved for the
  workload's graphs (``n_outputs_max`` = the workload's outputs per ubatch; the largest of the (tokens, cells)
  shapes its ubatches compute, :func:`workload_graphs`) and for the process's own
  default reservation (what a GPU allocates), and the host memory the dry-run process grew by while
  llama.cpp built the model and its first context;
* the formula (:mod:`edgekv.core.predict`) for the caches, the GGUF tensor table for the weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from edgekv.calibration.baseline import device_runtime, host_structures, runtime_baseline
from edgekv.core.cachetypes import cache_type
from edgekv.core.childwire import EngineLoaded
from edgekv.core.memmodel import (
    GLIBC_MMAP_THRESHOLD_MAX,
    WORKLOAD_BENCH,
    MappedFile,
    ProcessInputs,
    ProcessPrediction,
    kq_work_bytes,
    predict_process,
    tensor_on_gpu,
    workload_outputs,
)
from edgekv.core.memscratch import KQ_PAD
from edgekv.core.predict import STATUS_OK, ContextParams, KVPrediction, pad, predict
from edgekv.core.speed import ubatches
from edgekv.core.units import MIB
from edgekv.errors import EngineError
from edgekv.machine.environment import default_threads
from edgekv.records.schema import Process, process_block
from edgekv.runtime.engine import EngineSession


@dataclass
class ProcessSettings:
    workload: str = WORKLOAD_BENCH
    n_threads: int = 0
    use_mmap: bool = True
    n_gpu_layers: int = -1
    use_extra_bufts: bool = True       # --repack: AMX / CPU_REPACK copies of the weights (llama.cpp's default: on)
    # a run of known size (edgekv bench / llama-bench): prompt, generated tokens and cache depth.  The
    # largest graph such a run computes has min(n_ubatch, largest batch) tokens and attends over the cells
    # it reaches (depth + test tokens), so its compute buffer is reserved for exactly that graph.  None:
    # a long session (full ubatches over the whole context).
    n_prompt: int | None = None
    n_gen: int | None = None
    n_depth: int | None = None
    # -npl: sequences decoded at once (llama-batched-bench), each with n_prompt then n_gen tokens from an empty cache:
    # the prompt batch holds all of them, and the cache reaches n_parallel * (n_prompt + n_gen) cells
    n_parallel: int | None = None
    server_slots: int = 0              # llama-server: slots in use at once (its -np); 0: not a server
    keeps_depth_state: bool = False    # llama-bench: the filled cache's state stays in memory
    # edgekv bench on sliding-window/recurrent caches: the repetitions restore the depth from a state file (the
    # fill itself still runs in the measured process, before the snapshot)
    restores_state_file: bool = False


STATE_CELL_META_BYTES = 12   # per saved cell: llama_pos + n_seq_id + one seq_id (src/llama-kv-cache.cpp state_write_meta)


def state_read_buffer_bytes(pred: KVPrediction, n_tokens: int) -> int:
    """The largest single read of llama_state_seq_load_file: one layer's K (or V) rows for the saved cells
    (recurrent: one layer's R or S state).  glibc keeps it after the restore when it is at most its largest
    mmap threshold; larger blocks are unmapped on free."""
    if pred.status != STATUS_OK or n_tokens <= 0:
        return 0
    best = 0
    for lp in pred.layers:
        if lp.r_bytes or lp.s_bytes:
            best = max(best, lp.r_bytes, lp.s_bytes)
            continue
        if not lp.cells:
            continue
        streams = max(1, pred.n_stream)
        cells = min(n_tokens, lp.cells)
        rows = max(lp.k_bytes, lp.v_bytes) // (lp.cells * streams)
        best = max(best, cells * rows)
    return best if best <= GLIBC_MMAP_THRESHOLD_MAX else 0


def state_seq_bytes(pred: KVPrediction, n_tokens: int) -> int:
    """Bytes of llama_state_seq_get_data for one sequence holding ``n_tokens`` cells: the rows of those cells in
    every cache (a sliding-window cache holds at most its own cells) plus each cell's metadata; recurrent
    state whole."""
    if pred.status != STATUS_OK or n_tokens <= 0:
        return 0
    total = 0
    for c in pred.caches:
        if c.kind == "recurrent":
            total += c.bytes // max(1, c.n_stream)
            continue
        cells = min(n_tokens, c.cells)
        per_cell = c.bytes // max(1, c.cells * c.n_stream)
        total += cells * (per_cell + STATE_CELL_META_BYTES)
    return total


def workload_spans(pred: KVPrediction, settings: ProcessSettings) -> list[tuple[int, int]]:
    """(first position, tokens) of the ubatches the workload computes: a run of known size fills its depth, then its
    prompt at that depth, then one token at a time (-npl: the sequences' prompts in one batch, then a token of each);
    a long session, a full ubatch at the end of the context.  The fill is part of the run even where the repetitions
    restore the depth from a state file: edgekv bench fills in the measured process and only then saves the state,
    so a prompt shorter than a ubatch does not bound the graph (Gemma 3 270M at -c 2048 -p 128: the fill's ubatches
    of 512 touch 20.8 MiB of the compute buffer, the prompt's 5.1 MiB)."""
    def pieces(start: int, n: int) -> list[tuple[int, int]]:
        out = []
        for u in ubatches(n, pred.n_batch, pred.n_ubatch):
            out.append((start, u))
            start += u
        return out

    if settings.n_prompt is None or settings.n_depth is None:
        return [(max(0, pred.n_ctx_padded - pred.n_ubatch), pred.n_ubatch)]
    p, n, d = settings.n_prompt, settings.n_gen or 0, settings.n_depth
    if settings.n_parallel:
        k = settings.n_parallel
        return pieces(0, k * p) + ([(k * (p + n - 1), k)] if n else [])
    return pieces(0, d) + pieces(d, p) + ([(d + p + n - 1, 1)] if n else [])


def kq_work(shape, pred: KVPrediction, settings: ProcessSettings, n_layer: int, n_gpu_layers_eff: int) -> int:
    """The CPU work buffer's scores converted for V without flash attention (edgekv.core.memmodel.kq_work_bytes), over
    the layers whose attention runs on the CPU."""
    if pred.status != STATUS_OK or not pred.v_trans:
        return 0
    heads = {lay.index: lay.n_head for lay in shape.layers}
    caches = [(lp.cells, heads.get(lp.index, 0)) for lp in pred.layers
              if lp.cells and lp.v_bytes and not tensor_on_gpu(f"blk.{lp.index}.x", n_layer, n_gpu_layers_eff)]
    return kq_work_bytes(cache_type(pred.params.type_v).ggml_id, caches, workload_spans(pred, settings)) if caches else 0


def workload_graphs(params: ContextParams, settings: ProcessSettings, pred: KVPrediction) -> list[ContextParams]:
    """The context parameters whose dry-run reservations are the largest graphs the workload really runs (the one
    the workload touches most is the one with the largest compute buffer).

    A ubatch of n tokens whose last position is p attends over n_kv = min(cells, max(256, pad(p, 256))) cells
    (src/llama-kv-cache.cpp get_n_kv), and a dry run at n_ctx = n_kv and n_ubatch = n reserves exactly that graph
    (llama_context::sched_reserve reserves n_ubatch tokens over the whole cache, src/llama-context.cpp:629-668).
    A depth that is not a multiple of the ubatch ends its fill with a shorter ubatch: the full ubatches stop short
    of the prompt's cells and the prompt is shorter, so no graph of the run has a full ubatch over every cell the
    run reaches; every (tokens, cells) pair that no other pair covers is a candidate."""
    if settings.n_prompt is None or settings.n_depth is None:
        return [params]
    p, n, d = settings.n_prompt, settings.n_gen or 0, settings.n_depth
    if settings.n_parallel:
        k = settings.n_parallel
        tokens = max(1, min(params.n_ubatch, k * p))
        reach = pad(max(k * (p + n), 1))
        n_ctx = min(params.n_ctx, reach) if params.n_ctx else reach
        return [replace(params, n_ctx=n_ctx, n_ubatch=tokens, n_batch=max(tokens, min(params.n_batch, n_ctx)))]
    cells = pred.n_ctx_padded or pad(max(d + max(p, n), 1))
    pairs = {(u, min(cells, max(KQ_PAD, pad(start + u, KQ_PAD)))) for start, u in workload_spans(pred, settings)}
    top = sorted(pr for pr in pairs if not any(o != pr and o[0] >= pr[0] and o[1] >= pr[1] for o in pairs))
    return [replace(params, n_ctx=kv, n_ubatch=u, n_batch=max(u, min(params.n_batch, kv))) for u, kv in top]


def largest_compute(results: list[Any]) -> Any:
    """Of dry runs of the workload's candidate graphs, the one whose host (CPU) compute buffer is the largest; the
    first failed one when any failed (its error explains the missing figure)."""
    failed = [r for r in results if not r.ok]
    if failed or not results:
        return failed[0] if failed else None
    return max(results, key=lambda r: sum(v for k, v in (r.log.compute_buffers or {}).items()
                                          if k.upper().startswith("CPU")))


def mapped_files(header) -> list[MappedFile]:
    """The layout llama.cpp maps, one entry per file of the model (a split model's shards in order)."""
    return [MappedFile(h.data_offset, {t.name: t.offset for t in h.tensors}) for h in (header.shards or [header])]


def page_size() -> int:
    """This machine's page (0 on Windows, where llama.cpp's unmap_fragment does nothing)."""
    return 0 if os.name == "nt" else os.sysconf("SC_PAGE_SIZE")


def _mib_dict_to_bytes(d: dict[str, float] | None) -> dict[str, int]:
    return {k: int(round(v * MIB)) for k, v in (d or {}).items()}


def gpu_device_of(*bufs: dict[str, Any]) -> str | None:
    """The GPU device llama.cpp put a buffer on (CUDA0, Metal, ...; not CPU or a pinned host buffer), None when none."""
    for d in bufs:
        for name in d or {}:
            if not name.upper().startswith("CPU") and not name.endswith("_Host"):
                return name
    return None


def kv_split(pred: KVPrediction, n_layer: int, n_gpu_layers_eff: int) -> tuple[int, int]:
    """(host, device) bytes of the caches: with offload_kqv each layer's cache follows its layer."""
    if pred.status != STATUS_OK:
        return 0, 0
    if n_gpu_layers_eff <= 0 or not pred.layers:
        return pred.total_bytes, 0
    dev = sum(lp.k_bytes + lp.v_bytes + lp.r_bytes + lp.s_bytes for lp in pred.layers
              if tensor_on_gpu(f"blk.{lp.index}.x", n_layer, n_gpu_layers_eff))
    return pred.total_bytes - dev, dev


def build_inputs(m, params: ContextParams, pred: KVPrediction, settings: ProcessSettings, baseline,
                 eng_workload=None, eng_default=None, load_info: EngineLoaded | None = None) -> ProcessInputs:
    """ProcessInputs for one configuration from what the edges produced (any of them may be missing; ``load_info``:
    the dry-run session's load)."""
    shape = m.shape
    gpu_layers = load_info.gpu_layers if load_info is not None else None
    n_layer = shape.n_layer_all - getattr(shape, "n_layer_nextn", 0) if hasattr(shape, "n_layer_nextn") else shape.n_layer_all
    cw = _mib_dict_to_bytes(eng_workload.log.compute_buffers) if eng_workload is not None and eng_workload.ok else None
    compute_note = "" if cw is not None else (f"llama.cpp's dry run of the workload's graph failed: {eng_workload.error}"
                                              if eng_workload is not None else "no llama.cpp dry run")
    cr = _mib_dict_to_bytes(eng_default.log.compute_buffers) if eng_default is not None and eng_default.ok else {}
    dev = gpu_device_of(cr, cw or {})
    n_gpu_eff = int(gpu_layers[0]) if gpu_layers and dev else 0
    host_kv, dev_kv = kv_split(pred, n_layer, n_gpu_eff)

    host_struct, struct_note = None, ""
    src = eng_workload if eng_workload is not None else eng_default
    # the dry-run session's first context's growth less that context's own output buffer (its rows follow its -np):
    # cached and reused for every configuration of this model, whatever its -np
    measured = {"load": load_info.host_growth_load_bytes if load_info is not None else None,
                "context_less_output": getattr(src, "host_growth_context_less_output_bytes", None) if src else None}
    hs = host_structures(m.header, measured, settings.n_gpu_layers) if measured["load"] is not None else measured
    g_load, g_ctx = hs.get("load"), hs.get("context_less_output")
    if g_load is not None and g_ctx is not None:
        host_struct = max(0, g_load + g_ctx)
        struct_note = (f"dry-run process grew {g_load / MIB:.1f} MiB loading the model and "
                       f"{g_ctx / MIB:.1f} MiB creating a context (less its output buffer)")
    rt = None
    if dev and n_gpu_eff > 0:
        # flash attention as llama.cpp resolved it in the dry run (auto: enabled where the device supports it)
        fa_log = getattr(getattr(eng_default, "log", None), "fa_resolved", None)
        rt = device_runtime(dev, flash_attn=params.flash_attn == "on" or (params.flash_attn == "auto"
                                                                          and fa_log != "disabled"),
                            type_k=params.type_k, type_v=params.type_v)
    state = state_seq_bytes(pred, settings.n_depth or 0) if settings.keeps_depth_state else 0
    restore = state_read_buffer_bytes(pred, settings.n_depth or 0) if settings.restores_state_file else 0
    return ProcessInputs(
        state_copy_bytes=state, restore_buffer_bytes=restore, server_slots=settings.server_slots,
        kq_work_bytes=kq_work(shape, pred, settings, n_layer, n_gpu_eff),
        arch=str(getattr(shape, "arch", "") or ""),
        workload=settings.workload, n_ubatch=pred.n_ubatch, n_batch=pred.n_batch, n_seq_max=params.n_seq_max,
        n_threads=settings.n_threads or default_threads(), tensors=m.header.tensors, n_vocab=shape.n_vocab,
        n_layer=n_layer, cpu_features=baseline.cpu_features if baseline is not None else (),
        use_mmap=settings.use_mmap, use_extra_bufts=settings.use_extra_bufts, n_gpu_layers=n_gpu_eff, gpu_device=dev,
        baseline_bytes=baseline.bytes if baseline is not None else None,
        baseline_note=baseline.note if baseline is not None else "not calibrated",
        kv_host_bytes=host_kv, kv_device_bytes=dev_kv, compute_workload=cw, compute_note=compute_note,
        compute_graph=(eng_workload.params.n_ubatch, eng_workload.params.n_ctx) if cw is not None else None,
        compute_reserved=cr,
        host_structures_bytes=host_struct, host_structures_note=struct_note,
        gpu_runtime_device_bytes=rt.device_bytes if rt else None, gpu_runtime_host_bytes=rt.host_bytes if rt else None,
        gpu_runtime_note=rt.note if rt else "",
        gpu_graph_host_bytes_per_node=rt.graph_host_bytes_per_node if rt else None,
        graph_nodes_tg=((getattr(getattr(eng_default, "log", None), "graph", None) or {}).get("nodes_tg")),
        files=mapped_files(m.header), page_size=page_size())


def predict_processes(m, configs: list[ContextParams], settings: ProcessSettings, baseline=None,
                      session=None) -> list[ProcessPrediction | None]:
    """One ProcessPrediction per configuration (None where the cache itself is invalid/unsupported).

    ``session`` is an open EngineSession (one is opened when None); ``baseline`` a calibrate.Baseline
    (measured or read from the cache when None)."""
    if baseline is None:
        baseline = runtime_baseline()
    preds = [predict(m.shape, c) for c in configs]
    runnable = [(i, c) for i, (c, p) in enumerate(zip(configs, preds)) if p.status == STATUS_OK and not p.aborts]
    own = session is None
    if own:
        session = EngineSession(m.ref.path, n_gpu_layers=settings.n_gpu_layers, header=m.header,
                                use_extra_bufts=settings.use_extra_bufts).__enter__()
    try:
        out: list[ProcessPrediction | None] = [None] * len(configs)
        load_info = getattr(session, "model_info", None)
        for i, c in runnable:
            n_out, _ = workload_outputs(settings.workload, preds[i].n_batch, preds[i].n_ubatch, c.n_seq_max)
            ew = largest_compute(session.run(workload_graphs(c, settings, preds[i]), n_outputs_max=n_out))
            ed = session.run([c])[0]
            x = build_inputs(m, c, preds[i], settings, baseline, ew, ed, load_info)
            out[i] = predict_process(x)
        return out
    finally:
        if own:
            session.__exit__(None, None, None)


def process_blocks(m, configs: list[ContextParams], settings: ProcessSettings,
                   baseline=None, seen: dict[str, Any] | None = None) -> tuple[list[Process | None], list[str]]:
    """``prediction.process`` (the whole-process prediction) of each ``edgekv predict`` configuration, and the
    notes to print.

    A configuration whose cache is invalid/unsupported gets None; when llama.cpp's dry run cannot run, every
    configuration gets None and the reason is a note (never a partial sum).  ``seen`` receives llama.cpp's graph
    size from the same dry run (``seen["graph"]``: the speed model's node count; ``seen["graphs"]``: the default graph's
    per K/V type pair)."""
    notes: list[str] = []
    baseline = baseline if baseline is not None else runtime_baseline()
    if baseline.remeasured and baseline.note:
        notes.append(f"runtime baseline {baseline.bytes / MIB:.1f} MiB measured now ({baseline.note})"
                     if baseline.bytes is not None else baseline.note)
    try:
        with EngineSession(m.ref.path, n_gpu_layers=settings.n_gpu_layers, header=m.header,
                           use_extra_bufts=settings.use_extra_bufts) as eng:
            procs = predict_processes(m, configs, settings, baseline, eng)
            if seen is not None:
                seen["graph"] = eng.graph
                seen["graphs"] = dict(eng.graphs)
    except EngineError as e:
        notes.append(f"whole-process memory not predicted: {e}")
        return [None] * len(configs), notes
    if baseline.bytes is None:
        notes.append(f"peak RSS not predicted: {baseline.note}")
    if not m.header.tensors:
        notes.append("metadata-only header (no tensor table): the weights are unknown and counted as 0 MiB")
    return [process_block(p) if p is not None else None for p in procs], notes
