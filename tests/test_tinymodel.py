"""The speed calibration's models hold values like a trained model's (edgekv.edges.tinymodel.fill_values): block
scales spread over two octaves, random quants, log-normal norm gains, weights centred and of the RMS the hidden
size asks for (weight_rms); and llama.cpp computes finite logits on them for every weight type the calibration
writes."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from edgekv.edges.tinymodel import NORM_GAIN_SIGMA, SCALE_SPREAD_OCTAVES, _scale_fields, weight_rms, write_llama

SHAPE = {"n_embd": 256, "n_ff": 512, "n_layer": 2, "n_head": 4, "n_head_kv": 2}
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")


def _matrices(path):
    return [t for t in GGUFReader(path).tensors if t.name.endswith("_q.weight") or t.name.endswith("down.weight")
            or t.name == "output.weight"]


@pytest.mark.parametrize("mat_type", TYPES)
def test_values_like_a_trained_model_s(tmp_path, mat_type):
    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type=mat_type, values=True)
    mats = _matrices(p)
    assert len(mats) == 5
    for t in mats:
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        w = dequantize(raw, t.tensor_type).reshape(-1).astype(np.float64)
        assert np.isfinite(w).all() and np.count_nonzero(w) > 0.8 * w.size, t.name
        # every type at one size, centred (a trained model's tensors average about 0; Q4_0's quants -8..7 leave
        # -0.1 x the RMS): the attention's scores, and so its cost per cell, do not depend on the weight type or
        # the hidden size (tinymodel's comment)
        rms = float(np.sqrt(np.mean(w ** 2)))
        assert abs(rms / weight_rms(SHAPE["n_embd"]) - 1) < 0.1 and abs(w.mean()) < 0.15 * rms, (t.name, rms, w.mean())
        fields, _ = _scale_fields(t.tensor_type.name, len(raw) // (w.size // _block(t.tensor_type)))
        blocks = raw.reshape(-1, len(raw) // (w.size // _block(t.tensor_type)))
        for off in fields:
            d = np.abs(blocks[:, off:off + 2].copy().view(np.float16).reshape(-1).astype(np.float64))
            lg = np.log2(d)
            # the block scales spread evenly over two octaves (a trained model's tensors: a log2 std of 0.26-1.12
            # in SmolLM2 and Gemma 3 270M)
            assert lg.max() - lg.min() <= 2 * SCALE_SPREAD_OCTAVES + 0.02
            assert 0.45 < lg.std() < 0.7 and len(np.unique(d)) > 200
    norms = [t for t in GGUFReader(p).tensors if "norm" in t.name]
    g = np.concatenate([np.asarray(t.data, dtype=np.float64).reshape(-1) for t in norms])
    assert (g > 0).all() and abs(np.log(g).std() - NORM_GAIN_SIGMA) < 0.1


def _block(qt) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qt][0]


def test_without_values_the_model_is_a_hole_of_zeros(tmp_path):
    p = tmp_path / "z.gguf"
    size = write_llama(p, **SHAPE, mat_type="Q4_1")
    assert p.stat().st_size == size and p.stat().st_blocks * 512 < size / 4     # sparse: the data was never written
    for t in _matrices(p):
        assert not np.asarray(t.data).any()
    v = tmp_path / "v.gguf"
    assert write_llama(v, **SHAPE, mat_type="Q4_1", values=True) == size
    assert v.stat().st_blocks * 512 >= size                                      # every byte written


@pytest.mark.parametrize("mat_type", ("Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL"))
def test_llama_cpp_computes_finite_logits_on_the_values(tmp_path, mat_type):
    """A real run: llama.cpp loads the model (repacked or not, as the preflight says) and every logit of a few
    decoded tokens is finite, and they differ (the values flow through every layer)."""
    import llama_cpp

    from tests.llamaparams import preflight_model_params

    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type=mat_type, values=True)
    with preflight_model_params():
        llm = llama_cpp.Llama(model_path=str(p), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    try:
        llm.eval([1, 7, 42, 200])
        logits = np.array(llm.scores[:4], dtype=np.float64)
    finally:
        llm.close()
    assert np.isfinite(logits).all()
    assert logits.std() > 0 and not np.allclose(logits[0], logits[3])


def test_mxfp4_blocks_get_a_sane_e8m0_exponent(tmp_path):
    """MXFP4 has no fp16 scale: its one-byte e8m0 exponent is set (three neighbouring powers of two, shifted as a
    whole toward weight_rms: within a factor sqrt(2) of it), the rest random."""
    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type="MXFP4", values=True)
    for t in _matrices(p):
        assert t.tensor_type == GGMLQuantizationType.MXFP4
        blocks = np.asarray(t.data).view(np.uint8).reshape(-1, 17)
        e = np.unique(blocks[:, 0]).astype(int)
        assert len(e) == 3 and e.max() - e.min() == 2 and 100 < e.min() < 140
        w = dequantize(blocks.reshape(-1), t.tensor_type)
        assert np.isfinite(w).all() and np.count_nonzero(w) > 0.8 * w.size
        assert 0.7 < np.sqrt(np.mean(w.astype(np.float64) ** 2)) / weight_rms(SHAPE["n_embd"]) < 1.42
