"""Decoding (testbed/sequences.py: decode) against a teacher-forced forward and transformers' generate, and a
policy's rollouts ending at its stop ids: tiny models, untrained or warmed up."""

import pytest
import torch

from testbed import arith, policies, presets, sequences, tiny


@pytest.fixture(scope="module")
def random_policy(family):
    """An untrained tiny model of the family: decoding must not depend on what the weights learned."""
    tok = tiny.tiny_tokenizer(family)
    model = tiny.tiny_model(family, tiny.TinyShape(64, 2, 4, 0), len(tok), seed=3).eval()
    prompts = [tok(arith.prompt_text(p), add_special_tokens=False)["input_ids"]
               for p in arith.generate_problems(6, "train", 5, arith.TaskConfig(num_steps=1, max_operand=500))]
    assert len({len(p) for p in prompts}) > 1  # prompts of several lengths, so left padding is exercised
    return model, tok, prompts


def teacher_forced_logprobs(model, prompt: list[int], ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(ids_t | prompt, ids_<t) at the temperature from one forward of the unpadded sequence, [T]."""
    full = torch.tensor(prompt + ids.tolist()).unsqueeze(0)
    with torch.no_grad():
        logits = model(full).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.3, 0.9)])
def test_decode_logprobs_equal_a_teacher_forced_forward_at_the_temperature(random_policy, temperature, top_p):
    model, tok, prompts = random_policy
    torch.manual_seed(0)
    ids, logprobs = sequences.decode(model, prompts, tok.pad_token_id, [tok.eos_token_id], 16, temperature, top_p)
    assert ids.shape == logprobs.shape == (len(prompts), 16)
    for prompt, row, lp in zip(prompts, ids, logprobs):
        torch.testing.assert_close(lp, teacher_forced_logprobs(model, prompt, row, temperature), atol=1e-4, rtol=0)


def test_rows_stop_at_eos_and_the_others_continue_unchanged(cache_dir):
    spec = presets.PRESETS["tiny"]["qwen-llama"][1]
    policy = policies.load_tiny_policy(spec, arith.TaskConfig(), seed=0, cache_dir=cache_dir, warmup_scale=0.05)
    model, tok = policy.model.eval(), policy.tokenizer
    prompts = [policy.encode_prompt(arith.prompt_text(p)) for p in arith.generate_problems(6, "train", 5)] * 4
    torch.manual_seed(0)
    free, free_lp = sequences.decode(model, prompts, tok.pad_token_id, [-1], 16, 0.9)  # no EOS
    # EOS: of the first row's first three tokens (so that row stops by its third), the one the fewest rows emit;
    # decode again, same seed. The condition the test needs, checked: some row never emits it and runs on
    emitters = {int(t): int((free == t).any(1).sum()) for t in free[0, :3]}
    stop = min(emitters, key=emitters.get)
    assert emitters[stop] < len(prompts), "every row emits each of the first row's first three tokens"
    torch.manual_seed(0)
    ids, lp = sequences.decode(model, prompts, tok.pad_token_id, [stop], 16, 0.9)
    ends = []
    for row, row_lp, ref, ref_lp in zip(ids, lp, free, free_lp):
        end = (ref == stop).nonzero()[0, 0].item() + 1 if (ref == stop).any() else len(ref)
        ends.append(end)
        # the same draws up to and including EOS (the random stream does not depend on finished rows)...
        assert torch.equal(row[:end], ref[:end])
        torch.testing.assert_close(row_lp[:end], ref_lp[:end], atol=1e-5, rtol=0)
        # ...then padding with log-prob 0
        assert (row[end:] == tok.pad_token_id).all() and (row_lp[end:] == 0).all()
    assert ends[0] <= 3 and ids.shape[1] == max(ends) == free.shape[1]


@pytest.mark.parametrize("sampling", [dict(do_sample=False), dict(do_sample=True, temperature=0.7, top_k=None),
                                      dict(do_sample=True, temperature=1.0, top_p=0.8, top_k=None)])
def test_decode_matches_model_generate(random_policy, sampling):
    model, tok, prompts = random_policy
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    temperature, top_p, greedy = sampling.get("temperature", 1.0), sampling.get("top_p", 1.0), not sampling["do_sample"]
    # two stop ids, as a chat model's generation config lists them: the first row's third token, so generate pads
    # finished rows while others run on, and the second row's second
    torch.manual_seed(1)
    free = sequences.decode(model, prompts, tok.pad_token_id, [-1], 3, temperature, top_p, greedy)[0]
    stops = list(dict.fromkeys([int(free[0, 2]), int(free[1, 1])]))
    torch.manual_seed(1)
    expected = model.generate(**batch, max_new_tokens=20, pad_token_id=tok.pad_token_id, eos_token_id=stops,
                              **sampling)[:, batch["input_ids"].shape[1]:]
    torch.manual_seed(1)
    ids, _ = sequences.decode(model, prompts, tok.pad_token_id, stops, 20, temperature, top_p, greedy)
    assert torch.equal(ids, expected) and (ids[0, 3:] == tok.pad_token_id).all()


def test_a_rollout_ends_at_the_first_of_its_stop_ids_and_a_real_model_stops_where_its_generation_config_says():
    tok = tiny.tiny_tokenizer("qwen2")
    model = tiny.tiny_model("qwen2", tiny.TinyShape(64, 2, 4, 0), len(tok), seed=3)
    prompt = [arith.prompt_text(arith.generate_problems(1, "train", 5)[0])]
    free = policies.Policy("qwen", model, tok, use_chat_template=False, stop_ids=(-1,)).rollout(prompt, 1, 8,
                                                                                                greedy=True)
    ids = free.completion_ids[0].tolist()
    assert len(ids) == 8 and free.finished == [False]
    # a turn-end id the model emits at its third token: the completion ends there, that token included
    turn_end = ids[2] if ids[2] not in ids[:2] else ids[0]
    end = ids.index(turn_end) + 1
    policy = policies.Policy("qwen", model, tok, use_chat_template=False, stop_ids=(tok.eos_token_id, turn_end))
    cut = policy.rollout(prompt, 1, 8, greedy=True)
    assert cut.completion_ids[0].tolist() == ids[:end] and cut.finished == [True]
    torch.testing.assert_close(cut.logprobs[0], free.logprobs[0][:end])
    # the ids: the tokenizer's EOS first, then the generation config's, once each, an int or a list or none
    from transformers import GenerationConfig
    eos = tok.eos_token_id
    assert policies.stop_ids(tok, GenerationConfig(eos_token_id=[eos, 106, 1])) == (eos, 106, 1)
    assert policies.stop_ids(tok, GenerationConfig(eos_token_id=106)) == (eos, 106)
    assert policies.stop_ids(tok, GenerationConfig()) == policies.stop_ids(tok, None) == (eos,)


def test_a_rollout_refuses_an_empty_prompt_no_token_budget_and_a_tokenizer_without_eos_or_pad():
    tok = tiny.tiny_tokenizer("qwen2")
    policy = policies.Policy("qwen", tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0), tok,
                             use_chat_template=False)
    with pytest.raises(ValueError, match="prompt '' encodes to no token"):
        policy.rollout(["1+1=", ""], 2, 4)
    with pytest.raises(ValueError, match="at least one token, got max_new_tokens=0"):
        policy.rollout(["1+1="], 2, 0)
    policy.stop_ids = (None,)
    with pytest.raises(ValueError, match="an id to stop at and one to pad with"):
        policy.rollout(["1+1="], 2, 4)
