"""A pair's cold tiny warm-ups one after the other (all threads each) against side by side (policies.load_policies,
one process each, the threads shared out), each into an empty cache, timed back to back in one run.

    python benchmarks/warmup_speed.py [--pair qwen-llama] [--warmup-scale 1.0] [--repeats 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import policies  # noqa: E402
import tasks  # noqa: E402


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--warmup-scale", type=float, default=1.0)
    cli.add_argument("--repeats", type=int, default=1)
    args = cli.parse_args()
    cfg, specs = tasks.TaskConfig(), policies.PRESETS["tiny"][args.pair]
    times = {"one after the other": [], "side by side": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            for i, spec in enumerate(specs):
                policies.load_tiny_policy(spec, cfg, 1 + 1000 * i, cache, args.warmup_scale)
            times["one after the other"].append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            policies.load_policies(args.pair, "tiny", torch.device("cpu"), cfg, 1, cache, warmup_scale=args.warmup_scale)
            times["side by side"].append(time.perf_counter() - start)
    steps = ", ".join(f"{s.name} {policies.warmup_steps(s, args.warmup_scale)}" for s in specs)
    print(f"\ncold warm-ups of {args.pair} ({steps} steps), {torch.get_num_threads()} threads, best of {args.repeats}:")
    for label, values in times.items():
        print(f"  {label:20s} {min(values):6.1f} s")


if __name__ == "__main__":
    main()
