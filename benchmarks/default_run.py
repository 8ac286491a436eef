"""Does the default run learn on any machine? `python train.py --pair qwen-llama` on several seeds and thread
counts, each from an empty warm-up cache, then a table per run and policy: held-out greedy pass@1 at the start
and the end with its standard error, held-out accuracy sampled at the training temperature, and the training
reward's trend (mean of the first and of the last 20 iterations); last, each run's wall time and where its
warm-ups came from (start.json).

A seeded CPU run repeats only on one machine; 1 and 2 threads reduce in different orders, so they stand in for
another machine's kernels (the warm-up, where one is made, and everything after it differ). On the default seed
the packaged warm-ups (testbed/warmups/) serve every thread count, so there only the training differs.

    python -m benchmarks.default_run                                  # seeds 1 2 3 x threads 1 2, two at a time
    python -m benchmarks.default_run --seeds 1 --threads 2 --jobs 1   # one cold default run, timed alone
    python -m benchmarks.default_run --train-args "--iterations 50"   # any train.py flags on top of the default
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import eval as evaluation
from testbed import checkpoint

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


def rows(run_dir: Path) -> list[str]:
    """The table's rows of one run, a row a policy; standard errors over the held-out problems the run evaluated."""
    records = evaluation.load_metrics(run_dir)
    problems = json.loads((run_dir / "config.json").read_text())["eval_size"]
    out = []
    for policy in dict.fromkeys(r["policy"] for r in records):
        greedy, sampled, reward = ([v for _, v in evaluation.curve(records, policy, key)] for key in
                                   ("eval/heldout_accuracy", "eval/heldout_sampled_accuracy", "charts/reward_mean"))
        first, last = reward[:20], reward[-20:]
        start, end = (f"{a:.3f} ± {evaluation.standard_error(a, problems):.3f}" for a in (greedy[0], greedy[-1]))
        out.append(f"| {run_dir.name} | {policy} | {start} | {end} | {greedy[-1] - greedy[0]:+.3f} "
                   f"| {sampled[0]:.3f} → {sampled[-1]:.3f} "
                   f"| {sum(first) / len(first):.3f} → {sum(last) / len(last):.3f} |")
    return out


def warm_ups(run_dir: Path) -> str:
    """Where the run's first sitting took each warm-up from (its start.json: the packaged file, the cache, or made
    then), in words: a cold run on the default seed pays no warm-up where the packaged ones served it."""
    taken = json.loads((run_dir / checkpoint.START).read_text())["sittings"][0].get("warm_up", {})
    return ", ".join(f"{name} {where.split(':')[0]}" for name, where in taken.items()) or "not recorded"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    cli.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    cli.add_argument("--jobs", type=int, default=2, help="runs at a time (mind the cores: jobs x threads)")
    cli.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "default-check")
    cli.add_argument("--train-args", default="", help="more train.py flags, one quoted string")
    args = cli.parse_args()
    train_args = shlex.split(args.train_args)
    grid = [(s, t) for s in args.seeds for t in args.threads]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda st: run_one(*st, args.runs_dir, train_args), grid))
    print("| run | policy | greedy start | greedy end | change | sampled start → end | train reward first 20 → "
          "last 20 |\n|---|---|---|---|---|---|---|")
    for run_dir, _ in done:
        print("\n".join(rows(run_dir)))
    print("\n" + "\n".join(f"{run_dir.name}: {wall:.0f} s wall, start-up included; warm-ups: {warm_ups(run_dir)}"
                           for run_dir, wall in done))


if __name__ == "__main__":
    main()
