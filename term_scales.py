"""The curator's scales: the three terms put on one scale, and the thresholds, from the receiver's recent offers.

Proposal §2.1 weighs the terms, D = l1 TBD + l2 CCM + l3 RSD, and the weights mean what they say only when the
terms share a scale; raw, they do not (on the tiny pair CCM spreads over [0, 1] while TBD is 0 between Qwen2 and
Llama-3 and RSD sits in a narrow band). So each term enters D through its distribution over a calibration sample:
the diagnosed offers into the same receiver over its last `calibration_window` iterations, the current one
included (curator.py). A term's scale is its mid-rank CDF there, piecewise linear between the sample's
percentiles: monotone in the raw term, uniform on [0, 1] over the sample, and flat only beyond its extremes, so
equal weights give the terms equal spread in D. A term that never varied over the sample (TBD between Qwen2 and
Llama-3 in line steps) has no distribution to scale by and enters raw: 0 there, as it was.

The thresholds are a stated rule on the same sample (`share_thresholds`): the quantiles of D that give PRP, XGRPO
and SGT a third each, computed for whatever weights a run uses, its ablations included, so an ablation is the
curator minus one term rather than a shifted D that sends everything to one band (DESIGN.md §4.12, §4.15). A D that
many offers share goes whole to the band where the middle of its share lies (`uncut`). The sample is the run's own:
a scale fitted on another run does not transfer, because the admission a run makes shapes the policies and so the
terms it records (docs/results.md, "The curator on a fresh seed").
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

import torch

TERMS = ("tbd", "ccm", "rsd")
PERCENTILES = 101


def weights(ablate: tuple[str, ...], lambdas: tuple[float, float, float]) -> torch.Tensor:
    """[3] the terms' weights in D: the lambdas, 0 for an ablated term; the others keep theirs."""
    w = torch.tensor([0.0 if t in ablate else l for t, l in zip(TERMS, lambdas)], dtype=torch.float64)
    if w.sum() <= 0:
        raise ValueError(f"every term with a weight is ablated: lambdas {lambdas}, ablate {ablate}")
    return w


def admission_band(d: float, theta1: float, theta2: float) -> int:
    """0 = PRP, 1 = XGRPO, 2 = SGT."""
    if not math.isfinite(d):
        raise ValueError(f"the degradation is {d}; a trajectory cannot be admitted on it")
    return 0 if d < theta1 else 1 if d < theta2 else 2


EQUAL_SHARES = (1 / 3, 1 / 3)
"""the shares of offers the default thresholds admit to PRP and to XGRPO (the rest to SGT): a third each"""


def share_thresholds(d: list[float], shares: tuple[float, float] = EQUAL_SHARES) -> tuple[float, float]:
    """(theta1, theta2) that admit the given shares of the offers' degradations `d` to PRP and XGRPO (the rest to
    SGT): the shares[0] and shares[0] + shares[1] quantiles (linear interpolation between order statistics), each
    kept off a value that several offers hold (`uncut`). A single offer is both quantiles, so alone it goes to SGT,
    the most cautious level."""
    values = sorted(v for v in d if v == v)
    if len(values) == 0:
        raise ValueError("setting thresholds needs at least one diagnosed offer")
    if min(shares) < 0 or sum(shares) > 1:
        raise ValueError(f"shares are two non-negative fractions summing to at most 1, got {shares}")
    cuts = (shares[0], shares[0] + shares[1])
    quantiles = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor(cuts, dtype=torch.float64))
    return uncut(values, quantiles[0].item(), cuts[0]), uncut(values, quantiles[1].item(), cuts[1])


def uncut(values: list[float], theta: float, cut: float) -> float:
    """The threshold at the `cut` quantile `theta` of the sorted `values`, moved off a value that several of them
    hold. A point mass is common (the offers whose every step is in reach share their CCM, and a term that never
    varied adds the same to every D), and at a threshold equal to it the whole mass would land on one side by the
    comparison's last bit, or by `D < theta` always above it: with a third of the offers at one D, PRP empty. So
    the threshold moves to the middle of the gap beside the value, on the side that leaves it whole in the band
    where the middle of its share of the sample lies (one past it where no value lies beyond: D is at most 1)."""
    lo, hi = bisect.bisect_left(values, theta), bisect.bisect_right(values, theta)    # values[lo:hi] == theta
    if hi - lo < 2:
        return theta
    if (lo + hi) / 2 < cut * len(values):                         # its middle below the cut: the band below
        return (theta + values[hi]) / 2 if hi < len(values) else theta + 1.0
    return (values[lo - 1] + theta) / 2 if lo > 0 else theta - 1.0


@dataclass(frozen=True)
class TermScale:
    """A term's mid-rank CDF on the calibration sample: increasing distinct `knots` (raw values) and the CDF at
    each; linear in between, constant beyond the first and last knot. With a single knot (a term that never
    varied) the raw value itself."""

    knots: tuple[float, ...]
    cdf: tuple[float, ...]

    @classmethod
    def fit(cls, values: list[float]) -> TermScale:
        """From raw values: their percentiles, each run of equal percentiles (a point mass) one knot at the mean
        of its probabilities, so a value held by a share s of the offers scales to the middle of its s."""
        finite = torch.tensor([v for v in values if math.isfinite(v)], dtype=torch.float64)
        if finite.numel() == 0:
            raise ValueError("a term's scale needs at least one finite calibration value")
        probs = torch.linspace(0, 1, PERCENTILES, dtype=torch.float64)
        knots: list[float] = []
        runs: list[list[float]] = []
        for value, p in zip(torch.quantile(finite, probs).tolist(), probs.tolist()):
            if knots and value <= knots[-1]:
                runs[-1].append(p)
            else:
                knots.append(value)
                runs.append([p])
        return cls(tuple(knots), tuple(sum(r) / len(r) for r in runs))

    def __call__(self, raw: float) -> float:
        k, p = self.knots, self.cdf
        if len(k) == 1:
            return raw
        if raw <= k[0]:
            return p[0]
        if raw >= k[-1]:
            return p[-1]
        j = bisect.bisect_right(k, raw)                                      # k[j-1] <= raw < k[j]
        return p[j - 1] + (p[j] - p[j - 1]) * (raw - k[j - 1]) / (k[j] - k[j - 1])


@dataclass(frozen=True)
class Calibration:
    """The raw terms [N, 3] of the calibration sample's diagnosed offers (NaN where a term was not computed)."""

    terms: tuple[tuple[float, float, float], ...]

    @cached_property
    def scales(self) -> tuple[TermScale | None, ...]:
        """Per term its scale, None for a term measured on no offer of the sample (an ablated one)."""
        columns = [[row[i] for row in self.terms] for i in range(len(TERMS))]
        return tuple(TermScale.fit(c) if any(math.isfinite(v) for v in c) else None for c in columns)

    def scaled(self, raw: torch.Tensor) -> torch.Tensor:
        """[3] each raw term through its scale; NaN stays NaN (an ablated or unmeasured term)."""
        return torch.tensor([v if math.isnan(v) or s is None else s(v) for s, v in zip(self.scales, raw.tolist())],
                            dtype=torch.float64)

    def degradations(self, weights: torch.Tensor) -> list[float]:
        """The calibration sample's D under these weights [3] (0 for an ablated term)."""
        rows = torch.stack([torch.nan_to_num(self.scaled(torch.tensor(r, dtype=torch.float64)), nan=0.0)
                            for r in self.terms])                                                   # [N, 3]
        return (rows @ weights.double()).tolist()

    def thresholds(self, weights: torch.Tensor, shares: tuple[float, float] = EQUAL_SHARES) -> tuple[float, float]:
        """The share rule on the calibration sample's D under these weights [3]."""
        return share_thresholds(self.degradations(weights), shares)
