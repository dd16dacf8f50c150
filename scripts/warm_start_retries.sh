#!/usr/bin/env bash
# The warm start's last stage (attempt 8 in docs/benchmarks.md; the shipped `tiny` is its output):
# from the GPU stage (scripts/warm_start_gpu.sh), a CPU stage whose rows are mostly retries — a
# wrong read or a near-miss edit, the tool's real error with its did-you-mean hint (untrained),
# then the right call — beside one variant each of the other cuts and the episodes as recorded.
# About 30 minutes on 2 CPU cores: the expert data (step 1 of scripts/warm_start.sh, ~17 min; the
# oracle's fragments keep a word's leading space since attempt 8, so older data differs), then the
# variants (~2 min) and 150 training steps (~10 min).
#
#   INIT=runs/warm_start/gpu scripts/warm_start_retries.sh     # writes $D/retries
#
# Then ship: `vivace sft ship runs/ws2/retries`. Attempt 14 (continuing the shipped h2 on fresh expert data):
#   INIT=tiny WARM_START_DIR=runs/ws4 STAGE_OUT=runs/ws4/P LR=0.0003 STEPS=250 SEED=9 scripts/warm_start_retries.sh
set -euo pipefail
cd "$(dirname "$0")/.."
V=${VIVACE:-.venv/bin/vivace}
D=${WARM_START_DIR:-runs/ws2}
INIT=${INIT:-runs/warm_start/gpu}
OUT=${STAGE_OUT:-$D/retries}
mkdir -p "$D"

# 1. Expert data, as scripts/warm_start.sh step 1 makes it.
[ -f "$D/tasks_extra.jsonl" ] || $V tasks families --out "$D/tasks_extra.jsonl" --train 160 --validation 0 --test 0 --seed 1
[ -f "$D/val.jsonl" ] || $V sft data --suite families --split validation --styles efficient --concurrency 2 --out "$D/val.jsonl"
[ -f "$D/train_a.jsonl" ] || $V sft data --suite families --split train --styles-per-task 2 --concurrency 2 --out "$D/train_a.jsonl"
[ -f "$D/train_b.jsonl" ] || $V sft data --tasks "$D/tasks_extra.jsonl" --split train --styles-per-task 1 --concurrency 2 --out "$D/train_b.jsonl"

# 2. Variants: retries (failed read / failed edit first) and one of each other cut, theme names.
B=(--data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --theme-names --json)
$V sft augment "${B[@]}" --variants 3 --seed 80 --cut retry --out "$D/h_rt.jsonl" >/dev/null &
$V sft augment "${B[@]}" --variants 2 --seed 81 --cut retry_edit --out "$D/h_re.jsonl" >/dev/null
wait
$V sft augment "${B[@]}" --variants 1 --seed 82 --cut first_file --out "$D/h_ff.jsonl" >/dev/null &
$V sft augment "${B[@]}" --variants 1 --seed 83 --cut first_edit --out "$D/h_fe.jsonl" >/dev/null
wait
$V sft augment "${B[@]}" --variants 1 --seed 84 --cut whole --out "$D/h_wh.jsonl" >/dev/null

# 3. Training (the run that was shipped: runs/ws2/h2, from the GPU stage's checkpoint).
$V sft train --data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$D/h_rt.jsonl" --data "$D/h_re.jsonl" \
  --data "$D/h_ff.jsonl" --data "$D/h_fe.jsonl" --data "$D/h_wh.jsonl" --eval "$D/val.jsonl" --init "$INIT" \
  --out "$OUT" --seq-len 16384 --batch-tokens 16384 --lr "${LR:-0.0004}" --min-lr-ratio 0.3 --steps "${STEPS:-150}" \
  --eval-every 50 --save-every 50 --threads 2 --seed "${SEED:-8}"
