"""edgekv explain: the corpus of real public llama.cpp logs (tests/data/logs) is the test of record.

Every ``llama_kv_cache`` size line in it must be reproduced exactly from the configuration the log states; model
buffers within 0.5 % of the tensors' bytes wherever the log allows the comparison.  Hostile input is read within
fixed bounds.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from edgekv.cli.main import main
from edgekv.core.explain import ExplainError, explain_lines
from edgekv.core.logconfig import parse_config, read_bounded

LOGS = Path(__file__).parents[2] / "data" / "logs"
CORPUS = sorted(LOGS.glob("*.log"))
GENERATED = sorted((LOGS / "generated").glob("*.log"))      # logs llama-cpp-python printed here, on top of the corpus
KNOWN = json.loads((LOGS / "known-defects.json").read_text(encoding="utf-8"))   # log -> check -> issue-69 defect


def _params(check: str) -> list:
    """The corpus, a log that a known defect stops marked as a strict expected failure (known-defects.json)."""
    return [pytest.param(p, id=p.stem, marks=pytest.mark.xfail(reason=KNOWN[p.name][check], strict=True))
            if check in KNOWN.get(p.name, {}) else pytest.param(p, id=p.stem) for p in CORPUS + GENERATED]


def explain_file(path: Path) -> dict:
    with open(path, "rb") as f:
        b = read_bounded(f)
    return explain_lines(path.name, b.lines)


def test_corpus_is_there():
    assert len(CORPUS) >= 8
    readme = (LOGS / "README.md").read_text()
    for p in CORPUS:
        assert p.name in readme, f"{p.name} is not in tests/data/logs/README.md"


@pytest.mark.parametrize("path", _params("kv"))
def test_every_kv_line_reproduced(path):
    r = explain_file(path)
    lines = r["kv"]["lines"]
    if not lines:           # a fragment: its configuration and a buffer line, no context created in it
        assert r["kv"]["status"] == "no KV size line in the log" and r["config"]["arch"] and r["buffers"]
        assert path.name.endswith("-fragment.log"), f"{path.name}: no KV size line ({r['kv']['status']})"
        return
    for x in lines:
        assert x["match"], f"{path.name}: {x}"
        assert x["printed_mib"] == x["predicted_mib"]


@pytest.mark.parametrize("path", _params("model"))
def test_model_buffers_within_half_a_percent(path):
    m = explain_file(path)["model"]
    if m["status"] != "predicted":
        assert "header" in m["status"] or "no model buffer" in m["status"]
        return
    # print_info rounds the tensor bytes to two decimals of GiB above 1 GiB
    slack = 100 * m.get("rounding_mib", 0) / m["predicted_mib"]
    assert abs(m["residual_pct"]) <= max(0.5, slack), m


def test_config_recovered_from_a_rocm_log():
    r = explain_file(LOGS / "rocm-rx7900xt-qwen3-8b-b5618.log")
    c = r["config"]
    assert r["build"] == "5618 (1f63e75f)"
    assert (c["arch"], c["layers"], c["kv_heads"], c["head_dim_k"], c["n_ctx"]) == ("qwen3", "36", "8", "128", "40960")
    assert c["backends"] == ["ROCm"] and c["offloaded"] == "37/37"
    assert c["weight_types"] == {"f32": 145, "q8_0": 253}
    rocm = next(g for g in r["buffers"] if g["device"] == "ROCm0")
    assert rocm["total_mib"] == round(7668.64 + 5760.00 + 1552.90, 2)
    host = next(g for g in r["buffers"] if g["device"] == "host")
    assert {b["buffer"] for b in host["buffers"]} == {"ROCm_Host"}


def test_metal_working_set_and_iswa():
    r = explain_file(LOGS / "metal-m5-gpt-oss-20b-b8164.log")
    assert [x["role"] for x in r["kv"]["lines"]] == ["full", "swa"]
    dev = next(d for d in r["devices"] if d["device"] == "MTL0")
    assert dev["limit"] == "recommendedMaxWorkingSetSize"
    assert dev["limit_mib"] == pytest.approx(19069.67e6 / 2**20, abs=0.01)
    assert dev["fits"] is True


def test_why_names_the_largest_part_and_the_alternatives():
    r = explain_file(LOGS / "rocm-rx7900xt-qwen3-8b-b5618.log")
    assert r["why"].startswith("the model buffer ROCm0 is 7.5 GiB of the 14.6 GiB on ROCm0")
    text = (LOGS / "rocm-rx7900xt-qwen3-8b-b5618.log").read_text(encoding="utf-8")
    lines = [x for x in text.splitlines() if "model buffer size" not in x]
    r = explain_lines("kv-only", lines)
    # the KV cache is then the largest part: f16 at 40960 is 5.6 GiB; q8_0 halves it plus the scales
    assert r["why"].startswith("KV f16 at 40960 is 5.6 GiB of the 7.1 GiB on ROCm0")
    assert "q8_0 would be 3.0 GiB" in r["why"] and "q4_0 would be 1.6 GiB" in r["why"]
    assert "-c 20480 would be 2.8 GiB" in r["why"]


def test_a_kv_line_that_differs_is_marked():
    text = (LOGS / "cuda-rtx3060-ollama-qwen2.5-coder-7b.log").read_text(encoding="utf-8")
    text = text.replace("size =  224.00 MiB (  4096 cells", "size =  225.00 MiB (  4096 cells")
    r = explain_lines("edited", text.splitlines())
    (x,) = r["kv"]["lines"]
    assert x["match"] is False and x["predicted_mib"] == "224.00" and "mib" in x["why"]


# -- the command line ---------------------------------------------------------------------------------------------


def test_cli_text_and_json(capsys):
    path = str(LOGS / "cuda-rtx3090-qwen3-14b-q8kv.log")
    assert main(["explain", path]) == 0
    out = capsys.readouterr().out
    assert "CUDA0" in out and "2720.00" in out and "Why so much" in out
    assert main(["explain", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv"]["lines"][0]["match"] is True
    assert d["config"]["type_k"] == "q8_0"


def test_cli_stdin(monkeypatch, capsys):
    data = (LOGS / "rocm-gfx1151-qwen3-0.6b-b5398.log").read_bytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["explain", "-", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "<stdin>"


@pytest.mark.parametrize("text, needle", [
    ("hello\nworld\n", "no llama.cpp lines"),
    ("llama_model_loader: loaded meta data with 24 key-value pairs\nprint_info: arch = llama\n", "truncated"),
    ("build: 1500 (a30b324) with cc\nllm_load_tensors:        CPU buffer size =  7338.64 MiB\n", "older than b4400"),
])
def test_cli_refuses_in_one_line(tmp_path, capsys, text, needle):
    p = tmp_path / "x.log"
    p.write_text(text)
    assert main(["explain", str(p)]) == 1
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.log")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["explain", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# -- hostile logs ---------------------------------------------------------------------------------------------------


def test_huge_line_and_binary_bytes_are_bounded():
    real = (LOGS / "cuda-rtx3060-ollama-qwen2.5-coder-7b.log").read_bytes()
    hostile = b"x" * (20 * 2**20) + b"\n" + bytes(range(256)) * 1000 + b"\n" + real
    t0 = time.monotonic()
    b = read_bounded(io.BytesIO(hostile))
    assert time.monotonic() - t0 < 10
    assert b.long_lines >= 1 and b.binary_lines >= 1
    assert max(len(x) for x in b.lines) <= 4096
    r = explain_lines("hostile", b.lines)
    assert r["kv"]["lines"][0]["match"] is True


def test_a_million_buffer_lines_are_bounded():
    line = b"load_tensors:        CUDA0 model buffer size =     1.00 MiB\n"
    t0 = time.monotonic()
    b = read_bounded(io.BytesIO(line * 1_000_000))
    assert b.stopped and "not read" in b.stopped
    assert len(b.lines) == 100_000
    r = explain_lines("flood", b.lines)
    assert time.monotonic() - t0 < 60
    assert r["buffers"][0]["total_mib"] == 100_000.0


def test_byte_budget_stops_reading():
    b = read_bounded(io.BytesIO(b"print_info: arch = llama\n" * 1000), max_bytes=1000)
    assert b.bytes_read <= 1000 + 4097 and "MiB" in b.stopped


# -- the configuration parser ----------------------------------------------------------------------------------------


def test_arrays_cut_short_are_filled_from_print_info():
    lines = [
        "llama_model_loader: - kv   0:                       general.architecture str              = llama",
        "llama_model_loader: - kv   3:              llama.attention.head_count_kv arr[i32,48]     = "
        "[8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, ...",
        "llama_model_loader: - kv   4:                          llama.block_count u32              = 48",
        "print_info: n_head_kv        = [8, 8, 0, 8]",
        "print_info: n_layer          = 48",
    ]
    cfg = parse_config(lines)
    assert cfg.truncated_arrays == ["llama.attention.head_count_kv"]
    assert cfg.metadata["llama.attention.head_count_kv"] == [8, 8, 0, 8]
    assert cfg.metadata["llama.block_count"] == 48        # the dump wins over print_info


def test_explain_error_is_one_line():
    with pytest.raises(ExplainError) as e:
        explain_lines("x", ["nothing here"])
    assert "\n" not in str(e.value)


def test_metal_fit():
    from edgekv.core.devicemem import metal_fit, working_set_mib

    gib = 2**30
    r = metal_fit(12 * gib, 1 * gib, 16 * gib)
    assert r["working_set_bytes"] == 16 * gib * 2 // 3 and r["fits_working_set"] is False and r["fits_ram"] is True
    r = metal_fit(12 * gib, 1 * gib, 24 * gib, working_set_bytes=int(19069.67e6))
    assert r["basis"] == "recommendedMaxWorkingSetSize" and r["fits_working_set"] is True
    assert round(working_set_mib(19069.67), 2) == 18186.25


def test_generated_logs_are_llama_cpp_python_logs():
    for p in GENERATED:
        r = explain_file(p)
        assert r["build"] is None and r["config"]["backends"] == ["CPU"]


@pytest.mark.parametrize("name, tied, device_mib", [
    ("rocm-rx7900xt-qwen3-8b-b5618.log", True, 7668.64),        # ROCm0 holds every tensor but token_embd, plus its copy
    ("cuda-rtx3070ti-llama3.2-3b-fragment.log", True, 3255.90),
    ("cuda-rtx3090-qwen3-14b-q8kv.log", False, 14177.36 + 788.24),   # untied: token_embd on the host, output on CUDA0
])
def test_family_tensor_table_rebuilt_from_the_log(name, tied, device_mib):
    m = explain_file(LOGS / name)["model"]
    t = m["tensor_table"]
    assert t["status"] == "rebuilt" and t["tied_output"] is tied
    assert m["source"].startswith(f"the {t['family']} tensor table rebuilt")
    assert round(t["bytes"] / 2**20, 2) == pytest.approx(device_mib, abs=0.011)


def test_mixed_quantization_is_not_guessed():
    t = explain_file(LOGS / "cuda-rtx3060-ollama-qwen2.5-coder-7b.log")["model"]["tensor_table"]
    assert "needs the header" in t["status"] and t["tied_output"] is False and "bytes" not in t
