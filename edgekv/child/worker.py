"""Code that runs inside a child process started by :mod:`edgekv.runtime.process`.

``python -m edgekv.child.worker SUBCOMMAND`` reads a JSON payload on stdin and reports on the event pipe.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Callable

from edgekv.child.emulate import install
from edgekv.runtime.childside import EventWriter

# subcommand -> (module, function).  Only the subcommand's own module is imported: a child holds what its job needs,
# so the runtime baseline (the "baseline" child) is what a llama.cpp process holds before its model, not every
# child's code at once (importing them all added the quality child's corpus, registry and wheel readers to each)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "engine": ("edgekv.child.dryrun_child", "engine"), "bench": ("edgekv.child.bench_child", "bench"),
    "env": ("edgekv.child.workload", "env_info"), "quality": ("edgekv.child.quality_child", "run"),
    "baseline": ("edgekv.child.workload", "baseline"), "preflight": ("edgekv.child.workload", "preflight"),
    "extra_buffers": ("edgekv.child.workload", "extra_buffers"),
    "speed_probe": ("edgekv.child.speedprobe", "speed_probe"),
    "device_runtime": ("edgekv.child.workload", "device_runtime")}
STREAMING = {"engine"}   # these read requests from stdin themselves


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m edgekv.child.worker {{{','.join(SUBCOMMANDS)}}}", file=sys.stderr)
        return 2

    install()       # a testing aid, off unless EDGEKV_EMULATE_EXTRA_BUFT_CRASH=1 (edgekv.child.emulate)
    ev = EventWriter()
    payload = {} if argv[0] in STREAMING else json.loads(sys.stdin.buffer.read() or b"{}")
    module, name = SUBCOMMANDS[argv[0]]
    run: Callable[[dict, EventWriter], None] = getattr(importlib.import_module(module), name)
    try:
        run(payload, ev)
    except Exception as e:  # reported to the parent, which decides what to show
        ev.emit("error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
