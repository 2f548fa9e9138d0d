"""CKKS contexts (TenSEAL 0.3.18 over Microsoft SEAL): parameters, security checks, key views.

Two classes, two roles (DESIGN.md, "TenSEAL: public and secret contexts as different objects"):

* :class:`SecretContext`, held by the key holders (the users of Chai et al. 2020, "Secure
  Federated Matrix Factorization", who share one secret key; the parties of a fusion channel).
  It encrypts and decrypts.
* :class:`PublicContext`, the only thing a server ever gets. It is rebuilt from
  ``serialize(save_secret_key=False)``, so it holds no secret key: TenSEAL refuses to decrypt with
  it (``tests/test_ckks.py`` checks that). It can add and multiply ciphertexts (and, with the
  public-key encryption type, encrypt).

Parameters are chosen for a *circuit* (:func:`parameters_for`): ``"aggregation"`` (sums only, no
multiplication: a first prime sized for the sum's headroom, a second for the scale) or a
:class:`FusionCircuit` (an MLP with a polynomial activation, evaluated and trained on
ciphertexts: one rescaling prime per multiplicative level). Whatever the origin,
:func:`check_security` refuses a total coefficient modulus above the 128-bit table of the HE
standard as SEAL enforces it (specs/transport.md, CKKS): degree 4096: 109 bits, 8192: 218,
16384: 438, 32768: 881, naming the numbers.

Ciphertexts cross a trust boundary as :class:`Ciphertext` envelopes (serialized bytes plus the
id of the key they were made under); a context refuses an envelope labelled with another key with
:class:`ContextMismatchError`, and a key holder refuses, after decryption, one whose check slot
(an encrypted 0 in the last slot) is not 0: a ciphertext of another key relabelled with this
key's id (SEAL itself cannot tell two keys with the same parameters apart).

Releasing decryptions: :func:`decryption_error_bound` states the error of a sum of fresh
ciphertexts, :func:`flooding_floor` the least flooding std that hides it at a stated level
(Li, Micciancio, Schultz and Sorrell 2022), and :class:`Flooding` never floods below it outside
tests (:meth:`Flooding.unsafe_for_tests`).

Key files (provisioning across machines, no pickle): :func:`save_secret_context` writes
TenSEAL's own ``serialize(save_secret_key=True)`` bytes behind a magic line and a JSON header
(parameters, key id, SHA-256) to a file of mode 0600, for the key holders only;
:func:`load_secret_context` refuses a file its group or others may read.
:func:`save_public_context` / :func:`load_public_context` do the same for the server's context,
which a loader refuses if it holds a secret key.

Randomness: SEAL draws keys and encryption noise from its own CSPRNG, which cannot be seeded;
CKKS results are therefore reproducible only to CKKS precision, never bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import tenseal as ts

from securefed._checks import finite_array
from securefed.crypto.flooding import MIN_FLOODING_SECURITY_BITS, flooding_floor
from securefed.errors import InsecureParameterError, SecurefedError

MAX_COEFF_BITS: dict[int, int] = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
"""Largest total coefficient-modulus bits at 128-bit classical security (HE standard, SEAL)."""

MAX_PRIME_BITS = 60
"""SEAL's largest coefficient-modulus prime."""

MIN_SCALE_BITS = 20
"""Below this the CKKS rounding error swamps any useful precision."""

DEFAULT_SCALE_BITS = 40
DEFAULT_EDGE_BITS = 60
"""Bits of the first (decryption) prime and of the special (key-switching) prime of a chain."""
AGGREGATION_SCALE_BITS = 50
"""Scale of the aggregation chain ``[60, 60, 60]`` (two 60-bit data primes, no rescaling: 118 bits
of room for ``|value| x scale``, of which a sum of ``max_clients x value_bound`` needs 28). At
2^50 a 1024-client sum errs by about 2^-34 per value, which keeps the flooding floor
(:func:`flooding_floor`) near 2^-14.5 at 40-bit security; much above 2^52 the double-precision
decoding error of values near 1 would exceed the ring's error. Full 60-bit primes keep the
serialized ciphertexts incompressible, so their sizes do not vary (a 50-bit prime would)."""

FUSION_HEADROOM_BITS = 20
"""Fusion chains give the first prime this many bits over the scale: room for the values and the
server's masks (2^16) in the masked-gradient exchange, whatever the level."""

FUSION_MASK_BITS = 16
"""The largest default mask of the masked-gradient exchange (``2^16``, what ``q_0`` leaves at
the default chains): the key holder decodes ``value + mask`` in double precision, so a larger
mask would cost the value low bits (``2^(k - 52)`` absolute) without hiding it better in
practice; a spare data prime (``data_primes=2``) raises the room, not the mask."""

MIN_FUSION_SCALE_BITS = 30
"""The smallest scale the automatic fusion choice accepts before moving to a larger degree."""

Encryption = Literal["symmetric", "public-key"]
ENCRYPTIONS: tuple[str, ...] = ("symmetric", "public-key")


SEAL_NOISE_STD = 3.2
"""Standard deviation of SEAL's encryption error (its clipped normal, ``seal::util::ClippedNormal``
with the default ``noise_standard_deviation``)."""

ERROR_FAILURE_BITS = 40
"""The decryption-error bound fails with probability at most ``2^-ERROR_FAILURE_BITS``..."""

ERROR_UNION_VALUES = 2**32
"""... over up to this many decrypted values at once (a union bound)."""

DEFAULT_FLOODING_SECURITY_BITS = 40
"""Default level of the flooding: per released value, the KL divergence between the release and
the same value computed without the key-dependent error is at most ``2^-40``."""

CHECK_SLOT_TOLERANCE = 2.0**-4
"""A check slot (encrypted as 0) must decrypt within this of 0; under another key it decrypts to
a value of the order of ``q / scale`` (2^59 at the aggregation defaults)."""


class ContextMismatchError(SecurefedError, ValueError):
    """A ciphertext was made under another key or parameter set than the context given."""


# ----------------------------------------------------------------------------- circuits
@dataclass(frozen=True)
class AggregationCircuit:
    """Sums of up to ``max_clients`` vectors whose entries lie in ``[-value_bound, value_bound]``.

    No multiplication happens. The chain is ``[60, 60, 60]`` without rescaling: two data primes
    (120 bits) hold ``|sum| x scale``, where the sum needs ``headroom_bits = ceil(log2(max_clients
    * value_bound)) + 2`` bits (one for the sign, one of margin) above the scale
    (:data:`AGGREGATION_SCALE_BITS`), so the precision does not shrink as the headroom grows.
    The decryption error of a sum is :func:`decryption_error_bound`.

    Attributes:
        max_clients: most clients a round may sum.
        value_bound: public bound on ``|w * x|`` and ``w`` of a client's upload.
    """

    max_clients: int = 1024
    value_bound: float = 65536.0

    def __post_init__(self) -> None:
        if isinstance(self.max_clients, bool) or int(self.max_clients) < 1:
            raise ValueError(f"max_clients must be >= 1, got {self.max_clients!r}")
        if not np.isfinite(self.value_bound) or self.value_bound <= 0:
            raise ValueError(f"value_bound must be finite and > 0, got {self.value_bound!r}")

    @property
    def headroom_bits(self) -> int:
        return math.ceil(math.log2(self.max_clients * self.value_bound)) + 2

    @property
    def levels(self) -> int:
        return 0


@dataclass(frozen=True)
class FusionCircuit:
    """An MLP of ``depth`` linear layers, a degree-``activation_degree`` polynomial between them.

    Evaluated as in :mod:`securefed.fusion.ckks`: every product with a plaintext weight and every
    ciphertext product costs one rescaling level; the activation's coefficients are folded into
    the next layer's weights, so a degree-``d`` activation costs ``ceil(log2 d)`` levels, not the
    ``ceil(log2 d) + 1`` of TenSEAL's ``polyval`` (measured: polyval of degree 2 needs two levels).

    Attributes:
        depth: number of linear layers (1 = a single linear map).
        activation_degree: degree of the polynomial activation (ignored when ``depth == 1``).
        training: also budget the levels of the masked-gradient exchange (backward pass).
    """

    depth: int = 2
    activation_degree: int = 2
    training: bool = True

    def __post_init__(self) -> None:
        for name in ("depth", "activation_degree"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def levels(self) -> int:
        return fusion_levels(self.depth, self.activation_degree, training=self.training)


def power_depth(exponent: int) -> int:
    """Extra levels of ``z^exponent`` over ``z`` by binary powering: ``ceil(log2 exponent)``."""
    if exponent < 1:
        raise ValueError(f"exponent must be >= 1, got {exponent}")
    return math.ceil(math.log2(exponent))


def fusion_levels(depth: int, degree: int, *, training: bool = True) -> int:
    """Multiplicative levels the fused MLP needs (forward, and backward when ``training``).

    Mirrors the schedule of :mod:`securefed.fusion.ckks` (``tests/test_fusion.py`` checks it
    against a dry run of that schedule). With ``q = ceil(log2 degree)``, pre-activation ``z_l``
    sits at level ``l + (l - 1) q``. Backward, the output gradient arrives fresh (level 0) and
    ``G_{l-1} = sum_i (G_l (i c_i W_l)^T) * z_{l-1}^(i-1)`` costs one level for the plaintext
    product and one for the ciphertext product; each weight gradient is one more ciphertext
    product.
    """
    if depth < 1 or degree < 1:
        raise ValueError(f"depth and degree must be >= 1, got {depth}, {degree}")
    q = power_depth(degree)

    def z_level(layer: int) -> int:  # 1-based layer index
        return layer + (layer - 1) * q

    forward = z_level(depth)
    if not training:
        return forward
    deepest = forward
    g_level = 0  # gradient w.r.t. z_depth: fresh from the parties
    for layer in range(depth, 1, -1):
        previous = z_level(layer - 1)
        # dW_layer: (c_i G) (one level) times z_{layer-1}^i.
        deepest = max(deepest, max(g_level + 1, previous + q) + 1)
        # G_{layer-1}: the i = 1 term is one plaintext product; i >= 2 adds a ciphertext one.
        g_next = g_level + 1
        if degree >= 2:
            g_next = max(g_level + 1, previous + power_depth(degree - 1)) + 1
        g_level = g_next
        deepest = max(deepest, g_level)
    # dW_1 = x * G_1 and the input gradient G_1 W_1^T: one level each over G_1.
    return max(deepest, g_level + 1)


Circuit = Literal["aggregation"] | AggregationCircuit | FusionCircuit


# ----------------------------------------------------------------------------- parameters
def check_security(poly_modulus_degree: int, coeff_mod_bit_sizes: Sequence[int]) -> None:
    """Refuse parameters below 128-bit security.

    Raises:
        InsecureParameterError: the degree is not in the table, or the total coefficient bits
            exceed its 128-bit limit (both numbers named).
    """
    if poly_modulus_degree not in MAX_COEFF_BITS:
        known = ", ".join(f"{n}: {b}" for n, b in MAX_COEFF_BITS.items())
        raise InsecureParameterError(
            f"poly_modulus_degree {poly_modulus_degree} has no 128-bit entry (degree: max total "
            f"coefficient bits = {known})"
        )
    total = int(sum(coeff_mod_bit_sizes))
    limit = MAX_COEFF_BITS[poly_modulus_degree]
    if total > limit:
        raise InsecureParameterError(
            f"coefficient modulus {list(coeff_mod_bit_sizes)} totals {total} bits, above the "
            f"{limit} bits that degree {poly_modulus_degree} allows at 128-bit security; use a "
            "larger degree, fewer primes or smaller ones"
        )


@dataclass(frozen=True)
class CKKSParameters:
    """A validated CKKS parameter set (all public).

    The chain is ``[q_0, q_1 .. q_L, p]``: ``q_0`` is the decryption prime, ``q_1..q_L`` the
    rescaling primes (one per multiplicative level, each of ``scale_bits``), ``p`` the special
    prime used only for key switching (SEAL's convention: the last prime). With
    ``data_primes = k > 1`` the first ``k - 1`` rescaling primes are never rescaled away: they
    stay below the deepest level as room for its values (a scale near 60 bits leaves ``q_0``
    alone too little room for the masked-gradient exchange's masks).

    Attributes:
        poly_modulus_degree: ring degree ``N``; a ciphertext holds ``N / 2`` slots.
        coeff_mod_bit_sizes: bit sizes of the chain.
        scale_bits: ``log2`` of the encoding scale.
        encryption: ``"symmetric"`` (only secret-key holders encrypt; about twice as fast) or
            ``"public-key"`` (anyone with the public context can encrypt).
        rescaling: the middle primes are rescaling primes (one per multiplicative level, each
            equal to the scale). ``False`` for circuits without multiplication (aggregation):
            every prime but the special one is then a data prime of any size and there are no
            levels.
        data_primes: primes that remain at the deepest level (``q_0`` and the first
            ``data_primes - 1`` primes of the scale's size; with ``rescaling`` only).

    Raises:
        InsecureParameterError: above the 128-bit limit (:func:`check_security`).
        ValueError: a malformed chain (fewer than two primes, a prime outside [scale, 60] bits,
            rescaling primes unequal to the scale, a special prime smaller than a data prime).
    """

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int
    encryption: Encryption = "public-key"
    rescaling: bool = True
    data_primes: int = 1

    def __post_init__(self) -> None:
        bits = tuple(int(b) for b in self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        check_security(self.poly_modulus_degree, bits)
        if len(bits) < 2:
            raise ValueError(
                f"a CKKS chain needs a data prime and a special prime, got {list(bits)}"
            )
        if isinstance(self.data_primes, bool) or self.data_primes not in range(1, len(bits)):
            raise ValueError(
                f"data_primes must lie in [1, {len(bits) - 1}] for the chain {list(bits)}, "
                f"got {self.data_primes!r}"
            )
        if self.data_primes > 1 and not self.rescaling:
            raise ValueError(
                "data_primes > 1 applies to rescaling chains only (without rescaling every "
                "prime but the special one is a data prime)"
            )
        if self.encryption not in ENCRYPTIONS:
            raise ValueError(f"encryption must be one of {ENCRYPTIONS}, got {self.encryption!r}")
        if not MIN_SCALE_BITS <= self.scale_bits < MAX_PRIME_BITS:
            raise ValueError(
                f"scale_bits must lie in [{MIN_SCALE_BITS}, {MAX_PRIME_BITS}), "
                f"got {self.scale_bits}"
            )
        if any(b > MAX_PRIME_BITS or b < MIN_SCALE_BITS for b in bits):
            raise ValueError(
                f"every prime must have {MIN_SCALE_BITS}..{MAX_PRIME_BITS} bits, got {list(bits)}"
            )
        if bits[0] <= self.scale_bits:
            raise ValueError(
                f"the first prime ({bits[0]} bits) must exceed the scale ({self.scale_bits} "
                "bits): it holds the integer part of every decrypted value"
            )
        middle = bits[1:-1]
        if self.rescaling and any(b != self.scale_bits for b in middle):
            raise ValueError(
                f"rescaling primes {list(middle)} must equal scale_bits={self.scale_bits}, "
                "or every rescale drifts the scale"
            )
        if bits[-1] < max(bits[:-1]):
            raise ValueError(
                f"the special prime ({bits[-1]} bits) must be at least the largest data prime "
                f"({max(bits[:-1])} bits)"
            )

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def levels(self) -> int:
        """Multiplicative levels (rescaling primes; none without ``rescaling``)."""
        return len(self.coeff_mod_bit_sizes) - 1 - self.data_primes if self.rescaling else 0

    @property
    def total_bits(self) -> int:
        return sum(self.coeff_mod_bit_sizes)

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    def max_abs_value(self, level: int = 0) -> float:
        """Largest ``|value|`` decryptable at ``level`` (0 = fresh): one bit of sign and margin.

        At level ``l`` the ciphertext modulus is ``q_0 .. q_{L-l}``; a value times the scale
        must stay below half of it.
        """
        if not 0 <= level <= self.levels:
            raise ValueError(f"level must lie in [0, {self.levels}], got {level}")
        remaining = sum(self.coeff_mod_bit_sizes[: len(self.coeff_mod_bit_sizes) - 1 - level])
        return float(2.0 ** (remaining - self.scale_bits - 2))

    @property
    def mask_bits(self) -> int:
        """The masked exchange's default mask size ``k`` (masks uniform in ``[-2^k, 2^k]``):
        two bits below what the deepest level holds, at most :data:`FUSION_MASK_BITS`."""
        return min(FUSION_MASK_BITS, int(np.log2(self.max_abs_value(self.levels))) - 2)

    def public(self) -> dict[str, object]:
        """JSON-ready description (what every party, and the view, may know)."""
        return {
            "scheme": "CKKS (TenSEAL 0.3.18 / SEAL)",
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "total_coeff_bits": self.total_bits,
            "max_coeff_bits_128": MAX_COEFF_BITS[self.poly_modulus_degree],
            "scale_bits": self.scale_bits,
            "slots": self.slots,
            "levels": self.levels,
            "data_primes": self.data_primes,
            "encryption": self.encryption,
        }


def _smallest_degree(total_bits: int) -> int:
    for degree, limit in MAX_COEFF_BITS.items():
        if total_bits <= limit:
            return degree
    raise InsecureParameterError(
        f"a chain of {total_bits} bits exceeds even degree 32768's 128-bit limit of "
        f"{MAX_COEFF_BITS[32768]} bits; use a shallower circuit or a smaller scale"
    )


def _fusion_chain(
    levels: int, scale_bits: int | None, degree: int | None
) -> tuple[int, list[int], int, int]:
    """``(scale, chain, degree, data primes)`` for ``levels`` rescaling levels (see
    :func:`parameters_for`)."""
    degrees = [degree] if degree is not None else list(MAX_COEFF_BITS)
    for candidate in degrees:
        limit = MAX_COEFF_BITS.get(candidate, 0)
        fits = (limit - 2 * FUSION_HEADROOM_BITS) // (levels + 2)
        scale = min(DEFAULT_SCALE_BITS, fits) if scale_bits is None else scale_bits
        if scale_bits is None and scale < MIN_FUSION_SCALE_BITS and degree is None:
            continue
        edge = min(MAX_PRIME_BITS, scale + FUSION_HEADROOM_BITS)
        # A scale within FUSION_HEADROOM_BITS of the largest prime leaves q_0 too little room
        # at the deepest level: one more prime of the scale's size stays there.
        spare = 1 if edge - scale < FUSION_HEADROOM_BITS else 0
        chain = [edge] + [scale] * (levels + spare) + [edge]
        if degree is None and sum(chain) > limit:
            continue
        return scale, chain, candidate, 1 + spare
    raise InsecureParameterError(
        f"{levels} levels at a scale of at least {MIN_FUSION_SCALE_BITS} bits exceed even degree "
        f"32768's 128-bit limit of {MAX_COEFF_BITS[32768]} bits; use a shallower circuit"
    )


def parameters_for(
    circuit: Circuit = "aggregation",
    *,
    poly_modulus_degree: int | None = None,
    coeff_mod_bit_sizes: Sequence[int] | None = None,
    scale_bits: int | None = None,
    encryption: Encryption = "public-key",
) -> CKKSParameters:
    """Pick (or validate given) parameters for ``circuit``.

    * aggregation: degree 8192 (4096 slots, as the spec's measurements), chain ``[60, 60, 60]``
      (180 of 218 bits, no rescaling), scale 2^50 (:data:`AGGREGATION_SCALE_BITS`); the data
      primes hold the sum of ``max_clients x value_bound`` (2^26 for the defaults) with 2^66 to
      spare.
    * fusion: the smallest degree whose 128-bit budget holds ``[s + 20, s x levels, s + 20]``
      with a scale ``s`` of at least 30 bits (``s`` is then as large as fits, at most 40). Depth 2,
      degree 2, training (3 levels): degree 8192, ``[55, 35, 35, 35, 55]`` (215 of 218 bits);
      4 levels: degree 16384, ``[60, 40, 40, 40, 40, 60]``. A given scale above 40 bits (a
      smaller CKKS error, e.g. for the masked exchange's released sums) gets one spare prime
      of its size that stays below the deepest level (``data_primes=2``): 2 levels at 2^55,
      ``[60, 55, 55, 55, 60]`` at degree 16384.

    Explicit arguments override the choice and are validated the same way.

    Raises:
        InsecureParameterError: the chain exceeds the 128-bit limit of the degree.
        ValueError: a chain too short for the circuit, or otherwise malformed.
    """
    if circuit == "aggregation":
        circuit = AggregationCircuit()
    if not isinstance(circuit, (AggregationCircuit, FusionCircuit)):
        raise ValueError(
            f"circuit must be 'aggregation', an AggregationCircuit or a FusionCircuit, "
            f"got {circuit!r}"
        )
    data_primes = 1
    if coeff_mod_bit_sizes is None:
        if isinstance(circuit, AggregationCircuit):
            edge = DEFAULT_EDGE_BITS
            scale = AGGREGATION_SCALE_BITS if scale_bits is None else scale_bits
            chain = [edge, edge, edge]
        else:
            scale, chain, degree_hint, data_primes = _fusion_chain(
                circuit.levels, scale_bits, poly_modulus_degree
            )
            poly_modulus_degree = poly_modulus_degree or degree_hint
    else:
        chain = [int(b) for b in coeff_mod_bit_sizes]
        if scale_bits is not None:
            scale = scale_bits
        elif len(chain) > 2:
            scale = chain[1]
        else:
            scale = min(DEFAULT_SCALE_BITS, chain[0] - 1)
    if scale < MIN_SCALE_BITS:
        raise ValueError(
            f"the circuit leaves a scale of only {scale} bits (minimum {MIN_SCALE_BITS}); "
            "raise the degree, or lower the headroom (aggregation: max_clients x value_bound) "
            "or the levels"
        )
    degree = _smallest_degree(sum(chain)) if poly_modulus_degree is None else poly_modulus_degree
    if isinstance(circuit, AggregationCircuit) and poly_modulus_degree is None:
        degree = max(degree, 8192)
    aggregation = isinstance(circuit, AggregationCircuit)
    params = CKKSParameters(
        degree, tuple(chain), int(scale), encryption, not aggregation, data_primes
    )
    if params.levels < circuit.levels:
        raise ValueError(
            f"the chain {list(params.coeff_mod_bit_sizes)} has {params.levels} rescaling "
            f"level(s); the circuit {circuit} needs {circuit.levels}"
        )
    if isinstance(circuit, AggregationCircuit):
        capacity = params.max_abs_value(0)
        needed = circuit.max_clients * circuit.value_bound
        if needed > capacity:
            raise ValueError(
                f"{circuit.max_clients} clients x value_bound {circuit.value_bound:g} = "
                f"{needed:g} exceeds the {capacity:g} that a {params.coeff_mod_bit_sizes[0]}-bit "
                f"decryption prime holds at scale 2^{params.scale_bits}"
            )
    return params


# ----------------------------------------------------------------------------- decryption error
def error_tail_factor(
    failure_bits: float = ERROR_FAILURE_BITS, values: int = ERROR_UNION_VALUES
) -> float:
    """``z`` such that ``values`` Gaussians all stay within ``z`` standard deviations except with
    probability ``2^-failure_bits`` (``P(|X| > z sd) <= 2 exp(-z^2 / 2)``, union bound)."""
    return math.sqrt(2 * (failure_bits * math.log(2) + math.log(2 * values)))


def _complex_tail(variance: float, values: int, failure_bits: float = ERROR_FAILURE_BITS) -> float:
    """``t`` with ``P(|X| > t) <= 2^-failure_bits / values`` for a circular complex Gaussian of
    ``E|X|^2 = variance`` (``P(|X| > t) = exp(-t^2 / variance)``)."""
    return math.sqrt(variance * (failure_bits * math.log(2) + math.log(values)))


def decryption_error_bound(params: CKKSParameters, n_summed: int) -> float:
    """High-probability bound on ``|decrypted - exact|`` per value of a sum of fresh ciphertexts.

    A slot's error is the real part of the canonical embedding of the error polynomial (a ring
    homomorphism: products of polynomials are slot-wise products). With ``N`` the ring degree:

    * symmetric encryption (SEAL's ``encrypt_symmetric``): the error is the fresh encryption
      error (coefficients of std :data:`SEAL_NOISE_STD`) plus the encoding's rounding
      (variance 1/12): per slot a Gaussian of variance ``N/2 (3.2^2 + 1/12)`` per ciphertext,
      independent across ciphertexts; bound ``z sqrt(n N/2 (3.2^2 + 1/12))``;
    * public key: SEAL encrypts modulo ``q p`` and divides by the special prime ``p``, which
      leaves rounding errors ``r_0 + r_1 s`` (uniform on ``[-1/2, 1/2]``) with ``s`` the
      uniform ternary secret. The slot of ``r_1 s`` is ``sigma(r_1)_i sigma(s)_i``: the secret's
      slot is the same in every ciphertext (``E|sigma(s)_i|^2 = 2N/3``) and the sum of the
      ``n`` rounding slots has ``E|.|^2 = n N/12``, so the term is at most the product of their
      complex-Gaussian tails (heavier-tailed than a Gaussian: a key-dependent factor per slot);
      ``r_0`` and the encoding add a Gaussian of variance ``n N/12``.

    ``z`` is :func:`error_tail_factor` (2^-40 failure over 2^32 values); all divided by the scale.
    It covers the encryption noise and the encoding's rounding of ring arithmetic without
    rescaling (the aggregation shape); the floating-point decoding error, about ``2^-52``
    relative to the message, is not modelled (negligible at the scales picked here for values
    below 2^10; see docs/ckks.md). ``tests/test_claims_ckks.py`` checks the bound against
    measured sums.

    Args:
        params: the parameter set (ring degree, scale, encryption type).
        n_summed: ciphertexts added into the one decrypted (the round's clients, at most).
    """
    if isinstance(n_summed, bool) or int(n_summed) < 1:
        raise ValueError(f"n_summed must be >= 1, got {n_summed!r}")
    n, degree = int(n_summed), float(params.poly_modulus_degree)
    z = error_tail_factor()
    if params.encryption == "symmetric":
        bound = z * math.sqrt(n * degree / 2 * (SEAL_NOISE_STD**2 + 1 / 12))
    else:
        secret_slot = _complex_tail(2 * degree / 3, params.slots)
        rounding_sum = _complex_tail(n * degree / 12, ERROR_UNION_VALUES)
        bound = secret_slot * rounding_sum + z * math.sqrt(n * degree / 12)
    return bound / params.scale


# ----------------------------------------------------------------------------- envelopes
@dataclass(frozen=True, eq=False)
class Ciphertext:
    """One serialized CKKS ciphertext as it travels: bytes, the key id, the meaningful length.

    Attributes:
        key_id: id of the key it was made under (:attr:`SecretContext.key_id`).
        data: TenSEAL serialization of a one-ciphertext CKKSVector.
        length: number of meaningful slots (the rest are padding).
    """

    key_id: str
    data: bytes
    length: int

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def digest(self) -> bytes:
        """SHA-256 of the serialized bytes (what a view keeps when the bytes are too big)."""
        return hashlib.sha256(self.data).digest()


def chunk_count(length: int, slots: int) -> int:
    """Ciphertexts needed for ``length`` values at ``slots`` per ciphertext."""
    return max(1, -(-int(length) // int(slots)))


class _ContextBase:
    """Shared plumbing: the TenSEAL context, its id, loading and dumping envelopes.

    Contexts with ``check_slot`` (those of the aggregation circuit) reserve the last slot of
    every ciphertext they encrypt for a check value, 0: sums keep it 0, and a key holder
    verifies it after decryption (:meth:`SecretContext.decrypt`). A ciphertext made under
    another key but labelled with this key's id decrypts there to garbage of the order of
    ``q / scale`` in every slot, so its check slot is refused: the server, who relays and adds
    ciphertexts but holds no secret key, cannot relabel a ciphertext undetected.
    """

    params: CKKSParameters
    key_id: str
    check_slot: bool
    _context: ts.Context

    @property
    def data_slots(self) -> int:
        """Slots per ciphertext that carry values (one fewer with a check slot)."""
        return self.params.slots - int(self.check_slot)

    @property
    def tenseal(self) -> ts.Context:
        """The underlying TenSEAL context (for evaluating on :class:`tenseal.CKKSVector`)."""
        return self._context

    def load(self, ciphertext: Ciphertext) -> ts.CKKSVector:
        """Deserialize an envelope into this context.

        Raises:
            ContextMismatchError: made under another key, or bytes this context cannot parse.
        """
        if not isinstance(ciphertext, Ciphertext):
            raise TypeError(f"expected a Ciphertext envelope, got {type(ciphertext).__name__}")
        if ciphertext.key_id != self.key_id:
            raise ContextMismatchError(
                f"ciphertext was made under key {ciphertext.key_id}, this context holds key "
                f"{self.key_id}: refusing it (decryption would return garbage)"
            )
        try:
            return ts.ckks_vector_from(self._context, ciphertext.data)
        except (RuntimeError, ValueError) as error:
            raise ContextMismatchError(
                f"ciphertext bytes do not parse under this context's parameters "
                f"({self.params.poly_modulus_degree}, {list(self.params.coeff_mod_bit_sizes)}): "
                f"{error}"
            ) from error

    def dump(self, vector: ts.CKKSVector, length: int) -> Ciphertext:
        """Serialize ``vector`` (made or evaluated under this context) into an envelope."""
        return Ciphertext(self.key_id, vector.serialize(), int(length))

    def _encrypt_chunks(self, values: np.ndarray) -> list[Ciphertext]:
        values = finite_array("values to encrypt", values)
        if values.ndim != 1:
            raise ValueError(f"encrypt takes a 1-D vector, got shape {values.shape}")
        slots = self.data_slots
        out = []
        for start in range(0, max(len(values), 1), slots):
            chunk = values[start : start + slots]
            if self.check_slot:
                # Zero-padded to every slot; the last one (the check value 0) stays 0.
                padded = np.zeros(self.params.slots)
                padded[: len(chunk)] = chunk
                out.append(self.dump(self.encrypt_vector(padded), len(chunk)))
            else:
                out.append(self.dump(self.encrypt_vector(chunk), len(chunk)))
        return out

    def encrypt_vector(self, values: np.ndarray) -> ts.CKKSVector:
        """Encrypt at most ``slots`` values into one ciphertext."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1 or len(values) > self.params.slots:
            raise ValueError(
                f"one ciphertext holds a 1-D vector of at most {self.params.slots} values, "
                f"got shape {values.shape}"
            )
        if len(values) == 0:
            values = np.zeros(1)
        # The raw constructor skips TenSEAL's PlainTensor round trip (about 0.1 ms per call).
        return ts.CKKSVector(data=ts._ts_cpp.CKKSVector(self._context.data, values.tolist()))


class PublicContext(_ContextBase):
    """The server's view of the keys: parameters, relinearization keys, maybe the public key.

    Built from ``SecretContext.serialize(save_secret_key=False)`` bytes; it never held a secret
    key, so it cannot decrypt. It adds and multiplies ciphertexts; with ``"public-key"``
    encryption it can also encrypt (a committee model, in which clients need only this).

    Args:
        serialized: TenSEAL context bytes without the secret key.
        key_id: id of the key pair (travels with the bytes).
        params: the parameter set.
        check_slot: reserve the last slot of every ciphertext it encrypts for the check value
            (as the key holders' context does; see :class:`_ContextBase`).

    Raises:
        InsecureParameterError: if the bytes hold a secret key (never give one to a server).
    """

    def __init__(
        self, serialized: bytes, *, key_id: str, params: CKKSParameters, check_slot: bool = True
    ) -> None:
        context = ts.context_from(serialized, n_threads=1)
        if context.has_secret_key():
            raise InsecureParameterError(
                "the serialized context holds a secret key: a PublicContext must be built from "
                "serialize(save_secret_key=False)"
            )
        context.global_scale = params.scale
        self._context = context
        self.serialized = bytes(serialized)
        self.key_id = key_id
        self.params = params
        self.check_slot = bool(check_slot)

    def __reduce__(self):
        # Pickles as its own serialization (no secret key in it): for process-parallel runs.
        return (
            _public_from_state,
            (self.serialized, self.key_id, self.params, self.check_slot),
        )

    @property
    def nbytes(self) -> int:
        """Size of what a server (or a committee-model client) downloads."""
        return len(self.serialized)

    @property
    def can_encrypt(self) -> bool:
        return self.params.encryption == "public-key"

    @property
    def has_relin_keys(self) -> bool:
        return bool(self._context.has_relin_keys())

    def encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """Encrypt ``values`` into ``ceil(len / slots)`` ciphertexts (public-key contexts only).

        Raises:
            ValueError: for a symmetric context (only key holders can encrypt).
        """
        if not self.can_encrypt:
            raise ValueError(
                "this public context comes from a symmetric-encryption key: only the key "
                "holders (SecretContext) can encrypt"
            )
        return self._encrypt_chunks(values)

    def encrypt_vector(self, values: np.ndarray) -> ts.CKKSVector:
        if not self.can_encrypt:
            raise ValueError("a symmetric public context cannot encrypt")
        return super().encrypt_vector(values)


class SecretContext(_ContextBase):
    """The key holders' context: encrypts, decrypts, and hands out :class:`PublicContext` copies.

    Args:
        params: a validated parameter set (see :func:`ckks_context`).
        relin_keys: generate relinearization keys (needed for ciphertext products).
        galois_keys: generate Galois keys (rotations; about 35 MB at degree 8192: only for
            circuits that rotate, which none in securefed does).
        check_slot: reserve a check slot in every ciphertext :meth:`encrypt` makes and verify it
            in :meth:`decrypt` (default; the fusion circuit, which uses every slot, turns it
            off: :func:`ckks_context`).
    """

    def __init__(
        self,
        params: CKKSParameters,
        *,
        relin_keys: bool = True,
        galois_keys: bool = False,
        check_slot: bool = True,
    ) -> None:
        encryption_type = (
            ts.ENCRYPTION_TYPE.SYMMETRIC
            if params.encryption == "symmetric"
            else ts.ENCRYPTION_TYPE.ASYMMETRIC
        )
        context = ts.context(
            ts.SCHEME_TYPE.CKKS,
            params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
            encryption_type=encryption_type,
            n_threads=1,
        )
        context.global_scale = params.scale
        if galois_keys:
            context.generate_galois_keys()
        self._context = context
        self.params = params
        self._relin = bool(relin_keys)
        self._galois = bool(galois_keys)
        self.check_slot = bool(check_slot)
        # Relinearization keys are fresh randomness under this secret key: their hash names it.
        material = context.serialize(
            save_public_key=False,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=True,
        )
        self.key_id = hashlib.sha256(material).hexdigest()[:16]
        self._public: PublicContext | None = None

    def __reduce__(self):
        # For process-parallel simulations only: the pickle holds the secret key.
        state = self.serialize_secret()
        return (
            _secret_from_state,
            (state, self.key_id, self.params, self._relin, self._galois, self.check_slot),
        )

    def serialize_secret(self, *, evaluation_keys: bool = True) -> bytes:
        """TenSEAL's own serialization *with* the secret key (``save_secret_key=True``).

        For provisioning the key holders out of band (:func:`save_secret_context`); never send
        these bytes to a server. ``evaluation_keys=False`` leaves out the relinearization and
        Galois keys (what a key holder that only encrypts and decrypts keeps: smaller, faster to
        load; :func:`secret_context_from_bytes` with ``evaluation_keys=False``).
        """
        return self._context.serialize(
            save_public_key=self.params.encryption == "public-key",
            save_secret_key=True,
            save_galois_keys=self._galois and evaluation_keys,
            save_relin_keys=evaluation_keys,
        )

    def serialize_public(self) -> bytes:
        """The context without its secret key (``save_secret_key=False``)."""
        return self._context.serialize(
            save_public_key=self.params.encryption == "public-key",
            save_secret_key=False,
            save_galois_keys=self._galois,
            save_relin_keys=self._relin,
        )

    def public(self) -> PublicContext:
        """The :class:`PublicContext` for a server (built once from the serialized bytes)."""
        if self._public is None:
            self._public = PublicContext(
                self.serialize_public(),
                key_id=self.key_id,
                params=self.params,
                check_slot=self.check_slot,
            )
        return self._public

    def encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """Encrypt ``values`` into ``ceil(len / slots)`` ciphertexts, filling every slot."""
        return self._encrypt_chunks(values)

    def decrypt(self, ciphertexts: Ciphertext | Sequence[Ciphertext]) -> np.ndarray:
        """Decrypt one envelope or the concatenation of several (their meaningful slots).

        With ``check_slot`` every ciphertext's check slot must decrypt to 0 (within
        :data:`CHECK_SLOT_TOLERANCE`) before any value is returned.

        Raises:
            ContextMismatchError: an envelope labelled with another key's id, or one made under
                another key but labelled with this one's (its check slot decrypts to garbage).
        """
        if isinstance(ciphertexts, Ciphertext):
            ciphertexts = [ciphertexts]
        parts = [self._decrypt_checked(c) for c in ciphertexts]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _decrypt_checked(self, ciphertext: Ciphertext) -> np.ndarray:
        values = self.decrypt_vector(self.load(ciphertext))
        if not self.check_slot:
            return values[: ciphertext.length]
        slots = self.params.slots
        if len(values) != slots or not 0 <= ciphertext.length < slots:
            raise ContextMismatchError(
                f"ciphertext labelled with key {ciphertext.key_id} holds {len(values)} slots "
                f"({ciphertext.length} meaningful); this key's ciphertexts hold {slots} with "
                "the last one a check slot: not made by this key's holders"
            )
        check = float(values[-1])
        if not abs(check) <= CHECK_SLOT_TOLERANCE:
            raise ContextMismatchError(
                f"ciphertext labelled with key {ciphertext.key_id} fails its check slot "
                f"(decrypts to {check:.3g}, not 0): it was made under another key and relabelled, "
                "or corrupted; refusing it rather than decrypting garbage"
            )
        return values[: ciphertext.length]

    def decrypt_vector(self, vector: ts.CKKSVector, length: int | None = None) -> np.ndarray:
        """Decrypt an in-memory vector with this context's secret key (first ``length`` slots)."""
        values = np.asarray(vector.decrypt(self._context.secret_key()), dtype=np.float64)
        return values if length is None else values[:length]


# TenSEAL's serialized context is a protobuf message whose field 4 is the encryption type
# (varint; 1 = symmetric). Protobuf keeps the last occurrence of a scalar field, so appending
# tag 0x20 (field 4, wire type 0) with value 1 switches the reloaded context to symmetric; the
# twin's test checks the switch took (its fresh error is the symmetric one).
_SYMMETRIC_FIELD = bytes([0x20, 0x01])
"""TenSEALContextProto field 4 (``encryption_type``, a varint) set to 1 (symmetric): proto3 omits
the default 0 (asymmetric), so a public-key context's bytes end without it."""


def symmetric_twin(secret: SecretContext) -> ts.Context:
    """A symmetric-encryption TenSEAL context under ``secret``'s own key (the key holder's only).

    Encrypting with the secret key (SEAL's ``encrypt_symmetric``) is about twice as fast as
    with the public key and leaves only the fresh error (no ``r_1 s`` rounding term), about 40
    times smaller per slot (:func:`decryption_error_bound`). TenSEAL fixes one encryption type
    per context, so the twin is the key holder's context reloaded from its own bytes (secret key,
    no public key) with the encryption type set to symmetric; its ciphertexts decrypt under
    ``secret`` and evaluate under its :class:`PublicContext` (same parameters and key).

    Raises:
        ValueError: the context is symmetric already (use it directly).
    """
    if secret.params.encryption != "public-key":
        raise ValueError("symmetric_twin is for public-key contexts; this one is symmetric")
    raw = secret.tenseal.serialize(
        save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
    )
    twin = ts.context_from(raw + _SYMMETRIC_FIELD, n_threads=1)
    twin.global_scale = secret.params.scale
    return twin


def _public_from_state(
    serialized: bytes, key_id: str, params: CKKSParameters, check_slot: bool = True
) -> PublicContext:
    return PublicContext(serialized, key_id=key_id, params=params, check_slot=check_slot)


def secret_context_from_bytes(
    serialized: bytes,
    *,
    key_id: str,
    params: CKKSParameters,
    check_slot: bool = False,
    evaluation_keys: bool = True,
) -> SecretContext:
    """A key holder's :class:`SecretContext` rebuilt from its own
    :meth:`SecretContext.serialize_secret` bytes (a node keeping its key in its private state
    between messages; never bytes a server handed it). ``evaluation_keys``: as they were
    serialized (without them the context encrypts and decrypts only).

    Raises:
        InsecureParameterError: the bytes hold no secret key.
    """
    context = ts.context_from(bytes(serialized), n_threads=1)
    if not context.has_secret_key():
        raise InsecureParameterError(
            "the serialized context holds no secret key: a key holder's state is its own "
            "serialize_secret() bytes"
        )
    return _secret_from_state(
        bytes(serialized), key_id, params, evaluation_keys, False, check_slot, context=context
    )


def _secret_from_state(
    serialized: bytes,
    key_id: str,
    params: CKKSParameters,
    relin: bool,
    galois: bool,
    check_slot: bool = True,
    context: ts.Context | None = None,
) -> SecretContext:
    secret = SecretContext.__new__(SecretContext)
    context = ts.context_from(serialized, n_threads=1) if context is None else context
    context.global_scale = params.scale
    secret._context = context
    secret.params = params
    secret._relin, secret._galois = relin, galois
    secret.check_slot = bool(check_slot)
    secret.key_id = key_id
    secret._public = None
    return secret


# ----------------------------------------------------------------------------- key files
SECRET_FILE_MAGIC = b"securefed-ckks-secret-context/1\n"
PUBLIC_FILE_MAGIC = b"securefed-ckks-public-context/1\n"
SECRET_FILE_MODE = 0o600
"""A secret-context file is readable and writable by its owner only (as ssh's private keys)."""


def _params_header(params: CKKSParameters) -> dict[str, object]:
    return {
        "poly_modulus_degree": params.poly_modulus_degree,
        "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes),
        "scale_bits": params.scale_bits,
        "encryption": params.encryption,
        "rescaling": params.rescaling,
        "data_primes": params.data_primes,
    }


def _write_key_file(
    path: str | os.PathLike, magic: bytes, header: dict[str, object], payload: bytes
) -> Path:
    """Write ``magic``, one JSON header line and ``payload`` atomically, mode 0600.

    The file is created by :func:`tempfile.mkstemp` (mode 0600 from the start, so the bytes are
    never readable by others, not even briefly) in the target's directory and renamed over it.
    """
    path = Path(path)
    header = header | {"sha256": hashlib.sha256(payload).hexdigest(), "nbytes": len(payload)}
    line = json.dumps(header, sort_keys=True).encode() + b"\n"
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(magic + line + payload)
        os.chmod(temporary, SECRET_FILE_MODE)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _read_key_file(path: str | os.PathLike, magic: bytes) -> tuple[dict[str, object], bytes]:
    """``(header, payload)`` of a key file, its magic line and SHA-256 checked.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a key file of this kind, a malformed header, or corrupted bytes.
    """
    path = Path(path)
    data = path.read_bytes()
    if not data.startswith(magic):
        raise ValueError(
            f"{path} is not a {magic.decode().strip()} file (it starts with {data[:32]!r})"
        )
    end = data.find(b"\n", len(magic))
    try:
        header = json.loads(data[len(magic) : end])
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: malformed header: {error}") from error
    payload = data[end + 1 :]
    if len(payload) != header.get("nbytes") or (
        hashlib.sha256(payload).hexdigest() != header.get("sha256")
    ):
        raise ValueError(
            f"{path}: the context bytes do not match the header's size and SHA-256 (truncated "
            "or corrupted file)"
        )
    return header, payload


def _params_from_header(path: Path, header: dict[str, object]) -> CKKSParameters:
    try:
        return CKKSParameters(
            int(header["poly_modulus_degree"]),
            tuple(int(b) for b in header["coeff_mod_bit_sizes"]),
            int(header["scale_bits"]),
            str(header["encryption"]),
            bool(header.get("rescaling", True)),
            int(header.get("data_primes", 1)),
        )
    except KeyError as error:
        raise ValueError(f"{path}: the header lacks {error}") from error


def save_secret_context(secret: SecretContext, path: str | os.PathLike) -> Path:
    """Write the key holders' context for out-of-band provisioning: no pickle, mode 0600.

    The file is a magic line, one JSON header line (the public parameters, the key id, the
    SHA-256 and size of the payload) and TenSEAL's own ``serialize(save_secret_key=True)``
    bytes. Copy it to each key holder over a secure channel (e.g. ``scp``), never to a server;
    :func:`load_secret_context` reads it and refuses a file others may read.

    Returns:
        The path written.
    """
    if not isinstance(secret, SecretContext):
        raise TypeError(f"expected a SecretContext, got {type(secret).__name__}")
    header = _params_header(secret.params) | {
        "key_id": secret.key_id,
        "relin_keys": secret._relin,
        "galois_keys": secret._galois,
        "check_slot": secret.check_slot,
    }
    return _write_key_file(path, SECRET_FILE_MAGIC, header, secret.serialize_secret())


def load_secret_context(path: str | os.PathLike) -> SecretContext:
    """Read a file of :func:`save_secret_context` (TenSEAL bytes; nothing is unpickled).

    Raises:
        InsecureParameterError: the file is readable or writable by its group or others (POSIX;
            ``chmod 600`` it), or holds no secret key.
        ValueError: not a secret-context file, or corrupted.
    """
    path = Path(path)
    if os.name == "posix":
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise InsecureParameterError(
                f"{path} holds a CKKS secret key but has mode {mode:04o}: others may read or "
                f"replace it; run `chmod 600 {path}`"
            )
    header, payload = _read_key_file(path, SECRET_FILE_MAGIC)
    params = _params_from_header(path, header)
    context = ts.context_from(payload, n_threads=1)
    if not context.has_secret_key():
        raise InsecureParameterError(f"{path} holds no secret key: it cannot decrypt")
    return _secret_from_state(
        payload,
        str(header["key_id"]),
        params,
        bool(header.get("relin_keys", True)),
        bool(header.get("galois_keys", False)),
        bool(header.get("check_slot", True)),
        context=context,
    )


def save_public_context(public: PublicContext | SecretContext, path: str | os.PathLike) -> Path:
    """Write the server's context (``serialize(save_secret_key=False)`` bytes, no pickle).

    A :class:`SecretContext` is accepted and reduced to its :meth:`SecretContext.public` view
    first: the file never holds the secret key.
    """
    if isinstance(public, SecretContext):
        public = public.public()
    if not isinstance(public, PublicContext):
        raise TypeError(f"expected a PublicContext, got {type(public).__name__}")
    header = _params_header(public.params) | {
        "key_id": public.key_id,
        "check_slot": public.check_slot,
    }
    return _write_key_file(path, PUBLIC_FILE_MAGIC, header, public.serialized)


def load_public_context(path: str | os.PathLike) -> PublicContext:
    """Read a file of :func:`save_public_context`.

    Raises:
        InsecureParameterError: the bytes hold a secret key (a server must never load one).
        ValueError: not a public-context file, or corrupted.
    """
    path = Path(path)
    header, payload = _read_key_file(path, PUBLIC_FILE_MAGIC)
    params = _params_from_header(path, header)
    return PublicContext(
        payload,
        key_id=str(header["key_id"]),
        params=params,
        check_slot=bool(header.get("check_slot", True)),
    )


def ckks_context(
    circuit: Circuit = "aggregation",
    *,
    poly_modulus_degree: int | None = None,
    coeff_mod_bit_sizes: Sequence[int] | None = None,
    scale_bits: int | None = None,
    encryption: Encryption = "public-key",
) -> SecretContext:
    """Generate keys for ``circuit`` (see :func:`parameters_for` for the choice and the checks).

    Returns the key holders' :class:`SecretContext`; give a server only ``.public()``.

    Example:
        >>> secret = ckks_context("aggregation")
        >>> server = secret.public()
        >>> [c] = secret.encrypt(np.array([1.0, 2.0]))
        >>> total = server.load(c) + server.load(c)
        >>> np.round(secret.decrypt(server.dump(total, 2)), 4).tolist()
        [2.0, 4.0]
    """
    params = parameters_for(
        circuit,
        poly_modulus_degree=poly_modulus_degree,
        coeff_mod_bit_sizes=coeff_mod_bit_sizes,
        scale_bits=scale_bits,
        encryption=encryption,
    )
    fusion = isinstance(circuit, FusionCircuit)
    # Fusion ciphertexts use every slot (masks cover them all): no check slot there.
    return SecretContext(params, relin_keys=fusion, check_slot=not fusion)


# ----------------------------------------------------------------------------- releasing values
@dataclass(frozen=True)
class Flooding:
    """What a key holder does to decrypted values before they reach a ciphertext's holder.

    CKKS decryption returns ``m + e`` with ``e`` a function of the secret key and the encryption
    randomness; handing ``m + e`` to the party that holds the ciphertext lets it set up linear
    equations in the secret key (Li and Micciancio, EUROCRYPT 2021). The key holder therefore adds
    Gaussian noise and rounds to a multiple of ``step`` before a decryption leaves it. The noise
    std follows from the decryption-error bound of the parameters
    (:func:`decryption_error_bound`) and the level ``security_bits`` (:func:`flooding_floor`:
    per released value, KL divergence at most ``2^-security_bits`` from the value without the
    key-dependent error); it is never below that floor.

    Attributes:
        std: the flooding std; ``None``: the floor for the bound (:meth:`std_for`). A value
            below the floor is refused when the bound is known.
        step: rounding grid (0 disables rounding; post-processing, no effect on the level).
        security_bits: the level ``s`` (default :data:`DEFAULT_FLOODING_SECURITY_BITS`).
        tests_only: set by :meth:`unsafe_for_tests` only: no floor, ``std`` may be 0. Views
            record it as ``ckks_flooding_unsafe_for_tests`` (an error for the audit).

    Raises:
        ValueError: ``std <= 0`` (flooding disabled: only :meth:`unsafe_for_tests` allows it),
            a negative or non-finite ``step``, ``security_bits`` above 128 or not a number.
        InsecureParameterError: ``security_bits`` below :data:`MIN_FLOODING_SECURITY_BITS`.
    """

    std: float | None = None
    step: float = 2.0**-24
    security_bits: float = DEFAULT_FLOODING_SECURITY_BITS
    tests_only: bool = False

    def __post_init__(self) -> None:
        if not np.isfinite(self.step) or self.step < 0:
            raise ValueError(f"flooding step must be finite and >= 0, got {self.step!r}")
        if self.tests_only:
            if self.std is None or not np.isfinite(self.std) or self.std < 0:
                raise ValueError(f"unsafe flooding std must be finite and >= 0, got {self.std!r}")
            return
        if self.std is not None and (not np.isfinite(self.std) or self.std <= 0):
            raise ValueError(
                f"flooding std must be finite and > 0, got {self.std!r}: unflooded CKKS "
                "decryptions reveal the secret key (Li and Micciancio 2021); use std=None for "
                "the floor, or Flooding.unsafe_for_tests(...) in tests"
            )
        bits = self.security_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not bits <= 128:
            raise ValueError(
                f"security_bits must be a number in [{MIN_FLOODING_SECURITY_BITS}, 128], "
                f"got {bits!r}"
            )
        if not bits >= MIN_FLOODING_SECURITY_BITS:
            raise InsecureParameterError(
                f"flooding security_bits {bits!r} is below the floor of "
                f"{MIN_FLOODING_SECURITY_BITS} bits: each released decryption would leak up to "
                f"2^-{bits:g} nats of its key-dependent error (Li and Micciancio 2021); use the "
                f"default ({DEFAULT_FLOODING_SECURITY_BITS}) or at least "
                f"{MIN_FLOODING_SECURITY_BITS}"
            )

    @classmethod
    def unsafe_for_tests(cls, std: float = 0.0, step: float = 0.0) -> Flooding:
        """Flooding below the floor, or none: for tests of exact CKKS arithmetic only.

        Recorded in the view as ``ckks_flooding_unsafe_for_tests``; never use it in a run.
        """
        return cls(std=std, step=step, tests_only=True)

    def floor(self, error_bound: float) -> float:
        """:func:`flooding_floor` at this level (0 for :meth:`unsafe_for_tests`)."""
        return 0.0 if self.tests_only else flooding_floor(error_bound, self.security_bits)

    def std_for(self, error_bound: float) -> float:
        """The std to flood with against a decryption error of at most ``error_bound``.

        Raises:
            InsecureParameterError: a given ``std`` below the floor (naming both).
        """
        floor = self.floor(error_bound)
        if self.std is None:
            return floor
        if self.std < floor:
            raise InsecureParameterError(
                f"flooding std {self.std:g} is below the floor {floor:g} that a decryption "
                f"error of {error_bound:g} needs at {self.security_bits:g}-bit security "
                "(error x 2^((s - 1) / 2)); raise it, leave it None, or raise the scale"
            )
        return float(self.std)

    def calibrated(self, error_bound: float) -> Flooding:
        """This flooding with ``std`` fixed for ``error_bound`` (validated by :meth:`std_for`)."""
        return replace(self, std=self.std_for(error_bound))

    def apply(self, values: np.ndarray, noise, *, error_bound: float) -> np.ndarray:
        """``round((values + N(0, std^2)) / step) * step``; ``noise`` is a NoiseSource.

        Raises:
            InsecureParameterError: ``std`` below the floor for ``error_bound``.
        """
        return self._release(values, self.std_for(error_bound), noise)

    def apply_without_bound(self, values: np.ndarray, noise) -> np.ndarray:
        """:meth:`apply` with the given ``std`` where no decryption-error bound is stated (the
        fusion circuit): nothing checks the floor, and the caller's view must say so.

        Raises:
            ValueError: ``std`` is ``None`` (the floor needs a bound).
        """
        if self.std is None:
            raise ValueError("flooding with std=None needs a decryption-error bound (apply)")
        return self._release(values, float(self.std), noise)

    def _release(self, values: np.ndarray, std: float, noise) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if std > 0:
            values = values + noise.normal(std, values.shape)
        if self.step > 0:
            values = np.round(values / self.step) * self.step
        return values

    def public(self) -> dict[str, object]:
        """``flood_std`` (when fixed), ``round_step``, the level and, if set, the test flag."""
        out: dict[str, object] = {"round_step": self.step}
        if self.std is not None:
            out["flood_std"] = self.std
        if self.tests_only:
            out["ckks_flooding_unsafe_for_tests"] = True
        else:
            out["ckks_flooding_security_bits"] = self.security_bits
        return out
