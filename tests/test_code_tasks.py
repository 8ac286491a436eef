"""The code tasks: MBPP on fixture files in its three layouts (the hub's configurations, the original release, the
sanitized JSON), HumanEval from its package; references pass, wrong and hostile code fails."""

import json
import time

from testbed import tasks, verifiers
from test_benchmarks import MBPP_TEST, data, load, write_jsonl, write_parquet  # noqa: F401


# ---- MBPP ----

def test_mbpp_references_pass_and_wrong_code_fails(data):
    task = load("mbpp", data)
    assert sorted(e.id for e in task.train) == ["2", "3", "4"] and [e.id for e in task.heldout] == ["11"]
    for example in task.train + task.heldout:
        assert task.reward(example, example.reference) == 1.0
        assert "assert " in task.prompt(example)
        assert task.reward(example, "def nothing():\n    pass") == 0.0
    is_not_prime = next(e for e in task.train if e.id == "3")
    assert task.reward(is_not_prime, "def is_not_prime(n):\n    return n % 2 == 0") == 0.0   # wrong on 35
    assert task.reward(is_not_prime, "```python\n" + is_not_prime.reference + "\n```\nThis works.") == 1.0
    # a fence with Windows line ends, a space before its language, or cut off by the token budget before its close
    code = is_not_prime.reference
    for fenced in ("```python\r\n" + code.replace("\n", "\r\n") + "\r\n```", "``` python\n" + code + "\n```",
                   "Here:\n```python\n" + code + "\n"):
        assert task.reward(is_not_prime, fenced) == 1.0
    add_k = task.heldout[0]
    assert task.reward(add_k, "def add_k(n):\n    return n + 3") == 1.0   # the setup code defines K too


def test_code_rewards_survive_hostile_completions(data):
    example = load("mbpp", data).train[0]
    start = time.monotonic()
    for completion in ("import os\nos._exit(0)", "import os\nwhile True: os.fork()", "while True: pass",
                       "def similar_elements(a, b):\n    open('/tmp/mbpp-escape', 'w')\n    return ()"):
        assert verifiers.code_reward(example, completion, timeout_s=1.0) == 0.0
    assert time.monotonic() - start < 4 * 1.0 + 8


# Rows of MBPP's sanitized configuration (its own columns: the task is in `prompt`, imports in `test_imports`).
MBPP_SANITIZED = [
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 602,
     "prompt": "Write a python function to find the first repeated character in a given string.",
     "code": "def first_repeated_char(str1):\n  for index,c in enumerate(str1):\n"
             "    if str1[:index+1].count(c) > 1:\n      return c\n  return None",
     "test_imports": [], "test_list": ["assert first_repeated_char(\"abcabc\") == \"a\"",
                                       "assert first_repeated_char(\"abc\") == None"]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 14,
     "prompt": "Write a python function to find the volume of a triangular prism.",
     "code": "def find_Volume(l,b,h) :\n    return ((l * b * h) / 2)",
     "test_imports": ["import math"], "test_list": ["assert math.isclose(find_Volume(10,8,6), 240)"]},
]
WRONG_CODE = "def first_repeated_char(s):\n    return s[0]\n\ndef find_Volume(l, b, h):\n    return l * b * h"


def assert_mbpp_scores(task, train_ids, heldout_ids):
    assert [e.id for e in task.train] == train_ids and [e.id for e in task.heldout] == heldout_ids
    for example in task.train + task.heldout:
        assert task.reward(example, example.reference) == 1.0
        assert task.reward(example, WRONG_CODE) == 0.0


def test_mbpp_sanitized_configuration_reads_its_own_columns(tmp_path):
    write_parquet(tmp_path / "sanitized/train-00000-of-00001.parquet", MBPP_SANITIZED[:1])
    write_parquet(tmp_path / "sanitized/test-00000-of-00001.parquet", MBPP_SANITIZED[1:])
    write_parquet(tmp_path / "sanitized/prompt-00000-of-00001.parquet", [dict(MBPP_SANITIZED[0], task_id=2)])
    task = tasks.load_task("mbpp", 0, 10, 10, data_dir=str(tmp_path))
    assert_mbpp_scores(task, ["602"], ["14"])
    assert task.prompt(task.heldout[0]).startswith("Write a python function to find the volume")


def test_mbpp_original_files_are_split_by_task_id(tmp_path):
    # the release's ranges: 1-10 prompt, 11-510 test, 511-600 validation, 601-974 train
    full = [{"text": r["prompt"], "code": r["code"], "task_id": r["task_id"], "test_list": r["test_list"],
             "test_setup_code": "\n".join(r["test_imports"]), "challenge_test_list": []} for r in MBPP_SANITIZED]
    unused = [dict(full[0], task_id=i) for i in (1, 10, 511, 600)]
    write_jsonl(tmp_path / "original/mbpp.jsonl", full + unused)
    assert_mbpp_scores(tasks.load_task("mbpp", 0, 10, 10, data_dir=str(tmp_path / "original")), ["602"], ["14"])
    sanitized = tmp_path / "sanitized"   # sanitized-mbpp.json is one JSON array
    sanitized.mkdir()
    (sanitized / "sanitized-mbpp.json").write_text(json.dumps(MBPP_SANITIZED + [dict(MBPP_SANITIZED[0], task_id=5)]))
    assert_mbpp_scores(tasks.load_task("mbpp", 0, 10, 10, data_dir=str(sanitized)), ["602"], ["14"])
    assert tasks.mbpp_split({"task_id": 510}) == "test" and tasks.mbpp_split({"task_id": 601}) == "train"


# ---- HumanEval ----

def humaneval():
    return tasks.load_task("humaneval", 0, 1000, 1000)


def rewards(task, pairs):
    """Judged as training judges them: tasks.rewards, several programs at a time."""
    return tasks.rewards(task, [e for e, _ in pairs], [c for _, c in pairs]).tolist()


def test_humaneval_comes_from_the_package_split_by_task_id():
    task = humaneval()
    train, heldout = {e.id for e in task.train}, {e.id for e in task.heldout}
    assert not train & heldout and train | heldout == {f"HumanEval/{i}" for i in range(164)}
    assert 0.1 < len(heldout) / 164 < 0.3                       # the default held-out fraction is 0.2
    assert {e.id for e in tasks.load_task("humaneval", 5, 1000, 1000).heldout} == heldout   # not the seed's
    example = task.train[0]
    assert task.prompt(example) == example.question and "def " in example.question


def test_humaneval_canonical_solutions_all_pass():
    task = humaneval()
    examples = task.train + task.heldout
    assert rewards(task, [(e, e.reference) for e in examples]) == [1.0] * 164


def test_humaneval_broken_solutions_all_fail():
    task = humaneval()
    examples = task.train + task.heldout
    assert rewards(task, [(e, "    return None\n") for e in examples]) == [0.0] * 164
    # each problem answered with the next problem's solution: real code, the wrong function
    assert rewards(task, [(e, other.reference) for e, other in zip(examples, examples[1:] + examples[:1])]) == \
        [0.0] * 164




def test_mbpp_asserts_run_apart_from_the_solution_and_see_the_modules_it_imports(tmp_path):
    # MBPP's asserts may use a module only the solution imports (math.isclose); the judge imports it too
    row = {"task_id": 17, "text": "Write a function to find the volume of a sphere.",
           "code": "import math\r\ndef volume_sphere(r):\r\n  return (4/3)*math.pi*r*r*r",
           "test_list": ["assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)"],
           "test_setup_code": "", "challenge_test_list": []}
    write_jsonl(tmp_path / "train.jsonl", [row])
    write_jsonl(tmp_path / "test.jsonl", MBPP_TEST)
    task = tasks.load_task("mbpp", 0, 1, 1, data_dir=str(tmp_path))
    example = task.train[0]
    assert example.entry_points == ("volume_sphere",) and "volume_sphere" not in example.code_prefix
    assert task.reward(example, example.reference) == 1.0
    assert task.reward(example, "def volume_sphere(r):\n    return 4188.79") == 1.0  # math comes from the judge
    assert task.reward(example, "def volume_sphere(r):\n    return r") == 0.0
    always_equal = ("class Close(float):\n    def __eq__(s, o):\n        return True\n"
                    "def volume_sphere(r):\n    return Close(1)")
    assert task.reward(example, always_equal) == 0.0
