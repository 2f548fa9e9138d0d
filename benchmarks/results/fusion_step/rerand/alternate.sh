# Old beside new, alternating in one script: the tree before the fix (/work/main, on PYTHONPATH)
# and this tree (ckks-rerand), securefed bench fusion-step on both circuits; uptime before each.
# Run from the ckks-rerand worktree root: sh benchmarks/results/fusion_step/rerand/alternate.sh
OUT=benchmarks/results/fusion_step/rerand
for i in 1 2 3; do
 for t in new old; do
  if [ $t = new ]; then P=$(pwd); else P=/work/main; fi
  echo "$t$i start $(uptime)" >> $OUT/log.txt
  PYTHONPATH=$P .venv/bin/python -P -c "import sys, securefed.fusion.ckks_module as m; print(m.__file__, file=sys.stderr); from securefed.bench.cli import main; sys.argv[0]=\"securefed\"; sys.exit(main())" bench fusion-step --repeats 5 --circuits monomials,packed --out /tmp/rerand/$t$i > /tmp/rerand/$t$i.log 2>&1
  echo "$t$i done $(uptime)" >> $OUT/log.txt
 done
done
