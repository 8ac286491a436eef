"""Process rewards and reward semantic drift: RSD diagnosis and repair.

Proposal §1.3: the same outcome reward carries different process information for different policies. Per policy,
process rewards are collected on its own rollouts; the drift of step k of a shared trajectory is
    D_RSD(k) = KL( p_src(r | s_k) || p_tgt(r | s_k) )
and a trajectory's drift is the mean over its typed steps (0 where none is typed). §2.2, RSD repair: step credit is
recalibrated with a verifiable process signal (VPR-style) where a step can be checked, else with an intrinsic one
(VIGOR-style).

Decisions relied on (DESIGN.md §4.9):
  - "similar steps" are steps of the same type, a small documented key (`step_type`): for arithmetic the
    operation, the digit count of the larger operand and whether a carry (or borrow) is needed, e.g. "+2c"; for
    a GSM8K line its first calculator annotation, the operators in order and the digits of the largest
    operand's integer part, e.g. "<<48/2=24>>" is "/2". So GSM8K's annotations are the VPR signal too.
  - p(r | type) is a Bernoulli step-success rate from each policy's own rollouts over a window of recent
    iterations, smoothed by a Beta(1, 1) prior, so unseen types and zero counts give finite drifts, not small
    ones: a type the target never tried sits at 1/2, so against a source that solved it 62 times in 62 (63/64)
    the bound below is 0.68.
  - steps that cannot be checked are marked None and never scored 0.
The curator's RSD term per typed step is `drift_bound`(KL) = sqrt(1 - exp(-KL)), the Bretagnolle-Huber bound on
the total variation between the two success distributions: a probability in [0, 1), 0 exactly when they agree.
RSD repair: a step's credit becomes a mix of the outcome advantage and its process advantage under the target,
r_k - p_tgt(success | type_k): a verified step of a type the target usually fails earns more, a routine one
little. Where no step can be checked, the intrinsic reward stands in: the negative sqrt(|k|)-scaled gradient
norm of the teacher-forced NLL (reachability.py), rank-normalized among the trajectory's own steps to [0, 1]:
it orders a trajectory's steps against each other, so its best step earns +1/2 over the mean however far all its
steps are from the receiver (how far is CCM's to say).
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from dataclasses import dataclass

import torch

from testbed import arith

from testbed import tasks, verifiers


@dataclass(frozen=True)
class StepReward:
    span: tuple[int, int]
    """character span of the step's line in the completion"""
    type: str | None
    """step type (`step_type`); None for a line that is not a step"""
    reward: float | None
    """1.0 correct, 0.0 wrong, None not checkable"""


def step_type(line: str) -> str | None:
    """The type key of a step: "+2c" for an arithmetic line `a op b = c` (operation, digits of the larger operand,
    carry/borrow), written in symbols or in words, "/2" for a line whose first annotation is `<<48/2=24>>` (its
    operators, digits of its largest operand); None for a line that is neither."""
    parsed = arith.parse_step(line)
    if parsed is not None:
        a, op, b = abs(parsed[0]), parsed[1], abs(parsed[2])
        digits = len(str(max(a, b)))
        carry = (op == "+" and a % 10 + b % 10 >= 10) or (op == "-" and a % 10 < b % 10)
        return f"{op}{digits}{'c' if carry else ''}"
    annotation = verifiers.ANNOTATION_RE.search(line)
    if annotation is None:
        return None
    expression = annotation.group(1)
    # binary ones, right after an operand (a "-3" operand is no "-", spaced or not), a power "**" one of them
    operators = "".join(re.findall(r"(?<=[\d.)])\s*(\*\*|[-+*/])", expression))
    operands = re.findall(r"\d[\d,]*", expression)
    if not operators or not operands:
        return None
    return f"{operators}{max(len(n.replace(',', '')) for n in operands)}"


def process_rewards(task: tasks.Task, example, completion: str) -> list[StepReward]:
    """The VPR-style signal of a completion: each step (`task.step_spans`) with its type and the task's verdict,
    None where it cannot be checked."""
    spans = task.step_spans(completion)
    type_of = task.step_type or step_type
    return [StepReward(span, type_of(completion[span[0]:span[1]]), None if v is None else float(v))
            for span, v in zip(spans, task.step_verdicts(example, completion))]


class StepStats:
    """A policy's step successes and trials by type, over a window of its most recent iterations."""

    def __init__(self, window: int):
        self.iterations: deque[tuple[Counter, Counter]] = deque(maxlen=window)

    def add_iteration(self, steps: list[StepReward]) -> None:
        successes, trials = Counter(), Counter()
        for step in steps:
            if step.type is not None and step.reward is not None:
                trials[step.type] += 1
                successes[step.type] += step.reward
        self.iterations.append((successes, trials))

    def counts(self, kind: str) -> tuple[float, float]:
        return (sum(s[kind] for s, _ in self.iterations), sum(t[kind] for _, t in self.iterations))

    def success_rate(self, kind: str, prior: float = 1.0) -> float:
        """Posterior mean of p(success | type) under a Beta(prior, prior) prior: 1/2 for an unseen type."""
        s, n = self.counts(kind)
        return (s + prior) / (n + 2 * prior)

    @property
    def types(self) -> set[str]:
        return {k for _, t in self.iterations for k in t}


def bernoulli_kl(p: float, q: float) -> float:
    """KL(Bernoulli(p) || Bernoulli(q)), with 0 log 0 = 0; finite for q in (0, 1)."""
    if not (0 <= p <= 1 and 0 < q < 1):
        raise ValueError(f"need p in [0, 1] and q in (0, 1), got {p}, {q}")
    return sum(a * math.log(a / b) for a, b in ((p, q), (1 - p, 1 - q)) if a > 0)


def step_drift(source: StepStats, target: StepStats, kind: str | None, prior: float = 1.0) -> float | None:
    """D_RSD of one step type; None for a line that is not a step."""
    if kind is None:
        return None
    return bernoulli_kl(source.success_rate(kind, prior), target.success_rate(kind, prior))


def drift_bound(kl: torch.Tensor) -> torch.Tensor:
    """sqrt(1 - exp(-KL)), the Bretagnolle-Huber bound on total variation: [0, inf) -> [0, 1)."""
    return torch.sqrt(-torch.expm1(-kl.clamp(min=0)))


def rsd_steps(source: StepStats, target: StepStats,
              process: list[StepReward]) -> torch.Tensor:
    """[K] the normalized drift of each step; NaN for a line that is not a typed step."""
    drifts = [step_drift(source, target, s.type) for s in process]
    return drift_bound(torch.tensor([math.nan if d is None else d for d in drifts], dtype=torch.float64))


def verified_credit(advantage: float, steps: list[StepReward], target: StepStats, mix: float) -> list[float | None]:
    """Per-step recalibrated credit (1 - mix) A + mix (r_k - p_tgt(type_k)); None where a step is not checkable."""
    return [None if s.reward is None or s.type is None
            else (1 - mix) * advantage + mix * (s.reward - target.success_rate(s.type)) for s in steps]


def intrinsic_step_rewards(group_norms: torch.Tensor) -> torch.Tensor:
    """[N] VIGOR-style rewards for a group of steps (one trajectory's): the negative gradient norms,
    rank-normalized to [0, 1] (ties share)."""
    if group_norms.numel() == 0 or not torch.isfinite(group_norms).all():
        raise ValueError("intrinsic rewards need a non-empty group of finite norms")
    if group_norms.numel() == 1:
        return torch.full_like(group_norms, 0.5)
    negated = -group_norms.double()
    ranks = (negated.unsqueeze(0) < negated.unsqueeze(1)).double().sum(1) \
        + 0.5 * ((negated.unsqueeze(0) == negated.unsqueeze(1)).double().sum(1) - 1)      # average ranks, 0-based
    return (ranks / (len(group_norms) - 1)).to(group_norms.dtype)

