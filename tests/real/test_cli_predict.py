"""`edgekv inspect` and `edgekv predict`: JSON contract, flags, errors, --engine, --budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from edgekv.cli.main import main
from edgekv.core.predict import MIB
from edgekv.records import results as R
from edgekv.records import schema as S

FORMULA_FIELDS = {"n_ctx", "n_ctx_padded", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max", "status",
                  "reason", "kv_bytes", "k_bytes", "v_bytes", "recurrent_bytes", "total_bytes", "caches",
                  "saving_vs_f16"}


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def records(capsys, *argv) -> list[S.Record]:
    """`edgekv predict ... --json` decoded strictly as the schema's records (a stray or missing key fails here)."""
    return [S.decode(x, f"predict --json [{i}]") for i, x in enumerate(run_json(capsys, *argv))]


def test_predict_default_model_json_contract(capsys, smollm2_path):
    raw = run_json(capsys, "predict", "-c", "4096,1000", "-ctk", "f16,q4_0")
    assert len(raw) == 4
    for r in raw:
        assert r["kind"] == "predict" and r["schema_version"] == S.SCHEMA_VERSION and r["config_key"] is None
        assert set(r["settings"]) == set(R.KEY_SETTINGS)             # every key setting, None where predict has none
        assert r["settings"]["engine"] is None and r["settings"]["n_threads"] is None
        assert Path(r["model"]["path"]) == smollm2_path and r["model"]["name"] == smollm2_path.stem   # the default
        assert r["model"]["arch"] == "llama"
        assert r["model"]["size_bytes"] > 0 and r["model"]["sha256"] is None
        assert r["prediction"]["formula"].keys() >= FORMULA_FIELDS and "engine" not in r["prediction"]
        assert r["status"] == r["prediction"]["formula"]["status"] == "ok"
        for c in r["prediction"]["formula"]["caches"]:
            assert {"kind", "cells", "layers", "k_bytes", "v_bytes"} <= c.keys()
    recs = [S.decode(x, "predict --json") for x in raw]
    assert [S.encode(x) for x in recs] == raw                      # typed and back: nothing lost, nothing added
    by = {(r.settings.n_ctx, r.settings.type_k): r.prediction.formula for r in recs}
    # SmolLM2: 30 layers x 3 KV heads x 64 dims, K and V
    assert by[(4096, "f16")].kv_bytes == 30 * 2 * 192 * 2 * 4096
    assert by[(4096, "q4_0")].kv_bytes == 30 * 2 * (192 // 32 * 18) * 4096
    assert by[(1000, "f16")].n_ctx_padded == 1024
    assert by[(4096, "q4_0")].saving_vs_f16 == pytest.approx(32 / 9, rel=1e-3)


def test_ctv_follows_ctk_pairwise_and_single_value(capsys, smollm2_header):
    recs = records(capsys, "predict", str(smollm2_header), "-c", "512", "-ctk", "q8_0,q4_0", "-ctv", "f16", "--kv-only")
    assert [(r.settings.type_k, r.settings.type_v) for r in recs] == [("q8_0", "f16"), ("q4_0", "f16")]
    recs = records(capsys, "predict", str(smollm2_header), "-c", "512", "-ctk", "q8_0,q4_0", "-ctv", "q8_0,q4_0",
                   "--kv-only")
    assert [(r.prediction.formula.type_k, r.prediction.formula.type_v) for r in recs] == [("q8_0", "q8_0"),
                                                                                          ("q4_0", "q4_0")]


@pytest.mark.slow
def test_invalid_combination_is_reported_not_crashed(capsys):
    (r,) = records(capsys, "predict", "-c", "4096", "-ctk", "q4_0", "-fa", "off")
    f = r.prediction.formula
    assert f.status == "invalid" and r.status == "skipped" and r.reason == f.reason
    assert "flash_attn" in f.reason
    assert f.kv_bytes is None and f.saving_vs_f16 is None
    assert r.prediction.process is None                            # never a partial sum


def test_swa_model_shows_two_caches(capsys, gemma3_header):
    caches = records(capsys, "predict", str(gemma3_header), "-c", "4096", "-ctk", "f16",
                     "--kv-only")[0].prediction.formula.caches
    assert [c.kind for c in caches] == ["full", "swa"]
    assert [c.layers for c in caches] == [3, 15]
    assert caches[1].cells == 1024      # PAD256(min(4096, 512 + 512))
    swa_full = records(capsys, "predict", str(gemma3_header), "-c", "4096", "-ctk", "f16", "--swa-full", "--kv-only")
    assert swa_full[0].prediction.formula.caches[1].cells == 4096
    assert swa_full[0].settings.swa_full is True


def test_engine_column_agrees(capsys, gemma3_path):
    recs = records(capsys, "predict", str(gemma3_path), "-c", "1000,8192", "-ctk", "f16,q8_0", "-np", "2", "--engine")
    for r in recs:
        e = r.prediction.engine
        assert e.ok and e.match, e.diffs
        assert e.compute_mib["CPU"] > 0
        assert e.total_bytes > r.model.size_bytes + r.prediction.formula.kv_bytes
        assert e.weights_bytes == r.model.size_bytes and r.settings.n_seq_max == 2


def test_kv_only_leaves_the_process_out_and_layers_go_in(capsys, smollm2_header):
    (r,) = records(capsys, "predict", str(smollm2_header), "-c", "512", "-ctk", "f16", "--kv-only", "--layers")
    assert r.prediction.process is msgspec.UNSET and r.prediction.engine is msgspec.UNSET      # not asked: absent
    assert len(r.prediction.formula.layers) == 30 and r.prediction.formula.layers[0]["k_bytes"] > 0


def test_budget_finds_largest_context(capsys, smollm2_path, tmp_path):
    out = run_json(capsys, "predict", str(smollm2_path), "-ctk", "f16,q4_0", "--budget", "300MiB")
    assert set(out) == {"predictions", "budget"}
    recs = [S.decode(x, "predictions") for x in out["predictions"]]      # 3 default contexts x 2 cache types
    assert len(recs) == 6 and {(r.kind, r.settings.type_k) for r in recs} == {("predict", "f16"), ("predict", "q4_0")}
    rows = {r["type_k"]: r for r in out["budget"]}
    f16, q4 = rows["f16"], rows["q4_0"]
    assert 0 < f16["max_n_ctx"] < q4["max_n_ctx"] <= 8192          # capped at the trained context
    for r in (f16, q4):
        assert r["max_n_ctx"] % 256 == 0
        assert r["total_bytes"] <= 300 * MIB
    # one step more for f16 must not fit: check with llama.cpp's own numbers through the CLI
    (nxt,) = records(capsys, "predict", str(smollm2_path), "-c", str(f16["max_n_ctx"] + 256), "-ctk", "f16", "--engine")
    assert nxt.prediction.engine.total_bytes > 300 * MIB
    # the --budget output loads in report like the plain list (the records; the budget answers no configuration)
    p = tmp_path / "budget.json"
    p.write_text(json.dumps(out))
    assert main(["report", str(p), "-o", str(tmp_path / "rep"), "--no-plots"]) == 0
    assert "f16" in (tmp_path / "rep" / "README.md").read_text()


def test_inspect_json(capsys, sparse_models):
    gemma3_path = sparse_models["gemma3"]          # the committed header at the real file's size
    d = run_json(capsys, "inspect", str(gemma3_path))
    assert d["shape"]["arch"] == "gemma3" and d["shape"]["memory"] == "iswa"
    assert d["layer_roles"]["full"] == [5, 11, 17]
    assert d["shape"]["n_swa"] == 512
    assert d["weights_bytes"] == sum(d["weights_by_type"].values())
    assert d["gguf"]["file_size"] == os.path.getsize(gemma3_path)


def test_tables_render(capsys, gemma3_header):
    gemma3_path = gemma3_header
    assert main(["predict", str(gemma3_path), "-c", "32768", "-ctk", "f16", "--layers", "--kv-only"]) == 0
    out = capsys.readouterr().out
    assert "111.00" in out and "Per layer" in out
    assert "Llama() defaults" in out and "576.00" in out     # swa_full + FA off would cost this
    assert main(["inspect", str(gemma3_path)]) == 0
    assert "Sliding window" in capsys.readouterr().out




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
def test_errors_are_one_line_with_exit_code(args, code, words, cli):
    r = cli(*args)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgekv: error:") and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_debug_env_shows_traceback():
    """A real process: what EDGEKV_DEBUG=1 prints when the exception leaves edgekv."""
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", "/no/such/model.gguf"], capture_output=True,
                       text=True, env={**os.environ, "EDGEKV_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_python_api_matches_cli(smollm2_header):
    import edgekv

    p = edgekv.predict(str(smollm2_header), n_ctx=32768, type_k="q8_0")
    d = edgekv.formula_block(p)
    assert d.type_v == "q8_0" and d.kv_bytes == 30 * 2 * (192 // 32 * 34) * 32768
    # the plain view the Python API has always had: the same block as JSON data
    plain = p.to_dict()
    assert plain["kv_bytes"] == d.kv_bytes and plain["caches"][0]["type_k"] == "q8_0"
    assert plain == msgspec.to_builtins(d)
