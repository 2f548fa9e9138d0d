"""The flooding floor: how much noise hides a key-dependent decryption error (pure math).

Kept apart from :mod:`securefed.crypto.ckks` (which needs TenSEAL) so that the audit checks a
view's flooding with the same formula the transport used.
"""

from __future__ import annotations

import math

MIN_FLOODING_SECURITY_BITS = 20
"""The lowest flooding level accepted outside
:meth:`securefed.crypto.ckks.Flooding.unsafe_for_tests`: FedSlate's module fusion releases its
batch sums at this level (KL at most ``2^-20`` per value); a weaker level
(``ckks:flood_security_bits=1``: KL up to 1/2 per value) is refused when the flooding is built,
and the audit flags a record of one (``ckks-flooding-weak``)."""


def flooding_floor(error_bound: float, security_bits: float) -> float:
    """The least flooding std that hides an error of at most ``error_bound`` at ``security_bits``.

    A released value is ``y = m + e + g`` with ``|e| <= error_bound`` key-dependent and ``g ~
    N(0, sigma^2)``; the same value computed without the key-dependent error is ``m + g``. Their
    KL divergence is ``e^2 / (2 sigma^2)``, at most ``2^-s`` when ``sigma >= error_bound *
    2^((s - 1) / 2)``. Over ``T`` released values the divergences add (``T 2^-s``). Li,
    Micciancio, Schultz and Sorrell (CRYPTO 2022) show that flooding CKKS decryptions with
    Gaussian noise scaled to the worst-case error this way gives IND-CPA^D security, and that
    ``2^(s/2)`` times the error cannot be improved much; the constant here is that of the KL
    form above.
    """
    if not math.isfinite(error_bound) or error_bound <= 0:
        raise ValueError(f"error_bound must be finite and > 0, got {error_bound!r}")
    return error_bound * 2.0 ** ((security_bits - 1) / 2)
