"""Per-step gradient norms (grad_norms.py) against a one-backward-per-step loop, on random tiny models."""

import math

import pytest
import torch

import grad_norms
import reachability
from testbed import lora, tiny


def random_trajectories(vocab: int, generator: torch.Generator):
    """Three trajectories of different lengths with 2 to 4 steps each (token ranges within the completion)."""
    out = []
    for prompt_len, steps in [(5, [(0, 3), (3, 7)]), (9, [(0, 2), (2, 5), (6, 9), (9, 10)]), (3, [(0, 6), (6, 8)])]:
        completion = steps[-1][1] + 1
        ids = torch.randint(vocab, (prompt_len + completion,), generator=generator).tolist()
        out.append((ids[:prompt_len], ids[prompt_len:], steps))
    return out


class EmbeddingBigram(torch.nn.Module):
    """Next-token logits from the current token alone, an embedding row: a step's gradient has a closed form."""

    def __init__(self, vocab=6):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        torch.nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, attention_mask=None, **unused):
        return type("Out", (), {"logits": self.table(input_ids)})()

    def get_input_embeddings(self):
        return self.table


def test_step_norms_of_a_bigram_in_closed_form():
    # from ids 0 1 2 3 4, step [1, 2) predicts 1 from 0, step [2, 4) predicts 2 from 1 and 3 from 2. The mean NLL's
    # gradient puts (p(x) - e_y) / |k| in row x, rows differ within a step, so the norm times sqrt(|k|) is
    # sqrt(sum over its tokens ||p(x) - e_y||^2 / |k|)
    model = EmbeddingBigram()
    ids = torch.tensor([[0, 1, 2, 3, 4]])
    steps = [[(1, 2), (2, 4)]]
    p = torch.softmax(model.table.weight.detach().double(), dim=-1)
    miss = [(p[x] - torch.nn.functional.one_hot(torch.tensor(y), 6).double()).norm().item() for x, y in
            ((0, 1), (1, 2), (2, 3))]
    expected = torch.tensor([miss[0], math.sqrt((miss[1] ** 2 + miss[2] ** 2) / 2)])
    params = grad_norms.parameter_subset(model, "all")
    for norms in (grad_norms.step_grad_norms(model, ids, torch.ones_like(ids), steps, params),
                  grad_norms.step_grad_norms_loop(model, ids, torch.ones_like(ids), steps, params)):
        torch.testing.assert_close(norms.double(), expected.double(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-5), (torch.float32, 1e-3)])
def test_batched_norms_equal_one_backward_per_step(family, dtype, rtol):
    model = tiny.tiny_model(family, tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).to(dtype)
    trajectories = random_trajectories(50, torch.Generator().manual_seed(1))
    inputs = reachability.batch_inputs(trajectories, pad_id=0)
    params = grad_norms.parameter_subset(model, "all")
    batched = grad_norms.step_grad_norms(model, *inputs, params)
    loop = grad_norms.step_grad_norms_loop(model, *inputs, params)
    assert batched.shape == (8,) and (batched > 0).all()
    torch.testing.assert_close(batched, loop, rtol=rtol, atol=0)
    # each trajectory alone gives the same norms: batching (and its padding) changes nothing
    alone = torch.cat([grad_norms.step_grad_norms(model, *reachability.batch_inputs([t], 0), params)
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
    params = grad_norms.parameter_subset(model, "all")
    torch.testing.assert_close(grad_norms.step_grad_norms(model, *inputs, params),
                               grad_norms.step_grad_norms_loop(model, *inputs, params), rtol=1e-5, atol=0)


def test_rows_split_over_passes_give_the_same_norms():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).double()
    trajectories = random_trajectories(50, torch.Generator().manual_seed(4)) * 2
    inputs = reachability.batch_inputs(trajectories, pad_id=0)
    params = grad_norms.parameter_subset(model, "all")
    loop = grad_norms.step_grad_norms_loop(model, *inputs, params)
    for rows in (1, 4, 32):
        torch.testing.assert_close(grad_norms.step_grad_norms(model, *inputs, params, rows_per_pass=rows), loop,
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
    params, modules = grad_norms.ccm_scope(model, f"last:{n_blocks}")
    estimate = grad_norms.step_grad_norms(model, *inputs, params, modules)
    untied, reference_params = untied_top(model, n_blocks)
    reference = grad_norms.step_grad_norms_loop(untied, *inputs, reference_params)
    torch.testing.assert_close(estimate, reference, rtol=1e-5, atol=0)
    # fewer parameters, so never a larger norm than the exact one over the same (untied) model's parameters
    everything = grad_norms.step_grad_norms_loop(untied, *inputs, grad_norms.parameter_subset(untied, "all"))
    assert (estimate <= everything * (1 + 1e-6)).all() and (estimate > 0).all()


def test_last_n_estimate_differentiates_nothing_below_its_blocks():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 3, 4, 0), vocab_size=50, seed=0).double()
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(6)), pad_id=0)
    reached = []
    for block in model.model.layers:       # a backward pre-hook fires only where the backward passes
        block.register_full_backward_pre_hook(lambda module, grad, i=len(reached): reached.append(module))
    for n_blocks in (0, 1, 2):
        reached.clear()
        grad_norms.step_grad_norms(model, *inputs, *grad_norms.ccm_scope(model, f"last:{n_blocks}"))
        assert set(map(id, reached)) == set(map(id, model.model.layers[3 - n_blocks:]))


@pytest.mark.parametrize("bias", [False, True])
def test_last_0_is_a_closed_form_from_the_forward_with_no_backward(bias):
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), vocab_size=50, seed=0).double()
    model.lm_head = torch.nn.Linear(32, 50, bias=bias).double()          # untied, so the loop's gradient is the head's
    torch.nn.init.normal_(model.model.norm.weight, 1.0, 0.3, generator=torch.Generator().manual_seed(2))
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(8)), pad_id=0)
    reached = []
    model.lm_head.register_full_backward_pre_hook(lambda module, grad: reached.append(module))
    estimate = grad_norms.step_grad_norms(model, *inputs, *grad_norms.ccm_scope(model, "last:0"))
    assert reached == []                                                 # no backward, not even into the head
    scope = [model.model.norm.weight, *model.lm_head.parameters()]
    torch.testing.assert_close(estimate, grad_norms.step_grad_norms_loop(model, *inputs, scope), rtol=1e-5, atol=0)


def test_ccm_scope_refuses_what_it_cannot_measure():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), 50, seed=0)
    assert grad_norms.ccm_scope(model, "exact") == (grad_norms.parameter_subset(model, "all"), None)
    for bad, message in [("last:3", "2 blocks"), ("last", "unknown"), ("last:-1", "unknown"), ("head", "unknown")]:
        with pytest.raises(ValueError, match=message):
            grad_norms.ccm_scope(model, bad)


@pytest.mark.parametrize("n_blocks", [0, 1, 2])   # 2: every block, the lowest one fed by the frozen lookup
def test_last_n_estimate_under_lora_takes_the_frozen_weights_too(n_blocks):
    adapted = lora.add_lora(tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), 50, seed=0), 4, 8.0).double()
    for name, p in adapted.named_parameters():
        if "lora_B" in name:                                          # zero at start: make lora_A's gradient count
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(7)), pad_id=0)
    params, modules = grad_norms.ccm_scope(adapted, f"last:{n_blocks}")
    assert any(not p.requires_grad for p in params)                   # the head, frozen under LoRA, is measured
    estimate = grad_norms.step_grad_norms(adapted, *inputs, params, modules)
    untied, reference_params = untied_top(adapted.get_base_model(), n_blocks)
    for p in reference_params:
        p.requires_grad_(True)
    reference = grad_norms.step_grad_norms_loop(untied, *inputs, reference_params)
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
        grad_norms.step_grad_norms(model, *inputs, grad_norms.parameter_subset(model, "all"))


def test_lora_norms_are_exact():
    model = lora.add_lora(tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), 50, seed=0), 4, 8.0).double()
    for name, p in model.named_parameters():
        if "lora_B" in name:                                          # zero at start: make lora_A's gradient count
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(3)), pad_id=0)
    params = grad_norms.parameter_subset(model, "lora")
    torch.testing.assert_close(grad_norms.step_grad_norms(model, *inputs, params),
                               grad_norms.step_grad_norms_loop(model, *inputs, params), rtol=1e-5, atol=0)


def test_one_summed_backward_would_not_give_the_per_step_norms():
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), 50, seed=0).double()
    inputs = reachability.batch_inputs(random_trajectories(50, torch.Generator().manual_seed(1))[:1], pad_id=0)
    params = grad_norms.parameter_subset(model, "all")
    losses, sizes = grad_norms.step_losses(model, *inputs)
    summed = torch.autograd.grad(losses.sum(), params)
    norm_of_sum = math.sqrt(sum(g.pow(2).sum().item() for g in summed))
    per_step = grad_norms.step_grad_norms(model, *inputs, params).double() / sizes.double().sqrt()
    assert norm_of_sum < per_step.sum().item() and norm_of_sum != pytest.approx(per_step.norm().item(), rel=1e-3)


def test_parameter_subsets():
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 3, 4, 0), 50, seed=0)
    assert len(grad_norms.parameter_subset(model, "all")) == len(list(model.parameters()))
    for bad, message in [("lora", "LoRA"), ("last:1", "ccm_scope"), ("some", "unknown")]:
        with pytest.raises(ValueError, match=message):
            grad_norms.parameter_subset(model, bad)
