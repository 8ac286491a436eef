"""train.py's loop with each policy in a Ray actor of its own, on one machine or a cluster.

    python train_ray.py --pair qwen-llama                          # a Ray of this machine's own, for the run
    python train_ray.py --scale small --gpus-per-policy 0.5        # two actors per GPU
    python train_ray.py --scale paper --ray-address auto --runs-dir /shared/runs --model-dir /shared/models

Every flag of train.py (args.py) and three of Ray's (`RayArgs`). The loop is train.py's, phase for phase; each
policy's part of a phase runs in its actor (`PolicyActor`, which calls learner.py's phases), so the actors roll out
and update side by side, and on a CPU a run gives train.py's metrics, decisions and weights for the same seed
(tests/test_train_ray.py). What crosses an actor's boundary: in, the iteration's prompts and problems, its peers'
trajectories (completion ids, behaviour log-probs, texts, rewards, advantages; sent from their actors' object
stores) and the curator's decisions; out, its trajectories, its metrics and, under cross-fidelity, its diagnoses of
its peers' trajectories (`ActorSide`). Token tables cross once, at start; weights and gradients never do.
What Ray adds: joining a cluster or starting a Ray for the run; each actor's declared resources, and a run refused
at start where no node has room for an actor (Ray would wait forever); an actor that dies ends the run at the
first result the loop waits for, with `PolicyLost` naming its policy; an actor that raises hands its exception to
the loop with its traceback. On a cluster every node needs this checkout and its environment at the same path,
and --runs-dir on storage every node mounts (each actor writes its part of a checkpoint).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import ray
import torch
from tqdm import tqdm

import diagnosis
import learner
import sharing
import train
from args import Args
from testbed import checkpoint, costs, metrics_log, policies, presets, tasks

REPO = str(Path(__file__).resolve().parent)


@dataclasses.dataclass
class RayArgs(Args):
    ray_address: str | None = None
    """the cluster to join, `auto` for the one `ray start` made on this node or HEAD_IP:6379. Default: a Ray of
    this machine's own, started for the run and stopped after it"""
    cpus_per_policy: int = 1
    """CPUs that Ray reserves for each policy's actor, which are its torch threads too"""
    gpus_per_policy: float | None = None
    """GPUs that Ray reserves for each policy's actor, at most 1 (a policy trains on one device; a fraction packs
    several actors on one GPU). Default: 1 where the cluster has a GPU, else 0"""

    def __post_init__(self):
        super().__post_init__()
        if self.devices is not None:
            raise ValueError("Ray gives each policy's actor its devices: drop --devices and set --gpus-per-policy")
        if self.cpus_per_policy < 1 or not 0 <= (self.gpus_per_policy or 0) <= 1:
            raise ValueError(f"--cpus-per-policy must be at least 1 and --gpus-per-policy within [0, 1], got "
                             f"{self.cpus_per_policy} and {self.gpus_per_policy}")


class PolicyLost(RuntimeError):
    """A policy's actor died: the run cannot go on without it."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """What an experience carries of its policy once it leaves the policy's actor: its name and its token table
    (sent once, at start), which a receiver needs to retokenize the completions."""

    name: str
    token_bytes: tuple[bytes, ...] = ()


def as_shared(experience: sharing.Experience) -> sharing.Experience:
    """An experience as it leaves its actor: the policy's name for the policy, and the rollouts without the prompt
    ids and byte offsets, which no peer reads (a receiver encodes the prompts and aligns the completions itself)."""
    return dataclasses.replace(experience, policy=Peer(experience.policy.name),
                               rollouts=dataclasses.replace(experience.rollouts, prompt_ids=[], offsets=[]))


class PolicyActor:
    """One policy in its actor: its learner, and between phases this iteration's rollouts, experience, what its
    peers shared and what it received."""

    def __init__(self, args: RayArgs, scale: str, index: int, device: str, task: tasks.Task,
                 transfer: tasks.Task | None):
        torch.set_num_threads(args.cpus_per_policy)
        self.args, self.task, self.transfer = args, task, transfer
        self.learner = learner.build(args, scale, index, torch.device(device))
        self.name = self.learner.name
        self.peers: dict[str, Peer] = {}
        self.prompts: list[str] = []
        self.rollouts: policies.Rollouts | None = None
        self.own: sharing.Experience | None = None
        self.from_peers: list[sharing.Experience] = []
        self.side: diagnosis.ReceiverSide | None = None
        self.received: sharing.Received | None = None

    def __repr__(self) -> str:      # Ray names the actor by it in the errors it raises
        return f"PolicyActor({self.name})"

    def as_peer(self) -> Peer:
        return Peer(self.name, tuple(self.learner.policy.token_bytes))

    def set_peers(self, *peers: Peer) -> None:
        self.peers = {p.name: p for p in peers if p.name != self.name}

    def longest_prompt(self, texts: list[str]) -> int:
        return learner.longest_prompt(self.learner, texts)

    def estimate(self, work: costs.Workload) -> tuple[str, str, int, int | None]:
        return costs.policy_estimate(self.learner.policy, work)

    def rollout(self, iteration: int, prompts: list[str]) -> dict[str, float]:
        self.rollouts = self.own = self.side = self.received = None   # a failed rollout leaves nothing to reuse
        self.prompts, self.from_peers = prompts, []
        self.rollouts, perf = learner.rollout(self.learner, self.args, iteration, prompts)
        return perf

    def experience(self, problems: list) -> sharing.Experience:
        """Phase 2, and the experience as it is shared (the hidden TBD measure's states cross with it)."""
        a = self.args
        self.own = learner.experience(self.learner, a, self.task, problems, self.prompts, self.rollouts)
        if a.share == "cross-fidelity" and a.curator_config.measures_hidden_tbd:
            self.own = sharing.with_hidden_states(self.own)
        return as_shared(self.own)

    def accept_shared(self, *peers: sharing.Experience) -> None:
        """Phase 3 begins: the peers' shared experience arrives."""
        self.from_peers = [dataclasses.replace(e, policy=self.peers[e.policy.name]) for e in peers]
        if self.args.share == "cross-fidelity":
            self.side = diagnosis.ReceiverSide(self.own, self.from_peers, self.task, self.args.curator_config,
                                              self.args.share_config)

    def receive(self, capability: dict[str, float] | None) -> sharing.Received:
        """Phase 3 at a fixed level; the crossings stay here, where the update trains on them."""
        self.received = learner.receive(self.own, self.from_peers, self.args.share_config, capability)
        return dataclasses.replace(self.received, crossings=[])

    def offers(self, examples: list, stats: dict) -> tuple[list, list[dict]]:
        """diagnosis.ReceiverSide.offers; each offer goes back with its source's name in place of its source's
        experience, which the loop holds already."""
        offers, records = self.side.offers(examples, stats)
        return [dataclasses.replace(o, source=o.source.policy.name) for o in offers], records

    def reach(self, positions: list[int], window: list[torch.Tensor]):
        """diagnosis.ReceiverSide.reach; each offer's norms in storage of their own, since a pickled view would
        carry every offer's."""
        diagnoses, own = self.side.reach(positions, window)
        for d in diagnoses:
            d.norms = d.norms.clone() if d.norms is not None else None
        return diagnoses, own

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats) -> tuple[dict, sharing.Received]:
        """diagnosis.ReceiverSide.cross; the crossings stay here, where the update trains on them."""
        crossed, self.received = self.side.cross(credit, advantages, stats)
        return crossed, dataclasses.replace(self.received, crossings=[], metrics=dict(self.received.metrics))

    def update(self, measure_kl: bool) -> dict[str, float]:
        return learner.update(self.learner, self.args, self.rollouts, self.received, measure_kl)

    def evaluate(self, iteration: int) -> dict[str, float]:
        return learner.evaluate(self.learner, self.args, self.task, self.transfer, iteration)

    def save(self, folder: Path) -> None:
        learner.save(self.learner, folder)

    def fingerprint(self) -> str:
        return learner.fingerprint(self.learner)

    def load(self, folder: Path) -> None:
        learner.load(self.learner, folder)


class ActorSide:
    """A receiver's side of curation (diagnosis.ReceiverSide) as the loop's curator calls it: in the receiver's
    actor, each step waiting for its result (the next depends on it). The offers come back with their sources'
    names, swapped back here for the loop's copies of the sources' experience."""

    def __init__(self, actor, team: RayTeam, experiences: list[sharing.Experience]):
        self.actor, self.team = actor, team
        self.sources = {e.policy.name: e for e in experiences}

    def offers(self, examples: list, stats: dict) -> tuple[list, list[dict]]:
        offers, records = self.team.get(self.actor.offers.remote(examples, stats))
        return [dataclasses.replace(o, source=self.sources[o.source]) for o in offers], records

    def reach(self, positions: list[int], window: list[torch.Tensor]):
        return self.team.get(self.actor.reach.remote(positions, window))

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats) -> tuple[dict, sharing.Received]:
        return self.team.get(self.actor.cross.remote(credit, advantages, stats))


def room(nodes: list[dict[str, float]], cpus: float, gpus: float) -> int:
    """How many actors of `cpus` CPUs and `gpus` GPUs the nodes' resources hold, none split across nodes."""
    def fits(available: float, need: float) -> float:
        return available // need if need else float("inf")
    return int(sum(min(fits(r.get("CPU", 0.0), cpus), fits(r.get("GPU", 0.0), gpus)) for r in nodes))


class RayTeam:
    """The run's Ray and its policies' actors; a context manager, which stops what it started."""

    def __init__(self, args: RayArgs):
        self.actors: list = []
        self.names: list[str] = []
        count = len(presets.preset(args.pair, args.scale or "tiny"))     # every scale has as many policies
        self.started = not ray.is_initialized()     # a Ray started by the caller (a test) is the caller's to stop
        if self.started:
            start_locally = args.ray_address is None and "RAY_ADDRESS" not in os.environ
            # a Ray of this machine's own counts at least one CPU per actor, so that the actors always fit on it
            ray.init(address=args.ray_address, include_dashboard=False,
                     num_cpus=max(os.cpu_count() or 1, count * args.cpus_per_policy) if start_locally else None)
        gpus = args.gpus_per_policy
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0.0) >= 1 else 0.0
        self.args, self.gpus = args, gpus
        self.scale = args.scale or ("small" if gpus else "tiny")
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        if room(nodes, args.cpus_per_policy, gpus) < count:
            self.close()
            raise ValueError(
                f"the Ray cluster has room for {room(nodes, args.cpus_per_policy, gpus)} of the {count} policies' "
                f"actors at {args.cpus_per_policy} CPUs and {gpus} GPUs each (its nodes: "
                f"{[{k: r.get(k, 0) for k in ('CPU', 'GPU')} for r in nodes]}): add nodes with "
                f"`ray start --address=HEAD_IP:6379`, or lower --cpus-per-policy / --gpus-per-policy")
        self.placement = f"one Ray actor per policy with {args.cpus_per_policy} CPUs and {gpus:g} GPUs"

    def start(self, task: tasks.Task, transfer: tasks.Task | None) -> None:
        """One actor per policy; then every policy's token table to every other one."""
        path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
        actor = ray.remote(PolicyActor).options(num_cpus=self.args.cpus_per_policy, num_gpus=self.gpus,
                                                runtime_env={"env_vars": {"PYTHONPATH": path}})
        device = "cuda" if self.gpus else "cpu"   # Ray makes the actor's GPUs its only visible ones
        for i, spec in enumerate(presets.preset(self.args.pair, self.scale)):
            self.actors.append(actor.remote(self.args, self.scale, i, device, task, transfer))
            self.names.append(spec.name)
        peers = self.get([a.as_peer.remote() for a in self.actors])
        self.get([a.set_peers.remote(*peers) for a in self.actors])

    def get(self, futures: Any) -> Any:
        """The results of calls (a list of them, or one). Waits for them in the order they finish, so that the
        first failure ends the wait, whichever policy it belongs to."""
        refs = futures if isinstance(futures, list) else [futures]
        pending = [r for r in refs if isinstance(r, ray.ObjectRef)]
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready[0])
            values = [ray.get(r) if isinstance(r, ray.ObjectRef) else r for r in refs]
        except ray.exceptions.RayActorError as err:
            raise PolicyLost(self.lost(err)) from err
        return values if isinstance(futures, list) else values[0]

    def call(self, method: str, *args) -> list:
        """`method` of every actor with the same arguments, waited for."""
        return self.get([getattr(a, method).remote(*args) for a in self.actors])

    def lost(self, err: ray.exceptions.RayActorError) -> str:
        """What to tell of a dead actor: its policy, Ray's reason (where its constructor raised, that error with
        its traceback), and how to go on."""
        names = {a._actor_id.hex(): name for a, name in zip(self.actors, self.names)}
        name = names.get(getattr(err, "actor_id", None), "a policy")
        if err.actor_init_failed:
            return f"{name}'s Ray actor could not start: {err.error_msg}"
        reasons = [line.strip() for line in str(err).splitlines() if "because" in line or "Error" in line]
        return (f"{name}'s Ray actor died ({' '.join(reasons[:2]) or type(err).__name__}); the run stops here. "
                f"Once the cause is gone, the same command with --resume continues it from its last checkpoint")

    def sides(self, experiences: list[sharing.Experience]) -> dict[str, ActorSide]:
        """Each receiver's side of curation, in its actor (curator.Curator.exchange)."""
        return {name: ActorSide(a, self, experiences) for name, a in zip(self.names, self.actors)}

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.started:
            ray.shutdown()

    def __enter__(self) -> RayTeam:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run(args: RayArgs, team: RayTeam) -> Path:
    # ---- set-up: tasks, run directory, actors, curator; a resumed run restores its last checkpoint ------------
    task, transfer = train.load_tasks(args)
    run_dir = train.open_run(args, team.scale, "ray", team.placement)
    started = time.time()
    team.start(task, transfer)
    names = team.names
    train.warn_off_task(args, team.scale, names)
    work = train.workload(args, max(team.call("longest_prompt", train.prompt_samples(task))), len(names))
    train.print_estimates(team.call("estimate", work))
    built = dict(zip(names, team.call("fingerprint")))
    start, folder, curation, capabilities = train.start_state(args, run_dir, names)
    if folder is not None:
        team.call("load", folder)
    checkpoint.record_sitting(run_dir, start, built, dict(zip(names, team.call("fingerprint")))
                              if folder is not None else built, args.allow_other_start)
    metrics = train.open_metrics(args, run_dir, start)
    accuracy = {name: float("nan") for name in names}
    if start == 0:
        evaluations = team.call("evaluate", 0)
        train.log_lines(metrics, 0, started, names, evaluations)
        accuracy = train.accuracies(names, evaluations)
    measure_update_kl = curation is not None and curation.bandit is not None

    bar = tqdm(range(start, args.iterations), initial=start, total=args.iterations, desc="train")
    for it in bar:
        # ---- 1. rollouts, every actor at once ------------------------------------------------------------------
        iteration_started = time.time()
        problems, prompts = train.draw_problems(args, task, it)
        sampled = [a.rollout.remote(it, prompts) for a in team.actors]

        # ---- 2. rewards and advantages, in each actor ----------------------------------------------------------
        shared = [a.experience.remote(problems) for a in team.actors]    # futures, handed on to the peers as they are
        rollout_perf = team.get(sampled)      # first, so that a failed rollout is the error reported
        experiences = team.get(shared)
        verdicts = train.judge(curation, experiences)

        # ---- 3. exchange: trajectories cross to every peer, then each receiver's part runs in its actor --------
        if args.share != "none":
            team.get([a.accept_shared.remote(*(s for j, s in enumerate(shared) if j != i))
                      for i, a in enumerate(team.actors)])
        if curation is not None:
            received, decisions = curation.exchange(experiences, task, problems, args.share_config, it + 1,
                                                    team.sides(experiences))
            for record in decisions:
                metrics_log.append_line(run_dir / "fidelity.jsonl", record)
        else:
            capability = (capabilities.update({e.policy.name: e.rewards for e in experiences})
                          if capabilities is not None else None)
            received = dict(zip(names, team.call("receive", capability)))

        # ---- 4. updates, every actor at once -------------------------------------------------------------------
        updates = team.call("update", measure_update_kl)

        # ---- 5. log, evaluate, checkpoint ----------------------------------------------------------------------
        iteration_s = time.time() - iteration_started
        records = train.iteration_records(experiences, rollout_perf, updates, received, verdicts, iteration_s)
        train.hand_to_guard(curation, names, records)
        train.log_lines(metrics, it + 1, started, names, records)
        evaluate_now, save_now = train.due(args, it + 1)
        if evaluate_now:
            evaluations = team.call("evaluate", it + 1)
            train.log_lines(metrics, it + 1, started, names, evaluations)
            accuracy = train.accuracies(names, evaluations)
        if save_now:
            team.call("save", checkpoint.checkpoint_folder(run_dir, it + 1))
            checkpoint.commit_checkpoint(run_dir, it + 1, names, curation if curation is not None else capabilities)
        train.progress(bar, experiences, accuracy)
    return train.finish(run_dir, metrics, started)


def main(args: RayArgs) -> Path:
    """One run on its Ray actors, released at the end or when the run fails."""
    try:
        with RayTeam(args) as team:
            return run(args, team)
    except KeyboardInterrupt:
        train.say_how_to_resume(args)
        raise


if __name__ == "__main__":
    train.cli(main, RayArgs, train.ERRORS + (PolicyLost,))
