"""Hot-loop micro quoted in README.md (see micro.txt); argv[1]: the code tree."""

import sys
import time

sys.path.insert(0, sys.argv[1])
from securefed.bench import bench_secagg as b
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir

k, t = 20, 11
costs = b.shamir_costs(k, t)["cpu"]
rb = prg.KeystreamBytes(bytes(32))
xs = list(range(1, k + 1))


def per(fn, reps=300):
    fn()
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps * 1e6


key = bytes(32)
nonce = bytes(12)
aad = kx.share_aad(0, 1, 2)
pt = bytes(66)
seal = per(lambda: kx.seal("aes-256-gcm", key, nonce, pt, aad), 3000)
split = per(lambda: shamir.split(12345, t, xs, rb))


def loop():
    bs = shamir.split(12345, t, xs, rb)
    ss = shamir.split(6789, t, xs, rb)
    nonces = rb(12 * k)
    out = []
    for i, (v, b_, s_) in enumerate(zip(xs, bs, ss, strict=True)):
        plaintext = shamir.encode_share(b_) + shamir.encode_share(s_)
        a = kx.share_aad(0, 1, v)
        n = nonces[i * 12 : (i + 1) * 12]
        out.append(kx.seal("aes-256-gcm", key, n, plaintext, a))
    return out


print(
    "split",
    split,
    "bench split",
    costs["shamir_split"] * 1e6,
    "seal",
    seal,
    "floor per client",
    2 * split + k * seal,
    "loop",
    per(loop),
)
