"""What computing each prompt once per group would save the update: a probe for #29, not yet the update.

    python benchmarks/shared_prompt.py --seed 900

A group's G completions share one prompt, and about half of the positions an update computes are its copies.
This samples one iteration's rollouts (16 prompts x G) of each tiny policy and takes the completions' mean NLL,
forward and backward, two ways on the same left-padded layout: whole (every sequence prompt and completion, as
now), and shared (each prompt once, its KV cache repeated for its G completions, which attend to it). It prints
the seconds of each (best of `--repeats`), the two losses and the largest gradient difference. The sums run in
another order, so the gradients agree to float rounding, not bit for bit. One thread; never a comparison seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import arith  # noqa: E402
import policies  # noqa: E402


def group_layout(prompts: list[list[int]], completions: list[list[int]], group: int, pad_id: int):
    """The groups' prompts left-padded, [B, P], and their completions right-padded, [B*G, C], with masks, and the
    positions of the whole [B*G, P+C] layout (as a left-padded sequence counts them)."""
    width, length = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.full((len(prompts), width), pad_id)                                      # [B, P]
    prompt_mask = torch.zeros(len(prompts), width, dtype=torch.long)                              # [B, P]
    for i, ids in enumerate(prompts):
        prompt_ids[i, width - len(ids):], prompt_mask[i, width - len(ids):] = torch.tensor(ids), 1
    completion_ids = torch.full((len(completions), length), pad_id)                             # [B*G, C]
    completion_mask = torch.zeros(len(completions), length, dtype=torch.long)                     # [B*G, C]
    for i, ids in enumerate(completions):
        completion_ids[i, :len(ids)], completion_mask[i, :len(ids)] = torch.tensor(ids), 1
    mask = torch.cat([prompt_mask.repeat_interleave(group, 0), completion_mask], 1)              # [B*G, P+C]
    positions = (mask.cumsum(1) - 1).clamp(min=0)                                                 # [B*G, P+C]
    return prompt_ids, prompt_mask, completion_ids, completion_mask, mask, positions


def completion_nll(logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor
                   ) -> torch.Tensor:
    """Mean NLL of the completion tokens; logits [B*G, C, V] predict completion_ids [B*G, C]."""
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return -(logprobs * completion_mask).sum() / completion_mask.sum()


def whole_loss(model, layout, group: int) -> torch.Tensor:
    prompt_ids, _, completion_ids, completion_mask, mask, positions = layout
    length = completion_ids.shape[1]
    ids = torch.cat([prompt_ids.repeat_interleave(group, 0), completion_ids], 1)                   # [B*G, P+C]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                   logits_to_keep=length + 1).logits[:, :-1]                                         # [B*G, C, V]
    return completion_nll(logits, completion_ids, completion_mask)


def shared_loss(model, layout, group: int) -> torch.Tensor:
    prompt_ids, prompt_mask, completion_ids, completion_mask, mask, positions = layout
    width = prompt_ids.shape[1]
    cache = DynamicCache(config=model.config)
    last = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions[::group, :width],
                 past_key_values=cache, use_cache=True, logits_to_keep=1).logits                  # [B, 1, V]
    for layer in cache.layers:    # each prompt's keys and values, one copy per completion of its group
        layer.keys, layer.values = layer.keys.repeat_interleave(group, 0), layer.values.repeat_interleave(group, 0)
    rest = model(input_ids=completion_ids, attention_mask=mask, position_ids=positions[:, width:],
                 past_key_values=cache, use_cache=True).logits                                    # [B*G, C, V]
    logits = torch.cat([last.repeat_interleave(group, 0), rest[:, :-1]], 1)                       # [B*G, C, V]
    return completion_nll(logits, completion_ids, completion_mask)


def timed_gradient(model, loss_fn, layout, group: int, repeats: int) -> tuple[float, float, torch.Tensor]:
    """Best seconds of forward and backward, the loss, and the flat gradient."""
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = loss_fn(model, layout, group)
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
        layout = group_layout([out.prompt_ids[b * args.group_size].tolist() for b in range(len(problems))],
                              [c.tolist() for c in out.completion_ids], args.group_size,
                              policy.tokenizer.pad_token_id)
        policy.model.train()
        whole = timed_gradient(policy.model, whole_loss, layout, args.group_size, args.repeats)
        shared = timed_gradient(policy.model, shared_loss, layout, args.group_size, args.repeats)
        print(f"{policy.name}: prompts of {layout[0].shape[1]} columns, completions of {layout[2].shape[1]}; "
              f"whole {whole[0]:.3f} s, shared {shared[0]:.3f} s ({whole[0] / shared[0]:.2f}x); "
              f"loss {whole[1]:.6f} / {shared[1]:.6f}; largest gradient difference "
              f"{(whole[2] - shared[2]).abs().max().item():.2e} of a largest gradient {whole[2].abs().max().item():.3f}")


if __name__ == "__main__":
    main()
