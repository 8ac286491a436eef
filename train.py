"""Train two or three heterogeneous policies with GRPO at once (DESIGN.md §3, one iteration).

    python train.py --pair qwen-llama                 # tiny offline policies on a CPU, small real ones on CUDA
    python train.py --pair trio --iterations 50 --seed 2
    python train.py --share prp                       # Mutual RL's data-level sharing (also xgrpo, sgt)
    python train.py --share hacpo                     # the HACPO baseline (hacpo.py)
    python train.py --share cross-fidelity            # the curator (curator.py): diagnose, repair, admit
    python train.py --name my-run --resume            # continue a killed run from its last checkpoint

Each iteration, read top to bottom in `main`:
  1. rollouts     one set of prompts for all policies (so groups on the same prompt exist for sharing), G
                  completions per prompt from every policy;
  2. rewards      outcome rewards and each policy's own group advantages (grpo.py);
  3. exchange     what the sharing level lets cross from every peer (sharing.py), or the curator's diagnosis,
                  repair and admission of every peer trajectory (curator.py);
  4. updates      one GRPO update per policy on its own rollouts and what it received;
  5. bookkeeping  metrics, held-out evaluation, checkpoint.
Metrics go to runs/NAME/metrics.jsonl, one line per policy and iteration, under stable names (charts/, losses/,
sharing/, fidelity/, eval/, perf/); a cross-fidelity run logs every curation decision to runs/NAME/fidelity.jsonl;
checkpoints to runs/NAME/checkpoints (checkpoint.py); the evaluation report (eval.py) to runs/NAME at the end.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import tyro
from tqdm import tqdm

import checkpoint
import coevolution
import curator
import eval as evaluation
import grpo
import hacpo
import hardware
import lora
import policies
import sharing
import tasks


@dataclass
class Args:
    pair: Literal["qwen-llama", "qwen-qwen", "trio"] = "qwen-llama"
    """which policies train together: cross-family, same family at two sizes, or three families"""
    scale: Literal["tiny", "small", "paper"] | None = None
    """model sizes (policies.py): tiny offline models; ~1B real models; the proposal's 3B-8B. Default: small on
    CUDA, tiny otherwise"""
    model_paths: tuple[str, ...] = ()
    """NAME=PATH per policy to load a model id or a local directory instead of the preset's, e.g. qwen=/models/q"""
    model_dir: str | None = None
    """a directory with one folder per real policy, named like the last part of its hub id
    (e.g. DIR/Qwen2.5-0.5B-Instruct, as `hf download` makes with --local-dir); --model-paths takes precedence"""
    share: Literal["none", "prp", "xgrpo", "sgt", "hacpo", "cross-fidelity"] = "none"
    """how experience crosses between policies (sharing.py): none = independent GRPO; prp = peer rollouts join the
    batch with truncated density ratios; xgrpo = peer rewards join the group baseline; sgt = peer successes
    rescue prompts the receiver failed; hacpo = HACPO (hacpo.py): a capability-aware baseline over all policies'
    rewards, and peer rollouts with sequence-level ratios clipped to [1 - delta, 1]; cross-fidelity = the
    curator (curator.py) diagnoses every peer rollout, repairs it and admits it to one of the three levels or
    rejects it"""
    fidelity_lambdas: tuple[float, float, float] = curator.CuratorConfig.lambdas
    """cross-fidelity: weights of the TBD, CCM and RSD terms in the degradation D (summing to 1)"""
    theta1: float = curator.CuratorConfig.theta1
    """cross-fidelity: a repaired degradation D_repaired below it admits a trajectory to PRP (the starting value
    with --thresholds adaptive)"""
    theta2: float = curator.CuratorConfig.theta2
    """cross-fidelity: D_repaired at or above it leaves only SGT; in between, XGRPO"""
    ccm_beta: float = curator.CuratorConfig.ccm_beta
    """cross-fidelity: the CCM repair's exponent, A_k <- A_k R_k^beta"""
    ablate: tuple[Literal["tbd", "ccm", "rsd"], ...] = curator.CuratorConfig.ablate
    """cross-fidelity: diagnoses (and their repairs) switched off"""
    thresholds: Literal["fixed", "adaptive"] = "fixed"
    """cross-fidelity: theta1, theta2 as given, or co-evolving per pair (coevolution.py's bandit)"""
    tbd_measure: Literal["credit", "hidden", "jaccard"] = curator.CuratorConfig.tbd_measure
    """cross-fidelity: how the TBD term is measured (boundary_drift.py): the credit tokens mix across step
    boundaries; the proposal's hidden-state similarity through a linear map fitted on exact 1:1 groups; or the
    byte-boundary Jaccard index (differs wherever the tokenizations do)"""
    process_signal: Literal["vpr", "intrinsic"] = curator.CuratorConfig.process_signal
    """cross-fidelity: RSD repair with verified step credit where a step can be checked, or the intrinsic
    gradient-norm signal on every step"""
    predictor: bool = True
    """cross-fidelity: let the fidelity predictor skip the gradient-norm diagnosis where it is sure"""
    ratio_cap: float = sharing.ShareConfig.ratio_cap
    """prp, sgt: the truncation of the group-wise density ratio pi_receiver / pi_peer (2 as in truncated
    importance sampling); no weight exceeds it"""
    hacpo_alpha: float = sharing.ShareConfig.hacpo_alpha
    """hacpo: a peer rollout's weight is s^(1 + alpha), s its length-normalized sequence ratio (eq. 12)"""
    hacpo_delta: float = sharing.ShareConfig.hacpo_delta
    """hacpo: a peer rollout crosses only with s in [1 - delta, 1] (eq. 13)"""
    hacpo_window: int = sharing.ShareConfig.hacpo_window
    """hacpo: iterations over which each policy's mean reward is averaged into its capability (eq. 9)"""
    hacpo_capability_bound: float = sharing.ShareConfig.hacpo_capability_bound
    """hacpo: capability ratios P_receiver / P_peer are clamped to [1/bound, bound]"""
    iterations: int = 100
    """training iterations; each updates every policy once"""
    prompts_per_iteration: int = 16
    """prompts drawn per iteration, the same for every policy"""
    group_size: int = 8
    """G: completions sampled per prompt"""
    max_new_tokens: int = 40
    """completion length limit in tokens"""
    temperature: float = 0.7
    """sampling temperature of rollouts; the policy optimized is the model at this temperature (its logits are
    divided by it in the loss too), so the rollouts stay on-policy"""
    top_p: float = 1.0
    """nucleus sampling threshold of rollouts"""
    lr: float = 1e-4
    """AdamW learning rate of every policy (tiny policies lose accuracy above ~1e-4: Adam's early steps are
    sign-like and a noisy policy gradient then moves every weight at once)"""
    scale_by_std: bool = sharing.ShareConfig.scale_by_std
    """divide group advantages by the group's reward std (GRPO); off gives Dr. GRPO's centred rewards"""
    aggregation: Literal["sequence", "token"] = grpo.LossConfig.aggregation
    """loss aggregation: per-sequence means (GRPO) or one mean over all tokens of the batch (DAPO)"""
    clip_eps_low: float = grpo.LossConfig.clip_eps_low
    """lower clip range of the importance ratio"""
    clip_eps_high: float = grpo.LossConfig.clip_eps_high
    """upper clip range of the importance ratio (DAPO's clip-higher raises it)"""
    beta: float = grpo.LossConfig.beta
    """weight of the k3 KL penalty to the policy as it was after warm-up; 0 holds no reference model"""
    epochs: int = 1
    """optimization passes over each iteration's batch"""
    micro_batch: int = sharing.ShareConfig.micro_batch
    """sequences per forward/backward pass (gradient accumulation); memory, not maths"""
    max_grad_norm: float = 1.0
    """gradient clipping"""
    task: Literal["arith", "gsm8k", "math", "humaneval", "mbpp", "proofnet"] = "arith"
    """what the policies train on (tasks.load_task): the embedded arithmetic task, or a real benchmark read from
    --data-dir, the Hugging Face cache or the hub"""
    eval_task: Literal["arith", "gsm8k", "math", "humaneval", "mbpp", "proofnet"] | None = None
    """a second task evaluated beside the training task's held-out split (transfer, proposal §3.3); its
    accuracy is logged as eval/transfer_accuracy"""
    data_dir: str | None = None
    """local copy of the training task's data set (see tasks.load_task for the layouts it reads)"""
    eval_data_dir: str | None = None
    """local copy of the evaluation task's data set"""
    num_steps: int = tasks.TaskConfig.num_steps
    """task: operations per problem"""
    max_operand: int = tasks.TaskConfig.max_operand
    """task: operands are drawn from 1..max_operand"""
    ops: str = tasks.TaskConfig.ops
    """task: operations, a subset of '+-*'"""
    step_format: Literal["line", "inline", "prose"] = tasks.TaskConfig.step_format
    """task: how solutions write their steps (tasks.py): one per line; on one line, separated by '; '; or as
    sentences in words run together ('7 plus 5 is 12.Then ...'), whose boundaries fall inside a token for some
    families and not for others (the TBD diagnosis)"""
    train_size: int = 5000
    """training problems drawn once; prompts are sampled from them"""
    eval_size: int = 500
    """held-out problems for greedy pass@1"""
    eval_every: int = 20
    """iterations between held-out evaluations (also run before the first and after the last)"""
    eval_samples: int = 2
    """completions per held-out problem sampled at the training temperature for eval/heldout_sampled_accuracy
    (what the training reward measures, beside greedy pass@1); 0 skips it"""
    warmup_scale: float = 1.0
    """multiplies each tiny policy's supervised warm-up budget (tests use a small one)"""
    seed: int = 1
    """seeds models, warm-up, problems and sampling; a CPU run is repeatable"""
    name: str | None = None
    """run name; default PAIR-SHARE-sSEED"""
    runs_dir: str = "runs"
    """where run directories are made"""
    cache_dir: str | None = None
    """warm-up cache; default ~/.cache/cross-fidelity"""
    checkpoint_every: int = 10
    """iterations between checkpoints (the last iteration is always saved)"""
    resume: bool = False
    """continue the run NAME from its last checkpoint"""
    devices: str | None = None
    """comma-separated torch devices, policy i on device i (round robin), e.g. cuda:0,cuda:1; policies on their
    own GPUs roll out and update in parallel. Default: cuda if available, else cpu"""
    lora_rank: int = 0
    """train LoRA adapters of this rank on every linear layer of the blocks instead of all parameters (peft);
    the KL reference is then the model with its adapters off. 0 trains every parameter"""
    lora_alpha: float = 32.0
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)"""
    gradient_checkpointing: bool = False
    """recompute each block's activations in the backward pass: less memory, about a third more update time"""

    def __post_init__(self):
        malformed = [item for item in self.model_paths if "=" not in item]
        if malformed:
            raise ValueError(f"--model-paths takes NAME=PATH items, got {malformed}")
        for name in ("iterations", "eval_every", "checkpoint_every", "epochs", "micro_batch"):
            if getattr(self, name) < (0 if name == "iterations" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.prompts_per_iteration < 1 or self.group_size < 2:
            raise ValueError(f"need at least one prompt and two completions per prompt (a group), got "
                             f"{self.prompts_per_iteration} and {self.group_size}")

    @property
    def task_config(self) -> tasks.TaskConfig:
        return tasks.TaskConfig(num_steps=self.num_steps, max_operand=self.max_operand, ops=self.ops,
                                step_format=self.step_format)

    def policy_setup(self, scale: str) -> hardware.PolicySetup:
        return hardware.PolicySetup.of({**asdict(self), "scale": scale})

    @property
    def share_config(self) -> sharing.ShareConfig:
        if self.share == "hacpo" and self.epochs > 1:
            raise ValueError("--share hacpo makes one update per iteration (--epochs 1): its stepwise clipping "
                             "(eq. 14) and sequence ratios belong to each update, and later epochs reuse the first's")
        return sharing.ShareConfig(self.share, self.ratio_cap, scale_by_std=self.scale_by_std,
                                   temperature=self.temperature, micro_batch=self.micro_batch,
                                   hacpo_alpha=self.hacpo_alpha, hacpo_delta=self.hacpo_delta,
                                   hacpo_window=self.hacpo_window, hacpo_capability_bound=self.hacpo_capability_bound)

    @property
    def loss_config(self) -> grpo.LossConfig:
        return grpo.LossConfig(self.clip_eps_low, self.clip_eps_high, self.beta, self.aggregation)

    @property
    def curator_config(self) -> curator.CuratorConfig:
        return curator.CuratorConfig(self.fidelity_lambdas, self.theta1, self.theta2, self.ccm_beta, self.ablate,
                                     tbd_measure=self.tbd_measure, process_signal=self.process_signal)


@dataclass
class Trainee:
    """One policy in training: the policy (model, tokenizer, device), its optimizer and its KL reference."""

    policy: policies.Policy
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | lora.WithoutAdapters | None


def prompt_sampler(seed: int, iteration: int) -> random.Random:
    """The iteration's prompt sampler, seeded by the iteration alone, so a resumed run draws what it would have."""
    return random.Random(f"{seed}/{iteration}")


def policy_generator(phase: str, seed: int, iteration: int, policy: policies.Policy) -> torch.Generator:
    """One policy's draws for one phase ("rollout", "evaluation") of one iteration, seeded by those alone: neither
    the order the policies sample in, nor how many draws another policy made, nor a resume changes a draw."""
    draw = random.Random(f"{phase}/{seed}/{iteration}/{policy.name}").getrandbits(63)
    return torch.Generator(policy.device).manual_seed(draw)


def load_tasks(args: Args) -> tuple[tasks.Task, tasks.Task | None]:
    """The training task and the transfer task of --eval-task (or None), refused where they cannot train."""
    task = tasks.load_task(args.task, args.seed, args.train_size, args.eval_size, args.task_config, args.data_dir)
    transfer = (tasks.load_task(args.eval_task, args.seed, 0, args.eval_size, args.task_config, args.eval_data_dir)
                if args.eval_task else None)
    if not task.verifiable:
        raise ValueError(f"{args.task} has no automatic checker (its reward is always 0): train on another task and "
                         f"evaluate with --eval-task")
    if len(task.train) < args.prompts_per_iteration or not task.heldout:
        raise ValueError(f"{args.task}: {len(task.train)} training and {len(task.heldout)} held-out examples, need "
                         f"at least --prompts-per-iteration={args.prompts_per_iteration} and one")
    return task, transfer


def make_trainees(args: Args, scale: str, devices: list[torch.device]) -> list[Trainee]:
    pols = hardware.build_policies(args.policy_setup(scale), devices, args.task_config)
    return [Trainee(p, torch.optim.AdamW([w for w in p.model.parameters() if w.requires_grad], lr=args.lr,
                                         weight_decay=0.0),
                    lora.reference_policy(p.model) if args.beta > 0 else None) for p in pols]


def make_curator(args: Args, names: list[str]) -> curator.Curator:
    """The curator of --share cross-fidelity, configured by the run's flags."""
    return curator.Curator(args.curator_config, names, args.seed,
                           coevolution.BanditConfig() if args.thresholds == "adaptive" else None,
                           coevolution.PredictorConfig() if args.predictor else None)


def print_estimates(args: Args, pols: list[policies.Policy], prompt_len: int) -> None:
    """Parameters, memory terms and a time bound per policy (hardware.estimate), before the first iteration."""
    rollouts = args.prompts_per_iteration * args.group_size
    received = {"none": 0, "xgrpo": 0, "sgt": rollouts // 4, "prp": rollouts, "hacpo": rollouts,
                "cross-fidelity": rollouts}[args.share] * (len(pols) - 1)
    print("estimate per iteration (a bound to check the fit, not a measurement):")
    per_device: dict[torch.device, int] = {}
    throughput: dict[tuple[torch.device, torch.dtype], float] = {}
    for p in pols:
        work = hardware.Workload(rollouts, prompt_len, args.max_new_tokens, min(args.micro_batch, rollouts + received),
                                 rollouts + received, args.gradient_checkpointing,
                                 reference_copy=args.beta > 0 and not args.lora_rank)
        est = hardware.estimate(p.model, work)
        per_device[p.device] = per_device.get(p.device, 0) + est.total_bytes
        key = (p.device, next(p.model.parameters()).dtype)
        if key not in throughput:
            throughput[key] = hardware.matmul_flops_per_s(*key, n=512 if p.device.type == "cpu" else 4096)
        print(hardware.describe(p.name, est, throughput[key]))
    for device, total in per_device.items():
        if device.type == "cuda":
            capacity = torch.cuda.mem_get_info(device)[1]
            print(f"  {device}: ~{total / 1024 ** 3:.1f} GiB of {capacity / 1024 ** 3:.1f} GiB: "
                  f"{'fits' if total < capacity else 'DOES NOT FIT'}")


def sample(policy: policies.Policy, prompts: list[str], args: Args, iteration: int
           ) -> tuple[policies.Rollouts, dict[str, float]]:
    """Phase 1 for one policy: G completions per prompt, and the phase's speed."""
    with hardware.measured(policy.device) as perf:
        out = policy.rollout(prompts, args.group_size, args.max_new_tokens, args.temperature, args.top_p,
                             generator=policy_generator("rollout", args.seed, iteration, policy))
    return out, hardware.perf_metrics("rollout", sum(len(ids) for ids in out.completion_ids), perf)


def training_batch(policy: policies.Policy, rollouts: policies.Rollouts, received: sharing.Received
                   ) -> grpo.TrainBatch:
    """The policy's own rollouts, their advantages spread over every completion token with weight 1, and the
    peer trajectories it received with their own per-token advantages and weights."""
    advantages = received.advantages.flatten()                                          # [B*G]
    prompts = [p.tolist() for p in rollouts.prompt_ids] + [c.prompt_ids for c in received.crossings]
    completions = [c.tolist() for c in rollouts.completion_ids] + [c.completion_ids for c in received.crossings]
    token_advantages = ([a.expand(len(ids)) for a, ids in zip(advantages, rollouts.completion_ids)]
                        + [c.advantages for c in received.crossings])
    token_weights = ([torch.ones(len(ids)) for ids in rollouts.completion_ids]
                     + [c.weights for c in received.crossings])
    return grpo.build_batch(prompts, completions, token_advantages, policy.tokenizer.pad_token_id, token_weights)


def update(job: tuple[Trainee, sharing.Experience, sharing.Received], args: Args, measure_kl: bool
           ) -> dict[str, float]:
    """Phase 4 for one policy: a GRPO update on its own rollouts and what it received, and the phase's speed."""
    trainee, experience, received = job
    batch = training_batch(trainee.policy, experience.rollouts, received)
    with hardware.measured(trainee.policy.device) as perf:
        stats = grpo.grpo_step(trainee.policy.model, trainee.optimizer, batch, args.loss_config, args.epochs,
                               args.micro_batch, args.max_grad_norm, trainee.reference, args.temperature,
                               measure_kl=measure_kl)
    return {**stats, **hardware.perf_metrics("update", batch.mask.sum().item() * args.epochs, perf)}


def log_evaluation(pols: list[policies.Policy], task: tasks.Task, transfer: tasks.Task | None, args: Args,
                   iteration: int, started: float, path: Path) -> dict[str, float]:
    """Phase 5's evaluation, one line per policy in metrics.jsonl: greedy pass@1 on the held-out split, accuracy
    sampled at the training temperature, greedy pass@1 on the transfer task. Returns each policy's greedy pass@1."""
    accuracy = {}
    for p in pols:
        record = {"eval/heldout_accuracy": evaluation.heldout_accuracy(p, task.heldout, args.max_new_tokens, task)}
        if args.eval_samples:
            record["eval/heldout_sampled_accuracy"] = evaluation.heldout_accuracy(
                p, task.heldout, args.max_new_tokens, task, temperature=args.temperature, samples=args.eval_samples,
                generator=policy_generator("evaluation", args.seed, iteration, p))
        if transfer is not None:
            record["eval/transfer_accuracy"] = evaluation.heldout_accuracy(p, transfer.heldout, args.max_new_tokens,
                                                                           transfer)
        log(path, {"iteration": iteration, "policy": p.name, "time_s": time.time() - started, **record})
        accuracy[p.name] = record["eval/heldout_accuracy"]
    return accuracy


def log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main(args: Args) -> Path:
    # ---- set-up: run directory, tasks, policies, curator; a resumed run restores its last checkpoint ----------
    scale = args.scale or policies.default_scale()
    devices = hardware.policy_devices(args.devices, len(policies.PRESETS[scale][args.pair]))
    parallel = hardware.runs_in_parallel(devices)
    run_dir = Path(args.runs_dir) / (args.name or f"{args.pair}-{args.share}-s{args.seed}")
    metrics_path, fidelity_path = run_dir / "metrics.jsonl", run_dir / "fidelity.jsonl"
    config = json.loads(json.dumps({**asdict(args), "scale": scale}))  # as it reads back from config.json
    print(f"pair={args.pair} scale={scale} devices={','.join(map(str, devices))} run={run_dir}")
    task, transfer = load_tasks(args)
    checkpoint.open_run(run_dir, config, args.resume)
    started = time.time()
    trainees = make_trainees(args, scale, devices)
    pols = [t.policy for t in trainees]
    longest_prompt = max(len(p.encode_prompt(task.prompt(q)))
                         for p in pols for q in task.train[:50] + task.heldout[:50])
    print_estimates(args, pols, longest_prompt)
    curation = make_curator(args, [p.name for p in pols]) if args.share == "cross-fidelity" else None
    capabilities = hacpo.Capabilities(args.share_config.hacpo_window) if args.share == "hacpo" else None

    start = 0
    if args.resume and (run_dir / "checkpoints" / "latest").exists():
        start, saved = checkpoint.load_checkpoint(run_dir, pols, [t.optimizer for t in trainees])
        curation = (saved or curation) if curation is not None else None        # the state of this run's --share
        capabilities = (saved or capabilities) if capabilities is not None else None
        print(f"resumed from iteration {start}")
    for path in (metrics_path, fidelity_path):   # a resumed run repeats no line and loses none; a fresh one keeps none
        checkpoint.truncate_metrics(path, start if start else -1)
    accuracy = log_evaluation(pols, task, transfer, args, 0, started, metrics_path) if start == 0 else \
        {p.name: float("nan") for p in pols}
    guarded = curation is not None and curation.bandit is not None   # the stability guard reads losses/update_kl

    bar = tqdm(range(start, args.iterations), initial=start, total=args.iterations, desc="train")
    for it in bar:
        # ---- 1. rollouts -------------------------------------------------------------------------------------
        iteration_started = time.time()
        problems = prompt_sampler(args.seed, it).sample(task.train, args.prompts_per_iteration)
        prompts = [task.prompt(q) for q in problems]
        sampled = hardware.per_policy(partial(sample, prompts=prompts, args=args, iteration=it), pols, parallel)

        # ---- 2. rewards and advantages -----------------------------------------------------------------------
        experiences = []
        for p, (rollouts, _) in zip(pols, sampled):
            rewards = tasks.group_rewards(task, problems, rollouts.texts, args.group_size)                   # [B, G]
            experiences.append(sharing.Experience(p, prompts, rollouts, rewards,
                                                  grpo.group_advantages(rewards, args.scale_by_std)))
        # the stability guard's verdict on the previous cycle, now that the rollouts its update produced exist
        verdicts = {e.policy.name: curation.judge(e.policy.name, grpo.rewards_stats(e.rewards)["charts/reward_std"])
                    for e in experiences} if curation is not None else {}

        # ---- 3. exchange -------------------------------------------------------------------------------------
        if curation is not None:
            received, decisions = curation.exchange(experiences, task, problems, args.share_config, it + 1)
            for record in decisions:
                log(fidelity_path, record)
        else:
            received = sharing.exchange(experiences, args.share_config, capabilities)

        # ---- 4. updates --------------------------------------------------------------------------------------
        jobs = [(t, e, received[t.policy.name]) for t, e in zip(trainees, experiences)]
        updates = hardware.per_policy(partial(update, args=args, measure_kl=guarded), jobs, parallel)

        # ---- 5. log, evaluate, checkpoint --------------------------------------------------------------------
        for e, (_, rollout_perf), stats in zip(experiences, sampled, updates):
            name = e.policy.name
            stats.update(rollout_perf)
            stats.update(grpo.rewards_stats(e.rewards))
            stats.update(received[name].metrics)
            if curation is not None:
                curation.updated(name, stats)
            if verdicts.get(name) is not None:
                stats["fidelity/guard_tripped"] = float(bool(verdicts[name]))
            stats["charts/finished"] = sum(e.rollouts.finished) / len(e.rollouts.finished)
            stats["perf/iteration_s"] = time.time() - iteration_started   # the method's cost: no evaluation in it
            log(metrics_path, {"iteration": it + 1, "policy": name, "time_s": time.time() - started, **stats})
        done = it + 1
        if done % args.eval_every == 0 or done == args.iterations:
            accuracy = log_evaluation(pols, task, transfer, args, done, started, metrics_path)
        if done % args.checkpoint_every == 0 or done == args.iterations:
            checkpoint.save_checkpoint(run_dir, done, pols, [t.optimizer for t in trainees],
                                       curation if curation is not None else capabilities)
        bar.set_postfix({f"{e.policy.name}_r": f"{e.rewards.mean():.2f}" for e in experiences} |
                        {f"{n}_acc": f"{a:.2f}" for n, a in accuracy.items()})

    report = evaluation.write_report(run_dir)
    print(report)
    print(f"done in {time.time() - started:.0f}s; report in {run_dir / 'report.md'}")
    return run_dir


if __name__ == "__main__":
    main(tyro.cli(Args))
