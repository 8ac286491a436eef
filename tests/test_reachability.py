"""Per-step gradient norms against a one-backward-per-step loop, and reachability on tiny policies."""

import math

import pytest
import torch

import reachability
from testbed import arith, lora, policies, presets, tiny

TASK = arith.TaskConfig(num_steps=1, max_operand=9)  # the end-to-end tests' task: their warm-ups are shared


def random_trajectories(vocab: int, generator: torch.Generator):
    """Three trajectories of different lengths with 2 to 4 steps each (token ranges within the completion)."""
    out = []
    for prompt_len, steps in [(5, [(0, 3), (3, 7)]), (9, [(0, 2), (2, 5), (6, 9), (9, 10)]), (3, [(0, 6), (6, 8)])]:
        completion = steps[-1][1] + 1
        ids = torch.randint(vocab, (prompt_len + completion,), generator=generator).tolist()
        out.append((ids[:prompt_len], ids[prompt_len:], steps))
    return out


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-5), (torch.float32, 1e-3)])
def test_batched_norms_equal_one_backward_per_step(family, dtype, rtol):
    model = tiny.tiny_model(family, tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).to(dtype)
    trajectories = random_trajectories(50, torch.Generator().manual_seed(1))
    inputs = reachability.batch_inputs(trajectories, pad_id=0)
    params = reachability.parameter_subset(model, "all")
    batched = reachability.step_grad_norms(model, *inputs, params)
    loop = reachability.step_grad_norms_loop(model, *inputs, params)
    assert batched.shape == (8,) and (batched > 0).all()
    torch.testing.assert_close(batched, loop, rtol=rtol, atol=0)
    # each trajectory alone gives the same norms: batching (and its padding) changes nothing
    alone = torch.cat([reachability.step_grad_norms(model, *reachability.batch_inputs([t], 0), params)
                       for t in trajectories])
    torch.testing.assert_close(batched, alone, rtol=rtol, atol=0)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_embedding_padding_idx_and_qwen2_biases_are_exact(tied):
    # the tied matrix's gradient is the lm_head's plus the embedding lookup's: the norm of a sum, not a sum of norms
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).double()
    if not tied:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.model.embed_tokens.padding_idx = 3                          # its row gets no gradient
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    trajectories = random_trajectories(50, torch.Generator().manual_seed(2))
    trajectories[0][1][0] = 3
    inputs = reachability.batch_inputs(trajectories, pad_id=0)
    params = reachability.parameter_subset(model, "all")
    torch.testing.assert_close(reachability.step_grad_norms(model, *inputs, params),
                               reachability.step_grad_norms_loop(model, *inputs, params), rtol=1e-5, atol=0)


def test_rows_split_over_passes_give_the_same_norms():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).double()
    trajectories = random_trajectories(50, torch.Generator().manual_seed(4)) * 2
    inputs = reachability.batch_inputs(trajectories, pad_id=0)
    params = reachability.parameter_subset(model, "all")
    loop = reachability.step_grad_norms_loop(model, *inputs, params)
    for rows in (1, 4, 32):
        torch.testing.assert_close(reachability.step_grad_norms(model, *inputs, params, rows_per_pass=rows), loop,
                                   rtol=1e-5, atol=0)


def untied_top(model: torch.nn.Module, n_blocks: int) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
    """A copy of `model` with its head given a matrix of its own, and the parameters of its last n blocks, final
    norm and head: what a "last:N" estimate takes the gradient over, for the reference loop."""
    import copy
    untied = copy.deepcopy(model)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    layers = untied.model.layers
    tops = [*layers[len(layers) - n_blocks:], untied.model.norm, untied.lm_head]
    return untied, [p for top in tops for p in top.parameters()]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("n_blocks", [0, 1, 3])
def test_last_n_estimate_equals_one_backward_per_step_on_the_untied_head(family, n_blocks):
    model = tiny.tiny_model(family, tiny.TinyShape(32, 3, 4, 0), vocab_size=50, seed=0).double()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(5)), pad_id=0)
    params, modules = reachability.ccm_scope(model, f"last:{n_blocks}")
    estimate = reachability.step_grad_norms(model, *inputs, params, modules)
    untied, reference_params = untied_top(model, n_blocks)
    reference = reachability.step_grad_norms_loop(untied, *inputs, reference_params)
    torch.testing.assert_close(estimate, reference, rtol=1e-5, atol=0)
    # fewer parameters, so never a larger norm than the exact one over the same (untied) model's parameters
    everything = reachability.step_grad_norms_loop(untied, *inputs, reachability.parameter_subset(untied, "all"))
    assert (estimate <= everything * (1 + 1e-6)).all() and (estimate > 0).all()


def test_last_n_estimate_differentiates_nothing_below_its_blocks():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 3, 4, 0), vocab_size=50, seed=0).double()
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(6)), pad_id=0)
    reached = []
    for block in model.model.layers:       # a backward pre-hook fires only where the backward passes
        block.register_full_backward_pre_hook(lambda module, grad, i=len(reached): reached.append(module))
    for n_blocks in (0, 1, 2):
        reached.clear()
        reachability.step_grad_norms(model, *inputs, *reachability.ccm_scope(model, f"last:{n_blocks}"))
        assert set(map(id, reached)) == set(map(id, model.model.layers[3 - n_blocks:]))


def test_ccm_scope_refuses_what_it_cannot_measure():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), 50, seed=0)
    assert reachability.ccm_scope(model, "exact") == (reachability.parameter_subset(model, "all"), None)
    for bad, message in [("last:3", "2 blocks"), ("last", "unknown"), ("last:-1", "unknown"), ("head", "unknown")]:
        with pytest.raises(ValueError, match=message):
            reachability.ccm_scope(model, bad)


@pytest.mark.parametrize("n_blocks", [0, 1, 2])   # 2: every block, the lowest one fed by the frozen lookup
def test_last_n_estimate_under_lora_takes_the_frozen_weights_too(n_blocks):
    adapted = lora.add_lora(tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), 50, seed=0), 4, 8.0).double()
    for name, p in adapted.named_parameters():
        if "lora_B" in name:                                          # zero at start: make lora_A's gradient count
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(7)), pad_id=0)
    params, modules = reachability.ccm_scope(adapted, f"last:{n_blocks}")
    assert any(not p.requires_grad for p in params)                   # the head, frozen under LoRA, is measured
    estimate = reachability.step_grad_norms(adapted, *inputs, params, modules)
    untied, reference_params = untied_top(adapted.get_base_model(), n_blocks)
    for p in reference_params:
        p.requires_grad_(True)
    reference = reachability.step_grad_norms_loop(untied, *inputs, reference_params)
    torch.testing.assert_close(estimate, reference, rtol=1e-5, atol=0)


class Shift(torch.nn.Module):
    """y = x + w: a parameter whose per-row gradient the batched route does not derive."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return x + self.weight


def test_a_parameter_of_unknown_form_is_refused_by_name():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0)
    model.model.norm = Shift(32)
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(1)), pad_id=0)
    with pytest.raises(ValueError, match="Shift.weight is not an elementwise scale"):
        reachability.step_grad_norms(model, *inputs, reachability.parameter_subset(model, "all"))


def test_lora_norms_are_exact():
    model = lora.add_lora(tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), 50, seed=0), 4, 8.0).double()
    for name, p in model.named_parameters():
        if "lora_B" in name:                                          # zero at start: make lora_A's gradient count
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(3)), pad_id=0)
    params = reachability.parameter_subset(model, "lora")
    torch.testing.assert_close(reachability.step_grad_norms(model, *inputs, params),
                               reachability.step_grad_norms_loop(model, *inputs, params), rtol=1e-5, atol=0)


def test_one_summed_backward_would_not_give_the_per_step_norms():
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), 50, seed=0).double()
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(1))[:1], pad_id=0)
    params = reachability.parameter_subset(model, "all")
    losses, sizes = reachability.step_losses(model, *inputs)
    summed = torch.autograd.grad(losses.sum(), params)
    norm_of_sum = math.sqrt(sum(g.pow(2).sum().item() for g in summed))
    per_step = reachability.step_grad_norms(model, *inputs, params).double() / sizes.double().sqrt()
    assert norm_of_sum < per_step.sum().item() and norm_of_sum != pytest.approx(per_step.norm().item(), rel=1e-3)


def test_parameter_subsets():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 3, 4, 0), 50, seed=0)
    assert len(reachability.parameter_subset(model, "all")) == len(list(model.parameters()))
    for bad, message in [("lora", "LoRA"), ("last:1", "ccm_scope"), ("some", "unknown")]:
        with pytest.raises(ValueError, match=message):
            reachability.parameter_subset(model, bad)


HAND = reachability.Calibration(zero=3.0, alpha=math.log(2))
"""a calibration by hand: R = 1 up to a norm of 3, R = 1/2 at 4"""
REACH = torch.tensor([1.0, 1.0, 0.5, 2 ** -10])
"""R of the norms 0, 3, 4 and 13 under HAND"""


def test_calibration_puts_the_zero_at_the_median_and_a_half_at_the_quantile_by_hand():
    own = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    calibration = reachability.calibrate(own, quantile=0.75, zero_quantile=0.5)   # zero at 3, R = 1/2 at 4
    assert calibration.zero == pytest.approx(HAND.zero) and calibration.alpha == pytest.approx(HAND.alpha)
    equal = reachability.calibrate(torch.full((4,), 2.0))                          # no spread: a scale of 2/1000
    assert equal.zero == pytest.approx(2.0) and equal.alpha == pytest.approx(math.log(2) / 2e-3)
    for bad in (torch.tensor([]), torch.tensor([float("nan")]), torch.zeros(3)):
        with pytest.raises(ValueError):
            reachability.calibrate(bad)
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
    assert reachability.step_token_ranges([(0, 2), (2, 3), (3, 6), (6, 6)], [(0, 3), (4, 5), (9, 10)]) == [(0, 2), (2, 3)]
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 1, 4, 0), 50, seed=0)
    with pytest.raises(ValueError, match="empty or outside"):
        reachability.step_losses(model, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5), [[(3, 3)]])
    with pytest.raises(ValueError, match="no steps"):
        reachability.step_losses(model, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5), [[]])


def test_own_steps_are_more_reachable_than_those_of_a_policy_that_never_saw_the_task(cache_dir):
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    trained = policies.load_tiny_policy(spec, TASK, seed=1, cache_dir=cache_dir, warmup_scale=0.15)
    untrained = policies.Policy("untrained", tiny.tiny_model(spec.family, spec.tiny, len(trained.tokenizer), 99),
                                trained.tokenizer, use_chat_template=False)
    problems = arith.generate_problems(24, "heldout", 3, TASK)
    params = reachability.parameter_subset(trained.model, "all")
    own = reachability.solution_steps(trained, trained, problems, 16)
    foreign = reachability.solution_steps(trained, untrained, problems, 16)
    pad = trained.tokenizer.pad_token_id
    own_norms = reachability.step_grad_norms(trained.model, *reachability.batch_inputs(own, pad), params)
    foreign_norms = reachability.step_grad_norms(trained.model, *reachability.batch_inputs(foreign, pad), params)
    count = min(len(own_norms), len(foreign_norms))
    assert count >= 10
    calibration = reachability.calibrate(own_norms)
    own_reach = reachability.reachability(own_norms[:count], calibration).mean()
    foreign_reach = reachability.reachability(foreign_norms[:count], calibration).mean()
    assert own_reach > foreign_reach + 0.1


def test_repeated_samples_are_measured_once_and_get_the_norms_of_a_lone_measurement(monkeypatch):
    tok = tiny.tiny_tokenizer("llama")
    policy = policies.Policy("llama", tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0),
                             tok, use_chat_template=False)
    gen = torch.Generator().manual_seed(0)

    def item(prompt_len: int):
        ids = torch.randint(5, len(tok), (prompt_len + 8,), generator=gen).tolist()
        return ids[:prompt_len], ids[prompt_len:], [(0, 3), (3, 8)]
    a, b = item(4), item(6)
    params = reachability.parameter_subset(policy.model, "all")
    measure, rows = reachability.step_grad_norms, []

    def counted(model, input_ids, *rest, **kw):
        rows.append(len(input_ids))
        return measure(model, input_ids, *rest, **kw)
    monkeypatch.setattr(reachability, "step_grad_norms", counted)
    norms = reachability.step_norms(policy, [a, b, a, a], params)
    assert rows == [2]
    for one, got in zip([a, b, a, a], norms):
        alone = measure(policy.model, *reachability.batch_inputs([one], tok.pad_token_id), params)
        torch.testing.assert_close(got, alone, rtol=1e-4, atol=0)
