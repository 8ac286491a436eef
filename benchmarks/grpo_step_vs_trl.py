"""One GRPO step of this project against TRL's GRPOTrainer on the same tiny Llama, batch and settings.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 -r requirements.txt \
        -r benchmarks/requirements.txt
    .venv-trl/bin/python -m benchmarks.grpo_step_vs_trl            # --steps 8 --warmup-scale 1.0

Both sides start from the same warmed-up policy (a copy each): 8 prompts x 8 completions, 40 new tokens, temperature
0.7, lr 3e-5, beta 0, one update per batch. TRL's steps are timed by a callback, and after each of them this project's
step runs (rollout + reward + advantages + exchange + update), so both see the same load. Then the phases of one
project iteration of the default pair are timed on their own, with the rollout also through model.generate as it was
before (the candidate the direct decode loop replaced), and each phase's FLOPs (the update's with each prompt once, as
it computes it) over the matmul probe's throughput give its bound. Medians; the machine's load moves the absolute
figures, the interleaving keeps the ratios honest.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch

import eval as evaluation
import grpo
import learner
import sharing
from testbed import arith
from testbed import costs
from testbed import policies
from testbed import tasks

PROMPTS, GROUP, NEW_TOKENS, TEMPERATURE, LR = 8, 8, 40, 0.7, 3e-5


def project_step(policy: policies.Policy, optimizer, task: tasks.Task, problems: list, phases: dict) -> None:
    """One iteration of train.py for one policy, each phase's seconds appended to `phases`."""
    prompts = [task.prompt(q) for q in problems]
    clock = time.perf_counter()
    rollouts = policy.rollout(prompts, GROUP, NEW_TOKENS, TEMPERATURE)
    phases.setdefault("rollout", []).append(time.perf_counter() - clock)
    clock = time.perf_counter()
    rewards = tasks.group_rewards(task, problems, rollouts.texts, GROUP)
    experience = sharing.Experience(policy, prompts, rollouts, rewards, grpo.group_advantages(rewards))
    phases.setdefault("reward", []).append(time.perf_counter() - clock)
    clock = time.perf_counter()
    received = sharing.exchange([experience], sharing.ShareConfig("none", temperature=TEMPERATURE))
    phases.setdefault("exchange", []).append(time.perf_counter() - clock)
    clock = time.perf_counter()
    batch = learner.training_batch(policy, rollouts, received[policy.name])
    grpo.grpo_step(policy.model, optimizer, batch, grpo.LossConfig(), temperature=TEMPERATURE)
    phases.setdefault("update", []).append(time.perf_counter() - clock)


def generate_rollout(policy: policies.Policy, prompts: list[str]) -> torch.Tensor:
    """The sampler as it was before sequences.decode: model.generate keeping every step's logits, [N, T]."""
    prompt_lists = [policy.encode_prompt(p) for p in prompts for _ in range(GROUP)]
    batch = policy.tokenizer.pad({"input_ids": prompt_lists}, return_tensors="pt")
    policy.model.eval()
    with torch.no_grad():
        out = policy.model.generate(**batch, do_sample=True, temperature=TEMPERATURE, top_k=None,
                                    max_new_tokens=NEW_TOKENS, pad_token_id=policy.tokenizer.pad_token_id,
                                    eos_token_id=policy.tokenizer.eos_token_id, return_dict_in_generate=True,
                                    output_logits=True)
    policy.model.train()
    new = out.sequences[:, batch["input_ids"].shape[1]:]                                          # [N, T]
    return torch.stack([torch.log_softmax(s.float() / TEMPERATURE, -1).gather(-1, i.unsqueeze(-1)).squeeze(-1)
                        for s, i in zip(out.logits, new.T)], 1)                                   # [N, T]


def trl_side_by_side(policy: policies.Policy, task: tasks.Task, steps: int) -> None:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    ours = copy.deepcopy(policy)  # its own copy of the model, as TRL gets one
    optimizer = torch.optim.AdamW(ours.model.parameters(), lr=LR, weight_decay=0.0)
    problems = task.train[:PROMPTS * (steps + 2)]
    by_prompt = {task.prompt(q): q for q in problems}

    def reward(prompts, completions, **_):
        return [task.reward(by_prompt[p], c) for p, c in zip(prompts, completions)]

    times: dict[str, list[float]] = {"trl": [], "ours": []}
    phases: dict[str, list[float]] = {}

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times["trl"].append(time.perf_counter() - self.began)
            step = len(times["ours"])
            began = time.perf_counter()
            project_step(ours, optimizer, task, problems[PROMPTS * step:PROMPTS * (step + 1)], phases)
            times["ours"].append(time.perf_counter() - began)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
                            max_completion_length=NEW_TOKENS, temperature=TEMPERATURE, top_p=1.0, top_k=0,
                            learning_rate=LR, beta=0.0, num_iterations=1, steps_per_generation=1,
                            max_steps=steps + 1, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                            logging_steps=10_000, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                            shuffle_dataset=False, disable_dropout=True, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=copy.deepcopy(policy.model), reward_funcs=reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": list(by_prompt)}),
                              processing_class=policy.tokenizer, callbacks=[Interleave()])
        trainer.train()
    trl_s, ours_s = statistics.median(times["trl"][1:]), statistics.median(times["ours"][1:])
    print(f"GRPO step, tiny Llama, {PROMPTS}x{GROUP} completions, {NEW_TOKENS} new tokens, median of "
          f"{len(times['trl']) - 1} interleaved steps (the first of each dropped):")
    print(f"  TRL {__import__('trl').__version__} GRPOTrainer  {trl_s:.3f} s/step")
    print(f"  this project           {ours_s:.3f} s/step   ({trl_s / ours_s:.2f}x TRL's speed)")
    print("  its phases: " + ", ".join(f"{k} {statistics.median(v[1:]):.3f} s" for k, v in phases.items()))


def phase_bounds(pols: list[policies.Policy], task: tasks.Task, repeats: int, flops_per_s: float) -> None:
    """Each phase of one iteration of the default pair (16 prompts x 8) against its FLOP bound."""
    print(f"\nphases of one default iteration per policy (16 x 8 rollouts, median of {repeats}; bound = FLOPs at "
          f"{flops_per_s / 1e12:.3f} TFLOP/s, the matmul probe):")
    for policy in pols:
        params = sum(p.numel() for p in policy.model.parameters())
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=LR, weight_decay=0.0)
        problems = task.train[:16]
        prompts = [task.prompt(q) for q in problems]
        seconds: dict[str, list[float]] = {}
        for _ in range(repeats):
            clock = time.perf_counter()
            generate_rollout(policy, prompts)
            seconds.setdefault("rollout by generate()", []).append(time.perf_counter() - clock)
            project_step(policy, optimizer, task, problems, seconds)
            clock = time.perf_counter()
            evaluation.heldout_accuracy(policy, task.heldout, NEW_TOKENS, task)
            seconds.setdefault("evaluation (500 greedy)", []).append(time.perf_counter() - clock)
        rollouts = policy.rollout(prompts, GROUP, NEW_TOKENS, TEMPERATURE)
        prompt_tokens = sum(len(p) for p in rollouts.prompt_ids)
        distinct_prompt_tokens = sum(map(len, {tuple(p.tolist()) for p in rollouts.prompt_ids}))  # once each
        completion_tokens = sum(len(c) for c in rollouts.completion_ids)
        greedy = policy.rollout([task.prompt(q) for q in task.heldout], 1, NEW_TOKENS, greedy=True)
        eval_tokens = sum(len(p) + len(c) for p, c in zip(greedy.prompt_ids, greedy.completion_ids))
        flops = {"rollout": 2 * params * (prompt_tokens + completion_tokens),
                 "rollout by generate()": 2 * params * (prompt_tokens + completion_tokens),
                 "update": 6 * params * (distinct_prompt_tokens + completion_tokens),
                 "evaluation (500 greedy)": 2 * params * eval_tokens}
        print(f"  {policy.name} ({params / 1e6:.2f}M parameters, {completion_tokens} sampled tokens):")
        for phase, values in seconds.items():
            s = statistics.median(values)
            bound = flops[phase] / flops_per_s if phase in flops else None
            print(f"    {phase:24s} {s * 1000:8.1f} ms" + (f"   bound {bound * 1000:6.1f} ms   {s / bound:5.1f}x above"
                                                         if bound else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each side (one more is dropped)")
    parser.add_argument("--warmup-scale", type=float, default=1.0, help="of the tiny policies' warm-up budget")
    parser.add_argument("--cache-dir", default=None, help="warm-up cache (default ~/.cache/cross-fidelity)")
    parser.add_argument("--skip-trl", action="store_true", help="only the phases (no TRL needed)")
    parser.add_argument("--repeats", type=int, default=None, help="timings of each phase (default: max(3, steps // 2))")
    cli = parser.parse_args()
    if cli.repeats is not None and cli.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {cli.repeats}")
    torch.manual_seed(0)
    task = tasks.load_task("arith", 1, 5000, 500, arith.TaskConfig())
    pols = policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), arith.TaskConfig(), 1, cli.cache_dir,
                                  warmup_scale=cli.warmup_scale)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not cli.skip_trl:
        trl_side_by_side(pols[1], task, cli.steps)
    repeats = max(3, cli.steps // 2) if cli.repeats is None else cli.repeats
    phase_bounds(pols, task, repeats, costs.matmul_flops_per_s(torch.device("cpu"), torch.float32, n=512))


if __name__ == "__main__":
    main()
