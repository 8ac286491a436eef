"""SmolLM2-135M-Instruct, the real pretrained model every install has (policies.packaged_gguf), on the real path:
GGUF loading, retokenization between its 49k vocabulary and the trimmed ones, exact per-step gradient norms on its
30 layers, and one iteration of every sharing level beside the tiny Qwen policy, with and without LoRA."""

import copy
import json
import math
import shutil

import pytest
import torch

import grad_norms
import reachability
import sharing
import tokalign
import train
from args import Args
from testbed import arith, metrics_log, policies, tasks, tiny
from testbed.token_bytes import encode_text

pytestmark = pytest.mark.slow   # every test here loads SmolLM2-135M's real weights

TASK = arith.TaskConfig(num_steps=1, max_operand=9)   # test_train's task: the tiny Qwen warm-up is shared
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def smol() -> policies.Policy:
    """Loaded once, through the run's own loader, from the packaged GGUF file."""
    return policies.load_policy("qwen-llama", "tiny", 1, CPU, TASK, 0,
                                model_paths={"llama": str(policies.packaged_gguf())})


def test_smol_loads_from_its_gguf_file_or_folder_and_answers_through_its_chat_template(smol, tmp_path):
    cfg = smol.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, len(smol.tokenizer)) == (30, 576, 49152, 49152)
    assert not getattr(smol.model, "is_quantized", False) and smol.model.dtype == torch.float32
    assert policies.gguf_file(str(policies.packaged_gguf().parent)) == policies.packaged_gguf()
    for extra in ("a.gguf", "b.gguf"):
        (tmp_path / extra).touch()
    with pytest.raises(ValueError, match="2 GGUF files"):
        policies.gguf_file(str(tmp_path))
    assert smol.use_chat_template and "<|im_start|>assistant" in smol.tokenizer.decode(smol.encode_prompt("hi"))
    out = smol.rollout(["What is 7 + 5? Answer with the number."], 1, 12, greedy=True)
    assert "12" in out.texts[0]


TEXTS = ["7 + 5 = 12\n12 - 3 = 9\nAnswer: 9", "Sure! The answer is 12.\n\nThis is a classic example.",
         "héllo wörld 数学 😀", "def add(a, b):\n    return a + b  # <|im_end|> stays text"]


@pytest.mark.parametrize("family", ["qwen2", "llama", "mistral"])
def test_smol_text_retokenizes_into_each_trimmed_vocabulary_and_back_byte_for_byte(smol, family):
    # a trimmed vocabulary keeps the byte alphabet, so it spells any text, if in more tokens than the full one
    trimmed = policies.Policy("tiny", torch.nn.Linear(1, 1), tiny.tiny_tokenizer(family), False)
    for text in TEXTS:
        for writer, reader in ((smol, trimmed), (trimmed, smol)):
            src = tokalign.Encoding.from_ids(encode_text(writer.tokenizer, text), writer.token_bytes)
            tgt = tokalign.retokenize(src, reader.tokenizer, reader.token_bytes)
            alignment = tokalign.align(src, tgt)
            assert src.data == text.encode()
            assert alignment.residual == 0 and all(alignment.exact) and tgt.data == src.data
    assert len(encode_text(trimmed.tokenizer, TEXTS[1])) > 2 * len(encode_text(smol.tokenizer, TEXTS[1]))


def test_a_text_the_receiver_cannot_encode_is_dropped_and_counted(smol, monkeypatch):
    completions = [smol.encode_completion(text, eos=True) for text in ("7 + 5 = 12", "12▁")]
    rollouts = policies.Rollouts([torch.tensor(smol.encode_prompt("What is 7 + 5?"))] * 2,
                                 [torch.tensor(c) for c in completions], [torch.zeros(len(c)) for c in completions],
                                 [], [], [True, True], 2)
    peer = sharing.Experience(smol, ["What is 7 + 5?"], rollouts, torch.tensor([[1.0, 0.0]]),
                              torch.tensor([[1.0, -1.0]]))
    receiver = policies.Policy("tiny", torch.nn.Linear(1, 1), tiny.tiny_tokenizer("mistral"), False)

    def cannot_spell(tokenizer, text):
        raise ValueError("this metaspace tokenizer has no byte-fallback tokens to spell a literal U+2581 in the text")
    monkeypatch.setattr(tokalign, "encode_text", cannot_spell)
    assert sharing.cross(peer, [(0, 1.0), (1, -1.0)], receiver, sharing.ShareConfig("prp", temperature=1.0)) == []
    assert sharing.crossing_metrics([], 2.0, picked=2) == {"sharing/received": 0.0, "sharing/dropped": 2.0}


def solution_item(policy, problem) -> reachability.Item:
    """A reference solution of `problem` as `policy` scores it, each line a step."""
    encoding = tokalign.Encoding.from_ids(policy.encode_completion(arith.solution(problem), eos=True),
                                          policy.token_bytes)
    return reachability.step_item(policy.encode_prompt(arith.prompt_text(problem)), encoding, tasks.line_spans)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_smol_step_grad_norms_on_its_30_layers_equal_one_backward_per_step(smol, lora_rank):
    model = smol.model
    if lora_rank:
        from testbed import lora
        model = lora.add_lora(copy.deepcopy(model), lora_rank, 8.0)
        for name, p in model.named_parameters():   # peft starts B at 0; random adapters give every term a gradient
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(0))
    problems = arith.generate_problems(1, "heldout", 0, arith.TaskConfig(num_steps=2, max_operand=50))
    items = [solution_item(smol, q) for q in problems]
    inputs = reachability.batch_inputs(items, smol.tokenizer.pad_token_id)
    # every block's weights (the tied 49k x 576 embedding left out for time: tests/test_grad_norms.py checks it)
    params = (grad_norms.parameter_subset(model, "lora") if lora_rank else
              [p for name, p in model.named_parameters() if ".layers." in name])
    batched = grad_norms.step_grad_norms(model, *inputs, params)
    loop = grad_norms.step_grad_norms_loop(model, *inputs, params)
    assert len(batched) == sum(len(r) for _, _, r in items) == 3 and (batched > 0).all()
    torch.testing.assert_close(batched, loop, rtol=2e-3, atol=0)


# ---- one iteration of every sharing level ---------------------------------------------------------------------

REWARDS = {"qwen": [[1.0, 0.0], [1.0, 0.0]], "llama": [[1.0, 0.0], [0.0, 0.0]]}
"""scripted rewards, so that what crosses does not depend on what was sampled: every group of qwen's is mixed; llama
fails its second prompt, which qwen solves (an SGT rescue)"""

RECEIVED = {"prp": {"qwen": 2, "llama": 4}, "sgt": {"qwen": 0, "llama": 1}, "xgrpo": {"qwen": 4, "llama": 4}}
"""what crosses under those rewards: PRP every peer rollout with a non-zero advantage; SGT qwen's one success on the
prompt llama failed; XGRPO every peer reward on the same prompts"""


@pytest.fixture(scope="module")
def smol_cut(smol) -> policies.Policy:
    """SmolLM2 cut to the first 2 of its 30 blocks: its real embedding, vocabulary, chat template and first blocks
    at a fifteenth of the time per token, for the sweep over sharing levels."""
    cut = copy.deepcopy(smol)
    cut.model.model.layers = cut.model.model.layers[:2]
    cut.model.config.num_hidden_layers = 2
    return cut


@pytest.fixture
def scripted(monkeypatch, scripted_rewards):
    """Runs reward by REWARDS; `scripted(policy)` makes them build SmolLM2 as a copy of `policy` (loading it again
    takes seconds)."""
    scripted_rewards(lambda policy, problems: torch.tensor(REWARDS[policy.name]))
    return lambda policy: monkeypatch.setattr(policies, "load_hub_policy", lambda *a: copy.deepcopy(policy))


def real_weights_args(tmp_path, cache_dir, **overrides) -> Args:
    settings = dict(model_paths=(f"llama={policies.packaged_gguf()}",), iterations=1, prompts_per_iteration=2,
                    group_size=2, max_new_tokens=8, eval_size=1, eval_samples=0, train_size=20,
                    num_steps=TASK.num_steps, max_operand=TASK.max_operand, warmup_scale=0.15, temperature=1.0,
                    runs_dir=str(tmp_path), cache_dir=cache_dir, name="run")
    return Args(**{**settings, **overrides})


def check_one_iteration(run_dir, share: str, before: policies.Policy, lora_rank: int) -> None:
    """Both policies trained with finite losses, what crossed is what the scripted rewards let cross, every offer
    of cross-fidelity got a logged decision, and SmolLM2's weights (or adapters) moved."""
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = {r["policy"]: r for r in logged if "charts/reward_mean" in r}
    assert set(trained) == {"qwen", "llama"}
    assert all(math.isfinite(r["losses/policy_loss"]) for r in trained.values())
    for name, count in RECEIVED.get(share, {}).items():
        assert trained[name]["sharing/received"] == count
    if share == "cross-fidelity":   # every peer rollout is offered to each receiver
        decisions = [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines()]
        assert len(decisions) == 8 and all(d["level"] for d in decisions)
    saved = torch.load(run_dir / "checkpoints" / "iter-000001" / "llama.pt")["model"]
    if lora_rank:   # peft starts every B at 0
        assert saved and all("lora_" in k for k in saved) and any(v.abs().sum() > 0 for k, v in saved.items()
                                                                   if "lora_B" in k)
    else:
        start = before.model.state_dict()
        assert any(not torch.equal(start[k], v) for k, v in saved.items())
    shutil.rmtree(run_dir / "checkpoints")   # hundreds of MB each


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("share", ["none", "prp", "xgrpo", "sgt", "hacpo", "graft", "cross-fidelity"])
def test_real_weights_one_iteration_of_every_sharing_level(tmp_path, cache_dir, smol_cut, scripted, share, lora_rank):
    scripted(smol_cut)
    run_dir = train.main(real_weights_args(tmp_path, cache_dir, share=share, lora_rank=lora_rank))
    check_one_iteration(run_dir, share, smol_cut, lora_rank)


def test_real_weights_cross_fidelity_with_lora_on_all_30_layers(tmp_path, cache_dir, smol, scripted):
    scripted(smol)
    run_dir = train.main(real_weights_args(tmp_path, cache_dir, share="cross-fidelity", lora_rank=4))
    check_one_iteration(run_dir, "cross-fidelity", smol, 4)


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_real_weights_resume_equals_an_uninterrupted_run(tmp_path, cache_dir, smol_cut, scripted, lora_rank):
    # a checkpoint keeps state dicts (transformers' save_pretrained refuses a model loaded from GGUF as it loads)
    scripted(smol_cut)
    whole = train.main(real_weights_args(tmp_path, cache_dir, iterations=2, lora_rank=lora_rank, name="whole"))
    train.main(real_weights_args(tmp_path, cache_dir, iterations=1, lora_rank=lora_rank, name="extended"))
    extended = train.main(real_weights_args(tmp_path, cache_dir, iterations=2, lora_rank=lora_rank, name="extended",
                                            resume=True))
    a, b = (torch.load(run / "checkpoints" / "iter-000002" / "llama.pt")["model"] for run in (whole, extended))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the training lines: the shorter run also evaluated at its last iteration
    strip = lambda run: [metrics_log.timeless(r) for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                                              .splitlines()) if "charts/reward_mean" in r]
    assert strip(whole) == strip(extended)
    for run in (whole, extended):
        shutil.rmtree(run / "checkpoints")


def test_real_weights_benchmark_at_a_tiny_size(smol_cut):
    from benchmarks import smollm2
    problem = arith.generate_problems(1, "heldout", 0)[0]
    assert smollm2.last_number_right(problem, f"so {problem.answer - 1}, no: {problem.answer}.")
    assert not smollm2.last_number_right(problem, f"{problem.answer} then {problem.answer + 1}")
    measured = smollm2.accuracy(smol_cut, eval_size=2, humaneval=1, max_new_tokens=4, code_tokens=4)
    assert {task: n for task, (_, n) in measured.items()} == {"arith": 2, "arith, last number": 2, "humaneval": 1}
    for rank in (0, 4):   # costs.estimate holds for SmolLM2's shape as for the tiny ones (tests/test_costs.py)
        estimated, peak = smollm2.update_memory(copy.deepcopy(smol_cut), rank, prompt_len=24, n=2)
        assert 0.9 < estimated / peak < 1.1
