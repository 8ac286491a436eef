"""The diagnosis of one shared trajectory as one receiver sees it: the offer, its per-step terms, the repair of its
credit, and the receiver's side of curating an iteration (proposal §2.1-2.2; curator.py composes the terms into D
and admits).

An offer is a source rollout retokenized by the receiver and aligned with it (tokalign), cut into steps. Each term
is the mean over the trajectory's steps of a per-step value in [0, 1]:
  TBD  by default the share of a step's credit that a token mixes with a neighbour step's, or that the receiver
       cannot reproduce (boundary_drift.py, --tbd-measure for the proposal's hidden-state S_TBD);
  CCM  1 - R_k, R_k the step's reachability under the receiver, calibrated on the receiver's own steps of its last
       few iterations so that its typical steps score R = 1 (reachability.py): the phantom advantage per unit of
       credit, P / |A|, since the credit an offer carries depends on the level it is admitted to;
  RSD  per typed step, the Bretagnolle-Huber bound sqrt(1 - exp(-KL)) on the total variation between the two
       policies' step-success distributions (reward_drift.py).
CCM needs the receiver's gradient norms, the expensive part, measured once the curator asks (`ReceiverSide.reach`).
The repairs compose on one step in a fixed order (the proposal's challenge 3), from the sequence advantage A the
trajectory carries: 1. RSD, c_k = (1 - mix) A + mix s_k with s_k the verified step credit (VPR) or the intrinsic
gradient-norm signal; 2. CCM, c_k R_k^beta, after RSD so the recalibration cannot hand credit back to a step the
receiver cannot reach; 3. TBD, the step credit carried onto the receiver's tokens by byte overlap
(tokalign.token_credit), separators and EOS closing the step before them; `repair_credit` applies them. An
ablated term is not computed and its repair is off.

`ReceiverSide` holds the steps that need the receiver's tokenizer or model, so they run where the receiver is: in
the trainer's process, or in the receiver's Ray actor (train_ray.py). Per receiver and iteration the curator calls
`offers` (the cheap diagnosis of every peer rollout), `reach` (the gradient norms of the offers it did not skip)
and `cross` (the admitted offers with their repaired credit, which stay where the receiver trains on them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import torch

import boundary_drift
import grad_norms
import reachability
import reward_drift
import sharing
import term_scales
import tokalign
from term_scales import TERMS
from testbed import policies, tasks

ADMISSIONS = ("diagnosis", "random", "ranked")
RATIO_SIGNALS = ("sequence_ratio", "capped_ratio", "kl")
"""the density-ratio signals of an offer (`with_ratio_signals`), measured only where a ranked admission orders by one"""
RANK_SIGNALS = {"d": 1, "tbd": 1, "ccm": 1, "rsd": 1, "reward": -1, "advantage": -1, "chance": 1,
                "sequence_ratio": -1, "capped_ratio": -1, "kl": 1}
"""what `--admission ranked` can order the offers by, and its sense: 1 admits the lowest first (a degradation, a
divergence), -1 the highest (the offer's reward, its advantage, its sequence ratio); chance is a seeded random
order, the control"""
CALIBRATIONS = ("window", "none")


@dataclass(frozen=True)
class CuratorConfig:
    """The curator's settings. A field named like a flag is that flag (args.py documents it; lambdas is
    --fidelity-lambdas); the fields from credit_mix on are fixed settings, documented here."""

    lambdas: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    theta1: float | None = None
    theta2: float | None = None
    calibration: str = "window"
    calibration_window: int = 8
    admission: str = "diagnosis"
    rank_by: str = "d"
    admit_share: float = 1 / 3
    negate_credit: bool = False
    ccm_beta: float = 1.0
    ablate: tuple[str, ...] = ()
    tbd_measure: str = "credit"
    process_signal: str = "vpr"
    ccm_estimate: str = "last:0"
    credit_mix: float = 0.5
    """RSD repair: the weight of the step's process signal against the outcome advantage"""
    reach_quantile: float = 0.9
    """R = 1/2 at this quantile of the receiver's own step norms"""
    reach_zero_quantile: float = 0.5
    """R = 1 up to this quantile of the receiver's own step norms: its typical steps carry no CCM degradation"""
    calibration_rollouts: int = 32
    """own rollouts of the receiver per iteration, spread over the prompts, whose step norms calibrate R"""
    reach_window: int = 4
    """iterations of own step norms R is calibrated on (about 128 rollouts at the defaults), so that it holds
    still from one iteration's sample to another; an iteration that measured no offer adds none and is not counted"""
    step_window: int = 20
    """iterations of step statistics behind D_RSD"""

    def __post_init__(self):
        if len(self.lambdas) != 3 or min(self.lambdas) < 0 or not math.isclose(sum(self.lambdas), 1.0, abs_tol=1e-6):
            raise ValueError(f"lambdas must be three non-negative weights summing to 1, got {self.lambdas}")
        if (self.theta1 is None) != (self.theta2 is None):
            raise ValueError("give both theta1 and theta2, or neither (the calibration's)")
        if self.theta1 is not None and self.theta2 is not None and not 0 <= self.theta1 <= self.theta2:
            raise ValueError(f"need 0 <= theta1 <= theta2, got {self.theta1}, {self.theta2}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration is one of {CALIBRATIONS}, got {self.calibration!r}")
        if self.theta1 is None and self.calibration == "none":
            raise ValueError("without a calibration the terms are raw and the thresholds must be given: "
                             "set theta1 and theta2, or calibration 'window'")
        if self.calibration_window < 1:
            raise ValueError(f"calibration_window is at least 1 iteration, got {self.calibration_window}")
        if set(self.ablate) - set(TERMS) or set(self.ablate) == set(TERMS):
            raise ValueError(f"ablate takes a proper subset of {TERMS}, got {self.ablate}")
        if self.tbd_measure not in boundary_drift.MEASURES:
            raise ValueError(f"tbd_measure is one of {boundary_drift.MEASURES}, got {self.tbd_measure!r}")
        if self.process_signal not in ("vpr", "intrinsic"):
            raise ValueError(f"process_signal is vpr or intrinsic, got {self.process_signal!r}")
        if self.process_signal == "intrinsic" and "ccm" in self.ablate:
            raise ValueError("the intrinsic process signal is the CCM's gradient norms, which an ablated CCM does not "
                             "compute: use process_signal='vpr' with ablate ccm")
        grad_norms.estimate_blocks(self.ccm_estimate)
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission is one of {ADMISSIONS}, got {self.admission!r}")
        if self.rank_by not in RANK_SIGNALS:
            raise ValueError(f"rank_by is one of {tuple(RANK_SIGNALS)}, got {self.rank_by!r}")
        if self.rank_by in self.ablate:
            raise ValueError(f"cannot rank by {self.rank_by}, an ablated term: it is not computed")
        if not 0 <= self.admit_share <= 1:
            raise ValueError(f"admit_share is a share of the offers, in [0, 1], got {self.admit_share}")

    @property
    def measures_hidden_tbd(self) -> bool:
        """Whether the sources' hidden states must come with their experience (sharing.with_hidden_states)."""
        return self.tbd_measure == "hidden" and "tbd" not in self.ablate

    @property
    def weights(self) -> torch.Tensor:
        """[3] the lambdas, 0 for an ablated term; the others keep their weight."""
        return term_scales.weights(self.ablate, self.lambdas)


def mean_or_zero(values: torch.Tensor) -> float:
    """Mean over the finite entries, 0 if there are none."""
    finite = values[torch.isfinite(values)]
    return finite.mean().item() if finite.numel() else 0.0


@dataclass(frozen=True)
class Diagnosis:
    """A trajectory's per-step diagnosis; NaN where a term is ablated or not computed. A later measure (hidden TBD,
    the gradient norms) gives a new diagnosis (`with_diagnoses`), never changes one."""

    tbd: torch.Tensor            # [K]
    rsd: torch.Tensor            # [K]  NaN on untyped lines
    reach: torch.Tensor | None   # [K]  R_k, None when the gradient norms were skipped or CCM is ablated
    norms: torch.Tensor | None   # [K]  the receiver's sqrt(|k|)-scaled step gradient norms

    def terms(self, cfg: CuratorConfig) -> torch.Tensor:
        """[3] the trajectory's TBD, CCM and RSD terms (NaN where ablated or not measured)."""
        ccm = (1 - self.reach).mean().item() if self.reach is not None else math.nan
        out = torch.tensor([mean_or_zero(self.tbd), ccm, mean_or_zero(self.rsd)], dtype=torch.float64)
        return torch.where(torch.tensor([t in cfg.ablate for t in TERMS]), torch.full_like(out, math.nan), out)


def step_credit(advantage: float, process: list[reward_drift.StepReward], diagnosis: Diagnosis,
                target: reward_drift.StepStats, cfg: CuratorConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[K] each step's repaired credit: RSD recalibration, then CCM attenuation (the module docstring's order);
    and [K] which steps the RSD recalibration reached."""
    credit = torch.full((len(process),), float(advantage), dtype=torch.float64)
    recalibrated = torch.zeros(len(process), dtype=torch.bool)
    if "rsd" not in cfg.ablate:
        verified = reward_drift.verified_credit(advantage, process, target, cfg.credit_mix) \
            if cfg.process_signal == "vpr" else [None] * len(process)
        intrinsic = (reward_drift.intrinsic_step_rewards(diagnosis.norms.double()) - 0.5
                     if diagnosis.norms is not None else None)
        for k, v in enumerate(verified):
            if v is not None:
                credit[k] = v
            elif intrinsic is not None:
                credit[k] = (1 - cfg.credit_mix) * advantage + cfg.credit_mix * intrinsic[k].item()
            recalibrated[k] = v is not None or intrinsic is not None
    if "ccm" not in cfg.ablate and diagnosis.reach is not None:
        credit = reachability.repair(credit, diagnosis.reach.double(), cfg.ccm_beta)
    return credit, recalibrated


@dataclass
class Offer:
    """One source rollout offered to one receiver, in the receiver's tokenization, with its diagnosis."""

    source: sharing.Experience
    index: int                               # flat index in the source's rollouts
    source_encoding: tokalign.Encoding         # the completion in the source's tokens
    receiver_encoding: tokalign.Encoding       # its text retokenized by the receiver
    alignment: tokalign.Alignment
    steps: list[tuple[int, int]]             # K byte spans, each covered by receiver tokens
    ranges: list[tuple[int, int]]            # K receiver token ranges of the steps
    process: list[reward_drift.StepReward]   # K
    diagnosis: Diagnosis
    jaccard: float                           # the jaccard TBD measure of the trajectory, logged for comparison
    ratios: dict[str, float] | None = None   # RATIO_SIGNALS' values, where a ranked admission orders by one

    @property
    def prompt_index(self) -> int:
        return self.index // self.source.rollouts.group_size

    @property
    def reward(self) -> float:
        return self.source.rewards.flatten()[self.index].item()

    @property
    def advantage(self) -> float:
        return self.source.advantages.flatten()[self.index].item()


def make_offer(source: sharing.Experience, index: int, receiver: policies.Policy, task: tasks.Task, example,
               stats: dict[str, reward_drift.StepStats], tbd_measure: str = "credit") -> Offer | None:
    """The cheap diagnosis (TBD, RSD) of one rollout for one receiver; None when no step of it reaches the
    receiver's tokens (an empty completion, a lone cut byte, a text its tokenizer cannot spell). The hidden TBD
    measure comes later, over all the iteration's offers (`with_hidden_tbd`)."""
    aligned = tokalign.align_completion(source.rollouts.completion_ids[index].tolist(), source.policy.token_bytes,
                                        receiver.tokenizer, receiver.token_bytes)
    if aligned is None:
        return None
    src, tgt, alignment = aligned
    steps = tokalign.step_byte_spans(src.data, task.step_spans)
    process = reward_drift.process_rewards(task, example, source.rollouts.texts[index])
    located = [(span, reachability.step_token_ranges(tgt.offsets, [at_receiver]), p)
               for span, at_receiver, p in zip(steps, tokalign.in_target(src, tgt, steps), process)]
    kept = [(span, ranges[0], p) for span, ranges, p in located if ranges]
    if not kept:
        return None
    steps, ranges, process = (list(x) for x in zip(*kept))
    tbd = boundary_drift.drift_steps(tbd_measure, alignment, src, tgt, steps)
    rsd = reward_drift.rsd_steps(stats[source.policy.name], stats[receiver.name], process)
    jaccard = mean_or_zero(boundary_drift.jaccard_steps(alignment, steps))
    return Offer(source, index, src, tgt, alignment, steps, ranges, process, Diagnosis(tbd, rsd, None, None),
                 jaccard)


def credit_record(offer: Offer, advantage: float, credit: torch.Tensor, tokens: torch.Tensor, repairs: list[str]
                  ) -> dict:
    """Where the repairs acted on a crossing: the advantage it carries, each step's repaired credit, the credit of
    the receiver's tokens outside every step (separators and EOS, which close the step before them), and the
    proposal's phantom advantage P = mean_k |A| (1 - R_k) of the credit carried (None without R)."""
    at_receiver = tokalign.in_target(offer.source_encoding, offer.receiver_encoding, offer.steps)
    outside = [t for t, (s, e) in enumerate(offer.receiver_encoding.offsets)
               if not any(s < b and e > a for a, b in at_receiver)]
    reach = offer.diagnosis.reach
    return {"repairs": repairs, "carried": advantage, "step_credit": credit.tolist(),
            "outside_credit": [tokens[t].item() for t in outside],
            "phantom": None if reach is None else reachability.phantom_advantage(
                torch.tensor(abs(advantage), dtype=torch.float64), reach.double()).mean().item()}


def repair_credit(offer: Offer, advantage: float, target: reward_drift.StepStats, cfg: CuratorConfig
                  ) -> tuple[torch.Tensor, dict]:
    """The repairs in their order (module docstring) on one crossing that carries `advantage`: [T] the credit of
    each of the receiver's tokens, and what the repairs did (`credit_record`). target: the receiver's step
    statistics."""
    steps, recalibrated = step_credit(advantage, offer.process, offer.diagnosis, target, cfg)
    credit = partial(tokalign.token_credit, offer.source_encoding, offer.receiver_encoding, offer.alignment,
                     offer.steps, steps)
    at_first_byte = credit(False)                                                                   # [T]
    tokens = at_first_byte if "tbd" in cfg.ablate else credit(True)                                 # [T]
    reach = offer.diagnosis.reach
    # a repair acted where it moved credit: the TBD measure (hidden, Jaccard) may read drift where carrying the
    # credit by bytes gives every token the credit of its first byte's step
    acted = {"tbd": not torch.allclose(tokens, at_first_byte),
             "ccm": reach is not None and cfg.ccm_beta > 0 and bool((reach < 1).any()),   # R = 1 leaves A_k as it is
             "rsd": bool(recalibrated.any())}
    repairs = [t for t in TERMS if t not in cfg.ablate and acted[t]]
    return tokens, credit_record(offer, advantage, steps, tokens, repairs)


def with_diagnoses(offers: list[Offer], diagnoses: dict[int, Diagnosis]) -> list[Offer]:
    """`offers` with the diagnosis of each position in `diagnoses` replaced by that one."""
    return [replace(o, diagnosis=diagnoses[k]) if k in diagnoses else o for k, o in enumerate(offers)]


def with_hidden_tbd(offers: list[Offer], receiver: sharing.Experience) -> list[Offer]:
    """`offers` with the hidden TBD measure, cross-fitted per source on all its offers to this receiver
    (boundary_drift.hidden_measure): the source's hidden states on its own tokens, which came with its experience
    (sharing.Experience.hidden), and the receiver's on its re-encoding."""
    q, measured = receiver.policy, {}
    for source in {id(o.source): o.source for o in offers}.values():
        if source.hidden is None:
            raise ValueError(f"{source.policy.name}'s experience came without its hidden states, which the hidden TBD "
                             "measure needs: make it with sharing.with_hidden_states")
        from_source = [k for k, o in enumerate(offers) if o.source is source]
        h_tgt = q.hidden_states([q.encode_prompt(receiver.prompts[offers[k].prompt_index]) for k in from_source],
                                [offers[k].receiver_encoding.ids for k in from_source])
        values = boundary_drift.hidden_measure([(offers[k].alignment, source.hidden[offers[k].index], ht,
                                                 offers[k].steps) for k, ht in zip(from_source, h_tgt)])
        measured.update({k: replace(offers[k].diagnosis, tbd=v) for k, v in zip(from_source, values)})
    return with_diagnoses(offers, measured)


def with_ratio_signals(offers: list[Offer], receiver: sharing.Experience, share: sharing.ShareConfig
                       ) -> list[Offer]:
    """`offers` with their density-ratio signals (RATIO_SIGNALS, `Offer.ratios`), from one forward pass of the
    receiver over them: the sequence ratio s = exp(mean log pi_r - mean log pi_src of the text, each mean over that
    policy's own tokens), the compatibility the baselines weigh by; s capped at 1; and kl, Schulman's k3 estimate
    exp(x) - x - 1 of KL(pi_src || pi_r) averaged over the aligned groups that hold receiver tokens, x = log pi_r(g)
    - log pi_src(g), an F-TIS-style divergence (the text was sampled from the source)."""
    q = receiver.policy
    prompts = [q.encode_prompt(receiver.prompts[o.prompt_index]) for o in offers]
    logps = sharing.receiver_logprobs(q, prompts, [o.receiver_encoding.ids for o in offers], share.temperature,
                                      share.micro_batch)                                            # N x [T_i]
    out = []
    for o, logp in zip(offers, logps):
        src = o.source.rollouts.logprobs[o.index]                                                  # [n]
        s = math.exp(logp.double().mean().item() - src.double().mean().item())
        x = tokalign.group_log_ratio(o.alignment, src.float(), logp)[sharing.carried_groups(o.alignment)]  # [G']
        kl = (x.double().exp() - x.double() - 1).mean().item()
        out.append(replace(o, ratios={"sequence_ratio": s, "capped_ratio": min(s, 1.0), "kl": kl}))
    return out


FEATURES = ("tokens/50", "non-1:1 share", "steps/5", "reward", "|A|", "tbd", "rsd", "pair recent D",
            "pair recent CCM", "capability gap", "source mean log-prob")


def offer_features(offer: Offer, cfg: CuratorConfig, recent: tuple[float, float], gap: float) -> torch.Tensor:
    """[F] the cheap features of FEATURES (ablated terms read 0). CCM, the term that most often dominates D,
    needs the gradient norms; what stands in for it is the pair's recent CCM, the capability gap (the source's
    mean reward minus the receiver's) and how sure the source was of its own tokens."""
    terms = torch.nan_to_num(offer.diagnosis.terms(cfg))
    modes = offer.alignment.modes
    logprobs = offer.source.rollouts.logprobs[offer.index]
    return torch.tensor([len(offer.receiver_encoding.ids) / 50, sum(m != "1:1" for m in modes) / max(len(modes), 1),
                         len(offer.steps) / 5, offer.reward, abs(offer.advantage), terms[0].item(), terms[2].item(),
                         *recent, gap, logprobs.float().mean().item() if len(logprobs) else 0.0], dtype=torch.float64)


class ReceiverSide:
    """One receiver's side of one iteration's curation: its experience, its peers' as it received them, the
    offers it diagnosed, which the later steps refer to by position, and at the end what its receiver trains on
    (`received`, read by the receiver's update where the side lives)."""

    def __init__(self, receiver: sharing.Experience, peers: list[sharing.Experience], task: tasks.Task,
                 cfg: CuratorConfig, share: sharing.ShareConfig):
        self.receiver, self.peers, self.task, self.cfg, self.share = receiver, peers, task, cfg, share
        self.offered: list[Offer] = []
        self.received: sharing.Received | None = None

    def offers(self, examples: list, stats: dict[str, reward_drift.StepStats]) -> tuple[list[Offer], list[dict]]:
        """The cheap diagnosis of every peer rollout for this receiver, and a record for each that cannot be.
        examples [B]: the iteration's prompts' items; stats: every policy's step statistics (RSD)."""
        offers, records = [], []
        for peer in self.peers:
            for i in range(len(peer.rollouts.completion_ids)):
                offer = make_offer(peer, i, self.receiver.policy, self.task, examples[i // peer.rollouts.group_size],
                                   stats, self.cfg.tbd_measure)
                if offer is None:
                    records.append({"source": peer.policy.name, "index": i,
                                    "prompt": i // peer.rollouts.group_size, "level": "rejected", "crossed": "none",
                                    "reason": "no step reaches the receiver's tokens (or its tokenizer cannot spell "
                                              "the text)", "repairs": []})
                else:
                    offers.append(offer)
        if offers and self.cfg.measures_hidden_tbd:
            offers = with_hidden_tbd(offers, self.receiver)
        if offers and self.cfg.admission == "ranked" and self.cfg.rank_by in RATIO_SIGNALS:
            offers = with_ratio_signals(offers, self.receiver, self.share)
        self.offered = offers
        return offers, records

    def reach(self, positions: list[int], window: list[torch.Tensor]) -> tuple[list[Diagnosis], torch.Tensor]:
        """The expensive diagnosis of the offers at `positions`: the receiver's step gradient norms, and R_k
        calibrated on its own step norms of this iteration and of the window's earlier ones (`window`, one tensor
        per iteration). Returns those offers' diagnoses and this iteration's own norms (empty where nothing was
        measured). Nothing is measured with CCM ablated: the intrinsic RSD signal is then off too."""
        cfg, q, offers = self.cfg, self.receiver.policy, [self.offered[k] for k in positions]
        if not offers or "ccm" in cfg.ablate:
            return [o.diagnosis for o in offers], torch.zeros(0)
        params, modules = grad_norms.ccm_scope(q.model, cfg.ccm_estimate)
        prompt_ids = {b: q.encode_prompt(self.receiver.prompts[b]) for b in {o.prompt_index for o in offers}}
        items = [(prompt_ids[o.prompt_index], o.receiver_encoding.ids, o.ranges) for o in offers]
        norms = reachability.step_norms(q, items, params, modules)
        for o, g in zip(offers, norms):
            if not torch.isfinite(g).all():    # R would be NaN: D would read its CCM term as 0, the credit as NaN
                raise FloatingPointError(
                    f"{q.name}'s gradient norm on a step {o.source.policy.name} offered is not finite: its weights or "
                    "that step's loss overflowed. The run stops before this iteration's update, with its last "
                    "checkpoint untouched")
        own_items = reachability.own_steps(q, self.receiver.rollouts, self.task.step_spans, cfg.calibration_rollouts)
        own = torch.cat(reachability.step_norms(q, own_items, params, modules)) if own_items else torch.zeros(0)
        sample = torch.cat([*window, own])
        if sample.numel() == 0:
            raise ValueError(f"{q.name}'s rollouts have no step to calibrate reachability on yet (no completion of "
                             "its own, this iteration's or the window's, holds a step the task can split out, and a "
                             "peer's steps are measured against its own): a run without the CCM term "
                             "(--ablate ccm) does not calibrate it")
        calibration = reachability.calibrate(sample, cfg.reach_quantile, cfg.reach_zero_quantile)
        measured = [replace(o.diagnosis, norms=g, reach=reachability.reachability(g, calibration))
                    for o, g in zip(offers, norms)]
        self.offered = with_diagnoses(self.offered, dict(zip(positions, measured)))
        return measured, own

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats: reward_drift.StepStats
              ) -> tuple[dict[int, dict], sharing.Received]:
        """The offers at the positions of `credit`, each carrying its advantage there, as the receiver trains on
        them, with their repaired per-token credit (stats: the receiver's step statistics). Returns per position
        what the repairs did (`credit_record`), and what the receiver trains on: its own rollouts'
        `advantages` [B, G] (the curator's, with the admitted peer rewards in its groups) and the crossings, with
        their sharing/ metrics."""
        cfg, crossings, crossed = self.cfg, [], {}
        for peer in self.peers:
            # this peer's admitted offers by their index in its rollouts: (position among the offers, advantage)
            by_index = {self.offered[k].index: (k, a) for k, a in credit.items() if self.offered[k].source is peer}
            aligned = {i: (self.offered[k].source_encoding, self.offered[k].receiver_encoding,
                           self.offered[k].alignment) for i, (k, _) in by_index.items()}
            picks = [(i, a) for i, (_, a) in sorted(by_index.items())]
            repaired = {i: repair_credit(self.offered[k], a, stats, cfg) for i, (k, a) in by_index.items()}
            if cfg.negate_credit:      # the control that must hurt: the same tokens, every token's credit reversed
                repaired = {i: (-tokens, record) for i, (tokens, record) in repaired.items()}
            for c in sharing.cross(peer, picks, self.receiver.policy, self.share, aligned,
                                   {i: tokens for i, (tokens, _) in repaired.items()}):
                crossed[by_index[c.index][0]] = repaired[c.index][1]
                crossings.append(c)
        metrics = sharing.crossing_metrics(crossings, self.share.ratio_cap)
        self.received = sharing.Received(advantages, crossings, metrics)
        return crossed, self.received
