"""One shared trajectory as one receiver sees it (diagnosis.py): its three terms, the repairs of its credit in their
order (RSD, then CCM), the record of what they did, and the predictor's cheap features, each by hand."""

import math

import pytest
import torch

import diagnosis
import reward_drift


def test_step_credit_applies_rsd_then_ccm_by_hand():
    target = reward_drift.StepStats(window=20)
    target.add_iteration([reward_drift.StepReward((0, 1), "+1", 1.0)] * 2
                         + [reward_drift.StepReward((0, 1), "+1", 0.0)] * 2)
    process = [reward_drift.StepReward((0, 5), "+1", 1.0), reward_drift.StepReward((6, 9), None, None)]
    diag = diagnosis.Diagnosis(torch.zeros(2), torch.zeros(2), torch.tensor([0.5, 0.8]), torch.tensor([3.0, 1.0]))
    cfg = diagnosis.CuratorConfig(credit_mix=0.5, ccm_beta=2.0, theta1=0.1, theta2=0.2)
    credit, recalibrated = diagnosis.step_credit(1.0, process, diag, target, cfg)
    # step 0 is verified: 0.5 * 1 + 0.5 * (1 - 1/2) = 0.75, then * 0.5^2; step 1 is not: the intrinsic signal,
    # rank of -g among the two steps = 1 (the smaller norm) -> 1 - 1/2: 0.5 + 0.25 = 0.75, then * 0.8^2
    torch.testing.assert_close(credit, torch.tensor([0.75 * 0.25, 0.75 * 0.64], dtype=torch.float64))
    assert recalibrated.tolist() == [True, True]
    # at mix 1/4, whose two weights differ: step 0 0.75 * 1 + 0.25 * 1/2, step 1 0.75 * 1 + 0.25 * 1/2 again
    quarter = diagnosis.CuratorConfig(credit_mix=0.25, ccm_beta=2.0, theta1=0.1, theta2=0.2)
    credit, _ = diagnosis.step_credit(1.0, process, diag, target, quarter)
    torch.testing.assert_close(credit, torch.tensor([0.875 * 0.25, 0.875 * 0.64], dtype=torch.float64))
    # the intrinsic signal for both steps: step 0 has the larger norm, rank 0 -> -1/2: 0.75 - 0.125
    intrinsic = diagnosis.CuratorConfig(credit_mix=0.25, ccm_beta=2.0, theta1=0.1, theta2=0.2,
                                        process_signal="intrinsic")
    credit, _ = diagnosis.step_credit(1.0, process, diag, target, intrinsic)
    torch.testing.assert_close(credit, torch.tensor([0.625 * 0.25, 0.875 * 0.64], dtype=torch.float64))
    # no norms: the unverifiable step keeps the outcome advantage, unrecalibrated
    no_norms = diagnosis.Diagnosis(torch.zeros(2), torch.zeros(2), torch.tensor([0.5, 0.8]), None)
    credit, recalibrated = diagnosis.step_credit(1.0, process, no_norms, target, quarter)
    torch.testing.assert_close(credit, torch.tensor([0.875 * 0.25, 0.64], dtype=torch.float64))
    assert recalibrated.tolist() == [True, False]
    off, _ = diagnosis.step_credit(1.0, process, diag, target,
                                   diagnosis.CuratorConfig(ablate=("rsd", "tbd"), theta1=0.1, theta2=0.2))
    torch.testing.assert_close(off, torch.tensor([0.5, 0.8], dtype=torch.float64))


def test_offer_features_carry_the_ccm_proxies_by_hand():
    from types import SimpleNamespace as Fake
    rollouts = Fake(logprobs=[torch.tensor([-0.5, -1.5]), torch.tensor([-2.0])])
    diag = diagnosis.Diagnosis(torch.tensor([0.2, 0.0]), torch.tensor([0.3, math.nan]), None, None)
    offer = Fake(diagnosis=diag, alignment=Fake(modes=["1:1", "1:n", "1:1", "1:1"]),
                 receiver_encoding=Fake(ids=[0] * 25), steps=[(0, 1), (2, 3)], reward=1.0, advantage=-0.5,
                 source=Fake(rollouts=rollouts), index=0)
    features = diagnosis.offer_features(offer, diagnosis.CuratorConfig(theta1=0.1, theta2=0.2), recent=(0.12, 0.3),
                                        gap=0.25)
    # 25 receiver tokens / 50, 1 of 4 alignment groups not 1:1, 2 steps / 5, the reward, |A|, TBD mean(0.2, 0),
    # RSD its measured step (0.3), the pair's recent D and CCM, the gap, the source's mean log-prob of -0.5, -1.5
    expected = [25 / 50, 1 / 4, 2 / 5, 1.0, 0.5, 0.1, 0.3, 0.12, 0.3, 0.25, -1.0]
    assert len(expected) == len(diagnosis.FEATURES)
    torch.testing.assert_close(features, torch.tensor(expected, dtype=torch.float64))


def test_the_ccm_term_is_the_phantom_share_and_the_record_carries_the_phantom_advantage_by_hand():
    # two steps, R = 0.5 and 0.9: the term is mean (1 - R) = 0.3 whatever the advantage; a crossing that carries
    # A = -2 records the proposal's P = mean_k |A| (1 - R_k) = 0.6, and its EOS (outside both steps) the last
    # step's credit
    from types import SimpleNamespace as Fake
    reach = torch.tensor([0.5, 0.9])
    diag = diagnosis.Diagnosis(torch.zeros(2), torch.full((2,), math.nan), reach, torch.ones(2))
    assert diag.terms(diagnosis.CuratorConfig(theta1=0.1, theta2=0.2))[1].item() == pytest.approx(0.3)
    offer = Fake(diagnosis=diag, steps=[(0, 2), (3, 5)], source_encoding=Fake(data=b"12+45"),
                 receiver_encoding=Fake(offsets=[(0, 2), (2, 3), (3, 5), (5, 5)], data=b"12+45"))
    record = diagnosis.credit_record(offer, -2.0, torch.tensor([-1.0, -1.8]),
                                           torch.tensor([-1.0, -1.0, -1.8, -1.8]), ["ccm"])
    assert record["phantom"] == pytest.approx(0.6) and record["outside_credit"] == pytest.approx([-1.0, -1.8])
