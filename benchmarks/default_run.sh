#!/usr/bin/env bash
# Time the README's default run from a cold start (empty warm-up cache), then the same seed-by-seed check on
# seeds 1-3 that the README's results table reports. Usage: bash benchmarks/default_run.sh [SEEDS...]
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("${@:-1 2 3}")
for seed in ${seeds[@]}; do
  cache=$(mktemp -d)
  start=$(date +%s)
  python train.py --pair qwen-llama --seed "$seed" --cache-dir "$cache" --name "bench-qwen-llama-s$seed"
  echo "seed $seed: $(( $(date +%s) - start )) s wall, warm-up included"
  rm -rf "$cache"
done
python eval.py $(for seed in ${seeds[@]}; do echo "runs/bench-qwen-llama-s$seed"; done) --out runs/bench-compare
