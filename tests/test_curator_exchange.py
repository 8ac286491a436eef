"""The curator's exchange between tiny policies (proposal §2.1-2.2, curator.py: Curator.exchange): every offer
diagnosed, admitted and repaired by its own rules, the controls' and ranked admissions by hand, its refusals; and
cross-fidelity runs end to end. D and admission on hand-built offers are tests/test_curator.py's."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import coevolution
import curator
import diagnosis
import reachability
import reward_drift
import sharing
import tokalign
import train
from testbed import arith, policies, tasks, tiny
from test_train import MIXED, tiny_args

ROOT = Path(__file__).resolve().parent.parent


def fidelity_records(run_dir):
    return [json.loads(line) for line in (run_dir / "fidelity.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("pair, admission", [("qwen-llama", "diagnosis"),
                                             pytest.param("trio", "diagnosis", marks=pytest.mark.slow),
                                             ("qwen-llama", "random")])
def test_a_cross_fidelity_run_logs_decisions_that_follow_its_own_rules(tmp_path, cache_dir, pair, admission, capsys,
                                                                     scripted_rewards):
    # what holds on every path, whichever levels a seeded run happens to use on this machine; the rewards scripted
    # so that every kind of record the checks below read is there: prompt 0 inert (every policy's rewards 1), the
    # others mixed, so their offers carry advantages and are diagnosed
    scripted_rewards(lambda policy, problems: torch.tensor([[1.0] * 6] + [MIXED] * (len(problems) - 1)))
    args = tiny_args(tmp_path, cache_dir, pair=pair, share="cross-fidelity", iterations=2, thresholds="adaptive",
                     admission=admission)
    run_dir = train.main(args)
    records = fidelity_records(run_dir)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in logged if "losses/policy_loss" in r]
    assert all(math.isfinite(r["losses/policy_loss"]) and "fidelity/admitted_prp" in r
               and math.isfinite(r["losses/update_kl"]) for r in updates)
    assert all("fidelity/guard_tripped" in r for r in updates if r["iteration"] == 2)   # iteration 1 judged then
    # a context moves only on three cycles' evidence, so in two iterations each plays its start, level 0, or the
    # step up that exploration tries
    assert all(r[f"fidelity/threshold_level/{source}"] in (0.0, 1.0) for r in updates if pair == "qwen-llama"
               for source in {"qwen", "llama"} - {r["policy"]})
    assert records and all(r["receiver"] != r["source"] and r["iteration"] in (1, 2) for r in records)
    assert {"inert", "prp"} <= {r["level"] for r in records} and any("tokens" in r["crossed"] for r in records)
    weights = dict(zip(diagnosis.TERMS, args.curator_config.weights.tolist()))
    for r in (r for r in records if "D" in r):
        assert {"tbd", "ccm", "rsd"} == set(r["terms"]) == set(r["scaled"])
        # D the weighted sum of the logged scaled terms (an unmeasured one 0), the band its place among the thetas
        scaled = {t: 0.0 if v is None or math.isnan(v) else v for t, v in r["scaled"].items()}
        assert r["D"] == pytest.approx(sum(weights[t] * scaled[t] for t in weights), abs=1e-9)
        theta1, theta2 = r["theta"]
        assert r["band"] == (0 if r["D"] < theta1 else 1 if r["D"] < theta2 else 2)
        if admission == "diagnosis":
            assert r["level"] == sharing.LEVELS[r["band"]] or (r["band"] == 2 and r["level"] == "rejected")
    for key in {(r["iteration"], r["source"], r["receiver"]) for r in records}:   # the control keeps the shares
        mine = [r for r in records if (r["iteration"], r["source"], r["receiver"]) == key and "band" in r]
        levels = sorted("sgt" if r["level"] == "rejected" else r["level"] for r in mine)
        assert levels == sorted(sharing.LEVELS[r["band"]] for r in mine)
    for r in (r for r in records if r["level"] == "inert"):
        assert r["advantage"] == 0 and "D" not in r
    for r in (r for r in records if "tokens" in r["crossed"]):   # separators and EOS carry only step credit
        low, high = min(r["step_credit"]) - 1e-6, max(r["step_credit"]) + 1e-6
        assert all(low <= c <= high for c in r["outside_credit"])
    assert "Fidelity" in (run_dir / "report.md").read_text() and "moved" in (run_dir / "report.md").read_text()
    # the run ends with the curator's summary, a line per direction, its counts those of the record
    printed = capsys.readouterr().out
    summary = printed[printed.index("curation over 2 iterations, per source -> receiver:"):]
    for src, rcv in {(r["source"], r["receiver"]) for r in records}:
        mine = [r for r in records if (r["source"], r["receiver"]) == (src, rcv)]
        line = re.search(rf"  {src} -> {rcv}: (\d+) offers; admitted PRP (\d+), XGRPO (\d+), SGT (\d+); "
                         rf"rejected (\d+); "
                         rf"inert (\d+); rescued (\d+); mean TBD ([\d.]+|-), CCM ([\d.]+|-), RSD ([\d.]+|-)",
                         summary)
        counts = [len(mine)] + [sum(r["level"] == level for r in mine)
                                for level in ("prp", "xgrpo", "sgt", "rejected", "inert")]
        assert [int(g) for g in line.groups()[:6]] == counts
        assert int(line.group(7)) == sum("verified rescue" in r["reason"] for r in mine)
        tbd = [r["terms"]["tbd"] for r in mine if "D" in r]      # none where every offer was inert or skipped
        mean = float(line.group(8)) if tbd else line.group(8)
        assert mean == (pytest.approx(sum(tbd) / len(tbd), abs=5e-4) if tbd else "-")
    assert f"{run_dir / 'report.md'}; every decision: {run_dir / 'fidelity.jsonl'}" in summary
    if pair == "qwen-llama" and admission == "diagnosis":      # the README's sensitivity commands on this run
        for command in (["runs", str(run_dir)], ["ablation", str(run_dir), str(run_dir), "--source", "qwen"]):
            out = subprocess.run([sys.executable, "-m", "benchmarks.curator_sensitivity", *command],
                                 capture_output=True, text=True, check=True, cwd=ROOT).stdout
            assert "CCM" in out if command[0] == "runs" else "in different bands: 0 (0%)" in out


def untrained_pair():
    pols = {}
    for family in ("qwen2", "llama"):
        tok = tiny.tiny_tokenizer(family)
        pols[family] = policies.Policy(family, tiny.tiny_model(family, tiny.TinyShape(32, 2, 4, 0), len(tok),
                                                                   seed=0), tok, use_chat_template=False)
    return pols


def hand_exchange(cfg: diagnosis.CuratorConfig, predictor=None, iterations: int = 1, peer_texts=None,
                  rewards=([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])):
    """A curated exchange between two untrained policies on hand-made rollouts (the peer's `peer_texts`, by default
    the receiver's) with the peer's and the receiver's `rewards`; returns what llama received and every record."""
    from test_sharing import PROMPTS, TEXTS, experience
    from test_train import TASK
    pols = untrained_pair()
    task = tasks.load_task("arith", 0, 0, 0, TASK)
    problems = arith.generate_problems(3, "train", seed=0, cfg=TASK)
    peer = experience(pols["qwen2"], PROMPTS, peer_texts or TEXTS, rewards[0])
    receiver = experience(pols["llama"], PROMPTS, TEXTS, rewards[1])
    cur = curator.Curator(cfg, ["qwen2", "llama"], 0, None, predictor)
    records = []
    for it in range(iterations):
        received, mine = cur.exchange([receiver, peer], task, problems,
                                      sharing.ShareConfig("cross-fidelity", temperature=1.0), it + 1)
        records += mine
    return peer, received, records


def test_an_exchange_between_untrained_policies_admits_repairs_and_logs_every_offer():
    peer, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    assert len(records) == 12 and all(r["level"] == "prp" for r in records)        # raw D < 0.9: all PRP
    llama = received["llama"]
    assert sorted(c.index for c in llama.crossings) == [0, 1, 4, 5]     # non-zero advantages; 0 and 5 are rescues
    for c in llama.crossings:
        assert len(c.advantages) == len(c.completion_ids) and torch.isfinite(c.advantages).all()
        sign = peer.advantages.flatten()[c.index].sign()
        assert ((c.advantages * sign) >= -1e-6).all()      # repairs rescale the credit, never flip its sign here
    assert {t for r in records for t in r["repairs"]} <= {"ccm", "rsd"}
    for r in records:   # the CCM repair acted on a crossing exactly where one of its steps lay out of reach
        assert ("ccm" in r["repairs"]) == ("step_credit" in r and any(s["ccm"] > 0 for s in r["steps"]))
    assert llama.metrics["fidelity/admitted_prp"] == 1.0 and llama.metrics["sharing/received"] == 4


def test_the_negated_control_crosses_the_same_offers_with_every_credit_negated_and_the_ranked_admission_by_hand():
    _, plain, _ = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    _, negated, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, negate_credit=True))
    pairs = list(zip(plain["llama"].crossings, negated["llama"].crossings))
    assert pairs and all(a.index == b.index and a.completion_ids == b.completion_ids for a, b in pairs)
    for a, b in pairs:                          # the repairs scale a credit; negating it negates every token's
        torch.testing.assert_close(b.advantages, -a.advantages)
    # ranked by reward, half admitted: of llama's 6 offers from qwen (rewards 1, 0, 1, 1, 0, 1), 3 at PRP, three
    # of the four 1s (a seeded draw breaks their tie); the rest rejected whole, a rescue too (offers 0 and 5: llama
    # failed their prompts), which every band would let cross. Only the rescues carry credit: offers 2 and 3 come
    # from a prompt qwen's whole group solved, so their advantage is 0 and nothing crosses with them
    _, ranked, records = hand_exchange(diagnosis.CuratorConfig(admission="ranked", rank_by="reward", admit_share=0.5))
    mine = [r for r in records if r["receiver"] == "llama"]
    admitted = {k for k, r in enumerate(mine) if r["level"] == "prp"}
    assert len(admitted) == 3 and admitted <= {0, 2, 3, 5}
    assert all(mine[k]["level"] == "rejected" for k in set(range(6)) - admitted)
    assert {c.index for c in ranked["llama"].crossings} == admitted & {0, 5}


def test_a_crossing_whose_every_step_is_in_reach_lists_no_ccm_repair(monkeypatch):
    monkeypatch.setattr(reachability, "reachability", lambda norms, calibration: torch.ones_like(norms))
    _, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    assert received["llama"].crossings and all(r["terms"]["ccm"] == 0 for r in records if "terms" in r)
    assert {t for r in records for t in r["repairs"]} == {"rsd"}


def test_a_peer_completion_with_no_step_is_recorded_as_rejected_and_never_crosses():
    from test_sharing import TEXTS
    texts = [["", TEXTS[0][1]], *TEXTS[1:]]                          # the first completion is EOS alone
    _, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95), peer_texts=texts)
    empty = [r for r in records if r["receiver"] == "llama" and r["index"] == 0]
    assert [(r["level"], r["crossed"], r["reason"]) for r in empty] == [
        ("rejected", "none", "no step reaches the receiver's tokens (or its tokenizer cannot spell the text)")]
    assert 0 not in {c.index for c in received["llama"].crossings}
    assert len([r for r in records if r["receiver"] == "llama"]) == 6   # every other offer still decided


def test_an_offer_that_cannot_cross_counts_in_whether_its_prompt_is_inert():
    from test_sharing import TEXTS
    texts = [["", TEXTS[0][1]], TEXTS[1], [TEXTS[2][0], ""]]          # peer rollouts 0 and 5 are EOS alone
    _, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=1.0, theta2=1.0), peer_texts=texts,
                                         rewards=([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]],
                                                  [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    into_llama = {r["index"]: r for r in records if r["receiver"] == "llama"}
    assert into_llama[0]["level"] == into_llama[1]["level"] == "inert"            # prompt 0: every reward 1
    # prompt 2: the 0 offered beside its group's 1, which cannot cross, carries a negative advantage at PRP
    assert (into_llama[5]["level"], into_llama[4]["level"]) == ("rejected", "prp")
    assert 4 in {c.index for c in received["llama"].crossings}


def test_a_receiver_with_no_step_of_its_own_refuses_to_calibrate_reach_and_names_the_run_that_needs_none(
        monkeypatch):
    monkeypatch.setattr(reachability, "own_steps", lambda *args: [])     # every own completion without a step
    with pytest.raises(ValueError, match="no step to calibrate reachability on yet .*--ablate ccm"):
        hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    _, received, _ = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, ablate=("ccm",)))
    assert received["llama"].crossings                                  # the advised run curates without it


@pytest.mark.parametrize("theta, levels", [((1.0, 1.0), {"prp"}), ((0.0, 1.0), {"xgrpo"}),
                                           ((0.0, 0.0), {"sgt", "rejected"})])
def test_thresholds_force_each_level_and_rescues_cross_at_all_of_them(theta, levels):
    peer, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=theta[0], theta2=theta[1]))
    into_llama = [r for r in records if r["receiver"] == "llama"]
    assert {r["level"] for r in into_llama} == levels
    rescued = {r["index"] for r in into_llama if "tokens" in r["crossed"] and "rescue" in r["reason"]}
    assert rescued == {0, 5}                                  # the peer's successes on the prompts llama failed
    assert {c.index for c in received["llama"].crossings} >= rescued


@pytest.mark.parametrize("measure", ["hidden", "jaccard"])
def test_the_tbd_measure_chosen_is_the_tbd_term_of_every_record(measure):
    _, _, credit = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    _, _, other = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, tbd_measure=measure))
    tbd = [r["terms"]["tbd"] for r in other if "terms" in r]
    assert all(0.0 <= t <= 1.0 for t in tbd)
    # the hand-made texts are digits and lines: no boundary is straddled, so the credit measure reads 0 while
    # Qwen2's single digits against Llama-3's groups are drift to the hidden map and to the Jaccard index
    assert all(r["terms"]["tbd"] == 0.0 for r in credit if "terms" in r) and max(tbd) > 0
    assert [r["terms"]["ccm"] for r in credit if "terms" in r] == [r["terms"]["ccm"] for r in other if "terms" in r]
    assert [r.get("tbd_jaccard") for r in other] == [r.get("tbd_jaccard") for r in credit]
    # and carrying the credit by bytes moves none of it, whatever the measure read
    assert not any("tbd" in r["repairs"] for r in credit + other)


def test_a_crossing_lists_the_tbd_repair_where_carrying_its_credit_by_bytes_moved_some(monkeypatch):
    token_credit = tokalign.token_credit
    monkeypatch.setattr(tokalign, "token_credit", lambda *args: token_credit(*args) * (2 if args[-1] else 1))
    _, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))
    crossed = [r for r in records if "step_credit" in r]
    assert crossed and all(("tbd" in r["repairs"]) == any(c != 0 for c in r["step_credit"]) for r in crossed)


def test_an_ablated_ccm_computes_no_gradient_norms(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("gradient norms computed with CCM ablated")
    monkeypatch.setattr(reachability, "step_grad_norms", refuse)
    peer, received, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, ablate=("ccm",)))
    assert all(math.isnan(r["terms"]["ccm"]) for r in records if "terms" in r)
    assert {t for r in records for t in r["repairs"]} == {"rsd"}


def test_the_predictor_skips_nothing_before_it_was_audited_on_that_receiver():
    # confidence 0 and trust 0: every prediction is sure, and the only gate left is the per-receiver audit count.
    # Iteration 1: llama receives first with no history (nothing sure); qwen2 then has history but no audit of
    # its own. Iteration 2: only qwen2 has been audited, so only qwen2's offers may skip, and all of them do
    # but those whose tokens would cross.
    cfg = coevolution.PredictorConfig(min_history=4, min_audits=3, confidence=0.0, trust=0.0, audit=0.0)
    _, _, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95), cfg, iterations=2)
    skipped = [r for r in records if r["skipped"]]
    assert all(r["iteration"] == 2 and r["receiver"] == "qwen2" for r in skipped)
    assert skipped and all("tokens" not in r["crossed"] for r in skipped)
    # the random control permutes every band, a skipped offer's too, so under it nothing skips: an offer it moves
    # into a level whose tokens cross is then diagnosed, and repaired, like any other
    _, _, records = hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, admission="random"), cfg,
                                  iterations=2)
    assert not any(r["skipped"] for r in records)


def test_calibration_steps_come_from_every_prompt():
    from test_sharing import PROMPTS, TEXTS, experience
    from test_train import TASK
    pols = untrained_pair()
    own = experience(pols["llama"], PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    task = tasks.load_task("arith", 0, 0, 0, TASK)
    items = reachability.own_steps(pols["llama"], own.rollouts, task.step_spans, 3)
    prompts = {tuple(p) for p, _, _ in items}
    assert len(items) == 3 and len(prompts) == 3                # one rollout of each of the 3 prompts, not one group
    texts = [pols["llama"].decode(c) for _, c, _ in items]
    assert texts[0].startswith(TEXTS[0][0][:9]) and texts[1].startswith(TEXTS[1][1][:10])   # sample b mod G


def test_reachability_is_calibrated_on_the_window_of_own_norms(monkeypatch):
    # the curator calibrates R on each receiver's own step norms of its last reach_window iterations, this one's
    # included: the window fills one iteration at a time, then slides
    seen = []
    calibrate = reachability.calibrate
    monkeypatch.setattr(reachability, "calibrate", lambda norms, *a: seen.append(len(norms)) or calibrate(norms, *a))
    cfg = diagnosis.CuratorConfig(theta1=0.9, theta2=0.95, reach_window=4, calibration_rollouts=2)
    hand_exchange(cfg, iterations=5)
    n = seen[0]                                                 # llama's first: its own norms of iteration 1 alone
    assert seen[::2] == [n, 2 * n, 3 * n, 4 * n, 4 * n]         # the same texts every iteration


def test_a_non_finite_gradient_norm_on_an_offered_step_stops_the_exchange(monkeypatch):
    # a NaN norm would read as fully reachable (R = 1, no CCM): it is refused before anything crosses
    measure = reachability.step_norms
    calls = []

    def poisoned(policy, items, *rest):
        norms = measure(policy, items, *rest)
        calls.append(policy.name)
        if len(calls) == 1:                                  # the first receiver's offers, before its own steps
            norms[-1] = torch.full_like(norms[-1], math.nan)
        return norms
    monkeypatch.setattr(reachability, "step_norms", poisoned)
    with pytest.raises(FloatingPointError, match="gradient norm on a step qwen2 offered is not finite"):
        hand_exchange(diagnosis.CuratorConfig(theta1=0.9, theta2=0.95))


def test_the_density_ratio_signals_by_a_naive_forward_pass_and_a_ranked_admission_by_each():
    from test_sharing import PROMPTS, TEXTS, experience, naive_logprobs
    from test_train import TASK
    pols = untrained_pair()
    llama = pols["llama"]
    peer = experience(pols["qwen2"], PROMPTS, TEXTS, [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    # behaviour log-probs that differ token by token, four rollouts' so low that their sequence ratio exceeds 1,
    # where the capped ratio ties them
    gen = torch.Generator().manual_seed(0)
    peer.rollouts.logprobs = [-2 * torch.rand(len(ids), generator=gen) - (8.0 if i in (0, 1, 2, 4) else 0.0)
                              for i, ids in enumerate(peer.rollouts.completion_ids)]
    receiver = experience(llama, PROMPTS, TEXTS, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    task, share = tasks.load_task("arith", 0, 0, 0, TASK), sharing.ShareConfig("cross-fidelity", temperature=1.0)
    problems = arith.generate_problems(3, "train", seed=0, cfg=TASK)
    wanted = []
    for offer in diagnosis.ReceiverSide(receiver, [peer], task, diagnosis.CuratorConfig(), share).offers(
            problems, {"qwen2": reward_drift.StepStats(1), "llama": reward_drift.StepStats(1)})[0]:
        prompt = llama.encode_prompt(PROMPTS[offer.prompt_index])
        logp = naive_logprobs(llama.model, prompt, offer.receiver_encoding.ids, 1.0).double()           # [T]
        source = peer.rollouts.logprobs[offer.index].double()                                           # [n]
        s = math.exp(logp.mean().item() - source.mean().item())
        x = [logp[t0:t1].sum().item() - source[s0:s1].sum().item()              # one aligned group at a time
             for (s0, s1), (t0, t1) in zip(offer.alignment.src, offer.alignment.tgt) if t1 > t0]
        wanted.append({"sequence_ratio": s, "capped_ratio": min(s, 1.0),
                       "kl": sum(math.exp(v) - v - 1 for v in x) / len(x)})
    assert len(wanted) == 6 and sum(w["capped_ratio"] == 1.0 for w in wanted) == 4
    for rank_by, sense in (("sequence_ratio", -1), ("capped_ratio", -1), ("kl", 1)):
        cfg = diagnosis.CuratorConfig(admission="ranked", rank_by=rank_by, admit_share=0.5)
        offers, _ = diagnosis.ReceiverSide(receiver, [peer], task, cfg, share).offers(
            problems, {"qwen2": reward_drift.StepStats(1), "llama": reward_drift.StepStats(1)})
        for o, w in zip(offers, wanted):
            assert o.ratios[rank_by] == pytest.approx(w[rank_by], rel=1e-4, abs=1e-6)
        cur = curator.Curator(cfg, ["qwen2", "llama"], 0, None, None)
        _, records = cur.exchange([receiver, peer], task, problems, share, 1)
        mine = [r for r in records if r["receiver"] == "llama"]
        assert [r["ratios"][rank_by] for r in mine] == pytest.approx([w[rank_by] for w in wanted], rel=1e-4)
        # the first half of the 6 offers in the signal's order at PRP, the rest rejected; the capped ratio ties
        # the four above 1, of which a seeded draw admits three
        admitted = {k for k, r in enumerate(mine) if r["level"] == "prp"}
        order = sorted(range(6), key=lambda k: sense * wanted[k][rank_by])
        if rank_by == "capped_ratio":
            assert len(admitted) == 3 and admitted <= {k for k in range(6) if wanted[k][rank_by] == 1.0}
        else:
            assert admitted == set(order[:3]), (rank_by, wanted)
