"""cProfile (CPU clock) of one honest-but-curious round, n x 1e5, for the code tree given.

    python -P benchmarks/results/secagg_floor/round6/profile_round.py CODE_DIR N OUT.prof

Run from outside the worktree's root (its securefed would shadow CODE_DIR). The stage timers'
clock is ``process_time`` (client and server modules); prints the stages and the top functions by
own time and by cumulative time.
"""

import cProfile
import pstats
import sys
import time
import types

sys.path.insert(0, sys.argv[1])

from securefed.bench import bench_secagg as b
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod

cpu_clock = types.SimpleNamespace(perf_counter=time.process_time, process_time=time.process_time)
client_mod.time = server_mod.time = cpu_clock
n = int(sys.argv[2])
b._measured_round(10, 1000, 0.0, seed=0, server="honest_but_curious")  # warm the imports
profiler = cProfile.Profile(time.process_time)
profiler.enable()
case, rnd = b._measured_round(n, 100_000, 0.0, seed=0, server="honest_but_curious")
profiler.disable()
profiler.dump_stats(sys.argv[3])
print(
    "cpu",
    case.cpu_seconds,
    "stages",
    case.stages,
    "untimed",
    case.cpu_seconds - sum(case.stages.values()),
)
stats = pstats.Stats(profiler)
stats.sort_stats("tottime").print_stats(35)
stats.sort_stats("cumulative").print_stats(45)
