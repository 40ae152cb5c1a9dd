"""Memory sampling of a process: a thread that reads its resident memory every few milliseconds (and, where the
parent gives a probe, its GPU memory), the anonymous/file-backed split of its peak (Linux ``smaps_rollup``), its
macOS ``phys_footprint``, and the kernel's OOM-kill counter.  Starts nothing: :mod:`edgekv.runtime.process` samples
its children with it and :mod:`edgekv.runtime.server` the user's llama-server.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time
from collections.abc import Callable

import psutil

SAMPLE_INTERVAL_S = 0.005
SPLIT_INTERVAL_S = 0.05
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def oom_kill_count(proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The kernel's OOM kills so far, as it counts them: ``oom_kill`` in /proc/vmstat (the machine) plus the
    same counter in this process's cgroup v2 ``memory.events`` (a container's limit); None where neither exists."""
    total, seen = 0, False
    try:
        with open(os.path.join(proc_root, "vmstat"), "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    total, seen = total + int(line.split()[1]), True
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(os.path.join(proc_root, "self", "cgroup"), "rb") as f:
            rel = next((x.split(b":", 2)[2].strip().decode() for x in f if x.startswith(b"0::")), None)
        if rel is not None:
            with open(os.path.join(cgroup_root, rel.lstrip("/"), "memory.events"), "rb") as f:
                for line in f:
                    if line.startswith(b"oom_kill "):
                        total, seen = total + int(line.split()[1]), True
    except (OSError, ValueError, IndexError):
        pass
    return total if seen else None


def _smaps_rollup(pid: int) -> tuple[int, int] | None:
    """(anonymous, file-backed) resident bytes from /proc/PID/smaps_rollup, Linux only."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return None
    anon = file_ = None
    rss = None
    for line in data.splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Anonymous:"):
            anon = int(line.split()[1]) * 1024
    if rss is None or anon is None:
        return None
    file_ = rss - anon
    return anon, file_


class Sampler(threading.Thread):
    def __init__(self, pid: int, gpu_probe: Callable[[int], int | None] | None, interval_s: float = SAMPLE_INTERVAL_S):
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.gpu_probe = gpu_probe
        self.stop_evt = threading.Event()
        self.peak_rss = 0
        self.peak_anon: int | None = None
        self.peak_file: int | None = None
        self.peak_footprint: int | None = None
        self.peak_gpu: int | None = None
        self.n = 0
        self.max_gap = 0.0
        self.phase = "start"
        # While the child runs a timed test it says so (a phase event with "timed": true) and this thread does
        # not wake at all: on a machine whose cores all run llama.cpp threads, every wake-up preempts one of
        # them and the other stalls at the next barrier (5 ms sampling cost 5 % of decode speed on 2 cores).
        # The child reads its own RSS after each timed repetition instead ("mem" events, record_child).
        self.timed = False
        self.timed_s = 0.0
        self.n_child = 0
        self.wake = threading.Event()
        self.phase_peaks: dict[str, int] = {}
        self.gpu_phase_peaks: dict[str, int] = {}
        self.split_t = 0.0
        self.split_rss = 0
        self.statm: int | None = None
        self.proc = None
        try:   # Linux: one pread of /proc/PID/statm per sample (what psutil reads, without its overhead)
            self.statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        except OSError:
            try:
                self.proc = psutil.Process(pid)
            except psutil.Error:
                pass

    def _rss(self) -> int | None:
        if self.statm is not None:
            try:
                return int(os.pread(self.statm, 128, 0).split()[1]) * PAGE
            except (OSError, IndexError, ValueError):
                return None
        if self.proc is None:
            return None
        try:
            return self.proc.memory_info().rss
        except psutil.Error:
            return None

    def close(self) -> None:
        if self.statm is not None:
            os.close(self.statm)
            self.statm = None

    def sample_once(self, force_split: bool = False) -> None:
        rss = self._rss()
        if rss is None:
            return
        self.n += 1
        if sys.platform == "darwin":
            footprint = macos_footprint(self.pid)
            if footprint is not None:
                self.peak_footprint = max(self.peak_footprint or 0, footprint)
        if rss > self.peak_rss:
            self.peak_rss = rss
            # smaps_rollup walks the page tables (~0.1-1 ms): while RSS climbs (a fill touches new KV
            # pages every sample) read it at most every SPLIT_INTERVAL_S, and at every phase change.
            now = time.perf_counter()
            if sys.platform.startswith("linux") and (force_split or now - self.split_t >= SPLIT_INTERVAL_S):
                split = _smaps_rollup(self.pid)
                self.split_t = now
                if split:
                    self.peak_anon, self.peak_file = split
                    self.split_rss = rss
        elif force_split and self.split_rss < self.peak_rss and sys.platform.startswith("linux"):
            # the last peak was not split yet: what is resident now is the closest reading of it
            split = _smaps_rollup(self.pid)
            self.split_t = time.perf_counter()
            if split:
                self.peak_anon, self.peak_file = split
                self.split_rss = self.peak_rss
        if rss > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = rss
        if self.gpu_probe is not None:
            g = self.gpu_probe(self.pid)
            if g is not None:
                self.peak_gpu = max(self.peak_gpu or 0, g)
                if g > self.gpu_phase_peaks.get(self.phase, -1):
                    self.gpu_phase_peaks[self.phase] = g

    def set_phase(self, phase: str, timed: bool) -> None:
        """Called by the event pump at each phase change of the child."""
        if not timed:
            self.sample_once(force_split=True)   # the boundary: close the previous phase's peak
        self.phase = phase
        self.timed = timed
        self.wake.set()

    def record_child(self, rss: int | None, footprint: int | None = None) -> None:
        """The child's own reading of its memory, taken right after a timed repetition (outside the timing).
        llama.cpp frees nothing while it computes a batch, so the RSS after a repetition is that repetition's
        peak; the kernel's maximum (wait4) remains the independent check."""
        if rss is None:
            return
        self.n_child += 1
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = rss
        if footprint is not None:
            self.peak_footprint = max(self.peak_footprint or 0, footprint)

    def stop(self) -> None:
        self.stop_evt.set()
        self.wake.set()

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop_evt.is_set():
            if self.timed:
                t = time.perf_counter()
                self.wake.wait()
                self.wake.clear()
                last = time.perf_counter()
                self.timed_s += last - t
                continue
            self.sample_once()
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            last = now
            self.stop_evt.wait(self.interval_s)


def memory_sampler(pid: int, interval_s: float = SAMPLE_INTERVAL_S,
                   gpu_probe: Callable[[int], int | None] | None = None) -> Sampler:
    """A started thread sampling the resident memory (and, with ``gpu_probe``, the GPU memory) of any process
    every ``interval_s``: read ``peak_rss``, ``peak_gpu`` and ``n``; call ``sample_once()`` for a reading now, and
    ``stop()``, ``join()``, ``close()`` when done."""
    sampler = Sampler(pid, gpu_probe, interval_s)
    sampler.start()
    return sampler


def macos_footprint(pid: int) -> int | None:
    """phys_footprint of a process (includes Metal/IOAccelerator memory that RSS misses)."""
    if sys.platform != "darwin":
        return None

    class RUsageInfoV2(ctypes.Structure):
        _fields_ = [("ri_uuid", ctypes.c_uint8 * 16)] + [(n, ctypes.c_uint64) for n in (
            "ri_user_time", "ri_system_time", "ri_pkg_idle_wkups", "ri_interrupt_wkups", "ri_pageins",
            "ri_wired_size", "ri_resident_size", "ri_phys_footprint", "ri_proc_start_abstime",
            "ri_proc_exit_abstime", "ri_child_user_time", "ri_child_system_time", "ri_child_pkg_idle_wkups",
            "ri_child_interrupt_wkups", "ri_child_pageins", "ri_child_elapsed_abstime", "ri_diskio_bytesread",
            "ri_diskio_byteswritten")]

    try:
        libproc = ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib")
        info = RUsageInfoV2()
        if libproc.proc_pid_rusage(pid, 2, ctypes.byref(info)) != 0:   # RUSAGE_INFO_V2
            return None
        return int(info.ri_phys_footprint)
    except OSError:
        return None
