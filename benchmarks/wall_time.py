"""Where a run's wall time goes, phase by phase, for the pilot's configurations, and the same at an earlier commit.
Timing never uses a comparison seed (1001 and up): it trains, and nobody may watch those seeds train.

    python -m benchmarks.wall_time --seed 900                       # the configurations at this commit
    python -m benchmarks.wall_time --seed 900 --before ab554c1      # beside commit ab554c1, side by side

Each configuration trains `python train.py --seed S --iterations N` with its flags and the pilot's evaluation
protocol, one thread, in a process whose phases are timed by wrapping the functions that hold them at each commit
since ab554c1 (PHASES): start-up (policies, warm-ups and tokenizers), of which the warm-up (warm_up_cached, a cache
hit included), rollouts, rewards, exchange (delivery and a fixed level's sharing), curation (Curator.exchange, the
receivers' sides included; in it the CCM's gradient norms, and in those their forward and the norms taken from the
factors, the rest being the batched backward and its glue), updates, evaluation, checkpoints and the report; `other`
is the rest of the wall time. The configurations of one seed and one commit share a fresh warm-up cache and run in
order, so the first pays the warm-ups and the others find them, as in the matrix. With --before, the earlier commit
is checked out in a temporary worktree and each configuration runs there and here at the same time (two processes),
so both see the same load. Prints a table per configuration and writes OUT/wall-time-sSEED-Nit.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATIONS = ("none", "none-g16", "prp", "xgrpo", "sgt", "hacpo", "cross-fidelity")
"""the pilot's configurations (analysis/sets.py, PILOT_CONFIGURATIONS) that exist at commit ab554c1"""

PHASES = {   # phase -> (module, qualified name) of the functions timed as it, where each commit has them
    "start-up": [("backends", "Team.start"), ("learner", "build")],
    "warm-up": [("tiny", "warm_up_cached"), ("policies", "warm_up_cached"), ("testbed.policies", "warm_up_cached")],
    "rollouts": [("backends", "PolicyWorker.rollout"), ("learner", "rollout")],
    "rewards": [("backends", "PolicyWorker.score"), ("learner", "experience")],
    "exchange": [("backends", "PolicyWorker.deliver"), ("backends", "PolicyWorker.receive"), ("learner", "receive")],
    "curation": [("curator", "Curator.exchange")],
    "gradient norms": [("reachability", "step_grad_norms")],
    "norms: forward": [("reachability", "step_losses"), ("grad_norms", "step_losses")],
    "norms: from factors": [("reachability", "_weight_sq_norms"), ("reachability", "_scale_grads"),
                            ("grad_norms", "_weight_sq_norms"), ("grad_norms", "_scale_grads")],
    "updates": [("backends", "PolicyWorker.update"), ("learner", "update")],
    "evaluation": [("backends", "PolicyWorker.evaluate"), ("learner", "evaluate")],
    "checkpoints": [("backends", "PolicyWorker.save"), ("learner", "save"), ("learner", "PolicyWorker.save"),
                    ("checkpoint", "commit_checkpoint"), ("testbed.checkpoint", "commit_checkpoint")],
    "report": [("eval", "write_report")],
}
CURATION_PHASES = {
    "curation: cheap diagnosis": [("diagnosis", "ReceiverSide.offers")],
    "curation: predictor": [("curator", "Curator._predict"), ("coevolution", "FidelityPredictor.learn")],
    "curation: calibration": [("curator", "Curator.calibrate")],
    "curation: admission": [("curator", "admit")],
    "curation: crossing and repair": [("diagnosis", "ReceiverSide.cross")],
    "curation: record": [("fidelity_record", "offer_record")],
}
"""curation's own phases, timed where a commit has them (they came after ab554c1); the gradient norms above"""
NESTED = {"warm-up": "start-up", "gradient norms": "curation", "norms: forward": "gradient norms",
          "norms: from factors": "gradient norms", **dict.fromkeys(CURATION_PHASES, "curation")}


TIMING: set[str] = set()
"""the phases a timed call is under way in"""


def timed(seconds: dict[str, float], phase: str, fn):
    """fn, its calls' seconds added to seconds[phase], but for a call inside another timed call of the same phase
    (a commit may have one of a phase's functions call another: learner.PolicyWorker.save called learner.save)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if phase in TIMING:
            return fn(*args, **kwargs)
        TIMING.add(phase)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[phase] += time.perf_counter() - start
            TIMING.discard(phase)
    return wrapper


def instrumented_run(repo: Path, flags: list[str], out: Path, measure=timed) -> None:
    """In this process, which run_one started with `repo` alone on its import path: train.py of `repo` with its
    phases measured, each phase's functions wrapped by measure(totals, phase, fn) (default: timed); writes {phase: its
    total} to out, and when the phases are timed "total": the run's seconds and "other": the seconds no phase holds."""
    import importlib

    import tyro
    totals = dict.fromkeys([*PHASES, *CURATION_PHASES], 0.0)
    for phase, targets in {**PHASES, **CURATION_PHASES}.items():
        wrapped = 0
        for module_name, qualified in targets:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError:   # a file that a later commit split or removed
                continue
            owner, _, name = qualified.rpartition(".")
            holder = getattr(module, owner) if owner else module
            if hasattr(holder, name):   # a function that moved is timed where the commit has it
                setattr(holder, name, measure(totals, phase, getattr(holder, name)))
                wrapped += 1
        if not wrapped and phase in PHASES:
            raise RuntimeError(f"{repo} has none of {targets} to time as {phase}: add where it lives now to PHASES")
    train = importlib.import_module("train")   # after the wrapping: its `from m import f` must find f wrapped
    if not Path(train.__file__).resolve().is_relative_to(repo.resolve()):
        raise RuntimeError(f"train.py came from {train.__file__}, not from {repo}: start this through run_one")
    start = time.perf_counter()
    train.main(tyro.cli(train.Args, args=flags))
    total = time.perf_counter() - start
    if measure is timed:   # the wall time no phase holds
        totals["other"] = total - sum(v for p, v in totals.items() if p not in NESTED)
    out.write_text(json.dumps({**totals, "total": total} if measure is timed else totals) + "\n")


def run_one(repo: Path, flags: list[str], out: Path, script: str = __file__) -> dict[str, float]:
    """`script --inner REPO OUT -- flags` (this file's: instrumented_run) in a process of one thread, in `repo` with
    `repo` alone on its import path: the script is run by its path under `python -P` (which puts neither its folder
    nor the working directory on the path) and PYTHONPATH names `repo`, so that the run imports the modules of the
    commit it times, the script's own imports included."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    log = out.with_suffix(".log")
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-P", str(Path(script).resolve()), "--inner", str(repo), str(out),
                               "--", *flags], cwd=repo, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"{repo} {' '.join(flags)} failed ({done.returncode}); see {log}")
    return json.loads(out.read_text())


def table(name: str, sides: dict[str, dict[str, float]]) -> str:
    lines = [f"\n{name}", "| phase | " + " | ".join(sides) + (" | after / before |" if len(sides) == 2 else " |"),
             "|---|" + "---|" * (len(sides) + (len(sides) == 2))]
    for phase in [*PHASES, *CURATION_PHASES, "other", "total"]:
        values = [s[phase] for s in sides.values()]
        ratio = f" | {values[1] / values[0]:.2f} |" if len(values) == 2 and values[0] > 0 else (
            " | — |" if len(values) == 2 else " |")
        lines.append(f"| {phase}{f' (in {NESTED[phase]})' if phase in NESTED else ''} | "
                     + " | ".join(f"{v:.1f} s" for v in values) + ratio)
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seed", type=int, default=900)
    cli.add_argument("--iterations", type=int, default=100)
    cli.add_argument("--configurations", nargs="+", default=list(CONFIGURATIONS),
                     help="of the matrix's or the CCM estimate's (analysis/sets.py); default: the pilot's seven")
    cli.add_argument("--before", help="a commit to time beside this one, side by side")
    cli.add_argument("--train-args", default="", help="train.py flags added to every run (both commits)")
    cli.add_argument("--out", type=Path, default=ROOT / "results")
    cli.add_argument("--inner", nargs=2, metavar=("REPO", "OUT"), help=argparse.SUPPRESS)
    cli.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.inner:
        instrumented_run(Path(args.inner[0]), args.flags, Path(args.inner[1]))
        return
    # only here, never in a timed run, which must import its own commit's modules alone
    from analysis.sets import CCM_ESTIMATE_CONFIGURATIONS, EVALUATION, MATRIX_CONFIGURATIONS
    known = {**MATRIX_CONFIGURATIONS, **CCM_ESTIMATE_CONFIGURATIONS}
    unknown = sorted(set(args.configurations) - set(known))
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}: choose from {sorted(known)}")
    with tempfile.TemporaryDirectory(prefix="wall-time-") as tmp:
        work = Path(tmp)
        repos = {"after": ROOT}
        if args.before:
            repos = {"before": work / "before", **repos}
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(repos["before"]), args.before],
                           check=True, capture_output=True)
        try:
            results: dict[str, dict[str, dict[str, float]]] = {}
            for name in args.configurations:
                def side(label: str, name=name) -> dict[str, float]:
                    flags = ["--seed", str(args.seed), "--iterations", str(args.iterations), *EVALUATION,
                             *known[name], *args.train_args.split(),
                             "--runs-dir", str(work / label / "runs"), "--cache-dir", str(work / label / "cache"),
                             "--name", name]
                    (work / label).mkdir(exist_ok=True)
                    return run_one(repos[label], flags, work / label / f"{name}.json")
                with ThreadPoolExecutor(len(repos)) as pool:
                    results[name] = dict(zip(repos, pool.map(side, repos)))
                print(table(name, results[name]), flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(repos["before"])],
                               capture_output=True)
    totals = {label: sum(r[label]["total"] for r in results.values()) for label in repos}
    print("\nall configurations: " + ", ".join(f"{label} {t:.0f} s" for label, t in totals.items())
          + (f" (after / before {totals['after'] / totals['before']:.2f})" if args.before else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"wall-time-s{args.seed}-{args.iterations}it.json"
    path.write_text(json.dumps({"seed": args.seed, "iterations": args.iterations, "before": args.before,
                                "train_args": args.train_args, "runs": results}, indent=1) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
