"""Weight types: Bonsai's Q1_0 (ggml type 41), Q2_0 (42, which gguf 0.19 does not know) and type ids llama.cpp
cannot read (forks' own types, removed types).

The vendored ggml defines Q1_0 as 128 weights in 18 bytes and Q2_0 as 64 weights in 18 bytes
(ggml/src/ggml-common.h:180-192); gguf.cpp refuses an id >= GGML_TYPE_COUNT (43) or one with block size 0
(ggml/src/gguf.cpp:730-745).  Each test builds a tiny llama GGUF (tests/tiny) with the type under test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from edgekv.core.predict import ContextParams
from edgekv.errors import GGUFFormatError
from edgekv.prediction.api import load_model
from edgekv.runtime.engine import EngineSession
from tests.tiny.writer import write_spec

SPECS = json.loads((Path(__file__).parents[1] / "tiny" / "specs.json").read_text())["families"]
ROOT = Path(__file__).resolve().parents[2]


def _spec_with(type_name: str, pick=lambda name, ne: len(ne) == 2 and ne[0] % 128 == 0 and name != "token_embd.weight"):
    spec = json.loads(json.dumps(SPECS["llama-gqa"]))
    for t in spec["tensors"]:
        if pick(t[0], t[1]):
            t[2] = type_name
    return spec


def _patch_type(path: Path, tensor: str, new_type: int) -> None:
    """Overwrite the ggml type id of one tensor in a GGUF's tensor-info table."""
    data = bytearray(path.read_bytes()[: 1 << 20])
    key = struct.pack("<Q", len(tensor)) + tensor.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    at += 4 + 8 * n_dims
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<I", new_type))


def _llama_cpp_loads(path: Path) -> bool:
    """Does the vendored llama.cpp itself accept the file's tensor table (dry run, in a child process)?"""
    code = ("import sys; from edgekv.runtime.engine import DryRunner; r = DryRunner().load(sys.argv[1]); "
            "print('LOADED' if r.ok else 'REFUSED: ' + str(r.error))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT)
    return "LOADED" in r.stdout


@pytest.mark.slow
def test_q1_0_weights_equal_llama_cpp_and_the_engine_dry_run(tmp_path):
    path = tmp_path / "q1_0.gguf"
    write_spec(path, _spec_with("q1_0"))
    m = load_model(str(path))
    by_type = m.header.weights_by_type()
    q1 = [t for t in m.header.tensors if t.ggml_type == 41]
    assert q1 and all(t.n_bytes == t.shape[0] * t.shape[1] // 128 * 18 for t in q1)
    assert by_type["q1_0"] == sum(t.n_bytes for t in q1)
    with EngineSession(str(path), header=m.header) as eng:
        assert eng.model_size_bytes == m.header.weights_bytes
        r = eng.run([ContextParams(n_ctx=4096), ContextParams(n_ctx=4096, type_k="q4_0", type_v="q4_0")])
    assert all(x.ok for x in r)


@pytest.mark.slow
def test_q2_0_is_read_although_gguf_does_not_know_it(tmp_path):
    """Type 42 (Q2_0, 64 weights in 18 bytes) exists in the vendored ggml but not in gguf 0.19's table: the last
    tensor is retyped in place and the file resized, and edgekv sizes it as llama.cpp does."""
    spec = _spec_with("f32", pick=lambda name, ne: False)
    last = spec["tensors"][-1]
    assert len(last[1]) == 2 and last[1][0] % 64 == 0, last
    path = tmp_path / "q2_0.gguf"
    size = write_spec(path, spec)
    f32_bytes = last[1][0] * last[1][1] * 4
    q2_bytes = last[1][0] * last[1][1] // 64 * 18
    _patch_type(path, last[0], 42)
    os.truncate(path, size - f32_bytes + q2_bytes)
    m = load_model(str(path))
    assert m.header.weights_by_type()["q2_0"] == q2_bytes
    with EngineSession(str(path), header=m.header) as eng:
        assert eng.model_size_bytes == m.header.weights_bytes


@pytest.mark.parametrize("type_id,words", [
    (142, "ggml type 142 is not a type llama.cpp knows"),   # PrismML's fork-only types
    (143, "ggml type 143 is not a type llama.cpp knows"),
    (43, "ggml type 43 is not a type llama.cpp knows"),     # one past GGML_TYPE_COUNT
    (31, "ggml type 31 .q4_0_4_4. was removed"),
])
@pytest.mark.parametrize("llama", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["edgekv", "and-llama.cpp"])
def test_unknown_tensor_types_are_one_clear_line(type_id, words, tmp_path, cli, llama):
    """edgekv's refusal (fast), and that llama.cpp refuses the file too (slow: it loads it)."""
    path = tmp_path / f"type{type_id}.gguf"
    write_spec(path, _spec_with("q1_0"))
    _patch_type(path, "blk.0.attn_q.weight", type_id)
    with pytest.raises(GGUFFormatError, match=words):
        load_model(str(path))
    r = cli("predict", str(path), "-c", "4096")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "blk.0.attn_q.weight" in lines[0] and f"ggml type {type_id}" in lines[0], r.stderr
    if llama:       # llama.cpp refuses the file too
        assert not _llama_cpp_loads(path)


@pytest.mark.parametrize("llama", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["edgekv", "and-llama.cpp"])
def test_a_forks_block_size_is_named_not_misread(tmp_path, cli, llama):
    """A fork that writes type 42 with its own block layout: the tensor offsets stop adding up under ggml's Q2_0
    size, and the error names the type instead of reporting a wrong size (and llama.cpp refuses it: slow)."""
    path = tmp_path / "fork-q2_0.gguf"
    write_spec(path, _spec_with("q1_0"))
    _patch_type(path, "blk.0.attn_q.weight", 42)        # written as 128-weight blocks, read as 64-weight ones
    with pytest.raises(GGUFFormatError, match=r"'blk.0.attn_q.weight' is ggml type 42, q2_0"):
        load_model(str(path))
    r = cli("inspect", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "ggml type 42" in r.stderr
    if llama:
        assert not _llama_cpp_loads(path)


@pytest.mark.slow
def test_q1_0_model_runs_a_real_bench(tmp_path):
    """A real (CPU) `edgekv bench` run of a Q1_0 model: llama.cpp computes with Q1_0 weights."""
    path = tmp_path / "q1_0.gguf"
    write_spec(path, _spec_with("q1_0"))
    env = {"EDGEKV_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", str(path), "-c", "512", "-ctk", "q8_0",
                        "-p", "8", "-n", "2", "-d", "16", "-r", "1", "-t", "2", "--no-warmup", "--json"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = json.loads(r.stdout)
    assert row["status"] == "ok"
    assert row["speed"]["pp"]["mean_ts"] > 0 and row["speed"]["tg"]["mean_ts"] > 0
    assert row["differences"]["llama_kv_matches_formula"] is True


@pytest.mark.slow
def test_engine_on_a_header_without_tensor_table_says_what_is_missing(tmp_path, cli):
    """A metadata-only header with no tensor table: the formula works, and --engine says exactly why llama.cpp
    cannot dry-run it."""
    spec = json.loads(json.dumps(SPECS["llama-gqa"]))
    spec["tensors"] = []
    path = tmp_path / "no-tensors.gguf"
    write_spec(path, spec)
    assert cli("predict", str(path), "-c", "4096").returncode == 0
    r = cli("predict", str(path), "-c", "4096", "--engine")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no tensor table" in r.stderr and "tensor 'token_embd.weight' not found" in r.stderr, r.stderr


def test_log_parser_keeps_buffers_of_unknown_kinds():
    """A cache class newer than edgekv announces a buffer the parser has no pattern for: its MiB are kept (parser
    test over recorded-style text; the live path is tests/real/test_families.py)."""
    from edgekv.core.llamalog import parse_memory_log

    log = parse_memory_log("llama_kv_cache:        CPU KV buffer size =    64.00 MiB\n"
                           "llama_kv_cache_xyz:        CPU XYZ ring buffer size =    12.50 MiB\n"
                           "llama_dsv4_comp_state:        CPU DSV4 csa state buffer size =     0.03 MiB\n")
    assert log.kv_buffers == {"CPU": 64.0} and log.state_buffers == {"CPU": 0.03}
    assert log.other_buffers == {"llama_kv_cache_xyz XYZ ring CPU": 12.5}
