"""The tiny families' specs (tests/tiny/specs.json) without llama.cpp: one per family the vendored llama.cpp knows,
and the metadata rules edgekv refuses before loading.  What llama.cpp does with each family is
tests/real/test_families.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekv.errors import MetadataError
from edgekv.prediction.api import load_model
from tests.tiny.writer import write_spec

SPECS = json.loads((Path(__file__).parents[2] / "tiny" / "specs.json").read_text())["families"]


def test_every_family_has_a_spec():
    from importlib.metadata import version

    from tests.tiny.discover import FAMILIES

    hint = "regenerate tests/tiny/specs.json: python -m tests.tiny.discover"
    assert sorted(SPECS) == sorted(FAMILIES), hint
    spec_version = json.loads((Path(__file__).parents[2] / "tiny" / "specs.json").read_text())["llama_cpp_python"]
    assert spec_version == version("llama-cpp-python"), hint


def test_gemma4_too_many_shared_layers_is_refused(tmp_path):
    """shared_kv_layers >= block_count - 1 leaves fewer than 2 KV layers: llama.cpp asserts (even when the
    subtraction goes negative and every layer would otherwise own KV)."""
    spec = json.loads(json.dumps(SPECS["gemma4"]))
    for shared in (5, 9):
        for e in spec["metadata"]:
            if e[0] == "gemma4.attention.shared_kv_layers":
                e[2] = shared
        path = tmp_path / f"gemma4-shared{shared}.gguf"
        write_spec(path, spec)
        with pytest.raises(MetadataError, match="llama.cpp needs at least 2"):
            load_model(str(path))
