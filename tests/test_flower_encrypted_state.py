"""FedMF's ``server_state="encrypted"`` on Flower: the ServerApp keeps ``[[V]]`` only (issue 33).

Chai et al. (2020, Sec. 3.2): the server never holds the item matrix ``V`` in the clear. On
Flower a key-holder node encrypts the initial ``V`` (``query.ckks_encrypt_state``), the server
folds the nodes' encrypted ``[[-eta g]]`` sums into ``[[V]]`` homomorphically and sends ``[[V]]``
to the nodes, which decrypt it with the users' shared secret key. Checked here:

* the same seed gives the same model on the simulation engine as in one process with
  ``server_state="encrypted"``, within the tolerance of the in-process CKKS test (1e-4);
* the ServerApp holds no secret key, and neither its state nor any message it sends holds an
  array close to ``V`` (the initial one or the trained one);
* the refusals of one process stay, by name, and checkpoints with an encrypted state are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed import SeedTree
from securefed.crypto.ckks import ContextMismatchError, load_public_context, load_secret_context
from securefed.errors import AggregationError, CheckpointError, UnsupportedTransport
from securefed.flower.ckks import NodeKeys, arrays_to_ciphertexts, provision_keys
from securefed.flower.server import _Run
from securefed.transport.ckks import CKKSConfig, CKKSTransport, state_from_arrays

SIMULATION_BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}
TOLERANCE = 1e-4  # tests/test_ckks.py::test_fedmf_with_the_item_matrix_encrypted_on_the_server
ENCRYPTED = {"transport": "ckks", "aggregation": "sum", "server_state": "encrypted"}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return provision_keys(tmp_path_factory.mktemp("ckks-keys"), CKKSConfig())


def _app(example, keys, **fields):
    secret_path, public_path = keys
    values = {
        "seed": 0,
        "rounds": 2,
        "min_nodes": 3,
        "server_lr": 0.02,
        "ckks_secret_path": str(secret_path),
        "ckks_public_path": str(public_path),
    }
    return example.FedMFApp(**(values | ENCRYPTED | fields))


def _float_views(array: np.ndarray) -> list[np.ndarray]:
    """``array`` as floats; raw bytes (ciphertexts) read as float64 at every alignment."""
    array = np.asarray(array)
    if array.dtype.kind == "f":
        return [array.astype(np.float64).ravel()]
    if array.dtype == np.uint8:
        data = array.tobytes()
        return [np.frombuffer(data[k : k + (len(data) - k) // 8 * 8], np.float64) for k in range(8)]
    return []


def _holds_rows_of(array: np.ndarray, V: np.ndarray, atol: float = 1e-3) -> bool:
    """Whether ``array`` (any layout) holds, contiguously, a row of ``V`` within ``atol``."""
    dim = V.shape[1]
    for values in _float_views(array):
        if len(values) < dim:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(values, dim)
        with np.errstate(invalid="ignore", over="ignore"):
            for row in V:
                if np.any(np.all(np.abs(windows - row) < atol, axis=1)):
                    return True
    return False


# ----------------------------------------------------------------------------- the pieces
def test_a_server_with_the_public_context_folds_a_node_encrypted_state(keys):
    """The shared code path without an engine: a node encrypts [[V0]], the server (public
    context only) keeps it, folds a round of node-encrypted steps, sends it as arrays, a node
    decrypts V0 + sum; the server cannot reveal it."""
    secret_path, public_path = keys
    node = NodeKeys.from_paths(secret_path, public_path)
    server = CKKSTransport(CKKSConfig(), public=load_public_context(public_path))
    rng = np.random.default_rng(0)
    V0, steps = rng.normal(0, 0.3, (30, 5)), rng.normal(0, 0.01, (3, 30, 5))
    sent = node.encrypt_state(V0)
    [ciphertexts] = arrays_to_ciphertexts(sent)
    state = server.encrypted_state_from(ciphertexts, tuple(sent["shape"]))
    assert server.capabilities.encrypted_state and not state.can_reveal
    rnd = server.open_round(0, range(3), shape=(30, 5), seeds=SeedTree(0))
    assert len(state.send(rnd)) == len(ciphertexts)
    secret = load_secret_context(secret_path)
    for client in range(3):
        rnd.receive_ciphertexts(client, secret.encrypt(steps[client].ravel()), weighted=False)
    rnd.fold_into(state)
    with pytest.raises(AggregationError, match="holds only the public context"):
        state.reveal()
    arrays = state.to_arrays("V")
    np.testing.assert_allclose(
        node.open_broadcast(arrays)["V"], V0 + steps.sum(0), rtol=0, atol=TOLERANCE
    )
    np.testing.assert_allclose(
        state_from_arrays(arrays, "V", secret), V0 + steps.sum(0), atol=TOLERANCE
    )
    assert not any(
        _holds_rows_of(a, V0) or _holds_rows_of(a, V0 + steps.sum(0)) for a in arrays.values()
    )
    # A node without the secret key can neither encrypt the state nor open it.
    public_only = NodeKeys(public=load_public_context(public_path))
    with pytest.raises(ContextMismatchError, match="shared secret key on every node"):
        public_only.open_broadcast(arrays)
    with pytest.raises(ContextMismatchError, match="shared secret key on every node"):
        public_only.encrypt_state(V0)
    # Ciphertexts that do not pack the claimed shape are refused.
    with pytest.raises(ValueError, match="packs into"):
        server.encrypted_state_from(ciphertexts + ciphertexts, (30, 5))


def test_the_fedmf_server_forgets_v_and_broadcasts_only_ciphertexts(example, keys):
    """The server's FedMF holds [[V]] once given it: V is NaN, the broadcast and the state dict
    hold no row of the initial V, and the round's view shows ciphertext digests only."""
    app = _app(example, keys)
    setup = example.server_setup(app)
    model, transport = setup.algorithm, setup.transport
    V0 = model.V.copy()  # the server's own draw from the public seed: the nodes draw the same
    node = NodeKeys.from_paths(*keys)
    [ciphertexts] = arrays_to_ciphertexts(sent := node.encrypt_state(V0))
    model.load_encrypted_state(transport.encrypted_state_from(ciphertexts, tuple(sent["shape"])))
    rnd, _ = model.open_round(0, np.arange(model.n_clients), transport, setup.seeds)
    shared = model.broadcast_state()
    assert "V" not in shared and "V.ct_bytes" in shared
    found = [k for k, a in (shared | model.state_dict()).items() if _holds_rows_of(a, V0)]
    assert found == [] and np.isnan(model.V).all()
    np.testing.assert_allclose(node.open_broadcast(shared)["V"], V0, atol=TOLERANCE)
    assert rnd.view.bytes_down.sum() > 0


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"aggregation": "mean"}, "server_state='encrypted' needs aggregation='sum'"),
        ({"aggregation": "fixed"}, "server_state='encrypted' needs aggregation='sum'"),
    ],
)
def test_the_in_process_config_refusals_stay(example, keys, fields, match):
    with pytest.raises(ValueError, match=match):
        _app(example, keys, **fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"transport": "plaintext"},
        {"transport": "secagg"},
        {"ckks_key_model": "committee"},
        {"transport": "ckks+dp", "dp_mechanism": "gaussian"},
    ],
)
def test_the_server_refuses_transports_without_an_encrypted_state(example, keys, fields):
    """As in one process (``require_capabilities``), before any node is asked."""
    if fields.get("ckks_key_model") == "committee":
        secret_path, public_path = provision_keys(
            keys[0].parent / "committee", CKKSConfig(key_model="committee")
        )
        fields |= {"ckks_secret_path": str(secret_path), "ckks_public_path": str(public_path)}
    setup = example.server_setup(_app(example, keys, **fields))
    with pytest.raises(UnsupportedTransport, match="server_state='encrypted'"):
        _Run(None, setup)


def test_checkpoints_with_an_encrypted_state_are_refused_by_name(example, keys, tmp_path):
    setup = example.server_setup(_app(example, keys, checkpoint_dir=str(tmp_path / "ck")))
    with pytest.raises(CheckpointError, match="server_state='encrypted' with a checkpoint"):
        _Run(None, setup)._checkpoints()
    assert not (tmp_path / "ck").exists()


# ----------------------------------------------------------------------------- the engine
def _holds_secret_key(root) -> list[str]:
    import tenseal as ts

    from securefed.crypto.ckks import SecretContext
    from securefed.transport.ckks import KeyHolder

    seen, found, stack = set(), [], [("root", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (SecretContext, KeyHolder)) or (
            isinstance(obj, ts.Context) and obj.has_secret_key()
        ):
            found.append(path)
        elif isinstance(obj, dict):
            stack.extend((f"{path}[{k!r}]", v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("securefed", "tenseal")):
            stack.extend((f"{path}.{k}", v) for k, v in vars(obj).items())
    return found


@pytest.mark.slow  # 70 s on 2 cores (Ray and CKKS); the unit tests above cover the server side
def test_encrypted_state_over_flower_equals_in_process_and_the_server_never_holds_v(
    example, keys, tmp_path, monkeypatch
):
    """One simulation-engine run (3 nodes, 120 users, 2 rounds): the model equals the
    in-process ``server_state="encrypted"`` run within CKKS error, and the ServerApp's state and
    every message it sent hold ciphertexts, never ``V``."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from flwr.app import ArrayRecord

    from securefed.flower import server as server_module
    from securefed.flower.simulation import run_in_simulation

    sent, types = [], set()  # every array and type of every message the ServerApp sends
    exchange = server_module._Messenger.exchange

    def tap(self, message_type, contents, round_id):
        types.add(message_type)
        for body in contents.values():
            for record in body.values():
                if isinstance(record, ArrayRecord):
                    sent.extend((message_type, k, a.numpy()) for k, a in record.items())
        return exchange(self, message_type, contents, round_id)

    monkeypatch.setattr(server_module._Messenger, "exchange", tap)
    app = _app(example, keys, output_dir=str(tmp_path))
    outcome = run_in_simulation(example.build_apps(app), 3, SIMULATION_BACKEND)
    model, _, history = example.in_process(app)
    V0 = example.FedMF(example.load_split(app).train, app.fedmf_config(), SeedTree(0)).V

    # (1) the same model as in one process, within the in-process CKKS tolerance.
    state = outcome.model.encrypted_state
    V = state_from_arrays(state.to_arrays("V"), "V", load_secret_context(keys[0]))
    np.testing.assert_allclose(V, model.V, rtol=0, atol=TOLERANCE)
    U = np.full(model.U.shape, np.nan)
    for partition in range(3):
        saved = np.load(tmp_path / f"node-{partition}.npz")
        U[saved["users"]] = saved["U"]
    np.testing.assert_allclose(U, model.U, rtol=0, atol=TOLERANCE)
    flower = [r["train_rmse"] for r in outcome.result.rounds]
    np.testing.assert_allclose(flower, [r["train_rmse"] for r in history], rtol=1e-6)
    assert flower[-1] < flower[0]
    split = example.load_split(app)
    errors = model.predict(split.test.users, split.test.items) - split.test.ratings
    rmse = float(np.sqrt(np.mean(errors**2)))
    assert outcome.result.evaluations[-1]["rmse"] == pytest.approx(rmse, abs=1e-4)

    # (2) no secret key and no plaintext V at the server: its state, its view, its messages.
    server = outcome.transport
    assert server.key_holder is None and _holds_secret_key(outcome) == []
    assert state.updates == app.rounds and not state.can_reveal
    held = outcome.model.state_dict() | outcome.model.broadcast_state()
    leaks = [k for k, a in held.items() if _holds_rows_of(a, model.V) or _holds_rows_of(a, V0)]
    leaks += [(t, k) for t, k, a in sent if _holds_rows_of(a, model.V) or _holds_rows_of(a, V0)]
    assert leaks == []
    assert "query.ckks_encrypt_state" in types and "query.ckks_decrypt" not in types
    assert any(k == "broadcast.V.ct_bytes" for t, k, _ in sent if t == "train.ckks")
    assert not any(k == "broadcast.V" for _, k, _ in sent)
    for view in server.view.rounds:
        assert view.public["ckks_folded_into_state"] and view.bytes_down.sum() > 0
    assert not (tmp_path / "server.npz").exists()
