"""The matrix's blocks 2-6, H4 and H5 from the run summaries alone, called by the rules of
results/preregistration-matrix.md (issue 42), and H3 by results/preregistration-h3.md (analysis/h3.py). Block 1, the
pilot's comparison at 11 seeds, is analysis/matrix.py's (`python eval.py --matrix results/pilot results/matrix-main`).

    python eval.py --blocks results        # blocks.md, blocks.json (h5-plane.png) in results/matrix

Each family is a list of contrasts A - B, per policy, on the family's registered seeds: the paired differences seed
by seed, their mean, a 95% percentile bootstrap interval and a bootstrap p-value (analysis/matrix.py), Holm over the
family. Each contrast is called by its registered rule (`call`), again at its n (results/reporting-rule.md), and
reported by the word both give. H4 (analysis/h4.py): which degradation term dominates each direction. H5
(analysis/h5.py): the fixed levels and adaptive cross-fidelity in the stability-support plane. Each of them is
computed only once all its registered runs are in, at one class of commits: the registration calls a block when it
is complete and has nobody look at its outcomes before, so until then the report gives counts of runs, never an
outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis import h3, h4, h5, pairing, plots, stats, verdicts
from analysis import matrix as ma

SMALLEST = 2.0
"""the registration's smallest difference that matters, in points"""
FAMILIES = {
    "estimate": ("matrix", range(1009, 1020), (("cross-fidelity-last2", "cross-fidelity", "estimate"),
                                               ("cross-fidelity-last2", "sgt", "gain"))),
    "ablations": ("matrix", range(1009, 1015), (("cross-fidelity", "cross-fidelity-ablate-ccm", "component"),
                                                ("cross-fidelity", "cross-fidelity-ablate-rsd", "component"),
                                                ("cross-fidelity-adaptive", "cross-fidelity", "component"),
                                                ("cross-fidelity", "cross-fidelity-intrinsic", "component"))),
    "hacpo": ("matrix", range(1009, 1031), (("hacpo", "sgt", "lead"), ("cross-fidelity", "hacpo", "lead"))),
    "tbd": ("matrix-trio-prose", range(1009, 1012), (("cross-fidelity", "cross-fidelity-ablate-tbd", "component"),)),
    "hacpo-official": ("hacpo-official", range(7001, 7028), (("hacpo-official", "sgt", "lead"),
                                                             ("hacpo-official", "hacpo", "lead"))),
    "ccm-estimate": ("ccm-estimate", range(2301, 2312),
                     (("cross-fidelity-last0", "cross-fidelity-last2", "estimate"),)),
}
"""block -> (the set its runs are in, its registered seeds, its contrasts (A, B, how each is called)); the last,
HACPO as its authors wrote it, and the cheaper CCM estimate are each registered on their own
(results/preregistration-hacpo-official.md, results/preregistration-ccm-estimate.md)"""
REPAIRS = {"main": (1031,), "tbd": (1031,)}
"""block -> the fresh seeds that restore its count where a registered seed is unpaired (results/preregistration-
repair.md), read once every run of the block is in on them; block 1's ("main") in results/matrix-main"""
IN_PLACE = ("hacpo-official", "ccm-estimate")
"""the blocks whose registration leaves a seed unpaired in any of its runs out of every contrast and owes the next
fresh seed (7028 or 2312, then the next, ...) run in full in its place, read in turn, before the block is called
(results/preregistration-hacpo-official.md)"""
DESCRIBED = {"hacpo-official": (("hacpo", "sgt"),)}
"""block -> contrasts its registration shows beside its calls on the same seeds, never tested nor in Holm's family"""
SHARING = {"hacpo-official": ("sharing/accepted", "sharing/received")}
"""block -> what each of its configurations' runs shared, per iteration, that its registration shows (not tested)"""
REGISTERED_AT = {"hacpo-official": "d37ed732563c168fddc1d096aafe8a8aeefe6c51",
                 "h3": "3019911cd159a421af4f3129e5458b4de7b97639",
                 "ccm-estimate": "fb0b30247257c7a2802d616e235c133d6ba6f49b"}
"""the code commit each experiment registered on its own runs at, as its summaries record it (the last commit
outside results/; results/preregistration-hacpo-official.md, amendment 1, 1038738, whose code is d37ed73's;
results/preregistration-h3.md; results/preregistration-ccm-estimate.md, amendment 1, whose code is fb0b302's): its
runs are read only at it or at a commit declared metric-equivalent to it"""
UNDERPOWERED = {("ablations", None, "llama"), ("hacpo", "cross-fidelity - hacpo", "llama")}
"""(block, contrast or every one, policy) the registration says are underpowered at its seeds, and reported so"""
H4_WAITS = ("estimate", "tbd")
H5_WAITS = ("estimate", "ablations")
"""the blocks whose runs H4 and H5 read besides their own: neither is shown before those are complete"""
COST_VIEWS = ("equal update tokens", "equal wall time")
"""a called family's contrasts again at equal cost (analysis/matrix.py, VIEWS), shown beside its calls and not tested:
the registration calls the AUC alone, and wall time is that of two runs at a time on a shared machine"""


def labels(rule: str, up: bool, down: bool, interval: tuple[float, float]) -> verdicts.Labels:
    """A contrast's (Holm label, 2-point-margin label) by its registered rule, from whether its test rejects 0 with
    a positive (`up`) or negative (`down`) mean and from its 95% interval; None where a part says nothing."""
    low, high = interval
    if rule == "estimate":
        return "costs accuracy" if down else None, "costs no accuracy" if low > -SMALLEST else None
    if rule == "gain":
        return "supported" if up else None, "refuted" if high < SMALLEST else None
    if rule == "component":
        return ("matters" if up else "hurts" if down else None,
                "matters by less than 2 points" if -SMALLEST < low and high < SMALLEST else None)
    if rule == "lead":
        return "supported" if up else "reversed" if down else None, None
    raise ValueError(f"no rule {rule!r}")


def call_text(parts: verdicts.Labels) -> str:
    """A contrast's call as printed: where a Holm label and a margin label both hold, both, each with its source."""
    holm, margin = parts
    if holm and margin:
        return f"{holm} (Holm), and {margin} (the 2-point margin)"
    return holm or margin or "not resolved"


def registered_labels(rule: str, row: dict) -> verdicts.Labels:
    """The registered call's labels: Holm over the bootstrap p-values, the 95% percentile interval."""
    rejected = row["holm_rejected"]
    return labels(rule, rejected and row["mean"] > 0, rejected and row["mean"] < 0, row["interval"])


def labels_at_n(rule: str, row: dict) -> verdicts.Labels:
    """The same rule read validly at the row's n (results/reporting-rule.md, 2 and 3): Holm over the exact
    sign-flip p-values of the family, Student's t interval."""
    rejected = row["exact_rejected"]
    return labels(rule, rejected and row["mean"] > 0, rejected and row["mean"] < 0, row["t_interval"])


def call(rule: str, row: dict) -> str:
    """A contrast's verdict by its registered rule, from its mean, 95% interval and Holm's decision. Where a
    label of Holm's and a label of the 2-point margin both hold, both registered labels are given, each with its
    source."""
    return call_text(registered_labels(rule, row))


def called(row: dict) -> None:
    """A family's row called three ways: "verdict" by its registered rule, "verdict_at_n" by the reading valid at
    its n, and "reported", what the reporting rule lets a verdict column say."""
    registered, at_n = registered_labels(row["rule"], row), labels_at_n(row["rule"], row)
    row.update(verdict=call_text(registered), verdict_at_n=call_text(at_n),
               reported=verdicts.reported(registered, at_n, call_text))


def family(runs: list[dict], seeds: tuple[int, ...], contrasts: tuple, cfg: ma.AnalysisConfig,
           repair: tuple[int, ...] = (), in_place: bool = False, described: tuple = (), sharing: tuple = ()) -> dict:
    """A family on its registered seeds, and the `repair` seeds whose every run of the family is in
    (results/preregistration-repair.md): "ran", each contrast's count of registered seeds both its sides ran;
    "unpaired", seed -> why, for each contrast with runs of a seed that did not start from the same weights
    (left out of it; `in_place`: of every contrast, and the next fresh seed is owed, `seeds_owed`); "repair" and
    "repaired", the repair or owed seeds and those of them it reads; and, only once every configuration ran on every
    registered and owed seed, "rows", its contrasts over their paired seeds with Holm within the family (each with
    its interval at the level Holm tests it at) and each called, "at_cost", the same contrasts at equal cost
    (COST_VIEWS), "admission", each curated configuration's admissions per receiving policy (analysis/matrix.py,
    admission), "described", the `described` contrasts (a, b) beside them, untested, and "sharing", each
    configuration's mean and SD over seeds of the `sharing` metrics. The registration calls a block when it is
    complete and has nobody look at its outcomes before, so an incomplete family shows its counts alone."""
    names = dict.fromkeys(name for a, b, _ in contrasts for name in (a, b))
    by_config: dict[str, dict[int, dict]] = {name: {} for name in names}
    for s in runs:
        if s["configuration"] in names:
            by_config[s["configuration"]][s["seed"]] = s
    left_out: dict[int, str] = {}
    if in_place and cfg.pair_by_start:
        owed, left_out = seeds_owed(by_config, seeds)
        repair = tuple(owed[len(seeds):])
    repaired = tuple(seed for seed in repair if all(seed in by_config[name] for name in names))
    ran = {f"{a} - {b}": len(set(by_config[a]) & set(by_config[b]) & set(seeds)) for a, b, _ in contrasts}
    for name in names:
        by_config[name] = {seed: s for seed, s in by_config[name].items()
                           if seed in (*seeds, *repaired) and seed not in left_out}
    policies = list(runs[0]["policies"]) if runs else []
    unpaired = ({"every contrast": left_out} if left_out else
                {f"{a} - {b}": pairing.unpaired_seeds(by_config[a], by_config[b]) if cfg.pair_by_start else {}
                 for a, b, _ in contrasts})
    out = {"ran": ran, "unpaired": {c: u for c, u in unpaired.items() if u}, "repair": list(repair),
           "repaired": list(repaired), "rows": [], "missing": [], "at_cost": [], "admission": [], "described": [],
           "sharing": []}
    if not policies or min(ran.values()) < len(seeds) or (in_place and repaired != repair):
        return out
    rows, tested = [], []
    for a, b, rule in contrasts:
        for policy in policies:
            differences = ma.paired_differences(by_config[a], by_config[b], policy, "auc", cfg.pair_by_start)
            if len(differences) < 2:
                out["missing"].append(f"{a} - {b} ({policy})")
                continue
            rows.append({**ma.contrast_row(a, b, policy, differences, cfg), "rule": rule})
            tested.append((a, b, policy))
    # a contrast without two paired seeds stays in Holm's family at p = 1, so the family is the registered one
    ma.holm_family(rows, cfg, absent=len(out["missing"]))
    for row in rows:
        called(row)
    out["rows"] = rows
    out["at_cost"] = [{"contrast": f"{a} - {b}", "policy": policy,
                       **{view: ma.contrast_row(a, b, policy, ma.paired_differences(
                           by_config[a], by_config[b], policy, view, cfg.pair_by_start), cfg) for view in COST_VIEWS}}
                      for a, b, policy in tested]
    out["admission"] = [(name, policy, got) for name in names for policy in policies
                        if (got := ma.admission(list(by_config[name].values()), policy))]
    out["described"] = [ma.contrast_row(a, b, policy, ma.paired_differences(
        by_config[a], by_config[b], policy, "auc", cfg.pair_by_start), cfg)
        for a, b in described for policy in policies]
    out["sharing"] = [{"configuration": name, "policy": policy, **{key: shared_by(list(by_config[name].values()),
                                                                              policy, key) for key in sharing}}
                      for name in names for policy in policies] if sharing else []
    return out


def shared_by(runs: list[dict], policy: str, key: str) -> tuple[float, float] | None:
    """The mean and SD over runs of what `policy` received per iteration by the sharing metric `key`; None where a
    run did not log it (a configuration that does not share that way)."""
    logged = [s["policies"][policy]["crossed"] for s in runs]
    return ma.mean_sd([c[key] for c in logged]) if all(key in c for c in logged) else None


def seeds_owed(by_config: dict[str, dict[int, dict]], seeds: tuple[int, ...]) -> tuple[list[int], dict[int, str]]:
    """The seeds a family that replaces an unpaired seed whole reads: its registered seeds and, for each seed whose
    runs did not all start from the same weights, the next fresh seed (read in turn); and seed -> why for each
    unpaired one, naming every run that started otherwise than the first configuration's."""
    first, *others = by_config

    def unpaired(seed: int) -> str | None:
        if not all(seed in by_config[name] for name in by_config):
            return None
        return "; ".join(why for name in others
                         if (why := pairing.unpaired_reason(by_config[first][seed], by_config[name][seed])))
    return pairing.with_fresh_seeds(seeds, unpaired)


def load_sets(root: Path) -> dict[str, list[dict]]:
    """set -> its summaries, for each set folder of the matrix under `root` that holds any (analysis/matrix.py, load
    checks each), refused where the folders' commits span more than one class of metric-equivalent commits (the
    declarations of every folder read together); for each family's set registered on its own (not named
    matrix*), its folder's summaries, at one class of commits of their own; and H3's sets (h3.SETS), at one
    class of commits of their own over all four; the last two at their registered commit's class (REGISTERED_AT)."""
    matrix = [f for f in sorted(Path(root).glob("matrix*")) if f.is_dir() and f.name != "matrix-main"]
    folders = [f for f in matrix if any(ma.is_summary(p) for p in f.glob("*.json"))]
    if not folders:
        raise FileNotFoundError(f"no matrix summaries under {root} (results/matrix, results/matrix-*)")
    declarations = [f / ma.EQUIVALENCE_FILE for f in matrix]
    sets = one_class({f.name: ma.load(f, declarations=declarations) for f in folders}, declarations,
                     "the matrix's sets")
    for name in {set_name for set_name, _, _ in FAMILIES.values()} - {f.name for f in matrix}:
        folder = Path(root) / name      # a set registered on its own: its commits are a class of their own
        if any(ma.is_summary(p) for p in folder.glob("*.json")):
            sets |= one_class({name: ma.load(folder)}, [folder / ma.EQUIVALENCE_FILE], f"set {name}",
                              REGISTERED_AT.get(name))
    h3_folders = [Path(root) / name for name in h3.SETS.values()]     # H3's four sets: one class of their own
    h3_declarations = [f / ma.EQUIVALENCE_FILE for f in h3_folders]
    return sets | one_class({f.name: ma.load(f, declarations=h3_declarations) for f in h3_folders
                             if any(ma.is_summary(p) for p in f.glob("*.json"))}, h3_declarations, "H3's sets",
                            REGISTERED_AT["h3"])


def one_class(sets: dict[str, list[dict]], declarations: list[Path], what: str, registered: str | None = None
              ) -> dict[str, list[dict]]:
    """The sets, refused where their commits span more than one class of metric-equivalent commits (the
    declarations read together), or, given the commit their registration names, a class without it."""
    classes = ma.equivalence_classes(declarations)
    commits = sorted({c for runs in sets.values() for s in runs for c in s["commits"]})
    if len({classes.get(c, c) for c in commits}) > 1:
        raise ValueError(f"{what} ran at commits {commits}, not declared metric-equivalent in "
                         f"{ma.EQUIVALENCE_FILE}; rerun them at one commit or declare them there")
    if registered and commits and classes.get(commits[0], commits[0]) != classes.get(registered, registered):
        raise ValueError(f"{what} ran at {commits}, not at its registered {registered[:7]} nor at a commit declared "
                         f"metric-equivalent to it in {ma.EQUIVALENCE_FILE} (benchmarks/same_metrics.py)")
    return sets


def training_seconds(runs: list[dict], seeds: range, contrasts: tuple) -> dict[str, dict[int, float]]:
    """Each configuration of a family that ran: its training seconds (the run's wall time of its iterations) per
    seed of the family, what the registration sets beside the contrasts untested (a cost, not an outcome)."""
    names = dict.fromkeys(name for a, b, _ in contrasts for name in (a, b))
    out = {name: {s["seed"]: s["iteration_s"] for s in runs if s["configuration"] == name and s["seed"] in seeds}
           for name in names}
    return {name: dict(sorted(seconds.items())) for name, seconds in out.items() if seconds}


def analyze(sets: dict[str, list[dict]], cfg: ma.AnalysisConfig = ma.AnalysisConfig(),
            records: dict[int, dict] | None = None) -> dict:
    families = {}
    for block, (set_name, seeds, contrasts) in FAMILIES.items():
        runs = sets.get(set_name, [])
        called = family(runs, tuple(seeds), contrasts, cfg, REPAIRS.get(block, ()), block in IN_PLACE,
                        DESCRIBED.get(block, ()), SHARING.get(block, ()))
        families[block] = {"set": set_name, "seeds": [seeds.start, seeds.stop - 1], **called,
                           "seconds": training_seconds(runs, (*seeds, *called["repaired"]), contrasts)}
        for row in families[block]["rows"]:
            row["underpowered"] = any(b == block and c in (None, row["contrast"]) and p == row["policy"]
                                      for b, c, p in UNDERPOWERED)

    def waiting(blocks: tuple[str, ...]) -> list[str]:
        return [b for b in blocks if not families[b]["rows"]]
    return {"config": ma.asdict(cfg), "families": families, "h4": h4.analyze(sets, waiting(H4_WAITS)),
            "h5": h5.analyze(sets.get("matrix", []), cfg, waiting(H5_WAITS), records), "h3": h3.analyze(sets, cfg)}


def unpaired_lines(unpaired: dict[str, dict[int, str]], repaired: list[int], repair: list[int], owed: bool
                   ) -> list[str]:
    """The notes under a family's table: each contrast's unpaired seeds with why (left out), and its repair or,
    where the family owes a fresh seed in place of each unpaired one, those owed."""
    lines = [f"\nUnpaired, left out of {contrast}: " + "; ".join(f"seed {seed} ({why})" for seed, why in seeds.items())
             + "." for contrast, seeds in unpaired.items()]
    if repair:
        what = ("Owed in place of the unpaired" if owed else "Repair (results/preregistration-repair.md)")
        waiting = "not yet all in, so not called." if owed else "not yet in."     # a repair waits for no call
        lines.append(f"{what}: fresh seed {', '.join(map(str, repair))} run in full; "
                     + ("in, so read above." if repair == repaired else waiting))
    return lines


def heading(block: str, f: dict) -> str:
    """A family's heading: its set, its registered seeds and the repair (or owed) seeds it reads."""
    seeds = f"seed{'s' * (len(f['repaired']) > 1)} {', '.join(map(str, f['repaired']))}"
    repair = f", and {'owed' if block in IN_PLACE else 'repair'} {seeds}" if f["repaired"] else ""
    return f"## {block} (set {f['set']}, registered seeds {f['seeds'][0]}-{f['seeds'][1]}{repair})\n"


def markdown(result: dict) -> str:
    lines = ["# The matrix, blocks 2-6: the analysis of its run summaries\n",
             "Primary metric: area under the held-out greedy curve, points; paired differences seed by seed, "
             "Holm within each family (results/preregistration-matrix.md); two runs of a seed paired only where they "
             "started from the same weights (results/preregistration-repair.md). Each contrast is called by its "
             "registered rule (the bootstrap p with Holm, the percentile interval) and again at its n "
             "(results/reporting-rule.md: Holm over the family's exact sign-flip p-values, the t interval); the "
             "verdict reported is the word both give.\n"]
    for block, f in result["families"].items():
        seeds = f["seeds"][1] - f["seeds"][0] + 1
        lines.append(heading(block, f))
        if f["rows"]:
            lines += ["| contrast | policy | per-seed difference | mean | SD | 95% interval | t interval | p "
                      "| sign-flip p | Holm p | interval at Holm's level | sign-flip Holm p | registered verdict "
                      "| verdict at n | reported |", "|---" * 15 + "|"]
        for r in f["rows"]:
            per_seed = " ".join(f"{seed}: {d:+.2f}" for seed, d in r["differences"].items())
            (low, high), (h_low, h_high) = r["interval"], r["holm_interval"]
            t_low, t_high = r["t_interval"]
            underpowered = " (underpowered, as registered)" if r["underpowered"] else ""
            lines.append(f"| {r['contrast']} | {r['policy']} | {per_seed} | {r['mean']:+.2f} | {r['sd']:.2f} "
                         f"| [{low:+.2f}, {high:+.2f}] | [{t_low:+.2f}, {t_high:+.2f}] | {r['p']:.4f} "
                         f"| {stats.p_text(r['sign_flip_p'])} | {r['holm_p']:.4f} | [{h_low:+.2f}, {h_high:+.2f}] "
                         f"| {stats.p_text(r['exact_holm_p'])} | {r['verdict']}{underpowered} | {r['verdict_at_n']} "
                         f"| {r['reported']}{underpowered} |")
        if not f["ran"]:
            lines.append("No run of this set yet.")
        elif f["missing"]:
            lines.append("Fewer than two paired seeds, so not tested (each counts at p = 1 in Holm's family): "
                         + ", ".join(f["missing"]) + ".")
        elif not f["rows"]:
            lines.append(f"Incomplete, so not called and no outcome shown (a block is called once both sides of "
                         f"every contrast ran on all {seeds} seeds{' and every seed owed' * (block in IN_PLACE)}); "
                         f"seeds run so far: "
                         + ", ".join(f"{h} {n}" for h, n in f["ran"].items()) + ".")
        lines += unpaired_lines(f["unpaired"], f["repaired"], f["repair"], block in IN_PLACE)
        if f["at_cost"]:
            lines += ["\nAt equal cost (not tested): each run read up to the cost the cheaper run of its seed spent.\n",
                      "| contrast | policy | " + " | ".join(COST_VIEWS) + " |", "|---" * (2 + len(COST_VIEWS)) + "|"]
            lines += [f"| {r['contrast']} | {r['policy']} | " + " | ".join(
                f"{r[v]['mean']:+.2f} [{r[v]['interval'][0]:+.2f}, {r[v]['interval'][1]:+.2f}]" for v in COST_VIEWS)
                + " |" for r in f["at_cost"]]
        if f["described"]:
            lines += ["\nDescribed on the same seeds (not tested, not in Holm's family).\n",
                      "| contrast | policy | mean | SD | 95% interval |", "|---" * 5 + "|"]
            lines += [f"| {r['contrast']} | {r['policy']} | {r['mean']:+.2f} | {r['sd']:.2f} "
                      f"| [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}] |" for r in f["described"]]
        if f["sharing"]:
            keys = [k for k in f["sharing"][0] if k not in ("configuration", "policy")]
            lines += ["\nShared per iteration, mean ± SD over seeds (not tested).\n",
                      "| configuration | into | " + " | ".join(keys) + " |", "|---" * (2 + len(keys)) + "|"]
            lines += [f"| {r['configuration']} | {r['policy']} | "
                      + " | ".join(ma.ms(r[k]) if r[k] is not None else "—" for k in keys) + " |"
                      for r in f["sharing"]]
        if f["admission"]:
            lines += ["\nThe curator's admissions on the family's seeds, per iteration, mean ± SD over seeds.",
                      *ma.admission_table(f["admission"])]
        if f["seconds"]:
            lines.append("\nTraining seconds per seed (not tested): " + "; ".join(
                f"{name} " + ", ".join(f"{s} {v:.0f}" for s, v in per_seed.items())
                for name, per_seed in f["seconds"].items()) + ".")
        lines.append("")
    lines += [*h4.markdown(result["h4"], H4_WAITS)]
    lines += ["", *h5.markdown(result["h5"]), "", *h3.markdown(result["h3"])]
    return "\n".join(lines) + "\n"


def report(root: Path, cfg: ma.AnalysisConfig = ma.AnalysisConfig()) -> str:
    """The blocks' analysis of the summaries under `root`: blocks.md, blocks.json and, once H5 is computed,
    h5-plane.png written in root/matrix."""
    result = analyze(load_sets(root), cfg, h5.load_records(Path(root) / "matrix"))
    text = markdown(result)
    out = Path(root) / "matrix"
    out.mkdir(exist_ok=True)
    (out / "blocks.md").write_text(text)
    (out / "blocks.json").write_text(json.dumps(result, indent=1))
    if any(h["points"] for h in result["h5"]):
        plots.h5_plane(result["h5"], out / "h5-plane.png")
    return text
