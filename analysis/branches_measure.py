"""Which held-out measure the branches read (results/preregistration-branches-measure.md), from the study's rows
alone: per cell (a measure at a k), the pilot seeds' `negated - none` differences and the controls' power they
give, the cell chosen by the registered rule, and the checks that the study's branches reproduce the pilot's.

    python -m benchmarks.branches measure results/branches-measure-k1 results/branches-measure-k5 \\
        --pilot results/branches-pilot results/branches-pilot-k10

The power is part 1's simulation (analysis/branches_plan.py): the SD of a seed's mean is the larger receiver's
per-point SD / sqrt(points), at its upper 80% bound; the exact two-sided sign-flip test at 0.05 / 6 (the controls'
family at qwen-llama), at the most seeds part 1 allows.
"""

from __future__ import annotations

import numpy as np

from analysis import branches_plan as plan

MEASURES = {"accuracy": plan.POINTS, "iw_reward": plan.POINTS, "loglik": 1.0}
"""each measure (A, R, L) and the factor to its units (UNITS); ties go in this order"""
UNITS = {"accuracy": "points", "iw_reward": "points", "loglik": "nats"}
HELPERS = ("second-group", "sgt")
"""the controls that must help; one must have a positive mean in the chosen cell"""
STUDY_K = (1, 5)
"""the branch lengths the study runs each measure at"""
SEEDS = plan.SEED_COUNTS[-1]
CONTROLS_ALPHA = 0.05 / plan.CONTROL_FAMILIES["qwen-llama"]


def measured_rows(rows: list[dict]) -> list[dict]:
    """The rows, each of which must carry its runs' measures (a row written without --measures is refused)."""
    unmeasured = [(r["seed"], r["point"], r["k"]) for r in rows if "measures" not in r]
    if unmeasured:
        raise ValueError(f"rows {unmeasured} carry no measures: run them again with --measures in a fresh folder")
    return rows


def as_measure(rows: list[dict], measure: str) -> list[dict]:
    """The rows with each run's `measure` in place of its logged accuracy, as branches_plan reads them."""
    measured_rows(rows)

    def values(run: dict) -> dict:
        return {policy: measured[measure] for policy, measured in run.items()}
    return [{**r, "trunk": values(r["measures"]["trunk"]),
             "arms": {arm: values(run) for arm, run in r["measures"].items() if arm != "trunk"}} for r in rows]


def controls_sd(rows: list[dict], scale: float, points: int) -> float:
    """The SD of a seed's mean `negated - none` over `points` branch points, at its upper 80% bound, for the
    receiver where it is largest (part 1's simulation)."""
    return max(plan.seed_mean_sd(plan.per_point(rows, [p], "negated", "none", scale), points)[1]
               for p in plan.policies_of(rows))


def cell(rows: list[dict], measure: str, draws: int = plan.DRAWS) -> dict:
    """One cell's `negated - none` (mean over every point and receiver, each receiver's SD), the controls' power,
    and each control that must help's mean against `none`, in the measure's units."""
    rows, scale = as_measure(rows, measure), MEASURES[measure]
    policies = plan.policies_of(rows)
    points = len({r["point"] for r in rows})
    negated = plan.per_point(rows, policies, "negated", "none", scale)
    sds = {p: float(np.std(plan.per_point(rows, [p], "negated", "none", scale), ddof=1)) for p in policies}
    control_sd = controls_sd(rows, scale, points)
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


def calls_plan(by_k: dict[int, list[dict]], pilot: list[dict], cells: dict[tuple[int, str], dict],
               chosen: tuple[int, str], arms: int, draws: int = plan.DRAWS, points: list[int] | None = None,
               cost_rows: list[dict] | None = None) -> dict:
    """Part 3's numbers: part 1's rules 2 and 3 on the chosen cell. The effect of interest is a third of the cell's
    |negated - none|; n is rule 2's, from the cell's `d - chance`; the budget is rule 3's, at the chosen k's
    seconds a trunk iteration and a whole branch in this study's rows, less what the pilot and the study spent.
    A design with other branch points a seed (`points`) takes a seed's mean over as many, its per-point spread the
    study's, and its seconds from rows run as it would run (`cost_rows`, on a pilot seed), which are charged too.
    The controls' power is given at n and at the most seeds."""
    k, measure = chosen
    rows, scale = as_measure(by_k[k], measure), MEASURES[measure]
    points = points or sorted({r["point"] for r in rows})
    effect = abs(cells[chosen]["mean"]) / 3
    spread = {p: plan.seed_mean_sd(plan.per_point(rows, [p], "d", "chance", scale), len(points))
              for p in plan.policies_of(rows)}
    sd = max(upper for _, upper in spread.values())
    n, short, effect_at_80 = plan.seed_count(sd, draws, effect)
    control_sd = controls_sd(rows, scale, len(points))
    timed = cost_rows or by_k[k]
    cost = plan.rate(timed)
    pilot_by_k = {k_: [r for r in pilot if r["k"] == k_] for k_ in sorted({r["k"] for r in pilot})}
    spent = {"pilot": plan.pilot_seconds(pilot_by_k, plan.costs(pilot_by_k, 5).trunk_iteration),
             "study": plan.pilot_seconds(by_k, plan.trunk_iteration_seconds(by_k[k]))}
    if cost_rows:
        spent["costs"] = plan.pilot_seconds({k: cost_rows}, cost.trunk_iteration)
    return {"effect": effect, "sd_of_seed_mean": spread, "sd_upper": sd, "n": n, "underpowered": short,
            "effect_at_80": effect_at_80, "costs": cost.__dict__, "points": points, "cell": chosen,
            "controls_sd": control_sd, "negated": cells[chosen]["mean"],
            "controls_power": {at: plan.power(at, cells[chosen]["mean"], control_sd, CONTROLS_ALPHA, draws)
                               for at in sorted({n, SEEDS})},
            "spent_hours": {what: seconds / plan.PROCESSES / 3600 for what, seconds in spent.items()},
            "budget": plan.budget(cost, sum(spent.values()), n, arms, points)}


def cut(calls: dict, live: list[dict], set_aside: list[dict], arms: int, lost_points: int,
        draws: int = plan.DRAWS) -> dict:
    """Part 3's calls under rule 3's last cut, from the calls' own seconds (analysis/branches_plan.fourth_cut), and
    the power at the seeds it leaves: against the effect of interest, and the controls' at 0.05 / 6."""
    left = plan.fourth_cut(live, set_aside, calls["budget"]["hours_left"], calls["n"], arms, calls["points"],
                           lost_points=lost_points)
    return {**left, "power": plan.power(left["n"], calls["effect"], calls["sd_upper"], plan.ALPHA_CALLS, draws),
            "controls_power": plan.power(left["n"], calls["negated"], calls["controls_sd"], CONTROLS_ALPHA, draws)}


def reproduced(study: list[dict], pilot: list[dict]) -> None:
    """The registered checks before the choice is read: the study is whole (both k, every seed at every point, the
    same in each); in every row, each run's measured accuracy is what it logged; at the pilot's k, each arm's
    logged accuracy is the pilot's, bit for bit."""
    design = {k: {(r["seed"], r["point"]) for r in study if r["k"] == k} for k in STUDY_K}
    if any(not cells or cells != design[STUDY_K[0]] for cells in design.values()) or \
            {r["k"] for r in study} != set(STUDY_K):
        raise ValueError(f"the study is not whole: (seed, point) per k {design}; run its every row first")
    pilot_rows = {(r["seed"], r["point"], r["k"]): r for r in pilot}
    for r in measured_rows(study):
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


def markdown(cells: dict[tuple[int, str], dict], chosen: tuple[int, str] | None, calls: dict | None = None,
             last_cut: dict | None = None) -> str:
    """The study's table and its choice, every cell's numbers beside it, part 3's numbers where a cell is chosen,
    and the seeds rule 3's last cut leaves them where it was applied."""
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
    if calls:
        b = calls["budget"]
        lines += ["", f"Part 3's numbers, {calls['cell'][1]} at k = {calls['cell'][0]} (part 1's rules 2 and 3):",
                  f"- the effect of interest, a third of |negated - none|: {calls['effect']:.4f};",
                  "- the SD of a seed's mean d - chance, and its upper 80% bound: "
                  + "; ".join(f"{p} {sd:.4f} ({up:.4f})" for p, (sd, up) in calls["sd_of_seed_mean"].items())
                  + f"; **n = {calls['n']}**" + (f", underpowered: 80% power against {calls['effect_at_80']:.4f}"
                                                  if calls["underpowered"] else ", 80% power against the effect") + ";",
                  f"- {len(calls['points'])} branch points a seed ({calls['points'][0]}-{calls['points'][-1]}); the "
                  "controls' power at 0.05 / 6: " + ", ".join(f"{p:.2f} at {at} seeds"
                                                               for at, p in calls["controls_power"].items()) + ";",
                  f"- seconds of one process: a trunk iteration {calls['costs']['trunk_iteration']:.1f}, a branch "
                  f"{calls['costs']['branch']:.1f}, a point's measures {calls['costs']['point']:.1f}; spent: "
                  + ", ".join(f"{what} {h:.2f} h" for what, h in calls["spent_hours"].items())
                  + f"; {b['hours_left']:.2f} h left; the calls take "
                  f"{b['hours']:.2f} h" + (", **over the budget**" if b["over budget"] else "") + "; cuts: "
                  + ("; ".join(b["cuts"]) if b["cuts"] else "none") + f"; qwen-llama {b['qwen-llama seeds']} seeds, "
                  f"trio-prose {b['trio-prose seeds']} seeds, {b['trio-prose arms']} arms, points "
                  f"{b['trio-prose points']}."]
    if last_cut:
        c, first = last_cut, plan.FIRST_CALL_SEED
        lines += ["", "Rule 3's last cut, from the calls' own seconds (no outcome read):",
                  f"- seconds of one process here: a trunk iteration {c['costs']['trunk_iteration']:.1f}, a branch "
                  f"{c['costs']['branch']:.1f}, a point's measures {c['costs']['point']:.1f}; a seed "
                  f"{c['seed_hours']:.2f} h of two processes;",
                  f"- the calls spent {c['spent_hours']:.2f} h ({c['lost_points']} points killed before their row "
                  f"included); {c['hours_left']:.2f} h left; the rest of **n = {c['n']}** seeds ({first}-"
                  f"{first + c['n'] - 1}) takes {c['hours']:.2f} h" + (", **over the budget**" if c["over budget"]
                                                                      else "") + ";",
                  f"- at n = {c['n']}: power {c['power']:.2f} against the effect of interest; the controls' power at "
                  f"0.05 / 6 {c['controls_power']:.2f}."]
    return "\n".join(lines) + "\n"
