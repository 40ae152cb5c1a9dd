"""llama.cpp's own memory breakdown table, read back and put beside edgekv's figures.

Pure.  Recent builds print, at exit (``llama_memory_breakdown_print``, llama-server on shutdown,
llama-cli/llama-completion after the perf print) and during every ``-fit`` dry run
(``common_memory_breakdown_print``, which recent builds also use at shutdown), one row per device and one for the
host, in whole MiB (floor)::

    | memory breakdown [MiB] | total   free     self   model   context   compute    unaccounted |
    |   - CUDA0 (<gpu name>) | 24077 =  945 + (19187 = 17904 +     384 +     898) +        3945 |
    |   - Host               |                 58271 = 58259 +       0 +      12                |

``total = free + (self = model + context + compute) + unaccounted`` (common/fit.cpp, the row templates; "context"
is the KV and recurrent-state buffers only, llama_context::memory_breakdown).  ``free`` is what the backend reports
when the table is printed, so ``unaccounted`` is everything on the device that is not llama.cpp's buffers: the
driver context, cuBLAS workspaces, ggml's CUDA pool, *and other processes* (a desktop).  Two cases make it
meaningless, and are marked so:

* a fit dry run (printed before the model's buffers exist) allocates nothing, so free still holds the memory ``self``
  projects: unaccounted comes out negative (printed as such by recent builds);
* a backend whose free memory does not move with allocations (SYCL without sysman, some drivers) gives a negative
  unaccounted too, which older builds print as an unsigned wrap (``17592186030401`` = 2^44 - 14015 MiB).
"""

from __future__ import annotations

import re
from typing import Any

WRAP = 2**44            # 2^64 bytes in MiB: a negative size_t difference printed unsigned
_ROW = re.compile(r"(?P<fn>llama|common)_memory_breakdown_print:\s*\|\s*-\s+(?P<name>.+?)\s*\|\s*(?P<body>[-\d=+()\s]+)\|")
_DEVICE = re.compile(r"^(?P<total>\d+)\s*=\s*(?P<free>\d+)\s*\+\s*\(\s*(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*"
                     r"(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*\)\s*(?:\+\s*(?P<unacc>-?\d+))?\s*$")
_HOST = re.compile(r"^(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*$")
_HEADER = re.compile(r"(llama|common)_memory_breakdown_print:\s*\|\s*[^|]*\[MiB\]")


def _strip(line: str) -> str:
    """The line from its function name on (log prefixes, timestamps and colours are already gone or ignored)."""
    i = line.find("_memory_breakdown_print:")
    if i < 0:
        return ""
    j = max(line.rfind("llama", 0, i), line.rfind("common", 0, i))
    return line[j:] if j >= 0 else line[i:]


def parse_row(line: str) -> dict[str, Any] | None:
    """One table row as a dict (``kind``: device / host / extra), or None for any other line."""
    m = _ROW.search(_strip(line))
    if not m:
        return None
    name, body = m.group("name"), " ".join(m.group("body").split())
    row: dict[str, Any] = {"name": name, "source": "exit" if m.group("fn") == "llama" else "fit dry run"}
    d = _DEVICE.match(body)
    if d:
        vals = {k: int(v) for k, v in d.groupdict().items() if v is not None}
        unacc = vals.pop("unacc", None)
        row.update(kind="device", device=name.split(" ", 1)[0], **vals)
        if row["free"] >= WRAP // 2:                # an RPC server that reports no free memory: a negative wrapped
            row["free"] -= WRAP
            row["free_wrapped"] = True
        if unacc is not None:
            row["unaccounted"] = unacc - WRAP if unacc >= WRAP // 2 else unacc
            row["wrapped"] = unacc >= WRAP // 2
        return row
    h = _HOST.match(body)
    if h:
        row.update(kind="host" if name == "Host" else "extra", **{k: int(v) for k, v in h.groupdict().items()})
        return row
    return None


def parse_tables(lines: list[str]) -> list[list[dict[str, Any]]]:
    """Every breakdown table in the log, in order (a header line starts a new one).  A table printed before the
    model's buffers were allocated (the first ``model buffer size`` line) is a fit dry run whatever its function
    name: recent builds print the shutdown table through ``common_memory_breakdown_print`` as well."""
    tables: list[list[dict[str, Any]]] = []
    loaded = False
    for line in lines:
        if not loaded and "model buffer size" in line:
            loaded = True
        if "_memory_breakdown_print:" not in line:
            continue
        if _HEADER.search(line):
            tables.append([])
            continue
        row = parse_row(line)
        if row is None:
            continue
        row["source"] = "exit" if loaded or row["source"] == "exit" else "fit dry run"
        if not tables or (tables[-1] and tables[-1][-1]["source"] != row["source"]):
            tables.append([])
        tables[-1].append(row)
    return [t for t in tables if t]


def last_exit_table(lines: list[str]) -> list[dict[str, Any]]:
    """The last table printed at exit (the one measured after loading), or []."""
    exits = [t for t in parse_tables(lines) if t[0]["source"] == "exit"]
    return exits[-1] if exits else []


def overhead(row: dict[str, Any]) -> dict[str, Any]:
    """What a device row says beyond llama.cpp's buffers, and whether it can be read that way."""
    if row.get("kind") != "device":
        return {"status": "host row: no device total"}
    if row["source"] != "exit":
        return {"status": "fit dry run: nothing was allocated, unaccounted is a projection"}
    if row.get("free_wrapped"):
        return {"status": "the backend reported no usable free memory (the free column wrapped)", "mib": None}
    if "unaccounted" not in row:
        return {"status": "no unaccounted column (an older table)", "mib": row["total"] - row["free"] - row["self"]}
    if row["unaccounted"] < 0:
        return {"status": "negative: the backend's free memory did not follow the allocations", "mib": None}
    return {"status": "measured", "mib": row["unaccounted"]}


def _floor(mib: float) -> int:
    return int(mib + 1e-9)


def edgekv_columns(buffers: list[dict[str, Any]], row: dict[str, Any], extra_rows: set[str]) -> dict[str, int] | None:
    """edgekv's model / context / compute for a row, summed from the buffer lines explain read (``buffers``: explain's
    groups), floored to MiB as llama.cpp prints them; None when no buffer belongs to the row."""
    if row["kind"] == "device":
        groups = [g for g in buffers if g["device"] == row["device"]]
        bufs = [b for g in groups for b in g["buffers"]]
    elif row["kind"] == "host":
        bufs = [b for g in buffers if g["device"] == "host" for b in g["buffers"]
                if not b["buffer"].startswith(tuple(extra_rows))]
    else:
        bufs = [b for g in buffers if g["device"] == "host" for b in g["buffers"] if b["buffer"] == row["name"]]
    if not bufs:
        return None
    sums = {"model": 0.0, "context": 0.0, "compute": 0.0}
    for b in bufs:
        col = {"model": "model", "KV": "context", "recurrent state": "context", "compute": "compute"}.get(b["kind"])
        if col:
            sums[col] += b["mib"]
    return {k: _floor(v) for k, v in sums.items()}


def check_table(table: list[dict[str, Any]], buffers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with edgekv's columns beside llama.cpp's: ``match`` when every column agrees within 1 MiB (llama.cpp
    floors the sum of the bytes, the buffer lines round each buffer to 0.01 MiB)."""
    extra = {r["name"] for r in table if r["kind"] == "extra"}
    out = []
    for row in table:
        mine = edgekv_columns(buffers, row, extra)
        r = {**row, "overhead": overhead(row)}
        if mine is None:
            r.update(edgekv=None, match=None, why="no buffer line in the log for this row")
        else:
            diff = {k: row[k] - mine[k] for k in mine}
            r.update(edgekv=mine, match=all(abs(v) <= 1 for v in diff.values()),
                     why=None if all(abs(v) <= 1 for v in diff.values()) else
                     ", ".join(f"{k} {row[k]} vs {mine[k]} MiB" for k, v in diff.items() if abs(v) > 1))
        out.append(r)
    return out
