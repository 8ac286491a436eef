"""CCM's gradient norms over fewer parameters: what they save, and whether the admission moves (issue 29).

    python benchmarks/reach_subset.py --seed 700 --iterations 4 --subsets all last:2 last:1

For `--iterations` sampled iterations of the tiny pair (its warmed-up policies, no update; seed 700 is a curator
validation seed, never a comparison's), each receiver's offers that could matter are measured under each
parameter subset (reachability.parameter_subset), R calibrated on the iteration's own rollouts under the same
subset. Against `all`, what the curator uses: the Spearman correlation of the trajectories' CCM term, the share
of offers whose band changes (every other term kept; scales and thresholds by the window rule on all the
receiver's offers here, as term_scales.py does), and the gradient norms' time, best of --repeats. One thread.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from curator_sensitivity import bands_under, live_offers, load_pair, sampled_iteration  # noqa: E402

import reachability  # noqa: E402
from args import Args  # noqa: E402


def average_ranks(values: list[float]) -> torch.Tensor:
    """[N] the rank of each value, ties given the mean of their ranks."""
    v = torch.tensor(values, dtype=torch.float64)
    order = torch.argsort(v, stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(len(v), dtype=torch.float64)
    for value in v.unique():
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return (ra @ rb / (ra.norm() * rb.norm())).item() if ra.norm() > 0 and rb.norm() > 0 else float("nan")


def measure(args: Args, iterations: int, subsets: list[str], repeats: int) -> dict:
    """Per receiver and subset: the offers' raw terms (rows of [tbd, ccm, rsd]) and the seconds of its norms."""
    cfg = args.curator_config
    pols = load_pair(args)
    generator = torch.Generator().manual_seed(args.seed)
    rows: dict[tuple[str, str], list[tuple]] = {}
    seconds: dict[tuple[str, str], float] = {}
    for iteration in range(iterations):
        it = sampled_iteration(args, pols, iteration, generator)
        for receiver in it.experiences:
            q, offers = receiver.policy, live_offers(it, receiver)
            items = [(q.encode_prompt(it.prompts[o.prompt_index]), o.tgt.ids, o.ranges) for o in offers]
            own = reachability.own_steps(q, receiver.rollouts, it.task.step_spans, cfg.calibration_rollouts)
            for subset in subsets:
                params = reachability.parameter_subset(q.model, subset)
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    norms = reachability.step_norms(q, items, params)
                    own_norms = torch.cat(reachability.step_norms(q, own, params))
                    best = min(best, time.perf_counter() - start)
                calibration = reachability.calibrate(own_norms, cfg.reach_quantile, cfg.reach_zero_quantile)
                for o, g in zip(offers, norms):
                    o.diagnosis.reach = reachability.reachability(g, calibration)
                key = (q.name, subset)
                rows.setdefault(key, []).extend(tuple(o.diagnosis.terms(cfg).tolist()) for o in offers)
                seconds[key] = seconds.get(key, 0.0) + best
    return {"rows": rows, "seconds": seconds}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seed", type=int, default=700)
    cli.add_argument("--iterations", type=int, default=4)
    cli.add_argument("--subsets", nargs="+", default=["all", "last:2", "last:1"])
    cli.add_argument("--repeats", type=int, default=3)
    args = cli.parse_args()
    torch.set_num_threads(1)
    run = Args(seed=args.seed)
    out = measure(run, args.iterations, args.subsets, args.repeats)
    weights = run.curator_config.weights
    print(f"seed {args.seed}, {args.iterations} sampled iterations\n\n| receiver | subset | offers | norms' seconds "
          "| against all | Spearman of CCM | bands changed |\n|---|---|---|---|---|---|---|")
    for (name, subset), rows in out["rows"].items():
        reference = out["rows"][(name, "all")]
        bands, base = bands_under(rows, rows, weights), bands_under(reference, reference, weights)
        changed = sum(a != b for a, b in zip(bands, base)) / len(rows)
        time_s, all_s = out["seconds"][(name, subset)], out["seconds"][(name, "all")]
        print(f"| {name} | {subset} | {len(rows)} | {time_s:.2f} | {time_s / all_s:.2f} "
              f"| {spearman([r[1] for r in rows], [r[1] for r in reference]):.3f} | {changed:.1%} |")


if __name__ == "__main__":
    main()
