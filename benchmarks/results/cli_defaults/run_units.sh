#!/usr/bin/env bash
# Old beside new for the scale: the biased preset without rating_unit="scale" (--rating-unit one,
# the preset before issue 29) on the files whose scale is not 1..5. Run after run.sh.
set -euo pipefail
OUT=benchmarks/results/cli_defaults/records
TMP_DATA=${TMP_DATA:-/tmp/securefed_cli_defaults}
SF=${SF:-.venv/bin/securefed}
one() {  # NAME DATA-OPTIONS...
  local name=$1; shift
  nice $SF fedmf "$@" --seed 0 --no-progress --rating-unit one --json "$OUT/$name.unit_one.json" \
    > /dev/null
}
one ml-latest-small --data ml-latest-small
for k in 1 2 3 4 5; do
  one "ml-100k-x2_u$k" --data "$TMP_DATA/ml-100k-x2" --split "u$k" --scale 2:10:2
done
one halfstar --data "$TMP_DATA/halfstar/ratings.csv" --scale 0.5:4:0.5
