"""Offset alignment (tokalign.align, O(n + m)) against an edit-distance DP aligner (O(n m), as FuseLLM's MinED).

Both align the same Qwen2 -> Llama-3 pairs of completions of about 128, 512 and 2,048 source tokens, timed in one
run. The DP is the straightforward one: Levenshtein over the two token-string sequences with backtrace, tokens
matched when their strings are equal.

    python -m benchmarks.tokalign_speed
"""

import tokalign
from benchmarks.timing import best_of
from testbed import arith
from testbed import tiny
from testbed import token_bytes


def edit_distance_alignment(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Minimum-edit-distance alignment of two token sequences: the matched (i, j) pairs."""
    n, m = len(a), len(b)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        row, prev, ai = cost[i], cost[i - 1], a[i - 1]
        for j in range(1, m + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ai != b[j - 1]))
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if cost[i][j] == cost[i - 1][j - 1] + (a[i - 1] != b[j - 1]):
            if a[i - 1] == b[j - 1]:
                pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif cost[i][j] == cost[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def completion_of(tokens: int, tokenizer) -> str:
    """Arithmetic solutions joined until the Qwen tokenization reaches `tokens` tokens."""
    text = ""
    problems = iter(arith.generate_problems(10_000, "train", 0, arith.TaskConfig(num_steps=4, max_operand=999)))
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
        text += arith.solution(next(problems)) + "\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def main() -> None:
    qwen, llama = tiny.full_tokenizer("qwen2"), tiny.full_tokenizer("llama")
    qwen_bytes, llama_bytes = token_bytes.token_bytes_table(qwen), token_bytes.token_bytes_table(llama)
    print("| source tokens | target tokens | offsets (ms) | edit-distance DP (ms) | speed-up |")
    print("|---|---|---|---|---|")
    for n in (128, 512, 2048):
        text = completion_of(n, qwen)
        source = tokalign.Encoding.from_ids(qwen(text, add_special_tokens=False)["input_ids"], qwen_bytes)
        target = tokalign.retokenize(source, llama, llama_bytes)
        ours = best_of(20, lambda: tokalign.align(source, target))
        a = [qwen_bytes[i].decode("utf-8", "replace") for i in source.ids]
        b = [llama_bytes[i].decode("utf-8", "replace") for i in target.ids]
        dp = best_of(3 if n < 2048 else 1, lambda: edit_distance_alignment(a, b))
        print(f"| {len(source.ids)} | {len(target.ids)} | {ours * 1e3:.3f} | {dp * 1e3:.1f} | {dp / ours:.0f}x |")


if __name__ == "__main__":
    main()
