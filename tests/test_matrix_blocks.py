"""The matrix's blocks 2-6, H4 and H5 (analysis/blocks.py, h4.py, h5.py) on summaries built by hand: each registered
rule called on its boundary cases, a family's Holm over its registered seeds alone, H4's dominant terms and
claims, H5's dominance, HACPO-official's seeds owed in place of an unpaired one and its registered commit, and
`python eval.py --blocks` end to end (H3's: test_matrix_h3.py)."""

import itertools
import json
import math
import statistics
import subprocess
import sys
from dataclasses import replace

import pytest

from analysis import blocks as mb
from analysis import h3 as matrix_h3
from analysis import h4, h5, plots, sets, stats, verdicts
from analysis import matrix as ma
from benchmarks import h5_path
from test_matrix import ROOT, summary, write_summaries


def row(mean, low, high, rejected):
    return {"mean": mean, "interval": (low, high), "holm_rejected": rejected}


@pytest.mark.parametrize("rule, r, verdict", [
    ("estimate", row(-0.5, -1.9, 0.9, False), "costs no accuracy"),
    ("estimate", row(-3.0, -5.0, -1.0, True), "costs accuracy"),
    ("estimate", row(-1.0, -1.1, -0.9, True), "costs accuracy (Holm), and costs no accuracy (the 2-point margin)"),
    ("estimate", row(-0.5, -2.0, 0.9, False), "not resolved"),                 # above -2 is strict
    ("estimate", row(-1.0, -2.5, 0.5, False), "not resolved"),
    ("gain", row(3.0, 1.0, 5.0, True), "supported"),
    ("gain", row(0.5, -1.0, 1.9, False), "refuted"),
    ("gain", row(1.0, 0.5, 1.5, True), "supported (Holm), and refuted (the 2-point margin)"),
    ("gain", row(0.5, -1.0, 2.0, False), "not resolved"),                      # below +2 is strict
    ("gain", row(1.0, -1.0, 3.0, False), "not resolved"),
    ("component", row(4.0, 2.5, 6.0, True), "matters"),
    ("component", row(1.0, 0.5, 1.5, True), "matters (Holm), and matters by less than 2 points (the 2-point margin)"),
    ("component", row(-4.0, -6.0, -2.5, True), "hurts"),
    ("component", row(-1.0, -1.5, -0.5, True), "hurts (Holm), and matters by less than 2 points (the 2-point margin)"),
    ("component", row(0.1, -2.0, 1.5, False), "not resolved"),                 # within (-2, +2) is open
    ("component", row(0.1, -1.5, 1.5, False), "matters by less than 2 points"),
    ("component", row(0.1, -2.5, 2.5, False), "not resolved"),
    ("lead", row(2.0, 1.0, 3.0, True), "supported"),
    ("lead", row(-2.0, -3.0, -1.0, True), "reversed"),
    ("lead", row(2.0, -1.0, 3.0, False), "not resolved"),
])
def test_each_registered_rule_calls_its_boundary_cases(rule, r, verdict):
    assert mb.call(rule, r) == verdict


def test_the_tbd_block_on_three_same_signed_seeds_is_hurts_by_the_bootstrap_and_not_resolved_at_n():
    # three seeds, cross-fidelity 1.0, 1.5 and 0.5 points below its TBD ablation for p: the registered bootstrap p is
    # 0 (every resample's mean is negative) and its interval lies in (-2, 0); at n, the exact sign-flip p of three
    # same-signed differences is 2 / 8 and the t interval, -1 -+ 4.303 x 0.5 / sqrt(3), crosses -2
    cfg = ma.AnalysisConfig(resamples=2000)
    _, seeds, contrasts = mb.FAMILIES["tbd"]
    runs = [summary(name, seed, 50.0 + gap * (name == "cross-fidelity"))
            for seed, gap in zip(seeds, (-1.0, -1.5, -0.5)) for name in ("cross-fidelity", "cross-fidelity-ablate-tbd")]
    [p, _] = mb.family(runs, tuple(seeds), contrasts, cfg)["rows"]
    assert p["sign_flip_p"] == pytest.approx(2 / 8) and p["exact_holm_p"] == pytest.approx(min(1.0, 2 * 2 / 8))
    assert p["t_interval"] == pytest.approx((-1 - 4.303 * 0.5 / 3 ** 0.5, -1 + 4.303 * 0.5 / 3 ** 0.5), abs=1e-3)
    assert p["verdict"] == "hurts (Holm), and matters by less than 2 points (the 2-point margin)"
    assert p["verdict_at_n"] == "not resolved"
    assert p["reported"] == ("not resolved (registered: hurts (Holm), and matters by less than 2 points (the 2-point "
                             "margin))")


@pytest.mark.parametrize("registered, at_n, reported", [
    (("matters", "matters by less than 2 points"), ("matters", "matters by less than 2 points"),
     "matters (Holm), and matters by less than 2 points (the 2-point margin)"),
    (("matters", "matters by less than 2 points"), (None, "matters by less than 2 points"),
     "matters by less than 2 points (registered: matters (Holm), and matters by less than 2 points (the 2-point "
     "margin))"),
    (("hurts", None), ("matters", None), "not resolved (registered: hurts)"),      # the other sign is no agreement
    ((None, None), ("matters", None), "not resolved"),                             # at n alone says nothing
])
def test_the_reported_call_keeps_each_label_both_readings_give(registered, at_n, reported):
    assert verdicts.reported(registered, at_n, mb.call_text) == reported


def test_the_families_are_the_registrations():
    # transcribed from results/preregistration-matrix.md, blocks 2, 3, 4 and 6: (set, seeds, contrasts A - B)
    registered = {
        "estimate": ("matrix", range(1009, 1020), {("cross-fidelity-last2", "cross-fidelity", "estimate"),
                                                   ("cross-fidelity-last2", "sgt", "gain")}),
        "ablations": ("matrix", range(1009, 1015), {("cross-fidelity", "cross-fidelity-ablate-ccm", "component"),
                                                    ("cross-fidelity", "cross-fidelity-ablate-rsd", "component"),
                                                    ("cross-fidelity-adaptive", "cross-fidelity", "component"),
                                                    ("cross-fidelity", "cross-fidelity-intrinsic", "component")}),
        "hacpo": ("matrix", range(1009, 1031), {("hacpo", "sgt", "lead"), ("cross-fidelity", "hacpo", "lead")}),
        "tbd": ("matrix-trio-prose", range(1009, 1012), {("cross-fidelity", "cross-fidelity-ablate-tbd",
                                                          "component")}),
        # results/preregistration-hacpo-official.md
        "hacpo-official": ("hacpo-official", range(7001, 7028), {("hacpo-official", "sgt", "lead"),
                                                                 ("hacpo-official", "hacpo", "lead")}),
        # results/preregistration-ccm-estimate.md
        "ccm-estimate": ("ccm-estimate", range(2301, 2312), {("cross-fidelity-last0", "cross-fidelity-last2",
                                                               "estimate")}),
    }
    assert {k: (s, seeds, set(c)) for k, (s, seeds, c) in mb.FAMILIES.items()} == registered
    assert set(mb.IN_PLACE) == {"hacpo-official", "ccm-estimate"}
    assert sets.SETS["ccm-estimate"].configurations == {
        "cross-fidelity-last0": ("--share", "cross-fidelity", "--ccm-estimate", "last:0"),
        "cross-fidelity-last2": ("--share", "cross-fidelity", "--ccm-estimate", "last:2")}
    assert len(h4.H4_CELLS) == 10 and list(h4.H4_SEEDS) == [1009, 1010] and list(h5.SEEDS) == list(range(1009, 1015))


def estimate_runs(gaps, seeds, sgt=38.0):
    """The estimate block's runs: last2 = exact + the seed's gap, sgt flat at `sgt` points (p; q at half)"""
    return [run for s in seeds for run in (summary("cross-fidelity", s, 40.0),
                                           summary("cross-fidelity-last2", s, 40.0 + gaps.get(s, 0.0)),
                                           summary("sgt", s, sgt))]


def test_a_family_is_called_on_its_registered_seeds_with_holm_over_all_four_hypotheses():
    cfg = ma.AnalysisConfig(resamples=2000)
    seeds, contrasts = mb.FAMILIES["estimate"][1:]
    # last2 - exact: +1 on six seeds, -1 on five; and a seed outside the estimate block's 1009-1019 that must not count
    gaps = {s: 1.0 if s % 2 else -1.0 for s in seeds} | {1025: -50.0}
    out = mb.family(estimate_runs(gaps, [*seeds, 1025]), seeds, contrasts, cfg)
    rows = {(r["contrast"], r["policy"]): r for r in out["rows"]}
    exact = rows["cross-fidelity-last2 - cross-fidelity", "p"]
    assert exact["differences"] == pytest.approx({s: gaps[s] for s in seeds})
    assert exact["mean"] == pytest.approx(1 / 11)
    assert rows["cross-fidelity-last2 - cross-fidelity", "q"]["mean"] == pytest.approx(1 / 22)  # q's curve is half
    # last2 - sgt: +2 + gap on p, every seed positive: p = 0, Holm rejects it at alpha / 4, the family's smallest
    gain = rows["cross-fidelity-last2 - sgt", "p"]
    assert gain["p"] == 0 and gain["holm_rejected"]
    # the largest p of four is tested at alpha itself, the next at alpha / 2: Holm's adjusted p by hand
    ranked = sorted(out["rows"], key=lambda r: r["p"])
    ps = [r["p"] for r in ranked]
    assert [r["holm_p"] for r in ranked] == pytest.approx(
        [min(1, max((4 - k) * p for k, p in enumerate(ps[:i + 1]))) for i in range(4)])
    # and each row's interval at the level Holm tests it at: 0.05 / 4 for the smallest p, ..., 0.05 for the largest
    for k, r in enumerate(ranked):
        means = stats.bootstrap_means(list(r["differences"].values()), cfg.resamples, cfg.bootstrap_seed)
        assert r["holm_interval"] == pytest.approx(stats.percentile_interval(means, 1 - 0.05 / (4 - k)))
    assert out["ran"] == {"cross-fidelity-last2 - cross-fidelity": 11, "cross-fidelity-last2 - sgt": 11}
    assert out["unpaired"] == {} and out["repaired"] == []


def test_an_incomplete_family_gives_its_counts_and_no_outcome():
    cfg = ma.AnalysisConfig(resamples=200)
    seeds, contrasts = mb.FAMILIES["estimate"][1:]
    runs = [r for r in estimate_runs({}, seeds) if not (r["seed"] == 1019 and r["configuration"] == "sgt")]
    out = mb.family(runs, seeds, contrasts, cfg)
    assert out["rows"] == []
    assert out["ran"] == {"cross-fidelity-last2 - sgt": 10, "cross-fidelity-last2 - cross-fidelity": 11}
    assert mb.family([], seeds, contrasts, cfg)["rows"] == []


def test_a_seed_whose_runs_started_from_other_weights_is_left_out_named_and_restored_by_the_repair_seed():
    cfg = ma.AnalysisConfig(resamples=200)
    seeds, contrasts = mb.FAMILIES["estimate"][1:]
    gaps = {s: 1.0 for s in seeds} | {1011: -30.0, 1031: 2.0}
    runs = estimate_runs(gaps, [*seeds, 1031])
    other = next(r for r in runs if r["seed"] == 1011 and r["configuration"] == "cross-fidelity-last2")
    other["start_fingerprints"] = {"p": "elsewhere", "q": "q-s1011"}
    out = mb.family(runs, seeds, contrasts, cfg)
    rows = {(r["contrast"], r["policy"]): r for r in out["rows"]}
    # 1011 leaves both of last2's contrasts, for both policies (the runs differ in p's weights alone); 1031 is no
    # registered seed, so it counts only as a repair
    assert set(rows["cross-fidelity-last2 - cross-fidelity", "q"]["differences"]) == set(seeds) - {1011}
    assert rows["cross-fidelity-last2 - sgt", "p"]["mean"] == pytest.approx(40 + 1 - 38)   # -30 at 1011 is out
    assert {c: list(u) for c, u in out["unpaired"].items()} == {"cross-fidelity-last2 - cross-fidelity": [1011],
                                                                "cross-fidelity-last2 - sgt": [1011]}
    assert ("weights: cross-fidelity-last2 (p elsewhere, q q-s1011)"
            in out["unpaired"]["cross-fidelity-last2 - sgt"][1011])
    repaired = mb.family(runs, seeds, contrasts, cfg, repair=(1031,))
    assert repaired["repaired"] == [1031]
    assert set(rows_of(repaired)["cross-fidelity-last2 - cross-fidelity", "p"]["differences"]) == (
        set(seeds) - {1011}) | {1031}
    # the heading names the repair seed it reads beside the registered ones
    assert mb.heading("estimate", {**repaired, "set": "s", "seeds": (seeds[0], seeds[-1])}) == (
        f"## estimate (set s, registered seeds {seeds[0]}-{seeds[-1]}, and repair seed 1031)\n")
    # a repair seed not yet run in full is not read
    partial = [r for r in runs if not (r["seed"] == 1031 and r["configuration"] == "sgt")]
    assert mb.family(partial, seeds, contrasts, cfg, repair=(1031,))["repaired"] == []
    # as published: every seed paired as it ran
    published = mb.family(runs, seeds, contrasts, replace(cfg, pair_by_start=False))
    assert set(rows_of(published)["cross-fidelity-last2 - sgt", "p"]["differences"]) == set(seeds)
    assert published["unpaired"] == {}


def test_a_contrast_left_with_one_paired_seed_is_named_not_tested_and_counts_at_p_1_in_holms_family():
    cfg = ma.AnalysisConfig(resamples=200)
    seeds, contrasts = mb.FAMILIES["estimate"][1][:2], mb.FAMILIES["estimate"][2]
    runs = estimate_runs({s: 1.0 for s in seeds}, seeds)
    moved = next(r for r in runs if r["seed"] == seeds[0] and r["configuration"] == "cross-fidelity-last2")
    moved["start_fingerprints"] = {"p": "elsewhere", "q": "q-elsewhere"}
    out = mb.family(runs, seeds, contrasts, cfg)        # both of last2's contrasts keep one seed each
    assert out["rows"] == [] and out["at_cost"] == [] and len(out["missing"]) == 4
    assert "cross-fidelity-last2 - sgt (p)" in out["missing"]
    text = mb.markdown({"families": {"estimate": {**out, "set": "s", "seeds": (seeds[0], seeds[-1]), "seconds": {}}},
                        "h4": {"table": [], "claims": [], "cells": {}}, "h5": [],
                        "h3": matrix_h3.analyze({}, cfg)})
    assert "Fewer than two paired seeds, so not tested" in text and "Incomplete" not in text
    # the other contrast, still paired on three seeds, is tested against a family of two
    three = mb.FAMILIES["estimate"][1][:3]
    runs = estimate_runs({s: 1.0 for s in three}, three)
    for r in runs:
        if r["seed"] != three[0] and r["configuration"] == "sgt":
            r["start_fingerprints"] = {"p": "elsewhere", "q": "q-elsewhere"}
    out = mb.family(runs, three, contrasts, cfg)
    assert {(r["contrast"], r["policy"]) for r in out["rows"]} == {
        ("cross-fidelity-last2 - cross-fidelity", "p"), ("cross-fidelity-last2 - cross-fidelity", "q")}
    ranked = sorted(out["rows"], key=lambda r: r["p"])
    assert ranked[0]["holm_p"] == pytest.approx(min(1, 4 * ranked[0]["p"]))     # 2 tested + 2 absent at p = 1


def rows_of(family):
    return {(r["contrast"], r["policy"]): r for r in family["rows"]}


def test_a_called_family_gives_its_contrasts_at_equal_cost_read_to_the_cheaper_runs_spend():
    # last2 rises from 0 to 60 points over its 1,000 of each cost, exact is flat at 30 over 500: their AUCs are equal
    # (30 and 30), but read to 500 of a cost, where last2 is at iteration 50, last2's area is 15 (a line to 30)
    cfg = ma.AnalysisConfig(resamples=200)
    seeds, contrasts = mb.FAMILIES["estimate"][1:]
    runs = [*(summary("cross-fidelity", s, 30.0, cost=500.0) for s in seeds),
            *(summary("sgt", s, 30.0, cost=500.0) for s in seeds)]
    for s in seeds:
        last2 = summary("cross-fidelity-last2", s, 0.0, cost=1000.0)
        last2["policies"]["p"]["heldout"] = [[0, 0.0], [50, 0.3], [100, 0.6]]
        runs.append(last2)
    out = mb.family(runs, seeds, contrasts, cfg)
    auc = {(r["contrast"], r["policy"]): r["mean"] for r in out["rows"]}
    at_cost = {(r["contrast"], r["policy"]): r for r in out["at_cost"]}
    assert auc["cross-fidelity-last2 - cross-fidelity", "p"] == pytest.approx(0.0)
    for view in mb.COST_VIEWS:
        row = at_cost["cross-fidelity-last2 - cross-fidelity", "p"][view]
        assert row["mean"] == pytest.approx(15.0 - 30.0) and row["interval"] == pytest.approx((-15.0, -15.0))
    # admissions: the curated runs' diagnostics averaged over seeds, and none for SGT, which has no curator
    offered = {s: 10.0 + s - 1009 for s in seeds}                      # 10 .. 20, mean 15
    for r in runs:
        if r["configuration"] != "sgt":
            for m in r["policies"].values():
                m["crossed"] = {"sharing/received": 3.0, "fidelity/offered": offered[r["seed"]],
                                "fidelity/d_mean": 0.25}
    out = mb.family(runs, seeds, contrasts, cfg)
    got = {(name, policy): a for name, policy, a in out["admission"]}
    assert set(got) == {(c, p) for c in ("cross-fidelity-last2", "cross-fidelity") for p in ("p", "q")}
    assert got["cross-fidelity", "q"]["fidelity/offered"][0] == pytest.approx(15.0)
    assert got["cross-fidelity", "q"]["fidelity/d_mean"] == pytest.approx((0.25, 0.0))
    text = mb.markdown(mb.analyze({"matrix": [{**r, "iteration_s": 1.0} for r in runs]}, cfg))
    assert "| cross-fidelity | p | 15.00 ± 3.32 | — |" in text
    # described beside the calls, never called: its table has no verdict column
    assert ("| cross-fidelity-last2 - cross-fidelity | p | -15.00 [-15.00, -15.00] | -15.00 [-15.00, -15.00] |\n"
            in text)


def directions(terms_by_direction):
    return {d: {"diagnosed": 10, "terms": t, "dominant": {}} for d, t in terms_by_direction.items()}


def h4_sets(table_for, seeds=(1009, 1010, 1011)):
    """Every H4 cell's runs on `seeds` (1011 is not one of H4's), each direction's terms table_for(pair)[d] times
    the seed's scale (1, 3, 100)"""
    sets = {}
    for pair, form, measure, set_name, name in h4.H4_CELLS:
        for seed in seeds:
            s = summary(name, seed, 40.0)
            scale = {1009: 1.0, 1010: 3.0, 1011: 100.0}[seed]
            s["directions"] = directions({d: {k: v * scale for k, v in terms.items()}
                                          for d, terms in table_for(pair).items()})
            sets.setdefault(set_name, []).append(s)
    return sets


QQ = {"qwen-a->qwen-b": {"tbd": 0.01, "ccm": 0.30, "rsd": 0.20}, "qwen-b->qwen-a": {"tbd": 0.0, "ccm": 0.1, "rsd": 0.2}}
CROSS = {"qwen->llama": {"tbd": 0.5, "ccm": 0.2, "rsd": 0.1}, "llama->qwen": {"tbd": 0.4, "ccm": 0.6, "rsd": math.nan}}


def test_h4_averages_each_direction_over_seeds_and_calls_each_claim_by_the_share_it_dominates():
    sets = h4_sets(lambda pair: QQ if pair == "qwen-qwen" else CROSS)
    result = h4.analyze(sets)
    assert len(result["table"]) == 20                                       # 10 cells x 2 directions
    assert result["cells"]["trio prose credit"] == [1009, 1010] and len(result["cells"]) == 10
    by = {(r["pair"], r["form"], r["measure"], r["direction"]): r for r in result["table"]}
    ab = by["qwen-qwen", "line", "credit", "qwen-a->qwen-b"]
    assert ab["terms"]["ccm"] == pytest.approx(0.30 * 2) and ab["seeds"] == 2   # (1 + 3) / 2; 1011 not read
    assert ab["dominant"] == "ccm" and by["qwen-qwen", "prose", "hidden", "qwen-b->qwen-a"]["dominant"] == "rsd"
    assert by["trio", "prose", "credit", "llama->qwen"]["dominant"] == "ccm"    # a NaN term never dominates
    claims = {c["claim"]: c for c in result["claims"]}
    assert claims["same family mainly CCM"]["verdict"] == "refuted" and claims["same family mainly CCM"]["share"] == 0.5
    cross = claims["cross family mainly TBD"]
    assert cross["verdict"] == "refuted" and cross["directions"] == 12
    # TBD measured on one seed only (NaN on the other) is that seed's value, and dominates
    for s in sets["matrix"]:
        s["directions"]["llama->qwen"]["terms"]["tbd"] = math.nan if s["seed"] == 1009 else 5.0
    row = next(r for r in h4.analyze(sets)["table"] if r["pair"] == "qwen-llama" and r["measure"] == "credit"
               and r["form"] == "line" and r["direction"] == "llama->qwen")
    assert row["terms"]["tbd"] == pytest.approx(5.0) and row["dominant"] == "tbd"
    # TBD now dominates qwen->llama in all six cross-family cells and llama->qwen in the two of set matrix: 8 of 12
    assert {c["claim"]: c["verdict"] for c in h4.analyze(sets)["claims"]}["cross family mainly TBD"] == "mixed"


def test_h4_reports_a_claims_call_only_where_each_seed_alone_repeats_it():
    sets = h4_sets(lambda pair: QQ if pair == "qwen-qwen" else CROSS)
    claims = {c["claim"]: c for c in h4.analyze(sets)["claims"]}
    assert claims["cross family mainly TBD"]["per_seed"] == {1009: "refuted", 1010: "refuted"}
    assert claims["cross family mainly TBD"]["reported"] == "refuted"
    # TBD far above the rest in llama->qwen on seed 1010 alone, in every cross-family cell: over both seeds TBD
    # dominates all 12 cross-family directions ("supported"), seed 1010 alone too, but seed 1009 alone only 6
    for name in ("matrix", "matrix-h4-trio-line", "matrix-trio-prose", "matrix-h4-qwen-llama-prose"):
        for s in sets[name]:
            if s["seed"] == 1010:
                s["directions"]["llama->qwen"]["terms"]["tbd"] = 50.0
    cross = {c["claim"]: c for c in h4.analyze(sets)["claims"]}["cross family mainly TBD"]
    assert cross["verdict"] == "supported" and cross["per_seed"] == {1009: "refuted", 1010: "supported"}
    assert cross["reported"] == "not resolved (registered: supported)"


def test_h4_names_a_tie_and_waits_for_every_cell_on_both_seeds():
    tie = {"qwen-a->qwen-b": {"tbd": 0.0, "ccm": 0.2, "rsd": 0.2},
           "qwen-b->qwen-a": {"tbd": 0.0, "ccm": 0.3, "rsd": 0.1}}
    sets = h4_sets(lambda pair: tie if pair == "qwen-qwen" else CROSS)
    result = h4.analyze(sets)
    assert {r["dominant"] for r in result["table"] if r["direction"] == "qwen-a->qwen-b"} == {"tie: ccm, rsd"}
    assert {c["claim"]: c["share"] for c in result["claims"]}["same family mainly CCM"] == 0.5
    sets["matrix-h4-trio-line"] = [s for s in sets["matrix-h4-trio-line"] if s["seed"] != 1010]
    result = h4.analyze(sets)
    assert result["table"] == [] and {c["verdict"] for c in result["claims"]} == {"incomplete"}
    assert result["cells"]["trio line credit"] == [1009] and result["cells"]["qwen-qwen line hidden"] == [1009, 1010]


def plane_run(name, seed, received, variance):
    s = summary(name, seed, 40.0, crossed={"sharing/received": received})
    for m in s["policies"].values():
        m["reward_variance"] = variance
    return s


def test_h5_calls_adaptive_curation_by_dominance_in_the_plane_once_every_level_ran_on_every_seed():
    cfg = ma.AnalysisConfig(resamples=2000)
    seeds = range(1009, 1015)
    base = [plane_run(name, s, received, variance) for s in seeds
            for name, received, variance in (("prp", 2.0 + s % 2, 0.030), ("xgrpo", 5.0 + s % 2, 0.030))]
    sgt = [plane_run("sgt", s, 9.0 + s % 2, 0.025 + 0.001 * (s % 2)) for s in seeds]
    assert h5.analyze(base + sgt, cfg)[0] == {"policy": "p", "points": [], "gaps": [], "path": [], "verdict":
                                         "incomplete: cross-fidelity-adaptive on 0 of 6 seeds"}
    # adaptive receives more than prp with less variance, seed by seed: it dominates prp, and no level dominates it
    adaptive = [plane_run(h5.ADAPTIVE, s, 4.0 + s % 2, 0.022 + 0.001 * (s % 3)) for s in seeds]
    assert h5.analyze(base + sgt + adaptive[1:], cfg)[0]["verdict"].startswith(
        "incomplete: cross-fidelity-adaptive on 5")
    [p, q] = h5.analyze(base + sgt + adaptive, cfg)
    assert p["verdict"] == q["verdict"] == "supported (dominates prp)"
    point = {x["configuration"]: x for x in p["points"]}["prp"]
    assert point["received"][0] == pytest.approx(2.5) and point["received"][1] <= 2.5 <= point["received"][2]
    assert point["variance"] == pytest.approx((0.030, 0.030, 0.030))
    # prp less adaptive, seed by seed: received -2 on every seed, variance 0.030 - (0.022 + 0.001 * (s % 3)), all
    # six above 0, so the exact sign-flip p is 2 / 2^6
    gap = {g["configuration"]: g for g in p["gaps"]}["prp"]
    assert gap["seeds"] == 6 and gap["received"] == pytest.approx((-2.0, -2.0, -2.0))
    by_hand = [0.030 - (0.022 + 0.001 * (s % 3)) for s in seeds]
    assert gap["variance"][0] == pytest.approx(sum(by_hand) / 6)
    assert min(by_hand) <= gap["variance"][1] <= gap["variance"][0] <= gap["variance"][2] <= max(by_hand)
    assert gap["variance_sign_flip_p"] == pytest.approx(2 / 64)
    # one that receives less than xgrpo and sgt, each seed, with more variance than both is dominated by both
    worse = [plane_run(h5.ADAPTIVE, s, 3.0 + s % 2, 0.032 + 0.001 * (s % 3)) for s in seeds]
    assert h5.analyze(base + sgt + worse, cfg)[0]["verdict"] == "refuted (dominated by xgrpo, sgt)"
    # more received than prp on average (+1) but not seed by seed (+3, -1, ...): its interval holds 0, no dominance
    mixed = [plane_run(h5.ADAPTIVE, s, 2.0 + s % 2 + (3.0 if s % 2 else -1.0), 0.020) for s in seeds]
    assert h5.analyze(base + sgt + mixed, cfg)[0]["verdict"] == "not resolved"
    assert h5.analyze(base + sgt + adaptive, cfg, ["ablations"])[0] == {
        "policy": "p", "points": [], "gaps": [], "path": [], "verdict": "waits for block ablations"}


def test_h5_at_n_needs_each_difference_exact_sign_flip_p_at_most_alpha_and_reports_only_what_both_readings_give():
    gap = {"seeds": 6, "received": (1.0, 0.5, 1.5), "variance": (-0.01, -0.02, -0.001)}
    # every sign shared in both: each exact p is 2 / 2^6, below 0.05; one flipped sign leaves 6 of 64 as far out
    assert h5.dominates(gap) and h5.dominates_at_n({**gap, "received_sign_flip_p": 2 / 64,
                                                   "variance_sign_flip_p": 2 / 64}, 0.05)
    assert not h5.dominates_at_n({**gap, "received_sign_flip_p": 2 / 64, "variance_sign_flip_p": 4 / 64}, 0.05)
    assert not h5.dominates_at_n({**gap, "variance": (0.01, 0.001, 0.02), "received_sign_flip_p": 2 / 64,
                                  "variance_sign_flip_p": 2 / 64}, 0.05)      # less variance is the wrong sign
    cfg = ma.AnalysisConfig(resamples=2000)
    seeds = range(1009, 1015)
    levels = [plane_run(name, s, received + s % 2, 0.030) for s in seeds
              for name, received in (("prp", 2.0), ("xgrpo", 5.0), ("sgt", 9.0))]
    # adaptive's variance below prp's on five seeds, above on one: the bootstrap interval of the gap can exclude 0
    # while the exact p of the variances, (2 + 2 x 1) / 64 on these values, cannot go under 0.05
    variance = {1009: 0.020, 1010: 0.021, 1011: 0.022, 1012: 0.023, 1013: 0.024, 1014: 0.0305}
    adaptive = [plane_run(h5.ADAPTIVE, s, 4.0 + s % 2, variance[s]) for s in seeds]
    [p, _] = h5.analyze(levels + adaptive, cfg)
    prp = {g["configuration"]: g for g in p["gaps"]}["prp"]
    differences = [0.030 - variance[s] for s in seeds]
    naive = sum(abs(sum(x * d for x, d in zip(signs, differences))) >= abs(sum(differences)) - 1e-12
                for signs in itertools.product((1, -1), repeat=6)) / 64
    assert prp["variance_sign_flip_p"] == pytest.approx(naive) and naive > 0.05
    assert p["verdict"] == "supported (dominates prp)" and p["verdict_at_n"] == "not resolved"
    assert p["reported"] == "not resolved (registered: supported (dominates prp))"


def test_h5_compares_levels_over_the_seeds_paired_by_start_and_never_over_one():
    cfg = ma.AnalysisConfig(resamples=500)
    seeds = range(1009, 1015)
    levels = [plane_run(name, s, received + s % 2, 0.030) for s in seeds
              for name, received in (("prp", 2.0), ("xgrpo", 5.0), ("sgt", 9.0))]
    adaptive = [plane_run(h5.ADAPTIVE, s, 4.0 + s % 2, 0.020) for s in seeds]
    moved = next(r for r in levels if r["seed"] == 1009 and r["configuration"] == "prp")
    moved["start_fingerprints"] = {"p": "elsewhere", "q": "q-elsewhere"}
    moved["policies"]["p"]["crossed"]["sharing/received"] = 1000.0     # would swamp the gap were it paired
    [p, _] = h5.analyze(levels + adaptive, cfg)
    gap = {g["configuration"]: g for g in p["gaps"]}["prp"]
    assert gap["seeds"] == 5 and gap["received"] == pytest.approx((-2.0, -2.0, -2.0))
    assert p["verdict"] == "supported (dominates prp)"
    # left with one paired seed, a gap has no interval and dominates nothing
    for r in levels:
        if r["configuration"] == "prp" and r["seed"] != 1010:
            r["start_fingerprints"] = {"p": "elsewhere", "q": "q-elsewhere"}
    [p, _] = h5.analyze(levels + adaptive, cfg)
    gap = {g["configuration"]: g for g in p["gaps"]}["prp"]
    assert gap == {"configuration": "prp", "seeds": 1} and not h5.dominates({"seeds": 1})
    assert p["verdict"] == "not resolved"


def test_a_computed_h5_is_reported_with_its_points_and_drawn_once_the_blocks_it_reads_are_complete(tmp_path,
                                                                                                  monkeypatch):
    seeds = range(1009, 1015)
    runs = [plane_run(name, s, received + s % 2, 0.03 - 0.001 * (s % 2)) for s in seeds
            for name, received in (("prp", 2.0), ("xgrpo", 5.0), ("sgt", 9.0), (h5.ADAPTIVE, 4.0))]
    for r in runs:
        r["iteration_s"] = 400.0
    write_summaries(tmp_path / "matrix", runs)
    cfg = ma.AnalysisConfig(resamples=500)
    text = mb.report(tmp_path, cfg)
    assert "- p: waits for block estimate, ablations" in text and "received" not in text.split("## H5")[1]
    assert not (tmp_path / "matrix" / "h5-plane.png").exists()
    monkeypatch.setattr(mb, "H5_WAITS", ())
    text = mb.report(tmp_path, cfg)
    assert "  - prp: received 2.50 [" in text and "reward variance 0.0295 [" in text
    assert f"  - prp less {h5.ADAPTIVE}, paired over 6 seeds: received -2.00 [-2.00, -2.00], reward variance " \
           "+0.00000 [+0.00000, +0.00000] (exact sign-flip p: received 0.031, variance 1.000)" in text
    assert (tmp_path / "matrix" / "h5-plane.png").stat().st_size > 0


def test_a_window_point_is_the_mean_received_and_the_reward_variance_within_the_window_by_hand():
    # windows [1, 1 | 3, 3] and rewards [0, 1 | 1, 3]: half the mean squared step, (1 - 0)^2 / 2 and (3 - 1)^2 / 2
    assert h5.window_points([1.0, 1.0, 3.0, 3.0], [0.0, 1.0, 1.0, 3.0], windows=2) == [(1.0, 0.5), (3.0, 2.0)]
    for received, rewards in (([1.0] * 6, [0.0] * 6), ([1.0] * 8, [0.0] * 7)):   # 4 windows of 1.5, unequal
        with pytest.raises(ValueError, match="equal windows"):
            h5.window_points(received, rewards)


def run_dir_of(tmp_path, rewards, received):
    """A run directory whose metrics.jsonl logs, per iteration and policy, a training reward and what it received"""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    lines = [{"iteration": i + 1, "policy": policy, "charts/reward_mean": rewards[policy][i],
              **({"sharing/received": received[policy][i]} if i < len(received[policy]) else {})}
             for i in range(len(rewards["p"])) for policy in rewards]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_a_runs_record_keeps_what_it_received_each_iteration_and_refuses_a_run_that_is_not_the_summarized_one(
        tmp_path):
    s = summary(h5.ADAPTIVE, 1009, 40.0)
    rewards = {"p": [0.1, 0.3], "q": [0.1, 0.3]}
    run = run_dir_of(tmp_path, rewards, {"p": [4.0, 6.0], "q": [2.0, 0.0]})
    write_summaries(tmp_path, [s])
    written = h5_path.main([str(run), str(tmp_path / f"{h5.ADAPTIVE}-s1009.json")])
    assert written.name == f"{h5.ADAPTIVE}-s1009.received.json" and not ma.is_summary(written)
    assert json.loads(written.read_text()) == {"configuration": h5.ADAPTIVE, "seed": 1009, "commits": ["c1"],
                                               "received": {"p": [4.0, 6.0], "q": [2.0, 0.0]}}
    other = run_dir_of(tmp_path, {"p": [0.1, 0.4], "q": [0.1, 0.3]}, {"p": [4.0, 6.0], "q": [2.0, 0.0]})
    with pytest.raises(ValueError, match="not the run summarized"):
        h5_path.received_record(other, s)
    short = run_dir_of(tmp_path, rewards, {"p": [4.0, 6.0], "q": [2.0]})
    with pytest.raises(ValueError, match="at 1 of its 2 iterations"):
        h5_path.received_record(short, s)


def test_h5_draws_adaptive_curations_path_window_by_window_once_every_seeds_record_is_in(tmp_path):
    cfg = ma.AnalysisConfig(resamples=500)
    seeds = range(1009, 1015)
    levels = [plane_run(name, s, received, 0.03) for s in seeds
              for name, received in (("prp", 2.0), ("xgrpo", 5.0), ("sgt", 9.0))]
    adaptive = {s: plane_run(h5.ADAPTIVE, s, 4.0, 0.02) for s in seeds}
    for s, run in adaptive.items():       # 8 iterations, windows of 2: each window one step of size s - 1008
        for m in run["policies"].values():
            m["reward_mean"] = [0.0, (s - 1008) / 10] * 4
    # received per iteration: seed k (1..6) gets k in window w's first iteration and k + w in its second
    records = {s: {"configuration": h5.ADAPTIVE, "seed": s, "commits": ["c1"],
                   "received": {p: [v for w in range(4) for v in (s - 1008, s - 1008 + w)] for p in ("p", "q")}}
               for s in seeds}
    missing = {s: r for s, r in records.items() if s != 1012}
    [p, _] = h5.analyze(levels + list(adaptive.values()), cfg, records=missing)
    assert p["points"] and p["path"] == []
    [p, _] = h5.analyze(levels + list(adaptive.values()), cfg, records=records)
    mean_k = sum(range(1, 7)) / 6
    mean_variance = sum((k / 10) ** 2 / 2 for k in range(1, 7)) / 6
    for w, window in enumerate(p["path"]):
        assert window["window"] == w + 1
        assert window["received"][0] == pytest.approx(mean_k + w / 2)
        assert window["received"][1] <= window["received"][0] <= window["received"][2]
        assert window["variance"][0] == pytest.approx(mean_variance)
    records[1010]["commits"] = ["c9"]
    with pytest.raises(ValueError, match="rewrite it from the summarized run"):
        h5.analyze(levels + list(adaptive.values()), cfg, records=records)
    records[1010]["commits"] = ["c1"]
    for s, r in records.items():
        (tmp_path / "matrix").mkdir(exist_ok=True)
        (tmp_path / "matrix" / f"{h5.ADAPTIVE}-s{s}.received.json").write_text(json.dumps(r))
    assert h5.load_records(tmp_path / "matrix") == records
    result = h5.analyze(levels + list(adaptive.values()), cfg, records=records)
    text = mb.markdown({"families": {}, "h4": {"table": [], "cells": {}, "claims": []}, "h5": result,
                        "h3": matrix_h3.analyze({}, cfg)})
    assert f"  - {h5.ADAPTIVE}'s path over 4 windows of its iterations: 1: received {mean_k:.2f} [" in text
    plots.h5_plane(result, tmp_path / "plane.png")
    assert (tmp_path / "plane.png").stat().st_size > 0


def test_eval_blocks_calls_a_complete_block_hides_an_incomplete_one_and_reads_every_folders_declarations(tmp_path):
    runs = [summary(name, s, auc) for s in (1009, 1010, 1011) for name, auc in (("hacpo", 42.0 + s - 1009),
                                                                                ("sgt", 40.0))]
    for r in runs:
        r["iteration_s"] = 500.0 + r["seed"] - 1009 if r["configuration"] == "hacpo" else 400.0
    write_summaries(tmp_path / "matrix", runs)
    # block 6 complete, its runs at two commits that only results/matrix's declaration makes one class
    trio = [{**summary(name, s, auc + (s - 1009) * (name == "cross-fidelity"), [commit]), "iteration_s": 900.0}
            for s, commit in ((1009, "c1"), (1010, "c2"), (1011, "c2"))
            for name, auc in (("cross-fidelity", 41.0), ("cross-fidelity-ablate-tbd", 40.0))]
    write_summaries(tmp_path / "matrix-trio-prose", trio)
    write_summaries(tmp_path / "matrix-main", [summary("sgt", 1009, 10.0, ["c0"])])    # block 1's: read by the repair
    command = [sys.executable, str(ROOT / "eval.py"), "--blocks", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "not declared metric-equivalent" in done.stderr
    (tmp_path / "matrix" / ma.EQUIVALENCE_FILE).write_text("c1 c2  # checked by same_metrics\n")
    for _ in range(2):                                  # a second analysis does not take the first's output for a run
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "matrix" / "blocks.json").read_text())
    tbd = {r["policy"]: r for r in result["families"]["tbd"]["rows"]}
    assert tbd["p"]["contrast"] == "cross-fidelity - cross-fidelity-ablate-tbd"
    assert tbd["p"]["differences"] == {"1009": 1.0, "1010": 2.0, "1011": 3.0}
    # every difference positive (p = 0, Holm rejects both); p's interval reaches +3, q's (half) +1.5
    assert tbd["p"]["verdict"] == "matters"
    assert tbd["q"]["verdict"] == "matters (Holm), and matters by less than 2 points (the 2-point margin)"
    hacpo = result["families"]["hacpo"]
    assert hacpo["rows"] == [] and hacpo["ran"]["hacpo - sgt"] == 3
    assert hacpo["ran"]["cross-fidelity - hacpo"] == 0
    assert "seeds run so far: hacpo - sgt 3, cross-fidelity - hacpo 0." in done.stdout
    assert "+2.00" not in done.stdout.split("## hacpo")[1].split("##")[0]          # no outcome of an open block
    assert ("Training seconds per seed (not tested): hacpo 1009 500, 1010 501, 1011 502; sgt 1009 400, 1010 400, "
            "1011 400.") in done.stdout
    written = [(tmp_path / "matrix" / name).read_text() for name in ("blocks.md", "review.md")]
    assert "\n".join(written) == done.stdout.rstrip("\n") + "\n"
    assert "| 6 | cross-fidelity - cross-fidelity-ablate-tbd (p) | +2.00 [+1.00, +3.00], 3 seeds" in written[1]


def test_only_files_named_as_run_summaries_are_read_as_runs():
    assert ma.is_summary("cross-fidelity-last2-s1009.json") and ma.is_summary("results/matrix/sgt-s7.json")
    assert not any(ma.is_summary(name) for name in ("blocks.json", "analysis.json", "sgt-s1009.json.tmp",
                                                   "sgt-sx.json", "s1009.json"))


def test_the_matrix_folders_declaration_holds_for_a_set_even_where_the_matrix_folder_holds_no_run(tmp_path):
    write_summaries(tmp_path / "matrix-trio-prose", [summary("cross-fidelity", 1009, 40.0, ["c1"]),
                                                     summary("cross-fidelity", 1010, 40.0, ["c2"])])
    with pytest.raises(ValueError, match="not declared metric-equivalent"):
        mb.load_sets(tmp_path)
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / ma.EQUIVALENCE_FILE).write_text("c1 c2\n")
    assert sorted(mb.load_sets(tmp_path)) == ["matrix-trio-prose"]


def test_the_repair_gives_each_affected_verdict_as_published_paired_and_repaired():
    from analysis import review as matrix_review
    cfg = ma.AnalysisConfig(resamples=200)
    gaps = {1009: 1.0, 1010: -20.0, 1011: 2.0, 1031: 3.0}
    runs = [summary(name, s, 40.0 + gaps[s] * (name == "cross-fidelity"))
            for s in gaps for name in ("cross-fidelity", "cross-fidelity-ablate-tbd")]
    next(r for r in runs if r["seed"] == 1010)["start_fingerprints"] = {"p": "elsewhere", "q": "elsewhere"}
    rows = {r["question"]: r for r in matrix_review.block6(runs, cfg)}
    p = rows["cross-fidelity - cross-fidelity-ablate-tbd (p)"]
    assert p["as published"].startswith(f"{(1 - 20 + 2) / 3:+.2f} [") and ", 3 seeds" in p["as published"]
    assert p["paired seeds alone"].startswith("+1.50 [+1.00, +2.00], 2 seeds")
    assert p["with the repair"].startswith("+2.00 [+1.00, +3.00], 3 seeds")
    without_repair = matrix_review.block6([r for r in runs if r["seed"] != 1031], cfg)
    assert all("with the repair" not in r for r in without_repair)
    assert ("| 6 | cross-fidelity - cross-fidelity-ablate-tbd (p) | "
            in "\n".join(matrix_review.markdown(without_repair, [])))
    assert "not yet run |" in "\n".join(matrix_review.markdown(without_repair, []))


OFF = (7005, 7029)
"""seeds a test leaves unread: each configuration's runs there are far off its level and its sharing"""


def official_runs(seeds, lead=None):
    """hacpo-official's runs: hacpo-official at 40 + the seed's lead (1 unless given), hacpo at 40.5, sgt at 39 (p;
    q at half), hacpo at 90 on the OFF seeds; each run received per iteration what its configuration says (10 times
    that on the OFF seeds), sgt logged no sharing/accepted"""
    lead = lead or {}
    crossed = {"hacpo-official": {"sharing/received": 8.0, "sharing/accepted": 6.0},
               "hacpo": {"sharing/received": 5.0, "sharing/accepted": 4.0}, "sgt": {"sharing/received": 2.0}}
    points = {"hacpo-official": lambda s: 40.0 + lead.get(s, 1.0), "hacpo": lambda s: 90.0 if s in OFF else 40.5,
              "sgt": lambda s: 39.0}
    return [summary(name, s, points[name](s), crossed={k: v * (10 if s in OFF else 1)
                                                        for k, v in crossed[name].items()})
            for s in seeds for name in points]


def test_hacpo_official_replaces_an_unpaired_seed_whole_by_owed_fresh_seeds_and_waits_for_them():
    cfg = ma.AnalysisConfig(resamples=200)
    seeds, contrasts = mb.FAMILIES["hacpo-official"][1:]
    extras = dict(in_place=True, described=mb.DESCRIBED["hacpo-official"], sharing=mb.SHARING["hacpo-official"])
    runs = official_runs([*seeds, 7028, 7029], lead={7005: 30.0, 7028: 3.0, 7029: 55.0})
    moved = next(r for r in runs if r["seed"] == 7005 and r["configuration"] == "sgt")
    moved["start_fingerprints"] = {"p": "elsewhere", "q": "q-s7005"}

    def without(*gone):
        return [r for r in runs if (r["configuration"], r["seed"]) not in gone]
    # seed 7005's sgt run started elsewhere: 7005 leaves every contrast, also hacpo-official - hacpo whose runs pair
    waiting = mb.family(without(("hacpo", 7028)), tuple(seeds), contrasts, cfg, **extras)
    assert waiting["rows"] == [] and waiting["repair"] == [7028] and waiting["repaired"] == []
    assert list(waiting["unpaired"]) == ["every contrast"] and list(waiting["unpaired"]["every contrast"]) == [7005]
    assert "sgt (p elsewhere, q q-s7005)" in waiting["unpaired"]["every contrast"][7005]
    text = mb.unpaired_lines(waiting["unpaired"], waiting["repaired"], waiting["repair"], True)
    assert text[-1] == "Owed in place of the unpaired: fresh seed 7028 run in full; not yet all in, so not called."
    # a repair (results/preregistration-repair.md) holds no call back: the paired seeds are called meanwhile
    assert mb.unpaired_lines({}, [], [1031], False) == [
        "Repair (results/preregistration-repair.md): fresh seed 1031 run in full; not yet in."]
    # 7028 in full and paired: called on 7001-7027 less 7005, and 7028; 7029, owed by nothing, is not read
    called = mb.family(runs, tuple(seeds), contrasts, cfg, **extras)
    rows = rows_of(called)
    read = sorted(set(seeds) - {7005} | {7028})
    for contrast in ("hacpo-official - sgt", "hacpo-official - hacpo"):
        assert sorted(rows[contrast, "p"]["differences"]) == read
    assert rows["hacpo-official - sgt", "p"]["mean"] == pytest.approx((26 * 2.0 + 4.0) / 27)
    assert rows["hacpo-official - hacpo", "q"]["mean"] == pytest.approx((26 * 0.25 + 1.25) / 27)   # q's curve is half
    assert rows["hacpo-official - sgt", "p"]["sd"] == pytest.approx(statistics.stdev([2.0] * 26 + [4.0]))
    assert called["repaired"] == [7028]
    # the described contrast on the same seeds, outside Holm's family of 4; what each configuration received
    assert [(r["contrast"], r["policy"]) for r in called["described"]] == [("hacpo - sgt", "p"), ("hacpo - sgt", "q")]
    assert called["described"][0]["mean"] == pytest.approx(1.5) and "holm_p" not in called["described"][0]
    assert len(called["rows"]) == 4 and all("holm_p" in r for r in called["rows"])
    sharing = {(r["configuration"], r["policy"]): r for r in called["sharing"]}
    assert sharing["hacpo-official", "q"]["sharing/received"] == (8.0, 0.0)          # the OFF seeds' 80 unread
    assert sharing["hacpo", "p"]["sharing/accepted"] == (4.0, 0.0)
    assert sharing["sgt", "p"]["sharing/accepted"] is None and sharing["sgt", "p"]["sharing/received"] == (2.0, 0.0)
    result = mb.analyze({"hacpo-official": runs}, cfg)          # the block as eval.py --blocks reads it
    assert [r["differences"] for r in result["families"]["hacpo-official"]["rows"]] == [
        r["differences"] for r in called["rows"]]
    text = mb.markdown(result)
    assert "| hacpo - sgt | p | +1.50 | 0.00 | [+1.50, +1.50] |" in text
    assert "| sgt | p | — | 2.00 ± 0.00 |" in text and "| hacpo-official | q | 6.00 ± 0.00 | 8.00 ± 0.00 |" in text
    assert "| hacpo-official - sgt | p | 7001: +2.00 " in text and f"| {(26 * 2.0 + 4.0) / 27:+.2f} | 0.38 |" in text
    # a fresh seed found unpaired owes the next one in turn
    next(r for r in runs if r["seed"] == 7028 and r["configuration"] == "hacpo")["start_fingerprints"] = {
        "p": "p-s7028", "q": "elsewhere"}
    again = mb.family(runs, tuple(seeds), contrasts, cfg, **extras)
    assert again["repair"] == [7028, 7029] and list(again["unpaired"]["every contrast"]) == [7005, 7028]
    assert sorted(rows_of(again)["hacpo-official - hacpo", "p"]["differences"]) == sorted(set(read) - {7028} | {7029})
    # pairing by start off (as the matrix published before it), nothing is owed and every registered seed is read
    plain = mb.family(runs, tuple(seeds), contrasts, replace(cfg, pair_by_start=False), **extras)
    assert plain["repair"] == [] and sorted(rows_of(plain)["hacpo-official - sgt", "p"]["differences"]) == list(seeds)


def test_a_set_registered_on_its_own_is_read_only_at_its_registered_commit_or_one_declared_equivalent(tmp_path):
    registered = mb.REGISTERED_AT["hacpo-official"]
    write_summaries(tmp_path / "matrix", [summary("sgt", 1009, 40.0, ["m1"])])
    write_summaries(tmp_path / "hacpo-official", official_runs([7001, 7002]))        # at summary()'s "c1"
    with pytest.raises(ValueError, match=f"set hacpo-official ran at \\['c1'\\], not at its registered "
                                         f"{registered[:7]}"):
        mb.load_sets(tmp_path)
    (tmp_path / "hacpo-official" / ma.EQUIVALENCE_FILE).write_text(f"{registered} c1  # same_metrics\n")
    assert len(mb.load_sets(tmp_path)["hacpo-official"]) == 6
    write_summaries(tmp_path / "hacpo-official", [summary("sgt", 7003, 39.0, [registered])])
    assert len(mb.load_sets(tmp_path)["hacpo-official"]) == 7
