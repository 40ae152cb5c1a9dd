"""Metadata-only GGUF headers at a real model's shape, with the tensor-info table llama.cpp wants.

A header with no tensor table loads in edgekv's formula but not in llama.cpp (it checks every tensor its
architecture declares, even in a dry run).  So the reports that show llama.cpp's own dry-run figures beside
the formula need the full table.  Rather than hand-writing hundreds of tensor shapes per architecture, this
reuses the tiny-GGUF discovery of ``tests/tiny/discover.py`` at full size: it starts from the published
configuration values (metadata), loads the header in llama.cpp with ``no_alloc`` in a loop, and adds each
tensor llama.cpp asks for with the shape it expects.  Tensor types are then chosen by the caller
(``retype``): the types decide the weights figure only, never a cache.

The header is what gets committed (a few hundred KB: no tensor data, no tokenizer); ``edgekv predict
--engine`` turns it into a sparse stand-in of the full size for llama.cpp (``edgekv.runtime.engine.loadable_path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def discover_tensors(family: str, arch: str, metadata: list[list[Any]], timeout: float = 1800.0) -> dict[str, Any]:
    """Run the discovery child (``tests.tiny.discover --child``) from ``metadata``; return the loadable spec.

    ``family`` is any tiny family of the same architecture (it only picks the context checks to run).
    """
    spec = {"arch": arch, "note": "real shape", "memory": "", "metadata": metadata,
            "tensors": _seed_tensors(family, metadata)}
    with tempfile.TemporaryDirectory(prefix="edgekv-shape-") as td:
        seed = os.path.join(td, "seed.json")
        prog = os.path.join(td, "progress.json")
        with open(seed, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        p = subprocess.run([sys.executable, "-m", "tests.tiny.discover", "--child", family, prog, seed],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        last = json.loads(Path(prog).read_text()) if os.path.exists(prog) else None
        if p.returncode != 0 or not last or last.get("step") != "done":
            tail = [x for x in (p.stdout + p.stderr).splitlines() if x.strip()][-5:]
            raise SystemExit(f"{family}: llama.cpp would not load the header: {tail}")
        return last["spec"]


def _seed_tensors(family: str, metadata: list[list[Any]]) -> list[list[Any]]:
    """The tiny family's tensor names, every per-layer one repeated for every block, shapes left for llama.cpp to
    correct (some loaders accept a file with no layer tensors at all, so an empty table is not a safe start).
    Tensors a layer does not use are dropped by the discovery when llama.cpp reports them."""
    import re

    specs = json.loads((ROOT / "tests" / "tiny" / "specs.json").read_text())["families"]
    n_layer = next(int(v) for k, _t, v in metadata if k.endswith(".block_count"))
    out: list[list[Any]] = []
    per_layer: list[str] = []
    for name, _ne, _ty in specs[family]["tensors"]:
        m = re.match(r"blk\.(\d+)\.(.+)", name)
        if m is None:
            out.append([name, [1], "f32"])
        elif m[2] not in per_layer:
            per_layer.append(m[2])
    out += [[f"blk.{il}.{suffix}", [1], "f32"] for il in range(n_layer) for suffix in per_layer]
    return out


def retype(spec: dict[str, Any], pick: Callable[[str, list[int]], str | None]) -> dict[str, Any]:
    """Give each tensor the type ``pick(name, ne)`` returns (None keeps f32)."""
    for t in spec["tensors"]:
        new = pick(t[0], t[1])
        if new:
            t[2] = new
    return spec


def write_header(path: Path, spec: dict[str, Any]) -> None:
    """Write the header only (metadata + tensor table; no data): a few hundred KB for any model size."""
    from tools.gguf_writer import write_gguf

    write_gguf(path, spec["arch"], spec["metadata"], spec["tensors"], header_only=True)


def kv(arch: str, values: dict[str, Any]) -> list[list[Any]]:
    """Metadata entries from {key suffix: value}; ints are uint32, floats float32, bools bool, strings string,
    lists of bools array[bool], lists of ints array[int32]; a (type, value) tuple sets the type."""
    out = [["general.architecture", "string", arch]]
    for k, v in values.items():
        key = k if k.startswith(("general.", "tokenizer.")) else f"{arch}.{k}"
        if isinstance(v, tuple):
            t, v = v
        elif isinstance(v, bool):
            t = "bool"
        elif isinstance(v, int):
            t = "uint32"
        elif isinstance(v, float):
            t = "float32"
        elif isinstance(v, str):
            t = "string"
        elif isinstance(v, list) and v and isinstance(v[0], bool):
            t = "array[bool]"
        elif isinstance(v, list):
            t = "array[int32]"
        else:
            raise TypeError(f"{k}: {v!r}")
        out.append([key, t, v])
    return out
