"""Honest-but-curious rounds stage by stage against the floor, for the code tree given.

    python -P benchmarks/results/secagg_floor/round6/alternate_stages.py CODE_DIR SIDE PAIR

Run from outside the worktree's root (its securefed would shadow CODE_DIR); the bench code is
this branch's (``securefed.bench.bench_secagg``), so old and new trees are measured alike. In
one process, all CPU seconds (``time.process_time``): the primitives (``primitive_costs``, the
bench's, with the keystream alone and a ring add), Shamir at each round's k and t; then per n in
(100, 1000) at d = 1e5, 0 % dropout, the fastest of ``REPEATS[n]`` rounds, set-up included (none
in this variant), its stages timed in CPU seconds (the stage timer's clock replaced by
``process_time`` in the client and server modules, for both trees alike), beside the bench's
floor, the full floor (HKDF, Shamir, AEAD), that floor plus the server's accumulation, and each
stage's own floor (``floor_by_stage``); last the encoding micro (``encode_input`` over the
rounding draw at d = 1e5, best of 5 batches of 100; on this branch also with the input's
minimum and maximum given, as the round's submit now hands them over). Round five's script
(round four's, its record written through ``securefed.records.dumps_record`` with the load
average, ``os.getloadavg``, at its start and end), with that second micro.
"""

import inspect
import os
import sys
import time
import types

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.bench import bench_secagg as b
from securefed.crypto import prg as prg_mod
from securefed.records import dumps_record
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod

LENGTH = 100_000
REPEATS = {100: 3, 1000: 1}
cpu_clock = types.SimpleNamespace(perf_counter=time.process_time, process_time=time.process_time)
client_mod.time = server_mod.time = cpu_clock  # stage timers in CPU seconds

out = {
    "code": sys.argv[1],
    "side": sys.argv[2],
    "pair": int(sys.argv[3]),
    "module": prg_mod.__file__,
    "length": LENGTH,
    "loadavg_start": list(os.getloadavg()),
}
start = time.process_time()
costs = b.primitive_costs(LENGTH)["cpu"]
out["primitive_cpu_us"] = {k: v * 1e6 for k, v in costs.items()}
for n, repeats in REPEATS.items():
    best = None
    for _ in range(repeats):
        case, rnd = b._measured_round(n, LENGTH, 0.0, seed=0, server="honest_but_curious")
        if best is None or case.cpu_seconds < best[0].cpu_seconds:
            best = (case, rnd)
    case, rnd = best
    full = costs | b.shamir_costs(case.k, case.t)["cpu"]
    ops = b.round_operations(rnd, malicious=False)
    floor = b.floor_seconds(ops, costs, b._MASKING + b._KEYS)
    full_floor = b.floor_seconds(ops, full, b._MASKING + b._KEYS + b._REST)
    accumulation = ops["ring_add"] * costs["ring_add"]
    by_stage = b.floor_by_stage(ops, full, clients=n, k=case.k)
    untimed = case.cpu_seconds - sum(case.stages.values())
    out[f"n{n}"] = {
        "k": case.k,
        "t": case.t,
        "operations": ops,
        "cpu_seconds": case.cpu_seconds,
        "cpu_floor_seconds": floor,
        "cpu_floor_full_seconds": full_floor,
        "cpu_floor_accumulation_seconds": full_floor + accumulation,
        "ratio_to_floor": case.cpu_seconds / floor,
        "ratio_to_full_floor": case.cpu_seconds / full_floor,
        "ratio_to_floor_accumulation": case.cpu_seconds / (full_floor + accumulation),
        "cpu_stages": case.stages,
        "cpu_untimed": untimed,
        "cpu_floor_by_stage": by_stage,
        "stage_over_floor": {
            s: (untimed if s == "untimed" else case.stages[s]) / f
            for s, f in by_stage.items()
            if f > 0
        },
    }
workspace = client_mod.masking_workspace(LENGTH, SecAggConfig().for_round(100))
values = np.random.default_rng(0).uniform(-1, 1, LENGTH)
key = bytes(range(32))


def best_us(fn, calls=100, batches=5):
    fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls)
    return best * 1e6


draw = best_us(lambda: workspace.uniform.draw(key))
encode = best_us(lambda: client_mod.encode_input(values, key, workspace, owner=0))
out["micro_us"] = {"rounding_draw": draw, "encode_input": encode, "encode_over_draw": encode / draw}
if "bounds" in inspect.signature(client_mod.encode_input).parameters:  # this branch's encoder
    bounds = (values.min(), values.max())  # read by the round's submit, outside the stage
    given = best_us(lambda: client_mod.encode_input(values, key, workspace, owner=0, bounds=bounds))
    out["micro_us"] |= {"encode_input_bounds_given": given, "given_over_draw": given / draw}
out["process_cpu_seconds"] = time.process_time() - start
out["loadavg_end"] = list(os.getloadavg())
print(dumps_record(out))
