"""Old (main's venv) beside new (this branch's) start-up, in one session, runs interleaved.

python benchmarks/results/startup/compare.py OLD_SECUREFED NEW_SECUREFED --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from securefed.bench.bench_startup import ACCOUNTING, HELP_SCREENS, time_command

parser = argparse.ArgumentParser()
parser.add_argument("old")
parser.add_argument("new")
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()
rows = {}
load_before = os.getloadavg()
for screen in [*HELP_SCREENS, ACCOUNTING]:
    name = "securefed " + " ".join(screen)
    runs = {"old": [], "new": []}
    for _ in range(args.repeats):  # interleaved: both see the same load
        for which in ("old", "new"):
            runs[which] += time_command([getattr(args, which), *screen], 1)
    rows[name] = {k: {"seconds": v, "median": statistics.median(v)} for k, v in runs.items()}
record = {"repeats": args.repeats, "load_before": load_before, "load_after": os.getloadavg(),
          "cpus": os.cpu_count(), "rows": rows}  # fmt: skip
Path(__file__).with_name("compare.json").write_text(json.dumps(record, indent=1))
for name, row in rows.items():
    print(f"{name:<90} old {row['old']['median']:6.2f} s   new {row['new']['median']:6.2f} s")
print("load before", load_before, "after", record["load_after"])
