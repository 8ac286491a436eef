"""The branches' report from their rows alone (benchmarks/branches.py, issue 68): per preset, receiver and arm, the
arm's held-out accuracy at a branch's end less a reference arm's at the same branch (the random arm, `chance`, and
`none`), in points.

    python -m benchmarks.branches report results/branches      # report.md and report.png in the folder

The unit is the seed: a seed's branch points are one trunk's run, so its differences are averaged over its points
first, and the test is over seeds, the exact two-sided sign-flip test (stats.sign_flip_p), with Student's t
interval beside the mean (results/reporting-rule.md). The controls come first: the arm that must hurt (negated)
and the candidates that must help (sgt, second-group) against `none`; a measure whose controls do not separate
from `none` is not read for any call.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np

from analysis import stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POINTS = 100
"""accuracies in points"""
CONTROLS = ("negated", "second-group", "sgt")
"""the control that must hurt and the candidates that must help, read against `none` first"""


def load(folder: Path) -> list[dict]:
    """Every row of the folder (benchmarks/branches.py writes PRESET-sSEED-itPOINT.json whole)."""
    rows = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*-s*-it*.json"))]
    if not rows:
        raise FileNotFoundError(f"no branch rows in {folder}")
    return rows


def seed_differences(rows: list[dict], preset: str, policy: str, arm: str, reference: str) -> dict[int, float]:
    """seed -> the mean over its branch points of arm - reference accuracy for `policy`, in points, over the
    points where both arms ran."""
    per_seed: dict[int, list[float]] = {}
    for r in rows:
        if r["preset"] == preset and arm in r["arms"] and reference in r["arms"]:
            per_seed.setdefault(r["seed"], []).append(POINTS * (r["arms"][arm][policy] - r["arms"][reference][policy]))
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


def analyze(rows: list[dict]) -> list[dict]:
    """Per preset, receiver and arm, the arm against chance and against none (where both ran)."""
    out = []
    for preset in sorted({r["preset"] for r in rows}):
        mine = [r for r in rows if r["preset"] == preset]
        arms = sorted({a for r in mine for a in r["arms"]}, key=lambda a: (a not in CONTROLS, a))
        for policy in sorted({p for r in mine for p in r["trunk"]}):
            for arm in arms:
                out.append({"preset": preset, "policy": policy, "arm": arm,
                            **{f"against {ref}": contrast(seed_differences(mine, preset, policy, arm, ref))
                               for ref in ("chance", "none") if ref != arm}})
    return out


def cell(c: dict | None) -> str:
    if not c or not c["seeds"]:
        return "—"
    if "t_interval" not in c:
        return f"{c['mean']:+.2f} (1 seed)"
    low, high = c["t_interval"]
    return f"{c['mean']:+.2f} [{low:+.2f}, {high:+.2f}], p {stats.p_text(c['sign_flip_p'])}, {c['seeds']} seeds"


def markdown(result: list[dict], rows: list[dict]) -> str:
    lines = ["# Paired branches: the report of their rows\n",
             f"{len(rows)} rows (seed, branch point). Each cell: an arm's held-out greedy accuracy at the branch's end "
             "less the reference arm's, points, averaged over a seed's branch points, then mean over seeds [95% t "
             "interval], exact sign-flip p over seeds. The controls (negated must hurt; second-group and sgt, the "
             "candidates that must help) against none come first.\n",
             "| preset | receiver | arm | against chance | against none |", "|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['policy']} | {r['arm']} | {cell(r.get('against chance'))} "
              f"| {cell(r.get('against none'))} |" for r in result]
    return "\n".join(lines) + "\n"


def plot(result: list[dict], path: Path) -> None:
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
        ax.set_ylabel("accuracy - chance's, points", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(folder: Path) -> str:
    """report.md and report.png of the folder's rows; returns the markdown."""
    rows = load(folder)
    result = analyze(rows)
    text = markdown(result, rows)
    (Path(folder) / "report.md").write_text(text)
    plot(result, Path(folder) / "report.png")
    return text
