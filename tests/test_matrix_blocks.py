"""The matrix's blocks 2-6 (analysis/blocks.py) on summaries built by hand: each registered rule called on its
boundary cases, a family's Holm over its registered seeds alone, HACPO-official's seeds owed in place of an unpaired
one and its registered commit, and `python eval.py --blocks` end to end (H3's: test_matrix_h3.py; H4's and H5's:
test_matrix_h4_h5.py)."""

import json
import statistics
import subprocess
import sys
from dataclasses import replace

import pytest

from analysis import blocks as mb
from analysis import h3 as matrix_h3
from analysis import h4, h5, sets, stats, verdicts
from analysis import matrix as ma
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
