"""``predict --device metal`` against what the public Metal logs show (tests/data/logs/metal-*.log).

For each Metal log at full offload: the working-set use edgekv predicts (every tensor's bytes, as Metal maps the
file, plus the KV cache predicted from the configuration the log states) against the Metal buffers the log printed,
and the fit verdict against what happened.  The M1 Pro pair is the public case of a 32 GB Mac that ran a 14B model
at -c 4096 and ran out of GPU memory at -c 64000 (kIOGPUCommandBufferCallbackErrorOutOfMemory): edgekv must say
"fits" for the first and "does not fit" for the second.  The slow test runs the real ``edgekv predict --device
metal`` on a header rebuilt from the log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgekv.core.devicemem import METAL_BEYOND_BUFFERS_MIB, metal_fit, working_set_mib
from edgekv.core.explain import explain_lines
from edgekv.core.logconfig import parse_config, read_bounded

LOGS = Path(__file__).parents[2] / "data" / "logs"
METAL = sorted(LOGS.glob("metal-*.log"))
OOM = ("kIOGPUCommandBufferCallbackErrorOutOfMemory", "failed to allocate")
MIB = 2**20


def _read(path: Path) -> tuple[list[str], dict]:
    with open(path, "rb") as f:
        lines = read_bounded(f).lines
    return lines, explain_lines(path.name, lines)


def _tensor_mib(cfg) -> tuple[float, float]:
    """print_info's file size (the tensors' bytes) in MiB, and the rounding of that print."""
    m = re.match(r"([\d.]+) (MiB|GiB)", cfg.print_info["file size"])
    v, unit = float(m.group(1)), m.group(2)
    return (v * 1024, 5.12) if unit == "GiB" else (v, 0.005)


def metal_check(path: Path) -> dict:
    lines, r = _read(path)
    cfg = parse_config(lines)
    if cfg.offloaded and cfg.offloaded[0] < cfg.offloaded[1]:
        return {"log": path.name, "status": "partial offload: predict --device metal assumes every layer on the GPU"}
    weights, rounding = _tensor_mib(cfg)
    kv = sum(float(x["predicted_mib"]) for x in r["kv"]["lines"])
    metal = [b for g in r["buffers"] if g["device"] != "host" for b in g["buffers"]]
    printed = sum(b["mib"] for b in metal if b["kind"] in ("model", "KV"))
    host_model = sum(b["mib"] for g in r["buffers"] if g["device"] == "host" for b in g["buffers"] if b["kind"] == "model")
    ws = working_set_mib(cfg.working_set_mb)
    fit = metal_fit(int((weights + kv) * MIB), 0, 2**50, working_set_bytes=int(ws * MIB))
    return {"log": path.name, "status": "checked", "predicted_mib": weights + kv, "printed_mib": printed,
            "rounding_mib": rounding, "host_model_mib": host_model, "working_set_mib": ws,
            "fits": fit["fits_working_set"], "ran": not any(o in path.read_text(encoding="utf-8") for o in OOM)}


@pytest.mark.parametrize("path", METAL, ids=[p.stem for p in METAL])
def test_predicted_working_set_and_verdict_match_the_log(path):
    c = metal_check(path)
    if c["status"] != "checked":
        assert path.name == "metal-m2-deepseek2-lite-partial.log", c
        return
    # Metal maps the span of the file from the first to the last tensor it uses: every tensor where token_embd is not
    # first in the file, all but token_embd where it is (the older ollama files): the prediction errs on the safe side
    gap = c["predicted_mib"] - c["printed_mib"]
    assert -c["rounding_mib"] - 0.01 <= gap <= c["host_model_mib"] + c["rounding_mib"] + 0.01, c
    assert c["fits"] == c["ran"], c


def test_the_m1_pro_that_ran_out_of_memory_at_64000():
    ran = metal_check(LOGS / "metal-m1pro-qwen2-14b-c4096-b4840.log")
    oom = metal_check(LOGS / "metal-m1pro-qwen2-14b-c64000-oom-b4840.log")
    assert ran["ran"] and ran["fits"]
    assert not oom["ran"] and not oom["fits"]
    # 9.78 GiB of weights + 12000 MiB of f16 KV at 64000 cells: past the 21845.34 MiB working set before any compute
    assert oom["predicted_mib"] == pytest.approx(10014.72 + 12000, abs=0.01)
    assert oom["working_set_mib"] == pytest.approx(21845.34, abs=0.01)


def test_a_verdict_that_disagrees_fails(tmp_path):
    """The check can fail: the OOM log with its error lines removed reads as a run the prediction says cannot fit."""
    text = (LOGS / "metal-m1pro-qwen2-14b-c64000-oom-b4840.log").read_text(encoding="utf-8")
    p = tmp_path / "metal-edited.log"
    p.write_text("\n".join(x for x in text.splitlines() if not any(o in x for o in OOM)), encoding="utf-8")
    c = metal_check(p)
    assert c["ran"] and not c["fits"]


def test_metal_holds_nothing_beyond_its_buffers():
    """The breakdown tables at exit show 0 MiB unaccounted on every Metal device with one context (docs/explain.md):
    predict --device metal adds nothing for the Metal runtime, and says so."""
    assert METAL_BEYOND_BUFFERS_MIB == 0
    r = metal_fit(10 * 2**30, 0, 32 * 2**30)
    assert "beyond" in r["overhead"] and r["overhead_bytes"] == 0


# -- the real predict, on a header rebuilt from the M1 Pro log ---------------------------------------------------------

def _qwen2_q5_k_m(n_layer: int, n_embd: int, n_kv: int, n_ff: int, n_vocab: int) -> list[list]:
    """Qwen2's tensor table with llama.cpp's Q5_K_M choices (llama-quant.cpp: output q6_K; attn_v and ffn_down q6_K
    on the layers use_more_bits picks: the first and last eighth and every third in between, else q5_K)."""
    def more(i: int) -> bool:
        return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2

    t = [["token_embd.weight", [n_embd, n_vocab], "q5_k"], ["output_norm.weight", [n_embd], "f32"],
         ["output.weight", [n_embd, n_vocab], "q6_k"]]
    for i in range(n_layer):
        b, hi = f"blk.{i}.", "q6_k" if more(i) else "q5_k"
        t += [[b + "attn_norm.weight", [n_embd], "f32"], [b + "attn_q.weight", [n_embd, n_embd], "q5_k"],
              [b + "attn_q.bias", [n_embd], "f32"], [b + "attn_k.weight", [n_embd, n_kv], "q5_k"],
              [b + "attn_k.bias", [n_kv], "f32"], [b + "attn_v.weight", [n_embd, n_kv], hi],
              [b + "attn_v.bias", [n_kv], "f32"], [b + "attn_output.weight", [n_embd, n_embd], "q5_k"],
              [b + "ffn_norm.weight", [n_embd], "f32"], [b + "ffn_gate.weight", [n_embd, n_ff], "q5_k"],
              [b + "ffn_up.weight", [n_embd, n_ff], "q5_k"], [b + "ffn_down.weight", [n_ff, n_embd], hi]]
    return t


def m1_pro_header(path: Path) -> Path:
    """The model of the M1 Pro logs as a sparse GGUF: the log's metadata (loader dump, print_info), Qwen2's tensor
    table at the log's shape with Q5_K_M's types; its tensor counts and bytes are checked against the log."""
    from tools.gguf_writer import tensor_nbytes, write_gguf

    lines, _ = _read(LOGS / "metal-m1pro-qwen2-14b-c64000-oom-b4840.log")
    meta = parse_config(lines).metadata
    tensors = _qwen2_q5_k_m(48, 5120, 1024, 13824, 151665)
    counts = {ty: sum(1 for t in tensors if t[2] == ty) for ty in ("f32", "q5_k", "q6_k")}
    assert counts == {"f32": 241, "q5_k": 289, "q6_k": 49}          # the loader's type counts
    total = sum(tensor_nbytes(ne, ty) for _, ne, ty in tensors) / MIB
    assert total == pytest.approx(10014.72, abs=5.12)                # print_info: 9.78 GiB
    kv = [["general.architecture", "string", "qwen2"], ["qwen2.vocab_size", "uint32", 151665],
          ["tokenizer.ggml.model", "string", "none"]]
    types = {int: "uint32", float: "float32", str: "string"}
    for k, v in meta.items():
        if k.startswith("qwen2.") and type(v) in types and k != "qwen2.vocab_size":
            kv.append([k, types[type(v)], v])
    write_gguf(path, "qwen2", kv, tensors)
    return path


@pytest.mark.slow
def test_predict_device_metal_on_the_m1_pro(tmp_path, capsys):
    from edgekv.cli.main import main

    gguf = m1_pro_header(tmp_path / "deepseek-r1-distill-qwen-14b-q5_k_m.gguf")
    assert main(["predict", str(gguf), "-c", "4096,64000", "--device", "metal", "--device-memory", "32GiB",
                 "--json"]) == 0
    rows = {r["n_ctx"]: r for r in json.loads(capsys.readouterr().out)["device_fit"] if r["type_k"] == "f16"}
    assert rows[4096]["fits_working_set"] is True
    assert rows[64000]["fits_working_set"] is False
    # working set: 2/3 of 32 GiB = 21845.33 MiB; the M1 Pro's own 22906.50 MB is 21845.34 MiB
    assert rows[64000]["working_set_bytes"] / MIB == pytest.approx(21845.33, abs=0.01)
    # weights + KV on the GPU: the log's 10013.43 MiB Metal_Mapped + 12000.00 MiB of KV (edgekv: 10013.41 + 12000)
    assert rows[64000]["device_bytes"] / MIB == pytest.approx(10013.43 + 12000.0, abs=0.05)
    assert rows[4096]["device_bytes"] / MIB == pytest.approx(10013.43 + 768.0, abs=0.05)
