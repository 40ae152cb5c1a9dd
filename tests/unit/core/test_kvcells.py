"""edgekv.core.kvcells: a sliding-window cache's ring, placed as llama.cpp places it, checked against llama.cpp's own
map of the cells (its LLAMA_KV_CACHE_DEBUG=2 dump, Gemma 3 270M: 15 of its 18 layers slide over 512 tokens), and
what a decoded token's threads then read there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgekv.core.kvcells import _Ring, swa_decode_cells
from edgekv.core.speed import AttnLayer, SpeedShape, SwaRing, attn_units_tg, decode_cells, ubatches

# a child that fills Gemma 3's cache with a prompt in ubatches, decodes a few tokens, then one more: llama.cpp dumps
# the sliding-window cache's positions cell by cell (llama_kv_cache::find_slot, debug 2) before placing each ubatch,
# so the last dump is the cache after the prompt and the first decoded tokens
CHILD = r"""
import ctypes, json, os, random, sys
os.environ["LLAMA_KV_CACHE_DEBUG"] = "2"
import llama_cpp as L
from edgekv.child.tokens import TokenRunner as _Runner
from edgekv.core.predict import ContextParams
from edgekv.runtime.engine import LogCapture, context_params, model_params

path, cases, repack = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
cap = LogCapture()
cap.install()
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), model_params(0, dry=False, use_extra_bufts=repack))
n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
out = []
for depth, ub, n_gen, restore in cases:
    p = context_params(ContextParams(n_ctx=4096, n_batch=2048, n_ubatch=ub, swa_full=False), n_threads=2)
    ctx = L.llama_init_from_model(model, p)
    r = _Runner(L, ctx, int(L.llama_n_batch(ctx)), n_vocab, False, 0, random.Random(1))
    r.run_prompt(r.prompt_chunks(depth))
    if restore:         # as llama-bench and edgekv bench bring the cache back to its depth before each timed run
        n = L.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * n)()
        assert L.llama_state_seq_get_data(ctx, buf, n, 0) == n
        L.llama_memory_clear(L.llama_get_memory(ctx), False)
        assert L.llama_state_seq_set_data(ctx, buf, n, 0) == n
    cap.take()
    r.run_gen(r.gen_tokens(n_gen + 1), depth)
    out.append([t for _, t in cap.take()])
    r.close()
    L.llama_free(ctx)
print(json.dumps(out))
"""


def _last_position_map(lines: list[str]) -> list[int]:
    """The last cell-by-cell position dump in llama.cpp's log: 64 cells a line, each its position or '.', a '*'
    after every 256th."""
    maps: list[list[int]] = []
    cur: list[int] | None = None
    for ln in lines:
        toks = [t for t in ln.split() if t != "*"]
        is_pos_line = bool(toks) and all(t == "." or t.isdigit() for t in toks) and len(toks) == 64
        if is_pos_line:
            if cur is None:
                cur = []
                maps.append(cur)
            cur += [-1 if t == "." else int(t) for t in toks]
        else:
            cur = None
    assert maps, "llama.cpp printed no cell map (LLAMA_KV_CACHE_DEBUG=2)"
    return maps[-1]


def test_ring_after_a_wrapped_fill():
    r = _Ring(1024, 512)
    for i, n in enumerate((512, 512, 512, 512)):
        r.place(512 * i, n)
    # the third ubatch reuses cells 0..511 (their positions left the window), the fourth 512..1023
    assert r.pos == list(range(1024, 2048))
    r.place(2048, 1)
    assert r.pos[0] == 2048 and r.pos[1:] == list(range(1025, 2048)) and r.view() == 1024
    # the window of a query at 2048 holds 1537..2048: cell 0 and cells 513..1023, nearly all in the second half
    assert r.read(2048, 2, True) == 2 * 511 and r.read(2048, 2, False) == 512
    # without flash attention every cell of the view is computed, masked or not
    assert r.read(2048, 2, True, dense=True) == r.read(2048, 2, False, dense=True) == 1024


def test_decode_cells_of_a_sliding_layer():
    # depth 512 (one ubatch, no wrap): the view is 768 cells; the first thread's 384 hold 368 inside the window
    # (the mean over 32 tokens), the second 129 .. 160
    assert swa_decode_cells(1024, 512, (512,), 32, 2, True) == pytest.approx(735.0)
    # depth 2048 decoded straight after the prompt: the window's cells sit in the second half of the ring
    assert swa_decode_cells(1024, 512, (512,) * 4, 32, 2, True, restored=False) == pytest.approx(991.0)
    # saved and loaded back (llama-bench's tg at depth): the window's 511 cells are packed from cell 0, as at 512
    assert swa_decode_cells(1024, 512, (512,) * 4, 32, 2, True) == pytest.approx(735.0)
    # one query head per task reads every cell inside the window: 512, at any depth past it
    assert swa_decode_cells(1024, 512, (512,) * 4, 32, 2, False) == 512.0
    # a shallow cache (under one window) reads what decode_cells counts
    assert swa_decode_cells(1024, 512, (128,), 32, 2, True) == pytest.approx(
        sum(min(129 + j, 256) for j in range(32)) / 32)


def test_attn_units_count_the_ring_for_standard_windows_only():
    lay_swa, lay_full = AttnLayer(4, 256, 256, 512, 1), AttnLayer(4, 256, 256, None, 1)
    sh = SpeedShape((), (lay_swa, lay_full), 100, 100, swa_type="standard")
    ring = SwaRing(1024, tuple(ubatches(2048, 2048, 512)), 32)
    with_ring = attn_units_tg(sh, 2064, 2, True, ring=ring)
    without = attn_units_tg(sh, 2064, 2, True)
    full = 4 * 512 * decode_cells(2064, 4, 2, True)
    assert without == pytest.approx(full + 4 * 512 * 512)
    assert with_ring == pytest.approx(full + 4 * 512 * 735)
    chunked = SpeedShape((), (lay_swa, lay_full), 100, 100, swa_type="chunked")
    assert attn_units_tg(chunked, 2064, 2, True, ring=ring) == pytest.approx(without)


@pytest.mark.slow
def test_the_ring_is_llama_cpps(gemma3_path: Path):
    """The positions of every cell of Gemma 3's sliding-window cache after prompts that wrap the ring (ubatches of 512
    and of 256 tokens: 1024 and 768 cells) and a few decoded tokens are llama.cpp's own."""
    from edgekv.calibration.preflight import preflight

    cases = [(1600, 512, 3, False), (1600, 512, 3, True), (2048, 512, 2, True), (1000, 256, 5, False),
             (1000, 256, 5, True)]
    # the extra-buffer preflight's setting: off where llama.cpp's AMX kernels crash on a prompt batch (issue 25)
    repack = "1" if preflight().repack else "0"
    r = subprocess.run([sys.executable, "-c", CHILD, str(gemma3_path), json.dumps(cases), repack], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    logs = json.loads(r.stdout.strip().splitlines()[-1])
    for (depth, ub, n_gen, restore), lines in zip(cases, logs):
        size = 512 + ub          # size_swa: the window plus a ubatch, padded to 256
        ring = _Ring(size, 512)
        p = 0
        for n in ubatches(depth, 2048, ub):
            ring.place(p, n)
            p += n
        if restore:
            ring.restore()
        for j in range(n_gen):
            ring.place(depth + j, 1)
        got = _last_position_map(lines)
        assert len(got) == size, (depth, ub, len(got))
        assert got == ring.pos, (depth, ub, restore, [(i, a, b) for i, (a, b) in enumerate(zip(got, ring.pos)) if a != b][:8])
