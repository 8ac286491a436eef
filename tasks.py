"""Task data, answer verifier and step verifier.

The embedded default task (DESIGN.md §5) is generated multi-step arithmetic word problems whose reference
solution is one checkable step per line and a final answer line:

    question:  "Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?"
    solution:  "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9"

`answer_reward` is the outcome reward (1 for the right final answer, else 0). `step_verdicts` is the step
verifier the process-reward issues build on (DESIGN.md §4.6, §4.9): a step is a line, its span lives in
characters of the completion, and a line is either a correct step, a wrong step, or not a step at all.
Neither function raises on malformed text: garbage, an empty completion or a missing answer scores 0.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

NAMES = ("Ava", "Ben", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Max")
ITEMS = ("apples", "coins", "books", "cards", "shells", "stamps")
OP_PHRASES = {"+": "gets {b} more", "-": "gives away {b}", "*": "ends up with {b} times as many"}
ANSWER_PREFIX = "Answer:"
STEP_RE = re.compile(r"^\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")
ANSWER_RE = re.compile(r"^\s*Answer:\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of the generated arithmetic task."""

    num_steps: int = 2
    """operations per problem, one solution line each"""
    max_operand: int = 20
    """operands are drawn from 1..max_operand (the starting amount too); the default keeps the problem space
    (about 32,000 computations at two steps) far larger than what warm-up and RL see, so a policy that scores on
    held-out problems has learned to add and subtract, not memorized answers"""
    ops: str = "+-"
    """operations to draw from, a subset of '+-*'"""
    heldout_fraction: float = 0.2
    """share of the problem space reserved for the held-out split (decided by a hash, so splits never overlap)"""


@dataclass(frozen=True)
class Problem:
    question: str
    start: int
    steps: tuple[tuple[str, int], ...]  # (op, operand) applied in order to the running amount
    answer: int

    @property
    def numbers(self) -> set[int]:
        return {self.start, *(b for _, b in self.steps)}

    @property
    def solution(self) -> str:
        lines, value = [], self.start
        for op, b in self.steps:
            new = apply(op, value, b)
            lines.append(f"{value} {op} {b} = {new}")
            value = new
        return "\n".join(lines + [f"{ANSWER_PREFIX} {value}"])


def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _is_heldout(key: str, fraction: float) -> bool:
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return digest / 0xFFFFFFFF < fraction


def _draw_problem(rng: random.Random, cfg: TaskConfig) -> tuple[str, Problem] | None:
    """One random problem, or None when the draw would take the amount below zero (the caller redraws)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = start = rng.randint(1, cfg.max_operand)
    steps = []
    for _ in range(cfg.num_steps):
        op, b = rng.choice(cfg.ops), rng.randint(1, cfg.max_operand)
        if op == "-" and b > value:
            return None
        steps.append((op, b))
        value = apply(op, value, b)
    pronoun = "She" if name in ("Ava", "Mia", "Zoe", "Ivy") else "He"
    sentences = [f"{name} has {start} {item}."]
    sentences += [f"{pronoun} {OP_PHRASES[op].format(b=b)}." for op, b in steps]
    sentences.append(f"How many {item} does {name} have now?")
    # the split key is the arithmetic alone, so a held-out computation never appears in training in other words
    key = f"{start}" + "".join(f"{op}{b}" for op, b in steps)
    return key, Problem(" ".join(sentences), start, tuple(steps), value)


def generate_problems(n: int, split: str, seed: int, cfg: TaskConfig = TaskConfig()) -> list[Problem]:
    """`n` problems of one split ("train" or "heldout"), deterministic in `seed`.

    The split is a property of the problem (a hash of its arithmetic), not of the draw order, so the train and
    held-out splits never share a computation whatever the seeds. Raises if the space is too small for `n`.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if not cfg.ops or set(cfg.ops) - set(OP_PHRASES):
        raise ValueError(f"ops must be a non-empty subset of '+-*', got {cfg.ops!r}")
    rng, out, tries = random.Random(f"{seed}/{split}"), [], 0
    want_heldout = split == "heldout"
    while len(out) < n:
        tries += 1
        if tries > 200 * n + 10_000:
            raise ValueError(f"could not draw {n} {split} problems from {cfg}; widen the task")
        drawn = _draw_problem(rng, cfg)
        if drawn is not None and _is_heldout(drawn[0], cfg.heldout_fraction) == want_heldout:
            out.append(drawn[1])
    return out


def prompt_text(problem: Problem) -> str:
    """The task's plain prompt; policies.py wraps it in a chat template where the model has one."""
    return f"{problem.question}\n"


def parse_answer(completion: str) -> int | None:
    """The integer on the last `Answer:` line, or None if the completion has none."""
    for line in reversed(completion.splitlines()):
        m = ANSWER_RE.match(line)
        if m:
            return int(m.group(1))
    return None


def answer_reward(completion: str, problem: Problem) -> float:
    """Outcome reward: 1.0 if the final answer is right, else 0.0 (malformed completions included)."""
    return float(parse_answer(completion) == problem.answer)


def line_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the non-empty lines of `text`, newlines excluded."""
    spans, start = [], 0
    for line in text.split("\n"):
        if line.strip():
            spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans


def step_verdicts(completion: str, problem: Problem) -> list[tuple[tuple[int, int], bool | None]]:
    """The step verifier: for each non-empty line, its character span and a verdict.

    True:  `a op b = c` holds and each operand is available, i.e. a number of the problem or the result of an
           earlier correct step (so the step follows from the problem, not just from arithmetic);
    False: the line has the form of a step but the equation is wrong or uses a number from nowhere;
    None:  the line is not a step (the answer line, prose, garbage); it is not scored.
    """
    available, verdicts = set(problem.numbers), []
    for start, end in line_spans(completion):
        m = STEP_RE.match(completion[start:end])
        if m is None:
            verdicts.append(((start, end), None))
            continue
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        ok = apply(op, a, b) == c and a in available and b in available
        if ok:
            available.add(c)
        verdicts.append(((start, end), ok))
    return verdicts
