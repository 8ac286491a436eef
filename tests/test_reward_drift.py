"""Process rewards, step types, the smoothed KL, and the RSD repair signals."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import reward_drift
from testbed import arith, tasks, verifiers


def problem():
    return arith.Problem("Ava has 17 apples. She gets 5 more. She gives away 3. How many apples does Ava have now?",
                         17, (("+", 5), ("-", 3)), 19)


@pytest.mark.parametrize("line, kind", [("7 + 5 = 12", "+1c"), ("12 + 5 = 17", "+2"), ("17 + 15 = 32", "+2c"),
                                        ("22 - 3 = 19", "-2c"), ("22 - 12 = 10", "-2"), ("3 * 4 = 12", "*1"),
                                        ("Answer: 19", None), ("so 3 + 4", None), ("", None)])
def test_step_types(line, kind):
    assert reward_drift.step_type(line) == kind


@pytest.mark.parametrize("line, kind", [("Half of 48 is <<48/2=24>>24.", "/2"), ("<<3*1,200+5=3605>>3605", "*+4"),
                                        ("<<-3+5=2>>2", "+1"), ("<<(4+2)*3=18>>18", "+*1"), ("<<12=12>>", None),
                                        ("She has 12 apples.", None), ("<<5 - -3=8>>8", "-1"), ("<<5*-3=-15>>", "*1"),
                                        ("<<2**3=8>>8", "**1"), ("<<2 ** 3 + 1=9>>9", "**+1")])
def test_gsm8k_annotations_have_step_types(line, kind):
    assert reward_drift.step_type(line) == kind


def test_gsm8k_annotations_carry_drift_and_verified_credit():
    # two policies' records of "/2" annotations; a shared GSM8K solution's annotated line then has a finite drift
    # and a verified credit, and its prose line neither
    completion = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo she sold many.\n#### 72"
    gsm8k = tasks.Task("gsm8k", [], [], str, verifiers.gsm8k_reward, verifiers.gsm8k_step_verdicts)
    steps = reward_drift.process_rewards(gsm8k, None, completion)
    assert [(s.type, s.reward) for s in steps] == [("/2", 1.0), (None, None), (None, None)]
    src, tgt = stats_from({"/2": (9, 10)}), stats_from({"/2": (2, 10)})
    drift = reward_drift.step_drift(src, tgt, steps[0].type)
    assert drift == pytest.approx(reward_drift.bernoulli_kl(10 / 12, 3 / 12))
    credit = reward_drift.verified_credit(1.0, steps, tgt, mix=0.5)
    assert credit[0] == pytest.approx(0.5 + 0.5 * (1 - 3 / 12)) and credit[1:] == [None, None]
    credit = reward_drift.verified_credit(-0.4, steps, tgt, mix=0.25)          # a weight the two sides tell apart
    assert credit[0] == pytest.approx(0.75 * -0.4 + 0.25 * (1 - 3 / 12))


ARITH = tasks.load_task("arith", 0, 0, 0)


def test_process_rewards_on_hand_labelled_steps():
    completion = "17 + 5 = 22\n22 - 3 = 18\n22 - 3 = 19\nwell\n9 + 9 = 18\nAnswer: 19"
    steps = reward_drift.process_rewards(ARITH, problem(), completion)
    assert [(s.type, s.reward) for s in steps] == [("+2c", 1.0), ("-2c", 0.0), ("-2c", 1.0), (None, None),
                                                  ("+1c", 0.0), (None, None)]   # 9 appears nowhere: wrong
    assert [completion[a:b] for (a, b) in (s.span for s in steps)][3] == "well"
    assert reward_drift.process_rewards(ARITH, problem(), "") == []
    garbage = reward_drift.process_rewards(ARITH, problem(), "\x00 = = +\n1 + = 2")
    assert all(s.reward is None for s in garbage)


def test_bernoulli_kl_by_hand_and_zero_for_identical():
    assert reward_drift.bernoulli_kl(0.5, 0.25) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75))
    assert reward_drift.bernoulli_kl(1.0, 0.5) == pytest.approx(math.log(2))
    assert reward_drift.bernoulli_kl(0.3, 0.3) == 0.0
    with pytest.raises(ValueError):
        reward_drift.bernoulli_kl(0.5, 1.0)


def stats_from(counts: dict[str, tuple[int, int]]) -> reward_drift.StepStats:
    """Stats holding `successes` correct and `trials - successes` wrong steps of each type."""
    stats = reward_drift.StepStats(window=20)
    stats.add_iteration([reward_drift.StepReward((0, 0), k, float(i < s)) for k, (s, n) in counts.items()
                         for i in range(n)])
    return stats


def test_smoothed_success_rates_by_hand():
    src, tgt = stats_from({"+1": (8, 8), "+2c": (3, 4)}), stats_from({"+1": (8, 8), "+2c": (0, 4)})
    assert src.success_rate("+2c") == pytest.approx(4 / 6) and tgt.success_rate("+2c") == pytest.approx(1 / 6)
    assert src.success_rate("+1") == pytest.approx(9 / 10) and src.success_rate("unseen") == 0.5   # Beta(1, 1)


def test_step_drift_is_the_kl_of_the_two_rates_by_hand():
    src, tgt = stats_from({"+1": (8, 8), "+2c": (3, 4)}), stats_from({"+1": (8, 8), "+2c": (0, 4)})
    # KL(4/6 || 1/6) = 2/3 ln((2/3) / (1/6)) + 1/3 ln((1/3) / (5/6)) = 2/3 ln 4 + 1/3 ln 0.4
    expected = 2 / 3 * math.log(4) + 1 / 3 * math.log(0.4)                        # 0.61877
    assert reward_drift.step_drift(src, tgt, "+2c") == pytest.approx(expected)
    assert reward_drift.step_drift(src, tgt, "+1") == 0.0 and reward_drift.step_drift(src, tgt, None) is None
    steps = [reward_drift.StepReward((0, 1), "+1", 1.0), reward_drift.StepReward((2, 3), "+2c", 1.0),
             reward_drift.StepReward((4, 5), None, None)]
    bounds = reward_drift.rsd_steps(src, tgt, steps)                       # sqrt(1 - exp(-KL)) per typed step
    assert bounds[:2].tolist() == pytest.approx([0.0, math.sqrt(1 - math.exp(-expected))]) and math.isnan(bounds[2])


def test_the_window_forgets_old_iterations():
    stats = reward_drift.StepStats(window=2)
    for reward in (0.0, 1.0, 1.0):
        stats.add_iteration([reward_drift.StepReward((0, 1), "+1", reward)])
    assert stats.counts("+1") == (2.0, 2.0)


@given(st.dictionaries(st.sampled_from(["+1", "+2", "-1c"]), st.tuples(st.integers(0, 50), st.integers(0, 50))),
       st.dictionaries(st.sampled_from(["+1", "+2", "-1c"]), st.tuples(st.integers(0, 50), st.integers(0, 50))),
       st.sampled_from(["+1", "+2", "-1c", "*3"]))
def test_property_drift_is_finite_and_non_negative(a, b, kind):
    src = stats_from({k: (min(s, n), n) for k, (s, n) in a.items()})
    tgt = stats_from({k: (min(s, n), n) for k, (s, n) in b.items()})
    drift = reward_drift.step_drift(src, tgt, kind)
    assert math.isfinite(drift) and drift >= 0
    assert reward_drift.step_drift(src, src, kind) == 0.0


def test_verified_credit_rewards_a_hard_step_more_than_a_routine_one():
    target = stats_from({"+1": (9, 10), "+2c": (1, 10)})
    steps = [reward_drift.StepReward((0, 1), "+1", 1.0), reward_drift.StepReward((2, 3), "+2c", 1.0),
             reward_drift.StepReward((4, 5), "+2c", 0.0), reward_drift.StepReward((6, 7), None, None)]
    credit = reward_drift.verified_credit(1.0, steps, target, mix=0.5)
    p_easy, p_hard = 10 / 12, 2 / 12
    assert credit[:3] == pytest.approx([0.5 + 0.5 * (1 - p_easy), 0.5 + 0.5 * (1 - p_hard), 0.5 - 0.5 * p_hard])
    assert credit[3] is None


def test_intrinsic_rewards_rank_normalize_negative_norms():
    rewards = reward_drift.intrinsic_step_rewards(torch.tensor([3.0, 1.0, 2.0, 2.0]))
    assert rewards.tolist() == pytest.approx([0.0, 1.0, 0.5, 0.5])   # the smallest norm is the most rewarded
    assert reward_drift.intrinsic_step_rewards(torch.tensor([5.0])).tolist() == [0.5]
    with pytest.raises(ValueError):
        reward_drift.intrinsic_step_rewards(torch.tensor([1.0, float("nan")]))


def test_a_step_with_a_number_past_the_int_string_limit_has_no_type():
    assert reward_drift.step_type(f"{'9' * 5000} + 1 = 2") is None
    assert reward_drift.step_type("19 + 5 = 24") == "+2c"


def test_drift_bound_by_hand():
    values = reward_drift.drift_bound(torch.tensor([0.0, math.log(2), 50.0], dtype=torch.float64))
    torch.testing.assert_close(values, torch.tensor([0.0, math.sqrt(0.5), 1.0], dtype=torch.float64))
