"""`edgekv inspect` and `edgekv predict`: JSON contract, flags, errors, --engine, --budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgekv.cli.main import main
from edgekv.core.predict import MIB

REQUIRED_FIELDS = {"n_ctx", "n_ctx_padded", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max", "status",
                   "reason", "kv_bytes", "k_bytes", "v_bytes", "recurrent_bytes", "weights_bytes", "caches"}


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_default_model_json_contract(capsys):
    rows = run_json(capsys, "predict", "-c", "4096,1000", "-ctk", "f16,q4_0")
    assert len(rows) == 4
    for r in rows:
        assert r.keys() >= REQUIRED_FIELDS
        assert r["status"] == "ok"
        for c in r["caches"]:
            assert {"kind", "cells", "layers", "k_bytes", "v_bytes"} <= c.keys()
    by = {(r["n_ctx"], r["type_k"]): r for r in rows}
    # SmolLM2: 30 layers x 3 KV heads x 64 dims, K and V
    assert by[(4096, "f16")]["kv_bytes"] == 30 * 2 * 192 * 2 * 4096
    assert by[(4096, "q4_0")]["kv_bytes"] == 30 * 2 * (192 // 32 * 18) * 4096
    assert by[(1000, "f16")]["n_ctx_padded"] == 1024
    assert by[(4096, "q4_0")]["saving_vs_f16"] == pytest.approx(32 / 9, rel=1e-3)


def test_ctv_follows_ctk_pairwise_and_single_value(capsys):
    rows = run_json(capsys, "predict", "-c", "512", "-ctk", "q8_0,q4_0", "-ctv", "f16")
    assert [(r["type_k"], r["type_v"]) for r in rows] == [("q8_0", "f16"), ("q4_0", "f16")]
    rows = run_json(capsys, "predict", "-c", "512", "-ctk", "q8_0,q4_0", "-ctv", "q8_0,q4_0")
    assert [(r["type_k"], r["type_v"]) for r in rows] == [("q8_0", "q8_0"), ("q4_0", "q4_0")]


def test_invalid_combination_is_reported_not_crashed(capsys):
    rows = run_json(capsys, "predict", "-c", "4096", "-ctk", "q4_0", "-fa", "off")
    assert rows[0]["status"] == "invalid"
    assert "flash_attn" in rows[0]["reason"]
    assert rows[0]["kv_bytes"] is None


def test_swa_model_shows_two_caches(capsys, gemma3_path):
    rows = run_json(capsys, "predict", str(gemma3_path), "-c", "4096", "-ctk", "f16")
    caches = rows[0]["caches"]
    assert [c["kind"] for c in caches] == ["full", "swa"]
    assert [c["layers"] for c in caches] == [3, 15]
    assert caches[1]["cells"] == 1024      # PAD256(min(4096, 512 + 512))
    swa_full = run_json(capsys, "predict", str(gemma3_path), "-c", "4096", "-ctk", "f16", "--swa-full")
    assert swa_full[0]["caches"][1]["cells"] == 4096


def test_engine_column_agrees(capsys, gemma3_path):
    rows = run_json(capsys, "predict", str(gemma3_path), "-c", "1000,8192", "-ctk", "f16,q8_0", "-np", "2", "--engine")
    for r in rows:
        e = r["engine"]
        assert e["ok"] and e["match"], e["diffs"]
        assert e["compute_mib"]["CPU"] > 0
        assert e["total_bytes"] > r["weights_bytes"] + r["kv_bytes"]


def test_budget_finds_largest_context(capsys, smollm2_path):
    out = run_json(capsys, "predict", str(smollm2_path), "-ctk", "f16,q4_0", "--budget", "300MiB")
    rows = {r["type_k"]: r for r in out["budget"]}
    f16, q4 = rows["f16"], rows["q4_0"]
    assert 0 < f16["max_n_ctx"] < q4["max_n_ctx"] <= 8192          # capped at the trained context
    for r in (f16, q4):
        assert r["max_n_ctx"] % 256 == 0
        assert r["total_bytes"] <= 300 * MIB
    # one step more for f16 must not fit: check with llama.cpp's own numbers through the CLI
    nxt = run_json(capsys, "predict", str(smollm2_path), "-c", str(f16["max_n_ctx"] + 256), "-ctk", "f16", "--engine")
    assert nxt[0]["engine"]["total_bytes"] > 300 * MIB


def test_inspect_json(capsys, gemma3_path):
    d = run_json(capsys, "inspect", str(gemma3_path))
    assert d["shape"]["arch"] == "gemma3" and d["shape"]["memory"] == "iswa"
    assert d["layer_roles"]["full"] == [5, 11, 17]
    assert d["shape"]["n_swa"] == 512
    assert d["weights_bytes"] == sum(d["weights_by_type"].values())
    assert d["gguf"]["file_size"] == os.path.getsize(gemma3_path)


def test_tables_render(capsys, gemma3_path):
    assert main(["predict", str(gemma3_path), "-c", "32768", "-ctk", "f16", "--layers"]) == 0
    out = capsys.readouterr().out
    assert "111.00" in out and "Per layer" in out
    assert "Llama() defaults" in out and "576.00" in out     # swa_full + FA off would cost this
    assert main(["inspect", str(gemma3_path)]) == 0
    assert "Sliding window" in capsys.readouterr().out


def _edgekv(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "edgekv.cli", *args], capture_output=True, text=True, env=e)


@pytest.mark.parametrize("args, code, words", [
    (["predict", "/no/such/model.gguf"], 1, "no such file"),
    (["predict", "-ctk", "q3_0"], 2, "-ctk"),
    (["predict", "-c", "0"], 2, "-c/--ctx-size"),
    (["predict", "-c", "-5"], 2, "ctx-size"),
    (["predict", "--budget", "lots"], 2, "--budget"),
    (["predict", "-np", "0"], 2, "-np"),
    (["predict", "--no-such-flag"], 2, "--no-such-flag"),
    (["inspect", __file__], 1, "not a GGUF file"),
])
def test_errors_are_one_line_with_exit_code(args, code, words):
    r = _edgekv(*args)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgekv: error:") and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_debug_env_shows_traceback():
    r = _edgekv("predict", "/no/such/model.gguf", env={"EDGEKV_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_python_api_matches_cli(smollm2_path):
    import edgekv

    p = edgekv.predict(str(smollm2_path), n_ctx=32768, type_k="q8_0")
    d = p.to_dict()
    assert d["type_v"] == "q8_0" and d["kv_bytes"] == 30 * 2 * (192 // 32 * 34) * 32768
