"""The TBD term (boundary_drift.py): its three measures by hand, on real tokenizers in each step format, and the
hidden-state map against a known linear map."""

import pytest
import torch

import boundary_drift
import tokalign
from testbed import arith, tiny
from test_tokalign import encode, encoding


def test_step_consistency_and_boundary_hotspots_by_hand(real):
    text = "7 + 5 = 12\n12 - 3 = 9"
    source = encode(real, "qwen2", text)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)
    sim = boundary_drift.boundary_similarity(alignment)
    steps = tokalign.char_to_byte_spans(text, [(0, 10), (11, 21)])
    # step 0 groups: 7 | ' +' | ' ' | 5 | ' =' | ' ' | 12 (2:1, sim 1/2); step 1: 12 (1/2) ' -' ' ' 3 ' =' ' ' 9
    expected = [(6 + 0.5) / 7, (6 + 0.5) / 7]
    assert boundary_drift.step_consistency(alignment, sim, steps).tolist() == pytest.approx(expected)
    assert [m for m in alignment.modes if m != "1:1"] == ["n:1", "n:1"]          # the two 2:1 digit groups
    assert boundary_drift.boundary_hotspots(source, target, steps) == []




def test_a_token_straddling_a_step_boundary_on_one_side_is_a_hotspot(real):
    tok, table = real["qwen2"]
    split = tokalign.Encoding.from_ids(tok("a b", add_special_tokens=False)["input_ids"], table)   # 'a' ' b'
    merged = tokalign.Encoding(ids=[0], offsets=[(0, 3)], data=b"a b")                               # 'a b'
    steps = [(0, 1), (2, 3)]
    assert boundary_drift.boundary_hotspots(merged, split, steps) == [(0, "source")]
    assert boundary_drift.boundary_hotspots(split, merged, steps) == [(0, "target")]
    assert boundary_drift.boundary_hotspots(split, split, steps) == []
    # the receiver re-encoded "aXX" as "aY": its step boundary is at its byte 2, where its tokens a | Y | bb part, so
    # neither side straddles (read at the source's byte 3, "bb" would seem to)
    source, target = encoding(b"aXXbb", [1, 3]), encoding(b"aYbb", [1, 2])
    assert boundary_drift.boundary_hotspots(source, target, [(0, 3), (3, 5)]) == []
    assert boundary_drift.boundary_hotspots(source, encoding(b"aYbb", [1, 3]), [(0, 3), (3, 5)]) == [(0, "target")]
    assert tokalign.char_to_byte_spans("é x", [(0, 1), (2, 3)]) == [(0, 2), (3, 4)]




def test_tbd_counts_a_straddled_step_boundary_not_a_digit_split():
    data = b"123+4=127\n1+2=3"
    steps = [(0, 9), (10, 15)]
    qwen_like = encoding(data, list(range(1, len(data))))                   # one byte per token
    llama_like = encoding(data, [3, 4, 5, 6, 9, 10, 11, 12, 13, 14])        # "123" one token: a 3:1 group
    alignment = tokalign.align(qwen_like, llama_like)
    tbd = boundary_drift.drift_steps("credit", alignment, qwen_like, llama_like, steps)
    torch.testing.assert_close(tbd, torch.zeros(2, dtype=torch.float64))  # the 1:n split changes no step's credit
    jaccard = boundary_drift.step_consistency(alignment, boundary_drift.boundary_similarity(alignment), steps)
    assert jaccard[0] < 1                                                   # while the byte-boundary sim calls it drift
    straddling = encoding(data, [3, 4, 5, 6, 8, 11, 12, 13, 14])            # one token "7\n1" holds bytes of both steps
    alignment = tokalign.align(qwen_like, straddling)
    tbd = boundary_drift.drift_steps("credit", alignment, qwen_like, straddling, steps)
    torch.testing.assert_close(tbd, torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_an_inexact_group_is_drift_by_its_bytes_and_a_two_by_two_group_keeps_a_third_of_its_boundaries():
    # the receiver re-encoded the source's "XX" as "Y": an inexact group over source bytes [1, 3), 2 of step 0's 3
    source, target = encoding(b"aXXbb", [1, 3]), encoding(b"aYbb", [1, 2])
    alignment = tokalign.align(source, target)
    steps = [(0, 3), (3, 5)]
    assert alignment.exact == [True, False, True]
    credit = boundary_drift.drift_steps("credit", alignment, source, target, steps)
    assert credit.tolist() == pytest.approx([2 / 3, 0.0])
    assert boundary_drift.boundary_similarity(alignment).tolist() == [1.0, 0.0, 1.0]
    jaccard = boundary_drift.drift_steps("jaccard", alignment, source, target, steps)
    assert jaccard.tolist() == pytest.approx([0.5, 0.0])                      # step 0: groups 'a' (1) and XX~Y (0)
    # "a|bc" against "ab|c": one exact group of 2 and 2 tokens sharing 1 of their 3 boundaries
    square = tokalign.align(encoding(b"abc", [1]), encoding(b"abc", [2]))
    assert square.sizes == [(2, 2)]
    assert boundary_drift.boundary_similarity(square).tolist() == pytest.approx([1 / 3])


def naive_step_mean(alignment, values, steps):
    """The mean of per-group values over the groups whose bytes overlap each step, by a plain loop."""
    out = []
    for a, b in steps:
        touching = [float(values[g]) for g, (g0, g1) in enumerate(alignment.span) if g0 < b and g1 > a]
        out.append(sum(touching) / len(touching))
    return out


def test_the_jaccard_measure_is_one_minus_the_mean_boundary_jaccard_by_a_plain_loop(real):
    text = "123 + 4567 = 4690\nAnswer: 4690"
    source = encode(real, "qwen2", text)
    alignment = tokalign.align(source, tokalign.retokenize(source, *real["llama"]))
    jaccard = [1 / (n + m - 1) for n, m in alignment.sizes]
    steps = tokalign.char_to_byte_spans(text, arith.step_spans(text))
    expected = [1 - v for v in naive_step_mean(alignment, jaccard, steps)]
    values = boundary_drift.drift_steps("jaccard", alignment, source, source, steps)
    assert values.tolist() == pytest.approx(expected) and min(expected) > 0   # digits differ: always non-zero
    with pytest.raises(ValueError, match="credit"):
        boundary_drift.drift_steps("bytes", alignment, source, source, steps)


@pytest.mark.parametrize("step_format", arith.STEP_FORMATS)
def test_prose_steps_straddle_tokens_that_mistral_splits_and_lines_never_do(real, step_format):
    problem = arith.Problem("", 7, (("+", 5), ("-", 3)), 9)
    text = arith.solution(problem, step_format)
    steps = tokalign.char_to_byte_spans(text, arith.step_spans(text, step_format))
    hotspots = {}
    for pair in [("qwen2", "llama"), ("qwen2", "mistral"), ("mistral", "llama")]:
        source = encode(real, pair[0], text)
        target = tokalign.retokenize(source, *real[pair[1]])
        hotspots[pair] = boundary_drift.boundary_hotspots(source, target, steps)
        values = boundary_drift.drift_steps("credit", tokalign.align(source, target), source, target, steps)
        expected = [0.0] * len(steps)
        for k, _ in hotspots[pair]:
            expected[k] += 0.5
            expected[k + 1] += 0.5
        assert values.tolist() == expected
    # "12.Then", "9.Answer": Qwen2 and Llama-3 both hold the period with the next step's first letters, Mistral
    # splits after the period; a newline or "; " ends every family's token
    if step_format == "prose":
        assert hotspots[("qwen2", "llama")] == []
        assert hotspots[("qwen2", "mistral")] == [(0, "source"), (1, "source")]
        assert hotspots[("mistral", "llama")] == [(0, "target"), (1, "target")]
    else:
        assert all(h == [] for h in hotspots.values())


def test_the_tiny_tokenizer_of_a_format_segments_it_as_the_full_one():
    text = arith.solution(arith.Problem("", 17, (("*", 3), ("-", 12)), 39), "prose")
    for family in ("qwen2", "mistral"):
        full, trimmed = tiny.full_tokenizer(family), tiny.tiny_tokenizer(family, "prose")
        assert full.tokenize(text) == trimmed.tokenize(text)


def test_the_hidden_map_recovers_a_linear_map_and_scores_what_it_cannot_explain(real):
    text = "1 + 2 = 34\nAnswer: 34"
    source = encode(real, "qwen2", text)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)                     # "34": two Qwen digits, one Llama token
    steps = tokalign.char_to_byte_spans(text, arith.step_spans(text))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    trajectories = []
    for consistent in (True, False):
        h_src = torch.randn(len(source.ids), 4, generator=g, dtype=torch.float64)
        h_tgt = torch.zeros(len(target.ids), 3, dtype=torch.float64)
        for (s0, s1), (t0, t1) in zip(alignment.src, alignment.tgt):
            mapped = h_src[s0:s1].mean(0) @ w
            h_tgt[t0:t1] = mapped if consistent or s1 - s0 == 1 else torch.randn(3, generator=g, dtype=torch.float64)
        trajectories.append((alignment, h_src, h_tgt, steps))
    fitted = boundary_drift.fit_hidden_map(
        torch.cat([h[[i for i, _ in boundary_drift.one_to_one_pairs(alignment)]] for _, h, _, _ in trajectories]),
        torch.cat([h[[j for _, j in boundary_drift.one_to_one_pairs(alignment)]] for _, _, h, _ in trajectories]))
    torch.testing.assert_close(fitted, w, atol=1e-2, rtol=1e-2)
    consistent, inconsistent = boundary_drift.hidden_measure(trajectories)
    assert consistent.tolist() == pytest.approx([0.0, 0.0], abs=1e-4)
    # the digit groups of the second trajectory: 1 - cos(mapped source mean, its random target state), by hand
    _, h_src, h_tgt, _ = trajectories[1]
    drift = []
    for (s0, s1), (t0, t1) in zip(alignment.src, alignment.tgt):
        a, b = h_src[s0:s1].mean(0) @ w, h_tgt[t0:t1].mean(0)
        drift.append(min(max(1 - float(a @ b / (a.norm() * b.norm())), 0.0), 1.0))
    assert inconsistent.tolist() == pytest.approx(naive_step_mean(alignment, drift, steps), abs=1e-3)
    assert min(inconsistent.tolist()) > 0
    no_pairs = tokalign.align(encode(real, "qwen2", "123"), encode(real, "llama", "123"))   # one 3:1 group
    with pytest.raises(ValueError, match="1:1"):
        boundary_drift.hidden_measure([(no_pairs, torch.zeros(3, 4), torch.zeros(1, 3), [(0, 3)])])


def test_the_hidden_measure_is_cross_fitted_against_a_naive_loop(real):
    # four trajectories of unrelated random states: a map fitted on a trajectory's own 1:1 groups would explain
    # them (more dimensions than pairs); each is scored by the map of the other fold and that map's median
    # similarity on its own fold's 1:1 groups
    text = "1 + 2 = 34\nAnswer: 34"
    source = encode(real, "qwen2", text)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)
    steps = tokalign.char_to_byte_spans(text, arith.step_spans(text))
    g = torch.Generator().manual_seed(1)
    items = [(alignment, torch.randn(len(source.ids), 16, generator=g, dtype=torch.float64),
              torch.randn(len(target.ids), 16, generator=g, dtype=torch.float64), steps) for _ in range(4)]
    pairs = boundary_drift.one_to_one_pairs(alignment)
    one_to_one = [g for g, (size, ok) in enumerate(zip(alignment.sizes, alignment.exact)) if ok and size == (1, 1)]
    expected = {}
    for fold, other in (([0, 2], [1, 3]), ([1, 3], [0, 2])):
        w = boundary_drift.fit_hidden_map(torch.cat([items[i][1][[s for s, _ in pairs]] for i in other]),
                                          torch.cat([items[i][2][[t for _, t in pairs]] for i in other]))
        sims = {i: boundary_drift.hidden_similarity(alignment, items[i][1], items[i][2], w) for i in fold}
        reference = torch.cat([sims[i][one_to_one] for i in fold]).median().item()
        for i in fold:
            drift = [min(max((reference - s) / reference, 0.0), 1.0) for s in sims[i].tolist()]
            expected[i] = naive_step_mean(alignment, drift, steps)
    measured = boundary_drift.hidden_measure(items)
    for i in range(4):
        assert measured[i].tolist() == pytest.approx(expected[i], abs=1e-6)


def test_a_fold_with_no_one_to_one_group_borrows_the_other_folds_map_and_zero_point(real):
    # trajectories 0 and 2 (fold 0) have 1:1 groups, trajectory 1 (fold 1) only a 3:1 group ("123"): fold 0 is
    # scored by its own map, in sample, and fold 1 by that map against fold 0's median 1:1 similarity
    text = "1 + 2 = 34\nAnswer: 34"
    source = encode(real, "qwen2", text)
    alignment = tokalign.align(source, tokalign.retokenize(source, *real["llama"]))
    steps = tokalign.char_to_byte_spans(text, arith.step_spans(text))
    digits = tokalign.align(encode(real, "qwen2", "123"), encode(real, "llama", "123"))
    assert digits.sizes == [(3, 1)]
    g = torch.Generator().manual_seed(2)

    def states(a):
        return (torch.randn(a.src[-1][1], 16, generator=g, dtype=torch.float64),
                torch.randn(a.tgt[-1][1], 16, generator=g, dtype=torch.float64))
    items = [(alignment, *states(alignment), steps), (digits, *states(digits), [(0, 3)]),
             (alignment, *states(alignment), steps)]
    pairs = boundary_drift.one_to_one_pairs(alignment)
    w = boundary_drift.fit_hidden_map(torch.cat([items[i][1][[s for s, _ in pairs]] for i in (0, 2)]),
                                      torch.cat([items[i][2][[t for _, t in pairs]] for i in (0, 2)]))

    def cosines(a, h_src, h_tgt):
        out = []
        for (s0, s1), (t0, t1), ok in zip(a.src, a.tgt, a.exact):
            x, y = h_src[s0:s1].mean(0) @ w, h_tgt[t0:t1].mean(0)
            out.append(float(x @ y / (x.norm() * y.norm())) if ok else 0.0)
        return out
    one_to_one = sorted(cosines(*items[i][:3])[k] for i in (0, 2) for k, size in enumerate(alignment.sizes)
                        if size == (1, 1))
    reference = one_to_one[(len(one_to_one) - 1) // 2]                        # torch's median: the lower middle
    assert reference > 0
    measured = boundary_drift.hidden_measure(items)
    for (a, h_src, h_tgt, spans), values in zip(items, measured):
        drift = [min(max((reference - s) / reference, 0.0), 1.0) for s in cosines(a, h_src, h_tgt)]
        assert values.tolist() == pytest.approx(naive_step_mean(a, drift, spans), abs=1e-6)
