import json
import types

import pytest
import torch

import eval as evaluation
from analysis import curves


def write_run(path, accuracies, rewards):
    path.mkdir()
    lines = [{"iteration": it, "policy": "p", "eval/heldout_accuracy": a} for it, a in accuracies]
    lines += [{"iteration": i + 1, "policy": "p", "charts/reward_mean": r} for i, r in enumerate(rewards)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_summary_by_hand(tmp_path):
    run = write_run(tmp_path / "a", [(0, 0.2), (10, 0.5), (20, 0.7), (30, 0.6)], [0.1, 0.3, 0.2, 0.4])
    [row] = evaluation.summarize(run, target=0.6)
    assert (row["start_accuracy"], row["final_accuracy"], row["best_accuracy"]) == (0.2, 0.6, 0.7)
    assert row["iterations_to_target"] == 20
    assert evaluation.summarize(run, target=0.5)[0]["iterations_to_target"] == 10     # reaching it is enough
    # consecutive differences 0.2, -0.1, 0.2: (0.04 + 0.01 + 0.04) / (2 * 3)
    assert row["reward_var"] == pytest.approx(0.09 / 6)
    assert row["mean_train_reward"] == pytest.approx(0.25)


def test_what_crossed_is_averaged_over_iterations_and_absent_without_sharing(tmp_path):
    run = write_run(tmp_path / "a", [(0, 0.2)], [0.1, 0.3, 0.2])
    assert evaluation.summarize(run, 0.5)[0]["received_per_iteration"] is None
    with (run / "metrics.jsonl").open("a") as f:
        for i, n in enumerate([3, 0, 6]):
            f.write(json.dumps({"iteration": i + 1, "policy": "p", "sharing/received": n}) + "\n")
    assert evaluation.summarize(run, 0.5)[0]["received_per_iteration"] == 3.0


def test_costs_add_up_per_run_and_policy_and_a_budget_reads_the_last_evaluation_within_it(tmp_path):
    run = tmp_path / "a"
    run.mkdir()
    lines = [{"iteration": 0, "policy": p, "eval/heldout_accuracy": a} for p, a in (("p", 0.1), ("q", 0.2))]
    for it in (1, 2, 3, 4):   # wall time is the iteration's, logged on both policies' lines
        lines += [{"iteration": it, "policy": p, "perf/iteration_s": 2.0, "perf/rollout_tokens": n,
                   "perf/update_tokens": 10 * n} for p, n in (("p", 100.0), ("q", 300.0))]
        if it % 2 == 0:
            lines += [{"iteration": it, "policy": p, "eval/heldout_accuracy": 0.1 * it + d} for p, d in
                      (("p", 0.0), ("q", 0.05))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = {r["policy"]: r for r in evaluation.summarize(run, 0.9)}
    assert (rows["p"]["iteration_s"], rows["p"]["rollout_tokens"], rows["p"]["update_tokens"]) == (8.0, 400.0, 4000.0)
    assert (rows["q"]["iteration_s"], rows["q"]["rollout_tokens"]) == (8.0, 1200.0)
    records = evaluation.load_metrics(run)
    # 5 s of wall time covers iterations 1-2 (4 s), not 3; q's 700 rollout tokens cover iterations 1-2 (600)
    assert evaluation.accuracy_within_budget(records, "p", "iteration_s", 5.0) == (2, pytest.approx(0.2))
    assert evaluation.accuracy_within_budget(records, "q", "rollout_tokens", 700.0) == (2, pytest.approx(0.25))
    assert evaluation.accuracy_within_budget(records, "p", "update_tokens", 4000.0) == (4, pytest.approx(0.4))
    assert evaluation.accuracy_within_budget(records, "q", "rollout_tokens", 100.0) is None


def test_a_linear_trend_is_not_counted_as_reward_variance():
    assert curves.reward_variance([0.1 * i for i in range(10)]) == pytest.approx(0.005)  # 0.01 / 2, not var
    assert curves.reward_variance([0.5] * 5) == 0.0


def test_report_and_comparison_files(tmp_path):
    a = write_run(tmp_path / "a", [(0, 0.2), (10, 0.5)], [0.1, 0.3])
    b = write_run(tmp_path / "b", [(0, 0.3), (10, 0.9)], [0.2, 0.6])
    assert "| a | p | 0.200 | 0.500 |" in evaluation.write_report(a, target=0.9)
    assert (a / "report.md").exists() and (a / "curves.png").stat().st_size > 0
    text = evaluation.compare([a, b], tmp_path / "cmp", target=0.9)
    assert "| b | p | 0.300 | 0.900 | 0.900 |" in text and "not reached" in text
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 0


def test_a_directory_without_metrics_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory"):
        evaluation.summarize(tmp_path, 0.5)


class ScriptedPolicy:
    """Answers a prompt's example right in its first `right` completions and wrong in the rest, where
    `by_prompt[prompt] = (example, right)`; records each call."""

    def __init__(self, by_prompt):
        self.by_prompt = by_prompt
        self.calls = []

    def rollout(self, prompts, group_size, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, generator=None):
        from testbed import arith
        self.calls.append((len(prompts), group_size, temperature, top_p, greedy, generator))
        group_size = 1 if greedy else group_size
        texts = []
        for prompt in prompts:
            example, right = self.by_prompt[prompt]
            texts += [arith.solution(example) if j < right else "no answer" for j in range(group_size)]
        return types.SimpleNamespace(texts=texts)


def test_sampled_accuracy_is_the_mean_reward_over_samples_and_greedy_takes_one_completion_each():
    from testbed import arith
    from testbed import tasks
    task = tasks.load_task("arith", 0, 0, 5, arith.TaskConfig(num_steps=1, max_operand=9))
    examples = task.heldout[:5]
    policy = ScriptedPolicy({task.prompt(e): (e, r) for e, r in zip(examples, [3, 0, 1, 2, 3])})
    generator = torch.Generator().manual_seed(0)
    sampled = evaluation.heldout_accuracy(policy, examples, 16, task, batch_size=2, temperature=0.7, samples=3,
                                          generator=generator, top_p=0.9)
    assert sampled == pytest.approx((3 + 0 + 1 + 2 + 3) / (3 * 5))
    assert policy.calls == [(2, 3, 0.7, 0.9, False, generator), (2, 3, 0.7, 0.9, False, generator),
                            (1, 3, 0.7, 0.9, False, generator)]
    policy.calls.clear()
    greedy = evaluation.heldout_accuracy(policy, examples, 16, task, samples=3)   # samples mean nothing greedily
    assert greedy == pytest.approx(4 / 5) and policy.calls == [(5, 1, 1.0, 1.0, True, None)]
    for temperature in (0.0, -0.7, float("nan")):      # never a silent T = 1
        with pytest.raises(ValueError, match="positive temperature"):
            evaluation.heldout_accuracy(policy, examples, 16, task, temperature=temperature)


def test_a_budget_says_when_a_run_ended_before_spending_it_or_had_no_evaluation_within_it(tmp_path):
    run = write_run(tmp_path / "a", [(0, 0.2), (2, 0.5)], [0.1, 0.3])
    with (run / "metrics.jsonl").open("a") as f:
        for it in (1, 2):
            f.write(json.dumps({"iteration": it, "policy": "p", "perf/update_tokens": 100.0}) + "\n")
    records = evaluation.load_metrics(run)
    assert evaluation.budget_line(records, "p", "update_tokens", 200.0) == "0.500 at iteration 2"
    assert evaluation.budget_line(records, "p", "update_tokens", 1000.0) == (
        "0.500 at iteration 2; the run ended at iteration 2 having spent 200 of 1000")
    assert evaluation.budget_line(records, "p", "update_tokens", 150.0) == "no evaluation within the budget"
    assert evaluation.parse_budget("update_tokens=2e6") == ("update_tokens", 2e6)
    for bad in ("update_tokens=abc", "tokens=5", "update_tokens"):
        with pytest.raises(ValueError, match="COST=VALUE"):
            evaluation.parse_budget(bad)


def test_the_command_line_writes_a_report_a_comparison_and_a_budget_line(tmp_path, capsys):
    # the README's eval.py commands: one run, several with --out, --budget; and no run at all
    a = write_run(tmp_path / "a", [(0, 0.2), (2, 0.5)], [0.1, 0.3])
    b = write_run(tmp_path / "b", [(0, 0.3), (2, 0.9)], [0.2, 0.6])
    with (a / "metrics.jsonl").open("a") as f:
        for it in (1, 2):
            f.write(json.dumps({"iteration": it, "policy": "p", "perf/update_tokens": 100.0}) + "\n")
    evaluation.main([str(a)])
    assert "| a | p | 0.200 | 0.500 |" in capsys.readouterr().out and (a / "report.md").exists()
    evaluation.main([str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert "| b | p | 0.300 | 0.900 |" in capsys.readouterr().out and (tmp_path / "cmp" / "comparison.md").exists()
    evaluation.main([str(a), "--budget", "update_tokens=150"])
    assert capsys.readouterr().out == f"{a} p: no evaluation within the budget\n"
    for argv, error in (([], "give run directories"), ([str(a), "--budget", "tokens=5"], "COST=VALUE")):
        with pytest.raises(SystemExit):
            evaluation.main(argv)
        assert error in capsys.readouterr().err


def test_a_comparison_warns_of_runs_of_unequal_length_and_keys_one_legend_entry_per_run(tmp_path, monkeypatch):
    runs = []
    for name, iterations in (("a", 10), ("b", 10), ("c", 20)):
        run = write_run(tmp_path / name, [(0, 0.2), (iterations, 0.5)], [0.1] * iterations)
        with (run / "metrics.jsonl").open("a") as f:   # a second policy
            f.write(json.dumps({"iteration": iterations, "policy": "q", "eval/heldout_accuracy": 0.4}) + "\n")
        (run / "config.json").write_text(json.dumps({"iterations": 20, "eval_size": 100}))
        runs.append(run)
    import matplotlib.figure
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    text = evaluation.compare(runs, tmp_path / "cmp", target=0.9)
    assert "differ in iterations done" in text and "held-out problems" not in text.split("|")[0]
    assert "| a | p | 0.200 | 0.500 |" in text and "| 0.050 | 10 / 20 | 100 |" in text   # sqrt(.5 * .5 / 100)
    accuracy_axes = figures[0].axes[0]
    assert [t.get_text() for t in accuracy_axes.get_legend().get_texts()] == ["a", "b", "c"]


def test_a_report_holds_the_config_the_notes_and_a_link_to_its_curves(tmp_path):
    run = write_run(tmp_path / "a", [(0, 0.2), (10, 0.5)], [0.1, 0.3])
    (run / "config.json").write_text(json.dumps({"iterations": 100, "eval_size": 500, "lr": 1e-4}))
    text = evaluation.write_report(run)
    assert "10 / 100" in text and "- lr: 0.0001" in text and "](curves.png)" in text and "reward var.:" in text
