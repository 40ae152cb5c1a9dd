"""The speed model (edgekv.core.speed), its calibration (edgekv.calibration.speedcal) and where they show:
predict's columns and --json, bench's records and lines, edgekv calibrate.

The calibration runs for real once per suite (the calibration folder is shared by the suite's homes); how close
its predictions come to measurements is checked by bench/speed_model.py, not here (no timed test)."""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from msgspec.structs import replace as with_

from edgekv.calibration import speedcal as S
from edgekv.calibration.baseline import write_json
from edgekv.calibration.speedcal import orchestrate as O
from edgekv.calibration.speedcal import plans as P
from edgekv.calibration.speedcal import solve as V
from edgekv.calibration.speedcal import store as ST
from edgekv.cli.main import main
from edgekv.core.llamalog import parse_graph_line, parse_memory_log
from edgekv.core.probe import ProbeResult, median_s
from edgekv.core.speed import (
    FA_TILE_Q,
    Calibration,
    MissingCalibration,
    explain,
    kv_key,
    predict_pp,
    predict_tg,
    speed_shape,
    tile_ratio,
    ubatches,
)
from edgekv.core.wire import to_wire
from edgekv.prediction.api import load_model
from edgekv.sources.home import edgekv_home
from edgekv.sources.tinymodel import drop_plan_models, plan_headers

# -- llama.cpp's graph line (llama-context.cpp:754) -------------------------------------------------------------


@pytest.fixture
def headers():
    """A plan's models as files of their headers alone (what the solve reads), deleted when the test ends."""
    plans = []

    def make(plan):
        plan_headers([m.file_entry() for m in plan])
        plans.append(plan)
        return plan

    yield make
    for plan in plans:
        drop_plan_models([m.file_entry() for m in plan])

def test_graph_line_both_forms():
    one = "llama_context: graph: nodes = 967, splits = 1, input objects = 5, input tensors = 6"
    two = ("llama_context: graph (pp bs=512, tg bs=1): nodes = 1011 / 985, splits = 1 / 2, input objects = 5 / 4, "
           "input tensors = 6 / 5")
    assert parse_graph_line([one]) == {"nodes_pp": 967, "nodes_tg": 967, "splits_pp": 1, "splits_tg": 1}
    assert parse_graph_line([two]) == {"nodes_pp": 1011, "nodes_tg": 985, "splits_pp": 1, "splits_tg": 2}
    assert parse_graph_line(["llama_context: n_ctx = 4096"]) is None
    assert parse_memory_log(["x", two]).graph["nodes_tg"] == 985


# -- the pure model -------------------------------------------------------------------------------------------

GEOMETRIES = ("h9kv3k64v64", "h4kv1k256v256e640")     # SmolLM2's and Gemma 3 270M's attention (its hidden size 640)


def _cal(**kw) -> Calibration:
    c = Calibration(id="test", n_threads=2, node_tg_s=2e-6, node_pp_s=4e-6,
                    matvec_s_per_byte={"q4_1": 1e-10, "q8_0": 1e-10},
                    matvec_s_per_row={"q4_1": 1e-8, "q8_0": 2e-8},
                    matvec_stream_s_per_byte={"q4_1": 5e-11, "q8_0": 5e-11},
                    matvec_stream_s_per_row={"q4_1": 1e-9, "q8_0": 1e-9},
                    matmul_s_per_byte={"q4_1": 1e-11, "q8_0": 1e-11},
                    matmul_s_per_flop={"q4_1": 2e-11, "q8_0": 1e-11},
                    matmul_s_per_dot={"q4_1": 3e-9, "q8_0": 3e-9},
                    matcols_s_per_byte={"q4_1": {"2": 1.5e-10, "4": 2.5e-10}, "q8_0": {"2": 1.4e-10, "4": 2e-10}},
                    matcols_s_per_row={"q4_1": {"2": 2e-8, "4": 4e-8}, "q8_0": {"2": 2e-8, "4": 4e-8}},
                    attn_tg_s={**{kv_key("f16", "f16", "auto", g): 1e-10 for g in GEOMETRIES},
                               **{kv_key("q8_0", "q8_0", "auto", g): 3e-10 for g in GEOMETRIES}},
                    attn_pp_s={**{kv_key("f16", "f16", "auto", g): 5e-11 for g in GEOMETRIES},
                               **{kv_key("q8_0", "q8_0", "auto", g): 2e-10 for g in GEOMETRIES}},
                    attn_pp_rows_s={kv_key("f16", "f16", "auto", g): 2e-10 for g in GEOMETRIES},
                    attn_pp_deep_s={kv_key("f16", "f16", "auto", g): 5e-11 for g in GEOMETRIES},
                    bandwidth_bytes_s=20e9)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


@pytest.fixture(scope="module")
def smol(smollm2_header):
    m = load_model(str(smollm2_header))
    return m, speed_shape(m.shape, list(m.header.tensors), ["avx2"], True, {"ops_tg": 900, "ops_pp": 950})


def test_shape_reads_the_weights_a_token_touches(smol):
    m, sh = smol
    body = [g for g in sh.groups if not g.output]
    out = [g for g in sh.groups if g.output]
    # SmolLM2: Q4_1 matrices (not re-laid on AVX2), the Q8_0 token embedding tied as the output head
    assert {g.key for g in body} == {"q4_1"} and [g.key for g in out] == ["q8_0"]
    emb = next(t for t in m.header.tensors if t.name == "token_embd.weight")
    assert out[0].bytes == emb.n_bytes and out[0].params == emb.shape[0] * emb.shape[1]
    # a row is ggml's ne0 elements: the output head has one per vocabulary entry; each layer q (576), k and v
    # (3 heads of 64), o (576), gate and up (1536), down (576)
    assert out[0].rows == emb.shape[1] == m.shape.n_vocab
    assert body[0].rows == m.shape.n_layer * (576 + 2 * 192 + 576 + 2 * 1536 + 576)
    assert len(sh.attn) == m.shape.n_layer and all(a.window is None for a in sh.attn)
    assert {a.geometry for a in sh.attn} == {"h9kv3k64v64"}


def test_decode_parts_add_up_and_attention_grows_with_depth(smol):
    _m, sh = smol
    cal = _cal(n_threads=1)         # one thread: no thread waits for another (test_threads_share_the_work)
    a = predict_tg(sh, cal, 0, 32, "f16", "f16", "auto")
    b = predict_tg(sh, cal, 4000, 32, "f16", "f16", "auto")
    part = {p.name: p.s_per_token for p in a.parts}
    assert abs(sum(part.values()) - 1 / a.tokens_per_s) < 1e-12
    assert part["fixed"] == pytest.approx(900 * 2e-6)
    body = sum(g.bytes for g in sh.groups if not g.output)
    rows = sum(g.rows for g in sh.groups if not g.output)
    assert part["weights"] == pytest.approx(body * 1e-10 + rows * 1e-8)         # the bytes and a dot product a row
    assert f"+ {rows} rows x 10.0 ns" in next(p.source for p in a.parts if p.name == "weights")
    att_a = part["attention"]
    att_b = next(p.s_per_token for p in b.parts if p.name == "attention")
    # mean depth 16 vs 4016: the attention part is linear in the depth
    assert att_b / att_a == pytest.approx(4016 / 16)
    assert b.tokens_per_s < a.tokens_per_s
    assert 0 < b.roofline_tokens_per_s < a.roofline_tokens_per_s
    assert "attention" in explain(b)


def test_threads_share_the_work_as_llama_cpp_splits_it():
    from edgekv.core.speed import decode_cells

    # split-KV (f16, view >= 512 cells): 600 used cells in a 768-cell view, 384 per thread: thread 0 reads 384
    assert decode_cells(600, 9, 2, split=True) == 2 * 384
    assert decode_cells(2000, 9, 2, split=True) == 2048          # 2048 view: 1024 each; thread 0 reads all 1024
    # query heads per task (quantized K/V): every cell counts once
    assert decode_cells(2000, 9, 2, split=False) == 2000
    assert decode_cells(300, 8, 2, split=True) == 2 * 256         # a 512-cell view: 256 used cells each, 44 / 256
    assert decode_cells(200, 8, 2, split=True) == 200             # a 256-cell view: one head per task
    assert decode_cells(100, 8, 1, split=True) == 100


def test_without_flash_attention_a_token_pays_the_whole_padded_view(smol):
    from edgekv.core.speed import decode_cells

    # -fa off: the product and the softmax run over the view (the used cells padded to 256), masked cells too
    assert decode_cells(1, 9, 2, split=False, dense=True) == 256
    assert decode_cells(256, 9, 2, split=False, dense=True) == 256
    assert decode_cells(257, 9, 2, split=False, dense=True) == 512
    assert decode_cells(600, 9, 2, split=True, dense=True) == 768
    _m, sh = smol
    off = {kv_key("f16", "f16", "off", g): 1e-10 for g in GEOMETRIES}
    cal = _cal(attn_tg_s=off, attn_pp_s=off)

    def att(pred):
        return next(p for p in pred.parts if p.name == "attention")

    # a token at depth 0 and one at 192 read the same 256-cell view; at 256 the view is 512
    a, b, c = (att(predict_tg(sh, cal, d, 32, "f16", "f16", "off")) for d in (0, 192, 256))
    assert a.s_per_token == pytest.approx(b.s_per_token) and c.s_per_token == pytest.approx(2 * a.s_per_token)
    assert "whole padded view" in a.source
    units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
    assert a.s_per_token == pytest.approx(units * 256 * 1e-10)
    # a prompt: every row of a 128-token ubatch from depth 512 over the 768-cell view
    pp = att(predict_pp(sh, cal, 512, 128, 2048, 512, "f16", "f16", "off"))
    assert pp.s_per_token == pytest.approx(units * 768 * 1e-10) and "whole padded view" in pp.source


def test_the_attention_calibration_evicts_the_cpu_caches_between_tokens(monkeypatch, headers):

    # a token reads EVICT_FACTOR x the last-level cache: the model's own Q8_0 matrices (34 bytes per 32 values),
    # then a head of n_embd columns for the rest
    g = P.geometry_shape("h9kv3k64v64")
    own = 6 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 256) * 34 / 32
    assert P.stream_bytes({**g, "n_vocab": 0}) == pytest.approx(own)
    nv = P.evict_vocab(g, 32 << 20)
    assert P.stream_bytes({**g, "n_vocab": nv}) >= P.EVICT_FACTOR * (32 << 20) > P.stream_bytes({**g, "n_vocab": nv - 256})
    assert P.stream_bytes({**g, "n_vocab": P.evict_vocab(g, None)}) >= P.EVICT_DEFAULT_BYTES
    assert P.stream_bytes({**g, "n_vocab": P.evict_vocab(g, 1 << 40)}) < P.EVICT_MAX_BYTES + 256 * 576 * 34 / 32
    # Bonsai 8B's heads at its hidden size: its six layers alone read 287 MB a token, no head is added
    assert P.evict_vocab(P.geometry_shape("h32kv8k128v128"), 32 << 20) == 256
    assert P.evict_shape("h32kv8k128v128") is None
    assert [m.key for m in P.attn_plan([("q8_0", "q8_0", "auto")], 2, True, "h32kv8k128v128")] == [
        "attn_h32kv8k128v128"]
    monkeypatch.setattr(P, "last_level_cache_bytes", lambda: 16 << 20)
    shape = P.evict_shape("h9kv3k64v64")
    assert shape["n_vocab"] == P.evict_vocab(g, 16 << 20) and shape["embd_type"] == "Q8_0"
    assert {k: v for k, v in shape.items() if k not in ("n_vocab", "embd_type")} == P.geometry_shape("h9kv3k64v64")
    from edgekv.sources.gguf_header import read_header_file

    def head(m):
        return next(t for t in read_header_file(m.model_path).tensors if t.name == "output.weight").n_bytes

    # the decode steps run on the evicting model, the prompts on the geometry's own (a 256-row head)
    plan = P.attn_plan([("f16", "f16", "auto")], 2, True, "h9kv3k64v64", interleave=True)
    headers(plan)       # a plan writes nothing: the probe writes each model as it loads it
    by = {m.key: m for m in plan}
    assert head(by["attnv_h9kv3k64v64"]) + own >= P.EVICT_FACTOR * (16 << 20) > head(by["attn_h9kv3k64v64"]) + own
    assert [(st.key, st.n) for st in by["attnv_h9kv3k64v64"].contexts[0].steps] == [("tg", P.EVICT_TG_N)]
    assert [st.key for st in by["attn_h9kv3k64v64"].contexts[0].steps] == ["pp", "pt", "ps"]
    # a quantized pair (the per-row loop): decode steps from ROW_LOOP_TG_START, short prompts on the geometry's model
    q8 = {m.key: m for m in P.attn_plan([("q8_0", "q8_0", "auto")], 2, True, "h9kv3k64v64", interleave=True)}
    assert [(st.key, st.depths, st.n) for st in q8["attnv_h9kv3k64v64"].contexts[0].steps] == [
        ("tg", [P.ROW_LOOP_TG_START, P.ROW_LOOP_TG_START + 1024], P.EVICT_TG_N)]
    assert [(st.key, st.depths, st.n) for st in q8["attn_h9kv3k64v64"].contexts[0].steps] == [
        ("pp", list(P.ATTN_PP_DEPTHS), P.ROW_LOOP_PP_N)]
    # the solver reads the decode steps from the one model and the prompts from the other
    from edgekv.core.speed import attn_units_tg

    shape_g = P.geometry_shape("h9kv3k64v64")
    sh, units = V.attn_speed_shape(shape_g), P.attn_units(shape_g)
    res = []
    for m in P.attn_plan([("q8_0", "q8_0", "auto")], 2, True, "h9kv3k64v64"):
        for st in m.contexts[0].steps:
            d, n = st.depth, st.n
            t = (0.01 + n * attn_units_tg(sh, d + n / 2, 2, False) * 4e-10 if st.test == "tg"
                 else 0.2 + n * units * (d + n / 2) * 2e-10)
            res.append(ProbeResult(model=m.key, context=m.contexts[0].key, step=st.key, n=n,
                        ns=[int(t * 1e9)] * 3))
    assert V.solve_attn(res, kv_key("q8_0", "q8_0", "auto", "h9kv3k64v64"), 2) == (
        pytest.approx(4e-10, rel=1e-3), pytest.approx(2e-10, rel=1e-3))
    # a GPU, and the generic model whose few cells the node models read, keep one model of their own
    assert [m.key for m in P.attn_plan([("q8_0", "q8_0", "auto")], 2, True, "h9kv3k64v64", "CUDA0")] == [
        "attn_h9kv3k64v64"]
    assert [m.key for m in P.attn_plan([("q8_0", "q8_0", "auto")], 2, True)] == ["attn"]


def test_the_last_level_cache_is_the_os_s_figure(tmp_path, monkeypatch):
    from edgekv.machine import environment

    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    monkeypatch.setattr(environment.sys, "platform", "linux")
    assert environment.last_level_cache_bytes(tmp_path) == 32 << 20
    (tmp_path / "index3" / "size").write_text("garbage\n")
    assert environment.last_level_cache_bytes(tmp_path) == 1 << 20
    assert environment.last_level_cache_bytes(tmp_path / "none") is None


def test_prefill_splits_ubatches_and_computes_the_head_once(smol):
    _m, sh = smol
    assert ubatches(1200, 2048, 512) == [512, 512, 176]
    assert ubatches(700, 256, 512) == [256, 256, 188]
    cal = _cal()
    one = predict_pp(sh, cal, 0, 512, 2048, 512, "f16", "f16", "auto")
    two = predict_pp(sh, cal, 0, 512, 2048, 256, "f16", "f16", "auto")
    fixed1 = next(p.s_per_token for p in one.parts if p.name == "fixed")
    fixed2 = next(p.s_per_token for p in two.parts if p.name == "fixed")
    assert fixed2 == pytest.approx(2 * fixed1)          # two graphs instead of one
    head = next(p.s_per_token for p in one.parts if p.name == "output head")
    out_bytes = sum(g.bytes for g in sh.groups if g.output)
    assert head * 512 == pytest.approx(out_bytes * 1e-10 + 49152 * 2e-8)       # one mat-vec: 49152 rows of q8_0


def test_sliding_window_layers_stop_at_the_window(gemma3_header):
    m = load_model(str(gemma3_header))
    sh = speed_shape(m.shape, list(m.header.tensors), ["avx2"], True, {"ops_tg": 500, "ops_pp": 520})
    swa = [a for a in sh.attn if a.window]
    assert swa and all(a.window == m.shape.n_swa for a in swa) and len(swa) < len(sh.attn)
    cal = _cal(n_threads=1, matvec_s_per_byte={k: 1e-10 for k in {g.key for g in sh.groups}},
               matmul_s_per_byte={k: 1e-11 for k in {g.key for g in sh.groups}},
               matmul_s_per_flop={k: 1e-11 for k in {g.key for g in sh.groups}},
               matcols_s_per_byte={k: {"4": 2e-10} for k in {g.key for g in sh.groups}},
               matcols_s_per_row={k: {"4": 4e-8} for k in {g.key for g in sh.groups}},
               matvec_s_per_row={k: 1e-8 for k in {g.key for g in sh.groups}},
               matvec_stream_s_per_byte={k: 5e-11 for k in {g.key for g in sh.groups}},
               matvec_stream_s_per_row={k: 1e-9 for k in {g.key for g in sh.groups}},
               matmul_s_per_dot={k: 3e-9 for k in {g.key for g in sh.groups}})
    preds = [predict_tg(sh, cal, d, 2, "f16", "f16", "auto") for d in (4000, 8000)]
    att = [next(p.s_per_token for p in pr.parts if p.name == "attention") for pr in preds]
    full = len(sh.attn) - len(swa)
    # beyond the window only the full-attention layers grow
    per = sum(a.n_head * (a.head_k + a.head_v) for a in sh.attn if not a.window)
    assert att[1] - att[0] == pytest.approx(per * 4000 * 1e-10) and full > 0
    # and so do the bytes the roofline counts: a sliding-window layer reads its window's K/V, not the whole depth
    # (f16: 2 bytes an element; one KV head of 256 K and 256 V dims per layer in Gemma 3 270M)
    row = {i: lay.k_width + lay.v_width for i, lay in enumerate(m.shape.layers[:m.shape.n_layer]) if lay.attn_cache}
    kv_full = sum(w for i, w in row.items() if not m.shape.layers[i].is_swa) * 2
    kv_swa = sum(w for i, w in row.items() if m.shape.layers[i].is_swa) * 2
    weights = sum(g.bytes for g in sh.groups)
    assert preds[1].bytes_per_token == pytest.approx(weights + kv_full * 8001 + kv_swa * m.shape.n_swa)
    assert preds[1].bytes_per_token - preds[0].bytes_per_token == pytest.approx(kv_full * 4000)


def test_a_type_the_calibration_lacks_is_named_never_guessed(smol):
    _m, sh = smol
    cal = _cal(matvec_s_per_byte={"q8_0": 1e-10}, matmul_s_per_flop={"q8_0": 1e-11})
    with pytest.raises(MissingCalibration, match="weight type q4_1"):
        predict_tg(sh, cal, 0, 8, "f16", "f16", "auto")
    with pytest.raises(MissingCalibration, match="q5_0/q5_0/fa=auto@h9kv3k64v64"):
        predict_pp(sh, _cal(), 0, 8, 2048, 512, "q5_0", "q5_0", "auto")
    # a CPU calibration without the type's cost per row (its narrow model not measured) predicts nothing either
    with pytest.raises(MissingCalibration, match="weight type q4_1"):
        predict_tg(sh, _cal(matvec_s_per_row={"q8_0": 2e-8}), 0, 8, "f16", "f16", "auto")
    with pytest.raises(MissingCalibration, match="weight type q4_1"):       # nor its streaming rate
        predict_tg(sh, _cal(matvec_stream_s_per_byte={"q8_0": 5e-11}), 0, 8, "f16", "f16", "auto")
    with pytest.raises(MissingCalibration, match="weight type q4_1"):       # nor its cost per row while streaming
        predict_tg(sh, _cal(matvec_stream_s_per_row={"q8_0": 1e-9}), 0, 8, "f16", "f16", "auto")
    with pytest.raises(MissingCalibration, match="weight type q4_1"):       # nor its mat-mat's cost per dot product
        predict_pp(sh, _cal(matmul_s_per_dot={"q8_0": 3e-9}), 0, 512, 2048, 512, "f16", "f16", "auto")


def test_a_prompt_pays_one_dot_product_per_row_and_column(smol):
    """ggml-cpu's mat-mat is a dot product per row and column: a ubatch of n tokens pays rows x n dot costs on top of
    its FLOPs, so the prompt's weights per token grow by exactly the rows times the cost per dot."""
    _m, sh = smol
    part = {dot: next(p.s_per_token for p in predict_pp(sh, _cal(matmul_s_per_dot={"q4_1": dot, "q8_0": dot}), 0, 512,
                                                          2048, 512, "f16", "f16", "auto").parts if p.name == "weights")
            for dot in (0.0, 5e-9)}
    rows = sum(g.rows - g.tail_rows for g in sh.groups if not g.output)     # the last layer's FFN: a mat-vec
    assert rows > 100_000 and part[5e-9] - part[0.0] == pytest.approx(rows * 5e-9)


def test_a_prompt_computes_the_last_layer_s_feed_forward_for_its_last_token_only(smol):
    """llama.cpp's model builders keep only the output tokens' rows after the last layer's attention
    (``inp_out_ids``): a prompt's last-layer feed-forward is one mat-vec, in the ubatch holding the last token."""
    from edgekv.core.speed import prompt_weights_s, weights_s

    m, sh = smol
    g = next(x for x in sh.groups if not x.output and x.tail_params)
    n_layer = m.shape.n_layer
    # SmolLM2's last layer: gate, up (1536 rows of 576) and down (576 rows of 1536), all of the body's type
    assert (g.tail_params, g.tail_rows) == (3 * 576 * 1536, 2 * 1536 + 576) and g.params > (n_layer - 1) * g.tail_params
    body, tail = g.split()
    cal = _cal()
    assert prompt_weights_s(g, cal, 512, 1) == pytest.approx(weights_s(body, cal, 512) + weights_s(tail, cal, 1))
    assert prompt_weights_s(g, cal, 512, 0) == pytest.approx(weights_s(body, cal, 512))
    two = {p.name: p.s_per_token for p in predict_pp(sh, cal, 0, 1024, 2048, 512, "f16", "f16", "auto").parts}
    want = sum(weights_s(x.split()[0], cal, 512) * 2 + weights_s(x.split()[1], cal, 1) for x in sh.groups if not x.output)
    assert two["weights"] == pytest.approx(want / 1024)


def test_a_prompt_ubatch_under_64_tokens_over_an_f16_cache_runs_the_per_row_loop(smol):
    """llama.cpp's CPU runs its tiled flash-attention kernel only for F16/F32 K == V and at least GGML_FA_TILE_Q (64)
    query rows (ggml-cpu/ops.cpp:9546); a shorter ubatch runs the per-row loop, whose cost per cell the calibration
    measures apart.  A quantized cache runs that loop at every size (its one prompt coefficient); a GPU has no such
    split; a calibration without the short coefficient names the pair instead of guessing."""
    from edgekv.core.speed import attn_units_at, missing, tiled_prompt_path

    _, sh = smol
    cal = _cal()
    kv = kv_key("f16", "f16", "auto")

    def attn(n_prompt: int, n_ubatch: int, t: str = "f16"):
        r = predict_pp(sh, cal, 1024, n_prompt, 2048, n_ubatch, t, t, "auto")
        return next(x for x in r.parts if x.name == "attention")

    assert FA_TILE_Q == 64
    assert attn(32, 512).s_per_token == pytest.approx(attn_units_at(sh, 1024 + 16, cal.attn_pp_rows_s, kv))
    assert "1 ubatch(es) under 64 tokens" in attn(32, 512).source
    assert attn(64, 512).s_per_token == pytest.approx(attn_units_at(sh, 1024 + 32, cal.attn_pp_s, kv))
    assert "under 64" not in attn(64, 512).source
    # a 96-token prompt in ubatches of 64: one tiled ubatch, then 32 tokens through the per-row loop
    both = (64 * attn_units_at(sh, 1024 + 32, cal.attn_pp_s, kv) + 32 * attn_units_at(sh, 1088 + 16, cal.attn_pp_rows_s, kv))
    assert attn(96, 64).s_per_token == pytest.approx(both / 96)
    q8 = kv_key("q8_0", "q8_0", "auto")
    assert attn(32, 512, "q8_0").s_per_token == pytest.approx(attn_units_at(sh, 1024 + 16, cal.attn_pp_s, q8))
    assert tiled_prompt_path("f16", "f16", "auto") and tiled_prompt_path("f32", "f32", "on")
    assert not any([tiled_prompt_path("q8_0", "q8_0", "auto"), tiled_prompt_path("f16", "q8_0", "auto"),
                    tiled_prompt_path("f16", "f16", "off"), tiled_prompt_path("f16", "f16", "auto", "CUDA0")])
    old = _cal(attn_pp_rows_s={})
    assert missing(old, sh, "f16", "f16", "auto")[1] and not missing(old, sh, "q8_0", "q8_0", "auto")[1]
    with pytest.raises(MissingCalibration, match="K/V cache f16/f16/fa=auto@"):
        predict_pp(sh, old, 1024, 512, 2048, 512, "f16", "f16", "auto")


def test_short_query_tiles_cost_what_full_ones_do(smol):
    """llama.cpp's tiled kernel cuts a query tile at a chunk's end and a head's (ggml-cpu/ops.cpp:9529-9544,
    9160-9170) and runs every tile over all its 64 rows: SmolLM2's 9 heads at 128 tokens on two threads run 24 tiles
    for 18 full ones' rows.  The calibration's share of cost per tile scales each layer's rows accordingly; the
    solver recovers the share and the cost per row of full tiles from the plan's own steps (a forward model)."""
    from edgekv.core.speed import FA_TILE_Q, attn_units_at, fa_tiles, tile_factor

    assert [fa_tiles(n, 9, 2) for n in (64, 96, 128, 256, 512)] == [16, 22, 24, 40, 72]
    assert [fa_tiles(n, 9, 1) for n in (64, 96, 128, 256, 512)] == [9, 18, 18, 36, 72]    # one chunk: per head
    assert fa_tiles(64, 4, 2) == 8 and fa_tiles(512, 4, 2) == 32 and fa_tiles(100, 16, 2) == 32
    assert tile_factor(0.0, 128, 9, 2) == 1.0 and tile_factor(0.6, 512, 9, 2) == pytest.approx(1.0)
    assert tile_factor(1.0, 128, 9, 2) == pytest.approx(24 * FA_TILE_Q / (128 * 9))
    assert tile_factor(0.6, 128, 9, 2) == pytest.approx(0.6 * 4 / 3 + 0.4)
    _, sh = smol
    g = "h9kv3k64v64"
    kv, kg = kv_key("f16", "f16", "auto"), kv_key("f16", "f16", "auto", g)

    def attn(cal, n: int, depth: int = 512):
        r = predict_pp(sh, cal, depth, n, 2048, 512, "f16", "f16", "auto")
        return next(x for x in r.parts if x.name == "attention")

    full, tiled = _cal(), _cal(attn_pp_tile_share={kv_key("f16", "f16", "auto", x): 0.6 for x in GEOMETRIES})
    assert attn(tiled, 512).s_per_token == pytest.approx(attn(full, 512).s_per_token)      # full tiles: alike
    assert attn(tiled, 128).s_per_token == pytest.approx(attn(full, 128).s_per_token * (0.6 * 4 / 3 + 0.4))
    assert "cut short" in attn(tiled, 128).source and "cut short" not in attn(full, 128).source
    assert attn_units_at(sh, 1.0) > 0
    # the solver: a geometry model whose tiles cost 0.6 of the kernel, the rest per row, 3e-11 a row-cell in full tiles
    (m, *_) = [x for x in P.attn_plan([("f16", "f16", "auto")], 2, True, g) if x.key == f"attn_{g}"]
    shape = P.geometry_shape(g)
    units, h = P.attn_units(shape), shape["n_head"]
    res = [ProbeResult(model=m.key, context=kg, step=st.key,
            ns=[int((0.1 + st.n * units * (st.depth + st.n / 2) * 3e-11
                        * tile_factor(0.6, st.n, h, 2)) * 1e9)] * 3)
           for st in m.contexts[0].steps if st.test == "pp"]
    assert {r.step for r in res} >= {"pt0", "pt1024", "pp0", "pp1024"}
    assert V.solve_tile_share(res, kg, 2) == pytest.approx(0.6, rel=1e-3)
    # deep in the cache its own share, from the deep model's PT_N-token prompts beside its DEEP_PP_N ones
    d = P.deep_plan([("f16", "f16", "auto")], 2, True, g)
    du = P.attn_units(P.deep_shape(g))
    res += [ProbeResult(model=d.key, context=kg, step=st.key,
             ns=[int((0.05 + st.n * du * (st.depth + st.n / 2) * 4e-11 * tile_factor(0.3, st.n, h, 2))
                        * 1e9)] * 3) for st in d.contexts[0].steps]
    assert V.solve_tile_share(res, kg, 2, deep=True) == pytest.approx(0.3, rel=1e-3)
    assert V.solve_tile_share(res, kg, 2) == pytest.approx(0.6, rel=1e-3)
    # and the prediction prices the deep cells with the deep share: SmolLM2's 128-token prompt at depth 8192
    both = _cal(attn_pp_tile_share={kg: 0.6}, attn_pp_tile_share_deep={kg: 0.3})
    deep_only = attn(both, 128, 8192).s_per_token / attn(full, 128, 8192).s_per_token
    # every cell of a deep scan at the deep share's rate (speedcost.tiled_cells_cost): no shallow-priced first cells
    assert deep_only == pytest.approx(0.3 / 3 + 1)
    # noise that makes short tiles cheaper per row than full ones gives no share (every row alike), never a negative
    cheap = [ProbeResult(model=m.key, context=kg, step=st.key,
              ns=[int((0.1 + st.n * units * st.depth * (2.5e-11 if st.key.startswith("pt") else 3e-11))
                         * 1e9)] * 3) for st in m.contexts[0].steps if st.test == "pp"]
    assert V.solve_tile_share(cheap, kg, 2) == 0.0
    assert kv != kg


def test_the_tiled_kernel_prices_deep_cells_at_the_deep_coefficient(smol):
    """The tiled kernel's cost per cell is the calibration's shallow one for scans of up to TILED_SHALLOW_END cells
    and its deep one for scans from TILED_DEEP_DEPTHS[0] on, linear between (bench/README.md: SmolLM2's heads 22
    and 40 ps on a 2-vCPU EPYC), every cell of a scan at its scan's rate (issue 68: a long scan's first cells miss
    the caches as its last ones do); only a long prompt over an F16/F32 cache on the CPU takes it, and a calibration
    without the deep coefficient names the pair instead of guessing."""
    from edgekv.core.speed import TILED_DEEP_DEPTHS, TILED_SHALLOW_END, attn_units_at, missing, tiled_cells_cost

    a, b = TILED_SHALLOW_END, TILED_DEEP_DEPTHS[0]
    assert tiled_cells_cost(3000, 2.0, 2.0) == pytest.approx(6000)
    assert tiled_cells_cost(a, 1.0, 3.0) == pytest.approx(a)
    assert tiled_cells_cost(b, 1.0, 3.0) == pytest.approx(3.0 * b)                    # every cell at the deep rate
    assert tiled_cells_cost(b + 1000, 1.0, 3.0) == pytest.approx(3.0 * (b + 1000))
    mid = (a + b) / 2                         # half-way up the ramp every cell of the scan costs 2.0
    assert tiled_cells_cost(mid, 1.0, 3.0) == pytest.approx(2.0 * mid)
    _, sh = smol
    kv = kv_key("f16", "f16", "auto")
    flat, dear = _cal(), _cal(attn_pp_deep_s={kv_key("f16", "f16", "auto", g): 2e-10 for g in GEOMETRIES})

    def attn(cal, depth: int, t: str = "f16", n: int = 512):
        r = predict_pp(sh, cal, depth, n, 2048, 512, t, t, "auto")
        return next(x for x in r.parts if x.name == "attention")

    # shallow prompts: alike; deep ones: each layer's cells priced along the ramp (SmolLM2: 30 full-depth layers)
    assert attn(dear, 256).s_per_token == pytest.approx(attn(flat, 256).s_per_token)
    assert attn(flat, 8192).s_per_token == pytest.approx(attn_units_at(sh, 8192 + 256, flat.attn_pp_s, kv))
    units = attn_units_at(sh, 1.0)
    assert attn(dear, 8192).s_per_token == pytest.approx(units * tiled_cells_cost(8192 + 256, 5e-11, 2e-10))
    assert attn(dear, 8192).s_per_token > 3 * attn(flat, 8192).s_per_token
    assert "past 1024" in attn(dear, 8192).source and "past" not in attn(dear, 256).source
    # a short prompt (the per-row loop) and a quantized cache never take it
    assert attn(dear, 8192, n=32).s_per_token == pytest.approx(attn(flat, 8192, n=32).s_per_token)
    assert attn(dear, 8192, "q8_0").s_per_token == pytest.approx(attn(flat, 8192, "q8_0").s_per_token)
    old = _cal(attn_pp_deep_s={})
    assert missing(old, sh, "f16", "f16", "auto")[1] and not missing(old, sh, "q8_0", "q8_0", "auto")[1]
    with pytest.raises(MissingCalibration, match="K/V cache f16/f16/fa=auto@"):
        predict_pp(sh, old, 8192, 512, 2048, 512, "f16", "f16", "auto")
    gpu = _cal(attn_pp_deep_s={}, attn_pp_rows_s={}, device="CUDA0")
    assert not missing(gpu, sh, "f16", "f16", "auto")[1]


def test_a_large_model_s_weights_take_at_least_their_streaming_time():
    """A token's matrices cost their kernels' work (bytes and rows, as the 48 MB calibration models measure it) or,
    where that is faster, their bytes and rows at the costs llama.cpp streams the type from memory with (384 MB
    models); a ubatch of columns pays its dot products in the mat-mat's terms, so its floor is the bytes alone."""
    from edgekv.core.speed import WeightGroup, weights_s

    cal = _cal(matvec_stream_s_per_byte={"q4_1": 3e-10, "q8_0": 5e-11})
    big = WeightGroup("q4_1", 4_000_000_000, 7_000_000_000, False, 1_500_000)     # an 8B model's wide rows
    assert weights_s(big, cal, 1) == pytest.approx(4e9 * 3e-10 + 1.5e6 * 1e-9)   # memory: 1.2 s, not 0.415
    assert weights_s(big, cal, 2) == pytest.approx(4e9 * 3e-10)                   # two columns read it once too
    assert weights_s(big, cal, 512) == pytest.approx(max(4e9 * 3e-10, 4e9 * 1e-11 + 2 * 7e9 * 512 * 2e-11
                                                         + 1.5e6 * 512 * 3e-9))   # the prompt's own terms
    # the rows' cost while streaming is its own coefficient (a narrow 384 MB model's), not the 48 MB models'
    slow_rows = _cal(matvec_stream_s_per_byte={"q4_1": 3e-10, "q8_0": 5e-11}, matvec_stream_s_per_row={"q4_1": 2e-8})
    assert weights_s(big, slow_rows, 1) - weights_s(big, cal, 1) == pytest.approx(1.5e6 * (2e-8 - 1e-9))
    # the output head, one matrix, streams its rows at the same cost: a head of 4x the rows of the same bytes
    # decoded 5.7-6.8 ns a row slower (bench/head_rows.py)
    head = WeightGroup("q4_1", 4_000_000_000, 7_000_000_000, True, 1_500_000)
    assert weights_s(head, slow_rows, 1) == pytest.approx(4e9 * 3e-10 + 1.5e6 * 2e-8)
    assert weights_s(head, slow_rows, 2) == pytest.approx(4e9 * 3e-10)          # a few columns: the bytes alone
    small = WeightGroup("q8_0", 30_000_000, 28_000_000, True, 49_152)             # SmolLM2's head: the kernels
    assert weights_s(small, cal, 1) == pytest.approx(30e6 * 1e-10 + 49_152 * 2e-8)
    sh = speed_shape_of((big, small))
    src = {p.name: p.source for p in predict_tg(sh, cal, 0, 8, "f16", "f16", "auto").parts}
    assert src["weights"] == "q4_1 4000.0 MB streamed from memory at 3.3 GB/s + 1500000 rows x 1.0 ns"
    assert src["output head"] == "q8_0 30.0 MB at 10.0 GB/s + 49152 rows x 20.0 ns"


def speed_shape_of(groups):
    from edgekv.core.speed import SpeedShape

    return SpeedShape(tuple(groups), (), 100, 100)


def test_sequences_decoding_together_share_each_step_s_weights(smol):
    from edgekv.core.speed import MATMUL_LINEAR_FROM, WeightGroup, weights_s

    _m, sh = smol
    cal = _cal()
    g = WeightGroup("q4_1", 1000, 1600)
    assert weights_s(g, cal, 1) == pytest.approx(1000 * 1e-10)          # a mat-vec
    assert weights_s(g, cal, 2) == pytest.approx(1000 * 1.5e-10)        # measured columns
    assert weights_s(g, cal, 3) == pytest.approx(1000 * 2e-10)          # between 2 and 4 columns
    lin = 1000 * 1e-11 + 2 * 1600 * MATMUL_LINEAR_FROM * 2e-11
    assert weights_s(g, cal, MATMUL_LINEAR_FROM) == pytest.approx(lin)  # the prompt model from there on
    assert weights_s(g, cal, 18) == pytest.approx(1000 * 2.5e-10 + (lin - 1000 * 2.5e-10) * 14 / 28)
    one = predict_tg(sh, cal, 100, 8, "f16", "f16", "auto")
    two = predict_tg(sh, cal, 100, 8, "f16", "f16", "auto", n_seq=2)
    parts1, parts2 = ({p.name: p.s_per_token for p in x.parts} for x in (one, two))
    w2 = sum(weights_s(x, cal, 2) for x in sh.groups if not x.output)
    assert parts2["weights"] == pytest.approx(w2 / 2) and parts2["fixed"] == pytest.approx(parts1["fixed"] / 2)
    assert parts2["attention"] == pytest.approx(parts1["attention"])    # each sequence over its own cells
    assert two.tokens_per_s == pytest.approx(1 / sum(parts2.values()))
    pp2 = predict_pp(sh, cal, 0, 64, 2048, 512, "f16", "f16", "auto", n_seq=2)
    assert pp2.n_tokens == 128
    with pytest.raises(MissingCalibration, match="weight type q4_1"):
        predict_tg(sh, _cal(matcols_s_per_byte={"q8_0": {"2": 1e-10}}), 0, 8, "f16", "f16", "auto", n_seq=2)
    with pytest.raises(MissingCalibration, match="weight type q4_1"):     # a CPU calibration without its rows
        predict_tg(sh, _cal(matcols_s_per_row={"q8_0": {"2": 1e-8}}), 0, 8, "f16", "f16", "auto", n_seq=2)


def test_a_short_ubatch_pays_its_nodes_at_its_own_size(smol):
    # a graph node's work grows with the ubatch's tokens: the calibration times nodes at NODE_PP_TOKENS, and a
    # ubatch's nodes cost what its size costs, linear between (and toward a one-token graph's below the first)
    from edgekv.core.speed import NODE_PP_TOKENS, prompt_node_s

    cal = _cal(node_tg_s=1e-6, node_pp_s=40e-6, node_pp_short_s=4e-6)
    (n0, n1), mid = NODE_PP_TOKENS, sum(NODE_PP_TOKENS) // 2
    assert prompt_node_s(cal, n0) == pytest.approx(4e-6) and prompt_node_s(cal, n1) == pytest.approx(40e-6)
    assert prompt_node_s(cal, mid) == pytest.approx(22e-6)
    assert prompt_node_s(cal, 1) == pytest.approx(1e-6) and 1e-6 < prompt_node_s(cal, 8) < 4e-6
    assert prompt_node_s(cal, 2 * n1) > 40e-6            # a longer ubatch's nodes do more work still
    _m, sh = smol
    fixed = {n: next(p.s_per_token for p in predict_pp(sh, cal, 0, n, 2048, n, "q8_0", "q8_0", "auto").parts
                     if p.name == "fixed") for n in (n0, n1)}
    assert fixed[n0] * n0 == pytest.approx(sh.nodes_pp * 4e-6 + cal.ubatch_pp_s)
    assert fixed[n1] * n1 == pytest.approx(sh.nodes_pp * 40e-6 + cal.ubatch_pp_s)
    # a calibration without the short size (a GPU's, or before CAL_VERSION 15) prices every ubatch's nodes alike
    assert prompt_node_s(_cal(node_pp_s=40e-6), n0) == 40e-6


def test_a_few_columns_cost_their_rows_beside_their_bytes():
    from edgekv.core.speed import WeightGroup, weights_s

    # ggml-cpu's mat-mul of 2 or 4 columns is a dot product per row and column: at the same bytes, a matrix of
    # shorter rows (SmolLM2's widths against the calibration's wide model) costs its extra rows' dot products
    cal = _cal()
    wide, narrow = (WeightGroup("q4_1", 10_000_000, 20_000_000, rows=r) for r in (20_000, 40_000))
    c, r = cal.matcols_s_per_byte["q4_1"], cal.matcols_s_per_row["q4_1"]
    for n in (2, 4):
        assert weights_s(wide, cal, n) == pytest.approx(wide.bytes * c[str(n)] + wide.rows * r[str(n)])
        assert weights_s(narrow, cal, n) - weights_s(wide, cal, n) == pytest.approx(20_000 * r[str(n)])
    assert weights_s(narrow, cal, 3) == pytest.approx((weights_s(narrow, cal, 2) + weights_s(narrow, cal, 4)) / 2)


# -- the solvers recover known coefficients (a forward model of what the child measures) -------------------------

def test_solvers_recover_the_coefficients(monkeypatch, tmp_path):

    truth = {"node_tg": 3e-6, "node_pp": 9e-6, "attn_tg": 4e-10, "attn_pp": 2e-10, "token": 90e-6, "ubatch": 1.4e-3,
             "node_short": 2e-6}
    nodes = {"nodes_a": (60, 70), "nodes_b": (700, 760)}
    units = P.attn_units(P.ATTN_SHAPE)
    out = []
    for name, (ntg, npp) in nodes.items():
        g = {"nodes_pp": npp, "nodes_tg": ntg, "splits_pp": 1, "splits_tg": 1, "ops_pp": npp, "ops_tg": ntg}
        t_tok = ntg * truth["node_tg"] + truth["token"]          # every token: its nodes and the cost outside them
        out.append(ProbeResult(model=name, context="f16", step="tg", ns=[int(32 * t_tok * 1e9)] * 3, graph=g))
        out.append(ProbeResult(model=name, context="f16", step="pp",
                    ns=[int((npp * truth["node_pp"] + truth["ubatch"]) * 1e9)] * 3, graph=g))
    # before CAL_VERSION 15 no short prompt: its node cost is not measured (0.0, every ubatch priced alike)
    assert V.solve_nodes(out)[4] == 0.0
    for name, (ntg, npp) in nodes.items():
        g = {"nodes_pp": npp, "nodes_tg": ntg, "splits_pp": 1, "splits_tg": 1, "ops_pp": npp, "ops_tg": ntg}
        out.append(ProbeResult(model=name, context="f16", step="ps",
                    ns=[int((npp * truth["node_short"] + truth["ubatch"]) * 1e9)] * 5, graph=g))
    node_tg, node_pp, token, ubatch, short = V.solve_nodes(out)
    assert node_tg == pytest.approx(truth["node_tg"], rel=1e-3) and node_pp == pytest.approx(truth["node_pp"], rel=1e-3)
    assert token == pytest.approx(truth["token"], rel=1e-3) and ubatch == pytest.approx(truth["ubatch"], rel=1e-3)
    assert short == pytest.approx(truth["node_short"], rel=1e-3)
    assert [st.key for st in P.base_plan(2, True)[0].contexts[0].steps] == ["tg", "pp", "ps"]
    assert P.base_plan(2, True)[0].contexts[0].steps[2].n == P.PP_SHORT_N < P.PP_N
    key = kv_key("q5_0", "q5_0", "auto")
    a, n = P.attn_steps(None, False, rows=True), P.ROW_LOOP_PP_N
    res = []
    for d in a.tg_depths:
        res.append(ProbeResult(model="attn", context=key, step=f"tg{d}", n=P.TG_N,
                    ns=[int((0.01 + P.TG_N * units * (d + P.TG_N / 2) * truth["attn_tg"]) * 1e9)] * 3, graph=None))
    for d in a.pp_depths:
        res.append(ProbeResult(model="attn", context=key, step=f"pp{d}", n=n,
                    ns=[int((0.2 + n * units * (d + n / 2) * truth["attn_pp"]) * 1e9)] * 3, graph=None))
    tg, pp = V.solve_attn(res, key)
    assert tg == pytest.approx(truth["attn_tg"], rel=1e-3) and pp == pytest.approx(truth["attn_pp"], rel=1e-3)
    # a deeper cache measured no slower (other work hid its cost): an error, never a zero coefficient
    flat = [with_(x, ns=[10_000_000] * 3) if x.step.startswith("tg") else x for x in res]
    with pytest.raises(S.CalibrationError, match="no cost for a deeper cache"):
        V.solve_attn(flat, key)


def test_the_weight_solver_recovers_a_cost_per_byte_and_per_row(headers):
    """A forward model of the wide and the narrow weight models' timings (their real headers, as the calibration
    writes them): the solver recovers the mat-vec's cost per byte and per row, the prompt's per FLOP and the
    few-column step's; rows that noise makes negative cost nothing (never a negative coefficient)."""

    truth = {"byte": 3e-11, "row": 15e-9, "flop": 1e-11, "mm_byte": 2e-11, "col": 6e-11, "stream": 5e-11, "dot": 4e-9,
             "srow": 20e-9, "col_row": 7e-9}
    cal = Calibration(id="t", n_threads=2, node_tg_s=6e-7, node_pp_s=4e-5, token_tg_s=9e-6, ubatch_pp_s=6e-4)
    plan = P.weight_plan(["q4_1"], 2, False)
    # the narrow model before and after the wide one (one file), then the large wide and narrow ones
    assert [m.key for m in plan] == ["wn_q4_1", "w_q4_1", "wnb_q4_1", "ws_q4_1", "wsn_q4_1", "wsb_q4_1"]
    assert plan[0].model_path == plan[2].model_path
    assert not any(Path(m.model_path).exists() for m in plan)       # a plan writes nothing
    headers(plan)
    assert all(Path(m.model_path).stat().st_size < 1 << 20 for m in plan)      # their tensor tables alone
    g = {"nodes_pp": 150, "nodes_tg": 140, "splits_pp": 1, "splits_tg": 1, "ops_pp": 100, "ops_tg": 90}
    shapes = {m.key: V.probe_shape(m.model_path, g, [], False) for m in plan}
    rows = {k: sum(x.rows for x in sh.groups) for k, sh in shapes.items()}
    nbytes = {k: sum(x.bytes for x in sh.groups) for k, sh in shapes.items()}
    assert rows["wn_q4_1"] / nbytes["wn_q4_1"] > 1.8 * rows["w_q4_1"] / nbytes["w_q4_1"]     # rows half as long
    assert rows["wsn_q4_1"] / nbytes["wsn_q4_1"] > 1.7 * rows["ws_q4_1"] / nbytes["ws_q4_1"]
    # and a few large matrices (an 8B model's widths): a third of the rows per byte, a tenth of the matrices
    assert rows["wsb_q4_1"] / nbytes["wsb_q4_1"] < 0.4 * rows["ws_q4_1"] / nbytes["ws_q4_1"]
    assert shapes["wsb_q4_1"].groups and plan[5].shape["n_layer"] * 10 <= plan[3].shape["n_layer"]

    def results(row: float, dot: float = truth["dot"]) -> list[dict]:
        out = []
        for k in shapes:
            large = k.startswith("ws")
            t_tok = 90 * cal.node_tg_s + cal.token_tg_s + (nbytes[k] * truth["stream"] + rows[k] * truth["srow"] if large
                                                             else nbytes[k] * truth["byte"] + rows[k] * row)
            n_tok = P.STREAM_N if large else P.TG_N
            out.append(ProbeResult(model=k, context="f16", step="tg", n=n_tok, ns=[int(n_tok * t_tok * 1e9)] * 5, graph=g))
        for k in ("w_q4_1", "wn_q4_1"):      # the prompts: the wide model's and (the dot cost) the narrow one's
            # the last layer's feed-forward for the last token only: a mat-vec beside the output head's
            mats = [x.split()[0] for x in shapes[k].groups if not x.output]
            tails = [x.split()[1] for x in shapes[k].groups if not x.output]
            assert sum(x.params for x in tails) > 0
            o_mv = sum(x.bytes * truth["byte"] + x.rows * row for x in [*tails, *(g for g in shapes[k].groups if g.output)])
            wb, wp, wr = sum(x.bytes for x in mats), sum(x.params for x in mats), sum(x.rows for x in mats)
            for n in P.MM_N:
                t = (100 * cal.node_pp_s + cal.ubatch_pp_s + o_mv + wb * truth["mm_byte"] + 2 * wp * n * truth["flop"]
                     + wr * n * dot)
                out.append(ProbeResult(model=k, context="f16", step=f"pp{n}", ns=[int(t * 1e9)] * 3, graph=g))
        for k in ("w_q4_1", "wn_q4_1", "wnb_q4_1"):     # a few columns: bytes and rows (a dot product per row and column)
            mats = [x.split()[0] for x in shapes[k].groups if not x.output]
            tails = [x.split()[1] for x in shapes[k].groups if not x.output]
            o_mv = sum(x.bytes * truth["byte"] + x.rows * row for x in [*tails, *(g for g in shapes[k].groups if g.output)])
            wb, wr = sum(x.bytes for x in mats), sum(x.rows for x in mats)
            for n in P.MM_COLS:
                t = 100 * cal.node_tg_s + cal.token_tg_s + o_mv + wb * truth["col"] * n + wr * truth["col_row"] * n
                out.append(ProbeResult(model=k, context="f16", step=f"pp{n}", ns=[int(t * 1e9)] * 3, graph=g))
        return out

    # the large models: STREAM_REPS runs of STREAM_N tokens, no warm-up run; the prompts MM_REPS runs after one
    for m in plan[3:]:
        assert [(st.n, st.reps, st.warmup) for st in m.contexts[0].steps] == [(P.STREAM_N, P.STREAM_REPS, 0)]
    assert [(st.n, st.reps, st.warmup) for st in plan[1].contexts[0].steps if st.key == "pp256"] \
        == [(256, P.MM_REPS, 1)]
    V.solve_weights(results(truth["row"]), plan, cal, [], False)
    assert cal.matvec_s_per_byte["q4_1"] == pytest.approx(truth["byte"], rel=1e-3)
    assert cal.matvec_s_per_row["q4_1"] == pytest.approx(truth["row"], rel=1e-3)
    assert cal.matvec_stream_s_per_byte["q4_1"] == pytest.approx(truth["stream"], rel=1e-3)
    assert cal.matvec_stream_s_per_row["q4_1"] == pytest.approx(truth["srow"], rel=1e-3)
    assert 8 * nbytes["w_q4_1"] > nbytes["wsn_q4_1"] > 6 * nbytes["w_q4_1"]
    assert 8 * nbytes["w_q4_1"] > nbytes["ws_q4_1"] > 6 * nbytes["w_q4_1"]       # 384 MB against 48
    assert 9 * nbytes["w_q4_1"] > nbytes["wsb_q4_1"] > 6 * nbytes["w_q4_1"]
    assert cal.matmul_s_per_flop["q4_1"] == pytest.approx(truth["flop"], rel=1e-3)
    assert cal.matmul_s_per_byte["q4_1"] == pytest.approx(truth["mm_byte"], rel=1e-3)
    assert cal.matmul_s_per_dot["q4_1"] == pytest.approx(truth["dot"], rel=1e-3)
    assert cal.matcols_s_per_byte["q4_1"]["4"] == pytest.approx(4 * truth["col"], rel=1e-3)
    assert cal.matcols_s_per_row["q4_1"] == pytest.approx({n: int(n) * truth["col_row"] for n in ("2", "4")}, rel=1e-3)
    # timings of an earlier plan (large models' runs of 16 tokens, its cached raw timings): each decode is read per
    # its own step's tokens, so the same coefficients come back
    older = [with_(r, n=16, ns=[x * 16 // r.n for x in r.ns]) if r.model.startswith("ws") else r
             for r in results(truth["row"])]
    V.solve_weights(older, plan, cal, [], False)
    assert cal.matvec_stream_s_per_byte["q4_1"] == pytest.approx(truth["stream"], rel=1e-3)
    assert cal.matvec_stream_s_per_row["q4_1"] == pytest.approx(truth["srow"], rel=1e-3)
    # both models are prompted with a few columns, the narrow one before and after the wide one
    for i in (0, 1, 2):
        assert [st.key for st in plan[i].contexts[0].steps][-2:] == [f"pp{n}" for n in P.MM_COLS]
    # a machine that drifts meanwhile: the narrow model's runs before and after the wide one's are averaged
    drift = [with_(r, ns=[int(x * (1.1 if r.model == "wn_q4_1" else 0.9)) for x in r.ns])
             if r.model in ("wn_q4_1", "wnb_q4_1") and r.step in ("pp2", "pp4") else r
             for r in results(truth["row"])]
    V.solve_weights(drift, plan, cal, [], False)
    assert cal.matcols_s_per_row["q4_1"] == pytest.approx({n: int(n) * truth["col_row"] for n in ("2", "4")}, rel=1e-3)
    # the narrow model measured faster per byte than the wide one (noise): no negative row cost, the wide model's
    # time over its bytes
    # (and the large matrices slower per byte than the small ones: rows that would cost less than nothing)
    noisy = [with_(r, ns=[int(n * (1.3 if r.model.startswith("wsb") else 0.7)) for n in r.ns])
             if r.model.startswith(("wn", "wsn", "wsb")) else r for r in results(0.0, 0.0)]
    V.solve_weights(noisy, plan, cal, [], False)
    assert cal.matvec_s_per_row["q4_1"] == 0.0
    assert cal.matvec_s_per_byte["q4_1"] == pytest.approx(truth["byte"], rel=1e-3)
    assert cal.matmul_s_per_dot["q4_1"] == 0.0      # nor a negative dot cost: the wide model's FLOPs alone
    assert cal.matcols_s_per_row["q4_1"] == {"2": 0.0, "4": 0.0}    # nor per row at a few columns
    assert cal.matmul_s_per_flop["q4_1"] == pytest.approx(truth["flop"], rel=1e-2)
    # nor a negative cost per row while streaming: the wide large model's time over its bytes
    assert cal.matvec_stream_s_per_row["q4_1"] == 0.0
    assert cal.matvec_stream_s_per_byte["q4_1"] == pytest.approx(truth["stream"] + truth["srow"] * rows["ws_q4_1"]
                                                                 / nbytes["ws_q4_1"], rel=1e-3)
    # a GPU calibration measures no narrow model (its widths are the body probe's)
    assert [m.key for m in P.weight_plan(["q4_1"], 2, False, "CUDA0")] == ["w_q4_1"]


def _own_home(monkeypatch, tmp_path) -> None:
    """An EDGEKV_HOME of the test's own, calibration folder included: the suite's homes share theirs (the real
    calibration is cached there once per suite), and a fake calibration must never land in it."""
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "own-home"))


def _quiet(monkeypatch, busy: bool = False) -> None:
    """The LoadMonitor sees a quiet machine (or, ``busy``, other work on 60 % of the CPUs), no other work keeps a core
    busy when the fills start, and the read bandwidth is a figure, not a measurement: a fake calibration times
    nothing of the machine (each would cost about a second)."""
    from edgekv.calibration.speedcal import orchestrate, solve
    from edgekv.machine import load as L

    monkeypatch.setattr(L.LoadMonitor, "start", lambda self: None)
    monkeypatch.setattr(L.LoadMonitor, "stop", lambda self: {"busy": busy, "others_share_max": 0.6 if busy else 0.0})
    monkeypatch.setattr(orchestrate, "threads_left", lambda n, window_s=0.5: (n, 0.0))
    monkeypatch.setattr(solve, "read_bandwidth", lambda n_threads: 20e9)


def test_two_processes_calibrating_keep_each_others_coefficients(monkeypatch, tmp_path):
    _own_home(monkeypatch, tmp_path)
    key, fp = ST.calibration_key(2, True)
    path = ST.calibration_path(2, True)
    assert path.is_relative_to(tmp_path)
    theirs = _cal(attn_tg_s={"q5_0/q5_0/fa=auto": 5e-10}, attn_pp_s={"q5_0/q5_0/fa=auto": 6e-10},
                  notes=["busy: other work used 40 % of the CPUs"])
    write_json(path, {"key": key, "fingerprint": fp, "calibration": to_wire(theirs)})
    mine = _cal(attn_tg_s={"q4_0/q4_0/fa=auto": 7e-10}, attn_pp_s={"q4_0/q4_0/fa=auto": 8e-10})
    ST.merge_cached(mine, path, key)
    assert mine.attn_tg_s == {"q4_0/q4_0/fa=auto": 7e-10, "q5_0/q5_0/fa=auto": 5e-10}
    assert mine.notes == theirs.notes
    other = _cal(id="another-calibration")
    ST.merge_cached(other, path, key)       # a different calibration (re-measured meanwhile): nothing taken from it
    assert "q5_0/q5_0/fa=auto" not in other.attn_tg_s


def _fake_results(models):
    """What the child would report for a plan: every step timed, longer at depth and on the deeper model."""
    out = []
    for m in models:
        for c in m.contexts:
            # an interleaved step (sequences at several depths, runs in turn) reports each depth as its own step
            steps = [with_(st, key=f"{st.key}{d}", depth=d) if st.depths else st
                     for st in c.steps for d in st.depths or [st.depth]]
            for st in steps:
                g = {"nodes_pp": 100, "nodes_tg": 90, "splits_pp": 1, "splits_tg": 1, "ops_pp": 100, "ops_tg": 90}
                if m.key == "nodes_b":
                    g = {"nodes_pp": 1000, "nodes_tg": 900, "splits_pp": 1, "splits_tg": 1, "ops_pp": 1000, "ops_tg": 900}
                # deeper runs cost more in proportion to their tokens (a decode and a prompt pay alike a row and cell)
                ns = int(1e6 * (1 + st.depth * st.n / 300000 + st.n / 10 + (10 if m.key == "nodes_b" else 0)))
                out.append(ProbeResult(model=m.key, context=c.key, step=st.key, test=st.test,
                                       depth=st.depth, n=st.n, ns=[ns] * st.reps, graph=g))
    return out


def _fake_runner(plan, progress, timeout):
    return _fake_results(plan)


F16 = [("f16", "f16", "auto")]


def test_a_busy_calibration_is_refused_and_not_cached(monkeypatch, tmp_path):
    _own_home(monkeypatch, tmp_path)
    _quiet(monkeypatch, busy=True)
    with pytest.raises(S.CalibrationError, match="60 % of the CPUs: not cached"):
        S.calibrate(2, True, [], F16, ["avx2"], runner=_fake_runner)
    assert S.cached(2, True) is None
    # asked to keep it (the automatic path of predict and bench): cached, and marked
    sc = S.calibrate(2, True, [], F16, ["avx2"], allow_busy=True, runner=_fake_runner)
    assert sc.remeasured and sc.cal.busy and "60 % of the CPUs: its predictions are marked" in sc.note
    assert "terms passed their physical bounds and are kept" in sc.note
    assert S.cached(2, True).notes == sc.cal.notes
    # a prediction made with it says so in its record
    from edgekv.core.speed import SpeedShape
    from edgekv.prediction.speed import SpeedInputs, speed_block

    blk = speed_block(SpeedShape((), (), None, None), sc.cal, SpeedInputs(2, 0, 0, 0, 2048, 512, "f16", "f16", "auto"))
    assert blk.calibration_busy is True
    # the next run keeps what passed its checks (issue 68: a busy CI runner does not pay again on every run), its
    # predictions still marked; 'edgekv calibrate' (refresh) measures anew
    _quiet(monkeypatch)
    again = S.calibrate(2, True, [], F16, ["avx2"], allow_busy=True, runner=_fake_runner)
    assert not again.remeasured and again.cal.busy and again.cal.id == sc.cal.id
    assert again.note.startswith("the cached calibration was taken while other work used the CPUs: kept")
    fresh = S.calibrate(2, True, [], F16, ["avx2"], allow_busy=True, refresh=True, runner=_fake_runner)
    assert fresh.remeasured and not fresh.cal.busy and not S.cached(2, True).busy
    # with measuring off (EDGEKV_SPEED_CALIBRATE=cached), a busy cached calibration is used and named
    write_json(ST.calibration_path(2, True), {"key": ST.calibration_key(2, True)[0], "fingerprint": {},
                                              "calibration": to_wire(sc.cal)})
    kept = S.calibrate(2, True, [], F16, ["avx2"], measure=False, runner=_fake_runner)
    assert kept.cal.busy and not kept.remeasured and "EDGEKV_SPEED_CALIBRATE=cached" in kept.note


def _hiding(hidden: int, calls: list):
    """A runner whose first ``hidden`` runs time every attention step as fast at depth as without (its cost hidden,
    as other work on the machine can)."""

    def run(plan, progress, timeout):
        out = _fake_results(plan)
        calls.append(sorted({m.key for m in plan}))
        if len(calls) <= hidden:
            for r in out:
                if r.model.startswith("attn"):
                    r.ns = [1_000_000] * len(r.ns)
        return out

    return run


def test_a_disturbed_calibration_is_measured_once_more_only_on_a_quiet_machine(monkeypatch, tmp_path):
    """A deeper cache that measured no slower (other work hid its cost) is measured again once when the machine was
    quiet meanwhile (whether or not busy results are allowed); a second disturbance refuses the calibration.  When
    other work used the CPUs during the first attempt there is no second attempt.  Nothing of a disturbed try is
    cached."""
    _own_home(monkeypatch, tmp_path)
    _quiet(monkeypatch)
    calls: list = []
    sc = S.calibrate(2, True, [], F16, ["avx2"], runner=_hiding(1, calls))
    assert len(calls) == 2 and calls[0] == calls[1]
    assert sc.remeasured and "the first try was disturbed" in sc.note and "no cost for a deeper cache" in sc.note
    assert S.cached(2, True).attn_tg_s["f16/f16/fa=auto"] > 0 and S.cached(2, True).node_tg_s > 0
    for busy, allow in ((False, False), (True, False), (True, True), (False, True)):
        _own_home(monkeypatch, tmp_path / f"{busy}{allow}")
        _quiet(monkeypatch, busy)
        calls.clear()
        with pytest.raises(S.Disturbed, match="no cost for a deeper cache"):
            S.calibrate(2, True, [], F16, ["avx2"], allow_busy=allow, runner=_hiding(2, calls))
        assert len(calls) == (1 if busy else 2) and S.cached(2, True) is None


def test_a_calibration_past_its_deadline_says_what_it_measured_and_keeps_it(monkeypatch, tmp_path):
    """Each run gets at most the time left before the deadline; past it, CalibrationTimeout names what was measured
    and solved, which is cached (not when other work used the CPUs), and the next run measures the rest."""
    import time

    _own_home(monkeypatch, tmp_path)
    _quiet(monkeypatch)
    timeouts, clock = [], [time.monotonic()]
    deadline = clock[0] + 180

    def run(plan, progress, timeout):
        timeouts.append(timeout)
        if any(m.key.startswith("w_") for m in plan):     # the weight models' run: the deadline passes meanwhile
            monkeypatch.setattr(time, "monotonic", lambda: deadline + 1)
            raise S.CalibrationError("the speed calibration failed: timed out")
        return _fake_results(plan)

    with pytest.raises(S.CalibrationTimeout) as e:
        S.calibrate(2, True, ["q4_0"], F16, ["avx2"], runner=run, deadline=deadline)
    monkeypatch.undo()
    assert str(e.value).startswith("the speed calibration passed its 180 s deadline after measuring graph nodes, "
                                   "bandwidth, f16/f16/fa=auto; no speed predictions (edgekv calibrate measures it on "
                                   "a quiet machine); what it measured is cached"), str(e.value)
    assert len(timeouts) == 2 and all(0 < t <= 180 for t in timeouts)
    _own_home(monkeypatch, tmp_path)
    kept = S.cached(2, True)
    assert kept is not None and kept.node_tg_s > 0 and "q4_0" not in kept.matvec_s_per_byte
    # a deadline already past measures nothing
    with pytest.raises(S.CalibrationTimeout, match="deadline before it measured anything"):
        S.calibrate(2, True, ["q4_0"], F16, ["avx2"], runner=run, deadline=time.monotonic() - 1)


def test_a_machine_that_changed_under_its_calibration_is_measured_again(monkeypatch, tmp_path):
    """The drift sentinel: a cached calibration's own weight-model decode, timed again; more than DRIFT_LIMIT apart
    from the time it took then, the calibration is measured again and the note says why."""
    import time

    _own_home(monkeypatch, tmp_path)
    _quiet(monkeypatch)
    key, fp = ST.calibration_key(2, True)
    path = ST.calibration_path(2, True)
    then = [ProbeResult(model="w_q8_0", context="f16", step="tg", n=32, ns=[10_000_000] * 5)]
    ST.write_cache(path, key, fp, _cal(id="first"), then)
    slow, timed = [1.0], []

    def run(plan, progress, timeout):
        out = _fake_results(plan)
        for r in out:
            if r.model == "w_q8_0":
                timed.append(r.model)
                r.ns = [int(10_000_000 * slow[0])] * len(r.ns)
        return out

    def later() -> None:        # the last check older than DRIFT_RECHECK_S
        v = json.loads(ST.verified_path(path).read_text())
        write_json(ST.verified_path(path), {**v, "unix": v["unix"] - S.DRIFT_RECHECK_S - 1})

    def again():
        return S.calibrate(2, True, [], F16, ["avx2"], sentinel="q8_0", runner=run)

    # measured (or found to hold) a moment ago: used as it is, the sentinel not timed
    assert not again().remeasured and timed == []
    later()         # timed again, found to hold, and that time recorded
    same = again()
    assert not same.remeasured and same.cal.id == "first" and timed == ["w_q8_0"]
    v = json.loads(ST.verified_path(path).read_text())
    assert v["id"] == "first" and abs(v["unix"] - time.time()) < 60
    slow[0] = 1.5                                 # the same decode now takes 1.5x the time
    assert again().cal.id == "first" and timed == ["w_q8_0"]       # within the window of the last check
    later()
    new = again()
    assert new.remeasured and new.cal.id != "first"
    assert new.note.startswith("this machine now takes 1.50x the time to decode the calibration's q8_0 weight model "
                               "that it took when it was calibrated (first; more than ±20 % apart): re-measured"), new.note
    # measuring off (EDGEKV_SPEED_CALIBRATE=cached): nothing is timed, the cached calibration is used
    slow[0] = 3.0
    kept = S.calibrate(2, True, [], F16, ["avx2"], sentinel="q8_0", measure=False, runner=run)
    assert not kept.remeasured and kept.cal.id == new.cal.id


@pytest.mark.slow     # a llama.cpp child
def test_interleaved_attention_steps_run_in_turn_through_llama_cpp():
    """edgekv's own probe takes an attention difference's two depths as two sequences of one context (a KV stream
    each), their runs in turn: every run starts at exactly its depth (the child checks), and the deeper sequence's
    runs take longer."""

    # the --repack that runs here: on a CPU whose AMX kernels crash, prompt batches die with them (amx.md)
    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 2, _repack(), interleave=True)
    (c,) = m.contexts
    a = P.attn_steps(None, False, rows=True)     # q8_0's prompts run the per-row loop: shorter, shallower steps
    assert a == P.AttnSteps((P.ROW_LOOP_TG_START, P.ROW_LOOP_TG_START + P.ATTN_TG_DEPTHS[1] - P.ATTN_TG_DEPTHS[0]),
                            P.ATTN_PP_DEPTHS, P.ROW_LOOP_PP_N)
    assert c.params.n_seq_max == 2 and [st.depths for st in c.steps] == [list(a.tg_depths),
                                                                                       list(a.pp_depths)]
    assert [st.n for st in c.steps] == [P.GENERIC_TG_N, P.ROW_LOOP_PP_N]
    for st in c.steps:
        st.reps = 3
    res = {r.step: r for r in S.child_runner([m], None)}
    d0, d1 = a.tg_depths
    p0, p1 = a.pp_depths
    assert set(res) == {f"tg{d0}", f"tg{d1}", f"pp{p0}", f"pp{p1}"}
    assert all(len(r.ns) == 3 for r in res.values())
    assert median_s(res[f"tg{d1}"].ns) > median_s(res[f"tg{d0}"].ns)
    assert median_s(res[f"pp{p1}"].ns) > median_s(res[f"pp{p0}"].ns)
    # taken in turn, and said so: the solver pairs each deep run with the shallow run just before it
    assert all(r.in_turn for r in res.values())
    paired = statistics.median(y - x for x, y in zip(res[f"tg{d0}"].ns, res[f"tg{d1}"].ns)) / 1e9
    assert V.difference_s(res, f"tg{d1}", f"tg{d0}") == pytest.approx(paired)
    tg, pp = V.solve_attn(list(res.values()), kv_key("q8_0", "q8_0", "auto"), 2)
    assert tg > 0 and pp > 0


def test_one_thread_times_half_the_tokens_a_decode_run_and_fills_on_every_core():
    """A calibration at -t 1: each decode step's runs are half the tokens of the two-thread constants (one thread
    takes about twice as long a token, so a run lasts as long), its attention decode and deep prompt steps about half
    the runs (one thread's spread less), its prompts unchanged, a GPU's unchanged; every context fills its caches on
    the cores llama.cpp uses by default."""
    from edgekv.machine.environment import default_threads

    assert (P.run_tokens(P.TG_N, 2), P.run_tokens(P.TG_N, 1), P.run_tokens(P.TG_N, 1, "CUDA0")) == \
        (P.TG_N, P.TG_N // 2, P.TG_N)
    # and an attention decode or deep prompt step about half the runs (at least a median's three)
    assert [P.attn_reps(r, 1) for r in (9, 5, 3)] == [5, 3, 3] and P.attn_reps(9, 2) == P.attn_reps(9, 1, "CUDA0") == 9
    for threads in (1, 2):
        plan = P.weight_plan(["q8_0"], threads, False)
        tg = [st.n for m in plan for st in m.contexts[0].steps if st.test == "tg"]
        assert tg == [P.run_tokens(P.TG_N, threads)] * 3 + [P.run_tokens(P.STREAM_N, threads)] * 3
        assert all(st.n in P.MM_N + P.MM_COLS for m in plan for st in m.contexts[0].steps
                   if st.test == "pp")
        attn = P.attn_plan([("q4_0", "q4_0", "auto"), ("f16", "f16", "auto")], threads, False, "h9kv3k64v64",
                           interleave=True)
        by = {m.key: m for m in attn}
        assert {(st.n, st.reps) for c in by["attnv_h9kv3k64v64"].contexts for st in c.steps} == \
            {(P.run_tokens(P.EVICT_TG_N, threads), P.attn_reps(P.EVICT_TG_REPS, threads))}
        assert {st.reps for c in by["attnd_h9kv3k64v64"].contexts for st in c.steps} == \
            {P.attn_reps(P.DEEP_REPS, threads)}
        # the geometry's prompts keep their three runs at either count, but for an f16 cache's long and short-tile
        # prompts, taken in one turn (PP_TURN_REPS, about half on one thread)
        assert {(c.key.split("/")[0], st.key, st.reps) for c in by["attn_h9kv3k64v64"].contexts for st in c.steps} == {
            ("q4_0", "pp", 3), ("f16", "ps", 3), ("f16", "pp", P.attn_reps(P.PP_TURN_REPS, threads)),
            ("f16", "pt", P.attn_reps(P.PP_TURN_REPS, threads))}
        assert all(c.n_threads == threads and c.fill_threads == max(threads, default_threads())
                   for m in plan + attn for c in m.contexts)


@pytest.mark.slow     # a llama.cpp child
def test_a_one_thread_calibration_fills_on_more_threads_and_times_on_one_through_llama_cpp():
    """Through llama.cpp: a -t 1 attention step's fill runs on the default thread count (llama.cpp holds it while
    filling) and its timed runs on one, and the difference of its two depths still measures a cost per cell."""
    from edgekv.machine.environment import default_threads

    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 1, _repack(), interleave=True)
    (c,) = m.contexts
    for st in c.steps:
        st.reps = 3
    res = S.child_runner([m], None)
    assert {r.threads for r in res} == {1}
    assert {r.fill_threads for r in res} == {default_threads() if default_threads() > 1 else None}
    assert {r.n for r in res if r.test == "tg"} == {P.GENERIC_TG_N // 2}
    tg, pp = V.solve_attn(res, kv_key("q8_0", "q8_0", "auto"), 1)
    assert tg > 0 and pp > 0


@pytest.mark.slow     # a llama.cpp child
def test_an_f16_cache_short_prompt_is_timed_through_llama_cpp_and_costs_more_per_cell():
    """An f16 cache's interleaved plan has a short prompt (PP_ROWS_N, under llama.cpp's 64-row tile) over the
    long prompt's depths; through llama.cpp its deeper runs take longer, and its cost per cell is above the long
    prompt's (the per-row loop against the tiled kernel, ggml-cpu/ops.cpp: several times, whatever the machine's
    noise).  A prompt of PT_N tokens, whose heads' second query tiles are a half, is taken in one turn with the long
    one; its deeper runs take longer too, and the share of cost per tile solved from the two is the formula's over
    those very runs.  Whether that share is above zero is a 10 to 30 % effect that a 2-core VM's noise can hide
    (plans.PP_TURN_REPS): a benchmark's question, not this test's."""

    (m,) = P.attn_plan([("f16", "f16", "auto")], 2, _repack(), interleave=True)
    (c,) = m.contexts
    c.steps = [st for st in c.steps if st.test == "pp"]       # the decode steps are the other test's
    assert [(st.key, st.n, st.depths, st.turn) for st in c.steps] == [
        ("pp", P.ATTN_PP_N, list(P.ATTN_PP_DEPTHS), "pp"), ("pt", P.PT_N, list(P.ATTN_PP_DEPTHS), "pp"),
        ("ps", P.PP_ROWS_N, list(P.ATTN_PP_DEPTHS), "")]
    res = {r.step: r for r in S.child_runner([m], None)}
    p0, p1 = P.ATTN_PP_DEPTHS
    assert median_s(res[f"ps{p1}"].ns) > median_s(res[f"ps{p0}"].ns)
    key = kv_key("f16", "f16", "auto")
    units = P.attn_units(P.ATTN_SHAPE)

    def cost(step: str, n: int) -> float:      # the median of the paired differences, per token, unit and cell
        a, b = res[f"{step}{p0}"], res[f"{step}{p1}"]
        assert a.in_turn and b.in_turn and len(a.ns) == len(b.ns) == P.PP_TURN_REPS
        return statistics.median(y - x for x, y in zip(a.ns, b.ns)) / 1e9 / n / units / (p1 - p0)

    pp, short = cost("pp", P.ATTN_PP_N), cost("pt", P.PT_N)
    rows = V.solve_attn_rows(list(res.values()), key)
    assert rows > pp > 0 and short > 0, (rows, pp, short)
    q = short / pp
    r_long, r_short = tile_ratio(P.ATTN_PP_N, 8, 2), tile_ratio(P.PT_N, 8, 2)
    assert (r_long, r_short) == (1.0, 4 / 3)     # each head's 96 rows: a full tile and a half one
    want = min(1.0, max(0.0, (q - 1) / ((r_short - 1) - q * (r_long - 1))))
    assert V.solve_tile_share(list(res.values()), key, 2) == pytest.approx(want, abs=1e-9), q


def test_the_drift_sentinel_times_the_real_decode(real_cal, tmp_path):
    """check_drift runs the calibration's own weight model through llama.cpp again: against the real calibration's
    timing it gives a positive ratio; against a record of the same decode four times as fast it names the change."""

    key, _fp = ST.calibration_key(2, RP[1] == "1")
    from edgekv.core.probe import readable_results, to_wire

    raw = ST.read_cache(ST.calibration_path(2, RP[1] == "1"), key, False)[2]      # as cached: the JSON rows
    rows = readable_results(raw)
    assert any(r.model == "w_q4_1" and r.step == "tg" for r in rows)
    ratio = ST.check_drift(raw, "q4_1", 2, RP[1] == "1", S.child_runner)
    assert ratio is not None and ratio > 0
    fast = [with_(r, ns=[n // 4 for n in r.ns]) if r.model == "w_q4_1" else r for r in rows]
    write_json(tmp_path / "then.json", {"key": key, "calibration": to_wire(real_cal), "raw": to_wire(fast)})
    why = ST.drifted(real_cal, ST.read_cache(tmp_path / "then.json", key, False)[2], "q4_1", 2, RP[1] == "1", S.child_runner, "")
    assert re.match(r"this machine now takes (\d+\.\d\d)x the time to decode the calibration's q4_1 weight model", why), why
    assert float(why.split("takes ")[1].split("x")[0]) > 1.2, why
    assert ST.check_drift(raw, "q5_1", 2, RP[1] == "1", S.child_runner) is None       # no timing of that type then: no check


def test_a_wide_geometry_is_calibrated_over_shallower_differences_of_the_same_work():
    """Qwen3 8B's 32 x 128 heads cost 4x the generic model's per cell: its decode differences are 1/4 as deep
    (quantized caches from depth 128, f16 keeps split-KV's 512-cell view), its prompts half as long over half
    the depth, and the solver reads the plan's own steps back (a forward model of what the child measures)."""
    from edgekv.core.speed import attn_units_tg, split_kv_path

    g = "h32kv8k128v128"
    shape = P.geometry_shape(g)
    units, sh = P.attn_units(shape), V.attn_speed_shape(shape)
    assert units == 4 * P.attn_units(P.ATTN_SHAPE)
    assert P.attn_steps(g, False) == P.AttnSteps((128, 384), (0, 512), P.ATTN_PP_N // 2)
    assert P.attn_steps(g, True).tg_depths == (640, 896)
    assert P.attn_steps("h9kv3k64v64", False) == P.AttnSteps(P.ATTN_TG_DEPTHS, P.ATTN_PP_DEPTHS, P.ATTN_PP_N)
    truth_tg, truth_pp, truth_rows = 5e-10, 3e-10, 9e-10
    for pair in (("q5_0", "q5_0", "auto"), ("f16", "f16", "auto")):
        # one model: the geometry's six layers at a hidden size of 4096 read enough a token to evict the caches
        # (a narrower geometry's decode steps run on a copy with a larger head, test_the_attention_calibration_...)
        m, *deep = P.attn_plan([pair], 2, True, g)
        assert m.key == f"attn_{g}" and not any(d.key.startswith("attnv_") for d in deep)
        key, split = kv_key(*pair, g), split_kv_path(*pair)
        res = []
        for st in m.contexts[0].steps:
            d, n = st.depth, st.n
            t = (0.01 + n * attn_units_tg(sh, d + n / 2, 2, split) * truth_tg if st.test == "tg"
                 else 0.2 + n * units * (d + n / 2) * (truth_rows if st.key.startswith("ps") else truth_pp))
            res.append(ProbeResult(model=f"attn_{g}", context=key, step=st.key, n=n, ns=[int(t * 1e9)] * 3))
        assert V.solve_attn(res, key, 2) == (pytest.approx(truth_tg, rel=1e-3), pytest.approx(truth_pp, rel=1e-3))
        # the f16 cache's short prompts (under 64 tokens: the per-row loop) over the same depths, and only its
        ps = [st for st in m.contexts[0].steps if st.key.startswith("ps")]
        assert [st.key for st in ps] == (["ps0", "ps512", "ps0b"] if split else [])
        assert all(st.n == P.PP_ROWS_N < FA_TILE_Q and st.test == "pp" for st in ps)
        if split:
            assert V.solve_attn_rows(res, key) == pytest.approx(truth_rows, rel=1e-3)
        # and the tiled kernel deep in the cache: DEEP_PP_N-token prompts at TILED_DEEP_DEPTHS (shallow, deep,
        # shallow) on a one-layer model of the geometry, priced along the model's own ramp
        assert len(deep) == (1 if split else 0)
        if split:
            from edgekv.core.speed import TILED_DEEP_DEPTHS, tiled_cells_cost

            (d,) = deep
            (c,) = d.contexts
            d0, d1 = TILED_DEEP_DEPTHS
            assert d.key == f"attnd_{g}" and P.deep_shape(g)["n_layer"] == 1
            assert [(st.key, st.depth, st.n) for st in c.steps] == [
                (f"pd{d0}", d0, P.DEEP_PP_N), (f"td{d0}", d0, P.PT_N), (f"pd{d1}", d1, P.DEEP_PP_N),
                (f"td{d1}", d1, P.PT_N), (f"pd{d0}b", d0, P.DEEP_PP_N), (f"td{d0}b", d0, P.PT_N)]
            assert c.params.n_ctx >= d1 + P.DEEP_PP_N
            du, truth_deep = P.attn_units(P.deep_shape(g)), 8e-10
            res += [ProbeResult(model=d.key, context=key, step=st.key,
                     ns=[int((0.05 + st.n * du * tiled_cells_cost(st.depth + st.n / 2, truth_pp, truth_deep))
                                * 1e9)] * 3) for st in c.steps]
            assert V.solve_attn_deep(res, key) == pytest.approx(truth_deep, rel=1e-3)
    # the generic model (no geometry) and a GPU take no deep step
    assert len(P.attn_plan([("f16", "f16", "auto")], 2, True)) == 1
    assert len(P.attn_plan([("f16", "f16", "auto")], 2, True, g, "CUDA0")) == 1


def test_the_widest_heads_are_calibrated_on_fewer_layers_and_deep_runs_of_the_8b_work():
    """Qwen2.5 72B's 64 x 128 heads over 8192: six layers of them would do 8x the generic model's work a cell where
    the decode difference cannot shrink below 256 cells, and its projections 8192 wide took the calibration 170 s on
    two cores.  Its model is GEOMETRY_MAX_EMBD wide and three layers deep (4x: the steps of Qwen3 8B's geometry), and
    its deep prompts run 3 times, each of twice the 8B's work; the 8B's own plan is unchanged."""
    from edgekv.core.speed import GEOMETRY_MAX_EMBD

    wide, eight = P.geometry_shape("h64kv8k128v128e4096"), P.geometry_shape("h32kv8k128v128")
    assert (wide["n_embd"], wide["n_layer"]) == (GEOMETRY_MAX_EMBD, 3)
    assert (eight["n_embd"], eight["n_layer"]) == (4096, P.GEOMETRY_LAYERS)
    units = P.GEOMETRY_LAYERS * P.WIDE_LAYER_UNITS
    assert P.attn_units(wide) == P.attn_units(eight) == units == 4 * P.attn_units(P.ATTN_SHAPE)
    for split in (False, True):
        assert P.attn_steps("h64kv8k128v128e4096", split) == P.attn_steps("h32kv8k128v128", split)
    # a geometry of more work a layer still gets a layer
    assert P.geometry_shape("h128kv8k256v256e4096")["n_layer"] == 1

    def reps(g: str) -> set[int]:
        plan = P.deep_plan([("f16", "f16", "auto")], 2, True, g, interleave=True)
        return {st.reps for c in plan.contexts for st in c.steps}

    assert reps("h64kv8k128v128e4096") == {3}
    assert reps("h32kv8k128v128") == reps("h9kv3k64v64") == {P.DEEP_REPS}


def test_two_calibrations_begun_in_the_same_second_have_two_ids():
    """A calibration's id is its key's head, the second it began and four random hex digits: two edgekv processes
    that start one in the same second keep them apart (_merge_cached merges only the same id)."""

    ids = [O.named(None, "0123456789abcdef", 2, "llama-cpp-python").id for _ in range(20)]
    assert all(re.fullmatch(r"0123456789ab-\d{14}-[0-9a-f]{4}", i) for i in ids), ids
    assert len(set(ids)) > 1, ids       # twenty draws of 4 hex digits all alike: 1 in 65,536 ** 19


def test_attention_steps_run_in_order_of_depth_so_the_child_extends_one_fill():

    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 2, True)
    a = P.attn_steps(None, False, rows=True)
    steps = m.contexts[0].steps
    depths = [st.depth for st in steps[:-2]]
    assert depths == sorted(depths) and set(depths) == set(a.tg_depths) | set(a.pp_depths)
    # then the shallow ones again (the child only drops cells): shallow, deep, shallow
    assert [(st.key, st.depth) for st in steps[-2:]] == [(f"tg{a.tg_depths[0]}b", a.tg_depths[0]),
                                                               (f"pp{a.pp_depths[0]}b", a.pp_depths[0])]
    # a steady drift over the three steps cancels: the shallow time is the mean of before and after
    r = {k: ProbeResult(step=k, ns=[ms * 1_000_000] * 3) for k, ms in (("tg640", 10), ("tg640b", 14))}
    assert V.shallow_s(r, "tg640") == pytest.approx(0.012)
    assert V.shallow_s({"tg640": r["tg640"]}, "tg640") == pytest.approx(0.010)
    # runs taken in sequence are not paired: the difference of the medians, the shallow one before and after
    deep = ProbeResult(step="tg1664", ns=[15_000_000] * 3)
    assert V.difference_s({**r, "tg1664": deep}, "tg1664", "tg640") == pytest.approx(0.003)


def test_runs_taken_in_turn_are_paired_so_a_slow_stretch_falls_out():
    """The in-process probe takes a difference's shallow and deep runs in turn; a stretch in which the machine runs
    slower lengthens both runs of a pair.  Paired, the difference stays what it is; the difference of the medians
    takes the stretch in (here the shallow step's median lands on a fast run, the deep step's on a slow one)."""

    shallow = [10, 14, 10, 14, 10]     # ms: runs 2 and 4 of both depths in a stretch 4 ms slower
    deep = [12, 16, 12, 16, 16]        # and the deep step's last run slowed on its own
    r = {k: ProbeResult(step=k, ns=[x * 1_000_000 for x in runs], in_turn=True)
         for k, runs in (("tg128", shallow), ("tg1152", deep))}
    assert V.difference_s(r, "tg1152", "tg128") == pytest.approx(0.002)     # pairs: 2 2 2 2 6
    # the same runs without the mark (llama-bench's, in sequence): medians 16 and 10 ms
    seq = {k: ProbeResult(step=k, ns=v.ns) for k, v in r.items()}
    assert V.difference_s(seq, "tg1152", "tg128") == pytest.approx(0.006)
    # a shallow step taken again after the deep one (llama-bench) is never paired, marked or not
    again = {**r, "tg128b": ProbeResult(step="tg128b", ns=r["tg128"].ns, in_turn=True)}
    assert V.difference_s(again, "tg1152", "tg128") == pytest.approx(0.006)


def test_a_disturbed_calibration_never_yields_a_free_graph_or_free_weights():
    """Other work that hides a cost must not become a zero (or negative) coefficient: a graph whose nodes cost
    nothing predicted 8.6 t/s against 49 measured with a calibration taken on a busy machine."""

    g = {"nodes_pp": 100, "nodes_tg": 90, "splits_pp": 1, "splits_tg": 1, "ops_pp": 100, "ops_tg": 90}
    gb = {"nodes_pp": 1000, "nodes_tg": 900, "splits_pp": 1, "splits_tg": 1, "ops_pp": 1000, "ops_tg": 900}
    res = [ProbeResult(model="nodes_a", step="tg", ns=[5_000_000] * 3, graph=g),
           ProbeResult(model="nodes_a", step="pp", ns=[9_000_000] * 3, graph=g),
           ProbeResult(model="nodes_b", step="tg", ns=[9_000_000] * 3, graph=gb),
           ProbeResult(model="nodes_b", step="pp", ns=[8_000_000] * 3, graph=gb)]    # the deeper graph measured faster
    with pytest.raises(S.CalibrationError, match="no cost for a deeper graph"):
        V.solve_nodes(res)
    res[3].ns = [20_000_000] * 3
    res += [ProbeResult(model="nodes_a", step="ps", ns=[2_000_000] * 5, graph=g),
            ProbeResult(model="nodes_b", step="ps", ns=[1_900_000] * 5, graph=gb)]     # so did its short prompt
    with pytest.raises(S.CalibrationError, match="under a short prompt"):
        V.solve_nodes(res)


def test_llama_bench_probe_runs_each_shallow_deep_shallow_group_as_one_process_and_checks_what_came_back():
    """The calibration plan through the user's llama-bench (edgekv.calibration.lbprobe): a context's steps that
    share a test, token count and repetitions are one llama-bench run over their depths in the plan's order; its
    JSON lines must be the tests asked for, or the calibration stops with the reason (never a misread figure)."""
    from edgekv.calibration.lbprobe import ProbeError, group_argv, parse_group, step_groups

    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 2, False)
    ctx = m.contexts[0]
    groups = step_groups(ctx.steps)
    assert [[st.key for st in g] for g in groups] == [["pp0", "pp1024", "pp0b"], ["tg128", "tg1152", "tg128b"]]
    argv = group_argv("/x/llama-bench", "/m.gguf", ctx, groups[1], False)
    assert argv[argv.index("-d") + 1] == "128,1152,128" and argv[argv.index("-n") + 1] == str(P.GENERIC_TG_N)
    assert argv[argv.index("-p") + 1] == "0" and argv[argv.index("-ctk") + 1] == "q8_0" and argv[-2:] == ["--repack", "0"]
    assert argv[argv.index("-r") + 1] == "5" and argv[argv.index("-o") + 1] == "jsonl"
    line = '{{"n_depth": {d}, "n_gen": 32, "samples_ns": [1000, 1100, 1200, 1300, 1400]}}'
    out = "\n".join(line.format(d=d) for d in (128, 1152, 128))
    log = "sched_reserve: max_nodes = 1024\nsched_reserve: graph: nodes = 68, splits = 1, input objects = 4, input tensors = 6"
    res = parse_group(out, log, groups[1], "attn/q8_0")
    assert [r.step for r in res] == ["tg128", "tg1152", "tg128b"] and res[1].depth == 1152
    assert res[0].graph == {"nodes_pp": 68, "nodes_tg": 68, "splits_pp": 1, "splits_tg": 1}
    assert res[0].ns == [1000, 1100, 1200, 1300, 1400]
    with pytest.raises(ProbeError, match="printed 2 results for attn/q8_0, not 3"):
        parse_group("\n".join(out.splitlines()[:2]), log, groups[1], "attn/q8_0")
    with pytest.raises(ProbeError, match="not the test asked for"):
        parse_group(out.replace('"n_depth": 1152', '"n_depth": 1150'), log, groups[1], "attn/q8_0")


def test_the_probe_protocol_is_typed_both_ways():
    """A plan crosses to the child as JSON and comes back decoded into the same Structs; a payload that is not a
    plan, or a reply that is not one, is refused rather than misread."""
    import msgspec

    from edgekv.core.probe import ProbeRequest, reply_from, request_from, results_of, to_wire

    plan = P.attn_plan([("f16", "f16", "auto")], 2, True, "h9kv3k64v64", interleave=True) + P.weight_plan(["q8_0"], 2, True)
    wire = json.loads(json.dumps(to_wire(ProbeRequest(models=plan))))
    assert request_from(wire).models == plan
    with pytest.raises(msgspec.ValidationError):
        request_from({"models": [{**wire["models"][0], "contexts": "all"}]})
    with pytest.raises(msgspec.ValidationError):
        reply_from({"ok": True, "results": [{"step": "tg", "ns": ["fast"]}]})
    assert results_of([{"model": "w", "step": "tg", "ns": [1, 2]}]) == [ProbeResult(model="w", step="tg", ns=[1, 2])]
    # the llama-bench probe's lines are decoded as strictly
    from edgekv.calibration.lbprobe import ProbeError, parse_group

    (m,) = P.attn_plan([("q8_0", "q8_0", "auto")], 2, False)
    group = [st for st in m.contexts[0].steps if st.test == "tg"]
    bad = "\n".join(f'{{"n_depth": {st.depth}, "samples_ns": "many"}}' for st in group)
    with pytest.raises(ProbeError, match="not one"):
        parse_group(bad, "", group, "attn/q8_0")


def test_calibrations_export_to_one_bundle_and_import_under_names_edgekv_gives_them(monkeypatch, tmp_path):
    """export_calibrations writes the store's speed calibrations, baselines and preflight verdicts into one JSON
    bundle; import_calibrations checks every entry before writing any, derives each file's name itself (a bundle
    never chooses a path), and refuses another version's bundle or speed calibration in one line."""
    _own_home(monkeypatch, tmp_path / "a")
    key, fp = ST.calibration_key(2, True)
    ST.write_cache(ST.calibration_path(2, True), key, fp, _cal(id="exported"),
                   [ProbeResult(model="w_q8_0", step="tg", ns=[5])])
    from edgekv.calibration.baseline import fingerprint, fingerprint_key, store_path

    base_fp = fingerprint("python")
    write_json(store_path("python"), {"key": fingerprint_key(base_fp), "fingerprint": base_fp, "bytes": 123})
    write_json(store_path("python-preflight"), {"runs": True, "detail": "", "fingerprint_key": "0123456789abcdef"})
    write_json(store_path("stray"), {"x": 1})           # not a file edgekv writes: left out
    bundle = tmp_path / "cal.json"
    assert S.export_calibrations(bundle) == 3
    _own_home(monkeypatch, tmp_path / "b")
    assert S.cached(2, True) is None
    assert S.import_calibrations(bundle) == 3
    assert S.cached(2, True).id == "exported"
    assert json.loads(store_path("python").read_text())["bytes"] == 123
    assert json.loads(store_path("python-preflight").read_text())["runs"] is True
    # untrusted input: a runtime that would name another path, a key that is not its fingerprint's, another version
    data = json.loads(bundle.read_text())
    speed = next(e for e in data["entries"] if e["kind"] == "speed")

    def refused(entries, match, version=1):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"edgekv_calibrations": version, "entries": entries}))
        before = sorted(p.name for p in store_path("x").parent.iterdir())
        with pytest.raises(S.CalibrationError, match=match):
            S.import_calibrations(bad)
        assert sorted(p.name for p in store_path("x").parent.iterdir()) == before      # nothing written

    refused([{**speed, "runtime": "../../etc"}], "runtime '../../etc' is not one edgekv writes")
    refused([{**speed, "content": {**speed["content"], "key": "0" * 16}}], "its key is not its fingerprint's")
    old = {**speed["content"]["fingerprint"], "speed": 1}
    refused([{**speed, "content": {**speed["content"], "fingerprint": old, "key": fingerprint_key(old)}}],
            "entry 0 \\(speed\\) is refused: it is a speed calibration of version 1/")
    refused([speed, {**speed, "kind": "model"}], "not an edgekv calibration bundle")
    refused([speed], "a calibration bundle of version 9; this edgekv reads version 1", version=9)
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(S.CalibrationError, match="text.json: not an edgekv calibration bundle"):
        S.import_calibrations(tmp_path / "text.json")


# -- real llama.cpp: one calibration for the suite, then predict / bench / calibrate ----------------------------

def _repack() -> bool:
    """The --repack setting that runs here: llama.cpp's default unless its AMX kernels crash on this CPU
    (the preflight; ../shared/reference/amx.md), so the calibration's prompt batches do not die there."""
    from edgekv.calibration.preflight import preflight

    return preflight().repack


RP = ["--repack", "1"]


@pytest.fixture(scope="module")
def real_cal(smollm2_path):
    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.calibration.speedcal import calibrate
    from edgekv.prediction.speed import model_speed_shape, weight_types

    RP[1] = "1" if _repack() else "0"
    feats = runtime_baseline().cpu_features
    m = load_model(str(smollm2_path))
    sh = model_speed_shape(m, feats, RP[1] == "1", None)
    speed = edgekv_home() / "calibration" / "speed"
    # the disk the calibration's models take, sampled while it runs (blocks written, not sizes: a cut file is small)
    # (its scratch folder: the models of this process's plans)
    done, peak = threading.Event(), [0]

    def watch():
        while not done.wait(0.02):
            peak[0] = max(peak[0], _disk_bytes(speed / "scratch"))

    w = threading.Thread(target=watch)
    w.start()
    try:
        # refresh: measured here whatever an earlier run of the suite cached (a fresh clone's CI measures anyway)
        sc = calibrate(2, RP[1] == "1", weight_types(sh), [("f16", "f16", "auto"), ("q8_0", "q8_0", "auto")], feats,
                       allow_busy=True, geometries=sorted({a.geometry for a in sh.attn}), refresh=True)
    finally:
        done.set()
        w.join()
    SPEED_FILES_AFTER[:] = sorted(str(p.relative_to(speed)) for p in speed.rglob("*.gguf")
                                  if f"-p{os.getpid()}." in p.name)
    SPEED_PEAK[0] = peak[0] if sc.remeasured else -1
    return sc.cal


def _disk_bytes(folder) -> int:
    n = 0
    for p in folder.rglob("*"):
        try:
            n += p.stat().st_blocks * 512
        except OSError:     # deleted meanwhile
            pass
    return n


SPEED_FILES_AFTER: list[str] = []
SPEED_PEAK = [0]


def test_real_calibration_is_positive_and_cached(real_cal):
    from edgekv.calibration.speedcal import cached

    cal = real_cal
    assert cal.node_tg_s > 0 and cal.node_pp_s > 0 and cal.bandwidth_bytes_s > 1e8
    assert {"q4_1", "q8_0"} <= set(cal.matvec_s_per_byte) and all(v > 0 for v in cal.matvec_s_per_byte.values())
    assert all(cal.matmul_s_per_flop[k] > 0 for k in cal.matvec_s_per_byte)
    # each type's narrow model was decoded: a cost per row for it (zero only where noise made it negative)
    assert set(cal.matvec_s_per_row) == set(cal.matvec_s_per_byte) and all(v >= 0 for v in cal.matvec_s_per_row.values())
    # and the mat-mat's cost per dot product, from the narrow model's prompts (zero only where noise made it negative)
    assert set(cal.matmul_s_per_dot) == set(cal.matvec_s_per_byte) and all(v >= 0 for v in cal.matmul_s_per_dot.values())
    assert set(cal.matvec_stream_s_per_byte) == set(cal.matvec_s_per_byte)     # and its 384 MB model streamed
    assert all(v > 0 for v in cal.matvec_stream_s_per_byte.values())
    # and its narrow 384 MB model: the cost per row while streaming (zero only where noise made it negative)
    assert set(cal.matvec_stream_s_per_row) == set(cal.matvec_s_per_byte)
    assert all(v >= 0 for v in cal.matvec_stream_s_per_row.values())
    assert all(cal.attn_tg_s[k] > 0 and cal.attn_pp_s[k] > 0 for k in cal.attn_tg_s)
    # an f16 cache's short prompts run llama.cpp's per-row loop: measured apart, dearer per cell than the tiled
    # kernel of its long prompts (a quantized cache runs that loop at every size: nothing apart)
    assert set(cal.attn_pp_rows_s) == {k for k in cal.attn_tg_s if k.startswith("f16/f16/")}
    assert all(cal.attn_pp_rows_s[k] > cal.attn_pp_s[k] for k in cal.attn_pp_rows_s)
    # and its long prompts' tiled kernel deep in the cache, on a one-layer model of each geometry
    assert set(cal.attn_pp_deep_s) == {k for k in cal.attn_tg_s if k.startswith("f16/f16/") and "@" in k}
    assert cal.attn_pp_deep_s and all(v > 0 for v in cal.attn_pp_deep_s.values())
    # the models were written one at a time (each just before llama.cpp loaded it, cut to its header once timed: the
    # largest, Q8_0's 447 MB streaming model; 2.4 GB were on disk at once when a plan wrote them all first) and none
    # is left behind
    assert SPEED_FILES_AFTER == []
    assert 0 < SPEED_PEAK[0] < 600 << 20, SPEED_PEAK[0]
    again = cached(2, True)
    assert again is not None and again.id == cal.id


def test_predict_shows_speed_and_its_json_record(real_cal, smollm2_path, capsys):
    rc = main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "f16,q8_0", "-t", "2", *RP, "--json"])
    assert rc == 0
    recs = json.loads(capsys.readouterr().out)
    for r in recs:
        sp = r["prediction"]["speed"]
        assert sp["calibration_id"] == real_cal.id
        assert sp["tg"]["depth"] == 1024 - 512 and sp["tg"]["tokens_per_s"] > 0 and sp["pp"]["tokens_per_s"] > 0
        assert {p["name"] for p in sp["tg"]["parts"]} == {"fixed", "weights", "output head", "attention"}
        assert sp["tg"]["roofline_tokens_per_s"] > sp["tg"]["tokens_per_s"]
        assert sp["machine"].endswith("2 threads") and sp["calibrated_with"] == "llama-cpp-python"
    # each row's own graph: a quantized cache adds nodes (llama.cpp's dry run: SmolLM2 936 with f16, 1296 with q8_0),
    # mostly views; the nodes a backend runs are the scheduler's listing: 576 and 696
    fixed = {r["settings"]["type_k"]: next(p["source"] for p in r["prediction"]["speed"]["tg"]["parts"]
                                            if p["name"] == "fixed") for r in recs}
    assert fixed["f16"].startswith("576 graph nodes that run") and fixed["q8_0"].startswith("696 graph nodes that run")
    rc = main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "-t", "2", *RP])
    out = capsys.readouterr().out
    assert rc == 0 and "tg t/s" in out and "t/s (predicted)" in out
    rc = main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "-t", "2", "--kv-only", "--json"])
    (r,) = json.loads(capsys.readouterr().out)
    assert r["prediction"]["speed"]["error"].startswith("--kv-only")


def test_predict_takes_each_pair_s_graph_from_the_memory_dry_run(real_cal, smollm2_path, capsys, monkeypatch):
    """The speed model's node count per K/V pair comes from the whole-process prediction's own dry run: one llama.cpp
    session for the whole table (a second one for the graphs alone took 1.2 s of a 5 s predict), and the count is
    the same at every context (llama.cpp's graph does not grow with n_ctx)."""
    from edgekv.runtime import engine as E

    opened = []
    enter = E.EngineSession.__enter__
    monkeypatch.setattr(E.EngineSession, "__enter__", lambda self: opened.append(self.model_path) or enter(self))
    rc = main(["predict", str(smollm2_path), "-c", "1024,8192", "-ctk", "f16,q8_0", "-t", "2", *RP, "--json"])
    assert rc == 0 and len(opened) == 1, opened
    recs = json.loads(capsys.readouterr().out)
    fixed = {(r["settings"]["n_ctx"], r["settings"]["type_k"]): next(
        p["source"] for p in r["prediction"]["speed"]["tg"]["parts"] if p["name"] == "fixed") for r in recs}
    assert len(fixed) == 4
    for (_n, t), src in fixed.items():
        assert src.startswith({"f16": "576 graph nodes", "q8_0": "696 graph nodes"}[t]), src
    # --kv-only makes no process prediction: the speed model is not asked either (no dry run at all)
    opened.clear()
    assert main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "-t", "2", *RP, "--kv-only"]) == 0
    assert opened == []


def test_report_of_predicted_speed(real_cal, smollm2_path, tmp_path, capsys):
    """A predicted-only report with speed: the table, the plot, the CSV columns, and the banner that says what ran."""
    assert main(["predict", str(smollm2_path), "-c", "1024,2048", "-ctk", "f16,q8_0", "-t", "2", *RP, "--json"]) == 0
    preds = tmp_path / "p.json"
    preds.write_text(capsys.readouterr().out)
    recs = json.loads(preds.read_text())
    assert main(["report", str(preds), "-o", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "README.md").read_text()
    assert "No model in this report was run" in md and f"`{real_cal.id}` on " in md
    assert "### Speed, predicted" in md and (tmp_path / "r" / "speed_predicted.png").stat().st_size > 1000
    table = md.split("### Speed, predicted")[1].split("\n\n")[2].splitlines()
    assert len(table) == 2 + len(recs)
    import csv

    rows = list(csv.DictReader((tmp_path / "r" / "results.csv").open()))
    for row, r in zip(sorted(rows, key=lambda x: (int(x["n_ctx"]), x["type_k"] != "f16")),
                      sorted(recs, key=lambda x: (x["settings"]["n_ctx"], x["settings"]["type_k"] != "f16"))):
        assert float(row["tg_ts_predicted"]) == pytest.approx(r["prediction"]["speed"]["tg"]["tokens_per_s"], rel=1e-3)
        assert row["speed_calibration_id"] == real_cal.id


def test_budget_with_a_speed_floor(real_cal, smollm2_path, capsys):
    base = ["predict", str(smollm2_path), "-ctk", "q8_0", "-t", "2", *RP, "--budget", "2GiB", "--json"]
    assert main(base) == 0
    (free,) = json.loads(capsys.readouterr().out)["budget"]
    assert free["max_n_ctx"] > 256
    assert main(base + ["--min-tg", "1000000"]) == 0
    (none,) = json.loads(capsys.readouterr().out)["budget"]
    assert none["max_n_ctx"] == 0 and "decode at 1e+06 t/s" in none["note"]
    assert main(base + ["--min-tg", "1"]) == 0
    (slow,) = json.loads(capsys.readouterr().out)["budget"]
    assert slow["max_n_ctx"] == free["max_n_ctx"] and slow["predicted_tg_tokens_per_s"] >= 1
    mid = slow["predicted_tg_tokens_per_s"] * 1.5
    assert main(base + ["--min-tg", f"{mid}"]) == 0
    (cut,) = json.loads(capsys.readouterr().out)["budget"]
    assert 0 < cut["max_n_ctx"] < free["max_n_ctx"] and cut["predicted_tg_tokens_per_s"] >= mid
    assert "limited by --min-tg" in cut["note"]
    assert main(["predict", str(smollm2_path), "--min-tg", "5"]) == 2
    assert "--min-tg needs --budget" in capsys.readouterr().err


def test_bench_record_carries_the_speed_prediction(real_cal, smollm2_path, tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    rc = main(["bench", str(smollm2_path), "-c", "512", "-ctk", "q8_0", "-p", "64", "-n", "8", "-r", "2", "-t", "2", *RP,
               "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    sp = rec["prediction"]["speed"]
    assert sp["calibration_id"] == real_cal.id and sp["pp"]["depth"] == rec["settings"]["n_depth"]
    graph = rec["prediction"]["engine"]["graph"]
    assert 0 < graph["ops_tg"] < graph["nodes_tg"]         # the scheduler's listing: the views are not counted
    assert sp["tg"]["parts"][0]["source"].startswith(f"{graph['ops_tg']} graph nodes that run")
    meas = rec["speed"]["tg"]["mean_ts"]
    assert rec["speed_residual"]["tg_pct"] == pytest.approx(100 * (meas - sp["tg"]["tokens_per_s"]) /
                                                            sp["tg"]["tokens_per_s"], abs=0.01)
    assert "(predicted " in text


def test_sequences_decoding_together_are_predicted(real_cal, smollm2_path, tmp_path, capsys):
    """-npl 2: both prompts from an empty cache in one batch, then steps of one token per sequence; the prediction
    is the aggregate rate, as measured, with the weights read once per step for both sequences."""
    from edgekv.core.speed import predict_tg, weights_s

    out = tmp_path / "npl.jsonl"
    rc = main(["bench", str(smollm2_path), "-c", "512", "-ctk", "f16", "-p", "32", "-n", "8", "-r", "2", "-t", "2",
               "-npl", "1,2", *RP, "-o", str(out)])
    capsys.readouterr()
    assert rc == 0
    one, two = [json.loads(x) for x in out.read_text().splitlines()]
    for rec, k in ((one, 1), (two, 2)):
        sp = rec["prediction"]["speed"]
        assert sp["calibration_id"] == real_cal.id, sp.get("error")
        assert sp["pp"]["n_tokens"] == 32 * k and sp["pp"]["depth"] == 0 and sp["tg"]["depth"] == 32
        meas = rec["speed"]["tg"]["mean_ts"]
        assert rec["speed_residual"]["tg_pct"] == pytest.approx(100 * (meas - sp["tg"]["tokens_per_s"]) /
                                                                sp["tg"]["tokens_per_s"], abs=0.01)
    # the step's weights are the calibration's 2-column mat-mul, shared by both sequences (whether that beats two
    # mat-vecs is the machine's answer, measured, not assumed here)
    m = load_model(str(smollm2_path))
    from edgekv.calibration.baseline import runtime_baseline
    from edgekv.prediction.speed import model_speed_shape

    sh = model_speed_shape(m, runtime_baseline().cpu_features, RP[1] == "1", {"ops_tg": 1, "ops_pp": 1})
    for g in sh.groups:
        assert weights_s(g, real_cal, 1) == pytest.approx(max(g.bytes * real_cal.matvec_s_per_byte[g.key]
                                                              + g.rows * real_cal.matvec_s_per_row[g.key],
                                                              g.bytes * real_cal.matvec_stream_s_per_byte[g.key]
                                                              + g.rows * real_cal.matvec_stream_s_per_row[g.key]))
        assert weights_s(g, real_cal, 4) == pytest.approx(g.bytes * real_cal.matcols_s_per_byte[g.key]["4"]
                                                          + g.rows * real_cal.matcols_s_per_row[g.key]["4"])
    parts = {p["name"]: p["s_per_token"] for p in two["prediction"]["speed"]["tg"]["parts"]}
    assert parts["weights"] == pytest.approx(sum(weights_s(g, real_cal, 2) for g in sh.groups if not g.output) / 2)
    assert predict_tg(sh, real_cal, 32, 8, "f16", "f16", "auto", 2).parts[1].s_per_token == pytest.approx(parts["weights"])


def test_cached_only_names_what_is_missing(real_cal, smollm2_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGEKV_SPEED_CALIBRATE", "cached")
    rc = main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "q5_0", "-t", "2", *RP, "--json"])
    (r,) = json.loads(capsys.readouterr().out)
    assert rc == 0 and "q5_0/q5_0/fa=auto@h9kv3k64v64" in r["prediction"]["speed"]["error"]
    assert "edgekv calibrate" in r["prediction"]["speed"]["error"]
    monkeypatch.setenv("EDGEKV_SPEED_CALIBRATE", "sometimes")
    rc = main(["predict", str(smollm2_path), "-c", "1024", "-ctk", "f16", "-t", "2", "--json"])
    (r,) = json.loads(capsys.readouterr().out)
    assert "auto or cached" in r["prediction"]["speed"]["error"]


def test_calibrate_command(real_cal, capsys):
    rc = main(["calibrate", "-t", "2", "-ctk", "f16", *RP, "--allow-busy", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["n_threads"] == 2 and kv_key("f16", "f16", "auto") in d["attn_tg_s"]
    assert main(["calibrate", "-t", "-1"]) == 2
    assert "--threads" in capsys.readouterr().err


# -- the GPU form (issue 26 point 10): its plan, keys and solvers, on any machine -------------------------------------

def test_a_gpu_calibration_is_its_own_with_every_layer_offloaded(monkeypatch):
    from edgekv.core.speed import split_kv_path

    cpu, gpu = ST.calibration_path(2, True), ST.calibration_path(2, True, None, "CUDA0")
    assert cpu != gpu and gpu.name.endswith("-CUDA0-baseline.json")
    odd = ST.calibration_path(2, True, None, "../CU DA")             # a device name is llama.cpp's; anything else is hashed
    assert "/" not in odd.name.replace("-baseline.json", "") and ".." not in odd.name and odd.parent == gpu.parent
    assert ST.calibration_key(2, True)[0] != ST.calibration_key(2, True, None, "CUDA0")[0]
    assert all(m.n_gpu_layers == 0 for m in P.base_plan(2, True)) and "nodes_v" not in {m.key for m in P.base_plan(2, True)}
    dev = P.base_plan(2, True, "CUDA0")
    assert all(m.n_gpu_layers == -1 for m in dev) and "nodes_v" in {m.key for m in dev}
    (a,) = P.attn_plan([("q4_0", "q4_0", "auto")], 2, True, None, "CUDA0")
    (ctx,) = a.contexts
    assert {st.depth for st in ctx.steps} == {*P.DEVICE_ATTN_TG_DEPTHS, *P.DEVICE_ATTN_PP_DEPTHS}
    assert ctx.params.n_ctx >= max(P.DEVICE_ATTN_TG_DEPTHS) + P.TG_N and a.n_gpu_layers == -1
    assert P.attn_plan([("q4_0", "q4_0", "auto")], 2, True)[0].contexts[0].params.n_ctx == 4096
    assert P.weight_shape("q4_0", "CUDA0")["n_embd"] == 4096 and P.weight_shape("q4_0")["n_embd"] == 1024
    assert split_kv_path("f16", "f16", "auto") and not split_kv_path("f16", "f16", "auto", "CUDA0")


def test_only_a_whole_offload_is_predicted_on_a_gpu():
    from edgekv.prediction.speed import offload_device

    assert offload_device(-1, 30, None) == ("", None)            # a build without a GPU: llama.cpp runs on the CPU
    assert offload_device(0, 30, "CUDA0") == ("", None)
    assert offload_device(-1, 30, "CUDA0") == ("CUDA0", None)
    assert offload_device(31, 30, "CUDA0") == ("CUDA0", None)     # the layers and the output
    dev, why = offload_device(15, 30, "CUDA0")
    assert "-ngl 15 offloads part of the model's 30 layers" in why


def test_a_gpu_prices_a_node_at_the_model_s_widths(smol, gemma3_header, headers):
    """body_geometry names the widths; the solvers recover a forward model's node cost at those widths and the
    cost of a logit; a GPU prediction uses them and refuses a model whose widths it has not measured."""
    from edgekv.core.speed import Calibration, MissingCalibration, body_geometry, kv_key, predict_tg
    from edgekv.prediction.api import load_model

    m, smol_sh = smol
    assert body_geometry(m.shape) == "e576f1536h9kv3d64l30"
    assert body_geometry(load_model(str(gemma3_header)).shape) == "e640f2048h4kv1d256l18"
    assert P.body_shape("e576f1536h9kv3d64l30")["n_layer"] == 30
    with pytest.raises(S.CalibrationError):
        P.body_shape("../x")
    f16 = kv_key("f16", "f16", "auto")
    cal = Calibration(id="t", n_threads=8, node_tg_s=0.8e-6, node_pp_s=3e-6, token_tg_s=70e-6, ubatch_pp_s=1.3e-3,
                      device="CUDA0", matvec_s_per_byte={"q8_0": 4e-13}, matmul_s_per_byte={"q8_0": 4e-13},
                      matmul_s_per_flop={"q8_0": 6e-15}, attn_tg_s={f16: 7e-13}, attn_pp_s={f16: 3e-14})
    truth = {"tg": 1.1e-6, "pp": 7e-6, "vocab": 0.3e-9}
    plan = P.body_plan(["e576f1536h9kv3d64l4"], 8, True)
    headers(plan)
    from edgekv.core.arch import shape_from_metadata
    from edgekv.core.speed import attn_units_tg, speed_shape
    from edgekv.sources.gguf_header import read_header_file

    h = read_header_file(plan[0].model_path)
    sh = speed_shape(shape_from_metadata(h.metadata, plan[0].model_path, h.value_types), list(h.tensors), [], False,
                     {"ops_tg": 130, "ops_pp": 130})
    w = sum(g.bytes for g in sh.groups)
    # the prompt's last-layer feed-forward is a mat-vec (its last token only), like the output head
    tail = sum(g.tail_bytes for g in sh.groups if not g.output)
    assert tail > 0
    o = sum(g.bytes for g in sh.groups if g.output) + tail
    params = sum(g.params - g.tail_params for g in sh.groups if not g.output)
    units = sum(x.n_head * (x.head_k + x.head_v) for x in sh.attn)
    t_tg = 70e-6 + 256 * truth["vocab"] + w * 4e-13 + attn_units_tg(sh, 16, 8, False) * 7e-13 + 130 * truth["tg"]
    t_pp = 1.3e-3 + (w - o) * 4e-13 + 2 * params * 512 * 6e-15 + o * 4e-13 + units * 512 * 256 * 3e-14 + 130 * truth["pp"]
    g = {"ops_tg": 130, "ops_pp": 130}
    res = [ProbeResult(model=plan[0].key, context="f16", step="tg", ns=[int(t_tg * P.TG_N * 1e9)] * 5, graph=g),
           ProbeResult(model=plan[0].key, context="f16", step="pp", ns=[int(t_pp * 1e9)] * 9, graph=g)]
    cal.vocab_tg_s = truth["vocab"]
    V.solve_bodies(res, plan, cal)
    assert cal.node_tg_body_s["e576f1536h9kv3d64l4"] == pytest.approx(truth["tg"], rel=1e-3)
    assert cal.node_pp_body_s["e576f1536h9kv3d64l4"] == pytest.approx(truth["pp"], rel=1e-3)
    # the logit: the wide-vocabulary model less nodes_a and its larger output matrix
    ga, gv = {"ops_tg": 78, "ops_pp": 78}, {"ops_tg": 78, "ops_pp": 78}
    out_bytes = 64 * (262144 - 256) * 34 / 32
    t_a = 150e-6
    t_v = t_a + out_bytes * 4e-13 + (262144 - 256) * truth["vocab"]
    base = [ProbeResult(model="nodes_a", context="f16", step="tg", ns=[int(t_a * 32 * 1e9)] * 5, graph=ga),
            ProbeResult(model="nodes_v", context="f16", step="tg", ns=[int(t_v * 32 * 1e9)] * 5, graph=gv)]
    assert V.solve_vocab(base, cal) == pytest.approx(truth["vocab"], rel=1e-3)
    # a GPU prediction: nodes at the model's widths, the logits, and the body it lacks named
    model = replace(smol_sh, body="e576f1536h9kv3d64l4", n_vocab=49152)
    gcal = _cal(device="CUDA0", token_tg_s=70e-6, vocab_tg_s=truth["vocab"], node_tg_body_s=dict(cal.node_tg_body_s),
                node_pp_body_s=dict(cal.node_pp_body_s))
    tg = predict_tg(model, gcal, 512, 32, "f16", "f16", "auto")
    fixed = next(p for p in tg.parts if p.name == "fixed")
    assert fixed.s_per_token == pytest.approx(model.nodes_tg * truth["tg"] + 70e-6 + 49152 * truth["vocab"])
    assert "at this model's widths" in fixed.source and "49152 logits" in fixed.source
    with pytest.raises(MissingCalibration, match="model widths e576f1536h9kv3d64l30"):
        predict_tg(replace(model, body="e576f1536h9kv3d64l30"), gcal, 512, 32, "f16", "f16", "auto")
    with pytest.raises(MissingCalibration, match="model widths of this architecture"):
        predict_tg(replace(model, body=""), gcal, 512, 32, "f16", "f16", "auto")


def test_a_geometry_carries_the_hidden_size_its_calibration_model_is_built_with(gemma3_header):
    """llama.cpp's per-row attention costs more per cell under a wider hidden size at the same heads
    (bench/attn_widths.py), so the calibration model has the model's own: named in the geometry where it is not
    n_head x head_k (Gemma 3 270M: 4 x 256 heads over 640), bounded, and validated before a file is named after it."""
    from edgekv.core.speed import GEOMETRY_MAX_EMBD, AttnLayer

    m = load_model(str(gemma3_header))
    sh = speed_shape(m.shape, m.header.tensors, ["avx2"])
    assert {a.geometry for a in sh.attn} == {"h4kv1k256v256e640"}
    assert P.geometry_shape("h4kv1k256v256e640")["n_embd"] == 640
    assert AttnLayer(32, 128, 128, None, 8, 4096).geometry == "h32kv8k128v128"       # Qwen3 8B: 32 x 128 = 4096
    assert P.geometry_shape("h32kv8k128v128")["n_embd"] == 4096                        # its own, no longer 1024
    # bounded: a model wider than GEOMETRY_MAX_EMBD is calibrated at that width (the width does not move the cost per
    # cell), so a 32 x 128 model 12288 wide shares the 8B's geometry; Qwen2.5 72B's 64 x 128 heads over 8192 are
    # named for the width their calibration model has
    assert GEOMETRY_MAX_EMBD == 4096
    assert AttnLayer(32, 128, 128, None, 8, 12288).geometry == "h32kv8k128v128"
    assert AttnLayer(64, 128, 128, None, 8, 8192).geometry == "h64kv8k128v128e4096"
    assert P.geometry_shape("h64kv8k128v128")["n_embd"] == GEOMETRY_MAX_EMBD
    assert P.geometry_shape("h64kv8k128v128e4096") == P.geometry_shape("h64kv8k128v128")
    assert AttnLayer(9, 64, 64, None, 3, 0).geometry == "h9kv3k64v64"                    # unknown: the heads' width
    for bad in ("h4kv1k256v256e650", "h4kv1k256v256e0", f"h4kv1k256v256e{2 * GEOMETRY_MAX_EMBD}", "h4kv1k256v256e../x"):
        with pytest.raises(S.CalibrationError):
            P.geometry_shape(bad)


PARTIAL_CHILD = """
import json, os, sys
os.environ["EDGEKV_HOME"] = sys.argv[1]
from edgekv.calibration.speedcal import CalibrationError, cached, calibrate
repack = sys.argv[2] == "1"
out = {}
try:
    calibrate(2, repack, ["q4_1"], [("f16", "f16", "auto")], [], allow_busy=True)
except CalibrationError as e:
    out["error"] = str(e)
c = cached(2, repack)
out["cached"] = __import__("msgspec").to_builtins(c) if c else None
try:
    calibrate(2, repack, ["q4_1"], [("f16", "f16", "auto")], [], allow_busy=True, measure=False)
except CalibrationError as e:
    out["missing"] = str(e)
out["left"] = sorted(str(p) for p in __import__("pathlib").Path(sys.argv[1]).rglob("*.gguf"))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_calibration_that_runs_out_of_disk_keeps_what_it_measured(tmp_path):
    """A real calibration whose home is a 200 MiB tmpfs (mounted in a mount namespace of its own, unshare -m): its
    graph nodes and attention models fit, the first 380 MB streaming weight model does not.  The error is one line
    naming the folder, and what was measured before is cached, so that the next run (here: measuring off) asks for
    the weight type alone; no model is left on the disk."""
    from tests.smalldisk import run_on_small_disk

    home = tmp_path / "small"
    r = run_on_small_disk(home, "200m", PARTIAL_CHILD, "1" if _repack() else "0")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    err = out["error"]
    assert "\n" not in err and f"no space left on the disk of {home}/calibration/speed" in err
    assert err.endswith("is cached: the next run measures q4_1 alone"), err
    c = out["cached"]
    assert c is not None and c["node_tg_s"] > 0 and c["bandwidth_bytes_s"] > 0
    assert c["attn_tg_s"].get("f16/f16/fa=auto", 0) > 0 and "q4_1" not in c["matvec_s_per_byte"]
    assert "q4_1" in out["missing"] and "this machine" not in out["missing"]
    assert out["left"] == []
