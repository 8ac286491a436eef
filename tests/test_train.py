"""End-to-end: a tiny run changes every policy and logs the documented metrics; a killed run resumes exactly."""

import json
import re
import shlex
import struct
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import tyro

import eval as evaluation
import grpo
import train
from args import Args
from testbed import arith, checkpoint, metrics_log, policies, presets, tiny

TRAIN_KEYS = {"iteration", "policy", "time_s", "losses/policy_loss", "losses/clip_ratio", "losses/kl",
              "losses/entropy", "losses/grad_norm", "charts/completion_len", "charts/reward_mean",
              "charts/reward_std", "charts/zero_std_groups", "charts/finished", "perf/rollout_tokens_per_s",
              "perf/update_tokens_per_s", "perf/rollout_tokens", "perf/update_tokens", "perf/iteration_s"}
EVAL_KEYS = {"iteration", "policy", "time_s", "eval/heldout_accuracy", "eval/heldout_sampled_accuracy"}


# an easy task, a short warm-up and a hot sampler, so that groups with mixed rewards (hence gradients) exist
TASK = arith.TaskConfig(num_steps=1, max_operand=9)


def tiny_args(tmp_path, cache_dir, **overrides) -> Args:
    settings = dict(share="none", iterations=2, prompts_per_iteration=8, group_size=6, max_new_tokens=16, eval_size=8,
                    eval_every=1, train_size=200, num_steps=TASK.num_steps, max_operand=TASK.max_operand,
                    warmup_scale=0.15, temperature=1.0, lr=1e-4, runs_dir=str(tmp_path), cache_dir=cache_dir,
                    name="run")
    settings.update(overrides)
    return Args(**settings)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_pair_with_no_preset_at_its_scale_is_refused_before_the_run_writes_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # small by default, which has no qwen-mistral
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="unknown pair 'qwen-mistral' at scale small"):
        train.run(Args(pair="qwen-mistral", runs_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []
    assert train.LocalTeam(Args(pair="qwen-mistral", devices="cpu")).scale == "tiny"


def killed_in_iteration(monkeypatch, iteration: int, args: Args) -> None:
    """Run `args` (a pair) until the first update of `iteration`, which raises KeyboardInterrupt as a kill would;
    the update is itself again after."""
    real_step, calls = grpo.grpo_step, []

    def dies(*a, **k):
        calls.append(1)
        if len(calls) == 2 * (iteration - 1) + 1:   # two policies an iteration
            raise KeyboardInterrupt
        return real_step(*a, **k)
    monkeypatch.setattr(grpo, "grpo_step", dies)
    with pytest.raises(KeyboardInterrupt):
        train.main(args)
    monkeypatch.setattr(grpo, "grpo_step", real_step)


MIXED = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
"""every group's scripted rewards: mixed, so every update has advantages to follow, whatever was sampled"""


@pytest.mark.parametrize("pair", ["qwen-llama", "trio", "qwen-mistral", "llama-mistral"])
def test_two_iterations_change_every_policy_and_log_the_documented_metrics(tmp_path, cache_dir, pair,
                                                                           scripted_rewards):
    scripted_rewards(lambda policy, problems: torch.tensor([MIXED] * len(problems)))
    args = tiny_args(tmp_path, cache_dir, pair=pair, beta=0.1, epochs=2)
    run_dir = train.main(args)
    specs = presets.PRESETS["tiny"][pair]
    for i, spec in enumerate(specs):
        warm = policies.load_policy(pair, "tiny", i, torch.device("cpu"), TASK, args.seed, cache_dir,
                                    warmup_scale=args.warmup_scale)
        trained = torch.load(run_dir / "checkpoints" / "iter-000002" / f"{spec.name}.pt")["model"]
        changed = [name for name, p in warm.model.state_dict().items() if not torch.equal(p, trained[name])]
        assert changed, f"{spec.name} did not change"
    logged = records(run_dir)
    for spec in specs:
        mine = [r for r in logged if r["policy"] == spec.name]
        assert [set(r) for r in mine if "charts/reward_mean" in r] == [TRAIN_KEYS] * 2
        assert [r["iteration"] for r in mine if set(r) == EVAL_KEYS] == [0, 1, 2]
        assert [r["charts/reward_mean"] for r in mine if "charts/reward_mean" in r] == [pytest.approx(0.5)] * 2
    report = (run_dir / "report.md").read_text()
    assert all(spec.name in report for spec in specs) and (run_dir / "curves.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{}, dict(share="prp", lora_rank=4, beta=0.1),
                                     dict(share="cross-fidelity", thresholds="adaptive"), dict(share="hacpo")],
                         ids=["full", "prp-lora-kl", "cross-fidelity-adaptive", "hacpo"])
def test_a_killed_run_resumes_and_a_shorter_one_extends_to_where_an_uninterrupted_one_ends(tmp_path, cache_dir,
                                                                                         monkeypatch, setting, capsys):
    overrides = dict(iterations=4, checkpoint_every=2, eval_every=2, **setting)
    whole = train.main(tiny_args(tmp_path, cache_dir, name="whole", **overrides))

    killed_in_iteration(monkeypatch, 4, tiny_args(tmp_path, cache_dir, name="killed", **overrides))
    assert "the same command with --resume continues killed" in capsys.readouterr().err
    assert (tmp_path / "killed" / "checkpoints" / "latest").read_text() == "iter-000002"
    resumed = train.main(tiny_args(tmp_path, cache_dir, name="killed", resume=True, **overrides))

    for name in ("qwen", "llama"):
        a = torch.load(whole / "checkpoints" / "iter-000004" / f"{name}.pt")
        b = torch.load(resumed / "checkpoints" / "iter-000004" / f"{name}.pt")
        for key in a["model"]:
            torch.testing.assert_close(a["model"][key], b["model"][key], rtol=0, atol=0)
    assert list(map(metrics_log.timeless, records(whole))) == list(map(metrics_log.timeless, records(resumed)))

    short = {**overrides, "iterations": 2}
    train.main(tiny_args(tmp_path, cache_dir, name="extended", **short))
    extended = train.main(tiny_args(tmp_path, cache_dir, name="extended", resume=True, **overrides))
    assert list(map(metrics_log.timeless, records(whole))) == list(map(metrics_log.timeless, records(extended)))


@pytest.mark.slow
def test_the_evaluation_schedule_changes_nothing_a_run_trains_on(tmp_path, cache_dir):
    # the branches' calls evaluate every 5 iterations where the comparison evaluates every 10: their trunks and
    # branches must train as they would on any schedule, every metric and curation decision bit for bit
    runs = {every: train.main(tiny_args(tmp_path, cache_dir, name=f"every-{every}", share="cross-fidelity",
                                        iterations=3, eval_every=every)) for every in (1, 3)}
    trained = {every: [metrics_log.timeless(r) for r in records(run_dir) if "eval/heldout_accuracy" not in r]
               for every, run_dir in runs.items()}
    assert len(trained[1]) == 3 * 2 and trained[1] == trained[3]
    decisions = {every: [metrics_log.timeless(json.loads(line)) for line in
                         (run_dir / "fidelity.jsonl").read_text().splitlines()] for every, run_dir in runs.items()}
    assert decisions[1] and decisions[1] == decisions[3]
    evaluated = {every: sorted({r["iteration"] for r in records(run_dir) if "eval/heldout_accuracy" in r})
                 for every, run_dir in runs.items()}
    assert evaluated == {1: [0, 1, 2, 3], 3: [0, 3]}


def test_an_existing_run_is_not_overwritten_nor_resumed_with_other_settings(tmp_path, cache_dir):
    train.main(tiny_args(tmp_path, cache_dir, iterations=1))
    with pytest.raises(FileExistsError, match="--resume"):
        train.main(tiny_args(tmp_path, cache_dir, iterations=1))
    with pytest.raises(FileExistsError, match=r"other settings \(\['lr'\]\): pass --name") as refused:
        train.main(tiny_args(tmp_path, cache_dir, iterations=1, lr=0.5))
    assert "--resume" not in str(refused.value)   # it would be refused too
    with pytest.raises(ValueError, match="lr"):
        train.main(tiny_args(tmp_path, cache_dir, iterations=1, lr=0.5, resume=True))
    with pytest.raises(FileNotFoundError, match="no run in .*rnu to continue .*runs in .*: run"):
        train.main(tiny_args(tmp_path, cache_dir, iterations=1, name="rnu", resume=True))
    assert not (tmp_path / "rnu").exists()
    with pytest.raises(ValueError, match="NAME=PATH"):
        train.main(tiny_args(tmp_path, cache_dir, name="other", model_paths=("qwen",)))


def test_a_fingerprint_tells_weights_apart_by_a_single_bit_and_only_by_the_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2, dtype=torch.bfloat16))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2, dtype=torch.bfloat16))
    assert checkpoint.weights_fingerprint(model) != checkpoint.weights_fingerprint(twin)   # other draws
    twin.load_state_dict(model.state_dict())
    assert checkpoint.weights_fingerprint(model) == checkpoint.weights_fingerprint(twin)
    with torch.no_grad():   # the last bit of one bf16 weight
        bits = twin[1].weight.view(torch.int16)
        bits[0, 0] ^= 1
    assert checkpoint.weights_fingerprint(model) != checkpoint.weights_fingerprint(twin)


def test_a_resume_keeps_the_lines_up_to_its_checkpoint_drops_a_torn_last_line_and_refuses_a_bad_one_elsewhere(
        tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = ['{"iteration": 0, "a": 1}', '{"iteration": 1, "a": 2}', '{"iteration": 2, "a": 3}']
    path.write_text("\n".join(lines) + '\n{"iteration": 3, "pol')
    checkpoint.truncate_metrics(path, 1)
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    path.write_text("\n".join([lines[0], '{"iteration": 1, "a"', lines[2]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a metrics record"):
        checkpoint.truncate_metrics(path, 2)
    assert path.read_text().count("\n") == 3            # refused, nothing lost
    checkpoint.truncate_metrics(tmp_path / "absent.jsonl", 1)
    assert not (tmp_path / "absent.jsonl").exists()


@pytest.mark.parametrize("start, evaluated", [(3, [0, 2]), (4, [0, 2, 4])])
def test_a_run_lengthened_past_a_last_iteration_off_the_evaluation_schedule_drops_that_evaluation(
        tmp_path, start, evaluated):
    """Evaluations every 2 iterations and at the last: a run of 3 evaluated at 3, which its lengthening to 6 would
    not have done; one of 4 ends on the schedule."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"iteration": 0, "eval/heldout_accuracy": 0.1}] + [
        line for it in range(1, start + 1) for line in ({"iteration": it, "charts/reward_mean": 0.5},
                                                         *([{"iteration": it, "eval/heldout_accuracy": 0.2}]
                                                           if it % 2 == 0 or it == start else []))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    train.open_metrics(Args(runs_dir=str(tmp_path), iterations=6, eval_every=2, tensorboard=False), run_dir, start)
    kept = records(run_dir)
    assert [r["iteration"] for r in kept if "eval/heldout_accuracy" in r] == evaluated
    assert [r["iteration"] for r in kept if "charts/reward_mean" in r] == list(range(1, start + 1))


def test_a_resume_killed_while_trimming_its_log_leaves_the_log_whole(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    lines = "".join(json.dumps({"iteration": it, "charts/reward_mean": 0.5}) + "\n" for it in range(5))
    path.write_text(lines)

    def torn(self, text, *args, **kwargs):                       # the disk fills half-way through the write
        with open(self, "w") as f:
            f.write(text[:len(text) // 2])
        raise OSError("No space left on device")
    monkeypatch.setattr(Path, "write_text", torn)
    with pytest.raises(OSError, match="No space"):
        checkpoint.truncate_metrics(path, 2)
    assert path.read_text() == lines


def test_a_run_resumed_shorter_ends_at_its_checkpoint_evaluated_as_an_uninterrupted_one_and_never_shorter(
        tmp_path, cache_dir, monkeypatch):
    # evaluations at 0 and the last iteration only; a run of 3 killed in its third iteration, checkpointed at 2
    overrides = dict(iterations=3, checkpoint_every=2, eval_every=5, prompts_per_iteration=4, group_size=2,
                     max_new_tokens=8, eval_size=4)
    killed_in_iteration(monkeypatch, 3, tiny_args(tmp_path, cache_dir, name="killed", **overrides))
    logged = (tmp_path / "killed" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="past --iterations 1: a run is not shortened; resume with --iterations 2"):
        train.main(tiny_args(tmp_path, cache_dir, name="killed", resume=True, **{**overrides, "iterations": 1}))
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == logged
    shortened = train.main(tiny_args(tmp_path, cache_dir, name="killed", resume=True, **{**overrides, "iterations": 2}))
    whole = train.main(tiny_args(tmp_path, cache_dir, name="whole", **{**overrides, "iterations": 2}))
    assert [r["iteration"] for r in records(shortened) if "eval/heldout_accuracy" in r] == [0, 0, 2, 2]
    assert list(map(metrics_log.timeless, records(whole))) == list(map(metrics_log.timeless, records(shortened)))


def test_a_resume_may_reach_its_run_by_another_spelling_of_its_folder_but_change_nothing_it_trains(tmp_path):
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"runs_dir": "runs", "iterations": 100, "lr": 1e-4, "seed": 1}))
    assert checkpoint.changed_settings(saved, {"runs_dir": "/home/me/project/runs", "iterations": 200, "lr": 1e-4,
                                               "seed": 1}) == []
    assert checkpoint.changed_settings(saved, {"runs_dir": "runs", "iterations": 100, "lr": 5e-5, "seed": 2}) == [
        "lr", "seed"]


def test_record_sitting_by_hand(tmp_path):
    first = checkpoint.record_sitting(tmp_path, 0, {"a": "1", "b": "2"}, {"a": "1", "b": "2"})
    assert first == {"fingerprints": {"a": "1", "b": "2"}, "sittings": [
        {"iteration": 0, "built": {"a": "1", "b": "2"}, "weights": {"a": "1", "b": "2"}}]}
    # a resume builds the same policies, then goes on from the checkpoint's weights
    second = checkpoint.record_sitting(tmp_path, 4, {"a": "1", "b": "2"}, {"a": "5", "b": "6"})
    assert second["fingerprints"] == {"a": "1", "b": "2"} and second["sittings"][1]["weights"] == {"a": "5", "b": "6"}
    # another machine builds b otherwise: refused, the record untouched; allowed, the sitting says so
    with pytest.raises(ValueError, match="b: 9 here, 2 then.*--allow-other-start"):
        checkpoint.record_sitting(tmp_path, 8, {"a": "1", "b": "9"}, {"a": "7", "b": "8"})
    assert json.loads((tmp_path / checkpoint.START).read_text()) == second
    third = checkpoint.record_sitting(tmp_path, 8, {"a": "1", "b": "9"}, {"a": "7", "b": "8"}, allow_other_start=True)
    assert third["sittings"][2]["other_start"] == ["b"] and third["fingerprints"] == {"a": "1", "b": "2"}
    # a sitting at iteration 0 (a run killed before its first checkpoint) begins the record anew, same check first
    with pytest.raises(ValueError, match="other starting weights"):
        checkpoint.record_sitting(tmp_path, 0, {"a": "3", "b": "2"}, {"a": "3", "b": "2"})
    assert checkpoint.record_sitting(tmp_path, 0, {"a": "1", "b": "2"}, {"a": "1", "b": "2"}) == first
    # a run begun before start.json existed has no known start
    (tmp_path / "old").mkdir()
    assert checkpoint.record_sitting(tmp_path / "old", 4, {"a": "1"}, {"a": "5"})["fingerprints"] is None


def test_a_resume_onto_other_starting_weights_is_refused_and_loses_nothing(tmp_path):
    # a cache of this test's own, whose qwen warm-up is then made "on another machine": one weight moved by 1e-3
    cache = str(tmp_path / "cache")
    run = train.main(tiny_args(tmp_path, cache, iterations=1))
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    warm = policies.load_tiny_policy(spec, TASK, 1, cache, 0.15)
    started = json.loads((run / checkpoint.START).read_text())
    assert started["fingerprints"]["qwen"] == checkpoint.weights_fingerprint(warm.model)
    (cached,) = (Path(cache) / "warmup").glob("qwen-*.pt")
    state = torch.load(cached)
    next(iter(state.values())).view(-1)[0] += 1e-3
    torch.save(state, cached)
    logged = (run / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"other starting weights than the run run began with \(qwen: .*"
                                         r"--allow-other-start"):
        train.main(tiny_args(tmp_path, cache, iterations=2, resume=True))
    assert (run / "metrics.jsonl").read_text() == logged and json.loads((run / checkpoint.START).read_text()) == started
    train.main(tiny_args(tmp_path, cache, iterations=2, resume=True, allow_other_start=True))
    resumed = json.loads((run / checkpoint.START).read_text())
    assert resumed["fingerprints"] == started["fingerprints"] and resumed["sittings"][1]["other_start"] == ["qwen"]
    assert resumed["sittings"][1]["iteration"] == 1


def test_a_run_on_a_local_benchmark_copy_evaluates_transfer_to_another_task(tmp_path, cache_dir, capsys):
    from test_benchmarks import GSM8K, GSM8K_TEST, PROOFNET, write_jsonl
    write_jsonl(tmp_path / "gsm8k" / "train.jsonl", GSM8K)
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM8K_TEST)
    args = tiny_args(tmp_path, cache_dir, task="gsm8k", data_dir=str(tmp_path / "gsm8k"), eval_task="humaneval",
                     iterations=1, prompts_per_iteration=2, eval_size=2, max_new_tokens=8)
    run_dir = train.main(args)
    logged = records(run_dir)
    assert "arithmetic task only; on gsm8k they score 0" in capsys.readouterr().err
    evals = [r for r in logged if "eval/heldout_accuracy" in r]
    assert len(evals) == 4 and all(0 <= r["eval/transfer_accuracy"] <= 1 for r in evals)
    assert all(0 <= r["charts/reward_mean"] <= 1 for r in logged if "charts/reward_mean" in r)
    # docs/real.md's `eval.py RUN --task gsm8k --data-dir DIR` runs and scores each policy as the run's last
    # evaluation did (0 here: a tiny policy never writes GSM8K's `####`; test_costs checks the scores on arith)
    # ... on the devices it is given, where the run's own are not on this machine
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "devices": "cuda:7"}))
    flags = [str(run_dir), "--task", "gsm8k", "--data-dir", str(tmp_path / "gsm8k"), "--eval-size", "2"]
    with pytest.raises(ValueError, match="--devices: cuda:7 requested"):
        evaluation.main(flags)
    evaluation.main([*flags, "--devices", "cpu"])
    printed = capsys.readouterr().out.strip().removeprefix(f"{run_dir}: gsm8k greedy pass@1 ")
    assert dict(item.split() for item in printed.split(", ")) == {
        r["policy"]: f"{r['eval/heldout_accuracy']:.3f}" for r in evals if r["iteration"] == 1}
    write_jsonl(tmp_path / "proofnet" / "valid.jsonl", PROOFNET)
    write_jsonl(tmp_path / "proofnet" / "test.jsonl", PROOFNET)
    with pytest.raises(ValueError, match="no automatic checker"):
        train.main(tiny_args(tmp_path, cache_dir, task="proofnet", data_dir=str(tmp_path / "proofnet"), name="p"))


def tensorboard_events(folder):
    """Every event of a folder's event files, read as TFRecords (length, its CRC, the Event proto, its CRC) with
    tensorboardX's Event message, without the tensorboard package."""
    from tensorboardX.proto.event_pb2 import Event
    events = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            events.append(Event.FromString(data[at + 12:at + 12 + length]))
            at += 12 + length + 4
    return events


def test_tensorboard_events_hold_every_metric_line_under_its_name(tmp_path, cache_dir):
    run_dir = train.main(tiny_args(tmp_path, cache_dir, share="prp", tensorboard=True))
    expected = {(r["policy"], name, r["iteration"]): value for r in records(run_dir)
                for name, value in r.items() if "/" in name}
    assert {name for _, name, _ in expected} >= TRAIN_KEYS - {"iteration", "policy", "time_s"} | EVAL_KEYS - {
        "iteration", "policy", "time_s"} | {"sharing/received"}
    logged = {(folder.name, v.tag, e.step): v.simple_value
              for folder in (run_dir / "tensorboard").iterdir() for e in tensorboard_events(folder)
              for v in e.summary.value}
    assert logged.keys() == expected.keys()
    assert all(logged[k] == pytest.approx(v, rel=1e-6, abs=1e-30) for k, v in expected.items())


def test_a_resumed_run_purges_the_tensorboard_events_after_its_checkpoint(tmp_path):
    from testbed import metrics_log
    log = metrics_log.MetricsLog(tmp_path, True, resumed_at=4)
    log.write({"iteration": 5, "policy": "qwen", "charts/x": 1.0})
    log.close()
    starts = [e.step for e in tensorboard_events(tmp_path / "tensorboard" / "qwen") if e.HasField("session_log")]
    assert starts == [5]   # TensorBoard hides every earlier event from step 5 on


def test_the_default_command_runs_the_curator_and_ends_with_what_it_did(tmp_path, cache_dir, capsys):
    # `python train.py --pair qwen-llama`, shortened: no --share, so the method itself
    short = (f"--pair qwen-llama --iterations 1 --prompts-per-iteration 4 --group-size 4 --max-new-tokens 16 "
             f"--eval-size 8 --train-size 200 --num-steps {TASK.num_steps} --max-operand {TASK.max_operand} "
             f"--warmup-scale 0.15 --temperature 1.0 --runs-dir {tmp_path} --cache-dir {cache_dir}")
    run_dir = train.main(tyro.cli(Args, args=shlex.split(short)))
    assert json.loads((run_dir / "config.json").read_text())["share"] == "cross-fidelity"
    assert json.loads((run_dir / "config.json").read_text())["ccm_estimate"] == "last:0"
    printed = capsys.readouterr().out
    summary = printed[printed.index("curation over 1 iterations, per source -> receiver:"):]
    directions = re.findall(r"  (\w+) -> (\w+): (\d+) offers; admitted PRP \d+, XGRPO \d+, SGT \d+; rejected", summary)
    assert {(s, r) for s, r, _ in directions} == {("qwen", "llama"), ("llama", "qwen")}
    assert all(int(n) == 4 * 4 for _, _, n in directions)   # every peer rollout offered to its receiver
    assert f"{run_dir / 'report.md'}; every decision: {run_dir / 'fidelity.jsonl'}" in summary


def test_default_run_names_spell_out_the_settings_that_differ_from_their_defaults():
    defaults = asdict(Args())
    name = lambda **changed: checkpoint.run_name({**defaults, **changed}, defaults)
    assert name() == "qwen-llama-cross-fidelity-s1"
    assert name(share="none", task="gsm8k") == "qwen-llama-none-s1-gsm8k"
    assert name(ccm_estimate="exact") == "qwen-llama-cross-fidelity-s1-ccm-exact"
    assert name(share="cross-fidelity", ablate=("ccm", "rsd"), thresholds="adaptive", tbd_measure="hidden",
                step_format="prose", lora_rank=16) == (
        "qwen-llama-cross-fidelity-s1-prose-tbd-hidden-ablate-ccm-rsd-adaptive-lora16")


def test_a_checkpoint_on_a_full_disk_says_so_and_an_unwritable_runs_folder_names_the_fix(tmp_path, monkeypatch):
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    tok = tiny.tiny_tokenizer(spec.family)
    policy = policies.Policy("qwen", tiny.tiny_model(spec.family, spec.tiny, len(tok), 0), tok, False)
    optimizer = torch.optim.AdamW(policy.model.parameters())
    def disk_full(*a, **k):   # what torch.save raises when a write comes up short
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 21120 vs 21014")
    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match="MiB free there: is the disk full"):
        checkpoint.save_policy(tmp_path / "iter-000010", policy, optimizer)
    def read_only(*a, **k):   # root writes anywhere, so the refusal is simulated
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(OSError, match="Permission denied.*writable --runs-dir"):
        checkpoint.open_run(tmp_path / "runs" / "run", {}, resume=False)
