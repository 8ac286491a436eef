"""The statistics of the matrix's analyses: the percentile bootstrap over seeds and its p-value (the registered
readings), and the readings valid at every n that results/reporting-rule.md holds them to: the exact sign-flip
test, Student's t interval and Fieller's interval of a ratio; Holm's step-down correction, the chi-square interval
of an SD and the fewest seeds that meet a precision or power.
Each works on plain lists of paired values (one per seed), so any analysis of summaries uses them the same way.
scipy.stats gives the distributions and the permutation test; the bootstrap stays by hand because the registered
intervals were drawn with this exact resampling stream (scipy's draws its resamples otherwise), and Holm and
Fieller because scipy.stats has neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats as scipy_stats


def bootstrap_means(differences: list[float], resamples: int, seed: int) -> np.ndarray:
    """[resamples] means of the differences resampled with replacement (seeds drawn at random)."""
    values = np.asarray(differences, dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    return values[draws].mean(axis=1)


EXACT_SIGN_FLIPS = 20
"""up to this many differences the sign-flip test enumerates every assignment of signs; beyond, it draws 2^20"""


def sign_flip_p(differences: list[float], alternative: str = "two-sided", seed: int = 0) -> float:
    """The p-value of the paired sign-flip (permutation) test that the differences are centred on 0: the share of
    the 2^n assignments of signs to the n differences whose mean lies at least as far out as the observed one
    ("two-sided": from 0 either way; "greater": above), exact up to EXACT_SIGN_FLIPS differences, else over 2^20
    assignments drawn at random (counting the observed one, so never 0). Its level holds at every n; with every
    sign shared, the two-sided p is exactly 2 / 2^n (0.25 at 3 seeds), the least n seeds can show."""
    values = np.asarray(differences, dtype=float)
    result = scipy_stats.permutation_test((values,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                          permutation_type="samples", n_resamples=2 ** EXACT_SIGN_FLIPS,
                                          alternative=alternative, batch=2 ** 16, rng=seed)
    return float(result.pvalue)


def p_text(p: float) -> str:
    """A p-value as the tables print it: three decimals, or a bound below 0.001."""
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def percentile_interval(means: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def bootstrap_p(means: np.ndarray) -> float:
    """Two-sided: twice the share of resampled means on the far side of 0 (at most 1)."""
    return float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean())))


def holm(p: list[float], alpha: float) -> tuple[list[float], list[float], list[bool]]:
    """Holm's step-down correction of m p-values: each one's adjusted p-value, the level it is tested at
    (alpha / (m - rank), rank 0 the smallest p) and whether it is rejected (all smaller ones were, and it is
    below its level)."""
    m = len(p)
    adjusted, levels, rejected = [0.0] * m, [0.0] * m, [False] * m
    running, still = 0.0, True
    for rank, i in enumerate(sorted(range(m), key=lambda k: p[k])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i], levels[i] = running, alpha / (m - rank)
        still = still and p[i] <= levels[i]
        rejected[i] = still
    return adjusted, levels, rejected


def chi2_quantile(p: float, dof: int) -> float:
    """The `p` quantile of chi2 with `dof` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"chi-square needs at least 1 degree of freedom (two seeds), got {dof}")
    return float(scipy_stats.chi2.ppf(p, dof))


def sd_upper_bound(sd: float, seeds: int, confidence: float) -> float:
    """The one-sided `confidence` upper bound of an SD measured on `seeds` paired differences (chi-square)."""
    return sd * math.sqrt((seeds - 1) / chi2_quantile(1 - confidence, seeds - 1))


def sd_interval(sd: float, seeds: int, level: float) -> tuple[float, float]:
    """The two-sided `level` interval of an SD measured on `seeds` paired differences: its one-sided bounds at
    confidence (1 - level) / 2 and (1 + level) / 2."""
    return sd_upper_bound(sd, seeds, (1 - level) / 2), sd_upper_bound(sd, seeds, (1 + level) / 2)


def t_quantile(p: float, dof: int) -> float:
    """The `p` quantile of Student's t with `dof` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom (two seeds), got {dof}")
    return float(scipy_stats.t.ppf(p, dof))


def t_interval(values: list[float], level: float) -> tuple[float, float]:
    """Student's t interval of the mean of `values` (paired differences, one per seed) at `level`."""
    n = len(values)
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def fieller_interval(numerators: list[float], denominators: list[float], level: float) -> tuple[float, float]:
    """Fieller's `level` interval of mean(numerators) / mean(denominators), the two paired seed by seed: every r
    for which the paired t test does not reject mean(numerator - r denominator) = 0, i.e.
    (m_n - r m_d)^2 <= q (v_nn - 2 r v_nd + r^2 v_dd), q = t^2 / n, v the sample (co)variances. Bounded only where
    the denominator's mean is told from 0 at that level (m_d^2 > q v_dd); otherwise (-inf, inf), as an unbounded
    set (the whole line, or the line less an interval) is reported: it bounds nothing."""
    x, y = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    n = len(x)
    if n < 2 or len(y) != n:
        raise ValueError(f"Fieller's interval needs two or more pairs, got {n} numerators and {len(y)} denominators")
    q = t_quantile((1 + level) / 2, n - 1) ** 2 / n
    covariance = np.cov(x, y, ddof=1)                 # [2, 2]
    a = y.mean() ** 2 - q * covariance[1, 1]
    b = -2 * (x.mean() * y.mean() - q * covariance[0, 1])
    c = x.mean() ** 2 - q * covariance[0, 0]
    if a <= 0:
        return -math.inf, math.inf
    root = math.sqrt(max(0.0, b * b - 4 * a * c))
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def fewest_seeds(enough: Callable[[int], bool], goal: str, most: int = 100_000) -> int:
    """The fewest seeds n >= 2 for which `enough(n)` holds (it must hold for every larger n too), by bisection; an
    error naming the `goal` where even `most` seeds do not reach it."""
    if not enough(most):
        raise ValueError(f"even {most} seeds do not reach {goal}")
    low, high = 2, most
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle + 1, high)
    return low
