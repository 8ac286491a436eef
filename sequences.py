"""Sequences in, log-probabilities out: the model plumbing that the GRPO update, the warm-up, PRP's density ratios
and the curator's gradient norms share.

A batch is right-padded prompt + completion rows (`pack_sequences`); the log-probs of its next-token targets are
those of the model at a temperature, and only the columns from the first completion target on are projected onto
the vocabulary (`logits_from`): a third to a half of a tiny policy's tokens are prompt.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def pack_sequences(prompts: list[list[int]], completions: list[list[int]], pad_id: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+completion batch: input_ids [N, L], attention_mask [N, L], and the completion
    mask [N, L-1] over next-token targets (1 where input_ids[:, 1:] is a completion token)."""
    if not prompts or len(prompts) != len(completions):
        raise ValueError(f"need as many prompts as completions, at least one; got {len(prompts)}, {len(completions)}")
    length = max(len(p) + len(c) for p, c in zip(prompts, completions))
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), length), dtype=torch.long)
    mask = torch.zeros((len(prompts), length - 1), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if len(p) == 0 or len(c) == 0:
            raise ValueError(f"sequence {i} has an empty prompt or completion")
        input_ids[i, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attention[i, :len(p) + len(c)] = 1
        mask[i, len(p) - 1:len(p) + len(c) - 1] = 1.0
    return input_ids, attention, mask


def token_logprobs_and_entropy(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(x_t | x_<t) and the entropy of pi(. | x_<t), both [N, L-1], aligned with input_ids[:, 1:].

    pi is the model at the sampling temperature: the policy that produced the rollouts is the one optimized.
    """
    return logprobs_and_entropy_from(model, input_ids, attention_mask, 0, temperature)


def logprobs_and_entropy_from(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                              start: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs_and_entropy's columns start.. only, both [N, L-1-start]: the vocabulary projection and
    the float32 log-softmax of the prompt positions before `start` (a third to a half of the tokens of a tiny
    policy's batch) are never computed."""
    logits = logits_from(model, input_ids, attention_mask, start)[:, :-1].float() / temperature  # [N, L-1-start, V]
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(-1, input_ids[:, start + 1:].unsqueeze(-1)).squeeze(-1)         # [N, L-1-start]
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)                                       # [N, L-1-start]
    return chosen, entropy


def logits_from(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int) -> torch.Tensor:
    """The logits of positions start.. only, [N, L-start, V]: transformers' models (peft-wrapped too) skip the
    others' vocabulary projection (logits_to_keep); any other callable computes all and the rest is cut."""
    if isinstance(model, PreTrainedModel) or hasattr(model, "get_base_model"):
        return model(input_ids=input_ids, attention_mask=attention_mask,
                     logits_to_keep=input_ids.shape[1] - start).logits
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, start:]
