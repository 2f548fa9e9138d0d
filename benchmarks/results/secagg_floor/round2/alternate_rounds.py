"""Honest-but-curious rounds against their CPU floor, for the code tree given (old beside new).

    python benchmarks/results/secagg_floor/round2/alternate_rounds.py CODE_DIR  # one JSON line

Run from outside the worktree's root (its securefed would shadow CODE_DIR); the bench code is
this branch's (``securefed.bench.bench_secagg``: the same measurement for both trees). In one
process: the primitives' CPU costs (``primitive_costs``), then per n in (100, 1000) at d = 1e5,
0 % dropout, the fastest of ``REPEATS[n]`` rounds in CPU seconds, set-up included (none in this
variant), beside the CPU floor of the bench (masks, rounding draws, X25519 agreements and key
generations) and the encoding stage beside its floor (the rounding draws; both wall-clock, as
the bench's stage timer is).
"""

import json
import sys
import time

sys.path.insert(0, sys.argv[1])

from securefed.bench.bench_secagg import (
    _KEYS,
    _MASKING,
    _measured_round,
    floor_seconds,
    primitive_costs,
    round_operations,
)
from securefed.crypto import prg as prg_mod

LENGTH = 100_000
REPEATS = {100: 3, 1000: 1}
out = {"code": sys.argv[1], "module": prg_mod.__file__, "length": LENGTH}
start = time.process_time()
costs = primitive_costs(LENGTH)
out["primitive_cpu_us"] = {k: v * 1e6 for k, v in costs["cpu"].items()}
for n, repeats in REPEATS.items():
    best = None
    for _ in range(repeats):
        case, rnd = _measured_round(n, LENGTH, 0.0, seed=0, server="honest_but_curious")
        if best is None or case.cpu_seconds < best[0].cpu_seconds:
            best = (case, rnd)
    case, rnd = best
    ops = round_operations(rnd, malicious=False)
    floor = floor_seconds(ops, costs["cpu"], _MASKING + _KEYS)
    encoding_floor = ops["rounding_draw"] * costs["rounding_draw"]  # wall, as the stage is
    out[f"n{n}"] = {
        "k": case.k,
        "cpu_seconds": case.cpu_seconds,
        "cpu_floor_seconds": floor,
        "ratio_to_floor": case.cpu_seconds / floor,
        "encoding_stage_seconds": case.stages["encoding"],
        "encoding_floor_seconds": encoding_floor,
        "encoding_over_floor": case.stages["encoding"] / encoding_floor,
        "stages": case.stages,
    }
out["process_cpu_seconds"] = time.process_time() - start
print(json.dumps(out))
