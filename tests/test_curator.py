"""The curator against hand-computed examples and properties on random diagnoses; the bandit, the predictor, and
cross-fidelity runs end to end."""

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import coevolution
import curator
import grpo
import policies
import reward_drift
import sharing
import tasks
import tokalign
import train
from test_train import tiny_args

EPS = 1e-4  # grpo.group_advantages' default


def encoding(data: bytes, cuts: list[int]) -> tokalign.Encoding:
    """A hand-made tokenization of `data` with token boundaries at `cuts` (ids are positions)."""
    bounds = [0, *cuts, len(data)]
    return tokalign.Encoding(list(range(len(bounds) - 1)), list(zip(bounds, bounds[1:])), data)


def test_admission_boundaries_on_hand_made_degradations():
    bands = [curator.admission_band(d, 0.2, 0.35) for d in (0.0, 0.1999, 0.2, 0.3499, 0.35, 1.0)]
    assert bands == [0, 0, 1, 1, 2, 2]
    assert curator.admission_band(0.2, 0.2, 0.2) == 2          # an empty XGRPO band
    with pytest.raises(ValueError, match="degradation"):
        curator.admission_band(float("nan"), 0.2, 0.35)


def test_degradation_by_hand_and_ablated_weights_renormalize():
    cfg = curator.CuratorConfig(lambdas=(0.5, 0.3, 0.2))
    assert curator.degradation(torch.tensor([0.2, 0.5, 1.0], dtype=torch.float64), cfg.weights) == pytest.approx(
        0.5 * 0.2 + 0.3 * 0.5 + 0.2 * 1.0)
    ablated = curator.CuratorConfig(lambdas=(0.5, 0.3, 0.2), ablate=("ccm",))
    torch.testing.assert_close(ablated.weights, torch.tensor([5 / 7, 0.0, 2 / 7], dtype=torch.float64))
    for bad in (dict(lambdas=(0.5, 0.5, 0.5)), dict(ablate=("tbd", "ccm", "rsd")), dict(ablate=("kl",)),
                dict(theta1=0.5, theta2=0.4), dict(process_signal="oracle")):
        with pytest.raises(ValueError):
            curator.CuratorConfig(**bad)


def test_drift_bound_by_hand():
    values = curator.drift_bound(torch.tensor([0.0, math.log(2), 50.0], dtype=torch.float64))
    torch.testing.assert_close(values, torch.tensor([0.0, math.sqrt(0.5), 1.0], dtype=torch.float64))


def test_tbd_counts_a_straddled_step_boundary_not_a_digit_split():
    data = b"123+4=127\n1+2=3"
    steps = [(0, 9), (10, 15)]
    qwen_like = encoding(data, list(range(1, len(data))))                   # one byte per token
    llama_like = encoding(data, [3, 4, 5, 6, 9, 10, 11, 12, 13, 14])        # "123" one token: a 3:1 group
    alignment = tokalign.align(qwen_like, llama_like)
    tbd, left = curator.tbd_steps(alignment, qwen_like, llama_like, steps)
    torch.testing.assert_close(tbd, torch.zeros(2, dtype=torch.float64))  # the 1:n split changes no step's credit
    jaccard = tokalign.step_consistency(alignment, tokalign.boundary_similarity(alignment), steps)
    assert jaccard[0] < 1                                                   # while the byte-boundary sim calls it drift
    straddling = encoding(data, [3, 4, 5, 6, 8, 11, 12, 13, 14])            # one token "7\n1" holds bytes of both steps
    alignment = tokalign.align(qwen_like, straddling)
    tbd, left = curator.tbd_steps(alignment, qwen_like, straddling, steps)
    torch.testing.assert_close(tbd, torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(left, torch.zeros(2, dtype=torch.float64))  # redistribution resolves it all


def test_step_credit_applies_rsd_then_ccm_by_hand():
    target = reward_drift.StepStats()
    target.add_iteration([reward_drift.StepReward((0, 1), "+1", 1.0)] * 2 + [reward_drift.StepReward((0, 1), "+1", 0.0)] * 2)
    process = [reward_drift.StepReward((0, 5), "+1", 1.0), reward_drift.StepReward((6, 9), None, None)]
    diagnosis = curator.Diagnosis(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.tensor([0.5, 0.8]),
                                  torch.tensor([3.0, 1.0]))
    cfg = curator.CuratorConfig(credit_mix=0.5, ccm_beta=2.0)
    credit, recalibrated = curator.step_credit(1.0, process, diagnosis, target, cfg)
    # step 0 is verified: 0.5 * 1 + 0.5 * (1 - 1/2) = 0.75, then * 0.5^2; step 1 is not: the intrinsic signal,
    # rank of -g among the two steps = 1 (the smaller norm) -> 1 - 1/2: 0.5 + 0.25 = 0.75, then * 0.8^2
    torch.testing.assert_close(credit, torch.tensor([0.75 * 0.25, 0.75 * 0.64], dtype=torch.float64))
    assert recalibrated.tolist() == [True, True]
    off, _ = curator.step_credit(1.0, process, diagnosis, target, curator.CuratorConfig(ablate=("rsd", "tbd")))
    torch.testing.assert_close(off, torch.tensor([0.5, 0.8], dtype=torch.float64))


def test_token_credit_splits_a_straddling_token_by_bytes_and_conserves_credit():
    data = b"1+1=2\n2+2=4"
    steps = [(0, 5), (6, 11)]
    source = encoding(data, list(range(1, len(data))))
    target = encoding(data, [4, 7])                                          # "1+1=", "2\n2", "+2=4"
    alignment = tokalign.align(source, target)
    credit = torch.tensor([1.0, -1.0], dtype=torch.float64)
    tokens = curator.token_credit(source, target, alignment, steps, credit, 0.25, redistribute=True)
    torch.testing.assert_close(tokens, torch.tensor([1.0, (1.0 + 0.25 - 1.0) / 3, -1.0]))
    naive = curator.token_credit(source, target, alignment, steps, credit, 0.25, redistribute=False)
    torch.testing.assert_close(naive, torch.tensor([1.0, 1.0, -1.0]))    # the first byte's step takes it all


diagnoses = st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 1), min_size=k, max_size=k), st.lists(st.floats(0, 1), min_size=k, max_size=k),
    st.lists(st.one_of(st.none(), st.floats(0, 0.999)), min_size=k, max_size=k),
    st.lists(st.floats(1e-3, 1), min_size=k, max_size=k)))


def make_diagnosis(values) -> curator.Diagnosis:
    tbd, left, rsd, reach = values
    tbd_t = torch.tensor(tbd, dtype=torch.float64)
    return curator.Diagnosis(tbd_t, torch.minimum(tbd_t, torch.tensor(left, dtype=torch.float64)),
                             torch.tensor([math.nan if r is None else r for r in rsd], dtype=torch.float64),
                             torch.tensor(reach, dtype=torch.float64), torch.ones(len(reach)))


class FakeOffer:
    def __init__(self, diagnosis):
        self.diagnosis = diagnosis


@settings(max_examples=100, deadline=None)
@given(diagnoses, st.floats(0.1, 4), st.floats(0, 1), st.sampled_from([(), ("tbd",), ("ccm",), ("rsd",)]))
def test_a_repair_never_raises_the_degradation_it_repairs(values, beta, mix, ablate):
    cfg = curator.CuratorConfig(ccm_beta=beta, credit_mix=mix, ablate=ablate)
    d = make_diagnosis(values)
    before, after = d.terms(cfg), d.terms(cfg, repaired=True)
    assert (torch.nan_to_num(after) <= torch.nan_to_num(before) + 1e-12).all()
    scored = curator.score(FakeOffer(d), cfg, (0.2, 0.35))
    assert scored["D_repaired"] <= scored["D"] + 1e-12


@settings(max_examples=100, deadline=None)
@given(diagnoses, diagnoses, st.sampled_from(curator.TERMS))
def test_an_ablated_term_changes_no_decision(values, other, term):
    cfg = curator.CuratorConfig(ablate=(term,))
    i = curator.TERMS.index(term)
    mixed = list(values)
    k = len(values[0])
    if term == "tbd":
        mixed[0], mixed[1] = (other[0] * k)[:k], (other[1] * k)[:k]
    elif term == "ccm":
        mixed[3] = (other[3] * k)[:k]
    else:
        mixed[2] = (other[2] * k)[:k]
    a, b = (curator.score(FakeOffer(make_diagnosis(v)), cfg, (0.2, 0.35)) for v in (values, mixed))
    assert a["band"] == b["band"] and a["D"] == pytest.approx(b["D"]) and math.isnan(a["terms"][term])
    assert i == curator.TERMS.index(term)


@settings(max_examples=100, deadline=None)
@given(diagnoses, st.sampled_from(curator.TERMS), st.floats(0.01, 0.5), st.floats(0.0, 0.5), st.floats(0.2, 3))
def test_with_all_weight_on_one_term_admission_follows_that_term_alone(values, term, theta1, width, beta):
    lambdas = tuple(1.0 if t == term else 0.0 for t in curator.TERMS)
    cfg = curator.CuratorConfig(lambdas=lambdas, theta1=theta1, theta2=theta1 + width, ccm_beta=beta)
    tbd, left, rsd, reach = values
    typed = [r for r in rsd if r is not None]
    # the term alone, and what its own repair leaves of it, computed here from the definitions
    alone = {"tbd": (sum(tbd) / len(tbd), sum(min(a, b) for a, b in zip(tbd, left)) / len(tbd)),
             "ccm": (sum(1 - r for r in reach) / len(reach), sum(r ** beta * (1 - r) for r in reach) / len(reach)),
             "rsd": (sum(typed) / len(typed) if typed else 0.0,
                     (1 - cfg.credit_mix) * sum(typed) / len(typed) if typed else 0.0)}[term]
    expected = curator.admission_band(alone[0], cfg.theta1, cfg.theta2)
    if expected > 0 and alone[1] < alone[0] - 1e-12:
        expected = curator.admission_band(alone[1], cfg.theta1, cfg.theta2)
    assert curator.score(FakeOffer(make_diagnosis(values)), cfg, (cfg.theta1, cfg.theta2))["band"] == expected


# ---------------------------------------------------------------------------------------------------------------
# Threshold co-evolution and the predictor
# ---------------------------------------------------------------------------------------------------------------

STABLE = {"charts/reward_std": 0.4, "losses/kl": 0.0, "losses/grad_norm": 1.0}


def test_the_bandit_raises_thresholds_over_stable_cycles_and_backs_off_after_an_unstable_one():
    bandit = coevolution.ThresholdBandit(0.2, 0.35, coevolution.BanditConfig(step=0.05, epsilon=1.0), seed=0)
    played = []
    for cycle in range(6):
        played.append(bandit.choose("qwen", "llama", gap=0.0))
        stats = dict(STABLE, **{"charts/reward_std": 0.4 + 0.01 * (cycle % 2)})
        assert bandit.observe("llama", stats) == []
    assert [round(t1, 6) for t1, _ in played] == [0.25, 0.3, 0.35, 0.4, 0.45, 0.5]
    tried = bandit.choose("qwen", "llama", gap=0.0)
    assert bandit.observe("llama", dict(STABLE, **{"losses/grad_norm": 50.0})) == ["losses/grad_norm"]
    bandit.cfg = coevolution.BanditConfig(step=0.05, epsilon=0.0)             # exploit: the level it kept
    assert bandit.choose("qwen", "llama", gap=0.0)[0] == pytest.approx(tried[0] - 0.05)
    assert bandit.choose("qwen", "llama", gap=0.5) == pytest.approx((0.2, 0.35))   # another context starts low


def test_the_stability_guard_trips_only_outside_a_signals_own_range():
    guard = coevolution.StabilityGuard(window=10, z=3.0)
    for value in (1.0, 1.1, 0.9, 1.05):
        assert guard.check({"losses/grad_norm": value}) == []
    assert guard.check({"losses/grad_norm": 1.2}) == []
    assert guard.check({"losses/grad_norm": 5.0}) == ["losses/grad_norm"]
    assert guard.check({"losses/grad_norm": float("nan")}) == ["losses/grad_norm"]


def test_the_predictors_skip_never_changes_a_decision_it_was_sure_of_on_a_replayed_log():
    # a log of fully diagnosed trajectories whose band is a threshold function of two features, with a grey zone
    rng = random.Random(0)
    log = []
    for _ in range(600):
        x = torch.tensor([rng.random(), rng.random(), rng.random()], dtype=torch.float64)
        d = 0.6 * x[0].item() + 0.4 * x[1].item()
        log.append((x, curator.admission_band(d, 0.3, 0.6)))
    predictor = coevolution.FidelityPredictor(3, coevolution.PredictorConfig(min_history=64, audit=0.2), seed=0)
    skipped = 0
    for start in range(0, len(log), 40):                                        # replay in cycles of 40
        batch = log[start:start + 40]
        xs = torch.stack([x for x, _ in batch])
        bands, probs = predictor.predict(xs)
        full = []
        for (x, band), guess, p in zip(batch, bands.tolist(), probs.tolist()):
            sure, skip = predictor.may_skip(p)
            if skip:
                skipped += 1
                assert guess == band, "a skipped trajectory got another decision than its full diagnosis"
            else:
                full.append((x, band))
                if sure:
                    predictor.audited(guess == band)
        predictor.learn(torch.stack([x for x, _ in full]), torch.tensor([b for _, b in full]))
    assert skipped > 100 and predictor.accuracy >= 0.95


def test_the_predictor_refuses_nan_features():
    predictor = coevolution.FidelityPredictor(2, coevolution.PredictorConfig(), seed=0)
    with pytest.raises(ValueError, match="NaN"):
        predictor.learn(torch.tensor([[0.0, math.nan]]), torch.tensor([0]))
    assert len(predictor.y) == 0


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------

def fidelity_records(run_dir):
    return [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("pair", ["qwen-llama", "trio"])
def test_a_cross_fidelity_run_exercises_every_level_and_repair(tmp_path, cache_dir, pair):
    args = tiny_args(tmp_path, cache_dir, pair=pair, share="cross-fidelity", iterations=2, theta1=0.08, theta2=0.12,
                     thresholds="adaptive")
    run_dir = train.main(args)
    records = fidelity_records(run_dir)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in logged if "losses/policy_loss" in r]
    assert all(math.isfinite(r["losses/policy_loss"]) and "fidelity/admitted_prp" in r for r in updates)
    levels = {r["level"] for r in records}
    assert levels >= {"prp", "xgrpo", "sgt", "rejected"}, levels
    repaired = {t for r in records for t in r["repairs"]}
    assert repaired >= {"ccm", "rsd"}, repaired
    assert any(r.get("through_repair") for r in records)
    for r in records:
        assert r["receiver"] != r["source"] and r["iteration"] in (1, 2)
        if "D" in r:
            assert 0 <= r["D_repaired"] <= r["D"] + 1e-9 <= 1 + 1e-9
            assert {"tbd", "ccm", "rsd"} <= set(r["terms"])
    report = (run_dir / "report.md").read_text()
    assert "Fidelity" in report


def test_admission_routes_each_band_by_hand():
    from types import SimpleNamespace as Offer
    own = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    receiver = Offer(rewards=own, advantages=grpo.group_advantages(own))
    offers = [Offer(advantage=0.5, reward=1.0, prompt=0), Offer(advantage=0.0, reward=1.0, prompt=1),
              Offer(advantage=0.3, reward=1.0, prompt=1), Offer(advantage=0.0, reward=1.0, prompt=0),
              Offer(advantage=0.7, reward=1.0, prompt=0), Offer(advantage=-0.2, reward=0.0, prompt=0),
              Offer(advantage=0.4, reward=1.0, prompt=1)]
    bands = [0, 0, 1, 2, 2, 2, 2]
    decisions, picks, advantages = curator.admit(offers, bands, receiver, sharing.ShareConfig("cross-fidelity"))
    assert [d[:2] for d in decisions] == [("prp", "tokens"), ("prp", "none"), ("xgrpo", "reward"), ("sgt", "tokens"),
                                          ("sgt", "tokens"), ("rejected", "none"), ("rejected", "none")]
    rescue = 0.5 / (0.5 + EPS)                                # prompt 0 pooled [0, 0, 1, 1]: mean 1/2, std 1/2
    assert {k: a for k, (_, a) in picks.items()} == pytest.approx({0: 0.5, 3: rescue, 4: rescue})
    s = math.sqrt(2) / 3                                      # prompt 1 pooled [1, 0, 1]: mean 2/3, std sqrt(2)/3
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.0], [(1 / 3) / (s + EPS), (-2 / 3) / (s + EPS)]]))


def test_an_exchange_between_untrained_policies_admits_repairs_and_logs_every_offer():
    from test_sharing import PROMPTS, TEXTS, experience
    from test_train import TASK
    pols = {}
    for family in ("qwen2", "llama"):
        tok = policies.tiny_tokenizer(family)
        pols[family] = policies.Policy(family, policies.tiny_model(family, policies.TinyShape(32, 2, 4, 0), len(tok),
                                                                   seed=0), tok, use_chat_template=False)
    task = tasks.load_task("arith", 0, 0, 0, TASK)
    problems = tasks.generate_problems(3, "train", seed=0, cfg=TASK)
    peer = experience(pols["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    receiver = experience(pols["llama"], PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    cur = curator.Curator(curator.CuratorConfig(theta1=0.9, theta2=0.95), ["qwen2", "llama"], 0, None, None)
    received, records = cur.exchange([receiver, peer], task, problems, sharing.ShareConfig("cross-fidelity"), 1)
    assert len(records) == 12 and all(r["level"] == "prp" for r in records)        # D < 0.9: all PRP
    llama = received["llama"]
    assert sorted(c.index for c in llama.crossings) == [0, 1, 4, 5]                 # the peer's non-zero advantages
    for c in llama.crossings:
        assert len(c.advantages) == len(c.completion_ids) and torch.isfinite(c.advantages).all()
        sign = peer.advantages.flatten()[c.index].sign()
        assert ((c.advantages * sign) >= -1e-6).all()      # repairs rescale the credit, never flip its sign here
    assert {t for r in records for t in r["repairs"]} == {"ccm", "rsd"}
    assert llama.metrics["fidelity/admitted_prp"] == 1.0 and llama.metrics["sharing/received"] == 4


def test_repeated_samples_are_measured_once_and_get_the_norms_of_a_lone_measurement(monkeypatch):
    import reachability
    tok = policies.tiny_tokenizer("llama")
    policy = policies.Policy("llama", policies.tiny_model("llama", policies.TinyShape(32, 2, 4, 0), len(tok), seed=0),
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
    norms = curator.step_norms(policy, [a, b, a, a], params)
    assert rows == [2]
    for one, got in zip([a, b, a, a], norms):
        alone = measure(policy.model, *reachability.batch_inputs([one], tok.pad_token_id), params)
        torch.testing.assert_close(got, alone, rtol=1e-4, atol=0)
