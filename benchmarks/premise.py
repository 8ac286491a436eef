"""The building blocks of issue 52: does an offer's fidelity predict what it does to its receiver?

    python benchmarks/premise.py validate --seed S --offers N [--iterations K ...]   # U against real lookaheads

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
1/(B G). One g_J serves every offer to r at that iteration, so its noise is shared: `validate` draws g_J twice from
independent samples and reports the split-half correlation of the two U's, the reliability of U's ordering.

Validation (`after_step`, `validate`): the real update on o, theta + lr g_o (one SGD step), then r's held-out
reward re-measured and the weights restored; the measurement before and after uses the same random draws (common
random numbers), so that only what the step changed differs. Per offer, the correlation (Spearman, with a bootstrap
interval) of U with the measured change; and at a coarser grain, where one offer's change is below what sampling
resolves, the offers of U's top and of its bottom decile each taken as one update (their mean gradient, the GRPO
loss of a batch of them): the top decile's change must exceed the bottom's.

The baselines' admission signals of an offer (`signals`): PRP's mean truncated density ratio, HACPO's
length-normalized sequence ratio s, GRAFT's compatibility weight, an F-TIS-style KL between receiver and source on
the offer, and the offer's own reward and advantage, beside the curator's D and its terms.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from scipy import stats as scipy_stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import diagnosis  # noqa: E402
import eval as evaluation  # noqa: E402
import grpo  # noqa: E402
import learner  # noqa: E402
import sharing  # noqa: E402
import train  # noqa: E402
from args import Args  # noqa: E402
from baselines import graft, hacpo  # noqa: E402
from testbed import checkpoint, policies, presets, sequences, tasks  # noqa: E402

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


def usefulness(g_offer: torch.Tensor, g_heldout: torch.Tensor) -> float:
    """U = <g_o, g_J> (both [P]): lr U is the first-order change of held-out reward of an SGD step lr on o."""
    return float(g_offer.double() @ g_heldout.double())


# ---------------------------------------------------------------------------------------------------------------
# The lookahead U is validated against
# ---------------------------------------------------------------------------------------------------------------

def heldout_reward(policy: policies.Policy, task: tasks.Task, problems: list, samples: int, max_new_tokens: int,
                   temperature: float, seed: int) -> float:
    """The policy's mean reward over `samples` completions per problem at `temperature`, drawn from a generator
    seeded with `seed`: the same seed before and after a step gives common random numbers."""
    return evaluation.heldout_accuracy(policy, problems, max_new_tokens, task, temperature=temperature,
                                       samples=samples, generator=torch.Generator(policy.device).manual_seed(seed))


def after_step(policy: policies.Policy, direction: torch.Tensor, lr: float, measure: Callable) -> float:
    """measure(policy) after the SGD step theta + lr direction ([P]: an offer's g_o, or the mean g_o of a set of
    offers, the gradient of their batch's GRPO loss); the weights are restored after. With `measure` on fixed draws
    (`heldout_reward`'s seed), measure(policy) before the step, taken once for all offers to the policy, gives the
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


def trained_learners(args: Args) -> tuple[list[learner.Learner], object]:
    """The run's learners and curator after args.iterations iterations of train.run (none: as built)."""
    learners = [learner.build(args, "tiny", i, torch.device("cpu")) for i in range(len(presets.preset(args.pair,
                                                                                                       "tiny")))]
    if args.iterations == 0:
        return learners, train.make_curator(args, [l.name for l in learners])
    run_dir = train.run(args)
    _, folder, curation = checkpoint.latest_checkpoint(run_dir)
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
            aligned = {offer.index: (offer.src, offer.tgt, offer.alignment)}
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


# ---------------------------------------------------------------------------------------------------------------
# The validation of U against real lookaheads
# ---------------------------------------------------------------------------------------------------------------

def spearman_interval(x: list[float], y: list[float], rng: random.Random, resamples: int = 2000,
                      level: float = 0.95) -> tuple[float, float, float]:
    """Spearman's rho of (x, y) and its percentile bootstrap interval over pairs resampled with replacement."""
    rho = scipy_stats.spearmanr(x, y).statistic
    draws = []
    with warnings.catch_warnings():   # a resample whose values are all one is undefined: left out, not warned of
        warnings.simplefilter("ignore", scipy_stats.ConstantInputWarning)
        for _ in range(resamples):
            picked = [rng.randrange(len(x)) for _ in x]
            r = scipy_stats.spearmanr([x[i] for i in picked], [y[i] for i in picked]).statistic
            if math.isfinite(r):
                draws.append(r)
    draws.sort()
    tail = (1 - level) / 2
    return rho, draws[int(tail * len(draws))], draws[min(int((1 - tail) * len(draws)), len(draws) - 1)]


def validate(args: Args, offers: int, heldout_prompts: int, heldout_samples: int, lookahead_prompts: int,
             lookahead_samples: int, lr: float) -> dict:
    """U of `offers` random candidates of the run's iteration args.iterations (module docstring), each beside its
    lookahead; the top and bottom deciles of U each taken as one update; prints and returns the summary."""
    started = time.process_time()
    task, _ = train.load_tasks(args)
    learners, curation = trained_learners(args)
    rng = random.Random(f"premise/{args.seed}")
    pool = candidates(args, learners, curation, task)
    picked = rng.sample(pool, min(offers, len(pool)))
    print(f"{len(pool)} diagnosed offers with A != 0 at iteration {args.iterations}; {len(picked)} drawn")
    if len(picked) < 3:
        raise SystemExit("too few offers carry a gradient to correlate anything: train longer, or draw more prompts")
    problems = task.heldout[:heldout_prompts]
    policy_of = {l.name: l.policy for l in learners}
    # every lookahead on the same draws: common random numbers between offers as between before and after
    measure = partial(heldout_reward, task=task, problems=task.heldout[:lookahead_prompts], samples=lookahead_samples,
                      max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    halves, before, rows = {}, {}, []
    t0 = time.process_time()
    for name in sorted({c.receiver.policy.name for c in picked}):
        halves[name] = [heldout_gradient(policy_of[name], task, problems, heldout_samples, args.max_new_tokens,
                                         args.temperature, torch.Generator().manual_seed(
                                             random.Random(f"premise/{args.seed}/{name}/{half}").getrandbits(63)))
                        for half in (0, 1)]
    heldout_s = time.process_time() - t0
    for name in halves:
        before[name] = measure(policy_of[name])
    for c in picked:
        policy, name = c.receiver.policy, c.receiver.policy.name
        t0 = time.process_time()
        g = candidate_gradient(c, args.temperature)
        u_halves = [usefulness(g, h) for h in halves[name]]
        t1 = time.process_time()
        delta = after_step(policy, g, lr, measure) - before[name]
        t2 = time.process_time()
        rows.append({"receiver": name, "U": sum(u_halves) / 2, "U_halves": u_halves, "delta": delta, "g": g,
                     "u_s": t1 - t0, "lookahead_s": t2 - t1})
        print(f"  {c.offer.source.policy.name} -> {name}: D {c.record['D']:.3f}, A {c.offer.advantage:+.2f}, "
              f"U {rows[-1]['U']:+.3e} (halves {u_halves[0]:+.2e}, {u_halves[1]:+.2e}), lookahead {delta:+.4f}; "
              f"CPU {t1 - t0:.2f} s for U, {t2 - t1:.1f} s for the lookahead")
    u, delta = [r["U"] for r in rows], [r["delta"] for r in rows]
    summary = {"offers": len(rows), "rho": spearman_interval(u, delta, rng),
               "split_half_rho": scipy_stats.spearmanr(*zip(*[r["U_halves"] for r in rows])).statistic,
               "u_s": sum(r["u_s"] for r in rows) / len(rows),
               "lookahead_s": sum(r["lookahead_s"] for r in rows) / len(rows),
               "heldout_gradient_s": heldout_s / len(halves)}
    ordered = sorted(rows, key=lambda r: r["U"])
    decile = max(1, len(rows) // 10)
    for label, part in (("bottom", ordered[:decile]), ("top", ordered[-decile:])):
        # one update per receiver on the decile's offers to it, as one batch: their mean g_o
        moved = [after_step(policy_of[name], torch.stack([r["g"] for r in part if r["receiver"] == name]).mean(0),
                            lr, measure) - before[name] for name in sorted({r["receiver"] for r in part})]
        summary[f"{label}_decile_delta"] = sum(moved) / len(moved)
    rho, low, high = summary["rho"]
    print(f"Spearman rho(U, lookahead) {rho:+.3f} [{low:+.3f}, {high:+.3f}] over {len(rows)} offers; split-half "
          f"rho of U {summary['split_half_rho']:+.3f}; one update on U's bottom decile moved held-out reward "
          f"{summary['bottom_decile_delta']:+.4f}, on its top decile {summary['top_decile_delta']:+.4f}; CPU s per "
          f"offer: U {summary['u_s']:.2f}, lookahead {summary['lookahead_s']:.1f}; per receiver, g_J (both halves) "
          f"{summary['heldout_gradient_s']:.1f}; {time.process_time() - started:.0f} CPU s in all")
    return summary


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = cli.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="U against real one-step lookaheads on a short cross-fidelity run")
    check.add_argument("--seed", type=int, required=True)
    check.add_argument("--offers", type=int, default=40)
    check.add_argument("--pair", default="qwen-llama")
    check.add_argument("--iterations", type=int, default=10, help="training iterations before the offers are drawn")
    check.add_argument("--prompts", type=int, default=16, help="prompts per iteration")
    check.add_argument("--group-size", type=int, default=8)
    check.add_argument("--heldout-prompts", type=int, default=128, help="held-out prompts behind g_J")
    check.add_argument("--heldout-samples", type=int, default=16, help="samples per held-out prompt, per half of g_J")
    check.add_argument("--lookahead-prompts", type=int, default=256)
    check.add_argument("--lookahead-samples", type=int, default=8)
    check.add_argument("--lr", type=float, default=1e-2, help="the lookahead's SGD step")
    check.add_argument("--warmup-scale", type=float, default=1.0, help="the tiny policies' warm-up steps, scaled")
    check.add_argument("--cache-dir", default=None, help="the warm-up cache (default: the project's)")
    check.add_argument("--runs-dir", default=None, help="where the short run goes (default: a temporary folder)")
    a = cli.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        args = Args(pair=a.pair, share="cross-fidelity", seed=a.seed, iterations=a.iterations,
                    prompts_per_iteration=a.prompts, group_size=a.group_size, runs_dir=a.runs_dir or scratch,
                    name=f"premise-{a.pair}-{a.seed}-{a.iterations}", checkpoint_every=max(a.iterations, 1),
                    eval_every=max(a.iterations, 1), eval_size=max(a.heldout_prompts, a.lookahead_prompts),
                    eval_samples=0, warmup_scale=a.warmup_scale, cache_dir=a.cache_dir)
        validate(args, a.offers, a.heldout_prompts, a.heldout_samples, a.lookahead_prompts, a.lookahead_samples,
                 a.lr)


if __name__ == "__main__":
    main()
