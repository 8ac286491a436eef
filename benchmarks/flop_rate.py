"""How close each phase of a run comes to this machine's matrix-multiply ceiling: what bounds a speed-up (#29).

    python -m benchmarks.flop_rate --seed 900 --iterations 3 --train-args "--share cross-fidelity"

The run (train.py with the pilot's evaluation protocol and minibatches, the flags given, one thread) is made twice
on one seed: once with its phases timed (wall_time.py's phases), once with the floating-point operations of each
phase counted by torch's FlopCounterMode: matrix multiplies, and attention, forward and backward (CPU attention at
the full, not the causal, count). A seeded run repeats itself exactly on one machine, so both do the same work.
Curation's gradient norms are split into their forward, their norms from the factors and what those leave
(`with_backward`). Each phase's GFLOP/s is set against the ceiling: the best rate of a one-thread float32 multiply
[M, d] x [d, N] of the tiny pair's shapes (d the hidden width, N = d or 3d), measured here, best of several tries so
that other load weighs little. A phase near the ceiling gets faster only by computing less; one far below it spends
its time around its multiplies (Python, dispatch, small kernels). The FLOP-counting run is slower and its times are
not used. Writes OUT/flop-rate-sSEED.json. Timing never uses a comparison seed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import fidelity_record
from benchmarks import wall_time

ROOT = Path(__file__).resolve().parent.parent

ATTENTION = {   # CPU attention, which FlopCounterMode leaves at 0: its shapes give the count
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        lambda query, key, value, *args, out_shape=None, **kwargs: sdpa_flop_count(query, key, value),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad_out, query, key, value, *args, out_shape=None, **kwargs:
            sdpa_backward_flop_count(grad_out, query, key, value),
}
SHOWN = ("rollouts", "exchange", "curation", "gradient norms", "norms: forward", "norms: backward and glue",
         "norms: from factors", "updates", "evaluation")
"""the phases that train, and the parts of curation's gradient norms; start-up (a cached warm-up) and the rest
do next to no arithmetic"""


def with_backward(measured: dict[str, float]) -> dict[str, float]:
    """What the gradient norms' forward and factors leave: their batched backward, and in seconds also the glue
    around it (hooks, reshapes, bias sums); in FLOPs the backward alone, as only multiplies are counted."""
    rest = measured["gradient norms"] - measured["norms: forward"] - measured["norms: from factors"]
    return {**measured, "norms: backward and glue": rest}


def counted(totals: dict[str, float], phase: str, fn):
    """fn, its floating-point operations added to totals[phase] (wall_time.instrumented_run's measure)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        counter = FlopCounterMode(display=False, custom_mapping=ATTENTION)
        try:
            with counter:
                return fn(*args, **kwargs)
        finally:
            totals[phase] += counter.get_total_flops()
    return wrapper


def matmul_ceiling(width: int, rows: tuple[int, ...] = (64, 256, 1024, 4096), tries: int = 30
                   ) -> dict[str, float]:
    """GFLOP/s of one-thread float32 [M, width] x [width, N] multiplies, N in (width, 3 width), best of `tries`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rates = {}
    try:
        for m in rows:
            for n in (width, 3 * width):
                a, b = torch.randn(m, width), torch.randn(width, n)
                repeats = max(1, 2 ** 22 // (m * n))   # each timing a few milliseconds
                best = float("inf")
                for _ in range(tries):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        torch.mm(a, b)
                    best = min(best, (time.perf_counter() - start) / repeats)
                rates[f"{m}x{width}x{n}"] = 2 * m * width * n / best / 1e9
    finally:
        torch.set_num_threads(threads)
    return rates


def rates_table(seconds: dict[str, float], flops: dict[str, float], ceiling: float) -> str:
    lines = ["| phase | GFLOP | seconds | GFLOP/s | of the ceiling |", "|---|---|---|---|---|"]
    for phase in SHOWN:
        if seconds[phase] > 0 and flops[phase] > 0:
            rate = flops[phase] / seconds[phase] / 1e9
            lines.append(f"| {phase} | {flops[phase] / 1e9:.1f} | {seconds[phase]:.1f} | {rate:.1f} | "
                         f"{rate / ceiling:.0%} |")
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--seed", type=int, default=900)
    cli.add_argument("--iterations", type=int, default=3)
    cli.add_argument("--train-args", default="--share cross-fidelity", help="train.py flags of the run")
    cli.add_argument("--out", type=Path, default=ROOT / "results")
    cli.add_argument("--cache-dir", help="warm-up cache (default train.py's); a cold one adds the warm-ups")
    cli.add_argument("--inner", nargs=2, metavar=("REPO", "OUT"), help=argparse.SUPPRESS)
    cli.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.inner:
        wall_time.instrumented_run(Path(args.inner[0]), args.flags, Path(args.inner[1]), measure=counted)
        return
    from benchmarks.matrix import SETS
    from testbed import presets
    width = max(spec.tiny.hidden for spec in presets.PRESETS["tiny"]["qwen-llama"])
    with tempfile.TemporaryDirectory(prefix="flop-rate-") as tmp:
        work = Path(tmp)
        flags = ["--seed", str(args.seed), "--iterations", str(args.iterations), *SETS["pilot"].shared,
                 *args.train_args.split(), "--runs-dir", str(work / "runs"),
                 *(["--cache-dir", args.cache_dir] if args.cache_dir else [])]
        seconds = wall_time.run_one(ROOT, [*flags, "--name", "timed"], work / "seconds.json")
        flops = wall_time.run_one(ROOT, [*flags, "--name", "counted"], work / "flops.json", script=__file__)
        record = work / "runs" / "counted" / "fidelity.jsonl"
        # the offers whose step gradient norms were measured (a CCM term): none, and the norms cost nothing
        ccm = [r.get("terms", {}).get("ccm") for r in fidelity_record.read_records(record.parent)] \
            if record.exists() else []
        measured = sum(c is not None and math.isfinite(c) for c in ccm)
    seconds, flops = with_backward(seconds), with_backward(flops)
    rates = matmul_ceiling(width)
    ceiling = max(rates.values())
    print("one-thread float32 multiplies, GFLOP/s: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()))
    print(f"\n{args.iterations} iterations, seed {args.seed}, {args.train_args or 'none'}; ceiling {ceiling:.1f} "
          f"GFLOP/s; {measured} offers' step norms measured\n{rates_table(seconds, flops, ceiling)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"flop-rate-s{args.seed}.json"
    path.write_text(json.dumps({"seed": args.seed, "iterations": args.iterations, "train_args": args.train_args,
                                "seconds": seconds, "flops": flops, "matmul_gflops": rates,
                                "offers_measured": measured}, indent=1) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
