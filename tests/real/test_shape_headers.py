"""The committed headers of the two real models (tests/headers.py) are theirs: edgekv reads the same model from
either (every metadata key but the tokenizer's arrays, the tensor table, the shape, the weights), and SmolLM2's,
rewritten from the real file, equals the committed one byte for byte (Gemma 3's takes gguf-py 40 s to read its
262K-token arrays; the reading check covers it).  The fast tests that take `smollm2_header` or `gemma3_header`
stand on this."""

from __future__ import annotations

import pytest

from edgekv.prediction.api import load_model
from tests.headers import GEMMA3, SMOLLM2, TOKENIZER_ARRAYS, write_header


@pytest.fixture(params=["smollm2", "gemma3"])
def pair(request, smollm2_path, gemma3_path):
    return {"smollm2": (smollm2_path, SMOLLM2), "gemma3": (gemma3_path, GEMMA3)}[request.param]


def test_edgekv_reads_the_same_model_from_either(pair):
    real, committed = pair
    a, b = load_model(str(real)), load_model(str(committed))
    arch = a.shape.arch
    kept = {k: v for k, v in a.header.metadata.items() if k not in TOKENIZER_ARRAYS}
    assert {k: v for k, v in b.header.metadata.items() if k != f"{arch}.vocab_size" or k in kept} == kept
    assert a.shape == b.shape and a.shape.n_vocab > 0
    assert list(a.header.tensors) == list(b.header.tensors)
    assert a.header.weights_bytes == b.header.weights_bytes and a.header.weights_by_type() == b.header.weights_by_type()
    assert a.incomplete is None and b.incomplete            # the header alone is named as such


def test_the_committed_header_is_rewritten_byte_for_byte(smollm2_path, tmp_path):
    fresh = write_header(smollm2_path, tmp_path / SMOLLM2.name)
    assert fresh.read_bytes() == SMOLLM2.read_bytes(), "rewrite the headers: python -m tests.headers"
