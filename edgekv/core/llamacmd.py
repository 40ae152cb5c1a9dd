"""The llama.cpp command line a prediction or a measurement assumes, so a user can reproduce it with llama.cpp alone.

The flags are llama-cli's and llama-server's (common/arg.cpp): ``-m``, ``-c``, ``-ctk``, ``-ctv``, ``-fa``, ``-b``,
``-ub``, ``-np``, ``--kv-unified``, ``--swa-full``, ``-t``, ``-ngl``, ``-lm none`` (the weights read into memory,
``--no-mmap`` in older builds) and ``-nr`` (no extra buffer types: llama-bench's ``--repack 0``).  Pure.
"""

from __future__ import annotations

import shlex
from typing import Any


def llama_cpp_args(settings: dict[str, Any], model_path: str | None) -> list[str]:
    """llama-cli / llama-server arguments for one configuration's settings (edgekv's record names; a missing or
    None setting is left to llama.cpp's default)."""
    s = settings
    out: list[str] = ["-m", str(model_path)] if model_path else []
    for flag, key in (("-c", "n_ctx"), ("-ctk", "type_k"), ("-ctv", "type_v"), ("-fa", "flash_attn"), ("-b", "n_batch"),
                      ("-ub", "n_ubatch"), ("-np", "n_seq_max"), ("-t", "n_threads"), ("-ngl", "n_gpu_layers")):
        v = s.get(key)
        if v is None or (key == "n_threads" and not v):
            continue
        if key == "n_gpu_layers" and v == -1:
            v = 999                      # edgekv's "all layers"; llama.cpp takes a count
        out += [flag, str(v)]
    if s.get("kv_unified"):
        out.append("--kv-unified")
    if s.get("swa_full"):
        out.append("--swa-full")
    if s.get("no_mmap"):
        out += ["-lm", "none"]
    if s.get("repack") is False:
        out.append("-nr")
    return out


def shell_line(binary: str, args: list[str]) -> str:
    """One copyable line (arguments with spaces quoted)."""
    return " ".join([binary, *(shlex.quote(a) for a in args)])
