"""Distributed DP that is exact in integers: the distributed discrete Gaussian and Skellam.

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning
with Secure Aggregation" (ICML 2021), and Agarwal, Kairouz and Liu, "The Skellam Mechanism for
Differentially Private Federated Learning" (NeurIPS 2021). Each client, on its clipped update
``x`` (``||x||_2 <= c``), of ``d0`` values:

1. **pads** ``x`` with zeros to ``D`` values, ``d0`` rounded up to a multiple of
   :data:`MIN_CHUNK` (or to ``2^ceil(log2 d0)`` when ``d0`` is smaller), and **scales** it by
   ``1/gamma``;
2. **rotates** it, chunk by chunk: ``D`` is a sum of distinct powers of two
   ``D_1 > D_2 > ...`` (its binary digits, :func:`rotation_chunks`; 18524 values become
   ``16384 + 2048 + 128 = 18560``, not 32768), and the rotation is block diagonal,
   ``diag(H_1 / sqrt(D_1), H_2 / sqrt(D_2), ...) S x``: ``S`` diagonal random signs from the
   round's *public* seed, ``H_b`` the Walsh-Hadamard matrix of order ``D_b`` (:func:`rotate`).
   A block-diagonal matrix of orthogonal blocks is orthogonal and here its own inverse, so the
   norm is kept and the server undoes it exactly. Flattening spreads each chunk's norm over its
   coordinates, so that no coordinate needs many bits (see below for what the chunks cost);
3. **rounds** every coordinate at random to a neighbouring integer, trying again until the
   rounded vector's norm is at most ``rounded_l2_bound(c, gamma, D, beta) / gamma``
   (*conditional randomised rounding*, Theorem 1 of Kairouz et al.; :func:`conditional_round`).
   That bound, with the L1 bound of an integer vector, is the sensitivity the accountant uses;
4. **adds integer noise**: ``N_Z(0, sigma_i^2)`` per coordinate, sampled exactly
   (:func:`securefed.privacy.discrete.discrete_gaussian`), or ``Sk(mu_i, mu_i)``;
5. submits the integer vector to secure aggregation, which sums it exactly in the ring
   ``Z_{2^ring_bits}`` (the secure-aggregation codec at scale 1 is the identity on integers).

The server reduces the ring sum modulo ``m = 2^bits`` (the mechanism's modulus: ``bits`` bits per
coordinate suffice), reads it as a centred integer in ``[-m/2, m/2)``, multiplies by ``gamma``
and rotates back (:meth:`DistributedIntegerMechanism.decode`). The sum's true integer value lies
outside ``[-m/2, m/2)`` (it *wraps*, and decodes wrong) with probability at most
:func:`wrap_probability_bound`; ``gamma`` is the smallest granularity that keeps that bound under
``wrap_target`` (:func:`granularity_for`), so the bits per coordinate are chosen from ``n``, the
clip and the modulus.

Why the chunked rotation keeps the paper's analysis (Kairouz et al. 2021, Sections 3-4). The
analysis uses the rotation twice. (i) The privacy bound needs only that the rotation is
orthogonal (the rotated vector has norm at most ``c / gamma``) and the rounding bound of
Theorem 1, which holds for randomised rounding of *any* vector of that norm in ``D`` coordinates:
so the sensitivity is ``rounded_l2_bound(c, gamma, D, beta)`` with ``D`` the dimension actually
sent (the sum of the chunks), and the accountant is charged for ``D`` coordinates. (ii) The
modular wrap bound needs flattening: a coordinate of chunk ``b`` is ``sum_i s_i H_ji x_i /
sqrt(D_b)`` over that chunk's ``x_i``, sub-Gaussian over the public signs with proxy
``||x_b||^2 / D_b <= ||x||^2 / D_b`` (Hoeffding). Chunk by chunk the argument is the paper's,
with ``D_b`` for ``D``; since the server cannot know how a client's norm falls across chunks, the
bound takes the worst chunk, ``||x||^2 / D_min`` (:func:`wrap_probability_bound`'s
``flat_dim``), and the union bound runs over all ``D`` coordinates. The price is a coarser
granularity where ``D_min`` is small (``gamma`` grows like ``sqrt(D_full / D_min)`` while the
signal term dominates); the rounding error it adds, ``n gamma^2 / 4`` per coordinate of the
sum, stays far below the noise at the DP schedule's figures (docs/privacy.md).

What the guarantee covers: the sum of the contributors' integer vectors (each of L2 norm within
the rounding bound) plus the sum of their integer noise, whose Rényi divergence is bounded by
:func:`~securefed.privacy.discrete.discrete_gaussian_sum_rdp` (or
:func:`~securefed.privacy.discrete.skellam_rdp`) for the contributors actually in the sum.
Reducing modulo ``m``, scaling and rotating back are post-processing. A release from fewer than
``min_contributors`` clients is refused.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from securefed.privacy.discrete import (
    MAX_INTEGER_VARIANCE,
    DiscreteRelease,
    IntegerSource,
    discrete_gaussian,
    integer_l1_bound,
    integer_source,
    rounded_l2_bound,
    skellam,
)

INTEGER_MECHANISMS = ("discrete_gaussian", "skellam")
MECHANISMS = ("gaussian", *INTEGER_MECHANISMS)
"""``"gaussian"``: float noise (inexact after rounding and the wrap); the others: integers."""

SKELLAM_SUBGAUSSIAN_FACTOR = 1.09
"""``Sk(mu, mu)`` has moment generating function ``exp(2 mu (cosh t - 1))`` and
``cosh t - 1 <= 1.09 t^2 / 2`` for ``|t| <= 1``: sub-Gaussian with proxy ``1.09 * 2 mu`` there."""


# ----------------------------------------------------------------------------- rotation
MIN_CHUNK = 128
"""The smallest rotation chunk of a vector longer than it: ``d0`` is padded to a multiple."""


def rotation_chunks(dim: int) -> tuple[int, ...]:
    """The rotation's chunk lengths for ``dim`` values: distinct powers of two, largest first.

    ``dim <= MIN_CHUNK``: one chunk of ``2^ceil(log2 dim)``. Otherwise ``dim`` rounded up to a
    multiple of :data:`MIN_CHUNK`, split into its binary digits (18524 -> 18560 = 16384 + 2048
    + 128): at most ``MIN_CHUNK - 1`` values of padding instead of up to ``dim - 1``.
    """
    if isinstance(dim, bool) or int(dim) != dim or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    dim = int(dim)
    if dim <= MIN_CHUNK:
        return (1 << (dim - 1).bit_length(),)
    total = -(-dim // MIN_CHUNK) * MIN_CHUNK
    return tuple(1 << b for b in range(total.bit_length() - 1, -1, -1) if (total >> b) & 1)


def padded_dim(dim: int) -> int:
    """``D``: the rotated length for ``dim`` values (the sum of :func:`rotation_chunks`)."""
    return sum(rotation_chunks(dim))


def rotation_signs(seed: bytes, length: int) -> np.ndarray:
    """The public random signs ``S`` of a round (float64 +-1), from a 32-byte public seed."""
    if len(seed) < 16:
        raise ValueError("the rotation seed must be at least 16 bytes")
    words = np.frombuffer(hashlib.sha256(bytes(seed)).digest(), np.uint32)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words.tolist())))
    return np.where(rng.integers(0, 2, length) == 1, 1.0, -1.0)


def hadamard(x: np.ndarray) -> np.ndarray:
    """``x H / sqrt(D)`` along the last axis (``D`` a power of two): orthonormal, self-inverse.

    The fast Walsh-Hadamard transform: ``log2 D`` butterfly passes over all rows at once.
    """
    x = np.array(x, dtype=np.float64, copy=True)
    length = x.shape[-1]
    if length & (length - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {length}")
    rows = x.reshape(-1, length)
    h = 1
    while h < length:
        view = rows.reshape(rows.shape[0], -1, 2, h)
        a, b = view[:, :, 0, :].copy(), view[:, :, 1, :]
        view[:, :, 0, :] += b
        view[:, :, 1, :] = a - b
        h *= 2
    rows /= math.sqrt(length)
    return x


def _chunked_hadamard(x: np.ndarray, chunks: tuple[int, ...] | None) -> np.ndarray:
    """:func:`hadamard` of each chunk of the last axis (``None``: one chunk, the whole axis)."""
    if chunks is None:
        return hadamard(x)
    if sum(chunks) != x.shape[-1]:
        raise ValueError(f"chunks {chunks} do not cover the {x.shape[-1]} values")
    out = np.empty(x.shape, dtype=np.float64)
    start = 0
    for length in chunks:
        out[..., start : start + length] = hadamard(x[..., start : start + length])
        start += length
    return out


def rotate(x: np.ndarray, signs: np.ndarray, chunks: tuple[int, ...] | None = None) -> np.ndarray:
    """The randomised Hadamard rotation of each row: ``diag(H_b / sqrt(D_b)) S x``.

    ``chunks``: the block lengths (:func:`rotation_chunks`); ``None`` rotates the whole row
    (a power of two) as one block.
    """
    return _chunked_hadamard(np.asarray(x, dtype=np.float64) * signs, chunks)


def unrotate(y: np.ndarray, signs: np.ndarray, chunks: tuple[int, ...] | None = None) -> np.ndarray:
    """The inverse rotation ``S diag(H_b / sqrt(D_b)) y``."""
    return _chunked_hadamard(y, chunks) * signs


# ----------------------------------------------------------------------------- rounding
def conditional_round(
    scaled: np.ndarray,
    l2_bound: float,
    rng: np.random.Generator | IntegerSource,
    *,
    max_tries: int = 1000,
) -> np.ndarray:
    """Round each row of ``scaled`` at random to integers, retrying rows whose norm is too large.

    A coordinate ``z`` becomes ``floor(z) + 1`` with probability ``z - floor(z)``, else
    ``floor(z)``; a row is kept when its squared norm, computed exactly in integers, is at most
    ``floor(l2_bound^2)`` (Kairouz et al. 2021, conditional randomised rounding). The coins
    come from ``rng`` (a seeded Generator, or the secure source's keystream floats).

    Raises:
        ValueError: a row still too long after ``max_tries`` (its norm before rounding must be
            far above the clip: the caller clipped wrongly).
    """
    source = integer_source(rng)
    scaled = np.atleast_2d(np.asarray(scaled, dtype=np.float64))
    limit = math.floor(l2_bound * l2_bound)
    floor = np.floor(scaled)
    frac = scaled - floor
    base = floor.astype(np.int64)
    out = np.empty_like(base)
    pending = np.arange(scaled.shape[0])
    for _ in range(max_tries):
        if not pending.size:
            return out
        trial = base[pending] + (source.random(frac[pending].shape) < frac[pending])
        ok = np.einsum("ij,ij->i", trial, trial) <= limit
        out[pending[ok]] = trial[ok]
        pending = pending[~ok]
    if pending.size:
        raise ValueError(
            f"{pending.size} update(s) kept a rounded norm above {l2_bound:.4g} after "
            f"{max_tries} tries: they were not clipped to the mechanism's clip"
        )
    return out


# ----------------------------------------------------------------------------- sizing
def wrap_probability_bound(
    bits: int,
    n: int,
    clip: float,
    gamma: float,
    dim: int,
    noise_proxy: float,
    *,
    flat_dim: int | None = None,
) -> float:
    """Bound on the chance that some coordinate of the integer sum leaves ``[-m/2, m/2)``.

    Each coordinate of the sum is ``signal + rounding + noise``: the rotated sum of the clients'
    vectors (norm at most ``n c / gamma`` in integer units) has, over the public random signs,
    sub-Gaussian proxy ``n^2 c^2 / (gamma^2 D_min)`` (Hoeffding; ``D_min = flat_dim`` is the
    smallest rotation chunk, ``dim`` when ``None``: module docstring); each client's rounding
    error lies in an interval of length 1 (proxy ``1/4``); the noise of the sum has proxy
    ``noise_proxy`` (its variance for the discrete Gaussian, which is sub-Gaussian with that
    proxy; times :data:`SKELLAM_SUBGAUSSIAN_FACTOR` for Skellam). With ``V`` their sum, one
    coordinate wraps with probability at most ``2 exp(-(m/2)^2 / (2 V))``, and a union bound
    over the ``D`` coordinates gives ``2 D exp(-m^2 / (8 V))``.
    """
    m = 1 << int(bits)
    flat = dim if flat_dim is None else flat_dim
    v = n * n * clip * clip / (gamma * gamma * flat) + n / 4 + noise_proxy
    return min(1.0, 2 * dim * math.exp(-(m * m) / (8 * v)))


def granularity_for(
    bits: int,
    n: int,
    clip: float,
    dim: int,
    noise_std: float,
    wrap_target: float,
    *,
    proxy_factor: float = 1.0,
    flat_dim: int | None = None,
) -> float:
    """The smallest ``gamma`` whose :func:`wrap_probability_bound` is at most ``wrap_target``.

    ``noise_std`` is the std of the sum's noise in model units (``sigma * clip``); in integer
    units its proxy is ``proxy_factor * noise_std^2 / gamma^2``. Solves
    ``(n^2 c^2 / D_min + proxy_factor * noise_std^2) / gamma^2 + n / 4 <= m^2 / (8 ln(2 D / p))``
    (``D_min = flat_dim``, ``dim`` when ``None``).

    Raises:
        ValueError: ``bits`` too few for ``n`` clients' rounding errors alone.
    """
    m = 1 << int(bits)
    v_max = m * m / (8 * math.log(2 * dim / wrap_target))
    room = v_max - n / 4
    if room <= 0:
        raise ValueError(
            f"{bits} bits cannot hold the rounding errors of {n} clients without wrapping "
            f"(target {wrap_target:g}); use more bits"
        )
    flat = dim if flat_dim is None else flat_dim
    return math.sqrt((n * n * clip * clip / flat + proxy_factor * noise_std**2) / room)


# ----------------------------------------------------------------------------- the mechanism
@dataclass(frozen=True)
class DistributedIntegerMechanism:
    """One round's public parameters of the distributed discrete Gaussian or Skellam mechanism.

    Attributes:
        mechanism: ``"discrete_gaussian"`` or ``"skellam"``.
        bits: the modulus ``m = 2^bits`` of the sum (bits per coordinate a client needs to send).
        clip: the L2 clip ``c`` of each client's update (model units).
        gamma: the granularity (one integer unit is ``gamma`` model units).
        dim: the values per client before padding, ``d0``.
        beta: conditional rounding's parameter (``exp(-1/2)`` in the paper's experiments).
        noise: each client's noise parameter in integer units: the discrete Gaussian's integer
            variance ``sigma_i^2``, or Skellam's ``mu_i`` (variance ``2 mu_i``).
        min_contributors: a sum of fewer clients is not released.
    """

    mechanism: str
    bits: int
    clip: float
    gamma: float
    dim: int
    beta: float
    noise: float
    min_contributors: int

    def __post_init__(self) -> None:
        if self.mechanism not in INTEGER_MECHANISMS:
            raise ValueError(
                f"mechanism must be one of {INTEGER_MECHANISMS}, got {self.mechanism!r}"
            )
        if isinstance(self.bits, bool) or not 2 <= int(self.bits) <= 32:
            raise ValueError(f"bits must be an integer in [2, 32], got {self.bits!r}")
        if not (self.clip > 0 and self.gamma > 0 and self.dim >= 1 and 0 <= self.beta < 1):
            raise ValueError("need clip > 0, gamma > 0, dim >= 1 and beta in [0, 1)")
        if self.mechanism == "discrete_gaussian" and (
            int(self.noise) != self.noise or self.noise < 1
        ):
            raise ValueError(f"the discrete Gaussian needs an integer variance >= 1: {self.noise}")
        if not self.noise > 0:
            raise ValueError(f"the noise parameter must be > 0, got {self.noise!r}")
        if isinstance(self.min_contributors, bool) or self.min_contributors < 1:
            raise ValueError(f"min_contributors must be >= 1, got {self.min_contributors!r}")

    @property
    def chunks(self) -> tuple[int, ...]:
        """The rotation's chunk lengths (:func:`rotation_chunks`)."""
        return rotation_chunks(self.dim)

    @property
    def padded(self) -> int:
        """``D``: the rotated length, the coordinates sent and charged (sum of the chunks)."""
        return padded_dim(self.dim)

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @property
    def l2_units(self) -> float:
        """The rounded vector's L2 bound in integer units (the sum's L2 sensitivity)."""
        return rounded_l2_bound(self.clip, self.gamma, self.padded, self.beta) / self.gamma

    @property
    def l1_units(self) -> float:
        """The rounded vector's L1 bound in integer units."""
        return integer_l1_bound(self.l2_units, self.padded)

    def release(self, n_contributors: int) -> DiscreteRelease:
        """What the accountant charges for a sum of ``n_contributors`` clients' vectors."""
        return DiscreteRelease(
            self.mechanism,
            float(self.noise),
            int(n_contributors),
            self.l2_units,
            self.l1_units,
            self.padded,
        )

    def noise_std_units(self, n_contributors: int) -> float:
        """The std of the sum's noise in integer units."""
        per_client = self.noise if self.mechanism == "discrete_gaussian" else 2 * self.noise
        return math.sqrt(n_contributors * per_client)

    def wrap_bound(self, n_contributors: int) -> float:
        """:func:`wrap_probability_bound` for a sum of ``n_contributors`` clients."""
        factor = 1.0 if self.mechanism == "discrete_gaussian" else SKELLAM_SUBGAUSSIAN_FACTOR
        proxy = factor * self.noise_std_units(n_contributors) ** 2
        return wrap_probability_bound(
            self.bits,
            n_contributors,
            self.clip,
            self.gamma,
            self.padded,
            proxy,
            flat_dim=self.chunks[-1],
        )

    def client_bound(self, sigmas: float = 40.0) -> int:
        """A bound on one client's integer coordinates: the rounding bound plus ``sigmas`` stds."""
        per_client = self.noise if self.mechanism == "discrete_gaussian" else 2 * self.noise
        return math.ceil(self.l2_units + sigmas * math.sqrt(per_client)) + 1

    def encode(
        self, flat: np.ndarray, signs: np.ndarray, rng: np.random.Generator | IntegerSource
    ) -> np.ndarray:
        """Clients' clipped updates (rows of ``flat``, ``dim`` values) -> noisy integer vectors.

        Steps 1-4 of the module docstring; rounding and noise from ``rng`` (the client's own:
        a seeded Generator, or a :class:`~securefed.privacy.discrete.SecureIntegers`).

        Raises:
            ValueError: rows of the wrong length, or of norm above the clip.
            TypeError: Skellam from a source other than a numpy Generator (numpy's Poisson).
        """
        flat = np.atleast_2d(np.asarray(flat, dtype=np.float64))
        if flat.shape[1] != self.dim:
            raise ValueError(f"expected rows of {self.dim} values, got {flat.shape[1]}")
        norms = np.linalg.norm(flat, axis=1)
        if np.any(norms > self.clip * (1 + 1e-9)):
            raise ValueError(
                f"an update of norm {norms.max():.6g} exceeds the clip {self.clip:g}: clip first"
            )
        padded = np.zeros((flat.shape[0], self.padded))
        padded[:, : self.dim] = flat / self.gamma
        rounded = conditional_round(rotate(padded, signs, self.chunks), self.l2_units, rng)
        size = rounded.size
        if self.mechanism == "discrete_gaussian":
            noise = discrete_gaussian(int(self.noise), size, rng)
        elif isinstance(rng, np.random.Generator):
            noise = skellam(self.noise, size, rng)
        else:
            raise TypeError("Skellam noise needs a numpy Generator (numpy's Poisson sampler)")
        return rounded + noise.reshape(rounded.shape)

    def decode(self, ring_sum: np.ndarray, signs: np.ndarray) -> np.ndarray:
        """The integer sum (any representative modulo ``m``) -> the noisy sum in model units.

        Reduces modulo ``m`` to ``[-m/2, m/2)``, multiplies by ``gamma``, rotates back and drops
        the padding.
        """
        integers = np.asarray(ring_sum).astype(np.int64).reshape(-1)
        if integers.size != self.padded:
            raise ValueError(f"expected {self.padded} integers, got {integers.size}")
        half = self.modulus // 2
        centred = ((integers + half) % self.modulus) - half
        return unrotate(centred.astype(np.float64) * self.gamma, signs, self.chunks)[: self.dim]

    def public(self) -> dict[str, object]:
        """JSON-ready public parameters (for views and records)."""
        return {
            "dp_mechanism": self.mechanism,
            "ddp_bits": self.bits,
            "ddp_gamma": self.gamma,
            "ddp_dim": self.dim,
            "ddp_padded_dim": self.padded,
            "ddp_chunks": list(self.chunks),
            "ddp_beta": self.beta,
            "ddp_noise": self.noise,
            "ddp_l2_units": self.l2_units,
            "ddp_l1_units": self.l1_units,
            "ddp_min_contributors": self.min_contributors,
        }


def plan_mechanism(
    mechanism: str,
    *,
    bits: int,
    clip: float,
    noise_std: float,
    n_clients: int,
    dim: int,
    min_contributors: int,
    beta: float = math.exp(-0.5),
    wrap_target: float = 1e-6,
) -> DistributedIntegerMechanism:
    """The round's mechanism for ``n_clients`` asked and a target noise std on the sum.

    ``gamma`` from :func:`granularity_for` (coarser where the per-client integer variance would
    pass :data:`~securefed.privacy.discrete.MAX_INTEGER_VARIANCE`); each client's integer noise
    so that ``n_clients`` together carry at least ``noise_std`` (model units): the discrete
    Gaussian's variance ``ceil(noise_std^2 / (n gamma^2))`` (rounded up), Skellam's
    ``mu_i = noise_std^2 / (2 n gamma^2)``.

    Raises:
        ValueError: a mechanism not in :data:`INTEGER_MECHANISMS`, or bits too few.
    """
    if mechanism not in INTEGER_MECHANISMS:
        raise ValueError(f"mechanism must be one of {INTEGER_MECHANISMS}, got {mechanism!r}")
    if n_clients < 1:
        raise ValueError(f"need at least one client, got {n_clients}")
    chunks = rotation_chunks(dim)
    factor = 1.0 if mechanism == "discrete_gaussian" else SKELLAM_SUBGAUSSIAN_FACTOR
    gamma = granularity_for(
        bits,
        n_clients,
        clip,
        sum(chunks),
        noise_std,
        wrap_target,
        proxy_factor=factor,
        flat_dim=chunks[-1],
    )
    # A coarser grid where the exact sampler's variance would pass its int64 range: the
    # rounding error (at most one unit) is then below 2^-14 of the noise.
    gamma = max(gamma, noise_std / math.sqrt(n_clients * MAX_INTEGER_VARIANCE))
    per_client_var = noise_std**2 / (n_clients * gamma * gamma)
    if mechanism == "discrete_gaussian":
        noise = float(min(MAX_INTEGER_VARIANCE, max(1, math.ceil(per_client_var))))
    else:
        noise = per_client_var / 2
    return DistributedIntegerMechanism(
        mechanism,
        int(bits),
        float(clip),
        gamma,
        int(dim),
        float(beta),
        noise,
        int(min_contributors),
    )


def epsilon_for_integer_schedule(
    mechanism: DistributedIntegerMechanism, rounds: int, delta: float, *, colluders: int = 0
) -> float:
    """Epsilon after ``rounds`` releases of ``mechanism`` with all its planned contributors.

    The contributors are ``min_contributors`` (the fewest a release may have: the worst case
    the rule allows), less ``colluders`` whose noise the server subtracts (the epsilon against
    the server and them; infinite when no honest contributor is left), charged without
    amplification by sampling.
    """
    from securefed.privacy.ledger import epsilon_with_discrete

    honest = mechanism.min_contributors - int(colluders)
    if honest < 1:
        return math.inf
    release = mechanism.release(honest)
    return epsilon_with_discrete([], [(release, int(rounds))], delta)


def noise_for_integer_target(
    mechanism: str,
    epsilon: float,
    delta: float,
    rounds: int,
    *,
    bits: int,
    clip: float,
    n_clients: int,
    dim: int,
    min_contributors: int,
    wrap_target: float = 1e-6,
    tolerance: float = 1e-3,
    colluders: int = 0,
) -> float:
    """The smallest noise multiplier (relative ``tolerance``) whose integer plan fits ``epsilon``.

    The plan of every multiplier tried is :func:`plan_mechanism` (its granularity grows with the
    noise); its epsilon is :func:`epsilon_for_integer_schedule` with ``min_contributors``
    contributors, ``colluders`` of them colluding with the server (so that the target holds
    against the server and them). A doubling search brackets the target, bisection narrows it,
    and the upper end (whose epsilon is at most the target) is returned.

    Raises:
        ValueError: no multiplier up to ``1e6`` reaches the target, or no honest contributor.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"target epsilon must be finite and > 0, got {epsilon!r}")
    if min_contributors - colluders < 1:
        raise ValueError(
            f"{colluders} colluder(s) among the minimum of {min_contributors} contributors "
            "leave no honest noise against the server: no noise meets a target epsilon"
        )

    def spent(sigma: float) -> float:
        plan = plan_mechanism(
            mechanism,
            bits=bits,
            clip=clip,
            noise_std=sigma * clip,
            n_clients=n_clients,
            dim=dim,
            min_contributors=min_contributors,
            wrap_target=wrap_target,
        )
        return epsilon_for_integer_schedule(plan, rounds, delta, colluders=colluders)

    low, high = 0.0, 1.0
    while spent(high) > epsilon:
        low, high = high, 2 * high
        if high > 1e6:
            raise ValueError(
                f"no noise multiplier up to 1e6 reaches epsilon {epsilon:g} with {mechanism} "
                f"over {rounds} rounds at {bits} bits"
            )
    while high - low > tolerance * high:
        middle = (low + high) / 2
        if middle > 0 and spent(middle) <= epsilon:
            high = middle
        else:
            low = middle
    return high
