"""Each term on one scale and the thresholds by shares (proposal §2.1, term_scales.py), by hand and on random
calibration samples; the calibration sample is the receiver's last window and each ablation sets its own thresholds."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import curator
import diagnosis
import term_scales


def random_calibration(seed: int, n: int = 200) -> term_scales.Calibration:
    """A calibration of n offers with terms spread over [0, 1] as on a real run: TBD mostly 0, CCM and RSD
    skewed."""
    g = torch.Generator().manual_seed(seed)
    tbd = torch.where(torch.rand(n, generator=g) < 0.6, 0.0, torch.rand(n, generator=g))
    rows = torch.stack([tbd, torch.rand(n, generator=g) ** 2, torch.rand(n, generator=g) ** 0.5], dim=1)
    return term_scales.Calibration(tuple(tuple(r) for r in rows.double().tolist()))


def test_admission_boundaries_on_hand_made_degradations():
    bands = [term_scales.admission_band(d, 0.2, 0.35) for d in (0.0, 0.1999, 0.2, 0.3499, 0.35, 1.0)]
    assert bands == [0, 0, 1, 1, 2, 2]
    assert term_scales.admission_band(0.2, 0.2, 0.2) == 2          # an empty XGRPO band
    with pytest.raises(ValueError, match="degradation"):
        term_scales.admission_band(float("nan"), 0.2, 0.35)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=30, max_size=300, unique=True),
       st.floats(0.0, 0.6), st.floats(0.0, 0.4))
def test_thresholds_by_shares_admit_each_level_its_share_counted_by_hand(values, prp, xgrpo):
    theta1, theta2 = term_scales.share_thresholds(values, (prp, xgrpo))
    n = len(values)
    bands = [curator.admission_band(v, theta1, theta2) for v in values]
    assert abs(bands.count(0) / n - prp) <= 1.5 / n
    assert abs(bands.count(1) / n - xgrpo) <= 2.5 / n
    assert term_scales.share_thresholds([0.1], (prp, xgrpo)) == (0.1, 0.1)      # alone: SGT, the cautious level
    with pytest.raises(ValueError, match="one diagnosed"):
        term_scales.share_thresholds([math.nan], (prp, xgrpo))


def test_a_value_many_offers_hold_goes_whole_to_the_band_its_middle_lies_in_by_hand():
    # 4 of 10 offers at D = 0 (every step in reach, the other terms constant): the third's quantile falls on them,
    # and their middle, 2 of 10, lies in PRP's third; the quantile at two thirds falls between 0.3's neighbours
    values = [0.0] * 4 + [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    theta1, theta2 = term_scales.share_thresholds(values)
    assert (theta1, theta2) == pytest.approx((0.05, 0.3))
    assert [curator.admission_band(v, theta1, theta2) for v in values] == [0] * 4 + [1, 1, 2, 2, 2, 2]
    # the mass's middle in the second third: XGRPO; one value for all: its middle halfway, XGRPO for every offer
    values = [0.1, 0.2] + [0.3] * 6 + [0.4, 0.5]
    thetas = term_scales.share_thresholds(values)
    assert [curator.admission_band(v, *thetas) for v in values] == [0, 0] + [1] * 6 + [2, 2]
    assert {curator.admission_band(0.5, *term_scales.share_thresholds([0.5] * 7))} == {1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9]), min_size=2, max_size=60), st.floats(0.0, 0.6),
       st.floats(0.0, 0.4))
def test_every_value_several_offers_hold_lies_whole_in_the_band_of_its_middle(values, prp, xgrpo):
    theta1, theta2 = term_scales.share_thresholds(values, (prp, xgrpo))
    ordered, n = sorted(values), len(values)
    for v in set(values):
        lo, hi = ordered.index(v), n - ordered[::-1].index(v)                  # ordered[lo:hi] are v
        if hi - lo >= 2:                                                       # its middle, in offers
            middle = (lo + hi) / 2
            assert curator.admission_band(v, theta1, theta2) == (middle >= prp * n) + (middle >= (prp + xgrpo) * n)


def test_a_term_scale_is_the_mid_rank_cdf_of_the_calibration_by_hand():
    scale = term_scales.TermScale.fit([0.0] * 6 + [0.2, 0.4, 0.6, 0.8])
    # 6 of 10 at 0, order statistics 0..5 of 0..9: 0 scales to the middle of their percentiles, 2.5/9; above it,
    # linear between the calibration's percentiles
    assert scale(0.0) == pytest.approx(2.5 / 9, abs=0.005) and scale(-1.0) == scale(0.0)
    assert scale(0.8) == 1.0 and scale(5.0) == 1.0
    assert scale(0.4) == pytest.approx(7 / 9) and scale(0.5) == pytest.approx(7.5 / 9)   # 0.4: order statistic 7
    assert term_scales.TermScale.fit([0.0] * 5)(0.7) == 0.7      # a term that never varied enters raw
    with pytest.raises(ValueError, match="finite"):
        term_scales.TermScale.fit([math.nan])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1000))
def test_scaled_calibration_terms_are_uniform_and_the_thresholds_split_them_in_thirds(seed):
    calibration = random_calibration(seed, n=300)
    scaled = torch.stack([calibration.scaled(torch.tensor(r, dtype=torch.float64)) for r in calibration.terms])
    for i in (1, 2):                                           # continuous terms: uniform on [0, 1]
        assert abs(scaled[:, i].mean().item() - 0.5) < 0.03 and scaled[:, i].min() < 0.02 and scaled[:, i].max() > 0.98
    for weights in ([1 / 3, 1 / 3, 1 / 3], [0.0, 1 / 3, 1 / 3], [1 / 3, 0.0, 1 / 3]):
        w = torch.tensor(weights, dtype=torch.float64)
        theta = calibration.thresholds(w)
        bands = [curator.admission_band(d, *theta) for d in (scaled @ w).tolist()]
        assert all(abs(bands.count(b) / len(bands) - 1 / 3) < 0.02 for b in range(3))


def shifted_terms(seed: int, n: int, rsd_shift: float) -> list[torch.Tensor]:
    """n offers' raw terms [3]: TBD 0 (Qwen2 and Llama-3 in line steps), CCM skewed, RSD in [0.3, 0.7] moved by
    rsd_shift."""
    g = torch.Generator().manual_seed(seed)
    ccm, rsd = torch.rand(n, generator=g) ** 2, (0.3 + 0.4 * torch.rand(n, generator=g) + rsd_shift).clamp(0, 1)
    return [torch.tensor([0.0, c, r], dtype=torch.float64) for c, r in zip(ccm.tolist(), rsd.tolist())]


def test_the_calibration_sample_is_the_receivers_last_window_and_follows_the_runs_own_terms():
    # a scale fitted once does not transfer: on a fresh seed RSD ran 0.10-0.27 against 0.32-0.64 on the
    # calibration run, and the offers piled into one band. The window's scales follow the terms.
    cfg = diagnosis.CuratorConfig(calibration_window=3)
    cur = curator.Curator(cfg, ["qwen", "llama"], 0, None, None)
    before = [shifted_terms(it, 60, 0.0) for it in range(2)]
    after = [shifted_terms(10 + it, 60, -0.3) for it in range(3)]
    for rows in before + after:
        scales = cur.calibrate("llama", rows)
    # llama's last 3 iterations only
    assert "qwen" not in cur.level0_thresholds and len(scales.terms) == 3 * 60
    sample = [r for rows in after for r in rows]
    assert sorted(scales.terms) == sorted(tuple(r.tolist()) for r in sample)
    # each scaled term is its mid-rank among the sample's values, counted by hand (up to the percentile grid)
    for row in after[-1][:10]:
        for i in (1, 2):
            values, v = [r[i].item() for r in sample], row[i].item()
            below = sum(u < v for u in values) + 0.5 * sum(u == v for u in values)
            assert scales.scaled(row)[i].item() == pytest.approx(below / len(values), abs=0.02)

    def shares(calibration, theta, rows):
        bands = [curator.admission_band(curator.degradation(calibration.scaled(r), cfg.weights), *theta) for r in rows]
        return [bands.count(b) / len(bands) for b in range(3)]
    assert all(abs(s - 1 / 3) < 0.12 for s in shares(scales, cur.level0_thresholds["llama"], after[-1]))
    # the degenerate design it replaces: scales and thresholds fitted before the shift put the offers in one band
    fixed = term_scales.Calibration(tuple(tuple(r.tolist()) for rows in before for r in rows))
    assert max(shares(fixed, fixed.thresholds(cfg.weights), after[-1])) >= 0.75


@pytest.mark.parametrize("ablate", [(), ("ccm",), ("rsd",)])
def test_each_ablation_sets_its_own_thresholds_on_the_sample_and_fixed_thresholds_stay_given(ablate):
    cfg = diagnosis.CuratorConfig(ablate=ablate)
    cur = curator.Curator(cfg, ["qwen", "llama"], 0, None, None)
    mask = torch.tensor([t in ablate for t in diagnosis.TERMS])
    rows = [torch.where(mask, torch.full_like(r, math.nan), r) for r in shifted_terms(1, 300, 0.0)]
    scales = cur.calibrate("llama", rows)
    # an ablated term stays NaN, a measured one is scaled to a number
    assert all(scales.scaled(r)[mask].isnan().all() and not scales.scaled(r)[~mask].isnan().any() for r in rows[:5])
    d = [curator.degradation(scales.scaled(r), cfg.weights) for r in rows]
    bands = [curator.admission_band(v, *cur.level0_thresholds["llama"]) for v in d]
    assert all(abs(bands.count(b) / len(bands) - 1 / 3) < 0.02 for b in range(3))
    given = curator.Curator(diagnosis.CuratorConfig(ablate=ablate, theta1=0.2, theta2=0.4), ["llama"], 0, None, None)
    given.calibrate("llama", rows)
    assert given.level0_thresholds["llama"] == (0.2, 0.4)
    raw = curator.Curator(diagnosis.CuratorConfig(calibration="none", theta1=0.2, theta2=0.4), ["llama"], 0, None, None)
    assert raw.calibrate("llama", rows) is None and raw.level0_thresholds["llama"] == (0.2, 0.4)
