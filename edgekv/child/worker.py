"""Code that runs inside a child process started by :mod:`edgekv.runtime.process`.

``python -m edgekv.child.worker SUBCOMMAND`` reads a JSON payload on stdin and reports on the event pipe.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

from edgekv.child import quality_child
from edgekv.child.bench_child import bench
from edgekv.child.emulate import install
from edgekv.child.speedprobe import speed_probe
from edgekv.child.workload import baseline, device_runtime, env_info, extra_buffers, preflight
from edgekv.core.predict import ContextParams
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import DryRunner


def _engine(_payload: dict, ev: EventWriter) -> None:
    """A dry-run session: requests arrive one JSON object per line on stdin."""
    runner = DryRunner()
    try:
        for raw in sys.stdin.buffer:
            req = json.loads(raw)
            op = req.get("op")
            if op == "quit":
                break
            if op == "load":
                ev.emit("response", data=runner.load(req["model_path"], req.get("n_gpu_layers", -1),
                                                     bool(req.get("use_extra_bufts", True))))
            elif op == "contexts":
                keep = bool(req.get("keep_log"))
                nom = int(req.get("n_outputs_max") or 0)
                results = [runner.context(ContextParams(**c), keep, nom) for c in req["configs"]]
                ev.emit("response", data={"results": results})
            else:
                ev.emit("error", error=f"unknown op {op!r}")
    finally:
        runner.close()


SUBCOMMANDS: dict[str, Callable[[dict, EventWriter], None]] = {
    "engine": _engine, "bench": bench, "env": env_info, "quality": quality_child.run, "baseline": baseline,
    "preflight": preflight, "extra_buffers": extra_buffers, "speed_probe": speed_probe, "device_runtime": device_runtime}
STREAMING = {"engine"}   # these read requests from stdin themselves


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m edgekv.child.worker {{{','.join(SUBCOMMANDS)}}}", file=sys.stderr)
        return 2

    install()       # a testing aid, off unless EDGEKV_EMULATE_EXTRA_BUFT_CRASH=1 (edgekv.child.emulate)
    ev = EventWriter()
    payload = {} if argv[0] in STREAMING else json.loads(sys.stdin.buffer.read() or b"{}")
    try:
        SUBCOMMANDS[argv[0]](payload, ev)
    except Exception as e:  # reported to the parent, which decides what to show
        ev.emit("error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
