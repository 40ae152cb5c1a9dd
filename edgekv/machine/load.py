"""Is the machine busy? Other processes' share of the CPUs before and during a measurement (pyperf's habit).

"Other processes' CPU time" is the machine's busy CPU time (psutil.cpu_times: everything but idle and iowait, steal
included: a hypervisor taking the vCPU is load too) minus the CPU time of edgekv's own process tree (this process,
its live children, and the children it already waited for, from os.times()). Dividing by the wall time gives the
number of cores other work used; divided by the core count, its share of the machine. A configuration is marked busy
when that share reaches BUSY_SHARE before or during it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

BUSY_SHARE = 0.10          # other work used >= 10 % of the machine's cores
# the OS counts CPU time in clock ticks (Linux: 10 ms): over a window of a few milliseconds (a configuration llama.cpp
# refused at once) one tick read as 293 % of 2 CPUs; a window shorter than this has no share, busy or quiet
MIN_WINDOW_S = 0.25
_IDLE = ("idle", "iowait")


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    return sum(v for k, v in t._asdict().items() if k not in _IDLE and k not in ("guest", "guest_nice"))


def _own_cpu_s() -> float:
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    try:
        for c in psutil.Process().children(recursive=True):
            try:
                ct = c.cpu_times()
                own += ct.user + ct.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except psutil.Error:
        pass
    return own


class Window:
    """Other processes' CPU over a time window."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.busy = _busy_cpu_s()
        self.own = _own_cpu_s()

    def close(self) -> dict[str, Any]:
        wall = max(1e-6, time.monotonic() - self.t)
        # a child reaped between the two reads moves from "live" to os.times(): the sum stays continuous
        others = max(0.0, (_busy_cpu_s() - self.busy) - (_own_cpu_s() - self.own))
        n = psutil.cpu_count() or 1
        out = {"wall_s": round(wall, 3), "others_cpu_s": round(others, 3)}
        if wall >= MIN_WINDOW_S:
            out.update(others_cores=round(others / wall, 3), others_share=round(others / wall / n, 3))
        return out


def threads_left(n: int, window_s: float = 0.5) -> tuple[int, float | None]:
    """(threads llama.cpp should run on, the cores other processes used over the last ``window_s``): ``n`` less each
    core other work kept busy (a core busy more than half the window counts), at least 1.  llama.cpp's threads meet
    at a barrier after every graph node, so one thread that shares its core with a busy process holds up all of them:
    on two cores with one busy, two threads ran a configuration in about 9 minutes that one thread runs in under one.
    (``n``, None) where the window was too short to tell."""
    w = Window()
    time.sleep(window_s)
    used = w.close().get("others_cores")
    if used is None:
        return n, None
    return max(1, n - int(used + 0.5)), used


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


class LoadMonitor:
    """Samples the 1-minute load average every second while a configuration runs."""

    def __init__(self, before_s: float = 0.5) -> None:
        self.before_s = before_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.max_load: float | None = None
        self.before: dict[str, Any] | None = None
        self.window: Window | None = None

    def start(self) -> None:
        w = Window()
        time.sleep(self.before_s)
        self.before = {**w.close(), "loadavg_1m": _loadavg()}
        self.window = Window()
        self.max_load = _loadavg()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            la = _loadavg()
            if la is not None and (self.max_load is None or la > self.max_load):
                self.max_load = la

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        during = self.window.close() if self.window else {}
        during["loadavg_1m_max"] = self.max_load
        before = self.before or {}
        n = psutil.cpu_count() or 1
        share = max(before.get("others_share") or 0.0, during.get("others_share") or 0.0)
        return {"cpus": n, "before": before, "during": during, "threshold_share": BUSY_SHARE,
                "busy": bool(share >= BUSY_SHARE), "others_share_max": round(share, 3)}


def busy_note(load: dict[str, Any] | None) -> str | None:
    """'busy: other work used 43 % of 2 CPUs' for a record's load block, None when quiet or unknown."""
    if not load or not load.get("busy"):
        return None
    return f"busy: other work used {100 * load.get('others_share_max', 0):.0f} % of {load.get('cpus')} CPUs"


def record_busy(rec: Any) -> bool:
    """A results record (:class:`edgekv.records.schema.Record`) measured while other work took a significant
    share of the CPUs (its ``load`` block says busy; absent or None: not known to be busy)."""
    return bool(rec.load and rec.load.busy)
