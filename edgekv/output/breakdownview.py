"""The breakdown table llama.cpp printed at exit, with edgekv's model / context / compute beside each row."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def breakdown_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="llama.cpp's memory breakdown at exit [MiB] (printed / edgekv from the buffer lines)")
    for col in ("row", "total", "free", "model", "context", "compute", "unaccounted", "match"):
        t.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        mine = r.get("edgekv") or {}

        def pair(k: str, r: dict[str, Any] = r, mine: dict[str, Any] = mine) -> str:
            return f"{r[k]} / {mine[k]}" if k in mine else str(r[k])

        unacc = r.get("unaccounted")
        ov = r["overhead"]
        t.add_row(r["name"], str(r.get("total", "")), str(r.get("free", "")), pair("model"), pair("context"),
                  pair("compute"), "" if unacc is None else (str(unacc) if ov.get("mib") is not None else
                                                             f"{unacc} (not usable)"),
                  {True: "=", False: "≠ " + (r.get("why") or ""), None: r.get("why") or ""}[r["match"]])
    return t


def breakdown_notes(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        ov = r["overhead"]
        if r.get("kind") == "device" and ov.get("mib") is not None:
            out.append(f"{r['name']}: {ov['mib']} MiB in use beyond llama.cpp's buffers (driver context, library "
                       "workspaces and pools, and any other process on the device: the table cannot tell them apart)")
        elif r.get("kind") == "device":
            out.append(f"{r['name']}: unaccounted not usable ({ov['status']})")
    return out


def render_breakdown(con: Any, r: dict[str, Any]) -> None:
    rows = r.get("breakdown")
    if not rows:
        return
    con.print(breakdown_table(rows))
    for n in breakdown_notes(rows):
        con.print(f"  {n}")
