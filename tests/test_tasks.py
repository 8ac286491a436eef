import pytest

import tasks

CFG = tasks.TaskConfig(num_steps=2, max_operand=9, ops="+-")


def problem(start=7, steps=(("+", 5), ("-", 3))):
    return tasks.Problem("Ava has 7 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?",
                         start, steps, 9)


def arithmetic_key(p: tasks.Problem) -> tuple:
    return (p.start, p.steps)


def test_generation_is_seeded_and_splits_never_overlap():
    assert tasks.generate_problems(50, "train", 3, CFG) == tasks.generate_problems(50, "train", 3, CFG)
    assert tasks.generate_problems(50, "train", 3, CFG) != tasks.generate_problems(50, "train", 4, CFG)
    train = {arithmetic_key(p) for seed in range(3) for p in tasks.generate_problems(2000, "train", seed, CFG)}
    heldout = {arithmetic_key(p) for seed in range(3) for p in tasks.generate_problems(500, "heldout", seed, CFG)}
    assert train and heldout and not train & heldout


@pytest.mark.parametrize("cfg", [CFG, tasks.TaskConfig(num_steps=4, max_operand=30, ops="+-*")])
def test_reference_solutions_verify_and_amounts_stay_non_negative(cfg):
    for p in tasks.generate_problems(300, "train", 0, cfg):
        value = p.start
        for op, b in p.steps:
            value = {"+": value + b, "-": value - b, "*": value * b}[op]
            assert value >= 0
        assert value == p.answer
        assert tasks.answer_reward(p.solution, p) == 1.0
        verdicts = [v for _, v in tasks.step_verdicts(p.solution, p)]
        assert verdicts == [True] * cfg.num_steps + [None]


@pytest.mark.parametrize("completion, reward", [
    ("7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", 1.0),
    ("Answer: 9", 1.0),                                   # the outcome reward reads the answer only
    ("7 + 5 = 12\n12 - 3 = 9\nAnswer: 8", 0.0),
    ("Answer: 8\nAnswer: 9", 1.0),                         # the last answer line counts
    ("Answer: 9\nAnswer: 8", 0.0),
    ("", 0.0), ("\n\n", 0.0), ("7 + 5 = 12\n12 - 3 = 9", 0.0), ("Answer: nine", 0.0), ("Answer: 9.0", 0.0),
    ("\x00\ufffd garbage 😀", 0.0), ("Answer:", 0.0), ("answer: 9", 0.0),
])
def test_answer_reward(completion, reward):
    assert tasks.answer_reward(completion, problem()) == reward


def test_step_verdicts_on_hand_labelled_lines():
    completion = "7 + 5 = 12\n12 - 3 = 8\n12 - 3 = 9\n4 + 5 = 9\nso the answer is\n9 * 1 = 9\n\nAnswer: 9"
    verdicts = tasks.step_verdicts(completion, problem())
    lines = [completion[s:e] for (s, e), _ in verdicts]
    assert lines == ["7 + 5 = 12", "12 - 3 = 8", "12 - 3 = 9", "4 + 5 = 9", "so the answer is", "9 * 1 = 9",
                     "Answer: 9"]
    # wrong arithmetic; 4 appears nowhere; 1 appears nowhere; prose and the answer line are not steps
    assert [v for _, v in verdicts] == [True, False, True, False, None, False, None]


def test_a_wrong_step_does_not_make_its_result_available():
    verdicts = tasks.step_verdicts("7 + 5 = 13\n13 - 3 = 10", problem())
    assert [v for _, v in verdicts] == [False, False]


@pytest.mark.parametrize("completion", ["", "   ", "\n", "=\n+ = -\n1 + = 2", "99999999999999999999 + 1 = 1"])
def test_malformed_completions_never_raise(completion):
    verdicts = tasks.step_verdicts(completion, problem())
    assert all(v in (None, False) for _, v in verdicts)
    assert tasks.answer_reward(completion, problem()) == 0.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="split"):
        tasks.generate_problems(1, "test", 0)
    with pytest.raises(ValueError, match="ops"):
        tasks.generate_problems(1, "train", 0, tasks.TaskConfig(ops="/"))
    with pytest.raises(ValueError, match="widen"):
        tasks.generate_problems(5, "heldout", 0, tasks.TaskConfig(heldout_fraction=0.0))


def test_a_premature_solution_has_right_steps_and_the_wrong_answer():
    problem = tasks.Problem("Ava has 7 apples. She gets 5 more. She gives away 3.", 7, (("+", 5), ("-", 3)), 9)
    cut = tasks.premature_solution(problem)
    assert cut == "7 + 5 = 12\nAnswer: 12"
    assert [v for _, v in tasks.step_verdicts(cut, problem)] == [True, None]
    assert tasks.answer_reward(cut, problem) == 0.0


def test_numbers_past_the_int_string_limit_score_zero_and_are_not_steps():
    huge = "9" * 5000  # past Python's 4,300-digit int-str limit, where int() raises
    p = problem()
    for completion in (f"Answer: {huge}", f"7 + 5 = 12\nAnswer: {huge}"):
        assert tasks.parse_answer(completion) is None and tasks.answer_reward(completion, p) == 0.0
    verdicts = tasks.step_verdicts(f"{huge} + 1 = 1{'0' * 5000}\n7 + {huge} = 12\n7 + 5 = 12\nAnswer: 9", p)
    assert [v for _, v in verdicts] == [None, None, True, None]
    assert tasks.answer_reward("7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", p) == 1.0
