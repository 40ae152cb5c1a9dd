"""The corpus of public llama.cpp logs as a whole (tests/data/logs): its size and spread per backend, every KV and
recurrent-state line exact, and llama.cpp's
own memory breakdown tables (edgekv.core.breakdown) reproduced from the buffer lines.

A log that explain cannot read yet is listed in KNOWN with the issue-69 defect that stops it; the test of that log
is then an expected failure, strict, so a fix that makes it pass fails the suite until the entry is removed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from edgekv.core.breakdown import WRAP, check_table, last_exit_table, overhead, parse_row, parse_tables
from edgekv.core.explain import ExplainError, explain_lines
from edgekv.core.logconfig import read_bounded

DATA = Path(__file__).parents[2] / "data"
LOGS = DATA / "logs"
CORPUS = sorted(LOGS.glob("*.log"))
BREAKDOWNS = sorted((DATA / "breakdowns").glob("*.log"))

# log -> check -> the issue-69 defect (numbered as in the issue) that keeps explain from reproducing it today
KNOWN = {k: v for k, v in json.loads((LOGS / "known-defects.json").read_text(encoding="utf-8")).items() if k != "_"}


def backend_of(name: str) -> str:
    return name.split("-", 1)[0].replace("metal", "Metal").replace("cuda", "CUDA").replace("rocm", "ROCm").replace(
        "vulkan", "Vulkan").replace("sycl", "SYCL").replace("cann", "CANN").replace("cpu", "CPU")


def explain_file(path: Path) -> dict:
    with open(path, "rb") as f:
        b = read_bounded(f)
    return explain_lines(path.name, b.lines)


def test_corpus_spread():
    per = Counter(backend_of(p.name) for p in CORPUS)
    assert len(CORPUS) >= 40, per
    assert per["Metal"] >= 8 and per["CUDA"] >= 10 and per["ROCm"] >= 3 and per["Vulkan"] >= 3, per
    assert per["SYCL"] + per["CANN"] >= 2 and per["CPU"] >= 6, per
    assert any("decimal-comma" in p.name for p in CORPUS)
    readme = (LOGS / "README.md").read_text(encoding="utf-8")
    assert all(p.name in readme for p in CORPUS)
    assert all(p.name in (DATA / "breakdowns" / "README.md").read_text(encoding="utf-8") or p.name.startswith(
        "metal-m5-llama-cli-b8xxx") for p in BREAKDOWNS)


def _params(paths):
    return [pytest.param(p, id=p.stem, marks=pytest.mark.xfail(reason=KNOWN[p.name]["kv"], strict=True))
            if "kv" in KNOWN.get(p.name, {}) else pytest.param(p, id=p.stem) for p in paths]


@pytest.mark.parametrize("path", _params(CORPUS))
def test_every_kv_and_recurrent_line_is_exact(path):
    try:
        r = explain_file(path)
    except ExplainError as e:
        pytest.fail(f"{path.name}: refused: {e}")
    lines = r["kv"]["lines"]
    if not lines:
        assert path.name.endswith("-fragment.log"), f"{path.name}: {r['kv']['status']}"
        return
    bad = [x for x in lines if not x["match"]]
    assert not bad, f"{path.name}: {bad}"


def test_known_list_names_real_logs():
    assert set(KNOWN) <= {p.name for p in CORPUS}


# -- llama.cpp's memory breakdown ------------------------------------------------------------------------------------

M5 = "llama_memory_breakdown_print: |   - MTL0 (Apple M5)    | 18186 = 3594 + (14590 = 11073 +    3096 +     420) +  0 |"


def test_breakdown_rows_parse():
    r = parse_row(M5)
    assert (r["kind"], r["device"], r["total"], r["free"], r["self"], r["model"], r["context"], r["compute"],
            r["unaccounted"]) == ("device", "MTL0", 18186, 3594, 14590, 11073, 3096, 420, 0)
    host = parse_row("llama_memory_breakdown_print: |   - Host    |     648 =   379 +       0 +     269     |")
    assert (host["kind"], host["self"], host["model"], host["compute"]) == ("host", 648, 379, 269)
    wrapped = parse_row("llama_memory_breakdown_print: |   - SYCL0 (Intel(R) Arc(TM) A770 Graphics) | 15473 = 15473 + "
                        "(14014 = 13486 +     224 +     304) + 17592186030401 |")
    assert wrapped["name"] == "SYCL0 (Intel(R) Arc(TM) A770 Graphics)" and wrapped["unaccounted"] == 17592186030401 - WRAP
    assert overhead(wrapped)["mib"] is None
    fit = parse_row("common_memory_breakdown_print: |   - CUDA0 (RTX 2060)   |  5738 = 5141 + (4089 =  2049 +    1792 "
                    "+     248) +       -3492 |")
    assert fit["source"] == "fit dry run" and "projection" in overhead(fit)["status"]
    assert parse_row("llama_memory_breakdown_print: | memory breakdown [MiB] | total free self |") is None


@pytest.mark.parametrize("name, rows", [
    ("metal-m5-gpt-oss-20b-q4km-breakdown-b8198.log", 2),
    ("sycl-arc-a770-qwen2-7b-f16-decimal-comma-b7300.log", 2),
    ("cpu-x86-gemma2-2b-b7445.log", 2),
])
def test_breakdown_columns_reproduced_from_the_buffer_lines(name, rows):
    text = (LOGS / name).read_text(encoding="utf-8")                       # the SYCL log as printed: decimal commas
    r = explain_lines(name, text.splitlines())
    assert len(r["breakdown"]) == rows
    assert all(x["match"] for x in r["breakdown"]), r["breakdown"]


def test_a_breakdown_row_that_differs_is_marked():
    text = (LOGS / "metal-m5-gpt-oss-20b-q4km-breakdown-b8198.log").read_text(encoding="utf-8")
    r = explain_lines("edited", text.replace("(14590 = 11073 +    3096", "(14600 = 11083 +    3096").splitlines())
    row = r["breakdown"][0]
    assert row["match"] is False and "model 11083 vs 11073" in row["why"]


def test_fit_dry_run_tables_are_not_taken_as_exit_tables():
    lines = (LOGS / "cuda-rtx2060-ollama-llama3.1-8b-fit-partial.log").read_text(encoding="utf-8").splitlines()
    assert len(parse_tables(lines)) == 2 and last_exit_table(lines) == []


def _exit_device_rows() -> list[dict]:
    rows = []
    for p in BREAKDOWNS + CORPUS:
        rows += [r for r in last_exit_table(p.read_text(encoding="utf-8").splitlines()) if r["kind"] == "device"]
    return rows


def test_device_overhead_the_tables_show():
    """docs/explain.md states these figures: Metal's working set holds llama.cpp's buffers and nothing else (a second
    Metal context, a vision projector, shows up as unaccounted); on CUDA and Vulkan the exit tables show 1.1 to 3.9
    GiB beyond the buffers, other processes included, which no table separates."""
    rows = _exit_device_rows()
    measured = [(r["device"], overhead(r)["mib"]) for r in rows if overhead(r).get("mib") is not None]
    metal = sorted(m for d, m in measured if d.startswith("MTL"))
    cuda = sorted(m for d, m in measured if d.startswith("CUDA"))
    assert all(m <= 1 for m in metal[:-1]) and len(metal) >= 7 and metal[-1] == 495     # 1: the floors of an old table
    assert len(cuda) >= 5 and min(cuda) == 1125 and max(cuda) == 3945
    assert sorted(m for d, m in measured if d.startswith("Vulkan")) == [1221, 1241, 1789]
    unusable = [r for r in rows if overhead(r).get("mib") is None]
    assert len(unusable) >= 6           # four RTX 3090 rows, the SYCL row, the RPC row: free did not move


def test_check_table_on_rows_without_buffers():
    table = last_exit_table([M5])
    (row,) = check_table(table, [])
    assert row["match"] is None and "no buffer line" in row["why"]


def test_the_breakdown_is_in_the_typed_json_report(capsys):
    """``explain --json`` carries the table as ExplainReport.breakdown (schema 1, an optional field), llama.cpp's
    ``self`` column under its own name; a row of the wrong type does not validate."""
    import msgspec

    from edgekv.cli.main import main
    from edgekv.core.explainschema import SCHEMA_VERSION, report

    assert main(["explain", str(LOGS / "metal-m5-gpt-oss-20b-q4km-breakdown-b8198.log"), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["schema_version"] == SCHEMA_VERSION == 1
    mtl = j["breakdown"][0]
    assert (mtl["name"], mtl["self"], mtl["model"], mtl["match"]) == ("MTL0 (Apple M5)", 14590, 11073, True)
    assert mtl["edgekv"] == {"model": 11073, "context": 3096, "compute": 420}
    assert mtl["overhead"] == {"status": "measured", "mib": 0}
    typed = report({k: v for k, v in j.items() if k != "schema_version"})
    assert typed.breakdown[0].self_mib == 14590 and typed.breakdown[1].kind == "host"
    with pytest.raises(msgspec.ValidationError, match="breakdown"):
        report({**j, "breakdown": [{**mtl, "model": "11073"}]})
    assert "breakdown" not in json.loads(msgspec.json.encode(report({**j, "breakdown": []})))   # optional: omitted


def test_cli_prints_the_breakdown_beside_edgekv(capsys):
    from edgekv.cli.main import main

    assert main(["explain", str(LOGS / "metal-m5-gpt-oss-20b-q4km-breakdown-b8198.log")]) == 0
    out = capsys.readouterr().out
    assert "memory breakdown at exit" in out and "11073 / 11073" in out and "3096 / 3096" in out
    assert "MTL0 (Apple M5): 0 MiB in use beyond llama.cpp's buffers" in out


# -- a packager's build counter is not llama.cpp's build -------------------------------------------------------------

AMD = "rocm-rx7900xtx-windows-qwen3-14b-q6_k-amd-b1239.log"


def test_a_packager_build_counter_in_a_current_log_is_taken_as_unknown():
    """AMD's prebuilt Windows ROCm llama-server b7146 prints its own counter (``build: 1239 (b8372ee)``); its lines are
    b4400+ spellings (print_info, load_tensors), so it is explained, with a note, not refused as old."""
    r = explain_file(LOGS / AMD)
    assert r["build"] == "1239 (b8372ee)"
    assert any("packager's own counter" in n and "taken as unknown" in n for n in r["notes"]), r.get("notes")
    assert [x["match"] for x in r["kv"]["lines"]] == [True]
    assert r["model"]["status"] == "predicted" and abs(r["model"]["residual_pct"]) <= 0.5


def test_a_low_build_number_in_the_old_spelling_is_still_refused():
    """The same number with only pre-b4400 spellings (llm_load_print_meta, llm_load_tensors) is an old log: refused."""
    lines = [x.replace("print_info:", "llm_load_print_meta:").replace("load_tensors:", "llm_load_tensors:")
             for x in (LOGS / AMD).read_text(encoding="utf-8").splitlines()]
    with pytest.raises(ExplainError, match="older than b4400"):
        explain_lines(AMD, lines)
    # a plausible build number is never second-guessed: no note
    assert not any("packager" in n for n in explain_file(LOGS / "rocm-rx7900xt-qwen3-8b-b5618.log").get("notes", []))


# -- per-device KV buffers where the layer split does not apply -------------------------------------------------------

@pytest.mark.parametrize("name, device", [("cpu-x86-amx-ggml-ci-bert-bge-small-f16-b4641.log", "CPU"),
                                          ("metal-m4-ggml-ci-bert-bge-small-f16-b4658.log", "Metal")])
def test_an_encoder_kv_buffer_on_one_device_is_its_size_line(name, device):
    """BERT in early-2025 builds: edgekv's rules give no cache, the size line is recomputed from print_info's widths;
    the one device's KV buffer is that line (it was predicted as 0.00 MiB, and explain --check failed)."""
    text = (LOGS / name).read_text(encoding="utf-8")
    rows = explain_lines(name, text.splitlines())["kv_buffers"]["rows"]
    assert [(x["device"], x["printed_mib"], x["predicted_mib"], x["match"]) for x in rows] == [
        (device, "9.00", "9.00", True)]
    edited = text.replace(f"{device} KV buffer size =     9.00 MiB", f"{device} KV buffer size =    10.00 MiB")
    assert edited != text
    (row,) = explain_lines(name, edited.splitlines())["kv_buffers"]["rows"]
    assert not row["match"] and "size line's bytes" in row["why"]


def test_kv_buffers_of_several_contexts_are_not_attributed():
    """Twelve contexts on worker threads, on SYCL0 and the host: the buffer lines do not name their context, so no
    per-device prediction is made (it was one context's figure against the sum of all, and --check failed)."""
    name = "sycl-arc-a770-stories-llama-12-contexts-interleaved.log"
    kb = explain_file(LOGS / name)["kv_buffers"]
    assert kb["rows"] == [] and kb["status"].startswith("not predicted: the log holds 11 contexts")
