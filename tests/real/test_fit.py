"""Issue 27 points 1 and 2: the memory available now, read from the OS (cgroup limits included), and bench refusing
to start a configuration whose predicted peak does not fit it, before anything loads."""

from __future__ import annotations

import subprocess
import sys
import time

from edgekv.core.fit import MIB, fits, margin, unfit_reason
from edgekv.machine.memory import Available, available_memory


def _fake(tmp_path, meminfo_kb: int, cgroup: str | None, files: dict[str, str]):
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: {meminfo_kb} kB\n")
    if cgroup is not None:
        (proc / "self" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        (cg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cg / rel).write_text(text)
    return str(proc), str(cg)


def test_available_memory_is_the_tighter_of_memavailable_and_the_cgroup_limit(tmp_path):
    proc, cg = _fake(tmp_path / "a", 20_000_000, "0::/ci/job\n",
                     {"ci/job/memory.max": "4294967296\n", "ci/job/memory.current": "1073741824\n"})
    a = available_memory(proc, cg)
    assert a == Available(3 * 1024 * MIB, "cgroup limit", 4 * 1024 * MIB)
    proc, cg = _fake(tmp_path / "b", 2_000_000, "0::/ci/job\n", {"ci/job/memory.max": "max\n",
                                                                 "ci/job/memory.current": "5\n"})
    assert available_memory(proc, cg) == Available(2_000_000 * 1024, "MemAvailable", 24_000_000 * 1024)
    proc, cg = _fake(tmp_path / "c", 20_000_000, "4:memory:/docker/x\n0::/\n",
                     {"memory/docker/x/memory.limit_in_bytes": str(2 << 30), "memory/docker/x/memory.usage_in_bytes": "0"})
    assert available_memory(proc, cg).source == "cgroup limit"          # cgroup v1
    real = available_memory()
    assert real is not None and real.bytes > 0 and real.source in ("MemAvailable", "cgroup limit")


def test_the_fit_decision_and_its_line():
    assert margin(100 * MIB) == 256 * MIB and margin(100 * 1024 * MIB) == 5 * 1024 * MIB
    assert fits(1024 * MIB, 1280 * MIB) and not fits(1024 * MIB, 1279 * MIB)
    line = unfit_reason(int(47.3 * 1024 * MIB), int(21.8 * 1024 * MIB), "MemAvailable")
    assert line == "predicted peak 47.3 GiB + 2.4 GiB margin > 21.8 GiB available (MemAvailable); skipped " \
                   "(--force runs it anyway)"


def test_bench_skips_what_will_not_fit_and_exits_1_within_seconds(smollm2_path, tmp_path):
    out = tmp_path / "big.jsonl"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", str(smollm2_path), "-c", "1048576", "-ctk", "f16",
                        "-d", "0", "-p", "8", "-n", "4", "-r", "1", "-o", str(out)], capture_output=True, text=True,
                       timeout=300)
    wall = time.perf_counter() - t
    assert r.returncode == 1, r.stderr
    assert "1 of 1 configurations predicted not to fit the memory available now" in r.stdout
    assert "skipped: predicted peak" in r.stdout and "available (" in r.stdout
    assert "nothing was measured (1 configuration skipped)" in r.stderr
    assert wall < 60, wall                         # dry runs only: nothing of the model was loaded
    from edgekv.records import results as R

    rec = R.load(out)[0]
    assert rec["status"] == "skipped" and "predicted peak" in rec["reason"] and "memory" not in rec
    assert rec["environment"]["memory_available_bytes"] > 0


def test_a_low_reading_skips_and_force_runs_it(smollm2_path, tmp_path, monkeypatch, capsys):
    import edgekv.machine.memory as MM
    from edgekv.cli.main import main

    # above the watchdog's 256 MiB floor, below the predicted peak + 256 MiB margin
    monkeypatch.setattr(MM, "available_memory", lambda *a, **k: Available(300 * MIB, "cgroup limit", 400 * MIB))
    args = ["bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "16", "-n", "4", "-r", "1", "-t", "2"]
    assert main([*args, "-o", str(tmp_path / "a.jsonl")]) == 1
    assert "available (cgroup limit); skipped (--force runs it anyway)" in capsys.readouterr().out
    assert main([*args, "-o", str(tmp_path / "b.jsonl"), "--force"]) == 0


def test_the_watchdog_stops_a_configuration_when_memory_runs_out_and_the_sweep_goes_on(smollm2_path, tmp_path,
                                                                                       monkeypatch):
    """Point 3: the machine's available memory falls below the floor while a configuration runs (a fake reading:
    this test must not endanger the machine): the child is stopped, the record says why, the next one runs."""
    import edgekv.machine.memory as MM
    from edgekv.prediction.api import load_model
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    real = MM.available_memory
    state = {"case": -1, "fill": False, "fired": False}

    def reading(*a, **k):
        if state["case"] == 0 and state["fill"] and not state["fired"]:
            state["fired"] = True
            return Available(100 * MIB, "MemAvailable", 24 * 1024 * MIB)
        return real(*a, **k)

    def on_event(kind, data):
        if kind == "case":
            state["case"] = data["i"]
        elif kind == "child" and data.get("phase") == "fill":
            state["fill"] = True

    monkeypatch.setattr(MM, "available_memory", reading)
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[1024], pairs=[("f16", "f16"), ("q8_0", "q8_0")], depths=[896], n_prompt=128,
                      n_gen=32, repetitions=3, n_threads=2)
    recs = run_sweep(spec, output=tmp_path / "w.jsonl", on_event=on_event).lines
    assert state["fired"]
    assert [r["status"] for r in recs] == ["failed", "ok"]
    r = recs[0]
    assert r["reason"].startswith("stopped: machine memory nearly exhausted (100 MiB available < 492 MiB floor, "
                                  "MemAvailable) at ")
    assert "MiB RSS" in r["reason"] and r["failure"]["cause"] == "memory-watchdog"
    assert r["memory"]["peak_rss_bytes"] > 0                    # what was measured before is kept


def test_predict_marks_what_does_not_fit_and_budget_auto_uses_the_memory_available(smollm2_path, cli):
    import json

    r = cli("predict", smollm2_path, "-c", "1024,1048576", "-ctk", "f16", "--json")
    assert r.returncode == 0, r.stderr
    procs = [x["prediction"]["process"] for x in json.loads(r.stdout)]
    assert [p["fits"] for p in procs] == [True, False]
    assert procs[0]["available_bytes"] > 0 and procs[0]["available_source"] in ("MemAvailable", "cgroup limit")
    r = cli("predict", smollm2_path, "-c", "1024,1048576", "-ctk", "f16", env={"COLUMNS": "200"})
    out = " ".join(r.stdout.split())
    assert "does not fit here" in out and "does not fit this machine now (" in out and ": 1048576/f16" in out
    r = cli("predict", smollm2_path, "-ctk", "f16", "--budget", "auto", "-c", "1024")
    assert r.returncode == 0, r.stderr
    assert "--budget auto: " in r.stderr and "available now (" in r.stderr
