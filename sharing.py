"""Mutual RL's three sharing levels between heterogeneous policies (proposal §2.1), PRP, XGRPO and SGT, and the
crossing the baselines build on.

DESIGN.md §1 (the three levels, the baselines the proposal compares against and the levels its curator admits
trajectories to) and §4.5 (their definitions, since the Mutual RL paper body is not public):

  PRP    data level. Every peer rollout with a non-zero advantage joins the receiver's batch as an extra
         trajectory: its completion text is re-encoded by the receiver (tokalign), the advantage it earned in
         the peer's own group is carried onto the receiver's tokens by byte overlap, and each receiver token is
         weighted by the truncated density ratio of its aligned group,
             w_g = min(pi_receiver(g) / pi_peer(g), cap)                                   (DESIGN.md §4.4)
         A zero-advantage rollout adds nothing to the policy gradient, so it is not sent. Both sides' log-probs
         are those of the models at the sampling temperature; top-p truncation is not folded in (policies.py), so
         with --top-p < 1 the weights are ratios of the untruncated distributions.
  XGRPO  value level. Peer rewards on the same prompt join the receiver's group statistics,
             A_i = (r_i - mean(R_self u R_peers)) / std(R_self u R_peers),                 (grpo.xgrpo_advantages)
         and the receiver trains on its own rollouts only.
  SGT    outcome level. Where the receiver's whole group failed a prompt and a peer succeeded, the peer's
         verified successes join the receiver's batch, weighted as in PRP, with the advantage they would have
         had as members of the receiver's group (the pooled group of its failures and the rescued successes,
         so the rarer the rescue the larger the credit: grpo.rescue_advantages). Nothing else crosses.

`exchange` applies one level to an iteration's experience of every policy and returns, per receiver, the
advantages of its own rollouts and the peer trajectories it takes in, with metrics under `sharing/`. A baseline
beside the three is a `Share` of its own, registered by name in `SHARES` (baselines/ registers the published ones),
built on this module's crossing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

import grpo
import tokalign
from testbed import policies, sequences

LEVELS = ("prp", "xgrpo", "sgt")           # data, value, outcome: what the curator admits to
MODES = ("none", *LEVELS)


@dataclass
class Experience:
    """One policy's iteration: B prompts, G rollouts each (prompt-major), their rewards and own advantages."""

    policy: policies.Policy
    prompts: list[str]               # B prompt texts, the same for every policy of the iteration
    rollouts: policies.Rollouts      # N = B*G
    rewards: torch.Tensor            # [B, G]
    advantages: torch.Tensor         # [B, G]  from the policy's own group
    hidden: list[torch.Tensor] | None = None   # N x [T_i, d] last hidden states of the completion tokens, where the
                                               # hidden TBD measure needs them (with_hidden_states)


def with_hidden_states(experience: Experience) -> Experience:
    """The experience with its policy's last hidden states on its own completions, computed where the policy is
    (boundary_drift's hidden measure needs the source's, and under Ray they cross with the trajectories)."""
    r = experience.rollouts
    hidden = experience.policy.hidden_states([p.tolist() for p in r.prompt_ids], [c.tolist() for c in r.completion_ids])
    return replace(experience, hidden=hidden)


@dataclass
class Crossing:
    """A peer trajectory as the receiver trains on it, in the receiver's tokenization."""

    source: str                      # the peer's name
    index: int                       # the rollout's position in the peer's Rollouts
    reward: float
    prompt_ids: list[int]            # the receiver's encoding of the prompt
    completion_ids: list[int]        # [T] the receiver's encoding of the completion text
    advantages: torch.Tensor         # [T] the peer's advantages carried over by byte overlap
    weights: torch.Tensor            # [T] truncated density ratio of each token's aligned group
    logprobs: torch.Tensor           # [T] log pi_receiver of each completion token at the sampling temperature
    log_ratio: torch.Tensor          # [G'] log pi_receiver(g) - log pi_peer(g), untruncated, over the aligned
                                     #      groups that hold receiver tokens
    residual: float                  # share of the peer's bytes the receiver could not reproduce
    behaviour: float | None = None   # the peer's mean log-prob of the text over its own tokens, where the update
                                     # re-measures the sequence ratio at every optimizer step (Received.remeasure)
                                     # and `weights` is only the exchange's measurement; None: `weights` trains


@dataclass
class Received:
    """What one receiver trains on after the exchange."""

    advantages: torch.Tensor                                  # [B, G] of its own rollouts
    crossings: list[Crossing] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    kept: torch.Tensor | None = None                          # [B, G] bool: own rollouts left in the batch
                                                              # (a share may replace groups); None keeps them all
    remeasure: Callable[..., torch.Tensor] | None = None      # (log s [S], step=m) -> [S]: the token weight of a
                                                              # crossing with a `behaviour`, from its sequence ratio
                                                              # re-measured in optimizer step m (grpo.Remeasured);
                                                              # picklable


@dataclass(frozen=True)
class ShareConfig:
    """How experience crosses. A field named like a flag is that flag (args.py documents it; mode is --share)."""

    mode: str = "none"
    ratio_cap: float = 2.0
    success: float = 1.0
    """a reward at or above this is a verified success (SGT)"""
    scale_by_std: bool = True
    temperature: float = field(kw_only=True)
    micro_batch: int = field(kw_only=True, default=grpo.MICRO_BATCH)
    minibatches: int = field(kw_only=True, default=1)
    settings: Any = field(kw_only=True, default=None)
    """a registered share's own settings (Share.settings), None for the levels; picklable"""


class Share(Protocol):
    """A way experience crosses beside the levels, one object registered by name in SHARES: what it sends, how the
    receiver credits it (`exchange`) and any state it keeps across iterations and checkpoints (`start`, `observe`).
    Its flags are the command line's (args.py); it reads them in `settings` and checks them in `check`."""

    def settings(self, args: Any) -> Any:
        """Its own settings (ShareConfig.settings) from the run's Args."""

    def check(self, args: Any) -> None:
        """Raise ValueError, naming the flags to change, where the run's Args cannot train it."""

    def received_at_most(self, rollouts: int) -> int:
        """The most trajectories one peer of `rollouts` rollouts sends a receiver in an iteration (the start-up
        memory estimate)."""

    def start(self, cfg: ShareConfig) -> Any:
        """The state it keeps across iterations as a run starts (saved with each checkpoint); None if it keeps
        none."""

    def observe(self, state: Any, rewards: dict[str, torch.Tensor]) -> Any:
        """This iteration's context for every receiver's exchange, from every policy's rewards [B, G] by name,
        the state updated in place."""

    def exchange(self, experiences: list[Experience], cfg: ShareConfig, context: Any,
                 receiver_name: str | None = None) -> dict[str, Received]:
        """As `exchange` below, given this iteration's context (`observe`)."""


SHARES: dict[str, Share] = {}
"""every share beside the levels, by its --share name; baselines/ registers the published ones"""


# ---------------------------------------------------------------------------------------------------------------
# SGT's rescues, on rewards alone (their credit, with XGRPO's baseline: grpo.py)
# ---------------------------------------------------------------------------------------------------------------

def failed_groups(own: torch.Tensor, success: float) -> torch.Tensor:
    """[B] bool: the prompts where every rollout of the receiver's group own [B, G] failed (SGT's ground)."""
    return (own < success).all(dim=1)


def sgt_rescues(own: torch.Tensor, peer: torch.Tensor, success: float) -> list[tuple[int, int]]:
    """(prompt b, peer rollout j) for every peer success on a prompt where the receiver's group has none.

    own [B, G], peer [B, G_peer] rewards.
    """
    failed = failed_groups(own, success)                                         # [B]
    rescued = (peer >= success) & failed.unsqueeze(1)                            # [B, G_peer]
    return [tuple(pair) for pair in rescued.nonzero().tolist()]


def truncated_weights(log_ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """[G] min(exp(log_ratio), cap), computed without overflow. A log ratio of -inf (the receiver gives the
    group's bytes probability 0) is weight 0; NaN and +inf have no meaning here and raise."""
    if cap <= 0:
        raise ValueError(f"the ratio cap must be positive, got {cap}")
    if torch.isnan(log_ratio).any() or (log_ratio == math.inf).any():
        raise ValueError("log density ratios contain NaN or +inf")
    return torch.exp(torch.clamp(log_ratio, max=math.log(cap)))


# ---------------------------------------------------------------------------------------------------------------
# Moving a trajectory from a peer to a receiver
# ---------------------------------------------------------------------------------------------------------------

def receiver_logprobs(receiver: policies.Policy, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float, micro_batch: int) -> list[torch.Tensor]:
    """log pi_receiver of each completion token given its prompt, at the sampling temperature; N x [T_i]."""
    out = []
    for i in range(0, len(prompts), micro_batch):
        chunk_p, chunk_c = prompts[i:i + micro_batch], completions[i:i + micro_batch]
        input_ids, attention, mask = sequences.pack_sequences(chunk_p, chunk_c, receiver.tokenizer.pad_token_id)
        with torch.no_grad():
            logp, _ = sequences.token_logprobs_and_entropy(receiver.model, input_ids.to(receiver.device),
                                                      attention.to(receiver.device), temperature)   # [n, L-1]
        logp = logp.float().cpu()
        for row, (p, c) in enumerate(zip(chunk_p, chunk_c)):
            out.append(logp[row, len(p) - 1:len(p) - 1 + len(c)])
    return out


def cross(source: Experience, picks: list[tuple[int, float]], receiver: policies.Policy, cfg: ShareConfig,
          aligned: dict[int, tokalign.Aligned] | None = None, credit: dict[int, torch.Tensor] | None = None
          ) -> list[Crossing]:
    """Move the source's rollouts `picks` = (flat index, sequence advantage) into the receiver's tokenization, each
    receiver token carrying the sequence advantage redistributed by alignment proportion (tokalign.redistribute).

    `aligned` holds rollouts already retokenized and aligned for this receiver, by flat index (the curator's
    offers), so that none is done twice; `credit`, by flat index, the per-token credit [m] the caller has
    already repaired (the curator's), which then crosses in place of the redistributed advantage. A rollout that
    `tokalign.align_completion` cannot move is dropped (counted by crossing_metrics as sharing/dropped).
    """
    group_size = source.rollouts.group_size
    moved = []
    for index, advantage in picks:
        found = (aligned or {}).get(index) or tokalign.align_completion(
            source.rollouts.completion_ids[index].tolist(), source.policy.token_bytes, receiver.tokenizer,
            receiver.token_bytes)
        if found is not None:
            moved.append((index, advantage, *found))
    if not moved:
        return []
    encoded = {b: receiver.encode_prompt(source.prompts[b]) for b in {index // group_size for index, *_ in moved}}
    prompt_ids = [encoded[index // group_size] for index, *_ in moved]
    tgt_logprobs = receiver_logprobs(receiver, prompt_ids, [tgt.ids for *_, tgt, _ in moved], cfg.temperature,
                                     cfg.micro_batch)
    crossings = []
    for (index, advantage, src, tgt, alignment), prompt, logp in zip(moved, prompt_ids, tgt_logprobs):
        log_ratio = tokalign.group_log_ratio(alignment, source.rollouts.logprobs[index].float(), logp)  # [G_align]
        weights = truncated_weights(log_ratio, cfg.ratio_cap)[alignment.group_ids("tgt")]        # [m]
        carried = carried_groups(alignment)                                                      # [G_align]
        tokens = (credit[index] if credit is not None
                  else tokalign.redistribute(alignment, src, tgt, torch.full((len(src.ids),), float(advantage))))
        crossings.append(Crossing(source.policy.name, index, source.rewards.flatten()[index].item(), prompt,
                                  tgt.ids, tokens, weights, logp, log_ratio[carried], alignment.residual))
    return crossings


def carried_groups(alignment: tokalign.Alignment) -> torch.Tensor:
    """[G] bool: the aligned groups that hold receiver tokens (a cut source tail weighs no receiver token)."""
    return torch.tensor([t1 > t0 for t0, t1 in alignment.tgt])


def crossing_metrics(crossings: list[Crossing], cap: float, picked: int | None = None) -> dict[str, float]:
    """How much crossed, what it earned, and the density-ratio statistics PRP pays for (over aligned groups); given
    how many rollouts were `picked`, also how many of them the receiver could not take (sharing/dropped)."""
    dropped = {} if picked is None else {"sharing/dropped": float(picked - len(crossings))}
    if not crossings:
        return {"sharing/received": 0.0, **dropped}
    log_ratio = torch.cat([c.log_ratio for c in crossings])
    return {"sharing/received": float(len(crossings)),
            "sharing/received_reward": sum(c.reward for c in crossings) / len(crossings),
            "sharing/log_ratio_mean": log_ratio.mean().item(),
            "sharing/log_ratio_max": log_ratio.max().item(),
            "sharing/truncated_share": (log_ratio > math.log(cap)).float().mean().item(),
            "sharing/weight_mean": torch.cat([c.weights for c in crossings]).mean().item(),
            "sharing/residual": sum(c.residual for c in crossings) / len(crossings), **dropped}


# ---------------------------------------------------------------------------------------------------------------
# One exchange between all policies
# ---------------------------------------------------------------------------------------------------------------

def exchange(experiences: list[Experience], cfg: ShareConfig, receiver_name: str | None = None
             ) -> dict[str, Received]:
    """Apply the sharing level cfg.mode to one iteration: every policy receives from every other one, or only
    `receiver_name` does, which is how a policy computes its part where it is (learner.receive): a receiver needs only
    its own model, for its log-probs of what crosses. A registered share's exchange is its own (Share.exchange).
    """
    if cfg.mode not in MODES:
        raise ValueError(f"unknown sharing level {cfg.mode!r}: use one of {MODES}, or for a registered share "
                         f"({', '.join(SHARES) or 'none yet'}) its own exchange, SHARES[name].exchange")
    out = {}
    for receiver in experiences:
        if receiver_name is not None and receiver.policy.name != receiver_name:
            continue
        peers = [e for e in experiences if e is not receiver]
        name = receiver.policy.name
        if cfg.mode == "none":
            out[name] = Received(receiver.advantages)
        elif cfg.mode == "xgrpo":
            advantages = grpo.xgrpo_advantages(receiver.rewards, [p.rewards for p in peers], cfg.scale_by_std)
            own_flat = (receiver.advantages == 0).all(dim=1)                           # [B]
            out[name] = Received(advantages, metrics={
                "sharing/received": float(sum(p.rewards.numel() for p in peers)),
                "sharing/baseline_shift": (advantages - receiver.advantages).abs().mean().item(),
                "sharing/revived_groups": (own_flat & (advantages != 0).any(dim=1)).float().sum().item()})
        else:
            chosen = prp_picks(peers) if cfg.mode == "prp" else sgt_picks(receiver.rewards, peers, cfg)
            crossings = [c for peer, p in zip(peers, chosen) for c in cross(peer, p, receiver.policy, cfg)]
            out[name] = Received(receiver.advantages, crossings,
                                 crossing_metrics(crossings, cfg.ratio_cap, sum(map(len, chosen))))
    return out


def prp_picks(peers: list[Experience]) -> list[list[tuple[int, float]]]:
    """Per peer, (flat index, advantage) of every rollout with a non-zero advantage in its own group."""
    return [[(i, a) for i, a in enumerate(peer.advantages.flatten().tolist()) if a != 0] for peer in peers]


def sgt_picks(own: torch.Tensor, peers: list[Experience], cfg: ShareConfig) -> list[list[tuple[int, float]]]:
    """Per peer, (flat index, rescue advantage) of its successes on prompts the receiver (own [B, G]) failed.

    The successes of all peers on one prompt are pooled with the receiver's group for their advantages.
    """
    rescues = [sgt_rescues(own, peer.rewards, cfg.success) for peer in peers]
    out: list[list[tuple[int, float]]] = [[] for _ in peers]
    for b in sorted({b for found in rescues for b, _ in found}):
        members = [(k, j) for k, found in enumerate(rescues) for bb, j in found if bb == b]
        rewards = torch.stack([peers[k].rewards[b, j] for k, j in members])                    # [S]
        credit = grpo.rescue_advantages(own[b], rewards, cfg.scale_by_std)                           # [S]
        for (k, j), a in zip(members, credit.tolist()):
            out[k].append((b * peers[k].rollouts.group_size + j, a))
    return out
