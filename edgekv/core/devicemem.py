"""Device memory rules llama.cpp follows on Apple Metal and on CUDA, and what fits a device.

Pure.  Paths are under the llama.cpp tree vendored by llama-cpp-python 0.3.36 (``vendor/llama.cpp/``); the public
logs that show each rule are listed in docs/explain.md and tests/data/logs/README.md.

Metal (ggml/src/ggml-metal/ggml-metal-device.m)
  * The device's memory total is ``recommendedMaxWorkingSetSize`` (1290, printed at 1364 as
    ``recommendedMaxWorkingSetSize = %8.2f MB``, in units of 1e6 bytes), and its free memory is that minus
    ``currentAllocatedSize`` (1501-1506); llama.cpp only warns when an allocation takes it past the limit (2019-2020)
    and macOS then pages the working set, so a Metal load that does not fit is slow rather than refused.
  * With unified memory every buffer is a shared one (``use_shared_buffers = has_unified_memory``, 1269; storage
    mode Shared, 2144-2147; Private only without unified memory or with GGML_METAL_SHARED_BUFFERS_DISABLE, 2150):
    the KV, compute and Metal model buffers are ordinary RAM that also counts against the working set.
  * Memory-mapped weights are not copied: the mapping is wrapped as Metal buffers (``newBufferWithBytesNoCopy``,
    2214, 2241), which the log names ``Metal_Mapped`` / ``MTL0_Mapped``.  They are file-backed pages, but the GPU
    keeps them resident, so they count against the working set like the rest.
  * RAM and device memory are one pool: host buffers (``CPU``, ``CPU_Mapped``) and Metal buffers add up.

CUDA (ggml/src/ggml-cuda/, src/llama-model.cpp, src/llama-context.cpp)
  * At partial offload the CPU layers' weights live in the first GPU's host buffer type, pinned RAM, when they are
    not memory-mapped (``make_cpu_buft_list``, llama-model.cpp:1093-1107): the log's ``CUDA_Host model buffer``.
  * The CPU backend's compute buffer uses that host buffer type too (llama-context.cpp:410-418): ``CUDA_Host
    compute buffer``; so does the output (logits) buffer (llama-context.cpp:2195-2200): ``CUDA_Host output
    buffer``.  All three are host RAM, not VRAM.
  * Device memory the log does not print: the CUDA context (driver and kernels), the cuBLAS handle and workspace
    each stream creates on first use (common.cuh:1531-1534), and the memory pool temporary results come from
    (VMM pool, ggml-cuda.cu:529-677; legacy pool, 423-527).  A log's device total is therefore a lower bound of
    what nvidia-smi shows; edgekv does not put a figure on the difference without measuring it.
"""

from __future__ import annotations

from typing import Any

MIB = 2**20
MB = 10**6

# What a Metal device holds against the working set beyond llama.cpp's own buffers, from llama.cpp's breakdown
# tables at exit (edgekv.core.breakdown; docs/explain.md): 0 MiB unaccounted on every Metal device running one
# context in the corpus, as Metal's free memory is the working set less currentAllocatedSize, which counts this
# process's buffers only.  A second context in the process (a vision projector) adds its own.
METAL_BEYOND_BUFFERS_MIB = 0
METAL_OVERHEAD_NOTE = ("nothing beyond llama.cpp's buffers counts against the working set (its breakdown tables at "
                       "exit show 0 MiB unaccounted on Metal)")

HOST = "host"


def working_set_mib(reported_mb: float) -> float:
    """recommendedMaxWorkingSetSize as llama.cpp prints it (MB of 1e6 bytes), in MiB."""
    return reported_mb * MB / MIB


def device_rows(cfg: Any, buffers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each device's printed total beside the limit the log states (Metal's working set, a device's free memory
    at load), with the rules that apply to it."""
    out = []
    free = {d["name"]: d.get("free_mib") for d in cfg.devices}
    for g in buffers:
        dev = g["device"]
        row: dict[str, Any] = {"device": dev, "printed_mib": g["total_mib"]}
        if dev == HOST:
            row["note"] = "host RAM: CPU, CPU_Mapped, CPU_REPACK and <backend>_Host buffers"
        elif dev.startswith(("Metal", "MTL")):
            if cfg.working_set_mb:
                ws = working_set_mib(cfg.working_set_mb)
                row.update({"limit_mib": round(ws, 2), "limit": "recommendedMaxWorkingSetSize",
                            "fits": g["total_mib"] <= ws})
            row["note"] = ("unified memory: mapped weights, KV and compute buffers all count against the GPU working "
                           "set; past it macOS pages (llama.cpp warns, it does not refuse)")
        else:
            f = free.get(dev)
            if f is not None:
                row.update({"limit_mib": float(f), "limit": "free at load", "fits": g["total_mib"] <= f})
            if dev.startswith(("CUDA", "ROCm")):
                row["note"] = ("printed buffers only: the CUDA context, cuBLAS workspace and memory pool come on top "
                               "(not in the log; llama.cpp's exit tables in the corpus show 1.1 to 3.9 GiB in use beyond "
                               "its buffers on CUDA, other processes included)")
        out.append(row)
    return out


def metal_fit(device_bytes: int, host_bytes: int, ram_bytes: int,
              working_set_bytes: int | None = None) -> dict[str, Any]:
    """Will a load fit a Mac: its Metal buffers within the GPU working set, and everything within RAM.

    ``working_set_bytes`` is the Mac's recommendedMaxWorkingSetSize where known (llama.cpp prints it at load);
    without it the limit is two thirds of RAM, the smallest share the Macs in the corpus report (docs/explain.md),
    so it errs on the safe side."""
    ws = working_set_bytes if working_set_bytes else ram_bytes * 2 // 3
    basis = "recommendedMaxWorkingSetSize" if working_set_bytes else "2/3 of RAM (assumed working set)"
    extra = METAL_BEYOND_BUFFERS_MIB * MIB
    return {"device_bytes": device_bytes, "host_bytes": host_bytes, "working_set_bytes": ws, "basis": basis,
            "overhead_bytes": extra, "overhead": METAL_OVERHEAD_NOTE,
            "fits_working_set": device_bytes + extra <= ws, "fits_ram": device_bytes + host_bytes <= ram_bytes}
