"""RSD on a real example (reward_drift.py's concept, §1.3): two tiny policies' step statistics side by side, each
step type's success rate and the drift D_RSD between them both ways, then the RSD term the curator would give a few
of one policy's trajectories shared with the other (the mean over typed steps, diagnosis.mean_or_zero).

    python -m benchmarks.reward_drift_demo [--warmup-scale 1.0] [--problems 256]

It lives here, not under reward_drift.py's `__main__`, because it reads the curator's term, and diagnosis.py imports
reward_drift.py: a demo there would close an import circle."""

import argparse

import torch

from diagnosis import mean_or_zero
from reward_drift import StepStats, process_rewards, rsd_steps, step_drift
from testbed import arith, policies, tasks


def main() -> None:
    cli = argparse.ArgumentParser(description="RSD demo on the tiny qwen-llama pair")
    cli.add_argument("--warmup-scale", type=float, default=1.0)
    cli.add_argument("--problems", type=int, default=256)
    args = cli.parse_args()
    cfg = arith.TaskConfig()
    pols = policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), cfg, 1, warmup_scale=args.warmup_scale)
    problems = arith.generate_problems(args.problems, "heldout", 2, cfg)
    task = tasks.load_task("arith", 2, 0, 0, cfg)
    stats, rewards = {}, {}
    torch.manual_seed(0)
    for p in pols:
        out = p.rollout([arith.prompt_text(q) for q in problems], 4, 40, temperature=0.7)
        rewards[p.name] = [process_rewards(task, q, t)
                           for t, q in zip(out.texts, (q for q in problems for _ in range(4)))]
        stats[p.name] = StepStats(window=1)
        stats[p.name].add_iteration([s for r in rewards[p.name] for s in r])
    a, b = (p.name for p in pols)
    print(f"{'type':<6} {a + ' success':>14} {'(n)':>6} {b + ' success':>14} {'(n)':>6} "
          f"{'D(' + a + '||' + b + ')':>16} {'D(' + b + '||' + a + ')':>16}")
    for kind in sorted(stats[a].types | stats[b].types):
        na, nb = stats[a].counts(kind)[1], stats[b].counts(kind)[1]
        print(f"{kind:<6} {stats[a].success_rate(kind):>14.3f} {na:>6.0f} {stats[b].success_rate(kind):>14.3f} "
              f"{nb:>6.0f} {step_drift(stats[a], stats[b], kind):>16.4f} {step_drift(stats[b], stats[a], kind):>16.4f}")
    for r in rewards[a][::4][:4]:  # one sample of each of four problems
        print(f"{a}'s trajectory {[s.type for s in r if s.type]} shared with {b}: "
              f"RSD term = {mean_or_zero(rsd_steps(stats[a], stats[b], r)):.4f}")


if __name__ == "__main__":
    main()
