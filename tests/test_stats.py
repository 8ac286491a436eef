"""analysis/stats.py against independent references: the exact sign-flip p against a naive enumeration of signs,
Fieller's interval against the ratios a paired t test keeps on a grid, Holm, the bootstrap, the t interval and the
chi-square quantiles by hand or from the printed tables."""

import itertools
import math

import numpy as np
import pytest

from analysis import stats


def test_the_bootstrap_interval_and_p_value_by_hand():
    # every resample of [1, 1, 1] has mean 1
    means = stats.bootstrap_means([1.0, 1.0, 1.0], 1000, 0)
    assert stats.percentile_interval(means, 0.95) == (1.0, 1.0) and stats.bootstrap_p(means) == 0.0
    # [0, 1]: resampled means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4; the 95% interval is [0, 1] and the
    # p-value twice P(mean <= 0) = 1/2
    means = stats.bootstrap_means([0.0, 1.0], 100_000, 0)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0} and (means == 0.5).mean() == pytest.approx(0.5, abs=0.01)
    assert stats.percentile_interval(means, 0.95) == (0.0, 1.0)
    assert stats.percentile_interval(means, 0.4) == (0.5, 0.5)
    assert stats.bootstrap_p(means) == pytest.approx(0.5, abs=0.01)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 tested at 0.05/3, 0.05/2, 0.05: the first rejected, the second not (0.03 > 0.025),
    # so neither is the third; adjusted 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 0.04)
    adjusted, levels, rejected = stats.holm([0.01, 0.04, 0.03], 0.05)
    assert adjusted == pytest.approx([0.03, 0.06, 0.06]) and levels == pytest.approx([0.05 / 3, 0.05, 0.025])
    assert rejected == [True, False, False]
    assert stats.holm([0.001, 0.01, 0.04], 0.05)[2] == [True, True, True]
    assert stats.holm([0.9, 0.8], 0.05)[0] == [1.0, 1.0]


@pytest.mark.parametrize("p, dof, table", [(0.2, 1, 0.0642), (0.2, 5, 2.343), (0.2, 7, 3.822), (0.2, 10, 6.179),
                                           (0.95, 7, 14.067), (0.05, 20, 10.851)])
def test_chi_square_quantiles_match_the_printed_table(p, dof, table):
    assert stats.chi2_quantile(p, dof) == pytest.approx(table, abs=2e-3)


@pytest.mark.parametrize("differences", [[1.0, 2.0, 3.0], [0.85, 0.1, -0.2, 1.3, 2.0, 0.4], [0.5, -0.5],
                                         [1.0, -1.0, 2.0, -2.0, 0.3, 0.7, -0.1]])
def test_the_sign_flip_p_value_equals_a_naive_enumeration_of_signs(differences):
    sums = [abs(sum(s * d for s, d in zip(signs, differences)))
            for signs in itertools.product((1, -1), repeat=len(differences))]
    observed = abs(sum(differences))
    naive = sum(total >= observed - 1e-9 for total in sums) / len(sums)
    assert stats.sign_flip_p(differences) == pytest.approx(naive)


@pytest.mark.parametrize("differences", [[1.0, 2.0, 3.0], [0.85, 0.1, -0.2, 1.3, 2.0, 0.4], [-0.5, 0.2, -1.0]])
def test_the_one_sided_sign_flip_p_value_equals_a_naive_enumeration_of_signs(differences):
    sums = [sum(s * d for s, d in zip(signs, differences))
            for signs in itertools.product((1, -1), repeat=len(differences))]
    naive = sum(total >= sum(differences) - 1e-9 for total in sums) / len(sums)
    assert stats.sign_flip_p(differences, alternative="greater") == pytest.approx(naive)


@pytest.mark.parametrize("numerators, denominators", [
    ([2.0, 3.0, 1.5, 2.5, 4.0], [3.0, 3.5, 2.0, 4.0, 5.5]), ([1.0, -0.5, 2.0, 0.3], [2.0, 1.0, 3.5, 1.2]),
    ([0.4, 2.2, -1.0, 1.1, 0.9, 3.0], [1.0, 2.5, 0.1, 2.0, 0.8, 3.1])])
def test_fiellers_interval_is_the_set_of_ratios_the_paired_t_test_keeps_by_a_grid(numerators, denominators):
    # by definition: r is in the interval where the paired t test of numerator - r denominator does not reject 0
    n, t = len(numerators), stats.t_quantile(0.975, len(numerators) - 1)

    def kept(r):
        d = [x - r * y for x, y in zip(numerators, denominators)]
        mean = sum(d) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
        return abs(mean) <= t * sd / math.sqrt(n)
    low, high = stats.fieller_interval(numerators, denominators, 0.95)
    grid = [k / 1000 for k in range(-20000, 20001)]
    inside = [r for r in grid if kept(r)]
    assert low == pytest.approx(min(inside), abs=2e-3) and high == pytest.approx(max(inside), abs=2e-3)
    ratio = sum(numerators) / sum(denominators)
    assert low < ratio < high


def test_fiellers_interval_is_unbounded_where_the_denominator_is_not_told_from_0():
    # denominators -1, 1, 0.5, -0.2: their mean 0.075 lies well within t * SE of 0, so every large r is kept
    assert stats.fieller_interval([1.0, 2.0, 1.5, 0.5], [-1.0, 1.0, 0.5, -0.2], 0.95) == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="two or more pairs"):
        stats.fieller_interval([1.0], [2.0], 0.95)


def test_the_t_interval_by_hand():
    # 1, 2, 3: mean 2, SD 1, t(0.975, 2) = 4.303 from the printed table
    assert stats.t_interval([1.0, 2.0, 3.0], 0.95) == pytest.approx((2 - 4.303 / math.sqrt(3),
                                                                     2 + 4.303 / math.sqrt(3)), abs=1e-3)


def test_beyond_twenty_differences_the_sign_flip_p_value_is_drawn_and_never_0():
    assert 0 < stats.sign_flip_p([1.0] * 25) < 1e-5           # drawn: (hits + 1) / (2^20 + 1), 2 / 2^25 exactly
    assert stats.sign_flip_p([1.0, -1.0] * 11) == 1.0          # every assignment as far out as the observed 0
    assert stats.p_text(0.0312) == "0.031" and stats.p_text(3e-7) == "< 0.001"
