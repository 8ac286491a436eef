"""One policy's phases (learner.py): its draws, the batch it trains on and the speed it reports, by hand."""

from types import SimpleNamespace

import pytest
import torch

import learner
import sharing
from testbed import policies


def a_learner(name: str, seed: int) -> learner.Learner:
    return learner.Learner(SimpleNamespace(name=name, device=torch.device("cpu")), None, None, seed)


def test_a_phases_draws_depend_on_its_phase_seed_iteration_and_policy_alone():
    draw = lambda who, phase, it: torch.rand(4, generator=learner.generator(who, phase, it))
    qwen = a_learner("qwen", 3)
    first = draw(qwen, "rollout", 7)
    other = [draw(a_learner("llama", 3), "rollout", 7), draw(a_learner("qwen", 4), "rollout", 7),
             draw(qwen, "eval", 7), draw(qwen, "rollout", 8)]
    assert torch.equal(draw(a_learner("qwen", 3), "rollout", 7), first)   # another object, the same policy
    assert not any(torch.equal(first, x) for x in other)


def test_the_training_batch_holds_the_kept_own_rollouts_then_the_crossings_by_hand():
    # 2 prompts x 2 rollouts, the second rollout of the first prompt dropped (as GRAFT replaces a group), one
    # crossing with advantages and weights of its own per token
    ids = lambda *xs: torch.tensor(xs)
    rollouts = policies.Rollouts(prompt_ids=[ids(5, 6), ids(5, 6), ids(7), ids(7)],
                                 completion_ids=[ids(1, 2), ids(3), ids(1, 1, 1), ids(2)],
                                 logprobs=[torch.zeros(2), torch.zeros(1), torch.zeros(3), torch.zeros(1)],
                                 texts=["", "", "", ""], offsets=[[], [], [], []], finished=[True] * 4, group_size=2)
    crossing = sharing.Crossing("llama", 0, 1.0, [8, 9], [4, 4], torch.tensor([0.5, -0.5]), torch.tensor([0.9, 0.1]),
                                torch.zeros(2), torch.zeros(1), 0.0)
    received = sharing.Received(torch.tensor([[1.0, -1.0], [0.25, -0.25]]), [crossing],
                                kept=torch.tensor([[True, False], [True, True]]))
    batch = learner.training_batch(SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0)), rollouts, received)
    expected = [([5, 6], [1, 2], [1.0, 1.0], [1.0, 1.0]), ([7], [1, 1, 1], [0.25] * 3, [1.0] * 3),
                ([7], [2], [-0.25], [1.0]), ([8, 9], [4, 4], [0.5, -0.5], [0.9, 0.1])]
    assert batch.input_ids.shape[0] == len(expected)
    for row, (prompt, completion, advantages, weights) in enumerate(expected):
        targets = batch.mask[row].nonzero().flatten()                  # the completion's targets, in order
        assert batch.input_ids[row, targets + 1].tolist() == completion
        assert batch.input_ids[row, :len(prompt)].tolist() == prompt
        assert batch.advantages[row, targets].tolist() == pytest.approx(advantages)
        assert batch.weights[row, targets].tolist() == pytest.approx(weights)
        assert batch.advantages[row].count_nonzero() <= len(completion)   # nothing off the completion
    assert batch.remeasured is None


def test_a_phases_speed_is_its_tokens_over_its_seconds_by_hand():
    assert learner.perf_metrics("rollout", 120, {"seconds": 4.0}) == {"perf/rollout_tokens": 120.0,
                                                                       "perf/rollout_tokens_per_s": 30.0}
    assert learner.perf_metrics("update", 10, {"seconds": 2.0, "peak_gib": 1.5})["perf/update_peak_gib"] == 1.5
