"""Which held-out measure the branches read (results/preregistration-branches-measure.md), from the study's rows
alone: per cell (a measure at a k), the pilot seeds' `negated - none` differences and the controls' power they
give, the cell chosen by the registered rule, and the checks that the study's branches reproduce the pilot's.

    python -m benchmarks.branches measure results/branches-measure-k1 results/branches-measure-k5 \\
        --pilot results/branches-pilot

The power is part 1's simulation (analysis/branches_plan.py): the SD of a seed's mean is the larger receiver's
per-point SD / sqrt(points), at its upper 80% bound; the exact two-sided sign-flip test at 0.05 / 6 (the controls'
family at qwen-llama), at the most seeds part 1 allows.
"""

from __future__ import annotations

import numpy as np

from analysis import branches_plan as plan

MEASURES = {"accuracy": plan.POINTS, "iw_reward": plan.POINTS, "loglik": 1.0}
"""each measure (A, R, L) and the factor to its units: points, points, nats a problem; ties go in this order"""
HELPERS = ("second-group", "sgt")
"""the controls that must help; one must have a positive mean in the chosen cell"""
SEEDS = plan.SEED_COUNTS[-1]
CONTROLS_ALPHA = 0.05 / plan.CONTROL_FAMILIES["qwen-llama"]


def as_measure(rows: list[dict], measure: str) -> list[dict]:
    """The rows with each run's `measure` in place of its logged accuracy, as branches_plan reads them."""
    def values(run: dict) -> dict:
        return {policy: measured[measure] for policy, measured in run.items()}
    return [{**r, "trunk": values(r["measures"]["trunk"]),
             "arms": {arm: values(run) for arm, run in r["measures"].items() if arm != "trunk"}} for r in rows]


def cell(rows: list[dict], measure: str, draws: int = plan.DRAWS) -> dict:
    """One cell's `negated - none` (mean over every point and receiver, each receiver's SD), the controls' power,
    and each control that must help's mean against `none`, in the measure's units."""
    rows, scale = as_measure(rows, measure), MEASURES[measure]
    policies = plan.policies_of(rows)
    points = len({r["point"] for r in rows})
    negated = plan.per_point(rows, policies, "negated", "none", scale)
    sds = {p: float(np.std(plan.per_point(rows, [p], "negated", "none", scale), ddof=1)) for p in policies}
    control_sd = max(plan.seed_mean_sd(plan.per_point(rows, [p], "negated", "none", scale), points)[1]
                     for p in policies)
    return {"mean": float(np.mean(negated)), "sd": sds, "controls_sd": control_sd,
            "power": plan.power(SEEDS, float(np.mean(negated)), control_sd, CONTROLS_ALPHA, draws),
            "helps": {arm: float(np.mean(plan.per_point(rows, policies, arm, "none", scale))) for arm in HELPERS}}


def choice(by_k: dict[int, list[dict]], draws: int = plan.DRAWS
           ) -> tuple[dict[tuple[int, str], dict], tuple[int, str] | None]:
    """Every cell, and the chosen one: the largest power (ties to the smaller k, then A, R, L), used only where
    its power reaches 0.80 and a control that must help has a positive mean; None where no cell is used. The
    power is simulated with `draws` samples (the registered 10,000 by default)."""
    cells = {(k, m): cell(rows, m, draws) for k, rows in sorted(by_k.items()) for m in MEASURES}
    best = max(cells, key=lambda c: (cells[c]["power"], -c[0], -list(MEASURES).index(c[1])))
    usable = cells[best]["power"] >= plan.POWER and max(cells[best]["helps"].values()) > 0
    return cells, best if usable else None


def reproduced(study: list[dict], pilot: list[dict]) -> None:
    """The registered checks before the choice is read: in every study row, each run's measured accuracy is what
    it logged; at the pilot's k, each arm's logged accuracy is the pilot's, bit for bit."""
    pilot_rows = {(r["seed"], r["point"], r["k"]): r for r in pilot}
    for r in study:
        logged = {"trunk": r["trunk"], **r["arms"]}
        for run, measured in r["measures"].items():
            if {p: m["accuracy"] for p, m in measured.items()} != logged[run]:
                raise ValueError(f"seed {r['seed']} point {r['point']} k {r['k']}: {run}'s measured accuracy is not "
                                 "the one its run logged")
        twin = pilot_rows.get((r["seed"], r["point"], r["k"]))
        if twin is not None and (twin["trunk"] != r["trunk"]
                                 or any(twin["arms"][arm] != accuracy for arm, accuracy in r["arms"].items())):
            raise ValueError(f"seed {r['seed']} point {r['point']} k {r['k']}: the branches do not reproduce the "
                             "pilot's accuracies")


def markdown(cells: dict[tuple[int, str], dict], chosen: tuple[int, str] | None) -> str:
    """The study's table and its choice, every cell's numbers beside it."""
    lines = ["# The branches' measure: the study's cells (results/preregistration-branches-measure.md)", "",
             f"negated - none over every point and receiver; the controls' power at {SEEDS} seeds and 0.05 / 6.", "",
             "| k | measure | negated - none | SD per receiver | power | second-group - none | sgt - none |",
             "|---|---|---|---|---|---|---|"]
    for (k, m), c in cells.items():
        sds = ", ".join(f"{p} {sd:.3f}" for p, sd in c["sd"].items())
        lines.append(f"| {k} | {m} | {c['mean']:+.3f} | {sds} | {c['power']:.2f} | {c['helps']['second-group']:+.3f} "
                     f"| {c['helps']['sgt']:+.3f} |")
    lines += ["", f"**Chosen: {chosen[1]} at k = {chosen[0]}.**" if chosen else
              "**No cell is used**: none reaches power 0.80 with a control that must help moving up; no call is made."]
    return "\n".join(lines) + "\n"
