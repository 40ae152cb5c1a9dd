"""edgekv: what a GGUF model costs on your machine under llama.cpp, with the evidence.

>>> import edgekv
>>> p = edgekv.predict("model.gguf", n_ctx=32768, type_k="q4_0")   # doctest: +SKIP
>>> p.kv_bytes, p.to_dict()["caches"]                                # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgekv.core.predict import ContextParams, KVPrediction, formula_block
    from edgekv.errors import EdgekvError
    from edgekv.prediction.api import LoadedModel, load_model, predict
    from edgekv.records.frame import load_results, results_frame
    from edgekv.version import __version__

# The public names, each read from its module on first use (PEP 562): importing any edgekv module runs this file,
# and a measured child (edgekv.child) must hold only what its job needs, not the whole Python API and the records.
_WHERE = {"ContextParams": "edgekv.core.predict", "KVPrediction": "edgekv.core.predict",
          "formula_block": "edgekv.core.predict", "EdgekvError": "edgekv.errors", "LoadedModel": "edgekv.prediction.api",
          "load_model": "edgekv.prediction.api", "predict": "edgekv.prediction.api",
          "load_results": "edgekv.records.frame", "results_frame": "edgekv.records.frame",
          "__version__": "edgekv.version"}

__all__ = ["ContextParams", "EdgekvError", "KVPrediction", "LoadedModel", "formula_block", "load_model", "load_results",
           "predict", "results_frame", "__version__"]


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'edgekv' has no attribute {name!r}")
