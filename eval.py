"""Evaluation: held-out accuracy, reward variance, convergence speed; reports and run comparisons.

The proposal's §3.1 metrics, per policy:
  accuracy     greedy pass@1 on the held-out split (never trained on: arith.py splits by a hash)
  reward var.  iteration-to-iteration variance of the mean training reward, estimated as half the mean squared
               difference of consecutive iterations (von Neumann), so a learning trend does not count as noise
  convergence  the first iteration at which held-out accuracy reaches a target
and, for runs that share, what crossed into each policy per iteration (sharing/received: peer trajectories for
PRP and SGT, peer rewards in the group baselines for XGRPO); and each run's cost beside its accuracy: the wall
time of its iterations (perf/iteration_s: rollouts, rewards, exchange and update, evaluation excluded) and each
policy's rollout and update tokens, so runs can be compared at an equal budget of any of them
(`accuracy_within_budget`, --budget).

    python eval.py runs/qwen-llama-none-s1                     # one run: report.md and curves.png in it
    python eval.py runs/A runs/B runs/C --out runs/compare     # side by side
    python eval.py runs/A --task gsm8k --data-dir data/gsm8k   # transfer: the last checkpoint on another task
    python eval.py runs/A runs/B --budget update_tokens=2e6     # accuracy once each run has spent the budget
    python eval.py --matrix results/pilot                      # the comparison (benchmarks/matrix_analysis.py)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import arith
import checkpoint
import fidelity_record
import hardware
import policies
import tasks


def heldout_accuracy(policy, examples: list, max_new_tokens: int, task: tasks.Task | None = None,
                     batch_size: int = 256, temperature: float | None = None, samples: int = 1,
                     generator: torch.Generator | None = None) -> float:
    """Greedy pass@1 of `policy` on `examples` of `task` (default: the arithmetic task's Problems).

    With a `temperature`: the mean reward of `samples` completions per example sampled at it, what the training
    reward measures, on problems never trained on. RL can raise it by sharpening alone; greedy pass@1 rises only
    where the most likely completion becomes a right one. Samples are drawn from `generator` (torch's global one
    if None)."""
    if not examples:
        raise ValueError("no held-out examples to evaluate")
    task = task or tasks.load_task("arith", 0, 0, 0)
    samples = 1 if temperature is None else samples
    correct = 0.0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        rollouts = policy.rollout([task.prompt(e) for e in chunk], samples, max_new_tokens,
                                  temperature=temperature or 1.0, greedy=temperature is None, generator=generator)
        correct += tasks.group_rewards(task, chunk, rollouts.texts, samples).sum().item() / samples
    return correct / len(examples)


def load_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(records: list[dict], policy: str, key: str) -> list[tuple[int, float]]:
    return [(r["iteration"], r[key]) for r in records if r["policy"] == policy and key in r]


COSTS = {"iteration_s": "perf/iteration_s", "rollout_tokens": "perf/rollout_tokens",
         "update_tokens": "perf/update_tokens"}
"""the cost a budget can be stated in, and the per-iteration metric it sums"""


def spent(records: list[dict], policy: str, cost: str) -> dict[int, float]:
    """iteration -> the cost spent by the end of it (cumulative); wall time is the run's, tokens the policy's."""
    key, total, out = COSTS[cost], 0.0, {0: 0.0}
    rows = [r for r in records if key in r and (cost == "iteration_s" or r["policy"] == policy)]
    by_iteration: dict[int, float] = {}
    for r in rows:   # wall time is logged on every policy's line of an iteration: count it once
        by_iteration[r["iteration"]] = r[key] if cost == "iteration_s" else by_iteration.get(r["iteration"], 0) + r[key]
    for iteration in sorted(by_iteration):
        total += by_iteration[iteration]
        out[iteration] = total
    return out


def accuracy_within_budget(records: list[dict], policy: str, cost: str, budget: float) -> tuple[int, float] | None:
    """(iteration, greedy pass@1) of the last evaluation made before the run had spent more than `budget` of
    `cost`; None if even the first training iteration cost more."""
    costs = spent(records, policy, cost)
    within = [(it, acc) for it, acc in curve(records, policy, "eval/heldout_accuracy") if costs.get(it, math.inf) <= budget]
    return within[-1] if within and within[-1][0] > 0 else None


def area_under(curve: list[tuple[int, float]], end: float) -> float:
    """Mean accuracy over x = 0..`end` of a curve of (x, accuracy) points from x = 0 (x an iteration or a cost
    spent): the trapezoid area up to `end`, the last segment cut there by linear interpolation, over `end`."""
    points = [(x, a) for x, a in curve if x <= end]
    later = [(x, a) for x, a in curve if x > end]
    if end <= 0 or not points or points[0][0] != 0 or (points[-1][0] < end and not later):
        raise ValueError(f"need evaluations from 0 to {end}, got {[x for x, _ in curve]}")
    if points[-1][0] < end:   # cut the segment that crosses `end`
        (x0, a0), (x1, a1) = points[-1], later[0]
        points.append((end, a0 + (a1 - a0) * (end - x0) / (x1 - x0)))
    area = sum((x1 - x0) * (a0 + a1) / 2 for (x0, a0), (x1, a1) in zip(points, points[1:]))
    return area / end


def reward_variance(means: list[float]) -> float:
    """Half the mean squared difference of consecutive values: the noise variance, insensitive to a trend."""
    if len(means) < 2:
        return float("nan")
    return sum((b - a) ** 2 for a, b in zip(means, means[1:])) / (2 * (len(means) - 1))


def summarize(run_dir: Path, target: float) -> list[dict]:
    """One row per policy of a run."""
    records = load_metrics(run_dir)
    rows = []
    for policy in dict.fromkeys(r["policy"] for r in records):
        accuracy = curve(records, policy, "eval/heldout_accuracy")
        rewards = [v for _, v in curve(records, policy, "charts/reward_mean")]
        received = [v for _, v in curve(records, policy, "sharing/received")]
        reached = [it for it, acc in accuracy if acc >= target]
        rows.append({"run": Path(run_dir).name, "policy": policy,
                     "start_accuracy": accuracy[0][1] if accuracy else float("nan"),
                     "final_accuracy": accuracy[-1][1] if accuracy else float("nan"),
                     "best_accuracy": max((a for _, a in accuracy), default=float("nan")),
                     "mean_train_reward": sum(rewards) / len(rewards) if rewards else float("nan"),
                     "reward_var": reward_variance(rewards),
                     "received_per_iteration": sum(received) / len(received) if received else None,
                     "iterations_to_target": reached[0] if reached else None,
                     "iterations": max((r["iteration"] for r in records), default=0),
                     **{cost: spent(records, policy, cost).get(max(r["iteration"] for r in records), math.nan)
                        for cost in COSTS}})
    return rows


def markdown_table(rows: list[dict], target: float) -> str:
    head = ("| run | policy | held-out acc. start | final | best | mean train reward | reward var. "
            f"| iterations to {target:.0%} | received / iteration | train s | rollout tokens | update tokens |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    def cell(v) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}" if isinstance(v, float) else str(v)
    return head + "".join(
        f"| {r['run']} | {r['policy']} | {cell(r['start_accuracy'])} | {cell(r['final_accuracy'])} "
        f"| {cell(r['best_accuracy'])} | {cell(r['mean_train_reward'])} | {cell(r['reward_var'])} "
        f"| {cell(r['iterations_to_target']) if r['iterations_to_target'] is not None else 'not reached'} "
        f"| {cell(r['received_per_iteration'])} | " + " | ".join(whole(r[cost]) for cost in COSTS) + " |\n"
        for r in rows)


def whole(v: float) -> str:
    return "—" if math.isnan(v) else f"{v:.0f}"


def plot_curves(run_dirs: list[Path], path: Path) -> None:
    """Held-out accuracy (greedy, and sampled at the training temperature where logged) and mean training reward
    against iteration, one line per run and policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_acc, ax_rew) = plt.subplots(1, 2, figsize=(11, 4))
    for run_dir in run_dirs:
        records = load_metrics(run_dir)
        for policy in dict.fromkeys(r["policy"] for r in records):
            label = f"{Path(run_dir).name}/{policy}" if len(run_dirs) > 1 else policy
            acc = curve(records, policy, "eval/heldout_accuracy")
            line, = ax_acc.plot([i for i, _ in acc], [a for _, a in acc], marker="o", label=label)
            sampled = curve(records, policy, "eval/heldout_sampled_accuracy")
            ax_acc.plot([i for i, _ in sampled], [a for _, a in sampled], linestyle="--", color=line.get_color(),
                        label=f"{label}, sampled" if sampled else None)
            rew = curve(records, policy, "charts/reward_mean")
            ax_rew.plot([i for i, _ in rew], smooth([r for _, r in rew]), label=label)
    ax_acc.set(xlabel="iteration", ylabel="held-out accuracy", title="greedy pass@1 (dashed: sampled at the training "
               "temperature)", ylim=(0, 1))
    ax_rew.set(xlabel="iteration", ylabel="mean reward (moving average of 10)", title="training reward", ylim=(0, 1))
    for ax in (ax_acc, ax_rew):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def smooth(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def write_report(run_dir: Path, target: float = 0.9) -> str:
    """report.md and curves.png in the run directory (a cross-fidelity run's fidelity report first); returns
    the markdown."""
    run_dir = Path(run_dir)
    fidelity = fidelity_record.fidelity_report(run_dir) if (run_dir / "fidelity.jsonl").exists() else ""
    text = f"# {run_dir.name}\n\n" + fidelity + markdown_table(summarize(run_dir, target), target)
    (run_dir / "report.md").write_text(text)
    plot_curves([run_dir], run_dir / "curves.png")
    return text


def compare(run_dirs: list[Path], out: Path, target: float = 0.9) -> str:
    """Side-by-side table and curves of several runs, written to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    text = "# comparison\n\n" + markdown_table([row for d in run_dirs for row in summarize(d, target)], target)
    (out / "comparison.md").write_text(text)
    plot_curves(run_dirs, out / "comparison.png")
    return text


def evaluate_run(run_dir: Path, task_name: str, eval_size: int, data_dir: str | None, max_new_tokens: int | None
                 ) -> dict[str, float]:
    """Greedy pass@1 of a run's last checkpoint on a task's held-out split (transfer, proposal §3.3)."""
    config = json.loads((Path(run_dir) / "config.json").read_text())
    task_cfg = arith.TaskConfig(num_steps=config["num_steps"], max_operand=config["max_operand"], ops=config["ops"],
                                step_format=config.get("step_format", arith.TaskConfig.step_format))
    setup = hardware.PolicySetup.of(config)
    pols = hardware.build_policies(setup, hardware.policy_devices(config["devices"], len(
        policies.PRESETS[setup.scale][setup.pair])), task_cfg)   # exactly as train.py built them
    checkpoint.load_checkpoint(Path(run_dir), pols, None)  # the curator's state, if any, is not needed here
    task = tasks.load_task(task_name, setup.seed, 0, eval_size, task_cfg, data_dir)
    return {p.name: heldout_accuracy(p, task.heldout, max_new_tokens or config["max_new_tokens"], task) for p in pols}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--matrix", type=Path, default=None, help="a folder of run summaries (benchmarks/matrix.py): "
                        "the comparison's analysis, written there (benchmarks/matrix_analysis.py)")
    parser.add_argument("--target", type=float, default=0.9, help="accuracy that counts as converged")
    parser.add_argument("--out", type=Path, default=None, help="where a comparison goes (default: runs/compare)")
    parser.add_argument("--task", choices=tasks.TASK_NAMES, default=None,
                        help="evaluate each run's last checkpoint on this task's held-out split instead of reporting")
    parser.add_argument("--data-dir", default=None, help="local copy of the --task data set")
    parser.add_argument("--eval-size", type=int, default=500, help="held-out examples for --task")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="for --task; default: the run's")
    parser.add_argument("--budget", default=None, help=f"COST=VALUE, COST one of {', '.join(COSTS)}: each run's "
                        "held-out accuracy at its last evaluation within that budget")
    cli = parser.parse_args()
    if cli.matrix:
        import sys
        sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))
        import matrix_analysis
        print(matrix_analysis.report(cli.matrix))
        raise SystemExit
    if not cli.runs:
        parser.error("give run directories, or --matrix FOLDER")
    if cli.budget:
        cost, _, value = cli.budget.partition("=")
        if cost not in COSTS or not value:
            raise SystemExit(f"--budget takes COST=VALUE with COST one of {', '.join(COSTS)}, got {cli.budget!r}")
        for run in cli.runs:
            records = load_metrics(run)
            for policy in dict.fromkeys(r["policy"] for r in records):
                at = accuracy_within_budget(records, policy, cost, float(value))
                print(f"{run} {policy}: " + (f"{at[1]:.3f} at iteration {at[0]}" if at else "over budget from the start"))
        raise SystemExit
    if cli.task:
        for run in cli.runs:
            accuracy = evaluate_run(run, cli.task, cli.eval_size, cli.data_dir, cli.max_new_tokens)
            print(f"{run}: {cli.task} greedy pass@1 " + ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items()))
        raise SystemExit
    if len(cli.runs) == 1:
        print(write_report(cli.runs[0], cli.target))
    else:
        print(compare(cli.runs, cli.out or cli.runs[0].parent / "compare", cli.target))
