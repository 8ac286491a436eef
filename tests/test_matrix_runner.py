"""The comparison's runner (benchmarks/matrix.py) and the benchmarks that time and check its runs (wall_time.py,
same_metrics.py, ray_overhead.py) on fake trainers and run directories, against hand-built cases: a run starts,
resumes or is skipped, each seed's warm-up runs once before its runs, a summary records what its run did, and the
registered sets run in their order."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import sets
from analysis import matrix as analysis
from benchmarks import matrix
from benchmarks import power
from testbed import checkpoint
from test_matrix import ROOT


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
