"""Trimmed tokenizers against the full packaged ones, token bytes, and rollouts of a tiny policy."""

import json

import pytest
import torch
from tokenizers import Tokenizer

import policies
import tasks

FAMILIES = ["qwen2", "llama", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def full_tokenizer(family):
    return Tokenizer.from_str(json.dumps(policies.full_tokenizer_json(family)))


def test_trimmed_tokenizer_segments_task_text_like_the_full_one(family, full_tokenizer):
    trimmed = policies.tiny_tokenizer(family)
    assert len(trimmed) < 5000 < full_tokenizer.get_vocab_size()
    texts = []
    # seeds and knobs other than the trimming corpus's, thousands of problems
    for seed, cfg in enumerate([tasks.TaskConfig(), tasks.TaskConfig(num_steps=3, max_operand=500, ops="+-*"),
                                tasks.TaskConfig(num_steps=5, max_operand=60, ops="*+")]):
        for p in tasks.generate_problems(1000, "train", 100 + seed, cfg):
            texts += [tasks.prompt_text(p), p.solution, tasks.prompt_text(p) + p.solution]
    ours = trimmed.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    theirs = full_tokenizer.encode_batch(texts, add_special_tokens=False)
    mismatches = [t for t, a, b in zip(texts, ours, theirs) if a.tokens != b.tokens]
    assert not mismatches, mismatches[:3]


def test_digit_segmentation_differs_by_family():
    pieces = {f: policies.tiny_tokenizer(f).tokenize("12345") for f in ["qwen2", "llama"]}
    assert pieces["qwen2"] == ["1", "2", "3", "4", "5"]         # Qwen2: one digit per token
    assert pieces["llama"] == ["123", "45"]                     # Llama-3: groups of up to three


@pytest.mark.parametrize("text", ["7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", " leading space", "héllo wörld", "数学 😀",
                                  "e\u0301", "tabs\tand\r\nnewlines\n\n"])
def test_token_bytes_reproduce_the_text(family, text):
    tok = policies.tiny_tokenizer(family)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    table = policies.token_bytes_table(tok)
    spans = policies.byte_offsets(ids, table)
    data = b"".join(table[i] for i in ids)
    assert data.decode("utf-8") == tok.decode(ids, clean_up_tokenization_spaces=False)
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if family != "qwen2":  # Qwen normalizes to NFC, so only the others must reproduce e + combining accent
        assert data.decode("utf-8") == text
    assert table[tok.eos_token_id] == b""


def test_missing_tokenizer_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(policies.PACKAGED_TOKENIZERS, "qwen2", ("no_such_package_xyz", "t.json", "<eos>"))
    with pytest.raises(FileNotFoundError, match="no_such_package_xyz"):
        policies.packaged_tokenizer_path("qwen2")


def test_rollout_returns_consistent_ids_logprobs_texts_and_offsets(cache_dir):
    spec = policies.PRESETS["tiny"]["qwen-llama"][1]
    policy = policies.load_tiny_policy(spec, tasks.TaskConfig(), seed=0, cache_dir=cache_dir, warmup_scale=0.05)
    problems = tasks.generate_problems(3, "train", 0)
    torch.manual_seed(0)
    out = policy.rollout([tasks.prompt_text(p) for p in problems], group_size=4, max_new_tokens=12)
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
    spec = policies.PRESETS["tiny"]["qwen-llama"][0]
    first = policies.load_tiny_policy(spec, tasks.TaskConfig(), 0, str(tmp_path), warmup_scale=0.02)
    assert len(list((tmp_path / "warmup").glob("*.pt"))) == 1
    second = policies.load_tiny_policy(spec, tasks.TaskConfig(), 0, str(tmp_path), warmup_scale=0.02)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    untrained = policies.tiny_model(spec.family, spec.tiny, len(first.tokenizer), 0)
    assert any(not torch.equal(a, b) for a, b in zip(first.model.parameters(), untrained.parameters()))


def test_hub_model_that_cannot_be_reached_says_how_to_use_local_weights(tmp_path):
    spec = policies.PRESETS["small"]["qwen-llama"][0]
    with pytest.raises(RuntimeError, match="--model-paths qwen="):
        policies.load_hub_policy(spec, str(tmp_path / "missing"), torch.device("cpu"), torch.float32)


def test_unknown_pair_and_policy_names_are_refused():
    with pytest.raises(ValueError, match="unknown pair"):
        policies.load_policies("qwen-gpt", "tiny", torch.device("cpu"), tasks.TaskConfig(), 0)
    with pytest.raises(ValueError, match="not policies"):
        policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), tasks.TaskConfig(), 0,
                               model_paths={"gemma": "/x"})
