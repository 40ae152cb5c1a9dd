"""The statistics kernels on synthetic logits, against direct scipy formulas and llama.cpp's own sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import log_softmax

from edgekv.core import klstats as K


@pytest.fixture(scope="module")
def logits():
    rng = np.random.default_rng(7)
    r, v = 200, 3000
    zb = (rng.standard_normal((r, v)) * 3).astype(np.float32)
    zb[:, 5] += 12                                                # a confident top token, as real models have
    zq = (zb + rng.standard_normal((r, v)).astype(np.float32) * 0.2).astype(np.float32)
    t = rng.integers(0, v, r)
    return zb, zq, t


def test_kld_nll_and_top_against_scipy(logits):
    zb, zq, t = logits
    rows = np.arange(len(t))
    b = K.base_rows(zb, t)
    c = K.candidate_rows(b, zq, t)
    lb, lq = log_softmax(zb.astype(np.float64), axis=1), log_softmax(zq.astype(np.float64), axis=1)
    np.testing.assert_allclose(c["kld"], (np.exp(lb) * (lb - lq)).sum(axis=1), rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(c["nll"], -lq[rows, t], rtol=1e-12)
    np.testing.assert_allclose(b.nll, -lb[rows, t], rtol=1e-12)
    np.testing.assert_allclose(c["dp"], np.exp(lq[rows, t]) - np.exp(lb[rows, t]), atol=1e-15)
    assert (c["same"] == (zb.argmax(1) == zq.argmax(1))).all()


def test_identical_logits_give_exactly_zero(logits):
    zb, _, t = logits
    c = K.candidate_rows(K.base_rows(zb, t), zb.copy(), t)
    assert (c["kld"] == 0).all() and (c["dp"] == 0).all() and c["same"].all()


def test_llama_uint16_emulation_is_within_its_quantisation(logits):
    zb, zq, t = logits
    exact = K.candidate_rows(K.base_rows(zb, t), zq, t)
    em = K.llama_uint16_rows(zb, zq, t)
    # the base log-probs are stored with a step of (max - max(min, max-16)) / 65535 <= 16/65535
    step = 16 / 65535
    lb = log_softmax(zb.astype(np.float64), axis=1)[np.arange(len(t)), t]
    inside = zb[np.arange(len(t)), t] > zb.max(axis=1) - 16       # below that, llama clamps the stored value
    assert 0 < inside.sum() < len(t)
    assert np.abs(em["nll_base"] + lb)[inside].max() <= step / 2 + 1e-5
    assert (em["nll_base"][~inside] < -lb[~inside]).all()
    np.testing.assert_allclose(em["nll"], exact["nll"], atol=2e-5)
    assert np.abs(em["kld"] - exact["kld"]).max() < 4 * step


def test_summary_matches_llama_sums(logits):
    """summarize() in float64 two-pass form equals llama's running sums (nll2/N - mean², covariances)."""
    zb, zq, t = logits
    acc = K.Accumulator(1, n_threads=2)
    acc.add(zb[:120], [zq[:120]], t[:120])
    acc.add(zb[120:], [zq[120:]], t[120:])
    acc.close()
    s = acc.summary(0)
    b = K.base_rows(zb, t)
    c = K.candidate_rows(b, zq, t)
    n = len(t)

    def mu(x):
        f = x.sum() / n
        return f, math.sqrt((np.sum(x * x) / n - f * f) / (n - 1))

    m, e = mu(c["nll"])
    assert s["ppl"] == pytest.approx(math.exp(m), rel=1e-12) and s["ppl_err"] == pytest.approx(math.exp(m) * e, rel=1e-9)
    mb, eb = mu(b.nll)
    cov = (np.sum(c["nll"] * b.nll) / n - m * mb) / (n - 1)
    assert s["ln_ppl_ratio"] == pytest.approx(m - mb, rel=1e-9)
    assert s["ln_ppl_ratio_err"] == pytest.approx(math.sqrt(e * e + eb * eb - 2 * cov), rel=1e-6)
    km, ke = mu(c["kld"])
    assert s["kld_mean"] == pytest.approx(km, rel=1e-12) and s["kld_mean_err"] == pytest.approx(ke, rel=1e-6)
    ks = np.sort(c["kld"])
    assert s["kld_median"] == pytest.approx(0.5 * (ks[n // 2] + ks[n // 2 - 1]))
    assert s["kld_p99"] == pytest.approx(np.percentile(ks, 99))
    assert s["kld_max"] == ks[-1]
    f = np.count_nonzero(c["same"]) / n
    assert s["same_top_rate"] == f and s["same_top_rate_err"] == pytest.approx(math.sqrt(f * (1 - f) / (n - 1)))
    d2, d2e = mu(c["dp"] ** 2)
    assert s["delta_p_rms"] == pytest.approx(math.sqrt(d2)) and s["delta_p_rms_err"] == pytest.approx(0.5 / math.sqrt(d2) * d2e)


def test_percentile_is_llamas_interpolation():
    x = np.array([0.0, 1.0, 2.0, 10.0])
    assert K.percentile(x, 0.5) == 1.5 and K.percentile(x, 0.999) == pytest.approx(2 + 8 * 0.997)
    assert K.percentile(x, 0) == 0 and K.percentile(x, 1) == 10


def test_percentile_position_is_computed_in_float32_like_llama():
    """0.999f * 4079 in float32 is 4074.9216..., not 4074.921: on sorted values 0..N-1 the percentile
    is the position itself, so the float32 arithmetic is visible (llama prints 6 decimals)."""
    x = np.arange(4080, dtype=np.float64)
    pos32 = np.float32(0.999) * np.float32(4079)
    assert K.percentile(x, 0.999) == pytest.approx(float(pos32), abs=1e-9)
    assert abs(K.percentile(x, 0.999) - 0.999 * 4079) > 1e-5
