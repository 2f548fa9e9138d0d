"""Hot-loop micro quoted in README.md (see micro.txt); argv[1]: the code tree."""

import hmac
import sys
import time

sys.path.insert(0, sys.argv[1])
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from securefed.crypto import keys as kx

N = 4000
privs = [kx.keypair_from_seed(bytes([i % 256, i // 256]) + bytes(30)) for i in range(200)]
pubs = [p.public for p in privs]
objs = [X25519PublicKey.from_public_bytes(p) for p in pubs]
me = privs[0].private


def t(f, reps=3):
    best = 9
    for _ in range(reps):
        t0 = time.process_time()
        f()
        best = min(best, (time.process_time() - t0) / N)
    return best * 1e6


print("exchange obj", t(lambda: [me.exchange(objs[i % 200]) for i in range(N)]))
print("exchange decoded", t(lambda: [me.exchange(kx._decoded(pubs[i % 200])) for i in range(N)]))
print("agree", t(lambda: [kx.agree(me, pubs[i % 200]) for i in range(N)]))
sh = me.exchange(objs[1])
info = kx.pair_info(kx.PURPOSE_PAIR_MASK, 0, 1, 2)
print("derive_key", t(lambda: [kx.derive_key(sh, info) for i in range(N)]))
print(
    "2 hmac",
    t(
        lambda: [
            hmac.digest(hmac.digest(kx.PROTOCOL_LABEL, sh, "sha256"), info + b"\x01", "sha256")
            for i in range(N)
        ]
    ),
)
print("pair_info", t(lambda: [kx.pair_info(kx.PURPOSE_PAIR_MASK, 0, 1, i) for i in range(N)]))
print(
    "pair_key",
    t(lambda: [kx.pair_key(me, pubs[i % 200], kx.PURPOSE_PAIR_MASK, 0, 1, i) for i in range(N)]),
)
print("check_public_key", t(lambda: [kx.check_public_key(pubs[i % 200]) for i in range(N)]))
print(
    "from_public_bytes",
    t(lambda: [X25519PublicKey.from_public_bytes(pubs[i % 200]) for i in range(N)]),
)
