"""Code that runs inside a child process started by :mod:`edgekv.edges.process`.

``python -m edgekv.child.worker SUBCOMMAND`` reads a JSON payload on stdin and reports on the event pipe.
"""

from __future__ import annotations

import json
import sys
import traceback

from edgekv.edges.childside import EventWriter


def _engine(_payload: dict, ev: EventWriter) -> None:
    """A dry-run session: requests arrive one JSON object per line on stdin."""
    from edgekv.core.predict import ContextParams
    from edgekv.edges.engine import DryRunner

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


def _bench(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.benchrun import bench

    bench(payload, ev)


def _env(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.workload import env_info

    env_info(payload, ev)


def _baseline(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.workload import baseline

    baseline(payload, ev)


def _preflight(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.workload import preflight

    preflight(payload, ev)


def _extra_buffers(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.workload import extra_buffers

    extra_buffers(payload, ev)


def _speed_probe(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.speedprobe import speed_probe

    speed_probe(payload, ev)


def _device_runtime(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.workload import device_runtime

    device_runtime(payload, ev)


def _quality(payload: dict, ev: EventWriter) -> None:
    from edgekv.child.quality_child import run

    run(payload, ev)


SUBCOMMANDS = {"engine": _engine, "bench": _bench, "env": _env, "quality": _quality, "baseline": _baseline,
               "preflight": _preflight, "extra_buffers": _extra_buffers, "speed_probe": _speed_probe,
               "device_runtime": _device_runtime}
STREAMING = {"engine"}   # these read requests from stdin themselves


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m edgekv.child.worker {{{','.join(SUBCOMMANDS)}}}", file=sys.stderr)
        return 2
    from edgekv.child.emulate import install

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
