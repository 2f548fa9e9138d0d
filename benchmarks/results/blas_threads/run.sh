#!/usr/bin/env bash
# Issue 29, item 3: the whole-run / Surprise SVD fit ratios on ML-100K u1 with and without
# OMP_NUM_THREADS=1, before (--blas-threads 0: the process's own BLAS threads, what every run
# had before the runtime set them) and after (the runtime's default, 1 thread, set with
# threadpoolctl). Usage (repository root): SECUREFED_DATA=/work/shared/data benchmarks/results/blas_threads/run.sh
set -euo pipefail
OUT=benchmarks/results/blas_threads
SF=${SF:-.venv/bin/securefed}
bench() {  # NAME BLAS-THREADS [ENV...]
  local name=$1 threads=$2; shift 2
  uptime > "$OUT/$name.load"
  env "$@" nice $SF bench fedmf-vs-centralised --data ml-100k --splits u1 \
    --variants fedmf,fedrec,fedrec+ --blas-threads "$threads" --name "$name" --out "$OUT" \
    > "$OUT/$name.log" 2>&1
  uptime >> "$OUT/$name.load"
}
bench old_default_threads 0
bench old_omp1 0 OMP_NUM_THREADS=1
bench new_default 1
bench new_omp1 1 OMP_NUM_THREADS=1
# A second pass in the reverse order (the dev box's load drifts: other agents' jobs).
bench new_omp1_rep2 1 OMP_NUM_THREADS=1
bench new_default_rep2 1
bench old_omp1_rep2 0 OMP_NUM_THREADS=1
bench old_default_threads_rep2 0
