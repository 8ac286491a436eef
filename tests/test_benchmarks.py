"""The benchmark tasks on fixture files written in the real data sets' formats: GSM8K, MATH, ProofNet, arith through
the same interface, and what every task must survive. The code tasks (MBPP, HumanEval) are tests/test_code_tasks.py's;
how the sources fail (a partial copy, the hub unreachable) tests/test_data.py's."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pyarrow
import pyarrow.parquet
import pytest

from testbed import arith, tasks, verifiers

# Three records of openai/gsm8k (main, train), verbatim.
GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
               "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
               "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
    {"question": "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she "
                 "needs. Her parents decided to give her $15 for that purpose, and her grandparents twice as much "
                 "as her parents. How much more money does Betty need to buy the wallet?",
     "answer": "In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\n"
               "Betty's grandparents gave her 15 * 2 = $<<15*2=30>>30.\n"
               "This means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5"},
]
GSM8K_TEST = [{"question": "Janet has 3 boxes of 4 pens. How many pens does she have?",
               "answer": "Janet has 3*4 = <<3*4=12>>12 pens.\n#### 12"}]

# Records in the columns of EleutherAI/hendrycks_math.
MATH = [
    {"problem": "What is the value of $\\frac{1}{2} + \\frac{1}{3}$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "We have $\\frac{1}{2} + \\frac{1}{3} = \\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$."},
    {"problem": "Solve for $x$: $2x + 3 = 11$.", "level": "Level 1", "type": "Algebra",
     "solution": "Subtracting 3 gives $2x = 8$,\nso $x = \\boxed{4}$."},
    {"problem": "In how many ways can 2 of 4 books be chosen?", "level": "Level 1", "type": "Counting & Probability",
     "solution": "$\\binom{4}{2} = \\boxed{6}$."},
    {"problem": "What is the area of a square of side 3?", "level": "Level 1", "type": "Geometry",
     "solution": "The area is $3^2 = \\boxed{9}$."},
    {"problem": "Find the sum of the roots of $x^2 - 5x + 6 = 0$.", "level": "Level 2", "type": "Intermediate Algebra",
     "solution": "By Vieta, the sum is $\\boxed{5}$."},
    {"problem": "What is the remainder of 17 divided by 5?", "level": "Level 1", "type": "Number Theory",
     "solution": "$17 = 3 \\cdot 5 + 2$, so the remainder is $\\boxed{2}$."},
    {"problem": "Compute $\\cos 0$.", "level": "Level 1", "type": "Precalculus",
     "solution": "$\\cos 0 = \\boxed{1}$."},
]
MATH_TEST = [{"problem": "Compute $\\sqrt{16}$.", "level": "Level 1", "type": "Prealgebra",
              "solution": "$\\sqrt{16} = \\boxed{4}$."}]

# Three records of google-research-datasets/mbpp (full), verbatim apart from the challenge tests.
MBPP = [
    {"task_id": 2, "text": "Write a function to find the similar elements from the given two tuple lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n"
             "  return (res) ",
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 3, "text": "Write a python function to identify non-prime numbers.",
     "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n"
             "    for i in range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            result = True\r\n"
             "    return result",
     "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                   "assert is_not_prime(35) == True"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 4, "text": "Write a function to find the largest integers from a given list of numbers using heap "
                           "queue algorithm.",
     "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = hq.nlargest(n, nums)\r\n"
             "  return largest_nums",
     "test_list": ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]"],
     "test_setup_code": "", "challenge_test_list": []},
]
MBPP_TEST = [{"task_id": 11, "text": "Write a python function to add a constant to a number.",
              "code": "def add_k(n):\n    return n + K", "test_list": ["assert add_k(1) == 4"],
              "test_setup_code": "K = 3", "challenge_test_list": []}]

# Records in the columns of hoskinson-center/proofnet (valid.jsonl / test.jsonl).
PROOFNET = [{"id": "Rudin|exercise_1_1a",
             "nl_statement": "If $r$ is rational $(r \\neq 0)$ and $x$ is irrational, prove that $r+x$ is irrational.",
             "nl_proof": "\\begin{proof}\nIf $r$ and $r+x$ were both rational, then $x=r+x-r$ would also be "
                         "rational.\n\\end{proof}",
             "formal_statement": "theorem exercise_1_1a\n  (x : ℝ) (y : ℚ) :\n"
                                 "  ( irrational x ) -> irrational ( x + y ) :=",
             "src_header": "import .common\n\nopen real complex\n"}]


def math_subject(row):
    """The folder of a MATH row's subject: "Counting & Probability" lies in counting_and_probability/."""
    return row["type"].lower().replace(" & ", "_and_").replace(" ", "_")


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)


@pytest.fixture
def data(tmp_path):
    """Local copies laid out as the hub repositories are (parquet per configuration) and as plain jsonl."""
    write_parquet(tmp_path / "gsm8k/main/train-00000-of-00001.parquet", GSM8K)
    write_parquet(tmp_path / "gsm8k/main/test-00000-of-00001.parquet", GSM8K_TEST)
    socratic = [{"question": "Not from main?", "answer": "#### 0"}]  # another configuration: never read
    write_parquet(tmp_path / "gsm8k/socratic/train-00000-of-00001.parquet", socratic)
    for subject in tasks.MATH_SUBJECTS:  # one folder per subject, as in EleutherAI/hendrycks_math
        for split, rows in (("train", MATH), ("test", MATH_TEST)):
            write_parquet(tmp_path / f"math/{subject}/{split}-00000-of-00001.parquet",
                          [r for r in rows if math_subject(r) == subject] or MATH_TEST)
    write_parquet(tmp_path / "mbpp/full/train-00000-of-00001.parquet", MBPP)
    write_parquet(tmp_path / "mbpp/full/test-00000-of-00001.parquet", MBPP_TEST)
    write_jsonl(tmp_path / "proofnet/valid.jsonl", PROOFNET)
    write_jsonl(tmp_path / "proofnet/test.jsonl", PROOFNET)
    (tmp_path / "proofnet/test_loader.py").write_text("raise SystemExit")  # the hub repo has one: not data
    return tmp_path


def load(name, data, train_size=100, eval_size=100, seed=0):
    return tasks.load_task(name, seed, train_size, eval_size, data_dir=str(data / name))


# ---- GSM8K ----

def test_gsm8k_loads_the_main_configuration_and_samples_by_seed(data):
    task = load("gsm8k", data)
    assert sorted(e.question for e in task.train) == sorted(r["question"] for r in GSM8K)
    assert [e.answer for e in task.heldout] == ["12"]
    small = [load("gsm8k", data, train_size=2, seed=s).train for s in range(8)]
    assert all(len(t) == 2 for t in small) and small[0] == load("gsm8k", data, train_size=2, seed=0).train
    assert len({tuple(e.id for e in t) for t in small}) > 1
    assert task.prompt(task.heldout[0]).startswith(GSM8K_TEST[0]["question"] + "\n")


def test_gsm8k_loads_plain_jsonl_as_in_its_github_repository(tmp_path):
    # a clone of openai/grade-school-math: the socratic files and model solutions are other data, never read
    data = tmp_path / "grade_school_math/data"
    write_jsonl(data / "train.jsonl", GSM8K)
    write_jsonl(data / "test.jsonl", GSM8K_TEST)
    socratic = [dict(r, answer="How many? ** " + r["answer"]) for r in GSM8K]
    write_jsonl(data / "train_socratic.jsonl", socratic)
    write_jsonl(data / "test_socratic.jsonl", socratic[:1])
    write_jsonl(data / "example_model_solutions.jsonl", [{"question": GSM8K[0]["question"], "175b_verification": ""}])
    task = tasks.load_task("gsm8k", 0, 10, 10, data_dir=str(tmp_path))
    assert sorted(e.reference for e in task.train) == sorted(r["answer"] for r in GSM8K)
    assert [e.answer for e in task.heldout] == ["12"]
    for example in task.train + task.heldout:
        assert task.reward(example, example.reference) == 1.0
        assert task.reward(example, "#### 7") == 0.0


def test_gsm8k_loads_from_the_hugging_face_cache_without_the_hub(tmp_path, monkeypatch):
    from huggingface_hub import constants
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "datasets--openai--gsm8k"                  # the cache layout huggingface_hub writes
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text(commit)
    write_parquet(repo / f"snapshots/{commit}/main/train-00000-of-00001.parquet", GSM8K)
    write_parquet(repo / f"snapshots/{commit}/main/test-00000-of-00001.parquet", GSM8K_TEST)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    task = tasks.load_task("gsm8k", 0, 10, 10)
    assert len(task.train) == 3 and [e.answer for e in task.heldout] == ["12"]


def test_math_rewards_from_a_worker_thread_match_the_main_thread(data):
    # off the main thread math-verify cannot use its SIGALRM timeout; the verdicts must not change
    task = load("math", data)
    wrong = "so the final answer is $\\boxed{123456789}$."
    cases = [(e, c) for e in task.train for c in (e.reference, wrong)]
    expected = [float(c == e.reference) for e, c in cases]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda case: task.reward(*case), cases)) == expected
    assert [task.reward(*case) for case in cases] == expected


@pytest.mark.parametrize("completion, reward", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", 1.0),
    ("#### 72", 1.0), ("#### 72.0", 1.0), ("#### $72", 1.0), ("#### 72 clips", 1.0), ("#### 5\n#### 72", 1.0),
    ("#### 71", 0.0), ("#### 72\n#### 71", 0.0), ("72", 0.0), ("The answer is 72.", 0.0), ("#### seventy-two", 0.0),
    ("", 0.0), ("####", 0.0), ("\x00\ud800 ####\n72", 0.0),
    # the number that opens the line decides: what follows it does not, nor does a hedge's second number
    ("#### 72 (3 dozen more than 36)", 1.0), ("#### +72.", 1.0), ("#### 72, the clips", 1.0),
    ("#### 71 or 72", 0.0), ("#### 71 72", 0.0), ("#### 72.5", 0.0),
    ("#### 72" + "0" * 200, 0.0), ("#### 72." + "0" * 200, 0.0),
])
def test_gsm8k_reward(data, completion, reward):
    task = load("gsm8k", data)
    natalia = next(e for e in task.train if e.question.startswith("Natalia"))
    assert task.reward(natalia, completion) == reward


def test_gsm8k_step_verifier_accepts_the_real_annotations(data):
    task = load("gsm8k", data)
    for example in task.train:
        lines = example.reference.split("\n")
        assert task.step_verdicts(example, example.reference) == [True] * (len(lines) - 1) + [None]
        assert task.reward(example, example.reference) == 1.0


def altered(solution: str):
    """Every single-number alteration of every annotation: (line index, altered solution)."""
    for match in re.finditer(r"<<([^=]*)=([^>]*)>>(\d+(?:\.\d+)?)", solution):
        line = solution[:match.start()].count("\n")
        expression, result, shown = match.groups()
        wrong = str(float(result) + 1).removesuffix(".0")
        for replacement in (f"<<{expression}={wrong}>>{wrong}",                  # result and text both wrong
                            f"<<{expression}={result}>>{wrong}",                 # text disagrees with the result
                            f"<<{expression}+1={result}>>{shown}"):              # expression changed
            yield line, solution[:match.start()] + replacement + solution[match.end():]


def test_gsm8k_step_verifier_catches_every_altered_annotation(data):
    task = load("gsm8k", data)
    count = 0
    for example in task.train:
        correct = task.step_verdicts(example, example.reference)
        for line, solution in altered(example.reference):
            expected = correct[:line] + [False] + correct[line + 1:]
            assert task.step_verdicts(example, solution) == expected, solution
            count += 1
    assert count == 3 * 7


@pytest.mark.parametrize("expression, result, shown, verdict", [
    ("10/3", "3.33", "3.33", True), ("10/3", "3.3", None, True), ("10/3", "3", "3", True),   # rounded or cut
    ("2/3", "0.67", None, True), ("2/3", "0.66", None, True), ("2/3", "0.68", None, False),
    ("-2/3", "-0.67", None, True), ("-2/3", "-0.66", None, True), ("-2/3", "-0.65", None, False),   # cut toward 0
    ("-2/3", "-0.68", None, False), ("1/2", "1/2", None, True), ("1/3", "1/2", None, False),        # exact
    ("7*1.5", "10.5", None, True), ("7*1.5", "10", None, True), ("7*1.5", "11", None, True),
    ("7*1.5", "12", None, False), ("2**10", "1024", None, True), ("(2+3)*4", "20", "20", True),
    ("1,000*2", "2,000", "2,000", True), ("-3+1", "-2", None, True), ("5/0", "1", None, None),
    ("5%2", "1", None, None), ("2^3", "8", None, None), ("x*2", "4", None, None), ("2*3", "six", None, None),
    ("(9**64)**64**64", "1", None, None), ("9" * 300, "1", None, None),
    ("2", "1e999999999", None, None), ("2000", "2E3", None, None),    # an exponent, not plain arithmetic (nor work)
])
def test_annotation_verdicts_by_hand(expression, result, shown, verdict):
    assert verifiers.annotation_verdict(expression, result, shown) == verdict


def test_gsm8k_lines_without_annotations_are_not_steps():
    completion = "First, 3 times 4 is 12.\n\n3*4 = <<3*4=12>>12 and <<12+1=14>>14\n<<1+1=2>>2 and <<a=b>>\n#### 12"
    assert verifiers.gsm8k_step_verdicts(None, completion) == [None, False, True, None]


# ---- MATH ----

@pytest.mark.parametrize("completion, reward", [
    ("$\\frac{1}{2}+\\frac{1}{3} = \\boxed{\\frac{5}{6}}$", 1.0), ("\\boxed{\\dfrac56}", 1.0),
    ("\\boxed{5/6}", 1.0), ("The final answer is $\\frac{5}{6}$.", 1.0),
    ("\\boxed{0.8333}", 0.0), ("\\boxed{\\frac{6}{5}}", 0.0), ("5/6", 0.0), ("so it is 5/6", 0.0),
    ("\\boxed{\\frac{5}{6}} or maybe \\boxed{1}", 0.0), ("", 0.0), ("\\boxed{", 0.0), ("}}}\\boxed{{{", 0.0),
])
def test_math_reward(data, completion, reward):
    task = load("math", data)
    example = next(e for e in task.train if "frac{1}{2}" in e.question)
    assert task.reward(example, completion) == reward


def test_math_loads_every_subject_and_its_references_verify(data):
    task = load("math", data)
    assert len(task.train) == 7 and len(task.heldout) == 7   # the one test problem stands in for every subject
    for example in task.train + task.heldout:
        assert task.reward(example, example.reference) == 1.0
        assert task.prompt(example).endswith("\\boxed{}.\n")
    two_lines = next(e for e in task.train if "2x" in e.question).reference
    assert task.step_spans(two_lines) == [(0, 29), (30, 49)]
    assert task.step_verdicts(task.train[0], two_lines) == [None, None]


def test_math_original_release_one_json_per_problem(tmp_path):
    for split, rows in (("train", MATH), ("test", MATH_TEST * 7)):
        for i, row in enumerate(rows):
            subject = math_subject(row) if split == "train" else tasks.MATH_SUBJECTS[i]
            path = tmp_path / f"MATH/{split}/{subject}/{i + 1}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(row))
    task = tasks.load_task("math", 0, 100, 100, data_dir=str(tmp_path / "MATH"))
    assert sorted(e.question for e in task.train) == sorted(r["problem"] for r in MATH) and len(task.heldout) == 7
    for example in task.train:
        assert task.reward(example, example.reference) == 1.0
        assert task.reward(example, "The answer is \\boxed{123}.") == 0.0


# ---- ProofNet ----

def test_proofnet_has_no_checker_and_says_so(data):
    task = load("proofnet", data)
    example = task.train[0]
    assert not task.verifiable and example.id == "Rudin|exercise_1_1a" and example.answer.startswith("theorem")
    assert task.reward(example, example.reference) == 0.0
    assert task.step_verdicts(example, example.reference) == [None, None, None]


# ---- arith through the same interface ----

def test_arith_task_wraps_the_generated_task():
    task = tasks.load_task("arith", 0, 30, 10)
    assert len(task.train) == 30 and len(task.heldout) == 10 and task.verifiable
    problem = arith.Problem("Ava has 7 apples. She gets 5 more. She gives away 3. How many apples?", 7,
                            (("+", 5), ("-", 3)), 9)
    assert task.prompt(problem) == problem.question + "\n"
    assert task.reward(problem, "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9") == 1.0
    assert task.reward(problem, "Answer: 8") == 0.0
    assert task.step_verdicts(problem, "7 + 5 = 12\n12 - 3 = 8\nAnswer: 8") == [True, False, None]
    assert task.step_spans("7 + 5 = 12\n\nAnswer: 12") == [(0, 10), (12, 22)]


# ---- every task: malformed completions, bad arguments, missing data ----

@pytest.mark.parametrize("name", ["arith", "gsm8k", "math", "mbpp", "humaneval", "proofnet"])
@pytest.mark.parametrize("completion", ["", "\n\n", "\x00\ud800\ufffd", "<<1/0=1>>\n####", "\\boxed{" * 50,
                                        "```\n", "#### " + "9" * 5000])
def test_rewards_and_verdicts_never_raise(data, name, completion):
    task = tasks.load_task(name, 0, 2, 2) if name in ("arith", "humaneval") else load(name, data, 2, 2)
    example = task.train[0]
    assert task.reward(example, completion) == 0.0
    verdicts = task.step_verdicts(example, completion)
    assert len(verdicts) == len(task.step_spans(completion)) and all(v in (None, False) for v in verdicts)


def test_bad_arguments_are_refused(data, tmp_path):
    with pytest.raises(ValueError, match="unknown task 'gsm9k'"):
        tasks.load_task("gsm9k", 0, 1, 1)
    with pytest.raises(ValueError, match="non-negative"):
        tasks.load_task("arith", 0, -1, 1)
    with pytest.raises(ValueError, match="reads no data set"):
        tasks.load_task("humaneval", 0, 1, 1, data_dir=str(data))
    write_jsonl(tmp_path / "wrong/train.jsonl", [{"problem": "columns of MATH"}])
    write_jsonl(tmp_path / "wrong/test.jsonl", [{"problem": "columns of MATH"}])
    with pytest.raises(ValueError, match="GSM8K rows do not have the data set's columns \\(question, answer\\)"):
        tasks.load_task("gsm8k", 0, 1, 1, data_dir=str(tmp_path / "wrong"))
