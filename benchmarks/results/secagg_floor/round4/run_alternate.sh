#!/bin/sh
# Old (main at the branch point, `git archive f8f07c6 securefed` into BASE) beside new (this
# worktree), alternated PAIRS times, one process each; `uptime` before each line.
#   sh run_alternate.sh BASE WORKTREE OUTDIR PAIRS   (run from outside the worktree's root)
BASE=$1; TREE=$2; OUT=$3; PAIRS=${4:-3}
HERE=$TREE/benchmarks/results/secagg_floor/round4
for i in $(seq "$PAIRS"); do
  for side in old new; do
    if [ "$side" = old ]; then CODE=$BASE; else CODE=$TREE; fi
    echo "{\"uptime\": \"$(uptime)\", \"side\": \"$side\", \"pair\": $i}" >> "$OUT/alternate_$side.jsonl"
    nice "$TREE/.venv/bin/python" -P "$HERE/alternate_stages.py" "$CODE" >> "$OUT/alternate_$side.jsonl" 2>> "$OUT/alternate.log"
  done
done
echo "{\"uptime\": \"$(uptime)\", \"side\": \"end\"}" >> "$OUT/alternate_new.jsonl"
