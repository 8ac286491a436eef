"""What train_ray.py costs beside train.py on the tiny preset: seconds per iteration, and what crosses the actor
boundary per iteration, in bytes and calls, and how long those round trips take on Ray.

For each sharing mode, three runs of one seed at the default shape (16 prompts x 8 completions, 40 new tokens):
  local    train.py, every policy in this process;
  ray      train_ray.py, one actor per policy with --cpus-per-policy CPUs;
  weighed  train_ray.py again, every actor call weighed: its arguments (a peer's shared trajectories as they
           arrive, once per receiver, as Ray moves them) and its result, pickled with protocol 5 as Ray pickles
           them. Weighing waits for each call, so this run is not timed.
Seconds per iteration are the gaps between consecutive iterations' last update records after the first
(`iteration_walls`), which leaves out the start-up and the evaluations. The round trips are then
replayed on a Ray echo actor, one iteration's calls one after the other with the same bytes each way: an upper
bound on what the boundary costs an iteration, since the loop overlaps the policies' calls.

    python -m benchmarks.ray_overhead                                     # none, prp, cross-fidelity
    python -m benchmarks.ray_overhead --shares none --iterations 4 --cpus-per-policy 1

Timings are wall clock: on a loaded machine they move with the load; the bytes and calls do not.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import ray

import train
import train_ray
from args import Args

SET_UP = ("as_peer", "set_peers", "longest_prompt", "estimate", "evaluate", "save", "load")
"""calls made at start, at evaluations and at checkpoints, not by every iteration"""
CALLS: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
"""per iteration, each actor call's method and the bytes of its arguments and of its result"""


def iteration_walls(run_dir: Path, skip: int) -> list[float]:
    """Each iteration's wall time after the first `skip`: the gap between consecutive iterations' last update
    records (evaluations run before the first and after the last)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "losses/policy_loss" in r]
    last = max(r["iteration"] for r in updates)
    stamp = {i: max(r["time_s"] for r in updates if r["iteration"] == i) for i in range(1, last + 1)}
    return [stamp[i] - stamp[i - 1] for i in range(max(skip + 1, 2), last + 1)]


class WeighedActor:
    """An actor handle whose calls wait for their result and record its bytes and their arguments' in CALLS."""

    iteration = -1

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, method: str):
        actor = self.actor

        class Method:
            @staticmethod
            def remote(*args):
                ref = getattr(actor, method).remote(*args)
                if method == "rollout":
                    WeighedActor.iteration = args[0]
                if method not in SET_UP:
                    sent = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]
                    CALLS[WeighedActor.iteration].append((method, len(pickle.dumps(sent, protocol=5)),
                                                          len(pickle.dumps(ray.get(ref), protocol=5))))
                return ref
        return Method


def weighing(start, close):
    """RayTeam.start with its actors then wrapped in WeighedActor, and RayTeam.close with them unwrapped (ray.kill
    takes only actor handles)."""
    def started(team, *args):
        start(team, *args)
        team.actors = [WeighedActor(a) for a in team.actors]

    def closed(team):
        team.actors = [a.actor if isinstance(a, WeighedActor) else a for a in team.actors]
        close(team)
    return started, closed


@ray.remote
class Echo:
    def echo(self, payload: bytes, size: int) -> bytes:
        return bytes(size)


def replay(calls: list[tuple[str, int, int]], repeats: int = 3) -> float:
    """Seconds one iteration's calls take as Ray round trips carrying their bytes, one after the other (best of
    `repeats`)."""
    echo = Echo.remote()
    ray.get(echo.echo.remote(b"", 0))
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _, sent, back in calls:
            ray.get(echo.echo.remote(bytes(sent), back))
        best = min(best, time.perf_counter() - began)
    ray.kill(echo)
    return best


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--shares", nargs="+", default=["none", "prp", "cross-fidelity"])
    cli.add_argument("--iterations", type=int, default=6)
    cli.add_argument("--cpus-per-policy", type=int, default=1)
    cli.add_argument("--cache-dir", default=None)
    cli.add_argument("--warmup-scale", type=float, default=1.0, help="the tiny policies' warm-up budget factor")
    flags = cli.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in flags.shares:
            settings = dict(pair=flags.pair, scale="tiny", share=share, iterations=flags.iterations,
                            warmup_scale=flags.warmup_scale,
                            eval_every=10 ** 6, eval_size=16, cache_dir=flags.cache_dir, runs_dir=tmp)
            on_ray = dict(cpus_per_policy=flags.cpus_per_policy)
            walls = {"local": train.main(Args(**settings, name=f"{share}-local")),
                     "ray": train_ray.main(train_ray.RayArgs(**settings, **on_ray, name=f"{share}-ray"))}
            walls = {k: statistics.mean(iteration_walls(run, skip=1)) for k, run in walls.items()}
            CALLS.clear()
            start, close = train_ray.RayTeam.start, train_ray.RayTeam.close
            train_ray.RayTeam.start, train_ray.RayTeam.close = weighing(start, close)
            try:
                train_ray.main(train_ray.RayArgs(**settings, **on_ray, name=f"{share}-weighed"))
            finally:
                train_ray.RayTeam.start, train_ray.RayTeam.close = start, close
            middle = list(CALLS[flags.iterations // 2])
            ray.init(include_dashboard=False)
            trips = replay(middle)
            ray.shutdown()
            per_method = defaultdict(lambda: [0, 0])
            for method, sent, back in middle:
                per_method[method][0] += sent
                per_method[method][1] += back
            rows.append((share, walls, middle, trips, dict(per_method)))
    print(f"\npair {flags.pair}, tiny preset, default shape, iterations 2..{flags.iterations}; ray: one actor per "
          f"policy with {flags.cpus_per_policy} CPU(s)")
    print("| share | local s/it | ray s/it | calls/it | bytes to policies/it | bytes from policies/it | "
          "round trips replayed | share of a ray iteration |\n|---|---|---|---|---|---|---|---|")
    for share, walls, calls, trips, _ in rows:
        print(f"| {share} | {walls['local']:.2f} | {walls['ray']:.2f} | {len(calls)} | "
              f"{sum(s for _, s, _ in calls):,} | {sum(b for *_, b in calls):,} | {trips * 1000:.0f} ms | "
              f"{trips / walls['ray']:.1%} |")
    print("\nbytes per call of one iteration (to the policy / back), all policies together:")
    for share, *_, per_method in rows:
        print(f"  {share}: " + ", ".join(f"{m} {s:,} / {b:,}" for m, (s, b) in per_method.items()))


if __name__ == "__main__":
    main()
