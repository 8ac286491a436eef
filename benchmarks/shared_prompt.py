"""What computing each prompt once per group saves the update (sequences.completion_logprobs).

    python -m benchmarks.shared_prompt --seed 900

A group's G completions share one prompt, and about half of the positions an update computes are its copies.
This samples one iteration's rollouts (16 prompts x G) of each tiny policy and takes the completions' mean NLL,
forward and backward, the two ways the update can: each prompt once, its KV cache repeated for its completions
(the update's way), and every row whole (its way under gradient checkpointing, which keeps no cache). It prints
the seconds of each (best of `--repeats`), the two losses and the largest gradient difference. The sums run in
another order, so the gradients agree to float rounding, not bit for bit. One thread; never a comparison seed.
"""

from __future__ import annotations

import argparse
import time

import torch

from testbed import arith
from testbed import policies
from testbed import sequences


def timed_gradient(model, groups: sequences.PromptGroups, cache: str | None, repeats: int
                   ) -> tuple[float, float, torch.Tensor]:
    """Best seconds of the completions' mean NLL forward and backward, the loss, and the flat gradient."""
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logprobs, _ = sequences.completion_logprobs(model, groups, 1.0, cache)                # [n, C]
        loss = -(logprobs * groups.completion_mask).sum() / groups.completion_mask.sum()
        loss.backward()
        best = min(best, time.perf_counter() - start)
    return best, loss.item(), torch.cat([w.grad.flatten() for w in model.parameters() if w.grad is not None])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seed", type=int, default=900)
    cli.add_argument("--group-size", type=int, default=8)
    cli.add_argument("--prompts", type=int, default=16)
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--warmup-scale", type=float, default=1.0, help="the tiny policies' warm-up budget factor")
    args = cli.parse_args()
    torch.set_num_threads(1)
    task_cfg = arith.TaskConfig()
    problems = arith.generate_problems(args.prompts, "train", args.seed + 2, task_cfg)
    for policy in policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), task_cfg, args.seed,
                                         warmup_scale=args.warmup_scale):
        out = policy.rollout([arith.prompt_text(q) for q in problems], args.group_size, 40,
                             generator=torch.Generator().manual_seed(args.seed))
        input_ids, _, mask = sequences.pack_sequences([p.tolist() for p in out.prompt_ids],
                                                      [c.tolist() for c in out.completion_ids], 0)
        groups = sequences.prompt_groups(input_ids, mask, list(range(len(input_ids))))
        policy.model.train()
        whole = timed_gradient(policy.model, groups, None, args.repeats)
        shared = timed_gradient(policy.model, groups, sequences.cache_keyword(policy.model), args.repeats)
        print(f"{policy.name}: prompts of {groups.prompts.shape[1]} columns, completions of "
              f"{groups.completions.shape[1]}; "
              f"whole {whole[0]:.3f} s, shared {shared[0]:.3f} s ({whole[0] / shared[0]:.2f}x); "
              f"loss {whole[1]:.6f} / {shared[1]:.6f}; largest gradient difference "
              f"{(whole[2] - shared[2]).abs().max().item():.2e} of a largest gradient "
              f"{whole[2].abs().max().item():.3f}")


if __name__ == "__main__":
    main()
