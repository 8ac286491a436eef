"""The fidelity record: what curation writes per offered trajectory (fidelity.jsonl) and per receiver and iteration
(the fidelity/ metrics), and the report that reads a run's record back (report.md's fidelity section). It keeps the
proposal's hotspots (§1.1-1.3: drift steps, high phantom advantage P_k, high D_RSD(k)) beside the §2.1 decision.

A record holds the decision with its reasons, the terms raw and scaled, where the repairs acted on a crossing (the
credit of its steps and of the separators and EOS that close them, and the proposal's phantom advantage of the
credit carried), and each step with its values and the terms it is a hotspot of. The report also measures how the
decision depends on each term (`sensitivity`): what moving the term across its range does to the bands, and how
many offers sit where the term is saturated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

import boundary_drift
import reachability
import term_scales
import tokalign
from diagnosis import TERMS, CuratorConfig, Diagnosis, Offer
from sharing import LEVELS
from testbed import checkpoint

OUTCOMES = (*LEVELS, "rejected", "inert")   # where an offered trajectory can go; inert: no level could use it
SATURATED = 1 - 1e-3                        # a step value at or above it is at its cap


def hotspot_steps(diagnosis: Diagnosis) -> dict[str, list[int]]:
    """Steps flagged per term: a straddled or unreproduced step (TBD > 0), R_k < 1/2 (beyond the receiver's own
    calibration quantile), a drift bound above 1/2."""
    out = {"tbd": (diagnosis.tbd > 0).nonzero().flatten().tolist(),
           "rsd": (torch.nan_to_num(diagnosis.rsd) > 0.5).nonzero().flatten().tolist()}
    out["ccm"] = reachability.ccm_hotspots(1 - diagnosis.reach, 0.5) if diagnosis.reach is not None else []
    return out


def offer_record(offer: Offer, scored: dict | None, level: str, crossed: str, reason: str, credit: dict | None,
                 theta: tuple[float, float] | None, predicted: int, prob: float, skipped: bool) -> dict:
    """One line of fidelity.jsonl: the decision with its reasons, the score (D, the band of the diagnosis, the
    terms raw and scaled; none for an inert or skipped offer), the thresholds (None before the receiver's
    calibration sample holds an offer), where the repairs acted on a crossing (diagnosis.credit_record), each
    step with its values and the terms it is a hotspot of, and the offer's density-ratio signals where a ranked
    admission measured them."""
    d = offer.diagnosis
    hot = hotspot_steps(d)
    sent = offer.source_encoding.data
    text = sent.decode("utf-8", errors="replace")
    steps = [{"text": sent[a:b].decode("utf-8", errors="replace"), "tbd": d.tbd[k].item(),
              "ccm": None if d.reach is None else 1 - d.reach[k].item(),
              "rsd": None if math.isnan(d.rsd[k].item()) else d.rsd[k].item(),
              "hot": [t for t in TERMS if k in hot[t]]} for k, (a, b) in enumerate(offer.steps)]
    return {"source": offer.source.policy.name, "index": offer.index, "prompt": offer.prompt_index,
            "reward": offer.reward, "advantage": offer.advantage, "level": level, "crossed": crossed, "reason": reason,
            "repairs": [],
            **(credit or {}), "theta": list(theta) if theta else None,
            "predicted": LEVELS[predicted] if predicted >= 0 else None,
            "predicted_prob": prob, "skipped": skipped, "tbd_jaccard": offer.jaccard,
            **(scored or {}), "text": text, "steps": steps,
            "tbd_bytes": tbd_bytes(offer), **({"ratios": offer.ratios} if offer.ratios is not None else {})}


def tbd_bytes(offer: Offer) -> list[tuple[int, int]]:
    """Byte spans, in the source's bytes, of the TBD hotspot tokens: groups the receiver could not reproduce, and
    the token of the side that straddles a step boundary the other side does not (a receiver token's bytes taken
    back to the source's where re-encoding changed them)."""
    spans = [span for span, ok in zip(offer.alignment.span, offer.alignment.exact) if not ok and span[1] > span[0]]
    src, tgt = offer.source_encoding, offer.receiver_encoding
    at_receiver = tokalign.in_target(src, tgt, offer.steps)
    to_source = tokalign.target_positions_in_source(src.data, tgt.data)
    for k, side in boundary_drift.boundary_hotspots(src, tgt, offer.steps):
        if side == "source":
            last = offer.steps[k][1] - 1
            spans += [(a, b) for a, b in src.offsets if a <= last < b]
        else:
            last = at_receiver[k][1] - 1
            spans += [(to_source[a], to_source[b]) for a, b in tgt.offsets if a <= last < b]
    return sorted(spans)


def fidelity_metrics(records: list[dict], thetas: dict[str, tuple[float, float]], predictor_accuracy: float | None
                     ) -> dict[str, float]:
    """One receiver's iteration under fidelity/: the share of offers that could matter, admission shares among
    them, mean D and terms (diagnosed trajectories), repairs, step-level co-occurrence of hotspots, the predictor,
    the thresholds per source."""
    live = [r for r in records if r["level"] != "inert"]
    out = {"fidelity/offered": float(len(records)), "fidelity/could_matter": len(live) / max(len(records), 1)}
    for level in OUTCOMES[:-1]:
        out[f"fidelity/admitted_{level}" if level != "rejected" else "fidelity/rejected"] = \
            sum(r["level"] == level for r in live) / max(len(live), 1)
    scored = [r for r in live if "D" in r]
    for key, values in (("d", [r["D"] for r in scored]), ("tbd_jaccard", [r["tbd_jaccard"] for r in scored]),
                        *((t, [r["terms"][t] for r in scored if not math.isnan(r["terms"][t])]) for t in TERMS)):
        if values:
            out[f"fidelity/{key}_mean"] = sum(values) / len(values)
    for t in TERMS:
        out[f"fidelity/repairs_{t}"] = float(sum(t in r["repairs"] for r in records))
    steps = [s for r in scored for s in r["steps"]]
    if steps:
        out["fidelity/hotspot_cooccurrence"] = sum(len(s["hot"]) >= 2 for s in steps) / len(steps)
    out["fidelity/predictor_skips"] = float(sum(r.get("skipped", False) for r in records))
    if predictor_accuracy is not None:
        out["fidelity/predictor_accuracy"] = predictor_accuracy
    for source, (t1, t2) in thetas.items():
        out[f"fidelity/theta1/{source}"], out[f"fidelity/theta2/{source}"] = t1, t2
    return out


def sensitivity(records: list[dict], weights: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per term with a weight, over the diagnosed records: `moved`, the share of offers whose band differs between
    the term set to its 10th and to its 90th percentile (scaled, over these offers) with the others and each
    offer's thresholds kept; and `saturated`, the share whose term could not get worse: at the top of its scale,
    or every step at its cap."""
    scored = [r for r in records if "D" in r]
    out = {}
    for t, w in weights.items():
        mine = [r for r in scored if not math.isnan(r["scaled"][t])]
        if not w or not mine:
            continue
        q10, q90 = torch.quantile(torch.tensor([r["scaled"][t] for r in mine], dtype=torch.float64),
                                  torch.tensor([0.1, 0.9], dtype=torch.float64)).tolist()
        moved = sum(term_scales.admission_band(r["D"] + w * (q10 - r["scaled"][t]), *r["theta"])
                    != term_scales.admission_band(r["D"] + w * (q90 - r["scaled"][t]), *r["theta"]) for r in mine)
        saturated = sum(r["scaled"][t] >= SATURATED or all(s[t] is not None and s[t] >= SATURATED for s in r["steps"])
                        for r in mine)
        out[t] = {"offers": len(mine), "p10": q10, "p90": q90, "moved": moved / len(mine),
                  "saturated": saturated / len(mine)}
    return out


def band_shares(records: list[dict]) -> dict[tuple[str, str], list[float]]:
    """Per source -> receiver, the share of its diagnosed offers in each band of the diagnosis (PRP, XGRPO, SGT)."""
    out: dict[tuple[str, str], list[float]] = {}
    for pair in sorted({(r["source"], r["receiver"]) for r in records if "band" in r}):
        bands = [r["band"] for r in records if "band" in r and (r["source"], r["receiver"]) == pair]
        out[pair] = [bands.count(b) / len(bands) for b in range(len(LEVELS))]
    return out


def direction_terms(records: list[dict]) -> dict[str, dict]:
    """Per "source->receiver" direction, over its diagnosed offers: their count, each term's mean raw value (all in
    [0, 1]; NaN where no offer has it, as under an ablation) and the share of offers each term dominates in D.
    What H4 reads: which degradation dominates where."""
    scored = [r for r in records if "D" in r]
    out = {}
    for src, rcv in sorted({(r["source"], r["receiver"]) for r in scored}):
        mine = [r for r in scored if (r["source"], r["receiver"]) == (src, rcv)]
        raw = {t: [r["terms"][t] for r in mine if r["terms"][t] is not None and not math.isnan(r["terms"][t])]
               for t in TERMS}
        out[f"{src}->{rcv}"] = {"diagnosed": len(mine),
                                "terms": {t: sum(v) / len(v) if v else math.nan for t, v in raw.items()},
                                "dominant": {t: sum(r["dominant"] == t for r in mine) / len(mine) for t in TERMS}}
    return out


def run_weights(config: dict) -> dict[str, float]:
    """A run's term weights, 0 for an ablated term, from its config.json."""
    lambdas = tuple(config.get("fidelity_lambdas", CuratorConfig.lambdas))
    return dict(zip(TERMS, term_scales.weights(tuple(config.get("ablate", ())), lambdas).tolist()))


def quantiles(values: list[float]) -> str:
    """'mean (p10 / p50 / p90)' of a list, '—' when empty."""
    if not values:
        return "—"
    q = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return f"{sum(values) / len(values):.3f} ({q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f})"


def marked_text(record: dict) -> str:
    """A trajectory's steps, one per line, with each step's terms and the terms it is a hotspot of; the TBD
    hotspot tokens bracketed as [[...]] in the text."""
    data = record["text"].encode("utf-8")
    marks = sorted({tuple(span) for span in record.get("tbd_bytes", [])})
    text, at = b"", 0
    for a, b in marks:
        if a >= at:
            text += data[at:a] + b"[[" + data[a:b] + b"]]"
            at = b
    lines = [f"    {(text + data[at:]).decode('utf-8', errors='replace')!r}"]
    for k, step in enumerate(record["steps"]):
        values = "  ".join(f"{t} {step[t]:.2f}" if step[t] is not None else f"{t} —" for t in TERMS)
        hot = f"  <- {', '.join(t.upper() for t in step['hot'])} hotspot" if step["hot"] else ""
        lines.append(f"    step {k}: {step['text']!r:<28} {values}{hot}")
    return "\n".join(lines)


def read_records(run_dir: Path) -> list[dict]:
    """Every record of a run's fidelity.jsonl, a torn last line (a run stopped mid-write) left out as in its
    metrics.jsonl."""
    return [record for _, record in checkpoint.metric_lines(Path(run_dir) / "fidelity.jsonl")]


def curation_summary(run_dir: Path) -> str:
    """A few lines of what the curator did over a run, per source -> receiver: its offers, how many were admitted
    at each level, rejected and inert, how many crossed as verified rescues, and the mean of each raw term over the
    diagnosed ones; then where the fidelity report, with its hotspots, and the record are."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    lines = [f"curation over {max((r['iteration'] for r in records), default=0)} iterations, per source -> receiver:"]
    for src, rcv in sorted({(r["source"], r["receiver"]) for r in records}):
        mine = [r for r in records if (r["source"], r["receiver"]) == (src, rcv)]
        count = {outcome: sum(r["level"] == outcome for r in mine) for outcome in OUTCOMES}
        rescued = sum("a verified rescue" in r["reason"] for r in mine)
        means = {t: [r["terms"][t] for r in mine if "terms" in r and r["terms"][t] is not None
                     and not math.isnan(r["terms"][t])] for t in TERMS}
        lines.append(f"  {src} -> {rcv}: {len(mine)} offers; admitted "
                     + ", ".join(f"{level.upper()} {count[level]}" for level in LEVELS)
                     + f"; rejected {count['rejected']}; inert {count['inert']}; rescued {rescued}; mean "
                     + ", ".join(f"{t.upper()} {sum(v) / len(v):.3f}" if v else f"{t.upper()} -"
                                 for t, v in means.items()))
    lines.append(f"fidelity report, its most degraded trajectories' hotspots marked: {run_dir / 'report.md'}; every "
                 f"decision: {run_dir / 'fidelity.jsonl'}")
    return "\n".join(lines)


def fidelity_report(run_dir: Path, worst: int = 5, windows: int = 4) -> str:
    """The curator's record of a cross-fidelity run (fidelity.jsonl): D and its terms per source -> receiver
    pair, which term dominates, how the decision depends on each term, admission shares over time, the
    predictor, and the worst trajectories marked."""
    records = read_records(run_dir)
    scored = [r for r in records if "D" in r]
    pairs = sorted({(r["source"], r["receiver"]) for r in records})
    path = Path(run_dir) / "config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    out = ["## Fidelity (cross-fidelity curation)\n",
           f"Terms are raw in [0, 1]; D = sum lambda_i scaled_i, each term scaled by its distribution over the "
           f"receiver's diagnosed offers of its last {config.get('calibration_window', '?')} iterations "
           f"(calibration: {config.get('calibration', 'window')}; none = raw); fidelity = 1 - D. TBD is the "
           f"{config.get('tbd_measure', 'credit')} measure (boundary_drift.py); tbd_jaccard is the byte-boundary "
           "measure, shown for comparison. Cells: mean (p10 / p50 / p90) over diagnosed trajectories. "
           f"Admission: {config.get('admission', 'diagnosis')}.\n",
           "| source -> receiver | offered | could matter | diagnosed | D | TBD | CCM | RSD | tbd_jaccard "
           "| dominant term (share) | bands of D: PRP / XGRPO / SGT |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    shares = band_shares(records)
    for src, rcv in pairs:
        offered = [r for r in records if (r["source"], r["receiver"]) == (src, rcv)]
        mine = [r for r in scored if (r["source"], r["receiver"]) == (src, rcv)]
        terms = {t: [r["terms"][t] for r in mine if r["terms"][t] is not None and not math.isnan(r["terms"][t])]
                 for t in TERMS}
        dominant = {t: sum(r["dominant"] == t for r in mine) / max(len(mine), 1) for t in TERMS}
        live = sum(r["level"] != "inert" for r in offered) / max(len(offered), 1)
        out.append(f"| {src} -> {rcv} | {len(offered)} | {live:.0%} | {len(mine)} | "
                   f"{quantiles([r['D'] for r in mine])} | "
                   + " | ".join(quantiles(terms[t]) for t in TERMS)
                   + f" | {quantiles([r['tbd_jaccard'] for r in mine])} | "
                   + ", ".join(f"{t.upper()} {v:.0%}" for t, v in dominant.items())
                   + " | " + " / ".join(f"{s:.0%}" for s in shares.get((src, rcv), [])) + " |")
    out += ["\nHow the decision depends on each term (diagnosed offers): moved = the share whose band differs "
            "between the term at its 10th and at its 90th percentile, the others kept; saturated = the share whose "
            "term could not get worse (at the top of its scale, or every step at its cap). CCM's floor, a "
            "step as typical as the receiver's own counting as fully reachable, is not a cap.\n",
            "| source -> receiver | term | offers | p10 -> p90 (scaled) | moved | saturated |",
            "|---|---|---|---|---|---|"]
    for src, rcv in pairs:
        mine = [r for r in scored if (r["source"], r["receiver"]) == (src, rcv)]
        for t, s in sensitivity(mine, run_weights(config)).items():
            out.append(f"| {src} -> {rcv} | {t.upper()} | {s['offers']} | {s['p10']:.2f} -> {s['p90']:.2f} "
                       f"| {s['moved']:.0%} | {s['saturated']:.0%} |")
    last = max((r["iteration"] for r in records), default=0)
    edges = sorted({round(last * i / windows) for i in range(windows + 1)})
    out += ["\nAdmission shares over time (all offered trajectories; inert: no level could use them):\n",
            "| source -> receiver | iterations | " + " | ".join(OUTCOMES) + " | skipped by predictor |",
            "|---|---|" + "---|" * (len(OUTCOMES) + 1)]
    for src, rcv in pairs:
        for lo, hi in zip(edges, edges[1:]):
            mine = [r for r in records if (r["source"], r["receiver"]) == (src, rcv) and lo < r["iteration"] <= hi]
            if mine:
                out.append(f"| {src} -> {rcv} | {lo + 1}-{hi} | "
                           + " | ".join(f"{sum(r['level'] == lv for r in mine) / len(mine):.0%}" for lv in OUTCOMES)
                           + f" | {sum(bool(r.get('skipped')) for r in mine) / len(mine):.0%} |")
    crossed = [r for r in records if "carried" in r and r["carried"] != 0]
    if crossed:
        out += ["\nWhere the repairs acted on what crossed as tokens (credit per unit of the carried advantage A; "
                "separators and EOS close the step before them):\n",
                "| source -> receiver | crossed | steps' credit / A | separators' and EOS credit / A "
                "| phantom advantage mean_k abs(A) (1 - R_k) |", "|---|---|---|---|---|"]
        for src, rcv in pairs:
            mine = [r for r in crossed if (r["source"], r["receiver"]) == (src, rcv)]
            steps = [c / r["carried"] for r in mine for c in r["step_credit"]]
            outside = [c / r["carried"] for r in mine for c in r["outside_credit"]]
            phantom = [r["phantom"] for r in mine if r["phantom"] is not None]
            if mine:
                out.append(f"| {src} -> {rcv} | {len(mine)} | {quantiles(steps)} | {quantiles(outside)} "
                           f"| {quantiles(phantom)} |")
    out.append(f"\nThe {worst} most degraded distinct trajectories ([[...]]: TBD hotspot tokens; a group's "
               "repeated samples shown once):\n")
    distinct = {(r["iteration"], r["source"], r["receiver"], r["prompt"], r["text"]): r for r in scored}
    for r in sorted(distinct.values(), key=lambda r: -r["D"])[:worst]:
        out.append(f"- iteration {r['iteration']}, {r['source']} -> {r['receiver']}, reward {r['reward']:.0f}, "
                   f"D {r['D']:.3f} (dominant {r['dominant'].upper()}): "
                   f"{r['level']} ({r['reason']})\n```\n{marked_text(r)}\n```")
    return "\n".join(out) + "\n\n"
