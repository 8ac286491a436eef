"""SmolLM2-135M-Instruct, the real model every install has (policies.packaged_gguf), measured on a CPU (docs/real.md,
"SmolLM2-135M-Instruct on a CPU").

  accuracy  zero-shot greedy pass@1 through its own chat template: on the arithmetic task's held-out problems as
            a run evaluates them (the reward wants a last line `Answer: N`; beside it, the share whose last number
            is the answer), and on HumanEval, each program judged in the sandbox (--humaneval N: the first N of its
            164 problems by task id)
  memory    costs.estimate of one GRPO update of one micro-batch (a group of GROUP sequences) against its
            measured peak (memory_estimate.measure_update: every tensor storage alive at once), full fine-tuning
            and LoRA, float32, at the small shape's sequence lengths
  speed     perf/iteration_s of docs/real.md's SmolLM2 run (RUN: SmolLM2 in the llama seat beside the tiny Qwen
            policy, cross-fidelity, LoRA, 4 prompts x 4 completions of up to 32 tokens), other flags after --

    python -m benchmarks.smollm2 accuracy [--eval-size 500] [--humaneval 164] [--max-new-tokens 40]
    python -m benchmarks.smollm2 memory
    python -m benchmarks.smollm2 speed [-- --share none --lora-rank 0]
"""

import argparse
import copy
import json
import re
import shlex
import time

import torch

import eval as evaluation
import grpo
from benchmarks.memory_estimate import measure_update
from testbed import costs
from testbed import lora
from testbed import policies
from testbed import presets
from testbed import tasks

GROUP, NEW_TOKENS = 4, 32
"""the small shape: RUN's, and the memory measurement's group"""


def load_smollm2() -> policies.Policy:
    return policies.load_hub_policy(presets.PRESETS["tiny"]["qwen-llama"][1], str(policies.packaged_gguf()),
                                    torch.device("cpu"), torch.float32)


def last_number_right(problem, completion: str) -> bool:
    """The completion's last integer is the answer: what the model knows, whatever format it answers in."""
    numbers = re.findall(r"-?\d+", completion)
    return bool(numbers) and int(numbers[-1]) == problem.answer


def accuracy(policy: policies.Policy, eval_size: int, humaneval: int, max_new_tokens: int, code_tokens: int
             ) -> dict[str, tuple[float, int]]:
    """task -> (greedy pass@1, problems) on the arithmetic task's held-out split (and, beside the task's reward,
    the share whose last number is the answer) and on the first `humaneval` HumanEval problems."""
    arith = tasks.load_task("arith", 1, 0, eval_size)
    texts = [t for i in range(0, len(arith.heldout), 256) for t in policy.rollout(
        [arith.prompt(q) for q in arith.heldout[i:i + 256]], 1, max_new_tokens, greedy=True).texts]
    out = {"arith": (tasks.rewards(arith, arith.heldout, texts).mean().item(), len(texts)),
           "arith, last number": (sum(map(last_number_right, arith.heldout, texts)) / len(texts), len(texts))}
    if humaneval:
        code = tasks.load_task("humaneval", 1, 164, 164)
        problems = sorted(code.train + code.heldout, key=lambda e: int(e.id.split("/")[1]))[:humaneval]
        out["humaneval"] = (evaluation.heldout_accuracy(policy, problems, code_tokens, code, batch_size=16),
                            len(problems))
    return out


def update_memory(policy: policies.Policy, lora_rank: int, prompt_len: int, n: int = GROUP) -> tuple[int, int]:
    """(estimated, measured) peak bytes of one GRPO update of one micro-batch of `n` sequences (a prompt's group)
    with random token ids (the memory does not depend on them)."""
    model = lora.add_lora(policy.model, lora_rank, 2 * lora_rank) if lora_rank else policy.model
    model.train()
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (prompt_len,), generator=gen).tolist()] * n
    completions = [torch.randint(vocab, (NEW_TOKENS,), generator=gen).tolist() for _ in range(n)]
    batch = grpo.build_batch(prompts, completions, [torch.ones(NEW_TOKENS)] * n, pad_id=policy.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=True)
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=n)   # AdamW's moments exist from here
    measured = measure_update(model, optimizer, batch, micro_batch=n)
    work = costs.Workload(n, prompt_len, NEW_TOKENS, n, n, group_size=n)
    return costs.estimate(model, work).total_bytes, measured


RUN = ("--share cross-fidelity --lora-rank 8 --prompts-per-iteration 4 --group-size 4 --max-new-tokens 32 "
       "--eval-size 20 --iterations 3")
"""docs/real.md's SmolLM2 run (with --model-paths llama=<the packaged file>), which `speed` times"""


def iteration_seconds(flags: list[str], runs_dir: str) -> list[float]:
    """perf/iteration_s of each iteration of `train.py --model-paths llama=<SmolLM2> FLAGS` (the llama line's;
    every policy's line of an iteration repeats it)."""
    import train
    from args import Args
    import tyro
    args = tyro.cli(Args, args=[f"--model-paths=llama={policies.packaged_gguf()}", *flags,
                                      f"--runs-dir={runs_dir}", f"--name=smollm2-speed-{int(time.time())}"])
    run_dir = train.main(args)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["perf/iteration_s"] for r in rows if r["policy"] == "llama" and "perf/iteration_s" in r]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("what", choices=("accuracy", "memory", "speed"))
    cli.add_argument("--eval-size", type=int, default=500, help="arithmetic held-out problems")
    cli.add_argument("--humaneval", type=int, default=164, help="HumanEval problems (0 skips it)")
    cli.add_argument("--max-new-tokens", type=int, default=40, help="arithmetic: a run's default")
    cli.add_argument("--code-tokens", type=int, default=256, help="HumanEval completion length")
    cli.add_argument("--runs-dir", default="runs")
    cli.add_argument("flags", nargs="*", help="speed: train.py flags after --, added to RUN's")
    cli = cli.parse_intermixed_args()   # options may come between `what` and the flags after --
    torch.set_num_threads(1)
    started = time.perf_counter()
    if cli.what == "accuracy":
        for task, (acc, n) in accuracy(load_smollm2(), cli.eval_size, cli.humaneval, cli.max_new_tokens,
                                       cli.code_tokens).items():
            print(f"{task}: greedy pass@1 {acc:.3f} on {n} problems")
    elif cli.what == "memory":
        arith, smollm2 = tasks.load_task("arith", 1, 0, 50), load_smollm2()
        prompt_len = max(len(smollm2.encode_prompt(arith.prompt(q))) for q in arith.heldout)
        for rank in (0, 16):
            estimated, measured = update_memory(copy.deepcopy(smollm2), rank, prompt_len)
            print(f"{'LoRA r=16' if rank else 'full'}, {GROUP} sequences of {prompt_len} + {NEW_TOKENS} tokens: "
                  f"estimate {estimated / 2 ** 30:.3f} GiB, measured "
                  f"{measured / 2 ** 30:.3f} GiB, ratio {estimated / measured:.3f}")
    else:
        flags = shlex.split(RUN) + cli.flags
        seconds = iteration_seconds(flags, cli.runs_dir)
        print(f"train.py {' '.join(flags)}: s per iteration " + ", ".join(f"{s:.1f}" for s in seconds))
    print(f"({time.perf_counter() - started:.0f} s, one thread)")


if __name__ == "__main__":
    main()
