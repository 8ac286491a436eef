"""The benchmark commands docs/ shows that no other test runs, each at its shortest settings: it runs to its end
and prints what its page reports. benchmarks/gpu_check.py's CPU smoke run (about 6 minutes here) and
benchmarks/recipe_probe.py (a full warm-up) are left to be run by hand."""

import os
import subprocess
import sys

import pytest

from test_matrix import ROOT

pytestmark = pytest.mark.slow   # each trains or times a tiny policy in a process of its own


@pytest.mark.parametrize("command, printed", [
    (["tokalign_speed.py"], "| 2048 |"),
    (["reachability_bench.py", "--warmup-scale", "0.02", "--problems", "4", "--repeats", "1"],
     "never-trained policy:  mean g = "),
    (["tbd_firing.py", "--pairs", "qwen-llama", "--formats", "line", "--warmup-scale", "0.02", "--prompts", "2"],
     "| line | qwen -> llama |"),
    (["grpo_step_vs_trl.py", "--skip-trl", "--steps", "1", "--repeats", "1", "--warmup-scale", "0.02"],
     "evaluation (500 greedy)"),
    (["code_reward.py", "--sequential", "2", "--batch", "4", "--workers", "4"],
     "HumanEval canonical solutions scoring 1, 4 workers: 164 of 164"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_documented_benchmark_command_runs_to_its_end(command, printed, tmp_path):
    if command[0] == "tbd_firing.py":           # its files go beside the test's, not over results/
        command = [*command, "--out", str(tmp_path / "tbd-firing")]
    # a home of its own: the warm-ups cache under ~/.cache, and a test must not read another run's
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / command[0]), *command[1:]], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert printed in done.stdout
