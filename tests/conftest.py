"""Shared fixtures: the two real models, and an isolated EDGEKV_HOME for every test session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Isolate edgekv's state (caches, sha256 stamps) from the user's, before edgekv is imported.
_HOME = tempfile.mkdtemp(prefix="edgekv-test-home-")
os.environ.setdefault("EDGEKV_HOME", _HOME)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from edgekv.sources import resolve_model

    return Path(resolve_model("smollm2-135m").path)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from edgekv.sources import resolve_model

    return Path(resolve_model("gemma3-270m").path)
