#!/usr/bin/env bash
# The warm start's GPU stage (attempt 7 in docs/benchmarks.md): many more passes over fresh
# renamed variants of the expert episodes than 2 CPU cores allow, from a CPU-trained checkpoint.
#
# Needs the expert data of scripts/warm_start.sh step 1 (train_a/train_b/val, and train_c if
# present) in $D, and a GPU that torch sees (sft train --device auto falls back to the CPU, which
# would take days at this size). Variants are made in parallel, one process per core.
#
#   INIT=tiny MINUTES=6 scripts/warm_start_gpu.sh          # writes $D/gpu (checkpoint + logs)
#
# Reproducibility: the variants are seeded, but their fresh names come from the identifiers in
# the running Python's standard library (sft_augment.name_pool), so another Python version draws
# other names; the training run is time-budgeted (MINUTES), so its step count depends on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${VIVACE:-.venv/bin/vivace}
D=${WARM_START_DIR:-runs/warm_start}
INIT=${INIT:-tiny}
OUT=${STAGE_OUT:-$D/gpu}
MINUTES=${MINUTES:-6}
SEED=${SEED:-100}
JOBS=${JOBS:-$(nproc)}
A=$D/gpu_data
mkdir -p "$A"

# 1. Variants: every base file split in shards, each shard renamed and cut four ways.
rm -f "$A"/shard_* "$A"/var_*.jsonl
bases=("$D/train_a.jsonl" "$D/train_b.jsonl")
[ -f "$D/train_c.jsonl" ] && bases+=("$D/train_c.jsonl")
n=0
for f in "${bases[@]}"; do
  split -n l/8 -d "$f" "$A/shard_${n}_"
  n=$((n + 1))
done
jobs=()
for s in "$A"/shard_*; do
  k=$(basename "$s")
  jobs+=("--cut first_file --theme-names --variants 12 --data $s --out $A/var_ff_$k.jsonl")
  jobs+=("--cut first_edit --theme-names --variants 12 --data $s --out $A/var_fe_$k.jsonl")
  jobs+=("--cut whole --theme-names --variants 4 --data $s --out $A/var_wh_$k.jsonl")
  jobs+=("--cut retry --theme-names --variants 3 --data $s --out $A/var_rt_$k.jsonl")
done
i=0
for j in "${jobs[@]}"; do
  echo "$j --seed $((SEED + i))"
  i=$((i + 1))
done | xargs -P "$JOBS" -I{} sh -c "$V sft augment {} --json >/dev/null 2>&1 || echo 'failed: {}' >&2" &
for i in 0 1 2 3; do  # piece copies (sft copies --vocab pieces), beside the variants
  $V sft copies --out "$A/var_pieces_$i.jsonl" --n 1000 --vocab pieces --lookback 768 --behind-system \
    --seed $((SEED + 1000 + i)) >/dev/null &
done
wait
echo "$(date +%T) variants: $(cat "$A"/var_*.jsonl | wc -l) episodes"

# 2. Training: the expert episodes as recorded plus all variants, bf16 autocast, 4 rows a step.
data=()
for f in "${bases[@]}" "$A"/var_*.jsonl; do data+=(--data "$f"); done
$V sft train "${data[@]}" --eval "$D/val.jsonl" --init "$INIT" --out "$OUT" --seq-len 16384 \
  --batch-tokens 65536 --lr 0.0006 --min-lr-ratio 0.1 --minutes "$MINUTES" --eval-every 100 \
  --save-every 500 --seed "$SEED" --device auto
