"""The receiver's half of curating an iteration (curator.py): the steps that need the receiver's tokenizer or model.

They run wherever the receiver is: in the trainer's process (the default), or inside the receiver's Ray actor
under --backend ray, where the curator on the driver calls them through the policy's handle (backends.py). Per
receiver and iteration, curator.Curator._receive calls them in this order:
  offers  the cheap diagnosis of every peer rollout: retokenized by the receiver, aligned with the source
          (tokalign), cut into steps, with TBD and RSD per step (diagnosis.make_offer); the hidden TBD measure
          reads the sources' hidden states, which came with their experience;
  reach   the expensive diagnosis of the offers the fidelity predictor did not skip: the receiver's per-step
          gradient norms and R_k, calibrated on its own steps of the last few iterations (reachability.py);
  cross   the admitted offers in the receiver's tokenization with their repaired per-token credit
          (diagnosis.step_credit, tokalign.token_credit): what the receiver's update trains on.
What goes back to the curator is diagnoses (the offers, their step norms and R_k, the credit records) and
metrics; the crossings stay with the receiver, and no weight or activation leaves it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

import diagnosis
import fidelity_record
import reachability
import reward_drift
import sharing
import tasks
import tokalign
from diagnosis import TERMS, Offer

if TYPE_CHECKING:   # the curator's settings: curator.py imports this file, never the other way at run time
    from curator import CuratorConfig


class ReceiverSide:
    """One receiver's side of one iteration's curation: its experience, its peers' as it received them, and the
    offers it diagnosed, which the later steps refer to by position."""

    def __init__(self, receiver: sharing.Experience, peers: list[sharing.Experience], task: tasks.Task,
                 cfg: CuratorConfig, share: sharing.ShareConfig):
        self.receiver, self.peers, self.task, self.cfg, self.share = receiver, peers, task, cfg, share
        self.offered: list[Offer] = []

    def offers(self, examples: list, stats: dict[str, reward_drift.StepStats]) -> tuple[list[Offer], list[dict]]:
        """The cheap diagnosis of every peer rollout for this receiver, and a record for each that cannot be.
        examples [B]: the iteration's prompts' items; stats: every policy's step statistics (RSD)."""
        offers, records = [], []
        for peer in self.peers:
            for i in range(len(peer.rollouts.completion_ids)):
                offer = diagnosis.make_offer(peer, i, self.receiver.policy, self.task,
                                             examples[i // peer.rollouts.group_size], stats, self.cfg.tbd_measure)
                if offer is None:
                    records.append({"source": peer.policy.name, "index": i, "level": "rejected", "crossed": "none",
                                    "reason": "no step reaches the receiver's tokens (or its tokenizer cannot spell "
                                              "the text)", "repairs": []})
                else:
                    offers.append(offer)
        if offers and self.cfg.measures_hidden_tbd:
            diagnosis.measure_hidden_tbd(offers, self.receiver)
        self.offered = offers
        return offers, records

    def reach(self, positions: list[int], window: list[torch.Tensor]) -> tuple[list[diagnosis.Diagnosis], torch.Tensor]:
        """The expensive diagnosis of the offers at `positions`: the receiver's step gradient norms, and R_k
        calibrated on its own step norms of this iteration and of the window's earlier ones (`window`, one tensor
        per iteration). Returns those offers' diagnoses and this iteration's own norms (empty where nothing was
        measured). Nothing is measured with CCM ablated: the intrinsic RSD signal is then off too."""
        cfg, q, offers = self.cfg, self.receiver.policy, [self.offered[k] for k in positions]
        if not offers or "ccm" in cfg.ablate:
            return [o.diagnosis for o in offers], torch.zeros(0)
        params = reachability.parameter_subset(q.model, cfg.reach_subset)
        prompt_ids = {b: q.encode_prompt(self.receiver.prompts[b]) for b in {o.prompt_index for o in offers}}
        items = [(prompt_ids[o.prompt_index], o.tgt.ids, o.ranges) for o in offers]
        norms = reachability.step_norms(q, items, params)
        mine = reachability.own_steps(q, self.receiver.rollouts, self.task.step_spans, cfg.calibration_rollouts)
        own = torch.cat(reachability.step_norms(q, mine, params)) if mine else torch.zeros(0)
        sample = torch.cat([*window, own])
        if sample.numel() == 0:
            raise ValueError(f"{q.name}'s rollouts have no step to calibrate reachability on yet")
        calibration = reachability.calibrate(sample, cfg.reach_quantile, cfg.reach_zero_quantile)
        for o, g in zip(offers, norms):
            o.diagnosis.norms = g
            o.diagnosis.reach = reachability.reachability(g, calibration)
        return [o.diagnosis for o in offers], own

    def cross(self, credit: dict[int, float], advantages: torch.Tensor, stats: reward_drift.StepStats
              ) -> tuple[dict[int, dict], sharing.Received]:
        """The offers at the positions of `credit`, each carrying its advantage there, as the receiver trains on
        them, with their repaired per-token credit (stats: the receiver's step statistics). Returns per position
        what the repairs did (fidelity_record.credit_record), and what the receiver trains on: its own rollouts'
        `advantages` [B, G] (the curator's, with the admitted peer rewards in its groups) and the crossings, with
        their sharing/ metrics."""
        cfg, crossings, crossed = self.cfg, [], {}
        for peer in self.peers:
            mine = {self.offered[k].index: (k, a) for k, a in credit.items() if self.offered[k].source is peer}
            aligned = {self.offered[k].index: (self.offered[k].src, self.offered[k].tgt, self.offered[k].alignment)
                       for k, _ in mine.values()}
            picks = [(i, a) for i, (_, a) in sorted(mine.items())]
            for c in sharing.cross(peer, picks, self.receiver.policy, self.share, aligned):
                k, a = mine[c.index]
                o = self.offered[k]
                steps, recalibrated = diagnosis.step_credit(a, o.process, o.diagnosis, stats, cfg)
                tokens = tokalign.token_credit(o.src, o.tgt, o.alignment, o.steps, steps, "tbd" not in cfg.ablate)
                crossings.append(dataclasses.replace(c, advantages=tokens))
                done = {"tbd": bool((o.diagnosis.tbd > 0).any()), "ccm": o.diagnosis.reach is not None,
                        "rsd": bool(recalibrated.any())}
                crossed[k] = fidelity_record.credit_record(o, a, steps, tokens,
                                                           [t for t in TERMS if t not in cfg.ablate and done[t]])
        metrics = sharing.crossing_metrics(crossings, self.share.ratio_cap)
        return crossed, sharing.Received(advantages, crossings, metrics)
