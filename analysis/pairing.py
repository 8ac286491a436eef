"""Which runs of one seed are paired: those that started from the same weights (results/preregistration-repair.md).

A tiny policy's warm-up is cached per machine, and another machine's CPU kernels warm it up to other weights, so
two runs of one seed are not a pair unless they began from the same policies. A run's summary records the
fingerprint of every policy's weights as training started (testbed/checkpoint.py, record_sitting); a summary
written before that records none, and its iteration-0 held-out accuracies stand in for them. Every contrast of
the analysis reads only the seeds whose two runs are paired, and names the others with the starts that part them;
where a registration owes a fresh seed for each unpaired one, `with_fresh_seeds` finds the seeds to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

Why = TypeVar("Why")


def start_of(summary: dict) -> tuple[str, dict[str, str | float | None]]:
    """What a run started from, as its summary says: ("weights", each policy's weight fingerprint), or, for a
    summary written before fingerprints were recorded, ("iteration-0 accuracy", each policy's held-out accuracy
    at iteration 0; None where the run was not evaluated there)."""
    if summary.get("start_fingerprints"):
        return "weights", dict(sorted(summary["start_fingerprints"].items()))
    return "iteration-0 accuracy", {policy: (m["heldout"][0][1] if m["heldout"] and m["heldout"][0][0] == 0 else None)
                                    for policy, m in sorted(summary["policies"].items())}


def unpaired_reason(a: dict, b: dict) -> str | None:
    """None where two runs of one seed started from the same policies (results/preregistration-repair.md): equal
    weight fingerprints where both summaries record them, else equal iteration-0 held-out accuracies, every one
    known; else their two starts, as the tables name them."""
    (kind_a, start_a), (kind_b, start_b) = start_of(a), start_of(b)
    if kind_a != kind_b:   # one summary without fingerprints: compare what both record
        (kind_a, start_a), (kind_b, start_b) = (start_of({**s, "start_fingerprints": None}) for s in (a, b))
    if start_a == start_b and None not in start_a.values():
        return None

    def spelled(start: dict) -> str:
        return ", ".join(f"{policy} {'not evaluated' if value is None else value}" for policy, value in start.items())
    return f"{kind_a}: {a['configuration']} ({spelled(start_a)}), {b['configuration']} ({spelled(start_b)})"


def paired_seeds(a: dict[int, dict], b: dict[int, dict], by_start: bool) -> list[int]:
    """The seeds both configurations ran (a, b: seed -> summary) whose two runs are paired (`unpaired_reason`);
    every seed both ran where not `by_start`."""
    return [s for s in sorted(set(a) & set(b)) if not by_start or unpaired_reason(a[s], b[s]) is None]


def unpaired_seeds(a: dict[int, dict], b: dict[int, dict]) -> dict[int, str]:
    """seed -> why its runs of the two configurations are not paired, over the seeds both ran."""
    reasons = {s: unpaired_reason(a[s], b[s]) for s in sorted(set(a) & set(b))}
    return {s: why for s, why in reasons.items() if why is not None}


def with_fresh_seeds(registered: Iterable[int], unpaired: Callable[[int], Why | None]
                     ) -> tuple[list[int], dict[int, Why]]:
    """The seeds an analysis reads where each unpaired seed owes the next fresh seed, run in full and read in turn
    (so a fresh seed found unpaired owes another): the registered seeds and those owed so far; and seed -> what
    parts its runs, for each unpaired one. `unpaired(seed)` is None until every run of the seed is in (it owes
    nothing yet), else what parts its runs, empty where nothing does."""
    seeds, reasons = list(registered), {}
    for seed in seeds:                       # grows by a fresh seed for each unpaired one
        if why := unpaired(seed):
            reasons[seed] = why
            seeds.append(seeds[-1] + 1)
    return seeds, reasons
