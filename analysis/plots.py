"""The comparison's two figures (issue 32), drawn from the run summaries and their analysis (analysis/matrix.py).

curves.png: per policy, each configuration's held-out greedy curve, mean over seeds with a band of ±1 SD (top),
and its paired difference from independent GRPO (`none`) seed by seed, over the seeds whose two runs started from
the same weights (analysis/pairing.py), mean with a band of ±1 standard error (bottom). Seeds spread the curves by
far more than the configurations differ, and each seed's runs share their random numbers, so the differences show
what the top row's bands hide.
plane.png: the stability-support plane, what crossed per iteration against the receiver's training reward variance,
one point per configuration (its policies and seeds averaged).
h5-plane.png (the matrix's H5, analysis/blocks.py): the same plane per policy, each configuration's point with its
95% bootstrap intervals over seeds on both axes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import pairing
from analysis.curves import POINTS

REFERENCE = "none"                      # the configuration the bottom row's differences are taken from


def heldout_points(summaries: list[dict], name: str, policy: str) -> tuple[list[int], dict[int, np.ndarray]]:
    """The evaluation iterations and seed -> [evaluations] held-out accuracy in points of one configuration."""
    runs = {seed: s["policies"][policy]["heldout"] for seed, s in runs_of(summaries, name).items()}
    iterations = [i for i, _ in next(iter(runs.values()))]
    return iterations, {seed: POINTS * np.array([a for _, a in curve]) for seed, curve in runs.items()}


def runs_of(summaries: list[dict], name: str) -> dict[int, dict]:
    """seed -> the summary of configuration `name`'s run"""
    return {s["seed"]: s for s in summaries if s["configuration"] == name}


def band(ax, iterations: list[int], values: np.ndarray, spread: np.ndarray, label: str, color: str) -> None:
    ax.plot(iterations, values, label=label, color=color)
    ax.fill_between(iterations, values - spread, values + spread, color=color, alpha=0.15)


def plot(summaries: list[dict], result: dict, folder: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = list(summaries[0]["policies"])
    names = list(result["configurations"])
    fig, axes = plt.subplots(2, len(policies), figsize=(6 * len(policies), 8), squeeze=False)
    for column, policy in enumerate(policies):
        top, bottom = axes[0][column], axes[1][column]
        reference = heldout_points(summaries, REFERENCE, policy)[1] if REFERENCE in names else {}
        for k, name in enumerate(names):
            color = f"C{k % 10}"                      # one colour per configuration in both rows
            iterations, curves = heldout_points(summaries, name, policy)
            values = np.stack(list(curves.values()))                                 # [seeds, evaluations]
            sd = values.std(0, ddof=1) if len(values) > 1 else np.zeros(values.shape[1])
            band(top, iterations, values.mean(0), sd, name, color)
            seeds = pairing.paired_seeds(runs_of(summaries, name), runs_of(summaries, REFERENCE),
                                         result["config"]["pair_by_start"])
            paired = [curves[s] - reference[s] for s in seeds]
            if name != REFERENCE and len(paired) > 1:
                differences = np.stack(paired)                                       # [seeds, evaluations]
                standard_error = differences.std(0, ddof=1) / np.sqrt(len(differences))
                band(bottom, iterations, differences.mean(0), standard_error, name, color)
        top.set(xlabel="iteration", ylabel="held-out greedy accuracy (points)", title=f"{policy}: mean ± SD")
        bottom.axhline(0.0, color="black", lw=0.8)
        bottom.set(xlabel="iteration", ylabel=f"minus {REFERENCE}, same seed (points)",
                   title=f"{policy}: paired difference from {REFERENCE}, mean ± SE")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "curves.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, per_policy in result["configurations"].items():
        x = sum(m["received"][0] for m in per_policy.values()) / len(per_policy)
        y = sum(m["reward_variance"][0] for m in per_policy.values()) / len(per_policy)
        ax.scatter([x], [y])
        ax.annotate(name, (x, y), fontsize=8)
    ax.set(xlabel="crossed per iteration (sharing/received: trajectories; rewards for xgrpo)",
           ylabel="receiver's training reward variance", title="stability-support plane")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "plane.png", dpi=110)
    plt.close(fig)


def h5_plane(h5: list[dict], path: Path) -> None:
    """H5's plane per policy: each configuration at (received, variance), with its intervals as error bars, and
    adaptive cross-fidelity's path over its windows (numbered) where it was computed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(h5), figsize=(6 * len(h5), 4.5), squeeze=False)
    for ax, policy in zip(axes[0], h5):
        for point in policy["points"]:
            (x, x_low, x_high), (y, y_low, y_high) = point["received"], point["variance"]
            ax.errorbar([x], [y], xerr=[[x - x_low], [x_high - x]], yerr=[[y - y_low], [y_high - y]], fmt="o",
                        capsize=3, label=point["configuration"])
        if policy["path"]:
            xs, ys = ([w[k][0] for w in policy["path"]] for k in ("received", "variance"))
            ax.plot(xs, ys, "--", color="gray", marker=".", label="cross-fidelity-adaptive, by window")
            for w, x, y in zip(policy["path"], xs, ys):
                ax.annotate(str(w["window"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set(xlabel="crossed per iteration (sharing/received: trajectories; rewards for xgrpo)",
               ylabel="training reward variance", title=f"{policy['policy']}: {policy['verdict']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
