cd /work/main
for i in 1 2 3; do
 for t in new old; do
  if [ $t = new ]; then P=/work/main; else P=/tmp/norelin; fi
  uptime >> /tmp/relin/log.txt
  PYTHONPATH=$P .venv/bin/python -P -c "import sys, securefed.fusion.ckks_packed as m; print(m.__file__, file=sys.stderr); from securefed.bench.cli import main; sys.argv[0]=\"securefed\"; sys.exit(main())" bench fusion-step --repeats 5 --circuits packed --out /tmp/relin/$t$i > /tmp/relin/$t$i.log 2>&1
  echo "$t$i done" >> /tmp/relin/log.txt
 done
done
