"""The premise's statistics (results/preregistration-premise.md), pure functions of numbers: Spearman's rho, the
bootstrap over clusters (seed, stage) with its interval and p, Holm, the calls of P1-P3, and the validation gate's
decision rules (the lr ladder, its two pass conditions, the reliability doubling).

The cluster bootstrap is exact where the clusters are few: with k clusters there are C(2k-1, k) distinct resamples
(9 clusters, 3 seeds x 3 stages: 24,310), each weighted by its multinomial probability, so interval and p carry no
Monte Carlo error; past EXACT_LIMIT resamples are drawn at random (RESAMPLES of them)."""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

from analysis import stats as matrix_stats
from analysis import premise_registered as registered

EXACT_LIMIT = 30_000
RESAMPLES = 4000
"""the cluster bootstrap enumerates every resample up to EXACT_LIMIT of them, else draws RESAMPLES"""
Z95 = scipy_stats.norm.ppf(0.5 + registered.LEVEL / 2)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho of (x, y); NaN where either is constant (no order to correlate)."""
    return float(spearman_columns(np.asarray(x, dtype=float)[:, None], np.asarray(y, dtype=float))[0])


def spearman_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[S] Spearman's rho of each column of x [n, S] with y [n] (average ranks for ties); NaN for a constant one."""
    rx, ry = scipy_stats.rankdata(x, axis=0), scipy_stats.rankdata(y)
    rx, ry = rx - rx.mean(0), ry - ry.mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry[:, None]).sum(0) / np.sqrt((rx ** 2).sum(0) * (ry ** 2).sum())


# ---------------------------------------------------------------------------------------------------------------
# The bootstrap: over clusters for P1-P4, over offers for the gate
# ---------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def every_resample(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every bootstrap resample of k units, as how often each unit is drawn [R, k], and its probability [R]."""
    counts = np.array([np.bincount(picked, minlength=k)
                       for picked in itertools.combinations_with_replacement(range(k), k)])
    ways = np.array([math.factorial(k) / math.prod(math.factorial(c) for c in row) for row in counts])
    return counts, ways / k ** k


def resample_counts(k: int, rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap resamples of k units ([R, k] draws per unit, [R] probabilities): all of them, exactly weighted,
    where they are at most EXACT_LIMIT, else RESAMPLES drawn at random, each 1/RESAMPLES."""
    if math.comb(2 * k - 1, k) <= EXACT_LIMIT:
        return every_resample(k)
    counts = np.array([np.bincount([rng.randrange(k) for _ in range(k)], minlength=k) for _ in range(RESAMPLES)])
    return counts, np.full(RESAMPLES, 1 / RESAMPLES)


def bootstrap(groups: list[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], rng: random.Random
              ) -> tuple[np.ndarray, np.ndarray]:
    """The statistic ([S], of an index array into the rows) over each resample of the groups (each an index array,
    repeated as often as it is drawn): its draws [R, S] and their probabilities [R]."""
    counts, weights = resample_counts(len(groups), rng)
    draws = np.array([statistic(np.concatenate([np.tile(g, c) for g, c in zip(groups, row)])) for row in counts])
    return draws.reshape(len(counts), -1), weights


def quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of weighted draws: the smallest value whose cumulative weight reaches q."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(np.searchsorted(cumulative, q - 1e-12), len(values) - 1)])


def summary(value: float, values: np.ndarray, weights: np.ndarray, level: float = registered.LEVEL) -> dict:
    """A statistic with its percentile interval and its two-sided bootstrap p of 'it is 0' (twice the weight on the
    smaller side of 0, at most 1), over the draws where it is defined (NaN draws left out, the rest renormalized)."""
    finite = np.isfinite(values)
    if not finite.any():        # undefined on every resample (a constant predictor): nothing to say
        return {"value": float(value), "low": math.nan, "high": math.nan, "p": math.nan}
    values, weights = values[finite], weights[finite] / weights[finite].sum()
    tail = (1 - level) / 2
    p = min(1.0, 2 * min(weights[values <= 0].sum(), weights[values >= 0].sum()))
    return {"value": float(value), "low": quantile(values, weights, tail), "high": quantile(values, weights, 1 - tail),
            "p": float(p)}


def clustered(clusters: list, statistic: Callable[[np.ndarray], np.ndarray], rng: random.Random) -> list[dict]:
    """Each component of the statistic over all rows, with its 95% interval and p from the bootstrap over
    `clusters` (each the row indices of one (seed, stage))."""
    groups = [np.asarray(c) for c in clusters]
    value = statistic(np.concatenate(groups))
    if len(groups) < 2:      # one cluster resamples to itself: no interval, no p, so no call
        return [{"value": float(v), "low": math.nan, "high": math.nan, "p": math.nan} for v in np.atleast_1d(value)]
    draws, weights = bootstrap(groups, statistic, rng)
    return [summary(v, draws[:, s], weights) for s, v in enumerate(np.atleast_1d(value))]


def holm(p: dict[str, float], alpha: float = registered.ALPHA) -> dict[str, bool]:
    """Holm's step-down (analysis/stats.py, holm) over named p-values: whether each is rejected; an undefined p (a
    statistic undefined on every resample) counts as 1."""
    keys = list(p)
    _, _, rejected = matrix_stats.holm([p[k] if math.isfinite(p[k]) else 1.0 for k in keys], alpha)
    return dict(zip(keys, rejected))


def call_negative(result: dict, rejected: bool) -> str:
    """P1 and P2's rule: supported where Holm rejects with rho < 0 (taken first where the interval also lies above
    -0.1); refuted where the interval lies above -0.1; not resolved otherwise."""
    if rejected and result["value"] < 0:
        return "supported"
    return "refuted" if result["low"] > registered.TRIVIAL_RHO else "not resolved"


def call_positive_median(result: dict, rejected: bool) -> str:
    """P3's rule: supported where the median's interval lies above 0 and Holm rejects; not resolved otherwise."""
    return "supported" if rejected and result["low"] > 0 else "not resolved"


# ---------------------------------------------------------------------------------------------------------------
# The validation gate's decision rules
# ---------------------------------------------------------------------------------------------------------------

def paired(differences: Sequence[float]) -> dict:
    """Mean of paired per-prompt differences (after - before under common random numbers), its standard error and
    normal 95% interval."""
    d = np.asarray(differences, dtype=float)
    se = float(d.std(ddof=1) / math.sqrt(len(d)))
    mean = float(d.mean())
    return {"mean": mean, "se": se, "low": mean - Z95 * se, "high": mean + Z95 * se}


def choose_lr(moves: dict[float, Sequence[float]]) -> tuple[float, bool]:
    """The smallest lr whose top-decile update moves held-out reward by at least LR_STANDARD_ERRORS standard errors
    of its paired per-prompt differences (moves: lr -> those differences), and whether any did; where none does,
    the ladder's largest (the registration names no fallback: the gate's verdict then says so)."""
    for lr in sorted(moves):
        m = paired(moves[lr])
        if m["mean"] != 0 and abs(m["mean"]) >= registered.LR_STANDARD_ERRORS * m["se"]:
            return lr, True
    return max(moves), False


def rank_condition(u: Sequence[float], lookahead: Sequence[float], rng: random.Random) -> dict:
    """The first pass condition: rho(U, lookahead) > 0 with its 95% bootstrap interval (over offers) above 0."""
    u, lookahead = np.asarray(u, dtype=float), np.asarray(lookahead, dtype=float)
    result, = clustered([[i] for i in range(len(u))], lambda i: spearman_columns(u[i, None], lookahead[i]), rng)
    return {**result, "passes": bool(result["value"] > 0 and result["low"] > 0)}


def decile_condition(top_minus_bottom: Sequence[float]) -> dict:
    """The second: the top decile's update raises held-out reward more than the bottom's, the paired per-prompt
    differences' 95% interval positive."""
    result = paired(top_minus_bottom)
    return {**result, "passes": bool(result["low"] > 0)}


def reliable(split_half_rho: float) -> bool:
    return split_half_rho >= registered.RELIABILITY


def samples_ladder(samples: int = registered.HELDOUT_SAMPLES) -> list[int]:
    """g_J's samples per held-out prompt at each try: the registered count, then doubled up to MAX_DOUBLINGS times."""
    return [samples * 2 ** i for i in range(registered.MAX_DOUBLINGS + 1)]


def until_reliable(attempt: Callable[[int], dict], samples: int = registered.HELDOUT_SAMPLES) -> list[dict]:
    """attempt(samples) (the gate measured with g_J at that many samples per prompt) up the samples ladder until its
    split-half rho is reliable or the ladder ends; every try, the last one the gate's."""
    tries = []
    for n in samples_ladder(samples):
        tries.append(attempt(n))
        if reliable(tries[-1]["split_half_rho"]):
            break
    return tries


def deciles(u: Sequence[float]) -> tuple[list[int], list[int]]:
    """The indices of U's bottom and top deciles (a tenth of the offers, at least one each), in U's order."""
    order = sorted(range(len(u)), key=u.__getitem__)
    size = max(1, len(u) // 10)
    return order[:size], order[-size:]


def judge(u_halves: list[list[float]], lookahead_at: Callable[[float], list[float]],
          decile_move: Callable[[list[int], float], np.ndarray], rng: random.Random) -> dict:
    """The gate at one g_J: U of each offer (the mean of its halves [offers][2]); lr by the ladder on the first
    LR_OFFERS offers' top decile (decile_move(indices, lr): the per-prompt change of held-out reward when those
    offers are one update of size lr); each offer's lookahead at that lr (lookahead_at(lr)); both pass conditions,
    the split-half rho and the verdict."""
    u = [sum(h) / 2 for h in u_halves]
    moves = {lr: decile_move(deciles(u[:registered.LR_OFFERS])[1], lr) for lr in registered.LR_LADDER}
    lr, resolved = choose_lr(moves)
    lookahead = lookahead_at(lr)
    bottom, top = deciles(u)
    rank = rank_condition(u, lookahead, rng)
    decile = decile_condition(decile_move(top, lr) - decile_move(bottom, lr))
    split_half = spearman(*zip(*u_halves))
    return {"lr": lr, "lr_resolved": resolved, "ladder": {str(k): paired(v) for k, v in moves.items()},
            "split_half_rho": split_half, "rank": rank, "decile": decile,
            "passes": bool((rank["passes"] or decile["passes"]) and reliable(split_half)), "U": u,
            "U_halves": u_halves, "lookahead": lookahead}
