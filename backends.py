"""Where each policy's work runs: in the trainer's process (--backend local) or in a Ray actor of its own
(--backend ray), behind one handle, so that train.py's loop reads the same for both.

One class holds a policy's work, `PolicyWorker`: its model, optimizer and KL reference; its rollouts and their
rewards (a code task's sandbox runs where the policy is); its side of the exchange (its own part of
sharing.exchange or graft.exchange, or the receiver's side of curation, diagnosis.ReceiverSide: the steps that
need the receiver's tokenizer or model); its update, its evaluation and its part of each checkpoint. `LocalHandle`
calls it in this process and returns results; ray_team.RayHandle calls its actor and returns futures. `get`
turns either into results, and a future passed to another policy's method is resolved there, so under Ray a
policy's trajectories go to its peers from its actor's object store.

What crosses a policy's boundary (the driver keeps prompts, the exchange, the curator's decisions, the bandit and
logging):
  in   the iteration's prompts and problems; its peers' trajectories (`shared`: completion ids, behaviour
       log-probs, texts, rewards and advantages); under cross-fidelity, every policy's step statistics and the
       curator's decisions (which offers cross, with what advantage; the receiver's pooled group advantages);
  out  its trajectories (to the driver and, once per peer, to its peers); metrics; under cross-fidelity its
       diagnoses (the offers with their per-step terms, step gradient norms and R_k; what the repairs did).
Token tables cross once, at start; weights, gradients and activations never do.

Determinism: each policy samples from a generator of its own, seeded by (phase, seed, iteration, policy) alone,
so neither the order the policies run in nor the process they run in changes a draw: on a CPU a run gives the
same metrics under both backends.

Ray itself (the cluster, the actors' resources, their faults) is ray_team.py's.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import checkpoint
import diagnosis
import eval as evaluation
import graft
import grpo
import hardware
import lora
import policies
import sharing
import tasks

if TYPE_CHECKING:   # train.py builds the backend; this file never imports it at run time
    from train import Args

REPO = str(Path(__file__).resolve().parent)


class PolicyLost(RuntimeError):
    """A policy's process died (its Ray actor, ray_team.py): the run cannot go on without it."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """What a policy's experience carries of the policy once it leaves the policy: its name, and where a receiver
    retokenizes its completions, its token table (sent once, at start)."""

    name: str
    token_bytes: tuple[bytes, ...] = ()


def training_batch(policy: policies.Policy, rollouts: policies.Rollouts, received: sharing.Received
                   ) -> grpo.TrainBatch:
    """The policy's own rollouts (those the exchange kept), their advantages spread over every completion token
    with weight 1, then the peer trajectories it received with their own per-token advantages and weights: own
    first, peers last, the order of the optimizer steps (grpo.minibatch_rows)."""
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
    return grpo.build_batch(prompts, completions, token_advantages, policy.tokenizer.pad_token_id, token_weights)


class PolicyWorker:
    """One policy's work, phase by phase (train.py's docstring); its state between phases is this iteration's
    experience, what its peers shared and what it received."""

    def __init__(self, args: Args, scale: str, index: int, device: str, task: tasks.Task,
                 transfer: tasks.Task | None, threads: int | None = None):
        self.name = policies.preset(args.pair, scale)[index].name
        if threads:   # an actor: its torch threads are the CPUs Ray gave it
            torch.set_num_threads(threads)
        self.args, self.task, self.transfer = args, task, transfer
        self.policy = hardware.build_policy(args.policy_setup(scale), index, torch.device(device), args.task_config)
        self.optimizer = torch.optim.AdamW([w for w in self.policy.model.parameters() if w.requires_grad],
                                           lr=args.lr, weight_decay=0.0)
        self.reference = lora.reference_policy(self.policy.model) if args.beta > 0 else None
        self.peers: dict[str, Peer] = {}
        self.prompts: list[str] = []
        self.rollouts: policies.Rollouts | None = None
        self.experience: sharing.Experience | None = None
        self.shared: list[sharing.Experience] = []
        self.side: diagnosis.ReceiverSide | None = None
        self.received: sharing.Received | None = None

    def __repr__(self) -> str:      # Ray names the actor by it in the errors it raises
        return f"PolicyWorker({self.name})"

    # ---- set-up ------------------------------------------------------------------------------------------------

    def card(self) -> Peer:
        return Peer(self.name, tuple(self.policy.token_bytes))

    def meet(self, *cards: Peer) -> None:
        """The peers' token tables, which retokenizing their completions needs."""
        self.peers = {c.name: c for c in cards if c.name != self.name}

    def longest_prompt(self, texts: list[str]) -> int:
        return max(len(self.policy.encode_prompt(t)) for t in texts)

    def estimate(self, work: hardware.Workload) -> tuple[str, str, int, int | None]:
        """The start-up estimate of this policy (hardware.estimate): its printed line, the device it lives on
        (named so that policies sharing one device share the name), its bytes, and the device's capacity (CUDA)."""
        p = self.policy
        est = hardware.estimate(p.model, work)
        flops = hardware.matmul_flops_per_s(p.device, next(p.model.parameters()).dtype,
                                            n=512 if p.device.type == "cpu" else 4096)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        place = f"{socket.gethostname()} {p.device}" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible else "")
        capacity = torch.cuda.mem_get_info(p.device)[1] if p.device.type == "cuda" else None
        return hardware.describe(p.name, est, flops), place, est.total_bytes, capacity

    def generator(self, phase: str, iteration: int) -> torch.Generator:
        """This policy's draws for one phase of one iteration (module docstring)."""
        seed = random.Random(f"{phase}/{self.args.seed}/{iteration}/{self.name}").getrandbits(63)
        return torch.Generator(self.policy.device).manual_seed(seed)

    # ---- the iteration -----------------------------------------------------------------------------------------

    def rollout(self, iteration: int, prompts: list[str]) -> dict[str, float]:
        """Phase 1: G completions per prompt; returns the phase's speed."""
        a, p = self.args, self.policy
        with hardware.measured(p.device) as perf:
            rollouts = p.rollout(prompts, a.group_size, a.max_new_tokens, a.temperature, a.top_p,
                                 generator=self.generator("rollout", iteration))
        self.prompts, self.rollouts = prompts, rollouts
        self.shared, self.side, self.received = [], None, None
        return hardware.perf_metrics("rollout", sum(len(ids) for ids in rollouts.completion_ids), perf)

    def score(self, problems: list) -> sharing.Experience:
        """Phase 2: rewards and own-group advantages; returns the experience as it is shared (`shared`)."""
        rewards = tasks.group_rewards(self.task, problems, self.rollouts.texts, self.args.group_size)    # [B, G]
        self.experience = sharing.Experience(self.policy, self.prompts, self.rollouts, rewards,
                                             grpo.group_advantages(rewards, self.args.scale_by_std))
        if self.args.curator_config.measures_hidden_tbd and self.args.share == "cross-fidelity":
            self.experience = sharing.with_hidden_states(self.experience)
        return shared(self.experience)

    def deliver(self, *peers: sharing.Experience) -> None:
        """Phase 3 begins: the peers' shared experience arrives."""
        self.shared = [dataclasses.replace(e, policy=self.peers[e.policy.name]) for e in peers]
        if self.args.share == "cross-fidelity":
            self.side = diagnosis.ReceiverSide(self.experience, self.shared, self.task, self.args.curator_config,
                                              self.args.share_config)

    def receive(self, capability: dict[str, float] | None = None) -> sharing.Received:
        """Phase 3 at a fixed level: this policy's part of sharing.exchange (`capability`: HACPO's, this
        iteration), or of graft.exchange. What returns holds no crossings: they stay here, where the update trains
        on them."""
        experiences, cfg = [self.experience, *self.shared], self.args.share_config
        self.received = (graft.exchange(experiences, cfg, self.name) if cfg.mode == "graft" else
                         sharing.exchange(experiences, cfg, self.name, capability))[self.name]
        return dataclasses.replace(self.received, crossings=[])

    def offers(self, examples: list, stats: dict) -> tuple[list, list[dict]]:
        """Phase 3 curated, diagnosis.ReceiverSide.offers; each offer goes back with its source's name in place of
        its source's experience, which the driver holds already."""
        offers, records = self.side.offers(examples, stats)
        return [dataclasses.replace(o, source=o.source.policy.name) for o in offers], records

    def reach(self, positions: list[int], window: list[torch.Tensor]):
        return self.side.reach(positions, window)

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats) -> tuple[dict, sharing.Received]:
        """diagnosis.ReceiverSide.cross; the crossings stay here, where the update trains on them."""
        crossed, self.received = self.side.cross(credit, advantages, stats)
        return crossed, dataclasses.replace(self.received, crossings=[], metrics=dict(self.received.metrics))

    def update(self, measure_kl: bool) -> dict[str, float]:
        """Phase 4: a GRPO update on its own rollouts and what it received; returns its statistics and speed."""
        a, p = self.args, self.policy
        batch = training_batch(p, self.experience.rollouts, self.received)
        with hardware.measured(p.device) as perf:
            stats = grpo.grpo_step(p.model, self.optimizer, batch, a.loss_config, a.epochs, a.micro_batch,
                                   a.max_grad_norm, self.reference, a.temperature, measure_kl, a.minibatches)
        return {**stats, **hardware.perf_metrics("update", batch.mask.sum().item() * a.epochs, perf)}

    def evaluate(self, iteration: int) -> dict[str, float]:
        """Phase 5's evaluation: greedy pass@1 on the held-out split, accuracy sampled at the training temperature,
        greedy pass@1 on the transfer task."""
        a, p, task = self.args, self.policy, self.task
        record = {"eval/heldout_accuracy": evaluation.heldout_accuracy(p, task.heldout, a.max_new_tokens, task)}
        if a.eval_samples:
            record["eval/heldout_sampled_accuracy"] = evaluation.heldout_accuracy(
                p, task.heldout, a.max_new_tokens, task, temperature=a.temperature, samples=a.eval_samples,
                generator=self.generator("evaluation", iteration))
        if self.transfer is not None:
            record["eval/transfer_accuracy"] = evaluation.heldout_accuracy(p, self.transfer.heldout,
                                                                           a.max_new_tokens, self.transfer)
        return record

    def save(self, folder: str) -> None:
        checkpoint.save_policy(Path(folder), self.policy, self.optimizer)

    def load(self, folder: str) -> None:
        checkpoint.load_policy(Path(folder), self.policy, self.optimizer)


def shared(experience: sharing.Experience) -> sharing.Experience:
    """An experience as it leaves its policy: the policy's name for the policy, and the rollouts without the prompt
    ids and byte offsets, which no peer reads (a receiver encodes the prompts and aligns the completions itself)."""
    return dataclasses.replace(experience, policy=Peer(experience.policy.name),
                               rollouts=dataclasses.replace(experience.rollouts, prompt_ids=[], offsets=[]))


# ---------------------------------------------------------------------------------------------------------------
# Handles and teams
# ---------------------------------------------------------------------------------------------------------------

class LocalHandle:
    """A policy's worker in this process. A call runs now and returns its result; where every policy has a CUDA
    device of its own (hardware.runs_in_parallel), a rollout or an update starts in the policy's thread instead
    and returns a future, and the policy's next call waits for it (the others run in this thread, where
    math-verify can bound its work)."""

    THREADED = ("rollout", "update")

    def __init__(self, worker: PolicyWorker, threaded: bool):
        self.worker, self.name = worker, worker.name
        self.pool = ThreadPoolExecutor(max_workers=1) if threaded else None
        self.pending: Future | None = None

    def __getattr__(self, method: str):
        work = getattr(self.worker, method)

        def call(*args):
            args = [a.result() if isinstance(a, Future) else a for a in args]
            if self.pool is not None and method in self.THREADED:
                self.pending = self.pool.submit(work, *args)
                return self.pending
            if self.pending is not None:
                self.pending.result()
            return work(*args)
        return call


class RemoteSide:
    """A receiver's side of curation (diagnosis.ReceiverSide) as the driver's curator calls it: through the
    receiver's handle, each step waiting for its result (the next step depends on it). The offers come back with
    their sources' names, which are swapped back for the driver's copies of the sources' experience."""

    def __init__(self, handle, team, experiences: list[sharing.Experience]):
        self.handle, self.team = handle, team
        self.sources = {e.policy.name: e for e in experiences}

    def offers(self, examples: list, stats: dict) -> tuple[list, list[dict]]:
        offers, records = self.team.get(self.handle.offers(examples, stats))
        return [dataclasses.replace(o, source=self.sources[o.source]) for o in offers], records

    def reach(self, positions: list[int], window: list[torch.Tensor]):
        return self.team.get(self.handle.reach(positions, window))

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats) -> tuple[dict, sharing.Received]:
        return self.team.get(self.handle.cross(credit, advantages, stats))


class Team:
    """The run's policies, local: `start` builds one worker per policy in this process."""

    def __init__(self, args: Args):
        self.args = args
        self.scale = args.scale or policies.default_scale()
        self.devices = hardware.policy_devices(args.devices, len(policies.preset(args.pair, self.scale)))
        self.placement = f"devices={','.join(map(str, self.devices))}"
        self.policies: list = []

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.policies]

    def start(self, task: tasks.Task, transfer: tasks.Task | None) -> None:
        threaded = hardware.runs_in_parallel(self.devices)
        self.policies = [LocalHandle(PolicyWorker(self.args, self.scale, i, str(d), task, transfer), threaded)
                         for i, d in enumerate(self.devices)]
        self.introduce()

    def introduce(self) -> None:
        """Every policy's token table to every other one, once."""
        cards = self.get([p.card() for p in self.policies])
        self.get([p.meet(*cards) for p in self.policies])

    def get(self, futures: Any) -> Any:
        """The results of calls (a list of them, or one)."""
        if isinstance(futures, list):
            return [self.get(f) for f in futures]
        return futures.result() if isinstance(futures, Future) else futures

    def sides(self, experiences: list[sharing.Experience]) -> dict[str, RemoteSide]:
        """Each receiver's side of curation, called from the curator (curator.Curator.exchange)."""
        return {p.name: RemoteSide(p, self, experiences) for p in self.policies}

    def close(self) -> None:
        for p in self.policies:
            if p.pool is not None:
                p.pool.shutdown()

    def __enter__(self) -> Team:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(args: Args) -> Team:
    """The run's team of policies under args.backend (ray_team.py for Ray); use it as a context manager, which
    releases it."""
    if args.backend == "ray":
        import ray_team   # only a run on Ray imports Ray
        return ray_team.RayTeam(args)
    return Team(args)
