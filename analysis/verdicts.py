"""The reporting rule (results/reporting-rule.md): a verdict word is reported only where the registered call and
the reading valid at its n both give it.

A call is a tuple of labels, one per part of its rule (a Holm label and a 2-point-margin label, say), None where
that part says nothing; each analysis formats its own tuples. The reported call keeps each label both readings
give, and names the registered call beside it wherever it drops one.
"""

from __future__ import annotations

from collections.abc import Callable

Labels = tuple[str | None, ...]


def reported(registered: Labels, at_n: Labels, text: Callable[[Labels], str]) -> str:
    """The call the rule reports: the labels both readings give, as `text` formats them (every label dropped reads
    as not resolved there), with "(registered: ...)" beside it wherever the registered call said more or else."""
    if len(registered) != len(at_n):
        raise ValueError(f"a call of {len(registered)} parts read against one of {len(at_n)}")
    kept = tuple(a if a == b else None for a, b in zip(registered, at_n))
    return text(kept) if kept == registered else f"{text(kept)} (registered: {text(registered)})"
