"""The accuracy tables in docs/ are generated from bench/results/ (tools/render_tables.py): the committed tables
equal what the data renders, every table has a place in docs/, and a changed result makes the check fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import harness as H
from tools import render_tables as RT

ROOT = Path(__file__).resolve().parents[2]
# the tables count commits to edgekv/ after their rows' code: that needs the history (a shallow clone has none)
needs_history = pytest.mark.skipif(not RT.history(), reason="not a full git clone: the commit counts need the history")


@needs_history
def test_committed_tables_equal_what_the_results_render(capsys):
    assert RT.pages(), "no docs page holds a generated table"
    assert RT.main(["--check"]) == 0, capsys.readouterr().err


def test_every_table_has_a_block_in_docs():
    names = {n for p in RT.pages() for n in RT.blocks(p.read_text(encoding="utf-8"))}
    assert names == set(RT.TABLES), f"tables without a place in docs/: {sorted(set(RT.TABLES) - names)}"


def test_every_table_renders_rows_from_the_committed_results():
    for name, harness in RT.TABLES.items():
        assert H.load(harness.partition(":")[0]), f"bench/results/{harness}/ has no results"
        assert RT.render(name).count("\n| `") >= 1, name


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    results, docs = tmp_path / "results", tmp_path / "docs"
    shutil.copytree(ROOT / "bench" / "results" / "speed_model", results / "speed_model")
    docs.mkdir()
    (docs / "page.md").write_text("# Page\n\nbefore\n\n<!-- table:speed-model -->\nstale\n<!-- /table:speed-model -->\n\n"
                                  "after\n")
    return results, docs


def _rows(f: Path) -> list[dict]:
    return [json.loads(x) for x in f.read_text().splitlines()]


def _write(f: Path, rows: list[dict]) -> None:
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))


@needs_history
def test_a_changed_result_fails_the_check_until_rendered(tmp_path, capsys):
    results, docs = _copy(tmp_path)
    args = ["--docs", str(docs), "--results", str(results)]
    assert RT.main([*args, "--check"]) == 1                      # "stale" is not what the data renders
    assert RT.main(args) == 0 and RT.main([*args, "--check"]) == 0
    text = (docs / "page.md").read_text()
    assert text.startswith("# Page\n\nbefore\n\n<!-- table:speed-model -->\n| machine class |")
    assert text.endswith("<!-- /table:speed-model -->\n\nafter\n") and "stale" not in text
    f = next((results / "speed_model").glob("*.jsonl"))
    rows = _rows(f)
    worst = max(rows, key=lambda r: abs(r["pct"]))
    worst["measured"] = worst["predicted"] * (1.999 if worst["pct"] > 0 else 0.001)   # raw and derived moved together
    worst["pct"] = 100.0 * (worst["measured"] - worst["predicted"]) / worst["predicted"]
    _write(f, rows)
    assert RT.main([*args, "--check"]) == 1
    assert "tables differ from bench/results" in capsys.readouterr().err


@pytest.mark.parametrize("harness,table,edit", [
    ("speed_model", "speed-model", lambda r: r.update(measured=r["measured"] * 1.3)),       # raw only
    ("speed_model", "speed-model", lambda r: r.update(predicted=r["predicted"] / 2)),
    ("speed_model", "speed-model", lambda r: r.update(pct=r["pct"] + 5)),                   # derived only
    ("memory_model", "memory-model", lambda r: r.update(measured=r["measured"] + 64 * H.MIB)),
    ("memory_model", "memory-model", lambda r: r.update(diff=r["diff"] + H.MIB)),
    ("bench_vs_llama_bench", "bench-vs-llama-bench", lambda r: r["tg"]["edgekv"].__setitem__(0, 1.0)),
    ("parallel_vs_batched_bench", "parallel", lambda r: r["pp"].update(batched_bench_mean=1.0)),
    ("serving_accuracy", "serving", lambda r: r.update(server_peak=r["server_peak"] * 2)),
    ("serving_accuracy", "serving", lambda r: r.update(inproc_tg=1.0)),
])
def test_a_raw_field_edited_alone_fails_the_check(tmp_path, harness, table, edit):
    """The check reads the raw measured and predicted fields, not only what the tables print: a measurement, a
    prediction, a sample or a mean edited without its derived fields (or the reverse) stops the render."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results" / harness, results / harness)
    upto = "0" * 40                                      # no history needed: the counts read "unknown"
    assert "| `" in RT.render(table, results, upto)      # the committed rows are consistent
    f = sorted((results / harness).glob("*.jsonl"))[-1]
    rows = _rows(f)
    edit(rows[-1])
    _write(f, rows)
    with pytest.raises(SystemExit, match="derived fields disagree with the raw ones"):
        RT.render(table, results, upto)


def _rendered_at(text: str) -> str:
    m = RT._RENDERED_AT.search(text)
    assert m, text
    return m.group(1)


@needs_history
def test_every_table_says_which_commit_measured_it_and_how_many_came_after():
    """Each committed table names its rows' code and the count of commits to edgekv/ after it, up to the commit the
    block records it was rendered at; the count is recomputed here with git."""
    for page in RT.pages():
        text = page.read_text(encoding="utf-8")
        for name in RT.blocks(text):
            a, b = H.block_markers(name)
            block = text.split(a, 1)[1].split(b, 1)[0]
            upto = _rendered_at(block)
            for m, rows in H.load(RT.TABLES[name].partition(":")[0]).items():
                ages = {RT.commits_after(r.get("commit") or r["stored_commit"], upto) for r in rows}
                assert None not in ages, f"{page.name} {name}: a row's commit is not in the history"
                lo, hi = min(ages), max(ages)
                count = f"{lo}" if lo == hi else f"{lo} to {hi}"
                line = next(x for x in block.splitlines() if x.startswith(f"- `{m}`") and f": {len(rows)} rows measured" in x)
                bound = "at least " if any(not r.get("commit") for r in rows) else ""
                assert f"; {bound}{count} commits to `edgekv/` came after that code" in line, (page.name, name, line)
                assert H.identity_note(rows) in line


@needs_history
def test_the_check_counts_up_to_the_recorded_commit_not_head(tmp_path):
    """A table rendered at an older commit still passes the check after later commits land (the count is up to the
    commit the block records); a recorded commit the repository lacks is refused with what to do."""
    results, docs = _copy(tmp_path)
    older = RT._git("rev-parse", "HEAD~3")
    page = docs / "page.md"
    page.write_text(RT.H.replace_block(page.read_text(), "speed-model", RT.render("speed-model", results, older)))
    args = ["--docs", str(docs), "--results", str(results)]
    assert RT.main([*args, "--check"]) == 0
    assert _rendered_at(page.read_text()) == older
    assert RT.main(args) == 0 and _rendered_at(page.read_text()) == RT.head()     # a render moves it to HEAD
    page.write_text(page.read_text().replace(RT.head(), "0" * 40))
    with pytest.raises(SystemExit, match="does not have: run python -m tools.render_tables"):
        RT.main([*args, "--check"])


def test_converted_rows_show_their_age_as_an_upper_bound_on_their_code():
    rows = [{"commit": None, "dirty": None, "stored_commit": "a" * 40, "converted_from": "x", "time_utc": "2026-11-23T01:00:00Z"},
            {"commit": "b" * 40, "dirty": True, "time_utc": "2026-12-01T01:00:00Z"}]
    assert H.identity_note(rows) == "bbbbbbb-dirty, ≤ aaaaaaa"
    line = RT.provenance({"x86-avx2-epyc-2cpu": rows}, "c" * 40)
    assert "2 rows measured 2026-11-23 to 2026-12-01 with edgekv bbbbbbb-dirty, ≤ aaaaaaa" in line
    assert "1 of 2 rows converted from older results" in line and "an unknown number of commits" in line


def test_an_unknown_table_name_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown table name"):
        RT.blocks("<!-- table:speed-modle -->\n<!-- /table:speed-modle -->")


def test_a_run_replaces_its_configurations_and_keeps_the_others(tmp_path):
    key = ("model", "depth")
    H.save("h", "x86-avx2-core-8cpu", [{"model": "a", "depth": 1, "v": 1}, {"model": "a", "depth": 2, "v": 2}], key,
           tmp_path, {"commit": "c1", "dirty": False})
    H.save("h", "x86-avx2-core-8cpu", [{"model": "a", "depth": 2, "v": 3}], key, tmp_path, {"commit": "c2", "dirty": True})
    (rows,) = H.load("h", tmp_path).values()
    assert [(r["depth"], r["v"], r["commit"], r["dirty"]) for r in rows] == [(1, 1, "c1", False), (2, 3, "c2", True)]
    assert all(r["machine"] == "x86-avx2-core-8cpu" and r["time_utc"] for r in rows)


def test_a_row_keeps_the_code_of_the_record_that_measured_it(tmp_path):
    """A row read from an edgekv record carries that record's commit and dirty flag, not the harness's."""
    key = ("model",)
    H.save("h", "x86-avx2-core-8cpu", [{"model": "a", "commit": "d" * 40, "dirty": True}, {"model": "b"}], key, tmp_path)
    (rows,) = H.load("h", tmp_path).values()
    assert (rows[0]["commit"], rows[0]["dirty"]) == ("d" * 40, True)
    assert (rows[1]["commit"], rows[1]["dirty"]) == tuple(H.identity().values())


def test_every_committed_row_carries_its_machine_and_code_identity():
    files = sorted((ROOT / "bench" / "results").rglob("*.jsonl"))
    assert files
    for f in files:
        assert f.parent.parent == ROOT / "bench" / "results", f"{f}: results go to bench/results/<harness>/<class>.jsonl"
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert r["machine"] == f.stem and "commit" in r and "dirty" in r and r["time_utc"], f
            if r.get("converted_from"):     # converted: the commit that stored it bounds the code that measured it
                assert r["commit"] is None and RT._HEX.fullmatch(r["stored_commit"]), f
            else:
                assert RT._HEX.fullmatch(r["commit"] or ""), f"{f}: a measured row names the commit that measured it"


SI_AVX2_BUILD = "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | FMA = 1 |"
XEON_FLAGS = "fpu sse avx avx2 fma avx512f avx512bw amx_bf16 amx_tile amx_int8"


@pytest.mark.parametrize("env,expected", [
    ({"arch": "x86_64", "cpu_model": "AMD EPYC", "cpu_count_logical": 2, "cpu_flags": "fpu sse avx avx2 fma avx512f",
      "backends": ["CPU"], "devices": ["AMD EPYC"]}, "x86-avx512-epyc-2cpu"),
    ({"arch": "x86_64", "cpu_model": "AMD EPYC 7B13", "cpu_count_logical": 2, "cpu_flags": "fpu sse avx avx2 fma",
      "system_info": "CPU : AVX512 = 1 |", "backends": ["CPU"]}, "x86-avx2-epyc-2cpu"),
    ({"arch": "x86_64", "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_count_logical": 16, "cpu_flags": XEON_FLAGS,
      "system_info": SI_AVX2_BUILD, "backends": ["CUDA", "CPU"],
      "devices": ["NVIDIA H100 80GB HBM3", "Intel(R) Xeon(R) Processor"]}, "x86-amx-xeon-16cpu-cuda-h100"),
    ({"arch": "x86_64", "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_count_logical": 16, "cpu_flags": XEON_FLAGS,
      "system_info": "CPU : AMX_INT8 = 1 |", "backends": ["CPU"], "devices": ["Intel(R) Xeon(R) Processor"]},
     "x86-amx-xeon-16cpu"),
    ({"arch": "x86_64", "cpu_model": "AMD Ryzen 9 7950X", "cpu_count_logical": 32, "cpu_flags": "avx2 avx512f",
      "backends": ["CUDA", "CPU"], "devices": ["NVIDIA GeForce RTX 4090"]}, "x86-avx512-ryzen-32cpu-cuda-rtx4090"),
    ({"arch": "arm64", "cpu_model": "Apple M2 Pro", "cpu_count_logical": 10, "cpu_flags": "fp asimd crc32",
      "backends": ["Metal", "CPU"], "devices": ["Apple M2 Pro"]}, "arm64-neon-apple-10cpu-metal"),
    ({"arch": "x86_64", "cpu_model": "Intel(R) Core(TM) i7", "cpu_count_logical": 8, "cpu_flags": "fpu sse avx avx2 fma"},
     "x86-avx2-core-8cpu"),
])
def test_machine_class(env, expected):
    assert H.machine_class(env) == expected


def test_one_host_gets_one_class_whichever_build_a_harness_runs():
    """The ISA is the CPU's: a CPU build that reports AMX and a CUDA build made elsewhere that reports AVX2 give the
    same host the same CPU part."""
    cpu = {"arch": "x86_64", "cpu_model": "Intel(R) Xeon(R)", "cpu_count_logical": 16, "cpu_flags": XEON_FLAGS}
    a = H.machine_class({**cpu, "system_info": "CPU : AMX_INT8 = 1 | AVX512 = 1 |", "backends": ["CPU"]})
    b = H.machine_class({**cpu, "system_info": SI_AVX2_BUILD, "backends": ["CUDA", "CPU"],
                         "devices": ["NVIDIA H100 80GB HBM3"]})
    assert a == "x86-amx-xeon-16cpu" and b == a + "-cuda-h100"


def test_a_record_without_cpu_flags_takes_them_from_its_own_host_only(monkeypatch):
    monkeypatch.setattr(H, "_cpuinfo_flags", lambda: "fpu avx avx2")
    monkeypatch.setenv("EDGEKV_MACHINE_ID", "this-host")
    env = {"arch": "x86_64", "cpu_model": "AMD EPYC", "cpu_count_logical": 2, "system_info": "CPU : AVX512 = 1 |"}
    assert H.machine_class({**env, "machine_id": "this-host"}) == "x86-avx2-epyc-2cpu"
    with pytest.raises(SystemExit, match="records from gpu-box carry no CPU flags.*pass --machine"):
        H.machine_class({**env, "machine_id": "gpu-box"})


def test_every_old_class_name_is_mapped():
    """Rows filed before the ISA came from the CPU keep their class; RENAMED (and bench/README.md) say what each is."""
    readme = (ROOT / "bench" / "README.md").read_text()
    for old in H.RENAMED:
        assert f"| `{old}`" in readme, old
    assert {"x86-avx2-xeon-16cpu-h100", "x86-amx-xeon-16cpu-h100"} <= set(H.RENAMED)
    assert H.RENAMED["x86-avx2-xeon-16cpu-h100"][0] == H.RENAMED["x86-amx-xeon-16cpu-h100"][0]   # one host, one class
