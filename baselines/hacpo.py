"""HACPO's equations: Heterogeneous Agent Collaborative Policy Optimization, the baseline `--share hacpo`.

Zhang et al., "Heterogeneous Agent Collaborative Reinforcement Learning", arXiv 2603.02604 (v1; the equation
numbers are those of the PDF linked from the authors' project page, whose verl recipe cites a later version's
Appendix E numbers). Receiver k trains on its own G rollouts and on every peer j's rollouts on the same prompts,
the peer's entering by text, retokenized by the receiver as PRP's are (sharing.cross).

  capability          P_k = policy k's mean reward per iteration, averaged over its last K iterations, the
    (§3.1, eq. 9)     current one included (Assumption D.1)
  capability ratio    w(k,j) = P_k / P_j, clamped to [1/bound, bound]
    (eq. 8)
  baseline            mu_k = (1/M) sum over the M = nG rewards of a prompt of w(k, source) R, and
    (§3.1, eq. 6-7)   A = (R - mu_k) / std(the M rewards), for the receiver's own responses and the peers' alike:
                      peer rewards join the baseline, as in XGRPO, but rescaled by capability
  discrepancy coef.   a peer response trains the receiver with advantage w(j,k) A: more from a stronger peer
    (§3.2, eq. 10)
  sequence ratio      s = exp(mean log pi_k(y) - mean log pi_j(y)), each mean over that policy's own tokens of
    (§3.3, eq. 11)    the text; pi_j's are its behaviour log-probs at the sampling temperature (top-p not folded
                      in, as in PRP)
  exponential IS      s * sg(s)^alpha
    (eq. 12)
  asymmetric clip     s in [1 - delta, 1]
    (§3.4, eq. 13)

The peer term's gradient (Appendix E, eq. 50 with 52) is w(j,k) A s^(1+alpha) times the per-token mean of
grad log pi_k inside the clip range and 0 outside it, so a peer sample crosses as a trajectory with the constant
token weight s^(1+alpha) and advantage w(j,k) A, and one outside [1 - delta, 1] does not cross.

The paper's gaps and the two variants (--hacpo-variant: ours, every registered run's, and official, as the
authors' recipe trains), each one's departures from the recipe and their direction of effect: DESIGN.md §4.16.
`SHARE` runs it (sharing.Share): its settings from the --hacpo-* flags, its capabilities kept across iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

import grpo
import sharing

CAPABILITY_FLOOR = 1e-8   # a policy that never succeeded in the window still has a finite ratio to another one
VARIANTS = ("ours", "official")
"""--hacpo-variant: this codebase's HACPO, as every registered hacpo run trained, or the authors' recipe's
(module docstring)"""


@dataclass(frozen=True)
class Settings:
    """HACPO's settings (sharing.ShareConfig.settings), each the --hacpo-* flag of its name (args.py documents it)."""

    alpha: float = 1.0
    delta: float = 0.2
    window: int = 5
    capability_bound: float = 10.0
    delta_step: float = 0.025
    variant: str = "ours"


GROUP_STD = {"ours": {"eps": grpo.STD_EPS, "unbiased": False}, "official": {"eps": 1e-6, "unbiased": True}}
"""each variant's group std in the advantage: grpo.group_advantages' population std + its eps, or the recipe's
sample std + 1e-6 (compute_hacpo_advantages, hacpo_trainer.yaml)"""


@dataclass
class Capabilities:
    """Each policy's capability P (eq. 9): its mean reward per iteration over its last `window` iterations.

    The state HACPO keeps across iterations: the trainer adds every policy's rewards each iteration and hands
    the capabilities to the exchange (`exchange`); the checkpoint saves it.
    """

    window: int
    history: dict[str, list[float]] = field(default_factory=dict)   # name -> mean reward of its last iterations

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"the capability window must be at least one iteration, got {self.window}")

    def observe(self, name: str, rewards: torch.Tensor) -> None:
        """Add one iteration's rewards [B, G] of policy `name`."""
        if rewards.numel() == 0 or not torch.isfinite(rewards).all():
            raise ValueError(f"{name}: capability needs at least one finite reward, got {rewards.tolist()}")
        self.history[name] = (self.history.get(name, []) + [rewards.float().mean().item()])[-self.window:]

    def update(self, rewards: dict[str, torch.Tensor]) -> dict[str, float]:
        """Add one iteration's rewards [B, G] of every policy, by name; returns every policy's capability now."""
        for name, r in rewards.items():
            self.observe(name, r)
        return dict(zip(rewards, self.of(list(rewards)).tolist()))

    def of(self, names: list[str]) -> torch.Tensor:
        """[n] the capabilities of `names`, each observed at least once."""
        unseen = [n for n in names if not self.history.get(n)]
        if unseen:
            raise KeyError(f"no rewards observed yet for {unseen}")
        return torch.tensor([sum(self.history[n]) / len(self.history[n]) for n in names], dtype=torch.float64)


def capability_ratios(capability: torch.Tensor, bound: float) -> torch.Tensor:
    """[n, n] w[k, j] = P_k / P_j clamped to [1/bound, bound] (eq. 8), from capabilities [n]; w[k, k] = 1."""
    if bound < 1:
        raise ValueError(f"the capability bound must be at least 1, got {bound}")
    if not torch.isfinite(capability).all() or (capability < 0).any():
        raise ValueError(f"capabilities must be finite and non-negative, got {capability.tolist()}")
    floored = capability.clamp(min=CAPABILITY_FLOOR)                                              # [n]
    return (floored[:, None] / floored[None, :]).clamp(1 / bound, bound)                          # [n, n]


def capability_advantages(rewards: torch.Tensor, reweight: torch.Tensor, own: torch.Tensor,
                          scale_by_std: bool = True, eps: float = grpo.STD_EPS, unbiased: bool = False
                          ) -> torch.Tensor:
    """[B, M] the advantage of every response of the joint groups for one receiver (eq. 6-7).

    rewards [B, M]: per prompt, the M responses of all policies; reweight [M]: w(receiver, source) of each column;
    own [M] bool: the receiver's own columns (the fallback baseline where the reweighted one leaves the group's
    reward range). `scale_by_std` and `eps` as in grpo.group_advantages; `unbiased`: the sample std (divisor
    M - 1, the recipe's) instead of the population std (GROUP_STD).
    """
    if rewards.ndim != 2 or rewards.shape[1] == 0 or not rewards.shape[1] == reweight.numel() == own.numel():
        raise ValueError(f"need rewards [B, M] with M > 0 and M column weights, got {tuple(rewards.shape)}, "
                         f"{tuple(reweight.shape)}, {tuple(own.shape)}")
    if not torch.isfinite(rewards).all() or not torch.isfinite(reweight).all() or (reweight <= 0).any():
        raise ValueError("rewards must be finite and the capability weights finite and positive")
    if not own.any():
        raise ValueError("the joint group holds none of the receiver's own responses")
    low, high = rewards.min(1, keepdim=True).values, rewards.max(1, keepdim=True).values        # [B, 1]
    baseline = (rewards * reweight).mean(1, keepdim=True)                                         # [B, 1]  eq. 7
    baseline = torch.where((baseline < low) | (baseline > high), rewards[:, own].mean(1, keepdim=True), baseline)
    centred = rewards - baseline                                                                  # [B, M]
    if scale_by_std:
        centred = centred / (rewards.std(1, keepdim=True, unbiased=unbiased) + eps)              # eq. 6
    # a uniform group's baseline is its reward, but a float mean of equal rewards can miss it by a rounding
    # residue, which the std's eps would blow up: no signal means exactly 0
    return torch.where(high > low, centred, torch.zeros_like(centred))


def sequence_log_ratio(receiver_logprobs: torch.Tensor, source_logprobs: torch.Tensor) -> torch.Tensor:
    """[] log s = mean receiver log-prob [m] - mean source log-prob [n] of one text (eq. 11)."""
    if receiver_logprobs.numel() == 0 or source_logprobs.numel() == 0:
        raise ValueError("a sequence ratio needs at least one token on each side")
    if torch.isnan(receiver_logprobs).any() or torch.isnan(source_logprobs).any():
        raise ValueError("log-probs contain NaN")
    return receiver_logprobs.double().mean() - source_logprobs.double().mean()


def clip_lower(delta: float, step: int = 0, delta_step: float = 0.0) -> float:
    """The lower clip bound of a peer sample trained in optimizer step `step` of an iteration (eq. 13-14)."""
    if not 0 <= delta <= 1 or delta_step < 0 or step < 0:
        raise ValueError(f"need 0 <= delta <= 1, delta_step >= 0 and step >= 0, got {delta}, {delta_step}, {step}")
    return min(1.0, 1 - delta + step * delta_step)


def cross_weights(log_ratio: torch.Tensor, alpha: float, delta: float, step: torch.Tensor | int = 0,
                  delta_step: float = 0.0) -> torch.Tensor:
    """[S] the gradient weight s^(1+alpha) of S peer samples from their log s [S] (eq. 12), 0 where s is
    outside the clip range [clip_lower(delta, step, delta_step), 1] (eq. 13-14) of the optimizer step [S] (or
    one for all) each is trained in. Computed in log space: no overflow, and a log s of -inf (probability 0
    under the receiver) is weight 0."""
    if alpha < 0:
        raise ValueError(f"need alpha >= 0, got alpha={alpha}")
    if torch.isnan(log_ratio).any():
        raise ValueError("sequence log ratios contain NaN")
    steps = torch.as_tensor(step).expand(log_ratio.shape)                                         # [S]
    lower = torch.tensor([clip_lower(delta, int(m), delta_step) for m in steps.tolist()], dtype=log_ratio.dtype,
                         device=log_ratio.device)                                                 # [S]
    inside = (log_ratio <= 0) & (log_ratio.exp() >= lower)                                        # [S]
    return torch.where(inside, torch.exp((1 + alpha) * log_ratio.clamp(max=0)), torch.zeros_like(log_ratio))


def sequence_log_ratios(offered: list[tuple[sharing.Experience, sharing.Crossing]]) -> torch.Tensor:
    """[S] log s of each (source, crossing) offered: the receiver's and the source's mean token log-probs of the
    text, each over its own tokens (sequence_log_ratio; HACPO's eq. 11, GRAFT's compatibility)."""
    return torch.tensor([sequence_log_ratio(c.logprobs, source.rollouts.logprobs[c.index]).item()
                         for source, c in offered], dtype=torch.float64)


def accepted_share(weights: torch.Tensor, offered: int) -> float:
    """The share of the `offered` peer samples that train the receiver, those with a weight [S] above 0."""
    return (weights > 0).sum().item() / offered if offered else 0.0


def without_eos(experience: sharing.Experience) -> sharing.Experience:
    """The experience with the closing EOS taken off each rollout's ids, log-probs and byte offsets, as the
    recipe's trajectories carry them (hacpo_trajectory.py): its text then crosses without an EOS, and its mean
    log-prob leaves the EOS out. A rollout that is an EOS alone keeps it, the one action it took."""
    r, stops = experience.rollouts, experience.policy.stop_ids
    ends = [len(ids) - 1 if len(ids) > 1 and ids[-1].item() in stops else len(ids) for ids in r.completion_ids]
    return replace(experience, rollouts=replace(
        r, completion_ids=[ids[:e] for ids, e in zip(r.completion_ids, ends)],
        logprobs=[logp[:e] for logp, e in zip(r.logprobs, ends)],
        offsets=[spans[:e] for spans, e in zip(r.offsets, ends)]))


def exchange(experiences: list[sharing.Experience], cfg: sharing.ShareConfig, capability: dict[str, float] | None,
             receiver_name: str | None = None) -> dict[str, sharing.Received]:
    """HACPO on one iteration, given each policy's capability: per receiver k (only `receiver_name`,
    if given), the advantages of its own rollouts against its capability-aware baseline, and the peer rollouts,
    retokenized by cross, with advantage w(j,k) A (eq. 10) and weight s^(1+alpha) (eq. 11-13), as the variant
    of cfg.settings (None: the defaults) trains them (module docstring): ours sends those that carry a gradient,
    with s measured here; official sends every one, EOS off, for the update to re-measure s at every step.
    `capability`: each policy's capability this iteration (Capabilities, kept by the trainer across iterations)."""
    settings = cfg.settings or Settings()
    if settings.variant not in VARIANTS:
        raise ValueError(f"--hacpo-variant must be one of {VARIANTS}, got {settings.variant!r}")
    official = settings.variant == "official"
    if capability is None:
        raise ValueError("--share hacpo needs the policies' capabilities of this iteration (hacpo.Capabilities, "
                         "kept across iterations)")
    missing = [e.policy.name for e in experiences if e.policy.name not in capability]
    if missing:
        raise KeyError(f"no capability given for {missing}")
    capability = torch.tensor([capability[e.policy.name] for e in experiences], dtype=torch.float64)  # [n]
    ratios = capability_ratios(capability, settings.capability_bound)                    # [n, n]
    rewards = torch.cat([e.rewards for e in experiences], dim=1)                                # [B, M]
    source = torch.cat([torch.full((e.rewards.shape[1],), j) for j, e in enumerate(experiences)])  # [M]
    out = {}
    for k, receiver in enumerate(experiences):
        if receiver_name is not None and receiver.policy.name != receiver_name:
            continue
        advantages = capability_advantages(rewards, ratios[k, source].float(), source == k, cfg.scale_by_std,
                                           **GROUP_STD[settings.variant])                        # [B, M]
        offered = []
        for j, peer in enumerate(experiences):
            if j != k:
                credit = (ratios[j, k] * advantages[:, source == j]).flatten().tolist()         # [B*G_j]
                # the recipe trains on every peer rollout, each counting in its step's mean whatever its credit
                picks = list(enumerate(credit)) if official else [(i, a) for i, a in enumerate(credit) if a != 0]
                peer = without_eos(peer) if official else peer
                offered += [(peer, c) for c in sharing.cross(peer, picks, receiver.policy, cfg)]
        log_ratio = sequence_log_ratios(offered)                                                 # [S]
        # ours sends what lies in the clip range now; the recipe sends all, its s moving with every step
        sent = (torch.ones_like(log_ratio, dtype=torch.bool) if official
                else cross_weights(log_ratio, settings.alpha, settings.delta) > 0)             # [S]
        # the samples sent fill the iteration's last optimizer steps, whose clip ranges are tighter (eq. 14)
        own = advantages[:, source == k]                                                         # [B, G]
        steps = grpo.row_steps(own.numel() + int(sent.sum()), cfg.minibatches)[own.numel():]
        weights = cross_weights(log_ratio[sent], settings.alpha, settings.delta, torch.tensor(steps),
                                      settings.delta_step)                                       # [S']
        if official:   # a forecast, the update re-measuring s: a rollout without credit never trains
            weights = weights * torch.tensor([bool(c.advantages.any()) for _, c in offered])
        crossings = [replace(c, weights=torch.full_like(c.weights, w),
                             behaviour=source.rollouts.logprobs[c.index].double().mean().item() if official else None)
                     for (source, c), w in zip([o for o, s in zip(offered, sent.tolist()) if s], weights.tolist())]
        peers = [j for j in range(len(experiences)) if j != k]
        metrics = {**{name: v for name, v in sharing.crossing_metrics(crossings, cfg.ratio_cap).items()
                      if "truncated" not in name},   # the ratio cap is PRP's; HACPO clips the sequence ratio
                   "sharing/capability": capability[k].item(),
                   "sharing/capability_ratio": ratios[peers, k].mean().item(),
                   "sharing/baseline_shift": (own - receiver.advantages).abs().mean().item(),
                   "sharing/offered": float(len(offered)),
                   "sharing/accepted": accepted_share(weights, len(offered))}
        if offered:
            metrics["sharing/sequence_log_ratio_mean"] = log_ratio.mean().item()
            metrics["sharing/clipped_high"] = (log_ratio > 0).double().mean().item()
            metrics["sharing/clipped_low"] = (log_ratio.exp() < 1 - settings.delta).double().mean().item()
        remeasure = (partial(cross_weights, alpha=settings.alpha, delta=settings.delta,
                             delta_step=settings.delta_step) if official else None)
        out[receiver.policy.name] = sharing.Received(own, crossings, metrics, remeasure=remeasure)
    return out


class Hacpo:
    """HACPO as the trainer runs it (sharing.Share)."""

    def settings(self, args: Any) -> Settings:
        return Settings(alpha=args.hacpo_alpha, delta=args.hacpo_delta, window=args.hacpo_window,
                        capability_bound=args.hacpo_capability_bound, delta_step=args.hacpo_delta_step,
                        variant=args.hacpo_variant)

    def check(self, args: Any) -> None:
        if args.epochs > 1:
            raise ValueError("--share hacpo makes one pass per iteration (--epochs 1, the recipe's ppo_epochs; "
                             "--minibatches gives it several steps): the variant ours measures its sequence ratios "
                             "once, and later epochs would reuse them")

    def received_at_most(self, rollouts: int) -> int:
        return rollouts

    def start(self, cfg: sharing.ShareConfig) -> Capabilities:
        return Capabilities((cfg.settings or Settings()).window)

    def observe(self, state: Capabilities, rewards: dict[str, torch.Tensor]) -> dict[str, float]:
        return state.update(rewards)

    def exchange(self, experiences: list[sharing.Experience], cfg: sharing.ShareConfig, context: Any,
                 receiver_name: str | None = None) -> dict[str, sharing.Received]:
        return exchange(experiences, cfg, context, receiver_name)


SHARE = Hacpo()
