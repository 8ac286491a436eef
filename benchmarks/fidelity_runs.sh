#!/usr/bin/env bash
# The seeded comparison of CROSS-FIDELITY: independent GRPO, the three fixed levels and --share cross-fidelity on
# one pair over several seeds, then one comparison table and each cross-fidelity run's fidelity report
# (runs/NAME/report.md).
# Usage: [JOBS=2] [MODES="none prp xgrpo sgt cross-fidelity"] bash benchmarks/fidelity_runs.sh [PAIR] [SEEDS] [extra
# train.py flags...], e.g. qwen-llama "1 2 3". The comparison covers every mode's runs of the pair and seeds found in
# runs/, so a later MODES="..." adds its runs to the same table.
# JOBS runs go at once, each on OMP_NUM_THREADS=1 (thread counts do not change these tiny runs' results); the
# queue goes seed by seed within each mode, so with several seeds the first runs warm up different policies (two
# runs that warm up the same one at once each compute it, and both succeed).
set -euo pipefail
cd "$(dirname "$0")/.."
pair=${1:-qwen-llama}
seeds=${2:-1 2 3}
shift $(( $# < 2 ? $# : 2 ))
jobs=${JOBS:-1}
all_modes="none prp xgrpo sgt cross-fidelity"
modes=${MODES:-$all_modes}
queue=()
for share in $modes; do
  for seed in $seeds; do
    queue+=("$share" "$seed")
  done
done
run() {  # share seed
  local share=$1 seed=$2 name="fidelity-$pair-$1-s$2" start
  start=$(date +%s)
  OMP_NUM_THREADS=$([ "$jobs" -gt 1 ] && echo 1 || echo "${OMP_NUM_THREADS:-$(nproc)}") \
    python train.py --pair "$pair" --share "$share" --seed "$seed" --name "$name" $extra > "runs/$name.log" 2>&1
  echo "$share seed $seed: $(( $(date +%s) - start )) s wall (log runs/$name.log)"
}
export -f run
extra="$*"
export pair jobs extra
mkdir -p runs
printf '%s\n' "${queue[@]}" | xargs -n 2 -P "$jobs" bash -c 'run "$@"' _
names=()
for share in $all_modes; do
  for seed in $seeds; do
    if [ -d "runs/fidelity-$pair-$share-s$seed" ]; then names+=("runs/fidelity-$pair-$share-s$seed"); fi
  done
done
python eval.py "${names[@]}" --out "runs/fidelity-$pair-compare"
