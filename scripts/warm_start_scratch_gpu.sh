#!/usr/bin/env bash
# The warm start from an untrained model on one GPU (attempt 10 in docs/benchmarks.md): the stages
# of scripts/warm_start.sh folded into three runs, over many more fresh variants than 2 CPU cores
# can make. ARCH sets the size (`sft train --arch`; empty: the tiny preset).
#
# Needs the expert data of scripts/warm_start.sh step 1 (train_a, train_b, val) in $D.
#
#   PHASE=data scripts/warm_start_scratch_gpu.sh                     # copies and variants, once
#   PHASE=copies scripts/warm_start_scratch_gpu.sh                   # copies only: variants made elsewhere
#   PHASE=train ARCH=hidden_size=384,... STAGE_OUT=$D/b scripts/warm_start_scratch_gpu.sh
#   scripts/warm_start_scratch_gpu.sh                                # both, tiny preset
#
# Stages, each a `vivace sft train` run from the last:
#   copies   narrow-vocabulary copies (induction heads form), constant rate, C1_STEPS steps (on 2 CPU
#            cores the jump came at ~600 steps; attempt 10's 173 were too few);
#   copies2  whole-vocabulary and long-range copies, behind the system turn too, C2_STEPS steps (0: none);
#            with C3_STEPS > 0, whole-vocabulary copies alone (as on 2 cores, where the copier carried to
#            every id), then copies3: the long-range copies, C3_STEPS steps of C3_ROW tokens;
#   episodes the expert episodes as recorded, renamed variants cut at each decision (first file,
#            first edit, whole, whole with every token trained, a failed read or edit first) and
#            some copy rows; cosine from LR, MIX_MIN minutes.
# The script stops after the narrow stage if its copier has not formed (eval accuracy under MIN_NARROW_ACC),
# After copies2 and after the episodes it writes copy accuracy by token class (probe_copy_classes.py) to
# $OUT/copy_classes.json and $OUT/final_classes.json.
# Rows are long (COPY_ROW, ROW tokens; episodes keep their own positions): a GPU forward of this
# model is bound by kernel launches, so tokens per forward is throughput. The copy stages may need small
# steps, though: with 32k-token steps the wide stage stayed at 0.09 for 600 steps (attempt 16), where
# 2,560-token steps reached 0.79 by step 300 on 2 cores; COPY_ROW=2560 runs them that way.
# EXTRA_DATA (files, comma-separated) joins the episode stage's data, e.g. copy rows. The trainer is one
# CPU-bound process: leave it cores (JOBS below nproc) when it runs beside the data phase.
# INIT (a checkpoint, e.g. tiny) starts from a trained policy instead: the narrow stage is skipped.
# DEADLINE (seconds since the epoch) instead sizes the episode stage to end 30 s before it.
# PHASE=copies is for variants made ahead on another machine (scripts/make_variants.sh into $A, the
# same var_*.jsonl names), so the GPU's minutes all go on training.
# Time budgets make the step counts depend on the GPU (each stage's train_log.jsonl has them).
set -euo pipefail
cd "$(dirname "$0")/.."
V=${VIVACE:-.venv/bin/vivace}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # one that imports vivace
D=${WARM_START_DIR:-runs/warm_start}
OUT=${STAGE_OUT:-$D/scratch}
ARCH=${ARCH:-}
PHASE=${PHASE:-all}
SEED=${SEED:-300}
C1_STEPS=${C1_STEPS:-800} C2_STEPS=${C2_STEPS:-600} C2_LR=${C2_LR:-0.001} MIX_MIN=${MIX_MIN:-5}
C3_STEPS=${C3_STEPS:-0} C3_ROW=${C3_ROW:-8192} EXTRA_DATA=${EXTRA_DATA:-}
INIT=${INIT:-}
LR=${LR:-0.0006}
COPY_ROW=${COPY_ROW:-32768} ROW=${ROW:-65536} BATCH_TOKENS=${BATCH_TOKENS:-131072}
FF=${FF:-3} FE=${FE:-3} WH=${WH:-2} LM=${LM:-1} RT=${RT:-3} RE=${RE:-2}
# NARROW: the narrow stage's id range. The wide stage after it copies every id but these at about half
# the rate, so they should be ids the text rarely writes: 3000:3500 holds 0.5% of the expert episodes'
# tokens, while 300:800, which every warm start up to the shipped one used, holds 35% and left those
# pieces uncopyable for good ("Where the uncopyable tokens come from" in docs/benchmarks.md). Check the
# copy stages with scripts/probe_copy_classes.py (seconds) before the episode stage. The price, measured
# on 2 cores: the text starts slower (validation loss 4.52 against 3.16 after 268 text steps), so compare
# both ranges at equal time when a GPU allows.
NARROW=${NARROW:-3000:3500} MIN_NARROW_ACC=${MIN_NARROW_ACC:-0.9}
NF=narrow_${NARROW/:/-}  # per range, so arms with different ranges share one data folder
# The narrow rows of NARROW, written aside and renamed: arms making the same range at once never read
# a half-written file.
narrow_rows() {
  $V sft copies --out "$A/$NF.jsonl.$$" --n "$N_NARROW" --vocab "$NARROW" --seed "$SEED"
  $V sft copies --out "$A/${NF}_val.jsonl.$$" --n 200 --vocab "$NARROW" --seed $((SEED + 1))
  mv "$A/$NF.jsonl.$$" "$A/$NF.jsonl" && mv "$A/${NF}_val.jsonl.$$" "$A/${NF}_val.jsonl"
}
# Copy accuracy by token class of checkpoint $1 into $2 (seconds): the narrow range may lag, the text's
# frequent pieces must not.
copy_classes() {
  "$PY" scripts/probe_copy_classes.py --model "$1" --copies "$A/wide_val.jsonl" --text "$D/train_a.jsonl" \
    --range 300:800 --range "$NARROW" --json | tee "$2"
}
N_NARROW=${N_NARROW:-200000} N_WIDE=${N_WIDE:-100000} N_LOOKBACK=${N_LOOKBACK:-3000} N_PIECES=${N_PIECES:-3000}
JOBS=${JOBS:-$(nproc)}
EVAL_EVERY=${EVAL_EVERY:-100} SAVE_EVERY=${SAVE_EVERY:-200}
A=$D/scratch_data
mkdir -p "$A"

if [ "$PHASE" != train ]; then
  rm -f "$A"/*.done
  # Copies first (seconds), so the copy stages can start while the variants are made.
  narrow_rows &
  $V sft copies --out "$A/wide.jsonl" --n "$N_WIDE" --vocab 300:4000 --seed $((SEED + 2)) &
  $V sft copies --out "$A/wide_val.jsonl" --n 200 --vocab 300:4000 --seed $((SEED + 3)) &
  $V sft copies --out "$A/lookback.jsonl" --n "$N_LOOKBACK" --vocab 300:4000 --lookback 768 --seed $((SEED + 4)) &
  $V sft copies --out "$A/lookback_sys.jsonl" --n "$N_LOOKBACK" --vocab 300:4000 --lookback 768 --behind-system \
    --seed $((SEED + 5)) &
  $V sft copies --out "$A/pieces_sys.jsonl" --n "$N_PIECES" --vocab pieces --lookback 768 --behind-system \
    --seed $((SEED + 6)) &
  wait
  touch "$A/copies.done"
  if [ "$PHASE" = copies ]; then touch "$A/variants.done"; exit 0; fi
  # Variants: every kind of renamed cut, one process per core.
  FF=$FF FE=$FE WH=$WH LM=$LM RT=$RT RE=$RE JOBS=$JOBS VIVACE=$V scripts/make_variants.sh "$A" $((SEED + 100)) \
    "$D/train_a.jsonl" "$D/train_b.jsonl"
  echo "$(date +%T) variants: $(cat "$A"/var_*.jsonl | wc -l) episodes"
  touch "$A/variants.done"
fi
[ "$PHASE" = data ] && exit 0

arch=()
[ -n "$ARCH" ] && arch=(--arch "$ARCH")
mkdir -p "$OUT"
while [ ! -f "$A/copies.done" ]; do sleep 2; done
start=$OUT/copies
if [ -n "$INIT" ]; then
  start=$INIT  # a trained policy already copies: no narrow stage
else
  [ -f "$A/${NF}_val.jsonl" ] || narrow_rows  # a range the copies phase did not make (an arm's own NARROW)
  $V sft train --data "$A/$NF.jsonl" --eval "$A/${NF}_val.jsonl" --init tiny-init "${arch[@]}" --out "$OUT/copies" \
    --seq-len "$COPY_ROW" --batch-tokens "$COPY_ROW" --lr 0.001 --min-lr-ratio 1 --steps "$C1_STEPS" --eval-every 50 \
    --save-every 0 --seed "$SEED" --device auto --json > "$OUT/copies.json"
  # Without a formed copier every later stage is wasted (on 2 cores a narrow stage over 3596:4096 had not
  # formed one after 1,660 steps where 300:800 and 3000:3500 had by step 600).
  python3 -c "import json, sys; a = json.load(open(sys.argv[1])).get('eval_token_acc') or 0
sys.exit(f'narrow copy stage: eval accuracy {a:.3f} after $C1_STEPS steps, so no copier formed; raise C1_STEPS '
         'or change SEED or NARROW' if a < $MIN_NARROW_ACC else 0)" "$OUT/copies/sft_summary.json"
fi
long_range=(--data "$A/lookback.jsonl" --data "$A/lookback_sys.jsonl" --data "$A/pieces_sys.jsonl")
if [ "$C2_STEPS" -gt 0 ]; then
  c2_data=(--data "$A/wide.jsonl")
  [ "$C3_STEPS" -gt 0 ] || c2_data+=("${long_range[@]}")
  $V sft train "${c2_data[@]}" --eval "$A/wide_val.jsonl" --init "$start" --out "$OUT/copies2" \
    --seq-len "$COPY_ROW" --batch-tokens "$COPY_ROW" --lr "$C2_LR" --min-lr-ratio 1 --steps "$C2_STEPS" --eval-every 50 \
    --save-every 0 --seed "$SEED" --device auto --json > "$OUT/copies2.json"
  copy_classes "$OUT/copies2" "$OUT/copy_classes.json"
  start=$OUT/copies2
fi
if [ "$C3_STEPS" -gt 0 ]; then
  head -n 5000 "$A/wide.jsonl" > "$OUT/wide_keep.jsonl"
  $V sft train "${long_range[@]}" --data "$OUT/wide_keep.jsonl" --eval "$A/wide_val.jsonl" --init "$start" \
    --out "$OUT/copies3" --seq-len "$C3_ROW" --batch-tokens "$C3_ROW" --lr "$C2_LR" --min-lr-ratio 1 --steps "$C3_STEPS" \
    --eval-every 50 --save-every 0 --seed "$SEED" --device auto --json > "$OUT/copies3.json"
  start=$OUT/copies3
fi
while [ ! -f "$A/variants.done" ]; do sleep 2; done
head -n 1200 "$A/pieces_sys.jsonl" > "$OUT/pieces_keep.jsonl"
head -n 700 "$A/lookback_sys.jsonl" > "$OUT/lookback_keep.jsonl"
if [ -n "${DEADLINE:-}" ]; then
  MIX_MIN=$(python3 -c "import time; print(max(0.5, ($DEADLINE - time.time() - 30) / 60))")
fi
data=(--data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$OUT/pieces_keep.jsonl" --data "$OUT/lookback_keep.jsonl")
for f in ${EXTRA_DATA//,/ }; do
  [ -s "$f" ] || { echo "EXTRA_DATA: $f is missing or empty; give existing JSONL files, comma-separated" >&2; exit 2; }
  data+=(--data "$f")
done
for f in "$A"/var_*.jsonl; do [ -s "$f" ] && data+=(--data "$f"); done  # a shard with no edit has no first_edit cut
$V sft train "${data[@]}" --eval "$D/val.jsonl" --init "$start" --out "$OUT/episodes" --seq-len "$ROW" \
  --batch-tokens "$BATCH_TOKENS" --lr "$LR" --min-lr-ratio 0.1 --minutes "$MIX_MIN" --eval-every "$EVAL_EVERY" \
  --save-every "$SAVE_EVERY" --seed "$SEED" --device auto --json > "$OUT/episodes.json"
copy_classes "$OUT/episodes" "$OUT/final_classes.json"
echo "$(date +%T) done: $OUT/episodes"
