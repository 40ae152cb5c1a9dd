"""edgekv explain on logs llama.cpp prints here: SmolLM2 and Gemma 3 loaded through llama-cpp-python with
``verbose=True`` in a child process, whose stderr is the log.  Real runs: every test is slow (the model fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgekv.cli.main import main
from edgekv.core.explain import explain_lines
from edgekv.core.logconfig import read_bounded

CHILD = """
import sys
from llama_cpp import Llama
kw = dict(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), verbose=True, n_threads=1)
if sys.argv[3] != "-":
    kw["swa_full"] = sys.argv[3] == "1"
if sys.argv[4] == "q8":
    import llama_cpp
    kw.update(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, flash_attn=True)
Llama(**kw)
"""


def llama_log(model: Path, n_ctx: int, swa_full: str = "-", cache: str = "f16") -> str:
    p = subprocess.run([sys.executable, "-c", CHILD, str(model), str(n_ctx), swa_full, cache],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stderr


def check(log: str, n_lines: int) -> dict:
    r = explain_lines("real", log.splitlines())
    lines = r["kv"]["lines"]
    assert len(lines) == n_lines, r["kv"]
    assert all(x["match"] for x in lines), lines
    return r


def test_smollm2_log_from_llama_cpp_python(smollm2_path, tmp_path, capsys):
    log = llama_log(smollm2_path, 8192, cache="q8")
    r = check(log, 1)
    assert r["config"]["arch"] == "llama" and r["config"]["type_k"] == "q8_0"
    assert r["build"] is None                    # llama-cpp-python prints no build line
    assert r["model"]["status"] == "predicted" and abs(r["model"]["residual_pct"]) <= 0.5
    # with the model's header the prediction is the full one: the tensor table, not print_info's rounded sum
    path = tmp_path / "smollm2.log"
    path.write_text(log)
    assert main(["explain", str(path), "-m", str(smollm2_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["source"] == "the GGUF header's tensor table"
    assert abs(d["model"]["residual_pct"]) <= 0.5
    assert all(x["match"] for x in d["kv"]["lines"])
    # the compute buffer of a CPU log beside llama.cpp's own dry run of the same context (same build here: equal)
    assert main(["explain", str(path), "-m", str(smollm2_path), "--engine", "--json"]) == 0
    (c,) = json.loads(capsys.readouterr().out)["compute"]
    assert c["buffer"] == "CPU" and c["predicted_mib"] == c["printed_mib"]


@pytest.mark.parametrize("swa_full", ["0", "-"])
def test_gemma3_log_from_llama_cpp_python(gemma3_path, swa_full):
    # Llama()'s defaults: flash attention off (V padded where widths differ) and a full-size SWA cache
    log = llama_log(gemma3_path, 4096, swa_full)
    r = check(log, 2)
    full, swa = r["kv"]["lines"]
    assert (full["role"], swa["role"]) == ("full", "swa")
    assert swa["cells"] == (1024 if swa_full == "0" else 4096)
    assert r["config"]["arch"] == "gemma3"


def test_stdin_and_the_bounded_reader_on_a_real_log(smollm2_path):
    log = llama_log(smollm2_path, 2048)
    import io

    b = read_bounded(io.BytesIO(log.encode()))
    assert b.stopped is None and b.long_lines == 0
    r = explain_lines("x", b.lines)
    assert r["kv"]["lines"][0]["match"]
