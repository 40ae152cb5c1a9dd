"""The dry-run session child (``python -m edgekv.child.worker engine``): llama.cpp's own answer for each
configuration the parent sends, one JSON request per line on stdin (edgekv.runtime.engine.EngineSession), each an
edgekv.core.childwire request decoded strictly on arrival, each reply a typed one (EngineLoaded,
EngineContextsReply)."""

from __future__ import annotations

import json
import sys

import msgspec

from edgekv.core.childwire import EngineContexts, EngineContextsReply, EngineLoad, EngineQuit, engine_request_from
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import DryRunner


def engine(_payload: dict, ev: EventWriter) -> None:
    """A dry-run session: requests arrive one JSON object per line on stdin."""
    runner = DryRunner()
    try:
        for raw in sys.stdin.buffer:
            try:
                req = engine_request_from(json.loads(raw))
            except (ValueError, msgspec.ValidationError) as e:
                ev.emit("error", error=f"not a dry-run request: {e}")
                continue
            if isinstance(req, EngineQuit):
                break
            if isinstance(req, EngineLoad):
                loaded = runner.load(req.model_path, req.n_gpu_layers, req.use_extra_bufts, req.graph_listing)
                ev.emit("response", data=msgspec.to_builtins(loaded))
            elif isinstance(req, EngineContexts):
                results = [runner.context(c, req.keep_log, req.n_outputs_max) for c in req.configs]
                ev.emit("response", data=msgspec.to_builtins(EngineContextsReply(results=results)))
    finally:
        runner.close()
