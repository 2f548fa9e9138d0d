"""The server half on Flower: a ServerApp that runs a securefed algorithm's rounds over messages.

:func:`make_server_app` wraps a factory of :class:`ServerSetup` (the algorithm's server half, the
server's transport, the seed tree, the loop options) into a ``flwr.serverapp.ServerApp``. Its
``main`` is the template loop of :func:`run_federation`, one training round at a time:

* plaintext, DP (any placement) and their compositions over plaintext: one message round.
  ``train`` carries the broadcast and the round's clients to the nodes hosting them; each node
  replies with its users' :class:`~securefed.RowUpdates` (noised on the node under local or
  distributed DP); the server submits them into the transport round it opened, drops the clients
  whose node did not answer, and the algorithm steps.
* securefed's secure aggregation (``SecAggTransport(remote_clients=True)``, optionally inside
  ``DPTransport``, whose exact integer mechanisms the nodes encode): one message round per stage
  of Bonawitz et al. (2017) with SecAgg+'s graph: ``query.secagg_advertise`` (AdvertiseKeys),
  ``query.secagg_share`` (ShareKeys: sealed shares relayed by the server, which cannot open
  them), ``train.secagg_mask`` (the broadcast goes out, every node computes its users' updates
  and uploads their masked sum), ``query.secagg_consistency`` (ConsistencyCheck,
  malicious-server variant only: the default) and ``query.secagg_unmask`` (Unmasking). In the
  malicious-server variant the advertisements, the survivor set and each party's member count
  are signed by the nodes' long-term identities (:mod:`securefed.flower.identity`) over the
  run's nonce transcript: once per run, before the first AdvertiseKeys, every node gives a
  fresh nonce (``query.secagg_nonce``) and every AdvertiseKeys request relays them all
  (:mod:`securefed.flower.freshness`), so no signature of another run verifies in this one.
  Each node is one party of the protocol
  (:meth:`~securefed.transport.secagg.SecAggRound.among_parties`): the server's side of each
  stage is the party round, a
  :class:`~securefed.transport.secagg.SecAggRound` over the nodes. A node's refusal reply
  refuses the round (the error the node raised, naming it), where a node that does not answer
  counts as dropped.
* CKKS (``CKKSTransport(config, public=...)``: the server holds the public context only,
  optionally inside ``DPTransport`` with the float Gaussian, the nodes noising): two
  message rounds. ``train.ckks`` (the nodes compute and encrypt their users' updates; the server
  adds the ciphertexts with ``CKKSRound.receive_ciphertexts``) and ``query.ckks_decrypt`` (the
  summed ciphertexts go to one key-holder node, which decrypts, floods and rounds them as
  ``KeyHolder`` does in one process; ``CKKSRound.receive_decryption``). Under an encrypted
  server state (FedMF's ``server_state="encrypted"``, shared key model) a key-holder node first
  encrypts the initial state (``query.ckks_encrypt_state``); each round the broadcast carries
  the ciphertexts, the nodes decrypt them, and the server folds the summed ciphertexts into the
  state (the algorithm's ``close_round``) instead of asking for a decryption.
* ``evaluate``: after the last round (and every ``evaluate_every``), the nodes report held-out
  metric sums of their users.

With ``FlowerRunOptions.checkpoint_dir`` the server writes a checkpoint after every completed
round, in the in-process runtime's format (``securefed.runtime.Checkpoints``: the algorithm's
arrays with its server optimiser, the server's view, the seeds, the privacy ledgers, the next
round, the run's fingerprint; atomic, under digests), and a ServerApp started again with the
same configuration and directory (a SuperLink killed and restarted, the run resubmitted)
continues from the last complete round, telling the nodes so (``resumed_from``); a checkpoint of
another configuration or seed, a corrupt or truncated one, or ledgers that differ are refused
(``CheckpointError``), and a round the restored ledger cannot afford is refused before any node
is asked (``PrivacyBudgetExceeded``). Under an encrypted server state the checkpoint carries
the ciphertexts of ``[[V]]`` (:mod:`securefed.flower.state_checkpoint`). The nodes' side is
their journal (:mod:`securefed.flower.journal`): their own state across runs, and a refusal to
answer a round they already released.

Clients are sampled per round exactly as ``securefed.run_rounds`` samples them, and the
algorithm's own ``open_round``/``close_round`` run on the server, so a seeded run gives the same
model as in one process (``tests/test_flower.py``). Everything the server receives goes through
its transport, so ``transport.view`` is the server's notebook, as in one process.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from securefed.crypto import keys as kx
from securefed.crypto import shamir
from securefed.errors import (
    AggregationError,
    AlgorithmContractError,
    CheckpointError,
    InsecureParameterError,
    SecurefedError,
)
from securefed.flower import freshness
from securefed.flower import records as rec
from securefed.flower.ckks import arrays_to_ciphertexts, ciphertexts_to_arrays
from securefed.flower.dp import client_noise_std, mechanism_config
from securefed.flower.protocol import (
    FlowerRunOptions,
    FlowerRunResult,
    MetricsFn,
    ServerAlgorithm,
    sum_metrics,
)
from securefed.flower.state_checkpoint import EncryptedStateCheckpoint, run_binding
from securefed.randomness import SeedTree
from securefed.runtime import Checkpoints, RunHistory
from securefed.transport import require_capabilities
from securefed.transport.base import AggregationRound, RowUpdates, Transport
from securefed.transport.ckks import CKKSConfig, CKKSRound, CKKSTransport
from securefed.transport.ddp import INTEGER_MECHANISMS
from securefed.transport.dp import DPConfig, DPRound, DPTransport
from securefed.transport.plaintext import PlaintextTransport
from securefed.transport.secagg import (
    SEALED_SHARE_BYTES,
    SecAggConfig,
    SecAggRound,
    SecAggTransport,
)
from securefed.transport.secagg.signatures import (
    SIGNATURE_BYTES,
    ConsistencyError,
    SignatureError,
)

LOG = logging.getLogger("securefed.flower")

TRAIN = "train"
EVALUATE = "evaluate"
NONCE = "query.secagg_nonce"
"""Once per run, before the first AdvertiseKeys (malicious-server variant): every node's fresh
nonce, whose transcript every signature of the run binds (:mod:`securefed.flower.freshness`)."""
ADVERTISE = "query.secagg_advertise"
SHARE = "query.secagg_share"
MASK = "train.secagg_mask"
SHARE_MASK = "train.secagg_share_mask"
"""ShareKeys and MaskedInputCollection in one message round (``merge_share_mask``)."""
CONSISTENCY = "query.secagg_consistency"
UNMASK = "query.secagg_unmask"
CKKS_TRAIN = "train.ckks"
CKKS_DECRYPT = "query.ckks_decrypt"
CKKS_ENCRYPT_STATE = "query.ckks_encrypt_state"
"""A key-holder node encrypts the initial encrypted server state (FedMF's ``[[V]]``)."""


@dataclass
class ServerSetup:
    """Everything the ServerApp needs, built per run from its Flower ``Context``.

    Attributes:
        algorithm: the algorithm's server half (e.g. ``securefed.recsys.fedmf.FedMF`` without
        ratings).
        transport: the server's transport; secure aggregation must be
            ``SecAggTransport(remote_clients=True)`` (its clients run on the nodes).
        seeds: the server's seed tree (sampling, the algorithm's server-side draws, DP noise).
        options: the round loop.
        train_metrics: turns the nodes' summed training metrics into the round's metrics.
        evaluation_metrics: the same for held-out metrics.
        on_round: called after every round with its metrics.
        on_finish: called with the run's result (e.g. to save it where the caller can read it).
    """

    algorithm: ServerAlgorithm
    transport: Transport
    seeds: SeedTree
    options: FlowerRunOptions
    train_metrics: MetricsFn | None = None
    evaluation_metrics: MetricsFn | None = None
    on_round: Callable[[int, Mapping[str, float]], None] | None = None
    on_finish: Callable[[FlowerRunResult], None] | None = None


@dataclass(frozen=True)
class Wire:
    """What the nodes must do with their updates, derived from the server's transport (public).

    Attributes:
        kind: ``"plaintext"``, ``"secagg"`` or ``"ckks"``.
        dp: the DP wrapper's configuration, if any.
        secagg: the secure-aggregation parameters, if any.
        ckks: the CKKS parameters, if any.
        key_id: the id of the CKKS key (the nodes check they hold the same).
    """

    kind: str
    dp: DPConfig | None = None
    secagg: SecAggConfig | None = None
    ckks: CKKSConfig | None = None
    key_id: str = ""

    @property
    def client_noise(self) -> bool:
        """Whether nodes add DP noise (local or distributed placement)."""
        return self.dp is not None and self.dp.placement != "central"

    def node_config(self, n_round_clients: int) -> dict[str, object]:
        """The public parameters the nodes need, as ``ConfigRecord`` scalars."""
        config: dict[str, object] = {"wire": self.kind}
        if self.client_noise:
            shares = n_round_clients
            if self.dp.placement == "distributed" and self.dp.min_contributors is not None:
                shares = int(self.dp.min_contributors)
            config |= {
                "dp_clip": self.dp.clip,
                "dp_std": client_noise_std(
                    self.dp.placement, self.dp.clip, self.dp.noise_multiplier, shares
                ),
                "dp_secure": bool(self.dp.secure),
                "dp_placement": self.dp.placement,
                "dp_shares": shares,
            }
        elif self.dp is not None and self.kind in ("secagg", "ckks"):
            # Central DP over secure aggregation or CKKS: the server cannot clip masked or
            # encrypted updates, so the nodes clip (as DPRound does before its inner round) and
            # the server adds the noise to the released sum.
            config |= {
                "dp_clip": self.dp.clip,
                "dp_std": 0.0,
                "dp_secure": bool(self.dp.secure),
                "dp_placement": "central",
            }
        elif self.dp is not None:  # central over plaintext: the server clips and noises
            config |= {"dp_placement": self.dp.placement}
        if self.ckks is not None:
            config |= {
                "ckks_key_model": self.ckks.key_model,
                "ckks_value_bound": float(self.ckks.value_bound),
                "ckks_key_id": self.key_id,
            }
        if self.secagg is not None:
            config |= {
                "secagg_bits": self.secagg.bits,
                # The round's scale (an automatic one follows the round's client count).
                "secagg_scale": float(self.secagg.fixed_point_for(n_round_clients).scale),
                "secagg_clip": float(self.secagg.clip),
                "secagg_prg": self.secagg.prg,
                "secagg_aead": self.secagg.aead,
                "secagg_server": self.secagg.server,
                # A minimum of contributing users of its own (issue 30): the nodes check it
                # against the parties' signed member counts, as they check the DP layer's.
                "secagg_min_contributors": int(self.secagg.min_contributors),
            }
        return config

    @property
    def integer_mechanism(self) -> bool:
        """Whether the nodes encode an exact integer mechanism (``secagg+dp``'s default)."""
        return self.dp is not None and self.dp.mechanism in INTEGER_MECHANISMS


def describe_transport(transport: Transport) -> Wire:
    """The :class:`Wire` of a server transport.

    Raises:
        ValueError: a ``SecAggTransport`` whose clients are simulated in the server's process, or
            a ``CKKSTransport`` that holds the secret key.
        NotImplementedError: a transport this adapter cannot carry (naming it).
    """
    dp = None
    base = transport
    if isinstance(transport, DPTransport):
        dp, base = transport.config, transport.inner
    if isinstance(base, CKKSTransport):
        if base.key_holder is not None:
            raise ValueError(
                "the server's CKKSTransport holds the users' secret key; on Flower the server "
                "must hold only the public context: CKKSTransport(config, "
                "public=load_public_context(path)) (securefed.flower.ckks.provision_keys)"
            )
        if dp is not None and dp.mechanism in INTEGER_MECHANISMS:
            raise NotImplementedError(
                f"mechanism {dp.mechanism!r} sums integers exactly; CKKS sums approximately "
                "(DP around CKKS takes mechanism='gaussian')"
            )
        return Wire("ckks", dp, ckks=base.config, key_id=base.server_context.key_id)
    if isinstance(base, PlaintextTransport):
        if dp is not None and dp.mechanism in INTEGER_MECHANISMS:
            raise NotImplementedError(
                f"mechanism {dp.mechanism!r} over plaintext is an in-process stand-in only; on "
                "Flower it runs under secure aggregation (transport 'secagg+dp')"
            )
        return Wire("plaintext", dp)
    if isinstance(base, SecAggTransport):
        if not base.remote_clients:
            raise ValueError(
                "the server's SecAggTransport simulates its clients in the server's process; on "
                "Flower the clients run on the nodes: use SecAggTransport(config, "
                "remote_clients=True)"
            )
        if base.config.malicious and base.config.auth != "signatures":
            raise NotImplementedError(
                "securefed.flower carries the malicious-server variant with auth='signatures' "
                "(Ed25519, each node signing as its party); auth='macs' would need one tag per "
                "neighbouring node in every message and is not carried"
            )
        if base.config.graph_epoch > 1:
            raise NotImplementedError(
                f"securefed.flower does not carry graph_epoch={base.config.graph_epoch}: a signed "
                "epoch session keeps its epoch keys in the client's identity across rounds and "
                "tags each neighbour in later rounds, which the node's message state does not "
                "carry; use graph_epoch=1"
            )
        return Wire("secagg", dp, base.config)
    raise NotImplementedError(
        f"securefed.flower cannot carry the {transport.name!r} transport over Flower messages "
        "(supported: plaintext, secagg with remote_clients=True, DPTransport around either, and "
        "ckks built from the public context)"
    )


# ----------------------------------------------------------------------------- messaging
@dataclass
class _Messenger:
    """Push messages, poll for the replies, count the payload bytes."""

    grid: Grid
    options: FlowerRunOptions
    result: FlowerRunResult
    known_nodes: list[int] = field(default_factory=list)

    def exchange(
        self, message_type: str, contents: Mapping[int, RecordDict], round_id: int
    ) -> dict[int, Message]:
        """Send ``contents[node]`` to each node; return the good replies by node.

        A node that does not answer within ``options.timeout``, or answers with an error, is
        missing from the result (logged); the caller decides what its absence means.
        """
        if not contents:
            return {}
        messages = [
            Message(body, dst_node_id=int(node), message_type=message_type, group_id=str(round_id))
            for node, body in contents.items()
        ]
        self.result.message_bytes["down"] += sum(rec.message_nbytes(m) for m in messages)
        started = time.perf_counter()
        pending = {mid for mid in self.grid.push_messages(messages) if mid}
        replies: dict[int, Message] = {}
        refusals: dict[int, tuple[str, str]] = {}
        deadline = time.monotonic() + self.options.timeout
        wait = self.options.poll_interval
        while pending and time.monotonic() < deadline:
            pulled = self.grid.pull_messages(list(pending))
            for reply in pulled:
                pending.discard(reply.metadata.reply_to_message_id)
                node = int(reply.metadata.src_node_id)
                if reply.has_error():
                    LOG.warning(
                        "round %d: node %d failed %s: %s",
                        round_id,
                        node,
                        message_type,
                        reply.error.reason,
                    )
                    continue
                self.result.message_bytes["up"] += rec.message_nbytes(reply)
                replies[node] = reply
                refusal = rec.message_config(reply).get(rec.REFUSAL)
                if refusal is not None:
                    refusals[node] = (str(rec.message_config(reply).get(rec.REFUSAL_KIND)), refusal)
            if pending:  # back off while nothing arrives (FlowerRunOptions.max_poll_interval)
                wait = self.options.poll_interval if pulled else 2 * wait
                wait = min(wait, self.options.max_poll_interval)
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        seconds = self.result.message_seconds
        seconds[message_type] = seconds.get(message_type, 0.0) + time.perf_counter() - started
        counts = self.result.message_rounds
        counts[message_type] = counts.get(message_type, 0) + 1
        if pending:
            LOG.warning(
                "round %d: %d node(s) did not answer %s within %.0f s",
                round_id,
                len(pending),
                message_type,
                self.options.timeout,
            )
        if refusals:
            raise _refused(round_id, message_type, refusals)
        return replies

    def nodes(self) -> list[int]:
        return sorted(int(n) for n in self.grid.get_node_ids())


_REFUSAL_ERRORS: dict[str, type[AggregationError] | type[InsecureParameterError]] = {
    "ShareDecryptionError": kx.ShareDecryptionError,
    "InvalidPublicKeyError": kx.InvalidPublicKeyError,
    "InsecureParameterError": InsecureParameterError,
    "SignatureError": SignatureError,
    "ConsistencyError": ConsistencyError,
}


def _refused(
    round_id: int, message_type: str, refusals: Mapping[int, tuple[str, str]]
) -> Exception:
    """The error that refuses the round when nodes refused (the kind the node raised, as one
    process raises it; ``AggregationError`` for any other kind)."""
    node, (kind, reason) = min(refusals.items())
    error = _REFUSAL_ERRORS.get(kind, AggregationError)
    others = f" (and nodes {sorted(refusals)[1:6]})" if len(refusals) > 1 else ""
    return error(
        f"round {round_id}: node {node}{others} refused {message_type}: {reason}; the round is "
        "refused (a refusal, not a dropout: nothing is unmasked)"
    )


@contextlib.contextmanager
def _malformed_refuses(round_id: int, node: int, message_type: str):
    """A reply the server cannot read (missing or ill-typed arrays, non-finite or ill-shaped
    updates) refuses the round naming the node, rather than failing without its name or
    entering the aggregate. securefed's own checks keep their error types."""
    try:
        yield
    except SecurefedError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise AggregationError(
            f"round {round_id}: node {node} answered {message_type} with a malformed reply "
            f"({type(error).__name__}: {error}); the round is refused"
        ) from error


def _computing_users(
    secagg: SecAggRound, parties: SecAggRound, active: set[int]
) -> dict[int, list[int]]:
    """Each party that shared its keys -> its users still active, in order (the users whose
    updates its masked sum holds; a party with none counts as dropped)."""
    return {
        party: [u for u in sorted(secagg.party_members[party]) if u in active]
        for party in parties.shared_clients
    }


def wait_for_nodes(grid: Grid, count: int, timeout: float, poll: float = 0.1) -> list[int]:
    """The connected SuperNodes once at least ``count`` are there.

    Raises:
        TimeoutError: naming how many connected.
    """
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(int(n) for n in grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(nodes)} of the {count} SuperNodes needed connected within {timeout} s"
            )
        time.sleep(poll)
    return nodes


def _shared_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, Array]:
    """Serialize arrays once, to reuse in every node's message of a round."""
    return {name: Array(np.require(value, requirements="C")) for name, value in arrays.items()}


def _body(
    shared: Mapping[str, Array], arrays: Mapping[str, np.ndarray], config: Mapping[str, object]
) -> RecordDict:
    record = ArrayRecord(array_dict=dict(shared) | _shared_arrays(arrays))
    return RecordDict({rec.ARRAYS: record, rec.CONFIG: ConfigRecord(dict(config))})


def _share_arrays(
    parties: SecAggRound, party: int, config: Mapping[str, object], *, with_s_keys: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """``party``'s ShareKeys request as message arrays and config: its neighbours, their Shamir
    points and ``c`` keys; their ``s`` keys and advertisement signatures in the malicious-server
    variant, or (``with_s_keys``, the merged ShareKeys+MaskedInput message) their ``s`` keys
    in either variant."""
    request = parties.share_request(party)
    arrays = {
        "users": np.array([party], np.int64),
        "neighbours": np.array([request.neighbours], np.int64),
        "xs": np.array([request.xs], np.int64),
        "c_publics": rec.bytes_rows(request.c_publics, kx.PUBLIC_KEY_BYTES)[None],
    }
    s_publics = request.s_publics or (parties.mask_request(party).s_publics if with_s_keys else ())
    if s_publics:
        arrays["s_publics"] = rec.bytes_rows(s_publics, kx.PUBLIC_KEY_BYTES)[None]
    if request.signatures:  # malicious-server variant: the signed advertisements
        arrays["signatures"] = rec.bytes_rows(request.signatures, SIGNATURE_BYTES)[None]
    return arrays, dict(config) | {"threshold": parties.threshold, "n_clients": request.n_clients}


def _broadcast_arrays(algorithm: ServerAlgorithm) -> dict[str, Array]:
    return _shared_arrays({f"broadcast.{k}": v for k, v in algorithm.broadcast_state().items()})


def _by_node(clients: Iterable[int], hosts: Mapping[int, int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for client in clients:
        groups.setdefault(hosts[int(client)], []).append(int(client))
    return groups


def _learn_hosts(hosts: dict[int, int], node: int, users: np.ndarray) -> None:
    for user in np.asarray(users, np.int64).tolist():
        if hosts.setdefault(user, node) != node:
            raise AggregationError(
                f"user {user} is claimed by two nodes ({hosts[user]} and {node}): check the "
                "nodes' partition-id / num-partitions"
            )


# ----------------------------------------------------------------------------- the round kinds
def _dp_round(rnd: AggregationRound) -> DPRound | None:
    return rnd if isinstance(rnd, DPRound) else None


def _base_round(rnd: AggregationRound) -> AggregationRound:
    return rnd.inner if isinstance(rnd, DPRound) else rnd


def _noised_by_clients(rnd: AggregationRound, clients: np.ndarray, weight_sq: np.ndarray) -> None:
    """Tell a ``DPRound`` that these clients submitted updates they noised themselves.

    ``DPRound`` charges its ledger from the clients that submitted and their squared weights
    (distributed placement); in one process it sees them at ``submit``. Here the noised (and
    possibly masked) updates go to its inner round directly, so the two records it reads are
    filled in here.
    """
    dp_round = _dp_round(rnd)
    if dp_round is None:
        return
    dp_round.submitted.update(int(c) for c in clients)
    dp_round._weight_sq.update({int(c): float(w) for c, w in zip(clients, weight_sq, strict=True)})


def _check_two_uploads(round_id: int, parties: SecAggRound) -> None:
    """Raises AggregationError: fewer than two nodes uploaded a masked sum (unmasking would
    give the server one node's sum)."""
    if len(parties.submitted) < 2:
        raise AggregationError(
            f"round {round_id}: only {len(parties.submitted)} node(s) uploaded a masked sum; "
            "unmasking would give the server one node's sum, so the round is refused"
        )


def _drop_missing(rnd: AggregationRound, expected: Iterable[int], arrived: set[int]) -> None:
    for client in expected:
        if int(client) not in arrived and int(client) not in rnd.dropped:
            rnd.drop(int(client))


class _Run:
    """State of one federation run on the server."""

    def __init__(self, grid: Grid, setup: ServerSetup) -> None:
        self.setup = setup
        self.algorithm = setup.algorithm
        self.transport = setup.transport
        self.seeds = setup.seeds
        self.options = setup.options
        self.wire = describe_transport(setup.transport)
        if setup.options.merge_share_mask and self.wire.kind != "secagg":
            raise ValueError(
                "merge_share_mask merges secure aggregation's message rounds; the "
                f"{self.wire.kind} wire has none"
            )
        needs = getattr(self.algorithm, "transport_needs", None)
        self.encrypted_state: str | None = None if needs is None else needs.encrypted_state
        """What needs the server's state kept encrypted (``"server_state='encrypted'"``)."""
        if self.encrypted_state is not None:
            require_capabilities(self.transport, needs)  # refuses as in one process, by name
        self.result = FlowerRunResult(ledger=setup.transport.ledger)
        self.messenger = _Messenger(grid, setup.options, self.result)
        self.hosts: dict[int, int] = {}
        self.key_holder_nodes: set[int] = set()
        self.resumed_from = 0
        self._checkpointed = self.algorithm
        """What the checkpoints save and restore: the algorithm, with its ``[[V]]`` under an
        encrypted state (:class:`~securefed.flower.state_checkpoint.EncryptedStateCheckpoint`)."""
        self._sampled: dict[int, np.ndarray] = {}
        self.nonces: dict[int, bytes] = {}
        """The run's nonces by member (a node's lowest user), relayed with every AdvertiseKeys."""
        self.nonce_nodes: set[int] = set()
        """The nodes that gave the run a nonce: the only ones asked to advertise."""
        self._ahead: dict[int, dict[int, dict[str, np.ndarray]]] = {}
        self._asked_ahead: dict[int, set[int]] = {}
        if setup.options.advertise_ahead and self.wire.kind != "secagg":
            raise ValueError(
                "advertise_ahead carries secure aggregation's next AdvertiseKeys; the "
                f"{self.wire.kind} wire has none"
            )

    def _round_config(self, round_id: int) -> dict[str, object]:
        """The config entries of every message of a round: its id, and the round the run
        was resumed from (a node that kept no state across runs refuses a resumed run)."""
        return {"round": round_id, "resumed_from": self.resumed_from}

    # -- checkpoints ---------------------------------------------------------------------
    def _checkpoints(self) -> Checkpoints | None:
        """The run's checkpoints, restored into the algorithm, view, seeds and ledgers when
        there is one to resume.

        Raises:
            ValueError: an unseeded run without a checkpoint key.
            AlgorithmContractError: an algorithm without ``state_dict``/``load_state_dict``.
            CheckpointError: the checkpoint is corrupt, truncated, modified, or another run's.
        """
        options = self.options
        if not options.checkpoint_dir:
            return None
        if self.seeds.seed is None and options.checkpoint_key is None:
            raise ValueError(
                "an unseeded (secure-mode) run keeps its root entropy secret, and its "
                "checkpoints store it only encrypted: give a checkpoint key "
                "(FlowerRunOptions(checkpoint_key=...); the apps' run config "
                "checkpoint-key-file), or no checkpoint directory"
            )
        missing = [
            name
            for name in ("state_dict", "load_state_dict")
            if not callable(getattr(self.algorithm, name, None))
        ]
        if missing:
            raise AlgorithmContractError(
                f"{type(self.algorithm).__name__} cannot be checkpointed: it needs {missing}"
            )
        checkpoints = Checkpoints(options.checkpoint_dir, key=options.checkpoint_key)
        if self.encrypted_state is not None:  # [[V]] travels in the checkpoint, as ciphertexts
            self._checkpointed = EncryptedStateCheckpoint(
                self.algorithm,
                self.transport,
                checkpoints.directory,
                lambda: run_binding(options.fingerprint, self.seeds, self.result.rounds),
            )
        if options.resume and checkpoints.exists():
            start, history = checkpoints.restore(
                self._checkpointed,
                self.transport.view,
                self.seeds,
                options.fingerprint,
                ledgers=self.transport.privacy_ledgers(),
            )
            if start > options.rounds:
                raise CheckpointError(
                    f"{checkpoints.directory}: its next round {start} lies past this run's "
                    f"{options.rounds} rounds"
                )
            if self.encrypted_state is not None:  # [[V]] bound to this checkpoint's history
                self._checkpointed.install(
                    run_binding(options.fingerprint, self.seeds, history.rounds)
                )
            self.resumed_from = start
            self.result.resumed_from = start
            self.result.rounds = list(history.rounds)
            LOG.info("resumed from %s at round %d", checkpoints.directory, start)
        return checkpoints

    def _save(self, checkpoints: Checkpoints | None, done: int) -> None:
        if checkpoints is not None:
            checkpoints.save(
                done,
                self._checkpointed,
                self.transport.view,
                self.seeds,
                self.options.fingerprint,
                RunHistory(self.result.rounds),
                ledgers=self.transport.privacy_ledgers(),
            )

    def clients_of(self, round_id: int) -> np.ndarray:
        """Round ``round_id``'s sampled clients, drawn once from ``("sampling", round)`` (the
        next round's are needed early under ``advertise_ahead``; in secure mode a second draw
        would differ)."""
        if round_id not in self._sampled:
            self._sampled[round_id] = self.options.sampling.sample(
                self.algorithm.n_clients, self.seeds.generator("sampling", round_id)
            )
        return self._sampled[round_id]

    def _ahead_targets(self, round_id: int) -> tuple[dict[int, list[int]], dict[str, object]]:
        """Under ``advertise_ahead``: the nodes asked to advertise for round ``round_id + 1``
        with their Unmasking reply of ``round_id``, their users, and that request's config
        (``next.``-prefixed keys); nothing after the last round or while a client's host is
        unknown."""
        following = round_id + 1
        if not self.options.advertise_ahead or following >= self.options.rounds:
            return {}, {}
        clients = self.clients_of(following)
        if not all(int(c) in self.hosts for c in clients):
            return {}, {}
        config = {"round": following} | self.wire.node_config(len(clients))
        return _by_node(clients, self.hosts), {f"next.{k}": v for k, v in config.items()}

    # -- the run's nonces (malicious-server secure aggregation) ---------------------------
    @property
    def _signed_rounds(self) -> bool:
        """Whether the nodes sign the rounds (the malicious-server variant), so that the run
        needs its nonce transcript."""
        return self.wire.kind == "secagg" and self.wire.secagg.malicious

    def _collect_nonces(self, nodes: list[int]) -> None:
        """One message round per run (``query.secagg_nonce``): every node's fresh nonce,
        relayed to every node with each AdvertiseKeys request (:mod:`securefed.flower.freshness`).

        A federation keeps one registry across runs and every run counts its rounds from 0,
        so without it a signature of an earlier run's round would verify in this run's round of
        the same id. A resumed run is a new run: it collects fresh nonces (a fresh transcript).
        A node that gives none sits the run out (it is never asked to advertise).

        Raises:
            AggregationError: a malformed reply, or a node naming a member it does not host.
        """
        config = self._round_config(self.resumed_from) | {"wire": self.wire.kind}
        contents = {node: rec.content({}, config) for node in nodes}
        replies = self.messenger.exchange(NONCE, contents, self.resumed_from)
        for node, reply in sorted(replies.items()):
            with _malformed_refuses(self.resumed_from, node, NONCE):
                arrays = rec.message_arrays(reply)
                _learn_hosts(self.hosts, node, arrays["hosted"])
                if "member" not in arrays:
                    continue  # a node that hosts no user
                member = int(arrays["member"])
                relayed = freshness.relayed_nonces(arrays)
                if member != int(np.min(arrays["hosted"])) or list(relayed) != [member]:
                    raise AggregationError(
                        f"node {node} gave the run's nonce as member {sorted(relayed)[:3]} "
                        f"(named {member}); its member is its lowest hosted user"
                    )
                if len(relayed[member]) != freshness.NONCE_BYTES:
                    raise ValueError(f"a nonce of {len(relayed[member])} bytes")
            self.nonces[member] = relayed[member]
            self.nonce_nodes.add(node)
        LOG.info("run nonces from %d of %d node(s)", len(self.nonce_nodes), len(nodes))

    def _nonce_arrays(self, prefix: str = freshness.NONCE_PREFIX) -> dict[str, np.ndarray]:
        """The run's nonces for an AdvertiseKeys request (none outside the signed variant)."""
        return freshness.nonce_arrays(self.nonces, prefix) if self._signed_rounds else {}

    # -- one training round, plaintext wire (with or without DP) ----------------------
    def plain_round(self, round_id: int, clients: np.ndarray) -> dict[str, float]:
        rnd, active = self.algorithm.open_round(round_id, clients, self.transport, self.seeds)
        shared = _broadcast_arrays(self.algorithm)
        config = self._round_config(round_id) | self.wire.node_config(len(rnd.clients))
        groups = self._targets(active)
        contents = {
            node: _body(shared, {"clients": np.asarray(users, np.int64)}, config)
            for node, users in groups.items()
        }
        replies = self.messenger.exchange(TRAIN, contents, round_id)
        arrived: set[int] = set()
        parts = []
        active_set = {int(c) for c in active}
        for node, reply in sorted(replies.items()):
            with _malformed_refuses(round_id, node, TRAIN):
                arrays = rec.message_arrays(reply)
                _learn_hosts(self.hosts, node, arrays["hosted"])
                updates = rec.arrays_to_updates(arrays, "update.")
                stray = set(updates.clients.tolist()) - active_set
                if stray:
                    raise AggregationError(
                        f"node {node} sent updates for clients {sorted(stray)[:5]} outside the "
                        "round"
                    )
                if len(updates.clients):
                    self._submit_plain(rnd, updates)
            arrived.update(updates.clients.tolist())
            parts.append(_metrics(reply))
        _drop_missing(rnd, active, arrived)
        self.algorithm.close_round(rnd)
        return sum_metrics(parts)

    def _submit_plain(self, rnd: AggregationRound, updates: RowUpdates) -> None:
        if self.wire.client_noise:  # noised on the nodes: the DP round must not noise again
            _base_round(rnd).submit_batch(updates)
            _noised_by_clients(rnd, updates.clients, updates.client_weights() ** 2)
        else:
            rnd.submit_batch(updates)

    # -- one training round, secure aggregation over four message rounds -------------
    def secagg_round(self, round_id: int, clients: np.ndarray) -> dict[str, float]:
        """Secure aggregation with each node as ONE party (``SecAggRound.among_parties``).

        A node sums its users' encoded updates and masks the sum once, so the protocol's graph,
        keys, shares and threshold are the nodes': no node holds a share of anything that
        protects one user's update, and a node with the server learns the sum over the other
        nodes (the total minus its own), which with two nodes is the other node's sum.
        """
        secagg_config = self.wire.node_config(len(clients))
        # Stage 1, AdvertiseKeys: every node answers for the round's users it hosts, as one party
        # (``advertise_ahead``: most nodes already did, with their Unmasking reply of the round
        # before; a node asked ahead whose reply was lost sits this round out).
        groups = self._targets(clients)
        if self._signed_rounds:  # only the nodes in the run's nonce transcript advertise
            groups = {node: users for node, users in groups.items() if node in self.nonce_nodes}
        base = self._round_config(round_id) | secagg_config
        nonces = self._nonce_arrays()
        ahead = self._ahead.pop(round_id, {})
        asked_ahead = self._asked_ahead.pop(round_id, set())
        replies = {
            node: rec.message_arrays(reply)
            for node, reply in self.messenger.exchange(
                ADVERTISE,
                {
                    node: rec.content({"clients": np.asarray(users, np.int64)} | nonces, base)
                    for node, users in groups.items()
                    if node not in asked_ahead
                },
                round_id,
            ).items()
        } | {node: arrays for node, arrays in ahead.items() if node in groups}
        asked = {int(c) for c in clients}
        keys: dict[int, tuple[bytes, bytes]] = {}
        members: dict[int, list[int]] = {}
        party_node: dict[int, int] = {}
        for node, arrays in sorted(replies.items()):
            _learn_hosts(self.hosts, node, arrays["hosted"])
            users = sorted(int(u) for u in arrays["users"].tolist())
            if not users:
                continue
            self._check_users(node, users)
            stray = set(users) - asked
            party = int(arrays["party"]) if "party" in arrays else -1
            if stray or party != users[0]:
                raise AggregationError(
                    f"round {round_id}: node {node} must advertise one party, its lowest user "
                    f"of the round ({users[0]}), for its users of the round only"
                )
            [c_public], [s_public] = (rec.rows_bytes(arrays[k]) for k in ("c_public", "s_public"))
            advert: tuple[bytes, ...] = (c_public, s_public)
            if self.wire.secagg.malicious:
                if "signature" not in arrays:
                    raise SignatureError(
                        f"round {round_id}: node {node} advertised no signature, and this round "
                        "runs the malicious-server variant"
                    )
                advert += tuple(rec.rows_bytes(arrays["signature"]))
            keys[party], members[party], party_node[party] = advert, users, node
        advertised = np.array(sorted(u for users in members.values() for u in users), np.int64)
        rnd, active = self.algorithm.open_round(round_id, advertised, self.transport, self.seeds)
        secagg = _base_round(rnd)
        if not isinstance(secagg, SecAggRound):
            raise TypeError("the secagg wire needs SecAggRound rounds")
        if len(advertised) == 0:
            self.algorithm.close_round(rnd)
            return {}
        parties = secagg.among_parties(members)
        parties.receive_keys(keys)
        config = self._round_config(round_id) | self.wire.node_config(len(rnd.clients))
        shared = _broadcast_arrays(self.algorithm)
        dp_round = _dp_round(rnd)
        if self.wire.integer_mechanism and dp_round is not None:
            config |= mechanism_config(dp_round.mechanism)
            shared |= _shared_arrays({"ddp_signs": dp_round._signs})
        if self.options.merge_share_mask:
            parts, statements = self._share_mask(
                round_id, rnd, secagg, parties, party_node, active, shared, config
            )
        else:
            self._share(round_id, parties, party_node, config)
            parts, statements = self._mask(
                round_id, rnd, secagg, parties, party_node, active, shared, config
            )
        if self.wire.secagg.malicious:
            self._consistency(round_id, parties, party_node, config)
        self._unmask(round_id, parties, party_node, config, statements)
        self.algorithm.close_round(rnd)
        return sum_metrics(parts)

    def _check_party(self, node: int, party_node: Mapping[int, int], parties) -> int:
        [party] = [int(p) for p in parties] or [-1]
        if party_node.get(party) != node:
            raise AggregationError(f"node {node} answered for party {party}, which is not its own")
        return party

    def _share(
        self, round_id: int, parties: SecAggRound, party_node: Mapping[int, int], config: dict
    ) -> None:
        contents = {
            party_node[party]: rec.content(*_share_arrays(parties, party, config))
            for party in parties.clients.tolist()
        }
        for node, reply in sorted(self.messenger.exchange(SHARE, contents, round_id).items()):
            arrays = rec.message_arrays(reply)
            party = self._check_party(node, party_node, arrays["users"].tolist())
            parties.receive_shares(party, rec.rows_bytes(arrays["sealed"][0]))

    def _share_mask(
        self,
        round_id: int,
        rnd: AggregationRound,
        secagg: SecAggRound,
        parties: SecAggRound,
        party_node: Mapping[int, int],
        active: np.ndarray,
        shared: dict[str, Array],
        config: dict,
    ) -> tuple[list[dict[str, float]], dict[int, tuple[int, bytes]]]:
        """ShareKeys and MaskedInputCollection in ONE message round (``merge_share_mask``).

        Each node gets its ShareKeys request (neighbours, Shamir points, their ``c`` keys, and
        their ``s`` keys: signed in the malicious-server variant) with the broadcast and its
        computing users, and answers with its sealed shares and its masked sum at once, masked
        with every neighbour it shared with (the ``s`` keys it checked; a separate mask request
        would name the same neighbours, :meth:`SecAggRound.mask_request`). Why Bonawitz et al.
        (2017)'s argument still holds is in docs/flower.md ("Fewer message rounds"). The price:
        a node lost in this message round sent no shares, yet its neighbours masked with it,
        so the round is refused (with separate rounds a node lost before masking is a dropout
        the others recover from).

        Raises:
            AggregationError: a node with users in the round did not answer.
        """
        active_set = {int(c) for c in active}
        contents = {}
        for party in parties.clients.tolist():
            users = [u for u in sorted(secagg.party_members[party]) if u in active_set]
            arrays, share_config = _share_arrays(parties, party, config, with_s_keys=True)
            arrays |= {"clients": np.asarray(users, np.int64), "party": np.array(party, np.int64)}
            contents[party_node[party]] = _body(shared, arrays, share_config)
        replies = self.messenger.exchange(SHARE_MASK, contents, round_id)
        lost = sorted(party for party, node in party_node.items() if node not in replies)
        if lost:
            raise AggregationError(
                f"round {round_id}: party/parties {lost[:5]} (node(s) "
                f"{[party_node[p] for p in lost[:5]]}) did not answer ShareKeys+MaskedInput: "
                "their neighbours masked with them, and without their shares those masks "
                "cannot be removed; the round is refused (merge_share_mask trades this dropout "
                "for one message round)"
            )
        masked_replies = {}
        for node, reply in sorted(replies.items()):
            arrays = rec.message_arrays(reply)
            party = self._check_party(node, party_node, [int(arrays.get("party", -1))])
            with _malformed_refuses(round_id, node, SHARE_MASK):
                parties.receive_shares(party, rec.rows_bytes(arrays["sealed"][0]))
            if "masked" in arrays:
                masked_replies[node] = reply
        computing = _computing_users(secagg, parties, active_set)
        return self._receive_masked(
            round_id, rnd, secagg, parties, party_node, active, computing, masked_replies
        )

    def _mask(
        self,
        round_id: int,
        rnd: AggregationRound,
        secagg: SecAggRound,
        parties: SecAggRound,
        party_node: Mapping[int, int],
        active: np.ndarray,
        shared: dict[str, Array],
        config: dict,
    ) -> tuple[list[dict[str, float]], dict[int, tuple[int, bytes]]]:
        """MaskedInputCollection; returns the metric sums and, in the malicious-server variant,
        each party's signed member count ``party -> (count, signature)``."""
        computing = _computing_users(secagg, parties, {int(c) for c in active})
        contents = {}
        for party, users in sorted(computing.items()):
            if not users:
                continue  # none of its users computes: the party counts as dropped
            request = parties.mask_request(party)
            contents[party_node[party]] = _body(
                shared,
                {
                    "clients": np.asarray(users, np.int64),
                    "party": np.array(party, np.int64),
                    "neighbours": np.array([request.neighbours], np.int64),
                    "s_publics": rec.bytes_rows(request.s_publics, kx.PUBLIC_KEY_BYTES)[None],
                },
                config,
            )
        replies = self.messenger.exchange(MASK, contents, round_id)
        return self._receive_masked(
            round_id, rnd, secagg, parties, party_node, active, computing, replies
        )

    def _receive_masked(
        self,
        round_id: int,
        rnd: AggregationRound,
        secagg: SecAggRound,
        parties: SecAggRound,
        party_node: Mapping[int, int],
        active: np.ndarray,
        computing: Mapping[int, list[int]],
        replies: Mapping[int, Message],
    ) -> tuple[list[dict[str, float]], dict[int, tuple[int, bytes]]]:
        """The nodes' masked sums into the party round; the parties that sent none drop."""
        arrived: set[int] = set()
        parts = []
        statements: dict[int, tuple[int, bytes]] = {}
        for node, reply in sorted(replies.items()):
            arrays = rec.message_arrays(reply)
            party = self._check_party(node, party_node, [int(arrays["party"])])
            users = arrays["users"]
            if len(users) == 0 or not set(users.tolist()) <= set(computing[party]):
                raise AggregationError(
                    f"round {round_id}: node {node}'s masked sum must cover users it was asked "
                    f"to compute, got {users[:5].tolist()}"
                )
            with _malformed_refuses(round_id, node, MASK):
                [masked] = arrays["masked"]
                weighted = bool(arrays["weighted"])
                secagg.receive_party_masked(party, users, masked, weighted=weighted)
            if self.wire.client_noise:
                _noised_by_clients(rnd, users, arrays["weight_sq"])
            if self.wire.secagg.malicious:
                if "members_signature" not in arrays:
                    raise SignatureError(
                        f"round {round_id}: node {node}'s masked sum carries no signed member "
                        "count, and this round runs the malicious-server variant"
                    )
                [signature] = rec.rows_bytes(arrays["members_signature"])
                statements[party] = (len(users), signature)
            arrived.update(users.tolist())
            parts.append(_metrics(reply))
        for party in parties.clients.tolist():
            if party not in parties.submitted and party not in parties.dropped:
                parties.drop(party)
        _drop_missing(rnd, active, arrived)
        return parts, statements

    def _consistency(
        self, round_id: int, parties: SecAggRound, party_node: Mapping[int, int], config: dict
    ) -> None:
        """ConsistencyCheck (malicious-server variant): every helper signs the survivor set."""
        _check_two_uploads(round_id, parties)
        requests = parties.consistency_requests()
        contents = {
            party_node[helper]: rec.content(
                {
                    "helpers": np.array([helper], np.int64),
                    "survivors": np.asarray(sorted(survivors), np.int64),
                },
                config,
            )
            for helper, survivors in requests.items()
        }
        signatures = {}
        for node, reply in sorted(self.messenger.exchange(CONSISTENCY, contents, round_id).items()):
            arrays = rec.message_arrays(reply)
            helper = self._check_party(node, party_node, arrays["helpers"].tolist())
            [signatures[helper]] = rec.rows_bytes(arrays["signature"])
        for helper in requests:
            if helper not in signatures and helper not in parties.dropped:
                parties.drop(helper)  # lost after masking: still in the sum, asked no more
        parties.receive_consistency(signatures)

    def _unmask(
        self,
        round_id: int,
        parties: SecAggRound,
        party_node: Mapping[int, int],
        config: dict,
        statements: Mapping[int, tuple[int, bytes]],
    ) -> None:
        _check_two_uploads(round_id, parties)
        requests = parties.unmask_requests()
        next_groups, next_config = self._ahead_targets(round_id)
        contents = {}
        for helper, request in requests.items():
            if helper in parties.dropped:
                continue
            inbox = request.inbox
            arrays = {
                "helpers": np.array([helper], np.int64),
                "indptr": np.array([0, len(inbox)], np.int64),
                "senders": np.asarray(list(inbox), np.int64),
                "blobs": rec.bytes_rows(list(inbox.values()), SEALED_SHARE_BYTES),
                "contributors": np.asarray(sorted(request.contributors), np.int64),
            }
            if self.wire.secagg.malicious:
                told = sorted(request.contributors)
                arrays |= {
                    "signers": np.asarray(list(request.signatures), np.int64),
                    "signatures": rec.bytes_rows(
                        list(request.signatures.values()), SIGNATURE_BYTES
                    ),
                    "member_parties": np.asarray(told, np.int64),
                    "member_counts": np.asarray([statements[p][0] for p in told], np.int64),
                    "member_signatures": rec.bytes_rows(
                        [statements[p][1] for p in told], SIGNATURE_BYTES
                    ),
                }
            node = party_node[helper]
            if node in next_groups:  # advertise_ahead: the next round's AdvertiseKeys too
                arrays["next.clients"] = np.asarray(next_groups[node], np.int64)
                arrays |= self._nonce_arrays("next." + freshness.NONCE_PREFIX)
                contents[node] = rec.content(arrays, config | next_config)
            else:
                contents[node] = rec.content(arrays, config)
        asked_ahead = {node for node in contents if node in next_groups}
        if asked_ahead:
            self._asked_ahead[round_id + 1] = asked_ahead
        responses: dict[int, dict[int, tuple[str, int]]] = {}
        for node, reply in sorted(self.messenger.exchange(UNMASK, contents, round_id).items()):
            arrays = rec.message_arrays(reply)
            following = {k[5:]: v for k, v in arrays.items() if k.startswith("next.")}
            if node in asked_ahead and following:
                self._ahead.setdefault(round_id + 1, {})[node] = following
            helper = self._check_party(node, party_node, arrays["helpers"].tolist())
            shares = rec.rows_bytes(arrays["shares"])
            responses[helper] = {
                int(owner): ("b" if kind == 0 else "s", shamir.decode_share(share))
                for owner, kind, share in zip(
                    arrays["owners"].tolist(), arrays["kinds"].tolist(), shares, strict=True
                )
            }
        for helper in requests:
            if helper not in responses and helper not in parties.dropped:
                parties.drop(helper)  # dropped after submitting: still counted, its shares missing
        parties.receive_reveals(responses)

    # -- one training round, CKKS: the nodes encrypt, a key-holder node decrypts the sum ----
    def ckks_round(self, round_id: int, clients: np.ndarray) -> dict[str, float]:
        """CKKS: the nodes clip/noise (DP around CKKS) and encrypt, the server adds the
        ciphertexts, the ledger is charged, a key-holder node decrypts the sum."""
        outer, active = self.algorithm.open_round(round_id, clients, self.transport, self.seeds)
        rnd = _base_round(outer)
        if not isinstance(rnd, CKKSRound):
            raise TypeError("the ckks wire needs CKKSRound rounds")
        shared = _broadcast_arrays(self.algorithm)
        config = self._round_config(round_id) | self.wire.node_config(len(rnd.clients))
        contents = {
            node: _body(shared, {"clients": np.asarray(users, np.int64)}, config)
            for node, users in self._targets(active).items()
        }
        arrived: set[int] = set()
        parts = []
        active_set = {int(c) for c in active}
        for node, reply in sorted(self.messenger.exchange(CKKS_TRAIN, contents, round_id).items()):
            arrays = rec.message_arrays(reply)
            _learn_hosts(self.hosts, node, arrays["hosted"])
            if bool(rec.message_config(reply).get("ckks_key_holder", False)):
                self.key_holder_nodes.add(node)
            users = arrays["users"].tolist()
            stray = set(users) - active_set
            if stray:
                raise AggregationError(
                    f"node {node} sent ciphertexts for clients {sorted(stray)[:5]} outside the "
                    "round"
                )
            weighted = bool(arrays["weighted"])
            for user, ciphertexts in zip(users, arrays_to_ciphertexts(arrays), strict=True):
                rnd.receive_ciphertexts(int(user), ciphertexts, weighted=weighted)
            if self.wire.client_noise:
                _noised_by_clients(outer, arrays["users"], arrays["weight_sq"])
            arrived.update(users)
            parts.append(_metrics(reply))
        _drop_missing(outer, active, arrived)
        dp_round = _dp_round(outer)
        if dp_round is not None and self.wire.dp.placement == "distributed":
            dp_round.charge_release()  # before the key holder decrypts: the release
        if self.encrypted_state is None:
            self._ckks_decrypt(round_id, rnd, config)
        self.algorithm.close_round(outer)  # under an encrypted state: folds the sum, decrypts none
        return sum_metrics(parts)

    def _encrypt_initial_state(self, nodes: list[int]) -> None:
        """Before the first round: a key-holder node encrypts the initial state, one message
        round (``query.ckks_encrypt_state``); the server keeps the ciphertexts only.

        In the shared key model the server cannot encrypt (symmetric encryption), and holding
        the initial matrix would let it follow ``[[V]]``'s plaintext from public seeds; the
        node encrypts its own initial draw (``initial_state``), as a key holder does in one
        process (:func:`~securefed.transport.ckks.encrypt_state`). The nodes are asked lowest id
        first until one answers.

        Raises:
            AggregationError: no node answered.
        """
        if self.algorithm.encrypted_state is not None:
            return
        config = self._round_config(self.resumed_from) | self.wire.node_config(0)
        for node in sorted(nodes):
            replies = self.messenger.exchange(
                CKKS_ENCRYPT_STATE, {node: rec.content({}, config)}, self.resumed_from
            )
            if node in replies:
                with _malformed_refuses(self.resumed_from, node, CKKS_ENCRYPT_STATE):
                    arrays = rec.message_arrays(replies[node])
                    [ciphertexts] = arrays_to_ciphertexts(arrays)
                    shape = tuple(int(n) for n in arrays["shape"])
                    state = self.transport.encrypted_state_from(ciphertexts, shape)
                self.algorithm.load_encrypted_state(state)
                return
        raise AggregationError(
            f"no CKKS key-holder node encrypted the initial state (asked nodes {sorted(nodes)}); "
            "the server cannot encrypt it itself"
        )

    def _ckks_decrypt(self, round_id: int, rnd: CKKSRound, config: dict) -> None:
        """Stage 3 over one more message round: a key-holder node decrypts the summed ciphertexts.

        Shared key model: the node hosting the round's decryptor (the lowest surviving
        contributor, as in one process), then any other node hosting a contributor if it fails.
        Committee: the nodes that announced holding the key, lowest id first.

        Raises:
            AggregationError: no key-holder node answered.
        """
        request = rnd.decryption_request()
        if request is None:
            return
        if request.decryptor is not None:
            first = self.hosts[request.decryptor]
            others = {self.hosts[c] for c in rnd.submitted if c not in rnd.dropped} - {first}
            candidates = [first, *sorted(others)]
        else:
            candidates = sorted(self.key_holder_nodes)
        arrays = {"length": np.array(request.length, np.int64)}
        arrays |= ciphertexts_to_arrays([request.summed])
        flooding = self.wire.ckks.flooding
        body_config = config | {"flood_std": flooding.std, "round_step": flooding.step}
        for node in candidates:
            replies = self.messenger.exchange(
                CKKS_DECRYPT, {node: rec.content(arrays, body_config)}, round_id
            )
            if node in replies:
                rnd.receive_decryption(rec.message_arrays(replies[node])["values"])
                return
        raise AggregationError(
            f"round {round_id}: no CKKS key holder answered the decryption request (asked nodes "
            f"{candidates}); the server cannot decrypt the sum itself"
        )

    def _targets(self, clients: np.ndarray) -> dict[int, list[int]]:
        """Which node hears about which clients: their hosts once known, else every node hears
        the whole list and answers for the users it hosts (the first round)."""
        ids = [int(c) for c in clients]
        if all(c in self.hosts for c in ids):
            return _by_node(ids, self.hosts)
        return {node: ids for node in self.messenger.nodes()}

    def _check_users(self, node: int, users: np.ndarray) -> None:
        foreign = [int(u) for u in users if self.hosts.get(int(u)) != node]
        if foreign:
            raise AggregationError(f"node {node} answered for users {foreign[:5]} it does not host")

    # -- evaluation and the loop ---------------------------------------------------------
    def evaluate(self, round_id: int) -> dict[str, float]:
        shared = _broadcast_arrays(self.algorithm)
        nodes = sorted(set(self.hosts.values())) or self.messenger.nodes()
        contents = {node: _body(shared, {}, self._round_config(round_id)) for node in nodes}
        replies = self.messenger.exchange(EVALUATE, contents, round_id)
        sums = sum_metrics([_metrics(r) for r in replies.values()])
        fn = self.setup.evaluation_metrics
        metrics = fn(sums) if fn is not None else sums
        return {"round": float(round_id), "nodes": float(len(replies))} | metrics

    def run(self) -> FlowerRunResult:
        options = self.options
        checkpoints = self._checkpoints()  # a refused checkpoint fails before any node is asked
        nodes = wait_for_nodes(
            self.messenger.grid, options.min_nodes, options.connect_timeout, options.poll_interval
        )
        self.result.nodes = len(nodes)
        if self.encrypted_state is not None:
            self._encrypt_initial_state(nodes)
        if self._signed_rounds and self.resumed_from < options.rounds:
            self._collect_nonces(nodes)
        for round_id in range(self.resumed_from, options.rounds):
            start = time.perf_counter()
            clients = self.clients_of(round_id)
            if self.wire.kind == "secagg":
                sums = self.secagg_round(round_id, clients)
            elif self.wire.kind == "ckks":
                sums = self.ckks_round(round_id, clients)
            else:
                sums = self.plain_round(round_id, clients)
            fn = self.setup.train_metrics
            metrics = dict(fn(sums) if fn is not None else sums)
            metrics |= {
                "round": round_id,
                "clients": len(clients),
                "seconds": time.perf_counter() - start,
            }
            self.result.rounds.append(metrics)
            self._save(checkpoints, round_id + 1)  # before anything else can fail
            if self.setup.on_round is not None:
                self.setup.on_round(round_id, metrics)
            last = round_id == options.rounds - 1
            every = options.evaluate_every
            if last or (every and (round_id + 1) % every == 0):
                self.result.evaluations.append(self.evaluate(round_id))
        if options.rounds == 0:
            self.result.evaluations.append(self.evaluate(-1))
        elif self.resumed_from == options.rounds:  # every round was done before the crash
            self.result.evaluations.append(self.evaluate(options.rounds - 1))
        return self.result


def _metrics(reply: Message) -> dict[str, float]:
    config = rec.message_config(reply)
    return {
        key[len("metric.") :]: float(value)
        for key, value in config.items()
        if key.startswith("metric.")
    }


def run_federation(grid: Grid, setup: ServerSetup) -> FlowerRunResult:
    """Run ``setup.options.rounds`` rounds of ``setup.algorithm`` over the nodes of ``grid``.

    Returns:
        Per-round metrics, the held-out evaluations, and the message bytes.

    Raises:
        TimeoutError: too few SuperNodes connected.
        AggregationError: the transport could not produce a round's aggregate (e.g. too many
            nodes dropped for secure aggregation to unmask).
    """
    result = _Run(grid, setup).run()
    if setup.on_finish is not None:
        setup.on_finish(result)
    return result


def make_server_app(setup: Callable[[Context], ServerSetup]) -> ServerApp:
    """A Flower ``ServerApp`` whose ``main`` runs :func:`run_federation` with ``setup(context)``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_federation(grid, setup(context))

    return app
