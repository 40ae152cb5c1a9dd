"""For tests that signal a process they started: the signals it must hear, at the OS default in the child.

A process inherits ignored signals across exec: started from a background job of a non-interactive shell (SIGINT and
SIGQUIT ignored, POSIX) or under nohup (SIGHUP ignored), a child would never hear the signal the test sends.
tests/conftest.py restores SIGINT and SIGQUIT for every child a test starts and stops its process group at teardown;
a test that sends a signal says which one with `preexec_fn=default_signals(...)`."""

from __future__ import annotations

import signal
from collections.abc import Callable


def default_signals(*sigs: signal.Signals) -> Callable[[], None]:
    """A preexec_fn setting each of `sigs` (and SIGINT and SIGQUIT) to SIG_DFL in the child before exec."""
    wanted = {signal.SIGINT, signal.SIGQUIT, *sigs}

    def preexec() -> None:
        for s in wanted:
            signal.signal(s, signal.SIG_DFL)

    return preexec
