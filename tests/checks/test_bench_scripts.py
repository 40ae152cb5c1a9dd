"""The harnesses in bench/ run end to end on tiny settings (pipeline checks: their figures are not asserted against
targets here; bench/results/ holds the measured ones, docs/ their tables).  They compare edgekv with llama.cpp's own
tools built from the same vendored source (tools/llama_tools.py), and bench/ stays a small tool set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import explain_corpus as EC
from bench import harness as H

ROOT = Path(__file__).resolve().parents[2]


HARNESSES = ("speed_model", "memory_model", "quality_vs_perplexity", "bench_vs_llama_bench", "parallel_vs_batched_bench",
             "serving_accuracy", "first_run", "explain_corpus")


@pytest.fixture(scope="module")
def llama_bin(llama_bench_exe) -> Path:
    from tools.llama_tools import tool

    for name in ("llama-perplexity", "llama-batched-bench", "llama-server"):
        tool(name)                    # same build tree: only the missing targets are built
    return llama_bench_exe.parent


def _run(harness: str, args: list[str], bin_dir: Path, results: Path) -> list[dict]:
    """Run a harness as a maintainer does (``python -m bench.NAME``) into ``results``; the rows it wrote."""
    env = {**os.environ, "EDGEKV_LLAMA_CPP_BIN": str(bin_dir)}
    r = subprocess.run([sys.executable, "-m", f"bench.{harness}", *args, "--results", str(results), "--machine",
                        "test-class"], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    rows = [json.loads(x) for x in (results / harness / "test-class.jsonl").read_text().splitlines()]
    assert all(x["machine"] == "test-class" and "commit" in x and "dirty" in x and x["time_utc"] for x in rows)
    return rows


def test_speed_script_against_llama_bench(llama_bin, tmp_path):
    out = tmp_path / "speed.json"
    rows = _run("bench_vs_llama_bench", ["-c", "512", "-ctk", "f16,q4_0", "-p", "32", "-n", "8", "-r", "2", "-t", "2",
                                         "--rounds", "2", "--out", str(out)], llama_bin, tmp_path)
    res = json.loads(out.read_text())
    assert [(r["model"], r["n_ctx"], r["type"], r["p"]) for r in rows] == [("smollm2-135m", 512, "f16", 32),
                                                                          ("smollm2-135m", 512, "q4_0", 32)]
    assert [(r["n_ctx"], r["type"], r["depth"]) for r in res["rows"]] == [(512, "f16", 480), (512, "q4_0", 480)]
    for r in res["rows"]:
        assert r["llama_bench_commit"] == "0c1e570"
        for k in ("pp", "tg"):
            x = r[k]
            assert len(x["edgekv"]) == len(x["llama_bench"]) == 4 and len(x["round_ratios"]) == 2
            assert x["ratio"] == pytest.approx(x["edgekv_mean"] / x["llama_bench_mean"]) and x["ratio_ci95"]
    assert 0 < res["summary"]["harness_share_of_case_wall"] < 1 and len(res["load1"]) == 8
    from bench.bench_vs_llama_bench import render

    assert "| `test-class` | smollm2-135m | 512 | 480 | q4_0 | tg8 |" in render({"test-class": rows})


def test_quality_script_against_llama_perplexity(llama_bin, tmp_path):
    out = tmp_path / "quality.json"
    rows = _run("quality_vs_perplexity", ["-c", "256", "--chunks", "2", "-ctk", "f16,q4_0", "-t", "2", "--no-plain",
                                          "--out", str(out)], llama_bin, tmp_path)
    res = json.loads(out.read_text())
    assert res["ok"], json.dumps(res["contexts"], indent=1)[-3000:]
    (ctx,) = res["contexts"]
    assert ctx["n_ctx"] == 256 and set(ctx["types"]) == {"f16", "q4_0"}
    assert [(r["n_ctx"], r["chunks"], r["type"], r["ok"]) for r in rows] == [(256, 2, "f16", True), (256, 2, "q4_0", True)]
    from bench.quality_vs_perplexity import render

    assert "| `test-class` | smollm2-135m | 256 | 2 | q4_0 |" in render({"test-class": rows})


def test_parallel_script_against_llama_batched_bench(llama_bin, tmp_path):
    out = tmp_path / "parallel.json"
    rows = _run("parallel_vs_batched_bench", ["--models", "smollm2-135m", "-ctk", "f16", "-npl", "1,2", "-c", "512", "-p",
                                              "32", "-n", "8", "-r", "2", "-t", "2", "--rounds", "1", "--out", str(out)],
                llama_bin, tmp_path)
    res = json.loads(out.read_text())
    assert [(r["type"], r["npl"], r["c"]) for r in rows] == [("f16", 1, 512), ("f16", 2, 512)]
    assert [(r["type"], r["npl"]) for r in res["rows"]] == [("f16", 1), ("f16", 2)]
    for r in res["rows"]:
        for k in ("pp", "tg"):
            assert len(r[k]["edgekv"]) == len(r[k]["batched_bench"]) == 2
            assert r[k]["ratio"] == pytest.approx(r[k]["edgekv_mean"] / r[k]["batched_bench_mean"])
        assert r["kv_matches_formula"] and r["predicted_peak_rss_bytes"] > 0


def test_serving_script_against_the_prediction_and_in_process(llama_bin, tmp_path):
    out = tmp_path / "serving.json"
    rows = _run("serving_accuracy", ["--models", "smollm2-135m", "--np", "1,2", "-c", "512", "-p", "32", "-n", "8", "-r",
                                     "2", "-t", "2", "--rounds", "1", "--out", str(out)], llama_bin, tmp_path)
    res = json.loads(out.read_text())
    assert [(r["np"], r["c"], r["t"]) for r in rows] == [(1, 512, 2), (2, 512, 2)]
    assert [r["np"] for r in res["rows"]] == [1, 2]
    for r in res["rows"]:
        assert r["kv_match"] and r["server_predicted"] > 0 and r["server_tg"] > 0 and r["inproc_tg"] > 0
        assert r["tg_ratio"] == pytest.approx(r["server_tg"] / r["inproc_tg"]) and r["ttft_p50_s"] > 0
    from bench.serving_accuracy import render

    assert render({"test-class": rows}).count("| `test-class` |") == 2


@pytest.mark.slow
def test_fuzz_script_runs_and_finds_no_crash(tmp_path):
    out = tmp_path / "fuzz.json"
    r = subprocess.run([sys.executable, "-m", "tools.fuzz_headers", "--inputs", "400", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(out.read_text())
    assert res["inputs"] == 400 and res["crashes"] == 0 and sum(res["outcomes"].values()) == 400
    assert res["outcomes"].get("predict:ok", 0) > 0 and res["outcomes"].get("GGUFFormatError", 0) > 0


def test_speed_rounds_table_tells_a_miss_of_the_model_from_noise():
    """bench/speed_model.py --rounds: a configuration outside its target at the median of the rounds is the model's
    miss; one outside in a single round only is noise; the spreads and each round's calibration keys are shown."""
    from bench import speed_model as S

    def row(test, depth, pct, measured, cal):
        return {"model": "smollm2-135m", "variant": "base", "depth": depth, "type": "f16", "test": test, "t": 2,
                "ub": 512, "measured": measured, "predicted": measured / (1 + pct / 100), "pct": pct, "busy": False,
                "explain": None, "cal": cal}

    rounds = [("r1", [row("tg", 512, -12.0, 90.0, "aaa"), row("tg", 2048, 3.0, 50.0, "aaa"),
                      row("pp", 512, 16.0, 300.0, "aaa")]),
              ("r2", [row("tg", 512, -14.0, 99.0, "aaa"), row("tg", 2048, -11.0, 45.0, "aaa"),
                      row("pp", 512, 1.0, 310.0, "aaa")]),
              ("r3", [row("tg", 512, -2.0, 95.0, "bbb"), row("tg", 2048, 1.0, 50.0, "bbb")])]
    t = S.rounds_table(rounds)
    lines = {ln.split("|")[3].strip() + ln.split("|")[5].strip(): ln for ln in t.splitlines() if ln.startswith("| smollm2")}
    assert "-12.0 ✗ | -14.0 ✗ | -2.0 | -12.0 %" in lines["512tg"] and "**outside at the median**" in lines["512tg"]
    assert "+3.0 | -11.0 ✗ | +1.0 | +1.0 %" in lines["2048tg"] and "within at the median |" in lines["2048tg"]
    assert "| +16.0 ✗ | +1.0 | – | +8.5 % |" in lines["512pp"] and "within at the median" in lines["512pp"]
    assert "| 9.5 % |" in lines["512tg"]          # measured 90 .. 99 t/s: 9 around a median of 95
    assert ("tg (±10 %), 2 configurations over 3 rounds: 0 within in every round, 1 within at the median only, 1 outside "
            "at the median: smollm2-135m, defaults, depth 512, f16 -12.0 %.") in t
    assert "Calibration keys: r1: aaa; r2: aaa; r3: bbb." in t


def test_speed_off_table_rows_name_a_pair_of_two_types_and_their_settings(tmp_path):
    """bench/speed_model.py --off-table: a record of a K/V pair of two types reads back as "q8_0/q4_0" (not its K type
    alone, which would mix it with the q8_0 row of the table) under its variant's settings."""
    from bench import speed_model as S

    def rec(tk, tv):
        return {"status": "ok", "settings": {"n_depth": 2048, "type_k": tk, "type_v": tv, "n_threads": 2, "n_ubatch": 512},
                "speed": {"tg": {"mean_ts": 50.0}, "pp": {"mean_ts": 70.0}},
                "prediction": {"speed": {"tg": {"tokens_per_s": 52.0, "calibration_id": "abc-1"},
                                         "pp": {"tokens_per_s": 70.0, "calibration_id": "abc-1"}}}}

    (tmp_path / "smollm2-135m-mixed.jsonl").write_text(json.dumps(rec("q8_0", "q4_0")) + "\n")
    (tmp_path / "smollm2-135m-types.jsonl").write_text(json.dumps(rec("bf16", "bf16")) + "\n")
    rs = S.rows(tmp_path)
    assert {(r["variant"], r["type"], r["test"]) for r in rs} == {
        ("mixed", "q8_0/q4_0", "tg"), ("mixed", "q8_0/q4_0", "pp"), ("types", "bf16", "tg"), ("types", "bf16", "pp")}
    t = S.table(rs)
    assert "| smollm2-135m | -ctv q4_0 | 2048 | q8_0/q4_0 | tg | 50.0 | 52.0 | -3.8 % | ✓ |" in t
    assert set(S.OFF_TABLE) <= set(S.TYPES_OF) and not set(S.OFF_TABLE) & set(S.VARIANTS)


def _rec(tk: str, tv: str, measured: float, predicted: float) -> dict:
    return {"status": "ok", "time_utc": "2026-12-01T10:00:00Z",
            "environment": {"arch": "x86_64", "cpu_model": "AMD EPYC", "cpu_count_logical": 2, "machine_id": "epyc-vm",
                            "cpu_flags": "fpu avx avx2 avx512f", "system_info": "CPU : AVX2 = 1 |", "backends": ["CPU"],
                            "edgekv_commit": "c" * 40, "edgekv_dirty": False},
            "settings": {"n_depth": 2048, "type_k": tk, "type_v": tv, "n_threads": 2, "n_ubatch": 512},
            "speed": {"tg": {"mean_ts": measured}, "pp": {"mean_ts": 70.0}},
            "prediction": {"speed": {"tg": {"tokens_per_s": predicted, "calibration_id": "abc-1"},
                                     "pp": {"tokens_per_s": 70.0, "calibration_id": "abc-1"}}}}


def test_speed_model_keeps_the_latest_row_of_each_configuration(tmp_path, monkeypatch, capsys):
    """``--table-only``: a records folder becomes one row a configuration in <results>/speed_model/<class>.jsonl, the
    class read from the records; a later run replaces the rows of the configurations it measured, keeps the rest."""
    from bench import speed_model as S

    recs, results = tmp_path / "records", tmp_path / "results"
    recs.mkdir()
    (recs / "smollm2-135m-base.jsonl").write_text(json.dumps(_rec("f16", "f16", 50.0, 52.0)) + "\n")
    (recs / "smollm2-135m-t1.jsonl").write_text(json.dumps(_rec("q8_0", "q8_0", 30.0, 30.0)) + "\n")
    monkeypatch.setattr(sys, "argv", ["speed_model", "--table-only", "--out", str(recs), "--results", str(results)])
    assert S.main() == 0
    f = results / "speed_model" / "x86-avx512-epyc-2cpu.jsonl"
    first = [json.loads(x) for x in f.read_text().splitlines()]
    assert {(r["variant"], r["test"]) for r in first} == {("base", "tg"), ("base", "pp"), ("t1", "tg"), ("t1", "pp")}
    (recs / "smollm2-135m-t1.jsonl").unlink()
    (recs / "smollm2-135m-base.jsonl").write_text(json.dumps(_rec("f16", "f16", 40.0, 52.0)) + "\n")
    assert S.main() == 0
    rows = {(r["variant"], r["test"]): r for r in map(json.loads, f.read_text().splitlines())}
    assert len(rows) == 4 and rows[("base", "tg")]["measured"] == 40.0 and rows[("t1", "tg")]["measured"] == 30.0
    assert all((r["commit"], r["dirty"]) == ("c" * 40, False) for r in rows.values())   # the records' code, not ours
    assert "| `x86-avx512-epyc-2cpu` | decode (±10 %) | 1 of 2 |" in S.render(H.load("speed_model", results))
    assert "written:" in capsys.readouterr().out


def test_memory_model_rows_from_recorded_runs(tmp_path, monkeypatch):
    """``--table-only`` on recorded edgekv bench runs (the measured SmolLM2 runs in tests/data): one row a
    configuration with the measured and the predicted peak RSS, and the docs' table from them."""
    from bench import memory_model as M

    recs = tmp_path / "records"
    recs.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "memory_model-smollm2-135m-base.jsonl", recs / "smollm2-135m-base.jsonl")
    argv = ["memory_model", "--table-only", "--out", str(recs), "--results", str(tmp_path)]
    monkeypatch.setenv("EDGEKV_MACHINE_ID", "not-the-recording-host")
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="carry no CPU flags.*pass --machine"):    # made elsewhere: no class guessed
        M.main()
    monkeypatch.setattr(sys, "argv", [*argv, "--machine", "x86-avx512-epyc-2cpu"])
    assert M.main() == 0
    (cls, rows), = H.load("memory_model", tmp_path).items()
    assert cls == "x86-avx512-epyc-2cpu" and len(rows) >= 3
    assert all(r["measured"] > r["predicted"] * 0.9 and r["variant"] == "base" for r in rows)
    assert "| smollm2-135m |" in M.render({cls: rows})


@pytest.mark.parametrize("harness", HARNESSES)
def test_every_harness_answers_help(harness, monkeypatch, capsys):
    import importlib

    mod = importlib.import_module(f"bench.{harness}")
    monkeypatch.setattr(sys, "argv", [harness, "--help"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 0 and "--results" in capsys.readouterr().out


def test_bench_is_a_small_tool_set():
    """At most 8 harness scripts beside their shared module, bench/results at most 40 files and 3 MB, and no script
    in bench/ or tools/ over 600 lines (the package's own limit)."""
    scripts = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in ("__init__", "harness", "refresh"))
    assert scripts == sorted(HARNESSES) and len(scripts) <= 8
    files = [p for p in (ROOT / "bench" / "results").rglob("*") if p.is_file()]
    assert len(files) <= 40 and sum(p.stat().st_size for p in files) <= 3 * 1024 * 1024
    scripts = [p for d in ("bench", "tools") for p in sorted((ROOT / d).rglob("*.py"))
               if not any(x.startswith(".") for x in p.relative_to(ROOT).parts)]       # not bench/.build's sources
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in scripts if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600]
    assert not long, "split these:\n" + "\n".join(long)


def test_refresh_plans_every_harness_and_each_step_parses(monkeypatch, capsys):
    """``python -m bench.refresh --list``: one step per harness in bench/, each a command its harness's own parser
    takes, with the minutes it took on the slowest class measured (a quiet 2-core AVX2 EPYC), which the docs state;
    nothing is run."""
    from bench import refresh
    from tests.checks.test_readme_commands import _harnesses, parse_python_module

    harnesses = set(_harnesses()) - {"refresh"}
    assert {s.harness for s in refresh.PLAN} == harnesses
    total = sum(s.minutes for s in refresh.PLAN)
    assert all(s.minutes >= 1 for s in refresh.PLAN)
    for doc in ("bench/README.md", "docs/development.md", "bench/refresh.py"):
        assert f"about {total} minutes" in " ".join((ROOT / doc).read_text(encoding="utf-8").split()), doc
    monkeypatch.setattr(refresh.subprocess, "call", lambda *a, **k: pytest.fail("--list ran a harness"))
    assert refresh.main(["--list"]) == 0
    out = capsys.readouterr().out
    for s in refresh.PLAN:
        line = " ".join(["python", "-m", f"bench.{s.harness}", *s.args])
        assert line in out, (line, out)
        parse_python_module(f"bench.{s.harness}", [*s.args, "--machine", "x86-avx2-epyc-2cpu"], monkeypatch)


def test_refresh_files_every_harness_under_one_class_and_reports_failures(monkeypatch, capsys):
    from bench import refresh

    calls = []
    monkeypatch.setattr(refresh.subprocess, "call",
                        lambda argv, cwd: calls.append(argv) or (3 if "bench.first_run" in argv else 0))
    monkeypatch.setattr(refresh.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert refresh.main(["--machine", "x86-avx2-epyc-2cpu", "--only", "memory_model,first_run"]) == 1
    assert [c[2] for c in calls] == ["bench.memory_model", "bench.first_run"]
    assert all(c[-2:] == ["--machine", "x86-avx2-epyc-2cpu"] for c in calls)
    assert "failed: first_run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        refresh.main(["--only", "no_such_harness", "--list"])


# -- bench/explain_corpus.py: the corpus summed per backend --------------------------------------------------------


EC_LOGS = Path(__file__).parents[1] / "data" / "logs"


def test_harness_row_and_table_from_a_real_log():
    path = EC_LOGS / "cuda-rtx4070-qwen35-27b-partial-oom-b8586.log"
    row = EC.summarise(path.name, _explain_log(path))
    assert row["backend"] == "CUDA" and row["kv_lines"] == 1 and row["kv_exact"] == 1
    assert row["rs_lines"] == 1 and row["rs_exact"] == 1
    assert row["device_kv_lines"] == 2            # CPU 4608 + CUDA0 3584: one cache over two memories
    assert (row["device_kv_predicted"], row["device_kv_matching"]) == (2, 2)     # explain's kv_buffers.rows
    assert (row["kv_buffer_devices"], row["kv_buffer_predicted"], row["kv_buffer_exact"]) == (2, 2, 2)
    refused = EC.summarise("sycl-x.log", None, "sycl-x.log: no buffer line")
    table = EC.render({"m": [{**row, "time_utc": "t", "commit": "c"}, {**refused, "time_utc": "t", "commit": "c"}]})
    assert "| `CUDA` | 1 |  | 1 / 1 | 1 / 1 |" in table and "| `SYCL` | 1 | 1 |" in table
    assert "| 2 / 2 of 2 | 2 / 2 of 2 |" in table
    assert "**`all`**" in table


def test_harness_counts_a_wrong_kv_line():
    from edgekv.core.explain import explain_lines

    text = (EC_LOGS / "vulkan-gfx1151-qwen3-0.6b-b5398.log").read_text(encoding="utf-8")
    r = explain_lines("edited", text.replace("KV self size  =  448.00", "KV self size  =  449.00").splitlines())
    row = EC.summarise("vulkan-edited.log", r)
    assert (row["kv_lines"], row["kv_exact"]) == (1, 0)


def test_harness_counts_a_wrong_device_kv_line():
    """A per-device KV buffer line that differs from the layer split is predicted but not matching."""
    from edgekv.core.explain import explain_lines

    text = (EC_LOGS / "cuda-rtx4070-qwen35-27b-partial-oom-b8586.log").read_text(encoding="utf-8")
    edited = text.replace("CUDA0 KV buffer size =  3584.00 MiB", "CUDA0 KV buffer size =  3616.00 MiB")
    assert edited != text
    row = EC.summarise("cuda-edited.log", explain_lines("edited", edited.splitlines()))
    assert (row["device_kv_lines"], row["device_kv_predicted"], row["device_kv_matching"]) == (2, 2, 1)
    assert (row["kv_buffer_predicted"], row["kv_buffer_exact"]) == (2, 1)


def _explain_log(path):
    from edgekv.core.explain import explain_lines
    from edgekv.core.logconfig import read_bounded

    with open(path, "rb") as f:
        return explain_lines(path.name, read_bounded(f).lines)


def test_the_first_run_harness_times_a_fresh_home(monkeypatch, tmp_path):
    """bench.first_run times a first run: edgekv bench in an edgekv home of its own (no calibration, no model
    cached), deleted afterwards; --home reuses the one it names."""
    import argparse
    import os

    from bench import first_run

    seen = []

    def fake_run(cmd, **kw):
        home = kw["env"]["EDGEKV_HOME"]
        seen.append((home, os.listdir(home)))
        return argparse.Namespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(first_run.subprocess, "run", fake_run)
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "developer"))
    first_run.run(argparse.Namespace(full=False, extra=[], home=None))
    (home, listed), = seen
    assert home != str(tmp_path / "developer") and listed == [] and not os.path.exists(home)
    first_run.run(argparse.Namespace(full=False, extra=[], home=str(tmp_path)))
    assert seen[1][0] == str(tmp_path) and tmp_path.is_dir()


def test_a_harness_resumes_only_its_own_codes_records(monkeypatch, tmp_path):
    """The speed and memory harnesses keep their raw records per code commit: a refresh after a commit measures
    every configuration again instead of resuming rows an earlier edgekv measured."""
    from bench import harness as H

    ids = iter([{"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": False},
                {"commit": "b" * 40, "dirty": True}])
    monkeypatch.setattr(H, "identity", lambda: next(ids))
    dirs = [H.records_dir(tmp_path, "x86-avx2-epyc-2cpu") for _ in range(3)]
    assert [d.name for d in dirs] == ["a" * 12, "b" * 12, "b" * 12 + "-dirty"]
    assert all(d.parent == tmp_path / "x86-avx2-epyc-2cpu" for d in dirs)
    for mod in ("speed_model", "memory_model"):
        assert "H.records_dir(" in (H.ROOT / "bench" / f"{mod}.py").read_text(), mod
