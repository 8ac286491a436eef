"""GRAFT (graft.py) against hand cases and naive loops; HACPO's compatibility clip per optimizer step; a run."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import learner
import sharing
import train
from baselines import graft, hacpo
from testbed import policies, presets
from test_sharing import (EPS, PROMPTS, TEXTS, experience, naive_logprobs, random_binary_rewards,  # noqa: F401
                          untrained)
from test_train import MIXED, tiny_args


def naive_replaced(own, peer):
    return [all(r < 1 for r in o) and any(r >= 1 for r in p) and any(r < 1 for r in p)
            for o, p in zip(own.tolist(), peer.tolist())]


def test_only_a_wholly_failed_group_meets_a_mixed_one():
    own = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    peer = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    # prompt 0: failed and mixed; 1: the receiver succeeded once; 2: the peer's group is all success, 3: all failure
    assert graft.replaced_prompts(own, peer, 1.0).tolist() == [True, False, False, False]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_replaced_prompts_equal_a_naive_loop(groups, g_own, g_peer, seed):
    own, peer = random_binary_rewards(seed, (groups, g_own), (groups, g_peer))
    assert graft.replaced_prompts(own, peer, 1.0).tolist() == naive_replaced(own, peer)


def test_compatibility_weights_by_hand():
    s = torch.tensor([0.9, 0.8, 0.79, 1.2, 0.0], dtype=torch.float64)
    # delta 0.8 keeps 0.9 and 0.8 as they are, drops 0.79 and probability 0, and does not upweight 1.2
    torch.testing.assert_close(graft.compatibility_weights(s.log(), 0.8),
                               torch.tensor([0.9, 0.8, 0.0, 1.0, 0.0], dtype=torch.float64))
    for delta, log_s in ((0.0, s.log()), (1.5, s.log()), (0.8, torch.tensor([math.nan]))):
        with pytest.raises(ValueError):
            graft.compatibility_weights(log_s, delta)


def with_compatibility(peer, receiver, wanted):
    """Set the peer's behaviour log-probs so that each of its rollouts has compatibility s = wanted[i] with the
    receiver's policy, whose log-probs of the retokenized text are taken by a plain forward pass."""
    llama = receiver.policy
    texts = peer.rollouts.texts
    encoded = [llama.encode_completion(t, eos=True) for t in texts]
    group = peer.rollouts.group_size
    target = [naive_logprobs(llama.model, llama.encode_prompt(peer.prompts[i // group]), ids, 0.7)
              for i, ids in enumerate(encoded)]
    peer.rollouts.logprobs = [torch.full((len(ids),), logp.mean().item() - math.log(s))
                              for ids, logp, s in zip(peer.rollouts.completion_ids, target, wanted)]
    return encoded


def test_a_mixed_peer_group_replaces_a_failed_group_with_its_own_advantages(untrained):
    qwen, llama = untrained["qwen2"], untrained["llama"]
    peer = experience(qwen, PROMPTS, TEXTS, [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    # llama failed prompts 0 and 2 and succeeded once on prompt 1
    receiver = experience(llama, PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    encoded = with_compatibility(peer, receiver, [0.9, 1.3, 0.95, 0.95, 0.7, 0.85])
    cfg = sharing.ShareConfig("graft", temperature=0.7, settings=graft.Settings(0.8))
    mine = graft.exchange([receiver, peer], cfg)["llama"]
    # prompt 0: both rollouts cross, weights 0.9 and 1 (1.3 is not upweighted); prompt 1 is not failed; prompt 2:
    # s = 0.7 is below delta, 0.85 crosses. The peer's advantages are its own group's [1, 0]: +-(1/2)/(1/2 + eps)
    assert [c.index for c in mine.crossings] == [0, 1, 5]
    for c, advantage, weight in zip(mine.crossings, [1, -1, -1], [0.9, 1.0, 0.85]):
        assert c.completion_ids == encoded[c.index] and c.source == "qwen2"
        torch.testing.assert_close(c.advantages, torch.full((len(c.completion_ids),), advantage * 0.5 / (0.5 + EPS)))
        torch.testing.assert_close(c.weights, torch.full((len(c.completion_ids),), weight), atol=1e-4, rtol=0)
    assert mine.kept.tolist() == [[False, False], [True, True], [False, False]]
    torch.testing.assert_close(mine.advantages, receiver.advantages)
    assert mine.metrics["sharing/offered"] == 4 and mine.metrics["sharing/accepted"] == 0.75
    assert mine.metrics["sharing/received"] == 3 and mine.metrics["sharing/replaced_groups"] == 2
    # qwen never failed a whole group: nothing crosses to it, all its rollouts stay
    theirs = graft.exchange([receiver, peer], cfg, "qwen2")
    assert theirs.keys() == {"qwen2"} and theirs["qwen2"].crossings == [] and theirs["qwen2"].kept.all()

    # the batch: llama's kept rollouts (prompt 1's two) first, then the three crossings, in that order
    batch = learner.training_batch(llama, receiver.rollouts, mine)
    rows = [receiver.rollouts.completion_ids[i].tolist() for i in (2, 3)] + [encoded[i] for i in (0, 1, 5)]
    assert batch.input_ids.shape[0] == 5
    for row, ids in enumerate(rows):
        prompt = (receiver.rollouts.prompt_ids[2].tolist() if row < 2
                  else llama.encode_prompt(PROMPTS[[0, 0, 2][row - 2]]))
        assert batch.input_ids[row, :len(prompt) + len(ids)].tolist() == prompt + ids


def test_of_two_mixed_peer_groups_the_more_compatible_one_replaces_the_failed_group(untrained):
    qwen, llama = untrained["qwen2"], untrained["llama"]
    twin = policies.Policy("twin", qwen.model, qwen.tokenizer, use_chat_template=False)
    receiver = experience(llama, PROMPTS[:1], TEXTS[:1], [[0.0, 0.0]])
    peers = [experience(qwen, PROMPTS[:1], TEXTS[:1], [[1.0, 0.0]]), experience(twin, PROMPTS[:1], TEXTS[:1],
                                                                                    [[1.0, 0.0]])]
    for compatible_first in (False, True):   # the winner is the higher mean log s, not the first or last peer
        s = [[0.95, 0.99], [0.9, 0.85]] if compatible_first else [[0.9, 0.85], [0.95, 0.99]]
        for peer, wanted in zip(peers, s):
            with_compatibility(peer, receiver, wanted)
        mine = graft.exchange([receiver, *peers],
                              sharing.ShareConfig("graft", temperature=0.7, settings=graft.Settings(0.8)))
        winner = "qwen2" if compatible_first else "twin"
        crossings = mine["llama"].crossings
        assert [(c.source, c.index) for c in crossings] == [(winner, 0), (winner, 1)]
        assert [round(c.weights[0].item(), 3) for c in crossings] == [0.95, 0.99]


def test_with_every_trajectory_below_delta_the_receiver_keeps_its_group(untrained):
    peer = experience(untrained["qwen2"], PROMPTS[:1], TEXTS[:1], [[1.0, 0.0]])
    receiver = experience(untrained["llama"], PROMPTS[:1], TEXTS[:1], [[0.0, 0.0]])
    with_compatibility(peer, receiver, [0.5, 0.6])
    mine = graft.exchange([receiver, peer],
                          sharing.ShareConfig("graft", temperature=0.7, settings=graft.Settings()))["llama"]
    assert mine.crossings == [] and mine.kept.all() and mine.metrics["sharing/accepted"] == 0.0


def test_hacpo_clips_each_peer_sample_at_the_bound_of_the_step_it_trains_in(untrained):
    qwen, llama = untrained["qwen2"], untrained["llama"]
    peer = experience(qwen, PROMPTS[:2], TEXTS[:2], [[1.0, 0.0], [1.0, 0.0]])
    receiver = experience(llama, PROMPTS[:2], TEXTS[:2], [[0.0, 0.0], [1.0, 0.0]])
    with_compatibility(peer, receiver, [0.9, 1.1, 0.5, 0.84])        # rollouts 0 and 3 inside [0.8, 1]
    capability = {"llama": 0.25, "qwen2": 0.5}

    def crossed(minibatches):
        cfg = sharing.ShareConfig("hacpo", temperature=0.7, minibatches=minibatches,
                                  settings=hacpo.Settings(alpha=1.0, delta=0.2, delta_step=0.025))
        mine = hacpo.exchange([receiver, peer], cfg, capability, "llama")["llama"]
        return [(c.index, round(c.weights[0].item(), 3)) for c in mine.crossings], mine.metrics["sharing/accepted"]
    # one step: both at the bound 0.8, weights s^2
    assert crossed(1) == ([(0, 0.81), (3, 0.706)], 0.5)
    # 4 own + 2 peer rows in two steps of 3: both peers train in step 1, bound 0.825, which 0.84 clears
    assert crossed(2) == ([(0, 0.81), (3, 0.706)], 0.5)
    # three steps of 2: the peers train in step 2, bound 0.85, and 0.84 falls below it
    assert crossed(3) == ([(0, 0.81), (3, 0.0)], 0.25)
    assert hacpo.clip_lower(0.2, 2, 0.025) == pytest.approx(0.85) and hacpo.clip_lower(0.2, 3, 0.025) == 0.875
    assert hacpo.clip_lower(0.2, 100, 0.025) == 1.0


@pytest.mark.parametrize("share, s, every_one_trains", [("graft", 0.81, True), ("hacpo", 0.9, True),
                                                      ("hacpo", 0.81, False)])
def test_a_run_with_two_optimizer_steps_per_iteration_logs_its_acceptance(tmp_path, cache_dir, monkeypatch,
                                                                          scripted_rewards, share, s,
                                                                          every_one_trains):
    """The first policy fails every group and the second's are mixed, so peer samples are offered into the first
    under both methods, and every sample's s is set by hand: all of them cross (s is inside GRAFT's delta 0.8 and
    HACPO's first clip bound 0.8), and at 0.81 HACPO's tighter bound of the last step (0.825), where the peer
    samples train, weighs every one 0."""
    args = tiny_args(tmp_path, cache_dir, share=share, minibatches=2)
    first = presets.PRESETS["tiny"][args.pair][0].name
    scripted_rewards(lambda policy, problems: torch.tensor([[0.0] * 6 if policy.name == first else MIXED]
                                                           * len(problems)))
    monkeypatch.setattr(hacpo, "sequence_log_ratios",
                        lambda offered: torch.full((len(offered),), math.log(s), dtype=torch.float64))
    steps = []
    real = train.grpo.grpo_step
    monkeypatch.setattr(train.grpo, "grpo_step", lambda *a, **k: steps.append(a[-1]) or real(*a, **k))
    run_dir = train.main(args)
    updates = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "losses/policy_loss" in r]
    assert len(updates) == 4 and steps == [2] * 4
    assert all(math.isfinite(r["losses/policy_loss"]) for r in updates)
    assert all(r["sharing/offered"] > 0 for r in updates if r["policy"] == first)
    # 48 own rows and at most 48 peer rows in two steps: the peer rows, last, all train in the second
    for r in updates:
        accepted = round(r["sharing/accepted"] * r["sharing/offered"])
        assert r["sharing/received"] == r["sharing/offered"]
        assert accepted == (r["sharing/received"] if every_one_trains else 0)
