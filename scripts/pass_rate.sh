#!/usr/bin/env bash
# The warm start's pass rate on every training task, sampled as RL samples (docs/benchmarks.md,
# "pass-rate filter"): one `vivace bench` per shard in .shards/shard*.jsonl, all at once, on the
# CPU cores (2 threads each) and, where torch sees one, the GPU for shard 0. Results and the
# trajectories land in $OUT_DIR (results.jsonl, and traj_sN.tgz per shard).
#
#   SAMPLES=4 LIMIT_S=450 OUT_DIR=runs/pass_rate scripts/pass_rate.sh
#
# Without .shards/, it first splits the learnable families' training tasks into SHARDS files
# (round-robin, so each shard holds every family). Then `vivace tasks select --results
# $OUT_DIR/results.jsonl` (run at the end) keeps the tasks solved sometimes in $OUT_DIR/pool.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT_DIR=${OUT_DIR:-runs/pass_rate}
SAMPLES=${SAMPLES:-4}
LIMIT_S=${LIMIT_S:-450}
MODEL=${MODEL:-tiny}
W=${WORK_DIR:-/tmp/pass_rate}
rm -rf "$W"  # `vivace bench` appends to an existing results.jsonl: start clean
mkdir -p "$OUT_DIR" "$W"
if ! ls .shards/shard*.jsonl >/dev/null 2>&1; then
  mkdir -p .shards
  $PY - "${SHARDS:-7}" <<'PY'
import sys
from vivace.config import load_preset
from vivace.tasks.format import save_jsonl
from vivace.tasks.suites import load_suite
families = set(load_preset("tiny").train.families)
tasks = [t for t in load_suite("families", "train") if t.family in families]
n = int(sys.argv[1])
for i in range(n):
    save_jsonl(tasks[i::n], f".shards/shard{i}.jsonl")
print(f"{len(tasks)} tasks in {n} shards")
PY
fi
VIVACE=("$PY" -c "from vivace.cli import main; main()")  # the CLI from this interpreter (PYTHONPATH=src works)
gpu=$($PY -c 'import torch; print(int(torch.cuda.is_available()))')
i=0
for s in .shards/shard*.jsonl; do
  if { [ "$i" = 0 ] || [ -n "${ALL_GPU:-}" ]; } && [ "$gpu" = 1 ]; then env_vars=(); conc=16; else env_vars=(CUDA_VISIBLE_DEVICES=); conc=8; fi
  env "${env_vars[@]}" OMP_NUM_THREADS=2 timeout "$LIMIT_S" "${VIVACE[@]}" bench --model "$MODEL" --tasks "$s" \
    --samples "$SAMPLES" --preset tiny --temperature 0.7 --concurrency $conc --backend plain \
    ${N:+--n "$N"} --out "$W/s$i" >"$W/s$i.log" 2>&1 &
  i=$((i + 1))
done
wait
for d in "$W"/s*/; do echo "$d $(wc -l <"$d/results.jsonl") episodes"; done
cat "$W"/s*/results.jsonl >"$OUT_DIR/results.jsonl"
for d in "$W"/s*/; do s=$(basename "$d"); tar czf "$OUT_DIR/traj_$s.tgz" -C "$W" "$s/trajectories"; done
# Per family, the tasks solved sometimes; they go to $OUT_DIR/pool.jsonl (a train.suite).
"${VIVACE[@]}" tasks select --results "$OUT_DIR/results.jsonl" --out "$OUT_DIR/pool.jsonl" --model "$MODEL"
