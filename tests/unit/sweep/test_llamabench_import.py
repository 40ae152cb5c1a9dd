"""llama-bench JSON rows imported as typed records, and the typed blocks of a llama-server run
(edgekv.sweep.llamabench, edgekv.sweep.serving), without running either binary."""

from __future__ import annotations

import json

import pytest
from msgspec import UNSET

from edgekv.errors import ResultsError
from edgekv.records import schema as S
from edgekv.sweep.llamabench import from_llama_bench_row, load_llama_bench_file


def row(**kw):
    """One row of llama-bench's -o json / -o jsonl output (its field names and types)."""
    return {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU",
            "model_filename": "/m/SmolLM2.gguf", "model_type": "llama 135M Q4_1", "model_size": 96576768,
            "n_batch": 2048, "n_ubatch": 512, "n_threads": 2, "type_k": "q8_0", "type_v": "q8_0",
            "n_gpu_layers": 99, "flash_attn": True, "n_prompt": 0, "n_gen": 32, "n_depth": 0,
            "samples_ns": [1, 1], "samples_ts": [80.0, 81.0], "avg_ts": 80.5, **kw}


def test_a_row_is_a_typed_llama_bench_record():
    r = from_llama_bench_row(row(), "f.json", "f.json: entry 1")
    assert isinstance(r, S.LlamaBenchRecord) and r.kind == "llama-bench" and r.config_key is None
    assert (r.settings.test, r.settings.flash_attn, r.settings.repetitions, r.settings.n_ctx) == ("tg", "on", 2, None)
    assert r.settings.repack is UNSET and r.time_utc is None and r.source_file == "f.json"
    assert isinstance(r.speed.tg, S.SpeedTest) and r.speed.tg.n_tokens == 32 and r.speed.tg.mean_ts == 80.5
    assert r.speed.tg.llama_bench_avg_ts is UNSET                 # an import keeps the samples, not llama-bench's mean
    env = r.environment
    assert isinstance(env, S.Environment)
    assert (env.cpu_model, env.backends, env.devices, env.llama_cpp_commit, env.llama_bench_build_number) == \
        ("AMD EPYC", ["CPU"], None, "0c1e570", 1)
    # what is written: the typed record encodes to the plain dict, and reads back equal
    assert S.decode(S.encode(r), "x") == r


@pytest.mark.parametrize("kw,test,fa,backends,devices", [
    ({"n_prompt": 512, "n_gen": 0, "flash_attn": 1, "gpu_info": "NVIDIA H100 80GB HBM3", "backends": "CUDA"},
     "pp", "on", ["CUDA"], ["NVIDIA H100 80GB HBM3"]),
    ({"n_prompt": 64, "n_gen": 16, "flash_attn": -1, "gpu_info": "Apple M2", "backends": "Metal,BLAS"},
     "pg", "auto", ["Metal", "BLAS"], ["Apple M2"]),
    ({"flash_attn": False, "gpu_info": "NVIDIA H100, NVIDIA H100", "backends": "CUDA,BLAS"},
     "tg", "off", ["CUDA", "BLAS"], ["NVIDIA H100, NVIDIA H100"]),
])
def test_gpu_info_and_backends_become_lists_of_names(kw, test, fa, backends, devices):
    """llama-bench prints its GPUs as one string and its backends comma-separated; the environment holds lists
    (devices: llama-bench's gpu_info as one entry, as it printed it)."""
    r = from_llama_bench_row(row(**kw), "f.json", "w")
    assert (r.settings.test, r.settings.flash_attn) == (test, fa)
    assert (r.environment.backends, r.environment.devices) == (backends, devices)
    assert S.encode(r)["environment"]["devices"] == devices


def test_repack_depth_and_missing_keys():
    r = from_llama_bench_row(row(repack=0, n_depth=512, test_time="2025-01-01T00:00:00Z"), "f", "w")
    assert (r.settings.repack, r.settings.n_depth, r.time_utc) == (False, 512, "2025-01-01T00:00:00Z")
    bare = {k: v for k, v in row(samples_ns=None).items() if k not in ("n_depth", "avg_ts", "gpu_info", "backends")}
    r = from_llama_bench_row(bare, "f", "w")
    assert r.settings.n_depth == 0 and r.speed.tg.samples_ns is None
    assert (r.environment.backends, r.environment.devices) == (None, None)


@pytest.mark.parametrize("kw,key", [
    ({"n_batch": "2048"}, "settings.n_batch"), ({"samples_ns": ["a", "b"]}, r"speed.tg.samples_ns\[0\]"),
    ({"gpu_info": 5}, "environment.devices"), ({"build_number": "1"}, "environment.llama_bench_build_number"),
    ({"n_prompt": "0"}, "settings.n_prompt"), ({"model_size": "big"}, "model.size_bytes"),
])
def test_a_mistyped_value_refuses_the_file_in_one_line(tmp_path, kw, key):
    p = tmp_path / "lb.json"
    p.write_text(json.dumps([row(), row(**kw)]))
    with pytest.raises(ResultsError, match=rf"lb\.json: entry 2: {key}: expected") as e:
        load_llama_bench_file(p)
    assert "\n" not in str(e.value)


def test_jsonl_file_loads_each_row(tmp_path):
    p = tmp_path / "lb.jsonl"
    p.write_text(json.dumps(row()) + "\n" + json.dumps(row(n_prompt=32, n_gen=0)) + "\n")
    recs = load_llama_bench_file(p)
    assert [r.settings.test for r in recs] == ["tg", "pp"] and all(r.source_file == str(p) for r in recs)


def test_server_rounds_make_typed_speed_and_serving_blocks():
    from edgekv.runtime.server import LevelResult, RequestResult
    from edgekv.sweep.serving import speed_and_serving

    def req(i, ok=True):
        return RequestResult(index=i, ok=ok, reason=None if ok else "HTTP 500", n_prompt=32, n_tokens=8 if ok else 0,
                             n_chunks=8, t_send_s=0.0, t_end_s=1.0, ttft_s=0.1 + i / 100 if ok else None,
                             decode_tps=20.0 if ok else None,
                             timings={"prompt_ms": 50.0 + i, "predicted_n": 8} if ok else None,
                             arrivals=[(0.1 + i / 100 + k / 20, k + 1) for k in range(8)] if ok else [])

    levels = [LevelResult(concurrency=2, requests=[req(0), req(1)], wall_s=1.0),
              LevelResult(concurrency=2, requests=[req(2), req(3, ok=False)], wall_s=1.0)]
    s = S.Settings(engine="llama-server", n_ctx=512, type_k="f16", type_v="f16", flash_attn="auto", swa_full=False,
                   n_seq_max=2, kv_unified=False, n_batch=2048, n_ubatch=512, n_threads=2, n_gpu_layers=-1, n_prompt=32,
                   n_gen=8, n_depth=0, repetitions=2, warmup=True, quality=None, n_parallel=2)
    speed, serving = speed_and_serving(levels, s, "/bin/llama-server", 1.5)
    assert isinstance(speed, S.Speed) and isinstance(serving, S.Serving)
    assert speed.pp.n_tokens == 64 and speed.pp.samples_ns == [51_000_000] and speed.tg.n_tokens == 16
    assert speed.tg_seq.samples_ts == [20.0, 20.0, 20.0] and speed.tg_seq.n_tokens == 8
    assert (serving.n_requests, serving.n_failed, serving.failures, serving.ready_s) == (4, 1, ["HTTP 500"], 1.5)
    assert serving.throughput_ts == 24 / 2.0 and len(serving.server_timings) == 3 and len(serving.ttft_s) == 3
    blocks = S.encode_block(speed), S.encode_block(serving)
    assert set(blocks[0]) == {"pp", "tg", "tg_seq"} and blocks[1]["path"] == "/bin/llama-server"


def test_rows_written_before_the_typed_environment_read_as_lists(tmp_path):
    """A results file an older edgekv wrote (merge) holds llama-bench's strings in environment.backends/devices; they
    read as the lists the typed environment holds, and every other key as written."""
    from edgekv.records import results as R

    old = S.encode(from_llama_bench_row(row(gpu_info="Apple M2", backends="Metal,BLAS"), "f.json", "w"))
    old["environment"] = {**old["environment"], "backends": "Metal,BLAS", "devices": "Apple M2"}
    p = tmp_path / "merged.jsonl"
    p.write_text(json.dumps(old) + "\n")
    (r,) = R.load_records(p)
    assert (r.environment.backends, r.environment.devices) == (["Metal", "BLAS"], ["Apple M2"])
    assert {k: v for k, v in S.encode(r).items() if k != "environment"} == \
        {k: v for k, v in old.items() if k != "environment"}


def test_a_record_of_an_older_llama_bench_reads_back():
    """llama-bench builds print different keys (devices is recent, gpu_info and backends have changed): what the
    user's build did not print is None in the record's llama_bench block, and the record reads back."""
    import msgspec

    from edgekv.records import schema as S
    from edgekv.sweep.llamabench import llama_bench_row

    row = llama_bench_row({"build_commit": "3f1ae2e3", "build_number": 3800, "cpu_info": "Apple M1",
                           "model_type": "llama 135M Q4_1", "n_prompt": 0, "n_gen": 128, "avg_ts": 250.0})
    lb = S.LlamaBench(path="/opt/llama.cpp/build/bin/llama-bench", build_commit=row.build_commit,
                      build_number=row.build_number, cpu_info=row.cpu_info, gpu_info=row.gpu_info,
                      backends=row.backends, model_type=row.model_type, model_size=row.model_size,
                      model_n_params=row.model_n_params, devices=row.devices, contexts=[])
    back = msgspec.json.decode(msgspec.json.encode(lb), type=S.LlamaBench, strict=True)
    assert back.devices is None and back.backends is None and back.build_number == 3800
