"""The statistics of the matrix's analyses: the percentile bootstrap over seeds and its p-value, the exact
sign-flip test beside it, Holm's step-down correction, the chi-square interval of an SD, Student's t quantile and
the fewest seeds that meet a precision or power.
Each works on plain lists of paired differences (one per seed), so any analysis of summaries uses them the same
way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np


def bootstrap_means(differences: list[float], resamples: int, seed: int) -> np.ndarray:
    """[resamples] means of the differences resampled with replacement (seeds drawn at random)."""
    values = np.asarray(differences, dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    return values[draws].mean(axis=1)


EXACT_SIGN_FLIPS = 20
"""up to this many differences the sign-flip test enumerates every assignment of signs; beyond, it draws 2^20"""


def sign_flip_p(differences: list[float], seed: int = 0) -> float:
    """The two-sided p-value of the paired sign-flip (permutation) test: the share of the 2^n assignments of signs
    to the n differences whose sum lies at least as far from 0 as the observed one, exact up to EXACT_SIGN_FLIPS
    differences, else over 2^20 assignments drawn at random (counting the observed one, so never 0). Beside the
    registered bootstrap p, which is 0 whenever every difference shares a sign, it says what n seeds can show at
    all: with every sign shared, exactly 2 / 2^n (0.25 at 3 seeds)."""
    values = np.asarray(differences, dtype=float)
    observed = abs(values.sum()) * (1 - 1e-12)        # sums of one set of values in another order tie
    exact = len(values) <= EXACT_SIGN_FLIPS
    total, chunk = (2 ** len(values) if exact else 2 ** EXACT_SIGN_FLIPS), 2 ** 16
    rng, bits, extreme = np.random.default_rng(seed), np.arange(len(values)), 0
    for start in range(0, total, chunk):
        size = min(chunk, total - start)
        codes = np.arange(start, start + size)[:, None] >> bits if exact else rng.integers(0, 2, (size, len(values)))
        signs = 1 - 2 * (codes & 1)                             # [size, n] of +-1
        extreme += int(np.count_nonzero(np.abs(signs @ values) >= observed))
    return extreme / total if exact else (extreme + 1) / (total + 1)


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


def chi2_cdf(x: float, dof: int) -> float:
    """P(chi2_dof <= x): the regularized lower incomplete gamma P(dof/2, x/2), by its power series."""
    if x <= 0:
        return 0.0
    s, z = dof / 2, x / 2
    term = total = 1 / s
    k = 0
    while term > total * 1e-16:
        k += 1
        term *= z / (s + k)
        total += term
    return math.exp(s * math.log(z) - z - math.lgamma(s)) * total


def chi2_quantile(p: float, dof: int) -> float:
    """The `p` quantile of chi2 with `dof` degrees of freedom, by bisection on chi2_cdf."""
    if dof < 1:
        raise ValueError(f"chi-square needs at least 1 degree of freedom (two seeds), got {dof}")
    low, high = 0.0, float(dof)
    while chi2_cdf(high, dof) < p:
        low, high = high, 2 * high
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if chi2_cdf(middle, dof) < p else (low, middle)
    return (low + high) / 2


def sd_upper_bound(sd: float, seeds: int, confidence: float) -> float:
    """The one-sided `confidence` upper bound of an SD measured on `seeds` paired differences (chi-square)."""
    return sd * math.sqrt((seeds - 1) / chi2_quantile(1 - confidence, seeds - 1))


def sd_interval(sd: float, seeds: int, level: float) -> tuple[float, float]:
    """The two-sided `level` interval of an SD measured on `seeds` paired differences: its one-sided bounds at
    confidence (1 - level) / 2 and (1 + level) / 2."""
    return sd_upper_bound(sd, seeds, (1 - level) / 2), sd_upper_bound(sd, seeds, (1 + level) / 2)


@lru_cache(maxsize=None)
def t_quantile(p: float, dof: int, intervals: int = 1000) -> float:
    """The `p` quantile (p > 1/2) of Student's t with `dof` degrees of freedom: bisection on its CDF, integrated
    from 0 by Simpson's rule over (1 + x^2/dof)^(-(dof+1)/2)."""
    if dof < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom (two seeds), got {dof}")
    scale = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    density = lambda x: scale * (1 + x * x / dof) ** (-(dof + 1) / 2)
    def cdf(x: float) -> float:
        h = x / intervals
        inner = sum((4 if k % 2 else 2) * density(k * h) for k in range(1, intervals))
        return 0.5 + h / 3 * (density(0.0) + inner + density(x))
    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


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
