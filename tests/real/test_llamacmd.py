"""Issue 27 point 9: the llama.cpp command a prediction or a measurement assumes, in records and on screen."""

from __future__ import annotations

import json

from edgekv.core.llamacmd import llama_cpp_args, shell_line


def test_the_arguments_follow_llama_cpps_flags():
    s = {"n_ctx": 4096, "type_k": "q8_0", "type_v": "q4_0", "flash_attn": "on", "n_batch": 2048, "n_ubatch": 256,
         "n_seq_max": 4, "kv_unified": True, "swa_full": True, "n_threads": 2, "n_gpu_layers": -1, "no_mmap": True,
         "repack": False}
    assert llama_cpp_args(s, "/m/x.gguf") == ["-m", "/m/x.gguf", "-c", "4096", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on",
                                              "-b", "2048", "-ub", "256", "-np", "4", "-t", "2", "-ngl", "999",
                                              "--kv-unified", "--swa-full", "-lm", "none", "-nr"]
    plain = llama_cpp_args({"n_ctx": 512, "type_k": "f16", "type_v": "f16", "n_threads": 0, "repack": True}, None)
    assert plain == ["-c", "512", "-ctk", "f16", "-ctv", "f16"]          # defaults left to llama.cpp
    assert shell_line("llama-server", ["-m", "/a b/x.gguf"]) == "llama-server -m '/a b/x.gguf'"


def test_predict_prints_it_with_v_and_carries_it_in_json(smollm2_header, cli):
    smollm2_path = smollm2_header
    r = cli("predict", smollm2_path, "-c", "2048", "-ctk", "q8_0", "--no-mmap", "--repack", "0", "-t", "2", "--kv-only",
            "--json")
    rec = json.loads(r.stdout)[0]
    args = rec["llama_cpp_args"]
    assert args[:2] == ["-m", str(smollm2_path)] and args[args.index("-c") + 1] == "2048"
    assert "-lm" in args and "-nr" in args and args[args.index("-t") + 1] == "2"
    r = cli("predict", smollm2_path, "-c", "2048", "-ctk", "q8_0", "--kv-only", "-v")
    assert "llama.cpp: llama-server -m " in r.stdout and "-ctk q8_0 -ctv q8_0" in " ".join(r.stdout.split())


def test_every_bench_record_carries_it(smollm2_path, tmp_path):
    from edgekv.prediction.api import load_model
    from edgekv.sweep.run import run_sweep
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(smollm2_path))
    spec = sweep_spec(model=m, contexts=[512], pairs=[("q4_0", "q4_0")], depths=[64], n_prompt=16, n_gen=4,
                      repetitions=1, n_threads=2, flash_attn=["on"])
    rec = run_sweep(spec, output=tmp_path / "c.jsonl").lines[0]
    args = rec["llama_cpp_args"]
    assert args[args.index("-c") + 1] == "512" and args[args.index("-fa") + 1] == "on"
    assert args[args.index("-ctk") + 1] == "q4_0" and args[args.index("-t") + 1] == "2"
