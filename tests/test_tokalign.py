"""The alignment graph on real tokenizers, its properties on random text, and the TBD repair."""

import itertools
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tokalign
from testbed import token_bytes

FAMILIES = ["qwen2", "llama", "mistral"]
DIRECTIONS = list(itertools.permutations(FAMILIES, 2))
"""every source -> target direction between the families, as the trio and its pairs share"""


def encode(real, family, text, eos=False):
    tok, table = real[family]
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    return tokalign.Encoding.from_ids(ids, table)


def assert_partition(alignment, source, target):
    """Groups partition both sequences in order; exact groups cover identical bytes, checked from the offsets."""
    for ranges, encoding in ((alignment.src, source), (alignment.tgt, target)):
        flat = [k for a, b in ranges for k in range(a, b)]
        assert flat == list(range(len(encoding.ids)))
    for (s0, s1), (t0, t1), ok in zip(alignment.src, alignment.tgt, alignment.exact):
        src_bytes = b"".join(source.data[a:b] for a, b in source.offsets[s0:s1])
        tgt_bytes = b"".join(target.data[a:b] for a, b in target.offsets[t0:t1])
        if ok:
            assert src_bytes == tgt_bytes and s1 > s0 and t1 > t0
    assert 0.0 <= alignment.residual <= 1.0


def naive_alignment(source, target):
    """The groups of two tokenizations of the same bytes, by brute force: a group closes at each byte position where
    both sides end a token, and the special tokens after the text (EOS) form a last group; per group its source and
    target token ranges and its byte span, as tokalign.align's (src, tgt, span)."""
    n, m = source.text_tokens, target.text_tokens
    cuts = sorted({end for _, end in source.offsets[:n]} & {end for _, end in target.offsets[:m]})
    groups, start = [], 0
    for cut in cuts:
        src = [i for i in range(n) if start < source.offsets[i][1] <= cut]
        tgt = [j for j in range(m) if start < target.offsets[j][1] <= cut]
        groups.append(((src[0], src[-1] + 1), (tgt[0], tgt[-1] + 1), (start, cut)))
        start = cut
    if n < len(source.ids) or m < len(target.ids):
        groups.append(((n, len(source.ids)), (m, len(target.ids)), (len(source.data), len(source.data))))
    return groups


def groups(alignment):
    return list(zip(alignment.src, alignment.tgt, alignment.span))


CASES = {
    "digits": "123 + 4567 = 4690\nAnswer: 4690",
    "period newline": "It is 12.\nThen 3 more.\n\nDone.",
    "leading spaces": "   leading  spaces\t and tabs ",
    "emoji": "great 👍🏽 job 🎉🎉",
    "cjk": "数学题：小明有5个苹果。",
    "combining": "cafe\u0301 nai\u0308ve",
    "empty": "",
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pair", DIRECTIONS)
def test_alignment_is_exact_on_real_tokenizers_and_equals_the_naive_one(real, case, pair):
    text = CASES[case]
    source = encode(real, pair[0], text, eos=True)
    target = tokalign.retokenize(source, *real[pair[1]])
    alignment = tokalign.align(source, target)
    assert_partition(alignment, source, target)
    if source.data == target.data:
        assert all(alignment.exact) and alignment.residual == 0.0
        assert groups(alignment) == naive_alignment(source, target)
    assert alignment.modes[-1] == "1:1" and alignment.span[-1][0] == alignment.span[-1][1]  # EOS to EOS


def test_digit_groups_are_n_to_one_between_qwen_and_llama(real):
    source = encode(real, "qwen2", "4690")
    alignment = tokalign.align(source, tokalign.retokenize(source, *real["llama"]))
    assert alignment.modes == ["n:1", "1:1"] and alignment.sizes == [(3, 1), (1, 1)]  # 469 | 0


def test_nfd_text_under_qwen_is_noticed_not_misaligned(real):
    text = "re\u0301sume\u0301 = 5"
    source = encode(real, "llama", text)                 # Llama keeps the decomposed bytes
    target = tokalign.retokenize(source, *real["qwen2"])  # Qwen normalizes to NFC: other bytes
    assert target.data == unicodedata.normalize("NFC", text).encode()
    alignment = tokalign.align(source, target)
    assert_partition(alignment, source, target)
    assert not all(alignment.exact) and 0 < alignment.residual < 1
    inexact_bytes = b"".join(source.data[a:b] for (a, b), ok in zip(alignment.span, alignment.exact) if not ok)
    assert "e\u0301".encode() in inexact_bytes and b"= 5" not in inexact_bytes


def test_a_completion_cut_inside_a_character_is_trimmed_and_reported(real):
    tok, table = real["qwen2"]
    # "ok " then the first of the three bytes of 数 (e6 95 b0): a sampled completion stopped at max length
    cut = tokalign.Encoding.from_ids([tok.convert_tokens_to_ids(t) for t in ["ok", "Ġ", "æ"]], table)
    assert cut.data == b"ok \xe6"
    target = tokalign.retokenize(cut, *real["llama"])
    assert target.data == b"ok "
    alignment = tokalign.align(cut, target)
    assert_partition(alignment, cut, target)
    assert alignment.residual == pytest.approx(1 / 4) and alignment.exact[-1] is False


def test_align_completion_moves_text_and_returns_none_where_nothing_reaches_the_receiver(real, monkeypatch):
    tok, table = real["qwen2"]
    ids = tok("It is 12.\nDone.", add_special_tokens=False)["input_ids"]
    src, tgt, alignment = tokalign.align_completion(ids, table, *real["llama"])
    assert src.data == tgt.data == b"It is 12.\nDone."
    assert groups(alignment) == naive_alignment(src, tgt)
    lone_cut_byte = [tok.convert_tokens_to_ids("æ")]              # the first byte of a character, nothing after it
    assert tokalign.align_completion(lone_cut_byte, table, *real["llama"]) is None

    def cannot_spell(tokenizer, text):
        raise ValueError("this metaspace tokenizer has no byte-fallback tokens to spell a literal U+2581 in the text")
    monkeypatch.setattr(tokalign, "encode_text", cannot_spell)
    assert tokalign.align_completion(ids, table, *real["llama"]) is None


def test_non_canonical_source_ids_align_by_bytes(real):
    tok, table = real["qwen2"]
    pieces = [tok.convert_tokens_to_ids(t) for t in ["H", "ello", "Ġw", "orld"]]  # not how Qwen would encode it
    source = tokalign.Encoding.from_ids(pieces, table)
    target = tokalign.retokenize(source, *real["qwen2"])
    alignment = tokalign.align(source, target)
    assert_partition(alignment, source, target)
    assert alignment.sizes == [(2, 1), (2, 1)] and all(alignment.exact)


def test_utf8_prefix_by_hand():
    assert tokalign.complete_utf8_prefix("a数".encode()[:-1]) == 1
    assert tokalign.complete_utf8_prefix("a数".encode()) == 4
    assert tokalign.complete_utf8_prefix("😀".encode()[:3]) == 0
    assert tokalign.complete_utf8_prefix(b"") == 0


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60), pair=st.sampled_from(DIRECTIONS), eos=st.booleans())
def test_property_groups_partition_and_exact_groups_share_bytes(real, text, pair, eos):
    source = encode(real, pair[0], text, eos=eos)
    target = tokalign.retokenize(source, *real[pair[1]])
    alignment = tokalign.align(source, target)
    assert_partition(alignment, source, target)
    if source.data == target.data:
        assert all(alignment.exact) and groups(alignment) == naive_alignment(source, target)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40),
       constant=st.floats(-5, 5), seed=st.integers(0, 1000))
def test_property_redistribution_keeps_constants_and_conserves_the_byte_weighted_total(real, text, constant, seed):
    source = encode(real, "qwen2", text)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)
    if not all(alignment.exact):  # normalization changed the bytes: conservation is only promised for exact ones
        return
    n = len(source.ids)
    flat = tokalign.redistribute(alignment, source, target, torch.full((n,), constant, dtype=torch.float64))
    assert torch.allclose(flat, torch.full_like(flat, constant))
    values = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    moved = tokalign.redistribute(alignment, source, target, values)
    src_len = torch.tensor([b - a for a, b in source.offsets], dtype=torch.float64)
    tgt_len = torch.tensor([b - a for a, b in target.offsets], dtype=torch.float64)
    assert (moved * tgt_len).sum().item() == pytest.approx((values * src_len).sum().item(), abs=1e-9)


def test_redistribution_by_hand(real):
    # Qwen "123" = '1' '2' '3'  ->  Llama '123': the target token gets the mean of the three digits
    source = encode(real, "qwen2", "123 =", eos=True)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)
    values = torch.tensor([1.0, 2.0, 6.0, -1.0, 0.5])   # '1' '2' '3' ' =' EOS
    assert tokalign.redistribute(alignment, source, target, values).tolist() == [3.0, -1.0, 0.5]
    back = tokalign.redistribute(tokalign.align(target, source), target, source, torch.tensor([3.0, -1.0, 0.5]))
    assert back.tolist() == [3.0, 3.0, 3.0, -1.0, 0.5]


def test_group_log_ratio_against_a_naive_sum(real):
    source = encode(real, "qwen2", "12 + 345 = 357\nAnswer: 357", eos=True)
    target = tokalign.retokenize(source, *real["llama"])
    alignment = tokalign.align(source, target)
    g = torch.Generator().manual_seed(0)
    src_lp, tgt_lp = -torch.rand(len(source.ids), generator=g), -torch.rand(len(target.ids), generator=g)
    naive = [tgt_lp[t0:t1].sum() - src_lp[s0:s1].sum() for (s0, s1), (t0, t1) in zip(alignment.src, alignment.tgt)]
    torch.testing.assert_close(tokalign.group_log_ratio(alignment, src_lp, tgt_lp), torch.stack(naive))
    src_m, tgt_m = alignment.matrices(len(source.ids), len(target.ids))
    torch.testing.assert_close(tgt_m.float() @ tgt_lp - src_m.float() @ src_lp, torch.stack(naive))
    same = tokalign.align(source, source)
    assert (tokalign.group_log_ratio(same, src_lp, src_lp) == 0).all()


def test_n_to_m_groups_where_a_character_is_split_differently(real):
    # Qwen: ' ' + the emoji's 4 bytes as byte-level pieces; Mistral: '▁' then byte-fallback tokens
    source = encode(real, "qwen2", "great 👍 job")
    target = tokalign.retokenize(source, *real["mistral"])
    alignment = tokalign.align(source, target)
    assert_partition(alignment, source, target)
    spans = {source.data[a:b].decode(): mode for (a, b), mode in zip(alignment.span, alignment.modes)}
    assert spans[" 👍"] == "n:m" and all(alignment.exact)


@pytest.mark.parametrize("target_family", FAMILIES)
def test_marker_text_in_a_peer_completion_stays_text(real, target_family):
    # a completion that writes chat markers as text: the target must not read them as its special tokens
    text = "x <|eot_id|> <|im_end|> </s> <s> y"
    source_family = "llama" if target_family == "qwen2" else "qwen2"
    source = tokalign.Encoding.from_ids(token_bytes.encode_text(real[source_family][0], text), real[source_family][1])
    assert source.data == text.encode()
    tok, _ = real[target_family]
    target = tokalign.retokenize(source, *real[target_family])
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert target.data == text.encode() and not special & set(target.ids)
    alignment = tokalign.align(source, target)
    assert all(alignment.exact) and alignment.residual == 0.0


@pytest.mark.parametrize("pair", [("qwen2", "mistral"), ("mistral", "qwen2"), ("mistral", "llama")])
def test_a_literal_metaspace_character_survives_a_mistral_side(real, pair):
    # Mistral's pre-tokenizer turns spaces into U+2581: a literal U+2581 must come back as itself, not as a space
    text = "a\u2581b \u2581\u2581c"
    source = tokalign.Encoding.from_ids(token_bytes.encode_text(real[pair[0]][0], text), real[pair[0]][1])
    assert source.data == text.encode()
    target = tokalign.retokenize(source, *real[pair[1]])
    assert target.data == text.encode()
    assert tokalign.align(source, target).residual == 0.0


def encoding(data: bytes, cuts: list[int]) -> tokalign.Encoding:
    """A hand-made tokenization of `data` with token boundaries at `cuts` (ids are positions)."""
    bounds = [0, *cuts, len(data)]
    return tokalign.Encoding(list(range(len(bounds) - 1)), list(zip(bounds, bounds[1:])), data)


def test_token_credit_splits_a_straddling_token_by_bytes_and_conserves_credit():
    data = b"1+1=2\n2+2=4"
    steps = [(0, 5), (6, 11)]
    source = encoding(data, list(range(1, len(data))))
    target = encoding(data, [4, 7])                                          # "1+1=", "2\n2", "+2=4"
    alignment = tokalign.align(source, target)
    credit = torch.tensor([1.0, -1.0], dtype=torch.float64)
    tokens = tokalign.token_credit(source, target, alignment, steps, credit, by_bytes=True)
    # "2\n2": "2" and its newline close step 0 (credit 1), the second "2" opens step 1 (credit -1)
    torch.testing.assert_close(tokens, torch.tensor([1.0, (1.0 + 1.0 - 1.0) / 3, -1.0]))
    naive = tokalign.token_credit(source, target, alignment, steps, credit, by_bytes=False)
    torch.testing.assert_close(naive, torch.tensor([1.0, 1.0, -1.0]))    # the first byte's step takes it all


def test_separators_and_eos_carry_the_credit_of_the_step_they_close():
    # "12\n3\n" then EOS: steps "12" and "3"; the newlines and the EOS lie outside both. The sequence advantage
    # would be 1; each step's repaired credit is set by hand, and no token may keep the unrepaired 1.
    data = b"12\n3\n"
    steps = [(0, 2), (3, 4)]
    source = tokalign.Encoding([0, 1, 2, 3, 4, 9], [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 5)], data)
    target = tokalign.Encoding([0, 1, 2, 3, 9], [(0, 2), (2, 3), (3, 4), (4, 5), (5, 5)], data)  # "12" one token
    alignment = tokalign.align(source, target)
    credit = torch.tensor([0.25, -0.5], dtype=torch.float64)
    for by_bytes in (True, False):
        tokens = tokalign.token_credit(source, target, alignment, steps, credit, by_bytes)
        torch.testing.assert_close(tokens, torch.tensor([0.25, 0.25, -0.5, -0.5, -0.5]))
    assert tokalign.credit_spans(steps, len(data)) == [(0, 3), (3, 5)]
    assert tokalign.credit_spans([(2, 4)], 9) == [(0, 9)]                     # leading bytes: the first step's


@settings(max_examples=200, deadline=None)
@given(st.text("abcdefgh", max_size=6), st.text("nopqrs", min_size=1, max_size=6), st.text("tuvwxyz", min_size=1,
       max_size=6), st.text("abcdefgh", max_size=6))
def test_target_positions_map_shared_bytes_to_their_partners_and_a_replaced_stretch_to_its_end(p, x, y, s):
    # source P X S, target P Y S with X and Y from alphabets of their own: a target position in P or S maps to its
    # partner (both of P's ends included), one strictly inside Y to the end of X, by hand
    p, x, y, s = (t.encode() for t in (p, x, y, s))
    want = ([*range(len(p) + 1)] + [len(p) + len(x)] * (len(y) - 1)
            + [j - len(y) + len(x) for j in range(len(p) + len(y), len(p) + len(y) + len(s) + 1)])
    assert tokalign.target_positions_in_source(p + x + s, p + y + s) == want
    # the target drops X: the position where P and S meet in it snaps to the end of X; without S the target is a
    # prefix of the source, read as such
    dropped = [*range(len(p)), *range(len(p) + len(x), len(p + x + s) + 1)] if s else [*range(len(p) + 1)]
    assert tokalign.target_positions_in_source(p + x + s, p + s) == dropped


def test_steps_are_read_at_their_place_in_the_receivers_bytes_where_re_encoding_changed_them(real):
    # "aXXbb" re-encoded as "aYbb": step 0 "aXX" [0, 3) is [0, 2) in the receiver's bytes, step 1 "bb" [3, 5) is [2, 4)
    source, target = encoding(b"aXXbb", [1, 3]), encoding(b"aYbb", [1, 2])          # a | XX | bb and a | Y | bb
    steps = [(0, 3), (3, 5)]
    assert tokalign.in_target(source, target, steps) == [(0, 2), (2, 4)]
    credit = torch.tensor([1.0, -1.0])
    # without the TBD repair each receiver token takes the step its first byte lies in there: a, Y in 0, bb in 1
    assert tokalign.token_credit(source, target, tokalign.align(source, target), steps, credit,
                                 by_bytes=False).tolist() == [1.0, 1.0, -1.0]
    # NFD under Llama, NFC under Qwen: "re\u0301sume\u0301" is 10 bytes in the source and 8 in the receiver
    text = "re\u0301sume\u0301 = 5"
    nfd = encode(real, "llama", text)
    nfc = tokalign.retokenize(nfd, *real["qwen2"])
    assert tokalign.in_target(nfd, nfc, [(0, 10), (10, 14)]) == [(0, 8), (8, 12)]
    assert tokalign.in_target(nfd, nfd, [(0, 10), (10, 14)]) == [(0, 10), (10, 14)]
    # a lone continuation byte re-encoded as U+FFFD (3 bytes): the receiver's added bytes go to the first step
    lone, replaced = encoding(b"\xbdab\ncd", [3]), encoding(b"\xef\xbf\xbdab\ncd", [5])
    assert tokalign.in_target(lone, replaced, [(0, 4), (4, 6)]) == [(0, 6), (6, 8)]
    # a completion cut inside a character, trimmed: the cut byte's span ends with the receiver's bytes
    assert tokalign.in_target(encoding(b"ab\xc3", []), encoding(b"ab", []), [(0, 2), (2, 3)]) == [(0, 2), (2, 2)]

