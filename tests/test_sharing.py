"""The three sharing levels against hand-computed examples, naive loops and properties; HACPO's exchange and runs of
each mode. HACPO's equations are tests/test_hacpo.py's."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo
import sharing
import tokalign
import train
from baselines import hacpo
from testbed import arith, policies, presets, tiny, token_bytes
from test_train import TASK, tiny_args

EPS = 1e-4  # grpo.group_advantages' default


def naive_rescues(own, peer):
    return [(b, j) for b in range(own.shape[0]) if all(r < 1 for r in own[b].tolist())
            for j in range(peer.shape[1]) if peer[b, j] >= 1]


def test_sgt_fires_on_all_failed_groups_with_a_peer_success_only():
    own = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    peer = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert sharing.sgt_rescues(own, peer, 1.0) == [(0, 1)]


def random_binary_rewards(seed, *shapes):
    """Rewards 0 or 1 of each shape, drawn from one seeded stream."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2, shape, generator=gen).float() for shape in shapes]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_sgt_rescues_equal_a_naive_loop(groups, g_own, g_peer, seed):
    own, peer = random_binary_rewards(seed, (groups, g_own), (groups, g_peer))
    assert sharing.sgt_rescues(own, peer, 1.0) == naive_rescues(own, peer)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=50), st.floats(0.01, 100))
def test_truncated_weights_never_exceed_the_cap(log_ratios, cap):
    log_ratio = torch.tensor(log_ratios, dtype=torch.float64)
    weights = sharing.truncated_weights(log_ratio, cap)
    assert torch.isfinite(weights).all() and (weights <= cap * (1 + 1e-12)).all()
    below = log_ratio < math.log(cap)
    torch.testing.assert_close(weights[below], log_ratio[below].exp())


def test_a_receiver_probability_of_zero_gives_weight_zero():
    weights = sharing.truncated_weights(torch.tensor([-math.inf, 0.0, 5.0]), 2.0)
    assert weights.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("log_ratio, cap", [(torch.tensor([0.0, float("nan")]), 2.0), (torch.tensor([math.inf]), 2.0),
                                            (torch.zeros(2), 0.0)])
def test_bad_ratios_or_caps_are_refused(log_ratio, cap):
    with pytest.raises(ValueError):
        sharing.truncated_weights(log_ratio, cap)


# ---------------------------------------------------------------------------------------------------------------
# Moving trajectories between real tokenizers
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def untrained():
    """family -> a random-initialized tiny policy with its trimmed real tokenizer (no warm-up needed here)."""
    out = {}
    for family in ("qwen2", "llama"):
        tok = tiny.tiny_tokenizer(family)
        model = tiny.tiny_model(family, tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0)
        out[family] = policies.Policy(family, model, tok, use_chat_template=False)
    return out


def experience(policy, prompts, texts, rewards, logprob=-0.5, unfinished=()):
    """Hand-made rollouts of `texts` (B lists of G strings, ending with EOS unless their flat index is in
    `unfinished`) with a constant log-prob."""
    group = len(texts[0])
    ids = [policy.encode_completion(t, eos=i not in unfinished) for i, t in enumerate(t for row in texts for t in row)]
    rollouts = policies.Rollouts([torch.tensor(policy.encode_prompt(p)) for p in prompts for _ in range(group)],
                                 [torch.tensor(i) for i in ids], [torch.full((len(i),), logprob) for i in ids],
                                 [t for row in texts for t in row],
                                 [token_bytes.byte_offsets(i, policy.token_bytes) for i in ids],
                                 [i not in unfinished for i in range(len(ids))], group)
    rewards = torch.tensor(rewards)
    return sharing.Experience(policy, prompts, rollouts, rewards, grpo.group_advantages(rewards))


PROMPTS = [arith.prompt_text(p) for p in arith.generate_problems(3, "train", seed=0, cfg=TASK)]
TEXTS = [["3 + 4 = 7\nAnswer: 7", "3 + 4 = 8\nAnswer: 8"],
         ["12 - 5 = 7\nAnswer: 7", "12 - 5 = 17\nAnswer: 17"],
         ["9 + 9 = 18\nAnswer: 18", "9 + 9 = 19\nAnswer: 19"]]


def test_prp_carries_the_peer_advantage_onto_the_receiver_tokens(untrained):   # its weights: a test below
    peer = experience(untrained["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    receiver = experience(untrained["llama"], PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    cfg = sharing.ShareConfig("prp", ratio_cap=1.5, temperature=1.0)
    received = sharing.exchange([receiver, peer], cfg)
    crossings = received["llama"].crossings
    assert [c.index for c in crossings] == [0, 1]            # the only peer group with a non-zero advantage
    llama = untrained["llama"]
    for c in crossings:
        assert llama.decode(c.completion_ids) == TEXTS[0][c.index]
        assert c.completion_ids[-1] == llama.tokenizer.eos_token_id
        expected = peer.advantages.flatten()[c.index].item()
        torch.testing.assert_close(c.advantages, torch.full((len(c.completion_ids),), expected))
        assert c.prompt_ids == llama.encode_prompt(PROMPTS[0])
    torch.testing.assert_close(received["llama"].advantages, receiver.advantages)
    assert [c.index for c in received["qwen2"].crossings] == [2, 3]
    assert received["qwen2"].metrics["sharing/received"] == 2


def test_a_crossing_from_alignments_already_made_equals_one_made_from_scratch(untrained, monkeypatch):
    peer = experience(untrained["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    llama, cfg = untrained["llama"], sharing.ShareConfig("prp", temperature=0.7)
    picks = [(0, 0.5), (1, -0.5)]
    fresh = sharing.cross(peer, picks, llama, cfg)
    aligned = {i: tokalign.align_completion(peer.rollouts.completion_ids[i].tolist(), peer.policy.token_bytes,
                                         llama.tokenizer, llama.token_bytes) for i, _ in picks}

    def refuse(*args, **kwargs):
        raise AssertionError("retokenized twice")
    monkeypatch.setattr(sharing.tokalign, "retokenize", refuse)
    reused = sharing.cross(peer, picks, llama, cfg, aligned)
    assert [c.index for c in reused] == [c.index for c in fresh] == [0, 1]
    for a, b in zip(fresh, reused):
        assert a.completion_ids == b.completion_ids
        for name in ("advantages", "weights", "log_ratio"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)


def naive_logprobs(model, prompt, completion, temperature):
    """log pi(completion token | prefix) at `temperature`, one plain forward pass of one sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, :-1] / temperature
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return torch.log_softmax(logits, -1)[positions, torch.tensor(completion)]


def test_prp_weights_are_one_for_a_peer_with_the_same_tokenizer_and_log_probs(untrained):
    qwen = untrained["qwen2"]
    twin = policies.Policy("twin", qwen.model, qwen.tokenizer, use_chat_template=False)
    peer = experience(qwen, PROMPTS[:1], TEXTS[:1], [[1.0, 0.0]])
    ids = [c.tolist() for c in peer.rollouts.completion_ids]
    prompts = [p.tolist() for p in peer.rollouts.prompt_ids]
    peer.rollouts.logprobs = [naive_logprobs(qwen.model, p, i, 0.7) for p, i in zip(prompts, ids)]
    receiver = experience(twin, PROMPTS[:1], TEXTS[:1], [[0.0, 0.0]])
    crossings = sharing.exchange([receiver, peer], sharing.ShareConfig("prp", temperature=0.7))["twin"].crossings
    assert len(crossings) == 2
    for c in crossings:
        assert c.completion_ids == ids[c.index]
        torch.testing.assert_close(c.weights, torch.ones(len(ids[c.index])), atol=1e-5, rtol=0)


def naive_groups(src_bytes: list[int], tgt_bytes: list[int]) -> list[tuple[range, range]]:
    """The aligned groups of two tokenizations of one text, by a walk: advance whichever side's byte count is behind
    until both cover the same bytes; (source tokens, receiver tokens) of each."""
    groups, i, j = [], 0, 0
    while j < len(tgt_bytes):
        i0, j0, a, b = i, j, 0, 0
        while True:
            if i < len(src_bytes) and (a <= b or j == len(tgt_bytes)):
                a, i = a + src_bytes[i], i + 1
            else:
                b, j = b + tgt_bytes[j], j + 1
            if a == b and (a > 0 or (i > i0 and j > j0)):
                break
        groups.append((range(i0, i), range(j0, j)))
    return groups


def test_prp_weights_equal_a_naive_group_ratio_across_tokenizers(untrained):
    qwen, llama = untrained["qwen2"], untrained["llama"]
    texts = [["123 + 456 = 579\nAnswer: 579", "98 - 76 = 22\nAnswer: 2"]]   # digits: Qwen 1 per token, Llama 3
    peer = experience(qwen, PROMPTS[:1], texts, [[1.0, 0.0]], unfinished={1})
    gen = torch.Generator().manual_seed(0)
    # the peer found its first three tokens far less likely than the receiver does: their groups reach the cap
    peer.rollouts.logprobs = [-torch.rand(len(i), generator=gen) * 3 - 30.0 * (torch.arange(len(i)) < 3)
                              for i in peer.rollouts.completion_ids]
    receiver = experience(llama, PROMPTS[:1], texts, [[0.0, 0.0]])
    cap = 1.5
    crossings = sharing.exchange([receiver, peer], sharing.ShareConfig("prp", ratio_cap=cap, temperature=0.7)
                                 )["llama"].crossings
    assert [c.index for c in crossings] == [0, 1]
    for c in crossings:
        src_ids = peer.rollouts.completion_ids[c.index].tolist()
        finished = c.index == 0
        assert (c.completion_ids[-1] == llama.tokenizer.eos_token_id) == finished
        tgt_logp = naive_logprobs(llama.model, llama.encode_prompt(PROMPTS[0]), c.completion_ids, 0.7)
        expected = []
        for src, tgt in naive_groups([len(qwen.token_bytes[i]) for i in src_ids],
                                     [len(llama.token_bytes[i]) for i in c.completion_ids]):
            ratio = math.exp(tgt_logp[list(tgt)].sum().item() - peer.rollouts.logprobs[c.index][list(src)].sum().item())
            expected += [min(ratio, cap)] * len(tgt)
        torch.testing.assert_close(c.weights, torch.tensor(expected), rtol=1e-4, atol=1e-6)
        assert 0 < expected.count(cap) < len(expected)                        # capped groups and uncapped ones


def test_crossing_metrics_by_hand():
    def crossing(reward, log_ratio, weights, residual):
        n = len(weights)
        return sharing.Crossing("qwen2", 0, reward, [1], list(range(n)), torch.zeros(n), torch.tensor(weights),
                                torch.zeros(n), torch.tensor(log_ratio), residual)
    # the truncated share counts log-ratios above log 1.5 = 0.405 (2 of 5), not weights at the cap (3 of 5)
    crossings = [crossing(1.0, [0.0, 1.0], [1.0, 1.5, 1.5], 0.0), crossing(0.0, [-1.0, 0.2, 2.0], [0.5, 1.5], 0.3)]
    out = sharing.crossing_metrics(crossings, cap=1.5, picked=3)
    assert out == pytest.approx({"sharing/received": 2.0, "sharing/received_reward": 0.5,
                                 "sharing/log_ratio_mean": 2.2 / 5, "sharing/log_ratio_max": 2.0,
                                 "sharing/truncated_share": 2 / 5, "sharing/weight_mean": 6.0 / 5,
                                 "sharing/residual": 0.15, "sharing/dropped": 1.0})


def test_sgt_moves_only_verified_successes_onto_failed_prompts(untrained):
    peer = experience(untrained["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    receiver = experience(untrained["llama"], PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    received = sharing.exchange([receiver, peer], sharing.ShareConfig("sgt", temperature=1.0))
    crossings = received["llama"].crossings
    assert [c.index for c in crossings] == [0, 5]              # prompts 0 and 2: llama failed, qwen succeeded
    assert all(c.reward == 1.0 for c in crossings)
    s = math.sqrt(2) / 3                                        # pooled [0, 0, 1]: mean 1/3, std sqrt(2)/3
    for c in crossings:
        torch.testing.assert_close(c.advantages, torch.full((len(c.completion_ids),), (2 / 3) / (s + EPS)))
    assert received["qwen2"].crossings == []                   # llama never succeeded where qwen failed
    torch.testing.assert_close(received["llama"].advantages, receiver.advantages)


def test_sgt_pools_the_successes_of_every_peer_on_a_prompt(untrained):
    qwen = untrained["qwen2"]
    other = policies.Policy("qwen-b", qwen.model, qwen.tokenizer, use_chat_template=False)
    receiver = experience(untrained["llama"], PROMPTS[:1], TEXTS[:1], [[0.0, 0.0]])
    a = experience(qwen, PROMPTS[:1], TEXTS[:1], [[1.0, 0.0]])
    b = experience(other, PROMPTS[:1], TEXTS[:1], [[1.0, 1.0]])
    crossings = sharing.exchange([receiver, a, b], sharing.ShareConfig("sgt", temperature=1.0))["llama"].crossings
    assert [(c.source, c.index) for c in crossings] == [("qwen2", 0), ("qwen-b", 0), ("qwen-b", 1)]
    s = math.sqrt(0.24)                                         # pooled [0, 0, 1, 1, 1]: mean 3/5, std sqrt(6)/5
    for c in crossings:
        torch.testing.assert_close(c.advantages, torch.full((len(c.completion_ids),), 0.4 / (s + EPS)))


def test_hacpo_sends_the_peer_rollouts_inside_the_clip_range_with_hand_computed_credit(untrained):
    qwen, llama = untrained["qwen2"], untrained["llama"]
    peer = experience(qwen, PROMPTS[:2], TEXTS[:2], [[1.0, 0.0], [1.0, 0.0]])          # capability 1/2
    receiver = experience(llama, PROMPTS[:2], TEXTS[:2], [[0.0, 0.0], [1.0, 0.0]])     # capability 1/4
    texts = [t for row in TEXTS[:2] for t in row]
    encoded = [llama.encode_completion(t, eos=True) for t in texts]
    target = [naive_logprobs(llama.model, llama.encode_prompt(PROMPTS[i // 2]), ids, 0.7)
              for i, ids in enumerate(encoded)]
    wanted = [0.9, 1.1, 0.5, 0.95]   # each peer rollout's s: inside [0.8, 1], above 1, below 0.8, inside
    peer.rollouts.logprobs = [torch.full((len(ids),), logp.mean().item() - math.log(s))
                              for ids, logp, s in zip(peer.rollouts.completion_ids, target, wanted)]
    cfg = sharing.ShareConfig("hacpo", temperature=0.7, settings=hacpo.Settings(alpha=1.0, delta=0.2))
    with pytest.raises(ValueError, match="capabilities"):
        hacpo.exchange([receiver, peer], cfg, None)
    with pytest.raises(KeyError, match="qwen2"):
        hacpo.exchange([receiver, peer], cfg, {"llama": 0.25})
    capabilities = hacpo.Capabilities(window=5)
    assert capabilities.update({e.policy.name: e.rewards for e in (receiver, peer)}) == pytest.approx(
        {"llama": 0.25, "qwen2": 0.5})
    received = hacpo.exchange([receiver, peer], cfg, {"llama": 0.25, "qwen2": 0.5})
    assert hacpo.exchange([receiver, peer], cfg, {"llama": 0.25, "qwen2": 0.5}, "llama").keys() == {"llama"}
    # llama's baseline counts qwen's rewards at half weight. Prompt 0 pools [0, 0 | 1, 0]: baseline 1/8, std
    # sqrt(3)/4; prompt 1 pools [1, 0 | 1, 0]: baseline 3/8, std 1/2. A qwen rollout's advantage is doubled (eq. 10)
    s3, s2 = math.sqrt(3) / 4 + EPS, 0.5 + EPS
    mine = received["llama"]
    torch.testing.assert_close(mine.advantages, torch.tensor([[-0.125 / s3, -0.125 / s3], [0.625 / s2, -0.375 / s2]]))
    assert [c.index for c in mine.crossings] == [0, 3]
    for c, advantage, weight in zip(mine.crossings, [2 * 0.875 / s3, 2 * -0.375 / s2], [0.9 ** 2, 0.95 ** 2]):
        assert c.completion_ids == encoded[c.index] and c.source == "qwen2"
        torch.testing.assert_close(c.advantages, torch.full((len(encoded[c.index]),), advantage))
        torch.testing.assert_close(c.weights, torch.full((len(encoded[c.index]),), weight), atol=1e-4, rtol=0)
    assert mine.metrics["sharing/offered"] == 4 and mine.metrics["sharing/received"] == 2
    assert mine.metrics["sharing/clipped_high"] == mine.metrics["sharing/clipped_low"] == 0.25
    assert mine.metrics["sharing/capability_ratio"] == pytest.approx(2.0)
    # qwen's baseline counts llama's rewards twice: prompt 0 [0, 0 | 1, 0] gives 1/4, prompt 1 [1, 0 | 1, 0] 3/4
    torch.testing.assert_close(received["qwen2"].advantages,
                               torch.tensor([[0.75 / s3, -0.25 / s3], [0.25 / s2, -0.75 / s2]]))


def test_none_and_xgrpo_move_no_trajectory(untrained):
    peer = experience(untrained["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    receiver = experience(untrained["llama"], PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    alone = sharing.exchange([receiver, peer], sharing.ShareConfig("none", temperature=1.0))["llama"]
    assert alone.crossings == [] and torch.equal(alone.advantages, receiver.advantages)
    pooled = sharing.exchange([receiver, peer], sharing.ShareConfig("xgrpo", temperature=1.0))["llama"]
    assert pooled.crossings == []
    torch.testing.assert_close(pooled.advantages, grpo.xgrpo_advantages(receiver.rewards, [peer.rewards]))
    assert pooled.metrics["sharing/revived_groups"] == 2      # prompts 0 and 2 were flat for llama alone
    s = math.sqrt(3) / 4                                       # every pooled row here has mean 1/4 or 3/4
    shifts = [0.25 / (s + EPS)] * 2 + [abs(0.25 / (s + EPS) - 0.5 / (0.5 + EPS)),
                                       abs(-0.75 / (s + EPS) + 0.5 / (0.5 + EPS))] + [0.25 / (s + EPS)] * 2
    assert pooled.metrics["sharing/baseline_shift"] == pytest.approx(sum(shifts) / 6, rel=1e-5)
    with pytest.raises(ValueError, match="unknown sharing level"):
        sharing.exchange([receiver, peer], sharing.ShareConfig("all", temperature=1.0))


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pair, share", [("qwen-llama", "prp"), ("qwen-llama", "sgt"), ("trio", "xgrpo"),
                                         ("trio", "prp"), ("qwen-llama", "hacpo"), ("trio", "hacpo")])
def test_a_sharing_run_trains_every_policy_and_logs_what_crossed(tmp_path, cache_dir, pair, share, scripted_rewards):
    if share == "sgt":  # each policy solves every rollout of the prompts its peer fails every rollout of, by parity
        first = presets.PRESETS["tiny"][pair][0].name
        scripted_rewards(lambda policy, problems: torch.tensor(
            [[float((b % 2 == 0) == (policy.name == first))] * 6 for b in range(len(problems))]))
    run_dir = train.main(tiny_args(tmp_path, cache_dir, pair=pair, share=share, iterations=2))
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in logged if "losses/policy_loss" in r]
    names = [spec.name for spec in presets.PRESETS["tiny"][pair]]
    assert sorted({r["policy"] for r in updates}) == sorted(names) and len(updates) == 2 * len(names)
    assert all(math.isfinite(r["losses/policy_loss"]) and "sharing/received" in r for r in updates)
    if share == "prp":  # each peer rollout of a group whose rewards differ (A != 0) crosses or is counted dropped
        mixed_groups = {(r["policy"], r["iteration"]): round(8 * (1 - r["charts/zero_std_groups"])) for r in updates}
        for r in updates:
            picked = sum(6 * mixed_groups[(p, r["iteration"])] for p in names if p != r["policy"])
            assert r["sharing/received"] + r.get("sharing/dropped", 0.0) == picked
    if share == "sgt":  # the peer's 4 x 6 successes on the receiver's failed prompts, each crossing or dropped
        assert all(r["sharing/received"] + r["sharing/dropped"] == 24 for r in updates)
        assert all(r["sharing/received_reward"] == 1.0 for r in updates if r["sharing/received"])
    if share in ("prp", "hacpo"):
        assert all(r["sharing/weight_mean"] > 0 for r in updates if r["sharing/received"])
    if share == "xgrpo":
        assert all(r["sharing/received"] == 2 * 8 * 6 for r in updates)  # two peers' rewards on 8 prompts x 6
    if share == "hacpo":  # capability (eq. 9): the policy's mean reward per iteration over its last window, by hand
        window = tiny_args(tmp_path, cache_dir).hacpo_window
        for r in updates:
            means = [q["charts/reward_mean"] for q in updates
                     if q["policy"] == r["policy"] and r["iteration"] - window < q["iteration"] <= r["iteration"]]
            assert r["sharing/capability"] == pytest.approx(sum(means) / len(means))
            assert r["sharing/received"] <= r["sharing/offered"]


def test_hacpo_refuses_more_than_one_update_per_iteration(tmp_path, cache_dir):
    with pytest.raises(ValueError, match="--epochs 1"):
        tiny_args(tmp_path, cache_dir, share="hacpo", epochs=2).share_config
