"""CKKS aggregation: clients encrypt, the server adds ciphertexts, key holders decrypt the sum.

Key management as in Chai et al. 2020 ("Secure Federated Matrix Factorization", Sec. 3): the users
share one CKKS secret key that the server lacks (``key_model="shared"``, the default). Each round

1. every client packs its update densely (a :class:`RowUpdates` block is densified: rows it did not
   touch are zeros, so the server cannot tell which rows it touched), applies its weight
   client-side (``w * x``, then ``w`` as one extra slot when the round is weighted), and encrypts
   it into ``ceil(values / slots)`` ciphertexts that fill every slot (``slots = N / 2``: 4096 at
   degree 8192, so a FedMF ML-100K block of 1684 x 21 = 35,364 values takes 9 ciphertexts);
2. the server, which holds only the :class:`~securefed.crypto.ckks.PublicContext`, adds the
   ciphertexts slot-block by slot-block as they arrive (it never decrypts, and cannot);
3. at ``result()`` a key holder (:class:`KeyHolder`; in the shared model one surviving
   contributor, chosen as the lowest id) receives the summed ciphertexts, decrypts them, floods and
   rounds the values (:class:`~securefed.crypto.ckks.Flooding`, against the key-recovery attack of
   Li and Micciancio 2021) and returns the aggregate to the server.

``key_model="committee"`` is the variant in which clients only get the public context (public-key
encryption, counted once per client as bytes down) and a separate key-holder committee decrypts:
a client colluding with the server then learns nothing it should not. In both models a key holder
colluding with the server decrypts every upload, and nothing protects against a malicious server
(it may drop, replay or alter ciphertexts; see docs/ckks.md).

Chai et al.'s own variant, in which the item matrix stays encrypted at the server and the users
decrypt it each round, is :class:`EncryptedState` with :meth:`CKKSRound.fold_into` (the round's
summed ciphertexts are added to ``[[V]]``; nothing is decrypted at all), offered on the seam as
:meth:`CKKSTransport.encrypted_state` and declared by ``capabilities.encrypted_state`` (shared key
model, key holders in this process); FedMF's ``server_state="encrypted"`` uses it through the seam
(docs/ckks.md, "Encrypted item matrix").

What the view records: per client the ciphertext sizes and SHA-256 digests (``ciphertext_sizes``,
``ciphertext_sha256``; the full bytes as ``ciphertexts`` only with ``keep_ciphertext_bytes``:
943 clients x 9 x 131 KB is 1.1 GB a round), bytes up = serialized ciphertext bytes, bytes down =
the public context when a client is sent one (committee model) and, for the decrypting key holder,
the summed ciphertexts (with its plaintext reply as bytes up). The aggregate is what the server
learns, as under secure aggregation.

Refusals: more clients in a round than the parameters were sized for
(:class:`~securefed.errors.AggregationError`); a value ``|w x|`` or weight above ``value_bound``
(``ValueError``: it could overflow the decryption modulus, never silently); a ciphertext made under
another key (:class:`~securefed.crypto.ckks.ContextMismatchError`); insecure parameters
(:class:`~securefed.errors.InsecureParameterError`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import tenseal as ts

from securefed._checks import finite_array
from securefed.crypto.ckks import (
    AggregationCircuit,
    Ciphertext,
    CKKSParameters,
    ContextMismatchError,
    Flooding,
    PublicContext,
    SecretContext,
    chunk_count,
    ckks_context,
    decryption_error_bound,
    parameters_for,
)
from securefed.errors import AggregationError
from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.transport.base import FLOAT_BYTES, Aggregate, AggregationRound, RowUpdates, Transport
from securefed.transport.capabilities import TransportCapabilities
from securefed.views import NO_PAYLOADS, RoundSelection, RoundView

KEY_MODELS: tuple[str, ...] = ("shared", "committee")
STAGES = ("encrypt", "serialize", "server_add", "decrypt")


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class CKKSConfig:
    """Parameters of the CKKS transport (all public).

    Attributes:
        key_model: ``"shared"`` (Chai et al.: every user holds the secret key; symmetric
            encryption, about twice as fast) or ``"committee"`` (clients hold the public context
            only; public-key encryption; a key-holder committee decrypts).
        max_clients: most clients per round the parameters are sized for.
        value_bound: public bound on every uploaded ``|w * x|`` and ``w``.
        poly_modulus_degree, coeff_mod_bit_sizes, scale_bits: override the parameters that
            :func:`~securefed.crypto.ckks.parameters_for` picks (validated the same way).
        flooding: noise and rounding applied by the key holder before releasing the aggregate;
            its std is fixed here for the parameters' decryption-error bound at ``max_clients``
            (:attr:`decryption_error`): ``None`` takes the floor of its ``security_bits``, a given
            std below the floor is refused (:class:`~securefed.errors.InsecureParameterError`).
        keep_ciphertext_bytes: in rounds that keep payloads, keep every ciphertext's bytes
            (otherwise sizes and SHA-256 digests only).
    """

    key_model: Literal["shared", "committee"] = "shared"
    max_clients: int = 1024
    value_bound: float = 65536.0
    poly_modulus_degree: int | None = None
    coeff_mod_bit_sizes: tuple[int, ...] | None = None
    scale_bits: int | None = None
    flooding: Flooding = field(default_factory=Flooding)
    keep_ciphertext_bytes: bool = False

    def __post_init__(self) -> None:
        if self.key_model not in KEY_MODELS:
            raise ValueError(f"key_model must be one of {KEY_MODELS}, got {self.key_model!r}")
        AggregationCircuit(self.max_clients, self.value_bound)  # validates both
        if not isinstance(self.flooding, Flooding):
            raise TypeError(f"flooding must be a Flooding, got {type(self.flooding).__name__}")
        if self.coeff_mod_bit_sizes is not None:
            object.__setattr__(
                self, "coeff_mod_bit_sizes", tuple(int(b) for b in self.coeff_mod_bit_sizes)
            )
        object.__setattr__(self, "flooding", self.flooding.calibrated(self.decryption_error))

    @property
    def circuit(self) -> AggregationCircuit:
        return AggregationCircuit(self.max_clients, self.value_bound)

    @property
    def encryption(self) -> str:
        return "symmetric" if self.key_model == "shared" else "public-key"

    @property
    def params(self) -> CKKSParameters:
        """The parameters :meth:`make_keys` generates keys for (validated, no keys made)."""
        return parameters_for(
            self.circuit,
            poly_modulus_degree=self.poly_modulus_degree,
            coeff_mod_bit_sizes=self.coeff_mod_bit_sizes,
            scale_bits=self.scale_bits,
            encryption=self.encryption,
        )

    @property
    def decryption_error(self) -> float:
        """The stated bound on a decrypted sum's error (:func:`decryption_error_bound` at
        ``max_clients`` ciphertexts: the most a round may sum)."""
        return decryption_error_bound(self.params, self.max_clients)

    def make_keys(self) -> SecretContext:
        """Generate the key holders' context for these parameters."""
        return ckks_context(
            self.circuit,
            poly_modulus_degree=self.poly_modulus_degree,
            coeff_mod_bit_sizes=self.coeff_mod_bit_sizes,
            scale_bits=self.scale_bits,
            encryption=self.encryption,
        )

    def public(self) -> dict[str, object]:
        return {
            "key_model": self.key_model,
            "max_clients": self.max_clients,
            "value_bound": self.value_bound,
            "keep_ciphertext_bytes": self.keep_ciphertext_bytes,
            "ckks_decryption_error": self.decryption_error,
            **self.flooding.public(),
        }


FLOOD_STREAM = ("ckks", "flood")
"""Seed-tree path (plus the round) of the key holder's flooding noise in seeded runs."""


@dataclass(frozen=True)
class DecryptionRequest:
    """What the server sends a key holder at the end of a round (stage 3).

    Attributes:
        round_id: the round (the key holder's flooding stream in seeded runs).
        decryptor: the client asked to decrypt (shared key model), ``None`` for a committee.
        summed: the summed ciphertexts.
        length: meaningful values in them (``n_rows * width``, plus the weight if weighted).
    """

    round_id: int
    decryptor: int | None
    summed: list[Ciphertext]
    length: int


# ----------------------------------------------------------------------------- pure helpers
def pack_update(block: np.ndarray, weight: float | None) -> np.ndarray:
    """The plaintext a client encrypts: ``w * block`` flattened, then ``w`` (weighted rounds)."""
    flat = np.asarray(block, dtype=np.float64).ravel()
    if weight is None:
        return flat
    packed = np.empty(flat.size + 1)
    np.multiply(flat, weight, out=packed[:-1])
    packed[-1] = weight
    return packed


def check_bound(client: int, values: np.ndarray, bound: float) -> None:
    """Refuse a packed update with an entry beyond ``bound`` (it could overflow the modulus).

    Raises:
        ValueError: naming the client, the position and the value.
    """
    if values.size == 0:
        return
    position = int(np.argmax(np.abs(values)))
    if abs(values[position]) > bound:
        raise ValueError(
            f"client {client}'s packed update has {values[position]:g} at position {position}, "
            f"beyond the CKKS value_bound {bound:g}: the encrypted sum could overflow the "
            "decryption modulus (raise value_bound, which lowers the precision)"
        )


def check_batch_bound(updates: RowUpdates, bound: float) -> None:
    """:func:`check_bound` for every client of a batch, without densifying any of them.

    Raises:
        ValueError: naming the first client whose ``|w x|`` or ``w`` exceeds ``bound``.
    """
    counts = np.diff(updates.indptr)
    largest = np.zeros(len(updates.clients))
    if updates.values.size:
        row_max = np.abs(updates.values).max(axis=1)
        nonempty = counts > 0
        # Empty clients own no rows, so consecutive non-empty starts delimit each client's rows.
        largest[nonempty] = np.maximum.reduceat(row_max, updates.indptr[:-1][nonempty])
    if updates.weights is not None:
        largest = np.maximum(largest * updates.weights, updates.weights)
    beyond = np.flatnonzero(largest > bound)
    if len(beyond):
        k = int(beyond[0])
        check_bound(
            int(updates.clients[k]),
            pack_update(
                updates.client_block(k), None if updates.weights is None else updates.weights[k]
            ),
            bound,
        )


def digests(ciphertexts: Sequence[Ciphertext]) -> np.ndarray:
    """``(n, 32)`` uint8 SHA-256 digests of the serialized ciphertexts."""
    if not ciphertexts:
        return np.zeros((0, 32), np.uint8)
    return np.stack([np.frombuffer(c.digest(), np.uint8) for c in ciphertexts])


class _Timer:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    def add(self, stage: str, start: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - start
        return now


# ----------------------------------------------------------------------------- the parties
class KeyHolder:
    """A holder of the shared secret key who decrypts only what it is asked to: the aggregate.

    Args:
        secret: the key holders' context.
        flooding: noise and rounding before a decryption is released to the server.
        max_clients: most ciphertexts a sum it decrypts may hold: the decryption-error bound it
            floods against (:func:`~securefed.crypto.ckks.decryption_error_bound`) is that of
            its own parameters at this count, whatever the server says.

    Raises:
        InsecureParameterError: ``flooding``'s std below the floor for that bound.
    """

    def __init__(self, secret: SecretContext, flooding: Flooding, max_clients: int) -> None:
        if not isinstance(secret, SecretContext):
            raise TypeError(f"a KeyHolder needs a SecretContext, got {type(secret).__name__}")
        self._secret = secret
        self.flooding = flooding
        self.decryption_error = decryption_error_bound(secret.params, max_clients)
        flooding.std_for(self.decryption_error)  # refuse a weak flooding before any round

    @property
    def key_id(self) -> str:
        return self._secret.key_id

    @property
    def params(self) -> CKKSParameters:
        return self._secret.params

    def encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """Encrypt as a client of the shared-key model (every user is a key holder)."""
        return self._secret.encrypt(values)

    def decrypt_for_clients(self, ciphertexts: Sequence[Ciphertext]) -> np.ndarray:
        """Decrypt for key-holding clients themselves (values that never go back to the server)."""
        return self._secret.decrypt(list(ciphertexts))

    def decrypt_aggregate(self, summed: Sequence[Ciphertext], length: int, noise) -> np.ndarray:
        """Decrypt the summed ciphertexts, flood and round, return the first ``length`` values."""
        values = self._secret.decrypt(list(summed))
        if len(values) < length:
            raise AggregationError(f"the summed ciphertexts hold {len(values)} < {length} values")
        return self.flooding.apply(values[:length], noise, error_bound=self.decryption_error)


class AggregatingServer:
    """The server side of one round: a PublicContext and one running sum per slot block.

    It can add ciphertexts and serialize the sums; it holds no secret key, so it cannot decrypt.
    """

    def __init__(self, context: PublicContext, n_blocks: int) -> None:
        if not isinstance(context, PublicContext):
            raise TypeError(f"the server holds a PublicContext, got {type(context).__name__}")
        self.context = context
        self.n_blocks = n_blocks
        self._sums: list[ts.CKKSVector | None] = [None] * n_blocks
        self._lengths = [0] * n_blocks

    def receive(self, ciphertexts: Sequence[Ciphertext]) -> None:
        """Deserialize one client's ciphertexts and add them in place to the running sums.

        Raises:
            ValueError: a wrong number of ciphertexts.
            ContextMismatchError: a ciphertext made under another key.
        """
        if len(ciphertexts) != self.n_blocks:
            raise ValueError(
                f"an upload of this round has {self.n_blocks} ciphertexts, got {len(ciphertexts)}"
            )
        vectors = [self.context.load(c) for c in ciphertexts]  # all checked before any is added
        for block, (vector, envelope) in enumerate(zip(vectors, ciphertexts, strict=True)):
            if self._sums[block] is None:
                self._sums[block] = vector  # no copy: the deserialized vector is ours
                self._lengths[block] = envelope.length
            else:
                self._sums[block].add_(vector)

    @property
    def empty(self) -> bool:
        return self._sums[0] is None

    def summed(self) -> list[Ciphertext]:
        """The sums as envelopes, for the key holder."""
        if self.empty:
            raise AggregationError("no ciphertext was received")
        return [
            self.context.dump(vector, length)
            for vector, length in zip(self._sums, self._lengths, strict=True)
        ]


# ----------------------------------------------------------------------------- the round
class CKKSRound(AggregationRound):
    """One CKKS aggregation round (see the module docstring).

    Attributes:
        server: the :class:`AggregatingServer` (PublicContext only).
        n_ciphertexts: ciphertexts per client upload.
        timings: seconds per stage, all clients and the server together.
        decryptor: the client that decrypted the aggregate (shared model), else ``None``.
    """

    def __init__(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        view: RoundView,
        seeds: SeedTree,
        transport: CKKSTransport,
    ) -> None:
        super().__init__(round_id, clients, shape=shape, view=view, seeds=seeds)
        self.config = transport.config
        self._transport = transport
        self._weighted: bool | None = None
        self._length: int | None = None
        self.server: AggregatingServer | None = None
        self.n_ciphertexts = 0
        self.decryptor: int | None = None
        self._folded = False
        self._request: DecryptionRequest | None = None
        self._decrypted: np.ndarray | None = None
        self.timer = _Timer()
        self.timings = self.timer.seconds
        if len(self.clients) > self.config.max_clients:
            raise AggregationError(
                f"round {round_id} has {len(self.clients)} clients but the CKKS parameters were "
                f"sized for at most {self.config.max_clients} (value_bound "
                f"{self.config.value_bound:g}): the sum could overflow; raise max_clients"
            )
        if self.config.key_model == "committee":
            fresh = transport.clients_without_context(self.clients)
            self.view.add_bytes_down(fresh, transport.server_context.nbytes)
        view.public.update({"ckks_key_model": self.config.key_model})

    # -- stage 1 and 2: clients encrypt, the server adds -----------------------------------
    def _accept(self, updates: RowUpdates) -> None:
        if self._folded:
            raise AggregationError(
                f"round {self.round_id} was folded into the encrypted state; open a new round"
            )
        weighted = updates.weights is not None
        self._start(weighted)
        weights = updates.client_weights()
        encrypt = self._transport.client_encrypt
        bound = self.config.value_bound
        sizes = np.zeros(len(updates.clients), np.int64)
        # Validate every client of the batch before any ciphertext reaches the server.
        check_batch_bound(updates, bound)
        for k, client in enumerate(updates.clients.tolist()):
            start = time.perf_counter()
            packed = pack_update(updates.client_block(k), weights[k] if weighted else None)
            ciphertexts = encrypt(packed)
            self.timer.add("encrypt", start)
            sizes[k] = self._add(client, ciphertexts)
        self.view.add_bytes_up(updates.clients, sizes)

    def _start(self, weighted: bool) -> None:
        """Fix the round's packing at its first upload (weighted or not)."""
        if self._weighted is not None and self._weighted != weighted:
            raise ValueError(
                "every client of a CKKS round must submit with a weight, or none must (this "
                f"round's first submission {'had' if self._weighted else 'had no'} weight)"
            )
        if self._weighted is None:
            self._weighted = weighted
            self._length = self.shape[0] * self.shape[1] + int(weighted)
            self.n_ciphertexts = chunk_count(
                self._length, self._transport.server_context.data_slots
            )
            self.server = AggregatingServer(self._transport.server_context, self.n_ciphertexts)
            self.view.public.update(
                {"ckks_values_per_client": self._length, "ckks_ciphertexts": self.n_ciphertexts}
            )

    def _add(self, client: int, ciphertexts: Sequence[Ciphertext]) -> int:
        """The server adds one client's ciphertexts and records them; returns their bytes."""
        start = time.perf_counter()
        self.server.receive(ciphertexts)
        self.timer.add("server_add", start)
        if self.view.keep_payloads:
            fields = {
                "ciphertext_sizes": np.array([c.nbytes for c in ciphertexts], np.int64),
                "ciphertext_sha256": digests(ciphertexts),
            }
            if self.config.keep_ciphertext_bytes:
                fields["ciphertexts"] = np.frombuffer(
                    b"".join(c.data for c in ciphertexts), np.uint8
                ).copy()
            self.view.record_payload(client, fields)
        return sum(c.nbytes for c in ciphertexts)

    # -- stages 1 and 2 with the clients elsewhere (securefed.flower) ------------------------
    def receive_ciphertexts(
        self, client: int, ciphertexts: Sequence[Ciphertext], *, weighted: bool
    ) -> None:
        """Add the ciphertexts ``client`` encrypted on its own machine (stage 2 only).

        What :meth:`submit_batch` does after a client has encrypted, for clients that run
        elsewhere (``securefed.flower``'s nodes): the same checks of the round's bookkeeping,
        the same additions, the same view records. The bound on ``|w x|`` is checked by the
        client before it encrypts (the server cannot check a ciphertext).

        Raises:
            AggregationError: a client outside the round, one that already submitted or dropped.
            ValueError: a wrong number of ciphertexts, or weighting unlike the round's.
            ContextMismatchError: a ciphertext made under another key.
        """
        self._check_open()
        if self._folded:
            raise AggregationError(
                f"round {self.round_id} was folded into the encrypted state; open a new round"
            )
        client = int(client)
        self.view.positions([client])  # raises for a client outside the round
        if client in self.submitted:
            raise AggregationError(f"client {client} already submitted in this round")
        if client in self.dropped:
            raise AggregationError(f"client {client} dropped out and cannot submit")
        self._start(bool(weighted))
        size = self._add(client, ciphertexts)
        self.view.add_bytes_up([client], size)
        self.submitted.add(client)

    # -- stage 3: a key holder decrypts the sum ----------------------------------------------
    def decryption_request(self) -> DecryptionRequest | None:
        """What the server sends a key holder: the summed ciphertexts (``None``: nothing to sum).

        Records, as in one process, the decrypting client (shared model: the lowest surviving
        contributor) and the bytes it receives and returns. Idempotent.

        Raises:
            AggregationError: the round was folded, or every client dropped (no key holder).
        """
        if self._folded:
            raise AggregationError(
                f"round {self.round_id}'s sum was folded into the encrypted state: nobody "
                "decrypted it, so there is no aggregate to return (that is the point)"
            )
        if self._request is not None:
            return self._request
        if not self.submitted or self.server is None:
            return None
        start = time.perf_counter()
        summed = self.server.summed()
        self.timer.add("serialize", start)
        summed_bytes = sum(c.nbytes for c in summed)
        if self.config.key_model == "shared":
            survivors = [c for c in self.clients.tolist() if c not in self.dropped]
            contributors = sorted(self.submitted)
            present = [c for c in contributors if c not in self.dropped] or survivors
            if not present:
                raise AggregationError(
                    f"round {self.round_id}: every client dropped; no key holder is left to "
                    "decrypt the aggregate"
                )
            self.decryptor = int(present[0])
            self.view.add_bytes_down([self.decryptor], summed_bytes)
            self.view.add_bytes_up([self.decryptor], self._length * FLOAT_BYTES)
            self.view.public["ckks_decryptor"] = self.decryptor
        else:
            self.view.public["ckks_committee_bytes"] = [summed_bytes, self._length * FLOAT_BYTES]
        self.view.aggregate["summed_ciphertext_sha256"] = digests(summed)
        self._request = DecryptionRequest(self.round_id, self.decryptor, summed, self._length)
        return self._request

    def receive_decryption(self, values: np.ndarray) -> None:
        """The key holder's reply to :meth:`decryption_request`: the flooded, rounded sum.

        Raises:
            AggregationError: no request was made.
            ValueError: a reply of the wrong length, or with non-finite values.
        """
        if self._request is None:
            raise AggregationError(
                f"round {self.round_id}: no decryption was requested (call decryption_request)"
            )
        values = finite_array("the key holder's decryption", values)
        if values.shape != (self._length,):
            raise ValueError(
                f"the key holder returned {values.shape} values, the round sums {self._length}"
            )
        self._decrypted = values

    def _finish(self) -> Aggregate:
        request = self.decryption_request()
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        n_values = self.shape[0] * self.shape[1]
        if request is None:
            return Aggregate(np.zeros(self.shape), 0.0, contributors)
        values = self._decrypted
        if values is None:
            holder = self._transport.key_holder
            if holder is None:
                raise AggregationError(
                    f"round {self.round_id}: this server holds no secret key (CKKSTransport "
                    "built from the public context); send decryption_request() to a key holder "
                    "and pass its reply to receive_decryption() before result()"
                )
            start = time.perf_counter()
            noise = noise_source(self.seeds, *FLOOD_STREAM, self.round_id)
            values = holder.decrypt_aggregate(request.summed, request.length, noise)
            self.timer.add("decrypt", start)
        self._transport.add_timings(self.timings)
        weight = float(values[-1]) if self._weighted else float(len(contributors))
        return Aggregate(values[:n_values].reshape(self.shape), weight, contributors)

    def fold_into(self, state: EncryptedState) -> None:
        """Add this round's summed ciphertexts to ``state`` at the server; nothing is decrypted.

        After this, ``result()`` raises: the server never learns the aggregate.

        Raises:
            AggregationError: a weighted round, a shape other than the state's, or nothing to fold.
        """
        self._check_open()
        if self.server is None or self.server.empty:
            raise AggregationError(f"round {self.round_id} received no upload to fold")
        if self._weighted:
            raise AggregationError(
                "only unweighted rounds fold into an encrypted state (apply any weight and step "
                "size on the client side)"
            )
        state.add(self.server, self.shape)
        self._folded = True
        self.view.public["ckks_folded_into_state"] = True

    def error_bound(self) -> float:
        """A bound on ``|result - exact sum|`` per value (tests use it).

        The stated decryption-error bound of the sum (:func:`decryption_error_bound` for the
        round's contributors) plus the flooding's ``6 std`` (a 2^-26 two-sided Gaussian tail)
        and half a rounding step.
        """
        n = max(len(self.submitted), 1)
        flooding = self.config.flooding
        return (
            decryption_error_bound(self._transport.params, n)
            + 6 * flooding.std_for(self._transport.decryption_error)
            + flooding.step / 2
        )


# ----------------------------------------------------------------------------- encrypted state
def encrypt_state(keys: KeyHolder | SecretContext, initial: np.ndarray) -> list[Ciphertext]:
    """A key holder's encryption of the initial matrix of an :class:`EncryptedState`: checked
    to lie within half the parameters' largest value (room for the summed updates), packed
    row-major, ``slots`` values per ciphertext. The same in one process as on a Flower node.

    Raises:
        ValueError: not a matrix, or a value beyond the bound.
    """
    initial = np.asarray(initial, dtype=np.float64)
    if initial.ndim != 2:
        raise ValueError(f"the state must be a matrix, got shape {initial.shape}")
    check_bound(-1, initial.ravel(), keys.params.max_abs_value(0) / 2)
    return keys.encrypt(initial.ravel())


class EncryptedState:
    """A matrix that stays encrypted at the server: Chai et al.'s FedMF item matrix ``[[V]]``.

    In Chai et al. (2020, Sec. 3.2) the server never holds ``V`` in the clear: a key holder
    encrypts the initial matrix once; each round every participating user downloads ``[[V]]`` and
    decrypts it, computes its gradient, applies the step size itself and uploads
    ``[[-eta * g]]``; the server adds the uploads into ``[[V]]``. The server learns neither ``V``
    nor any aggregate. Same packing as the aggregation rounds (row-major, ``slots`` per
    ciphertext), so a round of the same shape folds in by ciphertext additions only
    (:meth:`CKKSRound.fold_into`).

    What it costs: every participant downloads the whole encrypted matrix every round (9
    ciphertexts, about 1.2 MB, for a 1682 x 21 block at degree 8192), and the sum of all
    updates must stay within the parameters' ``value_bound`` times ``max_clients`` headroom.

    Args:
        transport: the CKKS transport whose keys and server context to use.
        initial: the matrix, encrypted by a key holder.
    """

    def __init__(self, transport: CKKSTransport, initial: np.ndarray) -> None:
        if transport.config.key_model != "shared":
            raise ValueError(
                "an encrypted state needs the shared key model: every client decrypts it"
            )
        if transport.key_holder is None:
            raise ValueError(
                "an encrypted state is encrypted by a key holder; this transport holds only the "
                "public context: take the key holder's ciphertexts with "
                "EncryptedState.from_ciphertexts (securefed.flower asks a key-holder node)"
            )
        initial = np.asarray(initial, dtype=np.float64)
        self._start(transport, initial.shape)
        self._server.receive(encrypt_state(transport.key_holder, initial))

    def _start(self, transport: CKKSTransport, shape: tuple[int, int]) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self._transport = transport
        self._server = AggregatingServer(
            transport.server_context,
            chunk_count(self.shape[0] * self.shape[1], transport.server_context.data_slots),
        )
        self.updates = 0

    @classmethod
    def from_ciphertexts(
        cls, transport: CKKSTransport, ciphertexts: Sequence[Ciphertext], shape: tuple[int, int]
    ) -> EncryptedState:
        """``[[initial]]`` as a key holder encrypted it elsewhere (a node, on Flower).

        The server of a federation holds only the public context, and in the shared key model
        (symmetric encryption) it cannot encrypt: a key holder encrypts the initial matrix
        (packed row-major as :class:`EncryptedState` packs it) and the server keeps the
        ciphertexts. Nothing is decrypted here.

        Raises:
            ValueError: the committee key model, a shape that is not a matrix's, or a number of
                ciphertexts other than the packing of ``shape`` needs.
            ContextMismatchError: ciphertexts of another key.
        """
        if transport.config.key_model != "shared":
            raise ValueError(
                "an encrypted state needs the shared key model: every client decrypts it"
            )
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"the state must be a matrix, got shape {tuple(shape)}")
        state = cls.__new__(cls)
        state._start(transport, shape)
        if len(ciphertexts) != state._server.n_blocks:
            raise ValueError(
                f"a state of shape {state.shape} packs into {state._server.n_blocks} "
                f"ciphertexts, the key holder sent {len(ciphertexts)}"
            )
        state._server.receive(list(ciphertexts))
        return state

    @property
    def can_reveal(self) -> bool:
        """Whether this process holds the key (in one process); a federation's server does not."""
        return self._transport.key_holder is not None

    def ciphertexts(self) -> list[Ciphertext]:
        """What the server holds and sends: the serialized state."""
        return self._server.summed()

    def download(self, rnd: CKKSRound) -> np.ndarray:
        """Every client of ``rnd`` receives the ciphertexts (bytes down) and decrypts them.

        Returns the matrix as the clients see it. The view records the ciphertexts' digests in
        the round's broadcast (when the round keeps payloads), never the values.
        """
        self.send(rnd)
        return self.reveal()

    def send(self, rnd: CKKSRound) -> list[Ciphertext]:
        """The ciphertexts every client of ``rnd`` downloads, recorded in the round's view
        (bytes down; their digests in the broadcast when the round keeps payloads)."""
        envelopes = self.ciphertexts()
        rnd.view.add_bytes_down(rnd.clients, sum(c.nbytes for c in envelopes))
        rnd.view.record_broadcast("encrypted_state_sha256", digests(envelopes))
        return envelopes

    def to_arrays(self, name: str) -> dict[str, np.ndarray]:
        """The state as message arrays ``{name}.ct_*`` (:func:`ciphertexts_to_arrays`) and
        ``{name}.ct_shape``: what a federation's server broadcasts (:func:`state_from_arrays`)."""
        arrays = ciphertexts_to_arrays([self.ciphertexts()])
        arrays["ct_shape"] = np.array(self.shape, np.int64)
        return {f"{name}.{key}": value for key, value in arrays.items()}

    def add(self, server: AggregatingServer, shape: tuple[int, int]) -> None:
        """Add a round's summed ciphertexts (same shape, same packing) to the state."""
        if tuple(shape) != tuple(self.shape):
            raise AggregationError(f"a round of shape {shape} cannot fold into state {self.shape}")
        self._server.receive(server.summed())
        self.updates += 1

    def reveal(self) -> np.ndarray:
        """The key holders' decryption of the state (what a client sees; evaluation at the end).

        Raises:
            AggregationError: this process holds only the public context (a federation's
                server: the nodes decrypt what it sends them).
        """
        if not self.can_reveal:
            raise AggregationError(
                "the encrypted state cannot be revealed here: this transport holds only the "
                "public context (the key holders decrypt [[V]] on their own machines)"
            )
        values = self._transport.key_holder.decrypt_for_clients(self.ciphertexts())
        return values[: self.shape[0] * self.shape[1]].reshape(self.shape)


# ----------------------------------------------------------------------------- wire format
# Ciphertexts as arrays (Flower records, an encrypted state in a broadcast): one uint8 array of
# concatenated TenSEAL serializations with int64 offsets (sizes vary: SEAL compresses them).
def ciphertexts_to_arrays(per_client: Sequence[Sequence[Ciphertext]]) -> dict[str, np.ndarray]:
    """Every client's ciphertexts as ``ct_bytes`` (uint8), ``ct_offsets``, ``ct_lengths``,
    ``ct_counts`` (ciphertexts per client) and ``ct_key`` (the key id, as bytes)."""
    flat = [c for cts in per_client for c in cts]
    sizes = [c.nbytes for c in flat]
    key_ids = {c.key_id for c in flat}
    if len(key_ids) > 1:
        raise ContextMismatchError(f"ciphertexts of several keys in one message: {key_ids}")
    key_id = key_ids.pop() if key_ids else ""
    return {
        "ct_bytes": np.frombuffer(b"".join(c.data for c in flat), np.uint8).copy(),
        "ct_offsets": np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64),
        "ct_lengths": np.array([c.length for c in flat], np.int64),
        "ct_counts": np.array([len(cts) for cts in per_client], np.int64),
        "ct_key": np.frombuffer(key_id.encode(), np.uint8).copy(),
    }


def arrays_to_ciphertexts(arrays: Mapping[str, np.ndarray]) -> list[list[Ciphertext]]:
    """Rebuild :func:`ciphertexts_to_arrays` (one list per client).

    Raises:
        ValueError: a field is missing or the offsets and counts do not fit the bytes.
    """
    missing = [
        name
        for name in ("ct_bytes", "ct_offsets", "ct_lengths", "ct_counts", "ct_key")
        if name not in arrays
    ]
    if missing:
        raise ValueError(f"a CKKS message lacks {missing}")
    data = np.asarray(arrays["ct_bytes"], np.uint8).tobytes()
    offsets = np.asarray(arrays["ct_offsets"], np.int64)
    lengths = np.asarray(arrays["ct_lengths"], np.int64)
    counts = np.asarray(arrays["ct_counts"], np.int64)
    key_id = np.asarray(arrays["ct_key"], np.uint8).tobytes().decode()
    if (
        len(offsets) != len(lengths) + 1
        or counts.sum() != len(lengths)
        or offsets[0] != 0
        or offsets[-1] != len(data)
        or np.any(np.diff(offsets) <= 0)
    ):
        raise ValueError("the ciphertext offsets, lengths and counts do not fit the bytes")
    flat = [
        Ciphertext(key_id, data[int(offsets[j]) : int(offsets[j + 1])], int(lengths[j]))
        for j in range(len(lengths))
    ]
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [flat[int(starts[k]) : int(starts[k + 1])] for k in range(len(counts))]


def encrypted_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The names of the encrypted matrices among ``arrays`` (:meth:`EncryptedState.to_arrays`)."""
    return sorted(key[: -len(".ct_bytes")] for key in arrays if key.endswith(".ct_bytes"))


def state_from_arrays(
    arrays: Mapping[str, np.ndarray], name: str, secret: SecretContext
) -> np.ndarray:
    """A key holder's decryption of the matrix ``name`` of :meth:`EncryptedState.to_arrays`.

    What a client does with the downloaded ``[[V]]`` (Chai et al. 2020, Sec. 3.2): the values
    stay with the key holder.

    Raises:
        ValueError: missing fields, or ciphertexts that do not hold ``ct_shape``'s values.
        ContextMismatchError: ciphertexts of another key than ``secret``'s.
    """
    prefix = f"{name}."
    fields = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    if "ct_shape" not in fields:
        raise ValueError(f"the encrypted {name} lacks its ct_shape")
    shape = tuple(int(n) for n in np.asarray(fields["ct_shape"], np.int64))
    [ciphertexts] = arrays_to_ciphertexts(fields)
    if any(c.key_id != secret.key_id for c in ciphertexts):
        raise ContextMismatchError(
            f"the encrypted {name} is under another key than this key holder's ({secret.key_id})"
        )
    values = secret.decrypt(ciphertexts)
    if len(shape) != 2 or len(values) < shape[0] * shape[1]:
        raise ValueError(f"the encrypted {name} does not hold a matrix of shape {shape}")
    return values[: shape[0] * shape[1]].reshape(shape)


# ----------------------------------------------------------------------------- the transport
class CKKSTransport(Transport):
    """CKKS encryption behind the aggregation seam (TenSEAL).

    The transport object stands for the whole federation in one process, but keeps the roles
    apart: :attr:`server_context` (a PublicContext) is all the round's server object gets;
    :attr:`key_holder` holds the SecretContext; clients encrypt through :meth:`client_encrypt`
    (the shared secret key, or the public context in the committee model).

    Args:
        config: parameters (default :class:`CKKSConfig`).
        secret: the key holders' context (default: fresh keys for ``config``); it must use the
            encryption type of ``config.key_model``.
        public: instead of ``secret``, only the server's :class:`PublicContext`: the transport
            of a server whose key holders and clients run elsewhere (``securefed.flower``). It
            holds no secret key (:attr:`key_holder` is ``None``): the clients' ciphertexts
            arrive through :meth:`CKKSRound.receive_ciphertexts`, and a key holder answers
            :meth:`CKKSRound.decryption_request` via :meth:`CKKSRound.receive_decryption`.
        keep_payloads: rounds whose per-client payloads the view keeps.
        total_rounds: run length, to resolve ``RoundSelection(last=k)``.

    Example:
        >>> from securefed import SeedTree
        >>> transport = CKKSTransport()
        >>> rnd = transport.open_round(0, range(3), shape=(1, 2), seeds=SeedTree(0))
        >>> for c in range(3):
        ...     rnd.submit(c, np.array([0.5, -1.0]))
        >>> np.round(rnd.result().total, 3).tolist()
        [[1.5, -3.0]]
    """

    name = "ckks"

    def __init__(
        self,
        config: CKKSConfig | None = None,
        *,
        secret: SecretContext | None = None,
        public: PublicContext | None = None,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
    ) -> None:
        self.config = CKKSConfig() if config is None else config
        if secret is not None and public is not None:
            raise ValueError(
                "give the CKKS transport either the key holders' secret context or the "
                "server's public context, not both"
            )
        if public is not None:
            if not isinstance(public, PublicContext):
                raise TypeError(f"public must be a PublicContext, got {type(public).__name__}")
            keys: SecretContext | PublicContext = public
        else:
            keys = self.config.make_keys() if secret is None else secret
        if keys.params.encryption != self.config.encryption:
            raise ValueError(
                f"key_model {self.config.key_model!r} needs {self.config.encryption} encryption, "
                f"the given keys use {keys.params.encryption}"
            )
        self.params = keys.params
        # The bound of the keys actually used (given keys may differ from the config's choice).
        self.decryption_error = decryption_error_bound(self.params, self.config.max_clients)
        self.config.flooding.std_for(self.decryption_error)  # refuses a flooding below the floor
        self.key_holder: KeyHolder | None = None
        if isinstance(keys, SecretContext):
            self.key_holder = KeyHolder(keys, self.config.flooding, self.config.max_clients)
            self.server_context = keys.public()
        else:
            self.server_context = keys
        self._have_context: set[int] = set()
        self.timings = dict.fromkeys(STAGES, 0.0)
        super().__init__(keep_payloads=keep_payloads, total_rounds=total_rounds)

    def client_encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """What a client does with its packed update: the shared key, or the public context.

        Raises:
            AggregationError: the shared model on a server without the key (its clients encrypt
                on their own machines; see :meth:`CKKSRound.receive_ciphertexts`).
        """
        if self.config.key_model == "shared":
            if self.key_holder is None:
                raise AggregationError(
                    "this CKKS transport holds only the public context: in the shared key model "
                    "the clients encrypt with their own key on their machines and the server "
                    "takes their ciphertexts with CKKSRound.receive_ciphertexts"
                )
            return self.key_holder.encrypt(values)
        return self.server_context.encrypt(values)

    def clients_without_context(self, clients: np.ndarray) -> list[int]:
        """Clients that have not yet been sent the public context (and mark them as sent)."""
        fresh = [int(c) for c in clients if int(c) not in self._have_context]
        self._have_context.update(fresh)
        return fresh

    def add_timings(self, seconds: dict[str, float]) -> None:
        for stage, value in seconds.items():
            self.timings[stage] += value

    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> CKKSRound:
        """Start round ``round_id``.

        Raises:
            AggregationError: more clients than the parameters were sized for.
        """
        ids = np.unique(np.asarray(clients, dtype=np.int64))
        round_view = self.view.open(round_id, ids)
        # The flooding noise comes from ``seeds``: whoever knows a seed removes it and reads the
        # key-dependent decryption error, so every round says where its randomness came from
        # (the audit reads it, also for rounds driven outside ``run_rounds``).
        round_view.public["ckks_secure_randomness"] = bool(seeds.secure)
        return CKKSRound(round_id, ids, shape=shape, view=round_view, seeds=seeds, transport=self)

    def _round_class(self) -> type[AggregationRound]:
        return CKKSRound

    @property
    def capabilities(self) -> TransportCapabilities:
        """Dense ciphertexts on the wire; an encrypted state in the shared key model.

        Without the secret key (built from the public context: the server of a federation) the
        clients encrypt and a key holder decrypts elsewhere, so no in-process client can submit;
        an encrypted state (shared model) is then held from a key holder's ciphertexts
        (:meth:`encrypted_state_from`), never encrypted or revealed here.
        """
        here = self.key_holder is not None
        return TransportCapabilities(
            in_process_clients=here,
            # Without the key the state comes from a key holder's ciphertexts
            # (EncryptedState.from_ciphertexts): the server of a federation can still hold it.
            encrypted_state=self.config.key_model == "shared",
            dense_wire=True,
            server_sees="ciphertexts",
        )

    def encrypted_state(self, initial: np.ndarray) -> EncryptedState:
        """``[[initial]]`` at the server, encrypted by a key holder (:class:`EncryptedState`).

        Raises:
            ValueError: the committee key model, or a transport without the secret key.
        """
        return EncryptedState(self, initial)

    def encrypted_state_from(
        self, ciphertexts: Sequence[Ciphertext], shape: tuple[int, int]
    ) -> EncryptedState:
        """``[[V]]`` from a key holder's ciphertexts (:meth:`EncryptedState.from_ciphertexts`)."""
        return EncryptedState.from_ciphertexts(self, ciphertexts, shape)

    def public_parameters(self) -> dict[str, object]:
        context = self.server_context
        return {
            "transport": self.name,
            "protocol": "CKKS aggregation (Chai et al. 2020 key model), honest-but-curious server",
            # ckks_-prefixed, as securefed.audit reads them (ckks_poly_modulus_degree, ...).
            **{f"ckks_{key}": value for key, value in self.params.public().items()},
            **self.config.public(),
            "ckks_decryption_error": self.decryption_error,
            "key_id": context.key_id,
            "server_context_bytes": context.nbytes,
            "server_context_sha256": hashlib.sha256(context.serialized).hexdigest(),
        }
