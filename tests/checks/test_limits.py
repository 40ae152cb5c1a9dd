"""Limits that keep the package's shape, beside the function-length check of tests/checks/test_layers.py.

- No module in edgekv/ has more than MAX_MODULE_LINES lines: a module does one job.
- edgekv/ names no date, no particular machine and no bench/README: code and comments stay true on any machine
  and any day; the measurement behind a constant, and the machine it was taken on, are written in docs/.
- The fast tier (``-m "not slow"``) starts no llama.cpp child: tests/conftest.py's guard fails such a test, and the
  tests below check that the guard can fail.

Read from the source (no import of edgekv needed), like tests/checks/test_layers.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekv"

MAX_MODULE_LINES = 600

# The text files of the package: its modules and the data it ships (the results schema).  Not edgekv/models.toml: a
# link to the model registry at the repository root, whose provenance notes cite when a value was read (data, with
# its source and date, not a comment on code).
TEXT_SUFFIXES = {".py", ".json", ".toml"}

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)(?:[a-z]{0,6})"
# (what it finds, pattern); the patterns are case-sensitive unless they say otherwise
DATE_PATTERNS = [
    ("an ISO date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    ("a day and month", re.compile(rf"\b[0-3]?\d {_MONTH}\b")),
    ("a month and day", re.compile(rf"\b{_MONTH} [0-3]?\d(?:st|nd|rd|th)?\b(?! ?(?:GiB|MiB|GB|MB|%|x))")),
    ("a time of day", re.compile(r"\b[0-2]?\d:[0-5]\d(?::[0-5]\d)? ?(?:UTC|GMT|CET|CEST|PST|PDT|EST|EDT)\b")),
    ("a year", re.compile(r"(?<![\w.-])20[2-3]\d(?![\w.-])")),
]
# Particular machines: a CPU or GPU model, a cloud instance, a "2-vCPU VM".  A CPU feature (AMX, AVX2, AVX-512) or a
# backend (CUDA, Metal, Vulkan) is not a machine and is fine.
MACHINE_PATTERNS = [
    ("a CPU model", re.compile(r"\b(?:EPYC|Xeons?|Ryzen|Threadripper|Graviton\d?|Neoverse|Ampere Altra)\b")),
    ("a CPU generation", re.compile(r"\b(?:Sapphire|Emerald|Granite|Diamond) Rapids\b|\b(?:Ice|Cascade|Cooper|Alder|"
                                    r"Raptor|Meteor|Lunar|Arrow) Lake\b|\bSkylake\b|\b(?:Genoa|Milan|Rome|Turin)\b")),
    ("a Zen core", re.compile(r"\bZen ?[1-6]\b")),
    ("a GPU model", re.compile(r"\b(?:[AH]100|H200|H20|[AH]800|A10G?|A[34]0|B[12]00|L40S?|G[HB]200|MI[123]\d\dX?|"
                               r"RTX ?\d{3,4}|GTX ?\d{3,4}|[VP]100|T4)\b")),
    ("an Apple chip", re.compile(r"\bApple M[1-9]\b|\bM[1-9] (?:Pro|Max|Ultra)\b")),
    ("a virtual machine", re.compile(r"\b\d+-?vCPUs?\b|\bVMs?\b")),
]
# The bench scripts' README: the package points to docs/, never to the laboratory notes.  Wrapped comments split
# the path over two lines ("bench/" at the end of one, "# README.md" on the next).
BENCH_README = re.compile(r"bench/(?:\s|#)*README")


def _text_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file() and not p.is_symlink())


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _hits(patterns: list[tuple[str, re.Pattern[str]]], text: str) -> list[tuple[int, str, str]]:
    """(line, what, the matched text) for every match of ``patterns`` in ``text``."""
    return [(_line_of(text, m.start()), what, m.group(0)) for what, pat in patterns for m in pat.finditer(text)]


def _scan(patterns: list[tuple[str, re.Pattern[str]]]) -> list[str]:
    out = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8")
        out += [f"{path.relative_to(ROOT)}:{line}: {what} ({found!r})" for line, what, found in _hits(patterns, text)]
    return out


def test_no_module_over_600_lines():
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not big, (f"modules over {MAX_MODULE_LINES} lines; split each along one of its jobs (keep its public names "
                     "importable where they were):\n" + "\n".join(big))


def test_the_package_names_no_date():
    bad = _scan(DATE_PATTERNS)
    assert not bad, ("edgekv/ names a date; keep code and comments timeless (the measurement and when it was taken "
                     "belong in docs/):\n" + "\n".join(bad))


def test_the_package_names_no_particular_machine():
    bad = _scan(MACHINE_PATTERNS)
    assert not bad, ("edgekv/ names a particular machine; say what property of a machine the code depends on (its "
                     "core count, a CPU feature, a backend) and put the machine it was measured on in docs/:\n"
                     + "\n".join(bad))


def test_the_package_does_not_point_to_the_bench_readme():
    bad = [f"{p.relative_to(ROOT)}:{_line_of(t, m.start())}: {m.group(0)!r}"
           for p in _text_files() for t in [p.read_text(encoding="utf-8")] for m in BENCH_README.finditer(t)]
    assert not bad, "edgekv/ points to bench/README.md; point to the docs/ page that explains it:\n" + "\n".join(bad)


@pytest.mark.parametrize("text", [
    "# measured 27 Nov on the quiet machine", "# (2026-11-29)", "# at 09:06 UTC", "# Nov 27th, quiet", "# in 2026",
    "# a 2-vCPU AMD EPYC VM", "# on the Xeon", "# Sapphire Rapids day", "# on an H100", "# an H200 run", "# Zen 4",
    "# see bench/README.md", "# see bench/\n# README.md",
])
def test_the_patterns_catch_what_they_are_for(text):
    """The checks above can fail: each pattern finds the kind of mention it is for."""
    assert _hits(DATE_PATTERNS + MACHINE_PATTERNS, text) or BENCH_README.search(text), text


@pytest.mark.parametrize("text", [
    "AMX tiles", "AVX2 and AVX-512", "CUDA 13, GCC 13", "Metal", "llama.cpp #20824", "n_ctx 2048", "0.3.36",
    "ubatch 512, 4096 tokens", "May 2 GiB be enough", "psutil.virtual_memory()", "Q4_K_M", "F16", "L2 cache",
    "vm.total", "a hypervisor taking the vCPU", "top_k 40", "deepseek2", "mistral4",
])
def test_the_patterns_leave_features_and_numbers_alone(text):
    assert not _hits(DATE_PATTERNS + MACHINE_PATTERNS, text), text


# -- the fast tier starts no llama.cpp child (tests/conftest.py's guard) ---------------------------------------

_GUARDED = '''
import subprocess, sys
from edgekv.runtime.process import run_child, worker_argv

def test_unmarked_worker():
    run_child(worker_argv("env"), {}, timeout=30)

def test_unmarked_llama_tool():
    subprocess.run(["/nonexistent/llama-server", "--help"])

def test_unmarked_other_program():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode == 0
'''


@pytest.mark.slow
def test_the_guard_fails_an_unmarked_test_that_starts_a_llama_cpp_child(tmp_path):
    """The guard in tests/conftest.py fails the two unmarked tests that start a llama.cpp child (the worker, a
    llama.cpp tool), naming each, and lets one that starts another program pass.  A pytest run of its own, on a
    copy of tests/conftest.py (slow: it starts pytest)."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"), encoding="utf-8")
    (tests / "test_guarded.py").write_text(_GUARDED, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "-c", str(ROOT / "pyproject.toml"), "-m", "not slow", str(tests)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    for name in ("test_unmarked_worker", "test_unmarked_llama_tool"):
        assert re.search(rf"{name}.*starts a llama\.cpp child", out), out
