"""Every train.py command of the README and docs/ that runs offline, trained for one iteration at the tests' tiny
size after its own flags (so that its pair, share, curator settings, step format and seed are the command's): a
documented command that crashes is a defect. Those that need a GPU, the model hub, a data set or a run to resume
(--scale, --task, --model-dir, --model-paths, --devices, --resume) are parsed by test_args and run where a test
has what they need (test_real_weights, the resume tests); train_ray.py's need a GPU or a cluster."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import tyro

import train
from args import Args
from test_args import documented_commands
from test_train import MIXED
from testbed import presets

ROOT = Path(__file__).resolve().parents[1]
NEEDS_MORE = ("--scale", "--task", "--model-dir", "--model-paths", "--devices", "--resume")
OFFLINE = [flags for script, flags in documented_commands()
           if script == "train.py" and not any(f in NEEDS_MORE for f in flags)]
TINY_SHAPE = ["--prompts-per-iteration", "8", "--group-size", "6", "--max-new-tokens", "16", "--eval-size", "8",
              "--train-size", "200", "--num-steps", "1", "--max-operand", "9", "--warmup-scale", "0.02",
              "--no-tensorboard"]
"""a small task after a short warm-up (seven seeds and pairs warm up: the full one took minutes)"""
TINY = ["--iterations", "1", *TINY_SHAPE]
"""one iteration of it"""


def test_train_py_help_prints_every_flag_with_its_documentation():
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(f"--{name.replace('_', '-')}" in done.stdout for name in ("pair", "share", "ablate", "resume"))


@pytest.mark.slow
@pytest.mark.parametrize("flags", OFFLINE, ids=[" ".join(f) or "default" for f in OFFLINE])
def test_a_documented_train_command_runs_an_iteration(flags, tmp_path, cache_dir, scripted_rewards):
    args = tyro.cli(Args, args=[*flags, *TINY, "--runs-dir", str(tmp_path), "--cache-dir", cache_dir])
    if args.share == "cross-fidelity":  # every group mixed, so offers are diagnosed whatever was sampled
        scripted_rewards(lambda policy, problems: torch.tensor([MIXED] * len(problems)))
    run_dir = train.main(args)
    updates = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "losses/policy_loss" in r]
    assert sorted(r["policy"] for r in updates) == sorted(s.name for s in presets.preset(args.pair, "tiny"))
    assert all(r["iteration"] == 1 and math.isfinite(r["losses/policy_loss"]) for r in updates)
    if args.share != "cross-fidelity":
        return
    records = [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines()]
    assert any("D" in r for r in records)
    for r in (r for r in records if "D" in r):
        kept = [t for t in ("tbd", "ccm", "rsd") if t not in args.ablate]
        # an ablated term is not measured, weighs nothing in D and is not repaired; the others keep their weight
        assert all(r["terms"][t] is None or math.isnan(r["terms"][t]) for t in args.ablate)
        assert r["D"] == pytest.approx(sum(0 if math.isnan(r["scaled"][t]) else r["scaled"][t] for t in kept) / 3,
                                       abs=1e-6)
        assert not set(args.ablate) & set(r["repairs"])
