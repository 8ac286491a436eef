"""GRPO (proposal §2.2, the loss the repaired credit enters): group-normalized advantages and the clipped
surrogate with per-token advantages and weights.

Group advantages (GRPO, Shao et al. 2024):   A_i = (r_i - mean(r_group)) / (std(r_group) + eps)
  or, as Dr. GRPO (Liu et al. 2025), without the division by the std. Shared experience changes the group, not the
  formula (sharing.py): XGRPO pools the peers' rewards into the receiver's groups (`xgrpo_advantages`), SGT credits
  a rescued success as a member of the receiver's failed group (`rescue_advantages`).
Per-token loss, for token t of completion i with ratio rho = pi_theta / pi_old:
  l_it = -w_it * min(rho_it A_it, clip(rho_it, 1 - eps_low, 1 + eps_high) A_it) + beta * k3_it
  k3_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1               (Schulman's k3 estimator of KL)
Advantages are per token because the fidelity repairs (tokalign, reachability, reward_drift) rescale them
token by token; w_it are the importance weights of shared off-policy experience (DESIGN.md §4.4, §4.5). Rows a
batch marks `Remeasured` (a share's peer samples whose recipe says so) instead take rho = 1 and a weight the policy in
training re-measures from their sequence ratio at every optimizer step.
Aggregation: "sequence" (original GRPO: mean over each completion's tokens, then over completions) or
"token" (DAPO: sum over all tokens of the batch divided by their number), over the sequences of one optimizer
step: an iteration's batch is split into --minibatches consecutive parts, own rollouts first and peer
trajectories last (as the baselines' recipes order them), each one step, all against the same pi_old.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from testbed import lora
from testbed.sequences import (PromptGroups, cache_keyword, completion_logprobs, pack_sequences, prompt_groups,
                       token_logprobs_and_entropy)


STD_EPS = 1e-4
"""added to a group's reward std before it divides the centred rewards, so that a near-uniform group's advantages
stay finite"""


def group_advantages(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = STD_EPS) -> torch.Tensor:
    """rewards [B, G] (B groups of G completions) -> advantages [B, G].

    A group whose rewards are all equal carries no signal: its advantages are exactly 0, never NaN.
    """
    if rewards.ndim != 2 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must be [groups, group_size] with group_size > 0, got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    # equal rewards, not a zero std: the mean of seven 0.3s is not exactly 0.3 in floating point
    signal = rewards.amax(dim=1, keepdim=True) > rewards.amin(dim=1, keepdim=True)           # [B, 1]
    centered = torch.where(signal, rewards - rewards.mean(dim=1, keepdim=True), torch.zeros_like(rewards))
    if not scale_by_std:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)


def pooled_advantages(own: torch.Tensor, others: list[torch.Tensor], scale_by_std: bool = True) -> torch.Tensor:
    """[B, G + sum S_j] the group advantages of the receiver's rewards own [B, G] pooled with others [B, S_j] on
    the same prompts: the statistics XGRPO's baseline and SGT's rescue credit share."""
    return group_advantages(torch.cat([own, *others], dim=1), scale_by_std)


def xgrpo_advantages(own: torch.Tensor, peers: list[torch.Tensor], scale_by_std: bool = True) -> torch.Tensor:
    """[B, G] the receiver's advantages against the pooled group: own [B, G] and peers' [B, G_j] rewards."""
    return pooled_advantages(own, peers, scale_by_std)[:, :own.shape[1]]


def rescue_advantages(own: torch.Tensor, rescued: torch.Tensor, scale_by_std: bool = True) -> torch.Tensor:
    """[S] the advantages of S rescued rewards as members of the receiver's group own [G]."""
    return pooled_advantages(own.unsqueeze(0), [rescued.unsqueeze(0)], scale_by_std)[0, own.numel():]


def rewards_stats(rewards: torch.Tensor) -> dict[str, float]:
    """rewards [B, G] -> the reward charts of one iteration."""
    return {"charts/reward_mean": rewards.mean().item(),
            "charts/reward_std": rewards.std(unbiased=False).item(),
            "charts/zero_std_groups": (rewards.amax(dim=1) == rewards.amin(dim=1)).float().mean().item()}


def check_finite(name: str, value: torch.Tensor, step: int, steps: int) -> None:
    """Refuses a non-finite loss or gradient norm before optimizer step `step` of an update's `steps`."""
    if not torch.isfinite(value).all():
        taken = "" if step == 1 else f", its first {step - 1} taken"
        raise FloatingPointError(f"{name} is not finite before optimizer step {step} of {steps} of this update{taken}: "
                                 "the run stops with its last checkpoint untouched, which --resume would repeat as "
                                 "seeded; change what diverged (a lower --lr or --max-grad-norm) in a new run, --name")


@dataclass(frozen=True)
class LossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    beta: float = 0.0
    aggregation: str = "sequence"


def clipped_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                 cfg: LossConfig, weights: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                 totals: tuple[int, float] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective to minimize. All inputs [N, T]; mask is 1 on completion tokens, 0 elsewhere.

    `totals` = (sequences, tokens) of the whole batch when this is one micro-batch of it, so that the
    micro-batch losses add up to the batch loss. Returns the loss and summed metrics (clipped tokens, KL).
    """
    if cfg.aggregation not in ("sequence", "token"):
        raise ValueError(f"aggregation must be 'sequence' or 'token', got {cfg.aggregation!r}")
    if not (mask.sum(dim=1) > 0).all():
        raise ValueError("every sequence needs at least one completion token")
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError(f"beta={cfg.beta} asks for a KL penalty, but no reference log-probs were given")
    num_sequences, num_tokens = totals if totals is not None else (mask.shape[0], mask.sum().item())
    weights = torch.ones_like(logp) if weights is None else weights
    ratio = torch.exp(logp - old_logp)                                                        # [N, T]
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    per_token = -weights * torch.minimum(ratio * advantages, clipped * advantages)           # [N, T]
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.beta * kl
    if cfg.aggregation == "sequence":
        loss = ((per_token * mask).sum(1) / mask.sum(1)).sum() / num_sequences
    else:
        loss = (per_token * mask).sum() / num_tokens
    with torch.no_grad():
        was_clipped = (clipped * advantages < ratio * advantages).float()
        sums = {"clipped_tokens": (was_clipped * mask).sum(), "kl_sum": (kl.detach() * mask).sum()}
    return loss, sums


@dataclass(frozen=True)
class Remeasured:
    """Rows trained on a sequence-level weight that the policy in training measures anew at every optimizer step,
    with no per-token ratio: a share's peer samples where its recipe trains them so (sharing.Received.remeasure).
    In optimizer step m (0-based, counted over the iteration) such a row's log s is its mean completion log-prob
    under the policy as it is then, less `behaviour`, and each of its tokens takes the weight weight(log s,
    step=m), which carries no gradient, in place of its token weight, with ratio 1: the row's gradient is weight x
    its mean of A grad log pi."""

    behaviour: torch.Tensor                   # [N] float64: the mean log-prob of each row's text under the policy
                                              #     that wrote it; NaN on the rows that keep their token weights
    weight: Callable[..., torch.Tensor]       # (log s [n] float64, step=m) -> [n]


@dataclass
class TrainBatch:
    """What one GRPO update consumes; every [N, L-1] tensor is aligned with the targets input_ids[:, 1:]."""

    input_ids: torch.Tensor                 # [N, L]
    attention_mask: torch.Tensor            # [N, L]
    mask: torch.Tensor                      # [N, L-1]  1 on completion targets
    advantages: torch.Tensor                # [N, L-1]  per-token advantages, 0 off the mask
    weights: torch.Tensor | None = None     # [N, L-1]  importance weights of shared experience; None = 1
    remeasured: Remeasured | None = None    # rows whose weight the update re-measures at every step; None: none


def build_batch(prompts: list[list[int]], completions: list[list[int]], token_advantages: list[torch.Tensor],
                pad_id: int, token_weights: list[torch.Tensor] | None = None,
                remeasured: Remeasured | None = None) -> TrainBatch:
    """Pack sequences with their per-token advantages (and weights), each a [T_i] tensor per completion."""
    input_ids, attention, mask = pack_sequences(prompts, completions, pad_id)
    def place(values: list[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros_like(mask)
        for i, (p, v) in enumerate(zip(prompts, values)):
            if len(v) != len(completions[i]):
                raise ValueError(f"sequence {i}: {len(v)} per-token values for {len(completions[i])} tokens")
            out[i, len(p) - 1:len(p) - 1 + len(v)] = v
        return out
    return TrainBatch(input_ids, attention, mask, place(token_advantages),
                      place(token_weights) if token_weights is not None else None, remeasured)


def remeasure(remeasured: Remeasured, rows: torch.Tensor, step: int, logp: torch.Tensor, old_logp: torch.Tensor,
              weights: torch.Tensor | None, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """pi_old and the token weights [n, C] of a micro-batch of the batch's `rows` [n] in optimizer step `step`,
    given its log-probs now, logp [n, C], its pi_old, old_logp [n, C], token weights [n, C] (None = 1) and
    completion mask [n, C]: on the rows `remeasured` names, pi_old is logp itself (ratio 1, whose gradient is
    grad log pi) and every token weighs remeasured.weight(log s, step) (Remeasured); elsewhere they are unchanged."""
    behaviour = remeasured.behaviour.to(logp.device)[rows]                                       # [n]
    chosen = ~behaviour.isnan()                                                                   # [n]
    if not chosen.any():
        return old_logp, weights
    mean_now = (logp.detach().double() * mask).sum(1) / mask.sum(1)                               # [n]
    weight = torch.zeros_like(mean_now)                                                           # [n]
    weight[chosen] = remeasured.weight(mean_now[chosen] - behaviour[chosen], step=step)
    weights = torch.ones_like(logp) if weights is None else weights
    return (torch.where(chosen[:, None], logp.detach(), old_logp),
            torch.where(chosen[:, None], weight.to(logp.dtype)[:, None].expand_as(logp), weights))


def minibatch_rows(n: int, minibatches: int) -> list[range]:
    """The rows of each of `minibatches` optimizer steps over a batch of n sequences, in the batch's order (own
    rollouts first, peer trajectories last: learner.training_batch): contiguous, their sizes differing by at most
    one, the larger first: peer samples train in the later steps of an iteration, as the baselines' recipes order
    them."""
    if not 1 <= minibatches <= n:
        raise ValueError(f"--minibatches must be between 1 and the batch's {n} sequences, got {minibatches}")
    size, extra = divmod(n, minibatches)
    ends = [(k + 1) * size + min(k + 1, extra) for k in range(minibatches)]
    return [range(a, b) for a, b in zip([0, *ends], ends)]


def row_steps(n: int, minibatches: int) -> list[int]:
    """[n] the optimizer step (0-based) that trains each row of a batch of n sequences (minibatch_rows)."""
    return [k for k, part in enumerate(minibatch_rows(n, minibatches)) for _ in part]


def sequences_of_prompts(input_ids: torch.Tensor, mask: torch.Tensor, part: range) -> list[int]:
    """The rows of `part` (input_ids [N, L], completion mask [N, L-1]) in the order micro-batches take them: the
    rows of one prompt together, prompts by length, each prompt's rows by completion length, so that a
    micro-batch holds few prompts and little padding."""
    firsts, sizes = mask.argmax(1).tolist(), mask.sum(1).tolist()
    return sorted(part, key=lambda r: (firsts[r], input_ids[r, :firsts[r] + 1].tolist(), sizes[r]))


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether a module of the model recomputes its activations in the backward, and so keeps no KV cache."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


MICRO_BATCH = 64
"""sequences per forward/backward pass (gradient accumulation): memory, not maths"""
MAX_GRAD_NORM = 1.0
"""the norm the trained weights' gradient is clipped to at each optimizer step"""


def grpo_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, cfg: LossConfig,
              epochs: int = 1, micro_batch: int = MICRO_BATCH, max_grad_norm: float = MAX_GRAD_NORM,
              ref_model: lora.Reference | None = None, temperature: float = 1.0, measure_kl: bool = False,
              minibatches: int = 1) -> dict[str, float]:
    """`epochs` passes over one batch, each `minibatches` clipped updates on consecutive parts of it
    (minibatch_rows); pi_old is the model before the first update (so the first has ratio 1), the same for every
    part, as in PPO.

    measure_kl: one more forward after the update gives losses/update_kl, the k3 estimate of KL(pi_old || pi_new)
    per completion token of the batch, how far the update moved the policy (the KL penalty's losses/kl is 0
    whenever beta is). Raises FloatingPointError before an optimizer step whose loss or gradient is not finite (with
    several steps, --minibatches or --epochs, those before it are taken).
    """
    device = next(model.parameters()).device
    # the per-token values on the device; the token ids reach it inside each micro-batch's PromptGroups
    tensors = {k: v.to(device) if v is not None else None
               for k, v in (("mask", batch.mask), ("advantages", batch.advantages), ("weights", batch.weights))}
    n, num_tokens = tensors["mask"].shape[0], tensors["mask"].sum().item()
    # per optimizer step, micro-batches of the rows of a few prompts (sequences_of_prompts), each prompt computed
    # once for all its completions where the model keeps a KV cache (same loss, summed in another order)
    cache = None if is_checkpointing(model) else cache_keyword(model)
    steps = []   # per optimizer step: its micro-batches (PromptGroups), and its (sequences, tokens)
    for part in minibatch_rows(n, minibatches):
        order = sequences_of_prompts(batch.input_ids, batch.mask, part)
        micro = [order[i:i + micro_batch] for i in range(0, len(part), micro_batch)]
        steps.append(([prompt_groups(batch.input_ids, batch.mask, rows).to(device) for rows in micro],
                      (len(part), tensors["mask"][part.start:part.stop].sum().item())))
    chunks = [chunk for step, _ in steps for chunk in step]
    def cut(name: str, groups: PromptGroups) -> torch.Tensor | None:
        return tensors[name][groups.rows].gather(1, groups.columns) if tensors[name] is not None else None  # [n, C]
    def logprobs(m: torch.nn.Module | lora.Reference, groups: PromptGroups) -> tuple[torch.Tensor, torch.Tensor]:
        return completion_logprobs(m, groups, temperature, cache)
    # pi_old of the first step's chunks is read off its first forward; the later steps' before the first update
    old_logp, ref_logp = [None] * len(chunks), [None] * len(chunks)
    with torch.no_grad():
        for j in range(len(steps[0][0]), len(chunks)):
            old_logp[j] = logprobs(model, chunks[j])[0]
        if ref_model is not None and cfg.beta > 0:
            ref_logp = [logprobs(ref_model, chunk)[0] for chunk in chunks]
    updates = epochs * minibatches
    totals = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "entropy_sum": 0.0, "grad_norm": 0.0}
    for epoch in range(epochs):
        j = 0
        for m, (step, size) in enumerate(steps):
            number = epoch * minibatches + m + 1                # this optimizer step's, of the update's `updates`
            optimizer.zero_grad(set_to_none=True)
            for groups in step:
                logp, entropy = logprobs(model, groups)
                if old_logp[j] is None:
                    old_logp[j] = logp.detach()
                mask = groups.completion_mask
                old, weights = old_logp[j], cut("weights", groups)
                if batch.remeasured is not None:
                    old, weights = remeasure(batch.remeasured, groups.rows, epoch * minibatches + m, logp, old,
                                             weights, mask)
                loss, sums = clipped_loss(logp, old, cut("advantages", groups), mask, cfg, weights, ref_logp[j],
                                          totals=size)
                check_finite("GRPO loss", loss, number, updates)
                loss.backward()
                totals["loss"] += loss.item() / updates
                totals["clipped_tokens"] += sums["clipped_tokens"].item()
                totals["kl_sum"] += sums["kl_sum"].item()
                totals["entropy_sum"] += (entropy * mask).sum().item()
                j += 1
            # the trained weights only: a frozen one may hold a stale gradient (a base weight under LoRA)
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                       max_grad_norm)
            check_finite("gradient norm", grad_norm, number, updates)
            optimizer.step()
            totals["grad_norm"] += grad_norm.item() / updates
    seen = num_tokens * epochs
    out = {"losses/policy_loss": totals["loss"], "losses/clip_ratio": totals["clipped_tokens"] / seen,
           "losses/kl": totals["kl_sum"] / seen, "losses/entropy": totals["entropy_sum"] / seen,
           "losses/grad_norm": totals["grad_norm"],
           "charts/completion_len": tensors["mask"].sum(1).float().mean().item()}
    if measure_kl:
        moved = 0.0
        with torch.no_grad():
            for j, groups in enumerate(chunks):
                delta = logprobs(model, groups)[0] - old_logp[j]                          # log pi_new / pi_old
                moved += ((torch.exp(delta) - delta - 1) * groups.completion_mask).sum().item()
        out["losses/update_kl"] = moved / num_tokens
    return out


if __name__ == "__main__":
    # A few GRPO updates of the tiny qwen policy on the embedded task: one group's advantages, then per update
    # the training reward, and how the update moved the log-probabilities of the tokens it was told to reinforce
    # (A > 0) and to suppress (A < 0). The loss itself reads 0 on a first epoch: the ratio is 1 and the
    # advantages of a group sum to 0.
    import argparse

    from testbed import arith
    from testbed import policies
    from testbed import tasks

    cli = argparse.ArgumentParser(description="GRPO on the tiny qwen policy")
    cli.add_argument("--updates", type=int, default=5)
    cli.add_argument("--prompts", type=int, default=16)
    cli.add_argument("--group-size", type=int, default=8)
    cli.add_argument("--lr", type=float, default=1e-4)
    args = cli.parse_args()
    task = tasks.load_task("arith", 1, 1000, 0)
    policy = policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), arith.TaskConfig(), 1)[0]
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=args.lr)
    torch.manual_seed(1)
    for update in range(args.updates):
        problems = task.train[update * args.prompts:(update + 1) * args.prompts]
        out = policy.rollout([task.prompt(q) for q in problems], args.group_size, 40, temperature=0.7)
        rewards = tasks.group_rewards(task, problems, out.texts, args.group_size)                       # [B, G]
        advantages = group_advantages(rewards)                                                          # [B, G]
        if update == 0:
            mixed = int((rewards.std(1) > 0).float().argmax())
            print(f"group {mixed}: rewards {rewards[mixed].tolist()}\n  GRPO advantages    "
                  f"{[round(a, 2) for a in advantages[mixed].tolist()]}\n  Dr. GRPO advantages "
                  f"{[round(a, 2) for a in group_advantages(rewards, scale_by_std=False)[mixed].tolist()]}")
        batch = build_batch([p.tolist() for p in out.prompt_ids], [c.tolist() for c in out.completion_ids],
                            [a.expand(len(c)) for a, c in zip(advantages.flatten(), out.completion_ids)],
                            policy.tokenizer.pad_token_id)
        with torch.no_grad():
            before = token_logprobs_and_entropy(policy.model, batch.input_ids, batch.attention_mask, 0.7)[0]
        stats = grpo_step(policy.model, optimizer, batch, LossConfig(), temperature=0.7)
        with torch.no_grad():
            moved = token_logprobs_and_entropy(policy.model, batch.input_ids, batch.attention_mask, 0.7)[0] - before
        up, down = batch.mask * (batch.advantages > 0), batch.mask * (batch.advantages < 0)             # [N, L-1]
        print(f"update {update}: reward {rewards.mean():.3f}, {int((rewards.std(1) == 0).sum())} of {len(problems)} "
              f"groups without signal, entropy {stats['losses/entropy']:.3f}, "
              f"grad norm {stats['losses/grad_norm']:.3f}; mean log-prob change of A > 0 tokens "
              f"{(moved * up).sum() / up.sum().clamp(min=1):+.4f}, of A < 0 tokens "
              f"{(moved * down).sum() / down.sum().clamp(min=1):+.4f}")
