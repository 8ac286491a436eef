"""A run's metric lines: metrics.jsonl, and with --tensorboard the same values as TensorBoard event files.

metrics.jsonl holds one JSON line per policy and iteration (training, then evaluation lines), under stable names
(charts/, losses/, sharing/, fidelity/, eval/, perf/); it is the source of truth that eval.py and a resume read.
With --tensorboard every metric of every line is also written as a scalar under the same name, its step the
iteration, into runs/NAME/tensorboard/POLICY: one folder per policy, so that `tensorboard --logdir runs` draws
each policy of each run as its own curve on the same charts. A resumed run purges the events after its checkpoint,
as it drops those lines of metrics.jsonl. Events reach the disk within FLUSH_S seconds and when the run ends.
"""

from __future__ import annotations

import json
from pathlib import Path


FLUSH_S = 10
"""seconds between flushes of the TensorBoard event files, so the curves stay live"""


def is_clock(key: str) -> bool:
    """Whether a metric is a wall-clock value (the elapsed time, a phase's seconds, a speed): the one part of a
    line that a rerun, a resume or an equivalent commit does not reproduce."""
    return key == "time_s" or key.startswith("fidelity/time_s/") or (key.startswith("perf/") and key.endswith("_s"))


def timeless(record: dict) -> dict:
    """A metric line without its wall-clock values."""
    return {k: v for k, v in record.items() if not is_clock(k)}


def append_line(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


class MetricsLog:
    """metrics.jsonl of `run_dir`, and its TensorBoard events when `tensorboard`; `resumed_at` is the checkpoint's
    iteration a resumed run continues from (0 for a fresh run)."""

    def __init__(self, run_dir: Path, tensorboard: bool, resumed_at: int = 0):
        self.path = run_dir / "metrics.jsonl"
        self.board = run_dir / "tensorboard" if tensorboard else None
        self.resumed_at = resumed_at
        self.writers: dict = {}

    def write(self, record: dict) -> None:
        append_line(self.path, record)
        if self.board is None:
            return
        writer = self.writer(record["policy"])
        for name, value in record.items():
            if "/" in name:
                writer.add_scalar(name, value, record["iteration"])

    def writer(self, policy: str):
        if policy not in self.writers:
            from tensorboardX import SummaryWriter   # only a run with --tensorboard needs it
            self.writers[policy] = SummaryWriter(str(self.board / policy), flush_secs=FLUSH_S,
                                                 purge_step=self.resumed_at + 1 if self.resumed_at else None)
        return self.writers[policy]

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
