"""The tokenizer heterogeneity layer (THL): retokenization, the token alignment graph and the TBD repair.

Proposal §1.1: a shared trajectory is retokenized by the target, and source and target tokens are aligned into
groups (1:1, 1:n, n:1 and, per DESIGN.md §4.3, n:m) that cover the same bytes; what the groups say about drift,
the TBD diagnosis, is boundary_drift.py. §2.2, TBD repair: the source's per-token advantages are redistributed
onto the target's tokens in proportion to the bytes they share.

Decisions relied on (DESIGN.md §4):
  4.2  sharing happens on text: the target re-encodes the completion text only, never the source ids; special
       tokens (EOS) are mapped explicitly, never aligned as text.
  4.3  groups come from byte offsets by a two-pointer walk, O(n + m), not from an edit-distance DP.
  4.4  the density ratio is taken per group: log r_g = sum_{t in g} log pi_tgt(t) - sum_{s in g} log pi_src(s).

`align_completion` takes one completion from a source's ids to the receiver's encoding and their alignment.
The credit of each step reaches the receiver's tokens through `token_credit`: separators and the EOS carry the
step they close (`credit_spans`), and the TBD repair moves it by byte overlap (`redistribute`).

Where the target cannot reproduce the source's bytes (Qwen normalizes to NFC, a completion cut inside a
multi-byte character), the layer trims the incomplete tail, aligns what differs as inexact groups around the
longest matching byte blocks (difflib, only on this rare path), and reports the residual: the share of source
bytes outside exact groups.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass

import torch

from testbed.token_bytes import byte_offsets, encode_text


@dataclass(frozen=True)
class Encoding:
    """One side's tokenization of a completion: ids, each token's byte span in `data`, and the bytes."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    data: bytes

    @classmethod
    def from_ids(cls, ids: list[int], token_bytes: list[bytes]) -> Encoding:
        return cls(list(ids), byte_offsets(ids, token_bytes), b"".join(token_bytes[i] for i in ids))

    @property
    def text_tokens(self) -> int:
        """Tokens before the trailing zero-width ones; those are special tokens (EOS), mapped, not aligned."""
        n = len(self.ids)
        while n > 0 and self.offsets[n - 1][0] == self.offsets[n - 1][1]:
            n -= 1
        return n


@dataclass(frozen=True)
class Alignment:
    """The token alignment graph: groups of consecutive source and target tokens covering the same bytes.

    Groups partition both token sequences in order. `src[g]` and `tgt[g]` are half-open token ranges, `span[g]`
    the group's source byte span. A last group of special tokens (EOS to EOS) covers no bytes.
    """

    src: list[tuple[int, int]]
    tgt: list[tuple[int, int]]
    span: list[tuple[int, int]]
    exact: list[bool]
    """the group's source and target tokens cover identical bytes (or are EOS mapped to EOS)"""
    residual: float
    """share of the source's bytes outside exact groups"""

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return [(s1 - s0, t1 - t0) for (s0, s1), (t0, t1) in zip(self.src, self.tgt)]

    @property
    def modes(self) -> list[str]:
        """'1:1', '1:n', 'n:1', 'n:m', or with a '0' side where one tokenization has nothing (an inexact tail)."""
        def word(k: int) -> str:
            return "0" if k == 0 else "1" if k == 1 else "n"
        return ["n:m" if a > 1 and b > 1 else f"{word(a)}:{word(b)}" for a, b in self.sizes]

    def matrices(self, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Boolean group membership: source [G, n] and target [G, m]."""
        src = torch.zeros(len(self.src), n, dtype=torch.bool)
        tgt = torch.zeros(len(self.tgt), m, dtype=torch.bool)
        for g, ((s0, s1), (t0, t1)) in enumerate(zip(self.src, self.tgt)):
            src[g, s0:s1] = True
            tgt[g, t0:t1] = True
        return src, tgt

    def group_ids(self, side: str) -> torch.Tensor:
        """[n] (or [m]) the group of every token of one side, for segment sums with index_add."""
        ranges = self.src if side == "src" else self.tgt
        return torch.cat([torch.full((b - a,), g, dtype=torch.long) for g, (a, b) in enumerate(ranges)]
                         or [torch.zeros(0, dtype=torch.long)])


# ---------------------------------------------------------------------------------------------------------------
# Retokenization and alignment
# ---------------------------------------------------------------------------------------------------------------

def complete_utf8_prefix(data: bytes) -> int:
    """Length of `data` without a trailing multi-byte character that was cut before its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: ASCII or the lead byte of the last character
            need = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if need > back else len(data)
    return len(data)


def retokenize(source: Encoding, tokenizer, token_bytes: list[bytes]) -> Encoding:
    """The target's encoding of the source completion's text (DESIGN.md §4.2).

    The text is the source's bytes less an incomplete trailing character; only it is re-encoded, with no
    special tokens added: marker text in it (a literal '<|eot_id|>') stays text (`token_bytes.encode_text`). A source
    EOS at the end becomes the target's EOS.
    """
    text = source.data[:complete_utf8_prefix(source.data)].decode("utf-8", errors="replace")
    ids = encode_text(tokenizer, text)
    if source.text_tokens < len(source.ids):
        ids = ids + [tokenizer.eos_token_id]
    return Encoding.from_ids(ids, token_bytes)


def target_positions_in_source(src: bytes, tgt: bytes) -> list[int]:
    """For every target byte position 0..len(tgt), the source byte position it corresponds to (monotone).

    Identity when the target reproduces the source or a prefix of it; otherwise from the longest matching blocks:
    a position that ends a block keeps its partner, one strictly inside a replaced stretch snaps to the end of the
    source bytes it replaces, and one where the target drops source bytes (two blocks meet) to the end of those.
    """
    if src.startswith(tgt):
        return list(range(len(tgt) + 1))
    position, b_prev = [0] * (len(tgt) + 1), 0
    for a, b, size in difflib.SequenceMatcher(None, src, tgt, autojunk=False).get_matching_blocks():
        position[b_prev + 1:b] = [a] * (b - b_prev - 1)       # strictly inside the stretch: b_prev ends a match
        position[b:b + size + 1] = range(a, a + size + 1)
        b_prev = b + size
    return position


def in_target(source: Encoding, target: Encoding, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte spans of the source's bytes at their place in the target's: the same spans where the bytes agree (up
    to the end of a trimmed target); where re-encoding changed them, through `target_positions_in_source` read
    the other way, bytes the target adds before the first shared ones going to the first span."""
    if source.data.startswith(target.data):
        end = len(target.data)
        return [(min(a, end), min(b, end)) for a, b in spans]
    to_target = target_positions_in_source(target.data, source.data)
    to_target[0] = 0
    return [(to_target[a], to_target[b]) for a, b in spans]


def align(source: Encoding, target: Encoding) -> Alignment:
    """Group the two tokenizations at the byte positions where both have a token boundary. O(n + m).

    Where the bytes agree every group is exact: its tokens cover the same bytes on both sides. Where they
    differ, groups still partition both sequences in order, and those whose bytes differ are inexact.
    """
    n, m = source.text_tokens, target.text_tokens
    to_source = target_positions_in_source(source.data, target.data)
    src_end = [e for _, e in source.offsets[:n]]                                    # non-decreasing
    tgt_end = [to_source[e] for _, e in target.offsets[:m]]                         # in source coordinates
    cuts, i, j = [], 0, 0
    while i < n and j < m:                                                          # merge walk: common ends
        if src_end[i] == tgt_end[j]:
            cuts.append(src_end[i])
        if src_end[i] <= tgt_end[j]:
            i += 1
        else:
            j += 1
    last = max(src_end[-1] if n else 0, tgt_end[-1] if m else 0)
    if (n or m) and (not cuts or cuts[-1] != last):
        cuts.append(last)
    groups_src, groups_tgt, spans, exact = [], [], [], []
    i = j = start = 0
    for cut in dict.fromkeys(cuts):
        i0, j0 = i, j
        while i < n and src_end[i] <= cut:
            i += 1
        while j < m and tgt_end[j] <= cut:
            j += 1
        if i == i0 and j == j0:
            continue
        t_bytes = target.data[target.offsets[j0][0]:target.offsets[j - 1][1]] if j > j0 else b""
        groups_src.append((i0, i))
        groups_tgt.append((j0, j))
        spans.append((start, cut))
        exact.append(i > i0 and j > j0 and source.data[start:cut] == t_bytes)
        start = cut
    if n < len(source.ids) or m < len(target.ids):
        groups_src.append((n, len(source.ids)))
        groups_tgt.append((m, len(target.ids)))
        spans.append((len(source.data), len(source.data)))
        exact.append(n < len(source.ids) and m < len(target.ids))
    inexact = sum(b - a for (a, b), ok in zip(spans, exact) if not ok)
    return Alignment(groups_src, groups_tgt, spans, exact, inexact / len(source.data) if source.data else 0.0)


Aligned = tuple[Encoding, Encoding, Alignment]   # source encoding, receiver encoding, their alignment


def align_completion(ids: list[int], source_token_bytes: list[bytes], tokenizer, token_bytes: list[bytes]
                     ) -> Aligned | None:
    """A source completion's token ids retokenized by the receiver (its tokenizer and token table) and aligned with
    them; None where the receiver's tokenizer cannot spell the text (token_bytes.encode_text) or holds no token of
    it (a lone cut byte)."""
    src = Encoding.from_ids(ids, source_token_bytes)
    try:
        tgt = retokenize(src, tokenizer, token_bytes)
    except ValueError:
        return None
    return (src, tgt, align(src, tgt)) if tgt.ids else None


def char_to_byte_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans of `text` as UTF-8 byte spans; a lone surrogate (an invalid byte decoded with
    surrogateescape) counts as its one byte."""
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8", errors="surrogateescape")))
    return [(starts[a], starts[b]) for a, b in spans]


def step_byte_spans(data: bytes, spans_of) -> list[tuple[int, int]]:
    """The steps (`spans_of(text)`, character spans) of a completion as byte spans of `data`, exactly, even where
    `data` is not valid UTF-8."""
    text = data.decode("utf-8", errors="surrogateescape")
    return char_to_byte_spans(text, spans_of(text))


# ---------------------------------------------------------------------------------------------------------------
# TBD repair and the density ratio
# ---------------------------------------------------------------------------------------------------------------

def redistribute(alignment: Alignment, source: Encoding, target: Encoding, src_values: torch.Tensor
                 ) -> torch.Tensor:
    """[m] target per-token values (advantages) from source ones [n], in proportion to shared bytes.

    In an exact group a target token gets the byte-weighted mean of the source values it overlaps, so a constant
    stays constant and the byte-weighted total is conserved. An inexact group, and the EOS group, give each of
    their target tokens the group's byte-weighted source mean. Target tokens of a group with no source token
    (bytes the source never had) get 0.
    """
    rows, cols, weights = [], [], []
    for (s0, s1), (t0, t1), (g0, g1), ok in zip(alignment.src, alignment.tgt, alignment.span, alignment.exact):
        if s1 == s0 or t1 == t0:
            continue
        if g1 == g0 or not ok:
            for j in range(t0, t1):
                for i in range(s0, s1):
                    rows.append(j)
                    cols.append(i)
                    weights.append(max(source.offsets[i][1] - source.offsets[i][0], 1))
            continue
        shift = g0 - target.offsets[t0][0]                    # target bytes -> source bytes inside the group
        i, j = s0, t0
        while i < s1 and j < t1:                              # two-pointer over the group's overlaps
            (a, b), (c, d) = source.offsets[i], target.offsets[j]
            overlap = min(b, d + shift) - max(a, c + shift)
            if overlap > 0:
                rows.append(j)
                cols.append(i)
                weights.append(overlap)
            if b <= d + shift:
                i += 1
            else:
                j += 1
    total = torch.zeros(len(target.ids), dtype=src_values.dtype)
    mass = torch.zeros(len(target.ids), dtype=src_values.dtype)
    if rows:
        rows_t, w = torch.tensor(rows), torch.tensor(weights, dtype=src_values.dtype)
        total.index_add_(0, rows_t, w * src_values[torch.tensor(cols)])
        mass.index_add_(0, rows_t, w)
    return total / mass.clamp(min=1e-12)


def credit_spans(steps: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The byte spans whose tokens carry each step's credit: step k from its first byte (the first step from 0) up
    to the next step's first byte (the last step to the end), so a separator or the EOS carries the step it
    closes."""
    starts = [0, *(a for a, _ in steps[1:])]
    return list(zip(starts, [*starts[1:], length]))


def token_credit(source: Encoding, target: Encoding, alignment: Alignment,
                 steps: list[tuple[int, int]], credit: torch.Tensor, by_bytes: bool) -> torch.Tensor:
    """[m] the receiver's per-token advantages from per-step credit [K] (K >= 1), every token carrying the step of
    its `credit_spans` span; a zero-width token (EOS) at byte e carries the step of byte e - 1.

    by_bytes (the TBD repair): source tokens take their step's credit, moved by byte overlap (`redistribute`);
    off: each receiver token takes the credit of the step its first byte lies in (the steps at their place in the
    receiver's bytes, `in_target`).
    """
    def per_token(encoding: Encoding, spans: list[tuple[int, int]]) -> torch.Tensor:
        bounds = [b for _, b in credit_spans(spans, len(encoding.data))][:-1]
        first_bytes = [s if e > s else max(s - 1, 0) for s, e in encoding.offsets]
        return credit[torch.tensor([bisect.bisect_right(bounds, b) for b in first_bytes], dtype=torch.long)]
    if by_bytes:
        return redistribute(alignment, source, target, per_token(source, steps)).float()
    return per_token(target, in_target(source, target, steps)).float()


def group_log_ratio(alignment: Alignment, src_logprobs: torch.Tensor, tgt_logprobs: torch.Tensor) -> torch.Tensor:
    """[G] log pi_target(g) - log pi_source(g): each side's token log-probs summed over the group (§4.4)."""
    g = len(alignment.src)
    tgt = torch.zeros(g, dtype=tgt_logprobs.dtype).index_add_(0, alignment.group_ids("tgt"), tgt_logprobs)
    src = torch.zeros(g, dtype=src_logprobs.dtype).index_add_(0, alignment.group_ids("src"), src_logprobs)
    return tgt - src
