"""FedSlate's server network on CKKS in a packed circuit: two ciphertext products a forward.

The function, the keys, the released batch sums and what each side sees are those of
:class:`~securefed.fusion.ckks_module.CKKSModuleFusionChannel` (read its docstring first); the
circuit differs. That channel encrypts each party's vector once and builds every monomial
``x^m`` by ciphertext products, then releases each monomial's batch sum ``sum g x^m`` by its own
masked exchange: at (10, 3), 3 members, batch 32, a learning step is 16 encryptions, 26
ciphertext and 26 plaintext products and 12 decryptions at ring 16384 (0.8-0.9 s of CPU). This
circuit serves networks of degree ``D <= 2`` (one hidden layer with the quadratic activation, or
the linear ablation) of the owner ``x_0`` and one other party ``x_1`` (or any number of parties
with ``cross=False``), ``f = c + a_0 x_0 + a_1 x_1 + b_00 x_0^2 + b_01 x_0 x_1 + b_11 x_1^2``:

* **Regions.** A ciphertext holds ``R = 3`` regions of ``n`` slots (the ``(members, batch,
  width)`` entries of a chunk, flattened; ``3 n <= N / 2``, so at (10, 3) one ciphertext of
  2880 of the 4096 slots at ring 8192). Party 1 encrypts ``Q = [x_1 | x_1 | x_1^2]`` under the
  owner's public key; the owner encrypts ``P = [x_0 | 0 | 0]`` under its own key with the secret
  key (:func:`~securefed.crypto.ckks.symmetric_twin`: half the cost of a public-key encryption,
  and a fresh error about 40 times smaller). A party computes the powers of its own vector in
  the clear: no ciphertext product builds them.
* **Forward** (region 0): ``L_0 = a_0 + b_00 P + b_01 Q``, ``L_1 = a_1 + b_11 Q``,
  ``f = c + P L_0 + Q L_1``: three plaintext and two ciphertext products, two levels, one
  output ciphertext (the other regions decrypt to zero). Evaluated on SEAL's own objects
  (:class:`_SealEvaluator`): ``L_0`` and ``L_1`` are each rescaled once after their sums,
  the two ciphertext products are summed, rescaled and relinearized once, and the server's
  coefficient vectors are encoded once per content (so once per weight version: the acting
  inquiries between two learning steps reuse them). The coefficient vectors hold each
  slot's member's coefficient times ``2^-shift`` (``output_shift_bits``): the deepest level of
  the chain ``[60, s, s, 60]`` decrypts values below ``2^(58 - s)``, so the outputs are scaled
  into it and the party multiplies them back; the server refuses (before evaluating) weights
  whose worst-case output over the public value bound would not fit.
* **Backward.** The owner encrypts ``G = [g | g x_0 | g]`` (its own values); one product
  ``E = G Q = [g x_1 | g x_0 x_1 | g x_1^2]`` holds the three batch sums that involve the other
  party, released by **one** masked exchange (uniform masks of ``2^16`` on the real and the
  imaginary part of every slot, the vector's replicas beyond its ``3 n`` entries included, added
  at level 1 as a fresh public-key encryption: :func:`~securefed.fusion.ckks_module.
  every_slot_mask`; the owner decrypts, sums each member's slots per region, floods at the floor of
  :func:`packed_sum_error_bound` and rounds). The sums of ``g``, ``g x_0`` and ``g x_0^2`` the
  owner computes in the clear and releases flooded and rounded the same way, so the server's
  view is the batch sums of the monomial circuit, at a smaller flooding std. The input gradient
  ``g (a_0 + 2 b_00 x_0 + b_01 x_1) = G (L_0 + b_00 P)`` is one more product.
* **A repeated inquiry** (``repeat_inquiries``): a training forward whose vectors, output
  party and online weights equal those of the last forward (FedSlate's learning forward of a
  platform without rewards repeats the slate-selection forward of the same batch) reuses its
  ciphertexts: the parties send nothing new, the owner keeps the values it decrypted. The
  server learns that the vectors repeated, which FedSlate's protocol makes public anyway.

* **A joined forward** (:meth:`PackedCKKSModuleFusionChannel.announce`, with
  ``repeat_inquiries``): the next training forward's vectors sent ahead of a forward without
  training for the same owner (FedSlate: A's Algorithm-1 forward, ahead of the targets'); when
  ``4 n <= N / 2`` both evaluate in one ciphertext, ``P = [x_0 | 0 | 0 | x_0']``, ``Q = [x_1 |
  x_1 | x_1^2 | x_1']``, the coefficient vectors holding the online network's in region 0 and
  the other's in region 3, and the training forward repeats it.

* **The server half alone** (``public_contexts``, parties on other machines: FedSlate on
  Flower): ``serve_forward``, ``serve_backward`` and ``finish_backward`` of
  :class:`PackedCKKSModuleFusionChannel` run the same evaluation,
  re-randomization, masking and unmasking on the serialized ``P``, ``Q`` and ``G`` the parties
  sent (:class:`PackedKeyParty` builds, decrypts and releases them from the public shapes:
  :func:`packed_chunks`, :func:`region_segments`, :func:`packed_flooding_std`). Both savings
  are carried: ``serve_forward(joined=True)`` evaluates the announced training forward's
  regions beside a forward without training, and :meth:`serve_repeat
  <PackedCKKSModuleFusionChannel.serve_repeat>` serves a training forward from the last
  forward's ciphertexts, the server deciding from what it holds (public shapes, the online
  weights' version) and each party checking on its own machine that its vectors repeat
  (``rl/flower_fedslate.py``). The parties' keys follow :func:`packed_key_circuit`.

Every returned output and input gradient is relinearized (two components) and re-randomized
with a fresh public-key encryption, made at the returned ciphertext's own level, of Gaussian
noise of std ``output_noise_std * 2^-shift`` (``output_noise_std`` on the value the party
reads) on the real parts of the slots the party reads, of std ``2^-13`` of the deepest level's
room on the real parts of all others (they hold rounding errors, a joined input gradient's
region 3: the owner's fresh error times the other network's derivative, or replicas beyond the
vector) and :data:`~securefed.fusion.ckks_module.IMAGINARY_STD` on every imaginary part, and
the polynomial's constant; the masked exchange's product is relinearized and masked in a fresh
encryption (above). :func:`packed_error_bounds` states the error model (every fresh
encryption, relinearization, rescaling and plaintext encoding adding at most its own bound).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from securefed.crypto.ckks import (
    FusionCircuit,
    PublicContext,
    SecretContext,
    ckks_context,
    decryption_error_bound,
    error_tail_factor,
    parameters_for,
)
from securefed.fusion.base import Inquiry, check_network
from securefed.fusion.ckks_module import (
    CKKSModuleFusionChannel,
    ModuleKeyParty,
    _segments,
    every_slot_mask,
    tenseal_vector_bytes,
)

__all__ = [
    "PACKED_SCALE_BITS",
    "REGIONS",
    "PackedCKKSModuleFusionChannel",
    "PackedKeyParty",
    "named_coefficients",
    "own_exponents",
    "packed_chunks",
    "packed_error_bounds",
    "packed_flooding_std",
    "packed_fresh_errors",
    "packed_key_circuit",
    "packed_sum_error_bound",
    "region_segments",
]

REGIONS = 3
"""Regions per ciphertext: ``[x_1 | x_1 | x_1^2]`` against ``[g | g x_0 | g]``."""
PACKED_SCALE_BITS = 49
"""The packed circuit's default scale: the chain ``[60, 49, 49, 60]`` is the 218 bits that ring
8192 allows at 128-bit security (two levels, no spare prime: the masked exchange sits at level
1, whose room is ``2^58``)."""
PACKED_EDGE_BITS = 60


@dataclass(frozen=True)
class Bound:
    """A value's magnitude bound and its CKKS error bound, propagated through the circuit."""

    magnitude: float
    error: float

    def times_plain(self, coefficient: float, op_error: float) -> Bound:
        """A plaintext product (encoding and rescaling add ``op_error`` per unit magnitude)."""
        c = abs(coefficient)
        return Bound(c * self.magnitude, c * self.error + max(self.magnitude, 1.0) * op_error)

    def times(self, other: Bound, op_error: float) -> Bound:
        """A ciphertext product (relinearization and rescaling add ``op_error`` each)."""
        return Bound(
            self.magnitude * other.magnitude,
            self.magnitude * other.error
            + other.magnitude * self.error
            + self.error * other.error
            + 2 * op_error,
        )

    def plus(self, other: Bound) -> Bound:
        return Bound(self.magnitude + other.magnitude, self.error + other.error)

    def plus_plain(self, constant: float, op_error: float) -> Bound:
        return Bound(self.magnitude + abs(constant), self.error + op_error)


def packed_sum_error_bound(
    fresh_own: float, fresh_public: float, value_bound: float, grad_bound: float, n_slots: int
) -> float:
    """Bound on the key-dependent error of one released sum of ``n_slots`` slots of ``E = G Q``.

    Per slot, region by region (``G`` fresh under the owner's secret key, error ``fresh_own``;
    ``Q`` fresh under its public key, error ``fresh_public``, which also bounds every
    relinearization, rescaling and encoding, the ``r_0 + r_1 s`` rounding form): the product of
    ``|G_r| <= (grad_bound, grad_bound * value_bound, grad_bound)`` and ``|Q_r| <= (value_bound,
    value_bound, value_bound^2)`` plus the mask's encoding; the worst region, times ``n_slots``.
    """
    if min(fresh_own, fresh_public, value_bound, grad_bound) <= 0 or n_slots < 1:
        raise ValueError("errors, bounds and n_slots must be > 0")
    worst = 0.0
    for g_bound, q_bound in (
        (grad_bound, value_bound),
        (grad_bound * value_bound, value_bound),
        (grad_bound, value_bound**2),
    ):
        product = Bound(g_bound, fresh_own).times(Bound(q_bound, fresh_public), fresh_public)
        worst = max(worst, product.error + fresh_public)
    return n_slots * worst


def named_coefficients(row: np.ndarray, basis: Sequence[tuple[int, ...]]) -> dict[str, float]:
    """One member's coefficients by role: ``c``, ``a0``, ``a1``, ``b00``, ``b01``, ``b11`` (0
    where the basis has no such monomial; ``x_0`` the owner, ``x_1`` the other party)."""
    dims = len(basis[0])
    index = {m: k for k, m in enumerate(basis)}

    def unit(*exponent):
        padded = tuple(exponent) + (0,) * (dims - len(exponent))
        k = index.get(padded[:dims]) if len(padded) == dims else None
        return float(row[k]) if k is not None else 0.0

    return {"c": unit(0), "a0": unit(1), "b00": unit(2),
            "a1": unit(0, 1) if dims > 1 else 0.0, "b01": unit(1, 1) if dims > 1 else 0.0,
            "b11": unit(0, 2) if dims > 1 else 0.0}  # fmt: skip


def packed_error_bounds(
    coefficients: Mapping[str, float],
    fresh_own: float,
    fresh_public: float,
    value_bound: float,
    grad_bound: float,
    noise_std: float,
    shift: int,
    *,
    with_other: bool = True,
) -> tuple[float, float, float]:
    """``(output error, input-gradient error, output magnitude)`` bounds per slot for one
    member's :func:`named_coefficients`, as the packed circuit evaluates them (module
    docstring), in the value the party reads (times ``2^shift``); the re-randomizing noise of
    std ``noise_std`` (on the value) adds its Gaussian tail
    (:func:`~securefed.crypto.ckks.error_tail_factor` standard deviations)."""
    c = {k: v / 2.0**shift for k, v in coefficients.items()}
    op = fresh_public
    p, q = Bound(value_bound, fresh_own), Bound(value_bound, fresh_public)
    t00 = p.times_plain(c["b00"], op)
    l0 = t00.plus(q.times_plain(c["b01"], op)) if with_other else t00
    l0 = l0.plus_plain(c["a0"], op)
    out = p.times(l0, op)
    if with_other:
        out = out.plus(q.times(q.times_plain(c["b11"], op).plus_plain(c["a1"], op), op))
    out = out.plus_plain(c["c"], op)
    dx = Bound(grad_bound, fresh_own).times(l0.plus(t00), op)
    tail = error_tail_factor() * noise_std / 2.0**shift
    factor = 2.0**shift
    return (
        factor * (out.error + op + tail),
        factor * (dx.error + op + tail),
        factor * out.magnitude,
    )


def packed_key_circuit(config) -> dict[str, Any]:
    """The arguments of :func:`~securefed.crypto.ckks.ckks_context` (and
    :func:`~securefed.crypto.ckks.parameters_for`) of one party's key in the packed circuit:
    ring 8192 by default, chain ``[60, s, s, 60]`` at the scale ``s`` of ``config``
    (:data:`PACKED_SCALE_BITS` when ``None``), public-key encryption. What a party on another
    machine generates its key with and what the server derives the parameters from, both from
    the public configuration (as :func:`~securefed.fusion.ckks_module.module_key_circuit`)."""
    scale = PACKED_SCALE_BITS if config.scale_bits is None else config.scale_bits
    return {
        "circuit": FusionCircuit(depth=2, activation_degree=1, training=False),
        "poly_modulus_degree": config.poly_modulus_degree,
        "coeff_mod_bit_sizes": [PACKED_EDGE_BITS, scale, scale, PACKED_EDGE_BITS],
        "scale_bits": scale,
        "encryption": "public-key",
    }


def packed_fresh_errors(params) -> tuple[float, float]:
    """``(fresh_own, fresh_public)``: the fresh-encryption error bounds of the owner's
    secret-key encryption and of a public-key one under ``params``
    (:func:`~securefed.crypto.ckks.decryption_error_bound`), the inputs of
    :func:`packed_sum_error_bound` and :func:`packed_error_bounds`."""
    symmetric = type(params)(
        params.poly_modulus_degree, params.coeff_mod_bit_sizes, params.scale_bits, "symmetric"
    )
    return decryption_error_bound(symmetric, 1), decryption_error_bound(params, 1)


def packed_flooding_std(config, params, n_slots: int) -> float:
    """The flooding std of one released sum of ``n_slots`` slots in the packed circuit: the
    floor (``config.flooding``) of :func:`packed_sum_error_bound` under ``params``. The key
    holder computes it itself from the public configuration (never takes it from the server)."""
    fresh_own, fresh_public = packed_fresh_errors(params)
    bound = packed_sum_error_bound(
        fresh_own, fresh_public, config.value_bound, config.grad_bound, n_slots
    )
    return config.flooding.std_for(bound)


def packed_chunks(length: int, slots: int) -> list[tuple[int, int]]:
    """The flat ranges of a ``length``-entry vector that one packed ciphertext holds
    (``slots // REGIONS`` entries each: public, both sides compute them from the shape)."""
    per = slots // REGIONS
    return [(a, min(length, a + per)) for a in range(0, length, per)]


def region_segments(
    segments: Sequence[tuple[int, int]], start: int, n: int
) -> list[tuple[int, int]]:
    """The slot ranges of a ``REGIONS``-region ciphertext of a chunk of ``n`` entries from
    ``start`` that one masked exchange releases: each member segment in every region, region
    by region (what the key holder sums and the server unmasks by)."""
    return [(r * n + a - start, r * n + b - start) for r in range(REGIONS) for a, b in segments]


def own_exponents(basis: Sequence[tuple[int, ...]]) -> list[tuple[int, tuple[int, ...]]]:
    """``(power, exponent)`` of the owner's own monomials ``x_0^power`` (``power`` 0, 1, 2) in
    ``basis``: the batch sums ``sum g x_0^power`` the owner releases from its own values."""
    dims = len(basis[0])
    own = (1,) + (0,) * (dims - 1)
    return [(k, tuple(k * e for e in own)) for k in range(3) if tuple(k * e for e in own) in basis]


class PackedKeyParty(ModuleKeyParty):
    """The platform half of the packed circuit: what a party computes from its own values in
    the clear and encrypts (the regions of the module docstring), on top of
    :class:`~securefed.fusion.ckks_module.ModuleKeyParty`'s keys and decryptions.

    Args:
        name: the party.
        secret: its key pair (the owner's regions are encrypted with its secret key).
    """

    def __init__(self, name: str, secret: SecretContext) -> None:
        super().__init__(name, secret, own_encryption=True)
        self._decoder: tuple | None = None

    def encrypt_owner_regions(self, x0: np.ndarray, *joined: np.ndarray) -> ts.CKKSVector:
        """``P = [x_0 | 0 | 0 (| x_0')]`` under its own key, encrypted with the secret key."""
        zero = np.zeros(len(x0))
        return self.encrypt_own(np.concatenate([x0, zero, zero, *joined]))

    def encrypt_other_regions(
        self, x1: np.ndarray, owner: PublicContext, *joined: np.ndarray
    ) -> ts.CKKSVector:
        """``Q = [x_1 | x_1 | x_1^2 (| x_1')]`` under the owner's public key (its powers computed
        in the clear: no ciphertext product builds them)."""
        [vector] = self.encrypt_for(np.concatenate([x1, x1, x1**2, *joined]), owner)
        return vector

    def encrypt_gradient_regions(
        self, g: np.ndarray, x0: np.ndarray, regions: int
    ) -> ts.CKKSVector:
        """``G = [g | g x_0 | g (| 0)]`` (``regions`` of them: a joined forward's fourth is 0)
        under its own key, with the secret key."""
        pad = [np.zeros(len(g))] * (regions - REGIONS)
        return self.encrypt_own(np.concatenate([g, g * x0, g, *pad]))

    def decrypt_returned(self, message: _Returned | bytes) -> np.ndarray:
        """Decrypt what the server returned (its :class:`_Returned` SEAL ciphertext in memory,
        or TenSEAL's ``CKKSVector`` bytes): every slot it filled."""
        if not isinstance(message, _Returned):
            return self.decrypt_vector(message)
        if self._decoder is None:
            data = self._secret.tenseal.data
            seal = data.seal_context()
            self._decoder = (sealapi.Decryptor(seal, data.secret_key()), sealapi.CKKSEncoder(seal))
        decryptor, encoder = self._decoder
        plain = sealapi.Plaintext()
        decryptor.decrypt(message.ciphertext, plain)
        return np.asarray(encoder.decode_double(plain)[: message.size], dtype=np.float64)

    @staticmethod
    def own_monomials(g: np.ndarray, x0: np.ndarray) -> tuple[np.ndarray, ...]:
        """``g x_0^k`` for ``k = 0, 1, 2``: the terms of the batch sums the owner releases from
        its own values (:meth:`ModuleKeyParty.release_own`)."""
        return g, g * x0, g * x0**2

    def release_regions(
        self,
        masked,
        segments: Sequence[tuple[int, int]],
        start: int,
        n: int,
        flooding,
        std,
        noise,
    ) -> np.ndarray:
        """The key holder's step of the packed masked exchange: decrypt ``[[G Q + R]]``, sum
        each member segment of every region (:func:`region_segments`), flood and round."""
        local = region_segments(segments, start, n)
        return self.release_own(self.decrypt_returned(masked), local, flooding, std, noise)

    def read(self, message, n: int, shift: int) -> np.ndarray:
        """The first ``n`` slots of a returned ciphertext (an output or input gradient,
        evaluated times ``2^-shift``), times ``2^shift``."""
        return self.decrypt_returned(message)[:n] * 2.0**shift


class PackedCKKSModuleFusionChannel(CKKSModuleFusionChannel):
    """The per-position polynomial server module under CKKS in the packed circuit (module
    docstring); arguments, seam and view as :class:`CKKSModuleFusionChannel`.

    Raises:
        ValueError: a network of degree above 2, more than two parties with ``cross=True``,
            or what the monomial circuit refuses.
    """

    circuit = "packed"

    def _setup_circuit(self) -> None:
        """Refuse what the packed circuit cannot serve; the owner's secret-key contexts."""
        if self.degree > 2:
            raise ValueError(
                f"the packed circuit evaluates networks of degree <= 2 (one hidden layer with "
                f"the quadratic activation); this one has degree {self.degree}: use "
                "CKKSModuleConfig(circuit='monomials')"
            )
        if self.cross and len(self._parties) > 2:
            raise ValueError(
                f"the packed circuit fuses two parties ({len(self._parties)} given with "
                "cross=True): use CKKSModuleConfig(circuit='monomials')"
            )
        self.shift = int(self.config.output_shift_bits)
        self.fresh_own, self.fresh_public = packed_fresh_errors(self.params)
        self._index = {m: k for k, m in enumerate(self.basis)}
        self._memo: dict[str, dict] = {}
        self._expansions: dict[str, tuple] = {}
        self._announced: Inquiry | None = None
        self._evaluators: dict[str, _SealEvaluator] = {}
        self.view.public.update(
            {
                "circuit": self.circuit,
                "regions": REGIONS,
                "output_shift_bits": self.shift,
                "own_encryption": "symmetric (the owner's secret key)",
                "per_operation_error_own": self.fresh_own,
                "repeat_inquiries": self.config.repeat_inquiries,
            }
        )

    # ------------------------------------------------------------------ parameters
    def _new_party(self, name: str) -> PackedKeyParty:
        """A party that builds and encrypts the packed regions of its own values."""
        return PackedKeyParty(name, self._new_key())

    def _new_key(self) -> SecretContext:
        key = ckks_context(**packed_key_circuit(self.config))
        # Products are relinearized although none is multiplied again: re-randomization adds a
        # fresh size-2 encryption, so a size-3 result would reach its key holder with its third
        # component exactly as the server computed it (the product of the inputs' ``c1``
        # components with the server's coefficients): no circuit privacy for the server's
        # weights. :meth:`CKKSModuleFusionChannel._to_party` refuses such a ciphertext.
        return key

    def _remote_params(self):
        """The parameters of the parties' keys (:func:`packed_key_circuit`), derived from the
        public configuration (the server half of parties on other machines)."""
        return parameters_for(**packed_key_circuit(self.config))

    def _mask_bits(self) -> int:
        """Masks for the exchange at level 1 (two bits below its room, at most 2^16)."""
        return min(16, int(math.log2(self.params.max_abs_value(1))) - 2)

    def _sum_error_bound(self, n_slots: int) -> float:
        """:func:`packed_sum_error_bound` of a released sum of ``n_slots`` slots."""
        return packed_sum_error_bound(
            self.fresh_own, self.fresh_public, self.config.value_bound, self.config.grad_bound,
            n_slots,
        )  # fmt: skip

    def error_bounds(self, network: str = "online") -> dict[str, np.ndarray]:
        """Per member, the stated bounds on the error of an output and of an input-gradient
        entry for the current weights (:func:`packed_error_bounds`)."""
        module = self.module if network == "online" else self.target
        coefficients = self._coefficients(module, grad=False).numpy()
        rows = [self._bounds(c, self.config.output_noise_std) for c in coefficients]
        return {
            "output": np.array([r[0] for r in rows]),
            "input_gradient": np.array([r[1] for r in rows]),
        }

    def _bounds(self, row: np.ndarray, noise_std: float) -> tuple[float, float, float]:
        return packed_error_bounds(
            named_coefficients(row, self.basis), self.fresh_own, self.fresh_public,
            self.config.value_bound, self.config.grad_bound, noise_std, self.shift,
            with_other=self.cross and len(self._parties) > 1,
        )  # fmt: skip

    # ------------------------------------------------------------------ layout
    def _chunks(self, length: int) -> list[tuple[int, int]]:
        return packed_chunks(length, self.params.slots)

    def _rows(self, coefficients: np.ndarray, a: int, b: int, per_member) -> np.ndarray:
        """Each entry's member's coefficients (times ``2^-shift``), ``(b - a, monomials)``."""
        return coefficients[np.arange(a, b) // per_member] / 2.0**self.shift

    def _region_vector(self, layers, exponent, regions: int):
        """The plain multiplier of ``exponent``: region ``r`` holds each entry's member's
        coefficient in ``layers[r]`` (:meth:`_rows`), the other regions 0;
        ``None`` where it is all below what encodes (no product)."""
        k = self._index.get(tuple(exponent))
        if k is None:
            return None
        n = next(rows.shape[0] for rows in layers.values())
        out = np.zeros(regions * n)
        for region, rows in layers.items():
            out[region * n : (region + 1) * n] = rows[:, k]
        if np.abs(out).max() < self.min_weight:
            return None
        return out

    def _expanded(self, network: str, *, grad: bool = False):
        """The per-member coefficients of ``network``'s polynomial (``(members, monomials)``),
        expanded once per version of its weights: the online network's with its graph (a
        backward on the same weights reuses it, once), the target's without. A fresh
        expansion is checked against the deepest level's room (:meth:`_check_magnitude`)."""
        torch = self._torch
        module = self.module if network == "online" else self.target
        versions = tuple(int(t._version) for t in module.parameters())
        cached = self._expansions.get(network)
        if cached is not None and cached[0] == versions and (cached[1].requires_grad or not grad):
            if grad:  # one backward per graph
                del self._expansions[network]
            return cached[1]
        with torch.enable_grad() if network == "online" else torch.no_grad():
            tensor = self._coefficients(module, grad=network == "online")
        self._check_magnitude(tensor.detach().numpy())
        if not grad:
            self._expansions[network] = (versions, tensor)
        return tensor

    def announce(self, inputs: Mapping[str, Any], *, outputs: Sequence[str]) -> None:
        """The next training forward's inputs, sent ahead (``repeat_inquiries``): the forward
        that follows, if it evaluates without training for the same single output party,
        evaluates both in one ciphertext (regions 0-2 the announced forward, region 3 its
        own) and the training forward, when its vectors and weights match, repeats it."""
        super().announce(inputs, outputs=outputs)
        if self.announces:
            self._announced = Inquiry(inputs, tuple(outputs), None, "online", True, "")

    @property
    def announces(self) -> bool:  # type: ignore[override]
        return bool(self.config.repeat_inquiries) and self.cross and len(self._parties) == 2

    def _check_magnitude(self, coefficients: np.ndarray) -> None:
        room = self.params.max_abs_value(self.params.levels) * 2.0**self.shift
        for member, row in enumerate(coefficients):
            *_, magnitude = self._bounds(row, 0.0)
            if magnitude > room / 2:
                raise ValueError(
                    f"member {member}'s server network can output up to {magnitude:.4g} on "
                    f"inputs within the public bound {self.config.value_bound:g}, beyond the "
                    f"{room / 2:.4g} that the deepest level decrypts at output_shift_bits="
                    f"{self.shift}: raise output_shift_bits in CKKSModuleConfig"
                )

    # ------------------------------------------------------------------ the circuit
    def _evaluate(
        self, p: str, order: list[str], arrays, coefficients, chunks, per_member, joined=None
    ):
        """Encrypt and evaluate ``f`` for owner ``p``: per chunk ``(P, Q, dx multiplier,
        output)``. ``joined``: ``(arrays, coefficients)`` of a second forward for the same
        owner, evaluated in region 3 of the same ciphertexts (one chunk; its output in region
        3 of the output)."""
        dims = len(self._parties)
        x0 = arrays[p].reshape(-1)
        x1 = arrays[order[1]].reshape(-1) if self.cross and dims > 1 else None
        regions = REGIONS + (joined is not None)
        pieces = []
        for a, b in chunks:
            start = time.process_time()
            extra_p, extra_q = [], []
            if joined is not None:
                extra_p = [joined[0][p].reshape(-1)[a:b]]
                extra_q = [joined[0][order[1]].reshape(-1)[a:b]]
            enc_p = self._to_server(self.keys[p].encrypt_owner_regions(x0[a:b], *extra_p), p)
            self.counts["encrypt_own"] += 1
            enc_q = None
            if x1 is not None:
                enc_q = self.keys[order[1]].encrypt_other_regions(
                    x1[a:b], self.keys[p].public, *extra_q
                )
                enc_q = self._to_server(enc_q, p)
                self.counts["encrypt"] += 1
            now = time.process_time()
            self.seconds["encryption"] += now - start
            layers = {0: self._rows(coefficients, a, b, per_member)}
            if joined is not None:
                layers[REGIONS] = self._rows(joined[1], a, b, per_member)
            pieces.append(self._evaluate_chunk(enc_p, enc_q, layers, regions, p))
            self.seconds["server_evaluation"] += time.process_time() - now
        return pieces

    def _evaluate_chunk(self, enc_p, enc_q, layers, regions: int, party: str):
        """The server's evaluation of one chunk on the owner's ``P`` and the other party's
        ``Q`` (``None`` without one): ``(P, Q, dx multiplier, (output, constant))``, ``layers``
        region -> the coefficients of the network evaluated there (:meth:`_rows`), on SEAL's
        objects (:class:`_SealEvaluator`: the output a :class:`_Returned`, relinearized by
        :meth:`_rerandomize`)."""
        dims = len(self._parties)
        own = (1,) + (0,) * (dims - 1)
        other = (0, 1) + (0,) * (dims - 2) if dims > 1 else None

        def vec(exponent):
            return self._region_vector(layers, exponent, regions)

        seal = self._seal(party)
        P = enc_p.data.ciphertext()[0]
        Q = enc_q.data.ciphertext()[0] if enc_q is not None else None
        # L_0 = a_0 + b_00 P + b_01 Q and L_1 = a_1 + b_11 Q, each rescaled once.
        two = tuple(2 * e for e in own)
        t00 = self._times_plain(seal, P, vec(two))
        l0_sum = t00
        if Q is not None:
            cross = tuple(i + j for i, j in zip(own, other, strict=True))
            l0_sum = seal.plus(l0_sum, self._times_plain(seal, Q, vec(cross)))
        l0_sum = self._plus_constant(seal, l0_sum, vec(own))
        l0 = self._rescaled(seal, l0_sum)
        l1 = None
        if Q is not None:
            square = tuple(2 * e for e in other)
            l1_sum = self._plus_constant(seal, self._times_plain(seal, Q, vec(square)), vec(other))
            l1 = self._rescaled(seal, l1_sum)
        # f - c = P L_0 + Q L_1: both products summed, rescaled and (in :meth:`_rerandomize`)
        # relinearized once.
        out = self._terms(seal, [(P, l0), (Q, l1)])
        # Everything encoding to zero: a negligible multiple of P keeps a ciphertext.
        value = out if out is not None else self._negligible_multiple(seal, P)
        # The constant c joins the re-randomizing encryption (:meth:`_rerandomize`).
        constant = vec((0,) * dims)
        # d f / d x_0 = a_0 + 2 b_00 x_0 + b_01 x_1 = L_0 + b_00 P, kept before its rescaling
        # (only a backward rescales it; a plain array if linear; joined, its region 3 is the
        # other forward's, which the returned gradient's re-randomization floods).
        if isinstance(l0_sum, np.ndarray) or l0_sum is None:
            derivative = l0_sum
        else:
            derivative = seal.plus(l0_sum, t00)
        return enc_p, enc_q, derivative, (_Returned(value, enc_p.size()), constant)

    def _seal(self, party: str) -> _SealEvaluator:
        """The server's SEAL evaluator under ``party``'s public context (built once)."""
        found = self._evaluators.get(party)
        if found is None:
            found = _SealEvaluator(self.server_contexts[party].tenseal)
            self._evaluators[party] = found
        return found

    def _times_plain(self, seal: _SealEvaluator, ct, multiplier):
        """``ct * multiplier`` (not rescaled); ``None`` for no multiplier or no ciphertext."""
        if multiplier is None or ct is None:
            return None
        self.counts["plain_mul"] += 1
        return seal.times_plain(ct, multiplier)

    @staticmethod
    def _plus_constant(seal: _SealEvaluator, ct, constant):
        """``ct + constant`` before rescaling; the plain constant alone if no ciphertext."""
        if ct is None:
            return constant
        return ct if constant is None else seal.plus_plain(ct, constant)

    @staticmethod
    def _rescaled(seal: _SealEvaluator, value):
        """A ciphertext rescaled once; a plain array (or ``None``) as it is."""
        if value is None or isinstance(value, np.ndarray):
            return value
        return seal.rescaled(value)

    def _terms(self, seal: _SealEvaluator, pairs):
        """``sum_k ct_k * factor_k`` for ciphertext or plain factors, rescaled once; ``None`` if
        no term. A plain factor is encoded at the scale of a ciphertext factor (so that every
        term has the same scale) and at its level."""
        pairs = [(ct, f) for ct, f in pairs if ct is not None and f is not None]
        if not pairs:
            return None
        cipher = [f for _, f in pairs if not isinstance(f, np.ndarray)]
        scale = cipher[0].scale if cipher else seal.scale
        acc = None
        for ct, factor in pairs:
            if isinstance(factor, np.ndarray):
                if cipher:
                    ct = seal.at_level_of(ct, cipher[0])
                self.counts["plain_mul"] += 1
                term = seal.times_plain(ct, factor, scale)
            else:
                self.counts["cipher_mul"] += 1
                term = seal.times(ct, factor)
            acc = seal.plus(acc, term)
        return seal.rescaled(acc)

    def _negligible_multiple(self, seal: _SealEvaluator, ct):
        return seal.rescaled(seal.times_plain(ct, np.array([self._negligible])))

    @property
    def _negligible(self) -> float:
        return 2.0 ** -(self.params.scale_bits - 4)

    def _hiding_std(self) -> float:
        """The std of the re-randomizing noise on the slots a party does not read:
        ``2^-13`` of the deepest level's room (``2^-4`` at ``[60, 49, 49, 60]``, whose room
        ``2^9`` is 8192 std away), against at most ``4e-10`` of CKKS rounding (regions 1-2 of
        a forward) or a fresh error times a derivative (region 3 of a joined input gradient)
        held there."""
        return self.params.max_abs_value(self.params.levels) * 2.0**-13

    def _returned(
        self, returned: _Returned, p: str, read: Sequence[tuple[int, int]], constant=None
    ) -> np.ndarray:
        """Relinearize, add the plain ``constant`` (an array, or ``None``), re-randomize, hand
        to ``p``, decrypt the slot ranges ``read`` (times ``2^shift``).

        The fresh public-key encryption (at the ciphertext's own level) carries Gaussian noise
        of std ``output_noise_std * 2^-shift`` on the slots read and :meth:`_hiding_std` on
        the others (what they hold is no output: rounding errors of zero-coefficient regions, a
        joined forward's other region), and the constant (one encoding fewer than adding it
        apart; its error is the encryption's)."""
        vector = self._rerandomize(returned, p, read, constant)
        start = time.process_time()
        values = self.keys[p].decrypt_returned(self._to_party(vector, p))
        self.seconds["decryption"] += time.process_time() - start
        return np.concatenate([values[a:b] for a, b in read]) * 2.0**self.shift

    def _rerandomize(
        self, returned: _Returned, p: str, read: Sequence[tuple[int, int]], constant=None
    ) -> _Returned:
        """The server's part of :meth:`_returned`: the product relinearized, the constant
        added, the fresh encryption of noise under ``p``'s key at the ciphertext's level added:
        on the real parts std ``output_noise_std * 2^-shift`` on the slots ``read`` and
        :meth:`_hiding_std` on every other slot (replicas beyond the vector included), on every
        imaginary part :meth:`_imaginary_std` (always, whatever ``output_noise_std``)."""
        seal = self._seal(p)
        start = time.process_time()
        ct = returned.ciphertext
        if ct.size() > 2:
            self._relinearize(seal, ct)
        std = self.config.output_noise_std / 2.0**self.shift
        slots, hiding = self.params.slots, self._hiding_std()
        noise = self._output_noise.normal(hiding, slots)
        for a, b in read:
            noise[a:b] = self._output_noise.normal(std, b - a)
        if constant is not None:
            noise[: returned.size] += np.asarray(constant)
        # Every slot's imaginary part (never read: noise terms such as the owner's own error
        # times the other party's values) and every slot beyond the vector (replicas).
        noise = noise + 1j * self._output_noise.normal(self._imaginary_std(), slots)
        seal.add_inplace(ct, seal.encrypt_like(noise, ct))
        self.counts["rerandomize"] += 1
        self.seconds["server_evaluation"] += time.process_time() - start
        return _Returned(ct, returned.size)

    def _relinearize(self, seal: _SealEvaluator, ct) -> None:
        self.counts["relinearize"] += 1
        seal.relinearize(ct)

    def _to_party(self, vector, party: str):
        """As :meth:`CKKSModuleFusionChannel._to_party`, also for a :class:`_Returned` SEAL
        ciphertext (itself in memory; TenSEAL's ``CKKSVector`` bytes when serialized or
        remote).

        Raises:
            RuntimeError: the ciphertext has more than two components (module docstring).
        """
        if not isinstance(vector, _Returned):
            return super()._to_party(vector, party)
        components = vector.ciphertext.size()
        if components != 2:
            raise RuntimeError(
                f"a ciphertext handed to {party!r} has {components} components: only a "
                "relinearized (size-2) ciphertext is re-randomized whole (circuit privacy)"
            )
        if not (self.config.serialize_handovers or self.remote):
            return vector
        blob = _tenseal_message(vector)
        self.handed_bytes["to_parties"] += len(blob)
        return blob

    def _exchange_product(self, enc_g, enc_q, p: str) -> _Returned:
        """``E = G Q`` of the masked exchange: rescaled, then relinearized at level 1 (cheaper
        than TenSEAL's relinearization at level 0, before rescaling)."""
        seal = self._seal(p)
        product = seal.times(enc_g.data.ciphertext()[0], enc_q.data.ciphertext()[0])
        product = seal.rescaled(product)
        self._relinearize(seal, product)
        self.counts["cipher_mul"] += 1
        return _Returned(product, enc_g.size())

    # ------------------------------------------------------------------ forward
    def open_round(self, round_id: int) -> None:
        self._memo.clear()
        self._announced = None
        super().open_round(round_id)

    def _forward(self, inquiry: Inquiry) -> dict[str, Any]:
        """As :meth:`CKKSModuleFusionChannel.forward`, in the packed circuit (and joined with
        an announced training forward: :meth:`announce`)."""
        inputs, outputs, network, train, tag = (
            inquiry.inputs, inquiry.outputs, inquiry.network, inquiry.train, inquiry.tag
        )  # fmt: skip
        arrays, shape, dtype, chosen, module = self._inquiry(inquiry)
        ahead, self._announced = self._announced, None
        numpy_in = all(isinstance(v, np.ndarray) for v in inputs.values())
        length = int(np.prod(shape))
        per_member = shape[1] * shape[2]
        chunks = self._chunks(length)
        versions = tuple(int(t._version) for t in module.parameters())
        online = tuple(int(t._version) for t in self.module.parameters())
        result, pending, up, down = {}, {}, {}, {}
        joined = None
        if (
            ahead is not None
            and not train
            and ahead.outputs == outputs
            and len(outputs) == 1
            and (REGIONS + 1) * length <= self.params.slots
        ):
            ahead_arrays, ahead_shape, *_ = self._inquiry(ahead)
            if ahead_shape == shape:
                joined = ahead_arrays
        for p in outputs:
            order = [p, *[q for q in self._parties if q != p]]
            memo = self._memo.get(p)
            repeat = (
                self.config.repeat_inquiries
                and train
                and memo is not None
                and memo["network"] == network == "online"
                and memo["versions"] == versions
                and all(np.array_equal(memo["arrays"][q], arrays[q]) for q in self._parties)
            )
            if repeat:
                self.counts["repeat"] += 1
                pieces, fused = memo["pieces"], memo["fused"]
            else:
                start = time.process_time()
                coefficients = self._expanded(network).detach().numpy()
                self.seconds["server_evaluation"] += time.process_time() - start
                if joined is not None:
                    # Regions 0-2: the announced training forward; region 3: this one.
                    start = time.process_time()
                    ahead_coefficients = self._expanded("online").detach().numpy()
                    self.seconds["server_evaluation"] += time.process_time() - start
                    pieces = self._evaluate(p, order, joined, ahead_coefficients, chunks,
                                            per_member, joined=(arrays, coefficients))  # fmt: skip
                    [(_, _, _, (out, constant))] = pieces
                    both = self._returned(
                        out,
                        p,
                        [(0, length), (REGIONS * length, (REGIONS + 1) * length)],
                        constant,
                    )
                    fused = both[length:].reshape(shape)
                    self._memo[p] = {
                        "network": "online",
                        "versions": online,
                        "pieces": pieces,
                        "fused": both[:length].reshape(shape),
                        "arrays": joined,
                    }
                    self.counts["joined"] += 1
                else:
                    pieces = self._evaluate(p, order, arrays, coefficients, chunks, per_member)
                    fused = np.concatenate(
                        [self._returned(out, p, [(0, b - a)], constant)
                         for (a, b), (*_, (out, constant)) in zip(chunks, pieces, strict=True)]
                    ).reshape(shape)  # fmt: skip
                    self._memo[p] = {"network": network, "versions": versions, "pieces": pieces,
                                     "fused": fused, "arrays": arrays}  # fmt: skip
                senders = order if self.cross else [p]
                for q in senders:
                    up[q] = up.get(q, 0) + len(chunks) * self.ciphertext_bytes
                down[p] = len(chunks) * self.ciphertext_bytes
            result[p] = self._deliver(fused, chosen.get(p), inputs, dtype, numpy_in and not train)
            pending[p] = (pieces, chosen.get(p), arrays[p])
        if train:
            self._pending = {"shape": shape, "bounds": chunks, "parties": pending, "tag": tag,
                             "dtype": dtype}  # fmt: skip
        self._record("forward", network=network, tag=tag, train=train, outputs=outputs,
                     up=up, down=down)  # fmt: skip
        return result

    # ------------------------------------------------------------------ backward
    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, Any]:
        """As :meth:`CKKSModuleFusionChannel.backward`, in the packed circuit: one masked
        exchange per chunk releases the batch sums that involve the other party, the owner
        releases the others from its own values, one product gives its input gradient."""
        torch = self._torch
        pending, recipients, full = self._output_gradients(grads, recipients)
        shape, chunks = pending["shape"], pending["bounds"]
        coefficients_t = self._expanded("online", grad=True)
        per_member = shape[1] * shape[2]
        sums = np.zeros((self.members, len(self.basis)))
        result = {}
        for p, g in full.items():
            pieces, _, x_own = pending["parties"][p]
            g_flat, x0 = g.reshape(-1), x_own.reshape(-1)
            dx = []
            for (a, b), (enc_p, enc_q, derivative, _) in zip(chunks, pieces, strict=True):
                start = time.process_time()
                # A joined forward's ciphertexts have a fourth region (the other forward's),
                # which G leaves at zero.
                owner = self.keys[p]
                enc_g = owner.encrypt_gradient_regions(
                    g_flat[a:b], x0[a:b], enc_p.size() // (b - a)
                )
                self.counts["encrypt_own"] += 1
                enc_g = self._to_server(enc_g, p)
                self.seconds["encryption"] += time.process_time() - start
                segments = _segments(a, b, per_member)
                n = b - a
                # The owner's own sums: sum g, sum g x0, sum g x0^2 (flooded like the others).
                terms = owner.own_monomials(g_flat[a:b], x0[a:b])
                for power, exponent in own_exponents(self.basis):
                    sums[:, self._index[exponent]] += self._release_own(
                        p, terms[power], segments, a, per_member
                    )
                if enc_q is not None:
                    start = time.process_time()
                    product = self._exchange_product(enc_g, enc_q, p)
                    self.seconds["server_evaluation"] += time.process_time() - start
                    released = self._masked_regions(product, p, segments, a, n, per_member)
                    for region, exponent in self._region_exponents():
                        sums[:, self._index[exponent]] += released[region]
                if p in recipients:
                    dx.append(self._returned(self._gradient_product(enc_g, derivative, p), p,
                                             [(0, n)]))  # fmt: skip
            if p in recipients:
                result[p] = torch.from_numpy(np.concatenate(dx).reshape(shape)).to(
                    pending["dtype"] or torch.float64
                )
        self._memo.clear()
        self._step(coefficients_t, sums, pending, result, tuple(full), len(chunks), 2)
        return result

    def _region_exponents(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(region, exponent)`` of the batch sums one masked exchange releases, region by
        region (``x_1``, ``x_0 x_1``, ``x_1^2``), where the basis has them."""
        dims = len(self._parties)
        if dims < 2:
            return []
        other = (0, 1) + (0,) * (dims - 2)
        cross = (1, 1) + (0,) * (dims - 2)
        square = (0, 2) + (0,) * (dims - 2)
        return [(r, e) for r, e in enumerate((other, cross, square)) if e in self._index]

    # ------------------------------------------------------------------ the server half alone
    def serve_forward(
        self,
        ciphertexts: Mapping[str, Mapping[str, Sequence[bytes]]],
        *,
        shape: Sequence[int],
        outputs: Sequence[str],
        network: str = "online",
        train: bool = False,
        tag: str | None = None,
        joined: bool = False,
    ) -> dict[str, list[bytes]]:
        """A forward on the regions its parties sent (the server half alone, ``remote``), as
        :meth:`CKKSModuleFusionChannel.serve_forward`: output party ``p`` -> sending party
        ``q`` -> the serialized chunks (:func:`packed_chunks`), ``p``'s own ``P = [x_0 | 0 |
        0]`` (encrypted with its secret key) and the other party's ``Q = [x_1 | x_1 | x_1^2]``
        under ``p``'s public key (none with ``cross=False``). Returns ``p`` -> its output's
        chunks under its key (times ``2^-shift``, re-randomized, the constant in it: ``p``
        reads the first ``n`` slots of each, :meth:`PackedKeyParty.read`).

        ``joined`` (the remote :meth:`announce`): one output party, no training, ``4 n <= N /
        2``; its one chunk is ``P = [x_0 | 0 | 0 | x_0']`` and ``Q = [x_1 | x_1 | x_1^2 |
        x_1']``, regions 0-2 the next training forward's vectors (evaluated with the online
        network), region 3 this forward's (with ``network``); ``p`` reads regions 0 and 3. Every
        forward is kept (per output party) for :meth:`serve_repeat`: a joined one as the online
        network's forward of regions 0-2.

        Raises:
            RuntimeError: the channel holds key parties (use :meth:`forward`).
            ValueError: ciphertexts of the wrong parties, chunk counts or sizes, a bad shape,
                weights whose outputs would not fit the deepest level, a join the circuit
                cannot make (several outputs, training, beyond ``4 n <= N / 2``, without
                ``repeat_inquiries`` or two parties with cross terms).
        """
        if not self.remote:
            raise RuntimeError("serve_forward is the server half's; this channel holds the keys")
        shape = tuple(int(v) for v in shape)
        if len(shape) != 3 or shape[0] != self.members:
            raise ValueError(f"shape must be ({self.members}, batch, width), got {shape}")
        check_network(network, train)
        if network == "target" and self.target is None:
            raise RuntimeError("this channel has no target network (built with target=None)")
        if sorted(ciphertexts) != sorted(outputs):
            raise ValueError(f"ciphertexts for outputs {sorted(ciphertexts)}, asked {outputs}")
        length, per_member = int(np.prod(shape)), shape[1] * shape[2]
        chunks = self._chunks(length)
        if joined:
            self._check_join(outputs, train, length)
        regions = REGIONS + joined
        start = time.process_time()
        coefficients = self._expanded(network).detach().numpy()
        online = self._expanded("online").detach().numpy() if joined else None
        self.seconds["server_evaluation"] += time.process_time() - start
        versions = tuple(int(t._version) for t in self.module.parameters())
        if network == "target" and not joined:
            versions = tuple(int(t._version) for t in self.target.parameters())
        result, pending, up, down = {}, {}, {}, {}
        for p in outputs:
            _, sent = self._order(p)
            got = ciphertexts[p]
            if sorted(got) != sorted(sent) or any(len(got[q]) != len(chunks) for q in sent):
                raise ValueError(
                    f"{p!r}'s packed forward needs {len(chunks)} chunk(s) from each of {sent}, "
                    f"got { {q: len(v) for q, v in got.items()} }"
                )
            pieces, returned = [], []
            for c, (a, b) in enumerate(chunks):
                tick = time.process_time()
                enc = [self._to_server(got[q][c], p) for q in sent]
                n = b - a
                self._check_regions(enc, sent, regions * n, c)
                if joined:  # regions 0-2 the announced training forward, region 3 this one
                    layers = {0: self._rows(online, a, b, per_member),
                              REGIONS: self._rows(coefficients, a, b, per_member)}  # fmt: skip
                    read = [(0, n), (REGIONS * n, regions * n)]
                else:
                    layers, read = {0: self._rows(coefficients, a, b, per_member)}, [(0, n)]
                piece = self._evaluate_chunk(enc[0], enc[1] if len(enc) > 1 else None, layers,
                                             regions, p)  # fmt: skip
                self.seconds["server_evaluation"] += time.process_time() - tick
                value, constant = piece[3]
                vector = self._rerandomize(value, p, read, constant)
                returned.append(self._to_party(vector, p))
                pieces.append(piece)
            result[p] = returned
            pending[p] = (pieces, None, None)
            self._memo[p] = {"network": "online" if joined else network, "versions": versions,
                             "pieces": pieces, "shape": shape}  # fmt: skip
            if joined:
                self.counts["joined"] += 1
            for q in sent:
                up[q] = up.get(q, 0) + len(chunks) * self.ciphertext_bytes
            down[p] = len(chunks) * self.ciphertext_bytes
        if train:
            self._pending = {"shape": shape, "bounds": chunks, "parties": pending, "tag": tag,
                             "dtype": None}  # fmt: skip
        self._record("forward", network=network, tag=tag, train=train, outputs=list(outputs),
                     up=up, down=down)  # fmt: skip
        return result

    def _check_join(self, outputs: Sequence[str], train: bool, length: int) -> None:
        """Refuse a remote join the circuit cannot make (:meth:`serve_forward`)."""
        if not self.announces:
            raise ValueError(
                "a joined forward needs repeat_inquiries and two parties with cross terms: refusing"
            )
        if train or len(outputs) != 1:
            raise ValueError(
                f"a joined forward is one forward without training for one output party "
                f"(train={train}, outputs {list(outputs)}): refusing"
            )
        if (REGIONS + 1) * length > self.params.slots:
            raise ValueError(
                f"a joined forward of {length} entries needs {(REGIONS + 1) * length} slots, "
                f"beyond the {self.params.slots} of one ciphertext (4 n <= N / 2): refusing"
            )

    def serve_repeat(self, output: str, *, shape: Sequence[int], tag: str | None = None) -> None:
        """A training forward that repeats ``output``'s last :meth:`serve_forward` (the remote
        ``repeat_inquiries``): its ciphertexts are the backward's; the parties send nothing new
        and the owner keeps the values it decrypted. The server decides it from what it holds
        (the same shape, the online network, its weights' version unchanged); each platform
        checks on its node that its vectors repeat (``rl/flower_fedslate.py``).

        Raises:
            RuntimeError: the channel holds key parties, no forward for ``output`` since the
                last backward or round, of another network or shape, or the online weights
                changed since.
        """
        if not self.remote:
            raise RuntimeError("serve_repeat is the server half's; this channel holds the keys")
        shape = tuple(int(v) for v in shape)
        memo = self._memo.get(output)
        versions = tuple(int(t._version) for t in self.module.parameters())
        if not self.config.repeat_inquiries:
            raise RuntimeError("serve_repeat needs repeat_inquiries: refusing")
        if memo is None or memo["network"] != "online" or memo["shape"] != shape:
            raise RuntimeError(
                f"no forward of the online network of shape {shape} for {output!r} to repeat "
                "since the last backward: refusing"
            )
        if memo["versions"] != versions:
            raise RuntimeError(
                f"the online weights changed since {output!r}'s last forward: a repeat would "
                "serve stale ciphertexts; refusing"
            )
        self.counts["repeat"] += 1
        self._pending = {"shape": shape, "bounds": self._chunks(int(np.prod(shape))),
                         "parties": {output: (memo["pieces"], None, None)}, "tag": tag,
                         "dtype": None}  # fmt: skip
        self._record("forward", network="online", tag=tag, train=True, outputs=[output],
                     up={}, down={})  # fmt: skip

    @staticmethod
    def _check_regions(vectors, senders, size: int, chunk: int) -> None:
        """Refuse a sent ciphertext that does not hold the ``REGIONS`` regions of its chunk."""
        for q, vector in zip(senders, vectors, strict=True):
            if vector.size() != size:
                raise ValueError(
                    f"{q!r}'s ciphertext of chunk {chunk} holds {vector.size()} slot(s), the "
                    f"packed circuit's regions {size}: refusing"
                )

    def serve_backward(self, gradients: Mapping[str, Sequence[bytes]]) -> dict[str, dict]:
        """The first half of a backward on the owners' ``G = [g | g x_0 | g]`` (``remote``):
        ``p`` -> ``{"masked": [[bytes] per chunk], "input_gradient": [bytes per chunk]}``, the
        masked product ``[[G Q + R]]`` of each chunk to release (none without another party)
        and ``[[dL/dx_p]]`` (times ``2^-shift``). The released sums, with the owner's own
        (:meth:`PackedKeyParty.release_own`), go to :meth:`finish_backward`.

        Args:
            gradients: ``p`` -> the serialized chunks of ``G`` under its key (encrypted with its
                secret key, :meth:`PackedKeyParty.encrypt_gradient_regions`, from the full
                gradient, zeros where it did not ask, and its own forward vector).

        Raises:
            RuntimeError: without a training :meth:`serve_forward` since the last backward.
            ValueError: a gradient of a party without output there, the wrong chunk count or
                size.
        """
        if self._pending is None or "masks" in self._pending:
            raise RuntimeError("serve_backward needs a serve_forward(train=True) first (once)")
        pending = self._pending
        unknown = sorted(set(gradients) - set(pending["parties"]))
        if unknown:
            raise ValueError(f"no forward output for parties {unknown}")
        chunks = pending["bounds"]
        coefficients_t = self._expanded("online", grad=True)
        out, masks = {}, {}
        for p, blobs in gradients.items():
            if len(blobs) != len(chunks):
                raise ValueError(f"{p!r} sent {len(blobs)} gradient chunk(s), {len(chunks)} due")
            masked, returned, kept = [], [], []
            pieces = pending["parties"][p][0]
            for c, ((a, b), (_, enc_q, derivative, _)) in enumerate(
                zip(chunks, pieces, strict=True)
            ):
                enc_g = self._to_server(blobs[c], p)
                # A joined forward's G has its fourth region (zero), as its P and Q.
                regions = pieces[c][0].size() // (b - a)
                self._check_regions([enc_g], [p], regions * (b - a), c)
                row, row_masks = [], []
                if enc_q is not None:
                    start = time.process_time()
                    product = self._exchange_product(enc_g, enc_q, p)
                    blob, mask = self._mask_regions(product, p)
                    self.seconds["exchange"] += time.process_time() - start
                    row.append(blob)
                    row_masks.append(mask)
                masked.append(row)
                kept.append(row_masks)
                gradient = self._gradient_product(enc_g, derivative, p)
                returned.append(self._to_party(self._rerandomize(gradient, p, [(0, b - a)]), p))
            out[p] = {"masked": masked, "input_gradient": returned}
            masks[p] = kept
        pending["masks"], pending["coefficients_t"] = masks, coefficients_t
        return out

    def finish_backward(self, released: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """The second half (``remote``): per party and chunk ``{"own": [one number per member
        segment, per power of :func:`own_exponents`], "regions": the masked exchange's release
        (:func:`region_segments`; absent without another party)}``, unmasked into the batch
        sums; the optimiser steps.

        Raises:
            RuntimeError: without :meth:`serve_backward` first.
            ValueError: releases of other parties, or of the wrong count or shape.
        """
        if self._pending is None or "masks" not in self._pending:
            raise RuntimeError("finish_backward needs serve_backward first")
        pending = self._pending
        masks = pending["masks"]
        if sorted(released) != sorted(masks):
            raise ValueError(f"releases of {sorted(released)}, due from {sorted(masks)}")
        shape, chunks = pending["shape"], pending["bounds"]
        per_member = shape[1] * shape[2]
        sums = np.zeros((self.members, len(self.basis)))
        owned = own_exponents(self.basis)
        for p, rows in released.items():
            if len(rows) != len(chunks):
                raise ValueError(f"{p!r} released {len(rows)} chunk(s), {len(chunks)} due")
            for c, (a, b) in enumerate(chunks):
                segments = _segments(a, b, per_member)
                own = list(rows[c].get("own", ()))
                if len(own) != len(owned):
                    raise ValueError(
                        f"{p!r} released {len(own)} own sum(s) of chunk {c}, {len(owned)} due"
                    )
                for (_, exponent), values in zip(owned, own, strict=True):
                    values = _finite(values, len(segments), f"{p!r}'s own sums of chunk {c}")
                    sums[:, self._index[exponent]] += self._own_sums(values, segments, per_member)
                for mask in masks[p][c]:
                    values = _finite(
                        rows[c].get("regions", np.zeros(0)),
                        REGIONS * len(segments),
                        f"{p!r}'s masked release of chunk {c}",
                    )
                    regions = self._unmask_regions(values, mask, segments, a, b - a, per_member)
                    for region, exponent in self._region_exponents():
                        sums[:, self._index[exponent]] += regions[region]
        self._memo.clear()
        self._step(pending["coefficients_t"], sums, pending, dict.fromkeys(released),
                   tuple(released), len(chunks), 2)  # fmt: skip

    def _gradient_product(self, enc_g, derivative, p: str) -> _Returned:
        """``[[g df/dx_0]] = G (L_0 + b_00 P)`` of one chunk for owner ``p`` (before
        re-randomization; the multiplier rescaled here, kept unrescaled by the forward)."""
        start = time.process_time()
        seal = self._seal(p)
        g_ct = enc_g.data.ciphertext()[0]
        gradient = self._terms(seal, [(g_ct, self._rescaled(seal, derivative))])
        if gradient is None:
            gradient = self._negligible_multiple(seal, g_ct)
        self.seconds["server_evaluation"] += time.process_time() - start
        return _Returned(gradient, enc_g.size())

    def _release_own(self, party, values, segments, start, per_member) -> np.ndarray:
        """A sum the owner computes from its own values, released like a decrypted one."""
        local = [(a - start, b - start) for a, b in segments]
        _, std = self.flooding_std(max(b - a for a, b in segments))
        released = self.keys[party].release_own(
            values, local, self.config.flooding, std, self._flood_noise
        )
        return self._own_sums(released, segments, per_member)

    def _own_sums(self, released, segments, per_member) -> np.ndarray:
        """The per-member sums of an owner's release (one number per member segment)."""
        out = np.zeros(self.members)
        for (a, _), value in zip(segments, released, strict=True):
            out[a // per_member] += value
        return out

    def _masked_regions(self, product, party, segments, start, n, per_member) -> np.ndarray:
        """The masked exchange of one ciphertext of ``REGIONS`` regions: per region, the
        per-member sums ``(REGIONS, members)``."""
        tick = time.process_time()
        masked, mask = self._mask_regions(product, party)
        _, std = self.flooding_std(max(b - a for a, b in segments))
        released = self.keys[party].release_regions(
            masked, segments, start, n, self.config.flooding, std, self._flood_noise
        )
        out = self._unmask_regions(released, mask, segments, start, n, per_member)
        self.seconds["exchange"] += time.process_time() - tick
        return out

    def _mask_regions(self, product, party: str):
        """``(masked, mask)``: ``[[G Q + R]]`` as handed to ``party``, and the mask ``R``."""
        mask, both = every_slot_mask(self.masks, self.params.slots)
        seal = self._seal(party)
        masked = seal.plus(product.ciphertext, seal.encrypt_like(both, product.ciphertext))
        self.counts["fresh_mask"] += 1
        return self._to_party(_Returned(masked, product.size), party), mask

    def _unmask_regions(self, released, mask, segments, start, n, per_member) -> np.ndarray:
        """Per region, the per-member sums ``(REGIONS, members)`` of one released masked
        exchange (:func:`region_segments`), the mask's sums subtracted."""
        local = region_segments(segments, start, n)
        out = np.zeros((REGIONS, self.members))
        owners = [a // per_member for a, _ in segments] * REGIONS
        regions = [r for r in range(REGIONS) for _ in segments]
        for (a, b), value, region, member in zip(local, released, regions, owners, strict=True):
            out[region, member] += value - mask[a:b].sum()
        self.counts["exchange"] += 1
        return out


def _finite(values, count: int, what: str) -> np.ndarray:
    """``values`` as ``count`` finite float64 numbers (else refused, naming ``what``)."""
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.shape != (count,) or not np.isfinite(array).all():
        raise ValueError(f"{what}: {count} finite number(s) due (one per member segment), got "
                         f"{array.shape[0]}")  # fmt: skip
    return array


@dataclass(frozen=True)
class _Returned:
    """A SEAL ciphertext the server returns to a party, with its ``CKKSVector`` length (the
    slots the fresh encryptions filled)."""

    ciphertext: Any
    size: int


def _tenseal_message(returned: _Returned) -> bytes:
    """The bytes of TenSEAL's ``CKKSVector`` message for a returned SEAL ciphertext
    (:func:`~securefed.fusion.ckks_module.tenseal_vector_bytes`)."""
    return tenseal_vector_bytes(returned.ciphertext, returned.size)


class _SealEvaluator:
    """The server's evaluation under one party's public context on SEAL's own objects
    (``tenseal.sealapi``): what TenSEAL's ``CKKSVector`` does only at fixed points (a product
    relinearizes and rescales at once, a fresh encryption is made at the top level, a list
    operand is encoded on every call), here one operation at a time.

    * **Encodings kept**: a coefficient vector is encoded once per content, level and scale
      (:meth:`plain`); the server network's weights change once a learning step, so the
      acting inquiries between two steps reuse them. The server encodes its own numbers: no
      one sees an encoding, and the encoding is deterministic, so keeping it changes nothing
      of any view.
    * **Lazy rescaling, one relinearization**: plaintext products are summed before one
      rescaling, and the forward's two ciphertext products before one relinearization
      (:meth:`relinearize`, before a party is handed the result).
    * **Re-randomizers at the level they are added** (:meth:`encrypt_like`): a public-key
      encryption at the deepest level (SEAL encrypts one level above and divides, a fresh
      encryption of zero all the same) costs about half of one at the top.

    Args:
        context: the server's TenSEAL context for the party (public key, relinearization keys).
        cache: coefficient encodings kept (the oldest dropped beyond it).
    """

    def __init__(self, context: ts.Context, cache: int = 64) -> None:
        data = context.data
        self.seal = data.seal_context()
        self.evaluator = sealapi.Evaluator(self.seal)
        self.encoder = sealapi.CKKSEncoder(self.seal)
        self.encryptor = sealapi.Encryptor(self.seal, data.public_key())
        self.relin_keys = data.relin_keys()
        self.scale = float(context.global_scale)
        self._plains: dict[tuple, Any] = {}
        self._cache = cache
        self.encodings = 0

    def plain(self, values: np.ndarray, like, scale: float, *, keep: bool = True):
        """``values`` encoded at ``like``'s level with ``scale`` (kept per content if ``keep``)."""
        kind = np.complex128 if np.iscomplexobj(values) else np.float64
        values = np.ascontiguousarray(values, dtype=kind)
        key = (values.tobytes(), tuple(like.parms_id()), scale) if keep else None
        found = self._plains.get(key) if keep else None
        if found is not None:
            return found
        plain = sealapi.Plaintext()
        self.encoder.encode(values.tolist(), like.parms_id(), scale, plain)
        self.encodings += 1
        if keep:
            if len(self._plains) >= self._cache:
                self._plains.pop(next(iter(self._plains)))
            self._plains[key] = plain
        return plain

    def times_plain(self, ct, values: np.ndarray, scale: float | None = None):
        """``ct * values`` without rescaling (the multiplier at the context's scale)."""
        out = sealapi.Ciphertext()
        plain = self.plain(values, ct, self.scale if scale is None else scale)
        self.evaluator.multiply_plain(ct, plain, out)
        return out

    def plus_plain(self, ct, values: np.ndarray, *, keep: bool = True):
        """``ct + values`` (encoded at ``ct``'s level and scale; kept if ``keep``)."""
        out = sealapi.Ciphertext()
        self.evaluator.add_plain(ct, self.plain(values, ct, ct.scale, keep=keep), out)
        return out

    def at_level_of(self, ct, other):
        """``ct`` switched down to ``other``'s level (itself if it is there already)."""
        if ct.coeff_modulus_size() == other.coeff_modulus_size():
            return ct
        out = sealapi.Ciphertext()
        self.evaluator.mod_switch_to(ct, other.parms_id(), out)
        return out

    def times(self, left, right):
        """``left * right`` (the higher one switched down first), not relinearized or rescaled."""
        if left.coeff_modulus_size() > right.coeff_modulus_size():
            left = self.at_level_of(left, right)
        else:
            right = self.at_level_of(right, left)
        out = sealapi.Ciphertext()
        self.evaluator.multiply(left, right, out)
        return out

    def plus(self, left, right):
        """``left + right`` (same scale; the higher one switched down first); ``None`` is 0."""
        if left is None or right is None:
            return right if left is None else left
        if left.coeff_modulus_size() > right.coeff_modulus_size():
            left = self.at_level_of(left, right)
        else:
            right = self.at_level_of(right, left)
        out = sealapi.Ciphertext()
        self.evaluator.add(left, right, out)
        return out

    def rescaled(self, ct):
        out = sealapi.Ciphertext()
        self.evaluator.rescale_to_next(ct, out)
        return out

    def relinearize(self, ct) -> None:
        """Relinearize a size-3 product in place (a size-2 ciphertext is left as it is)."""
        if ct.size() > 2:
            self.evaluator.relinearize_inplace(ct, self.relin_keys)

    def encrypt_like(self, values: np.ndarray, like):
        """A fresh public-key encryption of ``values`` at ``like``'s level and scale."""
        out = sealapi.Ciphertext()
        self.encryptor.encrypt(self.plain(values, like, like.scale, keep=False), out)
        return out

    def add_inplace(self, ct, other) -> None:
        self.evaluator.add_inplace(ct, other)
