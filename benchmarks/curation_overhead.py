"""The curator's cost per iteration on the tiny preset, against the same iteration without curation.

Three runs of the same seed and recipe: --share none, --share cross-fidelity with the predictor, and without it.
An iteration's wall time is the gap between the time stamps of consecutive iterations' last update records
(evaluation only runs before the first and after the last); the curator's own phases come from its
fidelity/time_s/* metrics (summed over receivers): the cheap diagnosis (retokenize, align, TBD, RSD), the
gradient norms (CCM and the intrinsic signal, calibration included), prediction, scoring and repair, admission,
and crossing (the receiver's log-probs and the repaired per-token advantages of what enters as tokens).

    python benchmarks/curation_overhead.py                       # qwen-llama, 8 iterations
    python benchmarks/curation_overhead.py --pair trio --iterations 6

Timings are wall clock and noisy on a shared machine; the first two iterations are left out of the means (the
predictor has not yet seen enough trajectories to skip anything).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402

from args import Args  # noqa: E402

PHASES = ("statistics", "diagnosis", "gradnorms", "prediction", "repair", "admission", "crossing")


def per_iteration(run_dir: Path, skip: int) -> tuple[list[float], dict[str, list[float]]]:
    """Iteration wall times, and each fidelity/time_s metric summed over receivers, per iteration after `skip`."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "losses/policy_loss" in r]
    last = max(r["iteration"] for r in updates)
    stamp = {i: max(r["time_s"] for r in updates if r["iteration"] == i) for i in range(1, last + 1)}
    walls = [stamp[i] - stamp[i - 1] for i in range(max(skip + 1, 2), last + 1)]
    phases = {}
    for key in {k for r in updates for k in r if k.startswith("fidelity/time_s/")}:
        phases[key.split("/")[-1]] = [sum(r.get(key, 0.0) for r in updates if r["iteration"] == i)
                                      for i in range(max(skip + 1, 2), last + 1)]
    return walls, phases


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--iterations", type=int, default=8)
    cli.add_argument("--warmup-scale", type=float, default=1.0)
    cli.add_argument("--cache-dir", default=None)
    cli.add_argument("--skip", type=int, default=2, help="first iterations left out of the means")
    flags = cli.parse_args()
    runs = {"none": dict(share="none"), "cross-fidelity, predictor on": dict(share="cross-fidelity"),
            "cross-fidelity, predictor off": dict(share="cross-fidelity", predictor=False)}
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for label, setting in runs.items():
            args = Args(pair=flags.pair, scale="tiny", iterations=flags.iterations, eval_every=10 ** 6,
                              eval_size=16, warmup_scale=flags.warmup_scale, cache_dir=flags.cache_dir,
                              runs_dir=tmp, name=label.replace(" ", "").replace(",", "-"), **setting)
            results[label] = per_iteration(train.main(args), flags.skip)
    base = statistics.mean(results["none"][0])
    print(f"\npair {flags.pair}, tiny preset, iterations {flags.skip + 1}..{flags.iterations} "
          f"(mean seconds per iteration, all receivers together)")
    print(f"{'run':<32}{'iteration':>10}{'curation':>10}{'share':>8}  " + "".join(f"{p:>11}" for p in PHASES))
    for label, (walls, phases) in results.items():
        wall = statistics.mean(walls)
        curation = statistics.mean(phases["curation"]) if "curation" in phases else 0.0
        cells = "".join(f"{statistics.mean(phases[p]):>11.3f}" if p in phases else f"{'—':>11}" for p in PHASES)
        print(f"{label:<32}{wall:>10.2f}{curation:>10.2f}{curation / wall:>8.1%}  {cells}")
    print(f"\niteration without curation: {base:.2f} s; the curation share is of the cross-fidelity iteration")


if __name__ == "__main__":
    main()
