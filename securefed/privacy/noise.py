"""Noise sources and the clipping arithmetic of the Gaussian mechanism.

Two noise sources, after Opacus's ``secure_mode`` pattern:

* :class:`SeededGaussian` draws from a numpy ``Generator`` handed out by a
  :class:`~securefed.randomness.SeedTree` stream. Reproducible, for tests and benchmarks only:
  anyone who knows the seed can subtract the noise. It says so (``secure = False``) and views
  record it, so the audit flags it outside tests.
* :class:`SecureGaussian` draws from a ChaCha20 keystream keyed with 32 bytes from
  :mod:`secrets` (the operating system's CSPRNG); it refuses a seed. Uniforms are turned into
  normals by the Box–Muller transform (Box and Muller, "A Note on the Generation of Random Normal
  Deviates", Ann. Math. Statist. 1958), and every output is the sum of four such normals divided
  by two, the floating-point hardening of Holohan and Braghin, "Secure Random Sampling in
  Differential Privacy" (ESORICS 2021, arXiv:2107.10138, section 5.1, with n = 2), which Opacus's
  secure mode also uses.

Clipping (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, eq. for
``g / max(1, ||g||_2 / C)``; McMahan et al., "Learning Differentially Private Recurrent Language
Models", ICLR 2018, for whole-update clipping per client): an update ``x`` becomes
``x * min(1, C / ||x||_2)``, so that adding or removing one client moves a sum by at most ``C``
in L2 norm, and Gaussian noise of standard deviation ``sigma * C`` on that sum gives the
Gaussian mechanism with noise multiplier ``sigma`` (Dwork and Roth, "The Algorithmic Foundations
of Differential Privacy", 2014, Appendix A).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from securefed._checks import finite_array, positive
from securefed.crypto.prg import SecureWords
from securefed.errors import InsecureParameterError
from securefed.privacy.ledger import PrivacyLedger
from securefed.randomness import SeedTree

# Uniforms are drawn in chunks so that a large noise block never needs a keystream buffer
# of several hundred MB at once.
_CHUNK = 1 << 20


@runtime_checkable
class NoiseSource(Protocol):
    """Where Gaussian noise comes from.

    Attributes:
        secure: whether the source is cryptographic (unpredictable without a seed).
        name: short description, recorded in views.
    """

    secure: bool
    name: str

    def normal(self, std: float, shape: int | Sequence[int]) -> np.ndarray:
        """An array of ``shape`` i.i.d. ``N(0, std^2)`` float64 draws."""


class SeededGaussian:
    """Reproducible Gaussian noise from a numpy generator: for tests and benchmarks only.

    Args:
        generator: the stream to draw from, e.g. ``seeds.generator("dp", round_id, client)``.
    """

    secure = False
    name = "seeded-numpy"

    def __init__(self, generator: np.random.Generator) -> None:
        if not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy Generator, got {type(generator).__name__}")
        self.generator = generator

    def normal(self, std: float, shape: int | Sequence[int]) -> np.ndarray:
        positive("noise std", std, allow_zero=True)
        return self.generator.normal(0.0, std, size=shape)


class SecureGaussian:
    """Gaussian noise from a cryptographic source (ChaCha20 keyed from ``os.urandom``).

    Args:
        seed: must be ``None``; a seed is refused because predictable noise protects nothing.

    Raises:
        InsecureParameterError: if a seed is given.
    """

    secure = True
    name = "chacha20-box-muller"

    def __init__(self, seed: object = None) -> None:
        if seed is not None:
            raise InsecureParameterError(
                "SecureGaussian refuses a seed: noise that can be reproduced can be subtracted; "
                "use SeededGaussian(seeds.generator(...)) for tests and benchmarks"
            )
        self._words = SecureWords("chacha20")

    def uniform(self, n: int) -> np.ndarray:
        """``n`` uniforms in the open interval (0, 1), 53 random bits each."""
        out = np.empty(n)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            words = self._words.words(stop - start) >> np.uint64(11)
            # (k + 0.5) / 2^53 lies strictly inside (0, 1): log() below never sees 0.
            out[start:stop] = (words.astype(np.float64) + 0.5) * 2.0**-53
        return out

    def standard_normal(self, n: int) -> np.ndarray:
        """``n`` standard normals by the Box–Muller transform (one pair per two uniforms)."""
        pairs = (n + 1) // 2
        u = self.uniform(2 * pairs)
        radius = np.sqrt(-2.0 * np.log(u[:pairs]))
        angle = 2.0 * np.pi * u[pairs:]
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]

    def normal(self, std: float, shape: int | Sequence[int]) -> np.ndarray:
        positive("noise std", std, allow_zero=True)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = math.prod(shape)
        # Holohan and Braghin (2021), section 5.1: sum of 2n = 4 normals of std sigma, over 2.
        total = np.zeros(n)
        for _ in range(4):
            total += self.standard_normal(n)
        return (total * (std / 2.0)).reshape(shape)


def noise_source(seeds: SeedTree, *path: int | str, secure: bool = False) -> NoiseSource:
    """The noise source for the stream at ``path`` of ``seeds``.

    Secure noise is used whenever ``secure`` is asked for or the seed tree itself is in secure
    mode; seeded noise otherwise (from ``seeds.generator(*path)``).

    Raises:
        InsecureParameterError: if ``secure`` is asked for but ``seeds`` is a seeded tree (a
            run configured as secure must not carry a seed anywhere).
    """
    if secure and not seeds.secure:
        raise InsecureParameterError(
            "this DP configuration is secure but the seed tree is seeded (seed="
            f"{seeds.seed!r}); use SeedTree.secure_mode(), or secure=False for tests/benchmarks"
        )
    if seeds.secure or secure:
        return SecureGaussian()
    return SeededGaussian(seeds.generator(*path))


def as_noise_source(rng: NoiseSource | np.random.Generator) -> NoiseSource:
    """Accept either a :class:`NoiseSource` or a numpy generator (wrapped as seeded)."""
    if isinstance(rng, np.random.Generator):
        return SeededGaussian(rng)
    if isinstance(rng, NoiseSource):
        return rng
    raise TypeError(f"expected a NoiseSource or numpy Generator, got {type(rng).__name__}")


# --------------------------------------------------------------------------- clipping
def clip_factors(norms: np.ndarray, clip: float) -> np.ndarray:
    """Per-update scale ``min(1, C / norm)`` (1 for a zero update).

    Source: Abadi et al. (CCS 2016), the clipping step of DP-SGD.
    """
    positive("clip", clip)
    norms = np.asarray(norms, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)


def segment_norms(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """L2 norm of each CSR segment ``values[indptr[k]:indptr[k+1]]`` (all columns together).

    Vectorised with ``np.add.reduceat`` over the squared entries; empty segments give 0
    (``reduceat`` alone would return the next entry for them).
    """
    values = np.asarray(values, dtype=np.float64)
    indptr = np.asarray(indptr, dtype=np.int64)
    squares = np.einsum("ij,ij->i", values, values) if values.ndim == 2 else values**2
    counts = np.diff(indptr)
    sums = np.zeros(len(counts))
    nonempty = counts > 0
    if nonempty.any():
        sums[nonempty] = np.add.reduceat(squares, indptr[:-1][nonempty])
    return np.sqrt(sums)


def clip_rows(values: np.ndarray, clip: float) -> np.ndarray:
    """Clip each row of a 2-D array to L2 norm at most ``clip`` (a new array)."""
    values = finite_array("values", values)
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D (rows, width), got shape {values.shape}")
    norms = np.linalg.norm(values, axis=1)
    return values * clip_factors(norms, clip)[:, None]


def _clip_and_noise_rows(
    values: np.ndarray,
    clip: float,
    sigma: float,
    rng: NoiseSource | np.random.Generator,
) -> np.ndarray:
    """Clip each row to norm ``clip`` and add ``N(0, (sigma C)^2)``: the arithmetic only.

    Private: its output is a DP release that no ledger has recorded. The public path is
    :func:`release_rows`, which charges the ledger first.
    """
    positive("sigma", sigma)
    clipped = clip_rows(values, clip)
    return clipped + as_noise_source(rng).normal(sigma * clip, clipped.shape)


def release_rows(
    values: np.ndarray,
    *,
    clip: float,
    sigma: float,
    rng: NoiseSource | np.random.Generator,
    ledger: PrivacyLedger,
) -> np.ndarray:
    """Clip each row (e.g. a query's Q-value vector) to norm ``clip``, add ``N(0, (sigma C)^2)``,
    charging ``ledger`` once per row first.

    Each row is one Gaussian-mechanism release with sensitivity ``clip`` and noise multiplier
    ``sigma`` (Dwork and Roth 2014, Theorem A.1). The ``n`` rows are ``n`` releases about the
    same user, so they compose: the ledger (one per user, or one for the worst-case user) is
    charged ``n`` steps of ``(sigma, sample_rate=1)`` before anything is drawn, and refuses the
    whole batch if it would overrun the budget. This is the only public way to noise rows: no
    noisy row leaves without its charge.

    Args:
        values: ``(n_queries, width)`` array, one vector per query.
        clip: L2 bound per row (> 0).
        sigma: noise multiplier (> 0).
        rng: a :class:`NoiseSource` or numpy generator (seeded: tests and benchmarks only).
        ledger: the ledger charged (required).

    Returns:
        The clipped, noised ``(n_queries, width)`` array.

    Raises:
        TypeError: ``ledger`` is not a :class:`PrivacyLedger`.
        PrivacyBudgetExceeded: nothing is released and nothing recorded.
    """
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(
            f"release_rows needs a PrivacyLedger to charge, got {type(ledger).__name__}: a noisy "
            "release no ledger records is refused"
        )
    values = finite_array("values", values)  # validated before anything is charged
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D (queries, width), got shape {values.shape}")
    positive("sigma", sigma)
    positive("clip", clip)
    if len(values):
        # Whoever receives the rows (the server, the fusing party) sees each one noised.
        ledger.charge(sigma, 1.0, steps=len(values), server=(sigma, 1.0))
    return _clip_and_noise_rows(values, clip, sigma, rng)
