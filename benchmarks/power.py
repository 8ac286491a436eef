"""Power analysis of the testbed (issue #23): can N seeds resolve a 2-point difference between two sharing levels?

    python -m benchmarks.power run --testbed default --levels none prp --seeds 1 2 3 4 5 6 --jobs 2
    python -m benchmarks.power analyze --testbed default --levels none prp --seeds 1 2 3 4 5 6 --at 100 200

`run` trains every (level, seed) of a testbed as runs/power-TESTBED-LEVEL-sSEED, JOBS at a time on one thread each,
and is resumable: a finished run is skipped, a killed one resumes from its checkpoint, and asking for more
iterations extends the runs already there (the runs are the ones that would have gone that far from the start).
train.py flags after `--` go to every run, after the testbed's (a smoke run's smaller settings).
Every run evaluates greedy pass@1 on 2,000 held-out problems every 10 iterations.

`analyze` reads each policy's held-out curve and reports, per metric (the final accuracy at iteration I, and the
area under the curve up to I as the mean accuracy over its evaluations, trapezoid rule), the paired difference
between each level and the first one seed by seed: its mean, its standard deviation across seeds, the 95% half-width
of the mean (Student t) and the number of seeds that would bring that half-width to 2 points. It also reports each
run's cost: wall time and rollout and update tokens. The result goes to results/power-TESTBED.json and .md
(or --out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import eval as evaluation
from analysis.curves import area_under
from analysis.sets import EVALUATION
from analysis.stats import fewest_seeds, t_quantile

ROOT = Path(__file__).resolve().parent.parent

TESTBEDS = {
    "default": [],
    "lr5e-5": ["--lr", "5e-5"],
    "prompts32": ["--prompts-per-iteration", "32"],
}
"""each testbed's flags on top of train.py's defaults and EVALUATION"""
DIFFERENCE = 0.02
"""the difference in held-out accuracy to resolve: 2 points"""
LEVEL = 0.95
"""the confidence of the half-width"""


def run_name(testbed: str, level: str, seed: int) -> str:
    return f"power-{testbed}-{level}-s{seed}"


def train_one(testbed: str, level: str, seed: int, iterations: int, runs_dir: Path, extra: list[str]) -> str:
    """One (level, seed) of a testbed to `iterations`; returns a line for the log."""
    return train_run(run_name(testbed, level, seed), ["--share", level, "--seed", str(seed), *EVALUATION,
                                                      *TESTBEDS[testbed], *extra], iterations, runs_dir)[1]


def train_run(name: str, flags: list[str], iterations: int, runs_dir: Path) -> tuple[bool, str]:
    """One run of train.py with `flags` to `iterations` as runs_dir/name, on one thread: skipped where its curve
    already reaches them, resumed where its directory exists (train.py restarts one killed before its first
    checkpoint, and truncates the metrics of one killed later to its checkpoint, so no line is logged twice).
    Returns whether the run reached `iterations`, and a line for the log (its output goes to runs_dir/NAME.log)."""
    done = curve_end(runs_dir / name)
    if done >= iterations:
        return True, f"{name}: done ({done} iterations)"
    command = [sys.executable, str(ROOT / "train.py"), *flags, "--iterations", str(iterations), "--name", name,
               "--runs-dir", str(runs_dir)]
    if (runs_dir / name).exists():
        command.append("--resume")
    runs_dir.mkdir(parents=True, exist_ok=True)
    with open(runs_dir / f"{name}.log", "a") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}).returncode
    return code == 0, f"{name}: {'finished' if code == 0 else f'FAILED (exit {code}), see {runs_dir / name}.log'}"


def curve_end(run_dir: Path) -> int:
    """The last iteration at which every policy of a run was evaluated, 0 for none: a run stopped between two
    policies' evaluation lines is not done (its resume evaluates that iteration again)."""
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    last: dict[str, int] = {}
    for r in evaluation.load_metrics(run_dir):
        evaluated = r["iteration"] if "eval/heldout_accuracy" in r else 0
        last[r["policy"]] = max(last.get(r["policy"], 0), evaluated)
    return min(last.values(), default=0)


def held_out_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Per policy, (iteration, greedy pass@1) at every evaluation, in order."""
    records = evaluation.load_metrics(run_dir)
    curves = {policy: evaluation.curve(records, policy, "eval/heldout_accuracy")
              for policy in dict.fromkeys(r["policy"] for r in records)}
    return {policy: curve for policy, curve in curves.items() if curve}


def accuracy_at(curve: list[tuple[int, float]], iteration: int) -> float:
    matches = [a for i, a in curve if i == iteration]
    if not matches:
        raise ValueError(f"no evaluation at iteration {iteration} (evaluated at {[i for i, _ in curve]})")
    return matches[-1]


def half_width(sd: float, seeds: int, level: float = LEVEL) -> float:
    """The `level` half-width of a mean of `seeds` paired differences with standard deviation `sd` (Student t)."""
    return t_quantile((1 + level) / 2, seeds - 1) * sd / math.sqrt(seeds)


def seeds_needed(sd: float, target: float = DIFFERENCE, level: float = LEVEL) -> int:
    """The fewest seeds whose `level` half-width on a paired mean difference is at most `target`."""
    return fewest_seeds(lambda n: half_width(sd, n, level) <= target, f"a half-width of {target} at SD {sd}")


def paired_summary(differences: list[float], target: float = DIFFERENCE) -> dict[str, float]:
    n = len(differences)
    if n < 2:
        raise ValueError(f"a standard deviation across seeds needs at least 2 seeds, got {n}")
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    return {"mean": mean, "sd": sd, "half_width_95": half_width(sd, n), "seeds_for_2pt": seeds_needed(sd, target)}


def run_cost(run_dir: Path, iteration: int) -> dict[str, float]:
    """The cost of a run's first `iteration` iterations, its policies together (eval.COSTS): the wall time of its
    iterations, and its rollout and update tokens."""
    records = evaluation.load_metrics(run_dir)
    names = list(dict.fromkeys(r["policy"] for r in records))
    return {"iteration_s": evaluation.spent(records, names[0], "iteration_s").get(iteration, math.nan),
            **{cost: sum(evaluation.spent(records, p, cost).get(iteration, math.nan) for p in names)
               for cost in ("rollout_tokens", "update_tokens")}}


def analyze(testbed: str, levels: list[str], seeds: list[int], at: list[int], runs_dir: Path,
            eval_size: int = 2000) -> dict:
    """Every level after the first against the first, seed by seed."""
    base = levels[0]
    curves = {(level, seed): held_out_curves(runs_dir / run_name(testbed, level, seed))
              for level in levels for seed in seeds}
    policies = list(curves[base, seeds[0]])
    out: dict = {"testbed": testbed, "flags": TESTBEDS[testbed], "levels": levels, "seeds": seeds, "metrics": {},
                 "cost": {}}
    for other in levels[1:]:
        for iteration in at:
            for metric, read in (("final", accuracy_at), ("auc", area_under)):
                for policy in policies:
                    values = {lv: [read(curves[lv, s][policy], iteration) for s in seeds] for lv in (base, other)}
                    differences = [b - a for a, b in zip(values[base], values[other])]
                    out["metrics"][f"{other} - {base}/{metric}@{iteration}/{policy}"] = {
                        "per_seed": values, "differences": differences, **paired_summary(differences)}
    for iteration in at:
        for policy in policies:   # the binomial standard error of one final accuracy, at the mean accuracy
            p = (sum(accuracy_at(curves[lv, s][policy], iteration) for lv in levels for s in seeds)
                 / (len(levels) * len(seeds)))
            out[f"binomial_se@{iteration}/{policy}"] = math.sqrt(p * (1 - p) / eval_size)
    for level in levels:
        costs = [run_cost(runs_dir / run_name(testbed, level, s), max(at)) for s in seeds]
        out["cost"][level] = {k: sum(c[k] for c in costs) / len(costs) for k in costs[0]}
    return out


def markdown(result: dict) -> str:
    lines = [f"# power: testbed {result['testbed']} {' '.join(result['flags'])}, seeds "
             f"{' '.join(map(str, result['seeds']))}\n",
             "| difference | metric | policy | per-seed difference | mean | SD | 95% half-width | seeds for +-2 pt |",
             "|---|---|---|---|---|---|---|---|"]
    for key, m in result["metrics"].items():
        difference, metric, policy = key.split("/")
        diffs = " ".join(f"{d:+.3f}" for d in m["differences"])
        lines.append(f"| {difference} | {metric} | {policy} | {diffs} | {m['mean']:+.3f} | {m['sd']:.3f} "
                     f"| {m['half_width_95']:.3f} | {m['seeds_for_2pt']} |")
    lines += ["", "Binomial standard error of one final accuracy: " + ", ".join(
        f"{k.split('/', 1)[1]} {k.split('@')[1].split('/')[0]} it. {v:.3f}" for k, v in result.items()
        if k.startswith("binomial_se")), "",
        "| level | train s per run | rollout tokens | update tokens |", "|---|---|---|---|"]
    lines += [f"| {lv} | {c['iteration_s']:.0f} | {c['rollout_tokens']:.0f} | {c['update_tokens']:.0f} |"
              for lv, c in result["cost"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "analyze"])
    parser.add_argument("--testbed", choices=sorted(TESTBEDS), default="default")
    parser.add_argument("--levels", nargs="+", default=["none", "prp"],
                        help="levels to run; analyze compares each after the first with the first")
    parser.add_argument("--order", choices=["level", "seed"], default="level",
                        help="run: level by level (seeds apart, so warm-ups run apart), or seed by seed (each "
                             "seed's levels together: a partial grid is still paired)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--iterations", type=int, default=100, help="run: train every run to this iteration")
    parser.add_argument("--at", type=int, nargs="+", default=[100], help="analyze: iterations to read")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument("--out", type=Path, default=None,
                        help="analyze: the result's path without its suffix (default: results/power-TESTBED)")
    parser.add_argument("extra", nargs="*", help="run: train.py flags after --, added to every run's")
    # intermixed: options may come between the command and the flags after --
    args = parser.parse_intermixed_args(argv)
    runs_dir = Path(args.runs_dir)
    if args.command == "run":
        runs_dir.mkdir(parents=True, exist_ok=True)
        jobs = ([(args.testbed, level, seed) for level in args.levels for seed in args.seeds] if args.order == "level"
                else [(args.testbed, level, seed) for seed in args.seeds for level in args.levels])
        with ThreadPoolExecutor(args.jobs) as pool:
            for line in pool.map(lambda job: train_one(*job, args.iterations, runs_dir, args.extra), jobs):
                print(line, flush=True)
        return
    result = analyze(args.testbed, args.levels, args.seeds, args.at, runs_dir)
    out = args.out or ROOT / "results" / f"power-{args.testbed}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
