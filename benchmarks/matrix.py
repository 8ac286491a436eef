"""The comparison matrix (issue 32): a named set of configurations x seeds, each run once, resumably.

    python -m benchmarks.matrix --set pilot --jobs 2 --commit      # the pilot: 9 configurations x seeds 1001-1008
    python -m benchmarks.matrix --set smoke --jobs 2 --runs-dir /tmp/smoke-runs --out /tmp/smoke   # minutes
    python -m benchmarks.matrix --blocks estimate ablations hacpo h4 tbd --jobs 2 --commit   # the matrix's blocks
    python eval.py --matrix results/pilot                          # the analysis (analysis/matrix.py)

Each (configuration, seed) trains as runs/SET-CONFIGURATION-sSEED (power.train_run: one thread, resumed where
its directory exists, skipped where it is complete), several at a time, each seed's configurations together so
that a partial grid is still paired. Each seed's tiny warm-ups are made once, by a job of their own (one
thread, as the runs), started two seeds ahead, so that its configurations do not all make them at once. A run
whose summary exists is never run again; a killed run resumes from its checkpoint, and only a complete run
writes its summary, OUT/CONFIGURATION-sSEED.json, so no run counts twice. With --commit the runner commits each
summary as it lands.

A summary records the commit of the code each sitting of the run trained at (the last commit that touched a file
outside results/: committing summaries changes no metric); a run is refused while tracked files outside results/
have uncommitted changes. The analysis refuses to pair runs of different commits unless they are declared
metric-equivalent (analysis/matrix.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import eval as evaluation
import fidelity_record
from analysis.curves import reward_variance
from analysis.sets import DESCRIPTIVE, H3_CONFIGURATIONS, H3_GROUPINGS, H3_SEEDS, SETS
from benchmarks import power
from testbed import checkpoint

ROOT = Path(__file__).resolve().parent.parent

BLOCKS = {
    "estimate": [("matrix", ("cross-fidelity-last2", "cross-fidelity", "sgt"), range(1009, 1020))],
    "ablations": [("matrix", ("cross-fidelity-ablate-ccm", "cross-fidelity-ablate-rsd", "cross-fidelity-adaptive",
                              "cross-fidelity-intrinsic"), range(1009, 1015))],
    "hacpo": [("matrix", ("hacpo",), range(1009, 1031)), ("matrix", ("sgt", "cross-fidelity"), range(1020, 1031))],
    "h4": [("matrix", ("cross-fidelity-hidden",), range(1009, 1011)),
           *((name, tuple(DESCRIPTIVE), range(1009, 1011)) for name in (
               "matrix-h4-qwen-qwen-line", "matrix-h4-qwen-qwen-prose", "matrix-h4-qwen-llama-prose")),
           ("matrix-h4-trio-line", ("cross-fidelity",), range(1009, 1011))],
    "tbd": [("matrix-trio-prose", ("cross-fidelity", "cross-fidelity-ablate-tbd"), range(1009, 1012))],
    "h3": [(f"h3-{grouping}", tuple(H3_CONFIGURATIONS), (seed,)) for seed in H3_SEEDS for grouping in H3_GROUPINGS],
}
"""the matrix's blocks 2-6 in the order they run, each a list of (set, configurations, seeds): a (configuration,
seed) two blocks share runs once. Block 1 runs the pilot's set at the pilot's commit (the registration). H3, a
registration of its own, runs seed by seed, the trio first so that its warm-ups serve the pairs"""


GIT = threading.Lock()   # one git command at a time across the runner's threads


def code_commit(repo: Path = ROOT) -> str:
    """The last commit that touched a file outside results/; refused while such tracked files have uncommitted
    changes, since the commit would then not say what ran."""
    outside = ["--", ".", ":(exclude)results"]
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no", *outside)
    if dirty:
        raise RuntimeError(f"uncommitted changes outside results/ ({dirty.split()[-1]}, ...): commit them first, "
                           f"so that each run's commit says what it ran")
    return git(repo, "rev-list", "-1", "HEAD", *outside)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def summarize(run_dir: Path, configuration: str, seed: int, flags: list[str], shared: list[str], commits: list[str]
              ) -> dict:
    """What the analysis reads of one complete run: per policy its held-out greedy curve, its training reward
    per iteration and their variance (analysis/curves.py), its cost spent by each evaluation (wall time is the
    run's), the mean per iteration of every sharing/ and fidelity/ metric (what crossed); for a curated run, the
    terms per source -> receiver (fidelity_record.direction_terms); the fingerprints of the weights it started
    from (checkpoint.record_sitting; None for a run begun before they were recorded), by which the analysis pairs
    runs; and the run's totals."""
    records = evaluation.load_metrics(run_dir)
    names = list(dict.fromkeys(r["policy"] for r in records))
    policies = {}
    for name in names:
        heldout = evaluation.curve(records, name, "eval/heldout_accuracy")
        if len({i for i, _ in heldout}) != len(heldout):
            raise ValueError(f"{run_dir}: {name} was evaluated twice at one iteration; a resume logged twice")
        rewards = [r for _, r in evaluation.curve(records, name, "charts/reward_mean")]
        spent = {cost: evaluation.spent(records, name, cost) for cost in evaluation.COSTS}
        crossed = {}
        for key in dict.fromkeys(k for r in records if r["policy"] == name for k in r):
            if key.startswith(("sharing/", "fidelity/")):
                values = [v for _, v in evaluation.curve(records, name, key)]
                crossed[key] = sum(values) / len(values)
        policies[name] = {"heldout": heldout, "reward_mean": rewards,
                          "reward_variance": reward_variance(rewards),
                          "spent": {cost: [(i, spent[cost][i]) for i, _ in heldout] for cost in evaluation.COSTS},
                          "crossed": crossed}
    last = max(r["iteration"] for r in records)
    fidelity = run_dir / "fidelity.jsonl"
    directions = fidelity_record.direction_terms(fidelity_record.read_records(run_dir)) if fidelity.exists() else {}
    start = run_dir / checkpoint.START
    fingerprints = json.loads(start.read_text())["fingerprints"] if start.exists() else None
    return {"configuration": configuration, "seed": seed, "flags": flags, "shared": shared, "commits": commits,
            "start_fingerprints": fingerprints, "iterations": last, "policies": policies, "directions": directions,
            "iteration_s": evaluation.spent(records, names[0], "iteration_s")[last],
            **{cost: sum(evaluation.spent(records, n, cost)[last] for n in names)
               for cost in ("rollout_tokens", "update_tokens")}}


def summary_path(out: Path, configuration: str, seed: int) -> Path:
    return out / f"{configuration}-s{seed}.json"


Train = Callable[[str, list[str], int, Path], tuple[bool, str]]
WarmUp = Callable[[str, int, Path], str]
WARM_UP_FLAGS = {"--pair", "--scale", "--model-paths", "--model-dir", "--warmup-scale", "--cache-dir", "--step-format",
                 "--num-steps", "--max-operand", "--ops"}
"""train.py flags that change what the warm-ups are: only a set's shared flags may carry them"""


def warm_up(set_name: str, seed: int, runs_dir: Path) -> str:
    """Fill the warm-up cache for `seed` under the set's flags, in a process of one thread as the runs are (the
    warm-up's float sums depend on the thread count). Returns a line for the log."""
    log = runs_dir / f"{set_name}-warm-up-s{seed}.log"
    with open(log, "a") as f:
        code = subprocess.run([sys.executable, "-m", "benchmarks.matrix", "--set", set_name, "--warm-up", str(seed)],
                              stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}).returncode
    return f"warm-up of seed {seed}: {'done' if code == 0 else f'FAILED (exit {code}), see {log}'}"


def fill_warm_up_cache(set_name: str, seed: int) -> None:
    """Build the set's policies for `seed` as train.py would, which warms tiny ones up into the cache."""
    import torch
    import tyro

    from testbed import policies
    from train import Args
    torch.set_num_threads(1)
    args = tyro.cli(Args, args=[*SETS[set_name].shared, "--seed", str(seed)])
    devices, scale = policies.devices_and_scale(args.pair, args.devices, args.scale)
    if scale == "tiny":
        policies.build_policies(args.policy_setup(scale), [torch.device("cpu")] * len(devices), args.task_config)


def schedule(configurations: list[str], seeds: list[int]) -> list[tuple[str | None, int]]:
    """The jobs in the order they start: (None, seed) a seed's warm-up, (configuration, seed) a run. The first two
    seeds' warm-ups lead; the warm-up of seed i + 2 follows the first run of seed i, so that it is ready before
    seed i + 2's runs start."""
    jobs: list[tuple[str | None, int]] = [(None, s) for s in seeds[:2]]
    for i, seed in enumerate(seeds):
        runs = [(c, seed) for c in configurations]
        jobs += runs[:1] + [(None, s) for s in seeds[i + 2:i + 3]] + runs[1:]
    return jobs


def run_one(set_name: str, configuration: str, seed: int, runs_dir: Path, out: Path, commit: bool,
            train: Train = power.train_run, repo: Path = ROOT) -> str:
    """One (configuration, seed) of a set: skipped where its summary exists; else trained (or resumed) to the
    set's iterations, then summarized, the summary committed with `commit`. Returns a line for the log."""
    matrix = SETS[set_name]
    path = summary_path(out, configuration, seed)
    if path.exists():
        return f"{path.name}: summarized already"
    name = f"{set_name}-{configuration}-s{seed}"
    sittings = runs_dir / f"{name}.commits"           # the code commit of each sitting that trained, one a line
    if power.curve_end(runs_dir / name) < matrix.iterations:
        with GIT:
            current = code_commit(repo)
        with sittings.open("a") as f:
            f.write(current + "\n")
    flags = list(matrix.configurations[configuration])
    finished, line = train(name, [*flags, "--seed", str(seed), *matrix.shared], matrix.iterations, runs_dir)
    if not finished:
        return line
    summary = summarize(runs_dir / name, configuration, seed, flags, list(matrix.shared), sittings.read_text().split())
    path.write_text(json.dumps(summary, indent=1) + "\n")
    if commit:
        with GIT:
            git(repo, "add", "--", str(path))
            git(repo, "commit", "-q", "-m", f"{out.name}: {configuration} seed {seed}", "--", str(path))
    return f"{line}; summary {path}"


def run_set(set_name: str, configurations: list[str], seeds: list[int], jobs: int, runs_dir: Path, out: Path,
            commit: bool, train: Train = power.train_run, repo: Path = ROOT, warm: WarmUp = warm_up
            ) -> Iterator[str]:
    """Every (configuration, seed), `jobs` at a time, seed by seed, each seed's warm-up ahead of its runs
    (`schedule`); yields the log lines in that order."""
    unknown = sorted(set(configurations) - set(SETS[set_name].configurations))
    if unknown:
        raise ValueError(f"{unknown} are not configurations of set {set_name}: {sorted(SETS[set_name].configurations)}")
    code_commit(repo)   # a dirty tree stops the set before any run starts
    runs_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    warming = sorted({flag for c in configurations for flag in SETS[set_name].configurations[c]} & WARM_UP_FLAGS)
    if warming:
        raise ValueError(f"configurations of set {set_name} set {warming}, which change the warm-up its runs share: "
                         f"move them into the set's shared flags")
    warmed = {seed: threading.Event() for seed in seeds}
    pending = {seed for seed in seeds
               if not all(summary_path(out, c, seed).exists() for c in configurations)}

    def job(configuration: str | None, seed: int) -> str:
        if configuration is None:
            try:
                return warm(set_name, seed, runs_dir) if seed in pending else f"warm-up of seed {seed}: not needed"
            finally:
                warmed[seed].set()
        warmed[seed].wait()
        return run_one(set_name, configuration, seed, runs_dir, out, commit, train, repo)
    with ThreadPoolExecutor(jobs) as pool:
        try:
            yield from pool.map(lambda j: job(*j), schedule(configurations, seeds))
        finally:   # a job that raised cancels the pending ones: no run may wait for a warm-up that never starts
            for event in warmed.values():
                event.set()


def main(argv: list[str] | None = None, train: Train = power.train_run, repo: Path = ROOT, warm: WarmUp = warm_up
         ) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="pilot")
    parser.add_argument("--blocks", nargs="+", choices=list(BLOCKS), default=None,
                        help="run these registered blocks in order instead of --set (summaries in results/SET)")
    parser.add_argument("--configurations", nargs="+", default=None, help="a subset of the set's (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the set's")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    parser.add_argument("--out", type=Path, default=None, help="where summaries go (default: results/SET)")
    parser.add_argument("--commit", action="store_true", help="git-commit each summary as it lands")
    parser.add_argument("--warm-up", type=int, default=None, metavar="SEED",
                        help="only fill the warm-up cache for SEED (what the runner starts ahead of a seed's runs)")
    args = parser.parse_args(argv)
    if args.blocks and (args.configurations or args.seeds or args.out):
        parser.error("--blocks runs each block's registered sets, configurations and seeds into results/SET: drop "
                     "--configurations, --seeds and --out, or run one set with --set")
    if args.warm_up is not None:
        return fill_warm_up_cache(args.set, args.warm_up)
    if args.blocks:
        for block in args.blocks:
            for set_name, configurations, seeds in BLOCKS[block]:
                for line in run_set(set_name, list(configurations), list(seeds), args.jobs, args.runs_dir,
                                    repo / "results" / set_name, args.commit, train, repo, warm):
                    print(f"{block}: {line}", flush=True)
        return None
    matrix = SETS[args.set]
    for line in run_set(args.set, args.configurations or list(matrix.configurations), args.seeds or list(matrix.seeds),
                        args.jobs, args.runs_dir, args.out or repo / "results" / args.set, args.commit, train, repo,
                        warm):
        print(line, flush=True)


if __name__ == "__main__":
    main()
