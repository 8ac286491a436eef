"""The branches pilot's rules (analysis/branches_plan.py) against hand examples, scipy's sign-flip test and the
registration's own numbers (results/preregistration-branches.md)."""

import math

import numpy as np
import pytest

from analysis import branches_plan as bp
from analysis import stats
from benchmarks import branches


def row(seed: int, point: int, k: int, arms: dict[str, tuple[float, float]], seconds: float = 10.0,
        trunk_from: int = 0) -> dict:
    """A pilot row: each arm's (qwen, llama) accuracy, every run `seconds` long, run whole (the trunk from
    `trunk_from`, each branch from the point)."""
    return {"preset": "qwen-llama", "seed": seed, "point": point, "k": k, "trunk": {"qwen": 0.2, "llama": 0.3},
            "arms": {arm: {"qwen": q, "llama": l} for arm, (q, l) in arms.items()},
            "seconds": {"trunk": seconds, **{arm: seconds for arm in arms}},
            "started_at": {"trunk": trunk_from, **{arm: point for arm in arms}}}


def test_the_vectorized_sign_flip_p_is_scipys_exact_one():
    rng = np.random.default_rng(3)
    samples = np.vstack([rng.normal(0.4, 1.0, size=(12, 7)), [[1, -1, 1, -1, 2, -2, 0.5]]])   # ties in the last
    expected = [stats.sign_flip_p(list(s)) for s in samples]
    np.testing.assert_allclose(bp.sign_flip_p_many(samples), expected, rtol=1e-12)


def test_power_is_the_tests_level_under_the_null_and_zero_where_n_cannot_reach_the_level():
    # 8 seeds' smallest two-sided p is 2 / 2^8 = 0.0078, above 0.05 / 8 = 0.00625: no rejection, whatever the data
    assert bp.power(8, 10.0, 1.0, bp.ALPHA_CALLS, draws=200) == 0.0
    assert bp.power(9, 10.0, 1.0, bp.ALPHA_CALLS, draws=200) == 1.0       # 2 / 512 = 0.0039 < 0.00625
    level = bp.power(10, 0.0, 1.0, 0.05, draws=4000)
    assert level <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)


def test_the_upper_80_bound_is_the_registrations_factor_of_1_461():
    sd, upper = bp.seed_mean_sd([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], points=3)
    assert sd == pytest.approx(math.sqrt(3.5) / math.sqrt(3))
    assert upper / sd == pytest.approx(1.461, abs=5e-4)


def test_the_rules_constants_are_the_registrations():
    assert (bp.ALPHA_CALLS, bp.POWER, bp.TARGET, bp.DRAWS) == (0.05 / 8, 0.8, 1.0, 10_000)
    assert list(bp.SEED_COUNTS) == list(range(9, 17)) and bp.CONTROL_FAMILIES == {"qwen-llama": 6, "trio-prose": 9}
    assert (bp.BUDGET_HOURS, bp.PROCESSES, bp.TRIO_COST) == (20.0, 2, 3.0)


def test_the_seed_count_is_a_naive_search_with_scipys_test():
    def naive(sd, draws):
        for n in range(9, 17):
            samples = np.random.default_rng(0).normal(1.0, sd, size=(draws, n))
            if np.mean([stats.sign_flip_p(list(s)) <= 0.05 / 8 for s in samples]) >= 0.8:
                return n
    assert bp.seed_count(0.7, draws=150)[0] == naive(0.7, 150)
    assert bp.seed_count(0.3, draws=500) == (9, False, 1.0)
    n, short, effect = bp.seed_count(3.0, draws=500)
    assert (n, short) == (16, True) and effect > 1.0


def test_k_is_the_one_whose_negated_control_hurts_most_per_unit_of_noise_and_5_on_a_tie_or_no_hurt():
    def rows(k, hurts):
        return [row(s, p, k, {"none": (0.5, 0.5), "negated": (0.5 - h, 0.5 - h)})
                for s, p, h in zip((1, 1, 2, 2), (10, 30, 10, 30), hurts)]
    five, ten = rows(5, [0.01, 0.03, 0.01, 0.03]), rows(10, [0.02, 0.03, 0.02, 0.03])
    # k = 5: -mean / SD = 2 / 1.069 = 1.87; k = 10: 2.5 / 0.535 = 4.67 (points)
    k, scores = bp.choose_k({5: five, 10: ten})
    assert k == 10 and scores[5] == pytest.approx(2 / np.std([1, 3, 1, 3] * 2, ddof=1))
    assert bp.choose_k({5: five, 10: rows(10, [0.01, 0.03, 0.01, 0.03])})[0] == 5      # a tie
    helps = rows(10, [-0.02, -0.03, -0.02, -0.03])
    assert bp.choose_k({5: rows(5, [-0.01, -0.03, -0.01, -0.03]), 10: helps})[0] == 5  # neither hurts


def test_the_budgets_cuts_go_in_the_registered_order_by_hand():
    costs = bp.Costs(trunk_iteration=10.0, branch=100.0)
    # a qwen-llama seed: 60 x 10 + 16 arms x 3 points x 100 = 5,400 s; trio-prose three times its own arms' cost
    plan = bp.budget(costs, 0.0, 12, 16, [10, 30, 60])
    # all: 12 x (5,400 + 16,200) / 2 / 3600 = 36 h; without the ratio arms 31.5 h; without point 60 23.5 h; then
    # trio-prose's seeds: 12 x 5,400 + m x 3 x (30 x 10 + 13 x 2 x 100) <= 20 h x 2 processes gives m = 9
    assert plan["cuts"] == ["trio-prose's ratio-signal arms", "trio-prose's branch point 60",
                            "trio-prose's calls, descriptive"]
    assert (plan["trio-prose arms"], plan["trio-prose points"], plan["trio-prose seeds"]) == (13, [10, 30], 9)
    assert plan["qwen-llama seeds"] == 12 and plan["hours"] == pytest.approx((12 * 5400 + 9 * 8700) / 7200)
    # a pilot that took 12.5 h of its 20 leaves 7.5 (54,000 process-seconds): trio-prose none, and qwen-llama's n
    # down to what fits, 10 seeds of 5,400 s
    tight = bp.budget(costs, 12.5 * 7200, 12, 16, [10, 30, 60])
    assert tight["trio-prose seeds"] == 0 and tight["qwen-llama seeds"] == 10 and not tight["over budget"]
    assert tight["cuts"][-1] == "qwen-llama's n"
    over = bp.budget(costs, 15 * 7200, 12, 16, [10, 30, 60])            # 5 h left: not even 9 seeds fit
    assert over["qwen-llama seeds"] == 9 and over["over budget"]
    roomy = bp.budget(bp.Costs(1.0, 1.0), 0.0, 12, 16, [10, 30, 60])
    assert roomy["cuts"] == [] and roomy["trio-prose seeds"] == 12 and not roomy["over budget"]


def test_the_last_cut_charges_what_the_calls_spent_and_fits_the_rest_at_the_running_rows_rate_by_hand():
    points, arms = [5, 10, 15, 20], {"a": (0.1, 0.1), "b": (0.1, 0.1)}
    live = [row(3103, 5, 1, arms), row(3103, 10, 1, arms, trunk_from=5), row(3104, 5, 1, arms)]
    set_aside = [row(3104, 5, 1, arms, seconds=40.0)]
    # here: a trunk iteration 2 s (10 s for 5 iterations), a branch 10 s, a seed 20 x 2 + 4 x 2 x 10 = 120 s, a
    # point 30 s; spent: the live trunks to 10 and 5 (30 s) and six branches (60 s), the set-aside row at its own
    # 8 s an iteration (40 s) and two branches (80 s), two lost points (60 s)
    spent = 30 + 60 + 40 + 80 + 60
    # the rest: 3103's trunk from 10 to 20 and its 2 missing points (60 s), 3104's from 5 and 3 points (90 s), 120 s
    # for each other seed; 1,200 s left fit 10 seeds (1,110 s), not 11 (1,230 s)
    cut = bp.fourth_cut(live, set_aside, (1200 + spent) / 7200, 12, 2, points, lost_points=2)
    assert cut["costs"] == {"trunk_iteration": 2.0, "branch": 10.0, "point": 0.0}
    assert cut["spent_hours"] == pytest.approx(spent / 7200) and cut["seed_hours"] == pytest.approx(120 / 7200)
    assert cut["n"] == 10 and cut["hours"] == pytest.approx(1110 / 7200) and not cut["over budget"]
    assert bp.fourth_cut(live, set_aside, 1.0, 12, 2, points, lost_points=2)["n"] == 12       # no cut where all fit
    tight = bp.fourth_cut(live, set_aside, (900 + spent) / 7200, 12, 2, points, lost_points=2)
    assert tight["n"] == 9 and tight["over budget"]                   # 9 seeds take 990 s of the 900 left


def pilot(hurt_at_10: float = 0.0, trunk_at_10: float = 0.2) -> list[dict]:
    """Both k's rows: d beats chance by about a point, negated hurts by 4.5 points (more at k = 10 by
    `hurt_at_10`, as noisily); every run 60 s at k = 5 and 120 s at k = 10, the trunk's 60 s a segment."""
    rows = []
    for k in (5, 10):
        for seed in (3101, 3102):
            for i, (since, point) in enumerate(((0, 10), (10, 30), (30, 60))):
                wobble = 0.001 * (i - 1) * (1 if seed == 3101 else -1)
                r = row(seed, point, k, {"none": (0.5, 0.5), "negated": (0.45 + wobble - hurt_at_10 * (k == 10),
                                                                          0.46 - hurt_at_10 * (k == 10)),
                                         "d": (0.51 + wobble, 0.5), "chance": (0.5, 0.5 + wobble)},
                        60.0 if k == 5 else 120.0, trunk_from=since)
                r["seconds"]["trunk"] = 60.0
                r["trunk"]["qwen"] = trunk_at_10 if k == 10 else 0.2
                rows.append(r)
    return rows


def test_the_plan_reads_the_pilots_rows_end_to_end():
    plan = bp.plan(pilot(), arms=16)
    assert plan["k"] == 5                      # k = 10 separates exactly as well: a tie gives 5
    assert plan["n"] == 9 and not plan["underpowered"] and plan["after_cuts"] is None
    mean, sd, score = plan["separation"][5]
    assert mean == pytest.approx(-4.5) and score == pytest.approx(4.5 / sd)
    assert plan["costs"] == {"trunk_iteration": pytest.approx(3 * 60 / 60), "branch": 60.0, "point": 0.0}
    assert plan["pilot_hours"] == pytest.approx((2 * 3 * (5 * 60) + 2 * 3 * (60 + 4 * 120)) / 7200)
    text = bp.markdown(plan)
    assert "**k = 5**" in text and "**n = 9**" in text and "The calls' seeds: 3103-3111." in text


def test_a_row_resumed_after_a_kill_costs_what_the_same_row_run_whole_costs():
    whole, resumed = bp.plan(pilot(), arms=16), pilot()
    # seed 3101's row at 30, killed and resumed: its trunk (3 s an iteration) from its checkpoint at 20, so 10
    # iterations, 30 s; its `d` branch already trained to 35, so it read its accuracy in 0.5 s
    r = next(r for r in resumed if (r["seed"], r["point"], r["k"]) == (3101, 30, 5))
    r["started_at"]["trunk"], r["seconds"]["trunk"] = 20, 30.0
    r["started_at"]["d"], r["seconds"]["d"] = 35, 0.5
    again = bp.plan(resumed, arms=16)
    assert again["costs"] == pytest.approx(whole["costs"])
    assert again["pilot_hours"] == pytest.approx(whole["pilot_hours"])
    assert (whole["resumed"], again["resumed"]) == (0, 1) and "counted at the mean: 1)" in bp.markdown(again)
    r["started_at"]["d"] = 30                                    # read as whole, the 0.5 s would lower the cost
    assert bp.plan(resumed, arms=16)["costs"]["branch"] < whole["costs"]["branch"]


def test_k_10_wins_where_its_negated_control_hurts_more_and_its_branches_cost_what_k_10_ran():
    plan = bp.plan(pilot(hurt_at_10=0.02), arms=16)
    assert plan["k"] == 10
    assert plan["costs"]["branch"] == pytest.approx(60.0 * 120.0 / 60.0)    # every arm at 5, scaled as k = 10 ran


def test_a_pilot_whose_two_trunks_differ_or_that_lacks_an_arm_is_refused():
    with pytest.raises(ValueError, match="fix the defect before part 2"):
        bp.plan(pilot(trunk_at_10=0.25), arms=16)
    rows = pilot()
    del rows[0]["arms"]["chance"]
    with pytest.raises(ValueError, match="lack d or chance"):
        bp.plan(rows, arms=16)


def test_the_plan_command_reads_the_pilots_two_folders(tmp_path, capsys):
    for r in pilot():
        folder = tmp_path / ("branches-pilot" if r["k"] == 5 else "branches-pilot-k10")
        branches.write_whole(folder / f"{r['preset']}-s{r['seed']}-it{r['point']:03d}.json", r)
    branches.main(["plan", str(tmp_path / "branches-pilot"), str(tmp_path / "branches-pilot-k10")])
    assert "**k = 5**" in capsys.readouterr().out
