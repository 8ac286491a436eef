"""The default run's packaged warm-ups (testbed/warmups/, issue 69): they are the ones the default run asks for, a run
starts from exactly their weights, only a run asking for exactly that warm-up takes them (every other seed warms up
as before), and a run's start record says where each warm-up came from."""

import dataclasses
import re
import shutil
import sys

import torch

from args import Args
from benchmarks import warmup_curve
from testbed import arith, checkpoint, policies, presets, tiny

REGENERATE = "python -m benchmarks.warmup_curve --package"
REGISTERED_SEEDS = [*range(1001, 1031), *range(3001, 3031), *range(6001, 6031), *range(7001, 7031)]
"""the registered seeds (the pilot and the matrix, the premise, H3, HACPO-official: analysis/sets.py and
analysis/premise_registered.py), more of each range than any set draws"""


def default_files(cache_dir: str) -> dict[str, str]:
    """Each default policy's warm-up file name as the default run computes it (policies.warm_up_cached), by policy."""
    args, files = Args(), {}
    for i, spec in enumerate(presets.preset(args.pair, "tiny")):
        vocab = len(tiny.tiny_tokenizer(spec.family, args.task_config.step_format, cache_dir))
        steps = round(spec.tiny.warmup_steps * args.warmup_scale)
        key = policies.warmup_key(spec, args.task_config, presets.tiny_seed(spec, i, args.seed), steps, vocab)
        files[spec.name] = f"{spec.name}-{key}.pt"
    return files


def test_the_packaged_warm_ups_are_the_default_runs_and_a_default_run_starts_from_their_weights(cache_dir):
    wanted = default_files(cache_dir)
    shipped = sorted(p.name for p in tiny.PACKAGED_WARMUPS.glob("*.pt"))
    assert shipped == sorted(wanted.values()), (
        f"testbed/warmups/ holds {shipped}, the default run asks for {sorted(wanted.values())}: the warm-up's recipe "
        f"or key changed; make them anew with `{REGENERATE}` and commit them")
    args = Args()
    built = policies.load_policies(args.pair, "tiny", torch.device("cpu"), args.task_config, args.seed, cache_dir,
                                   warmup_scale=args.warmup_scale)
    for policy in built:
        stored = torch.load(tiny.PACKAGED_WARMUPS / wanted[policy.name])
        loaded = policy.model.state_dict()
        assert list(loaded) == list(stored) and all(torch.equal(loaded[k], stored[k]) for k in stored)
        assert loaded[next(iter(stored))].dtype == torch.float32
        assert policies.warm_starts[policy.name].startswith("packaged: ")


def test_the_regenerate_command_replaces_the_packaged_files_with_warm_ups_the_default_run_asks_for(
        cache_dir, tmp_path, monkeypatch):
    """REGENERATE through the script's own entry point, on a three-step warm-up recipe so that it takes seconds."""
    quick = [dataclasses.replace(spec, tiny=dataclasses.replace(spec.tiny, warmup_steps=3))
             for spec in presets.preset(Args().pair, "tiny")]
    monkeypatch.setitem(presets.PRESETS["tiny"], Args().pair, quick)
    packaged = tmp_path / "warmups"
    packaged.mkdir()
    for shipped in tiny.PACKAGED_WARMUPS.glob("*.pt"):
        shutil.copy(shipped, packaged / shipped.name)
    monkeypatch.setattr(tiny, "PACKAGED_WARMUPS", packaged)
    monkeypatch.setattr(sys, "argv", ["warmup_curve", *REGENERATE.split()[3:]])
    threads = torch.get_num_threads()
    try:
        warmup_curve.main()
    finally:
        torch.set_num_threads(threads)          # the command sets one thread for the process
    wanted = default_files(cache_dir)
    assert sorted(p.name for p in packaged.glob("*.pt")) == sorted(wanted.values())     # the old files gone
    for i, spec in enumerate(quick):
        made = torch.load(packaged / wanted[spec.name])
        vocab = len(tiny.tiny_tokenizer(spec.family, "line", cache_dir))
        start = tiny.tiny_model(spec.family, spec.tiny, vocab, presets.tiny_seed(spec, i, Args().seed)).state_dict()
        assert list(made) == list(start) and any(not torch.equal(made[k], start[k]) for k in start)   # warmed up


def test_no_registered_seed_asks_for_a_packaged_warm_up(cache_dir):
    shipped = {p.name for p in tiny.PACKAGED_WARMUPS.glob("*.pt")}
    for pair in presets.PRESETS["tiny"]:
        for i, spec in enumerate(presets.preset(pair, "tiny")):
            vocab = len(tiny.tiny_tokenizer(spec.family, "line", cache_dir))
            for seed in REGISTERED_SEEDS:
                key = policies.warmup_key(spec, arith.TaskConfig(), presets.tiny_seed(spec, i, seed),
                                          spec.tiny.warmup_steps, vocab)
                assert f"{spec.name}-{key}.pt" not in shipped, (pair, seed)


def reference_warm_up(spec: presets.PolicySpec, seed: int, warmup_scale: float, cache_dir: str) -> policies.Policy:
    """The warm-up as it was before any was packaged: the tiny model of that seed, trained by the recipe."""
    tokenizer = tiny.tiny_tokenizer(spec.family, "line", cache_dir)
    policy = policies.Policy(spec.name, tiny.tiny_model(spec.family, spec.tiny, len(tokenizer), seed), tokenizer,
                             use_chat_template=False)
    policies.supervised_warmup(policy, round(spec.tiny.warmup_steps * warmup_scale), arith.TaskConfig(), seed,
                               spec.tiny.premature_share)
    return policy


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_packaged_warm_up_is_taken_by_its_exact_key_alone_and_other_seeds_warm_up_as_before(cache_dir, tmp_path,
                                                                                                monkeypatch, capsys):
    monkeypatch.setattr(tiny, "PACKAGED_WARMUPS", tmp_path / "packaged")
    spec, scale = presets.PRESETS["tiny"]["qwen-llama"][0], 0.01
    made = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path / "made"), scale)
    (made_file,) = (tmp_path / "made" / "warmup").glob("*.pt")
    # the packaged file holds other weights than this machine makes, so that taking it shows
    state = made.model.state_dict()
    next(iter(state.values())).view(-1)[0] += 1.0
    (tmp_path / "packaged").mkdir()
    torch.save(state, tmp_path / "packaged" / made_file.name)

    packaged = policies.load_tiny_policy(spec, arith.TaskConfig(), 0, str(tmp_path / "fresh"), scale)
    assert all(torch.equal(packaged.model.state_dict()[k], v) for k, v in state.items())
    assert not (tmp_path / "fresh" / "warmup").exists()          # taken from the package, nothing warmed or cached
    assert re.search(r"^qwen: warm-up packaged: .*packaged/qwen-\w+\.pt$", capsys.readouterr().err, re.M)

    # a registered seed: warmed up by the recipe as before any warm-up was packaged, then found in the cache
    other = policies.load_tiny_policy(spec, arith.TaskConfig(), 1001, str(tmp_path / "registered"), scale)
    assert same_weights(other.model, reference_warm_up(spec, 1001, scale, cache_dir).model)
    assert policies.warm_starts["qwen"].startswith(f"warmed up now ({round(spec.tiny.warmup_steps * scale)} steps): ")
    cached = policies.load_tiny_policy(spec, arith.TaskConfig(), 1001, str(tmp_path / "registered"), scale)
    assert same_weights(cached.model, other.model) and policies.warm_starts["qwen"].startswith("cached: ")


def test_a_sitting_records_where_each_warm_up_came_from_once(tmp_path, monkeypatch):
    monkeypatch.setattr(policies, "warm_starts", {"a": "packaged: a.pt", "c": "cached: c.pt"})
    first = checkpoint.record_sitting(tmp_path, 0, {"a": "1", "b": "2"}, {"a": "1", "b": "2"})
    assert first["sittings"][0]["warm_up"] == {"a": "packaged: a.pt"}             # only the run's own policies
    assert policies.warm_starts == {"c": "cached: c.pt"}
    again = checkpoint.record_sitting(tmp_path, 4, {"a": "1", "b": "2"}, {"a": "5", "b": "6"})
    assert "warm_up" not in again["sittings"][1]                 # a note taken once: not carried to a later sitting
