"""Held-out measures of a branch's receivers smoother than greedy accuracy (issue 68; the study that chooses among
them: results/preregistration-branches-measure.md).

Greedy accuracy on 2,000 fixed problems has no sampling in it, yet a small change of the weights moves it in steps:
a problem counts only once its most likely completion flips. The pilot's control that must hurt, an arm that
negates the credit of every admitted offer, moved it by -0.9 points with a standard deviation of 2.5 between
branch points (results/branches-pilot/plan.md). Two measures move with the weights continuously:

- **reference log-likelihood** (`reference_loglik`): the mean over held-out problems of log pi(y* | x), y* the
  task's own solution in the run's step format (arith.solution) with its EOS, pi the policy at the training
  temperature, the distribution the update optimizes; in nats a problem.
- **importance-weighted reward** (`importance_weighted_reward`): the expected reward under pi, estimated from
  S completions of each held-out problem drawn once from the trunk at the branch point (mu), the same samples for
  every arm. Self-normalized per problem:

      R(pi) = 1/B sum_b sum_s w_bs r_bs,   w_bs = softmax_s(log pi(y_bs | x_b) - log mu(y_bs | x_b))

  Biased for finite S, consistent, and exactly the samples' mean reward where pi = mu, so that two arms differ
  by their weights alone. mu's log-probs are recomputed by the same forward as pi's (`sequence_logprobs`), not
  taken from the sampler, so that w = 1 exactly at the trunk's own weights.

`HeldOutMeasures(trunk_dir)` draws a branch point's samples from the trunk's checkpoint; called on a branch's run
directory, it gives each policy's greedy accuracy, reference log-likelihood and importance-weighted reward at the
branch's last checkpoint, or those of them it is asked for (`names`): the log-likelihood alone draws nothing and
costs a forward pass over the held-out solutions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

import eval as evaluation
from testbed import arith, checkpoint, policies, tasks
from testbed.sequences import pack_sequences, token_logprobs_and_entropy

IW_PROBLEMS = 500
"""held-out problems the importance-weighted reward reads (the first of the evaluation's)"""
IW_SAMPLES = 8
"""completions drawn from the trunk per problem"""
MEASURES = ("accuracy", "loglik", "iw_reward")
"""every measure a branch can carry: A, L and R of the measure study"""


@dataclass
class BehaviourSamples:
    """S completions of each of B held-out problems drawn from the trunk at a branch point (mu), prompt-major."""

    prompt_ids: list[list[int]]        # N x [P_i]    N = B*S
    completion_ids: list[list[int]]    # N x [T_i]    EOS included where emitted
    logprobs: torch.Tensor             # [N]          log mu(completion | prompt) at the temperature
    rewards: torch.Tensor              # [B, S]
    temperature: float


def sequence_logprobs(policy: policies.Policy, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float, micro_batch: int = 64) -> torch.Tensor:
    """[N] log pi(completion | prompt) of each row, the sum over its tokens, pi the policy at `temperature` (in
    eval mode, as it samples)."""
    out, was_training = [], policy.model.training
    policy.model.eval()
    for i in range(0, len(prompts), micro_batch):
        input_ids, attention, mask = pack_sequences(prompts[i:i + micro_batch], completions[i:i + micro_batch],
                                                    policy.tokenizer.pad_token_id)
        with torch.no_grad():
            chosen, _ = token_logprobs_and_entropy(policy.model, input_ids.to(policy.device),
                                                   attention.to(policy.device), temperature)   # [n, L-1]
        out.append(torch.where(mask.bool(), chosen.cpu(), 0.0).sum(-1))      # [n]; a pad's -inf never enters
    policy.model.train(was_training)
    return torch.cat(out)


def reference_loglik(policy: policies.Policy, task: tasks.Task, problems: list[arith.Problem], step_format: str,
                     temperature: float) -> float:
    """The mean over `problems` of log pi(solution + EOS | prompt), in nats a problem."""
    if not problems:
        raise ValueError("no held-out problems to measure")
    prompts = [policy.encode_prompt(task.prompt(p)) for p in problems]
    solutions = [policy.encode_completion(arith.solution(p, step_format), eos=True) for p in problems]
    return sequence_logprobs(policy, prompts, solutions, temperature).mean().item()


def behaviour_samples(policy: policies.Policy, task: tasks.Task, problems: list, samples: int, max_new_tokens: int,
                      temperature: float, generator: torch.Generator) -> BehaviourSamples:
    """`samples` completions of each problem drawn from `policy` at `temperature` (no nucleus: the estimate needs
    mu's full distribution), their rewards and their log-probs by `sequence_logprobs`."""
    rollouts = policy.rollout([task.prompt(p) for p in problems], samples, max_new_tokens, temperature=temperature,
                              generator=generator)
    prompts = [ids.tolist() for ids in rollouts.prompt_ids]
    completions = [ids.tolist() for ids in rollouts.completion_ids]
    return BehaviourSamples(prompts, completions, sequence_logprobs(policy, prompts, completions, temperature),
                            tasks.group_rewards(task, problems, rollouts.texts, samples), temperature)


def importance_weighted_reward(target_logprobs: torch.Tensor, behaviour: BehaviourSamples) -> float:
    """R(pi) of the module docstring from pi's log-probs of the behaviour's completions, [N] prompt-major."""
    if not torch.isfinite(target_logprobs).all():
        raise ValueError("a target log-prob is not finite: the estimate needs pi > 0 on every sample")
    log_ratios = (target_logprobs - behaviour.logprobs).view_as(behaviour.rewards)              # [B, S]
    weights = torch.softmax(log_ratios.double(), dim=1)                                          # [B, S]
    return (weights * behaviour.rewards.double()).sum(1).mean().item()


def draws_seed(seed: int, point: int, policy: str) -> int:
    """The seed of a branch point's draws from one policy: its run's seed, the point and the policy alone."""
    return random.Random(f"branch-measures/{seed}/{point}/{policy}").getrandbits(63)


class HeldOutMeasures:
    """A branch point's measures, drawn from the trunk's run directory at its last checkpoint (the point)."""

    def __init__(self, trunk_dir: Path, names: tuple[str, ...] = MEASURES, problems: int = IW_PROBLEMS,
                 samples: int = IW_SAMPLES):
        unknown = set(names) - set(MEASURES)
        if unknown or not names:
            raise ValueError(f"measures {sorted(unknown) or 'none'} asked for: name some of {MEASURES}")
        config, task_cfg, trunk = evaluation.run_policies(trunk_dir)
        self.names = tuple(names)
        self.step_format = task_cfg.step_format
        self.temperature, self.max_new_tokens = config["temperature"], config["max_new_tokens"]
        self.task = tasks.load_task("arith", config["seed"], 0, config["eval_size"], task_cfg)
        point = checkpoint.latest_checkpoint(trunk_dir)[0]
        drawn = self.task.heldout[:problems]
        self.behaviour = {p.name: behaviour_samples(
            p, self.task, drawn, samples, self.max_new_tokens, self.temperature,
            torch.Generator(p.device).manual_seed(draws_seed(config["seed"], point, p.name)))
            for p in trunk} if "iw_reward" in names else {}

    def __call__(self, run_dir: Path) -> dict[str, dict[str, float]]:
        """Each policy's measures at the run's last checkpoint, those named and in MEASURES's order."""
        _, task_cfg, pols = evaluation.run_policies(run_dir)
        if task_cfg.step_format != self.step_format:
            raise ValueError(f"{run_dir} writes {task_cfg.step_format} steps, its trunk {self.step_format}")
        return {p.name: {name: self.measure(name, p) for name in MEASURES if name in self.names} for p in pols}

    def measure(self, name: str, policy: policies.Policy) -> float:
        """One measure of one policy at its present weights."""
        if name == "accuracy":
            return evaluation.heldout_accuracy(policy, self.task.heldout, self.max_new_tokens, self.task)
        if name == "loglik":
            return reference_loglik(policy, self.task, self.task.heldout, self.step_format, self.temperature)
        behaviour = self.behaviour[policy.name]
        target = sequence_logprobs(policy, behaviour.prompt_ids, behaviour.completion_ids, self.temperature)
        return importance_weighted_reward(target, behaviour)
