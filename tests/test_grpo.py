"""GRPO against hand-computed values and naive loops."""

import math

import pytest
import torch

import grpo
from testbed import sequences, tiny

EPS = 1e-4


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # group 1: mean 0.5, population std 0.5; group 2: mean 0.75, std sqrt(3)/4
    s2 = math.sqrt(3) / 4
    expected = torch.tensor([[0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)],
                             [0.25 / (s2 + EPS)] * 3 + [-0.75 / (s2 + EPS)]])
    torch.testing.assert_close(grpo.group_advantages(rewards, eps=EPS), expected)
    torch.testing.assert_close(grpo.group_advantages(rewards, scale_by_std=False),
                               torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]))


def test_xgrpo_advantages_by_hand():
    own = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    peer = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    s = math.sqrt(3) / 4  # row 0 pools [1, 0, 1, 1]: mean 3/4, population std sqrt(3)/4
    expected = torch.tensor([[0.25 / (s + EPS), -0.75 / (s + EPS)],
                             [0.0, 0.0],                          # nobody solved it: no signal, not NaN
                             [0.5 / (0.5 + EPS)] * 2])            # own group alone is flat; pooled it is not
    torch.testing.assert_close(grpo.xgrpo_advantages(own, [peer]), expected)
    torch.testing.assert_close(grpo.xgrpo_advantages(own, [peer], scale_by_std=False),
                               torch.tensor([[0.25, -0.75], [0.0, 0.0], [0.5, 0.5]]))


def test_xgrpo_pools_every_peer_whatever_its_group_size():
    own, a, b = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 0.0, 0.0]])
    # pooled [0, 1, 1, 1, 0, 0, 0]: mean 3/7, centred own rewards -3/7 and 4/7
    torch.testing.assert_close(grpo.xgrpo_advantages(own, [a, b], scale_by_std=False),
                               torch.tensor([[-3 / 7, 4 / 7]]))


def test_rescue_advantages_by_hand():
    # one success joins three failures: pooled [0, 0, 0, 1], mean 1/4, std sqrt(3)/4
    s = math.sqrt(3) / 4
    torch.testing.assert_close(grpo.rescue_advantages(torch.zeros(3), torch.ones(1)),
                               torch.tensor([0.75 / (s + EPS)]))
    # two successes: pooled [0, 0, 0, 1, 1], mean 2/5, std sqrt(6)/5 -- a rarer rescue earns more
    s2 = math.sqrt(6) / 5
    torch.testing.assert_close(grpo.rescue_advantages(torch.zeros(3), torch.ones(2)),
                               torch.full((2,), 0.6 / (s2 + EPS)))
    torch.testing.assert_close(grpo.rescue_advantages(torch.zeros(3), torch.ones(2), scale_by_std=False),
                               torch.full((2,), 0.6))


def test_zero_variance_groups_give_exact_zeros():
    # seven 0.3s: their float32 mean is not 0.3, so their std is not 0 (3e-8), yet the group carries no signal
    rewards = torch.tensor([[1.0] * 7, [0.0] * 7, [0.3] * 7, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    for scale_by_std in (True, False):
        advantages = grpo.group_advantages(rewards, scale_by_std=scale_by_std)
        assert torch.isfinite(advantages).all()
        assert (advantages[:3] == 0).all() and (advantages[3] != 0).all()
    stats = grpo.rewards_stats(rewards)
    assert stats["charts/zero_std_groups"] == 0.75


@pytest.mark.parametrize("rewards", [torch.zeros(2, 0), torch.zeros(4), torch.tensor([[1.0, float("nan")]]),
                                     torch.tensor([[float("inf"), 0.0]])])
def test_bad_rewards_are_refused(rewards):
    with pytest.raises(ValueError):
        grpo.group_advantages(rewards)


def naive_loss(logp, old, adv, mask, weights, ref, eps_low, eps_high, beta, aggregation):
    """The objective written out token by token with Python floats."""
    per_seq, total, count = [], 0.0, 0
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            term = -weights[i][t] * min(ratio * adv[i][t], clipped * adv[i][t])
            d = ref[i][t] - logp[i][t]
            term += beta * (math.exp(d) - d - 1)
            terms.append(term)
        per_seq.append(sum(terms) / len(terms))
        total += sum(terms)
        count += len(terms)
    return sum(per_seq) / len(per_seq) if aggregation == "sequence" else total / count


@pytest.mark.parametrize("aggregation", ["sequence", "token"])
def test_clipped_loss_matches_a_naive_loop(aggregation):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 2
    old = logp + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5)        # ratios well outside the clip
    ref = logp + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    weights = torch.rand(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.float64)
    cfg = grpo.LossConfig(clip_eps_low=0.1, clip_eps_high=0.3, beta=0.05, aggregation=aggregation)
    loss, sums = grpo.clipped_loss(logp, old, adv, mask, cfg, weights, ref)
    expected = naive_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), weights.tolist(), ref.tolist(),
                          0.1, 0.3, 0.05, aggregation)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    ratio = (logp - old).exp()
    clip_active = ((adv > 0) & (ratio > 1.3)) | ((adv < 0) & (ratio < 0.9))
    assert sums["clipped_tokens"].item() == (clip_active.double() * mask).sum().item() > 0


def test_aggregations_differ_on_unequal_lengths_by_hand():
    # one token of advantage 1 against three tokens of advantage 0, on-policy (ratio 1)
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    seq, _ = grpo.clipped_loss(logp, logp, adv, mask, grpo.LossConfig(aggregation="sequence"))
    tok, _ = grpo.clipped_loss(logp, logp, adv, mask, grpo.LossConfig(aggregation="token"))
    assert seq.item() == pytest.approx(-0.5)     # mean of (-1/1, 0/3)
    assert tok.item() == pytest.approx(-0.25)    # -1 over 4 tokens
    with pytest.raises(ValueError, match="aggregation"):
        grpo.clipped_loss(logp, logp, adv, mask, grpo.LossConfig(aggregation="batch"))


def test_kl_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.2, 0.5]]))
    mask = torch.ones(1, 2)
    zero_adv = torch.zeros(1, 2)
    at_ref, sums = grpo.clipped_loss(logp, logp, zero_adv, mask, grpo.LossConfig(beta=1.0), ref_logp=logp)
    assert at_ref.item() == 0 and sums["kl_sum"].item() == 0
    away, _ = grpo.clipped_loss(logp, logp, zero_adv, mask, grpo.LossConfig(beta=1.0), ref_logp=logp + 0.3)
    assert away.item() == pytest.approx(math.exp(0.3) - 0.3 - 1)


def test_build_batch_places_completions_and_advantages_on_their_targets():
    prompts, completions = [[5, 6, 7], [8]], [[1, 2], [3, 4, 9]]
    batch = grpo.build_batch(prompts, completions, [torch.tensor([0.5, 0.5]), torch.tensor([-1.0, -2.0, -3.0])],
                             pad_id=0, token_weights=[torch.tensor([1.0, 0.25]), torch.tensor([1.0, 1.0, 0.5])])
    targets = batch.input_ids[:, 1:]
    for i, c in enumerate(completions):
        assert targets[i][batch.mask[i] == 1].tolist() == c
    assert batch.advantages[1][batch.mask[1] == 1].tolist() == [-1.0, -2.0, -3.0]
    assert batch.weights[0][batch.mask[0] == 1].tolist() == [1.0, 0.25]
    assert (batch.advantages[batch.mask == 0] == 0).all()
    with pytest.raises(ValueError, match="per-token values"):
        grpo.build_batch(prompts, completions, [torch.tensor([1.0]), torch.tensor([1.0, 1.0, 1.0])], pad_id=0)
    with pytest.raises(ValueError, match="empty"):
        grpo.build_batch([[1], []], [[2], [3]], [torch.ones(1), torch.ones(1)], pad_id=0)
    with pytest.raises(ValueError, match="at least one"):
        sequences.pack_sequences([], [], pad_id=0)


class Bigram(torch.nn.Module):
    """A model small enough to reason about: next-token logits depend on the current token only, so it takes and
    needs none of the keywords a transformers model is called with (positions, a KV cache)."""

    def __init__(self, vocab=6):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, attention_mask=None, **unused):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_grpo_step_moves_probability_towards_positive_advantages():
    model = Bigram()
    batch = grpo.build_batch([[0], [0]], [[1], [2]], [torch.tensor([1.0]), torch.tensor([-1.0])], pad_id=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = torch.softmax(model.table[0].detach().clone(), -1)
    stats = grpo.grpo_step(model, optimizer, batch, grpo.LossConfig())
    after = torch.softmax(model.table[0].detach(), -1)
    assert after[1] > before[1] and after[2] < before[2]
    assert stats["losses/clip_ratio"] == 0.0 and stats["charts/completion_len"] == 1.0


def test_a_frozen_weights_stale_gradient_changes_neither_the_norm_nor_the_update():
    # a frozen weight keeps whatever gradient it had (a base weight under LoRA after a warm-up): the step clips and
    # reports the norm of the trained weights alone, as on a model where that gradient never existed
    batch = grpo.build_batch([[0], [0]], [[1], [2]], [torch.tensor([1.0]), torch.tensor([-1.0])], pad_id=0)
    stepped = []
    for stale in (None, torch.full((6, 6), 100.0)):
        model = Bigram()
        model.frozen = torch.nn.Linear(6, 6).requires_grad_(False)       # unused by the forward
        model.frozen.weight.grad = stale
        stats = grpo.grpo_step(model, torch.optim.SGD([model.table], lr=0.5), batch, grpo.LossConfig(),
                               max_grad_norm=0.01)
        stepped.append((stats["losses/grad_norm"], model.table.detach().clone()))
    assert stepped[0][0] == stepped[1][0] > 0.01                          # clipping was active in both
    assert torch.equal(stepped[0][1], stepped[1][1])


def test_update_kl_is_the_k3_kl_between_the_policy_before_and_after_the_update():
    # reference: the bigram's next-token distributions before and after, the k3 estimate on the batch's tokens
    batch = grpo.build_batch([[0], [3]], [[1, 2], [4]], [torch.tensor([1.0, 1.0]), torch.tensor([-1.0])], pad_id=0)
    model = Bigram()
    before = torch.log_softmax(model.table.detach().clone(), -1)
    stats = grpo.grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.5), batch, grpo.LossConfig(),
                           micro_batch=1, measure_kl=True)
    after = torch.log_softmax(model.table.detach(), -1)
    pairs = [(0, 1), (1, 2), (3, 4)]                                      # (context token, sampled token)
    k3 = [math.exp(after[a, b] - before[a, b]) - (after[a, b] - before[a, b]).item() - 1 for a, b in pairs]
    assert stats["losses/update_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5) and stats["losses/update_kl"] > 0
    assert stats["losses/kl"] == 0.0                                      # the penalty's KL, with beta = 0
    still = grpo.grpo_step(Bigram(), torch.optim.SGD(Bigram().parameters(), lr=0.5), batch, grpo.LossConfig(),
                           measure_kl=True)                               # the optimizer moves another model
    assert still["losses/update_kl"] == 0.0
    assert "losses/update_kl" not in grpo.grpo_step(Bigram(), torch.optim.SGD(Bigram().parameters(), lr=0.5),
                                                    batch, grpo.LossConfig())


def test_micro_batches_give_the_gradient_of_the_whole_batch():
    batch = grpo.build_batch([[0], [1, 2], [3]], [[1, 2, 3], [4], [5, 0]],
                             [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([-2.0]), torch.tensor([0.5, 0.5])], pad_id=0)
    grads = []
    for micro, aggregation in [(3, "sequence"), (1, "sequence"), (3, "token"), (2, "token")]:
        model = Bigram()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        before = model.table.detach().clone()
        grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(aggregation=aggregation), micro_batch=micro,
                       max_grad_norm=1e9)
        grads.append(before - model.table.detach())
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[2], grads[3])
    assert not torch.allclose(grads[0], grads[2])
    # by hand, at ratio 1: each sequence's (previous, next) pairs with its advantage; the sequence loss averages
    # each sequence's mean, the token loss every token (6) at once
    pairs = [[(0, 1), (1, 2), (2, 3)], [(2, 4)], [(3, 5), (5, 0)]]
    advantage = [1.0, -2.0, 0.5]
    for aggregation, grad in (("sequence", grads[0]), ("token", grads[2])):
        table = Bigram().table.detach().clone().requires_grad_(True)
        logp = [[torch.log_softmax(table[x], -1)[y] for x, y in seq] for seq in pairs]
        if aggregation == "sequence":
            loss = -sum(a * sum(lp) / len(lp) for a, lp in zip(advantage, logp)) / 3
        else:
            loss = -sum(a * sum(lp) for a, lp in zip(advantage, logp)) / 6
        torch.testing.assert_close(grad, torch.autograd.grad(loss, table)[0])


def test_a_non_finite_loss_stops_the_update_before_its_step_and_says_which_steps_were_taken():
    model = Bigram()
    batch = grpo.build_batch([[0], [0]], [[1], [2]], [torch.tensor([float("nan")]), torch.tensor([1.0])], pad_id=0)
    before = model.table.detach().clone()
    with pytest.raises(FloatingPointError, match="GRPO loss is not finite before optimizer step 1 of 1 of this "
                                                 "update: the run stops"):
        grpo.grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, grpo.LossConfig(), micro_batch=1)
    assert torch.equal(before, model.table.detach())
    # two steps, the NaN in the second's row: the first step is taken, and the message says so
    batch = grpo.build_batch([[0], [0]], [[1], [2]], [torch.tensor([1.0]), torch.tensor([float("nan")])], pad_id=0)
    with pytest.raises(FloatingPointError, match="before optimizer step 2 of 2 of this update, its first 1 taken"):
        grpo.grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, grpo.LossConfig(), micro_batch=1,
                       minibatches=2)
    assert not torch.equal(before, model.table.detach())


def test_a_kl_penalty_without_reference_log_probs_is_refused():
    logp, mask = torch.log(torch.tensor([[0.2, 0.5]])), torch.ones(1, 2)
    with pytest.raises(ValueError, match="reference"):
        grpo.clipped_loss(logp, logp, torch.ones(1, 2), mask, grpo.LossConfig(beta=0.1))
    loss, _ = grpo.clipped_loss(logp, logp, torch.ones(1, 2), mask, grpo.LossConfig(beta=0.0))
    assert loss.item() == pytest.approx(-1.0)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kv-cache", "checkpointing"])
@pytest.mark.parametrize("shared", [False, True], ids=["distinct-prompts", "groups"])
def test_micro_batches_of_prompt_groups_give_the_full_batch_gradient_of_a_transformers_model(shared, checkpointing):
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)
    if checkpointing:   # no KV cache: every row goes through whole
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    gen = torch.Generator().manual_seed(0)
    # prompts and completions of different lengths, so that micro-batches are reordered and cut differently; with
    # `shared`, groups of rows share a prompt, and a micro-batch of 2 splits a group of 3
    prompts = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (5, 1, 3, 6, 2)]
    if shared:
        prompts = [prompts[0]] * 3 + [prompts[2]] * 2 + [prompts[4]]
    completions = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (2, 4, 1, 3, 5, 2)[:len(prompts)]]
    advantages = [torch.randn(len(c), generator=gen) for c in completions]
    batch = grpo.build_batch(prompts, completions, advantages, pad_id=0)
    # the reference: one forward of the whole right-padded batch, every position's logits, the loss by hand
    reference = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)
    logits = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1] / 0.7
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    per_token = -batch.advantages * torch.exp(logp - logp.detach())        # ratio 1: no clipping at the first step
    ((per_token * batch.mask).sum(1) / batch.mask.sum(1)).mean().backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=2, max_grad_norm=1e9, temperature=0.7)
    for b, p, r in zip(before, model.parameters(), reference.parameters()):
        torch.testing.assert_close(b - p.detach(), r.grad, atol=1e-6, rtol=1e-4)


def test_minibatch_rows_split_the_batch_in_order_the_larger_parts_first():
    assert grpo.minibatch_rows(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert (grpo.minibatch_rows(4, 1) == [range(0, 4)]
            and grpo.minibatch_rows(4, 4) == [range(k, k + 1) for k in range(4)])
    assert grpo.row_steps(5, 2) == [0, 0, 0, 1, 1]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="--minibatches"):
            grpo.minibatch_rows(4, bad)


def naive_minibatch_updates(model, batch, parts, lr, eps=0.2, temperature=0.7):
    """PPO by hand: pi_old from one forward before any step, then one SGD step per part of rows, in the order
    given, each on the clipped surrogate's per-sequence means averaged over the part's sequences."""
    def logprobs():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1] / temperature
        return torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        old = logprobs()
    for rows in parts:
        model.zero_grad()
        ratio = torch.exp(logprobs() - old)[rows]
        a, mask = batch.advantages[rows], batch.mask[rows]
        per_token = -torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
        ((per_token * mask).sum(1) / mask.sum(1)).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad


@pytest.mark.parametrize("minibatches", [1, 2, 3])
def test_minibatches_are_consecutive_optimizer_steps_own_rows_first_against_one_pi_old(minibatches):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (5, 1, 3, 6, 2)]
    completions = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (2, 4, 1, 3, 5)]
    advantages = [torch.full((len(c),), a) for c, a in zip(completions, (1.5, -1.0, 2.0, -0.5, 1.0))]
    batch = grpo.build_batch(prompts, completions, advantages, pad_id=0)
    parts = {1: [[0, 1, 2, 3, 4]], 2: [[0, 1, 2], [3, 4]], 3: [[0, 1], [2, 3], [4]]}[minibatches]
    lr = 0.1   # large enough that later parts see ratios beyond the clip range, small enough that they still move

    def naive(order, eps=0.2):
        reference = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)
        naive_minibatch_updates(reference, batch, order, lr=lr, eps=eps)
        return list(reference.parameters())

    def moved(a, b):
        return max((x - y).abs().max().item() for x, y in zip(a, b))
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    stats = grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=2, max_grad_norm=1e9,
                           temperature=0.7, minibatches=minibatches)
    assert len(steps) == minibatches
    reference = naive(parts)
    for p, r in zip(model.parameters(), reference):
        torch.testing.assert_close(p.detach(), r.detach(), atol=1e-5, rtol=1e-4)
    if minibatches > 1:   # what the comparison can tell: the last part, the clip and the order each move the weights
        assert moved(reference, naive(parts[:-1])) > 1e-2
        assert moved(reference, naive(parts, eps=1e9)) > 1e-2 and stats["losses/clip_ratio"] > 0
        assert moved(reference, naive(parts[::-1])) > 1e-2


def test_completion_log_probs_with_each_prompt_once_are_those_of_every_row_whole():
    model = tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=1).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (4, 7)]
    prompts = [prompts[0]] * 3 + [prompts[1]] * 2
    completions = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (3, 1, 5, 2, 4)]
    batch = grpo.build_batch(prompts, completions, [torch.zeros(len(c)) for c in completions], pad_id=0)
    # the reference: the right-padded batch through sequences' own full-batch log-probs
    logp, entropy = sequences.token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, 0.7)
    groups = sequences.prompt_groups(batch.input_ids, batch.mask, [4, 0, 2, 1, 3])
    assert groups.prompts.shape[0] == 2 and groups.owner.tolist() == [0, 1, 1, 1, 0]
    for cache in (None, sequences.cache_keyword(model)):
        with torch.no_grad():
            got, got_entropy = sequences.completion_logprobs(model, groups, 0.7, cache)
        want = logp[groups.rows].gather(1, groups.columns) * groups.completion_mask
        torch.testing.assert_close(got * groups.completion_mask, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got_entropy * groups.completion_mask,
                                   entropy[groups.rows].gather(1, groups.columns) * groups.completion_mask,
                                   atol=1e-5, rtol=0)


def test_prompt_groups_refuse_a_completion_mask_with_a_gap():
    batch = grpo.build_batch([[1, 2]], [[3, 4, 5]], [torch.zeros(3)], pad_id=0)
    batch.mask[0, 2] = 0
    with pytest.raises(ValueError, match="one span"):
        sequences.prompt_groups(batch.input_ids, batch.mask, [0])


def test_remeasured_rows_take_the_weight_of_their_sequence_ratio_at_their_step_and_no_token_ratio():
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (3, 5, 2, 4, 3)]
    completions = [torch.randint(1, 60, (n,), generator=gen).tolist() for n in (2, 4, 3, 1, 5)]
    advantages = [torch.full((len(c),), a) for c, a in zip(completions, (1.5, -1.0, 0.5, 2.0, -1.5))]
    behaviour = torch.tensor([math.nan, math.nan, -4.0, -4.5, -3.5], dtype=torch.float64)   # rows 2-4 re-measured
    calls = []

    def weight(log_s, step):
        calls.append((log_s.clone(), step))
        return torch.exp(-(log_s ** 2)) + step     # any function of log s and the step, to see both reach it
    batch = grpo.build_batch(prompts, completions, advantages, pad_id=0,
                             token_weights=[torch.full((len(c),), 9.0) for c in completions],   # replaced
                             remeasured=grpo.Remeasured(behaviour, weight))
    # by hand: step 0 trains rows 0-2 (three of five), step 1 rows 3-4, each SGD on the mean over its rows of the
    # token mean; an own row's ratio is against pi_old, the starting weights; a re-measured row has ratio 1 and
    # the weight of its log s = mean log pi now - behaviour, at its step
    reference = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)

    def logprobs(row):
        logits = reference(torch.tensor([prompts[row] + completions[row]])).logits[0, :-1] / 0.7
        positions = torch.arange(len(prompts[row]) - 1, len(prompts[row]) + len(completions[row]) - 1)
        return torch.log_softmax(logits, -1)[positions, torch.tensor(completions[row])]
    with torch.no_grad():
        old = [logprobs(row) for row in range(5)]
    wanted = []
    for step, rows in enumerate(([0, 1, 2], [3, 4])):
        reference.zero_grad()
        losses = []
        for row in rows:
            logp, a = logprobs(row), advantages[row][0].item()
            if math.isnan(behaviour[row]):
                ratio = torch.exp(logp - old[row])
                losses.append((-9.0 * torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)).mean())
            else:
                log_s = logp.mean().item() - behaviour[row].item()
                wanted.append((log_s, step))
                losses.append((-(math.exp(-log_s ** 2) + step) * a * logp).mean())
        torch.stack(losses).mean().backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= 0.1 * p.grad
    model = tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), vocab_size=60, seed=0)
    grpo.grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, grpo.LossConfig(), micro_batch=2,
                   max_grad_norm=1e9, temperature=0.7, minibatches=2)
    got = sorted((step, s) for log_s, step in calls for s in log_s.tolist())
    wanted = sorted((step, s) for s, step in wanted)
    assert [step for step, _ in got] == [step for step, _ in wanted] == [0, 1, 1]
    assert [s for _, s in got] == pytest.approx([s for _, s in wanted], abs=1e-5)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), r.detach(), atol=1e-5, rtol=1e-4)
