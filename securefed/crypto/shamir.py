"""Shamir secret sharing over the prime field GF(p), p = 2^256 + 297.

Shamir (1979), "How to share a secret": a secret ``s`` is the constant term of a random polynomial
``f`` of degree ``t - 1``; party ``i`` receives ``(x_i, f(x_i))`` with distinct non-zero ``x_i``.
Any ``t`` shares determine ``f`` and ``s = f(0)`` by Lagrange interpolation,

    s = sum_i y_i * prod_{j != i} x_j / (x_j - x_i)   (mod p),

while any ``t - 1`` shares are consistent with *every* secret (perfect secrecy): that is the
property Bonawitz et al. (CCS 2017, Sec. 3.1) and Bell et al. (CCS 2020) rely on to let a server
recover a dropped client's mask key only with the help of ``t`` of its neighbours.

The modulus is the smallest prime above ``2^256``, so every 32-byte secret (an X25519 private key,
a mask seed) is a field element as it is, with no splitting and no reduction. A share's value needs
257 bits and is serialised as :data:`SHARE_BYTES` = 33 big-endian bytes.

Randomness is explicit: :func:`split` takes a ``randbytes(n) -> bytes`` callable (``os.urandom``
in secure mode, a seeded stream in tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

PRIME = 2**256 + 297
"""The field modulus: the smallest prime above 2^256 (checked by the tests with Miller-Rabin)."""

SECRET_BYTES = 32
SHARE_BYTES = 33

RandBytes = Callable[[int], bytes]


def field_inverse(value: int) -> int:
    """Multiplicative inverse modulo :data:`PRIME`.

    Raises:
        ZeroDivisionError: for a multiple of the modulus.
    """
    value %= PRIME
    if value == 0:
        raise ZeroDivisionError("0 has no inverse in GF(p)")
    return pow(value, -1, PRIME)


def random_field_element(randbytes: RandBytes) -> int:
    """A uniform element of GF(p), by rejection sampling 257-bit integers (exact, no bias)."""
    while True:
        candidate = int.from_bytes(randbytes(SHARE_BYTES), "big") & ((1 << 257) - 1)
        if candidate < PRIME:
            return candidate


def poly_eval(coefficients: Sequence[int], x: int) -> int:
    """Evaluate ``sum_i c_i x^i`` mod p by Horner's rule (``coefficients[0]`` is the constant).

    For a small ``x`` (a shareholder's index) the reduction is done once at the end: the integer
    grows by only ``log2 x`` bits per step, which is cheaper than reducing at every step.
    """
    acc = 0
    if 0 <= x < 1 << 32:
        for coefficient in reversed(coefficients):
            acc = acc * x + coefficient
        return acc % PRIME
    for coefficient in reversed(coefficients):
        acc = (acc * x + coefficient) % PRIME
    return acc


def _check_xs(xs: Sequence[int]) -> None:
    if len(set(xs)) != len(xs):
        raise ValueError("share x-coordinates must be distinct")
    if any(x % PRIME == 0 for x in xs):
        raise ValueError("share x-coordinates must be non-zero modulo p (x = 0 is the secret)")


def split(secret: int, threshold: int, xs: Sequence[int], randbytes: RandBytes) -> list[int]:
    """Shamir-share ``secret`` with threshold ``threshold``: the values ``f(x)`` for each ``x``.

    Args:
        secret: an element of GF(p).
        threshold: ``t``, the number of shares needed to reconstruct (degree ``t - 1``).
        xs: the distinct, non-zero x-coordinates of the shareholders.
        randbytes: source of the random coefficients.

    Returns:
        ``[f(x) for x in xs]``.

    Raises:
        ValueError: if ``threshold`` is not in ``[1, len(xs)]``, the secret is outside the field,
            or the x-coordinates are repeated or zero.
    """
    if not 1 <= threshold <= len(xs):
        raise ValueError(
            f"threshold must lie in [1, {len(xs)}] (the number of shares), got {threshold}"
        )
    if not 0 <= secret < PRIME:
        raise ValueError("the secret must be an element of GF(p)")
    _check_xs(xs)
    coefficients = [secret] + [random_field_element(randbytes) for _ in range(threshold - 1)]
    return [poly_eval(coefficients, x) for x in xs]


def batch_inverse(values: Sequence[int]) -> list[int]:
    """Inverses of all ``values`` mod p with one exponentiation (Montgomery's trick).

    Raises:
        ZeroDivisionError: if a value is 0 mod p.
    """
    prefix = [1]
    for value in values:
        if value % PRIME == 0:
            raise ZeroDivisionError("0 has no inverse in GF(p)")
        prefix.append(prefix[-1] * value % PRIME)
    inverse = field_inverse(prefix[-1])
    result = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        result[i] = prefix[i] * inverse % PRIME
        inverse = inverse * values[i] % PRIME
    return result


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Lagrange coefficients ``l_i = prod_{j != i} x_j / (x_j - x_i)`` for interpolation at 0.

    The products are taken over the integers (x-coordinates are small in practice) and reduced
    once; the divisions share one modular inversion (:func:`batch_inverse`).
    """
    xs = [x % PRIME for x in xs]
    _check_xs(xs)
    numerator = math.prod(xs)
    denominators = [math.prod(xj - xi for xj in xs if xj != xi) % PRIME for xi in xs]
    inverses = batch_inverse(denominators)
    return [(numerator // xi) % PRIME * inv % PRIME for xi, inv in zip(xs, inverses, strict=True)]


def interpolate_at_zero(points: Sequence[tuple[int, int]]) -> int:
    """``f(0)`` of the unique polynomial of degree ``< len(points)`` through ``points``.

    With fewer points than the threshold this is *a* secret consistent with them, not the secret
    (any value is; see :func:`reconstruct` for the checked version).
    """
    if not points:
        raise ValueError("interpolation needs at least one point")
    xs = [x for x, _ in points]
    coefficients = lagrange_at_zero(xs)
    return sum(c * y for c, (_, y) in zip(coefficients, points, strict=True)) % PRIME


def reconstruct(points: Sequence[tuple[int, int]], threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``(x, f(x))`` (uses the first ``threshold``).

    Raises:
        ValueError: with fewer than ``threshold`` shares (the secret is information-theoretically
            hidden by them) or repeated x-coordinates.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    if len(points) < threshold:
        raise ValueError(
            f"{len(points)} share(s) cannot reconstruct a {threshold}-out-of-n secret: "
            f"{threshold - len(points)} more are needed"
        )
    return interpolate_at_zero(list(points)[:threshold])


def secret_to_int(secret: bytes) -> int:
    """A 32-byte secret as a field element (big-endian)."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secrets are {SECRET_BYTES} bytes, got {len(secret)}")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes:
    """The 32-byte secret a reconstructed field element stands for.

    Raises:
        ValueError: if the value is not below 2^256, i.e. cannot be a shared 32-byte secret (a
            sign that the shares were wrong).
    """
    if not 0 <= value < 1 << (8 * SECRET_BYTES):
        raise ValueError(
            "the reconstructed value is not a 32-byte secret: the shares are inconsistent"
        )
    return value.to_bytes(SECRET_BYTES, "big")


def encode_share(value: int) -> bytes:
    """A share value as :data:`SHARE_BYTES` big-endian bytes."""
    if not 0 <= value < PRIME:
        raise ValueError("a share value must be an element of GF(p)")
    return value.to_bytes(SHARE_BYTES, "big")


def decode_share(data: bytes) -> int:
    """Inverse of :func:`encode_share`.

    Raises:
        ValueError: for the wrong length or a value outside the field.
    """
    if len(data) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
    value = int.from_bytes(data, "big")
    if value >= PRIME:
        raise ValueError("share value outside GF(p)")
    return value
