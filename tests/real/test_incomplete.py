"""Issue 27 point 5: a local file shorter than its header's tensor table (an interrupted download) is named: predict
warns with the bytes present and expected; bench and quality refuse it in one line.  predict --engine still runs
(llama.cpp's dry run reads no tensor data; the predicted reports' shape headers are such files) and warns.

The interrupted download is SmolLM2's header-only stand-in at the real size (tests/headers.py: its header without
the tokenizer's arrays, so 96.6 MB, not the real file's 98.4 MB) cut after 5 MB: what is read is its header and
size; the --engine case runs llama.cpp on the real file cut the same way (slow)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest


def _cut(src, tmp_path_factory):
    p = tmp_path_factory.mktemp("cut") / "SmolLM2-cut.gguf"
    with open(src, "rb") as f, open(p, "wb") as dst:
        dst.write(f.read(5_000_000))
    return p


@pytest.fixture(scope="module")
def cut_smollm2(sparse_models, tmp_path_factory):
    return _cut(sparse_models["smollm2"], tmp_path_factory)


@pytest.fixture(scope="module")
def cut_real_smollm2(smollm2_path, tmp_path_factory):
    """The real file cut after 5 MB: llama.cpp loads its tokenizer, which the stand-in has not."""
    return _cut(smollm2_path, tmp_path_factory)


def test_predict_names_the_missing_bytes_in_the_table_and_the_json(cli, cut_smollm2):
    r = cli("predict", str(cut_smollm2), "-c", "1024", "-ctk", "f16", "--kv-only")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())             # the table output wraps at the terminal width
    assert "only 5.0 MB of 96.6 MB present: tensor data missing" in out
    assert "the prediction uses the header only" in out
    r = cli("predict", str(cut_smollm2), "-c", "1024", "-ctk", "f16", "--kv-only", "--json")
    recs = json.loads(r.stdout)
    assert recs[0]["model"]["incomplete"].endswith("the prediction uses the header only")


@pytest.mark.parametrize("args,what", [
    (["bench", "-c", "512", "-ctk", "f16", "-p", "8", "-n", "4", "-r", "1"], "edgekv bench needs the whole file"),
    pytest.param(["quality", "-c", "256", "-ctk", "f16", "--chunks", "1"], "edgekv quality needs the whole file",
                 marks=pytest.mark.slow),            # quality's repack preflight (llama.cpp) comes first
])
def test_runs_that_need_the_weights_refuse_it_in_one_line(cli, cut_smollm2, args, what):
    r = cli(args[0], str(cut_smollm2), *args[1:])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "only 5.0 MB of 96.6 MB present" in lines[0] and what in lines[0]


def test_predict_engine_still_runs_on_it_and_warns(cli, cut_real_smollm2):
    r = cli("predict", str(cut_real_smollm2), "-c", "512", "-ctk", "f16", "--engine", "--kv-only")
    assert r.returncode == 0, r.stderr
    assert "only 5.0 MB of 98.4 MB present" in " ".join(r.stdout.split())


def test_complete_files_and_remote_header_caches_say_nothing(sparse_models, cut_smollm2):
    smollm2_path = sparse_models["smollm2"]
    from edgekv.prediction.api import load_model

    assert load_model(str(smollm2_path)).incomplete is None
    m = load_model(str(cut_smollm2))
    assert m.incomplete
    header_only = replace(m, ref=replace(m.ref, complete=False))      # a remote model's cached header
    assert header_only.incomplete is None


def test_bench_refuses_a_cut_tiny_model_in_one_line(tmp_path, capsys):
    """The refusal above without a real model: a tiny model cut in its tensor data, bench in-process (the fast tier
    holds it; nothing is measured, no child starts)."""
    from edgekv.cli.main import main
    from tools.record_replies import write_tiny_model

    whole = write_tiny_model(tmp_path / "tiny.gguf")
    cut = tmp_path / "tiny-cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert main(["bench", str(cut), "-c", "256", "-ctk", "f16", "-p", "8", "-n", "4", "-r", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "edgekv bench needs the whole file" in lines[0] and "present" in lines[0], lines
