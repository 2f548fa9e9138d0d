"""``encode_input`` with the caches evicted between calls, as between two clients of a round.

    python benchmarks/results/secagg_floor/round4/micro_cold.py CODE_DIR  # one line

Run from outside the worktree's root. 200 calls over 16 distinct vectors at d = 1e5, CPU us a
call (mean) and the minor page faults, hot (back to back) and cold (a 32 MB pass between calls,
like the masks' keystreams between two clients).
"""

import resource
import sys
import time

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as client_mod

LENGTH = 100_000
workspace = client_mod.masking_workspace(LENGTH, SecAggConfig().for_round(100))
pool = np.random.default_rng(0).uniform(-1, 1, (16, LENGTH))
junk = np.empty(4_000_000)


def run(cold: bool) -> tuple[float, int]:
    total, faults = 0.0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(200):
        if cold:
            np.add(junk, 1.0, out=junk)
        start = time.process_time()
        ring, _ = client_mod.encode_input(pool[i % 16], i.to_bytes(32, "big"), workspace, owner=0)
        total += time.process_time() - start
        del ring
    return total / 200 * 1e6, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


print(sys.argv[1], "hot (us, faults)", run(False), "cold (us, faults)", run(True))
