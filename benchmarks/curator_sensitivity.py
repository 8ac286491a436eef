"""How the curator's admission depends on its diagnosis, from runs' fidelity.jsonl and on one iteration's offers.

    python benchmarks/curator_sensitivity.py runs RUN [RUN ...]         # per term: moved, saturated; band shares
    python benchmarks/curator_sensitivity.py ablation RUN RUN_ABLATED --source mistral --iteration 1
    python benchmarks/curator_sensitivity.py calibration --seed 500    # redraw half of R's calibration sample

`runs`: for each run and source -> receiver, every weighted term's `moved` (the share of diagnosed offers whose band
differs between the term at its 10th and at its 90th percentile, the others kept) and `saturated` (the share whose
term could not get worse), and the bands of D per direction (no collapse: at least two bands hold 10% or more).
`ablation`: the same offers (one seed, one iteration: the rollouts precede any decision) in two runs, the share that
landed in different bands. `calibration`: the tiny pair's first iteration; R is calibrated on a window of own
rollouts as in training, half of which is redrawn (fresh rollouts of the same prompts) ten times; the share of
offers whose band changes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import curator  # noqa: E402
import diagnosis  # noqa: E402
import fidelity_record  # noqa: E402
import grpo  # noqa: E402
import policies  # noqa: E402
import reachability  # noqa: E402
import reward_drift  # noqa: E402
import sharing  # noqa: E402
import tasks  # noqa: E402
import term_scales  # noqa: E402
import train  # noqa: E402


def read(run: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (run / "fidelity.jsonl").read_text().splitlines() if line]
    return records, json.loads((run / "config.json").read_text())


def runs_table(runs: list[Path]) -> None:
    print("| run | source -> receiver | term | offers | moved | saturated |\n|---|---|---|---|---|---|")
    shares = []
    for run in runs:
        records, config = read(run)
        for pair in sorted({(r["source"], r["receiver"]) for r in records}):
            mine = [r for r in records if (r["source"], r["receiver"]) == pair]
            for term, s in fidelity_record.sensitivity(mine, fidelity_record.run_weights(config),
                                                       fidelity_record.run_calibration(config)).items():
                print(f"| {run.name} | {pair[0]} -> {pair[1]} | {term.upper()} | {s['offers']} | {s['moved']:.0%} "
                      f"| {s['saturated']:.0%} |")
        shares += [(run.name, pair, s) for pair, s in fidelity_record.band_shares(records).items()]
    print("\n| run | source -> receiver | PRP | XGRPO | SGT | bands with 10% or more |\n|---|---|---|---|---|---|")
    for name, (src, rcv), s in shares:
        print(f"| {name} | {src} -> {rcv} | " + " | ".join(f"{v:.0%}" for v in s) + f" | {sum(v >= 0.1 for v in s)} |")


def ablation_table(run: Path, ablated: Path, source: str, iteration: int) -> None:
    bands = [{(r["receiver"], r["index"]): r["band"] for r in read(d)[0]
              if r["source"] == source and r["iteration"] == iteration and "band" in r} for d in (run, ablated)]
    common = sorted(set(bands[0]) & set(bands[1]))
    moved = sum(bands[0][k] != bands[1][k] for k in common)
    print(f"offers from {source} at iteration {iteration} diagnosed in both runs: {len(common)}; in different bands: "
          f"{moved} ({moved / max(len(common), 1):.0%})")


def calibration_stability(seed: int, redraws: int, pair: str = "qwen-llama") -> None:
    args = train.Args(pair=pair, seed=seed)
    cfg = args.curator_config
    task = tasks.load_task("arith", seed, args.train_size, 0, args.task_config)
    pols = policies.load_policies(pair, "tiny", torch.device("cpu"), args.task_config, seed)
    problems = train.prompt_sampler(seed, 0).sample(task.train, args.prompts_per_iteration)
    prompts = [task.prompt(q) for q in problems]
    g = torch.Generator().manual_seed(seed)

    def sample(p):
        return p.rollout(prompts, args.group_size, args.max_new_tokens, args.temperature, generator=g)
    experiences = []
    for p in pols:
        out = sample(p)
        rewards = tasks.group_rewards(task, problems, out.texts, args.group_size)
        experiences.append(sharing.Experience(p, prompts, out, rewards, grpo.group_advantages(rewards)))
    stats = {e.policy.name: reward_drift.StepStats(cfg.step_window) for e in experiences}
    for e in experiences:
        stats[e.policy.name].add_iteration([s for i, text in enumerate(e.rollouts.texts) for s in
                                            reward_drift.process_rewards(task, problems[i // args.group_size], text)])
    scales = term_scales.Calibration.load(cfg.calibration)
    theta = scales.thresholds(cfg.weights)
    rng = random.Random(seed)
    for receiver in experiences:
        q = receiver.policy
        params = reachability.parameter_subset(q.model, cfg.reach_subset)
        offers = [o for peer in experiences if peer is not receiver for i in range(len(peer.rollouts.texts))
                  if (o := diagnosis.make_offer(peer, i, q, task, problems[i // args.group_size], stats))]
        offers = [o for o, idle in zip(offers, curator.inert_offers(offers, receiver.rewards)) if not idle]
        norms = reachability.step_norms(q, [(q.encode_prompt(prompts[o.prompt_index]), o.tgt.ids, o.ranges)
                                            for o in offers], params)
        pool = [torch.cat(reachability.step_norms(q, reachability.own_steps(
            q, r, task.step_spans, cfg.calibration_rollouts), params))
            for r in [receiver.rollouts] + [sample(q) for _ in range(2 * cfg.reach_window - 1)]]

        def bands(window: list[torch.Tensor]) -> list[int]:
            calibration = reachability.calibrate(torch.cat(window), cfg.reach_quantile, cfg.reach_zero_quantile)
            out = []
            for o, g_k in zip(offers, norms):
                o.diagnosis.reach = reachability.reachability(g_k, calibration)
                out.append(curator.score(o, cfg, theta, scales).band)
            return out
        base = bands(pool[:cfg.reach_window])
        changed = []
        for _ in range(redraws):
            kept = rng.sample(range(cfg.reach_window), cfg.reach_window // 2)
            fresh = rng.sample(range(cfg.reach_window, 2 * cfg.reach_window), cfg.reach_window - len(kept))
            moved = bands([pool[i] for i in kept + fresh])
            changed.append(sum(a != b for a, b in zip(base, moved)) / len(offers))
        print(f"into {q.name}: {len(offers)} offers that could matter; redrawing half of the calibration sample "
              f"({cfg.reach_window} x {cfg.calibration_rollouts} own rollouts) {redraws} times changed the band of "
              f"{sum(changed) / len(changed):.1%} of them on average (max {max(changed):.1%})")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = cli.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs")
    runs.add_argument("runs", nargs="+", type=Path)
    ablation = sub.add_parser("ablation")
    ablation.add_argument("run", type=Path)
    ablation.add_argument("ablated", type=Path)
    ablation.add_argument("--source", default="mistral")
    ablation.add_argument("--iteration", type=int, default=1)
    calibration = sub.add_parser("calibration")
    calibration.add_argument("--seed", type=int, default=500)
    calibration.add_argument("--redraws", type=int, default=10)
    args = cli.parse_args()
    torch.set_num_threads(1)
    if args.command == "runs":
        runs_table(args.runs)
    elif args.command == "ablation":
        ablation_table(args.run, args.ablated, args.source, args.iteration)
    else:
        calibration_stability(args.seed, args.redraws)


if __name__ == "__main__":
    main()
