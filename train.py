"""Train two or three heterogeneous policies with GRPO at once (DESIGN.md §3), every policy in this process.

    python train.py --pair qwen-llama                 # tiny offline policies on a CPU, small real ones on CUDA
    python train.py --pair trio --iterations 50 --seed 2
    python train.py --share prp                       # Mutual RL's data-level sharing (also xgrpo, sgt)
    python train.py --share NAME                      # a baseline of baselines/, by its registered name
    python train.py --share cross-fidelity            # the curator (curator.py): diagnose, repair, admit
    python train.py --name my-run --resume            # continue a killed run from its last checkpoint

The flags are args.py's. One iteration, read top to bottom in `run`, calls its `Team` phase by phase; each policy's
part of a phase is its worker's (learner.PolicyWorker), in this process (`LocalTeam`) or a Ray actor (train_ray.py):
  1. rollouts     one set of prompts for all policies (so groups on the same prompt exist for sharing), G
                  completions per prompt from every policy;
  2. rewards      outcome rewards and each policy's own group advantages (grpo.py);
  3. exchange     what the sharing level or a registered share (baselines/) lets cross from every peer to every
                  policy (sharing.py), or the curator's diagnosis, repair and admission of every peer trajectory
                  (curator.py);
  4. updates      a GRPO update per policy on its own rollouts and what it received (--minibatches steps, own
                  rollouts first);
  5. bookkeeping  metrics, held-out evaluation, checkpoint.
train_ray.py runs this loop with each policy in a Ray actor of its own, and gives the same metrics at the same
threads per policy.
Metrics go to runs/NAME/metrics.jsonl, one line per policy and iteration, under stable names (charts/, losses/,
sharing/, fidelity/, eval/, perf/), with --tensorboard as TensorBoard events too (metrics_log.py); a
cross-fidelity run logs every curation decision to runs/NAME/fidelity.jsonl; checkpoints go to
runs/NAME/checkpoints (checkpoint.py), the evaluation report (eval.py) to runs/NAME at the end.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import tyro
from tqdm import tqdm

import coevolution
import curator
import eval as evaluation
import fidelity_record
import grpo
import learner
import sharing
from args import Args
from testbed import checkpoint, costs, data, metrics_log, policies, tasks


def prompt_sampler(seed: int, iteration: int) -> random.Random:
    """The iteration's prompt sampler, seeded by the iteration alone, so a resumed run draws what it would have
    (each policy seeds its own sampling: learner.generator)."""
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


def run_dir_of(args: Args) -> Path:
    return Path(args.runs_dir).resolve() / (args.name or checkpoint.run_name(asdict(args), asdict(Args())))


def open_run(args: Args, scale: str, backend: str, placement: str) -> Path:
    """The run directory with its config.json (checkpoint.open_run), announced."""
    run_dir = run_dir_of(args)
    print(f"pair={args.pair} scale={scale} {placement} run={run_dir}")
    config = json.loads(json.dumps({**asdict(args), "scale": scale, "backend": backend}))  # as config.json reads
    checkpoint.open_run(run_dir, config, args.resume)
    return run_dir


def warn_off_task(args: Args, scale: str, names: list[str]) -> None:
    if scale == "tiny" and args.task != "arith" and len(args.model_paths) < len(names):
        print(f"warning: the tiny policies' vocabularies and warm-up cover the arithmetic task only; on {args.task} "
              f"they score 0. Use real weights (--scale small, or --model-paths for every policy)", file=sys.stderr)


def prompt_samples(task: tasks.Task) -> list[str]:
    """Prompts whose longest, in each policy's tokens, sizes the start-up estimate."""
    return [task.prompt(q) for q in task.train[:50] + task.heldout[:50]]


def workload(args: Args, prompt_len: int, policy_count: int) -> costs.Workload:
    """One policy's iteration at the run's settings, with what its --share lets it receive at most."""
    rollouts = args.prompts_per_iteration * args.group_size
    levels = {"none": 0, "xgrpo": 0, "sgt": rollouts // 4, "prp": rollouts, "cross-fidelity": rollouts}
    per_peer = (sharing.SHARES[args.share].received_at_most(rollouts) if args.share in sharing.SHARES
                else levels[args.share])
    received = per_peer * (policy_count - 1)
    micro_batch = min(args.micro_batch, rollouts + received)
    # own rows alone cut into micro-batches of whole groups; received rows join some groups and make others of a
    # few rows, so a micro-batch may then hold a prompt per row, up to the iteration's prompts
    whole_groups = (received == 0 and micro_batch % args.group_size == 0
                    and args.prompts_per_iteration % args.minibatches == 0)
    rows_per_prompt = (args.group_size if whole_groups
                       else micro_batch // min(micro_batch, args.prompts_per_iteration))
    return costs.Workload(rollouts, prompt_len, args.max_new_tokens, micro_batch, rollouts + received,
                          args.gradient_checkpointing, reference_copy=args.beta > 0 and not args.lora_rank,
                          group_size=rows_per_prompt)


def print_estimates(estimates: list[tuple[str, str, int, int | None]]) -> None:
    """Each policy's costs.policy_estimate, before the first iteration; on CUDA, whether the policies on each
    device fit on it."""
    print("estimate per iteration (a bound to check the fit, not a measurement):")
    per_device: dict[str, tuple[int, int | None]] = {}
    for line, place, total, capacity in estimates:
        print(line)
        per_device[place] = (per_device.get(place, (0, None))[0] + total, capacity)
    for place, (total, capacity) in per_device.items():
        if capacity is not None:
            print(f"  {place}: ~{total / 1024 ** 3:.1f} GiB of {capacity / 1024 ** 3:.1f} GiB: "
                  f"{'fits' if total < capacity else 'DOES NOT FIT'}")


def start_state(args: Args, run_dir: Path, names: list[str]
                ) -> tuple[int, Path | None, curator.Curator | None, object]:
    """Where the run starts and what the exchange keeps across iterations (the curator of cross-fidelity, a
    registered share's state, sharing.Share.start): iteration 0 and a fresh state, or under --resume the last
    checkpoint's iteration, its folder (whose policy parts the caller loads) and the state saved there."""
    curation = make_curator(args, names) if args.share == "cross-fidelity" else None
    share_state = (sharing.SHARES[args.share].start(args.share_config) if args.share in sharing.SHARES else None)
    if not (args.resume and (run_dir / "checkpoints" / "latest").exists()):
        return 0, None, curation, share_state
    start, folder, saved = checkpoint.latest_checkpoint(run_dir)
    if start > args.iterations:
        raise ValueError(f"{run_dir}'s last checkpoint is at iteration {start}, past --iterations {args.iterations}: "
                         f"a run is not shortened; resume with --iterations {start} or more, or start afresh under "
                         "another --name")
    print(f"resumed from iteration {start}")
    return (start, folder, saved if curation is not None and isinstance(saved, curator.Curator) else curation,
            saved if share_state is not None and isinstance(saved, type(share_state)) else share_state)


def open_metrics(args: Args, run_dir: Path, start: int) -> metrics_log.MetricsLog:
    """The run's metric logs from iteration `start` on: a resumed run repeats no line and loses none; a fresh one
    keeps none. A run lengthened past a last iteration off the evaluation schedule drops that evaluation, which the
    run it becomes would not have made."""
    off_schedule = 0 < start < args.iterations and start % args.eval_every != 0
    for path in (run_dir / "metrics.jsonl", run_dir / "fidelity.jsonl"):
        checkpoint.truncate_metrics(path, start if start else -1, evaluation_kept=not off_schedule)
    return metrics_log.MetricsLog(run_dir, args.tensorboard, start)


def evaluated(run_dir: Path, iteration: int) -> bool:
    """Whether the run's metrics hold an evaluation at `iteration`."""
    return any(record["iteration"] == iteration and any(key.startswith("eval/") for key in record)
               for _, record in checkpoint.metric_lines(run_dir / "metrics.jsonl"))


def draw_problems(args: Args, task: tasks.Task, iteration: int) -> tuple[list, list[str]]:
    """Phase 1's prompts, the same for every policy: the iteration's problems and their prompt texts."""
    problems = prompt_sampler(args.seed, iteration).sample(task.train, args.prompts_per_iteration)
    return problems, [task.prompt(q) for q in problems]


def iteration_records(experiences: list[sharing.Experience], rollout_perf: list[dict], updates: list[dict],
                      received: dict[str, sharing.Received], verdicts: dict, iteration_s: float
                      ) -> list[dict[str, float]]:
    """Phase 5: each policy's metric line of the iteration, its update's statistics first."""
    records = []
    for e, perf, stats in zip(experiences, rollout_perf, updates):
        name = e.policy.name
        stats.update(perf)
        stats.update(grpo.rewards_stats(e.rewards))
        stats.update(received[name].metrics)
        if verdicts.get(name) is not None:
            stats["fidelity/guard_tripped"] = float(bool(verdicts[name]))
        stats["charts/finished"] = sum(e.rollouts.finished) / len(e.rollouts.finished)
        stats["perf/iteration_s"] = iteration_s   # the method's cost: no evaluation in it
        records.append(stats)
    return records


def log_lines(metrics: metrics_log.MetricsLog, iteration: int, started: float, names: list[str],
              records: list[dict]) -> None:
    for name, record in zip(names, records):
        metrics.write({"iteration": iteration, "policy": name, "time_s": time.time() - started, **record})


def accuracies(names: list[str], evaluations: list[dict]) -> dict[str, float]:
    return {name: record["eval/heldout_accuracy"] for name, record in zip(names, evaluations)}


def evaluation_and_checkpoint_due(args: Args, done: int) -> tuple[bool, bool]:
    """Whether iteration `done` ends with an evaluation, and with a checkpoint."""
    last = done == args.iterations
    return done % args.eval_every == 0 or last, done % args.checkpoint_every == 0 or last


def progress(bar: tqdm, experiences: list[sharing.Experience], accuracy: dict[str, float]) -> None:
    bar.set_postfix({f"{e.policy.name}_r": f"{e.rewards.mean():.2f}" for e in experiences} |
                    {f"{n}_acc": f"{a:.2f}" for n, a in accuracy.items()})


def finish(run_dir: Path, metrics: metrics_log.MetricsLog, started: float) -> Path:
    """Close the logs, write and print the run's report, and, for a curated run, what the curator did."""
    metrics.close()
    print(evaluation.write_report(run_dir))
    if (run_dir / "fidelity.jsonl").exists():
        print(fidelity_record.curation_summary(run_dir))
    print(f"done in {time.time() - started:.0f}s; report in {run_dir / 'report.md'}")
    return run_dir


class Team(Protocol):
    """What train.run's loop needs of its policies: each phase of an iteration for every policy, the results in the
    policies' order. `LocalTeam` holds every policy's worker (learner.PolicyWorker) in this process,
    train_ray.RayTeam each in a Ray actor of its own; each phase is that worker's method of the same name."""

    backend: str           # "local" or "ray", as config.json records it
    scale: str             # the preset's scale (policies.devices_and_scale)
    placement: str         # where the policies run, in words

    @property
    def names(self) -> list[str]: ...

    def start(self, task: tasks.Task, transfer: tasks.Task | None) -> None:
        """One worker per policy (built, warmed up or loaded), then every policy's token table to every other."""

    # the start-up estimate (costs.policy_estimate) and the checkpoints
    def longest_prompt(self, texts: list[str]) -> list[int]: ...
    def estimate(self, work: costs.Workload) -> list[tuple[str, str, int, int | None]]: ...
    def fingerprint(self) -> list[str]: ...
    def load(self, folder: Path) -> None: ...
    def save(self, folder: Path) -> None: ...

    def rollout(self, iteration: int, prompts: list[str]) -> list[dict[str, float]]:
        """Phase 1, learner.rollout: G completions per prompt, kept by each worker; their speed (perf/rollout_*)."""

    def experience(self, problems: list) -> list[sharing.Experience]:
        """Phase 2, learner.experience: the rewards and each policy's own group advantages, as they are shared."""

    def share(self) -> None:
        """Phase 3 begins: each policy receives every other one's experience of this iteration."""

    def receive(self, context: object) -> list[sharing.Received]:
        """Phase 3 at a fixed level or a registered share, learner.receive, given the share's context of the
        iteration (sharing.Share.observe): what each policy trains on (its crossings stay with its worker)."""

    def sides(self, experiences: list[sharing.Experience]) -> dict[str, curator.Side]:
        """Phase 3 under the curator: each receiver's side of curation, by name (curator.Curator.exchange)."""

    def update(self, measure_kl: bool) -> list[dict[str, float]]:
        """Phase 4, learner.update: each policy's GRPO update on its own rollouts and what it received."""

    def evaluate(self, iteration: int) -> list[dict[str, float]]:
        """Phase 5's evaluation, learner.evaluate."""


class LocalTeam:
    """Every policy in this process, one learner.PolicyWorker each, its part of a phase called policy by policy
    (the `Team` train.run's loop calls)."""

    backend = "local"

    def __init__(self, args: Args):
        self.args = args
        self.devices, self.scale = policies.devices_and_scale(args.pair, args.devices, args.scale)
        self.placement = f"devices={','.join(map(str, self.devices))}"
        self.workers: list[learner.PolicyWorker] = []
        self.shared: list[sharing.Experience] = []

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def start(self, task: tasks.Task, transfer: tasks.Task | None) -> None:
        self.workers = [learner.PolicyWorker(self.args, self.scale, i, device, task, transfer)
                        for i, device in enumerate(self.devices)]
        peers = [w.as_peer() for w in self.workers]
        for w in self.workers:
            w.set_peers(*peers)

    def longest_prompt(self, texts: list[str]) -> list[int]:
        return [w.longest_prompt(texts) for w in self.workers]

    def estimate(self, work: costs.Workload) -> list[tuple[str, str, int, int | None]]:
        return [w.estimate(work) for w in self.workers]

    def fingerprint(self) -> list[str]:
        return [w.fingerprint() for w in self.workers]

    def load(self, folder: Path) -> None:
        for w in self.workers:
            w.load(folder)

    def rollout(self, iteration: int, prompts: list[str]) -> list[dict[str, float]]:
        return [w.rollout(iteration, prompts) for w in self.workers]

    def experience(self, problems: list) -> list[sharing.Experience]:
        self.shared = [w.experience(problems) for w in self.workers]
        return self.shared

    def share(self) -> None:
        for i, w in enumerate(self.workers):
            w.accept_shared(*(e for j, e in enumerate(self.shared) if j != i))

    def receive(self, context: object) -> list[sharing.Received]:
        return [w.receive(context) for w in self.workers]

    def sides(self, experiences: list[sharing.Experience]) -> dict[str, curator.Side]:
        """Each worker's diagnosis.ReceiverSide, called directly: no process boundary lies in between."""
        assert all(w.side is not None for w in self.workers), "curation before the peers' experience (Team.share)"
        return {w.name: w.side for w in self.workers if w.side is not None}

    def update(self, measure_kl: bool) -> list[dict[str, float]]:
        return [w.update(measure_kl) for w in self.workers]

    def evaluate(self, iteration: int) -> list[dict[str, float]]:
        return [w.evaluate(iteration) for w in self.workers]

    def save(self, folder: Path) -> None:
        for w in self.workers:
            w.save(folder)


def run(args: Args, team: Team | None = None) -> Path:
    """One run of `team`'s policies (default: every policy in this process)."""
    team = team or LocalTeam(args)
    # ---- set-up: tasks, run directory, policies, curator; a resumed run restores its last checkpoint ----------
    task, transfer = load_tasks(args)
    run_dir = open_run(args, team.scale, team.backend, team.placement)
    started = time.time()
    team.start(task, transfer)
    names = team.names
    warn_off_task(args, team.scale, names)
    work = workload(args, max(team.longest_prompt(prompt_samples(task))), len(names))
    print_estimates(team.estimate(work))
    built = dict(zip(names, team.fingerprint()))
    start, folder, curation, share_state = start_state(args, run_dir, names)
    if folder is not None:
        team.load(folder)
    checkpoint.record_sitting(run_dir, start, built, dict(zip(names, team.fingerprint()))
                              if folder is not None else built, args.allow_other_start)
    metrics = open_metrics(args, run_dir, start)
    accuracy = {name: float("nan") for name in names}
    # iteration 0's evaluation, or the last one of a run shortened to its checkpoint, which the loop will not reach
    if start == 0 or (start == args.iterations and not evaluated(run_dir, start)):
        evaluations = team.evaluate(start)
        log_lines(metrics, start, started, names, evaluations)
        accuracy = accuracies(names, evaluations)
    # the curator whose stability guard (adaptive thresholds) judges each update, which then also measures
    # losses/update_kl, one more forward pass
    guarded = curation if curation is not None and curation.bandit is not None else None

    bar = tqdm(range(start, args.iterations), initial=start, total=args.iterations, desc="train")
    for it in bar:
        # ---- 1. rollouts, every policy on the same prompts (learner.rollout) -----------------------------------------
        iteration_started = time.time()
        problems, prompts = draw_problems(args, task, it)
        rollout_perf = team.rollout(it, prompts)

        # ---- 2. rewards and each policy's own group advantages (learner.experience) ----------------------------------
        experiences = team.experience(problems)
        # the stability guard judges each policy's last cycle now that the rollouts its update produced exist
        verdicts = ({e.policy.name: guarded.judge(e.policy.name, e.rewards) for e in experiences}
                    if guarded is not None else {})

        # ---- 3. exchange: a level or a registered share per receiver (learner.receive), or the curator ------------
        if args.share != "none":
            team.share()
        if curation is not None:
            received, decisions = curation.exchange(experiences, task, problems, args.share_config, it + 1,
                                                    team.sides(experiences))
            for record in decisions:
                metrics_log.append_line(run_dir / "fidelity.jsonl", record)
        else:
            context = (sharing.SHARES[args.share].observe(share_state, {e.policy.name: e.rewards for e in experiences})
                       if args.share in sharing.SHARES else None)
            received = dict(zip(names, team.receive(context)))

        # ---- 4. updates: GRPO on own rollouts and what was received (learner.update) ---------------------------------
        updates = team.update(measure_kl=guarded is not None)

        # ---- 5. log, evaluate, checkpoint ----------------------------------------------------------------------------
        iteration_s = time.time() - iteration_started
        records = iteration_records(experiences, rollout_perf, updates, received, verdicts, iteration_s)
        # each policy's update (its KL, gradient norm, reward spread) joins the cycle the stability guard judges
        if guarded is not None:
            for name, record in zip(names, records):
                guarded.observe_update(name, record)
        log_lines(metrics, it + 1, started, names, records)
        evaluate_now, save_now = evaluation_and_checkpoint_due(args, it + 1)
        if evaluate_now:
            evaluations = team.evaluate(it + 1)
            log_lines(metrics, it + 1, started, names, evaluations)
            accuracy = accuracies(names, evaluations)
        if save_now:
            team.save(checkpoint.checkpoint_folder(run_dir, it + 1))
            checkpoint.commit_checkpoint(run_dir, it + 1, names, curation if curation is not None else share_state)
        progress(bar, experiences, accuracy)
    return finish(run_dir, metrics, started)


def say_how_to_resume(args: Args) -> None:
    if (run_dir_of(args) / "config.json").exists():
        print(f"\ninterrupted: the same command with --resume continues {run_dir_of(args).name} from its last "
              f"checkpoint", file=sys.stderr)


def main(args: Args) -> Path:
    """One run; interrupted, it says how to continue."""
    try:
        return run(args)
    except KeyboardInterrupt:
        say_how_to_resume(args)
        raise


ERRORS = (ValueError, OSError, FloatingPointError, data.DataUnavailable, policies.WeightsUnavailable)
"""what a run reports in one line: each error's message says what to fix, and a traceback would bury it"""


def cli(run_main, args_type: type, errors: tuple = ERRORS) -> None:
    """The command line of train.py and train_ray.py: a plain kill (SIGTERM) leaves through every `finally`, as
    Ctrl-C does, so nothing the run started is left behind."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run_main(tyro.cli(args_type))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except errors as err:
        raise SystemExit(f"{Path(sys.argv[0]).name}: error: {err}") from None


if __name__ == "__main__":
    cli(main, Args)
