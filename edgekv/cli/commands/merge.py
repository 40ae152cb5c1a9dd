"""``edgekv merge``: several machines' results into one file (listed in :data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

import typer

from edgekv.cli.options import make_console, print_json, warn_lines
from edgekv.output.inputs import drain_notes, merge_files
from edgekv.records.frame import device_label


def merge(
    inputs: list[str] = typer.Argument(..., metavar="RESULTS...", show_default=False,
                                       help="Results files from one or more machines."),
    output: str = typer.Option(..., "-o", "--output", show_default=False, help="Merged results file (.jsonl)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Several machines' results into one file: every row kept, each with its machine."""
    recs = merge_files(inputs, output)
    warn_lines(drain_notes())
    devices: dict[str, int] = {}
    for r in recs:
        devices[device_label(r)] = devices.get(device_label(r), 0) + 1
    by_device = dict(sorted(devices.items()))
    res = {"output": output, "inputs": list(inputs), "records": len(recs), "devices": by_device}
    if as_json:
        print_json(res)
    else:
        con = make_console()
        con.print(f"{len(recs)} records from {len(inputs)} files -> {output}")
        for d, n in by_device.items():
            con.print(f"  {n:4d}  {d}")
