#!/usr/bin/env bash
# More expert data of the three weakest families, continued from the shipped tiny, then measured beside
# it (attempt 20 in docs/benchmarks.md, "Supervised warm start: what was tried"; not shipped). ~45 min
# on 2 cores.   scripts/warm_start_weak_families.sh   (D=DIR for another run directory)
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv/bin/vivace; P=.venv/bin/python; D=${D:-runs/wf}
if [ -n "$(ls -A "$D" 2>/dev/null)" ]; then  # vivace refuses to overwrite data or a run
  echo "error: $D is not empty; give D=NEW_DIR, or remove $D" >&2
  exit 2
fi
mkdir -p "$D"
log() { echo "$(date +%T) $*"; }
log tasks; $V tasks families --out $D/tasks.jsonl --train 420 --validation 0 --test 0 --seed 11 > $D/tasks.log 2>&1
$P - "$D" <<'PY'
import json, sys
weak = {"misspelled_name", "self_comparison", "unused_loop_variable"}
rows = [l for l in open(sys.argv[1] + "/tasks.jsonl") if json.loads(l)["metadata"]["family"] in weak]
open(sys.argv[1] + "/weak.jsonl", "w").writelines(rows); print(len(rows), "weak tasks")
PY
log data; $V sft data --tasks $D/weak.jsonl --split train --styles-per-task 2 --concurrency 2 --out $D/weak_ep.jsonl > $D/data.log 2>&1
log replay; $V sft data --suite families --split train --styles efficient --n 400 --concurrency 2 --out $D/replay.jsonl > $D/replay.log 2>&1
log val; $V sft data --suite families --split validation --styles efficient --concurrency 2 --out $D/val.jsonl > $D/val.log 2>&1
log augment; $V sft augment --data $D/weak_ep.jsonl --variants 2 --seed 0 --out $D/weak_aug.jsonl > $D/aug.log 2>&1
log train; $V sft train --init tiny --data $D/weak_ep.jsonl --data $D/weak_aug.jsonl --data $D/replay.jsonl --freeze-embedding \
  --lr 2e-4 --minutes 20 --out $D/out --eval $D/val.jsonl --seq-len 16384 --batch-tokens 32768 --warmup-steps 5 \
  --min-lr-ratio 0.1 --eval-every 0 --save-every 0 --threads 2 --device cpu --seed 0 > $D/train.log 2>&1
# seed 0's held-out draw, as `make train` measures it
$P -c "from vivace.config import load_preset; from vivace.rl.evaluate import held_out_tasks as h; c = load_preset('tiny')
open('$D/heldout56_s0.jsonl', 'w').writelines(t.model_dump_json() + '\n' for t in h(c, c.train.eval_tasks))"
log bench-sampled; $V bench --model tiny --model $D/out --tasks $D/heldout56_s0.jsonl --samples 2 --temperature 0.7 --preset tiny \
  --concurrency 16 --out $D/ho_s0 > $D/ho_s0.log 2>&1
log bench-greedy; $V bench --model tiny --model $D/out --suite families --split test --temperature 0 --preset tiny \
  --concurrency 16 --out $D/greedy > $D/greedy.log 2>&1
log done
