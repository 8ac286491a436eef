"""The matrix's blocks 2-6, H4 and H5 (benchmarks/matrix_blocks.py) on summaries built by hand: each registered
rule called on its boundary cases, a family's Holm over its registered seeds alone, H4's dominant terms and
claims, H5's dominance, and `python eval.py --blocks` end to end."""

import json
import math
import subprocess
import sys

import pytest

from test_matrix import ROOT, summary, write_summaries   # it puts benchmarks/ on the path

import matrix_analysis as ma  # noqa: E402
import matrix_blocks as mb  # noqa: E402


def row(mean, low, high, rejected):
    return {"mean": mean, "interval": (low, high), "holm_rejected": rejected}


@pytest.mark.parametrize("rule, r, verdict", [
    ("estimate", row(-0.5, -1.9, 0.9, False), "costs no accuracy"),
    ("estimate", row(-3.0, -5.0, -1.0, True), "costs accuracy"),
    ("estimate", row(-1.0, -2.5, 0.5, False), "not resolved"),
    ("gain", row(3.0, 1.0, 5.0, True), "supported"),
    ("gain", row(0.5, -1.0, 1.9, False), "refuted"),
    ("gain", row(1.0, 0.5, 1.5, True), "supported, by less than 2 points"),
    ("gain", row(1.0, -1.0, 3.0, False), "not resolved"),
    ("component", row(4.0, 2.5, 6.0, True), "matters"),
    ("component", row(1.0, 0.5, 1.5, True), "matters, by less than 2 points"),
    ("component", row(-4.0, -6.0, -2.5, True), "hurts"),
    ("component", row(0.1, -1.5, 1.5, False), "matters by less than 2 points"),
    ("component", row(0.1, -2.5, 2.5, False), "not resolved"),
    ("lead", row(2.0, 1.0, 3.0, True), "supported"),
    ("lead", row(-2.0, -3.0, -1.0, True), "reversed"),
    ("lead", row(2.0, -1.0, 3.0, False), "not resolved"),
])
def test_each_registered_rule_calls_its_boundary_cases(rule, r, verdict):
    assert mb.call(rule, r) == verdict


def test_a_family_reads_its_registered_seeds_alone_and_keeps_what_did_not_run_in_holm_at_p_1():
    cfg = ma.AnalysisConfig(resamples=2000)
    # last2 - exact: +1, +2, +3 on 1009-1011, and a seed outside the estimate block's 1009-1019 that must not count
    gaps = {1009: 1.0, 1010: 2.0, 1011: 3.0, 1025: -50.0}
    runs = [summary("cross-fidelity", s, 40.0) for s in gaps] + [summary("cross-fidelity-last2", s, 40.0 + g)
                                                                  for s, g in gaps.items()]
    seeds, contrasts = mb.FAMILIES["estimate"][1:]
    rows, missing = mb.family(runs, seeds, contrasts, cfg)
    assert [(r["contrast"], r["policy"]) for r in rows] == [("cross-fidelity-last2 - cross-fidelity", "p"),
                                                            ("cross-fidelity-last2 - cross-fidelity", "q")]
    assert rows[0]["differences"] == pytest.approx({1009: 1.0, 1010: 2.0, 1011: 3.0})
    assert rows[1]["mean"] == pytest.approx(1.0)             # q's curve is half of p's
    assert missing == ["cross-fidelity-last2 - sgt (p)", "cross-fidelity-last2 - sgt (q)"]
    # every difference positive: p = 0 for both, so Holm rejects both in a family of 4; both intervals above -2
    assert all(r["p"] == 0 and r["holm_rejected"] and r["verdict"] == "costs no accuracy" for r in rows)
    assert rows[0]["of"] == 11


def directions(terms_by_direction):
    return {d: {"diagnosed": 10, "terms": t, "dominant": {}} for d, t in terms_by_direction.items()}


def test_h4_averages_each_direction_over_seeds_and_calls_each_claim_by_the_share_it_dominates():
    qq = {"qwen-a->qwen-b": {"tbd": 0.01, "ccm": 0.30, "rsd": 0.20}, "qwen-b->qwen-a": {"tbd": 0.0, "ccm": 0.1,
                                                                                     "rsd": 0.2}}
    ql = {"qwen->llama": {"tbd": 0.5, "ccm": 0.2, "rsd": 0.1}, "llama->qwen": {"tbd": 0.4, "ccm": 0.6,
                                                                                "rsd": math.nan}}
    sets = {}
    for set_name, name, table in (("matrix-h4-qwen-qwen-line", "cross-fidelity", qq), ("matrix", "cross-fidelity", ql)):
        runs = []
        for seed, scale in ((1009, 1.0), (1010, 3.0), (1011, 100.0)):      # 1011 is not one of H4's seeds
            s = summary(name, seed, 40.0)
            s["directions"] = directions({d: {t: v * scale for t, v in terms.items()} for d, terms in table.items()})
            runs.append(s)
        sets[set_name] = runs
    result = mb.h4(sets)
    by = {(r["pair"], r["measure"], r["direction"]): r for r in result["table"]}
    assert by["qwen-qwen", "credit", "qwen-a->qwen-b"]["terms"]["ccm"] == pytest.approx(0.30 * 2)   # (1 + 3) / 2
    assert by["qwen-qwen", "credit", "qwen-a->qwen-b"]["dominant"] == "ccm"
    assert by["qwen-qwen", "credit", "qwen-b->qwen-a"]["dominant"] == "rsd"
    assert by["qwen-llama", "credit", "llama->qwen"]["dominant"] == "ccm"      # a NaN term never dominates
    assert len(result["table"]) == 4                                          # cells that did not run are absent
    claims = {c["claim"]: c for c in result["claims"]}
    assert claims["same family mainly CCM"]["verdict"] == "refuted" and claims["same family mainly CCM"]["share"] == 0.5
    assert claims["cross family mainly TBD"]["verdict"] == "refuted"
    sets["matrix"][0]["directions"]["llama->qwen"]["terms"]["tbd"] = 5.0     # TBD now dominates both: seed mean 3.1
    assert {c["claim"]: c["verdict"] for c in mb.h4(sets)["claims"]}["cross family mainly TBD"] == "supported"


def plane_run(name, seed, received, variance):
    s = summary(name, seed, 40.0, crossed={"sharing/received": received})
    for m in s["policies"].values():
        m["reward_variance"] = variance
    return s


def test_h5_calls_adaptive_curation_by_dominance_in_the_plane_and_says_when_a_level_is_missing():
    cfg = ma.AnalysisConfig(resamples=2000)
    seeds = (1009, 1010, 1011)
    base = [plane_run(name, s, received, variance) for s in seeds
            for name, received, variance in (("prp", 2.0 + s % 2, 0.030), ("xgrpo", 5.0 + s % 2, 0.030))]
    assert mb.h5(base, cfg)[0]["verdict"].startswith("not computable: cross-fidelity-adaptive, sgt did not run")
    sgt = [plane_run("sgt", s, 9.0 + s % 2, 0.025 + 0.001 * (s % 2)) for s in seeds]
    # adaptive receives more than prp with less variance, seed by seed: it dominates prp, and no level dominates it
    adaptive = [plane_run(mb.H5_ADAPTIVE, s, 4.0 + s % 2, 0.022 + 0.001 * (s % 3)) for s in seeds]
    assert [h["verdict"] for h in mb.h5(base + sgt + adaptive, cfg)] == ["supported (dominates prp)"] * 2
    # one that receives less than xgrpo and sgt, each seed, with more variance than both is dominated by both
    worse = [plane_run(mb.H5_ADAPTIVE, s, 3.0 + s % 2, 0.032 + 0.001 * (s % 3)) for s in seeds]
    assert mb.h5(base + sgt + worse, cfg)[0]["verdict"] == "refuted (dominated by xgrpo, sgt)"


def test_eval_blocks_writes_every_family_from_the_set_folders_and_refuses_commits_not_declared_equivalent(tmp_path):
    runs = [summary(name, s, auc) for s in (1009, 1010, 1011) for name, auc in (("hacpo", 42.0 + s - 1009),
                                                                                ("sgt", 40.0))]
    for r in runs:
        r["iteration_s"] = 500.0 + r["seed"] - 1009 if r["configuration"] == "hacpo" else 400.0
    write_summaries(tmp_path / "matrix", runs)
    trio = [{**summary("cross-fidelity", s, 40.0, ["c2"]), "iteration_s": 900.0} for s in (1009, 1010)]
    write_summaries(tmp_path / "matrix-trio-prose", trio)
    write_summaries(tmp_path / "matrix-main", [summary("sgt", 1009, 10.0, ["c0"])])    # block 1's: not read here
    command = [sys.executable, str(ROOT / "eval.py"), "--blocks", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "not declared metric-equivalent" in done.stderr
    (tmp_path / "matrix" / ma.EQUIVALENCE_FILE).write_text("c1 c2  # checked by same_metrics\n")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "matrix" / "blocks.json").read_text())
    [lead] = [r for r in result["families"]["hacpo"]["rows"] if r["policy"] == "p"]
    assert lead["contrast"] == "hacpo - sgt" and lead["differences"] == {"1009": 2.0, "1010": 3.0, "1011": 4.0}
    assert result["families"]["hacpo"]["missing"] == ["cross-fidelity - hacpo (p)", "cross-fidelity - hacpo (q)"]
    assert result["families"]["estimate"]["rows"] == [] and len(result["families"]["estimate"]["missing"]) == 4
    assert "| hacpo - sgt | p | 3 of 22 | +2.00 +3.00 +4.00 | +3.00 |" in done.stdout
    assert "Training seconds, mean ± SD over seeds (not tested): hacpo 501 ± 1, sgt 400 ± 0." in done.stdout
    assert (tmp_path / "matrix" / "blocks.md").read_text() == done.stdout.rstrip("\n") + "\n"
