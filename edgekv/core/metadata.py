"""Values of GGUF metadata as the header reader hands them to the pure core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArraySummary:
    """Stands in for a metadata array too long to keep (e.g. ``tokenizer.ggml.tokens``)."""

    item_type: str
    length: int

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"<array of {self.length} {self.item_type}>"
