"""The dry-run session child (``python -m edgekv.child.worker engine``): llama.cpp's own answer for each
configuration the parent sends, one JSON request per line on stdin (edgekv.runtime.engine.EngineSession)."""

from __future__ import annotations

import json
import sys

from edgekv.core.predict import ContextParams
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import DryRunner


def engine(_payload: dict, ev: EventWriter) -> None:
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
