"""``encode_input`` over the rounding draw (its floor), d = 1e5, for the code tree given.

    python benchmarks/results/secagg_floor/round4/micro_encoding.py CODE_DIR  # one JSON line

Run from outside the worktree's root (its securefed would shadow CODE_DIR). CPU microseconds
(``time.process_time``) a call, the best of 7 batches of 60 calls, after one warm-up call.
``run_micro.sh`` alternates the two trees.
"""

import json
import sys
import time

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as client_mod

LENGTH = 100_000
workspace = client_mod.masking_workspace(LENGTH, SecAggConfig().for_round(100))
values = np.random.default_rng(0).uniform(-1, 1, LENGTH)
key = bytes(range(32))


def best_us(fn, calls=60, batches=7):
    fn()
    best = float("inf")
    for _ in range(batches):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


draw = best_us(lambda: workspace.uniform.draw(key))
encode = best_us(lambda: client_mod.encode_input(values, key, workspace, owner=0))
record = {"code": sys.argv[1], "module": client_mod.__file__}
record |= {"draw_us": draw, "encode_input_us": encode, "ratio": encode / draw}
print(json.dumps(record))
