"""Sequences through a model: the plumbing that the rollouts, the GRPO update, the warm-up, PRP's density ratios and
the curator's gradient norms share.

A batch is right-padded prompt + completion rows (`pack_sequences`); the log-probs of its next-token targets are
those of the model at a temperature (`chosen_and_entropy`). A third to a half of a tiny policy's tokens are prompt,
so the warm-up projects only the columns from the first completion target on onto the vocabulary (`logits_from`),
and the update takes a batch's rows as their distinct prompts and completions (`PromptGroups`), each prompt
computed once for all its completions (`completion_logprobs`). Rollouts and greedy evaluation sample through
`decode`, a direct KV-cache loop over left-padded prompts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.generation.logits_process import TopPLogitsWarper


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
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]               # [N, L-1, V]
    return chosen_and_entropy(logits, input_ids[:, 1:], temperature)


def chosen_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) and the entropy of pi at each position, both [N, T], from logits [N, T, V] at a temperature,
    in float32 (the entropy without gradient)."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)                         # [N, T, V]
    chosen = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)                            # [N, T]
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)                                         # [N, T]
    return chosen, entropy


@dataclass(frozen=True)
class PromptGroups:
    """Rows of a right-padded batch (pack_sequences) as their distinct prompts and their completions: the layout in
    which a prompt goes through the model once for every completion of it (a GRPO group's G)."""

    rows: torch.Tensor              # [n]     the rows, in the batch
    prompts: torch.Tensor           # [U, P]  the distinct prompts, left-padded
    prompt_mask: torch.Tensor       # [U, P]
    owner: torch.Tensor             # [n]     each row's prompt, an index into prompts
    completions: torch.Tensor       # [n, C]  right-padded
    completion_mask: torch.Tensor   # [n, C]  1.0 on completion tokens
    columns: torch.Tensor           # [n, C]  each completion token's target column in the batch's [N, L-1]

    def to(self, device: torch.device) -> PromptGroups:
        return PromptGroups(*(t.to(device) for t in vars(self).values()))


def prompt_groups(input_ids: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> PromptGroups:
    """`rows` of a batch, input_ids [N, L] and completion mask [N, L-1] as pack_sequences makes them, as
    PromptGroups. Raises ValueError where a row's completion mask is not one span after its prompt."""
    mask = mask[rows]                                                                          # [n, L-1]
    firsts, sizes = mask.argmax(1), mask.sum(1).long()                                         # [n], [n]
    prompts = [tuple(input_ids[r, :f + 1].tolist()) for r, f in zip(rows, firsts.tolist())]
    distinct = list(dict.fromkeys(prompts))
    width, length = max(map(len, distinct)), int(sizes.max())
    prompt_ids = torch.zeros((len(distinct), width), dtype=torch.long)                         # [U, P]
    prompt_mask = torch.zeros((len(distinct), width), dtype=torch.long)                        # [U, P]
    for u, p in enumerate(distinct):
        prompt_ids[u, width - len(p):], prompt_mask[u, width - len(p):] = torch.tensor(p), 1
    valid = (torch.arange(length) < sizes[:, None]).float()                                    # [n, C]
    columns = (firsts[:, None] + torch.arange(length)).clamp(max=mask.shape[1] - 1)            # [n, C]
    if not torch.equal((mask.gather(1, columns) * valid).sum(1), mask.sum(1)):
        raise ValueError("a row's completion mask is not one span after its prompt (pack_sequences makes them)")
    completions = input_ids[rows].gather(1, columns + 1) * valid.long()                        # [n, C]
    index = {p: u for u, p in enumerate(distinct)}
    owner = torch.tensor([index[p] for p in prompts])                                          # [n]
    return PromptGroups(torch.tensor(rows), prompt_ids, prompt_mask, owner, completions, valid, columns)


def completion_logprobs(model, groups: PromptGroups, temperature: float = 1.0, cache: str | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs_and_entropy's values on the completion tokens of `groups`, both [n, C].

    With `cache`, the name of the model's KV-cache argument (cache_keyword), each distinct prompt goes through
    the model once and its keys and values are repeated for every completion of it, which then attends to them:
    the same sums as each row whole, in another order, and about half the positions of a GRPO batch. Without it
    (gradient checkpointing, which keeps no cache), every row goes through whole, its prompt left-padded.
    """
    length = groups.completions.shape[1]
    prompt_positions = (groups.prompt_mask.cumsum(1) - 1).clamp(min=0)                        # [U, P]
    attention = torch.cat([groups.prompt_mask[groups.owner], groups.completion_mask.long()], 1)   # [n, P+C]
    positions = prompt_positions[groups.owner, -1:] + 1 + torch.arange(length, device=attention.device)  # [n, C]
    if cache is None:
        ids = torch.cat([groups.prompts[groups.owner], groups.completions], 1)                  # [n, P+C]
        logits = model(input_ids=ids, attention_mask=attention, position_ids=torch.cat(
            [prompt_positions[groups.owner], positions], 1), logits_to_keep=length + 1).logits[:, -length - 1:-1]
    else:
        kv = DynamicCache()
        last = model(input_ids=groups.prompts, attention_mask=groups.prompt_mask, position_ids=prompt_positions,
                     logits_to_keep=1, use_cache=True, **{cache: kv}).logits[:, -1:]            # [U, 1, V]
        kv.reorder_cache(groups.owner)                                                         # [n] copies
        rest = model(input_ids=groups.completions, attention_mask=attention, position_ids=positions,
                     use_cache=True, **{cache: kv}).logits                                     # [n, C, V]
        # index_select, not last[owner]: its backward sums a prompt's copies in a fixed order, where indexing's
        # (index_put_ with accumulate) sums them with atomics across threads, in an order that varies run to run
        logits = torch.cat([last.index_select(0, groups.owner), rest[:, :-1]], 1)               # [n, C, V]
    return chosen_and_entropy(logits, groups.completions, temperature)


def logits_from(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int) -> torch.Tensor:
    """The logits of positions start.. only, [N, L-start, V]: transformers' models (peft-wrapped too) skip the
    others' vocabulary projection (logits_to_keep); any other callable computes all and the rest is cut."""
    if isinstance(model, PreTrainedModel) or hasattr(model, "get_base_model"):
        return model(input_ids=input_ids, attention_mask=attention_mask,
                     logits_to_keep=input_ids.shape[1] - start).logits
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, start:]


def cache_keyword(model: torch.nn.Module) -> str:
    """The name of the forward's KV cache argument: transformers 5 renamed `past_key_values` to `cache`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through a peft wrapper
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


@torch.no_grad()
def decode(model: torch.nn.Module, prompts: list[list[int]], pad_id: int, stop_ids: list[int], max_new_tokens: int,
           temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled (or greedy) continuations of left-padded prompts and their behaviour log-probs, both [N, T] with
    T <= max_new_tokens steps (fewer when every row has emitted a stop id, its EOS); after it a row holds pad ids,
    log-prob 0.

    The tokens are model.generate's for the same seed: the same float32 logits, temperature, top-p warper and one
    torch.multinomial draw over all N rows per step (so the random stream does not depend on which rows finished).
    What generate spends around the model is gone: no logits processors or stopping criteria per token, no
    logits of the prompt, and finished rows leave the batch (their KV cache rows with them) once a quarter of
    the rows still computed has finished; and generate would hold every step's logits over the vocabulary
    ([N, T, V] floats) to give the behaviour log-probs (docs/speed.md, "Speed", times both).
    The log-probs are those of the sampling distribution, logits / temperature (top-p not folded in; greedy: 1).
    Draws come from `generator` (on the model's device), else from torch's global generator.
    """
    device = next(model.parameters()).device
    n, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)                         # [N, P] left-padded
    attention = torch.ones((n, width + max_new_tokens), dtype=torch.long)                # [N, P+T]
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, :width - len(p)] = 0
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention[:, :width].cumsum(-1) - 1).masked_fill(attention[:, :width] == 0, 1)  # [N, P] as generate
    cache = DynamicCache(config=model.config)
    with_cache = {cache_keyword(model): cache, "use_cache": True}
    logits = model(input_ids=input_ids, attention_mask=attention[:, :width], position_ids=positions, logits_to_keep=1,
                   **with_cache).logits[:, -1]                              # [N, V]
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)    # [N, T]
    logprobs = torch.zeros((n, max_new_tokens), device=device)                           # [N, T]
    rows = torch.arange(n, device=device)              # [R] the batch rows still computed
    running = torch.ones(n, dtype=torch.bool, device=device)  # [R] no EOS yet
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)                      # [S]
    last = positions[:, -1]                            # [R] position of each row's last prompt token
    probs = None if greedy else torch.ones((n, logits.shape[-1]), device=device)        # [N, V] every row's draw
    nucleus = TopPLogitsWarper(top_p) if top_p < 1.0 and not greedy else None
    step = 0
    for step in range(max_new_tokens):
        scores = logits.float() / (1.0 if greedy else temperature)                      # [R, V]
        if greedy:
            chosen = scores.argmax(-1)                                                   # [R]
        else:
            probs[rows] = torch.softmax(nucleus(None, scores) if nucleus else scores, dim=-1)
            chosen = torch.multinomial(probs, 1, generator=generator).squeeze(1)[rows]       # [R]
        chosen = torch.where(running, chosen, pad_id)
        tokens[rows, step] = chosen
        logprobs[rows, step] = torch.where(
            running, torch.log_softmax(scores, -1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1), 0.0)
        running &= ~torch.isin(chosen, stops)
        if step == max_new_tokens - 1 or not running.any():
            break
        if running.sum() * 4 <= 3 * len(rows):  # compact: copying the cache costs about one decode step
            keep = running.nonzero().squeeze(1)
            cache.reorder_cache(keep)
            rows, running, chosen, last = rows[keep], running[keep], chosen[keep], last[keep]
        logits = model(input_ids=chosen.unsqueeze(-1), attention_mask=attention[rows, :width + step + 1],
                       position_ids=(last + step + 1).unsqueeze(-1), **with_cache).logits[:, -1]
    return tokens[:, :step + 1], logprobs[:, :step + 1]
