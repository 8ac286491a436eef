"""The premise's report from its rows alone (results/preregistration-premise.md): P1 (rho(D, U) per direction),
P2 (each raw term, where it is non-zero on at least 10% of a direction's offers), P3 (the median per-offer
U(repaired credit) - U(PRP's credit)), each with a 95% bootstrap interval over clusters (seed, stage), a bootstrap
p and Holm within its family, called by the registered rules; P4's descriptive table (|rho| with U, and with
U / |A|, of D, each term, each baseline's signal and a seeded random control); issue 67's readings of the gate's file
and the rows, descriptive (premise_readings.py); and one figure, U against D per direction. Writes report.md,
report.json and premise.png into the rows' folder.

Every statistic of a direction is one component of one vector statistic, so that a single bootstrap (exact over
the 9 clusters of 3 seeds x 3 stages) serves them all."""

from __future__ import annotations

import json
import random
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import premise_readings as readings
from analysis import premise_registered as registered
from analysis import premise_stats as stats

PREDICTORS = ("D", *registered.TERMS, *registered.SIGNALS, "random")
"""what P4 sets against U: D, its raw terms, the baselines' signals, the offer's reward and advantage, a random
control (P1 and P2 read D's and the terms' rho from the same statistic)"""


def stage_file(out: Path, preset: str, seed: int, stage: int) -> Path:
    """The rows' file of one (preset, seed, stage): benchmarks/premise_measure.py writes it, `load` reads it."""
    return out / f"{preset}-s{seed}-it{stage:03d}.jsonl"


def stage_of(path: Path) -> tuple[str, int, int]:
    """(preset, seed, stage) of a stage file's name: the inverse of stage_file."""
    preset, seed, stage = path.stem.rsplit("-", 2)
    return preset, int(seed.removeprefix("s")), int(stage.removeprefix("it"))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(folder: Path) -> list[dict]:
    """Every stage file's rows, each with its direction named by its preset, in the files' order."""
    rows = []
    for path in sorted(folder.glob("*-s*-it*.jsonl")):
        preset = stage_of(path)[0]
        rows += [{**r, "direction": f"{preset}: {r['source']} -> {r['receiver']}"} for r in read_rows(path)]
    return rows


def gates(folder: Path) -> dict[str, dict]:
    """Every gate file under `folder` (gate-sSEED.json), by its name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("gate-s*.json"))}


def usefulness(row: dict) -> float:
    return sum(row["U_halves"]) / 2


def predictors(rows: list[dict], direction: str) -> np.ndarray:
    """[n, len(PREDICTORS)] each row's D, raw terms, signals and a uniform control seeded by the direction."""
    control = random.Random(f"premise/control/{direction}")
    return np.array([[r["D"], *(r["terms"][t] for t in registered.TERMS), *(r[s] for s in registered.SIGNALS),
                      control.random()] for r in rows], dtype=float)


def direction_statistic(rows: list[dict], direction: str):
    """The direction's statistic over row indices: rho with U of each predictor, |rho| with U, |rho| with U / |A|,
    and the median U(repaired) - U(PRP's credit)."""
    x = predictors(rows, direction)
    u = np.array([usefulness(r) for r in rows])
    per_a = u / np.abs([r["advantage"] for r in rows])
    gain = np.array([r["U_repaired"] for r in rows]) - u

    def statistic(i: np.ndarray) -> np.ndarray:
        rho = stats.spearman_columns(x[i], u[i])
        return np.concatenate([rho, np.abs(rho), np.abs(stats.spearman_columns(x[i], per_a[i])), [np.median(gain[i])]])
    return statistic


def term_present(rows: list[dict], term: str) -> bool:
    """P2 takes a term in a direction where it is non-zero on at least TERM_PRESENCE of the offers."""
    return np.mean([r["terms"][term] not in (0, None) and np.isfinite(r["terms"][term]) for r in rows]) \
        >= registered.TERM_PRESENCE


def per_direction(rows: list[dict], direction: str, rng: random.Random) -> dict:
    """The direction's numbers: P1's and P2's rho, P3's median, P4's |rho|s, each with interval and p."""
    mine = [r for r in rows if r["direction"] == direction]
    clusters: dict[tuple, list[int]] = {}
    for i, r in enumerate(mine):
        clusters.setdefault((r["seed"], r["stage"]), []).append(i)
    out = stats.clustered([clusters[k] for k in sorted(clusters)], direction_statistic(mine, direction), rng)
    k = len(PREDICTORS)
    return {"offers": len(mine), "clusters": len(clusters), "rho": dict(zip(PREDICTORS, out[:k])),
            "abs_rho": dict(zip(PREDICTORS, out[k:2 * k])), "abs_rho_per_A": dict(zip(PREDICTORS, out[2 * k:3 * k])),
            "median_gain": out[-1], "terms_present": [t for t in registered.TERMS if term_present(mine, t)]}


def called(results: dict[str, dict], rule) -> dict[str, dict]:
    """A family's results with Holm's decision over it and the registered call."""
    rejected = stats.holm({d: r["p"] for d, r in results.items()})
    return {d: {**r, "holm": rejected[d], "call": rule(r, rejected[d])} for d, r in results.items()}


def hypotheses(numbers: dict[str, dict]) -> dict:
    """P1, P2 (a family per term over the directions where it is present) and P3, called."""
    return {"P1": called({d: n["rho"]["D"] for d, n in numbers.items()}, stats.call_negative),
            "P2": {t: called({d: n["rho"][t] for d, n in numbers.items() if t in n["terms_present"]},
                             stats.call_negative) for t in registered.TERMS},
            "P3": called({d: n["median_gain"] for d, n in numbers.items()}, stats.call_positive_median)}


def cell(r: dict, digits: int = 3) -> str:
    return f"{r['value']:+.{digits}f} [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}]"


def family_table(title: str, statistic: str, family: dict[str, dict], digits: int = 3) -> list[str]:
    lines = [f"### {title}", "", f"| direction | {statistic} [95% CI] | bootstrap p | Holm rejects | call |",
             "|---|---|---|---|---|"]
    lines += [f"| {d} | {cell(r, digits)} | {r['p']:.4f} | {'yes' if r['holm'] else 'no'} | {r['call']} |"
              for d, r in sorted(family.items())]
    return lines + ([] if family else ["| (no direction) | | | | |"]) + [""]


def descriptive_table(title: str, key: str, numbers: dict[str, dict]) -> list[str]:
    lines = [f"### {title}", "", "| direction | " + " | ".join(PREDICTORS) + " |", "|---" * (len(PREDICTORS) + 1) + "|"]
    lines += [f"| {d} | " + " | ".join(f"{n[key][p]['value']:.2f} [{n[key][p]['low']:.2f}, {n[key][p]['high']:.2f}]"
                                       for p in PREDICTORS) + " |" for d, n in sorted(numbers.items())]
    return lines + [""]


def markdown(numbers: dict[str, dict], calls: dict, read: list[str]) -> str:
    """report.md: the rows, P1-P3's families, P4's tables, then the readings' section `read` and the figure."""
    sizes = ", ".join(f"{d} {n['offers']} offers in {n['clusters']} clusters" for d, n in sorted(numbers.items()))
    lines = ["# The premise offer by offer (results/preregistration-premise.md)", "",
             f"Rows: {sizes}. Intervals: 95% bootstrap over clusters (seed, stage); Holm within each family at "
             f"{registered.ALPHA}.", "", *family_table("P1: rho(D, U)", "rho(D, U)", calls["P1"])]
    for t in registered.TERMS:
        lines += family_table(f"P2: rho({t} raw, U), where {t} is non-zero on >= 10% of the offers", f"rho({t}, U)",
                              calls["P2"][t])
    lines += family_table("P3: median U(repaired) - U(PRP's credit)", "median", calls["P3"], digits=6)
    lines += descriptive_table("P4: |rho| with U (descriptive)", "abs_rho", numbers)
    lines += descriptive_table("P4: |rho| with U / |A| (descriptive)", "abs_rho_per_A", numbers)
    return "\n".join(lines + read + ["![U against D per direction](premise.png)", ""])


def figure(rows: list[dict], directions: list[str], path: Path) -> None:
    """U against D, a panel per direction, the stages in colours."""
    cols = min(4, len(directions))
    fig, axes = plt.subplots(-(-len(directions) // cols), cols, figsize=(4 * cols, 3.2 * -(-len(directions) // cols)),
                             squeeze=False)
    for ax, d in zip(axes.flat, directions):
        mine = [r for r in rows if r["direction"] == d]
        for stage in sorted({r["stage"] for r in mine}):
            at = [r for r in mine if r["stage"] == stage]
            ax.scatter([r["D"] for r in at], [usefulness(r) for r in at], s=8, label=f"iteration {stage}")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(title=d, xlabel="D", ylabel="U")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(directions):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(folder: Path) -> dict:
    """P1-P4 and the figure from the rows under `folder`, written beside them; returns report.json's content."""
    rows = load(folder)
    if not rows:
        raise SystemExit(f"no rows under {folder}")
    rng = random.Random("premise/report")
    directions = sorted({r["direction"] for r in rows})
    numbers = {d: per_direction(rows, d, rng) for d in directions}
    calls = hypotheses(numbers)
    read = readings.readings(rows, numbers, gates(folder), usefulness, random.Random("premise/readings"))
    (folder / "report.md").write_text(markdown(numbers, calls, readings.markdown(read)))
    result = {"directions": numbers, **calls, "readings": read}
    (folder / "report.json").write_text(json.dumps(result, indent=1))
    figure(rows, directions, folder / "premise.png")
    print((folder / "report.md").read_text())
    return result
