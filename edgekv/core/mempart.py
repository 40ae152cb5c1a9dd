"""One named part of the whole-process prediction (:mod:`edgekv.core.memmodel`) and where its figure comes from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SRC_FORMULA = "formula"
SRC_LLAMA = "llama.cpp dry run"
SRC_LLAMA_MEASURED = "measured (llama.cpp dry-run process)"
SRC_CALIBRATION = "measured (runtime calibration)"

HOST = "host"


@dataclass
class Part:
    name: str
    bytes: int
    source: str
    where: str = HOST            # "host" or a ggml device name (CUDA0, Metal, ...)
    kind: str = "anonymous"      # anonymous | file | device
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

