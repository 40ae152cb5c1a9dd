"""Shared fixtures: the two real models, and an isolated EDGEKV_HOME for every test session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Isolate edgekv's state (caches, sha256 stamps) from the user's, before edgekv is imported.
_HOME = tempfile.mkdtemp(prefix="edgekv-test-home-")
os.environ.setdefault("EDGEKV_HOME", _HOME)
# ... and huggingface-hub's (its cache, token, telemetry files); it reads HF_HOME when first imported.
os.environ.setdefault("HF_HOME", os.path.join(_HOME, "hf-home"))
os.environ.pop("HF_HUB_OFFLINE", None)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from edgekv.edges.sources import resolve_model

    return Path(resolve_model("smollm2-135m").path)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from edgekv.edges.sources import resolve_model

    return Path(resolve_model("gemma3-270m").path)


@pytest.fixture(scope="session")
def llama_bench_exe() -> Path:
    """llama.cpp's own llama-bench, built once from the tree vendored in the installed llama-cpp-python's sdist
    (bench/llama_tools.py: pip download, cmake; about 4 minutes on 2 cores, reused afterwards)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from llama_tools import tool

    return tool("llama-bench")


def write_split(src: Path, out: Path, max_tensors: int) -> list[Path]:
    """Split a real GGUF with gguf-py's own writer (split.no / split.count / split.tensors.count)."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, r.get_field(gguf.Keys.General.ARCHITECTURE).contents(), split_max_tensors=max_tensors)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))


@pytest.fixture(scope="session")
def smollm2_split(smollm2_path, tmp_path_factory) -> list[Path]:
    """SmolLM2 split into 3 files of at most 100 tensors."""
    d = tmp_path_factory.mktemp("split")
    files = write_split(smollm2_path, d / "SmolLM2-135M-Instruct.Q4_1.gguf", 100)
    assert [p.name for p in files] == [f"SmolLM2-135M-Instruct.Q4_1-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return files


SMOL_REPO = "edgekv-test/SmolLM2-135M-Instruct-GGUF"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_REPO = "edgekv-test/gemma-3-270m-GGUF"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
SPLIT_REPO = "edgekv-test/SmolLM2-split-GGUF"


@pytest.fixture(scope="session")
def hub(smollm2_path, gemma3_path, smollm2_split):
    """The local hub + CDN + plain file server, serving the real models (see tests/hubserver.py)."""
    from hubserver import FakeHub

    h = FakeHub().start()
    h.smol_commit = h.add_repo(SMOL_REPO, {SMOL_FILE: smollm2_path})
    h.gemma_commit = h.add_repo(GEMMA_REPO, {GEMMA_FILE: gemma3_path})
    h.split_commit = h.add_repo(SPLIT_REPO, {f"Q4_1/{p.name}": p for p in smollm2_split})
    h.add_plain(SMOL_FILE, smollm2_path)
    h.add_plain("readme.txt", Path(__file__))
    yield h
    h.stop()


@pytest.fixture
def remote(hub, tmp_path, monkeypatch):
    """Point edgekv at the local hub, with empty edgekv and Hugging Face caches; returns the hub."""
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "edgekv-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.reset()
    yield hub
    hub.fail_with = None
    hub.cut_after.clear()
