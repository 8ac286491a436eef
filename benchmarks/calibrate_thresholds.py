"""The thresholds of the curator by the stated rule (coevolution.share_thresholds), on a calibration seed.

    python benchmarks/calibrate_thresholds.py                       # qwen-llama, seed 0, 100 iterations
    python benchmarks/calibrate_thresholds.py --pair trio --shares 0.5 0.25

Trains `--share cross-fidelity` on the calibration seed (0: the comparisons use seeds from 1), one thread,
resumable (a finished run is reused), with the thresholds given after -- (the defaults were set by a run at
`-- --theta1 0.1 --theta2 0.15`, the values before this rule), and writes the quantiles of
D_repaired over every diagnosed offer of the run that give PRP and XGRPO the stated shares, to
results/thresholds-PAIR.json. The values found for qwen-llama are curator.CuratorConfig's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import coevolution  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="qwen-llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--shares", type=float, nargs=2, default=[1 / 3, 1 / 3], help="of PRP and XGRPO")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument("extra", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args()
    name = f"calibrate-thresholds-{args.pair}-s{args.seed}"
    run_dir = Path(args.runs_dir) / name
    if not (run_dir / "report.md").exists():
        command = [sys.executable, str(ROOT / "train.py"), "--pair", args.pair, "--share", "cross-fidelity", "--seed",
                   str(args.seed), "--iterations", str(args.iterations), "--eval-every", str(args.iterations),
                   "--name", name, "--runs-dir", args.runs_dir, *args.extra]
        if (run_dir / "checkpoints" / "latest").exists():
            command.append("--resume")
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines() if line]
    d_repaired = [r["D_repaired"] for r in records if "D_repaired" in r]
    theta1, theta2 = coevolution.share_thresholds(d_repaired, tuple(args.shares))
    result = {"pair": args.pair, "seed": args.seed, "iterations": args.iterations, "shares": args.shares,
              "diagnosed_offers": len(d_repaired), "theta1": round(theta1, 4), "theta2": round(theta2, 4),
              "run": name}
    out = ROOT / "results" / f"thresholds-{args.pair}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
