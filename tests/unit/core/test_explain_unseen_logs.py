"""edgekv explain on logs of backends, locales and loaders it had not seen (issue 69): each defect, on a real public
log of tests/data/logs (sources in its README)."""

from __future__ import annotations

import io
from pathlib import Path

from edgekv.core.explain import explain_lines
from edgekv.core.logconfig import read_bounded

LOGS = Path(__file__).parents[2] / "data" / "logs"


def explain_file(name: str, lines: list[str] | None = None) -> dict:
    with open(LOGS / name, "rb") as f:
        b = read_bounded(f)
    return explain_lines(name, lines if lines is not None else b.lines)


def text_of(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


SYCL_COMMA = "sycl-arc-a770-qwen2-7b-f16-decimal-comma-b7300.log"


def test_decimal_comma_locale_is_read():
    r = explain_file(SYCL_COMMA)
    (kv,) = r["kv"]["lines"]
    assert kv["printed_mib"] == "224.00" and kv["match"] is True
    sycl = next(g for g in r["buffers"] if g["device"] == "SYCL0")
    assert sycl["total_mib"] == round(13486.77 + 224.00 + 304.00, 2)
    assert r["config"]["file_size"].startswith("14.19 GiB")
    m = r["model"]
    assert m["status"] == "predicted" and abs(m["residual_pct"]) < 0.01
    # the same log with points reads the same
    dots = explain_lines("dots", text_of(SYCL_COMMA).replace(",00 MiB", ".00 MiB").splitlines())
    assert dots["kv"]["lines"] == r["kv"]["lines"]


def test_device_name_with_nested_parentheses_keeps_name_and_free_memory():
    r = explain_file(SYCL_COMMA)
    (d,) = r["config"]["devices"]
    assert d == {"name": "SYCL0", "description": "Intel(R) Arc(TM) A770 Graphics", "free_mib": 15473}
    row = next(x for x in r["devices"] if x["device"] == "SYCL0")
    assert row["limit"] == "free at load" and row["fits"] is True


def test_replacement_character_is_text_not_binary():
    real = (LOGS / SYCL_COMMA).read_bytes()
    b = read_bounded(io.BytesIO("print_info: general.name     = caf\ufffd\n".encode() + real))
    assert b.binary_lines == 0
    b = read_bounded(io.BytesIO(b"print_info: x = \xff\xfe\n" + real))
    assert b.binary_lines == 1


METAL_WHOLE_FILE = "metal-m5-gpt-oss-20b-q4km-breakdown-b8198.log"


def test_metal_mapped_weights_counted_once():
    """MTL0_Mapped (11073.83 MiB) spans the whole file (print_info: 10.81 GiB), so the CPU_Mapped token_embd buffer
    beside it (379.71 MiB) is the same mapped pages: the weights are counted once, on the model check and in the
    totals."""
    r = explain_file(METAL_WHOLE_FILE)
    m = r["model"]
    assert m["compared_mib"] == 11073.83 and "counted once" in m["compared"] and "tied" not in m["compared"]
    assert abs(m["residual_pct"]) < 0.5
    host = next(g for g in r["buffers"] if g["device"] == "host")
    mapped = next(b for b in host["buffers"] if b["buffer"] == "CPU_Mapped")
    assert mapped["same_pages_as"] == "MTL0_Mapped"
    assert host["total_mib"] == round(sum(b["mib"] for b in host["buffers"]) - 379.71, 2)
    assert [d["name"] for d in r["config"]["devices"]] == ["MTL0"]           # listed once


def test_metal_disjoint_mapped_spans_still_add_up():
    """Phi-3 (untied, token_embd first in the file): Metal_Mapped 2021.82 + CPU_Mapped 52.84 MiB are two spans."""
    r = explain_file("metal-m4-ollama-phi3-mini-128k.log")
    assert "same pages" not in r["model"]["compared"]
    host = next(g for g in r["buffers"] if g["device"] == "host")
    assert not any("same_pages_as" in b for b in host["buffers"])


def test_predict_device_metal_counts_the_mapping_once():
    """predict --device metal: the weights are "weights (mmap)" once; this CPU's unmapping after load is not a Mac's."""
    from types import SimpleNamespace as NS

    from edgekv.prediction.devicefit import metal_rows

    parts = [NS(name="weights (mmap)", bytes=1000), NS(name="weights (mmap) unmapped after loading", bytes=-900),
             NS(name="weights (CPU_REPACK copy)", bytes=900), NS(name="KV cache", bytes=100),
             NS(name="runtime baseline", bytes=50)]
    rec = NS(prediction=NS(process=NS(parts=parts), formula=NS(n_ctx=4096, type_k="f16", type_v="f16")))
    (row,) = metal_rows([rec], ram_bytes=10_000)
    assert row["device_bytes"] == 1100 and row["host_bytes"] == 50


def test_cann_plain_offload_is_not_called_tensor_overrides():
    """CANN at -ngl 80, no override: CANN0 165.85 + CPU_Mapped 205.18 MiB is the file (371.02 MiB) to 0.01 MiB."""
    m = explain_file("cann-ascend310b4-qwen1.5-0.5b-q4_0-b5307.log")["model"]
    assert "override" not in m["status"] and "-ot" not in m.get("compared", "")
    assert m["status"] == "predicted" and m["compared_mib"] == 371.03 and abs(m["residual_pct"]) < 0.01
    assert "CANN" in m["compared"]


def test_unknown_backend_placement_is_said_unknown():
    """8 Ascend 910B4: the mxfp4 experts stay on the host (CANN lacks the type), and the host mapping spans the file:
    no sum matches, and no override is guessed."""
    m = explain_file("cann-8x-ascend910b4-gpt-oss-20b-b6115.log")["model"]
    assert "override" not in m["status"] and "unknown placement" in m["status"] and "CANN" in m["status"]


def test_print_backend_buffers_info_lines_are_model_buffers():
    r = explain_file("cpu-android-xclipse920-qwen3-4b-backendbuffers-b7343.log")
    host = next(g for g in r["buffers"] if g["device"] == "host")
    kinds = {b["buffer"]: b["kind"] for b in host["buffers"]}
    assert kinds["CPU_Mapped"] == "model" and kinds["CPU_REPACK"] == "model"
    assert "no model buffer" not in r["model"]["status"] and "repacked" in r["model"]["status"]
    assert r["config"]["offloaded"] == "0/37"
    assert host["file_backed_mib"] == 2362.55 and host["anonymous_mib"] == round(1683.28 + 0.58 + 576 + 301.75, 2)
    assert not r["why"].startswith("the print_backend_buffers_info")


def test_kv_self_size_mismatch_says_why():
    text = text_of("rocm-gfx1151-qwen3-0.6b-b5398.log")
    line = next(x for x in text.splitlines() if "KV self size" in x)
    edited = text.replace(line, line.replace("448.00 MiB, K", "449.00 MiB, K"))
    (x,) = explain_lines("edited", edited.splitlines())["kv"]["lines"]
    assert x["match"] is False and x["why"] and "mib" in x["why"]


def test_kv_over_several_devices_names_them():
    r = explain_file("cuda-rtx4090-rtx5090-qwen3moe-30b-a3b-b5622.log")
    assert "every device" not in r["why"] and "over CUDA0, CUDA1" in r["why"]


def test_a_model_loaded_twice_is_explained_once():
    """ollama loads the vocabulary, then the model: the tensor counts were doubled (f32 282 for 141)."""
    r = explain_file("cuda-rtx3060-ollama-qwen2.5-coder-7b-two-loads.log")
    assert r["config"]["weight_types"] == {"f32": 141, "q4_K": 169, "q6_K": 29}
    assert any("loaded this model 2 times" in n and "last load" in n for n in r["notes"])
    assert [d["name"] for d in r["config"]["devices"]] == ["CUDA0"]
    one = explain_file("cuda-rtx3060-ollama-qwen2.5-coder-7b.log")
    assert r["kv"]["lines"] == one["kv"]["lines"] and r["model"] == one["model"]


def _cut_inside_kv_size_line(name: str) -> list[str]:
    lines = text_of(name).splitlines()
    i = next(i for i, x in enumerate(lines) if "llama_kv_cache: size =" in x)
    return lines[:i] + [lines[i][:lines[i].index("cells") + 5]]


def test_a_log_cut_inside_its_kv_line_is_said_cut():
    r = explain_lines("cut", _cut_inside_kv_size_line(SYCL_COMMA))
    assert r["cut"].startswith("cut: the log ends inside a KV line")
    # the KV buffer line that is there is checked; no fit verdict stands without the compute buffers
    (row,) = r["kv_buffers"]["rows"]
    assert row == {**row, "device": "SYCL0", "printed_mib": "224.00", "predicted_mib": "224.00", "match": True}
    sycl = next(d for d in r["devices"] if d["device"] == "SYCL0")
    assert sycl["fits"] is None and "compute" in sycl["fit_withheld"]
    whole = explain_file(SYCL_COMMA)
    assert "cut" not in whole and next(d for d in whole["devices"] if d["device"] == "SYCL0")["fits"] is True


def test_a_log_without_compute_buffers_gives_no_fit_verdict():
    """The Ascend 310B4 run asserts after its KV lines: no compute buffer was ever reserved."""
    r = explain_file("cann-ascend310b4-qwen1.5-0.5b-q4_0-b5307.log")
    assert "compute buffers" in r["cut"]
    assert all(d.get("fits") is None for d in r["devices"])


def test_per_device_kv_buffers_follow_the_layer_split():
    # partial offload, one GPU: 93 of 94 layers on Vulkan0, 1 on the CPU (8 MiB a layer)
    r = explain_file("vulkan-gfx1151-qwen3moe-235b-partial-b5398.log")
    rows = {x["device"]: x for x in r["kv_buffers"]["rows"]}
    assert (rows["Vulkan0"]["predicted_mib"], rows["CPU"]["predicted_mib"]) == ("744.00", "8.00")
    assert all(x["match"] for x in rows.values())
    # partial offload on Metal (24/28, deepseek2)
    rows = {x["device"]: x for x in explain_file("metal-m2-deepseek2-lite-partial.log")["kv_buffers"]["rows"]}
    assert (rows["Metal"]["predicted_mib"], rows["CPU"]["predicted_mib"]) == ("240.00", "30.00")
    # two GPUs split by free memory (9862 vs 31518 MiB), and eight Ascend NPUs with two caches each
    for name, n in (("cuda-rtx4090-rtx5090-qwen3moe-30b-a3b-b5622.log", 2), ("cann-8x-ascend910b4-gpt-oss-20b-b6115.log", 8)):
        rows = explain_file(name)["kv_buffers"]["rows"]
        assert len(rows) == n and all(x["match"] for x in rows), rows


def test_a_per_device_kv_buffer_that_differs_is_marked():
    text = text_of("vulkan-gfx1151-qwen3moe-235b-partial-b5398.log").replace(
        "CPU KV buffer size =     8.00 MiB", "CPU KV buffer size =    16.00 MiB")
    rows = {x["device"]: x for x in explain_lines("edited", text.splitlines())["kv_buffers"]["rows"]}
    assert rows["CPU"]["match"] is False and "layer split" in rows["CPU"]["why"]


# -- explain --check ------------------------------------------------------------------------------------------------


def test_check_passes_on_a_log_edgekv_reproduces(capsys):
    from edgekv.cli.main import main

    assert main(["explain", str(LOGS / SYCL_COMMA), "--check"]) == 0
    assert "disagree" not in capsys.readouterr().err


def test_check_fails_on_a_kv_line_that_differs(tmp_path, capsys):
    from edgekv.cli.main import main

    p = tmp_path / "edited.log"
    p.write_text(text_of("cuda-rtx3060-ollama-qwen2.5-coder-7b.log").replace(
        "size =  224.00 MiB (  4096 cells", "size =  225.00 MiB (  4096 cells"))
    assert main(["explain", str(p)]) == 0                 # shown, not failed on, without --check
    capsys.readouterr()
    assert main(["explain", str(p), "--check"]) == 1
    err = capsys.readouterr().err
    assert "explain --check: " in err and "225.00" in err and err.count("\n") == 1


def test_check_fails_on_a_cut_log_and_says_so_in_json(tmp_path, capsys):
    import json

    from edgekv.cli.main import main

    p = tmp_path / "cut.log"
    p.write_text("\n".join(_cut_inside_kv_size_line(SYCL_COMMA)) + "\n")
    assert main(["explain", str(p), "--check", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["check"]["ok"] is False and d["cut"].startswith("cut:") and d["schema_version"] >= 1


# -- explain --json: the typed, versioned report -------------------------------------------------------------------


def test_json_is_the_typed_report_on_every_log():
    import msgspec

    from edgekv.core.explainschema import SCHEMA_VERSION, ExplainReport
    from edgekv.output.explainview import to_json

    for p in sorted(LOGS.glob("*.log")):
        d = to_json(explain_file(p.name))
        assert d["schema_version"] == SCHEMA_VERSION
        assert all(isinstance(x["match"], bool) for x in d["kv"]["lines"]), p.name
        assert all(x.get("why") for x in d["kv"]["lines"] if not x["match"]), p.name
        msgspec.convert(d, ExplainReport)                      # round-trips through the schema


def test_json_refuses_a_field_of_the_wrong_type():
    import msgspec
    import pytest

    from edgekv.output.explainview import to_json

    r = explain_file(SYCL_COMMA)
    r["kv"]["lines"][0]["match"] = "yes"
    with pytest.raises(msgspec.ValidationError, match="match"):
        to_json(r)


def test_host_total_says_what_is_file_backed():
    """CPU_Mapped (the file, 2362.55 MiB) beside CPU_REPACK (1683.28 MiB, an anonymous copy of most of it): the host
    total is not two full weights of RAM, and the answer says which part is the mapped file."""
    r = explain_file("cpu-android-xclipse920-qwen3-4b-backendbuffers-b7343.log")
    host = next(g for g in r["buffers"] if g["device"] == "host")
    assert host["file_backed_mib"] == 2362.55 and host["anonymous_mib"] < host["total_mib"] - 2000
    assert "2.3 GiB file-backed: the mapped model file" in r["why"] and "2.5 GiB anonymous" in r["why"]


def test_metal_untied_model_is_not_counted_twice():
    """Qwen2 14B (the rebuilt table says untied): Metal_Mapped 10013.43 MiB is the file (9.78 GiB), so adding the
    CPU_Mapped token_embd (509.13 MiB) gave +5.07 %; counted once it is within the print's rounding."""
    m = explain_file("metal-m1pro-qwen2-14b-c4096-b4840.log")["model"]
    assert m["tensor_table"]["tied_output"] is False
    assert m["compared_mib"] == 10013.43 and abs(m["residual_pct"]) < 0.1


def test_metal_64k_context_does_not_fit_the_working_set():
    r = explain_file("metal-m1pro-qwen2-14b-c64000-oom-b4840.log")
    (metal,) = [d for d in r["devices"] if d["device"] == "Metal"]
    assert metal["fits"] is False and metal["limit"] == "recommendedMaxWorkingSetSize"
    assert next(d for d in explain_file("metal-m1pro-qwen2-14b-c4096-b4840.log")["devices"]
                if d["device"] == "Metal")["fits"] is True


def test_unused_tensors_are_read_and_taken_off_the_expectation():
    """llama.cpp loads no buffer for a tensor it reports unused (an MTP layer without speculative decoding), but
    print_info's file size counts it: the expectation is the file's tensors less those.  No public log found holds
    both the unused-tensor block and the buffer lines; the rule is tested with the real block of an Ornith-1.5-9B run
    (b10712) put in front of a real load."""
    from edgekv.core.logconfig import parse_config

    unused = (LOGS / "fragments" / "metal-ornith-9b-unused-mtp-b10712.log").read_text().splitlines()
    cfg = parse_config(unused)
    assert len(cfg.unused_tensors) == 15 and sum(cfg.unused_tensors.values()) == 150_980_608
    base = "cuda-rtx3060-ollama-qwen2.5-coder-7b.log"          # Q4_K_M: the reference is print_info's 4.36 GiB
    plain = explain_file(base)["model"]
    lines = text_of(base).splitlines()
    i = next(i for i, x in enumerate(lines) if "loading model tensors" in x)
    both = explain_lines("spliced", lines[:i + 1] + unused + lines[i + 1:])["model"]
    assert both["unused_mib"] == 143.99 and "unused tensors" in both["source"]
    assert both["predicted_mib"] == round(4.36 * 1024 - 150_980_608 / 2**20, 2) != plain["predicted_mib"]
    # without the sizes, no figure is claimed
    nosize = [x.replace(" (size = ", " (").split(" (")[0] + " -- ignoring" for x in unused]
    m = explain_lines("nosize", lines[:i + 1] + nosize + lines[i + 1:])["model"]
    assert m["status"].startswith("the log ignores unused tensors without printing their sizes")


def test_json_schema_names_the_fields_ci_reads():
    from edgekv.core.explainschema import json_schema

    defs = json_schema()["$defs"]
    assert {"match", "why", "printed_mib", "predicted_mib"} <= set(defs["KVLine"]["properties"])
    assert {"schema_version", "kv", "kv_buffers", "check", "cut"} <= set(defs["ExplainReport"]["properties"])


def test_check_fails_on_model_buffers_and_kv_buffers_that_differ(tmp_path, capsys):
    from edgekv.cli.main import main

    for old, new, what in (("SYCL0 model buffer size = 13486,77 MiB", "SYCL0 model buffer size = 13886,77 MiB",
                            "model buffers"),
                           ("SYCL0 KV buffer size =   224,00 MiB", "SYCL0 KV buffer size =   256,00 MiB",
                            "KV buffer SYCL0")):
        p = tmp_path / "edited.log"
        p.write_text(text_of(SYCL_COMMA).replace(old, new))
        assert main(["explain", str(p), "--check"]) == 1, what
        assert what in capsys.readouterr().err
