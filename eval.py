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

    python eval.py runs/qwen-llama-cross-fidelity-s1           # one run: report.md and curves.png in it
    python eval.py runs/A runs/B runs/C --out runs/compare     # side by side
    python eval.py runs/A --task gsm8k --data-dir data/gsm8k   # transfer: the last checkpoint on another task
    python eval.py runs/A runs/B --budget update_tokens=2e6     # accuracy once each run has spent the budget
    python eval.py --matrix results/pilot                      # the comparison (analysis/matrix.py)
    python eval.py --matrix results/pilot results/matrix-main  # its seeds pooled with the matrix's main block
    python eval.py --blocks results                            # blocks 2-6, H4, H5 and H3 (analysis/blocks.py)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import fidelity_record
from analysis.curves import reward_variance
from args import Args
from testbed import arith, checkpoint, policies, presets, tasks


def heldout_accuracy(policy, examples: list, max_new_tokens: int, task: tasks.Task | None = None,
                     batch_size: int = 256, temperature: float | None = None, samples: int = 1,
                     generator: torch.Generator | None = None, top_p: float = 1.0) -> float:
    """Greedy pass@1 of `policy` on `examples` of `task` (default: the arithmetic task's Problems).

    With a `temperature`: the mean reward of `samples` completions per example sampled at it (and nucleus `top_p`),
    what the training reward measures, on problems never trained on. RL can raise it by sharpening alone; greedy
    pass@1 rises only where the most likely completion becomes a right one. Samples are drawn from `generator`
    (torch's global one if None)."""
    if not examples:
        raise ValueError("no held-out examples to evaluate")
    if temperature is not None and not temperature > 0:
        raise ValueError(f"sampling needs a positive temperature, got {temperature} (None evaluates greedily)")
    task = task or tasks.load_task("arith", 0, 0, 0)
    samples = 1 if temperature is None else samples
    correct = 0.0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        rollouts = policy.rollout([task.prompt(e) for e in chunk], samples, max_new_tokens,
                                  temperature=1.0 if temperature is None else temperature, top_p=top_p,
                                  greedy=temperature is None, generator=generator)
        correct += tasks.group_rewards(task, chunk, rollouts.texts, samples).sum().item() / samples
    return correct / len(examples)


def load_config(run_dir: Path) -> dict:
    """The run's config.json, or {} for a directory of metrics alone."""
    path = Path(run_dir) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return [record for _, record in checkpoint.metric_lines(path)]


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


def parse_budget(text: str) -> tuple[str, float]:
    """COST=VALUE of --budget, refused with the form it takes."""
    cost, _, value = text.partition("=")
    try:
        if cost in COSTS:
            return cost, float(value)
    except ValueError:
        pass
    raise ValueError(f"--budget takes COST=VALUE, COST one of {', '.join(COSTS)} and VALUE a number (e.g. "
                     f"update_tokens=2e6), got {text!r}")


def budget_line(records: list[dict], policy: str, cost: str, budget: float) -> str:
    """What a policy's run reached within `budget` of `cost`, saying so where the run ended before spending it."""
    total = max(spent(records, policy, cost).items())
    at = accuracy_within_budget(records, policy, cost, budget)
    reached = f"{at[1]:.3f} at iteration {at[0]}" if at else "no evaluation within the budget"
    if total[1] < budget:
        return f"{reached}; the run ended at iteration {total[0]} having spent {total[1]:.4g} of {budget:.4g}"
    return reached


def accuracy_within_budget(records: list[dict], policy: str, cost: str, budget: float) -> tuple[int, float] | None:
    """(iteration, greedy pass@1) of the last evaluation after training began made before the run had spent more
    than `budget` of `cost`; None where none was (iteration 0's measures no training)."""
    costs = spent(records, policy, cost)
    within = [(it, acc) for it, acc in curve(records, policy, "eval/heldout_accuracy")
              if costs.get(it, math.inf) <= budget]
    return within[-1] if within and within[-1][0] > 0 else None


def summarize(run_dir: Path, target: float) -> list[dict]:
    """One row per policy of a run."""
    records, config = load_metrics(run_dir), load_config(run_dir)
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
                     "planned": config.get("iterations"), "heldout": config.get("eval_size"),
                     **{cost: spent(records, policy, cost).get(max(r["iteration"] for r in records), math.nan)
                        for cost in COSTS}})
    return rows


def standard_error(accuracy: float, problems: int | None) -> float:
    """The binomial standard error of an accuracy over `problems` held-out problems (NaN if unknown)."""
    return math.sqrt(accuracy * (1 - accuracy) / problems) if problems else math.nan


def markdown_table(rows: list[dict], target: float) -> str:
    head = ("| run | policy | held-out acc. start | final | best | mean train reward | reward var. "
            f"| iterations to {target:.0%} | received / iteration | train s | rollout tokens | update tokens "
            "| final s.e. | iterations done / planned | held-out problems |\n" + "|---" * 15 + "|\n")
    def cell(v) -> str:
        return ("—" if v is None or (isinstance(v, float) and math.isnan(v))
                else f"{v:.3f}" if isinstance(v, float) else str(v))
    return head + "".join(
        f"| {r['run']} | {r['policy']} | {cell(r['start_accuracy'])} | {cell(r['final_accuracy'])} "
        f"| {cell(r['best_accuracy'])} | {cell(r['mean_train_reward'])} | {cell(r['reward_var'])} "
        f"| {cell(r['iterations_to_target']) if r['iterations_to_target'] is not None else 'not reached'} "
        f"| {cell(r['received_per_iteration'])} | " + " | ".join(rounded_cell(r[cost]) for cost in COSTS)
        + f" | {cell(standard_error(r['final_accuracy'], r['heldout']))} | {r['iterations']} / {r['planned'] or '?'} "
        f"| {r['heldout'] or '?'} |\n" for r in rows)


NOTES = ("reward var.: the iteration-to-iteration variance of the mean training reward, half the mean squared "
         "difference of consecutive iterations, so that a learning trend is not counted as noise. final s.e.: the "
         "binomial standard error of the final held-out accuracy over its problems.\n")


def mismatch_warning(rows: list[dict]) -> str:
    """A warning line where the runs compared differ in iterations done or held-out problems, else ''."""
    differ = [label for label, key in (("iterations done", "iterations"), ("held-out problems", "heldout"))
              if len({r[key] for r in rows}) > 1]
    if not differ:
        return ""
    counts = "; ".join(f"{r['run']}: {r['iterations']} iterations, {r['heldout'] or '?'} problems"
                       for r in {r["run"]: r for r in rows}.values())
    return f"**Warning: the runs differ in {' and '.join(differ)}** ({counts}): compare with care.\n\n"


def rounded_cell(v: float) -> str:
    return "—" if math.isnan(v) else f"{v:.0f}"


def plot_curves(run_dirs: list[Path], path: Path) -> None:
    """Held-out accuracy (greedy, and sampled at the training temperature where logged) and mean training reward
    against iteration, one line per run and policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_acc, ax_rew) = plt.subplots(1, 2, figsize=(11, 4))
    markers, colors = "os^vDP", plt.rcParams["axes.prop_cycle"].by_key()["color"]
    policies_seen: dict[str, str] = {}
    for k, run_dir in enumerate(run_dirs):
        records = load_metrics(run_dir)
        for j, policy in enumerate(dict.fromkeys(r["policy"] for r in records)):
            # one run alone: a color per policy; several: a color per run, a marker per policy, one legend entry each
            color = colors[(j if len(run_dirs) == 1 else k) % len(colors)]
            marker = policies_seen.setdefault(policy, markers[len(policies_seen) % len(markers)])
            label = policy if len(run_dirs) == 1 else Path(run_dir).name if j == 0 else None
            acc = curve(records, policy, "eval/heldout_accuracy")
            ax_acc.plot([i for i, _ in acc], [a for _, a in acc], marker=marker, color=color, label=label)
            sampled = curve(records, policy, "eval/heldout_sampled_accuracy")
            ax_acc.plot([i for i, _ in sampled], [a for _, a in sampled], linestyle="--", color=color)
            rew = curve(records, policy, "charts/reward_mean")
            ax_rew.plot([i for i, _ in rew], smooth([r for _, r in rew]), color=color, marker=marker, markevery=10,
                        label=policy if len(run_dirs) == 1 else None)
    if len(run_dirs) > 1:   # the markers' key, on the reward panel
        for policy, marker in policies_seen.items():
            ax_rew.plot([], [], marker=marker, color="grey", linestyle="none", label=policy)
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


CONVERGED = 0.9
"""the held-out accuracy a report counts as converged (--target)"""


def write_report(run_dir: Path, target: float = CONVERGED) -> str:
    """report.md and curves.png in the run directory (a cross-fidelity run's fidelity report first); returns
    the markdown."""
    run_dir = Path(run_dir)
    fidelity = fidelity_record.fidelity_report(run_dir) if (run_dir / "fidelity.jsonl").exists() else ""
    config = load_config(run_dir)
    settings = "".join(f"- {k}: {v}\n" for k, v in config.items())
    text = (f"# {run_dir.name}\n\n" + fidelity + markdown_table(summarize(run_dir, target), target) + "\n" + NOTES
            + "\n![held-out accuracy and training reward](curves.png)\n"
            + (f"\n<details><summary>config.json</summary>\n\n{settings}\n</details>\n" if config else ""))
    (run_dir / "report.md").write_text(text)
    plot_curves([run_dir], run_dir / "curves.png")
    return text


def compare(run_dirs: list[Path], out: Path, target: float = CONVERGED) -> str:
    """Side-by-side table and curves of several runs, written to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for d in run_dirs for row in summarize(d, target)]
    text = "# comparison\n\n" + mismatch_warning(rows) + markdown_table(rows, target) + "\n" + NOTES
    (out / "comparison.md").write_text(text)
    plot_curves(run_dirs, out / "comparison.png")
    return text


def evaluate_run(run_dir: Path, task_name: str, eval_size: int, data_dir: str | None, max_new_tokens: int | None,
                 devices: str | None = None) -> dict[str, float]:
    """Greedy pass@1 of a run's last checkpoint on a task's held-out split (transfer, proposal §3.3), its policies on
    `devices` (default: those it trained on)."""
    config, task_cfg, pols = run_policies(Path(run_dir), devices)
    task = tasks.load_task(task_name, config["seed"], 0, eval_size, task_cfg, data_dir)
    return {p.name: heldout_accuracy(p, task.heldout, max_new_tokens or config["max_new_tokens"], task) for p in pols}


def run_policies(run_dir: Path, devices: str | None = None
                 ) -> tuple[dict, arith.TaskConfig, list[policies.Policy]]:
    """A run's config.json, its task's shape and its policies at its last checkpoint, built exactly as train.py
    built them, on `devices` (default: those it trained on); the curator's state, if any, is not loaded."""
    config = json.loads((run_dir / "config.json").read_text())
    config["devices"] = devices or config["devices"]
    task_cfg = arith.TaskConfig(num_steps=config["num_steps"], max_operand=config["max_operand"], ops=config["ops"],
                                step_format=config.get("step_format", arith.TaskConfig.step_format))
    setup = policies.PolicySetup.of(config)
    pols = policies.build_policies(setup, policies.policy_devices(config["devices"], len(
        presets.PRESETS[setup.scale][setup.pair])), task_cfg)
    checkpoint.load_checkpoint(run_dir, pols)
    return config, task_cfg, pols


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring): a run's report, a comparison, a budget, a --task evaluation, or the
    analysis of the matrix's summaries."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--matrix", type=Path, nargs="+", default=None, help="folders of run summaries "
                        "(benchmarks/matrix.py): the comparison's analysis of them pooled, written in the last "
                        "(analysis/matrix.py)")
    parser.add_argument("--blocks", type=Path, default=None, help="the folder holding the matrix's set folders "
                        "(results): blocks 2-6, H4, H5 and H3 by the registrations' rules, and beside them the "
                        "verdicts of the two blocks with an unpaired seed as published and repaired, written in its "
                        "matrix/ "
                        "(analysis/blocks.py, analysis/review.py)")
    parser.add_argument("--target", type=float, default=CONVERGED, help="accuracy that counts as converged")
    parser.add_argument("--out", type=Path, default=None, help="where a comparison goes (default: runs/compare)")
    parser.add_argument("--task", choices=tasks.TASK_NAMES, default=None,
                        help="evaluate each run's last checkpoint on this task's held-out split instead of reporting")
    parser.add_argument("--data-dir", default=None, help="local copy of the --task data set")
    parser.add_argument("--eval-size", type=int, default=Args.eval_size, help="held-out examples for --task")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="for --task; default: the run's")
    parser.add_argument("--devices", default=None, help="for --task: torch devices of the policies, as train.py's "
                        "--devices; default: the run's")
    parser.add_argument("--budget", default=None, help=f"COST=VALUE, COST one of {', '.join(COSTS)}: each run's "
                        "held-out accuracy at its last evaluation within that budget")
    cli = parser.parse_args(argv)
    if cli.matrix or cli.blocks:   # the analysis of summaries: runs' evaluation and reports do not need it
        from analysis import blocks, matrix, review
        print(matrix.report(cli.matrix) if cli.matrix else blocks.report(cli.blocks) + "\n" + review.report(cli.blocks))
        return
    if not cli.runs:
        parser.error("give run directories, --matrix FOLDER or --blocks FOLDER")
    if cli.budget:
        try:
            cost, budget = parse_budget(cli.budget)
        except ValueError as err:
            parser.error(str(err))
        for run in cli.runs:
            records = load_metrics(run)
            for policy in dict.fromkeys(r["policy"] for r in records):
                print(f"{run} {policy}: {budget_line(records, policy, cost, budget)}")
        return
    if cli.task:
        for run in cli.runs:
            accuracy = evaluate_run(run, cli.task, cli.eval_size, cli.data_dir, cli.max_new_tokens, cli.devices)
            print(f"{run}: {cli.task} greedy pass@1 " + ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items()))
        return
    if len(cli.runs) == 1:
        print(write_report(cli.runs[0], cli.target))
        print(f"wrote {cli.runs[0] / 'report.md'} and {cli.runs[0] / 'curves.png'}")
    else:
        out = cli.out or cli.runs[0].parent / "compare"
        print(compare(cli.runs, out, cli.target))
        print(f"wrote {out / 'comparison.md'} and {out / 'comparison.png'}")


if __name__ == "__main__":
    main()
