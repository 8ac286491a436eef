"""H4 (results/preregistration-matrix.md, H4; issue 42): which degradation dominates where. Per cell (pair, step
format, TBD measure) and direction source->receiver, each term's mean raw value over the direction's diagnosed
offers (fidelity_record.direction_terms), averaged over the seeds that measured it; the dominant term is the
largest, and each claim is called by the share of its directions its term dominates. A count with no test: the
reporting rule (results/reporting-rule.md, 7) reports a claim's call only where each seed alone repeats it.
analysis/blocks.py reports it with the matrix's blocks (`python eval.py --blocks results`).
"""

from __future__ import annotations

import math

from analysis import verdicts

H4_CELLS = (
    ("qwen-llama", "line", "credit", "matrix", "cross-fidelity"),
    ("qwen-llama", "line", "hidden", "matrix", "cross-fidelity-hidden"),
    *((pair, form, measure, f"matrix-h4-{pair}-{form}", name)
      for pair, form in (("qwen-qwen", "line"), ("qwen-qwen", "prose"), ("qwen-llama", "prose"))
      for measure, name in (("credit", "cross-fidelity"), ("hidden", "cross-fidelity-hidden"))),
    ("trio", "line", "credit", "matrix-h4-trio-line", "cross-fidelity"),
    ("trio", "prose", "credit", "matrix-trio-prose", "cross-fidelity"),
)
"""H4's cells: (pair, step format, TBD measure, the set its runs are in, the configuration)"""
H4_SEEDS = range(1009, 1011)
H4_CLAIMS = (("same family mainly CCM", ("qwen-qwen",), "ccm"), ("cross family mainly TBD", ("qwen-llama", "trio"),
                                                                 "tbd"))
"""the proposal's H4 in two parts: (claim, the pairs it is read on, the term it says dominates)"""


def seed_mean(values: list[float]) -> float:
    """The mean over the seeds where a term was measured (a seed with no diagnosed offer of it gives NaN)."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def dominant(terms: dict[str, float]) -> str | None:
    """The term with the largest mean raw value; a tie names every term at the top, so no single one dominates."""
    finite = {t: v for t, v in terms.items() if math.isfinite(v)}
    if not finite:
        return None
    largest = max(finite.values())
    top = [t for t, v in finite.items() if v == largest]
    return top[0] if len(top) == 1 else "tie: " + ", ".join(top)


def h4_table(sets: dict[str, list[dict]], seeds: range | tuple[int, ...]) -> list[dict]:
    """Per cell and direction, each term's mean raw value over the `seeds` that measured it, and the dominant one."""
    table = []
    for pair, form, measure, set_name, name in H4_CELLS:
        runs = [s for s in sets[set_name] if s["configuration"] == name and s["seed"] in seeds]
        for direction in sorted({d for s in runs for d in s.get("directions", {})}):
            per_seed = [s["directions"][direction]["terms"] for s in runs if direction in s.get("directions", {})]
            terms = {t: seed_mean([p[t] for p in per_seed]) for t in per_seed[0]}
            table.append({"pair": pair, "form": form, "measure": measure, "direction": direction,
                          "seeds": len(per_seed), "terms": terms, "dominant": dominant(terms)})
    return table


def h4_claims(table: list[dict]) -> list[dict]:
    """Each claim's call by the share of its directions its term dominates (results/preregistration-matrix.md)."""
    claims = []
    for claim, pairs, term in H4_CLAIMS:
        directions = [r for r in table if r["pair"] in pairs]
        share = sum(r["dominant"] == term for r in directions) / len(directions) if directions else None
        verdict = ("not run" if not directions else "supported" if share == 1 else "refuted" if share <= 0.5 else
                   "mixed")
        claims.append({"claim": claim, "directions": len(directions), "share": share, "verdict": verdict})
    return claims


def analyze(sets: dict[str, list[dict]], waiting: list[str] = ()) -> dict:
    """H4's table (cell, direction -> mean raw term over seeds) and each claim's call, once every cell ran on
    every H4 seed and no block it reads is `waiting` ("cells": each cell's seeds so far). Each claim is called
    again on each seed alone ("per_seed"), and the verdict reported is the call every seed alone repeats
    (results/reporting-rule.md, 7: a count with no test)."""
    cells = {f"{pair} {form} {measure}": sorted(s["seed"] for s in sets.get(set_name, [])
                                                if s["configuration"] == name and s["seed"] in H4_SEEDS)
             for pair, form, measure, set_name, name in H4_CELLS}
    if waiting or any(len(seeds) < len(H4_SEEDS) for seeds in cells.values()):
        verdict = f"waits for block {', '.join(waiting)}" if waiting else "incomplete"
        return {"cells": cells, "table": [], "claims": [{"claim": claim, "directions": 0, "share": None,
                                                         "verdict": verdict} for claim, _, _ in H4_CLAIMS]}
    table = h4_table(sets, H4_SEEDS)
    claims = h4_claims(table)
    alone = [h4_claims(h4_table(sets, (seed,))) for seed in H4_SEEDS]
    for i, claim in enumerate(claims):
        per_seed = {seed: calls[i]["verdict"] for seed, calls in zip(H4_SEEDS, alone)}
        repeated = claim["verdict"] if set(per_seed.values()) == {claim["verdict"]} else None
        claim.update(per_seed=per_seed, reported=verdicts.reported((claim["verdict"],), (repeated,),
                                                                   lambda parts: parts[0] or "not resolved"))
    return {"cells": cells, "table": table, "claims": claims}


def markdown(result: dict, waits: tuple[str, ...]) -> list[str]:
    """H4's section of the blocks report: its table and claims once computed, else what it waits for."""
    lines = ["## H4: mean raw term per direction (over its diagnosed offers, then seeds)\n"]
    if not result["table"]:
        lines.append(f"Not called and no term shown before every cell ran on seeds {H4_SEEDS.start}-"
                     f"{H4_SEEDS.stop - 1} and blocks {', '.join(waits)} are complete; seeds so far: "
                     + ", ".join(f"{cell} {len(s)}" for cell, s in result["cells"].items()) + ".")
    else:
        lines += ["| pair | steps | TBD measure | direction | seeds | TBD | CCM | RSD | dominant |", "|---" * 9 + "|"]
    for r in result["table"]:
        terms = " | ".join(f"{r['terms'].get(t, math.nan):.4f}" for t in ("tbd", "ccm", "rsd"))
        lines.append(f"| {r['pair']} | {r['form']} | {r['measure']} | {r['direction']} | {r['seeds']} | {terms} "
                     f"| {r['dominant']} |")
    lines.append("")
    for c in result["claims"]:
        alone = ", ".join(f"seed {seed} {v}" for seed, v in c.get("per_seed", {}).items())
        lines.append(f"- {c['claim']}: {c['reported']} ({c['share']:.0%} of {c['directions']} directions; each seed "
                     f"alone: {alone})" if c["directions"] else f"- {c['claim']}: {c['verdict']}")
    return lines
