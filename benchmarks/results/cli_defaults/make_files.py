"""Write the run-time data sets of benchmarks/results/cli_defaults (never committed).

- ML-100K x2: every rating of u1..u5 (.base/.test) and u.data doubled (scale 2..10 step 2);
- half-star: ml-latest-small with its 0.5..5 half stars mapped onto 0.5..4 half stars
  (level k of 0..9 to round(7 k / 9) of 0..7), a new file with another scale and mean.
"""

import sys
from pathlib import Path

from securefed.recsys.data import embedded_default_path

src100k, out = Path(sys.argv[1]), Path(sys.argv[2])
x2 = out / "ml-100k-x2"
x2.mkdir(parents=True, exist_ok=True)
for name in ["u.data"] + [f"u{k}.{p}" for k in range(1, 6) for p in ("base", "test")]:
    lines = []
    for line in (src100k / name).read_text().splitlines():
        u, i, r, t = line.split("\t")
        lines.append(f"{u}\t{i}\t{2 * int(r)}\t{t}")
    (x2 / name).write_text("\n".join(lines) + "\n")
small = embedded_default_path()
rows = small.read_text().splitlines()
header, body = rows[0], rows[1:]
(out / "halfstar").mkdir(exist_ok=True)
mapped = [header]
for line in body:
    u, i, r, t = line.split(",")
    level = round((float(r) - 0.5) / 0.5)
    mapped.append(f"{u},{i},{0.5 + 0.5 * round(7 * level / 9)},{t}")
(out / "halfstar" / "ratings.csv").write_text("\n".join(mapped) + "\n")
