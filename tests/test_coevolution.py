"""Threshold co-evolution (proposal §2.3): the bandit on simulated receivers, the gain against the receiver's own
trend and the stability guard by hand; the fidelity predictor's audit and its refusal of NaN features."""

import math
import random

import pytest
import torch

import coevolution


STABLE = {"losses/update_kl": 1e-3, "losses/grad_norm": 1.0}


def simulated_levels(reward_of_level, seed: int, cycles: int = 100, step: float = 0.02) -> list[int]:
    """The level the pair qwen -> llama holds after each cycle, under a stable guard, when llama's mean reward
    after a cycle is reward_of_level(level played, cycle, rng)."""
    bandit = coevolution.ThresholdBandit(coevolution.BanditConfig(step=step), seed=seed)
    rng, levels = random.Random(seed), []
    reward = reward_of_level(0, 0, rng)
    for cycle in range(cycles):
        bandit.judge("llama", {"charts/reward_mean": reward, "charts/reward_std": 0.4 + 0.01 * rng.random()})
        played = bandit.choose("qwen", "llama", gap=0.0)
        bandit.updated("llama", STABLE)
        reward = reward_of_level(played, cycle, rng)
        levels.append(bandit.level[("qwen", "llama", "similar")])
    return levels


def test_thresholds_hold_still_under_a_stationary_receiver():
    # the audit's ratchet: a guard fed stationary noise let theta1 climb from 0.0965 to 0.36-0.48 in 100 cycles.
    # Here the reward ignores the level (and drifts upwards, as training does): no level earns a raise.
    finals = [simulated_levels(lambda level, cycle, rng: 0.3 + 0.002 * cycle + rng.gauss(0, 0.05), seed)[-1]
              for seed in range(20)]
    assert max(finals) <= 2 and sum(finals) / len(finals) <= 0.5


def test_thresholds_rise_where_a_raise_pays_and_fall_when_the_gain_goes():
    pays = [simulated_levels(lambda level, cycle, rng: 0.3 + 0.05 * level + rng.gauss(0, 0.02), seed)
            for seed in range(10)]
    assert sum(levels[-1] >= 2 for levels in pays) >= 8
    # the same receiver whose gain reverses at cycle 100: the raises are undone
    turned = [simulated_levels(lambda level, cycle, rng: 0.3 + (0.05 if cycle < 100 else -0.05) * level
                               + rng.gauss(0, 0.02), seed, cycles=200) for seed in range(10)]
    risen = [levels for levels in turned if levels[99] >= 2]
    assert len(risen) >= 5 and all(levels[-1] < levels[99] for levels in risen)


def test_the_gain_is_measured_against_the_receivers_own_trend_by_hand():
    assert coevolution.trend_gain([0.1, 0.2], 0.5) is None                  # under 3 points: no trend
    assert coevolution.trend_gain([0.1, 0.2, 0.3], 0.4) == pytest.approx(0.0)
    assert coevolution.trend_gain([0.1, 0.2, 0.3], 0.5) == pytest.approx(0.1)
    assert coevolution.trend_gain([0.3, 0.3, 0.3, 0.3], 0.25) == pytest.approx(-0.05)


class ScriptedDraws:
    """The bandit's two draws (random.Random's random and choice), scripted: explore only when told, to the side
    told."""

    def __init__(self):
        self.explore, self.side = False, 1

    def random(self) -> float:
        return 0.0 if self.explore else 0.99

    def choice(self, options):
        return self.side


@pytest.mark.parametrize("side", [1, -1])
def test_a_tripped_guard_backs_the_context_off_one_level_below_what_was_played(side):
    bandit = coevolution.ThresholdBandit(coevolution.BanditConfig(step=0.05, epsilon=0.5), seed=0)
    bandit.rng = draws = ScriptedDraws()
    context = ("qwen", "llama", "similar")
    bandit.level[context] = 3
    for cycle in range(5):
        bandit.judge("llama", {"charts/reward_mean": 0.5, "charts/reward_std": 0.4 + 0.01 * (cycle % 2)})
        assert bandit.choose("qwen", "llama", gap=0.0) == 3
        bandit.updated("llama", STABLE)
    assert bandit.judge("llama", {"charts/reward_mean": 0.5, "charts/reward_std": 0.4}) == []
    draws.explore, draws.side = True, side
    assert bandit.choose("qwen", "llama", gap=0.0) == 3 + side                 # a neighbour of the current level
    bandit.updated("llama", dict(STABLE, **{"losses/grad_norm": 50.0}))
    assert bandit.judge("llama", {"charts/reward_mean": 0.5, "charts/reward_std": 0.4}) == ["losses/grad_norm"]
    draws.explore = False
    assert bandit.level[context] == 3 + side - 1 and bandit.choose("qwen", "llama", gap=0.0) == 3 + side - 1
    assert bandit.choose("qwen", "llama", gap=0.5) == 0                      # another context starts at level 0


def test_the_guard_judges_a_cycle_on_its_update_kl_and_on_the_rollouts_that_update_produced():
    bandit = coevolution.ThresholdBandit(coevolution.BanditConfig(step=0.05, epsilon=0.0), seed=0)
    rewards = {"charts/reward_mean": 0.5, "charts/reward_std": 0.4}
    assert bandit.judge("llama", rewards) is None                             # no update yet: nothing to judge
    for cycle in range(5):
        bandit.choose("qwen", "llama", gap=0.0)
        bandit.updated("llama", dict(STABLE, **{"losses/update_kl": 1e-3 * (1 + 0.1 * (cycle % 2))}))
        assert bandit.judge("llama", dict(rewards, **{"charts/reward_std": 0.4 + 0.01 * (cycle % 2)})) == []
    bandit.choose("qwen", "llama", gap=0.0)
    bandit.updated("llama", dict(STABLE, **{"losses/update_kl": 0.05}))     # with beta = 0 the KL penalty reads 0
    assert bandit.judge("llama", rewards) == ["losses/update_kl"]
    bandit.choose("qwen", "llama", gap=0.0)
    bandit.updated("llama", STABLE)
    assert bandit.judge("llama", dict(rewards, **{"charts/reward_std": 0.9})) == ["charts/reward_std"]
    with pytest.raises(ValueError, match="update_kl"):
        coevolution.StabilityGuard(10, 3.0).check({"charts/reward_std": 0.4, "losses/grad_norm": 1.0})


def test_the_stability_guard_trips_only_outside_a_signals_own_range():
    guard = coevolution.StabilityGuard(window=10, z=3.0)
    steady = {"charts/reward_std": 0.4, "losses/update_kl": 1e-3}
    for value in (1.0, 1.1, 0.9, 1.05):
        assert guard.check({**steady, "losses/grad_norm": value}) == []
    assert guard.check({**steady, "losses/grad_norm": 1.2}) == []
    assert guard.check({**steady, "losses/grad_norm": 0.01}) == []             # one-sided: a calm cycle is stable
    assert guard.check({**steady, "losses/grad_norm": 5.0}) == ["losses/grad_norm"]
    assert guard.check({**steady, "losses/grad_norm": float("nan")}) == ["losses/grad_norm"]


def test_the_predictor_skips_nothing_for_a_receiver_it_was_not_audited_on():
    cfg = coevolution.PredictorConfig(min_history=4, min_audits=3, confidence=0.0, trust=0.5, audit=0.0)
    predictor = coevolution.FidelityPredictor(2, cfg, seed=0)
    predictor.learn(torch.rand(8, 2, dtype=torch.float64), torch.tensor([0, 1] * 4))
    assert predictor.may_skip("llama", 0.99) == (True, False)                # history, but no audit yet
    for correct in (True, True):
        predictor.audited("llama", correct)
    assert predictor.may_skip("llama", 0.99) == (True, False)                # 2 audits of the 3 it needs
    predictor.audited("llama", True)
    assert predictor.may_skip("llama", 0.99) == (True, True)
    assert predictor.may_skip("qwen", 0.99) == (True, False)                 # trust is per receiver
    for correct in (False, False, False, False):
        predictor.audited("llama", correct)
    assert predictor.may_skip("llama", 0.99) == (True, False)                # 3 of 7 right: below trust 1/2
    assert predictor.accuracy("llama") == pytest.approx(3 / 7) and math.isnan(predictor.accuracy("qwen"))


def test_the_predictor_learns_separable_bands_and_skips_only_sure_trusted_unaudited_ones():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(90, 1, generator=gen, dtype=torch.float64) * 2 - 1                   # one feature in [-1, 1)
    band = torch.bucketize(x[:, 0], torch.tensor([-1 / 3, 1 / 3], dtype=torch.float64))  # thirds: 0, 1, 2
    cfg = coevolution.PredictorConfig(min_history=64, min_audits=3, confidence=0.9, trust=0.5, audit=0.5)
    predictor = coevolution.FidelityPredictor(1, cfg, seed=0)
    predictor.learn(x, band)
    probe = torch.tensor([[-0.9], [0.0], [0.9]], dtype=torch.float64)
    predicted, prob = predictor.predict(probe)
    assert predicted.tolist() == [0, 1, 2] and prob[0] > 0.9 and prob[2] > 0.9
    for _ in range(3):
        predictor.audited("llama", True)
    assert predictor.may_skip("llama", 0.5) == (False, False)                  # unsure: diagnosed, not audited
    skips = [predictor.may_skip("llama", 0.95) for _ in range(2000)]
    assert all(sure for sure, _ in skips)
    assert sum(skip for _, skip in skips) / len(skips) == pytest.approx(0.5, abs=0.05)   # half drawn for audit


def test_the_predictor_refuses_nan_features():
    predictor = coevolution.FidelityPredictor(2, coevolution.PredictorConfig(), seed=0)
    with pytest.raises(ValueError, match="NaN"):
        predictor.learn(torch.tensor([[0.0, math.nan]]), torch.tensor([0]))
    assert len(predictor.y) == 0
