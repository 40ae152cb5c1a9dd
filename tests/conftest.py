"""Shared fixtures: the two real models, and an isolated EDGEKV_HOME for every test."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

# edgekv's home as the developer had it before pytest started (unset: edgekv's default, ~/.cache/edgekv): the
# suite never reaches it (tests/checks/test_isolation.py checks it): EDGEKV_HOME is scrubbed and HOME is the suite's own.
DEVELOPER_HOME = os.environ.get("EDGEKV_HOME")
REAL_HOME = Path.home()
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
# llama.cpp tools are or are built (tools/llama_tools.py), a choice of binaries, not of behaviour; and the suite's own switch to
# rewrite the golden files (tests/unit/output/test_report.py, refused under CI), which edgekv itself never reads.
_KEPT = ("EDGEKV_LLAMA_CPP_BIN", "EDGEKV_TOOLS_CACHE", "EDGEKV_UPDATE_GOLDEN")
for _name in [k for k in os.environ if k.startswith(("EDGEKV_", "HF_", "HUGGINGFACE_")) and k not in _KEPT]:
    del os.environ[_name]
# and no terminal size: the tables wrap at edgekv's own width for output that is not a terminal, whether the suite
# runs in a narrow terminal or in pytest-xdist's workers (which set COLUMNS=80)
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# Never the developer's home, even while test modules are imported (before pytest_configure, for edgekv imported
# by a plugin); huggingface-hub's state (its cache, token, telemetry files) likewise: it reads HF_HOME when first
# imported.
os.environ["EDGEKV_HOME"] = str(SESSION_DIR / "import-home")
os.environ["HF_HOME"] = str(SESSION_DIR / "hf-home")
# The suite's own HOME: edgekv's default home (~/.cache/edgekv, where code that lost its EDGEKV_HOME would write)
# and every other per-user folder is this session's, never the developer's, whatever else runs on the machine;
# the session guard below fails the run if anything lands in the default home.  pip keeps the developer's own
# configuration and download cache (edgekv fetches the SmolLM2 wheel with `pip download`: an index cache, not state).
SUITE_HOME = SESSION_DIR / "home"
SUITE_HOME.mkdir()
os.environ.setdefault("PIP_CACHE_DIR", str(REAL_HOME / ".cache" / "pip"))
# likewise the llama.cpp tools' build, kept per machine like pip's cached wheel of the same source
os.environ.setdefault("EDGEKV_TOOLS_CACHE", str(Path(os.environ.get("XDG_CACHE_HOME") or REAL_HOME / ".cache") / "edgekv-tools"))
for _conf in (REAL_HOME / ".config" / "pip" / "pip.conf", REAL_HOME / ".pip" / "pip.conf"):
    if _conf.is_file() and "PIP_CONFIG_FILE" not in os.environ:
        os.environ["PIP_CONFIG_FILE"] = str(_conf)
os.environ["HOME"] = str(SUITE_HOME)
DEFAULT_HOME = SUITE_HOME / ".cache" / "edgekv"
# predict and bench use the speed calibration only when cached: the suite's homes would otherwise each spend a
# minute calibrating (tests/unit/core/test_speed.py calibrates for real, once, in the shared calibration folder)
os.environ["EDGEKV_SPEED_CALIBRATE"] = "cached"


def pytest_configure(config) -> None:
    global _shared
    cache = getattr(config, "cache", None)
    if cache is not None:
        _shared = Path(cache.mkdir("edgekv-shared"))
    # for collection and session-scoped fixtures, which run before the autouse fixture below
    os.environ["EDGEKV_HOME"] = str(make_home(SESSION_DIR / "session-home"))


def pytest_sessionfinish(session, exitstatus) -> None:
    """The whole run fails if anything was written into edgekv's default home, i.e. by code that ran without a
    test's own EDGEKV_HOME (tests/checks/test_isolation.py); it lies in the suite's HOME, which nothing else uses."""
    written = sorted(str(p.relative_to(DEFAULT_HOME)) for p in DEFAULT_HOME.rglob("*")) if DEFAULT_HOME.exists() else []
    if written:
        session.config.get_terminal_writer().line(
            f"edgekv: a test wrote into edgekv's default home ~/.cache/edgekv (no EDGEKV_HOME of its own): "
            f"{', '.join(written[:5])}{' ...' if len(written) > 5 else ''} (a test must use its own home: "
            "tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The fast tier (`python -m pytest -m "not slow"`, README Development) is everything that needs no real model, no
# llama.cpp run, no build and no subprocess: the pure core, the schema, the CLI's errors, the views on recorded
# records.  A test that takes a real model or a built llama.cpp tool through these fixtures is slow by that alone;
# modules that run llama.cpp otherwise (tiny generated models, child processes) say so with their own
# `pytestmark = pytest.mark.slow` (or mark single tests).
SLOW_FIXTURES = {"smollm2_path", "gemma3_path", "llama_bench_exe", "llama_server_exe", "smollm2_split", "hub"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _llama_child(args) -> str | None:
    """The program, when a command line starts llama.cpp: one of its tools (llama-*) or a Python child importing it."""
    argv = [os.fsdecode(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    if argv and (os.path.basename(argv[0]).startswith("llama-") or any("import llama_cpp" in a or "edgekv.child" in a
                                                                        for a in argv)):
        return argv[0]
    return None


def _started_by_a_test() -> bool:
    """Whether the Popen being built was asked for by a test (or its tools), not by edgekv, which a test may run in
    its own process: edgekv chooses its children's groups and signals itself."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in (subprocess.__file__, __file__):
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else "edgekv"
    return name.partition(".")[0] != "edgekv"


def _default_int_and_quit() -> None:
    """In the child, before exec: SIGINT and SIGQUIT as the OS defaults them.  A shell starts a background job with
    both ignored (POSIX), and an ignored signal stays ignored across exec: a test that interrupts its child would
    then wait on one that never hears it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill what the processes left running: each one's descendants still attached to it (llama-server runs in a
    group of its own), then its whole process group when it leads one, then itself; and reap it."""
    for p in procs:
        victims = []
        if p.poll() is None:
            with contextlib.suppress(psutil.Error):
                victims = psutil.Process(p.pid).children(recursive=True)
        for v in victims:
            with contextlib.suppress(psutil.Error):
                v.kill()
        if getattr(p, "edgekv_group", False):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        psutil.wait_procs(victims, timeout=5)


@pytest.fixture(autouse=True)
def test_processes(request, monkeypatch):
    """Every process a test starts is stopped when the test ends, passed or failed.  A test's own children start in
    a session (and process group) of their own, with SIGINT and SIGQUIT at their defaults (unless the test passes
    its own preexec_fn); at teardown their groups and descendants are killed (_stop).  And the fast tier's guard:
    an unmarked test that starts a llama.cpp child fails, naming itself (tests/checks/test_limits.py)."""
    slow = request.node.get_closest_marker("slow") is not None
    started: list[subprocess.Popen] = []

    class Tracked(subprocess.Popen):
        def __init__(self, args, *a, **kw):
            if not slow and (prog := _llama_child(args)) is not None:
                pytest.fail(f"{request.node.nodeid} starts a llama.cpp child ({prog}) but is not marked "
                            "@pytest.mark.slow", pytrace=False)
            if _started_by_a_test() and not a:
                kw.setdefault("preexec_fn", _default_int_and_quit)
                if kw.get("process_group") is None:
                    kw["start_new_session"] = True
            super().__init__(args, *a, **kw)
            self.edgekv_group = bool(kw.get("start_new_session"))
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Tracked)
    yield
    _stop(started)


@pytest.fixture(autouse=True)
def edgekv_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own EDGEKV_HOME (child processes inherit it through the environment)."""
    home = make_home(tmp_path_factory.mktemp("edgekv-home", numbered=True))
    monkeypatch.setenv("EDGEKV_HOME", str(home))
    return home


@dataclass(frozen=True)
class CliRun:
    """What one `edgekv ARGS` did: its exit code and what it printed (the fields of subprocess.CompletedProcess)."""
    returncode: int
    stdout: str
    stderr: str

    def __iter__(self):             # rc, out, err = cli(...)
        return iter((self.returncode, self.stdout, self.stderr))


@pytest.fixture
def cli(capsys, monkeypatch):
    """`edgekv ARGS` in this process, through edgekv.cli.main.main (the console script's own function): returns a
    CliRun.  `env` sets variables for that call only.  For what only a real process shows (signals, exit on a
    crash, a llama.cpp child's own output) a test starts `python -m edgekv.cli` instead."""
    from edgekv.cli.main import main

    def run(*args: str | os.PathLike, env: dict[str, str] | None = None) -> CliRun:
        capsys.readouterr()                     # what the test printed before is not this command's
        with monkeypatch.context() as m:
            for k, v in (env or {}).items():
                m.setenv(k, v)
            code = main([os.fspath(a) for a in args])
        out, err = capsys.readouterr()
        return CliRun(code, out, err)

    return run


@pytest.fixture
def recorded_preflight(tmp_path, monkeypatch) -> Path:
    """For a command that must refuse before it measures: the repack preflight (a llama.cpp child that bench and
    predict run first) answers the verdict it once gave on an AVX2 machine, in a home of the test's own (its
    calibration folder not the shared one, which keeps real verdicts only).  The verdict itself is proved by
    tests/real/test_crash_machine.py."""
    from edgekv.calibration import preflight

    home = tmp_path / "recorded-home"
    home.mkdir()
    monkeypatch.setenv("EDGEKV_HOME", str(home))
    monkeypatch.setattr(preflight, "_probe_python", lambda: preflight.Preflight(
        True, "the probe decoded batches of 2 and 32 tokens with CPU_REPACK 0.42 MiB (recorded)", {"CPU_REPACK": 0.42}))
    return home


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from edgekv.sources.resolve import resolve_model

    return Path(resolve_model("smollm2-135m").path)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from edgekv.sources.resolve import resolve_model

    return Path(resolve_model("gemma3-270m").path)


@pytest.fixture(scope="session")
def smollm2_header() -> Path:
    """SmolLM2's header without its weights or tokenizer (tests/headers.py): for a formula on its shape, fast."""
    from tests.headers import SMOLLM2

    return SMOLLM2


@pytest.fixture(scope="session")
def gemma3_header() -> Path:
    """Gemma 3 270M's header without its weights or tokenizer (tests/headers.py)."""
    from tests.headers import GEMMA3

    return GEMMA3


@pytest.fixture(scope="session")
def llama_bench_exe() -> Path:
    """llama.cpp's own llama-bench, built once from the tree vendored in the installed llama-cpp-python's sdist
    (tools/llama_tools.py: pip download, cmake; about 4 minutes on 2 cores, reused afterwards)."""
    from tools.llama_tools import tool

    return tool("llama-bench")


@pytest.fixture(scope="session")
def llama_server_exe() -> Path:
    """llama.cpp's own llama-server, built from the same vendored tree as llama_bench_exe (no web UI)."""
    from tools.llama_tools import tool

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


def _start_hub(smol: Path, gemma: Path, split: list[Path] | None = None, shas: dict[Path, str] | None = None):
    """The local hub + CDN + plain file server (tools/hubserver.py) serving SmolLM2 and Gemma 3 from these files
    (``shas``: their sha256 where already known)."""
    from tools.hubserver import FakeHub

    shas = shas or {}
    h = FakeHub().start()
    h.smol_commit = h.add_repo(SMOL_REPO, {SMOL_FILE: smol}, shas={SMOL_FILE: shas.get(smol, "")})
    h.gemma_commit = h.add_repo(GEMMA_REPO, {GEMMA_FILE: gemma}, shas={GEMMA_FILE: shas.get(gemma, "")})
    if split:
        h.split_commit = h.add_repo(SPLIT_REPO, {f"Q4_1/{p.name}": p for p in split})
    h.add_plain(SMOL_FILE, smol)
    h.add_plain("readme.txt", Path(__file__))
    for srv in (h.hub_server, h.cdn_server):   # a client that hangs up mid-answer is what the hostile tests do:
        srv.handle_error = lambda request, address: None    # no traceback on the test's captured stderr
    return h


@pytest.fixture(scope="session")
def hub(smollm2_path, gemma3_path, smollm2_split):
    """The local hub serving the real models (and SmolLM2 split in three): for what reads their weights or
    tokenizer (a download, an engine dry run) and proves the header-only stand-ins below true."""
    h = _start_hub(smollm2_path, gemma3_path, smollm2_split)
    yield h
    h.stop()


@pytest.fixture(scope="session")
def sparse_models(tmp_path_factory) -> dict[str, Path]:
    """SmolLM2 and Gemma 3 as files of their real size holding only their committed headers (tests/headers.py):
    what a header read over HTTP, a path rule or an error message needs, without the models (the fast tier)."""
    from tests.headers import GEMMA3, SMOLLM2, sparse_model

    d = tmp_path_factory.mktemp("sparse-models")
    return {"smollm2": sparse_model(SMOLLM2, d / SMOL_FILE), "gemma3": sparse_model(GEMMA3, d / GEMMA_FILE)}


def _sparse_sha256(config, path: Path) -> str:
    """A stand-in's sha256, kept in pytest's cache by the sha256 of its header and its size (hashing the hole of
    Gemma 3's 250 MB takes a second)."""
    from tools.hubserver import file_sha256

    with open(path, "rb") as f:
        head = f.read(1 << 16).rstrip(b"\0")
    key = f"edgekv/sparse-sha256/{hashlib.sha256(head).hexdigest()}-{path.stat().st_size}"
    cache = getattr(config, "cache", None)
    sha = cache.get(key, None) if cache is not None else None
    if sha is None:
        sha = file_sha256(path)
        if cache is not None:
            cache.set(key, sha)
    return sha


TINY_REPO = "edgekv-test/tiny-llama-GGUF"
TINY_FILE = "tiny-llama.gguf"


@pytest.fixture(scope="session")
def header_hub(sparse_models, pytestconfig, tmp_path_factory):
    """The local hub serving the header-only stand-ins of SmolLM2 and Gemma 3 (no split repository), and a whole
    tiny model (tools/record_replies.py) for what downloads a file."""
    from tools.record_replies import write_tiny_model

    h = _start_hub(sparse_models["smollm2"], sparse_models["gemma3"],
                   shas={p: _sparse_sha256(pytestconfig, p) for p in sparse_models.values()})
    h.tiny_commit = h.add_repo(TINY_REPO, {TINY_FILE: write_tiny_model(tmp_path_factory.mktemp("tiny") / TINY_FILE)})
    yield h
    h.stop()


def _point_at(h, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "edgekv-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    h.reset()
    yield h
    h.fail_with = None
    h.cut_after.clear()


@pytest.fixture
def remote(header_hub, tmp_path, monkeypatch):
    """Point edgekv at the local hub of header-only stand-ins, with empty edgekv and Hugging Face caches."""
    yield from _point_at(header_hub, tmp_path, monkeypatch)


@pytest.fixture
def real_remote(hub, tmp_path, monkeypatch):
    """Point edgekv at the local hub of the real models, with empty edgekv and Hugging Face caches."""
    yield from _point_at(hub, tmp_path, monkeypatch)
