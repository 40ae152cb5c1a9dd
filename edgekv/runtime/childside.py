"""The child side of :mod:`edgekv.runtime.process`: what runs inside a measured child to talk to its parent, one JSON
object per line on the event pipe whose file descriptor the parent passes in ``EVENT_FD_ENV``."""

from __future__ import annotations

import json
import os
from typing import Any

# a testing aid (edgekv.child.emulate): children act as on a CPU whose extra-buffer kernels crash
EMULATE_CRASH_ENV = "EDGEKV_EMULATE_EXTRA_BUFT_CRASH"

EVENT_FD_ENV = "EDGEKV_EVENT_FD"


class EventWriter:
    """Used inside the child to talk to the parent."""

    def __init__(self) -> None:
        fd = os.environ.get(EVENT_FD_ENV)
        self.f = os.fdopen(int(fd), "w", buffering=1) if fd else None

    def emit(self, event: str, **data: Any) -> None:
        if self.f is None:
            return
        self.f.write(json.dumps({"event": event, **data}) + "\n")
        self.f.flush()

    def result(self, data: Any) -> None:
        self.emit("result", data=data)
