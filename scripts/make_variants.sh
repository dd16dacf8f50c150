#!/usr/bin/env bash
# Renamed, cut-short variants of expert episodes (`vivace sft augment --theme-names`), one process
# per core: each base file is split in 8 shards, and each shard is cut every way whose count is
# above 0. Writes OUT_DIR/var_<cut>_shard_*.jsonl; job i is seeded SEED + i.
#
#   FF=3 FE=3 scripts/make_variants.sh OUT_DIR SEED train_a.jsonl train_b.jsonl
#
# Variants per episode of each cut: FF first_file, FE first_edit, WH whole, LM whole with every
# token after the system turn trained (--train-context), RT retry, RE retry_edit. LETTERS (a share,
# e.g. 0.7) makes that share of the invented names random letters (sft augment --letters-share).
set -euo pipefail
V=${VIVACE:-.venv/bin/vivace}
A=$1 SEED=$2
shift 2
JOBS=${JOBS:-$(nproc)}
mkdir -p "$A"
rm -f "$A"/shard_* "$A"/var_*_shard_*.jsonl  # not var_pieces_*: copies may be written beside
n=0
for f in "$@"; do
  split -n l/8 -d "$f" "$A/shard_${n}_"
  n=$((n + 1))
done
jobs=()
for s in "$A"/shard_*; do
  k=$(basename "$s")
  for cut in ff:first_file:${FF:-0} fe:first_edit:${FE:-0} wh:whole:${WH:-0} lm:whole:${LM:-0} rt:retry:${RT:-0} \
    re:retry_edit:${RE:-0}; do
    IFS=: read -r tag name count <<< "$cut"
    [ "$count" -gt 0 ] || continue
    extra=""
    [ "$tag" = lm ] && extra=" --train-context"
    [ -n "${LETTERS:-}" ] && extra="$extra --letters-share $LETTERS"
    jobs+=("--cut $name --theme-names$extra --variants $count --data $s --out $A/var_${tag}_$k.jsonl")
  done
done
i=0
for j in "${jobs[@]}"; do
  echo "$j --seed $((SEED + i))"
  i=$((i + 1))
done | xargs -P "$JOBS" -I{} sh -c "$V sft augment {} --json >/dev/null 2>&1 || echo 'failed: {}' >&2"
