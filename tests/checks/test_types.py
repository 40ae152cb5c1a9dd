"""A type checker on edgekv/, with ratchets: mypy's errors may only shrink from a recorded baseline, and so may the
number of `Any` in the package.

mypy runs with the configuration in pyproject.toml ([tool.mypy]). Its errors are counted per file and error code
(line numbers move with every edit) against tests/data/mypy-baseline.json. A new error fails the test, naming it;
fewer errors than recorded fail it too, so the baseline goes down with the fix. Rewrite it after a fix with
`python -m tests.checks.test_types` (it runs mypy and writes the file).  Most of the baseline (464 of the first 587) is the
records' `doc(type, "description")` annotations, which mypy cannot read."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekv"
BASELINE = ROOT / "tests" / "data" / "mypy-baseline.json"
# `Any` in edgekv/ as a name in the code (annotations included; imports, strings and comments not): it may only go
# down.  When it does, lower the number here in the same change.
ANY_COUNT = 576

_ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: .*\[(?P<code>[a-z-]+)\]\s*$")


def any_count(source: str) -> int:
    """How many times `Any` (or `typing.Any`, `t.Any`) is named in a module's code."""
    return sum(1 for n in ast.walk(ast.parse(source))
               if (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any"))


def package_any_count() -> int:
    return sum(any_count(p.read_text(encoding="utf-8")) for p in sorted(PKG.rglob("*.py")))


def error_counts(output: str) -> dict[str, dict[str, int]]:
    """{file: {error code: count}} from mypy's output."""
    c = Counter((m["path"], m["code"]) for m in map(_ERROR.match, output.splitlines()) if m)
    out: dict[str, dict[str, int]] = {}
    for (path, code), n in sorted(c.items()):
        out.setdefault(path, {})[code] = n
    return out


def ratchet_problems(now: dict[str, dict[str, int]], baseline: dict[str, dict[str, int]]) -> tuple[list[str], list[str]]:
    """(new errors, fixed errors still in the baseline), one line per file and code."""
    new, fixed = [], []
    for path in sorted(set(now) | set(baseline)):
        for code in sorted(set(now.get(path, {})) | set(baseline.get(path, {}))):
            n, b = now.get(path, {}).get(code, 0), baseline.get(path, {}).get(code, 0)
            if n > b:
                new.append(f"{path}: {n - b} new [{code}] ({n}, baseline {b})")
            elif n < b:
                fixed.append(f"{path}: [{code}] {n}, baseline {b}")
    return new, fixed


def run_mypy(cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    cache = ["--cache-dir", str(cache_dir)] if cache_dir else []
    return subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", *cache],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow           # mypy on the whole package: half a minute, cached afterwards
def test_mypy_finds_no_error_beyond_the_baseline(pytestconfig):
    cache = pytestconfig.cache.mkdir("mypy") if pytestconfig.cache is not None else None
    r = run_mypy(cache)
    assert r.returncode in (0, 1) and not r.stderr.strip(), r.stdout[-2000:] + r.stderr[-2000:]
    new, fixed = ratchet_problems(error_counts(r.stdout), json.loads(BASELINE.read_text()))
    assert not new, "mypy: new errors (fix them):\n" + "\n".join(new) + "\n\n" + "\n".join(
        x for x in r.stdout.splitlines() if any(x.startswith(n.split(":")[0] + ":") for n in new))[:6000]
    assert not fixed, ("mypy: fewer errors than the baseline; lower it (python -m tests.checks.test_types):\n"
                       + "\n".join(fixed))


def test_the_mypy_ratchet_fails_on_a_new_error_and_on_a_stale_baseline():
    out = ("edgekv/a.py:3: error: Incompatible types in assignment  [assignment]\n"
           "edgekv/a.py:9:5: error: Invalid type comment or annotation  [valid-type]\n"
           "edgekv/a.py:9: note: Suggestion: use doc[...] instead of doc(...)\n")
    now = error_counts(out)
    assert now == {"edgekv/a.py": {"assignment": 1, "valid-type": 1}}
    assert ratchet_problems(now, now) == ([], [])
    new, fixed = ratchet_problems(now, {"edgekv/a.py": {"valid-type": 2}})
    assert new == ["edgekv/a.py: 1 new [assignment] (1, baseline 0)"]
    assert fixed == ["edgekv/a.py: [valid-type] 1, baseline 2"]


def test_any_only_goes_down():
    n = package_any_count()
    assert n <= ANY_COUNT, f"`Any` in edgekv/: {n}, more than the {ANY_COUNT} recorded: name the type instead"
    assert n == ANY_COUNT, f"`Any` in edgekv/: {n}, fewer than {ANY_COUNT}: lower ANY_COUNT in {__file__} to {n}"


def test_the_any_count_sees_every_spelling_and_nothing_else():
    src = ("import typing\nfrom typing import Any\nimport typing as t\n"
           "x: Any = 1\ny: typing.Any\ndef f(a: dict[str, t.Any]) -> 'Any': ...  # Any\ns = 'Any'\n")
    assert any_count(src) == 3          # the string annotation, the comment, the import and the string do not count


if __name__ == "__main__":          # python -m tests.checks.test_types: rewrite the baseline from mypy's errors now
    result = run_mypy()
    BASELINE.write_text(json.dumps(error_counts(result.stdout), indent=1, sort_keys=True) + "\n")
    print(f"{BASELINE}: {sum(sum(c.values()) for c in error_counts(result.stdout).values())} errors")
