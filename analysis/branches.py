"""The branches' report from their rows alone (benchmarks/branches.py, issue 68): per preset, receiver and arm, the
arm's held-out measure at a branch's end (its logged accuracy, or a measure the row carries) less a reference arm's at
the same branch (the random arm, `chance`, and `none`), in the measure's units.

    python -m benchmarks.branches report results/branches      # report.md and report.png in the folder

The unit is the seed: a seed's branch points are one trunk's run, so its differences are averaged over its points
first (every seed at the same points: a folder with a seed cut short, or of several k, is refused), and the test is
over seeds, the exact two-sided sign-flip test (stats.sign_flip_p), with Student's t interval beside the mean
(results/reporting-rule.md). The controls come first: the arm that must hurt (negated) and the candidates that must
help (sgt, second-group) against `none`; a receiver whose controls do not separate from `none` is not called, and
the report says which failed. Then the registered calls (`calls`, results/preregistration-branches.md):
families A (each signal against chance) and B (against none) with Holm, and P1'/P2' over the cells that passed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

from analysis import branches_measure, stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POINTS = 100
"""accuracies in points"""
CONTROLS = ("negated", "second-group", "sgt")
"""the control that must hurt and the candidates that must help, read against `none` first"""
SIGNALS = ("d", "tbd", "ccm", "rsd")
"""the premise's arms: P1' (d) and P2' (each term), called against chance (family A) and none (family B)"""
MARGIN = 1.0
"""points: a contrast whose t interval lies within (-MARGIN, +MARGIN) is "within 1 point" """


@dataclass(frozen=True)
class Reading:
    """What the report reads of each run: its logged greedy accuracy in points with part 1's margin, or a measure
    of the measure study (branch_measures.py) in its units with the margin part 3 registers."""
    measure: str = "accuracy"
    margin: float = MARGIN
    margin_text: str = "1 point"

    @classmethod
    def of(cls, measure: str, margin: float) -> Reading:
        """The reading of `measure` with a margin in its units, said as "1 point" for part 1's."""
        units = branches_measure.UNITS[measure]
        return cls(measure, margin, f"{margin:.3g} {units[:-1] if margin == 1 else units}")

    @property
    def scale(self) -> float:
        return branches_measure.MEASURES[self.measure]

    @property
    def units(self) -> str:
        return branches_measure.UNITS[self.measure]

    @property
    def decimals(self) -> int:
        """a nat's differences between arms are thousandths, a point's tenths"""
        return 4 if self.units == "nats" else 2

    def words(self) -> dict[str, tuple[str, str, str]]:
        """each family's words (results/preregistration-branches.md): Holm's rejection up or down, or within the
        margin"""
        return {"chance": ("beats chance", "worse than chance", f"within {self.margin_text} of chance"),
                "none": ("helps", "hurts", f"within {self.margin_text} of none")}


ACCURACY = Reading()


def load(folder: Path) -> list[dict]:
    """Every row of the folder (benchmarks/branches.py writes PRESET-sSEED-itPOINT.json whole)."""
    rows = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*-s*-it*.json"))]
    if not rows:
        raise FileNotFoundError(f"no branch rows in {folder}")
    return rows


def one_design(rows: list[dict]) -> list[dict]:
    """The rows, refused unless they are one design: one k, and every seed of a preset at the same branch points,
    since a seed's mean over fewer points would count in the test as a whole seed."""
    if len({r["k"] for r in rows}) > 1:
        raise ValueError(f"rows of k {sorted({r['k'] for r in rows})} in one folder: report each k's rows apart")
    for preset in sorted({r["preset"] for r in rows}):
        points = {}
        for r in rows:
            if r["preset"] == preset:
                points.setdefault(r["seed"], set()).add(r["point"])
        every = set().union(*points.values())
        short = {seed: sorted(every - mine) for seed, mine in sorted(points.items()) if mine != every}
        if short:
            raise ValueError(f"{preset}: seeds cut short, with the branch points each lacks: {short}; run them first "
                             "(`python -m benchmarks.branches run` resumes a seed where its rows stop)")
    return rows


def seed_differences(rows: list[dict], preset: str, policy: str, arm: str, reference: str,
                     scale: float = POINTS) -> dict[int, float]:
    """seed -> the mean over its branch points of arm - reference for `policy` (times `scale`: accuracy in points),
    over the points where both arms ran."""
    per_seed: dict[int, list[float]] = {}
    for r in rows:
        if r["preset"] == preset and arm in r["arms"] and reference in r["arms"]:
            per_seed.setdefault(r["seed"], []).append(scale * (r["arms"][arm][policy] - r["arms"][reference][policy]))
    return {seed: float(np.mean(d)) for seed, d in sorted(per_seed.items())}


def contrast(differences: dict[int, float], level: float = 0.95) -> dict:
    """A contrast over seeds: its mean, Student's t interval (none below two seeds) and exact sign-flip p."""
    values = list(differences.values())
    if not values:
        return {"seeds": 0}
    out = {"seeds": len(values), "mean": float(np.mean(values)), "differences": differences}
    if len(values) >= 2:
        out.update(t_interval=stats.t_interval(values, level), sign_flip_p=stats.sign_flip_p(values))
    return out


def analyze(rows: list[dict], scale: float = POINTS) -> list[dict]:
    """Per preset, receiver and arm, the arm against chance and against none (where both ran), times `scale`."""
    out = []
    for preset in sorted({r["preset"] for r in rows}):
        mine = [r for r in rows if r["preset"] == preset]
        arms = sorted({a for r in mine for a in r["arms"]}, key=lambda a: (a not in CONTROLS, a))
        for policy in sorted({p for r in mine for p in r["trunk"]}):
            for arm in arms:
                out.append({"preset": preset, "policy": policy, "arm": arm,
                            **{f"against {ref}": contrast(seed_differences(mine, preset, policy, arm, ref, scale))
                               for ref in ("chance", "none") if ref != arm}})
    return out


def holm_rejected(contrasts: list[dict], alpha: float = 0.05) -> list[bool]:
    """Holm over a family of contrasts by their exact sign-flip p (1 for a contrast of fewer than two seeds)."""
    return stats.holm([c.get("sign_flip_p", 1.0) for c in contrasts], alpha)[2]


def word(c: dict, rejected: bool, words: tuple[str, str, str], margin: float = MARGIN) -> str:
    """A contrast's registered word, in its precedence: Holm's rejection with the mean's sign, else within the
    margin by its unadjusted t interval, else not resolved."""
    up, down, within = words
    if rejected:
        return up if c["mean"] > 0 else down
    low, high = c.get("t_interval", (-math.inf, math.inf))
    return within if -margin < low and high < margin else "not resolved"


def calls(result: list[dict], reading: Reading = ACCURACY) -> dict:
    """The registered calls from `analyze`'s contrasts: per preset, the controls' family against none (negated must
    hurt, one of second-group and sgt must help, per receiver), then families A (each signal against chance) and B
    (against none) with Holm over signals x receivers; per signal, P1'/P2' over the cells whose controls pass."""
    def contrast_of(preset, policy, arm, ref):
        found = [r[f"against {ref}"] for r in result if (r["preset"], r["policy"], r["arm"]) == (preset, policy, arm)]
        return found[0] if found and found[0].get("seeds") else {"seeds": 0}
    cells = []
    for preset in sorted({r["preset"] for r in result}):
        policies = sorted({r["policy"] for r in result if r["preset"] == preset})
        controls = [(p, arm) for p in policies for arm in CONTROLS]
        rejected = dict(zip(controls, holm_rejected([contrast_of(preset, p, a, "none") for p, a in controls])))
        for p in policies:
            hurts = rejected[(p, "negated")] and contrast_of(preset, p, "negated", "none")["mean"] < 0
            helps = any(rejected[(p, a)] and contrast_of(preset, p, a, "none")["mean"] > 0
                        for a in branches_measure.HELPERS)
            no_help = f"neither {' nor '.join(branches_measure.HELPERS)} helps"
            why = [why for failed, why in ((not hurts, "negated does not hurt"), (not helps, no_help)) if failed]
            cells.append({"preset": preset, "policy": p, "controls pass": hurts and helps, "why not": why})
        for ref, family in (("chance", "A"), ("none", "B")):
            members = [(p, arm) for p in policies for arm in SIGNALS]
            found = [contrast_of(preset, p, a, ref) for p, a in members]
            for (p, arm), c, r in zip(members, found, holm_rejected(found)):
                cell_of = next(x for x in cells if (x["preset"], x["policy"]) == (preset, p))
                cell_of.setdefault(family, {})[arm] = (word(c, r, reading.words()[ref], reading.margin)
                                                       if c["seeds"] else "no rows")
    verdicts = {}
    for arm in SIGNALS:
        said = [x["A"][arm] for x in cells if x["controls pass"]]
        if said and "beats chance" in said and "worse than chance" not in said:
            verdicts[arm] = "supported"
        elif said and all(w in reading.words()["chance"][1:] for w in said):
            verdicts[arm] = "refuted"
        else:
            verdicts[arm] = "not resolved"
    return {"cells": cells, "verdicts": verdicts}


def cell(c: dict | None, decimals: int = 2) -> str:
    if not c or not c["seeds"]:
        return "—"
    if "t_interval" not in c:
        return f"{c['mean']:+.{decimals}f} (1 seed)"
    low, high = c["t_interval"]
    return (f"{c['mean']:+.{decimals}f} [{low:+.{decimals}f}, {high:+.{decimals}f}], "
            f"p {stats.p_text(c['sign_flip_p'])}, {c['seeds']} seeds")


def called_row(x: dict) -> str:
    """A receiver's calls: the words where its controls pass; where they do not, why, and no word (its numbers
    stand above, descriptive)."""
    if not x["controls pass"]:
        return (f"| {x['preset']} | {x['policy']} | no, not called: {' and '.join(x['why not'])} | "
                + " | ".join("—" for _ in range(2 * len(SIGNALS))) + " |")
    return (f"| {x['preset']} | {x['policy']} | yes | " + " | ".join(x["A"][a] for a in SIGNALS) + " | "
            + " | ".join(x["B"][a] for a in SIGNALS) + " |")


def markdown(result: list[dict], rows: list[dict], reading: Reading = ACCURACY) -> str:
    lines = ["# Paired branches: the report of their rows\n",
             f"{len(rows)} rows (seed, branch point). Each cell: an arm's held-out {reading.measure} at the branch's "
             f"end less the reference arm's, in {reading.units}, averaged over a seed's branch points, then mean over "
             "seeds [95% t interval], exact sign-flip p over seeds. The controls (negated must hurt; second-group and "
             "sgt, the candidates that must help) against none come first.\n",
             "| preset | receiver | arm | against chance | against none |", "|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['policy']} | {r['arm']} | {cell(r.get('against chance'), reading.decimals)} "
              f"| {cell(r.get('against none'), reading.decimals)} |" for r in result]
    called = calls(result, reading)
    lines += ["\n## Calls (results/preregistration-branches.md)\n",
              "| preset | receiver | controls pass | " + " | ".join(f"{a} against chance" for a in SIGNALS)
              + " | " + " | ".join(f"{a} against none" for a in SIGNALS) + " |",
              "|---|---|---|" + "---|" * 2 * len(SIGNALS)]
    lines += [called_row(x) for x in called["cells"]]
    lines += ["", "P1' (d) and P2' (tbd, ccm, rsd), over the cells whose controls pass: "
              + ", ".join(f"{a} {v}" for a, v in called["verdicts"].items()) + "."]
    if not any(x["controls pass"] for x in called["cells"]):
        lines += ["", "No receiver's controls separate, so no call is made: at this grain the branches did not see "
                      "what reversing the credit of every admitted offer does."]
    return "\n".join(lines) + "\n"


def plot(result: list[dict], path: Path, reading: Reading = ACCURACY) -> None:
    """Each arm's difference from chance per seed (dots) and its mean (bar), a panel per preset and receiver."""
    panels = sorted({(r["preset"], r["policy"]) for r in result})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
    for ax, (preset, policy) in zip(axes[0], panels):
        mine = [r for r in result if (r["preset"], r["policy"]) == (preset, policy) and r["arm"] != "chance"]
        for x, r in enumerate(mine):
            c = r["against chance"]
            if c["seeds"]:
                ax.bar(x, c["mean"], color="lightgray")
                ax.plot([x] * c["seeds"], list(c["differences"].values()), "k.", ms=4)
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xticks(range(len(mine)), [r["arm"] for r in mine], rotation=60, fontsize=7)
        ax.set_title(f"{preset}: into {policy}", fontsize=8)
        ax.set_ylabel(f"{reading.measure} - chance's ({reading.units})", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(folder: Path, reading: Reading = ACCURACY) -> str:
    """report.md and report.png of the folder's rows, read as `reading` says; returns the markdown."""
    rows = one_design(load(folder))
    if reading.measure != ACCURACY.measure:
        rows = branches_measure.as_measure(rows, reading.measure)
    result = analyze(rows, reading.scale)
    text = markdown(result, rows, reading)
    (Path(folder) / "report.md").write_text(text)
    plot(result, Path(folder) / "report.png", reading)
    return text
