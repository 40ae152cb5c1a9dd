"""What the accuracy harnesses in bench/ share: paths, common flags, where results go, the machine class a result
belongs to, the code identity each result row carries, and the Markdown helpers their tables use.

Run a harness from the repository root as a module (``python -m bench.speed_model --help``).

**Results.**  Each harness keeps its results in ``bench/results/<harness>/<machine-class>.jsonl``: one JSON object a
line, one line a configuration, each carrying

* ``machine``: the machine class (below);
* ``commit`` and ``dirty``: the edgekv code identity that measured it (``edgekv.edges.codeid.code_identity()``;
  ``dirty`` is None where unknown: rows converted from results committed before records carried a commit name the
  commit that recorded them);
* ``time_utc``: when it was measured (its record's time), else when the row was written;
* the harness's own fields (see its ``KEY``: the fields that name a configuration).

A run replaces the rows of the configurations it measured and keeps the others, so a file holds the latest
measurement of every configuration on that class of machine (git history keeps the earlier ones).  The raw
``edgekv bench`` records a harness reads its rows from stay under ``bench/.build/`` (ignored by git).

**Machine class.**  ``<arch>-<isa>-<family>-<n>cpu[-<gpu>]``, lower case, for example:

* ``x86-avx512-epyc-2cpu``: an AMD EPYC whose llama.cpp CPU backend runs AVX-512 kernels, 2 logical CPUs;
* ``x86-avx2-xeon-16cpu-h100``: an Intel Xeon running AVX2 kernels, 16 logical CPUs, beside an NVIDIA H100;
* ``arm64-neon-apple-10cpu-metal``: an Apple M-series machine with its GPU through Metal.

``isa`` is the widest instruction set llama.cpp's CPU backend reports using (``llama_print_system_info``: amx,
avx512, avx2, avx, sve, neon, else ``generic``), read from /proc/cpuinfo's flags when that report is missing;
``family`` comes from the CPU's model name (epyc, ryzen, threadripper, xeon, core, apple, graviton, ampere, else
``cpu``); ``gpu`` is the first GPU's short model name (``h100``, ``rtx4090``), or ``metal``.  Speed figures
compare only within a class; the class leaves out what it cannot see (clock, memory channels, a VM's neighbours).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BUILD = ROOT / "bench" / ".build"
MIB = 1024 * 1024

_ISA = (("amx", ("AMX_INT8", "AMX_BF16", "AMX")), ("avx512", ("AVX512",)), ("avx2", ("AVX2",)), ("avx", ("AVX",)),
        ("sve", ("SVE",)), ("neon", ("NEON",)))
_CPUINFO_ISA = (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"), ("sve", "sve"),
                ("neon", "asimd"))
_FAMILIES = ("epyc", "threadripper", "ryzen", "xeon", "core", "apple", "graviton", "ampere")
_GPU_WORDS = {"nvidia", "geforce", "tesla", "amd", "radeon", "intel", "nvidia-smi"}


def edgekv_argv() -> list[str]:
    """The command that runs this checkout's edgekv CLI (``python -m edgekv.cli``)."""
    return [sys.executable, "-m", "edgekv.cli"]


# -- machine class -------------------------------------------------------------------------------------------------

def _isa(system_info: str | None, cpu_flags: str | None) -> str:
    if system_info:
        cpu_part = system_info.split("CPU :", 1)[-1]
        on = {m.group(1) for m in re.finditer(r"([A-Z0-9_]+) = 1", cpu_part)}
        for name, keys in _ISA:
            if any(k in on for k in keys):
                return name
    flags = set((cpu_flags or "").split())
    return next((name for name, flag in _CPUINFO_ISA if flag in flags), "generic")


def _family(cpu_model: str | None) -> str:
    low = (cpu_model or "").lower()
    return next((f for f in _FAMILIES if f in low), "cpu")


def _gpu(devices: Sequence[str] | None, backends: Sequence[str] | None) -> str | None:
    """The first GPU's short name: ``NVIDIA H100 80GB HBM3`` -> h100, ``NVIDIA GeForce RTX 4090`` -> rtx4090."""
    for d in devices or []:
        words = [w for w in re.split(r"[\s_]+", d.lower()) if w and w not in _GPU_WORDS]
        if not words or (backends and "CUDA" not in backends and "Vulkan" not in backends and "ROCm" not in backends):
            continue
        if any(x in d.lower() for x in ("nvidia", "radeon", "geforce", "tesla", "instinct")):
            name = ""
            for w in words:
                name += re.sub(r"[^a-z0-9]", "", w)
                if re.search(r"\d", w):
                    break
            return name or None
    if backends and any(b in ("Metal", "MTL") for b in backends):
        return "metal"
    return None


def _arch(machine: str | None) -> str:
    m = (machine or platform.machine()).lower()
    return {"x86_64": "x86", "amd64": "x86", "aarch64": "arm64"}.get(m, m or "unknown")


def machine_class(env: dict[str, Any]) -> str:
    """The machine class of an edgekv record's ``environment`` (or of ``edgekv.edges.environment.collect()``)."""
    arch = _arch(env.get("arch") or (env.get("platform") or "").rsplit("-with", 1)[0].rsplit("-", 1)[-1] or None)
    n = env.get("cpu_count_logical") or env.get("cores_logical") or os.cpu_count() or 0
    name = f"{arch}-{_isa(env.get('system_info'), env.get('cpu_flags'))}-{_family(env.get('cpu_model'))}-{n}cpu"
    gpu = _gpu(env.get("devices"), env.get("backends"))
    return f"{name}-{gpu}" if gpu else name


def this_machine() -> str:
    """This machine's class (asks llama.cpp for its system info: imports llama_cpp)."""
    from edgekv.edges.environment import collect

    env = collect()
    env.setdefault("cpu_flags", _cpuinfo_flags())
    return machine_class(env)


def _cpuinfo_flags() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return m.group(1) if m else None


# -- results -------------------------------------------------------------------------------------------------------

def add_common(ap) -> None:
    """The flags every harness takes: where its results go, and the machine class to file them under."""
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the results folder (default bench/results): rows go to <results>/<harness>/<class>.jsonl")
    ap.add_argument("--machine", help="the machine class to file the rows under (default: this machine's, or the "
                    "class of the records read)")


def identity() -> dict[str, Any]:
    """The code identity a row carries: ``{"commit": ..., "dirty": ...}``."""
    from edgekv.edges.codeid import code_identity

    ci = code_identity()
    return {"commit": ci.commit, "dirty": ci.dirty}


def results_file(harness: str, machine: str, root: Path = RESULTS) -> Path:
    return Path(root) / harness / f"{machine}.jsonl"


def load(harness: str, root: Path = RESULTS) -> dict[str, list[dict]]:
    """Every machine class's rows of a harness: {class: [row, ...]} (classes sorted)."""
    out: dict[str, list[dict]] = {}
    for f in sorted((Path(root) / harness).glob("*.jsonl")):
        out[f.stem] = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    return out


def save(harness: str, machine: str, rows: Iterable[dict], key: Sequence[str], root: Path = RESULTS,
         stamp: dict[str, Any] | None = None) -> Path:
    """Write ``rows`` (of one machine class) into the harness's results file, replacing the rows of the same
    configurations (``key``: the fields that name one) and keeping the others.  Each new row is stamped with the
    machine class, the code identity (``stamp`` overrides it: converted rows) and the time (a row's own
    ``time_utc``, its record's, wins)."""
    path = results_file(harness, machine, root)
    old = load(harness, root).get(machine, []) if path.exists() else []
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    head = {"machine": machine, "time_utc": now, **(stamp if stamp is not None else identity())}
    new = [{**head, **{k: v for k, v in r.items() if k not in head or (k == "time_utc" and v)}} for r in rows]
    fresh = {tuple(json.dumps(r.get(k), sort_keys=True) for k in key): r for r in new}
    out = [r for r in old if tuple(json.dumps(r.get(k), sort_keys=True) for k in key) not in fresh] + new
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.part")
    tmp.write_text("".join(json.dumps(r, sort_keys=False, separators=(",", ":")) + "\n" for r in out), encoding="utf-8")
    tmp.replace(path)
    return path


# -- Markdown --------------------------------------------------------------------------------------------------------

def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` holds one letter a column (l, r, c; left where missing)."""
    marks = {"l": "---", "r": "---:", "c": ":-:"}
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(marks.get(align[i] if i < len(align) else "l") for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def identity_note(rows: Sequence[dict]) -> str:
    """``commit 3f32cba`` / ``commits 3f32cba, 9e1d0aa (1 dirty)``: the code the rows were measured with."""
    commits = sorted({(r.get("commit") or "unknown")[:7] for r in rows})
    dirty = sum(1 for r in rows if r.get("dirty"))
    return ("commit " if len(commits) == 1 else "commits ") + ", ".join(commits) + (f" ({dirty} rows dirty)"
                                                                                     if dirty else "")


def block_markers(name: str) -> tuple[str, str]:
    return f"<!-- table:{name} -->", f"<!-- /table:{name} -->"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with every ``<!-- table:NAME -->`` ... ``<!-- /table:NAME -->`` block holding ``body``."""
    a, b = block_markers(name)
    pattern = re.compile(re.escape(a) + r".*?" + re.escape(b), re.S)
    return pattern.sub(lambda _: f"{a}\n{body.strip()}\n{b}", text)


def save_run(harness: str, machine: str, out: dict[str, Any], rows: Iterable[dict], key: Sequence[str],
             root: Path = RESULTS, stamp: dict[str, Any] | None = None) -> Path:
    """``save`` for a harness that measures a run as one document (``out``: command, settings, llama-cpp-python
    version, load averages): each row carries that run's ``run`` block."""
    run = {k: out[k] for k in ("command", "llama_cpp_python", "machine_note") if out.get(k) is not None}
    run["settings"] = {k: v for k, v in (out.get("settings") or {}).items() if k not in ("out", "readme", "results")}
    if out.get("load1"):
        run["load1"] = [min(out["load1"]), max(out["load1"])]
    return save(harness, machine, [{**r, "run": run} for r in rows], key, root, stamp)


def command_line() -> str:
    """How this harness was run, as a maintainer would type it (``python -m bench.NAME ARGS``)."""
    mod = Path(sys.argv[0]).resolve()
    name = f"bench.{mod.stem}" if mod.parent == ROOT / "bench" else mod.name
    return " ".join(["python", "-m", name, *sys.argv[1:]])
