"""One measurer per calibration: a file lock in the calibration store, so that two edgekv processes that need the
same calibration never both measure (on two cores each would measure the other's noise).

The second process waits for the first's result until its own deadline, then reads the cache the first wrote; if
the deadline passes first, it goes on without what it waited for and says so.  The lock is the ``filelock``
package's (already a dependency of huggingface-hub; portable, released by the OS when its holder dies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from filelock import FileLock, Timeout

from edgekv.calibration.baseline import store_path


class LockTimeout(RuntimeError):
    """Another edgekv process held the calibration lock past this one's deadline."""


def lock_path(name: str):
    """The lock file of one calibration store entry (``name`` is edgekv's own, never user input)."""
    p = store_path(name)
    return p.with_name(p.name.removesuffix(".json") + ".lock")


@contextmanager
def measuring(name: str, deadline: float | None = None,
              on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock of calibration ``name`` for the block.  When another process holds it, ``on_wait`` is called
    once and this one waits until ``deadline`` (a ``time.monotonic()`` time; None: without end), then raises
    LockTimeout."""
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if on_wait is not None:
            on_wait()
        left = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            lock.acquire(timeout=left)
        except Timeout:
            raise LockTimeout("another edgekv process was still measuring this machine's speed calibration when the "
                              "deadline passed") from None
    try:
        yield
    finally:
        lock.release()
