"""Summary statistics for repeated measurements (pure; scipy for the t distribution and Welch's test,
``statistics.NormalDist`` for the normal one)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

from edgekv import heavy

UNSTABLE_CV = 0.10   # pyperf warns when the standard deviation is at least 10 % of the mean


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """mean, sample standard deviation, 95 % confidence interval (Student t; for positive samples on their
    logarithm, so a rate's interval never goes below zero), and a stability flag.  Every sample is kept by the
    caller; this only summarises."""
    st = heavy.scipy_stats()

    xs = [float(x) for x in samples]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "stdev": None, "ci95": None, "cv": None, "unstable": False}
    mean = sum(xs) / n
    if n < 2:
        return {"n": 1, "mean": mean, "stdev": None, "ci95": None, "cv": None, "unstable": False}
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    sd = math.sqrt(var)
    t = float(st.t.ppf(0.975, n - 1))
    if all(x > 0 for x in xs):
        # Rates (tokens/s) cannot be negative, and with 5 noisy samples a linear interval can reach below zero
        # (31.0 [-3.6, 65.6]): the interval is computed on the logarithm of the samples and mapped back, so it is
        # positive and asymmetric, as a rate's uncertainty is (issue 19).
        ls = [math.log(x) for x in xs]
        lm = sum(ls) / n
        lsd = math.sqrt(sum((v - lm) ** 2 for v in ls) / (n - 1))
        h = t * lsd / math.sqrt(n)
        ci = [math.exp(lm - h), math.exp(lm + h)]
    else:
        half = t * sd / math.sqrt(n)
        ci = [mean - half, mean + half]
    cv = sd / mean if mean else None
    return {
        "n": n, "mean": mean, "stdev": sd, "ci95": ci, "cv": cv,
        "unstable": bool(cv is not None and cv >= UNSTABLE_CV),
    }


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Welch's t-test of mean(b) vs mean(a) (scipy's ``ttest_ind(equal_var=False)``): relative change, its 95 %
    interval, and the p-value."""
    st = heavy.scipy_stats()

    a = [float(x) for x in a]
    b = [float(x) for x in b]
    if len(a) < 2 or len(b) < 2:
        return {"p_value": None, "change": (sum(b) / len(b)) / (sum(a) / len(a)) - 1 if a and b else None,
                "change_ci95": None, "test": "none (fewer than 2 samples)"}
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    if max(a) == min(a) and max(b) == min(b):
        # no spread on either side: scipy's statistic is undefined (nan); the difference is exact
        p = 0.0 if ma != mb else 1.0
        lo = hi = mb - ma
    else:
        res = st.ttest_ind(b, a, equal_var=False)
        p = float(res.pvalue)
        ci = res.confidence_interval(0.95)
        lo, hi = float(ci.low), float(ci.high)
    return {"p_value": p, "change": mb / ma - 1 if ma else None,
            "change_ci95": [lo / ma, hi / ma] if ma else None, "test": "welch"}


def z_test(a: float, ea: float, b: float, eb: float) -> tuple[float, list[float]]:
    """Two estimates with standard errors (perplexity, KL divergence): two-sided p-value of b - a under the normal
    distribution, and the difference's 95 % interval."""
    se = math.sqrt(ea * ea + eb * eb)
    d = b - a
    if se == 0:
        return (0.0 if d else 1.0), [d, d]
    normal = NormalDist()
    p = 2 * normal.cdf(-abs(d) / se)
    z95 = normal.inv_cdf(0.975)
    return p, [d - z95 * se, d + z95 * se]
