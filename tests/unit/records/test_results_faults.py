"""Results files under faults: damaged lines, torn tails, newer schemas, CRLF, empty files, directories,
unwritable paths, concurrent writers, and a resumed bench that must never drop a complete record.

The parser cases load the recorded SmolLM2 results in tests/data (recorded output may test a
parser) through the in-process `cli` fixture, and so do the bench cases that must refuse before measuring (the
repack preflight's verdict recorded: tests/conftest.py recorded_preflight); the bench cases that measure run real
llama.cpp on SmolLM2-135M in `python -m edgekv.cli` processes (two of them at once is the point).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekv.errors import ResultsError
from edgekv.records import results as R

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "tests" / "data" / "cuda-h100" / "smollm2-135m.jsonl"


def run_edgekv(*args: str, timeout: float = 300, **kw) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "edgekv.cli", *args], capture_output=True, text=True, timeout=timeout,
                       **kw)
    return p.returncode, p.stdout, p.stderr


def lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.strip()]


def one_error(rc: int, err: str, *needles: str) -> str:
    assert rc == 1, err
    ls = lines(err)
    assert len(ls) == 1 and ls[0].startswith("edgekv: error: ") and "internal error" not in err, err
    for n in needles:
        assert n in ls[0], ls[0]
    return ls[0]


def base_lines() -> list[bytes]:
    return BASE.read_bytes().splitlines(keepends=True)


def write(p: Path, parts: list[bytes]) -> Path:
    p.write_bytes(b"".join(parts))
    return p


@pytest.fixture
def damaged(tmp_path):
    """name -> (file, the 1-based line that is unusable, words of the reason)."""
    b = base_lines()
    newer = json.loads(b[3])
    newer["schema_version"] = 99
    nullset = json.loads(b[5])
    nullset["settings"] = None
    return {
        "garbage": (write(tmp_path / "garbage.jsonl", b[:2] + [b"\x00\xffnot json at all\n"] + b[2:]), 3,
                    "not valid JSON"),
        "newer": (write(tmp_path / "newer.jsonl", b[:3] + [json.dumps(newer).encode() + b"\n"] + b[4:]), 4,
                  "newer edgekv"),
        "nullsettings": (write(tmp_path / "null.jsonl", b[:5] + [json.dumps(nullset).encode() + b"\n"] + b[6:]), 6,
                         "settings: expected object, got null"),
        "list": (write(tmp_path / "list.jsonl", b[:1] + [b"[1, 2]\n"] + b[1:]), 2, "JSON object"),
    }


@pytest.mark.parametrize("case", ["garbage", "newer", "nullsettings", "list"])
def test_report_skips_an_unusable_line_and_says_so(cli, damaged, case, tmp_path):
    path, line, why = damaged[case]
    rc, out, err = cli("report", str(path), "-o", str(tmp_path / "rep"), "--no-plots", "--json")
    assert rc == 0, err
    warn = [x for x in lines(err) if x.startswith("edgekv: warning:")]
    assert warn == [x for x in lines(err)] and len(warn) == 1, err
    assert f"{path}:{line}: " in warn[0] and why in warn[0] and "skipped" in warn[0]
    assert json.loads(out)["records"] == len(base_lines()) - (1 if case in ("newer", "nullsettings") else 0)
    readme = (tmp_path / "rep" / "README.md").read_text()
    assert "Skipped 1 unusable input line" in readme and f"{path.name}:{line}" in readme


@pytest.mark.parametrize("case", ["garbage", "newer", "nullsettings"])
def test_compare_and_merge_refuse_an_unusable_line_naming_it(cli, damaged, case, tmp_path):
    path, line, why = damaged[case]
    rc, out, err = cli("compare", str(BASE), str(path))
    one_error(rc, err, f"{path}:{line}:", why)
    rc, out, err = cli("merge", str(BASE), str(path), "-o", str(tmp_path / "m.jsonl"))
    one_error(rc, err, f"{path}:{line}:", why)
    assert not (tmp_path / "m.jsonl").exists()


def test_torn_last_line_is_left_out_with_one_line(cli, tmp_path):
    b = base_lines()
    torn = write(tmp_path / "torn.jsonl", b + [b[0][:300]])
    for args in (["report", str(torn), "-o", str(tmp_path / "rep"), "--no-plots"],
                 ["merge", str(torn), "-o", str(tmp_path / "m.jsonl")],
                 ["compare", str(BASE), str(torn), "--json"]):
        rc, out, err = cli(*args)
        assert rc == 0, err
        ls = lines(err)
        assert len(ls) == 1 and f"torn.jsonl:{len(b) + 1}: torn last line" in ls[0], err
    assert len(R.load(tmp_path / "m.jsonl")) == len(b)


def test_crlf_line_ends_load_every_record(cli, tmp_path):
    crlf = write(tmp_path / "crlf.jsonl", [x.rstrip(b"\n") + b"\r\n" for x in base_lines()])
    assert R.load(crlf) == R.load(BASE)
    rc, out, err = cli("report", str(crlf), "-o", str(tmp_path / "rep"), "--no-plots", "--json")
    assert rc == 0 and not err.strip(), err
    assert json.loads(out)["records"] == len(base_lines())


@pytest.mark.parametrize("make,needle", [
    (lambda t: write(t / "empty.jsonl", []), "empty"),
    (lambda t: t, "is a directory"),
    (lambda t: t / "missing.jsonl", "no such file"),
])
def test_empty_directory_missing_are_one_line(cli, tmp_path, make, needle):
    p = make(tmp_path)
    for args in (["report", str(p), "-o", str(tmp_path / "rep")], ["compare", str(p), str(BASE)],
                 ["merge", str(p), "-o", str(tmp_path / "m.jsonl")]):
        rc, out, err = cli(*args)
        one_error(rc, err, needle)


def test_all_lines_unusable_refuses(cli, tmp_path):
    p = write(tmp_path / "junk.jsonl", [b'{"schema_version": 1, "settings": 3}\n', b"junk\n"])
    rc, out, err = cli("report", str(p), "-o", str(tmp_path / "rep"))
    assert rc == 1 and "edgekv: error: no usable records" in err, err


# -- writing ---------------------------------------------------------------------------------------

def test_missing_final_newline_is_repaired_by_appending(tmp_path):
    raw = BASE.read_bytes()
    p = tmp_path / "x.jsonl"
    p.write_bytes(raw[:-1])
    with R.ResultsWriter(p) as w:
        assert len(w.existing) == len(base_lines())
        assert len(w.notes) == 1 and f"x.jsonl:{len(base_lines())}: the last record had no final newline" in w.notes[0]
    assert p.read_bytes() == raw
    # a torn (not JSON) tail is the only thing ever cut
    p.write_bytes(raw + b'{"schema_version": 1, "config')
    with R.ResultsWriter(p) as w:
        assert "removed a torn last line (29 bytes" in w.notes[0]
    assert p.read_bytes() == raw


def test_second_writer_refuses_while_the_first_holds_the_lock(tmp_path):
    p = tmp_path / "locked.jsonl"
    with R.ResultsWriter(p), pytest.raises(ResultsError, match="another edgekv process is writing"):
        R.ResultsWriter(p)
    with R.ResultsWriter(p):      # released on close
        pass
    assert not p.exists()         # nothing written: no empty file left behind


# bench's repack preflight (a llama.cpp child) answers a recorded verdict: the refusal comes before any measuring,
# of SmolLM2's header-only stand-in of the real size (a real run would fail on its zero weights, never reached)
@pytest.mark.parametrize("make,needle", [
    (lambda t: t, "is a directory"),
    (lambda t: (t / "afile").write_text("x") and t / "afile" / "r.jsonl", "cannot create its folder"),
])
def test_unwritable_output_is_refused_before_measuring(cli, tmp_path, make, needle, recorded_preflight, sparse_models):
    out = make(tmp_path)
    t0 = time.monotonic()
    rc, _, err = cli("bench", sparse_models["smollm2"], "-c", "512", "-ctk", "f16", "-p", "16", "-n", "4", "-r", "1",
                     "-t", "1", "-o", str(out))
    one_error(rc, err, needle)
    assert time.monotonic() - t0 < 60      # no configuration was measured (a measured one takes longer)


_APPENDER = """
import json, sys
from edgekv.records import results as R
path, who, n, size, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rec = json.loads(open(base).readline())        # a real record: loading is strict
for i in range(n):
    R.append(path, R.as_record({**rec, "config_key": f"{who}-{i}", "reason": "x" * size}))
"""


@pytest.mark.slow
def test_concurrent_appenders_lose_nothing(tmp_path):
    p = tmp_path / "race.jsonl"
    p.write_bytes(base_lines()[0].rstrip(b"\n"))     # no final newline
    n, size = 60, 128 * 1024
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(p), w, str(n), str(size), str(BASE)]) for w in "ab"]
    for pr in procs:
        assert pr.wait(timeout=300) == 0
    recs = R.load(p)
    assert len(recs) == 2 * n + 1
    for w in "ab":
        assert sorted(int(r["config_key"].split("-")[1]) for r in recs if r["config_key"].startswith(w + "-")) == \
            list(range(n))


@pytest.mark.slow
def test_resume_keeps_a_record_without_its_newline_and_two_benches_never_share_a_file(tmp_path):
    """The issue's reproduction: head -c -1 base.jsonl > x.jsonl; bench f16,q8_0 -o x.jsonl."""
    common = ["bench", "smollm2-135m", "-c", "512", "-p", "16", "-n", "4", "-r", "1", "-t", "1"]
    base = tmp_path / "base.jsonl"
    rc, _, err = run_edgekv(*common, "-ctk", "f16", "-o", str(base), timeout=600)
    assert rc == 0, err
    x = tmp_path / "x.jsonl"
    x.write_bytes(base.read_bytes()[:-1])
    first = subprocess.Popen([sys.executable, "-m", "edgekv.cli", *common, "-ctk", "f16,q8_0", "-o", str(x)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not x.read_bytes().endswith(b"\n"):    # the repair: taken the lock
        time.sleep(0.1)
    assert x.read_bytes().endswith(b"\n")
    rc2, _, err2 = run_edgekv(*common, "-ctk", "f16,q8_0", "-o", str(x), timeout=300)
    one_error(rc2, err2, "another edgekv process is writing")
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert "x.jsonl:1: the last record had no final newline; added it" in err
    recs = R.load(x)
    assert [r["settings"]["type_k"] for r in recs] == ["f16", "q8_0"]
    assert recs[0] == R.load(base)[0]


@pytest.mark.parametrize("case", ["garbage", "newer", "nullsettings"])
def test_resumed_bench_refuses_an_unusable_line_before_measuring(cli, damaged, case, recorded_preflight, sparse_models):
    path, line, why = damaged[case]
    before = path.read_bytes()
    rc, _, err = cli("bench", sparse_models["smollm2"], "-c", "512", "-ctk", "f16", "-p", "16", "-n", "4", "-r", "1",
                     "-t", "1", "-o", str(path))
    one_error(rc, err, f"{path}:{line}:", why)
    assert path.read_bytes() == before
