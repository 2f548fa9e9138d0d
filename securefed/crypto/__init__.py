"""Cryptographic building blocks of secure aggregation (real primitives from ``cryptography``).

* :mod:`securefed.crypto.shamir`: Shamir t-of-n sharing over GF(2^256 + 297).
* :mod:`securefed.crypto.keys`: X25519 key agreement, HKDF-SHA256, AEAD-encrypted shares.
* :mod:`securefed.crypto.prg`: AES-256-CTR / ChaCha20 mask expansion into numpy ring vectors.
* :mod:`securefed.crypto.fixed_point`: clipping, stochastic rounding, Z_{2^32} / Z_{2^64} codec.
"""

from securefed.crypto.fixed_point import FixedPoint, ModulusOverflowError
from securefed.crypto.keys import InvalidPublicKeyError, KeyPair, ShareDecryptionError
from securefed.crypto.prg import MaskExpander, expand_mask

__all__ = [
    "FixedPoint",
    "InvalidPublicKeyError",
    "KeyPair",
    "MaskExpander",
    "ModulusOverflowError",
    "ShareDecryptionError",
    "expand_mask",
]
