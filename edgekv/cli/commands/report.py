"""``edgekv report``: results files into a report folder (listed in :data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from edgekv.cli.options import make_console, print_json, warn_lines
from edgekv.errors import ResultsError, UsageError
from edgekv.output.inputs import load_many
from edgekv.output.report import write_report


def report(
    results: list[str] = typer.Argument(..., metavar="RESULTS...", show_default=False,
                                        help="edgekv results (.jsonl), llama-bench -o json/jsonl output, or "
                                             "edgekv predict --json output; several are read as one."),
    output: str = typer.Option(..., "-o", "--output", show_default=False, help="Folder to write the report into."),
    title: Optional[str] = typer.Option(None, "--title", show_default=False, help="Report title (default: the models)."),
    note: Optional[str] = typer.Option(None, "--note", show_default=False,
                                       help="Markdown text (or @FILE) placed under the title, e.g. where the data came from."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG plots (and their place in the HTML)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write README.md, results.csv, results.json, PNG plots and a self-contained report.html."""
    if note is not None and note.startswith("@"):
        try:
            note = Path(note[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"--note {note}: cannot read it ({e.strerror})") from None
    skipped: list = []
    records = load_many(results, skipped)
    if skipped:
        warn_lines([f"{x}; skipped" for x in skipped])
        if not records:
            raise ResultsError(f"no usable records: all {len(skipped)} result lines were skipped (first: {skipped[0]})")
        why = "; ".join(f"`{x}`" for x in skipped[:10]) + (f"; and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        note = (note + "\n\n" if note else "") + f"**Skipped {len(skipped)} unusable input line(s)**: {why}."
    res = write_report(records, output, title=title, plots=not no_plots, note=note)
    if as_json:
        print_json(res)
    else:
        con = make_console()
        con.print(f"{res['title']}: {res['records']} configurations -> {res['output']}/")
        for f in res["files"]:
            con.print(f"  {f}")
