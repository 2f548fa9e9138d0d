"""One honest-but-curious round at n = 1000 x 1e5, 10 % dropout: its CPU seconds and (wall) stages.

    python benchmarks/results/secagg_floor/round3/check_dropout.py CODE_DIR

Run alternately for main's tree and this branch's (``check_dropout.txt``: ``uptime``, then the
line of each run; the stage figures are wall seconds, the load's).
"""

import sys

sys.path.insert(0, sys.argv[1])
from securefed.bench import bench_secagg as b

case, rnd = b._measured_round(1000, 100_000, 0.1, seed=0, server="honest_but_curious")
print(
    sys.argv[1][-6:],
    round(case.cpu_seconds, 3),
    {k: round(v, 2) for k, v in case.stages.items() if v},
)
