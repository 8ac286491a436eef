"""What cross-fidelity's curation costs at the small and paper presets, before a GPU user pays it: FLOPs per
iteration and receiver, from the models' published shapes (built on the meta device: no weights, no hub).

For each model, with every weight trained and with LoRA, `testbed.costs.iteration_flops` gives the rollouts' and the
update's FLOPs (each prompt computed once for its group, the fewest the update computes) and
`testbed.costs.curation_flops` curation's for each CCM estimate: the per-step gradient norms over every peer rollout
and the receiver's own calibration rollouts (an upper bound: on the tiny preset the predictor and the inert offers
leave about half undiagnosed) and the receiver's forward over every offer (an upper bound on what crosses).
tests/test_costs.py checks both counts against torch's FLOP counter on a real call.

    python -m benchmarks.curation_cost                                  # the default run's shapes
    python -m benchmarks.curation_cost --max-new-tokens 256 --steps 8   # longer solutions, more steps
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

import diagnosis
import grad_norms
from args import Args
from benchmarks import memory_estimate
from benchmarks import shaped_models
from testbed import costs, lora

ESTIMATES = ("exact", "last:2", "last:0")
MODELS = {"small": ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
          "paper": tuple(memory_estimate.PAPER_PAIR)}
"""each scale's qwen-llama pair (testbed/presets.py)"""


def meta_model(name: str, lora_rank: int) -> torch.nn.Module:
    """`name`'s published shape on the meta device in bf16, with LoRA adapters of `lora_rank` (0: none)."""
    if name in memory_estimate.PAPER_PAIR:
        model = memory_estimate.build(name, 0, checkpointing=False)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(shaped_models.shaped_config(name), dtype=torch.bfloat16)
    return lora.add_lora(model, lora_rank, 2 * lora_rank) if lora_rank else model


def rows(model: torch.nn.Module, work: costs.Workload, offers: int, own: int, steps: int) -> dict[str, float]:
    """TFLOPs of one iteration for one receiver: rollouts, update and each estimate's curation."""
    seq = work.prompt_len + work.max_new_tokens
    out = {phase: f / 1e12 for phase, f in costs.iteration_flops(model, work).items()}
    for estimate in ESTIMATES:
        parts = costs.curation_flops(model, grad_norms.ccm_scope(model, estimate), offers + own, offers, seq, steps,
                                     window=work.max_new_tokens)
        out[f"curation, {estimate}"] = sum(parts.values()) / 1e12
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--prompts", type=int, default=Args.prompts_per_iteration)
    cli.add_argument("--group-size", type=int, default=Args.group_size)
    cli.add_argument("--prompt-len", type=int, default=100)
    cli.add_argument("--max-new-tokens", type=int, default=Args.max_new_tokens)
    cli.add_argument("--steps", type=int, default=4, help="steps per trajectory (the batched backward's cotangents)")
    cli.add_argument("--lora-rank", type=int, default=16)
    args = cli.parse_args()
    rollouts = args.prompts * args.group_size
    own = diagnosis.CuratorConfig.calibration_rollouts
    # a pair: each receiver is offered its one peer's rollouts, and trains on its own and on every offer at most
    work = costs.Workload(rollouts, args.prompt_len, args.max_new_tokens, micro_batch=8,
                          train_sequences=2 * rollouts, group_size=args.group_size)
    print(f"TFLOPs per iteration and receiver: {args.prompts} prompts x {args.group_size} completions of "
          f"{args.prompt_len} + {args.max_new_tokens} tokens, {args.steps} steps each; curation diagnoses the "
          f"{rollouts} peer rollouts and {own} own ones and crosses every offer (upper bounds)\n")
    print("| scale | model | training | rollouts | update | " + " | ".join(f"curation, {e}" for e in ESTIMATES)
          + " | curation / (rollouts + update), last:2 |")
    print("|---|---|---|---|---|" + "---|" * len(ESTIMATES) + "---|")
    for scale, names in MODELS.items():
        for name in names:
            for rank in (0, args.lora_rank):
                r = rows(meta_model(name, rank), work, rollouts, own, args.steps)
                share = r["curation, last:2"] / (r["rollouts"] + r["update"])
                print(f"| {scale} | {name.split('/')[-1]} | {'LoRA r' + str(rank) if rank else 'all weights'} | "
                      + " | ".join(f"{r[k]:.1f}"
                                   for k in ["rollouts", "update", *(f'curation, {e}' for e in ESTIMATES)])
                      + f" | {share:.2f} |")


if __name__ == "__main__":
    main()
