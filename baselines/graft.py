"""GRAFT, the cross-model trajectory exchange baseline `--share graft`.

Jang et al., "Learning Beyond What You Sample: Off-Policy-Aware Cross-Model Trajectory Exchange for RLVR", arXiv
2609.37868. The paper's text could not be read here (no public copy or code was found); this follows the
description in issue 32, and every detail it leaves open is a choice listed below.

  replacement     where the receiver's whole group on a prompt failed (no reward reaches `success`) and a
                  peer's group on it is mixed (some success, some failure), the peer's whole group replaces the
                  receiver's: the receiver's own rollouts on that prompt leave its batch, the peer's enter it,
                  retokenized by the receiver as PRP's are (sharing.cross), with the advantages they earned in
                  the peer's own group
  compatibility   s = exp(mean log pi_receiver(y) - mean log pi_peer(y)), each mean over that policy's own tokens
                  of the text (hacpo.sequence_log_ratio); pi_peer's are its behaviour log-probs
  weight          w = min(s, 1) where s >= delta, and the trajectory does not cross where s < delta (delta 0.8)
  ratio clipping  per token, the GRPO surrogate's clip of pi_theta / pi_old (grpo.clipped_loss)
  order           peer trajectories fill the iteration's last optimizer steps (grpo.minibatch_rows)

Choices where the description is ambiguous:
  - delta is read as a floor on s: below it a trajectory is dropped, not clipped up to delta (a weight of delta
    would train on the least compatible text as much as on text at s = delta). s above 1 is not upweighted,
    like HACPO's upper clip.
  - "Token-level ratio clipping" is read as the PPO clip of each token's ratio to the receiver before the
    iteration's first step, the clip every method here trains with; it acts from the second optimizer step on.
    The receiver-peer mismatch enters through s alone, not through per-token importance ratios.
  - With several peers mixed on one prompt, the group with the highest mean log s replaces the receiver's.
  - A prompt whose chosen group has no trajectory at s >= delta keeps the receiver's own group.

`SHARE` is GRAFT as the trainer runs it (sharing.Share): its settings from --graft-delta; it keeps no state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

import sharing
from baselines import hacpo


@dataclass(frozen=True)
class Settings:
    """GRAFT's settings (sharing.ShareConfig.settings): delta, the --graft-delta flag (args.py documents it)."""

    delta: float = 0.8


def replaced_prompts(own: torch.Tensor, peer: torch.Tensor, success: float) -> torch.Tensor:
    """[B] bool: prompts where the receiver's group own [B, G] all failed and the peer's peer [B, G'] is mixed."""
    failed = sharing.failed_groups(own, success)                                                # [B]
    mixed = (peer >= success).any(dim=1) & (peer < success).any(dim=1)                         # [B]
    return failed & mixed


def compatibility_weights(log_s: torch.Tensor, delta: float) -> torch.Tensor:
    """[S] min(s, 1) where s >= delta, else 0, from log s [S]; a log s of -inf is weight 0."""
    if not 0 < delta <= 1:
        raise ValueError(f"GRAFT's delta must be in (0, 1], got {delta}")
    if torch.isnan(log_s).any():
        raise ValueError("compatibility log ratios contain NaN")
    return torch.where(log_s >= torch.log(torch.tensor(delta, dtype=log_s.dtype)), log_s.clamp(max=0).exp(),
                       torch.zeros_like(log_s))


def replacing_groups(receiver: sharing.Experience, peers: list[sharing.Experience], cfg: sharing.ShareConfig
                     ) -> list[tuple[sharing.Experience, sharing.Crossing]]:
    """(peer, crossing) of every trajectory of the peer groups that may replace the receiver's failed groups, prompt
    by prompt: of the peers mixed on a prompt, the one whose group has the highest mean log s."""
    best: dict[int, tuple[float, list[tuple[sharing.Experience, sharing.Crossing]]]] = {}
    for peer in peers:
        size = peer.rollouts.group_size
        prompts = replaced_prompts(receiver.rewards, peer.rewards, cfg.success).nonzero().flatten().tolist()
        picks = [(b * size + i, peer.advantages[b, i].item()) for b in prompts for i in range(size)]
        crossed = sharing.cross(peer, picks, receiver.policy, cfg)
        for b in prompts:
            group = [(peer, c) for c in crossed if c.index // size == b]
            score = hacpo.sequence_log_ratios(group).mean().item() if group else None
            if group and (b not in best or score > best[b][0]):
                best[b] = (score, group)
    return [pair for b in sorted(best) for pair in best[b][1]]


def exchange(experiences: list[sharing.Experience], cfg: sharing.ShareConfig, receiver_name: str | None = None
             ) -> dict[str, sharing.Received]:
    """GRAFT on one iteration: per receiver (only `receiver_name`, if given), the peer groups that replace its
    failed ones, crossed with the peer's advantages and weight w; the replaced own rollouts are marked not kept."""
    out = {}
    for receiver in experiences:
        if receiver_name is not None and receiver.policy.name != receiver_name:
            continue
        offered = replacing_groups(receiver, [e for e in experiences if e is not receiver], cfg)
        log_s = hacpo.sequence_log_ratios(offered)                                              # [S]
        weights = compatibility_weights(log_s, (cfg.settings or Settings()).delta)                # [S]
        accepted = [(peer, replace(c, weights=torch.full_like(c.weights, w)))
                    for (peer, c), w in zip(offered, weights.tolist()) if w > 0]
        kept = torch.ones_like(receiver.rewards, dtype=torch.bool)                                # [B, G]
        for peer, c in accepted:
            kept[c.index // peer.rollouts.group_size] = False
        crossings = [c for _, c in accepted]
        metrics = {**{name: v for name, v in sharing.crossing_metrics(crossings, cfg.ratio_cap).items()
                      if "truncated" not in name},   # the ratio cap is PRP's; GRAFT weighs by s
                   "sharing/offered": float(len(offered)),
                   "sharing/accepted": hacpo.accepted_share(weights, len(offered)),
                   "sharing/replaced_groups": float((~kept).all(dim=1).sum().item())}
        if offered:
            metrics["sharing/sequence_log_ratio_mean"] = log_s.mean().item()
        out[receiver.policy.name] = sharing.Received(receiver.advantages, crossings, metrics, kept)
    return out


class Graft:
    """GRAFT as the trainer runs it (sharing.Share)."""

    def settings(self, args: Any) -> Settings:
        return Settings(delta=args.graft_delta)

    def check(self, args: Any) -> None:
        if args.minibatches > args.prompts_per_iteration:
            raise ValueError(f"--share graft with --minibatches {args.minibatches}: a prompt whose group GRAFT "
                             f"replaces may keep a single peer rollout, so an update may hold only "
                             f"{args.prompts_per_iteration} rows; use --minibatches {args.prompts_per_iteration} or "
                             f"fewer")

    def received_at_most(self, rollouts: int) -> int:
        return rollouts // 4

    def start(self, cfg: sharing.ShareConfig) -> None:
        return None

    def observe(self, state: None, rewards: dict[str, torch.Tensor]) -> None:
        return None

    def exchange(self, experiences: list[sharing.Experience], cfg: sharing.ShareConfig, context: Any,
                 receiver_name: str | None = None) -> dict[str, sharing.Received]:
        return exchange(experiences, cfg, receiver_name)


SHARE = Graft()
