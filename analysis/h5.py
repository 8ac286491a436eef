"""H5 (results/preregistration-matrix.md, H5; issue 42): adaptive cross-fidelity against the fixed sharing levels in
the stability-support plane, what crossed per iteration against the receiver's training reward variance. Per
policy, each configuration's point with its 95% bootstrap intervals over the seeds, each fixed level's paired gap to
adaptive cross-fidelity, and the call by dominance; and adaptive cross-fidelity's path through the plane, its
iterations cut into windows, read from the per-iteration records benchmarks/h5_path.py keeps beside its summaries.
analysis/blocks.py reports it with the matrix's blocks (`python eval.py --blocks results`).
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis import matrix as ma
from analysis import pairing, stats, verdicts
from analysis.curves import reward_variance

LEVELS = ("prp", "xgrpo", "sgt")
ADAPTIVE = "cross-fidelity-adaptive"
SEEDS = range(1009, 1015)
"""H5's fixed levels, the configuration compared with them, and its registered seeds"""
WINDOWS = 4
"""the registration's windows: 100 iterations in 4 of 25"""


def window_points(received: list[float], rewards: list[float], windows: int = WINDOWS) -> list[tuple[float, float]]:
    """(mean received per iteration, reward variance) within each of `windows` equal consecutive windows of a
    policy's iterations."""
    if len(received) != len(rewards) or len(rewards) % windows or len(rewards) // windows < 2:
        raise ValueError(f"{len(received)} received and {len(rewards)} rewards do not fall in {windows} equal "
                         f"windows of at least 2 iterations")
    size = len(rewards) // windows
    cut = [slice(w * size, (w + 1) * size) for w in range(windows)]
    return [(sum(received[c]) / size, reward_variance(rewards[c])) for c in cut]


def plane_point(run: dict, policy: str) -> tuple[float, float]:
    """(peer experience received per iteration, training reward variance) of one run's policy"""
    mine = run["policies"][policy]
    return mine["crossed"].get("sharing/received", 0.0), mine["reward_variance"]


def plane_gap(x: dict[int, dict], y: dict[int, dict], policy: str, cfg: ma.AnalysisConfig) -> dict:
    """Runs x (seed -> summary) less runs y in the plane, over the seeds where they are paired: "received" and
    "variance", each (mean, low, high) with its 95% bootstrap interval, and each one's exact two-sided sign-flip p
    (the reading valid at its n, results/reporting-rule.md, 6)."""
    seeds = pairing.paired_seeds(x, y, cfg.pair_by_start)
    if len(seeds) < 2:   # no interval: a single difference would read as one of zero width
        return {"seeds": len(seeds)}
    received, variance = ([plane_point(x[s], policy)[k] - plane_point(y[s], policy)[k] for s in seeds] for k in (0, 1))
    return {"seeds": len(seeds), "received": interval(received, cfg), "variance": interval(variance, cfg),
            "received_sign_flip_p": stats.sign_flip_p(received), "variance_sign_flip_p": stats.sign_flip_p(variance)}


def dominates(gap: dict) -> bool:
    """Whether a plane_gap's x dominates its y: more received per iteration and less reward variance, each paired
    difference's 95% interval excluding 0 (never over fewer than two paired seeds)."""
    return gap["seeds"] >= 2 and gap["received"][1] > 0 and gap["variance"][2] < 0


def dominates_at_n(gap: dict, alpha: float) -> bool:
    """The same read validly at its n (results/reporting-rule.md, 6): more received and less reward variance, each
    paired difference's exact two-sided sign-flip p at most `alpha`."""
    return (gap["seeds"] >= 2 and gap["received"][0] > 0 and gap["received_sign_flip_p"] <= alpha
            and gap["variance"][0] < 0 and gap["variance_sign_flip_p"] <= alpha)


def plane_call(beaten: list[str], beats: list[str]) -> str:
    """The registered call from the levels that dominate adaptive curation and those it dominates."""
    return (f"refuted (dominated by {', '.join(beaten)})" if beaten else
            f"supported (dominates {', '.join(beats)})" if beats else "not resolved")


def analyze(runs: list[dict], cfg: ma.AnalysisConfig, waiting: list[str] = (), records: dict[int, dict] | None = None
       ) -> list[dict]:
    """H5 per policy, once adaptive cross-fidelity and every fixed level ran on every H5 seed at this class of
    commits and no block it reads is `waiting`: each configuration's point (mean received per iteration and reward
    variance over the seeds, each with its 95% bootstrap interval), adaptive cross-fidelity's path over its
    windows where `records` (seed -> its per-iteration record, h5_path) holds every H5 seed, and the call:
    supported where adaptive cross-fidelity is dominated by none of the fixed levels and dominates one, refuted
    where one dominates it, otherwise not resolved; "verdict" by the registered intervals, "verdict_at_n" by the
    exact sign-flip tests, "reported" the word both give (results/reporting-rule.md)."""
    by_config: dict[str, dict[int, dict]] = {}
    for s in runs:
        if s["seed"] in SEEDS:
            by_config.setdefault(s["configuration"], {})[s["seed"]] = s
    ran = {c: len(by_config.get(c, {})) for c in (ADAPTIVE, *LEVELS)}
    short = {c: n for c, n in ran.items() if n < len(SEEDS)}
    out = []
    for policy in (list(runs[0]["policies"]) if runs else []):
        if short or waiting:
            counts = ", ".join(f"{c} on {n} of {len(SEEDS)} seeds" for c, n in short.items())
            verdict = f"incomplete: {counts}" if short else f"waits for block {', '.join(waiting)}"
            out.append({"policy": policy, "points": [], "gaps": [], "path": [], "verdict": verdict})
            continue
        points = []
        for c in (*LEVELS, ADAPTIVE):
            received, variance = zip(*(plane_point(s, policy) for s in by_config[c].values()))
            points.append({"configuration": c, "received": interval(list(received), cfg),
                           "variance": interval(list(variance), cfg)})
        adaptive = by_config[ADAPTIVE]
        gaps = {c: plane_gap(by_config[c], adaptive, policy, cfg) for c in LEVELS}
        inverse = {c: plane_gap(adaptive, by_config[c], policy, cfg) for c in LEVELS}
        registered = plane_call([c for c in LEVELS if dominates(gaps[c])], [c for c in LEVELS if dominates(inverse[c])])
        at_n = plane_call([c for c in LEVELS if dominates_at_n(gaps[c], cfg.alpha)],
                          [c for c in LEVELS if dominates_at_n(inverse[c], cfg.alpha)])
        out.append({"policy": policy, "points": points, "gaps": [{"configuration": c, **g} for c, g in gaps.items()],
                    "path": adaptive_path(adaptive, records or {}, policy, cfg), "verdict": registered,
                    "verdict_at_n": at_n, "reported": verdicts.reported((registered,), (at_n,), plane_text)})
    return out


def plane_text(parts: verdicts.Labels) -> str:
    return parts[0] or "not resolved"


def adaptive_path(adaptive: dict[int, dict], records: dict[int, dict], policy: str, cfg: ma.AnalysisConfig
                  ) -> list[dict]:
    """Adaptive cross-fidelity's path through the plane: per window, the mean over seeds of its (received,
    variance) within the window, each with its 95% bootstrap interval; empty until every seed's record is in."""
    if not set(adaptive) <= set(records):
        return []
    for seed, run in adaptive.items():
        if records[seed]["commits"] != run["commits"]:
            raise ValueError(f"the record of {ADAPTIVE}-s{seed} names commits {records[seed]['commits']}, its "
                             f"summary {run['commits']}: rewrite it from the summarized run (benchmarks/h5_path.py)")
    windows = [window_points(records[s]["received"][policy], run["policies"][policy]["reward_mean"])
               for s, run in sorted(adaptive.items())]
    return [{"window": w + 1, "received": interval([seed[w][0] for seed in windows], cfg),
             "variance": interval([seed[w][1] for seed in windows], cfg)} for w in range(WINDOWS)]


def load_records(folder: Path) -> dict[int, dict]:
    """seed -> the per-iteration record of adaptive cross-fidelity's run of that seed, from `folder` (h5_path)"""
    records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob(f"{ADAPTIVE}-s*.received.json"))]
    return {r["seed"]: r for r in records if r["configuration"] == ADAPTIVE}


def interval(values: list[float], cfg: ma.AnalysisConfig) -> tuple[float, float, float]:
    """(mean, low, high): the values' mean and its 95% percentile bootstrap interval over seeds"""
    means = stats.bootstrap_means(values, cfg.resamples, cfg.bootstrap_seed)
    return (sum(values) / len(values), *stats.percentile_interval(means, 1 - cfg.alpha))


def markdown(result: list[dict]) -> list[str]:
    """H5's section of the blocks report: per policy its call, points, gaps and path."""
    lines = ["## H5: the stability-support plane\n"]
    for h in result:
        lines.append(f"- {h['policy']}: {h['reported']}; registered {h['verdict']}, at n {h['verdict_at_n']}"
                     if h["points"] else f"- {h['policy']}: {h['verdict']}")
        lines += [f"  - {p['configuration']}: received {p['received'][0]:.2f} [{p['received'][1]:.2f}, "
                  f"{p['received'][2]:.2f}] an iteration, reward variance {p['variance'][0]:.4f} "
                  f"[{p['variance'][1]:.4f}, {p['variance'][2]:.4f}]" for p in h["points"]]
        lines += [f"  - {g['configuration']} less {ADAPTIVE}, paired over {g['seeds']} seeds: received "
                  f"{g['received'][0]:+.2f} [{g['received'][1]:+.2f}, {g['received'][2]:+.2f}], reward variance "
                  f"{g['variance'][0]:+.5f} [{g['variance'][1]:+.5f}, {g['variance'][2]:+.5f}] "
                  f"(exact sign-flip p: received {stats.p_text(g['received_sign_flip_p'])}, "
                  f"variance {stats.p_text(g['variance_sign_flip_p'])})"
                  if g["seeds"] >= 2 else
                  f"  - {g['configuration']} less {ADAPTIVE}, paired over {g['seeds']} seeds: fewer than two, "
                  "not compared" for g in h["gaps"]]
        if h["points"] and h["path"]:
            lines.append(f"  - {ADAPTIVE}'s path over {WINDOWS} windows of its iterations: " + "; ".join(
                f"{w['window']}: received {w['received'][0]:.2f} [{w['received'][1]:.2f}, {w['received'][2]:.2f}], "
                f"variance {w['variance'][0]:.4f} [{w['variance'][1]:.4f}, {w['variance'][2]:.4f}]"
                for w in h["path"]))
        elif h["points"]:
            lines.append(f"  - {ADAPTIVE}'s path: not drawn before every seed's per-iteration record is in "
                         f"(benchmarks/h5_path.py)")
    return lines
