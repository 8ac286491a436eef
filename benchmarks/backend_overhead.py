"""What --backend ray costs on the tiny preset: seconds per iteration, local against ray, and what crosses the
actor boundary per iteration, in bytes and calls, and how long those round trips take on Ray.

For each sharing mode, two runs of one seed at the default shape (16 prompts x 8 completions, 40 new tokens):
  local  --backend local, every handle call weighed: its arguments and its result pickled (protocol 5, as Ray
         pickles them), which is what a Ray actor boundary carries (a policy's shared trajectories are counted
         once to the trainer and once to each peer, as Ray moves them);
  ray    --backend ray, one actor per policy with --cpus-per-policy CPUs.
Seconds per iteration are the gaps between consecutive iterations' last update records after the first
(curation_overhead.per_iteration), which leaves out the start-up and the evaluations. The round trips are then
replayed on a Ray echo actor, one iteration's calls one after the other with the same bytes each way: an upper
bound on what the boundary costs an iteration, since the loop overlaps the policies' calls.

    python benchmarks/backend_overhead.py                                     # none, prp, cross-fidelity
    python benchmarks/backend_overhead.py --shares none --iterations 4 --cpus-per-policy 1

Timings are wall clock: on a loaded machine they move with the load; the bytes and calls do not.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

import backends  # noqa: E402
import train  # noqa: E402
from curation_overhead import per_iteration  # noqa: E402

SET_UP = ("card", "meet", "longest_prompt", "estimate", "evaluate", "save", "load")
"""calls made at start, at evaluations and at checkpoints, not by every iteration"""


class WeighingHandle(backends.LocalHandle):
    """A local handle that records, per iteration, each call's method and the bytes of its arguments and result."""

    calls: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    iteration = -1

    def __getattr__(self, method: str):
        call = super().__getattr__(method)

        def weighed(*args):
            result = call(*args)
            if method == "rollout":
                WeighingHandle.iteration = args[0]
            if method not in SET_UP:
                sent = len(pickle.dumps(args, protocol=5))
                back = len(pickle.dumps(result.result() if isinstance(result, Future) else result, protocol=5))
                WeighingHandle.calls[WeighingHandle.iteration].append((method, sent, back))
            return result
        return weighed


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
    flags = cli.parse_args()
    backends.LocalHandle = WeighingHandle       # what Team.start builds
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in flags.shares:
            walls = {}
            for backend in ("local", "ray"):
                placement = dict(backend="ray", cpus_per_policy=flags.cpus_per_policy) if backend == "ray" else {}
                args = train.Args(pair=flags.pair, scale="tiny", share=share, iterations=flags.iterations,
                                  eval_every=10 ** 6, eval_size=16, cache_dir=flags.cache_dir, runs_dir=tmp,
                                  name=f"{share}-{backend}", **placement)
                WeighingHandle.calls.clear()
                walls[backend] = statistics.mean(per_iteration(train.main(args), skip=1)[0])
                if backend == "local":
                    weighed = {it: list(calls) for it, calls in WeighingHandle.calls.items()}
            middle = weighed[flags.iterations // 2]
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
