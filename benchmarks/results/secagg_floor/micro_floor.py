"""Micro-measurements of issue 32's floor items, for the code tree given (old beside new).

    python benchmarks/results/secagg_floor/micro_floor.py CODE_DIR   # prints one JSON line

CPU seconds (``time.process_time``), best of 3:
* a round's ConsistencyCheck messages at n = 1000 (62 a helper, 62,000 calls) with (a) every
  helper holding the server's frozenset (the simulation), (b) every helper its own equal copy
  (a client in its own process, or restored from ``export_secrets``), (c) 40 sets in turn;
* one client's encoding at d = 1e5 (uniform draw, ``Encoder.encode``, ``encode_input``), one
  mask expansion added into a vector, one AES-256-CTR ``Cipher`` context construction.
"""

import itertools
import json
import sys
import time

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.crypto import prg as prg_mod
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import signatures as sg
from securefed.transport.secagg.client import encode_input, masking_workspace


def best_cpu(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def per_call_us(fn, calls):
    def run():
        for _ in range(calls):
            fn()  # each result dropped at once, as a round drops it

    fn()
    return best_cpu(run) / calls * 1e6


out = {"code": sys.argv[1]}
registry = bytes(32)
ids = list(range(5, 5005, 5))


def tag_round(own_copy):
    shared = frozenset(ids)
    sets = [frozenset(ids) if own_copy else shared for _ in range(1000)]

    def run():
        for u, s in enumerate(sets):
            for v in range(62):
                sg.consistency_tag_message(0, u, v, s, registry=registry)

    return run


out["tags_shared_set_cpu_s"] = best_cpu(tag_round(False))
out["tags_own_copy_cpu_s"] = best_cpu(tag_round(True))
many = itertools.cycle([frozenset(range(i, i + 1000)) for i in range(40)])
out["tag_40_sets_in_turn_us"] = per_call_us(
    lambda: sg.consistency_tag_message(0, 1, 2, next(many), registry=registry), 2000
)

length = 100_000
workspace = masking_workspace(length, SecAggConfig().for_round(100))
values = np.random.default_rng(0).uniform(-1, 1, length)
key = bytes(range(32))
uniform = workspace.uniform.draw(key).copy()
acc = np.zeros(length, np.uint32)
out["rounding_draw_us"] = per_call_us(lambda: workspace.uniform.draw(key), 200)
out["encoder_encode_us"] = per_call_us(lambda: workspace.encoder.encode(values, uniform), 200)
out["encode_input_us"] = per_call_us(lambda: encode_input(values, key, workspace, owner=0), 200)
out["mask_add_us"] = per_call_us(
    lambda: workspace.expander.add(acc, key, domain=prg_mod.DOMAIN_PAIR_MASK), 200
)
out["cipher_construction_us"] = per_call_us(
    lambda: prg_mod._encryptor("aes-256-ctr", key, prg_mod.DOMAIN_PAIR_MASK), 20000
)
print(json.dumps(out))
