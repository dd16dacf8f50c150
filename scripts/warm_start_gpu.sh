#!/usr/bin/env bash
# The warm start's GPU stage (attempt 7 in docs/benchmarks.md): many more passes over fresh
# renamed variants of the expert episodes than 2 CPU cores allow, from a CPU-trained checkpoint.
#
# Needs the expert data of scripts/warm_start.sh step 1 (train_a/train_b/val, and train_c if
# present) in $D, and a GPU that torch sees (sft train --device auto falls back to the CPU, which
# would take days at this size). Variants are made in parallel, one process per core.
#
#   INIT=tiny MINUTES=6 scripts/warm_start_gpu.sh          # writes $D/gpu (checkpoint + logs)
#   PHASE=variants scripts/warm_start_gpu.sh                 # only the variants (e.g. on a CPU host)
#   PHASE=train INIT=runs/warm_start/gpu STAGE_OUT=runs/warm_start/gpu2 scripts/warm_start_gpu.sh
#
# BASES (default: train_a train_b, and train_c if present) names the expert files in $D; FF, FE,
# WH, RT, RE are the variants per episode of each cut (first_file, first_edit, whole, retry,
# retry_edit); BATCH_TOKENS the tokens per optimizer step (rows of 16k tokens accumulate); ARCH, e.g.
# num_hidden_layers=8, deepens INIT by identity layers before training (sft train --arch).
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
PHASE=${PHASE:-all}
LR=${LR:-0.0006} FF=${FF:-12} FE=${FE:-12} WH=${WH:-4} RT=${RT:-3} RE=${RE:-0}
BATCH_TOKENS=${BATCH_TOKENS:-65536}
JOBS=${JOBS:-$(nproc)}
A=$D/gpu_data
mkdir -p "$A"

# 1. Variants: every base file split in shards, each shard renamed and cut four or five ways.
bases=()
for b in ${BASES:-train_a train_b $( [ -f "$D/train_c.jsonl" ] && echo train_c )}; do bases+=("$D/$b.jsonl"); done
if [ "$PHASE" != train ]; then
FF=$FF FE=$FE WH=$WH RT=$RT RE=$RE JOBS=$JOBS VIVACE=$V scripts/make_variants.sh "$A" "$SEED" "${bases[@]}" &
for i in 0 1 2 3; do  # piece copies (sft copies --vocab pieces), beside the variants
  $V sft copies --out "$A/var_pieces_$i.jsonl" --n 1000 --vocab pieces --lookback 768 --behind-system \
    --seed $((SEED + 1000 + i)) >/dev/null &
done
wait
echo "$(date +%T) variants: $(cat "$A"/var_*.jsonl | wc -l) episodes"
fi
[ "$PHASE" = variants ] && exit 0

# 2. Training: the expert episodes as recorded plus all variants, bf16 autocast, 4 rows a step.
data=()
for f in "${bases[@]}" "$A"/var_*.jsonl; do data+=(--data "$f"); done
$V sft train "${data[@]}" --eval "$D/val.jsonl" --init "$INIT" --out "$OUT" --seq-len 16384 \
  --batch-tokens "$BATCH_TOKENS" --lr "$LR" --min-lr-ratio 0.1 --minutes "$MINUTES" --eval-every 100 \
  --save-every 500 --seed "$SEED" --device auto ${ARCH:+--arch "$ARCH"}
