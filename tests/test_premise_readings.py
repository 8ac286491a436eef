"""Issue 67's readings of the gate and the offers (analysis/premise_readings.py): descriptive, each against scipy, a
naive enumeration or a hand count."""

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats as scipy_stats

from analysis import premise_readings as readings



def hand_gate() -> dict:
    """A gate file of 8 offers to receivers a and b: 6 lookaheads below 0, one at 0, one above; the chosen rung's
    top-decile move -0.05 at a standard error of 0.01 (-5 of them)."""
    return {"receivers": ["a", "b", "a", "b", "a", "b", "a", "b"],
            "tries": [{"lr": 0.03, "ladder": {"0.01": {"mean": 0.0, "se": 1.0}, "0.03": {"mean": -0.05, "se": 0.01}},
                       "rank": {"value": 0.5, "low": 0.1, "high": 0.9, "p": 0.01},
                       "U": [-4.0, -3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 4.0],
                       "lookahead": [-0.04, -0.02, -0.03, 0.0, -0.01, 0.02, -0.03, -0.05]}]}


def test_the_gates_readings_by_receiver_by_step_size_and_among_positive_u():
    got = readings.gate_readings(hand_gate(), random.Random(0))
    u, look = np.array(hand_gate()["tries"][0]["U"]), np.array(hand_gate()["tries"][0]["lookahead"])
    rho = lambda x, y: scipy_stats.spearmanr(x, y).statistic  # noqa: E731
    assert got["per_receiver"]["a"]["value"] == pytest.approx(rho(u[::2], look[::2]))
    assert got["per_receiver"]["b"]["value"] == pytest.approx(rho(u[1::2], look[1::2]))
    assert got["per_receiver"]["a"]["offers"] == 4 and got["pooled"]["value"] == 0.5        # the registered one
    assert got["minus_abs_U"]["value"] == pytest.approx(rho(-abs(u), look))
    assert got["U_positive"]["offers"] == 4 and got["U_positive"]["value"] == pytest.approx(rho(u[4:], look[4:]))
    assert (got["lowered"], got["unchanged"], got["raised"]) == (6, 1, 1)
    assert got["top_decile_in_se"] == pytest.approx(-5) and got["lr"] == 0.03


def test_the_offer_bootstrap_of_rho_is_every_ordered_draw_of_the_offers():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    got = readings.offer_rho(x, y, random.Random(0))
    draws = []                                   # the 3,125 ordered draws, alike; a constant draw has no rho
    for picked in itertools.product(range(5), repeat=5):
        xs, ys = [x[k] for k in picked], [y[k] for k in picked]
        if len(set(xs)) > 1 and len(set(ys)) > 1:
            draws.append(scipy_stats.spearmanr(xs, ys).statistic)
    draws.sort()
    at = lambda q: draws[math.ceil(q * len(draws) - 1e-9) - 1]  # noqa: E731  the smallest reaching q of the weight
    assert got["value"] == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert got["low"] == pytest.approx(at(0.025)) and got["high"] == pytest.approx(at(0.975))


def reading_row(seed: int, stage: int, tbd: float, u: float, reward: float = 0.0) -> dict:
    return {"direction": "d", "seed": seed, "stage": stage, "terms": {"tbd": tbd}, "U_halves": [u, u],
            "reward": reward, "advantage": 1.0 if reward else -1.0}


def test_duplicates_are_rows_equal_in_every_field_within_a_cluster():
    row = reading_row(1, 10, 0.5, 0.1)
    rows = [row, dict(row), dict(row), {**row, "U_halves": [0.1, 0.2]}, {**row, "stage": 50}, {**row, "seed": 2}]
    assert readings.duplicates(rows) == {"offers": 6, "distinct": 4, "duplicates": 2, "seeds": 2, "clusters": 3}


def test_tbds_mode_and_its_rho_without_iteration_10_by_hand():
    assert readings.modal([0.5, 2 / 3, 0.0, 2 / 3]) == (2 / 3, 2)
    early = [reading_row(1, 10, 0.5, -1), reading_row(1, 10, 0.5, -2), reading_row(2, 10, 0.5, -1),
             reading_row(2, 10, 0.25, -3)]
    later = [reading_row(1, 50, 2 / 3, 0.1), reading_row(1, 50, 0.75, 0.2, 1.0), reading_row(1, 50, 2 / 3, 0.3),
             reading_row(2, 50, 2 / 3, 0.3), reading_row(2, 50, 0.75, 0.1, 1.0), reading_row(2, 50, 2 / 3, 0.2)]
    rows = early + later
    got = readings.tbd_readings(rows, [r["U_halves"][0] for r in rows], {"value": -0.9}, random.Random(0))
    assert (got["mode"], got["at_mode"], got["share_at_mode"]) == (2 / 3, 4, 0.4)
    assert (got["off_mode"], got["off_mode_early"], got["off_mode_unrewarded"]) == (6, 4, 4)
    assert got["rho_registered"] == {"value": -0.9}

    def rho(rs):
        return scipy_stats.spearmanr([r["terms"]["tbd"] for r in rs], [r["U_halves"][0] for r in rs]).statistic
    # two clusters resample to (1, 1), (1, 2), (2, 2) at 1/4, 1/2, 1/4; a cluster repeated has its own rho
    resampled = [rho(later[:3]), rho(later), rho(later[3:])]
    without = got["rho_without_early"]
    assert without["value"] == pytest.approx(rho(later)) and (without["clusters"], without["offers"]) == (2, 6)
    assert without["low"] == pytest.approx(min(resampled)) and without["high"] == pytest.approx(max(resampled))


def test_reward_against_the_advantage_and_an_interval_holding_zero():
    assert readings.reward_is_positive_advantage([{"reward": 1.0, "advantage": 0.4}, {"reward": 0.0, "advantage": 0}])
    assert not readings.reward_is_positive_advantage([{"reward": 1.0, "advantage": -0.1}])
    assert not readings.reward_is_positive_advantage([{"reward": 0.0, "advantage": 0.3}])
    assert readings.holds_zero({"low": -0.1, "high": 0.2}) and readings.holds_zero({"low": 0.0, "high": 0.2})
    assert not readings.holds_zero({"low": 0.01, "high": 0.2})
