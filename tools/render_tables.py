"""Render the accuracy tables docs/ shows from the harnesses' results in bench/results/.

A docs page holds a generated table as a block::

    <!-- table:NAME -->
    ...
    <!-- /table:NAME -->

and this fills every such block in docs/*.md from ``bench/results/<harness>/<machine-class>.jsonl`` through the
harness's own ``render`` (bench/harness.py says what a row holds).  A block's text is never edited by hand: rerun

    python -m tools.render_tables            # rewrite the blocks (python tools/render_tables.py does the same)
    python -m tools.render_tables --check    # exit 1 when a committed block differs from what the data renders

Under each table a line says, per machine class, when its rows were measured, with which edgekv commit, and how
many commits to ``edgekv/`` came after that commit up to the commit the table was rendered at (recorded in the block
as ``<!-- rendered-at: SHA -->``; the check recounts up to that same recorded commit, so it stays true while later
commits land and a re-render moves it).  Before writing, every row's derived fields are checked against its raw ones
(a percentage against its measured and predicted values, a mean against its samples): a row edited by hand fails.

tests/checks/test_tables.py runs the check, so the docs cannot drift from the data.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

if __name__ == "__main__" and not __package__:      # run by its path: run it as the module it is, from the root
    sys.exit(subprocess.call([sys.executable, "-m", "tools.render_tables", *sys.argv[1:]],
                             cwd=Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402

DOCS = H.ROOT / "docs"
README = H.ROOT / "README.md"
# table name -> the harness whose results it shows (its module's ``render``; ``harness:function`` names another)
TABLES: dict[str, str] = {
    "speed-model": "speed_model",
    "memory-model": "memory_model",
    "bench-vs-llama-bench": "bench_vs_llama_bench",
    "serving": "serving_accuracy",
    "parallel": "parallel_vs_batched_bench",
    "quality-vs-perplexity": "quality_vs_perplexity",
    "quality-summary": "quality_vs_perplexity:render_summary",
    "explain-corpus": "explain_corpus",
}
_BLOCK = re.compile(r"<!-- table:([a-z0-9-]+) -->")
_RENDERED_AT = re.compile(r"<!-- rendered-at: ([0-9a-f]{40}) -->")
_HEX = re.compile(r"[0-9a-f]{7,40}")


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(H.ROOT), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def head() -> str:
    """The commit tables are rendered at now (HEAD); SystemExit outside a git checkout."""
    sha = _git("rev-parse", "HEAD")
    if not sha or not _HEX.fullmatch(sha):
        raise SystemExit("render_tables: not a git checkout: the tables' commit counts need the repository's history")
    return sha


def history() -> bool:
    """Whether this checkout has the history the commit counts need (a git checkout, not a shallow clone)."""
    return _git("rev-parse", "--is-shallow-repository") == "false"


@functools.cache
def commits_after(commit: str, upto: str) -> int | None:
    """How many commits touching edgekv/ are in ``upto``'s history and not in ``commit``'s; None when git does not
    know either (a shallow clone, a commit that was never pushed)."""
    if not _HEX.fullmatch(commit or ""):
        return None
    n = _git("rev-list", "--count", f"{commit}..{upto}", "--", "edgekv/")
    return int(n) if n and n.isdigit() else None


def provenance(by_machine: dict[str, list[dict]], upto: str) -> str:
    """One line a machine class: when its rows were measured, with which code, and how many commits to edgekv/ came
    after that code up to ``upto``."""
    parts = []
    for m, rows in by_machine.items():
        days = sorted(r["time_utc"][:10] for r in rows if r.get("time_utc"))
        when = days[0] if days and days[0] == days[-1] else f"{days[0]} to {days[-1]}" if days else "at an unknown time"
        ages = [commits_after(r.get("commit") or r.get("stored_commit") or "", upto) for r in rows]
        known = sorted(a for a in ages if a is not None)
        bound = len(known) < len(ages) or any(not r.get("commit") for r in rows)     # ≤ a commit: at least
        age = (("at least " if bound else "") + (f"{known[0]}" if known[0] == known[-1]
               else f"{known[0]} to {known[-1]}")) if known else "an unknown number of"
        conv = sum(1 for r in rows if r.get("converted_from") and not r.get("commit"))
        note = (f"; {conv} of {len(rows)} rows converted from older results, measured with code no newer than the "
                "commit that stored them (≤)") if conv else ""
        old = H.RENAMED.get(m) if H.RENAMED.get(m, (m,))[0] != m else None
        name = f"`{m}`" + (f" (named before the class took its ISA from the CPU: {old[1]}; "
                           + (f"now `{old[0]}`)" if old[0] else "its CPU's ISA is unknown)") if old else "")
        parts.append(f"- {name}: {len(rows)} rows measured {when} with edgekv {H.identity_note(rows)}; {age} commits "
                     f"to `edgekv/` came after that code{note}.")
    return (f"Measured with (commits counted up to `{upto[:7]}`, the commit this table was rendered at):\n\n"
            + "\n".join(parts) + f"\n\n<!-- rendered-at: {upto} -->")


def _renderer(name: str) -> Callable[[dict[str, list[dict]]], str]:
    import importlib

    harness, _, fn = name.partition(":")
    return getattr(importlib.import_module(f"bench.{harness}"), fn or "render")


def render(name: str, results: Path = H.RESULTS, upto: str | None = None) -> str:
    """One table's Markdown, from the results of its harness on every machine class, with the line saying what code
    measured them (commits counted up to ``upto``, default HEAD)."""
    harness = TABLES[name].partition(":")[0]
    by_machine = H.load(harness, results)
    if not by_machine:
        return f"*No results yet: run `python -m bench.{harness}`.*"
    bad = list(inconsistencies(by_machine))
    if bad:
        raise SystemExit(f"render_tables: bench/results/{harness}: derived fields disagree with the raw ones: "
                         + "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))
    return _renderer(TABLES[name])(by_machine) + "\n\n" + provenance(by_machine, upto or head())


def _near(a: float | None, b: float | None, rel: float = 1e-6) -> bool:
    return a is None or b is None or math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def _pair_checks(r: dict) -> Iterator[tuple[str, float | None, float | None]]:
    """(field, stored, recomputed from the raw fields) for every derived field a row carries."""
    if "measured" in r and "predicted" in r:
        m, p = r["measured"], r["predicted"]
        if "pct" in r:
            yield "pct", r["pct"], 100.0 * (m - p) / p
        if "diff" in r:
            yield "diff", r["diff"], m - p
    if "server_peak" in r:
        yield "residual_pct", r.get("residual_pct"), 100.0 * (r["server_peak"] - r["server_predicted"]) / r[
            "server_predicted"]
        yield "residual_mib", r.get("residual_mib"), (r["server_peak"] - r["server_predicted"]) / H.MIB
        yield "tg_ratio", r.get("tg_ratio"), r["server_tg"] / r["inproc_tg"]
    for test in ("pp", "tg"):
        side = r.get(test)
        if not isinstance(side, dict) or "ratio" not in side:
            continue
        names = [k[:-5] for k in side if k.endswith("_mean")]
        for n in names:
            if isinstance(side.get(n), list) and side[n]:
                yield f"{test}.{n}_mean", side[f"{n}_mean"], statistics.fmean(side[n])
        if "edgekv_mean" in side and len(names) == 2:
            other = next(n for n in names if n != "edgekv")
            yield f"{test}.ratio", side["ratio"], side["edgekv_mean"] / side[f"{other}_mean"]


def inconsistencies(by_machine: dict[str, list[dict]]) -> Iterator[str]:
    """Rows whose derived fields are not what their raw measured and predicted fields give."""
    for m, rows in by_machine.items():
        for i, r in enumerate(rows, 1):
            for field, stored, raw in _pair_checks(r):
                if not _near(stored, raw):
                    yield f"{m}.jsonl line {i}: {field} is {stored!r}, its raw fields give {raw!r}"


def blocks(text: str) -> list[str]:
    """The table names ``text`` has blocks for (an unknown name is an error: a typo would never be filled)."""
    names = _BLOCK.findall(text)
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        raise SystemExit(f"render_tables: unknown table name(s) {', '.join(unknown)}; known: {', '.join(TABLES)}")
    for n in names:
        a, b = H.block_markers(n)
        if text.count(a) != text.count(b):
            raise SystemExit(f"render_tables: {a} without its {b} (or the reverse)")
    return names


def rendered(text: str, results: Path = H.RESULTS, keep_commit: bool = False) -> str:
    """``text`` with every table block filled from ``results``; ``keep_commit``: count commits up to the commit each
    block records it was rendered at (what ``--check`` compares), else up to HEAD."""
    for name in dict.fromkeys(blocks(text)):
        upto = None
        if keep_commit:
            a, b = H.block_markers(name)
            m = _RENDERED_AT.search(text.split(a, 1)[1].split(b, 1)[0])
            upto = m.group(1) if m else None
            if upto and _git("cat-file", "-e", f"{upto}^{{commit}}") is None:
                raise SystemExit(f"render_tables: table {name} was rendered at {upto[:7]}, which this repository "
                                 "does not have: run python -m tools.render_tables")
        text = H.replace_block(text, name, render(name, results, upto))
    return text


def pages(docs: Path = DOCS) -> list[Path]:
    """The pages holding a table block: docs/*.md, and README.md beside the default docs folder."""
    found = [*sorted(docs.rglob("*.md")), *([README] if docs == DOCS else [])]
    return [p for p in found if _BLOCK.search(p.read_text(encoding="utf-8"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs from the data")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the folder of Markdown pages (default docs/)")
    ap.add_argument("--results", type=Path, default=H.RESULTS, help="the results folder (default bench/results)")
    a = ap.parse_args(argv)
    if a.check and not history():
        print("render_tables: the tables count commits to edgekv/, which needs the repository's history: run it in a "
              "full clone (git fetch --unshallow)", file=sys.stderr)
        return 1
    stale = []
    for page in pages(a.docs):
        old = page.read_text(encoding="utf-8")
        new = rendered(old, a.results, keep_commit=a.check)
        if new == old:
            continue
        stale.append(page)
        if not a.check:
            page.write_text(new, encoding="utf-8")
            print(f"written: {page}")
    if a.check and stale:
        print("tables differ from bench/results (run python -m tools.render_tables): "
              + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
