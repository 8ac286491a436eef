"""One policy in training, and its part of each phase of a GRPO iteration (DESIGN.md §3).

A `Learner` is a policy with its optimizer and KL reference. The functions below are its phases, each pure but for
the learner's own state (its weights, its optimizer). A `PolicyWorker` holds one learner and, between phases, the
iteration's state (its rollouts, its experience, what its peers shared, what it received): train.py's loop calls
every policy's worker in turn in its own process, or each in a Ray actor of its own (train_ray.py), so the same
code runs either way.

Determinism: each policy samples from a generator of its own, seeded by (phase, seed, iteration, policy) alone, so
neither the order the policies run in nor the process they run in changes a draw: on a CPU a run gives the same
metrics under train.py and train_ray.py at the same threads per policy.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch

import eval as evaluation
import grpo
import sharing
from args import Args
from diagnosis import Diagnosis, Offer, ReceiverSide
from reward_drift import StepStats
from testbed import checkpoint, costs, lora, policies, tasks


@dataclass
class Learner:
    policy: policies.Policy
    optimizer: torch.optim.Optimizer
    reference: lora.Reference | None    # the KL reference (beta > 0), the policy as it was after warm-up
    seed: int

    @property
    def name(self) -> str:
        return self.policy.name


def build(args: Args, scale: str, index: int, device: torch.device) -> Learner:
    """Policy `index` of --pair as training starts (policies.build_policy), with AdamW on what it trains."""
    policy = policies.build_policy(args.policy_setup(scale), index, device, args.task_config)
    optimizer = torch.optim.AdamW([w for w in policy.model.parameters() if w.requires_grad], lr=args.lr,
                                  weight_decay=0.0, foreach=True)   # on a CPU too: the same values, fewer kernels
    reference = lora.reference_policy(policy.model) if args.beta > 0 else None
    return Learner(policy, optimizer, reference, args.seed)


def generator(learner: Learner, phase: str, iteration: int) -> torch.Generator:
    """The learner's draws for one phase of one iteration (module docstring)."""
    seed = random.Random(f"{phase}/{learner.seed}/{iteration}/{learner.name}").getrandbits(63)
    return torch.Generator(learner.policy.device).manual_seed(seed)


def rollout(learner: Learner, args: Args, iteration: int, prompts: list[str]
            ) -> tuple[policies.Rollouts, dict[str, float]]:
    """Phase 1: G completions per prompt, and the phase's speed (perf/rollout_*)."""
    p = learner.policy
    with measured(p.device) as perf:
        rollouts = p.rollout(prompts, args.group_size, args.max_new_tokens, args.temperature, args.top_p,
                             generator=generator(learner, "rollout", iteration))
    return rollouts, perf_metrics("rollout", sum(len(ids) for ids in rollouts.completion_ids), perf)


def experience(learner: Learner, args: Args, task: tasks.Task, problems: list, prompts: list[str],
               rollouts: policies.Rollouts) -> sharing.Experience:
    """Phase 2: the rollouts' rewards [B, G] and their own group advantages."""
    rewards = tasks.group_rewards(task, problems, rollouts.texts, args.group_size)                  # [B, G]
    return sharing.Experience(learner.policy, prompts, rollouts, rewards,
                              grpo.group_advantages(rewards, args.scale_by_std))


def receive(own: sharing.Experience, peers: list[sharing.Experience], cfg: sharing.ShareConfig,
            context: object) -> sharing.Received:
    """Phase 3 at a fixed level or a registered share: what this policy trains on, given its peers' experience.
    `context`: the share's of this iteration (sharing.Share.observe), None for a level."""
    name = own.policy.name
    if cfg.mode in sharing.SHARES:
        return sharing.SHARES[cfg.mode].exchange([own, *peers], cfg, context, name)[name]
    if cfg.mode not in sharing.MODES:
        raise ValueError(f"--share {cfg.mode} is registered in no share of this process ({', '.join(sharing.SHARES)}): "
                         "a Ray actor knows the shares baselines/__init__.py registers, so register it there")
    return sharing.exchange([own, *peers], cfg, name)[name]


def training_batch(policy: policies.Policy, rollouts: policies.Rollouts, received: sharing.Received
                   ) -> grpo.TrainBatch:
    """The policy's own rollouts (those the exchange kept), their advantages spread over every completion token
    with weight 1, then the peer trajectories it received with their own per-token advantages and weights: own
    first, peers last, the order of the optimizer steps (grpo.minibatch_rows). Where the exchange has the update
    re-measure the peers' weights (received.remeasure), their rows are grpo.Remeasured."""
    advantages = received.advantages.flatten()                                          # [B*G]
    kept = (received.kept.flatten().nonzero().flatten().tolist() if received.kept is not None
            else range(len(advantages)))
    prompts = [rollouts.prompt_ids[i].tolist() for i in kept] + [c.prompt_ids for c in received.crossings]
    completions = ([rollouts.completion_ids[i].tolist() for i in kept]
                   + [c.completion_ids for c in received.crossings])
    token_advantages = ([advantages[i].expand(len(rollouts.completion_ids[i])) for i in kept]
                        + [c.advantages for c in received.crossings])
    token_weights = ([torch.ones(len(rollouts.completion_ids[i])) for i in kept]
                     + [c.weights for c in received.crossings])
    remeasured = None
    if received.remeasure is not None:
        behaviour = torch.tensor([math.nan] * len(kept) + [c.behaviour for c in received.crossings],
                                 dtype=torch.float64)                                               # [N]
        remeasured = grpo.Remeasured(behaviour, received.remeasure)
    return grpo.build_batch(prompts, completions, token_advantages, policy.tokenizer.pad_token_id, token_weights,
                            remeasured)


def update(learner: Learner, args: Args, rollouts: policies.Rollouts, received: sharing.Received,
           measure_kl: bool) -> dict[str, float]:
    """Phase 4: a GRPO update on the learner's own rollouts and what it received; its statistics (losses/) and
    speed (perf/update_*). `measure_kl` adds losses/update_kl, one more forward pass."""
    p = learner.policy
    batch = training_batch(p, rollouts, received)
    with measured(p.device) as perf:
        stats = grpo.grpo_step(p.model, learner.optimizer, batch, args.loss_config, args.epochs, args.micro_batch,
                               args.max_grad_norm, learner.reference, args.temperature, measure_kl,
                               args.minibatches)
    return {**stats, **perf_metrics("update", batch.mask.sum().item() * args.epochs, perf)}


def evaluate(learner: Learner, args: Args, task: tasks.Task, transfer: tasks.Task | None, iteration: int
             ) -> dict[str, float]:
    """Phase 5's evaluation: greedy pass@1 on the held-out split, accuracy sampled as training samples (its
    temperature and top-p), greedy pass@1 on the transfer task."""
    p = learner.policy
    record = {"eval/heldout_accuracy": evaluation.heldout_accuracy(p, task.heldout, args.max_new_tokens, task)}
    if args.eval_samples:
        record["eval/heldout_sampled_accuracy"] = evaluation.heldout_accuracy(
            p, task.heldout, args.max_new_tokens, task, temperature=args.temperature, samples=args.eval_samples,
            generator=generator(learner, "evaluation", iteration), top_p=args.top_p)
    if transfer is not None:
        record["eval/transfer_accuracy"] = evaluation.heldout_accuracy(p, transfer.heldout, args.max_new_tokens,
                                                                       transfer)
    return record


def load(learner: Learner, folder: Path) -> None:
    checkpoint.load_policy(folder, learner.policy, learner.optimizer)


@dataclass(frozen=True)
class Peer:
    """What an experience carries of its policy once it leaves its worker: its name, and (sent once, at start) its
    token table, which a receiver needs to retokenize the completions, and its stop ids, the EOS a share may take
    off them."""

    name: str
    token_bytes: tuple[bytes, ...] = ()
    stop_ids: tuple[int, ...] = ()


def as_shared(experience: sharing.Experience) -> sharing.Experience:
    """An experience as it leaves its worker: the policy's name for the policy, and the rollouts without the prompt
    ids and byte offsets, which no peer reads (a receiver encodes the prompts and aligns the completions itself)."""
    # Experience.policy is typed for an experience in its own worker; away from it, a Peer stands in
    return replace(experience, policy=Peer(experience.policy.name),  # type: ignore[arg-type]
                   rollouts=replace(experience.rollouts, prompt_ids=[], offsets=[]))


class PolicyWorker:
    """One policy in training and, between the phases of an iteration, its state: the prompts and rollouts, its
    experience, its peers' as they shared it, its side of curation (diagnosis.ReceiverSide) and what it received.
    Each method is a policy's part of one phase (train.Team's method of the same name, or under the curator one
    step of its side, curator.Side); what goes in and out of the phases is what would cross a process boundary
    (experiences as `as_shared` makes them, metrics, decisions), never weights."""

    def __init__(self, args: Args, scale: str, index: int, device: str | torch.device, task: tasks.Task,
                 transfer: tasks.Task | None):
        self.args, self.task, self.transfer = args, task, transfer
        self.learner = build(args, scale, index, torch.device(device))
        self.name = self.learner.name
        self.peers: dict[str, Peer] = {}
        self.prompts: list[str] = []
        self.rollouts: policies.Rollouts | None = None
        self.own: sharing.Experience | None = None
        self.from_peers: list[sharing.Experience] = []
        self.side: ReceiverSide | None = None
        self.received: sharing.Received | None = None

    def __repr__(self) -> str:      # Ray names an actor by it in the errors it raises
        return f"{type(self).__name__}({self.name})"

    def as_peer(self) -> Peer:
        return Peer(self.name, tuple(self.learner.policy.token_bytes), self.learner.policy.stop_ids)

    def set_peers(self, *peers: Peer) -> None:
        self.peers = {p.name: p for p in peers if p.name != self.name}

    def longest_prompt(self, texts: list[str]) -> int:
        """The most tokens any of the prompt texts takes in the policy's tokenizer and prompt format."""
        return max(len(self.learner.policy.encode_prompt(t)) for t in texts)

    def estimate(self, work: costs.Workload) -> tuple[str, str, int, int | None]:
        return costs.policy_estimate(self.learner.policy, work)

    def rollout(self, iteration: int, prompts: list[str]) -> dict[str, float]:
        """Phase 1; the rollouts stay here, their speed goes back."""
        self.prompts = prompts
        self.rollouts, perf = rollout(self.learner, self.args, iteration, prompts)
        return perf

    def experience(self, problems: list) -> sharing.Experience:
        """Phase 2, and the experience as it is shared (the hidden TBD measure's states cross with it)."""
        a = self.args
        assert self.rollouts is not None, "phase 2 before phase 1"
        self.own = experience(self.learner, a, self.task, problems, self.prompts, self.rollouts)
        if a.share == "cross-fidelity" and a.curator_config.measures_hidden_tbd:
            self.own = sharing.with_hidden_states(self.own)
        return as_shared(self.own)

    def accept_shared(self, *peers: sharing.Experience) -> None:
        """Phase 3 begins: the peers' shared experience arrives, each with its policy's Peer (`as_shared`)."""
        assert self.own is not None, "phase 3 before phase 2"
        self.from_peers = [replace(e, policy=self.peers[e.policy.name]) for e in peers]  # type: ignore[arg-type]
        if self.args.share == "cross-fidelity":
            self.side = ReceiverSide(self.own, self.from_peers, self.task, self.args.curator_config,
                                     self.args.share_config)

    def receive(self, context: object) -> sharing.Received:
        """Phase 3 at a fixed level or a registered share; the crossings stay here, where the update trains on them."""
        assert self.own is not None, "phase 3 before phase 2"
        self.received = receive(self.own, self.from_peers, self.args.share_config, context)
        return replace(self.received, crossings=[])

    def offers(self, examples: list, stats: dict[str, StepStats]) -> tuple[list[Offer], list[dict]]:
        assert self.side is not None, "curation before the peers' experience arrived"
        return self.side.offers(examples, stats)

    def reach(self, positions: list[int], window: list[torch.Tensor]) -> tuple[list[Diagnosis], torch.Tensor]:
        assert self.side is not None, "curation before the peers' experience arrived"
        return self.side.reach(positions, window)

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats: StepStats
              ) -> tuple[dict[int, dict], sharing.Received]:
        """diagnosis.ReceiverSide.cross; the crossings stay here, with the side, where the update trains on them."""
        assert self.side is not None, "curation before the peers' experience arrived"
        crossed, received = self.side.cross(credit, advantages, stats)
        return crossed, replace(received, crossings=[], metrics=dict(received.metrics))

    def update(self, measure_kl: bool) -> dict[str, float]:
        """Phase 4 on what phase 3 left here: the curation side's crossings, or a fixed level's or share's."""
        received = self.side.received if self.side is not None else self.received
        assert self.rollouts is not None and received is not None, "phase 4 before phase 3"
        return update(self.learner, self.args, self.rollouts, received, measure_kl)

    def evaluate(self, iteration: int) -> dict[str, float]:
        return evaluate(self.learner, self.args, self.task, self.transfer, iteration)

    def fingerprint(self) -> str:
        """The fingerprint of the policy's weights as they are now (checkpoint.weights_fingerprint)."""
        return checkpoint.weights_fingerprint(self.learner.policy.model)

    def save(self, folder: Path) -> None:
        checkpoint.save_policy(folder, self.learner.policy, self.learner.optimizer)

    def load(self, folder: Path) -> None:
        load(self.learner, folder)


@contextmanager
def measured(device: torch.device) -> Iterator[dict[str, float]]:
    """Time one policy's phase on its device, with that device current (policies on several devices share train.py's
    process) and its peak memory counter reset; fills `seconds` and, on CUDA, `peak_gib` when the phase ends."""
    cuda = device.type == "cuda"
    out: dict[str, float] = {}
    with torch.cuda.device(device) if cuda else nullcontext():
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        yield out
        if cuda:
            torch.cuda.synchronize(device)
            out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 1024 ** 3
        out["seconds"] = time.perf_counter() - began


def perf_metrics(phase: str, tokens: float, measurement: dict[str, float]) -> dict[str, float]:
    """perf/{phase}_tokens (the phase's cost, what a comparison at an equal budget adds up), its speed
    perf/{phase}_tokens_per_s and, on CUDA, perf/{phase}_peak_gib (all resident weights included)."""
    out = {f"perf/{phase}_tokens": float(tokens), f"perf/{phase}_tokens_per_s": tokens / measurement["seconds"]}
    if "peak_gib" in measurement:
        out[f"perf/{phase}_peak_gib"] = measurement["peak_gib"]
    return out
