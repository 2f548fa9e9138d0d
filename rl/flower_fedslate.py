"""FedSlate (``securefed.rl.fedslate``) on Flower: the platforms and the user on SuperNodes, the
server network in the ServerApp.

Roles, by the node's ``partition-id`` (``num-partitions`` = ``K + 1``):

* ``0``: the **user simulator** (:class:`SimulatorNode`). FedSlate's user is shared by every
  platform (spec section 1: one user, the platforms take turns), so it lives on a node of its
  own: the choc-vs-kale simulator (:class:`~securefed.rl.envs.choc_kale.ChocKaleBatch`) and its
  random streams. It receives each platform's slate and returns to that platform its outcome
  (the clicked candidate, the feedback it may see, its next observation) sealed with an AEAD
  key only the two of them hold (X25519 between the nodes, HKDF-SHA256, ChaCha20-Poly1305:
  :mod:`securefed.crypto.keys`). Each node signs its X25519 key with its role's long-term
  Ed25519 identity, provisioned out of band (:func:`provision_relay_identities`, the registry
  of every role's verification key pinned by digest in the node config), and takes a peer's
  key only with that role's signature (:func:`relay_identity`) over the digest of every node's
  fresh nonce of this run (:func:`relay_nonce`): a server that substitutes or relabels keys, or
  replays a signed key of another run, is refused. The server relays the sealed blobs and
  cannot read them; it learns only that a round was played and when the episode ends
  (``done``, public: the budget is fixed). The episode rewards are the simulator's evaluation
  record, written to the node's ``output_dir``, never sent.
* ``1 .. K``: **platform** ``p - 1`` (:class:`PlatformNode`): its local Q-network, the target
  copy and Adam, its column of the round-aligned replay, its current observation, its copy of
  the exploration stream, and under ``dp`` its half of the DP channel
  (:class:`securefed.fusion.dp.DPParty`: its noise stream, its ledger, its release counts) and
  its local DP-SGD (:class:`~securefed.rl.fedslate.LocalDPSGD`). Every row it sends is released
  on the node; Algorithm 2's team target reaches a platform without rewards sealed by the
  platforms with rewards (the server relays it).

The ServerApp (:func:`run_server`) holds the server network, its target copy and Adam behind the
fusion channel (:func:`securefed.fusion.build_fusion_channel`, ``"plaintext"``: under ``dp`` the
server's half is the plaintext channel that receives the noised rows), the round-aligned replay's
schedule (which rows exist and end episodes, the public part) and its sampling stream, and drives
the protocol of :func:`securefed.rl.fedslate.run_fedslate` step by step over Flower messages:
acting (Q-values up, fused values down, sealed slates to the simulator, sealed outcomes back),
learning (targets, Algorithm 1, Algorithm 2: the same exchanges the in-process channel makes, each
tagged as there) and the target syncs. A seeded run gives every node and the server the run's
``SeedTree(seed)`` streams at the paths the in-process run draws them from, so it reproduces the
in-process run (tests/test_flower_fedslate.py). Each node's state travels in its Flower
``Context.state`` as arrays (no pickle) and is rebuilt for every message.

Under ``ckks`` each platform node also holds its CKKS half (:class:`CKKSPlatform`: its key
pair, made on the node and kept in its ``Context.state``, the other platforms' public contexts,
each taken only signed by its owner's relay identity and of the configured parameters, its
flooding stream); the ServerApp's channel is
:class:`~securefed.fusion.ckks_module.CKKSModuleFusionChannel` (two or more hidden server
layers: the monomial circuit) or
:class:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel` (one hidden layer or the
linear variant: the packed circuit, its owner regions and clear releases on the platform's node)
built from the public contexts the platforms sent (``public_contexts``: no key party, each
context checked against the configured ring, chain and scale), and every row, fused value,
gradient and masked product crosses as serialized ciphertexts in the same messages
(:func:`_encrypted_op`, ``_Server._serve``, ``_Server.exchange_encrypted``). In the packed
circuit the in-process channel's two savings are carried: A's Algorithm-1 rows travel with the
targets' request and join the target forward's ciphertext (``join``), and a training forward
repeats the forward before it (``repeat``: A's the joined one, B's its select forward), the
owner's loss in the same reply; each platform checks a repeat on its node
(:meth:`CKKSPlatform.check_repeat`, :meth:`CKKSPlatform.check_join`). Under
``ckks+dp`` each platform releases every row on its node as under ``dp`` (clipped, noised,
every entry clamped to the public bound and divided by it: its
:class:`~securefed.fusion.dp.DPParty`, its ledger) before it encrypts it, and the channel takes
the clamp's bounds (``securefed.fusion.registry._clamped_ckks_config``), as in process.

Carried: ``fusion`` ``"plaintext"``, ``"dp"``, ``"ckks"`` and ``"ckks+dp"`` (``dp_acting=
"released"``; both CKKS circuits), position alignment, every variant, any number of platforms
and members. Refused, naming the option: ``alignment="item"``, ``dp_acting="own"``
(:func:`flower_refusal`). This module is the app layer: it imports ``rl`` and
``securefed.flower``; ``securefed`` knows nothing of FedSlate.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import io
import json
import math
import struct
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import tenseal as ts
import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from securefed import NO_PAYLOADS, RoundSelection, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto.ckks import (
    ckks_context,
    decryption_error_bound,
    parameters_for,
    secret_context_from_bytes,
)
from securefed.errors import InsecureParameterError
from securefed.flower import FlowerRunOptions, FlowerRunResult, freshness
from securefed.flower import records as rec
from securefed.flower.identity import NodeIdentity, load_identity, provision_identities
from securefed.flower.server import _Messenger, wait_for_nodes
from securefed.fusion import build_fusion_channel
from securefed.fusion.base import pick, scatter_positions
from securefed.fusion.ckks_module import (
    CKKSModuleFusionChannel,
    ModuleKeyParty,
    _segments,
    masked_sum_error_bound,
    module_key_circuit,
    public_key_id,
    server_context_from_bytes,
)
from securefed.fusion.ckks_packed import (
    REGIONS,
    PackedCKKSModuleFusionChannel,
    PackedKeyParty,
    own_exponents,
    packed_chunks,
    packed_flooding_std,
    packed_key_circuit,
)
from securefed.fusion.dp import DPParty, check_counted_tag, scaled_gradient
from securefed.fusion.expansion import monomials
from securefed.fusion.registry import _clamped_ckks_config
from securefed.privacy.noise import as_noise_source, noise_source
from securefed.records import dumps_record
from securefed.rl.choices import PLATFORM_NAMES
from securefed.rl.envs.choc_kale import ChocKaleBatch, EnvStreams
from securefed.rl.fedslate import (
    ACT,
    ENCRYPTED_FUSIONS,
    LEARN,
    SELECT,
    TARGET,
    FedSlateConfig,
    LocalDPSGD,
    ckks_config,
    clicked_loss,
    dp_noise_multipliers,
    dp_unit_releases,
    server_network,
    slate_value_loss,
)
from securefed.rl.slateq import (
    ReplayBuffer,
    choice_weights,
    explore,
    features,
    local_network,
    make_choice_model,
    next_values,
    select_slates,
    torch_generator,
)
from securefed.transport.secagg.signatures import KeyRegistry, SignatureError, SigningKey

__all__ = [
    "APP_DIR",
    "FLOWER_FUSIONS",
    "SIMULATOR",
    "CKKSPlatform",
    "FedSlateApps",
    "FedSlateFlowerOutcome",
    "FedSlateFlowerRun",
    "PlatformNode",
    "SimulatorNode",
    "app_components",
    "app_config_keys",
    "app_run",
    "build_apps",
    "ckks_key_message",
    "config_from_run_config",
    "drive_in_process",
    "flower_refusal",
    "handle",
    "in_process_exchange",
    "node_results",
    "nonce_transcript",
    "provision_relay_identities",
    "relay_identity",
    "relay_key_message",
    "relay_nonce",
    "run_from_config",
    "run_server",
    "server_results",
    "write_fedslate_app",
]

FLOWER_FUSIONS = ("plaintext", "dp", "ckks", "ckks+dp")
"""The fusion channels FedSlate runs over Flower (every one FedSlate has; both CKKS circuits)."""
SIMULATOR = 0
"""The ``partition-id`` of the user simulator's node; platform ``p`` is node ``p + 1``."""
MESSAGE_TYPE = "query.fedslate"
AEAD = "chacha20-poly1305"
PURPOSE = b"fedslate-relay"
STATE_ARRAYS, STATE_META = "fedslate.arrays", "fedslate.meta"
PURPOSE_RELAY_KEY = b"fedslate-relay-key"
PURPOSE_RELAY_NONCES = b"fedslate-relay-nonces"
NONCE_BYTES = freshness.NONCE_BYTES
"""Each node's contribution to the run's set-up transcript (:func:`relay_nonce`)."""
PURPOSE_CKKS_KEY = b"fedslate-ckks-public-context"
IDENTITY_PATH = "fedslate-identity-path"
REGISTRY_PATH = "fedslate-registry-path"
REGISTRY_DIGEST = "fedslate-registry-digest"
"""The node-config keys naming a node's provisioned relay identity (:func:`relay_identity`)."""
_KINDS = {"reset": 1, "outcome": 2, "slate": 3, "targets": 4}


def flower_refusal(config: FedSlateConfig) -> str | None:
    """Why ``config`` does not run on Flower (``None``: it does)."""
    if config.fusion not in FLOWER_FUSIONS:
        return (
            f"fusion {config.fusion!r} is not carried on Flower (carried: {list(FLOWER_FUSIONS)})"
        )
    if config.alignment != "position":
        return (
            "alignment 'item' is not carried on Flower: each platform would evaluate its network "
            "on the other platforms' candidate features, which no message carries here"
        )
    if config.dp_acting != "released":
        return (
            "dp_acting 'own' is not carried on Flower: the platform would evaluate the server "
            "network's weights itself, which the ServerApp does not send"
        )
    return None


@dataclass(frozen=True)
class FedSlateFlowerRun:
    """One FedSlate run on Flower.

    Attributes:
        config: the run's configuration; ``config.seed`` ``None`` is secure mode (every node
            and the server draw from their own operating-system entropy, and the nodes'
            X25519 keys too; every node needs its provisioned relay identity in its node
            config, :func:`relay_identity`); an int gives all of them ``SeedTree(seed)``:
            reproducible, equal to the in-process run, and not private (the server can derive
            every key and every relay identity).
        output_dir: where the nodes write ``fedslate-<role>.npz`` after the run (the
            simulator its episode rewards, each platform its networks and ledger).
        keep_payloads: the rounds whose vectors the server's view keeps.
        timeout: seconds one message round may take (a node that does not answer ends the
            run: FedSlate has no dropout semantics).
        poll_interval: seconds between the server's polls.

    Raises:
        ValueError: a configuration Flower does not carry (:func:`flower_refusal`).
    """

    config: FedSlateConfig
    output_dir: str = ""
    keep_payloads: RoundSelection = NO_PAYLOADS
    timeout: float = 600.0
    poll_interval: float = 0.002

    def __post_init__(self) -> None:
        reason = flower_refusal(self.config)
        if reason is not None:
            raise ValueError(reason)

    @property
    def nodes(self) -> int:
        """SuperNodes the run needs: the simulator and one per platform."""
        return self.config.num_platforms + 1


# ----------------------------------------------------------------------------- state on a node
def _rng_state(generator: np.random.Generator) -> dict:
    return generator.bit_generator.state


def _set_rng(generator: np.random.Generator, state: Mapping) -> None:
    generator.bit_generator.state = dict(state)


def _module_arrays(prefix: str, module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {f"{prefix}{k}": v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _load_module(prefix: str, module: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    state = {
        k[len(prefix) :]: torch.from_numpy(np.array(v))
        for k, v in arrays.items()
        if k.startswith(prefix)
    }
    module.load_state_dict(state)


def _optimiser_arrays(prefix: str, optimiser: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    out = {}
    for index, entries in optimiser.state_dict()["state"].items():
        for name, value in entries.items():
            out[f"{prefix}{index}.{name}"] = torch.as_tensor(value).numpy().copy()
    return out


def _load_optimiser(
    prefix: str, optimiser: torch.optim.Optimizer, arrays: Mapping[str, np.ndarray]
) -> None:
    state = optimiser.state_dict()
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in arrays.items():
        if name.startswith(prefix):
            index, key = name[len(prefix) :].split(".", 1)
            entries.setdefault(int(index), {})[key] = torch.from_numpy(np.array(value))
    state["state"] = entries
    optimiser.load_state_dict(state)


def _pack(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    return buffer.getvalue()


def _unpack(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@dataclass
class _Keys:
    """A node's X25519 key pair and the peers' public keys (by role)."""

    role: int
    pair: kx.KeyPair
    peers: dict[int, bytes] = field(default_factory=dict)

    def _key(self, peer: int) -> bytes:
        if peer not in self.peers:
            raise ValueError(f"node {self.role} has no public key of node {peer}")
        return kx.pair_key(self.pair.private, self.peers[peer], PURPOSE, 0, self.role, peer)

    @staticmethod
    def _aad(kind: str, counter: int, sender: int, recipient: int) -> bytes:
        return (
            kx.PROTOCOL_LABEL
            + PURPOSE
            + kind.encode()
            + struct.pack(">qqq", counter, sender, recipient)
        )

    def seal(
        self, kind: str, counter: int, peer: int, arrays: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """``arrays`` sealed for ``peer`` (the nonce: kind, sender and counter, unique per key)."""
        nonce = struct.pack(">BBxxq", _KINDS[kind], self.role, counter)
        blob = kx.seal(
            AEAD, self._key(peer), nonce, _pack(arrays), self._aad(kind, counter, self.role, peer)
        )
        return np.frombuffer(blob, np.uint8).copy()

    def open(self, kind: str, counter: int, peer: int, blob: np.ndarray) -> dict[str, np.ndarray]:
        """Open what ``peer`` sealed for this node (raises ``ShareDecryptionError`` when it was
        tampered with, misrouted or replayed from another step)."""
        data = np.asarray(blob, np.uint8).tobytes()
        return _unpack(
            kx.open_sealed(AEAD, self._key(peer), data, self._aad(kind, counter, peer, self.role))
        )


def _node_tree(config: FedSlateConfig, meta: dict) -> SeedTree:
    """The node's seed tree: the run's seeded one, or a secure one kept in the node's state."""
    if config.seed is not None:
        return SeedTree(config.seed)
    tree = SeedTree()
    if "entropy" in meta:
        tree.resume_from(int(meta["entropy"]))
    else:
        meta["entropy"] = str(tree.entropy)
    return tree


def _keys(role: int, tree: SeedTree, arrays: Mapping) -> _Keys:
    """The node's X25519 key pair (from its tree: the run's seed, or its secret entropy in
    secure mode) and the peers' public keys it was sent."""
    pair = kx.keypair_from_seed(tree.key("flower-fedslate", "x25519", role))
    peers = {
        int(k.split(".")[1]): np.asarray(v, np.uint8).tobytes()
        for k, v in arrays.items()
        if k.startswith("peer.")
    }
    return _Keys(role, pair, peers)


# ----------------------------------------------------------------------------- pinned relay keys
def provision_relay_identities(directory: str | Path, num_platforms: int) -> str:
    """Make every role's long-term relay identity (OS entropy) and write the enrolment's files.

    Runs once where the enrolment authority runs (never on the server): the roles are the
    "users" of :func:`securefed.flower.identity.provision_identities`, one per node (role ``r``
    in ``identity-<r>.bin``, mode 0600; every role's Ed25519 verification key in
    ``registry.bin``).

    Args:
        directory: where the files go.
        num_platforms: ``K``; the roles are ``0 .. K`` (the simulator, then the platforms).

    Returns:
        The registry's digest (hex): what every node pins (``fedslate-registry-digest``).
    """
    if num_platforms < 1:
        raise ValueError(f"FedSlate needs at least one platform, got {num_platforms}")
    return provision_identities(directory, {role: [role] for role in range(num_platforms + 1)})


def relay_nonce(config: FedSlateConfig, role: int, tree: SeedTree) -> bytes:
    """The node's fresh contribution to this run's set-up (``NONCE_BYTES``): operating-system
    entropy in secure mode (drawn when the server asks, never derived from the node's stored
    entropy), ``tree.key("flower-fedslate", "nonce", role)`` in seeded mode (reproducible; a
    path no other stream draws from, so a seeded run still equals the in-process run).
    :func:`securefed.flower.freshness.fresh_nonce`, shared with secure aggregation."""
    return freshness.fresh_nonce(tree, "flower-fedslate", "nonce", role, secure=config.seed is None)


def nonce_transcript(nonces: Mapping[int, bytes]) -> bytes:
    """SHA-256 of every role's nonce in role order (label, purpose, then each role and its
    nonce): what each node's relay-key signature covers (:func:`relay_key_message`;
    :func:`securefed.flower.freshness.nonce_transcript` under FedSlate's purpose)."""
    return freshness.nonce_transcript(nonces, PURPOSE_RELAY_NONCES)


def relay_key_message(registry_digest: bytes, role: int, public: bytes, transcript: bytes) -> bytes:
    """What a node signs with its identity: its role's X25519 relay key under the pinned
    registry, for this run (label, purpose, the registry digest, the role, the key, the digest
    of every node's nonce, :func:`nonce_transcript`)."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_RELAY_KEY,
            bytes(registry_digest),
            struct.pack(">q", int(role)),
            bytes(public),
            bytes(transcript),
        )
    )


@lru_cache(maxsize=8)
def _seeded_relay_keys(seed: int, roles: int) -> tuple[tuple[SigningKey, ...], KeyRegistry]:
    tree = SeedTree(seed)
    keys = tuple(
        SigningKey.from_seed(tree.key("flower-fedslate", "signing", r)) for r in range(roles)
    )
    registry = KeyRegistry({r: key.public for r, key in enumerate(keys)})
    for key in keys:
        key.pin_registry(registry.digest)
    return keys, registry


def relay_identity(
    run: FedSlateFlowerRun, role: int, node_config: Mapping[str, object]
) -> NodeIdentity:
    """The node's long-term relay identity and the registry of every role, checked against the
    digest pinned at enrolment.

    Provisioned (:func:`provision_relay_identities`) when the node config names the files
    (``fedslate-identity-path``, ``fedslate-registry-path``, ``fedslate-registry-digest``),
    which secure mode needs; a seeded run without them derives every role's identity from
    ``SeedTree(seed).key("flower-fedslate", "signing", role)``: the server knows the seed, so
    there it can sign as any role (seeded mode is never private).

    Raises:
        InsecureParameterError: secure mode without a provisioned identity.
        SignatureError: a registry of another digest, of other roles, or an identity file of
            another role.
        ValueError: a missing or malformed file, or an incomplete node config.
    """
    if IDENTITY_PATH in node_config:
        missing = [k for k in (REGISTRY_PATH, REGISTRY_DIGEST) if not node_config.get(k)]
        if missing:
            raise ValueError(
                f"a FedSlate node given {IDENTITY_PATH} also needs {missing} in its node "
                "config: without the digest pinned at enrolment it cannot tell an authentic "
                "registry from one the server forged"
            )
        try:
            identity = load_identity(
                str(node_config[IDENTITY_PATH]),
                str(node_config[REGISTRY_PATH]),
                str(node_config[REGISTRY_DIGEST]),
            )
        except SignatureError as error:
            raise SignatureError(f"FedSlate relay identity of role {role}: {error}") from error
    elif run.config.seed is None:
        raise InsecureParameterError(
            "in secure mode a FedSlate node's relay identity is provisioned out of band "
            "(securefed.rl.flower_fedslate.provision_relay_identities): start the node with "
            f"--node-config '{IDENTITY_PATH}=... {REGISTRY_PATH}=... {REGISTRY_DIGEST}=<hex>'; "
            "without a pinned registry the server could substitute its own X25519 keys and "
            "read every sealed blob"
        )
    else:
        keys, registry = _seeded_relay_keys(int(run.config.seed), run.nodes)
        identity = NodeIdentity({role: keys[role]}, registry)
    roles = sorted(identity.registry.keys)
    if roles != list(range(run.nodes)):
        raise SignatureError(
            f"the relay registry holds roles {roles}, this run has roles 0 .. {run.nodes - 1}: "
            "an enrolment of another run; refusing"
        )
    if role not in identity.signers:
        raise SignatureError(
            f"the identity file of this node holds no relay identity for role {role} (its "
            f"partition-id) but for {sorted(identity.signers)}: another node's file; refusing"
        )
    return identity


def _sign_relay_key(
    identity: NodeIdentity, role: int, public: bytes, transcript: bytes
) -> np.ndarray:
    message = relay_key_message(identity.registry.digest, role, public, transcript)
    return np.frombuffer(identity.signer(role).sign(message), np.uint8).copy()


def _checked_transcript(me: int, roles: int, own: bytes, arrays: Mapping[str, np.ndarray]) -> bytes:
    """The digest of the nonces the server relayed (``nonce.<role>``), once this node checked
    that they are one per role of the run, distinct, and that its own nonce is in its place
    (:func:`securefed.flower.freshness.checked_nonces`)."""
    relayed = freshness.relayed_nonces(arrays)
    return nonce_transcript(
        freshness.checked_nonces(me, own, relayed, members=range(roles), member="role")
    )


def _verify_relay_key(
    registry: KeyRegistry, me: int, role: int, public: bytes, signature: bytes, transcript: bytes
) -> None:
    """Refuse a relay key not signed by ``role``'s identity in the pinned registry over this
    run's nonces (``transcript``: the digest holding this node's own nonce)."""
    try:
        registry.verify(
            role,
            relay_key_message(registry.digest, role, public, transcript),
            signature,
            what=f"relay key (role {role})",
        )
    except SignatureError as error:
        raise SignatureError(
            f"node {me} refuses the X25519 relay key the server handed it as role {role}'s: it "
            f"is not signed by role {role}'s identity in the pinned registry over this run's "
            "nonces, which hold this node's own (a key substituted by the server, another "
            "role's key relabelled, a signed key replayed from another run, or other nonces "
            f"handed to role {role}); refusing"
        ) from error


def _pinned_peers(
    identity: NodeIdentity,
    me: int,
    roles: int,
    arrays: Mapping[str, np.ndarray],
    transcript: bytes,
) -> dict[int, bytes]:
    """The peers' X25519 keys the server relayed, each checked against the pinned registry and
    this run's nonce transcript."""
    relayed = sorted(int(k.split(".")[1]) for k in arrays if k.startswith("peer."))
    if relayed != list(range(roles)):
        raise SignatureError(
            f"node {me} was handed relay keys of roles {relayed}, the run has 0 .. {roles - 1}; "
            "refusing"
        )
    peers = {}
    for role in range(roles):
        if role == me:
            continue
        if f"sig.{role}" not in arrays:
            raise SignatureError(
                f"node {me} was handed role {role}'s relay key without its signature; refusing"
            )
        public = kx.check_public_key(
            np.asarray(arrays[f"peer.{role}"], np.uint8).tobytes(), owner=f"role {role}"
        )
        signature = np.asarray(arrays[f"sig.{role}"], np.uint8).tobytes()
        _verify_relay_key(identity.registry, me, role, public, signature, transcript)
        peers[role] = public
    return peers


@lru_cache(maxsize=8)
def _dp_setup(config: FedSlateConfig):
    """The DP options and the local DP-SGD's multiplier and steps (a pure function of the
    configuration; cached: a node is rebuilt for every message)."""
    options = config.dp_options()
    bound = dp_unit_releases(config)
    local = None
    if config.local_dp:
        local = dp_noise_multipliers(
            config,
            releases=bound["releases"],
            local_steps=bound["local_steps"],
            tail=bound["tail_delta"],
        )["local"]
    return options, local, bound["local_steps"]


# ----------------------------------------------------------------------------- the CKKS halves
@lru_cache(maxsize=8)
def _ckks_setup(config: FedSlateConfig):
    """``(channel config, degree, key arguments, parameters)`` of the CKKS circuit for
    ``config`` (the monomial one, :func:`module_key_circuit`, or the packed one,
    :func:`packed_key_circuit`): a pure function of the public configuration (cached)."""
    channel = ckks_config(config)
    if config.fusion == "ckks+dp":
        # The clamp's bounds (value 1: the released entries divided by theirs), as in process.
        channel = _clamped_ckks_config(config.dp_options(), channel)
    degree = server_network(config).polynomial_network().degree
    if channel.circuit == "packed":
        kwargs = packed_key_circuit(channel)
    else:
        kwargs = module_key_circuit(channel, degree)
    return channel, degree, kwargs, parameters_for(**kwargs)


def _blob(data: bytes) -> np.ndarray:
    return np.frombuffer(bytes(data), np.uint8).copy()


def _bytes(array: np.ndarray) -> bytes:
    return np.asarray(array, np.uint8).tobytes()


def ckks_key_message(registry_digest: bytes, role: int, public: bytes, transcript: bytes) -> bytes:
    """What a platform signs with its relay identity: the SHA-256 of its CKKS public context
    under the pinned registry and this run's set-up nonces (label, purpose, registry digest,
    role, digest, the nonces' digest :func:`nonce_transcript`), so that a context signed in
    another run does not verify, as for the relay key."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_CKKS_KEY,
            bytes(registry_digest),
            struct.pack(">q", int(role)),
            bytes.fromhex(public_key_id(public)) + hashlib.sha256(bytes(public)).digest(),
            bytes(transcript),
        )
    )


def _chunked(arrays: Mapping[str, np.ndarray], prefix: str) -> list[bytes]:
    """The serialized ciphertexts ``prefix.0``, ``prefix.1``, ... of a message, in order."""
    out = []
    while f"{prefix}.{len(out)}" in arrays:
        out.append(_bytes(arrays[f"{prefix}.{len(out)}"]))
    return out


class CKKSPlatform:
    """A platform's CKKS half on its node: its :class:`ModuleKeyParty` (the secret key, kept
    in the node's ``Context.state`` as its own serialized context, never sent), the other
    platforms' public contexts (each taken only with its owner's signature), its flooding
    stream.

    Args:
        config: the run's configuration.
        p: the platform.
        tree: the node's seed tree (the flooding stream; secure mode: the node's entropy).
        arrays, meta: the node's saved state (``ckks.*``); a first call makes the key.
    """

    def __init__(self, config: FedSlateConfig, p: int, tree: SeedTree, arrays, meta) -> None:
        self.config, self.p, self.name = config, p, PLATFORM_NAMES[p]
        self.channel_config, self.degree, kwargs, self.params = _ckks_setup(config)
        # The packed circuit (one hidden server layer, or the linear variant): regions, the
        # owner's encryptions with its secret key, one masked exchange a backward.
        self.packed = self.channel_config.circuit == "packed"
        self._party_of = PackedKeyParty if self.packed else ModuleKeyParty
        self._arrays, self._meta = arrays, meta
        self._party: ModuleKeyParty | None = None
        self._peers: dict[int, object] | None = None
        if "ckks.secret" not in arrays:
            secret = ckks_context(**kwargs)
            arrays["ckks.secret"] = _blob(secret.serialize_secret(evaluation_keys=False))
            meta["ckks.key_id"] = secret.key_id
            # The id the others name this key by: of the public bytes it sends (once, in hello).
            meta["ckks.public_id"] = public_key_id(secret.public().serialized)
            self._party = self._party_of(self.name, secret)
        self.key_id = str(meta["ckks.public_id"])
        self.noise = noise_source(tree, "flower-fedslate", "ckks-flood", self.name)
        if "ckks.flood" in meta:
            _set_noise_state(self.noise, meta["ckks.flood"])
        # What a repeated or joined forward is checked against (packed circuit): per output
        # platform, the last forward it sent rows for (the server's id, the digest of its
        # vector, the server's stated weight version, the exchanges it had seen), and the
        # training exchanges and steps it has seen (each one a step of the server's weights).
        self.sent: dict[str, dict] = dict(meta.get("ckks.sent", {}))
        self.exchanges = int(meta.get("ckks.exchanges", 0))

    @property
    def party(self) -> ModuleKeyParty:
        """Its key party, rebuilt from the node's state when a request needs it (a context at
        ring 16384 takes a noticeable time to deserialize)."""
        if self._party is None:
            secret = secret_context_from_bytes(
                _bytes(self._arrays["ckks.secret"]),
                key_id=self._meta["ckks.key_id"],
                params=self.params,
                evaluation_keys=False,
            )
            self._party = self._party_of(self.name, secret)
        return self._party

    @property
    def peers(self) -> dict[int, object]:
        """The other platforms' public contexts it took (public keys only: it encrypts with
        them)."""
        if self._peers is None:
            self._peers = {
                int(k.rsplit(".", 1)[1]) - 1: server_context_from_bytes(
                    _bytes(v),
                    self.params,
                    f"platform {int(k.rsplit('.', 1)[1]) - 1}",
                    evaluation_keys=False,
                )
                for k, v in self._arrays.items()
                if k.startswith("ckks.peer.")
            }
        return self._peers

    def save(self, meta: dict) -> None:
        meta["ckks.flood"] = _noise_state(self.noise)
        meta["ckks.sent"], meta["ckks.exchanges"] = self.sent, self.exchanges

    def record(self, outputs: Sequence[int], values, config, *, joined: bool = False) -> None:
        """Note the forward ``config["forward"]`` it sent ``values`` in, for each output
        platform (what a later repeat of it is checked against, :meth:`check_repeat`)."""
        digest = _digest(values)
        for q in outputs:
            self.sent[str(int(q))] = {
                "id": int(config.get("forward", -1)),
                "digest": digest,
                "version": int(config.get("version", -1)),
                "exchanges": self.exchanges,
                "joined": bool(joined),
            }

    def check_repeat(self, q: int, config, values) -> dict:
        """Refuse (by name) a repeat of forward ``config["repeat"]`` for output platform ``q``
        (its training forward served from that forward's ciphertexts: it sends nothing new)
        unless that is the last forward it sent for ``q``, with the vector ``values`` it would
        send now, and the server's weights have not changed since (its stated version the
        same, and no training exchange or step this platform took part in since: each is a
        step of the server's weights). A server that steps its own weights silently changes
        only its own training: no value of this platform is decrypted or released again."""
        forward = int(config["repeat"])
        last = self.sent.get(str(int(q)))
        if last is None or last["id"] != forward:
            sent = None if last is None else last["id"]
            raise ValueError(
                f"platform {self.p} was asked to repeat forward {forward} as platform {q}'s "
                f"training forward, but the last forward it sent rows for platform {q} in is "
                f"{sent}: refusing a repeat of vectors it did not send"
            )
        if last["digest"] != _digest(values):
            raise ValueError(
                f"platform {self.p} was asked to repeat forward {forward} as platform {q}'s "
                "training forward, but its training vectors differ from those it sent in it: "
                "refusing a repeat of vectors it did not send"
            )
        version = int(config.get("version", -1))
        if version != last["version"] or self.exchanges != last["exchanges"]:
            raise ValueError(
                f"platform {self.p} was asked to repeat forward {forward} after the server's "
                f"weights changed (version {last['version']} then, {version} now; "
                f"{self.exchanges - last['exchanges']} training exchange(s) or step(s) since): "
                "refusing a repeat after the weights changed"
            )
        return last

    def check_join(self, outputs: Sequence[int], joiner: int, shape) -> None:
        """Refuse a joined forward the packed circuit cannot make: for other outputs than
        the joining platform, or beyond ``4 n <= N / 2`` (its own slots, the public shape)."""
        length = int(np.prod(shape))
        if list(outputs) != [joiner]:
            raise ValueError(
                f"platform {self.p} was asked to join platform {joiner}'s training forward "
                f"into a forward for {list(outputs)}: refusing (one output party, its own)"
            )
        if not self.packed or (REGIONS + 1) * length > self.params.slots:
            raise ValueError(
                f"platform {self.p} was asked to join a forward of {length} entries: "
                f"{(REGIONS + 1) * length} slots, beyond the {self.params.slots} of one "
                "ciphertext (4 n <= N / 2): refusing"
            )

    def encrypt_joined(self, prefix: str, learn, other, q: int) -> dict[str, np.ndarray]:
        """A joined forward's one ciphertext for output platform ``q``: ``P = [x_0 | 0 | 0 |
        x_0']`` (its own, with its secret key) or ``Q = [x_1 | x_1 | x_1^2 | x_1']`` under
        ``q``'s key, regions 0-2 its ``learn`` rows (the announced training forward), region
        3 the ``other`` rows (this forward's), both checked within the public bound."""
        flat = []
        for values, what in ((learn, "learn"), (other, prefix)):
            array = np.asarray(values, np.float64)
            _check_bound(array, self.channel_config.value_bound, f"platform {self.p}'s {what} rows")
            flat.append(array.reshape(-1))
        if q == self.p:
            vector = self.party.encrypt_owner_regions(flat[0], flat[1])
        else:
            vector = self.party.encrypt_other_regions(flat[0], self._recipient(q), flat[1])
        shape = np.array(np.shape(other), np.int64)
        return {f"{prefix}.shape": shape, f"{prefix}.{q}.0": _blob(vector.serialize())}

    def decrypt_joined(self, arrays, config, prefix: str, shape) -> tuple[np.ndarray, ...]:
        """A joined forward's output under its key: ``(regions 0-2's, region 3's)`` values,
        the announced training forward's and this forward's, each ``shape``, decrypted once."""
        self._check_key(config)
        blobs = _chunked(arrays, prefix)
        shape = tuple(int(v) for v in shape)
        n = int(np.prod(shape))
        if len(blobs) != 1:
            raise ValueError(f"platform {self.p} got {len(blobs)} chunk(s) of {prefix}, 1 due")
        values = self.party.decrypt_returned(blobs[0]) * 2.0**self.channel_config.output_shift_bits
        if values.shape[0] != (REGIONS + 1) * n:
            raise ValueError(
                f"platform {self.p} got a joined output of {values.shape[0]} slot(s), "
                f"{(REGIONS + 1) * n} due"
            )
        return values[:n].reshape(shape), values[REGIONS * n :].reshape(shape)

    def _recipient(self, q: int):
        if q == self.p:
            return self.party
        if q not in self.peers:
            raise ValueError(f"platform {self.p} holds no public context of platform {q}")
        return self.peers[q]

    def encrypt_rows(self, prefix: str, values, outputs: Sequence[int]) -> dict[str, np.ndarray]:
        """Its ``(members, batch, width)`` rows, checked within the public bound, encrypted for
        each output platform (under that platform's key): ``prefix.<q>.<chunk>``."""
        array = np.asarray(values.detach().numpy() if hasattr(values, "detach") else values)
        array = array.astype(np.float64)
        _check_bound(array, self.channel_config.value_bound, f"platform {self.p}'s {prefix} rows")
        out = {f"{prefix}.shape": np.array(array.shape, np.int64)}
        flat = array.reshape(-1)
        for q in outputs:
            if self.packed:
                vectors = self._regions(flat, int(q))
            else:
                vectors = self.party.encrypt_for(flat, self._recipient(int(q)))
            for c, vector in enumerate(vectors):
                out[f"{prefix}.{q}.{c}"] = _blob(vector.serialize())
        return out

    def _regions(self, flat: np.ndarray, q: int) -> list:
        """The packed circuit's ciphertexts of its vector for output platform ``q``, chunk by
        chunk (:func:`~securefed.fusion.ckks_packed.packed_chunks`): its own ``P = [x_0 | 0 |
        0]`` with its secret key when ``q`` is itself, else ``Q = [x_1 | x_1 | x_1^2]`` under
        ``q``'s public key."""
        chunks = packed_chunks(len(flat), self.params.slots)
        if q == self.p:
            return [self.party.encrypt_owner_regions(flat[a:b]) for a, b in chunks]
        owner = self._recipient(q)
        return [self.party.encrypt_other_regions(flat[a:b], owner) for a, b in chunks]

    def decrypt(self, arrays, config, prefix: str, shape) -> np.ndarray:
        """Its output under its key from a message: ``(members, batch, width)`` float64.

        Raises:
            ValueError: the message names another key (misrouted), or lacks chunks.
        """
        self._check_key(config)
        blobs = _chunked(arrays, prefix)
        length = int(np.prod(shape))
        chunks = packed_chunks(length, self.params.slots) if self.packed else None
        due = len(chunks) if self.packed else -(-length // self.params.slots)
        if len(blobs) != due:
            raise ValueError(f"platform {self.p} got {len(blobs)} chunk(s) of {prefix}, {due} due")
        shape = tuple(int(v) for v in shape)
        if self.packed:
            shift = self.channel_config.output_shift_bits
            parts = [
                self.party.read(blob, b - a, shift)
                for blob, (a, b) in zip(blobs, chunks, strict=True)
            ]
            return np.concatenate(parts).reshape(shape)
        return self.party.decrypt(blobs, length).reshape(shape)

    def _check_key(self, config) -> None:
        named = str(config.get("ckks.key", ""))
        if named != self.key_id:
            raise ValueError(
                f"platform {self.p} was handed ciphertexts labelled for key {named!r}; its key "
                f"is {self.key_id!r}: misrouted (another platform's); refusing"
            )

    def encrypt_gradient(
        self, grad: np.ndarray, x0: np.ndarray | None = None, regions: int = REGIONS
    ):
        """``[[dL/dy_p]]`` (the full gradient), checked within the public bound; in the packed
        circuit ``G = [g | g x_0 | g]`` per chunk, with ``x0`` its own vector of the training
        forward, encrypted with its secret key (``regions`` 4 for a joined forward: its
        fourth region 0)."""
        _check_bound(grad, self.channel_config.grad_bound, f"platform {self.p}'s output gradient")
        flat = np.asarray(grad, np.float64).reshape(-1)
        if self.packed:
            x0 = np.asarray(x0, np.float64).reshape(-1)
            chunks = [
                self.party.encrypt_gradient_regions(flat[a:b], x0[a:b], regions)
                for a, b in packed_chunks(len(flat), self.params.slots)
            ]
        else:
            chunks = self.party.encrypt_for(flat, self.party)
        return {f"grad.{c}": _blob(v.serialize()) for c, v in enumerate(chunks)}

    def release(self, arrays, config, shape) -> dict[str, np.ndarray]:
        """The masked exchange's key-holder step: for every chunk and monomial, decrypt the
        masked product, sum each member's slots (segments it computes itself from the public
        shape: the server cannot ask for finer sums), flood at the floor of the stated bound
        (computed here, not taken from the server) and round."""
        self._check_key(config)
        shape = tuple(int(v) for v in shape)
        if self.packed:
            raise ValueError("the packed circuit releases by release_packed")
        length, per_member = int(np.prod(shape)), shape[1] * shape[2]
        slots = self.params.slots
        base = decryption_error_bound(self.params, 1)
        flooding, out = self.channel_config.flooding, {}
        for c, start in enumerate(range(0, length, slots)):
            segments = _segments(start, min(length, start + slots), per_member)
            local = [(a - start, b - start) for a, b in segments]
            bound = masked_sum_error_bound(
                base,
                self.degree,
                self.channel_config.value_bound,
                self.channel_config.grad_bound,
                max(b - a for a, b in segments),
            )
            std = flooding.std_for(bound)
            masked = _chunked(arrays, f"masked.{c}")
            due = len(monomials(self.config.num_platforms, self.degree))
            if len(masked) != due:
                raise ValueError(
                    f"platform {self.p} got {len(masked)} masked product(s) of chunk {c} to "
                    f"release, the circuit has {due} monomials: refusing (every extra release "
                    "would decrypt one more sum the server chose)"
                )
            for k, blob in enumerate(masked):
                out[f"released.{c}.{k}"] = self.party.release_sums(
                    blob, local, flooding, std, self.noise
                )
        return out

    def release_packed(self, arrays, config, g: np.ndarray, x0: np.ndarray):
        """The packed circuit's releases of one backward (the owner's step of
        :meth:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel.finish_backward`):
        per chunk, the sums ``sum g x_0^k`` of its own values the basis has (``own.<c>.<k>``)
        and the masked exchange's ``[[G Q + R]]`` (``released.<c>.0``), each member's slots
        summed per region (segments it computes itself from the public shape), flooded at the
        floor of the packed bound (computed here, not taken from the server) and rounded."""
        self._check_key(config)
        shape = tuple(int(v) for v in np.shape(g))
        flat_g, flat_x = np.asarray(g, np.float64).reshape(-1), np.asarray(x0).reshape(-1)
        length, per_member = int(np.prod(shape)), shape[1] * shape[2]
        flat_x = flat_x.astype(np.float64)
        basis = monomials(self.config.num_platforms, self.degree)
        owned = own_exponents(basis)
        # One masked product a chunk when another party's vector is in the circuit.
        due = int(self.config.variant != "fedq" and self.config.num_platforms > 1)
        flooding, out = self.channel_config.flooding, {}
        for c, (start, stop) in enumerate(packed_chunks(length, self.params.slots)):
            segments = _segments(start, stop, per_member)
            local = [(a - start, b - start) for a, b in segments]
            std = packed_flooding_std(
                self.channel_config, self.params, max(b - a for a, b in segments)
            )
            masked = _chunked(arrays, f"masked.{c}")
            if len(masked) != due:
                raise ValueError(
                    f"platform {self.p} got {len(masked)} masked product(s) of chunk {c} to "
                    f"release, the packed circuit has {due}: refusing (every extra release "
                    "would decrypt one more sum the server chose)"
                )
            terms = self.party.own_monomials(flat_g[start:stop], flat_x[start:stop])
            for k, (power, _) in enumerate(owned):
                out[f"own.{c}.{k}"] = self.party.release_own(
                    terms[power], local, flooding, std, self.noise
                )
            for k, blob in enumerate(masked):
                out[f"released.{c}.{k}"] = self.party.release_regions(
                    blob, segments, start, stop - start, flooding, std, self.noise
                )
        return out


def _digest(values) -> str:
    """A vector's digest (its shape and float64 bytes): what a repeat is checked by."""
    array = np.ascontiguousarray(
        values.detach().numpy() if hasattr(values, "detach") else values, np.float64
    )
    return hashlib.sha256(repr(array.shape).encode() + array.tobytes()).hexdigest()


def _check_bound(array: np.ndarray, bound: float, what: str) -> None:
    if not np.isfinite(array).all():
        raise ValueError(f"{what} contain NaN or infinity")
    peak = float(np.abs(array).max()) if array.size else 0.0
    if peak > bound:
        raise ValueError(
            f"{what} reach |{peak:.4g}|, above the CKKS channel's public bound {bound:g}; "
            "refusing to encrypt (the flooding's error bound rests on it)"
        )


# ----------------------------------------------------------------------------- the simulator
class SimulatorNode:
    """The shared user: the simulator, its streams and the episode rewards (evaluation only).

    Args:
        config: the run's configuration.
        tree: the node's seed tree (the simulator's streams at the in-process paths).
    """

    def __init__(self, config: FedSlateConfig, tree: SeedTree) -> None:
        self.config = config
        self.env = ChocKaleBatch(
            config.env_config(),
            config.members,
            EnvStreams.from_tree(
                tree, config.num_platforms, "env", shared_corpus=config.shared_corpus
            ),
        )
        self.rewards = np.zeros((config.episodes, config.members, config.num_platforms))
        self.episode = -1

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        env = self.env
        arrays = {
            "env.nke": env.nke,
            "env.docs": env.docs,
            "env.obs_sat": env.obs_sat,
            "env.history": env.history,
            "rewards": self.rewards,
        }
        meta = {
            "turn": env.turn,
            "remaining": env.remaining,
            "started": env._started,
            "episode": self.episode,
            "rngs": {k: _rng_state(g) for k, g in env.streams.named().items()},
        }
        return arrays, meta

    def load(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        env = self.env
        env.nke = np.array(arrays["env.nke"])
        env.docs = np.array(arrays["env.docs"])
        env.obs_sat = np.array(arrays["env.obs_sat"])
        env.history = np.array(arrays["env.history"])
        self.rewards = np.array(arrays["rewards"])
        env.turn, env.remaining, env._started = (
            int(meta["turn"]),
            int(meta["remaining"]),
            bool(meta["started"]),
        )
        self.episode = int(meta["episode"])
        for name, g in env.streams.named().items():
            _set_rng(g, meta["rngs"][name])

    def reset(self, keys: _Keys, episode: int) -> dict[str, np.ndarray]:
        """A new episode: new users; each platform's first observation, sealed for it."""
        self.env.reset()
        self.episode = episode
        return {
            f"sealed.{p}": keys.seal(
                "reset", episode, p + 1, {"x": features(self.env.observation(p), self.config)}
            )
            for p in range(self.config.num_platforms)
        }

    def step(
        self, keys: _Keys, round_id: int, sealed: Mapping[str, np.ndarray]
    ) -> tuple[dict, bool]:
        """The platforms' turns with their (sealed) slates; each outcome sealed for its platform."""
        out_arrays, done = {}, False
        for p in range(self.config.num_platforms):
            slate = keys.open("slate", round_id, p + 1, sealed[f"sealed.{p}"])["slate"]
            out = self.env.step(p, slate)
            self.rewards[self.episode, :, p] += out.engagement
            x_next = features(self.env.observation(p), self.config)
            done = out.done
            outcome = {
                "clicked": out.clicked,
                "feedback": out.feedback,
                "x_next": x_next,
                "done": np.array(done),
            }
            out_arrays[f"sealed.{p}"] = keys.seal("outcome", round_id, p + 1, outcome)
        return out_arrays, done


# ----------------------------------------------------------------------------- a platform
class PlatformNode:
    """One platform: its network, target, Adam, replay column, observation and DP half.

    Built from the run's streams at the in-process paths (``("init", "local", p)``, ``("agent",
    "explore")``, ``("fusion-dp", name)``, ``("local-dp", name)``); its saved state, if any, is
    loaded after (:meth:`load`).
    """

    def __init__(self, config: FedSlateConfig, p: int, tree: SeedTree) -> None:
        self.config, self.p = config, p
        self.name = PLATFORM_NAMES[p]
        dim = config.env_config().state_dim(p)
        self.local = local_network(config, dim, torch_generator(tree, "init", "local", p))
        self.target = local_network(config, dim)
        self.target.load_state_dict(self.local.state_dict())
        self.target.requires_grad_(False)
        self.opt = torch.optim.Adam(self.local.parameters(), lr=config.lr, fused=True)
        self.replay = ReplayBuffer(config.buffer_size, config.members, [dim], config.slate_size)
        self.act_rng = tree.generator("agent", "explore")
        self.choice = make_choice_model(config.choice_model)
        self.x = np.zeros((config.members, dim), np.float32)
        self.slate = np.zeros((config.members, config.slate_size), np.int64)
        self.work: dict[str, np.ndarray] = {}  # what one learning step keeps between messages
        self.updates = 0
        self.dp: DPParty | None = None
        self.sgd: LocalDPSGD | None = None
        if config.dp_epsilon is not None:
            options, local_sigma, local_steps = _dp_setup(config)
            self.dp = DPParty(
                self.name, options, tree.generator("fusion-dp", self.name), options.sigma()
            )
            if config.local_dp:
                self.dp.ledger.charge(
                    local_sigma, 1.0, steps=local_steps, server=(local_sigma, 1.0)
                )
                noise = tree.generator("local-dp", self.name)
                self.sgd = LocalDPSGD(
                    self.name, self.local, config.dp_local_clip, local_sigma, as_noise_source(noise)
                )

    # -- state ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = _module_arrays("local.", self.local) | _module_arrays("target.", self.target)
        arrays |= _optimiser_arrays("opt.", self.opt)
        replay = self.replay.state_dict()
        arrays |= {f"replay.{k}": v.numpy() for k, v in replay.items() if k != "position"}
        arrays |= {"x": self.x, "slate": self.slate} | {
            f"work.{k}": v for k, v in self.work.items()
        }
        meta = {
            "replay_position": list(replay["position"]),
            "updates": self.updates,
            "rngs": {"explore": _rng_state(self.act_rng)},
        }
        if self.dp is not None:
            meta["rngs"]["dp"] = _noise_state(self.dp.noise)
            meta["released"], meta["clamped"] = self.dp.released, self.dp.clamped
        if self.sgd is not None:
            meta["rngs"]["local_dp"] = _noise_state(self.sgd.noise)
        return arrays, meta

    def load(self, arrays: Mapping[str, np.ndarray], meta: Mapping) -> None:
        _load_module("local.", self.local, arrays)
        _load_module("target.", self.target, arrays)
        _load_optimiser("opt.", self.opt, arrays)
        replay = {
            k[len("replay.") :]: torch.from_numpy(np.array(v))
            for k, v in arrays.items()
            if k.startswith("replay.")
        }
        replay["position"] = list(meta["replay_position"])
        self.replay.load_state_dict(replay)
        self.x, self.slate = np.array(arrays["x"]), np.array(arrays["slate"])
        self.work = {
            k[len("work.") :]: np.array(v) for k, v in arrays.items() if k.startswith("work.")
        }
        self.updates = int(meta["updates"])
        _set_rng(self.act_rng, meta["rngs"]["explore"])
        if self.dp is not None:
            _set_noise_state(self.dp.noise, meta["rngs"]["dp"])
            self.dp.released.update(meta["released"])
            self.dp.clamped.update({k: list(v) for k, v in meta["clamped"].items()})
        if self.sgd is not None:
            _set_noise_state(self.sgd.noise, meta["rngs"]["local_dp"])

    # -- what a message asks ---------------------------------------------------------------
    def _release(self, value, tag: str, kind: str = "input"):
        """A row block as it leaves the node: as computed, or (DP) clipped and noised here."""
        if self.dp is None:
            return value, None
        check_counted_tag(self.dp.options, tag)
        clip = self.dp.options.clip if kind == "input" else self.dp.options.grad_clip
        return self.dp.release(value, clip, f"{tag}:{kind}", kind)

    def absorb(self, keys: _Keys, inbox: Sequence[tuple[str, int, int, np.ndarray]]) -> None:
        """Apply the sealed deliveries the server relayed, in order: a new episode's first
        observation, a round's outcome (written to the replay column, the round committed), a
        platform's TD targets (Algorithm 2's team target)."""
        for kind, counter, sender, blob in inbox:
            data = keys.open(kind, counter, sender, blob)
            if kind == "reset":
                self.x = data["x"]
            elif kind == "outcome":
                x_next = data["x_next"]
                self.replay.add(0, self.x, self.slate, data["clicked"], data["feedback"], x_next)
                self.x = x_next
                self.replay.commit(bool(data["done"]))
            elif kind == "targets":
                self.work[f"y.{sender - 1}"] = data["y"]
                self.work[f"valid.{sender - 1}"] = data["valid"]
            else:
                raise ValueError(f"unknown delivery {kind!r}")

    def act(self) -> np.ndarray:
        """The acting inquiry's row: ``Q_p`` on the frozen observation (numpy, as in process)."""
        return self._release(self.local.numpy_forward(self.x[:, None, :]), ACT)[0]

    def choose(self, keys: _Keys, round_id: int, fused: np.ndarray, eps: float) -> np.ndarray:
        """The platform's epsilon-greedy slate on its fused values, sealed for the simulator.

        Exploration: the in-process run draws one exploration batch over every platform's rows
        (``K S`` rows); each platform draws the same batch from its copy of the stream and uses
        its own rows, so a seeded run explores exactly as in process (the draws do not depend on
        any platform's data)."""
        config, k, s = self.config, self.config.num_platforms, self.config.members
        v, v_null = choice_weights(self.choice, self.x, config.num_candidates)
        greedy = select_slates(config.slate_method, fused, v, v_null, config.slate_size)
        marker = np.full((k * s, config.slate_size), -1, np.int64)
        drawn = explore(marker, eps, self.act_rng, config.num_candidates)[
            self.p * s : (self.p + 1) * s
        ]
        self.slate = np.where(drawn[:, :1] >= 0, drawn, greedy)
        return keys.seal("slate", round_id, SIMULATOR, {"slate": self.slate})

    def _xs(self, idx: np.ndarray, which: str = "x") -> np.ndarray:
        return self.replay.gather(getattr(self.replay, which), 0, idx)

    def target_values(self, idx: np.ndarray) -> np.ndarray:
        """Its target network's Q-values of the batch's next states (step 1)."""
        with torch.no_grad():
            q = self.target(torch.from_numpy(self._xs(idx, "x_next")))
        return self._release(q, TARGET)[0].numpy()

    def targets(
        self, keys: _Keys, idx: np.ndarray, done: np.ndarray, fused: np.ndarray, learn_step: int
    ) -> dict[str, np.ndarray]:
        """``Y_p`` and its validity from the target fusion (kept), sealed for every platform
        without rewards (their team target)."""
        config = self.config
        x_next = self._xs(idx, "x_next")
        nxt = self._xs(idx, "next_slate") if config.target == "sarsa" else None
        x_val = next_values(config, self.choice, fused, x_next, nxt)
        fb = self._xs(idx, "feedback")
        valid = ~np.isnan(fb)
        y = np.where(valid, fb, 0.0) * config.reward_scale
        y = (y + config.gamma * x_val * ~done).astype(np.float32)
        self.work["y"], self.work["valid"] = y, valid
        return {
            f"sealed.{q}": keys.seal("targets", learn_step, q + 1, {"y": y, "valid": valid})
            for q, f in enumerate(config.feedback)
            if not f
        }

    def learn_rows(self, idx: np.ndarray, updating: int, select: bool) -> dict[str, np.ndarray]:
        """Its Q-values of the batch's states for ``updating``'s exchange: ``select`` (for the
        greedy-slate fusion of a platform without rewards) and ``learn``; the updating platform
        also asks for its clicked positions in the clear when no DP hides them."""
        with torch.no_grad():
            q = self.local(torch.from_numpy(self._xs(idx)))
        out = {}
        if select:
            out["select"] = self._release(q, SELECT)[0].numpy()
        released, factors = self._release(q, LEARN)
        out["learn"] = released.numpy()
        if updating == self.p:
            self.work["idx"] = idx
            if factors is not None:
                self.work["factors"] = factors
            if self.config.feedback[self.p] and self.dp is None:
                out["positions"] = self._xs(idx, "clicked")[..., None]
        return out

    def greedy(self, fused: np.ndarray) -> np.ndarray:
        """B's greedy slate on its fused values (kept; sent only when no DP hides it)."""
        config = self.config
        xs = self._xs(self.work["idx"])
        v, v_null = choice_weights(self.choice, xs, config.num_candidates)
        s_, b_ = fused.shape[:2]
        n = config.num_candidates
        slates = select_slates(
            config.slate_method,
            fused.reshape(s_ * b_, n),
            v.reshape(s_ * b_, n),
            v_null.reshape(s_ * b_),
            config.slate_size,
        )
        self.work["positions"] = slates.reshape(s_, b_, config.slate_size)
        return self.work["positions"]

    def loss_gradient(self, fused: np.ndarray) -> np.ndarray:
        """``dL/dQf_p`` of its loss at the fused values it received (Algorithm 1 or 2)."""
        config, delta = self.config, self.config.huber_delta
        xs = self._xs(self.work["idx"])
        fused_t = torch.from_numpy(np.array(fused)).requires_grad_(True)
        private = self.dp is not None
        if config.feedback[self.p]:
            positions = torch.from_numpy(self._xs(self.work["idx"], "clicked"))[..., None]
            loss_of = partial(
                clicked_loss,
                y=torch.from_numpy(self.work["y"]),
                mask=torch.from_numpy(self.work["valid"]),
                delta=delta,
            )
        else:
            positions = torch.from_numpy(self.work["positions"])
            with_rewards = [q for q, f in enumerate(config.feedback) if f]
            stack_y = np.stack([self.work[f"y.{q}"] for q in with_rewards])
            stack_m = np.stack([self.work[f"valid.{q}"] for q in with_rewards])
            team_valid = stack_m.any(axis=0)
            team_y = (stack_y * stack_m).sum(axis=0) / np.maximum(stack_m.sum(axis=0), 1)
            v, v_null = choice_weights(self.choice, xs, config.num_candidates)
            loss_of = partial(
                slate_value_loss,
                v=torch.from_numpy(v.astype(np.float32)),
                v_null=torch.from_numpy(v_null.astype(np.float32)),
                y=torch.from_numpy(team_y.astype(np.float32)),
                mask=torch.from_numpy(team_valid),
                delta=delta,
            )
        chosen = torch.gather(fused_t, 2, positions) if private else fused_t
        loss = loss_of(chosen, positions)
        loss.backward()
        return self._release(fused_t.grad, LEARN, "grad")[0].numpy()

    def step(self, grads: np.ndarray) -> None:
        """Its network's step on ``dL/dQ_p`` the server returned (local DP-SGD under DP)."""
        idx = self.work["idx"]
        xs = torch.from_numpy(self._xs(idx))
        g = torch.from_numpy(np.array(grads))
        if "factors" in self.work:
            g = scaled_gradient(g, self.work["factors"])
        if self.sgd is not None:
            self.sgd.step(self.opt, xs, g, self.work["units"])
        else:
            own = self.local(xs)
            self.opt.zero_grad(set_to_none=True)
            own.backward(g)
            self.opt.step()
        self.updates += 1
        for key in ("idx", "factors", "positions", "units"):
            self.work.pop(key, None)

    def sync(self) -> None:
        self.target.load_state_dict(self.local.state_dict())

    def report(self) -> dict[str, np.ndarray]:
        out = _module_arrays("local.", self.local) | {"updates": np.array(self.updates)}
        if self.dp is not None:
            # Without local DP-SGD the epsilon is not established (one unit moves every later
            # row through the network trained on raw data): NaN, the fusion rows' figure beside.
            spent = self.dp.ledger.epsilon(against="server")
            out["epsilon"] = np.array(spent if self.config.local_dp else np.nan)
            out["epsilon_fusion_rows_only"] = np.array(spent)
        return out


def _noise_state(source) -> dict:
    """A seeded noise source's generator state (a secure source keeps none: it draws fresh
    operating-system entropy)."""
    generator = getattr(source, "generator", None)
    return {} if generator is None else _rng_state(generator)


def _set_noise_state(source, state: Mapping) -> None:
    generator = getattr(source, "generator", None)
    if generator is not None and state:
        _set_rng(generator, state)


# ----------------------------------------------------------------------------- the node's handler
def _inbox(
    arrays: Mapping[str, np.ndarray], config: Mapping
) -> list[tuple[str, int, int, np.ndarray]]:
    count = int(config.get("inbox", 0))
    return [
        (
            str(config[f"inbox.{i}.kind"]),
            int(config[f"inbox.{i}.counter"]),
            int(config[f"inbox.{i}.from"]),
            arrays[f"inbox.{i}"],
        )
        for i in range(count)
    ]


def handle(
    run: FedSlateFlowerRun,
    role: int,
    store: dict,
    config: Mapping[str, object],
    arrays: Mapping[str, np.ndarray],
    *,
    node_config: Mapping[str, object] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """One message to the node of ``role``: rebuild the node from ``store`` (its saved arrays
    and metadata), do what ``config["op"]`` asks, save it back; the reply's arrays and config.

    ``store`` is the node's private state (in Flower its ``Context.state``): ``"arrays"`` and
    ``"meta"`` (JSON-ready). ``node_config`` is the node's own configuration (in Flower its
    ``Context.node_config``): where its provisioned relay identity is (:func:`relay_identity`).
    The set-up is three message rounds: ``nonce`` answers the node's fresh nonce
    (:func:`relay_nonce`); ``hello`` takes every role's nonce (``nonce.<role>``), checks its own
    is in its place, and answers the node's X25519 relay key signed by its identity over the
    nonces' digest (:func:`relay_key_message`); ``keys`` takes the peers' keys only when each is
    signed by its role's identity in the pinned registry over that same digest (so no signed
    key of another run, or of a run whose nonces the server showed this node differently,
    verifies).
    """
    cfg = run.config
    saved = dict(store.get("arrays", {}))
    meta = dict(store.get("meta", {}))
    tree = _node_tree(cfg, meta)
    keys = _keys(role, tree, saved)
    op = str(config["op"])
    reply_arrays: dict[str, np.ndarray] = {}
    reply_config: dict[str, object] = {"role": role}
    ckks = None
    if cfg.fusion in ENCRYPTED_FUSIONS and role != SIMULATOR and op != "nonce":
        # Made at hello, where its public bytes (with the evaluation keys) are sent once.
        ckks = CKKSPlatform(cfg, role - 1, tree, saved, meta)
    if op == "nonce":
        if "nonce" in meta:
            raise SignatureError(
                f"node {role} already gave this run's set-up its nonce and was asked again; "
                "refusing"
            )
        nonce = relay_nonce(cfg, role, tree)
        meta["nonce"] = nonce.hex()
        reply_arrays["nonce"] = np.frombuffer(nonce, np.uint8).copy()
        node = None
    elif op == "hello":
        if "nonce" not in meta:
            raise SignatureError(
                f"node {role} was asked for its signed relay key before giving its set-up nonce "
                "(the key is signed over every node's nonce); refusing"
            )
        transcript = _checked_transcript(role, run.nodes, bytes.fromhex(meta["nonce"]), arrays)
        if meta.get("transcript", transcript.hex()) != transcript.hex():
            raise SignatureError(
                f"node {role} already signed its relay key over other set-up nonces; refusing"
            )
        meta["transcript"] = transcript.hex()
        identity = relay_identity(run, role, node_config or {})
        reply_arrays["public"] = np.frombuffer(keys.pair.public, np.uint8).copy()
        reply_arrays["signature"] = _sign_relay_key(identity, role, keys.pair.public, transcript)
        if ckks is not None:
            public = ckks.party.public_bytes()
            message = ckks_key_message(identity.registry.digest, role, public, transcript)
            reply_arrays["ckks.public"] = _blob(public)
            reply_arrays["ckks.signature"] = _blob(identity.signer(role).sign(message))
        node = None
    else:
        node = SimulatorNode(cfg, tree) if role == SIMULATOR else PlatformNode(cfg, role - 1, tree)
        if "node" in meta:
            node.load(saved, meta["node"])
    if op == "keys":
        if "transcript" not in meta:
            raise SignatureError(
                f"node {role} was handed its peers' relay keys before signing its own over "
                "the run's set-up nonces; refusing"
            )
        identity = relay_identity(run, role, node_config or {})
        transcript = bytes.fromhex(meta["transcript"])
        peers = _pinned_peers(identity, role, run.nodes, arrays, transcript)
        if keys.peers and keys.peers != peers:
            raise SignatureError(
                f"node {role} already holds its peers' relay keys and was handed others; refusing"
            )
        for peer, public in peers.items():
            saved[f"peer.{peer}"] = np.frombuffer(public, np.uint8).copy()
            keys.peers[peer] = public
        if ckks is not None:
            saved |= _pinned_ckks_contexts(identity, role, run.nodes, arrays, ckks, transcript)
    elif role == SIMULATOR and op == "reset":
        reply_arrays = node.reset(keys, int(config["episode"]))
    elif role == SIMULATOR and op == "step":
        reply_arrays, done = node.step(keys, int(config["round"]), arrays)
        reply_config["done"] = bool(done)
    elif op == "finish":
        if isinstance(node, PlatformNode):
            node.absorb(keys, _inbox(arrays, config))
        _write_result(run, role, node)
    elif isinstance(node, PlatformNode) and ckks is not None:
        node.absorb(keys, _inbox(arrays, config))
        reply_arrays = _encrypted_op(node, ckks, keys, op, arrays, config)
    elif isinstance(node, PlatformNode):
        node.absorb(keys, _inbox(arrays, config))
        if op == "act":
            reply_arrays["q"] = node.act()
        elif op == "choose":
            reply_arrays["sealed"] = node.choose(
                keys, int(config["round"]), arrays["fused"], float(config["eps"])
            )
        elif op == "target_values":
            reply_arrays["q"] = node.target_values(arrays["idx"])
        elif op == "targets":
            reply_arrays = node.targets(
                keys, arrays["idx"], arrays["done"], arrays["fused"], int(config["learn_step"])
            )
        elif op == "learn_rows":
            if "units" in arrays:
                node.work["units"] = np.array(arrays["units"])
            reply_arrays = node.learn_rows(
                arrays["idx"], int(config["updating"]), bool(config["select"])
            )
        elif op == "greedy":
            positions = node.greedy(arrays["fused"])
            if node.dp is None:
                reply_arrays["positions"] = positions
        elif op == "loss":
            reply_arrays["grad"] = node.loss_gradient(arrays["fused"])
        elif op == "local_step":
            node.step(arrays["grad"])
        elif op == "sync":
            node.sync()
        elif op != "deliver":
            raise ValueError(f"platform {role - 1} got an unknown request {op!r}")
    elif op not in ("keys", "hello", "nonce"):
        raise ValueError(
            f"node {role} ({'simulator' if role == SIMULATOR else 'platform'}) got an unknown "
            f"request {op!r}"
        )
    if ckks is not None:
        ckks.save(meta)
    if node is not None:
        node_arrays, node_meta = node.state()
        saved = {k: v for k, v in saved.items() if k.startswith(("peer.", "ckks."))} | node_arrays
        meta["node"] = node_meta
    store["arrays"], store["meta"] = saved, json.loads(json.dumps(meta, default=_json_default))
    return reply_arrays, reply_config


def _pinned_ckks_contexts(
    identity: NodeIdentity,
    me: int,
    roles: int,
    arrays: Mapping[str, np.ndarray],
    ckks,
    transcript: bytes,
) -> dict[str, np.ndarray]:
    """The other platforms' CKKS public contexts the server relayed, each taken only with its
    owner's signature in the pinned registry (a context the server substituted, under a key it
    holds, would have this platform encrypt its rows for the server) and only without a secret
    key in it."""
    out = {}
    for role in range(1, roles):
        if role == me:
            continue
        if f"ckks.{role}" not in arrays or f"ckks.sig.{role}" not in arrays:
            raise SignatureError(
                f"node {me} was handed no signed CKKS public context of platform {role - 1}; "
                "refusing"
            )
        public = _bytes(arrays[f"ckks.{role}"])
        try:
            identity.registry.verify(
                role,
                ckks_key_message(identity.registry.digest, role, public, transcript),
                _bytes(arrays[f"ckks.sig.{role}"]),
                what=f"CKKS public context (role {role})",
            )
        except SignatureError as error:
            raise SignatureError(
                f"node {me} refuses the CKKS public context the server handed it as platform "
                f"{role - 1}'s: it is not signed by role {role}'s identity in the pinned "
                "registry (a key substituted by the server, or another platform's relabelled); "
                "refusing"
            ) from error
        # Refuses bytes holding a secret key, or of other parameters than the configured ones.
        server_context_from_bytes(public, ckks.params, f"platform {role - 1}")
        # Kept with its public key only: this platform encrypts with it, nothing more.
        encrypting = ts.context_from(public, n_threads=1).serialize(
            save_public_key=True, save_secret_key=False, save_galois_keys=False,
            save_relin_keys=False,
        )  # fmt: skip
        out[f"ckks.peer.{role}"] = _blob(encrypting)
    return out


def _outputs(config: Mapping, node: PlatformNode) -> list[int]:
    """The output platforms a node encrypts its rows for (itself alone without cross terms)."""
    asked = [int(v) for v in str(config.get("outputs", "")).split(",") if v != ""]
    if node.config.variant == "fedq":
        return [q for q in asked if q == node.p]
    return asked


def _encrypted_op(node: PlatformNode, ckks: CKKSPlatform, keys, op: str, arrays, config):
    """A platform's request under ``ckks``: the plaintext flow's steps, its rows leaving
    encrypted under the output platforms' keys and its fused values arriving under its own key
    (decrypted, positions picked, here). The shapes it decrypts and releases by are its own.

    Packed circuit, the remote ``repeat_inquiries`` (:class:`CKKSPlatform` checks each on its
    node, by name): ``join`` in a ``target_values`` request sends the joining platform's
    training rows with the target rows in one ciphertext (:meth:`CKKSPlatform.check_join`);
    ``repeat`` (the id of a forward it sent) makes a training forward repeat that forward's
    ciphertexts (:meth:`CKKSPlatform.check_repeat`: its own vectors, the weights unchanged),
    the owner computing its loss on the values it decrypted once, in the same message
    (``targets`` or ``greedy``). One output gradient a training forward: a second ``loss``
    (a second decryption and release of its values) is refused. Under ``ckks+dp`` neither:
    each row is its own noisy release."""
    cfg = node.config
    n = cfg.num_candidates
    if "idx" in arrays and np.shape(arrays["idx"]) != (cfg.members, cfg.batch_size):
        # The released sums are over a batch of the run's size: a smaller one would be finer.
        raise InsecureParameterError(
            f"platform {node.p} was asked for a batch of shape {np.shape(arrays['idx'])} under "
            f"ckks, not the run's (members, batch_size) = {(cfg.members, cfg.batch_size)}; "
            "refusing"
        )
    if ("repeat" in config or "join" in config) and (node.dp is not None or not ckks.packed):
        # Refused before any row is released: no noisy row spent, none released twice.
        raise InsecureParameterError(
            f"platform {node.p} was asked for a {'repeated' if 'repeat' in config else 'joined'} "
            f"forward ({op}) under {cfg.fusion} in the {ckks.channel_config.circuit} circuit: "
            "under ckks+dp every forward's rows are their own noisy release (a repeat would "
            "release a second noisy row of one forward's values, or reuse one across two), and "
            "only the packed circuit repeats or joins; refusing"
        )
    if op == "act":
        row, outputs = node.act(), _outputs(config, node)
        ckks.record(outputs, row, config)
        return ckks.encrypt_rows("act", row, outputs)
    if op == "choose":
        # The acting row's shape and dtype (not released again: under DP a release counts).
        row = node.local.numpy_forward(node.x[:, None, :])
        fused = ckks.decrypt(arrays, config, "fused", row.shape)[:, 0].astype(row.dtype)
        return {"sealed": node.choose(keys, int(config["round"]), fused, float(config["eps"]))}
    if op == "target_values":
        q_next, outputs = node.target_values(arrays["idx"]), _outputs(config, node)
        if "join" not in config:
            ckks.record(outputs, q_next, config)
            return ckks.encrypt_rows("q", q_next, outputs)
        # The joining platform's training forward announced: its rows (as learn_rows would
        # send them) in regions 0-2 of the target forward's ciphertext.
        joiner = int(config["join"])
        ckks.check_join(outputs, joiner, np.shape(q_next))
        ckks.exchanges += 1  # the joining platform's training exchange starts here
        rows = node.learn_rows(arrays["idx"], joiner, False)
        if joiner == node.p:
            node.work["x0"] = rows["learn"]  # its own vector of the training forward (G's)
            node.work["regions"] = np.array(REGIONS + 1)
            node.work.pop("g", None)
        ckks.record(outputs, rows["learn"], config, joined=True)
        return ckks.encrypt_joined("q", rows["learn"], q_next, joiner)
    idx = arrays["idx"] if "idx" in arrays else node.work.get("idx")
    shape = None if idx is None else (cfg.members, np.shape(idx)[-1], n)
    if op == "targets":
        if "repeat" not in config:
            fused = ckks.decrypt(arrays, config, "fused", shape).astype(np.float32)
            return node.targets(
                keys, arrays["idx"], arrays["done"], fused, int(config["learn_step"])
            )
        # Its training forward repeats the joined one: checked first, then decrypted once.
        if not ckks.check_repeat(node.p, config, _learn_vector(node))["joined"]:
            raise ValueError(
                f"platform {node.p} was asked to read a joined output of forward "
                f"{config['repeat']}, which it sent unjoined: refusing"
            )
        learn, fused = ckks.decrypt_joined(arrays, config, "fused", shape)
        sealed = node.targets(
            keys, arrays["idx"], arrays["done"], fused.astype(np.float32),
            int(config["learn_step"]),
        )  # fmt: skip
        return sealed | _packed_loss(node, ckks, learn)
    if op == "learn_rows":
        if "units" in arrays:
            node.work["units"] = np.array(arrays["units"])
        ckks.exchanges += 1  # a training exchange: the server's weights step at its end
        updating, select = int(config["updating"]), bool(config["select"])
        rows = node.learn_rows(arrays["idx"], updating, select)
        if ckks.packed and updating == node.p:
            node.work["x0"] = rows["learn"]  # its own vector of the training forward (G's)
            node.work["regions"] = np.array(REGIONS)
            node.work.pop("g", None)
        outputs = _outputs(config, node)
        out = {}
        if "select" in rows:
            ckks.record(outputs, rows["select"], config)
            out |= ckks.encrypt_rows("select", rows["select"], outputs)
        if "repeat" in config:  # the training forward repeats the select forward: not sent
            for q in outputs:
                ckks.check_repeat(q, config, rows["learn"])
            return out
        learn = dict(config) | {"forward": int(config.get("forward", -1)) + ("select" in rows)}
        ckks.record(outputs, rows["learn"], learn)
        return out | ckks.encrypt_rows("learn", rows["learn"], outputs)
    if op == "greedy":
        if "repeat" in config:  # checked before the values are decrypted
            ckks.check_repeat(node.p, config, _learn_vector(node))
        fused = ckks.decrypt(arrays, config, "fused", shape)
        node.greedy(fused.astype(np.float32))
        if "repeat" not in config:
            return {}
        # Its training forward repeats this select forward: the loss on the values decrypted
        # here (once), the output gradient in the reply.
        return _packed_loss(node, ckks, fused)
    if op == "loss":
        _check_one_release(node)  # before decrypting: a forward's values are released once
        full = ckks.decrypt(arrays, config, "fused", shape)
        if ckks.packed:
            return _packed_loss(node, ckks, full)
        full_grad = _output_gradient(node, full)
        node.work["g"] = full_grad
        return ckks.encrypt_gradient(full_grad)
    if op == "local_step":
        if ckks.packed and ("g" not in node.work or "x0" not in node.work):
            raise ValueError(
                f"platform {node.p} was asked to release a packed backward without a loss of "
                "its own training forward since the last one: refusing (one release a step)"
            )
        dx = ckks.decrypt(arrays, config, "dx", shape)
        if ckks.packed:
            released = ckks.release_packed(arrays, config, node.work.pop("g"), node.work["x0"])
            node.work.pop("x0")
            node.work.pop("regions", None)
        else:
            released = ckks.release(arrays, config, shape)
            node.work.pop("g", None)
        ckks.exchanges += 1  # its backward: the server's weights step
        node.step(dx.astype(np.float32))
        return released
    if op == "sync":
        node.sync()
        return {}
    if op == "deliver":
        return {}
    raise ValueError(f"platform {node.p} got an unknown request {op!r}")


def _learn_vector(node: PlatformNode) -> np.ndarray:
    """The training rows it would send now for its own exchange (``learn_rows``'s, no DP: a
    repeat is never asked under it), what a repeat of its own forward is checked by."""
    if "idx" not in node.work:
        raise ValueError(
            f"platform {node.p} was asked to repeat a training forward without a training "
            "exchange of its own: refusing"
        )
    with torch.no_grad():
        return node.local(torch.from_numpy(node._xs(node.work["idx"]))).numpy()


def _check_one_release(node: PlatformNode) -> None:
    """Refuse a second output gradient of one training forward (a second decryption and
    release of its values; under ckks+dp a second noisy row of it)."""
    if "g" in node.work:
        raise ValueError(
            f"platform {node.p} already released its output gradient of this training forward "
            "and was asked for another (a second decryption and release of one forward's "
            "values; under ckks+dp a second noisy row): refusing"
        )
    if "idx" not in node.work:
        raise ValueError(
            f"platform {node.p} was asked for a loss without a training forward of its own: "
            "refusing"
        )


def _output_gradient(node: PlatformNode, full: np.ndarray) -> np.ndarray:
    """``dL/dQf_p`` at every position of its fused values ``full``: its loss's positions
    picked here, or (DP) every entry's, clipped, noised and clamped on the node."""
    cfg = node.config
    if cfg.feedback[node.p]:
        positions = node._xs(node.work["idx"], "clicked")[..., None]
    else:
        positions = node.work["positions"]
    if node.dp is None:
        grad = node.loss_gradient(pick(full, positions).astype(np.float32))
        return scatter_positions(grad, positions, cfg.num_candidates)
    return node.loss_gradient(full.astype(np.float32)).astype(np.float64)


def _packed_loss(node: PlatformNode, ckks: CKKSPlatform, full: np.ndarray) -> dict:
    """The packed circuit's loss step: ``G`` of its output gradient at ``full`` and its own
    training vector (kept, with the gradient, for its releases at ``local_step``)."""
    _check_one_release(node)
    if "x0" not in node.work:
        raise ValueError(
            f"platform {node.p} was asked for a loss without its own training forward: refusing"
        )
    full_grad = _output_gradient(node, full)
    node.work["g"] = full_grad  # released (its own sums, the masked exchange) at local_step
    regions = int(node.work.get("regions", REGIONS))
    return ckks.encrypt_gradient(full_grad, node.work["x0"], regions)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a node's state")


def _write_result(run: FedSlateFlowerRun, role: int, node) -> None:
    if not run.output_dir:
        return
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(node, SimulatorNode):
        np.savez(out / "fedslate-simulator.npz", rewards=node.rewards)
    else:
        np.savez(out / f"fedslate-platform-{node.name}.npz", **node.report())


def _write_server_result(
    run: FedSlateFlowerRun, outcome: FedSlateFlowerOutcome, result: FlowerRunResult
) -> None:
    """The ServerApp's record in ``output_dir`` (``""``: none): ``result.json`` (counters,
    message rounds and bytes, seconds, ``secure_mode``) and ``server.npz`` (the server network's
    parameters, ``server.<name>``), so that a run on real processes can be compared with one in
    process (:func:`server_results`)."""
    if not run.output_dir:
        return
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "fusion": run.config.fusion,
        "secure_mode": run.config.seed is None,
        "nodes": run.nodes,
        "rounds": outcome.rounds,
        "learn_steps": outcome.learn_steps,
        "messages": dict(outcome.messages),
        "message_rounds": int(sum(outcome.messages.values())),
        "message_bytes": dict(outcome.message_bytes),
        "seconds": outcome.seconds,
        "cpu_seconds": outcome.cpu_seconds,
        "episode_seconds": list(outcome.episode_seconds),
        "message_seconds": dict(result.message_seconds),
    }
    arrays = {
        f"server.{name}": value.detach().cpu().numpy()
        for name, value in outcome.channel.module.state_dict().items()
    }
    np.savez(out / "server.npz", **arrays)
    (out / "result.json").write_text(dumps_record(summary, indent=1))


def server_results(out_dir: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What the ServerApp wrote (:func:`_write_server_result`): the summary and the server
    network's parameters by name."""
    out = Path(out_dir)
    summary = json.loads((out / "result.json").read_text())
    with np.load(out / "server.npz", allow_pickle=False) as saved:
        params = {name.removeprefix("server."): saved[name] for name in saved.files}
    return summary, params


def node_results(out_dir: str | Path, config: FedSlateConfig) -> dict[str, dict[str, np.ndarray]]:
    """What the nodes wrote after the run: ``"simulator"`` (``rewards`` ``(episodes, S, K)``)
    and each platform's name (``local.*`` parameters, ``updates``; under DP ``epsilon``, its
    ledger's epsilon against the server, NaN with ``dp_local_training="none"``, where it is not
    established, and ``epsilon_fusion_rows_only``)."""
    out = Path(out_dir)
    results = {"simulator": dict(np.load(out / "fedslate-simulator.npz", allow_pickle=False))}
    for name in PLATFORM_NAMES[: config.num_platforms]:
        results[name] = dict(np.load(out / f"fedslate-platform-{name}.npz", allow_pickle=False))
    return results


# ----------------------------------------------------------------------------- the server half
Exchange = Callable[[str, Mapping[int, tuple[dict, dict]]], dict[int, tuple[dict, dict]]]
"""``exchange(op, {role: (arrays, config)}) -> {role: (arrays, config)}``: one message round."""


@dataclass
class FedSlateFlowerOutcome:
    """What the ServerApp produced.

    Attributes:
        channel: the server's fusion channel (its ``module`` is the trained server network,
            its ``view`` what the server saw: the same view as the in-process run's).
        rounds, learn_steps: counters of the run.
        message_bytes: array payload bytes down / up in Flower messages.
        messages: message rounds by request kind.
        seconds: wall seconds of the server's loop; cpu_seconds: its process CPU seconds.
        episode_seconds: wall seconds per episode.
    """

    channel: object = None
    rounds: int = 0
    learn_steps: int = 0
    message_bytes: dict[str, int] = field(default_factory=lambda: {"down": 0, "up": 0})
    messages: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    episode_seconds: list[float] = field(default_factory=list)


class _Server:
    """The ServerApp's half: the server network behind its channel, the replay's public
    schedule and sampling stream, the relay of sealed blobs."""

    def __init__(
        self, run: FedSlateFlowerRun, exchange: Exchange, outcome: FedSlateFlowerOutcome
    ) -> None:
        cfg = run.config
        self.run, self.config, self.exchange, self.outcome = run, cfg, exchange, outcome
        tree = SeedTree(cfg.seed) if cfg.seed is not None else SeedTree()
        k = cfg.num_platforms
        self.names = PLATFORM_NAMES[:k]
        server = server_network(cfg, torch_generator(tree, "init", "server"))
        opt = torch.optim.Adam(server.parameters(), lr=cfg.server_lr or cfg.lr, fused=True)
        self.encrypted = cfg.fusion in ENCRYPTED_FUSIONS
        self.packed = False  # the packed CKKS circuit (set with the channel, _build_ckks)
        # Under ckks the channel is the server half alone, built from the platforms' public
        # contexts once they sent them (keys()).
        self._unbuilt = (server, opt, tree) if self.encrypted else None
        self.key_ids: dict[int, str] = {}
        self.channel = (
            None
            if self.encrypted
            else build_fusion_channel(
                "plaintext",
                self.names,
                server,
                opt,
                cfg.fusion_needs(),
                target=server_network(cfg),
                cross=cfg.variant != "fedq",
                keep_payloads=run.keep_payloads,
                total_rounds=cfg.episodes * cfg.steps_per_platform,
            )
        )
        self._dp_public = None
        if cfg.dp_epsilon is not None:
            options, local_sigma, _ = _dp_setup(cfg)
            self._dp_public = {
                "placement": "local (each platform's node)",
                "noise_multiplier": options.sigma(),
                "clip": options.clip,
                "grad_clip": options.grad_clip,
                "unit_releases": options.releases_per_unit,
                "epsilon_budget": options.epsilon,
                "delta": options.delta,
                "local_sgd_noise_multiplier": local_sigma,
            }
            if not self.encrypted:  # under ckks+dp: with the channel (_build_ckks)
                self._record_dp(self.channel)
        self.replay = ReplayBuffer(cfg.buffer_size, cfg.members, [1] * k, cfg.slate_size)
        self.replay_unit = np.zeros(cfg.buffer_size, np.int64)
        self.replay_rng = tree.generator("agent", "replay")
        self.inbox: dict[int, list[tuple[str, int, int, np.ndarray]]] = {p: [] for p in range(k)}
        self.with_rewards = [p for p, f in enumerate(cfg.feedback) if f]
        self.without_rewards = [p for p, f in enumerate(cfg.feedback) if not f]
        self.rounds = self.learn_steps = 0
        outcome.channel = self.channel
        self.everyone = ",".join(str(p) for p in range(k))
        # The remote repeat_inquiries (packed circuit): each forward's id and the online
        # weights' version (their steps) go with every forward's request; the training
        # forwards that repeat a joined forward wait here with their owner's gradient.
        self.forwards = self.version = 0
        self.joined: dict[int, dict[str, np.ndarray]] = {}

    def _record_dp(self, channel) -> None:
        """The DP mechanism's public parameters in the channel's view (the rows it receives
        were clipped and noised, under ckks+dp also clamped and scaled, on the nodes)."""
        channel.view.channel = self.config.fusion
        channel.view.public["dp"] = dict(self._dp_public)

    # -- messaging -----------------------------------------------------------------------
    def _ask(
        self, op: str, requests: Mapping[int, tuple[dict, dict]]
    ) -> dict[int, tuple[dict, dict]]:
        self.outcome.messages[op] = self.outcome.messages.get(op, 0) + 1
        return self.exchange(op, requests)

    def platforms(self, op: str, per: Mapping[int, tuple[dict, dict]]) -> dict[int, dict]:
        """A message round with platforms (by index), each carrying its relayed deliveries."""
        requests = {}
        for p, (arrays, config) in per.items():
            arrays, config = dict(arrays), dict(config) | {"op": op}
            items = self.inbox[p]
            config["inbox"] = len(items)
            for i, (kind, counter, sender, blob) in enumerate(items):
                arrays[f"inbox.{i}"] = blob
                config |= {
                    f"inbox.{i}.kind": kind,
                    f"inbox.{i}.counter": counter,
                    f"inbox.{i}.from": sender,
                }
            self.inbox[p] = []
            requests[p + 1] = (arrays, config)
        return {role - 1: arrays for role, (arrays, _) in self._ask(op, requests).items()}

    def all_platforms(
        self, op: str, arrays: dict | None = None, config: dict | None = None
    ) -> dict[int, dict]:
        return self.platforms(
            op, {p: (arrays or {}, config or {}) for p in range(self.config.num_platforms)}
        )

    def simulator(self, op: str, arrays: dict, config: dict) -> tuple[dict, dict]:
        return self._ask(op, {SIMULATOR: (arrays, dict(config) | {"op": op})})[SIMULATOR]

    def relay(self, sealed: Mapping[str, np.ndarray], kind: str, counter: int, sender: int) -> None:
        for name, blob in sealed.items():
            self.inbox[int(name.split(".")[1])].append((kind, counter, sender, blob))

    # -- the run -------------------------------------------------------------------------
    def keys(self) -> None:
        roles = range(self.config.num_platforms + 1)
        contributed = self._ask("nonce", {r: ({}, {"op": "nonce"}) for r in roles})
        nonces = {f"nonce.{r}": contributed[r][0]["nonce"] for r in roles}
        hello = self._ask("hello", {r: (nonces, {"op": "hello"}) for r in roles})
        public = {f"peer.{r}": hello[r][0]["public"] for r in roles}
        public |= {f"sig.{r}": hello[r][0]["signature"] for r in roles}
        if self.encrypted:
            platforms = range(1, self.config.num_platforms + 1)
            public |= {f"ckks.{r}": hello[r][0]["ckks.public"] for r in platforms}
            public |= {f"ckks.sig.{r}": hello[r][0]["ckks.signature"] for r in platforms}
            self._build_ckks({r - 1: _bytes(hello[r][0]["ckks.public"]) for r in platforms})
        self._ask("keys", {r: (public, {"op": "keys"}) for r in roles})

    def _build_ckks(self, publics: Mapping[int, bytes]) -> None:
        """The server half of the CKKS channel on the platforms' public contexts (refusing
        bytes that hold a secret key): no key party, no value, only ciphertexts."""
        cfg = self.config
        server, opt, tree = self._unbuilt
        # Under ckks+dp the channel's bounds are the clamp's (_ckks_setup), as in process.
        channel_config = _ckks_setup(cfg)[0]
        packed = channel_config.circuit == "packed"
        self.packed = packed
        channel_class = PackedCKKSModuleFusionChannel if packed else CKKSModuleFusionChannel
        self.channel = channel_class(
            self.names,
            server,
            opt,
            target=server_network(cfg),
            members=cfg.members,
            cross=cfg.variant != "fedq",
            seeds=tree,
            config=channel_config,
            keep_payloads=self.run.keep_payloads,
            total_rounds=cfg.episodes * cfg.steps_per_platform,
            public_contexts={self.names[p]: publics[p] for p in publics},
        )
        self.key_ids = {p: public_key_id(publics[p]) for p in publics}
        self.outcome.channel = self.channel
        if self._dp_public is not None:
            self._record_dp(self.channel)

    @property
    def repeats(self) -> bool:
        """Whether training forwards repeat (the packed circuit's ``repeat_inquiries``; not
        under ckks+dp, where each forward's rows are their own noisy release, so none repeats
        in process either)."""
        return (
            self.packed and self.channel.config.repeat_inquiries and self.config.dp_epsilon is None
        )

    def joins(self, shape) -> bool:
        """Whether the first Algorithm-1 forward joins the targets' forward (the in-process
        :meth:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel.announce`'s rule,
        from the public shape: two parties with cross terms, ``4 n <= N / 2``)."""
        length = int(np.prod(shape))
        return self.repeats and self.channel.announces and 4 * length <= self.channel.params.slots

    def _ids(self) -> dict[str, int]:
        """The next forward's id and the online weights' version, for a forward's request."""
        return {"forward": self.forwards, "version": self.version}

    def _serve(self, rows, prefix: str, outputs: Sequence[int], shape, **inquiry):
        """The server half's forward on the rows' ciphertexts: ``p`` -> (arrays, config) of
        its output's message (``fused.<chunk>`` under its key, labelled with its key's id)."""
        names = self.names
        ciphertexts = {
            names[p]: {
                names[q]: _chunked(rows[q], f"{prefix}.{p}")
                for q in rows
                if f"{prefix}.{p}.0" in rows[q]
            }
            for p in outputs
        }
        served = self.channel.serve_forward(
            ciphertexts, shape=shape, outputs=[names[p] for p in outputs], **inquiry
        )
        self.forwards += 1
        return {p: self._down(p, {"fused": served[names[p]]}) for p in outputs}

    def _down(self, p: int, blobs: Mapping[str, Sequence]) -> tuple[dict, dict]:
        arrays = {}
        for prefix, chunks in blobs.items():
            for c, chunk in enumerate(chunks):
                if isinstance(chunk, (list, tuple)):
                    arrays |= {f"{prefix}.{c}.{k}": _blob(b) for k, b in enumerate(chunk)}
                else:
                    arrays[f"{prefix}.{c}"] = _blob(chunk)
        return arrays, {"ckks.key": self.key_ids[p]}

    def episode(self, episode: int) -> None:
        cfg, names, channel = self.config, self.names, self.channel
        sealed, _ = self.simulator("reset", {}, {"episode": episode})
        self.relay(sealed, "reset", episode, SIMULATOR)
        done = False
        while not done:
            channel = self.channel
            channel.open_round(self.rounds)
            eps = cfg.epsilon(self.rounds)
            step = {"round": self.rounds, "eps": eps}
            if self.encrypted:
                rows = self.all_platforms("act", config={"outputs": self.everyone} | self._ids())
                shape = (cfg.members, 1, cfg.num_candidates)
                down = self._serve(rows, "act", list(rows), shape, train=False, tag=ACT)
                per = {p: (a, c | step) for p, (a, c) in down.items()}
            else:
                rows = self.all_platforms("act")
                fused = channel.forward(
                    {names[p]: rows[p]["q"] for p in rows},
                    outputs=list(names),
                    train=False,
                    tag=ACT,
                )
                per = {p: ({"fused": np.asarray(fused[names[p]])[:, 0]}, step) for p in rows}
            slates = self.platforms("choose", per)
            step_arrays = {f"sealed.{p}": slates[p]["sealed"] for p in slates}
            outcomes, config = self.simulator("step", step_arrays, {"round": self.rounds})
            done = bool(config["done"])
            self.relay(outcomes, "outcome", self.rounds, SIMULATOR)
            self.replay_unit[self.replay.head] = episode
            self.replay.commit(done)
            self.rounds += 1
            if self.rounds > cfg.burn_in and self.rounds % cfg.learn_every == 0:
                self.learn()
                self.learn_steps += 1
            if self.rounds % cfg.target_sync == 0:
                self.all_platforms("sync")
                channel.sync_target()

    def learn(self) -> None:
        cfg, names, channel = self.config, self.names, self.channel
        idx = self.replay.sample(self.replay_rng, cfg.batch_size, cfg.target == "sarsa")
        units = self.replay_unit[idx]
        done = self.replay.done[idx]
        # 1. targets, for each platform with rewards (its own Y_p, sealed for the others).
        shape = (cfg.members, idx.shape[-1], cfg.num_candidates)
        for p in self.with_rewards:
            step = {"learn_step": self.learn_steps}
            # The first Algorithm-1 forward joins its targets' forward (as announced in
            # process): its rows travel in this request, its loss in the targets' reply.
            join = self.encrypted and p == self.with_rewards[0] and self.joins(shape)
            if self.encrypted:
                ids = self._ids()
                asked = {"outputs": str(p)} | ids | ({"join": p} if join else {})
                q_next = self.all_platforms("target_values", {"idx": idx}, asked)
                joined = {"joined": True} if join else {}  # (the monomial circuit: never)
                a, c = self._serve(
                    q_next, "q", [p], shape, network="target", train=False, tag=TARGET, **joined
                )[p]
                if join:
                    c |= {"repeat": ids["forward"], "version": self.version}
                request = ({"idx": idx, "done": done} | a, c | step)
            else:
                q_next = self.all_platforms("target_values", {"idx": idx})
                msgs = {names[q]: torch.from_numpy(q_next[q]["q"]) for q in q_next}
                fused = channel.forward(
                    msgs, outputs=[names[p]], network="target", train=False, tag=TARGET
                )
                request = ({"idx": idx, "done": done, "fused": fused[names[p]].numpy()}, step)
            reply = self.platforms("targets", {p: request})[p]
            sealed = {k: v for k, v in reply.items() if k.startswith("sealed.")}
            if join:
                self.joined[p] = {k: v for k, v in reply.items() if k.startswith("grad.")}
            self.relay(sealed, "targets", self.learn_steps, p + 1)
        # 2. Algorithm 1, then 3. Algorithm 2: one exchange per updating platform.
        for p in self.with_rewards + self.without_rewards:
            self.exchange_update(p, idx, units)

    def exchange_update(self, p: int, idx: np.ndarray, units: np.ndarray) -> None:
        cfg, names, channel = self.config, self.names, self.channel
        select = p in self.without_rewards
        arrays = {"idx": idx} | ({"units": units} if cfg.local_dp else {})
        if self.encrypted:
            self.exchange_encrypted(p, idx, select, units)
            return
        rows = self.all_platforms("learn_rows", arrays, {"updating": p, "select": select})
        positions = None
        if select:
            msgs = {names[q]: torch.from_numpy(rows[q]["select"]) for q in rows}
            qf = channel.forward(msgs, outputs=[names[p]], train=False, tag=SELECT)[names[p]]
            reply = self.platforms("greedy", {p: ({"fused": qf.numpy()}, {})})[p]
            positions = reply.get("positions")
        elif "positions" in rows[p]:
            positions = rows[p]["positions"]
        msgs = {names[q]: torch.from_numpy(rows[q]["learn"]) for q in rows}
        asked = None if positions is None else {names[p]: torch.from_numpy(positions)}
        fused = channel.forward(msgs, outputs=[names[p]], positions=asked, train=True, tag=LEARN)[
            names[p]
        ]
        grad = self.platforms("loss", {p: ({"fused": fused.numpy()}, {})})[p]["grad"]
        grads = channel.backward({names[p]: torch.from_numpy(grad)}, recipients=[names[p]])
        self.platforms("local_step", {p: ({"grad": grads[names[p]].numpy()}, {})})

    def exchange_encrypted(
        self, p: int, idx: np.ndarray, select: bool, units: np.ndarray | None = None
    ) -> None:
        """``exchange_update`` under ckks: the same messages, every row and fused value a
        ciphertext; the backward's masked exchange rides on ``local_step``."""
        cfg, name = self.config, self.names[p]
        shape = (cfg.members, idx.shape[-1], cfg.num_candidates)
        arrays = {"idx": idx} | ({"units": units} if cfg.local_dp else {})
        if p in self.joined:  # its training forward repeats the joined targets' forward
            grad = self.joined.pop(p)
            self.channel.serve_repeat(name, shape=shape, tag=LEARN)
        else:
            # A platform without rewards: its training forward repeats its select forward
            # (the same rows), its loss in the greedy reply.
            repeat = select and self.repeats
            ids = self._ids()
            asked = {"updating": p, "select": select, "outputs": str(p)} | ids
            if repeat:
                asked["repeat"] = ids["forward"]
            rows = self.all_platforms("learn_rows", arrays, asked)
            if select:
                a, c = self._serve(rows, "select", [p], shape, train=False, tag=SELECT)[p]
                if repeat:
                    c |= {"repeat": ids["forward"], "version": self.version}
                grad = self.platforms("greedy", {p: (a, c)})[p]
            if repeat:
                self.channel.serve_repeat(name, shape=shape, tag=LEARN)
            else:
                request = self._serve(rows, "learn", [p], shape, train=True, tag=LEARN)[p]
                grad = self.platforms("loss", {p: request})[p]
        served = self.channel.serve_backward({name: _chunked(grad, "grad")})[name]
        down = self._down(p, {"masked": served["masked"], "dx": served["input_gradient"]})
        released = self.platforms("local_step", {p: down})[p]
        self.version += 1  # the server's weights step (finish_backward)
        if self.packed:
            self.channel.finish_backward({name: _packed_releases(released, len(served["masked"]))})
            return
        due = len(self.channel.basis)
        self.channel.finish_backward(
            {
                name: [
                    [released.get(f"released.{c}.{k}", np.zeros(0)) for k in range(due)]
                    for c in range(len(served["masked"]))
                ]
            }
        )

    def finish(self) -> None:
        self.all_platforms("finish")
        self.simulator("finish", {}, {})


def _packed_releases(released: Mapping[str, np.ndarray], chunks: int) -> list[dict]:
    """A platform's packed releases (:meth:`CKKSPlatform.release_packed`) as
    :meth:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel.finish_backward` takes
    them: per chunk its own sums in order and the masked exchange's release (if any)."""
    out = []
    for c in range(chunks):
        own = []
        while f"own.{c}.{len(own)}" in released:
            own.append(released[f"own.{c}.{len(own)}"])
        row = {"own": own}
        if f"released.{c}.0" in released:
            row["regions"] = released[f"released.{c}.0"]
        out.append(row)
    return out


def run_server(
    run: FedSlateFlowerRun, exchange: Exchange, outcome: FedSlateFlowerOutcome | None = None
) -> FedSlateFlowerOutcome:
    """The ServerApp's loop over an ``exchange`` (Flower's grid, or a direct call in tests)."""
    outcome = outcome if outcome is not None else FedSlateFlowerOutcome()
    start, cpu = time.perf_counter(), time.process_time()
    server = _Server(run, exchange, outcome)
    server.keys()
    for episode in range(run.config.episodes):
        tick = time.perf_counter()
        server.episode(episode)
        outcome.episode_seconds.append(time.perf_counter() - tick)
    server.finish()
    outcome.rounds, outcome.learn_steps = server.rounds, server.learn_steps
    outcome.seconds, outcome.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return outcome


# ----------------------------------------------------------------------------- Flower apps
def _flower_exchange(grid: Grid, run: FedSlateFlowerRun, result: FlowerRunResult) -> Exchange:
    """``exchange`` over Flower messages: roles found by a first ``hello`` (each node answers
    with its ``partition-id``), then one message round per call; a node that does not answer
    ends the run (fail closed)."""
    options = FlowerRunOptions(
        rounds=0, min_nodes=run.nodes, timeout=run.timeout, poll_interval=run.poll_interval
    )
    messenger = _Messenger(grid, options, result)
    nodes = wait_for_nodes(grid, run.nodes, options.connect_timeout, run.poll_interval)
    by_role: dict[int, int] = {}
    counter = [0]

    def exchange(
        op: str, requests: Mapping[int, tuple[dict, dict]]
    ) -> dict[int, tuple[dict, dict]]:
        counter[0] += 1
        if not by_role:
            probe = messenger.exchange(
                MESSAGE_TYPE, {n: rec.content({}, {"op": "role"}) for n in nodes}, counter[0]
            )
            for node, reply in probe.items():
                role = int(rec.message_config(reply)["role"])
                if role in by_role:
                    raise ValueError(f"two SuperNodes claim role {role} (check partition-id)")
                by_role[role] = node
            missing = sorted(set(range(run.nodes)) - set(by_role))
            if missing:
                raise ValueError(f"no SuperNode with partition-id {missing} answered")
        contents = {by_role[r]: rec.content(a, c) for r, (a, c) in requests.items()}
        replies = messenger.exchange(MESSAGE_TYPE, contents, counter[0])
        lost = sorted(r for r in requests if by_role[r] not in replies)
        if lost:
            raise RuntimeError(
                f"FedSlate on Flower: node(s) of role {lost} did not answer {op!r}; the run ends"
            )
        return {
            r: (rec.message_arrays(replies[by_role[r]]), rec.message_config(replies[by_role[r]]))
            for r in requests
        }

    return exchange


@dataclass
class FedSlateApps:
    """A ServerApp and a ClientApp for one run, and where the server's outcome lands."""

    server: ServerApp
    client: ClientApp
    outcome: FedSlateFlowerOutcome


def _role(context: Context, run: FedSlateFlowerRun) -> int:
    config = context.node_config
    if "partition-id" not in config:
        raise ValueError(
            "a FedSlate SuperNode needs --node-config 'partition-id=<role>' (0: the user "
            "simulator, p + 1: platform p)"
        )
    role = int(config["partition-id"])
    if not 0 <= role < run.nodes:
        raise ValueError(f"partition-id {role} is not a role of this run (0 .. {run.nodes - 1})")
    return role


def build_apps(
    run: FedSlateFlowerRun, node_configs: Mapping[int, Mapping[str, object]] | None = None
) -> FedSlateApps:
    """Apps bound to ``run`` (for the simulation engine).

    Args:
        run: the run.
        node_configs: role -> node config the ClientApp adds to the node's own (Flower's
            simulation engine gives a node only its ``partition-id``): where a node's
            provisioned relay identity is (:func:`relay_identity`). Real SuperNodes take it from
            ``--node-config`` instead.
    """
    return _apps(lambda context: run, node_configs)


def _apps(
    run_of: Callable[[Context], FedSlateFlowerRun],
    node_configs: Mapping[int, Mapping[str, object]] | None = None,
) -> FedSlateApps:
    """The ServerApp and ClientApp, each taking its run from its ``Context`` (``run_of``: the
    bound run for the simulation engine, the run config for ``flwr run``)."""
    extra = {} if node_configs is None else node_configs
    outcome = FedSlateFlowerOutcome()
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run = run_of(context)
        result = FlowerRunResult()
        run_server(run, _flower_exchange(grid, run, result), outcome)
        outcome.message_bytes = dict(result.message_bytes)
        _write_server_result(run, outcome, result)

    client_app = ClientApp()

    @client_app.query("fedslate")
    def query(message: Message, context: Context) -> Message:
        run = run_of(context)
        role = _role(context, run)
        config = rec.message_config(message)
        if config.get("op") == "role":
            return Message(rec.content({}, {"role": role}), reply_to=message)
        store = {}
        if STATE_ARRAYS in context.state:
            store["arrays"] = rec.record_arrays(context.state[STATE_ARRAYS])
            store["meta"] = json.loads(str(context.state[STATE_META]["json"]))
        node_config = dict(extra.get(role, {})) | dict(context.node_config)
        arrays, reply = handle(
            run, role, store, config, rec.message_arrays(message), node_config=node_config
        )
        context.state[STATE_ARRAYS] = rec.arrays_record(store["arrays"])
        context.state[STATE_META] = ConfigRecord({"json": json.dumps(store["meta"])})
        return Message(rec.content(arrays, reply), reply_to=message)

    return FedSlateApps(server_app, client_app, outcome)


def drive_in_process(
    run: FedSlateFlowerRun,
    *,
    stores: dict[int, dict] | None = None,
    tap: Callable[[str, int, Mapping, Mapping], None] | None = None,
    node_configs: Mapping[int, Mapping[str, object]] | None = None,
) -> FedSlateFlowerOutcome:
    """The same halves without an engine: every message handled by :func:`handle` with the
    node's state round-tripped through Flower records (as ``Context.state`` holds it).

    Args:
        run: the run.
        stores: filled with each role's saved state (tests read the nodes' data from it).
        tap: called with ``(op, role, request arrays, reply arrays)`` for every message: what
            crossed the server (tests check what it could read).
        node_configs: role -> that node's config (its provisioned relay identity,
            :func:`relay_identity`; secure mode needs them).
    """
    stores = {} if stores is None else stores
    stores.update({r: {} for r in range(run.nodes)})
    return run_server(run, in_process_exchange(run, stores, node_configs or {}, tap))


def in_process_exchange(
    run: FedSlateFlowerRun,
    stores: dict[int, dict],
    node_configs: Mapping[int, Mapping[str, object]],
    tap: Callable[[str, int, Mapping, Mapping], None] | None = None,
) -> Exchange:
    """An honest relay of each message round through the nodes' :func:`handle`, each node's
    state (``stores[role]``, made when missing) round-tripped through Flower records as
    ``Context.state`` holds it: :func:`drive_in_process`'s, and the tests' honest server."""

    def exchange(
        op: str, requests: Mapping[int, tuple[dict, dict]]
    ) -> dict[int, tuple[dict, dict]]:
        replies = {}
        for role, (arrays, config) in requests.items():
            body = rec.content(arrays, config)
            records = body.array_records
            sent = rec.record_arrays(records[rec.ARRAYS]) if rec.ARRAYS in records else {}
            store = stores.setdefault(role, {})
            out_arrays, out_config = handle(
                run,
                role,
                store,
                dict(body.config_records[rec.CONFIG]),
                sent,
                node_config=node_configs.get(role, {}),
            )
            store["arrays"] = rec.record_arrays(rec.arrays_record(store["arrays"]))
            store["meta"] = json.loads(json.dumps(store["meta"]))
            if tap is not None:
                tap(op, role, sent, out_arrays)
            replies[role] = (out_arrays, out_config)
        return replies

    return exchange


# ----------------------------------------------------------------------------- `flwr run`
APP_DIR = Path(__file__).resolve().parent / "flower_fedslate_app"
"""The FedSlate app that ``flwr run`` submits: ``pyproject.toml`` (its ``[tool.flwr.app.config]``
is read by :func:`run_from_config`) and the package ``securefed_fedslate_app``."""


def _widths(value: object, key: str) -> tuple[int, ...]:
    """A run-config list of hidden widths: ``"64,64"`` (Flower's run config has no lists)."""
    text = str(value).strip()
    try:
        widths = tuple(int(w) for w in text.split(",")) if text else ()
    except ValueError:
        message = f'{key} takes comma-separated widths, e.g. "64,64"; got {value!r}'
        raise ValueError(message) from None
    if not widths or min(widths) < 1:
        raise ValueError(f"{key} needs at least one width >= 1, got {value!r}")
    return widths


APP_RENAMED = {
    "num_platforms": "platforms",
    "num_candidates": "candidates",
    "steps_per_platform": "steps",
}
"""The FedSlateConfig fields whose app key is not the field's name in kebab case (the app's
first keys, kept)."""
APP_NOT_ON_FLOWER = {
    "threads": "the app processes take torch's threads from OMP_NUM_THREADS (library code sets "
    "no process-wide state; app_components)",
    "log_every": "the progress lines of the in-process loop; the Flower nodes print none",
}
"""The FedSlateConfig fields deliberately not in the app's run config, and why."""
APP_RUN_KEYS = ("timeout", "output-dir")
"""The app keys of :class:`FedSlateFlowerRun` itself (seconds per message round; where the
nodes and the ServerApp write their results)."""


def _field_key(name: str) -> str:
    """The app key of FedSlateConfig field ``name``: kebab case, or its kept older name."""
    return APP_RENAMED.get(name, name.replace("_", "-"))


@lru_cache(maxsize=1)
def app_config_keys() -> Mapping[str, tuple[str, object]]:
    """Every app key of a FedSlateConfig field: ``{key: (field name, annotation)}``, derived
    from the dataclass (all its fields but :data:`APP_NOT_ON_FLOWER`), so a new field is a key.

    Raises:
        TypeError: a field whose annotation no run-config value converts to (decide how the app
            reads it, or list it in :data:`APP_NOT_ON_FLOWER`).
    """
    hints = typing.get_type_hints(FedSlateConfig)
    keys = {}
    for item in dataclasses.fields(FedSlateConfig):
        if not item.init or item.name in APP_NOT_ON_FLOWER:
            continue
        kind = hints[item.name]
        if _base(kind) not in (int, float, bool, str, tuple[int, ...], tuple[bool, ...]):
            raise TypeError(f"FedSlateConfig.{item.name}: no run-config reading of {kind}")
        keys[_field_key(item.name)] = (item.name, kind)
    return types.MappingProxyType(keys)


def _base(kind: object) -> object:
    """``kind`` without its ``| None``."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if isinstance(kind, types.UnionType) and len(args) == 1:
        return args[0]
    return kind


def _none_value(kind: object, key: str) -> object:
    """The run-config value that stands for ``None`` in an optional field (``seed``: ``-1``,
    secure mode; numbers: ``0``, never a valid value there; strings and lists: ``""``)."""
    if key == "seed":
        return -1
    return 0 if _base(kind) in (int, float) else ""


def _number(value: object, kind: type, key: str) -> int | float:
    """A finite int or float run-config value (a bool, a fractional int, ``nan`` or ``inf`` is
    refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} takes a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key} takes a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{key} takes a finite number, got {value!r}")
    if kind is float:
        return number
    if isinstance(value, int):
        return value
    if not number.is_integer():
        raise ValueError(f"{key} takes an integer, got {value!r}")
    try:
        return int(value)  # a numeral string, exactly
    except ValueError:
        return int(number)  # "1e3"


def _flags(value: object, key: str) -> tuple[bool, ...]:
    """A run-config list of per-platform flags: ``"true,false"`` (or ``"1,0"``)."""
    words = {"true": True, "1": True, "false": False, "0": False}
    try:
        return tuple(words[w.strip().lower()] for w in str(value).split(","))
    except KeyError:
        message = f'{key} takes comma-separated flags, e.g. "true,false"; got {value!r}'
        raise ValueError(message) from None


def _field_value(value: object, kind: object, key: str) -> object:
    """One run-config value as FedSlateConfig's field of annotation ``kind`` takes it."""
    base = _base(kind)
    if base is not kind and value == _none_value(kind, key) and not isinstance(value, bool):
        return None
    if base in (int, float):
        return _number(value, base, key)
    if base is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if base is str:
        if not isinstance(value, str):
            raise ValueError(f'{key} takes a string (quoted: {key}="..."), got {value!r}')
        return value
    if base == tuple[int, ...]:
        return _widths(value, key)
    return _flags(value, key)


def _refuse_unknown(values: Mapping[str, object]) -> None:
    """Fail closed: a key the app does not read is refused by name, never ignored."""
    known = sorted([*app_config_keys(), *APP_RUN_KEYS])
    for key in sorted(values):
        if key in known:
            continue
        name = key.replace("-", "_")
        if name in APP_NOT_ON_FLOWER:
            raise ValueError(f"{key!r} is not an app key: {APP_NOT_ON_FLOWER[name]}")
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{key!r} is not a key of the FedSlate app{hint}; its keys: {', '.join(known)}"
        )


def config_from_run_config(values: Mapping[str, object]) -> FedSlateConfig:
    """The FedSlateConfig of the app's ``[tool.flwr.app.config]`` (:func:`run_from_config`):
    every key of :func:`app_config_keys`, an absent one taking the field's default.

    Raises:
        ValueError: an unknown key (named, with the nearest known one), a value of the wrong
            kind (named), or what :class:`FedSlateConfig` refuses.
    """
    _refuse_unknown(values)
    seed = values.get("seed", -1)
    if not isinstance(seed, bool) and isinstance(seed, int) and seed < -1:
        raise ValueError(f"seed must be >= 0 (seeded: not private) or -1 (secure mode), got {seed}")
    fields = {
        name: _field_value(values[key], kind, key)
        for key, (name, kind) in app_config_keys().items()
        if key in values
    }
    return FedSlateConfig(**fields)


def run_from_config(values: Mapping[str, object]) -> FedSlateFlowerRun:
    """A FedSlate run as the app's ``[tool.flwr.app.config]`` describes it
    (``rl/flower_fedslate_app/pyproject.toml``; ``flwr run ... -c 'key=value'``).

    Every FedSlateConfig field is a key (:func:`app_config_keys`: its name in kebab case, but
    ``platforms``, ``candidates`` and ``steps``; not :data:`APP_NOT_ON_FLOWER`), plus
    ``timeout`` and ``output-dir``. Widths are comma-separated (``"64,64"``), the ``feedback``
    flags too (``"true,false"``); an optional field's ``None`` is ``0`` for a number
    (``dp-epsilon = 0``: none), ``""`` for a string, and ``seed = -1`` (the template's default)
    is secure mode (every node needs its provisioned relay identity in its ``--node-config``).

    Raises:
        ValueError: an unknown key, named with the nearest known one (fail closed: never
            ignored), or a bad value (by :class:`FedSlateConfig` and :class:`FedSlateFlowerRun`,
            which refuse what Flower does not carry, naming it).
    """
    config = config_from_run_config(values)
    timeout = _number(values.get("timeout", 600.0), float, "timeout")
    output_dir = values.get("output-dir", "")
    if not isinstance(output_dir, str):
        raise ValueError(f"output-dir takes a string, got {output_dir!r}")
    return FedSlateFlowerRun(config, output_dir=output_dir, timeout=timeout)


def app_run(context: Context) -> FedSlateFlowerRun:
    """The run of a ServerApp or ClientApp process that ``flwr run`` started, from its run
    config (:func:`run_from_config`)."""
    return run_from_config(context.run_config)


def app_components(
    run_of: Callable[[Context], FedSlateFlowerRun] = app_run,
) -> FedSlateApps:
    """What ``securefed_fedslate_app.app`` exports (``serverapp``, ``clientapp``): the apps
    taking their run from the run config (``run_of``, default :func:`app_run`); the relay
    identities come from each SuperNode's ``--node-config``. Library code sets no process-wide
    state: start the processes with ``OMP_NUM_THREADS=1`` (torch on one thread, as the
    in-process run) for a seeded run bit-identical to :func:`securefed.rl.fedslate.run_fedslate`."""
    return _apps(run_of)


def write_fedslate_app(dest: str | Path, run_config: Mapping[str, object] | None = None) -> Path:
    """Copy the FedSlate app to ``dest`` with ``run_config`` in its ``[tool.flwr.app.config]``."""
    from securefed.flower.loopback import write_app

    return write_app(APP_DIR, dest, run_config)
