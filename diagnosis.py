"""The diagnosis of one shared trajectory as one receiver sees it: the offer, its per-step terms, and the repair
of its credit (proposal §2.1-2.2; curator.py composes the terms into D).

An offer is a source rollout retokenized by the receiver and aligned with it (tokalign), cut into steps. Each term
is the mean over the trajectory's steps of a per-step value in [0, 1]:
  TBD  by default the share of a step's credit that a token mixes with a neighbour step's, or that the receiver
       cannot reproduce (boundary_drift.py, --tbd-measure for the proposal's hidden-state S_TBD);
  CCM  1 - R_k, R_k the step's reachability under the receiver, calibrated on the receiver's own steps of its last
       few iterations so that its typical steps score R = 1 (reachability.py): the phantom advantage per unit of
       credit, P / |A|, since the credit an offer carries depends on the level it is admitted to;
  RSD  per typed step, the Bretagnolle-Huber bound sqrt(1 - exp(-KL)) on the total variation between the two
       policies' step-success distributions (reward_drift.py).
CCM needs the receiver's gradient norms, the expensive part, measured once the curator asks (`ReceiverSide.reach`).
The repairs compose on one step in a fixed order (the proposal's challenge 3), from the sequence advantage A the
trajectory carries: 1. RSD, c_k = (1 - mix) A + mix s_k with s_k the verified step credit (VPR) or the intrinsic
gradient-norm signal; 2. CCM, c_k R_k^beta, after RSD so the recalibration cannot hand credit back to a step the
receiver cannot reach; 3. TBD, the step credit carried onto the receiver's tokens by byte overlap
(tokalign.token_credit), separators and EOS closing the step before them. An ablated term is not computed and
its repair is off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import boundary_drift
import policies
import reachability
import reward_drift
import sharing
import tasks
import tokalign
from term_scales import TERMS

if TYPE_CHECKING:   # the curator's settings: curator.py imports this file, never the other way at run time
    from curator import CuratorConfig



def mean_or_zero(values: torch.Tensor) -> float:
    """Mean over the finite entries, 0 if there are none."""
    finite = values[torch.isfinite(values)]
    return finite.mean().item() if finite.numel() else 0.0


@dataclass
class Diagnosis:
    """A trajectory's per-step diagnosis; NaN where a term is ablated or not computed."""

    tbd: torch.Tensor            # [K]
    rsd: torch.Tensor            # [K]  NaN on untyped lines
    reach: torch.Tensor | None   # [K]  R_k, None when the gradient norms were skipped or CCM is ablated
    norms: torch.Tensor | None   # [K]  the receiver's sqrt(|k|)-scaled step gradient norms

    def terms(self, cfg: CuratorConfig) -> torch.Tensor:
        """[3] the trajectory's TBD, CCM and RSD terms (NaN where ablated or not measured)."""
        ccm = (1 - self.reach).mean().item() if self.reach is not None else math.nan
        out = torch.tensor([mean_or_zero(self.tbd), ccm, mean_or_zero(self.rsd)], dtype=torch.float64)
        return torch.where(torch.tensor([t in cfg.ablate for t in TERMS]), torch.full_like(out, math.nan), out)

    def rsd_repairable(self, cfg: CuratorConfig) -> bool:
        """VPR reaches every typed step; the intrinsic signal needs the gradient norms."""
        return cfg.process_signal == "vpr" or self.norms is not None


def step_credit(advantage: float, process: list[reward_drift.StepReward], diagnosis: Diagnosis,
                target: reward_drift.StepStats, cfg: CuratorConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[K] each step's repaired credit: RSD recalibration, then CCM attenuation (the module docstring's order);
    and [K] which steps the RSD recalibration reached."""
    credit = torch.full((len(process),), float(advantage), dtype=torch.float64)
    recalibrated = torch.zeros(len(process), dtype=torch.bool)
    if "rsd" not in cfg.ablate:
        verified = reward_drift.verified_credit(advantage, process, target, cfg.credit_mix) \
            if cfg.process_signal == "vpr" else [None] * len(process)
        intrinsic = (reward_drift.intrinsic_step_rewards(diagnosis.norms.double()) - 0.5
                     if diagnosis.norms is not None else None)
        for k, v in enumerate(verified):
            if v is not None:
                credit[k] = v
            elif intrinsic is not None:
                credit[k] = (1 - cfg.credit_mix) * advantage + cfg.credit_mix * intrinsic[k].item()
            recalibrated[k] = v is not None or intrinsic is not None
    if "ccm" not in cfg.ablate and diagnosis.reach is not None:
        credit = reachability.repair(credit, diagnosis.reach.double(), cfg.ccm_beta)
    return credit, recalibrated


@dataclass
class Offer:
    """One source rollout offered to one receiver, in the receiver's tokenization, with its diagnosis."""

    source: sharing.Experience
    index: int                               # flat index in the source's rollouts
    src: tokalign.Encoding
    tgt: tokalign.Encoding
    alignment: tokalign.Alignment
    steps: list[tuple[int, int]]             # K byte spans, each covered by receiver tokens
    ranges: list[tuple[int, int]]            # K receiver token ranges of the steps
    process: list[reward_drift.StepReward]   # K
    diagnosis: Diagnosis
    jaccard: float                           # the jaccard TBD measure of the trajectory, logged for comparison

    @property
    def prompt_index(self) -> int:
        return self.index // self.source.rollouts.group_size

    @property
    def reward(self) -> float:
        return self.source.rewards.flatten()[self.index].item()

    @property
    def advantage(self) -> float:
        return self.source.advantages.flatten()[self.index].item()


def make_offer(source: sharing.Experience, index: int, receiver: policies.Policy, task: tasks.Task, example,
               stats: dict[str, reward_drift.StepStats], tbd_measure: str = "credit") -> Offer | None:
    """The cheap diagnosis (TBD, RSD) of one rollout for one receiver; None when no step of it reaches the
    receiver's tokens (an empty completion, a lone cut byte, a text its tokenizer cannot spell). The hidden TBD
    measure is filled in later, over all the iteration's offers (`measure_hidden_tbd`)."""
    aligned = sharing.aligned_rollout(source, index, receiver)
    if aligned is None:
        return None
    src, tgt, alignment = aligned
    steps = tokalign.step_byte_spans(src.data, task.step_spans)
    process = reward_drift.process_rewards(task, example, source.rollouts.texts[index])
    kept = [(span, reachability.step_token_ranges(tgt.offsets, [span]), p) for span, p in zip(steps, process)]
    kept = [(span, ranges[0], p) for span, ranges, p in kept if ranges]
    if not kept:
        return None
    steps, ranges, process = (list(x) for x in zip(*kept))
    tbd = boundary_drift.drift_steps(tbd_measure, alignment, src, tgt, steps)
    rsd = reward_drift.rsd_steps(stats[source.policy.name], stats[receiver.name], process)
    jaccard = mean_or_zero(boundary_drift.jaccard_steps(alignment, steps))
    return Offer(source, index, src, tgt, alignment, steps, ranges, process, Diagnosis(tbd, rsd, None, None),
                 jaccard)


def measure_hidden_tbd(offers: list[Offer], receiver: sharing.Experience) -> None:
    """The hidden TBD measure of every offer, cross-fitted per source on all its offers to this receiver
    (boundary_drift.hidden_measure): the source's hidden states on its own tokens, which came with its experience
    (sharing.Experience.hidden), and the receiver's on its re-encoding."""
    q = receiver.policy
    for source in {id(o.source): o.source for o in offers}.values():
        if source.hidden is None:
            raise ValueError(f"{source.policy.name}'s experience came without its hidden states, which the hidden TBD "
                             "measure needs: make it with sharing.with_hidden_states")
        mine = [o for o in offers if o.source is source]
        h_tgt = q.hidden_states([q.encode_prompt(receiver.prompts[o.prompt_index]) for o in mine],
                                [o.tgt.ids for o in mine])
        measured = boundary_drift.hidden_measure([(o.alignment, source.hidden[o.index], ht, o.steps)
                                                  for o, ht in zip(mine, h_tgt)])
        for o, values in zip(mine, measured):
            o.diagnosis.tbd = values


FEATURES = ("tokens/50", "non-1:1 share", "steps/5", "reward", "|A|", "tbd", "rsd", "pair recent D",
            "pair recent CCM", "capability gap", "source mean log-prob")


def offer_features(offer: Offer, cfg: CuratorConfig, recent: tuple[float, float], gap: float) -> torch.Tensor:
    """[F] the cheap features of FEATURES (ablated terms read 0). CCM, the term that most often dominates D,
    needs the gradient norms; what stands in for it is the pair's recent CCM, the capability gap (the source's
    mean reward minus the receiver's) and how sure the source was of its own tokens."""
    terms = torch.nan_to_num(offer.diagnosis.terms(cfg))
    modes = offer.alignment.modes
    logprobs = offer.source.rollouts.logprobs[offer.index]
    return torch.tensor([len(offer.tgt.ids) / 50, sum(m != "1:1" for m in modes) / max(len(modes), 1),
                         len(offer.steps) / 5, offer.reward, abs(offer.advantage), terms[0].item(), terms[2].item(),
                         *recent, gap, logprobs.float().mean().item() if len(logprobs) else 0.0], dtype=torch.float64)
