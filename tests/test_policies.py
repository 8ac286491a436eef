"""Trimmed tokenizers against the full packaged ones, token bytes, a tiny policy's rollouts and warm-up, loading
and placement. Decoding and where a rollout stops are tests/test_decoding.py's."""

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from testbed import arith, checkpoint, policies, presets, tiny, token_bytes


@pytest.fixture(scope="module")
def full_tokenizer(family):
    return Tokenizer.from_str(json.dumps(tiny.full_tokenizer_json(family)))


def test_trimmed_tokenizer_segments_task_text_like_the_full_one(family, full_tokenizer):
    trimmed = tiny.tiny_tokenizer(family)
    assert len(trimmed) < 5000 < full_tokenizer.get_vocab_size()
    texts = []
    # seeds and knobs other than the trimming corpus's, thousands of problems
    for seed, cfg in enumerate([arith.TaskConfig(), arith.TaskConfig(num_steps=3, max_operand=500, ops="+-*"),
                                arith.TaskConfig(num_steps=5, max_operand=60, ops="*+")]):
        for p in arith.generate_problems(1000, "train", 100 + seed, cfg):
            texts += [arith.prompt_text(p), arith.solution(p), arith.prompt_text(p) + arith.solution(p)]
    ours = trimmed.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    theirs = full_tokenizer.encode_batch(texts, add_special_tokens=False)
    mismatches = [t for t, a, b in zip(texts, ours, theirs) if a.tokens != b.tokens]
    assert not mismatches, mismatches[:3]


def test_digit_segmentation_differs_by_family():
    pieces = {f: tiny.tiny_tokenizer(f).tokenize("12345") for f in ["qwen2", "llama"]}
    assert pieces["qwen2"] == ["1", "2", "3", "4", "5"]         # Qwen2: one digit per token
    assert pieces["llama"] == ["123", "45"]                     # Llama-3: groups of up to three


def test_a_tokenizer_without_a_fast_backend_is_refused_with_what_to_give_instead():
    from transformers import ByT5Tokenizer     # a Python tokenizer that needs no files
    with pytest.raises(ValueError, match="ByT5Tokenizer is not a fast tokenizer.*with a tokenizer.json"):
        token_bytes.token_bytes_table(ByT5Tokenizer())


# edits of a tokenizer.json: how the hub ships one, or what a fix changes
def metaspace(**settings):
    return lambda j: j["pre_tokenizer"].update(settings)


def byte_level(**settings):
    return lambda j: j["pre_tokenizer"]["pretokenizers"][1].update(settings)


def normalizer(value):
    return lambda j: j.update(normalizer=value)


GENERIC = "PreTrainedTokenizerFast"
PREFIX_SPACE = {   # the family; how the hub ships it: tokenizer.json's edit and tokenizer_config.json; the named fix
    "Mistral v0.3, a model's class": ("mistral", metaspace(prepend_scheme="first"),
                                      {"tokenizer_class": "LlamaTokenizer", "legacy": False}, "config"),
    "Llama-2, a model's class, legacy": ("mistral", metaspace(prepend_scheme="never"),
                                         {"tokenizer_class": "LlamaTokenizer", "legacy": True}, "config"),
    "a generic class, prepend_scheme first": ("mistral", metaspace(prepend_scheme="first"),
                                              {"tokenizer_class": GENERIC}, metaspace(prepend_scheme="never")),
    "a generic class, a Prepend normalizer": ("mistral", normalizer({"type": "Prepend", "prepend": "\u2581"}),
                                              {"tokenizer_class": GENERIC}, normalizer(None)),
    "a generic class, byte-level add_prefix_space": ("llama", byte_level(add_prefix_space=True),
                                                     {"tokenizer_class": GENERIC}, byte_level(add_prefix_space=False)),
}


def hub_folder(path: Path, family: str, edit, config: dict) -> Path:
    """A model folder as the hub ships one: the family's tiny tokenizer.json with `edit` applied, and `config`."""
    path.mkdir(exist_ok=True)
    tokenizer_json = json.loads(tiny.tiny_tokenizer(family).backend_tokenizer.to_str())
    edit(tokenizer_json)
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    eos = tiny.PACKAGED_TOKENIZERS[family][2]
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": eos}))
    return path


@pytest.mark.parametrize("case", PREFIX_SPACE)
def test_a_tokenizer_that_adds_a_leading_space_is_refused_and_the_fix_it_names_is_accepted(case, tmp_path):
    from transformers import AutoTokenizer      # the path --model-paths takes: a folder, as transformers reads it
    family, shipped_as, config, fix = PREFIX_SPACE[case]
    shipped = AutoTokenizer.from_pretrained(hub_folder(tmp_path, family, shipped_as, config))
    ids = token_bytes.encode_text(shipped, "12 + 3")
    assert shipped.convert_ids_to_tokens(ids)[0][0] in ("\u2581", "\u0120")       # a space marker first, by hand
    named = ('"add_prefix_space": false in the model folder.s tokenizer_config.json' if fix == "config" else
             "in the model folder.s tokenizer.json")
    with pytest.raises(ValueError, match=f"adds a leading space.*{named}.*--model-paths NAME=DIR"):
        token_bytes.token_bytes_table(shipped)
    if fix == "config":
        fixed = hub_folder(tmp_path, family, shipped_as, {**config, "add_prefix_space": False})
    else:
        fixed = hub_folder(tmp_path, family, lambda j: (shipped_as(j), fix(j)), config)
    tokenizer = AutoTokenizer.from_pretrained(fixed)
    table = token_bytes.token_bytes_table(tokenizer)
    assert b"".join(table[i] for i in token_bytes.encode_text(tokenizer, "12 + 3")) == b"12 + 3"


def test_a_vocabulary_of_neither_supported_kind_is_refused():
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"[UNK]": 0, "12": 1, "+": 2, "30": 3, "=": 4, "42": 5, "4": 6, "##2": 7, "-": 8, "5": 9, "37": 10}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()             # BERT's: spaces dropped, not spelled
    with pytest.raises(ValueError, match="neither byte-level BPE nor metaspace"):
        token_bytes.token_bytes_table(PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]"))


@pytest.mark.parametrize("text", ["7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", " leading space", "héllo wörld", "数学 😀",
                                  "e\u0301", "tabs\tand\r\nnewlines\n\n"])
def test_token_bytes_reproduce_the_text(family, text):
    tok = tiny.tiny_tokenizer(family)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    table = token_bytes.token_bytes_table(tok)
    spans = token_bytes.byte_offsets(ids, table)
    data = b"".join(table[i] for i in ids)
    assert data.decode("utf-8") == tok.decode(ids, clean_up_tokenization_spaces=False)
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if family != "qwen2":  # Qwen normalizes to NFC, so only the others must reproduce e + combining accent
        assert data.decode("utf-8") == text
    assert table[tok.eos_token_id] == b""


def test_missing_tokenizer_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(tiny.PACKAGED_TOKENIZERS, "qwen2", ("no_such_package_xyz", "t.json", "<eos>"))
    with pytest.raises(FileNotFoundError, match="no_such_package_xyz"):
        tiny.packaged_tokenizer_path("qwen2")


def test_rollout_returns_consistent_ids_logprobs_texts_and_offsets(cache_dir):
    spec = presets.PRESETS["tiny"]["qwen-llama"][1]
    policy = policies.load_tiny_policy(spec, arith.TaskConfig(), seed=0, cache_dir=cache_dir, warmup_scale=0.05)
    problems = arith.generate_problems(3, "train", 0)
    torch.manual_seed(0)
    out = policy.rollout([arith.prompt_text(p) for p in problems], group_size=4, max_new_tokens=12)
    assert len(out.texts) == 12 and out.group_size == 4
    for prompt, ids, logprobs, text, offsets, finished in zip(out.prompt_ids, out.completion_ids, out.logprobs,
                                                               out.texts, out.offsets, out.finished):
        assert len(ids) == len(logprobs) == len(offsets) <= 12
        assert (logprobs <= 0).all() and torch.isfinite(logprobs).all()
        assert finished == (ids[-1].item() == policy.tokenizer.eos_token_id)
        assert text == policy.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert offsets[-1][1] == len(text.encode()) or not text.isascii()
        # the log-probs are the policy's own: recompute them with one teacher-forced forward pass
        full = torch.cat([prompt, ids]).unsqueeze(0)
        with torch.no_grad():
            reference = torch.log_softmax(policy.model(full).logits[0, len(prompt) - 1:-1].float(), -1)
        torch.testing.assert_close(logprobs, reference.gather(-1, ids.unsqueeze(-1)).squeeze(-1), atol=1e-4, rtol=0)


def test_warmup_is_cached_on_disk(cache_dir, tmp_path):
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    first = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path), warmup_scale=0.02)
    assert len(list((tmp_path / "warmup").glob("*.pt"))) == 1
    assert all(p.grad is None for p in first.model.parameters())     # no gradient outlives the warm-up
    second = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path), warmup_scale=0.02)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    untrained = tiny.tiny_model(spec.family, spec.tiny, len(first.tokenizer), 0)
    assert any(not torch.equal(a, b) for a, b in zip(first.model.parameters(), untrained.parameters()))


def test_two_warm_ups_of_one_policy_saved_at_once_both_succeed(tmp_path, monkeypatch):
    # the interleaving of two runs warming up the same policy: the second saves and renames while the first is
    # between its save and its rename
    spec, save = presets.PRESETS["tiny"]["qwen-llama"][0], torch.save
    def save_then_let_the_other_run_finish(obj, f):
        save(obj, f)
        monkeypatch.setattr(policies.torch, "save", save)
        policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path), warmup_scale=0.01)
    monkeypatch.setattr(policies.torch, "save", save_then_let_the_other_run_finish)
    first = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path), warmup_scale=0.01)
    assert [p.suffix for p in (tmp_path / "warmup").iterdir()] == [".pt"]   # one warm-up, no temporary left
    cached = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path), warmup_scale=0.01)
    for a, b in zip(first.model.parameters(), cached.model.parameters()):
        assert torch.equal(a, b)


def test_hub_model_that_cannot_be_reached_says_how_to_use_local_weights(tmp_path):
    spec = presets.PRESETS["small"]["qwen-llama"][0]
    with pytest.raises(RuntimeError, match="--model-paths qwen="):
        policies.load_hub_policy(spec, str(tmp_path / "missing"), torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("tied", [False, True])
def test_a_checkpoint_whose_head_outgrows_its_tokenizer_never_samples_the_padding_rows(cache_dir, tmp_path, tied):
    # as Qwen2.5's 151,936 rows for 151,665 tokens; here the padding rows outscore every token, so a policy that
    # kept them would emit ids its tokenizer cannot decode
    from transformers import AutoConfig, AutoModelForCausalLM
    tok = tiny.tiny_tokenizer("qwen2", "line", cache_dir)
    vocab = len(tok)
    config = AutoConfig.for_model("qwen2", vocab_size=vocab + 16, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                  tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # tied, the input embeddings change with the head: rollouts still run on them
        model.lm_head.weight[:vocab] = 0.0
        model.lm_head.weight[vocab:] *= 100.0
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = policies.load_hub_policy(presets.PRESETS["small"]["qwen-llama"][0], str(tmp_path), torch.device("cpu"),
                                      torch.float32)
    assert policy.model.get_output_embeddings().weight.shape[0] == vocab == policy.model.config.vocab_size
    assert policy.model.get_input_embeddings().weight.shape[0] == vocab
    assert torch.equal(policy.model.lm_head.weight, model.lm_head.weight[:vocab])   # the tokens' rows as saved
    assert (policy.model.lm_head.weight.data_ptr() == policy.model.get_input_embeddings().weight.data_ptr()) == tied
    out = policy.rollout(["12 + 7 ="], 4, 6)
    assert all(int(i) < vocab for ids in out.completion_ids for i in ids) and len(out.texts) == 4


def test_lora_adapters_on_real_weights_are_drawn_from_the_runs_seed_not_the_process(cache_dir, tmp_path):
    # a real checkpoint seeds nothing on loading: peft's draws would follow whatever torch's global generator holds,
    # which a fresh process starts at random
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model("llama", vocab_size=len(tiny.tiny_tokenizer("llama", "line", cache_dir)),
                                  hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tiny.tiny_tokenizer("llama", "line", cache_dir).save_pretrained(tmp_path)

    def adapters(seed: int, global_seed: int) -> dict[str, torch.Tensor]:
        setup = policies.PolicySetup("qwen-llama", "tiny", seed, (f"llama={tmp_path}",), None, cache_dir, 1.0, 4,
                                     8.0, False)
        torch.manual_seed(global_seed)
        model = policies.build_policy(setup, 1, torch.device("cpu"), arith.TaskConfig()).model
        return {n: w.detach().clone() for n, w in model.named_parameters() if "lora_A" in n}

    first = adapters(7, global_seed=1)
    assert first and all(w.abs().sum() > 0 for w in first.values())
    again, other = adapters(7, global_seed=2), adapters(8, global_seed=1)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not any(torch.equal(first[n], other[n]) for n in first)


def test_unknown_pair_and_policy_names_are_refused():
    with pytest.raises(ValueError, match="unknown pair"):
        policies.load_policies("qwen-gpt", "tiny", torch.device("cpu"), arith.TaskConfig(), 0)
    with pytest.raises(ValueError, match="not policies"):
        policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), arith.TaskConfig(), 0,
                               model_paths={"gemma": "/x"})
    with pytest.raises(ValueError, match="unknown pair 'qwen-mistral' at scale small"):   # the real trios: no Mistral
        presets.preset("qwen-mistral", "small")


# the warm-up cache keys on seed 3 (line steps, the full warm-up) of the tiny presets that existed before a policy's
# seed could differ from its position (commit 982f376): registered runs started from these warm-ups, so they stay
# (a bump of WARMUP_VERSION changes them on purpose: update them with it)
KEYS_BEFORE_SEED_INDEX = {
    "qwen-llama": {"qwen": "6e9c9875fb2ed35e", "llama": "8048265227e66c31"},
    "qwen-qwen": {"qwen-small": "dac784af1eacc9d5", "qwen-large": "2b311c70e9efd6d0"},
    "trio": {"qwen": "6e9c9875fb2ed35e", "llama": "8048265227e66c31", "mistral": "a8d5ba4372aff378"},
}


@pytest.mark.parametrize("pair", KEYS_BEFORE_SEED_INDEX)
def test_the_presets_from_before_seed_indices_keep_their_seeds_and_warm_up_keys(cache_dir, pair):
    specs = presets.preset(pair, "tiny")
    seeds = [presets.tiny_seed(spec, i, 3) for i, spec in enumerate(specs)]
    assert seeds == [3, 1003, 2003][:len(specs)]                               # seed + 1000 * position
    keys = {spec.name: policies.warmup_key(spec, arith.TaskConfig(), seed, spec.tiny.warmup_steps,
                                           len(tiny.tiny_tokenizer(spec.family, "line", cache_dir)))
            for spec, seed in zip(specs, seeds)}
    assert keys == KEYS_BEFORE_SEED_INDEX[pair]


SHORT_WARMUP = 0.02


@pytest.fixture(scope="module")
def trio_start(tmp_path_factory):
    """The trio's tiny policies on seed 3 after a short warm-up, in a cache of their own: (their weights'
    fingerprints by name, the cache)."""
    cache = tmp_path_factory.mktemp("trio-cache")
    trio = policies.load_policies("trio", "tiny", torch.device("cpu"), arith.TaskConfig(), 3, str(cache),
                                  warmup_scale=SHORT_WARMUP)
    return {p.name: checkpoint.weights_fingerprint(p.model) for p in trio}, cache


@pytest.mark.parametrize("pair", ["qwen-llama", "qwen-mistral", "llama-mistral"])
def test_a_pair_of_the_trio_starts_each_policy_from_its_weights_in_the_trio(trio_start, tmp_path, pair):
    trio, trio_cache = trio_start
    # warmed up afresh in a cache of the pair's own: equal weights come from equal seeds, not from a shared file
    pols = policies.load_policies(pair, "tiny", torch.device("cpu"), arith.TaskConfig(), 3, str(tmp_path),
                                  warmup_scale=SHORT_WARMUP)
    assert {p.name: checkpoint.weights_fingerprint(p.model) for p in pols} == {p.name: trio[p.name] for p in pols}
    # under the trio's cache keys too, so that the pair's runs and the trio's read one warm-up
    def cached(cache):
        return {f.name for f in (cache / "warmup").iterdir()}
    assert len(cached(tmp_path)) == 2 and cached(tmp_path) < cached(trio_cache)


def test_a_chat_prompt_does_not_depend_on_the_day_and_asks_for_no_thinking():
    # a stand-in for Llama-3.2's and Qwen3's templates: today's date unless given one, thinking unless switched off
    tok = tiny.tiny_tokenizer("llama")
    tok.chat_template = ("{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}"
                         "{% endif %}Date: {{ date_string }}\n"
                         "{% if enable_thinking is defined and not enable_thinking %}no thinking\n{% endif %}"
                         "{{ messages[0]['content'] }}")
    policy = policies.Policy("llama", torch.nn.Linear(1, 1), tok, use_chat_template=True)
    assert tok.decode(policy.encode_prompt("1+1?")) == "Date: 26 Jul 2024\nno thinking\n1+1?"


@pytest.mark.parametrize("switched_off, why", [(False, "unreachable"), (True, "switched off by HF_HUB_OFFLINE")])
def test_a_hub_model_offline_fails_within_seconds_saying_what_is_missing(tmp_path, monkeypatch, switched_off, why):
    import time
    from huggingface_hub import constants
    from testbed import data
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", switched_off)      # whatever the environment running the tests
    monkeypatch.setattr(data, "hub_reachable", lambda endpoint, timeout_s=3.0: False)   # as offline
    spec, started = presets.PRESETS["small"]["qwen-llama"][0], time.perf_counter()
    with pytest.raises(policies.WeightsUnavailable, match=f"not in the Hugging Face cache .* {why}"):
        policies.load_hub_policy(spec, spec.hub_id, torch.device("cpu"), torch.float32)
    assert time.perf_counter() - started < 5


def test_the_trimmed_tokenizer_is_cached_and_the_cached_one_is_the_same(tmp_path, monkeypatch, family):
    fresh = tiny.tiny_tokenizer.__wrapped__(family, "line", str(tmp_path))
    assert len(list((tmp_path / "tokenizers").glob(f"{family}-line-*.json"))) == 1
    monkeypatch.setattr(tiny, "trim_bpe", lambda *a, **k: pytest.fail("trimmed again instead of read from the cache"))
    cached = tiny.tiny_tokenizer.__wrapped__(family, "line", str(tmp_path))
    assert cached.get_vocab() == fresh.get_vocab() and cached.eos_token == fresh.eos_token
    assert cached.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()
    monkeypatch.undo()
    other = tiny.tiny_tokenizer.__wrapped__(family, "prose", str(tmp_path))        # another corpus, another entry
    assert len(list((tmp_path / "tokenizers").glob(f"{family}-*.json"))) == 2 and other.get_vocab() != fresh.get_vocab()


def test_devices_are_placed_round_robin_and_bad_ones_refused():
    cpu = torch.device("cpu")
    assert policies.policy_devices("cpu", 3) == [cpu] * 3
    assert policies.policy_devices(" cpu , cpu ", 2) == [cpu, cpu]
    assert policies.policy_devices(None, 2) == [torch.device("cuda" if torch.cuda.is_available() else "cpu")] * 2
    with pytest.raises(ValueError, match="not a torch device"):
        policies.policy_devices("gpu0", 2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA devices"):
            policies.policy_devices("cuda:0,cuda:1", 2)


def test_a_run_without_a_scale_takes_small_only_where_a_policy_runs_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # a GPU machine, as far as the run can tell
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert policies.devices_and_scale("trio", "cpu", None) == ([cpu] * 3, "tiny")
    assert policies.devices_and_scale("trio", None, None) == ([cuda] * 3, "small")
    assert policies.devices_and_scale("trio", "cpu,cuda:0", None)[1] == "small"
    assert policies.devices_and_scale("trio", "cpu", "small") == ([cpu] * 3, "small")
    assert policies.devices_and_scale("qwen-mistral", "cpu", None)[1] == "tiny"
    with pytest.raises(ValueError, match="unknown pair 'qwen-mistral' at scale small"):
        policies.devices_and_scale("qwen-mistral", None, None)
