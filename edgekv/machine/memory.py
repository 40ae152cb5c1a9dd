"""How much memory a new process may take on this machine now, read from the OS.

Linux: the tighter of ``MemAvailable`` (/proc/meminfo: what the kernel can give without swapping) and, inside a
container or a CI job with a memory limit, the cgroup's limit minus its current usage (v2: ``memory.max`` and
``memory.current``; v1: ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``).  Elsewhere: psutil's available
memory (macOS: the physical memory the process may use).  The roots are parameters, so tests read fake files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from edgekv.core.fit import size, watchdog_floor

NO_LIMIT = 1 << 60        # cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages)


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str               # "MemAvailable", "cgroup limit", "available (psutil)"
    total: int | None = None  # the machine's (or the cgroup's) total


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            raw = f.read().strip()
    except OSError:
        return None
    if raw in (b"max", b""):
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _meminfo(proc_root: str) -> tuple[int | None, int | None]:
    avail = total = None
    try:
        with open(os.path.join(proc_root, "meminfo"), "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                elif line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return avail, total


def _cgroup_room(proc_root: str, cgroup_root: str) -> tuple[int, int] | None:
    """(limit - usage, limit) of this process's cgroup when it has a memory limit, else None."""
    try:
        with open(os.path.join(proc_root, "self", "cgroup"), "rb") as f:
            lines = [x.decode(errors="replace").strip() for x in f]
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2].lstrip("/")
        if controllers == "":                                    # v2, unified
            base = os.path.join(cgroup_root, rel)
            limit, usage = _read_int(os.path.join(base, "memory.max")), _read_int(os.path.join(base, "memory.current"))
        elif "memory" in controllers.split(","):                 # v1
            base = os.path.join(cgroup_root, "memory", rel)
            limit = _read_int(os.path.join(base, "memory.limit_in_bytes"))
            usage = _read_int(os.path.join(base, "memory.usage_in_bytes"))
        else:
            continue
        if limit is not None and limit < NO_LIMIT and usage is not None:
            return max(0, limit - usage), limit
    return None


def available_memory(proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> Available | None:
    """The memory a new process may take now (see the module docstring); None when nothing can be read."""
    avail, total = _meminfo(proc_root)
    if avail is None:
        try:
            vm = psutil.virtual_memory()
            return Available(int(vm.available), "available (psutil)", int(vm.total))
        except Exception:  # noqa: BLE001 - no reading is None, never a guess
            return None
    room = _cgroup_room(proc_root, cgroup_root)
    if room is not None and room[0] < avail:
        return Available(room[0], "cgroup limit", room[1])
    return Available(avail, "MemAvailable", total)


def memory_watchdog() -> str | None:
    """Checked while a configuration runs: a reason to stop it when the machine's available memory (the cgroup's
    too) has fallen below the floor (edgekv.core.fit.watchdog_floor), before the kernel's OOM killer picks a process
    -- perhaps not edgekv's -- else None."""
    avail = available_memory()
    if avail is None:
        return None
    floor = watchdog_floor(avail.total)
    if avail.bytes >= floor:
        return None
    return (f"stopped: machine memory nearly exhausted ({size(avail.bytes)} available < {size(floor)} floor, "
            f"{avail.source})")
