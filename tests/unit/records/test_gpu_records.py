"""Recorded CUDA runs (an H200, tests/data/cuda-h200/, bench/README.md's CUDA section): llama.cpp's op placement
parsed from its own scheduler output, and the records' fallback marks in the views.  Recorded output tests the
parsers and views only; the claims rest on the runs themselves."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
from rich.console import Console

from edgekv.core.llamalog import parse_graph_line, parse_placement
from edgekv.output import benchview
from edgekv.output import export as EX
from edgekv.records.results import load_records

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
RUNS = DATA / "cuda-h200"


def _log(name: str) -> str:
    return gzip.open(DATA / f"cuda-h200-sched-{name}.log.gz", "rt").read()


def test_flash_attention_over_iq4_nl_runs_on_the_cpu():
    # GGML_SCHED_DEBUG=2 in llama.cpp's dry run of SmolLM2 with every layer on CUDA0, -ctk/-ctv iq4_nl -fa on:
    # the CUDA build has no flash-attention kernel for iq4_nl, so each layer's FLASH_ATTN node goes to the CPU
    text = _log("iq4_nl-fa-on")
    p = parse_placement(text)
    assert p["layers_on"] == {"CUDA0": 30}
    assert p["off_device"] == [{"op": "FLASH_ATTN", "backend": "CPU", "device": "CUDA0", "layers": 30}]
    assert parse_graph_line(text)["splits_pp"] == 62          # 2 + 2 per layer: to the CPU and back


def test_q5_0_is_converted_on_the_gpu_not_sent_to_the_cpu():
    # not in the build's FA_QUANTS list, but ggml-cuda converts q5_0 K/V to f16 for its kernels: nothing moves
    p = parse_placement(_log("q5_0-fa-on"))
    assert p["off_device"] == [] and p["layers_on"] == {"CUDA0": 30}
    assert p["nodes"]["CPU"] == 1                              # the token embedding lookup (the input layer)


def test_partial_offload_layers_on_the_cpu_are_not_fallbacks():
    p = parse_placement(_log("f16-ngl15"))
    assert p["layers_on"] == {"CPU": 16, "CUDA0": 14} and p["off_device"] == []


def test_the_nodes_a_backend_runs_are_the_scheduler_listing_without_views():
    # the scheduler lists every node but VIEW/RESHAPE/PERMUTE/TRANSPOSE; the listing's last index + 1 names its graph
    assert parse_graph_line(_log("q5_0-fa-on")) == {"nodes_pp": 1296, "nodes_tg": 1296, "splits_pp": 2, "splits_tg": 2,
                                                    "ops_pp": 696, "ops_tg": 696}
    g = parse_graph_line(_log("f16-ngl15"))
    assert (g["nodes_tg"], g["ops_tg"], g["ops_pp"]) == (936, 576, 576)
    # a listing of another graph size (here cut short) is no graph's: no op counts rather than wrong ones
    cut = "\n".join(_log("q5_0-fa-on").splitlines()[:400])
    assert "ops_tg" not in parse_graph_line(cut)


def test_unnamed_nodes_follow_their_sources_layer():
    # a node llama.cpp leaves unnamed (flash attention: "node_21") belongs to the layer of "Qcur-0"/"cache_k_l0"
    line = ("node # 21 (FLASH_ATTN):              node_21 (   2K) [  CPU         ] use=1,c=1: Qcur-0 (view) (permu "
            "(   2K) [CUDA0         ] cache_k_l0 (view) (p ( 384K) [CUDA0         ]")
    home = "node #  4 (       MUL):          attn_norm-0 (   1M) [CUDA0         ] use=1,c=1:"
    assert parse_placement([home, home, line])["off_device"][0]["layers"] == 1


@pytest.fixture(scope="module")
def pairs():
    return load_records(RUNS / "run2" / "bench-pairs.jsonl")


def test_the_bench_table_marks_the_fallback(pairs):
    iq = [r for r in pairs if r.settings.type_k == "iq4_nl"]
    assert len(iq) == 1 and benchview.off_device(iq[0]) == "FLASH_ATTN of 30 offloaded layers runs on CPU"
    assert all(benchview.off_device(r) is None for r in pairs if r.settings.type_k != "iq4_nl")
    buf = io.StringIO()
    benchview.render_summary(Console(file=buf, width=160, color_system=None), pairs, "pairs.jsonl")
    out = buf.getvalue()
    assert "ok †" in out and "K/V iq4_nl" in out and "largely the CPU's" in out


def test_the_report_marks_the_fallback_speeds(pairs):
    rows = EX.report_rows(EX.sort_records(pairs))
    marked = [x for x in rows if x["ops_off_device_llamacpp"]]
    assert [x["type_k"] for x in marked] == ["iq4_nl"]
    assert "ops_off_device" in EX.export_columns(rows)
    # a prefill of about 138 t/s against 37,000 for q8_0/f16 on the same GPU
    assert marked[0]["pp_tokens_per_s_mean"] < 0.01 * max(x["pp_tokens_per_s_mean"] for x in rows)


def test_the_cuda_table_reads_the_recorded_runs():
    from tools.cuda_check import table

    text = table(RUNS / "run1")
    row = next(x for x in text.splitlines() if x.startswith("| smollm2-135m-nglall | 1024 | f16 |"))
    assert "| 816.0 | 813.2 | +2.8 MiB (+0.34 %) |" in row        # NVML peak vs predicted device memory


def _probe(name: str) -> dict:
    import json

    return json.loads((RUNS / "run2" / f"runtime-{name}-ub512.log").read_text().splitlines()[-1])["result"]


def test_cuda_graph_host_memory_per_node_from_two_probes():
    # the runtime probe's RSS from the first to the 16th single-token decode (ggml-cuda's CUDA graphs), recorded on
    # the H200: the probe model (37 nodes) and SmolLM2 (936 nodes) give a per-node cost that predicts Gemma 3 (727)
    from edgekv.calibration.baseline import graph_cost_per_node, graph_growth

    per_node = graph_cost_per_node(_probe("probe"), _probe("smollm2-135m"))
    assert 4000 < per_node < 6500
    growth, nodes = graph_growth(_probe("gemma3-270m"))
    assert nodes == 727 and abs(per_node * nodes - growth) < 0.5 * 1024 * 1024
    assert graph_cost_per_node(_probe("smollm2-135m"), _probe("probe")) is None     # the deeper probe must be second
