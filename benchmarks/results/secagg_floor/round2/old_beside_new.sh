#!/bin/sh
# Old beside new, one after the other, twice: `securefed bench secagg-malicious` (this branch's
# bench code) with the library of the branch's base (BASE, `git archive e6391f3 securefed`) and
# with this branch's library. Run from any directory but the worktree's root (its securefed
# would shadow BASE on sys.path).
#   sh old_beside_new.sh BASE WORKTREE OUTDIR [SAMPLE...]   (samples named 1 2 by default)
BASE=$1; TREE=$2; OUT=$3; shift 3
SAMPLES=${*:-1 2}
for sample in $SAMPLES; do
  for side in old new; do
    uptime > "$OUT/uptime_${side}_${sample}_before.txt"
    if [ "$side" = old ]; then
      PYTHONPATH="$BASE" nice "$TREE/.venv/bin/python" -m securefed.bench.cli bench secagg-malicious --out "$OUT/${side}_${sample}" 2> "$OUT/${side}_${sample}.log"
    else
      PYTHONPATH="$TREE" nice "$TREE/.venv/bin/python" -m securefed.bench.cli bench secagg-malicious --out "$OUT/${side}_${sample}" 2> "$OUT/${side}_${sample}.log"
    fi
    uptime > "$OUT/uptime_${side}_${sample}_after.txt"
  done
done
