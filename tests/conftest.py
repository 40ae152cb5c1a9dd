"""Shared fixtures: the two real models, and an isolated EDGEKV_HOME for every test."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# edgekv's home as the developer had it before pytest started (unset: edgekv's default, ~/.cache/edgekv): the
# suite never writes there (tests/test_isolation.py checks it).
DEVELOPER_HOME = os.environ.get("EDGEKV_HOME")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and mtime (empty when it does not exist)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


_DEVELOPER_ROOT = Path(DEVELOPER_HOME) if DEVELOPER_HOME else Path.home() / ".cache" / "edgekv"
_DEVELOPER_BEFORE = _snapshot(_DEVELOPER_ROOT)
# What is costly to build and the same in every test is shared: the extracted models (SmolLM2 from its pinned
# wheel, Gemma 3 assembled from its package), sha256 stamps (keyed by path, size and mtime) and the runtime
# baseline (keyed by the environment's fingerprint).  They live in pytest's cache directory (.pytest_cache/d/,
# kept between sessions of this checkout), or in the session's temporary directory without the cache plugin.
SHARED = ("models", "sha256", "calibration")
SESSION_DIR = Path(tempfile.mkdtemp(prefix="edgekv-test-session-"))
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
_shared = SESSION_DIR / "shared"


def make_home(root: Path) -> Path:
    """An empty edgekv home whose model, sha256 and calibration caches are the shared ones."""
    root.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        (_shared / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(_shared / name, target_is_directory=True)
    return root


# Nothing of the developer's edgekv or huggingface-hub settings reaches a test (EDGEKV_DEBUG=1 would turn every
# one-line error into a traceback, HF_TOKEN or HF_ENDPOINT would change what the hub tests see); tests set what
# they need with monkeypatch, which restores this scrubbed environment after each.  Kept: where the developer's own
# llama.cpp tools are (bench/llama_tools.py), a choice of binaries, not of behaviour.
for _name in [k for k in os.environ if k.startswith(("EDGEKV_", "HF_", "HUGGINGFACE_")) and k != "EDGEKV_LLAMA_CPP_BIN"]:
    del os.environ[_name]
# Never the developer's home, even while test modules are imported (before pytest_configure, for edgekv imported
# by a plugin); huggingface-hub's state (its cache, token, telemetry files) likewise: it reads HF_HOME when first
# imported.
os.environ["EDGEKV_HOME"] = str(SESSION_DIR / "import-home")
os.environ["HF_HOME"] = str(SESSION_DIR / "hf-home")
# predict and bench use the speed calibration only when cached: the suite's homes would otherwise each spend a
# minute calibrating (tests/test_speed.py calibrates for real, once, in the shared calibration folder)
os.environ["EDGEKV_SPEED_CALIBRATE"] = "cached"


def pytest_configure(config) -> None:
    global _shared
    cache = getattr(config, "cache", None)
    if cache is not None:
        _shared = Path(cache.mkdir("edgekv-shared"))
    # for collection and session-scoped fixtures, which run before the autouse fixture below
    os.environ["EDGEKV_HOME"] = str(make_home(SESSION_DIR / "session-home"))


def pytest_sessionfinish(session, exitstatus) -> None:
    """The whole run fails if anything was written under the developer's home (tests/test_isolation.py)."""
    after = _snapshot(_DEVELOPER_ROOT)
    changed = sorted(k for k in set(after) | set(_DEVELOPER_BEFORE) if after.get(k) != _DEVELOPER_BEFORE.get(k))
    if changed:
        session.config.get_terminal_writer().line(
            f"edgekv: the suite wrote into the developer's EDGEKV_HOME {_DEVELOPER_ROOT}: {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''} (a test must use its own home: tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def edgekv_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own EDGEKV_HOME (child processes inherit it through the environment)."""
    home = make_home(tmp_path_factory.mktemp("edgekv-home", numbered=True))
    monkeypatch.setenv("EDGEKV_HOME", str(home))
    return home


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


@pytest.fixture(scope="session")
def llama_server_exe() -> Path:
    """llama.cpp's own llama-server, built from the same vendored tree as llama_bench_exe (no web UI)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from llama_tools import tool

    return tool("llama-server")


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
