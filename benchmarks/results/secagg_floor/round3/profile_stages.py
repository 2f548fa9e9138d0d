"""One honest-but-curious round's stages in CPU seconds against each stage's floor (item 1).

    python benchmarks/results/secagg_floor/round3/profile_stages.py CODE_DIR N DROPOUT

Run from outside the worktree's root (its securefed would shadow CODE_DIR). The stage timers'
clock is replaced by ``process_time`` in the client and server modules; each stage's floor is
its operations (``round_operations``) times the primitives' CPU costs measured first in the same
process, plus the keystream alone (``keystream_only``) and one ring add (``ring_add``, the
server's accumulation of an upload). ``profile_main_n1000.json`` is its output on main's code
(the script then read the bench from the worktree's ``benchmarks/`` folder; the same code).
"""

import json
import sys
import time
import types

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.bench import bench_secagg as b
from securefed.crypto import prg as prg_mod
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod

cpu_clock = types.SimpleNamespace(perf_counter=time.process_time, process_time=time.process_time)
client_mod.time = server_mod.time = cpu_clock
n, drop, length = int(sys.argv[2]), float(sys.argv[3]), 100_000
costs = b.primitive_costs(length)["cpu"]
acc, ones = np.zeros(length, np.uint32), np.ones(length, np.uint32)


def per_call(fn, repeats):
    fn()
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats


expander = prg_mod.MaskExpander(length)
costs["keystream_only"] = per_call(
    lambda: expander.mask(bytes(32), domain=prg_mod.DOMAIN_PAIR_MASK), 200
)
costs["ring_add"] = per_call(lambda: np.add(acc, ones, out=acc), 500)
case, rnd = b._measured_round(n, length, drop, seed=0, server="honest_but_curious")
ops = b.round_operations(rnd, malicious=False)
full = costs | b.shamir_costs(case.k, case.t)["cpu"]
stages, contributors, k = case.stages, ops["rounding_draw"], case.k
client_masks = contributors * (1 + k)
client_x = len(rnd.clients) * k + contributors * k
agreement = full["x25519"] + full["hkdf"]
floors = {
    "encoding": contributors * full["rounding_draw"],
    "mask_expansion": client_masks * full["mask_expansion"],
    "key_agreement": client_x * agreement + 2 * len(rnd.clients) * full["x25519_keygen"],
    "sharing": ops["shamir_split"] * full["shamir_split"] + ops["aead_seal"] * full["aead_seal"],
    "unmasking": (ops["mask_expansion"] - client_masks) * full["mask_expansion"]
    + (ops["x25519"] - client_x) * agreement
    + ops["aead_open"] * full["aead_open"]
    + ops["shamir_reconstruct"] * full["shamir_reconstruct"]
    + (ops["x25519_keygen"] - 2 * len(rnd.clients)) * full["x25519_keygen"],
}
out = {
    "n": n,
    "dropout": drop,
    "k": k,
    "cpu": case.cpu_seconds,
    "stages": stages,
    "floor_by_stage": floors,
    "outside_stages": case.cpu_seconds - sum(stages.values()),
    "cpu_floor": b.floor_seconds(ops, costs, b._MASKING + b._KEYS),
    "cpu_floor_full": b.floor_seconds(ops, full, b._MASKING + b._KEYS + b._REST),
    "accumulation_floor": contributors * costs["ring_add"],
    "costs_us": {name: v * 1e6 for name, v in full.items() if isinstance(v, float)},
}
out["ratio"] = out["cpu"] / out["cpu_floor"]
out["ratio_full"] = out["cpu"] / out["cpu_floor_full"]
out["stage_over_floor"] = {s: stages[s] / f for s, f in floors.items()}
print(json.dumps(out, indent=1))
