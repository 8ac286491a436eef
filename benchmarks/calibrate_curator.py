"""The curator's calibration (term_scales.py) on a calibration seed: the terms' distributions and the thresholds.

    python benchmarks/calibrate_curator.py                                  # qwen-llama, line steps, credit TBD
    python benchmarks/calibrate_curator.py --pair trio --step-format prose --iterations 50

Trains `--share cross-fidelity` on the calibration seed (0: no comparison uses it), one thread, resumable (a
finished run is reused), on raw terms (`--calibration none`) with the bootstrap thresholds `--theta1/--theta2`
(roughly the thirds of raw D on the tiny pair; they only decide what crosses during this run) and without the
predictor, so every offer that could matter is diagnosed. Writes the raw terms of every diagnosed offer (an even
subsample past --keep) to results/calibration-PAIR-FORMAT-MEASURE.json, which `train.py --calibration auto` reads,
and prints the thresholds the share rule gives the full curator and each ablation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import term_scales  # noqa: E402


def calibration_from_run(run_dir: Path, keep: int) -> term_scales.Calibration:
    """The raw terms of every diagnosed offer in the run's fidelity.jsonl, an even subsample of `keep` past it."""
    records = [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines() if line]
    rows = [tuple(r["terms"][t] for t in term_scales.TERMS) for r in records if "terms" in r]
    kept = [rows[i * len(rows) // keep] for i in range(keep)] if len(rows) > keep else rows
    return term_scales.Calibration(tuple(kept), f"{run_dir.name}: {len(rows)} diagnosed offers, {len(kept)} kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="qwen-llama")
    parser.add_argument("--step-format", default="line")
    parser.add_argument("--tbd-measure", default="credit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--theta1", type=float, default=0.1, help="the bootstrap run's thresholds on raw D")
    parser.add_argument("--theta2", type=float, default=0.16)
    parser.add_argument("--keep", type=int, default=6000, help="offers written at most (an even subsample)")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    args = parser.parse_args()
    testbed = {"pair": args.pair, "step_format": args.step_format, "tbd_measure": args.tbd_measure}
    name = f"calibrate-{args.pair}-{args.step_format}-{args.tbd_measure}-s{args.seed}"
    run_dir = Path(args.runs_dir) / name
    if not (run_dir / "report.md").exists():
        command = [sys.executable, str(ROOT / "train.py"), "--pair", args.pair, "--step-format", args.step_format,
                   "--tbd-measure", args.tbd_measure, "--share", "cross-fidelity", "--seed", str(args.seed),
                   "--iterations", str(args.iterations), "--eval-every", str(args.iterations), "--name", name,
                   "--runs-dir", args.runs_dir, "--calibration", "none", "--theta1", str(args.theta1),
                   "--theta2", str(args.theta2), "--no-predictor"]
        if (run_dir / "checkpoints" / "latest").exists():
            command.append("--resume")
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    calibration = calibration_from_run(run_dir, args.keep)
    out = term_scales.testbed_path(args.pair, args.step_format, args.tbd_measure)
    calibration.save(out, {**testbed, "seed": args.seed, "iterations": args.iterations})
    print(f"{calibration.origin}; written to {out.relative_to(ROOT)}\nthresholds by the share rule (a third each):")
    for ablate in itertools.chain.from_iterable(itertools.combinations(term_scales.TERMS, k) for k in range(3)):
        weights = term_scales.weights(ablate)
        theta1, theta2 = calibration.thresholds(weights)
        print(f"  ablate {' '.join(ablate) or '-':<8} theta1 {theta1:.4f}  theta2 {theta2:.4f}")


if __name__ == "__main__":
    main()
