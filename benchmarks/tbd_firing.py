"""How often each TBD measure is non-zero, per pair and step format (issue #23: a TBD that could come out
either way), and one trajectory where the credit measure fires.

    python -m benchmarks.tbd_firing [--pairs qwen-llama qwen-qwen trio] [--formats line inline prose]
                                    [--warmup-scale 0.3] [--prompts 16] [--seed 1]

For each pair and format: the tiny policies warmed up on reference solutions written in that format (a shortened
warm-up by default: enough for them to write the format, not to solve the task well), one iteration's rollouts
(--prompts prompts x 8 at temperature 0.7) from every policy, and every rollout offered to every other policy.
Each offer's TBD term (the mean over its steps, boundary_drift.py) is computed by the three measures: credit,
hidden (one map per source -> receiver pair, fitted on that iteration's offers, as in training) and jaccard. The
hidden measure is positive on every trajectory by construction (its zero point is the median 1:1 group), so its
mean, not how often it is non-zero, is what compares.
Writes results/tbd-firing.json and .md (--out: another stem).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import boundary_drift
import diagnosis
import grpo
import reward_drift
import sharing
from testbed import arith
from testbed import policies
from testbed import tasks

ROOT = Path(__file__).resolve().parent.parent


def offers_by_measure(experiences: list[sharing.Experience], task: tasks.Task, problems: list
                      ) -> dict[tuple[str, str], list[dict]]:
    """Per (source, receiver): each offer's TBD term by every measure, and its text and hotspots."""
    stats = {e.policy.name: reward_drift.StepStats(diagnosis.CuratorConfig.step_window) for e in experiences}
    experiences = [sharing.with_hidden_states(e) for e in experiences]
    out = {}
    for receiver in experiences:
        offers = []
        for peer in (e for e in experiences if e is not receiver):
            for i in range(len(peer.rollouts.completion_ids)):
                offer = diagnosis.make_offer(peer, i, receiver.policy, task, problems[i // peer.rollouts.group_size],
                                             stats)
                if offer is not None:
                    offers.append(offer)
        rows = [{"credit": diagnosis.mean_or_zero(o.diagnosis.tbd), "jaccard": o.jaccard,
                 "hotspots": boundary_drift.boundary_hotspots(o.source_encoding, o.receiver_encoding, o.steps),
                 "text": o.source_encoding.data.decode("utf-8", errors="replace")} for o in offers]
        offers = diagnosis.with_hidden_tbd(offers, receiver)
        for row, o in zip(rows, offers):
            row["hidden"] = diagnosis.mean_or_zero(o.diagnosis.tbd)
            out.setdefault((o.source.policy.name, receiver.policy.name), []).append(row)
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pairs", nargs="+", default=["qwen-llama", "qwen-qwen", "trio"])
    cli.add_argument("--formats", nargs="+", default=list(arith.STEP_FORMATS))
    cli.add_argument("--warmup-scale", type=float, default=0.3)
    cli.add_argument("--prompts", type=int, default=16)
    cli.add_argument("--seed", type=int, default=1)
    cli.add_argument("--out", type=Path, default=ROOT / "results" / "tbd-firing", help="the files' stem")
    args = cli.parse_args()
    results, example = [], None
    for step_format in args.formats:
        cfg = arith.TaskConfig(step_format=step_format)
        task = tasks.load_task("arith", args.seed, 1000, 0, cfg)
        problems = task.train[:args.prompts]
        prompts = [task.prompt(q) for q in problems]
        for pair in args.pairs:
            pols = policies.load_policies(pair, "tiny", torch.device("cpu"), cfg, args.seed,
                                          warmup_scale=args.warmup_scale)
            torch.manual_seed(args.seed)
            experiences = []
            for p in pols:
                out = p.rollout(prompts, 8, 40, temperature=0.7)
                rewards = tasks.group_rewards(task, problems, out.texts, 8)                            # [B, G]
                experiences.append(sharing.Experience(p, prompts, out, rewards, grpo.group_advantages(rewards)))
            for (source, receiver), rows in offers_by_measure(experiences, task, problems).items():
                results.append({"format": step_format, "pair": pair, "source": source, "receiver": receiver,
                                "offers": len(rows),
                                **{f"{m}_nonzero": sum(r[m] > 0 for r in rows) / len(rows)
                                   for m in boundary_drift.MEASURES},
                                **{f"{m}_mean": sum(r[m] for r in rows) / len(rows) for m in boundary_drift.MEASURES}})
                straddled = [r for r in rows if r["hotspots"]]   # rather than one with bytes the receiver lacks
                if straddled and example is None:
                    example = {"format": step_format, "source": source, "receiver": receiver, **straddled[0]}
                print(results[-1], flush=True)
    lines = ["| format | source -> receiver | offers | credit non-zero (mean) | hidden non-zero (mean) "
             "| jaccard non-zero (mean) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['format']} | {r['source']} -> {r['receiver']} | {r['offers']} | "
              + " | ".join(f"{r[f'{m}_nonzero']:.0%} ({r[f'{m}_mean']:.3f})" for m in boundary_drift.MEASURES) + " |"
              for r in results]
    if example:
        lines += ["", f"A trajectory where a step boundary is straddled ({example['format']}, {example['source']} -> "
                  f"{example['receiver']}, TBD credit {example['credit']:.3f}, hidden {example['hidden']:.3f}, "
                  f"jaccard {example['jaccard']:.3f}; step boundaries straddled on one side only: "
                  f"{example['hotspots']}):", "", "    " + repr(example["text"])]
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    measured = {k: v for k, v in vars(args).items() if k != "out"}
    out.with_suffix(".json").write_text(json.dumps({"args": measured, "rows": results, "example": example}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
