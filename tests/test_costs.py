"""The memory and time estimate and LoRA, on the CPU: what can be checked without a GPU."""

import copy
import json

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import eval as evaluation
import grad_norms
import grpo
import train
from args import Args
from benchmarks import memory_estimate   # the measurement that checks the estimate
from test_train import tiny_args
from testbed import checkpoint, costs, lora, sequences, tiny


def tiny_llama(seed=0):
    tok = tiny.tiny_tokenizer("llama")
    return tiny.tiny_model("llama", tiny.TinyShape(32, 2, 4, 0), len(tok), seed), tok


def one_update(model, vocab):
    """One GRPO step on random sequences with random advantages; returns the model."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (5,), generator=gen).tolist() for _ in range(4)]
    completions = [torch.randint(vocab, (6,), generator=gen).tolist() for _ in range(4)]
    advantages = [torch.full((6,), a) for a in (1.0, -1.0, 0.5, -0.5)]
    batch = grpo.build_batch(prompts, completions, advantages, pad_id=0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig())
    return optimizer


def test_lora_trains_only_the_adapters_and_the_reference_is_the_adapter_free_model():
    base, tok = tiny_llama()
    original = copy.deepcopy(base)
    model = lora.add_lora(base, rank=4, alpha=8)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert lora_before and all("lora_" in n for n in lora_before)
    one_update(model, len(tok))
    for n, p in model.named_parameters():
        if n in frozen_before:
            assert torch.equal(p, frozen_before[n]), n
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if n in lora_before)
    ids = torch.randint(len(tok), (2, 9), generator=torch.Generator().manual_seed(3))
    reference = lora.reference_policy(model)
    torch.testing.assert_close(reference(input_ids=ids).logits, original(input_ids=ids).logits, rtol=0, atol=1e-6)
    assert not torch.allclose(model(input_ids=ids).logits, original(input_ids=ids).logits, atol=1e-6)
    assert set(map(id, grad_norms.parameter_subset(model, "lora"))) == \
        {id(p) for p in model.parameters() if p.requires_grad}


def test_a_lora_checkpoint_holds_the_adapters_and_restores_the_model():
    model = lora.add_lora(tiny_llama()[0], rank=4, alpha=8)
    one_update(model, 100)
    state = checkpoint.trainable_state(model)
    assert state and all("lora_" in k for k in state)
    fresh = lora.add_lora(tiny_llama()[0], rank=4, alpha=8)
    checkpoint.load_trainable_state(fresh, state)
    ids = torch.arange(12).view(2, 6)
    torch.testing.assert_close(fresh(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="lora-rank"):
        checkpoint.load_trainable_state(lora.add_lora(tiny_llama()[0], rank=2, alpha=8), state)
    full = tiny_llama()[0]
    assert set(checkpoint.trainable_state(full)) == set(full.state_dict())


def test_the_estimate_matches_measured_parameters_gradients_optimizer_state_and_kv_cache():
    model, tok = tiny_llama()
    model = lora.add_lora(model, rank=4, alpha=8)
    work = costs.Workload(rollouts=3, prompt_len=4, max_new_tokens=3, micro_batch=2, train_sequences=3)
    est = costs.estimate(model, work)
    optimizer = one_update(model, len(tok))
    params = list(model.parameters())
    assert est.parameters == sum(p.numel() for p in params)
    assert est.trainable == sum(p.numel() for p in params if p.requires_grad) < est.parameters
    assert est.bytes["gradients"] == sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state = [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
    assert est.bytes["optimizer"] == sum(t.numel() * t.element_size() for t in state)
    cache = model(input_ids=torch.zeros(3, 7, dtype=torch.long), use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert est.bytes["kv_cache"] == measured


@pytest.mark.slow
def test_a_lora_run_saves_adapters_only_and_its_checkpoint_rebuilds_the_trained_policies(tmp_path, cache_dir):
    run_dir = train.main(tiny_args(tmp_path, cache_dir, lora_rank=4, beta=0.1, iterations=1, temperature=0.7))
    state = torch.load(run_dir / "checkpoints" / "iter-000001" / "qwen.pt")["model"]
    assert state and all("lora_" in k for k in state)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in logged if "losses/policy_loss" in r]
    assert all(r["perf/rollout_tokens_per_s"] > 0 and r["perf/update_tokens_per_s"] > 0 for r in updates)
    final = {r["policy"]: r["eval/heldout_accuracy"] for r in logged
             if r["iteration"] == 1 and "eval/heldout_accuracy" in r}
    assert evaluation.evaluate_run(run_dir, "arith", eval_size=8, data_dir=None, max_new_tokens=None) == final


# ---- the memory estimate against measurements ----

def small_model(family, dtype, with_lora, hidden=64, layers=2, vocab=256, checkpointing=False):
    """Qwen2 (q/k/v biases, tied head) or Llama (untied head), both with grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                                 num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                 tie_word_embeddings=family == "qwen2")).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return (lora.add_lora(model, rank=4, alpha=8) if with_lora else model).train()


def padded_batch(n, prompt_len, new_tokens, vocab=256, group=1):
    """n sequences in groups of `group` completions of one prompt; where there are several prompts, of different
    lengths, so that the attention mask pads, as in training."""
    gen = torch.Generator().manual_seed(0)
    distinct = [torch.randint(1, vocab, (prompt_len - u % 3,), generator=gen).tolist() for u in range(-(-n // group))]
    prompts = [distinct[i // group] for i in range(n)]
    completions = [torch.randint(1, vocab, (new_tokens,), generator=gen).tolist() for _ in range(n)]
    return grpo.build_batch(prompts, completions, [torch.ones(new_tokens)] * n, pad_id=0)


def saved_for_backward(model, batch):
    """Bytes of the distinct storages autograd saves in the model's forwards of the update's log-probs
    (sequences.completion_logprobs: each prompt once, then its completions), parameters not included."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved, inside = {}, []

    def pack(tensor):
        storage = tensor.untyped_storage()
        if inside and storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    groups = sequences.prompt_groups(batch.input_ids, batch.mask, list(range(len(batch.input_ids))))
    entering = model.register_forward_pre_hook(lambda module, args: inside.append(True))
    leaving = model.register_forward_hook(lambda module, args, out: inside.clear())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        sequences.completion_logprobs(model, groups, cache=sequences.cache_keyword(model))
    entering.remove()
    leaving.remove()
    return sum(saved.values())


def test_the_live_bytes_meter_counts_new_storages_until_freed_and_not_views():
    weight = torch.ones(1000)                            # made before the meter: not counted
    with memory_estimate.LiveTensorBytes() as live:
        view = weight.t()[10:]                           # views of old storage: nothing new
        a = weight * 2                                   # 4,000 bytes
        b = torch.zeros(500, dtype=torch.float64)        # 4,000 bytes
        b.add_(1)                                        # in place: nothing new
        del a
        c = torch.ones(250)                              # 1,000 bytes, after a is freed
    assert (live.peak, live.now) == (8000, 5000)
    assert view.numel() == 990 and c.sum() == 250 and b.sum() == 500


CASES = [(family, dtype, with_lora) for family in ("qwen2", "llama") for dtype in (torch.float32, torch.bfloat16)
         for with_lora in (False, True)]


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("family, dtype, with_lora", CASES)
def test_activations_are_the_tensors_saved_for_backward(family, dtype, with_lora, group):
    model = small_model(family, dtype, with_lora)
    kept, recomputed = costs.activation_bytes(model, costs.Workload(4, 24, 24, 4, 4, group_size=group))
    assert recomputed == 0
    assert kept == pytest.approx(saved_for_backward(model, padded_batch(4, 24, 24, group=group)), rel=0.03)


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("family, dtype, with_lora", CASES)
def test_the_estimated_peak_is_within_10_percent_of_the_measured_peak_of_an_update(family, dtype, with_lora, group):
    model = small_model(family, dtype, with_lora)
    n, prompt_len, new_tokens = 4, 24, 24
    batch = padded_batch(n, prompt_len, new_tokens, group=group)
    # foreach, as AdamW picks on CUDA: its step allocates a transient as large as the trainable parameters
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=n)   # AdamW's moments exist from now
    measured = memory_estimate.measure_update(model, optimizer, batch, micro_batch=n)
    est = costs.estimate(model, costs.Workload(n, prompt_len, new_tokens, n, n, group_size=group))
    assert est.total_bytes == pytest.approx(measured, rel=0.10)


@settings(max_examples=60, deadline=None)
@given(share=st.sampled_from(["none", "xgrpo", "sgt", "prp", "cross-fidelity"]), prompts=st.integers(1, 6),
       group=st.integers(2, 5), micro_batch=st.integers(1, 20), minibatches=st.integers(1, 3), data=st.data())
def test_no_micro_batch_of_an_update_holds_more_prompts_than_the_estimate_counts(share, prompts, group, micro_batch,
                                                                                minibatches, data):
    """The update's own cut (grpo_step: minibatch_rows, sequences_of_prompts, micro-batches) of own groups and
    received rows spread over the prompts at random, against the prompts train.workload lets a micro-batch hold."""
    assume(minibatches <= prompts * group)
    args = Args(share=share, prompts_per_iteration=prompts, group_size=group, micro_batch=micro_batch,
                minibatches=minibatches)
    work = train.workload(args, prompt_len=3, policy_count=2)
    received = work.train_sequences - work.rollouts
    owners = [b for b in range(prompts) for _ in range(group)]
    owners += data.draw(st.lists(st.integers(0, prompts - 1), min_size=received, max_size=received))
    batch = grpo.build_batch([[b + 1, b + 1] for b in owners], [[7]] * len(owners), [torch.ones(1)] * len(owners),
                             pad_id=0)
    for part in grpo.minibatch_rows(len(owners), minibatches):
        order = grpo.sequences_of_prompts(batch.input_ids, batch.mask, part)
        for start in range(0, len(order), micro_batch):
            held = {owners[r] for r in order[start:start + micro_batch]}
            assert len(held) * work.prompt_len <= costs.update_tokens(work, work.micro_batch)[0]


def test_a_prompt_computed_once_for_its_group_costs_the_update_less_memory_and_flops():
    """By hand: 8 rows of prompts of 100 and completions of 40 compute 8 x 140 positions whole, 100 + 8 x 40 in
    one group; under checkpointing every row goes whole whatever the group."""
    model = small_model("llama", torch.bfloat16, with_lora=False)
    shared, whole = (costs.Workload(8, 100, 40, 8, 8, group_size=g) for g in (8, 1))
    assert costs.update_tokens(shared, 8) == (100, 320) and costs.update_tokens(whole, 8) == (800, 320)
    checkpointed = costs.Workload(8, 100, 40, 8, 8, gradient_checkpointing=True, group_size=8)
    assert costs.update_tokens(checkpointed, 8) == (800, 320)
    flops = {g: costs.iteration_flops(model, w)["update"] for g, w in ((8, shared), (1, whole))}
    assert flops[8] / flops[1] == pytest.approx(420 / 1120)
    assert costs.activation_bytes(model, shared)[0] < costs.activation_bytes(model, whole)[0]


@pytest.mark.parametrize("n, micro_batch, hidden, new_tokens", [(8, 2, 64, 24),    # gradients live in later forwards
                                                                (1, 1, 256, 2)])   # the optimizer step is the peak
def test_the_estimated_peak_follows_micro_batches_and_the_optimizer_step(n, micro_batch, hidden, new_tokens):
    model = small_model("llama", torch.bfloat16, with_lora=False, hidden=hidden)
    batch = padded_batch(n, 4, new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    grpo.grpo_step(model, optimizer, batch, grpo.LossConfig(), micro_batch=micro_batch)
    measured = memory_estimate.measure_update(model, optimizer, batch, micro_batch=micro_batch)
    est = costs.estimate(model, costs.Workload(n, 4, new_tokens, micro_batch, n))
    assert est.total_bytes == pytest.approx(measured, rel=0.10)


def test_the_update_flops_by_hand_with_and_without_lora():
    # small Llama: per block q and o 64 x 64, k and v 64 x 32 (2 of 4 heads), gate, up and down 64 x 192; the
    # untied head 256 x 64; the input embedding a lookup: 2 x 49,152 + 16,384 = 114,688 multiplying weights. The
    # update computes 100 + 8 x 40 = 420 positions of one group: forward 2, activation gradients 2 and weight
    # gradients 2 FLOPs a weight a position, the last only where every weight trains
    work = costs.Workload(8, 100, 40, 8, 8, group_size=8)
    full = small_model("llama", torch.bfloat16, with_lora=False)
    assert costs.multiplying_parameters(full) == 114_688
    assert costs.iteration_flops(full, work)["update"] == 6 * 114_688 * 420
    # rank-4 adapters on the 7 linears of each block, r x (in + out): 2 x (512 + 384 + 384 + 512 + 3 x 1,024)
    adapted = small_model("llama", torch.bfloat16, with_lora=True)
    assert costs.multiplying_parameters(adapted) == 114_688 + 9_728
    assert costs.iteration_flops(adapted, work)["update"] == 4 * (114_688 + 9_728) * 420


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_the_flop_count_is_the_matmuls_of_a_forward(family):
    from torch.utils.flop_counter import FlopCounterMode
    model = small_model(family, torch.float32, with_lora=False).eval()
    batch = padded_batch(3, 6, 4)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    matmuls = sum(count for op, count in counter.get_flop_counts()["Global"].items() if "attention" not in str(op))
    est = costs.estimate(model, costs.Workload(3, 6, 4, 3, train_sequences=0))
    assert est.flops == matmuls      # an untied input embedding is a lookup, not a matmul


@pytest.mark.parametrize("estimate, lora_rank", [("exact", 0), ("last:2", 0), ("last:0", 0), ("exact", 4)])
def test_curation_flops_count_what_the_gradient_norms_multiply(estimate, lora_rank):
    # the reference: torch's own count of every matrix product one real call of the norms makes; the model is a
    # cost estimate, within 10% (under LoRA it counts a few products the backward need not take)
    from torch.utils.flop_counter import FlopCounterMode
    tok = tiny.tiny_tokenizer("qwen2")
    model = tiny.tiny_model("qwen2", tiny.TinyShape(64, 3, 4, 0), len(tok), 0)
    model = lora.add_lora(model, lora_rank, 2 * lora_rank) if lora_rank else model
    rows, seq, steps = 5, 40, 4
    ids = torch.randint(1, len(tok), (rows, seq), generator=torch.Generator().manual_seed(0))
    spans = [[(16 + 6 * k, 22 + 6 * k) for k in range(steps - 1)] + [(34, seq)] for _ in range(rows)]
    scope = grad_norms.ccm_scope(model, estimate)
    with FlopCounterMode(display=False) as counter:
        grad_norms.step_grad_norms(model, ids, torch.ones_like(ids), spans, *scope)
    modelled = costs.curation_flops(model, scope, diagnosed=rows, crossed=0, seq=seq, steps=steps, window=seq - 16)
    norms = sum(v for k, v in modelled.items() if k.startswith("norms"))
    assert norms == pytest.approx(counter.get_total_flops(), rel=0.1)
    assert modelled["crossing"] == 0
    with FlopCounterMode(display=False) as counter:
        with torch.no_grad():
            model(input_ids=ids)
    crossing = costs.curation_flops(model, scope, diagnosed=0, crossed=rows, seq=seq, steps=steps)["crossing"]
    assert crossing == pytest.approx(counter.get_total_flops(), rel=0.1)


def test_curation_cost_at_scale_orders_the_estimates_by_what_they_differentiate():
    from benchmarks import curation_cost
    model = curation_cost.meta_model("Qwen/Qwen2.5-0.5B-Instruct", lora_rank=0)
    row = curation_cost.rows(model, costs.Workload(128, 100, 40, 8, 256), offers=128, own=32, steps=4)
    assert row["curation, last:0"] < row["curation, last:2"] < row["curation, exact"]
    # every estimate runs the receiver forward over each diagnosed and each crossed trajectory at least
    forwards = 2 * costs.multiplying_parameters(model) * 140 * (128 + 32 + 128) / 1e12
    assert row["curation, last:0"] > forwards
