"""edgekv: what a GGUF model costs on your machine under llama.cpp, with the evidence.

>>> import edgekv
>>> p = edgekv.predict("model.gguf", n_ctx=32768, type_k="q4_0")   # doctest: +SKIP
>>> p.kv_bytes, p.to_dict()["caches"]                                # doctest: +SKIP
"""

from __future__ import annotations

from edgekv.core.predict import (  # noqa: E402
           ContextParams,
           KVPrediction,
           formula_block,  # noqa: E402
)
from edgekv.errors import EdgekvError  # noqa: E402
from edgekv.prediction.api import LoadedModel, load_model  # noqa: E402
from edgekv.prediction.api import predict as _predict_model  # noqa: E402
from edgekv.records.frame import load_results, results_frame  # noqa: E402
from edgekv.version import __version__  # noqa: E402

# ``edgekv.core.predict`` is the function; the module stays importable as ``edgekv.core.predict`` through
# ``from edgekv.core.predict import ...`` (it is in sys.modules).
predict = _predict_model

__all__ = ["ContextParams", "EdgekvError", "KVPrediction", "LoadedModel", "formula_block", "load_model", "load_results",
           "predict", "results_frame", "__version__"]
