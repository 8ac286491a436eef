"""--backend ray: each policy in a Ray actor of its own, on one machine or a cluster. backends.py holds the
policy's work and the loop's handles; this file holds what Ray adds:
  - joining a cluster (--ray-address) or starting a Ray of this machine's own for the run, shut down after it;
  - each actor's resources (--cpus-per-policy, also its torch threads; --gpus-per-policy), declared so that Ray
    places the actors on the cluster's nodes, and a run refused at start where no node has room for an actor
    (Ray would otherwise wait for one forever);
  - faults: an actor that dies (killed, out of memory, its node lost) ends the run at the first result the trainer
    waits for, whichever policy it belongs to, with `PolicyLost` naming the policy; an actor that raises hands its
    exception to the trainer with its traceback (Ray's RayTaskError, an instance of the original type too).
On a cluster every node needs this checkout and its environment at the same path (the actors import the code from
there) and --runs-dir on storage every node mounts (each actor writes its part of a checkpoint there).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ray

import backends
from backends import PolicyLost
import policies
import tasks

if TYPE_CHECKING:
    from train import Args


class RayHandle:
    """A policy's worker in its Ray actor: a call returns a future (ray.ObjectRef)."""

    def __init__(self, actor, name: str):
        self.actor, self.name = actor, name

    def __getattr__(self, method: str):
        return getattr(self.actor, method).remote


def room(nodes: list[dict[str, float]], cpus: float, gpus: float) -> int:
    """How many actors of `cpus` CPUs and `gpus` GPUs the nodes' resources hold, none split across nodes."""
    def fits(available: float, need: float) -> float:
        return available // need if need else float("inf")
    return int(sum(min(fits(r.get("CPU", 0.0), cpus), fits(r.get("GPU", 0.0), gpus)) for r in nodes))


class RayTeam(backends.Team):
    """The run's policies, one Ray actor each."""

    def __init__(self, args: Args):
        self.args, self.policies, self.actors = args, [], []
        count = len(policies.preset(args.pair, args.scale or "tiny"))     # every scale has as many policies
        self.started = not ray.is_initialized()     # a Ray started by the caller (a test) is the caller's to stop
        if self.started:
            start_locally = args.ray_address is None and "RAY_ADDRESS" not in os.environ
            # a Ray of this machine's own counts at least one CPU per actor, so that the actors always fit on it
            ray.init(address=args.ray_address, include_dashboard=False,
                     num_cpus=max(os.cpu_count() or 1, count * args.cpus_per_policy) if start_locally else None)
        gpus = args.gpus_per_policy
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0.0) >= 1 else 0.0
        self.scale = args.scale or ("small" if gpus else "tiny")
        self.cpus, self.gpus = args.cpus_per_policy, gpus
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        if room(nodes, self.cpus, self.gpus) < count:
            self.close()
            raise ValueError(
                f"the Ray cluster has room for {room(nodes, self.cpus, self.gpus)} of the {count} policies' actors "
                f"at {self.cpus} CPUs and {self.gpus} GPUs each (its nodes: "
                f"{[{k: r.get(k, 0) for k in ('CPU', 'GPU')} for r in nodes]}): add nodes with "
                f"`ray start --address=HEAD_IP:6379`, or lower --cpus-per-policy / --gpus-per-policy")
        self.placement = f"backend=ray, one actor per policy with {self.cpus} CPUs and {self.gpus:g} GPUs"

    def start(self, task: tasks.Task, transfer: tasks.Task | None) -> None:
        worker = ray.remote(backends.PolicyWorker)
        path = os.pathsep.join(p for p in (backends.REPO, os.environ.get("PYTHONPATH")) if p)
        options = dict(num_cpus=self.cpus, num_gpus=self.gpus, runtime_env={"env_vars": {"PYTHONPATH": path}})
        device = "cuda" if self.gpus else "cpu"   # Ray makes the actor's GPUs its only visible ones
        for i, spec in enumerate(policies.preset(self.args.pair, self.scale)):
            actor = worker.options(**options).remote(self.args, self.scale, i, device, task, transfer, self.cpus)
            self.actors.append(actor)
            self.policies.append(RayHandle(actor, spec.name))
        self.introduce()

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

    def lost(self, err: ray.exceptions.RayActorError) -> str:
        """What to tell of a dead actor: its policy, Ray's reason (where its constructor raised, that error with
        its traceback), and how to go on."""
        names = {a._actor_id.hex(): p.name for a, p in zip(self.actors, self.policies)}
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
