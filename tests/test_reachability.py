"""Reachability, its calibration, the phantom advantage and the CCM repair (reachability.py), by hand and on tiny
policies."""

import math

import pytest
import torch

import grad_norms
import reachability
from testbed import policies, tiny

HAND = reachability.Calibration(zero=3.0, alpha=math.log(2))
"""a calibration by hand: R = 1 up to a norm of 3, R = 1/2 at 4"""
REACH = torch.tensor([1.0, 1.0, 0.5, 2 ** -10])
"""R of the norms 0, 3, 4 and 13 under HAND"""


def test_calibration_puts_the_zero_at_the_median_and_a_half_at_the_quantile_by_hand():
    own = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    calibration = reachability.calibrate(own, quantile=0.75, zero_quantile=0.5)   # zero at 3, R = 1/2 at 4
    assert calibration.zero == pytest.approx(HAND.zero) and calibration.alpha == pytest.approx(HAND.alpha)
    equal = reachability.calibrate(torch.full((4,), 2.0), 0.9, 0.5)                # no spread: a scale of 2/1000
    assert equal.zero == pytest.approx(2.0) and equal.alpha == pytest.approx(math.log(2) / 2e-3)
    for bad in (torch.tensor([]), torch.tensor([float("nan")]), torch.zeros(3)):
        with pytest.raises(ValueError):
            reachability.calibrate(bad, 0.9, 0.5)
    with pytest.raises(ValueError, match="zero_quantile"):
        reachability.calibrate(own, quantile=0.5, zero_quantile=0.5)


def test_reachability_is_one_up_to_the_zero_point_and_halves_per_scale_by_hand():
    reach = reachability.reachability(torch.tensor([0.0, 3.0, 4.0, 13.0]), HAND)
    assert reach.tolist() == pytest.approx(REACH.tolist())                      # own typical steps: R = 1


def test_phantom_advantage_is_the_credit_out_of_reach_by_hand():
    phantom = reachability.phantom_advantage(torch.tensor([2.0, 2.0, 2.0, -1.0]), REACH)
    assert phantom.tolist() == pytest.approx([0.0, 0.0, 1.0, -(1 - 2 ** -10)])


def test_ccm_hotspots_are_the_steps_above_the_threshold_by_hand():
    assert reachability.ccm_hotspots(torch.tensor([0.0, 0.0, 1.0, -1.0]), threshold=0.5) == [2]
    assert reachability.ccm_hotspots(1 - REACH, threshold=0.5) == [3]               # R < 1/2: out of reach


def test_the_ccm_repair_scales_credit_by_reach_to_the_beta_by_hand():
    repaired = reachability.repair(torch.tensor([2.0, 2.0, 2.0, -1.0]), REACH, beta=2.0)
    assert repaired.tolist() == pytest.approx([2.0, 2.0, 0.5, -(2 ** -20)])


def test_step_token_ranges_and_bad_steps():
    assert (reachability.step_token_ranges([(0, 2), (2, 3), (3, 6), (6, 6)], [(0, 3), (4, 5), (9, 10)])
            == [(0, 2), (2, 3)])
    # a token that ends where a step begins is not the step's (an overlap, not a touch)
    assert reachability.step_token_ranges([(0, 2), (2, 3), (3, 6)], [(0, 3), (3, 6)]) == [(0, 2), (2, 3)]
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 1, 4, 0), 50, seed=0)
    with pytest.raises(ValueError, match="empty or outside"):
        grad_norms.step_losses(model, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5), [[(3, 3)]])
    with pytest.raises(ValueError, match="no steps"):
        grad_norms.step_losses(model, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5), [[]])


PEAK = 100.0
"""the factor the final norm's weight is scaled by: every logit times 100, so the policy puts almost all its mass on
its argmax token (a policy at temperature near 0; at 1000 its own steps' gradients vanish in float32)"""


def greedy_completion(model: torch.nn.Module, prompt: list[int], length: int) -> list[int]:
    """The argmax continuation by hand, one forward pass per token (no generate(), no cache)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(length):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def token_probabilities(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[T] the model's probability of each completion token given what precedes it."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]   # [T, V]
    return logits.softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_steps_a_confident_policy_would_take_are_reachable_and_steps_it_gives_no_mass_are_not():
    tok = tiny.tiny_tokenizer("llama")
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0)
    with torch.no_grad():
        model.model.norm.weight.mul_(PEAK)
    policy = policies.Policy("llama", model, tok, use_chat_template=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, len(tok), (4 + i,), generator=gen).tolist() for i in range(6)]
    steps = [(0, 3), (3, 6)]
    own = [(p, greedy_completion(model, p, 6), steps) for p in prompts]
    foreign = [(p, torch.randint(5, len(tok), (6,), generator=gen).tolist(), steps) for p in prompts]
    # the condition the claim rests on, checked rather than hoped for: own tokens all but certain, foreign ones not
    assert min(token_probabilities(model, p, c).min() for p, c, _ in own) > 0.99
    assert max(token_probabilities(model, p, c).max() for p, c, _ in foreign) < 0.01
    params = grad_norms.parameter_subset(model, "all")
    own_norms, foreign_norms = (torch.cat(reachability.step_norms(policy, items, params)) for items in (own, foreign))
    assert len(own_norms) == len(foreign_norms) == 12
    calibration = reachability.calibrate(own_norms, 0.9, 0.5)
    own_reach = reachability.reachability(own_norms, calibration)
    foreign_reach = reachability.reachability(foreign_norms, calibration)
    assert (own_reach > 0).all() and (own_reach == 1).sum() >= 6          # at or below the median: R = 1
    assert foreign_norms.min() > own_norms.max() and (foreign_reach < 0.01).all()


def test_repeated_samples_are_measured_once_and_get_the_norms_of_a_lone_measurement(monkeypatch):
    tok = tiny.tiny_tokenizer("llama")
    policy = policies.Policy("llama", tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0),
                             tok, use_chat_template=False)
    gen = torch.Generator().manual_seed(0)

    def item(prompt_len: int):
        ids = torch.randint(5, len(tok), (prompt_len + 8,), generator=gen).tolist()
        return ids[:prompt_len], ids[prompt_len:], [(0, 3), (3, 8)]
    a, b = item(4), item(6)
    params = grad_norms.parameter_subset(policy.model, "all")
    measure, rows = grad_norms.step_grad_norms, []

    def counted(model, input_ids, *rest, **kw):
        rows.append(len(input_ids))
        return measure(model, input_ids, *rest, **kw)
    monkeypatch.setattr(reachability, "step_grad_norms", counted)
    norms = reachability.step_norms(policy, [a, b, a, a], params)
    assert rows == [2]
    for one, got in zip([a, b, a, a], norms):
        alone = measure(policy.model, *reachability.batch_inputs([one], tok.pad_token_id), params)
        torch.testing.assert_close(got, alone, rtol=1e-4, atol=0)
