"""A short check of a CUDA machine: every sharing mode for a few iterations, throughput and peak memory.

Loads the `small` pair (from --model-dir, the Hugging Face cache or the hub); where it cannot be loaded, falls
back to the tiny offline preset and says so. For each of none / prp / xgrpo / sgt it runs `train.py` for a few
iterations and prints, per policy, rollout and update tokens per second (medians over the iterations after the
first, which includes CUDA warm-up) and the peak memory allocated on the policy's device; then times the exact
per-step gradient norms against the one-backward-per-step loop (reachability_bench.py). Designed to finish in
well under 10 minutes on one H200; on a CPU it runs as a smoke test.

    python benchmarks/gpu_check.py [--pair qwen-llama] [--model-dir DIR] [--lora-rank 16] [--iterations 4]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import train  # noqa: E402

from args import Args  # noqa: E402

MODES = ("none", "prp", "xgrpo", "sgt")


def run_mode(share: str, scale: str, cli: argparse.Namespace, runs_dir: str) -> list[dict]:
    args = Args(pair=cli.pair, scale=scale, share=share, model_dir=cli.model_dir, iterations=cli.iterations,
                      eval_size=cli.eval_size, eval_every=cli.iterations, checkpoint_every=cli.iterations,
                      lora_rank=cli.lora_rank, devices=cli.devices, runs_dir=runs_dir, name=f"{scale}-{share}",
                      max_new_tokens=cli.max_new_tokens)
    run_dir = train.main(args)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for name in dict.fromkeys(r["policy"] for r in records):
        updates = [r for r in records if r["policy"] == name and "perf/rollout_tokens_per_s" in r]
        steps = updates[1:] or updates
        out[name] = {"rollout tok/s": statistics.median(r["perf/rollout_tokens_per_s"] for r in steps),
                     "update tok/s": statistics.median(r["perf/update_tokens_per_s"] for r in steps),
                     "peak GiB": max((r.get(k, float("nan")) for r in steps
                                      for k in ("perf/rollout_peak_gib", "perf/update_peak_gib")), default=float("nan")),
                     "received / it": statistics.mean(r.get("sharing/received", 0.0) for r in steps)}
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--pair", default="qwen-llama")
    cli.add_argument("--model-dir", default=None)
    cli.add_argument("--devices", default=None)
    cli.add_argument("--lora-rank", type=int, default=0)
    cli.add_argument("--iterations", type=int, default=4)
    cli.add_argument("--eval-size", type=int, default=64)
    cli.add_argument("--max-new-tokens", type=int, default=64)
    cli = cli.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device (CPU smoke test)"
    print(f"device: {gpu}; torch {torch.__version__}")
    runs_dir = tempfile.mkdtemp(prefix="gpu-check-")
    scale = "small" if torch.cuda.is_available() else "tiny"
    rows = []
    for share in MODES:
        try:
            records = run_mode(share, scale, cli, runs_dir)
        except RuntimeError as err:
            if scale == "tiny":
                raise
            print(f"small preset not loadable ({err}); falling back to the tiny preset")
            scale = "tiny"
            records = run_mode(share, scale, cli, runs_dir)
        for name, stats in summary(records).items():
            rows.append((share, name, stats))
    print("\n| scale | mode | policy | rollout tok/s | update tok/s | peak GiB | received / it |\n|---|---|---|---|---|---|---|")
    for share, name, s in rows:
        print(f"| {scale} | {share} | {name} | {s['rollout tok/s']:.0f} | {s['update tok/s']:.0f} "
              f"| {s['peak GiB']:.2f} | {s['received / it']:.0f} |")
    if torch.cuda.is_available():  # the batched per-step norms against one backward per step, on the GPU
        subprocess.run([sys.executable, str(Path(__file__).with_name("reachability_bench.py")), "--device", "cuda",
                        "--problems", "16"], check=True)


if __name__ == "__main__":
    main()
