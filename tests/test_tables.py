"""The accuracy tables in docs/ are generated from bench/results/ (tools/render_tables.py): the committed tables
equal what the data renders, every table has a place in docs/, and a changed result makes the check fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import harness as H
from tools import render_tables as RT

ROOT = Path(__file__).resolve().parents[1]


def test_committed_tables_equal_what_the_results_render(capsys):
    assert RT.pages(), "no docs page holds a generated table"
    assert RT.main(["--check"]) == 0, capsys.readouterr().err


def test_every_table_has_a_block_in_docs():
    names = {n for p in RT.pages() for n in RT.blocks(p.read_text(encoding="utf-8"))}
    assert names == set(RT.TABLES), f"tables without a place in docs/: {sorted(set(RT.TABLES) - names)}"


def test_every_table_renders_rows_from_the_committed_results():
    for name, harness in RT.TABLES.items():
        assert H.load(harness), f"bench/results/{harness}/ has no results"
        assert RT.render(name).count("\n| `") >= 1, name


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    results, docs = tmp_path / "results", tmp_path / "docs"
    shutil.copytree(ROOT / "bench" / "results" / "speed_model", results / "speed_model")
    docs.mkdir()
    (docs / "page.md").write_text("# Page\n\nbefore\n\n<!-- table:speed-model -->\nstale\n<!-- /table:speed-model -->\n\n"
                                  "after\n")
    return results, docs


def test_a_changed_result_fails_the_check_until_rendered(tmp_path, capsys):
    results, docs = _copy(tmp_path)
    args = ["--docs", str(docs), "--results", str(results)]
    assert RT.main([*args, "--check"]) == 1                      # "stale" is not what the data renders
    assert RT.main(args) == 0 and RT.main([*args, "--check"]) == 0
    text = (docs / "page.md").read_text()
    assert text.startswith("# Page\n\nbefore\n\n<!-- table:speed-model -->\n| machine class |")
    assert text.endswith("<!-- /table:speed-model -->\n\nafter\n") and "stale" not in text
    f = next((results / "speed_model").glob("*.jsonl"))
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    worst = max(rows, key=lambda r: abs(r["pct"]))
    worst["pct"] = 99.9 if worst["pct"] > 0 else -99.9
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert RT.main([*args, "--check"]) == 1
    assert "tables differ from bench/results" in capsys.readouterr().err


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


def test_every_committed_row_carries_its_machine_and_code_identity():
    files = sorted((ROOT / "bench" / "results").rglob("*.jsonl"))
    assert files
    for f in files:
        assert f.parent.parent == ROOT / "bench" / "results", f"{f}: results go to bench/results/<harness>/<class>.jsonl"
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert r["machine"] == f.stem and "commit" in r and "dirty" in r and r["time_utc"], f


SI_EPYC = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 |"
SI_CUDA = "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | FMA = 1 | AMX_INT8 = 1 |"


@pytest.mark.parametrize("env,expected", [
    ({"arch": "x86_64", "cpu_model": "AMD EPYC", "cpu_count_logical": 2, "system_info": SI_EPYC, "backends": ["CPU"],
      "devices": ["AMD EPYC"]}, "x86-avx512-epyc-2cpu"),
    ({"arch": "x86_64", "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_count_logical": 16, "system_info": SI_CUDA,
      "backends": ["CUDA", "CPU"], "devices": ["NVIDIA H100 80GB HBM3", "Intel(R) Xeon(R) Processor"]},
     "x86-amx-xeon-16cpu-h100"),
    ({"arch": "x86_64", "cpu_model": "AMD Ryzen 9 7950X", "cpu_count_logical": 32, "system_info": SI_EPYC,
      "backends": ["CUDA", "CPU"], "devices": ["NVIDIA GeForce RTX 4090"]}, "x86-avx512-ryzen-32cpu-rtx4090"),
    ({"arch": "arm64", "cpu_model": "Apple M2 Pro", "cpu_count_logical": 10, "system_info": "CPU : NEON = 1 | ARM_FMA = 1 |",
      "backends": ["Metal", "CPU"], "devices": ["Apple M2 Pro"]}, "arm64-neon-apple-10cpu-metal"),
    ({"arch": "x86_64", "cpu_model": "Intel(R) Core(TM) i7", "cpu_count_logical": 8, "cpu_flags": "fpu sse avx avx2 fma"},
     "x86-avx2-core-8cpu"),
])
def test_machine_class(env, expected):
    assert H.machine_class(env) == expected
