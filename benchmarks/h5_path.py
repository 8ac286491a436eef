"""H5's adaptive path (the proposal's §3, H5; results/preregistration-matrix.md, H5): adaptive cross-fidelity drawn
through the stability-support plane as (x, y) over its iterations in 4 windows of 25, x the peer experience it
received per iteration (`sharing/received`), y its training reward variance (analysis/curves.py) within the
window.

A run's summary keeps `sharing/received` only as its mean over the run, so each adaptive run's per-iteration values
are kept in a record beside its summary, written from the run's directory once it lands:

    python -m benchmarks.h5_path runs/matrix-cross-fidelity-adaptive-s1009 \\
        results/matrix/cross-fidelity-adaptive-s1009.json       # -> cross-fidelity-adaptive-s1009.received.json

The record is refused where the run's per-iteration training rewards are not the summary's: that run is not the one
summarized. analysis/h5.py reads the records and gives the path once every H5 seed has one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import eval as evaluation


def record_path(summary_path: Path) -> Path:
    """Where a summary's per-iteration record lies: beside it, CONFIG-sSEED.received.json."""
    return Path(summary_path).with_suffix(".received.json")


def received_record(run_dir: Path, summary: dict) -> dict:
    """The summarized run's `sharing/received` per iteration and policy, from its metrics.jsonl."""
    records = evaluation.load_metrics(run_dir)
    received = {}
    for policy, mine in summary["policies"].items():
        rewards = [v for _, v in evaluation.curve(records, policy, "charts/reward_mean")]
        if rewards != mine["reward_mean"]:
            raise ValueError(f"{run_dir}: {policy}'s training rewards are not those of the summary of "
                             f"{summary['configuration']}-s{summary['seed']}: it is not the run summarized")
        received[policy] = [v for _, v in evaluation.curve(records, policy, "sharing/received")]
        if len(received[policy]) != len(rewards):
            raise ValueError(f"{run_dir}: {policy} logged sharing/received at {len(received[policy])} of its "
                             f"{len(rewards)} iterations; the path needs one per iteration")
    return {"configuration": summary["configuration"], "seed": summary["seed"], "commits": summary["commits"],
            "received": received}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run's directory (its metrics.jsonl)")
    parser.add_argument("summary", type=Path, help="its summary, CONFIG-sSEED.json; the record is written beside it")
    args = parser.parse_args(argv)
    record = received_record(args.run_dir, json.loads(args.summary.read_text()))
    out = record_path(args.summary)
    out.write_text(json.dumps(record) + "\n")
    return out


if __name__ == "__main__":
    print(main())
