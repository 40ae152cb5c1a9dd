"""Build llama.cpp's own tools (llama-bench, llama-perplexity, llama-batched-bench, llama-server) from the exact tree edgekv runs.

llama-cpp-python vendors llama.cpp; comparing edgekv with llama-bench or llama-perplexity is only
fair when both come from the same source.  This downloads the llama-cpp-python sdist that matches
the installed version (``pip download --no-binary``), unpacks it under ``bench/.build/`` (ignored
by git) and builds the requested targets with CMake/Ninja, exactly as
../shared/reference/llamacpp-memory.md §8 describes.  An existing build can be used instead:
``EDGEKV_LLAMA_CPP_BIN=/path/to/build/bin``.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_ROOT = HERE / ".build"


def llama_cpp_python_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def source_tree(version: str | None = None) -> Path:
    version = version or llama_cpp_python_version()
    root = BUILD_ROOT / f"llama_cpp_python-{version}"
    tree = root / "vendor" / "llama.cpp"
    if tree.is_dir():
        return tree
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    dl = BUILD_ROOT / "sdist"
    dl.mkdir(exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={version}", "-d", str(dl)])
    sdist = next(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    with tarfile.open(sdist) as tf:
        tf.extractall(BUILD_ROOT, filter="data") if sys.version_info >= (3, 12) else tf.extractall(BUILD_ROOT)  # noqa: S202
    return tree


def tool(name: str) -> Path:
    """Path of a llama.cpp tool built from the vendored tree (built on first use)."""
    env = os.environ.get("EDGEKV_LLAMA_CPP_BIN")
    if env:
        p = Path(env) / name
        if not p.is_file():
            raise SystemExit(f"EDGEKV_LLAMA_CPP_BIN={env} has no {name}")
        return p
    tree = source_tree()
    build = tree.parent.parent / "build"
    exe = build / "bin" / name
    if exe.is_file():
        return exe
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    # llama-server without its web UI: the prebuilt UI would be downloaded from the Hugging Face hub at build time,
    # and edgekv only talks to the server's HTTP API.
    _run(["cmake", "-S", str(tree), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
          "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"])
    _run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", name])
    return exe


def tool_env(exe: Path) -> dict[str, str]:
    """Environment that finds the tool's shared libraries next to it."""
    env = dict(os.environ)
    libdir = str(exe.parent)
    key = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env[key] = libdir + (os.pathsep + env[key] if env.get(key) else "")
    return env


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the text between ``begin`` and ``end`` markers in ``path`` (or append the section), atomically.
    ``section`` includes both markers."""
    from edgekv.edges.safepath import atomic_write

    text = path.read_text() if path.exists() else "# edgekv benchmarks\n"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + section.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write(path, text)
