"""Per-call CPU of a few functions inside one honest-but-curious round (n = 1000 x 1e5, 0 %).

python benchmarks/results/secagg_floor/round3/seed_keys_in_round.py   # from the worktree root
"""

import collections
import time

import securefed.crypto.keys as kx
import securefed.crypto.shamir as sh
from securefed import randomness
from securefed.bench import bench_secagg as b

acc = collections.Counter()
cnt = collections.Counter()


def wrap(obj, name, label):
    f = getattr(obj, name)

    def g(*a, **k):
        s = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - s
            cnt[label] += 1

    setattr(obj, name, g)


wrap(randomness.SeedTree, "key", "SeedTree.key")
wrap(kx, "keypair_from_seed", "keypair_from_seed")
wrap(sh, "split", "shamir.split")
wrap(kx, "seal", "seal")
case, rnd = b._measured_round(1000, 100_000, 0.0, seed=0, server="honest_but_curious")
print(case.cpu_seconds)
for k in acc:
    print(k, cnt[k], round(acc[k], 3), round(acc[k] / cnt[k] * 1e6, 1), "us")
