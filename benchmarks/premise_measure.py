"""The premise's rows (results/preregistration-premise.md): per preset and seed one cross-fidelity run, stopped at
each stage (iterations 10, 50, 90) and resumed between them in the same run directory (train.py's --resume; its
start.json records each sitting's start); at each stage up to 40 offers per direction drawn at random (seeded)
among the diagnosed offers with A != 0, and one row per offer.

A row holds what the registration lists and nothing else: the direction (source, receiver), seed, stage, D, the
terms raw and scaled, U of both halves of g_J and U with the repaired credit, PRP's mean truncated ratio, HACPO's s,
GRAFT's weight, the k3 KL, the offer's reward and advantage, and the band it was admitted to. A file per (preset,
seed, stage), JSON lines, written whole or not at all: `measure` skips a stage whose file exists, so a killed
measurement resumes where it stopped."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import train
from analysis import premise_registered as registered
from analysis.premise_report import stage_file
from args import Args
from benchmarks import premise_usefulness as usefulness


def write_rows(path: Path, rows: list[dict]) -> None:
    """All rows or none: written beside the file, then moved onto its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.replace(path)


def draw(pool: list, per_direction: int, key: str, direction: Callable) -> list:
    """Up to `per_direction` of each direction's items, drawn at random by a generator seeded with the key and the
    direction, so that one direction's draw does not depend on what the others hold."""
    by_direction: dict[tuple[str, str], list] = {}
    for item in pool:
        by_direction.setdefault(direction(item), []).append(item)
    return [item for d in sorted(by_direction) for item in
            random.Random(f"{key}/{d[0]}->{d[1]}").sample(by_direction[d], min(per_direction, len(by_direction[d])))]


def direction_of(c: usefulness.Candidate) -> tuple[str, str]:
    return c.offer.source.policy.name, c.receiver.policy.name


def offer_row(c: usefulness.Candidate, halves: list, seed: int, stage: int, args: Args) -> dict:
    """The registered row of one offer, U over each half of the receiver's g_J."""
    g, g_repaired = (usefulness.candidate_gradient(c, args.temperature, repaired) for repaired in (False, True))
    u_repaired = [usefulness.usefulness(g_repaired, h) for h in halves]
    source, receiver = direction_of(c)
    return {"source": source, "receiver": receiver, "seed": seed, "stage": stage, "D": c.record["D"],
            "terms": c.record["terms"], "scaled": c.record["scaled"],
            "U_halves": [usefulness.usefulness(g, h) for h in halves], "U_repaired": sum(u_repaired) / 2,
            **usefulness.signals(c.offer.source, c.crossing, args.graft_delta), "band": c.record["level"]}


def stage_rows(preset: str, seed: int, stage: int, runs_dir: str, offers: int, sizes: registered.Sizes,
               extra: tuple[str, ...] = ()) -> list[dict]:
    """The run of (preset, seed) trained (or resumed) to `stage`, and the rows of its drawn offers there."""
    t0 = time.process_time()
    args = usefulness.run_args(preset, seed, stage, runs_dir, extra)
    task, _ = train.load_tasks(args)
    learners, curation = usefulness.train_to(args)
    t1 = time.process_time()
    key = f"premise/{preset}/{seed}/{stage}"
    pool = usefulness.candidates(args, learners, curation, task)
    picked = draw(pool, offers, key, direction_of)
    problems = task.heldout[:sizes.heldout_prompts]
    halves = {name: usefulness.heldout_halves(c.receiver.policy, task, problems, sizes.heldout_samples, args,
                                              f"{key}/{name}")
              for name, c in {c.receiver.policy.name: c for c in picked}.items()}
    t2 = time.process_time()
    rows = [offer_row(c, halves[c.receiver.policy.name], seed, stage, args) for c in picked]
    t3 = time.process_time()
    print(f"{preset} seed {seed} iteration {stage}: {len(pool)} diagnosed offers with A != 0, {len(rows)} drawn; "
          f"CPU s: training and loading {t1 - t0:.0f}, offers and g_J {t2 - t1:.0f}, U {t3 - t2:.1f} "
          f"({(t3 - t2) / max(len(rows), 1):.2f} per offer)")
    return rows


def measure(presets: list[str], seeds: list[int], stages: list[int], out: Path,
            rows_of: Callable[[str, int, int], list[dict]]) -> list[Path]:
    """Each (preset, seed, stage) file, its stages in order (each resumes the run of the one before); a file that
    exists is kept as it is. Returns the files written now."""
    written = []
    for preset in presets:
        for seed in seeds:
            for stage in sorted(stages):
                path = stage_file(out, preset, seed, stage)
                if path.exists():
                    print(f"{path} exists: skipped")
                    continue
                write_rows(path, rows_of(preset, seed, stage))
                written.append(path)
    return written
