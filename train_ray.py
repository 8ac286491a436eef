"""train.py's loop with each policy in a Ray actor of its own, on one machine or a cluster.

    python train_ray.py --pair qwen-llama                          # a Ray of this machine's own, for the run
    python train_ray.py --scale small --gpus-per-policy 0.5        # two actors per GPU
    python train_ray.py --scale paper --ray-address auto --runs-dir /shared/runs --model-dir /shared/models

Every flag of train.py (args.py) and three of Ray's (`RayArgs`). The loop is train.py's own (`train.run`), given
this team: each policy's worker (learner.PolicyWorker) runs in an actor of its own (`PolicyActor`), so the actors
roll out and update side by side, and on a CPU a run gives train.py's metrics, decisions and weights for the same
seed at the same threads per policy (train.py's torch threads, here --cpus-per-policy; tests/test_train_ray.py).
What crosses an actor's boundary: in, the iteration's prompts and problems, its peers' trajectories (completion ids,
behaviour log-probs, texts, rewards, advantages; sent from their actors' object stores) and the curator's decisions;
out, its trajectories, its metrics and, under cross-fidelity, its diagnoses of its peers' trajectories
(`ActorSide`). Token tables cross once, at start; weights and gradients never do.
What Ray adds: joining a cluster or starting a Ray for the run; each actor's declared resources, and a run refused
at start where no node has room for an actor (Ray would wait forever); an actor that dies ends the run at the
first result the loop waits for, with `PolicyLost` naming its policy; an actor that raises hands its exception to
the loop with its traceback. On a cluster every node needs this checkout and its environment at the same path,
and --runs-dir on storage every node mounts (each actor writes its part of a checkpoint).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import torch

import curator
import learner
import sharing
import train
from args import Args
from diagnosis import Diagnosis, Offer
from reward_drift import StepStats
from testbed import costs, presets, tasks

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


class PolicyActor(learner.PolicyWorker):
    """A policy's worker (learner.PolicyWorker) in a Ray actor of its own, with the torch threads its CPUs allow,
    its side of curation sending back what the loop does not hold already."""

    def __init__(self, args: RayArgs, scale: str, index: int, device: str, task: tasks.Task,
                 transfer: tasks.Task | None):
        torch.set_num_threads(args.cpus_per_policy)
        super().__init__(args, scale, index, device, task, transfer)

    def offers(self, examples: list, stats: dict[str, StepStats]) -> tuple[list[Offer], list[dict]]:
        """Each offer with its source's name in place of its source's experience, which the loop holds already
        (`ActorSide` puts it back)."""
        offers, records = super().offers(examples, stats)
        return [replace(o, source=o.source.policy.name) for o in offers], records  # type: ignore[arg-type]

    def reach(self, positions: list[int], window: list[torch.Tensor]) -> tuple[list[Diagnosis], torch.Tensor]:
        """Each offer's norms in storage of their own, since a pickled view would carry every offer's."""
        diagnoses, own = super().reach(positions, window)
        return [replace(d, norms=d.norms.clone()) if d.norms is not None else d for d in diagnoses], own


class ActorSide:
    """A receiver's side of curation (curator.Side) as the curator calls it here: in the receiver's actor, each
    step waited for, since the next depends on it; the offers' sources, sent by name, swapped back for the loop's
    copies of their experiences."""

    def __init__(self, team: RayTeam, actor: Any, experiences: list[sharing.Experience]):
        self.team, self.actor = team, actor
        self.sources = {e.policy.name: e for e in experiences}

    def offers(self, examples: list, stats: dict[str, StepStats]) -> tuple[list[Offer], list[dict]]:
        offers, records = self.team.get(self.actor.offers.remote(examples, stats))
        return [replace(o, source=self.sources[o.source]) for o in offers], records

    def reach(self, positions: list[int], window: list[torch.Tensor]) -> tuple[list[Diagnosis], torch.Tensor]:
        return self.team.get(self.actor.reach.remote(positions, window))

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats: StepStats
              ) -> tuple[dict[int, dict], sharing.Received]:
        return self.team.get(self.actor.cross.remote(credit, advantages, stats))


def actors_that_fit(nodes: list[dict[str, float]], cpus: float, gpus: float) -> int:
    """How many actors of `cpus` CPUs and `gpus` GPUs the nodes' resources hold, none split across nodes."""
    def fits(available: float, need: float) -> float:
        return available // need if need else float("inf")
    return int(sum(min(fits(r.get("CPU", 0.0), cpus), fits(r.get("GPU", 0.0), gpus)) for r in nodes))


class RayTeam:
    """The run's Ray and its policies' actors, one learner.PolicyWorker each, the `train.Team` that train.run's loop
    calls, its phases side by side; a context manager, which stops what it started."""

    backend = "ray"

    def __init__(self, args: RayArgs):
        self.actors: list = []
        self.names: list[str] = []
        self.shared: list = []          # this iteration's experiences, as futures (`experience`)
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
        self.scale: str = args.scale or ("small" if gpus else "tiny")
        try:   # a pair with no preset at this scale is refused before the run writes anything, as LocalTeam does
            presets.preset(args.pair, self.scale)
        except ValueError:
            self.close()
            raise
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        fit = actors_that_fit(nodes, args.cpus_per_policy, gpus)
        if fit < count:
            self.close()
            raise ValueError(
                f"the Ray cluster has room for {fit} of the {count} policies' "
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

    def longest_prompt(self, texts: list[str]) -> list[int]:
        return self.get([a.longest_prompt.remote(texts) for a in self.actors])

    def estimate(self, work: costs.Workload) -> list[tuple[str, str, int, int | None]]:
        return self.get([a.estimate.remote(work) for a in self.actors])

    def fingerprint(self) -> list[str]:
        return self.get([a.fingerprint.remote() for a in self.actors])

    def load(self, folder: Path) -> None:
        self.get([a.load.remote(folder) for a in self.actors])

    def rollout(self, iteration: int, prompts: list[str]) -> list[dict[str, float]]:
        return self.get([a.rollout.remote(iteration, prompts) for a in self.actors])

    def experience(self, problems: list) -> list[sharing.Experience]:
        """Every policy's experience; its future kept, to be handed on to the peers as it is (`share`)."""
        self.shared = [a.experience.remote(problems) for a in self.actors]
        return self.get(self.shared)

    def share(self) -> None:
        """Each actor receives every other one's experience, sent from their object stores as they are."""
        self.get([a.accept_shared.remote(*(s for j, s in enumerate(self.shared) if j != i))
                  for i, a in enumerate(self.actors)])

    def receive(self, context: object) -> list[sharing.Received]:
        return self.get([a.receive.remote(context) for a in self.actors])

    def sides(self, experiences: list[sharing.Experience]) -> dict[str, curator.Side]:
        return {name: ActorSide(self, actor, experiences) for name, actor in zip(self.names, self.actors)}

    def update(self, measure_kl: bool) -> list[dict[str, float]]:
        return self.get([a.update.remote(measure_kl) for a in self.actors])

    def evaluate(self, iteration: int) -> list[dict[str, float]]:
        return self.get([a.evaluate.remote(iteration) for a in self.actors])

    def save(self, folder: Path) -> None:
        self.get([a.save.remote(folder) for a in self.actors])

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


def main(args: RayArgs) -> Path:
    """One run on its Ray actors, released at the end or when the run fails."""
    try:
        with RayTeam(args) as team:
            return train.run(args, team)
    except KeyboardInterrupt:
        train.say_how_to_resume(args)
        raise


if __name__ == "__main__":
    train.cli(main, RayArgs, train.ERRORS + (PolicyLost,))
