"""The runtime baseline: what a process holds before any model is loaded, measured once per environment.

For edgekv's own measured runs (and any Python program using llama-cpp-python) the baseline is the
interpreter with llama-cpp-python imported and ggml's backends initialised: a fresh child
(``python -m edgekv.child.worker baseline``) does exactly what a bench child does before it loads the model
and reports its resident memory.  For a user's own binary (``--llama-bench``) the baseline is that
binary alone: it is started on a file that is not a model, so it loads its backends and exits, and the
kernel's maximum RSS of that process is the figure.

The result is cached under ``EDGEKV_HOME/calibration/`` keyed by the environment fingerprint (Python,
llama-cpp-python and the size/mtime of its libraries, edgekv, OS, CPU); when the fingerprint changes the
baseline is measured again and the caller is told so.  A failed measurement is reported as such
(``bytes`` None, with the reason), never as zero.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgekv.core.childwire import DeviceRuntimeRequest, to_wire
from edgekv.core.llamalog import is_host_buffer
from edgekv.core.units import mib_to_bytes
from edgekv.machine.environment import cpu_model, nvidia_info, package_version
from edgekv.runtime.process import rss_before_model, run_child, worker_argv
from edgekv.runtime.server import LOCALHOST, free_port
from edgekv.sources.home import edgekv_home
from edgekv.sources.safepath import atomic_write
from edgekv.sources.tinymodel import probe_model_path, speed_model_path
from edgekv.version import __version__

CALIBRATION_VERSION = 2   # 2: a binary's baseline read while it waits to open its model (not ru_maxrss)


@dataclass
class Baseline:
    bytes: int | None
    note: str
    fingerprint_key: str
    cpu_features: list[str]
    remeasured: bool = False        # measured in this call (first time, or the environment changed)


def _lib_stamp(path: str) -> list[Any]:
    try:
        st = os.stat(path)
        return [os.path.basename(path), st.st_size, int(st.st_mtime)]
    except OSError:
        return [os.path.basename(path), None, None]


def fingerprint(runtime: str = "python", binary: str | None = None) -> dict[str, Any]:
    """What the baseline depends on; cheap to compute (no llama.cpp import)."""
    fp: dict[str, Any] = {
        "calibration": CALIBRATION_VERSION, "runtime": runtime, "edgekv": __version__,
        "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(), "cpu": cpu_model(),
    }
    if runtime == "python":
        fp.update({"python": sys.version, "prefix": sys.prefix, "interpreter": os.path.realpath(sys.executable),
                   "llama_cpp_python": package_version("llama-cpp-python")})
        try:
            spec = importlib.util.find_spec("llama_cpp")
            libdir = Path(spec.origin).parent / "lib" if spec and spec.origin else None
            fp["libs"] = sorted(_lib_stamp(str(p)) for p in libdir.iterdir()) if libdir and libdir.is_dir() else None
        except (ImportError, OSError, ValueError):
            fp["libs"] = None
    else:
        fp["binary"] = [os.path.abspath(binary or "")] + _lib_stamp(binary or "")
    return fp


def _key(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _store_path(runtime: str) -> Path:
    return edgekv_home() / "calibration" / f"{runtime}-baseline.json"


def _atomic_write(p: Path, obj: dict[str, Any]) -> None:
    atomic_write(p, json.dumps(obj, indent=1, sort_keys=True))


# the calibration store, for the other per-environment measurements (edgekv.calibration.preflight)
fingerprint_key = _key
store_path = _store_path
write_json = _atomic_write


def cpu_features_from_system_info(system_info: str | None) -> list[str]:
    """CPU features llama.cpp's CPU backend reports (``AVX2 = 1 | ...``), lower-case."""
    out = []
    for part in (system_info or "").split("|"):
        if "=" in part:
            k, v = part.rsplit("=", 1)
            if v.strip() == "1":
                out.append(k.strip().split(":")[-1].strip().lower())
    return sorted(set(out))


def measure_python() -> tuple[int | None, list[str], str]:
    res = run_child(worker_argv("baseline"), {}, timeout=120.0)
    if not res.ok or not (res.result or {}).get("rss"):
        return None, [], f"calibration failed: {res.failure_reason() or 'no reading'}"
    r = res.result
    return int(r["rss"]), cpu_features_from_system_info(r.get("system_info")), "interpreter + llama-cpp-python + ggml backends"


def measure_binary(binary: str) -> tuple[int | None, list[str], str]:
    """The binary's resident memory when it opens its model file, before reading any of it (a FIFO holds it
    there: edgekv.runtime.process.rss_before_model)."""
    if "server" in os.path.basename(binary):      # llama-server: its HTTP listener on 127.0.0.1 is part of it
        port = str(free_port())
        rss, why = rss_before_model(lambda model: [binary, "-m", model, "--host", LOCALHOST, "--port", port])
    else:
        rss, why = rss_before_model(lambda model: [binary, "-m", model, "-p", "1", "-n", "1", "-r", "1"])
    if rss is None:
        return None, [], f"calibration failed: {os.path.basename(binary)} {why}"
    return rss, [], f"{os.path.basename(binary)} with its backends, before reading a model"


def runtime_baseline(runtime: str = "python", binary: str | None = None, remeasure: bool = False) -> Baseline:
    """The cached baseline for this environment, measuring it when absent or stale."""
    fp = fingerprint(runtime, binary)
    key = _key(fp)
    path = _store_path(runtime if runtime == "python" else "binary-" + hashlib.sha256(
        os.path.abspath(binary or "").encode()).hexdigest()[:10])
    stale_note = ""
    if path.exists() and not remeasure:
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
            stale_note = f"calibration file {path} was unreadable; re-measured"
        if cached and cached.get("key") == key and cached.get("bytes"):
            return Baseline(int(cached["bytes"]), cached.get("note", ""), key, list(cached.get("cpu_features") or []))
        if cached and cached.get("key") != key:
            changed = sorted(k for k in set(fp) | set(cached.get("fingerprint") or {})
                             if fp.get(k) != (cached.get("fingerprint") or {}).get(k))
            stale_note = (f"calibration in {path} is from another environment ({', '.join(changed) or 'fingerprint'} "
                          "changed); re-measured")
    if runtime == "python":
        b, feats, note = measure_python()
    else:
        b, feats, note = measure_binary(binary or "")
    if stale_note:
        note = f"{note}; {stale_note}"
    if b is not None:
        try:
            _atomic_write(path, {"key": key, "fingerprint": fp, "bytes": b, "note": note.split("; ")[0],
                                 "cpu_features": feats})
        except OSError as e:
            note += f"; not cached ({e.strerror})"
    return Baseline(b, note, key, feats, remeasured=True)


def model_key(header) -> str:
    """Identity of a model's header for per-model measurements: tensor table, vocabulary size, file size."""
    h = hashlib.sha256()
    h.update(str(getattr(header, "file_size", "")).encode())
    for t in header.tensors:
        h.update(f"{t.name}|{tuple(t.shape)}|{t.ggml_type}|{t.offset}|{t.n_bytes};".encode())
    arch = (header.metadata or {}).get("general.architecture")
    h.update(str(arch).encode())
    return h.hexdigest()[:16]


def host_structures(header, measured: dict[str, int | None], n_gpu_layers: int = -1) -> dict[str, int | None]:
    """llama.cpp's host structures for this model in this environment, measured once (in its dry run) and then
    reused, so that the same model answers the same everywhere (a local file, its header over HTTP)."""
    key = _key(fingerprint("python"))
    # "context_less_output": the context's growth less its own output buffer, so the figure holds for any -np (files
    # from before it held the growth with an output buffer of unknown size: measured again)
    path = edgekv_home() / "calibration" / f"host-{key}-{model_key(header)}-ngl{n_gpu_layers}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("load") is not None and cached.get("context_less_output") is not None:
            return {"load": int(cached["load"]), "context_less_output": int(cached["context_less_output"])}
    except (OSError, ValueError, TypeError):
        pass
    if measured.get("load") is not None and measured.get("context_less_output") is not None:
        try:
            _atomic_write(path, {"load": measured["load"], "context_less_output": measured["context_less_output"]})
        except OSError:
            pass
    return measured


@dataclass
class DeviceRuntime:
    """What a GPU backend's runtime holds beside llama.cpp's buffers once a model has computed a batch and decoded
    tokens (CUDA: the context, cuBLAS's workspace, ggml-cuda's memory pool, loaded kernels), on the device and on the
    host, and what its CUDA graphs of single-token decodes hold on the host per graph node; measured once per
    environment, K/V types and flash-attention setting on the probe models (None: not measured, the reason in
    ``note``)."""

    device_bytes: int | None
    host_bytes: int | None
    note: str
    readings: dict[str, Any]
    graph_host_bytes_per_node: float | None = None


def _mib_sum(d: dict[str, float] | None, device: bool) -> int:
    return mib_to_bytes(sum(v for k, v in (d or {}).items() if is_host_buffer(k) != device))


def graph_growth(res: dict[str, Any]) -> tuple[int, int] | None:
    """(RSS growth over the decodes after the first one, the one-token graph's nodes) of a probe run."""
    rd = res.get("readings") or {}
    a, b = (rd.get("decode1") or {}).get("rss"), (rd.get("decode") or {}).get("rss")
    nodes = (res.get("graph") or {}).get("nodes_tg")
    return (int(b) - int(a), int(nodes)) if a and b and nodes else None


def graph_cost_per_node(small: dict[str, Any], big: dict[str, Any]) -> float | None:
    """Host bytes per graph node that ggml-cuda's CUDA graphs of single-token decodes hold (captured once the graph
    repeats: the growth from the first decode to the last), from two probes of different node counts."""
    a, b = graph_growth(small), graph_growth(big)
    if a is None or b is None or b[1] <= a[1]:
        return None
    return max(0.0, (b[0] - a[0]) / (b[1] - a[1]))


def device_runtime_from_probe(res: dict[str, Any], per_node: float | None = None) -> tuple[int | None, int | None, str]:
    """(device, host, note) from the device_runtime child's readings (edgekv.child.workload.device_runtime): the
    process's GPU memory (NVML) after the decodes less the probe's device buffers, and its RSS growth from the
    backend's initialisation to the last decode less the probe's host buffers and (with ``per_node``) less its own
    CUDA graphs, which are a part of their own."""
    rd = res.get("readings") or {}
    first, last = rd.get("init") or {}, rd.get("decode") or {}
    bufs = [res.get("model_buffers_mib"), res.get("kv_buffers_mib"), res.get("compute_mib")]
    dev_bufs = sum(_mib_sum(b, True) for b in bufs)
    host_bufs = sum(_mib_sum(b, False) for b in bufs)
    dev = last.get("process_nvml")
    device = int(dev) - dev_bufs if dev else None
    host = int(last["rss"]) - int(first["rss"]) - host_bufs if last.get("rss") and first.get("rss") else None
    nodes = (res.get("graph") or {}).get("nodes_tg")
    if host is not None and per_node is not None and nodes:
        host -= int(per_node * int(nodes))
    why = "" if dev else "; the process's GPU memory is unknown without NVML (pip install nvidia-ml-py)"
    return device, host, "the GPU runtime after a first prompt batch and decodes of the probe model" + why


def gpu_identity() -> dict[str, Any]:
    """The GPUs a device calibration depends on: their names and the driver (NVML), so a new card or driver
    re-measures it."""
    nv = nvidia_info() or {}
    return {"gpus": [d.get("name") for d in nv.get("devices") or []], "driver": nv.get("driver")}


def device_runtime(gpu: str, flash_attn: bool = True, type_k: str = "f16", type_v: str = "f16") -> DeviceRuntime:
    """The GPU runtime's own memory for this environment and GPU (``gpu``: its name), cached like the baseline.

    Measured per flash-attention setting and K/V types: without flash attention, ggml-cuda computes attention's
    products with cuBLAS (ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_mul_mat_batched_cublas), whose handle, workspace
    and kernels the probe then loads too (about 100 MiB of device and 110 MiB of host memory on a datacenter GPU,
    docs/hardware.md), and each K/V type loads its own attention kernels.  A second, deeper probe gives the host memory
    of CUDA graphs per graph node."""
    fp = {**fingerprint("python"), "gpu": gpu, **gpu_identity(), "flash_attn": flash_attn, "type_k": type_k,
          "type_v": type_v, "version": 2}
    key = _key(fp)
    path = edgekv_home() / "calibration" / f"device-runtime-{key}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return DeviceRuntime(cached.get("device_bytes"), cached.get("host_bytes"), cached.get("note", ""),
                                 cached.get("readings") or {}, cached.get("graph_host_bytes_per_node"))
    except (OSError, ValueError, AttributeError):
        pass

    def probe(model: Path) -> Any:
        req = DeviceRuntimeRequest(model_path=str(model), n_ubatch=512, n_ctx=1024, type_k=type_k, type_v=type_v,
                                   flash_attn="on" if flash_attn else "off")
        return run_child(worker_argv("device_runtime"), to_wire(req), timeout=120.0)

    res = probe(probe_model_path())
    if not res.ok or not (res.result or {}).get("ok"):
        return DeviceRuntime(None, None, f"GPU runtime not measured: {res.failure_reason() or 'the probe failed'}", {})
    deep = probe(speed_model_path("gpu_graph_probe", n_embd=256, n_ff=512, n_layer=24, n_head=4, n_head_kv=4,
                                  mat_type="Q4_0"))
    per_node = graph_cost_per_node(res.result, deep.result) if deep.ok and (deep.result or {}).get("ok") else None
    dev, host, note = device_runtime_from_probe(res.result, per_node)
    out = DeviceRuntime(dev, host, note, res.result.get("readings") or {}, per_node)
    try:
        _atomic_write(path, {"key": key, "fingerprint": fp, **asdict(out)})
    except OSError as e:
        out.note += f"; not cached ({e.strerror})"
    return out
