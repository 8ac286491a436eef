"""The arithmetic task and its verifiers; and where loading meets the code judge and MATH's layouts: MBPP tests that
build objects of the program's classes, and a partial copy of MATH's original release refused with advice that works."""

import json
import re
from pathlib import Path

import pytest

from testbed import arith, data, tasks

CFG = arith.TaskConfig(num_steps=2, max_operand=9, ops="+-")


def problem(start=7, steps=(("+", 5), ("-", 3))):
    return arith.Problem("Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?",
                         start, steps, 9)


def arithmetic_key(p: arith.Problem) -> tuple:
    return (p.start, p.steps)


def test_generation_is_seeded_and_splits_never_overlap():
    assert arith.generate_problems(50, "train", 3, CFG) == arith.generate_problems(50, "train", 3, CFG)
    assert arith.generate_problems(50, "train", 3, CFG) != arith.generate_problems(50, "train", 4, CFG)
    train = {arithmetic_key(p) for seed in range(3) for p in arith.generate_problems(2000, "train", seed, CFG)}
    heldout = {arithmetic_key(p) for seed in range(3) for p in arith.generate_problems(500, "heldout", seed, CFG)}
    assert train and heldout and not train & heldout


@pytest.mark.parametrize("step_format", arith.STEP_FORMATS)
@pytest.mark.parametrize("cfg", [CFG, arith.TaskConfig(num_steps=4, max_operand=30, ops="+-*")])
def test_reference_solutions_verify_and_amounts_stay_non_negative(cfg, step_format):
    for p in arith.generate_problems(300, "train", 0, cfg):
        value = p.start
        for op, b in p.steps:
            value = {"+": value + b, "-": value - b, "*": value * b}[op]
            assert value >= 0
        assert value == p.answer
        reference = arith.solution(p, step_format)
        assert arith.answer_reward(p, reference, step_format) == 1.0
        verdicts = [v for _, v in arith.step_verdicts(p, reference, step_format)]
        assert verdicts == [True] * cfg.num_steps + [None]
        cut = arith.premature_solution(p, step_format)
        assert [v for _, v in arith.step_verdicts(p, cut, step_format)] == [True, None]
        op, b = p.steps[0]
        first = {"+": p.start + b, "-": p.start - b, "*": p.start * b}[op]
        assert arith.answer_reward(p, cut, step_format) == float(first == p.answer)


@pytest.mark.parametrize("step_format, text, pieces", [
    ("inline", "7 + 5 = 12; 12 - 3 = 9; Answer: 9", ["7 + 5 = 12", "12 - 3 = 9", "Answer: 9"]),
    ("prose", "7 plus 5 is 12.Then 12 minus 3 is 9.Answer: 9", ["7 plus 5 is 12.", "Then 12 minus 3 is 9.",
                                                                "Answer: 9"]),
    ("prose", "7 plus 5 is 13.Then 13 minus 3 is 10. Answer: 10", ["7 plus 5 is 13.", "Then 13 minus 3 is 10.",
                                                                  "Answer: 10"]),
])
def test_the_step_formats_cut_a_completion_into_the_pieces_a_reader_sees(step_format, text, pieces):
    assert [text[a:b] for a, b in arith.step_spans(text, step_format)] == pieces
    right = text.startswith("7 plus 5 is 12") or text.startswith("7 + 5 = 12")
    assert [v for _, v in arith.step_verdicts(problem(), text, step_format)] == [right, right, None]
    assert arith.answer_reward(problem(), text, step_format) == float(right)
    assert arith.answer_reward(problem(), text.replace("Answer", "answer"), step_format) == 0.0


def test_the_task_of_a_step_format_scores_with_it():
    task = tasks.load_task("arith", 0, 5, 0, arith.TaskConfig(step_format="prose"))
    p = problem()
    assert task.reward(p, "7 plus 5 is 12.Then 12 minus 3 is 9.Answer: 9") == 1.0
    assert task.step_spans("7 plus 5 is 12.Answer: 12") == [(0, 15), (15, 25)]
    with pytest.raises(ValueError, match="step_format"):
        arith.TaskConfig(step_format="latex")


@pytest.mark.parametrize("completion, reward", [
    ("7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", 1.0),
    ("Answer: 9", 1.0),                                   # the outcome reward reads the answer only
    ("7 + 5 = 12\n12 - 3 = 9\nAnswer: 8", 0.0),
    ("Answer: 8\nAnswer: 9", 1.0),                         # the last answer line counts
    ("Answer: 9\nAnswer: 8", 0.0),
    # the last answer line decides alone, malformed or not; other lines after it do not count
    ("Answer: 9\nAnswer: 9.5", 0.0), ("Answer: 9\nAnswer: ten", 0.0), ("Answer: 9\nAnswer:", 0.0),
    ("Answer: 9\nAnswer: 9 or 8", 0.0), ("Answer: 9\nthat is all", 1.0),
    ("12 - 3 = 9\n  Answer: 9", 1.0), ("Answer: 9\n\tAnswer: 8", 0.0),   # an indented answer line is one
    ("Answer: \u0669", 0.0), ("Answer: \uff19", 0.0),        # Arabic-Indic and full-width nine: not the format's digits
    ("Answer: 9.", 0.0),   # the answer has no period: the prose format's pieces would read "9.5" as "9." and "5"
    ("", 0.0), ("\n\n", 0.0), ("7 + 5 = 12\n12 - 3 = 9", 0.0), ("Answer: nine", 0.0), ("Answer: 9.0", 0.0),
    ("\x00\ufffd garbage 😀", 0.0), ("Answer:", 0.0), ("answer: 9", 0.0),
])
def test_answer_reward(completion, reward):
    assert arith.answer_reward(problem(), completion) == reward


def test_the_last_answer_piece_counts_alone_in_every_step_format():
    assert arith.answer_reward(problem(), "7 + 5 = 12; Answer: 9; Answer: 9.5", "inline") == 0.0
    assert arith.answer_reward(problem(), "7 + 5 = 12; Answer: 8; Answer: 9", "inline") == 1.0
    assert arith.answer_reward(problem(), "7 plus 5 is 12.Answer: 9\nAnswer: nine", "prose") == 0.0
    assert [v for _, v in arith.step_verdicts(problem(), "7 + 5 = \uff11\uff12\n12 - 3 = 9")] == [None, False]
    # a step in symbols is checked in a sentence too, and so makes its result available to the next
    assert [v for _, v in arith.step_verdicts(problem(), "7 + 5 = 12.Then 12 minus 3 is 9.Answer: 9", "prose")] \
        == [True, True, None]
    assert [v for _, v in arith.step_verdicts(problem(), "7 + 5 = 12.\n12 - 3 = 8.")] == [True, False]


def test_step_verdicts_on_hand_labelled_lines():
    completion = "7 + 5 = 12\n12 - 3 = 8\n12 - 3 = 9\n4 + 5 = 9\nso the answer is\n9 * 1 = 9\n\nAnswer: 9"
    verdicts = arith.step_verdicts(problem(), completion)
    lines = [completion[s:e] for (s, e), _ in verdicts]
    assert lines == ["7 + 5 = 12", "12 - 3 = 8", "12 - 3 = 9", "4 + 5 = 9", "so the answer is", "9 * 1 = 9",
                     "Answer: 9"]
    # wrong arithmetic; 4 appears nowhere; 1 appears nowhere; prose and the answer line are not steps
    assert [v for _, v in verdicts] == [True, False, True, False, None, False, None]


def test_a_wrong_step_does_not_make_its_result_available():
    verdicts = arith.step_verdicts(problem(), "7 + 5 = 13\n13 - 3 = 10")
    assert [v for _, v in verdicts] == [False, False]


@pytest.mark.parametrize("completion", ["", "   ", "\n", "=\n+ = -\n1 + = 2", "99999999999999999999 + 1 = 1"])
def test_malformed_completions_never_raise(completion):
    verdicts = arith.step_verdicts(problem(), completion)
    assert all(v in (None, False) for _, v in verdicts)
    assert arith.answer_reward(problem(), completion) == 0.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="split"):
        arith.generate_problems(1, "test", 0)
    with pytest.raises(ValueError, match="ops"):
        arith.generate_problems(1, "train", 0, arith.TaskConfig(ops="/"))
    with pytest.raises(ValueError, match="widen"):
        arith.generate_problems(5, "heldout", 0, arith.TaskConfig(heldout_fraction=0.0))


def test_a_premature_solution_has_right_steps_and_the_wrong_answer():
    problem = arith.Problem("Ava has 7 apples. She gets 5 more. She gives away 3.", 7, (("+", 5), ("-", 3)), 9)
    cut = arith.premature_solution(problem)
    assert cut == "7 + 5 = 12\nAnswer: 12"
    assert [v for _, v in arith.step_verdicts(problem, cut)] == [True, None]
    assert arith.answer_reward(problem, cut) == 0.0


def test_numbers_past_the_int_string_limit_score_zero_and_are_not_steps():
    huge = "9" * 5000  # past Python's 4,300-digit int-str limit, where int() raises
    p = problem()
    for completion in (f"Answer: {huge}", f"7 + 5 = 12\nAnswer: {huge}"):
        assert arith.parse_answer(completion) is None and arith.answer_reward(p, completion) == 0.0
    verdicts = arith.step_verdicts(p, f"{huge} + 1 = 1{'0' * 5000}\n7 + {huge} = 12\n7 + 5 = 12\nAnswer: 9")
    assert [v for _, v in verdicts] == [None, None, True, None]
    assert arith.answer_reward(p, "7 + 5 = 12\n12 - 3 = 9\nAnswer: 9") == 1.0


# ---- code tasks whose tests build objects, and MATH's original layout -----------------------------------------------

def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


# Rows of MBPP's original mbpp.jsonl: task 601's tests build `Pair`s of the solution's class, task 927's
# test_setup_code builds trees of its `Node`s; 17 stands in for the test split.
MBPP_OBJECTS = [
    {"task_id": 601, "text": "Write a function to find the longest chain which can be formed from the given set of "
                             "pairs.",
     "code": "class Pair(object): \r\n\tdef __init__(self, a, b): \r\n\t\tself.a = a \r\n\t\tself.b = b \r\n"
             "def max_chain_length(arr, n): \r\n\tmax = 0\r\n\tmcl = [1 for i in range(n)] \r\n"
             "\tfor i in range(1, n): \r\n\t\tfor j in range(0, i): \r\n\t\t\tif (arr[i].a > arr[j].b and\r\n"
             "\t\t\t\tmcl[i] < mcl[j] + 1): \r\n\t\t\t\tmcl[i] = mcl[j] + 1\r\n\tfor i in range(n): \r\n"
             "\t\tif (max < mcl[i]): \r\n\t\t\tmax = mcl[i] \r\n\treturn max",
     "test_list": ["assert max_chain_length([Pair(5, 24), Pair(15, 25),Pair(27, 40), Pair(50, 60)], 4) == 3",
                   "assert max_chain_length([Pair(1, 2), Pair(3, 4),Pair(5, 6), Pair(7, 8)], 4) == 4",
                   "assert max_chain_length([Pair(19, 10), Pair(11, 12),Pair(13, 14), Pair(15, 16), Pair(31, 54)], 5) "
                   "== 5"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 927, "text": "Write a function to calculate the height of the given binary tree.",
     "code": "class Node: \r\n\tdef __init__(self, data): \r\n\t\tself.data = data \r\n\t\tself.left = None\r\n"
             "\t\tself.right = None\r\ndef max_height(node): \r\n\tif node is None: \r\n\t\treturn 0 ; \r\n"
             "\telse : \r\n\t\tleft_height = max_height(node.left) \r\n\t\tright_height = max_height(node.right) \r\n"
             "\t\tif (left_height > right_height): \r\n\t\t\treturn left_height+1\r\n\t\telse: \r\n"
             "\t\t\treturn right_height+1",
     "test_list": ["assert (max_height(root)) == 3", "assert (max_height(root1)) == 5 ",
                   "assert (max_height(root2)) == 4"],
     "test_setup_code": "root = Node(1) \r\nroot.left = Node(2) \r\nroot.right = Node(3) \r\n"
                        "root.left.left = Node(4) \r\nroot.left.right = Node(5) \r\nroot1 = Node(1);  \r\n"
                        "root1.left = Node(2);  \r\n"
                        "root1.right = Node(3);  \r\nroot1.left.left = Node(4);  \r\nroot1.right.left = Node(5);  \r\n"
                        "root1.right.right = Node(6);  \r\nroot1.right.right.right= Node(7);  \r\n"
                        "root1.right.right.right.right = Node(8)\r\nroot2 = Node(1) \r\nroot2.left = Node(2) \r\n"
                        "root2.right = Node(3) \r\nroot2.left.left = Node(4) \r\nroot2.left.right = Node(5)\r\n"
                        "root2.left.left.left = Node(6)\r\nroot2.left.left.right = Node(7)",
     "challenge_test_list": []},
    {"task_id": 17, "text": "Write a function to find the perimeter of a square.",
     "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
     "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20"],
     "test_setup_code": "", "challenge_test_list": []},
]
WRONG = {
    "601": "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n"
           "def max_chain_length(arr, n):\n    return n\n",
    "927": "class Node:\n    def __init__(self, data):\n        self.data, self.left, self.right = data, None, None\n\n"
           "def max_height(node):\n    return 0 if node is None else 1 + max_height(node.left)\n",  # the left spine
}


def test_mbpp_tests_that_build_the_programs_objects_score_references_1_and_wrong_programs_0(tmp_path):
    write_json_lines(tmp_path / "mbpp.jsonl", MBPP_OBJECTS)
    task = tasks.load_task("mbpp", 0, 10, 10, data_dir=str(tmp_path))
    examples = {example.id: example for example in task.train}
    assert sorted(examples) == ["601", "927"] and [e.id for e in task.heldout] == ["17"]
    assert examples["601"].entry_points == ("Pair", "max_chain_length")
    assert examples["927"].entry_points == ("max_height",) and examples["927"].test_setup.startswith("root = Node(1)")
    for example in task.train:
        assert task.reward(example, example.reference) == 1.0, example.id
        assert task.reward(example, WRONG[example.id]) == 0.0, example.id
    no_node = "def max_height(node):\n    return 3\n"  # the setup builds the program's Nodes: without them, 0
    assert task.reward(examples["927"], no_node) == 0.0


MATH_ROWS = {subject: {split: {"problem": f"In {subject} ({split}): what is $1 + {i}$?", "level": "Level 1",
                               "type": subject.title(), "solution": f"It is $\\boxed{{{i + 1}}}$."}
                       for i, split in enumerate(("train", "test"))}
             for subject in ("algebra", "geometry")}


def test_a_partial_math_release_is_refused_with_advice_that_works(tmp_path):
    # MATH's original layout, MATH/{train,test}/<subject>/<n>.json, holding two of the seven subjects
    for subject, splits in MATH_ROWS.items():
        for split, row in splits.items():
            path = tmp_path / f"MATH/{split}/{subject}/1.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(row))
    with pytest.raises(data.DataUnavailable, match="2 of its 7 folders") as refusal:
        tasks.load_task("math", 0, 10, 10, data_dir=str(tmp_path / "MATH"))
    advised = re.search(r"pass that folder itself as data_dir \(e\.g\. (.+?), which", str(refusal.value)).group(1)
    task = tasks.load_task("math", 0, 10, 10, data_dir=advised)
    subject = Path(advised).name
    assert [e.question for e in task.train] == [MATH_ROWS[subject]["train"]["problem"]]
    assert [e.question for e in task.heldout] == [MATH_ROWS[subject]["test"]["problem"]]
    assert task.reward(task.heldout[0], task.heldout[0].reference) == 1.0
