"""Real scale: LoRA adapters, one device per policy, and the memory and time estimate printed at start.

The design card's promise (DESIGN.md §1, §3): `python train.py --pair qwen-llama` runs on one GPU, the paper
pair (7B + 8B) included. What makes that true:
  - LoRA (through peft): only the adapters train, so gradients and AdamW state exist for about half a percent of
    the parameters (40M of a 7B model at rank 16). The KL reference is the same model with its adapters switched off (`WithoutAdapters`), so no
    second copy of the weights is held; reachability's parameter subset becomes the adapters (DESIGN.md §4.8,
    `reachability.parameter_subset(model, "lora")`).
  - `--devices cuda:0,cuda:1` places policy i on device i (round robin when there are fewer devices). Policies on
    distinct CUDA devices roll out and update in parallel threads; they meet only at the exchange.
  - `estimate`: weights, gradients, optimizer state, activations of one micro-batch, logits and the rollouts'
    KV cache and logits, from the loaded model's measured parameter counts and its config; and the FLOPs of an
    iteration turned into a lower bound on its time by the device's measured matmul throughput.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import torch

import policies

T = TypeVar("T")
R = TypeVar("R")


# ---------------------------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------------------------

def add_lora(model: torch.nn.Module, rank: int, alpha: float, dropout: float = 0.0) -> torch.nn.Module:
    """The model with LoRA adapters on every linear layer of its blocks (not the head); only they train."""
    from peft import LoraConfig, get_peft_model  # imported here: full fine-tuning does not need peft
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear")
    return get_peft_model(model, config)


def has_adapters(model: torch.nn.Module) -> bool:
    return any("lora_" in name for name, _ in model.named_parameters())


class WithoutAdapters:
    """A LoRA model seen with its adapters switched off: the frozen base policy, without a copy of its weights.

    Not an nn.Module on purpose: .eval(), .to() or .parameters() on the reference must not reach the policy.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, **inputs):
        with self.model.disable_adapter(), torch.no_grad():
            return self.model(**inputs)


def reference_policy(model: torch.nn.Module) -> torch.nn.Module | WithoutAdapters:
    """The KL reference: the adapter-free view under LoRA, else a frozen copy of the model as it is now."""
    return WithoutAdapters(model) if has_adapters(model) else policies.frozen_copy(model)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps: the whole state when every parameter trains, only the adapters under LoRA (the
    frozen base is reloaded from where it came from)."""
    if all(p.requires_grad for p in model.parameters()):
        return model.state_dict()
    return {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.nn.Parameter) and v.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Restore `trainable_state`; a checkpoint of another shape or adapter set is refused, naming the cause."""
    hint = "was it saved with other --lora-rank settings?"
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches raise even when not strict
        raise ValueError(f"checkpoint does not match the model ({hint}): {err}") from None
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing):
        raise ValueError(f"checkpoint does not match the model ({hint}): missing trainable "
                         f"{sorted(trainable & set(missing))}, unexpected {sorted(unexpected)}")


# ---------------------------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------------------------

def policy_devices(devices: str | None, n_policies: int) -> list[torch.device]:
    """One device per policy from "cuda:0,cuda:1" (round robin over fewer devices); default: cuda:0 or cpu."""
    names = [d.strip() for d in devices.split(",") if d.strip()] if devices else \
        ["cuda" if torch.cuda.is_available() else "cpu"]
    parsed = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise ValueError(f"--devices: {name!r} is not a torch device ({err})") from None
        missing = not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()
        if device.type == "cuda" and missing:
            raise ValueError(f"--devices: {name} requested but this machine has {torch.cuda.device_count()} CUDA "
                             "devices")
        parsed.append(device)
    return [parsed[i % len(parsed)] for i in range(n_policies)]


def runs_in_parallel(devices: list[torch.device]) -> bool:
    """Threads pay only where every policy has its own CUDA device; on a shared device or the CPU they would
    contend, and CPU sampling from one global generator would no longer be repeatable. (Each CUDA device has its
    own generator, so a parallel run repeats itself, though it samples differently from a one-GPU run.)"""
    return all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices) > 1


@contextmanager
def measured(device: torch.device) -> Iterator[dict[str, float]]:
    """Time one policy's phase on its device, with that device current (threads do not inherit it) and its peak
    memory counter reset; fills `seconds` and, on CUDA, `peak_gib` when the phase ends."""
    cuda = device.type == "cuda"
    out: dict[str, float] = {}
    with torch.cuda.device(device) if cuda else nullcontext():
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        yield out
        if cuda:
            torch.cuda.synchronize(device)
            out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 1024 ** 3
        out["seconds"] = time.perf_counter() - began


def perf_metrics(phase: str, tokens: float, measurement: dict[str, float]) -> dict[str, float]:
    """perf/{phase}_tokens_per_s and, on CUDA, perf/{phase}_peak_gib (all resident weights included)."""
    out = {f"perf/{phase}_tokens_per_s": tokens / measurement["seconds"]}
    if "peak_gib" in measurement:
        out[f"perf/{phase}_peak_gib"] = measurement["peak_gib"]
    return out


def per_policy(fn: Callable[[T], R], items: list[T], parallel: bool) -> list[R]:
    """fn over the policies' items, in order; concurrently in threads when `parallel`."""
    if not parallel:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(fn, items))


# ---------------------------------------------------------------------------------------------------------------
# Memory and time estimate
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """The shapes of one iteration for one policy."""

    rollouts: int           # B*G sequences sampled at once
    prompt_len: int         # tokens of a prompt (the longest)
    max_new_tokens: int
    micro_batch: int        # sequences per forward/backward
    train_sequences: int    # sequences in the update (own and received)
    gradient_checkpointing: bool = False
    reference_copy: bool = False    # a frozen copy of the weights as KL reference (beta > 0 without LoRA)


@dataclass(frozen=True)
class Estimate:
    parameters: int
    trainable: int
    bytes: dict[str, int]
    flops: float            # per iteration: rollouts, the update's forward and backward

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def text_config(model: torch.nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def estimate(model: torch.nn.Module, work: Workload) -> Estimate:
    """Peak memory terms and FLOPs of one iteration of one policy.

    Weights (and their frozen copy when it is the KL reference), gradients (trainable only) and AdamW's two
    moments are measured from the model's parameters. Activations are what a pre-norm block with a fused
    attention kernel and a gated MLP saves for its backward, per token: the inputs and outputs of its two norms,
    q, k and v, the attention output (4h + h + 2 kv + h), and the MLP's gate, up, activated gate and product
    (4 I) elements; with gradient checkpointing, one block's worth plus each block's input. Logits are held in
    float32 about three times (logits, log-softmax, its gradient). The KV cache holds keys and values of every
    layer for all rollouts, and generation keeps every step's float32 logits for the behaviour log-probs. The
    FLOPs count one pass of rollouts and one forward and backward of the update: a lower bound (no epochs, KL
    reference, receiver log-probs or recomputation).
    """
    cfg = text_config(model)
    params = list(model.parameters())
    size = params[0].element_size()
    n_params = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    hidden, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    seq = work.prompt_len + work.max_new_tokens
    intermediate = getattr(cfg, "intermediate_size", None) or 4 * hidden
    per_layer = (6 * hidden + 2 * kv_heads * head_dim + 4 * intermediate) * seq * work.micro_batch * size
    activations = (per_layer + layers * seq * work.micro_batch * hidden * size if work.gradient_checkpointing
                   else layers * per_layer)
    weights = sum(p.numel() * p.element_size() for p in params)
    memory = {"weights": weights,
              "reference": weights if work.reference_copy else 0,
              "gradients": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
              "optimizer": 2 * sum(p.numel() * p.element_size() for p in params if p.requires_grad),
              "activations": activations,
              "logits": 3 * work.micro_batch * seq * vocab * 4,
              "kv_cache": kv_cache_bytes(layers, kv_heads, head_dim, work.rollouts, seq, size),
              "rollout_logits": work.rollouts * work.max_new_tokens * vocab * 4}
    backward = 2 + (2 if trainable == n_params else 0)  # activation gradients always, weight gradients if trained
    flops = 2 * n_params * work.rollouts * seq + (2 + backward) * n_params * work.train_sequences * seq
    return Estimate(n_params, trainable, memory, float(flops))


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, sequences: int, length: int, element_size: int) -> int:
    """Keys and values of every layer for `sequences` of `length` tokens."""
    return 2 * layers * kv_heads * head_dim * sequences * length * element_size


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """The device's achieved dense matmul throughput, measured on n x n operands (a fraction of a second)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * n ** 3 * repeats / (time.perf_counter() - start)


def describe(name: str, est: Estimate, flops_per_s: float) -> str:
    """One printable line: the memory terms in GiB and the time bound."""
    gib = 1024 ** 3
    terms = ", ".join(f"{k} {v / gib:.2f}" for k, v in est.bytes.items() if v)
    return (f"  {name}: {est.parameters / 1e6:.1f}M parameters, {est.trainable / 1e6:.2f}M trained; memory "
            f"~{est.total_bytes / gib:.2f} GiB ({terms}); >= {est.flops / flops_per_s:.2f} s per iteration "
            f"at the measured {flops_per_s / 1e12:.2f} TFLOP/s (generation is memory-bound: expect more)")


# ---------------------------------------------------------------------------------------------------------------
# A run's policies and their checkpoints (train.py builds and saves them, eval.py rebuilds and loads them)
# ---------------------------------------------------------------------------------------------------------------

def build_policies(args, scale: str, devices: list[torch.device], task_cfg) -> list[policies.Policy]:
    """The run's policies as training starts: loaded (tiny warm-ups from the cache), adapters and checkpointing
    as configured. `args` has train.Args' fields: train.py builds them from its Args, eval.py rebuilds a finished
    run's from its config.json."""
    model_paths = dict(item.split("=", 1) for item in args.model_paths)
    pols = policies.load_policies(args.pair, scale, devices, task_cfg, args.seed, args.cache_dir,
                                  model_paths, args.warmup_scale, args.model_dir)
    for p in pols:
        p.model.train()  # from_pretrained leaves eval mode, in which transformers skips gradient checkpointing
        if args.lora_rank:
            p.model = add_lora(p.model, args.lora_rank, args.lora_alpha)
        if args.gradient_checkpointing:
            p.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return pols


def save_checkpoint(run_dir: Path, iteration: int, pols: list[policies.Policy],
                    optimizers: list[torch.optim.Optimizer], state: object = None) -> None:
    """Write iteration's checkpoint in full (with `state`, the run's other state, if any), then point `latest` at
    it, then drop older ones."""
    root = run_dir / "checkpoints"
    target = root / f"iter-{iteration:06d}"
    target.mkdir(parents=True, exist_ok=True)
    for policy, optimizer in zip(pols, optimizers):
        torch.save({"model": trainable_state(policy.model), "optimizer": optimizer.state_dict()},
                   target / f"{policy.name}.pt")
    if state is not None:
        torch.save(state, target / "state.pt")
    tmp = root / "latest.tmp"
    tmp.write_text(target.name)
    tmp.replace(root / "latest")
    for old in root.glob("iter-*"):
        if old != target:
            shutil.rmtree(old)


def load_checkpoint(run_dir: Path, pols: list[policies.Policy], optimizers: list[torch.optim.Optimizer] | None
                    ) -> tuple[int, object]:
    """Restore the last checkpoint (the optimizers too, unless None); returns how many iterations it had done and
    the run's other state saved with it (None if none was)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.exists():
        raise FileNotFoundError(f"{run_dir} has no checkpoint")
    folder = latest.parent / latest.read_text().strip()
    for i, policy in enumerate(pols):
        state = torch.load(folder / f"{policy.name}.pt", map_location=policy.device)
        load_trainable_state(policy.model, state["model"])
        if optimizers is not None:
            optimizers[i].load_state_dict(state["optimizer"])
    other = torch.load(folder / "state.pt", weights_only=False) if (folder / "state.pt").exists() else None
    return int(folder.name.split("-")[1]), other
