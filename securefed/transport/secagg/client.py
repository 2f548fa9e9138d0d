"""The clients' side of secure aggregation: one :class:`SecAggClient` per client and round.

A client holds its secrets (two X25519 key pairs, the self-mask seed ``b_u``, the pairwise share
keys) and has one method per stage of Bonawitz et al. (2017, Fig. 4):
:meth:`SecAggClient.advertise`, :meth:`~SecAggClient.share`, :meth:`~SecAggClient.mask` and
:meth:`~SecAggClient.reveal`. The
server's messages to it are :class:`ShareRequest`, :class:`MaskRequest` and
:class:`UnmaskRequest`. Its randomness comes from the operating system in secure mode and from
the run's seed tree in seeded mode (tests and benchmarks only).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from securefed.crypto import keys as kx
from securefed.crypto import prg as prg_mod
from securefed.crypto import shamir
from securefed.crypto.fixed_point import Encoder
from securefed.errors import AggregationError, InsecureParameterError
from securefed.randomness import SeedTree
from securefed.transport.secagg.config import SecAggConfig
from securefed.transport.secagg.signatures import (
    Authenticator,
    ClientAuthentication,
    ConsistencyError,
    KeyRegistry,
    SignatureError,
    SigningKey,
)

SHARE_PLAINTEXT_BYTES = 2 * shamir.SHARE_BYTES
SEALED_SHARE_BYTES = kx.encrypted_size(SHARE_PLAINTEXT_BYTES)
STAGES = (
    "key_agreement",
    "sharing",
    "encoding",
    "mask_expansion",
    "signatures",
    "unmasking",
    "setup",
)
"""Stages of a round's timings. ``signatures`` is the malicious variant's authentication
(Ed25519 or MACs); ``setup`` is what a deployment does once, not per round: the long-term keys,
the registry, and the static pairwise MAC keys agreed the first time two clients are neighbours."""


_STREAM_CHUNK = 4096
"""Bytes of a seeded client's keystream read ahead at a time: a round's draws of one client
(about 70 Shamir candidates of 33 bytes and its nonces at k = 20) in one keystream call."""


class _ClientRandomness:
    """A client's private randomness: the OS in secure mode, the seed tree in seeded mode.

    Seeded mode reads its keystream ahead in chunks of :data:`_STREAM_CHUNK` bytes and hands
    them out in order: the draws are the stream's successive bytes, the same bytes as one
    keystream call per draw (CTR mode; tests/test_secagg_floor_round6.py), with one call to
    the cipher a few thousand bytes instead of one per 33-byte Shamir candidate.
    """

    def __init__(self, seeds: SeedTree, round_id: int, client: int) -> None:
        self.secure = bool(seeds.secure)
        self._seeds = seeds
        self._path = ("secagg", round_id, client)
        self._stream = (
            None if self.secure else prg_mod.KeystreamBytes(seeds.key(*self._path, "stream"))
        )
        self._ahead = b""  # seeded mode: keystream bytes read ahead, not yet handed out
        self._at = 0

    def keypair(self, name: str) -> kx.KeyPair:
        if self.secure:
            return kx.generate_keypair()
        return kx.keypair_from_seed(self._seeds.key(*self._path, name))

    def secret(self, name: str) -> bytes:
        return os.urandom(32) if self.secure else self._seeds.key(*self._path, name)

    def randbytes(self, n: int) -> bytes:
        if self.secure:
            return os.urandom(n)
        if n < 0:
            raise ValueError("nbytes must be >= 0")
        at, stop = self._at, self._at + n
        if stop > len(self._ahead):
            self._ahead = self._ahead[at:] + self._stream(max(n, _STREAM_CHUNK))
            at, stop = 0, n
        self._at = stop
        return self._ahead[at:stop]


@dataclass(eq=False)
class _Timer:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def add(self, stage: str, start: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - start
        return now

    def move(self, seconds: float, source: str, target: str) -> None:
        """Count ``seconds`` already timed under ``source`` under ``target`` instead."""
        self.seconds[source] -= seconds
        self.seconds[target] += seconds


class _Workspace:
    """Scratch buffers of a round's masking (the simulated clients run one after another)."""

    def __init__(self, length: int, config: SecAggConfig) -> None:
        self.out_of_range = config.out_of_range
        self.clip = config.clip
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
        s_publics: each neighbour's advertised ``s`` public key (malicious-server variant: the
            client checks the authenticator on both keys before it uses either; empty otherwise).
        signatures: each neighbour's authenticator of its advertisement (malicious-server
            variant: its Ed25519 signature, or its MAC addressed to this client; empty
            otherwise).
        n_clients: the number of clients the server states for the round (``0``: not stated;
            the client then takes the largest Shamir point); the client checks ``k`` and ``t``
            against its own floor for it (:meth:`SecAggConfig.check_parameters`).
    """

    neighbours: tuple[int, ...]
    xs: tuple[int, ...]
    c_publics: tuple[bytes, ...]
    threshold: int
    s_publics: tuple[bytes, ...] = ()
    signatures: tuple[bytes, ...] = ()
    n_clients: int = 0


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
        signatures: malicious-server variant: ``neighbour -> its ConsistencyCheck
            authenticator`` of the survivor set (its signature, or its MAC addressed to this
            client; the client needs ``t`` valid ones on the set it signed itself).
    """

    inbox: dict[int, bytes]
    contributors: frozenset[int]
    signatures: dict[int, bytes] = field(default_factory=dict)


STAGE_NAMES = {
    "advertise": "AdvertiseKeys",
    "share": "ShareKeys",
    "mask": "MaskedInputCollection",
    "consistency": "ConsistencyCheck",
    "reveal": "Unmasking",
}
"""A client's stages in the order it answers them, once each (Bonawitz et al. 2017, Figs. 4 and 5;
ConsistencyCheck only in the malicious-server variant)."""

_ORDER = tuple(STAGE_NAMES)
_ORDER_HONEST_BUT_CURIOUS = tuple(stage for stage in _ORDER if stage != "consistency")

SECRET_FIELDS = (
    "c",
    "s",
    "b",
    "share_peers",
    "share_keys",
    "stage",
    "threshold",
    "peer_s_keys",
    "survivors",
    "min_contributors",
)


class SecAggClient:
    """One client's side of a round: its secrets and one method per stage.

    In one process (:class:`SecAggTransport`) the round drives a ``SecAggClient`` per client; in a
    federation (``securefed.flower``) each node runs the ones of the users it hosts, one stage per
    message, keeping :meth:`export_secrets` in its local state between messages. The server never
    holds this object.

    The client does not trust the server's requests (Bonawitz et al. 2017, Sec. 4 and Fig. 4): it
    answers each stage once and in order (:attr:`stage`, kept in :meth:`export_secrets`, so a
    restored client remembers), so it never reveals both kinds of share for one peer and never
    masks twice; it refuses a threshold outside ``(k/2, k]``, masking with fewer than ``t``
    neighbours or with one it did not share with, revealing unless ``t`` of its neighbours are
    among the contributors, and a low-order or malformed public key
    (:class:`~securefed.crypto.keys.InvalidPublicKeyError`). A refused request changes nothing.

    Args:
        client: the client's id.
        round_id: the round.
        config: the protocol parameters.
        seeds: the run's seed tree (secure mode: keys and secrets come from the OS).
        secrets: restore a client that advertised (and perhaps shared) in an earlier message
            (:meth:`export_secrets`); ``None`` makes fresh key pairs (AdvertiseKeys).
        signer: the client's long-term identity (Ed25519 and static X25519 keys;
            malicious-server variant only).
        registry: every client's long-term public keys, from set-up, not from the server
            (malicious-server variant only; it must hold ``signer``'s keys under this client's
            id).
        run: the run's nonce transcript, bound into every signature the client makes and
            checks (:mod:`securefed.flower.freshness`: on Flower a registry outlives a run);
            empty in one process, where a registry lives for one run.

    In the malicious-server variant (``config.server == "malicious"``, Bonawitz et al. 2017,
    Sec. 6) the client also signs its advertisement, checks its neighbours' signatures before it
    uses their keys (:class:`~securefed.transport.secagg.signatures.SignatureError`), signs the
    survivor set at ConsistencyCheck (:meth:`consistency`), and reveals nothing unless the
    survivor set at Unmasking is the one it signed and ``t`` of its neighbours signed it too
    (:class:`~securefed.transport.secagg.signatures.ConsistencyError`).

    Attributes:
        stage: the last stage answered (``""`` before AdvertiseKeys), a key of
            :data:`STAGE_NAMES`.
        threshold: the Shamir threshold accepted at ShareKeys (0 before).
    """

    def __init__(
        self,
        client: int,
        round_id: int,
        config: SecAggConfig,
        seeds: SeedTree,
        *,
        secrets: dict[str, bytes] | None = None,
        signer: SigningKey | None = None,
        registry: KeyRegistry | None = None,
        run: bytes = b"",
    ) -> None:
        self.id = int(client)
        self.round_id = round_id
        self.config = config
        self._check_signing(signer, registry)
        self.signer = signer
        self.registry = registry
        self.min_contributors = int(config.min_contributors)
        self.random = _ClientRandomness(seeds, round_id, self.id)
        self.auth = (
            ClientAuthentication(
                config.auth,
                self.id,
                round_id,
                signer,
                registry,
                min_contributors=self.min_contributors,
                graph_epoch=config.graph_epoch,
                epoch_keypair=lambda: self.random.keypair("epoch"),
                run=run,
            )
            if config.malicious
            else None
        )
        self._order = _ORDER if config.malicious else _ORDER_HONEST_BUT_CURIOUS
        self.peer_s_keys: dict[int, bytes] = {}  # neighbour -> its signed s key (malicious)
        self.survivors: frozenset[int] | None = None  # the set signed at ConsistencyCheck
        self.share_keys: dict[int, bytes] = {}  # neighbour -> AEAD key (symmetric per pair)
        self.b = b""  # the self-mask seed, drawn at ShareKeys
        self.stage = ""
        self.threshold = 0
        if secrets is None:
            self.c = self.random.keypair("c")
            self.s = self.random.keypair("s")
        else:
            self._restore(secrets)

    def _check_signing(self, signer: SigningKey | None, registry: KeyRegistry | None) -> None:
        if not self.config.malicious:
            if signer is not None or registry is not None:
                raise ValueError(
                    f"client {self.id}: a signing key and a key registry apply only to "
                    "server='malicious'; this round is honest-but-curious"
                )
            return
        if signer is None or registry is None:
            raise InsecureParameterError(
                f"client {self.id}: the malicious-server variant (server='malicious') needs the "
                "client's signing key and the key registry given at set-up; without them a server "
                "could relay its own keys as a neighbour's (use server='honest_but_curious' to "
                "run without signatures, against an honest-but-curious server only)"
            )

    def _restore(self, secrets: dict[str, bytes]) -> None:
        unknown = set(secrets) - set(SECRET_FIELDS)
        if unknown or not {"c", "s", "stage"} <= set(secrets):
            raise ValueError(
                f"client {self.id}'s saved secrets must hold c, s and stage (and optionally "
                f"{', '.join(f for f in SECRET_FIELDS if f not in ('c', 's', 'stage'))}), "
                f"got {sorted(secrets)}"
            )
        stage = bytes(secrets["stage"]).decode("ascii", errors="replace")
        if stage not in ("", *_ORDER):
            raise ValueError(f"client {self.id}'s saved stage {stage!r} is not a stage")
        self.stage = stage
        self.threshold = int.from_bytes(bytes(secrets.get("threshold", b"")), "big")
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
        s_keys = bytes(secrets.get("peer_s_keys", b""))
        if s_keys:
            if len(s_keys) != len(peers) * kx.PUBLIC_KEY_BYTES:
                raise ValueError(f"client {self.id}'s saved signed keys do not match its peers")
            self.peer_s_keys = {
                int(v): s_keys[i * kx.PUBLIC_KEY_BYTES : (i + 1) * kx.PUBLIC_KEY_BYTES]
                for i, v in enumerate(peers)
            }
        if stage in ("consistency", "reveal") and self.config.malicious:
            ids = np.frombuffer(bytes(secrets.get("survivors", b"")), dtype=">i8")
            self.survivors = frozenset(int(c) for c in ids)
        held = int.from_bytes(bytes(secrets.get("min_contributors", b"")), "big")
        if held > self.min_contributors and self.auth is not None:
            self.min_contributors = self.auth.min_contributors = held

    def export_secrets(self) -> dict[str, bytes]:
        """Everything a later stage needs, as bytes (keep it on the client's own machine)."""
        peers = list(self.share_keys)
        return {
            "c": self.c.private_bytes(),
            "s": self.s.private_bytes(),
            "b": self.b,
            "share_peers": np.asarray(peers, dtype=">i8").tobytes(),
            "share_keys": b"".join(self.share_keys[v] for v in peers),
            "stage": self.stage.encode("ascii"),
            "threshold": self.threshold.to_bytes(8, "big"),
            "peer_s_keys": b"".join(self.peer_s_keys.get(v, b"") for v in peers),
            "survivors": np.asarray(sorted(self.survivors or ()), dtype=">i8").tobytes(),
            "min_contributors": self.min_contributors.to_bytes(8, "big"),
        }

    def check_stage(self, stage: str) -> None:
        """Refuse ``stage`` (a key of ``STAGE_NAMES``) now, as answering it would: before the
        caller computes anything for it (``securefed.flower`` checks ``"mask"`` before its
        users train, so a server asking twice gets a refusal and the node's state stays).

        Raises:
            AggregationError: naming the stage.
        """
        self._check_stage(stage)

    def _check_stage(self, stage: str) -> None:
        """Refuse a stage that this client answered already, or whose predecessor it has not.

        Raises:
            AggregationError: naming the stage.
        """
        if stage not in self._order:
            raise AggregationError(
                f"client {self.id} runs the honest-but-curious variant: it has no "
                f"{STAGE_NAMES[stage]} stage (server='malicious' has)"
            )
        order = self._order
        wanted = order.index(stage)
        done = order.index(self.stage) + 1 if self.stage else 0
        if wanted < done:
            raise AggregationError(
                f"client {self.id} already answered {STAGE_NAMES[stage]} of round "
                f"{self.round_id} (its last answer was {STAGE_NAMES[self.stage]}): a client "
                "answers each stage once, so a server that asks again gets nothing"
            )
        if wanted > done:
            if stage == "mask":
                raise AggregationError(
                    f"client {self.id} has no self-mask seed: it must run ShareKeys before masking"
                )
            raise AggregationError(
                f"client {self.id} must answer {STAGE_NAMES[order[wanted - 1]]} before "
                f"{STAGE_NAMES[stage]} in round {self.round_id}"
            )

    # Stage 1
    def advertise(
        self, neighbours: Sequence[int] | None = None, timer: _Timer | None = None
    ) -> tuple[bytes, bytes] | tuple[bytes, bytes, Authenticator]:
        """AdvertiseKeys: the ``c`` and ``s`` public keys and, in the malicious-server variant,
        their authenticator bound to the round: the client's Ed25519 signature
        (:func:`~securefed.transport.secagg.signatures.advertisement_message`), or with
        ``auth="macs"`` a MAC for each of ``neighbours`` (``neighbour -> tag``).

        Args:
            neighbours: the neighbours the server announced (public graph); needed by MACs and
                by epoch sessions (``graph_epoch > 1`` with signatures: the first round of a
                session signs them, :class:`~securefed.transport.secagg.signatures.EpochSession`),
                unused otherwise.

        Raises:
            AggregationError: the client advertised already.
            SignatureError: (MACs) a neighbour outside the key registry.
        """
        self._check_stage("advertise")
        if not self.config.malicious:
            self.stage = "advertise"
            return self.c.public, self.s.public
        start = time.perf_counter()
        setup_before = self.auth.setup_seconds
        authenticator = self.auth.advertise(
            self.c.public, self.s.public, None if neighbours is None else list(neighbours)
        )
        if timer is not None:
            timer.add("signatures", start)
            timer.move(self.auth.setup_seconds - setup_before, "signatures", "setup")
        self.stage = "advertise"
        return self.c.public, self.s.public, authenticator

    def _check_advertisements(
        self,
        neighbours: Sequence[int],
        c_publics: Sequence[bytes],
        s_publics: Sequence[bytes],
        signatures: Sequence[bytes],
    ) -> dict[int, bytes]:
        """The neighbours' signed ``s`` keys, once every advertisement verifies (malicious).

        Raises:
            SignatureError: a neighbour outside the registry, or an advertisement whose
                signature does not verify (keys the server substituted, or another round's).
            ValueError: ``signatures`` given to an honest-but-curious client, or lengths that
                do not match the neighbours.
        """
        if not self.config.malicious:
            if s_publics or signatures:
                raise ValueError(
                    f"client {self.id} runs the honest-but-curious variant: signed "
                    "advertisements do not apply (server='malicious' checks them)"
                )
            return {}
        if len(s_publics) != len(neighbours) or len(signatures) != len(neighbours):
            raise SignatureError(
                f"client {self.id} got {len(neighbours)} neighbours but {len(s_publics)} s keys "
                f"and {len(signatures)} signed advertisements: each neighbour's keys must come "
                "with its signature; refusing"
            )
        signed = {}
        for v, c_public, s_public, signature in zip(
            neighbours, c_publics, s_publics, signatures, strict=True
        ):
            self.auth.check_advertisement(int(v), bytes(c_public), bytes(s_public), signature)
            signed[int(v)] = bytes(s_public)
        self.auth.confirm_advertisements(neighbours)
        return signed

    def _check_share_request(
        self,
        neighbours: Sequence[int],
        xs: Sequence[int],
        c_publics: Sequence[bytes],
        t: int,
        n_clients: int,
    ) -> None:
        k = len(neighbours)
        if k == 0 or len(set(neighbours)) != k or self.id in neighbours:
            raise AggregationError(
                f"client {self.id} must share with at least one neighbour, each a distinct other "
                f"client; the server sent {list(neighbours)[:8]}"
            )
        if len(xs) != k or len(c_publics) != k:
            raise ValueError(
                f"client {self.id} got {k} neighbours but {len(xs)} Shamir points and "
                f"{len(c_publics)} public keys"
            )
        n = max(int(n_clients), max(int(x) for x in xs), k + 1)
        self.config.check_parameters(n, k, int(t))
        if self.config.threshold is not None and t != self.config.threshold:
            raise InsecureParameterError(
                f"the server asks client {self.id} for a {t}-out-of-{k} sharing, but the "
                f"configured threshold is {self.config.threshold}"
            )

    # Stage 2
    def share(
        self,
        neighbours: Sequence[int],
        xs: Sequence[int],
        c_publics: Sequence[bytes],
        threshold: int,
        timer: _Timer | None = None,
        *,
        s_publics: Sequence[bytes] = (),
        signatures: Sequence[bytes] = (),
        n_clients: int = 0,
    ) -> list[bytes]:
        """ShareKeys: Shamir-share ``b_u`` and ``s_u`` among ``neighbours``, one sealed share each.

        In the malicious-server variant every neighbour's advertisement (``c`` and ``s`` key,
        ``s_publics``) must carry its valid signature (``signatures``) before any key is used.
        ``k = len(neighbours)`` and ``threshold`` must meet the client's own floor for a round
        of ``n_clients`` (the server's statement, at least the largest Shamir point; the
        colluder bound of :attr:`SecAggConfig.colluders`).

        Returns:
            One sealed share per neighbour, in the order of ``neighbours``.

        Raises:
            InsecureParameterError: a threshold ``t <= k/2`` (with ``t = 1`` each share is the
                secret itself) or ``t > k`` for the ``k`` neighbours, or other than configured;
                ``k`` or ``t`` below the client's colluder floor (naming the parameter).
            InvalidPublicKeyError: a neighbour's ``c`` key is malformed or of low order.
            AggregationError: the client shared already, or has not advertised; repeated
                neighbours, or itself among them.
            SignatureError: (malicious-server variant) an advertisement without a valid
                signature, or a neighbour outside the key registry.
        """
        self._check_stage("share")
        self._check_share_request(neighbours, xs, c_publics, threshold, n_clients)
        timer = _Timer() if timer is None else timer
        start = time.perf_counter()
        setup_before = self.auth.setup_seconds if self.auth is not None else 0.0
        peer_s_keys = self._check_advertisements(neighbours, c_publics, s_publics, signatures)
        start = timer.add("signatures", start)
        if self.auth is not None:
            timer.move(self.auth.setup_seconds - setup_before, "signatures", "setup")
        # Every neighbour's share key in one loop (kx.pair_keys: one X25519 and one HKDF each).
        keys = kx.pair_keys(
            self.c.private, c_publics, kx.PURPOSE_SHARE_KEY, self.round_id, self.id, neighbours
        )
        share_keys = dict(zip(neighbours, keys, strict=True))
        self.share_keys = share_keys
        self.peer_s_keys = peer_s_keys
        start = timer.add("key_agreement", start)
        self.b = self.random.secret("b")
        b_shares = shamir.split(shamir.secret_to_int(self.b), threshold, xs, self.random.randbytes)
        s_secret = shamir.secret_to_int(self.s.private_bytes())
        s_shares = shamir.split(s_secret, threshold, xs, self.random.randbytes)
        # Every neighbour's nonce in one draw: the bytes the draws one by one would give (one
        # keystream continued in seeded mode; fresh OS bytes in secure mode).
        nonces = self.random.randbytes(kx.NONCE_BYTES * len(neighbours))
        aead, sealed = self.config.aead, []
        for i, (v, b_share, s_share) in enumerate(zip(neighbours, b_shares, s_shares, strict=True)):
            plaintext = shamir.encode_share(b_share) + shamir.encode_share(s_share)
            aad = kx.share_aad(self.round_id, self.id, v)
            nonce = nonces[i * kx.NONCE_BYTES : (i + 1) * kx.NONCE_BYTES]
            sealed.append(kx.seal(aead, share_keys[v], nonce, plaintext, aad))
        timer.add("sharing", start)
        self.threshold = int(threshold)
        self.stage = "share"
        return sealed

    def _check_mask_request(self, neighbours: Sequence[int], s_publics: Sequence[bytes]) -> None:
        if len(neighbours) != len(s_publics):
            raise ValueError(
                f"client {self.id} got {len(neighbours)} neighbours but {len(s_publics)} keys"
            )
        strangers = sorted({int(v) for v in neighbours} - set(self.share_keys))
        if strangers:
            raise AggregationError(
                f"client {self.id} is asked to mask with client(s) {strangers[:5]}, with whom it "
                "did not share its keys: those masks could never be removed"
            )
        if len(set(neighbours)) != len(neighbours):
            raise AggregationError(f"client {self.id} is asked to mask with a neighbour twice")
        if self.config.malicious:
            swapped = [
                int(v)
                for v, public in zip(neighbours, s_publics, strict=True)
                if self.peer_s_keys.get(int(v)) != bytes(public)
            ]
            if swapped:
                raise SignatureError(
                    f"client {self.id} is asked to mask with s key(s) of client(s) {swapped[:5]} "
                    "other than the one(s) they signed at AdvertiseKeys; refusing"
                )
        if len(neighbours) < self.threshold:
            raise AggregationError(
                f"client {self.id} is asked to mask with {len(neighbours)} neighbour(s), fewer "
                f"than the threshold {self.threshold}: the server and those few could remove "
                "every mask; refusing (Bonawitz et al. 2017, Fig. 4, Round 2)"
            )

    # Stage 3
    def mask(
        self,
        values: np.ndarray,
        neighbours: Sequence[int],
        s_publics: Sequence[bytes],
        workspace: _Workspace,
        timer: _Timer | None = None,
        *,
        bounds: tuple[float, float] | None = None,
    ) -> tuple[np.ndarray, int]:
        """MaskedInputCollection: ``y_u`` (a fresh ring vector) and the number of values clipped.

        ``neighbours`` are those of the ShareKeys neighbours still in the round (at least ``t``).
        ``bounds``: ``(values.min(), values.max())`` if the caller read them already
        (:func:`encode_input`).

        Raises:
            AggregationError: this client has not shared its keys (no self-mask seed yet) or
                masked already (two masked inputs under one self mask reveal their difference);
                fewer than ``t`` neighbours, or one it did not share with.
            InvalidPublicKeyError: a neighbour's ``s`` key is malformed or of low order.
        """
        self._check_stage("mask")
        self._check_mask_request(neighbours, s_publics)
        timer = _Timer() if timer is None else timer
        start = time.perf_counter()
        masked, n_clipped = encode_input(
            values, self.random.secret("rounding"), workspace, owner=self.id, bounds=bounds
        )
        start = timer.add("encoding", start)
        self._add_masks(masked, neighbours, s_publics, workspace, timer, start)
        return masked, n_clipped

    def mask_encoded(
        self,
        encoded: np.ndarray,
        neighbours: Sequence[int],
        s_publics: Sequence[bytes],
        workspace: _Workspace,
    ) -> np.ndarray:
        """MaskedInputCollection for an input already in the ring: ``encoded`` plus the masks.

        For a party that uploads the sum of several clients' encoded inputs (a Flower node
        hosting many users: each user's values are clipped, weighted and encoded with its own
        rounding stream, :func:`encode_input`, and the node adds them in the ring). The same
        checks and the same masks as :meth:`mask`.

        Raises:
            AggregationError, InvalidPublicKeyError: as :meth:`mask`.
            ValueError: ``encoded`` is not a ring vector of the workspace's length.
        """
        self._check_stage("mask")
        self._check_mask_request(neighbours, s_publics)
        encoded = np.asarray(encoded)
        length = workspace.encoder.length
        if encoded.shape != (length,) or encoded.dtype != self.config.fixed_point.dtype:
            raise ValueError(
                f"client {self.id}'s encoded input must be {length} values of "
                f"{self.config.fixed_point.dtype}, got shape {encoded.shape} of {encoded.dtype}"
            )
        masked = encoded.copy()
        self._add_masks(masked, neighbours, s_publics, workspace, _Timer(), time.perf_counter())
        return masked

    def _add_masks(
        self,
        masked: np.ndarray,
        neighbours: Sequence[int],
        s_publics: Sequence[bytes],
        workspace: _Workspace,
        timer: _Timer,
        start: float,
    ) -> None:
        """Add the self mask and the pairwise masks to ``masked`` in place (stage 3)."""
        expander = workspace.expander
        expander.add(masked, self.b, domain=prg_mod.DOMAIN_SELF_MASK)
        start = timer.add("mask_expansion", start)
        # Every pairwise seed first (one loop of agreements, a bad key refused before any pairwise
        # mask), then the masks, in the neighbours' order: the same seeds and the same ring sum
        # as agreeing and expanding one neighbour at a time, with two timer reads, not 2k.
        seeds = kx.pair_keys(
            self.s.private, s_publics, kx.PURPOSE_PAIR_MASK, self.round_id, self.id, neighbours
        )
        start = timer.add("key_agreement", start)
        me, add, domain = self.id, expander.add, prg_mod.DOMAIN_PAIR_MASK
        for v, seed in zip(neighbours, seeds, strict=True):
            add(masked, seed, domain=domain, sign=1 if v > me else -1)
        timer.add("mask_expansion", start)
        self.stage = "mask"

    def _check_survivors(self, contributors: set[int] | frozenset[int]) -> None:
        if self.id not in contributors:
            raise AggregationError(
                f"client {self.id} uploaded its masked input, but the server's contributors of "
                f"round {self.round_id} omit it; refusing to unmask"
            )
        k = len(self.share_keys)
        surviving = len(contributors.intersection(self.share_keys))
        if surviving < self.threshold:
            raise AggregationError(
                f"client {self.id} is told that only {surviving} of its {k} neighbours "
                f"contributed, fewer than the threshold {self.threshold}: the shares it would "
                "reveal could unmask a small group; refusing (Bonawitz et al. 2017, Fig. 4, "
                "Round 4)"
            )

    # Stage 3.5 (malicious-server variant)
    def consistency(self, survivors: set[int] | frozenset[int]) -> Authenticator:
        """ConsistencyCheck (Bonawitz et al. 2017, Fig. 5, Round 3): sign the survivor set told.

        The client checks the set as it would at Unmasking (it is in it, and so are ``t`` of its
        neighbours), remembers it, and authenticates ``(round, survivors)``: one Ed25519
        signature (:func:`~securefed.transport.secagg.signatures.consistency_message`), or
        with ``auth="macs"`` one MAC for each of its neighbours in the set (``neighbour ->
        tag``). It answers once: signing two sets would let the server show each group of
        helpers the one it wants.

        Raises:
            AggregationError: not the malicious-server variant, answered already, not masked yet;
                the set omits the client or holds fewer than ``t`` of its neighbours.
        """
        self._check_stage("consistency")
        survivors = _survivor_set(survivors)
        self._check_survivors(survivors)
        if len(survivors) < self.min_contributors:
            raise ConsistencyError(
                f"client {self.id} is told a survivor set of {len(survivors)} client(s), fewer "
                f"than its own minimum of {self.min_contributors} contributors; it endorses "
                "nothing (issue 30 item 1)"
            )
        recipients = sorted(v for v in self.share_keys if v in survivors)
        authenticator = self.auth.endorse(survivors, recipients)
        self.survivors = survivors
        self.stage = "consistency"
        return authenticator

    def _check_consistency(
        self, contributors: frozenset[int], signatures: dict[int, bytes]
    ) -> None:
        """Refuse unless the set is the one signed and ``t`` neighbours signed it too (valid)."""
        if contributors is not self.survivors and contributors != self.survivors:
            added = sorted(contributors - self.survivors)[:5]
            removed = sorted(self.survivors - contributors)[:5]
            raise ConsistencyError(
                f"client {self.id} signed a survivor set at ConsistencyCheck, and is asked to "
                f"unmask another one (added {added}, removed {removed}); refusing"
            )
        # Beyond its neighbours a client takes endorsements only when it counts contributors.
        strangers = sorted(int(v) for v in signatures if int(v) not in self.share_keys)
        absent = sorted(int(v) for v in signatures if int(v) not in self.survivors)
        if (strangers and not self.min_contributors) or absent:
            raise ConsistencyError(
                f"client {self.id} got ConsistencyCheck signatures from client(s) "
                f"{(absent or strangers)[:5]}, which are not among its neighbours in the survivor "
                "set; refusing"
            )
        # In id order until t verify: t valid ones are the quorum (extra ones are not needed);
        # one that fails on the way refuses.
        near = sorted(v for v in signatures if v in self.share_keys)
        valid = self._count_endorsements(near, signatures, self.threshold)
        if valid < self.threshold:
            raise ConsistencyError(
                f"client {self.id} holds {valid} valid signature(s) of its neighbours on "
                f"the survivor set of round {self.round_id}, fewer than the threshold "
                f"{self.threshold}: the server may have told other clients another set; "
                "refusing to unmask (Bonawitz et al. 2017, Fig. 5, Round 4)"
            )
        if self.min_contributors:
            checked = set(near[:valid])
            others = sorted(v for v in signatures if v not in checked)
            valid += self._count_endorsements(others, signatures, self.min_contributors - valid)
            if valid < self.min_contributors:
                raise ConsistencyError(
                    f"client {self.id} holds {valid} valid endorsement(s) of the survivor set "
                    f"of round {self.round_id} (signed with its minimum of contributors), fewer "
                    f"than its own minimum of {self.min_contributors} contributors: the sum "
                    "could carry less noise than its share was calibrated for; refusing to "
                    "unmask (issue 30 item 1)"
                )

    def _count_endorsements(
        self, signers: Sequence[int], signatures: dict[int, bytes], needed: int
    ) -> int:
        """Verify ``signers``' endorsements of the survivor set in order until ``needed`` have;
        the count that verified (one that fails refuses: SignatureError)."""
        valid = 0
        for signer in signers:
            if valid >= needed:
                break
            self.auth.check_endorsement(signer, self.survivors, signatures[signer])
            valid += 1
        return valid

    def hold_min_contributors(self, minimum: int) -> None:
        """Raise this client's own minimum of contributors for the round (its DP layer: the
        count its distributed noise share is calibrated for), before it masks.

        Raises:
            InsecureParameterError: not the malicious variant with signatures (nothing could
                check the count), or a minimum below the configured one.
            AggregationError: the client masked already (its noise is fixed).
        """
        minimum = int(minimum)
        if not (
            self.config.malicious
            and self.config.auth == "signatures"
            and self.config.graph_epoch == 1
        ):
            raise InsecureParameterError(
                f"client {self.id}: a minimum of contributors needs server='malicious' with "
                "auth='signatures' and graph_epoch=1 (a client counts the contributors' "
                "signatures itself; an epoch session endorses survivor sets with MACs, which "
                "convince only their recipient)"
            )
        if minimum < self.config.min_contributors:
            raise InsecureParameterError(
                f"client {self.id}'s configured minimum of contributors is "
                f"{self.config.min_contributors}; it does not lower it to {minimum}"
            )
        if self.stage not in ("", "advertise", "share"):
            raise AggregationError(
                f"client {self.id} masked already: its minimum of contributors is fixed"
            )
        self.min_contributors = minimum
        self.auth.min_contributors = minimum

    # Stage 4
    def reveal(
        self,
        inbox: dict[int, bytes],
        contributors: set[int],
        signatures: dict[int, bytes] | None = None,
        timer: _Timer | None = None,
    ) -> dict[int, tuple[str, int]]:
        """Open every share held, then reveal ``b``-shares of contributors, ``s``-shares of others.

        All ciphertexts are opened before anything is revealed, so a bad one aborts the client with
        nothing disclosed (Bonawitz et al. 2017, Fig. 4, Round 4). The client answers once: for
        each peer it reveals the share of ``b`` or of ``s``, never both. In the malicious-server
        variant it first checks the ConsistencyCheck: ``contributors`` must be the set it signed,
        and ``signatures`` (``neighbour -> signature``) must hold at least ``t`` valid
        signatures of its neighbours on that same set, and no invalid one.

        Raises:
            ShareDecryptionError: naming the sender, if a share fails authentication.
            AggregationError: the client revealed already, or has not masked (or, malicious, not
                signed the survivor set); the contributors omit it, or hold fewer than ``t`` of
                its neighbours.
            ConsistencyError: (malicious) another set than the one signed, fewer than ``t``
                neighbours' signatures, or one from a client outside its neighbourhood.
            SignatureError: (malicious) a signature that does not verify on the set (a
                neighbour signed another set, or another round's, or it is forged).
            ValueError: signatures given to an honest-but-curious client.
        """
        self._check_stage("reveal")
        contributors = _survivor_set(contributors)
        signatures = {} if signatures is None else {int(v): bytes(s) for v, s in signatures.items()}
        if self.config.malicious:
            start = time.perf_counter()
            self._check_consistency(contributors, signatures)
            if timer is not None:
                timer.add("signatures", start)
        elif signatures:
            raise ValueError(
                f"client {self.id} runs the honest-but-curious variant: ConsistencyCheck "
                "signatures do not apply"
            )
        self._check_survivors(contributors)
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
        self.stage = "reveal"
        return revealed


def _survivor_set(clients: set[int] | frozenset[int]) -> frozenset[int]:
    """The ids as a frozenset of ints; a frozenset (the server's, shared by every helper) as is,
    so that a thousand helpers do not copy a thousand-client set each."""
    if isinstance(clients, frozenset):
        return clients
    return frozenset(int(c) for c in clients)


def rounding_key(seeds: SeedTree, round_id: int, client: int) -> bytes:
    """The 32-byte key of ``client``'s stochastic-rounding stream in ``round_id``.

    The key :meth:`SecAggClient.mask` draws: from the OS in secure mode, from
    ``seeds.key("secagg", round_id, client, "rounding")`` in seeded mode. A party that sums
    several clients' inputs encodes each with its own key, so that the ring sum is the one the
    clients would upload one by one.
    """
    return _ClientRandomness(seeds, round_id, client).secret("rounding")


def encode_input(
    values: np.ndarray,
    key: bytes,
    workspace: _Workspace,
    *,
    owner: int,
    bounds: tuple[float, float] | None = None,
) -> tuple[np.ndarray, int]:
    """Scale and round ``values`` stochastically (uniforms from ``key``) into the ring.

    A value outside ``[-clip, clip]`` is refused unless the round's configuration says to clip
    it (:attr:`SecAggConfig.out_of_range`): a silent clip would change the sum without a word.

    Args:
        owner: the client whose values these are (named in the refusal).
        bounds: ``(values.min(), values.max())`` if the caller computed them (the round's
            submit does, to refuse NaN before the round starts): not read twice
            (:meth:`Encoder.encode`; the same ring vector and count bit for bit).

    Returns:
        ``(ring vector, number of values clipped)``; the ring vector is a fresh array.

    Raises:
        ValueError: values outside the clip range under ``out_of_range="refuse"``.
    """
    # The whole vector's uniforms in one keystream call, then whole-vector passes: the same
    # arithmetic as the block by block pass (:meth:`Encoder.encode_blocks`, bit for bit), with
    # 11 numpy calls a vector instead of about 12 a block of 16,384 values; the calls' overhead
    # outweighed the cache they saved (benchmarks/results/secagg_floor/round4).
    ring, n_clipped = workspace.encoder.encode(values, workspace.uniform.draw(key), bounds=bounds)
    if n_clipped and workspace.out_of_range == "refuse":
        raise ValueError(
            f"client {owner}'s update has {n_clipped} value(s) outside [-clip, clip] = "
            f"[-{workspace.clip:g}, {workspace.clip:g}] (weights included): refused; raise the "
            "clip, or SecAggConfig(out_of_range='clip') to clip them (the view counts them)"
        )
    return ring, n_clipped


def pack_values(block: np.ndarray, weight: float | None) -> np.ndarray:
    """What a client masks: ``w * block`` flattened, then ``w`` (weighted rounds)."""
    flat = np.asarray(block, dtype=np.float64).ravel()
    if weight is None:
        return flat
    values = np.empty(flat.size + 1)
    np.multiply(flat, weight, out=values[:-1])
    values[-1] = weight
    return values
