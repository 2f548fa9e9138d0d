"""One client's encoding and one mask expansion, for the code tree given (old beside new).

    python benchmarks/results/secagg_floor/round2/micro_encoding.py CODE_DIR  # one JSON line

Run it from outside the worktree's root (its securefed would shadow CODE_DIR). CPU seconds
(``time.process_time``) per call, best of 5 batches, at d = 1e5 (the round bench's vectors) and
d = 35,000 (FedMF's): the rounding draw alone (``UniformSource.draw``, the encoding's floor in
``bench secagg-malicious``), ``encode_input`` (draw + clip/scale/round, what a client runs), one
mask expanded and added into a vector (``MaskExpander.add``), one AES-256-CTR context.
"""

import json
import sys
import time

sys.path.insert(0, sys.argv[1])

import numpy as np

from securefed.crypto import prg as prg_mod
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg.client import encode_input, masking_workspace


def per_call_us(fn, calls, batches=5):
    fn()
    best = float("inf")
    for _ in range(batches):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


key = bytes(range(32))
out = {"code": sys.argv[1], "module": prg_mod.__file__}


def measure(length: int) -> dict:
    workspace = masking_workspace(length, SecAggConfig().for_round(100))
    values = np.random.default_rng(0).uniform(-1, 1, length)
    acc = np.zeros(length, np.uint32)
    calls = 200 if length == 100_000 else 500
    row = {
        "rounding_draw_us": per_call_us(lambda: workspace.uniform.draw(key), calls),
        "encode_input_us": per_call_us(
            lambda: encode_input(values, key, workspace, owner=0), calls
        ),
        "mask_add_us": per_call_us(
            lambda: workspace.expander.add(acc, key, domain=prg_mod.DOMAIN_PAIR_MASK), calls
        ),
    }
    row["encode_over_draw"] = row["encode_input_us"] / row["rounding_draw_us"]
    return row


for length in (100_000, 35_000):
    out[f"d{length}"] = measure(length)
out["aes_ctr_context_us"] = per_call_us(
    lambda: prg_mod._encryptor("aes-256-ctr", key, prg_mod.DOMAIN_PAIR_MASK), 5000
)
print(json.dumps(out))
