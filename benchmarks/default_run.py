"""Does the default run learn on any machine? `python train.py --pair qwen-llama` on several seeds and thread
counts, each from an empty warm-up cache, then a table per run and policy: held-out greedy pass@1 at the start
and the end with its standard error, held-out accuracy sampled at the training temperature, and the training
reward's trend (mean of the first and of the last 20 iterations).

A seeded CPU run repeats only on one machine; 1 and 2 threads reduce in different orders, so they stand in for
another machine's kernels (the warm-up, and everything after it, differ).

    python benchmarks/default_run.py                                  # seeds 1 2 3 x threads 1 2, two at a time
    python benchmarks/default_run.py --seeds 1 --threads 2 --jobs 1   # one cold default run, timed alone
    python benchmarks/default_run.py --train-args "--iterations 50"   # any train.py flags on top of the default
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(seed: int, threads: int, runs_dir: Path, train_args: list[str]) -> tuple[Path, float]:
    """One cold default run (a fresh warm-up cache), pinned to `threads`; returns its directory and wall time. An
    earlier check's run of the same seed and threads is replaced: train.py would refuse it as another run."""
    name = f"default-s{seed}-t{threads}"
    shutil.rmtree(runs_dir / name, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory() as cache:
        started = time.time()
        subprocess.run([sys.executable, "train.py", "--pair", "qwen-llama", "--seed", str(seed), "--cache-dir", cache,
                        "--runs-dir", str(runs_dir), "--name", name, *train_args],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        return runs_dir / name, time.time() - started


def standard_error(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def rows(run_dir: Path, eval_size: int) -> list[str]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = []
    for policy in dict.fromkeys(r["policy"] for r in records):
        mine = [r for r in records if r["policy"] == policy]
        greedy = [r["eval/heldout_accuracy"] for r in mine if "eval/heldout_accuracy" in r]
        sampled = [r["eval/heldout_sampled_accuracy"] for r in mine if "eval/heldout_sampled_accuracy" in r]
        reward = [r["charts/reward_mean"] for r in mine if "charts/reward_mean" in r]
        first, last = reward[:20], reward[-20:]
        out.append(f"| {run_dir.name} | {policy} | {greedy[0]:.3f} ± {standard_error(greedy[0], eval_size):.3f} "
                   f"| {greedy[-1]:.3f} ± {standard_error(greedy[-1], eval_size):.3f} | {greedy[-1] - greedy[0]:+.3f} "
                   f"| {sampled[0]:.3f} → {sampled[-1]:.3f} "
                   f"| {sum(first) / len(first):.3f} → {sum(last) / len(last):.3f} |")
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    cli.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    cli.add_argument("--jobs", type=int, default=2, help="runs at a time (mind the cores: jobs x threads)")
    cli.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "default-check")
    cli.add_argument("--eval-size", type=int, default=500, help="held-out problems (train.py's --eval-size)")
    cli.add_argument("--train-args", default="", help="more train.py flags, one quoted string")
    args = cli.parse_args()
    train_args = ["--eval-size", str(args.eval_size), *shlex.split(args.train_args)]
    grid = [(s, t) for s in args.seeds for t in args.threads]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda st: run_one(*st, args.runs_dir, train_args), grid))
    print("| run | policy | greedy start | greedy end | change | sampled start → end | train reward first 20 → "
          "last 20 |\n|---|---|---|---|---|---|---|")
    for run_dir, _ in done:
        print("\n".join(rows(run_dir, args.eval_size)))
    print("\n" + "\n".join(f"{run_dir.name}: {wall:.0f} s wall, warm-up included" for run_dir, wall in done))


if __name__ == "__main__":
    main()
