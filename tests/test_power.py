"""The power analysis' statistics (benchmarks/power.py; its t quantile in analysis/stats.py, the area under a curve in
analysis/curves.py) against tables and hand-computed cases."""

import json

import pytest

from analysis import curves, stats
from benchmarks import power


@pytest.mark.parametrize("p, dof, table", [(0.975, 1, 12.706), (0.975, 5, 2.571), (0.975, 9, 2.262),
                                           (0.975, 30, 2.042), (0.95, 10, 1.812), (0.995, 4, 4.604)])
def test_t_quantiles_match_the_printed_table(p, dof, table):
    assert stats.t_quantile(p, dof) == pytest.approx(table, abs=2e-3)


@pytest.mark.parametrize("sd", [0.005, 0.03, 0.13])
def test_the_seeds_needed_are_the_fewest_that_reach_the_half_width(sd):
    n = power.seeds_needed(sd, target=0.02)
    assert power.half_width(sd, n) <= 0.02
    assert n == 2 or power.half_width(sd, n - 1) > 0.02


def test_paired_summary_and_the_area_under_a_curve_by_hand():
    summary = power.paired_summary([0.1, -0.1, 0.3])
    assert summary["mean"] == pytest.approx(0.1) and summary["sd"] == pytest.approx(0.2)
    assert summary["half_width_95"] == pytest.approx(4.303 * 0.2 / 3 ** 0.5, abs=1e-3)
    curve = [(0, 0.0), (10, 0.2), (20, 0.2), (40, 0.6)]
    # trapezoids: 10 * 0.1 + 10 * 0.2 + 20 * 0.4 = 11, over 40 iterations
    assert curves.area_under(curve, 40) == pytest.approx(11 / 40)
    assert curves.area_under(curve, 20) == pytest.approx(3 / 20)
    # cut at 30 between the evaluations at 20 and 40, where the line reads 0.4: 1 + 2 + 10 * 0.3 = 6, over 30
    assert curves.area_under(curve, 30) == pytest.approx(6 / 30)
    for end in (50, 0):
        with pytest.raises(ValueError, match="evaluations"):
            curves.area_under(curve, end)
    with pytest.raises(ValueError, match="evaluations"):
        curves.area_under(curve[1:], 20)                                   # no evaluation at 0
    with pytest.raises(ValueError, match="no evaluation"):
        power.accuracy_at(curve, 30)


def write_run(run_dir, lines):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_run_is_done_only_where_every_policy_was_evaluated_and_a_torn_last_line_is_not_read(tmp_path):
    evaluated = [{"iteration": i, "policy": p, "eval/heldout_accuracy": 0.5} for i in (0, 10) for p in "pq"]
    write_run(tmp_path / "whole", evaluated + [{"iteration": 11, "policy": "p", "charts/reward_mean": 0.1}])
    assert power.curve_end(tmp_path / "whole") == 10
    # stopped between p's and q's evaluation at 20: not done at 20, and the line cut mid-write is left out
    write_run(tmp_path / "stopped", evaluated + [{"iteration": 20, "policy": "p", "eval/heldout_accuracy": 0.6}])
    with (tmp_path / "stopped" / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 20, "policy": "q", "eval/held')
    assert power.curve_end(tmp_path / "stopped") == 10
    assert power.curve_end(tmp_path / "absent") == 0


def test_the_power_analysis_of_two_levels_by_hand(tmp_path):
    # seeds 1 and 2, evaluated at 0 (0.0) and 10: none at 0.2 and 0.4, prp at 0.3 and 0.7; one policy, whose
    # iterations to 10 cost 10 s and 100 tokens of each kind
    for level, finals in (("none", (0.2, 0.4)), ("prp", (0.3, 0.7))):
        for seed, final in zip((1, 2), finals):
            write_run(tmp_path / power.run_name("default", level, seed), [
                {"iteration": 0, "policy": "p", "eval/heldout_accuracy": 0.0},
                {"iteration": 10, "policy": "p", "eval/heldout_accuracy": final, "perf/iteration_s": 10.0,
                 "perf/rollout_tokens": 100, "perf/update_tokens": 100}])
    result = power.analyze("default", ["none", "prp"], [1, 2], [10], tmp_path)
    final, auc = result["metrics"]["prp - none/final@10/p"], result["metrics"]["prp - none/auc@10/p"]
    assert final["differences"] == pytest.approx([0.1, 0.3]) and final["mean"] == pytest.approx(0.2)
    assert final["sd"] == pytest.approx(0.1 * 2 ** 0.5)
    assert auc["differences"] == pytest.approx([0.05, 0.15])          # half the final gap: linear from 0 at 0
    p = (0.2 + 0.4 + 0.3 + 0.7) / 4
    assert result["binomial_se@10/p"] == pytest.approx((p * (1 - p) / 2000) ** 0.5)
    assert result["cost"]["none"] == {"iteration_s": 10.0, "rollout_tokens": 100.0, "update_tokens": 100.0}


@pytest.mark.slow
def test_the_documented_commands_train_every_level_and_seed_then_analyze_them(tmp_path, cache_dir, capsys):
    # docs/testbed.md's run and analyze at a smoke size: two levels, two seeds, two iterations evaluated each
    smoke = ["--", "--warmup-scale", "0.15", "--prompts-per-iteration", "8", "--group-size", "6",
             "--max-new-tokens", "16", "--eval-size", "8", "--eval-every", "1", "--train-size", "200",
             "--cache-dir", cache_dir]
    grid = ["--levels", "none", "prp", "--seeds", "1", "2", "--runs-dir", str(tmp_path)]
    power.main(["run", *grid, "--iterations", "2", "--order", "seed", *smoke])
    assert capsys.readouterr().out.count(": finished") == 4
    assert all(power.curve_end(tmp_path / power.run_name("default", level, seed)) == 2
               for level in ("none", "prp") for seed in (1, 2))
    power.main(["run", *grid, "--iterations", "2", *smoke])           # resumable: what is done is not rerun
    assert capsys.readouterr().out.count("done (2 iterations)") == 4
    power.main(["analyze", *grid, "--at", "2", "--out", str(tmp_path / "power")])
    result = json.loads((tmp_path / "power.json").read_text())
    def final_accuracy(level, seed, policy):    # the run's own log, read plainly
        lines = map(json.loads, (tmp_path / power.run_name("default", level, seed) / "metrics.jsonl").open())
        return [r["eval/heldout_accuracy"] for r in lines
                if r["policy"] == policy and r["iteration"] == 2 and "eval/heldout_accuracy" in r][-1]
    for policy in ("qwen", "llama"):
        differences = result["metrics"][f"prp - none/final@2/{policy}"]["differences"]
        assert differences == pytest.approx([final_accuracy("prp", s, policy) - final_accuracy("none", s, policy)
                                             for s in (1, 2)])
    assert "prp - none" in (tmp_path / "power.md").read_text()
