"""Evaluation: held-out accuracy, reward variance, convergence speed; reports and run comparisons.

The proposal's §3.1 metrics, per policy:
  accuracy     greedy pass@1 on the held-out split (never trained on: tasks.py splits by a hash)
  reward var.  iteration-to-iteration variance of the mean training reward, estimated as half the mean squared
               difference of consecutive iterations (von Neumann), so a learning trend does not count as noise
  convergence  the first iteration at which held-out accuracy reaches a target
and, for runs that share, what crossed into each policy per iteration (sharing/received: peer trajectories for
PRP and SGT, peer rewards in the group baselines for XGRPO).

    python eval.py runs/qwen-llama-none-s1                     # one run: report.md and curves.png in it
    python eval.py runs/A runs/B runs/C --out runs/compare     # side by side
    python eval.py runs/A --task gsm8k --data-dir data/gsm8k   # transfer: the last checkpoint on another task
"""

from __future__ import annotations

import argparse
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import torch

import hardware
import policies
import tasks


def default_workers() -> int:
    """Programs judged at once: eight per core. An iteration of programs that all loop then takes
    batch / workers wall-clock limits; more of them than this would share a core so thinly that a correct
    program beside the loops could run past its own limit (benchmarks/code_reward.py measures both sides)."""
    return 8 * (os.cpu_count() or 1)


def rewards(task: tasks.Task, examples: list, completions: list[str], workers: int | None = None) -> torch.Tensor:
    """[N] the task's reward of each completion. Code is judged in sandboxes (sandbox.py), `workers` programs at a
    time (default: `default_workers()`); everything else in this thread, where math-verify can bound its work
    (its timeout needs the main thread)."""
    if task.reward is not tasks.code_reward:
        return torch.tensor([task.reward(e, c) for e, c in zip(examples, completions)], dtype=torch.float32)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        return torch.tensor(list(pool.map(task.reward, examples, completions)), dtype=torch.float32)


def heldout_accuracy(policy, examples: list, max_new_tokens: int, task: tasks.Task | None = None,
                     batch_size: int = 256, temperature: float | None = None, samples: int = 1) -> float:
    """Greedy pass@1 of `policy` on `examples` of `task` (default: the arithmetic task's Problems).

    With a `temperature`: the mean reward of `samples` completions per example sampled at it, what the training
    reward measures, on problems never trained on. RL can raise it by sharpening alone; greedy pass@1 rises only
    where the most likely completion becomes a right one."""
    if not examples:
        raise ValueError("no held-out examples to evaluate")
    task = task or tasks.load_task("arith", 0, 0, 0)
    samples = 1 if temperature is None else samples
    correct = 0.0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        rollouts = policy.rollout([task.prompt(e) for e in chunk], samples, max_new_tokens,
                                  temperature=temperature or 1.0, greedy=temperature is None)
        correct += rewards(task, [e for e in chunk for _ in range(samples)], rollouts.texts).sum().item() / samples
    return correct / len(examples)


def load_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(records: list[dict], policy: str, key: str) -> list[tuple[int, float]]:
    return [(r["iteration"], r[key]) for r in records if r["policy"] == policy and key in r]


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
                     "iterations": max((r["iteration"] for r in records), default=0)})
    return rows


def markdown_table(rows: list[dict], target: float) -> str:
    head = ("| run | policy | held-out acc. start | final | best | mean train reward | reward var. "
            f"| iterations to {target:.0%} | received / iteration |\n|---|---|---|---|---|---|---|---|---|\n")
    def cell(v) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}" if isinstance(v, float) else str(v)
    return head + "".join(
        f"| {r['run']} | {r['policy']} | {cell(r['start_accuracy'])} | {cell(r['final_accuracy'])} "
        f"| {cell(r['best_accuracy'])} | {cell(r['mean_train_reward'])} | {cell(r['reward_var'])} "
        f"| {cell(r['iterations_to_target']) if r['iterations_to_target'] is not None else 'not reached'} "
        f"| {cell(r['received_per_iteration'])} |\n"
        for r in rows)


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


TERMS = ("tbd", "ccm", "rsd")
LEVELS = ("prp", "xgrpo", "sgt", "rejected")


def quantiles(values: list[float]) -> str:
    """'mean (p10 / p50 / p90)' of a list, '—' when empty."""
    if not values:
        return "—"
    q = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return f"{sum(values) / len(values):.3f} ({q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f})"


def marked_text(record: dict) -> str:
    """A trajectory's steps, one per line, with each step's terms and the terms it is a hotspot of; the TBD
    hotspot tokens bracketed as [[...]] in the text."""
    data = record["text"].encode("utf-8")
    marks = sorted({tuple(span) for span in record.get("tbd_bytes", [])})
    text, at = b"", 0
    for a, b in marks:
        if a >= at:
            text += data[at:a] + b"[[" + data[a:b] + b"]]"
            at = b
    lines = [f"    {(text + data[at:]).decode('utf-8', errors='replace')!r}"]
    for k, step in enumerate(record["steps"]):
        values = "  ".join(f"{t} {step[t]:.2f}" if step[t] is not None else f"{t} —" for t in TERMS)
        hot = f"  <- {', '.join(t.upper() for t in step['hot'])} hotspot" if step["hot"] else ""
        lines.append(f"    step {k}: {step['text']!r:<28} {values}{hot}")
    return "\n".join(lines)


def fidelity_report(run_dir: Path, worst: int = 5, windows: int = 4) -> str:
    """The curator's record of a cross-fidelity run (fidelity.jsonl): D and its terms per source -> receiver
    pair, which term dominates, admission shares over time, the predictor, and the worst trajectories marked."""
    records = [json.loads(line) for line in (Path(run_dir) / "fidelity.jsonl").read_text().splitlines() if line]
    scored = [r for r in records if "D" in r]
    pairs = sorted({(r["source"], r["receiver"]) for r in records})
    out = ["## Fidelity (cross-fidelity curation)\n",
           "Terms are in [0, 1]; D = sum lambda_i term_i, fidelity = 1 - D. TBD is the credit-boundary measure "
           "(curator.py); tbd_jaccard is tokalign's byte-boundary similarity, shown for comparison. "
           "Cells: mean (p10 / p50 / p90) over fully diagnosed trajectories.\n",
           "| source -> receiver | diagnosed | D | TBD | CCM | RSD | tbd_jaccard | dominant term (share) "
           "| repaired D |", "|---|---|---|---|---|---|---|---|---|"]
    for src, rcv in pairs:
        mine = [r for r in scored if (r["source"], r["receiver"]) == (src, rcv)]
        terms = {t: [r["terms"][t] for r in mine if r["terms"][t] is not None and not math.isnan(r["terms"][t])]
                 for t in TERMS}
        dominant = {t: sum(r["dominant"] == t for r in mine) / max(len(mine), 1) for t in TERMS}
        out.append(f"| {src} -> {rcv} | {len(mine)} | {quantiles([r['D'] for r in mine])} | "
                   + " | ".join(quantiles(terms[t]) for t in TERMS)
                   + f" | {quantiles([r['tbd_jaccard'] for r in mine])} | "
                   + ", ".join(f"{t.upper()} {v:.0%}" for t, v in dominant.items())
                   + f" | {quantiles([r['D_repaired'] for r in mine])} |")
    last = max((r["iteration"] for r in records), default=0)
    edges = sorted({round(last * i / windows) for i in range(windows + 1)})
    out += ["\nAdmission shares over time (all offered trajectories):\n",
            "| source -> receiver | iterations | " + " | ".join(LEVELS) + " | moved finer by the repair | skipped by predictor |",
            "|---|---|" + "---|" * (len(LEVELS) + 2)]
    for src, rcv in pairs:
        for lo, hi in zip(edges, edges[1:]):
            mine = [r for r in records if (r["source"], r["receiver"]) == (src, rcv) and lo < r["iteration"] <= hi]
            if mine:
                out.append(f"| {src} -> {rcv} | {lo + 1}-{hi} | "
                           + " | ".join(f"{sum(r['level'] == lv for r in mine) / len(mine):.0%}" for lv in LEVELS)
                           + f" | {sum(bool(r.get('through_repair')) for r in mine) / len(mine):.0%}"
                           + f" | {sum(bool(r.get('skipped')) for r in mine) / len(mine):.0%} |")
    crossed = [r for r in records if "carried" in r and r["carried"] != 0]
    if crossed:
        out += ["\nWhere the repairs acted on what crossed as tokens (credit per unit of the carried advantage A; "
                "separators and EOS close the step before them):\n",
                "| source -> receiver | crossed | steps' credit / A | separators' and EOS credit / A "
                "| phantom advantage mean_k abs(A) (1 - R_k) |", "|---|---|---|---|---|"]
        for src, rcv in pairs:
            mine = [r for r in crossed if (r["source"], r["receiver"]) == (src, rcv)]
            steps = [c / r["carried"] for r in mine for c in r["step_credit"]]
            outside = [c / r["carried"] for r in mine for c in r["outside_credit"]]
            phantom = [r["phantom"] for r in mine if r["phantom"] is not None]
            if mine:
                out.append(f"| {src} -> {rcv} | {len(mine)} | {quantiles(steps)} | {quantiles(outside)} "
                           f"| {quantiles(phantom)} |")
    out.append(f"\nThe {worst} most degraded distinct trajectories ([[...]]: TBD hotspot tokens; a group's "
               "repeated samples shown once):\n")
    distinct = {(r["iteration"], r["source"], r["receiver"], r["prompt"], r["text"]): r for r in scored}
    for r in sorted(distinct.values(), key=lambda r: -r["D"])[:worst]:
        out.append(f"- iteration {r['iteration']}, {r['source']} -> {r['receiver']}, reward {r['reward']:.0f}, "
                   f"D {r['D']:.3f} (dominant {r['dominant'].upper()}) -> repaired {r['D_repaired']:.3f}: "
                   f"{r['level']} ({r['reason']})\n```\n{marked_text(r)}\n```")
    return "\n".join(out) + "\n\n"


def write_report(run_dir: Path, target: float = 0.9) -> str:
    """report.md and curves.png in the run directory (a cross-fidelity run's fidelity report first); returns
    the markdown."""
    run_dir = Path(run_dir)
    fidelity = fidelity_report(run_dir) if (run_dir / "fidelity.jsonl").exists() else ""
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
    args = SimpleNamespace(**json.loads((Path(run_dir) / "config.json").read_text()))
    task_cfg = tasks.TaskConfig(num_steps=args.num_steps, max_operand=args.max_operand, ops=args.ops)
    pols = hardware.build_policies(args, args.scale, hardware.policy_devices(args.devices, len(
        policies.PRESETS[args.scale][args.pair])), task_cfg)   # exactly as train.py built them
    hardware.load_checkpoint(Path(run_dir), pols, None)  # the curator's state, if any, is not needed here
    task = tasks.load_task(task_name, args.seed, 0, eval_size, task_cfg, data_dir)
    return {p.name: heldout_accuracy(p, task.heldout, max_new_tokens or args.max_new_tokens, task) for p in pols}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--target", type=float, default=0.9, help="accuracy that counts as converged")
    parser.add_argument("--out", type=Path, default=None, help="where a comparison goes (default: runs/compare)")
    parser.add_argument("--task", choices=tasks.TASK_NAMES, default=None,
                        help="evaluate each run's last checkpoint on this task's held-out split instead of reporting")
    parser.add_argument("--data-dir", default=None, help="local copy of the --task data set")
    parser.add_argument("--eval-size", type=int, default=500, help="held-out examples for --task")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="for --task; default: the run's")
    cli = parser.parse_args()
    if cli.task:
        for run in cli.runs:
            accuracy = evaluate_run(run, cli.task, cli.eval_size, cli.data_dir, cli.max_new_tokens)
            print(f"{run}: {cli.task} greedy pass@1 " + ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items()))
        raise SystemExit
    if len(cli.runs) == 1:
        print(write_report(cli.runs[0], cli.target))
    else:
        print(compare(cli.runs, cli.out or cli.runs[0].parent / "compare", cli.target))
