"""The power analysis' statistics (benchmarks/power.py; its t quantile in analysis/stats.py, the area under a curve in
analysis/curves.py) against tables and hand-computed cases."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import power  # noqa: E402
from analysis import curves, stats  # noqa: E402


@pytest.mark.parametrize("p, dof, table", [(0.975, 1, 12.706), (0.975, 5, 2.571), (0.975, 9, 2.262),
                                           (0.975, 30, 2.042), (0.95, 10, 1.812), (0.995, 4, 4.604)])
def test_t_quantiles_match_the_printed_table(p, dof, table):
    assert stats.t_quantile(p, dof) == pytest.approx(table, abs=2e-3)


@pytest.mark.parametrize("sd", [0.005, 0.03, 0.13])
def test_the_seeds_needed_are_the_fewest_that_reach_the_half_width(sd):
    n = power.seeds_needed(sd, target=0.02)
    assert power.half_width(sd, n) <= 0.02
    assert n == 2 or power.half_width(sd, n - 1) > 0.02


def test_paired_summary_and_the_area_under_a_curve_by_hand():
    summary = power.paired_summary([0.1, -0.1, 0.3])
    assert summary["mean"] == pytest.approx(0.1) and summary["sd"] == pytest.approx(0.2)
    assert summary["half_width_95"] == pytest.approx(4.303 * 0.2 / 3 ** 0.5, abs=1e-3)
    curve = [(0, 0.0), (10, 0.2), (20, 0.2), (40, 0.6)]
    # trapezoids: 10 * 0.1 + 10 * 0.2 + 20 * 0.4 = 11, over 40 iterations
    assert curves.area_under(curve, 40) == pytest.approx(11 / 40)
    assert curves.area_under(curve, 20) == pytest.approx(3 / 20)
    # cut at 30 between the evaluations at 20 and 40, where the line reads 0.4: 1 + 2 + 10 * 0.3 = 6, over 30
    assert curves.area_under(curve, 30) == pytest.approx(6 / 30)
    for end in (50, 0):
        with pytest.raises(ValueError, match="evaluations"):
            curves.area_under(curve, end)
    with pytest.raises(ValueError, match="evaluations"):
        curves.area_under(curve[1:], 20)                                   # no evaluation at 0
    with pytest.raises(ValueError, match="no evaluation"):
        power.accuracy_at(curve, 30)
