"""The speed benchmarks: flop_rate.py's FLOP counts against hand counts, speed_check.py's interval by hand, and
the commands end to end (the shared prompt itself is tested in test_grpo.py)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import flop_rate

ROOT = Path(__file__).resolve().parent.parent


def test_counted_adds_each_calls_multiplies_to_its_phase_even_when_the_call_raises():
    totals = {"updates": 0.0}
    a, b = torch.randn(6, 5), torch.randn(5, 7)

    def multiply(fail=False):
        out = a @ b
        if fail:
            raise RuntimeError("after the multiply")
        return out

    wrapped = flop_rate.counted(totals, "updates", multiply)
    assert torch.equal(wrapped(), a @ b)
    with pytest.raises(RuntimeError, match="after the multiply"):
        wrapped(fail=True)
    assert totals["updates"] == 2 * (2 * 6 * 5 * 7)


def test_cpu_attention_is_counted_as_its_matrix_products():
    batch, heads, length, dim = 2, 3, 10, 8
    q = torch.randn(batch, heads, length, dim, requires_grad=True)
    totals = {"forward": 0.0, "backward": 0.0}
    out = flop_rate.counted(totals, "forward", torch.nn.functional.scaled_dot_product_attention)(q, q, q)
    flop_rate.counted(totals, "backward", lambda: out.sum().backward())()
    product = 2 * batch * heads * length * length * dim    # one [L, d] x [d, L] (or [L, L] x [L, d]) product
    assert totals["forward"] == 2 * product                # scores, then their weighted values
    assert totals["backward"] == 5 * product               # scores again, and the gradients of P, V, Q and K


@pytest.mark.slow
def test_the_command_counts_and_times_the_training_phases(tmp_path, cache_dir):
    train_args = (f"--share cross-fidelity --warmup-scale 0.15 --prompts-per-iteration 8 --group-size 6 "
                  f"--max-new-tokens 16 --eval-size 8 --train-size 200 --cache-dir {cache_dir}")
    done = subprocess.run([sys.executable, "-m", "benchmarks.flop_rate", "--iterations", "1",
                           "--train-args", train_args, "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "flop-rate-s900.json").read_text())
    for phase in ("rollouts", "curation", "updates", "evaluation"):
        assert result["flops"][phase] > 0 and result["seconds"][phase] > 0
        assert f"| {phase} |" in done.stdout
    assert result["flops"]["exchange"] == 0    # a curated run's exchange is its curation
    flops = result["flops"]
    if result["offers_measured"]:           # none where every offer happened to be inert: no norm is measured
        assert 0 < flops["gradient norms"] < flops["curation"]
        assert 0 < flops["norms: forward"] < flops["norms: backward and glue"]   # J backwards, each about a forward
        assert flops["norms: from factors"] > 0
    else:
        assert flops["gradient norms"] == 0
    assert all(f"| {part} |" in done.stdout for part in ("norms: forward", "norms: backward and glue"))


@pytest.mark.slow
def test_the_shared_prompt_command_runs():
    done = subprocess.run([sys.executable, "-m", "benchmarks.shared_prompt", "--warmup-scale", "0.02",
                           "--prompts", "2", "--group-size", "3", "--repeats", "1"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("largest gradient difference") == 2


def test_speed_check_reads_the_paired_difference_against_a_t_interval_by_hand(tmp_path):
    from benchmarks import speed_check
    from test_matrix import summary, write_summaries

    def folder(name, points, seconds):
        runs = [{**summary("none", seed, p), "iteration_s": s} for seed, p, s in zip((7, 8, 9), points, seconds)]
        write_summaries(tmp_path / name, runs)
        return speed_check.by_seed(tmp_path / name)

    before = folder("before", (10.0, 20.0, 30.0), (100.0, 110.0, 90.0))
    # differences 2, 1, 3: mean 2, SD 1, half-width 4.303 / sqrt(3) = 2.484 -> [-0.484, 4.484], 0 inside
    wide = speed_check.check(before, folder("wide", (12.0, 21.0, 33.0), (50.0, 60.0, 40.0)))
    p = next(r for r in wide if r["policy"] == "p")
    assert p["difference"] == pytest.approx(2.0) and p["sd_before"] == pytest.approx(10.0)
    assert p["interval"] == pytest.approx((2 - 4.303 / 3 ** 0.5, 2 + 4.303 / 3 ** 0.5), abs=1e-3)   # the printed t
    assert not p["moved"]
    assert wide[-1]["ratio"] == pytest.approx(150 / 300)
    # differences 2, 2.1, 1.9: SD 0.1, half-width 0.248 -> 0 outside
    tight = speed_check.check(before, folder("tight", (12.0, 22.1, 31.9), (100.0, 110.0, 90.0)))
    assert next(r for r in tight if r["policy"] == "p")["moved"]
    done = subprocess.run([sys.executable, "-m", "benchmarks.speed_check", str(tmp_path / "before"),
                           str(tmp_path / "tight")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| p | 7, 8, 9 |" in done.stdout and "after / before 1.00" in done.stdout


@pytest.mark.slow
def test_the_default_run_check_runs_twice_into_one_folder(tmp_path):
    command = [sys.executable, "-m", "benchmarks.default_run", "--seeds", "1", "--threads", "1",
               "--jobs", "1", "--runs-dir", str(tmp_path), "--train-args",
               "--eval-size 4 --iterations 1 --warmup-scale 0.02 --prompts-per-iteration 2 --group-size 2 "
               "--max-new-tokens 8 --train-size 50"]
    for _ in range(2):   # a second check replaces the first's run rather than meeting it as another run's folder
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        assert re.search(r"default-s1-t1: \d+ s wall", done.stdout)
        # each check's cache is empty, and a short warm-up is not the packaged one: both are made then
        assert "warm-ups: qwen warmed up now (20 steps), llama warmed up now (16 steps)" in done.stdout
    assert len(re.findall(r"\| default-s1-t1 \| \w+ \| [\d.]+ ± [\d.]+ \|", done.stdout)) == 2   # a row a policy


def test_the_default_run_table_by_hand(tmp_path):
    # standard errors over the held-out problems the run evaluated, from its config (here 4), not a default;
    # greedy 0.25 -> 0.5, sampled 0.1 -> 0.2, training reward 0.0 for 20 iterations then 1.0 for 20
    from benchmarks import default_run
    (tmp_path / "config.json").write_text(json.dumps({"eval_size": 4}))
    lines = [{"policy": "p", "iteration": i, "eval/heldout_accuracy": a, "eval/heldout_sampled_accuracy": b}
             for i, a, b in ((0, 0.25, 0.1), (40, 0.5, 0.2))]
    lines += [{"policy": "p", "iteration": i, "charts/reward_mean": float(i >= 20)} for i in range(40)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    assert default_run.rows(tmp_path) == [f"| {tmp_path.name} | p | 0.250 ± 0.217 | 0.500 ± 0.250 | +0.250 "
                                          "| 0.100 → 0.200 | 0.000 → 1.000 |"]
