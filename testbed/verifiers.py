"""Verifiers of the real benchmarks: final answers of math by math-verify, GSM8K's final answer and calculator
annotations by exact arithmetic, and code by the benchmark's own tests run in the sandbox (sandbox.py).

Every verifier takes (example, completion), never raises on a malformed completion (it scores 0, or a step is
None where it cannot be checked), and is the reward or step verifier a `tasks.Task` carries.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
import threading
from dataclasses import dataclass
from fractions import Fraction

from execution import sandbox


@dataclass(frozen=True)
class Example:
    """One item of a benchmark, in the columns every task shares."""

    id: str
    question: str
    """what the policy is asked: the body of the prompt"""
    reference: str
    """a reference solution in the form the prompt asks for (GSM8K: the annotated solution ending '#### 72';
    MATH: the solution with its \\boxed{}; code: a correct program; ProofNet: the informal proof)"""
    answer: str = ""
    """math: text whose final answer math-verify takes as the gold one; ProofNet: the formal Lean 3 statement"""
    tests: str = ""
    """code: the benchmark's trusted tests, which raise when the completion is wrong; they run in a judge process
    apart from the completion, calling it through `entry_points` (sandbox.py)"""
    code_prefix: str = ""
    """code: trusted code that both the completion and the tests come after (HumanEval's prompt with its helper
    functions, the imports of MBPP's solution and test setup), else empty"""
    entry_points: tuple[str, ...] = ()
    """code: the completion's functions the tests call"""
    test_setup: str = ""
    """code: trusted code that builds the tests' inputs, run after the completion in its sandbox (MBPP's
    test_setup_code, whose trees are of the program's own `Node` class); the tests see each name it binds as a
    handle they can pass into the completion's functions (sandbox.py)"""


def line_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the non-empty lines of `text`, newlines excluded."""
    spans, start = [], 0
    for line in text.split("\n"):
        if line.strip():
            spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans


GSM8K_MARK = "####"
MAX_NUMBER_DIGITS = 100   # int() refuses strings past 4300 digits, and no answer has a hundred
LEADING_NUMBER_RE = re.compile(rf"\s*\$?\s*([+-]?(?:\d[\d,]{{0,{MAX_NUMBER_DIGITS}}})?"
                               rf"(?:\.\d{{1,{MAX_NUMBER_DIGITS}}})?)(?<=\d)(?!\d|[,.]\d)")
ANNOTATION_RE = re.compile(r"<<([^<>=]*)=([^<>]*)>>(-?\d[\d,]*(?:\.\d+)?|-?\.\d+)?")
MAX_EXPRESSION_CHARS = 200
ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _math_timeout() -> int | None:
    # math-verify bounds its sympy work with SIGALRM, which only the main thread may set; elsewhere it runs unbounded
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=8192)
def _parsed_gold(gold: str) -> tuple:
    import math_verify  # sympy and the LaTeX parser take a quarter second to import; arithmetic runs need neither
    return tuple(math_verify.parse(gold, parsing_timeout=_math_timeout()))


def answers_match(gold: str, predicted: str) -> bool:
    """math-verify's verdict that the final answer in `predicted` equals the one in `gold`; never raises. Only a
    \\boxed{} answer or one after an anchor such as "final answer is" counts, so a solution is not rewarded for
    whatever number it happens to end on."""
    import math_verify
    extraction = [math_verify.LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),
                  math_verify.ExprExtractionConfig(try_extract_without_anchor=False)]
    target = math_verify.parse(predicted, extraction, parsing_timeout=_math_timeout())
    return bool(target) and math_verify.verify(list(_parsed_gold(gold)), target, timeout_seconds=_math_timeout())


def leading_number(text: str) -> Fraction | None:
    """The number that opens `text`, after spaces and a "$", its commas dropped (72, +72, 72.0, $72, 1,000, -.5);
    None where none does, or where it runs past MAX_NUMBER_DIGITS."""
    m = LEADING_NUMBER_RE.match(text)
    return Fraction(m.group(1).replace(",", "")) if m else None


def gsm8k_reward(example: Example, completion: str) -> float:
    """1.0 when the number opening the line of the last '####' is the reference answer ("#### 72 clips"); a hedge
    ("#### 71 or 72") is its first number."""
    _, mark, tail = completion.rpartition(GSM8K_MARK)
    answer = leading_number(tail.split("\n")[0]) if mark else None
    return float(answer is not None and answer == leading_number(example.answer))


def math_reward(example: Example, completion: str) -> float:
    """1.0 when the completion's boxed (or anchored) final answer equals the reference solution's \\boxed{}."""
    return float(answers_match(example.answer, completion))


def _exact_value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(repr(node.value))  # through the decimal text, so 0.1 is exactly 1/10
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _exact_value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_exact_value(node.left), _exact_value(node.right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _exact_value(node.left), _exact_value(node.right)
        size_bits = max(abs(base.numerator), base.denominator).bit_length() * abs(exponent)
        if exponent.denominator != 1 or size_bits > 4096:  # bounds the work: (9**64)**64**64 would not end
            raise ValueError("only whole powers of moderate size are checked")
        return base ** int(exponent)
    raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")


def evaluate(expression: str) -> Fraction | None:
    """The exact value of numbers joined by + - * / ** and parentheses (commas in numbers allowed), else None."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        return _exact_value(ast.parse(expression.replace(",", "").strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def _number(text: str) -> Fraction | None:
    # an exponent would have Fraction build 10**exponent exactly: a result of "1e999999999" takes hours
    if len(text) > MAX_EXPRESSION_CHARS or "e" in text.lower():
        return None
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def annotation_verdict(expression: str, result: str, shown: str | None) -> bool | None:
    """Whether `<<expression=result>>shown` holds; None where the expression or result is not plain arithmetic.

    GSM8K writes inexact results rounded or cut to the digits shown (<<10/3=3.33>>, <<-2/3=-0.66>>), so a result
    with d decimals is correct when it is the exact value, or that value rounded or cut toward 0 to d decimals; the
    number shown after the annotation, where there is one, must equal the result."""
    value, claimed = evaluate(expression), _number(result)
    if value is None or claimed is None:
        return None
    if shown is not None and _number(shown) != claimed:
        return False
    scale = 10 ** len(result.strip().partition(".")[2])
    half = Fraction(1, 2)
    return claimed == value or claimed * scale in (math.trunc(value * scale), math.floor(value * scale + half),
                                                   math.ceil(value * scale - half))


def _line_verdict(line: str) -> bool | None:
    checked = [v for m in ANNOTATION_RE.finditer(line) if (v := annotation_verdict(*m.groups())) is not None]
    return all(checked) if checked else None


def gsm8k_step_verdicts(example: Example, completion: str) -> list[bool | None]:
    """Per line: False if any annotation on it is wrong, True if one is checked and none wrong, else None."""
    return [_line_verdict(completion[start:end]) for start, end in line_spans(completion)]


FENCE_RE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\r?\n(.*?)(?:```|\Z)", re.S)   # the budget may cut its close


def code_reward(example: Example, completion: str, timeout_s: float = 5.0) -> float:
    """1.0 when the completion (the first fenced block if it has one) passes the example's tests: the completion
    runs in one sandbox, the tests in another, and only plain literals and handles cross between them
    (sandbox.py)."""
    fenced = FENCE_RE.search(completion)
    code = fenced.group(1) if fenced else completion
    return float(sandbox.judge(f"{example.code_prefix}{code}", example.tests, example.entry_points,
                               trusted_prefix=example.code_prefix, test_setup=example.test_setup,
                               timeout_s=timeout_s).passed)


def no_reward(example: Example, completion: str) -> float:
    """ProofNet's: a proof is only checked by Lean, which this project does not run."""
    return 0.0


def unchecked_steps(example: Example, completion: str) -> list[None]:
    return [None] * len(line_spans(completion))
