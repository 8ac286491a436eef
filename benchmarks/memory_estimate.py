"""The memory arithmetic of the paper pair (Qwen2.5-7B + Llama-3.1-8B) on one GPU, with and without LoRA, and a
measurement that checks it.

The two models are built on the meta device from their published configurations (no weights, no hub), in
bf16, and `costs.estimate` adds up weights, gradients, AdamW state and step, activations, logits and the
rollouts' KV cache at the default run's shapes (16 prompts x 8 completions, 40 new tokens, each prompt computed
once for its completions in the update); the total is the peak over phases that do not overlap
(`costs.Estimate.total_bytes`).

The check: each configuration narrowed 16 times in width (hidden size, head size, MLP width, vocabulary and LoRA rank
divided by 16; depth, heads and tokens kept) is built on the CPU with random weights, and one GRPO update of one
micro-batch (groups of --group-size completions of one prompt) is measured with `measure_update` below (every tensor
storage the forward, backward and AdamW step create, alive at the peak, plus weights and AdamW state). The last column
is the estimate of that narrowed model divided by its measurement. Rows with gradient checkpointing are not measured
(the recomputation makes the CPU run several times longer on a shared machine), and their estimate is the least
checked: the transients of the backward's recomputation are not counted.

    python -m benchmarks.memory_estimate [--micro-batch 8] [--group-size 8] [--lora-rank 16] [--prompt-len 100]
                                         [--no-measure] [--training {full,lora,both}]
"""

import argparse
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpo
from args import Args
from testbed import costs
from testbed import lora


class LiveTensorBytes(TorchDispatchMode):
    """While on, the bytes of tensor storage that operators create and that are still alive, and their peak.

    Each storage is counted once from the operator that made it until it is freed; a view or in-place result
    shares a storage of the operator's inputs and is not new, so storages made before the mode (the parameters,
    and what autograd saves of them) are not counted. Measures a CPU run, where PyTorch keeps no allocator
    statistics, and counts tensor storage only (no allocator rounding or fragmentation).
    """

    def __init__(self):
        super().__init__()
        self.alive: set[int] = set()
        self.now = self.peak = 0

    def _freed(self, key: int, nbytes: int) -> None:
        self.alive.discard(key)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()  # one Python object per storage while it lives
                key, nbytes = id(storage), storage.nbytes()
                if key not in self.alive and key not in inputs:
                    self.alive.add(key)
                    self.now += nbytes
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, key, nbytes)
        return out


def measure_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: grpo.TrainBatch,
                   micro_batch: int) -> int:
    """Peak bytes of one `grpo.grpo_step` measured: the weights and optimizer state as they are (take a first
    step before, so AdamW's moments exist) plus the peak of what the step creates (activations, logits,
    gradients, the optimizer's transients)."""
    optimizer.zero_grad(set_to_none=True)
    resident = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    resident |= {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                 for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)}
    with LiveTensorBytes() as live:
        grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=micro_batch)
    return sum(resident.values()) + live.peak


# the fields of Qwen/Qwen2.5-7B-Instruct's and meta-llama/Llama-3.1-8B-Instruct's config.json that fix the sizes
PAPER_PAIR = {
    "Qwen2.5-7B": (Qwen2Config, Qwen2ForCausalLM, dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                                     num_hidden_layers=28, num_attention_heads=28,
                                                     num_key_value_heads=4, tie_word_embeddings=False)),
    "Llama-3.1-8B": (LlamaConfig, LlamaForCausalLM, dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                                        num_hidden_layers=32, num_attention_heads=32,
                                                        num_key_value_heads=8, tie_word_embeddings=False)),
}
NARROWING = 16
TERMS = ("weights", "gradients", "optimizer", "optimizer_step", "activations", "recompute", "logits",
         "update_kv_cache", "kv_cache", "rollout_logits")


def build(name: str, lora_rank: int, checkpointing: bool, narrowing: int = 1) -> torch.nn.Module:
    """The model in bf16: on the meta device at full size, or with random weights on the CPU when narrowed."""
    config_cls, model_cls, fields = PAPER_PAIR[name]
    if narrowing > 1:
        fields = {**fields, **{k: fields[k] // narrowing for k in ("vocab_size", "hidden_size", "intermediate_size")}}
    torch.manual_seed(0)
    with torch.device("meta" if narrowing == 1 else "cpu"):
        model = model_cls(config_cls(**fields)).to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable()
    rank = max(1, lora_rank // narrowing)
    return (lora.add_lora(model, rank, 2 * rank) if lora_rank else model).train()


def measured_ratio(name: str, lora_rank: int, checkpointing: bool, work: costs.Workload) -> float:
    """Estimate / measurement of one update of one micro-batch on the narrowed model: its rows in groups of
    `work.group_size` completions of one prompt; where there are several prompts, of different lengths (the
    attention mask pads)."""
    model = build(name, lora_rank, checkpointing, NARROWING)
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    n, group = work.micro_batch, work.group_size
    distinct = [torch.randint(vocab, (work.prompt_len - u,), generator=gen).tolist() for u in range(-(-n // group))]
    prompts = [distinct[i // group] for i in range(n)]
    completions = [torch.randint(vocab, (work.max_new_tokens,), generator=gen).tolist() for _ in range(n)]
    batch = grpo.build_batch(prompts, completions, [torch.ones(work.max_new_tokens)] * n, pad_id=0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=n)   # AdamW's moments exist from here
    measured = measure_update(model, optimizer, batch, micro_batch=n)
    narrowed = costs.Workload(n, work.prompt_len, work.max_new_tokens, n, n, checkpointing, group_size=group)
    return costs.estimate(model, narrowed).total_bytes / measured


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--micro-batch", type=int, default=8)
    cli.add_argument("--group-size", type=int, default=Args.group_size, help="completions of one prompt")
    cli.add_argument("--lora-rank", type=int, default=16)
    cli.add_argument("--prompt-len", type=int, default=100)
    cli.add_argument("--max-new-tokens", type=int, default=40)
    cli.add_argument("--rollouts", type=int, default=16 * 8)
    cli.add_argument("--no-measure", action="store_true", help="skip the measurement of the narrowed models")
    cli.add_argument("--training", choices=("full", "lora", "both"), default="both", help="which rows to print")
    cli = cli.parse_args()
    gib = 1024 ** 3
    print("| model | training | checkpointing | parameters | trained | " + " | ".join(TERMS) + " | peak GiB | "
          f"estimate / measured at 1/{NARROWING} width |\n" + "|---" * (len(TERMS) + 7) + "|")
    totals: dict[str, float] = {}
    for lora_rank in {"full": (0,), "lora": (cli.lora_rank,), "both": (0, cli.lora_rank)}[cli.training]:
        mode = f"LoRA r={lora_rank}" if lora_rank else "full"
        for checkpointing in (False, True):
            for name in PAPER_PAIR:
                work = costs.Workload(cli.rollouts, cli.prompt_len, cli.max_new_tokens, cli.micro_batch,
                                      cli.rollouts, checkpointing, group_size=cli.group_size)
                est = costs.estimate(build(name, lora_rank, checkpointing), work)
                measure = not (cli.no_measure or checkpointing)
                ratio = f"{measured_ratio(name, lora_rank, checkpointing, work):.3f}" if measure else ""
                key = f"{mode}, checkpointing {'on' if checkpointing else 'off'}"
                totals[key] = totals.get(key, 0.0) + est.total_bytes / gib
                print(f"| {name} | {mode} | {'on' if checkpointing else 'off'} | {est.parameters / 1e9:.2f}B "
                      f"| {est.trainable / 1e6:.1f}M | " + " | ".join(f"{est.bytes[t] / gib:.2f}" for t in TERMS)
                      + f" | {est.total_bytes / gib:.1f} | {ratio} |", flush=True)
    print("\npair peak (GiB): " + "; ".join(f"{key}: {t:.1f}" for key, t in totals.items()))


if __name__ == "__main__":
    main()
