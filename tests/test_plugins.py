"""A share and a task registered from this file alone train one iteration: the core knows no baseline or task by
name beyond its registries (sharing.SHARES, tasks.REGISTERED)."""

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import reward_drift
import sharing
import train
from testbed import arith, checkpoint, tasks
from test_train import records, tiny_args

# ---- a toy share: every peer success crosses with advantage 1; it counts the iterations it observed -------------


@dataclass
class Seen:
    iterations: int = 0


class Echo:
    def __init__(self):
        self.exchanged: list[tuple[str | None, list[sharing.Experience]]] = []

    def settings(self, args) -> None:
        return None

    def check(self, args) -> None:
        if args.group_size > 6:
            raise ValueError("--share echo takes --group-size 6 or fewer")

    def received_at_most(self, rollouts: int) -> int:
        return rollouts

    def start(self, cfg: sharing.ShareConfig) -> Seen:
        return Seen()

    def observe(self, state: Seen, rewards: dict[str, torch.Tensor]) -> int:
        state.iterations += 1
        return state.iterations

    def exchange(self, experiences, cfg, context, receiver_name=None):
        self.exchanged.append((receiver_name, experiences))
        out = {}
        for receiver in experiences:
            if receiver_name not in (None, receiver.policy.name):
                continue
            crossings = [c for peer in experiences if peer is not receiver
                         for c in sharing.cross(peer, [(i, 1.0) for i, r in enumerate(peer.rewards.flatten().tolist())
                                                       if r >= cfg.success], receiver.policy, cfg)]
            out[receiver.policy.name] = sharing.Received(
                receiver.advantages, crossings, {"sharing/received": float(len(crossings)), "toy/seen": float(context)})
        return out


# ---- a toy task: the arithmetic problems, rewarded where the completion's last digit is even --------------------

def last_digit_even(problem, completion: str) -> float:
    digits = [c for c in completion if c.isdigit()]
    return float(bool(digits) and int(digits[-1]) % 2 == 0)


def even_task(seed: int, train_size: int, eval_size: int, cfg: arith.TaskConfig) -> tasks.Task:
    return tasks.Task("even", arith.generate_problems(train_size, "train", seed, cfg),
                      arith.generate_problems(eval_size, "heldout", seed, cfg), arith.prompt_text, last_digit_even,
                      lambda problem, completion: [None] * len(tasks.line_spans(completion)),
                      step_type=lambda line: f"{len(line)} characters")


def reference(completion: str) -> float:
    found = re.search(r"(\d)\D*$", completion)
    return float(found is not None and found.group(1) in "02468")


def test_a_share_and_a_task_registered_from_a_test_file_train_one_iteration(tmp_path, cache_dir, monkeypatch):
    echo = Echo()
    monkeypatch.setitem(sharing.SHARES, "echo", echo)
    monkeypatch.setitem(tasks.REGISTERED, "even", even_task)
    with pytest.raises(ValueError, match="--group-size 6 or fewer"):
        tiny_args(tmp_path, cache_dir, share="echo", group_size=8)
    run_dir = train.main(tiny_args(tmp_path, cache_dir, share="echo", task="even", iterations=1))

    updates = [r for r in records(run_dir) if "sharing/received" in r]
    assert [name for name, _ in echo.exchanged] == [r["policy"] for r in updates] == ["qwen", "llama"]
    for (name, experiences), r in zip(echo.exchanged, updates):      # each receiver's own experience comes first
        receiver, *peers = experiences
        for e in experiences:
            assert e.rewards.flatten().tolist() == [reference(text) for text in e.rollouts.texts]
        assert r["sharing/received"] == sum(int((p.rewards >= 1).sum()) for p in peers) and r["toy/seen"] == 1.0
        assert r["charts/reward_mean"] == pytest.approx(receiver.rewards.mean().item())
    _, _, saved = checkpoint.latest_checkpoint(run_dir)
    assert saved == Seen(iterations=1)


def test_the_core_names_no_baseline():
    root = Path(__file__).resolve().parents[1]
    for name in ("train.py", "learner.py", "sharing.py", "grpo.py", "curator.py", "diagnosis.py"):
        found = re.findall(r".*(?:hacpo|graft).*", (root / name).read_text(), flags=re.IGNORECASE)
        assert not found, f"{name} names a baseline: {found[:3]}"


def test_a_task_types_its_own_steps_for_rsd_and_the_arithmetic_key_stands_in_without():
    task = even_task(0, 2, 0, arith.TaskConfig())
    steps = reward_drift.process_rewards(task, task.train[0], "7 + 5 = 12\nAnswer: 12")
    assert [(s.span, s.type, s.reward) for s in steps] == [((0, 10), "10 characters", None),
                                                          ((11, 21), "10 characters", None)]
    plain = reward_drift.process_rewards(replace(task, step_type=None), task.train[0], "7 + 5 = 12\nAnswer: 12")
    assert [s.type for s in plain] == ["+1c", None]     # 7 + 5 carries; an answer line is no typed step


def test_the_command_line_offers_a_share_and_a_task_registered_before_it_is_read():
    import subprocess
    import sys
    script = ("import sharing\n"
              "class Quiet:\n"
              "    def settings(self, args): return None\n"
              "    def check(self, args): pass\n"
              "sharing.SHARES['quiet'] = Quiet()\n"
              "from testbed import tasks\n"
              "tasks.REGISTERED['quiz'] = None\n"
              "import tyro\n"
              "from args import Args\n"
              "chosen = tyro.cli(Args, args=['--share', 'quiet', '--task', 'quiz', '--eval-task', 'quiz'])\n"
              "print(chosen.share, chosen.task, chosen.eval_task)\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-3:] == ["quiet", "quiz", "quiz"], done.stderr[-2000:]
