"""Whether a change left a run's metrics bit-identical: the same seeded short run at an earlier commit and here.

    python -m benchmarks.same_metrics --before 0ff2d38                      # the default flags below
    python -m benchmarks.same_metrics --before 0ff2d38 -- --share hacpo     # flags after -- override them
    python -m benchmarks.same_metrics --before 7b89147 --after-flags="--ccm-estimate exact"   # here only

A refactor must not move a number, and runs of the comparison made at two commits are paired only where the commits
are declared metric-equivalent (the set's FOLDER/equivalent-commits.txt, e.g.
results/matrix/equivalent-commits.txt), each declaration backed by such a check. The earlier commit is checked out
in a temporary worktree; both sides train `python train.py FLAGS` on one thread, each with a fresh warm-up cache of
its own (so a change to the warm-up shows too). Compared: every line of metrics.jsonl and, where the run curates, of
fidelity.jsonl, every value exactly as written (JSON text, so 1 and 1.0 differ), except wall-clock values (time_s,
perf/*_s, fidelity/time_s/*); token counts are compared. Exits 1 on a difference, naming the first ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from testbed.metrics_log import timeless

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_FLAGS = ("--share", "cross-fidelity", "--ccm-estimate", "exact", "--iterations", "2", "--seed", "900",
                 "--eval-size", "64", "--eval-every", "1", "--eval-samples", "0", "--warmup-scale", "0.1",
                 "--minibatches", "2")
"""a curated run with the registered runs' CCM estimate, two iterations on the timing seed with the pilot's minibatch
schedule, a minute a side"""
RECORDS = ("metrics.jsonl", "fidelity.jsonl")


def differences(before: Path, after: Path, most: int = 5) -> list[str]:
    """The first `most` differences between two run directories' records, [] where they are the same."""
    out = []
    for name in RECORDS:
        paths = before / name, after / name
        if not any(p.exists() for p in paths):
            if name == "metrics.jsonl":
                raise FileNotFoundError(f"neither {before} nor {after} holds a metrics.jsonl: nothing to compare")
            continue
        if not all(p.exists() for p in paths):
            out.append(f"{name}: only {'before' if paths[0].exists() else 'after'} has it")
            continue
        lines = [[timeless(json.loads(x)) for x in p.read_text().splitlines() if x.strip()] for p in paths]
        if len(lines[0]) != len(lines[1]):
            out.append(f"{name}: {len(lines[0])} lines before, {len(lines[1])} after")
        for i, (a, b) in enumerate(zip(*lines)):
            for key in sorted(set(a) | set(b)):
                before_value, after_value = (json.dumps(r[key]) if key in r else "(missing)" for r in (a, b))
                if before_value != after_value:
                    out.append(f"{name} line {i + 1}, {key}: {before_value} before, {after_value} after")
                    if len(out) >= most:
                        return out
    return out


def train(repo: Path, flags: list[str], runs_dir: Path, cache_dir: Path) -> Path:
    """One run of repo's train.py on one thread; its run directory."""
    name = "same-metrics"
    done = subprocess.run([sys.executable, str(repo / "train.py"), *flags, "--name", name, "--runs-dir", str(runs_dir),
                           "--cache-dir", str(cache_dir), "--no-tensorboard"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"train.py at {repo} failed:\n{done.stderr[-2000:]}")
    return runs_dir / name


def compare(before: str, flags: list[str], repo: Path = ROOT, after_flags: tuple[str, ...] = ()) -> list[str]:
    """Train `flags` at commit `before` (a temporary worktree) and `flags` + `after_flags` at `repo`'s working tree;
    their differences."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        earlier = tmp / "before"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(earlier), before], check=True,
                       capture_output=True)
        try:
            runs = [train(r, [*flags, *extra], tmp / f"runs-{side}", tmp / f"cache-{side}")
                    for r, side, extra in ((earlier, "before", ()), (repo, "after", after_flags))]
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(earlier)], check=True)
        return differences(*runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the earlier commit")
    parser.add_argument("--after-flags", default="", help="train.py flags for this side only, one string: a flag "
                        "the earlier commit lacks, set to what that commit did (e.g. '--share none' after a new "
                        "default)")
    parser.add_argument("flags", nargs="*", default=[], help="train.py flags after --, overriding the defaults")
    args = parser.parse_args(argv)
    found = compare(args.before, [*DEFAULT_FLAGS, *args.flags], after_flags=tuple(args.after_flags.split()))
    print(f"{args.before} against {after_side()}: " + ("bit-identical" if not found else
                                                        "different:\n  " + "\n  ".join(found)))
    return 1 if found else 0


def after_side(repo: Path = ROOT) -> str:
    """What the later side trained: HEAD, or HEAD's working tree with uncommitted changes, which no declaration of
    metric-equivalent commits can rest on."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return f"{head} with uncommitted changes (commit them, then check again before declaring)" if dirty else head


if __name__ == "__main__":
    raise SystemExit(main())
