"""The comparison's analysis from the run summaries alone (benchmarks/matrix.py writes them; issue 32).

    python eval.py --matrix results/pilot     # analysis.md, analysis.json, curves.png and plane.png in the folder
    python eval.py --matrix results/pilot results/matrix-main     # pooled seeds, written in the last folder

Primary metric: per policy, the area under the held-out greedy curve over iterations 0..I, in points (0-100;
curves.area_under). Per configuration, its mean and SD over seeds. Per contrast A - B and policy, the differences seed
by seed over the seeds both ran: their mean and SD (with its 95% chi-square interval), a 95% percentile bootstrap
interval over seeds and a bootstrap p-value (twice the share of resampled means on the far side of 0); then Holm's
step-down correction over the primary contrasts x policies: the adjusted p-value, and the interval at the level Holm
tests that hypothesis at (1 - alpha / (m - rank + 1), ranked by raw p-value); a hypothesis without two paired seeds
stays in the family at p = 1. "The better GRPO budget" is, per policy, the GRPO configuration with the higher mean
primary metric over the seeds the contrast analyzes (a tie goes to `none`). The same at equal update tokens and at equal
wall time: each run's accuracy against the cost it had spent, its area up to the cost the cheaper run of the pair
spent in all (the last segment cut by interpolation), over that cost. Per curated configuration and receiver, the
curator's admissions (ADMISSION), mean ± SD over seeds: what crossed and why. The seeds the matrix needs: 80% power
for a 2-point difference at the SD's upper 80% confidence bound, sd sqrt((n - 1) / chi2_0.2(n - 1)), by the paired
t-test's approximation n >= ((t_{1-alpha/2} + t_power) sd / 2)^2, t with n - 1 degrees of freedom.

The two hypotheses, per policy, each called supported, refuted or not resolved (results/preregistration.md):
H1 by the primary contrast cross-fidelity - sgt: supported where Holm rejects 0 with a positive mean, refuted
where the 95% interval lies below the proposal's smallest hoped gain (2 points); both are said where both hold.
H2 by the ratio of training reward variances cross-fidelity / sgt: the geometric mean of the per-seed ratios
with its 95% bootstrap interval, supported where the interval lies below 0.7, refuted where it lies above; not
computable where a run's reward variance is 0. Each is called again by a reading valid at its n
(results/reporting-rule.md: Holm over the family's exact sign-flip p-values, Student's t interval, for H2 that of
the log ratios), and the verdict reported is the word both readings give.

Runs are paired only within one class of metric-equivalent commits, as FOLDER/equivalent-commits.txt declares
(a line of commit hashes, a comment after #). Folders pool their summaries (as the matrix registration pools its
main block with the pilot): each run once, one class of commits over all, the analysis written in the last.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis import plots, verdicts
from analysis.curves import POINTS, area_under
from analysis.pairing import paired_seeds, unpaired_seeds
from analysis.stats import (bootstrap_means, bootstrap_p, fewest_seeds, holm, p_text, percentile_interval,
                            sd_interval, sd_upper_bound, sign_flip_p, t_interval, t_quantile)
GRPO_BUDGETS = ("none", "none-g16")
PRIMARY = (("cross-fidelity", "sgt"), ("cross-fidelity", "cross-fidelity-random"), ("cross-fidelity", GRPO_BUDGETS))
"""the pre-registered primary contrasts A - B (results/preregistration.md); a tuple B is the better of its
configurations"""
H1 = ("cross-fidelity", "sgt", 2.0)
"""H1 (the proposal's "Expected results"): cross-fidelity above the best static level, SGT, by 2-4 points"""
H2 = ("cross-fidelity", "sgt", 0.7)
"""H2: cross-fidelity's training reward variance at most 0.7 times SGT's (a reduction of 30% or more)"""
VIEWS = {"auc": None, "equal update tokens": "update_tokens", "equal wall time": "iteration_s"}
"""each view of a contrast, and the cost its runs are compared at (None: the primary metric, over iterations)"""
EQUIVALENCE_FILE = "equivalent-commits.txt"
ADMISSION = {"fidelity/offered": "offered", "fidelity/could_matter": "could matter",
             "fidelity/admitted_prp": "PRP", "fidelity/admitted_xgrpo": "XGRPO", "fidelity/admitted_sgt": "SGT",
             "fidelity/rejected": "rejected", "fidelity/d_mean": "D", "fidelity/tbd_mean": "TBD",
             "fidelity/ccm_mean": "CCM", "fidelity/rsd_mean": "RSD"}
"""a curated configuration's diagnostics, each the run's mean per iteration (fidelity_record.fidelity_metrics):
offers, the share of them that could matter, the admission shares among those (0 in an iteration where none
could), mean D and terms of the diagnosed; with what was received, they show why a curator did or did not win"""


@dataclass(frozen=True)
class AnalysisConfig:
    alpha: float = 0.05
    """two-sided level of each interval, and the family-wise error rate Holm controls"""
    resamples: int = 10_000
    """bootstrap resamples of the seeds"""
    bootstrap_seed: int = 0
    """the bootstrap's random stream, so that a report is repeatable"""
    target: float = 2.0
    """the difference in points the matrix should detect"""
    power: float = 0.8
    """the matrix's power against `target`"""
    sd_confidence: float = 0.8
    """the one-sided confidence of the SD's upper bound the seed count is computed at"""
    pair_by_start: bool = True
    """pair two runs of a seed only where they started from the same weights (results/preregistration-repair.md);
    False pairs every seed both ran, as the analyses published before that registration did"""


# ---------------------------------------------------------------------------------------------------------------
# Summaries and their commits
# ---------------------------------------------------------------------------------------------------------------

def equivalence_classes(paths: list[Path]) -> dict[str, int]:
    """commit -> class number, one class per line of the files at `paths` that exist (hashes separated by spaces,
    # comments), lines that share a commit merged; a commit in no line is a class of its own."""
    lines = [line.split("#")[0].split() for path in paths if path.exists() for line in path.read_text().splitlines()]
    classes: list[set[str]] = []
    for commits in filter(None, lines):
        merged = set(commits)
        for other in [c for c in classes if c & merged]:
            merged |= other
            classes.remove(other)
        classes.append(merged)
    return {commit: k for k, members in enumerate(classes) for commit in members}


def is_summary(path: Path) -> bool:
    """A run's summary is named CONFIGURATION-sSEED.json (matrix.py); the analyses written beside them are not."""
    return re.fullmatch(r".+-s\d+\.json", Path(path).name) is not None


SUMMARY_FIELDS = {"configuration", "seed", "shared", "commits", "iterations", "policies", "iteration_s"}
POLICY_FIELDS = {"heldout", "reward_mean", "reward_variance", "spent", "crossed"}
"""what every run summary holds, and each of its policies (benchmarks/matrix.py, summarize)"""


def load(*folders: Path, declarations: list[Path] | None = None) -> list[dict]:
    """Every summary of the folders, refused where one lacks a field, where two are of one (configuration, seed),
    where their shared flags or evaluation iterations differ, where a held-out accuracy is not finite, or where
    their commits span more than one class of metric-equivalent commits, as the folders' own declarations (or
    `declarations`) say."""
    folder = " + ".join(str(f) for f in folders)
    paths = [p for f in folders for p in sorted(Path(f).glob("*.json")) if is_summary(p)]
    if not paths:
        raise FileNotFoundError(f"no run summaries in {folder}")
    summaries = [json.loads(p.read_text()) for p in paths]
    for path, s in zip(paths, summaries):
        missing = sorted(SUMMARY_FIELDS - set(s)) or sorted(
            {f"policies.{name}.{key}" for name, m in s["policies"].items() for key in POLICY_FIELDS - set(m)})
        if missing:
            raise ValueError(f"{path}: a run summary without {', '.join(missing)}; remove it and run its set "
                             f"again with benchmarks/matrix.py, which summarizes the finished run anew")
    runs = [(s["configuration"], s["seed"]) for s in summaries]
    twice = sorted({r for r in runs if runs.count(r) > 1})
    if twice:
        raise ValueError(f"{folder}: more than one summary of {twice}")
    shared = {tuple(s["shared"]) for s in summaries}
    if len(shared) > 1:
        raise ValueError(f"{folder}: runs with different shared flags (evaluation, schedule): {sorted(shared)}")
    schedules = {(s["iterations"], tuple(i for i, _ in m["heldout"]))
                 for s in summaries for m in s["policies"].values()}
    if len(schedules) > 1:
        raise ValueError(f"{folder}: runs evaluated at different iterations, not comparable: {sorted(schedules)}")
    broken = sorted({(s["configuration"], s["seed"]) for s in summaries for m in s["policies"].values()
                     if not all(math.isfinite(a) for _, a in m["heldout"])})
    if broken:
        raise ValueError(f"{folder}: non-finite held-out accuracy in {broken}; rerun those runs")
    classes = equivalence_classes([Path(f) / EQUIVALENCE_FILE for f in folders] if declarations is None
                                  else declarations)
    spanned = {classes.get(c, c) for s in summaries for c in s["commits"]}
    if len(spanned) > 1:
        commits = sorted({c for s in summaries for c in s["commits"]})
        raise ValueError(f"{folder}: runs made at commits {commits}, not declared metric-equivalent in "
                         f"{EQUIVALENCE_FILE}; rerun them at one commit or declare them there")
    return summaries


# ---------------------------------------------------------------------------------------------------------------
# One run's metrics, and the paired differences
# ---------------------------------------------------------------------------------------------------------------

def primary_metric(summary: dict, policy: str) -> float:
    """The area under the held-out greedy curve over iterations 0..I, in points."""
    return POINTS * area_under(summary["policies"][policy]["heldout"], summary["iterations"])


def cost_spent(summary: dict, policy: str, cost: str) -> float:
    return summary["policies"][policy]["spent"][cost][-1][1]


def area_at_cost(summary: dict, policy: str, cost: str, budget: float) -> float:
    """The area under held-out accuracy against the cost spent, up to `budget`, in points."""
    mine = summary["policies"][policy]
    points = [(spent, accuracy) for (_, spent), (_, accuracy) in zip(mine["spent"][cost], mine["heldout"])]
    return POINTS * area_under(points, budget)


def paired_differences(a: dict[int, dict], b: dict[int, dict], policy: str, view: str, by_start: bool
                       ) -> dict[int, float]:
    """seed -> metric(a) - metric(b) over the paired seeds (a, b: seed -> summary; `paired_seeds`). At a cost,
    both runs of a seed are read at the cost the cheaper one spent."""
    out = {}
    for seed in paired_seeds(a, b, by_start):
        cost = VIEWS[view]
        if cost is None:
            out[seed] = primary_metric(a[seed], policy) - primary_metric(b[seed], policy)
        else:
            budget = min(cost_spent(a[seed], policy, cost), cost_spent(b[seed], policy, cost))
            out[seed] = area_at_cost(a[seed], policy, cost, budget) - area_at_cost(b[seed], policy, cost, budget)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Seeds for the matrix
# ---------------------------------------------------------------------------------------------------------------

def seeds_for_power(sd: float, cfg: AnalysisConfig) -> int:
    """The fewest seeds (at least 2) whose paired t-test has power cfg.power against cfg.target at SD `sd`."""
    def enough(n: int) -> bool:
        quantiles = t_quantile(1 - cfg.alpha / 2, n - 1) + t_quantile(cfg.power, n - 1)
        return quantiles * sd / math.sqrt(n) <= cfg.target
    return fewest_seeds(enough, f"power {cfg.power} against {cfg.target} at SD {sd}")


# ---------------------------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------------------------

def mean_sd(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
    return mean, sd


def analyze(summaries: list[dict], cfg: AnalysisConfig = AnalysisConfig()) -> dict:
    by_config: dict[str, dict[int, dict]] = {}
    for s in summaries:
        by_config.setdefault(s["configuration"], {})[s["seed"]] = s
    policies = list(summaries[0]["policies"])
    out: dict = {"config": asdict(cfg), "configurations": {}, "contrasts": {}}
    out["training_s"] = {name: mean_sd([r["iteration_s"] for r in runs.values()]) for name, runs in by_config.items()}
    for name, runs in by_config.items():
        out["configurations"][name] = {
            policy: {"seeds": sorted(runs), "auc": mean_sd([primary_metric(r, policy) for r in runs.values()]),
                     "reward_variance": mean_sd([r["policies"][policy]["reward_variance"] for r in runs.values()]),
                     "received": mean_sd([r["policies"][policy]["crossed"].get("sharing/received", 0.0)
                                          for r in runs.values()]),
                     "admission": admission(list(runs.values()), policy)}
            for policy in policies}
    out["missing"] = {}
    for view in VIEWS:
        rows, missing = [], []
        for a, b in PRIMARY:
            for policy in policies:
                against = better(b, a, by_config, policy, cfg.pair_by_start) if isinstance(b, tuple) else b
                ran = a in by_config and against in by_config
                differences = (paired_differences(by_config[a], by_config[against], policy, view, cfg.pair_by_start)
                               if ran else {})
                if len(differences) < 2:
                    missing.append(f"{a} - {against} ({policy})")
                    continue
                unpaired = unpaired_seeds(by_config[a], by_config[against]) if cfg.pair_by_start else {}
                rows.append({**contrast_row(a, against, policy, differences, cfg), "unpaired": unpaired})
        # a hypothesis without two paired seeds stays in Holm's family at p = 1, so the family is the registered one
        holm_family(rows, cfg, absent=len(missing))
        out["contrasts"][view], out["missing"][view] = rows, missing
    out["seeds_for_matrix"] = max((r["seeds_for_matrix"] for r in out["contrasts"]["auc"]), default=None)
    out["hypotheses"] = [row for policy in policies for row in hypotheses(by_config, out["contrasts"]["auc"],
                                                                          policy, cfg)]
    return out


def holm_family(rows: list[dict], cfg: AnalysisConfig, absent: int = 0) -> None:
    """Holm over a family's contrast rows (and `absent` hypotheses that count at p = 1): each row gets its
    adjusted p-value, its interval at the level Holm tests it at, and whether it is rejected; and the same Holm
    over the rows' exact sign-flip p-values, the reading valid at its n (results/reporting-rule.md, 2)."""
    adjusted, levels, rejected = holm([r["p"] for r in rows] + [1.0] * absent, cfg.alpha)
    exact_adjusted, _, exact_rejected = holm([r["sign_flip_p"] for r in rows] + [1.0] * absent, cfg.alpha)
    for row, p, level, reject, exact_p, exact_reject in zip(rows, adjusted, levels, rejected, exact_adjusted,
                                                           exact_rejected):
        means = bootstrap_means(list(row["differences"].values()), cfg.resamples, cfg.bootstrap_seed)
        row.update(holm_p=p, holm_interval=percentile_interval(means, 1 - level), holm_rejected=reject,
                   exact_holm_p=exact_p, exact_rejected=exact_reject)


def admission(runs: list[dict], policy: str) -> dict[str, tuple[float, float]]:
    """Mean and SD over seeds of each ADMISSION diagnostic that every run logged for `policy` as receiver; empty
    for a configuration without a curator."""
    logged = [r["policies"][policy]["crossed"] for r in runs]
    if not all("fidelity/offered" in c for c in logged):
        return {}
    return {key: mean_sd([c[key] for c in logged]) for key in ADMISSION if all(key in c for c in logged)}


def admission_table(curated: list[tuple[str, str, dict]]) -> list[str]:
    """The lines of the admissions' table, one row per (configuration, receiving policy, its `admission`)."""
    lines = ["Offers into the policy; the share of them that could matter; the admission shares among those; "
             "D and the terms of the diagnosed offers.\n",
             "| configuration | into | " + " | ".join(ADMISSION.values()) + " |", "|---" * (2 + len(ADMISSION)) + "|"]
    for name, policy, got in curated:
        lines.append(f"| {name} | {policy} | " + " | ".join(ms(got[key]) if key in got else "—" for key in ADMISSION)
                     + " |")
    return lines


def h1_text(parts: verdicts.Labels) -> str:
    """H1's call as printed from its (Holm label, margin label)."""
    supported, refuted = parts
    if supported and refuted:
        return f"supported above {H1[1]}, refuted at +{H1[2]:g} points or more"
    return supported or refuted or "not resolved"


def h2_text(parts: verdicts.Labels) -> str:
    return parts[0] or "not resolved"


def hypotheses(by_config: dict, auc_rows: list[dict], policy: str, cfg: AnalysisConfig) -> list[dict]:
    """H1 and H2 for `policy`, where both of their configurations ran on at least two common seeds: each with its
    registered verdict, its verdict at n (results/reporting-rule.md: H1 by Holm over the exact sign-flip p-values
    and the t interval, H2 by the t interval of the log ratios) and the verdict the rule reports."""
    rows = []
    a, b, gain = H1
    h1 = [r for r in auc_rows if r["contrast"] == f"{a} - {b}" and r["policy"] == policy]
    if h1:
        r = h1[0]
        registered = ("supported" if r["holm_rejected"] and r["mean"] > 0 else None,
                      "refuted" if r["interval"][1] < gain else None)
        at_n = ("supported" if r["exact_rejected"] and r["mean"] > 0 else None,
                "refuted" if r["t_interval"][1] < gain else None)
        rows.append({"hypothesis": "H1", "policy": policy, "estimate": r["mean"], "interval": r["interval"],
                     "t_interval": r["t_interval"], "sign_flip_p": r["sign_flip_p"], "seeds": len(r["differences"]),
                     "verdict": h1_text(registered), "verdict_at_n": h1_text(at_n),
                     "reported": verdicts.reported(registered, at_n, h1_text)})
    a, b, bound = H2
    common = paired_seeds(by_config.get(a, {}), by_config.get(b, {}), cfg.pair_by_start)
    if len(common) < 2:
        return rows
    pairs = [(by_config[a][s]["policies"][policy]["reward_variance"],
              by_config[b][s]["policies"][policy]["reward_variance"]) for s in common]
    if not all(math.isfinite(x) and x > 0 for pair in pairs for x in pair):
        verdict = "not computable: a run's reward variance is 0 or not finite"
        return rows + [{"hypothesis": "H2", "policy": policy, "estimate": math.nan, "interval": (math.nan, math.nan),
                        "t_interval": (math.nan, math.nan), "sign_flip_p": math.nan, "seeds": len(common),
                        "verdict": verdict, "verdict_at_n": verdict, "reported": verdict}]
    logs = [math.log(x / y) for x, y in pairs]
    low, high = (math.exp(x) for x in percentile_interval(
        bootstrap_means(logs, cfg.resamples, cfg.bootstrap_seed), 1 - cfg.alpha))
    t_low, t_high = (math.exp(x) for x in t_interval(logs, 1 - cfg.alpha))

    def label(low: float, high: float) -> verdicts.Labels:
        return ("supported" if high < bound else "refuted" if low > bound else None),
    registered, at_n = label(low, high), label(t_low, t_high)
    rows.append({"hypothesis": "H2", "policy": policy, "estimate": math.exp(sum(logs) / len(logs)),
                 "interval": (low, high), "t_interval": (t_low, t_high),
                 "sign_flip_p": sign_flip_p([x - math.log(bound) for x in logs]), "seeds": len(common),
                 "verdict": h2_text(registered), "verdict_at_n": h2_text(at_n),
                 "reported": verdicts.reported(registered, at_n, h2_text)})
    return rows


def better(candidates: tuple[str, ...], a: str, by_config: dict, policy: str, by_start: bool) -> str:
    """Of `candidates` that ran, the one with the higher mean primary metric for `policy` over the seeds where `a`
    is paired with all of them (the seeds the contrast analyzes); a tie goes to the first named."""
    ran = [c for c in candidates if c in by_config]
    common = set(by_config.get(a, {})).intersection(*(paired_seeds(by_config.get(a, {}), by_config[c], by_start)
                                                      for c in ran))
    if not ran or not common:
        return (ran or candidates)[0]
    return max(ran, key=lambda c: sum(primary_metric(by_config[c][s], policy) for s in common))


def contrast_row(a: str, b: str, policy: str, differences: dict[int, float], cfg: AnalysisConfig) -> dict:
    values = list(differences.values())
    if len(values) < 2:
        raise ValueError(f"{a} - {b} ({policy}): {len(values)} paired seeds, and a contrast needs two")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{a} - {b} ({policy}): a paired difference is not finite, {differences}")
    mean, sd = mean_sd(values)
    means = bootstrap_means(values, cfg.resamples, cfg.bootstrap_seed)
    upper = sd_upper_bound(sd, len(values), cfg.sd_confidence)
    return {"contrast": f"{a} - {b}", "policy": policy, "differences": differences, "mean": mean, "sd": sd,
            "t_interval": t_interval(values, 1 - cfg.alpha), "sd_interval": sd_interval(sd, len(values), 1 - cfg.alpha),
            "interval": percentile_interval(means, 1 - cfg.alpha), "p": bootstrap_p(means),
            "sign_flip_p": sign_flip_p(values), "sd_upper": upper,
            "seeds_for_matrix": seeds_for_power(upper, cfg) if upper > 0 else 2}


def ms(pair: tuple[float, float], digits: int = 2) -> str:
    """A (mean, SD) pair as the tables print it."""
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def unpaired_notes(rows: list[dict]) -> list[str]:
    """Under a table of contrasts: each unpaired seed left out of a contrast, with the two starts that part it."""
    notes = {(r["contrast"], seed): why for r in rows for seed, why in r.get("unpaired", {}).items()}
    return [f"\nUnpaired, left out of {contrast}: seed {seed}, {why}." for (contrast, seed), why in notes.items()]


def markdown(result: dict) -> str:
    smallest = 2 / result["config"]["resamples"]      # the smallest non-zero bootstrap p-value

    def pv(p: float) -> str:
        return f"< {smallest:.4f}" if p < smallest else f"{p:.3f}"
    lines = ["# The comparison: the analysis of its run summaries\n",
             "Primary metric: area under the held-out greedy curve, points (0-100), mean ± SD over seeds. Two runs "
             "of a seed are paired only where they started from the same weights (results/preregistration-repair.md); "
             "the exact sign-flip p beside the registered bootstrap p is descriptive. Training s: a run's iterations' "
             "wall time without its evaluations (perf/iteration_s summed), both policies, beside another run.\n",
             "| configuration | policy | seeds | AUC | reward variance (x1e4) | received per iteration | training s |",
             "|---|---|---|---|---|---|---|"]
    for name, per_policy in result["configurations"].items():
        for policy, m in per_policy.items():
            variance = (1e4 * m["reward_variance"][0], 1e4 * m["reward_variance"][1])
            lines.append(f"| {name} | {policy} | {len(m['seeds'])} | {ms(m['auc'])} | {ms(variance)} "
                         f"| {ms(m['received'], 1)} | {ms(result['training_s'][name], 0)} |")
    for view, rows in result["contrasts"].items():
        lines += ["", f"## Primary contrasts, {view}: paired differences seed by seed, points\n",
                  "| contrast | policy | per-seed difference | unpaired, left out | mean | SD | 95% interval | p "
                  "| sign-flip p | Holm p | Holm interval | Holm rejects | sign-flip Holm p | SD 95% interval "
                  "| SD upper 80% | seeds for the matrix |", "|---" * 16 + "|"]
        for r in rows:
            seeds = " ".join(f"{d:+.2f}" for d in r["differences"].values())
            left_out = " ".join(map(str, r["unpaired"])) or "—"
            lines.append(f"| {r['contrast']} | {r['policy']} | {seeds} | {left_out} | {r['mean']:+.2f} | {r['sd']:.2f} "
                         f"| [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}] | {pv(r['p'])} "
                         f"| {p_text(r['sign_flip_p'])} | {pv(r['holm_p'])} "
                         f"| [{r['holm_interval'][0]:+.2f}, {r['holm_interval'][1]:+.2f}] | {r['holm_rejected']} "
                         f"| {p_text(r['exact_holm_p'])} | [{r['sd_interval'][0]:.2f}, {r['sd_interval'][1]:.2f}] "
                         f"| {r['sd_upper']:.2f} "
                         f"| {r['seeds_for_matrix']} |")
        lines += unpaired_notes(rows)
        if result["missing"][view]:
            lines += ["", "Fewer than two paired seeds, so in Holm's family at p = 1: "
                      + ", ".join(result["missing"][view]) + "."]
    lines += ["", f"Seeds the matrix needs (the largest over the primary hypotheses above, at equal iterations): "
              f"{result['seeds_for_matrix']}."]
    curated = [(name, policy, m["admission"]) for name, per_policy in result["configurations"].items()
               for policy, m in per_policy.items() if m["admission"]]
    if curated:
        lines += ["", "## The curator's admissions: per iteration, mean ± SD over seeds\n", *admission_table(curated)]
    lines += ["", "## Hypotheses\n",
              f"H1: {H1[0]} - {H1[1]}, points (hoped: +{H1[2]:g} or more). H2: reward variance {H2[0]} / {H2[1]}, "
              f"geometric mean over seeds (hoped: below {H2[2]:g}).\n",
              "The registered verdict, the verdict at n (H1: Holm over the exact sign-flip p-values of the primary "
              "family and the t interval; H2: the t interval of the log ratios; the sign-flip p is H1's against 0 and "
              f"H2's against {H2[2]:g}) and the verdict reported (results/reporting-rule.md: a word where both give "
              "it).\n",
              "| hypothesis | policy | seeds | estimate | 95% interval | t interval | sign-flip p | registered verdict "
              "| verdict at n | reported |", "|---" * 10 + "|"]
    for h in result["hypotheses"]:
        form = "+.2f" if h["hypothesis"] == "H1" else ".3f"     # a difference in points, a ratio
        lines.append(f"| {h['hypothesis']} | {h['policy']} | {h['seeds']} | {h['estimate']:{form}} "
                     f"| [{h['interval'][0]:{form}}, {h['interval'][1]:{form}}] "
                     f"| [{h['t_interval'][0]:{form}}, {h['t_interval'][1]:{form}}] | {p_text(h['sign_flip_p'])} "
                     f"| {h['verdict']} | {h['verdict_at_n']} | {h['reported']} |")
    return "\n".join(lines) + "\n"


def report(folders: list[Path], cfg: AnalysisConfig = AnalysisConfig()) -> str:
    """The analysis of the folders' summaries pooled: analysis.md, analysis.json and the two plots written in the
    last folder."""
    summaries = load(*folders)
    result = analyze(summaries, cfg)
    text = markdown(result)
    out = Path(folders[-1])
    (out / "analysis.md").write_text(text)
    (out / "analysis.json").write_text(json.dumps(result, indent=1))
    plots.plot(summaries, result, out)
    return text
