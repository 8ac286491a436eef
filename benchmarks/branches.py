"""Paired branches from one checkpoint (issue 68): what a shared trajectory does to its receiver, measured between
the grains of one offer (below the noise of held-out reward) and of whole runs (16-21 points of AUC from seed to
seed).

    python -m benchmarks.branches run --preset qwen-llama --seeds 3101 --points 10 30 --k 5 --arms none chance d
    python -m benchmarks.branches report results/branches      # analysis/branches.py: report.md, report.png
    python -m benchmarks.branches plan results/branches-pilot results/branches-pilot-k10   # the pilot's rules
    python -m benchmarks.branches measure results/branches-measure-k1 results/branches-measure-k5 \
        --pilot results/branches-pilot results/branches-pilot-k10        # analysis/branches_measure.py
    # add --cell 1 loglik --points 5 10 ... --costs FOLDER: a design's numbers, its seconds from FOLDER's rows

A trunk (the default run's cross-fidelity, at the comparison's evaluation protocol) trains to each branch point in
turn; at each, every arm continues it k iterations from a copy of its checkpoint: every policy's weights and
optimizer and the curator's state (statistics, calibration samples, bandit, predictor) carry over. Every draw of a
run is seeded by its seed, the iteration and the policy alone (train.prompt_sampler, learner.generator), so arms
draw the same prompts, and the same rollouts wherever a policy's weights have not diverged: seed, history and
starting point cancel between arms, which differ only in what is admitted. The measure, each receiver's greedy
held-out accuracy on the protocol's 2,000 fixed problems at the branch's end, is chosen for its low variance: no
sampling in the evaluation, the same problems for every arm, so an arm's difference from another is the change
in the policy and nothing else. It moves in steps, though, and at the pilot's variance the controls would
separate from `none` with power 0.04 (results/preregistration-branches.md, part 2): with --measures a row carries
beside it two measures that move with the weights continuously (branch_measures.py), or those of the three it
names (`--measures loglik`). A registered study of all three at k = 1 and 5 found none that lets the controls
separate at three points a seed (results/branches-measure.md).

The arms: `none`; the shares as they run (sgt, hacpo, cross-fidelity); a control that must hurt (negated: the
trunk's own admission, every admitted offer's credit negated), beside the candidate controls that must help, SGT's
rescues of failed prompts and the receiver's own second group (second-group: `none` at twice the trunk's group
size); and ranked admission (admission.py, `--admission ranked`) at the default run's PRP share, ordered by D, each
raw term, the offer's reward or advantage, a density-ratio signal (HACPO's sequence ratio s, GRAFT's min(s, 1), an
F-TIS-style KL), or chance (the random arm), so that every signal admits as many offers at the same level and is
compared with chance, not with another amount of data or another way of crediting it. A share that keeps state
(HACPO's capabilities) begins it afresh at the branch point.

One row per (preset, seed, point), written whole or not at all, results/branches/PRESET-sSEED-itPOINT.json: each
arm's held-out accuracy per policy at point + k, the trunk's at the point, the seconds each took and the iteration
it started from. Branches run on one thread each, resumable: a row already written is skipped, and a branch killed
midway resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import tyro

import eval as evaluation
from analysis import branches as branches_report
from analysis import branches_measure, branches_plan
from analysis.sets import PROTOCOL
from args import Args
from benchmarks import branch_measures, power
from testbed import checkpoint

ROOT = Path(__file__).resolve().parent.parent

PRESETS = {"qwen-llama": ("--pair", "qwen-llama"), "trio-prose": ("--pair", "trio", "--step-format", "prose")}
"""the testbeds branches run on: qwen-llama with line steps, and the trio with prose steps, where TBD varies"""
TRUNK = ("--share", "cross-fidelity", "--ccm-estimate", "last:2")
"""the trunk every arm branches from: the default run's method with the CCM estimate the pilot ran, named so that
a change of the default moves no registered branch"""
RANKED = (*TRUNK, "--admission", "ranked")
ARMS = {"none": ("--share", "none"), "sgt": ("--share", "sgt"),
        "hacpo": ("--share", "hacpo", "--hacpo-variant", "ours"), "cross-fidelity": TRUNK,
        "negated": (*TRUNK, "--negate-credit"), "second-group": ("--share", "none"),
        **{signal: (*RANKED, "--rank-by", signal) for signal in ("d", "tbd", "ccm", "rsd", "reward", "advantage",
                                                                  "sequence_ratio", "capped_ratio", "kl", "chance")}}
"""each arm's train.py flags over the preset's and the protocol's; the ranked arms admit --admit-share (its default,
the default run's PRP share) at PRP"""


def flags_of(preset: str, seed: int, arm: str, extra: list[str]) -> list[str]:
    """train.py's flags for one arm's branch of a (preset, seed), or for its trunk (arm 'trunk'), with `extra`
    flags after them (a smoke run's smaller settings); power.train_run adds --iterations, --name and --runs-dir.
    The second-group arm samples twice the trunk's group size."""
    flags = [*PROTOCOL, *PRESETS[preset], *(TRUNK if arm == "trunk" else ARMS[arm]), "--seed", str(seed), *extra]
    if arm == "second-group":
        flags += ["--group-size", str(2 * tyro.cli(Args, args=flags).group_size)]
    return flags


def args_of(flags: list[str], iterations: int, name: str, runs_dir: Path) -> Args:
    """The Args train.py will read from `flags` as power.train_run passes them."""
    return tyro.cli(Args, args=[*flags, "--iterations", str(iterations), "--name", name, "--runs-dir", str(runs_dir)])


def carried_state(state: object, trunk: Args, arm: Args) -> object:
    """The state a branch resumes with beside its policies: the trunk's curator, with the arm's curator settings
    where the arm curates too (its admission; what the curator has learnt carries over); none where the arm shares
    otherwise (a HACPO arm begins its capability window afresh)."""
    if arm.share != trunk.share:
        return None
    state.cfg = arm.curator_config       # the curator's memory is the trunk's, its decisions the arm's
    return state


def fork(trunk_dir: Path, branch_dir: Path, trunk: Args, arm: Args) -> None:
    """A branch's run directory from the trunk's at its last checkpoint: the trunk's metrics, start record and
    checkpoint, the arm's config.json (with the trunk's scale and backend) and the state it carries
    (`carried_state`); made in a temporary folder and moved into place, so a killed fork leaves nothing half made."""
    tmp = branch_dir.with_name(branch_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _, folder, state = checkpoint.latest_checkpoint(trunk_dir)
    tmp.mkdir(parents=True)
    for name in ("metrics.jsonl", "fidelity.jsonl", "start.json"):
        if (trunk_dir / name).exists():
            shutil.copy2(trunk_dir / name, tmp / name)
    shutil.copytree(folder, tmp / "checkpoints" / folder.name)
    (tmp / "checkpoints" / "latest").write_text(folder.name)
    (tmp / "checkpoints" / folder.name / "state.pt").unlink(missing_ok=True)
    carried = carried_state(state, trunk, arm) if state is not None else None
    if carried is not None:
        torch.save(carried, tmp / "checkpoints" / folder.name / "state.pt")
    saved = json.loads((trunk_dir / "config.json").read_text())
    config = {**json.loads(json.dumps(asdict(arm))), "scale": saved["scale"], "backend": saved["backend"]}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.replace(branch_dir)


def accuracy_at(run_dir: Path, iteration: int) -> dict[str, float]:
    """Each policy's greedy held-out accuracy at `iteration`, as the run logged it."""
    found = {r["policy"]: r["eval/heldout_accuracy"] for r in evaluation.load_metrics(run_dir)
             if r["iteration"] == iteration and "eval/heldout_accuracy" in r}
    if not found:
        raise ValueError(f"{run_dir} logged no held-out evaluation at iteration {iteration}")
    return found


Train = Callable[[str, list[str], int, Path], tuple[bool, str]]
"""how a run is trained (or resumed) to its iterations: power.train_run, a train.py process on one thread"""


def trained(train: Train, name: str, flags: list[str], iterations: int, runs_dir: Path) -> Path:
    """runs_dir/name trained (or resumed) to `iterations`; an error naming its log if it failed."""
    done, line = train(name, flags, iterations, runs_dir)
    if not done:
        raise RuntimeError(line)
    return runs_dir / name


Measures = Callable[[Path], Callable[[Path], dict]]
"""a branch point's held-out measures from its trunk's run directory, then applied to each run's
(branch_measures.HeldOutMeasures)"""


def at_iteration(run_dir: Path, iteration: int) -> Path:
    """run_dir, whose last checkpoint must be at `iteration`: a measure reads the last, and a run trained further
    before would give another policy's numbers."""
    if checkpoint.checkpointed_iterations(run_dir) != iteration:
        raise ValueError(f"{run_dir} is checkpointed at {checkpoint.checkpointed_iterations(run_dir)}, not at "
                         f"{iteration}: measure it from a fresh --runs-dir")
    return run_dir


def trunk_name(preset: str, seed: int) -> str:
    return f"branches-{preset}-s{seed}-trunk"


def branch_point(preset: str, seed: int, point: int, k: int, arms: list[str], runs_dir: Path,
                 extra: list[str] = (), train: Train = power.train_run, measures: Measures | None = None) -> dict:
    """The row of one branch point: the trunk trained (or resumed) to `point`, then each arm forked from its
    checkpoint and trained k iterations; each policy's held-out accuracy, the trunk's at the point and each arm's at
    point + k; and the wall seconds each took here, evaluations included (the trunk's from the previous point, or
    from its start), which cost the budget (analysis/branches_plan.py); and the iteration each run started from
    here (its checkpoint's), so that a row resumed midway, whose seconds count only what ran since, is read as
    such. The trunk's next point resumes from this one's checkpoint, so its branches fork from the run this
    one's continued. With `measures`, the row carries too each run's measures at its end, the trunk's at the
    point, and the seconds its draws and measure took ("trunk-measures")."""
    trunk_run, trunk_flags = trunk_name(preset, seed), flags_of(preset, seed, "trunk", list(extra))
    trunk = args_of(trunk_flags, point, trunk_run, runs_dir)
    if point % trunk.eval_every or k < 1:
        raise ValueError(f"a branch point on the evaluation schedule (every {trunk.eval_every} iterations) and k >= 1, "
                         f"got {point} and {k}")
    started, started_at = time.perf_counter(), {"trunk": checkpoint.checkpointed_iterations(runs_dir / trunk_run)}
    trunk_dir = trained(train, trunk_run, trunk_flags, point, runs_dir)
    if checkpoint.checkpointed_iterations(trunk_dir) != point:
        raise ValueError(f"{trunk_dir} is checkpointed at {checkpoint.checkpointed_iterations(trunk_dir)}, past "
                         f"point {point}: a trunk trains only forward, so run a seed's points in order; to run a "
                         "seed again whole, move its run folders out of --runs-dir first")
    outcome, seconds = {}, {"trunk": time.perf_counter() - started}
    measure, measured = None, {}
    if measures:
        started = time.perf_counter()
        measure = measures(at_iteration(trunk_dir, point))
        measured["trunk"] = measure(trunk_dir)
        seconds["trunk-measures"] = time.perf_counter() - started
    for arm in arms:
        started = time.perf_counter()
        name, flags = f"branches-{preset}-s{seed}-it{point:03d}-{arm}", flags_of(preset, seed, arm, list(extra))
        if not (runs_dir / name).exists():
            fork(trunk_dir, runs_dir / name, trunk, args_of(flags, point + k, name, runs_dir))
        elif accuracy_at(runs_dir / name, point) != accuracy_at(trunk_dir, point):
            raise ValueError(f"{runs_dir / name} was forked from another trunk (its accuracy at {point} is not this "
                             "trunk's): move it out of --runs-dir and run the point again")
        started_at[arm] = checkpoint.checkpointed_iterations(runs_dir / name)
        outcome[arm] = accuracy_at(trained(train, name, flags, point + k, runs_dir), point + k)
        if measure:
            measured[arm] = measure(at_iteration(runs_dir / name, point + k))
        seconds[arm] = time.perf_counter() - started
    row = {"preset": preset, "seed": seed, "point": point, "k": k, "trunk": accuracy_at(trunk_dir, point),
           "arms": outcome, "seconds": seconds, "started_at": started_at}
    return {**row, "measures": measured} if measure else row


def measures_of(names: list[str] | None) -> Measures | None:
    """--measures as branch_point takes it: none without the flag, every measure where it names none."""
    if names is None:
        return None
    return functools.partial(branch_measures.HeldOutMeasures, names=tuple(names or branch_measures.MEASURES))


def same_trunk(out: Path, preset: str, seed: int, trunk_dir: Path) -> None:
    """A seed's rows are one trunk's: where its trunk was trained again (a row resumed in a new session, perhaps on
    a machine whose warm-up lands elsewhere), it must reach the accuracy every row already written says it had."""
    for path in sorted(out.glob(f"{preset}-s{seed}-it*.json")):
        written = json.loads(path.read_text())
        if accuracy_at(trunk_dir, written["point"]) != written["trunk"]:
            raise ValueError(f"{trunk_dir} trained again does not reach {path.name}'s trunk accuracy at its point: "
                             f"the seed's rows would mix two trunks; run the seed whole into a fresh --out")


def write_whole(path: Path, row: dict) -> None:
    """A row written in full to a temporary file, then moved into place: a row file exists only complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the trunks and their branches, a row per (seed, point)")
    run.add_argument("--preset", choices=PRESETS, default="qwen-llama")
    run.add_argument("--seeds", type=int, nargs="+", required=True)
    run.add_argument("--points", type=int, nargs="+", required=True, help="branch points on the evaluation schedule")
    run.add_argument("--k", type=int, default=5, help="iterations each branch continues")
    run.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    run.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    run.add_argument("--out", type=Path, default=ROOT / "results" / "branches")
    run.add_argument("--measures", nargs="*", choices=branch_measures.MEASURES, metavar="MEASURE",
                     help="each run's held-out measures too (benchmarks/branch_measures.py): those named of "
                          f"{', '.join(branch_measures.MEASURES)}, or all where none is named")
    run.add_argument("extra", nargs="*", help="train.py flags after --, for every run (a smoke run's settings)")
    report = commands.add_parser("report", help="the report of a folder's rows (analysis/branches.py)")
    report.add_argument("folder", type=Path)
    report.add_argument("--measure", choices=branches_measure.MEASURES, default=branches_report.ACCURACY.measure,
                        help="what the report reads of each run (the measure study's choice)")
    report.add_argument("--margin", type=float, default=branches_report.MARGIN,
                        help="of 'within', in the measure's units (part 3's effect of interest)")
    plan = commands.add_parser("plan", help="what the pilot's rows set: k, n, the controls' power and the budget's "
                                            "cuts (analysis/branches_plan.py)")
    plan.add_argument("folders", type=Path, nargs="+")
    measure = commands.add_parser("measure", help="the measure study's cells and choice, its branches checked "
                                                  "against the pilot's (analysis/branches_measure.py)")
    measure.add_argument("folders", type=Path, nargs="+")
    measure.add_argument("--pilot", type=Path, nargs="+", required=True, help="the pilot's folders, both k")
    measure.add_argument("--cell", nargs=2, metavar=("K", "MEASURE"), help="part 3's numbers for this cell, chosen "
                         "or not, at --points a seed with --costs' seconds (results/preregistration-branches.md)")
    measure.add_argument("--points", type=int, nargs="+", help="the branch points of a seed the calls would run")
    measure.add_argument("--costs", type=Path, help="rows run as the calls would run them, on a pilot seed")
    measure.add_argument("--calls", type=Path, nargs="+", metavar="FOLDER", help="rule 3's last cut from the calls' "
                         "seconds: their rows running now, then any set aside (only their seconds are read)")
    measure.add_argument("--lost-points", type=int, default=0, help="the calls' points killed before their row")
    cli = parser.parse_args(argv)
    if cli.command == "run" and cli.measures is not None:
        torch.set_num_threads(1)    # as every run trains: the measured greedy accuracy is then the one it logged
    if cli.command == "measure":
        rows = [row for folder in cli.folders for row in branches_report.load(folder)]
        pilot = [row for folder in cli.pilot for row in branches_report.load(folder)]
        branches_measure.reproduced(rows, pilot)
        by_k = {k: [r for r in rows if r["k"] == k] for k in sorted({r["k"] for r in rows})}
        cells, chosen = branches_measure.choice(by_k)
        named = (int(cli.cell[0]), cli.cell[1]) if cli.cell else chosen
        if named and named not in cells:
            parser.error(f"--cell {cli.cell[0]} {cli.cell[1]} is not a study cell: one of {sorted(cells)}")
        cost_rows = branches_report.load(cli.costs) if cli.costs else None
        arms = len({a for r in cost_rows for a in r["arms"]}) if cost_rows else len(ARMS)
        calls = branches_measure.calls_plan(by_k, pilot, cells, named, arms, points=cli.points,
                                            cost_rows=cost_rows) if named else None
        last_cut = None
        if cli.calls and calls:
            live, *aside = [branches_report.load(folder) for folder in cli.calls]
            last_cut = branches_measure.cut(calls, live, [r for rows in aside for r in rows], arms, cli.lost_points)
        print(branches_measure.markdown(cells, chosen, calls, last_cut))
        return []
    if cli.command == "report":
        print(branches_report.report(cli.folder, branches_report.Reading.of(cli.measure, cli.margin)))
        return [cli.folder / "report.md"]
    if cli.command == "plan":
        rows = [row for folder in cli.folders for row in branches_report.load(folder)]
        print(branches_plan.markdown(branches_plan.plan(rows, len(ARMS))))
        return []
    written = []
    for seed in cli.seeds:
        for point in sorted(cli.points):
            path = cli.out / f"{cli.preset}-s{seed}-it{point:03d}.json"
            if not path.exists():
                row = branch_point(cli.preset, seed, point, cli.k, cli.arms, cli.runs_dir, cli.extra,
                                   measures=measures_of(cli.measures))
                same_trunk(cli.out, cli.preset, seed, cli.runs_dir / trunk_name(cli.preset, seed))
                write_whole(path, row)
            print(f"{path.name}: written")
            written.append(path)
    return written


if __name__ == "__main__":
    main()
