"""`edgekv compare` and `edgekv merge` on real sweep records.

The candidates are built from the real samples of ``tests/data/smollm2-sweep.jsonl`` (SmolLM2 on a
busy 2-core machine): the same configuration, its decode samples scaled by a planted change, with
jitter of the size that record itself measured (its own coefficient of variation).  So the tests ask
what matters: does a 20% slowdown stand out of *this* noise, and does 1% stay inside it?  The procedure
is also checked over many seeds, and against records too noisy to tell a 20% change from chance.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from edgekv.errors import EnvironmentMismatch, ResultsError, UsageError
from edgekv.output.compare import compare_records, parse_thresholds
from edgekv.output.inputs import load_any
from edgekv.records import results as R
from edgekv.records import schema as S

FIXTURE = Path(__file__).parents[2] / "data" / "smollm2-sweep.jsonl"
THR = parse_thresholds(None)


@pytest.fixture(scope="module")
def records():
    return load_any(FIXTURE)


def replaced(rec, path, value):
    """A copy of a Record with one (nested) field replaced: ``replaced(rec, "memory.peak_rss_bytes", n)``."""
    head, _, rest = path.partition(".")
    return msgspec.structs.replace(rec, **{head: replaced(getattr(rec, head), rest, value) if rest else value})


def plain(records):
    """Records as the lines a results file holds."""
    return [S.encode(r) for r in records]


def cv(samples):
    m = sum(samples) / len(samples)
    return (sum((x - m) ** 2 for x in samples) / (len(samples) - 1)) ** 0.5 / m


def stable(records):
    """Configurations whose decode samples vary by less than 10% (pyperf's 'stable')."""
    return [r for r in records if cv(r.speed.tg.samples_ts) < 0.10]


def planted(rec, factor, seed=None, jitter=None):
    """The same configuration measured again, decode changed by ``factor`` (samples: real ones, scaled;
    with a seed, a fresh sample around the scaled mean with the record's own noise)."""
    xs = rec.speed.tg.samples_ts
    if seed is None:
        new = [x * factor for x in reversed(xs)]
    else:
        rng = random.Random(seed)
        m = sum(xs) / len(xs)
        sd = (jitter if jitter is not None else cv(xs)) * m
        new = [m * factor + rng.gauss(0.0, sd) for _ in xs]
    return replaced(rec, "speed.tg", msgspec.structs.replace(rec.speed.tg, samples_ts=new, mean_ts=sum(new) / len(new)))


def tg_result(res, rec):
    s = rec.settings
    for p in res["pairs"]:
        if p["settings"]["n_ctx"] == s.n_ctx and p["settings"]["type_k"] == s.type_k:
            return next(m for m in p["metrics"] if m["metric"] == "tg")
    raise AssertionError("configuration not paired")


def test_fixture_has_stable_and_noisy_configurations(records):
    assert len(stable(records)) >= 4
    assert any(cv(r.speed.tg.samples_ts) > 0.2 for r in records)


def test_planted_20pct_decode_slowdown_is_a_significant_regression(records):
    for rec in stable(records):
        res = compare_records([rec], [planted(rec, 0.80)], THR)
        m = tg_result(res, rec)
        assert m["test"] == "welch" and m["n_base"] == m["n_cand"] == len(rec.speed.tg.samples_ts)
        assert m["verdict"] == "worse" and m["regression"], m
        assert m["p_value"] < 0.01
        assert m["change"] == pytest.approx(-0.20, abs=1e-9)
        assert m["change_ci95"][0] < -0.20 < m["change_ci95"][1]
        assert res["exit_code"] == 1
        # the same change the other way is an improvement, not a failure
        up = compare_records([rec], [planted(rec, 1.25)], THR)
        assert tg_result(up, rec)["verdict"] == "better" and up["exit_code"] == 0


def test_1pct_change_stays_within_the_noise(records):
    for rec in stable(records):
        res = compare_records([rec], [planted(rec, 0.99)], THR)
        m = tg_result(res, rec)
        assert m["verdict"] == "not significant" and not m["regression"], m
        assert res["exit_code"] == 0


@pytest.mark.slow
def test_over_many_seeds(records):
    """With fresh noise of each record's own size (5 samples, cv 1.6-8.7%): a 20% slowdown is caught nearly always;
    a 1% one almost never fails the build (its sample mean must land beyond -5% by chance AND test significant)
    and is rarely even called worse (each test is at 5%, one-sided it is 2.5% plus a little power)."""
    for rec in stable(records):
        where = (rec.settings.n_ctx, rec.settings.type_k)
        caught = sum(compare_records([rec], [planted(rec, 0.80, seed=s)], THR)["exit_code"] == 1 for s in range(100))
        assert caught >= 90, (where, caught)
        res1 = [compare_records([rec], [planted(rec, 0.99, seed=s)], THR) for s in range(100)]
        assert sum(r["exit_code"] for r in res1) <= 3, where
        assert sum(tg_result(r, rec)["verdict"] == "worse" for r in res1) <= 15, where


def test_noise_decides_not_the_ratio_of_means(records):
    """A 20% drop on a record whose samples spread over ±80% is not evidence (a ratio of means would say -20%)."""
    noisy = max(records, key=lambda r: cv(r.speed.tg.samples_ts))
    assert cv(noisy.speed.tg.samples_ts) > 0.5
    m = tg_result(compare_records([noisy], [planted(noisy, 0.80)], THR), noisy)
    assert m["change"] == pytest.approx(-0.20) and m["verdict"] == "not significant" and not m["regression"]


def test_repeated_runs_are_pooled(records):
    rec = stable(records)[0]
    res = compare_records([rec, planted(rec, 1.0, seed=1)], [planted(rec, 0.8, seed=2), planted(rec, 0.8, seed=3)], THR)
    m = tg_result(res, rec)
    n = len(rec.speed.tg.samples_ts)
    assert m["n_base"] == m["n_cand"] == 2 * n
    rss = next(x for x in res["pairs"][0]["metrics"] if x["metric"] == "rss")
    assert rss["test"] == "welch" and rss["n_base"] == 2


def test_memory_by_threshold_and_kv_exactly(records):
    rec = stable(records)[0]
    more = replaced(rec, "memory.peak_rss_bytes", int(rec.memory.peak_rss_bytes * 1.05))
    m = next(x for x in compare_records([rec], [more], THR)["pairs"][0]["metrics"] if x["metric"] == "rss")
    assert m["test"].startswith("threshold only") and m["verdict"] == "worse" and m["regression"]
    slight = replaced(rec, "memory.peak_rss_bytes", int(rec.memory.peak_rss_bytes * 1.02))
    m = next(x for x in compare_records([rec], [slight], THR)["pairs"][0]["metrics"] if x["metric"] == "rss")
    assert m["verdict"] == "not significant" and not m["regression"]
    kv = replaced(rec, "llama_log.kv_mib", rec.llama_log.kv_mib + 0.25)
    res = compare_records([rec], [kv], THR)
    m = next(x for x in res["pairs"][0]["metrics"] if x["metric"] == "kv")
    assert m["test"] == "exact (deterministic)" and m["regression"] and res["exit_code"] == 1


def test_quality_by_z_test(records):
    rec = stable(records)[0]

    def q(kld, err):
        from tests.unit.output.test_report import real_quality_block

        block = real_quality_block()
        block["quality"].update({"kld_mean": kld, "kld_mean_err": err})
        return R.as_record({**S.encode(rec), "quality": block})      # encode, change, decode strictly
    m = next(x for x in compare_records([q(0.010, 0.0002)], [q(0.015, 0.0002)], THR)["pairs"][0]["metrics"]
             if x["metric"] == "kld")
    assert m["test"].startswith("z-test") and m["verdict"] == "worse" and m["regression"]
    m = next(x for x in compare_records([q(0.010, 0.002)], [q(0.0105, 0.002)], THR)["pairs"][0]["metrics"]
             if x["metric"] == "kld")
    assert m["verdict"] == "not significant"


def test_failed_in_candidate_is_a_regression(records):
    rec = stable(records)[0]
    failed = msgspec.structs.replace(rec, status="failed", reason="child killed by signal 9")
    res = compare_records([rec], [failed], THR)
    assert res["failed_in_cand"] and res["exit_code"] == 1


def test_refuses_other_environments_unless_forced(records):
    base = stable(records)[:2]
    cand = [replaced(r, "environment.llama_cpp_commit", "abc1234") for r in base]
    with pytest.raises(EnvironmentMismatch, match="llama_cpp_commit: '0c1e570' vs 'abc1234'"):
        compare_records(base, cand, THR)
    res = compare_records(base, cand, THR, force=True)
    assert res["forced"] and res["exit_code"] == 0 and len(res["pairs"]) == 2
    # another host: one machine on each side pairs, and the check names it
    other = [replaced(r, "environment.machine_id", "laptop") for r in base]
    with pytest.raises(EnvironmentMismatch, match="machine_id"):
        compare_records(base, other, THR)


def test_nothing_pairs_is_a_usage_error(records):
    other = replaced(records[0], "settings.n_threads", 1)
    with pytest.raises(UsageError, match="no configuration"):
        compare_records([records[0]], [other], THR)


def test_cli_exit_codes_and_markdown(records, tmp_path, cli):
    rec = stable(records)[0]
    base, slow, same, env = (tmp_path / f"{n}.jsonl" for n in ("base", "slow", "same", "env"))
    R.write_all(base, records)
    R.write_all(slow, (planted(r, 0.80) if r is rec else r for r in records))
    R.write_all(same, (planted(r, 0.99) for r in records))
    R.write_all(env, (replaced(r, "environment.cpu_model", "Apple M2") for r in records))
    r = cli("compare", str(base), str(slow))
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("## edgekv compare") and "🔴 **regression** (beyond 5%)" in r.stdout
    assert "| configuration | metric | BASE | CAND |" in r.stdout
    r = cli("compare", str(base), str(same), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["regressions"] == 0 and len(out["pairs"]) == len(records)
    r = cli("compare", str(base), str(env))
    assert r.returncode == 2 and "cpu_model: 'AMD EPYC' vs 'Apple M2'" in r.stderr and "--force" in r.stderr
    assert r.stderr.count("\n") == 1
    r = cli("compare", str(base), str(env), "--force")
    assert r.returncode == 0 and "Compared with --force although the environments differ" in r.stdout
    r = cli("compare", str(base), str(same), "--threshold", "tg=abc")
    assert r.returncode == 2 and "--threshold" in r.stderr
    r = cli("compare", str(base), str(same), "--threshold", "speed=5%")
    assert r.returncode == 2 and "METRIC=VALUE" in r.stderr


def lb_row(ts, commit="0c1e570"):
    """One row of llama-bench's -o json / -o jsonl output (its field names and types)."""
    return {"build_commit": commit, "build_number": 1, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU",
            "model_filename": "/m/SmolLM2.gguf", "model_type": "llama 135M Q4_1", "model_size": 96576768,
            "n_batch": 2048, "n_ubatch": 512, "n_threads": 2, "type_k": "q8_0", "type_v": "q8_0",
            "n_gpu_layers": 99, "flash_attn": True, "n_prompt": 0, "n_gen": 32, "n_depth": 0,
            "samples_ns": [1] * len(ts), "samples_ts": ts, "avg_ts": sum(ts) / len(ts)}


def test_llama_bench_files_compare(tmp_path, cli):
    row = lb_row
    a, b = tmp_path / "a.json", tmp_path / "b.jsonl"
    a.write_text(json.dumps([row([80.1, 81.0, 79.5, 80.7, 80.2])]))                       # -o json
    b.write_text(json.dumps(row([64.3, 63.9, 64.8, 64.1, 63.5])) + "\n")                  # -o jsonl
    r = cli("compare", str(a), str(b), "--json")
    assert r.returncode == 1, r.stderr
    m = json.loads(r.stdout)["pairs"][0]["metrics"][0]
    assert m["metric"] == "tg" and m["verdict"] == "worse" and m["regression"]
    b.write_text(json.dumps(row([64.3, 63.9, 64.8, 64.1, 63.5], commit="deadbee")) + "\n")
    assert cli("compare", str(a), str(b)).returncode == 2


# -- merge ------------------------------------------------------------------------------------------------

def test_merge_keeps_every_row_and_reports_a_device_column(records, tmp_path, cli):
    linux = tmp_path / "linux.jsonl"
    mac = tmp_path / "mac.jsonl"
    R.write_all(linux, records)
    macs = [replaced(r, "environment", msgspec.structs.replace(
        r.environment, machine_id="mac-mini", cpu_model="Apple M2", backends=["Metal", "CPU"], devices=["Apple M2"],
        os="Darwin 24.1.0")) for r in records[:4]]
    R.write_all(mac, macs)
    out = tmp_path / "all.jsonl"
    r = cli("merge", str(linux), str(mac), str(linux), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    merged = R.load_records(out)
    assert len(merged) == 2 * len(records) + len(macs)                 # every row, duplicates included
    assert [x.machine for x in merged].count("mac-mini") == len(macs)
    assert {x.machine for x in merged} == {"vm", "mac-mini"}
    info = json.loads(r.stdout)
    assert info["records"] == len(merged) and len(info["devices"]) == 2
    rep = tmp_path / "rep"
    assert cli("report", str(out), "-o", str(rep), "--no-plots").returncode == 0
    md = (rep / "README.md").read_text()
    assert "| device | n_ctx |" in md
    assert "mac-mini: Apple M2 (Metal+CPU)" in md and "vm: AMD EPYC (CPU)" in md
    assert "| | machine 1 | machine 2 |" in md.replace("|  |", "| |")
    # merging again is stable and the machine column is kept, not recomputed
    out2 = tmp_path / "again.jsonl"
    assert cli("merge", str(out), "-o", str(out2)).returncode == 0
    assert R.load_records(out2) == merged


# -- inputs: every accepted file comes back as typed Records ------------------------------------------------

DATA = Path(__file__).parents[2] / "data"
ROOT = Path(__file__).resolve().parents[3]
OLD_PREDICT = DATA / "predict-rows-old.json"     # the first rows of an earlier release's `edgekv predict --json --engine`


def test_every_input_kind_loads_as_records(records, tmp_path):
    """edgekv results, a JSON list of records (quality/predict --json), llama-bench -o json/jsonl and the prediction
    rows an earlier `predict --json` printed (a list, or {"predictions": [...]}): all typed Records."""
    from edgekv.output.inputs import load_many

    rows = json.loads(OLD_PREDICT.read_text())
    listed, wrapped, lb = tmp_path / "records.json", tmp_path / "wrapped.json", tmp_path / "lb.jsonl"
    listed.write_text(json.dumps(plain(records[:2])))
    wrapped.write_text(json.dumps({"predictions": rows}))
    lb.write_text(json.dumps(lb_row([80.1, 81.0, 79.5])) + "\n")
    for path, kind in ((FIXTURE, "bench"), (listed, "bench"), (OLD_PREDICT, "predict"), (wrapped, "predict"),
                       (lb, "llama-bench")):
        recs = load_any(path)
        assert recs and all(isinstance(r, S.Record) and r.kind == kind for r in recs), path
    assert load_any(listed) == records[:2]
    assert load_many([FIXTURE, listed]) == records + records[:2]
    preds = load_any(OLD_PREDICT)
    assert load_any(wrapped) == [msgspec.structs.replace(r, source_file=str(wrapped)) for r in preds]
    # today's predict --json: the records themselves (a list; under "predictions" beside a --budget answer)
    listed.write_text(json.dumps(plain(preds)))
    assert load_any(listed) == preds
    wrapped.write_text(json.dumps({"predictions": plain(preds), "budget": []}))
    assert load_any(wrapped) == preds
    assert len(preds) == len(rows) == 4
    for r, row in zip(preds, rows):
        f, eng = r.prediction.formula, r.prediction.engine
        assert (f.n_ctx, f.type_k, f.type_v, f.total_bytes, f.saving_vs_f16, len(f.caches)) == \
            (row["n_ctx"], row["type_k"], row["type_v"], row["total_bytes"], row["saving_vs_f16"], len(row["caches"]))
        assert (eng.match, eng.kv_mib, eng.compute_mib) == (row["engine"]["match"], row["engine"]["kv_mib"],
                                                             row["engine"]["compute_mib"])
        assert (r.settings.n_ctx, r.settings.type_k, r.settings.n_ubatch) == (row["n_ctx"], row["type_k"], row["n_ubatch"])
        assert r.settings.n_threads is None and r.settings.engine is None         # a prediction has no workload
        assert (r.model.path, r.model.arch, r.model.size_bytes) == (row["model"], row["arch"], row["weights_bytes"])
        assert r.status == "ok" and r.source_file == str(OLD_PREDICT) and S.encode_block(r.environment) == {}
    (b,) = load_any(lb)
    assert (b.settings.test, b.settings.engine, b.settings.type_k, b.settings.flash_attn, b.settings.repetitions) == \
        ("tg", "llama-bench", "q8_0", "on", 3)
    assert b.speed.tg.samples_ts == [80.1, 81.0, 79.5] and b.speed.tg.n_tokens == 32
    assert b.model.size_bytes == 96576768 and b.environment.llama_cpp_commit == "0c1e570"


def test_old_predict_rows_and_llama_bench_rows_are_read_strictly(tmp_path, cli):
    """An unknown or mistyped key in an old predict row or a llama-bench row refuses the file in one line naming
    the file, the row and the key (nothing is dropped or guessed)."""
    rows = json.loads(OLD_PREDICT.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([rows[0], {**rows[1], "label": "1M context"}]))
    with pytest.raises(ResultsError) as e:
        load_any(bad)
    assert str(e.value).startswith(f"{bad}: prediction 2: label: unknown key") and "\n" not in str(e.value)
    r = cli("merge", str(bad), "-o", str(tmp_path / "merged.jsonl"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "prediction 2: label: unknown key" in r.stderr
    assert not (tmp_path / "merged.jsonl").exists()
    bad.write_text(json.dumps([rows[0], {**rows[1], "total_bytes": "lots"}]))
    with pytest.raises(ResultsError, match=r"prediction 2: prediction\.formula\.total_bytes: expected int"):
        load_any(bad)
    lb = tmp_path / "lb.json"
    lb.write_text(json.dumps([lb_row([80.1, 81.0]), {**lb_row([80.0, 80.5]), "n_batch": "2048"}]))
    with pytest.raises(ResultsError, match=r"lb\.json: entry 2: settings\.n_batch: expected int"):
        load_any(lb)


@pytest.mark.parametrize("src,same_bytes", [
    (FIXTURE, True), (DATA / "cuda-h100-smollm2.jsonl", True),
    # rewritten in the schema's key order by bench/explain_reports.py on 27 Nov (before, the quality statistics
    # and the speed block had another order: same keys and values)
    (ROOT / "reports/smollm2-135m/sweep.jsonl", True), (ROOT / "reports/gemma3-270m/sweep.jsonl", True),
    ("reordered", False),      # the fixture with each record's keys in another order: same keys and values
], ids=lambda x: x.parent.name + "/" + x.name if isinstance(x, Path) else str(x))
def test_merge_writes_each_record_as_read_plus_its_machine(src, same_bytes, tmp_path):
    """Typed records change no figure of a merged file: each line is the input record (upgraded) with its machine
    appended, what merge wrote when it copied plain dicts; byte for byte where the input is in the schema's key
    order (edgekv writes it so since records are typed: S.encode is the one serialiser)."""
    from edgekv.output.inputs import merge_files

    if src == "reordered":
        src = tmp_path / "reordered.jsonl"
        src.write_text("".join(json.dumps(dict(reversed(json.loads(x).items()))) + "\n"
                               for x in FIXTURE.read_text().splitlines()))
    out = tmp_path / "merged.jsonl"
    lines = src.read_text().splitlines()
    recs = merge_files([src], out)
    want = []
    for i, line in enumerate(lines, 1):
        d = R.upgrade(json.loads(line), f"{src}:{i}")
        want.append({**d, "machine": d.get("machine") or d["environment"]["machine_id"]})
    got = out.read_text().splitlines()
    assert [json.loads(x) for x in got] == want                     # every key and value, nothing added or lost
    assert (got == [json.dumps(w) for w in want]) is same_bytes
    assert got == [json.dumps(S.encode(r)) for r in recs] and len(recs) == len(lines)
    assert all(isinstance(r, S.Record) and r.machine for r in recs)


# -- two commits of one file (schema 4's code identity) -------------------------------------------------------------

A, B = "3f32cba" + "0" * 33, "9e1c2d4" + "1" * 33


def at(records, commit, dirty=False):
    """The records as the edgekv commit ``commit`` wrote them."""
    return [msgspec.structs.replace(r, environment=msgspec.structs.replace(r.environment, edgekv_commit=commit,
                                                                           edgekv_dirty=dirty)) for r in records]


@pytest.fixture()
def two_commits(records, tmp_path):
    """One results file two commits appended to: B decodes one stable configuration 20 % slower."""
    rec = stable(records)[0]
    f = tmp_path / "both.jsonl"
    R.write_all(f, at(records, A) + at([planted(r, 0.80) if r is rec else r for r in records], B))
    return f


def test_compare_pairs_two_commits_of_one_file(records, two_commits):
    from edgekv.output.compare import compare, render_markdown

    res = compare(two_commits, None, baseline="3f32", candidate="9E1C2D4")        # prefixes, any case
    assert (res["base"], res["cand"]) == (f"{two_commits}@3f32cba", f"{two_commits}@9e1c2d4")
    assert res["base_code"] == ["3f32cba"] and res["cand_code"] == ["9e1c2d4"]
    assert len(res["pairs"]) == len(records) and res["regressions"] == 1
    assert "Code: BASE `3f32cba` → CAND `9e1c2d4`" in render_markdown(res)
    # --compare left out: the newest other commit of the file
    assert compare(two_commits, None, baseline=A)["cand"] == f"{two_commits}@9e1c2d4"
    # two files: each side filtered by its own commit
    assert compare(two_commits, two_commits, baseline="9e1c", candidate="3f32")["regressions"] == 0


def test_compare_names_the_code_of_each_side(records):
    res = compare_records(at(records, A, dirty=True), records, THR)
    assert res["base_code"] == ["3f32cba-dirty"] and res["cand_code"] == ["unknown"]


@pytest.mark.parametrize("args,message", [
    ({"baseline": "abcd"}, "--baseline abcd: no record of .* was written by that commit "
                           r"\(commits there: 3f32cba, 9e1c2d4, 3f32ddd-dirty\)"),
    ({"baseline": "3f32"}, "--baseline 3f32: ambiguous in .*, it matches 3f32cba00000, 3f32ddd22222; give more digits"),
    ({"baseline": "main"}, r"--baseline 'main': not a commit id \(4 to 40 hex digits"),
    ({"baseline": "3f32c", "candidate": "3f32cba"}, "name the same code"),
    ({"baseline": "3f32cba-dirty"}, "holds no record of 3f32cba with local changes"),
    ({"candidate": "3f32cba"}, "--compare COMMIT needs --baseline COMMIT"),
    ({}, r"give two results files \(BASE CAND\), or one with --baseline COMMIT"),
])
def test_commit_choice_refuses_in_one_line(records, two_commits, args, message):
    from edgekv.output.compare import compare

    recs = R.load_records(two_commits) + at(records[:1], "3f32ddd" + "2" * 33, dirty=True)
    R.write_all(two_commits, recs)
    with pytest.raises(UsageError, match=message) as e:
        compare(two_commits, None, **args)
    assert "\n" not in str(e.value)


def test_dirty_records_of_a_commit_are_asked_for_by_name(records, tmp_path):
    from edgekv.output.compare import compare

    f = tmp_path / "dirty.jsonl"
    R.write_all(f, at(records, A) + at(records, A, dirty=True))
    res = compare(f, None, baseline="3f32cba", candidate="3f32cba-dirty")
    assert (res["base_code"], res["cand_code"]) == (["3f32cba"], ["3f32cba-dirty"])
    assert compare(f, None, baseline="3f32cba")["cand_code"] == ["3f32cba-dirty"]
    with pytest.raises(UsageError, match="no record there names its commit"):
        compare(FIXTURE, None, baseline="3f32")


def test_cli_compares_two_commits_of_one_file(two_commits, cli):
    r = cli("compare", str(two_commits), "--baseline", "3f32cba", "--compare", "9e1c")
    assert r.returncode == 1, r.stderr
    assert "Code: BASE `3f32cba` → CAND `9e1c2d4`" in r.stdout and "🔴 **regression**" in r.stdout
    r = cli("compare", str(two_commits), "-b", "9e1c", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["cand_code"] == ["3f32cba"]
    r = cli("compare", str(two_commits), "-b", "abcdef")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--baseline abcdef: no record" in r.stderr
