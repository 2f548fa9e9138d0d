"""The encoding's numpy passes, one block of values in cache, and the alternatives tried.

    python benchmarks/results/secagg_floor/round3/micro_passes.py   # us a block, best of 5

CPU seconds per call (``time.process_time``), 500 calls a batch (300 for the last three).
"""

import time

import numpy as np

B = 16384
rng = np.random.default_rng(0)
v, u = rng.uniform(-1, 1, B), rng.random(B)
z, fl, q = np.empty(B), np.empty(B), np.empty(B)
up, out, upi = np.empty(B, bool), np.empty(B, np.int32), np.empty(B, np.int32)
w, fu = rng.integers(0, 2**63, B, dtype=np.uint64), np.empty(B)
np.multiply(v, 65536.0, out=z)
np.floor(z, out=fl)


def convert_then_add():
    np.copyto(out, fl, casting="unsafe")
    np.add(out, up, out=out, casting="unsafe")


OPS = {
    "scale (multiply)": lambda: np.multiply(v, 65536.0, out=z),
    "floor": lambda: np.floor(z, out=fl),
    "fraction (subtract)": lambda: np.subtract(z, fl, out=q),
    "compare (less)": lambda: np.less(u, q, out=up),
    "conversion (copyto float -> int32)": lambda: np.copyto(out, fl, casting="unsafe"),
    "add the bit (int32 + bool)": lambda: np.add(out, up, out=out, casting="unsafe"),
    "draw: shift": lambda: np.right_shift(w, np.uint64(11), out=w),
    "draw: int64 -> float x 2^-53": lambda: np.multiply(w.view(np.int64), 2.0**-53, out=fu),
    "range check (min, max)": lambda: (v.min(), v.max()),
    "tried: divmod(z, 1) for floor and fraction": lambda: np.divmod(z, 1.0, out=(fl, q)),
    "tried: modf": lambda: np.modf(z, out=(q, fl)),
    "tried: masked add (where=)": lambda: np.add(fl, 1.0, out=q, where=up),
    "conversion then add (the code)": convert_then_add,
    "tried: float + bool straight into int32": lambda: np.add(fl, up, out=upi, casting="unsafe"),
}
for name, fn in OPS.items():
    fn()
    best = float("inf")
    calls = 300 if name.startswith(("conversion then", "tried: float")) else 500
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls)
    print(f"{name:45s} {best * 1e6:7.2f} us a block of {B}")
