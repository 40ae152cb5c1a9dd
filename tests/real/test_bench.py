"""`edgekv bench`: real sweeps on both real models, isolation, resume, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekv.core.predict import MIB
from edgekv.prediction.api import load_model
from edgekv.records import results as R
from edgekv.records.frame import frame_rows
from edgekv.sweep.run import run_sweep
from edgekv.sweep.spec import sweep_spec

TINY = {"n_prompt": 32, "n_gen": 8, "repetitions": 2, "n_threads": 2}


def by(records, *keys):
    return {tuple(r["settings"][k] for k in keys): r for r in records}


@pytest.fixture(scope="module")
def smol_records(smollm2_path, tmp_path_factory):
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512, 2048], pairs=[("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "f16")],
                      depths=[256], **TINY)
    out = tmp_path_factory.mktemp("smol") / "r.jsonl"
    res = run_sweep(spec, output=out)
    assert not res.interrupted
    assert R.load(out) == res.lines
    return res.lines


def test_every_configuration_measured_and_matches_prediction(smol_records):
    assert len(smol_records) == 6
    assert len({r["config_key"] for r in smol_records}) == 6
    for r in smol_records:
        assert r["status"] == "ok", r.get("reason")
        assert r["schema_version"] == R.SCHEMA_VERSION
        d = r["differences"]
        assert d["llama_kv_matches_formula"], d.get("llama_kv_diffs")
        assert abs(d["kv_buffer_minus_formula_mib"]) <= 0.01      # the real KV allocation, at its printed resolution
        assert r["prediction"]["engine"]["match"]                 # and its dry run agreed beforehand
        for test in ("pp", "tg"):
            sp = r["speed"][test]
            assert len(sp["samples_ns"]) == 2 and all(x > 0 for x in sp["samples_ts"])
            assert sp["mean_ts"] > 0
        mem = r["memory"]
        assert mem["kernel_maxrss_bytes"] >= mem["anon_after_fill_bytes"]
        # a CPU-only llama.cpp: the KV lives in host buffers, no device memory is read or compared
        assert set(r["llama_log"]["kv_buffers_mib"]) == {"CPU"}
        assert not [k for k in mem if k.startswith("gpu_used_")] and "context_gpu_growth_bytes" not in d
        assert mem["sample_interval_max_s"] < 0.25
        assert r["effective"]["n_ctx"] == r["settings"]["n_ctx"]
        assert r["settings"]["n_depth"] == 256
        env = r["environment"]
        for k in ("edgekv", "llama_cpp_python", "llama_cpp_commit", "cpu_model", "cpu_count_logical", "ram_bytes", "os",
                  "backends", "argv", "time_utc"):
            assert env.get(k) is not None, k
        assert r["model"]["sha256"] and len(r["model"]["sha256"]) == 64


def test_memory_follows_the_predicted_kv(smol_records):
    recs = by(smol_records, "n_ctx", "type_k", "type_v")
    for kv in (("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "f16")):
        small, big = recs[(512,) + kv], recs[(2048,) + kv]
        assert big["memory"]["peak_rss_bytes"] > small["memory"]["peak_rss_bytes"]
    for n in (512, 2048):
        f16, q4 = recs[(n, "f16", "f16")], recs[(n, "q4_0", "q4_0")]
        pred = (f16["prediction"]["formula"]["kv_bytes"] - q4["prediction"]["formula"]["kv_bytes"])
        meas = (f16["differences"]["context_anon_growth_bytes"] - q4["differences"]["context_anon_growth_bytes"])
        assert abs(meas - pred) <= 0.05 * pred + 2 * MIB, (n, meas, pred)
    # the cache is resident as soon as the context exists: growth = KV + small buffers
    for r in smol_records:
        extra = r["differences"]["context_anon_growth_minus_formula_bytes"]
        assert -1 * MIB <= extra <= 8 * MIB, extra


def test_sliding_window_model(gemma3_path, tmp_path):
    m = load_model(str(gemma3_path))
    spec = sweep_spec(model=m, contexts=[1024, 4096], pairs=[("f16", "f16"), ("q8_0", "q8_0")], depths=[900], **TINY)
    res = run_sweep(spec, output=tmp_path / "g.jsonl")
    recs = by(res.lines, "n_ctx", "type_k")
    for r in res.lines:
        assert r["status"] == "ok", r.get("reason")
        assert r["differences"]["llama_kv_matches_formula"]
        assert [c["role"] for c in r["llama_log"]["kv"]] == ["full", "swa"]
        assert r["restore"] == "snapshot"        # a SWA cache cannot be truncated back to depth exactly
        # the depth state (900 tokens x 18 layers: 8-16 MiB) is kept in a file: the timed tests run without it in
        # memory, and the peak covers them like any other phase; only the save/restore moments are left out
        mem = r["memory"]
        assert r["snapshot_bytes"] > 4 * MIB
        assert mem["anon_end_bytes"] - mem["anon_after_fill_bytes"] < r["snapshot_bytes"] / 4
        peaks = mem["phase_peaks_bytes"]
        assert {"fill", "pp", "tg", "restore"} <= set(peaks)
        assert mem["peak_rss_bytes"] == max(v for k, v in peaks.items() if k not in ("snapshot", "restore"))
    # only the 3 full-attention layers grow with context; the SWA cache stays 1024 cells
    grow = recs[(4096, "f16")]["differences"]["context_anon_growth_bytes"] - \
        recs[(1024, "f16")]["differences"]["context_anon_growth_bytes"]
    pred = recs[(4096, "f16")]["prediction"]["formula"]["kv_bytes"] - recs[(1024, "f16")]["prediction"]["formula"]["kv_bytes"]
    assert pred == 3 * 256 * 2 * 2 * (4096 - 1024)
    assert abs(grow - pred) <= 0.05 * pred + 2 * MIB


def test_users_own_llama_bench(llama_bench_exe, smollm2_path, tmp_path):
    """--llama-bench: the user's own binary (here built from the same vendored llama.cpp) runs each configuration,
    its process memory is sampled from outside, its speed samples, build commit and own KV lines land in the same
    schema; a cache type llama-bench does not accept is a skip, not a crash.  The speed beside each measurement
    is predicted from a calibration measured through that same binary ('edgekv calibrate --llama-bench'), cached
    apart from llama-cpp-python's."""
    from edgekv.calibration.preflight import preflight

    # calibrate and bench follow that binary's own preflight when --repack is not given (its AMX kernels may crash)
    rp_on = preflight("binary", str(llama_bench_exe)).repack
    cal = subprocess.run([sys.executable, "-m", "edgekv.cli", "calibrate", str(smollm2_path), "--llama-bench",
                          str(llama_bench_exe), "-t", "2", "-ctk", "f16,q4_0", "--allow-busy", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert cal.returncode == 0, cal.stderr[-2000:]
    c = json.loads(cal.stdout)
    assert c["runtime"] == f"llama-bench at {os.path.abspath(llama_bench_exe)}"
    assert c["node_tg_s"] > 0 and c["bandwidth_bytes_s"] > 1e8
    assert {"q4_1", "q8_0"} <= set(c["matvec_s_per_byte"]) and all(v > 0 for v in c["matmul_s_per_flop"].values())
    assert all(c["attn_tg_s"][k] > 0 and c["attn_pp_s"][k] > 0 for k in c["attn_tg_s"])
    assert {k.split("@")[0] for k in c["attn_tg_s"]} == {"f16/f16/fa=auto", "q4_0/q4_0/fa=auto"}
    # the tiled kernel deep in the cache, through the same binary (-d 4096,8192,4096 on a one-layer model)
    assert set(c["attn_pp_deep_s"]) == {k for k in c["attn_tg_s"] if k.startswith("f16/f16/") and "@" in k}
    assert c["attn_pp_deep_s"] and all(v > 0 for v in c["attn_pp_deep_s"].values())
    from edgekv.calibration.speedcal import cached

    assert cached(2, rp_on, str(llama_bench_exe)).id == c["id"]
    py = cached(2, rp_on)                                # llama-cpp-python's calibration is another one
    assert py is None or py.id != c["id"]
    out = tmp_path / "lb.jsonl"
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", str(smollm2_path), "--llama-bench", str(llama_bench_exe),
                        "-c", "1024", "-d", "480", "-ctk", "f16,q4_0,f32", "-p", "32", "-n", "8", "-r", "2", "-t", "2",
                        "-o", str(out), "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # llama-bench has no -c: its prompt test's context is depth + prompt (512 cells), and the lines say so
    assert r.stderr.count("KV 11.25 MiB at llama-bench's n_ctx 512 (= llama.cpp)") == 1, r.stderr[-2000:]
    assert r.stderr.count("KV 3.16 MiB at llama-bench's n_ctx 512 (= llama.cpp)") == 1, r.stderr[-2000:]
    rows = {x["type_k"]: x for x in frame_rows(R.latest(R.load_records(out)))}
    assert rows["f16"]["n_ctx"] == 1024 and rows["f16"]["n_ctx_llamacpp"] == 512
    assert rows["f16"]["kv_mib_formula"] == 22.5 and rows["f16"]["kv_mib_llamacpp"] == 11.25
    recs = by(R.load(out), "type_k")
    assert recs[("f32",)]["status"] == "skipped" and "llama-bench does not accept" in recs[("f32",)]["reason"]
    for t in ("f16", "q4_0"):
        rec = recs[(t,)]
        assert rec["status"] == "ok", rec.get("reason")
        assert rec["settings"]["engine"] == "llama-bench" and rec["schema_version"] == R.SCHEMA_VERSION
        lb = rec["llama_bench"]
        assert lb["build_commit"] == rec["environment"]["llama_cpp_commit"]    # the same vendored source
        assert lb["model_size"] == rec["model"]["size_bytes"]                 # the tensor table's weight bytes
        # llama-bench sizes each test's context itself (depth + test tokens): its KV lines match the formula there
        assert [c["test"] for c in lb["contexts"]] == ["pp", "tg"] and all(c["matches_formula"] for c in lb["contexts"])
        assert rec["differences"]["llama_kv_matches_formula"]
        for test in ("pp", "tg"):
            assert len(rec["speed"][test]["samples_ts"]) == 2 and rec["speed"][test]["mean_ts"] > 0
        sp = rec["prediction"]["speed"]         # EDGEKV_SPEED_CALIBRATE=cached here: the binary's own calibration
        assert sp["calibration_id"] == c["id"] and sp["calibrated_with"] == c["runtime"], sp
        assert sp["tg"]["tokens_per_s"] > 0 and sp["pp"]["tokens_per_s"] > 0
        assert rec["speed_residual"]["tg_pct"] is not None
        # each configuration's own graph size (llama.cpp's dry run per K/V pair; a quantized cache adds nodes)
        # (SmolLM2 936 / 1296 nodes), of which a backend runs 576 / 696 (the scheduler's listing, views left out)
        assert sp["tg"]["parts"][0]["source"].startswith(("576 " if t == "f16" else "696 ") + "graph nodes that run"), sp
        mem = rec["memory"]
        # measured from outside: the mapped weights (92 MiB) and the cache are resident; the sampled peak and the
        # kernel's own maximum agree to a few pages
        assert mem["peak_rss_bytes"] > 92 * MIB
        assert abs(mem["peak_rss_bytes"] - mem["kernel_maxrss_bytes"]) < 4 * MIB
    assert recs[("f16",)]["memory"]["peak_rss_bytes"] > recs[("q4_0",)]["memory"]["peak_rss_bytes"]
    # predict --llama-bench: the speed from the same binary's calibration (cached above, not measured again), the
    # process over that binary's own runtime baseline
    from edgekv.sweep.predictions import binary_baseline

    p = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str(smollm2_path), "-c", "1024", "-ctk", "f16,q4_0",
                        "--llama-bench", str(llama_bench_exe), "-t", "2", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    base = binary_baseline(str(llama_bench_exe)).bytes
    for rec in json.loads(p.stdout):
        sp = rec["prediction"]["speed"]
        assert sp["calibration_id"] == c["id"] and sp["calibrated_with"] == c["runtime"], sp
        assert sp["tg"]["parts"][0]["source"].startswith(
            ("576 " if rec["settings"]["type_k"] == "f16" else "696 ") + "graph nodes that run")
        (rt,) = [x for x in rec["prediction"]["process"]["parts"] if x["name"] == "runtime baseline"]
        assert rt["bytes"] == base


def test_default_depth_and_invalid_combination(smollm2_path, tmp_path):
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512], pairs=[("q4_0", "q4_0"), ("f16", "f16")], flash_attn=["off"], **TINY)
    res = run_sweep(spec, output=tmp_path / "x.jsonl")
    recs = by(res.lines, "type_k")
    assert recs[("q4_0",)]["status"] == "skipped"
    assert "flash_attn" in recs[("q4_0",)]["reason"]
    ok = recs[("f16",)]
    assert ok["status"] == "ok"
    assert ok["effective"]["flash_attn"] == "disabled"
    assert ok["settings"]["n_depth"] == 512 - 32      # default: the context minus the larger test
    assert ok["differences"]["llama_kv_matches_formula"]


def test_killed_child_is_a_recorded_failure_and_the_sweep_goes_on(smollm2_path, tmp_path):
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512], pairs=[("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")], depths=[64],
                      **TINY)
    state = {"case": -1, "pid": None}

    def on_event(kind, data):
        if kind == "case":
            state["case"] = data["i"]
        elif kind == "child" and data.get("event") == "spawned":
            state["pid"] = data["pid"]
        elif kind == "child" and data.get("phase") == "warmup" and state["case"] == 1:
            os.kill(state["pid"], signal.SIGKILL)       # what the OOM killer does

    res = run_sweep(spec, output=tmp_path / "k.jsonl", on_event=on_event)
    st = [r["status"] for r in res.lines]
    assert st == ["ok", "failed", "ok"]
    assert "SIGKILL" in res.lines[1]["reason"]
    assert res.lines[1]["memory"]["peak_rss_bytes"] > 0      # what was measured before it died is kept
    # the sweep itself (no CLI here) records each configuration's load and time plan, the failed one too
    for i, r in enumerate(res.lines):
        assert r["load"]["cpus"] >= 1 and r["load"]["during"]["wall_s"] > 0
        assert r["plan"]["remaining_configs"] == 2 - i and r["plan"]["estimate_s"] > 0
        wall = r["timing"]["wall_s"] if "timing" in r else r["load"]["during"]["wall_s"]
        assert r["plan"]["wall_s"] == round(wall, 1)


def _cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "edgekv.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


@pytest.mark.slow
def test_ctrl_c_then_rerun_resumes(tmp_path):
    out = tmp_path / "cli.jsonl"
    args = ["bench", "-c", "512", "-d", "32", "-ctk", "f16,q8_0,q4_0", "-p", "16", "-n", "4", "-r", "1", "-t", "2",
            "-o", str(out)]
    # A shell that starts a job in the background (CI wrappers, nohup ... &) hands it SIGINT ignored, and
    # Python then installs no Ctrl-C handler in its children: restore the default so the CLI sees Ctrl-C.
    p = _cli(*args, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 1):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "run the same command again to resume" in err
    n_before = len(R.load(out))
    assert 1 <= n_before < 3
    p = _cli(*args, "--json")
    stdout, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert "Resuming" in err
    recs = R.load(out)
    assert len(recs) == 3 and len({r["config_key"] for r in recs}) == 3
    assert len(json.loads(stdout)) == 3
    # all done: a third run measures nothing and prints the summary table of all three
    p = _cli(*args, env={**os.environ, "COLUMNS": "200"})
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "3 of 3 configurations already done" in err
    assert "measured, beside the prediction" in stdout and f"Results: {out}" in stdout
    rows = [ln for ln in stdout.splitlines() if ln.lstrip("│ ").startswith("512 ")]
    assert [r.split("│")[3].strip() for r in rows] == ["f16", "q8_0", "q4_0"], stdout


@pytest.mark.parametrize("make_args, code, words", [
    (lambda t: ["bench", str(t / "corrupt.gguf")], 1, "not a GGUF file"),
    (lambda t: ["bench", "-ctk", "q7_0"], 2, "-ctk"),
    (lambda t: ["bench", "-c", "0"], 2, "-c/--ctx-size"),
    (lambda t: ["bench", "-c", "512", "-d", "600"], 2, "does not fit"),
    (lambda t: ["bench", "-p", "0", "-n", "0"], 2, "nothing to measure"),
    (lambda t: ["bench", "--llama-bench", str(t / "nope")], 2, "--llama-bench"),
    (lambda t: ["bench", "--timeout", "-1"], 2, "--timeout must be a positive number"),
    (lambda t: ["bench", "--repack", "2"], 2, "--repack: '2' is not 0 or 1"),
])
def test_bad_input_is_one_clear_line(cli, tmp_path, make_args, code, words):
    (tmp_path / "corrupt.gguf").write_bytes(b"GGML" + os.urandom(100))
    rc, _, err = cli(*make_args(tmp_path))
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("edgekv: error:"), err


def test_results_file_from_the_future_is_refused(tmp_path):
    p = tmp_path / "future.jsonl"
    p.write_text(json.dumps({"schema_version": 99}) + "\n")
    with pytest.raises(R.ResultsError, match="newer edgekv"):
        R.load(p)
    assert Path(p).exists()


def _bench_child(model: Path, depth: int, seed) -> tuple:
    """One bench child of SmolLM2 at ``depth`` (a 16-token prompt, 4 generated, one repetition) with ``seed``: its
    reply and the phases it announced."""
    from edgekv.core.benchwire import BenchRequest, BenchWorkload, reply_from, to_wire
    from edgekv.core.predict import ContextParams
    from edgekv.runtime.process import run_child, worker_argv

    work = BenchWorkload(n_threads=2, n_gpu_layers=0, n_prompt=16, n_gen=4, n_depth=depth, repetitions=1,
                         warmup=False)
    req = BenchRequest(model_path=str(model), params=ContextParams(n_ctx=512, type_k="q8_0", type_v="q8_0"),
                       workload=work, restore="truncate", seed=seed)
    phases: list[str] = []
    child = run_child(worker_argv("bench"), to_wire(req), timeout=300, sample_memory=True,
                      on_event=lambda e: phases.append(e["phase"]) if e.get("event") == "phase" else None)
    return reply_from(child.result), phases


def test_a_deeper_fill_starts_from_the_state_a_shallower_one_saved(smollm2_path, tmp_path):
    """edgekv.sweep.seeds through the real child: a run saves its state at depth 150, a run at depth 400 restores
    those 150 tokens and fills the other 250 (the cache then holds exactly 400, or the child fails); a state that
    does not restore is a whole fill, not a failure."""
    from edgekv.core.benchwire import DepthSeed

    state = tmp_path / "150.state"
    first, _ = _bench_child(smollm2_path, 150, DepthSeed(save=str(state)))
    assert first.status == "ok" and first.timing.fill_from is None and state.stat().st_size > 150 * 30 * 64
    second, phases = _bench_child(smollm2_path, 400, DepthSeed(load=str(state), tokens=150))
    assert second.status == "ok", second.reason
    assert second.timing.fill_from == 150 and phases.index("restore") < phases.index("fill")
    (tmp_path / "bad.state").write_bytes(b"not a llama.cpp state")
    third, _ = _bench_child(smollm2_path, 400, DepthSeed(load=str(tmp_path / "bad.state"), tokens=150))
    assert third.status == "ok" and third.timing.fill_from is None


def test_a_sweep_hands_each_cache_its_depth(smollm2_path, tmp_path, monkeypatch):
    """A sweep of two contexts: each 512-cell configuration starts from the 256 one's depth of the same cache types
    (its record says fill_from), the cache equals llama.cpp's, and the sweep's state folder is gone at the end."""
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "home"))
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[256, 512], pairs=[("q4_0", "q4_0")], **TINY)
    res = run_sweep(spec, output=tmp_path / "s.jsonl")
    recs = by(res.lines, "n_ctx", "type_k")
    for (n_ctx, t), r in recs.items():
        assert r["status"] == "ok" and r["differences"]["llama_kv_matches_formula"], r.get("reason")
        assert r["timing"].get("fill_from") == (recs[(256, t)]["settings"]["n_depth"] if n_ctx == 512 else None)
    assert recs[(512, "q4_0")]["settings"]["n_depth"] == 480
    assert not list((tmp_path / "home" / "tmp").iterdir())
