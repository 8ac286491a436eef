"""The concept files' demos that the README shows (`python curator.py`, `python -m benchmarks.reachability_demo`, ...)
run to their end and print what they say they print. Each runs in this process on the tiny pair with a short warm-up
(the documented command warms up fully, which takes minutes): the code path is the same."""

import runpy
import sys
from pathlib import Path

import pytest

from testbed import policies

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def short_warm_up(monkeypatch, cache_dir):
    """Every tiny warm-up at a twentieth of its budget, in the test session's cache."""
    full = policies.warm_up_cached

    def short(policy, spec, task_cfg, seed, cache_dir_, warmup_scale):
        full(policy, spec, task_cfg, seed, cache_dir, warmup_scale * 0.05)
    monkeypatch.setattr(policies, "warm_up_cached", short)


@pytest.mark.parametrize("command, printed", [
    (["grpo.py", "--updates", "2"], "mean log-prob change of A > 0 tokens"),
    (["-m", "benchmarks.reward_drift_demo"], "RSD term = "),
    (["-m", "benchmarks.reachability_demo"], "'s solution, reward"),   # its step lines, where a solution holds a line
    (["boundary_drift.py", "--step-format", "prose", "--target", "mistral"], "TBD per step by credit"),
    (["curator.py"], "most degraded: "),
])
def test_a_readme_demo_runs_to_its_end(command, printed, short_warm_up, monkeypatch, capsys):
    """`python FILE ARGS` or `python -m MODULE ARGS`, in this process."""
    module = command[1] if command[0] == "-m" else None
    args = command[2:] if module else command[1:]
    monkeypatch.setattr(sys, "argv", [module or str(ROOT / command[0]), *args])
    try:
        if module:
            runpy.run_module(module, run_name="__main__")
        else:
            runpy.run_path(str(ROOT / command[0]), run_name="__main__")
    except SystemExit as stop:
        # the curator's demo on policies whose every reward on a prompt was the same: nothing was diagnosed, and
        # it says so after printing where each policy's offers went
        assert command[0] == "curator.py" and "no offer was diagnosed" in str(stop.code)
        printed = "into llama: "
    assert printed in capsys.readouterr().out
