"""Reachability and phantom advantage: CCM diagnosis and repair.

Proposal §1.2: the reachability of step k of a shared trajectory under the target policy is
    R_k = exp(-alpha * ||grad_theta L_k^force||_2)
after VIGOR's intrinsic gradient-norm signal: a step far from what the target would produce has a large
teacher-forced gradient. The phantom advantage P_k = A_k^src * (1 - R_k) flags high credit on unreachable steps,
and the CCM repair of §2.2 attenuates it: A_k <- A_k * R_k^beta. Here R_k and the repair come first, then the steps
the curator measures (`step_norms`); the exact per-step norms themselves are grad_norms.py's.

Decisions relied on (DESIGN.md §4.8):
  - L_k = mean teacher-forced NLL of step k's tokens under the target, given the whole prefix; its gradient norm
    is taken over every trainable parameter (the adapters under LoRA), or over a cheaper scope
    (`grad_norms.ccm_scope`), and scaled by sqrt(|k|), as VIGOR does, so steps of different lengths compare.
  - The scale is calibrated on the target's own on-policy step norms, drawn across the iteration's prompts:
        R_k = exp(-alpha * max(0, g_k - g_0)),
    with the zero point g_0 at the median of its own norms and R = 1/2 at their q-quantile. So the target's own
    typical steps score R = 1, a merely unfamiliar step keeps R >= 1/2 and an unreachable one goes to 0 (the
    proposal's challenge 2). The proposal's R = exp(-alpha g) has no zero point: every step would be degraded.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

import tokalign
from grad_norms import step_grad_norms
from testbed import arith, tasks


class Calibration(NamedTuple):
    """The target's own scale of step norms: R = 1 up to `zero`, R = exp(-alpha (g - zero)) beyond."""
    zero: float
    alpha: float


def calibrate(own_norms: torch.Tensor, quantile: float, zero_quantile: float) -> Calibration:
    """The zero point at the `zero_quantile` of the target's own step norms, and alpha such that R = 1/2 at their
    `quantile` (the curator's: diagnosis.CuratorConfig's reach_zero_quantile and reach_quantile). Where the two
    quantiles coincide (a handful of equal norms) the scale is 1/1000 of the norm."""
    if own_norms.numel() == 0 or not torch.isfinite(own_norms).all():
        raise ValueError("calibration needs finite step norms of the target's own rollouts")
    if not 0 <= zero_quantile < quantile <= 1:
        raise ValueError(f"need 0 <= zero_quantile < quantile <= 1, got {zero_quantile}, {quantile}")
    zero, reference = torch.quantile(own_norms.double(), torch.tensor([zero_quantile, quantile],
                                                                      dtype=torch.float64)).tolist()
    if reference <= 0:
        raise ValueError("the target's own step norms are all zero; nothing to calibrate against")
    return Calibration(zero, math.log(2.0) / max(reference - zero, 1e-3 * reference))


def reachability(norms: torch.Tensor, calibration: Calibration) -> torch.Tensor:
    """[K] R_k = exp(-alpha max(0, g_k - g_0)), in (0, 1]."""
    return torch.exp(-calibration.alpha * (norms - calibration.zero).clamp(min=0))


def phantom_advantage(advantages: torch.Tensor, reach: torch.Tensor) -> torch.Tensor:
    """[K] P_k = A_k (1 - R_k): the credit a step carries that the target cannot realize."""
    return advantages * (1 - reach)


def ccm_hotspots(phantom: torch.Tensor, threshold: float) -> list[int]:
    """Steps whose out-of-reach value exceeds `threshold`: the phantom advantage (credit on a step the target
    cannot reach), or 1 - R_k, its share per unit of credit, as the fidelity record flags them."""
    return (phantom > threshold).nonzero().flatten().tolist()


def repair(advantages: torch.Tensor, reach: torch.Tensor, beta: float) -> torch.Tensor:
    """The CCM repair A_k <- A_k R_k^beta."""
    return advantages * reach.pow(beta)


def step_token_ranges(offsets: list[tuple[int, int]], step_byte_spans: list[tuple[int, int]]
                      ) -> list[tuple[int, int]]:
    """For each step (byte span), the half-open range of tokens overlapping it; steps no token covers are dropped."""
    ranges = []
    for a, b in step_byte_spans:
        hit = [t for t, (s, e) in enumerate(offsets) if s < b and e > a]
        if hit:
            ranges.append((hit[0], hit[-1] + 1))
    return ranges


def batch_inputs(trajectories: list[tuple[list[int], list[int], list[tuple[int, int]]]], pad_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, list[list[tuple[int, int]]]]:
    """Pack (prompt ids, completion ids, step token ranges within the completion) for `step_grad_norms`.

    Returns input_ids [B, L], attention_mask [B, L] (right-padded, so positions are those of each sequence
    alone) and each trajectory's steps as positions in input_ids.
    """
    from testbed.sequences import pack_sequences
    input_ids, attention, _ = pack_sequences([p for p, _, _ in trajectories], [c for _, c, _ in trajectories], pad_id)
    steps = [[(len(p) + a, len(p) + b) for a, b in ranges] for p, _, ranges in trajectories]
    return input_ids, attention, steps


Item = tuple[list[int], list[int], list[tuple[int, int]]]   # (prompt ids, completion ids, step token ranges)


def step_item(prompt_ids: list[int], encoding: tokalign.Encoding, step_spans) -> Item | None:
    """One completion (an encoding in the scoring policy's tokens) as `batch_inputs` takes it, its steps from
    `step_spans` (character spans of its text); None where no token covers a step."""
    ranges = step_token_ranges(encoding.offsets, tokalign.step_byte_spans(encoding.data, step_spans))
    return (list(prompt_ids), list(encoding.ids), ranges) if ranges else None


def own_steps(policy, rollouts, step_spans, count: int) -> list[Item]:
    """Up to `count` of a policy's own rollouts (policies.Rollouts) with steps, what its reachability is calibrated
    on: one rollout per prompt in turn (prompt b's sample b mod G first), so that they span the iteration's prompts
    rather than one prompt's group."""
    group = rollouts.group_size
    prompts = len(rollouts.completion_ids) // group
    items = []
    for i in (b * group + (b + j) % group for j in range(group) for b in range(prompts)):
        encoding = tokalign.Encoding.from_ids(rollouts.completion_ids[i].tolist(), policy.token_bytes)
        item = step_item(rollouts.prompt_ids[i].tolist(), encoding, step_spans)
        if item:
            items.append(item)
        if len(items) == count:
            break
    return items


def solution_item(target, writer, problem, completion_ids: torch.Tensor) -> Item | None:
    """`writer`'s completion [T] of an arithmetic `problem` as `target` would score it (step_item), retokenized
    through tokalign, each solution line a step."""
    encoding = tokalign.Encoding.from_ids(completion_ids.tolist(), writer.token_bytes)
    return step_item(target.encode_prompt(arith.prompt_text(problem)),
                     tokalign.retokenize(encoding, target.tokenizer, target.token_bytes), tasks.line_spans)


def solution_steps(target, writer, problems: list, max_new_tokens: int = 40) -> list[Item]:
    """`writer`'s greedy solutions to `problems`, as `target` would score them (solution_item). Solutions with no
    line are left out."""
    out = writer.rollout([arith.prompt_text(q) for q in problems], 1, max_new_tokens, greedy=True)
    items = [solution_item(target, writer, q, ids) for q, ids in zip(problems, out.completion_ids)]
    return [item for item in items if item]


def step_norms(policy, items: list[Item], params: list[torch.nn.Parameter],
               modules: list[torch.nn.Module] | None = None) -> list[torch.Tensor]:
    """Per item, [K] its steps' gradient norms under `policy` (step_grad_norms over `params` and `modules`, as
    ccm_scope gives them). A group's samples often repeat one another, and equal items have equal norms: each
    distinct item is measured once."""
    if not items:
        return []
    keys = [(tuple(p), tuple(c), tuple(r)) for p, c, r in items]
    distinct = dict(zip(keys, items))
    input_ids, attention, steps = batch_inputs(list(distinct.values()), policy.tokenizer.pad_token_id)
    flat = step_grad_norms(policy.model, input_ids.to(policy.device), attention.to(policy.device), steps, params,
                           modules)
    norms = dict(zip(distinct, flat.split([len(s) for s in steps])))
    return [norms[k] for k in keys]

