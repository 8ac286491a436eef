"""Paired branches (benchmarks/branches.py, issue 68): a fork carries the trunk's checkpoint with the arm's settings
and state, and end to end, a branch continued with the trunk's own arm is the run straight through, and an arm
that admits no offer is `none`, bit for bit, so that arms differ in what they admit and in nothing else."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import train
from analysis import branches as branches_report
from benchmarks import branch_measures, branches
from test_train import MIXED
from testbed import checkpoint
from testbed.metrics_log import timeless

ROOT = Path(__file__).resolve().parents[1]

SMOKE = ["--prompts-per-iteration", "4", "--group-size", "4", "--max-new-tokens", "16", "--eval-size", "16",
         "--eval-every", "2", "--train-size", "200", "--warmup-scale", "0.15"]


def hand_trunk(folder: Path, share: str) -> None:
    """A trunk's run directory as train.py leaves it at iteration 2, with a stand-in curator state."""
    target = checkpoint.checkpoint_folder(folder, 2)
    target.mkdir(parents=True)
    torch.save({"model": {}, "optimizer": {}}, target / "qwen.pt")
    torch.save(SimpleNamespace(cfg="the trunk's", memory=[1, 2, 3]), target / "state.pt")
    (folder / "checkpoints" / "latest").write_text(target.name)
    (folder / "metrics.jsonl").write_text('{"iteration": 2, "policy": "qwen", "eval/heldout_accuracy": 0.5}\n')
    (folder / "start.json").write_text("[]")
    (folder / "config.json").write_text(json.dumps({"share": share, "scale": "tiny", "backend": "local"}))


@pytest.mark.parametrize("arm, carried", [("chance", True), ("none", False), ("hacpo", False)])
def test_a_fork_carries_the_trunks_checkpoint_with_the_arms_settings_and_what_state_the_arm_shares(tmp_path, arm,
                                                                                                  carried):
    hand_trunk(tmp_path / "trunk", "cross-fidelity")
    trunk = branches.args_of(branches.flags_of("qwen-llama", 7, "trunk", []), 2, "trunk", tmp_path)
    args = branches.args_of(branches.flags_of("qwen-llama", 7, arm, []), 3, "branch", tmp_path)
    branches.fork(tmp_path / "trunk", tmp_path / "branch", trunk, args)
    config = json.loads((tmp_path / "branch" / "config.json").read_text())
    assert config["share"] == args.share and config["iterations"] == 3 and config["scale"] == "tiny"
    assert config["admission"] == ("ranked" if arm == "chance" else "diagnosis")
    start, folder, state = checkpoint.latest_checkpoint(tmp_path / "branch")
    assert start == 2 and (folder / "qwen.pt").exists()
    assert (tmp_path / "branch" / "metrics.jsonl").read_text() == (tmp_path / "trunk" / "metrics.jsonl").read_text()
    if carried:     # the trunk's memory, the arm's decisions
        assert state.memory == [1, 2, 3] and state.cfg == args.curator_config
    else:           # another share begins its own state afresh
        assert state is None
    assert not (tmp_path / "branch.tmp").exists()
    assert torch.load(tmp_path / "trunk" / "checkpoints" / "iter-000002" / "state.pt",
                      weights_only=False).cfg == "the trunk's"          # the trunk is left as it was


def test_a_run_is_measured_only_at_the_iteration_its_row_names(tmp_path):
    hand_trunk(tmp_path / "trunk", "cross-fidelity")                  # checkpointed at 2
    assert branches.at_iteration(tmp_path / "trunk", 2) == tmp_path / "trunk"
    with pytest.raises(ValueError, match="checkpointed at 2, not at 3"):
        branches.at_iteration(tmp_path / "trunk", 3)


def test_a_branch_point_off_the_evaluation_schedule_is_refused_before_anything_trains(tmp_path):
    with pytest.raises(ValueError, match="evaluation schedule"):
        branches.branch_point("qwen-llama", 7, 3, 1, ["none"], tmp_path, SMOKE)
    assert list(tmp_path.iterdir()) == []


def test_a_row_records_the_iteration_each_run_started_from_so_that_a_resumed_branch_reads_as_one(tmp_path):
    def stand_in(name: str, flags: list[str], iterations: int, runs_dir: Path) -> tuple[bool, str]:
        """train.py as far as the row reads it: the run's curve and checkpoint at `iterations`."""
        target = checkpoint.checkpoint_folder(runs_dir / name, iterations)
        target.mkdir(parents=True, exist_ok=True)
        (runs_dir / name / "checkpoints" / "latest").write_text(target.name)
        with open(runs_dir / name / "metrics.jsonl", "a") as log:
            log.write(json.dumps({"iteration": iterations, "policy": "qwen", "eval/heldout_accuracy": 0.5}) + "\n")
        return True, name
    hand_trunk(tmp_path / "branches-qwen-llama-s7-trunk", "cross-fidelity")          # checkpointed at 2
    every_2 = ["--eval-every", "2"]
    first = branches.branch_point("qwen-llama", 7, 2, 1, ["none"], tmp_path, every_2, stand_in)
    row = branches.branch_point("qwen-llama", 7, 2, 1, ["none", "chance"], tmp_path, every_2, stand_in)
    assert first["started_at"] == {"trunk": 2, "none": 2}
    # the same point again, as after a kill: none's branch had already trained to 3, chance's is forked at 2
    assert row["started_at"] == {"trunk": 2, "none": 3, "chance": 2}


def test_a_trunk_past_its_point_or_a_branch_forked_from_another_trunk_is_refused_before_a_row_is_written(tmp_path):
    def stand_in(name: str, flags: list[str], iterations: int, runs_dir: Path) -> tuple[bool, str]:
        """train.py as far as the runner reads it: a run already past `iterations` is left as it is."""
        return True, name
    every_2 = ["--eval-every", "2"]
    hand_trunk(tmp_path / "past" / "branches-qwen-llama-s7-trunk", "cross-fidelity")              # at 2
    with pytest.raises(ValueError, match="checkpointed at 2, past point 0: a trunk trains only forward"):
        branches.branch_point("qwen-llama", 7, 0, 1, ["none"], tmp_path / "past", every_2, stand_in)
    hand_trunk(tmp_path / "stale" / "branches-qwen-llama-s7-trunk", "cross-fidelity")             # 0.5 at 2
    old = tmp_path / "stale" / "branches-qwen-llama-s7-it002-none"
    hand_trunk(old, "none")
    (old / "metrics.jsonl").write_text('{"iteration": 2, "policy": "qwen", "eval/heldout_accuracy": 0.7}\n')
    with pytest.raises(ValueError, match="it002-none was forked from another trunk"):
        branches.branch_point("qwen-llama", 7, 2, 1, ["none"], tmp_path / "stale", every_2, stand_in)


def test_a_seeds_rows_are_one_trunks_a_trunk_trained_again_elsewhere_is_refused(tmp_path):
    trunk = tmp_path / "trunk"
    trunk.mkdir()
    (trunk / "metrics.jsonl").write_text("".join(json.dumps({"iteration": it, "policy": "qwen",
                                                             "eval/heldout_accuracy": it / 100}) + "\n"
                                                 for it in (5, 10, 15)))
    for point, accuracy in ((5, 0.05), (10, 0.10)):
        branches.write_whole(tmp_path / "rows" / f"qwen-llama-s7-it{point:03d}.json",
                             {"point": point, "trunk": {"qwen": accuracy}})
    branches.write_whole(tmp_path / "rows" / "qwen-llama-s8-it005.json", {"point": 5, "trunk": {"qwen": 0.9}})
    branches.same_trunk(tmp_path / "rows", "qwen-llama", 7, trunk)     # seed 8's row is another trunk's
    branches.write_whole(tmp_path / "rows" / "qwen-llama-s7-it010.json", {"point": 10, "trunk": {"qwen": 0.11}})
    with pytest.raises(ValueError, match="it010.json's trunk accuracy"):
        branches.same_trunk(tmp_path / "rows", "qwen-llama", 7, trunk)


def row(seed: int, point: int, arms: dict[str, float]) -> dict:
    return {"preset": "qwen-llama", "seed": seed, "point": point, "k": 5, "trunk": {"qwen": 0.2},
            "arms": {arm: {"qwen": accuracy} for arm, accuracy in arms.items()}}


def test_the_report_averages_a_seeds_points_first_then_tests_over_seeds_by_hand(tmp_path):
    rows = [row(1, 10, {"none": 0.30, "chance": 0.31, "d": 0.33}), row(1, 20, {"none": 0.40, "chance": 0.40,
                                                                                 "d": 0.44}),
            row(2, 10, {"none": 0.50, "chance": 0.52, "d": 0.53}), row(2, 20, {"none": 0.6, "chance": 0.6, "d": 0.61}),
            row(3, 10, {"none": 0.1, "chance": 0.1, "d": 0.12}), row(3, 20, {"none": 0.2, "chance": 0.2, "d": 0.22})]
    for r in rows:
        (tmp_path / f"qwen-llama-s{r['seed']}-it{r['point']:03d}.json").write_text(json.dumps(r))
    branches.main(["report", str(tmp_path)])
    result = {r["arm"]: r for r in branches_report.analyze(branches_report.load(tmp_path))}
    # d - chance: seed 1 (2 + 4) / 2 = 3 points, seed 2 (1 + 1) / 2, seed 3 (2 + 2) / 2; all positive: p = 2 / 8
    d = result["d"]["against chance"]
    assert d["differences"] == pytest.approx({1: 3.0, 2: 1.0, 3: 2.0}) and d["mean"] == pytest.approx(2.0)
    assert d["sign_flip_p"] == pytest.approx(0.25)
    assert d["t_interval"] == pytest.approx((2 - 4.303 / 3 ** 0.5, 2 + 4.303 / 3 ** 0.5), abs=1e-3)  # SD 1
    assert "against chance" not in result["chance"]
    assert (tmp_path / "report.md").read_text().count("| qwen-llama | qwen |") == 3 + 1      # 3 arms, 1 call row
    assert (tmp_path / "report.png").stat().st_size > 0


def test_the_report_refuses_a_seed_cut_short_or_rows_of_two_k_naming_what_is_missing(tmp_path):
    arms = {"none": 0.3, "chance": 0.3, "d": 0.3}
    for r in (row(1, 10, arms), row(1, 20, arms), row(2, 10, arms)):
        branches.write_whole(tmp_path / "short" / f"qwen-llama-s{r['seed']}-it{r['point']:03d}.json", r)
    with pytest.raises(ValueError, match=r"seeds cut short, with the branch points each lacks: \{2: \[20\]\}"):
        branches.main(["report", str(tmp_path / "short")])
    assert not (tmp_path / "short" / "report.md").exists()
    for r in (row(1, 10, arms), {**row(2, 10, arms), "k": 10}):
        branches.write_whole(tmp_path / "two-k" / f"qwen-llama-s{r['seed']}-it{r['point']:03d}.json", r)
    with pytest.raises(ValueError, match=r"rows of k \[5, 10\] in one folder"):
        branches.main(["report", str(tmp_path / "two-k")])


def lines(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [timeless(json.loads(line)) for line in (run_dir / name).read_text().splitlines()]


def in_process(name: str, flags: list[str], iterations: int, runs_dir: Path) -> tuple[bool, str]:
    """power.train_run's contract, trained in this process (so that its rewards can be scripted)."""
    train.run(replace(branches.args_of(flags, iterations, name, runs_dir), resume=(runs_dir / name).exists()))
    return True, name


@pytest.mark.slow
def test_branches_differ_in_what_they_admit_and_in_nothing_else(tmp_path, cache_dir, scripted_rewards):
    # every group's rewards mixed, whatever was sampled: every offer could matter and carries an advantage
    scripted_rewards(lambda policy, problems: torch.tensor([MIXED] * len(problems)))
    extra = [*SMOKE, "--group-size", str(len(MIXED)), "--cache-dir", cache_dir, "--admit-share", "0"]
    row = branches.branch_point("qwen-llama", 7, 2, 1, ["cross-fidelity", "none", "chance"], tmp_path, extra,
                                in_process, branch_measures.HeldOutMeasures)
    # the trunk's own arm from its checkpoint at 2 is the run straight through to 3, every line bit for bit
    in_process("straight", branches.flags_of("qwen-llama", 7, "cross-fidelity", extra), 3, tmp_path)
    branch = tmp_path / "branches-qwen-llama-s7-it002-cross-fidelity"
    assert lines(branch) == lines(tmp_path / "straight")
    assert lines(branch, "fidelity.jsonl") == lines(tmp_path / "straight", "fidelity.jsonl")
    crossed = [r for r in lines(branch, "fidelity.jsonl") if r["iteration"] == 3 and r["level"] == "prp"]
    assert crossed                                          # the curator admitted offers in the branch's iteration
    # a ranked admission of no offer (--admit-share 0) rejects every one of them, and trains as `none`: the same
    # updates, rewards and accuracy, though the curator diagnosed every offer
    ranked = tmp_path / "branches-qwen-llama-s7-it002-chance"
    decided = [r for r in lines(ranked, "fidelity.jsonl") if r["iteration"] == 3]
    assert decided and all(r["level"] == "rejected" for r in decided)
    assert row["arms"]["chance"] == row["arms"]["none"]
    kept = ("losses/", "charts/", "eval/")
    none = tmp_path / "branches-qwen-llama-s7-it002-none"
    assert [{k: v for k, v in r.items() if k.startswith(kept)} for r in lines(ranked)] == \
        [{k: v for k, v in r.items() if k.startswith(kept)} for r in lines(none)]
    assert row["trunk"] == branches.accuracy_at(tmp_path / "branches-qwen-llama-s7-trunk", 2)
    # the measures: arms that trained alike measure alike; greedy accuracy re-measured from each run's last
    # checkpoint is what the run logged; at the trunk's own weights the weighted reward is its samples' mean
    assert row["measures"]["chance"] == row["measures"]["none"] != row["measures"]["cross-fidelity"]
    for run in ("trunk", "cross-fidelity", "none"):
        assert {p: m["accuracy"] for p, m in row["measures"][run].items()} == row["arms"].get(run, row["trunk"])
    for policy, at_point in row["measures"]["trunk"].items():     # an iteration of training moves both measures
        assert all(row["measures"]["none"][policy][m] != at_point[m] for m in ("loglik", "iw_reward"))
    drawn = branch_measures.HeldOutMeasures(tmp_path / "branches-qwen-llama-s7-trunk").behaviour
    for policy, measured in row["measures"]["trunk"].items():
        assert measured["iw_reward"] == pytest.approx(drawn[policy].rewards.double().mean().item(), abs=1e-12)
    # the log-likelihood alone: no samples drawn, and each run's value the one measured beside the others
    alone = branch_measures.HeldOutMeasures(tmp_path / "branches-qwen-llama-s7-trunk", names=("loglik",))
    assert alone.behaviour == {}
    assert alone(tmp_path / "branches-qwen-llama-s7-it002-none") == \
        {p: {"loglik": m["loglik"]} for p, m in row["measures"]["none"].items()}
    assert set(row["seconds"]) == {"trunk", "trunk-measures", "cross-fidelity", "none", "chance"}   # the budget reads
    assert all(seconds > 0 for seconds in row["seconds"].values())
    assert row["started_at"] == {"trunk": 0, "cross-fidelity": 2, "none": 2, "chance": 2}      # every run whole


def test_measures_name_what_a_row_carries_and_an_unknown_one_is_refused_before_anything_trains(tmp_path):
    assert branches.measures_of(None) is None                       # without --measures: accuracy as logged only
    assert branches.measures_of([]).keywords == {"names": ("accuracy", "loglik", "iw_reward")}   # bare: every one
    assert branches.measures_of(["loglik"]).keywords == {"names": ("loglik",)}
    with pytest.raises(SystemExit):
        branches.main(["run", "--seeds", "1", "--points", "10", "--measures", "perplexity"])
    for names in ((), ("loglik", "perplexity")):
        with pytest.raises(ValueError, match="name some of"):
            branch_measures.HeldOutMeasures(tmp_path / "no-run", names=names)


def test_the_second_group_arm_samples_twice_the_trunks_group_whatever_the_group_size():
    for extra, group in (([], 8), (["--group-size", "4"], 4)):
        flags = branches.flags_of("qwen-llama", 7, "second-group", extra)
        assert branches.args_of(flags, 3, "b", Path("runs")).group_size == 2 * group
        assert branches.args_of(branches.flags_of("qwen-llama", 7, "trunk", extra), 3, "t", Path("runs")).group_size \
            == group


def test_the_registered_calls_by_hand_the_controls_first_then_holm_the_words_and_p1_p2():
    """Ten seeds, one point, two receivers. Into qwen every control separates; into llama negated does not hurt,
    so llama's cells are not called. Against chance (points): d +3 on every seed (p 2/1024, rejected by Holm
    over 8); tbd within +-0.3 (its t interval inside (-1, 1)); ccm +-5 alternating (not resolved); rsd -3."""
    rows = []
    for seed in range(1, 11):
        sign = 1 if seed % 2 else -1
        qwen = {"none": 0.40, "chance": 0.40, "negated": 0.35, "second-group": 0.45, "sgt": 0.40,
                "d": 0.43, "tbd": 0.40 + sign * 0.003, "ccm": 0.40 + sign * 0.05, "rsd": 0.37}
        llama = dict(qwen, negated=0.40 + sign * 0.01)
        rows.append({"preset": "qwen-llama", "seed": seed, "point": 10, "k": 5, "trunk": {"qwen": 0.4, "llama": 0.4},
                     "arms": {arm: {"qwen": qwen[arm], "llama": llama[arm]} for arm in qwen}})
    called = branches_report.calls(branches_report.analyze(rows))
    cells = {x["policy"]: x for x in called["cells"]}
    assert cells["qwen"]["controls pass"] and not cells["llama"]["controls pass"]
    assert cells["llama"]["why not"] == ["negated does not hurt"] and cells["qwen"]["why not"] == []
    assert cells["qwen"]["A"] == {"d": "beats chance", "tbd": "within 1 point of chance", "ccm": "not resolved",
                                  "rsd": "worse than chance"}
    assert cells["qwen"]["B"]["d"] == "helps" and cells["qwen"]["B"]["rsd"] == "hurts"
    # P1' supported (beats chance, worse nowhere); tbd and rsd refuted (within 1 point, or worse); ccm not resolved
    assert called["verdicts"] == {"d": "supported", "tbd": "refuted", "ccm": "not resolved", "rsd": "refuted"}
    text = branches_report.markdown(branches_report.analyze(rows), rows)
    assert "| qwen-llama | llama | no, not called: negated does not hurt | — | — |" in text    # numbers only
    assert "no call is made" not in text
    # nothing called where no cell's controls pass, and the report says why
    for r in rows:
        r["arms"]["negated"]["qwen"] = 0.40
        for policy in ("qwen", "llama"):
            r["arms"]["second-group"][policy] = r["arms"]["sgt"][policy] = 0.40
    result = branches_report.analyze(rows)
    assert set(branches_report.calls(result)["verdicts"].values()) == {"not resolved"}
    assert "no, not called: negated does not hurt and neither second-group nor sgt helps" in \
        branches_report.markdown(result, rows)
    assert "No receiver's controls separate, so no call is made" in branches_report.markdown(result, rows)
