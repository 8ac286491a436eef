"""Does an offer's fidelity predict what it does to its receiver? Issue 52, as results/preregistration-premise.md
registers it; every default is the registered value (analysis/premise_registered.py).

    python -m benchmarks.premise validate --seed 3001 --offers 200 --iterations 50      # the gate
    python -m benchmarks.premise measure --presets qwen-llama qwen-qwen trio-prose --seeds 3002 3003 3004
    python -m benchmarks.premise report results/premise                                  # P1-P4 and the figure

validate: U against real one-step lookaheads on one cross-fidelity run (premise_gate.py), its verdict in
OUT/gate-sSEED.json. measure: the rows, a file per (preset, seed, stage), each run resumed between its stages
(premise_measure.py); a stage whose file exists is skipped. report: P1-P4, report.md, report.json and premise.png
from the rows alone (analysis/premise_report.py), with issue 67's descriptive readings of the rows and of the gate's
file in the same folder (analysis/premise_readings.py). U and the signals: premise_usefulness.py; the statistics:
analysis/premise_stats.py.

A smoke run takes smaller settings: --stages, --offers, the held-out sizes, --warmup-scale and any train.py flag
in --train-flags (after the registered ones, so that it wins), into a folder of its own."""

from __future__ import annotations

import argparse
import shlex
from functools import partial
from pathlib import Path

import torch

from analysis import premise_registered as registered
from analysis import premise_report as report
from benchmarks import premise_gate as gate
from benchmarks import premise_measure as measure
from benchmarks import premise_usefulness as usefulness

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "results" / "premise"
RUNS = ROOT / "runs"


def run_options(parser: argparse.ArgumentParser) -> None:
    """The options of the commands that train: where runs go, the held-out sizes, a smoke run's smaller flags."""
    parser.add_argument("--out", type=Path, default=OUT, help="where the gate's verdict and the rows go")
    parser.add_argument("--runs-dir", default=str(RUNS), help="where the cross-fidelity runs go")
    parser.add_argument("--heldout-prompts", type=int, default=registered.HELDOUT_PROMPTS)
    parser.add_argument("--heldout-samples", type=int, default=registered.HELDOUT_SAMPLES,
                        help="samples per held-out prompt, per half of g_J")
    parser.add_argument("--warmup-scale", type=float, default=1.0, help="the tiny policies' warm-up, scaled")
    parser.add_argument("--train-flags", default="", help="train.py flags after the registered ones (smoke runs)")


def extra_flags(a: argparse.Namespace) -> tuple[str, ...]:
    return ("--warmup-scale", str(a.warmup_scale), *shlex.split(a.train_flags))


def main(argv: list[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = cli.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="the gate: U against real one-step lookaheads")
    check.add_argument("--seed", type=int, default=registered.GATE_SEED)
    check.add_argument("--offers", type=int, default=registered.GATE_OFFERS)
    check.add_argument("--iterations", type=int, default=registered.GATE_ITERATION)
    check.add_argument("--preset", default=registered.GATE_PRESET, choices=sorted(registered.PRESETS))
    check.add_argument("--lookahead-prompts", type=int, default=registered.LOOKAHEAD_PROMPTS)
    check.add_argument("--lookahead-samples", type=int, default=registered.LOOKAHEAD_SAMPLES)
    run_options(check)
    rows = sub.add_parser("measure", help="the rows: offers of each (preset, seed) at each stage")
    rows.add_argument("--presets", nargs="+", default=list(registered.PRESETS), choices=sorted(registered.PRESETS))
    rows.add_argument("--seeds", nargs="+", type=int, default=list(registered.SEEDS))
    rows.add_argument("--stages", nargs="+", type=int, default=list(registered.STAGES))
    rows.add_argument("--offers", type=int, default=registered.OFFERS_PER_DIRECTION, help="per direction and stage")
    run_options(rows)
    tables = sub.add_parser("report", help="P1-P4, the readings of the rows and the gate, and the figure")
    tables.add_argument("folder", type=Path)
    a = cli.parse_args(argv)
    if a.command == "report":
        report.report(a.folder)
        return
    torch.set_num_threads(1)
    if a.command == "validate":
        sizes = registered.Sizes(a.heldout_prompts, a.heldout_samples, a.lookahead_prompts, a.lookahead_samples)
        gate.gate(usefulness.run_args(a.preset, a.seed, a.iterations, a.runs_dir, extra_flags(a)), a.offers, sizes,
                  a.out)
        return
    sizes = registered.Sizes(a.heldout_prompts, a.heldout_samples)
    measure.measure(a.presets, a.seeds, a.stages, a.out,
                    partial(measure.stage_rows, runs_dir=a.runs_dir, offers=a.offers, sizes=sizes,
                            extra=extra_flags(a)))


if __name__ == "__main__":
    main()
