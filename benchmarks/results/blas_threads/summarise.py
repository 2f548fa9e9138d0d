"""blas_threads.md from the records of run.sh (repository root:
.venv/bin/python -P benchmarks/results/blas_threads/summarise.py)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
RUNS = [
    ("old_default_threads", "before: process's threads (OpenBLAS default)"),
    ("old_omp1", "before, `OMP_NUM_THREADS=1`"),
    ("new_default", "after: runtime's default (1, threadpoolctl)"),
    ("new_omp1", "after, `OMP_NUM_THREADS=1`"),
]
VARIANTS = ("fedmf", "fedrec", "fedrec+")


def main() -> None:
    lines = [
        "| pass | setting | `--blas-threads` | OMP_NUM_THREADS | BLAS threads in the runs "
        "(threadpoolctl) | load (1 min, before/after) | SVD fit s | FedMF s (ratio) | "
        "FedRec s (ratio) | FedRec+ s (ratio) |",
        "|" + "---|" * 10,
    ]
    for suffix, label in (("", "1"), ("_rep2", "2")):
        for name, setting in RUNS:
            path = HERE / f"{name}{suffix}.json"
            if not path.exists():
                continue
            record = json.loads(path.read_text())
            row, threads = record["rows"][0], record["threads"]
            counts = sorted({info["num_threads"] for info in threads["blas_in_runs"]})
            load = [
                line.split("load average:")[1].split(",")[0].strip()
                for line in (HERE / f"{name}{suffix}.load").read_text().splitlines()
            ]
            cells = [f"{row[f'{v}_seconds']:.2f} ({row[f'{v}_time_ratio']:.1f}x)" for v in VARIANTS]
            lines.append(
                f"| {label} | {setting} | {threads['blas_threads_option'] or 0} | "
                f"{threads['OMP_NUM_THREADS'] or 'unset'} | {', '.join(map(str, counts))} | "
                f"{' / '.join(load)} | {row['svd_seconds']:.2f} | " + " | ".join(cells) + " |"
            )
    table = "\n".join(lines)
    (HERE / "blas_threads.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
