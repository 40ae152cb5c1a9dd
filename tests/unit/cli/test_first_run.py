"""Issue 19: the first command answers in minutes, says how long, and is honest about a busy machine."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from edgekv.cli.main import main
from edgekv.core.stats import summarize
from edgekv.output.compare import compare_records, parse_thresholds, render_markdown
from edgekv.output.inputs import load_any
from edgekv.records import schema as S
from edgekv.sweep import plan as P

DATA = Path(__file__).parents[2] / "data"
FIXTURE = DATA / "smollm2-sweep.jsonl"
THR = parse_thresholds(None)


@pytest.fixture(scope="module")
def records():
    """The fixture's records as plain dicts (the lines of the file): the consumers decode what they are handed."""
    return [S.encode(r) for r in load_any(FIXTURE)]


def load_block(busy: bool, share: float) -> dict:
    """A ``load`` block of the shape edgekv.machine.load.LoadMonitor.stop writes (its windows left empty: test data)."""
    return {"cpus": 2, "before": {}, "during": {}, "threshold_share": 0.1, "busy": busy, "others_share_max": share}


# -- point 7: an interval for a rate is never negative -------------------------------------------------------

def test_rate_interval_stays_positive_on_the_record_that_went_below_zero(records):
    xs = next(r["speed"]["tg"]["samples_ts"] for r in records
              if r["settings"]["n_ctx"] == 2048 and r["settings"]["type_k"] == "f16")
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    assert m - 2.776 * sd / len(xs) ** 0.5 < 0.5, "the linear interval of this record reaches (about) zero"
    s = summarize(xs)
    lo, hi = s["ci95"]
    assert 0 < lo < s["mean"] < hi
    assert summarize([31.0, 2.0, 60.0, 45.0, 17.0])["ci95"][0] > 0


def test_interval_of_steady_samples_is_nearly_the_linear_one():
    xs = [100.0, 101.0, 99.0, 100.5, 99.5]
    lo, hi = summarize(xs)["ci95"]
    assert lo == pytest.approx(98.98, abs=0.05) and hi == pytest.approx(101.0, abs=0.05)


# -- point 7: -ctx is not read as -c tx -----------------------------------------------------------------------

def test_ctx_typo_is_refused_with_the_right_flag(capsys):
    assert main(["predict", "-ctx", "4096"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-ctx: no such option" in err and "--ctx-size" in err and "'tx'" not in err
    assert main(["bench", "-ctx=2048"]) == 2
    assert "-ctx: no such option" in capsys.readouterr().err


# -- point 7: one rule for default contexts -------------------------------------------------------------------

def test_predict_default_contexts_are_the_models_and_within_its_trained_context(capsys, smollm2_path):
    from edgekv.prediction.api import load_model, registry_sweep_defaults

    assert main(["predict", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ctxs = sorted({r["settings"]["n_ctx"] for r in rows})
    full = P.model_contexts(load_model(None).shape.n_ctx_train, registry_sweep_defaults(None).contexts)
    assert ctxs == sorted(full) == [2048, 4096, 8192]
    assert max(ctxs) <= load_model(None).shape.n_ctx_train
    # a plain path (no models.toml entry): 4K/16K/32K within the trained context (8K): the trained context rule
    assert main(["predict", str(smollm2_path), "--json"]) == 0
    assert sorted({r["settings"]["n_ctx"] for r in json.loads(capsys.readouterr().out)}) == [2048, 4096, 8192]
    assert P.quick_contexts(8192) == [1024, 2048] and P.quick_contexts(1024) == [512, 1024]
    assert P.model_contexts(131072) == [4096, 16384, 32768]


# -- point 7: 80 columns ---------------------------------------------------------------------------------------

def _render(records, width):
    from rich.console import Console

    from edgekv.output.benchview import render_summary

    buf = io.StringIO()
    render_summary(Console(file=buf, width=width, highlight=False, color_system=None), records, "/tmp/out.jsonl")
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 100])
def test_bench_summary_fits_the_terminal(records, width):
    recs = copy.deepcopy(records)
    recs[0]["load"] = load_block(True, 0.43)
    out = _render(recs, width)
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= width
    assert "busy 43%" in out and "other processes used" in out
    for r in recs:   # every configuration's figures are there
        assert f"{r['speed']['tg']['mean_ts']:.1f}" in out


def test_predict_table_fits_80_columns(smollm2_path, cli):
    out = cli("predict", smollm2_path, "--engine", "-c", "2048", env={"COLUMNS": "80"}).stdout
    assert "…" not in out and max(len(x) for x in out.splitlines()) <= 80, out
    assert "45.00" in out and "✓" in out


# -- point 7: the report's column is not called "error" ----------------------------------------------------------

def test_report_names_the_buffers_beside_the_kv(records, tmp_path):
    from edgekv.output.report import write_report

    write_report(records, str(tmp_path / "r"), plots=False)
    md = (tmp_path / "r" / "README.md").read_text()
    assert "| error |" not in md and "beside the KV, % of KV" in md and "not an error of the" in md


# -- point 4: busy rows in compare -----------------------------------------------------------------------------

def _slower(rec, factor):
    r = copy.deepcopy(rec)
    r["speed"]["tg"]["samples_ts"] = [x * factor for x in reversed(rec["speed"]["tg"]["samples_ts"])]
    r["speed"]["tg"]["mean_ts"] = rec["speed"]["tg"]["mean_ts"] * factor
    return r


def test_compare_refuses_significance_on_busy_rows_unless_forced(records):
    rec = min(records, key=lambda r: r["speed"]["tg"]["cv"])
    cand = _slower(rec, 0.7)
    quiet = compare_records([rec], [cand], THR)
    assert quiet["exit_code"] == 1
    cand["load"] = load_block(True, 0.5)
    busy = compare_records([rec], [cand], THR)
    tg = next(m for m in busy["pairs"][0]["metrics"] if m["metric"] == "tg")
    assert tg["refused"] == "busy machine" and tg["verdict"] == "not significant" and not tg["regression"]
    assert busy["exit_code"] == 0
    md = render_markdown(busy)
    assert "busy machine (CAND): not judged" in md
    kv = next(m for m in busy["pairs"][0]["metrics"] if m["metric"] == "kv")
    assert "refused" not in kv, "memory is not affected by load"
    forced = compare_records([rec], [cand], THR, force=True)
    tgf = next(m for m in forced["pairs"][0]["metrics"] if m["metric"] == "tg")
    assert tgf["regression"] and forced["exit_code"] == 1 and "⚠️ busy machine (CAND)" in render_markdown(forced)


# -- point 4: the load sampler sees other work --------------------------------------------------------------------

@pytest.mark.slow
def test_load_monitor_sees_a_busy_loop(tmp_path):
    from edgekv.machine.load import LoadMonitor

    m = LoadMonitor(before_s=0.2)
    m.start()
    # another process (not a child of this one) spinning until it has used 2 s of CPU, however busy the machine is,
    # then saying so in a file: started detached through a parent that exits at once
    done = tmp_path / "spun"
    p = subprocess.Popen([sys.executable, "-c", "import os,sys,time\nif os.fork(): os._exit(0)\n"
                          "while time.process_time() < 2.0: pass\nopen(sys.argv[1], 'w').close()", str(done)])
    p.wait()
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists(), "the spinning process never finished"
    load = m.stop()
    assert load["during"]["others_cpu_s"] >= 1.5, load
    assert load["busy"] and load["others_share_max"] >= 0.10


def test_a_window_too_short_for_the_os_clock_has_no_share(monkeypatch):
    """A configuration llama.cpp refuses at once closes its window within milliseconds, where one 10 ms tick of the
    OS's CPU time read as several cores: such a window has no share and does not make the record busy."""
    from edgekv.machine import load

    ticks = iter([100.0, 100.01])
    monkeypatch.setattr(load, "_busy_cpu_s", lambda: next(ticks))
    monkeypatch.setattr(load, "_own_cpu_s", lambda: 0.0)
    w = load.Window()
    got = w.close()
    assert "others_share" not in got and got["others_cpu_s"] == pytest.approx(0.01)
    m = load.LoadMonitor(before_s=0.0)
    m.before, m.window = got, None
    assert m.stop()["busy"] is False


# -- points 2/3: plan and ETA --------------------------------------------------------------------------------------

def test_cost_model_tracks_the_reference_sweep():
    """The prior reproduces the wall time of the committed SmolLM2 sweep it was fitted to within 15 % in total."""
    from edgekv.records import results as R

    recs = R.load_records(Path(__file__).parents[3] / "reports/smollm2-135m/sweep.jsonl")
    pred = sum(P.prior_seconds(r.settings, 98_362_432, 23_040) for r in recs)
    real = sum(r.timing.wall_s for r in recs)
    assert abs(pred - real) / real < 0.15
    # calibration: after one configuration of each type the estimate of the others is within 25 %
    pl = P.Planner(98_362_432, 23_040)
    for r in recs[:4]:
        pl.learn(r.settings, r.timing.wall_s)
    rest = recs[4:]
    est = pl.remaining(r.settings for r in rest)
    act = sum(r.timing.wall_s for r in rest)
    assert abs(est - act) / act < 0.25, (est, act)


def test_eta_accuracy_reads_the_plan_blocks():
    """Typed records (their ``plan`` blocks as the schema's type); a record without one is left out."""
    base = load_any(FIXTURE)[:3]

    def plan(eta: float, elapsed: float, left: int) -> S.Plan:
        return S.Plan(estimate_s=None, wall_s=50.0, sweep_elapsed_s=elapsed, remaining_eta_s=eta, remaining_configs=left,
                      sweep_estimate_s=100.0, basis="x")

    recs = [msgspec.structs.replace(base[0], plan=plan(60.0, 50.0, 1)), base[1],
            msgspec.structs.replace(base[2], plan=plan(0.0, 110.0, 0))]
    rows = P.eta_accuracy(recs)
    assert [r["after"] for r in rows] == [0, 1] and rows[0]["estimated_s"] == 100.0 and rows[0]["basis"] == "x"
    assert rows[0]["actual_s"] == 110 and rows[1]["actual_s"] == 60 and rows[1]["error"] == 0
    assert P.eta_accuracy(base) == []


def test_same_machine_history_reads_typed_records(tmp_path):
    """Typed records: a bench record of this model and environment, ok, not busy and with a wall time; an absent or
    None ``load`` is not busy, an absent or None ``timing`` has no wall time; a dict environment is refused."""
    base = [S.encode(r) for r in load_any(FIXTURE)]
    env = S.environment(base[0]["environment"])
    changes = {"plain": {}, "busy": {"load": load_block(True, 0.5)}, "quiet": {"load": load_block(False, 0.0)},
               "load None": {"load": None}, "timing None": {"timing": None}, "failed": {"status": "failed"},
               "other machine": {"environment": {**base[0]["environment"], "cpu_model": "other"}},
               "other model": {"model": {**base[0]["model"], "sha256": "other"}}}
    lines = [{**base[i], "config_key": key, **ch} for i, (key, ch) in enumerate(changes.items())]
    lines.append({k: v for k, v in {**base[0], "config_key": "no timing"}.items() if k != "timing"})
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    hist = P.same_machine_history(tmp_path / "out.jsonl", tmp_path / "runs", base[0]["model"]["sha256"], env)
    assert [r.config_key for r in hist] == ["plain", "quiet", "load None"]
    with pytest.raises(TypeError):
        P.same_machine_history(tmp_path / "out.jsonl", tmp_path / "runs", None, base[0]["environment"])


def test_case_done_attaches_typed_load_and_plan_blocks():
    """The tracker sets ``load`` (edgekv.machine.load's dict, converted) and ``plan`` as the schema's blocks; they encode
    to the keys, values and order the dicts had."""
    class Monitor:
        def stop(self) -> dict:
            return {"cpus": 2, "before": {"wall_s": 0.5, "others_cpu_s": 0.0, "others_cores": 0.0, "others_share": 0.0,
                                          "loadavg_1m": 0.2},
                    "during": {"wall_s": 3.25, "others_cpu_s": 0.5, "others_cores": 0.154, "others_share": 0.077,
                               "loadavg_1m_max": None},
                    "threshold_share": 0.1, "busy": False, "others_share_max": 0.077}

    rec = load_any(FIXTURE)[0]
    rec = msgspec.structs.replace(rec, timing=None)       # no timing: the wall time is the load window's
    t = object.__new__(P.SweepTracker)
    t.planner, t.todo, t.case_estimate, t.monitor = P.Planner(98_362_432, 23_040), [rec.settings], 4.04, Monitor()
    t.planner.initial_total_s, t.planner.basis = 10.0, "b"
    wall, _elapsed, remaining = t.case_done(rec, 0)
    assert wall == 3.25 and remaining == 0 and t.monitor is None
    assert isinstance(rec.load, S.Load) and isinstance(rec.plan, S.Plan)
    # a float, as the schema says, even when nothing is left (an int 0 read back as 0.0: not the same record)
    assert isinstance(rec.plan.remaining_eta_s, float) and json.dumps(S.encode(rec)["plan"]["remaining_eta_s"]) == "0.0"
    assert json.dumps(S.encode(rec)["load"]) == json.dumps(Monitor().stop())
    plan = S.encode(rec)["plan"]
    assert list(plan) == ["estimate_s", "wall_s", "sweep_elapsed_s", "remaining_eta_s", "remaining_configs",
                          "sweep_estimate_s", "basis"]
    assert {k: v for k, v in plan.items() if k != "sweep_elapsed_s"} == {
        "estimate_s": 4.0, "wall_s": 3.2, "remaining_eta_s": 0, "remaining_configs": 0, "sweep_estimate_s": 10.0,
        "basis": "b"}

def test_bench_plan_and_plain_lines_without_a_terminal(tmp_path, smollm2_path):
    """A real (tiny) sweep, stdout piped: the plan (count, estimate, results path) comes before the first
    configuration, then one line per configuration; the records carry the load and plan blocks."""
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "COLUMNS": "80"}
    p = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", "-c", "512", "-ctk", "f16,q8_0", "-p", "32",
                        "-n", "8", "-r", "2", "-o", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Plan: 2 configurations (f16, q8_0 x 512; -p 32 -n 8 -r 2")
    assert lines[1].startswith("Estimated time: ") and lines[2] == f"Results: {out}"
    done = [x for x in lines if x.startswith(("[1/2] ", "[2/2] "))]
    assert len(done) == 2 and "tg " in done[0] and "about " in done[0] and "elapsed" in done[1]
    assert lines.index(done[0]) > 2
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    for r in recs:
        assert set(r["load"]) >= {"cpus", "before", "during", "busy", "others_share_max"}
        assert r["plan"]["estimate_s"] > 0 and r["plan"]["sweep_elapsed_s"] > 0
    assert recs[-1]["plan"]["remaining_eta_s"] == 0
    # bench's default is the quick sweep; --full is the models.toml one
    h = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200"}).stdout
    assert "--full" in h


def test_report_marks_busy_rows(records, tmp_path):
    from edgekv.output.report import write_report

    recs = copy.deepcopy(records)
    for r in recs:
        r["load"] = load_block(False, 0.02)
    recs[1]["load"] = load_block(True, 0.43)
    write_report(recs, str(tmp_path / "r"), plots=False)
    md = (tmp_path / "r" / "README.md").read_text()
    speed = md[md.index("Speed, measured"):]
    assert speed.count("⚠️ busy (43.0% of the CPUs to other work)") == 1 and speed.count("| quiet |") == len(recs) - 1
    html = (tmp_path / "r" / "report.html").read_text()
    assert "busy (43.0% of the CPUs" in html
