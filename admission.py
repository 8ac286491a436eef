"""Admission (proposal §2.2): what each band of an offer lets cross into its receiver's training.

PRP (band 0) lets the trajectory's tokens cross with their credit; XGRPO (band 1) lets its reward join the
receiver's group on that prompt; SGT (band 2) lets it cross only as a verified success on a prompt the receiver's
whole group failed (a rescue), which crosses at every band, so the levels nest; an inert offer (no level could use
it) is not diagnosed. The curator (curator.py) gives each offer its band by its diagnosis; the controls give it
otherwise: `--admission random` permutes the bands among each source's offers, `--admission ranked` admits the
first share of the offers by one signal at PRP and rejects the rest whole (REJECTED), a rescue too.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import torch

import grpo
import sharing
from diagnosis import Offer
from sharing import LEVELS

INERT = "every reward on its prompt is the same: no level could use it"   # the reason an inert offer records
REJECTED = 3
"""the band of an offer `--admission ranked` leaves out of its share: rejected whole, a rescue too"""


def rescue_candidate(offer: Offer, own_rewards: torch.Tensor, success: float) -> bool:
    """A verified success on a prompt where the receiver's whole group (own_rewards [B, G]) failed (SGT)."""
    return offer.reward >= success and bool(sharing.failed_groups(own_rewards, success)[offer.prompt_index])


def crosses_tokens(band: int, offer: Offer, own_rewards: torch.Tensor, success: float) -> bool:
    """Whether the trajectory's tokens would enter the receiver's batch at this band: as a rescue at any band,
    else at PRP with a non-zero advantage."""
    return rescue_candidate(offer, own_rewards, success) or (band == 0 and offer.advantage != 0)


def inert_prompts(groups: list[torch.Tensor]) -> torch.Tensor:
    """[B] the prompts whose offers no level could use: every reward on the prompt, in the receiver's group and in
    each peer's (groups, each [B, G_i]), is one value. Then every offer of it carries advantage 0, rescues nothing,
    and pooling any of those rewards into the receiver's group leaves its advantages at 0. A peer's whole group
    counts, offers that cannot cross included: their rewards set the advantages of those that can."""
    rewards = torch.cat(groups, dim=1)                                                          # [B, sum G_i]
    return (rewards == rewards[:, :1]).all(dim=1)


def permuted_bands(bands: list[int | None], sources: list[str], rng: random.Random) -> list[int | None]:
    """The random-admission control: the bands shuffled among the offers of each source (None stays in place)."""
    out = list(bands)
    for source in sorted(set(sources)):
        positions = [k for k, (b, s) in enumerate(zip(bands, sources)) if s == source and b is not None]
        shuffled = [bands[k] for k in positions]
        rng.shuffle(shuffled)
        for k, b in zip(positions, shuffled):
            out[k] = b
    return out


def ranked_bands(values: list[float | None], share: float, sense: int, rng: random.Random | None = None
                 ) -> list[int | None]:
    """`--admission ranked`: of the offers with a value (None: inert, not ranked), the first share x n (rounded
    half up) in the order of `sense` x value (1: lowest first) at PRP (band 0), the rest REJECTED. Ties (a reward
    of 1, a ratio capped at 1) are broken by a seeded draw from `rng`, so that no peer or rollout comes first for
    its place in the batch, or without one kept in the offers' order. A NaN value (a term the offer's diagnosis
    could not measure) ranks last."""
    present = {k: v for k, v in enumerate(values) if v is not None}
    draw = {k: rng.random() if rng is not None else 0.0 for k in present}
    order = sorted(present, key=lambda k: (math.isnan(present[k]), 0.0 if math.isnan(present[k])
                                           else sense * present[k], draw[k]))
    admitted = set(order[:int(share * len(present) + 0.5)])
    return [None if v is None else 0 if k in admitted else REJECTED for k, v in enumerate(values)]


BAND_RULES = ("D < theta1", "theta1 <= D < theta2", "D >= theta2")
"""why an offer is in its band, as its record says, under the diagnosis's admission"""


def admit(offers: list[Offer], bands: list[int | None], receiver: sharing.Experience, share: sharing.ShareConfig,
          rules: tuple[str, ...] = BAND_RULES
          ) -> tuple[list[tuple[str, str, str]], dict[int, tuple[Offer, float]], torch.Tensor]:
    """Admission of every offer by its band (`rules` say why it is in it), None for an inert one, REJECTED for one
    outside a ranked admission's share (DESIGN.md §4.1). Returns per offer (level,
    what crosses, reason); the offers whose tokens cross, by position, with the advantage they carry; and the
    receiver's advantages [B, G] with the XGRPO-admitted peer rewards in its groups' statistics.

    A rescue (a verified success on a prompt the receiver's whole group failed) crosses as one at every band,
    with its credit as a member of the receiver's failed group, pooled over the prompt's rescues; at XGRPO its
    reward also joins the baseline. Any other PRP trajectory carries its own-group advantage."""
    pooled: dict[int, list[float]] = defaultdict(list)                 # prompt -> XGRPO-admitted peer rewards
    rescues: dict[int, list[int]] = defaultdict(list)                  # prompt -> positions of its rescues
    picks: dict[int, tuple[Offer, float]] = {}
    decisions = []
    for k, (o, band) in enumerate(zip(offers, bands)):
        if band is None:
            decisions.append(("inert", "none", INERT))
            continue
        if band == REJECTED:
            decisions.append(("rejected", "none", "outside the share the ranked admission admits"))
            continue
        if band == 1:
            pooled[o.prompt_index].append(o.reward)
        rule = rules[band]
        if rescue_candidate(o, receiver.rewards, share.success):
            rescues[o.prompt_index].append(k)
            decisions.append((LEVELS[band], "tokens" if band != 1 else "tokens and reward",
                              f"{rule}, a verified rescue"))
        elif band == 0:
            decisions.append(("prp", "tokens", rule) if o.advantage != 0 else
                             ("prp", "none", f"{rule}, but A = 0 and no rescue: nothing to carry"))
            if o.advantage != 0:
                picks[k] = (o, o.advantage)
        elif band == 1:
            decisions.append(("xgrpo", "reward", rule))
        else:
            decisions.append(("rejected", "none", f"{rule}, not a verified success on a prompt the receiver failed"))
    for b, ks in rescues.items():
        credit = grpo.rescue_advantages(receiver.rewards[b], torch.tensor([offers[k].reward for k in ks]),
                                        share.scale_by_std)
        for k, a in zip(ks, credit.tolist()):
            picks[k] = (offers[k], a)
    advantages = receiver.advantages.clone()                                           # [B, G]
    for b, rewards in pooled.items():
        advantages[b] = grpo.xgrpo_advantages(receiver.rewards[b:b + 1], [torch.tensor([rewards])],
                                              share.scale_by_std)[0]
    return decisions, picks, advantages
