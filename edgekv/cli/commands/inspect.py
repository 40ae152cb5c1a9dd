"""``edgekv inspect``: the model's architecture as llama.cpp reads it (listed in :data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

from typing import Optional

from edgekv.cli.flags import MODEL_ARG, MODEL_OPT, AsJson
from edgekv.cli.options import make_console, model_notes, pick_model, print_json
from edgekv.output.views import inspect_dict, render_inspect
from edgekv.prediction.api import load_model


def inspect(
    model: Optional[str] = MODEL_ARG,
    model_opt: Optional[str] = MODEL_OPT,
    as_json: AsJson = False,
) -> None:
    """Architecture, layers, heads, head dims, SWA/shared/MLA/recurrent layers, weights by type."""
    m = load_model(pick_model(model, model_opt))
    model_notes(m)
    if as_json:
        print_json(inspect_dict(m))
    else:
        render_inspect(make_console(), m)
