"""Child side of the small probes (``python -m edgekv.child.worker env|baseline|preflight|device_runtime|
extra_buffers``) and the memory readings they share with the measured run (edgekv.child.bench_child) and the speed
probe (edgekv.child.speedprobe)."""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any

import psutil

from edgekv import heavy
from edgekv.core.benchwire import Checkpoint
from edgekv.core.childwire import (
    EnvInfo,
    GgmlDevice,
    device_runtime_request_from,
    extra_buffers_request_from,
    preflight_request_from,
    to_wire,
)
from edgekv.core.llamalog import parse_memory_log
from edgekv.core.predict import ContextParams
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import LogCapture, context_params, model_params
from edgekv.runtime.sampler import macos_footprint

SEED = 1234     # the random tokens' seed: every measured run and probe feeds the same tokens


def process_memory() -> Checkpoint:
    """This process's resident and anonymous memory now (psutil, /proc/self/smaps_rollup); the accelerators' memory
    is the caller's to read (edgekv.child.bench_child)."""
    rss = psutil.Process().memory_info().rss
    anon = None
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Anonymous:"):
                        anon = int(line.split()[1]) * 1024
        except OSError:
            pass
    return Checkpoint(rss=rss, anon=anon)


def self_memory() -> dict[str, int | None]:
    """This process's resident memory (and macOS phys_footprint) now: one read of /proc/self/statm on Linux."""
    rss = None
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/statm", "rb") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            rss = None
    if rss is None:
        rss = psutil.Process().memory_info().rss
    footprint = None
    if sys.platform == "darwin":
        footprint = macos_footprint(os.getpid())
    return {"rss": rss, "footprint": footprint}


class DeviceMemory:
    """Memory in use on the process's accelerators (every ggml device that is not the CPU), from
    ``ggml_backend_dev_memory`` (CUDA: cudaMemGetInfo): total minus free, summed.  Read synchronously at the
    run's checkpoints, so what llama.cpp allocated between two of them is their difference (a parent sampling
    the child cannot tell which side of a phase change an allocation fell on).  The device-wide figure
    includes other processes' memory: on a shared GPU the differences are what to read."""

    def __init__(self) -> None:
        self.lib, self.devs = None, []
        try:
            llama_cpp = heavy.llama_cpp()

            libdir = os.path.join(os.path.dirname(llama_cpp.__file__ or ""), "lib")
            cands = [p for pat in ("libggml.so", "libggml.dylib", "ggml.dll") for p in glob.glob(os.path.join(libdir, pat))]
            if not cands:
                return
            lib = ctypes.CDLL(cands[0])
            lib.ggml_backend_dev_count.restype = ctypes.c_size_t
            lib.ggml_backend_dev_get.restype = ctypes.c_void_p
            lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
            lib.ggml_backend_dev_type.restype = ctypes.c_int
            lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
            lib.ggml_backend_dev_memory.restype = None
            lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                    ctypes.POINTER(ctypes.c_size_t)]
            devs = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
            self.devs = [d for d in devs if lib.ggml_backend_dev_type(d) in (1, 2)]   # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
            self.lib = lib
        except (OSError, AttributeError, ImportError):
            self.lib, self.devs = None, []

    def used(self) -> int | None:
        if self.lib is None or not self.devs:
            return None
        total_used = 0
        for d in self.devs:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self.lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            total_used += total.value - free.value
        return total_used


# -- ggml device registry (not bound by llama-cpp-python; a few functions through ctypes) ------------

def ggml_devices() -> EnvInfo:
    llama_cpp = heavy.llama_cpp()

    libdir = os.path.join(os.path.dirname(llama_cpp.__file__ or ""), "lib")
    cands = [p for pat in ("libggml.so", "libggml.dylib", "ggml.dll") for p in glob.glob(os.path.join(libdir, pat))]
    if not cands:
        return EnvInfo()
    lib = ctypes.CDLL(cands[0])
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    types = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
    backends = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
                for i in range(lib.ggml_backend_reg_count())]
    devs = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        devs.append(GgmlDevice(name=lib.ggml_backend_dev_name(d).decode(),
                               description=lib.ggml_backend_dev_description(d).decode(),
                               type=types.get(lib.ggml_backend_dev_type(d), "?"), memory_total=total.value,
                               memory_free=free.value))
    return EnvInfo(backends=backends, devices=devs)


def env_info(_payload: dict, ev: EventWriter) -> None:
    llama_cpp = heavy.llama_cpp()

    llama_cpp.llama_backend_init()
    info = ggml_devices()
    info.system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    info.supports_gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
    ev.result(to_wire(info))


def baseline(_payload: dict, ev: EventWriter) -> None:
    """The runtime baseline: exactly what a bench child does before it loads the model, then its RSS."""
    L = heavy.llama_cpp()

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    m = process_memory()
    ev.result({"rss": m.rss, "anon": m.anon,
               "system_info": L.llama_print_system_info().decode("utf-8", "replace").strip()})


def preflight(payload: dict, ev: EventWriter) -> None:
    """The extra-buffer preflight (edgekv.calibration.preflight): load the probe model with the CPU backend's
    extra buffer types on, then decode a batch of 2 and a batch of 32 tokens.  Each step is announced first
    (``phase`` events), so a parent that sees this process die knows which step killed it.  The payload is a
    :class:`~edgekv.core.childwire.PreflightRequest` (msgspec.ValidationError when it is not one)."""
    req = preflight_request_from(payload)
    L = heavy.llama_cpp()

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    system_info = L.llama_print_system_info().decode("utf-8", "replace").strip()
    ev.emit("phase", phase="load")
    model = L.llama_model_load_from_file(req.model_path.encode(), model_params(0, dry=False, use_extra_bufts=True))
    buffers = parse_memory_log([x for _, x in cap.take()]).model_buffers
    ev.emit("buffers", buffers=buffers)     # before any decode: a parent that sees this process die still knows them
    if not model:
        ev.result({"ok": False, "step": "load", "reason": "llama.cpp could not load the probe model",
                   "buffers": buffers, "system_info": system_info})
        return

    ev.emit("phase", phase="context")
    ctx = L.llama_init_from_model(model, context_params(ContextParams(n_ctx=64, n_batch=32, n_ubatch=32),
                                                         n_threads=req.n_threads or None))
    if not ctx:
        ev.result({"ok": False, "step": "context", "reason": "llama.cpp could not create the probe's context",
                   "buffers": buffers, "system_info": system_info})
        return
    mem = L.llama_get_memory(ctx)
    for n in (2, 32):
        ev.emit("phase", phase=f"batch{n}")
        L.llama_memory_clear(mem, True)
        toks = (L.llama_token * n)(*[(7 * i + 1) % 512 for i in range(n)])
        rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, n))
        if rc != 0:
            ev.result({"ok": False, "step": f"batch{n}", "reason": f"llama_decode returned {rc}", "buffers": buffers,
                       "system_info": system_info})
            return
        L.llama_synchronize(ctx)
    ev.result({"ok": True, "buffers": buffers, "system_info": system_info})
    L.llama_free(ctx)
    L.llama_model_free(model)


def _nvml_self() -> int | None:
    """GPU memory this process holds (NVML, every GPU), or None without NVML."""
    from edgekv.machine.environment import nvml_process_probe  # LAZY_ALLOWED: device_runtime's alone

    probe = nvml_process_probe()
    return probe(os.getpid()) if probe else None


def device_runtime(payload: dict, ev: EventWriter) -> None:
    """What a GPU backend's runtime holds on the device beside llama.cpp's buffers: device memory in use (ggml's
    ``ggml_backend_dev_memory``, device-wide) and this process's own (NVML) after the backend is initialised, after
    the model is loaded with every layer offloaded, after the context, after a prompt batch of ``n_ubatch`` tokens,
    after the first single-token decode and after ``n_decode`` of them; with llama.cpp's buffer lines, so that the
    runtime's share is the reading less the buffers.  The payload is a
    :class:`~edgekv.core.childwire.DeviceRuntimeRequest` (msgspec.ValidationError when it is not one)."""
    req = device_runtime_request_from(payload)
    L = heavy.llama_cpp()

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    dm = DeviceMemory()
    readings: dict[str, Any] = {}

    def read(step: str) -> None:
        readings[step] = {"device_used": dm.used(), "process_nvml": _nvml_self(), "rss": process_memory().rss}

    read("init")
    model = L.llama_model_load_from_file(req.model_path.encode(), model_params(-1, dry=False))
    if not model:
        ev.result({"ok": False, "step": "load", "readings": readings})
        return
    read("load")
    n_ub = req.n_ubatch
    cp = ContextParams(n_ctx=req.n_ctx, n_batch=n_ub, n_ubatch=n_ub, type_k=req.type_k, type_v=req.type_v or req.type_k,
                       flash_attn=req.flash_attn)
    ctx = L.llama_init_from_model(model, context_params(cp))
    if not ctx:
        ev.result({"ok": False, "step": "context", "readings": readings})
        return
    read("context")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    toks = (L.llama_token * n_ub)(*[(7 * i + 1) % n_vocab for i in range(n_ub)])
    rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, n_ub))
    L.llama_synchronize(ctx)
    read("prompt")
    # single-token decodes as a generation makes them: ggml-cuda captures the one-token graph as a CUDA graph once
    # it has seen it repeat, which holds memory of its own
    for i in range(req.n_decode):
        one = (L.llama_token * 1)((i * 13 + 1) % n_vocab)
        rc = rc or L.llama_decode(ctx, L.llama_batch_get_one(one, 1))
        L.llama_synchronize(ctx)
        if i == 0:
            read("decode1")
    read("decode")
    log = parse_memory_log([x for _, x in cap.take()])
    ev.result({"ok": rc == 0, "readings": readings, "model_buffers_mib": log.model_buffers,
               "compute_mib": log.compute_buffers, "kv_buffers_mib": log.kv_buffers, "graph": log.graph})
    L.llama_free(ctx)
    L.llama_model_free(model)


def extra_buffers(payload: dict, ev: EventWriter) -> None:
    """llama.cpp's own sizes of the CPU backend's extra buffers (AMX, CPU_REPACK) for a model: a real load (the
    dry run allocates no weights, so its model buffer lines say 0.00), its ``load_tensors: ... model buffer size``
    lines, and nothing else (no context).  The payload is a :class:`~edgekv.core.childwire.ExtraBuffersRequest`
    (msgspec.ValidationError when it is not one)."""
    req = extra_buffers_request_from(payload)
    L = heavy.llama_cpp()

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(req.model_path.encode(),
                                         model_params(0, dry=False, use_extra_bufts=req.repack))
    lines = [x for _, x in cap.take()]
    ev.result({"ok": bool(model), "buffers": parse_memory_log(lines).model_buffers})
    if model:
        L.llama_model_free(model)
