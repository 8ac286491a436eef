"""LoRA adapters and the KL reference.

Under LoRA (through peft) only the adapters train, so gradients and AdamW state exist for about half a percent
of the parameters (40M of a 7B model at rank 16), which is what puts the paper pair on one GPU. The KL reference
is then the same model with its adapters switched off (`WithoutAdapters`), so no second copy of the weights is
held; reachability's exact estimate takes its norms over the adapters, `last:N` over the last blocks' weights,
frozen ones included (DESIGN.md §4.8, `grad_norms.ccm_scope`). Without LoRA the reference is a frozen copy of the
policy as training starts.
"""

from __future__ import annotations

import copy

import torch


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


Reference = torch.nn.Module | WithoutAdapters
"""the KL reference: a frozen copy of the policy, or under LoRA the policy without its adapters"""


def reference_policy(model: torch.nn.Module) -> Reference:
    """The KL reference: the adapter-free view under LoRA, else a frozen copy of the model as it is now."""
    return WithoutAdapters(model) if has_adapters(model) else frozen_copy(model)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy that takes no gradients, e.g. the KL reference."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference
