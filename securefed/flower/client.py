"""The client half on Flower: a ClientApp that runs the users a SuperNode hosts.

:func:`make_client_app` wraps a factory of :class:`ClientSetup` (the node's
:class:`~securefed.flower.protocol.ClientNode` and its seed tree) into a
``flwr.clientapp.ClientApp`` that answers the server's messages (:mod:`securefed.flower.server`):

* ``train``: compute the updates of the round's clients hosted here from the broadcast; under
  local or distributed DP clip and noise them here (:mod:`securefed.flower.dp`), before they leave;
  reply with them as arrays.
* ``query.secagg_nonce``: once per run (malicious-server variant), the node's fresh nonce; every
  AdvertiseKeys request relays every node's, the node checks its own is in its place and signs
  every message of the run over their digest (:mod:`securefed.flower.freshness`).
* ``query.secagg_advertise`` / ``query.secagg_share`` / ``train.secagg_mask`` /
  ``query.secagg_consistency`` / ``query.secagg_unmask``: the client's side of each stage of
  secure aggregation (malicious-server variant: signed with the party user's long-term identity,
  checked against the registry the node pinned), with the node as ONE party (one
  :class:`~securefed.transport.secagg.SecAggClient`, its id the node's lowest user of the
  round): it uploads the masked sum of its users' encoded updates, so no other node holds a
  share of anything that protects one user's update (docs/flower.md). Its secrets, and the stage
  it answered, stay in the node's Flower ``Context.state`` between the messages (Flower keeps
  that state on the node; it is never sent), so it answers each stage once; they are deleted
  after unmasking. A failed check answers with a refusal (``records.REFUSAL``), which refuses
  the round, and deletes the round's secrets.
* ``train.ckks`` / ``query.ckks_decrypt``: compute the hosted users' updates and encrypt them
  here with the node's CKKS keys (:mod:`securefed.flower.ckks`); a key-holder node decrypts the
  server's summed ciphertexts, floods and rounds them, and returns only those values.
* ``evaluate``: held-out metric sums of the hosted users.

Before any of its data leaves, a node checks the round's parameters against its own floors
(:mod:`securefed.flower.floors`: threat model, colluder bound, threshold, DP noise and clip) and
refuses a weaker round, naming the parameter.

The node's own state (e.g. FedMF's user vectors) is restored from ``Context.state`` before each
message and saved after it, so a node survives Flower starting a fresh ClientApp process per
message (the deployment engine does).

A node started with a journal (node config ``state-dir``, :mod:`securefed.flower.journal`) also
writes its state and the round to its own disk after each round it released, continues from
there in a later run of the same configuration (a server resumed from its checkpoint), and
refuses any stage of a round at or before the last one it released, whoever asks. A node
without one refuses a round of a resumed run (``resumed_from`` in the message config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from securefed.crypto import keys as kx
from securefed.crypto import shamir
from securefed.crypto.ckks import ContextMismatchError, Flooding
from securefed.errors import AggregationError, AlgorithmContractError, SecurefedError
from securefed.flower import freshness
from securefed.flower import records as rec
from securefed.flower.ckks import NodeKeys, arrays_to_ciphertexts
from securefed.flower.dp import integers_on_client, mechanism_from_config, noise_on_client
from securefed.flower.floors import NodeFloors
from securefed.flower.identity import NodeIdentity, members_message
from securefed.flower.journal import STATE_DIR_KEY, NodeJournal
from securefed.flower.protocol import ClientNode
from securefed.randomness import SeedTree
from securefed.transport.base import RowUpdates
from securefed.transport.ckks import encrypted_names
from securefed.transport.ddp import DistributedIntegerMechanism
from securefed.transport.dp import clip_row_updates
from securefed.transport.secagg import (
    SecAggClient,
    SecAggConfig,
    encode_input,
    masking_workspace,
    pack_values,
    rounding_key,
)
from securefed.transport.secagg.signatures import (
    SIGNATURE_BYTES,
    ConsistencyError,
    SignatureError,
)

NODE_STATE = "securefed.node"
SECAGG_STATE = "securefed.secagg"
RUN_STATE = "securefed.secagg.run"
"""The node's part of the run's nonce transcript (its nonce, its member id, the transcript it
checked): kept for the whole run, unlike the round's secrets (``SECAGG_STATE``)."""
PURPOSE_SECAGG_NONCES = b"flower-secagg-nonces"
"""The purpose of secure aggregation's nonce transcript (:func:`run_transcript`)."""


@dataclass
class ClientSetup:
    """What a node needs for a message, built from its Flower ``Context``.

    Attributes:
        node: the users this node hosts and their algorithm (the client half).
        seeds: the node's seed tree (seeded for tests and benchmarks; ``SeedTree.secure_mode()``
            in deployment, so that keys, masks and noise come from the OS).
        update_shape: ``(n_rows, width)`` of one user's update (to shape an empty reply).
        on_evaluate: called with the node after an evaluation (e.g. to save its state to the
            node's own disk).
        ckks: the node's CKKS keys (loaded from files provisioned out of band), when the
            server's transport is CKKS.
        identity: the long-term identities of the hosted users and the key registry checked
            against the digest pinned at enrolment (:mod:`securefed.flower.identity`): what the
            malicious-server variant of secure aggregation signs and verifies with. A factory,
            called only when a round needs it.
        floors: the node's own privacy floors (:mod:`securefed.flower.floors`): a round whose
            parameters are weaker is refused, naming the parameter.
        journal: the node's journal on its own disk (:mod:`securefed.flower.journal`; node
            config ``state-dir``): its state across runs, and the rounds it already released,
            which it refuses to answer again. ``None``: the state lives in the run's Flower
            ``Context`` only, and a run the server resumed from a checkpoint is refused.
    """

    node: ClientNode
    seeds: SeedTree
    update_shape: tuple[int, int]
    on_evaluate: Callable[[ClientNode], None] | None = None
    ckks: NodeKeys | None = None
    identity: Callable[[], NodeIdentity] | None = None
    floors: NodeFloors = field(default_factory=NodeFloors)
    journal: NodeJournal | None = None

    def node_identity(self) -> NodeIdentity:
        """The hosted users' identities.

        Raises:
            SignatureError: the node was started without them.
        """
        if self.identity is None:
            raise SignatureError(
                "the server runs the malicious-server variant of secure aggregation, but this "
                "node has no long-term identities: provision them "
                "(securefed.flower.identity.provision_identities) and give the node "
                "secagg-identity-path, secagg-registry-path and secagg-registry-digest"
            )
        return self.identity()


# ----------------------------------------------------------------------------- node state
def _load_node(context: Context, node: ClientNode, journal: NodeJournal | None = None) -> None:
    """The node's state: this run's (its ``Context``), else its journal's (a resumed run)."""
    if NODE_STATE in context.state:
        node.load_state_dict(rec.record_arrays(context.state[NODE_STATE]))
    elif journal is not None and (state := journal.state()) is not None:
        node.load_state_dict(state)


def _check_resumable(setup: ClientSetup, context: Context, config: Mapping, stage: str) -> None:
    """Before any stage of a round: refuse a round this node already released (its journal),
    and a resumed run's round on a node that kept no state across runs.

    Raises:
        RoundReplayError: the journal holds this round or a later one.
        AggregationError: the server resumed the run and this node has no journal.
    """
    round_id = int(config["round"])
    if setup.journal is not None:
        setup.journal.check_fresh(round_id, stage)
        return
    resumed = int(config.get(RESUMED_FROM, 0))
    if resumed > 0 and NODE_STATE not in context.state:
        raise AggregationError(
            f"the server resumed this run at round {resumed} from its checkpoint, but this node "
            f"keeps no state across runs: start it with --node-config '{STATE_DIR_KEY}=<dir>' "
            "(its journal), or the round would start from fresh user state"
        )


RESUMED_FROM = "resumed_from"
"""The message config entry: the round the server resumed the run from (0: not resumed)."""


def _save_node(context: Context, node: ClientNode) -> None:
    context.state[NODE_STATE] = rec.arrays_record(node.state_dict())


def _broadcast(
    arrays: Mapping[str, np.ndarray], keys: NodeKeys | None = None
) -> dict[str, np.ndarray]:
    """The broadcast of a message; an encrypted server state in it (``name.ct_*``: FedMF's
    ``[[V]]`` under ``server_state="encrypted"``) decrypted here with the node's secret key.

    Raises:
        ContextMismatchError: an encrypted state and no secret key on this node.
    """
    prefix = "broadcast."
    broadcast = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    if encrypted_names(broadcast):
        if keys is None:
            raise ContextMismatchError(
                "the broadcast holds an encrypted server state, and this node has no CKKS keys: "
                "give it ckks-secret-path (the users' shared key)"
            )
        return keys.open_broadcast(broadcast)
    return broadcast


def _hosted(node: ClientNode, clients: np.ndarray) -> np.ndarray:
    """The round's clients that this node hosts, sorted."""
    return np.intersect1d(np.asarray(clients, np.int64), np.asarray(node.users, np.int64))


def _reply(request: Message, arrays: Mapping[str, np.ndarray], config: Mapping) -> Message:
    return Message(rec.content(arrays, config), reply_to=request)


def _metric_config(metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"metric.{k}": float(v) for k, v in metrics.items()}


def _train(
    setup: ClientSetup, context: Context, arrays: Mapping[str, np.ndarray], round_id: int
) -> tuple[RowUpdates, dict[str, float]]:
    """The node's users compute their updates (state restored before, saved after, and in
    the journal with the round: the node releases this round once)."""
    node = setup.node
    _load_node(context, node, setup.journal)
    clients = _hosted(node, arrays["clients"])
    batches, metrics = (
        node.train(round_id, clients, _broadcast(arrays, setup.ckks), setup.seeds)
        if len(clients)
        else ([], {})
    )
    _save_node(context, node)
    if setup.journal is not None:
        setup.journal.record(round_id, node.state_dict())
    return rec.concat_updates(batches, *setup.update_shape), metrics


def _client_dp(
    updates: RowUpdates,
    config: Mapping[str, object],
    round_id: int,
    seeds: SeedTree,
    mechanism: DistributedIntegerMechanism | None = None,
    signs: np.ndarray | None = None,
) -> RowUpdates:
    """Clip (and noise) on the node when the server's transport asks for it; under an integer
    mechanism, each user's rotated, rounded, noised integer vector (``(1, D)`` blocks)."""
    if "dp_clip" not in config or len(updates.clients) == 0:
        return updates
    if mechanism is not None:
        return integers_on_client(updates, mechanism, signs, round_id, seeds)
    clip, std = float(config["dp_clip"]), float(config["dp_std"])
    if std > 0:
        return noise_on_client(
            updates,
            clip=clip,
            std=std,
            round_id=round_id,
            seeds=seeds,
            secure=bool(config.get("dp_secure", False)),
        )
    return clip_row_updates(updates, clip)[0]


def _plain_train(setup: ClientSetup, context: Context, message: Message) -> Message:
    """The plaintext wire: the users' updates, clipped and noised here under local or
    distributed DP (after the node checked the DP parameters against its floors)."""
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    setup.floors.check_dp(config, None)
    _check_resumable(setup, context, config, "train")
    round_id = int(config["round"])
    updates, metrics = _train(setup, context, arrays, round_id)
    updates = _client_dp(updates, config, round_id, setup.seeds)
    reply = rec.updates_to_arrays(updates, "update.")
    reply["hosted"] = np.asarray(setup.node.users, np.int64)
    return _reply(message, reply, _metric_config(metrics))


# ----------------------------------------------------------------------------- secure aggregation
DP_SHARES = "dp_shares"
"""The secrets record's entry: the contributors the node's noise share was calibrated for."""


def _load_secrets(context: Context, round_id: int) -> dict[int, dict[str, bytes]]:
    """The hosted users' secrets of round ``round_id`` from the node's state.

    Raises:
        AggregationError: the node holds no secrets of this round (it did not advertise in it).
    """
    record = context.state.get(SECAGG_STATE)
    if record is None or int(record.get("round", -1)) != round_id:
        raise AggregationError(
            f"this node holds no secure-aggregation secrets for round {round_id}: it did not "
            "advertise keys in that round"
        )
    if "refused" in record:
        raise AggregationError(
            f"this node refused round {round_id} ({record['refused']}) and answers no later "
            "stage of it"
        )
    secrets: dict[int, dict[str, bytes]] = {}
    for key, value in record.items():
        if "." not in key:  # the round, and the node's own notes (DP_SHARES)
            continue
        party, name = key.split(".", 1)
        secrets.setdefault(int(party), {})[name] = bytes(value)
    return secrets


def _save_secrets(
    context: Context,
    round_id: int,
    clients: Mapping[int, SecAggClient],
    notes: Mapping[str, object] | None = None,
) -> None:
    """Keep the clients' secrets (and the stage each answered) in the node's state, with the
    saved entries of the round kept and ``notes`` added."""
    values: dict[str, object] = {"round": round_id}
    saved = context.state.get(SECAGG_STATE)
    if saved is not None and int(saved.get("round", -1)) == round_id:
        for key, value in saved.items():
            values[key] = value
    values |= dict(notes or {})
    for user, client in clients.items():
        for name, data in client.export_secrets().items():
            values[f"{user}.{name}"] = data
    context.state[SECAGG_STATE] = ConfigRecord(values)


def _party_client(
    setup: ClientSetup,
    party: int,
    round_id: int,
    config: SecAggConfig,
    secrets: dict[str, bytes] | None = None,
    run: bytes = b"",
) -> SecAggClient:
    """The node's party client: with the party user's identity, the pinned registry and the
    run's nonce transcript (``run``, which every signature binds) in the malicious-server
    variant."""
    signer = registry = None
    if config.malicious:
        identity = setup.node_identity()
        signer, registry = identity.signer(party), identity.registry
    return SecAggClient(
        party,
        round_id,
        config,
        setup.seeds,
        secrets=secrets,
        signer=signer,
        registry=registry,
        run=run if config.malicious else b"",
    )


# ----------------------------------------------------------------------------- the run's nonces
def _member(setup: ClientSetup) -> int | None:
    """The node's member id in the run's nonce transcript: its lowest hosted user (``None``:
    it hosts none, and takes no part)."""
    users = np.asarray(setup.node.users, np.int64)
    return int(users.min()) if users.size else None


def _nonce(setup: ClientSetup, context: Context, message: Message) -> Message:
    """The node's fresh nonce for this run (``query.secagg_nonce``, once per run, before the
    first AdvertiseKeys of the malicious-server variant): every signature the node makes in the
    run binds the transcript of every node's nonce (:mod:`securefed.flower.freshness`).

    Secure mode draws it from the OS; seeded mode from ``("flower-secagg", "nonce", member,
    resumed_from)``, so a seeded run resumed from a checkpoint gets another transcript too.

    Raises:
        SignatureError: the node already gave this run its nonce (a second one would let the
            server choose which transcript the node signs).
    """
    config = rec.message_config(message)
    hosted = np.asarray(setup.node.users, np.int64)
    member = _member(setup)
    if member is None:
        return _reply(message, {"hosted": hosted}, {})
    if RUN_STATE in context.state:
        raise SignatureError(
            f"node {member} already gave this run's secure aggregation its nonce and was asked "
            "again; refusing (one nonce per node and run)"
        )
    resumed = int(config.get(RESUMED_FROM, 0))
    nonce = freshness.fresh_nonce(setup.seeds, "flower-secagg", "nonce", member, resumed)
    context.state[RUN_STATE] = ConfigRecord({"member": member, "nonce": nonce})
    reply = {"hosted": hosted, "member": np.array(member, np.int64)}
    return _reply(message, reply | freshness.nonce_arrays({member: nonce}), {})


def run_transcript(nonces: Mapping[int, bytes]) -> bytes:
    """The digest of the run's nonces under secure aggregation's purpose
    (:func:`securefed.flower.freshness.nonce_transcript`)."""
    return freshness.nonce_transcript(nonces, PURPOSE_SECAGG_NONCES)


def _checked_run(context: Context, arrays: Mapping[str, np.ndarray]) -> bytes:
    """At AdvertiseKeys: the transcript of the nonces the request relays, once the node checked
    them (its own in its place, distinct, :func:`~securefed.flower.freshness.checked_nonces`)
    and that it is the one it advertised under earlier in the run, if any.

    Raises:
        SignatureError: no nonce given this run, the relayed nonces refused, or another
            transcript than the one the node already signed over.
    """
    run = context.state.get(RUN_STATE)
    if run is None or "nonce" not in run:
        raise SignatureError(
            "this node was asked to advertise keys before giving this run its nonce (its signed "
            "advertisement binds every node's nonce of the run: query.secagg_nonce); refusing"
        )
    member = int(run["member"])
    checked = freshness.checked_nonces(
        member, bytes(run["nonce"]), freshness.relayed_nonces(arrays), member="node (lowest user)"
    )
    transcript = run_transcript(checked)
    if "transcript" in run and bytes(run["transcript"]) != transcript:
        raise SignatureError(
            f"node {member} already signed this run's advertisements over other nonces than the "
            "server relays now (two transcripts in one run); refusing"
        )
    context.state[RUN_STATE] = ConfigRecord(dict(run) | {"transcript": transcript})
    return transcript


def _stored_run(context: Context, round_id: int) -> bytes:
    """The run's transcript the node checked at its AdvertiseKeys (later stages sign and check
    over it).

    Raises:
        SignatureError: the node checked none (it did not advertise in this run).
    """
    run = context.state.get(RUN_STATE)
    if run is None or "transcript" not in run:
        raise SignatureError(
            f"round {round_id}: this node holds no nonce transcript of this run (it did not "
            "advertise keys in it); refusing"
        )
    return bytes(run["transcript"])


def _restore_party(
    setup: ClientSetup, context: Context, parties, round_id: int, config: SecAggConfig
) -> tuple[int, SecAggClient]:
    """The node's one party client of the round (the server may ask only for that one).

    Raises:
        AggregationError: not exactly the node's own party.
    """
    secrets = _load_secrets(context, round_id)
    own = sorted(secrets)
    asked = [int(p) for p in parties]
    if asked != own or len(own) != 1:
        raise AggregationError(
            f"this node is one party of round {round_id} ({own}); the server asked for {asked[:5]}"
        )
    [party] = own
    run = _stored_run(context, round_id) if config.malicious else b""
    return party, _party_client(setup, party, round_id, config, secrets[party], run)


def _check_not_advertised(context: Context, round_id: int) -> None:
    """Refuse a second AdvertiseKeys in a round whose secrets this node holds.

    Fresh clients would start the stages over: in seeded mode with the same keys and self-mask
    seeds, so the server could have them mask and unmask a second time.

    Raises:
        AggregationError: naming the round.
    """
    record = context.state.get(SECAGG_STATE)
    if record is not None and int(record.get("round", -1)) == round_id:
        raise AggregationError(
            f"this node already advertised keys in round {round_id} (its users are in that round "
            "now): a user answers each stage once, so a second AdvertiseKeys is refused"
        )


def _advertise(setup: ClientSetup, context: Context, message: Message) -> Message:
    """AdvertiseKeys for the node as ONE party: its id is the lowest of its users in the round.

    Every hosted user of the round is a member of that party: the node sums their encoded
    updates and masks the sum once, so no other node ever holds a share of anything that
    protects a single user's update (issue 17 item 5; docs/flower.md). In the malicious-server
    variant the advertisement is signed with the party user's long-term key.
    """
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    return _reply(message, _advertisement(setup, context, arrays, config), {})


def _advertisement(
    setup: ClientSetup, context: Context, arrays: Mapping[str, np.ndarray], config: Mapping
) -> dict[str, np.ndarray]:
    """The arrays of :func:`_advertise`'s reply (also carried ahead with an Unmasking reply)."""
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    _check_not_advertised(context, round_id)
    _check_resumable(setup, context, config, "AdvertiseKeys")
    users = _hosted(setup.node, arrays["clients"])
    reply = {"users": users, "hosted": np.asarray(setup.node.users, np.int64)}
    if len(users) == 0:
        return reply
    party = int(users[0])
    run = _checked_run(context, arrays) if secagg.malicious else b""
    client = _party_client(setup, party, round_id, secagg, run=run)
    advert = client.advertise()
    _save_secrets(context, round_id, {party: client})  # with the stage: it advertises once
    reply |= {
        "party": np.array(party, np.int64),
        "c_public": rec.bytes_rows([advert[0]], kx.PUBLIC_KEY_BYTES),
        "s_public": rec.bytes_rows([advert[1]], kx.PUBLIC_KEY_BYTES),
    }
    if secagg.malicious:
        reply["signature"] = rec.bytes_rows([advert[2]], SIGNATURE_BYTES)
    return reply


def _share(setup: ClientSetup, context: Context, message: Message) -> Message:
    """ShareKeys: the party checks the neighbours' signed advertisements (malicious-server
    variant), the threshold against its own floors, and seals its shares."""
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    threshold = int(config["threshold"])
    setup.floors.check_threshold(threshold)
    party, client = _restore_party(setup, context, arrays["users"], round_id, secagg)
    sealed = _seal_shares(client, arrays, config, secagg)
    _save_secrets(context, round_id, {party: client})
    return _reply(message, {"users": arrays["users"], "sealed": sealed}, {})


def _seal_shares(
    client: SecAggClient, arrays: Mapping[str, np.ndarray], config: Mapping, secagg: SecAggConfig
) -> np.ndarray:
    """``client.share`` on a ShareKeys request's arrays: the sealed shares as one array."""
    signed = {}
    if secagg.malicious:
        signed = {
            "s_publics": rec.rows_bytes(arrays["s_publics"][0]),
            "signatures": rec.rows_bytes(arrays["signatures"][0]),
        }
    blobs = client.share(
        arrays["neighbours"][0].tolist(),
        arrays["xs"][0].tolist(),
        rec.rows_bytes(arrays["c_publics"][0]),
        int(config["threshold"]),
        n_clients=int(config.get("n_clients", 0)),
        **signed,
    )
    return np.frombuffer(b"".join(blobs), np.uint8).reshape(1, len(blobs), -1)


def _mask(setup: ClientSetup, context: Context, message: Message) -> Message:
    """The node's users compute their updates; the node uploads their masked sum.

    Each user's update is clipped/noised as DP asks (after the node checked the DP parameters
    against its floors), weighted and encoded with that user's own rounding stream (as it
    would be alone), the encodings are added in the ring, and the party's masks are added once:
    the server receives one vector per node. In the malicious-server variant the node also
    signs how many users its sum holds (:func:`~securefed.flower.identity.members_message`).
    """
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    mechanism = mechanism_from_config(config)
    setup.floors.check_dp(config, mechanism)
    party, client = _restore_party(setup, context, [int(arrays["party"])], round_id, secagg)
    _check_resumable(setup, context, config, "the masked input")
    reply, metrics = _masked_sum(setup, context, arrays, config, party, client, secagg)
    return _reply(message, reply, _metric_config(metrics))


def _masked_sum(
    setup: ClientSetup,
    context: Context,
    arrays: Mapping[str, np.ndarray],
    config: Mapping,
    party: int,
    client: SecAggClient,
    secagg: SecAggConfig,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Train the asked users, encode, sum and mask once (saving the secrets: it masks once);
    the reply's arrays and the metric sums."""
    round_id = int(config["round"])
    mechanism = mechanism_from_config(config)
    client.check_stage("mask")  # before the users train: a second ask changes nothing
    updates, metrics = _train(setup, context, arrays, round_id)
    signs = arrays.get("ddp_signs")
    updates = _client_dp(updates, config, round_id, setup.seeds, mechanism, signs)
    weighted = updates.weights is not None
    weights = updates.client_weights()
    length = updates.n_rows * updates.width + int(weighted)
    workspace = masking_workspace(length, secagg)
    encoded = np.zeros(length, secagg.fixed_point.dtype)
    for k, user in enumerate(updates.clients.tolist()):
        values = pack_values(updates.client_block(k), weights[k] if weighted else None)
        ring, _ = encode_input(
            values, rounding_key(setup.seeds, round_id, user), workspace, owner=user
        )
        np.add(encoded, ring, out=encoded)  # in Z_2^bits: the dtype wraps
    masked = client.mask_encoded(
        encoded, arrays["neighbours"][0].tolist(), rec.rows_bytes(arrays["s_publics"][0]), workspace
    )
    shares = _dp_shares(config, mechanism)
    _save_secrets(context, round_id, {party: client}, {DP_SHARES: shares})  # it masks once
    reply = {
        "party": np.array(party, np.int64),
        "users": updates.clients,
        "masked": masked[None, :],
        "weighted": np.array(weighted),
        "weight_sq": weights**2,
    }
    if secagg.malicious:
        identity = setup.node_identity()
        statement = members_message(
            round_id,
            party,
            len(updates.clients),
            registry=identity.registry.digest,
            run=_stored_run(context, round_id),
        )
        reply["members_signature"] = rec.bytes_rows(
            [identity.signer(party).sign(statement)], SIGNATURE_BYTES
        )
    return reply, metrics


def _share_mask(setup: ClientSetup, context: Context, message: Message) -> Message:
    """ShareKeys and MaskedInputCollection in one message (the server's ``merge_share_mask``).

    Every check of both stages runs first (the threshold and DP parameters against the node's
    floors, the party being its own), then exactly what the two separate stages do: the party
    checks its neighbours' advertisements (signed, in the malicious-server variant) and seals
    its shares, and, if any of its users compute, masks their sum with the ``s`` keys of the
    SAME neighbours: it never takes a second neighbour list from the server, so in the
    malicious-server variant it masks only with keys whose signatures it verified (a key the
    server substituted is refused at sharing, before anything is masked). The masked sum goes
    out with the sealed shares; the client's stages still forbid a second sharing or masking
    in the round (a separate ShareKeys or MaskedInput message after this one is refused).
    """
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    setup.floors.check_threshold(int(config["threshold"]))
    setup.floors.check_dp(config, mechanism_from_config(config))
    asked = arrays["users"].tolist()
    if [int(arrays["party"])] != [int(p) for p in asked]:
        raise AggregationError(
            f"round {round_id}: the ShareKeys+MaskedInput message names party {asked[:5]} for "
            f"sharing and party {int(arrays['party'])} for masking"
        )
    party, client = _restore_party(setup, context, asked, round_id, secagg)
    if not secagg.malicious:
        s_publics = rec.rows_bytes(arrays["s_publics"][0])
        if len(s_publics) != arrays["neighbours"].shape[1]:
            raise AggregationError(f"round {round_id}: one s key per neighbour is needed")
    sealed = _seal_shares(client, arrays, config, secagg)
    reply: dict[str, np.ndarray] = {"party": np.array(party, np.int64), "sealed": sealed}
    metrics: dict[str, float] = {}
    if len(arrays["clients"]):
        masked, metrics = _masked_sum(setup, context, arrays, config, party, client, secagg)
        reply |= masked
    else:
        _save_secrets(context, round_id, {party: client})
        reply["users"] = np.zeros(0, np.int64)
    return _reply(message, reply, _metric_config(metrics))


def _dp_shares(config: Mapping[str, object], mechanism: DistributedIntegerMechanism | None) -> int:
    """The contributing users the node requires before it unmasks: the count its distributed
    noise share is calibrated for, and secure aggregation's own minimum (0: none)."""
    needed = int(config.get("secagg_min_contributors", 0))
    if mechanism is not None:
        return max(needed, int(mechanism.min_contributors))
    if str(config.get("dp_placement", "")) == "distributed":
        return max(needed, int(config.get("dp_shares", 0)))
    return needed


def _consistency(setup: ClientSetup, context: Context, message: Message) -> Message:
    """ConsistencyCheck (Bonawitz et al. 2017, Fig. 5, round 3): sign the survivor set told."""
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    party, client = _restore_party(setup, context, arrays["helpers"], round_id, secagg)
    signature = client.consistency(frozenset(int(p) for p in arrays["survivors"].tolist()))
    _save_secrets(context, round_id, {party: client})
    return _reply(
        message,
        {"helpers": arrays["helpers"], "signature": rec.bytes_rows([signature], SIGNATURE_BYTES)},
        {},
    )


def _check_members(
    setup: ClientSetup,
    arrays: Mapping[str, np.ndarray],
    contributors: set[int],
    round_id: int,
    needed: int,
    run: bytes,
) -> None:
    """Before unmasking: the contributing parties' signed member counts add up to ``needed``.

    Raises:
        ConsistencyError: statements missing for a contributor, or fewer members than needed.
        SignatureError: a statement whose signature does not verify.
    """
    identity = setup.node_identity()
    parties = arrays["member_parties"].tolist()
    counts = arrays["member_counts"].tolist()
    signatures = rec.rows_bytes(arrays["member_signatures"])
    if sorted(parties) != sorted(contributors):
        raise ConsistencyError(
            f"round {round_id}: the server's member counts cover parties {sorted(parties)[:5]}, "
            f"not the contributors {sorted(contributors)[:5]}; refusing to unmask"
        )
    digest = identity.registry.digest
    for party, count, signature in zip(parties, counts, signatures, strict=True):
        statement = members_message(round_id, int(party), int(count), registry=digest, run=run)
        try:
            identity.registry.verify(int(party), statement, signature, what="member count")
        except SignatureError as error:
            raise SignatureError(
                f"round {round_id}: party {party}'s signed member count does not verify over "
                "this run's nonce transcript (a count replayed from another run, forged or "
                f"inflated: {error}); refusing to unmask"
            ) from error
    if needed and sum(counts) < needed:
        raise ConsistencyError(
            f"round {round_id}: the contributing parties hold {sum(counts)} user(s), fewer than "
            f"the {needed} this node requires (its distributed noise share is calibrated for "
            "them, or secure aggregation's minimum of contributors): refusing to unmask"
        )


def _unmask(setup: ClientSetup, context: Context, message: Message) -> Message:
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    round_id = int(config["round"])
    secagg = setup.floors.secagg_config(config)
    _, client = _restore_party(setup, context, arrays["helpers"], round_id, secagg)
    needed = int(context.state[SECAGG_STATE].get(DP_SHARES, 0))
    contributors = set(arrays["contributors"].tolist())
    signatures = None
    if secagg.malicious:
        run = _stored_run(context, round_id)
        _check_members(setup, arrays, contributors, round_id, needed, run)
        signatures = dict(
            zip(
                arrays["signers"].tolist(),
                rec.rows_bytes(arrays["signatures"]),
                strict=True,
            )
        )
    blobs = rec.rows_bytes(arrays["blobs"])
    inbox = dict(zip(arrays["senders"].tolist(), blobs, strict=True))
    owners, kinds, shares = [], [], []
    for owner, (kind, value) in client.reveal(inbox, contributors, signatures).items():
        owners.append(owner)
        kinds.append(0 if kind == "b" else 1)
        shares.append(shamir.encode_share(value))
    del context.state[SECAGG_STATE]  # the round is over: its secrets are no longer needed
    reply = {
        "helpers": arrays["helpers"],
        "indptr": np.asarray([0, len(owners)], np.int64),
        "owners": np.asarray(owners, np.int64),
        "kinds": np.asarray(kinds, np.uint8),
        "shares": rec.bytes_rows(shares, shamir.SHARE_BYTES),
    }
    if "next.clients" in arrays:  # the server's advertise_ahead: the next round's AdvertiseKeys
        following = {k[len("next.") :]: v for k, v in config.items() if k.startswith("next.")}
        if int(following.get("round", -1)) != round_id + 1:
            raise AggregationError(
                f"round {round_id}: the AdvertiseKeys carried with Unmasking must be for round "
                f"{round_id + 1}, got {following.get('round')}"
            )
        relayed = {k[len("next.") :]: v for k, v in arrays.items() if k.startswith("next.")}
        ahead = _advertisement(setup, context, relayed, following)
        reply |= {f"next.{k}": v for k, v in ahead.items()}
    return _reply(message, reply, {})


def _refusal(context: Context, message: Message, error: SecurefedError) -> Message:
    """The node refuses the round: a reply saying so (not an error reply, which the server
    reads as a dropout), and the round's secrets are deleted, so it answers no later stage."""
    round_id = int(rec.message_config(message).get("round", -1))
    reason = str(error)
    context.state[SECAGG_STATE] = ConfigRecord({"round": round_id, "refused": reason})
    return _reply(message, {}, {rec.REFUSAL: reason, rec.REFUSAL_KIND: type(error).__name__})


def _refusing(handler: Callable[[], Message], context: Context, message: Message) -> Message:
    try:
        return handler()
    except SecurefedError as error:  # the client's checks: AggregationError and its kin
        return _refusal(context, message, error)


# ----------------------------------------------------------------------------- CKKS
def _ckks_keys(setup: ClientSetup, config: Mapping[str, object]) -> NodeKeys:
    if setup.ckks is None:
        raise AggregationError(
            "the server's transport is CKKS but this node has no CKKS keys: provision them "
            "(securefed.flower.ckks.provision_keys) and give the node their paths"
        )
    setup.ckks.check_key(str(config["ckks_key_id"]))
    return setup.ckks


def _ckks_train(setup: ClientSetup, context: Context, message: Message) -> Message:
    """Compute the hosted users' updates and encrypt them here; only ciphertexts leave."""
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    setup.floors.check_dp(config, None)
    keys = _ckks_keys(setup, config)
    _check_resumable(setup, context, config, "train.ckks")
    round_id = int(config["round"])
    updates, metrics = _train(setup, context, arrays, round_id)
    updates = _client_dp(updates, config, round_id, setup.seeds)  # DP around CKKS
    reply = keys.encrypt_updates(
        updates, str(config["ckks_key_model"]), float(config["ckks_value_bound"])
    )
    reply["hosted"] = np.asarray(setup.node.users, np.int64)
    reply["weight_sq"] = updates.client_weights() ** 2
    return _reply(
        message,
        reply,
        _metric_config(metrics) | {"ckks_key_holder": keys.secret is not None},
    )


def _ckks_decrypt(setup: ClientSetup, message: Message) -> Message:
    """A key holder decrypts the summed ciphertexts, floods and rounds, returns the values."""
    arrays, config = rec.message_arrays(message), rec.message_config(message)
    keys = _ckks_keys(setup, config)
    [summed] = arrays_to_ciphertexts(arrays)
    flooding = Flooding(float(config["flood_std"]), float(config["round_step"]))
    values = keys.decrypt_sum(
        summed, int(arrays["length"]), flooding, int(config["round"]), setup.seeds
    )
    return _reply(message, {"values": values}, {})


def _ckks_encrypt_state(setup: ClientSetup, message: Message) -> Message:
    """A key holder encrypts the node's initial server state (``initial_state``: FedMF's
    initial ``V``) for the server, which keeps only the ciphertexts."""
    config = rec.message_config(message)
    keys = _ckks_keys(setup, config)
    if config.get("ckks_key_model") != "shared":
        raise ContextMismatchError(
            "an encrypted server state needs the shared key model: every node decrypts it"
        )
    initial = getattr(setup.node, "initial_state", None)
    if not callable(initial):
        raise AlgorithmContractError(
            f"{type(setup.node).__name__} has no initial_state(): it cannot seed an encrypted "
            "server state"
        )
    return _reply(message, keys.encrypt_state(initial()), {})


# ----------------------------------------------------------------------------- the app
def make_client_app(setup: Callable[[Context], ClientSetup]) -> ClientApp:
    """A Flower ``ClientApp`` whose handlers run the node returned by ``setup(context)``."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return _refusing(lambda: _plain_train(setup(context), context, message), context, message)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        node_setup = setup(context)
        node = node_setup.node
        _load_node(context, node, node_setup.journal)
        metrics = node.evaluate(_broadcast(rec.message_arrays(message), node_setup.ckks))
        if node_setup.on_evaluate is not None:
            node_setup.on_evaluate(node)
        return _reply(message, {}, _metric_config(metrics))

    @app.query("secagg_nonce")
    def nonce(message: Message, context: Context) -> Message:
        return _refusing(lambda: _nonce(setup(context), context, message), context, message)

    @app.query("secagg_advertise")
    def advertise(message: Message, context: Context) -> Message:
        return _refusing(lambda: _advertise(setup(context), context, message), context, message)

    @app.query("secagg_share")
    def share(message: Message, context: Context) -> Message:
        return _refusing(lambda: _share(setup(context), context, message), context, message)

    @app.train("secagg_mask")
    def mask(message: Message, context: Context) -> Message:
        return _refusing(lambda: _mask(setup(context), context, message), context, message)

    @app.train("secagg_share_mask")
    def share_mask(message: Message, context: Context) -> Message:
        return _refusing(lambda: _share_mask(setup(context), context, message), context, message)

    @app.query("secagg_consistency")
    def consistency(message: Message, context: Context) -> Message:
        return _refusing(lambda: _consistency(setup(context), context, message), context, message)

    @app.query("secagg_unmask")
    def unmask(message: Message, context: Context) -> Message:
        return _refusing(lambda: _unmask(setup(context), context, message), context, message)

    @app.train("ckks")
    def ckks_train(message: Message, context: Context) -> Message:
        return _refusing(lambda: _ckks_train(setup(context), context, message), context, message)

    @app.query("ckks_encrypt_state")
    def ckks_encrypt_state(message: Message, context: Context) -> Message:
        return _refusing(lambda: _ckks_encrypt_state(setup(context), message), context, message)

    @app.query("ckks_decrypt")
    def ckks_decrypt(message: Message, context: Context) -> Message:
        return _ckks_decrypt(setup(context), message)

    return app
