"""The building blocks of issue 52 (benchmarks/premise.py): usefulness U of an offer to its receiver, the lookahead
it is validated against, the baselines' admission signals, and the diagnosed offers of a cross-fidelity run.

Usefulness U. For an offer o (a peer trajectory as the receiver r trains on it: r's tokens of its text, the per-token
credit it carries into r's loss, its importance weights) and r as it is at an iteration,
    U(o) = <g_o, g_J>,
    g_o = -grad_theta L_o,   L_o r's GRPO loss (grpo.clipped_loss) on the offer alone, at ratio 1 (the first
                             optimizer step of an iteration): g_o = (1/T) sum_t w_t c_t grad log pi_r(y_t), T tokens,
                             pi_r at the sampling temperature,
    g_J = grad_theta J,      J r's expected reward on held-out prompts, sampled at the training temperature.
An SGD step of size lr on o moves theta by lr g_o, so J changes by lr U to first order: U > 0 means the update on o
raises held-out reward. The credit c_t is PRP's (the advantage the trajectory earned in the source's group, carried
onto r's tokens by byte overlap, sharing.cross) or the curator's repaired credit (diagnosis.repair_credit); w_t is
PRP's truncated density ratio, or 1.

g_J is estimated by REINFORCE over `samples` completions of r per held-out prompt (`heldout_gradient`):
    g_J ~ 1/(B G) sum_b sum_i (r_bi - b_bi) grad log pi_r(y_bi | x_b),
with the leave-one-out mean of the prompt's other G-1 rewards as baseline b_bi. The noise is kept low by that
baseline (unbiased, and it removes each prompt's reward level, which would otherwise multiply the whole sequence's
score), by prompts whose G rewards all agree contributing exactly 0, and by many samples: its variance falls as
1/(B G). One g_J serves every offer to r at that iteration, so its noise is shared: it is drawn twice from
independent samples (`heldout_halves`), and the split-half correlation of the two U's is the reliability of U's
ordering.

The lookahead (`after_step`): the real update on o, theta + lr g_o (one SGD step), then r's held-out reward
re-measured and the weights restored; before and after use the same random draws (common random numbers), so that
only what the step changed differs (premise_gate.py).

The baselines' admission signals of an offer (`signals`): PRP's mean truncated density ratio, HACPO's
length-normalized sequence ratio s, GRAFT's compatibility weight, an F-TIS-style KL between receiver and source on
the offer, and the offer's own reward and advantage, beside the curator's D and its terms.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import tyro

import diagnosis
import grpo
import learner
import sharing
import train
from analysis import premise_registered as registered
from args import Args
from baselines import graft, hacpo
from testbed import checkpoint, policies, presets, sequences, tasks

# ---------------------------------------------------------------------------------------------------------------
# Gradients as flat vectors over the receiver's trained parameters
# ---------------------------------------------------------------------------------------------------------------

def trained(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [w for w in model.parameters() if w.requires_grad]


def flat_gradient(model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    """[P] d loss / d theta over the model's trained parameters (zeros for those the loss does not reach)."""
    params = trained(model)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(w)).flatten() for g, w in zip(grads, params)])


def offer_gradient(policy: policies.Policy, prompt_ids: list[int], completion_ids: list[int], credit: torch.Tensor,
                   weights: torch.Tensor | None, temperature: float, cfg: grpo.LossConfig = grpo.LossConfig()
                   ) -> torch.Tensor:
    """[P] g_o = -grad of the receiver's GRPO loss on one trajectory alone: its tokens completion_ids [T] after
    prompt_ids, their credit [T] and importance weights [T] (None = 1), at ratio 1 (pi_old = pi_theta, the first
    optimizer step of an iteration, where the clip does not act), as grpo.grpo_step computes it."""
    batch = grpo.build_batch([prompt_ids], [completion_ids], [credit], policy.tokenizer.pad_token_id,
                             [weights] if weights is not None else None)
    device = policy.device
    logp, _ = sequences.token_logprobs_and_entropy(policy.model, batch.input_ids.to(device),
                                                   batch.attention_mask.to(device), temperature)       # [1, L-1]
    weights = batch.weights.to(device) if batch.weights is not None else None
    loss, _ = grpo.clipped_loss(logp, logp.detach(), batch.advantages.to(device), batch.mask.to(device), cfg, weights)
    return -flat_gradient(policy.model, loss)


def reinforce_scale(rewards: torch.Tensor) -> torch.Tensor:
    """[B, G] r_bi - b_bi with b_bi the mean of the prompt's other G-1 rewards (rewards [B, G], G >= 2):
    G/(G-1) (r_bi - mean_b); exactly 0 on a prompt whose rewards all agree."""
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"a leave-one-out baseline needs [prompts, samples >= 2] rewards, got {tuple(rewards.shape)}")
    g = rewards.shape[1]
    return (rewards - rewards.mean(1, keepdim=True)) * g / (g - 1)


def heldout_gradient(policy: policies.Policy, task: tasks.Task, problems: list, samples: int, max_new_tokens: int,
                     temperature: float, generator: torch.Generator, micro_batch: int = 64) -> torch.Tensor:
    """[P] the REINFORCE estimate of g_J, the gradient of the policy's expected reward on `problems` sampled at
    `temperature` (module docstring), from `samples` completions per problem drawn from `generator`."""
    rollouts = policy.rollout([task.prompt(q) for q in problems], samples, max_new_tokens, temperature,
                              generator=generator)
    scale = reinforce_scale(tasks.group_rewards(task, problems, rollouts.texts, samples)).flatten()    # [B*G]
    rows = scale.nonzero().flatten().tolist()     # the others' terms are exactly 0
    total = torch.zeros(sum(w.numel() for w in trained(policy.model)))                                  # [P]
    for i in range(0, len(rows), micro_batch):
        chunk = rows[i:i + micro_batch]
        input_ids, attention, mask = sequences.pack_sequences([rollouts.prompt_ids[r].tolist() for r in chunk],
                                                              [rollouts.completion_ids[r].tolist() for r in chunk],
                                                              policy.tokenizer.pad_token_id)
        logp, _ = sequences.token_logprobs_and_entropy(policy.model, input_ids.to(policy.device),
                                                       attention.to(policy.device), temperature)        # [n, L-1]
        sequence_logp = (logp * mask.to(policy.device)).sum(1)                                          # [n]
        total += flat_gradient(policy.model, (scale[chunk].to(sequence_logp) * sequence_logp).sum()).cpu()
    return total / scale.numel()


def heldout_halves(policy: policies.Policy, task: tasks.Task, problems: list, samples: int, args: Args, key: str
                   ) -> list[torch.Tensor]:
    """g_J drawn twice ([P] each) from independent samples, seeded by `key` (the run, the receiver, the stage):
    U is the mean of the two halves, their agreement its reliability."""
    return [heldout_gradient(policy, task, problems, samples, args.max_new_tokens, args.temperature,
                             torch.Generator().manual_seed(random.Random(f"{key}/{half}").getrandbits(63)))
            for half in (0, 1)]


def usefulness(g_offer: torch.Tensor, g_heldout: torch.Tensor) -> float:
    """U = <g_o, g_J> (both [P]): lr U is the first-order change of held-out reward of an SGD step lr on o."""
    return float(g_offer.double() @ g_heldout.double())


# ---------------------------------------------------------------------------------------------------------------
# The lookahead U is validated against
# ---------------------------------------------------------------------------------------------------------------

def heldout_rewards(policy: policies.Policy, task: tasks.Task, problems: list, samples: int, max_new_tokens: int,
                    temperature: float, seed: int, batch_size: int = 256) -> np.ndarray:
    """[B] each problem's mean reward over `samples` completions at `temperature`, drawn from a generator seeded
    with `seed`: the same seed before and after a step gives common random numbers, so that the per-problem
    differences are paired."""
    generator = torch.Generator(policy.device).manual_seed(seed)
    out = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        rollouts = policy.rollout([task.prompt(q) for q in chunk], samples, max_new_tokens, temperature,
                                  generator=generator)
        out.append(tasks.group_rewards(task, chunk, rollouts.texts, samples).double().mean(1).numpy())
    return np.concatenate(out)


def after_step(policy: policies.Policy, direction: torch.Tensor, lr: float, measure: Callable):
    """measure(policy) after the SGD step theta + lr direction ([P]: an offer's g_o, or the mean g_o of a set of
    offers, the gradient of their batch's GRPO loss); the weights are restored after. With `measure` on fixed draws
    (`heldout_rewards`' seed), measure(policy) before the step, taken once for all offers to the policy, gives the
    lookahead's change."""
    params = trained(policy.model)
    saved = torch.nn.utils.parameters_to_vector(params).detach().clone()                               # [P]
    try:
        torch.nn.utils.vector_to_parameters(saved + lr * direction.to(saved), params)
        return measure(policy)
    finally:
        torch.nn.utils.vector_to_parameters(saved, params)


# ---------------------------------------------------------------------------------------------------------------
# The admission signals of an offer
# ---------------------------------------------------------------------------------------------------------------

def prp_density_ratio(crossing: sharing.Crossing) -> float:
    """PRP's signal: the mean over the receiver's tokens of the truncated density ratio of each token's aligned
    group, min(pi_r(g) / pi_src(g), cap), the weight each token carries into the loss (sharing.cross)."""
    return crossing.weights.double().mean().item()


def sequence_ratio(source: sharing.Experience, crossing: sharing.Crossing) -> float:
    """HACPO's signal: s = exp(mean log pi_r(y) - mean log pi_src(y)), each mean over that side's own tokens of the
    text (hacpo.sequence_log_ratio, eq. 11)."""
    return math.exp(hacpo.sequence_log_ratios([(source, crossing)]).item())


def graft_compatibility(source: sharing.Experience, crossing: sharing.Crossing, delta: float) -> float:
    """GRAFT's signal: its compatibility weight min(s, 1) where s >= delta, else 0 (graft.compatibility_weights);
    its s is HACPO's sequence ratio."""
    return graft.compatibility_weights(hacpo.sequence_log_ratios([(source, crossing)]), delta).item()


def ftis_kl(crossing: sharing.Crossing) -> float:
    """An F-TIS-style KL(pi_src || pi_r) on the offer: Schulman's k3 estimator exp(x) - x - 1, x = log pi_r(g) -
    log pi_src(g), per aligned group g (the finest unit both tokenizations share: one token each where they
    agree), averaged over the groups that hold receiver tokens. The text was sampled from the source, so k3 is an
    unbiased, non-negative estimate of KL(pi_src || pi_r) per group."""
    x = crossing.log_ratio.double()                                                                    # [G']
    return (torch.exp(x) - x - 1).mean().item()


def signals(source: sharing.Experience, crossing: sharing.Crossing, graft_delta: float) -> dict[str, float]:
    """Every baseline's admission signal of one crossing, and the offer's own reward and advantage."""
    return {"prp_ratio": prp_density_ratio(crossing), "hacpo_s": sequence_ratio(source, crossing),
            "graft_weight": graft_compatibility(source, crossing, graft_delta), "ftis_kl": ftis_kl(crossing),
            "reward": crossing.reward, "advantage": source.advantages.flatten()[crossing.index].item()}


# ---------------------------------------------------------------------------------------------------------------
# Offers from a short cross-fidelity run, each with its crossing, its credit and its diagnosis
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Candidate:
    """One diagnosed offer that carries a gradient (A != 0) into one receiver, as PRP would cross it."""

    receiver: sharing.Experience
    offer: diagnosis.Offer
    crossing: sharing.Crossing      # PRP's: the source-group advantage on the receiver's tokens, truncated ratios
    repaired: torch.Tensor          # [T] the curator's repaired credit of the same tokens (diagnosis.repair_credit)
    record: dict                    # the curator's fidelity.jsonl record of the offer: D, its terms raw and scaled


def run_args(preset: str, seed: int, iterations: int, runs_dir: str, extra: tuple[str, ...] = ()) -> Args:
    """train.py's arguments of the premise's run of (preset, seed) trained to `iterations`: the registered flags,
    then `extra` (a smoke run's smaller settings; the last of a repeated flag wins)."""
    return tyro.cli(Args, args=[*registered.RUN_FLAGS, *registered.PRESETS[preset], "--seed", str(seed),
                                "--iterations", str(iterations), "--name", f"premise-{preset}-s{seed}",
                                "--runs-dir", runs_dir, *extra])


def train_to(args: Args) -> tuple[list[learner.Learner], object]:
    """The run's learners and curator after args.iterations iterations of train.run, resuming the run (same
    directory, train.py's --resume) where it exists: a later stage continues it, a repeated one trains nothing."""
    run_dir = train.run_dir_of(args)
    train.run(dataclasses.replace(args, resume=(run_dir / "config.json").exists()))
    done, folder, curation = checkpoint.latest_checkpoint(run_dir)
    if done != args.iterations:
        raise ValueError(f"{run_dir} is at iteration {done}, past {args.iterations}: its offers there are gone")
    learners = [learner.build(args, "tiny", i, torch.device("cpu"))
                for i in range(len(presets.preset(args.pair, "tiny")))]
    for l in learners:
        learner.load(l, folder)
    return learners, curation


def candidates(args: Args, learners: list[learner.Learner], curation, task: tasks.Task) -> list[Candidate]:
    """Iteration args.iterations of the run (its prompts and rollouts as the run would draw them), curated with
    every offer diagnosed (the predictor, which may skip a diagnosis, off): every diagnosed offer with A != 0."""
    it = args.iterations
    problems, prompts = train.draw_problems(args, task, it)
    experiences = [learner.experience(l, args, task, problems, prompts, learner.rollout(l, args, it, prompts)[0])
                   for l in learners]
    curation.predictor = None
    sides = {e.policy.name: diagnosis.ReceiverSide(e, [p for p in experiences if p is not e], task,
                                                   args.curator_config, args.share_config) for e in experiences}
    _, records = curation.exchange(experiences, task, problems, args.share_config, it + 1, sides)
    scored = {(r["receiver"], r["source"], r["index"]): r for r in records if "D" in r}
    out = []
    for receiver in experiences:
        name = receiver.policy.name
        for offer in sides[name].offered:
            record = scored.get((name, offer.source.policy.name, offer.index))
            if record is None or offer.advantage == 0:
                continue
            aligned = {offer.index: (offer.source_encoding, offer.receiver_encoding, offer.alignment)}
            crossing, = sharing.cross(offer.source, [(offer.index, offer.advantage)], receiver.policy,
                                      args.share_config, aligned)
            repaired, _ = diagnosis.repair_credit(offer, offer.advantage, curation.stats[name], args.curator_config)
            out.append(Candidate(receiver, offer, crossing, repaired.float(), record))
    return out


def candidate_gradient(c: Candidate, temperature: float, repaired: bool = False) -> torch.Tensor:
    """[P] g_o of the candidate as PRP's credit and truncated weights enter the loss (or its repaired credit)."""
    x = c.crossing
    return offer_gradient(c.receiver.policy, x.prompt_ids, x.completion_ids, c.repaired if repaired else x.advantages,
                          x.weights, temperature)
