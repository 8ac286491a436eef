"""What the branches pilot sets (results/preregistration-branches.md, "The pilot and the rules it applies"): the
branch length k, the seed count n, the controls' power and the budget's cuts, from the pilot's rows alone, so that
part 2 of the registration writes down numbers this file computes and anyone can recompute.

    python -m benchmarks.branches plan results/branches-pilot results/branches-pilot-k10

1. k: per k, the per-point `negated - none` differences (both receivers, both seeds, every point), in points; the k
   with the larger -mean / SD (the control that must hurt, hurting most per unit of noise); a tie, or neither
   positive, gives 5.
2. n: at that k, per receiver, the per-point `d - chance` differences; their SD / sqrt(points) stands for the SD of
   a seed's mean; the larger over receivers, at its one-sided upper 80% bound (chi-square); n is the smallest of
   9-16 whose exact two-sided sign-flip test at 0.05 / 8 rejects in at least 80% of 10,000 simulated samples of n
   normal differences of mean 1 point (numpy seed 0). Short at 16: n is 16, underpowered, with the effect it has 80%
   power against.
3. The budget: 20 hours of two processes at a time, the pilot's included; trio-prose costs three times qwen-llama;
   over it, the registered cuts in order.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from analysis import stats

POINTS = 100.0
"""accuracy in points"""
SEED_COUNTS = range(9, 17)
"""below 9 seeds the smallest two-sided sign-flip p, 2 / 2^n, exceeds 0.05 / 8"""
ALPHA_CALLS = 0.05 / 8
"""Holm's strictest level of family A at qwen-llama (4 signals x 2 receivers)"""
CONTROL_FAMILIES = {"qwen-llama": 6, "trio-prose": 9}
"""the controls' family per preset: negated, second-group and sgt per receiver"""
TARGET, POWER, DRAWS = 1.0, 0.8, 10_000
BUDGET_HOURS, PROCESSES, TRIO_COST = 20.0, 2, 3.0
RATIO_ARMS = ("sequence_ratio", "capped_ratio", "kl")
FIRST_CALL_SEED = 3103
"""the calls' seeds are FIRST_CALL_SEED onwards, n of them; the pilot's, 3101-3102, precede them"""
POINT_SECONDS = "trunk-measures"
"""a row's seconds beside its trunk and branches: the measures' draws from the trunk and its measure"""


def per_point(rows: list[dict], policies: list[str], arm: str, reference: str, scale: float = POINTS) -> list[float]:
    """arm - reference held-out accuracy (times `scale`: in points), at every row (seed and point) and receiver; a
    row without either arm is refused, since the rules count every seed's every point."""
    missing = [(r["seed"], r["point"]) for r in rows if arm not in r["arms"] or reference not in r["arms"]]
    if missing:
        raise ValueError(f"the pilot's rows {missing} lack {arm} or {reference}: rerun them before part 2")
    return [scale * (r["arms"][arm][p] - r["arms"][reference][p]) for r in rows for p in policies]


def separation(values: list[float]) -> float:
    """-mean / SD (ddof 1) of a control that must hurt: larger is a clearer hurt (infinite at SD 0)."""
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    return -mean / sd if sd > 0 else -math.copysign(math.inf, mean) if mean else 0.0


def choose_k(by_k: dict[int, list[dict]]) -> tuple[int, dict[int, float]]:
    """Rule 1: the k whose negated - none differences separate most; a tie or no positive separation gives 5."""
    scores = {k: separation(per_point(rows, policies_of(rows), "negated", "none")) for k, rows in by_k.items()}
    best = max(scores.values())
    winners = [k for k, s in scores.items() if s == best]
    return (winners[0] if best > 0 and len(winners) == 1 else 5), scores


def policies_of(rows: list[dict]) -> list[str]:
    return sorted({p for r in rows for p in r["trunk"]})


def seed_mean_sd(values: list[float], points: int) -> tuple[float, float]:
    """The SD of a seed's mean over `points` points, treating them as independent, and its one-sided upper 80%
    bound, s * sqrt(dof / chi2_0.2(dof))."""
    sd = float(np.std(values, ddof=1)) / math.sqrt(points)
    dof = len(values) - 1
    return sd, sd * math.sqrt(dof / stats.chi2_quantile(0.2, dof))


def sign_flip_p_many(samples: np.ndarray) -> np.ndarray:
    """[m] the exact two-sided sign-flip p of each row of samples [m, n] (as stats.sign_flip_p, vectorized): the
    share of the 2^n sign assignments whose sum is at least as far from 0 as the observed one."""
    n = samples.shape[1]
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))              # [2^n, n], row 0 the observed
    out = np.empty(samples.shape[0])
    for start in range(0, samples.shape[0], 256):
        sums = np.abs(samples[start:start + 256] @ signs.T)                          # [chunk, 2^n]
        observed = sums[:, :1]
        out[start:start + 256] = (sums >= observed * (1 - 1e-12)).mean(axis=1)
    return out


def power(n: int, mean: float, sd: float, alpha: float, draws: int = DRAWS, seed: int = 0) -> float:
    """The share of `draws` simulated samples of n normal differences (mean, sd) that the exact sign-flip test
    rejects at two-sided `alpha`."""
    samples = np.random.default_rng(seed).normal(mean, sd, size=(draws, n))
    return float((sign_flip_p_many(samples) <= alpha).mean())


def effect_at_power(n: int, sd: float, draws: int = DRAWS, target: float = TARGET) -> float:
    """The smallest effect, on a grid of tenths of `target` from `target` up (0.1 points from 1 point), that n seeds
    have 80% power against."""
    return next(target * e / 10 for e in itertools.count(10)
                if power(n, target * e / 10, sd, ALPHA_CALLS, draws) >= POWER)


def seed_count(sd: float, draws: int = DRAWS, target: float = TARGET) -> tuple[int, bool, float]:
    """Rule 2: n, whether n is short of 80% power against `target` (1 point), and the effect n has 80% power
    against."""
    for n in SEED_COUNTS:
        if power(n, target, sd, ALPHA_CALLS, draws) >= POWER:
            return n, False, target
    return SEED_COUNTS[-1], True, effect_at_power(SEED_COUNTS[-1], sd, draws, target)


@dataclass(frozen=True)
class Costs:
    """Seconds of one process: a trunk iteration, one branch at the chosen k (evaluations included), and what a
    branch point costs beside them (the measure study's draws from the trunk; none in the pilot)."""
    trunk_iteration: float
    branch: float
    point: float = 0.0

    def seed(self, arms: int, points: list[int]) -> float:
        """One seed of one preset at qwen-llama's cost: the trunk to the last point and every arm at every point."""
        return max(points) * self.trunk_iteration + len(points) * (arms * self.branch + self.point)


def trunk_iteration_seconds(rows: list[dict]) -> float:
    """Seconds per trunk iteration: per seed, its trunk's seconds over the iterations they trained (each row's from
    the trunk's checkpoint at the row's start to the point, so a resumed row counts what it ran), then the mean."""
    seeds = [[r for r in rows if r["seed"] == s] for s in sorted({r["seed"] for r in rows})]
    return float(np.mean([sum(r["seconds"]["trunk"] for r in mine)
                          / sum(r["point"] - r["started_at"]["trunk"] for r in mine) for mine in seeds]))


def ran_whole(row: dict, arm: str) -> bool:
    """Whether the arm's branch ran whole in its row's process, forked at the point: one resumed after a kill
    counts only the seconds since."""
    return row["started_at"][arm] == row["point"]


def whole_branches(rows: list[dict], arms: set[str]) -> list[float]:
    """The seconds of the branches of `arms` that ran whole."""
    return [r["seconds"][a] for r in rows for a in r["arms"] if a in arms and ran_whole(r, a)]


def rate(rows: list[dict]) -> Costs:
    """The rows' own seconds of one process: a trunk iteration, a whole branch and a point's measures."""
    branches = whole_branches(rows, {a for r in rows for a in r["arms"]})
    return Costs(trunk_iteration_seconds(rows), float(np.mean(branches)),
                 float(np.mean([r["seconds"].get(POINT_SECONDS, 0.0) for r in rows])))


def costs(by_k: dict[int, list[dict]], k: int) -> Costs:
    """The pilot's seconds per trunk iteration (at k = 5) and per branch at k: the mean over every whole branch at
    k = 5, where all arms ran, times the ratio of the arms both k ran at k to at 5."""
    every = {a for r in by_k[5] for a in r["arms"]}
    both = every & {a for r in by_k[k] for a in r["arms"]}

    def mean(rows: list[dict], arms: set[str]) -> float:
        return float(np.mean(whole_branches(rows, arms)))
    return Costs(trunk_iteration_seconds(by_k[5]), mean(by_k[5], every) * mean(by_k[k], both) / mean(by_k[5], both))


def pilot_seconds(by_k: dict[int, list[dict]], trunk_iteration: float) -> float:
    """The process-seconds the pilot spent: each k's trunks to their last point at `trunk_iteration` seconds an
    iteration, every branch, one resumed after a kill counted at its k's mean whole branch, and what each point
    cost beside them."""
    trunk = trunk_iteration * sum(max(r["point"] for r in rows if r["seed"] == s)
                                  for rows in by_k.values() for s in {r["seed"] for r in rows})
    branches = 0.0
    for rows in by_k.values():
        mean = float(np.mean(whole_branches(rows, {a for r in rows for a in r["arms"]})))
        branches += sum(r["seconds"][a] if ran_whole(r, a) else mean for r in rows for a in r["arms"])
        branches += sum(r["seconds"].get(POINT_SECONDS, 0.0) for r in rows)
    return trunk + branches


def same_trunks(by_k: dict[int, list[dict]]) -> None:
    """Each k's runs train their trunk again in their own folder: it must reach the same accuracies at every
    (seed, point), or the pilot has a defect to fix before part 2."""
    trunks = {}
    for k, rows in by_k.items():
        for r in rows:
            first = trunks.setdefault((r["seed"], r["point"]), (k, r["trunk"]))
            if first[1] != r["trunk"]:
                raise ValueError(f"seed {r['seed']}'s trunk at {r['point']} reached {first[1]} at k = {first[0]} and "
                                 f"{r['trunk']} at k = {k}: fix the defect before part 2")


def budget(c: Costs, spent_seconds: float, n: int, arms: int, points: list[int]) -> dict:
    """Rule 3: the calls' hours at n seeds on both presets, and the registered cuts in order while they exceed
    what the pilot left of the budget: trio-prose's ratio arms, its point 60, its seeds (descriptive), then
    qwen-llama's n down to 9 (over the budget, said so, where even 9 does not fit)."""
    left = BUDGET_HOURS - spent_seconds / PROCESSES / 3600

    def hours(ql_seeds: int, trio_seeds: int, trio_arms: int, trio_points: list[int]) -> float:
        return (ql_seeds * c.seed(arms, points) + trio_seeds * TRIO_COST * c.seed(trio_arms, trio_points)
                ) / PROCESSES / 3600
    plan = {"hours_left": left, "cuts": [], "qwen-llama seeds": n, "trio-prose seeds": n,
            "trio-prose arms": arms, "trio-prose points": list(points)}
    if hours(n, n, arms, points) > left:
        plan["cuts"].append("trio-prose's ratio-signal arms")
        plan["trio-prose arms"] = arms - len(RATIO_ARMS)
    if hours(n, n, plan["trio-prose arms"], points) > left and max(points) == 60:
        plan["cuts"].append("trio-prose's branch point 60")
        plan["trio-prose points"] = [p for p in points if p != 60]
    trio = (plan["trio-prose arms"], plan["trio-prose points"])
    if hours(n, n, *trio) > left:
        fits = [m for m in range(n) if hours(n, m, *trio) <= left]
        plan["cuts"].append("trio-prose's calls, descriptive")
        plan["trio-prose seeds"] = max(fits, default=0)
    if hours(n, plan["trio-prose seeds"], *trio) > left:
        fits = [m for m in range(SEED_COUNTS[0], n) if hours(m, 0, *trio) <= left]
        plan["cuts"].append("qwen-llama's n")
        plan["qwen-llama seeds"] = max(fits, default=SEED_COUNTS[0])
    plan["hours"] = hours(plan["qwen-llama seeds"], plan["trio-prose seeds"], *trio)
    plan["over budget"] = plan["hours"] > left
    return plan


def fourth_cut(live: list[dict], set_aside: list[dict], left_hours: float, n: int, arms: int, points: list[int],
               first_seed: int = FIRST_CALL_SEED, lost_points: int = 0) -> dict:
    """Rule 3's last cut, qwen-llama's n down to 9, applied while the calls run, from their rows' seconds alone (no
    outcome is read). Spent: the rows', counted as the pilot's were (`pilot_seconds`), the set-aside ones' at their
    own rate, and `lost_points` points killed before their row was written, each at a seed's mean point. Left to
    run, for the n seeds from first_seed: each trunk from its last row to the last point and every missing point's
    branches, at the rate of the rows running now (`live`). n is the most seeds, 9 to `n`, that fit in what is left
    of `left_hours`; 9, over the budget, where even 9 does not."""
    cost = rate(live)
    point = cost.seed(arms, points) / len(points)
    spent = lost_points * point + sum(pilot_seconds({0: rows}, trunk_iteration_seconds(rows))
                                      for rows in (live, set_aside) if rows)
    left = left_hours - spent / PROCESSES / 3600

    def hours(seeds: int) -> float:
        seconds = 0.0
        for seed in range(first_seed, first_seed + seeds):
            done = {r["point"] for r in live if r["seed"] == seed}
            seconds += (max(points) - max(done, default=0)) * cost.trunk_iteration
            seconds += sum(arms * cost.branch + cost.point for p in points if p not in done)
        return seconds / PROCESSES / 3600
    chosen = max((m for m in range(SEED_COUNTS[0], n + 1) if hours(m) <= left), default=SEED_COUNTS[0])
    return {"costs": cost.__dict__, "spent_hours": spent / PROCESSES / 3600, "hours_left": left,
            "seed_hours": cost.seed(arms, points) / PROCESSES / 3600, "n": chosen, "hours": hours(chosen),
            "over budget": hours(chosen) > left, "lost_points": lost_points}


def plan(rows: list[dict], arms: int) -> dict:
    """The pilot's rules applied to its rows (both k), for `arms` arms a seed at each point. The controls' power is
    rule 2's simulation against the pilot's mean negated - none, its SD taken as rule 2 takes d - chance's (per
    receiver, the larger, at its upper 80% bound), at each preset's Holm's strictest level for its controls; the
    power, its effect and the controls' power are given again at the seed count the budget leaves."""
    by_k = {k: [r for r in rows if r["k"] == k] for k in sorted({r["k"] for r in rows})}
    same_trunks(by_k)
    k, scores = choose_k(by_k)
    chosen, policies = by_k[k], policies_of(by_k[k])
    points, seeds = sorted({r["point"] for r in chosen}), sorted({r["seed"] for r in chosen})
    spread = {p: seed_mean_sd(per_point(chosen, [p], "d", "chance"), len(points)) for p in policies}
    own_means = {p: {s: float(np.mean(per_point([r for r in chosen if r["seed"] == s], [p], "d", "chance")))
                     for s in seeds} for p in policies}
    sd = max(upper for _, upper in spread.values())
    n, short, effect = seed_count(sd)
    negated = {k_: per_point(rows_, policies_of(rows_), "negated", "none") for k_, rows_ in by_k.items()}
    control_sd = max(seed_mean_sd(per_point(chosen, [p], "negated", "none"), len(points))[1] for p in policies)
    cost = costs(by_k, k)
    spent = pilot_seconds(by_k, cost.trunk_iteration)
    plan_ = budget(cost, spent, n, arms, points)
    final = plan_["qwen-llama seeds"]

    def controls(at: int) -> dict[str, float]:
        return {preset: power(at, float(np.mean(negated[k])), control_sd, 0.05 / tests)
                for preset, tests in CONTROL_FAMILIES.items()}
    return {"k": k, "separation": {k_: (float(np.mean(v)), float(np.std(v, ddof=1)), scores[k_])
                                   for k_, v in negated.items()},
            "sd_of_seed_mean": spread, "own_means": own_means, "sd_upper": sd, "n": n, "underpowered": short,
            "effect_at_80": effect, "controls_sd": control_sd, "controls_power": controls(n),
            "costs": cost.__dict__, "pilot_hours": spent / PROCESSES / 3600, "budget": plan_,
            "resumed": sum(not ran_whole(r, a) for r in rows for a in r["arms"]),
            "after_cuts": None if final == n else {
                "n": final, "power": power(final, TARGET, sd, ALPHA_CALLS),
                "effect_at_80": effect_at_power(final, sd), "controls_power": controls(final)}}


def markdown(p: dict) -> str:
    """Part 2's numbers, as the rules give them, with what each is computed from."""
    b, after = p["budget"], p["after_cuts"]
    n = after["n"] if after else p["n"]
    levels = ", ".join(f"{preset} 0.05 / {tests}" for preset, tests in CONTROL_FAMILIES.items())
    lines = ["# The branches pilot: what its rules give (results/preregistration-branches.md, part 2)", "",
             "1. k: the per-point negated - none differences (mean, SD, -mean / SD, points): "
             + "; ".join(f"k = {k}: {m:+.3f}, {s:.3f}, {r:+.3f}" for k, (m, s, r) in p["separation"].items())
             + f". **k = {p['k']}**.",
             "2. The SD of a seed's mean d - chance (per-point SD / sqrt(points)), and its upper 80% bound: "
             + "; ".join(f"{pol} {sd:.3f} ({up:.3f})" for pol, (sd, up) in p["sd_of_seed_mean"].items())
             + ". The seeds' own means: " + "; ".join(f"{pol} " + ", ".join(f"{s} {m:+.2f}" for s, m in ms.items())
                                                      for pol, ms in p["own_means"].items())
             + f". **n = {p['n']}**" + (f", underpowered: 80% power against {p['effect_at_80']:.1f} points (a "
                                       "0.1-point grid)" if p["underpowered"] else ", 80% power against 1 point")
             + " (10,000 draws of numpy.random.default_rng(0) for each n).",
             f"   The controls' power at n against the pilot's negated - none (its SD of a seed's mean, the larger "
             f"receiver's at its upper bound, {p['controls_sd']:.3f}; levels {levels}): "
             + ", ".join(f"{preset} {v:.2f}" for preset, v in p["controls_power"].items()) + ".",
             f"3. Seconds of one process: a trunk iteration {p['costs']['trunk_iteration']:.1f}, a branch at k "
             f"{p['costs']['branch']:.1f} (whole branches; those resumed after a kill, counted at the mean: "
             f"{p['resumed']}). The pilot took {p['pilot_hours']:.2f} h of two processes; "
             f"{b['hours_left']:.2f} h left; the calls take {b['hours']:.2f} h"
             + (", **over the budget** even at 9 seeds" if b["over budget"] else "") + ". Cuts: "
             + ("; ".join(b["cuts"]) if b["cuts"] else "none")
             + f". qwen-llama {b['qwen-llama seeds']} seeds; trio-prose {b['trio-prose seeds']} seeds, "
             f"{b['trio-prose arms']} arms, points {b['trio-prose points']}."]
    if after:
        lines.append(f"   At the {after['n']} seeds the budget leaves: power {after['power']:.2f} against 1 point, 80% "
                     f"against {after['effect_at_80']:.1f}; the controls' "
                     + ", ".join(f"{preset} {v:.2f}" for preset, v in after["controls_power"].items()) + ".")
    lines.append(f"\nThe calls' seeds: {FIRST_CALL_SEED}-{FIRST_CALL_SEED + n - 1}.")
    return "\n".join(lines) + "\n"
