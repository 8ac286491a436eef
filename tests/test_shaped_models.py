"""The small pair's shaped stand-ins (benchmarks/shaped_models.py): the published sizes of the models they stand
for, and a stand-in that the run's own loader reads from --model-dir and rolls out with its family's tokenizer."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks import shaped_models
from testbed import arith, policies, presets, tiny

PUBLISHED_PARAMETERS = {"Qwen/Qwen2.5-0.5B-Instruct": 494_032_768, "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
                        "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400}
"""each model's parameter count as its model card gives it (embeddings tied to the head, counted once)"""


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED_PARAMETERS))
def test_a_stand_in_has_its_models_published_parameter_count(hub_id):
    with torch.device("meta"):   # shapes only: nothing is allocated
        model = AutoModelForCausalLM.from_config(shaped_models.shaped_config(hub_id))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[hub_id]


def test_a_model_without_a_recorded_shape_is_refused_with_the_ones_that_have_one(tmp_path):
    gemma = next(s for s in presets.preset("trio", "small") if s.family == "gemma3")
    with pytest.raises(ValueError, match="Llama-3.2-1B-Instruct"):
        shaped_models.write_shaped_model(gemma, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow   # writes and loads two stand-ins of a layer each (embeddings of 136M and 263M parameters)
def test_the_runs_loader_reads_a_stand_in_pair_from_model_dir_and_rolls_out(tmp_path):
    model_dir = shaped_models.write_pair("qwen-llama", tmp_path, layers=1)
    task = arith.TaskConfig(num_steps=1, max_operand=9)
    for index, spec in enumerate(presets.preset("qwen-llama", "small")):
        policy = policies.load_policy("qwen-llama", "small", index, torch.device("cpu"), task, 0,
                                      model_dir=str(model_dir))
        shape = shaped_models.ARCHITECTURES[spec.hub_id]
        cfg = policy.model.config
        # the head keeps a row per token of the tokenizer (Qwen2.5 pads its 151,669 to 151,936; load trims them)
        tokens = len(policy.tokenizer)
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (shape["hidden_size"], 1, tokens)
        assert policy.model.get_output_embeddings().weight.shape[0] == tokens <= shape["vocab_size"]
        text = "7 + 5 = 12\nAnswer: 12"
        assert policy.tokenizer(text)["input_ids"] == tiny.full_tokenizer(spec.family)(text)["input_ids"]
        out = policy.rollout(["What is 7 + 5?"], 2, 4, greedy=False)
        assert len(out.texts) == 2
