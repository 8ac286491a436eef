"""What issue 67's audit read in the premise's measure and rows, computed from the gate's file and the rows alone:
descriptions, never calls, so that a claim about U can cite them; no registered number or call (P1-P3) depends on
them.

- The gate (gate-sSEED.json, its last try): rho(U, lookahead) per receiver, as amendment 1 of the registration
  promised, beside the registered pooled rho; rho(-|U|, lookahead), high where the lookahead measures how big a step
  is more than which way it goes; rho(U, lookahead) among the offers with U > 0 alone; how many lookaheads lower
  held-out reward at the chosen lr, and how far (in standard errors) the chosen rung's top-decile update moved it.
  Their intervals are percentile bootstraps over offers: the gate is one iteration of one run, so they describe
  these offers, not what another run would give.
- The rows: exact duplicate offers, the distinct offers left per direction, and a direction's independent units
  (its seeds: a seed's three stages are one resumed run).
- TBD: the share of a direction's offers at its modal raw value, where the other offers come from, and rho(TBD, U)
  with the iteration-10 stages left out (bootstrap over the remaining clusters) beside the registered rho.
- P4's reward: whether it is 1 exactly where the advantage is positive, and which rho(reward, U) intervals hold 0."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable

import numpy as np

from analysis import premise_stats as stats

EARLY = 10
"""the stage whose clusters the TBD reading leaves out (the registration's first, iteration 10)"""


def offer_rho(x, y, rng: random.Random) -> dict:
    """Spearman rho(x, y) with its 95% percentile bootstrap interval over offers, each offer its own unit (exact
    where the offers are few, premise_stats.resample_counts)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    result, = stats.clustered([[i] for i in range(len(x))], lambda i: stats.spearman_columns(x[i, None], y[i]), rng)
    return result


def gate_readings(gate: dict, rng: random.Random) -> dict:
    """The readings of a gate's file, from its last try (the one its verdict is of): per-receiver and pooled
    rho(U, lookahead), rho(-|U|, lookahead), rho(U, lookahead) where U > 0, the lookaheads' signs, and the chosen
    rung's top-decile move over its standard error."""
    last = gate["tries"][-1]
    u, lookahead, receivers = np.array(last["U"]), np.array(last["lookahead"]), np.array(gate["receivers"])
    positive = u > 0
    rung = last["ladder"][str(last["lr"])]
    return {"lr": last["lr"], "offers": len(u), "pooled": last["rank"],
            "per_receiver": {name: {"offers": int((receivers == name).sum()),
                                    **offer_rho(u[receivers == name], lookahead[receivers == name], rng)}
                             for name in sorted(set(receivers))},
            "minus_abs_U": offer_rho(-np.abs(u), lookahead, rng),
            "U_positive": {"offers": int(positive.sum()), **offer_rho(u[positive], lookahead[positive], rng)},
            "lowered": int((lookahead < 0).sum()), "unchanged": int((lookahead == 0).sum()),
            "raised": int((lookahead > 0).sum()), "top_decile_in_se": rung["mean"] / rung["se"]}


def duplicates(rows: list[dict]) -> dict:
    """A direction's offers, the distinct ones, its duplicates and its independent units (seeds). A duplicate is a
    row beyond the first of a set equal in every recorded field (direction, seed, stage, D, the terms, both halves
    of U, U repaired, every signal, reward, advantage, band): the rows hold no completion text, so agreement in
    every float stands in for identical tokens."""
    distinct = len({json.dumps(r, sort_keys=True) for r in rows})
    return {"offers": len(rows), "distinct": distinct, "duplicates": len(rows) - distinct,
            "seeds": len({r["seed"] for r in rows}), "clusters": len({(r["seed"], r["stage"]) for r in rows})}


def modal(values: list[float]) -> tuple[float, int]:
    """The most frequent value (the first seen among equally frequent ones) and how often it occurs."""
    return Counter(values).most_common(1)[0]


def clustered_rho(x: np.ndarray, u: np.ndarray, rows: list[dict], rng: random.Random) -> dict:
    """rho(x, u) over the rows, with its 95% bootstrap interval over their clusters (seed, stage)."""
    clusters: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        clusters.setdefault((r["seed"], r["stage"]), []).append(i)
    result, = stats.clustered([clusters[k] for k in sorted(clusters)],
                              lambda i: stats.spearman_columns(x[i, None], u[i]), rng)
    return {**result, "clusters": len(clusters), "offers": len(rows)}


def tbd_readings(rows: list[dict], u: list[float], registered_rho: dict, rng: random.Random) -> dict:
    """A direction's TBD (its rows, their U): the modal raw value and the share of offers at it; the offers off it,
    how many come from iteration EARLY and how many have reward 0; rho(TBD, U) without iteration EARLY beside the
    registered rho over every stage."""
    tbd = np.array([r["terms"]["tbd"] for r in rows], dtype=float)
    mode, count = modal(list(tbd))
    off = [r for r, t in zip(rows, tbd) if t != mode]
    later = np.array([r["stage"] != EARLY for r in rows])
    return {"mode": float(mode), "at_mode": count, "share_at_mode": count / len(rows), "off_mode": len(off),
            "off_mode_early": sum(r["stage"] == EARLY for r in off),
            "off_mode_unrewarded": sum(r["reward"] == 0 for r in off), "rho_registered": registered_rho,
            "rho_without_early": clustered_rho(tbd[later], np.asarray(u, dtype=float)[later],
                                               [r for r, keep in zip(rows, later) if keep], rng)}


def reward_is_positive_advantage(rows: list[dict]) -> bool:
    """Whether every row's reward is 1 exactly where its advantage is positive (and not 1 elsewhere)."""
    return all((r["reward"] == 1) == (r["advantage"] > 0) for r in rows)


def holds_zero(result: dict) -> bool:
    return bool(result["low"] <= 0 <= result["high"])


def readings(rows: list[dict], numbers: dict[str, dict], gates: dict[str, dict], u_of: Callable[[dict], float],
             rng: random.Random) -> dict:
    """Every reading: of each gate file (by name), and per direction of the rows (numbers: the report's per-direction
    numbers, whose registered rho(TBD, U) and rho(reward, U) they set beside; u_of: a row's U)."""
    mine = {d: [r for r in rows if r["direction"] == d] for d in sorted(numbers)}
    return {"gate": {name: gate_readings(g, rng) for name, g in sorted(gates.items())},
            "duplicates": {d: duplicates(m) for d, m in mine.items()},
            "tbd": {d: tbd_readings(m, [u_of(r) for r in m], numbers[d]["rho"]["tbd"], rng)
                    for d, m in mine.items() if "tbd" in numbers[d]["terms_present"]},
            "reward": {d: {"is_positive_advantage": reward_is_positive_advantage(m), "rho": numbers[d]["rho"]["reward"],
                           "holds_zero": holds_zero(numbers[d]["rho"]["reward"])} for d, m in mine.items()}}


# ---------------------------------------------------------------------------------------------------------------
# report.md's section
# ---------------------------------------------------------------------------------------------------------------

def interval(r: dict) -> str:
    return f"{r['value']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]"


def gate_lines(name: str, g: dict) -> list[str]:
    """A gate file's readings: a table of rhos, then the lookaheads' signs."""
    rows = [("pooled (the registered gate)", g["offers"], g["pooled"]),
            *((f"receiver {n}", r["offers"], r) for n, r in g["per_receiver"].items()),
            ("rho(-|U|, lookahead), all offers", g["offers"], g["minus_abs_U"]),
            ("offers with U > 0 only", g["U_positive"]["offers"], g["U_positive"])]
    return [f"### The gate ({name}), at its chosen lr {g['lr']}", "",
            "| offers | n | rho(U, lookahead) [95% CI] |", "|---|---|---|",
            *(f"| {label} | {n} | {interval(r)} |" for label, n, r in rows), "",
            f"{g['lowered']} of {g['offers']} single-offer lookaheads ({g['lowered'] / g['offers']:.0%}) lower "
            f"held-out reward at lr {g['lr']} ({g['raised']} raise it; unchanged: {g['unchanged']}); the top-decile "
            f"update that chose the lr moved it {g['top_decile_in_se']:+.1f} standard errors. Intervals: the pooled "
            f"one is the registered gate's; the others a percentile bootstrap over offers ({stats.RESAMPLES:,} random "
            "resamples; all of them where the offers are 9 or fewer), a description of this one iteration's offers, "
            "not of what another run would give.", ""]


def duplicate_lines(counts: dict[str, dict]) -> list[str]:
    """The duplicate offers and independent units per direction, with the totals."""
    offers, copies = sum(c["offers"] for c in counts.values()), sum(c["duplicates"] for c in counts.values())
    return ["### Duplicate offers and independent units", "",
            "| direction | offers | duplicates | distinct (effective n) | clusters | independent units (seeds) |",
            "|---|---|---|---|---|---|",
            *(f"| {d} | {c['offers']} | {c['duplicates']} ({c['duplicates'] / c['offers']:.0%}) | {c['distinct']} | "
              f"{c['clusters']} | {c['seeds']} |" for d, c in counts.items()), "",
            f"{copies:,} of {offers:,} rows ({copies / max(offers, 1):.1%}) are exact duplicates: rows beyond the "
            "first of a set equal in every recorded field (direction, seed, stage, D, the terms, both halves of U, U "
            "repaired, every signal, reward, advantage, band). The rows hold no completion text; agreement in every "
            "float stands in for identical tokens. A seed's three stages are one resumed run, so a direction's "
            "independent units are its seeds.", ""]


def tbd_lines(tbd: dict[str, dict]) -> list[str]:
    """TBD's modal value and its rho with U without iteration EARLY, per direction where P2 takes TBD."""
    rows = [f"| {d} | {t['mode']:.3f} | {t['at_mode']} ({t['share_at_mode']:.1%}) | {t['off_mode']} | "
            f"{t['off_mode_early']} | {t['off_mode_unrewarded']} | {interval(t['rho_registered'])} | "
            f"{interval(t['rho_without_early'])}, {t['rho_without_early']['offers']} offers in "
            f"{t['rho_without_early']['clusters']} clusters |" for d, t in tbd.items()]
    return [f"### TBD's modal value and iteration {EARLY}", "",
            f"| direction | modal raw TBD | offers at it | off it | of those, at iteration {EARLY} | of those, reward "
            f"0 | rho(TBD, U), all stages (registered) | rho(TBD, U) without iteration {EARLY} [95% CI] |",
            "|---|---|---|---|---|---|---|---|", *(rows or ["| (no direction) | | | | | | | |"]), "",
            f"Without iteration {EARLY}: the bootstrap over the remaining clusters (seed, stage), enumerated exactly "
            "as the registered one is over all nine.", ""]


def reward_lines(reward: dict[str, dict]) -> list[str]:
    """P4's reward: whether it equals A > 0, and which rho(reward, U) intervals hold 0."""
    held = sum(r["holds_zero"] for r in reward.values())
    return ["### P4's reward (descriptive, registered as never a call)", "",
            "| direction | reward = 1 exactly where A > 0 | rho(reward, U) [95% CI] | interval holds 0 |",
            "|---|---|---|---|",
            *(f"| {d} | {'yes' if r['is_positive_advantage'] else 'no'} | {interval(r['rho'])} | "
              f"{'yes' if r['holds_zero'] else 'no'} |" for d, r in reward.items()), "",
            f"{held} of {len(reward)} intervals hold 0.", ""]


def markdown(result: dict) -> list[str]:
    """report.md's section of the readings."""
    lines = ["## Readings of the measure and the rows (issue 67): descriptive, not calls", ""]
    for name, g in result["gate"].items():
        lines += gate_lines(name, g)
    return lines + duplicate_lines(result["duplicates"]) + tbd_lines(result["tbd"]) + reward_lines(result["reward"])
