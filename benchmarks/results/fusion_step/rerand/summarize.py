"""Summarize alternate.sh's runs (old beside new) into summary.json (dumps_record) and a table.

Run from the repository root after alternate.sh:
    .venv/bin/python benchmarks/results/fusion_step/rerand/summarize.py /tmp/rerand
"""

import json
import statistics
import sys
from pathlib import Path

from securefed.records import dumps_record

here = Path(__file__).parent
source = Path(sys.argv[1])
name = "step_N10_n3_h16_monomials_packed.json"
rows, runs = [], {}
for run in sorted(p for p in source.iterdir() if (p / name).exists()):
    record = json.loads((run / name).read_text())
    (here / f"{run.name}.json").write_text((run / name).read_text())
    cells = {"run": run.name, "command": record["command"], "load": record["load_average"]}
    for fusion, value in record["records"].items():
        step = value["learning_step"]
        cells[fusion] = {"cpu_s": step["cpu_s"], "stages_s": step.get("stages_s")}
    cells["ratios_cpu"] = record["ratios_cpu"]
    runs[run.name] = cells
summary = {"runs": runs}
for fusion in ("ckks monomials", "ckks packed", "plaintext"):
    for tree in ("new", "old"):
        values = [r[fusion]["cpu_s"] for k, r in runs.items() if k.startswith(tree)]
        if values:
            summary[f"{tree} {fusion} median cpu_s"] = statistics.median(values)
for fusion in ("ckks monomials", "ckks packed"):
    new, old = summary.get(f"new {fusion} median cpu_s"), summary.get(f"old {fusion} median cpu_s")
    if new and old:
        summary[f"{fusion} new / old"] = new / old
(here / "summary.json").write_text(dumps_record(summary, indent=2) + "\n")
print(
    "| run | monomials step CPU s | packed step CPU s | plaintext step CPU s | ratios (CPU) "
    "| load start / end |"
)
print("|---|---|---|---|---|---|")
for k, r in runs.items():
    ratios = ", ".join(f"{f.split()[-1]} {v:.1f}x" for f, v in r["ratios_cpu"].items())
    load = f"{r['load']['start'][0]:.1f} / {r['load']['end'][0]:.1f}"
    print(
        f"| {k} | {r['ckks monomials']['cpu_s']:.3f} | {r['ckks packed']['cpu_s']:.4f} | "
        f"{r['plaintext']['cpu_s']:.4f} | {ratios} | {load} |"
    )
print({k: v for k, v in summary.items() if k != "runs"})
