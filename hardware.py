"""Real scale: LoRA adapters, one device per policy, and the memory and time estimate printed at start.

The design card's promise (DESIGN.md §1, §3): `python train.py --pair qwen-llama` runs on one GPU, the paper
pair (7B + 8B) included. What makes that true:
  - LoRA (through peft): only the adapters train, so gradients and AdamW state exist for about half a percent of
    the parameters (40M of a 7B model at rank 16). The KL reference is the same model with its adapters switched off (`WithoutAdapters`), so no
    second copy of the weights is held; reachability's parameter subset becomes the adapters (DESIGN.md §4.8,
    `reachability.parameter_subset(model, "lora")`).
  - `--devices cuda:0,cuda:1` places policy i on device i (round robin when there are fewer devices). Policies on
    distinct CUDA devices roll out and update in parallel threads; they meet only at the exchange.
  - `estimate`: weights, gradients, optimizer state and step, activations of one micro-batch, logits and the
    rollouts' KV cache and logits, from the loaded model's measured parameter counts and its config, and their
    peak over the phases that do not overlap; and the FLOPs of an iteration turned into a lower bound on its
    time by the device's measured matmul throughput. `measure_update` measures the peak of a real update on
    the CPU (`LiveTensorBytes`), which is how the estimate is checked (tests, benchmarks/memory_estimate.py).
"""

from __future__ import annotations

import shutil
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import grpo
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
    accumulates: bool = False
    """several micro-batches per update: gradients live during every forward after the first"""

    @property
    def total_bytes(self) -> int:
        """The peak: what stays resident (weights, their reference copy, AdamW's moments) plus the largest of the
        phases that never overlap. Gradients live from a backward to the next update's zero_grad, so through
        the rollouts (KV cache, behaviour logits) and the optimizer step (its transient), and through a
        micro-batch's forward (activations, logits) only after the first. In the backward the activations are
        freed as gradients appear, except under checkpointing, where a recomputed block joins them."""
        b = self.bytes
        resident = b["weights"] + b["reference"] + b["optimizer"]
        forward = b["activations"] + b["logits"] + (b["gradients"] if self.accumulates else 0)
        backward = b["activations"] + b["recompute"] + b["gradients"] if b["recompute"] else 0
        return resident + max(b["gradients"] + b["kv_cache"] + b["rollout_logits"], forward, backward,
                              b["gradients"] + b["optimizer_step"])


def text_config(model: torch.nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def adapter_widths(model: torch.nn.Module) -> tuple[int, int, int]:
    """(sum of in_features, sum of ranks, element size) over every peft LoRA adapter of the model."""
    adapters = [a for m in model.modules() if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
                for a in m.lora_A.values()]
    return (sum(a.in_features for a in adapters), sum(a.out_features for a in adapters),
            adapters[0].weight.element_size() if adapters else 0)


def activation_bytes(model: torch.nn.Module, micro_batch: int, seq: int, checkpointing: bool) -> tuple[int, int]:
    """(kept, recomputed): what one micro-batch's forward saves for the backward, logits excepted, and what a
    block saves again while the backward recomputes it under gradient checkpointing (else 0). Counted tensor by
    tensor with saved-tensor hooks on transformers' Llama / Qwen2 and peft; tests/test_hardware.py measures it.

    Per token and layer, in the model's element size s unless said:
      - each RMSNorm: a float32 copy of its input (4h bytes whatever s) and its rsqrt (4 bytes); where the norm
        weights train, also the normalized input before and after the weight (2 s h);
      - attention: q, k, v and the output at full heads (with a padding mask, transformers' SDPA path expands k
        and v by repeat_kv, so grouped-query attention saves nothing), the float32 logsumexp per head, and the
        B x 1 x T x T mask (T elements per token);
      - the gated MLP: gate, up and the activated gate (3 I), and the down projection's input (I) where the
        linear weights train;
      - LoRA (peft keeps adapters in float32): each adapted linear saves a float32 copy of its input and the
        adapter's rank-r hidden (in a float32 model the copies are the inputs themselves, see below).
    The final norm counts like a block's. With gradient checkpointing the blocks keep only their inputs through
    the forward, and one block's worth lives again while the backward recomputes it.
    """
    cfg = text_config(model)
    size = next(model.parameters()).element_size()
    base_trains = any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)
    hidden, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    intermediate = getattr(cfg, "intermediate_size", None) or 4 * hidden
    norm = 4 * hidden + 4 + (2 * size * hidden if base_trains else 0)
    attention = 4 * heads * head_dim * size + 4 * heads + seq * size
    mlp = (4 if base_trains else 3) * intermediate * size
    adapter_in, adapter_rank, adapter_size = adapter_widths(model)
    if adapter_size == size:
        # peft's cast to the adapters' dtype is a no-op, so adapted linears that share an input share its storage:
        # add_lora's all-linear adapters keep the two norms' outputs and the down projection's input (o_proj's
        # input is the attention output, kept already)
        adapter_in = min(adapter_in, layers * (2 * hidden + intermediate))
    adapters = adapter_size * (adapter_in + adapter_rank)  # all layers together
    per_layer = 2 * norm + attention + mlp
    tokens = micro_batch * seq
    if checkpointing:
        return tokens * (layers * hidden * size + norm), tokens * (per_layer + adapters // layers)
    return tokens * (layers * per_layer + adapters + norm), 0


def estimate(model: torch.nn.Module, work: Workload) -> Estimate:
    """Peak memory terms and FLOPs of one iteration of one policy.

    Weights (and their frozen copy when it is the KL reference), gradients (trainable only) and AdamW's two
    moments are measured from the model's parameters; AdamW's foreach step allocates a transient as large as
    the trainable parameters. Activations are `activation_bytes`. The logits peak holds four float32 copies
    during the entropy computation (the scaled logits, their log-softmax, its exp and the product), over the
    completion positions only: the update projects no prompt position onto the vocabulary (grpo.logits_from).
    The KV cache holds keys and values of every layer for all rollouts, and generation keeps every step's
    float32 logits for the behaviour log-probs. The FLOPs count one pass of rollouts and one forward and backward of the update
    over the parameters that multiply, the matrices (the input embedding is a lookup unless tied to the head;
    norm weights and biases are elementwise; attention's own products are left out): a lower bound
    (no epochs, KL reference, receiver log-probs or recomputation).
    """
    cfg = text_config(model)
    params = list(model.parameters())
    size = params[0].element_size()
    n_params = sum(p.numel() for p in params)
    trainable_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    layers, vocab = cfg.num_hidden_layers, cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    seq = work.prompt_len + work.max_new_tokens
    weights = sum(p.numel() * p.element_size() for p in params)
    kept, recomputed = activation_bytes(model, work.micro_batch, seq, work.gradient_checkpointing)
    memory = {"weights": weights,
              "reference": weights if work.reference_copy else 0,
              "gradients": trainable_bytes,
              "optimizer": 2 * trainable_bytes,
              "optimizer_step": trainable_bytes,
              "activations": kept,
              "recompute": recomputed,
              "logits": 4 * work.micro_batch * work.max_new_tokens * vocab * 4,
              "kv_cache": kv_cache_bytes(layers, kv_heads, head_dim, work.rollouts, seq, size),
              "rollout_logits": work.rollouts * work.max_new_tokens * vocab * 4}
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    multiplying = sum(p.numel() for p in params if p.ndim == 2) - (embedding.numel() if embedding is not head else 0)
    backward = 2 + (2 if trainable == n_params else 0)  # activation gradients always, weight gradients if trained
    flops = 2 * multiplying * work.rollouts * seq + (2 + backward) * multiplying * work.train_sequences * seq
    return Estimate(n_params, trainable, memory, float(flops), work.train_sequences > work.micro_batch)


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
