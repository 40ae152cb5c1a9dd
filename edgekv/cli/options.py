"""Parsing of llama.cpp-style command-line values: comma lists, ranges, sizes, flash-attn modes; and the consoles,
JSON and stderr lines every command writes.

The parsers are pure functions raising :class:`UsageError` with a message that names the flag.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from edgekv.core.cachetypes import cache_type
from edgekv.errors import UsageError

if TYPE_CHECKING:
    from edgekv.prediction.api import LoadedModel

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}


def parse_count(text: str, flag: str) -> int:
    """An integer with an optional k/K (x1024) or m/M (x1048576) suffix: 4096, 32k, 1M."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        t, mult = t[:-1], 1024
    elif t.endswith("m"):
        t, mult = t[:-1], 1024 * 1024
    try:
        return int(t) * mult
    except ValueError:
        raise UsageError(f"{flag}: '{text}' is not a whole number (examples: 4096, 32k)") from None


def parse_int_list(text: str, flag: str, minimum: int | None = 1) -> list[int]:
    """llama-bench style lists: '512,4096', ranges 'first-last' with '+step' or '*mult'."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"(\w+)-(\w+)(?:([+*])(\w+))?", part)
        if m:
            first, last = parse_count(m[1], flag), parse_count(m[2], flag)
            op, step = m[3] or "+", parse_count(m[4], flag) if m[4] else 1
            if (op == "+" and step <= 0) or (op == "*" and step <= 1) or last < first:
                raise UsageError(f"{flag}: bad range '{part}'")
            v = first
            while v <= last:
                out.append(v)
                v = v + step if op == "+" else v * step
                if len(out) > 10000:
                    raise UsageError(f"{flag}: range '{part}' is too long")
        else:
            out.append(parse_count(part, flag))
    if not out:
        raise UsageError(f"{flag}: needs at least one value")
    if minimum is not None:
        for v in out:
            if v < minimum:
                raise UsageError(f"{flag}: {v} is below the minimum of {minimum}")
    return out


def parse_type_list(text: str, flag: str) -> list[str]:
    out = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            out.append(cache_type(part).name)
        except UsageError as e:
            raise UsageError(f"{flag}: {e}") from None
    if not out:
        raise UsageError(f"{flag}: needs at least one cache type")
    return out


def pair_types(ctk: list[str], ctv: list[str] | None) -> list[tuple[str, str]]:
    """-ctv follows -ctk pairwise; one -ctv value applies to every -ctk; else lengths must match."""
    if ctv is None:
        return [(k, k) for k in ctk]
    if len(ctv) == 1:
        return [(k, ctv[0]) for k in ctk]
    if len(ctk) == 1:
        return [(ctk[0], v) for v in ctv]
    if len(ctk) != len(ctv):
        raise UsageError(
            f"-ctv has {len(ctv)} values and -ctk has {len(ctk)}: give one -ctv, or one per -ctk (they pair up)")
    return list(zip(ctk, ctv))


def parse_flash_attn(text: str, flag: str = "-fa") -> str:
    t = str(text).strip().lower()
    table = {"on": "on", "1": "on", "true": "on", "enabled": "on",
             "off": "off", "0": "off", "false": "off", "disabled": "off",
             "auto": "auto", "-1": "auto"}
    if t not in table:
        raise UsageError(f"{flag}: '{text}' must be on, off or auto")
    return table[t]


def parse_fa_list(text: str, flag: str = "-fa") -> list[str]:
    return [parse_flash_attn(p, flag) for p in str(text).split(",") if p.strip()]


def parse_repack_list(text: str | None, flag: str = "--repack") -> list[bool] | None:
    """llama-bench's ``--repack <0|1>`` (a list sweeps them); None when not given (llama.cpp's default, unless the
    extra-buffer preflight found its kernels crash here)."""
    if text is None:
        return None
    out: list[bool] = []
    for p in str(text).split(","):
        p = p.strip()
        if p not in ("0", "1"):
            raise UsageError(f"{flag}: '{p}' is not 0 or 1 (0: no AMX/CPU_REPACK weight copies, llama.cpp's -nr; "
                             "1: llama.cpp's default)")
        if (p == "1") not in out:
            out.append(p == "1")
    return out


def parse_size(text: str, flag: str) -> int:
    """'16GiB', '16G' (decimal), '1.5 GiB', '800MiB', or plain bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m:
        raise UsageError(f"{flag}: '{text}' is not a size (examples: 16GiB, 800MiB, 8GB)")
    unit = m[2].lower()
    if unit not in _SIZE_UNITS:
        raise UsageError(f"{flag}: unknown unit '{m[2]}' (use B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)")
    try:
        value = float(m[1])
    except ValueError:
        raise UsageError(f"{flag}: '{text}' is not a size") from None
    n = int(value * _SIZE_UNITS[unit])
    if n <= 0:
        raise UsageError(f"{flag}: the size must be positive")
    return n


def make_console(stderr: bool = False):
    # messages on stderr never wrap (one line stays one line); tables on stdout get room when piped
    con = Console(stderr=stderr, highlight=False, soft_wrap=stderr)
    if not stderr and not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(highlight=False, soft_wrap=False, width=160)
    return con


def pick_model(arg: str | None, opt: str | None) -> str | None:
    if arg and opt and arg != opt:
        raise UsageError(f"two models given ('{arg}' and -m '{opt}'); pass one")
    return opt or arg


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def model_notes(m: LoadedModel) -> None:
    """Where the model's bytes came from (remote header fetched or cached), on stderr."""
    for n in m.ref.notes:
        sys.stderr.write(f"edgekv: {n}\n")


def warn_lines(lines: list[str], most: int = 10) -> None:
    """One line each on stderr (at most ``most``, then a count)."""
    for x in lines[:most]:
        sys.stderr.write(f"edgekv: warning: {x}\n")
    if len(lines) > most:
        sys.stderr.write(f"edgekv: warning: and {len(lines) - most} more such lines\n")
