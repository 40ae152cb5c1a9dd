"""`edgekv bench -npl`: N sequences decoded at once (llama-batched-bench's workload) on the real SmolLM2, their
records, report and comparison, the flags it refuses, and llama-batched-bench itself on the same settings."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from edgekv.core.predict import MIB, ContextParams, predict
from edgekv.prediction.api import load_model
from edgekv.records import results as R
from edgekv.sweep.run import run_sweep
from edgekv.sweep.spec import sweep_spec

TINY = {"n_prompt": 32, "n_gen": 8, "repetitions": 2, "n_threads": 2}


@pytest.fixture(scope="module")
def npl_run(smollm2_path, tmp_path_factory):
    m = load_model(str(smollm2_path))
    out = tmp_path_factory.mktemp("npl") / "r.jsonl"
    a = run_sweep(sweep_spec(model=m, contexts=[1024], pairs=[("f16", "f16")], n_parallel=[1, 3], **TINY), output=out)
    b = run_sweep(sweep_spec(model=m, contexts=[1024], pairs=[("f16", "f16")], n_parallel=[2], kv_unified=True, **TINY),
                  output=out)
    assert not a.interrupted and not b.interrupted
    return m, out, b.lines


def test_each_record_runs_its_sequences_at_once(npl_run):
    m, _out, recs = npl_run
    assert [(r["settings"]["n_parallel"], r["settings"]["kv_unified"]) for r in recs] == [(1, False), (3, False), (2, True)]
    for r in recs:
        s, sp = r["settings"], r["speed"]
        k = s["n_parallel"]
        assert r["status"] == "ok", r.get("reason")
        assert s["n_seq_max"] == k and r["effective"]["n_seq_max"] == k and s["n_depth"] == 0
        # aggregate: every sequence's prompt and generated tokens per sample; each sequence's own decode rate beside it
        assert sp["pp"]["n_tokens"] == k * 32 and sp["tg"]["n_tokens"] == k * 8 and sp["tg_seq"]["n_tokens"] == 8
        assert len(sp["tg"]["samples_ns"]) == 2 and sp["tg"]["samples_ns"] == sp["tg_seq"]["samples_ns"]
        assert sp["tg_seq"]["mean_ts"] == pytest.approx(sp["tg"]["mean_ts"] / k, rel=1e-9)
        # llama.cpp's cache for N streams (or one unified stream) is the formula's, byte for byte
        assert r["differences"]["llama_kv_matches_formula"], r["differences"].get("llama_kv_diffs")
        f = predict(m.shape, ContextParams(n_ctx=1024, n_seq_max=k, kv_unified=s["kv_unified"]))
        assert r["prediction"]["formula"]["total_bytes"] == f.total_bytes
        # the whole process for that -np, before the run: within 3 % and 8 MiB of the measured peak
        res = r["memory_residual"]
        assert abs(res["peak_rss_pct"]) <= 3 and abs(res["peak_rss_bytes"]) <= 8 * MIB, res
        # the suite measures no speed calibration here (EDGEKV_SPEED_CALIBRATE=cached): -npl's speed is predicted
        # like any configuration's, and without a calibration the record says why not (tests/unit/core/test_speed.py predicts it)
        assert r["prediction"]["speed"]["calibration_id"] is None and "EDGEKV_SPEED_CALIBRATE=cached" in \
            r["prediction"]["speed"]["error"]
        assert "-np" in r["llama_cpp_args"] and r["llama_cpp_args"][r["llama_cpp_args"].index("-np") + 1] == str(k)
    # three streams of PAD256(1024 // 3) = 512 cells: llama.cpp's context is 1536 cells
    assert recs[1]["effective"]["n_ctx"] == 1536 and recs[1]["effective"]["n_ctx_seq"] == 512
    assert len({r["config_key"] for r in recs}) == 3


def test_the_sequence_count_is_a_key_setting(npl_run, smollm2_path):
    _m, _out, recs = npl_run
    one = dict(recs[0]["settings"])
    sha = recs[0]["model"]["sha256"]
    assert R.config_key(sha, one) == recs[0]["config_key"]
    del one["n_parallel"]                  # the one-sequence workload at depth 0 is another measurement
    assert R.config_key(sha, one) != recs[0]["config_key"]


def test_report_and_compare_carry_the_sequence_count(npl_run, tmp_path):
    from edgekv.output.compare import compare
    from edgekv.output.render import render_csv
    from edgekv.output.report import build

    _m, out, recs = npl_run
    doc = build(R.load(out), title="npl", plots=False)
    rows = list(__import__("csv").DictReader(render_csv(doc).splitlines()))
    assert [int(r["n_parallel"]) for r in rows] == [1, 2, 3]
    assert [int(r["tg_n_tokens"]) for r in rows] == [8, 16, 24]
    assert all(float(r["tg_seq_ts_mean"]) > 0 for r in rows)
    res = compare(out, out)
    assert len(res["pairs"]) == 3


@pytest.mark.parametrize("args, needle", [
    (["-npl", "2", "-d", "100"], "-d does not apply with -npl"),
    (["-npl", "8", "-c", "256", "-p", "32", "-n", "8"], "-npl 8 with -p 32 -n 8 needs 320 cells, more than -c 256"),
    (["-npl", "300"], "at most 256 sequences"),
    (["-npl", "0"], "-npl"),
])
def test_flags_it_refuses(cli, args, needle, tmp_path):
    rc, _, err = cli("bench", *args, "-o", tmp_path / "r.jsonl")
    assert rc == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()


def test_llama_batched_bench_runs_the_same_workload(npl_run, smollm2_path):
    """The comparison script's llama-batched-bench side on the same settings as the npl 3 record: its jsonl rows
    parse, one per repetition, with the same sequence count and tokens (bench/parallel_vs_batched_bench.py)."""
    from tools import llama_tools as pvb
    from tools.llama_tools import tool

    exe = tool("llama-batched-bench")
    args = type("A", (), {"c": 1024, "b": 2048, "ub": 512, "p": 32, "n": 8, "r": 2, "fa": "auto", "t": 2,
                          "libs": "python"})()
    res = pvb.run_batched_bench(exe, str(smollm2_path), args, "f16", 3)
    assert len(res["pp"]) == 2 and all(x > 0 for x in res["pp"] + res["tg"])
    argv = pvb.batched_bench_argv(exe, str(smollm2_path), args, "f16", 3)
    p = subprocess.run(argv, capture_output=True, text=True, env=pvb.llama_bench_env(exe, "python"), timeout=300)
    rows = pvb.parse_jsonl(p.stdout)
    assert [(r["pl"], r["pp"], r["tg"], r["n_kv"]) for r in rows] == [(3, 32, 8, 3 * 40)] * 2
    assert json.dumps(rows)            # plain JSON values, as the script stores them
    assert os.path.isfile(exe)
