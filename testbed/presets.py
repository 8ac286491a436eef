"""The policies each pair trains at each scale (PRESETS), and the seed a tiny one is drawn from.

Three scales:
  tiny   random-initialized Qwen2 / Llama / Mistral architectures of about a million parameters, each with its
         family's real tokenizer trimmed to the task vocabulary (tiny.py), warmed up by a short supervised phase
         whose budget differs per policy (policies.supervised_warmup). The pairs qwen-llama, qwen-mistral and
         llama-mistral are the trio's policies two at a time, each seeded as in the trio, so that on a seed a
         policy starts from the same weights in all of them (H3 compares them).
  small  real ~1B instruct models from the hub or a local directory.
  paper  the proposal's 3B-8B models (§3.1). The proposal's "Gemma-3-7B" does not exist; the nearest Gemma-3
         size, google/gemma-3-4b-it, stands in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed import tiny


@dataclass(frozen=True)
class PolicySpec:
    name: str
    family: str
    """tokenizer and architecture family: qwen2, llama or mistral"""
    hub_id: str | None = None
    tiny: tiny.TinyShape | None = None
    seed_index: int | None = None
    """a tiny policy's place in the preset it is drawn from (a pair's policy: its place in the trio), which seeds
    its initialization and warm-up (`tiny_seed`); None: its position in its own preset"""


def tiny_seed(spec: PolicySpec, index: int, seed: int) -> int:
    """The seed a tiny policy at position `index` of its preset is initialized and warmed up with. A pair drawn
    from the trio keeps each policy's place in the trio (`_from_trio`), so that the pair's runs and the trio's
    start from the same weights on a seed."""
    return seed + 1000 * (index if spec.seed_index is None else spec.seed_index)


def _tiny(name: str, family: str, hidden: int, layers: int, warmup_steps: int) -> PolicySpec:
    # 70% premature warm-up targets: the policies learn the arithmetic, mostly answer after the first step under
    # greedy decoding, and finish sometimes when sampled, a gap GRPO can close (docs/results.md, "Independent GRPO,
    # default run")
    return PolicySpec(name, family, tiny=tiny.TinyShape(hidden, layers, heads=4, warmup_steps=warmup_steps,
                                                   premature_share=0.7))


_TINY_TRIO = [_tiny("qwen", "qwen2", 128, 4, 1000), _tiny("llama", "llama", 128, 4, 800),
              _tiny("mistral", "mistral", 128, 4, 1000)]


def _from_trio(trio: list[PolicySpec], *names: str) -> list[PolicySpec]:
    """The trio's policies of these names, each as in the trio and seeded by its place there (H3 compares a
    policy's trio run with its runs beside each peer alone, all from one start)."""
    place = {spec.name: i for i, spec in enumerate(trio)}
    return [replace(trio[place[name]], seed_index=place[name]) for name in names]


PRESETS: dict[str, dict[str, list[PolicySpec]]] = {
    "tiny": {
        "qwen-llama": _from_trio(_TINY_TRIO, "qwen", "llama"),
        "qwen-qwen": [_tiny("qwen-small", "qwen2", 96, 3, 1000), _tiny("qwen-large", "qwen2", 160, 4, 1000)],
        "trio": _TINY_TRIO,
        # only at this scale: the real trios have no Mistral
        "qwen-mistral": _from_trio(_TINY_TRIO, "qwen", "mistral"),
        "llama-mistral": _from_trio(_TINY_TRIO, "llama", "mistral"),
    },
    "small": {
        "qwen-llama": [PolicySpec("qwen", "qwen2", "Qwen/Qwen2.5-0.5B-Instruct"),
                       PolicySpec("llama", "llama", "meta-llama/Llama-3.2-1B-Instruct")],
        "qwen-qwen": [PolicySpec("qwen-0.5b", "qwen2", "Qwen/Qwen2.5-0.5B-Instruct"),
                      PolicySpec("qwen-1.5b", "qwen2", "Qwen/Qwen2.5-1.5B-Instruct")],
        "trio": [PolicySpec("qwen", "qwen3", "Qwen/Qwen3-0.6B"),
                 PolicySpec("llama", "llama", "meta-llama/Llama-3.2-1B-Instruct"),
                 PolicySpec("gemma", "gemma3", "google/gemma-3-1b-it")],
    },
    "paper": {
        "qwen-llama": [PolicySpec("qwen", "qwen2", "Qwen/Qwen2.5-7B-Instruct"),
                       PolicySpec("llama", "llama", "meta-llama/Llama-3.1-8B-Instruct")],
        "qwen-qwen": [PolicySpec("qwen-3b", "qwen2", "Qwen/Qwen2.5-3B-Instruct"),
                      PolicySpec("qwen-7b", "qwen2", "Qwen/Qwen2.5-7B-Instruct")],
        "trio": [PolicySpec("qwen", "qwen3", "Qwen/Qwen3-4B"),
                 PolicySpec("llama", "llama", "meta-llama/Llama-3.1-8B-Instruct"),
                 PolicySpec("gemma", "gemma3", "google/gemma-3-4b-it")],
    },
}


def preset(pair: str, scale: str) -> list[PolicySpec]:
    """The pair's policy specs at this scale; an unknown pair is refused with the known ones."""
    if pair not in PRESETS[scale]:
        raise ValueError(f"unknown pair {pair!r} at scale {scale}; choose from {sorted(PRESETS[scale])}")
    return PRESETS[scale][pair]
