"""Issue 33: on Flower the same guarantees as in one process, against an active server.

Every attack here is a real ServerApp main: ``run_federation`` over a grid that rewrites the
messages the server sends (what a malicious server controls) and reads the replies, against the
real ClientApps of the FedMF example. Each runs in two runtimes (``runtime``): ``in-process``
(the ClientApps called in this process through ``DirectGrid``, no Flower engine) and
``simulation`` (Flower's simulation engine, ``@slow``: about 30 s a run, mostly Ray).

Must hold (and failed before this design, when Flower carried only the honest-but-curious
protocol): a server that relays its own keys as a node's neighbours' and lies about who dropped
decodes the victim node's sum against the honest-but-curious protocol, and is refused by the
nodes (nothing decoded) under the malicious-server protocol, the app's default; a server that
tells nodes different survivor sets is refused at Unmasking; a server that states weaker
parameters than a node's own floors (threat model, threshold, colluders, DP noise and clip) is
refused by that node, naming the parameter; and a seeded run gives the in-process model
(malicious secure aggregation, the exact distributed discrete Gaussian and Skellam).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_claims_flower import SIMULATION_BACKEND, DirectGrid

from securefed.crypto import keys as kx
from securefed.crypto import prg as prg_mod
from securefed.crypto import shamir
from securefed.errors import AggregationError, InsecureParameterError
from securefed.flower import make_client_app
from securefed.flower import records as rec
from securefed.flower.floors import NodeFloors
from securefed.flower.identity import (
    load_identity,
    provision_identities,
    seeded_identity,
)
from securefed.flower.server import (
    ADVERTISE,
    CONSISTENCY,
    MASK,
    SHARE,
    TRAIN,
    UNMASK,
    run_federation,
)
from securefed.randomness import SeedTree
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg.signatures import ConsistencyError, SignatureError

HBC = "honest_but_curious"
RUNTIMES = ["in-process", pytest.param("simulation", marks=pytest.mark.slow)]


# ----------------------------------------------------------------------------- the two runtimes
def _run(runtime, example, app, n_nodes, *, wrap=None, floors=None):
    """``run_federation`` of ``app`` over ``wrap(grid)`` in ``runtime``; what the server ended
    with: ``grid`` (the wrapper), ``setup``, ``result`` (``FlowerRunResult``, when the run
    finished) and ``error`` (what the run raised, if anything)."""
    client_app = make_client_app(lambda context: example.client_setup(app, context, floors))
    state: dict[str, object] = {}

    def main(grid) -> None:
        wrapped = grid if wrap is None else wrap(grid)
        state["grid"], state["setup"] = wrapped, example.server_setup(app)
        try:
            state["result"] = run_federation(wrapped, state["setup"])
        except Exception as error:  # the attack reads the wire whatever the run did
            state["error"] = error

    if runtime == "in-process":
        from flwr.supercore.task_identity import TaskIdentity

        with pytest.MonkeyPatch.context() as patch:  # what Flower's runtime gives a ServerApp
            for name in ("_run_id", "_task_id", "_node_id"):
                patch.setattr(TaskIdentity, name, 1)
            main(DirectGrid(client_app, n_nodes))
        return state
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    server_app = ServerApp()
    server_app.main()(lambda grid, context: main(grid))
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=n_nodes,
        backend_config=SIMULATION_BACKEND,
    )
    return state


class Wiretap:
    """A grid the server's main holds: it may rewrite each message it sends (``rewrite``) and
    keeps every message and reply (``sent``, ``replies``) of round 0."""

    def __init__(self, grid) -> None:
        self.grid = grid
        self.sent: list[tuple[str, int, dict, dict]] = []
        self.replies: list[tuple[str, int, dict, dict]] = []
        self._kinds: dict[str, str] = {}

    def rewrite(self, kind: str, node: int, arrays: dict, config: dict) -> dict | None:
        """New arrays for the message, or ``None`` to send it as is."""
        return None

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            kind, node = message.metadata.message_type, int(message.metadata.dst_node_id)
            config = dict(rec.message_config(message))
            arrays = dict(rec.message_arrays(message))
            if int(config.get("round", -1)) == 0:
                changed = self.rewrite(kind, node, arrays, config)
                if changed is not None:
                    arrays = changed
                    message.content = rec.content(arrays, config)
                self.sent.append((kind, node, arrays, config))
        ids = self.grid.push_messages(messages)
        for message, mid in zip(messages, ids, strict=True):
            self._kinds[mid] = message.metadata.message_type
        return ids

    def pull_messages(self, message_ids):
        replies = self.grid.pull_messages(message_ids)
        for reply in replies:
            kind = self._kinds.get(reply.metadata.reply_to_message_id, "")
            if reply.has_error():
                continue
            config = dict(rec.message_config(reply))
            self.replies.append(
                (kind, int(reply.metadata.src_node_id), dict(rec.message_arrays(reply)), config)
            )
        return replies

    def first(self, store, kind: str, node: int | None = None) -> tuple[int, dict, dict]:
        for k, n, arrays, config in store:
            if k == kind and (node is None or n == node):
                return n, arrays, config
        raise LookupError(f"no {kind} message (node {node})")


def _victim_node(tap: Wiretap) -> int:
    """The node whose party is user 0 (partition 0): the victim."""
    for kind, node, arrays, _ in tap.replies:
        if kind == ADVERTISE and "party" in arrays and int(arrays["party"]) == 0:
            return node
    raise LookupError("no node advertised party 0")


class KeyRelayingServer(Wiretap):
    """Bonawitz et al.'s active server (docs/secagg.md): at ShareKeys it relays its own ``c``
    keys as ``2t - k`` of the victim's neighbours' (so the victim seals their shares to the
    server), and at Unmasking it tells half of the other neighbours that the victim dropped (so
    they reveal its mask key where the rest reveal its self-mask seed)."""

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.fakes: dict[int, kx.KeyPair] = {}
        self.told_dropped: set[int] = set()

    def rewrite(self, kind, node, arrays, config):
        if kind == SHARE and int(arrays["users"][0]) == 0:  # the victim's ShareKeys
            neighbours = arrays["neighbours"][0].tolist()
            t, k = int(config["threshold"]), len(neighbours)
            self.fakes = {
                v: kx.keypair_from_seed(bytes([v % 250 + 1]) * 32) for v in neighbours[: 2 * t - k]
            }
            c_publics = [
                self.fakes[v].public if v in self.fakes else key
                for v, key in zip(neighbours, rec.rows_bytes(arrays["c_publics"][0]), strict=True)
            ]
            return arrays | {"c_publics": rec.bytes_rows(c_publics, kx.PUBLIC_KEY_BYTES)[None]}
        if kind == UNMASK and 0 in arrays["senders"].tolist():
            helper = int(arrays["helpers"][0])
            if helper in self.fakes:
                # The real node cannot open what the victim sealed to the server's key: leave
                # it out of its inbox, so that nothing looks wrong to it.
                keep = arrays["senders"] != 0
                return arrays | {
                    "senders": arrays["senders"][keep],
                    "blobs": arrays["blobs"][keep],
                    "indptr": np.array([0, int(keep.sum())], np.int64),
                }
            if not self.told_dropped:  # one honest neighbour hears "the victim dropped"
                self.told_dropped.add(helper)
                contributors = [c for c in arrays["contributors"].tolist() if c != 0]
                return arrays | {"contributors": np.asarray(contributors, np.int64)}
        return None

    def decode_victim(self) -> np.ndarray | None:
        """The victim node's sum, from the shares it sealed to the server's keys and the
        neighbours' reveals: ``None`` when the victim sealed nothing or too few shares came."""
        victim = _victim_node(self)
        try:
            _, share_request, config = self.first(self.sent, SHARE, victim)
            _, sealed, _ = self.first(self.replies, SHARE, victim)
            _, advert, _ = self.first(self.replies, ADVERTISE, victim)
            _, masked_reply, _ = self.first(self.replies, MASK, victim)
            _, mask_request, _ = self.first(self.sent, MASK, victim)
        except LookupError:
            return None
        threshold = int(config["threshold"])
        neighbours = share_request["neighbours"][0].tolist()
        xs = dict(zip(neighbours, share_request["xs"][0].tolist(), strict=True))
        [c_victim] = rec.rows_bytes(advert["c_public"])
        points: dict[str, list] = {"b": [], "s": []}
        blobs = rec.rows_bytes(sealed["sealed"][0])
        for v, blob in zip(neighbours, blobs, strict=True):
            if v not in self.fakes:
                continue
            key = kx.pair_key(self.fakes[v].private, c_victim, kx.PURPOSE_SHARE_KEY, 0, 0, v)
            plain = kx.open_sealed(str(config["secagg_aead"]), key, blob, kx.share_aad(0, 0, v))
            points["b"].append((xs[v], shamir.decode_share(plain[: shamir.SHARE_BYTES])))
            points["s"].append((xs[v], shamir.decode_share(plain[shamir.SHARE_BYTES :])))
        for kind, _, arrays, _ in self.replies:
            if kind != UNMASK or "owners" not in arrays:
                continue
            helper = int(arrays["helpers"][0])
            for owner, which, share in zip(
                arrays["owners"].tolist(),
                arrays["kinds"].tolist(),
                rec.rows_bytes(arrays["shares"]),
                strict=True,
            ):
                if owner == 0:
                    points["b" if which == 0 else "s"].append(
                        (xs[helper], shamir.decode_share(share))
                    )
        if min(len(points["b"]), len(points["s"])) < threshold:
            return None
        b = shamir.int_to_secret(shamir.reconstruct(points["b"], threshold))
        s_seed = shamir.int_to_secret(shamir.reconstruct(points["s"], threshold))
        s_key = kx.keypair_from_seed(s_seed)
        [total] = np.array(masked_reply["masked"], copy=True)
        bits = int(config["secagg_bits"])
        expander = prg_mod.MaskExpander(len(total), bits=bits, prg=str(config["secagg_prg"]))
        expander.add(total, b, domain=prg_mod.DOMAIN_SELF_MASK, sign=-1)
        s_publics = rec.rows_bytes(mask_request["s_publics"][0])
        for v, public in zip(mask_request["neighbours"][0].tolist(), s_publics, strict=True):
            seed = kx.pair_key(s_key.private, public, kx.PURPOSE_PAIR_MASK, 0, 0, v)
            expander.add(total, seed, domain=prg_mod.DOMAIN_PAIR_MASK, sign=-1 if v > 0 else 1)
        codec = SecAggConfig(bits=bits, scale=float(config["secagg_scale"]), server=HBC)
        return codec.fixed_point.decode(total)


def _attack_app(example, server: str):
    return example.FedMFApp(
        seed=0,
        rounds=1,
        transport="secagg",
        secagg_server=server,
        secagg_neighbours=4,
        min_nodes=5,
        synthetic_users=40,
        timeout=120.0,
    )


def _plain_sum_of_victim(example, app) -> np.ndarray:
    """The sum of the victim node's users' round-0 updates (the same seed in plaintext)."""
    plain = example.FedMFApp(**{**vars(app), "transport": "plaintext"})
    tap = _run("in-process", example, plain, 5, wrap=Wiretap)["grid"]
    total = 0.0
    for kind, _, arrays, _ in tap.replies:
        if kind != TRAIN:
            continue
        updates = rec.arrays_to_updates(arrays, "update.")
        for k, user in enumerate(updates.clients.tolist()):
            if user in set(arrays["hosted"].tolist()) and 0 in set(arrays["hosted"].tolist()):
                total = total + updates.client_block(k).ravel()
    return np.asarray(total)


# ----------------------------------------------------------------------------- the attacks
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_server_relaying_its_own_keys_and_lying_about_dropouts_is_refused(example, runtime):
    """5 nodes (k = 4, t = 3): the server substitutes 2 of the victim's neighbours' keys and
    tells one more neighbour that the victim dropped. Against the honest-but-curious protocol
    (nodes allowing it) it decodes the victim node's sum exactly; against the malicious-server
    protocol, the app's default, the victim refuses ShareKeys (a forged advertisement) and the
    round is refused: nothing of the victim is sealed to the server, nothing is unmasked."""
    app = _attack_app(example, "malicious")
    state = _run(runtime, example, app, 5, wrap=KeyRelayingServer)
    server = state["grid"]
    error = state.get("error")
    assert isinstance(error, SignatureError), error
    assert "refused" in str(error) and "does not verify" in str(error)
    assert server.fakes and server.decode_victim() is None
    assert "total" not in state["setup"].transport.view.rounds[0].aggregate

    # The same attack against the honest-but-curious protocol (what Flower carried before).
    weak = _attack_app(example, HBC)
    state = _run(runtime, example, weak, 5, wrap=KeyRelayingServer, floors=NodeFloors(HBC))
    decoded = state["grid"].decode_victim()
    assert decoded is not None, "the attack must work against the honest-but-curious protocol"
    expected = _plain_sum_of_victim(example, weak)
    bound = 40 / weak.secagg_scale  # the victim's users' stochastic rounding, one unit each
    np.testing.assert_allclose(decoded[: expected.size], expected, atol=bound)


class SurvivorSetLiar(Wiretap):
    """A server that tells half of the nodes asked at ConsistencyCheck (or, without that
    round, at Unmasking) that the victim (party 0) dropped, though it uploaded its masked sum,
    and forwards every signature it received."""

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.lied_to: set[int] = set()
        self._asked: dict[str, int] = {}

    def _drop_victim(self, arrays, key: str, helper: int):
        if helper == 0:
            return None
        count = self._asked[key] = self._asked.get(key, 0) + 1
        if count % 2:  # every second helper (other than the victim) hears the lie
            return None
        self.lied_to.add(helper)
        return arrays | {key: np.asarray([c for c in arrays[key].tolist() if c != 0], np.int64)}

    def rewrite(self, kind, node, arrays, config):
        helper = int(arrays["helpers"][0]) if "helpers" in arrays else -1
        if kind == CONSISTENCY:
            return self._drop_victim(arrays, "survivors", helper)
        if kind == UNMASK:
            changed = self._drop_victim(arrays, "contributors", helper)
            if changed is not None and "member_parties" in arrays:
                keep = arrays["member_parties"] != 0
                for name in ("member_parties", "member_counts", "member_signatures"):
                    changed[name] = arrays[name][keep]
            return changed
        return None


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_server_telling_nodes_different_survivor_sets_is_refused(example, runtime):
    """4 nodes (k = 3, t = 2): some helpers are told the victim dropped. Against the
    honest-but-curious protocol they reveal its mask key while the others reveal its self-mask
    seed, and no node objects; under the malicious-server protocol the helpers signed different
    sets at ConsistencyCheck, so a helper holds fewer than t valid signatures on its own set and
    refuses: the round is refused, nothing is unmasked."""
    app = example.FedMFApp(
        seed=0, rounds=1, transport="secagg", min_nodes=4, synthetic_users=40, timeout=120.0
    )
    state = _run(runtime, example, app, 4, wrap=SurvivorSetLiar)
    assert state["grid"].lied_to
    error = state.get("error")
    assert isinstance(error, ConsistencyError | SignatureError), error
    assert "refused" in str(error)
    assert "total" not in state["setup"].transport.view.rounds[0].aggregate
    revealed_s_of_victim = [
        arrays
        for kind, _, arrays, _ in state["grid"].replies
        if kind == UNMASK
        and "owners" in arrays
        and 0 in arrays["owners"][arrays["kinds"] == 1].tolist()
    ]
    assert not revealed_s_of_victim  # no helper revealed the mask key of a contributor

    weak = example.FedMFApp(**{**vars(app), "secagg_server": HBC})
    state = _run(runtime, example, weak, 4, wrap=SurvivorSetLiar, floors=NodeFloors(HBC))
    kinds = {
        int(arrays["helpers"][0]): int(arrays["kinds"][arrays["owners"] == 0][0])
        for kind, _, arrays, _ in state["grid"].replies
        if kind == UNMASK and "owners" in arrays and 0 in arrays["owners"].tolist()
    }
    assert set(kinds.values()) == {0, 1}  # the lie worked: both kinds of the victim's shares


# ----------------------------------------------------------------------------- the node's floors
def _floor_refusal(example, app, floors, n_nodes=3) -> Exception:
    state = _run("in-process", example, app, n_nodes, floors=floors)
    return state.get("error")


def test_a_node_refuses_parameters_weaker_than_its_own(example):
    """Each floor of NodeFloors, broken by the server's stated parameters, refuses the round
    with the node's reason; the same run at the node's own parameters trains."""
    base = dict(seed=0, rounds=1, min_nodes=3, synthetic_users=30, timeout=60.0)
    cases = [
        # A server that downgrades to the honest-but-curious protocol (no signature checked).
        (dict(transport="secagg", secagg_server=HBC), NodeFloors(), "secagg-server"),
        # A threshold below the node's own minimum.
        (dict(transport="secagg"), NodeFloors(min_threshold=3), "secagg-min-threshold"),
        # The node assumes 1 colluder of 3: t = 2 of k = 2 fails its bound (the server's
        # default bound, 5 %, allows it).
        (dict(transport="secagg"), NodeFloors(colluders=2), "colluder"),
        # DP: less noise than the node requires; a larger clip; no DP at all; central DP.
        (
            dict(transport="secagg+dp", dp_noise_multiplier=0.5, dp_clip=4.0),
            NodeFloors(dp_noise_multiplier=1.0),
            "dp-noise-multiplier",
        ),
        (
            dict(transport="secagg+dp", dp_noise_multiplier=1.0, dp_clip=4.0),
            NodeFloors(dp_max_clip=1.0),
            "dp-max-clip",
        ),
        (dict(transport="plaintext"), NodeFloors(dp_noise_multiplier=1.0), "no DP"),
        (dict(transport="dp"), NodeFloors(dp_noise_multiplier=0.5), "noise added by the server"),
    ]
    for overrides, floors, cause in cases:
        app = example.FedMFApp(**base, **overrides)
        error = _floor_refusal(example, app, floors)
        assert isinstance(error, InsecureParameterError | AggregationError), (overrides, error)
        assert cause in str(error) and "refused" in str(error), (cause, str(error))
    # At (or above) the floors the same nodes train.
    fine = example.FedMFApp(**base, transport="secagg+dp", dp_noise_multiplier=1.0, dp_clip=1.0)
    state = _run(
        "in-process",
        example,
        fine,
        3,
        floors=NodeFloors(dp_noise_multiplier=1.0, dp_max_clip=1.0, min_threshold=2),
    )
    assert "error" not in state, state.get("error")
    assert state["setup"].transport.view.rounds[0].aggregate.get("dp_total") is not None


class MemberCountInflater(Wiretap):
    """A server that hides a dropout from the DP floor: the victim's masked sum is dropped, and
    the survivors are told a member count the victim never signed."""

    def rewrite(self, kind, node, arrays, config):
        if kind == UNMASK and "member_counts" in arrays:
            counts = arrays["member_counts"].copy()
            counts[0] += 1000  # more users than signed: the distributed noise would look enough
            return arrays | {"member_counts": counts}
        return None


def test_a_member_count_the_party_did_not_sign_is_refused(example):
    app = example.FedMFApp(
        seed=0,
        rounds=1,
        transport="secagg+dp",
        dp_noise_multiplier=1.0,
        dp_clip=4.0,
        min_nodes=3,
        synthetic_users=30,
        timeout=60.0,
    )
    state = _run("in-process", example, app, 3, wrap=MemberCountInflater)
    error = state.get("error")
    assert isinstance(error, SignatureError) and "member count" in str(error), error


def test_fewer_contributing_users_than_the_minimum_are_refused_by_the_nodes(example):
    """Secure aggregation's own minimum of contributors (issue 30) counts users: with each node
    one party the nodes check it against the parties' signed member counts, and refuse."""
    from securefed.transport.secagg import SecAggTransport

    app = example.FedMFApp(
        seed=0, rounds=1, transport="secagg", min_nodes=3, synthetic_users=30, timeout=60.0
    )
    client_app = make_client_app(lambda context: example.client_setup(app, context))
    setup = example.server_setup(app)
    # The app's ring, and a minimum above the round's 30 users.
    config = SecAggConfig(bits=64, scale=2.0**20, clip=2.0**20, min_contributors=31)
    setup.transport = SecAggTransport(config, remote_clients=True)
    from flwr.supercore.task_identity import TaskIdentity

    with pytest.MonkeyPatch.context() as patch:
        for name in ("_run_id", "_task_id", "_node_id"):
            patch.setattr(TaskIdentity, name, 1)
        with pytest.raises(ConsistencyError, match="fewer than the 31 this node requires"):
            run_federation(DirectGrid(client_app, 3), setup)
    assert "total" not in setup.transport.view.rounds[0].aggregate


# ----------------------------------------------------------------------------- the same model
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("transport", "mechanism"),
    [("secagg", ""), ("secagg+dp", ""), ("secagg+dp", "skellam")],
)
def test_the_same_seed_gives_the_in_process_model(example, runtime, transport, mechanism):
    """Malicious-server secure aggregation, and secagg+dp with the exact distributed discrete
    Gaussian (its default) and Skellam encoded on the nodes: the model and the ledger equal the
    in-process run's (measured: V bit-identical)."""
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        transport=transport,
        min_nodes=3,
        synthetic_users=60,
        dp_mechanism=mechanism,
        dp_clip=4.0,
        dp_noise_multiplier=0.5,
        timeout=120.0,
    )
    state = _run(runtime, example, app, 3)
    assert "error" not in state, state.get("error")
    setup = state["setup"]
    model, reference, _ = example.in_process(app)
    np.testing.assert_allclose(setup.algorithm.V, model.V, rtol=0, atol=1e-9)
    view = setup.transport.view.rounds[-1]
    assert view.public["secagg_server"] == "malicious" and view.public["secagg_n"] == 3
    if transport == "secagg+dp":
        assert view.public["dp_mechanism"] == (mechanism or "discrete_gaussian")
        assert setup.transport.ledger.history == reference.ledger.history
        # The noise is really there: the DP model is not the noiseless one.
        clean, _, _ = example.in_process(example.FedMFApp(**{**vars(app), "transport": "secagg"}))
        assert np.abs(model.V - clean.V).max() > 1e-3


# ----------------------------------------------------------------------------- identities
def test_provisioned_identities_are_pinned_and_private(tmp_path):
    digest = provision_identities(tmp_path, {0: [0, 1], 1: [2, 3]})
    identity = load_identity(tmp_path / "identity-1.bin", tmp_path / "registry.bin", digest)
    assert sorted(identity.signers) == [2, 3] and len(identity.registry.keys) == 4
    assert identity.signer(2).registry_digest == identity.registry.digest
    with pytest.raises(SignatureError, match="no long-term identity"):
        identity.signer(0)
    with pytest.raises(SignatureError, match="pinned at enrolment"):
        load_identity(tmp_path / "identity-1.bin", tmp_path / "registry.bin", "00" * 32)
    (tmp_path / "identity-0.bin").chmod(0o644)
    with pytest.raises(InsecureParameterError, match="chmod 600"):
        load_identity(tmp_path / "identity-0.bin", tmp_path / "registry.bin", digest)
    data = (tmp_path / "registry.bin").read_bytes()
    (tmp_path / "registry.bin").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match="altered"):
        load_identity(tmp_path / "identity-1.bin", tmp_path / "registry.bin", digest)
    with pytest.raises(InsecureParameterError, match="provisioned out of band"):
        seeded_identity(SeedTree.secure_mode(), [0], 4)


def test_in_secure_mode_a_node_without_provisioned_identities_refuses(example):
    """Secure mode (seed -1) derives nothing from a seed: a node started without identity
    files refuses the malicious-server round, naming the node config keys it needs."""
    app = example.FedMFApp(transport="secagg", rounds=1, min_nodes=3, synthetic_users=30)
    error = _run("in-process", example, app, 3).get("error")
    assert isinstance(error, InsecureParameterError), error
    assert "secagg-identity-path" in str(error) and "refused" in str(error)


# ----------------------------------------------------------------------------- DP around CKKS
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_dp_around_ckks_noises_on_the_nodes_and_equals_in_process(example, tmp_path, runtime):
    """``ckks+dp`` (float Gaussian, distributed): each node clips and noises its users' updates
    before it encrypts them, the ledger is charged before the key-holder node decrypts the sum,
    and the model equals the in-process run within CKKS's error."""
    pytest.importorskip("tenseal")
    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    config = CKKSConfig()
    secret_path, public_path = provision_keys(tmp_path / "keys", config)
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        transport="ckks+dp",
        dp_mechanism="gaussian",
        dp_clip=4.0,
        dp_noise_multiplier=0.5,
        min_nodes=3,
        synthetic_users=30,
        ckks_secret_path=str(secret_path),
        ckks_public_path=str(public_path),
        timeout=120.0,
    )
    state = _run(runtime, example, app, 3, wrap=Wiretap)
    assert "error" not in state, state.get("error")
    setup = state["setup"]
    model, reference, _ = example.in_process(app)
    clean, transport, _ = example.in_process(example.FedMFApp(**{**vars(app), "transport": "ckks"}))
    # As for CKKS alone (tests/test_flower.py): per round n 2^(14 - scale) + 6 std + step.
    per_round = (
        30 * 2.0 ** (14 - transport.params.scale_bits)
        + 6 * config.flooding.std
        + config.flooding.step
    )
    bound = app.rounds * app.server_lr * per_round
    assert np.abs(setup.algorithm.V - model.V).max() < bound
    assert np.abs(model.V - clean.V).max() > 100 * bound  # the noise is in the model
    assert setup.transport.ledger.history == reference.ledger.history
    assert setup.transport.ledger.steps == app.rounds
    # What left the nodes: ciphertexts only; the noise parameters they were told are public.
    _, _, told = state["grid"].first(state["grid"].sent, "train.ckks")
    assert told["dp_placement"] == "distributed" and told["dp_std"] > 0
    _, reply, _ = state["grid"].first(state["grid"].replies, "train.ckks")
    assert "ct_bytes" in reply and not any(name.startswith("update.") for name in reply)


# ----------------------------------------------------------------------------- real processes
def provisioned_node_config(enrol, n_users: int, n_nodes: int) -> dict[int, dict[str, object]]:
    """Provision every user's identity in ``enrol``; each node's ``--node-config`` keys naming
    its identity file, the registry and the pinned digest."""
    from securefed.flower import partition_users

    digest = provision_identities(
        enrol, {p: partition_users(n_users, n_nodes, p) for p in range(n_nodes)}
    )
    return {
        p: {
            "secagg-identity-path": str(enrol / f"identity-{p}.bin"),
            "secagg-registry-path": str(enrol / "registry.bin"),
            "secagg-registry-digest": digest,
        }
        for p in range(n_nodes)
    }


@pytest.mark.slow  # 172 s at load 10 on the 2-core machine: ~10 s+ per message round
def test_real_processes_run_the_malicious_protocol_with_provisioned_identities(example, tmp_path):
    """A SuperLink and 3 SuperNodes as processes on 127.0.0.1, each node started with its own
    identity file, the registry and its pinned digest (``--node-config``), and a DP floor: one
    round of ``secagg+dp`` (malicious-server secure aggregation, the exact discrete Gaussian
    encoded on the nodes) gives the in-process model."""
    import json

    from securefed.flower.loopback import LoopbackFederation, missing_commands
    from securefed.recsys.fedmf_flower import write_fedmf_app

    missing = missing_commands()
    if missing:
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out, enrol = tmp_path / "out", tmp_path / "enrol"
    app = example.FedMFApp(
        seed=0,
        rounds=1,
        transport="secagg+dp",
        dp_noise_multiplier=1.0,
        dp_clip=1.0,
        min_nodes=3,
        synthetic_users=30,
        output_dir=str(out),
        timeout=120.0,
    )
    node_config = provisioned_node_config(enrol, 30, 3)
    for config in node_config.values():
        config["dp-noise-multiplier"] = 1.0
    with LoopbackFederation(tmp_path / "federation", 3, node_config=node_config) as federation:
        federation.submit(write_fedmf_app(tmp_path / "app", app.run_config()))
        federation.wait_for(out / "result.json", timeout=400)
    result = json.loads((out / "result.json").read_text())
    model, reference, _ = example.in_process(app)
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], model.V, atol=1e-9)
    assert result["epsilon"] == pytest.approx(reference.epsilon())
    assert result["nodes"] == 3
