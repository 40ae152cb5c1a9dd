"""Perplexity and KL-divergence statistics from raw logits, as llama-perplexity defines them.

Pure numpy; no llama.cpp.  The quality pass (:mod:`edgekv.child.quality_child`) feeds it one decode's
logits at a time for the baseline context and every candidate context, for the same tokens, and
it keeps only per-token scalars (NLL, KLD, Δp, same-top), never logits.  The summary at the end
follows ``tools/perplexity/perplexity.cpp`` (``perplexity()`` and ``kl_divergence()``) of the
llama.cpp tree vendored by llama-cpp-python 0.3.36:

* NLL of the next token: ``logsumexp(z) - z[target]``; PPL = exp(mean NLL), its error
  ``PPL * sqrt(var(NLL) / (N - 1))`` (population variance, as ``nll2/N - mean²`` is);
* KLD per token: ``Σ p_base · (ln p_base - ln p_q)`` over the whole vocabulary, mean with the same
  error formula, median and percentiles with linear interpolation at ``f·(N-1)`` (llama's
  ``percentile``), maximum;
* ``ln(PPL(Q)/PPL(base))`` with the error llama derives from both variances and their covariance
  (identical to ``sqrt(var(nll_q - nll_base) / (N - 1))``);
* same top token rate ``n_same / N`` with the binomial error ``sqrt(f(1-f)/(N-1))``;
* Δp = p_q(target) - p_base(target): mean with error, RMS with error ``0.5/RMS · err(Δp²)``.

Where edgekv differs from llama-perplexity, it is more exact, on purpose: llama stores the baseline
as 16-bit scaled log-probabilities (``--kl-divergence-base``) and skips tokens whose base
log-probability is ≤ -16; edgekv has the baseline's float32 logits in memory and computes the
softmax and the KLD over the whole vocabulary in float64.  :func:`llama_uint16_rows` reproduces
llama's 16-bit arithmetic exactly (float32, same rounding) for the agreement check in ``bench/``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

F64 = np.float64
F32 = np.float32
BLOCK_ELEMENTS = 1 << 21      # rows per block * n_vocab: bounds the float64 temporaries (~16 MiB each)
PERCENTILES = (90.0, 95.0, 99.0, 99.9)


# -- per-row kernels ------------------------------------------------------------------------------------

@dataclass
class BaseRows:
    """The baseline's quantities for a block of rows (tokens)."""

    z: np.ndarray        # (R, V) float32 logits (a view)
    p: np.ndarray        # (R, V) float64 probabilities
    lse: np.ndarray      # (R,) float64 log-sum-exp
    pz: np.ndarray       # (R,) float64 Σ p·z
    nll: np.ndarray      # (R,) float64
    top: np.ndarray      # (R,) int argmax (first on ties, as llama's strict '>')


def base_rows(z: np.ndarray, targets: np.ndarray) -> BaseRows:
    z64 = z.astype(F64)
    m = z64.max(axis=1)
    p = z64 - m[:, None]
    np.exp(p, out=p)
    s = p.sum(axis=1)
    p /= s[:, None]
    lse = m + np.log(s)
    rows = np.arange(z.shape[0])
    return BaseRows(z=z, p=p, lse=lse, pz=np.einsum("ij,ij->i", p, z64), nll=lse - z64[rows, targets],
                    top=z.argmax(axis=1))


def candidate_rows(base: BaseRows, zq: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """NLL, KLD(base‖q), Δp and same-top for one candidate's rows against the baseline's."""
    q64 = zq.astype(F64)
    pzq = np.einsum("ij,ij->i", base.p, q64)
    m = q64.max(axis=1)
    q64 -= m[:, None]
    np.exp(q64, out=q64)
    lse_q = m + np.log(q64.sum(axis=1))
    rows = np.arange(zq.shape[0])
    nll = lse_q - zq[rows, targets].astype(F64)
    psum = base.p.sum(axis=1)
    # KLD = Σ p (z_b - lse_b - z_q + lse_q) = Σ p·z_b - Σ p·z_q + (lse_q - lse_b)·Σ p
    kld = (base.pz - pzq) + (lse_q - base.lse) * psum
    return {
        "nll": nll,
        "kld": kld,
        "dp": np.exp(-nll) - np.exp(-base.nll),
        "same": zq.argmax(axis=1) == base.top,
    }


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """llama's nearest_int(): float32 round-half-to-even."""
    return np.rint(x).astype(np.int64)


def llama_uint16_rows(zb: np.ndarray, zq: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """llama-perplexity's arithmetic, float32 for float32: the baseline written as uint16 log-probs
    (``log_softmax(..., uint16_t * log_prob, ...)``) and read back by ``kl_divergence()``."""
    f = F32
    rows = np.arange(zb.shape[0])
    # -- writing the base file
    maxb = zb.max(axis=1)
    minb = np.maximum(zb.min(axis=1), maxb - f(16))
    se = np.exp(zb - maxb[:, None]).sum(axis=1, dtype=F64)
    lse_b = np.log(se).astype(f)
    min_log_prob = (minb - maxb) - lse_b
    scale = ((maxb - minb) / f(65535)).astype(f)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scale > 0, f(1) / np.where(scale > 0, scale, f(1)), f(0)).astype(f)
        q = np.where(zb > minb[:, None], _nearest_int(inv[:, None] * (zb - minb[:, None])), 0)
    q = (q & 0xFFFF).astype(f)
    lpb = scale[:, None] * q + min_log_prob[:, None]             # (R, V) float32
    # -- reading it back against the candidate
    maxq = zq.max(axis=1)
    imax = zq.argmax(axis=1)
    sq = np.exp(zq - maxq[:, None]).sum(axis=1, dtype=F64)
    lse_q = np.log(sq).astype(f)
    nll = (maxq + lse_q) - zq[rows, targets]
    nll_base = -(scale * q[rows, targets] + min_log_prob)
    maxq2 = maxq + lse_q
    keep = lpb > f(-16)
    term = np.exp(lpb) * ((lpb - zq) + maxq2[:, None])
    kld = np.where(keep, term, f(0)).sum(axis=1, dtype=F64)
    dp = np.exp(-nll) - np.exp(-nll_base)
    return {
        "nll": nll.astype(F64), "nll_base": nll_base.astype(F64), "kld": kld,
        "dp": dp.astype(F64), "same": imax == lpb.argmax(axis=1),
    }


# -- accumulation -----------------------------------------------------------------------------------

@dataclass
class _Series:
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, d: dict[str, np.ndarray]) -> None:
        for k, v in d.items():
            self.parts.setdefault(k, []).append(np.asarray(v))

    def get(self, k: str) -> np.ndarray:
        p = self.parts.get(k)
        return np.concatenate(p) if p else np.zeros(0)


class Accumulator:
    """Per-token scalars for a baseline and ``n_candidates`` candidates; logits are never kept.

    ``emulate_llama=True`` also computes llama-perplexity's 16-bit-baseline figures (for bench/).
    """

    def __init__(self, n_candidates: int, emulate_llama: bool = False, n_threads: int = 1):
        self.n = n_candidates
        self.emulate = emulate_llama
        self.base = _Series()
        self.cands = [_Series() for _ in range(n_candidates)]
        self.emul = [_Series() for _ in range(n_candidates)] if emulate_llama else []
        self.n_threads = max(1, int(n_threads))
        self._pool = ThreadPoolExecutor(self.n_threads) if self.n_threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _block(self, zb: np.ndarray, zqs: list[np.ndarray], t: np.ndarray):
        b = base_rows(zb, t)
        out = [candidate_rows(b, zq, t) for zq in zqs]
        em = [llama_uint16_rows(zb, zq, t) for zq in zqs] if self.emulate else []
        return b.nll, out, em

    def add(self, base_logits: np.ndarray, cand_logits: list[np.ndarray], targets: np.ndarray) -> None:
        """Rows of logits (R, V) float32 whose next tokens are ``targets`` (R,)."""
        assert len(cand_logits) == self.n
        n_rows, n_vocab = base_logits.shape
        step = max(1, BLOCK_ELEMENTS // max(1, n_vocab))
        spans = [(i, min(n_rows, i + step)) for i in range(0, n_rows, step)]
        args = [(base_logits[a:b], [z[a:b] for z in cand_logits], targets[a:b]) for a, b in spans]
        results = list(self._pool.map(lambda x: self._block(*x), args)) if self._pool else [self._block(*x) for x in args]
        for nll_b, out, em in results:
            self.base.add({"nll": nll_b})
            for s, d in zip(self.cands, out):
                s.add(d)
            for s, d in zip(self.emul, em):
                s.add(d)

    @property
    def count(self) -> int:
        return int(sum(len(x) for x in self.base.parts.get("nll", [])))

    def summary(self, i: int) -> dict[str, Any]:
        """The statistics of candidate ``i`` against the baseline."""
        c = self.cands[i]
        out = summarize(c.get("nll"), self.base.get("nll"), c.get("kld"), c.get("dp"), c.get("same"))
        if self.emulate:
            e = self.emul[i]
            out["llama_uint16"] = summarize(e.get("nll"), e.get("nll_base"), e.get("kld"), e.get("dp"), e.get("same"))
            diff = e.get("kld") - c.get("kld")
            out["llama_uint16"]["kld_abs_diff_mean"] = float(np.abs(diff).mean()) if diff.size else None
            out["llama_uint16"]["kld_abs_diff_max"] = float(np.abs(diff).max()) if diff.size else None
        return out


# -- summary statistics -----------------------------------------------------------------------------

def mean_and_error(x: np.ndarray) -> tuple[float, float]:
    """llama's mean_and_uncertainty(): the mean and sqrt(var/(N-1)), 0 when N <= 10."""
    n = x.size
    if n < 1:
        return math.nan, math.nan
    m = float(x.mean())
    var = float(((x - m) ** 2).mean())
    return m, (math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0)


def percentile(x_sorted: np.ndarray, fraction: float) -> float:
    """llama's percentile(): linear interpolation at fraction*(N-1) of the sorted values.

    The position is computed as llama-perplexity computes it, in float32 from a float32 fraction
    (``percentile(kld_values, 0.999f)``): 0.999f is 0.99900001..., which at a few thousand tokens moves
    the interpolation weight enough to show in the sixth decimal it prints.
    """
    if fraction <= 0:
        return float(x_sorted[0])
    if fraction >= 1:
        return float(x_sorted[-1])
    p = np.float32(fraction) * np.float32(x_sorted.size - 1)
    ip = int(p)
    w = float(np.float32(p - np.float32(ip)))
    return float((1 - w) * x_sorted[ip] + w * x_sorted[min(ip + 1, x_sorted.size - 1)])


def summarize(nll: np.ndarray, nll_base: np.ndarray, kld: np.ndarray, dp: np.ndarray, same: np.ndarray) -> dict[str, Any]:
    n = int(nll.size)
    if n == 0:
        return {"n_tokens_scored": 0}
    m_q, e_q = mean_and_error(nll)
    m_b, e_b = mean_and_error(nll_base)
    d = nll - nll_base
    m_d, e_d = mean_and_error(d)
    var_q, var_b = float(nll.var()), float(nll_base.var())
    cov = float(((nll - m_q) * (nll_base - m_b)).mean())
    kld_mean, kld_err = mean_and_error(kld)
    ks = np.sort(kld)
    dp_mean, dp_err = mean_and_error(dp)
    dp2_mean, dp2_err = mean_and_error(dp * dp)
    rms = math.sqrt(dp2_mean)
    same_rate = float(np.count_nonzero(same)) / n
    ppl, ppl_base = math.exp(m_q), math.exp(m_b)
    return {
        "n_tokens_scored": n,
        "ppl": ppl,
        "ppl_err": ppl * e_q,
        "base_ppl": ppl_base,
        "base_ppl_err": ppl_base * e_b,
        "ln_ppl_ratio": m_d,
        "ln_ppl_ratio_err": e_d,
        "ppl_ratio": math.exp(m_d),
        "ppl_ratio_err": math.exp(m_d) * e_d,
        "cor_ln_ppl": cov / math.sqrt(var_q * var_b) if var_q > 0 and var_b > 0 else None,
        "kld_mean": kld_mean,
        "kld_mean_err": kld_err,
        "kld_median": float(np.median(ks)),
        **{f"kld_p{_pct_name(p)}": percentile(ks, p / 100.0) for p in PERCENTILES},
        "kld_max": float(ks[-1]),
        "kld_min": float(ks[0]),
        "same_top_rate": same_rate,
        "same_top_rate_err": math.sqrt(same_rate * (1 - same_rate) / (n - 1)) if n > 1 else 0.0,
        "delta_p_mean": dp_mean,
        "delta_p_mean_err": dp_err,
        "delta_p_rms": rms,
        "delta_p_rms_err": 0.5 / rms * dp2_err if rms > 0 else 0.0,
        "delta_p_max_abs": float(np.abs(dp).max()),
    }


def _pct_name(p: float) -> str:
    return f"{p:g}".replace(".", "")     # 90 -> "90", 99.9 -> "999"


class PassSizes(msgspec.Struct, kw_only=True, frozen=True):
    """llama-perplexity's sizes for one context length (tools/perplexity/perplexity.cpp)."""

    n_seq: int
    n_ctx_total: int
    n_batch: int
    n_chunk: int
    num_batches: int
    first: int


def plan(n_tokens: int, n_ctx: int, n_batch: int, chunks: int | None) -> PassSizes:
    """llama-perplexity's sizes for one context length (tools/perplexity/perplexity.cpp)."""
    n_seq = max(1, n_batch // n_ctx)
    n_batch_eff = min(n_batch, n_seq * n_ctx)
    n_chunk_max = n_tokens // n_ctx
    n_chunk = n_chunk_max if chunks is None or chunks < 0 else min(chunks, n_chunk_max)
    return PassSizes(n_seq=n_seq, n_ctx_total=n_seq * n_ctx, n_batch=n_batch_eff, n_chunk=n_chunk,
                     num_batches=math.ceil(n_ctx / n_batch_eff), first=n_ctx // 2)
