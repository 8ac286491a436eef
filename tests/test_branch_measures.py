"""The branches' held-out measures (benchmarks/branch_measures.py, issue 68): the importance-weighted reward against
a brute-force expectation on a tiny categorical case, and exact where pi = mu; the log-probs a sequence gets against
the sampler's own and against a forward pass one sequence at a time."""

import pytest
import torch

from benchmarks import branch_measures
from testbed import arith, policies, presets, tasks


@pytest.fixture(scope="module")
def policy(cache_dir):
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    return policies.load_tiny_policy(spec, arith.TaskConfig(), seed=0, cache_dir=cache_dir, warmup_scale=0.05)


def categorical_case(problems: int, outcomes: int, draws: int, generator: torch.Generator):
    """mu and pi over `outcomes` completions of each problem, a reward per completion, and `draws` samples of each
    problem from mu as BehaviourSamples (the completions stand for themselves: no model reads them)."""
    log_mu = torch.log_softmax(torch.randn(problems, outcomes, generator=generator), 1)        # [B, K]
    log_pi = torch.log_softmax(torch.randn(problems, outcomes, generator=generator), 1)        # [B, K]
    reward = torch.rand(problems, outcomes, generator=generator)                               # [B, K]
    drawn = torch.multinomial(log_mu.exp(), draws, replacement=True, generator=generator)     # [B, S]
    behaviour = branch_measures.BehaviourSamples([], [], log_mu.gather(1, drawn).flatten(), reward.gather(1, drawn),
                                                 temperature=1.0)
    return log_pi.gather(1, drawn).flatten(), behaviour, (log_pi.exp() * reward).sum(1).mean().item()


def test_the_importance_weighted_reward_converges_to_the_brute_force_expectation_under_pi():
    target, behaviour, expected = categorical_case(4, 5, 40_000, torch.Generator().manual_seed(0))
    assert branch_measures.importance_weighted_reward(target, behaviour) == pytest.approx(expected, abs=0.01)
    # with few samples it is another number: the tolerance above is not what makes it pass
    few_target, few, _ = categorical_case(4, 5, 2, torch.Generator().manual_seed(0))
    assert abs(branch_measures.importance_weighted_reward(few_target, few) - expected) > 0.01


def test_at_the_behaviours_own_weights_the_estimate_is_the_samples_mean_reward():
    _, behaviour, _ = categorical_case(3, 6, 7, torch.Generator().manual_seed(1))
    estimate = branch_measures.importance_weighted_reward(behaviour.logprobs.clone(), behaviour)
    assert estimate == pytest.approx(behaviour.rewards.double().mean().item(), abs=1e-12)


def test_a_sample_pi_cannot_produce_is_refused_not_averaged():
    target, behaviour, _ = categorical_case(2, 3, 4, torch.Generator().manual_seed(2))
    target[0] = -float("inf")
    with pytest.raises(ValueError, match="not finite"):
        branch_measures.importance_weighted_reward(target, behaviour)


def test_sequence_logprobs_are_the_samplers_own_at_its_temperature(policy):
    task = tasks.load_task("arith", 0, 0, 6)
    behaviour = branch_measures.behaviour_samples(policy, task, task.heldout, 3, 16, 0.7,
                                                  torch.Generator().manual_seed(0))
    again = policy.rollout([task.prompt(p) for p in task.heldout], 3, 16, temperature=0.7,
                           generator=torch.Generator().manual_seed(0))
    sampled = torch.stack([lp.sum() for lp in again.logprobs])
    assert [ids.tolist() for ids in again.completion_ids] == behaviour.completion_ids
    torch.testing.assert_close(behaviour.logprobs, sampled, atol=1e-4, rtol=0)
    # in micro-batches that split the rows otherwise, each row pads to another length: the same log-probs
    chunked = branch_measures.sequence_logprobs(policy, behaviour.prompt_ids, behaviour.completion_ids, 0.7,
                                                micro_batch=4)
    torch.testing.assert_close(chunked, behaviour.logprobs, atol=1e-5, rtol=0)
    expected = tasks.group_rewards(task, task.heldout, again.texts, 3)
    assert torch.equal(behaviour.rewards, expected)


def test_the_reference_loglik_is_a_forward_pass_one_problem_at_a_time(policy):
    problems = arith.generate_problems(5, "heldout", 3)
    temperature, total = 0.7, 0.0
    for problem in problems:
        prompt = policy.encode_prompt(arith.prompt_text(problem))
        solution = policy.encode_completion(arith.solution(problem, "line"), eos=True)
        with torch.no_grad():
            logits = policy.model(torch.tensor([prompt + solution])).logits[0].float()            # [L, V]
        logprobs = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, -1)               # [T, V]
        total += logprobs.gather(1, torch.tensor(solution).unsqueeze(1)).sum().item()
    task = tasks.load_task("arith", 0, 0, 0)
    measured = branch_measures.reference_loglik(policy, task, problems, "line", temperature)
    assert measured == pytest.approx(total / len(problems), abs=1e-4)
    assert measured < 0
    with pytest.raises(ValueError, match="no held-out problems"):
        branch_measures.reference_loglik(policy, task, [], "line", temperature)
