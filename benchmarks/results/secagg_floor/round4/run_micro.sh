#!/bin/sh
# Old (main at the branch point, `git archive f8f07c6 securefed` into BASE) beside new (this
# worktree), alternated PAIRS times, one process each; `uptime` before each line.
#   sh run_micro.sh BASE WORKTREE OUTDIR PAIRS   (run from outside the worktree's root)
BASE=$1; TREE=$2; OUT=$3; PAIRS=${4:-6}
for i in $(seq "$PAIRS"); do
  for side in old new; do
    if [ "$side" = old ]; then CODE=$BASE; else CODE=$TREE; fi
    echo "{\"uptime\": \"$(uptime)\", \"side\": \"$side\", \"pair\": $i}" >> "$OUT/micro_$side.jsonl"
    nice "$TREE/.venv/bin/python" -P "$TREE/benchmarks/results/secagg_floor/round4/micro_encoding.py" "$CODE" >> "$OUT/micro_$side.jsonl"
  done
done
