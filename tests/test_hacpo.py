"""HACPO's two variants (hacpo.py, --hacpo-variant) against naive references: the issue's hand example trained by
each variant's update written out sample by sample, the official one from the authors' recipe
(zzx-peter/HACRL-code, recipe/hacpo: compute_hacpo_advantages, compute_hacpo_loss, the self-first minibatches),
today's from DESIGN.md §4.16; what the official exchange sends; a run; and each equation (capability, its ratios,
the advantages, the sequence ratio and its weights) by hand, against a naive loop or as a property."""

import copy
import json
import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo
import learner
import sharing
import train
from args import Args
from baselines import hacpo
from test_sharing import EPS, PROMPTS, experience, naive_logprobs, untrained  # noqa: F401
from test_train import tiny_args

TEMPERATURE = 0.7
CAPABILITY = {"llama": 0.3, "qwen2": 0.6}                  # the receiver llama, the peer qwen2: w(peer, llama) = 2
OWN = ["3 + 4 = 7\nAnswer: 7", "3 + 4 = 8\nAnswer: 8", "3 + 4 = 6\nAnswer: 6", "3 + 4 = 12\nAnswer: 12"]
PEER = ["3 + 4 = 7\nAnswer: 7", "4 + 3 = 7\nAnswer: 7", "3 + 4 = 9\nAnswer: 9", "7\nAnswer: 7"]
OWN_REWARDS, PEER_REWARDS = [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]
LOG_S = [-0.10, 0.05, -0.30, -0.15]       # each peer rollout's sequence ratio under the receiver before any step
ALPHA, DELTA, DELTA_STEP, LR = 1.0, 0.2, 0.025, 0.01   # a step that moves log s by up to 0.015


def token_logprobs(model, prompt, completion):
    """log pi of each token of `completion` given `prompt` at TEMPERATURE, with its gradient: one plain forward."""
    logits = model(torch.tensor([prompt + completion])).logits[0, :-1] / TEMPERATURE
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return torch.log_softmax(logits, -1)[positions, torch.tensor(completion)]


def sequence_logprob(model, prompt, completion):
    """The mean log-prob of `completion` given `prompt` at TEMPERATURE, with its gradient."""
    return token_logprobs(model, prompt, completion).mean()


def hand_example(policies, variant):
    """The issue's example as an exchange would see it: the peer's behaviour log-probs set so that each of its
    rollouts has the sequence ratio exp(LOG_S) with the receiver as it is, measured over the tokens the variant
    measures it on (EOS in for ours, out for official); returns (receiver, peer) experiences."""
    llama, qwen = policies["llama"], policies["qwen2"]
    receiver = experience(llama, PROMPTS[:1], [OWN], [OWN_REWARDS])
    peer = experience(qwen, PROMPTS[:1], [PEER], [PEER_REWARDS])
    prompt = llama.encode_prompt(PROMPTS[0])
    means = [naive_logprobs(llama.model, prompt, llama.encode_completion(t, eos=variant == "ours"),
                            TEMPERATURE).mean().item() for t in PEER]
    peer.rollouts.logprobs = [torch.full((len(ids),), m - s) for ids, m, s in zip(peer.rollouts.completion_ids,
                                                                                 means, LOG_S)]
    return receiver, peer


def trained(policies, variant):
    """The implementation's iteration on the hand example, two optimizer steps of SGD: the gradient of each step."""
    receiver, peer = hand_example(policies, variant)
    chosen = {} if variant == "ours" else {"variant": variant}   # ours: the default, as registered runs use
    cfg = sharing.ShareConfig("hacpo", temperature=TEMPERATURE, minibatches=2, settings=hacpo.Settings(
        alpha=ALPHA, delta=DELTA, delta_step=DELTA_STEP, **chosen))
    received = hacpo.exchange([receiver, peer], cfg, CAPABILITY, "llama")["llama"]
    batch = learner.training_batch(receiver.policy, receiver.rollouts, received)
    model = copy.deepcopy(receiver.policy.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads = []
    optimizer.register_step_pre_hook(lambda *_: grads.append([p.grad.clone() for p in model.parameters()]))
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=3, max_grad_norm=1e9,
                   temperature=TEMPERATURE, minibatches=2)
    return grads


def sgd_steps(model, losses):
    """One SGD step of LR per loss function of the model, in order; the gradient of each step."""
    grads = []
    for loss in losses:
        model.zero_grad()
        loss(model).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return grads


def recipe_iteration(policies, frozen=False):
    """The authors' recipe on the hand example, sample by sample: the gradient of each optimizer step, and the
    net coefficient of the peer samples' mean grad log pi in their step at the starting weights.

    compute_hacpo_advantages: baseline = mean of R / clamp(P_source / P_learner, 1/10, 10) over the joint group
    (the receiver's own mean if that exceeds 1, the mean if all rewards are equal), A = (R - baseline) /
    (sample std + 1e-6). The trainer puts the receiver's samples first, then the peer's; ppo_mini_batch_size x n
    cuts them into two minibatches of 4, one optimizer step each, whose loss is -mean of every sample's objective:
    own, min(s A, clip(s, 1 - 3e-4, 1 + 4e-4) A); a peer's, c sg(c)^alpha w A with c = clip(s, 1 - delta + m
    delta_step, 1) in step m and w = P_peer / P_learner clamped; s = exp(mean log pi_theta - the writer's mean
    log-prob) over the text's tokens, EOS left out, with theta as it is at that step. The own samples keep their
    EOS, as this codebase trains them (a departure DESIGN.md §4.16 names). `frozen`: s of the peers measured at the
    starting weights instead, the recipe's re-measurement left out (to show the test sees it)."""
    llama = policies["llama"]
    model = copy.deepcopy(llama.model)
    prompt = llama.encode_prompt(PROMPTS[0])
    rewards, sources = OWN_REWARDS + PEER_REWARDS, ["llama"] * 4 + ["qwen2"] * 4
    ratio = [min(max(CAPABILITY[s] / CAPABILITY["llama"], 0.1), 10.0) for s in sources]
    baseline = statistics.mean(r / w for r, w in zip(rewards, ratio))
    if baseline > 1:
        baseline = statistics.mean(OWN_REWARDS)
    advantage = [(r - baseline) / (statistics.stdev(rewards) + 1e-6) for r in rewards]
    own_rows = [llama.encode_completion(t, eos=True) for t in OWN]
    peer_rows = [llama.encode_completion(t, eos=False) for t in PEER]
    with torch.no_grad():   # the own samples' writer is the receiver; a peer's behaviour mean sets its s
        own_behaviour = [sequence_logprob(model, prompt, c).item() for c in own_rows]
        peer_behaviour = [sequence_logprob(model, prompt, c).item() - s for c, s in zip(peer_rows, LOG_S)]

    def own_step(model):
        objectives = []
        for c, behaviour, a in zip(own_rows, own_behaviour, advantage[:4]):
            s = torch.exp(sequence_logprob(model, prompt, c) - behaviour)
            objectives.append(torch.minimum(s * a, s.clamp(1 - 3e-4, 1 + 4e-4) * a))
        return -torch.stack(objectives).mean()

    def peer_step(model, m=1):
        lower, objectives = min(1.0, 1 - DELTA + m * DELTA_STEP), []
        for c, behaviour, a, w, log_s in zip(peer_rows, peer_behaviour, advantage[4:], ratio[4:], LOG_S):
            log_s_now = sequence_logprob(model, prompt, c) - behaviour
            if frozen:   # the starting s, with the gradient of log pi
                log_s_now = log_s_now - log_s_now.detach() + log_s
            clipped = torch.exp(log_s_now).clamp(lower, 1.0)
            objectives.append(clipped * clipped.detach() ** ALPHA * w * a)
        return -torch.stack(objectives).mean()

    lower = min(1.0, 1 - DELTA + DELTA_STEP)
    coefficient = sum(math.exp((1 + ALPHA) * s) * w * a for s, w, a in zip(LOG_S, ratio[4:], advantage[4:])
                      if lower <= math.exp(s) <= 1) / 4
    return sgd_steps(model, [own_step, peer_step]), coefficient


def ours_iteration(policies):
    """Today's HACPO on the hand example, sample by sample (DESIGN.md §4.16): the gradient of each optimizer step,
    and the net coefficient of the peer samples' mean grad log pi in their step at the starting weights.

    A = (R - baseline) / (population std + 1e-4), the baseline as the recipe's on 0/1 rewards; a peer sample's
    credit is w A, w = P_peer / P_learner, and its s, EOS included, is measured once, before the first step; only
    the peers with s in [1 - delta, 1] join the batch, after the 4 own samples; the 4 + S rows are cut into two
    consecutive steps (the larger first), each the mean over its rows of the clipped surrogate's token mean, pi_old
    the starting weights, a peer's tokens weighted s^(1 + alpha) where s lies in its step's clip range."""
    llama = policies["llama"]
    model = copy.deepcopy(llama.model)
    prompt = llama.encode_prompt(PROMPTS[0])
    rewards = OWN_REWARDS + PEER_REWARDS
    reweighted = OWN_REWARDS + [r * CAPABILITY["llama"] / CAPABILITY["qwen2"] for r in PEER_REWARDS]
    baseline = statistics.mean(reweighted)
    advantage = [(r - baseline) / (statistics.pstdev(rewards) + 1e-4) for r in rewards]
    credit = CAPABILITY["qwen2"] / CAPABILITY["llama"]
    sent = [i for i, s in enumerate(LOG_S) if 1 - DELTA <= math.exp(s) <= 1]
    # (completion, advantage, s or None for an own sample) per row, own first
    rows = ([(llama.encode_completion(t, eos=True), a, None) for t, a in zip(OWN, advantage[:4])]
            + [(llama.encode_completion(PEER[i], eos=True), credit * advantage[4 + i], math.exp(LOG_S[i]))
               for i in sent])
    first = math.ceil(len(rows) / 2)
    parts = [range(first), range(first, len(rows))]
    with torch.no_grad():
        old = [token_logprobs(model, prompt, completion) for completion, _, _ in rows]

    def weight(s, m):
        return 1.0 if s is None else s ** (1 + ALPHA) if s >= min(1.0, 1 - DELTA + m * DELTA_STEP) else 0.0

    def step(m):
        def loss(model):
            per_row = []
            for i in parts[m]:
                completion, a, s = rows[i]
                ratio = torch.exp(token_logprobs(model, prompt, completion) - old[i])
                per_row.append((-weight(s, m) * torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)).mean())
            return torch.stack(per_row).mean()
        return loss

    coefficient = sum(weight(rows[i][2], 1) * rows[i][1] for i in parts[1] if rows[i][2] is not None)
    return sgd_steps(model, [step(0), step(1)]), coefficient / len(parts[1])


def assert_same_gradients(got, want):
    for step_got, step_want in zip(got, want, strict=True):
        for g, w in zip(step_got, step_want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


def test_the_official_variant_trains_the_hand_example_as_the_recipe_does(untrained):
    want, coefficient = recipe_iteration(untrained)
    # the peers' net credit in their step: (s1^2 + s4^2) x 2 x 0.6875 / 0.5345 / 4, the two others clipped but
    # counted in the mean over the step's 4 samples
    assert coefficient == pytest.approx(1.0030, abs=1e-4)
    got = trained(untrained, "official")
    assert_same_gradients(got, want)
    assert max(g.abs().max().item() for g in got[1]) > 0.1          # the peers' step trains
    # the recipe's s moves with the first step: measured once instead, the peers' step would differ
    frozen, _ = recipe_iteration(untrained, frozen=True)
    assert max((g - f).abs().max().item() for g, f in zip(got[1], frozen[1])) > 1e-3


def test_the_default_variant_weighs_the_peers_of_the_hand_example_about_1_43_times_the_recipe(untrained):
    want, coefficient = ours_iteration(untrained)
    # the two peers inside [0.825, 1] share their step with the last own sample, 3 rows: (s1^2 + s4^2) x 2 x
    # 0.6875 / 0.5001 / 3
    assert coefficient == pytest.approx(1.4293, abs=1e-4)
    assert coefficient / recipe_iteration(untrained)[1] == pytest.approx(1.425, abs=1e-3)
    assert_same_gradients(trained(untrained, "ours"), want)
    assert (hacpo.Settings().variant == Args().hacpo_variant == Args(share="hacpo").share_config.settings.variant
            == "ours")


def test_the_official_variant_sends_every_peer_rollout_without_its_eos(untrained):
    llama, qwen = untrained["llama"], untrained["qwen2"]
    texts = [PEER[:2], ["", "9 + 9 = 19\nAnswer: 19"]]          # prompt 1: an EOS alone, and a failure
    receiver = experience(llama, PROMPTS[:2], [OWN[:2], OWN[2:]], [[1.0, 0.0], [0.0, 0.0]])
    peer = experience(qwen, PROMPTS[:2], texts, [[1.0, 1.0], [0.0, 0.0]])     # prompt 1: nobody succeeded
    gen = torch.Generator().manual_seed(0)
    peer.rollouts.logprobs = [-torch.rand(len(ids), generator=gen) for ids in peer.rollouts.completion_ids]
    cfg = sharing.ShareConfig("hacpo", temperature=TEMPERATURE, minibatches=2,
                              settings=hacpo.Settings(variant="official"))
    received = hacpo.exchange([receiver, peer], cfg, CAPABILITY, "llama")["llama"]
    crossings = received.crossings
    assert [c.index for c in crossings] == [0, 1, 2, 3]         # the uniform prompt's too: they count in the mean
    eos = qwen.tokenizer.eos_token_id
    for c, text, ids, logp in zip(crossings, texts[0] + texts[1], peer.rollouts.completion_ids,
                                  peer.rollouts.logprobs):
        lone = text == ""
        assert c.completion_ids == llama.encode_completion(text, eos=lone)   # an EOS alone keeps it
        assert ids[-1] == eos
        assert c.behaviour == pytest.approx(logp[:len(ids) if lone else -1].double().mean().item())
    assert all(not c.advantages.any() for c in crossings[2:])
    assert received.metrics["sharing/offered"] == received.metrics["sharing/received"] == 4
    batch = learner.training_batch(llama, receiver.rollouts, received)
    assert batch.remeasured.behaviour[:4].isnan().all()
    torch.testing.assert_close(batch.remeasured.behaviour[4:], torch.tensor([c.behaviour for c in crossings],
                                                                            dtype=torch.float64))
    # the update's weight is the sequence ratio's, s^(1+alpha) inside the step's clip range [0.825, 1]
    log_s = torch.tensor([-0.1, -0.2, 0.1], dtype=torch.float64)
    torch.testing.assert_close(received.remeasure(log_s, step=1),
                               torch.tensor([math.exp(-0.2), 0.0, 0.0], dtype=torch.float64))
    ours = hacpo.exchange([receiver, peer], sharing.ShareConfig("hacpo", temperature=TEMPERATURE), CAPABILITY,
                          "llama")["llama"]
    assert learner.training_batch(llama, receiver.rollouts, ours).remeasured is None


def test_a_run_of_the_official_variant_sends_every_peer_rollout(tmp_path, cache_dir):
    run_dir = train.main(tiny_args(tmp_path, cache_dir, share="hacpo", hacpo_variant="official", minibatches=2))
    updates = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "losses/policy_loss" in r]
    assert len(updates) == 4 and all(math.isfinite(r["losses/policy_loss"]) for r in updates)
    assert all(r["sharing/received"] == r["sharing/offered"] == 8 * 6 for r in updates)   # 8 prompts x 6
    assert json.loads((run_dir / "config.json").read_text())["hacpo_variant"] == "official"


def test_every_hacpo_flag_reaches_its_setting_and_grafts_too():
    args = Args(share="hacpo", hacpo_alpha=1.5, hacpo_delta=0.3, hacpo_window=7, hacpo_capability_bound=4.0,
                hacpo_delta_step=0.01, hacpo_variant="official")
    assert args.share_config.settings == hacpo.Settings(alpha=1.5, delta=0.3, window=7, capability_bound=4.0,
                                                        delta_step=0.01, variant="official")
    from baselines import graft
    assert Args(share="graft", graft_delta=0.6).share_config.settings == graft.Settings(delta=0.6)
    assert Args(share="sgt").share_config.settings is None


# ---------------------------------------------------------------------------------------------------------------
# HACPO's equations (hacpo.py)
# ---------------------------------------------------------------------------------------------------------------

def test_hacpo_capability_is_the_mean_reward_of_the_last_window_iterations(tmp_path):
    caps = hacpo.Capabilities(window=2)
    for rewards in ([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[1.0, 0.0]]):   # iteration means 0, 1, 1/2
        caps.observe("a", torch.tensor(rewards))
    caps.observe("b", torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    expected = torch.tensor([0.75, 0.25], dtype=torch.float64)                  # a: the last two, (1 + 1/2) / 2
    torch.testing.assert_close(caps.of(["a", "b"]), expected)
    torch.save(caps, tmp_path / "state.pt")                                     # what a checkpoint keeps
    torch.testing.assert_close(torch.load(tmp_path / "state.pt", weights_only=False).of(["a", "b"]), expected)
    with pytest.raises(KeyError, match="no rewards"):
        caps.of(["a", "c"])
    for bad in (torch.tensor([[float("nan"), 1.0]]), torch.zeros(2, 0)):
        with pytest.raises(ValueError, match="finite reward"):
            caps.observe("a", bad)
    with pytest.raises(ValueError, match="window"):
        hacpo.Capabilities(window=0)


def test_hacpo_capability_ratios_by_hand_and_at_their_bounds():
    # P = 0.6, 0.3, 0.01 and 0 (never succeeded): 0.6 / 0.01 = 60 and 0.3 / 0 hit the bound 10 (or 1/10);
    # two policies that both never succeeded are equals
    ratios = hacpo.capability_ratios(torch.tensor([0.6, 0.3, 0.01, 0.0], dtype=torch.float64), bound=10.0)
    torch.testing.assert_close(ratios, torch.tensor([[1.0, 2.0, 10.0, 10.0],
                                                     [0.5, 1.0, 10.0, 10.0],
                                                     [0.1, 0.1, 1.0, 10.0],
                                                     [0.1, 0.1, 0.1, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(hacpo.capability_ratios(torch.tensor([0.0, 0.0]), bound=10.0), torch.ones(2, 2))
    torch.testing.assert_close(hacpo.capability_ratios(torch.tensor([0.9, 0.1]), bound=1.0), torch.ones(2, 2))
    with pytest.raises(ValueError, match="bound"):
        hacpo.capability_ratios(torch.tensor([0.5, 0.5]), bound=0.5)
    with pytest.raises(ValueError, match="non-negative"):
        hacpo.capability_ratios(torch.tensor([0.5, -0.1]), bound=10.0)


def test_hacpo_advantages_by_hand():
    # a receiver half as capable as its peer: its own rewards count once, the peer's half (eq. 7), the std is the
    # joint group's (eq. 6)
    reweight, own = torch.tensor([1.0, 1.0, 0.5, 0.5]), torch.tensor([True, True, False, False])
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0],   # baseline (1 + 0 + 1/2 + 1/2) / 4 = 1/2; std sqrt(3)/4
                            [1.0, 1.0, 1.0, 1.0],   # every response alike: no signal, whatever the weights
                            [0.0, 0.0, 0.0, 0.0]])
    s = math.sqrt(3) / 4
    torch.testing.assert_close(hacpo.capability_advantages(rewards, reweight, own),
                               torch.tensor([[0.5 / (s + EPS), -0.5 / (s + EPS), 0.5 / (s + EPS), 0.5 / (s + EPS)],
                                             [0.0] * 4, [0.0] * 4]))
    torch.testing.assert_close(hacpo.capability_advantages(rewards, reweight, own, scale_by_std=False),
                               torch.tensor([[0.5, -0.5, 0.5, 0.5], [0.0] * 4, [0.0] * 4]))
    # the float32 mean of three rewards 0.8223115 misses it by 6e-8: still exactly no signal
    uniform = hacpo.capability_advantages(torch.full((1, 5), 0.822311520576477), torch.tensor([1, 1, 1, 0.3, 0.3]),
                                          torch.tensor([True, True, True, False, False]))
    assert uniform.tolist() == [[0.0] * 5]
    # a receiver four times as capable as its peer: the peer's success counts 4, the baseline (1 + 1 + 4) / 4 = 3/2
    # would exceed every reward, so the receiver's own mean 1 is the baseline
    torch.testing.assert_close(hacpo.capability_advantages(torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
                                                           torch.tensor([1.0, 1.0, 4.0, 4.0]), own),
                               torch.tensor([[0.0, 0.0, 0.0, -1 / (s + EPS)]]))


def naive_capability_advantages(rewards, reweight, own, scale_by_std):
    out = []
    for row in rewards.tolist():
        baseline = sum(w * r for w, r in zip(reweight.tolist(), row)) / len(row)
        if not min(row) <= baseline <= max(row):
            mine = [r for r, o in zip(row, own.tolist()) if o]
            baseline = sum(mine) / len(mine)
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / len(row))
        scale = std + EPS if scale_by_std else 1.0
        out.append([0.0 if max(row) == min(row) else (r - baseline) / scale for r in row])
    return torch.tensor(out)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(1, 4), min_size=2, max_size=3), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_hacpo_advantages_equal_a_naive_loop_and_with_equal_capabilities_xgrpo(groups, sizes, scale_by_std, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = [torch.randint(0, 3, (groups, g), generator=gen).float() / 2 for g in sizes]   # rewards 0, 1/2, 1
    pooled, own = torch.cat(rewards, dim=1), torch.arange(sum(sizes)) < sizes[0]
    reweight = torch.where(own, 1.0, 0.1 + 9.9 * torch.rand(sum(sizes), generator=gen))
    torch.testing.assert_close(hacpo.capability_advantages(pooled, reweight, own, scale_by_std),
                               naive_capability_advantages(pooled, reweight, own, scale_by_std))
    equal = hacpo.capability_advantages(pooled, torch.ones(sum(sizes)), own, scale_by_std)[:, own]
    torch.testing.assert_close(equal, grpo.xgrpo_advantages(rewards[0], rewards[1:], scale_by_std))


@pytest.mark.parametrize("rewards, reweight, own", [
    (torch.zeros(2, 0), torch.ones(0), torch.ones(0, dtype=torch.bool)),                       # empty groups
    (torch.tensor([[1.0, float("nan")]]), torch.ones(2), torch.tensor([True, False])),
    (torch.ones(1, 2), torch.ones(3), torch.tensor([True, False])),                              # a weight too many
    (torch.ones(1, 2), torch.tensor([1.0, 0.0]), torch.tensor([True, False])),                  # a zero weight
    (torch.ones(1, 2), torch.ones(2), torch.tensor([False, False]))])                           # no own response
def test_hacpo_advantages_refuse_bad_groups(rewards, reweight, own):
    with pytest.raises(ValueError):
        hacpo.capability_advantages(rewards, reweight, own)


def test_hacpo_sequence_ratio_normalizes_each_side_by_its_own_length():
    # the receiver's three tokens average -0.4, the source's two -0.2: s = exp(-0.2) (eq. 11)
    log_s = hacpo.sequence_log_ratio(torch.tensor([-0.2, -0.4, -0.6]), torch.tensor([-0.1, -0.3]))
    assert log_s.item() == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="NaN"):
        hacpo.sequence_log_ratio(torch.tensor([-0.2, float("nan")]), torch.tensor([-0.1]))
    with pytest.raises(ValueError, match="at least one token"):
        hacpo.sequence_log_ratio(torch.tensor([]), torch.tensor([-0.1]))


def test_hacpo_weights_by_hand_inside_and_outside_the_clip_range():
    s = torch.tensor([0.9, 0.81, 0.79, 1.0, 1.05, 0.0], dtype=torch.float64)   # log 0 = -inf
    # delta 0.2: [0.8, 1] holds 0.9, 0.81 and 1; 0.79, 1.05 and 0 carry no gradient
    torch.testing.assert_close(hacpo.cross_weights(s.log(), alpha=1.0, delta=0.2),
                               torch.tensor([0.81, 0.6561, 0, 1, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(hacpo.cross_weights(s.log(), alpha=0.0, delta=0.2),
                               torch.tensor([0.9, 0.81, 0, 1, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(hacpo.cross_weights(s.log(), alpha=2.0, delta=0.25),
                               torch.tensor([0.729, 0.81 ** 3, 0.79 ** 3, 1, 0, 0], dtype=torch.float64))
    for alpha, delta, log_s in ((-0.5, 0.2, s.log()), (1.0, 1.5, s.log()), (1.0, 0.2, torch.tensor([float("nan")]))):
        with pytest.raises(ValueError):
            hacpo.cross_weights(log_s, alpha, delta)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=30), st.floats(0, 4), st.floats(0, 1))
def test_hacpo_weights_never_upweight_and_vanish_outside_the_clip_range(log_ratios, alpha, delta):
    log_s = torch.tensor(log_ratios, dtype=torch.float64)
    weights = hacpo.cross_weights(log_s, alpha, delta)
    assert ((weights >= 0) & (weights <= 1)).all()
    outside = (log_s > 0) | (log_s.exp() < 1 - delta)
    assert (weights[outside] == 0).all()
    torch.testing.assert_close(weights[~outside], log_s[~outside].exp() ** (1 + alpha))
