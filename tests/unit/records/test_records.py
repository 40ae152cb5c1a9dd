"""The typed results schema (issue 17): strict loading, the committed JSON Schema, upgrades, DataFrame, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from edgekv.errors import ResultsError
from edgekv.records import results as R
from edgekv.records import schema as S

ROOT = Path(__file__).resolve().parents[3]
# every committed results file (bench/results/ holds the harnesses' result rows, not records: bench/harness.py)
COMMITTED = [ROOT / p for p in subprocess.run(["git", "ls-files", "*.jsonl", ":!bench/results"], cwd=ROOT,
                                              capture_output=True, text=True, check=True).stdout.split()]


def test_committed_json_schema_is_the_generated_one():
    assert S.SCHEMA_FILE.read_text() == S.schema_text(), "regenerate: edgekv.records.schema.write_schema_file()"


def test_every_committed_results_file_loads_strictly_and_validates_against_the_json_schema():
    assert len(COMMITTED) >= 10
    validator = jsonschema.Draft202012Validator(json.loads(S.SCHEMA_FILE.read_text()))
    n = 0
    for p in COMMITTED:
        recs = R.load_records(p)          # msgspec: upgrade, then strict decode
        assert recs and all(isinstance(r, S.Record) for r in recs)
        for i, line in enumerate(p.read_text().splitlines(), 1):
            up = R.upgrade(json.loads(line), f"{p}:{i}")
            errors = sorted(validator.iter_errors(up), key=str)
            assert not errors, f"{p}:{i}: {errors[0].message} at {list(errors[0].absolute_path)}"
            assert S.encode(S.decode(up, f"{p}:{i}")) == up      # one serialiser: the record comes back as written
            n += 1
    assert n >= 100


def test_real_v1_files_of_the_previous_release_upgrade_and_decode():
    # tests/data/v1: the measured reports' sweeps as the previous release wrote them (schema 1, commit 93ecc2e)
    files = sorted((ROOT / "tests" / "data" / "v1").glob("*.jsonl"))
    assert len(files) == 2
    for p in files:
        raw = [json.loads(x) for x in p.read_text().splitlines()]
        assert {r["schema_version"] for r in raw} == {1}
        recs = R.load_records(p)
        assert len(recs) == len(raw)
        for old, new in zip(raw, recs):
            assert new.schema_version == S.SCHEMA_VERSION and new.prediction.process is None
            assert new.model.sha256 == old["model"]["sha256"] and new.memory.peak_rss_bytes == old["memory"]["peak_rss_bytes"]


def _one_line(tmp_path, obj, name="r.jsonl") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(obj) + "\n")
    with pytest.raises(ResultsError) as e:
        R.load(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}:1: "), msg
    return msg


def _real() -> dict:
    return json.loads((ROOT / "tests" / "data" / "smollm2-sweep.jsonl").read_text().splitlines()[0])


def test_schema_version_alone_fails_at_load_in_one_line(tmp_path):
    msg = _one_line(tmp_path, {"schema_version": 1})
    # the v1 -> v2 upgrade runs first (on the plain dict), then strict decoding names the first missing key
    assert msg.endswith(": missing; not a complete edgekv record (re-run the bench, or remove the line)"), msg


def test_missing_unknown_and_mistyped_keys_name_the_key(tmp_path):
    r = _real()
    del r["settings"]["n_ctx"]
    assert ":1: settings.n_ctx: missing" in _one_line(tmp_path, r)
    r = _real()
    r["memory"]["peak_rss_mb"] = 1
    assert ":1: memory.peak_rss_mb: unknown key" in _one_line(tmp_path, r)
    r = _real()
    r["speed"]["tg"]["mean_ts"] = "fast"
    assert ":1: speed.tg.mean_ts: expected float | null, got str" in _one_line(tmp_path, r)
    r = _real()
    r["kind"] = "benchmark"
    assert ":1: kind: invalid enum value 'benchmark'" in _one_line(tmp_path, r)


def test_the_cli_says_it_in_one_line(tmp_path, cli):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"schema_version": 1}\n')
    out = cli("merge", p, "-o", tmp_path / "m.jsonl")
    assert out.returncode == 1
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"edgekv: error: {p}:1: ") and ": missing; " in err[0], out.stderr


@pytest.mark.slow
def test_bench_refuses_a_results_file_of_another_model(tmp_path):
    """A real bench of Gemma 3 270M onto a real SmolLM2 results file refuses before measuring (issue 17, point 7)."""
    out = tmp_path / "smollm2.jsonl"
    out.write_bytes((ROOT / "tests" / "data" / "smollm2-sweep.jsonl").read_bytes())
    before = out.read_bytes()
    p = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", "gemma3-270m", "-c", "512", "-p", "16", "-n", "4",
                        "-r", "1", "-t", "1", "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("edgekv: error: "), p.stderr
    smol = json.loads(before.splitlines()[0])["model"]
    assert f"{out} holds results of another model ({smol['name']}, sha256 {smol['sha256'][:12]}" in err[0]
    assert "Gemma" in err[0] and "--force" in err[0] and "-o" in err[0]
    assert out.read_bytes() == before


def test_force_accepts_another_model():
    from edgekv.sweep.run import check_resumable

    recs = R.load_records(ROOT / "tests" / "data" / "smollm2-sweep.jsonl")
    env = recs[0].environment
    with pytest.raises(ResultsError, match="another model"):
        check_resumable(recs, env, "0" * 64, Path("x.jsonl"), force=False, model_name="M")
    check_resumable(recs, env, "0" * 64, Path("x.jsonl"), force=True, model_name="M")
    check_resumable(recs, env, recs[0].model.sha256, Path("x.jsonl"), force=False)


def test_results_frame_of_a_real_committed_file():
    import edgekv
    from edgekv.records.frame import COLUMNS

    path = ROOT / "reports" / "smollm2-135m" / "sweep.jsonl"
    recs = edgekv.load_results(path)
    df = edgekv.results_frame(path)
    assert list(df.columns) == list(COLUMNS) and len(df) == len(recs) == len(path.read_text().splitlines())
    raw = [json.loads(x) for x in path.read_text().splitlines()]
    for (_, row), r in zip(df.iterrows(), raw):
        assert row["kv_bytes_formula"] == r["prediction"]["formula"]["total_bytes"]
        assert row["kv_mib_llamacpp"] == r["llama_log"]["kv_mib"]
        assert row["kv_mib_llamacpp_dryrun"] == r["prediction"]["engine"]["kv_mib"]
        assert row["peak_rss_bytes_measured"] == r["memory"]["peak_rss_bytes"]
        assert row["tg_tokens_per_s_mean"] == r["speed"]["tg"]["mean_ts"]
        assert row["type_k"] == r["settings"]["type_k"] and row["n_ctx"] == r["settings"]["n_ctx"]
        mem = r["memory"]
        growth = mem["anon_after_context_bytes"] - mem["anon_after_load_bytes"]
        assert row["context_anon_growth_bytes_measured"] == growth
        assert row["context_anon_growth_minus_formula_bytes"] == growth - r["prediction"]["formula"]["total_bytes"]
        # savings need the f16 record of the same configuration (here: same context and depth)
        f16 = next(x for x in raw if x["settings"]["type_k"] == "f16" and x["settings"]["n_ctx"] == r["settings"]["n_ctx"])
        assert row["kv_saving_vs_f16_formula"] == \
            f16["prediction"]["formula"]["total_bytes"] / r["prediction"]["formula"]["total_bytes"]
        assert row["peak_rss_saving_vs_f16_measured"] == f16["memory"]["peak_rss_bytes"] / mem["peak_rss_bytes"]
        assert row["tg_n_samples"] == len(r["speed"]["tg"]["samples_ts"]) and row["quality_status"] == r["quality"]["status"]
    assert str(df["peak_rss_bytes_measured"].dtype) == "Int64"
    both = edgekv.results_frame([path, ROOT / "tests" / "data" / "cuda-h100" / "smollm2-135m.jsonl"])
    assert len(both) == len(df) + len(edgekv.load_results(ROOT / "tests" / "data" / "cuda-h100" / "smollm2-135m.jsonl"))
    assert both["peak_gpu_bytes_measured"].notna().sum() > 0 and df["peak_gpu_bytes_measured"].isna().all()


def test_predict_json_prints_predict_records_that_load_and_merge(tmp_path, smollm2_path):
    """Real `edgekv predict --json --engine` (llama.cpp's dry run beside the formula) prints kind-predict Records:
    they decode strictly, write and read back byte for byte, and give the DataFrame the formula's bytes."""
    out = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str(smollm2_path), "-c", "512,4096",
                          "-ctk", "f16,q4_0", "--engine", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    raw = json.loads(out.stdout)
    recs = [S.decode(x, f"stdout:{i}") for i, x in enumerate(raw, 1)]
    assert all(r.prediction.process.peak_rss_bytes for r in recs)
    assert len(recs) == 4 and all(r.kind == "predict" and r.prediction.engine.match for r in recs)
    assert all(r.schema_version == S.SCHEMA_VERSION and set(S.encode(r)["settings"]) == set(R.KEY_SETTINGS) for r in recs)
    p = tmp_path / "pred.jsonl"
    R.write_all(p, recs)
    assert [S.encode(x) for x in R.load_records(p)] == raw
    assert edgekv_frame_kv(p) == [r.prediction.formula.total_bytes for r in recs]


def edgekv_frame_kv(p):
    import edgekv

    return list(edgekv.results_frame(p)["kv_bytes_formula"])


def test_quality_json_rows_are_records_that_load_like_bench_records(tmp_path, smollm2_path):
    """A real `edgekv quality --json` pass: kind-quality records with schema_version, model sha256 and settings."""
    import edgekv

    out = subprocess.run([sys.executable, "-m", "edgekv.cli", "quality", str(smollm2_path), "-c", "128", "--chunks", "1",
                          "-ctk", "f16,q8_0", "-t", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    recs = json.loads(out.stdout)
    assert [(r["kind"], r["schema_version"], r["settings"]["type_k"]) for r in recs] == \
        [("quality", S.SCHEMA_VERSION, "f16"), ("quality", S.SCHEMA_VERSION, "q8_0")]
    p = tmp_path / "q.jsonl"
    R.write_all(p, [R.as_record(r) for r in recs])         # checked against the schema on the way out
    typed = R.load_records(p)
    assert typed[0].model.sha256 and typed[1].quality.quality.kld_mean > 0 and typed[0].quality.pass_.n_vocab > 0
    df = edgekv.results_frame(p)
    assert list(df["quality_status"]) == ["ok", "ok"] and df["kld_mean"].iloc[1] == recs[1]["quality"]["quality"]["kld_mean"]
    assert df["kv_bytes_formula"].isna().all()            # nothing predicted in a quality record


def test_one_engine_serialiser_matches_what_predict_prints(smollm2_path, gemma3_path):
    """crosscheck.engine_block, the one serialiser of llama.cpp's dry run that sweep and predict --engine both call, on real
    llama.cpp dry runs: the formula matches, and only predict's call (with the weights) adds the process total."""
    from edgekv.core.predict import ContextParams, predict
    from edgekv.prediction.api import load_model
    from edgekv.prediction.crosscheck import engine_block
    from edgekv.runtime.engine import EngineSession

    for path in (smollm2_path, gemma3_path):
        m = load_model(str(path))
        cfgs = [ContextParams(n_ctx=1024), ContextParams(n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn="on")]
        with EngineSession(m.ref.path, header=m.header) as eng:
            results = eng.run(cfgs)
        for c, res in zip(cfgs, results):
            p = predict(m.shape, c)
            new = engine_block(p, res, m.weights_bytes)
            assert res.ok and new["match"] is True and new["kv_mib"] > 0
            assert new["total_bytes"] > new["kv_mib"] * 2**20 and new["total_caches_from"] == "formula"
            sweep_style = engine_block(p, res)
            assert "total_bytes" not in sweep_style and sweep_style["caches"] == new["caches"]


def test_environment_is_typed_and_unknown_keys_go_to_extra():
    """A collected environment: the keys edgekv knows become typed fields, anything else lands in ``extra`` (named,
    never dropped); a record's environment with an unknown key at the top refuses in one line."""
    env = S.environment({"cpu_model": "X", "ram_bytes": 1, "nvidia": {"driver": "1", "devices": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85 << 30}]}, "thermal_state": "nominal"})
    assert env.cpu_model == "X" and env.nvidia.devices[0].name == "NVIDIA H100 80GB HBM3"
    assert env.extra == {"thermal_state": "nominal"} and S.encode_block(env)["extra"] == {"thermal_state": "nominal"}
    r = _real()
    r["environment"]["gpus"] = []
    with pytest.raises(ResultsError, match=r":1: environment.gpus: unknown key"):
        R.load(_write(r))


def _write(obj) -> Path:
    import tempfile

    p = Path(tempfile.mkdtemp()) / "r.jsonl"
    p.write_text(json.dumps(obj) + "\n")
    return p


def test_each_kind_is_its_own_type_and_a_bench_record_requires_its_blocks():
    recs = R.load_records(ROOT / "tests" / "data" / "smollm2-sweep.jsonl")
    assert all(type(r) is S.BenchRecord and r.kind == "bench" for r in recs)
    r = {**_real(), "schema_version": S.SCHEMA_VERSION}      # no upgrade step adds a prediction block to it
    del r["prediction"]
    with pytest.raises(ResultsError, match=r":1: prediction: missing in a bench record; not a complete edgekv record"):
        R.load(_write(r))
    r = _real()
    del r["model"]["arch"]
    with pytest.raises(ResultsError, match=r":1: model.arch: missing in a bench record"):
        R.load(_write(r))


# -- schema 4: the code identity ------------------------------------------------------------------------------

def test_a_v3_record_upgrades_to_v4_with_its_commit_unknown_and_its_interval_on_the_logarithm():
    """A v3 record names no commit: it loads with none (absent, shown as ``unknown``), nothing guessed.  Its speed
    tests' 95 % interval is recomputed from the samples: an old linear one (below zero here) becomes the positive
    interval edgekv computes today, so the report's frame no longer has to mend it."""
    from edgekv.core.stats import summarize
    from edgekv.records.frame import code_label, frame_rows

    r = {**_real(), "schema_version": 3}
    r["prediction"] = {**r["prediction"], "process": None, "speed": None}
    xs = [31.0, 2.0, 60.0, 45.0, 17.0]
    r["speed"]["tg"] = {**r["speed"]["tg"], "samples_ts": xs, "ci95_ts": [-3.6, 65.6]}
    (rec,) = R.load_records(_write(r))
    assert rec.schema_version == S.SCHEMA_VERSION
    assert rec.environment.edgekv_commit is S.UNSET and code_label(rec) == "unknown"
    assert rec.speed.tg.ci95_ts == summarize(xs)["ci95"] and rec.speed.tg.ci95_ts[0] > 0
    assert rec.speed.pp.ci95_ts == summarize(rec.speed.pp.samples_ts)["ci95"]
    (row,) = frame_rows([rec])
    assert row["tg_tokens_per_s_ci95_low"] == rec.speed.tg.ci95_ts[0] and row["edgekv_commit"] is None
    # a v4 record is read as written: its interval is not recomputed
    v4 = {**r, "schema_version": 4, "speed": {**r["speed"], "tg": {**r["speed"]["tg"], "ci95_ts": [1.0, 2.0]}}}
    v4["environment"] = {**v4["environment"], "edgekv_commit": "3f32cba" + "0" * 33, "edgekv_dirty": True}
    (rec4,) = R.load_records(_write(v4))
    assert rec4.speed.tg.ci95_ts == [1.0, 2.0] and code_label(rec4) == "3f32cba-dirty"
    assert frame_rows([rec4])[0]["edgekv_commit"] == "3f32cba" + "0" * 33 and frame_rows([rec4])[0]["edgekv_dirty"]


def test_a_v4_record_upgrades_to_v5_and_a_far_miss_block_round_trips():
    """Schema 5 (issue 68) adds prediction.speed.far_miss and .adjusted: a v4 record loads without them, and a record
    that carries them reads back as written (strictly: a typo in them is refused)."""
    r = {**_real(), "schema_version": 4}
    (rec,) = R.load_records(_write(r))
    assert rec.schema_version == S.SCHEMA_VERSION == 5
    adj = {"action": "scaled", "test": "tg", "factor": 7.24, "config_key": "k", "note": "tg measured ..."}
    speed = {"calibration_id": "c", "far_miss": adj, "adjusted": [adj]}
    v5 = {**_real(), "prediction": {**_real()["prediction"], "speed": speed}}
    (rec5,) = R.load_records(_write(v5))
    assert rec5.prediction.speed.far_miss.factor == 7.24 and rec5.prediction.speed.adjusted[0].action == "scaled"
    bad = {**v5, "prediction": {**v5["prediction"], "speed": {**speed, "far_miss": {**adj, "facter": 1}}}}
    with pytest.raises(ResultsError, match="facter"):
        R.load_records(_write(bad))


def test_the_collected_environment_carries_this_checkouts_commit():
    """edgekv's own code identity goes into every collected environment (bench, quality): the checkout's HEAD and
    whether edgekv/ has local changes, typed in the record's environment."""
    from edgekv.machine.codeid import code_identity
    from edgekv.machine.environment import host_side

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    env = S.environment(host_side())
    assert env.edgekv_commit == code_identity().commit == head and len(head) == 40
    assert env.edgekv_dirty is code_identity().dirty and isinstance(env.edgekv_dirty, bool)
    enc = S.encode_block(env)
    assert list(enc)[:3] == ["edgekv", "edgekv_commit", "edgekv_dirty"]
