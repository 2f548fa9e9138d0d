"""The server's side of a secure-aggregation round: :class:`SecAggRound`.

One method per stage of Bonawitz et al. (2017, Fig. 4) on the server: ``receive_keys``
(AdvertiseKeys), ``share_request``/``receive_shares`` (ShareKeys), ``mask_request``/
``receive_masked`` (MaskedInputCollection), ``unmask_requests``/``receive_reveals`` and
``result`` (Unmasking). The server takes no masked input once unmasking began, checks every
revealed share against the others (correcting and excluding a lying helper when spare shares
allow, else refusing and naming the helpers), and refuses an unmasked sum outside the range the
fixed point allows. With simulated clients the round drives one
:class:`~securefed.transport.secagg.client.SecAggClient` per client through the same methods;
with remote clients (``securefed.flower``) a message layer does.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from securefed._checks import finite_array
from securefed.crypto import keys as kx
from securefed.crypto import prg as prg_mod
from securefed.crypto import shamir
from securefed.crypto.fixed_point import from_ring, weighted_mean_error_bound
from securefed.errors import AggregationError
from securefed.randomness import SeedTree
from securefed.transport.base import Aggregate, AggregationRound, RowUpdates
from securefed.transport.secagg.client import (
    SEALED_SHARE_BYTES,
    MaskRequest,
    SecAggClient,
    ShareRequest,
    UnmaskRequest,
    _Timer,
    _Workspace,
    pack_values,
)
from securefed.transport.secagg.config import SecAggConfig
from securefed.transport.secagg.graph import (
    UnmaskingPlan,
    graph_seed,
    neighbour_graph,
    plan_unmasking,
)
from securefed.transport.secagg.signatures import (
    EPOCH_ADVERT_HEADER,
    MAC_BYTES,
    SIGNATURE_BYTES,
    KeyRegistry,
    SigningKey,
    advertisement_message,
)
from securefed.views import RoundView

ID_BYTES = 8
"""Bytes counted for a client id inside a message (share recipients, survivor lists)."""

_SECRET_NAMES = {"b": "self-mask seed", "s": "mask key"}
_SECRET_FIELDS = {"b": "revealed_self_seed", "s": "revealed_mask_key"}


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


def _client_block(updates: RowUpdates, k: int) -> np.ndarray:
    """The ``k``-th client's full block, read only: its values themselves (a view, no copy) when
    it sends every row in order (a dense submission), else :meth:`RowUpdates.client_block`."""
    rows, values = updates.client_rows(k)
    if len(rows) == updates.n_rows and np.array_equal(rows, np.arange(updates.n_rows)):
        return values
    return updates.client_block(k)


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
        config: the transport's configuration with this round's scale fixed
            (:meth:`SecAggConfig.for_round`); its clients encode with it.
        fixed_point: the round's codec (``config.fixed_point``).
        neighbours_k: the graph degree ``k`` of this round.
        threshold: the Shamir threshold ``t``.
        public_keys: ``client -> (c public, s public)`` as advertised.
        share_store: ``(sender, recipient) -> sealed share``: the ciphertexts the server relays.
            The server could alter or swap them; tests do, and the round must then refuse.
        clipped: ``client -> number of values clipped while encoding`` (client-side diagnostic,
            not something the server sees; simulated clients only).
        timings: seconds per stage (all clients and the server together).
        excluded_helpers: helpers whose revealed shares were found wrong and left out (spare
            shares corrected them; also ``view.aggregate["excluded_helpers"]``).

    Args (beyond the round's): ``inputs`` maps a client of the round to the number of clipped
    inputs its upload sums (a party of several clients, :meth:`among_parties`); the range check
    and the error bound count them. ``None``: one each. ``signers`` (simulated clients,
    malicious-server variant): each client's signing key, which the round hands to its simulated
    client only; ``registry``: the key registry from set-up, handed to the simulated clients and
    used by the server to refuse a forged advertisement early (the clients check again: the
    guarantee rests on their checks, not the server's). ``keep_masked``: in rounds that keep
    payloads, the view keeps each masked upload itself (``masked``, in the ring's width);
    otherwise (the default) its SHA-256 (``masked_sha256``): the masked integers are uniform to
    the server and as large as the model per client, so a kept round would cost the dense block
    once per client (docs/serverview.md, "What a view costs"). ``graph_draws``: the
    transport's ``(graph round, cohort digest) -> redraws`` of signed epoch sessions that broke
    (:meth:`_check_sessions`); a redrawn cohort's graph seed takes the count.

    Malicious-server variant (``config.server == "malicious"``): ``receive_keys`` takes
    ``(c public, s public, signature)``; ``share_request`` relays the neighbours' ``s`` keys and
    signatures; between MaskedInputCollection and Unmasking the server runs ConsistencyCheck
    (:meth:`consistency_requests`, :meth:`receive_consistency`) and :meth:`unmask_requests`
    forwards each helper its neighbours' signatures on the survivor set.
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
        inputs: Mapping[int, int] | None = None,
        signers: Mapping[int, SigningKey] | None = None,
        registry: KeyRegistry | None = None,
        setup_seconds: float = 0.0,
        keep_masked: bool = False,
        graph_draws: dict[tuple[int, bytes], int] | None = None,
    ) -> None:
        super().__init__(round_id, clients, shape=shape, view=view, seeds=seeds)
        self.config = config.for_round(len(self.clients))
        self.remote_clients = remote_clients
        self.keep_masked = bool(keep_masked)
        self.registry = registry
        self._signers = {} if signers is None else dict(signers)
        self.advert_signatures: dict[int, bytes] = {}
        self.survivors: frozenset[int] | None = None  # U_3 as the server sent it (malicious)
        self.consistency_signatures: dict[int, bytes] = {}
        # How many clipped inputs each client's upload sums (1 unless it is a party of several).
        self._inputs: dict[int, int] = (
            {} if inputs is None else {int(c): int(m) for c, m in inputs.items()}
        )
        self._party: SecAggRound | None = None
        self._members: dict[int, frozenset[int]] = {}
        self.fixed_point = self.config.fixed_point
        self._mean_bound: float | None = None  # a weighted round's, known once decoded
        self.timer = _Timer()
        self.timer.seconds["setup"] += float(setup_seconds)
        self.timings = self.timer.seconds
        self._macs = self.config.malicious and self.config.auth == "macs"
        # Signed epoch sessions (graph_epoch > 1 with signatures): MACs inside an epoch.
        self._epoch_signed = self.config.epoch_signed
        self._tagged = self._macs or self._epoch_signed
        self.clipped: dict[int, int] = {}
        self._clipped_total = 0
        self.public_keys: dict[int, tuple[bytes, bytes]] = {}
        self.share_store: dict[tuple[int, int], bytes] = {}
        self._ids = self.clients.tolist()
        self._position = {c: p for p, c in enumerate(self._ids)}
        self._planned: tuple[tuple[bytes, frozenset[int]], UnmaskingPlan] | None = None
        self._failure: str | None = None
        self._weighted: bool | None = None
        self._sum: np.ndarray | None = None
        self._workspace: _Workspace | None = None
        self._reveals: dict[int, dict[int, tuple[str, int]]] | None = None
        self._unmasking = False  # set when the helpers are first asked: no masked input after
        self.excluded_helpers: frozenset[int] = frozenset()
        self._shared: set[int] = set()
        self._neighbour_ids: dict[int, np.ndarray] = {}
        n = len(self._ids)
        self._clients: dict[int, SecAggClient] = {}
        if n == 0:
            self.neighbours_k, self.threshold = 0, 0
            self._graph = np.zeros((0, 0), np.int64)
            return
        if n == 1:
            raise AggregationError("secure aggregation needs at least 2 clients in a round (got 1)")
        self.neighbours_k, self.threshold = self.config.round_parameters(n)
        graph_round = self.config.graph_round(round_id)
        self._graph_draws = {} if graph_draws is None else graph_draws
        self._graph_key = (graph_round, hashlib.sha256(self.clients.tobytes()).digest())
        redrawn = self._graph_draws.get(self._graph_key, 0)
        beacon = seeds.key("secagg", "graph", graph_round)
        if redrawn:  # a signed epoch session broke: this cohort's graph is drawn again
            beacon += redrawn.to_bytes(8, "big")
        seed = graph_seed(graph_round, self.clients, beacon)
        self._graph = neighbour_graph(n, self.neighbours_k, seed)
        self.view.public.update(
            {
                "secagg_n": n,
                "secagg_k": self.neighbours_k,
                "secagg_t": self.threshold,
                "secagg_graph_seed": seed.hex(),
                "secagg_secure_randomness": bool(seeds.secure),
                "secagg_server": self.config.server,
                **self._precision(sum(self._inputs.values()) or n),
            }
        )
        if self.config.graph_epoch > 1:  # the graph of the epoch's first round, kept
            self.view.public["secagg_graph_round"] = graph_round
        if redrawn:
            self.view.public["secagg_graph_redrawn"] = redrawn
        if not remote_clients:
            self._advertise_keys(seeds)
            self._share_keys()

    def require_contributors(self, minimum: int) -> bool:
        """Hand every simulated client the minimum of contributors its own DP layer holds (the
        count its distributed noise share is calibrated for), before any masked input.

        In the malicious variant each client then endorses only survivor sets of at least that
        many clients, binds the minimum into its endorsement, and reveals nothing unless that
        many registered clients endorsed the same set with the same minimum (checked by the
        client: the server forwards every survivor's signature). In the honest-but-curious
        variant nothing is checked by the clients (the server is trusted to follow the
        protocol) and this returns ``False``.

        Returns:
            Whether the clients enforce the minimum.

        Raises:
            InsecureParameterError: MAC authentication (a MAC convinces only its recipient).
            AggregationError: a masked input arrived already.
        """
        if not self.config.malicious:
            return False
        if self.submitted or self._sum is not None:
            raise AggregationError(
                f"round {self.round_id}: the minimum of contributors is held before any masked "
                "input"
            )
        minimum = int(minimum)
        for client in self._clients.values():
            client.hold_min_contributors(minimum)
        self.config = replace(self.config, min_contributors=minimum)
        return True

    @property
    def shared_clients(self) -> frozenset[int]:
        """The clients whose sealed shares arrived (only they may submit a masked input)."""
        return frozenset(self._shared)

    # -- public graph ---------------------------------------------------------------------
    def neighbours(self, client: int) -> np.ndarray:
        """The ids of ``client``'s neighbours (public; a fresh array)."""
        client = int(client)
        return self._neighbours_of(client).copy()

    def _neighbours_of(self, client: int) -> np.ndarray:
        """``client``'s neighbours, the round's own cached array (never hand it out)."""
        cached = self._neighbour_ids.get(client)
        if cached is None:
            cached = self._neighbour_ids[client] = self.clients[
                self._graph[self._position_of(client)]
            ]
        return cached

    def _position_of(self, client: int) -> int:
        """``client``'s position in the round (``ValueError`` naming it when it is not in it)."""
        position = self._position.get(client)
        if position is None:
            return int(self.view.positions([client])[0])  # raises, naming the client
        return position

    def _add_bytes(self, client: int, up: int = 0, down: int = 0) -> None:
        """One client's bytes on the wire (the view's counters, without a lookup per call)."""
        position = self._position_of(client)
        self.view.bytes_up[position] += up
        self.view.bytes_down[position] += down

    # -- stage 1 --------------------------------------------------------------------------
    def _advertise_keys(self, seeds: SeedTree) -> None:
        start = time.perf_counter()
        malicious = self.config.malicious
        for client in self._ids:
            self._clients[client] = SecAggClient(
                client,
                self.round_id,
                self.config,
                seeds,
                signer=self._signers.get(client) if malicious else None,
                registry=self.registry if malicious else None,
            )
        self.timer.add("key_agreement", start)
        self.receive_keys(
            {
                c: self._clients[c].advertise(
                    self._neighbours_of(c).tolist() if self._tagged else None, self.timer
                )
                for c in self._ids
            }
        )

    def receive_keys(self, keys: Mapping[int, tuple[bytes, ...]]) -> None:
        """AdvertiseKeys, server side: every client's ``(c public, s public)``; relayed to peers.

        In the malicious-server variant each entry is ``(c public, s public, authenticator)``:
        a signature, or with ``auth="macs"`` a mapping ``neighbour -> MAC`` addressed to each of
        the client's neighbours. With a :attr:`registry` and signatures the server checks the
        signatures too (a client checks them again); a MAC only its recipient can check.

        Raises:
            AggregationError: a client of the round did not advertise (open the round with the
                clients that did), keys were already received, or two keys coincide.
            InvalidPublicKeyError: a key of the wrong length, not canonical, or of low order
                (naming the client; also a ``ValueError``).
            ValueError: a client outside the round.
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
        checked, signed = {}, {}
        arity = 3 if self.config.malicious else 2
        for client in self._ids:
            if len(keys[client]) != arity:
                raise AggregationError(
                    f"round {self.round_id}: client {client} advertised {len(keys[client])} "
                    f"items, but this {self.config.server} round takes {arity} (c key, s key"
                    f"{', signature' if arity == 3 else ''})"
                )
            c_public, s_public = keys[client][:2]
            checked[client] = (
                kx.check_public_key(c_public, owner=f"client {client}"),
                kx.check_public_key(s_public, owner=f"client {client}"),
            )
            if arity == 3:
                signed[client] = self._advert_authenticator(client, keys[client][2])
        if self.registry is not None and signed and self.remote_clients and not self._tagged:
            start = time.perf_counter()
            for client, signature in signed.items():
                message = advertisement_message(
                    self.round_id, client, *checked[client], registry=self.registry.digest
                )
                self.registry.verify(client, message, signature, what="advertisement")
            self.timer.add("signatures", start)
        if self._epoch_signed:
            self._check_sessions(signed)
        self.public_keys.update(checked)
        self.advert_signatures.update(signed)
        flat = [key for pair in self.public_keys.values() for key in pair]
        if len(set(flat)) != len(flat):
            raise AggregationError("two advertised public keys coincide; refusing the round")
        k = self.neighbours_k
        if self._tagged and not any(isinstance(a, bytes) for a in signed.values()):
            # k tags up (each with its recipient's id), one tag per neighbour down
            up, down = k * (ID_BYTES + MAC_BYTES), MAC_BYTES
        elif self._epoch_signed:  # an epoch session's first round: e, signature, k ids
            up = down = EPOCH_ADVERT_HEADER + k * ID_BYTES
        else:
            up = down = SIGNATURE_BYTES if signed else 0
        self.view.add_bytes_up(self.clients, 2 * kx.PUBLIC_KEY_BYTES + up)
        self.view.add_bytes_down(self.clients, k * (ID_BYTES + 2 * kx.PUBLIC_KEY_BYTES + down))
        if self.view.keep_payloads:
            for client, (c_public, s_public) in self.public_keys.items():
                self._record(client, c_public=_u8(c_public), s_public=_u8(s_public))
                if client in signed:
                    self._record(client, advert_signature=_u8(_wire(signed[client])))

    def _check_sessions(self, signed: Mapping[int, bytes | dict[int, bytes]]) -> None:
        """Signed epoch sessions: refuse a round where a client opens a session (a signed
        advertisement) while a neighbour continues one (MACs), and redraw this cohort's graph.

        That happens when a client missed its session's first ShareKeys (it dropped between
        AdvertiseKeys and ShareKeys) while its neighbours completed theirs: the pair holds no
        common key, and would refuse each other every round of the epoch. A new graph gives
        every client a new neighbourhood, so a new session (liveness only: the clients' checks
        do not depend on this; a server that skips it gets their refusals).

        Raises:
            AggregationError: naming a client whose session disagrees with a neighbour's.
        """
        opening = {c: isinstance(a, bytes) for c, a in signed.items()}
        for client, opens in opening.items():
            for v in self._neighbours_of(client).tolist():
                if opening.get(v, opens) != opens:
                    self._graph_draws[self._graph_key] = (
                        self._graph_draws.get(self._graph_key, 0) + 1
                    )
                    self._failure = (
                        f"round {self.round_id}: client {client} "
                        f"{'opens' if opens else 'continues'} an epoch session and its "
                        f"neighbour {v} {'continues' if opens else 'opens'} one (a client "
                        "missed its session's first ShareKeys): the pair shares no key"
                    )
                    raise AggregationError(
                        f"{self._failure}; refusing the round before any share, and this "
                        "cohort's next round in the epoch draws a new graph (new sessions)"
                    )

    def _advert_authenticator(self, client: int, authenticator) -> bytes | dict[int, bytes]:
        """A client's advertisement authenticator, checked for shape (its validity is for the
        clients to check): a signature, or (MACs) one tag per neighbour.

        Raises:
            AggregationError: MACs that are not one 32-byte tag for each neighbour.
        """
        if self._epoch_signed and isinstance(authenticator, bytes):
            k = len(self._neighbours_of(client))
            if len(authenticator) != EPOCH_ADVERT_HEADER + k * ID_BYTES:
                raise AggregationError(
                    f"round {self.round_id}: client {client}'s signed epoch advertisement must "
                    f"be {EPOCH_ADVERT_HEADER + k * ID_BYTES} bytes (epoch key, signature, "
                    f"{k} neighbour ids)"
                )
            return bytes(authenticator)
        if not self._tagged:
            return bytes(authenticator)
        if not isinstance(authenticator, Mapping):
            raise AggregationError(
                f"round {self.round_id}: client {client} must advertise one MAC per neighbour "
                "(auth='macs'), not a single signature"
            )
        tags = {int(v): bytes(tag) for v, tag in authenticator.items()}
        if set(tags) != set(self._neighbours_of(client).tolist()) or any(
            len(tag) != MAC_BYTES for tag in tags.values()
        ):
            raise AggregationError(
                f"round {self.round_id}: client {client}'s advertisement must carry one "
                f"{MAC_BYTES}-byte MAC for each of its neighbours"
            )
        return tags

    # -- stage 2 --------------------------------------------------------------------------
    def _share_keys(self) -> None:
        for client in self._ids:
            request = self.share_request(client)
            sealed = self._clients[client].share(
                request.neighbours,
                request.xs,
                request.c_publics,
                request.threshold,
                self.timer,
                s_publics=request.s_publics,
                signatures=request.signatures,
                n_clients=request.n_clients,
            )
            self.receive_shares(client, sealed)

    def share_request(self, client: int) -> ShareRequest:
        """ShareKeys, what the server sends ``client``: neighbours, their points and ``c`` keys."""
        if not self.public_keys:
            raise AggregationError(f"round {self.round_id}: no public keys received yet")
        client = int(client)
        positions = self._graph[self._position_of(client)]
        neighbours = tuple(self._ids[p] for p in positions)
        malicious = self.config.malicious
        return ShareRequest(
            neighbours,
            tuple(int(p) + 1 for p in positions),  # Shamir x = position + 1 (public)
            tuple(self.public_keys[v][0] for v in neighbours),
            self.threshold,
            s_publics=tuple(self.public_keys[v][1] for v in neighbours) if malicious else (),
            signatures=(
                tuple(self._advert_for(v, client) for v in neighbours) if malicious else ()
            ),
            n_clients=len(self._ids),
        )

    def _advert_for(self, sender: int, recipient: int) -> bytes:
        """What the server relays of ``sender``'s advertisement authenticator to ``recipient``."""
        authenticator = self.advert_signatures[sender]
        if isinstance(authenticator, dict):
            return authenticator.get(recipient, b"")
        return authenticator

    def receive_shares(self, client: int, sealed: Sequence[bytes]) -> None:
        """ShareKeys, server side: ``client``'s sealed shares, one per neighbour, to relay.

        Raises:
            AggregationError: shares already received from ``client``, or unmasking began.
            ValueError: not one share of the sealed size per neighbour.
        """
        self._check_usable()
        self._check_before_unmasking("shares")
        client = int(client)
        neighbours = self._neighbours_of(client).tolist()
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
        if self.view.keep_payloads:
            self._record(
                client,
                shares_sent=np.frombuffer(b"".join(sealed), np.uint8),
                share_recipients=np.asarray(neighbours, np.int64),
            )
        per_client = self.neighbours_k * (ID_BYTES + SEALED_SHARE_BYTES)
        self._add_bytes(client, per_client, per_client)

    # -- stage 3 --------------------------------------------------------------------------
    def mask_request(self, client: int) -> MaskRequest:
        """MaskedInputCollection, what the server sends ``client``: its neighbours' ``s`` keys."""
        neighbours = tuple(self._neighbours_of(int(client)).tolist())
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
        if not self.view.keep_payloads:
            return
        if self.keep_masked:
            self._record(client, masked=masked)
        else:
            self._record(client, masked_sha256=masked_digest(masked, self.config.bits))

    def submit(self, client: int, vector: np.ndarray, *, weight: float | None = None) -> None:
        """One simulated client's update (:meth:`AggregationRound.submit`), read once on entry.

        The generic path wraps the vector in a :class:`RowUpdates`, whose finiteness check (a
        sum) is the input's first read, and the encoder then reads its minimum and maximum.
        Here an unweighted vector of the round's length (an int client id) is read once for
        its minimum and maximum: NaN or an infinity makes one of them non-finite and is
        refused with the generic path's own error (:func:`finite_array`, naming the first
        offending position) before anything of the round changes; the encoder takes the two
        instead of reading them again. The same checks in the same order, the same errors,
        the same masked upload bit for bit (tests/test_secagg_floor_round6.py). Anything
        else (a weight, another shape, another kind of id) takes the generic path.
        """
        vector = np.asarray(vector, dtype=np.float64)
        n_values = self.shape[0] * self.shape[1]
        plain_id = isinstance(client, int | np.integer) and not isinstance(client, bool)
        if weight is not None or vector.shape != (n_values,) or not plain_id:
            super().submit(client, vector, weight=weight)
            return
        bounds = (vector.min(), vector.max())
        if not (np.isfinite(bounds[0]) and np.isfinite(bounds[1])):
            finite_array("update values", vector.reshape(self.shape))  # raises, as RowUpdates
        client = int(client)
        # AggregationRound.submit_batch's checks and errors, for one client.
        self._check_open()
        self._position_of(client)  # raises for a client outside the round
        if client in self.submitted:
            raise AggregationError(f"client(s) [{client}] already submitted in this round")
        if client in self.dropped:
            raise AggregationError(f"client(s) [{client}] dropped out and cannot submit")
        self._check_accepting(weighted=False)
        length = self._start_masking(False)
        self._mask_client(client, vector, bounds)
        self._after_masking()
        self._add_bytes(client, up=length * self.config.bits // 8)
        self.submitted.add(client)

    def _check_accepting(self, *, weighted: bool) -> None:
        """The round may take a plaintext submit of this weighting (simulated clients)."""
        self._check_usable()
        self._check_before_unmasking("masked input")
        if self.remote_clients:
            raise AggregationError(
                "this round's clients are remote: they mask their own updates and the server "
                "takes them with receive_masked(), never a plaintext submit"
            )
        self._check_weighting(weighted)

    def _mask_client(
        self, client: int, values: np.ndarray, bounds: tuple[float, float] | None = None
    ) -> None:
        """``client`` masks ``values`` (its simulated side); the upload joins the running sum."""
        request = self.mask_request(client)
        try:
            masked, n_clipped = self._clients[client].mask(
                values,
                request.neighbours,
                request.s_publics,
                self._workspace,
                self.timer,
                bounds=bounds,
            )
        except ValueError as error:  # out of range: the round is refused, not half-summed
            self._failure = str(error)
            raise
        self.clipped[client] = n_clipped
        self._clipped_total += n_clipped
        self._add_masked(client, masked)

    def _after_masking(self) -> None:
        if self.config.out_of_range == "clip":  # a running count, not a sum per submit (O(n^2))
            self.view.public["secagg_values_clipped"] = self._clipped_total

    def _accept(self, updates: RowUpdates) -> None:
        weighted = updates.weights is not None
        self._check_accepting(weighted=weighted)
        check_weights(updates, self.config.clip)
        length = self._start_masking(weighted)
        weights = updates.client_weights()
        for k, client in enumerate(updates.clients.tolist()):
            values = pack_values(_client_block(updates, k), weights[k] if weighted else None)
            self._mask_client(client, values)
        self._after_masking()
        if len(updates.clients) == 1:  # one submit (the simulation's): no position search
            self._add_bytes(int(updates.clients[0]), up=length * self.config.bits // 8)
        else:
            self.view.add_bytes_up(updates.clients, length * self.config.bits // 8)

    def receive_masked(self, client: int, masked: np.ndarray, *, weighted: bool) -> None:
        """MaskedInputCollection, server side: ``client``'s masked vector ``y_u`` (remote clients).

        Raises:
            AggregationError: the round is finished or refused, unmasking began (a late input
                would let a server that asked for its owner's mask key ask for its self mask
                next), or ``client`` already submitted or dropped.
            ValueError: a vector of the wrong length or type, or mixed weighting.
        """
        self._check_open()
        self._check_usable()
        self._check_before_unmasking("masked input")
        client = int(client)
        self._position_of(client)
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
        if self._party is not None:
            return self._finish_parties()
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
        # Planned once per state: ConsistencyCheck, the unmask requests and the unmasking ask
        # for the same plan (the graph's components are the costly part).
        state = (contributors.tobytes(), frozenset(self.dropped))
        if self._planned is not None and self._planned[0] == state:
            plan = self._planned[1]
        else:
            contributed = np.isin(self.clients, contributors)
            present = ~np.isin(self.clients, np.asarray(sorted(self.dropped), np.int64))
            plan = plan_unmasking(self._graph, contributed, present, self.threshold)
            self._planned = (state, plan)
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

    def _fix_contributors(self) -> tuple[np.ndarray, UnmaskingPlan | None]:
        """Fix the contributors (no masked input after this) and plan the unmasking."""
        self._check_usable()
        self._unmasking = True
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        if len(contributors) == 0:
            return contributors, None
        try:
            return contributors, self._plan(contributors)
        except AggregationError as error:
            self._failure = str(error)
            raise

    def consistency_requests(self) -> dict[int, frozenset[int]]:
        """ConsistencyCheck (malicious-server variant): the survivor set ``U_3`` for each helper.

        Fixes the contributors, like :meth:`unmask_requests` does in the honest-but-curious
        variant. Each helper signs the set (:meth:`SecAggClient.consistency`) and the server
        hands the signatures to :meth:`receive_consistency`.

        Raises:
            AggregationError: the honest-but-curious variant (no such round), asked twice, and
                whatever the unmasking plan refuses (too few helpers, a split graph).
        """
        if not self.config.malicious:
            raise AggregationError(
                f"round {self.round_id} is honest-but-curious: it has no ConsistencyCheck round"
            )
        if self.survivors is not None:
            raise AggregationError(f"round {self.round_id} already sent its survivor set")
        contributors, plan = self._fix_contributors()
        self.survivors = frozenset(contributors.tolist())
        if plan is None:
            return {}
        helpers = [self._ids[p] for p in plan.helpers.tolist()]
        self.view.add_bytes_down(helpers, len(contributors) * ID_BYTES)
        return {v: self.survivors for v in helpers}

    def receive_consistency(self, signatures: Mapping[int, bytes | Mapping[int, bytes]]) -> None:
        """ConsistencyCheck, server side: each helper's authenticator of the survivor set.

        A signature each, or with ``auth="macs"`` a mapping ``neighbour -> MAC`` addressed to
        each of the helper's neighbours in the set.

        Raises:
            AggregationError: before :meth:`consistency_requests`, twice, or from a non-helper.
            ValueError: a signature of the wrong size, or MACs that are not a mapping of
                32-byte tags addressed to the helper's neighbours.
        """
        self._check_usable()
        if self.survivors is None:
            raise AggregationError(
                f"round {self.round_id}: ConsistencyCheck signatures arrived before the "
                "survivor set was sent"
            )
        if self.consistency_signatures:
            raise AggregationError(
                f"round {self.round_id} already received its ConsistencyCheck signatures"
            )
        present = self.survivors - self.dropped
        strangers = sorted(set(int(v) for v in signatures) - present)
        if strangers:
            raise AggregationError(
                f"round {self.round_id}: ConsistencyCheck signatures from non-helpers "
                f"{strangers[:5]}"
            )
        received = {}
        for v, signature in signatures.items():
            v = int(v)
            if not self._tagged:
                if len(signature) != SIGNATURE_BYTES:
                    raise ValueError(f"client {v}'s signature must be {SIGNATURE_BYTES} bytes")
                received[v] = bytes(signature)
                self._add_bytes(v, up=SIGNATURE_BYTES)
                continue
            if not isinstance(signature, Mapping):
                raise ValueError(
                    f"client {v}'s ConsistencyCheck answer must be one MAC per neighbour "
                    "(auth='macs')"
                )
            tags = {int(u): bytes(tag) for u, tag in signature.items()}
            near = set(self._neighbours_of(v).tolist())
            if not set(tags) <= near or any(len(tag) != MAC_BYTES for tag in tags.values()):
                raise ValueError(
                    f"client {v}'s ConsistencyCheck MACs must be {MAC_BYTES}-byte tags addressed "
                    "to its neighbours"
                )
            received[v] = tags
            self._add_bytes(v, up=len(tags) * (ID_BYTES + MAC_BYTES))
        self.consistency_signatures = received

    def unmask_requests(self) -> dict[int, UnmaskRequest]:
        """Unmasking, what the server sends each surviving contributor ("helper").

        From the first call on the contributors are fixed: no masked input is taken after it.
        In the malicious-server variant the contributors were fixed at ConsistencyCheck, and each
        request carries the helper's neighbours' signatures on the survivor set.

        Raises:
            AggregationError: too few helpers for some needed secret, or the contributors' graph
                fell apart (the round is then refused for good); (malicious) no ConsistencyCheck
                signatures received yet.
            ShareDecryptionError: the server holds no share where one is needed.
        """
        if self.config.malicious:
            if self.survivors is None or not self.consistency_signatures:
                raise AggregationError(
                    f"round {self.round_id} runs the malicious-server variant: the helpers "
                    "unmask only after ConsistencyCheck (consistency_requests(), then "
                    "receive_consistency())"
                )
            self._check_usable()
            contributors = np.array(sorted(self.survivors), dtype=np.int64)
            plan = self._plan(contributors) if len(contributors) else None
        else:
            contributors, plan = self._fix_contributors()
        if plan is None:
            return {}
        contributor_set = (
            self.survivors if self.survivors is not None else frozenset(contributors.tolist())
        )
        wire = MAC_BYTES if self._tagged else SIGNATURE_BYTES
        requests = {}
        for p in plan.helpers.tolist():
            v = self._ids[p]
            near = self._neighbours_of(v).tolist()
            inbox = {}
            for u in near:
                if (u, v) not in self.share_store:
                    raise kx.ShareDecryptionError(f"the server holds no share from {u} to {v}")
                inbox[u] = self.share_store[(u, v)]
            signatures = {}
            for u in near:
                authenticator = self.consistency_signatures.get(u)
                if isinstance(authenticator, dict):
                    authenticator = authenticator.get(v)
                if authenticator is not None:
                    signatures[u] = authenticator
            if self.config.min_contributors:  # the helper counts the contributors itself
                signatures = {**self.consistency_signatures, **signatures}
            self._add_bytes(v, down=len(signatures) * (ID_BYTES + wire))
            requests[v] = UnmaskRequest(inbox, contributor_set, signatures)
        return requests

    def receive_reveals(self, responses: Mapping[int, Mapping[int, tuple[str, int]]]) -> None:
        """Unmasking, server side: each helper's revealed shares, ``owner -> (kind, share)``.

        ``result()`` then rebuilds the secrets (each checked against every share received) and
        removes the masks.

        Raises:
            AggregationError: shares already received, or unmask_requests() not called.
        """
        self._check_open()
        self._check_usable()
        if self._reveals is not None:
            raise AggregationError(f"round {self.round_id} already received the helpers' shares")
        if not self._unmasking:
            raise AggregationError(
                f"round {self.round_id}: revealed shares arrived before unmask_requests()"
            )
        self._reveals = {int(v): dict(r) for v, r in responses.items()}

    def _unmask(self, contributors: np.ndarray, n_values: int) -> Aggregate:
        simulated = self._reveals is None and not self.remote_clients
        if simulated and self.config.malicious:
            self._run_consistency_check()
        start = time.perf_counter()
        signatures_before = self.timings["signatures"]
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
                v: self._clients[v].reveal(
                    request.inbox, request.contributors, request.signatures, self.timer
                )
                for v, request in self.unmask_requests().items()
            }
        gathered = self._gather(responses, plan, contributor_set)
        needed = [(u, "b") for u in contributors.tolist()]
        needed += [(self._ids[p], "s") for p in plan.dropped_with_masks.tolist()]
        secrets = self._rebuild_secrets(gathered, needed)
        for (u, kind), secret in secrets.items():
            self._record(u, **{_SECRET_FIELDS[kind]: _u8(secret)})
        total = self._sum.copy()
        expander = self._workspace.expander
        for u in contributors.tolist():
            expander.add(total, secrets[(u, "b")], domain=prg_mod.DOMAIN_SELF_MASK, sign=-1)
        for position in plan.dropped_with_masks.tolist():
            u = self._ids[position]
            private = kx.keypair_from_seed(secrets[(u, "s")]).private
            near = [v for v in self.clients[self._graph[position]].tolist() if v in contributor_set]
            publics = [self.public_keys[v][1] for v in near]
            seeds = kx.pair_keys(private, publics, kx.PURPOSE_PAIR_MASK, self.round_id, u, near)
            for v, seed in zip(near, seeds, strict=True):
                # v added +PRG(s_uv) if u > v, else -PRG(s_uv): take it back out.
                expander.add(total, seed, domain=prg_mod.DOMAIN_PAIR_MASK, sign=-1 if u > v else 1)
        self._check_range(total, len(contributors), gathered, needed)
        if self.excluded_helpers:
            self.view.aggregate["excluded_helpers"] = np.array(
                sorted(self.excluded_helpers), np.int64
            )
        self.view.aggregate["ring_sum"] = total.copy()
        decoded = self.fixed_point.decode(total)
        self.timer.add("unmasking", start)
        # The helpers' checks of the ConsistencyCheck signatures are counted as "signatures".
        self.timings["unmasking"] -= self.timings["signatures"] - signatures_before
        weight = float(decoded[-1]) if self._weighted else float(len(contributors))
        values = decoded[:n_values]
        n_inputs = sum(self._inputs.get(int(c), 1) for c in contributors)
        if self._weighted:
            largest = float(np.max(np.abs(values)) / weight) if weight > 0 and n_values else 0.0
            self._mean_bound = weighted_mean_error_bound(
                self.fixed_point.error_bound(n_inputs), weight, largest
            )
        self.view.public.update(self._precision(n_inputs))
        return Aggregate(values.reshape(self.shape), weight, contributors)

    def _run_consistency_check(self) -> None:
        """ConsistencyCheck with the simulated helpers (timed as ``signatures``)."""
        start = time.perf_counter()
        requests = self.consistency_requests()
        self.receive_consistency(
            {v: self._clients[v].consistency(survivors) for v, survivors in requests.items()}
        )
        self.timer.add("signatures", start)

    def _gather(
        self,
        responses: Mapping[int, Mapping[int, tuple[str, int]]],
        plan: UnmaskingPlan,
        contributor_set: set[int],
    ) -> dict[int, dict[str, list[tuple[int, int]]]]:
        """The revealed shares by owner and kind, ``owner -> {kind: [(x, y), ...]}`` (recorded).

        Raises:
            AggregationError: a response from a non-helper, for a client that is not the helper's
                neighbour, or of the wrong kind (``b`` for contributors, ``s`` for the others).
        """
        helper_ids = {self._ids[p] for p in plan.helpers.tolist()}
        keep = self.view.keep_payloads
        if set(responses) - helper_ids:
            raise AggregationError(
                f"round {self.round_id}: revealed shares came from non-helpers "
                f"{sorted(set(responses) - helper_ids)[:5]}"
            )
        gathered: dict[int, dict[str, list[tuple[int, int]]]] = {}
        for v, revealed in responses.items():
            neighbours = set(self._neighbours_of(v).tolist())
            for owner, (kind, _) in revealed.items():
                expected = "b" if owner in contributor_set else "s"
                if owner not in neighbours or kind != expected:
                    raise AggregationError(
                        f"round {self.round_id}: helper {v} revealed a {kind!r} share of client "
                        f"{owner}, which it cannot hold or was not asked for; no result"
                    )
            x = self._position_of(v) + 1
            for owner, (kind, value) in revealed.items():
                gathered.setdefault(owner, {}).setdefault(kind, []).append((x, value))
            n_contrib = sum(1 for u in revealed if u in contributor_set)
            self._add_bytes(
                v, up=len(revealed) * (ID_BYTES + shamir.SHARE_BYTES), down=n_contrib * ID_BYTES
            )
            if keep:
                self._record(
                    v,
                    unmask_owners=np.asarray(list(revealed), np.int64),
                    unmask_shares=np.frombuffer(
                        b"".join(shamir.encode_share(val) for _, val in revealed.values()),
                        np.uint8,
                    ),
                )
        return gathered

    def _helper(self, x: int) -> int:
        return self._ids[x - 1]  # Shamir x = position + 1

    def _rebuild_secrets(
        self, gathered: dict[int, dict[str, list[tuple[int, int]]]], needed: list[tuple[int, str]]
    ) -> dict[tuple[int, str], bytes]:
        """Every needed secret, each checked against all of its shares; liars left out.

        A share off the polynomial of the others is corrected when the spare shares allow
        (:func:`~securefed.crypto.shamir.decode_shares`); its helper is then excluded from every
        secret and all are rebuilt again without it, until no share disagrees. Sets
        :attr:`excluded_helpers`.

        Raises:
            AggregationError: a secret with too few shares, shares that disagree beyond what the
                spare ones correct (naming the owner and the helpers), or a rebuilt mask key that
                does not match the advertised public key.
        """
        excluded: set[int] = set()  # x-coordinates of the liars
        while True:
            values, wrong = {}, set()
            for owner, kind in needed:
                points = [p for p in gathered.get(owner, {}).get(kind, []) if p[0] not in excluded]
                values[(owner, kind)], found = self._decode(owner, kind, points)
                wrong.update(found)
            if not wrong:
                break
            excluded |= wrong
        self.excluded_helpers = frozenset(self._helper(x) for x in excluded)
        secrets = {}
        for (owner, kind), value in values.items():
            try:
                secrets[(owner, kind)] = shamir.int_to_secret(value)
            except ValueError as error:
                raise AggregationError(
                    f"cannot rebuild client {owner}'s secret: {error}"
                ) from error
            advertised = self.public_keys[owner][1]
            if kind == "s" and kx.public_from_private_bytes(secrets[(owner, kind)]) != advertised:
                helpers = [self._helper(x) for x, _ in gathered[owner][kind] if x not in excluded]
                raise AggregationError(
                    f"client {owner}'s rebuilt mask key does not match its advertised public key: "
                    f"a share from one of the helpers {helpers[:8]} is wrong; no result"
                )
        return secrets

    def _decode(
        self, owner: int, kind: str, points: list[tuple[int, int]]
    ) -> tuple[int, tuple[int, ...]]:
        """One secret and the x-coordinates of its wrong shares (corrected), or a refusal."""
        what = _SECRET_NAMES[kind]
        try:
            return shamir.decode_shares(points, self.threshold)
        except shamir.InconsistentSharesError as error:
            helpers = sorted(self._helper(x) for x in error.suspects)
            raise AggregationError(
                f"round {self.round_id}: the shares of client {owner}'s {what} revealed by "
                f"helpers {helpers} disagree ({error}); a helper lied and cannot be told "
                "apart, so the round is refused"
            ) from error
        except ValueError as error:
            raise AggregationError(f"cannot rebuild client {owner}'s {what}: {error}") from error

    def _check_range(
        self,
        total: np.ndarray,
        n_contributors: int,
        gathered: dict[int, dict[str, list[tuple[int, int]]]],
        needed: list[tuple[int, str]],
    ) -> None:
        """Refuse an unmasked sum beyond what ``n`` clipped, encoded inputs can add up to.

        Each input lies in ``[-L, L]`` (``L = ceil(clip scale)``) and each weight in ``[0, L]``,
        so the sum of ``n`` lies in ``[-n L, n L]`` and its weight in ``[0, n L]``; a wrong
        secret leaves a uniformly random ring element, almost never in that range.

        Raises:
            AggregationError: naming the first coordinate out of range, and the secrets that were
                rebuilt from exactly ``t`` shares (which nothing could check).
        """
        signed = from_ring(total, self.config.bits)
        bound = self.fixed_point.sum_bound(n_contributors)
        if self._inputs:
            n_contributors = sum(self._inputs.get(int(c), 1) for c in self.submitted)
            bound = self.fixed_point.sum_bound(n_contributors)
        outside = np.abs(signed) > bound
        if self._weighted:
            outside[-1] = not 0 <= signed[-1] <= bound
        if not outside.any():
            return
        at = int(np.flatnonzero(outside)[0])
        if self._weighted and at == len(signed) - 1:
            where = f"the weight sum is {int(signed[at])} units, outside [0, {bound}]"
        else:
            where = f"coordinate {at} is {int(signed[at])} units, outside [-{bound}, {bound}]"
        unchecked = []
        for owner, kind in needed:
            xs = [x for x, _ in gathered.get(owner, {}).get(kind, [])]
            helpers = [self._helper(x) for x in xs if self._helper(x) not in self.excluded_helpers]
            if len(helpers) <= self.threshold:
                unchecked.append(f"client {owner}'s {_SECRET_NAMES[kind]} from helpers {helpers}")
        raise AggregationError(
            f"round {self.round_id}: the unmasked sum lies outside the range that "
            f"{n_contributors} clipped inputs allow ({where}; L = ceil(clip scale) = "
            f"{self.fixed_point.level}): a helper revealed a wrong share, or a client uploaded a "
            f"value beyond the clip range. Secrets rebuilt from exactly t shares, which nothing "
            f"could check: {'; '.join(unchecked[:3]) or 'none'}; no result"
        )

    # -- helpers --------------------------------------------------------------------------
    def _check_before_unmasking(self, what: str) -> None:
        if self._unmasking:
            raise AggregationError(
                f"round {self.round_id}: unmasking began, so a late {what} is refused (its owner "
                "counts as dropped; taking it now would let the server ask its helpers for both "
                "of its secrets)"
            )

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise AggregationError(f"round {self.round_id} was refused earlier: {self._failure}")

    def _record(self, client: int, **fields: np.ndarray) -> None:
        if self.view.keep_payloads:
            merged = dict(self.view.payloads.get(int(client), {}))
            merged.update(fields)
            self.view.record_payload(client, merged)

    def _precision(self, n_contributors: int) -> dict[str, float]:
        """The round's scale and error bounds, as its view records them (``view.public``)."""
        return {
            "secagg_scale": float(self.fixed_point.scale),
            "secagg_error_bound_sum": self.error_bound("sum", n_contributors),
            "secagg_error_bound_mean": self.error_bound("mean", n_contributors),
        }

    def error_bound(self, quantity: str = "sum", n_contributors: int | None = None) -> float:
        """The bound on the result's error per coordinate (``docs/secagg.md``, fixed point).

        Args:
            quantity: ``"sum"``: ``|total - true clipped (weighted) sum|``, also the bound on the
                weight of a weighted round; ``"mean"``: the error of ``total / weight`` (an
                unweighted round's mean over its contributors; a weighted round's once decoded,
                from its weight, :func:`~securefed.crypto.fixed_point.weighted_mean_error_bound`).
            n_contributors: the contributors it holds for (default: those who submitted).

        Raises:
            ValueError: an unknown quantity.
            AggregationError: the mean of a weighted round before its result.
        """
        n = self._n_inputs() if n_contributors is None else int(n_contributors)
        if quantity == "sum":
            return self.fixed_point.error_bound(n)
        if quantity != "mean":
            raise ValueError(f"quantity must be 'sum' or 'mean', got {quantity!r}")
        if self._weighted:
            if self._mean_bound is None:
                raise AggregationError(
                    "a weighted round's bound on the mean depends on its decoded weight: call "
                    "result() first"
                )
            return self._mean_bound
        return self.fixed_point.mean_error_bound(max(n, 1))

    def _n_inputs(self) -> int:
        """Clipped inputs in the sum so far: one per client, a party's members for a party."""
        return sum(self._inputs.get(int(c), 1) for c in self.submitted)

    # -- parties of several clients (a message layer whose nodes host many users) --------
    def among_parties(self, members: Mapping[int, Sequence[int]]) -> SecAggRound:
        """Run this round's protocol among parties, each uploading its members' summed inputs.

        For a federation whose nodes host many clients (``securefed.flower``): were every
        client its own party, a node would hold every share its users receive, and one node
        with the server could pool ``t`` shares of users it does not host. Here each node is
        one party: it clips, weights and encodes each member's update (each with the member's
        own rounding stream, :func:`~securefed.transport.secagg.client.encode_input`), adds
        them in the ring and masks the sum once; the graph, the keys, the shares and the
        threshold are the parties'. The server learns the sum over the contributing parties;
        a party (with the server) learns the sum of the other parties' inputs, the total
        minus its own, which with two parties is the other party's sum.

        Args:
            members: party id -> the round's clients it hosts; a party's id is one of its
                members (by convention the lowest), so its records land in this round's view
                under that id. Disjoint; at least two parties.

        Returns:
            The party round. Drive its stage methods (``receive_keys``, ``share_request`` /
            ``receive_shares``, ``mask_request``, ``unmask_requests`` / ``receive_reveals``),
            hand each party's masked sum to :meth:`receive_party_masked`, and read the result
            from *this* round (the party round's own ``result`` is sealed): the sum over the
            contributing parties, whose members are the contributors.

        Raises:
            AggregationError: clients simulated here, keys received already, parties chosen
                already, fewer than two parties, or members that overlap, lie outside the round
                or do not contain their party's id.
        """
        self._check_usable()
        if not self.remote_clients or self.public_keys or self._party is not None:
            raise AggregationError(
                f"round {self.round_id}: parties are chosen once, before any key, in a round "
                "whose clients are remote"
            )
        groups = {int(p): frozenset(int(c) for c in m) for p, m in members.items() if len(m)}
        if len(groups) < 2:
            raise AggregationError(
                f"round {self.round_id}: secure aggregation among parties needs at least 2 "
                f"parties with clients in the round (got {len(groups)}): one party's masked "
                "sum would be its own sum"
            )
        seen: set[int] = set()
        for party, group in sorted(groups.items()):
            self.view.positions(sorted(group))  # raises for clients outside the round
            if party not in group or seen & group:
                raise AggregationError(
                    f"round {self.round_id}: party {party} must be one of its own members, and "
                    "no client may belong to two parties"
                )
            seen |= group
        ids = np.array(sorted(groups), np.int64)
        party = SecAggRound(
            self.round_id,
            ids,
            shape=self.shape,
            view=RoundView(self.round_id, ids, keep_payloads=self.view.keep_payloads),
            seeds=self.seeds,
            # A minimum of contributors counts clients, not parties: the parties' endorsements
            # cannot count it (each party checks its peers' signed member counts instead,
            # securefed.flower.client), so the party round holds none.
            config=replace(self.config, min_contributors=0),
            remote_clients=True,
            inputs={p: len(g) for p, g in groups.items()},
            keep_masked=self.keep_masked,
        )
        self._party, self._members = party, groups
        self._party_decode = party.result
        party.result = self._sealed_party_result
        self.neighbours_k, self.threshold = party.neighbours_k, party.threshold
        self.view.public.update(party.view.public)
        self.view.public.update(
            {
                "secagg_parties": "nodes",
                "secagg_users": len(self._ids),
                "secagg_party_members": {str(p): sorted(g) for p, g in sorted(groups.items())},
                "secagg_party_learns": (
                    "the other party's sum (the total minus its own)"
                    if len(groups) == 2
                    else "the sum over the other parties (the total minus its own), nothing finer"
                ),
            }
        )
        return party

    @property
    def party_members(self) -> Mapping[int, frozenset[int]]:
        """Party id -> its members (empty until :meth:`among_parties`)."""
        return dict(self._members)

    def _sealed_party_result(self) -> Aggregate:
        raise AggregationError(
            f"round {self.round_id}: the parties' sum is released by the clients' round "
            "(result() of the round that chose the parties), never by the party round itself"
        )

    def receive_party_masked(
        self, party: int, clients: Sequence[int], masked: np.ndarray, *, weighted: bool
    ) -> None:
        """A party's masked sum of its ``clients``' encoded inputs (see :meth:`among_parties`).

        Raises:
            AggregationError: no parties chosen, clients not the party's members, already
                submitted or dropped; and whatever the party round's ``receive_masked`` raises.
        """
        self._check_open()
        self._check_usable()
        if self._party is None:
            raise AggregationError(f"round {self.round_id}: no parties were chosen")
        party = int(party)
        clients = sorted({int(c) for c in clients})
        strangers = sorted(set(clients) - self._members.get(party, frozenset()))
        if strangers or not clients:
            raise AggregationError(
                f"round {self.round_id}: party {party}'s masked sum must cover some of its own "
                f"members, not clients {strangers[:5]}"
            )
        repeated = (self.submitted | self.dropped).intersection(clients)
        if repeated:
            raise AggregationError(
                f"client(s) {sorted(repeated)[:5]} already submitted or dropped in this round"
            )
        self._party._inputs[party] = len(clients)
        self._party.receive_masked(party, masked, weighted=weighted)
        self.submitted.update(clients)

    def _finish_parties(self) -> Aggregate:
        party = self._party
        try:
            aggregate = self._party_decode()
        finally:
            self._merge_party_view()
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        weight = aggregate.weight if party._weighted else float(len(contributors))
        return Aggregate(aggregate.total, weight, contributors)

    def _merge_party_view(self) -> None:
        """What the server saw of the parties, in this round's view under the parties' ids."""
        seen = self._party.view
        at = self.view.positions(seen.clients)
        np.add.at(self.view.bytes_up, at, seen.bytes_up)
        np.add.at(self.view.bytes_down, at, seen.bytes_down)
        for party, fields in seen.payloads.items():
            self._record(party, **fields)
        for name in ("ring_sum", "excluded_helpers"):
            if name in seen.aggregate:
                self.view.aggregate[name] = seen.aggregate[name]


def masked_digest(masked: np.ndarray, bits: int) -> np.ndarray:
    """SHA-256 of a masked upload as it travels: its ring elements, little-endian, ``bits / 8``
    bytes each (what a view records in place of the upload unless it keeps the integers)."""
    wire = np.ascontiguousarray(masked, dtype=f"<u{bits // 8}").tobytes()
    return _u8(hashlib.sha256(wire).digest())


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8).copy()


def _wire(authenticator: bytes | Mapping[int, bytes]) -> bytes:
    """An authenticator as the bytes it travels as: a signature, or ``(id, tag)`` per recipient."""
    if isinstance(authenticator, bytes):
        return authenticator
    return b"".join(
        np.asarray([v], ">i8").tobytes() + authenticator[v] for v in sorted(authenticator)
    )
