"""Issue 25: the CPU backend's extra buffer types (AMX, CPU_REPACK) predicted, swept with --repack, and checked by a
preflight, on any machine.

The AMX figures come from real load logs of SmolLM2 on a 2-vCPU Sapphire Rapids VM (tests/data/amx/, copied from
../shared/reference/data/): the recorded logs test the parser and the formula against llama.cpp's own numbers;
the rest runs real llama.cpp here (CPU_REPACK on AVX2/NEON machines; AMX only where the hardware has it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgekv.calibration.baseline import cpu_features_from_system_info
from edgekv.core.llamalog import parse_memory_log
from edgekv.core.memmodel import (
    BUFT_AMX,
    BUFT_REPACK,
    MIB,
    amx_alloc_bytes,
    amx_supported,
    extra_buffer_bytes,
    extra_buffer_types,
)

DATA = Path(__file__).parents[1] / "data" / "amx"
AMX_ON = DATA / "amx-load-SmolLM2-135M-Instruct.Q4_1-amx-on.log"
AMX_OFF = DATA / "amx-load-SmolLM2-135M-Instruct.Q4_1-amx-off.log"
AMX_INFO = next(x.strip() for x in (DATA / "amx-crash.txt").read_text().splitlines() if x.startswith("CPU :"))
AMX_FEATURES = cpu_features_from_system_info(AMX_INFO)
PEAK_ON_MIB, PEAK_OFF_MIB = 275.04, 179.67          # "RESULT extra_bufts=... peak_rss_mib" in the two logs


def _result_mib(log: Path) -> float:
    return float(next(x for x in log.read_text().splitlines() if x.startswith("RESULT")).split()[-1])


def test_recorded_logs_are_what_the_constants_say():
    assert _result_mib(AMX_ON) == PEAK_ON_MIB and _result_mib(AMX_OFF) == PEAK_OFF_MIB
    assert "amx_int8" in AMX_FEATURES and "avx512_vnni" in AMX_FEATURES and "repack" in AMX_FEATURES
    assert extra_buffer_types(AMX_FEATURES) == (BUFT_AMX, BUFT_REPACK)       # AMX first (ggml-cpu.cpp:42-71)
    assert extra_buffer_types(AMX_FEATURES, use_extra_bufts=False) == ()     # --repack 0 removes both


def test_amx_buffer_formula_equals_llama_cpp_recorded_load(smollm2_header):
    from edgekv.sources.gguf_header import read_header_file

    h = read_header_file(smollm2_header)
    on = parse_memory_log(AMX_ON.read_text()).model_buffers
    off = parse_memory_log(AMX_OFF.read_text()).model_buffers
    assert on == {"AMX": 95.34, "CPU_Mapped": 92.10} and off == {"CPU_Mapped": 92.10}
    got = extra_buffer_bytes(h.tensors, AMX_FEATURES)
    assert set(got) == {BUFT_AMX}                      # Q4_1 and Q8_0 have no CPU_REPACK rule on x86 anyway
    b, n = got[BUFT_AMX]
    assert round(b / MIB, 2) == on["AMX"]
    # 210 Q4_1 matrices plus the tied output (token_embd duplicated for the output MUL_MAT); token_embd itself and
    # the 61 f32 norms stay in the mapping ("tensor 'token_embd.weight' (q8_0) (and 61 others) cannot be used ...")
    assert n == 211
    assert "(and 61 others) cannot be used with preferred buffer type AMX" in AMX_ON.read_text()
    assert len([t for t in h.tensors if not amx_supported(t)]) == 62
    assert extra_buffer_bytes(h.tensors, AMX_FEATURES, use_extra_bufts=False) == {}


def test_amx_packed_sizes_follow_get_row_size():
    from dataclasses import dataclass

    @dataclass
    class T:
        name: str
        shape: tuple
        ggml_type: int
        n_bytes: int

    # amx/mmq.cpp get_row_size: Q8_0 adds an int32 per block, Q4_K/Q5_K 4 bytes, IQ4_XS 2; Q4_0/Q4_1/Q6_K none
    q8 = T("blk.0.ffn_up.weight", (576, 1536), 8, 576 * 1536 // 32 * 34)
    assert amx_alloc_bytes(q8) == 1536 * (576 // 32) * 38
    q4k = T("blk.0.ffn_up.weight", (512, 64), 12, 512 * 64 // 256 * 144)
    assert amx_alloc_bytes(q4k) == 64 * 2 * 148
    f16 = T("blk.0.ffn_up.weight", (64, 64), 1, 64 * 64 * 2)
    assert amx_supported(f16) and amx_alloc_bytes(f16) == f16.n_bytes
    # shape rules of amx.cpp supports_op: ne1 % 32, ne0 % the block; experts (MUL_MAT_ID) and embeddings never
    assert not amx_supported(T("blk.0.attn_k.weight", (576, 48), 3, 576 * 48 // 32 * 20))
    assert not amx_supported(T("blk.0.ffn_up_exps.weight", (576, 64, 8), 2, 576 * 64 * 8 // 32 * 18))
    assert not amx_supported(T("token_embd.weight", (576, 64), 2, 576 * 64 // 32 * 18))
    assert not amx_supported(T("blk.0.attn_q.weight", (576, 64), 6, 576 * 64 // 32 * 22))      # Q5_0: no kernel


def test_whole_process_reproduces_the_recorded_amx_and_plain_peaks(smollm2_path):
    """The recorded run: load, n_ctx 1024, f16 cache, one 1-token decode.  The same prediction this machine makes
    for it (its runtime baseline and llama.cpp's dry run here), given the recorded machine's CPU features, is within
    ±3 % of the peak measured there, with the AMX copy and without it (--repack 0)."""
    import copy

    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.core.predict import ContextParams
    from edgekv.prediction.api import load_model
    from edgekv.prediction.wholeprocess import ProcessSettings, predict_processes

    m = load_model(str(smollm2_path))
    base = copy.copy(runtime_baseline())
    base.cpu_features = AMX_FEATURES
    got = {}
    for repack in (True, False):
        st = ProcessSettings(workload="bench", n_threads=2, n_prompt=0, n_gen=1, n_depth=0, use_extra_bufts=repack)
        p = predict_processes(m, [ContextParams(n_ctx=1024)], st, base)[0]
        got[repack] = p
    amx = next(x for x in got[True].parts if x.name == "weights (AMX copy)")
    assert round(amx.bytes / MIB, 2) == 95.34
    assert not any("AMX" in x.name for x in got[False].parts)
    on, off = got[True].peak_rss_bytes / MIB, got[False].peak_rss_bytes / MIB
    assert abs(on - PEAK_ON_MIB) / PEAK_ON_MIB <= 0.03, on
    assert abs(off - PEAK_OFF_MIB) / PEAK_OFF_MIB <= 0.03, off
    assert abs((on - off) - (PEAK_ON_MIB - PEAK_OFF_MIB)) < 1.0      # the AMX copy is the whole difference


# -- llama.cpp here: the extra buffers it really allocates --------------------------------------------------------

def _write_tiny(path: Path, tied: bool) -> Path:
    """A one-block llama with Q4_0 matrices (the preflight's probe), optionally with tied Q4_0 embeddings."""
    from tests.tiny.writer import write_gguf

    e, f, v = 256, 512, 512
    meta = [["llama.block_count", "uint32", 1], ["llama.context_length", "uint32", 256],
            ["llama.embedding_length", "uint32", e], ["llama.feed_forward_length", "uint32", f],
            ["llama.attention.head_count", "uint32", 4], ["llama.attention.head_count_kv", "uint32", 4],
            ["llama.rope.dimension_count", "uint32", 64], ["llama.attention.layer_norm_rms_epsilon", "float32", 1e-5],
            ["llama.vocab_size", "uint32", v], ["tokenizer.ggml.model", "string", "none"]]
    tensors = [["token_embd.weight", [e, v], "q4_0" if tied else "f32"], ["output_norm.weight", [e], "f32"],
               ["blk.0.attn_norm.weight", [e], "f32"], ["blk.0.ffn_norm.weight", [e], "f32"]]
    tensors += [[f"blk.0.{n}.weight", [e, e], "q4_0"] for n in ("attn_q", "attn_k", "attn_v", "attn_output")]
    tensors += [["blk.0.ffn_gate.weight", [e, f], "q4_0"], ["blk.0.ffn_up.weight", [e, f], "q4_0"],
                ["blk.0.ffn_down.weight", [f, e], "q4_0"]]
    if not tied:
        tensors.append(["output.weight", [e, v], "q4_0"])
    write_gguf(path, "llama", meta, tensors)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("repack", [True, False])
def test_extra_buffers_formula_equals_a_real_load_here(tmp_path, tied, repack):
    """Formula beside llama.cpp's own ``model buffer size`` lines of a real load on this machine (CPU_REPACK on an
    AVX2 or NEON build; AMX where the CPU has it), with a tied Q4_0 output (llama.cpp re-lays the duplicate too:
    ``repack tensor token_embd.weight``) and without, with --repack 1 and 0."""
    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.prediction.api import load_model
    from edgekv.prediction.crosscheck import extra_buffer_check, extra_buffer_line

    m = load_model(str(_write_tiny(tmp_path / "tiny.gguf", tied)))
    feats = runtime_baseline().cpu_features
    check = extra_buffer_check(m, feats, use_extra_bufts=repack)
    assert check["llama"] is not None, check["note"]
    assert check["llama"] == check["formula"] and check["same"], check
    if repack and extra_buffer_types(feats):
        assert check["formula"], "a Q4_0 model on a build with extra buffer types gets a copy"
        assert "✓" in extra_buffer_line(check)
    if not repack:
        assert check["formula"] == {}


@pytest.mark.slow
def test_a_get_rows_table_gets_no_extra_buffer_copy(tmp_path):
    """Gemma 4's per-layer embedding table is read by GET_ROWS, never in a matrix product: llama.cpp keeps it out of
    CPU_REPACK even when it is Q4_0 of a repackable shape (tests/tiny's gemma4 family, every matrix retyped Q4_0)."""
    import json

    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.prediction.api import load_model
    from edgekv.prediction.crosscheck import extra_buffer_check
    from tests.tiny.writer import write_gguf

    spec = json.loads((Path(__file__).parents[1] / "tiny" / "specs.json").read_text())["families"]["gemma4"]
    tensors = [[n, ne, "q4_0" if len([d for d in ne if d > 1]) >= 2 and ne[0] % 32 == 0 else t]
               for n, ne, t in spec["tensors"]]
    assert any(n == "per_layer_token_embd.weight" and t == "q4_0" and ne[1] % 8 == 0 for n, ne, t in tensors)
    write_gguf(tmp_path / "g4.gguf", spec["arch"], spec["metadata"], tensors)
    m = load_model(str(tmp_path / "g4.gguf"))
    feats = runtime_baseline().cpu_features
    check = extra_buffer_check(m, feats, use_extra_bufts=True)
    assert check["llama"] is not None, check["note"]
    assert check["llama"] == check["formula"] and check["same"], check


def test_predict_engine_shows_llama_cpps_extra_buffer_figure(gemma3_path):
    # --repack 1 as asked (the default follows the preflight, which is 0 where these kernels crash)
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str(gemma3_path), "-c", "1024", "-ctk", "f16",
                        "--engine", "--repack", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "extra buffers" in x)
    from edgekv.calibration.baseline import runtime_baseline

    feats = runtime_baseline().cpu_features
    if "amx_int8" in feats:        # AMX first: Gemma 3's Q4_K matrices go to the AMX buffer (ggml-cpu.cpp)
        assert "AMX" in line and "llama.cpp ✓" in line, line
    elif "repack" in feats and "avx2" in feats:
        assert "CPU_REPACK" in line and "llama.cpp ✓" in line, line     # Gemma 3's Q4_K matrices are re-laid


# -- the preflight ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_preflight_runs_here_and_is_cached():
    from edgekv.calibration.preflight import preflight

    first = preflight(refresh=True)        # the suite shares one calibration folder: probe again here
    assert first.remeasured and first.runs in (True, False), first.detail
    again = preflight()
    assert not again.remeasured and again.runs == first.runs and again.detail == first.detail
    if first.runs:
        assert first.repack and "decoded batches of 2 and 32 tokens" in first.detail


def test_preflight_verdict_of_a_crash_names_the_upstream_issue():
    from edgekv.calibration.preflight import verdict

    pf = verdict(False, signal.SIGSEGV, "batch2", {"AMX": 0.66, "CPU_Mapped": 0.5}, None)
    assert pf.runs is False and not pf.repack
    assert "SIGSEGV" in pf.detail and "a batch of 2 tokens" in pf.detail and "AMX 0.66 MiB" in pf.detail
    assert "llama.cpp #20824" in pf.fallback_line and "--repack 0" in pf.fallback_line
    unknown = verdict(False, None, None, {}, "no result")
    assert unknown.runs is None and unknown.repack          # unknown: llama.cpp's default, said, never cached
    ok = verdict(True, None, None, {"CPU_REPACK": 0.42}, None)
    assert ok.runs and ok.repack


@pytest.mark.slow
def test_info_shows_the_preflight():
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "info", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["preflight"]["runs"] in (True, False) and info["preflight"]["detail"]
    assert set(info["extra_buffer_types"]) <= {BUFT_AMX, BUFT_REPACK}
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "info"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Preflight (llama-cpp-python)" in r.stdout


@pytest.mark.slow
def test_on_amx_hardware_the_probe_uses_the_amx_buffer():
    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.calibration.preflight import preflight

    if "amx_int8" not in runtime_baseline().cpu_features:       # llama.cpp's own system info, read by a child
        pytest.skip("needs a CPU whose llama.cpp build has AMX_INT8")

    pf = preflight(refresh=True)
    assert "AMX" in pf.extra_buffers, pf.detail


# -- bench, records, report, compare -------------------------------------------------------------------------------

TINY = {"n_prompt": 32, "n_gen": 8, "repetitions": 1, "n_threads": 2}


def test_bench_falls_back_to_repack_0_when_the_preflight_saw_a_crash(smollm2_path, tmp_path, monkeypatch, capsys):
    """On a machine whose AMX kernels crash (the preflight's verdict stands in for that CPU here), bench says so
    before its plan and measures with --repack 0: on the first screen, in every record and in the report."""
    import edgekv.calibration.preflight as P
    from edgekv.cli.main import main
    from edgekv.output.inputs import load_many
    from edgekv.output.report import write_report
    from edgekv.records import results as R

    crashed = P.verdict(False, signal.SIGSEGV, "batch2", {"AMX": 0.66, "CPU_Mapped": 0.5}, None)
    monkeypatch.setattr(P, "preflight", lambda *a, **k: crashed)
    out = tmp_path / "r.jsonl"
    code = main(["bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-d", "64", "-p", "32", "-n", "8", "-r", "1",
                 "-t", "2", "-o", str(out)])
    assert code == 0
    cap = capsys.readouterr()
    screen = cap.out + cap.err
    note = next((x for x in screen.splitlines() if "#20824" in x and "measuring with --repack 0" in x), None)
    assert note, screen
    plan = next(x for x in screen.splitlines() if x.startswith("Plan:"))
    assert note in cap.err and plan in cap.out and "--repack 0" in plan     # the note is written before the plan
    recs = R.load_records(out)
    assert len(recs) == 1 and recs[0].status == "ok" and recs[0].settings.repack is False
    assert recs[0].environment.extra_buffers_preflight.runs is False
    assert "--repack 0: llama.cpp's AMX kernels crash" in screen           # the summary's line under the table
    res = write_report(load_many([str(out)]), tmp_path / "rep", plots=False)
    md = (tmp_path / "rep" / "README.md").read_text()
    assert "extra buffers (AMX, CPU_REPACK)" in md and "crash on this CPU (llama.cpp #20824)" in md and "--repack 0" in md
    assert res["records"] == 1


def test_repack_sweeps_like_flash_attn_and_is_a_key_setting(smollm2_path, tmp_path):
    from edgekv.calibration.preflight import preflight
    from edgekv.prediction.api import load_model
    from edgekv.records import results as R
    from edgekv.sweep.llamabench import argv_for
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512], pairs=[("q4_0", "q4_0")], depths=[64], repack=[True, False], **TINY)
    res = run_sweep(spec, output=tmp_path / "r.jsonl")
    assert [r["settings"]["repack"] for r in res.lines] == [True, False]
    if preflight().runs is False:     # --repack 1 runs as asked and dies where its kernels crash (AMX: amx.md)
        assert res.lines[0]["status"] == "failed" and "SIG" in res.lines[0]["reason"], res.lines[0]["reason"]
        assert res.lines[1]["status"] == "ok", res.lines[1]["reason"]
    else:
        assert all(r["status"] == "ok" for r in res.lines), [r["reason"] for r in res.lines]
    assert len({r["config_key"] for r in res.lines}) == 2
    # --repack 1 is llama.cpp's default: its key is the key records written before the setting existed have
    s = dict(res.lines[0]["settings"])
    old = {k: v for k, v in s.items() if k != "repack"}
    assert R.config_key("x", s) == R.config_key("x", old) != R.config_key("x", {**s, "repack": False})
    assert argv_for("llama-bench", "m.gguf", res.records[1].settings, "pp")[-2:] == ["--repack", "0"]


def test_compare_pairs_records_from_before_the_setting_with_repack_1(tmp_path):
    from edgekv.output.compare import pair
    from edgekv.records import results as R

    src = Path(__file__).parents[1] / "data" / "smollm2-sweep.jsonl"
    old = [json.loads(x) for x in src.read_text().splitlines()]
    assert all("repack" not in r["settings"] for r in old)
    new = [{**r, "settings": {**r["settings"], "repack": True}} for r in old]
    off = [{**r, "settings": {**r["settings"], "repack": False}} for r in old]
    pairs, only_b, only_c = pair(old, new)
    assert len(pairs) == len({R.as_record(r, "x").config_key for r in old}) and not only_b and not only_c
    pairs, only_b, only_c = pair(old, off)
    assert not pairs and only_b and only_c


def test_predict_says_when_the_default_would_crash_here(smollm2_header, monkeypatch, capsys):
    smollm2_path = smollm2_header
    import edgekv.calibration.preflight as P
    from edgekv.cli.main import main

    crashed = P.verdict(False, signal.SIGSEGV, "batch2", {"AMX": 0.66}, None)
    monkeypatch.setattr(P, "cached", lambda *a, **k: crashed)
    assert main(["predict", str(smollm2_path), "-c", "512", "-ctk", "f16", "--kv-only"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp #20824" in out and "--repack 0" in out
    assert main(["predict", str(smollm2_path), "-c", "512", "-ctk", "f16", "--kv-only", "--repack", "0"]) == 0
    assert "#20824" not in capsys.readouterr().out
    assert main(["predict", str(smollm2_path), "--repack", "2"]) == 2
    assert "--repack: '2' is not 0 or 1" in capsys.readouterr().err
