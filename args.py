"""The command line of a run (train.py; train_ray.py adds its Ray flags): every flag, its default and what it
means, in one place.

Each concept file keeps its own config (arith.TaskConfig, grpo.LossConfig, sharing.ShareConfig,
diagnosis.CuratorConfig, each baseline's Settings); `Args` takes its defaults from them and builds them from the
flags, so a default is written once and a flag is documented once, here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

import tyro

import diagnosis
import grpo
import sharing
from baselines import graft, hacpo
from testbed import arith, policies, tasks


SHARE_CHOICES = (*sharing.MODES, *sharing.SHARES, "cross-fidelity")
"""--share's choices: the levels, every share registered when the command line is read (baselines/), the curator"""
TASK_CHOICES = (*tasks.TASK_NAMES, *tasks.REGISTERED)
"""--task's and --eval-task's choices: the built-in tasks and every task registered when the command line is read"""


@dataclass
class Args:
    pair: Literal["qwen-llama", "qwen-qwen", "trio", "qwen-mistral", "llama-mistral"] = "qwen-llama"
    """which policies train together: cross-family, same family at two sizes, or three families; qwen-mistral and
    llama-mistral (tiny scale only) are the trio's other two pairs, each policy starting as in the trio"""
    scale: Literal["tiny", "small", "paper"] | None = None
    """model sizes (policies.py): tiny offline models; ~1B real models; the proposal's 3B-8B. Default: small where
    the policies run on CUDA (--devices), tiny otherwise"""
    model_paths: tuple[str, ...] = ()
    """NAME=PATH per policy to load a model id or a local directory instead of the preset's, e.g. qwen=/models/q"""
    model_dir: str | None = None
    """a directory with one folder per real policy, named like the last part of its hub id
    (e.g. DIR/Qwen2.5-0.5B-Instruct, as `hf download` makes with --local-dir); --model-paths takes precedence"""
    share: Literal[SHARE_CHOICES] = "cross-fidelity"  # type: ignore[valid-type]
    """how experience crosses between policies (sharing.py), by default through the method this codebase
    implements: cross-fidelity = the curator (curator.py) diagnoses every peer rollout, repairs it and admits it to
    one of the three levels or rejects it; none = independent GRPO; prp = peer rollouts join the
    batch with truncated density ratios; xgrpo = peer rewards join the group baseline; sgt = peer successes
    rescue prompts the receiver failed; hacpo = HACPO (baselines/hacpo.py): a capability-aware baseline over all
    policies' rewards, and peer rollouts with sequence-level ratios clipped to [1 - delta, 1]; graft = GRAFT
    (baselines/graft.py): a peer's mixed group replaces the receiver's failed group on a prompt, weighted by
    compatibility"""
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
    calibration sample (an iteration that diagnosed none is not counted)"""
    admission: Literal["diagnosis", "random", "ranked"] = diagnosis.CuratorConfig.admission
    """cross-fidelity: each offer at the band of its diagnosis, or the control: the bands permuted at random among
    each source's offers of the iteration (same shares, same rescues); or ranked: each receiver's offers that could
    matter ordered by --rank-by, the first --admit-share of them at PRP, the rest rejected (no rescue): one signal
    against another, or against chance, at the same rate and level (benchmarks/branches.py)"""
    rank_by: Literal["d", "tbd", "ccm", "rsd", "reward", "advantage", "chance", "sequence_ratio", "capped_ratio",
                     "kl"] = diagnosis.CuratorConfig.rank_by
    """--admission ranked: the order, lowest first for D, each raw term and kl, highest first for the offer's reward,
    advantage, sequence_ratio and capped_ratio (the density-ratio signals, diagnosis.with_ratio_signals: HACPO's s,
    GRAFT's min(s, 1) without its floor, an F-TIS-style k3 KL); chance: a seeded random order"""
    admit_share: float = diagnosis.CuratorConfig.admit_share
    """--admission ranked: the share of each receiver's offers that could matter admitted at PRP, an iteration's
    count rounded half up"""
    negate_credit: bool = diagnosis.CuratorConfig.negate_credit
    """cross-fidelity: a control that must hurt (benchmarks/branches.py): every admitted offer crosses with its
    credit negated (the same offers, the same tokens, the opposite advantage)"""
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
    """cross-fidelity: RSD repair with verified step credit where a step can be checked, else the intrinsic
    gradient-norm signal where CCM measured the norms (vpr), or the intrinsic signal on every step"""
    ccm_estimate: str = diagnosis.CuratorConfig.ccm_estimate
    """cross-fidelity: how R_k's gradient norms are taken (grad_norms.ccm_scope): exact = over every trainable
    parameter; last:N = over the output layer (final norm and head, the head's call alone where it is tied to the
    embedding) and the last N blocks, which differentiates nothing below them (last:0: no block at all, its norms
    in closed form from the forward). Default last:0: at 11 registered seeds it cost no accuracy against last:2
    (issue 69), which cost none against exact (the matrix's block 2, docs/results.md); every registered
    cross-fidelity run names its estimate"""
    predictor: bool = True
    """cross-fidelity: let the fidelity predictor skip the gradient-norm diagnosis where it is sure"""
    ratio_cap: float = sharing.ShareConfig.ratio_cap
    """prp, sgt: the truncation of the group-wise density ratio pi_receiver / pi_peer (2 as in truncated
    importance sampling); no weight exceeds it"""
    hacpo_alpha: float = hacpo.Settings.alpha
    """hacpo: a peer rollout's weight is s^(1 + alpha), s its length-normalized sequence ratio (eq. 12)"""
    hacpo_delta: float = hacpo.Settings.delta
    """hacpo: a peer rollout crosses only with s in [1 - delta, 1] (eq. 13)"""
    hacpo_window: int = hacpo.Settings.window
    """hacpo: iterations over which each policy's mean reward is averaged into its capability (eq. 9)"""
    hacpo_capability_bound: float = hacpo.Settings.capability_bound
    """hacpo: capability ratios P_receiver / P_peer are clamped to [1/bound, bound]"""
    hacpo_delta_step: float = hacpo.Settings.delta_step
    """hacpo: the clip range's lower bound rises by it with each optimizer step of an iteration (eq. 14)"""
    hacpo_variant: Literal["ours", "official"] = hacpo.Settings.variant
    """hacpo: ours = this codebase's HACPO, as every registered hacpo run trained: the peer rollouts inside the clip
    range when the exchange measures s, EOS included, each step's loss their mean with the own rollouts beside them;
    official = as the authors' recipe trains (zzx-peter/HACRL-code): every peer rollout counts in its optimizer
    step's mean, s (EOS left out) is re-measured by the policy in training at every step, with no per-token ratio,
    and the group std is the sample std (DESIGN.md §4.16 lists each variant's departures)"""
    graft_delta: float = graft.Settings.delta
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
    """nucleus sampling threshold of rollouts (below 1, a rollout's behaviour log-probs stay those of the untruncated
    distribution at the temperature, which PRP's and HACPO's density ratios read)"""
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
    max_grad_norm: float = grpo.MAX_GRAD_NORM
    """gradient clipping"""
    task: Literal[TASK_CHOICES] = "arith"  # type: ignore[valid-type]
    """what the policies train on (tasks.load_task): the embedded arithmetic task, or a real benchmark read from
    --data-dir, the Hugging Face cache or the hub"""
    eval_task: Literal[TASK_CHOICES] | None = None  # type: ignore[valid-type]
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
    process signal, CCM estimate, HACPO variant, scale and LoRA rank where they differ from their defaults
    (checkpoint.run_name)"""
    runs_dir: str = "runs"
    """where run directories are made"""
    cache_dir: str | None = None
    """warm-up cache; default ~/.cache/cross-fidelity"""
    checkpoint_every: int = 10
    """iterations between checkpoints (the last iteration is always saved)"""
    resume: bool = False
    """continue the run NAME from its last checkpoint"""
    allow_other_start: bool = False
    """--resume even where this machine builds other starting weights than the run began with (another machine's
    tiny warm-up, another base model); runs/NAME/start.json marks that sitting"""
    tensorboard: bool = False
    """also write every metric as TensorBoard events under the same names, in runs/NAME/tensorboard/POLICY
    (`tensorboard --logdir runs`); metrics.jsonl stays the record eval.py reads"""
    devices: str | None = None
    """comma-separated torch devices, policy i on device i (round robin), e.g. cuda:0,cuda:1; train.py runs the
    policies one after another (train_ray.py runs them side by side, placed by --gpus-per-policy instead).
    Default: cuda if available, else cpu"""
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
        for name in ("iterations", "eval_every", "checkpoint_every", "epochs", "micro_batch", "minibatches"):
            if getattr(self, name) < (0 if name == "iterations" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for flag, holds, rule in (("temperature", self.temperature > 0, "be positive"),
                                  ("top-p", 0 < self.top_p <= 1, "lie in (0, 1]"),
                                  ("max-new-tokens", self.max_new_tokens >= 1, "be positive"),
                                  ("lr", self.lr > 0, "be positive"),
                                  ("eval-samples", self.eval_samples >= 0, "be 0 or more"),
                                  ("max-grad-norm", self.max_grad_norm > 0, "be positive"),
                                  ("ratio-cap", self.ratio_cap > 0, "be positive"),
                                  ("clip-eps-low", 0 <= self.clip_eps_low < 1, "lie in [0, 1)"),
                                  ("clip-eps-high", self.clip_eps_high >= 0, "be 0 or more"),
                                  ("beta", self.beta >= 0, "be 0 or more"),
                                  ("ccm-beta", self.ccm_beta >= 0, "be 0 or more")):
            # NaN included: a sampler at temperature 0 or below, or no tokens, cannot roll out; a negative clipping
            # norm turns every gradient round and a negative beta rewards drifting from the reference
            if not holds:
                raise ValueError(f"--{flag} must {rule}, got {getattr(self, flag.replace('-', '_'))}")
        if self.prompts_per_iteration < 1 or self.group_size < 2:
            raise ValueError(f"need at least one prompt and two completions per prompt (a group), got "
                             f"--prompts-per-iteration {self.prompts_per_iteration} and --group-size {self.group_size}")
        if self.minibatches > self.prompts_per_iteration * self.group_size:
            raise ValueError(f"--minibatches {self.minibatches} exceeds the {self.prompts_per_iteration} x "
                             f"{self.group_size} rollouts of an iteration")
        if self.share not in (*sharing.MODES, "cross-fidelity", *sharing.SHARES):
            raise ValueError(f"unknown --share {self.share!r}: use one of {', '.join(SHARE_CHOICES)}, or register it "
                             "(sharing.SHARES) before the run")
        if self.share in sharing.SHARES:
            sharing.SHARES[self.share].check(self)
        try:   # here, not after the warm-up: the curator's own checks, in the flags' names
            self.curator_config
        except ValueError as err:
            raise ValueError(f"cross-fidelity settings (--fidelity-lambdas, --theta1, --theta2, "
                             f"--calibration[-window], --ablate, --process-signal, --ccm-estimate): {err}") from None

    @property
    def task_config(self) -> arith.TaskConfig:
        return arith.TaskConfig(num_steps=self.num_steps, max_operand=self.max_operand, ops=self.ops,
                                step_format=self.step_format)

    def policy_setup(self, scale: str) -> policies.PolicySetup:
        return policies.PolicySetup.of({**asdict(self), "scale": scale})

    @property
    def share_config(self) -> sharing.ShareConfig:
        return sharing.ShareConfig(self.share, self.ratio_cap, scale_by_std=self.scale_by_std,
                                   temperature=self.temperature, micro_batch=self.micro_batch,
                                   minibatches=self.minibatches,
                                   settings=sharing.SHARES[self.share].settings(self)
                                   if self.share in sharing.SHARES else None)

    @property
    def loss_config(self) -> grpo.LossConfig:
        return grpo.LossConfig(self.clip_eps_low, self.clip_eps_high, self.beta, self.aggregation)

    @property
    def curator_config(self) -> diagnosis.CuratorConfig:
        return diagnosis.CuratorConfig(self.fidelity_lambdas, self.theta1, self.theta2, self.calibration,
                                     self.calibration_window, self.admission, self.rank_by, self.admit_share,
                                     self.negate_credit, self.ccm_beta, self.ablate, tbd_measure=self.tbd_measure,
                                     process_signal=self.process_signal, ccm_estimate=self.ccm_estimate)


def script_args(script: str, flags: list[str], **fixed) -> Args:
    """A run's Args from train.py `flags` given to a benchmark `script` after --, with the fields the script sets
    itself; a flag naming one of those is refused, where it would be overwritten without a word."""
    named = {f.split("=")[0].removeprefix("--").replace("-", "_") for f in flags if f.startswith("--")}
    clash = ", ".join(f"--{name.replace('_', '-')}" for name in sorted(named & set(fixed)))
    if clash:
        raise ValueError(f"{script} sets {clash} itself: drop it after -- (its own options: {script} --help)")
    return replace(tyro.cli(Args, args=flags), **fixed)
