#!/usr/bin/env bash
# One device call: several warm starts side by side on one GPU (attempts 16 and 17 in docs/benchmarks.md).
# Each arm is scripts/warm_start_scratch_gpu.sh PHASE=train with its own settings, given as an argument
# NAME="VAR=value ..." (NAME in letters and digits); the copies are made on the device, the variants
# ahead on the CPU machine so the GPU's minutes all go on training. Training ends TRAIN_S seconds
# after the start, what is left is killed at KILL_S, and each arm's last checkpoint comes back as a
# bf16 tarball in 15 MB parts ($OUT/ARM.tgz.partNN; `cat` them into `tar xz`), beside logs.tgz.
# Each arm probes its last checkpoint (final_classes.json, in the logs). What runs after KILL_S took ~60 s
# for four arms in attempt 17: give the device call a timeout of at least KILL_S + 90 seconds, or the
# checkpoints are lost with the machine.
# RETURN (arm names, space-separated; default all) picks the checkpoints that come back.
# COPIES lists `sft copies` arguments, `;`-separated, made into /tmp/ws/extra_N.jsonl (N from 0)
# before the arms start: an arm names them in EXTRA_DATA.
#
# Inputs in $G (default .gpu, ignored by git, carried to the device; 34 MB for attempt 16):
#   whl/          pydantic and its needs as wheels for the device's Python (the device README says how)
#   train_a.jsonl.gz train_b.jsonl.gz val.jsonl.gz   the expert data (gzip -c runs/ws4/train_a.jsonl …)
#   vars.tgz      the variants: FF=3 FE=3 WH=2 LM=1 RT=3 RE=2 LETTERS=0.5 scripts/make_variants.sh DIR 400
#                 runs/ws4/train_a.jsonl runs/ws4/train_b.jsonl; tar czf vars.tgz -C DIR var_*.jsonl
#
# Attempt 16 (tiny and 18M from an untrained model, tiny continued):
#   TRAIN_S=470 KILL_S=535 bash scripts/warm_start_gpu_arms.sh A="SEED=301" \
#     B="SEED=302 ARCH=hidden_size=384,num_hidden_layers=6,num_attention_heads=6,head_dim=64" \
#     C="SEED=303 INIT=tiny C2_STEPS=200 C2_LR=0.0004 LR=0.0004"
# Attempt 17 (each narrow range from an untrained model; tiny continued with and without copy rows over
# ids 300-800):
#   TRAIN_S=480 KILL_S=530 N_NARROW=40000 N_WIDE=60000 COPIES="--n 60000 --vocab 300:800 --seed 77;\
#     --n 5000 --vocab 300:800 --lookback 768 --behind-system --seed 78" bash scripts/warm_start_gpu_arms.sh \
#     A="SEED=301 NARROW=300:800 COPY_ROW=2560 C1_STEPS=900 C2_STEPS=500 C3_STEPS=150" \
#     C="SEED=301 NARROW=3000:3500 COPY_ROW=2560 C1_STEPS=900 C2_STEPS=500 C3_STEPS=150" \
#     R="SEED=303 INIT=tiny C2_STEPS=0 LR=0.0004 EXTRA_DATA=/tmp/ws/extra_0.jsonl,/tmp/ws/extra_1.jsonl" \
#     R0="SEED=303 INIT=tiny C2_STEPS=0 LR=0.0004"
#   NO_WHEELS=1 OUT=/tmp/out C1_STEPS=2 C2_STEPS=2 N_NARROW=500 … # a dry run where the packages are
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/.."
G=${G:-.gpu}
TRAIN_S=${TRAIN_S:-470} KILL_S=${KILL_S:-535}
[ -n "${NO_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$G"/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
printf '#!/bin/sh\nexec python3 -c "from vivace.cli import main; main()" "$@"\n' > /tmp/vv
chmod +x /tmp/vv
export VIVACE=/tmp/vv WARM_START_DIR=/tmp/ws DEADLINE=$((T0 + TRAIN_S))
export C1_STEPS=${C1_STEPS:-800} C2_STEPS=${C2_STEPS:-600} COPY_ROW=${COPY_ROW:-32768} ROW=${ROW:-16384}
export BATCH_TOKENS=${BATCH_TOKENS:-32768} LR=${LR:-0.0008} EVAL_EVERY=${EVAL_EVERY:-400} SAVE_EVERY=${SAVE_EVERY:-400}
export N_NARROW=${N_NARROW:-200000} N_WIDE=${N_WIDE:-100000}
W=/tmp/ws
mkdir -p $W/scratch_data
for f in train_a train_b val; do gunzip -c "$G/$f.jsonl.gz" > $W/$f.jsonl; done
tar xzf "$G/vars.tgz" -C $W/scratch_data
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
echo "$(( $(date +%s) - T0 )) s: data ready, $(ls $W/scratch_data/var_*.jsonl | wc -l) variant files"
PHASE=copies scripts/warm_start_scratch_gpu.sh > $W/copies.log 2>&1 &
i=0
IFS=';' read -ra extra <<< "${COPIES:-}"
for a in "${extra[@]}"; do
  [ -n "${a// /}" ] || continue
  /tmp/vv sft copies --out $W/extra_$i.jsonl $a > /dev/null || { echo "COPIES: \`sft copies $a\` failed"; exit 1; }
  i=$((i + 1))
done
arms=() pids=()
for spec in "$@"; do
  arm=${spec%%=*}
  arms+=("$arm")
  env STAGE_OUT=$W/$arm PHASE=train ${spec#*=} scripts/warm_start_scratch_gpu.sh > $W/$arm.log 2>&1 &
  pids+=($!)
done
while :; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 1 ] || break
  now=$(( $(date +%s) - T0 ))
  if [ $now -ge "$KILL_S" ]; then echo "$now s: killing what is left"; pkill -f "vivace.cli" ; sleep 3; break; fi
  for arm in "${arms[@]}"; do
    log=$(ls -t $W/$arm/*/train_log.jsonl 2>/dev/null | head -1)
    [ -n "$log" ] && echo "$now s $arm $(basename "$(dirname "$log")"): $(tail -1 "$log" | cut -c1-230)"
  done
  sleep 30
done
echo "$(( $(date +%s) - T0 )) s: training over"
mkdir -p /tmp/pkg "$OUT"
for arm in ${RETURN:-"${arms[@]}"}; do  # a tiny one is ~12 MB gzipped; $OUT holds 8 files, 64 MB
  src=$W/$arm/episodes
  [ -f $src/model.safetensors ] || { echo "$arm: no episode checkpoint"; continue; }
  python3 -c "from pathlib import Path; from vivace.model.checkpoint import ship_checkpoint as s; \
s('$src', Path('/tmp/pkg/$arm'))" > /dev/null && cp $src/train_log.jsonl $src/sft_summary.json /tmp/pkg/$arm/ 2>/dev/null
  tar czf /tmp/pkg/$arm.tgz -C /tmp/pkg $arm
  split -b 15M -d /tmp/pkg/$arm.tgz "$OUT/$arm.tgz.part"
done
(cd $W && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='*_keep.jsonl' "${arms[@]}" copies.log \
  $(printf '%s.log ' "${arms[@]}"))
ls -la "$OUT"
echo "$(( $(date +%s) - T0 )) s: done"
