"""The tokenizer heterogeneity layer (THL) and the token alignment graph: TBD diagnosis and repair.

Proposal §1.1: a shared trajectory is retokenized by the target, source and target tokens are aligned into
groups (1:1, 1:n, n:1 and, per DESIGN.md §4.3, n:m), the step consistency
    S_TBD = 1/|A| * sum over aligned groups g of sim(h_src(g), h_tgt(g))
is measured, and drift hotspots are the non-1:1 groups whose similarity is low. §2.2, TBD repair: the source's
per-token advantages are redistributed onto the target's tokens in proportion to the bytes they share.

Decisions relied on (DESIGN.md §4):
  4.2  sharing happens on text: the target re-encodes the completion text only, never the source ids; special
       tokens (EOS) are mapped explicitly, never aligned as text.
  4.3  groups come from byte offsets by a two-pointer walk, O(n + m), not from an edit-distance DP.
  4.4  the density ratio is taken per group: log r_g = sum_{t in g} log pi_tgt(t) - sum_{s in g} log pi_src(s).
  4.7  h, default: byte-level, no hidden states. A group's similarity is the Jaccard index of the token
       boundaries the two sides put in it: 1 for 1:1, 1/(n+m-1) for a minimal n:m group, 0 where the bytes
       differ; a group is as consistent as its two segmentations agree. `hidden_similarity` is the proposal's
       "light mapping network" alternative: a least-squares linear map from source to target hidden states,
       fitted on the exact 1:1 groups, then cosine similarity of the groups' mean states.

The curator's TBD term per step (`tbd_steps`, DESIGN.md §4.7): tokens change a step's credit only where one holds
bytes of two steps, or where the receiver cannot reproduce the bytes; so step k's value is max(its byte share
in inexact groups, 1/2 per boundary with a neighbour step that exactly one side straddles, `boundary_hotspots`),
0 for a pure 1:n digit split, and what the repair leaves of it is its inexact share. The credit of each step
reaches the receiver's tokens through `token_credit`: separators and the EOS carry the step they close
(`credit_spans`), and the TBD repair moves it by byte overlap (`redistribute`).

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

from token_bytes import byte_offsets, encode_text


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

    Identity when the target reproduces the source or a prefix of it; otherwise from the longest matching blocks,
    with target bytes outside them snapping to the end of the source stretch they replace.
    """
    if src.startswith(tgt):
        return list(range(len(tgt) + 1))
    position, b_prev = [0] * (len(tgt) + 1), 0
    for a, b, size in difflib.SequenceMatcher(None, src, tgt, autojunk=False).get_matching_blocks():
        position[b_prev:b] = [a] * (b - b_prev)
        position[b:b + size + 1] = range(a, a + size + 1)
        b_prev = b + size
    return position


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


# ---------------------------------------------------------------------------------------------------------------
# TBD diagnosis: similarity, S_TBD, hotspots
# ---------------------------------------------------------------------------------------------------------------

def boundary_similarity(alignment: Alignment) -> torch.Tensor:
    """[G] the default sim of each group: Jaccard of the two sides' token boundaries, 1/(n+m-1); 0 if inexact."""
    sims = [1.0 / (a + b - 1) if ok else 0.0 for (a, b), ok in zip(alignment.sizes, alignment.exact)]
    return torch.tensor(sims, dtype=torch.float32)


def hidden_similarity(alignment: Alignment, h_src: torch.Tensor, h_tgt: torch.Tensor) -> torch.Tensor:
    """[G] cosine similarity of each group's mean hidden state, the source's mapped into the target's space.

    h_src [n, d_src], h_tgt [m, d_tgt]: hidden states of the tokens (text and special). The map W [d_src, d_tgt]
    is the least-squares fit of h_src[i] W = h_tgt[j] over the exact 1:1 groups (i, j); inexact groups get 0.
    """
    pairs = [(s0, t0) for (s0, s1), (t0, t1), ok in zip(alignment.src, alignment.tgt, alignment.exact)
             if ok and s1 - s0 == 1 and t1 - t0 == 1]
    if len(pairs) < 2:
        raise ValueError(f"fitting the linear map needs at least 2 exact 1:1 groups, the alignment has {len(pairs)}")
    idx_s, idx_t = torch.tensor(pairs).T
    w = torch.linalg.lstsq(h_src[idx_s].double(), h_tgt[idx_t].double()).solution.to(h_src.dtype)  # [d_src, d_tgt]
    src_mean = segment_mean(h_src @ w, alignment.group_ids("src"), len(alignment.src))             # [G, d_tgt]
    tgt_mean = segment_mean(h_tgt, alignment.group_ids("tgt"), len(alignment.tgt))                 # [G, d_tgt]
    sims = torch.nn.functional.cosine_similarity(src_mean, tgt_mean, dim=-1)
    return torch.where(torch.tensor(alignment.exact), sims, torch.zeros_like(sims))


def segment_mean(values: torch.Tensor, segment: torch.Tensor, count: int) -> torch.Tensor:
    """[count, ...] the mean of `values` rows over each segment id (empty segments give 0)."""
    sums = torch.zeros((count, *values.shape[1:]), dtype=values.dtype).index_add_(0, segment, values)
    sizes = torch.zeros(count, dtype=values.dtype).index_add_(0, segment, torch.ones_like(segment, dtype=values.dtype))
    return sums / sizes.clamp(min=1).view(-1, *([1] * (values.ndim - 1)))


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


def step_consistency(alignment: Alignment, similarity: torch.Tensor, step_spans: list[tuple[int, int]]
                     ) -> torch.Tensor:
    """[K] S_TBD of each step (byte span): the mean similarity of the groups that overlap it."""
    starts = [a for a, _ in alignment.span]
    out = []
    for a, b in step_spans:
        first = max(bisect.bisect_right(starts, a) - 1, 0)
        touching = [g for g in range(first, len(starts)) if starts[g] < b and alignment.span[g][1] > a]
        out.append(similarity[touching].mean().item() if touching else float("nan"))
    return torch.tensor(out)


def boundary_hotspots(source: Encoding, target: Encoding, step_spans: list[tuple[int, int]]
                      ) -> list[tuple[int, str]]:
    """Boundaries between steps k and k+1 that one side straddles and the other does not: (k, side).

    A side straddles the boundary when one of its tokens covers bytes of both steps: its credit for the two steps
    is mixed in one token, while the other side can give each step its own.
    """
    def straddles(encoding: Encoding, starts: list[int], k: int) -> bool:
        last_byte, next_first = step_spans[k][1] - 1, step_spans[k + 1][0]
        t = bisect.bisect_right(starts, last_byte) - 1            # the token holding step k's last byte
        return t >= 0 and encoding.offsets[t][1] > next_first
    src_starts, tgt_starts = [a for a, _ in source.offsets], [a for a, _ in target.offsets]
    out = []
    for k in range(len(step_spans) - 1):
        s, t = straddles(source, src_starts, k), straddles(target, tgt_starts, k)
        if s != t:
            out.append((k, "source" if s else "target"))
    return out


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


def tbd_steps(alignment: Alignment, source: Encoding, target: Encoding,
              steps: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[K] the TBD value of each step, and [K] what the repair leaves of it (its inexact byte share)."""
    inexact = torch.zeros(len(steps), dtype=torch.float64)
    for (g0, g1), ok in zip(alignment.span, alignment.exact):
        if not ok:
            for k, (a, b) in enumerate(steps):
                inexact[k] += max(0, min(b, g1) - max(a, g0)) / max(b - a, 1)
    straddled = torch.zeros(len(steps), dtype=torch.float64)
    for k, _ in boundary_hotspots(source, target, steps):
        straddled[k] += 0.5
        straddled[k + 1] += 0.5
    return torch.maximum(inexact.clamp(max=1.0), straddled), inexact.clamp(max=1.0)


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
    off: each receiver token takes the credit of the step its first byte lies in.
    """
    bounds = [b for _, b in credit_spans(steps, len(source.data))][:-1]

    def per_token(offsets: list[tuple[int, int]]) -> torch.Tensor:
        first_bytes = [s if e > s else max(s - 1, 0) for s, e in offsets]
        return credit[torch.tensor([bisect.bisect_right(bounds, b) for b in first_bytes], dtype=torch.long)]
    if by_bytes:
        return redistribute(alignment, source, target, per_token(source.offsets)).float()
    return per_token(target.offsets).float()


def group_log_ratio(alignment: Alignment, src_logprobs: torch.Tensor, tgt_logprobs: torch.Tensor) -> torch.Tensor:
    """[G] log pi_target(g) - log pi_source(g): each side's token log-probs summed over the group (§4.4)."""
    g = len(alignment.src)
    tgt = torch.zeros(g, dtype=tgt_logprobs.dtype).index_add_(0, alignment.group_ids("tgt"), tgt_logprobs)
    src = torch.zeros(g, dtype=src_logprobs.dtype).index_add_(0, alignment.group_ids("src"), src_logprobs)
    return tgt - src


if __name__ == "__main__":
    # One solution under the real Qwen2 and Llama-3 tokenizers: groups with their modes, steps and hotspots.
    import tasks
    import tiny
    from token_bytes import token_bytes_table

    def show(token_id: int, tok, table: list[bytes]) -> str:
        return repr(table[token_id].decode("utf-8", errors="replace")) if table[token_id] else tok.convert_ids_to_tokens(token_id)

    problem = tasks.generate_problems(1, "train", seed=3, cfg=tasks.TaskConfig(num_steps=3, max_operand=250))[0]
    text = problem.solution + "\nDone. ✓"
    sides = {}
    for family in ("qwen2", "llama"):
        tok = tiny.full_tokenizer(family)
        table = token_bytes_table(tok)
        sides[family] = (tok, table)
    qwen_tok, qwen_table = sides["qwen2"]
    source = Encoding.from_ids(qwen_tok(text, add_special_tokens=False)["input_ids"] + [qwen_tok.eos_token_id],
                               qwen_table)
    target = retokenize(source, *sides["llama"])
    alignment = align(source, target)
    sim = boundary_similarity(alignment)
    steps = char_to_byte_spans(text, tasks.line_spans(text))
    print(f"question: {problem.question}\nsource: Qwen2 ({len(source.ids)} tokens)   target: Llama-3 "
          f"({len(target.ids)} tokens)   groups: {len(alignment.src)}   residual: {alignment.residual:.3f}\n")
    step_sim = step_consistency(alignment, sim, steps)
    for k, (a, b) in enumerate(steps):
        print(f"step {k}: {source.data[a:b].decode()!r}   S_TBD = {step_sim[k]:.2f}")
        for g, (g0, g1) in enumerate(alignment.span):
            if g0 < b and g1 > a or (g0 == g1 == len(source.data) and k == len(steps) - 1):
                (s0, s1), (t0, t1) = alignment.src[g], alignment.tgt[g]
                src = " ".join(show(i, *sides["qwen2"]) for i in source.ids[s0:s1])
                tgt = " ".join(show(i, *sides["llama"]) for i in target.ids[t0:t1])
                print(f"   {alignment.modes[g]:>4}  sim {sim[g]:.2f}  {src:<30} | {tgt}")
    tbd, left = tbd_steps(alignment, source, target, steps)
    print(f"\ntrajectory S_TBD (mean over groups) = {sim.mean():.3f}; step boundaries straddled on one side only: "
          f"{boundary_hotspots(source, target, steps)}; the curator's TBD per step {tbd.tolist()}, after repair "
          f"{left.tolist()}")
