"""A run's directory and its checkpoints: what is saved, how a killed run resumes, and what it keeps.

runs/NAME holds config.json, metrics.jsonl, fidelity.jsonl (cross-fidelity) and checkpoints/. A checkpoint is
written in full, then `latest` is pointed at it, then older ones are dropped, so a run killed at any moment
resumes from a complete checkpoint. Each policy's part is written by whoever holds the policy (its Ray actor
under train_ray.py), the rest by the trainer. Under LoRA a checkpoint keeps the adapters only (the frozen base is
reloaded from where it came from). On --resume the metric lines logged after the checkpoint are dropped, so a
resumed run repeats none and loses none, and a resume with other settings than the run's is refused.

start.json records what each sitting of the run started from: a fingerprint of every policy's weights as built
(warm-up, base model, adapters) and as training went on (after the checkpoint's load), and where a tiny policy's
warm-up came from when the trainer's process built it (the packaged file, the cache, or made then). A warm-up made by
another machine's CPU kernels is another policy, and under LoRA a checkpoint restores the adapters onto whatever
base was built, so a resume that builds other weights than the run began with is refused unless allowed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from testbed import policies


RESUMABLE = ("resume", "iterations", "runs_dir", "backend", "devices", "ray_address", "cpus_per_policy",
             "gpus_per_policy", "allow_other_start")
"""the settings a resume may change: --iterations (no schedule depends on the horizon, so a run extended from 100 to
200 iterations is the run that would have gone to 200 from the start), how its folder is reached (--runs-dir, as
spelled or moved) and where the policies run (train.py and train_ray.py give the same metrics on a CPU at the same
threads per policy; another thread count drifts in the last bits)"""


NAMED = ("task", "step_format", "tbd_measure", "ablate", "thresholds", "process_signal", "ccm_estimate",
         "hacpo_variant", "scale", "lora_rank")
"""settings that a default run name spells out where they differ from their defaults (beside pair, share, seed)"""


def run_name(config: dict, defaults: dict) -> str:
    """PAIR-SHARE-sSEED, then each setting of NAMED that differs from its default (e.g. qwen-llama-none-s1-gsm8k,
    qwen-llama-cross-fidelity-s1-ablate-ccm-adaptive), so that runs differing there do not share a directory."""
    parts = [config["pair"], config["share"], f"s{config['seed']}"]
    for key in NAMED:
        value = config[key]
        if value != defaults[key] and value not in (None, (), []):
            spelled = "-".join(value) if key == "ablate" else str(value)
            prefix = {"tbd_measure": "tbd-", "ablate": "ablate-", "ccm_estimate": "ccm-", "lora_rank": "lora"}
            parts.append(prefix.get(key, "") + spelled)
    return "-".join(parts)


def changed_settings(saved: Path, config: dict) -> list[str]:
    """The settings of `config` that differ from a run's saved config.json, but those a resume may change."""
    return sorted(k for k, v in json.loads(saved.read_text()).items() if k not in RESUMABLE and config.get(k) != v)


def open_run(run_dir: Path, config: dict, resume: bool) -> None:
    """Make the run directory and write its config.json; a directory that holds a run needs `resume`, a resume
    needs a run, and a resume must not change the run's settings but those of RESUMABLE."""
    saved = run_dir / "config.json"
    if resume and not saved.exists():
        others = sorted(p.parent.name for p in run_dir.parent.glob("*/config.json"))
        raise FileNotFoundError(f"--resume: no run in {run_dir} to continue (runs in {run_dir.parent}: "
                                f"{', '.join(others) or 'none'})")
    changed = changed_settings(saved, config) if saved.exists() else []
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} holds a run with other settings ({changed}): pass --name for a new run"
                              if changed else f"{run_dir} holds a run; pass --resume to continue it or --name for a "
                                              f"new one")
    if resume and changed:
        raise ValueError(f"--resume with other settings than the run's ({changed}); resume as it was, or pass "
                         f"--name for a new run")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(config, indent=2))
    except OSError as err:
        raise OSError(f"cannot write the run directory {run_dir} ({err.strerror}): pass a writable --runs-dir") \
            from None


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A hash of every weight and buffer the model saves (names, dtypes, shapes and bytes, in state_dict order):
    two policies share it only where they hold the same weights bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


START = "start.json"


def record_sitting(run_dir: Path, iteration: int, built: dict[str, str], weights: dict[str, str],
                   allow_other_start: bool = False) -> dict:
    """Add this sitting to the run's start.json: the iteration it starts at, each policy's fingerprint as built
    and as training goes on (after a checkpoint's load). A sitting whose policies are built to other weights than
    the run's first sitting's is refused, unless `allow_other_start` (then marked so). A sitting at iteration 0
    begins the record anew. Returns the record, whose "fingerprints" are the weights training began from (None for
    a run begun before start.json existed). Where this process built the policies, the sitting also says where each
    tiny one took its warm-up from (policies.warm_starts: packaged, cached or warmed up now), each note taken once."""
    path = run_dir / START
    sittings = json.loads(path.read_text())["sittings"] if path.exists() else []
    first = sittings[0]["built"] if sittings else built
    other = sorted(name for name in built if first.get(name) != built[name])
    if other and not allow_other_start:
        raise ValueError(f"this machine builds other starting weights than the run {run_dir.name} began with ("
                         + ", ".join(f"{n}: {built[n]} here, {first.get(n)} then" for n in other)
                         + "): a tiny warm-up made by other CPU kernels, another base model or adapter settings, so "
                           "the run would not go on from the policies it began with. Resume it on the machine that "
                           "started it, start it again under a new --name, or pass --allow-other-start to go on "
                           "anyway (start.json marks the sitting)")
    warm_up = {name: policies.warm_starts.pop(name) for name in built if name in policies.warm_starts}
    sitting = {"iteration": iteration, "built": built, "weights": weights, **({"warm_up": warm_up} if warm_up else {}),
               **({"other_start": other} if other else {})}
    sittings = [*(sittings if iteration > 0 else []), sitting]
    record = {"fingerprints": sittings[0]["weights"] if sittings[0]["iteration"] == 0 else None, "sittings": sittings}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def metric_lines(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each line of a metrics log. A torn last line (a process killed or a disk filled
    mid-write) is left out: every line of an iteration is written before its checkpoint, so it belongs to one after
    the checkpoint a resume starts from, which drops it. A bad line elsewhere is refused."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or "iteration" not in record:
            if number == len(lines):
                break
            raise ValueError(f"{path}: line {number} is not a metrics record ({line[:60]!r}); only the last line "
                             "of a log can be torn by a stopped run, so this one was edited: mend or remove it, "
                             "then resume") from None
        records.append((line, record))
    return records


def truncate_metrics(path: Path, iteration: int, evaluation_kept: bool = True) -> None:
    """Keep the metric lines logged up to `iteration`, so a resumed run repeats none and loses none (a torn last
    line goes too, `metric_lines`); without `evaluation_kept`, the evaluation lines (eval/) of `iteration` go too.
    The kept lines replace the file at once, so a process killed while writing them leaves the old file whole."""
    def kept(record: dict) -> bool:
        if record["iteration"] != iteration:
            return record["iteration"] < iteration
        return evaluation_kept or not any(key.startswith("eval/") for key in record)
    if path.exists():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line, record in metric_lines(path) if kept(record)))
        tmp.replace(path)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps: the whole state when every parameter trains, only the adapters under LoRA (the
    frozen base is reloaded from where it came from)."""
    if all(p.requires_grad for p in model.parameters()):
        return model.state_dict()
    return {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.nn.Parameter) and v.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Restore `trainable_state`; a checkpoint of another shape or adapter set is refused, naming the cause."""
    hint = "was it saved with other --lora-rank settings?"
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches raise even when not strict
        raise ValueError(f"checkpoint does not match the model ({hint}): {err}") from None
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing):
        raise ValueError(f"checkpoint does not match the model ({hint}): missing trainable "
                         f"{sorted(trainable & set(missing))}, unexpected {sorted(unexpected)}")


def checkpoint_folder(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"iter-{iteration:06d}"


def save_policy(folder: Path, policy: policies.Policy, optimizer: torch.optim.Optimizer) -> None:
    """One policy's part of a checkpoint, written by whoever holds the policy (its Ray actor, under Ray)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        torch.save({"model": trainable_state(policy.model), "optimizer": optimizer.state_dict()},
                   folder / f"{policy.name}.pt")
    except (OSError, RuntimeError) as err:   # a full disk shows as torch's "unexpected pos N vs M"
        free = shutil.disk_usage(folder).free / 2 ** 20
        raise OSError(f"could not write {policy.name}'s checkpoint to {folder} ({err}); {free:.0f} MiB free there: "
                      f"is the disk full? Make room, then rerun the same command with --resume") from None


def commit_checkpoint(run_dir: Path, iteration: int, names: list[str], state: object = None) -> None:
    """Once every policy's part is written: `state` (the run's other state, if any), then point `latest` at the
    checkpoint, then drop older ones. A part this process cannot see is refused before `latest` moves, so a
    checkpoint never points at files that are elsewhere (on a cluster, an actor on another node writes to its own
    disk unless --runs-dir is on storage every node mounts)."""
    root, target = run_dir / "checkpoints", checkpoint_folder(run_dir, iteration)
    missing = [name for name in names if not (target / f"{name}.pt").exists()]
    if missing:
        raise FileNotFoundError(f"{target} lacks {missing}'s checkpoint: on a cluster, put --runs-dir on storage "
                                "that every node mounts at the same path")
    if state is not None:
        torch.save(state, target / "state.pt")
    tmp = root / "latest.tmp"
    tmp.write_text(target.name)
    tmp.replace(root / "latest")
    for old in root.glob("iter-*"):
        if old != target:
            shutil.rmtree(old)


def checkpointed_iterations(run_dir: Path) -> int:
    """How many iterations the run's last checkpoint had done, 0 for a run without one (or no run)."""
    latest = run_dir / "checkpoints" / "latest"
    return int(latest.read_text().strip().split("-")[1]) if latest.exists() else 0


def latest_checkpoint(run_dir: Path) -> tuple[int, Path, object]:
    """The last checkpoint: how many iterations it had done, its folder, and the run's other state saved with it
    (None if none was)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.exists():
        raise FileNotFoundError(f"{run_dir} has no checkpoint")
    folder = latest.parent / latest.read_text().strip()
    other = torch.load(folder / "state.pt", weights_only=False) if (folder / "state.pt").exists() else None
    return checkpointed_iterations(run_dir), folder, other


def load_policy(folder: Path, policy: policies.Policy, optimizer: torch.optim.Optimizer | None) -> None:
    """Restore one policy's part of a checkpoint (its optimizer too, unless None)."""
    state = torch.load(folder / f"{policy.name}.pt", map_location=policy.device)
    load_trainable_state(policy.model, state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])


def load_checkpoint(run_dir: Path, pols: list[policies.Policy]) -> tuple[int, object]:
    """Restore the policies of the last checkpoint, for evaluation (a resume restores each policy's optimizer too,
    learner.py); returns how many iterations it had done and the run's other state saved with it (None if none
    was)."""
    iteration, folder, other = latest_checkpoint(run_dir)
    for policy in pols:
        load_policy(folder, policy, None)
    return iteration, other
