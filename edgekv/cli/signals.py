"""SIGTERM and SIGHUP handled like Ctrl-C: what ``timeout``, a CI job's cancellation and ``kill`` send.

While a command runs, either signal raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, so the
same path as Ctrl-C runs: the measuring child's process group is stopped, the records already written stay, and
the command exits 128 + the signal's number (143 for SIGTERM, 129 for SIGHUP; 130 for Ctrl-C)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

HANDLED = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class Terminated(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []


def _raise(signum: int, _frame: object) -> None:
    _received.append(signum)
    raise Terminated(signum)


def interrupted_code() -> int:
    """The exit status of an interrupted command: 128 + the signal that stopped it (130: Ctrl-C)."""
    return 128 + _received[-1] if _received else 130


def signalled() -> bool:
    """Whether SIGTERM or SIGHUP (not Ctrl-C) stopped the last :func:`handled` block."""
    return bool(_received)


def signalled_code(rc: int) -> int:
    """A command's exit status, 130 turned into 128 + the signal when SIGTERM or SIGHUP stopped it: typer turns a
    KeyboardInterrupt that reaches it (a :class:`Terminated` raised outside a command's own handler, during a
    calibration for one) into Exit(130), Ctrl-C's status; ``timeout`` and a CI job's cancellation must not read
    as a Ctrl-C.  The interrupted line is said here, as for Ctrl-C's own path."""
    if rc != 130 or not _received:
        return rc
    sys.stderr.write(f"edgekv: interrupted ({interrupted_by()})\n")
    return interrupted_code()


def interrupted_by() -> str:
    return signal.Signals(_received[-1]).name if _received else "Ctrl-C"


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGTERM/SIGHUP raise :class:`Terminated` inside the block (main thread only); the old handlers come back."""
    _received.clear()
    try:
        old = {s: signal.signal(s, _raise) for s in HANDLED}
    except ValueError:          # not the main thread: leave signals alone
        old = {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
