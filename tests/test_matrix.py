"""The comparison's runner (benchmarks/matrix.py) and analysis (analysis/matrix.py) on fake run
directories and summaries, against hand-computed cases; nothing trains."""

import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import sets
from analysis import matrix as analysis
from analysis import pairing, stats
from benchmarks import matrix
from benchmarks import power
from testbed import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def write_metrics(run_dir: Path, first: int, last: int, every: int = 10) -> None:
    """Lines train.py would log for iterations first..last of policies p and q: rewards and costs each
    iteration, held-out accuracy 0.01 * iteration (p) and twice that (q) every `every` iterations."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for it in range(first, last + 1):
        for policy, scale in (("p", 1), ("q", 2)):
            if it > 0:
                lines.append({"iteration": it, "policy": policy, "charts/reward_mean": 0.1 * (it % 2),
                              "perf/iteration_s": 2.0, "perf/rollout_tokens": 100.0 * scale,
                              "perf/update_tokens": 150.0 * scale, "sharing/received": 4.0})
            if it % every == 0:
                lines.append({"iteration": it, "policy": policy, "eval/heldout_accuracy": 0.01 * it * scale})
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit of code and one of results."""
    path = tmp_path / "repo"
    (path / "results").mkdir(parents=True)
    (path / "code.py").write_text("x = 1\n")
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"], ["add", "code.py"],
                 ["commit", "-q", "-m", "code"]):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    (path / "results" / "old.json").write_text("{}")
    subprocess.run(["git", "-C", str(path), "add", "results"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "a result"], check=True)
    return path


def git_log(path: Path, *args: str) -> list[str]:
    return subprocess.run(["git", "-C", str(path), "log", "--format=%H %s", *args], check=True, capture_output=True,
                          text=True).stdout.split("\n")[:-1]


def test_the_code_commit_skips_results_and_a_dirty_tree_is_refused(repo):
    code, result = git_log(repo)[::-1]
    assert matrix.code_commit(repo) == code.split()[0]
    (repo / "results" / "new.json").write_text("{}")      # untracked, and under results/: no matter
    assert matrix.code_commit(repo) == code.split()[0]
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(RuntimeError, match="uncommitted"):
        matrix.code_commit(repo)


def test_same_metrics_names_the_later_side_and_says_when_it_was_no_commit(repo):
    from benchmarks import same_metrics
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    (repo / "results" / "new.json").write_text("{}")
    assert same_metrics.after_side(repo) == head
    (repo / "code.py").write_text("x = 2\n")
    assert same_metrics.after_side(repo).startswith(f"{head} with uncommitted changes")


def test_train_run_starts_resumes_or_skips(tmp_path, monkeypatch):
    commands = []

    def fake_train(command, **kwargs):
        commands.append(command)
        last = int(command[command.index("--iterations") + 1])
        run_dir = tmp_path / command[command.index("--name") + 1]
        write_metrics(run_dir, power.curve_end(run_dir) + 1 if run_dir.exists() else 0, last)
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(power.subprocess, "run", fake_train)
    assert power.train_run("r", ["--seed", "3"], 20, tmp_path) == (True, "r: finished")
    assert "--resume" not in commands[0] and commands[0][-6:] == ["--iterations", "20", "--name", "r",
                                                                  "--runs-dir", str(tmp_path)]
    assert power.train_run("r", ["--seed", "3"], 40, tmp_path)[0] and "--resume" in commands[1]
    assert power.train_run("r", ["--seed", "3"], 40, tmp_path) == (True, "r: done (40 iterations)")
    assert len(commands) == 2


class FakeTrain:
    """train.py as matrix.run_one calls it: it dies at `dies_at` on its first sitting (metrics logged, exit
    code 1), and on a later one resumes from the last evaluation, as train.py resumes from its checkpoint."""

    def __init__(self, dies_at: int | None = None):
        self.dies_at, self.calls = dies_at, []

    def __call__(self, name, flags, iterations, runs_dir):
        self.calls.append((name, flags))
        run_dir = runs_dir / name
        start = power.curve_end(run_dir) + 1 if run_dir.exists() else 0
        if self.dies_at is not None and len(self.calls) == 1:
            write_metrics(run_dir, start, self.dies_at)
            return False, f"{name}: FAILED"
        write_metrics(run_dir, start, iterations)
        return True, f"{name}: finished"


def no_warm_up(set_name, seed, runs_dir):
    return f"warmed {seed}"


def test_each_seeds_warm_up_runs_once_before_its_runs_and_ahead_of_them():
    jobs = matrix.schedule(["a", "b", "c"], [1, 2, 3, 4])
    assert jobs == [(None, 1), (None, 2), ("a", 1), (None, 3), ("b", 1), ("c", 1), ("a", 2), (None, 4), ("b", 2),
                    ("c", 2), ("a", 3), ("b", 3), ("c", 3), ("a", 4), ("b", 4), ("c", 4)]
    assert matrix.schedule(["a"], [5]) == [(None, 5), ("a", 5)]


def test_a_run_waits_for_its_seeds_warm_up(repo, tmp_path, monkeypatch):
    # two jobs at a time: seed 1's first run starts while seed 1's warm-up still runs, and must wait for it
    import threading
    import time
    monkeypatch.setitem(matrix.SETS, "t", sets.MatrixSet({"a": ()}, (1, 2), (), iterations=10))
    events, lock = [], threading.Lock()

    def warm(set_name, seed, runs_dir):
        time.sleep(0.3 if seed == 1 else 0.0)
        with lock:
            events.append(("warm", seed))
        return ""

    def train(name, flags, iterations, runs_dir):
        with lock:
            events.append(("run", name))
        write_metrics(runs_dir / name, 0, iterations)
        return True, ""
    list(matrix.run_set("t", ["a"], [1, 2], 2, tmp_path / "runs", tmp_path / "out", False, train, repo, warm))
    assert events.index(("warm", 1)) < events.index(("run", "t-a-s1"))
    assert events.index(("warm", 2)) < events.index(("run", "t-a-s2"))
    assert sorted(events) == [("run", "t-a-s1"), ("run", "t-a-s2"), ("warm", 1), ("warm", 2)]


@pytest.mark.slow
def test_the_warm_up_job_fills_the_cache_a_run_then_reads(tmp_path, monkeypatch):
    import torch

    from testbed import policies
    import train as training
    import tyro
    shared = ("--warmup-scale", "0.02", "--cache-dir", str(tmp_path / "cache"), "--eval-size", "8",
              "--prompts-per-iteration", "2", "--group-size", "2", "--max-new-tokens", "8", "--train-size", "50")
    monkeypatch.setitem(matrix.SETS, "t", sets.MatrixSet({"a": ()}, (3,), shared, iterations=1))
    threads = torch.get_num_threads()
    try:
        matrix.main(["--set", "t", "--warm-up", "3"])
    finally:
        torch.set_num_threads(threads)
    assert len(list((tmp_path / "cache" / "warmup").glob("*.pt"))) == 2

    def no_second_warm_up(*args):
        raise AssertionError("the run warmed up again")
    monkeypatch.setattr(policies, "supervised_warmup", no_second_warm_up)
    args = tyro.cli(training.Args, args=[*shared, "--seed", "3", "--iterations", "1",
                                          "--runs-dir", str(tmp_path / "runs"), "--no-tensorboard"])
    assert (training.main(args) / "metrics.jsonl").exists()


def test_a_killed_run_resumes_and_is_summarized_once_and_a_finished_one_never_reruns(repo, tmp_path, monkeypatch):
    monkeypatch.setitem(matrix.SETS, "t", sets.MatrixSet({"a": ("--share", "prp")}, (7,), ("--eval-every", "10"),
                                                           iterations=40))
    runs, out = tmp_path / "runs", repo / "results" / "t"
    train = FakeTrain(dies_at=20)
    first = list(matrix.run_set("t", ["a"], [7], 1, runs, out, True, train, repo, no_warm_up))
    assert first == ["warmed 7", "t-a-s7: FAILED"] and not (out / "a-s7.json").exists()
    (repo / "code.py").write_text("x = 3\n")               # a fix between the two sittings
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "fix"], check=True)
    second = list(matrix.run_set("t", ["a"], [7], 1, runs, out, True, train, repo, no_warm_up))
    assert second == ["warmed 7", f"t-a-s7: finished; summary {out / 'a-s7.json'}"]
    assert train.calls[1] == ("t-a-s7", ["--share", "prp", "--seed", "7", "--eval-every", "10"])
    summary = json.loads((out / "a-s7.json").read_text())
    assert [i for i, _ in summary["policies"]["p"]["heldout"]] == [0, 10, 20, 30, 40]   # each evaluation once
    assert summary["policies"]["q"]["heldout"][-1] == [40, pytest.approx(0.8)]
    # the wall time is the run's (2 s an iteration); tokens add up over both policies (p 150, q 300 an iteration)
    assert (summary["iteration_s"], summary["update_tokens"], summary["rollout_tokens"]) == (80.0, 18000.0, 12000.0)
    assert summary["policies"]["p"]["spent"]["update_tokens"][1] == [10, 1500.0]
    assert summary["policies"]["p"]["crossed"] == {"sharing/received": 4.0}
    assert summary["policies"]["p"]["reward_variance"] == pytest.approx(0.01 / 2)    # alternating 0, 0.1
    fix, code = git_log(repo, "--", "code.py")[:2]
    assert summary["commits"] == [code.split()[0], fix.split()[0]]                     # both sittings
    assert git_log(repo)[0].split(maxsplit=1)[1] == "t: a seed 7"                      # committed as it landed
    third = list(matrix.run_set("t", ["a"], [7], 1, runs, out, True, train, repo, no_warm_up))
    assert third == ["warm-up of seed 7: not needed", "a-s7.json: summarized already"] and len(train.calls) == 2
    with pytest.raises(ValueError, match="not configurations"):
        list(matrix.run_set("t", ["b"], [7], 1, runs, out, False, train, repo, no_warm_up))


def test_a_run_that_logged_an_evaluation_twice_is_refused(tmp_path):
    write_metrics(tmp_path / "r", 0, 20)
    write_metrics(tmp_path / "r", 20, 30)                   # a resume that repeated iteration 20
    with pytest.raises(ValueError, match="twice"):
        matrix.summarize(tmp_path / "r", "a", 1, [], [], ["c"])


def test_a_summary_records_its_runs_first_start_and_each_directions_terms(tmp_path):
    write_metrics(tmp_path / "r", 0, 20)
    built = {"p": "bp", "q": "bq"}
    checkpoint.record_sitting(tmp_path / "r", 0, built, built)
    checkpoint.record_sitting(tmp_path / "r", 10, built, {"p": "p@10", "q": "q@10"})    # resumed at iteration 10
    # two scored offers q -> p, both dominated by CCM, and one left inert (no D): the direction's mean raw terms
    records = [{"iteration": 1, "source": "q", "receiver": "p", "D": 0.3,
                "terms": {"tbd": 0.2, "ccm": 0.4, "rsd": None}, "dominant": "ccm"},
               {"iteration": 2, "source": "q", "receiver": "p", "D": 0.2,
                "terms": {"tbd": 0.0, "ccm": 0.6, "rsd": 0.1}, "dominant": "ccm"},
               {"iteration": 2, "source": "q", "receiver": "p", "level": "reject"}]
    (tmp_path / "r" / "fidelity.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = matrix.summarize(tmp_path / "r", "a", 1, [], [], ["c"])
    assert summary["start_fingerprints"] == {"p": "bp", "q": "bq"}
    assert summary["directions"] == {"q->p": {"diagnosed": 2, "terms": pytest.approx({"tbd": 0.1, "ccm": 0.5,
                                                                                      "rsd": 0.1}),
                                              "dominant": {"tbd": 0.0, "ccm": 1.0, "rsd": 0.0}}}


def test_the_pilot_holds_the_preregistered_configurations_and_seeds():
    pilot = matrix.SETS["pilot"]
    assert list(pilot.configurations) == ["none", "none-g16", "prp", "xgrpo", "sgt", "hacpo", "graft",
                                          "cross-fidelity", "cross-fidelity-random"]
    assert pilot.seeds == tuple(range(1001, 1009)) and pilot.iterations == 100
    assert pilot.configurations["cross-fidelity-random"][-2:] == ("--admission", "random")
    named = {c for a, b in analysis.PRIMARY for c in (a, *(b if isinstance(b, tuple) else (b,)))}
    assert named <= set(pilot.configurations)


# ---------------------------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------------------------

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


def test_the_bootstrap_interval_and_p_value_by_hand():
    # every resample of [1, 1, 1] has mean 1
    means = stats.bootstrap_means([1.0, 1.0, 1.0], 1000, 0)
    assert stats.percentile_interval(means, 0.95) == (1.0, 1.0) and stats.bootstrap_p(means) == 0.0
    # [0, 1]: resampled means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4; the 95% interval is [0, 1] and the
    # p-value twice P(mean <= 0) = 1/2
    means = stats.bootstrap_means([0.0, 1.0], 100_000, 0)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0} and (means == 0.5).mean() == pytest.approx(0.5, abs=0.01)
    assert stats.percentile_interval(means, 0.95) == (0.0, 1.0)
    assert stats.percentile_interval(means, 0.4) == (0.5, 0.5)
    assert stats.bootstrap_p(means) == pytest.approx(0.5, abs=0.01)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 tested at 0.05/3, 0.05/2, 0.05: the first rejected, the second not (0.03 > 0.025),
    # so neither is the third; adjusted 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 0.04)
    adjusted, levels, rejected = stats.holm([0.01, 0.04, 0.03], 0.05)
    assert adjusted == pytest.approx([0.03, 0.06, 0.06]) and levels == pytest.approx([0.05 / 3, 0.05, 0.025])
    assert rejected == [True, False, False]
    assert stats.holm([0.001, 0.01, 0.04], 0.05)[2] == [True, True, True]
    assert stats.holm([0.9, 0.8], 0.05)[0] == [1.0, 1.0]


@pytest.mark.parametrize("p, dof, table", [(0.2, 1, 0.0642), (0.2, 5, 2.343), (0.2, 7, 3.822), (0.2, 10, 6.179),
                                           (0.95, 7, 14.067), (0.05, 20, 10.851)])
def test_chi_square_quantiles_match_the_printed_table(p, dof, table):
    assert stats.chi2_quantile(p, dof) == pytest.approx(table, abs=2e-3)


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


def test_the_matrix_command_line_runs_the_set_it_names(repo, tmp_path):
    # the README's command, on one configuration and seed of the pilot, training faked
    train = FakeTrain()
    warmed = []
    matrix.main(["--set", "pilot", "--jobs", "2", "--commit", "--configurations", "graft", "--seeds", "1001",
                 "--runs-dir", str(tmp_path / "runs")], train, repo, lambda *job: warmed.append(job) or "")
    assert warmed == [("pilot", 1001, tmp_path / "runs")]
    assert train.calls == [("pilot-graft-s1001", ["--share", "graft", "--seed", "1001", *matrix.SETS["pilot"].shared])]
    assert matrix.SETS["pilot"].shared[-2:] == ("--minibatches", "2")
    assert json.loads((repo / "results" / "pilot" / "graft-s1001.json").read_text())["seed"] == 1001
    assert git_log(repo)[0].split(maxsplit=1)[1] == "pilot: graft seed 1001"


@pytest.mark.slow
def test_wall_time_times_every_phase_of_a_run_and_they_add_up(tmp_path, cache_dir):
    from benchmarks import wall_time
    from test_train import tiny_args
    from args import Args
    from dataclasses import asdict
    args, defaults = asdict(tiny_args(tmp_path, cache_dir, share="cross-fidelity")), asdict(Args())
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in args.items() if v != defaults[k]]
    out = wall_time.run_one(ROOT, flags, tmp_path / "times.json")
    assert all(out[phase] > 0 for phase in ("start-up", "warm-up", "rollouts", "rewards", "curation", "updates",
                                            "evaluation", "checkpoints", "report"))
    assert out["exchange"] == 0 and out["warm-up"] <= out["start-up"]   # a curated run's exchange is curation
    assert 0 < out["norms: forward"] + out["norms: from factors"] < out["gradient norms"] < out["curation"]
    counted = sum(v for p, v in out.items() if p not in ("total", "other", *wall_time.NESTED))
    assert counted + out["other"] == pytest.approx(out["total"]) and 0 <= out["other"] < out["total"]


def test_same_metrics_ignores_the_clock_and_names_any_other_difference(tmp_path):
    from benchmarks import same_metrics

    def run(name, lines, fidelity=None):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        if fidelity is not None:
            (tmp_path / name / "fidelity.jsonl").write_text("".join(json.dumps(x) + "\n" for x in fidelity))
        return tmp_path / name
    line = {"iteration": 1, "policy": "p", "time_s": 3.0, "perf/iteration_s": 2.0, "perf/update_tokens": 100.0,
            "fidelity/time_s/curation": 1.0, "losses/kl": float("nan"), "charts/reward_mean": 0.25}
    a = run("a", [line], [{"D": 0.5, "steps": [{"tbd": 0.0}]}])
    b = run("b", [{**line, "time_s": 9.0, "perf/iteration_s": 7.0, "fidelity/time_s/curation": 4.0}],
            [{"D": 0.5, "steps": [{"tbd": 0.0}]}])
    assert same_metrics.differences(a, b) == []                          # only clocks moved; NaN equals NaN
    c = run("c", [{**line, "perf/update_tokens": 101.0, "charts/reward_mean": 0.25 + 1e-16}],
            [{"D": 0.5, "steps": [{"tbd": 1e-12}]}])
    assert same_metrics.differences(a, c) == [                           # a last bit is a difference
        "metrics.jsonl line 1, charts/reward_mean: 0.25 before, 0.2500000000000001 after",
        "metrics.jsonl line 1, perf/update_tokens: 100.0 before, 101.0 after",
        'fidelity.jsonl line 1, steps: [{"tbd": 0.0}] before, [{"tbd": 1e-12}] after']
    e = run("e", [{**line, "perf/update_tokens": 100, "charts/new": 1.0}])             # an int, and a new metric
    assert same_metrics.differences(a, e)[:2] == ["metrics.jsonl line 1, charts/new: (missing) before, 1.0 after",
                                                  "metrics.jsonl line 1, perf/update_tokens: 100.0 before, 100 after"]
    d = run("d", [line, line])
    assert same_metrics.differences(a, d)[:2] == ["metrics.jsonl: 1 lines before, 2 after",
                                                  "fidelity.jsonl: only before has it"]
    with pytest.raises(FileNotFoundError, match="nothing to compare"):
        same_metrics.differences(tmp_path / "x", tmp_path / "y")


@pytest.mark.slow
def test_ray_overhead_weighs_every_actor_call_of_an_iteration(cache_dir):
    # the README's command at a short length: three runs (train.py, train_ray.py, train_ray.py weighed) of prp
    done = subprocess.run([sys.executable, "-m", "benchmarks.ray_overhead", "--shares", "prp",
                           "--iterations", "3", "--warmup-scale", "0.15", "--cache-dir", cache_dir],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| prp |"))
    calls = int(row.split("|")[4])
    assert calls == 10    # per actor: rollout, experience, accept_shared, receive, update
    methods = next(line for line in done.stdout.splitlines() if line.strip().startswith("prp:"))
    assert all(m in methods for m in ("rollout", "experience", "accept_shared", "receive", "update"))


def test_every_registered_configuration_names_its_share_and_runs_on_fresh_seeds():
    # the registration's rule: a change of train.py's defaults changes no registered run
    spent = {*range(0, 14), 500, 501, 502, 700, 701, 702, 900, *range(1001, 1009)}
    for name, s in matrix.SETS.items():
        for configuration, flags in s.configurations.items():
            assert "--share" in flags, (name, configuration)
            if flags[flags.index("--share") + 1] == "cross-fidelity":
                assert "--ccm-estimate" in flags, (name, configuration)
    for block, segments in matrix.BLOCKS.items():
        for set_name, configurations, seeds in segments:
            assert set(configurations) <= set(matrix.SETS[set_name].configurations), block
            assert set(seeds) <= set(matrix.SETS[set_name].seeds) and not set(seeds) & spent, block


def test_the_blocks_run_in_the_registered_order_and_a_shared_run_runs_once(repo, tmp_path, monkeypatch):
    monkeypatch.setitem(matrix.SETS, "t", sets.MatrixSet({"a": ("--share", "prp"), "b": ("--share", "sgt")},
                                                           (7, 8), ("--eval-every", "10"), iterations=10))
    monkeypatch.setattr(matrix, "BLOCKS", {"first": [("t", ("a",), range(7, 9))],
                                           "second": [("t", ("b", "a"), range(8, 9))]})
    train = FakeTrain()
    matrix.main(["--blocks", "second", "first", "--jobs", "1", "--runs-dir", str(tmp_path / "runs")], train, repo,
                no_warm_up)
    assert [name for name, _ in train.calls] == ["t-b-s8", "t-a-s8", "t-a-s7"]      # t-a-s8 not again in "first"
    assert sorted(p.name for p in (repo / "results" / "t").iterdir()) == ["a-s7.json", "a-s8.json", "b-s8.json"]
    for narrowing in (["--seeds", "9"], ["--configurations", "a"], ["--out", str(tmp_path)]):   # never ignored
        with pytest.raises(SystemExit):
            matrix.main(["--blocks", "first", *narrowing], train, repo, no_warm_up)
    assert len(train.calls) == 3


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


@pytest.mark.parametrize("differences", [[1.0, 2.0, 3.0], [0.85, 0.1, -0.2, 1.3, 2.0, 0.4], [0.5, -0.5],
                                         [1.0, -1.0, 2.0, -2.0, 0.3, 0.7, -0.1]])
def test_the_sign_flip_p_value_equals_a_naive_enumeration_of_signs(differences):
    sums = [abs(sum(s * d for s, d in zip(signs, differences)))
            for signs in itertools.product((1, -1), repeat=len(differences))]
    observed = abs(sum(differences))
    naive = sum(total >= observed - 1e-9 for total in sums) / len(sums)
    assert stats.sign_flip_p(differences) == pytest.approx(naive)


@pytest.mark.parametrize("differences", [[1.0, 2.0, 3.0], [0.85, 0.1, -0.2, 1.3, 2.0, 0.4], [-0.5, 0.2, -1.0]])
def test_the_one_sided_sign_flip_p_value_equals_a_naive_enumeration_of_signs(differences):
    sums = [sum(s * d for s, d in zip(signs, differences))
            for signs in itertools.product((1, -1), repeat=len(differences))]
    naive = sum(total >= sum(differences) - 1e-9 for total in sums) / len(sums)
    assert stats.sign_flip_p(differences, alternative="greater") == pytest.approx(naive)


@pytest.mark.parametrize("numerators, denominators", [
    ([2.0, 3.0, 1.5, 2.5, 4.0], [3.0, 3.5, 2.0, 4.0, 5.5]), ([1.0, -0.5, 2.0, 0.3], [2.0, 1.0, 3.5, 1.2]),
    ([0.4, 2.2, -1.0, 1.1, 0.9, 3.0], [1.0, 2.5, 0.1, 2.0, 0.8, 3.1])])
def test_fiellers_interval_is_the_set_of_ratios_the_paired_t_test_keeps_by_a_grid(numerators, denominators):
    # by definition: r is in the interval where the paired t test of numerator - r denominator does not reject 0
    n, t = len(numerators), stats.t_quantile(0.975, len(numerators) - 1)

    def kept(r):
        d = [x - r * y for x, y in zip(numerators, denominators)]
        mean = sum(d) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
        return abs(mean) <= t * sd / math.sqrt(n)
    low, high = stats.fieller_interval(numerators, denominators, 0.95)
    grid = [k / 1000 for k in range(-20000, 20001)]
    inside = [r for r in grid if kept(r)]
    assert low == pytest.approx(min(inside), abs=2e-3) and high == pytest.approx(max(inside), abs=2e-3)
    ratio = sum(numerators) / sum(denominators)
    assert low < ratio < high


def test_fiellers_interval_is_unbounded_where_the_denominator_is_not_told_from_0():
    # denominators -1, 1, 0.5, -0.2: their mean 0.075 lies well within t * SE of 0, so every large r is kept
    assert stats.fieller_interval([1.0, 2.0, 1.5, 0.5], [-1.0, 1.0, 0.5, -0.2], 0.95) == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="two or more pairs"):
        stats.fieller_interval([1.0], [2.0], 0.95)


def test_the_t_interval_by_hand():
    # 1, 2, 3: mean 2, SD 1, t(0.975, 2) = 4.303 from the printed table
    assert stats.t_interval([1.0, 2.0, 3.0], 0.95) == pytest.approx((2 - 4.303 / math.sqrt(3),
                                                                     2 + 4.303 / math.sqrt(3)), abs=1e-3)


def test_beyond_twenty_differences_the_sign_flip_p_value_is_drawn_and_never_0():
    assert 0 < stats.sign_flip_p([1.0] * 25) < 1e-5           # drawn: (hits + 1) / (2^20 + 1), 2 / 2^25 exactly
    assert stats.sign_flip_p([1.0, -1.0] * 11) == 1.0          # every assignment as far out as the observed 0
    assert stats.p_text(0.0312) == "0.031" and stats.p_text(3e-7) == "< 0.001"
