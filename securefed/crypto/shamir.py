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

Checking and correcting shares. The shares of one secret form a Reed-Solomon codeword: ``m`` points
on a polynomial of degree ``< t``. :func:`shares_consistent` checks every received share against
the polynomial through the first ``t`` of them, and :func:`decode_shares` rebuilds the
secret from consistent shares or, when some are wrong, corrects up to ``floor((m - t) / 2)`` of them
with the Berlekamp-Welch decoder (Welch and Berlekamp 1986; e.g. Gemmell and Sudan 1992) and names
them. ``m - t`` spare shares detect up to ``m - t`` wrong ones; with no spare share nothing can be
checked.
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


def _check_enough(points: Sequence[tuple[int, int]], threshold: int) -> None:
    """Refuse a threshold below 1, or fewer points than it takes."""
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    if len(points) < threshold:
        raise ValueError(
            f"{len(points)} share(s) cannot reconstruct a {threshold}-out-of-n secret: "
            f"{threshold - len(points)} more are needed"
        )


def reconstruct(points: Sequence[tuple[int, int]], threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``(x, f(x))`` (uses the first ``threshold``).

    Raises:
        ValueError: with fewer than ``threshold`` shares (the secret is information-theoretically
            hidden by them) or repeated x-coordinates.
    """
    _check_enough(points, threshold)
    return interpolate_at_zero(list(points)[:threshold])


class InconsistentSharesError(ValueError):
    """The shares of one secret lie on no polynomial of degree below the threshold, and there are
    too few spare shares to tell the wrong ones apart.

    Attributes:
        suspects: the x-coordinates of the shares among which the wrong ones are.
    """

    def __init__(self, message: str, suspects: Sequence[int]) -> None:
        super().__init__(message)
        self.suspects = tuple(suspects)


class _Interpolant:
    """The polynomial of degree ``< t`` through ``t`` points, evaluated by Lagrange's formula.

    ``f(x) = sum_i y_i prod_{j != i} (x - x_j) / (x_i - x_j)``: the weights ``y_i / d_i`` with
    ``d_i = prod_{j != i} (x_i - x_j)`` share one modular inversion, and each evaluation costs ``t``
    products (the numerators are small integers, divided exactly over the integers).
    """

    def __init__(self, points: Sequence[tuple[int, int]]) -> None:
        self.xs = [x % PRIME for x, _ in points]
        self.ys = [y % PRIME for _, y in points]
        _check_xs(self.xs)
        denominators = [math.prod(xi - xj for xj in self.xs if xj != xi) for xi in self.xs]
        inverses = batch_inverse([d % PRIME for d in denominators])
        self.weights = [y * inv % PRIME for y, inv in zip(self.ys, inverses, strict=True)]

    def __call__(self, x: int) -> int:
        if x in self.xs:
            return self.ys[self.xs.index(x)]
        differences = [x - xj for xj in self.xs]
        full = math.prod(differences)
        return sum(full // d * w for d, w in zip(differences, self.weights, strict=True)) % PRIME


def shares_consistent(points: Sequence[tuple[int, int]], threshold: int) -> bool:
    """Whether every one of ``points`` lies on the polynomial through the first ``threshold``.

    ``True`` when there are at most ``threshold`` points (nothing to check).

    Raises:
        ValueError: for repeated or zero x-coordinates.
    """
    _check_xs([x % PRIME for x, _ in points])
    if len(points) <= threshold:
        return True
    interpolant = _Interpolant(list(points)[:threshold])
    return all(interpolant(x % PRIME) == y % PRIME for x, y in list(points)[threshold:])


def _solve(rows: list[list[int]], rhs: list[int], n_unknowns: int) -> list[int] | None:
    """One solution of a linear system over GF(p) (free unknowns set to 0), or ``None``."""
    matrix = [[*row, b] for row, b in zip(rows, rhs, strict=True)]
    pivots: list[int] = []
    rank = 0
    for column in range(n_unknowns):
        pivot = next((r for r in range(rank, len(matrix)) if matrix[r][column]), None)
        if pivot is None:
            continue
        matrix[rank], matrix[pivot] = matrix[pivot], matrix[rank]
        inverse = field_inverse(matrix[rank][column])
        matrix[rank] = [value * inverse % PRIME for value in matrix[rank]]
        for r in range(len(matrix)):
            factor = matrix[r][column]
            if r != rank and factor:
                matrix[r] = [
                    (a - factor * b) % PRIME for a, b in zip(matrix[r], matrix[rank], strict=True)
                ]
        pivots.append(column)
        rank += 1
    if any(row[-1] for row in matrix[rank:]):
        return None  # 0 = non-zero: no solution
    solution = [0] * n_unknowns
    for r, column in enumerate(pivots):
        solution[column] = matrix[r][-1]
    return solution


def _divide(numerator: list[int], monic: list[int]) -> tuple[list[int], bool]:
    """``numerator / monic`` over GF(p) (coefficients lowest first): quotient, exact or not."""
    remainder = list(numerator)
    degree = len(monic) - 1
    quotient = [0] * max(len(remainder) - degree, 1)
    for shift in range(len(remainder) - 1 - degree, -1, -1):
        factor = remainder[shift + degree]
        quotient[shift] = factor
        if factor:
            for j, coefficient in enumerate(monic):
                remainder[shift + j] = (remainder[shift + j] - factor * coefficient) % PRIME
    return quotient, not any(remainder[:degree])


def _berlekamp_welch(points: Sequence[tuple[int, int]], threshold: int, errors: int):
    """The polynomial (coefficients) of degree ``< threshold`` that agrees with all but at most
    ``errors`` of ``points``, when ``len(points) >= threshold + 2 errors``; else ``None``.

    Solves ``Q(x_i) = y_i E(x_i)`` for ``Q`` of degree ``< threshold + errors`` and a monic error
    locator ``E`` of degree ``errors``; then ``f = Q / E``.
    """
    n_q = threshold + errors
    rows, rhs = [], []
    for x, y in points:
        powers = [pow(x, j, PRIME) for j in range(n_q)]
        rows.append(powers + [(-y * powers[j]) % PRIME for j in range(errors)])
        rhs.append(y * pow(x, errors, PRIME) % PRIME)
    solution = _solve(rows, rhs, n_q + errors)
    if solution is None:
        return None
    quotient, exact = _divide(solution[:n_q], [*solution[n_q:], 1])
    if not exact:
        return None
    return (quotient + [0] * threshold)[:threshold]


def decode_shares(points: Sequence[tuple[int, int]], threshold: int) -> tuple[int, tuple[int, ...]]:
    """The secret from ``points``, every one checked; wrong shares corrected where possible.

    When all ``m`` points lie on one polynomial of degree ``< threshold``
    (:func:`shares_consistent`), the secret is interpolated from the first ``threshold`` of them
    (as :func:`reconstruct`). When they do not, up to ``floor((m - threshold) / 2)`` wrong shares
    are corrected (Berlekamp-Welch).

    Returns:
        ``(secret, x-coordinates of the wrong shares)`` (the second empty when all agree).

    Raises:
        InconsistentSharesError: the points are inconsistent and cannot be corrected (more wrong
            shares than the spare ones correct); ``suspects`` holds every x-coordinate.
        ValueError: fewer than ``threshold`` points, or repeated x-coordinates.
    """
    _check_enough(points, threshold)
    _check_xs([x % PRIME for x, _ in points])
    interpolant = _Interpolant(list(points)[:threshold])
    if all(interpolant(x % PRIME) == y % PRIME for x, y in list(points)[threshold:]):
        return interpolant(0), ()
    xs = [x for x, _ in points]
    correctable = (len(points) - threshold) // 2
    polynomial = _berlekamp_welch(points, threshold, correctable) if correctable else None
    if polynomial is not None:
        wrong = tuple(x for x, y in points if poly_eval(polynomial, x) != y % PRIME)
        if len(wrong) <= correctable:
            return polynomial[0], wrong
    raise InconsistentSharesError(
        f"{len(points)} shares of a {threshold}-out-of-n secret are inconsistent, and "
        f"{len(points) - threshold} spare share(s) correct at most {correctable} wrong one(s)",
        xs,
    )


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
