"""CROSS-FIDELITY's curator: per-trajectory degradation and admission to a sharing level (proposal §2.1-2.2).

The degradation of a trajectory moved from a source policy to a receiver (DESIGN.md §4.1: the proposal's F grows
with degradation, so it is called D here and fidelity is 1 - D):
    D = l1 s_TBD(1 - S_TBD) + l2 s_CCM(P) + l3 s_RSD(D_RSD),      l1 + l2 + l3 = 1,
each term a mean over the trajectory's steps (diagnosis.py) put on one scale by its distribution over the receiver's
diagnosed offers of its last `calibration_window` iterations (term_scales.py), so equal weights give equal
influence. Admission is on the diagnosis D: D < theta1 PRP (its tokens, with repaired per-token credit and truncated
density ratios); theta1 <= D < theta2 XGRPO (its reward joins the receiver's group on that prompt); D >= theta2 SGT
(it crosses only as a verified success on a prompt the receiver's whole group failed), else rejected. The thresholds
give each level a third of the same offers, for the run's own weights, ablations included. Whatever crosses as
tokens is repaired (diagnosis.step_credit): admission reads the diagnosis, not what the repair leaves, because the
repairs cannot be scored honestly: the TBD repair does not undo the credit a straddling token mixes, and attenuating
an unreachable step removes its signal along with its harm (DESIGN.md §4.10). The levels nest: a verified rescue
crosses at every level.

An offer that could change nothing at any level is inert and is not diagnosed: every reward on its prompt, in the
receiver's group and in every peer's, is the same, so it carries no advantage, rescues nothing, and moves no baseline.
What each band lets cross, and the controls that band offers otherwise (`--admission random`, `--admission
ranked`), are admission.py's. §2.3 (threshold co-evolution, the fidelity predictor) is in coevolution.py.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

import torch

import coevolution
import diagnosis
import fidelity_record
import grpo
import reward_drift
import sharing
import term_scales
from admission import BAND_RULES, INERT, admit, crosses_tokens, inert_prompts, permuted_bands, ranked_bands
from diagnosis import TERMS, CuratorConfig, Offer, ReceiverSide, with_diagnoses
from sharing import LEVELS
from term_scales import admission_band
from testbed import arith, policies, tasks


# ---------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------

def degradation(terms: torch.Tensor, weights: torch.Tensor) -> float:
    """D = sum_i lambda_i term_i; terms [3] in [0, 1], NaN for an ablated term (its weight is 0)."""
    return float((torch.nan_to_num(terms, nan=0.0) * weights).sum())


@dataclass(frozen=True)
class Score:
    """A trajectory's degradation D, the band it gives (0 PRP, 1 XGRPO, 2 SGT), the term with the largest weighted
    share, and the terms raw (in [0, 1], NaN where ablated) and on the calibration sample's scale."""

    D: float
    band: int
    dominant: str
    terms: dict[str, float]
    scaled: dict[str, float]


def score(offer: Offer, cfg: CuratorConfig, theta: tuple[float, float],
          calibration: term_scales.Calibration | None) -> Score:
    """§2.1 for one offer: D = sum_i lambda_i s_i(term_i), and the band it gives under `theta`. term_i: the
    diagnosis's three terms (Diagnosis.terms: mean TBD, mean 1 - R_k, mean RSD bound); s_i: each on the scale of
    the receiver's calibration sample (term_scales.Calibration.scaled; the raw term without a calibration);
    lambda_i: the weights (--fidelity-lambdas, 0 for an ablated term)."""
    terms = offer.diagnosis.terms(cfg)                                                           # [3]
    scaled = calibration.scaled(terms) if calibration is not None else terms                     # [3] s_i(term_i)
    weights = cfg.weights                                                                        # [3] lambda_i
    d = degradation(scaled, weights)
    dominant = TERMS[int((torch.nan_to_num(scaled) * weights).argmax())]
    return Score(d, admission_band(d, *theta), dominant, dict(zip(TERMS, terms.tolist())),
                 dict(zip(TERMS, scaled.tolist())))


def rank_values(offers: list[Offer], scores: list[Score | None], rank_by: str, rng: random.Random
                ) -> list[float | None]:
    """Each scored offer's value of the signal `rank_by` (diagnosis.RANK_SIGNALS), None for an offer not scored
    (inert): its D, a raw term, a density-ratio signal, its reward or advantage, or a uniform draw (chance, from
    `rng`)."""
    def value(o: Offer, s: Score) -> float:
        if rank_by == "d":
            return s.D
        if rank_by in TERMS:
            return s.terms[rank_by]
        if rank_by in diagnosis.RATIO_SIGNALS:
            assert o.ratios is not None, "ReceiverSide.offers measures the ratio signals a ranked admission orders by"
            return o.ratios[rank_by]
        return o.reward if rank_by == "reward" else o.advantage if rank_by == "advantage" else rng.random()
    return [None if s is None else value(o, s) for o, s in zip(offers, scores)]



class Side(Protocol):
    """One receiver's side of an iteration's curation, where its model is (diagnosis.ReceiverSide's steps, in the
    order `Curator._receive` calls them): a ReceiverSide in this process, or the receiver's worker in its Ray
    actor (train_ray.ActorSide), which forwards each step across the process boundary."""

    def offers(self, examples: list, stats: dict[str, reward_drift.StepStats]) -> tuple[list[Offer], list[dict]]: ...

    def reach(self, positions: list[int], window: list[torch.Tensor]
              ) -> tuple[list[diagnosis.Diagnosis], torch.Tensor]: ...

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats: reward_drift.StepStats
              ) -> tuple[dict[int, dict], sharing.Received]: ...


class Curator:
    """The curator across iterations: each policy's step statistics, each pair's recent degradation, each
    receiver's calibration sample, the thresholds (fixed or co-evolving) and the fidelity predictor. `exchange`
    curates one iteration."""

    def __init__(self, cfg: CuratorConfig, names: list[str], seed: int, bandit: coevolution.BanditConfig | None,
                 predictor: coevolution.PredictorConfig | None):
        self.cfg, self.seed = cfg, seed
        self.stats = {n: reward_drift.StepStats(cfg.step_window) for n in names}
        self.pairs = {(a, b): i for i, (a, b) in enumerate((a, b) for a in names for b in names if a != b)}
        self.recent_d_ccm = {pair: (0.0, 0.0) for pair in self.pairs}   # EMA of D and CCM per pair: predictor features
        # past iterations' own norms [S]; per iteration, its offers' terms
        self.own_norms: dict[str, deque[torch.Tensor]] = {n: deque(maxlen=cfg.reach_window - 1) for n in names}
        self.term_rows: dict[str, deque[list[tuple]]] = {n: deque(maxlen=cfg.calibration_window) for n in names}
        self.level0_thresholds: dict[str, tuple[float, float]] = {}         # receiver -> its last level-0 thresholds
        self.bandit = coevolution.ThresholdBandit(bandit, seed) if bandit else None
        self.predictor = (coevolution.FidelityPredictor(len(diagnosis.FEATURES) + len(self.pairs), predictor, seed)
                          if predictor else None)

    def __setstate__(self, state: dict) -> None:
        """A checkpoint's curator; one saved under the attributes' earlier names (base, recent) resumes too."""
        renamed = {"base": "level0_thresholds", "recent": "recent_d_ccm"}
        self.__dict__.update({renamed.get(k, k): v for k, v in state.items()})

    def level(self, source: str, receiver: str, gap: float) -> int:
        """How far the pair's thresholds are raised this cycle: the bandit's level, 0 with fixed thresholds."""
        return self.bandit.choose(source, receiver, gap) if self.bandit else 0

    def calibrate(self, receiver: str, rows: list[torch.Tensor]) -> term_scales.Calibration | None:
        """The iteration's diagnosed offers' raw terms (rows, each [3]) join the receiver's calibration sample; its
        scales (None: raw terms) and its level-0 thresholds (the given ones, else the share rule on the sample)."""
        cfg = self.cfg
        given = (cfg.theta1, cfg.theta2) if cfg.theta1 is not None and cfg.theta2 is not None else None
        if cfg.calibration == "none":
            assert given is not None, "CuratorConfig refuses calibration 'none' without both thresholds"
            self.level0_thresholds[receiver] = given
            return None
        window = self.term_rows[receiver]
        if rows:
            window.append([tuple(r.tolist()) for r in rows])
        sample = tuple(row for iteration in window for row in iteration)
        if not sample:
            return None
        scales = term_scales.Calibration(sample)
        self.level0_thresholds[receiver] = given if given is not None else scales.thresholds(cfg.weights)
        return scales

    def observe_update(self, receiver: str, update: dict[str, float]) -> None:
        """After the receiver's update: its statistics (losses/update_kl, losses/grad_norm) join the cycle the
        stability guard will judge (coevolution.ThresholdBandit)."""
        if self.bandit:
            self.bandit.updated(receiver, update)

    def judge(self, receiver: str, rewards: torch.Tensor) -> list[str] | None:
        """With the receiver's new rollouts' rewards [B, G]: the verdict on its last cycle (the signals that
        tripped the guard), which with the receiver's reward gain moves its pairs' thresholds; None with fixed
        thresholds or before the first update."""
        return self.bandit.judge(receiver, grpo.rewards_stats(rewards)) if self.bandit else None

    def exchange(self, experiences: list[sharing.Experience], task: tasks.Task, examples: list,
                 share: sharing.ShareConfig, iteration: int, sides: dict[str, Side] | None = None
                 ) -> tuple[dict[str, sharing.Received], list[dict]]:
        """Curate what every policy receives from every other one. examples [B]: the iteration's prompts' items.

        `sides`: each receiver's side of the curation (`Side`), by name, where its model is; by default made here
        (diagnosis.ReceiverSide), from the experiences' own policies. train.run passes its team's (Team.sides),
        which keep what their receivers train on (ReceiverSide.received); from a Ray actor, what returns here holds
        no crossings: those stay in the actor, which trains on them.

        Returns per receiver what it trains on (metrics under fidelity/ and sharing/) and one record per offered
        trajectory (fidelity.jsonl)."""
        started = time.perf_counter()
        for e in experiences:
            group = e.rollouts.group_size
            self.stats[e.policy.name].add_iteration(
                [s for i, text in enumerate(e.rollouts.texts)
                 for s in reward_drift.process_rewards(task, examples[i // group], text)])
        if self.cfg.measures_hidden_tbd and not sides:
            experiences = [e if e.hidden is not None else sharing.with_hidden_states(e) for e in experiences]
        stats_s = time.perf_counter() - started
        out, records = {}, []
        for receiver in experiences:
            peers = [e for e in experiences if e is not receiver]
            side: Side = (sides[receiver.policy.name] if sides
                          else ReceiverSide(receiver, peers, task, self.cfg, share))
            out[receiver.policy.name], its_records = self._receive(receiver, side, peers, examples, share, iteration)
            metrics = out[receiver.policy.name].metrics
            metrics["fidelity/time_s/statistics"] = stats_s / len(experiences)
            metrics["fidelity/time_s/curation"] += stats_s / len(experiences)
            records += its_records
        return out, records

    def _predict(self, receiver: sharing.Experience, offers: list[Offer], inert: list[bool],
                 gaps: dict[str, float], share: sharing.ShareConfig
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool], list[bool]]:
        """Features [N, F], the predicted band [N] and its probability [N], which predictions are sure enough to
        skip and may (their tokens would not cross at the band predicted: only these are audited, so the trust
        that lets them skip is measured on them), and which skip the expensive diagnosis (never an inert offer's,
        which is not diagnosed at all, nor any under the random control)."""
        n, name = len(offers), receiver.policy.name
        if not self.predictor or not offers:
            return torch.zeros(n, 0), torch.full((n,), -1), torch.zeros(n), [False] * n, [False] * n
        sources = [o.source.policy.name for o in offers]
        features = torch.stack([torch.cat([
            diagnosis.offer_features(o, self.cfg, self.recent_d_ccm[(source, name)], gaps[source]),
            torch.nn.functional.one_hot(torch.tensor(self.pairs[(source, name)]), len(self.pairs)).double()])
            for o, source in zip(offers, sources)])
        predicted, prob = self.predictor.predict(features)
        auditable, skipped = [], []
        for k, o in enumerate(offers):
            sure, skip = self.predictor.may_skip(name, prob[k].item()) if not inert[k] else (False, False)
            auditable.append(sure and not crosses_tokens(int(predicted[k]), o, receiver.rewards, share.success))
            # the random control may move any band into a level whose tokens cross
            skipped.append(skip and auditable[k] and self.cfg.admission == "diagnosis")
        return features, predicted, prob, auditable, skipped

    def _receive(self, receiver: sharing.Experience, side: Side, peers: list[sharing.Experience],
                 examples: list, share: sharing.ShareConfig, iteration: int) -> tuple[sharing.Received, list[dict]]:
        """The curation of one receiver, phase by phase: the receiver's side diagnoses every offer cheaply, the
        curator predicts which need no gradient norms, the receiver's side measures the rest, the curator scores
        them (D and its band), fits the predictor and admits, the receiver's side crosses what was admitted, and
        every offer is recorded."""
        name, timer = receiver.policy.name, PhaseTimer()
        with timer("diagnosis"):
            gaps = {p.policy.name: p.rewards.mean().item() - receiver.rewards.mean().item() for p in peers}
            levels = {source: self.level(source, name, gap) for source, gap in gaps.items()}
            offers, records = side.offers(examples, self.stats)
            inert_prompt = inert_prompts([receiver.rewards, *(p.rewards for p in peers)])         # [B]
            inert = [bool(inert_prompt[o.prompt_index]) for o in offers]
            for r in records:
                if inert_prompt[r["prompt"]]:
                    r.update(level="inert", reason=INERT)
        with timer("prediction"):
            features, predicted, prob, auditable, skipped = self._predict(receiver, offers, inert, gaps, share)
        with timer("gradnorms"):
            measured = [k for k, (skip, is_inert) in enumerate(zip(skipped, inert)) if not skip and not is_inert]
            offers = self._measure(name, side, offers, measured)
        with timer("scoring"):
            scales = self.calibrate(name, [offers[k].diagnosis.terms(self.cfg) for k in measured])
            thetas, scores = self._score(name, offers, measured, levels, scales)
            self._remember_pairs(name, offers, scores)
        with timer("predictor_fit"):
            self._fit_predictor(name, features, predicted, auditable, scores, measured)
        with timer("admission"):
            bands = [None if inert[k] else int(predicted[k]) if sc is None else sc.band for k, sc in enumerate(scores)]
            rng = random.Random(f"admission/{self.seed}/{iteration}/{name}")
            if self.cfg.admission == "random":
                bands = permuted_bands(bands, [o.source.policy.name for o in offers], rng)
            rules: tuple[str, ...] = BAND_RULES
            if self.cfg.admission == "ranked":
                values = rank_values(offers, scores, self.cfg.rank_by, rng)
                bands = ranked_bands(values, self.cfg.admit_share, diagnosis.RANK_SIGNALS[self.cfg.rank_by], rng)
                rules = (f"in the first {self.cfg.admit_share:.0%} by {self.cfg.rank_by}",)
            decisions, picks, advantages = admit(offers, bands, receiver, share, rules)
        with timer("crossing"):
            crossed, received = side.cross({k: a for k, (_, a) in picks.items()}, advantages, self.stats[name])
        records += self._records(name, offers, scores, bands, decisions, crossed, thetas, predicted, prob, skipped)
        for r in records:
            r.update(iteration=iteration, receiver=name)
        accuracy = self.predictor.accuracy(name) if self.predictor else None
        metrics = {**received.metrics, **fidelity_record.fidelity_metrics(records, thetas, accuracy),
                   **{f"fidelity/threshold_level/{source}": float(level) for source, level in levels.items()
                      if self.bandit},
                   **{f"fidelity/time_s/{phase}": t for phase, t in timer.seconds.items()},
                   "fidelity/time_s/curation": sum(timer.seconds.values())}
        return sharing.Received(received.advantages, received.crossings, metrics), records

    def _measure(self, name: str, side: Side, offers: list[Offer], measured: list[int]) -> list[Offer]:
        """`offers` with those at `measured` diagnosed in full: their gradient norms, R calibrated on the receiver's
        own norms of its last `reach_window` iterations, this one's and the `reach_window - 1` before it kept in
        `own_norms`, which this one's then join."""
        window = self.own_norms[name]
        diagnoses, own = side.reach(measured, list(window))
        if own.numel():
            window.append(own)
        return with_diagnoses(offers, dict(zip(measured, diagnoses)))

    def _score(self, name: str, offers: list[Offer], measured: list[int], levels: dict[str, int],
               scales: term_scales.Calibration | None) -> tuple[dict[str, tuple[float, float]], list[Score | None]]:
        """Each source's thresholds this cycle (the receiver's level-0 ones raised by the pair's level), and the
        score of each measured offer (None for the others) on the receiver's calibration `scales`."""
        step = self.bandit.cfg.step if self.bandit else 0.0
        base = self.level0_thresholds.get(name)
        thetas = ({source: (base[0] + level * step, base[1] + level * step) for source, level in levels.items()}
                  if base is not None else {})
        scores: list[Score | None] = [None] * len(offers)
        for k in measured:
            scores[k] = score(offers[k], self.cfg, thetas[offers[k].source.policy.name], scales)
        return thetas, scores

    def _remember_pairs(self, name: str, offers: list[Offer], scores: list[Score | None]) -> None:
        """Each scored offer moves its pair's recent D and CCM (exponential moving averages, the predictor's
        features), in the offers' order."""
        for o, s in zip(offers, scores):
            if s is not None:
                pair = (o.source.policy.name, name)
                ccm = s.terms["ccm"] if math.isfinite(s.terms["ccm"]) else 0.0
                recent_d, recent_ccm = self.recent_d_ccm[pair]
                self.recent_d_ccm[pair] = (0.9 * recent_d + 0.1 * s.D, 0.9 * recent_ccm + 0.1 * ccm)

    def _fit_predictor(self, name: str, features: torch.Tensor, predicted: torch.Tensor, auditable: list[bool],
                       scores: list[Score | None], measured: list[int]) -> None:
        """The predictor learns the measured offers' bands, and is audited on the measured predictions that were
        sure enough to skip and could have (`_predict`)."""
        bands = {k: s.band for k, s in enumerate(scores) if s is not None}     # the measured offers'
        if self.predictor and measured:
            self.predictor.learn(features[measured], torch.tensor([bands[k] for k in measured]))
            for k in measured:
                if auditable[k]:
                    self.predictor.audited(name, int(predicted[k]) == bands[k])

    def _records(self, name: str, offers: list[Offer], scores: list[Score | None], bands: list[int | None],
                 decisions: list, crossed: dict, thetas: dict, predicted: torch.Tensor, prob: torch.Tensor,
                 skipped: list[bool]) -> list[dict]:
        """One record per offer (fidelity_record.offer_record)."""
        records = []
        for k, (o, s) in enumerate(zip(offers, scores)):
            level, what, reason = decisions[k]
            reason += " (predicted, diagnosis skipped)" if skipped[k] else ""
            if self.cfg.admission == "random" and s is not None and bands[k] != s.band:
                reason += f" (random admission; the diagnosis gave {LEVELS[s.band]})"
            records.append(fidelity_record.offer_record(o, asdict(s) if s else None, level, what, reason,
                                                        crossed.get(k), thetas.get(o.source.policy.name),
                                                        int(predicted[k]), prob[k].item(), skipped[k]))
        return records


class PhaseTimer:
    """Seconds per named phase: `with timer("scoring"): ...` adds the block's wall time to seconds["scoring"]."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - started

if __name__ == "__main__":
    # One iteration of the two tiny policies shared at each fixed level, then curated: what each offered
    # trajectory scores, where it is admitted, and the most degraded one step by step.
    import argparse


    cli = argparse.ArgumentParser(description="the curator on one iteration of the tiny qwen-llama pair")
    cli.add_argument("--prompts", type=int, default=8)
    cli.add_argument("--group-size", type=int, default=8)
    cli.add_argument("--seed", type=int, default=1)
    args = cli.parse_args()
    task = tasks.load_task("arith", args.seed, 1000, 0)
    pols = policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), arith.TaskConfig(), args.seed)
    problems = task.train[:args.prompts]
    prompts = [task.prompt(q) for q in problems]
    torch.manual_seed(args.seed)
    experiences = []
    for p in pols:
        out = p.rollout(prompts, args.group_size, 40, temperature=0.7)
        rewards = tasks.group_rewards(task, problems, out.texts, args.group_size)                       # [B, G]
        experiences.append(sharing.Experience(p, prompts, out, rewards, grpo.group_advantages(rewards)))
    for level in LEVELS:
        fixed = sharing.exchange(experiences, sharing.ShareConfig(level, temperature=0.7))
        print(f"{level} alone: " + ", ".join(f"{got.metrics['sharing/received']:.0f} into {name}"
                                            for name, got in fixed.items())
              + (" (peer rewards in the group baselines)" if level == "xgrpo" else " (trajectories as tokens)"))
    curation = Curator(CuratorConfig(), [p.name for p in pols], args.seed, None, None)
    received, records = curation.exchange(experiences, task, problems,
                                          sharing.ShareConfig("cross-fidelity", temperature=0.7), 1)
    for name, got in received.items():
        m = got.metrics
        print(f"into {name}: {m['fidelity/offered']:.0f} offered, D mean {m.get('fidelity/d_mean', math.nan):.3f} "
              f"(TBD {m.get('fidelity/tbd_mean', math.nan):.3f}, CCM {m.get('fidelity/ccm_mean', math.nan):.3f}, "
              f"RSD {m.get('fidelity/rsd_mean', math.nan):.3f}); admitted "
              + ", ".join(f"{lv} {m[f'fidelity/admitted_{lv}']:.0%}" for lv in LEVELS)
              + f", rejected {m['fidelity/rejected']:.0%}; {len(got.crossings)} cross as tokens")
    diagnosed = [r for r in records if "D" in r]
    if not diagnosed:
        raise SystemExit("\nno offer was diagnosed: every reward on each prompt was the same (try more --prompts)")
    worst = max(diagnosed, key=lambda r: r["D"])
    print(f"\nmost degraded: {worst['source']} -> {worst['receiver']}, reward {worst['reward']:.0f}, "
          f"D {worst['D']:.3f} (dominant {worst['dominant'].upper()}): "
          f"{worst['level']}, because {worst['reason']}\n{fidelity_record.marked_text(worst)}")
