#!/bin/bash
cd /work/wt/secagg-epoch-signed
R=/tmp/es_bench3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
(while true; do echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg)"; sleep 20; done) > $R/uptime.txt &
MON=$!
echo "n100 start $(date -u +%H:%M:%S)" > $R/phases.txt
nice .venv/bin/securefed bench secagg-malicious --rounds 50 --clients 100 --length 100000 --out $R/epoch > $R/n100.log 2>&1
echo "n1000 start $(date -u +%H:%M:%S)" >> $R/phases.txt
nice .venv/bin/securefed bench secagg-malicious --rounds 5 --clients 1000 --length 100000 --out $R/epoch_n1000 > $R/n1000.log 2>&1
echo "end $(date -u +%H:%M:%S)" >> $R/phases.txt
kill $MON
echo done > $R/finished
