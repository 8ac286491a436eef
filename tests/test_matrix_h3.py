"""H3 (analysis/h3.py, results/preregistration-h3.md) on summaries built by hand: the ratio of a policy's
trio gain to the sum of its pair gains, its interval, p-value, Holm over the 9 and the calls, each against values
computed by hand; a seed whose runs started a policy elsewhere left out, named and replaced by a fresh seed; counts
alone before every run is in; each call again under other bootstrap seeds; and H3's sets read by `python eval.py
--blocks` at one class of commits of their own, that of the registered commit."""

import itertools
import json
import math

import pytest

from analysis import blocks as mb
from analysis import h3 as matrix_h3
from analysis import matrix as ma
from analysis import verdicts
from analysis.sets import H3_CONFIGURATIONS, H3_SEEDS, SETS
from test_matrix import summary, write_summaries

UNIT = 100 / 64
"""a flat held-out accuracy of k / 64 has an AUC of k x UNIT points, exactly, so gains in units add up exactly"""


def h3_run(grouping, configuration, seed, level):
    """A run of H3's: each policy of the grouping flat at level(policy) / 64 held-out accuracy, started from its
    one fingerprint of the seed in every grouping."""
    names = matrix_h3.POLICIES if grouping == "trio" else grouping.split("-")
    base = summary(configuration, seed, 0.0)
    return {**base, "start_fingerprints": {p: f"{p}-s{seed}" for p in names},
            "policies": {p: {**base["policies"]["p"], "heldout": [[i, level(p) / 64] for i in (0, 50, 100)]}
                         for p in names}}


def h3_sets(gain_of, seeds=H3_SEEDS):
    """H3's four sets on `seeds`: under none each policy at 20 + its place + seed % 3 units, under a configuration
    that plus its gain in the grouping, gain_of[policy, configuration](seed) = (trio, pair1, pair2) in units, the
    pairs in matrix_h3.pairs_of's order."""
    def level(grouping, configuration, seed):
        def of(policy):
            base = 20 + matrix_h3.POLICIES.index(policy) + seed % 3
            if configuration == "none":
                return base
            trio, *pairs = gain_of[policy, configuration](seed)
            return base + (trio if grouping == "trio" else pairs[matrix_h3.pairs_of(policy).index(grouping)])
        return of
    return {matrix_h3.SETS[g]: [h3_run(g, c, s, level(g, c, s)) for s in seeds for c in H3_CONFIGURATIONS]
            for g in matrix_h3.GROUPINGS}


def linear(seed):
    """the trio gain is the sum of the pair gains, which vary by seed"""
    pair1, pair2 = 1 + seed % 4, 2 + seed % 3
    return pair1 + pair2, pair1, pair2


def half_with_noise(seed):
    """pair gains summing to 8 units; the trio gain 4 +- 1 units (5 on even seeds, 3 on odd), half the sum on
    average"""
    pair1 = 3 + 2 * (seed % 2)
    return (5 if seed % 2 == 0 else 3), pair1, 8 - pair1


def zero_sum(seed):
    """pair gains summing to +2 units on odd seeds and -2 on even ones, 0 on average; the trio gain 2 units"""
    return 2, 3, (-1 if seed % 2 else -5)


def one_loss(seed):
    """pair gains 4 + 4 units; the trio gain 8 units but -2 on seed 6008"""
    return (-2 if seed == 6008 else 8), 4, 4


SCENARIOS = {("qwen", "sgt"): linear, ("qwen", "hacpo"): half_with_noise, ("qwen", "cross-fidelity"): zero_sum,
             ("llama", "sgt"): linear, ("llama", "hacpo"): one_loss, ("llama", "cross-fidelity"): linear,
             ("mistral", "sgt"): linear, ("mistral", "hacpo"): linear, ("mistral", "cross-fidelity"): linear}


def binomial_tail(n, q, k):
    """P(X >= k), X ~ Binomial(n, q)"""
    return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))


def test_h3s_sets_and_configurations_are_the_registrations():
    assert matrix_h3.CONFIGURATIONS == ("sgt", "hacpo", "cross-fidelity") and list(H3_SEEDS) == list(
        range(6001, 6009))
    for grouping, name in matrix_h3.SETS.items():
        shared = SETS[name].shared
        assert shared[shared.index("--pair") + 1] == grouping
    assert [matrix_h3.pairs_of(p) for p in matrix_h3.POLICIES] == [
        ("qwen-llama", "qwen-mistral"), ("qwen-llama", "llama-mistral"), ("qwen-mistral", "llama-mistral")]


def test_h3_ratio_interval_p_holm_and_calls_by_hand():
    result = matrix_h3.analyze(h3_sets(SCENARIOS), ma.AnalysisConfig())
    rows = {(r["policy"], r["configuration"]): r for r in result["rows"]}
    assert len(rows) == 9 and result["unpaired"] == [] and result["seeds"] == list(range(6001, 6009))
    # the trio gain the sum of the pair gains on every seed: every resampled ratio is exactly 1 (the numerator and
    # the denominator resample the same seeds; drawn apart, sums that vary by seed would spread the ratio)
    r = rows["qwen", "sgt"]
    sums = [sum(linear(s)[1:]) for s in range(6001, 6009)]
    assert r["seeds"] == list(range(6001, 6009))
    assert r["gains"]["trio"] == {s: pytest.approx(UNIT * sum(linear(s)[1:])) for s in range(6001, 6009)}
    assert r["trio_gain"] == pytest.approx(UNIT * sum(sums) / 8) and r["pair_sum"] == pytest.approx(r["trio_gain"])
    assert r["ratio"] == 1.0 and r["interval"] == (1.0, 1.0) and r["p"] == 0.0
    assert r["additive"] == 0.0 and r["additive_interval"] == (0.0, 0.0)
    assert r["call"] == "about linear" and r["reading"] == "—"
    assert r["linear_elsewhere"] == matrix_h3.OTHER_BOOTSTRAP_SEEDS     # every resample of every seed gives 1
    # at n: trio - 0.5 x sum is half the sum, positive on all 8 seeds, so the one-sided exact p is 1 / 2^8; T = S
    # seed by seed makes Fieller's (m_S^2 - q v_SS)(r - 1)^2 <= 0, the single point 1
    assert r["exact_p"] == pytest.approx(1 / 256) and r["fieller_interval"] == pytest.approx((1.0, 1.0))
    assert r["exact_rejected"] and r["call_at_n"] == "about linear" and r["reported"] == "about linear"
    # half the sum with noise: the ratio of resampled means is 0.375 + a / 32, a ~ Binomial(8, 1/2) the draws of
    # even seeds; its 2.5% and 97.5% quantiles at a = 1 and 7 (P(a <= 1) = 9/256 > 0.025 > P(a = 0)), its p
    # P(a <= 4) = 163/256: wholly below 1, yet Holm cannot reject R <= 0.5
    r = rows["qwen", "hacpo"]
    assert r["ratio"] == 0.5 and r["interval"] == (0.40625, 0.59375)
    assert r["p"] == pytest.approx(163 / 256, abs=0.02)
    assert r["additive"] == pytest.approx(-4 * UNIT) and r["pair_gains"] == {"qwen-llama": pytest.approx(4 * UNIT),
                                                                             "qwen-mistral": pytest.approx(4 * UNIT)}
    assert r["call"] == "not resolved" and r["reading"] == "diminishing returns"
    assert r["linear_elsewhere"] == 0            # p near 163/256 under any seed's resamples, never near Holm's bar
    # at n: the sum is 8 units on every seed (no variance, no covariance), so Fieller's interval is the trio
    # gain's t interval over 8 units: 0.5 -+ t(0.975, 7) x SD(5, 3, ...) / sqrt(8) / 8, SD sqrt(8 / 7), t 2.3646
    half = 2.3646 * math.sqrt(8 / 7) / math.sqrt(8) / 8
    assert r["fieller_interval"] == pytest.approx((0.5 - half, 0.5 + half), abs=1e-4)
    assert r["reading_at_n"] == "diminishing returns"      # described beside the call, never reported as one
    assert r["call_at_n"] == "not resolved" and r["reported"] == "not resolved"
    # pair gains summing to 0: the denominator's interval (a - 4) / 2 units at a = 1 and 7 holds 0, so not read; p
    # = P(a <= 3) = 93/256 (a negative denominator gives a negative ratio; a = 4 gives +inf, a > 4 at least 1)
    r = rows["qwen", "cross-fidelity"]
    assert r["ratio"] == math.inf and r["denominator_interval"] == pytest.approx((-1.5 * UNIT, 1.5 * UNIT))
    assert r["p"] == pytest.approx(93 / 256, abs=0.02)
    assert r["call"] == "not resolved" and r["reading"] == "not read (the sum of pair gains is not told from 0)"
    # one loss: the ratio 1 - 10 m / 64, m ~ Binomial(8, 1/8) the draws of seed 6008; R = 54 / 64; the 2.5%
    # quantile at m = 3 (P(m >= 3) = 0.063 > 0.025 > P(m >= 4)), the 97.5% at m = 0; p = P(m >= 4)
    r = rows["llama", "hacpo"]
    p4 = binomial_tail(8, 1 / 8, 4)
    assert r["ratio"] == 54 / 64 and r["interval"] == (1 - 30 / 64, 1.0)
    assert r["p"] == pytest.approx(p4, abs=0.004)
    assert r["additive"] == pytest.approx(-10 * UNIT / 8)
    # Holm over the 9: six at p = 0; then p4 at rank 6 (x 3, tested at 0.05 / 3: rejected), 93/256 at rank 7
    # (x 2, not), 163/256 at rank 8 (the running maximum)
    for key, row in rows.items():
        if SCENARIOS[key] is linear:
            assert row["p"] == 0.0 and row["holm_p"] == 0.0 and row["holm_rejected"] and row["call"] == "about linear"
    assert rows["llama", "hacpo"]["holm_p"] == pytest.approx(3 * p4, abs=0.01)
    assert rows["llama", "hacpo"]["holm_rejected"] and rows["llama", "hacpo"]["call"] == "about linear"
    assert rows["qwen", "cross-fidelity"]["holm_p"] == pytest.approx(2 * 93 / 256, abs=0.04)
    assert rows["qwen", "hacpo"]["holm_p"] == rows["qwen", "cross-fidelity"]["holm_p"]
    assert not rows["qwen", "cross-fidelity"]["holm_rejected"] and not rows["qwen", "hacpo"]["holm_rejected"]
    assert [r["underpowered"] for r in result["rows"]] == [True] * 3 + [False] * 6
    text = "\n".join(matrix_h3.markdown(result))
    assert "| qwen | sgt | 8 |" in text
    assert "| about linear (underpowered, as registered) | 20 of 20 | — | +0.00 [+0.00, +0.00] |" in text
    assert "| llama | hacpo | 8 | " in text and f"| {54 / 64:.2f} [0.53, 1.00] |" in text
    assert "| mistral | llama-mistral | " in text          # the mean AUC of each run


def test_each_call_is_made_again_under_each_of_the_other_bootstrap_seeds(monkeypatch):
    seen = []
    ratio_row = matrix_h3.ratio_row
    monkeypatch.setattr(matrix_h3, "ratio_row", lambda *args: seen.append(args[-1].bootstrap_seed) or ratio_row(*args))
    result = matrix_h3.analyze(h3_sets(SCENARIOS), ma.AnalysisConfig(resamples=50, bootstrap_seed=7))
    assert sorted(set(seen)) == list(range(7, 7 + matrix_h3.OTHER_BOOTSTRAP_SEEDS + 1))
    assert seen.count(7) == 9 and len(seen) == 9 * (matrix_h3.OTHER_BOOTSTRAP_SEEDS + 1)
    assert all(0 <= r["linear_elsewhere"] <= matrix_h3.OTHER_BOOTSTRAP_SEEDS for r in result["rows"])


def test_each_grouping_gains_over_its_own_none():
    # none sits 0, 3, 6 and 9 units higher in the trio and the three pairs: a gain taken against another grouping's
    # none is off by a multiple of 3 units on every seed
    offset = {"trio": 0, "qwen-llama": 3, "qwen-mistral": 6, "llama-mistral": 9}
    sets = h3_sets(SCENARIOS)
    for grouping, name in matrix_h3.SETS.items():
        for run in sets[name]:
            for policy in run["policies"].values():
                policy["heldout"] = [[i, a + offset[grouping] / 64] for i, a in policy["heldout"]]
    rows = {(r["policy"], r["configuration"]): r for r in matrix_h3.analyze(sets, ma.AnalysisConfig(resamples=500))
            ["rows"]}
    r = rows["qwen", "sgt"]
    assert r["gains"]["qwen-mistral"] == {s: pytest.approx(UNIT * linear(s)[2]) for s in range(6001, 6009)}
    assert r["ratio"] == pytest.approx(1.0) and r["interval"] == pytest.approx((1.0, 1.0))


def called(holm_rejected, interval, denominator_interval):
    row = {"holm_rejected": holm_rejected, "interval": interval, "denominator_interval": denominator_interval}
    return matrix_h3.call(row), matrix_h3.reading(row)


def test_each_condition_of_the_call_decides_it_alone():
    assert called(True, (0.6, 1.2), (1, 3)) == ("about linear", "—")
    assert called(True, (1.0, 1.2), (1, 3)) == ("about linear", "—")                    # 1 at the interval's edge
    assert called(False, (0.6, 1.2), (1, 3)) == ("not resolved", "—")                   # Holm did not reject
    assert called(True, (1.1, 1.6), (1, 3)) == ("not resolved", "superlinear")          # the interval misses 1
    assert called(True, (0.6, 0.9), (1, 3))[1] == "diminishing returns"
    for denominator in ((-0.2, 3), (0.0, 3)):                                            # the sum not told from 0
        assert called(True, (0.6, 1.2), denominator) == (
            "not resolved", "not read (the sum of pair gains is not told from 0)")


def test_h3_at_n_tests_trio_less_half_the_sum_by_its_signs_and_reads_fiellers_interval():
    # four seeds: trio gains 3, 2, 4, 1 over pair sums 3, 3, 3, 2; trio - 0.5 x sum = 1.5, 0.5, 2.5, 0.0, whose
    # one-sided sign-flip p counts the sign assignments whose sum is at least the observed 4.5, by a naive loop
    pair1, pair2 = matrix_h3.pairs_of("llama")
    seeds = (6001, 6002, 6003, 6004)
    by_grouping = {"trio": dict(zip(seeds, (3.0, 2.0, 4.0, 1.0))), pair1: dict(zip(seeds, (2.0, 1.0, 2.0, 1.0))),
                   pair2: dict(zip(seeds, (1.0, 2.0, 1.0, 1.0)))}
    differences = (1.5, 0.5, 2.5, 0.0)
    naive = sum(sum(x * d for x, d in zip(signs, differences)) >= 4.5 - 1e-12
                for signs in itertools.product((1, -1), repeat=4)) / 16
    row = matrix_h3.ratio_row("llama", "sgt", by_grouping, ma.AnalysisConfig(resamples=500))
    assert row["exact_p"] == pytest.approx(naive) and naive == 2 / 16      # 0 lets either sign of its seed count
    # each condition of the call at n decides it alone: a bounded Fieller interval, the test, where 1 lies
    def at_n(rejected, interval):
        return matrix_h3.labels_at_n({"exact_rejected": rejected, "fieller_interval": interval})
    assert at_n(True, (0.6, 1.2)) == ("about linear", None)
    assert at_n(False, (0.6, 1.2)) == (None, None)
    assert at_n(True, (0.4, 0.9)) == (None, "diminishing returns")
    assert at_n(True, (1.1, 1.9)) == (None, "superlinear")
    assert at_n(True, (-math.inf, math.inf)) == (None, None)                # an unbounded interval reads nothing
    registered = matrix_h3.registered_labels({"holm_rejected": True, "interval": (0.6, 1.2),
                                             "denominator_interval": (1.0, 3.0)})
    assert registered == ("about linear", None)
    assert verdicts.reported(registered[:1], at_n(True, (-math.inf, math.inf))[:1], matrix_h3.labels_text) == (
        "not resolved (registered: about linear)")
    assert matrix_h3.reading_at_n({"fieller_interval": (-math.inf, math.inf)}).startswith("not read")


def test_a_zero_sum_of_pair_gains_divides_by_the_numerators_sign_however_its_mean_rounds():
    # pair sums -0.1, -0.2 and +0.3 on three seeds, the trio gain 1 on each: of the 27 equally likely draws, the
    # 8 without the +0.3 and the 3 of -0.2, -0.2, +0.3 have a negative sum (R < 0); the 6 that draw each seed once
    # sum to 0 in exact arithmetic (R = +inf), though their float means come out at -1e-17: p = 11/27, not 17/27
    pair1, pair2 = matrix_h3.pairs_of("llama")
    by_grouping = {"trio": {6001: 1.0, 6002: 1.0, 6003: 1.0}, pair1: {6001: -0.1, 6002: -0.2, 6003: 0.3},
                   pair2: {6001: 0.0, 6002: 0.0, 6003: 0.0}}
    row = matrix_h3.ratio_row("llama", "sgt", by_grouping, ma.AnalysisConfig())
    assert row["ratio"] == math.inf and row["p"] == pytest.approx(11 / 27, abs=0.02)
    # a trio gain of -2 on every seed over pair sums of +-1 by seed parity: a = the draws of even seeds, R =
    # -2 / (1 - a / 4); a = 4 is -2 / 0 = -inf, so p = P(a >= 4) = 163/256 (+inf there would give 93/256)
    seeds = range(6001, 6009)
    by_grouping = {"trio": {s: -2.0 for s in seeds}, pair1: {s: 1.0 if s % 2 else -1.0 for s in seeds},
                   pair2: {s: 1.0 if s % 2 else -1.0 for s in seeds}}
    assert matrix_h3.ratio_row("llama", "sgt", by_grouping, ma.AnalysisConfig())["p"] == pytest.approx(
        163 / 256, abs=0.02)


def test_a_seed_whose_trio_run_started_a_policy_elsewhere_is_left_out_of_its_contrasts_and_a_fresh_seed_owed():
    cfg = ma.AnalysisConfig(resamples=500)
    sets = h3_sets(SCENARIOS)
    moved = next(s for s in sets["h3-trio"] if s["seed"] == 6003 and s["configuration"] == "sgt")
    moved["start_fingerprints"] = {**moved["start_fingerprints"], "qwen": "elsewhere"}
    waiting = matrix_h3.analyze(sets, cfg)
    why = ("qwen's weights: elsewhere in trio sgt; qwen-s6003 in trio none, qwen-llama sgt, qwen-llama none, "
           "qwen-mistral sgt, qwen-mistral none")
    assert waiting["unpaired"] == [{"policy": "qwen", "configuration": "sgt", "seed": 6003, "why": why}]
    # the next fresh seed runs in full in its place: nothing is computed before its 16 runs are in
    assert waiting["seeds"] == list(range(6001, 6010)) and waiting["rows"] == []
    assert waiting["ran"] == {name: 32 for name in matrix_h3.SETS.values()}
    text = "\n".join(matrix_h3.markdown(waiting))
    assert "h3-trio 32 of 36" in text and f"Unpaired, left out of qwen sgt: seed 6003 ({why})." in text
    assert "Fresh seeds in place of the unpaired, run in full: 6009." in text
    fresh = h3_sets(SCENARIOS, seeds=(6009,))
    result = matrix_h3.analyze({name: runs + fresh[name] for name, runs in sets.items()}, cfg)
    rows = {(r["policy"], r["configuration"]): r for r in result["rows"]}
    kept = [s for s in range(6001, 6010) if s != 6003]
    assert rows["qwen", "sgt"]["seeds"] == kept
    assert rows["qwen", "sgt"]["trio_gain"] == pytest.approx(UNIT * sum(linear(s)[0] for s in kept) / 8)
    # only qwen's contrast with sgt reads the moved run: llama's (its start unmoved) and qwen's others keep 6003
    assert rows["llama", "sgt"]["seeds"] == rows["qwen", "hacpo"]["seeds"] == list(range(6001, 6010))


def test_a_policy_started_elsewhere_in_a_whole_grouping_is_left_out_of_its_three_contrasts_for_one_fresh_seed():
    # qwen moved in the trio's sgt and none runs of seed 6003 alike: within the trio its runs agree, across
    # groupings they do not; every contrast of qwen reads trio none, so all three leave 6003 out, for one fresh seed
    sets = h3_sets(SCENARIOS)
    for run in sets["h3-trio"]:
        if run["seed"] == 6003 and run["configuration"] in ("sgt", "none"):
            run["start_fingerprints"] = {**run["start_fingerprints"], "qwen": "elsewhere"}
    result = matrix_h3.analyze(sets, ma.AnalysisConfig(resamples=200))
    assert {(u["policy"], u["configuration"], u["seed"]) for u in result["unpaired"]} == {
        ("qwen", c, 6003) for c in ("sgt", "hacpo", "cross-fidelity")}
    assert result["seeds"] == list(range(6001, 6010))
    # the registration pairs by start whatever the configuration says
    assert matrix_h3.analyze(sets, ma.AnalysisConfig(resamples=200, pair_by_start=False))["unpaired"] == \
        result["unpaired"]


def test_a_policys_iteration_0_accuracy_stands_in_where_a_summary_records_no_fingerprint():
    read = {(g, c): h3_run(g, c, 6001, lambda p: 30) for g in ("trio", "qwen-llama", "qwen-mistral")
            for c in ("sgt", "none")}
    read["trio", "sgt"]["start_fingerprints"] = None
    assert matrix_h3.unpaired_reason(read, "qwen") is None
    read["qwen-llama", "none"]["policies"]["qwen"]["heldout"][0][1] = 0.5
    assert matrix_h3.unpaired_reason(read, "qwen") == (
        "qwen's iteration-0 accuracy: 0.46875 in trio sgt, trio none, qwen-llama sgt, qwen-mistral sgt, "
        "qwen-mistral none; 0.5 in qwen-llama none")


def test_an_incomplete_h3_gives_its_counts_of_runs_and_no_outcome():
    sets = h3_sets(SCENARIOS)
    sets["h3-llama-mistral"] = [s for s in sets["h3-llama-mistral"]
                                if not (s["seed"] == 6005 and s["configuration"] == "hacpo")]
    result = matrix_h3.analyze(sets, ma.AnalysisConfig(resamples=200))
    assert result["rows"] == [] and result["auc"] == []
    assert result["ran"] == {"h3-trio": 32, "h3-qwen-llama": 32, "h3-qwen-mistral": 32, "h3-llama-mistral": 31}
    text = "\n".join(matrix_h3.markdown(result))
    assert ("runs so far: h3-trio 32 of 32, h3-qwen-llama 32 of 32, h3-qwen-mistral 32 of 32, h3-llama-mistral 31 "
            "of 32.") in text and "|" not in text and "Mean AUC" not in text      # no table, no outcome
    assert "No H3 run yet." in "\n".join(matrix_h3.markdown(matrix_h3.analyze({}, ma.AnalysisConfig())))


def test_eval_blocks_reads_h3s_four_sets_at_one_class_of_commits_of_their_own(tmp_path):
    write_summaries(tmp_path / "matrix", [{**summary("sgt", 1009, 40.0, ["m1"]), "iteration_s": 1.0}])
    sets = h3_sets(SCENARIOS)
    for name, runs in sets.items():
        write_summaries(tmp_path / name, [{**s, "commits": ["h2" if name == "h3-trio" else "h1"]} for s in runs])
    with pytest.raises(ValueError, match="H3's sets ran at commits"):
        mb.load_sets(tmp_path)
    (tmp_path / "h3-qwen-mistral" / ma.EQUIVALENCE_FILE).write_text("h1 h2  # checked by same_metrics\n")
    with pytest.raises(ValueError, match="not at its registered 3019911"):      # one class, not the registered one
        mb.load_sets(tmp_path)
    (tmp_path / "h3-trio" / ma.EQUIVALENCE_FILE).write_text(f"h2 {mb.REGISTERED_AT['h3']}\n")
    assert sorted(mb.load_sets(tmp_path)) == ["h3-llama-mistral", "h3-qwen-llama", "h3-qwen-mistral", "h3-trio",
                                             "matrix"]
    text = mb.report(tmp_path, ma.AnalysisConfig(resamples=500))
    assert "## H3: does a policy's gain with two peers add up" in text and "| mistral | cross-fidelity | 8 |" in text
    h3 = json.loads((tmp_path / "matrix" / "blocks.json").read_text())["h3"]
    assert [(r["policy"], r["configuration"]) for r in h3["rows"]] == list(SCENARIOS)
    assert h3["rows"][0]["gains"]["trio"]["6001"] == pytest.approx(UNIT * linear(6001)[0])
