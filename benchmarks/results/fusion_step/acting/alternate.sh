#!/bin/sh
# Issue 34 (acting): main's packed circuit (old, /work/main first on PYTHONPATH) beside this
# branch's (new), alternately, four pairs; run from the worktree's benchmarks/ folder. The bench
# itself is this branch's in both (securefed.bench maps to benchmarks/), so both rows time the
# acting inquiry after a learning step too; the record names the ckks_packed.py it loaded.
OUT=results/fusion_step/acting
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for i in 1 2 3 4; do
  for t in old new; do
    if [ $t = old ]; then P=/work/main; else P=; fi
    echo "$t$i start $(date -u +%H:%M:%S) $(uptime)" >> $OUT/log.txt
    PYTHONPATH=$P ../.venv/bin/python -P -c "import sys; from securefed.bench.cli import main; sys.argv[0] = 'securefed'; sys.exit(main())" \
      bench fusion-step --repeats 9 --circuits packed --out $OUT/${t}_$i > $OUT/${t}_$i.log 2>&1
    echo "$t$i end $(date -u +%H:%M:%S) $(uptime)" >> $OUT/log.txt
  done
done
