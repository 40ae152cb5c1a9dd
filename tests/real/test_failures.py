"""Issue 25, points 4 and 5: a child that dies says where and why; exit statuses a CI job can trust.

Real children die here (a signal sent to them mid-phase, a deadline); the AMX crash itself happens only on some Intel
Xeons, so its recognition is tested on the recorded load log and crash transcript (tests/data/amx/)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from edgekv.core.diagnose import diagnose, exit_status
from edgekv.prediction.api import load_model
from edgekv.sweep.run import run_sweep
from edgekv.sweep.spec import sweep_spec

TINY = {"n_prompt": 32, "n_gen": 8, "repetitions": 1, "n_threads": 2}
AMX_LOG = Path(__file__).parents[1] / "data" / "amx" / "amx-load-SmolLM2-135M-Instruct.Q4_1-amx-on.log"


def _sweep_killing(smollm2_path, tmp_path, sig: int, phase: str, depth: int = 448):
    """A real sweep of two configurations whose first child gets ``sig`` when it announces ``phase``."""
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512], pairs=[("f16", "f16"), ("q8_0", "q8_0")], depths=[depth], **TINY)
    state = {"case": -1, "pid": None}

    def on_event(kind, data):
        if kind == "case":
            state["case"] = data["i"]
        elif kind == "child" and data.get("event") == "spawned":
            state["pid"] = data["pid"]
        elif kind == "child" and data.get("phase") == phase and state["case"] == 0 and state["pid"]:
            os.kill(state["pid"], sig)
            state["pid"] = None

    return run_sweep(spec, output=tmp_path / "f.jsonl", on_event=on_event).lines


def test_a_child_killed_while_filling_names_phase_signal_and_llama_cpp_lines(smollm2_path, tmp_path):
    recs = _sweep_killing(smollm2_path, tmp_path, signal.SIGKILL, "fill")
    assert [r["status"] for r in recs] == ["failed", "ok"]          # the sweep goes on
    f = recs[0]["failure"]
    assert f["phase"] == "prompt at depth" and f["signal"] == "SIGKILL" and not f["timed_out"]
    assert f["cause"] is None                  # SIGKILL without the kernel's OOM count is not called an OOM kill
    assert any("llama_context" in x or "llama_kv_cache" in x or "sched_reserve" in x for x in f["log_tail"]), f
    assert recs[0]["reason"].startswith("died with SIGKILL in prompt at depth")
    assert "out of memory" not in recs[0]["reason"]


def test_a_segfault_while_filling_without_an_amx_buffer_is_not_called_the_amx_crash(smollm2_path, tmp_path):
    recs = _sweep_killing(smollm2_path, tmp_path, signal.SIGSEGV, "fill")
    f = recs[0]["failure"]
    assert f["signal"] == "SIGSEGV" and f["phase"] == "prompt at depth" and f["cause"] is None
    assert "last llama.cpp line:" in recs[0]["reason"] or f["last_error"]


def test_the_recorded_amx_crash_is_recognised():
    lines = [x for x in AMX_LOG.read_text().splitlines() if x.strip()]
    d = diagnose("fill", "SIGSEGV", None, False, lines[-8:], n_prompt=512, load_log=lines)
    assert d.cause == "amx-crash" and "llama.cpp #20824" in d.line() and "--repack 0" in d.line()
    assert d.line().startswith("died with SIGSEGV in prompt at depth: llama.cpp's AMX kernels crash on this CPU")
    # generation runs 1-token batches, which work there: a segfault then is something else
    assert diagnose("tg", "SIGSEGV", None, False, lines[-8:], n_prompt=512, load_log=lines).cause is None
    # llama-bench fills its depth with prompt batches in its generation test too
    assert diagnose("llama-bench tg", "SIGSEGV", None, False, [], load_log=lines, multi_token=True).cause == "amx-crash"
    assert diagnose("fill", "SIGKILL", None, False, [], oom_kills_rose=True).cause == "oom-kill"
    assert diagnose("load", None, None, True, []).line() == "timed out in load: stopped at the --timeout deadline"


def test_oom_kills_are_read_from_the_kernels_counters(tmp_path):
    from edgekv.runtime.sampler import oom_kill_count

    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "vmstat").write_text("pgfault 10\noom_kill 3\npgmajfault 1\n")
    (proc / "self" / "cgroup").write_text("0::/ci/job\n")
    (cg / "ci" / "job").mkdir(parents=True)
    (cg / "ci" / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert oom_kill_count(str(proc), str(cg)) == 5
    (proc / "vmstat").write_text("pgfault 10\n")
    (cg / "ci" / "job" / "memory.events").unlink()
    assert oom_kill_count(str(proc), str(cg)) is None          # no counter: no claim


@pytest.mark.parametrize("statuses,ok_total,code", [
    (["ok", "ok"], 2, 0), (["ok", "failed"], 1, 1), (["skipped", "ok"], 1, 0), (["skipped"], 0, 1),
    ([], 3, 0),                      # everything resumed from the file, all measured
    ([], 0, 1), (["failed"], 5, 1),
])
def test_exit_status_rules(statuses, ok_total, code):
    assert exit_status(statuses, ok_total)[0] == code


def test_bench_exits_1_with_one_line_when_a_configuration_fails(smollm2_path, tmp_path, capsys):
    from edgekv.cli.main import main
    from edgekv.records import results as R

    out = tmp_path / "t.jsonl"
    code = main(["bench", str(smollm2_path), "-c", "1024", "-ctk", "f16", "-d", "896", "-p", "128", "-n", "32", "-r", "5",
                 "-t", "2", "--timeout", "1", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    rec = R.load(out)[0]
    assert rec["status"] == "failed" and rec["failure"]["timed_out"] and rec["failure"]["cause"] == "timeout"
    line = next(x for x in err.splitlines() if x.startswith("edgekv: 1 of 1 configuration failed"))
    # where it stopped is the phase the child last reported (on a busy machine it may not have reported one
    # within the second): the line says what the record says, either way
    phase = rec["failure"]["phase"]
    assert (f"timed out in {phase}" if phase else "timed out: stopped at the --timeout deadline") in line
    assert line.endswith("; exit 1")


def test_bench_exits_1_when_nothing_was_measured(smollm2_path, tmp_path, capsys):
    from edgekv.cli.main import main

    code = main(["bench", str(smollm2_path), "-c", "512", "-ctk", "q4_0", "-fa", "off", "-p", "32", "-n", "8", "-r", "1",
                 "-o", str(tmp_path / "s.jsonl")])
    assert code == 1
    assert "edgekv: nothing was measured (1 configuration skipped)" in capsys.readouterr().err


def test_quality_exits_1_when_nothing_was_measured(smollm2_path, capsys):
    from edgekv.cli.main import main

    code = main(["quality", str(smollm2_path), "-c", "256", "-ctk", "q4_0", "-fa", "off", "--chunks", "1"])
    assert code == 1
    assert "edgekv: nothing was measured (1 configuration skipped)" in capsys.readouterr().err


def test_readers_take_the_newest_record_per_configuration(tmp_path):
    """Issue 27 point 8: a rerun appends a retried configuration's new record after the failed one (history stays in
    the file) and readers take the newest per configuration.  The sweep's retry itself is proven on replayed runs
    (tests/unit/sweep/test_replay.py)."""
    import json

    from edgekv.output.inputs import load_any

    lines = (Path(__file__).parents[1] / "data" / "smollm2-sweep.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    failed = {**first, "status": "failed", "reason": "the child was killed by SIGKILL"}
    out = tmp_path / "f.jsonl"
    out.write_text("\n".join([json.dumps(failed), lines[0], lines[1]]) + "\n")
    latest = load_any(out)
    assert [r.status for r in latest] == ["ok", "ok"]
    assert latest[0].config_key == first["config_key"]
    out.write_text("\n".join([lines[0], json.dumps(failed), lines[1]]) + "\n")
    assert [r.status for r in load_any(out)] == ["failed", "ok"]         # and the newest is the newest, not the ok one


def test_a_context_llama_cpp_refused_shows_no_kv_mismatch_mark():
    """Issue 27: a refused context showed `KV llama.cpp 0.00 ✗`, a mismatch mark where llama.cpp allocated nothing."""
    import json

    from edgekv.output.benchview import _summary_row
    from edgekv.records import results as R

    src = Path(__file__).parents[1] / "data" / "smollm2-sweep.jsonl"
    raw = json.loads(src.read_text().splitlines()[0])
    raw.update(status="skipped", reason="llama.cpp refused the context: failed to allocate buffer")
    raw["llama_log"] = {**raw["llama_log"], "kv": [], "kv_mib": 0.0}
    raw["differences"] = {**raw["differences"], "llama_kv_matches_formula": False}
    row = _summary_row(R.as_record(raw, "refused"), narrow=False, with_gpu=False, with_quality=False)
    assert row[4] == "-" and row[5] == "-"
    ok = _summary_row(R.as_record(json.loads(src.read_text().splitlines()[0]), "ok"), False, False, False)
    assert ok[4] != "-" and "✓" in ok[5]
