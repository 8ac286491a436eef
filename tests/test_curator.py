"""The curator (proposal §2.1-2.2) against hand-computed examples and properties on random diagnoses: D, admission
and its random control, the repairs' order, the offers' terms and features, the predictor's audit, a checkpoint's
state. Its exchange between tiny policies and cross-fidelity runs are tests/test_curator_exchange.py's, the scales
and thresholds tests/test_term_scales.py's, co-evolution and the predictor tests/test_coevolution.py's."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import coevolution
import curator
import diagnosis
import sharing
import term_scales
from test_term_scales import random_calibration


def test_degradation_by_hand_and_an_ablated_term_keeps_the_other_weights():
    cfg = diagnosis.CuratorConfig(lambdas=(0.5, 0.3, 0.2), theta1=0.1, theta2=0.2)
    assert curator.degradation(torch.tensor([0.2, 0.5, 1.0], dtype=torch.float64), cfg.weights) == pytest.approx(
        0.5 * 0.2 + 0.3 * 0.5 + 0.2 * 1.0)
    ablated = diagnosis.CuratorConfig(lambdas=(0.5, 0.3, 0.2), ablate=("ccm",), theta1=0.1, theta2=0.2)
    torch.testing.assert_close(ablated.weights, torch.tensor([0.5, 0.0, 0.2], dtype=torch.float64))
    for bad in (dict(lambdas=(0.5, 0.5, 0.5)), dict(ablate=("tbd", "ccm", "rsd")), dict(ablate=("kl",)),
                dict(theta1=0.5, theta2=0.4), dict(process_signal="oracle"),
                dict(process_signal="intrinsic", ablate=("ccm",)), dict(admission="oracle")):
        with pytest.raises(ValueError):
            diagnosis.CuratorConfig(**dict(dict(theta1=0.1, theta2=0.2), **bad))
    with pytest.raises(ValueError, match="both"):
        diagnosis.CuratorConfig(theta1=0.1)
    with pytest.raises(ValueError, match="calibration"):
        diagnosis.CuratorConfig(calibration="none")             # raw terms and no thresholds: nothing to admit on
    for bad in (dict(calibration="results/calibration.json"), dict(calibration_window=0)):
        with pytest.raises(ValueError, match="calibration"):
            diagnosis.CuratorConfig(**bad)


diagnoses = st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 1), min_size=k, max_size=k),
    st.lists(st.one_of(st.none(), st.floats(0, 0.999)), min_size=k, max_size=k),
    st.lists(st.floats(1e-3, 1), min_size=k, max_size=k)))


def make_diagnosis(values) -> diagnosis.Diagnosis:
    tbd, rsd, reach = values
    return diagnosis.Diagnosis(torch.tensor(tbd, dtype=torch.float64),
                               torch.tensor([math.nan if r is None else r for r in rsd], dtype=torch.float64),
                               torch.tensor(reach, dtype=torch.float64), torch.ones(len(reach)))


class FakeOffer:
    def __init__(self, diag):
        self.diagnosis = diag


def worse(values, rng: random.Random, term: str):
    """The same diagnosis made worse on one term, step by step (each step's value moved toward degradation)."""
    tbd, rsd, reach = (list(v) for v in values)
    for k in range(len(tbd)):
        u = rng.random()
        if term == "tbd":
            tbd[k] += u * (1 - tbd[k])
        elif term == "ccm":
            reach[k] = max(reach[k] * (1 - u), 1e-3)
        elif rsd[k] is not None:
            rsd[k] += u * (0.999 - rsd[k])
    return tbd, rsd, reach


@settings(max_examples=200, deadline=None)
@given(diagnoses, st.sampled_from(diagnosis.TERMS), st.integers(0, 2 ** 20), st.floats(0.0, 0.6),
       st.floats(0.0, 0.4), st.sampled_from([(), ("tbd",), ("ccm",), ("rsd",)]), st.booleans())
def test_a_trajectory_worse_on_any_term_never_gets_a_finer_level(values, term, seed, theta1, width, ablate, scaled):
    cfg = diagnosis.CuratorConfig(ablate=ablate, theta1=theta1, theta2=theta1 + width)
    theta, calibration = (cfg.theta1, cfg.theta2), random_calibration(seed % 7) if scaled else None
    better = curator.score(FakeOffer(make_diagnosis(values)), cfg, theta, calibration)
    degraded = curator.score(FakeOffer(make_diagnosis(worse(values, random.Random(seed), term))), cfg, theta,
                             calibration)
    assert degraded.band >= better.band and degraded.D >= better.D - 1e-12


def test_every_term_moves_d_over_its_whole_range_by_hand():
    # one step; the audit's saturations: TBD 0 -> 1 left D_repaired unchanged, and CCM stopped counting below
    # R = 1/2. On the diagnosed, scaled D each strictly raises D, and R = 0.5 -> 0.01 crosses a band.
    calibration = random_calibration(0)
    cfg = diagnosis.CuratorConfig(theta1=0.3, theta2=0.45)

    def d(tbd, rsd, reach):
        return curator.score(FakeOffer(make_diagnosis(([tbd], [rsd], [reach]))), cfg, cfg_theta, calibration)
    cfg_theta = (cfg.theta1, cfg.theta2)
    assert d(0.0, 0.5, 0.8).D < d(0.5, 0.5, 0.8).D < d(1.0, 0.5, 0.8).D
    assert d(0.0, 0.5, 0.99).D < d(0.0, 0.5, 0.5).D < d(0.0, 0.5, 0.2).D < d(0.0, 0.5, 0.01).D
    assert d(0.0, 0.2, 0.8).D < d(0.0, 0.6, 0.8).D < d(0.0, 0.95, 0.8).D
    assert d(0.0, 0.5, 0.5).band < d(0.0, 0.5, 0.01).band
    # TBD 0 scales to the middle of the calibration's point mass at 0, counted by hand
    at_zero = sum(tbd == 0 for tbd, _, _ in calibration.terms) / len(calibration.terms)
    assert d(0.0, 0.0, 1.0).scaled["tbd"] == pytest.approx(at_zero / 2, abs=0.01)


@settings(max_examples=50, deadline=None)
@given(diagnoses, st.sampled_from([(), ("ccm",), ("rsd",)]), st.integers(0, 6))
def test_dropping_a_term_constant_on_the_calibration_changes_no_decision(values, other, seed):
    # TBD is 0 on every calibration offer and every step, as between Qwen2 and Llama-3 in line steps: it adds
    # nothing to D, and each ablation's own thresholds are the same
    _, rsd, reach = values
    zero = ([0.0] * len(reach), rsd, reach)
    base = random_calibration(seed)
    calibration = term_scales.Calibration(tuple((0.0, c, r) for _, c, r in base.terms))
    decisions = []
    for ablate in (other, ("tbd", *other)):
        weights = diagnosis.CuratorConfig(ablate=ablate, theta1=0.0, theta2=0.0).weights
        theta = calibration.thresholds(weights)
        cfg = diagnosis.CuratorConfig(ablate=ablate, theta1=theta[0], theta2=theta[1])
        decisions.append(curator.score(FakeOffer(make_diagnosis(zero)), cfg, theta, calibration))
    kept, dropped = decisions
    assert dropped.band == kept.band and dropped.D == pytest.approx(kept.D)


def test_the_dominant_term_is_the_largest_weighted_one_by_hand():
    # TBD 0.5, CCM 1 - 0.1 = 0.9, RSD 0 under weights (0.6, 0.2, 0.2): weighted 0.30, 0.18, 0, so TBD dominates
    # though CCM is the largest term; D = 0.48 lands in XGRPO between 0.3 and 0.6
    cfg = diagnosis.CuratorConfig(lambdas=(0.6, 0.2, 0.2))
    scored = curator.score(FakeOffer(make_diagnosis(([0.5], [0.0], [0.1]))), cfg, (0.3, 0.6), None)
    assert (scored.dominant, scored.band) == ("tbd", 1) and scored.D == pytest.approx(0.48)
    equal = curator.score(FakeOffer(make_diagnosis(([0.5], [0.0], [0.1]))), diagnosis.CuratorConfig(), (0.3, 0.6), None)
    assert equal.dominant == "ccm"


def test_only_the_sure_predictions_that_could_skip_are_audited(monkeypatch):
    # the trust lets a prediction skip, so it is measured on those that can: one whose tokens would cross (PRP
    # with A != 0, a rescue at any band) is diagnosed whatever it predicts, and its accuracy vouches for nothing
    from types import SimpleNamespace as Offer
    cur = curator.Curator(diagnosis.CuratorConfig(), ["qwen", "llama"], 0, None, coevolution.PredictorConfig())
    receiver = Offer(policy=Offer(name="llama"), rewards=torch.tensor([[0.0, 0.0], [1.0, 0.0]]))   # prompt 0 failed
    qwen = Offer(policy=Offer(name="qwen"))
    offers = [Offer(source=qwen, prompt_index=1, reward=1.0, advantage=0.5),     # PRP with A != 0: crosses
              Offer(source=qwen, prompt_index=1, reward=1.0, advantage=0.0),     # PRP with A = 0: could skip
              Offer(source=qwen, prompt_index=1, reward=0.0, advantage=-0.5),    # SGT, no rescue: could skip
              Offer(source=qwen, prompt_index=0, reward=1.0, advantage=0.5)]     # SGT, a rescue: crosses
    predicted = torch.tensor([0, 0, 2, 2])
    monkeypatch.setattr(diagnosis, "offer_features", lambda *_: torch.zeros(len(diagnosis.FEATURES)))
    monkeypatch.setattr(cur.predictor, "predict", lambda x: (predicted, torch.ones(len(x))))
    monkeypatch.setattr(cur.predictor, "may_skip", lambda receiver, prob: (True, False))    # sure, not yet trusted
    monkeypatch.setattr(cur.predictor, "learn", lambda x, y: None)
    share = sharing.ShareConfig("cross-fidelity", temperature=1.0)
    features, _, _, auditable, skipped = cur._predict(receiver, offers, [False] * 4, {"qwen": 0.0}, share)
    assert auditable == [False, True, True, False] and skipped == [False] * 4
    # the diagnosis's bands: the crossing predictions right, offer 1's right, offer 2's wrong
    cur._fit_predictor("llama", features, predicted, auditable, [Offer(band=b) for b in (0, 0, 1, 2)], [0, 1, 2, 3])
    assert list(cur.predictor.audits["llama"]) == [True, False]


def test_a_curator_checkpointed_under_its_attributes_earlier_names_resumes():
    import pickle
    cur = curator.Curator(diagnosis.CuratorConfig(), ["qwen2", "llama"], 0, None, None)
    cur.level0_thresholds["llama"] = (0.1, 0.2)
    assert pickle.loads(pickle.dumps(cur)).level0_thresholds == {"llama": (0.1, 0.2)}
    state = dict(cur.__dict__, base=cur.level0_thresholds, recent=cur.recent_d_ccm)
    del state["level0_thresholds"], state["recent_d_ccm"]
    old = curator.Curator.__new__(curator.Curator)
    old.__setstate__(state)
    assert old.level0_thresholds == {"llama": (0.1, 0.2)} and old.recent_d_ccm == cur.recent_d_ccm
    assert not hasattr(old, "base") and not hasattr(old, "recent")
