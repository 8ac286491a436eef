"""Probe a warm-up recipe for the default pair, the tool the default recipe was chosen with (docs/results.md,
"Independent GRPO, default run"): held-out greedy pass@1, accuracy sampled at the training temperature, and the
share of greedy completions that work every step, right after the warm-up and, with --iterations, after that
many iterations of train.py with independent GRPO (--share none, as the recipe was chosen).

    python -m benchmarks.recipe_probe --premature-share 0.7 --iterations 100 --lr 1e-4
    python -m benchmarks.recipe_probe --premature-share 0.0              # the old warm-up, probed only
    python -m benchmarks.recipe_probe -- --warmup-scale 0.1 --eval-size 100   # train.py flags after --
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace

import torch

import eval as evaluation
import train
from args import Args, script_args
from testbed import checkpoint
from testbed import arith
from testbed import policies
from testbed import presets
from testbed import tasks


def probe(pols: list[policies.Policy], task: tasks.Task, run: Args, tag: str) -> None:
    for p in pols:
        greedy = p.rollout([task.prompt(e) for e in task.heldout], 1, run.max_new_tokens, greedy=True)
        accuracy = tasks.rewards(task, task.heldout, greedy.texts).mean().item()
        steps = [sum(bool(arith.STEP_RE.match(line)) for line in text.splitlines()) for text in greedy.texts]
        complete = sum(n >= run.num_steps for n in steps) / len(steps)
        sampled = evaluation.heldout_accuracy(p, task.heldout, run.max_new_tokens, task, temperature=run.temperature,
                                              samples=2)
        print(f"{tag} {p.name}: greedy {accuracy:.3f}, sampled at {run.temperature} {sampled:.3f}, "
              f"greedy completions with every step {complete:.2f}", flush=True)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--premature-share", type=float, default=0.7)
    cli.add_argument("--iterations", type=int, default=0)
    cli.add_argument("--lr", type=float, default=1e-4)
    cli.add_argument("--seed", type=int, default=1)
    cli.add_argument("--threads", type=int, default=2)
    cli.add_argument("flags", nargs="*", help="train.py flags after --, the probed run's other settings")
    args = cli.parse_args()
    torch.set_num_threads(args.threads)
    preset = presets.PRESETS["tiny"]["qwen-llama"]
    presets.PRESETS["tiny"]["qwen-llama"] = [
        replace(s, tiny=replace(s.tiny, premature_share=args.premature_share)) for s in preset]
    with tempfile.TemporaryDirectory() as tmp:
        run = script_args("recipe_probe.py", args.flags, pair="qwen-llama", share="none", iterations=args.iterations,
                          lr=args.lr, seed=args.seed, name="probe", runs_dir=tmp, cache_dir=tmp,
                          eval_every=max(args.iterations, 1))
        task = tasks.load_task("arith", run.seed, run.train_size, run.eval_size, run.task_config)
        pols = policies.build_policies(run.policy_setup("tiny"), [torch.device("cpu")] * len(preset), run.task_config)
        probe(pols, task, run, "start")
        if args.iterations:
            run_dir = train.main(run)
            checkpoint.load_checkpoint(run_dir, pols)
            probe(pols, task, run, f"after {args.iterations} iterations")


if __name__ == "__main__":
    main()
