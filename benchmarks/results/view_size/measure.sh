#!/bin/bash
# usage: measure.sh LABEL DATA TRANSPORT [extra args]
set -u
label=$1; data=$2; transport=$3; shift 3
bin=${SECUREFED_BIN:-/work/wt/h-views/.venv/bin/securefed}
out=/tmp/hv/$label
rm -rf $out; mkdir -p $out
cd $out
nice /usr/bin/time -v $bin fedmf --data $data --variant fedrec+ --transport $transport --rounds 3 --seed 0 \
  --json run.json --save-view view/ --view-rounds last:2 --no-progress "$@" > out.txt 2> err.txt
echo "rc=$?" > rc.txt
grep -E "Maximum resident|Elapsed" err.txt > time.txt
du -b view/* > du.txt
