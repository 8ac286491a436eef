"""CROSS-FIDELITY's curator: per-trajectory degradation, admission to a sharing level, and the repairs.

Proposal §2.1, the degradation of a trajectory moved from a source policy to a receiver (DESIGN.md §4.1: the
proposal's F grows with degradation, so it is called D here and fidelity is 1 - D):
    D = l1 (1 - S_TBD) + l2 P + l3 D_RSD,      l1 + l2 + l3 = 1, each term in [0, 1]
Every trajectory that crosses as tokens is repaired (§2.2), so what decides its level is the degradation that
remains once it is repaired, D_repaired (below); D is the diagnosis, logged beside it. Admission on D_repaired:
D_repaired < theta1: PRP (its tokens, with repaired per-token advantages and truncated density ratios);
theta1 <= D_repaired < theta2: XGRPO (its reward joins the receiver's group on that prompt); D_repaired >= theta2:
SGT (it crosses only as a verified success on a prompt the receiver's whole group failed), else rejected. The
levels nest: a verified success on a prompt the receiver's whole group failed crosses as a rescue at every
level, since a trajectory trusted at a finer level is trusted at the coarsest one; so a rescue is never lost
because it scored well (at PRP with A = 0 nothing else would cross). §2.3 (threshold co-evolution, the fidelity
predictor) is in coevolution.py.

The three terms, each a mean over the trajectory's K steps (lines, DESIGN.md §4.6) of a per-step value in [0, 1]:
  TBD  by default the share of a step's credit that a token mixes with a neighbour step's, or that the receiver
       cannot reproduce: 0 for a pure 1:n digit split, which the byte-boundary S_TBD would call drift by
       construction (logged beside it as `tbd_jaccard`); or the proposal's hidden-state S_TBD (--tbd-measure,
       boundary_drift.py).
  CCM  mean_k (1 - R_k), R_k calibrated on the receiver's own steps so that its typical ones score 0
       (reachability.py): the share of the trajectory's credit that sits on steps the receiver cannot reach.
       This is the proposal's phantom advantage P = mean_k A_k (1 - R_k) per unit of credit, P / |A|, and not P
       itself, for two reasons: the credit a trajectory carries depends on the level it is admitted to (its
       own-group A at PRP, its rescue credit at SGT, none at XGRPO), so P would depend on the decision it is
       meant to inform; and |A| reaches sqrt(G - 1) under std-normalized advantages, so P has no fixed scale
       on which thresholds mean anything. P with the credit actually carried is logged per crossing (`phantom`).
  RSD  per typed step, sqrt(1 - exp(-KL(p_src || p_tgt))) (reward_drift.rsd_steps): the Bretagnolle-Huber bound
       on the total variation between the two policies' step-success distributions; the mean over typed steps.
An ablated term (--ablate) is not computed, and its repair is off. It contributes 0 to D and the other weights
are kept, so D keeps its scale and the thresholds their meaning: dropping a term that is always 0 changes no
decision. An ablated CCM computes no gradient norms at all, so the intrinsic RSD signal is gone with it: the
steps no verifier can check then keep the outcome advantage.

The repairs compose on one step in a fixed order (the proposal's challenge 3), starting from the sequence
advantage A the trajectory carries (its own-group advantage for PRP, its rescue advantage for SGT):
  1. RSD: c_k = (1 - mix) A + mix s_k, s_k = r_k - p_tgt(type_k) for a verified step (VPR), or the intrinsic
     signal rank(-g_k) - 1/2 over the trajectory's steps where a step cannot be checked (or with
     --process-signal intrinsic). It sets what the step is worth to the receiver;
  2. CCM: c_k <- c_k R_k^beta, after RSD so that the additive recalibration cannot hand credit back to a step
     the receiver cannot reach;
  3. TBD: source tokens carry their step's credit and the credit moves to the receiver's tokens by byte overlap
     (tokalign.token_credit), last because it is the transport of whatever credit the steps hold; ablated, each
     receiver token takes the credit of the step its first byte is in. A separator after a step (its newline)
     and the EOS close that step and carry its credit; bytes before the first step carry the first step's. So
     no token keeps the unrepaired A, and the tokens that decide when a solution stops are repaired with the
     step they end.
What D_repaired measures: the harm that remains in the repaired trajectory, as a monotone function of each
diagnosed term, so that a trajectory worse on any term never gets a finer level, before or after repair:
  TBD  its inexact bytes only (redistribution resolves a straddled boundary, not bytes the receiver lacks);
  CCM  mean_k reachability.phantom_left(R_k): the phantom share R^beta (1 - R) the attenuated credit keeps, held
       at its peak for steps less reachable than the peak (an attenuated-away step is not better experience
       than a barely reachable one; at beta = 1 the term is at most 1/4);
  RSD  (1 - mix) of the drift of the steps the recalibration reaches.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

import arith
import boundary_drift
import coevolution
import diagnosis
import fidelity_record
import grpo
import policies
import reachability
import reward_drift
import sharing
import tasks
from diagnosis import TERMS, Offer
from receiver import ReceiverSide
from sharing import LEVELS


@dataclass(frozen=True)
class CuratorConfig:
    lambdas: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    """weights of the TBD, CCM and RSD terms in D; they must sum to 1"""
    theta1: float = 0.0965
    """D_repaired below it: PRP (the starting value where thresholds adapt). theta1 and theta2 come from the stated
    rule (coevolution.share_thresholds): the 1/3 and 2/3 quantiles of D_repaired over the 25,301 diagnosed offers
    of `python benchmarks/calibrate_thresholds.py` (qwen-llama, calibration seed 0, 100 iterations at the earlier
    0.1 / 0.15; results/thresholds-qwen-llama.json), so each level took a third of them there"""
    theta2: float = 0.1211
    """D_repaired at or above it: SGT; between theta1 and theta2: XGRPO"""
    ccm_beta: float = 1.0
    """the CCM repair's exponent: A_k <- A_k R_k^beta"""
    ablate: tuple[str, ...] = ()
    """terms whose diagnosis and repair are off: any of tbd, ccm, rsd"""
    tbd_measure: str = "credit"
    """how the TBD term is measured (boundary_drift.MEASURES): credit, hidden or jaccard"""
    process_signal: str = "vpr"
    """RSD repair: vpr = verified step credit where a step can be checked, intrinsic elsewhere; intrinsic = the
    gradient-norm signal on every step"""
    credit_mix: float = 0.5
    """RSD repair: the weight of the step's process signal against the outcome advantage"""
    reach_subset: str = "all"
    """parameters of the receiver whose gradient norms give R_k (reachability.parameter_subset)"""
    reach_quantile: float = 0.9
    """R = 1/2 at this quantile of the receiver's own step norms"""
    reach_zero_quantile: float = 0.5
    """R = 1 up to this quantile of the receiver's own step norms: its typical steps carry no CCM degradation"""
    calibration_rollouts: int = 8
    """own rollouts of the receiver, one per prompt in turn, whose steps calibrate reachability each iteration"""
    step_window: int = 20
    """iterations of step statistics behind D_RSD"""

    def __post_init__(self):
        if len(self.lambdas) != 3 or min(self.lambdas) < 0 or not math.isclose(sum(self.lambdas), 1.0, abs_tol=1e-6):
            raise ValueError(f"lambdas must be three non-negative weights summing to 1, got {self.lambdas}")
        if not 0 <= self.theta1 <= self.theta2:
            raise ValueError(f"need 0 <= theta1 <= theta2, got {self.theta1}, {self.theta2}")
        if set(self.ablate) - set(TERMS) or set(self.ablate) == set(TERMS):
            raise ValueError(f"ablate takes a proper subset of {TERMS}, got {self.ablate}")
        if self.tbd_measure not in boundary_drift.MEASURES:
            raise ValueError(f"tbd_measure is one of {boundary_drift.MEASURES}, got {self.tbd_measure!r}")
        if self.process_signal not in ("vpr", "intrinsic"):
            raise ValueError(f"process_signal is vpr or intrinsic, got {self.process_signal!r}")
        if self.process_signal == "intrinsic" and "ccm" in self.ablate:
            raise ValueError("the intrinsic process signal is the CCM's gradient norms, which an ablated CCM does not "
                             "compute: use process_signal='vpr' with ablate ccm")

    @property
    def weights(self) -> torch.Tensor:
        """[3] the lambdas, 0 for an ablated term; the others keep their weight, so D keeps its scale."""
        w = torch.tensor([0.0 if t in self.ablate else l for t, l in zip(TERMS, self.lambdas)], dtype=torch.float64)
        if w.sum() <= 0:
            raise ValueError(f"every term with a weight is ablated: lambdas {self.lambdas}, ablate {self.ablate}")
        return w


# ---------------------------------------------------------------------------------------------------------------
# Scoring and admission
# ---------------------------------------------------------------------------------------------------------------

def degradation(terms: torch.Tensor, weights: torch.Tensor) -> float:
    """D = sum_i lambda_i term_i; terms [3] in [0, 1], NaN for an ablated term (its weight is 0)."""
    return float((torch.nan_to_num(terms, nan=0.0) * weights).sum())


def admission_band(d: float, theta1: float, theta2: float) -> int:
    """0 = PRP, 1 = XGRPO, 2 = SGT."""
    if not math.isfinite(d):
        raise ValueError(f"the degradation is {d}; a trajectory cannot be admitted on it")
    return 0 if d < theta1 else 1 if d < theta2 else 2


def rescue_candidate(offer: Offer, own_rewards: torch.Tensor, success: float) -> bool:
    """A verified success on a prompt where the receiver's whole group (own_rewards [B, G]) failed (SGT)."""
    return offer.reward >= success and bool((own_rewards[offer.prompt_index] < success).all())


def crosses_tokens(band: int, offer: Offer, own_rewards: torch.Tensor, success: float) -> bool:
    """Whether the trajectory's tokens would enter the receiver's batch at this band: as a rescue at any band,
    else at PRP with a non-zero advantage."""
    return rescue_candidate(offer, own_rewards, success) or (band == 0 and offer.advantage != 0)


@dataclass(frozen=True)
class Score:
    """A trajectory's degradation before and after repair, and the band D_repaired gives it (0 PRP, 1 XGRPO,
    2 SGT)."""

    D: float
    D_repaired: float
    band: int
    dominant: str                  # the largest weighted term before repair
    dominant_repaired: str         # and after
    through_repair: bool           # the repair moved it to a finer band than D alone would have
    terms: dict[str, float]        # NaN where ablated
    terms_repaired: dict[str, float]


def score(offer: Offer, cfg: CuratorConfig, theta: tuple[float, float]) -> Score:
    """D and D_repaired (module docstring), and the band of D_repaired."""
    weights = cfg.weights
    before, after = offer.diagnosis.terms(cfg), offer.diagnosis.terms(cfg, repaired=True)
    d, d_repaired = degradation(before, weights), degradation(after, weights)
    band = admission_band(d_repaired, *theta)

    def dominant(terms: torch.Tensor) -> str:
        return TERMS[int((torch.nan_to_num(terms) * weights).argmax())]
    return Score(d, d_repaired, band, dominant(before), dominant(after), band < admission_band(d, *theta),
                 dict(zip(TERMS, before.tolist())), dict(zip(TERMS, after.tolist())))


def admit(offers: list[Offer], bands: list[int], receiver: sharing.Experience, share: sharing.ShareConfig
          ) -> tuple[list[tuple[str, str, str]], dict[int, tuple[Offer, float]], torch.Tensor]:
    """Admission of every offer by its band (DESIGN.md §4.1). Returns per offer (level, what crosses, reason);
    the offers whose tokens cross, by position, with the advantage they carry; and the receiver's advantages
    [B, G] with the XGRPO-admitted peer rewards in its groups' statistics.

    A rescue (a verified success on a prompt the receiver's whole group failed) crosses as one at every band,
    with its credit as a member of the receiver's failed group, pooled over the prompt's rescues; at XGRPO its
    reward also joins the baseline. Any other PRP trajectory carries its own-group advantage."""
    pooled: dict[int, list[float]] = defaultdict(list)                 # prompt -> XGRPO-admitted peer rewards
    rescues: dict[int, list[int]] = defaultdict(list)                  # prompt -> positions of its rescues
    picks: dict[int, tuple[Offer, float]] = {}
    decisions = []
    for k, (o, band) in enumerate(zip(offers, bands)):
        if band == 1:
            pooled[o.prompt_index].append(o.reward)
        rule = ("D_repaired < theta1", "theta1 <= D_repaired < theta2", "D_repaired >= theta2")[band]
        if rescue_candidate(o, receiver.rewards, share.success):
            rescues[o.prompt_index].append(k)
            decisions.append((LEVELS[band], "tokens" if band != 1 else "tokens and reward",
                              f"{rule}, a verified rescue"))
        elif band == 0:
            decisions.append(("prp", "tokens", rule) if o.advantage != 0 else
                             ("prp", "none", f"{rule}, but A = 0 and no rescue: nothing to carry"))
            if o.advantage != 0:
                picks[k] = (o, o.advantage)
        elif band == 1:
            decisions.append(("xgrpo", "reward", rule))
        else:
            decisions.append(("rejected", "none", f"{rule}, not a verified success on a prompt the receiver failed"))
    for b, ks in rescues.items():
        credit = sharing.rescue_advantages(receiver.rewards[b], torch.tensor([offers[k].reward for k in ks]),
                                           share.scale_by_std)
        for k, a in zip(ks, credit.tolist()):
            picks[k] = (offers[k], a)
    advantages = receiver.advantages.clone()                                           # [B, G]
    for b, rewards in pooled.items():
        pooled_rewards = torch.cat([receiver.rewards[b], torch.tensor(rewards)]).unsqueeze(0)      # [1, G + S]
        advantages[b] = grpo.group_advantages(pooled_rewards, share.scale_by_std)[0, :advantages.shape[1]]
    return decisions, picks, advantages


class Curator:
    """The curator across iterations: each policy's step statistics, each pair's recent degradation, the
    thresholds (fixed or co-evolving) and the fidelity predictor. `exchange` curates one iteration."""

    def __init__(self, cfg: CuratorConfig, names: list[str], seed: int, bandit: coevolution.BanditConfig | None,
                 predictor: coevolution.PredictorConfig | None):
        self.cfg = cfg
        self.stats = {n: reward_drift.StepStats(cfg.step_window) for n in names}
        self.pairs = {(a, b): i for i, (a, b) in enumerate((a, b) for a in names for b in names if a != b)}
        self.recent = {pair: (0.0, 0.0) for pair in self.pairs}     # EMA of D and CCM per pair: predictor features
        self.calibration: dict[str, reachability.Calibration] = {}   # each receiver's last calibration
        self.bandit = coevolution.ThresholdBandit(cfg.theta1, cfg.theta2, bandit, seed) if bandit else None
        self.predictor = (coevolution.FidelityPredictor(len(diagnosis.FEATURES) + len(self.pairs), predictor, seed)
                          if predictor else None)

    def thresholds(self, source: str, receiver: str, gap: float) -> tuple[float, float]:
        return self.bandit.choose(source, receiver, gap) if self.bandit else (self.cfg.theta1, self.cfg.theta2)

    def updated(self, receiver: str, update: dict[str, float]) -> None:
        """After the receiver's update: its statistics (losses/update_kl, losses/grad_norm) join the cycle the
        stability guard will judge (coevolution.ThresholdBandit)."""
        if self.bandit:
            self.bandit.updated(receiver, update)

    def judge(self, receiver: str, reward_std: float) -> list[str] | None:
        """With the receiver's new rollouts: the guard's verdict on its last cycle (the signals that tripped), which
        moves its pairs' thresholds; None with fixed thresholds or before the first update."""
        return self.bandit.judge(receiver, reward_std) if self.bandit else None

    def exchange(self, experiences: list[sharing.Experience], task: tasks.Task, examples: list,
                 share: sharing.ShareConfig, iteration: int, sides: dict[str, ReceiverSide] | None = None
                 ) -> tuple[dict[str, sharing.Received], list[dict]]:
        """Curate what every policy receives from every other one. examples [B]: the iteration's prompts' items.

        `sides`: each receiver's side of the curation (receiver.py), by name, where its model is; by default made
        here, from the experiences' own policies. Under --backend ray they are the actors' (backends.py), and what
        is returned holds no crossings: those stay with the receiver, which trains on them.

        Returns per receiver what it trains on (metrics under fidelity/ and sharing/) and one record per offered
        trajectory (fidelity.jsonl)."""
        started = time.perf_counter()
        for e in experiences:
            group = e.rollouts.group_size
            self.stats[e.policy.name].add_iteration(
                [s for i, text in enumerate(e.rollouts.texts)
                 for s in reward_drift.process_rewards(task, examples[i // group], text)])
        stats_s = time.perf_counter() - started
        out, records = {}, []
        for receiver in experiences:
            peers = [e for e in experiences if e is not receiver]
            side = sides[receiver.policy.name] if sides else ReceiverSide(receiver, peers, task, self.cfg, share)
            out[receiver.policy.name], mine = self._receive(receiver, side, peers, examples, share, iteration)
            metrics = out[receiver.policy.name].metrics
            metrics["fidelity/time_s/statistics"] = stats_s / len(experiences)
            metrics["fidelity/time_s/curation"] += stats_s / len(experiences)
            records += mine
        return out, records

    def _predict(self, receiver: sharing.Experience, offers: list[Offer], gaps: dict[str, float],
                 share: sharing.ShareConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool], list[bool]]:
        """Features [N, F], the predicted band [N] and its probability [N], and which predictions are sure and
        which skip the expensive diagnosis (never one whose tokens would cross)."""
        n, name = len(offers), receiver.policy.name
        if not self.predictor or not offers:
            return torch.zeros(n, 0), torch.full((n,), -1), torch.zeros(n), [False] * n, [False] * n
        features = torch.stack([torch.cat([
            diagnosis.offer_features(o, self.cfg, self.recent[(o.source.policy.name, name)], gaps[o.source.policy.name]),
            torch.nn.functional.one_hot(torch.tensor(self.pairs[(o.source.policy.name, name)]),
                                        len(self.pairs)).double()]) for o in offers])
        predicted, prob = self.predictor.predict(features)
        sure, skipped = [], []
        for k, o in enumerate(offers):
            is_sure, skip = self.predictor.may_skip(name, prob[k].item())
            sure.append(is_sure)
            skipped.append(skip and not crosses_tokens(int(predicted[k]), o, receiver.rewards, share.success))
        return features, predicted, prob, sure, skipped

    def _receive(self, receiver: sharing.Experience, side: ReceiverSide, peers: list[sharing.Experience],
                 examples: list, share: sharing.ShareConfig, iteration: int) -> tuple[sharing.Received, list[dict]]:
        """The curation of one receiver: the receiver's side diagnoses (receiver.py), the curator predicts, scores,
        learns and admits, the receiver's side crosses what was admitted."""
        cfg, name = self.cfg, receiver.policy.name
        timer, clock = defaultdict(float), [time.perf_counter()]

        def lap(phase: str) -> None:
            now = time.perf_counter()
            timer[phase] += now - clock[0]
            clock[0] = now
        gaps = {p.policy.name: p.rewards.mean().item() - receiver.rewards.mean().item() for p in peers}
        thetas = {source: self.thresholds(source, name, gap) for source, gap in gaps.items()}
        offers, records = side.offers(examples, self.stats)
        lap("diagnosis")

        features, predicted, prob, sure, skipped = self._predict(receiver, offers, gaps, share)
        lap("prediction")

        measured = [k for k, skip in enumerate(skipped) if not skip]
        diagnoses, calibration = side.reach(measured, self.calibration.get(name))
        for k, d in zip(measured, diagnoses):     # the same objects in this process, copies from an actor
            offers[k].diagnosis = d
        if calibration is not None:
            self.calibration[name] = calibration
        lap("gradnorms")

        scores = [None if skip else score(o, cfg, thetas[o.source.policy.name]) for o, skip in zip(offers, skipped)]
        lap("repair")

        if self.predictor and not all(skipped):
            self.predictor.learn(features[torch.tensor([not s for s in skipped])],
                                 torch.tensor([s.band for s in scores if s is not None]))
            for k, s in enumerate(scores):
                if sure[k] and s is not None:
                    self.predictor.audited(name, int(predicted[k]) == s.band)
        lap("predictor_fit")

        bands = [int(predicted[k]) if sc is None else sc.band for k, sc in enumerate(scores)]
        decisions, picks, advantages = admit(offers, bands, receiver, share)
        lap("admission")

        crossed, received = side.cross({k: a for k, (_, a) in picks.items()}, advantages, self.stats[name])
        lap("crossing")

        for k, (o, s) in enumerate(zip(offers, scores)):
            level, what, reason = decisions[k]
            reason += (" (predicted, diagnosis skipped)" if s is None else
                       f" (the repair moved it from {LEVELS[admission_band(s.D, *thetas[o.source.policy.name])]})"
                       if s.through_repair else "")
            if s is not None:
                pair = (o.source.policy.name, name)
                ccm = s.terms["ccm"] if math.isfinite(s.terms["ccm"]) else 0.0
                self.recent[pair] = tuple(0.9 * old + 0.1 * new for old, new in zip(self.recent[pair], (s.D, ccm)))
            records.append(fidelity_record.offer_record(o, s, level, what, reason, crossed.get(k), thetas[o.source.policy.name],
                                        int(predicted[k]), prob[k].item(), skipped[k]))
        for r in records:
            r.update(iteration=iteration, receiver=name)
        metrics = {**received.metrics,
                   **fidelity_record.fidelity_metrics(records, thetas, self.predictor.accuracy(name) if self.predictor else None),
                   **{f"fidelity/time_s/{phase}": t for phase, t in timer.items()},
                   "fidelity/time_s/curation": sum(timer.values())}
        return sharing.Received(received.advantages, received.crossings, metrics), records


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
    worst = max((r for r in records if "D" in r), key=lambda r: r["D"])
    print(f"\nmost degraded: {worst['source']} -> {worst['receiver']}, reward {worst['reward']:.0f}, "
          f"D {worst['D']:.3f} (dominant {worst['dominant'].upper()}) -> repaired {worst['D_repaired']:.3f}: "
          f"{worst['level']}, because {worst['reason']}\n{fidelity_record.marked_text(worst)}")
