#!/usr/bin/env bash
# The tiny policy's supervised warm start, its CPU stages (attempts 5 and 6 in docs/benchmarks.md,
# "Supervised warm start: what was tried", with each stage's numbers; every stage's
# sft_summary.json records its data files' sha256). The shipped checkpoint goes on from `final`:
# scripts/warm_start_gpu.sh (attempt 7, on a GPU), then scripts/warm_start_retries.sh (attempt 8).
# About 4 hours on 2 CPU cores, most of it in the expert data and the copy stages.
#
# Reproducibility: the data are seeded (same seeds, same files). Each training stage runs a fixed
# number of steps; the stages with a constant learning rate replay exactly (on one machine and
# thread count), while the three with a cosine schedule (mix, dialogue, final) were time-budgeted
# and their cosine followed the step count planned from the measured speed (planned_steps in their
# train_log.jsonl: ~510, 310, and the final stage's), so --steps here shortens their decay a little.
#
#   scripts/warm_start.sh            # writes runs/warm_start/
#   WARM_START_DIR=/tmp/ws scripts/warm_start.sh
#
# Then ship: `vivace sft ship runs/warm_start/final` (rounds to bf16 and copies it to the package).
set -euo pipefail
cd "$(dirname "$0")/.."
V=${VIVACE:-.venv/bin/vivace}
D=${WARM_START_DIR:-runs/warm_start}
# vivace refuses to overwrite data or a run: start from a new or empty directory.
if [ -n "$(ls -A "$D" 2>/dev/null)" ]; then
  echo "error: $D is not empty; set WARM_START_DIR to a new directory, or remove $D" >&2
  exit 2
fi
mkdir -p "$D"

# 1. Expert data: the scripted oracle in its four styles through the real harness, on the shipped
#    training split (700 tasks, two styles each) and 160 extra generated training tasks (one each).
$V tasks families --out "$D/tasks_extra.jsonl" --train 160 --validation 0 --test 0 --seed 1
$V sft data --suite families --split train --styles-per-task 2 --concurrency 2 --out "$D/train_a.jsonl"
$V sft data --tasks "$D/tasks_extra.jsonl" --split train --styles-per-task 1 --concurrency 2 --out "$D/train_b.jsonl"
$V sft data --suite families --split validation --styles efficient --concurrency 2 --out "$D/val.jsonl"

# 2. Copy stages (rl/copying.py): induction heads form on a narrow vocabulary, then carry to all of it.
#    (300:800 is what the shipped warm start used; those are the text's most frequent pieces and stay
#    poorly copied for good. A new warm start should use a rarely written range such as 3000:3500:
#    "Where the uncopyable tokens come from" in docs/benchmarks.md.)
$V sft copies --out "$D/copies_narrow.jsonl" --n 40000 --vocab 300:800 --seed 0
$V sft copies --out "$D/copies_narrow_val.jsonl" --n 200 --vocab 300:800 --seed 99
$V sft copies --out "$D/copies_wide.jsonl" --n 60000 --vocab 300:4000 --seed 1
$V sft copies --out "$D/copies_val.jsonl" --n 200 --vocab 300:4000 --seed 98
$V sft train --data "$D/copies_narrow.jsonl" --eval "$D/copies_narrow_val.jsonl" --init tiny-init --out "$D/c1" --seq-len 2560 \
  --batch-tokens 2560 --lr 0.001 --min-lr-ratio 1 --steps 760 --threads 2 --seed 0
$V sft train --data "$D/copies_wide.jsonl" --eval "$D/copies_val.jsonl" --init "$D/c1" --out "$D/c2" --seq-len 2560 \
  --batch-tokens 2560 --lr 0.001 --min-lr-ratio 1 --steps 400 --threads 2 --seed 0

# 3. The mixed stage of attempt 5: whole expert episodes, package-renamed cut-short variants,
#    argument drills and some wide copies (300 steps; it taught the format, not yet copying).
$V sft augment --data "$D/train_a.jsonl" --variants 2 --seed 0 --out "$D/augmented_a.jsonl"
$V sft augment --data "$D/train_b.jsonl" --variants 2 --seed 1 --out "$D/augmented_b.jsonl"
$V sft drills --data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$D/augmented_a.jsonl" \
  --data "$D/augmented_b.jsonl" --argument path --argument old_string --argument new_string --window 1024 \
  --keep 0.5 --seed 0 --out "$D/drills.jsonl"
head -n 5000 "$D/copies_wide.jsonl" > "$D/copies_wide5k.jsonl"
$V sft train --data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$D/augmented_a.jsonl" \
  --data "$D/augmented_b.jsonl" --data "$D/drills.jsonl" --data "$D/copies_wide5k.jsonl" --eval "$D/val.jsonl" \
  --init "$D/c2" --out "$D/mix" --seq-len 16384 --batch-tokens 16384 --lr 0.001 --steps 300 --eval-every 100 \
  --save-every 100 --threads 2 --seed 0

# 4. Long-range copies (copied from anywhere in 768 random tokens), then kept while path drills
#    train, then behind the harness's system turn (where the agent copies; without it, 0%).
$V sft copies --out "$D/lookback.jsonl" --n 6000 --vocab 300:4000 --lookback 768 --seed 3
$V sft copies --out "$D/lookback_val.jsonl" --n 60 --vocab 300:4000 --lookback 768 --seed 96
$V sft train --data "$D/lookback.jsonl" --eval "$D/lookback_val.jsonl" --init "$D/mix" --out "$D/lb" --seq-len 3072 \
  --batch-tokens 3072 --lr 0.001 --min-lr-ratio 1 --steps 450 --eval-every 25 --threads 2 --seed 0
$V sft drills --data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$D/augmented_a.jsonl" \
  --data "$D/augmented_b.jsonl" --argument path --window 1024 --seed 1 --out "$D/path_drills.jsonl"
head -n 1500 "$D/lookback.jsonl" > "$D/lookback1500.jsonl"
$V sft train --data "$D/path_drills.jsonl" --data "$D/train_b.jsonl" --data "$D/augmented_b.jsonl" \
  --data "$D/lookback1500.jsonl" --eval "$D/val.jsonl" --init "$D/lb" --out "$D/lbk" --seq-len 8192 \
  --batch-tokens 8192 --lr 0.0005 --min-lr-ratio 1 --steps 100 --threads 2 --seed 0
$V sft copies --out "$D/lookback_sys.jsonl" --n 3000 --vocab 300:4000 --lookback 768 --behind-system --seed 5
$V sft train --data "$D/lookback_sys.jsonl" --data "$D/path_drills.jsonl" --data "$D/train_b.jsonl" \
  --init "$D/lbk" --out "$D/lbs" --seq-len 8192 --batch-tokens 8192 --lr 0.0005 --min-lr-ratio 1 --steps 100 \
  --threads 2 --seed 0

# 5. Natural-text copying (attempt 6). Whole episodes with the theme renamed (package, record
#    nouns, fields) and every token after the system turn trained; then copies over the short
#    pieces names split into, which recur, so a copy must match several tokens back.
$V sft augment --data "$D/train_a.jsonl" --variants 4 --seed 10 --cut whole --theme-names --train-context \
  --out "$D/lm_a.jsonl"
$V sft augment --data "$D/train_b.jsonl" --variants 4 --seed 11 --cut whole --theme-names --train-context \
  --out "$D/lm_b.jsonl"
head -n 700 "$D/lookback_sys.jsonl" > "$D/lookback_sys700.jsonl"
$V sft train --data "$D/lm_a.jsonl" --data "$D/lm_b.jsonl" --data "$D/lookback_sys700.jsonl" --eval "$D/val.jsonl" \
  --init "$D/lbs" --out "$D/lm" --seq-len 16384 --batch-tokens 16384 --lr 0.0005 --min-lr-ratio 0.3 --steps 100 \
  --threads 2 --seed 0
$V sft copies --out "$D/pieces_sys.jsonl" --n 2500 --vocab pieces --lookback 768 --behind-system --seed 21
$V sft copies --out "$D/pieces_sys_val.jsonl" --n 30 --vocab pieces --lookback 768 --behind-system --seed 97
$V sft train --data "$D/pieces_sys.jsonl" --data "$D/lm_b.jsonl" --eval "$D/pieces_sys_val.jsonl" --init "$D/lm" \
  --out "$D/pc" --seq-len 16384 --batch-tokens 16384 --lr 0.0005 --min-lr-ratio 1 --steps 138 --eval-every 25 \
  --threads 2 --seed 0
head -n 3000 "$D/path_drills.jsonl" > "$D/path_drills3k.jsonl"
$V sft train --data "$D/lm_a.jsonl" --data "$D/pieces_sys.jsonl" --data "$D/path_drills3k.jsonl" --eval "$D/val.jsonl" \
  --init "$D/pc" --out "$D/m2" --seq-len 16384 --batch-tokens 16384 --lr 0.0005 --min-lr-ratio 1 --steps 100 \
  --threads 2 --seed 1

# 6. Dense practice at the decisions: episodes cut right after the first call naming a package
#    file (a lookup in the traceback or test output) or after the first edit, fresh names each.
$V sft augment --data "$D/train_a.jsonl" --variants 8 --seed 20 --cut first_file --theme-names --out "$D/ff_a.jsonl"
$V sft augment --data "$D/train_a.jsonl" --variants 3 --seed 21 --cut first_edit --theme-names --out "$D/fe_a.jsonl"
$V sft train --data "$D/ff_a.jsonl" --data "$D/fe_a.jsonl" --data "$D/pieces_sys.jsonl" --eval "$D/val.jsonl" \
  --init "$D/m2" --out "$D/m3" --seq-len 16384 --batch-tokens 16384 --lr 0.0005 --min-lr-ratio 1 --steps 200 \
  --threads 2 --seed 2

# 7. The final stage: whole episodes (as recorded and renamed), the cut-short decisions, a failed
#    read followed by the right one (untrained near miss), and some piece copies.
$V sft augment --data "$D/train_a.jsonl" --variants 2 --seed 30 --cut whole --theme-names --out "$D/wh_a.jsonl"
$V sft augment --data "$D/train_a.jsonl" --variants 3 --seed 40 --cut retry --theme-names --out "$D/rt_a.jsonl"
shuf -n 5000 --random-source=<(yes) "$D/ff_a.jsonl" > "$D/ff5k.jsonl"
shuf -n 2500 --random-source=<(yes) "$D/rt_a.jsonl" > "$D/rt2500.jsonl"
head -n 1200 "$D/pieces_sys.jsonl" > "$D/pieces1200.jsonl"
$V sft train --data "$D/train_a.jsonl" --data "$D/train_b.jsonl" --data "$D/wh_a.jsonl" --data "$D/ff5k.jsonl" \
  --data "$D/fe_a.jsonl" --data "$D/rt2500.jsonl" --data "$D/pieces1200.jsonl" --eval "$D/val.jsonl" \
  --init "$D/m3" --out "$D/final" --seq-len 16384 --batch-tokens 16384 --lr 0.0005 --min-lr-ratio 0.2 \
  --steps 241 --threads 2 --seed 3
