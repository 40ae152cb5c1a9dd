"""Build llama.cpp's own tools (llama-bench, llama-perplexity, llama-batched-bench, llama-server) from the exact tree edgekv runs.

llama-cpp-python vendors llama.cpp; comparing edgekv with llama-bench or llama-perplexity is only
fair when both come from the same source.  This downloads the llama-cpp-python sdist that matches
the installed version (``pip download --no-binary``), unpacks it and builds the requested targets with
CMake/Ninja, exactly as ../shared/reference/llamacpp-memory.md §8 describes.

The tree and its build live in the user's cache (``$XDG_CACHE_HOME/edgekv-tools``, ``~/.cache`` by default, beside
and never inside edgekv's own home;
``EDGEKV_TOOLS_CACHE`` names another folder), one folder per llama-cpp-python version, CPU and compiler: like pip's
cached wheel of the same source, a build (about 7 minutes on two cores) is reused by every later checkout on the same
machine, and a build for another CPU (GGML_NATIVE: ``-march=native``) is never run on this one.  An existing build
can be used instead: ``EDGEKV_LLAMA_CPP_BIN=/path/to/build/bin``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tools_cache() -> Path:
    """The folder that holds the vendored trees and their builds (module docstring)."""
    env = os.environ.get("EDGEKV_TOOLS_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgekv-tools"


def build_key() -> str:
    """What a native build depends on besides its source: the CPU's model and flags, and the C++ compiler's
    version (a short hash of them)."""
    h = hashlib.sha256()
    try:
        info = Path("/proc/cpuinfo").read_text()
        h.update("\n".join(sorted({x for x in info.splitlines() if x.startswith(("model name", "flags"))})).encode())
    except OSError:
        import platform

        h.update(platform.processor().encode() + platform.machine().encode())
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or ""
    if cxx:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
        h.update(out.encode())
    return h.hexdigest()[:12]


def llama_cpp_python_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def source_tree(version: str | None = None) -> Path:
    version = version or llama_cpp_python_version()
    top = tools_cache() / f"{version}-{build_key()}"
    tree = top / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if tree.is_dir():
        return tree
    top.mkdir(parents=True, exist_ok=True)
    dl = top / "sdist"
    dl.mkdir(exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={version}", "-d", str(dl)])
    sdist = next(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    # unpacked beside, then renamed: a build interrupted while unpacking leaves no half tree that looks whole
    part = top / "unpacking"
    shutil.rmtree(part, ignore_errors=True)
    with tarfile.open(sdist) as tf:
        tf.extractall(part, filter="data") if sys.version_info >= (3, 12) else tf.extractall(part)  # noqa: S202
    (part / f"llama_cpp_python-{version}").rename(top / f"llama_cpp_python-{version}")
    shutil.rmtree(part, ignore_errors=True)
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
    from edgekv.sources.safepath import atomic_write

    text = path.read_text() if path.exists() else "# edgekv benchmarks\n"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + section.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write(path, text)


# -- running llama.cpp's own tools beside edgekv (bench/ harnesses and tests) ----------------------------------

def python_libdir() -> str:
    import llama_cpp

    return os.path.join(os.path.dirname(llama_cpp.__file__), "lib")


def llama_bench_env(exe, libs: str) -> dict:
    """``--libs python``: llama-bench runs on the very libllama/libggml that edgekv loads (llama-cpp-python's
    build of the same source), so the comparison measures the harness, not two builds' compiler flags.
    ``--libs own``: the libraries built beside llama-bench."""
    env = tool_env(exe)
    if libs == "python":
        key = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
        env[key] = python_libdir() + os.pathsep + env[key]
    return env


def batched_bench_argv(exe: Path, model_path: str, args, t: str, npl: int) -> list[str]:
    """llama-batched-bench on the settings of ``args`` (c, b, ub, p, n, r, fa, t): ``-npl N`` repeated ``r`` times."""
    from edgekv.calibration.preflight import preflight

    argv = [str(exe), "-m", model_path, "-c", str(args.c), "-b", str(args.b), "-ub", str(args.ub),
            "-npp", str(args.p), "-ntg", str(args.n), "-npl", ",".join([str(npl)] * args.r), "-ctk", t, "-ctv", t,
            "-fa", args.fa, "-t", str(args.t), "--output-format", "jsonl"]
    # the repacking edgekv's side runs with: llama.cpp's default, or off where its AMX kernels crash
    return argv if preflight().repack else argv + ["--no-repack"]


def parse_jsonl(stdout: str) -> list[dict]:
    """llama-batched-bench's ``--output-format jsonl`` rows (one per -npl entry); other lines are skipped."""
    return [json.loads(x) for x in stdout.splitlines() if x.startswith("{") and '"speed_tg"' in x]


def run_batched_bench(exe: Path, model_path: str, args, t: str, npl: int) -> dict:
    """One llama-batched-bench run: its prefill and decode tokens/s, one sample per repetition."""
    from edgekv.runtime.process import run_child

    res = run_child(batched_bench_argv(exe, model_path, args, t, npl), stdin_data=b"", capture_output=True,
                    env=llama_bench_env(exe, args.libs), timeout=3600)
    rows = parse_jsonl(res.stdout or "")
    if res.returncode != 0 or len(rows) != args.r:
        raise SystemExit(f"llama-batched-bench failed: {res.failure_reason()}\n{res.stderr_tail}")
    return {"pp": [r["speed_pp"] for r in rows], "tg": [r["speed_tg"] for r in rows]}
