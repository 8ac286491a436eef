"""How the curator's admission depends on its diagnosis, from runs' fidelity.jsonl and on one iteration's offers.

    python -m benchmarks.curator_sensitivity runs RUN [RUN ...]         # per term: moved, saturated; band shares
    python -m benchmarks.curator_sensitivity ablation RUN RUN_ABLATED --source mistral --iteration 1
    python -m benchmarks.curator_sensitivity window RUN                # redraw half of the terms' calibration sample
    python -m benchmarks.curator_sensitivity reach --seed 700           # redraw half of R's calibration sample
    python -m benchmarks.curator_sensitivity levels RUN                # --thresholds adaptive: the levels played
    python -m benchmarks.curator_sensitivity ties RUN                  # where a shared D met a threshold

`runs`: for each run and source -> receiver, every weighted term's `moved` (the share of diagnosed offers whose band
differs between the term at its 10th and at its 90th percentile, the others kept) and `saturated` (the share whose
term could not get worse), and the bands of D per direction (no collapse: at least two bands hold 10% or more).
`ablation`: the same offers (one seed, one iteration: the rollouts precede any decision) in two runs, the share that
landed in different bands. `window`: for every receiver and every 5th iteration t of a run with fixed thresholds
(from t = 2W, W = its --calibration-window), the band of each of t's diagnosed offers under the calibration sample
the run used (the offers of iterations t-W+1..t) and under that sample with a random half replaced, either by
offers of iterations t-2W+1..t-W (earlier draws: drift included) or by a resample of the sample itself (the
bootstrap: the same distribution); the share of offers whose band changes. `reach`: the tiny pair's first
iteration; R is calibrated on a window of own rollouts as in training, half of which is redrawn (fresh rollouts
of the same prompts) ten times; the terms' scales and thresholds are then those of the iteration's offers under
each R, as in a run's first iteration; the share of offers whose band changes. `levels`: in a run with
--thresholds adaptive, the level each direction played at each iteration, (theta1 - the level-0 theta1 of the
receiver's calibration sample, rebuilt from the record) / step; its last, highest and mean level. `ties`: in a run
with fixed thresholds, per receiver, the iterations where a threshold fell on a D that several offers of the
calibration sample share (term_scales.uncut moved it), and the diagnosed offers whose band that moved: the logged
band against the band under the sample's plain quantiles, the rule before 14005f3.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Callable, NamedTuple

import torch

import admission
import coevolution
import curator
import diagnosis
import fidelity_record
import grad_norms
import grpo
import reachability
import reward_drift
import sharing
import term_scales
import train
from args import Args
from testbed import policies
from testbed import tasks


def read(run: Path) -> tuple[list[dict], dict]:
    return fidelity_record.read_records(run), json.loads((run / "config.json").read_text())


def runs_table(runs: list[Path]) -> None:
    print("| run | source -> receiver | term | offers | moved | saturated |\n|---|---|---|---|---|---|")
    shares = []
    for run in runs:
        records, config = read(run)
        for pair in sorted({(r["source"], r["receiver"]) for r in records}):
            mine = [r for r in records if (r["source"], r["receiver"]) == pair]
            for term, s in fidelity_record.sensitivity(mine, fidelity_record.run_weights(config)).items():
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


def bands_under(sample: list[tuple], rows: list[tuple], weights: torch.Tensor) -> list[int]:
    """The bands of `rows` (raw terms) under the scales and thirds thresholds of a calibration sample."""
    calibration = term_scales.Calibration(tuple(sample))
    theta = calibration.thresholds(weights)
    return [term_scales.admission_band(curator.degradation(calibration.scaled(torch.tensor(r, dtype=torch.float64)),
                                                           weights), *theta) for r in rows]


def window_rows(run: Path, thresholds: str) -> tuple[list[dict], int, torch.Tensor, dict[tuple[str, int], list]]:
    """A run's records, its calibration window, its weights [3] and each (receiver, iteration)'s diagnosed terms;
    refused unless the run's thresholds came from its window (and are `thresholds`: fixed or adaptive)."""
    records, config = read(run)
    if (config.get("thresholds"), config.get("theta1"), config.get("calibration")) != (thresholds, None, "window"):
        raise SystemExit(f"{run}: needs a run with --calibration window, --thresholds {thresholds} and no --theta1")
    weights = torch.tensor(list(fidelity_record.run_weights(config).values()), dtype=torch.float64)
    rows: dict[tuple[str, int], list[tuple]] = {}
    for r in records:
        if "terms" in r:
            rows.setdefault((r["receiver"], r["iteration"]), []).append(
                tuple(math.nan if v is None else v for v in (r["terms"][t] for t in term_scales.TERMS)))
    return records, config["calibration_window"], weights, rows


def window_sample(rows: dict[tuple[str, int], list[tuple]], receiver: str, t: int, width: int, back: int = 0
                  ) -> list[tuple]:
    """The receiver's calibration sample at iteration t as the curator held it (back = 1: the window before that
    one): the diagnosed terms of the last `width` iterations up to t that diagnosed any, for an iteration that
    diagnosed none left the window as it was (Curator.calibrate)."""
    held = sorted(i for n, i in rows if n == receiver and i <= t)
    end = max(len(held) - back * width, 0)
    return [row for i in held[max(end - width, 0):end] for row in rows[(receiver, i)]]


def window_stability(run: Path, every: int = 5, seed: int = 0) -> None:
    records, width, weights, rows = window_rows(run, "fixed")
    rng = random.Random(seed)
    last = max(i for _, i in rows)
    for receiver in sorted({n for n, _ in rows}):
        logged_ok, changed = [], {"earlier": [], "bootstrap": []}
        for t in range(2 * width, last + 1, every):
            sample, earlier = (window_sample(rows, receiver, t, width, back) for back in (0, 1))
            current = rows.get((receiver, t), [])
            if not current or len(sample) < 4 or not earlier:
                continue
            base = bands_under(sample, current, weights)
            logged = [r["band"] for r in records if r["receiver"] == receiver and r["iteration"] == t and "band" in r]
            logged_ok.append(base == logged)
            kept = rng.sample(sample, len(sample) // 2)
            for kind, pool in (("earlier", earlier), ("bootstrap", sample)):
                fresh = [rng.choice(pool) for _ in range(len(sample) - len(kept))]
                moved = bands_under(kept + fresh, current, weights)
                changed[kind].append(sum(a != b for a, b in zip(base, moved)) / len(current))
        print(f"into {receiver}: {len(logged_ok)} iterations (every {every}th from {2 * width}); the bands recomputed "
              f"from the record match the logged ones at {sum(logged_ok)} of them; redrawing half of the sample "
              + "; ".join(f"from {kind} changed the band of {sum(v) / len(v):.1%} of the iteration's offers on "
                          f"average (max {max(v):.1%})" for kind, v in changed.items() if v))


def levels_table(run: Path, step: float = coevolution.BanditConfig.step) -> dict[tuple[str, str], list[int]]:
    """Per source -> receiver, the level played at each iteration where it diagnosed an offer."""
    records, width, weights, rows = window_rows(run, "adaptive")
    scored: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        if "band" in r:
            scored.setdefault((r["receiver"], r["iteration"]), []).append(r)
    played: dict[tuple[str, str], dict[int, int]] = {}
    for (receiver, t) in sorted(rows):
        base = term_scales.Calibration(tuple(window_sample(rows, receiver, t, width))).thresholds(weights)[0]
        for r in scored.get((receiver, t), []):
            played.setdefault((r["source"], receiver), {})[t] = round((r["theta"][0] - base) / step)
    print("| source -> receiver | iterations | level at the last | highest | mean | iterations at level 0 |\n"
          "|---|---|---|---|---|---|")
    out = {}
    for pair, by_iteration in played.items():
        levels = [by_iteration[t] for t in sorted(by_iteration)]
        out[pair] = levels
        print(f"| {pair[0]} -> {pair[1]} | {len(levels)} | {levels[-1]} (iteration {max(by_iteration)}) "
              f"| {max(levels)} | {sum(levels) / len(levels):.2f} | {sum(v == 0 for v in levels) / len(levels):.0%} |")
    return out


def tie_table(run: Path) -> dict[str, list[int]]:
    """Per receiver: [iterations, those with a threshold moved off a shared D, diagnosed offers, offers whose band
    the move changed] (the module docstring's `ties`)."""
    records, width, weights, rows = window_rows(run, "fixed")
    out: dict[str, list[int]] = {}
    for receiver, t in sorted(rows):
        sample = term_scales.Calibration(tuple(window_sample(rows, receiver, t, width)))
        d = sample.degradations(weights)
        plain = torch.quantile(torch.tensor(d, dtype=torch.float64), torch.tensor(
            [term_scales.EQUAL_SHARES[0], sum(term_scales.EQUAL_SHARES)], dtype=torch.float64)).tolist()
        theta = term_scales.share_thresholds(d)
        mine = [r for r in records if r["receiver"] == receiver and r["iteration"] == t and "D" in r]
        counts = out.setdefault(receiver, [0, 0, 0, 0])
        counts[0] += 1
        counts[1] += tuple(plain) != theta
        counts[2] += len(mine)
        counts[3] += sum(term_scales.admission_band(r["D"], *plain) != r["band"] for r in mine)
    print("| receiver | iterations | a threshold on a shared D | diagnosed offers | band moved by it |\n"
          "|---|---|---|---|---|")
    for receiver, (its, tied, offers, moved) in out.items():
        print(f"| {receiver} | {its} | {tied} | {offers} | {moved} ({moved / max(offers, 1):.1%}) |")
    return out


class Iteration(NamedTuple):
    """One iteration of the untrained-by-RL pair (no update): its prompts, each policy's experience, and sample(),
    which draws a policy's fresh rollouts of the same prompts."""
    task: tasks.Task
    problems: list
    prompts: list[str]
    experiences: list[sharing.Experience]
    stats: dict[str, reward_drift.StepStats]
    sample: Callable


def sampled_iteration(args: Args, pols: list, iteration: int, generator: torch.Generator) -> Iteration:
    task = tasks.load_task("arith", args.seed, args.train_size, 0, args.task_config)
    problems = train.prompt_sampler(args.seed, iteration).sample(task.train, args.prompts_per_iteration)
    prompts = [task.prompt(q) for q in problems]

    def sample(p):
        return p.rollout(prompts, args.group_size, args.max_new_tokens, args.temperature, generator=generator)
    experiences = []
    for p in pols:
        out = sample(p)
        rewards = tasks.group_rewards(task, problems, out.texts, args.group_size)
        experiences.append(sharing.Experience(p, prompts, out, rewards, grpo.group_advantages(rewards)))
    stats = {e.policy.name: reward_drift.StepStats(args.curator_config.step_window) for e in experiences}
    for e in experiences:
        stats[e.policy.name].add_iteration([s for i, text in enumerate(e.rollouts.texts) for s in
                                            reward_drift.process_rewards(task, problems[i // args.group_size], text)])
    return Iteration(task, problems, prompts, experiences, stats, sample)


def live_offers(it: Iteration, receiver: sharing.Experience) -> list:
    """The receiver's offers from every peer that could matter (not inert)."""
    offers = [o for peer in it.experiences if peer is not receiver for i in range(len(peer.rollouts.texts))
              if (o := diagnosis.make_offer(peer, i, receiver.policy, it.task,
                                            it.problems[i // peer.rollouts.group_size], it.stats))]
    inert = admission.inert_prompts([e.rewards for e in it.experiences])                       # [B]
    return [o for o in offers if not inert[o.prompt_index]]


def load_pair(args: Args) -> list:
    return policies.load_policies(args.pair, "tiny", torch.device("cpu"), args.task_config, args.seed,
                                  args.cache_dir, warmup_scale=args.warmup_scale)


def redraw_changes(bands: Callable[[list[torch.Tensor]], list[int]], pool: list[torch.Tensor], redraws: int,
                   rng: random.Random) -> list[float]:
    """Per redraw, the share of offers whose band moved when half of the calibration window (the first half of
    `pool`, 2W samples) was swapped for fresh samples from its second half."""
    window = len(pool) // 2
    base = bands(pool[:window])
    changed = []
    for _ in range(redraws):
        kept = rng.sample(range(window), window // 2)
        fresh = rng.sample(range(window, 2 * window), window - len(kept))
        moved = bands([pool[i] for i in kept + fresh])
        changed.append(sum(a != b for a, b in zip(base, moved)) / len(base))
    return changed


def reach_stability(args: Args, redraws: int) -> dict[str, float]:
    """Per receiver offered anything that could matter, the mean share of its offers whose band a redraw changed
    (printed with the max)."""
    cfg, seed = args.curator_config, args.seed
    it = sampled_iteration(args, load_pair(args), 0, torch.Generator().manual_seed(seed))
    task, prompts, experiences, sample = it.task, it.prompts, it.experiences, it.sample
    rng, out = random.Random(seed), {}
    for receiver in experiences:
        q = receiver.policy
        params, modules = grad_norms.ccm_scope(q.model, cfg.ccm_estimate)
        offers = live_offers(it, receiver)
        if not offers:
            print(f"into {q.name}: no offer that could matter, nothing to redraw")
            continue
        norms = reachability.step_norms(q, [(q.encode_prompt(prompts[o.prompt_index]), o.receiver_encoding.ids,
                                             o.ranges) for o in offers], params, modules)
        pool = [torch.cat(reachability.step_norms(q, reachability.own_steps(
            q, r, task.step_spans, cfg.calibration_rollouts), params, modules))
            for r in [receiver.rollouts] + [sample(q) for _ in range(2 * cfg.reach_window - 1)]]

        def bands(window: list[torch.Tensor]) -> list[int]:
            calibration = reachability.calibrate(torch.cat(window), cfg.reach_quantile, cfg.reach_zero_quantile)
            terms = [tuple(replace(o.diagnosis, reach=reachability.reachability(g_k, calibration)).terms(cfg).tolist())
                     for o, g_k in zip(offers, norms)]
            return bands_under(terms, terms, cfg.weights)
        changed = redraw_changes(bands, pool, redraws, rng)
        print(f"into {q.name}: {len(offers)} offers that could matter; redrawing half of the calibration sample "
              f"({cfg.reach_window} x {cfg.calibration_rollouts} own rollouts) {redraws} times changed the band of "
              f"{sum(changed) / len(changed):.1%} of them on average (max {max(changed):.1%})")
        out[q.name] = sum(changed) / len(changed)
    return out


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
    window = sub.add_parser("window")
    window.add_argument("run", type=Path)
    levels = sub.add_parser("levels")
    levels.add_argument("run", type=Path)
    ties = sub.add_parser("ties")
    ties.add_argument("run", type=Path)
    reach = sub.add_parser("reach")
    reach.add_argument("--seed", type=int, default=700)
    reach.add_argument("--redraws", type=int, default=10)
    reach.add_argument("--ccm-estimate", default="exact",
                       help="whose bands the redraws move (docs/results.md's figures: exact, the estimate of 9e14505)")
    args = cli.parse_args()
    torch.set_num_threads(1)
    if args.command == "runs":
        runs_table(args.runs)
    elif args.command == "ablation":
        ablation_table(args.run, args.ablated, args.source, args.iteration)
    elif args.command == "window":
        window_stability(args.run)
    elif args.command == "levels":
        levels_table(args.run)
    elif args.command == "ties":
        tie_table(args.run)
    else:
        reach_stability(Args(seed=args.seed, ccm_estimate=args.ccm_estimate), args.redraws)


if __name__ == "__main__":
    main()
