"""The tiny warm-up's supervised curve on the default run's policies, and those policies' packaged warm-ups (issue 69).

    python -m benchmarks.warmup_curve              # the curve: results/warmup-curve-s1.json and .md
    python -m benchmarks.warmup_curve --package    # make testbed/warmups/ anew (after the warm-up recipe changed)

The curve: each policy of the default pair (args.Args) warmed up on the default seed exactly as a run warms it
(policies.supervised_warmup, its seed, budget and recipe), at one thread, its weights kept every --every steps; then
at each kept step the training loss (its mean over the steps since the one before), greedy pass@1 and the accuracy
sampled at the training temperature (2 completions a problem), both on the run's 500 held-out problems, as the run's
first evaluation measures them. Whether the loss and the accuracies stop moving long before the budget ends is
whether a shorter warm-up would give the same start. The last weights are compared with the packaged file
(the same bits where this machine's one-thread kernels made it). The seconds are the warm-up's alone, as the
machine's load allowed.

--package: the default run's warm-ups made anew, at one thread, by the run's own code path (policies.load_tiny_policy
into an empty cache, the old packaged files removed first, git keeps them), and copied into testbed/warmups/;
prints each warm-up's seconds. tests/test_packaged_warmups.py fails while the files there are not the ones the
default run asks for.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import eval as evaluation
from args import Args
from testbed import arith, checkpoint, policies, presets, tasks, tiny

ROOT = Path(__file__).resolve().parents[1]


def default_policies(seed: int) -> list[tuple[presets.PolicySpec, int]]:
    """The default pair's tiny policies, each with the seed a run on `seed` warms it up with (presets.tiny_seed)."""
    return [(spec, presets.tiny_seed(spec, i, seed)) for i, spec in enumerate(presets.preset(Args().pair, "tiny"))]


def curve(spec: presets.PolicySpec, seed: int, task_cfg: arith.TaskConfig, every: int, cache_dir: str
          ) -> tuple[list[float], dict[int, dict[str, torch.Tensor]], float, policies.Policy]:
    """One policy's warm-up as a run makes it: its losses, its weights every `every` steps (and before the first),
    its seconds, and the policy as it ends."""
    tokenizer = tiny.tiny_tokenizer(spec.family, task_cfg.step_format, cache_dir)
    policy = policies.Policy(spec.name, tiny.tiny_model(spec.family, spec.tiny, len(tokenizer), seed), tokenizer,
                             use_chat_template=False)
    kept = {0: {k: v.clone() for k, v in policy.model.state_dict().items()}}

    def keep(step: int) -> None:
        if step % every == 0 or step == spec.tiny.warmup_steps:
            kept[step] = {k: v.clone() for k, v in policy.model.state_dict().items()}
    started = time.perf_counter()
    losses = policies.supervised_warmup(policy, spec.tiny.warmup_steps, task_cfg, seed, spec.tiny.premature_share,
                                        after_step=keep)
    return losses, kept, time.perf_counter() - started, policy


def evaluated(policy: policies.Policy, kept: dict[int, dict[str, torch.Tensor]], losses: list[float], task: tasks.Task,
              args: Args) -> list[dict[str, float]]:
    """At each kept step: the mean training loss since the kept step before, greedy pass@1 and sampled accuracy on
    the held-out problems (each sampled from one fixed stream, so the steps differ by the weights alone)."""
    rows, before = [], 0
    for step, state in sorted(kept.items()):
        policy.model.load_state_dict(state)
        window = losses[before:step]
        sampled = evaluation.heldout_accuracy(policy, task.heldout, args.max_new_tokens, task,
                                              temperature=args.temperature, samples=args.eval_samples,
                                              generator=torch.Generator().manual_seed(0), top_p=args.top_p)
        rows.append({"step": step, "train_loss": sum(window) / len(window) if window else None,
                     "greedy": evaluation.heldout_accuracy(policy, task.heldout, args.max_new_tokens, task),
                     "sampled": sampled})
        before = step
    return rows


def packaged_file(spec: presets.PolicySpec, seed: int, task_cfg: arith.TaskConfig, vocab_size: int) -> Path:
    """Where the packaged warm-up of this policy and seed would lie (tiny.PACKAGED_WARMUPS)."""
    key = policies.warmup_key(spec, task_cfg, seed, spec.tiny.warmup_steps, vocab_size)
    return tiny.PACKAGED_WARMUPS / f"{spec.name}-{key}.pt"


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(report: dict) -> str:
    lines = [f"# The tiny warm-up's curve, default pair, seed {report['seed']} (issue 69)", "",
             f"`python -m benchmarks.warmup_curve` at {report['commit']}, one thread: each policy warmed up as the "
             f"default run warms it; at every {report['every']} steps the mean training loss since the step before, "
             f"greedy pass@1 and accuracy sampled at {report['temperature']} ({report['samples']} a problem) on the "
             f"run's {report['problems']} held-out problems.", ""]
    for name, one in report["policies"].items():
        lines += [f"## {name}: {one['steps']} steps, {one['seconds']:.0f} s of warm-up (seed {one['seed']}, "
                  f"key {one['key']}; last weights {'equal' if one['equals_packaged'] else 'NOT equal'} to the "
                  f"packaged file's)", "", "| step | train loss | greedy | sampled |", "|---|---|---|---|"]
        lines += [f"| {r['step']} | {cell(r['train_loss'])} | {r['greedy']:.3f} | {r['sampled']:.3f} |"
                  for r in one["curve"]]
        lines.append("")
    return "\n".join(lines)


def measure(seed: int, every: int, out: Path) -> None:
    args = Args(seed=seed)
    task_cfg = args.task_config
    task = tasks.load_task(args.task, seed, args.train_size, args.eval_size, task_cfg, args.data_dir)
    report = {"seed": seed, "pair": args.pair, "every": every, "threads": torch.get_num_threads(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(),
              "temperature": args.temperature, "samples": args.eval_samples, "problems": len(task.heldout),
              "policies": {}}
    with tempfile.TemporaryDirectory() as cache:
        for spec, policy_seed in default_policies(seed):
            losses, kept, seconds, policy = curve(spec, policy_seed, task_cfg, every, cache)
            packaged = packaged_file(spec, policy_seed, task_cfg, len(policy.tokenizer))
            equal = packaged.exists() and all(torch.equal(a, b) for a, b in zip(
                torch.load(packaged).values(), kept[spec.tiny.warmup_steps].values()))
            report["policies"][spec.name] = {
                "seed": policy_seed, "steps": spec.tiny.warmup_steps, "seconds": seconds, "key": packaged.stem,
                "equals_packaged": equal, "fingerprint": checkpoint.weights_fingerprint(policy.model),
                "losses": losses, "curve": evaluated(policy, kept, losses, task, args)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def package(seed: int) -> None:
    """The default run's warm-ups made anew by the run's own code path, in place of the packaged ones."""
    task_cfg = Args().task_config
    for old in tiny.PACKAGED_WARMUPS.glob("*.pt"):
        old.unlink()      # so that the run's path warms up anew (git keeps the old files)
    with tempfile.TemporaryDirectory() as cache:
        for spec, policy_seed in default_policies(seed):
            tiny.tiny_tokenizer(spec.family, task_cfg.step_format, cache)   # trimmed outside the timing
            started = time.perf_counter()
            policies.load_tiny_policy(spec, task_cfg, policy_seed, cache, 1.0)
            print(f"{spec.name}: {time.perf_counter() - started:.1f} s of warm-up at one thread")
        tiny.PACKAGED_WARMUPS.mkdir(exist_ok=True)
        for made in (Path(cache) / "warmup").glob("*.pt"):
            shutil.copy(made, tiny.PACKAGED_WARMUPS / made.name)
            print(f"{tiny.PACKAGED_WARMUPS / made.name}: {made.stat().st_size} bytes")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--package", action="store_true", help="make the packaged warm-ups anew (testbed/warmups/)")
    cli.add_argument("--seed", type=int, default=Args().seed, help="the curve's seed (the packaged warm-ups are the "
                     "default seed's alone)")
    cli.add_argument("--every", type=int, default=100, help="steps between the curve's points")
    cli.add_argument("--out", type=Path, default=None, help="default results/warmup-curve-sSEED (.json and .md)")
    options = cli.parse_args()
    torch.set_num_threads(1)   # the packaged warm-ups are one thread's: the warm-up's float sums depend on the count
    if options.package:
        package(Args().seed)
    else:
        measure(options.seed, options.every, options.out or ROOT / "results" / f"warmup-curve-s{options.seed}")


if __name__ == "__main__":
    main()
