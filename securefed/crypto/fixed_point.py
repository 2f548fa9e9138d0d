"""Fixed-point encoding of real updates into the ring Z_{2^bits} of secure aggregation.

Masks only hide elements of a finite group, so each client maps its real vector into
Z_{2^bits} (bits = 32 or 64) before masking (Bonawitz et al., CCS 2017, Sec. 3: inputs in Z_R):

1. clip every value to ``[-clip, clip]`` (how many were clipped is counted, so a caller can tell);
2. scale by ``scale`` and round *stochastically*: ``z = clip(x) * scale`` becomes ``floor(z) + 1``
   with probability ``z - floor(z)`` and ``floor(z)`` otherwise, so ``E[round(z)] = z`` exactly and
   the sum over clients stays unbiased (deterministic rounding would bias it by up to n/2 units);
3. reduce modulo ``2^bits`` (two's complement).

Every encoded integer lies in ``[-L, L]`` with ``L = ceil(clip * scale)`` (stochastic rounding
moves a value up to the next integer, never further; a weight, which lies in ``[0, clip]``, is
encoded the same way), so a sum of ``n`` of them lies in ``[-nL, nL]`` and decodes uniquely
(reinterpreting the ring element as a signed integer) as long as

    n * ceil(clip * scale) <= 2^(bits-1) - 1,

i.e. about ``n * 2 * clip * scale < 2^bits``. :meth:`FixedPoint.check_clients` refuses a round with
more clients than that (:class:`ModulusOverflowError`): a wrapped sum would be silently wrong.
:func:`largest_safe_scale` gives the largest power-of-two scale that meets it for a round's ``n``
(secure aggregation's default: the finest resolution the ring allows).

Error bound (:func:`sum_error_bound`). Each rounding error is below one unit,
``|round(z) - z| < 1``, so for the decoded sum of ``n`` contributions

    |recovered - sum_u clip(x_u)| < n / scale     (per coordinate),

plus float64 arithmetic: none when ``scale`` is a power of two and ``n L <= 2^53`` (scaling,
the integer's conversion and the division are then exact), else at most ``3 * 2^-53 * n L / scale``
(relative rounding of the scaling, the conversion and the division). The errors are independent
and zero-mean, so the typical error is far smaller: its standard deviation is at most
``sqrt(n) / (2 * scale)``. The mean's bounds follow (:func:`mean_error_bound`,
:func:`weighted_mean_error_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from securefed.crypto.prg import ring_dtype
from securefed.errors import AggregationError


class ModulusOverflowError(AggregationError, ValueError):
    """The sum of the round's clients could wrap the modulus (refused: it would decode wrong)."""


UNIT_ROUNDOFF = 2.0**-53
"""float64's unit roundoff: a rounded operation's relative error is at most this."""
MAX_SCALE_EXPONENT = 1023
"""``2^1023`` is the largest power of two that float64 represents."""


def is_power_of_two(scale: float) -> bool:
    """Whether ``scale`` is ``2^e`` for an integer ``e`` (then scaling and unscaling are exact)."""
    return math.isfinite(scale) and scale > 0 and math.frexp(scale)[0] == 0.5


def ring_limit(bits: int) -> int:
    """``2^(bits-1) - 1``: the largest magnitude a signed sum in Z_{2^bits} can decode to."""
    if bits not in (32, 64):
        raise ValueError(f"bits must be 32 or 64, got {bits}")
    return (1 << (bits - 1)) - 1


def largest_safe_scale(n_clients: int, clip: float, bits: int) -> float:
    """The largest power-of-two scale at which a sum of ``n_clients`` inputs cannot wrap.

    Every encoded value (and the weight column, whose weights lie in ``[0, clip]``) is an integer
    in ``[-L, L]`` with ``L = ceil(clip * scale)``: stochastic rounding may round ``clip * scale``
    up, never beyond its ceiling. The sum of ``n`` of them decodes uniquely iff

        n * ceil(clip * 2^e) <= 2^(bits-1) - 1,

    and this returns ``2^e`` for the largest integer ``e`` that satisfies it. At ``2^(e+1)``,
    ``n`` clients sending ``clip`` (and rounding up) would wrap the ring.

    Args:
        n_clients: clients in the round (at least 1).
        clip: the clip range, finite and > 0.
        bits: the ring, 32 or 64.

    Raises:
        ValueError: ``n_clients < 1``, or ``clip`` not finite and positive.
        ModulusOverflowError: ``n_clients > 2^(bits-1) - 1``: no scale fits.
    """
    limit = ring_limit(bits)
    if isinstance(n_clients, bool) or n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip}")
    if n_clients > limit:
        raise ModulusOverflowError(
            f"{n_clients} clients cannot share Z_2^{bits}: even one unit each could wrap the sum"
        )

    def fits(e: int) -> bool:
        return n_clients * math.ceil(math.ldexp(clip, e)) <= limit

    # Start one below the real-valued solution of n * clip * 2^e = limit, then step to the edge.
    e = math.floor(math.log2(limit / n_clients) - math.log2(clip)) - 1
    while not fits(e):
        e -= 1
    while fits(e + 1):
        e += 1
    if e > MAX_SCALE_EXPONENT:
        raise ValueError(
            f"clip {clip} is so small that the largest safe scale 2^{e} is not a finite float64"
        )
    return math.ldexp(1.0, e)


def sum_error_bound(n_contributors: int, scale: float, level: int) -> float:
    """Worst-case ``|recovered - true clipped sum|`` per coordinate for ``n`` contributions.

    ``n / scale`` (one rounding unit per contribution), plus ``3 * 2^-53 * n L / scale`` for
    float64 unless ``scale`` is a power of two and ``n L <= 2^53`` (then every float operation
    on the way is exact). ``level`` is ``L = ceil(clip * scale)``.
    """
    rounding = n_contributors / scale
    if is_power_of_two(scale) and n_contributors * level <= 2**53:
        return rounding
    return rounding + 3 * UNIT_ROUNDOFF * n_contributors * level / scale


def mean_error_bound(n_contributors: int, scale: float, level: int, clip: float) -> float:
    """Worst-case error per coordinate of an unweighted mean, the decoded sum over ``n``.

    The count is exact, so the sum's bound divides by ``n``; the division adds one rounding of
    a value at most ``clip`` in magnitude (``2^-53 * clip``, doubled for the operands' rounding).
    """
    if n_contributors < 1:
        raise ValueError(f"a mean needs at least one contributor, got {n_contributors}")
    sum_bound = sum_error_bound(n_contributors, scale, level)
    return sum_bound / n_contributors + 2 * UNIT_ROUNDOFF * clip


def weighted_mean_error_bound(sum_bound: float, weight: float, max_abs_mean: float) -> float:
    """Worst-case error per coordinate of a weighted mean ``T / W`` decoded as ``T' / W'``.

    With ``T' = T + a`` and ``W' = W + b``, ``|a|, |b| <= e`` (the weight column is one more
    coordinate of the sum, so ``e = sum_bound``): ``T'/W' - T/W = (a - b T/W) / W'``, hence
    ``delta <= e (1 + |m|) / W'`` with ``|m| <= |m'| + delta``, which solves to

        delta <= e (1 + |m'|) / (W' - e)          (W' > e),

    plus the division's rounding (``2^-51 |m'|`` covers it with margin). ``max_abs_mean`` is the
    largest ``|m'|`` over the coordinates, so the bound holds for every coordinate.

    Returns:
        The bound, or ``inf`` when ``W' <= e`` (the decoded weight does not bound the mean).
    """
    if weight <= sum_bound:
        return math.inf
    return sum_bound * (1 + max_abs_mean) / (weight - sum_bound) + 4 * UNIT_ROUNDOFF * max_abs_mean


def clip_values(values: np.ndarray, clip: float) -> tuple[np.ndarray, int]:
    """``values`` clipped to ``[-clip, clip]`` and the number of entries that were clipped."""
    values = np.asarray(values, dtype=np.float64)
    clipped = np.clip(values, -clip, clip)
    return clipped, int(np.count_nonzero(clipped != values))


def stochastic_round(scaled: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Unbiased rounding: ``floor(z) + [u < z - floor(z)]`` with ``u ~ U[0, 1)`` given.

    ``E[result] = z`` and ``|result - z| < 1`` for every entry.
    """
    if uniform.shape != scaled.shape:
        raise ValueError(f"need one uniform number per value: {uniform.shape} != {scaled.shape}")
    floor = np.floor(scaled)
    return (floor + (uniform < scaled - floor)).astype(np.int64)


def to_ring(integers: np.ndarray, bits: int) -> np.ndarray:
    """Signed integers (``|v| < 2^(bits-1)``) as elements of Z_{2^bits} (two's complement)."""
    integers = np.asarray(integers, dtype=np.int64)
    if bits == 32:
        return integers.astype(np.int32).view(np.uint32).astype(ring_dtype(32), copy=False)
    if bits == 64:
        return integers.view(np.uint64).astype(ring_dtype(64), copy=False)
    raise ValueError(f"bits must be 32 or 64, got {bits}")


def from_ring(elements: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements as signed integers in ``[-2^(bits-1), 2^(bits-1))`` (int64)."""
    elements = np.asarray(elements)
    if bits == 32:
        return elements.astype(np.uint32, copy=False).view(np.int32).astype(np.int64)
    if bits == 64:
        return elements.astype(np.uint64, copy=False).view(np.int64)
    raise ValueError(f"bits must be 32 or 64, got {bits}")


@dataclass(frozen=True)
class FixedPoint:
    """Clip, scale, stochastically round and reduce mod ``2^bits`` (see the module docstring).

    Attributes:
        bits: 32 or 64, the ring Z_{2^bits}; the upload costs ``bits / 8`` bytes per value.
        scale: fixed-point scale (a power of two keeps decoding exact); resolution ``1 / scale``.
        clip: values are clipped to ``[-clip, clip]``.
    """

    bits: int = 32
    scale: float = 2.0**16
    clip: float = 1.0

    def __post_init__(self) -> None:
        if self.bits not in (32, 64):
            raise ValueError(f"bits must be 32 or 64, got {self.bits}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {self.scale}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be finite and > 0, got {self.clip}")
        if self.max_clients < 2:
            raise ModulusOverflowError(
                f"clip {self.clip} x scale {self.scale} leaves room for {self.max_clients} "
                f"client(s) in Z_2^{self.bits}; lower clip or scale, or use bits=64"
            )

    @property
    def level(self) -> int:
        """``L = ceil(clip * scale)``, the largest magnitude of an encoded value."""
        return math.ceil(self.clip * self.scale)

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @property
    def dtype(self) -> np.dtype:
        return ring_dtype(self.bits)

    @property
    def max_clients(self) -> int:
        """Largest ``n`` whose sum cannot wrap: ``n * L <= 2^(bits-1) - 1``."""
        return ring_limit(self.bits) // self.level

    def check_clients(self, n_clients: int) -> None:
        """Refuse a round whose sum of ``n_clients`` encoded inputs could wrap the modulus.

        Raises:
            ModulusOverflowError: if ``n_clients > max_clients``.
        """
        if n_clients > self.max_clients:
            raise ModulusOverflowError(
                f"{n_clients} clients x 2 x clip {self.clip} x scale {self.scale} could wrap the "
                f"modulus 2^{self.bits} (at most {self.max_clients} clients fit); lower clip or "
                f"scale, use bits=64, or split the round"
            )

    def sum_bound(self, n_contributors: int) -> int:
        """``n L``: no sum of ``n`` encoded values exceeds it in magnitude (ring units).

        A decoded sum beyond it did not come from ``n`` clipped inputs (a wrong unmasking secret,
        or an input encoded outside the clip range): the caller refuses it.
        """
        return n_contributors * self.level

    def error_bound(self, n_contributors: int) -> float:
        """Worst-case ``|recovered - true sum|`` per coordinate (:func:`sum_error_bound`)."""
        return sum_error_bound(n_contributors, self.scale, self.level)

    def mean_error_bound(self, n_contributors: int) -> float:
        """Worst-case error per coordinate of the sum over ``n`` (:func:`mean_error_bound`)."""
        return mean_error_bound(n_contributors, self.scale, self.level, self.clip)

    def encode(self, values: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, int]:
        """Encode real ``values`` (1-D) into the ring.

        Args:
            values: finite float values.
            uniform: as many U[0, 1) numbers, the rounding randomness (the client's own stream).

        Returns:
            ``(ring elements, number of clipped values)``.

        Raises:
            ValueError: for NaN or infinite values, or mismatched lengths.
        """
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        return Encoder(self, len(values)).encode(values, uniform)

    def decode(self, elements: np.ndarray) -> np.ndarray:
        """Ring elements (e.g. an unmasked sum) back to reals: signed integer / scale."""
        return from_ring(elements, self.bits).astype(np.float64) / self.scale


class Encoder:
    """:meth:`FixedPoint.encode` for many vectors of one length, reusing scratch buffers.

    The same arithmetic as :func:`clip_values` then :func:`stochastic_round` then :func:`to_ring`
    (bit-identical results), done in place: the simulation encodes thousands of clients' vectors
    and fresh temporaries would dominate its cost.

    Args:
        fixed_point: the codec parameters.
        length: number of values per vector.
    """

    def __init__(self, fixed_point: FixedPoint, length: int) -> None:
        self.fixed_point = fixed_point
        self.length = length
        self._scaled = np.empty(length)
        self._floor = np.empty(length)
        self._up = np.empty(length, dtype=bool)

    def encode(
        self,
        values: np.ndarray,
        uniform: np.ndarray,
        *,
        bounds: tuple[float, float] | None = None,
    ) -> tuple[np.ndarray, int]:
        """A fresh ring vector encoding ``values`` and the number of clipped values.

        Args:
            values: ``length`` float values.
            uniform: ``length`` U[0, 1) numbers, the rounding randomness.
            bounds: ``(values.min(), values.max())`` when the caller computed them already
                (secure aggregation's submit reads them to refuse NaN and infinities before
                the round starts): the two reductions are then not repeated here. ``None``:
                computed here. The decision (nothing to clip, or the checked clipping pass)
                is this method's either way, so the result is the same bit for bit.

        Raises:
            ValueError: for NaN or infinite values, or lengths other than ``length``.
        """
        fp = self.fixed_point
        values = np.asarray(values, dtype=np.float64)
        uniform = np.asarray(uniform, dtype=np.float64)
        if values.shape != (self.length,) or uniform.shape != (self.length,):
            raise ValueError(
                f"expected {self.length} values and uniforms, "
                f"got {values.shape} and {uniform.shape}"
            )
        z, floor, up = self._scaled, self._floor, self._up
        # Two reductions decide the common case (finite, nothing to clip: NaN fails both
        # comparisons) without the finiteness, clip and count passes over the vector.
        if self.length and bounds is None:
            bounds = (values.min(), values.max())
        if self.length and -fp.clip <= bounds[0] and bounds[1] <= fp.clip:
            n_clipped = 0
            np.multiply(values, fp.scale, out=z)
        else:
            if not np.all(np.isfinite(values)):
                raise ValueError("fixed-point encoding refuses NaN or infinite values")
            np.clip(values, -fp.clip, fp.clip, out=z)
            n_clipped = int(np.count_nonzero(z != values))
            np.multiply(z, fp.scale, out=z)
        np.floor(z, out=floor)
        np.subtract(z, floor, out=z)  # the fractional part, exact
        np.less(uniform, z, out=up)
        # floor(z) + [u < frac]: unbiased, |error| < 1. The integer floor is exact (|z| <= the
        # level, below 2^(bits-1)), so adding the bit after the conversion gives the same ring
        # elements as adding it in floats, in one pass fewer of mixed-type arithmetic.
        signed = floor.astype(np.int32 if fp.bits == 32 else np.int64)
        np.add(signed, up, out=signed, casting="unsafe")
        ring = signed.view(np.uint32 if fp.bits == 32 else np.uint64)
        return ring.astype(fp.dtype, copy=False), n_clipped

    def encode_blocks(
        self, values: np.ndarray, uniform_blocks: Iterable[np.ndarray]
    ) -> tuple[np.ndarray, int]:
        """:meth:`encode` with the uniforms given block by block, computed block by block.

        ``uniform_blocks`` are successive slices of the vector's uniforms (each may be a view
        that the next one overwrites, :meth:`~securefed.crypto.prg.UniformSource.blocks`). Each
        block is range-checked, scaled, rounded and written into the ring vector while its
        buffers are still in cache (a vector of 1e5 values and its scratch vectors overflow a
        2 MiB L2; a block's do not): the same arithmetic as :meth:`encode` element by element
        (clipping and counting only the blocks that need it, refusing NaN or infinities), so
        the same ring elements and count bit for bit (benchmarks/results/secagg_floor).
        Secure aggregation's ``encode_input`` now calls :meth:`encode` on one whole draw: at
        d = 1e5 the blocks' numpy calls cost more than the cache they save (round4 there).

        Raises:
            ValueError: as :meth:`encode`; blocks that do not add up to ``length`` uniforms.
        """
        fp = self.fixed_point
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.length,):
            raise ValueError(f"expected {self.length} values, got {values.shape}")
        signed = np.empty(self.length, np.int32 if fp.bits == 32 else np.int64)
        start, n_clipped = 0, 0
        for uniform in uniform_blocks:
            stop = start + len(uniform)
            if stop > self.length:
                raise ValueError(f"the uniform blocks hold more than {self.length} values")
            size = stop - start
            if size == 0:
                continue
            block = values[start:stop]
            z, floor, up = self._scaled[:size], self._floor[:size], self._up[:size]
            # Two reductions in cache decide the common case (finite, nothing to clip: NaN
            # fails both comparisons); otherwise the block is checked, clipped and counted.
            if -fp.clip <= block.min() and block.max() <= fp.clip:
                np.multiply(block, fp.scale, out=z)
            else:
                if not np.all(np.isfinite(block)):
                    raise ValueError("fixed-point encoding refuses NaN or infinite values")
                np.clip(block, -fp.clip, fp.clip, out=z)
                n_clipped += int(np.count_nonzero(z != block))
                np.multiply(z, fp.scale, out=z)
            np.floor(z, out=floor)
            np.subtract(z, floor, out=z)
            np.less(uniform, z, out=up)
            out = signed[start:stop]
            np.copyto(out, floor, casting="unsafe")  # floor.astype's conversion, in place
            np.add(out, up, out=out, casting="unsafe")
            start = stop
        if start != self.length:
            raise ValueError(f"the uniform blocks hold {start} values, expected {self.length}")
        ring = signed.view(np.uint32 if fp.bits == 32 else np.uint64)
        return ring.astype(fp.dtype, copy=False), n_clipped
