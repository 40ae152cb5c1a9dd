"""The reproducibility fingerprint recorded with every run, collected automatically.

Parent side: machine, CPU, RAM, OS, power, governor, versions, edgekv's code identity (commit, dirty), argv,
time.  The llama.cpp side (backends, devices, system info) comes from :func:`llama_side`, which runs in a child
(``python -m edgekv.child.worker env``) so the parent never imports llama_cpp.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import psutil

from edgekv.core.childwire import EnvInfo, env_info_from, to_wire
from edgekv.machine import memory as machine_memory  # read as machine_memory.available_memory: a test can stand in for it
from edgekv.machine.codeid import code_identity
from edgekv.runtime.process import run_child, worker_argv
from edgekv.version import __version__

# The llama.cpp commit vendored in each llama-cpp-python release edgekv was tested with (from the
# sdist's own git metadata; llama-bench built from that tree reports the same build_commit).
VENDORED_LLAMA_CPP = {"0.3.36": "0c1e570"}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    if sys.platform.startswith("linux"):
        info = _read("/proc/cpuinfo") or ""
        for line in info.splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def last_level_cache_bytes(sysfs: str | os.PathLike = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of the CPU's last-level cache as the OS reports it (Linux: the highest level of cpu0's caches in
    sysfs; macOS: sysctl hw.l3cachesize, else hw.l2cachesize), or None where it does not say."""
    if sys.platform.startswith("linux"):
        best: tuple[int, int] | None = None
        for d in sorted(Path(sysfs).glob("index*")):
            level, size, kind = _read(str(d / "level")), _read(str(d / "size")), _read(str(d / "type"))
            if not level or not level.isdigit() or not size or kind == "Instruction":
                continue
            unit = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1].upper(), 1)
            digits = size[:-1] if unit > 1 else size
            if digits.isdigit() and (best is None or int(level) > best[0]):
                best = (int(level), int(digits) * unit)
        return best[1] if best else None
    if sys.platform == "darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            try:
                v = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                continue
            if v.isdigit() and int(v) > 0:
                return int(v)
    return None


def governor() -> str | None:
    return _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")


def power_source() -> str | None:
    try:
        b = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):
        return None
    if b is None:
        return "ac (no battery)"
    return "ac" if b.power_plugged else f"battery ({b.percent:.0f}%)"


def macos_gpu_limits() -> dict[str, Any]:
    """Apple Silicon: total memory and the GPU wired-memory limit (0 means the OS default)."""
    out: dict[str, Any] = {}
    if sys.platform != "darwin":
        return out
    for key in ("hw.memsize", "iogpu.wired_limit_mb"):
        try:
            v = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
            out[key] = int(v) if v.isdigit() else v or None
        except (OSError, subprocess.SubprocessError):
            out[key] = None
    return out


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def code_fields() -> dict[str, Any]:
    """The code identity a record's environment carries: ``edgekv_commit`` and ``edgekv_dirty``
    (:func:`edgekv.machine.codeid.code_identity`; None where edgekv cannot tell)."""
    ci = code_identity()
    return {"edgekv_commit": ci.commit, "edgekv_dirty": ci.dirty}


def host_side(argv: list[str] | None = None) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    lcp = package_version("llama-cpp-python")
    env = {
        "edgekv": __version__,
        **code_fields(),
        "llama_cpp_python": lcp,
        "llama_cpp_commit": VENDORED_LLAMA_CPP.get(lcp or ""),
        "python": platform.python_version(),
        # EDGEKV_MACHINE_ID names a machine class whose host name changes (CI runners), so its runs pair
        "machine_id": os.environ.get("EDGEKV_MACHINE_ID") or socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "ram_bytes": vm.total,
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "arch": platform.machine(),
        "governor": governor(),
        "power": power_source(),
        "argv": list(sys.argv if argv is None else argv),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    env.update({k.replace(".", "_"): v for k, v in macos_gpu_limits().items()})
    if os.environ.get("CI"):
        env["ci"] = True
    return env


def llama_side(timeout: float = 120.0) -> tuple[EnvInfo, str | None]:
    """Backends, devices and system info of the llama.cpp build in use (in a child process), and why they are
    missing where they are."""
    res = run_child(worker_argv("env"), {}, timeout=timeout)
    if not res.ok:
        return EnvInfo(), res.failure_reason()
    try:
        return env_info_from(res.result or {}), None
    except msgspec.ValidationError as e:
        return EnvInfo(), f"the env child's reply is not one: {e}"


def collect(argv: list[str] | None = None, with_llama: bool = True) -> dict[str, Any]:
    env = host_side(argv)
    if with_llama:
        ls, error = llama_side()
        env["backends"] = ls.backends
        env["devices"] = [d.description or d.name for d in (ls.devices or [])] or None
        env["device_details"] = to_wire(ls.devices)
        env["system_info"] = ls.system_info
        env["gpu_offload"] = ls.supports_gpu_offload
        if error:
            env["llama_error"] = error
    env["nvidia"] = nvidia_info()

    avail = machine_memory.available_memory()           # at the start of the run; bench reads it again before each configuration
    env["memory_available_bytes"] = avail.bytes if avail else None
    env["memory_available_source"] = avail.source if avail else None
    return env


# -- GPU memory probes (parent side, sampled per child pid) ------------------------------------------

def nvidia_info() -> dict[str, Any] | None:
    try:
        import pynvml  # nvidia-ml-py: optional extra `edgekv[cuda]`
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        devs = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devs.append({"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)), "memory_total": int(mem.total)})
        return {"driver": _s(drv), "devices": devs}
    except Exception as e:  # NVML errors are environment facts, not edgekv failures
        return {"error": str(e)}


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def nvml_process_probe():
    """A function pid -> bytes of GPU memory that process holds (all GPUs), or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return None
    if not handles:
        return None

    def probe(pid: int) -> int | None:
        total = 0
        found = False
        for h in handles:
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            for p in procs:
                if p.pid == pid and p.usedGpuMemory is not None:
                    total += int(p.usedGpuMemory)
                    found = True
        return total if found else None

    return probe


def default_threads() -> int:
    """Physical cores, as llama.cpp's cpu_get_num_math() counts them on most machines."""
    try:
        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)
