"""Issue 52's building blocks (benchmarks/premise.py): usefulness U on a hand-built case whose answer is known, its
lookahead, its gradients against grpo.grpo_step and a naive REINFORCE loop, and each baseline's admission signal
against a naive computation."""

import math
from functools import partial

import pytest
import torch

import grpo
import sharing
from benchmarks import premise
from testbed import arith, policies, tasks, tiny
from test_sharing import PROMPTS, experience, naive_groups, naive_logprobs, untrained  # noqa: F401

PROBLEM = arith.generate_problems(1, "train", seed=0, cfg=arith.TaskConfig())[0]


def first_token_task(answer: str) -> tasks.Task:
    """A task of one prompt whose reward is 1 where the completion starts with `answer`: the known case."""
    return tasks.Task("first-token", [PROBLEM], [PROBLEM], arith.prompt_text,
                      lambda example, text: float(text.startswith(answer)), lambda example, text: [])


@pytest.fixture(scope="module")
def taught():
    """A random-initialized tiny qwen2 policy taught by hand (a few SGD steps of NLL) to begin its completion of
    PROBLEM's prompt with the token "7" with probability between 0.2 and 0.8, and that token's id."""
    tok = tiny.tiny_tokenizer("qwen2")
    policy = policies.Policy("qwen2", tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0), tok,
                             use_chat_template=False)
    prompt, (seven,) = policy.encode_prompt(arith.prompt_text(PROBLEM)), policy.encode_completion("7", eos=False)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    for _ in range(100):
        logp = torch.log_softmax(policy.model(torch.tensor([prompt])).logits[0, -1], -1)             # [V]
        if logp[seven].exp() > 0.2:
            break
        optimizer.zero_grad()
        (-logp[seven]).backward()
        optimizer.step()
    assert 0.2 < logp[seven].exp().item() < 0.8
    return policy, prompt, seven


def test_the_receivers_own_success_is_useful_and_its_negation_harmful_as_the_lookahead_measures(taught):
    policy, prompt, seven = taught
    task = first_token_task("7")
    # held-out set: that prompt alone; completions of one token, whose reward is whether it is "7"
    g_heldout = premise.heldout_gradient(policy, task, [PROBLEM], 256, 1, 1.0, torch.Generator().manual_seed(0))
    measure = partial(premise.heldout_reward, task=task, problems=[PROBLEM], samples=1024, max_new_tokens=1,
                      temperature=1.0, seed=0)
    before = measure(policy)
    for advantage in (1.0, -1.0):
        g = premise.offer_gradient(policy, prompt, [seven], torch.tensor([advantage]), None, 1.0)
        u = premise.usefulness(g, g_heldout)
        assert math.copysign(1, u) == advantage
        assert math.copysign(1, premise.after_step(policy, g, 0.05, measure) - before) == advantage


def test_the_offer_gradient_is_the_step_grpo_takes_on_the_offer_alone(untrained):
    policy = untrained["llama"]
    prompt, completion = policy.encode_prompt(PROMPTS[0]), policy.encode_completion("3 + 4 = 7\nAnswer: 7", eos=True)
    gen = torch.Generator().manual_seed(0)
    credit, weights = torch.randn(len(completion), generator=gen), torch.rand(len(completion), generator=gen) * 2
    g = premise.offer_gradient(policy, prompt, completion, credit, weights, 0.7)
    params = premise.trained(policy.model)
    saved = torch.nn.utils.parameters_to_vector(params).detach().clone()
    batch = grpo.build_batch([prompt], [completion], [credit], policy.tokenizer.pad_token_id, [weights])
    grpo.grpo_step(policy.model, torch.optim.SGD(params, lr=1.0), batch, grpo.LossConfig(), max_grad_norm=math.inf,
                   temperature=0.7)
    moved = torch.nn.utils.parameters_to_vector(params).detach() - saved
    torch.nn.utils.vector_to_parameters(saved, params)
    torch.testing.assert_close(moved, g, rtol=1e-4, atol=1e-6)


def test_reinforce_scale_is_the_leave_one_out_baseline_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # 1 - (0 + 0) / 2 = 1, 0 - (1 + 0) / 2 = -0.5; a uniform group carries nothing
    torch.testing.assert_close(premise.reinforce_scale(rewards), torch.tensor([[1.0, -0.5, -0.5], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        premise.reinforce_scale(torch.ones(2, 1))


def test_the_heldout_gradient_equals_a_naive_reinforce_loop(taught):
    policy, _, _ = taught
    task, samples = first_token_task("7"), 6
    got = premise.heldout_gradient(policy, task, [PROBLEM, PROBLEM], samples, 3, 0.7, torch.Generator().manual_seed(1))
    rollouts = policy.rollout([task.prompt(PROBLEM)] * 2, samples, 3, 0.7, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor([task.reward(PROBLEM, t) for t in rollouts.texts]).view(2, samples)
    assert 0 < rewards.sum() < rewards.numel()
    want = torch.zeros_like(got)
    for i, (p, c) in enumerate(zip(rollouts.prompt_ids, rollouts.completion_ids)):
        b, j = divmod(i, samples)
        others = (rewards[b].sum() - rewards[b, j]) / (samples - 1)
        logits = policy.model(torch.cat([p, c])[None]).logits[0, len(p) - 1:-1] / 0.7                 # [T, V]
        sequence_logp = torch.log_softmax(logits, -1)[torch.arange(len(c)), c].sum()
        want += (rewards[b, j] - others) * premise.flat_gradient(policy.model, sequence_logp)
    torch.testing.assert_close(got, want / rewards.numel(), rtol=1e-4, atol=1e-7)


def test_a_step_leaves_the_weights_as_they_were(taught):
    policy = taught[0]
    saved = [w.detach().clone() for w in policy.model.parameters()]
    seen = premise.after_step(policy, torch.ones(sum(w.numel() for w in saved)), 0.5,
                              lambda p: next(p.model.parameters()).sum().item())
    assert seen == pytest.approx(saved[0].sum().item() + 0.5 * saved[0].numel(), rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(saved, policy.model.parameters()))


# ---------------------------------------------------------------------------------------------------------------
# The baselines' admission signals against naive computations
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crossed(untrained):
    """Qwen's rollouts of two texts (digits: one token each for Qwen, up to three for Llama), with random behaviour
    log-probs, crossed into Llama; with Llama's log-probs of its tokens by a plain forward pass."""
    qwen, llama = untrained["qwen2"], untrained["llama"]
    texts = [["123 + 456 = 579\nAnswer: 579", "98 - 76 = 22\nAnswer: 2"]]
    peer = experience(qwen, PROMPTS[:1], texts, [[1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    peer.rollouts.logprobs = [-torch.rand(len(i), generator=gen) * 3 for i in peer.rollouts.completion_ids]
    cfg = sharing.ShareConfig("prp", ratio_cap=1.5, temperature=0.7)
    crossings = sharing.cross(peer, [(0, 1.0), (1, -1.0)], llama, cfg)
    tgt = [naive_logprobs(llama.model, llama.encode_prompt(PROMPTS[0]), c.completion_ids, 0.7) for c in crossings]
    return peer, crossings, tgt


def test_each_admission_signal_equals_a_naive_computation(crossed, untrained):
    peer, crossings, tgt = crossed
    qwen, llama = untrained["qwen2"], untrained["llama"]
    assert len(crossings) == 2
    for c, tgt_logp in zip(crossings, tgt):
        src_logp = peer.rollouts.logprobs[c.index]
        groups = naive_groups([len(qwen.token_bytes[i]) for i in peer.rollouts.completion_ids[c.index].tolist()],
                              [len(llama.token_bytes[i]) for i in c.completion_ids])
        x = [tgt_logp[list(t)].sum().item() - src_logp[list(s)].sum().item() for s, t in groups]   # per group
        per_token = [min(math.exp(v), 1.5) for v, (_, t) in zip(x, groups) for _ in t]
        s = math.exp(tgt_logp.mean().item() - src_logp.mean().item())
        got = premise.signals(peer, c, graft_delta=0.8)
        assert got["prp_ratio"] == pytest.approx(sum(per_token) / len(per_token), rel=1e-4)
        assert got["hacpo_s"] == pytest.approx(s, rel=1e-4)
        assert got["graft_weight"] == pytest.approx(min(s, 1.0) if s >= 0.8 else 0.0, rel=1e-4)
        assert got["ftis_kl"] == pytest.approx(sum(math.exp(v) - v - 1 for v in x) / len(x), rel=1e-4)
        assert got["reward"] == peer.rewards.flatten()[c.index].item()
        assert got["advantage"] == peer.advantages.flatten()[c.index].item()
