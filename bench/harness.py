"""What the accuracy harnesses in bench/ share: paths, common flags, where results go, the machine class a result
belongs to, the code identity each result row carries, and the Markdown helpers their tables use.

Run a harness from the repository root as a module (``python -m bench.speed_model --help``).

**Results.**  Each harness keeps its results in ``bench/results/<harness>/<machine-class>.jsonl``: one JSON object a
line, one line a configuration, each carrying

* ``machine``: the machine class (below);
* ``commit`` and ``dirty``: the edgekv code that measured it: the record's own ``environment.edgekv_commit`` /
  ``edgekv_dirty`` where the row comes from an ``edgekv bench`` record, else the harness's
  (``edgekv.machine.codeid.code_identity()``) when it measures.  None where unknown: a row converted from results
  committed before rows carried the measuring code has ``commit`` None, ``stored_commit`` (the commit that stored
  it: the code that measured it is no newer) and ``converted_from``;
* ``time_utc``: when it was measured (its record's time), else when the row was written;
* the harness's own fields (see its ``KEY``: the fields that name a configuration).

A run replaces the rows of the configurations it measured and keeps the others, so a file holds the latest
measurement of every configuration on that class of machine (git history keeps the earlier ones).  The raw
``edgekv bench`` records a harness reads its rows from stay under ``bench/.build/`` (ignored by git).

**Machine class.**  ``<arch>-<isa>-<family>-<n>cpu[-<backend>-<gpu>]``, lower case, for example:

* ``x86-avx2-epyc-2cpu``: an AMD EPYC whose CPU has AVX2 but not AVX-512, 2 logical CPUs;
* ``x86-amx-xeon-16cpu-cuda-h100``: an Intel Xeon with AMX, 16 logical CPUs, running llama.cpp on an NVIDIA H100
  through CUDA;
* ``arm64-neon-apple-10cpu-metal``: an Apple M-series machine with its GPU through Metal.

``isa`` is the widest instruction set the CPU has (its flags in /proc/cpuinfo: amx, avx512, avx2, avx, sve, neon, else
``generic``), never the llama.cpp build's: the same host gets the same class whichever build a harness runs.  Records
made on another machine carry no CPU flags; file their rows with ``--machine``.  ``family`` comes from the CPU's model
name (epyc, ryzen, threadripper, xeon, core, apple, graviton, ampere, else ``cpu``); the GPU part names the backend
that ran the model (cuda, rocm, vulkan) and the first GPU's short model name (``h100``, ``rtx4090``), or ``metal``.
Speed figures compare only within a class; the class leaves out what it cannot see (clock, memory channels, a VM's
neighbours).  ``RENAMED`` maps the classes rows were filed under before the ISA came from the CPU.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BUILD = ROOT / "bench" / ".build"
MIB = 1024 * 1024

_CPUINFO_ISA = (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"), ("sve", "sve"),
                ("neon", "asimd"))
_FAMILIES = ("epyc", "threadripper", "ryzen", "xeon", "core", "apple", "graviton", "ampere")
_GPU_WORDS = {"nvidia", "geforce", "tesla", "amd", "radeon", "intel", "nvidia-smi"}
_GPU_BACKENDS = {"CUDA": "cuda", "ROCm": "rocm", "HIP": "rocm", "Vulkan": "vulkan"}

# The classes rows were filed under while the ISA came from the llama.cpp build (old rows keep their files): old
# class -> (the class the same host gets now, or None where its CPU's flags were not recorded; why).
RENAMED: dict[str, tuple[str | None, str]] = {
    "x86-avx2-xeon-16cpu-h100": ("x86-amx-xeon-16cpu-cuda-h100", "ISA of the CUDA build made on another machine; "
                                 "the same host as x86-amx-xeon-16cpu-h100"),
    "x86-amx-xeon-16cpu-h100": ("x86-amx-xeon-16cpu-cuda-h100", "ISA of the host's own CPU build"),
    "x86-avx2-xeon-16cpu-h200": (None, "ISA of the CUDA build made on another machine; the host's CPU flags were "
                                 "not recorded"),
    "x86-avx512-xeon-2cpu": (None, "ISA of the host's own CPU build (AVX-512, no AMX kernels); its CPU flags were "
                             "not recorded"),
    "x86-avx512-epyc-2cpu": ("x86-avx512-epyc-2cpu", "ISA of the host's own native CPU build, which the CPU had"),
}


def edgekv_argv() -> list[str]:
    """The command that runs this checkout's edgekv CLI (``python -m edgekv.cli``)."""
    return [sys.executable, "-m", "edgekv.cli"]


# -- machine class -------------------------------------------------------------------------------------------------

def _isa(cpu_flags: str | None) -> str:
    """The widest instruction set in the CPU's flags (/proc/cpuinfo), else ``generic``."""
    flags = set((cpu_flags or "").split())
    return next((name for name, flag in _CPUINFO_ISA if flag in flags), "generic")


def _family(cpu_model: str | None) -> str:
    low = (cpu_model or "").lower()
    return next((f for f in _FAMILIES if f in low), "cpu")


def _gpu(devices: Sequence[str] | None, backends: Sequence[str] | None) -> str | None:
    """The GPU part of a class, or None for a CPU run: ``cuda-h100`` (``NVIDIA H100 80GB HBM3`` through CUDA),
    ``cuda-rtx4090``, ``metal``."""
    backend = next((_GPU_BACKENDS[b] for b in backends or [] if b in _GPU_BACKENDS), None)
    if backends and any(b in ("Metal", "MTL") for b in backends):
        return "metal"
    if backend is None:
        return None
    for d in devices or []:
        if not any(x in d.lower() for x in ("nvidia", "radeon", "geforce", "tesla", "instinct")):
            continue
        name = ""
        for w in (w for w in re.split(r"[\s_]+", d.lower()) if w and w not in _GPU_WORDS):
            name += re.sub(r"[^a-z0-9]", "", w)
            if re.search(r"\d", w):
                break
        if name:
            return f"{backend}-{name}"
    return backend


def _arch(machine: str | None) -> str:
    m = (machine or platform.machine()).lower()
    return {"x86_64": "x86", "amd64": "x86", "aarch64": "arm64"}.get(m, m or "unknown")


def machine_class(env: dict[str, Any]) -> str:
    """The machine class of an edgekv record's ``environment`` (or of ``edgekv.machine.environment.collect()``).

    The ISA comes from ``env["cpu_flags"]``; a record without them gets this machine's flags when it was made on
    this host (its ``machine_id``), else the class cannot be named: SystemExit asking for ``--machine``."""
    flags = env.get("cpu_flags")
    if flags is None:
        if env.get("machine_id") not in (None, _this_host()):
            raise SystemExit(f"bench: records from {env.get('machine_id')} carry no CPU flags, so their machine "
                             "class cannot be named here: pass --machine CLASS (bench/README.md, Results)")
        flags = _cpuinfo_flags()
    arch = _arch(env.get("arch") or (env.get("platform") or "").rsplit("-with", 1)[0].rsplit("-", 1)[-1] or None)
    n = env.get("cpu_count_logical") or env.get("cores_logical") or os.cpu_count() or 0
    name = f"{arch}-{_isa(flags)}-{_family(env.get('cpu_model'))}-{n}cpu"
    gpu = _gpu(env.get("devices"), env.get("backends"))
    return f"{name}-{gpu}" if gpu else name


def _this_host() -> str:
    return os.environ.get("EDGEKV_MACHINE_ID") or socket.gethostname()


def this_machine() -> str:
    """This machine's class (asks llama.cpp which backend and devices it runs on: imports llama_cpp)."""
    from edgekv.machine.environment import collect

    env = collect()
    env["cpu_flags"] = _cpuinfo_flags() or ""
    return machine_class(env)


def _cpuinfo_flags() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return m.group(1) if m else None


def record_identity(record: dict[str, Any]) -> dict[str, Any]:
    """The code that made an ``edgekv bench`` record: ``{"commit": ..., "dirty": ...}`` from its environment (None
    where the record predates those fields)."""
    env = record.get("environment") or {}
    return {"commit": env.get("edgekv_commit"), "dirty": env.get("edgekv_dirty")}


# -- results -------------------------------------------------------------------------------------------------------

def add_common(ap) -> None:
    """The flags every harness takes: where its results go, and the machine class to file them under."""
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the results folder (default bench/results): rows go to <results>/<harness>/<class>.jsonl")
    ap.add_argument("--machine", help="the machine class to file the rows under (default: this machine's, or the "
                    "class of the records read)")


def add_timing(ap, *, p: int, n: int, r: int) -> None:
    """The llama-bench flags the speed harnesses share (-p, -n, -r, -t: every CPU by default), their --rounds and
    --out (the whole run as one JSON document)."""
    ap.add_argument("-p", type=int, default=p)
    ap.add_argument("-n", type=int, default=n)
    ap.add_argument("-r", type=int, default=r)
    ap.add_argument("-t", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", help="also write the whole run as one JSON document here")


def identity() -> dict[str, Any]:
    """The code identity a row carries: ``{"commit": ..., "dirty": ...}``."""
    from edgekv.machine.codeid import code_identity

    ci = code_identity()
    return {"commit": ci.commit, "dirty": ci.dirty}


def records_dir(base: Path, machine: str) -> Path:
    """Where a harness keeps (and resumes) the raw records of this machine class and this code:
    ``base/<class>/<commit>`` (``-dirty`` for a changed tree).  A run resumes only its own code's records, so a
    refresh after a commit measures every configuration again; earlier code's records stay beside it."""
    ci = identity()
    return Path(base) / machine / f"{(ci['commit'] or 'unknown')[:12]}{'-dirty' if ci['dirty'] else ''}"


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
    machine class, the code identity and the time; a row's own ``commit``/``dirty`` (its record's: the code that
    measured it) and ``time_utc`` win over this process's, and ``stamp`` overrides the code identity."""
    path = results_file(harness, machine, root)
    old = load(harness, root).get(machine, []) if path.exists() else []
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    head = {"machine": machine, "time_utc": now, **(stamp if stamp is not None else identity())}
    own = ("commit", "dirty") if stamp is None else ()
    new = [{**head, **{k: v for k, v in r.items() if k not in head or k in own or (k == "time_utc" and v)}}
           for r in rows]
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


def code_label(row: dict) -> str:
    """The code a row was measured with: ``3f32cba``, ``3f32cba-dirty``, ``≤ 3f32cba`` (a converted row: measured
    with code no newer than the commit that stored it), ``unknown``."""
    if row.get("commit"):
        return row["commit"][:7] + ("-dirty" if row.get("dirty") else "")
    if row.get("stored_commit"):
        return "≤ " + row["stored_commit"][:7]
    return "unknown"


def identity_note(rows: Sequence[dict]) -> str:
    """``3f32cba`` / ``3f32cba, ≤ 9e1d0aa`` / ``3f32cba-dirty``: the code the rows were measured with."""
    return ", ".join(sorted({code_label(r) for r in rows}))


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


def geomean(xs: Sequence[float]) -> float:
    """The geometric mean of positive ratios."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def finish_run(harness: str, args: Any, rows: list[dict], load1: list[float], summary: dict[str, Any],
               markdown: Callable[[dict[str, Any]], str], keyed: Iterable[dict], key: Sequence[str]) -> None:
    """The end of a speed harness's run (flags of :func:`add_timing` and :func:`add_common`): the run as one document
    (machine, command, settings, llama-cpp-python version, load averages, rows, summary) written to --out, printed
    as ``markdown(out)``, and its rows (``keyed``) saved under the machine class."""
    from edgekv.machine.environment import cpu_model
    from tools.llama_tools import llama_cpp_python_version

    out = {"machine": {"cpu": cpu_model(), "cores_logical": os.cpu_count(), "os": platform.platform()},
           "command": command_line(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "llama_cpp_python": llama_cpp_python_version(), "load1": load1, "rows": rows, "summary": summary}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(markdown(out))
    print(f"written: {save_run(harness, args.machine or this_machine(), out, keyed, key, args.results)}")


def command_line() -> str:
    """How this harness was run, as a maintainer would type it (``python -m bench.NAME ARGS``)."""
    mod = Path(sys.argv[0]).resolve()
    name = f"bench.{mod.stem}" if mod.parent == ROOT / "bench" else mod.name
    return " ".join(["python", "-m", name, *sys.argv[1:]])
