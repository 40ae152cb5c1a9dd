"""Render the accuracy tables docs/ shows from the harnesses' results in bench/results/.

A docs page holds a generated table as a block::

    <!-- table:NAME -->
    ...
    <!-- /table:NAME -->

and this fills every such block in docs/*.md from ``bench/results/<harness>/<machine-class>.jsonl`` through the
harness's own ``render`` (bench/harness.py says what a row holds).  A block's text is never edited by hand: rerun

    python -m tools.render_tables            # rewrite the blocks (python tools/render_tables.py does the same)
    python -m tools.render_tables --check    # exit 1 when a committed block differs from what the data renders

tests/test_tables.py runs the check, so the docs cannot drift from the data.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:      # run by its path: run it as the module it is, from the root
    sys.exit(subprocess.call([sys.executable, "-m", "tools.render_tables", *sys.argv[1:]],
                             cwd=Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402

DOCS = H.ROOT / "docs"
# table name -> (harness whose results it shows, the module holding its render function)
TABLES: dict[str, str] = {
    "speed-model": "speed_model",
    "memory-model": "memory_model",
    "bench-vs-llama-bench": "bench_vs_llama_bench",
    "serving": "serving_accuracy",
    "quality-vs-perplexity": "quality_vs_perplexity",
    "explain-corpus": "explain_corpus",
}
_BLOCK = re.compile(r"<!-- table:([a-z0-9-]+) -->")


def _renderer(harness: str) -> Callable[[dict[str, list[dict]]], str]:
    import importlib

    return importlib.import_module(f"bench.{harness}").render


def render(name: str, results: Path = H.RESULTS) -> str:
    """One table's Markdown, from the results of its harness on every machine class."""
    harness = TABLES[name]
    by_machine = H.load(harness, results)
    if not by_machine:
        return f"*No results yet: run `python -m bench.{harness}`.*"
    return _renderer(harness)(by_machine)


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


def rendered(text: str, results: Path = H.RESULTS) -> str:
    """``text`` with every table block filled from ``results``."""
    for name in dict.fromkeys(blocks(text)):
        text = H.replace_block(text, name, render(name, results))
    return text


def pages(docs: Path = DOCS) -> list[Path]:
    return sorted(p for p in docs.rglob("*.md") if _BLOCK.search(p.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs from the data")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the folder of Markdown pages (default docs/)")
    ap.add_argument("--results", type=Path, default=H.RESULTS, help="the results folder (default bench/results)")
    a = ap.parse_args(argv)
    stale = []
    for page in pages(a.docs):
        old = page.read_text(encoding="utf-8")
        new = rendered(old, a.results)
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
