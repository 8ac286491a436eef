"""The command line (args.py): settings that cannot run are refused as they are parsed, and every train command
the README and the docs show parses."""

import re
import shlex
from pathlib import Path

import pytest
import tyro

import train_ray
from args import Args, script_args
from testbed import policies


@pytest.mark.parametrize("flags, flag", [(dict(theta1=0.3, theta2=0.2), "--theta1"),
                                         (dict(fidelity_lambdas=(0.5, 0.5, 0.5)), "--fidelity-lambdas"),
                                         (dict(ablate=("ccm",), process_signal="intrinsic"), "--process-signal"),
                                         (dict(share="hacpo", epochs=2), "--epochs 1"),
                                         (dict(share="graft", prompts_per_iteration=4, minibatches=5),
                                          "--minibatches 4 or fewer"),
                                         (dict(temperature=0.0), "--temperature"),
                                         (dict(temperature=-1.0), "--temperature"),
                                         (dict(temperature=float("nan")), "--temperature"),
                                         (dict(top_p=0.0), "--top-p"), (dict(top_p=1.5), "--top-p"),
                                         (dict(max_new_tokens=0), "--max-new-tokens"), (dict(lr=-1e-4), "--lr"),
                                         (dict(eval_samples=-1), "--eval-samples"),
                                         (dict(max_grad_norm=-1.0), "--max-grad-norm"),
                                         (dict(max_grad_norm=0.0), "--max-grad-norm"),
                                         (dict(max_grad_norm=float("nan")), "--max-grad-norm"),
                                         (dict(ratio_cap=float("nan")), "--ratio-cap"),
                                         (dict(clip_eps_low=1.0), "--clip-eps-low"),
                                         (dict(clip_eps_high=float("nan")), "--clip-eps-high"),
                                         (dict(beta=float("nan")), "--beta"), (dict(ccm_beta=-1.0), "--ccm-beta"),
                                         (dict(group_size=1), "--group-size 1"),
                                         (dict(prompts_per_iteration=0), "--prompts-per-iteration 0")])
def test_settings_that_cannot_run_are_refused_as_the_arguments_are_parsed(tmp_path, flags, flag):
    with pytest.raises(ValueError, match=flag):
        Args(runs_dir=str(tmp_path), **flags)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("clash", [["--lora-rank", "4"], ["--lora-rank=4"], ["--lora_rank", "4"]])
def test_a_benchmarks_flags_after_the_double_dash_keep_their_values_unless_the_benchmark_sets_that_field(clash):
    args = script_args("bench.py", ["--temperature", "0.7", "--warmup-scale=0.1"], lora_rank=8, seed=5)
    assert (args.temperature, args.warmup_scale, args.lora_rank, args.seed) == (0.7, 0.1, 8, 5)
    assert args.share == Args.share                             # every other field its default
    with pytest.raises(ValueError, match=r"bench.py sets --lora-rank itself: drop it after -- \(its own options: "
                                         r"bench.py --help\)"):
        script_args("bench.py", ["--temperature", "0.7", *clash], lora_rank=8, seed=5)


def documented_commands() -> list[tuple[str, list[str]]]:
    """(script, its flags) of every train.py and train_ray.py command in a bash block of the README and docs/, each
    once, in the order they appear (--help aside)."""
    root = Path(__file__).resolve().parents[1]
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    readme = readme.replace('$(python -c "from testbed import policies; print(policies.packaged_gguf())")',
                            str(policies.packaged_gguf()))
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", readme, re.S))
    commands = [(script, line.split("#")[0].split(f"python {script}", 1)[1]) for line in blocks.splitlines()
                for script in ("train.py", "train_ray.py") if f"python {script}" in line and "--help" not in line]
    return [(script, list(flags)) for script, flags in dict.fromkeys((s, tuple(shlex.split(c))) for s, c in commands)]


def test_every_train_command_of_the_readme_and_docs_parses():
    commands = documented_commands()
    assert len(commands) > 10 and sum(script == "train_ray.py" for script, _ in commands) == 3
    for script, flags in commands:
        args = tyro.cli(train_ray.RayArgs if script == "train_ray.py" else Args, args=flags)
        assert args.share_config and args.curator_config
