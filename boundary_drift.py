"""TBD, the tokenization boundary drift of a shared trajectory: the curator's per-step term, by three measures.

Proposal §1.1: once the receiver retokenizes a trajectory and tokalign aligns the two tokenizations into groups,
the step consistency is
    S_TBD = 1/|A| * sum over aligned groups g of sim(h_src(g), h_tgt(g))
and drift hotspots are the groups whose similarity is low. The curator needs, per step k, a value in [0, 1] that
says how much of the step the retokenization damages. It has three measures (--tbd-measure, DESIGN.md §4.7):

  credit   (default) what tokens do to the step's credit: its byte share in inexact groups (bytes the receiver
           cannot reproduce), or 1/2 per boundary with a neighbour step that exactly one side straddles (one of
           its tokens holds bytes of both steps, so it mixes their credit while the other side keeps them apart,
           `boundary_hotspots`), whichever is larger; 0 for a pure 1:n digit split, which moves no credit.
  hidden   the proposal's S_TBD with its "light mapping network": a linear map W from the source's to the
           receiver's last hidden states, fitted by ridge least squares on the exact 1:1 groups; a group's sim is
           the cosine of its mapped source mean state and its receiver mean state. Step k's value is the mean
           over its groups of max(0, (s_ref - sim) / s_ref), s_ref the median sim of held-out 1:1 groups
           (below), so a group as consistent as a typical 1:1 token scores 0 and an inexact group 1. The map
           is fitted per (source, receiver) pair every iteration, on the exact 1:1 groups of all the trajectories
           the source offers the receiver that iteration (a few thousand pairs against a hidden size of 128 on
           the tiny preset), and refreshed every iteration because both policies change with every update. Its
           cost is one no-grad forward of each side over the offered trajectories and a d x d solve per pair;
           the source computes its states where it is, and they cross with its trajectories.
  jaccard  1 - the mean Jaccard index of the two sides' token boundaries over the step's groups (1/(n+m-1) for
           an n:m group): non-zero wherever the tokenizations differ at all, so on digits between Qwen2 and
           Llama-3 always; kept as the known tautology the other two are compared against.

The hidden measure is cross-fitted (`hidden_measure`): the map and the zero point come from one half of the
offers' 1:1 groups and score the other half, so a 1:1 group the map was fitted on does not set its own zero.
"""

from __future__ import annotations

import bisect

import torch

from tokalign import Alignment, Encoding, in_target

MEASURES = ("credit", "hidden", "jaccard")


def boundary_similarity(alignment: Alignment) -> torch.Tensor:
    """[G] the Jaccard sim of each group: of the two sides' token boundaries, 1/(n+m-1); 0 if inexact."""
    sims = [1.0 / (a + b - 1) if ok else 0.0 for (a, b), ok in zip(alignment.sizes, alignment.exact)]
    return torch.tensor(sims, dtype=torch.float32)


def step_consistency(alignment: Alignment, similarity: torch.Tensor, step_spans: list[tuple[int, int]]
                     ) -> torch.Tensor:
    """[K] the mean of per-group `similarity` [G] over the groups that overlap each step (byte span); NaN for a
    step no group overlaps."""
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
    is mixed in one token, while the other side can give each step its own. `step_spans` are in the source's
    bytes; the target reads them at their place in its own (`in_target`).
    """
    def straddles(encoding: Encoding, starts: list[int], spans: list[tuple[int, int]], k: int) -> bool:
        last_byte, next_first = spans[k][1] - 1, spans[k + 1][0]
        t = bisect.bisect_right(starts, last_byte) - 1            # the token holding step k's last byte
        return t >= 0 and encoding.offsets[t][1] > next_first
    src_starts, tgt_starts = [a for a, _ in source.offsets], [a for a, _ in target.offsets]
    target_spans = in_target(source, target, step_spans)
    out = []
    for k in range(len(step_spans) - 1):
        s, t = straddles(source, src_starts, step_spans, k), straddles(target, tgt_starts, target_spans, k)
        if s != t:
            out.append((k, "source" if s else "target"))
    return out


def inexact_share(alignment: Alignment, steps: list[tuple[int, int]]) -> torch.Tensor:
    """[K] the share of each step's bytes that lie in inexact groups (bytes the receiver does not reproduce)."""
    inexact = torch.zeros(len(steps), dtype=torch.float64)
    for (g0, g1), ok in zip(alignment.span, alignment.exact):
        if not ok:
            for k, (a, b) in enumerate(steps):
                inexact[k] += max(0, min(b, g1) - max(a, g0)) / max(b - a, 1)
    return inexact.clamp(max=1.0)


def credit_steps(alignment: Alignment, source: Encoding, target: Encoding,
                 steps: list[tuple[int, int]]) -> torch.Tensor:
    """[K] the credit measure of each step (the module docstring)."""
    straddled = torch.zeros(len(steps), dtype=torch.float64)
    for k, _ in boundary_hotspots(source, target, steps):
        straddled[k] += 0.5
        straddled[k + 1] += 0.5
    return torch.maximum(inexact_share(alignment, steps), straddled)


def jaccard_steps(alignment: Alignment, steps: list[tuple[int, int]]) -> torch.Tensor:
    """[K] the jaccard measure of each step: 1 - the mean boundary similarity of its groups."""
    return torch.nan_to_num(1 - step_consistency(alignment, boundary_similarity(alignment), steps).double())


def one_to_one_pairs(alignment: Alignment) -> list[tuple[int, int]]:
    """(source token, target token) of every exact 1:1 group: the pairs the hidden map is fitted on."""
    return [(s0, t0) for (s0, s1), (t0, t1), ok in zip(alignment.src, alignment.tgt, alignment.exact)
            if ok and s1 - s0 == 1 and t1 - t0 == 1]


def fit_hidden_map(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """W [d_src, d_tgt] minimizing |x W - y|^2 + ridge * mean(diag(x^T x)) |W|^2 for x [P, d_src], y [P, d_tgt]:
    the ridge keeps the fit defined where the pairs are fewer than the hidden size."""
    if len(x) == 0 or len(x) != len(y):
        raise ValueError(f"the hidden map needs matching, non-empty pairs of states, got {len(x)} and {len(y)}")
    x, y = x.double(), y.double()
    gram = x.T @ x                                                                       # [d_src, d_src]
    scale = ridge * gram.diagonal().mean().clamp(min=1e-12)
    return torch.linalg.solve(gram + scale * torch.eye(len(gram), dtype=gram.dtype), x.T @ y)


def segment_mean(values: torch.Tensor, segment: torch.Tensor, count: int) -> torch.Tensor:
    """[count, ...] the mean of `values` rows over each segment id (empty segments give 0)."""
    sums = torch.zeros((count, *values.shape[1:]), dtype=values.dtype).index_add_(0, segment, values)
    sizes = torch.zeros(count, dtype=values.dtype).index_add_(0, segment, torch.ones_like(segment, dtype=values.dtype))
    return sums / sizes.clamp(min=1).view(-1, *([1] * (values.ndim - 1)))


def hidden_similarity(alignment: Alignment, h_src: torch.Tensor, h_tgt: torch.Tensor, w: torch.Tensor
                      ) -> torch.Tensor:
    """[G] the cosine similarity of each group's mean hidden state, the source's mapped by w [d_src, d_tgt]; 0 for
    an inexact group. h_src [n, d_src], h_tgt [m, d_tgt]: the states of every token, text and special."""
    src_mean = segment_mean(h_src.double() @ w, alignment.group_ids("src"), len(alignment.src))    # [G, d_tgt]
    tgt_mean = segment_mean(h_tgt.double(), alignment.group_ids("tgt"), len(alignment.tgt))       # [G, d_tgt]
    sims = torch.nn.functional.cosine_similarity(src_mean, tgt_mean, dim=-1)
    return torch.where(torch.tensor(alignment.exact), sims, torch.zeros_like(sims))


def hidden_steps(alignment: Alignment, similarity: torch.Tensor, reference: float,
                 steps: list[tuple[int, int]]) -> torch.Tensor:
    """[K] the hidden measure of each step: the mean over its groups of max(0, (reference - sim) / reference)."""
    if not reference > 0:
        raise ValueError(f"the reference similarity of 1:1 groups must be positive, got {reference}: the map "
                         f"was fitted on too few pairs to mean anything")
    drift = ((reference - similarity.double()) / reference).clamp(0.0, 1.0)
    return torch.nan_to_num(step_consistency(alignment, drift, steps).double())


def one_to_one_groups(alignment: Alignment) -> list[int]:
    """The positions of the exact 1:1 groups among the alignment's groups."""
    return [g for g, (size, ok) in enumerate(zip(alignment.sizes, alignment.exact)) if ok and size == (1, 1)]


def hidden_measure(pairs: list[tuple[Alignment, torch.Tensor, torch.Tensor, list[tuple[int, int]]]]
                   ) -> list[torch.Tensor]:
    """The hidden measure [K_i] of every trajectory one source offers one receiver, given (alignment, h_src
    [n, d_src], h_tgt [m, d_tgt], steps) each, cross-fitted: the trajectories alternate between two folds, and each
    fold is scored by the map fitted on the other fold's exact 1:1 groups, against the median similarity of its
    own 1:1 groups under that map, so neither the map nor the zero point has seen the groups it scores. A fold
    with no 1:1 group to fit on leaves the other fold scored by its own map (in-sample)."""
    folds = [list(range(0, len(pairs), 2)), list(range(1, len(pairs), 2))]

    def fit(fold: list[int]) -> torch.Tensor | None:
        xy = [(pairs[i][1][[s for s, _ in p]], pairs[i][2][[t for _, t in p]])
              for i in fold for p in [one_to_one_pairs(pairs[i][0])] if p]
        return fit_hidden_map(torch.cat([x for x, _ in xy]), torch.cat([y for _, y in xy])) if xy else None
    maps = [fit(fold) for fold in folds]
    if maps[0] is None and maps[1] is None:
        raise ValueError("no offered trajectory has an exact 1:1 group to fit the hidden map on")
    out: dict[int, torch.Tensor] = {}
    for f, fold in enumerate(folds):
        w = maps[1 - f] if maps[1 - f] is not None else maps[f]
        sims = {i: hidden_similarity(pairs[i][0], pairs[i][1], pairs[i][2], w) for i in fold}
        held_out = torch.cat([sims[i][one_to_one_groups(pairs[i][0])] for i in fold]) if fold else torch.zeros(0)
        if held_out.numel() == 0:   # no 1:1 group in this fold: the zero point of the fold the map was fitted on
            other = folds[1 - f]
            held_out = torch.cat([hidden_similarity(pairs[i][0], pairs[i][1], pairs[i][2], w)[
                one_to_one_groups(pairs[i][0])] for i in other])
        reference = held_out.median().item()
        for i in fold:
            out[i] = hidden_steps(pairs[i][0], sims[i], reference, pairs[i][3])
    return [out[i] for i in range(len(pairs))]


def drift_steps(measure: str, alignment: Alignment, source: Encoding, target: Encoding,
                steps: list[tuple[int, int]]) -> torch.Tensor:
    """[K] the TBD value of each step by a measure that needs no hidden states (credit, jaccard; hidden is
    `hidden_measure`, over an iteration's offers, and reads NaN here)."""
    if measure not in MEASURES:
        raise ValueError(f"the TBD measure is one of {MEASURES}, got {measure!r}")
    return (credit_steps(alignment, source, target, steps) if measure == "credit" else
            jaccard_steps(alignment, steps) if measure == "jaccard" else
            torch.full((len(steps),), float("nan"), dtype=torch.float64))


if __name__ == "__main__":
    # One solution under two real tokenizers: groups with their modes, steps, hotspots and the TBD measures.
    import argparse

    from testbed import arith

    from testbed import tiny
    from tokalign import align, char_to_byte_spans, retokenize
    from testbed.token_bytes import token_bytes_table

    cli = argparse.ArgumentParser(description="TBD of one reference solution moved between two tokenizers")
    cli.add_argument("--step-format", choices=arith.STEP_FORMATS, default="line")
    cli.add_argument("--source", choices=sorted(tiny.PACKAGED_TOKENIZERS), default="qwen2")
    cli.add_argument("--target", choices=sorted(tiny.PACKAGED_TOKENIZERS), default="llama")
    args = cli.parse_args()

    def show(token_id: int, tok, table: list[bytes]) -> str:
        return (repr(table[token_id].decode("utf-8", errors="replace")) if table[token_id]
                else tok.convert_ids_to_tokens(token_id))

    problem = arith.generate_problems(1, "train", seed=3, cfg=arith.TaskConfig(num_steps=3, max_operand=250))[0]
    text = arith.solution(problem, args.step_format)
    sides = {family: (tiny.full_tokenizer(family), token_bytes_table(tiny.full_tokenizer(family)))
             for family in (args.source, args.target)}
    src_tok, src_table = sides[args.source]
    source = Encoding.from_ids(src_tok(text, add_special_tokens=False)["input_ids"] + [src_tok.eos_token_id],
                               src_table)
    target = retokenize(source, *sides[args.target])
    alignment = align(source, target)
    sim = boundary_similarity(alignment)
    steps = char_to_byte_spans(text, arith.step_spans(text, args.step_format))
    print(f"question: {problem.question}\nsource: {args.source} ({len(source.ids)} tokens)   target: {args.target} "
          f"({len(target.ids)} tokens)   groups: {len(alignment.src)}   residual: {alignment.residual:.3f}\n")
    for k, (a, b) in enumerate(steps):
        print(f"step {k}: {source.data[a:b].decode()!r}")
        for g, (g0, g1) in enumerate(alignment.span):
            if g0 < b and g1 > a:
                (s0, s1), (t0, t1) = alignment.src[g], alignment.tgt[g]
                src = " ".join(show(i, *sides[args.source]) for i in source.ids[s0:s1])
                tgt = " ".join(show(i, *sides[args.target]) for i in target.ids[t0:t1])
                print(f"   {alignment.modes[g]:>4}  jaccard sim {sim[g]:.2f}  {src:<30} | {tgt}")
    print(f"\nstep boundaries straddled on one side only: {boundary_hotspots(source, target, steps)}")
    for measure in ("credit", "jaccard"):
        values = drift_steps(measure, alignment, source, target, steps)
        print(f"TBD per step by {measure}: {[round(v, 3) for v in values.tolist()]}")
