"""Issue 52 (benchmarks/premise.py): usefulness U on a hand-built case whose answer is known, its lookahead, its
gradients against grpo.grpo_step and a naive REINFORCE loop, each baseline's admission signal against a naive
computation; the cluster bootstrap, Holm and the registered calls on hand-built rows; the gate's decision rules on
hand-built lookahead numbers; `measure`'s resumability with a stubbed offer source; `report` end to end. Issue
67's readings are tests/test_premise_readings.py's."""

import itertools
import json
import math
import random
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import grpo
import sharing
from analysis import premise_report
from analysis import premise_stats as stats
from args import Args
from benchmarks import premise as premise_cli
from benchmarks import premise_measure
from benchmarks import premise_usefulness as premise
from test_premise_readings import hand_gate
from test_sharing import PROMPTS, experience, naive_groups, naive_logprobs, untrained  # noqa: F401
from testbed import arith, policies, tasks, tiny

PROBLEM = arith.generate_problems(1, "train", seed=0, cfg=arith.TaskConfig())[0]


def first_token_task(answer: str) -> tasks.Task:
    """A task of one prompt whose reward is 1 where the completion starts with `answer`: the known case."""
    return tasks.Task("first-token", [PROBLEM], [PROBLEM], arith.prompt_text,
                      lambda example, text: float(text.startswith(answer)), lambda example, text: [])


@pytest.fixture(scope="module")
def taught():
    """A random-initialized tiny qwen2 policy taught by hand (a few SGD steps of NLL) to begin its completion of
    PROBLEM's prompt with the token "7" with probability between 0.2 and 0.8, and that token's id."""
    tok = tiny.tiny_tokenizer("qwen2")
    policy = policies.Policy("qwen2", tiny.tiny_model("qwen2", tiny.TinyShape(32, 2, 4, 0), len(tok), seed=0), tok,
                             use_chat_template=False)
    prompt, (seven,) = policy.encode_prompt(arith.prompt_text(PROBLEM)), policy.encode_completion("7", eos=False)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    for _ in range(100):
        logp = torch.log_softmax(policy.model(torch.tensor([prompt])).logits[0, -1], -1)             # [V]
        if logp[seven].exp() > 0.2:
            break
        optimizer.zero_grad()
        (-logp[seven]).backward()
        optimizer.step()
    assert 0.2 < logp[seven].exp().item() < 0.8
    return policy, prompt, seven


def test_the_receivers_own_success_is_useful_and_its_negation_harmful_as_the_lookahead_measures(taught):
    policy, prompt, seven = taught
    task = first_token_task("7")
    # held-out set: that prompt alone; completions of one token, whose reward is whether it is "7"
    g_heldout = premise.heldout_gradient(policy, task, [PROBLEM], 256, 1, 1.0, torch.Generator().manual_seed(0))
    measure = partial(premise.heldout_rewards, task=task, problems=[PROBLEM], samples=1024, max_new_tokens=1,
                      temperature=1.0, seed=0)
    before = measure(policy)
    for advantage in (1.0, -1.0):
        g = premise.offer_gradient(policy, prompt, [seven], torch.tensor([advantage]), None, 1.0)
        u = premise.usefulness(g, g_heldout)
        assert math.copysign(1, u) == advantage
        assert math.copysign(1, (premise.after_step(policy, g, 0.05, measure) - before).item()) == advantage


def sgd_step_of(policy, prompt_ids, completion_ids, credit, weights, temperature) -> torch.Tensor:
    """[P] how far one grpo.grpo_step of SGD at lr 1 moves the policy's weights on one trajectory (then undone)."""
    params = premise.trained(policy.model)
    saved = torch.nn.utils.parameters_to_vector(params).detach().clone()
    batch = grpo.build_batch([prompt_ids], [completion_ids], [credit], policy.tokenizer.pad_token_id, [weights])
    grpo.grpo_step(policy.model, torch.optim.SGD(params, lr=1.0), batch, grpo.LossConfig(), max_grad_norm=math.inf,
                   temperature=temperature)
    moved = torch.nn.utils.parameters_to_vector(params).detach() - saved
    torch.nn.utils.vector_to_parameters(saved, params)
    return moved


def test_the_offer_gradient_is_the_step_grpo_takes_on_the_offer_alone(untrained):
    policy = untrained["llama"]
    prompt, completion = policy.encode_prompt(PROMPTS[0]), policy.encode_completion("3 + 4 = 7\nAnswer: 7", eos=True)
    gen = torch.Generator().manual_seed(0)
    credit, weights = torch.randn(len(completion), generator=gen), torch.rand(len(completion), generator=gen) * 2
    g = premise.offer_gradient(policy, prompt, completion, credit, weights, 0.7)
    torch.testing.assert_close(sgd_step_of(policy, prompt, completion, credit, weights, 0.7), g, rtol=1e-4, atol=1e-6)


def test_reinforce_scale_is_the_leave_one_out_baseline_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # 1 - (0 + 0) / 2 = 1, 0 - (1 + 0) / 2 = -0.5; a uniform group carries nothing
    torch.testing.assert_close(premise.reinforce_scale(rewards), torch.tensor([[1.0, -0.5, -0.5], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        premise.reinforce_scale(torch.ones(2, 1))


def scripted_task(rewards: list[float]) -> tasks.Task:
    """A task of one prompt whose n-th scored completion gets rewards[n], whatever its text: mixed groups by hand."""
    scripted = iter(rewards)
    return tasks.Task("scripted", [PROBLEM], [PROBLEM], arith.prompt_text, lambda example, text: next(scripted),
                      lambda example, text: [])


def test_the_heldout_gradient_equals_a_naive_reinforce_loop(taught):
    policy, _, _ = taught
    samples, scripted = 6, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0] + [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]   # two mixed groups
    got = premise.heldout_gradient(policy, scripted_task(scripted), [PROBLEM, PROBLEM], samples, 3, 0.7,
                                   torch.Generator().manual_seed(1))
    task = scripted_task(scripted)
    rollouts = policy.rollout([task.prompt(PROBLEM)] * 2, samples, 3, 0.7, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor([task.reward(PROBLEM, t) for t in rollouts.texts]).view(2, samples)
    want = torch.zeros_like(got)
    for i, (p, c) in enumerate(zip(rollouts.prompt_ids, rollouts.completion_ids)):
        b, j = divmod(i, samples)
        others = (rewards[b].sum() - rewards[b, j]) / (samples - 1)
        logits = policy.model(torch.cat([p, c])[None]).logits[0, len(p) - 1:-1] / 0.7                 # [T, V]
        sequence_logp = torch.log_softmax(logits, -1)[torch.arange(len(c)), c].sum()
        want += (rewards[b, j] - others) * premise.flat_gradient(policy.model, sequence_logp)
    torch.testing.assert_close(got, want / rewards.numel(), rtol=1e-4, atol=1e-7)


def test_a_step_leaves_the_weights_as_they_were(taught):
    policy = taught[0]
    saved = [w.detach().clone() for w in policy.model.parameters()]
    seen = premise.after_step(policy, torch.ones(sum(w.numel() for w in saved)), 0.5,
                              lambda p: next(p.model.parameters()).sum().item())
    assert seen == pytest.approx(saved[0].sum().item() + 0.5 * saved[0].numel(), rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(saved, policy.model.parameters()))


# ---------------------------------------------------------------------------------------------------------------
# The baselines' admission signals against naive computations
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crossed(untrained):
    """Qwen's rollouts of two texts (digits: one token each for Qwen, up to three for Llama), with random behaviour
    log-probs, crossed into Llama; with Llama's log-probs of its tokens by a plain forward pass."""
    qwen, llama = untrained["qwen2"], untrained["llama"]
    texts = [["123 + 456 = 579\nAnswer: 579", "98 - 76 = 22\nAnswer: 2"]]
    peer = experience(qwen, PROMPTS[:1], texts, [[1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    peer.rollouts.logprobs = [-torch.rand(len(i), generator=gen) * 3 for i in peer.rollouts.completion_ids]
    cfg = sharing.ShareConfig("prp", ratio_cap=1.5, temperature=0.7)
    crossings = sharing.cross(peer, [(0, 1.0), (1, -1.0)], llama, cfg)
    tgt = [naive_logprobs(llama.model, llama.encode_prompt(PROMPTS[0]), c.completion_ids, 0.7) for c in crossings]
    return peer, crossings, tgt


def test_each_admission_signal_equals_a_naive_computation(crossed, untrained):
    peer, crossings, tgt = crossed
    qwen, llama = untrained["qwen2"], untrained["llama"]
    assert len(crossings) == 2
    for c, tgt_logp in zip(crossings, tgt):
        src_logp = peer.rollouts.logprobs[c.index]
        groups = naive_groups([len(qwen.token_bytes[i]) for i in peer.rollouts.completion_ids[c.index].tolist()],
                              [len(llama.token_bytes[i]) for i in c.completion_ids])
        x = [tgt_logp[list(t)].sum().item() - src_logp[list(s)].sum().item() for s, t in groups]   # per group
        per_token = [min(math.exp(v), 1.5) for v, (_, t) in zip(x, groups) for _ in t]
        s = math.exp(tgt_logp.mean().item() - src_logp.mean().item())
        got = premise.signals(peer, c, graft_delta=0.8)
        assert got["prp_ratio"] == pytest.approx(sum(per_token) / len(per_token), rel=1e-4)
        assert got["hacpo_s"] == pytest.approx(s, rel=1e-4)
        assert got["graft_weight"] == pytest.approx(min(s, 1.0) if s >= 0.8 else 0.0, rel=1e-4)
        assert got["ftis_kl"] == pytest.approx(sum(math.exp(v) - v - 1 for v in x) / len(x), rel=1e-4)
        assert got["reward"] == peer.rewards.flatten()[c.index].item()
        assert got["advantage"] == peer.advantages.flatten()[c.index].item()


def test_an_offers_row_holds_u_of_prp_credit_per_half_and_u_of_the_repaired_credit(crossed, untrained):
    peer, crossings, _ = crossed
    llama, c = untrained["llama"], crossings[0]
    repaired = torch.linspace(-1.0, 2.0, len(c.completion_ids))     # credit PRP does not give: U_repaired must move
    record = {"D": 0.25, "terms": {"tbd": 0.5}, "scaled": {"tbd": 0.3}, "level": "xgrpo"}
    candidate = premise.Candidate(SimpleNamespace(policy=llama), SimpleNamespace(source=peer), c, repaired, record)
    n = sum(w.numel() for w in premise.trained(llama.model))
    gen = torch.Generator().manual_seed(3)
    halves = [torch.randn(n, generator=gen), torch.randn(n, generator=gen)]
    args = Args(temperature=0.9, graft_delta=0.05)      # neither the default: a row must read them from the run's
    row = premise_measure.offer_row(candidate, halves, seed=7, stage=50, args=args)
    step = sgd_step_of(llama, c.prompt_ids, c.completion_ids, c.advantages, c.weights, 0.9)
    step_repaired = sgd_step_of(llama, c.prompt_ids, c.completion_ids, repaired, c.weights, 0.9)
    want = [float(step.double() @ h.double()) for h in halves]
    assert row["U_halves"] == pytest.approx(want, rel=1e-3, abs=1e-9)
    assert row["U_repaired"] == pytest.approx(sum(float(step_repaired.double() @ h.double()) for h in halves) / 2,
                                              rel=1e-3, abs=1e-9)
    assert abs(row["U_repaired"] - sum(want) / 2) > 1e-3 * abs(row["U_repaired"])
    assert (row["source"], row["receiver"], row["seed"], row["stage"]) == ("qwen2", "llama", 7, 50)
    assert (row["D"], row["terms"], row["scaled"], row["band"]) == (0.25, {"tbd": 0.5}, {"tbd": 0.3}, "xgrpo")
    assert {k: row[k] for k in premise.signals(peer, c, 0.05)} == premise.signals(peer, c, 0.05)


# ---------------------------------------------------------------------------------------------------------------
# The statistics: the cluster bootstrap, Holm, the registered calls
# ---------------------------------------------------------------------------------------------------------------

def test_the_exact_cluster_bootstrap_is_every_ordered_draw_weighted_alike():
    groups = [[1.0], [2.0, 4.0], [10.0]]
    values = np.array([v for g in groups for v in g])
    index = [[0], [1, 2], [3]]
    draws, weights = stats.bootstrap([np.array(i) for i in index], lambda i: np.array([values[i].mean()]),
                                     random.Random(0))
    got: dict[float, float] = {}
    for v, w in zip(draws[:, 0], weights):
        got[round(v, 9)] = got.get(round(v, 9), 0) + w
    want: dict[float, float] = {}
    for picked in itertools.product(range(3), repeat=3):       # the 27 ordered draws, 1/27 each
        v = round(float(np.mean([x for k in picked for x in groups[k]])), 9)
        want[v] = want.get(v, 0) + 1 / 27
    assert got.keys() == want.keys() and all(got[v] == pytest.approx(want[v]) for v in want)
    # the interval and p of a statistic every resample puts above 0: the extremes, p = 0
    result = stats.summary(values.mean(), draws[:, 0], weights)
    assert result["p"] == 0 and result["low"] == pytest.approx(min(want)) and result["high"] == pytest.approx(10)


def test_one_cluster_gives_no_interval_and_no_call():
    result, = stats.clustered([[0, 1, 2]], lambda i: np.array([float(len(i))]), random.Random(0))
    assert result["value"] == 3 and all(math.isnan(result[k]) for k in ("low", "high", "p"))
    assert stats.call_negative(result, stats.holm({"d": result["p"]})["d"]) == "not resolved"


def test_holm_steps_down_as_by_hand():
    # m = 4: 0.01 <= 0.05/4; then 0.03 > 0.05/3 stops, so 0.04 is not rejected either
    assert stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.2}) == {"a": True, "b": False, "c": False, "d": False}
    # 0.001 <= 0.05/3, 0.02 <= 0.05/2, 0.024 <= 0.05
    assert stats.holm({"a": 0.02, "b": 0.001, "c": 0.024}) == {"a": True, "b": True, "c": True}
    assert stats.holm({"a": math.nan, "b": 0.01}) == {"a": False, "b": True}      # 0.01 <= 0.05/2


def test_spearman_columns_match_scipy_with_ties():
    gen = np.random.default_rng(0)
    x, y = gen.integers(0, 4, (30, 3)).astype(float), gen.normal(size=30)
    want = [scipy_stats.spearmanr(x[:, s], y).statistic for s in range(3)]
    np.testing.assert_allclose(stats.spearman_columns(x, y), want)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))


def hand_rows(gen: random.Random) -> list[dict]:
    """Two directions of qwen-llama over 6 clusters (seeds 1-3 x iterations 10, 50), 10 offers each: in qwen ->
    llama U falls with D by construction (U = -D plus noise a tenth of D's spread) and the repaired credit adds 1
    to U; in llama -> qwen U is independent of D, the repair adds noise centred on 0, and TBD is 0 throughout."""
    rows = []
    for seed, stage, falls in itertools.product((1, 2, 3), (10, 50), (True, False)):
        for _ in range(10):
            d = gen.random()
            u = -d + gen.gauss(0, 0.03) if falls else gen.gauss(0, 1)
            terms = {"tbd": gen.random() if falls else 0.0, "ccm": gen.random(), "rsd": gen.random()}
            rows.append({"source": "qwen" if falls else "llama", "receiver": "llama" if falls else "qwen",
                         "seed": seed, "stage": stage, "D": d, "terms": terms, "scaled": terms, "U_halves": [u, u],
                         "U_repaired": u + (1.0 if falls else gen.gauss(0, 1)), "prp_ratio": gen.random(),
                         "hacpo_s": gen.random(), "graft_weight": gen.random(), "ftis_kl": gen.random(),
                         "reward": float(gen.random() < 0.5), "advantage": gen.choice((-1, 1)) * (0.5 + gen.random()),
                         "band": "prp"})
    return rows


def write_hand_rows(folder: Path) -> list[dict]:
    rows = hand_rows(random.Random(0))
    for seed, stage in itertools.product((1, 2, 3), (10, 50)):
        premise_measure.write_rows(premise_report.stage_file(folder, "qwen-llama", seed, stage),
                                   [r for r in rows if (r["seed"], r["stage"]) == (seed, stage)])
    return rows


FALLS, INDEPENDENT = "qwen-llama: qwen -> llama", "qwen-llama: llama -> qwen"


def test_the_registered_calls_on_rows_whose_answer_is_known(tmp_path):
    rows = write_hand_rows(tmp_path)
    loaded = premise_report.load(tmp_path)
    assert len(loaded) == len(rows) and {r["direction"] for r in loaded} == {FALLS, INDEPENDENT}
    numbers = {d: premise_report.per_direction(loaded, d, random.Random(0)) for d in (FALLS, INDEPENDENT)}
    falls = [r for r in rows if r["source"] == "qwen"]
    assert numbers[FALLS]["rho"]["D"]["value"] == pytest.approx(
        scipy_stats.spearmanr([r["D"] for r in falls], [r["U_halves"][0] for r in falls]).statistic)
    assert numbers[FALLS]["clusters"] == 6 and numbers[FALLS]["offers"] == 60
    calls = premise_report.hypotheses(numbers)
    assert calls["P1"][FALLS]["call"] == "supported" and calls["P1"][FALLS]["holm"]
    assert calls["P1"][INDEPENDENT]["call"] == "not resolved"
    # TBD is 0 on every offer of llama -> qwen: that direction leaves its family
    assert set(calls["P2"]["tbd"]) == {FALLS} and set(calls["P2"]["ccm"]) == {FALLS, INDEPENDENT}
    assert calls["P3"][FALLS]["value"] == 1 and calls["P3"][FALLS]["call"] == "supported"
    assert calls["P3"][INDEPENDENT]["call"] == "not resolved"


def test_a_rho_whose_interval_lies_above_the_trivial_bound_is_refuted():
    assert stats.call_negative({"value": 0.02, "low": -0.05, "high": 0.1}, rejected=False) == "refuted"
    assert stats.call_negative({"value": -0.3, "low": -0.4, "high": -0.2}, rejected=True) == "supported"
    assert stats.call_negative({"value": -0.05, "low": -0.3, "high": 0.2}, rejected=False) == "not resolved"
    assert stats.call_positive_median({"value": 0.1, "low": 0.05, "high": 0.2}, rejected=True) == "supported"
    assert stats.call_positive_median({"value": 0.1, "low": -0.05, "high": 0.2}, rejected=False) == "not resolved"


def test_report_writes_its_tables_and_figure_from_the_rows_alone(tmp_path):
    write_hand_rows(tmp_path)
    (tmp_path / "gate-s1.json").write_text(json.dumps(hand_gate()))
    premise_cli.main(["report", str(tmp_path)])           # the documented command
    assert (tmp_path / "premise.png").stat().st_size > 0
    text = (tmp_path / "report.md").read_text()
    for title in ("P1", "P2: rho(tbd", "P3", "P4: |rho| with U (descriptive)", "P4: |rho| with U / |A|"):
        section = text.split(f"### {title}")[1].split("###")[0]
        assert FALLS in section
        assert (INDEPENDENT in section) == (title != "P2: rho(tbd")
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["P1"][FALLS]["call"] == "supported" and set(saved["directions"]) == {FALLS, INDEPENDENT}
    assert "gate-s1.json" in text.split("## Readings")[1] and "### TBD's modal value" in text
    read = saved["readings"]
    assert read["gate"]["gate-s1.json"]["lowered"] == 6 and set(read["tbd"]) == {FALLS}       # TBD varies there only
    assert read["duplicates"][FALLS] == {"offers": 60, "distinct": 60, "duplicates": 0, "seeds": 3, "clusters": 6}
    assert read["tbd"][FALLS]["rho_without_early"]["clusters"] == 3


# ---------------------------------------------------------------------------------------------------------------
# The gate's decision rules on hand-built lookahead numbers
# ---------------------------------------------------------------------------------------------------------------

def test_paired_differences_by_hand():
    got = stats.paired([1.0, 2.0, 3.0, 4.0])
    se = math.sqrt(((1.5 ** 2 + 0.5 ** 2) * 2) / 3) / 2              # sample sd / sqrt(4)
    assert got["mean"] == 2.5 and got["se"] == pytest.approx(se)
    assert got["low"] == pytest.approx(2.5 - 1.959964 * se, rel=1e-6)


def test_the_lr_ladder_takes_the_smallest_rung_three_standard_errors_out():
    noise = [0.01, -0.01] * 25                          # sd 0.0101, se 0.00143: 3 se = 0.0043
    moves = {lr: [lr * 0.0585 + e for e in noise] for lr in (0.01, 0.03, 0.1, 0.3)}     # 0.0006, 0.0018, 0.0059
    assert stats.choose_lr(moves) == (0.1, True)
    assert stats.choose_lr({lr: noise for lr in (0.01, 0.03, 0.1, 0.3)}) == (0.3, False)
    assert stats.choose_lr({0.01: [-0.01] * 4, 0.03: [0.5] * 4}) == (0.01, True)      # a fall moves it too


def test_each_pass_condition_by_hand():
    up = list(range(30))
    assert stats.rank_condition(up, [2 * x for x in up], random.Random(0))["passes"]
    assert not stats.rank_condition(up, [-x for x in up], random.Random(0))["passes"]
    assert stats.decile_condition([0.1, 0.2, 0.3, 0.2])["passes"]
    assert not stats.decile_condition([0.1, -0.2, 0.3, -0.2])["passes"]
    assert stats.deciles([5, 1, 9, 3, 7, 2, 8, 0, 6, 4, 11, 10, 13, 12, 15, 14, 17, 16, 19, 18]) == ([7, 1], [19, 18])


def test_the_gate_judged_on_hand_built_lookaheads():
    u = [float(i) for i in range(1, 21)]
    noise = np.array([0.01, -0.01] * 25)

    def decile_move(indices, lr):       # per prompt: lr x 0.003 x the offers' mean U, plus the draws' noise
        return lr * 0.003 * np.mean([u[i] for i in indices]) + noise

    # the top decile (19, 20) moves 0.0059 at lr 0.1, the first rung past 3 se; top - bottom = 0.1 x 0.003 x 18
    judged = stats.judge([[3 * x, -x] for x in u], lambda lr: [lr * x for x in u], decile_move, random.Random(0))
    assert judged["lr"] == 0.1 and judged["rank"]["value"] == pytest.approx(1)
    assert judged["decile"]["mean"] == pytest.approx(0.1 * 0.003 * 18)
    assert judged["rank"]["passes"] and judged["decile"]["passes"]
    assert judged["split_half_rho"] == pytest.approx(-1) and not judged["passes"]     # halves disagree: fails
    assert json.loads(json.dumps(judged))["lr"] == 0.1                                 # the verdict file takes it
    assert stats.judge([[x, x] for x in u], lambda lr: [-x for x in u], decile_move, random.Random(0))["passes"]


def test_unreliable_halves_double_the_samples_up_to_four_times():
    seen = []

    def attempt(split_half_at):
        def run(samples):
            seen.append(samples)
            return {"split_half_rho": split_half_at.get(samples, 0.1)}
        return run
    assert len(stats.until_reliable(attempt({16: 0.2, 32: 0.4, 64: 0.6}), 16)) == 3 and seen == [16, 32, 64]
    seen.clear()
    assert len(stats.until_reliable(attempt({}), 16)) == 5 and seen == [16, 32, 64, 128, 256]


# ---------------------------------------------------------------------------------------------------------------
# measure: resumable, a file per (preset, seed, stage) written whole
# ---------------------------------------------------------------------------------------------------------------

def test_measure_skips_what_exists_and_writes_nothing_of_a_failed_stage(tmp_path):
    calls = []

    def rows_of(preset, seed, stage):
        calls.append((preset, seed, stage))
        if stage == 50 and len(calls) < 3:
            raise RuntimeError("killed")
        return [{"seed": seed, "stage": stage}]
    with pytest.raises(RuntimeError):
        premise_measure.measure(["qwen-llama"], [1], [50, 10], tmp_path, rows_of)
    assert calls == [("qwen-llama", 1, 10), ("qwen-llama", 1, 50)]          # the stages in order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen-llama-s1-it010.jsonl"]
    written = premise_measure.measure(["qwen-llama"], [1], [10, 50], tmp_path, rows_of)
    assert calls[2:] == [("qwen-llama", 1, 50)] and [p.name for p in written] == ["qwen-llama-s1-it050.jsonl"]
    assert premise_report.read_rows(written[0]) == [{"seed": 1, "stage": 50}]
    assert premise_report.stage_of(written[0]) == ("qwen-llama", 1, 50)
    assert premise_measure.measure(["qwen-llama"], [1], [10, 50], tmp_path, rows_of) == [] and len(calls) == 3


def test_the_draw_caps_each_direction_and_ignores_the_others():
    pool = [("a", "b", i) for i in range(10)] + [("b", "a", i) for i in range(3)]
    direction = lambda item: item[:2]  # noqa: E731
    drawn = premise_measure.draw(pool, 4, "k", direction)
    assert sum(d[:2] == ("a", "b") for d in drawn) == 4 and sum(d[:2] == ("b", "a") for d in drawn) == 3
    alone = premise_measure.draw(pool[:10], 4, "k", direction)
    assert alone == [d for d in drawn if d[:2] == ("a", "b")]
