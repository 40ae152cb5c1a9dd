"""A file in a Hugging Face repository at a revision: the one value the hub code, the header cache and the
model sources pass around (its own module, so that the header cache needs nothing of the hub)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HfFile:
    repo: str
    filename: str
    revision: str = "main"

    @property
    def spec(self) -> str:
        return f"hf://{self.repo}/{self.filename}@{self.revision}"

    def sibling(self, filename: str) -> HfFile:
        d = self.filename.rpartition("/")[0]
        return HfFile(self.repo, f"{d}/{filename}" if d else filename, self.revision)
