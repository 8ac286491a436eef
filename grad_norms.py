"""Exact per-step gradient norms of a causal LM (proposal §1.2): what CCM's reachability R_k is read from
(reachability.py).

For step k of a trajectory, L_k is the mean teacher-forced NLL of its tokens given the whole prefix, and its norm
sqrt(|k|) * ||grad L_k||_2 is taken over a scope of parameters (`ccm_scope`: every trainable one, or the head and
the last N blocks, DESIGN.md §4.8).

Exact per-step norms need one vector-Jacobian product per step. In a causal model every step's loss depends on the
parameters through all earlier positions, so a single backward of a masked or summed loss returns sum_k grad L_k,
from which no ||grad L_k|| can be recovered. `step_grad_norms_loop` is the reference, one backward per step.
`step_grad_norms` runs one forward with hooks recording the input x and output y of every module owning a scope
parameter, then one backward batched over unit cotangents, one per step (is_grads_batched=True; with trajectories
batched, one per step index, below), down to those outputs only, so no per-step weight gradient is formed there.
The norms follow exactly from d_k = dL_k/dy: a Linear weight's gradient is d_k^T x, and by the ghost-norm identity
||d_k^T x||_F^2 = sum((d_k d_k^T) * (x x^T)), x x^T [T, T] shared by all K steps; this is used where
T^2 (K out + in) < K T out in, else d_k^T x is formed. An embedding's gradient is onehot(ids)^T d_k, and a tied
embedding/head matrix sums both calls before the norm (cross terms included). A Linear bias's gradient is d_k
summed over positions, and a norm scale's (y = w * h) is d_k * h summed likewise.

Trajectories are batched: rows do not interact, so one cotangent per step index j (the sum of every row's j-th step
loss) gives each row its own j-th step's gradient (benchmarks/reachability_bench.py times it). A scope of the final
norm and the head alone (last:0) needs no backward: its norms follow in closed form from the forward's
probabilities and the head's inputs (`_output_sq_norms`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


def output_side(model: torch.nn.Module) -> tuple[torch.nn.ModuleList, torch.nn.Module, torch.nn.Module]:
    """A causal LM's blocks, final norm and head, through a LoRA wrapper (peft) where there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.layers, base.model.norm, base.lm_head


def parameter_subset(model: torch.nn.Module, subset: str) -> list[torch.nn.Parameter]:
    """The parameters gradient norms are taken over: "all" trainable ones, or the "lora" adapters."""
    if subset == "all":
        return [p for p in model.parameters() if p.requires_grad]
    if subset == "lora":
        params = [p for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
        if not params:
            raise ValueError("subset 'lora' but the model has no trainable LoRA parameters")
        return params
    raise ValueError(f"unknown parameter subset {subset!r}: use 'all' or 'lora' (fewer blocks: ccm_scope)")


def estimate_blocks(estimate: str) -> int | None:
    """The blocks a CCM estimate differentiates: None for "exact" (all), N for "last:N"."""
    if estimate == "exact":
        return None
    if not estimate.startswith("last:") or not estimate[5:].isdigit():
        raise ValueError(f"unknown CCM estimate {estimate!r}: use 'exact' or 'last:N' (N >= 0 blocks)")
    return int(estimate[5:])


def ccm_scope(model: torch.nn.Module, estimate: str
              ) -> tuple[list[torch.nn.Parameter], list[torch.nn.Module] | None]:
    """The parameters a CCM estimate takes the gradient norm over, and the modules whose calls count (None: every
    module owning one of them).

    "exact": every trainable parameter (the adapters under LoRA). "last:N", N >= 0: every weight of the final
    norm, the head and the last N blocks, trainable or frozen (under LoRA, the base weights beside the adapters),
    the head counted as the output layer alone: with a tied embedding only the head's call of the shared matrix
    counts, so nothing below block L-N is differentiated (last:0 needs no backward through any block). What it
    gives up: the gradient of every earlier block and of the lookup, where a step's dependence on its prefix
    enters.
    """
    n_blocks = estimate_blocks(estimate)
    if n_blocks is None:
        return parameter_subset(model, "all"), None
    layers, norm, head = output_side(model)
    if n_blocks > len(layers):
        raise ValueError(f"CCM estimate {estimate!r}: the model has {len(layers)} blocks")
    tops = [*layers[len(layers) - n_blocks:], norm, head]
    modules = [m for top in tops for m in top.modules()]
    return list({id(p): p for m in modules for p in m.parameters(recurse=False)}.values()), modules


def step_losses(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                steps: list[list[tuple[int, int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced mean NLL of every step, and the steps' token counts.

    input_ids, attention_mask [B, L]; steps[b] lists, for trajectory b, each step's token positions [a, c) in
    input_ids (the tokens predicted, so a >= 1). Returns losses [K] and sizes [K], K = all steps of all b.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()           # [B, L, V]
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    losses, sizes = [], []                                                                       # nll [B, L-1]
    for b, spans in enumerate(steps):
        for a, c in spans:
            if not 1 <= a < c <= input_ids.shape[1]:
                raise ValueError(f"step [{a}, {c}) of trajectory {b} is empty or outside its "
                                 f"{input_ids.shape[1]} tokens")
            losses.append(nll[b, a - 1:c - 1].mean())
            sizes.append(c - a)
    if not losses:
        raise ValueError("no steps to score")
    return torch.stack(losses), torch.tensor(sizes, dtype=torch.float32)


class _Call(NamedTuple):
    """One forward call of a module owning subset parameters: its inputs (detached) and output."""
    module: torch.nn.Module
    inputs: tuple
    output: torch.Tensor


def _record_calls(model: torch.nn.Module, params: list[torch.nn.Parameter], modules: list[torch.nn.Module] | None
                  ) -> tuple[list[_Call], list]:
    """Forward hooks on every module (of `modules`, if given) that directly owns a subset parameter; a module
    called twice (a tied head and embedding share one matrix) is recorded twice."""
    wanted, calls, handles = {id(p) for p in params}, [], []

    def hook(module, inputs, output):
        calls.append(_Call(module, tuple(x.detach() for x in inputs), output))
    for module in model.modules() if modules is None else modules:
        if any(id(p) in wanted for p in module.parameters(recurse=False)):
            handles.append(module.register_forward_hook(hook))
    return calls, handles


def _factors(call: _Call, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(left, right) with the weight gradient of step j of row b = left[j, b]^T right[j, b], the rows' own side
    shared by all steps ([1, B, ...]).

    d [J, B, ..., out] = dL/d output. Linear: y = x W^T, so grad W = d^T x: ([J, B, T, out], [1, B, T, in]).
    Embedding: y = E[ids], so grad E = onehot(ids)^T d: (ids [B, T], the one-hot never formed, [J, B, T, dim]);
    positions at padding_idx get no gradient.
    """
    steps, rows, x = d.shape[0], d.shape[1], call.inputs[0]
    if isinstance(call.module, torch.nn.Embedding):
        ids = x.reshape(rows, -1)
        right = d.reshape(steps, rows, ids.shape[1], -1)
        if call.module.padding_idx is not None:
            right = right * (ids != call.module.padding_idx).unsqueeze(-1)
        return ids, right
    return d.reshape(steps, rows, -1, d.shape[-1]), x.reshape(1, rows, -1, x.shape[-1])


def _gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[J or 1, B, Ta, Tb] a b^T per row, a one-hot given as ids [B, T] never materialized."""
    if a.dim() == 2 and b.dim() == 2:
        return (a.unsqueeze(2) == b.unsqueeze(1)).float().unsqueeze(0)
    if a.dim() == 2:
        return _gram(b, a).transpose(2, 3)
    if b.dim() == 2:                                                   # a onehot(b)^T: a's columns b
        return a.gather(3, b[None, :, None, :].expand(a.shape[0], -1, a.shape[2], -1))
    return a @ b.transpose(2, 3)


def _weight_sq_norms(factors: list[tuple[torch.Tensor, torch.Tensor]], shape: torch.Size, steps: int
                     ) -> torch.Tensor:
    """[J, B] ||sum_u left_u^T right_u||_F^2 per step and row: the weight's gradient summed over its calls (tied).

    The ghost norm ||D^T X||^2 = sum((D D^T) * (X X^T)) costs T^2 (J out + in) per row with X X^T shared by the
    steps, forming the gradients J T out in: the cheaper one is used.
    """
    positions = sum(right.shape[2] for _, right in factors)                # each call's T
    rows = factors[0][1].shape[1]
    if positions * (shape[0] + shape[1] / steps) < shape[0] * shape[1]:
        return sum((_gram(lu, lv).to(ru.dtype) * _gram(ru, rv).to(ru.dtype)).sum((2, 3))
                   for lu, ru in factors for lv, rv in factors).expand(steps, rows)
    grad = torch.zeros(steps, rows, *shape, dtype=factors[0][1].dtype, device=factors[0][1].device)  # [J, B, out, in]
    for left, right in factors:
        if left.dim() == 2:
            grad.scatter_add_(2, left[None, :, :, None].expand(steps, -1, -1, shape[1]),
                              right.expand(steps, -1, -1, -1))
        else:
            grad += left.transpose(2, 3) @ right
    return grad.pow(2).sum((2, 3))


def _scale_grads(call: _Call, d: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per parameter of a module that is neither Linear nor Embedding, [J, B, *shape] its gradient per step
    and row, for the one form such modules take here: y = w * h(x), an elementwise scale (RMSNorm). h is the
    module's output with w set to ones, and y == w * h is checked bit for bit, so any other form raises."""
    from torch.func import functional_call
    grads = {}
    for name, w in call.module.named_parameters(recurse=False):
        h = functional_call(call.module, {name: torch.ones_like(w)}, call.inputs)
        if h.shape[h.dim() - w.dim():] != w.shape or not torch.equal(w.detach() * h, call.output.detach()):
            raise ValueError(f"{type(call.module).__name__}.{name} is not an elementwise scale of the module's output: "
                             "its per-step gradient norms cannot be taken from one batched backward")
        prod = (d * h).flatten(2, d.dim() - w.dim() - 1)                                         # [J, B, T, *shape]
        grads[id(w)] = prod.sum(2)
    return grads


def _into_the_graph(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """The token lookup's output, made to require grad where nothing below it does: under LoRA the lookup is frozen,
    and where "last:N" measures every block the lowest block's frozen norm and projections would see no input in
    the graph. Gradients still stop at the recorded outputs, so nothing more is differentiated."""
    return output if output.requires_grad else output.requires_grad_(True)


def _rows_sq_norms(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   steps: list[list[tuple[int, int]]], params: list[torch.nn.Parameter],
                   modules: list[torch.nn.Module] | None) -> torch.Tensor:
    """[J, B] ||grad L_{b,j}||^2 for step j of row b (0 where row b has fewer steps); input_ids [B, L].

    One forward; one backward batched over J cotangents, cotangent j the sum of every row's step-j loss. Rows do
    not interact in the model, so the gradient reaching row b's activations is that of L_{b,j} alone. It runs
    down to the recorded modules' outputs only, so no weight gradient is formed there; then each weight's squared
    norms per step and row from its modules' inputs and output gradients.
    """
    length = max(c for spans in steps for _, c in spans)             # causal: later tokens change no L_k
    calls, handles = _record_calls(model, params, modules)
    handles.append(model.get_input_embeddings().register_forward_hook(_into_the_graph))
    try:
        losses, _ = step_losses(model, input_ids[:, :length], attention_mask[:, :length], steps)   # [K]
    finally:
        for handle in handles:
            handle.remove()
    outside = [type(c.module).__name__ for c in calls if not c.output.requires_grad]
    if outside:
        raise ValueError(f"the outputs of {sorted(set(outside))} depend on neither the tokens nor a trainable weight, "
                         "so no step's gradient reaches them: measure with ccm_estimate 'exact'")
    depth = max(len(spans) for spans in steps)
    index = torch.tensor([j for spans in steps for j in range(len(spans))], device=losses.device)
    cotangents = torch.nn.functional.one_hot(index, depth).T.to(losses.dtype)                 # [J, K]
    grads = torch.autograd.grad(losses, [c.output for c in calls], grad_outputs=cotangents,
                                is_grads_batched=True, allow_unused=True)                        # each [J, B, ...]
    wanted = {id(p): p for p in params}
    factors, dense = {}, {}
    for call, d in zip(calls, grads):
        if d is None:
            continue
        module = call.module
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            if id(module.weight) in wanted:
                factors.setdefault(id(module.weight), []).append(_factors(call, d))
            bias = getattr(module, "bias", None)
            contribution = {} if bias is None else {id(bias): d.flatten(2, -2).sum(2)}           # [J, B, out]
        else:
            contribution = _scale_grads(call, d)
        for key, g in contribution.items():
            if key in wanted:
                dense[key] = dense[key] + g if key in dense else g
    squared = torch.zeros(depth, input_ids.shape[0], dtype=torch.float64, device=losses.device)
    for key, fs in factors.items():
        squared += _weight_sq_norms(fs, wanted[key].shape, depth).double()
    for g in dense.values():
        squared += g.flatten(2).pow(2).sum(2).double()
    return squared


def _is_output_side(model: torch.nn.Module, params: list[torch.nn.Parameter],
                    modules: list[torch.nn.Module] | None) -> bool:
    """Whether the scope is the final norm and a plain Linear head alone (last:0), whose norms have a closed form."""
    if modules is None:
        return False
    _, norm, head = output_side(model)
    outside = {id(m) for m in modules} - {id(m) for top in (norm, head) for m in top.modules()}
    return not outside and type(head) is torch.nn.Linear and any(p is head.weight for p in params)


def _output_sq_norms(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     steps: list[list[tuple[int, int]]], params: list[torch.nn.Parameter]) -> torch.Tensor:
    """[J, B] ||grad L_{b,j}||^2 over the head and the final norm (last:0), from one forward and no backward.

    With y_t the head's input (the final norm's output) at the position predicting token t, p_t its softmax and
    g_t = (p_t - onehot(t)) / |k| = dL_k/dlogits_t for t in step k: the head's weight gradient is sum_t g_t y_t^T,
    so its squared norm is sum over t, t' in k of (g_t . g_t')(y_t . y_t'); a head bias's is ||sum_t g_t||^2; the
    norm's scale w (y = w * h) gets sum_t (g_t W) * h_t, W the head's weight (_scale_grads).
    """
    length = max(c for spans in steps for _, c in spans)             # causal: later tokens change no L_k
    for b, spans in enumerate(steps):
        for a, c in spans:
            if not 1 <= a < c <= length:
                raise ValueError(f"step [{a}, {c}) of trajectory {b} is empty or outside its {length} tokens")
    _, norm, head = output_side(model)
    calls, handles = _record_calls(model, params, [norm, head])
    try:
        with torch.no_grad():
            logits = model(input_ids=input_ids[:, :length], attention_mask=attention_mask[:, :length]).logits
    finally:
        for handle in handles:
            handle.remove()
    first = min(a for spans in steps for a, _ in spans) - 1          # the window of positions any step predicts
    g = torch.softmax(logits[:, first:-1].float(), dim=-1)                                     # [B, T, V]
    g.scatter_add_(2, input_ids[:, first + 1:length, None], -torch.ones_like(g[..., :1]))
    depth, rows = max(len(spans) for spans in steps), input_ids.shape[0]
    weights = torch.zeros(depth, rows, g.shape[1], dtype=torch.float64, device=g.device)      # [J, B, T]: 1/|k|
    for b, spans in enumerate(steps):
        for j, (a, c) in enumerate(spans):
            weights[j, b, a - 1 - first:c - 1 - first] = 1.0 / (c - a)
    scaled = [c for c in calls if c.module is norm]
    y = next(c.inputs[0] for c in calls if c.module is head)[:, first:-1].double()             # [B, T, d]
    with torch.no_grad():
        gram = (g @ g.transpose(1, 2)).double() * (y @ y.transpose(1, 2))                       # [B, T, T]
        squared = torch.einsum("jbt,bts,jbs->jb", weights, gram, weights)
        if head.bias is not None and any(p is head.bias for p in params):
            squared += torch.einsum("jbt,btv->jbv", weights, g.double()).pow(2).sum(2)
        if scaled:
            u = torch.einsum("jbt,btd->jbtd", weights.to(g.dtype), g @ head.weight.float())     # [J, B, T, d]
            d = torch.nn.functional.pad(u, (0, 0, first, 1)).to(scaled[0].output.dtype)        # [J, B, L, d]
            wanted = {id(p) for p in params}
            for key, grad in _scale_grads(scaled[0], d).items():
                if key in wanted:
                    squared += grad.flatten(2).pow(2).sum(2).double()
    return squared


def step_grad_norms(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    steps: list[list[tuple[int, int]]], params: list[torch.nn.Parameter],
                    modules: list[torch.nn.Module] | None = None, rows_per_pass: int = 32) -> torch.Tensor:
    """[K] sqrt(|k|) * ||grad_params L_k||_2 for every step of every trajectory, exactly; with `modules`
    (ccm_scope), the gradient that reaches the parameters through those modules' calls alone.

    Trajectories go through `rows_per_pass` at a time, grouped by step count and then length: a pass backs J
    cotangents through all its rows, J its largest step count, and pads every row to its longest.
    """
    rows = sorted((b for b, spans in enumerate(steps) if spans),
                  key=lambda b: (len(steps[b]), steps[b][-1][1]))
    if not rows:
        raise ValueError("no steps to score")
    norms = {}
    for start in range(0, len(rows), rows_per_pass):
        chunk = rows[start:start + rows_per_pass]
        spans = [steps[b] for b in chunk]
        if _is_output_side(model, params, modules):
            squared = _output_sq_norms(model, input_ids[chunk], attention_mask[chunk], spans, params).cpu()
        else:
            squared = _rows_sq_norms(model, input_ids[chunk], attention_mask[chunk], spans, params, modules).cpu()
        for i, b in enumerate(chunk):
            sizes = torch.tensor([c - a for a, c in spans[i]], dtype=torch.float64)
            norms[b] = (squared[:len(spans[i]), i].sqrt() * sizes.sqrt()).float()
    return torch.cat([norms[b] for b in sorted(norms)])


def step_grad_norms_loop(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         steps: list[list[tuple[int, int]]], params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The reference: the same norms with one backward per step."""
    losses, sizes = step_losses(model, input_ids, attention_mask, steps)
    norms = []
    for k in range(len(losses)):
        grads = torch.autograd.grad(losses[k], params, retain_graph=k + 1 < len(losses), allow_unused=True)
        norms.append(math.sqrt(sum(g.double().pow(2).sum().item() for g in grads if g is not None)))
    return (torch.tensor(norms, dtype=torch.float64) * sizes.double().sqrt()).float()
