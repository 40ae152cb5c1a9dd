"""One named part of the whole-process prediction (:mod:`edgekv.core.memmodel`) and where its figure comes from:
the record's ``prediction.process.parts`` entries, as the model builds them."""

from __future__ import annotations

from typing import Annotated

import msgspec

from edgekv.core.wire import desc

SRC_FORMULA = "formula"
SRC_LLAMA = "llama.cpp dry run"
SRC_LLAMA_MEASURED = "measured (llama.cpp dry-run process)"
SRC_CALIBRATION = "measured (runtime calibration)"

HOST = "host"


class ProcessPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One part of the whole-process prediction; ``source`` is its provenance."""

    name: Annotated[str, desc("what it is")]
    bytes: Annotated[int, desc("bytes")]
    source: Annotated[str, desc("formula | llama.cpp dry run | measured (runtime calibration) | ...")]
    where: Annotated[str, desc("host or a ggml device name")] = HOST      # or CUDA0, Metal, ...
    kind: Annotated[str, desc("anonymous | file | device")] = "anonymous"
    note: Annotated[str, desc("how it was obtained")] = ""
