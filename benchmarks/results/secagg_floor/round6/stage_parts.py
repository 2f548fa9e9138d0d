"""CPU seconds inside the round's methods, one honest-but-curious n x 1e5 round (the untimed parts).

    python -P benchmarks/results/secagg_floor/round6/stage_parts.py CODE_DIR N

Run from outside the worktree's root (its securefed would shadow CODE_DIR). Each listed method
of the server, the client and the generic submit path is wrapped with a ``process_time``
accumulator (the wrappers add about 1-2 us a call); the stage timers run on the CPU clock too.
Prints the round's CPU seconds, its stages and its untimed rest, then each method's CPU seconds
and calls (nested: a method's time includes its callees'). The submits of the bench's plaintext
round (after the secure round) are counted too: half the ``submit`` and ``RowUpdates`` calls.
"""

import collections
import functools
import sys
import time
import types

sys.path.insert(0, sys.argv[1])
from securefed.bench import bench_secagg as b
from securefed.crypto import keys as kx
from securefed.transport import base
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod

cpu = types.SimpleNamespace(perf_counter=time.process_time, process_time=time.process_time)
client_mod.time = server_mod.time = cpu
acc = collections.Counter()
calls = collections.Counter()


def wrap(owner, name, label=None):
    f = getattr(owner, name)
    label = label or f"{owner.__name__}.{name}"

    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - t0
            calls[label] += 1

    setattr(owner, name, g)


S, C = server_mod.SecAggRound, client_mod.SecAggClient
for n in [
    "__init__",
    "receive_keys",
    "share_request",
    "receive_shares",
    "mask_request",
    "_add_masked",
    "_accept",
    "_finish",
    "_unmask",
    "_advertise_keys",
    "_share_keys",
    "unmask_requests",
    "_gather",
    "_rebuild_secrets",
    "submit",  # this branch's own submit (main's is AggregationRound.submit, wrapped below)
    "_mask_client",
]:
    if n in vars(S):
        wrap(S, n)
for n in ["__init__", "advertise", "share", "mask", "reveal", "_add_masks"]:
    wrap(C, n)
wrap(base.RowUpdates, "__init__")
wrap(base.AggregationRound, "submit")
wrap(base.AggregationRound, "submit_batch")
wrap(kx, "check_public_key")
wrap(client_mod, "encode_input")
server_mod.kx = kx
n = int(sys.argv[2])
b._measured_round(10, 1000, 0.0, seed=0, server="honest_but_curious")
acc.clear()
calls.clear()
case, rnd = b._measured_round(n, 100_000, 0.0, seed=0, server="honest_but_curious")
print(
    "cpu",
    round(case.cpu_seconds, 3),
    {k: round(v, 3) for k, v in case.stages.items() if v},
    "untimed",
    round(case.cpu_seconds - sum(case.stages.values()), 3),
)
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"{v:8.3f} {calls[k]:6d} {k}")
