"""What an iteration costs a policy: the memory and time estimate printed at start (DESIGN.md §1, §3).

The design card's promise: `python train.py --pair qwen-llama` runs on one GPU, the paper pair (7B + 8B) included,
with LoRA (lora.py). `estimate` says whether it does before the first iteration: weights, gradients, optimizer
state and step, activations of one micro-batch, logits and the rollouts' KV cache and logits, from the loaded
model's measured parameter counts and its config, and their peak over the phases that do not overlap; and the
FLOPs of an iteration turned into a lower bound on its time by the device's measured matmul throughput.
benchmarks/memory_estimate.py measures the peak of a real update on the CPU, which is how the estimate is checked
(tests too).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch

from testbed import policies


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
    group_size: int = 1     # rows of one prompt a micro-batch holds together, at least (train.workload)


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
        micro-batch's forward (activations, logits, the update's KV cache) only after the first. In the backward
        the activations are freed as gradients appear, except under checkpointing, where a recomputed block joins
        them; at its end a trained embedding tied to the head holds the head's and the lookup's gradients beside
        their sum."""
        b = self.bytes
        resident = b["weights"] + b["reference"] + b["optimizer"]
        forward = (b["activations"] + b["logits"] + b["update_kv_cache"]
                   + (b["gradients"] if self.accumulates else 0))
        backward = b["activations"] + b["recompute"] + b["gradients"] if b["recompute"] else 0
        return resident + max(b["gradients"] + b["kv_cache"] + b["rollout_logits"], forward, backward,
                              b["gradients"] + b["tied_gradients"], b["gradients"] + b["optimizer_step"])


def text_config(model: torch.nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def adapter_widths(model: torch.nn.Module) -> tuple[int, int, int]:
    """(sum of in_features, sum of ranks, element size) over every peft LoRA adapter of the model."""
    adapters = [a for m in model.modules() if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
                for a in m.lora_A.values()]
    return (sum(a.in_features for a in adapters), sum(a.out_features for a in adapters),
            adapters[0].weight.element_size() if adapters else 0)


def update_tokens(work: Workload, rows: int) -> tuple[int, int]:
    """(prompt tokens, completion tokens) the update's forward computes for `rows` of its sequences: a
    micro-batch computes each of its prompts once for that prompt's rows in it (sequences.completion_logprobs),
    counted here as one prompt per `group_size` rows; under gradient checkpointing, which keeps no KV cache to
    share, every row whole."""
    if work.gradient_checkpointing:
        return rows * work.prompt_len, rows * work.max_new_tokens
    return -(-rows // work.group_size) * work.prompt_len, rows * work.max_new_tokens


def activation_bytes(model: torch.nn.Module, work: Workload) -> tuple[int, int]:
    """(kept, recomputed): what one micro-batch's forward saves for the backward, logits excepted, and what a
    block saves again while the backward recomputes it under gradient checkpointing (else 0). Counted tensor by
    tensor with saved-tensor hooks on transformers' Llama / Qwen2 and peft; tests/test_costs.py measures it.

    Per token and layer, in the model's element size s unless said:
      - each RMSNorm: a float32 copy of its input (4h bytes whatever s) and its rsqrt (4 bytes); where the norm
        weights train, also the normalized input before and after the weight (2 s h);
      - attention: q, k, v and the output at full heads (with a padding mask, transformers' SDPA path expands k
        and v by repeat_kv, so grouped-query attention saves nothing), the float32 logsumexp per head, and the
        mask's row over the keys the token attends to (its prompt's and its own positions);
      - the gated MLP: gate, up and the activated gate (3 I), and the down projection's input (I) where the
        linear weights train;
      - LoRA (peft keeps adapters in float32): each adapted linear saves a float32 copy of its input and the
        adapter's rank-r hidden (in a float32 model the copies are the inputs themselves, see below).
    The final norm counts like a block's. Where a prompt goes through once for its completions (`update_tokens`),
    each completion row keeps its prompt's keys and values again, expanded to full heads for its attention (the
    repeated KV cache itself is not saved: `estimate` counts it beside). With gradient checkpointing the blocks keep
    only their inputs through the forward, and one block's worth lives again while the backward recomputes it.
    """
    cfg = text_config(model)
    size = next(model.parameters()).element_size()
    base_trains = any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)
    hidden, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    intermediate = getattr(cfg, "intermediate_size", None) or 4 * hidden
    norm = 4 * hidden + 4 + (2 * size * hidden if base_trains else 0)
    attention = 4 * heads * head_dim * size + 4 * heads
    mlp = (4 if base_trains else 3) * intermediate * size
    adapter_in, adapter_rank, adapter_size = adapter_widths(model)
    if adapter_size == size:
        # peft's cast to the adapters' dtype is a no-op, so adapted linears that share an input share its storage:
        # add_lora's all-linear adapters keep the two norms' outputs and the down projection's input (o_proj's
        # input is the attention output, kept already)
        adapter_in = min(adapter_in, layers * (2 * hidden + intermediate))
    adapters = adapter_size * (adapter_in + adapter_rank)  # all layers together
    per_layer = 2 * norm + attention + mlp                 # a token's, beside its mask row
    seq, rows = work.prompt_len + work.max_new_tokens, work.micro_batch
    prompt_tokens, completion_tokens = update_tokens(work, rows)
    tokens = prompt_tokens + completion_tokens
    if work.gradient_checkpointing:
        return tokens * (layers * hidden * size + norm), tokens * (per_layer + seq * size + adapters // layers)
    masks = layers * size * (prompt_tokens * work.prompt_len + completion_tokens * seq)
    repeated_prompts = layers * rows * work.prompt_len * 2 * heads * head_dim * size
    return tokens * (layers * per_layer + adapters + norm) + masks + repeated_prompts, 0


def estimate(model: torch.nn.Module, work: Workload) -> Estimate:
    """Peak memory terms and FLOPs of one iteration of one policy.

    Weights (and their frozen copy when it is the KL reference), gradients (trainable only) and AdamW's two
    moments are measured from the model's parameters; AdamW's foreach step allocates a transient as large as
    the trainable parameters; a trained embedding tied to the head adds two gradients of its size at the end
    of the backward (the head's and the lookup's, beside their sum). Activations are `activation_bytes`. The
    logits peak holds four float32 copies during the entropy computation (the scaled logits, their log-softmax,
    its exp and the product), over the completion positions only: the update projects no prompt position onto
    the vocabulary (sequences.logits_from). The KV cache holds keys and values of every layer for all rollouts,
    and generation keeps every step's float32 logits for the behaviour log-probs; the update's KV cache holds
    them for a micro-batch's rows, its prompts repeated for their completions, until the forward's logits are
    read. The FLOPs count one pass of rollouts and one forward and backward of the update over the parameters
    that multiply, the matrices (the input embedding is a lookup unless tied to the head; norm weights and
    biases are elementwise; attention's own products are left out): a lower bound (no epochs, KL reference,
    receiver log-probs or recomputation).
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
    kept, recomputed = activation_bytes(model, work)
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    tied = embedding is head and embedding.requires_grad
    memory = {"weights": weights,
              "reference": weights if work.reference_copy else 0,
              "gradients": trainable_bytes,
              "optimizer": 2 * trainable_bytes,
              "optimizer_step": trainable_bytes,
              "tied_gradients": 2 * embedding.numel() * embedding.element_size() if tied else 0,
              "activations": kept,
              "recompute": recomputed,
              "logits": 4 * work.micro_batch * work.max_new_tokens * vocab * 4,
              "update_kv_cache": 0 if work.gradient_checkpointing else kv_cache_bytes(
                  layers, kv_heads, head_dim, work.micro_batch, seq, size),
              "kv_cache": kv_cache_bytes(layers, kv_heads, head_dim, work.rollouts, seq, size),
              "rollout_logits": work.rollouts * work.max_new_tokens * vocab * 4}
    flops = sum(iteration_flops(model, work).values())
    return Estimate(n_params, trainable, memory, flops, work.train_sequences > work.micro_batch)


def multiplying_parameters(model: torch.nn.Module) -> int:
    """The parameters that multiply an activation: every matrix but an input embedding not tied to the head (a
    lookup)."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    matrices = sum(p.numel() for p in model.parameters() if p.ndim == 2)
    return matrices - (embedding.numel() if embedding is not head else 0)


def iteration_flops(model: torch.nn.Module, work: Workload) -> dict[str, float]:
    """FLOPs of one iteration's rollouts (one pass over their tokens) and update (a forward and a backward of the
    tokens it computes, `update_tokens`: activation gradients always, weight gradients where every weight trains)."""
    multiplying, seq = multiplying_parameters(model), work.prompt_len + work.max_new_tokens
    trains_all = all(p.requires_grad for p in model.parameters())
    backward = 2 + (2 if trains_all else 0)
    return {"rollouts": float(2 * multiplying * work.rollouts * seq),
            "update": float((2 + backward) * multiplying * sum(update_tokens(work, work.train_sequences)))}


def curation_flops(model: torch.nn.Module, scope: tuple[list, list | None], diagnosed: int, crossed: int, seq: int,
                   steps: int, window: int | None = None) -> dict[str, float]:
    """FLOPs of one receiver's curation in one iteration, beside `iteration_flops`: CCM's per-step gradient norms
    over `diagnosed` trajectories (peer offers and the receiver's own calibration rollouts) of `seq` tokens and
    `steps` steps each, over `scope` (a CCM estimate's parameters and modules, grad_norms.ccm_scope), and the
    receiver's forward over the `crossed` offers whose tokens it trains on. The norms (grad_norms._rows_sq_norms)
    cost a forward over every matrix; a backward batched over the steps, each step's cotangent multiplying every
    matrix it passes through once (activation gradients only: the scope's matrices and, for `exact`, all below
    them to the lowest trained one); and per weight of the scope the cheaper of its ghost norm, T^2 (steps out +
    in), and its formed per-step gradients, steps T out in. A scope whose one matrix is the head (last:0) has a
    closed form instead (grad_norms._output_sq_norms): no backward, and per trajectory W^2 (V + d) for the two
    Gram matrices and W V d for the norm scale's gradients, W the `window` of positions from the first step on
    (default: all T). Attention's own products, the diagnosis's bookkeeping
    and the norm layers are left out, as in `iteration_flops`."""
    multiplying, (params, modules) = multiplying_parameters(model), scope
    scoped = {id(p) for p in params}
    linears = [m for m in (model.modules() if modules is None else modules) if isinstance(m, torch.nn.Linear)]
    if modules is not None and len(linears) == 1:
        (vocab, width), = [m.weight.shape for m in linears]
        span = seq if window is None else window
        closed = span * span * (vocab + width) + span * vocab * width
        return {"norms: forward": float(2 * multiplying * seq * diagnosed), "norms: batched backward": 0.0,
                "norms: from factors": float(2 * closed * diagnosed),
                "crossing": float(2 * multiplying * seq * crossed)}
    passed = multiplying if modules is None else sum(m.weight.numel() for m in {id(m): m for m in linears}.values())
    ghost = sum(min(seq * seq * (steps * out + inp), steps * seq * out * inp)
                for m in linears if id(m.weight) in scoped for out, inp in [m.weight.shape])
    return {"norms: forward": float(2 * multiplying * seq * diagnosed),
            "norms: batched backward": float(2 * passed * seq * steps * diagnosed),
            "norms: from factors": float(2 * ghost * diagnosed),
            "crossing": float(2 * multiplying * seq * crossed)}


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


def policy_estimate(policy: policies.Policy, work: Workload) -> tuple[str, str, int, int | None]:
    """The start-up estimate of one policy: its printed line (`describe`), the device it lives on (named so that
    policies sharing one device share the name), its bytes, and the device's capacity (CUDA)."""
    est = estimate(policy.model, work)
    flops = matmul_flops_per_s(policy.device, next(policy.model.parameters()).dtype,
                               n=512 if policy.device.type == "cpu" else 4096)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    place = f"{socket.gethostname()} {policy.device}" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible else "")
    capacity = torch.cuda.mem_get_info(policy.device)[1] if policy.device.type == "cuda" else None
    return describe(policy.name, est, flops), place, est.total_bytes, capacity


def describe(name: str, est: Estimate, flops_per_s: float) -> str:
    """One printable line: the memory terms in GiB and the time bound."""
    gib = 1024 ** 3
    terms = ", ".join(f"{k} {v / gib:.2f}" for k, v in est.bytes.items() if v)
    return (f"  {name}: {est.parameters / 1e6:.1f}M parameters, {est.trainable / 1e6:.2f}M trained; memory "
            f"~{est.total_bytes / gib:.2f} GiB ({terms}); >= {est.flops / flops_per_s:.2f} s per iteration "
            f"at the measured {flops_per_s / 1e12:.2f} TFLOP/s (generation is memory-bound: expect more)")
