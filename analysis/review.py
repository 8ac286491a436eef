"""What a sceptical reviewer reads beside the matrix's registered calls: the repair of its two unpaired seeds
(results/preregistration-repair.md), each affected verdict three times, side by side; and cross-fidelity - sgt
over every paired seed that ran both, described and not called.

    python eval.py --blocks results        # review.md and review.json in results/matrix, beside blocks.md

Block 1 (the main comparison, seeds 1001-1011 of results/pilot and results/matrix-main) and block 6 (TBD's
ablation on trio prose, seeds 1009-1011) each held a seed whose runs did not start from the same weights. Each
verdict is given as published (the registered seeds, every seed paired as it ran), on the registered seeds whose
runs are paired (analysis/pairing.py), and with the repair (those and the fresh seed 1031, run in full on one
machine); the last is the registered call once the repair's runs are in.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from analysis import blocks as mb
from analysis import matrix as ma
from analysis import stats

BLOCK1 = (("pilot", "matrix-main"), tuple(range(1001, 1012)))
"""block 1: its folders under results/ and its registered seeds"""
VIEWS = ("as published", "paired seeds alone", "with the repair")


def view_seeds(registered: tuple[int, ...], view: str) -> tuple[tuple[int, ...], bool]:
    """The seeds a view reads and whether it pairs runs by their start."""
    return (registered + mb.REPAIRS["main"] if view == "with the repair" else registered), view != "as published"


def block1(root: Path, cfg: ma.AnalysisConfig) -> list[dict]:
    """H1, H2 and the primary contrasts (auc) of block 1 per policy, in each view: rows of {"question", view: text}.
    The repair's view is empty until every configuration ran seed 1031."""
    folders, registered = BLOCK1
    if not any(ma.is_summary(p) for f in folders for p in (Path(root) / f).glob("*.json")):
        return []
    summaries = ma.load(*(Path(root) / f for f in folders))
    configurations = {s["configuration"] for s in summaries}
    repaired = all(any(s["seed"] == seed and s["configuration"] == c for s in summaries)
                   for seed in mb.REPAIRS["main"] for c in configurations)
    rows: dict[str, dict[str, str]] = {}
    for view in VIEWS:
        if view == "with the repair" and not repaired:
            continue
        seeds, by_start = view_seeds(registered, view)
        result = ma.analyze([s for s in summaries if s["seed"] in seeds], replace(cfg, pair_by_start=by_start))
        for h in result["hypotheses"]:
            form = "+.2f" if h["hypothesis"] == "H1" else ".3f"
            rows.setdefault(f"{h['hypothesis']} ({h['policy']})", {})[view] = (
                f"{h['estimate']:{form}} [{h['interval'][0]:{form}}, {h['interval'][1]:{form}}], {h['seeds']} seeds: "
                f"{h['reported']}")
        for r in result["contrasts"]["auc"]:
            rows.setdefault(f"{r['contrast']} ({r['policy']})", {})[view] = (
                f"{r['mean']:+.2f} [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}], {len(r['differences'])} seeds, "
                f"Holm p {r['holm_p']:.3f}, sign-flip p {stats.p_text(r['sign_flip_p'])}")
    return [{"block": 1, "question": q, **views} for q, views in rows.items()]


def block6(runs: list[dict], cfg: ma.AnalysisConfig) -> list[dict]:
    """Block 6's contrast per policy, in each view (mb.family); the repair's view empty until its runs are in."""
    _, seeds, contrasts = mb.FAMILIES["tbd"]
    rows: dict[str, dict[str, str]] = {}
    for view in VIEWS:
        called = mb.family(runs, tuple(seeds), contrasts, replace(cfg, pair_by_start=view != "as published"),
                           mb.REPAIRS["tbd"] if view == "with the repair" else ())
        if view == "with the repair" and called["repaired"] != list(mb.REPAIRS["tbd"]):
            continue
        for r in called["rows"]:
            rows.setdefault(f"{r['contrast']} ({r['policy']})", {})[view] = (
                f"{r['mean']:+.2f} [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}], {len(r['differences'])} seeds, "
                f"sign-flip p {stats.p_text(r['sign_flip_p'])}: {r['reported']}")
    return [{"block": 6, "question": q, **views} for q, views in rows.items()]


def pooled(root: Path, cfg: ma.AnalysisConfig) -> list[dict]:
    """Descriptive, never a call: cross-fidelity - sgt per policy over every seed once where both ran and are
    paired: block 4's seeds 1009-1030 (results/matrix, one commit, one machine), the pilot's 1001-1008 and the
    repair's 1031 (results/pilot, results/matrix-main). Block 1's 1009-1011 are block 4's seeds too, so they are
    read once, from block 4."""
    block4 = ma.load(Path(root) / "matrix")
    block1 = [s for s in ma.load(*(Path(root) / f for f in BLOCK1[0]))
              if s["seed"] < 1009 or s["seed"] in mb.REPAIRS["main"]]
    runs: dict[str, dict[int, dict]] = {}
    for s in block1 + [s for s in block4 if s["seed"] in mb.FAMILIES["hacpo"][1]]:
        runs.setdefault(s["configuration"], {})[s["seed"]] = s
    differences = {policy: ma.paired_differences(runs.get("cross-fidelity", {}), runs.get("sgt", {}), policy, "auc",
                                                 by_start=True)
                   for policy in block4[0]["policies"]}
    return [ma.contrast_row("cross-fidelity", "sgt", policy, d, cfg) for policy, d in differences.items() if len(d) > 1]


def markdown(rows: list[dict], pooled_rows: list[dict]) -> list[str]:
    """The review's lines: the repair's side-by-side table, then the pooled contrast."""
    lines = ["## The repair of two unpaired seeds (results/preregistration-repair.md)\n",
             f"Each verdict of an affected block: as published (the registered seeds, the unpaired one included), on "
             f"the paired seeds alone, and with the repair (the paired seeds and fresh seed "
             f"{', '.join(map(str, mb.REPAIRS['main']))}, run in full on one machine; the registered call once its "
             f"runs are in). Mean [95% bootstrap interval], seeds, and the call the reporting rule reports (results/"
             f"reporting-rule.md: the word both the registered call and the reading at n give) or the test's p.\n",
             "| block | question | " + " | ".join(VIEWS) + " |", "|---" * (2 + len(VIEWS)) + "|"]
    lines += [f"| {r['block']} | {r['question']} | " + " | ".join(r.get(v, "not yet run") for v in VIEWS) + " |"
              for r in rows]
    lines += ["", "## cross-fidelity - sgt over every paired seed that ran both (descriptive, not a call)\n",
              "| policy | seeds | mean | 95% bootstrap interval | t interval | sign-flip p |", "|---" * 6 + "|"]
    lines += [f"| {r['policy']} | {len(r['differences'])} ({min(r['differences'])}-{max(r['differences'])}) "
              f"| {r['mean']:+.2f} | [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}] "
              f"| [{r['t_interval'][0]:+.2f}, {r['t_interval'][1]:+.2f}] | {stats.p_text(r['sign_flip_p'])} |"
              for r in pooled_rows]
    return lines


def report(root: Path, cfg: ma.AnalysisConfig = ma.AnalysisConfig()) -> str:
    """The review of the summaries under `root`: review.md and review.json written in root/matrix."""
    rows = block1(root, cfg) + block6(mb.load_sets(root).get(mb.FAMILIES["tbd"][0], []), cfg)
    block4 = any(ma.is_summary(p) for p in (Path(root) / "matrix").glob("*.json"))
    pooled_rows = pooled(root, cfg) if rows and block4 else []
    text = "\n".join(markdown(rows, pooled_rows)) + "\n"
    out = Path(root) / "matrix"
    out.mkdir(exist_ok=True)
    (out / "review.md").write_text(text)
    (out / "review.json").write_text(json.dumps({"repair": rows, "pooled": pooled_rows}, indent=1) + "\n")
    return text
