"""The streaming GGUF header reader: real files, header-only files, bad input, fuzzing."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekv.errors import EdgekvError, GGUFFormatError, GGUFTruncatedError, ModelNotFound
from edgekv.sources.gguf_header import ArraySummary, read_header, read_header_file


def _header_only_copy(src, dst, n_bytes):
    with open(src, "rb") as f:
        data = f.read(n_bytes)
    with open(dst, "wb") as f:
        f.write(data)
    return dst


def test_real_model_header_matches_gguf_package(smollm2_path):
    h = read_header_file(smollm2_path)
    # cross-check against the gguf package's own (mmap, whole-file) reader
    ref = gguf.GGUFReader(str(smollm2_path))
    assert len(h.tensors) == len(ref.tensors)
    for mine, theirs in zip(h.tensors, ref.tensors):
        assert mine.name == theirs.name
        assert mine.shape == tuple(int(x) for x in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert mine.n_bytes == int(theirs.n_bytes)
        assert h.data_offset + mine.offset == int(theirs.data_offset)
    assert h.file_size == os.path.getsize(smollm2_path)
    assert h.metadata["general.architecture"] == "llama"
    assert h.metadata["llama.block_count"] == 30
    toks = h.metadata["tokenizer.ggml.tokens"]
    assert isinstance(toks, ArraySummary) and len(toks) == 49152
    assert h.value_types["llama.block_count"] == "uint32"


def test_header_only_file_reads_the_same(sparse_models, tmp_path):
    smollm2_path = sparse_models["smollm2"]       # the committed header at the real file's size
    full = read_header_file(smollm2_path)
    cut = read_header_file(_header_only_copy(smollm2_path, tmp_path / "h.gguf", full.header_bytes))
    assert cut.metadata.keys() == full.metadata.keys()
    assert cut.tensors == full.tensors
    assert cut.file_size == full.file_size == os.path.getsize(smollm2_path)
    assert cut.extra["available_bytes"] == full.header_bytes


def test_stream_without_size(smollm2_header):
    full = read_header_file(smollm2_header)
    with open(smollm2_header, "rb") as f:
        data = f.read(full.header_bytes)

    class Trickle(io.RawIOBase):
        """Hands out at most 777 bytes per read, like a slow network stream."""

        def __init__(self, b):
            self.b, self.pos = b, 0

        def read(self, n=-1):
            n = 777 if n < 0 else min(n, 777)
            out = self.b[self.pos:self.pos + n]
            self.pos += len(out)
            return out

    h = read_header(Trickle(data), name="trickle")
    assert h.tensors == full.tensors


def test_cut_inside_header_says_where(smollm2_header, tmp_path):
    full = read_header_file(smollm2_header)
    p = _header_only_copy(smollm2_header, tmp_path / "cut.gguf", full.header_bytes - 10)
    with pytest.raises(GGUFTruncatedError) as ei:
        read_header_file(p)
    assert str(p) in str(ei.value) and "cut short" in str(ei.value)
    assert ei.value.needed > full.header_bytes - 10


def _gguf_bytes(tmp_path, **kv) -> bytes:
    path = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_head_count(2)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    w.add_array("some.floats", [0.5, 1.5])
    for k, v in kv.items():
        w.add_uint32(k, v)
    w.add_tensor("token_embd.weight", np.zeros((40, 64), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.zeros((64,), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_small_written_file_parses(tmp_path):
    data = _gguf_bytes(tmp_path)
    h = read_header(io.BytesIO(data), "mem", size_hint=len(data))
    assert [t.name for t in h.tensors] == ["token_embd.weight", "output_norm.weight"]
    assert h.tensors[0].shape == (64, 40) and h.tensors[0].n_bytes == 64 * 40 * 4
    assert h.file_size == len(data)
    assert h.metadata["tokenizer.ggml.tokens"][:2] == ["t0", "t1"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"GGUX" + d[4:], "not a GGUF file"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "version 1"),
    (lambda d: d[:4] + struct.pack("<I", 7) + d[8:], "unsupported GGUF version 7"),
    (lambda d: d[:4] + struct.pack(">I", 3) + d[8:], "big-endian"),
    (lambda d: d[:8] + struct.pack("<Q", 1 << 40) + d[16:], "absurd tensor count"),
    (lambda d: d[:16] + struct.pack("<Q", 1 << 40) + d[24:], "absurd metadata count"),
    (lambda d: d[:24] + struct.pack("<Q", 1 << 50) + d[32:], "absurd string length"),
    (lambda d: d[:2], "not a GGUF file"),
])
def test_bad_headers_give_one_clear_error(tmp_path, mutate, message):
    data = mutate(_gguf_bytes(tmp_path))
    with pytest.raises(GGUFFormatError) as ei:
        read_header(io.BytesIO(data), "bad.gguf", size_hint=len(data))
    assert message in str(ei.value) and "bad.gguf" in str(ei.value)
    assert "\n" not in str(ei.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelNotFound, match="no such file"):
        read_header_file(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFound, match="directory"):
        read_header_file(tmp_path)


# -- property-based: mutated and truncated headers --------------------------------------------------------------
# The seed is SmolLM2's committed header (tests/headers.py: every key, the whole tensor table) with a tokenizer of
# 2,048 tokens put back (strings, int32 and float32 arrays, merges): every value type the real header holds, in
# 120 kB instead of its 1.6 MB, so the fuzzing belongs to the fast tier.

_SEED_CACHE: dict[str, bytes] = {}


def _seed(n_vocab: int = 2048) -> bytes:
    if "s" not in _SEED_CACHE:
        import tempfile
        from pathlib import Path

        from tests.headers import SMOLLM2, rewrite_header, sparse_model

        with tempfile.TemporaryDirectory() as d:
            r = gguf.GGUFReader(sparse_model(SMOLLM2, Path(d) / "smollm2.gguf"))    # gguf-py maps the tensor data
            out = os.path.join(d, "seed.gguf")
            def tokenizer(w) -> None:
                w.add_token_list([f"tok{i}" for i in range(n_vocab)])
                w.add_token_types([1] * n_vocab)
                w.add_token_scores([float(-i) for i in range(n_vocab)])
                w.add_token_merges([f"t o{i}" for i in range(n_vocab // 2)])

            rewrite_header(r, out, tokenizer)
            h = read_header_file(out)
            assert len(h.metadata["tokenizer.ggml.tokens"]) == n_vocab and len(h.tensors) == len(r.tensors)
            with open(out, "rb") as f:
                _SEED_CACHE["s"] = f.read(h.header_bytes)
    return _SEED_CACHE["s"]


MEMORY_BOUND = 48 * 1024 * 1024


def _parse_bounded(data: bytes, size_hint):
    tracemalloc.start()
    try:
        try:
            read_header(io.BytesIO(data), "fuzz.gguf", size_hint=size_hint)
        except EdgekvError:
            pass   # any edgekv error is fine; anything else propagates and fails the test
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"parser used {peak} bytes"


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_headers(data):
    seed = bytearray(_seed())
    # mutations concentrate on the first 64 KiB (counts, keys, value types live there) and on random spots
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        kind = data.draw(st.sampled_from(["byte", "u64", "truncate"]))
        hi = len(seed) - 9 if data.draw(st.booleans()) else min(len(seed) - 9, 65536)
        pos = data.draw(st.integers(0, max(0, hi)))
        if kind == "byte":
            seed[pos] = data.draw(st.integers(0, 255))
        elif kind == "u64":
            val = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**40, 2**63, 2**64 - 1]))
            seed[pos:pos + 8] = struct.pack("<Q", val)
        else:
            del seed[pos:]
            if not seed:
                break
    hint = len(seed) if data.draw(st.booleans()) else None
    _parse_bounded(bytes(seed), hint)


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 400_000))
def test_fuzz_truncation_points(cut):
    seed = _seed()
    cut = min(cut, len(seed) - 1)
    with pytest.raises(GGUFFormatError):
        read_header(io.BytesIO(seed[:cut]), "cut.gguf", size_hint=cut)
