"""The documentation site builds: `mkdocs build --strict` on mkdocs.yml, so a broken link between pages, a page
missing from the nav or an anchor that does not exist fails the suite; and each page stays a page (at most 500
lines), README.md the front door (at most 250 lines, no paragraph over 150 words)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TABLES = ("speed-model", "memory-model", "bench-vs-llama-bench", "serving", "quality-vs-perplexity")


def _mkdocs() -> list[str]:
    exe = Path(sys.executable).with_name("mkdocs")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("mkdocs")
    if found is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' (or '.[docs]')", pytrace=False)
    return [found]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # not -q: mkdocs 1.6 counts no warning it does not print, so --strict -q passes a broken link
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([*_mkdocs(), "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    r = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "predict" / "index.html").exists()


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
    """The check itself can fail: a copy of the docs with one link to a page that does not exist is refused."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0
    assert "no-such-page.md" in r.stdout + r.stderr


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs: blank-line separated blocks outside fenced code, tables and HTML comments."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [x for x in block.splitlines() if x.strip() and not x.lstrip().startswith(("|", "<!--", "#"))]
        if lines:
            out.append(" ".join(lines))
    return out


def test_pages_stay_pages():
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    long = {p.name: n for p in pages if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"pages over 500 lines: {long}"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    wordy = [p[:80] for p in _paragraphs(text) if len(p.split()) > 150]
    assert not wordy, f"README paragraphs over 150 words: {wordy}"
    # no dated observations (a captured console block may carry a calibration id; prose may not)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    dated = re.findall(r"\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b|\b\d\d:\d\d UTC\b",
                       prose)
    assert not dated, f"dated observations in README prose: {dated}"


def test_every_generated_table_has_one_place():
    """Each table tools/render_tables.py renders is placed once in docs/ and README.md, as an opening and a closing
    marker."""
    text = "\n".join(p.read_text() for p in [*DOCS.glob("*.md"), DOCS.parent / "README.md"])
    for name in TABLES:
        assert text.count(f"<!-- table:{name} -->") == 1, name
        assert text.count(f"<!-- /table:{name} -->") == 1, name
