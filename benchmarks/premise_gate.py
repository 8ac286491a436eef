"""The validation gate U must pass before any P-measurement (results/preregistration-premise.md): offers of one
cross-fidelity run's iteration, U of each beside its real one-step lookahead.

Per offer the lookahead is one SGD step of size lr on g_o, the receiver's held-out reward re-measured on the same
draws (common random numbers: `heldout_rewards` seeded alike before and after), the weights restored. lr is the
smallest rung of the registered ladder at which the top-decile update of the first offers moves held-out reward by
at least 3 standard errors of its paired per-prompt differences. U passes where rho(U, lookahead) is positive with
its interval above 0, or the top decile of U taken as one update beats the bottom decile (paired per-prompt
differences, interval above 0); and only where the split-half rho of U's two halves reaches 0.5, else g_J's
samples are doubled (up to 4 times) and the gate measured again on the same offers. The decision rules are
analysis/premise_stats.py's; this file runs them on a policy."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

import train
from analysis import premise_registered as registered
from analysis import premise_stats as stats
from args import Args
from benchmarks import premise_usefulness as usefulness


def decile_change(indices: list[int], lr: float, gradients: list[torch.Tensor], receivers: list[str],
                  policy_of: dict, before: dict[str, np.ndarray], measure) -> np.ndarray:
    """[prompts] the per-prompt change of held-out reward when the offers `indices` are taken as one update of
    size lr (per receiver, their mean g_o: the gradient of their batch's GRPO loss), averaged over the receivers
    they go to."""
    changes = []
    for name in sorted({receivers[i] for i in indices}):
        step = torch.stack([gradients[i] for i in indices if receivers[i] == name]).mean(0)
        changes.append(usefulness.after_step(policy_of[name], step, lr, measure) - before[name])
    return np.mean(changes, axis=0)


def gate(args: Args, offers: int, sizes: registered.Sizes, out: Path) -> dict:
    """The gate on `offers` random diagnosed offers with A != 0 at iteration args.iterations; writes and returns
    its verdict and numbers (out/gate-s{seed}.json)."""
    started = time.process_time()
    task, _ = train.load_tasks(args)
    learners, curation = usefulness.train_to(args)
    rng = random.Random(f"premise/gate/{args.seed}")
    pool = usefulness.candidates(args, learners, curation, task)
    picked = rng.sample(pool, min(offers, len(pool)))
    print(f"{len(pool)} diagnosed offers with A != 0 at iteration {args.iterations}; {len(picked)} drawn")
    if len(picked) < 10:
        raise SystemExit("too few offers carry a gradient for deciles: train longer, or draw more prompts")
    policy_of = {l.name: l.policy for l in learners}
    receivers = [c.receiver.policy.name for c in picked]
    gradients = [usefulness.candidate_gradient(c, args.temperature) for c in picked]
    measure = partial(usefulness.heldout_rewards, task=task, problems=task.heldout[:sizes.lookahead_prompts],
                      samples=sizes.lookahead_samples, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, seed=args.seed)
    before = {name: measure(policy_of[name]) for name in sorted(set(receivers))}
    decile_move = partial(decile_change, gradients=gradients, receivers=receivers, policy_of=policy_of,
                          before=before, measure=measure)
    lookaheads: dict[float, list[float]] = {}     # per lr, each offer's change: U's tries share them
    cpu = {}

    def lookahead_at(lr: float) -> list[float]:
        if lr not in lookaheads:
            t0 = time.process_time()
            lookaheads[lr] = [float((usefulness.after_step(policy_of[name], g, lr, measure) - before[name]).mean())
                              for g, name in zip(gradients, receivers)]
            cpu["lookahead_per_offer"] = (time.process_time() - t0) / len(picked)
        return lookaheads[lr]

    def attempt(samples: int) -> dict:
        t0 = time.process_time()
        halves = {name: usefulness.heldout_halves(policy_of[name], task, task.heldout[:sizes.heldout_prompts], samples,
                                                  args, f"premise/gate/{args.seed}/{name}/{samples}")
                  for name in before}
        cpu["heldout_gradient_per_receiver"] = (time.process_time() - t0) / len(halves)
        u_halves = [[usefulness.usefulness(g, h) for h in halves[name]] for g, name in zip(gradients, receivers)]
        judged = stats.judge(u_halves, lookahead_at, decile_move, rng)
        rank, decile = judged["rank"], judged["decile"]
        rung = "" if judged["lr_resolved"] else ", no rung reached 3 SE: the largest"
        print(f"g_J at {samples} samples: split-half rho {judged['split_half_rho']:+.3f}; lr {judged['lr']}{rung}; "
              f"rho(U, lookahead) {rank['value']:+.3f} [{rank['low']:+.3f}, {rank['high']:+.3f}]; top - bottom "
              f"decile {decile['mean']:+.4f} [{decile['low']:+.4f}, {decile['high']:+.4f}]")
        return {"heldout_samples": samples, **judged, "cpu_s": dict(cpu)}

    tries = stats.until_reliable(attempt, sizes.heldout_samples)
    result = {"seed": args.seed, "preset": args.pair, "iteration": args.iterations, "offers": len(picked),
              "pool": len(pool), "receivers": receivers, "sizes": dataclasses.asdict(sizes), "tries": tries,
              "passes": tries[-1]["passes"], "cpu_s": time.process_time() - started}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gate-s{args.seed}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"U {'PASSES' if result['passes'] else 'FAILS'} the gate; {path} ({result['cpu_s']:.0f} CPU s)")
    return result
