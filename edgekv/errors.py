"""edgekv's exceptions.

Every error edgekv raises on purpose is an :class:`EdgekvError`.  Each subclass also inherits the
matching built-in exception, so callers that already catch ``ValueError`` or ``FileNotFoundError``
keep working (the habit huggingface_hub follows).  The CLI turns an ``EdgekvError`` into one line and
an exit code; ``EDGEKV_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations


class EdgekvError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with: 2 for usage errors, 1 for failures."""

    exit_code = 1


class UsageError(EdgekvError, ValueError):
    """A flag, argument or option value is wrong (exit 2)."""

    exit_code = 2


class GGUFFormatError(EdgekvError, ValueError):
    """The bytes are not a GGUF header edgekv (or llama.cpp) can read."""


class GGUFTruncatedError(GGUFFormatError):
    """The byte source ended inside the header.  ``needed`` is the offset that was asked for."""

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


class MetadataError(EdgekvError, KeyError):
    """A GGUF metadata key llama.cpp needs is missing or has the wrong type."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return str(self.args[0]) if self.args else ""


class ModelNotFound(EdgekvError, FileNotFoundError):
    """A model path, registry name or package resource does not exist."""


class SourceError(EdgekvError, OSError):
    """Reading a remote source failed (HTTP error, no range support, offline)."""


class RegistryError(EdgekvError, ValueError):
    """models.toml is malformed, or an entry cannot be used as asked (e.g. an unverified download)."""


class EngineError(EdgekvError, RuntimeError):
    """llama.cpp itself refused or crashed (dry run or measured run)."""


class RunFailed(EdgekvError, RuntimeError):
    """A measured run failed."""


class CorpusError(EdgekvError, ValueError):
    """A text corpus for the quality pass is missing, empty, binary, too short, or cannot be fetched."""


class ResultsError(EdgekvError, ValueError):
    """A results file cannot be read or does not fit the schema."""


class EnvironmentMismatch(ResultsError):
    """Results to be compared come from environments that differ on checked keys (exit 2; --force overrides)."""

    exit_code = 2
