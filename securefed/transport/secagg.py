"""Secure aggregation by pairwise masking: Bonawitz et al. (CCS 2017) with SecAgg+'s sparse graph.

The server learns the sum of the surviving clients' (weighted) updates and nothing else about any
single update, against an honest-but-curious server (and clients who do not collude with it beyond
the threshold). Every message of the protocol is really produced and consumed, with the real
cryptography (X25519, HKDF-SHA256, AES-GCM / ChaCha20-Poly1305, AES-256-CTR / ChaCha20 masks,
Shamir over GF(2^256 + 297)); the network is simulated in one process, or real across machines
with ``securefed.flower``.

Stages (Bonawitz et al. 2017, Fig. 4; Bell et al. 2020, Sec. 4) and where they run here:

0. Graph (:meth:`SecAggTransport.open_round`). From public randomness of the round every party
   derives the same random ``k``-regular neighbourhood graph (a Harary graph on a random relabelling
   of the clients; ``k`` defaults to ``ceil(2 log2 n)``; ``k = n - 1`` is the complete graph of the
   original protocol). Secrets are shared, and masks agreed, with neighbours only.
1. AdvertiseKeys (``open_round``). Each client makes two X25519 key pairs: ``c`` (to encrypt shares)
   and ``s`` (to agree on pairwise mask seeds); the server relays the public keys to the neighbours.
2. ShareKeys (``open_round``). Each client ``u`` draws a self-mask seed ``b_u``, Shamir-shares
   ``b_u`` and its ``s`` private key ``t``-out-of-``k`` among its neighbours, and seals
   ``share(b_u) || share(s_u)`` for neighbour ``v`` with an AEAD under
   ``HKDF(X25519(c_u, c_v), info = round, {u, v})`` and associated data ``(round, u, v)``. The
   server relays the ciphertexts (:attr:`SecAggRound.share_store`) and cannot read them.
3. MaskedInputCollection (``submit``/``submit_batch`` -> ``_accept``). Client ``u`` encodes
   ``w_u x_u`` (and ``w_u``) in fixed point and uploads, in Z_{2^bits},
   ``y_u = x_u + PRG(b_u) + sum_{v in N(u), v > u} PRG(s_uv) - sum_{v in N(u), v < u} PRG(s_uv)``
   with ``s_uv = HKDF(X25519(s_u, s_v), info = round, {u, v})``.
4. Unmasking (``result`` -> ``_finish``). The clients that submitted and are still there ("helpers")
   decrypt the shares they hold and, for each neighbour, reveal the share of ``b_u`` if ``u``
   submitted, or the share of ``s_u`` if it did not; never both. The server reconstructs the
   ``b_u`` of every contributor (a client that dropped *after* submitting is one) and the ``s_u`` of
   every non-contributor with a contributing neighbour, removes those masks, and decodes.

Refusals (no output, :class:`~securefed.errors.AggregationError` unless noted): a sum that could
wrap the modulus (:class:`~securefed.crypto.fixed_point.ModulusOverflowError`, at ``open_round``);
a threshold ``t <= k/2`` or ``t > k``, or ``k = 1`` on more than two clients
(:class:`~securefed.errors.InsecureParameterError`); a needed secret with fewer than ``t`` helpers
among its owner's neighbours; contributors whose part of the graph falls apart (the server would
learn each part's sum); a share that fails authentication (tampered, misrouted or replayed:
:class:`~securefed.crypto.keys.ShareDecryptionError`); NaN/inf, wrong lengths, weights above
``clip`` (``ValueError``). A refused round stays refused.

Not covered (see docs/secagg.md): the active-adversary variant (signatures and the
ConsistencyCheck round); a malicious server could lie about who dropped.

The clients' side of each stage is :class:`SecAggClient`; the server's side is
:class:`SecAggRound`, whose stage methods (``receive_keys``, ``share_request``/``receive_shares``,
``mask_request``/``receive_masked``, ``unmask_requests``/``receive_reveals``) are public so that
the same protocol runs across machines (``SecAggTransport(remote_clients=True)``; in one process the
round drives simulated clients through the same methods).

Randomness: with ``seeds.secure`` key pairs come from ``X25519PrivateKey.generate()`` and seeds,
Shamir coefficients, nonces and rounding keys from ``os.urandom``. Otherwise (seeded mode, for
tests and benchmarks only: every secret is reproducible from the run's seed) they come from
``seeds.key("secagg", round_id, client, ...)``.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from securefed.crypto import keys as kx
from securefed.crypto import prg as prg_mod
from securefed.crypto import shamir
from securefed.crypto.fixed_point import Encoder, FixedPoint
from securefed.errors import AggregationError, InsecureParameterError
from securefed.randomness import SeedTree
from securefed.transport.base import Aggregate, AggregationRound, RowUpdates, Transport
from securefed.views import NO_PAYLOADS, RoundSelection, RoundView

ID_BYTES = 8
"""Bytes counted for a client id inside a message (share recipients, survivor lists)."""

SHARE_PLAINTEXT_BYTES = 2 * shamir.SHARE_BYTES
SEALED_SHARE_BYTES = kx.encrypted_size(SHARE_PLAINTEXT_BYTES)
STAGES = ("key_agreement", "sharing", "encoding", "mask_expansion", "unmasking")


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class SecAggConfig:
    """Parameters of secure aggregation (all public).

    Attributes:
        bits: the ring Z_{2^bits}, 32 or 64; uploads cost ``bits / 8`` bytes per value.
        scale: fixed-point scale; resolution and per-client rounding error below ``1 / scale``.
        clip: update values (after weighting) are clipped to ``[-clip, clip]``; weights must lie in
            ``[0, clip]``.
        neighbours: SecAgg+ neighbourhood size ``k``; ``None`` is automatic: ``ceil(2 log2 n)``,
            raised when ``expected_dropout > 0`` to the smallest ``k`` that meets
            ``failure_target`` (:func:`neighbours_for_dropout`). Capped at ``n - 1`` (the
            complete graph: Bonawitz et al.); an odd ``k`` with an odd ``n`` is raised by one (a
            ``k``-regular graph needs ``n k`` even).
        threshold: Shamir threshold ``t``; ``None`` is ``floor(k / 2) + 1``. Must satisfy
            ``k / 2 < t <= k``.
        expected_dropout: fraction of a round's clients expected to drop (before or after
            submitting), used only by the automatic ``k``. Below 0.5: the threshold is a majority
            of each neighbourhood, so more than half of it must survive.
        failure_target: the automatic ``k`` keeps the union bound on the chance that a round
            cannot be unmasked (independent dropouts at ``expected_dropout``) below this.
        prg: mask PRG, ``"aes-256-ctr"`` or ``"chacha20"``.
        aead: share encryption, ``"aes-256-gcm"`` or ``"chacha20-poly1305"``.
    """

    bits: int = 32
    scale: float = 2.0**16
    clip: float = 1.0
    neighbours: int | None = None
    threshold: int | None = None
    prg: str = "aes-256-ctr"
    aead: str = "aes-256-gcm"
    expected_dropout: float = 0.0
    failure_target: float = 1e-3

    def __post_init__(self) -> None:
        FixedPoint(self.bits, self.scale, self.clip)  # validates bits, scale, clip
        if self.neighbours is not None and (
            isinstance(self.neighbours, bool) or self.neighbours < 1
        ):
            raise ValueError(f"neighbours must be >= 1 or None, got {self.neighbours!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or self.threshold < 1):
            raise ValueError(f"threshold must be >= 1 or None, got {self.threshold!r}")
        if self.prg not in prg_mod.PRG_NAMES:
            raise ValueError(f"prg must be one of {prg_mod.PRG_NAMES}, got {self.prg!r}")
        if self.aead not in kx.AEAD_NAMES:
            raise ValueError(f"aead must be one of {kx.AEAD_NAMES}, got {self.aead!r}")
        if not 0 <= self.expected_dropout < 0.5:
            raise ValueError(
                f"expected_dropout must lie in [0, 0.5), got {self.expected_dropout!r}: the "
                "threshold is a majority of each neighbourhood, so most neighbours must survive"
            )
        if not 0 < self.failure_target < 1:
            raise ValueError(f"failure_target must lie in (0, 1), got {self.failure_target!r}")

    @property
    def fixed_point(self) -> FixedPoint:
        return FixedPoint(self.bits, self.scale, self.clip)

    def round_parameters(self, n_clients: int) -> tuple[int, int]:
        """``(k, t)`` for a round of ``n_clients >= 2``, validated.

        Raises:
            InsecureParameterError: ``t <= k / 2`` (a minority of a neighbourhood could rebuild a
                mask), ``t > k`` (no secret could ever be rebuilt), or ``k = 1`` with more than two
                clients (the graph is a perfect matching: each pair's sum would leak).
        """
        requested = self.neighbours
        if requested is None and self.expected_dropout > 0:
            requested = neighbours_for_dropout(
                n_clients, self.expected_dropout, self.failure_target, threshold=self.threshold
            )
        k = effective_neighbours(n_clients, requested)
        if k < 2 and n_clients > 2:
            raise InsecureParameterError(
                f"{k} neighbour(s) per client on {n_clients} clients gives a disconnected graph: "
                "the server would learn the sum of each pair; use neighbours >= 2"
            )
        t = default_threshold(k) if self.threshold is None else self.threshold
        check_threshold(t, k)
        return k, t

    def public(self) -> dict[str, object]:
        """JSON-ready public parameters."""
        return {
            "bits": self.bits,
            "scale": self.scale,
            "clip": self.clip,
            "neighbours": "ceil(2 log2 n)" if self.neighbours is None else self.neighbours,
            "threshold": "floor(k/2)+1" if self.threshold is None else self.threshold,
            "expected_dropout": self.expected_dropout,
            "failure_target": self.failure_target,
            "prg": self.prg,
            "aead": self.aead,
            "key_agreement": "X25519",
            "kdf": "HKDF-SHA256",
            "shamir_field": "GF(2^256+297)",
        }


# ----------------------------------------------------------------------------- pure protocol math
def default_neighbours(n_clients: int) -> int:
    """SecAgg+'s ``k = ceil(2 log2 n)`` (Bell et al. 2020: O(log n) neighbours), capped at n - 1."""
    if n_clients < 2:
        return 0
    return min(n_clients - 1, math.ceil(2 * math.log2(n_clients)))


def effective_neighbours(n_clients: int, requested: int | None) -> int:
    """The degree of the round's regular graph: requested (or default), capped, made even if needed.

    A ``k``-regular graph on ``n`` vertices exists only when ``n k`` is even, so an odd ``k`` on an
    odd ``n`` becomes ``k + 1`` (still at most ``n - 1``).
    """
    k = default_neighbours(n_clients) if requested is None else min(requested, n_clients - 1)
    if k % 2 == 1 and n_clients % 2 == 1:
        k += 1
    return k


def default_threshold(k: int) -> int:
    """``floor(k / 2) + 1``: more than half of a neighbourhood."""
    return k // 2 + 1


def check_threshold(t: int, k: int) -> None:
    """Refuse a threshold outside ``(k / 2, k]``.

    Raises:
        InsecureParameterError: naming the bound that is violated.
    """
    if 2 * t <= k:
        raise InsecureParameterError(
            f"threshold {t} is at most half of the {k} neighbours: a minority of a client's "
            f"neighbourhood (or a server and {t} colluders) could rebuild its masks; "
            f"use t > {k / 2}"
        )
    if t > k:
        raise InsecureParameterError(
            f"threshold {t} exceeds the neighbourhood size {k}: no secret could ever be rebuilt"
        )


def binomial_cdf(m: int, k: int, p: float) -> float:
    """``P(Binomial(k, p) <= m)``, summed in log space (exact enough for k in the thousands)."""
    if m < 0:
        return 0.0
    if m >= k:
        return 1.0
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_choose = math.lgamma(k + 1)
    return min(
        1.0,
        sum(
            math.exp(
                log_choose
                - math.lgamma(i + 1)
                - math.lgamma(k - i + 1)
                + i * log_p
                + (k - i) * log_q
            )
            for i in range(m + 1)
        ),
    )


def unmasking_failure_bound(n_clients: int, k: int, t: int, dropout: float) -> float:
    """Union bound on the chance that some client's secret lacks ``t`` surviving neighbours.

    Each of the ``n`` secrets needs ``t`` of its owner's ``k`` neighbours to survive; with
    independent dropouts at rate ``dropout`` one fails with ``P(Binomial(k, 1 - dropout) < t)``
    (Bell et al. 2020 size SecAgg+'s graph by this kind of tail bound).
    """
    return min(1.0, n_clients * binomial_cdf(t - 1, k, 1.0 - dropout))


def neighbours_for_dropout(
    n_clients: int, dropout: float, target: float, *, threshold: int | None = None
) -> int:
    """The smallest ``k >= ceil(2 log2 n)`` whose unmasking failure bound is below ``target``.

    Returns ``n - 1`` (the complete graph, the most robust choice) when no smaller ``k`` does.
    """
    start = default_neighbours(n_clients)
    for requested in range(start, n_clients):
        k = effective_neighbours(n_clients, requested)
        t = default_threshold(k) if threshold is None else threshold
        if t <= k and unmasking_failure_bound(n_clients, k, t, dropout) <= target:
            return k
    return max(n_clients - 1, 0)


def graph_seed(round_id: int, clients: np.ndarray, public_randomness: bytes) -> bytes:
    """32 public bytes fixing the round's graph: SHA-256 of the round, its clients and a beacon."""
    digest = hashlib.sha256(kx.PROTOCOL_LABEL + b"graph/")
    digest.update(struct.pack(">q", round_id))
    digest.update(public_randomness)
    digest.update(np.asarray(clients, dtype=">i8").tobytes())
    return digest.digest()


def neighbour_graph(n_clients: int, k: int, seed: bytes) -> np.ndarray:
    """A random ``k``-regular symmetric graph: ``(n, k)`` neighbour positions, each row sorted.

    The Harary graph ``H(k, n)`` (ring position ``i`` joined to ``i +- 1 .. i +- floor(k/2)``, and
    to ``i + n/2`` when ``k`` is odd and ``n`` even) on a uniformly random relabelling of the
    clients drawn from ``seed``; symmetric by construction; the complete graph when ``k = n - 1``.
    """
    if n_clients < 2 or not 1 <= k <= n_clients - 1:
        raise ValueError(f"need 2 <= n and 1 <= k <= n - 1, got n={n_clients}, k={k}")
    if (n_clients * k) % 2:
        raise ValueError(f"no {k}-regular graph on {n_clients} vertices (n k must be even)")
    half = k // 2
    offsets = [d for step in range(1, half + 1) for d in (step, -step)]
    if k % 2:
        offsets.append(n_clients // 2)
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
    ring = rng.permutation(n_clients)  # ring[i]: the client position at ring slot i
    slot = np.empty(n_clients, np.int64)
    slot[ring] = np.arange(n_clients)
    neighbour_slots = (slot[:, None] + np.asarray(offsets)[None, :]) % n_clients
    return np.sort(ring[neighbour_slots], axis=1)


@dataclass(frozen=True)
class UnmaskingPlan:
    """Which secrets the server must rebuild, and what stands in the way (positions, not ids).

    Attributes:
        contributors: clients whose masked input arrived (their ``b_u`` is needed).
        helpers: contributors still present to reveal shares.
        dropped_with_masks: non-contributors with a contributing neighbour (their ``s_u`` is
            needed).
        shortfalls: ``(position, secret, helpers available)`` for each needed secret with fewer than
            ``t`` helpers among its owner's neighbours.
        components: connected components of the graph restricted to the contributors.
    """

    contributors: np.ndarray
    helpers: np.ndarray
    dropped_with_masks: np.ndarray
    shortfalls: list[tuple[int, str, int]]
    components: int


def plan_unmasking(
    neighbours: np.ndarray, contributed: np.ndarray, present: np.ndarray, threshold: int
) -> UnmaskingPlan:
    """Work out the unmasking stage from the graph, who submitted and who is still present."""
    contributed = np.asarray(contributed, bool)
    helper = contributed & np.asarray(present, bool)
    helpers_near = helper[neighbours].sum(axis=1)
    contributing_near = contributed[neighbours].sum(axis=1)
    need_self = contributed
    need_pair = ~contributed & (contributing_near > 0)
    short = (need_self | need_pair) & (helpers_near < threshold)
    shortfalls = [
        (int(p), "self-mask seed" if need_self[p] else "mask key", int(helpers_near[p]))
        for p in np.flatnonzero(short)
    ]
    members = np.flatnonzero(contributed)
    components = 0
    if len(members):
        index = np.full(len(contributed), -1)
        index[members] = np.arange(len(members))
        sub = neighbours[members]
        keep = contributed[sub]
        rows = np.repeat(np.arange(len(members)), sub.shape[1])[keep.ravel()]
        cols = index[sub[keep]]
        adjacency = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(members),) * 2)
        components = int(connected_components(adjacency, directed=False)[0])
    return UnmaskingPlan(
        members, np.flatnonzero(helper), np.flatnonzero(need_pair), shortfalls, components
    )


# ----------------------------------------------------------------------------- the clients' side
class _ClientRandomness:
    """A client's private randomness: the OS in secure mode, the seed tree in seeded mode."""

    def __init__(self, seeds: SeedTree, round_id: int, client: int) -> None:
        self.secure = bool(seeds.secure)
        self._seeds = seeds
        self._path = ("secagg", round_id, client)
        self._stream = (
            None if self.secure else prg_mod.KeystreamBytes(seeds.key(*self._path, "stream"))
        )

    def keypair(self, name: str) -> kx.KeyPair:
        if self.secure:
            return kx.generate_keypair()
        return kx.keypair_from_seed(self._seeds.key(*self._path, name))

    def secret(self, name: str) -> bytes:
        return os.urandom(32) if self.secure else self._seeds.key(*self._path, name)

    def randbytes(self, n: int) -> bytes:
        return os.urandom(n) if self.secure else self._stream(n)


@dataclass(eq=False)
class _Timer:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def add(self, stage: str, start: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - start
        return now


class _Workspace:
    """Scratch buffers of a round's masking (the simulated clients run one after another)."""

    def __init__(self, length: int, config: SecAggConfig) -> None:
        self.encoder = Encoder(config.fixed_point, length)
        self.uniform = prg_mod.UniformSource(length, prg=config.prg)
        self.expander = prg_mod.MaskExpander(length, bits=config.bits, prg=config.prg)


def masking_workspace(length: int, config: SecAggConfig) -> _Workspace:
    """Buffers for masking vectors of ``length`` ring elements (one per process is enough)."""
    return _Workspace(length, config)


@dataclass(frozen=True)
class ShareRequest:
    """What the server relays to a client for ShareKeys: its neighbours and their ``c`` keys.

    Attributes:
        neighbours: the neighbours' ids (public graph).
        xs: the Shamir evaluation points of the neighbours (position + 1, public).
        c_publics: each neighbour's advertised ``c`` public key.
        threshold: the Shamir threshold ``t``.
    """

    neighbours: tuple[int, ...]
    xs: tuple[int, ...]
    c_publics: tuple[bytes, ...]
    threshold: int


@dataclass(frozen=True)
class MaskRequest:
    """What the server relays to a client for MaskedInputCollection: the neighbours' ``s`` keys."""

    neighbours: tuple[int, ...]
    s_publics: tuple[bytes, ...]


@dataclass(frozen=True)
class UnmaskRequest:
    """What the server sends a surviving client for Unmasking.

    Attributes:
        inbox: ``sender -> sealed share`` addressed to this client (relayed at ShareKeys).
        contributors: the clients whose masked input arrived (their ``b``-shares are asked for;
            every other sender's ``s``-share is).
    """

    inbox: dict[int, bytes]
    contributors: frozenset[int]


SECRET_FIELDS = ("c", "s", "b", "share_peers", "share_keys")


class SecAggClient:
    """One client's side of a round: its secrets and one method per stage.

    In one process (:class:`SecAggTransport`) the round drives a ``SecAggClient`` per client; in a
    federation (``securefed.flower``) each node runs the ones of the users it hosts, one stage per
    message, keeping :meth:`export_secrets` in its local state between messages. The server never
    holds this object.

    Args:
        client: the client's id.
        round_id: the round.
        config: the protocol parameters.
        seeds: the run's seed tree (secure mode: keys and secrets come from the OS).
        secrets: restore a client that advertised (and perhaps shared) in an earlier message
            (:meth:`export_secrets`); ``None`` makes fresh key pairs (AdvertiseKeys).
    """

    def __init__(
        self,
        client: int,
        round_id: int,
        config: SecAggConfig,
        seeds: SeedTree,
        *,
        secrets: dict[str, bytes] | None = None,
    ) -> None:
        self.id = int(client)
        self.round_id = round_id
        self.config = config
        self.random = _ClientRandomness(seeds, round_id, self.id)
        self.share_keys: dict[int, bytes] = {}  # neighbour -> AEAD key (symmetric per pair)
        self.b = b""  # the self-mask seed, drawn at ShareKeys
        if secrets is None:
            self.c = self.random.keypair("c")
            self.s = self.random.keypair("s")
        else:
            self._restore(secrets)

    def _restore(self, secrets: dict[str, bytes]) -> None:
        unknown = set(secrets) - set(SECRET_FIELDS)
        if unknown or not {"c", "s"} <= set(secrets):
            raise ValueError(
                f"client {self.id}'s saved secrets must hold c and s (and optionally "
                f"{', '.join(SECRET_FIELDS[2:])}), got {sorted(secrets)}"
            )
        self.c = kx.keypair_from_seed(bytes(secrets["c"]))
        self.s = kx.keypair_from_seed(bytes(secrets["s"]))
        self.b = bytes(secrets.get("b", b""))
        peers = np.frombuffer(bytes(secrets.get("share_peers", b"")), dtype=">i8")
        keys = bytes(secrets.get("share_keys", b""))
        if len(keys) != len(peers) * kx.KEY_BYTES:
            raise ValueError(f"client {self.id}'s saved share keys do not match its peers")
        self.share_keys = {
            int(v): keys[i * kx.KEY_BYTES : (i + 1) * kx.KEY_BYTES] for i, v in enumerate(peers)
        }

    def export_secrets(self) -> dict[str, bytes]:
        """Everything a later stage needs, as bytes (keep it on the client's own machine)."""
        peers = list(self.share_keys)
        return {
            "c": self.c.private_bytes(),
            "s": self.s.private_bytes(),
            "b": self.b,
            "share_peers": np.asarray(peers, dtype=">i8").tobytes(),
            "share_keys": b"".join(self.share_keys[v] for v in peers),
        }

    # Stage 1
    def advertise(self) -> tuple[bytes, bytes]:
        """AdvertiseKeys: the ``c`` and ``s`` public keys."""
        return self.c.public, self.s.public

    # Stage 2
    def share(
        self,
        neighbours: Sequence[int],
        xs: Sequence[int],
        c_publics: Sequence[bytes],
        threshold: int,
        timer: _Timer | None = None,
    ) -> list[bytes]:
        """ShareKeys: Shamir-share ``b_u`` and ``s_u`` among ``neighbours``, one sealed share each.

        Returns:
            One sealed share per neighbour, in the order of ``neighbours``.
        """
        timer = _Timer() if timer is None else timer
        start = time.perf_counter()
        for v, public in zip(neighbours, c_publics, strict=True):
            self.share_keys[v] = kx.pair_key(
                self.c.private, public, kx.PURPOSE_SHARE_KEY, self.round_id, self.id, v
            )
        start = timer.add("key_agreement", start)
        self.b = self.random.secret("b")
        b_shares = shamir.split(shamir.secret_to_int(self.b), threshold, xs, self.random.randbytes)
        s_secret = shamir.secret_to_int(self.s.private_bytes())
        s_shares = shamir.split(s_secret, threshold, xs, self.random.randbytes)
        sealed = []
        for v, b_share, s_share in zip(neighbours, b_shares, s_shares, strict=True):
            plaintext = shamir.encode_share(b_share) + shamir.encode_share(s_share)
            aad = kx.share_aad(self.round_id, self.id, v)
            nonce = self.random.randbytes(kx.NONCE_BYTES)
            sealed.append(kx.seal(self.config.aead, self.share_keys[v], nonce, plaintext, aad))
        timer.add("sharing", start)
        return sealed

    # Stage 3
    def mask(
        self,
        values: np.ndarray,
        neighbours: Sequence[int],
        s_publics: Sequence[bytes],
        workspace: _Workspace,
        timer: _Timer | None = None,
    ) -> tuple[np.ndarray, int]:
        """MaskedInputCollection: ``y_u`` (a fresh ring vector) and the number of values clipped.

        Raises:
            AggregationError: if this client has not shared its keys (no self-mask seed yet).
        """
        if not self.b:
            raise AggregationError(
                f"client {self.id} has no self-mask seed: it must run ShareKeys before masking"
            )
        timer = _Timer() if timer is None else timer
        start = time.perf_counter()
        uniform = workspace.uniform.draw(self.random.secret("rounding"))
        masked, n_clipped = workspace.encoder.encode(values, uniform)
        start = timer.add("encoding", start)
        expander = workspace.expander
        expander.add(masked, self.b, domain=prg_mod.DOMAIN_SELF_MASK)
        start = timer.add("mask_expansion", start)
        for v, public in zip(neighbours, s_publics, strict=True):
            seed = kx.pair_key(
                self.s.private, public, kx.PURPOSE_PAIR_MASK, self.round_id, self.id, v
            )
            start = timer.add("key_agreement", start)
            expander.add(
                masked, seed, domain=prg_mod.DOMAIN_PAIR_MASK, sign=1 if v > self.id else -1
            )
            start = timer.add("mask_expansion", start)
        return masked, n_clipped

    # Stage 4
    def reveal(self, inbox: dict[int, bytes], contributors: set[int]) -> dict[int, tuple[str, int]]:
        """Open every share held, then reveal ``b``-shares of contributors, ``s``-shares of others.

        All ciphertexts are opened before anything is revealed, so a bad one aborts the client with
        nothing disclosed (Bonawitz et al. 2017, Fig. 4, Round 4).

        Raises:
            ShareDecryptionError: naming the sender, if a share fails authentication.
        """
        opened = {}
        for sender, blob in inbox.items():
            key = self.share_keys.get(sender)
            if key is None:
                raise kx.ShareDecryptionError(
                    f"client {self.id} received a share from {sender}, which is not its neighbour"
                )
            aad = kx.share_aad(self.round_id, sender, self.id)
            try:
                opened[sender] = kx.open_sealed(self.config.aead, key, blob, aad)
            except kx.ShareDecryptionError as error:
                raise kx.ShareDecryptionError(
                    f"round {self.round_id}: the share from client {sender} to client {self.id} "
                    "failed authentication (tampered, misrouted or replayed); refusing to unmask"
                ) from error
        revealed = {}
        for sender, plaintext in opened.items():
            if sender in contributors:
                revealed[sender] = ("b", shamir.decode_share(plaintext[: shamir.SHARE_BYTES]))
            else:
                revealed[sender] = ("s", shamir.decode_share(plaintext[shamir.SHARE_BYTES :]))
        return revealed


_Client = SecAggClient  # the name this module used before the class became public


def pack_values(block: np.ndarray, weight: float | None) -> np.ndarray:
    """What a client masks: ``w * block`` flattened, then ``w`` (weighted rounds)."""
    flat = np.asarray(block, dtype=np.float64).ravel()
    if weight is None:
        return flat
    values = np.empty(flat.size + 1)
    np.multiply(flat, weight, out=values[:-1])
    values[-1] = weight
    return values


def check_weights(updates: RowUpdates, clip: float) -> None:
    """Refuse a weight beyond the clip range (it could not be encoded without wrapping).

    Raises:
        ValueError: naming the client and its weight.
    """
    if updates.weights is None:
        return
    too_heavy = updates.weights > clip
    if too_heavy.any():
        k = int(np.flatnonzero(too_heavy)[0])
        raise ValueError(
            f"client {int(updates.clients[k])} has weight {updates.weights[k]} beyond the clip "
            f"range [0, {clip}]: it cannot be encoded without wrapping the sum"
        )


# ----------------------------------------------------------------------------- the round
class SecAggRound(AggregationRound):
    """One secure-aggregation round: the server's side of every stage (module docstring).

    With simulated clients (the default) opening the round runs AdvertiseKeys and ShareKeys for
    all its clients, ``submit`` masks a client's update and ``result`` unmasks, each client's side
    done by a :class:`SecAggClient` the round holds. With ``remote_clients=True`` the round holds
    no client: whoever carries the messages (``securefed.flower``) runs the clients elsewhere and
    feeds the server's stage methods, in order: :meth:`receive_keys`; :meth:`share_request` and
    :meth:`receive_shares` per client; :meth:`mask_request` and :meth:`receive_masked` per client
    (or :meth:`~AggregationRound.drop`); :meth:`unmask_requests` and :meth:`receive_reveals`;
    then :meth:`~AggregationRound.result`. Both modes run the same server code.

    Public, for tests and audits:

    Attributes:
        neighbours_k: the graph degree ``k`` of this round.
        threshold: the Shamir threshold ``t``.
        public_keys: ``client -> (c public, s public)`` as advertised.
        share_store: ``(sender, recipient) -> sealed share``: the ciphertexts the server relays.
            The server could alter or swap them; tests do, and the round must then refuse.
        clipped: ``client -> number of values clipped while encoding`` (client-side diagnostic,
            not something the server sees; simulated clients only).
        timings: seconds per stage (all clients and the server together).
    """

    def __init__(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        view: RoundView,
        seeds: SeedTree,
        config: SecAggConfig,
        remote_clients: bool = False,
    ) -> None:
        super().__init__(round_id, clients, shape=shape, view=view, seeds=seeds)
        self.config = config
        self.remote_clients = remote_clients
        self.fixed_point = config.fixed_point
        self.timer = _Timer()
        self.timings = self.timer.seconds
        self.clipped: dict[int, int] = {}
        self.public_keys: dict[int, tuple[bytes, bytes]] = {}
        self.share_store: dict[tuple[int, int], bytes] = {}
        self._ids = self.clients.tolist()
        self._failure: str | None = None
        self._weighted: bool | None = None
        self._sum: np.ndarray | None = None
        self._workspace: _Workspace | None = None
        self._reveals: dict[int, dict[int, tuple[str, int]]] | None = None
        self._shared: set[int] = set()
        n = len(self._ids)
        self._clients: dict[int, SecAggClient] = {}
        if n == 0:
            self.neighbours_k, self.threshold = 0, 0
            self._graph = np.zeros((0, 0), np.int64)
            return
        if n == 1:
            raise AggregationError("secure aggregation needs at least 2 clients in a round (got 1)")
        self.neighbours_k, self.threshold = config.round_parameters(n)
        seed = graph_seed(round_id, self.clients, seeds.key("secagg", "graph", round_id))
        self._graph = neighbour_graph(n, self.neighbours_k, seed)
        self.view.public.update(
            {
                "secagg_n": n,
                "secagg_k": self.neighbours_k,
                "secagg_t": self.threshold,
                "secagg_graph_seed": seed.hex(),
                "secagg_secure_randomness": bool(seeds.secure),
            }
        )
        if not remote_clients:
            self._advertise_keys(seeds)
            self._share_keys()

    @property
    def shared_clients(self) -> frozenset[int]:
        """The clients whose sealed shares arrived (only they may submit a masked input)."""
        return frozenset(self._shared)

    # -- public graph ---------------------------------------------------------------------
    def neighbours(self, client: int) -> np.ndarray:
        """The ids of ``client``'s neighbours (public)."""
        position = int(self.view.positions([client])[0])
        return self.clients[self._graph[position]]

    # -- stage 1 --------------------------------------------------------------------------
    def _advertise_keys(self, seeds: SeedTree) -> None:
        start = time.perf_counter()
        for client in self._ids:
            self._clients[client] = SecAggClient(client, self.round_id, self.config, seeds)
        self.timer.add("key_agreement", start)
        self.receive_keys({c: self._clients[c].advertise() for c in self._ids})

    def receive_keys(self, keys: Mapping[int, tuple[bytes, bytes]]) -> None:
        """AdvertiseKeys, server side: every client's ``(c public, s public)``; relayed to peers.

        Raises:
            AggregationError: a client of the round did not advertise (open the round with the
                clients that did), keys were already received, or two keys coincide.
            ValueError: a key of the wrong length, or a client outside the round.
        """
        self._check_usable()
        if self.public_keys:
            raise AggregationError(f"round {self.round_id} already received its public keys")
        self.view.positions(list(keys))
        missing = sorted(set(self._ids) - {int(c) for c in keys})
        if missing:
            raise AggregationError(
                f"round {self.round_id}: client(s) {missing[:5]} advertised no keys; a round must "
                "be opened with the clients that advertised (Bonawitz et al.'s U_1)"
            )
        for client in self._ids:
            c_public, s_public = keys[client]
            if len(c_public) != kx.PUBLIC_KEY_BYTES or len(s_public) != kx.PUBLIC_KEY_BYTES:
                raise ValueError(f"client {client} advertised a key that is not 32 bytes")
            self.public_keys[client] = (bytes(c_public), bytes(s_public))
        flat = [key for pair in self.public_keys.values() for key in pair]
        if len(set(flat)) != len(flat):
            raise AggregationError("two advertised public keys coincide; refusing the round")
        k = self.neighbours_k
        self.view.add_bytes_up(self.clients, 2 * kx.PUBLIC_KEY_BYTES)
        self.view.add_bytes_down(self.clients, k * (ID_BYTES + 2 * kx.PUBLIC_KEY_BYTES))
        for client, (c_public, s_public) in self.public_keys.items():
            self._record(client, c_public=_u8(c_public), s_public=_u8(s_public))

    # -- stage 2 --------------------------------------------------------------------------
    def _share_keys(self) -> None:
        for client in self._ids:
            request = self.share_request(client)
            sealed = self._clients[client].share(
                request.neighbours, request.xs, request.c_publics, request.threshold, self.timer
            )
            self.receive_shares(client, sealed)

    def share_request(self, client: int) -> ShareRequest:
        """ShareKeys, what the server sends ``client``: neighbours, their points and ``c`` keys."""
        if not self.public_keys:
            raise AggregationError(f"round {self.round_id}: no public keys received yet")
        positions = self._graph[int(self.view.positions([client])[0])]
        neighbours = tuple(self._ids[p] for p in positions)
        return ShareRequest(
            neighbours,
            tuple(int(p) + 1 for p in positions),  # Shamir x = position + 1 (public)
            tuple(self.public_keys[v][0] for v in neighbours),
            self.threshold,
        )

    def receive_shares(self, client: int, sealed: Sequence[bytes]) -> None:
        """ShareKeys, server side: ``client``'s sealed shares, one per neighbour, to relay.

        Raises:
            AggregationError: shares already received from ``client``.
            ValueError: not one share of the sealed size per neighbour.
        """
        self._check_usable()
        client = int(client)
        neighbours = self.neighbours(client).tolist()
        if client in self._shared:
            raise AggregationError(f"client {client} already sent its shares")
        if len(sealed) != len(neighbours) or any(len(b) != SEALED_SHARE_BYTES for b in sealed):
            raise ValueError(
                f"client {client} must send {len(neighbours)} sealed shares of "
                f"{SEALED_SHARE_BYTES} bytes (one per neighbour)"
            )
        for v, blob in zip(neighbours, sealed, strict=True):
            self.share_store[(client, v)] = bytes(blob)
        self._shared.add(client)
        self._record(
            client,
            shares_sent=np.frombuffer(b"".join(sealed), np.uint8),
            share_recipients=np.asarray(neighbours, np.int64),
        )
        per_client = self.neighbours_k * (ID_BYTES + SEALED_SHARE_BYTES)
        self.view.add_bytes_up([client], per_client)
        self.view.add_bytes_down([client], per_client)

    # -- stage 3 --------------------------------------------------------------------------
    def mask_request(self, client: int) -> MaskRequest:
        """MaskedInputCollection, what the server sends ``client``: its neighbours' ``s`` keys."""
        neighbours = tuple(self.neighbours(client).tolist())
        return MaskRequest(neighbours, tuple(self.public_keys[v][1] for v in neighbours))

    def _check_weighting(self, weighted: bool) -> None:
        if self._weighted is not None and self._weighted != weighted:
            raise ValueError(
                "every client of a secure-aggregation round must submit with a weight, or none "
                f"must (this round's first submission "
                f"{'had' if self._weighted else 'had no'} weight)"
            )

    def _start_masking(self, weighted: bool) -> int:
        """Fix the round's weighting at its first upload; return the masked vector's length."""
        self._check_weighting(weighted)
        self._weighted = weighted
        length = self.shape[0] * self.shape[1] + int(weighted)
        if self._sum is None:
            self._sum = np.zeros(length, self.fixed_point.dtype)
            self._workspace = _Workspace(length, self.config)
        return length

    def _add_masked(self, client: int, masked: np.ndarray) -> None:
        np.add(self._sum, masked, out=self._sum)  # the server's running sum of uploads
        self._record(client, masked=masked)

    def _accept(self, updates: RowUpdates) -> None:
        self._check_usable()
        if self.remote_clients:
            raise AggregationError(
                "this round's clients are remote: they mask their own updates and the server "
                "takes them with receive_masked(), never a plaintext submit"
            )
        weighted = updates.weights is not None
        self._check_weighting(weighted)
        check_weights(updates, self.config.clip)
        length = self._start_masking(weighted)
        weights = updates.client_weights()
        for k, client in enumerate(updates.clients.tolist()):
            values = pack_values(updates.client_block(k), weights[k] if weighted else None)
            request = self.mask_request(client)
            masked, n_clipped = self._clients[client].mask(
                values, request.neighbours, request.s_publics, self._workspace, self.timer
            )
            self.clipped[client] = n_clipped
            self._add_masked(client, masked)
        self.view.add_bytes_up(updates.clients, length * self.config.bits // 8)

    def receive_masked(self, client: int, masked: np.ndarray, *, weighted: bool) -> None:
        """MaskedInputCollection, server side: ``client``'s masked vector ``y_u`` (remote clients).

        Raises:
            AggregationError: the round is finished or refused, or ``client`` already submitted
                or dropped.
            ValueError: a vector of the wrong length or type, or mixed weighting.
        """
        self._check_open()
        self._check_usable()
        client = int(client)
        self.view.positions([client])
        if client in self.submitted:
            raise AggregationError(f"client(s) [{client}] already submitted in this round")
        if client in self.dropped:
            raise AggregationError(f"client(s) [{client}] dropped out and cannot submit")
        if client not in self._shared:
            raise AggregationError(
                f"client {client} sent no shares, so its masks cannot be removed"
            )
        length = self._start_masking(bool(weighted))
        masked = np.asarray(masked)
        if masked.shape != (length,) or masked.dtype != self.fixed_point.dtype:
            raise ValueError(
                f"client {client}'s masked input must be {length} values of "
                f"{self.fixed_point.dtype}, got shape {masked.shape} of {masked.dtype}"
            )
        self._add_masked(client, masked)
        self.submitted.add(client)
        self.view.add_bytes_up([client], length * self.config.bits // 8)

    # -- stage 4 --------------------------------------------------------------------------
    def _finish(self) -> Aggregate:
        self._check_usable()
        n_values = self.shape[0] * self.shape[1]
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        if len(contributors) == 0:
            return Aggregate(np.zeros(self.shape), 0.0, contributors)
        try:
            return self._unmask(contributors, n_values)
        except AggregationError as error:
            self._failure = str(error)
            raise

    def _plan(self, contributors: np.ndarray) -> UnmaskingPlan:
        contributed = np.isin(self.clients, contributors)
        present = ~np.isin(self.clients, np.asarray(sorted(self.dropped), np.int64))
        plan = plan_unmasking(self._graph, contributed, present, self.threshold)
        if plan.shortfalls:
            shown = ", ".join(
                f"client {self._ids[p]}'s {what} ({have} of {self.threshold} helpers)"
                for p, what, have in plan.shortfalls[:5]
            )
            raise AggregationError(
                f"round {self.round_id}: too many clients dropped to unmask: "
                f"{len(plan.shortfalls)} secret(s) lack the threshold of surviving neighbours, "
                f"e.g. {shown}; no result"
            )
        if plan.components > 1:
            raise AggregationError(
                f"round {self.round_id}: the contributors' neighbourhood graph split into "
                f"{plan.components} parts after dropouts; unmasking would reveal each part's sum, "
                "so the round is refused (raise neighbours or lower dropout)"
            )
        return plan

    def unmask_requests(self) -> dict[int, UnmaskRequest]:
        """Unmasking, what the server sends each surviving contributor ("helper").

        Raises:
            AggregationError: too few helpers for some needed secret, or the contributors' graph
                fell apart (the round is then refused for good).
            ShareDecryptionError: the server holds no share where one is needed.
        """
        self._check_usable()
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        if len(contributors) == 0:
            return {}
        try:
            plan = self._plan(contributors)
        except AggregationError as error:
            self._failure = str(error)
            raise
        contributor_set = frozenset(contributors.tolist())
        requests = {}
        for p in plan.helpers.tolist():
            v = self._ids[p]
            inbox = {}
            for u in self.neighbours(v).tolist():
                if (u, v) not in self.share_store:
                    raise kx.ShareDecryptionError(f"the server holds no share from {u} to {v}")
                inbox[u] = self.share_store[(u, v)]
            requests[v] = UnmaskRequest(inbox, contributor_set)
        return requests

    def receive_reveals(self, responses: Mapping[int, Mapping[int, tuple[str, int]]]) -> None:
        """Unmasking, server side: each helper's revealed shares, ``owner -> (kind, share)``.

        ``result()`` then rebuilds the secrets and removes the masks.
        """
        self._check_open()
        self._check_usable()
        self._reveals = {int(v): dict(r) for v, r in responses.items()}

    def _unmask(self, contributors: np.ndarray, n_values: int) -> Aggregate:
        start = time.perf_counter()
        plan = self._plan(contributors)
        contributor_set = set(contributors.tolist())
        if self._reveals is not None:
            responses = self._reveals
        elif self.remote_clients:
            raise AggregationError(
                f"round {self.round_id}: the helpers' revealed shares have not arrived; call "
                "unmask_requests() and receive_reveals() before result()"
            )
        else:
            # Every helper opens its whole inbox first (a bad share aborts with nothing revealed).
            responses = {
                v: self._clients[v].reveal(request.inbox, set(request.contributors))
                for v, request in self.unmask_requests().items()
            }
        helper_ids = {self._ids[p] for p in plan.helpers.tolist()}
        if set(responses) - helper_ids:
            raise AggregationError(
                f"round {self.round_id}: revealed shares came from non-helpers "
                f"{sorted(set(responses) - helper_ids)[:5]}"
            )
        # The server gathers the revealed shares: owner -> {kind: [(x, y), ...]}.
        gathered: dict[int, dict[str, list[tuple[int, int]]]] = {}
        for v, revealed in responses.items():
            x = int(self.view.positions([v])[0]) + 1
            for owner, (kind, value) in revealed.items():
                gathered.setdefault(owner, {}).setdefault(kind, []).append((x, value))
            n_contrib = sum(1 for u in revealed if u in contributor_set)
            self.view.add_bytes_down([v], n_contrib * ID_BYTES)
            self.view.add_bytes_up([v], len(revealed) * (ID_BYTES + shamir.SHARE_BYTES))
            self._record(
                v,
                unmask_owners=np.asarray(list(revealed), np.int64),
                unmask_shares=np.frombuffer(
                    b"".join(shamir.encode_share(val) for _, val in revealed.values()), np.uint8
                ),
            )
        total = self._sum.copy()
        expander = self._workspace.expander
        for u in contributors.tolist():
            b_u = self._rebuild(gathered, u, "b")
            self._record(u, revealed_self_seed=_u8(b_u))
            expander.add(total, b_u, domain=prg_mod.DOMAIN_SELF_MASK, sign=-1)
        for position in plan.dropped_with_masks.tolist():
            u = self._ids[position]
            s_u = self._rebuild(gathered, u, "s")
            if kx.public_from_private_bytes(s_u) != self.public_keys[u][1]:
                raise AggregationError(
                    f"client {u}'s rebuilt mask key does not match its advertised public key"
                )
            self._record(u, revealed_mask_key=_u8(s_u))
            private = kx.keypair_from_seed(s_u).private
            for v in self.clients[self._graph[position]].tolist():
                if v not in contributor_set:
                    continue
                seed = kx.pair_key(
                    private, self.public_keys[v][1], kx.PURPOSE_PAIR_MASK, self.round_id, u, v
                )
                # v added +PRG(s_uv) if u > v, else -PRG(s_uv): take it back out.
                expander.add(total, seed, domain=prg_mod.DOMAIN_PAIR_MASK, sign=-1 if u > v else 1)
        self.view.aggregate["ring_sum"] = total.copy()
        decoded = self.fixed_point.decode(total)
        self.timer.add("unmasking", start)
        weight = float(decoded[-1]) if self._weighted else float(len(contributors))
        return Aggregate(decoded[:n_values].reshape(self.shape), weight, contributors)

    def _rebuild(self, gathered: dict, owner: int, kind: str) -> bytes:
        points = gathered.get(owner, {}).get(kind, [])
        try:
            return shamir.int_to_secret(shamir.reconstruct(points, self.threshold))
        except ValueError as error:
            raise AggregationError(f"cannot rebuild client {owner}'s secret: {error}") from error

    # -- helpers --------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._failure is not None:
            raise AggregationError(f"round {self.round_id} was refused earlier: {self._failure}")

    def _record(self, client: int, **fields: np.ndarray) -> None:
        if self.view.keep_payloads:
            merged = dict(self.view.payloads.get(int(client), {}))
            merged.update(fields)
            self.view.record_payload(client, merged)

    def error_bound(self) -> float:
        """The documented bound on ``|result - true clipped sum|`` per coordinate (n / scale)."""
        return self.fixed_point.error_bound(len(self.submitted))


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8).copy()


# ----------------------------------------------------------------------------- the transport
class SecAggTransport(Transport):
    """Secure aggregation (SecAgg / SecAgg+) behind the aggregation seam.

    Args:
        config: protocol parameters (default :class:`SecAggConfig`).
        keep_payloads: rounds whose per-client payloads the view keeps (the masked vectors, the
            public keys, the relayed ciphertexts and the shares revealed at unmasking).
        total_rounds: run length, to resolve ``RoundSelection(last=k)``.
        remote_clients: the clients run elsewhere and talk to the server's stage methods through
            a message layer (``securefed.flower``); the rounds then hold no client secrets and
            refuse a plaintext ``submit`` (:class:`SecAggRound`).

    Example:
        >>> from securefed import SeedTree
        >>> transport = SecAggTransport(SecAggConfig(neighbours=4))
        >>> rnd = transport.open_round(0, range(6), shape=(1, 3), seeds=SeedTree(0))
        >>> for c in range(6):
        ...     rnd.submit(c, np.full(3, 0.25))
        >>> np.round(rnd.result().total, 3).tolist()
        [[1.5, 1.5, 1.5]]
    """

    name = "secagg"

    def __init__(
        self,
        config: SecAggConfig | None = None,
        *,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        remote_clients: bool = False,
    ) -> None:
        self.config = SecAggConfig() if config is None else config
        self.remote_clients = bool(remote_clients)
        super().__init__(keep_payloads=keep_payloads, total_rounds=total_rounds)

    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> SecAggRound:
        """Start a round: check the parameters for its clients, then AdvertiseKeys and ShareKeys.

        Raises:
            ModulusOverflowError: if the clients' sum could wrap the modulus.
            InsecureParameterError: for a threshold or neighbourhood that voids the guarantee.
            AggregationError: for a round of a single client.
        """
        ids = np.unique(np.asarray(clients, dtype=np.int64))
        if len(ids) == 1:
            raise AggregationError("secure aggregation needs at least 2 clients in a round (got 1)")
        if len(ids):
            self.config.fixed_point.check_clients(len(ids))
            self.config.round_parameters(len(ids))
        round_view = self.view.open(round_id, ids)
        return SecAggRound(
            round_id,
            ids,
            shape=shape,
            view=round_view,
            seeds=seeds,
            config=self.config,
            remote_clients=self.remote_clients,
        )

    def _round_class(self) -> type[AggregationRound]:
        return SecAggRound

    def public_parameters(self) -> dict[str, object]:
        return {
            "transport": self.name,
            "protocol": "SecAgg+ (Bell et al. 2020) over Bonawitz et al. 2017, honest-but-curious",
            **self.config.public(),
        }
