"""``edgekv compare``: two sets of results, metric by metric, with a test each (listed in
:data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from edgekv.cli.options import print_json, warn_lines
from edgekv.output.compare import compare as compare_results
from edgekv.output.compare import render_markdown
from edgekv.output.inputs import drain_notes


def compare(
    base: str = typer.Argument(..., metavar="BASE", help="Baseline results (edgekv .jsonl or llama-bench json/jsonl)."),
    cand: Optional[str] = typer.Argument(None, metavar="CAND", show_default=False,
                                         help="Candidate results, same formats (omitted: BASE, with --baseline)."),
    threshold: Optional[str] = typer.Option(None, "--threshold", show_default=False,
                                            help="Regression thresholds over the defaults tg=5%,pp=5%,rss=3%,kv=0%,"
                                                 "kld=0.001,ppl=1% (N% relative, a bare number absolute)."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of each test."),
    force: bool = typer.Option(False, "--force", help="Compare even when the environments differ on checked keys."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    baseline: Optional[str] = typer.Option(None, "-b", "--baseline", show_default=False, metavar="COMMIT",
                                           help="Only BASE's records this edgekv commit wrote (a prefix; COMMIT-dirty: "
                                                "with local changes)."),
    candidate: Optional[str] = typer.Option(None, "-c", "--compare", show_default=False, metavar="COMMIT",
                                            help="Only CAND's records this commit wrote (default with one file: the "
                                                 "newest other commit in it)."),
) -> None:
    """Pair configurations, test every metric, print Markdown; exit 1 on a significant regression."""
    res = compare_results(base, cand, thresholds=threshold, force=force, alpha=alpha, baseline=baseline,
                          candidate=candidate)
    warn_lines(drain_notes())
    if as_json:
        print_json(res)
    else:
        sys.stdout.write(render_markdown(res))
    if res["exit_code"]:
        raise typer.Exit(res["exit_code"])
