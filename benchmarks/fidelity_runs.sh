#!/usr/bin/env bash
# The first seeded comparison of CROSS-FIDELITY: independent GRPO, SGT (the best static level in the README's
# sharing runs) and --share cross-fidelity on one pair over several seeds, then one comparison table and each
# cross-fidelity run's fidelity report (runs/NAME/report.md).
# Usage: bash benchmarks/fidelity_runs.sh [PAIR] [SEEDS] [extra train.py flags...]   e.g. qwen-llama "1 2 3"
set -euo pipefail
cd "$(dirname "$0")/.."
pair=${1:-qwen-llama}
seeds=${2:-1 2 3}
shift $(( $# < 2 ? $# : 2 ))
runs=()
for seed in $seeds; do
  for share in none sgt cross-fidelity; do
    name="fidelity-$pair-$share-s$seed"
    start=$(date +%s)
    python train.py --pair "$pair" --share "$share" --seed "$seed" --name "$name" "$@"
    echo "$share seed $seed: $(( $(date +%s) - start )) s wall"
    runs+=("runs/$name")
  done
done
python eval.py "${runs[@]}" --out "runs/fidelity-$pair-compare"
