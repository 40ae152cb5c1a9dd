"""The breakdown table llama.cpp printed at exit, with edgekv's model / context / compute beside each row."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from edgekv.core.explainschema import BreakdownRow


def _pair(r: BreakdownRow, k: str) -> str:
    """llama.cpp's column / edgekv's, or llama.cpp's alone where no buffer line belongs to the row."""
    return f"{getattr(r, k)} / {getattr(r.edgekv, k)}" if r.edgekv is not None else str(getattr(r, k))


def breakdown_table(rows: list[BreakdownRow]) -> Table:
    t = Table(title="llama.cpp's memory breakdown at exit [MiB] (printed / edgekv from the buffer lines)")
    for col in ("row", "total", "free", "model", "context", "compute", "unaccounted", "match"):
        t.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        usable = r.overhead is not None and r.overhead.mib is not None
        unacc = "" if r.unaccounted is None else str(r.unaccounted) if usable else f"{r.unaccounted} (not usable)"
        t.add_row(r.name, "" if r.total is None else str(r.total), "" if r.free is None else str(r.free),
                  *(_pair(r, k) for k in ("model", "context", "compute")), unacc,
                  {True: "=", False: "≠ " + (r.why or ""), None: r.why or ""}[r.match])
    return t


def breakdown_notes(rows: list[BreakdownRow]) -> list[str]:
    out = []
    for r in rows:
        if r.kind != "device" or r.overhead is None:
            continue
        if r.overhead.mib is not None:
            out.append(f"{r.name}: {r.overhead.mib} MiB in use beyond llama.cpp's buffers (driver context, library "
                       "workspaces and pools, and any other process on the device: the table cannot tell them apart)")
        else:
            out.append(f"{r.name}: unaccounted not usable ({r.overhead.status})")
    return out


def render_breakdown(con: Any, rows: list[BreakdownRow]) -> None:
    if not rows:
        return
    con.print(breakdown_table(rows))
    for n in breakdown_notes(rows):
        con.print(f"  {n}")
