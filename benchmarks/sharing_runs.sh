#!/usr/bin/env bash
# The four sharing levels side by side on one pair and seed: independent GRPO, PRP, XGRPO, SGT, each the default
# run with --share, then one comparison table (held-out accuracy, rewards, what crossed per iteration).
# Usage: bash benchmarks/sharing_runs.sh [PAIR] [SEED] [extra train.py flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
pair=${1:-qwen-llama}
seed=${2:-1}
shift $(( $# < 2 ? $# : 2 ))
for share in none prp xgrpo sgt; do
  start=$(date +%s)
  python train.py --pair "$pair" --share "$share" --seed "$seed" --name "share-$pair-$share-s$seed" "$@"
  echo "$share: $(( $(date +%s) - start )) s wall"
done
python eval.py $(for share in none prp xgrpo sgt; do echo "runs/share-$pair-$share-s$seed"; done) \
  --out "runs/share-$pair-s$seed-compare"
