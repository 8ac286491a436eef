"""CCM's cheaper estimates against the exact one, on real offers: agreement and cost (issue 41).

    python -m benchmarks.reach_estimate --seeds 2001 2002 --iterations 4 --estimates exact last:0 last:1 last:2
    python -m benchmarks.reach_estimate --seeds 2001 -- --warmup-scale 0.1 --cache-dir DIR   # train.py flags after --

For `--iterations` sampled iterations of the tiny pair per seed (its warmed-up policies, no update; seeds from
2001 are used by no comparison), each receiver's offers that could matter are measured under each CCM estimate
(grad_norms.ccm_scope), R calibrated on the iteration's own rollouts under the same estimate, as the curator
does. Against `exact`: the Spearman correlation of the steps' R_k and of the trajectories' CCM term, the share of
offers whose band differs (every other term kept; scales and thresholds by the window rule on all the receiver's
offers here, as term_scales.py does), the gradient norms' seconds (best of --repeats, one thread) and their
floating-point operations (FlopCounterMode, CPU attention counted by its products as in flop_rate.py).

The rule that chooses the default cheap estimate, written before any agreement was measured: among the cheaper
estimates, the one with the fewest norm seconds whose bands agree with the exact estimate's on at least 85% of
the diagnosed offers of every receiver, pooled over the seeds; if none does, the one with the highest such
agreement, and the 85% criterion is reported as missed.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import grad_norms
import reachability
from analysis.premise_stats import spearman
from args import Args, script_args
from benchmarks.curator_sensitivity import bands_under, live_offers, load_pair, sampled_iteration
from benchmarks.flop_rate import ATTENTION

AGREEMENT = 0.85
"""the share of diagnosed offers whose band a cheap estimate must keep, for every receiver (the choice rule)"""


def measure(args: Args, iterations: int, estimates: list[str], repeats: int) -> dict:
    """Per (receiver, estimate): the offers' raw terms (rows of [tbd, ccm, rsd]), their steps' R_k, and the
    seconds and FLOP of its norms, over `iterations` sampled iterations of seed args.seed."""
    cfg = args.curator_config
    pols = load_pair(args)
    generator = torch.Generator().manual_seed(args.seed)
    out = {"rows": {}, "reach": {}, "seconds": {}, "flops": {}}
    for iteration in range(iterations):
        it = sampled_iteration(args, pols, iteration, generator)
        for receiver in it.experiences:
            q, offers = receiver.policy, live_offers(it, receiver)
            items = [(q.encode_prompt(it.prompts[o.prompt_index]), o.receiver_encoding.ids, o.ranges) for o in offers]
            own = reachability.own_steps(q, receiver.rollouts, it.task.step_spans, cfg.calibration_rollouts)
            for estimate in estimates:
                params, modules = grad_norms.ccm_scope(q.model, estimate)

                def norms_of_both():
                    return (reachability.step_norms(q, items, params, modules),
                            torch.cat(reachability.step_norms(q, own, params, modules)))
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    norms, own_norms = norms_of_both()
                    best = min(best, time.perf_counter() - start)
                counter = FlopCounterMode(display=False, custom_mapping=ATTENTION)
                with counter:
                    norms_of_both()
                calibration = reachability.calibrate(own_norms, cfg.reach_quantile, cfg.reach_zero_quantile)
                diagnoses = [replace(o.diagnosis, reach=reachability.reachability(g, calibration))
                             for o, g in zip(offers, norms)]
                key = (q.name, estimate)
                out["rows"].setdefault(key, []).extend(tuple(d.terms(cfg).tolist()) for d in diagnoses)
                out["reach"].setdefault(key, []).extend(r for d in diagnoses for r in d.reach.tolist())
                out["seconds"][key] = out["seconds"].get(key, 0.0) + best
                out["flops"][key] = out["flops"].get(key, 0.0) + counter.get_total_flops()
    return out


def agreement(measured: list[dict], weights: torch.Tensor) -> dict[tuple[str, str], dict]:
    """Per (receiver, estimate), pooled over the seeds' measurements: offers, seconds, GFLOP, Spearman of R_k and
    of the CCM term against exact, and the share of offers in the exact estimate's band. Bands are taken per seed
    (each seed's own calibration sample), as a run would."""
    table: dict[tuple[str, str], dict] = {}
    for out in measured:
        for (name, estimate), rows in out["rows"].items():
            if not rows:   # no offer of this seed could matter to the receiver: nothing to compare
                continue
            reference = out["rows"][(name, "exact")]
            same = sum(a == b for a, b in zip(bands_under(rows, rows, weights),
                                              bands_under(reference, reference, weights)))
            entry = table.setdefault((name, estimate), {"offers": 0, "same_band": 0, "seconds": 0.0, "gflop": 0.0,
                                                        "reach": [], "reach_exact": [], "ccm": [], "ccm_exact": []})
            entry["offers"] += len(rows)
            entry["same_band"] += same
            entry["seconds"] += out["seconds"][(name, estimate)]
            entry["gflop"] += out["flops"][(name, estimate)] / 1e9
            entry["reach"] += out["reach"][(name, estimate)]
            entry["reach_exact"] += out["reach"][(name, "exact")]
            entry["ccm"] += [r[1] for r in rows]
            entry["ccm_exact"] += [r[1] for r in reference]
    unmeasured = sorted({name for out in measured for name, _ in out["rows"]} - {name for name, _ in table})
    if unmeasured:
        raise ValueError(f"no offer could matter to {', '.join(unmeasured)} in any sampled iteration: sample more "
                         "(--iterations, --seeds) or warm the policies up further (-- --warmup-scale)")
    return {key: {"offers": e["offers"], "seconds": e["seconds"], "gflop": e["gflop"],
                  "spearman_reach": spearman(e["reach"], e["reach_exact"]),
                  "spearman_ccm": spearman(e["ccm"], e["ccm_exact"]),
                  "band_agreement": e["same_band"] / e["offers"]} for key, e in table.items()}


def choose(table: dict[tuple[str, str], dict]) -> tuple[str, bool]:
    """The module docstring's rule: (the chosen cheap estimate, whether it meets the agreement criterion)."""
    cheap = sorted({estimate for _, estimate in table} - {"exact"})
    if not cheap:
        raise ValueError("no cheaper estimate was measured beside 'exact'")
    worst = {e: min(v["band_agreement"] for (_, est), v in table.items() if est == e) for e in cheap}
    seconds = {e: sum(v["seconds"] for (_, est), v in table.items() if est == e) for e in cheap}
    passing = [e for e in cheap if worst[e] >= AGREEMENT]
    if passing:
        return min(passing, key=seconds.__getitem__), True
    return max(cheap, key=worst.__getitem__), False


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seeds", type=int, nargs="+", default=[2001, 2002])
    cli.add_argument("--iterations", type=int, default=4)
    cli.add_argument("--estimates", nargs="+", default=["exact", "last:0", "last:1", "last:2"])
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    cli.add_argument("flags", nargs="*", help="train.py flags after --, the pair's settings (default: a run's)")
    args = cli.parse_args()
    if "exact" not in args.estimates:
        raise SystemExit("--estimates must include 'exact', the reference")
    torch.set_num_threads(1)
    runs = [script_args("reach_estimate.py", args.flags, seed=seed) for seed in args.seeds]
    measured = [measure(run, args.iterations, args.estimates, args.repeats) for run in runs]
    table = agreement(measured, runs[0].curator_config.weights)
    print(f"seeds {args.seeds}, {args.iterations} sampled iterations each\n\n| receiver | estimate | offers "
          "| norms' seconds | against exact | GFLOP | Spearman of R_k | Spearman of CCM | same band |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for (name, estimate), v in table.items():
        exact = table[(name, "exact")]
        print(f"| {name} | {estimate} | {v['offers']} | {v['seconds']:.2f} | {v['seconds'] / exact['seconds']:.2f} "
              f"| {v['gflop']:.1f} | {v['spearman_reach']:.3f} | {v['spearman_ccm']:.3f} | {v['band_agreement']:.1%} |")
    chosen, meets = choose(table)
    print(f"\nchosen by the rule: {chosen} ({'meets' if meets else 'MISSES'} the {AGREEMENT:.0%} band agreement "
          "for every receiver)")
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "iterations": args.iterations, "chosen": chosen,
                                         "meets_agreement": meets,
                                         "table": [{"receiver": n, "estimate": e, **v} for (n, e), v in table.items()]},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
