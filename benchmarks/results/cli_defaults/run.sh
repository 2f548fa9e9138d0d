#!/usr/bin/env bash
# The item-2 table of issue 29 (README.md here): every figure is one `securefed fedmf` run.
# Usage (repository root): SECUREFED_DATA=/work/shared/data benchmarks/results/cli_defaults/run.sh
# Writes the run-time data (never committed) under $TMP_DATA and one JSON record per run here.
set -euo pipefail
OUT=benchmarks/results/cli_defaults/records
TMP_DATA=${TMP_DATA:-/tmp/securefed_cli_defaults}
SF=${SF:-.venv/bin/securefed}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
$PY -P benchmarks/results/cli_defaults/make_files.py "$SECUREFED_DATA/ml-100k" "$TMP_DATA"
run() {  # NAME DATA-OPTIONS...
  local name=$1; shift
  local common=(--seed 0 --no-progress)
  nice $SF fedmf "$@" "${common[@]}" --preset paper --json "$OUT/$name.paper.json" > /dev/null
  nice $SF fedmf "$@" "${common[@]}" --json "$OUT/$name.defaults.json" > /dev/null
  nice $SF fedmf "$@" "${common[@]}" --validation 0.1 --json "$OUT/$name.validation.json" > /dev/null
  # The old rule: 4 evaluations of every 5 rounds without improvement, at most the preset's 35.
  nice $SF fedmf "$@" "${common[@]}" --validation 0.1 --rounds 35 --validate-every 5 \
    --patience 20 --min-rounds 1 --smoothing 1 --json "$OUT/$name.validation_old.json" > /dev/null
  echo "$name done" >&2
}
for k in 1 2 3 4 5; do run "ml-100k_u$k" --data ml-100k --split "u$k"; done
run ml-latest-small --data ml-latest-small
for k in 1 2 3 4 5; do
  run "ml-100k-x2_u$k" --data "$TMP_DATA/ml-100k-x2" --split "u$k" --scale 2:10:2
done
run halfstar --data "$TMP_DATA/halfstar/ratings.csv" --scale 0.5:4:0.5
