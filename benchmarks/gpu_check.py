"""A short check of a CUDA machine: the small pair's speed and memory, and every sharing level on the device.

1. The small pair (from --model-dir, the Hugging Face cache or the hub; where none answers on CUDA, stand-ins of
   its published shapes with random weights, benchmarks/shaped_models.py, whose rewards mean nothing and whose
   generations run to the length limit, so that their seconds an iteration and memory bound the real pair's from
   above): none, PRP, XGRPO and SGT for --iterations each, and per policy its rollout and update tokens per
   second (medians over the iterations after the first, which holds CUDA's warm-up) and the peak memory
   allocated on its device.
2. Every sharing level, cross-fidelity, HACPO and GRAFT included, on the tiny preset placed on the device, for
   --tiny-iterations each: that each runs end to end on CUDA, and its median seconds an iteration.
3. The exact per-step gradient norms, batched against one backward per step (reachability_bench.py --device cuda).

On a CPU, part 1 runs the tiny preset and parts 2-3 are skipped: a smoke test. Designed to finish in well under
10 minutes on one H200 (docs/speed.md, GPU check).

    python -m benchmarks.gpu_check [--pair qwen-llama] [--model-dir DIR] [--lora-rank 16] [--iterations 4] [--out F]
                                   [--cache-dir DIR] [-- TRAIN.PY FLAGS for every run, e.g. --warmup-scale 0.1]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import torch

import train
from args import Args, script_args
from benchmarks import shaped_models
from testbed import policies

SMALL_MODES = ("none", "prp", "xgrpo", "sgt")
ALL_MODES = typing.get_args(typing.get_type_hints(Args)["share"])


def run_mode(share: str, scale: str, iterations: int, cli: argparse.Namespace, runs_dir: str,
             model_dir: str | None = None) -> list[dict]:
    args = script_args("gpu_check.py", cli.flags, pair=cli.pair, scale=scale, share=share, model_dir=model_dir,
                       iterations=iterations, eval_size=cli.eval_size, eval_every=iterations,
                       checkpoint_every=iterations, lora_rank=cli.lora_rank, devices=cli.devices, runs_dir=runs_dir,
                       name=f"{scale}-{share}", max_new_tokens=cli.max_new_tokens, cache_dir=cli.cache_dir)
    run_dir = train.main(args)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per policy: medians over the iterations after the first of its speeds and iteration seconds, its peak
    memory, and the peer experience it received per iteration."""
    out = {}
    for name in dict.fromkeys(r["policy"] for r in records):
        updates = [r for r in records if r["policy"] == name and "perf/rollout_tokens_per_s" in r]
        steps = updates[1:] or updates
        out[name] = {"rollout tok/s": statistics.median(r["perf/rollout_tokens_per_s"] for r in steps),
                     "update tok/s": statistics.median(r["perf/update_tokens_per_s"] for r in steps),
                     "iteration s": statistics.median(r["perf/iteration_s"] for r in steps),
                     "peak GiB": max((r.get(k, float("nan")) for r in steps
                                      for k in ("perf/rollout_peak_gib", "perf/update_peak_gib")),
                                     default=float("nan")),
                     "received / it": statistics.mean(r.get("sharing/received", 0.0) for r in steps)}
    return out


def small_pair(cli: argparse.Namespace, runs_dir: str) -> list[dict]:
    """Part 1's rows: the small pair as it loads, else its shaped stand-ins on CUDA; the tiny preset on a CPU."""
    scale = label = "small" if torch.cuda.is_available() else "tiny"
    model_dir, rows = cli.model_dir, []
    for i, share in enumerate(SMALL_MODES):
        try:
            records = run_mode(share, scale, cli.iterations, cli, runs_dir, model_dir)
        except policies.WeightsUnavailable as err:
            if scale == "tiny" or i > 0:
                raise
            print(f"the small pair is not loadable ({err}); timing stand-ins of its shapes with random weights",
                  file=sys.stderr)
            model_dir = str(shaped_models.write_pair(cli.pair, Path(runs_dir) / "shaped", "cuda"))
            label = "small, shaped stand-ins"
            records = run_mode(share, scale, cli.iterations, cli, runs_dir, model_dir)
        rows += mode_rows(label, share, records)
    return rows


def mode_rows(label: str, share: str, records: list[dict]) -> list[dict]:
    """One row a policy of one sharing level's run, printed as the table's lines."""
    rows = [{"scale": label, "mode": share, "policy": name, **stats} for name, stats in summary(records).items()]
    for r in rows:
        print(f"| {r['scale']} | {r['mode']} | {r['policy']} | {r['rollout tok/s']:.0f} | {r['update tok/s']:.0f} "
              f"| {r['iteration s']:.2f} | {r['peak GiB']:.2f} | {r['received / it']:.1f} |", flush=True)
    return rows


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--model-dir", default=None)
    cli.add_argument("--devices", default=None)
    cli.add_argument("--lora-rank", type=int, default=0)
    cli.add_argument("--iterations", type=int, default=4, help="part 1's iterations per sharing level")
    cli.add_argument("--tiny-iterations", type=int, default=3, help="part 2's iterations per sharing level")
    cli.add_argument("--eval-size", type=int, default=64)
    cli.add_argument("--max-new-tokens", type=int, default=64)
    cli.add_argument("--cache-dir", default=None, help="the tiny warm-ups' cache (default: train.py's)")
    cli.add_argument("--out", type=Path, default=None, help="also write every row here as JSON")
    cli.add_argument("flags", nargs="*", help="train.py flags after --, for every run (not those set above)")
    cli = cli.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device (CPU smoke test)"
    print(f"device: {gpu}; torch {torch.__version__}")
    runs_dir = tempfile.mkdtemp(prefix="gpu-check-")
    print("| scale | mode | policy | rollout tok/s | update tok/s | iteration s | peak GiB | received / it |\n"
          "|---|---|---|---|---|---|---|---|")
    rows = small_pair(cli, runs_dir)
    if torch.cuda.is_available():
        for share in ALL_MODES:
            rows += mode_rows("tiny", share, run_mode(share, "tiny", cli.tiny_iterations, cli, runs_dir))
    if cli.out:
        cli.out.write_text(json.dumps({"device": gpu, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    if torch.cuda.is_available():
        subprocess.run([sys.executable, "-m", "benchmarks.reachability_bench", "--device", "cuda", "--problems", "16"],
                       cwd=Path(__file__).resolve().parents[1], check=True)


if __name__ == "__main__":
    main()
