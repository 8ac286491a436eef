"""H4 and H5 (analysis/h4.py, h5.py) on summaries and run records built by hand: H4 averages each direction's
dominant terms over seeds and calls a claim only where each seed repeats it; H5 calls adaptive curation by dominance
in the (mean received, reward variance) plane, at n by exact sign-flip p, over seeds paired by their start, and
draws its path window by window from the runs' records (benchmarks/h5_path.py)."""

import itertools
import json
import math

import pytest

from analysis import blocks as mb
from analysis import h3 as matrix_h3
from analysis import h4, h5, plots
from analysis import matrix as ma
from benchmarks import h5_path
from test_matrix import summary, write_summaries


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
