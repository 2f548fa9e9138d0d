"""The fused MLP evaluated and trained on CKKS ciphertexts (TenSEAL), with a masked exchange.

Roles (one process, separate objects; DESIGN.md "fusion"):

* parties (:class:`FusionParty`) share one CKKS secret key (they are the key holders). Each
  encrypts its inputs and its output gradients, and decrypts only what is addressed to it: its
  slice of the output and the gradient of its input. One of them also acts as the key holder of
  the masked exchange (:meth:`FusionParty.release_sum`).
* the server (:class:`FusionServer`) holds the network's weights in the clear and only a
  :class:`~securefed.crypto.ckks.PublicContext`: it never sees an input, an output or a gradient
  of the parties, and the parties never see its weights.

Packing (SIMD over samples): a ciphertext holds one feature (column) of up to ``slots = N / 2``
samples, padded with zeros to the full slot count; larger batches are split into chunks of
``slots`` samples. A linear layer is then plaintext-scalar products and additions of whole
ciphertexts (``out_k = sum_i W_ik [[x_i]] + b_k``): no rotation, so no Galois keys (35 MB at degree
8192) and no per-sample cost. (A vector-matrix product ``enc_x.mm(W)`` per sample costs about 81 ms
for 20 x 64 here, specs/transport.md; a whole batch of 4096 samples costs one such layer.)

Activation: ``a = sum_i c_i z^i``; the powers ``z^i`` are ciphertext products (binary powering,
``ceil(log2 i)`` levels) and the coefficients are folded into the next layer's weights
(``W' = c_i W``, bias ``b + c_0 1^T W``), so a degree-2 activation costs one level where TenSEAL's
``polyval`` costs two (measured). The plaintext channel trains with the same polynomial, so both
compute the same function.

Training (the interactive-layer pattern of FATE's hetero-NN, specs/transport.md): the parties send
``[[dL/dy]]``; the server back-propagates on ciphertexts (``G_{l-1} = sum_i (G_l (i c_i W_l)^T) *
z^(i-1)``) and needs in the clear only the batch sums ``dW_l[k, j] = sum_b a_bk G_bj`` and
``db_l[j] = sum_b G_bj``. For each it adds a uniform mask ``R`` (all slots, ``|R| <= 2^16`` by
default) to the ciphertext, the key-holding party decrypts, sums the batch slots, floods and
rounds (:class:`~securefed.crypto.ckks.Flooding`: Li and Micciancio 2021) and returns one number;
the server subtracts ``sum R``. The key holder sees only masked values (statistical hiding: an
entry ``v`` is hidden up to ``|v| / 2^16``), the server only the weight gradients summed over the
batch.
Ciphertexts going back to a party (outputs, input gradients) are re-randomized with a fresh
public-key encryption of Gaussian noise (std ``output_noise_std``), so their noise and randomness
do not carry the server's weights (circuit privacy) beyond the values themselves.

What this does not hide: a party's outputs and input gradients are functions of the weights (model
extraction by many queries is inherent to the fusion shape); the server learns its batch weight
gradients (use large batches); the weight-splitting of FATE (true weights = server part + a noise
accumulated by a party) is not implemented, so the server knows its weights. See docs/ckks.md.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tenseal as ts

from securefed.crypto.ckks import (
    Ciphertext,
    Flooding,
    PublicContext,
    SecretContext,
    ckks_context,
)
from securefed.fusion.base import (
    FusionChannelBase,
    FusionSpec,
    FusionWeights,
    Inquiry,
    Party,
    check_parties_named,
    check_spec_inquiry,
    output_gradient,
    pick,
    spec_public,
    split,
)
from securefed.privacy.noise import SecureGaussian, noise_source
from securefed.randomness import SeedTree
from securefed.views import NO_PAYLOADS, FusionView, RoundSelection

STAGES = ("party_encrypt", "server_forward", "server_backward", "exchange", "party_decrypt")


# ----------------------------------------------------------------------------- the schedule
@dataclass
class ForwardCache:
    """What the server keeps between forward and backward: inputs and the hidden powers.

    ``powers[l][i - 1][k]`` is ``z_{l+1}[k] ** i`` (hidden layer ``l``, unit ``k``).
    """

    x: list
    powers: list[list[list]]


def power_columns(ops, z: list, degree: int) -> list[list]:
    """``[z^1, .., z^degree]`` per unit by binary powering (``z^i = z^h * z^(i-h)``, ``h`` the
    largest power of two below ``i``): ``z^i`` sits ``ceil(log2 i)`` levels below ``z``."""
    powers = {1: z}
    for i in range(2, degree + 1):
        high = 1 << ((i - 1).bit_length() - 1)
        powers[i] = [ops.mul(a, b) for a, b in zip(powers[high], powers[i - high], strict=True)]
    return [powers[i] for i in range(1, degree + 1)]


def fused_forward(ops, spec: FusionSpec, weights: FusionWeights, x_cols: list):
    """The network on per-feature columns; returns ``(output columns, cache)``."""
    coefficients = spec.activation
    layers = weights.layers
    powers: list[list[list]] = []
    z = x_cols
    for index, (weight, bias) in enumerate(layers):
        if index == 0:
            z = ops.linear([(x_cols, weight)], bias)
        else:
            hidden_powers = powers[-1]
            terms = [
                (hidden_powers[i - 1], coefficients[i] * weight)
                for i in range(1, spec.degree + 1)
                if coefficients[i] != 0
            ]
            z = ops.linear(terms, bias + coefficients[0] * weight.sum(axis=0))
        if index < len(layers) - 1:
            powers.append(power_columns(ops, z, spec.degree))
    return z, ForwardCache(list(x_cols), powers)


def fused_backward(ops, spec: FusionSpec, weights: FusionWeights, cache: ForwardCache, g_cols):
    """Back-propagate output-gradient columns; returns ``(per-layer (dW, db), input columns)``.

    Weight gradients are batch sums (``ops.batch_sum``: the masked exchange under CKKS).
    """
    coefficients = spec.activation
    active = [i for i in range(1, spec.degree + 1) if coefficients[i] != 0]
    layers = weights.layers
    grads: list[tuple[np.ndarray, np.ndarray]] = [None] * len(layers)  # type: ignore[list-item]
    g = list(g_cols)
    for index in range(len(layers) - 1, -1, -1):
        weight, _ = layers[index]
        n_in, n_out = weight.shape
        bias_grad = np.array([ops.batch_sum(g[j]) for j in range(n_out)])
        weight_grad = np.empty((n_in, n_out))
        if index == 0:
            for i in range(n_in):
                for j in range(n_out):
                    weight_grad[i, j] = ops.batch_sum(ops.mul(cache.x[i], g[j]))
            grads[0] = (weight_grad, bias_grad)
            break
        hidden_powers = cache.powers[index - 1]
        scaled = {
            i: ops.linear([(g, coefficients[i] * np.eye(n_out))], np.zeros(n_out)) for i in active
        }
        for k in range(n_in):
            for j in range(n_out):
                acc = None
                for i in active:
                    product = ops.mul(hidden_powers[i - 1][k], scaled[i][j])
                    acc = product if acc is None else ops.iadd(acc, product)
                weight_grad[k, j] = ops.batch_sum(acc) + coefficients[0] * bias_grad[j]
        grads[index] = (weight_grad, bias_grad)
        # dL/dz_{l-1} = sum_i (g (i c_i W)^T) * z^(i-1)
        pulled = {
            i: ops.linear([(g, (i * coefficients[i]) * weight.T)], np.zeros(n_in)) for i in active
        }
        previous = []
        for k in range(n_in):
            acc = None
            for i in active:
                term = pulled[i][k] if i == 1 else ops.mul(pulled[i][k], hidden_powers[i - 2][k])
                acc = term if acc is None else ops.iadd(acc, term)
            previous.append(acc)
        g = previous
    first = layers[0][0]
    input_grad = ops.linear([(g, first.T)], np.zeros(first.shape[0]))
    return grads, input_grad


# ----------------------------------------------------------------------------- backends
class NumpyOps:
    """The schedule in plain numpy (reference: must match torch's autograd)."""

    def __init__(self, n_valid: int) -> None:
        self.n_valid = n_valid

    def linear(self, terms, bias):
        out = np.zeros((len(bias), len(terms[0][0][0]))) + np.asarray(bias)[:, None]
        for cols, matrix in terms:
            out += np.asarray(matrix).T @ np.stack(cols)
        return list(out)

    def mul(self, a, b):
        return a * b

    def iadd(self, acc, other):
        acc += other
        return acc

    def batch_sum(self, value) -> float:
        return float(np.sum(value[: self.n_valid]))


class LevelOps:
    """A dry run that tracks multiplicative levels (and counts operations) instead of values."""

    def __init__(self) -> None:
        self.deepest = 0
        self.counts: Counter = Counter()

    def _level(self, level: int) -> int:
        self.deepest = max(self.deepest, level)
        return level

    def linear(self, terms, bias):
        out = []
        for k in range(len(bias)):
            used = [
                cols[i] for cols, matrix in terms for i in np.flatnonzero(np.asarray(matrix)[:, k])
            ]
            self.counts["plain_mul"] += max(len(used), 1)
            out.append(self._level(max(used or [terms[0][0][0]]) + 1))
        return out

    def mul(self, a, b):
        self.counts["cipher_mul"] += 1
        return self._level(max(a, b) + 1)

    def iadd(self, acc, other):
        return max(acc, other)

    def batch_sum(self, value) -> float:
        self.counts["exchange"] += 1
        self._level(value)
        return 0.0


def schedule_levels(spec: FusionSpec, *, training: bool = True) -> tuple[int, Counter]:
    """Levels and operation counts of one forward (and backward) pass, by a dry run."""
    ops = LevelOps()
    weights = FusionWeights(
        [(np.ones((i, o)), np.ones(o)) for i, o in itertools.pairwise(spec.layer_sizes)]
    )
    _, cache = fused_forward(ops, spec, weights, [0] * spec.input_dim)
    if training:
        fused_backward(ops, spec, weights, cache, [0] * spec.output_dim)
    return ops.deepest, ops.counts


class CKKSOps:
    """The schedule on TenSEAL vectors, at the server (PublicContext only).

    ``exchange(vector) -> float`` is the masked batch sum (the key holder's help).
    """

    def __init__(self, scale_bits: int, exchange: Callable[[ts.CKKSVector], float]) -> None:
        # A weight below half a unit of the scale encodes to zero: SEAL would return a
        # "transparent" ciphertext (an error), and its contribution is below the precision anyway.
        self.min_weight = 2.0 ** -(scale_bits - 1)
        self.placeholder = 2.0 ** -(scale_bits - 4)
        self.exchange = exchange
        self.counts: Counter = Counter()

    def linear(self, terms, bias):
        out = []
        for k in range(len(bias)):
            acc = None
            for cols, matrix in terms:
                column = np.asarray(matrix)[:, k]
                for i in np.flatnonzero(np.abs(column) >= self.min_weight):
                    product = cols[i] * float(column[i])
                    acc = product if acc is None else acc.add_(product)
                    self.counts["plain_mul"] += 1
            if acc is None:  # an all-zero column: a negligible multiple keeps a valid ciphertext
                acc = terms[0][0][0] * self.placeholder
            if bias[k] != 0:
                acc.add_(float(bias[k]))
            out.append(acc)
        return out

    def mul(self, a, b):
        self.counts["cipher_mul"] += 1
        return a * b

    def iadd(self, acc, other):
        return acc.add_(other)

    def batch_sum(self, value) -> float:
        self.counts["exchange"] += 1
        return self.exchange(value)


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class CKKSFusionConfig:
    """Parameters of the CKKS fusion channel.

    Attributes:
        lr: SGD step size of the server's weights.
        key_holder: the party that decrypts masked batch sums (default: the first party).
        flooding: what the key holder does to a masked sum before releasing it to the server
            (a fixed std, default 2^-20: no decryption-error bound is derived for the fusion
            circuit's products and rescales, so the floor cannot be checked here; docs/ckks.md).
        output_noise_std: std of the Gaussian noise, freshly encrypted under the public key, that
            the server adds to every ciphertext it returns to a party (circuit privacy).
        mask_bits: masks are uniform in ``[-2^mask_bits, 2^mask_bits]``; ``None``: the chain's
            :attr:`~securefed.crypto.ckks.CKKSParameters.mask_bits` (``2^16`` at the default
            chains).
    """

    lr: float = 0.01
    key_holder: str | None = None
    flooding: Flooding = field(default_factory=lambda: Flooding(2.0**-20))
    output_noise_std: float = 2.0**-20
    mask_bits: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.lr) or self.lr <= 0:
            raise ValueError(f"lr must be finite and > 0, got {self.lr!r}")
        if not np.isfinite(self.output_noise_std) or self.output_noise_std < 0:
            raise ValueError(f"output_noise_std must be >= 0, got {self.output_noise_std!r}")
        if self.mask_bits is not None and not 1 <= self.mask_bits <= 40:
            raise ValueError(f"mask_bits must lie in [1, 40], got {self.mask_bits!r}")
        if not isinstance(self.flooding, Flooding):
            raise TypeError(f"flooding must be a Flooding, got {type(self.flooding).__name__}")
        if self.flooding.std is None:
            raise ValueError(
                "the fusion channel needs an explicit flooding std: no decryption-error bound is "
                "derived for the fusion circuit, so the floor (std=None) is not defined here"
            )


@dataclass
class FusionTranscript:
    """The communication ledger of a channel: bytes per party, exchanges, time, operations."""

    bytes_to_server: Counter = field(default_factory=Counter)
    bytes_to_party: Counter = field(default_factory=Counter)
    exchanges: int = 0
    exchange_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    operations: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "bytes_to_server": dict(self.bytes_to_server),
            "bytes_to_party": dict(self.bytes_to_party),
            "exchanges": self.exchanges,
            "exchange_bytes": self.exchange_bytes,
            "seconds": dict(self.seconds),
            "operations": dict(self.operations),
        }


# ----------------------------------------------------------------------------- the roles
class FusionParty:
    """One party: encrypts its columns, decrypts what is addressed to it, releases masked sums."""

    def __init__(self, party: Party, secret: SecretContext) -> None:
        self.party = party
        self._secret = secret
        self.slots = secret.params.slots

    def encrypt_columns(self, matrix: np.ndarray) -> list[Ciphertext]:
        """One ciphertext per column, zero-padded to every slot (the masks cover every slot)."""
        padded = np.zeros(self.slots)
        out = []
        for column in matrix.T:
            padded[: len(column)] = column
            padded[len(column) :] = 0.0
            out.append(self._secret.dump(self._secret.encrypt_vector(padded), len(column)))
        return out

    def _decrypt(self, ciphertext: Ciphertext) -> np.ndarray:
        # Every slot carries data or masks here: no check slot (the key id is still checked).
        return self._secret.decrypt_vector(self._secret.load(ciphertext), ciphertext.length)

    def decrypt_columns(self, ciphertexts: Sequence[Ciphertext], n_rows: int) -> np.ndarray:
        """Decrypt ciphertexts addressed to this party into an ``(n_rows, len)`` matrix."""
        return np.stack([self._decrypt(c)[:n_rows] for c in ciphertexts], axis=1)

    def release_sum(self, masked: Ciphertext, n_rows: int, flooding: Flooding, noise) -> float:
        """The key holder's step: decrypt a masked vector, sum its first ``n_rows`` slots, flood.

        The std is the configured one (no bound is stated for the fusion circuit; see
        :class:`CKKSFusionConfig`)."""
        total = float(self._decrypt(masked)[:n_rows].sum())
        return float(flooding.apply_without_bound(np.array([total]), noise)[0])


class _MaskSource:
    """Uniform masks in ``[-bound, bound]``: seeded numpy, or ChaCha20 in secure mode."""

    def __init__(self, seeds: SeedTree, bound: float) -> None:
        self.bound = bound
        self._secure = SecureGaussian() if seeds.secure else None
        self._rng = None if seeds.secure else seeds.generator("ckks-fusion", "masks")

    def draw(self, n: int) -> np.ndarray:
        if self._secure is not None:
            return (2.0 * self._secure.uniform(n) - 1.0) * self.bound
        return self._rng.uniform(-self.bound, self.bound, n)


class FusionServer:
    """The server: weights in the clear, a PublicContext, ciphertexts of everything else.

    Args:
        spec: the network.
        weights: initial weights (copied).
        context: the public context (needs relinearization keys and, to re-randomize what it
            returns, the public key).
        config: channel parameters.
        seeds: the run's seed tree (masks; output noise).
        exchange: ``(masked ciphertext, n_rows) -> released masked sum`` (the key holder).
    """

    def __init__(
        self,
        spec: FusionSpec,
        weights: FusionWeights,
        context: PublicContext,
        config: CKKSFusionConfig,
        seeds: SeedTree,
        exchange: Callable[[Ciphertext, int], float],
    ) -> None:
        if not isinstance(context, PublicContext):
            raise TypeError(f"the server holds a PublicContext, got {type(context).__name__}")
        if not context.has_relin_keys:
            raise ValueError("the server's public context needs relinearization keys")
        if config.output_noise_std > 0 and not context.can_encrypt:
            raise ValueError(
                "re-randomizing the ciphertexts returned to the parties needs public-key "
                "encryption: use a public-key context, or output_noise_std=0 (no circuit privacy)"
            )
        self.spec = spec
        self.weights = weights.check(spec)
        self.context = context
        self.config = config
        params = context.params
        mask_bits = config.mask_bits if config.mask_bits is not None else params.mask_bits
        self.masks = _MaskSource(seeds, 2.0**mask_bits)
        self._output_noise = noise_source(seeds, "ckks-fusion", "output-noise")
        self._exchange = exchange
        self._chunks: list[tuple[int, ForwardCache]] = []
        self.counts: Counter = Counter()

    def _ops(self, n_rows: int) -> CKKSOps:
        def masked_sum(vector: ts.CKKSVector) -> float:
            mask = self.masks.draw(vector.size())
            envelope = self.context.dump(vector + mask.tolist(), n_rows)
            return self._exchange(envelope, n_rows) - float(mask[:n_rows].sum())

        ops = CKKSOps(self.context.params.scale_bits, masked_sum)
        ops.counts = self.counts
        return ops

    def _return(self, vectors: list[ts.CKKSVector], n_rows: int) -> list[Ciphertext]:
        """Re-randomize (fresh public-key encryption of noise) and serialize for a party."""
        out = []
        for vector in vectors:
            if self.context.can_encrypt and self.config.output_noise_std > 0:
                noise = self._output_noise.normal(self.config.output_noise_std, vector.size())
                vector = vector + self.context.encrypt_vector(noise)
            out.append(self.context.dump(vector, n_rows))
        return out

    def forward(
        self,
        chunks: list[tuple[list[Ciphertext], int]],
        *,
        weights: FusionWeights | None = None,
        keep: bool = True,
    ) -> list[list[Ciphertext]]:
        """Evaluate each chunk ``(input column ciphertexts, n_rows)``.

        Args:
            chunks: the parties' encrypted columns, per chunk of samples.
            weights: evaluate these weights (the target network's) instead of the online ones.
            keep: keep the caches for :meth:`backward` (``False``: evaluation only, an earlier
                training forward's caches stay).
        """
        evaluated = self.weights if weights is None else weights
        caches = []
        outputs = []
        for ciphertexts, n_rows in chunks:
            x = [self.context.load(c) for c in ciphertexts]
            y, cache = fused_forward(self._ops(n_rows), self.spec, evaluated, x)
            caches.append((n_rows, cache))
            outputs.append(self._return(y, n_rows))
        if keep:
            self._chunks = caches
        return outputs

    def backward(self, chunks: list[list[Ciphertext]]) -> list[list[Ciphertext]]:
        """Back-propagate each chunk's output-gradient columns, step the weights, return the
        input-gradient ciphertexts per chunk."""
        if len(chunks) != len(self._chunks) or not self._chunks:
            raise RuntimeError("backward() needs a forward() of the same batch first")
        total = [(np.zeros_like(w), np.zeros_like(b)) for w, b in self.weights.layers]
        returned = []
        for ciphertexts, (n_rows, cache) in zip(chunks, self._chunks, strict=True):
            g = [self.context.load(c) for c in ciphertexts]
            grads, dx = fused_backward(self._ops(n_rows), self.spec, self.weights, cache, g)
            for (tw, tb), (gw, gb) in zip(total, grads, strict=True):
                tw += gw
                tb += gb
            returned.append(self._return(dx, n_rows))
        self._chunks = []
        lr = self.config.lr
        self.weights = FusionWeights(
            [
                (w - lr * gw, b - lr * gb)
                for (w, b), (gw, gb) in zip(self.weights.layers, total, strict=True)
            ]
        )
        self.last_gradients = FusionWeights(total)
        return returned


# ----------------------------------------------------------------------------- the channel
class CKKSFusionChannel(FusionChannelBase):
    """The fused MLP under CKKS, behind the :class:`~securefed.fusion.base.FusionChannel` seam.

    ``(batch, width)`` matrices, one member, the ``"concatenated"`` layout. A party asks for
    ``positions`` of its output after decrypting it (the server does not learn them); parties
    without an output gradient in a backward send encrypted zeros. The target network is a
    frozen copy of the server's weights, evaluated the same way. The view records, per
    exchange, the sizes and SHA-256 digests of the ciphertexts each party sent and received,
    the bytes (the key holder's masked exchange included), and the weight gradients the server
    obtains in the clear (``aggregate``).

    Args:
        spec: the network.
        weights: the server's initial weights.
        seeds: the run's seed tree (masks and noise; secure mode uses ChaCha20).
        config: channel parameters.
        secret: the parties' shared key (default: fresh keys for ``spec.circuit()``, public-key
            encryption so that the server can re-randomize what it returns).
        keep_payloads: which rounds of the view keep full payloads.
        total_rounds: the run's length (for ``keep_payloads``' ``last:K``).

    Raises:
        ValueError: a key holder that is not a party, or a context with too few levels.
    """

    name = "ckks"

    def __init__(
        self,
        spec: FusionSpec,
        weights: FusionWeights,
        *,
        seeds: SeedTree,
        config: CKKSFusionConfig | None = None,
        secret: SecretContext | None = None,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
    ) -> None:
        self.spec = spec
        self._parties = spec.names
        self.config = CKKSFusionConfig() if config is None else config
        if secret is None:
            secret = ckks_context(spec.circuit(), encryption="public-key")
        needed = spec.circuit().levels
        if secret.params.levels < needed:
            raise ValueError(
                f"the context has {secret.params.levels} rescaling level(s); this network needs "
                f"{needed} (depth {spec.depth}, activation degree {spec.degree}, training)"
            )
        key_holder = self.config.key_holder or spec.names[0]
        if key_holder not in spec.names:
            raise ValueError(f"key_holder {key_holder!r} is not a party of {list(spec.names)}")
        self.params = secret.params
        self.parties_by_name = {p.name: FusionParty(p, secret) for p in spec.parties}
        self.key_holder = key_holder
        self.transcript = FusionTranscript()
        self._flood_noise = noise_source(seeds, "ckks-fusion", "flood")
        self.server = FusionServer(
            spec, weights, secret.public(), self.config, seeds, self._exchange
        )
        self._target_weights = self.server.weights.copy()
        self._pending: tuple | None = None
        self.view = FusionView(
            self.name,
            spec.names,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            public=spec_public(spec)
            | {
                "optimiser": "sgd",
                "lr": self.config.lr,
                "ckks": self.params.public(),
                "key_holder": key_holder,
                "mask_bound": self.server.masks.bound,
                "flooding": repr(self.config.flooding),
                "flooding_error_bound": None,
                "output_noise_std": self.config.output_noise_std,
                "seeded": not seeds.secure,
            },
        )

    @property
    def weights(self) -> FusionWeights:
        """The server's current weights (the simulation can look; the parties cannot)."""
        return self.server.weights.copy()

    def sync_target(self) -> None:
        self._target_weights = self.server.weights.copy()

    def _exchange(self, masked: Ciphertext, n_rows: int) -> float:
        start = time.perf_counter()
        self.transcript.exchanges += 1
        self.transcript.exchange_bytes += masked.nbytes + 8
        self.transcript.bytes_to_party[self.key_holder] += masked.nbytes
        self.transcript.bytes_to_server[self.key_holder] += 8
        value = self.parties_by_name[self.key_holder].release_sum(
            masked, n_rows, self.config.flooding, self._flood_noise
        )
        self.transcript.seconds["exchange"] += time.perf_counter() - start
        return value

    def _chunk_bounds(self, batch: int) -> list[tuple[int, int]]:
        slots = self.params.slots
        return [(start, min(batch, start + slots)) for start in range(0, batch, slots)]

    def _encrypt(self, matrices: Mapping[str, np.ndarray], batch: int):
        """Every party encrypts its columns, chunk by chunk; returns the chunks the server gets
        and each party's ciphertexts (for the view)."""
        chunks = []
        sent: dict[str, list[Ciphertext]] = {name: [] for name in self.spec.names}
        for start, stop in self._chunk_bounds(batch):
            columns: list[Ciphertext] = []
            for name in self.spec.names:
                ciphertexts = self.parties_by_name[name].encrypt_columns(matrices[name][start:stop])
                self.transcript.bytes_to_server[name] += sum(c.nbytes for c in ciphertexts)
                columns.extend(ciphertexts)
                sent[name].extend(ciphertexts)
            chunks.append((columns, stop - start))
        return chunks, sent

    def _deliver(
        self,
        chunks: list[list[Ciphertext]],
        slices: dict[str, slice],
        batch: int,
        parties: Sequence[str],
    ):
        """Each of ``parties`` decrypts its own columns of every chunk; returns the matrices and
        the ciphertexts each received."""
        out, received = {}, {}
        for name in parties:
            cut = slices[name]
            parts, mine_all = [], []
            for ciphertexts, (start, stop) in zip(chunks, self._chunk_bounds(batch), strict=True):
                mine = ciphertexts[cut]
                self.transcript.bytes_to_party[name] += sum(c.nbytes for c in mine)
                parts.append(self.parties_by_name[name].decrypt_columns(mine, stop - start))
                mine_all.extend(mine)
            out[name] = np.concatenate(parts, axis=0)
            received[name] = mine_all
        return out, received

    def _bytes(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.transcript.bytes_to_server), dict(self.transcript.bytes_to_party)

    def _record(self, kind, before, *, network, tag, train, outputs, up, down, aggregate=None):
        """Count the exchange's bytes (transcript deltas); keep its ciphertext sizes and digests
        in rounds that keep payloads."""
        after = self._bytes()
        delta = [
            {p: after[i].get(p, 0) - before[i].get(p, 0) for p in self.spec.names} for i in (0, 1)
        ]
        payloads = None
        if self.view.keeps_current:
            payloads = {}
            for fields, ciphertexts_of in (up, down):
                for party, ciphertexts in ciphertexts_of.items():
                    payloads.setdefault(party, {}).update(_ciphertext_fields(fields, ciphertexts))
        self.view.record(
            kind,
            network=network,
            tag=tag,
            train=train,
            outputs=outputs,
            bytes_up={p: n for p, n in delta[0].items() if n},
            bytes_down={p: n for p, n in delta[1].items() if n},
            payloads=payloads,
            aggregate=aggregate if self.view.keeps_current else None,
        )

    def _forward(self, inquiry: Inquiry) -> dict[str, np.ndarray]:
        """Parties encrypt, the server evaluates, each party in ``outputs`` decrypts its slice
        (and picks its ``positions``)."""
        outputs, network, train, tag = inquiry.outputs, inquiry.network, inquiry.train, inquiry.tag
        matrices, batch, chosen = check_spec_inquiry(self.spec, inquiry)
        before = self._bytes()
        seconds = self.transcript.seconds
        start = time.perf_counter()
        chunks, sent = self._encrypt(matrices, batch)
        start = _tick(seconds, "party_encrypt", start)
        evaluated = None if network == "online" else self._target_weights
        returned = self.server.forward(chunks, weights=evaluated, keep=train)
        start = _tick(seconds, "server_forward", start)
        full, received = self._deliver(returned, self.spec.output_slices(), batch, outputs)
        result = {p: pick(full[p], chosen.get(p)) for p in outputs}
        _tick(seconds, "party_decrypt", start)
        self.transcript.operations = Counter(self.server.counts)
        if train:
            self._pending = (batch, outputs, chosen, tag)
        self._record(
            "forward",
            before,
            network=network,
            tag=tag,
            train=train,
            outputs=outputs,
            up=("input", sent),
            down=("output", received),
        )
        return result

    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        """Parties encrypt ``dL/dy``; the server back-propagates with the masked exchange and steps
        its weights; each of ``recipients`` decrypts ``dL/dx`` of its own input."""
        if self._pending is None:
            raise RuntimeError("backward() needs a forward() first (once per forward)")
        recipients = check_parties_named("recipients", self.spec.names, recipients)
        batch, outputs, chosen, tag = self._pending
        g = output_gradient(self.spec, grads, outputs, chosen, batch)
        matrices = split(self.spec, g, kind="output")
        before = self._bytes()
        seconds = self.transcript.seconds
        start = time.perf_counter()
        encrypted, sent = self._encrypt(matrices, batch)
        chunks = [columns for columns, _ in encrypted]
        start = _tick(seconds, "party_encrypt", start)
        exchange_before = seconds["exchange"]
        returned = self.server.backward(chunks)
        elapsed = time.perf_counter() - start
        seconds["server_backward"] += elapsed - (seconds["exchange"] - exchange_before)
        start = time.perf_counter()
        result, received = self._deliver(returned, self.spec.input_slices(), batch, recipients)
        _tick(seconds, "party_decrypt", start)
        self.transcript.operations = Counter(self.server.counts)
        self._pending = None
        gradients = {}
        for index, (weight_grad, bias_grad) in enumerate(self.server.last_gradients.layers):
            gradients[f"layer{index}_weight_grad"] = weight_grad
            gradients[f"layer{index}_bias_grad"] = bias_grad
        self._record(
            "backward",
            before,
            network="online",
            tag=tag,
            train=True,
            outputs=recipients,
            up=("output_grad", sent),
            down=("input_grad", received),
            aggregate=gradients,
        )
        return result


def _ciphertext_fields(field: str, ciphertexts: Sequence[Ciphertext]) -> dict[str, np.ndarray]:
    """What a view keeps of ciphertexts: their sizes and SHA-256 digests."""
    digests = (
        np.stack([np.frombuffer(c.digest(), np.uint8) for c in ciphertexts])
        if ciphertexts
        else np.zeros((0, 32), np.uint8)
    )
    return {
        f"{field}_ciphertext_sizes": np.array([c.nbytes for c in ciphertexts], np.int64),
        f"{field}_ciphertext_sha256": digests,
    }


def _tick(seconds: dict[str, float], stage: str, start: float) -> float:
    now = time.perf_counter()
    seconds[stage] += now - start
    return now


__all__ = [
    "CKKSFusionChannel",
    "CKKSFusionConfig",
    "FusionParty",
    "FusionServer",
    "FusionTranscript",
    "fused_backward",
    "fused_forward",
    "schedule_levels",
]
