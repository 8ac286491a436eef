"""The curator's sensitivity and reach-estimate benchmarks (benchmarks/curator_sensitivity.py,
benchmarks/reach_estimate.py) against hand-made curator logs and hand-built tables: the window redraw and the
threshold levels rebuild what the curator logged, the ablation and ties tables count the offers a change moved, a
reach redraw swaps half the window, and each CCM estimate is measured against the exact one."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import curator
import diagnosis
import term_scales
from test_term_scales import shifted_terms
from test_train import tiny_args

ROOT = Path(__file__).resolve().parent.parent


def logged_run(path: Path, thresholds: str, levels: list[int], silent: tuple[int, ...] = ()) -> None:
    """A run's fidelity.jsonl and config.json as a Curator with a window of 2 logs them, from hand-made terms over
    six iterations; the thresholds raised by levels[iteration - 1] steps of 0.02; the `silent` iterations diagnose
    no offer."""
    cfg = diagnosis.CuratorConfig(calibration_window=2)
    cur = curator.Curator(cfg, ["qwen", "llama"], 0, None, None)
    records = []
    for it, level in zip(range(1, 7), levels):
        rows = [] if it in silent else shifted_terms(it, 30, -0.05 * it)
        scales = cur.calibrate("llama", rows)
        theta = tuple(t + 0.02 * level for t in cur.level0_thresholds["llama"])
        records += [{"receiver": "llama", "source": "qwen", "iteration": it, "theta": list(theta),
                     "terms": dict(zip(diagnosis.TERMS, r.tolist())),
                     "band": curator.admission_band(curator.degradation(scales.scaled(r), cfg.weights), *theta)}
                    for r in rows]
    (path / "fidelity.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "config.json").write_text(json.dumps({"thresholds": thresholds, "theta1": None, "calibration": "window",
                                                  "calibration_window": 2, "ablate": []}))


def test_the_window_redraw_and_the_levels_rebuild_what_the_curator_logged(tmp_path, capsys):
    from benchmarks import curator_sensitivity
    logged_run(tmp_path, "fixed", [0] * 6)
    curator_sensitivity.window_stability(tmp_path, every=1)
    out = capsys.readouterr().out
    assert "3 iterations" in out and "match the logged ones at 3 of them" in out     # iterations 4, 5 and 6
    assert "from earlier" in out and "from bootstrap" in out
    logged_run(tmp_path, "adaptive", [0, 1, 2, 2, 1, 3])
    assert curator_sensitivity.levels_table(tmp_path) == {("qwen", "llama"): [0, 1, 2, 2, 1, 3]}
    with pytest.raises(SystemExit, match="thresholds fixed"):
        curator_sensitivity.window_stability(tmp_path)


def test_the_ablation_table_counts_the_offers_of_one_source_and_iteration_whose_band_moved(tmp_path, capsys):
    from benchmarks import curator_sensitivity

    def run(name: str, bands: list[int], elsewhere: int) -> Path:
        mine = [{"source": "mistral", "receiver": "qwen", "iteration": 1, "index": k, "band": b}
                for k, b in enumerate(bands)]
        others = [{"source": "llama", "receiver": "qwen", "iteration": 1, "index": 0, "band": elsewhere},
                  {"source": "mistral", "receiver": "qwen", "iteration": 2, "index": 0, "band": elsewhere},
                  {"source": "mistral", "receiver": "qwen", "iteration": 1, "index": 9, "level": "inert"}]
        (tmp_path / name).mkdir()
        (tmp_path / name / "fidelity.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine + others))
        (tmp_path / name / "config.json").write_text("{}")
        return tmp_path / name
    # offers 0-4 in both runs, 1 and 3 in another band; offer 5 only in the ablated run; another source's and
    # another iteration's bands moved too, and are not counted
    curator_sensitivity.ablation_table(run("run", [0, 1, 2, 0, 1], 0), run("ablated", [0, 2, 2, 1, 1, 0], 2),
                                       "mistral", 1)
    assert "diagnosed in both runs: 5; in different bands: 2 (40%)" in capsys.readouterr().out


def test_the_ties_table_counts_the_offers_a_threshold_on_a_shared_d_moved(tmp_path):
    from benchmarks import curator_sensitivity
    # one iteration, its 10 offers the whole sample: 4 with every step in reach (CCM 0, one D), TBD and RSD constant;
    # the third's quantile falls on the 4, whose middle lies in PRP's third: PRP now, XGRPO by the plain quantile
    terms = [(0.0, ccm, 0.5) for ccm in [0.0] * 4 + [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]
    weights = diagnosis.CuratorConfig().weights
    sample = term_scales.Calibration(tuple(terms))
    d, theta = sample.degradations(weights), sample.thresholds(weights)
    records = [{"receiver": "llama", "source": "qwen", "iteration": 1, "theta": list(theta), "D": v,
                "terms": dict(zip(diagnosis.TERMS, row)), "band": curator.admission_band(v, *theta)}
               for row, v in zip(terms, d)]
    assert [r["band"] for r in records[:4]] == [0] * 4
    (tmp_path / "fidelity.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "config.json").write_text(json.dumps({"thresholds": "fixed", "theta1": None, "calibration": "window",
                                                      "calibration_window": 1, "ablate": []}))
    assert curator_sensitivity.tie_table(tmp_path) == {"llama": [1, 1, 10, 4]}
    out = subprocess.run([sys.executable, "-m", "benchmarks.curator_sensitivity", "ties", str(tmp_path)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "| llama | 1 | 1 | 10 | 4 (40.0%) |" in out


def test_an_iteration_that_diagnosed_nothing_leaves_the_rebuilt_window_as_the_curators(tmp_path, capsys):
    from benchmarks import curator_sensitivity
    logged_run(tmp_path, "fixed", [0] * 6, silent=(4,))
    curator_sensitivity.window_stability(tmp_path, every=1)
    out = capsys.readouterr().out                       # iteration 5's window holds iterations 3 and 5
    assert "2 iterations" in out and "match the logged ones at 2 of them" in out
    logged_run(tmp_path, "adaptive", [0, 1, 2, 2, 1, 3], silent=(3,))
    assert curator_sensitivity.levels_table(tmp_path) == {("qwen", "llama"): [0, 1, 2, 1, 3]}


def test_a_reach_redraw_swaps_half_the_window_for_fresh_samples_by_hand():
    from benchmarks import curator_sensitivity
    window = 4
    pool = [torch.zeros(3)] * window + [torch.ones(3)] * window     # the window's samples 0, the fresh ones 1
    cut_offs = [0.25, 0.75, 0.4, 0.6, 0.9]                          # an offer's band: 1 where the mean passes it

    def bands(sample: list[torch.Tensor]) -> list[int]:
        mean = torch.cat(sample).mean().item()
        assert len(sample) == window
        return [int(mean > c) for c in cut_offs]
    # every redraw keeps 2 zeros and takes 2 ones, a mean of 1/2: the bands at 0.25 and 0.4 move, 2 of 5
    changed = curator_sensitivity.redraw_changes(bands, pool, redraws=3, rng=random.Random(0))
    assert changed == [2 / 5] * 3
    assert curator_sensitivity.redraw_changes(bands, [torch.ones(3)] * 8, 2, random.Random(0)) == [0.0, 0.0]


def test_the_reach_redraw_runs_on_the_tiny_pair(tmp_path, cache_dir, capsys, monkeypatch):
    from benchmarks import curator_sensitivity
    live, offered = curator_sensitivity.live_offers, {}

    def counted(it, receiver):
        offered[receiver.policy.name] = len(offers := live(it, receiver))
        return offers
    monkeypatch.setattr(curator_sensitivity, "live_offers", counted)
    changed = curator_sensitivity.reach_stability(tiny_args(tmp_path, cache_dir), redraws=2)
    out = capsys.readouterr().out
    assert set(offered) == {"qwen", "llama"} and set(changed) == {name for name, n in offered.items() if n}
    assert all(0 <= c <= 1 for c in changed.values())
    assert out.count("own rollouts) 2 times changed the band of") == len(changed)
    assert out.count("no offer that could matter") == 2 - len(changed)


def test_reach_estimate_measures_each_estimate_against_exact(tmp_path, cache_dir):
    from benchmarks import reach_estimate
    out = reach_estimate.measure(tiny_args(tmp_path, cache_dir), iterations=1, estimates=["exact", "last:0"],
                                 repeats=1)
    for name in ("qwen", "llama"):
        full, head = out["rows"][(name, "exact")], out["rows"][(name, "last:0")]
        assert len(full) == len(head) and [r[2] for r in full] == [r[2] for r in head]   # only CCM differs
        assert out["seconds"][(name, "last:0")] > 0
        # no backward through blocks
        assert 0 < out["flops"][(name, "last:0")] < out["flops"][(name, "exact")]
        assert len(out["reach"][(name, "exact")]) == len(out["reach"][(name, "last:0")]) >= len(full)


def test_reach_estimate_pools_the_seeds_that_offered_a_receiver_something_and_refuses_a_receiver_never_offered():
    from benchmarks import reach_estimate
    gen = torch.Generator().manual_seed(0)

    def seed(offers: dict[str, int]) -> dict:
        out = {"rows": {}, "reach": {}, "seconds": {}, "flops": {}}
        for name, n in offers.items():
            rows = [tuple(torch.rand(3, generator=gen).tolist()) for _ in range(n)]
            reach = torch.rand(2 * n, generator=gen).tolist()
            for estimate in ("exact", "last:0"):     # the same terms under both: every band agrees
                key = (name, estimate)
                out["rows"][key], out["reach"][key], out["seconds"][key], out["flops"][key] = rows, reach, 1.0, 2e9
        return out
    weights = torch.ones(3) / 3
    table = reach_estimate.agreement([seed({"qwen": 6, "llama": 5}), seed({"qwen": 0, "llama": 4})], weights)
    assert {k: (v["offers"], v["seconds"]) for k, v in table.items()} == {
        ("qwen", "exact"): (6, 1.0), ("qwen", "last:0"): (6, 1.0), ("llama", "exact"): (9, 2.0),
        ("llama", "last:0"): (9, 2.0)}
    assert all(v["band_agreement"] == 1 and v["spearman_reach"] == pytest.approx(1) for v in table.values())
    with pytest.raises(ValueError, match="no offer could matter to qwen in any sampled iteration: sample more"):
        reach_estimate.agreement([seed({"qwen": 0, "llama": 3})], weights)


def test_reach_estimate_rule_takes_the_cheapest_that_agrees_for_every_receiver():
    from benchmarks import reach_estimate

    def table(agree: dict[str, tuple[float, float]], seconds: dict[str, float]) -> dict:
        return {(name, e): {"band_agreement": a[i], "seconds": seconds[e]} for e, a in agree.items()
                for i, name in enumerate(("qwen", "llama"))}
    seconds = {"exact": 10.0, "last:0": 1.0, "last:1": 3.0, "last:2": 5.0}
    # last:0 is cheapest but one receiver falls below 85%: the next cheapest that holds for both wins
    chosen = reach_estimate.choose(table({"exact": (1, 1), "last:0": (0.95, 0.84), "last:1": (0.9, 0.86),
                                          "last:2": (0.99, 0.99)}, seconds))
    assert chosen == ("last:1", True)
    # none holds for both: the best worst-receiver agreement, flagged as missing the criterion
    chosen = reach_estimate.choose(table({"exact": (1, 1), "last:0": (0.99, 0.5), "last:1": (0.8, 0.7),
                                          "last:2": (0.6, 0.9)}, seconds))
    assert chosen == ("last:1", False)
