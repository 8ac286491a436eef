"""The measure study's choice (analysis/branches_measure.py, results/preregistration-branches-measure.md) on rows
built by hand: the cell whose control that must hurt separates is chosen, ties go to the smaller k and then to
accuracy, a cell whose helpers do not help is not used, and the study's branches must reproduce the pilot's."""

import itertools

import numpy as np
import pytest
import scipy.stats

from analysis import branches as branches_report
from analysis import branches_measure
from analysis import branches_plan as bp
from benchmarks import branches

ARMS = ("none", "negated", "second-group", "sgt", "d", "chance")
TRUNK_SECONDS, BRANCH_SECONDS, POINT_SECONDS = 12.0, 9.0, 30.0
"""a trunk iteration's seconds, a branch's per iteration it continues, and a point's draws and trunk measure"""
POLICIES = ("qwen", "llama")


def study_row(seed: int, point: int, k: int, effects: dict[str, dict[str, float]], noise: dict[str, float]) -> dict:
    """A study row: each measure's `none` at 0.5, every other arm at 0.5 + its effect (0 if unnamed) plus the
    measure's noise times a pattern over (seed, point, policy) whose mean over the two seeds is 0, so that an arm's
    mean difference is its effect and no SD is 0."""
    def value(measure: str, arm: str, index: int) -> float:
        pattern = (1.0 if seed % 2 else -1.0) * {10: 1.0, 30: 0.5, 60: 2.0}[point] * (1 + index)
        jitter = 0.0 if arm == "none" else noise[measure] * pattern
        return 0.5 + effects.get(measure, {}).get(arm, 0.0) + jitter
    runs = {arm: {p: {m: value(m, arm, i) for m in branches_measure.MEASURES} for i, p in enumerate(POLICIES)}
            for arm in ARMS}
    runs["trunk"] = runs["none"]
    previous = {10: 0, 30: 10, 60: 30}[point]
    return {"preset": "qwen-llama", "seed": seed, "point": point, "k": k,
            "trunk": {p: m["accuracy"] for p, m in runs["trunk"].items()},
            "arms": {arm: {p: m["accuracy"] for p, m in runs[arm].items()} for arm in ARMS}, "measures": runs,
            "seconds": {"trunk": TRUNK_SECONDS * (point - previous), **{arm: BRANCH_SECONDS * k for arm in ARMS},
                        "trunk-measures": POINT_SECONDS},
            "started_at": {"trunk": previous, **{arm: point for arm in ARMS}}}


def rows(k: int, effects: dict, noise: dict) -> list[dict]:
    return [study_row(seed, point, k, effects, noise) for seed, point in itertools.product((3101, 3102), (10, 30, 60))]


NOISY = {"accuracy": 0.02, "iw_reward": 0.02, "loglik": 2.0}
CLEAN_LOGLIK = {**NOISY, "loglik": 0.01}
DRAWS = 400
"""simulated samples per power: enough to tell a power near 1 from one below 0.8, at a test's cost"""


def test_the_cell_whose_negated_control_separates_is_chosen_in_its_own_units():
    helps = {"loglik": {"negated": -1.0, "second-group": 0.4}, "accuracy": {"negated": -0.01}}
    cells, chosen = branches_measure.choice({1: rows(1, helps, CLEAN_LOGLIK), 5: rows(5, helps, NOISY)}, DRAWS)
    assert chosen == (1, "loglik")
    assert cells[(1, "loglik")]["power"] >= 0.99 and cells[(5, "loglik")]["power"] < 0.5
    # by hand: the pattern's mean over the 12 (seed, point, receiver) values is 0, so the mean is the effect,
    # in nats for L and in points (x 100) for A
    assert cells[(1, "loglik")]["mean"] == pytest.approx(-1.0)
    assert cells[(1, "accuracy")]["mean"] == pytest.approx(-1.0)
    assert cells[(1, "loglik")]["helps"] == pytest.approx({"second-group": 0.4, "sgt": 0.0})
    # the controls' SD by hand: the larger receiver's per-point SD (llama's pattern is twice qwen's), over sqrt(3)
    # points, at its upper 80% bound with 5 degrees of freedom
    llama = [2.0 * sign * size for sign in (-1.0, 1.0) for size in (1.0, 0.5, 2.0)]
    by_hand = 2.0 * np.std(llama, ddof=1) / np.sqrt(3) * np.sqrt(5 / scipy.stats.chi2.ppf(0.2, 5))
    assert cells[(5, "loglik")]["controls_sd"] == pytest.approx(by_hand)


def test_ties_go_to_the_smaller_k_then_accuracy_then_the_weighted_reward():
    clean = {m: 1e-4 for m in branches_measure.MEASURES}
    hurt = {m: {"negated": -0.05, "sgt": 0.01} for m in branches_measure.MEASURES}
    cells, chosen = branches_measure.choice({5: rows(5, hurt, clean), 1: rows(1, hurt, clean)}, DRAWS)
    assert all(c["power"] == 1.0 for c in cells.values())
    assert chosen == (1, "accuracy")
    noisy_accuracy = {**clean, "accuracy": 0.05}
    study = {5: rows(5, hurt, clean), 1: rows(1, hurt, noisy_accuracy)}
    assert branches_measure.choice(study, DRAWS)[1] == (1, "iw_reward")


def test_a_cell_whose_controls_that_must_help_do_not_is_not_used_and_the_report_says_no_call():
    hurts_all = {"loglik": {"negated": -1.0, "second-group": -0.2, "sgt": -0.1}}
    cells, chosen = branches_measure.choice({1: rows(1, hurts_all, CLEAN_LOGLIK)}, DRAWS)
    assert cells[(1, "loglik")]["power"] >= 0.99 and chosen is None
    assert "No cell is used" in branches_measure.markdown(cells, chosen)
    noisy_cells, noisy_choice = branches_measure.choice({1: rows(1, {}, NOISY)}, DRAWS)
    assert noisy_choice is None and max(c["power"] for c in noisy_cells.values()) < 0.8


def test_part_3_sizes_the_calls_at_a_third_of_the_chosen_cells_negated_effect_and_charges_what_was_spent():
    helps = {"loglik": {"negated": -1.5, "sgt": 0.3, "d": 0.1}}
    study = {1: rows(1, helps, CLEAN_LOGLIK), 5: rows(5, helps, NOISY)}
    pilot = rows(5, {}, NOISY)
    cells, chosen = branches_measure.choice(study, DRAWS)
    calls = branches_measure.calls_plan(study, pilot, cells, chosen, arms=16, draws=DRAWS)
    assert chosen == (1, "loglik") and calls["effect"] == pytest.approx(0.5)
    assert calls["costs"] == {"trunk_iteration": TRUNK_SECONDS, "branch": BRANCH_SECONDS * 1, "point": POINT_SECONDS}
    # by hand: each k's trunk to 60 on two seeds, 6 arms x 3 points x 2 seeds of branches and 3 x 2 points'
    # draws; the pilot likewise, whose rows here carry a point's seconds too
    study_seconds = 2 * 2 * 60 * TRUNK_SECONDS + 36 * BRANCH_SECONDS * (1 + 5) + 2 * 6 * POINT_SECONDS
    pilot_seconds = 2 * 60 * TRUNK_SECONDS + 36 * BRANCH_SECONDS * 5 + 6 * POINT_SECONDS
    assert calls["spent_hours"]["study"] == pytest.approx(study_seconds / 2 / 3600)
    assert calls["budget"]["hours_left"] == pytest.approx(20 - (study_seconds + pilot_seconds) / 2 / 3600)
    # the seed count is rule 2's, in the cell's units: the same n as in units of the effect itself
    sd = calls["sd_upper"]
    assert calls["n"] == bp.seed_count(sd / calls["effect"], draws=DRAWS)[0] == \
        bp.seed_count(sd, draws=DRAWS, target=calls["effect"])[0]


def test_a_design_with_more_points_a_seed_shrinks_a_seeds_mean_by_their_root_and_is_charged_its_own_seconds():
    helps = {"loglik": {"negated": -0.015, "sgt": 0.3}}         # negated within its noise at three points a seed
    study = {1: rows(1, helps, CLEAN_LOGLIK), 5: rows(5, helps, NOISY)}
    pilot = rows(5, {}, NOISY)
    cells, _ = branches_measure.choice(study, DRAWS)
    costed = [{**r, "seconds": {"trunk": 20.0 * (r["point"] - r["started_at"]["trunk"]),
                                **{arm: 15.0 for arm in ARMS}, "trunk-measures": 5.0}} for r in rows(1, {}, NOISY)]
    three = branches_measure.calls_plan(study, pilot, cells, (1, "loglik"), arms=9, draws=DRAWS)
    twelve = branches_measure.calls_plan(study, pilot, cells, (1, "loglik"), arms=9, draws=DRAWS,
                                         points=list(range(5, 65, 5)), cost_rows=costed)
    assert three["controls_sd"] > 0 and twelve["controls_sd"] == pytest.approx(three["controls_sd"] / 2)   # sqrt(12/3)
    assert twelve["costs"] == {"trunk_iteration": 20.0, "branch": 15.0, "point": 5.0}
    # by hand: two trunks to 60 at 20 s, 6 arms x 3 points x 2 seeds at 15 s, six points' measures at 5 s
    assert twelve["spent_hours"]["costs"] == pytest.approx((2 * 60 * 20 + 36 * 15 + 6 * 5) / 2 / 3600)
    assert twelve["budget"]["hours_left"] == pytest.approx(three["budget"]["hours_left"]
                                                           - twelve["spent_hours"]["costs"])
    # a seed's calls at 12 points: its trunk to 60 and 9 arms at each point
    seed_seconds = 60 * 20 + 12 * (9 * 15 + 5)
    assert twelve["budget"]["hours"] >= twelve["budget"]["qwen-llama seeds"] * seed_seconds / 2 / 3600
    assert three["controls_power"][16] < 0.8 < twelve["controls_power"][16]


def test_the_studys_branches_must_be_whole_and_reproduce_the_pilots_and_their_own_logged_accuracy():
    study = rows(1, {}, NOISY) + rows(5, {"accuracy": {"negated": -0.01}}, NOISY)
    pilot = [{**r, "arms": {**r["arms"], "hacpo": {"qwen": 0.1, "llama": 0.2}}} for r in study if r["k"] == 5]
    branches_measure.reproduced(study, pilot)                     # the pilot ran more arms: the shared ones match
    for partial in (study[1:], study[:6]):                        # a row short, a k missing
        with pytest.raises(ValueError, match="not whole"):
            branches_measure.reproduced(partial, pilot)
    pilot[2]["arms"]["d"] = {"qwen": 0.0, "llama": 0.0}
    with pytest.raises(ValueError, match="do not reproduce"):
        branches_measure.reproduced(study, pilot)
    study[0]["measures"]["chance"]["qwen"]["accuracy"] += 0.0005
    with pytest.raises(ValueError, match="measured accuracy"):
        branches_measure.reproduced(study, [])
    del study[0]["measures"]
    with pytest.raises(ValueError, match="carry no measures"):
        branches_measure.reproduced(study, [])


@pytest.mark.slow
def test_the_measure_command_checks_the_rows_then_prints_the_choice(tmp_path, capsys):
    helps = {"loglik": {"negated": -1.0, "sgt": 0.3}}
    folders = {k: tmp_path / f"k{k}" for k in (1, 5)}
    for k, folder in folders.items():
        for r in rows(k, helps, CLEAN_LOGLIK if k == 1 else NOISY):
            branches.write_whole(folder / f"qwen-llama-s{r['seed']}-it{r['point']:03d}.json", r)
    branches.main(["measure", str(folders[1]), str(folders[5]), "--pilot", str(folders[5])])
    printed = capsys.readouterr().out
    assert "**Chosen: loglik at k = 1.**" in printed and printed.count("\n| ") == 7      # a header, six cells
    assert "a third of |negated - none|: 0.3333" in printed and "**n = " in printed
    # a cell named, chosen or not, at another design's points, charged the seconds of rows run as it would run
    branches.main(["measure", str(folders[1]), str(folders[5]), "--pilot", str(folders[5]), "--cell", "5", "accuracy",
                   "--points", "10", "20", "30", "40", "50", "60", "--costs", str(folders[1])])
    printed = capsys.readouterr().out
    assert "Part 3's numbers, accuracy at k = 5" in printed and "6 branch points a seed (10-60)" in printed
    # k = 1's rows: 9 s a branch; charged two trunks to 60 at 12 s, 36 branches, six points at 30 s, of 2 processes
    assert "a branch 9.0" in printed and f"costs {(2 * 60 * 12 + 36 * 9 + 6 * 30) / 2 / 3600:.2f} h" in printed
    # rule 3's last cut, k = 1's rows as the calls running now and k = 5's as set aside: charged k = 1's trunks to
    # 60 at 12 s, 36 branches at 9 s and six points at 30 s; k = 5's at their own 45 s a branch; three lost points
    # at k = 1's mean point, a seed (60 x 12 + 3 x (6 x 9 + 30)) over its 3 points
    branches.main(["measure", str(folders[1]), str(folders[5]), "--pilot", str(folders[5]), "--cell", "1", "loglik",
                   "--costs", str(folders[1]), "--calls", str(folders[1]), str(folders[5]), "--lost-points", "3"])
    printed = capsys.readouterr().out
    spent = (2 * 60 * 12 + 36 * 9 + 6 * 30) + (2 * 60 * 12 + 36 * 45 + 6 * 30) + 3 * (60 * 12 + 3 * (6 * 9 + 30)) / 3
    assert f"the calls spent {spent / 7200:.2f} h (3 points killed before their row included)" in printed
    with pytest.raises(SystemExit):                                  # k = 3 is no cell of the study
        branches.main(["measure", str(folders[1]), str(folders[5]), "--pilot", str(folders[5]), "--cell", "3",
                       "loglik"])
    assert "is not a study cell" in capsys.readouterr().err


def test_the_report_reads_the_chosen_measure_in_its_units_with_part_3s_margin(tmp_path):
    for r in rows(1, {"loglik": {"d": 0.05}, "accuracy": {"d": 0.004}}, NOISY):
        branches.write_whole(tmp_path / f"qwen-llama-s{r['seed']}-it{r['point']:03d}.json", r)
    by_loglik = branches_report.report(tmp_path, branches_report.Reading.of("loglik", 0.5))
    by_accuracy = branches_report.report(tmp_path)
    d_row = next(line for line in by_loglik.splitlines() if line.startswith("| qwen-llama | qwen | d |"))
    assert "| +0.0500 [+0.0500, +0.0500]" in d_row                             # nats, as the rows were built
    # two seeds separate no control, so the report prints no word; the calls' words carry the margin's units
    reading = branches_report.Reading.of("loglik", 0.5)
    as_loglik = branches_report.analyze(branches_measure.as_measure(branches_report.load(tmp_path), "loglik"), 1.0)
    assert [x["A"]["d"] for x in branches_report.calls(as_loglik, reading)["cells"]] == \
        ["within 0.5 nats of chance"] * 2
    assert "nats" not in by_accuracy and "no call is made" in by_loglik
    d_row = next(line for line in by_accuracy.splitlines() if line.startswith("| qwen-llama | qwen | d |"))
    assert "| +0.40 [+0.40, +0.40]" in d_row                                   # the logged accuracy, in points
    assert branches_report.Reading.of("accuracy", 1.0) == branches_report.ACCURACY
