"""Admission (admission.py): inert prompts, what each band lets cross by hand, the random control's shares, and the
ranked admission's share, order and refusal of what it leaves out, against hand-made cases and properties."""

import math
import random
from types import SimpleNamespace as Offer

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import admission
import diagnosis
import grpo
import sharing

EPS = 1e-4  # grpo.group_advantages' default


def test_inert_prompts_are_those_where_every_reward_is_one_value_by_hand():
    own = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    peer = torch.tensor([[0.0, 0.0],                       # all 0: inert
                         [1.0, 1.0],                       # all 1: inert
                         [0.0, 0.0],                       # the receiver's group is mixed
                         [0.0, 1.0],                       # a rescue beside a 0
                         [1.0, 1.0]])
    other = torch.tensor([[0.0], [1.0], [0.0], [0.0], [0.0]])   # a third policy's 0 on prompt 4
    assert admission.inert_prompts([own, peer]).tolist() == [True, True, False, False, True]
    assert admission.inert_prompts([own, peer, other]).tolist() == [True, True, False, False, False]
    # the rule's reason: pooling any of an inert prompt's rewards leaves the receiver's advantages at 0
    for b, extra in ((0, [0.0, 0.0]), (1, [1.0])):
        pooled = grpo.group_advantages(torch.cat([own[b], torch.tensor(extra)]).unsqueeze(0))
        assert (pooled == 0).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["qwen", "mistral"]), st.one_of(st.none(), st.integers(0, 2))),
                max_size=40), st.integers(0, 1000))
def test_random_admission_keeps_each_sources_band_shares_and_leaves_inert_offers(offers, seed):
    sources, bands = [s for s, _ in offers], [b for _, b in offers]
    permuted = admission.permuted_bands(bands, sources, random.Random(seed))
    for source in ("qwen", "mistral"):
        mine = [k for k, s in enumerate(sources) if s == source]
        assert sorted(b for k in mine if (b := bands[k]) is not None) == \
            sorted(b for k in mine if (b := permuted[k]) is not None)
    assert [b is None for b in permuted] == [b is None for b in bands]


def test_random_admission_moves_bands_between_offers_of_a_source_and_never_across_sources():
    # the identity keeps every share too: over seeds, each position of a source must take each of its bands
    bands, sources = [0, 1, 2] * 5 + [2, 2], ["qwen"] * 15 + ["mistral"] * 2
    seen = [set() for _ in bands]
    for seed in range(200):
        permuted = admission.permuted_bands(bands, sources, random.Random(seed))
        assert permuted[15:] == [2, 2]
        for k, b in enumerate(permuted):
            seen[k].add(b)
    assert all(s == {0, 1, 2} for s in seen[:15])


def test_admission_routes_each_band_by_hand():
    from types import SimpleNamespace as Offer
    own = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    receiver = Offer(rewards=own, advantages=grpo.group_advantages(own))
    offers = [Offer(advantage=0.5, reward=1.0, prompt_index=1), Offer(advantage=0.0, reward=1.0, prompt_index=1),
              Offer(advantage=0.3, reward=1.0, prompt_index=1), Offer(advantage=0.0, reward=1.0, prompt_index=0),
              Offer(advantage=0.7, reward=1.0, prompt_index=0), Offer(advantage=-0.2, reward=0.0, prompt_index=0),
              Offer(advantage=0.4, reward=1.0, prompt_index=1)]
    bands = [0, 0, 1, 2, 2, 2, 2]
    decisions, picks, advantages = admission.admit(offers, bands, receiver,
                                                 sharing.ShareConfig("cross-fidelity", temperature=1.0))
    assert [d[:2] for d in decisions] == [("prp", "tokens"), ("prp", "none"), ("xgrpo", "reward"), ("sgt", "tokens"),
                                          ("sgt", "tokens"), ("rejected", "none"), ("rejected", "none")]
    rescue = 0.5 / (0.5 + EPS)                                # prompt 0 pooled [0, 0, 1, 1]: mean 1/2, std 1/2
    assert {k: a for k, (_, a) in picks.items()} == pytest.approx({0: 0.5, 3: rescue, 4: rescue})
    s = math.sqrt(2) / 3                                      # prompt 1 pooled [1, 0, 1]: mean 2/3, std sqrt(2)/3
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.0], [(1 / 3) / (s + EPS), (-2 / 3) / (s + EPS)]]))


@pytest.mark.parametrize("band", [0, 1, 2])
def test_a_verified_rescue_crosses_at_every_band_even_with_a_zero_advantage(band):
    # its own group all succeeded (A = 0); the receiver's whole group failed the prompt
    from types import SimpleNamespace as Offer
    own = torch.tensor([[0.0, 0.0, 0.0]])
    receiver = Offer(rewards=own, advantages=grpo.group_advantages(own))
    decisions, picks, advantages = admission.admit([Offer(advantage=0.0, reward=1.0, prompt_index=0)], [band], receiver,
                                                 sharing.ShareConfig("cross-fidelity", temperature=1.0))
    assert decisions[0][0] == sharing.LEVELS[band] and "tokens" in decisions[0][1]
    assert picks[0][1] == pytest.approx(0.75 / (math.sqrt(3) / 4 + EPS))   # pooled [0, 0, 0, 1]: mean 1/4
    if band == 1:                                                           # its reward joins the baseline too
        torch.testing.assert_close(advantages, torch.full((1, 3), -0.25 / (math.sqrt(3) / 4 + EPS)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-5, 5)), max_size=30), st.floats(0, 1), st.sampled_from([1, -1]))
def test_a_ranked_admission_admits_its_share_of_the_ranked_offers_and_none_ranked_below_one_left_out(values, share,
                                                                                                       sense):
    bands = admission.ranked_bands(values, share, sense)
    present = [k for k, v in enumerate(values) if v is not None]
    admitted = [k for k in present if bands[k] == 0]
    assert [b is None for b in bands] == [v is None for v in values]                 # inert offers stay unranked
    assert all(bands[k] in (0, admission.REJECTED) for k in present)
    assert len(admitted) == math.floor(share * len(present) + 0.5)                   # the share, rounded half up
    left_out = [k for k in present if bands[k] == admission.REJECTED]
    if admitted and left_out:                                                        # a naive check of the order
        assert max(sense * values[k] for k in admitted) <= min(sense * values[k] for k in left_out)


def test_a_ranked_admission_by_hand_lowest_first_ties_in_order_and_nan_last():
    values = [0.4, None, 0.1, float("nan"), 0.4, 0.2]
    # five ranked; half of them rounds up to 3: 0.1, 0.2 and the first 0.4 (ties keep the offers' order)
    assert admission.ranked_bands(values, 0.5, 1) == [0, None, 0, admission.REJECTED, admission.REJECTED, 0]
    # highest first: 0.4, 0.4, 0.2; the NaN still ranks last
    assert admission.ranked_bands(values, 0.5, -1) == [0, None, admission.REJECTED, admission.REJECTED, 0, 0]
    assert admission.ranked_bands(values, 0.0, 1) == [admission.REJECTED, None, *[admission.REJECTED] * 4]


def test_an_offer_a_ranked_admission_leaves_out_is_rejected_whole_even_a_rescue():
    own = torch.tensor([[0.0, 0.0, 0.0]])                     # the receiver's whole group failed: a rescue candidate
    receiver = Offer(rewards=own, advantages=grpo.group_advantages(own))
    rescue = Offer(advantage=0.0, reward=1.0, prompt_index=0)
    decisions, picks, advantages = admission.admit([rescue], [admission.REJECTED], receiver,
                                                   sharing.ShareConfig("cross-fidelity", temperature=1.0))
    assert decisions[0][:2] == ("rejected", "none") and picks == {}
    torch.testing.assert_close(advantages, receiver.advantages)


def test_a_ranked_admission_is_refused_on_an_unknown_signal_an_ablated_term_or_a_share_outside_0_1():
    for bad in (dict(rank_by="length"), dict(rank_by="ccm", ablate=("ccm",)), dict(admit_share=1.5)):
        with pytest.raises(ValueError):
            diagnosis.CuratorConfig(admission="ranked", **bad)


def test_a_ranked_admission_breaks_ties_by_its_seeded_draw_not_by_the_offers_order():
    values = [1.0, 1.0, 1.0, 1.0, 0.0, None]
    admitted = [frozenset(k for k, b in enumerate(admission.ranked_bands(values, 0.4, -1, random.Random(seed)))
                          if b == 0) for seed in range(40)]
    assert all(len(a) == 2 and a <= {0, 1, 2, 3} for a in admitted)     # two of the five ranked, both 1s
    assert {k for a in admitted for k in a} == {0, 1, 2, 3}             # every tied offer is admitted sometimes
    again = admission.ranked_bands(values, 0.4, -1, random.Random(7))
    assert again == admission.ranked_bands(values, 0.4, -1, random.Random(7))           # and repeatably
