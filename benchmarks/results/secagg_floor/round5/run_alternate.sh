#!/bin/sh
# Old (main at the branch point, `git archive 67ffd57 securefed` into BASE) beside new (this
# worktree), alternated PAIRS times, one process each (each record carries its load averages);
# `uptime` before each process in OUTDIR/alternate.log.
#   sh run_alternate.sh BASE WORKTREE OUTDIR PAIRS [FIRST]   (run from outside the worktree's root;
#   FIRST numbers the first pair, default 1)
BASE=$1; TREE=$2; OUT=$3; PAIRS=${4:-3}; FIRST=${5:-1}
HERE=$TREE/benchmarks/results/secagg_floor/round5
for i in $(seq "$FIRST" $((FIRST + PAIRS - 1))); do
  for side in old new; do
    if [ "$side" = old ]; then CODE=$BASE; else CODE=$TREE; fi
    echo "$side $i $(uptime)" >> "$OUT/alternate.log"
    nice "$TREE/.venv/bin/python" -P "$HERE/alternate_stages.py" "$CODE" "$side" "$i" >> "$OUT/alternate_$side.jsonl" 2>> "$OUT/alternate.log"
  done
done
echo "end $(uptime)" >> "$OUT/alternate.log"
