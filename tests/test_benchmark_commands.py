"""The benchmark commands the README and docs/ show: each is `python -m benchmarks.NAME` of a script that exists,
and those that no other test runs, each at its shortest settings (slow: each trains or times a tiny policy in a
process of its own), run to their end and print what their page reports."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_documented_runs import TINY, TINY_SHAPE
from test_matrix import ROOT

PAGES = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_documented_benchmark_command_runs_a_script_of_the_package_as_a_module():
    """`python -m benchmarks.NAME` (NAME in lower case: a script here, importable from the root), never a path."""
    pages = {page.name: page.read_text() for page in PAGES}
    sources = {path.relative_to(ROOT).as_posix(): path.read_text()
               for folder in ("benchmarks", "analysis", "testbed") for path in (ROOT / folder).glob("*.py")}
    sources["eval.py"] = (ROOT / "eval.py").read_text()
    for name, text in {**pages, **sources}.items():
        assert not re.search(r"python\s+benchmarks/", text), f"{name} runs a script by its path"
    named = {m for text in pages.values() for m in re.findall(r"python\s+-m\s+benchmarks\.([a-z]\w*)", text)}
    assert {"matrix", "premise", "default_run", "warmup_curve", "reward_drift_demo"} <= named
    for name in sorted(named):
        assert (ROOT / "benchmarks" / f"{name}.py").is_file(), name
        assert importlib.util.find_spec(f"benchmarks.{name}") is not None, name


@pytest.mark.slow
@pytest.mark.parametrize("command, printed", [
    (["tokalign_speed"], "| 2048 |"),
    (["reachability_bench", "--warmup-scale", "0.02", "--problems", "4", "--repeats", "1"],
     "never-trained policy:  mean g = "),
    (["tbd_firing", "--pairs", "qwen-llama", "--formats", "line", "--warmup-scale", "0.02", "--prompts", "2"],
     "| line | qwen -> llama |"),
    (["grpo_step_vs_trl", "--skip-trl", "--steps", "1", "--repeats", "1", "--warmup-scale", "0.02"],
     "evaluation (500 greedy)"),
    (["code_reward", "--sequential", "2", "--batch", "4", "--workers", "4"],
     "HumanEval canonical solutions scoring 1, 4 workers: 164 of 164"),
    (["curation_cost", "--prompts", "2", "--group-size", "2"], "| paper | Llama-3.1-8B | LoRA r16 |"),
    (["memory_estimate", "--training", "lora", "--rollouts", "4", "--micro-batch", "2", "--group-size", "2",
      "--prompt-len", "8", "--max-new-tokens", "4"], "pair peak (GiB): LoRA r=16, checkpointing off: "),
    (["recipe_probe", "--iterations", "1", "--threads", "1", "--", *TINY_SHAPE],
     "after 1 iterations llama: greedy "),
    (["smollm2", "memory"], "LoRA r=16, 4 sequences of "),
    (["smollm2", "accuracy", "--eval-size", "4", "--humaneval", "1", "--max-new-tokens", "8", "--code-tokens", "16"],
     "humaneval: greedy pass@1 "),
    # an option between `speed` and the flags after -- (argparse refused it before they were parsed intermixed)
    (["smollm2", "speed", "--runs-dir", "{tmp}/runs", "--", *TINY], "s per iteration "),
], ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None)
def test_a_documented_benchmark_command_runs_to_its_end(command, printed, tmp_path):
    if command[0] == "tbd_firing":              # its files go beside the test's, not over results/
        command = [*command, "--out", "{tmp}/tbd-firing"]
    done = run_benchmark([arg.format(tmp=tmp_path) for arg in command], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert printed in done.stdout


def run_benchmark(command: list[str], home: Path) -> subprocess.CompletedProcess:
    """`python -m benchmarks.COMMAND[0]` with its arguments, from the root, in a home of its own: the warm-ups cache
    under ~/.cache, and a test must not read another run's."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{command[0]}", *command[1:]], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HOME": str(home)})


@pytest.mark.slow
def test_gpu_checks_cpu_smoke_run_times_each_small_level_for_each_policy(tmp_path):
    from benchmarks import gpu_check
    done = run_benchmark(["gpu_check", "--iterations", "2", "--eval-size", "8", "--max-new-tokens", "24",
                          "--out", str(tmp_path / "check.json"), "--cache-dir", str(tmp_path / "cache"), "--",
                          "--warmup-scale", "0.02"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "check.json").read_text())
    assert written["device"] == "no CUDA device (CPU smoke test)"
    assert [(r["scale"], r["mode"], r["policy"]) for r in written["rows"]] == [
        ("tiny", mode, policy) for mode in gpu_check.SMALL_MODES for policy in ("qwen", "llama")]
    assert all(r["rollout tok/s"] > 0 and r["update tok/s"] > 0 and r["iteration s"] > 0 for r in written["rows"])
    assert all(r["received / it"] == 0 for r in written["rows"] if r["mode"] == "none")


@pytest.mark.slow
def test_reach_estimate_measures_the_same_offers_under_each_estimate_or_says_to_sample_more(tmp_path):
    done = run_benchmark(["reach_estimate", "--seeds", "2001", "--iterations", "1", "--repeats", "1",
                          "--estimates", "exact", "last:2", "--json", str(tmp_path / "reach.json"), "--",
                          "--prompts-per-iteration", "8", "--group-size", "6", "--max-new-tokens", "16",
                          "--warmup-scale", "0.15", "--cache-dir", str(tmp_path / "cache")], tmp_path)
    if done.returncode:   # a warm-up that leaves every offer inert has nothing to compare
        assert "sample more (--iterations, --seeds)" in done.stderr, done.stderr[-2000:]
        return
    rows = json.loads((tmp_path / "reach.json").read_text())["table"]
    assert sorted((r["receiver"], r["estimate"]) for r in rows) == [(n, e) for n in ("llama", "qwen")
                                                                    for e in ("exact", "last:2")]
    offers = {r["receiver"]: r["offers"] for r in rows if r["estimate"] == "exact"}
    assert all(r["offers"] == offers[r["receiver"]] > 0 for r in rows)
    # the verdict printed is the criterion on the table: last:2's band agreement at 85% for every receiver
    meets = min(r["band_agreement"] for r in rows if r["estimate"] == "last:2") >= 0.85
    assert f"chosen by the rule: last:2 ({'meets' if meets else 'MISSES'} the 85% band agreement" in done.stdout


@pytest.fixture
def tree_commit(tmp_path) -> str:
    """A commit of this repository's working tree as it is (files git does not ignore), written through an index
    of its own: a command that checks out `--before` beside the tree then compares the tree with itself. HEAD, the
    index and the files are untouched; the commit is referenced by nothing."""
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "index"), "GIT_AUTHOR_NAME": "test",
           "GIT_AUTHOR_EMAIL": "test@test", "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@test"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], env=env, check=True, capture_output=True,
                              text=True).stdout.strip()
    git("add", "-A")
    return git("commit-tree", git("write-tree"), "-p", "HEAD", "-m", "the working tree under test")


@pytest.mark.slow
def test_same_metrics_finds_the_tree_bit_identical_to_itself_and_names_what_this_sides_flags_move(tree_commit,
                                                                                                  tmp_path):
    done = run_benchmark(["same_metrics", "--before", tree_commit, "--", *TINY], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"{tree_commit} against " in done.stdout and done.stdout.rstrip().endswith("bit-identical")
    done = run_benchmark(["same_metrics", "--before", tree_commit, "--after-flags=--temperature 1.3", "--", *TINY],
                         tmp_path)
    assert done.returncode == 1 and "different:\n  metrics.jsonl line " in done.stdout, done.stderr[-2000:]


@pytest.mark.slow
def test_wall_time_times_each_configuration_at_both_commits_side_by_side(tree_commit, tmp_path):
    done = run_benchmark(["wall_time", "--seed", "900", "--iterations", "1", "--configurations", "none",
                          "cross-fidelity", "--before", tree_commit, "--train-args", " ".join(TINY),
                          "--out", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "wall-time-s900-1it.json").read_text())
    assert written["before"] == tree_commit and list(written["runs"]) == ["none", "cross-fidelity"]
    for sides in written["runs"].values():
        assert list(sides) == ["before", "after"]
        assert all(side["total"] > side["rollouts"] > 0 and side["updates"] > 0 for side in sides.values())
    assert all(sides["curation"] > 0 for sides in written["runs"]["cross-fidelity"].values())
    assert all(sides["curation"] == 0 for sides in written["runs"]["none"].values())
    assert done.stdout.count("| after / before |") == 2
