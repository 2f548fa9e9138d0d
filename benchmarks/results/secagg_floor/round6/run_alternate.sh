#!/bin/sh
# Old (main at the branch point, `git archive 1b73f13 securefed` into BASE) beside new (this
# branch's commit, `git archive HEAD securefed` into NEW: the worktree may move on meanwhile),
# alternated PAIRS times, one process each (each record carries its load averages); `uptime`
# before each process in OUTDIR/alternate.log. Both run WORKTREE's venv and bench code.
#   sh run_alternate.sh BASE NEW WORKTREE OUTDIR PAIRS [FIRST]   (run from outside the worktree's
#   root; FIRST numbers the first pair, default 1)
BASE=$1; NEW=$2; TREE=$3; OUT=$4; PAIRS=${5:-3}; FIRST=${6:-1}
HERE=$TREE/benchmarks/results/secagg_floor/round6
for i in $(seq "$FIRST" $((FIRST + PAIRS - 1))); do
  for side in old new; do
    if [ "$side" = old ]; then CODE=$BASE; else CODE=$NEW; fi
    echo "$side $i $(uptime)" >> "$OUT/alternate.log"
    nice "$TREE/.venv/bin/python" -P "$HERE/alternate_stages.py" "$CODE" "$side" "$i" >> "$OUT/alternate_$side.jsonl" 2>> "$OUT/alternate.log"
  done
done
echo "end $(uptime)" >> "$OUT/alternate.log"
