"""The memory arithmetic of the paper pair (Qwen2.5-7B + Llama-3.1-8B) on one GPU, with and without LoRA.

The two models are built on the meta device from their published configurations (no weights, no hub), in
bf16, and `hardware.estimate` adds up weights, gradients, AdamW state, activations, logits and the rollouts' KV
cache at the default run's shapes (16 prompts x 8 completions, 40 new tokens).

    python benchmarks/memory_estimate.py [--micro-batch 8] [--lora-rank 16] [--prompt-len 100]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import hardware  # noqa: E402

# the fields of Qwen/Qwen2.5-7B-Instruct's and meta-llama/Llama-3.1-8B-Instruct's config.json that fix the sizes
PAPER_PAIR = {
    "Qwen2.5-7B": (Qwen2Config, Qwen2ForCausalLM, dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                                     num_hidden_layers=28, num_attention_heads=28,
                                                     num_key_value_heads=4, tie_word_embeddings=False)),
    "Llama-3.1-8B": (LlamaConfig, LlamaForCausalLM, dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                                        num_hidden_layers=32, num_attention_heads=32,
                                                        num_key_value_heads=8, tie_word_embeddings=False)),
}


def meta_model(name: str, lora_rank: int) -> torch.nn.Module:
    config_cls, model_cls, fields = PAPER_PAIR[name]
    with torch.device("meta"):
        model = model_cls(config_cls(**fields)).to(torch.bfloat16)
    return hardware.add_lora(model, lora_rank, 2 * lora_rank) if lora_rank else model


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--micro-batch", type=int, default=8)
    cli.add_argument("--lora-rank", type=int, default=16)
    cli.add_argument("--prompt-len", type=int, default=100)
    cli.add_argument("--max-new-tokens", type=int, default=40)
    cli.add_argument("--rollouts", type=int, default=16 * 8)
    cli = cli.parse_args()
    gib = 1024 ** 3
    terms = ("weights", "gradients", "optimizer", "activations", "logits", "kv_cache", "rollout_logits")
    print("| model | training | checkpointing | parameters | trained | " + " | ".join(terms) + " | total GiB |\n"
          + "|---" * (len(terms) + 6) + "|")
    totals: dict[str, float] = {}
    for lora_rank in (0, cli.lora_rank):
        mode = f"LoRA r={lora_rank}" if lora_rank else "full"
        for checkpointing in (False, True):
            for name in PAPER_PAIR:
                work = hardware.Workload(cli.rollouts, cli.prompt_len, cli.max_new_tokens, cli.micro_batch,
                                         cli.rollouts, checkpointing)
                est = hardware.estimate(meta_model(name, lora_rank), work)
                key = f"{mode}, checkpointing {'on' if checkpointing else 'off'}"
                totals[key] = totals.get(key, 0.0) + est.total_bytes / gib
                print(f"| {name} | {mode} | {'on' if checkpointing else 'off'} | {est.parameters / 1e9:.2f}B "
                      f"| {est.trainable / 1e6:.1f}M | " + " | ".join(f"{est.bytes[t] / gib:.2f}" for t in terms)
                      + f" | {est.total_bytes / gib:.1f} |")
    print("\npair total (GiB): " + "; ".join(f"{key}: {t:.1f}" for key, t in totals.items()))

if __name__ == "__main__":
    main()
