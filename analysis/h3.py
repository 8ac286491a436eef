"""H3 from its run summaries alone, called by the rule of results/preregistration-h3.md (issue 53): does a policy's
gain with two peers add up to its gains with each peer alone?

    python eval.py --blocks results        # H3's section of blocks.md and blocks.json in results/matrix

Per policy p and configuration c (sgt, hacpo, cross-fidelity), p's gain in grouping x on seed s,
G_x(s) = AUC_p(c, x, s) - AUC_p(none, x, s), in the trio and in p's two pairs, over the seeds where p started from
one and the same weights in all eight runs read (its fingerprint; where a summary records none, p's iteration-0
held-out accuracy). The ratio R = mean_s G_trio / mean_s (G_pair1 + G_pair2), its 95% percentile bootstrap interval
over seeds (seeds resampled, the ratio of means recomputed in each), its one-sided p against diminishing returns
(the share of resampled ratios at or below 0.5) and Holm over the 9: about linear where Holm rejects and the
interval holds 1, not resolved otherwise and wherever the denominator's own 95% interval holds 0. Beside the call,
never tested: the call again under other bootstrap seeds (how often other resamples repeat it), the reading of an
interval wholly below 1 (diminishing returns) or above it (superlinear), the additive form
G_trio - (G_pair1 + G_pair2) with its interval, and each run's mean AUC.

A seed unpaired in some contrast is named and left out of it, and the next fresh seed (from 6009) runs in full in
its place, itself read in turn. Nothing is computed before every run of the registered seeds and of the fresh
seeds owed is in: until then, counts of runs alone.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from analysis import matrix as ma
from analysis import pairing, stats, verdicts
from analysis.sets import H3_CONFIGURATIONS, H3_GROUPINGS as GROUPINGS, H3_SEEDS

SETS = {grouping: f"h3-{grouping}" for grouping in GROUPINGS}
"""each grouping of the trio's policies and the set that runs it (analysis/sets.py, SETS), its summaries in
results/SET"""
POLICIES = ("qwen", "llama", "mistral")
BASELINE = "none"
CONFIGURATIONS = tuple(c for c in H3_CONFIGURATIONS if c != BASELINE)
"""the configurations whose gains over BASELINE are compared: 3 policies x 3 configurations, the 9 Holm corrects"""
DIMINISHING = 0.5
"""the ratio at or below which gains diminish, the one-sided p-value's null"""
ZERO = 1e-9
"""a mean gain (points) within this of 0 is 0: where gains cancel, rounding must not pick the sign of x / 0, which
Amendment 1 gives by the numerator's, nor make 0 / 0 defined"""
OTHER_BOOTSTRAP_SEEDS = 20
"""the calls again under this many other bootstrap seeds, beside the registered seed's and not a call: where that
seed's resamples put a p at Holm's threshold, the count shows how often other resamples repeat the call"""
UNDERPOWERED = ("qwen",)
"""the policies the registration says H3 is underpowered for at its 8 seeds, reported so"""

Runs = dict[str, dict[str, dict[int, dict]]]
"""grouping -> configuration -> seed -> summary"""


def pairs_of(policy: str) -> tuple[str, str]:
    """The two pairs that hold `policy`."""
    pair1, pair2 = (g for g in GROUPINGS if g != "trio" and policy in g.split("-"))
    return pair1, pair2


def index(sets: dict[str, list[dict]]) -> Runs:
    """H3's summaries by grouping, configuration and seed (a configuration H3 does not register is not read)."""
    runs: Runs = {g: {c: {} for c in H3_CONFIGURATIONS} for g in GROUPINGS}
    for grouping in GROUPINGS:
        for s in sets.get(SETS[grouping], []):
            if s["configuration"] in runs[grouping]:
                runs[grouping][s["configuration"]][s["seed"]] = s
    return runs


def complete(runs: Runs, seed: int) -> bool:
    """Whether all 16 runs of the seed (4 groupings x 4 configurations) are in."""
    return all(seed in by_seed for by_config in runs.values() for by_seed in by_config.values())


def runs_read(runs: Runs, policy: str, configuration: str, seed: int) -> dict[tuple[str, str], dict]:
    """The eight runs p's contrast reads on a seed: (grouping, configuration) -> summary, for the configuration and
    the baseline in the trio and in p's two pairs."""
    return {(g, c): runs[g][c][seed] for g in ("trio", *pairs_of(policy)) for c in (configuration, BASELINE)}


def unpaired_reason(read: dict[tuple[str, str], dict], policy: str) -> str | None:
    """None where `policy` started from one and the same weights in every run read (its fingerprint where every
    summary records fingerprints, else its iteration-0 held-out accuracy, known in each); else the starts that part
    them, each with the runs that had it."""
    by_weights = all(s.get("start_fingerprints") for s in read.values())
    starts = {key: pairing.start_of(s if by_weights else {**s, "start_fingerprints": None}) for key, s in read.items()}
    mine = {key: start.get(policy) for key, (_, start) in starts.items()}
    if len(set(mine.values())) == 1 and None not in mine.values():
        return None
    kind = next(iter(starts.values()))[0]
    groups = {value: [f"{g} {c}" for (g, c), v in mine.items() if v == value] for value in dict.fromkeys(mine.values())}
    return f"{policy}'s {kind}: " + "; ".join(f"{'not known' if value is None else value} in {', '.join(names)}"
                                              for value, names in groups.items())


def seeds_to_read(runs: Runs) -> tuple[list[int], dict[tuple[str, str], dict[int, str]]]:
    """The seeds H3 reads, the registered ones and, for each seed unpaired in some contrast, the next fresh seed
    (read in turn); and (policy, configuration) -> seed -> why, over those seeds whose 16 runs are in."""
    def reasons(seed: int) -> dict[tuple[str, str], str] | None:
        if not complete(runs, seed):
            return None
        return {(p, c): why for p in POLICIES for c in CONFIGURATIONS
                if (why := unpaired_reason(runs_read(runs, p, c, seed), p)) is not None}
    seeds, by_seed = pairing.with_fresh_seeds(H3_SEEDS, reasons)
    unpaired: dict[tuple[str, str], dict[int, str]] = {}
    for seed, found in by_seed.items():
        for key, why in found.items():
            unpaired.setdefault(key, {})[seed] = why
    return seeds, unpaired


def gains(runs: Runs, policy: str, configuration: str, seeds: list[int]) -> dict[str, dict[int, float]]:
    """grouping -> seed -> G_x(s), p's AUC with the configuration less its AUC with the baseline, in points, in the
    trio and in p's two pairs."""
    def gain(grouping: str, seed: int) -> float:
        with_it, without = runs[grouping][configuration][seed], runs[grouping][BASELINE][seed]
        return ma.primary_metric(with_it, policy) - ma.primary_metric(without, policy)
    return {g: {s: gain(g, s) for s in seeds} for g in ("trio", *pairs_of(policy))}


def exact_zero(x: np.ndarray | float) -> np.ndarray:
    """x with every value within ZERO of 0 set to 0"""
    return np.where(np.abs(x) <= ZERO, 0.0, x)


def ratio_row(policy: str, configuration: str, by_grouping: dict[str, dict[int, float]], cfg: ma.AnalysisConfig
              ) -> dict:
    """One of the 9: the mean gains, the ratio R with its 95% percentile bootstrap interval over seeds, its
    one-sided p-value (the share of resampled ratios at or below DIMINISHING; an undefined 0 / 0 counts there, and
    leaves the interval undefined, so not called), the denominator's own interval and the additive form's. The
    seeds are resampled once for every quantity: one bootstrap seed draws the same seeds for values of one length
    (stats.bootstrap_means). Beside them, the readings valid at n (results/reporting-rule.md, 5): Fieller's 95%
    interval of R, and the one-sided exact sign-flip p of the per-seed trio - 0.5 x sum, turned by the sign of
    the sum's mean (for a positive sum, R > 0.5 is a positive mean of it)."""
    pair1, pair2 = pairs_of(policy)
    trio = np.array(list(by_grouping["trio"].values()))                                             # [seeds]
    pair_sum = np.array(list(by_grouping[pair1].values())) + np.array(list(by_grouping[pair2].values()))   # [seeds]
    trio_means, sum_means, additive_means = (stats.bootstrap_means(list(v), cfg.resamples, cfg.bootstrap_seed)
                                             for v in (trio, pair_sum, trio - pair_sum))      # each [resamples]
    trio_means, sum_means = exact_zero(trio_means), exact_zero(sum_means)
    with np.errstate(divide="ignore", invalid="ignore"):      # x / 0 is +-inf, 0 / 0 NaN
        ratios = trio_means / sum_means                                                       # [resamples]
        ratio = float(exact_zero(trio.mean()) / exact_zero(pair_sum.mean()))
    level = 1 - cfg.alpha
    return {"policy": policy, "configuration": configuration, "seeds": list(by_grouping["trio"]),
            "gains": by_grouping, "trio_gain": float(trio.mean()),
            "pair_gains": {g: float(np.mean(list(by_grouping[g].values()))) for g in (pair1, pair2)},
            "pair_sum": float(pair_sum.mean()), "denominator_interval": stats.percentile_interval(sum_means, level),
            "ratio": ratio, "interval": stats.percentile_interval(ratios, level),
            "p": float(np.mean(~(ratios > DIMINISHING))),
            "additive": float((trio - pair_sum).mean()),
            "additive_interval": stats.percentile_interval(additive_means, level),
            "fieller_interval": stats.fieller_interval(list(trio), list(pair_sum), level),
            "exact_p": stats.sign_flip_p(list(np.sign(pair_sum.mean()) * (trio - DIMINISHING * pair_sum)),
                                         alternative="greater")}


def holds(interval: tuple[float, float], value: float) -> bool:
    low, high = interval
    return low <= value <= high


def bounded(interval: tuple[float, float]) -> bool:
    return bool(np.isfinite(interval).all())


def registered_labels(row: dict) -> verdicts.Labels:
    """The registered call and its descriptive reading: about linear where Holm rejects R <= 0.5 and the 95%
    interval holds 1, unless the denominator's interval holds 0 (a ratio over a sum of gains not told from 0 is not
    read); diminishing returns where the interval lies wholly below 1, superlinear wholly above."""
    low, high = row["interval"]
    if holds(row["denominator_interval"], 0.0):
        return None, None
    linear = row["holm_rejected"] and holds(row["interval"], 1.0)
    return ("about linear" if linear else None,
            "diminishing returns" if high < 1 else "superlinear" if low > 1 else None)


def labels_at_n(row: dict) -> verdicts.Labels:
    """The same read validly at n (results/reporting-rule.md, 5): Holm over the exact one-sided sign-flip p-values
    of trio - 0.5 x sum, Fieller's interval (no word where it is unbounded)."""
    interval = row["fieller_interval"]
    if not bounded(interval):
        return None, None
    low, high = interval
    return ("about linear" if row["exact_rejected"] and holds(interval, 1.0) else None,
            "diminishing returns" if high < 1 else "superlinear" if low > 1 else None)


def labels_text(parts: verdicts.Labels) -> str:
    return "; ".join(p for p in parts if p) or "not resolved"


def reading_at_n(row: dict) -> str:
    """The reading at n, a description beside the call (results/reporting-rule.md, amendment 1): Fieller's
    interval wholly below 1 reads as diminishing returns, wholly above as superlinear; unbounded, no reading."""
    if not bounded(row["fieller_interval"]):
        return "not read (Fieller's interval is unbounded)"
    return labels_at_n(row)[1] or "—"


def call(row: dict) -> str:
    """The registered call: about linear where Holm rejects R <= 0.5 and the 95% interval holds 1, unless the
    denominator's interval holds 0."""
    return registered_labels(row)[0] or "not resolved"


def reading(row: dict) -> str:
    """Descriptive, beside the call: an interval wholly below 1 reads as diminishing returns, one wholly above as
    superlinear; no reading where the denominator's interval holds 0."""
    if holds(row["denominator_interval"], 0.0):
        return "not read (the sum of pair gains is not told from 0)"
    return registered_labels(row)[1] or "—"


def mean_aucs(runs: Runs, seeds: list[int]) -> list[dict]:
    """Each policy's mean AUC over the seeds read, per grouping that holds it and configuration (not tested)."""
    return [{"policy": p, "grouping": g, "auc": {c: float(np.mean([ma.primary_metric(runs[g][c][s], p) for s in seeds]))
                                                 for c in H3_CONFIGURATIONS}}
            for p in POLICIES for g in ("trio", *pairs_of(p))]


def analyze(sets: dict[str, list[dict]], cfg: ma.AnalysisConfig) -> dict:
    """H3 from its sets' summaries: "seeds", those it reads; "ran", each set's count of runs of those seeds;
    "unpaired", each seed left out of a contrast with why; and, only once every run of the seeds read is in,
    "rows", the 9 ratios with Holm and each called (and how many of OTHER_BOOTSTRAP_SEEDS call it about linear), and
    "auc", each run's mean AUC."""
    runs = index(sets)
    seeds, unpaired = seeds_to_read(runs)
    out = {"seeds": seeds, "ran": {SETS[g]: sum(s in by_seed for by_seed in runs[g].values() for s in seeds)
                                   for g in GROUPINGS},
           "unpaired": [{"policy": p, "configuration": c, "seed": seed, "why": why}
                        for (p, c), reasons in unpaired.items() for seed, why in reasons.items()],
           "rows": [], "auc": []}
    if not all(complete(runs, s) for s in seeds):
        return out
    rows = called_rows(runs, seeds, unpaired, cfg)
    elsewhere = [called_rows(runs, seeds, unpaired, replace(cfg, bootstrap_seed=cfg.bootstrap_seed + k))
                 for k in range(1, OTHER_BOOTSTRAP_SEEDS + 1)]
    for i, row in enumerate(rows):
        row["linear_elsewhere"] = sum(other[i]["call"] == "about linear" for other in elsewhere)
    out["rows"], out["auc"] = rows, mean_aucs(runs, seeds)
    return out


def called_rows(runs: Runs, seeds: list[int], unpaired: dict[tuple[str, str], dict[int, str]],
                cfg: ma.AnalysisConfig) -> list[dict]:
    """The 9 ratios over their paired seeds, with Holm over them, each called and read, by the registered rule and
    at n, and the call the reporting rule reports (the call where both readings give it; the readings, registered
    as descriptive, are never reported as a call: results/reporting-rule.md, amendment 1)."""
    rows = [ratio_row(p, c, gains(runs, p, c, [s for s in seeds if s not in unpaired.get((p, c), {})]), cfg)
            for p in POLICIES for c in CONFIGURATIONS]
    adjusted, _, rejected = stats.holm([r["p"] for r in rows], cfg.alpha)
    exact_adjusted, _, exact_rejected = stats.holm([r["exact_p"] for r in rows], cfg.alpha)
    for row, p, reject, exact_p, exact_reject in zip(rows, adjusted, rejected, exact_adjusted, exact_rejected):
        row.update(holm_p=p, holm_rejected=reject, exact_holm_p=exact_p, exact_rejected=exact_reject,
                   underpowered=row["policy"] in UNDERPOWERED)
        registered, at_n = registered_labels(row)[:1], labels_at_n(row)[:1]     # the call; the reading describes
        row.update(call=call(row), reading=reading(row), call_at_n=labels_text(at_n), reading_at_n=reading_at_n(row),
                   reported=verdicts.reported(registered, at_n, labels_text))
    return rows


def interval_text(interval: tuple[float, float], form: str = "+.2f") -> str:
    return f"[{interval[0]:{form}}, {interval[1]:{form}}]"


def markdown(result: dict) -> list[str]:
    """H3's section of the blocks report: its table once computed, else its counts of runs."""
    seeds = result["seeds"]
    lines = ["## H3: does a policy's gain with two peers add up to its gains with each peer alone? "
             "(results/preregistration-h3.md)\n",
             "Gain: the policy's AUC with the configuration less its AUC with none in the same grouping, points, mean "
             "over its paired seeds. R = trio gain / sum of pair gains, 95% percentile bootstrap interval over seeds; "
             f"p = share of resampled ratios at or below {DIMINISHING}, Holm over the 9; about linear where Holm "
             "rejects and the interval holds 1, not resolved otherwise and wherever the sum's own interval holds 0. "
             f"The call again under {OTHER_BOOTSTRAP_SEEDS} other bootstrap seeds (the registered one is "
             "AnalysisConfig's), trio - sum and the mean AUCs are descriptive, not tested. At n "
             "(results/reporting-rule.md): Fieller's 95% interval of R and Holm over the exact one-sided sign-flip "
             "p-values of trio - 0.5 x sum, the reading at n by Fieller's interval; reported: the call where both "
             "readings give it (a reading is a description, never reported as a call).\n"]
    if not result["rows"]:
        total = sum(result["ran"].values())
        per_set = len(seeds) * len(H3_CONFIGURATIONS)
        lines.append("No H3 run yet." if not total else
                     f"Incomplete, so not called and no outcome shown (H3 is called once every run of seeds "
                     f"{', '.join(map(str, seeds))} is in); runs so far: "
                     + ", ".join(f"{name} {n} of {per_set}" for name, n in result["ran"].items()) + ".")
    else:
        lines += ["| policy | configuration | seeds | trio gain | pair gains | sum of pair gains [95%] | R [95%] | p "
                  f"| Holm p | call | about linear under {OTHER_BOOTSTRAP_SEEDS} other bootstrap seeds | reading "
                  "| trio - sum [95%] | Fieller [95%] | sign-flip Holm p | call at n | reading at n | reported |",
                  "|---" * 18 + "|"]
    for r in result["rows"]:
        pairs = ", ".join(f"{g} {v:+.2f}" for g, v in r["pair_gains"].items())
        lines.append(f"| {r['policy']} | {r['configuration']} | {len(r['seeds'])} | {r['trio_gain']:+.2f} | {pairs} "
                     f"| {r['pair_sum']:+.2f} {interval_text(r['denominator_interval'])} "
                     f"| {r['ratio']:.2f} {interval_text(r['interval'], '.2f')} | {stats.p_text(r['p'])} "
                     f"| {stats.p_text(r['holm_p'])} | {r['call']}"
                     f"{' (underpowered, as registered)' if r['underpowered'] else ''} "
                     f"| {r['linear_elsewhere']} of {OTHER_BOOTSTRAP_SEEDS} | {r['reading']} "
                     f"| {r['additive']:+.2f} {interval_text(r['additive_interval'])} "
                     f"| {interval_text(r['fieller_interval'], '.2f')} | {stats.p_text(r['exact_holm_p'])} "
                     f"| {r['call_at_n']} | {r['reading_at_n']} | {r['reported']} |")
    for u in result["unpaired"]:
        lines.append(f"\nUnpaired, left out of {u['policy']} {u['configuration']}: seed {u['seed']} ({u['why']}).")
    fresh = [s for s in seeds if s not in H3_SEEDS]
    if fresh:
        lines.append(f"Fresh seeds in place of the unpaired, run in full: {', '.join(map(str, fresh))}.")
    if result["auc"]:
        lines += ["\nMean AUC of each run over the seeds read, points (not tested).\n",
                  "| policy | grouping | " + " | ".join(H3_CONFIGURATIONS) + " |",
                  "|---" * (2 + len(H3_CONFIGURATIONS)) + "|"]
        lines += [f"| {a['policy']} | {a['grouping']} | " + " | ".join(f"{v:.2f}" for v in a["auc"].values()) + " |"
                  for a in result["auc"]]
    return lines + [""]
