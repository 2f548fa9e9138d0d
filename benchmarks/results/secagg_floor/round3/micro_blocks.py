"""encode_input at d = 1e5 against the encoding block size (CPU us a call, best of 5 batches).

python benchmarks/results/secagg_floor/round3/micro_blocks.py REPS BLOCK [BLOCK...]
"""

import sys
import time

import numpy as np

from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as cm

L = 100_000
ws = cm.masking_workspace(L, SecAggConfig().for_round(100))
values = np.random.default_rng(0).uniform(-1, 1, L)
key = bytes(range(32))


def best(fn, calls=60, batches=5):
    fn()
    b = 1e9
    for _ in range(batches):
        t = time.process_time()
        for _ in range(calls):
            fn()
        b = min(b, (time.process_time() - t) / calls)
    return b * 1e6


res = {}
for _rep in range(int(sys.argv[1])):
    for blk in [int(b) for b in sys.argv[2:]]:
        cm.ENCODING_BLOCK = blk
        res.setdefault(blk, []).append(best(lambda: cm.encode_input(values, key, ws, owner=0)))
    res.setdefault("draw", []).append(best(lambda: ws.uniform.draw(key)))
for k, v in res.items():
    print(k, [round(x) for x in v])
