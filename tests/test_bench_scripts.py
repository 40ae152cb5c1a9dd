"""The benchmark scripts in bench/ run end to end on tiny settings (pipeline checks: their figures are not
asserted against targets here; bench/README.md holds the measured ones).  Both compare edgekv with llama.cpp's
own tools built from the same vendored source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama_bin(llama_bench_exe) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    from llama_tools import tool

    for name in ("llama-perplexity", "llama-batched-bench", "llama-server"):
        tool(name)                    # same build tree: only the missing targets are built
    return llama_bench_exe.parent


def _run(script: str, args: list[str], bin_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGEKV_LLAMA_CPP_BIN": str(bin_dir)}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, env=env,
                       timeout=900, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r


def test_speed_script_against_llama_bench(llama_bin, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# bench\n\nbefore\n\n<!-- perf:begin -->\nold\n<!-- perf:end -->\n\nafter\n")
    out = tmp_path / "speed.json"
    _run("bench_vs_llama_bench.py", ["-c", "512", "-ctk", "f16,q4_0", "-p", "32", "-n", "8", "-r", "2", "-t", "2",
                                     "--rounds", "2", "--out", str(out), "--readme", str(readme)], llama_bin)
    res = json.loads(out.read_text())
    assert [(r["n_ctx"], r["type"], r["depth"]) for r in res["rows"]] == [(512, "f16", 480), (512, "q4_0", 480)]
    for r in res["rows"]:
        assert r["llama_bench_commit"] == "0c1e570"
        for k in ("pp", "tg"):
            x = r[k]
            assert len(x["edgekv"]) == len(x["llama_bench"]) == 4 and len(x["round_ratios"]) == 2
            assert x["ratio"] == pytest.approx(x["edgekv_mean"] / x["llama_bench_mean"]) and x["ratio_ci95"]
    assert 0 < res["summary"]["harness_share_of_case_wall"] < 1 and len(res["load1"]) == 8
    md = readme.read_text()
    assert md.startswith("# bench\n\nbefore\n\n<!-- perf:begin -->") and md.endswith("<!-- perf:end -->\n\nafter\n")
    assert "old" not in md and "| 512 | 480 | q4_0 | tg8 |" in md and "Harness share" in md


def test_quality_script_against_llama_perplexity(llama_bin, tmp_path):
    readme = tmp_path / "README.md"
    out = tmp_path / "quality.json"
    _run("quality_vs_perplexity.py", ["-c", "256", "--chunks", "2", "-ctk", "f16,q4_0", "-t", "2", "--no-plain",
                                      "--out", str(out), "--readme", str(readme)], llama_bin)
    res = json.loads(out.read_text())
    assert res["ok"], json.dumps(res["contexts"], indent=1)[-3000:]
    (ctx,) = res["contexts"]
    assert ctx["n_ctx"] == 256 and set(ctx["types"]) == {"f16", "q4_0"}
    md = readme.read_text()
    assert "<!-- quality:begin -->" in md and "### -c 256, 2 chunks" in md
    assert "base-logits file" in md and "MiB RSS" in md


def test_parallel_script_against_llama_batched_bench(llama_bin, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "parallel.json"
    _run("parallel_vs_batched_bench.py", ["--models", "smollm2-135m", "-ctk", "f16", "-npl", "1,2", "-c", "512", "-p",
                                          "32", "-n", "8", "-r", "2", "-t", "2", "--rounds", "1", "--out", str(out),
                                          "--readme", str(readme)], llama_bin)
    res = json.loads(out.read_text())
    assert [(r["type"], r["npl"]) for r in res["rows"]] == [("f16", 1), ("f16", 2)]
    for r in res["rows"]:
        for k in ("pp", "tg"):
            assert len(r[k]["edgekv"]) == len(r[k]["batched_bench"]) == 2
            assert r[k]["ratio"] == pytest.approx(r[k]["edgekv_mean"] / r[k]["batched_bench_mean"])
        assert r["kv_matches_formula"] and r["predicted_peak_rss_bytes"] > 0
    md = readme.read_text()
    assert "<!-- parallel:begin -->" in md and "| f16 | 2 |" in md and "Geometric mean of the ratios" in md


def test_serving_script_against_the_prediction_and_in_process(llama_bin, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "serving.json"
    _run("serving_accuracy.py", ["--models", "smollm2-135m", "--np", "1,2", "-c", "512", "-p", "32", "-n", "8", "-r",
                                 "2", "-t", "2", "--rounds", "1", "--out", str(out), "--readme", str(readme)], llama_bin)
    res = json.loads(out.read_text())
    assert [r["np"] for r in res["rows"]] == [1, 2]
    for r in res["rows"]:
        assert r["kv_match"] and r["server_predicted"] > 0 and r["server_tg"] > 0 and r["inproc_tg"] > 0
        assert r["tg_ratio"] == pytest.approx(r["server_tg"] / r["inproc_tg"]) and r["ttft_p50_s"] > 0
    md = readme.read_text()
    assert "<!-- serving:begin -->" in md and "Largest memory residual" in md


@pytest.mark.slow
def test_fuzz_script_runs_and_finds_no_crash(tmp_path):
    out = tmp_path / "fuzz.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_headers.py"), "--inputs", "400", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(out.read_text())
    assert res["inputs"] == 400 and res["crashes"] == 0 and sum(res["outcomes"].values()) == 400
    assert res["outcomes"].get("predict:ok", 0) > 0 and res["outcomes"].get("GGUFFormatError", 0) > 0


def test_speed_rounds_table_tells_a_miss_of_the_model_from_noise():
    """bench/speed_model.py --rounds: a configuration outside its target at the median of the rounds is the model's
    miss; one outside in a single round only is noise; the spreads and each round's calibration keys are shown."""
    sys.path.insert(0, str(ROOT / "bench"))
    import speed_model as S

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
    sys.path.insert(0, str(ROOT / "bench"))
    import speed_model as S

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
