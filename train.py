"""Train two or three heterogeneous policies with GRPO at once (DESIGN.md §3, one iteration).

    python train.py --pair qwen-llama                 # tiny offline policies on a CPU, small real ones on CUDA
    python train.py --pair trio --iterations 50 --seed 2
    python train.py --share prp                       # Mutual RL's data-level sharing (also xgrpo, sgt)
    python train.py --share hacpo                     # the HACPO baseline (hacpo.py)
    python train.py --share graft --minibatches 2     # the GRAFT baseline (graft.py), two optimizer steps each
    python train.py --share cross-fidelity            # the curator (curator.py): diagnose, repair, admit
    python train.py --name my-run --resume            # continue a killed run from its last checkpoint
    python train.py --backend ray --ray-address auto  # each policy a Ray actor, on a cluster (ray_team.py)

Each iteration, read top to bottom in `run`. Each policy is a handle (backends.py) whose work runs where the
policy is: in this process (--backend local) or in its Ray actor (--backend ray), where its calls return futures
that `team.get` waits for; the loop is the same for both.
  1. rollouts     one set of prompts for all policies (so groups on the same prompt exist for sharing), G
                  completions per prompt from every policy;
  2. rewards      outcome rewards and each policy's own group advantages (grpo.py), where the policy is;
  3. exchange     every policy's trajectories to every peer; then what the sharing level lets cross (sharing.py),
                  each receiver's part where it is, or the curator's diagnosis, repair and admission of every peer
                  trajectory (curator.py);
  4. updates      GRPO updates per policy on its own rollouts and what it received (--minibatches steps, own
                  rollouts first);
  5. bookkeeping  metrics, held-out evaluation, checkpoint.
Which curator steps run where the receiver is, and what crosses between a policy and the trainer (trajectories
and diagnoses, never weights): backends.py's docstring.
Metrics go to runs/NAME/metrics.jsonl, one line per policy and iteration, under stable names (charts/, losses/,
sharing/, fidelity/, eval/, perf/), and with --tensorboard as TensorBoard events under the same names
(metrics_log.py); a cross-fidelity run logs every curation decision to runs/NAME/fidelity.jsonl; checkpoints go
to runs/NAME/checkpoints (checkpoint.py; each policy writes its own part), the evaluation report (eval.py) to
runs/NAME at the end.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import tyro
from tqdm import tqdm

import backends
import checkpoint
import coevolution
import curator
import data
import diagnosis
import eval as evaluation
import arith
import grpo
import hacpo
import hardware
import metrics_log
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
    share: Literal["none", "prp", "xgrpo", "sgt", "hacpo", "graft", "cross-fidelity"] = "none"
    """how experience crosses between policies (sharing.py): none = independent GRPO; prp = peer rollouts join the
    batch with truncated density ratios; xgrpo = peer rewards join the group baseline; sgt = peer successes
    rescue prompts the receiver failed; hacpo = HACPO (hacpo.py): a capability-aware baseline over all policies'
    rewards, and peer rollouts with sequence-level ratios clipped to [1 - delta, 1]; graft = GRAFT (graft.py): a
    peer's mixed group replaces the receiver's failed group on a prompt, weighted by compatibility;
    cross-fidelity = the curator (curator.py) diagnoses every peer rollout, repairs it and admits it to one of the
    three levels or rejects it"""
    fidelity_lambdas: tuple[float, float, float] = diagnosis.CuratorConfig.lambdas
    """cross-fidelity: weights of the TBD, CCM and RSD terms in the degradation D (summing to 1)"""
    theta1: float | None = diagnosis.CuratorConfig.theta1
    """cross-fidelity: a degradation D below it admits a trajectory to PRP (the level --thresholds adaptive raises
    from). Default: the share rule on the calibration sample, for the run's weights and ablations (term_scales.py)"""
    theta2: float | None = diagnosis.CuratorConfig.theta2
    """cross-fidelity: D at or above it leaves only SGT; in between, XGRPO. Default: the calibration sample's"""
    calibration: Literal["window", "none"] = diagnosis.CuratorConfig.calibration
    """cross-fidelity: window = each term scaled by its distribution over the receiver's diagnosed offers of the
    last --calibration-window iterations, which also set the default thresholds (term_scales.py); none = raw
    terms, and --theta1 and --theta2 must be given"""
    calibration_window: int = diagnosis.CuratorConfig.calibration_window
    """cross-fidelity: iterations of each receiver's diagnosed offers, the current one included, in its
    calibration sample"""
    admission: Literal["diagnosis", "random"] = "diagnosis"
    """cross-fidelity: each offer at the band of its diagnosis, or the control: the bands permuted at random among
    each source's offers of the iteration (same shares, same rescues)"""
    ccm_beta: float = diagnosis.CuratorConfig.ccm_beta
    """cross-fidelity: the CCM repair's exponent, A_k <- A_k R_k^beta"""
    ablate: tuple[Literal["tbd", "ccm", "rsd"], ...] = diagnosis.CuratorConfig.ablate
    """cross-fidelity: diagnoses (and their repairs) switched off"""
    thresholds: Literal["fixed", "adaptive"] = "fixed"
    """cross-fidelity: theta1, theta2 as given, or co-evolving per pair (coevolution.py's bandit)"""
    tbd_measure: Literal["credit", "hidden", "jaccard"] = diagnosis.CuratorConfig.tbd_measure
    """cross-fidelity: how the TBD term is measured (boundary_drift.py): the credit tokens mix across step
    boundaries; the proposal's hidden-state similarity through a linear map fitted on exact 1:1 groups; or the
    byte-boundary Jaccard index (differs wherever the tokenizations do)"""
    process_signal: Literal["vpr", "intrinsic"] = diagnosis.CuratorConfig.process_signal
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
    hacpo_delta_step: float = sharing.ShareConfig.hacpo_delta_step
    """hacpo: the clip range's lower bound rises by it with each optimizer step of an iteration (eq. 14)"""
    graft_delta: float = sharing.ShareConfig.graft_delta
    """graft: a peer trajectory crosses only with compatibility s >= delta, weighted min(s, 1)"""
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
    minibatches: int = sharing.ShareConfig.minibatches
    """optimizer steps per pass: the batch is split into this many consecutive parts, own rollouts first and peer
    trajectories last (grpo.minibatch_rows), all against the policy before the first step"""
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
    num_steps: int = arith.TaskConfig.num_steps
    """task: operations per problem"""
    max_operand: int = arith.TaskConfig.max_operand
    """task: operands are drawn from 1..max_operand"""
    ops: str = arith.TaskConfig.ops
    """task: operations, a subset of '+-*'"""
    step_format: Literal["line", "inline", "prose"] = arith.TaskConfig.step_format
    """task: how solutions write their steps (arith.py): one per line; on one line, separated by '; '; or as
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
    """run name; default PAIR-SHARE-sSEED, then the task, step format, TBD measure, ablations, thresholds,
    process signal, scale and LoRA rank where they differ from their defaults (checkpoint.run_name)"""
    runs_dir: str = "runs"
    """where run directories are made"""
    cache_dir: str | None = None
    """warm-up cache; default ~/.cache/cross-fidelity"""
    checkpoint_every: int = 10
    """iterations between checkpoints (the last iteration is always saved)"""
    resume: bool = False
    """continue the run NAME from its last checkpoint"""
    tensorboard: bool = False
    """also write every metric as TensorBoard events under the same names, in runs/NAME/tensorboard/POLICY
    (`tensorboard --logdir runs`); metrics.jsonl stays the record eval.py reads"""
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
    backend: Literal["local", "ray"] = "local"
    """where each policy's work runs (backends.py): in this process, or in a Ray actor of its own on this machine
    or across a cluster (ray_team.py); on a CPU both give the same metrics for the same seed"""
    ray_address: str | None = None
    """--backend ray: the cluster to join, `auto` for the one `ray start` made on this node or HEAD_IP:6379.
    Default: a Ray of this machine's own, started for the run and stopped after it"""
    cpus_per_policy: int = 1
    """--backend ray: CPUs that Ray reserves for each policy's actor, which are its torch threads too"""
    gpus_per_policy: float | None = None
    """--backend ray: GPUs that Ray reserves for each policy's actor, at most 1 (a policy trains on one device; a
    fraction packs several actors on one GPU). Default: 1 where the cluster has a GPU, else 0"""

    def __post_init__(self):
        malformed = [item for item in self.model_paths if "=" not in item]
        if malformed:
            raise ValueError(f"--model-paths takes NAME=PATH items, got {malformed}")
        for name in ("iterations", "eval_every", "checkpoint_every", "epochs", "micro_batch", "minibatches"):
            if getattr(self, name) < (0 if name == "iterations" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.prompts_per_iteration < 1 or self.group_size < 2:
            raise ValueError(f"need at least one prompt and two completions per prompt (a group), got "
                             f"{self.prompts_per_iteration} and {self.group_size}")
        if self.minibatches > self.prompts_per_iteration * self.group_size:
            raise ValueError(f"--minibatches {self.minibatches} exceeds the {self.prompts_per_iteration} x "
                             f"{self.group_size} rollouts of an iteration")
        if self.backend == "local" and (self.ray_address is not None or self.gpus_per_policy is not None):
            raise ValueError("--ray-address and --gpus-per-policy place Ray actors: add --backend ray")
        if self.backend == "ray" and self.devices is not None:
            raise ValueError("under --backend ray, Ray gives each policy's actor its devices: drop --devices and "
                             "set --gpus-per-policy")
        if self.cpus_per_policy < 1 or not 0 <= (self.gpus_per_policy or 0) <= 1:
            raise ValueError(f"--cpus-per-policy must be at least 1 and --gpus-per-policy within [0, 1], got "
                             f"{self.cpus_per_policy} and {self.gpus_per_policy}")
        if self.share == "hacpo" and self.epochs > 1:
            raise ValueError("--share hacpo makes one pass per iteration (--epochs 1; --minibatches gives it several "
                             "steps): its sequence ratios are measured once, and later epochs would reuse them")
        try:   # here, not after the warm-up: the curator's own checks, in the flags' names
            self.curator_config
        except ValueError as err:
            raise ValueError(f"cross-fidelity settings (--fidelity-lambdas, --theta1, --theta2, --calibration[-window], "
                             f"--ablate, --process-signal): {err}") from None

    @property
    def task_config(self) -> arith.TaskConfig:
        return arith.TaskConfig(num_steps=self.num_steps, max_operand=self.max_operand, ops=self.ops,
                                step_format=self.step_format)

    def policy_setup(self, scale: str) -> hardware.PolicySetup:
        return hardware.PolicySetup.of({**asdict(self), "scale": scale})

    @property
    def share_config(self) -> sharing.ShareConfig:
        return sharing.ShareConfig(self.share, self.ratio_cap, scale_by_std=self.scale_by_std,
                                   temperature=self.temperature, micro_batch=self.micro_batch,
                                   hacpo_alpha=self.hacpo_alpha, hacpo_delta=self.hacpo_delta,
                                   hacpo_window=self.hacpo_window, hacpo_capability_bound=self.hacpo_capability_bound,
                                   hacpo_delta_step=self.hacpo_delta_step, graft_delta=self.graft_delta,
                                   minibatches=self.minibatches)

    @property
    def loss_config(self) -> grpo.LossConfig:
        return grpo.LossConfig(self.clip_eps_low, self.clip_eps_high, self.beta, self.aggregation)

    @property
    def curator_config(self) -> diagnosis.CuratorConfig:
        return diagnosis.CuratorConfig(self.fidelity_lambdas, self.theta1, self.theta2, self.calibration,
                                     self.calibration_window, self.admission, self.ccm_beta, self.ablate,
                                     tbd_measure=self.tbd_measure,
                                     process_signal=self.process_signal)


def prompt_sampler(seed: int, iteration: int) -> random.Random:
    """The iteration's prompt sampler, seeded by the iteration alone, so a resumed run draws what it would have
    (each policy seeds its own sampling: backends.PolicyWorker.generator)."""
    return random.Random(f"{seed}/{iteration}")


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


def make_curator(args: Args, names: list[str]) -> curator.Curator:
    """The curator of --share cross-fidelity, configured by the run's flags."""
    return curator.Curator(args.curator_config, names, args.seed,
                           coevolution.BanditConfig() if args.thresholds == "adaptive" else None,
                           coevolution.PredictorConfig() if args.predictor else None)


def print_estimates(args: Args, team: backends.Team, prompt_len: int) -> None:
    """Parameters, memory terms and a time bound per policy (hardware.estimate, where each policy is), before the
    first iteration; on CUDA, whether the policies on each device fit on it."""
    rollouts = args.prompts_per_iteration * args.group_size
    received = {"none": 0, "xgrpo": 0, "sgt": rollouts // 4, "graft": rollouts // 4, "prp": rollouts,
                "hacpo": rollouts, "cross-fidelity": rollouts}[args.share] * (len(team.policies) - 1)
    work = hardware.Workload(rollouts, prompt_len, args.max_new_tokens, min(args.micro_batch, rollouts + received),
                             rollouts + received, args.gradient_checkpointing,
                             reference_copy=args.beta > 0 and not args.lora_rank)
    print("estimate per iteration (a bound to check the fit, not a measurement):")
    per_device: dict[str, tuple[int, int | None]] = {}
    for line, place, total, capacity in team.get([p.estimate(work) for p in team.policies]):
        print(line)
        per_device[place] = (per_device.get(place, (0, None))[0] + total, capacity)
    for place, (total, capacity) in per_device.items():
        if capacity is not None:
            print(f"  {place}: ~{total / 1024 ** 3:.1f} GiB of {capacity / 1024 ** 3:.1f} GiB: "
                  f"{'fits' if total < capacity else 'DOES NOT FIT'}")


def log_evaluation(team: backends.Team, iteration: int, started: float, metrics: metrics_log.MetricsLog
                   ) -> dict[str, float]:
    """Phase 5's evaluation, one line per policy in metrics.jsonl (backends.PolicyWorker.evaluate). Returns each
    policy's greedy pass@1."""
    records = team.get([p.evaluate(iteration) for p in team.policies])
    for name, record in zip(team.names, records):
        metrics.write({"iteration": iteration, "policy": name, "time_s": time.time() - started, **record})
    return {name: record["eval/heldout_accuracy"] for name, record in zip(team.names, records)}


def run_dir_of(args: Args) -> Path:
    return Path(args.runs_dir).resolve() / (args.name or checkpoint.run_name(asdict(args), asdict(Args())))


def main(args: Args) -> Path:
    """One run on the team of policies of --backend, released at the end or when the run fails; interrupted, it
    says how to continue."""
    try:
        with backends.connect(args) as team:
            return run(args, team)
    except KeyboardInterrupt:
        if (run_dir_of(args) / "config.json").exists():
            print(f"\ninterrupted: the same command with --resume continues {run_dir_of(args).name} from its last "
                  f"checkpoint", file=sys.stderr)
        raise


def run(args: Args, team: backends.Team) -> Path:
    # ---- set-up: run directory, tasks, policies, curator; a resumed run restores its last checkpoint ----------
    run_dir = run_dir_of(args)
    metrics_path, fidelity_path = run_dir / "metrics.jsonl", run_dir / "fidelity.jsonl"
    config = json.loads(json.dumps({**asdict(args), "scale": team.scale}))  # as it reads back from config.json
    print(f"pair={args.pair} scale={team.scale} {team.placement} run={run_dir}")
    task, transfer = load_tasks(args)
    checkpoint.open_run(run_dir, config, args.resume)
    started = time.time()
    team.start(task, transfer)
    names = team.names
    if team.scale == "tiny" and args.task != "arith" and len(args.model_paths) < len(names):
        print(f"warning: the tiny policies' vocabularies and warm-up cover the arithmetic task only; on {args.task} "
              f"they score 0. Use real weights (--scale small, or --model-paths for every policy)", file=sys.stderr)
    samples = [task.prompt(q) for q in task.train[:50] + task.heldout[:50]]
    print_estimates(args, team, max(team.get([p.longest_prompt(samples) for p in team.policies])))
    curation = make_curator(args, names) if args.share == "cross-fidelity" else None
    capabilities = hacpo.Capabilities(args.share_config.hacpo_window) if args.share == "hacpo" else None

    start = 0
    if args.resume and (run_dir / "checkpoints" / "latest").exists():
        start, folder, saved = checkpoint.latest_checkpoint(run_dir)
        team.get([p.load(str(folder)) for p in team.policies])
        curation = (saved or curation) if curation is not None else None        # the state of this run's --share
        capabilities = (saved or capabilities) if capabilities is not None else None
        print(f"resumed from iteration {start}")
    for path in (metrics_path, fidelity_path):   # a resumed run repeats no line and loses none; a fresh one keeps none
        checkpoint.truncate_metrics(path, start if start else -1)
    metrics = metrics_log.MetricsLog(run_dir, args.tensorboard, start)
    accuracy = log_evaluation(team, 0, started, metrics) if start == 0 else {name: float("nan") for name in names}
    # the stability guard reads losses/update_kl, which costs one more forward per update
    measure_update_kl = curation is not None and curation.bandit is not None

    bar = tqdm(range(start, args.iterations), initial=start, total=args.iterations, desc="train")
    for it in bar:
        # ---- 1. rollouts, every policy at once -------------------------------------------------------------
        iteration_started = time.time()
        problems = prompt_sampler(args.seed, it).sample(task.train, args.prompts_per_iteration)
        prompts = [task.prompt(q) for q in problems]
        sampled = [p.rollout(it, prompts) for p in team.policies]

        # ---- 2. rewards and advantages, where each policy is -------------------------------------------------
        shared = [p.score(problems) for p in team.policies]     # futures under Ray, handed on to peers as they are
        experiences = team.get(shared)
        # the stability guard's verdict on the previous cycle, now that the rollouts its update produced exist
        verdicts = {e.policy.name: curation.judge(e.policy.name, e.rewards)
                    for e in experiences} if curation is not None else {}

        # ---- 3. exchange: trajectories cross to every peer, then each receiver's part runs where it is -------
        if args.share != "none":
            team.get([p.deliver(*(s for j, s in enumerate(shared) if j != i)) for i, p in enumerate(team.policies)])
        if curation is not None:
            received, decisions = curation.exchange(experiences, task, problems, args.share_config, it + 1,
                                                    team.sides(experiences))
            for record in decisions:
                metrics_log.append_line(fidelity_path, record)
        else:
            # HACPO's capabilities live here, across iterations; each receiver gets this iteration's values
            capability = (capabilities.update({e.policy.name: e.rewards for e in experiences})
                          if capabilities is not None else None)
            received = dict(zip(names, team.get([p.receive(capability) for p in team.policies])))

        # ---- 4. updates, every policy at once ----------------------------------------------------------------
        updates = team.get([p.update(measure_update_kl) for p in team.policies])

        # ---- 5. log, evaluate, checkpoint --------------------------------------------------------------------
        iteration_s = time.time() - iteration_started   # the method's cost: no evaluation in it
        for e, rollout_perf, stats in zip(experiences, team.get(sampled), updates):
            name = e.policy.name
            stats.update(rollout_perf)
            stats.update(grpo.rewards_stats(e.rewards))
            stats.update(received[name].metrics)
            if curation is not None:
                curation.updated(name, stats)
            if verdicts.get(name) is not None:
                stats["fidelity/guard_tripped"] = float(bool(verdicts[name]))
            stats["charts/finished"] = sum(e.rollouts.finished) / len(e.rollouts.finished)
            stats["perf/iteration_s"] = iteration_s
            metrics.write({"iteration": it + 1, "policy": name, "time_s": time.time() - started, **stats})
        done = it + 1
        if done % args.eval_every == 0 or done == args.iterations:
            accuracy = log_evaluation(team, done, started, metrics)
        if done % args.checkpoint_every == 0 or done == args.iterations:
            team.get([p.save(str(checkpoint.checkpoint_folder(run_dir, done))) for p in team.policies])
            checkpoint.commit_checkpoint(run_dir, done, names, curation if curation is not None else capabilities)
        bar.set_postfix({f"{e.policy.name}_r": f"{e.rewards.mean():.2f}" for e in experiences} |
                        {f"{n}_acc": f"{a:.2f}" for n, a in accuracy.items()})

    metrics.close()
    report = evaluation.write_report(run_dir)
    print(report)
    print(f"done in {time.time() - started:.0f}s; report in {run_dir / 'report.md'}")
    return run_dir


if __name__ == "__main__":
    # a plain kill (SIGTERM) leaves through the team's close, as Ctrl-C does, so Ray stops the helpers it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        main(tyro.cli(Args))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (ValueError, OSError, data.DataUnavailable, policies.WeightsUnavailable, backends.PolicyLost) as err:
        raise SystemExit(f"train.py: error: {err}") from None   # the message says what to fix; a traceback buries it
