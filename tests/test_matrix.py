"""The comparison's analysis (analysis/matrix.py, analysis/pairing.py) on run summaries built by hand, against
hand-computed cases: paired differences over the seeds both ran and started alike, the contrasts, the hypotheses'
words, the pooled folders and `eval.py --matrix`; nothing trains. The runner is tests/test_matrix_runner.py's, the
statistics tests/test_stats.py's."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import matrix as analysis
from analysis import pairing, stats

ROOT = Path(__file__).resolve().parents[1]


def summary(configuration, seed, auc_points, commits=("c1",), cost=1000.0, crossed=None):
    """A summary whose policy p has a flat held-out curve at auc_points / 100 (so its primary metric is
    auc_points), q one at half that, and update tokens spent evenly up to `cost`; both received `crossed`; every
    run of a seed started from the same weights (one fingerprint per policy and seed)."""
    def policy(level):
        heldout = [[i, level / 100] for i in range(0, 101, 50)]
        return {"heldout": heldout, "reward_mean": [0.1, 0.3], "reward_variance": 0.02,
                "spent": {c: [[i, cost * i / 100] for i, _ in heldout] for c in ("update_tokens", "iteration_s",
                                                                                 "rollout_tokens")},
                "crossed": crossed or {"sharing/received": 3.0}}
    return {"configuration": configuration, "seed": seed, "flags": [], "shared": ["--minibatches", "2"],
            "commits": list(commits), "start_fingerprints": {"p": f"p-s{seed}", "q": f"q-s{seed}"}, "iterations": 100,
            "iteration_s": cost, "policies": {"p": policy(auc_points), "q": policy(auc_points / 2)}}


def write_summaries(folder, summaries):
    folder.mkdir(parents=True, exist_ok=True)
    for s in summaries:
        (folder / f"{s['configuration']}-s{s['seed']}.json").write_text(json.dumps(s))


def test_the_curves_paired_difference_reads_only_the_seeds_whose_runs_started_alike(tmp_path, monkeypatch):
    from analysis import plots
    summaries = [summary(name, seed, level) for seed in (1, 2, 3)
                 for name, level in (("none", 40.0), ("sgt", 41.0 if seed != 3 else 90.0))]
    summaries[-1]["start_fingerprints"] = {"p": "elsewhere", "q": "q-s3"}     # sgt's run of seed 3
    drawn = []
    monkeypatch.setattr(plots, "band", lambda ax, iterations, values, spread, label, color: drawn.append(
        (label, list(values))))
    point = {policy: {"received": (3.0, 0.0), "reward_variance": (0.02, 0.0)} for policy in ("p", "q")}
    result = {"configurations": {"none": point, "sgt": point}, "config": {"pair_by_start": True}}
    plots.plot(summaries, result, tmp_path)
    # per policy: none's and sgt's curves on top, then sgt - none at the bottom, over seeds 1 and 2 only
    assert [label for label, _ in drawn] == ["none", "sgt", "sgt"] * 2
    assert drawn[2][1] == pytest.approx([1.0] * 3) and drawn[5][1] == pytest.approx([0.5] * 3)
    drawn.clear()
    plots.plot(summaries, {**result, "config": {"pair_by_start": False}}, tmp_path)
    assert drawn[2][1] == pytest.approx([(1 + 1 + 50) / 3] * 3)             # as published before the repair


def test_differences_are_taken_seed_by_seed_over_the_seeds_both_ran():
    a = {seed: summary("a", seed, v) for seed, v in ((3, 50.0), (1, 40.0), (2, 45.0))}
    b = {seed: summary("b", seed, v) for seed, v in ((2, 44.0), (1, 41.0), (4, 90.0))}
    assert analysis.paired_differences(a, b, "p", "auc", True) == pytest.approx({1: -1.0, 2: 1.0})


def test_at_equal_cost_both_runs_are_read_at_what_the_cheaper_one_spent():
    # a rises from 0 to 60 points over 1,000 tokens; b is flat at 30 over 2,000. At b's cost read to 1,000 tokens,
    # a's area is 30 (a line from 0 to 60) and b's 30
    a, b = summary("a", 1, 0.0, cost=1000.0), summary("b", 1, 30.0, cost=2000.0)
    a["policies"]["p"]["heldout"] = [[0, 0.0], [50, 0.3], [100, 0.6]]
    assert analysis.paired_differences({1: a}, {1: b}, "p", "equal update tokens", True) == pytest.approx({1: 0.0})
    assert analysis.paired_differences({1: a}, {1: b}, "p", "auc", True) == pytest.approx({1: 0.0})
    b["policies"]["p"]["heldout"] = [[0, 0.3], [50, 0.3], [100, 0.9]]    # b at 1,000 of its 2,000 tokens: 0.6
    # b up to 1,000 tokens (iteration 50): flat at 30 -> 30; a: 30. Over all of b's iterations it would be 45
    assert analysis.paired_differences({1: a}, {1: b}, "p", "equal update tokens", True) == pytest.approx({1: 0.0})
    assert analysis.paired_differences({1: a}, {1: b}, "p", "auc", True) == pytest.approx({1: 30.0 - 45.0})


def test_a_contrasts_t_interval_and_its_refusal_below_two_seeds_by_hand():
    # differences 1, 2, 3: mean 2, SD 1, so the t interval is 2 -+ t(0.975, 2) / sqrt(3), t(0.975, 2) = 4.303
    row = analysis.contrast_row("a", "b", "p", {1: 1.0, 2: 2.0, 3: 3.0}, analysis.AnalysisConfig(resamples=200))
    assert row["mean"] == 2.0 and row["sd"] == pytest.approx(1.0)
    assert row["t_interval"] == pytest.approx((2 - 4.3027 / math.sqrt(3), 2 + 4.3027 / math.sqrt(3)), abs=1e-3)
    for differences in ({}, {1: 1.0}):
        with pytest.raises(ValueError, match="a contrast needs two"):
            analysis.contrast_row("a", "b", "p", differences, analysis.AnalysisConfig())
    for quantile in (stats.chi2_quantile, stats.t_quantile):      # 0 degrees of freedom: an error, not a hang
        with pytest.raises(ValueError, match="at least 1 degree of freedom"):
            quantile(0.9, 0)


def test_the_seed_rule_by_hand():
    # 8 pilot seeds: the SD's upper 80% bound is sd * sqrt(7 / 3.822)
    assert stats.sd_upper_bound(2.0, 8, 0.8) == pytest.approx(2.0 * math.sqrt(7 / 3.822), rel=1e-3)
    # its 95% interval from the printed chi2(7) quantiles 16.013 (0.975) and 1.690 (0.025)
    assert stats.sd_interval(2.0, 8, 0.95) == pytest.approx((2.0 * math.sqrt(7 / 16.013),
                                                                2.0 * math.sqrt(7 / 1.690)), rel=1e-3)
    cfg = analysis.AnalysisConfig()
    # at SD 2 against 2 points: n >= (t_.975 + t_.8)^2 with n - 1 dof; n = 10 gives (2.262 + 0.883)^2 = 9.9
    # and n = 9 gives (2.306 + 0.889)^2 = 10.2 > 9
    assert analysis.seeds_for_power(2.0, cfg) == 10
    n = analysis.seeds_for_power(3.6, cfg)
    t = lambda q, d: stats.t_quantile(q, d)  # noqa: E731
    assert (t(0.975, n - 1) + t(0.8, n - 1)) * 3.6 / math.sqrt(n) <= 2
    assert (t(0.975, n - 2) + t(0.8, n - 2)) * 3.6 / math.sqrt(n - 1) > 2


def verdicts(cf_auc, sgt_auc, cf_variance, sgt_variance):
    """The hypotheses' verdicts of policy p for cross-fidelity and sgt runs with these per-seed values."""
    runs = []
    for seed, values in enumerate(zip(cf_auc, sgt_auc, cf_variance, sgt_variance), start=1001):
        for name, auc, variance in (("cross-fidelity", values[0], values[2]), ("sgt", values[1], values[3])):
            runs.append(summary(name, seed, auc))
            runs[-1]["policies"]["p"]["reward_variance"] = variance
    rows = analysis.analyze(runs, analysis.AnalysisConfig(resamples=20_000))["hypotheses"]
    return {h["hypothesis"]: (h["verdict"], h["estimate"], tuple(h["interval"])) for h in rows if h["policy"] == "p"}


def test_the_hypotheses_verdicts_by_hand():
    # cross-fidelity 3 points above sgt on every seed: every resample's mean is 3, p = 0, Holm rejects: supported.
    # Variance ratios all 0.5: the interval is [0.5, 0.5], below 0.7: supported
    h = verdicts([43.0] * 4, [40.0] * 4, [0.01] * 4, [0.02] * 4)
    assert h["H1"] == ("supported", pytest.approx(3.0), pytest.approx((3.0, 3.0)))
    assert h["H2"] == ("supported", pytest.approx(0.5), pytest.approx((0.5, 0.5)))
    # differences -1, 0, 1, 0: the interval lies within [-1, 1], below the hoped 2 points: refuted. Ratios 0.8 and
    # 1.25 alternate: geometric mean 1, every resampled mean of the logs within [log 0.8, log 1.25], above 0.7
    h = verdicts([39.0, 40.0, 41.0, 40.0], [40.0] * 4, [0.016, 0.025] * 2, [0.02] * 4)
    assert h["H1"][0] == "refuted" and h["H1"][2][0] >= -1.0 and h["H1"][2][1] <= 1.0
    assert h["H2"][0] == "refuted" and h["H2"][1] == pytest.approx(1.0)
    # differences -5 and +10; ratios 0.5 and 1.0: both intervals straddle their bound, [-5, 10] and [0.5, 1.0]
    h = verdicts([35.0, 50.0], [40.0, 40.0], [0.01, 0.02], [0.02, 0.02])
    assert h["H1"] == ("not resolved", pytest.approx(2.5), pytest.approx((-5.0, 10.0)))
    assert h["H2"] == ("not resolved", pytest.approx(math.sqrt(0.5)), pytest.approx((0.5, 1.0)))


def test_a_steady_gain_below_two_points_is_both_supported_and_refuted_and_a_zero_variance_is_named():
    # +1 on every seed: Holm rejects 0, and the interval [1, 1] excludes a gain of 2 points
    h = verdicts([41.0] * 4, [40.0] * 4, [0.01] * 4, [0.02] * 4)
    assert h["H1"][0] == "supported above sgt, refuted at +2 points or more"
    # an sgt run whose training reward never moved: H2 cannot be computed, and the rest of the analysis stands
    h = verdicts([40.0, 41.0], [40.0, 40.0], [0.01, 0.01], [0.0, 0.02])
    assert h["H2"][0].startswith("not computable") and h["H1"][0] == "refuted"      # differences 0 and +1


def test_the_hypotheses_at_n_drop_a_word_the_exact_readings_do_not_carry():
    runs = []
    for seed, (cf, sgt, cf_var) in enumerate(zip([43.0, 42.0, 44.0], [40.0] * 3, [0.05, 0.016, 0.03]), start=1001):
        for name, auc, variance in (("cross-fidelity", cf, cf_var), ("sgt", sgt, 0.02)):
            runs.append(summary(name, seed, auc))
            runs[-1]["policies"]["p"]["reward_variance"] = variance
    rows = analysis.analyze(runs, analysis.AnalysisConfig(resamples=20_000))["hypotheses"]
    h1, h2 = (next(h for h in rows if h["policy"] == "p" and h["hypothesis"] == k) for k in ("H1", "H2"))
    # H1: +3, +2, +4 over three seeds: the bootstrap rejects 0 (p = 0), but the sign-flip p of three same-signed
    # differences is 2 / 8, so Holm over the family cannot reject at n; the t interval, 3 -+ 4.303 / sqrt(3), is
    # not below 2 either: the registered "supported" is not carried
    assert h1["verdict"] == "supported" and h1["sign_flip_p"] == pytest.approx(0.25)
    assert h1["t_interval"] == pytest.approx((3 - 4.303 / math.sqrt(3), 3 + 4.303 / math.sqrt(3)), abs=1e-3)
    assert h1["verdict_at_n"] == "not resolved" and h1["reported"] == "not resolved (registered: supported)"
    # H2: log ratios log 2.5, log 0.8, log 1.5; their bootstrap interval lies above log 0.7, but their t interval,
    # mean -+ 4.303 SD / sqrt(3), reaches below it
    logs = [math.log(2.5), math.log(0.8), math.log(1.5)]
    mean, sd = sum(logs) / 3, statistics.stdev(logs)
    assert h2["t_interval"] == pytest.approx((math.exp(mean - 4.303 * sd / math.sqrt(3)),
                                              math.exp(mean + 4.303 * sd / math.sqrt(3))), rel=1e-3)
    assert h2["verdict"] == "refuted" and h2["t_interval"][0] < 0.7
    assert h2["reported"] == "not resolved (registered: refuted)"


def test_the_curators_admissions_are_shown_per_receiver_over_seeds():
    def curated(prp):
        return {"fidelity/offered": 100.0, "fidelity/could_matter": 0.5, "fidelity/admitted_prp": prp,
                "fidelity/admitted_xgrpo": 0.2, "fidelity/admitted_sgt": 0.1, "fidelity/rejected": 0.7 - prp,
                "fidelity/d_mean": 0.3}
    runs = [summary("cross-fidelity", s, 40.0, crossed=curated(prp), cost=cost)
            for s, prp, cost in ((1001, 0.1, 900.0), (1002, 0.3, 1100.0))]
    runs += [summary("sgt", s, 40.0) for s in (1001, 1002)]
    result = analysis.analyze(runs)
    # each run's training seconds, mean and SD over its seeds: 900 and 1100
    assert result["training_s"]["cross-fidelity"] == pytest.approx((1000.0, math.sqrt(20_000)))
    assert "| cross-fidelity | p | 2 | 40.00 ± 0.00 |" in analysis.markdown(result)
    assert analysis.markdown(result).count("| 1000 ± 141 |") == 2                 # the run's, beside each policy
    got = result["configurations"]["cross-fidelity"]["p"]["admission"]
    assert got["fidelity/admitted_prp"] == pytest.approx((0.2, math.sqrt(0.02)))   # 0.1 and 0.3
    assert got["fidelity/rejected"] == pytest.approx((0.5, math.sqrt(0.02)))
    assert "fidelity/tbd_mean" not in got                                         # never logged
    assert result["configurations"]["sgt"]["p"]["admission"] == {}                # no curator
    table = analysis.markdown(result).split("## The curator's admissions")[1].split("## Hypotheses")[0]
    row = "| cross-fidelity | {} | 100.00 ± 0.00 | 0.50 ± 0.00 | 0.20 ± 0.14 | 0.20 ± 0.00 | 0.10 ± 0.00 |"
    assert row.format("p") in table and row.format("q") in table
    assert "| sgt |" not in table


def test_the_better_grpo_budget_is_chosen_on_the_seeds_the_contrast_analyzes():
    runs = [summary("cross-fidelity", s, 40.0) for s in (1001, 1002)]
    runs += [summary("none-g16", s, 39.0) for s in (1001, 1002)]
    # over all its seeds none averages (38 + 38 + 90) / 3 = 55.3, but on the two seeds cross-fidelity ran, 38
    runs += [summary("none", s, auc) for s, auc in ((1001, 38.0), (1002, 38.0), (1003, 90.0))]
    contrasts = {r["contrast"] for r in analysis.analyze(runs)["contrasts"]["auc"]}
    assert "cross-fidelity - none-g16" in contrasts and "cross-fidelity - none" not in contrasts
    # a tie goes to the first named, none
    runs = [r for r in runs if r["configuration"] != "none" or r["seed"] != 1003]
    runs = [summary("none-g16", r["seed"], 38.0) if r["configuration"] == "none-g16" else r for r in runs]
    assert {r["contrast"] for r in analysis.analyze(runs)["contrasts"]["auc"]} >= {"cross-fidelity - none"}


def test_a_run_with_a_nan_accuracy_or_another_evaluation_schedule_is_refused(tmp_path):
    broken = summary("sgt", 1002, 40.0)
    broken["policies"]["q"]["heldout"][1][1] = float("nan")
    write_summaries(tmp_path / "nan", [summary("sgt", 1001, 40.0), broken])
    with pytest.raises(ValueError, match=r"non-finite held-out accuracy in \[\('sgt', 1002\)\]"):
        analysis.load(tmp_path / "nan")
    short = summary("sgt", 1002, 40.0)
    short["iterations"] = 90
    short["policies"]["p"]["heldout"] = short["policies"]["q"]["heldout"] = [[0, 0.4], [45, 0.4], [90, 0.4]]
    write_summaries(tmp_path / "short", [summary("sgt", 1001, 40.0), short])
    with pytest.raises(ValueError, match="evaluated at different iterations"):
        analysis.load(tmp_path / "short")


@pytest.mark.parametrize("drop", ["commits", "policies.q.reward_variance"])
def test_a_summary_without_a_field_is_refused_naming_its_file_and_the_field(tmp_path, drop):
    lacking = summary("sgt", 1002, 40.0)
    *path, key = drop.split(".")
    del (lacking["policies"]["q"] if path else lacking)[key]
    write_summaries(tmp_path, [summary("sgt", 1001, 40.0), lacking])
    with pytest.raises(ValueError, match=rf"sgt-s1002.json: a run summary without {drop}; remove it"):
        analysis.load(tmp_path)


def test_a_p_value_below_the_bootstraps_resolution_is_printed_as_a_bound():
    runs = [summary(name, s, auc) for s in (1001, 1002, 1003) for name, auc in (("cross-fidelity", 43.0),
                                                                               ("sgt", 40.0))]
    text = analysis.markdown(analysis.analyze(runs))
    assert "| cross-fidelity - sgt | p | +3.00 +3.00 +3.00 | — | +3.00 | 0.00 | [+3.00, +3.00] | < 0.0002 | 0.250 " \
           "| < 0.0002 |" in text


def test_runs_at_commits_not_declared_equivalent_are_not_paired(tmp_path):
    write_summaries(tmp_path, [summary("sgt", 1, 40.0, ["c1"]), summary("cross-fidelity", 1, 42.0, ["c1", "c2"])])
    with pytest.raises(ValueError, match="not declared metric-equivalent"):
        analysis.load(tmp_path)
    (tmp_path / analysis.EQUIVALENCE_FILE).write_text("c2 c3  # a README change\nc1 c3\n")   # merged by c3
    assert len(analysis.load(tmp_path)) == 2
    (tmp_path / "sgt-rerun-s1.json").write_text(json.dumps(summary("sgt", 1, 40.0)))
    with pytest.raises(ValueError, match="more than one summary"):
        analysis.load(tmp_path)


def test_folders_pool_their_runs_once_each_and_any_folders_declaration_of_equivalent_commits_holds(tmp_path):
    write_summaries(tmp_path / "pilot", [summary("sgt", 1, 40.0, ["c1"]), summary("cross-fidelity", 1, 42.0, ["c1"])])
    write_summaries(tmp_path / "new", [summary("sgt", 2, 41.0, ["c2"]), summary("cross-fidelity", 2, 41.0, ["c2"])])
    with pytest.raises(ValueError, match="not declared metric-equivalent"):
        analysis.load(tmp_path / "pilot", tmp_path / "new")
    (tmp_path / "new" / analysis.EQUIVALENCE_FILE).write_text("c1 c2\n")
    pooled = analysis.load(tmp_path / "pilot", tmp_path / "new")
    assert sorted((s["configuration"], s["seed"]) for s in pooled) == [("cross-fidelity", 1), ("cross-fidelity", 2),
                                                                      ("sgt", 1), ("sgt", 2)]
    [row] = [r for r in analysis.analyze(pooled)["contrasts"]["auc"]
             if r["contrast"] == "cross-fidelity - sgt" and r["policy"] == "p"]
    assert row["differences"] == pytest.approx({1: 2.0, 2: 0.0})          # one seed from each folder
    done = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--matrix", str(tmp_path / "pilot"),
                           str(tmp_path / "new")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| cross-fidelity - sgt | p | +2.00 +0.00 | — | +1.00 |" in done.stdout
    assert (tmp_path / "new" / "analysis.md").exists() and not (tmp_path / "pilot" / "analysis.md").exists()
    write_summaries(tmp_path / "again", [summary("sgt", 1, 40.0, ["c1"])])
    with pytest.raises(ValueError, match=r"more than one summary of \[\('sgt', 1\)\]"):
        analysis.load(tmp_path / "pilot", tmp_path / "again")


def test_eval_matrix_writes_the_analysis_from_summaries_alone(tmp_path):
    cf = [40.0, 43.0, 41.0, 46.0]
    runs = [summary("cross-fidelity", s, v) for s, v in zip(range(1001, 1005), cf)]
    runs += [summary("sgt", s, v) for s, v in zip(range(1001, 1005), (40.0, 41.0, 40.0, 42.0))]
    runs += [summary(name, s, auc) for name, auc in (("none", 38.0), ("none-g16", 39.0)) for s in range(1001, 1005)]
    write_summaries(tmp_path / "pilot", runs)
    done = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--matrix", str(tmp_path / "pilot")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "pilot" / "analysis.json").read_text())
    rows = {(r["contrast"], r["policy"]): r for r in result["contrasts"]["auc"]}
    # the random control did not run: two contrasts per policy; the better GRPO budget is none-g16
    assert set(rows) == {(c, p) for c in ("cross-fidelity - sgt", "cross-fidelity - none-g16") for p in "pq"}
    assert result["missing"]["auc"] == ["cross-fidelity - cross-fidelity-random (p)",
                                        "cross-fidelity - cross-fidelity-random (q)"]
    assert rows["cross-fidelity - sgt", "p"]["differences"] == pytest.approx({"1001": 0.0, "1002": 2.0, "1003": 1.0,
                                                                              "1004": 4.0})
    assert rows["cross-fidelity - sgt", "q"]["mean"] == pytest.approx(7 / 8)
    assert rows["cross-fidelity - none-g16", "p"]["mean"] == pytest.approx(42.5 - 39.0)
    # Holm over the registered six, the two that could not be paired at p = 1. Every difference from none-g16 is
    # positive (p = 0, ranks 0 and 1); sgt's differences for q are half of p's, so the same resamples give both
    # one p-value, ranked 2 and 3 of 6: adjusted 4 p (in a family of the four that ran it would be 2 p)
    sgt = rows["cross-fidelity - sgt", "p"]["p"]
    assert rows["cross-fidelity - none-g16", "p"]["p"] == 0 and 0 < sgt == rows["cross-fidelity - sgt", "q"]["p"]
    assert rows["cross-fidelity - sgt", "p"]["holm_p"] == rows["cross-fidelity - sgt", "q"]["holm_p"] == \
        pytest.approx(min(1.0, 4 * sgt))
    for r in rows.values():
        assert r["holm_interval"][0] <= r["interval"][0] and r["holm_interval"][1] >= r["interval"][1]
    assert "in Holm's family at p = 1: cross-fidelity - cross-fidelity-random (p)" in done.stdout
    # the matrix's seed count is set by the widest-spread primary hypothesis: by hand, cross-fidelity - none-g16 for
    # p, differences 1, 4, 2, 7 (SD sqrt(7)), against 0, 2, 1, 4 (SD sqrt(35 / 12)) and the halves of both for q
    assert rows["cross-fidelity - none-g16", "p"]["sd"] == pytest.approx(math.sqrt(7))
    assert result["seeds_for_matrix"] == rows["cross-fidelity - none-g16", "p"]["seeds_for_matrix"]
    assert rows["cross-fidelity - sgt", "p"]["seeds_for_matrix"] < result["seeds_for_matrix"]
    assert f"Seeds the matrix needs (the largest over the primary hypotheses above, at equal iterations): " \
           f"{result['seeds_for_matrix']}." in done.stdout
    assert result["configurations"]["sgt"]["p"]["auc"] == pytest.approx([40.75, math.sqrt(0.9166666)], rel=1e-4)
    assert "| cross-fidelity - sgt | p | +0.00 +2.00 +1.00 +4.00 | — | +1.75 |" in done.stdout
    assert all((tmp_path / "pilot" / png).stat().st_size > 0 for png in ("curves.png", "plane.png"))


def test_runs_of_a_seed_that_started_from_other_weights_are_left_out_of_the_contrast_and_named():
    runs = [summary(name, s, auc + s - 1001) for s in (1001, 1002, 1003, 1004)
            for name, auc in (("cross-fidelity", 43.0), ("sgt", 40.0), ("cross-fidelity-random", 41.0))]
    moved = next(r for r in runs if r["seed"] == 1003 and r["configuration"] == "sgt")
    moved["policies"]["p"]["heldout"] = [[i, 0.0] for i in (0, 50, 100)]        # -40 points: must not count
    moved["start_fingerprints"] = {"p": "another machine's warm-up", "q": "q-s1003"}
    result = analysis.analyze(runs, analysis.AnalysisConfig(resamples=500))
    rows = {(r["contrast"], r["policy"]): r for r in result["contrasts"]["auc"]}
    assert list(rows["cross-fidelity - sgt", "p"]["differences"]) == [1001, 1002, 1004]
    assert rows["cross-fidelity - sgt", "p"]["mean"] == pytest.approx(3.0)
    assert list(rows["cross-fidelity - sgt", "q"]["unpaired"]) == [1003]
    assert list(rows["cross-fidelity - cross-fidelity-random", "p"]["differences"]) == [1001, 1002, 1003, 1004]
    assert [h["seeds"] for h in result["hypotheses"] if h["hypothesis"] == "H2"] == [3, 3]
    text = analysis.markdown(result)
    assert ("Unpaired, left out of cross-fidelity - sgt: seed 1003, weights: cross-fidelity (p p-s1003, q q-s1003), "
            "sgt (p another machine's warm-up, q q-s1003).") in text
    assert "| cross-fidelity - sgt | p | +3.00 +3.00 +3.00 | 1003 |" in text
    # as published before pairing by start: every seed both ran
    published = analysis.analyze(runs, analysis.AnalysisConfig(resamples=500, pair_by_start=False))
    assert [len(r["differences"]) for r in published["contrasts"]["auc"]][:2] == [4, 4]


def test_summaries_without_fingerprints_pair_by_their_iteration_0_accuracies():
    a, b = summary("a", 1, 40.0), summary("b", 1, 40.0)
    for s in (a, b):
        s["start_fingerprints"] = None
    assert pairing.unpaired_reason(a, b) is None                  # equal curves, so equal at iteration 0
    b["policies"]["q"]["heldout"][0][1] = 0.21
    assert pairing.unpaired_reason(a, b) == "iteration-0 accuracy: a (p 0.4, q 0.2), b (p 0.4, q 0.21)"
    b["policies"]["q"]["heldout"][0][1] = 0.2
    b["start_fingerprints"] = {"p": "x", "q": "y"}                # only one records weights: accuracies decide
    assert pairing.unpaired_reason(a, b) is None
    a["policies"]["p"]["heldout"] = a["policies"]["p"]["heldout"][1:]     # never evaluated at iteration 0
    assert "p not evaluated" in pairing.unpaired_reason(a, b)


