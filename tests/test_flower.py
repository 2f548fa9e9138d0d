"""securefed on Flower: the adapters, the simulation engine, and a real loopback federation.

Three claims of issue 9 are checked against the in-process runtime (``securefed.run_rounds``)
with the same seed:

* the simulation engine in plaintext gives the same model (V and every user vector within 1e-9);
* securefed's secure aggregation carried over Flower message rounds gives the same model as in
  one process, and the plaintext model within the fixed-point error bound;
* a real federation (a SuperLink and two SuperNodes as separate processes on 127.0.0.1, started
  and stopped here) trains FedMF: the training error falls and the model equals in-process.

Flower's own machinery is never mocked; the unit tests at the top drive the pure pieces (records,
partitions, client-side noise, the secure-aggregation stage API) directly.
"""

from __future__ import annotations

import json
import os
import tomllib

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed import PlaintextTransport, RowUpdates, SeedTree
from securefed.errors import AggregationError, InsecureParameterError
from securefed.flower import describe_transport, partition_users
from securefed.flower import records as rec
from securefed.flower.dp import client_noise_std, noise_on_client
from securefed.flower.loopback import LoopbackFederation, missing_commands
from securefed.recsys.fedmf_flower import APP_DIR, write_fedmf_app
from securefed.transport.dp import DPTransport
from securefed.transport.secagg import (
    SecAggClient,
    SecAggConfig,
    SecAggTransport,
    masking_workspace,
    pack_values,
)

HBC = "honest_but_curious"  # the stage-API unit tests below run it without signing keys
SIMULATION_BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


def _batch(rng, clients, n_rows=6, width=3, weighted=False) -> RowUpdates:
    counts = rng.integers(0, n_rows + 1, len(clients))
    rows = np.concatenate([np.sort(rng.choice(n_rows, c, replace=False)) for c in counts])
    weights = rng.uniform(0.2, 1.0, len(clients)) if weighted else None
    return RowUpdates(
        np.asarray(clients),
        np.concatenate([[0], np.cumsum(counts)]),
        rows.astype(np.int64),
        rng.normal(size=(int(counts.sum()), width)),
        n_rows,
        weights=weights,
    )


# ----------------------------------------------------------------------------- pure pieces
def test_partitions_put_every_user_on_exactly_one_node():
    parts = [partition_users(943, 50, p) for p in range(50)]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(943))
    assert {len(p) for p in parts} == {18, 19}
    assert len(partition_users(3, 5, 4)) == 0  # more nodes than users: some host none
    with pytest.raises(ValueError, match="partition-id"):
        partition_users(10, 2, 2)


@pytest.mark.parametrize("weighted", [False, True])
def test_updates_survive_flower_records(weighted):
    rng = np.random.default_rng(0)
    updates = _batch(rng, [3, 7, 9], weighted=weighted)
    record = rec.arrays_record(rec.updates_to_arrays(updates, "update."))
    back = rec.arrays_to_updates(rec.record_arrays(record), "update.")
    np.testing.assert_array_equal(back.weighted_sum(), updates.weighted_sum())
    np.testing.assert_array_equal(back.clients, updates.clients)
    assert back.dense == updates.dense and (back.weights is None) == (not weighted)
    joined = rec.concat_updates([_batch(rng, [1, 2]), _batch(rng, [5])], 6, 3)
    assert joined.clients.tolist() == [1, 2, 5]
    assert len(rec.concat_updates([], 6, 3).clients) == 0
    with pytest.raises(ValueError, match="lacks"):
        rec.arrays_to_updates({"clients": updates.clients})


def test_client_side_noise_is_the_noise_dp_round_adds():
    """What a node adds under local DP equals what DPRound adds in one process (same seed)."""
    rng = np.random.default_rng(1)
    updates = _batch(rng, [0, 1, 2, 3])
    seeds = SeedTree(5)
    dp = DPTransport(PlaintextTransport(), clip=0.5, noise_multiplier=2.0, placement="local")
    rnd = dp.open_round(4, range(4), shape=updates.shape, seeds=seeds)
    rnd.submit_batch(updates)
    noised = noise_on_client(
        updates, clip=0.5, std=client_noise_std("local", 0.5, 2.0, 4), round_id=4, seeds=seeds
    )
    np.testing.assert_array_equal(rnd.result().total, noised.weighted_sum())
    assert client_noise_std("distributed", 0.5, 2.0, 4) == pytest.approx(0.5)
    with pytest.raises(InsecureParameterError, match="weight"):
        heavy = RowUpdates(
            updates.clients, updates.indptr, updates.rows, updates.values, 6, False, np.full(4, 2.0)
        )
        noise_on_client(heavy, clip=0.5, std=1.0, round_id=0, seeds=seeds)
    with pytest.raises(ValueError, match="central"):
        client_noise_std("central", 1.0, 1.0, 4)


def _remote_round(config, clients, updates, seeds, *, drop=(), restore=False):
    """Drive a remote-client SecAggRound stage by stage, as the Flower server and nodes do."""
    transport = SecAggTransport(config, remote_clients=True)
    rnd = transport.open_round(2, clients, shape=updates.shape, seeds=seeds)
    parties = {c: SecAggClient(c, 2, config, seeds) for c in clients}

    def again(c):  # a node restores the client from its saved secrets between messages
        if restore:
            parties[c] = SecAggClient(c, 2, config, seeds, secrets=parties[c].export_secrets())
        return parties[c]

    rnd.receive_keys({c: parties[c].advertise() for c in clients})
    for c in clients:
        request = rnd.share_request(c)
        sealed = again(c).share(
            request.neighbours, request.xs, request.c_publics, request.threshold
        )
        rnd.receive_shares(c, sealed)
    length = updates.n_rows * updates.width
    workspace = masking_workspace(length, config)
    for k, c in enumerate(updates.clients.tolist()):
        if c in drop:
            rnd.drop(c)
            continue
        request = rnd.mask_request(c)
        masked, _ = again(c).mask(
            pack_values(updates.client_block(k), None),
            request.neighbours,
            request.s_publics,
            workspace,
        )
        rnd.receive_masked(c, masked, weighted=False)
    rnd.receive_reveals(
        {v: again(v).reveal(r.inbox, set(r.contributors)) for v, r in rnd.unmask_requests().items()}
    )
    return rnd


@pytest.mark.parametrize("restore", [False, True])
def test_remote_secagg_stages_equal_the_simulated_round(restore):
    config = SecAggConfig(bits=64, scale=2.0**20, clip=64.0, neighbours=4, server=HBC)
    clients = list(range(8))
    updates = _batch(np.random.default_rng(2), clients)
    seeds = SeedTree(9)
    simulated = SecAggTransport(config).open_round(2, clients, shape=updates.shape, seeds=seeds)
    kept = np.isin(updates.clients, [c for c in clients if c != 3])
    survivors = RowUpdates(
        updates.clients[kept],
        np.concatenate([[0], np.cumsum(np.diff(updates.indptr)[kept])]),
        np.concatenate([updates.client_rows(k)[0] for k in np.flatnonzero(kept)]),
        np.concatenate([updates.client_rows(k)[1] for k in np.flatnonzero(kept)]),
        updates.n_rows,
    )
    simulated.drop(3)
    simulated.submit_batch(survivors)
    remote = _remote_round(config, clients, updates, seeds, drop=(3,), restore=restore)
    np.testing.assert_array_equal(remote.result().total, simulated.result().total)
    np.testing.assert_allclose(
        remote.result().total, survivors.weighted_sum(), atol=remote.error_bound()
    )
    assert remote.view.bytes_up.tolist() == simulated.view.bytes_up.tolist()


def test_a_round_among_parties_sums_its_members_and_refuses_what_it_cannot_check():
    """Two parties of 3 and 2 clients each upload the masked sum of their members' encodings
    (each with the member's own rounding key): the same ring sum as five clients alone."""
    from securefed.transport.secagg import encode_input, rounding_key

    config = SecAggConfig(bits=64, scale=2.0**20, clip=64.0, server=HBC)
    updates = _batch(np.random.default_rng(3), list(range(5)))
    seeds = SeedTree(4)
    alone = SecAggTransport(config).open_round(1, range(5), shape=updates.shape, seeds=seeds)
    alone.submit_batch(updates)
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        1, range(5), shape=updates.shape, seeds=seeds
    )
    with pytest.raises(AggregationError, match="at least 2 parties"):
        rnd.among_parties({0: [0, 1, 2, 3, 4]})
    with pytest.raises(AggregationError, match="one of its own members"):
        rnd.among_parties({0: [0, 1, 2], 4: [2, 3]})
    members = {0: [0, 1, 2], 3: [3, 4]}
    parties = rnd.among_parties(members)
    nodes = {p: SecAggClient(p, 1, config, seeds) for p in members}
    parties.receive_keys({p: nodes[p].advertise() for p in members})
    for p in members:
        request = parties.share_request(p)
        parties.receive_shares(
            p, nodes[p].share(request.neighbours, request.xs, request.c_publics, request.threshold)
        )
    length = updates.n_rows * updates.width
    workspace = masking_workspace(length, config)
    for p, users in members.items():
        encoded = np.zeros(length, config.fixed_point.dtype)
        for u in users:
            values = pack_values(updates.client_block(u), None)
            encoded += encode_input(values, rounding_key(seeds, 1, u), workspace, owner=u)[0]
        request = parties.mask_request(p)
        masked = nodes[p].mask_encoded(encoded, request.neighbours, request.s_publics, workspace)
        with pytest.raises(AggregationError, match="its own"):
            rnd.receive_party_masked(p, [u + 1 for u in users], masked, weighted=False)
        rnd.receive_party_masked(p, users, masked, weighted=False)
    parties.receive_reveals(
        {
            v: nodes[v].reveal(r.inbox, set(r.contributors))
            for v, r in parties.unmask_requests().items()
        }
    )
    with pytest.raises(AggregationError, match="released by the clients' round"):
        parties.result()
    result = rnd.result()
    np.testing.assert_array_equal(result.total, alone.result().total)
    assert result.contributors.tolist() == [0, 1, 2, 3, 4] and result.weight == 5.0
    assert rnd.view.public["secagg_n"] == 2 and rnd.view.public["secagg_users"] == 5
    assert rnd.view.bytes_up[[1, 2, 4]].sum() == 0  # what the server got came from the parties
    assert rnd.view.bytes_up[[0, 3]].min() > length * 8


def test_remote_secagg_round_refuses_what_it_cannot_check():
    config = SecAggConfig(neighbours=2, server=HBC)
    seeds = SeedTree(0)
    rnd = SecAggTransport(config, remote_clients=True).open_round(
        0, range(4), shape=(1, 2), seeds=seeds
    )
    with pytest.raises(AggregationError, match="advertised no keys"):
        rnd.receive_keys({0: SecAggClient(0, 0, config, seeds).advertise()})
    with pytest.raises(AggregationError, match="remote"):
        rnd.submit(0, np.zeros(2))
    with pytest.raises(AggregationError, match="self-mask"):
        workspace = masking_workspace(2, rnd.config)  # the round's scale, as a node is sent
        SecAggClient(0, 0, config, seeds).mask(np.zeros(2), [], [], workspace)


def test_transports_the_flower_server_can_and_cannot_carry():
    assert describe_transport(PlaintextTransport()).kind == "plaintext"
    wire = describe_transport(
        DPTransport(
            SecAggTransport(SecAggConfig(server=HBC), remote_clients=True),
            clip=1.0,
            noise_multiplier=1.0,
            placement="distributed",
        )
    )
    assert wire.kind == "secagg" and wire.client_noise
    with pytest.raises(ValueError, match="remote_clients=True"):
        describe_transport(SecAggTransport())
    # The malicious-server variant (the default) is carried with signatures; MACs are not.
    malicious = describe_transport(SecAggTransport(remote_clients=True))
    assert malicious.kind == "secagg" and malicious.secagg.malicious
    with pytest.raises(NotImplementedError, match="auth='macs'"):
        describe_transport(SecAggTransport(SecAggConfig(auth="macs"), remote_clients=True))


def test_the_apps_transports_come_from_the_registry_with_a_ledger_for_dp(example):
    from securefed.privacy.ledger import PrivacyLedger

    for name in ("dp", "dp-local", "secagg+dp"):
        app = example.FedMFApp(
            transport=name, dp_noise_multiplier=0.5, dp_clip=2.0, dp_mechanism="gaussian"
        )
        server, local = app.make_transport(remote=True), app.make_transport(remote=False)
        for transport in (server, local):
            assert isinstance(transport.ledger, PrivacyLedger)
            assert (transport.config.clip, transport.config.noise_multiplier) == (2.0, 0.5)
        assert describe_transport(server).dp is not None
    # secagg+dp's default mechanism, the exact discrete Gaussian, runs on Flower's nodes too
    # (securefed.flower.dp.integers_on_client): no fall-back to the float Gaussian.
    default = example.FedMFApp(transport="secagg+dp", dp_noise_multiplier=0.5)
    server = default.make_transport(remote=True)
    assert server.config.mechanism == "discrete_gaussian" and server.inner.remote_clients
    assert describe_transport(server).integer_mechanism
    remote = example.FedMFApp(
        transport="secagg", secagg_bits=32, secagg_scale=2.0**10, secagg_clip=4096.0
    )
    server = remote.make_transport(remote=True)
    assert server.remote_clients and server.ledger is None
    assert (server.config.bits, server.config.scale) == (32, 2.0**10)
    assert not remote.make_transport(remote=False).remote_clients
    with pytest.raises(ValueError, match="spec-string options"):
        example.FedMFApp(transport="secagg:bits=32")


def test_the_app_template_takes_its_run_config(example, tmp_path):
    app = example.FedMFApp(rounds=3, transport="secagg", output_dir=str(tmp_path / "out"))
    app_dir = write_fedmf_app(tmp_path / "app", app.run_config())
    config = tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert example.FedMFApp.from_run_config(config["config"]) == app
    assert config["components"]["clientapp"] == "securefed_fedmf_app.app:client"
    with pytest.raises(ValueError, match="unknown run-config key"):
        example.FedMFApp.from_run_config({"roundz": 3})
    with pytest.raises(ValueError, match="transport"):
        example.FedMFApp(transport="paillier")
    with pytest.raises(ValueError, match="ckks-public-path"):
        example.FedMFApp(transport="ckks")


# ----------------------------------------------------------------------------- CKKS pieces
@pytest.fixture(scope="module")
def ckks_files(tmp_path_factory):
    """Keys provisioned once, as on a deployment: (secret file, public file), shared model."""
    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    return provision_keys(tmp_path_factory.mktemp("ckks-keys"), CKKSConfig())


def test_ckks_key_files_hold_tenseal_bytes_not_pickle(ckks_files, tmp_path):
    from securefed.crypto.ckks import (
        SECRET_FILE_MAGIC,
        load_public_context,
        load_secret_context,
        save_secret_context,
    )

    secret_path, public_path = ckks_files
    assert os.stat(secret_path).st_mode & 0o777 == 0o600
    assert secret_path.read_bytes().startswith(SECRET_FILE_MAGIC)
    secret, public = load_secret_context(secret_path), load_public_context(public_path)
    assert secret.key_id == public.key_id and secret.tenseal.has_secret_key()
    assert not public.tenseal.has_secret_key()
    [envelope] = secret.encrypt(np.array([1.5, -2.0]))
    doubled = public.load(envelope) + public.load(envelope)  # the server adds, cannot decrypt
    np.testing.assert_allclose(secret.decrypt(public.dump(doubled, 2)), [3.0, -4.0], atol=1e-5)
    copy = save_secret_context(secret, tmp_path / "copy.bin")
    os.chmod(copy, 0o644)
    with pytest.raises(InsecureParameterError, match="chmod 600"):
        load_secret_context(copy)
    with pytest.raises(ValueError, match="public-context"):
        load_public_context(secret_path)  # a server's loader never takes the secret file
    broken = tmp_path / "broken.bin"
    broken.write_bytes(secret_path.read_bytes()[:-10])
    os.chmod(broken, 0o600)
    with pytest.raises(ValueError, match="SHA-256"):
        load_secret_context(broken)


def test_remote_ckks_round_equals_the_in_process_round(ckks_files):
    """Nodes encrypt, a server without the key adds, a key holder decrypts and floods: the
    stage API the Flower server and nodes drive gives the in-process round's sum."""
    from securefed.crypto.ckks import load_public_context, load_secret_context
    from securefed.flower.ckks import NodeKeys, arrays_to_ciphertexts
    from securefed.transport.ckks import CKKSConfig, CKKSTransport

    secret_path, public_path = ckks_files
    updates = _batch(np.random.default_rng(4), list(range(6)), weighted=True)
    seeds = SeedTree(8)
    config = CKKSConfig()
    local = CKKSTransport(config, secret=load_secret_context(secret_path))
    reference = local.open_round(3, range(6), shape=updates.shape, seeds=seeds)
    reference.submit_batch(updates)
    server = CKKSTransport(config, public=load_public_context(public_path))
    assert server.key_holder is None and not server.server_context.tenseal.has_secret_key()
    rnd = server.open_round(3, range(6), shape=updates.shape, seeds=seeds)
    node = NodeKeys.from_paths(secret_path, None)
    arrays = rec.record_arrays(rec.arrays_record(node.encrypt_updates(updates, "shared", 2**16)))
    for user, ciphertexts in zip(
        arrays["users"].tolist(), arrays_to_ciphertexts(arrays), strict=True
    ):
        rnd.receive_ciphertexts(user, ciphertexts, weighted=True)
    with pytest.raises(AggregationError, match="already submitted"):
        rnd.receive_ciphertexts(0, arrays_to_ciphertexts(arrays)[0], weighted=True)
    request = rnd.decryption_request()
    assert request.decryptor == 0 and request.length == updates.n_rows * updates.width + 1
    with pytest.raises(AggregationError, match="holds only the public context"):
        server.open_round(4, range(6), shape=updates.shape, seeds=seeds).submit_batch(updates)
    rnd.receive_decryption(
        node.decrypt_sum(request.summed, request.length, config.flooding, 3, seeds)
    )
    total, weight = rnd.result().total, rnd.result().weight
    np.testing.assert_allclose(total, reference.result().total, atol=2 * rnd.error_bound())
    np.testing.assert_allclose(total, updates.weighted_sum(), atol=rnd.error_bound())
    assert weight == pytest.approx(updates.weights.sum(), abs=rnd.error_bound())
    assert rnd.view.bytes_up.tolist() == reference.view.bytes_up.tolist()
    with pytest.raises(AggregationError, match="decryption_request"):
        empty = server.open_round(5, [1], shape=updates.shape, seeds=seeds)
        empty.receive_ciphertexts(1, arrays_to_ciphertexts(arrays)[1], weighted=True)
        empty.result()
    with pytest.raises(ValueError, match="holds the users' secret key"):
        describe_transport(local)
    assert describe_transport(server).kind == "ckks"


# ----------------------------------------------------------------------------- Flower engines
def _simulate(example, app, nodes: int):
    from securefed.flower.simulation import run_in_simulation

    return run_in_simulation(example.build_apps(app), nodes, SIMULATION_BACKEND)


def _node_vectors(out_dir, nodes: int, shape) -> np.ndarray:
    U = np.full(shape, np.nan)
    for partition in range(nodes):
        saved = np.load(out_dir / f"node-{partition}.npz")
        U[saved["users"]] = saved["U"]
    return U


@pytest.mark.slow  # ~30 s; the loopback test below checks the same equality through processes
def test_simulation_engine_gives_the_in_process_model(example, tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    app = example.FedMFApp(seed=0, rounds=3, min_nodes=3, output_dir=str(tmp_path))
    outcome = _simulate(example, app, nodes=3)
    model, _, history = example.in_process(app)
    np.testing.assert_allclose(outcome.model.V, model.V, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_node_vectors(tmp_path, 3, model.U.shape), model.U, atol=1e-9)
    flower = [r["train_rmse"] for r in outcome.result.rounds]
    np.testing.assert_allclose(flower, [r["train_rmse"] for r in history], rtol=1e-12)
    assert flower[-1] < flower[0]
    split = example.load_split(app)
    predictions = model.predict(split.test.users, split.test.items)
    reference = float(np.sqrt(np.mean((predictions - split.test.ratings) ** 2)))
    assert outcome.result.evaluations[-1]["rmse"] == pytest.approx(reference, rel=1e-12)
    # The server's notebook is the transport's view, as in one process.
    assert outcome.transport.view.rounds[-1].bytes_up.sum() > 0


def test_secure_aggregation_over_flower_message_rounds(example, tmp_path):
    """AdvertiseKeys, ShareKeys, masked input and Unmasking each one Flower message round."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    app = example.FedMFApp(
        seed=0, rounds=3, transport="secagg", min_nodes=3, output_dir=str(tmp_path)
    )
    outcome = _simulate(example, app, nodes=3)
    secure, _, _ = example.in_process(app)
    np.testing.assert_allclose(outcome.model.V, secure.V, atol=1e-9)
    np.testing.assert_allclose(_node_vectors(tmp_path, 3, secure.U.shape), secure.U, atol=1e-9)
    plain, _, _ = example.in_process(example.FedMFApp(seed=0, rounds=3))
    # Each round's sum is within n / scale of the plaintext sum; V moves by server_lr times a
    # per-item mean of it, so after the run V is within rounds * server_lr * n / scale.
    bound = app.rounds * app.server_lr * plain.n_clients / app.secagg_scale
    assert np.abs(outcome.model.V - plain.V).max() < bound
    view = outcome.transport.view.rounds[-1]
    # Every user took part, in its node's masked sum: the protocol's parties are the 3 nodes.
    assert view.public["secagg_users"] == plain.n_clients and view.public["secagg_n"] == 3
    members = view.public["secagg_party_members"]
    assert sorted(u for m in members.values() for u in m) == list(range(plain.n_clients))
    assert set(view.payloads) <= {int(p) for p in members}  # one upload per node, no user's own


def _holds_secret_key(root, seen=None) -> list[str]:
    """Paths to anything reachable from ``root`` that holds a CKKS secret key."""
    import tenseal as ts

    from securefed.crypto.ckks import SecretContext
    from securefed.transport.ckks import KeyHolder

    seen = set() if seen is None else seen
    found, stack = [], [("root", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (SecretContext, KeyHolder)):
            found.append(path)
            continue
        if isinstance(obj, ts.Context) and obj.has_secret_key():
            found.append(path)
            continue
        if isinstance(obj, dict):
            stack.extend((f"{path}[{k!r}]", v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("securefed", "tenseal")):
            stack.extend((f"{path}.{k}", v) for k, v in vars(obj).items())
    return found


@pytest.mark.parametrize("key_model", ["shared", pytest.param("committee", marks=pytest.mark.slow)])
def test_ckks_over_flower_equals_in_process_ckks(example, tmp_path, key_model):
    """The nodes encrypt with the provisioned keys, the server adds ciphertexts under the public
    context only, a key-holder node decrypts the sum in one more message round."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    config = CKKSConfig(key_model=key_model)
    secret_path, public_path = provision_keys(tmp_path / "keys", config)
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        min_nodes=3,
        transport="ckks",
        ckks_key_model=key_model,
        ckks_secret_path=str(secret_path),
        ckks_public_path=str(public_path),
        output_dir=str(tmp_path),
    )
    outcome = _simulate(example, app, nodes=3)
    model, transport, history = example.in_process(app)
    plain, _, _ = example.in_process(example.FedMFApp(seed=0, rounds=2))
    # Per round the CKKS sum is within error_bound of the exact one (fresh encryption error of
    # each upload, flooding, rounding); V moves by server_lr times per-item means of it.
    params = transport.params
    per_round = (
        plain.n_clients * 2.0 ** (14 - params.scale_bits)
        + 6 * config.flooding.std
        + config.flooding.step
    )
    bound = app.rounds * app.server_lr * per_round
    for reference in (model.V, plain.V):
        assert np.abs(outcome.model.V - reference).max() < bound
    U = _node_vectors(tmp_path, 3, model.U.shape)
    assert np.abs(U - model.U).max() < bound
    flower = [r["train_rmse"] for r in outcome.result.rounds]
    np.testing.assert_allclose(flower, [r["train_rmse"] for r in history], rtol=1e-6)
    # The server held the public context only, and its view shows ciphertexts, not updates.
    server = outcome.transport
    assert server.key_holder is None and not server.server_context.tenseal.has_secret_key()
    assert server.server_context.key_id == transport.server_context.key_id
    assert _holds_secret_key(outcome) == []
    view = server.view.rounds[-1]
    assert view.public["ckks_ciphertexts"] == 1 and view.bytes_up.sum() > 100_000 * 120
    if key_model == "shared":
        assert view.public["ckks_decryptor"] == 0


def test_loopback_federation_of_real_processes_trains_fedmf(example, tmp_path):
    """A SuperLink and two SuperNodes as processes on 127.0.0.1; the run is submitted with
    ``flwr run`` and trains FedMF to the in-process model."""
    missing = missing_commands()
    if missing:
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out = tmp_path / "out"
    app = example.FedMFApp(seed=0, rounds=2, min_nodes=2, output_dir=str(out), timeout=120.0)
    with LoopbackFederation(tmp_path / "federation", n_nodes=2) as federation:
        federation.submit(write_fedmf_app(tmp_path / "app", app.run_config()))
        federation.wait_for(out / "result.json", timeout=240)
    result = json.loads((out / "result.json").read_text())
    model, _, history = example.in_process(app)
    rmse = [r["train_rmse"] for r in result["rounds"]]
    assert rmse[1] < rmse[0]
    np.testing.assert_allclose(rmse, [r["train_rmse"] for r in history], rtol=1e-12)
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], model.V, atol=1e-9)
    np.testing.assert_allclose(_node_vectors(out, 2, model.U.shape), model.U, atol=1e-9)
    assert result["nodes"] == 2 and result["evaluations"][-1]["nodes"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["dp-local", "secagg+dp"])
def test_noise_added_on_the_nodes_matches_in_process(example, tmp_path, transport):
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        transport=transport,
        min_nodes=3,
        dp_clip=4.0,
        dp_noise_multiplier=0.5,
        dp_mechanism="gaussian",
        output_dir=str(tmp_path),
    )
    outcome = _simulate(example, app, nodes=3)
    model, reference, _ = example.in_process(app)
    np.testing.assert_allclose(outcome.model.V, model.V, atol=1e-8)
    np.testing.assert_allclose(_node_vectors(tmp_path, 3, model.U.shape), model.U, atol=1e-8)
    # DP on Flower is accounted: the run result carries the ledger, charged once per round.
    assert outcome.ledger is outcome.transport.ledger and outcome.ledger.steps == app.rounds
    assert outcome.ledger.history == reference.ledger.history
    recorded = json.loads((tmp_path / "result.json").read_text())
    assert recorded["epsilon"] == pytest.approx(reference.epsilon()) and recorded["epsilon"] > 0


def test_the_example_app_runs_in_secure_mode_unless_seeded(example):
    # Issue 17 item 9: its default seed let the server regenerate every node's keys.
    assert example.FedMFApp().seed == -1 and example.FedMFApp().seeds().secure
    template = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    assert template["tool"]["flwr"]["app"]["config"]["seed"] == -1
    seeded = example.FedMFApp(seed=4).seeds()
    assert not seeded.secure and seeded.randomness == "seeded: not private"
