"""Whole-process memory (issue 15): the pure model, the calibration, llama.cpp's workload dry run,
predict/--json/--budget, bench records with the residual, the v1 -> v2 upgrade, and bad input."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgekv.calibration import baseline as calibrate
from edgekv.cli.main import main
from edgekv.core.memmodel import (
    SRC_CALIBRATION,
    SRC_FORMULA,
    SRC_LLAMA,
    ProcessInputs,
    kq_work_bytes,
    predict_process,
    repacked,
    tensor_on_gpu,
    work_buffer_bytes,
    workload_outputs,
)
from edgekv.core.predict import MIB, ContextParams
from edgekv.prediction.api import load_model
from edgekv.records import results as R

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class T:
    name: str
    shape: tuple
    ggml_type: int
    n_bytes: int


# -- the pure model --------------------------------------------------------------------------------------

def test_workloads_name_their_outputs():
    assert workload_outputs("generate", 2048, 512, 1) == (1, 1)
    assert workload_outputs("generate", 2048, 512, 4) == (4, 4)          # one output per sequence
    assert workload_outputs("bench", 2048, 512, 1) == (1, 1)
    assert workload_outputs("perplexity", 2048, 512, 1) == (512, 2048)   # every logit of a batch
    with pytest.raises(ValueError, match="unknown workload"):
        workload_outputs("chat", 2048, 512, 1)


def test_repack_rules_follow_the_cpu_backend():
    avx2 = ["avx2", "avx", "fma"]
    q4_0, q4_k, q5_0, q8_0, q2_k = 2, 12, 6, 8, 10
    assert repacked(T("blk.0.ffn_up.weight", (640, 2048), q4_0, 1), avx2)
    assert repacked(T("blk.0.attn_output.weight", (1024, 640), q4_k, 1), avx2)
    assert not repacked(T("blk.0.ffn_up.weight", (640, 2047), q4_0, 1), avx2)        # ne[1] % 8
    assert not repacked(T("per_layer_token_embd.weight", (640, 2048), q4_0, 1), avx2)  # GET_ROWS, not a matmul
    assert not repacked(T("blk.3.nextn.embed_tokens.weight", (640, 2048), q4_0, 1), avx2)
    assert repacked(T("per_layer_model_proj.weight", (640, 2048), q4_0, 1), avx2)
    assert not repacked(T("blk.0.ffn_up.weight", (640, 2048), q5_0, 1), avx2)        # no kernel for q5_0
    assert not repacked(T("blk.0.attn_v.weight", (640, 256), q8_0, 1), avx2)         # q8_0: arm only
    assert repacked(T("blk.0.attn_v.weight", (640, 256), q8_0, 1), ["neon", "dotprod"])
    assert not repacked(T("blk.0.ffn_up.weight", (640, 2048), q2_k, 1), avx2)
    assert repacked(T("blk.0.ffn_up.weight", (640, 2048), q2_k, 1), avx2 + ["avx512"])
    assert not repacked(T("token_embd.weight", (640, 262144), q4_0, 1), avx2)        # GET_ROWS, never repacked
    assert not repacked(T("blk.0.ffn_up.weight", (640, 2048), q4_0, 1), [])          # no AVX2: no repack


def test_layer_split_matches_llama_cpp():
    # 30 layers, -ngl 10: layers 21..29 and the output layer go to the GPU, token_embd never does
    on = [il for il in range(30) if tensor_on_gpu(f"blk.{il}.attn_q.weight", 30, 10)]
    assert on == list(range(21, 30))
    assert tensor_on_gpu("output.weight", 30, 10) and not tensor_on_gpu("token_embd.weight", 30, 99)
    assert not tensor_on_gpu("blk.0.attn_q.weight", 30, 0)


def _inputs(**kw) -> ProcessInputs:
    tensors = [T("token_embd.weight", (576, 49152), 3, 15_925_248),
               T("blk.0.ffn_down.weight", (1536, 576), 3, 552_960), T("blk.0.ffn_up.weight", (576, 1536), 2, 497_664)]
    base = dict(workload="generate", n_ubatch=512, n_batch=2048, n_seq_max=1, n_threads=2, tensors=tensors,
                n_vocab=49152, n_layer=1, cpu_features=["avx2", "repack"], baseline_bytes=50 * MIB, kv_host_bytes=90 * MIB,
                compute_workload={"CPU": 17 * MIB}, compute_reserved={"CPU": 98 * MIB},
                host_structures_bytes=15 * MIB)
    base.update(kw)
    return ProcessInputs(**base)


def test_parts_add_up_and_name_their_source():
    p = predict_process(_inputs())
    names = [q.name for q in p.parts]
    assert names[:2] == ["runtime baseline", "llama.cpp host structures"]
    assert p.peak_rss_bytes == sum(q.bytes for q in p.parts)
    src = {q.name: q.source for q in p.parts}
    assert src["runtime baseline"] == SRC_CALIBRATION and src["compute buffer"] == SRC_LLAMA
    assert src["KV cache"] == SRC_FORMULA and src["output buffer"] == SRC_FORMULA
    by = {q.name: q.bytes for q in p.parts}
    assert by["weights (mmap)"] == 15_925_248 + 552_960 + 497_664         # every tensor's pages, file-backed
    assert by["weights (CPU_REPACK copy)"] == 497_664                      # the q4_0 matrix, AVX2
    assert by["compute buffer"] == 17 * MIB                                # the workload's graph, not the 98 MiB reservation
    assert by["output buffer"] == 49152 * 4
    # ffn_down (q4_1, K = 1536) is the widest conversion: 512 x 1536 elements to q8_1 (36 B per 32) + a line per thread
    assert by["thread work buffer"] == 512 * 1536 // 32 * 36 + 2 * 64
    assert p.device_bytes == {}
    ppl = predict_process(_inputs(workload="perplexity"))
    assert {q.name: q.bytes for q in ppl.parts}["output buffer"] == 2048 * 49152 * 4


def test_no_mmap_makes_the_weights_anonymous():
    p = predict_process(_inputs(use_mmap=False))
    by = {q.name: q for q in p.parts}
    assert "weights (mmap)" not in by
    assert by["weights (--no-mmap)"].bytes == 15_925_248 + 552_960 and by["weights (--no-mmap)"].kind == "anonymous"


def test_missing_baseline_is_not_a_zero():
    p = predict_process(_inputs(baseline_bytes=None, baseline_note="calibration failed: child died"))
    assert p.peak_rss_bytes is None
    assert any("calibration failed: child died" in n for n in p.notes)


def test_gpu_parts_go_to_the_device():
    # all layers offloaded: weights of the layer and the KV on CUDA0, the reservation charged whole there
    p = predict_process(_inputs(n_gpu_layers=2, gpu_device="CUDA0", kv_host_bytes=0, kv_device_bytes=90 * MIB,
                                compute_workload={"CPU": 1 * MIB, "CUDA0": 20 * MIB},
                                compute_reserved={"CUDA0": 98 * MIB, "CUDA_Host": 3 * MIB}))
    # CUDA gives a quantized tensor whose rows are not a multiple of 512 one padded row (576 -> +448 elements,
    # 252 bytes here) and aligns to 128; tied embeddings (no output.weight) put token_embd there a second time
    weights = 552_960 + (497_664 + 252 + 4) + (15_925_248 + 252 + 4)
    assert {q.name: q.bytes for q in p.parts if q.where == "CUDA0"}["weights"] == weights
    assert p.device_bytes["CUDA0"] == weights + 90 * MIB + 98 * MIB
    assert any("not predicted" in n for n in p.notes)
    host = {q.name: q.bytes for q in p.parts if q.where == "host"}
    assert host["weights (mmap)"] == 15_925_248              # token_embd stays on the CPU
    assert "weights (CPU_REPACK copy)" not in host           # offloaded matrices are not repacked
    assert p.peak_rss_bytes == sum(q.bytes for q in p.parts if q.where == "host")
    assert sum(1 for q in p.parts if q.name == "compute buffer" and q.where == "host") == 2   # CPU share + pinned


def test_gpu_runtime_is_a_part_on_each_side():
    # the GPU runtime measured once per environment (calibrate.device_runtime): a device part and a host part
    kw = dict(n_gpu_layers=2, gpu_device="CUDA0", kv_host_bytes=0, kv_device_bytes=90 * MIB,
              compute_workload={"CUDA0": 20 * MIB}, compute_reserved={"CUDA0": 98 * MIB})
    base = predict_process(_inputs(**kw))
    p = predict_process(_inputs(**kw, gpu_runtime_device_bytes=600 * MIB, gpu_runtime_host_bytes=150 * MIB,
                                gpu_runtime_note="probe"))
    assert p.device_bytes["CUDA0"] == base.device_bytes["CUDA0"] + 600 * MIB
    assert p.peak_rss_bytes == base.peak_rss_bytes + 150 * MIB
    assert {q.name for q in p.parts} - {q.name for q in base.parts} == {"CUDA runtime", "CUDA runtime (host side)"}
    assert not any("not predicted" in n for n in p.notes)
    # nothing offloaded: no runtime part even when calibrated
    cpu = predict_process(_inputs(gpu_runtime_device_bytes=600 * MIB, gpu_runtime_host_bytes=150 * MIB))
    assert not any("runtime" in q.name and "CUDA" in q.name for q in cpu.parts)


def test_device_runtime_from_probe_readings():
    from edgekv.calibration.baseline import device_runtime_from_probe

    res = {"readings": {"init": {"rss": 100 * MIB, "process_nvml": None},
                        "decode": {"rss": 260 * MIB, "process_nvml": 700 * MIB}},
           "model_buffers_mib": {"CUDA0": 1.0, "CPU_Mapped": 2.0}, "kv_buffers_mib": {"CUDA0": 4.0},
           "compute_mib": {"CUDA0": 5.0, "CUDA_Host": 3.0}}
    dev, host, _ = device_runtime_from_probe(res)
    assert dev == 700 * MIB - 10 * MIB and host == 160 * MIB - 5 * MIB
    res["readings"]["decode"]["process_nvml"] = None
    dev, _, note = device_runtime_from_probe(res)
    assert dev is None and "NVML" in note


def test_work_buffer_uses_the_widest_matrix():
    ts = [T("blk.0.ffn_down.weight", (2048, 640), 12, 1), T("blk.0.attn_q.weight", (640, 1024), 6, 1)]
    assert work_buffer_bytes(ts, 512, 1, 2) == 512 * 2048 // 256 * 292 + 128     # q4_K -> q8_K


def test_without_flash_attention_the_work_buffer_holds_the_scores_converted_for_v():
    """-fa off: V (transposed) times the softmaxed scores, f32 n_kv x n_tokens x n_head, converted to V's vec_dot type in
    the work buffer; the largest ubatch x cells of the run decides (a fill of 2048 cells in ubatches of 512, then a
    128-token prompt over 2304 cells), an F32 V converts nothing, and a sliding-window cache caps its cells."""
    from edgekv.core.memmodel import T_F16, T_F32, T_Q8_0

    fill = [(s, 512) for s in range(0, 2048, 512)] + [(2048, 128)]
    assert kq_work_bytes(T_F16, [(2560, 9)] * 30, fill) == 2048 * 512 * 9 * 2
    assert kq_work_bytes(T_F16, [(2560, 9)], [(0, 200)]) == 256 * 200 * 9 * 2      # at least 256 cells
    assert kq_work_bytes(T_F32, [(2560, 9)], fill) == 0
    assert kq_work_bytes(T_Q8_0, [(2560, 9)], fill) == 2048 * 512 * 9 * 34 // 32
    assert kq_work_bytes(T_F16, [(1024, 4), (2560, 4)], fill) == 2048 * 512 * 4 * 2
    assert kq_work_bytes(T_F16, [(1024, 4)], fill) == 1024 * 512 * 4 * 2


# -- calibration -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_calibration_is_cached_per_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    first = calibrate.runtime_baseline()
    assert first.remeasured and first.bytes and 10 * MIB < first.bytes < 1024 * MIB   # a real measurement
    assert "avx2" in first.cpu_features or "neon" in first.cpu_features
    again = calibrate.runtime_baseline()
    assert not again.remeasured and again.bytes == first.bytes
    # a calibration file from another environment is re-measured, and the caller is told why
    store = tmp_path / "calibration" / "python-baseline.json"
    d = json.loads(store.read_text())
    d["key"] = "0" * 16
    d["fingerprint"]["llama_cpp_python"] = "0.0.1"
    store.write_text(json.dumps(d))
    other = calibrate.runtime_baseline()
    assert other.remeasured and "another environment" in other.note and "llama_cpp_python" in other.note
    assert json.loads(store.read_text())["key"] == first.fingerprint_key


def test_failed_calibration_marks_the_prediction(tmp_path, monkeypatch, capsys, smollm2_path):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "measure_python", lambda: (None, [], "calibration failed: child died with SIGKILL"))
    assert main(["predict", str(smollm2_path), "-c", "2048", "--json"]) == 0
    proc = json.loads(capsys.readouterr().out)[0]["prediction"]["process"]
    assert proc["peak_rss_bytes"] is None
    assert any("calibration failed" in n for n in proc["notes"])
    assert not (tmp_path / "calibration" / "python-baseline.json").exists()      # a failure is never cached
    assert main(["predict", str(smollm2_path), "-c", "2048"]) == 0
    assert "calibration failed" in capsys.readouterr().out


# -- predict / --budget through the CLI, real llama.cpp dry runs ----------------------------------------

def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_rows_carry_the_process(capsys, gemma3_path):
    # --repack 1 as asked: the default follows the preflight (0 where the extra-buffer kernels crash)
    gen = run_json(capsys, "predict", str(gemma3_path), "-c", "4096", "-ctk", "f16",
                   "--repack", "1")[0]["prediction"]["process"]
    ppl = run_json(capsys, "predict", str(gemma3_path), "-c", "4096", "-ctk", "f16", "--repack", "1",
                   "--workload", "perplexity")[0]["prediction"]["process"]
    assert gen["workload"] == "generate" and ppl["workload"] == "perplexity"
    assert set(gen) >= {"peak_rss_bytes", "device_bytes", "workload", "parts"}
    for p in gen["parts"]:
        assert set(p) >= {"name", "bytes", "source"} and p["bytes"] >= 0
    g = {p["name"]: p["bytes"] for p in gen["parts"]}
    q = {p["name"]: p["bytes"] for p in ppl["parts"]}
    # Gemma's 262,144-token vocabulary: the 512-logit reservation (~512 MiB) is what perplexity touches, not generation
    assert g["compute buffer"] < 64 * MIB < 512 * MIB < q["compute buffer"]
    # Gemma 3's Q4_K matrices are copied into the CPU's extra buffer: AMX on an AMX CPU, else CPU_REPACK
    copies = [k for k in g if k in ("weights (CPU_REPACK copy)", "weights (AMX copy)")]
    assert copies and all(g[k] == q[k] > 0 for k in copies), g
    assert gen["peak_rss_bytes"] == sum(g.values()) and gen["device_bytes"] == {}
    assert ppl["peak_rss_bytes"] - gen["peak_rss_bytes"] > 1000 * MIB     # + 2048 rows of logits


def test_budget_answers_from_the_process(capsys, smollm2_path):
    out = run_json(capsys, "predict", str(smollm2_path), "-ctk", "f16,q4_0", "--budget", "300MiB")
    rows = {r["type_k"]: r for r in out["budget"]}
    f16, q4 = rows["f16"], rows["q4_0"]
    assert 0 < f16["max_n_ctx"] < q4["max_n_ctx"] <= 8192
    assert f16["workload"] == "generate"
    assert f16["peak_rss_bytes"] <= 300 * MIB and f16["process"]["peak_rss_bytes"] == f16["peak_rss_bytes"]
    assert q4["max_n_ctx"] < 8192 or "trained context (8192)" in q4["note"]
    # one step more does not fit, by the same prediction through predict itself
    nxt = run_json(capsys, "predict", str(smollm2_path), "-c", str(f16["max_n_ctx"] + 256), "-ctk", "f16")
    assert nxt[0]["prediction"]["process"]["peak_rss_bytes"] > 300 * MIB


def test_budget_below_the_runtime(capsys, smollm2_path):
    out = run_json(capsys, "predict", str(smollm2_path), "-ctk", "f16", "--budget", "10MiB")
    r = out["budget"][0]
    assert r["max_n_ctx"] == 0 and r["note"].startswith("nothing fits: the runtime alone needs ")


@pytest.mark.slow
def test_budget_metadata_only_says_it_is_capped(capsys, tmp_path):
    # issue 19 point 7: a metadata-only Qwen3-8B shape; the answer is the trained-context cap and says so
    from tests.tiny.writer import write_gguf
    from tests.unit.core.test_published_figures import _qwen3_8b_metadata

    md = _qwen3_8b_metadata()
    path = tmp_path / "qwen3-8b-meta.gguf"
    write_gguf(path, md[0][2], md, [])
    out = run_json(capsys, "predict", str(path), "-c", "4096", "-ctk", "q4_0", "--budget", "16GiB")
    r = out["budget"][0]
    assert r["max_n_ctx"] == 40960
    assert "capped at the trained context (40960)" in r["note"]
    assert "metadata-only" in r["note"] and r["peak_rss_bytes"] is None
    assert "upper bound" in r["note"]


def test_unknown_workload_is_one_line(capsys):
    assert main(["predict", "--workload", "chat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workload" in err[0] and "generate" in err[0]


# -- measured: a real run against its prediction ---------------------------------------------------------

def test_bench_record_carries_prediction_and_residual(tmp_path, smollm2_path):
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[1024], pairs=[("q8_0", "q8_0")], n_prompt=512, n_gen=8, repetitions=1,
                      n_threads=2)
    res = run_sweep(spec, output=tmp_path / "r.jsonl")
    (rec,) = res.lines
    assert rec["status"] == "ok" and rec["schema_version"] == R.SCHEMA_VERSION
    proc = rec["prediction"]["process"]
    assert proc["workload"] == "bench" and proc["peak_rss_bytes"] > 0
    meas = rec["memory"]["peak_rss_bytes"]
    assert rec["memory_residual"]["peak_rss_bytes"] == meas - proc["peak_rss_bytes"]
    # the mechanism, not a fit: within 3 % and 8 MiB of the OS-measured peak on this CPU
    assert abs(meas - proc["peak_rss_bytes"]) <= min(8 * MIB, 0.03 * meas), (meas / MIB, proc["peak_rss_bytes"] / MIB)


def test_bench_without_flash_attention_counts_the_scores_work_buffer(tmp_path, smollm2_path):
    """-fa off over 1536 cells of depth filled in ubatches of 512: the work buffer grows to the scores converted for
    V (1536 x 512 x 9 heads in f16, 13.5 MiB; the weights' activations need 0.9), measured within 3 % and 8 MiB as
    the flash-attention runs are (it was 15.6 MiB under at depth 2048 before it was modelled)."""
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[2048], pairs=[("f16", "f16")], n_prompt=64, n_gen=4, repetitions=1,
                      n_threads=2, flash_attn=["off"], depths=[1536])
    (rec,) = run_sweep(spec, output=tmp_path / "r.jsonl").lines
    assert rec["status"] == "ok", rec.get("reason")
    work = {p["name"]: p for p in rec["prediction"]["process"]["parts"]}["thread work buffer"]
    assert work["bytes"] >= 1536 * 512 * 9 * 2 and "without flash attention" in work["note"]
    meas = rec["memory"]["peak_rss_bytes"]
    assert abs(rec["memory_residual"]["peak_rss_bytes"]) <= min(8 * MIB, 0.03 * meas), rec["memory_residual"]


def test_bench_no_mmap_is_anonymous(tmp_path, smollm2_path):
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[1024], pairs=[("f16", "f16")], n_prompt=512, n_gen=8, repetitions=1,
                      n_threads=2, no_mmap=True)
    (rec,) = run_sweep(spec, output=tmp_path / "r.jsonl").lines
    assert rec["status"] == "ok" and rec["settings"]["no_mmap"] is True
    names = [p["name"] for p in rec["prediction"]["process"]["parts"]]
    assert "weights (--no-mmap)" in names and "weights (mmap)" not in names
    mem = rec["memory"]
    # the weights are anonymous now: the file-backed share after the fill is small
    assert mem["file_after_fill_bytes"] < 40 * MIB
    assert abs(rec["memory_residual"]["peak_rss_bytes"]) <= min(8 * MIB, 0.03 * mem["peak_rss_bytes"])


# -- schema 2 --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["tests/data/smollm2-sweep.jsonl", "tests/data/cuda-h100-smollm2.jsonl",
                                  "tests/data/cuda-h100/smollm2-135m.jsonl", "tests/data/cuda-h100/gemma3-270m.jsonl",
                                  # the measured reports' sweeps as committed before the re-measure with schema 2
                                  "tests/data/v1/reports-smollm2-135m-sweep.jsonl",
                                  "tests/data/v1/reports-gemma3-270m-sweep.jsonl"])
def test_v1_files_upgrade(path):
    raw = [json.loads(x) for x in (ROOT / path).read_text().splitlines() if x.strip()]
    assert {r["schema_version"] for r in raw} == {1}
    recs = R.load(ROOT / path)
    assert len(recs) == len(raw)
    for old, new in zip(raw, recs):
        assert new["schema_version"] == R.SCHEMA_VERSION == 5
        assert new["prediction"]["process"] is None and new["prediction"]["speed"] is None and "memory_residual" not in new
        assert new["memory"] == old.get("memory") and new["config_key"] == old["config_key"]


def test_v2_record_with_process_roundtrips(tmp_path):
    rec = json.loads((ROOT / "tests" / "data" / "smollm2-sweep.jsonl").read_text().splitlines()[0])
    rec["schema_version"] = 2
    rec["prediction"]["process"] = {"workload": "bench", "peak_rss_bytes": 1, "device_bytes": {}, "parts": [],
                                    "notes": []}
    R.append(tmp_path / "r.jsonl", R.as_record(rec))
    # a v2 record reads as v4: the same, with the speed never predicted (None) and its speed intervals recomputed
    got = R.load(tmp_path / "r.jsonl")
    want = {**rec, "schema_version": R.SCHEMA_VERSION, "prediction": {**rec["prediction"], "speed": None},
            "speed": got[0]["speed"]}
    assert got == [want] and got[0]["speed"]["tg"]["samples_ts"] == rec["speed"]["tg"]["samples_ts"]


def _shape(tmp_path):
    """The shape of a small llama header (no llama.cpp: the cache formula only)."""
    from edgekv.sources.tinymodel import write_llama

    path = tmp_path / "shape.gguf"
    if not path.exists():
        write_llama(path, n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, mat_type="Q4_0")
    return load_model(str(path)).shape


def test_context_params_untouched(tmp_path):
    # the workload graph is a separate dry run: the configuration itself is what the user asked for
    from edgekv.core.predict import predict
    from edgekv.prediction.wholeprocess import ProcessSettings, workload_graphs

    c = ContextParams(n_ctx=4096)
    pred = predict(_shape(tmp_path), c)
    assert workload_graphs(c, ProcessSettings(), pred) == [c]
    g = workload_graphs(c, ProcessSettings(n_prompt=32, n_gen=8, n_depth=256), pred)
    # the fill's 256 tokens over 256 cells, then the 32-token prompt over 512: never 256 tokens over 512
    assert [(x.n_ubatch, x.n_ctx) for x in g] == [(32, 512), (256, 256)]
    assert c == ContextParams(n_ctx=4096)


def test_workload_graphs_are_the_ubatches_the_run_computes(tmp_path):
    """-ub 256 with a depth that is not a multiple of it (-c 1536 -p 64 -n 16: depth 1472): the fill's full ubatches
    end at 1280 cells, its last ubatch (192 tokens) and the prompt (64) reach 1536, so llama.cpp never computes 256
    tokens over 1536 cells (src/llama-kv-cache.cpp get_n_kv: the cells a ubatch attends over end at its last
    position, padded to 256); at -ub 512 and depth 1536 the fill's last full ubatch does reach every cell."""
    from edgekv.core.predict import predict
    from edgekv.prediction.wholeprocess import ProcessSettings, largest_compute, workload_graphs

    st = ProcessSettings(n_prompt=64, n_gen=16, n_depth=1472)
    c = ContextParams(n_ctx=1536, n_ubatch=256)
    g = workload_graphs(c, st, predict(_shape(tmp_path), c))
    assert [(x.n_ubatch, x.n_ctx) for x in g] == [(192, 1536), (256, 1280)]
    assert all(x.type_k == c.type_k and x.n_batch >= x.n_ubatch for x in g)
    c = ContextParams(n_ctx=2048, n_ubatch=512)
    st = ProcessSettings(n_prompt=512, n_gen=16, n_depth=1536)
    assert [(x.n_ubatch, x.n_ctx) for x in workload_graphs(c, st, predict(_shape(tmp_path), c))] == [(512, 2048)]
    # the dry run whose CPU compute buffer is the largest stands for the workload; a failed one explains itself

    @dataclass
    class R:
        ok: bool
        log: object = None
        error: str = ""

    @dataclass
    class Log:
        compute_buffers: dict

    a, b = R(True, Log({"CPU": 39.5})), R(True, Log({"CPU": 34.3, "CUDA0": 90.0}))
    assert largest_compute([b, a]) is a
    bad = R(False, None, "refused")
    assert largest_compute([a, bad]) is bad and largest_compute([]) is None


def test_restored_depth_still_fills_in_the_measured_process(tmp_path):
    """Issue 68: edgekv bench fills the depth in the measured process before it saves the sliding-window state to a
    file, so a restored depth keeps the fill's full ubatches among the graphs (Gemma -c 2048 -p 128: 512 tokens, not
    the prompt's 128); the restore adds only its read buffer."""
    from edgekv.core.predict import predict
    from edgekv.prediction.wholeprocess import ProcessSettings, workload_graphs, workload_spans

    c = ContextParams(n_ctx=2048, n_ubatch=512)
    pred = predict(_shape(tmp_path), c)
    kept, restored = (ProcessSettings(n_prompt=128, n_gen=4, n_depth=1920, restores_state_file=r) for r in (False, True))
    assert workload_spans(pred, restored) == workload_spans(pred, kept)
    assert workload_spans(pred, restored)[:4] == [(0, 512), (512, 512), (1024, 512), (1536, 384)]
    assert [(x.n_ubatch, x.n_ctx) for x in workload_graphs(c, restored, pred)] == [(384, 2048), (512, 1536)]


def test_llama_bench_depth_state_copy(smollm2_header, gemma3_header):
    from edgekv.core.predict import predict
    from edgekv.prediction.wholeprocess import state_seq_bytes

    smol = load_model(str(smollm2_header)).shape
    # 30 layers x (K + V) x 3 heads x 64 x f16, per cell, plus 12 bytes of cell metadata
    assert state_seq_bytes(predict(smol, ContextParams(n_ctx=4096)), 3584) == 3584 * (30 * 2 * 192 * 2 + 12)
    gem = load_model(str(gemma3_header)).shape
    pr = predict(gem, ContextParams(n_ctx=8192))
    swa = next(c for c in pr.caches if c.kind == "swa")
    full = next(c for c in pr.caches if c.kind == "full")
    # the sliding-window cache saves at most its own cells
    assert state_seq_bytes(pr, 7680) == (7680 * (full.bytes // full.cells + 12) + swa.cells * (swa.bytes // swa.cells + 12))


def test_device_weights_match_llama_cpp_cuda_buffer(smollm2_header):
    # the CUDA build's own figures for SmolLM2 -ngl 99 (tests/data/cuda-h100-smollm2.jsonl, recorded on an H100:
    # "CUDA0 model buffer size = 92.17 MiB", "CPU_Mapped model buffer size = 28.69 MiB"); the prediction is computed
    # here from the real model's tensor table
    m = load_model(str(smollm2_header))
    rec = json.loads((ROOT / "tests/data/cuda-h100-smollm2.jsonl").read_text().splitlines()[0])
    bufs = rec["llama_log"]["model_buffers_mib"]
    p = predict_process(ProcessInputs(workload="bench", n_ubatch=512, n_batch=2048, n_seq_max=1, n_threads=2,
                                      tensors=m.header.tensors, n_vocab=m.shape.n_vocab, n_layer=30, n_gpu_layers=31,
                                      gpu_device="CUDA0", baseline_bytes=0))
    by = {(q.name, q.where): q.bytes for q in p.parts}
    assert f"{by[('weights', 'CUDA0')] / MIB:.2f}" == f"{bufs['CUDA0']:.2f}"
    assert f"{by[('weights (mmap)', 'host')] / MIB:.2f}" == f"{bufs['CPU_Mapped']:.2f}"


def test_llama_bench_process_predicted(llama_bench_exe, smollm2_path, tmp_path, monkeypatch):
    """--llama-bench: the prediction is made over the binary's own baseline (measured once, cached) and counts the
    depth state llama-bench keeps in memory; the measured peak of its two processes lands within the target."""
    from edgekv.sweep.run import ENGINE_LLAMA_BENCH, run_sweep
    from edgekv.sweep.spec import sweep_spec

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "home"))
    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[2048], pairs=[("f16", "f16")], n_prompt=512, n_gen=8, repetitions=1,
                      n_threads=2, engine=ENGINE_LLAMA_BENCH, llama_bench=str(llama_bench_exe))
    (rec,) = run_sweep(spec, output=tmp_path / "lb.jsonl").lines
    assert rec["status"] == "ok", rec.get("reason")
    proc = rec["prediction"]["process"]
    parts = {p["name"]: p for p in proc["parts"]}
    assert "llama-bench" in parts["runtime baseline"]["note"]
    assert parts["depth state copy"]["bytes"] == 1536 * (30 * 2 * 192 * 2 + 12)
    assert list((tmp_path / "home" / "calibration").glob("binary-*-baseline.json"))
    meas = rec["memory"]["peak_rss_bytes"]
    assert abs(meas - proc["peak_rss_bytes"]) <= min(8 * MIB, 0.03 * meas), (meas / MIB, proc["peak_rss_bytes"] / MIB)


@pytest.mark.slow
def test_report_explains_memory(tmp_path):
    # presentation only: the records are bench/memory_model.py's measured runs (the capability is tested above)
    src = ROOT / "tests" / "data" / "memory_model-smollm2-135m-base.jsonl"
    recs = R.load(src)
    assert main(["report", str(src), "-o", str(tmp_path)]) == 0
    md = (tmp_path / "README.md").read_text()
    assert "### Explained memory" in md and (tmp_path / "explained_memory.png").stat().st_size > 1000
    section = md.split("### Explained memory", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in section.splitlines() if x.startswith("| ") and not x.startswith("| configuration")]
    assert len(lines) == len(recs)
    cells = {x.split(" | ")[0].lstrip("| "): x.split(" | ") for x in lines}
    r0 = recs[0]
    row = cells[f"{r0['settings']['n_ctx']} {r0['settings']['type_k']} t{r0['settings']['n_threads']}"]
    meas, pred = r0["memory"]["peak_rss_bytes"], r0["prediction"]["process"]["peak_rss_bytes"]
    assert row[-2] == f"{(meas - pred) / MIB:+.1f}" and row[-4] == f"{pred / MIB:.1f}"


def test_unknown_compute_is_not_a_zero():
    p = predict_process(_inputs(compute_workload=None, compute_note="llama.cpp refused the context"))
    assert p.peak_rss_bytes is None and any("llama.cpp refused the context" in n for n in p.notes)


def test_binary_baseline_is_read_before_the_model(tmp_path):
    # any program that opens its "model": it waits on the FIFO, its RSS is read there, then it is let go
    import sys

    from edgekv.runtime.process import rss_before_model

    rss, why = rss_before_model(lambda model: [sys.executable, "-S", "-c", "import sys; open(sys.argv[1]).read()", model])
    assert rss is not None, why
    assert 1 * MIB < rss < 64 * MIB
    rss, why = rss_before_model(lambda model: [sys.executable, "-c", "raise SystemExit(3)"])
    assert rss is None and "exited with code 3" in why


def test_state_file_read_buffer(gemma3_header, smollm2_header):
    from edgekv.core.predict import predict
    from edgekv.prediction.wholeprocess import state_read_buffer_bytes

    gem = load_model(str(gemma3_header)).shape
    # the largest single read: a full-attention layer's K rows for the 3584 saved cells (1 KV head x 256 x f16)
    assert state_read_buffer_bytes(predict(gem, ContextParams(n_ctx=4096)), 3584) == 3584 * 512
    assert state_read_buffer_bytes(predict(gem, ContextParams(n_ctx=4096, type_k="q8_0", type_v="q8_0")), 3584) == 3584 * 272
    # beyond glibc's largest mmap threshold (32 MiB) the buffer is unmapped on free: nothing stays
    assert state_read_buffer_bytes(predict(gem, ContextParams(n_ctx=131072)), 131072 - 512) == 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["llama-cpp-python", "llama-bench"])
def test_a_repacked_tail_is_unmapped_before_the_context(engine, request, tmp_path):
    """llama.cpp unmaps the mapping outside its first and last mapped CPU tensors once the model is loaded
    (llama-model-loader.cpp unmap_fragment): a Q4_K output.weight at the end of the file is repacked, so its 18 MiB
    of file pages are read while loading and gone before the context exists.  The predicted peak is the process
    after that (a context larger than those pages) and lands within the target where counting the pages misses."""
    from edgekv.calibration.preflight import preflight
    from edgekv.sources.tinymodel import write_llama
    from edgekv.sweep.run import ENGINE_LLAMA_BENCH, run_sweep
    from edgekv.sweep.spec import sweep_spec

    if "avx2" not in calibrate.runtime_baseline().cpu_features or not preflight().repack:
        pytest.skip("needs llama.cpp's CPU_REPACK of Q4_K (an AVX2 build whose extra buffers run here)")
    path = tmp_path / "tail.gguf"
    write_llama(path, n_embd=512, n_ff=1024, n_layer=4, n_head=8, n_head_kv=8, mat_type="Q4_K", n_vocab=65536,
                values=True)
    m = load_model(str(path))
    extra = {"engine": ENGINE_LLAMA_BENCH, "llama_bench": str(request.getfixturevalue("llama_bench_exe"))} \
        if engine == "llama-bench" else {}
    spec = sweep_spec(model=m, contexts=[4096], pairs=[("f16", "f16")], n_prompt=256, n_gen=8, repetitions=1,
                      n_threads=2, **extra)
    (rec,) = run_sweep(spec, output=tmp_path / "r.jsonl").lines
    assert rec["status"] == "ok", rec.get("reason")
    proc = rec["prediction"]["process"]
    parts = {p["name"]: p for p in proc["parts"]}
    out_bytes = 65536 * 512 // 256 * 144                        # Q4_K: 144 bytes per 256 weights
    gone = parts["weights (mmap) unmapped after loading"]
    # all of it but the part in the page output_norm ends in (llama.cpp rounds the kept span out to whole pages)
    assert out_bytes - 4096 < -gone["bytes"] <= out_bytes and gone["note"].startswith("output.weight:")
    assert "weights (mmap) until loaded" not in parts           # the context (KV 32 MiB) outgrows those pages
    assert proc["peak_rss_bytes"] == sum(p["bytes"] for p in proc["parts"] if p["where"] == "host")
    meas = rec["memory"]["peak_rss_bytes"]
    assert abs(meas - proc["peak_rss_bytes"]) <= min(8 * MIB, 0.03 * meas), (meas / MIB, proc["peak_rss_bytes"] / MIB)
