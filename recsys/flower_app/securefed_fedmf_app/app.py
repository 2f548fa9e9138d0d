"""FedMF (``securefed.recsys.fedmf``) on Flower: the example app of ``securefed.flower``.

The server (``server``) holds the item factors ``V`` and the transport; each SuperNode
(``client``) holds the ratings and user vectors of the users of its partition
(``partition_users(n_users, num-partitions, partition-id)``), keeps the vectors in its Flower
Context between rounds, and computes exactly what FedMF's vectorised client step computes.

Configuration: the ``[tool.flwr.app.config]`` section of ``pyproject.toml`` (run config), read
into :class:`FedMFApp`; in the simulation engine, :func:`build_apps` takes a :class:`FedMFApp`
directly. The data set is named in the run config and must be present on every node (each node
reads only its users' rows). The server reads the data set only for its public shape (numbers of
users and items, rating scale); in a deployment where the server host has no data, put them in
the run config instead (``n-users``, ``n-items``) -- the example keeps it simple.

This module is the app layer: it may import ``recsys`` and ``securefed``; ``securefed.flower``
itself knows nothing of FedMF.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from flwr.app import Context

from securefed import ClientSampling, RunOptions, SeedTree, Transport
from securefed.flower import (
    ClientSetup,
    FlowerRunOptions,
    FlowerRunResult,
    ServerSetup,
    make_client_app,
    make_server_app,
    partition_users,
)
from securefed.flower.ckks import NodeKeys
from securefed.flower.floors import NodeFloors
from securefed.flower.identity import NodeIdentity
from securefed.flower.identity import node_identity as identity_from_config
from securefed.flower.journal import STATE_DIR_KEY, NodeJournal, lineage_digest
from securefed.integrity import read_key_file
from securefed.privacy.ledger import PrivacyLedger
from securefed.records import dumps_record
from securefed.recsys.data import ML100K_SCALE, Split, load_dataset, random_split, synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.runtime import run_rounds
from securefed.transport import (
    CKKSOptions,
    DPOptions,
    SecAggOptions,
    build_transport,
    option_groups,
    parse_transport_spec,
)
from securefed.transport.registry import KEY_MODELS


@dataclass(frozen=True)
class FedMFApp:
    """The run configuration of the example (one field per ``[tool.flwr.app.config]`` key).

    Attributes:
        data: ``"synthetic"``, ``"ml-latest-small"`` or a path (e.g. an ``ml-100k`` folder).
        split: the data set's split (``"u1"``.. for ML-100K; ``""``: the loader's default).
        synthetic_users, synthetic_items, synthetic_ratings, synthetic_seed: the synthetic set.
        test_fraction, split_seed: the random split of non-ML-100K data.
        variant, dim, rounds, lr, server_lr, reg_user, reg_item, init_std, upload, aggregation,
            server_state: FedMF's :class:`~securefed.recsys.fedmf.FedMFConfig` (refused there
            as in one process). ``server-state = "encrypted"`` (Chai et al.'s ``[[V]]``, with
            ``aggregation = "sum"``, transport ``ckks``, shared key model): the server keeps
            the item matrix as ciphertexts only, a key-holder node encrypts the initial one,
            every node decrypts it with the users' shared key (``ckks-secret-path``).
        seed: ``-1`` (the default) is secure mode (OS randomness, nothing reproducible); a
            seed makes every node's keys, masks and noise reproducible: seeded, not private.
        transport: a name of :mod:`securefed.transport.registry`, built there with the options
            below: ``plaintext``, ``secagg``, ``dp`` (central), ``dp-local``, ``secagg+dp``
            (distributed noise under secure aggregation) or ``ckks`` (the nodes encrypt, the
            server adds ciphertexts, a key-holder node decrypts the sum); ``securefed.flower``
            refuses what it cannot carry (``ckks+dp``). Every DP transport carries a privacy
            ledger (:attr:`FedMFOutcome.ledger`, ``result.json``'s ``epsilon``).
        ckks_key_model: ``shared`` (every node holds the users' secret key) or ``committee``.
        ckks_secret_path: the secret-context file of ``securefed.flower.ckks.provision_keys``
            on the nodes' hosts (a node's ``--node-config 'ckks-secret-path=...'`` overrides
            it); the server never reads it.
        ckks_public_path: the public-context file (the server's; committee-model nodes too).
        secagg_bits, secagg_scale, secagg_clip, secagg_neighbours: secure aggregation's fixed
            point and graph (0 neighbours: automatic).
        secagg_server: the threat model, ``"malicious"`` (the default: signed advertisements
            checked against the key registry each node pinned, ConsistencyCheck) or
            ``"honest_but_curious"``, which a node takes part in only when its own node config
            says ``secagg-server="honest_but_curious"`` (:mod:`securefed.flower.floors`).
        secagg_merge: ShareKeys and MaskedInputCollection in one message round
            (``FlowerRunOptions.merge_share_mask``; one message round fewer per training round;
            a node lost in it refuses the round); secure-aggregation transports only.
        secagg_advertise_ahead: the next round's AdvertiseKeys with this round's Unmasking
            (``FlowerRunOptions.advertise_ahead``: one message round fewer per training round
            after the first); secure-aggregation transports only.
        dp_clip, dp_noise_multiplier, dp_delta: DP parameters (epsilon is reported at
            ``dp_delta``).
        dp_mechanism: the DP noise (``""``: the transport's default; ``secagg+dp``'s is the
            exact distributed ``discrete_gaussian``, computed on the nodes as in one process;
            ``skellam`` in seeded mode; ``gaussian``: float noise, inexact after rounding).
        clients_per_round: fixed-size sampling per round (0: every user every round).
        min_nodes: SuperNodes the server waits for.
        evaluate_every: held-out evaluation every this many rounds (0: after the last).
        timeout: seconds a message round may take.
        max_poll_interval: the server's longest wait between two polls for replies
            (``FlowerRunOptions.max_poll_interval``; 0.05, the default: a fixed poll).
        output_dir: where the server writes ``result.json`` and ``server.npz`` and each node its
            ``node-<partition>.npz`` (``""``: nothing is written).
        checkpoint_dir: where the server writes a checkpoint after every round, and from which
            a ServerApp started again with the same configuration resumes (after a SuperLink
            crash: resubmit the run with ``flwr run``); ``""``: none. The nodes then need their
            journal (node config ``state-dir``, :mod:`securefed.flower.journal`) to continue.
        checkpoint_key_file: a key file (mode 0600, at least 16 bytes) on the server's host for
            the checkpoints' HMAC digests and the sealing of a secure-mode run's root entropy;
            a secure-mode run (``seed = -1``) with a ``checkpoint-dir`` needs it.
    """

    data: str = "synthetic"
    split: str = ""
    synthetic_users: int = 120
    synthetic_items: int = 80
    synthetic_ratings: int = 2400
    synthetic_seed: int = 3
    test_fraction: float = 0.2
    split_seed: int = 0
    variant: str = "fedmf"
    dim: int = 20
    rounds: int = 5
    lr: float = 0.1
    server_lr: float = 0.1
    reg_user: float = 0.12
    reg_item: float = 0.12
    init_std: float = 0.3
    upload: str = "part"
    aggregation: str = "mean"
    server_state: str = "plain"
    seed: int = -1
    transport: str = "plaintext"
    secagg_bits: int = 64
    secagg_scale: float = 2.0**20
    secagg_clip: float = 1048576.0
    secagg_neighbours: int = 0
    secagg_server: str = "malicious"
    secagg_merge: bool = False
    secagg_advertise_ahead: bool = False
    dp_clip: float = 1.0
    dp_noise_multiplier: float = 1.0
    dp_delta: float = 1e-5
    dp_mechanism: str = ""
    clients_per_round: int = 0
    min_nodes: int = 2
    evaluate_every: int = 0
    timeout: float = 600.0
    max_poll_interval: float = 0.05
    output_dir: str = ""
    ckks_key_model: str = "shared"
    ckks_secret_path: str = ""
    ckks_public_path: str = ""
    checkpoint_dir: str = ""
    checkpoint_key_file: str = ""

    def __post_init__(self) -> None:
        if parse_transport_spec(self.transport).options:  # refuses unknown names, listing them
            raise ValueError(
                f"transport {self.transport!r}: the app's transport options are its own run-config "
                "keys (secagg-bits, dp-clip, ...), not spec-string options"
            )
        if self.ckks_key_model not in KEY_MODELS:
            raise ValueError(
                f"ckks-key-model must be one of {KEY_MODELS}, got {self.ckks_key_model!r}"
            )
        if "ckks" in option_groups(self.transport) and not self.ckks_public_path:
            raise ValueError(
                "transport 'ckks' needs ckks-public-path (the server's public context; write it "
                "with securefed.flower.ckks.provision_keys)"
            )
        for key, value in (
            ("secagg-merge", self.secagg_merge),
            ("secagg-advertise-ahead", self.secagg_advertise_ahead),
        ):
            if value and "secagg" not in option_groups(self.transport):
                raise ValueError(
                    f"{key} merges secure aggregation's message rounds; transport "
                    f"{self.transport!r} has none"
                )
        if self.seed < -1:
            raise ValueError(f"seed must be >= 0, or -1 for secure mode; got {self.seed}")
        if self.clients_per_round < 0 or self.min_nodes < 1:
            raise ValueError("clients-per-round must be >= 0 and min-nodes >= 1")
        self.fedmf_config()  # validates the FedMF fields

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> FedMFApp:
        """Read Flower's run config (``-`` in keys); unknown keys are refused by name."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in run_config.items():
            name = key.replace("-", "_")
            if name not in names:
                raise ValueError(f"unknown run-config key {key!r} for the FedMF app")
            kind = type(getattr(cls(), name))
            values[name] = kind(value)
        return cls(**values)

    def run_config(self) -> dict[str, object]:
        """The fields as Flower run-config keys and TOML values."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}

    def fingerprint(self) -> dict[str, object]:
        """The result-bearing run config: every key but where files go, how long to wait and
        how often to evaluate (:data:`NOT_IN_FINGERPRINT`). A checkpoint, and a node's journal,
        belong to one fingerprint."""
        return {k: v for k, v in self.run_config().items() if k not in NOT_IN_FINGERPRINT}

    def fedmf_config(self) -> FedMFConfig:
        return FedMFConfig(
            variant=self.variant,
            dim=self.dim,
            rounds=self.rounds,
            lr=self.lr,
            server_lr=self.server_lr,
            reg_user=self.reg_user,
            reg_item=self.reg_item,
            init_std=self.init_std,
            upload=self.upload,
            aggregation=self.aggregation,
            server_state=self.server_state,
        )

    def seeds(self) -> SeedTree:
        return SeedTree.secure_mode() if self.seed == -1 else SeedTree(self.seed)

    def sampling(self) -> ClientSampling:
        if self.clients_per_round == 0:
            return ClientSampling()
        return ClientSampling("fixed", self.clients_per_round)

    def transport_options(self, *, remote: bool) -> dict[str, object]:
        """The registry's option groups of :attr:`transport`, from the run config.

        ``remote=True`` is the server's (its clients run on the nodes; CKKS from the public
        context only); ``remote=False`` the in-process reference's (CKKS with the secret key).

        Raises:
            ValueError: the in-process CKKS reference without ``ckks-secret-path``.
        """
        groups = option_groups(self.transport)
        options: dict[str, object] = {}
        if "secagg" in groups:
            options["secagg"] = SecAggOptions(
                bits=self.secagg_bits,
                scale=self.secagg_scale,
                clip=self.secagg_clip,
                neighbours=self.secagg_neighbours or None,
                remote_clients=remote,
                server=self.secagg_server,
            )
        if "ckks" in groups:
            if not remote and not self.ckks_secret_path:
                raise ValueError("the in-process CKKS reference needs ckks-secret-path")
            options["ckks"] = CKKSOptions(
                key_model=self.ckks_key_model,
                max_clients=1024,
                public_context=self.ckks_public_path if remote else "",
                secret_context="" if remote else self.ckks_secret_path,
            )
        if "dp" in groups:
            options["dp"] = DPOptions(
                clip=self.dp_clip,
                noise_multiplier=self.dp_noise_multiplier,
                delta=self.dp_delta,
                mechanism=self.dp_mechanism or None,
            )
        return options

    def make_transport(self, *, remote: bool) -> Transport:
        """The server's transport (``securefed.transport.build_transport``); ``remote=False`` is
        the in-process reference's."""
        return build_transport(
            self.transport, self.transport_options(remote=remote), total_rounds=self.rounds
        )


NOT_IN_FINGERPRINT = frozenset(
    {
        "output-dir",
        "timeout",
        "min-nodes",
        "evaluate-every",
        "checkpoint-dir",
        "checkpoint-key-file",
        "ckks-secret-path",
        "ckks-public-path",
    }
)
"""Run-config keys that do not change the model: a resumed run may differ in them."""


@lru_cache(maxsize=4)
def load_split(app: FedMFApp) -> Split:
    """The data set of ``app`` (cached per process: every message of a node reads it)."""
    if app.data == "synthetic":
        ratings = synthetic_ratings(
            app.synthetic_users,
            app.synthetic_items,
            app.synthetic_ratings,
            rank=4,
            noise=0.3,
            scale=ML100K_SCALE,
            seed=app.synthetic_seed,
        )
        return random_split(ratings, app.test_fraction, np.random.default_rng(app.split_seed))
    return load_dataset(
        app.data, split=app.split or None, test_fraction=app.test_fraction, seed=app.split_seed
    )


def _data_key(app: FedMFApp) -> FedMFApp:
    """``app`` with only the fields that choose the data (so runs share the cache)."""
    return FedMFApp(
        data=app.data,
        split=app.split,
        synthetic_users=app.synthetic_users,
        synthetic_items=app.synthetic_items,
        synthetic_ratings=app.synthetic_ratings,
        synthetic_seed=app.synthetic_seed,
        test_fraction=app.test_fraction,
        split_seed=app.split_seed,
    )


@lru_cache(maxsize=4096)
def _partition(app: FedMFApp, num_partitions: int, partition_id: int) -> tuple:
    split = load_split(app)
    users = partition_users(split.train.n_users, num_partitions, partition_id)
    train = split.train.subset(np.isin(split.train.users, users))
    test = split.test.subset(np.isin(split.test.users, users))
    return users, train, test


# ----------------------------------------------------------------------------- the node
class FedMFNode:
    """The users of one partition: their ratings, their vectors, FedMF's client step.

    A fresh ``FedMF`` over the partition's ratings is built per message (cheap) and the users'
    vectors (and FedRec+'s stable pseudo sets) come from the node's saved state; before the first
    round they are FedMF's initial draws, the same as in one process for a seeded run.
    """

    def __init__(self, app: FedMFApp, num_partitions: int, partition_id: int) -> None:
        self.users, train, self.test = _partition(_data_key(app), num_partitions, partition_id)
        self.partition_id = partition_id
        self.model = FedMF(train, app.fedmf_config(), app.seeds())
        self.update_shape = self.model.update_shape

    def train(self, round_id, clients, broadcast, seeds):
        self.model.load_broadcast(broadcast)
        batches = []
        squared_error, n_ratings = self.model.client_step(
            round_id,
            clients,
            seeds,
            lambda uploads: batches.append(self.model.client_uploads(uploads)),
        )
        return batches, {"squared_error": squared_error, "ratings": n_ratings}

    def initial_state(self) -> np.ndarray:
        """FedMF's initial ``V`` (this message's fresh model), for the initial ``[[V]]``."""
        return self.model.initial_state()

    def evaluate(self, broadcast) -> dict[str, float]:
        self.model.load_broadcast(broadcast)
        if len(self.test) == 0:
            return {"test_squared_error": 0.0, "test_absolute_error": 0.0, "test_ratings": 0.0}
        errors = self.model.predict(self.test.users, self.test.items) - self.test.ratings
        return {
            "test_squared_error": float(errors @ errors),
            "test_absolute_error": float(np.abs(errors).sum()),
            "test_ratings": float(len(errors)),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        model = self.model
        return {
            "U": model.U[self.users],
            "pseudo_chosen": model.pseudo_chosen,
            "pseudo_indptr": model.pseudo_indptr,
            "pseudo_items": model.pseudo_items,
        }

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        model = self.model
        if state["U"].shape != (len(self.users), model.config.dim):
            raise ValueError(
                f"saved user vectors have shape {state['U'].shape}, this node hosts "
                f"{len(self.users)} users of dimension {model.config.dim}"
            )
        model.U[self.users] = state["U"]
        model.pseudo_chosen = np.array(state["pseudo_chosen"])
        model.pseudo_indptr = np.array(state["pseudo_indptr"])
        model.pseudo_items = np.array(state["pseudo_items"])


def _partition_of(context: Context) -> tuple[int, int]:
    config = context.node_config
    if "partition-id" not in config or "num-partitions" not in config:
        raise ValueError(
            "this SuperNode has no partition: start it with --node-config "
            "'partition-id=<i> num-partitions=<n>'"
        )
    return int(config["num-partitions"]), int(config["partition-id"])


def node_identity(app: FedMFApp, context: Context, node: FedMFNode) -> NodeIdentity:
    """The hosted users' long-term identities: the files provisioned at enrolment
    (``secagg-identity-path``, ``secagg-registry-path``, ``secagg-registry-digest`` in the node
    config), else, in seeded mode only, derived from the run's seed."""
    n_users = load_split(_data_key(app)).train.n_users
    return identity_from_config(context.node_config, app.seeds(), node.users, n_users)


def client_setup(app: FedMFApp, context: Context, floors: NodeFloors | None = None) -> ClientSetup:
    """The node's setup for one message; its privacy floors from its node config (``floors``
    where a key is absent, else :class:`NodeFloors`' defaults)."""
    num_partitions, partition_id = _partition_of(context)
    node = FedMFNode(app, num_partitions, partition_id)
    on_evaluate = None
    if app.output_dir:

        def on_evaluate(done: FedMFNode) -> None:
            path = Path(app.output_dir) / f"node-{done.partition_id}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, users=done.users, U=done.model.U[done.users])

    ckks = None
    if "ckks" in option_groups(app.transport):
        config = context.node_config
        ckks = NodeKeys.from_paths(
            str(config.get("ckks-secret-path", app.ckks_secret_path)),
            str(config.get("ckks-public-path", app.ckks_public_path)),
        )
    state_dir = str(context.node_config.get(STATE_DIR_KEY, ""))
    journal = (
        NodeJournal(state_dir, lineage_digest(app.fingerprint()), partition_id)
        if state_dir
        else None
    )
    return ClientSetup(
        node,
        app.seeds(),
        node.update_shape,
        on_evaluate,
        ckks,
        identity=lambda: node_identity(app, context, node),
        floors=NodeFloors.from_node_config(context.node_config, floors),
        journal=journal,
    )


# ----------------------------------------------------------------------------- the server
@dataclass
class FedMFOutcome:
    """What the server ends with (filled when the run finishes)."""

    model: FedMF | None = None
    transport: Transport | None = None
    result: FlowerRunResult | None = None

    @property
    def ledger(self) -> PrivacyLedger | None:
        """The privacy ledger the run's DP rounds were charged to (``None`` without DP)."""
        return None if self.result is None else self.result.ledger


def _train_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    n = sums.get("ratings", 0.0)
    return {"train_rmse": math.sqrt(sums["squared_error"] / n) if n else float("nan")}


def _evaluation_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    n = sums.get("test_ratings", 0.0)
    if not n:
        return {"rmse": float("nan"), "mae": float("nan")}
    return {
        "rmse": math.sqrt(sums["test_squared_error"] / n),
        "mae": sums["test_absolute_error"] / n,
    }


def server_setup(app: FedMFApp, outcome: FedMFOutcome | None = None) -> ServerSetup:
    """The server's setup: FedMF without ratings, the remote transport, the loop."""
    split = load_split(_data_key(app))
    public_shape = split.train.subset(np.zeros(len(split.train), dtype=bool))  # no ratings
    seeds = app.seeds()
    model = FedMF(public_shape, app.fedmf_config(), seeds)
    transport = app.make_transport(remote=True)
    outcome = FedMFOutcome() if outcome is None else outcome

    def finish(result: FlowerRunResult) -> None:
        outcome.model, outcome.transport, outcome.result = model, transport, result
        if app.output_dir:
            out = Path(app.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            if app.server_state != "encrypted":  # else the server holds [[V]] only
                np.savez(out / "server.npz", V=model.V)
            summary = {
                "rounds": result.rounds,
                "evaluations": result.evaluations,
                "message_bytes": result.message_bytes,
                "message_seconds": result.message_seconds,
                "nodes": result.nodes,
                "config": app.run_config(),
                "resumed_from": result.resumed_from,
            }
            if result.ledger is not None:
                summary |= {
                    "epsilon": result.ledger.epsilon(app.dp_delta),
                    "delta": app.dp_delta,
                    "privacy_ledger": result.ledger.state_dict(),
                }
            (out / "result.json").write_text(dumps_record(summary, indent=1))

    options = FlowerRunOptions(
        rounds=app.rounds,
        sampling=app.sampling(),
        min_nodes=app.min_nodes,
        evaluate_every=app.evaluate_every,
        timeout=app.timeout,
        checkpoint_dir=app.checkpoint_dir or None,
        fingerprint=app.fingerprint(),
        checkpoint_key=read_key_file(app.checkpoint_key_file) if app.checkpoint_key_file else None,
        max_poll_interval=app.max_poll_interval,
        merge_share_mask=app.secagg_merge,
        advertise_ahead=app.secagg_advertise_ahead,
    )
    return ServerSetup(
        model,
        transport,
        seeds,
        options,
        train_metrics=_train_metrics,
        evaluation_metrics=_evaluation_metrics,
        on_finish=finish,
    )


@dataclass
class FedMFApps:
    """A ServerApp and ClientApp for one configuration, and where the server's outcome lands."""

    server: object
    client: object
    outcome: FedMFOutcome = field(default_factory=FedMFOutcome)


def build_apps(app: FedMFApp, floors: NodeFloors | None = None) -> FedMFApps:
    """Apps bound to ``app`` (the simulation engine's Python API has no run config nor node
    config: ``floors`` are the nodes' privacy floors)."""
    outcome = FedMFOutcome()
    server_app = make_server_app(lambda context: server_setup(app, outcome))
    client_app = make_client_app(lambda context: client_setup(app, context, floors))
    return FedMFApps(server_app, client_app, outcome)


def in_process(app: FedMFApp) -> tuple[FedMF, Transport, list[dict[str, float]]]:
    """The same run in one process (``securefed.run_rounds``): the reference."""
    split = load_split(_data_key(app))
    seeds = app.seeds()
    model = FedMF(split.train, app.fedmf_config(), seeds)
    transport = app.make_transport(remote=False)
    history = run_rounds(
        model, transport, seeds, RunOptions(rounds=app.rounds, sampling=app.sampling())
    )
    return model, transport, history.rounds


def _from_context(context: Context) -> FedMFApp:
    return FedMFApp.from_run_config(context.run_config)


def _make_server(context: Context) -> ServerSetup:
    return server_setup(_from_context(context))


def _make_client(context: Context) -> ClientSetup:
    return client_setup(_from_context(context), context)


# What `flwr run` loads (pyproject.toml [tool.flwr.app.components]): configured by the run config.
server = make_server_app(_make_server)
client = make_client_app(_make_client)

__all__ = [
    "FedMFApp",
    "FedMFNode",
    "build_apps",
    "client",
    "client_setup",
    "in_process",
    "load_split",
    "server",
    "server_setup",
]
