"""``edgekv explain``: a llama.cpp log's memory, read back, predicted and compared.

Pure: the lines come from :func:`edgekv.core.logconfig.read_bounded`; a model header, when given, from the caller.
The log's configuration (:mod:`edgekv.core.logconfig`) becomes GGUF metadata, :func:`shape_from_metadata` builds
the shape llama.cpp would build, and :func:`edgekv.core.predict.predict` the caches; every cache line llama.cpp
printed is then recomputed from that shape at the cell count the log states, and compared as printed (two
decimals of float32 MiB).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from edgekv.core.arch import shape_from_metadata
from edgekv.core.breakdown import check_table, last_exit_table
from edgekv.core.cachetypes import cache_type
from edgekv.core.devicemem import device_rows
from edgekv.core.explaincheck import (
    FIRST_BUILD,
    build_counter_note,
    cut_status,
    kv_buffer_rows,
    last_load,
    withhold_unfinished_fits,
)
from edgekv.core.llamalog import LlamaMemoryLog, is_host_buffer, parse_memory_log
from edgekv.core.logconfig import LogConfig, parse_config
from edgekv.core.memmodel import device_alloc_bytes, tensor_on_gpu
from edgekv.core.predict import STATUS_OK, CachePrediction, ContextParams, KVPrediction, llama_mib, predict
from edgekv.core.tensortable import rebuild
from edgekv.core.units import MIB
from edgekv.errors import EdgekvError

MARKERS = ("llama_model_loader", "print_info", "llm_load_print_meta", "load_tensors", "llama_context",
           "llama_kv_cache", "llama_init_from_model", "llama_new_context_with_model", "ggml_")


class ExplainError(EdgekvError):
    """The log cannot be explained (not llama.cpp's, truncated, too old): one line says why."""


def check_log(name: str, lines: list[str], cfg: LogConfig, mem: LlamaMemoryLog) -> None:
    if not any(any(m in line for m in MARKERS) for line in lines):
        raise ExplainError(f"{name}: no llama.cpp lines in it (print_info, llama_model_loader, load_tensors, "
                           "llama_context, llama_kv_cache); pass the log llama.cpp printed while loading the model")
    if cfg.build_number is not None and cfg.build_number < FIRST_BUILD and not build_counter_note(lines, cfg):
        raise ExplainError(f"{name}: llama.cpp build {cfg.build} is older than b{FIRST_BUILD}; explain reads the log "
                           f"lines of builds b{FIRST_BUILD} and later: run a newer llama.cpp")
    has_buffers = any((mem.model_buffers, mem.kv_buffers, mem.compute_buffers, mem.caches, mem.kv_self,
                       mem.rs_buffers))
    if not has_buffers:
        if any("llm_load_tensors" in x and "buffer size" in x for x in lines):
            raise ExplainError(f"{name}: its buffer lines are in the spelling of builds before b{FIRST_BUILD} "
                               f"('llm_load_tensors: CPU buffer size'); explain reads builds b{FIRST_BUILD} and later")
        raise ExplainError(f"{name}: no buffer line (load_tensors: ... model buffer size, llama_kv_cache: size = ...): "
                           "the log ends before llama.cpp allocated memory (truncated?); pass the whole log")


def _backend(name: str) -> str:
    for prefix, label in (("CUDA", "CUDA"), ("ROCm", "ROCm"), ("MTL", "Metal"), ("Metal", "Metal"),
                          ("Vulkan", "Vulkan"), ("SYCL", "SYCL"), ("MUSA", "MUSA"), ("CANN", "CANN"),
                          ("OpenCL", "OpenCL"), ("CPU", "CPU")):
        if name.startswith(prefix):
            return label
    return name


def device_of(buffer: str) -> str:
    """The memory a buffer lives in: host RAM for CPU, CPU_Mapped, CPU_REPACK and <backend>_Host buffers, else its
    device (Metal_Mapped and MTL0_Mapped are the mapped file wrapped as a Metal buffer: the GPU's working set)."""
    if is_host_buffer(buffer):
        return "host"
    return re.sub(r"_(Mapped|Private|Shared)$", "", buffer)


def buffer_table(mem: LlamaMemoryLog, overlap: list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The buffers grouped by the memory they live in.  A group's total counts each page once: a host mapped buffer
    whose pages a device's mapped buffer already holds (``overlap``, :func:`mapped_overlap`) is listed, marked, and
    left out of it.  Host memory is split into file-backed pages (``*_Mapped``: the model file, reclaimable) and
    anonymous memory (repacked copies, KV, compute: what RAM must hold)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    kinds = (("model", mem.model_buffers), ("KV", mem.kv_buffers), ("recurrent state", mem.rs_buffers),
             ("compressor state", mem.state_buffers), ("output", mem.output_buffers),
             ("compute", mem.compute_buffers))
    for kind, bufs in kinds:
        for name, mib in bufs.items():
            row = {"buffer": name, "kind": kind, "mib": mib}
            if kind == "model" and name in overlap:
                row["same_pages_as"] = " + ".join(k for k in mem.model_buffers if not is_host_buffer(k))
            groups.setdefault(device_of(name), []).append(row)
    for key, mib in mem.other_buffers.items():
        fn, *what, name = key.split(" ")
        groups.setdefault(device_of(name), []).append({"buffer": name, "kind": " ".join(what) or fn, "mib": mib})
    out = []
    for dev, rows in groups.items():
        counted = [r for r in rows if "same_pages_as" not in r]
        g: dict[str, Any] = {"device": dev, "buffers": rows, "total_mib": round(sum(r["mib"] for r in counted), 2)}
        if dev == "host":
            fb = sum(r["mib"] for r in counted if r["buffer"].endswith("_Mapped"))
            g.update({"file_backed_mib": round(fb, 2), "anonymous_mib": round(g["total_mib"] - fb, 2)})
        out.append(g)
    out.sort(key=lambda g: (g["device"] == "host", -g["total_mib"]))
    return out


def _fa_mode(cfg: LogConfig, mem: LlamaMemoryLog) -> str:
    v = cfg.context.get("flash_attn", "auto").lower()
    return {"1": "on", "enabled": "on", "true": "on", "0": "off", "disabled": "off", "false": "off"}.get(v, "auto")


def _int(d: dict[str, str], key: str, default: int) -> int:
    v = d.get(key, "")
    return int(v) if v.isdigit() else default


def context_params(cfg: LogConfig, mem: LlamaMemoryLog) -> ContextParams:
    """The context llama.cpp created, as the log states it."""
    ctx = cfg.context
    first = next((c for c in mem.caches if c.kind == "kv"), None)
    n_ctx = _int(ctx, "n_ctx", (cfg.kv_init or {}).get("cells") or (first.cells if first else 4096))
    tk = first.type_k if first else (cfg.kv_init or {}).get("type_k", "f16")
    tv = first.type_v if first else (cfg.kv_init or {}).get("type_v", "f16")
    if not first and mem.kv_self:
        tk, tv = mem.kv_self[0]["type_k"], mem.kv_self[0]["type_v"]
    n_seq = _int(ctx, "n_seq_max", 1)
    swa_cells = mem.iswa_cells.get("swa")
    swa_full = mem.swa_full_warned or (swa_cells is not None and swa_cells == mem.iswa_cells.get("full"))
    return ContextParams(n_ctx=n_ctx, type_k=tk, type_v=tv, flash_attn=_fa_mode(cfg, mem), swa_full=swa_full,
                         n_seq_max=n_seq, kv_unified=ctx.get("kv_unified", "false") == "true",
                         n_batch=_int(ctx, "n_batch", 2048), n_ubatch=_int(ctx, "n_ubatch", 512))


def _per_cell(c: CachePrediction) -> tuple[int, int]:
    """K and V bytes of one cell of one stream (llama.cpp's cache is cells x streams rows of fixed width)."""
    rows = c.cells * c.n_stream
    return c.k_bytes // rows, c.v_bytes // rows


def _pair(pred: KVPrediction, mem: LlamaMemoryLog) -> list[tuple[Any, CachePrediction | None]]:
    """Each KV line llama.cpp printed with the predicted cache object it is the size of."""
    caches = [c for c in pred.caches if c.kind not in ("recurrent", "dsv4_state")]
    lines = [c for c in mem.caches if c.kind == "kv"]
    out: list[tuple[Any, CachePrediction | None]] = []
    pool = list(caches)
    for line in lines:
        want = line.role or "full"
        pick = next((c for c in pool if (c.role or "full") == want), None) or (pool[0] if pool else None)
        if pick is not None:
            pool.remove(pick)
        out.append((line, pick))
    return out


def _check_line(line: Any, c: CachePrediction | None) -> dict[str, Any]:
    row: dict[str, Any] = {"role": line.role or "kv", "cells": line.cells, "layers": line.layers,
                           "type_k": line.type_k, "type_v": line.type_v, "printed_mib": line.mib,
                           "printed_k_mib": line.k_mib, "printed_v_mib": line.v_mib, "streams": line.streams}
    if c is None:
        return row
    k1, v1 = _per_cell(c)
    rows = line.cells * (line.streams or c.n_stream)
    kb, vb = k1 * rows, v1 * rows
    row.update({"predicted_mib": llama_mib(kb + vb), "predicted_k_mib": llama_mib(kb), "predicted_v_mib": llama_mib(vb),
                "predicted_cells": c.cells, "predicted_layers": len(c.layers), "bytes": kb + vb})
    _judge(row, more=["layers"] if len(c.layers) != line.layers else [])
    if c.cells != line.cells:
        row["cells_note"] = (f"edgekv's rule gives {c.cells} cells at this context; the log has {line.cells} "
                             "(bytes compared at the log's cell count)")
    return row


def _judge(row: dict[str, object], note: str = "", more: list[str] | None = None) -> dict[str, object]:
    """``row`` with ``match`` and, where the printed MiB (all, K, V) differ from the predicted or ``more`` names
    something else that differs, ``why``: the fields that differ, then ``note`` in parentheses."""
    diffs = [k for k in ("mib", "k_mib", "v_mib") if row[f"printed_{k}"] != row[f"predicted_{k}"]] + (more or [])
    row["match"] = not diffs
    if diffs:
        row["why"] = "differs in " + ", ".join(diffs) + (f" ({note})" if note else "")
    return row


def _uniform(cfg: LogConfig, row: dict[str, Any]) -> dict[str, Any]:
    """A line edgekv's shape gives no cache for (a build whose rules differ from the ones edgekv models, e.g. a
    non-causal model that still got a KV cache): recompute it from print_info's n_embd_k_gqa / n_embd_v_gqa, the
    widths every layer has when they are one number."""
    kg, vg = cfg.print_info.get("n_embd_k_gqa", ""), cfg.print_info.get("n_embd_v_gqa", "")
    if not (kg.isdigit() and vg.isdigit() and row.get("cells") and row.get("layers")):
        return {**row, "match": False, "why": "edgekv predicts no cache object for this line"}
    n = row["cells"] * row["layers"] * (row.get("streams") or 1)
    try:
        kb, vb = n * cache_type(row["type_k"]).row_bytes(int(kg)), n * cache_type(row["type_v"]).row_bytes(int(vg))
    except (EdgekvError, ValueError):
        return {**row, "match": False, "why": "cache type or width not known"}
    row.update({"predicted_mib": llama_mib(kb + vb), "predicted_k_mib": llama_mib(kb), "predicted_v_mib": llama_mib(vb),
                "bytes": kb + vb, "method": "print_info widths (this build's cache rules differ from edgekv's)"})
    return _judge(row, "recomputed from print_info's widths")


def _check_recurrent(pred: KVPrediction, mem: LlamaMemoryLog) -> list[dict[str, Any]]:
    """The recurrent-state lines (hybrid and recurrent models), R and S as printed."""
    rec = [c for c in pred.caches if c.kind == "recurrent"]
    out = []
    for line, c in zip([c for c in mem.caches if c.kind == "recurrent"], rec):
        row = {"role": "recurrent", "cells": line.cells, "layers": line.layers, "type_k": "f32", "type_v": "f32",
               "printed_mib": line.mib, "printed_k_mib": line.r_mib, "printed_v_mib": line.s_mib,
               "predicted_mib": llama_mib(c.bytes), "predicted_k_mib": llama_mib(c.r_bytes),
               "predicted_v_mib": llama_mib(c.s_bytes), "bytes": c.bytes}
        out.append(_judge(row, "R and S"))
    return out


def _check_kv_self(cfg: LogConfig, mem: LlamaMemoryLog, pred: KVPrediction) -> list[dict[str, Any]]:
    """The oldest builds read print one "KV self size" line: one cache over every layer, no SWA split."""
    out = []
    init = cfg.kv_init or {}
    for s in mem.kv_self:
        cells = init.get("cells")
        if not cells:
            out.append({"role": "kv", "printed_mib": s["mib"], "match": False,
                        "why": "the log lacks the 'kv_size = N' line that gives the cell count"})
            continue
        if not any(c.kind in ("full", "swa") for c in pred.caches):
            out.append(_uniform(cfg, {"role": "kv", "cells": cells, "layers": init.get("layers"), "type_k": s["type_k"],
                                      "type_v": s["type_v"], "printed_mib": s["mib"], "printed_k_mib": s["k_mib"],
                                      "printed_v_mib": s["v_mib"]}))
            continue
        k1 = sum(_per_cell(c)[0] for c in pred.caches if c.kind in ("full", "swa"))
        v1 = sum(_per_cell(c)[1] for c in pred.caches if c.kind in ("full", "swa"))
        kb, vb = k1 * cells, v1 * cells
        row = {"role": "kv", "cells": cells, "layers": init.get("layers"), "type_k": s["type_k"], "type_v": s["type_v"],
               "printed_mib": s["mib"], "printed_k_mib": s["k_mib"], "printed_v_mib": s["v_mib"],
               "predicted_mib": llama_mib(kb + vb), "predicted_k_mib": llama_mib(kb), "predicted_v_mib": llama_mib(vb),
               "bytes": kb + vb}
        out.append(_judge(row, "one cache over every layer, as these builds allocate"))
    return out


def kv_check(cfg: LogConfig, mem: LlamaMemoryLog, meta: dict[str, Any]) -> dict[str, Any]:
    """Every KV size line of the log against edgekv's formula on the recovered configuration."""
    if not mem.caches and not mem.kv_self and not mem.kv_buffers:
        return {"status": "no KV size line in the log", "lines": []}
    try:
        shape = shape_from_metadata(meta, "<log>")
        params = context_params(cfg, mem)
        if mem.kv_self:          # the oldest builds read: no SWA cache of its own yet, every layer full size
            params = replace(params, swa_full=True)
        pred = predict(shape, params)
    except (EdgekvError, ValueError, KeyError, TypeError) as e:
        return {"status": f"not predicted: the configuration lines do not give {_missing(meta, e)}", "lines": []}
    if pred.status != STATUS_OK:
        return {"status": f"not predicted: {pred.reason}", "lines": []}
    if not mem.caches and not mem.kv_self:        # KV buffer lines only: checked per device (explaincheck)
        return {"status": "no KV size line in the log", "params": params.__dict__, "lines": [], "prediction": pred,
                "shape": shape}
    if mem.caches:
        rows = [_check_line(line, c) for line, c in _pair(pred, mem)]
        rows = [r if "predicted_mib" in r else _uniform(cfg, r) for r in rows]
        rows += _check_recurrent(pred, mem)
    else:
        rows = _check_kv_self(cfg, mem, pred)
    return {"status": "predicted", "params": params.__dict__, "lines": rows, "prediction": pred, "shape": shape}


def _missing(meta: dict[str, Any], e: Exception) -> str:
    arch = meta.get("general.architecture")
    if not arch:
        return "the architecture (print_info: arch, or the loader's general.architecture)"
    return f"enough of {arch}'s hyperparameters ({e})"


def _tensor_mib(cfg: LogConfig) -> tuple[float, float] | None:
    """print_info's "file size": the sum of the tensors' bytes (llama-model-loader.cpp:592, 1806-1809), not the file's,
    with its rounding (two decimals of MiB or GiB) as the second figure."""
    m = re.match(r"([\d.]+) (MiB|GiB)", cfg.print_info.get("file size", ""))
    if not m:
        return None
    scale = 1024 if m[2] == "GiB" else 1
    return float(m[1]) * scale, 0.005 * scale


def _partial(out: dict[str, Any], dev: dict[str, float], cfg: LogConfig, tensors: list[Any] | None,
             n_layer: int | None) -> dict[str, Any]:
    """A partial offload on one device: the layers at and above n_layer + 1 - ngl go to the device, with the output
    layer counted as layer n_layer (memmodel.tensor_on_gpu), each tensor padded as that device's buffer pads it."""
    if tensors is None or n_layer is None or cfg.offloaded is None or len(dev) != 1:
        out["status"] = "partial offload: the split between devices is per tensor, which needs the header (--model)"
        return out
    (name, printed), = dev.items()
    ngl = cfg.offloaded[0]
    on = [t for t in tensors if tensor_on_gpu(t.name, n_layer, ngl)]
    tied = not any(t.name == "output.weight" for t in tensors) and n_layer + 1 - ngl <= n_layer
    pred = sum(device_alloc_bytes(t, name) for t in on)
    if tied:
        pred += sum(device_alloc_bytes(t, name) for t in tensors if t.name == "token_embd.weight")
    pred_mib = pred / MIB
    out.update({"compared": f"{name} model buffer (partial offload, {ngl} layers)", "compared_mib": printed,
                "predicted_mib": round(pred_mib, 2), "source": "the GGUF header's tensor table",
                "residual_pct": round(100 * (printed - pred_mib) / pred_mib, 3) if pred_mib else None,
                "status": "predicted"})
    return out


def _reference(cfg: LogConfig, weights_bytes: int | None, table: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tensors' bytes to compare with, less the tensors llama.cpp ignores (:func:`_less_unused`)."""
    ref = _reference_all(cfg, weights_bytes, table)
    rebuilt = ref is not None and ref["source"].startswith("the ") and "rebuilt" in ref["source"]
    return _less_unused(cfg, ref) if ref is not None and cfg.unused_tensors and not rebuilt else ref


def _less_unused(cfg: LogConfig, ref: dict[str, Any]) -> dict[str, Any] | None:
    """The file's tensors less those llama.cpp loads no buffer for ("model has unused tensor ... -- ignoring": a
    NextN/MTP layer without speculative decoding).  print_info's file size and the header count them; the model
    buffers do not.  None when the log does not print their sizes."""
    sizes = list(cfg.unused_tensors.values())
    if any(b is None for b in sizes):
        return None
    unused = sum(b for b in sizes if b is not None) / MIB
    return {**ref, "predicted_mib": ref["predicted_mib"] - unused, "unused_mib": round(unused, 2),
            "source": f"{ref['source']}, less the {len(sizes)} unused tensors llama.cpp ignores ({unused:.2f} MiB)"}


def _reference_all(cfg: LogConfig, weights_bytes: int | None, table: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tensors' bytes to compare with: the header's table, else the family table rebuilt from the log (exact
    when every matrix has one type), else print_info's rounded sum."""
    if weights_bytes is not None:
        return {"predicted_mib": weights_bytes / MIB, "source": "the GGUF header's tensor table"}
    if table and table.get("status") == "rebuilt":
        return {"predicted_mib": table["bytes"] / MIB,
                "source": f"the {table['family']} tensor table rebuilt from the log's hyperparameters and type counts"}
    t = _tensor_mib(cfg)
    if t is None:
        return None
    return {"predicted_mib": t[0], "rounding_mib": t[1], "source": "print_info's file size (the tensors' bytes)"}


def mapped_overlap(cfg: LogConfig, mem: LlamaMemoryLog) -> list[str]:
    """The host mapped buffers whose pages a device's mapped buffer already holds.  With mmap, a backend that can
    wrap host memory (Metal: ``buffer_from_host_ptr``) gets the file mapping itself, from the first to the last byte
    of the tensors assigned to it (src/llama-model.cpp:1854-1868, ``get_mapping_range`` in llama-model-loader.cpp:
    1449-1464; ggml-metal-device.m:2214, 2241 ``newBufferWithBytesNoCopy``: no copy).  When that span is the whole
    file (token_embd lies between device tensors, or a tied output layer points at it), the ``CPU_Mapped``
    token_embd buffer beside it is the same pages: [] otherwise (the spans are disjoint and add up)."""
    dev = {k: v for k, v in mem.model_buffers.items() if not is_host_buffer(k)}
    host = [k for k in mem.model_buffers if is_host_buffer(k) and k.endswith("_Mapped")]
    t = _tensor_mib(cfg)
    if not (dev and host and t) or not all(k.endswith("_Mapped") for k in dev):
        return []
    file_mib, rounding = t
    spans_file = sum(dev.values()) >= file_mib * 0.995 - rounding
    return host if spans_file and sum(dev.values()) + sum(mem.model_buffers[k] for k in host) > file_mib + rounding \
        else []


# the backends whose weight placement edgekv models: at full offload every tensor but token_embd on the device
PLACED_LIKE_CUDA = {"CUDA", "ROCm", "MUSA", "Metal", "Vulkan"}


def _unknown_backend(out: dict[str, Any], mem: LlamaMemoryLog, ref: dict[str, Any] | None,
                     unknown: list[str]) -> dict[str, Any]:
    """Every layer offloaded to a backend edgekv does not model (CANN, SYCL, OpenCL, RPC, ...), yet most weights in
    host buffers: no -ot is claimed.  Such a backend keeps the tensors it lacks kernels or a buffer type for on the
    host; every tensor is then in exactly one buffer, so the plain sum is compared when it is the tensors' bytes."""
    total = sum(mem.model_buffers.values())
    names = ", ".join(unknown)
    if ref is not None:
        slack = max(0.005 * ref["predicted_mib"], ref.get("rounding_mib", 0.0))
        if abs(total - ref["predicted_mib"]) <= slack:
            out.update({"compared": f"device + host model buffers ({names} keeps part of the offloaded weights in "
                                    "host buffers; each tensor is in one buffer)", "compared_mib": round(total, 2),
                        "predicted_mib": round(ref["predicted_mib"], 2), "status": "predicted",
                        "residual_pct": round(100 * (total - ref["predicted_mib"]) / ref["predicted_mib"], 3),
                        **{k: v for k, v in ref.items() if k != "predicted_mib"}})
            return out
    out["status"] = (f"every layer offloaded to {names}, yet most weights in host buffers: {names} keeps weights it "
                     f"has no kernels or buffer type for on the host, and the buffers' sum ({total:.2f} MiB) is not the "
                     "tensors' bytes (a host mapping spans the file between its first and last tensor): unknown "
                     "placement, which needs the header (--model) to compare")
    return out


def _full_offload(mem: LlamaMemoryLog, dev: dict[str, float], ref: dict[str, Any] | None,
                  table: dict[str, Any] | None) -> tuple[float, str]:
    """The input layer (token_embd) stays in host memory (llama-model.cpp dev_input is the CPU): the device holds every
    other tensor, plus a copy of token_embd when the output layer is tied to it.  The family table says which; without
    it the layout nearer the tensors' bytes is taken."""
    device = sum(dev.values())
    host = sum(v for k, v in mem.model_buffers.items() if is_host_buffer(k))
    tied = table.get("tied_output") if table else None
    if tied is None and ref is not None:
        tied = abs(device - ref["predicted_mib"]) <= abs(device + host - ref["predicted_mib"])
    if tied:
        return device, "device model buffers (full offload, output tied: the device holds a copy of token_embd)"
    return device + host, "device + host model buffers (full offload; token_embd on the host)"


def model_check(cfg: LogConfig, mem: LlamaMemoryLog, weights_bytes: int | None, tensors: list[Any] | None = None,
                n_layer: int | None = None) -> dict[str, Any]:
    """The model buffers against the tensors' bytes (:func:`_reference`), in the buffers that hold every tensor once:
    at full offload the device (:func:`_full_offload`), on the CPU the mapping.  A partial offload or tensor
    overrides split tensor by tensor, which needs each tensor's size: the header."""
    out: dict[str, Any] = {"printed_mib": round(sum(mem.model_buffers.values()), 2)}
    table = rebuild(cfg.metadata, cfg.print_info, cfg.type_counts) if weights_bytes is None else None
    if table:
        out["tensor_table"] = table
    if not mem.model_buffers:
        out["status"] = "no model buffer line in the log"
        return out
    dev = {k: v for k, v in mem.model_buffers.items() if not is_host_buffer(k)}
    full = cfg.offloaded is not None and cfg.offloaded[0] == cfg.offloaded[1]
    ref = _reference(cfg, weights_bytes, table)
    if dev and full and sum(v for k, v in mem.model_buffers.items() if is_host_buffer(k)) > sum(dev.values()):
        unknown = sorted({_backend(k) for k in dev} - PLACED_LIKE_CUDA)
        if not unknown:
            out["status"] = ("every layer offloaded, yet most weights in host buffers: tensor overrides (-ot, "
                             "--cpu-moe) place tensor by tensor, which needs the header (--model)")
            return out
        return _unknown_backend(out, mem, ref, unknown)
    if dev and full and mapped_overlap(cfg, mem):
        compared = sum(dev.values())
        which = (f"{' + '.join(dev)} (the file mapping wrapped as a device buffer: its span covers token_embd's pages, "
                 f"so {' + '.join(mapped_overlap(cfg, mem))} is the same mapped pages, counted once)")
    elif dev and full:
        compared, which = _full_offload(mem, dev, ref, table)
    elif not dev:
        mapped = {k: v for k, v in mem.model_buffers.items() if k.endswith("_Mapped")}
        if mapped and len(mapped) < len(mem.model_buffers):
            # a mapped CPU buffer spans the file from the first to the last tensor left in the mapping (llama-model.cpp,
            # buffer from the mapped pointer): beside repacked copies, that span depends on which tensors were
            # repacked and where they lie in the file
            out["status"] = ("repacked weights beside a mapped buffer: the mapping spans the file between the first "
                             "and last tensor not repacked, which needs the header (--model)")
            return out
        compared, which = sum((mapped or mem.model_buffers).values()), "host model buffers"
    else:
        return _partial(out, dev, cfg, tensors, n_layer)
    out.update({"compared": which, "compared_mib": round(compared, 2)})
    if ref is None:
        out["status"] = ("the log ignores unused tensors without printing their sizes; comparing needs the header "
                         "(--model)" if cfg.unused_tensors else
                         "needs the header (--model): the log gives tensor type counts, not each tensor's type and shape")
        return out
    pred = ref["predicted_mib"]
    out.update({k: v for k, v in ref.items() if k != "predicted_mib"})
    out.update({"predicted_mib": round(pred, 2), "status": "predicted",
                "residual_pct": round(100 * (compared - pred) / pred, 3) if pred else None})
    return out


def _alt_kv(shape: Any, params: ContextParams, **change: Any) -> int | None:
    try:
        p = predict(shape, replace(params, **change))
    except (EdgekvError, ValueError):
        return None
    return p.total_bytes if p.status == STATUS_OK else None


def _where(group: dict[str, Any]) -> str:
    """A buffer group's memory in words; host memory says how much of it is the mapped file (file-backed pages the
    kernel can drop and reread) and how much anonymous memory (repacked copies, KV, compute: what RAM must hold)."""
    if group["device"] != "host":
        return group["device"]
    fb = group.get("file_backed_mib") or 0.0
    if not fb:
        return "host memory"
    return f"host memory ({_gib(fb)} file-backed: the mapped model file; {_gib(group['anonymous_mib'])} anonymous)"


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _kv_why(dev: dict[str, Any], top: dict[str, Any], kv: dict[str, Any]) -> str:
    """The KV cache is the largest part: its size, and what other cache types or half the context would make it."""
    pred, shape, p = kv["prediction"], kv["shape"], ContextParams(**kv["params"])
    total = pred.total_bytes / MIB
    where = _where(dev)
    types = p.type_k if p.type_k == p.type_v else f"{p.type_k}/{p.type_v}"
    text = f"KV {types} at {p.n_ctx} is {_gib(top['mib'])} of the {_gib(dev['total_mib'])} on {where}"
    if abs(total - top["mib"]) > 0.5:
        holders = list(kv.get("kv_devices") or [])
        text += (f" ({_gib(total)} over {', '.join(holders)})" if len(holders) > 1 else
                 f" ({_gib(total)} in all its caches)")
    alts = []
    for t in ("q8_0", "q4_0"):
        if t not in (p.type_k, p.type_v):
            b = _alt_kv(shape, p, type_k=t, type_v=t, flash_attn="on")
            if b:
                alts.append(f"{t} would be {_gib(b / MIB)}")
    b = _alt_kv(shape, p, n_ctx=max(256, p.n_ctx // 2))
    if b:
        alts.append(f"-c {p.n_ctx // 2} would be {_gib(b / MIB)}")
    if p.type_k != "f16" or p.type_v != "f16":
        b = _alt_kv(shape, p, type_k="f16", type_v="f16")
        if b:
            alts.append(f"f16 would be {_gib(b / MIB)}")
    return text + ("; " + ", ".join(alts) if alts else "")


def why(buffers: list[dict[str, Any]], kv: dict[str, Any], cfg: LogConfig) -> str | None:
    """One sentence: the largest part of the fullest memory, and what another setting would give."""
    if not buffers:
        return None
    dev = buffers[0]
    top = max(dev["buffers"], key=lambda r: r["mib"])
    where = _where(dev)
    head = f"the {top['kind']} buffer {top['buffer']} is {_gib(top['mib'])} of the {_gib(dev['total_mib'])} on {where}"
    if top["kind"] == "KV" and kv.get("prediction") is not None:
        return _kv_why(dev, top, kv)
    if top["kind"] == "model" and cfg.offloaded and dev["device"] != "host":
        n, total = cfg.offloaded
        per = top["mib"] / max(1, n)
        return f"{head}: about {_gib(per)} a layer, so each layer fewer in -ngl ({n}/{total} now) frees that much here"
    if top["kind"] == "compute":
        return f"{head}: the compute buffer grows with -ub (n_ubatch) and the context; lower -ub to shrink it"
    return head


def explain_lines(name: str, lines: list[str], header_meta: dict[str, Any] | None = None,
                  weights_bytes: int | None = None, tensors: list[Any] | None = None) -> dict[str, Any]:
    """The whole explanation of one log, as a dict (``edgekv explain --json`` prints it)."""
    lines, loads = last_load(lines)
    mem = parse_memory_log(lines)
    cfg = parse_config(lines)
    check_log(name, lines, cfg, mem)
    meta = header_meta if header_meta is not None else cfg.metadata
    buffers = buffer_table(mem, mapped_overlap(cfg, mem))
    kv = kv_check(cfg, mem, meta)
    kv["kv_devices"] = [d for d in mem.kv_buffers]
    out = {"source": name, "build": cfg.build, "llama_cpp_python": cfg.python_version,
           "config": config_summary(cfg, mem, kv), "buffers": buffers,
           "kv": {"status": kv["status"], "lines": kv["lines"], "params": kv.get("params")},
           "model": model_check(cfg, mem, weights_bytes, tensors,
                                kv["shape"].n_layer if kv.get("shape") is not None else None),
           "compute": compute_rows(mem),
           "devices": device_rows(cfg, buffers),
           "why": why(buffers, kv, cfg)}
    out["kv_buffers"] = kv_buffer_rows(cfg, mem, kv)
    cut = cut_status(lines, mem)
    if cut:
        out["cut"] = cut
    withhold_unfinished_fits(out["devices"], cut)
    notes = [n for n in [build_counter_note(lines, cfg)] if n]
    if loads > 1:
        notes.append(f"the process loaded this model {loads} times (ollama reads the vocabulary first): explained "
                     "is the last load")
    table = last_exit_table(lines)                      # llama.cpp's own breakdown at exit (edgekv.core.breakdown)
    if table:
        out["breakdown"] = check_table(table, buffers)
    if cfg.truncated_arrays:
        notes.append(f"the loader cut these arrays short, print_info filled them: {', '.join(cfg.truncated_arrays[:8])}")
    if notes:
        out["notes"] = notes
    return out


def add_engine_compute(result: dict[str, Any], engine_compute: dict[str, float]) -> None:
    """Put llama.cpp's own dry run (the installed build, CPU backend) beside the compute buffers the log printed."""
    for row in result["compute"]:
        pred = engine_compute.get(row["buffer"])
        if pred is not None:
            row["predicted_mib"] = pred
            row["source"] = "llama.cpp dry run (edgekv predict --engine)"
            row["residual_pct"] = round(100 * (row["printed_mib"] - pred) / pred, 3) if pred else None


def compute_rows(mem: LlamaMemoryLog) -> list[dict[str, Any]]:
    """llama.cpp's compute buffers.  edgekv has no closed form for them: it takes them from llama.cpp's own dry run
    (``edgekv predict --engine``), which needs the model file and runs the CPU backend only."""
    return [{"buffer": k, "backend": _backend(k), "printed_mib": v, "predicted_mib": None}
            for k, v in mem.compute_buffers.items()]


def config_summary(cfg: LogConfig, mem: LlamaMemoryLog, kv: dict[str, Any]) -> dict[str, Any]:
    pi, shape = cfg.print_info, kv.get("shape")
    params = kv.get("params") or {}
    bufs = set(mem.model_buffers) | set(mem.kv_buffers) | set(mem.compute_buffers)
    backends = sorted({_backend(b.split("_")[0]) for b in bufs})
    out: dict[str, Any] = {
        "arch": cfg.arch, "name": cfg.metadata.get("general.name"),
        "layers": pi.get("n_layer"), "heads": pi.get("n_head"), "kv_heads": pi.get("n_head_kv"),
        "head_dim_k": pi.get("n_embd_head_k"), "head_dim_v": pi.get("n_embd_head_v"),
        "sliding_window": pi.get("n_swa"), "file_type": pi.get("file type"), "file_size": pi.get("file size"),
        "weight_types": cfg.type_counts, "n_ctx": cfg.context.get("n_ctx"), "n_batch": cfg.context.get("n_batch"),
        "n_ubatch": cfg.context.get("n_ubatch"), "n_seq_max": cfg.context.get("n_seq_max"),
        "flash_attn": cfg.context.get("flash_attn"), "flash_attn_resolved": mem.fa_resolved,
        "type_k": params.get("type_k"), "type_v": params.get("type_v"),
        "offloaded": f"{cfg.offloaded[0]}/{cfg.offloaded[1]}" if cfg.offloaded else None,
        "devices": cfg.devices, "backends": backends, "mmap": cfg.mmap}
    if shape is not None and out["layers"] is None:
        out["layers"] = shape.n_layer_all
    return {k: v for k, v in out.items() if v not in (None, {}, [])}
