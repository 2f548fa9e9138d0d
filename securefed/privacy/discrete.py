"""Integer noise and its accounting: the discrete Gaussian, the Skellam mechanism, sums of them.

Samplers (pure functions of an explicit ``np.random.Generator``):

* :func:`discrete_gaussian`: exact ``N_Z(0, sigma^2)`` by inversion of its CDF ``F``: one uniform
  62-bit word ``W`` a draw against the table ``floor(F(y) 2^62)``, computed once per variance by
  certified interval arithmetic in Python integers (no floating point); ``W`` equal to an entry
  (chance below ``2^-43`` a draw: fewer than ``2^19`` entries) reads further words against
  further exact digits of ``F``. Same law as the rejection samplers below (tests), about 10x
  (seeded) to 15x (secure) faster.
* :func:`bernoulli_exp_neg`, :func:`discrete_laplace`, :func:`discrete_gaussian_rejection`:
  Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
  Algorithms 1-3.
  Exact: every step is a Bernoulli trial with a *rational* probability, decided by comparing a
  uniform integer with the numerator, so no floating-point number enters the sampler and the
  output law is exactly ``N_Z(0, sigma^2)`` for the integer variance parameter ``sigma^2``
  (Mironov 2012's gaps in the float samplers cannot arise). The uniform integers come from an
  :class:`IntegerSource`: :class:`GeneratorIntegers` (numpy's ``Generator.integers`` with a
  scalar bound, which rejects rather than rounds; seeded mode) or :class:`SecureIntegers`
  (AES-256-CTR keyed from ``os.urandom``, by rejection; secure mode). Vectorised in blocks of
  tries: each stage is one pass over the pending draws under one scalar bound, and
  ``Bernoulli(exp(-1))`` costs one uniform integer (:func:`_bernoulli_exp_minus_one`).
  :func:`discrete_gaussian_rejection` decides its ``exp(-k)``, ``exp(-u / t)`` and geometric
  trials by one uniform 62-bit word against exact integer thresholds ``floor(exp(-x) 2^62)``
  computed in Python integers (ties, chance ``2^-62``, continue digit by digit);
  :func:`discrete_gaussian_chain` is the earlier all-Algorithm-1 form, same law. (Both are
  kept as references for the tests and ``securefed bench discrete-sampler``.)
* :func:`skellam`: ``Poisson(mu) - Poisson(mu)`` (Agarwal, Kairouz and Liu, "The Skellam
  Mechanism for Differentially Private Federated Learning", NeurIPS 2021). It uses numpy's Poisson
  sampler, which is *not* exact in the sense above (it uses floating point for large ``mu``).

Accounting (pure functions; Rényi DP at Opacus's orders, so :class:`PrivacyLedger` composes them
with its Gaussian releases and converts with the same ``get_privacy_spent``):

* :func:`discrete_gaussian_sum_rdp`: the sum of ``n`` independent ``N_Z(0, sigma^2)^d`` vectors
  (each client's noise) shifted by an integer vector of norms ``l2`` and ``l1``. The sum is not
  itself a discrete Gaussian; Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian
  Mechanism for Federated Learning with Secure Aggregation" (ICML 2021, arXiv:2102.06387,
  Proposition 14) bound its Rényi divergence of order ``alpha`` by the least of

      alpha l2^2 / (2 n sigma^2) + tau d,
      alpha / 2 (l2^2 / (n sigma^2) + 2 l1 tau / (sqrt(n) sigma) + tau^2 d),
      alpha / 2 (l2 / (sqrt(n) sigma) + tau sqrt(d))^2,

  with ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))`` (needs ``sigma >= 1/2``).
  ``tests/test_discrete_dp.py`` checks the bound against the exact divergence, computed by
  convolving the probability mass functions.
* :func:`skellam_rdp`: the Skellam mechanism, Agarwal et al. 2021, Theorem 3.5 (multi-dimensional
  Skellam, noise ``Sk(mu, mu)`` of variance ``2 mu`` on the sum):
  ``alpha l2^2 / (4 mu) + min(((2 alpha - 1) l2^2 + 6 l1) / (16 mu^2), 3 l1 / (4 mu))``; also
  checked against the exact divergence in the tests. The sum of ``n`` clients' ``Sk(mu_i, mu_i)``
  is exactly ``Sk(n mu_i, n mu_i)``.
* :func:`rounded_l2_bound`: the norm bound of conditional randomised rounding (Kairouz et al.
  2021, Theorem 1, eq. 2), and :func:`integer_l1_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from securefed.crypto.prg import SecureWords

# Uniform integers are drawn below den * K: keep it well inside int64.
_INT_LIMIT = 1 << 62


# ----------------------------------------------------------------------------- integer sources
_FACTORIAL_20 = math.factorial(20)  # 2432902008176640000 < 2^62


@runtime_checkable
class IntegerSource(Protocol):
    """Where the exact samplers' uniform integers come from.

    Attributes:
        secure: whether the source is cryptographic (unpredictable without a seed).
        name: short description, recorded in views.
    """

    secure: bool
    name: str

    def below(self, high: int, size: int) -> np.ndarray:
        """``size`` independent uniform int64 draws on ``{0, ..., high - 1}`` (no bias)."""

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform float64 draws on ``[0, 1)`` (randomised rounding's coins)."""


class GeneratorIntegers:
    """Reproducible uniform integers from a numpy ``Generator``: tests and benchmarks only.

    ``Generator.integers`` with a scalar bound rejects rather than reduces (Lemire's method), so
    its draws are exactly uniform.
    """

    secure = False
    name = "seeded-numpy"

    def __init__(self, generator: np.random.Generator) -> None:
        _check_generator(generator)
        self.generator = generator

    def below(self, high: int, size: int) -> np.ndarray:
        return self.generator.integers(0, high, size, dtype=np.int64)

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.generator.random(shape)


class SecureIntegers:
    """Uniform integers from an AES-256-CTR keystream keyed with 32 bytes of ``os.urandom``.

    Uniform on ``{0, ..., high - 1}`` by rejection: each 64-bit keystream word is cut to the
    bit length ``b`` of ``high - 1`` (its low ``b`` bits, uniform on ``[0, 2^b)``) and kept only
    below ``high`` (more than half are kept); the rejected draws are redrawn. No reduction
    modulo ``high``, so no modulo bias. The key is refreshed every ``2^36`` bytes, far before
    the 2^64-block counter could wrap. Refuses a seed: there is none to give.
    """

    secure = True
    name = "aes-256-ctr(os.urandom)"

    def __init__(self) -> None:
        self._source = SecureWords("aes-256-ctr")

    def below(self, high: int, size: int) -> np.ndarray:
        if not 1 <= high <= _INT_LIMIT:
            raise ValueError(f"the uniform range must lie in [1, 2^62], got {high}")
        out = np.empty(size, np.int64)
        mask = np.uint64((1 << max(1, (high - 1).bit_length())) - 1)
        if high > 1 and high & (high - 1) == 0:  # a power of two: every masked word is kept
            return (self._source.words(size) & mask).view(np.int64)  # below 2^62: same values
        filled = 0
        while filled < size:
            need = size - filled
            draws = (self._source.words(need + need // 2 + 8) & mask).astype(np.int64)
            draws = draws[draws < high][:need]
            out[filled : filled + draws.size] = draws
            filled += draws.size
        return out

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        words = self._source.words(count) >> np.uint64(11)
        return (words.astype(np.float64) * (1.0 / (1 << 53))).reshape(shape)


def integer_source(rng: np.random.Generator | IntegerSource) -> IntegerSource:
    """``rng`` as an :class:`IntegerSource` (a numpy ``Generator`` is wrapped).

    Raises:
        TypeError: anything else (e.g. the global ``np.random`` module).
    """
    if isinstance(rng, np.random.Generator):
        return GeneratorIntegers(rng)
    if isinstance(rng, (GeneratorIntegers, SecureIntegers)):
        return rng
    raise TypeError(f"rng must be a numpy Generator or an IntegerSource, got {type(rng).__name__}")


# ----------------------------------------------------------------------------- exact samplers
def _check_generator(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")


def _bernoulli_exp_minus_one(size: int, source: IntegerSource) -> np.ndarray:
    """``size`` exact ``Bernoulli(exp(-1))`` draws from one uniform integer each (Algorithm 1).

    Algorithm 1 at ``gamma = 1`` draws ``A_K ~ Bernoulli(1 / K)`` for ``K = 1, 2, ...`` until
    one is 0 and answers 1 iff that ``K`` is odd (``A_1`` is always 1). For ``U`` uniform on
    ``{0, ..., 20! - 1}``, the events ``U = 0 (mod j!)`` for ``j = 2..20`` have exactly the
    law of ``A_2 = ... = A_j = 1`` (``P = 1 / j!``, and each is contained in the previous), so
    ``K`` is the first ``j`` with ``U != 0 (mod j!)``. The draws with ``U = 0`` (probability
    ``1 / 20!``) continue the algorithm at ``K = 21`` with fresh uniforms.
    """
    result = np.zeros(size, bool)
    draws = source.below(_FACTORIAL_20, size)
    alive = np.flatnonzero((draws & 1) == 0)  # K >= 3; K = 2 answers 0 (already so)
    values = draws[alive]
    factorial = 2
    for k in range(3, 21):
        factorial *= k
        going = values % factorial == 0
        if k % 2 == 1:
            result[alive[~going]] = True
        alive, values = alive[going], values[going]
        if not alive.size:
            return result
    k = 21
    while alive.size:
        going = source.below(k, alive.size) == 0
        if k % 2 == 1:
            result[alive[~going]] = True
        alive = alive[going]
        k += 1
    return result


def _bernoulli_exp_neg_fraction(num: np.ndarray, den: int, source: IntegerSource) -> np.ndarray:
    """``Bernoulli(exp(-num / den))`` for ``0 <= num <= den`` and one scalar ``den`` (Alg. 1).

    Draw ``A_K ~ Bernoulli(num / (den K))`` for ``K = 1, 2, ...`` until one is 0; the answer is
    1 iff that ``K`` is odd. ``A_K`` is ``U < num`` for ``U`` uniform on ``{0, ..., den K - 1}``.
    Every pending draw is at the same ``K`` (they advance together), so each pass is one
    uniform draw per pending element under one scalar bound.
    """
    if den >= _INT_LIMIT:
        raise OverflowError("Bernoulli(exp(-x)) denominator beyond 2^62")
    going = source.below(den, num.size) < num
    result = ~going  # K = 1 answers 1
    alive = np.flatnonzero(going)
    nums = num[alive]
    k = 2
    while alive.size:
        high = den * k
        if high >= _INT_LIMIT:
            raise OverflowError("Bernoulli(exp(-x)) denominator beyond 2^62")
        going = source.below(high, alive.size) < nums
        if k % 2 == 1:
            result[alive[~going]] = True
        alive, nums = alive[going], nums[going]
        k += 1
    return result


def _bernoulli_exp_neg_split(
    whole: np.ndarray, remainder: np.ndarray, den: int, source: IntegerSource
) -> np.ndarray:
    """``Bernoulli(exp(-(whole + remainder / den)))``, ``0 <= remainder < den`` (Algorithm 1).

    ``floor(gamma)`` independent ``Bernoulli(exp(-1))`` trials must all succeed, then one
    ``Bernoulli(exp(-remainder / den))``; the pending set shrinks as trials fail.
    """
    result = np.ones(whole.size, bool)
    alive = np.flatnonzero(whole > 0)
    left = whole[alive]
    while alive.size:
        passed = _bernoulli_exp_minus_one(alive.size, source)
        result[alive[~passed]] = False
        left = left - 1
        going = passed & (left > 0)
        alive, left = alive[going], left[going]
    survivors = np.flatnonzero(result)
    result[survivors] = _bernoulli_exp_neg_fraction(remainder[survivors], den, source)
    return result


def bernoulli_exp_neg(
    num: np.ndarray | int, den: np.ndarray | int, rng: np.random.Generator | IntegerSource
) -> np.ndarray:
    """Exact ``Bernoulli(exp(-num / den))`` draws, one per element (CKS 2020, Algorithm 1).

    For ``gamma = num / den > 1``: ``floor(gamma)`` independent ``Bernoulli(exp(-1))`` trials must
    all succeed, then one ``Bernoulli(exp(-(gamma - floor(gamma))))``.

    Args:
        num: non-negative integer numerators (array or scalar).
        den: positive integer denominators (broadcast against ``num``).
        rng: the generator or integer source.

    Returns:
        A boolean array of ``num``'s shape.

    Raises:
        ValueError: a negative numerator or a non-positive denominator.
    """
    source = integer_source(rng)
    num, den = np.broadcast_arrays(np.asarray(num, np.int64), np.asarray(den, np.int64))
    num, den = num.ravel(), den.ravel()
    if num.size and (num.min() < 0 or den.min() <= 0):
        raise ValueError("bernoulli_exp_neg needs num >= 0 and den > 0")
    result = np.empty(num.size, bool)
    for value in np.unique(den).tolist():  # one scalar denominator per pass
        where = np.flatnonzero(den == value)
        whole, remainder = np.divmod(num[where], value)
        result[where] = _bernoulli_exp_neg_split(whole, remainder, int(value), source)
    return result


def _geometric_exp_neg_one(size: int, source: IntegerSource) -> np.ndarray:
    """``Geometric(1 - exp(-1))`` on ``{0, 1, ...}``: ``Bernoulli(exp(-1))`` successes before
    the first failure."""
    counts = np.zeros(size, np.int64)
    alive = np.arange(size)
    while alive.size:
        alive = alive[_bernoulli_exp_minus_one(alive.size, source)]
        counts[alive] += 1
    return counts


def _laplace_candidates(t: int, size: int, source: IntegerSource) -> tuple[np.ndarray, np.ndarray]:
    """The accepted ones of ``size`` tries of CKS Algorithm 2: (magnitudes, negative signs).

    One try: ``U`` uniform on ``{0, ..., t - 1}``, kept with probability ``exp(-U / t)``;
    ``V ~ Geometric(1 - exp(-1))``; a sign; ``-0`` is refused. The accepted tries, in order,
    are independent draws of ``DLap(t)``.
    """
    u = source.below(t, size)
    u = u[_bernoulli_exp_neg_fraction(u, t, source)]
    v = _geometric_exp_neg_one(u.size, source)
    negative = source.below(2, u.size) == 1
    keep = ~(negative & (u == 0) & (v == 0))  # -0 would count zero twice
    return (u + t * v)[keep], negative[keep]


def discrete_laplace(scale: int, size: int, rng: np.random.Generator | IntegerSource) -> np.ndarray:
    """Exact draws of the discrete Laplace law ``P(x) ∝ exp(-|x| / scale)`` (CKS, Algorithm 2).

    Args:
        scale: the integer scale ``t >= 1``.
        size: how many draws.
        rng: the generator or integer source.

    Returns:
        ``size`` int64 draws.
    """
    source = integer_source(rng)
    if isinstance(scale, bool) or int(scale) != scale or scale < 1:
        raise ValueError(f"the discrete Laplace scale must be an integer >= 1, got {scale!r}")
    t = int(scale)
    out = np.empty(size, np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        magnitude, negative = _laplace_candidates(t, need + need // 2 + 16, source)
        values = np.where(negative, -magnitude, magnitude)[:need]
        out[filled : filled + values.size] = values
        filled += values.size
    return out


# ----------------------------------------------------------------------------- threshold sampler
# Uniform words on [0, 2^62): below(2^62) is a plain 62-bit mask in both sources (no rejection).
_WORD_BITS = 62
_WORD = 1 << _WORD_BITS
# e^-k * 2^62 >= 1 for k <= 42, so k >= 43 has threshold 0 (decided by the tie rule alone).
_EXP_TABLE_LENGTH = 44


def _exp_neg_floor(a: int, b: int, bits: int) -> int:
    """``floor(exp(-a / b) * 2^bits)`` exactly, for integers ``a >= 0``, ``b >= 1``.

    Interval arithmetic in Python integers: the Taylor terms of ``exp(a / b)`` at a fixed point of
    ``p`` bits are rounded down (a lower sum) and up (an upper sum, plus the series' tail bound
    ``term * x / (k + 1 - x)`` once ``k + 1 > 2 x``); ``exp(-a / b)`` lies between the
    reciprocals. When the two reciprocals' floors differ the precision doubles, so the answer is
    certain, never a floating-point estimate.
    """
    if a == 0:
        return 1 << bits
    precision = bits + 96
    while True:
        one = 1 << precision
        low_term, high_term, low_sum, high_sum, k = one, one, one, one, 0
        while True:
            k += 1
            low_term = low_term * a // (b * k)
            high_term = -((-high_term * a) // (b * k))
            low_sum += low_term
            high_sum += high_term
            if b * (k + 1) >= 2 * a and high_term <= 1:
                # the tail: sum_{j > k} x^j / j! <= x^k / k! when k + 1 >= 2 x
                high_sum += high_term
                break
        scale = 1 << (precision + bits)
        low, high = scale // high_sum, scale // low_sum
        if low == high:
            return low
        precision *= 2


def _digit(a: int, b: int, index: int) -> int:
    """The ``index``-th 62-bit digit (index 0 is the integer threshold) of ``exp(-a / b)``.

    0 without computing when ``a / b >= 43 (index + 1)``: ``exp(-43) < 2^-62``.
    """
    if a >= 43 * b * (index + 1):
        return 0
    return _exp_neg_floor(a, b, _WORD_BITS * (index + 1)) % _WORD


def _resolve_tie(a: int, b: int, source: IntegerSource) -> bool:
    """``X < exp(-a / b)`` for a uniform real ``X`` whose first 62-bit word equals the threshold.

    The next words of ``X`` are drawn one at a time and compared with the next 62-bit digits of
    ``exp(-a / b)`` (irrational for ``a > 0``, so the comparison ends with probability 1).
    """
    index = 1
    while True:
        word = int(source.below(_WORD, 1)[0])
        digit = _digit(a, b, index)
        if word != digit:
            return word < digit
        index += 1


@lru_cache(maxsize=1)
def _exp_neg_integer_thresholds() -> np.ndarray:
    """``floor(exp(-k) * 2^62)`` for ``k = 0 .. 43`` (int64; the last ones are 0)."""
    return np.array([_exp_neg_floor(k, 1, _WORD_BITS) for k in range(_EXP_TABLE_LENGTH)], np.int64)


@lru_cache(maxsize=8)
def _exp_neg_over_t_thresholds(t: int) -> np.ndarray:
    """``floor(exp(-u / t) * 2^62)`` for ``u = 0 .. t - 1`` (int64), exactly.

    Powers of an interval around ``exp(-1 / t)`` at 192 bits, rounded down and up, bound each
    ``exp(-u / t)``; an entry whose bounds straddle a multiple of ``2^-62`` is computed alone by
    :func:`_exp_neg_floor`.
    """
    precision = 192
    shift = precision - _WORD_BITS
    ratio_low = _exp_neg_floor(1, t, precision)
    ratio_high = ratio_low + 1
    out = np.empty(t, np.int64)
    low = high = 1 << precision
    for u in range(t):
        floor_low, floor_high = low >> shift, high >> shift
        out[u] = floor_low if floor_low == floor_high else _exp_neg_floor(u, t, _WORD_BITS)
        low = (low * ratio_low) >> precision
        high = -((-high * ratio_high) >> precision)
    return out


def _below_thresholds(
    thresholds: np.ndarray, exponents: np.ndarray, den: int, source: IntegerSource
) -> np.ndarray:
    """Exact ``Bernoulli(exp(-exponents / den))`` given ``thresholds = floor(exp(-.) * 2^62)``.

    One uniform 62-bit word ``W`` per element, read as the first digits of a uniform real ``X``:
    ``W < threshold`` means ``X < exp(-.)``, ``W > threshold`` the opposite, and a tie (chance
    ``2^-62``) draws further words (:func:`_resolve_tie`).
    """
    words = source.below(_WORD, thresholds.size)
    result = words < thresholds
    for k in np.flatnonzero(words == thresholds).tolist():
        result[k] = _resolve_tie(int(exponents[k]), den, source)
    return result


def _geometric_by_inversion(size: int, source: IntegerSource) -> np.ndarray:
    """``Geometric(1 - exp(-1))`` on ``{0, 1, ...}``: ``#{v >= 1 : X < exp(-v)}``, one word each.

    ``P(V >= v) = exp(-v)``; the 62-bit word ``W`` of ``X`` counts the thresholds above it, and
    a tie (``W`` equal to a threshold, 0 included) is resolved digit by digit.
    """
    table = _exp_neg_integer_thresholds()[1:]  # k = 1 .. 43, decreasing
    ascending = table[::-1]
    words = source.below(_WORD, size)
    position = np.searchsorted(ascending, words, side="left")
    tie = ascending[np.minimum(position, table.size - 1)] == words
    counts = table.size - position - tie  # the thresholds strictly above the word
    tied = np.flatnonzero(tie)
    for k in tied.tolist():
        counts[k] = _geometric_tie(int(words[k]), source)
    return counts.astype(np.int64)


def _geometric_tie(word: int, source: IntegerSource) -> int:
    """The geometric draw when its first word equals some ``floor(exp(-v) 2^62)``: exact."""
    table = _exp_neg_integer_thresholds()
    count = int(np.count_nonzero(table[1:] > word))
    words = [word]
    v = count + 1
    while True:  # is X < exp(-v)? compare the digits of X (drawn lazily) with exp(-v)'s
        index = 0
        while True:
            if index == len(words):
                words.append(int(source.below(_WORD, 1)[0]))
            digit = _digit(v, 1, index)
            if words[index] != digit:
                break
            index += 1
        if words[index] > digit:
            return count
        count, v = count + 1, v + 1


def _laplace_tries(t: int, size: int, source: IntegerSource) -> tuple[np.ndarray, np.ndarray]:
    """CKS Algorithm 2's accepted tries out of ``size``, by exact thresholds (magnitudes, signs).

    Same law as :func:`_laplace_candidates`: ``U`` uniform below ``t`` and the sign from one
    uniform integer below ``2 t``; ``U`` kept when ``X < exp(-U / t)`` (a table of exact 62-bit
    thresholds); ``V ~ Geometric(1 - exp(-1))`` by inversion; ``-0`` refused.
    """
    draws = source.below(2 * t, size)
    u, negative = draws >> 1, (draws & 1) == 1
    kept = _below_thresholds(_exp_neg_over_t_thresholds(t)[u], u, t, source)
    u, negative = u[kept], negative[kept]
    v = _geometric_by_inversion(u.size, source)
    keep = ~(negative & (u == 0) & (v == 0))
    return (u + t * v)[keep], negative[keep]


def _accept_gaussian(
    whole: np.ndarray, remainder: np.ndarray, den: int, source: IntegerSource
) -> np.ndarray:
    """``Bernoulli(exp(-whole)) * Bernoulli(exp(-remainder / den))``, the first by one word.

    ``exp(-whole)`` against the table ``floor(exp(-k) 2^62)`` (``whole >= 43`` has threshold 0:
    only a tie at ``W = 0`` can pass, resolved exactly); the fraction by Algorithm 1's chain.
    """
    table = _exp_neg_integer_thresholds()
    capped = np.minimum(whole, _EXP_TABLE_LENGTH - 1)
    result = _below_thresholds(table[capped], whole, 1, source)
    survivors = np.flatnonzero(result)
    result[survivors] = _bernoulli_exp_neg_fraction(remainder[survivors], den, source)
    return result


MAX_INTEGER_VARIANCE = 1 << 28
"""The sampler's largest variance: ``2 sigma^2 t^2`` (the acceptance denominator) stays below
``2^58``, so every uniform integer it draws fits in int64. A mechanism coarsens its grid to stay
under it (:func:`securefed.transport.ddp.plan_mechanism`)."""

# Tries of Algorithm 3 drawn per wanted draw (each is kept with probability about 0.48 for
# sigma^2 >= 30: 0.63 for its discrete Laplace proposal, 0.76 for the Gaussian acceptance; 0.35
# at sigma^2 = 1); a block that falls short is topped up with another.
_TRIES_PER_DRAW = 2.5
# At most this many tries at once: the working arrays stay in cache.
_BLOCK = 1 << 18


def _check_variance(sigma2: int) -> int:
    if isinstance(sigma2, bool) or int(sigma2) != sigma2 or not 1 <= sigma2 <= MAX_INTEGER_VARIANCE:
        raise ValueError(
            f"the discrete Gaussian's variance parameter must be an integer in [1, 2^28] (exact "
            f"int64 arithmetic), got {sigma2!r}"
        )
    return int(sigma2)


def _accept_far_tail(gap: int, den: int, source: IntegerSource) -> bool:
    """Algorithm 3's acceptance ``Bernoulli(exp(-gap^2 / den))`` in Python integers (any size)."""
    whole, remainder = divmod(gap * gap, den)
    for _ in range(whole):  # stops at the first failure, after 1.6 trials on average
        if not _bernoulli_exp_minus_one(1, source)[0]:
            return False
    return bool(_bernoulli_exp_neg_fraction(np.array([remainder], np.int64), den, source)[0])


def discrete_gaussian_rejection(
    sigma2: int, size: int, rng: np.random.Generator | IntegerSource
) -> np.ndarray:
    """Exact ``N_Z(0, sigma2)`` by rejection (the sampler before :func:`discrete_gaussian`).

    Same law as :func:`discrete_gaussian`, about 10x slower; kept as the reference that
    ``tests/test_discrete_dp.py`` and ``benchmarks/bench_discrete_sampler.py`` compare with.
    Canonne, Kamath and Steinke 2020, Algorithm 3: ``t = floor(sigma) + 1``; draw
    ``Y ~ DLap(t)`` and accept it with probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``,
    which for an integer ``sigma2`` is ``exp(-(|Y| t - sigma2)^2 / (2 sigma2 t^2))``: a ratio of
    integers, decided by Algorithm 1 with uniform integers only.

    Blocks: about ``2.5 size`` independent tries run at once, every stage a vectorised pass with
    one scalar bound, and the first ``size`` accepted tries (in the order drawn) are returned.
    The accepted tries of an i.i.d. sequence are i.i.d. draws of the target law, and which ones
    are returned depends only on their positions, so the output law is exact; a block that
    falls short is topped up with another. The trials with few distinct exponents use exact
    thresholds (:func:`_laplace_tries`, :func:`_accept_gaussian`): ``U`` and the sign from one
    integer below ``2 t``, ``exp(-U / t)``, ``Geometric(1 - exp(-1))`` and ``exp(-whole)`` from
    one 62-bit word each; ``exp(-remainder / den)`` by Algorithm 1. Arguments, result and
    errors as :func:`discrete_gaussian`.

    The numerator ``(|Y| t - sigma2)^2`` is split into whole multiples of the denominator and a
    remainder in int64 where ``|gap| < 2^31``, and in Python integers for the rare tries beyond
    (far in the tail, accepted with probability below ``exp(-30)``).
    """
    return _gaussian_blocks(sigma2, size, rng, _laplace_tries, _accept_gaussian)


def discrete_gaussian_chain(
    sigma2: int, size: int, rng: np.random.Generator | IntegerSource
) -> np.ndarray:
    """The first form of :func:`discrete_gaussian_rejection`: every ``exp`` trial by Algorithm 1.

    Same law (exact ``N_Z(0, sigma2)``), about 1.2x slower; kept as the reference the tests and
    ``benchmarks/bench_discrete_sampler.py`` compare the other samplers with.
    """
    return _gaussian_blocks(sigma2, size, rng, _laplace_candidates, _bernoulli_exp_neg_split)


def _gaussian_blocks(sigma2, size, rng, tries, accept_trial) -> np.ndarray:
    """CKS Algorithm 3 in blocks: the proposal ``tries``, the acceptance ``accept_trial``."""
    sigma2 = _check_variance(sigma2)
    source = integer_source(rng)
    t = math.isqrt(sigma2) + 1
    den = 2 * sigma2 * t * t
    out = np.empty(size, np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        magnitude, negative = tries(t, min(_BLOCK, int(need * _TRIES_PER_DRAW) + 32), source)
        gap = magnitude * t - sigma2
        far = np.abs(gap) >= (1 << 31)
        if far.any():
            gap = np.where(far, 0, gap)
        whole, remainder = np.divmod(gap * gap, den)
        accept = accept_trial(whole, remainder, den, source)
        for k in np.flatnonzero(far).tolist():  # exact, in Python integers
            accept[k] = _accept_far_tail(int(magnitude[k]) * t - sigma2, den, source)
        values = np.where(negative, -magnitude, magnitude)[accept][:need]
        out[filled : filled + values.size] = values
        filled += values.size
    return out


# ----------------------------------------------------------------------------- inversion sampler
# Guide table: the top 18 bits of a 62-bit word pick a bucket of the CDF table (2^18 int32
# entries, 1 MiB: in cache; 18 bits leave about 0.2% of the draws to the binary search).
_GUIDE_BITS = 18
_GUIDE_SHIFT = _WORD_BITS - _GUIDE_BITS
# Margin of the interval arithmetic beyond the bits asked for (the straddle chance per entry is
# about 2^-64 times the accumulated width; a straddle only raises the precision).
_GUARD_BITS = 64


@lru_cache(maxsize=2)
def _gaussian_tail_sums(sigma2: int, bits: int) -> tuple[int, int, list[int], list[int], int]:
    """Certified bounds on the tail sums ``T(m) = sum_{k >= m} exp(-k^2 / (2 sigma2))``.

    Fixed point at ``p = bits + 2 * 64 + bitlen(2 sigma2 + 1)`` bits, Python integers only:
    ``e_0 = 1``, ``e_{k+1} = e_k r_k`` with ``r_k = exp(-(2k + 1) / (2 sigma2)) = a b^k``,
    ``a = exp(-1 / (2 sigma2))``, ``b = a^2``; lower bounds round every product down, upper
    bounds up (``floor(a 2^p) + 1 > a 2^p`` because ``a`` is irrational). The terms stop at the
    first ``K`` with ``e_K (2 sigma2 + 1) <= 2^-(bits + 64)``: since
    ``e_{K+i} / e_K = exp(-(2 K i + i^2) / (2 sigma2)) <= a^i``, the rest of the series is at
    most ``e_K a / (1 - a) <= e_K (2 sigma2 + 1)``, which the upper bounds add.

    Returns:
        ``(p, K, low, high, tail)``: ``low[m] <= T(m) 2^p <= high[m]`` for ``m = 0 .. K + 1``
        (``T(m)`` for ``m > K + 1`` lies in ``[0, tail]``).
    """
    bound = 2 * sigma2 + 1
    precision = bits + 2 * _GUARD_BITS + bound.bit_length()
    tail = 1 << (precision - bits - _GUARD_BITS)
    one = 1 << precision
    a_low = _exp_neg_floor(1, 2 * sigma2, precision)
    a_high = a_low + 1
    b_low, b_high = (a_low * a_low) >> precision, -((-a_high * a_high) >> precision)
    lows, highs = [one], [one]
    e_low = e_high = one
    r_low, r_high = a_low, a_high
    while highs[-1] * bound > tail:
        e_low, e_high = (e_low * r_low) >> precision, -((-e_high * r_high) >> precision)
        r_low, r_high = (r_low * b_low) >> precision, -((-r_high * b_high) >> precision)
        lows.append(e_low)
        highs.append(e_high)
    low, high = [0], [tail]  # T(K + 1), then T(K), ..., T(0)
    for e_l, e_h in zip(reversed(lows), reversed(highs), strict=True):
        low.append(low[-1] + e_l)
        high.append(high[-1] + e_h)
    return precision, len(lows) - 1, low[::-1], high[::-1], tail


def _cdf_floor_bounds(sums: tuple[int, int, list[int], list[int], int], y: int, bits: int):
    """Bounds ``(lo, hi)`` on ``floor(F(y) 2^bits)``, ``F`` the CDF of ``N_Z(0, sigma2)``.

    ``F(y) = T(-y) / Z`` for ``y < 0`` and ``(Z - T(y + 1)) / Z`` for ``y >= 0``, with
    ``Z = 2 T(1) + 1``; ``F(y) < 1`` caps the upper bound at ``2^bits - 1``.
    """
    precision, k_max, low, high, tail = sums
    z_low, z_high = 2 * low[1] + (1 << precision), 2 * high[1] + (1 << precision)

    def tail_sum(m: int) -> tuple[int, int]:
        return (low[m], high[m]) if m <= k_max + 1 else (0, tail)

    if y < 0:
        s_low, s_high = tail_sum(-y)
    else:
        t_low, t_high = tail_sum(y + 1)
        s_low, s_high = z_low - t_high, z_high - t_low
    top = (1 << bits) - 1
    return (max(s_low, 0) << bits) // z_high, min((s_high << bits) // z_low, top)


def _cdf_floor(sigma2: int, y: int, bits: int) -> int:
    """``floor(F(y) 2^bits)`` exactly: the bounds at more precision until they agree."""
    extra = 0
    while True:
        sums = _gaussian_tail_sums(sigma2, bits + extra)
        low, high = _cdf_floor_bounds(sums, y, bits + extra)
        if low == high:
            return low >> extra
        extra += _GUARD_BITS


@lru_cache(maxsize=8)
def _inversion_table(sigma2: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The exact 62-bit CDF table of ``N_Z(0, sigma2)`` and its guide: ``(K, cdf, guide)``.

    ``cdf[i] = floor(F(i - K) 2^62)`` for ``i = 0 .. 2K`` (int64, non-decreasing), with
    ``cdf[0] = 0`` and ``cdf[2K] = 2^62 - 1`` (``K`` from :func:`_gaussian_tail_sums`, so
    ``F(-K) < 2^-62`` and ``1 - F(K) < 2^-62``). ``guide[h]`` (int32) is the first index whose
    entry exceeds ``h 2^44`` when the bucket ``[h 2^44, (h + 1) 2^44)`` holds at most one entry
    and its start is no entry; otherwise ``-1`` (the bucket is searched in full).
    """
    sums = _gaussian_tail_sums(sigma2, _WORD_BITS)
    k_max = sums[1]
    entries = []
    for y in range(-k_max, k_max + 1):
        low, high = _cdf_floor_bounds(sums, y, _WORD_BITS)
        entries.append(low if low == high else _cdf_floor(sigma2, y, _WORD_BITS))
    cdf = np.array(entries, np.int64)
    if cdf[0] != 0 or cdf[-1] != _WORD - 1 or np.any(np.diff(cdf) < 0):
        raise ArithmeticError("the discrete Gaussian CDF table is not a closed monotone table")
    starts = np.arange(0, (1 << _GUIDE_BITS) + 1, dtype=np.int64) << _GUIDE_SHIFT
    first = np.searchsorted(cdf, starts, side="right")
    single = (first[1:] - first[:-1] <= 1) & (cdf[first[:-1] - 1] != starts[:-1])
    guide = np.where(single, first[:-1], -1).astype(np.int32)
    cdf.flags.writeable = guide.flags.writeable = False  # shared by every call (cached)
    return k_max, cdf, guide


def _invert_words(
    words: np.ndarray, k_max: int, cdf: np.ndarray, guide: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """``out = min{y : X < F(y)}`` for each 62-bit word; returns the words that need more care.

    For ``X`` uniform on ``[0, 1)`` with first word ``W``: an entry ``cdf[i] > W`` means
    ``X < (W + 1) 2^-62 <= F(i - K)``, an entry ``cdf[i] < W`` means ``X >= F(i - K)``, so
    the answer is the first index with ``cdf[i] > W``, unless ``W`` equals an entry (then the
    next words decide). In a guided bucket that index is ``lo`` or ``lo + 1``.

    Returns:
        The positions whose bucket is unguided or whose word equals an entry (``out`` is not
        valid there).
    """
    lo = guide[words >> _GUIDE_SHIFT]
    entry = cdf[lo]
    np.add(lo, entry <= words, out=out)
    out -= k_max
    return np.flatnonzero((lo < 0) | (entry == words))


def _resolve_inversion(sigma2: int, word: int, source: IntegerSource) -> int:
    """The exact draw for a first word equal to a table entry (chance about ``2K 2^-62``).

    Further words of ``X`` are drawn as needed and compared with further exact digits of
    ``F(y)`` (:func:`_cdf_floor`); ``X < F(y)`` is monotone in ``y``, so the answer is found
    by a search: outward from the run of entries equal to ``word`` (by doubling steps past the
    table's ends, where the run may continue), then by bisection.
    """
    k_max, cdf, _ = _inversion_table(sigma2)
    digits = [word]

    def below(y: int) -> bool:  # X < F(y)?
        prefix, index = word, 0
        while True:
            bits = _WORD_BITS * (index + 1)
            floor = _cdf_floor(sigma2, y, bits)
            if prefix != floor:
                return prefix < floor
            index += 1
            if index == len(digits):
                digits.append(int(source.below(_WORD, 1)[0]))
            prefix = (prefix << _WORD_BITS) | digits[index]

    first = int(np.searchsorted(cdf, word, side="left"))
    last = int(np.searchsorted(cdf, word, side="right"))
    low, high = first - 1 - k_max, last - k_max  # X >= F(low) when first > 0; X < F(high)
    step = 1
    while first == 0 and below(low):  # the run reaches F(-K): look further down
        high, low, step = low, low - step, 2 * step
    step = 1
    while last == cdf.size and not below(high):
        low, high, step = high, high + step, 2 * step
    while high - low > 1:
        middle = (low + high) // 2
        if below(middle):
            high = middle
        else:
            low = middle
    return high


def discrete_gaussian(
    sigma2: int, size: int, rng: np.random.Generator | IntegerSource
) -> np.ndarray:
    """Exact draws of ``N_Z(0, sigma2)``: ``P(x) ∝ exp(-x^2 / (2 sigma2))`` on the integers.

    Inversion of the exact CDF ``F``: for ``X`` uniform on ``[0, 1)`` the draw is
    ``min{y : X < F(y)}``, whose law is exactly ``N_Z(0, sigma2)``. ``X`` is read one 62-bit
    word at a time, and only as far as needed:

    * the first word ``W`` is compared with the table ``c(y) = floor(F(y) 2^62)``
      (:func:`_inversion_table`), computed once per ``sigma2`` by certified interval
      arithmetic in Python integers (:func:`_gaussian_tail_sums`: every product rounded
      down for the lower bound and up for the upper, a floor taken only when both bounds
      give it; no floating-point number enters the table or any comparison). Since
      ``X`` lies in ``[W, W + 1) 2^-62`` and ``F(y)`` in ``[c, c + 1) 2^-62``: ``W > c``
      gives ``X >= (c + 1) 2^-62 > F(y)`` and ``W < c`` gives ``X < (W + 1) 2^-62 <= F(y)``,
      so the draw is decided unless ``W`` equals an entry;
    * ``W`` equal to an entry (chance below ``(2 K + 1) 2^-62``, ``K`` about ``14.3 sigma``)
      draws further words and compares them with further exact digits of ``F``
      (:func:`_resolve_inversion`; it ends with probability 1, each further word deciding
      all but a ``2^-62`` share), so the answer is exact, not rounded to 62 bits.

    A guide table on the top 18 bits of ``W`` locates the entry in one step in most buckets;
    the other buckets (the tails, where many entries share one) use a binary search. Blocks of
    :data:`_BLOCK` words from the source at a time (one uniform word a draw), so the secure
    source's AES-CTR keystream is drawn in large batches. Same law as the rejection samplers
    of Canonne, Kamath and Steinke 2020 (:func:`discrete_gaussian_rejection`,
    :func:`discrete_gaussian_chain`); ``tests/test_discrete_dp.py`` compares them.

    Args:
        sigma2: the integer variance parameter ``sigma^2 >= 1``.
        size: how many draws.
        rng: the generator (seeded, tests and benchmarks) or an :class:`IntegerSource`
            (:class:`SecureIntegers` in secure mode).

    Returns:
        ``size`` int64 draws.

    Raises:
        ValueError: ``sigma2`` not an integer in ``[1, MAX_INTEGER_VARIANCE]``.
        TypeError: ``rng`` neither a numpy Generator nor an integer source.
    """
    sigma2 = _check_variance(sigma2)
    source = integer_source(rng)
    k_max, cdf, guide = _inversion_table(sigma2)
    out = np.empty(size, np.int64)
    for start in range(0, size, _BLOCK):
        draws = out[start : start + _BLOCK]
        words = source.below(_WORD, draws.size)
        special = _invert_words(words, k_max, cdf, guide, draws)
        if special.size:
            index = np.searchsorted(cdf, words[special], side="right")
            draws[special] = index - k_max
            for k in special[cdf[index - 1] == words[special]].tolist():
                draws[k] = _resolve_inversion(sigma2, int(words[k]), source)
    return out


def discrete_gaussian_pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    """``P(X = x)`` of ``N_Z(0, sigma2)`` at each ``x`` of ``support`` (normalised numerically).

    The normalising constant sums ``exp(-k^2 / (2 sigma2))`` over ``|k| <= 40 sigma + 40``; the
    terms left out are below ``exp(-800)``.
    """
    reach = int(40 * math.sqrt(sigma2)) + 40
    k = np.arange(-reach, reach + 1, dtype=np.float64)
    norm = float(np.exp(-(k * k) / (2 * sigma2)).sum())
    x = np.asarray(support, dtype=np.float64)
    return np.exp(-(x * x) / (2 * sigma2)) / norm


def skellam(mu: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``Poisson(mu) - Poisson(mu)`` draws (variance ``2 mu``; numpy's Poisson, not exact)."""
    _check_generator(rng)
    if not (math.isfinite(mu) and mu > 0):
        raise ValueError(f"the Skellam parameter must be finite and > 0, got {mu!r}")
    return rng.poisson(mu, size).astype(np.int64) - rng.poisson(mu, size).astype(np.int64)


# ----------------------------------------------------------------------------- accounting
def _orders(orders: Sequence[float]) -> np.ndarray:
    alphas = np.asarray(orders, dtype=np.float64)
    if alphas.ndim != 1 or not alphas.size or np.any(alphas <= 1):
        raise ValueError("Rényi orders must be a non-empty list of numbers > 1")
    return alphas


def ddg_tau(sigma2: float, n: int) -> float:
    """``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))`` (Kairouz et al. 2021)."""
    return 10.0 * sum(math.exp(-2 * math.pi**2 * sigma2 * k / (k + 1)) for k in range(1, int(n)))


def discrete_gaussian_sum_rdp(
    orders: Sequence[float], sigma2: float, n: int, l2: float, l1: float, dim: int
) -> np.ndarray:
    """Rényi DP of the sum of ``n`` clients' ``N_Z(0, sigma2)^dim`` noise at integer shifts.

    Kairouz, Liu and Steinke 2021, Proposition 14 (module docstring): the least of its three
    bounds, at each order.

    Args:
        orders: Rényi orders ``alpha > 1``.
        sigma2: each client's variance parameter (in the integer units of the sum), ``>= 1/4``.
        n: the clients whose noise is in the sum (at least 1).
        l2: the L2 sensitivity of the sum in integer units (one client's rounded vector).
        l1: its L1 sensitivity.
        dim: the number of coordinates.

    Raises:
        ValueError: ``sigma2 < 1/4``, ``n < 1``, negative sensitivities, ``dim < 1``.
    """
    alphas = _orders(orders)
    if not sigma2 >= 0.25:
        raise ValueError(f"the bound needs sigma >= 1/2, got sigma^2 = {sigma2!r}")
    if n < 1 or dim < 1 or l2 < 0 or l1 < 0:
        raise ValueError("need n >= 1, dim >= 1 and non-negative sensitivities")
    tau = ddg_tau(sigma2, n)
    var = n * sigma2
    b1 = alphas * l2 * l2 / (2 * var) + tau * dim
    b2 = alphas / 2 * (l2 * l2 / var + 2 * l1 * tau / math.sqrt(var) + tau * tau * dim)
    b3 = alphas / 2 * (l2 / math.sqrt(var) + tau * math.sqrt(dim)) ** 2
    return np.minimum(np.minimum(b1, b2), b3)


def skellam_rdp(orders: Sequence[float], mu: float, l2: float, l1: float) -> np.ndarray:
    """Rényi DP of the Skellam mechanism: noise ``Sk(mu, mu)`` on the sum (Agarwal et al. 2021).

    ``alpha l2^2 / (4 mu) + min(((2 alpha - 1) l2^2 + 6 l1) / (16 mu^2), 3 l1 / (4 mu))``.

    Args:
        orders: Rényi orders ``alpha > 1``.
        mu: the sum's Skellam parameter (``n`` clients of ``mu_i`` each: ``n mu_i``); its
            variance is ``2 mu``.
        l2, l1: the sum's sensitivities in integer units.
    """
    alphas = _orders(orders)
    if not (math.isfinite(mu) and mu > 0) or l2 < 0 or l1 < 0:
        raise ValueError("need mu > 0 and non-negative sensitivities")
    lead = alphas * l2 * l2 / (4 * mu)
    extra = np.minimum(((2 * alphas - 1) * l2 * l2 + 6 * l1) / (16 * mu * mu), 3 * l1 / (4 * mu))
    return lead + extra


def rounded_l2_bound(clip: float, gamma: float, dim: int, beta: float) -> float:
    """The L2 bound conditional randomised rounding enforces (unscaled units; Kairouz et al.).

    A vector of norm at most ``clip``, scaled by ``1/gamma`` and rounded coordinate-wise at
    random, is kept only when its norm (times ``gamma``) is at most

        min( sqrt(c^2 + gamma^2 d / 4 + sqrt(2 log(1/beta)) gamma (c + gamma sqrt(d) / 2)),
             c + gamma sqrt(d) )

    (Theorem 1, eq. 2); one try passes with probability at least ``1 - beta``. ``beta = 0``
    gives the second (deterministic) bound alone.
    """
    if not (clip > 0 and gamma > 0 and dim >= 1 and 0 <= beta < 1):
        raise ValueError("need clip > 0, gamma > 0, dim >= 1 and beta in [0, 1)")
    worst = clip + gamma * math.sqrt(dim)
    if beta == 0:
        return worst
    squared = (
        clip * clip
        + gamma * gamma * dim / 4
        + math.sqrt(2 * math.log(1 / beta)) * gamma * (clip + gamma * math.sqrt(dim) / 2)
    )
    return min(math.sqrt(squared), worst)


def integer_l1_bound(l2: float, dim: int) -> float:
    """L1 bound of an integer vector of L2 norm at most ``l2`` in ``dim`` coordinates.

    ``min(sqrt(d) l2, l2^2)``: Cauchy-Schwarz, and ``|v_j| <= v_j^2`` for every integer ``v_j``.
    """
    return min(math.sqrt(dim) * l2, l2 * l2)


DISCRETE_MECHANISMS = ("discrete_gaussian", "skellam")


@dataclass(frozen=True)
class DiscreteRelease:
    """One release of a sum of integer noise, as the ledger charges it (JSON-ready).

    Attributes:
        mechanism: ``"discrete_gaussian"`` or ``"skellam"``.
        noise: each contributor's integer variance ``sigma_i^2`` (discrete Gaussian) or
            Skellam parameter ``mu_i``.
        n: the contributors whose noise is in the sum.
        l2, l1: the sum's sensitivities in integer units (one client's rounded vector).
        dim: the coordinates.
    """

    mechanism: str
    noise: float
    n: int
    l2: float
    l1: float
    dim: int

    def __post_init__(self) -> None:
        if self.mechanism not in DISCRETE_MECHANISMS:
            raise ValueError(
                f"mechanism must be one of {DISCRETE_MECHANISMS}, got {self.mechanism!r}"
            )
        values = (self.noise, self.l2, self.l1)
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        ):
            raise ValueError(f"a discrete release needs finite numbers, got {values!r}")
        for name in ("n", "dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"a discrete release needs {name} >= 1, got {value!r}")
        if self.noise <= 0 or self.l2 < 0 or self.l1 < 0:
            raise ValueError("a discrete release needs noise > 0 and non-negative sensitivities")
        if self.mechanism == "discrete_gaussian" and self.noise < 0.25:
            raise ValueError(f"the discrete Gaussian bound needs sigma^2 >= 1/4, got {self.noise}")

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """Its Rényi DP at ``orders`` (:func:`discrete_gaussian_sum_rdp` / :func:`skellam_rdp`)."""
        if self.mechanism == "discrete_gaussian":
            return discrete_gaussian_sum_rdp(orders, self.noise, self.n, self.l2, self.l1, self.dim)
        return skellam_rdp(orders, self.n * self.noise, self.l2, self.l1)

    def as_list(self) -> list[object]:
        """``[mechanism, noise, n, l2, l1, dim]`` (the ledger's JSON form)."""
        return [
            self.mechanism,
            float(self.noise),
            int(self.n),
            float(self.l2),
            float(self.l1),
            int(self.dim),
        ]

    @classmethod
    def from_list(cls, entry: object) -> DiscreteRelease:
        """Parse :meth:`as_list` (raises ``ValueError`` naming the entry)."""
        if not isinstance(entry, (list, tuple)) or len(entry) != 6:
            raise ValueError(f"a discrete release is [mechanism, noise, n, l2, l1, dim]: {entry!r}")
        return cls(*entry)
