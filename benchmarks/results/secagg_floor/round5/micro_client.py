"""Hot-loop micro quoted in README.md (see micro.txt); argv[1]: the code tree."""

import sys
import time

sys.path.insert(0, sys.argv[1])
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from securefed.crypto import keys as kx
from securefed.crypto import prg
from securefed.randomness import SeedTree
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as cm

cfg = SecAggConfig(server="honest_but_curious").for_round(1000)
seeds = SeedTree(0)


def per(fn, reps=2000):
    fn()
    t0 = time.process_time()
    for i in range(reps):
        fn(i)
    return (time.process_time() - t0) / reps * 1e6


print("SecAggClient()", per(lambda i=0: cm.SecAggClient(i, 0, cfg, seeds)))
print("seeds.key", per(lambda i=0: seeds.key("secagg", 0, i, "c")))
print("keypair_from_seed", per(lambda i=0: kx.keypair_from_seed(bytes(32))))
print(
    "keygen floor",
    per(lambda i=0: X25519PrivateKey.from_private_bytes(bytes(32)).public_key().public_bytes_raw()),
)
print("KeystreamBytes", per(lambda i=0: prg.KeystreamBytes(bytes(32))))
