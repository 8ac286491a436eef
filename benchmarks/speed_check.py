"""Whether a change that alters metrics moved the primary metric beyond its noise: #29's three-seed check.

    python -m benchmarks.matrix --set speed-check --out results/speed-check/before   # at the commit before
    python -m benchmarks.matrix --set speed-check --out results/speed-check/after    # at the change, beside it
    python -m benchmarks.speed_check results/speed-check/before results/speed-check/after

Per policy, from the run summaries alone: the primary metric (analysis/matrix.py, primary_metric, the area under
the held-out curve, in points) of every seed both folders ran, at each commit; the paired difference after -
before, its mean and its 95% t interval over seeds; and the metric's SD over seeds at each commit, the noise the
difference is read against. The change moved the metric beyond its noise where the interval excludes 0. Also
the training seconds (the summaries' iteration_s) of both, which ran side by side, and their ratio.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from analysis import matrix as matrix_analysis
from analysis.stats import t_quantile


def by_seed(folder: Path) -> dict[int, dict]:
    return {s["seed"]: s for s in matrix_analysis.load(folder)}


def check(before: dict[int, dict], after: dict[int, dict]) -> list[dict]:
    """One row per policy (and one for the training seconds) over the seeds both folders ran."""
    seeds = sorted(set(before) & set(after))
    if len(seeds) < 2:
        raise ValueError(f"need at least two seeds run at both commits, got {seeds}")
    rows = []
    for policy in sorted(before[seeds[0]]["policies"]):
        a = np.array([matrix_analysis.primary_metric(before[s], policy) for s in seeds])
        b = np.array([matrix_analysis.primary_metric(after[s], policy) for s in seeds])
        diff = b - a
        half = t_quantile(0.975, len(seeds) - 1) * diff.std(ddof=1) / np.sqrt(len(seeds))
        rows.append({"policy": policy, "seeds": seeds, "before": a.tolist(), "after": b.tolist(),
                     "sd_before": a.std(ddof=1), "sd_after": b.std(ddof=1), "difference": diff.mean(),
                     "interval": (diff.mean() - half, diff.mean() + half), "moved": abs(diff.mean()) > half})
    seconds = [(before[s]["iteration_s"], after[s]["iteration_s"]) for s in seeds]
    rows.append({"policy": "training seconds", "seeds": seeds, "before": [x for x, _ in seconds],
                 "after": [y for _, y in seconds],
                 "ratio": sum(y for _, y in seconds) / sum(x for x, _ in seconds)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| policy | seeds | AUC before | AUC after | SD before / after "
             "| after - before (95% t interval) | moved |",
             "|---|---|---|---|---|---|---|"]
    for r in rows[:-1]:
        lines.append(f"| {r['policy']} | {', '.join(map(str, r['seeds']))} | "
                     f"{', '.join(f'{v:.2f}' for v in r['before'])} | {', '.join(f'{v:.2f}' for v in r['after'])} | "
                     f"{r['sd_before']:.2f} / {r['sd_after']:.2f} | {r['difference']:+.2f} "
                     f"[{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}] | {'yes' if r['moved'] else 'no'} |")
    t = rows[-1]
    lines.append(f"\ntraining seconds per seed, before: {', '.join(f'{v:.0f}' for v in t['before'])}; after: "
                 f"{', '.join(f'{v:.0f}' for v in t['after'])}; after / before {t['ratio']:.2f}")
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("before", type=Path)
    cli.add_argument("after", type=Path)
    args = cli.parse_args()
    print(markdown(check(by_seed(args.before), by_seed(args.after))))


if __name__ == "__main__":
    main()
