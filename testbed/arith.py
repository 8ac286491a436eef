"""The embedded arithmetic task (DESIGN.md §5): generated multi-step word problems, their reference solutions in
three step formats, the outcome reward and the step verifier.

    question:  "Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?"
    line:      "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9"             one step per line (the default)
    inline:    "7 + 5 = 12; 12 - 3 = 9; Answer: 9"              the steps on one line
    prose:     "7 plus 5 is 12.Then 12 minus 3 is 9.Answer: 9"   sentences in words, run together

The formats decide where step boundaries fall against tokens (boundary_drift.py's TBD): no token of the Qwen2,
Llama-3 or Mistral vocabularies holds bytes after a newline or around "; ", so line and inline steps never share
a token, while Qwen2 and Llama-3 merge ".Then" and ".An" (a step's period with the next step's first letters) and
Mistral splits them. `answer_reward` is the outcome reward (1 for the right final answer, else 0) and
`step_verdicts` the step verifier (DESIGN.md §4.6, §4.9): a step is a piece of the completion (a line, a "; "
piece, a sentence), its span lives in characters of the completion, and a piece is a correct step, a wrong step,
or not a step at all; a step is checked by its arithmetic whichever way it is written. Neither raises on
malformed text: garbage, an empty completion or a missing answer scores 0. tasks.load_task("arith", ...) wraps
the task in the interface every task shares.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from testbed.verifiers import line_spans

NAMES = ("Ava", "Ben", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Max")
ITEMS = ("apples", "coins", "books", "cards", "shells", "stamps")
OP_PHRASES = {"+": "gets {b} more", "-": "gives away {b}", "*": "ends up with {b} times as many"}
ANSWER_PREFIX = "Answer:"
# A number of a step or an answer has at most MAX_DIGITS digits: a longer one makes the line not a step or not an
# answer. Without the bound, int() raises on completions with over 4,300 digits (Python's int-str limit), and
# the verifiers promise not to raise.
MAX_DIGITS = 100
NUMBER = rf"(-?[0-9]{{1,{MAX_DIGITS}}})"   # ASCII: int() would also read "٩" or "９"
STEP_RE = re.compile(rf"^\s*{NUMBER}\s*([+\-*])\s*{NUMBER}\s*=\s*{NUMBER}\s*\.?\s*$")   # a prose piece keeps its "."
OP_WORDS = {"+": "plus", "-": "minus", "*": "times"}
PROSE_STEP_RE = re.compile(rf"^\s*(?:Then )?{NUMBER} ({'|'.join(OP_WORDS.values())}) {NUMBER} is {NUMBER}\.\s*$")
ANSWER_RE = re.compile(rf"^\s*Answer:\s*{NUMBER}\s*$")
STEP_FORMATS = ("line", "inline", "prose")
PIECE_RE = {"inline": re.compile(r"[^;\n]+"), "prose": re.compile(r"[^.\n]+\.?")}
"""what one step (or the answer) of a completion is where steps are not lines"""


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
    step_format: str = "line"
    """how solutions write their steps (the module docstring): line, inline or prose"""

    def __post_init__(self):
        if self.step_format not in STEP_FORMATS:
            raise ValueError(f"step_format is one of {STEP_FORMATS}, got {self.step_format!r}")


@dataclass(frozen=True)
class Problem:
    question: str
    start: int
    steps: tuple[tuple[str, int], ...]  # (op, operand) applied in order to the running amount
    answer: int

    @property
    def numbers(self) -> set[int]:
        return {self.start, *(b for _, b in self.steps)}


def write_step(k: int, a: int, op: str, b: int, c: int, step_format: str) -> str:
    """Step k (from 0) of a solution, `a op b = c`, as `step_format` writes it."""
    if step_format == "prose":
        return f"{'Then ' if k else ''}{a} {OP_WORDS[op]} {b} is {c}."
    return f"{a} {op} {b} = {c}"


def solution(problem: Problem, step_format: str = "line", steps: int | None = None) -> str:
    """The reference solution in `step_format`; with `steps`, stopped after that many steps and answering with
    the last one's result."""
    written, value = [], problem.start
    for k, (op, b) in enumerate(problem.steps[:steps]):
        new = apply(op, value, b)
        written.append(write_step(k, value, op, b, new, step_format))
        value = new
    joiner = {"line": "\n", "inline": "; ", "prose": ""}[step_format]
    return joiner.join(written + [f"{ANSWER_PREFIX} {value}"])


def premature_solution(problem: Problem, step_format: str = "line") -> str:
    """The solution stopped after its first step, answering with that step's result: complete in form, every
    written step right, and (with two or more steps) a wrong final answer."""
    return solution(problem, step_format, steps=1)


def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def is_heldout(key: str, fraction: float) -> bool:
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
        if drawn is not None and is_heldout(drawn[0], cfg.heldout_fraction) == want_heldout:
            out.append(drawn[1])
    return out


def prompt_text(problem: Problem) -> str:
    """The task's plain prompt; policies.py wraps it in a chat template where the model has one."""
    return f"{problem.question}\n"


def step_spans(text: str, step_format: str = "line") -> list[tuple[int, int]]:
    """Character spans of the pieces of `text` that can be steps or the answer: its non-empty lines, or within
    lines its "; " pieces (inline) or sentences with their period (prose), surrounding spaces excluded."""
    if step_format == "line":
        return line_spans(text)
    spans = []
    for m in PIECE_RE[step_format].finditer(text):
        piece = m.group()
        if piece.strip():
            start = m.start() + len(piece) - len(piece.lstrip())
            spans.append((start, m.start() + len(piece.rstrip())))
    return spans


def parse_step(text: str) -> tuple[int, str, int, int] | None:
    """(a, op, b, c) of a step written `a op b = c` or in words `a plus b is c.`, else None."""
    m = STEP_RE.match(text)
    if m is not None:
        return int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    m = PROSE_STEP_RE.match(text)
    if m is not None:
        op = next(op for op, word in OP_WORDS.items() if word == m.group(2))
        return int(m.group(1)), op, int(m.group(3)), int(m.group(4))
    return None


def parse_answer(completion: str, step_format: str = "line") -> int | None:
    """The integer of the last `Answer:` piece, or None if the completion has none or that piece is malformed (an
    earlier answer does not stand in for it: hedging over several answers earns nothing)."""
    for start, end in reversed(step_spans(completion, step_format)):
        piece = completion[start:end]
        if piece.lstrip().startswith("Answer:"):      # a line step keeps its indent
            m = ANSWER_RE.match(piece)
            return int(m.group(1)) if m else None
    return None


def answer_reward(problem: Problem, completion: str, step_format: str = "line") -> float:
    """Outcome reward: 1.0 if the final answer is right, else 0.0 (malformed completions included)."""
    return float(parse_answer(completion, step_format) == problem.answer)


def step_verdicts(problem: Problem, completion: str, step_format: str = "line"
                  ) -> list[tuple[tuple[int, int], bool | None]]:
    """The step verifier: for each piece of `step_spans`, its character span and a verdict.

    True:  `a op b = c` holds and each operand is available, i.e. a number of the problem or the result of an
           earlier correct step (so the step follows from the problem, not just from arithmetic);
    False: the piece has the form of a step but the equation is wrong or uses a number from nowhere;
    None:  the piece is not a step (the answer, other words, garbage); it is not scored.
    """
    available, verdicts = set(problem.numbers), []
    for start, end in step_spans(completion, step_format):
        parsed = parse_step(completion[start:end])
        if parsed is None:
            verdicts.append(((start, end), None))
            continue
        a, op, b, c = parsed
        ok = apply(op, a, b) == c and a in available and b in available
        if ok:
            available.add(c)
        verdicts.append(((start, end), ok))
    return verdicts
