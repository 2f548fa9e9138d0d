"""FedMF's ``server_state="encrypted"`` on Flower: the ServerApp keeps ``[[V]]`` only (issue 33).

Chai et al. (2020, Sec. 3.2): the server never holds the item matrix ``V`` in the clear. On
Flower a key-holder node encrypts the initial ``V`` (``query.ckks_encrypt_state``), the server
folds the nodes' encrypted ``[[-eta g]]`` sums into ``[[V]]`` homomorphically and sends ``[[V]]``
to the nodes, which decrypt it with the users' shared secret key. Checked here:

* the same seed gives the same model on the simulation engine as in one process with
  ``server_state="encrypted"``, within the tolerance of the in-process CKKS test (1e-4);
* the ServerApp holds no secret key, and neither its state nor any message it sends holds an
  array close to ``V`` (the initial one or the trained one);
* the refusals of one process stay, by name;
* checkpoints carry ``[[V]]`` (ciphertexts under the public context): a ServerApp that crashes
  after a round resumes from the very ciphertexts it held (bit for bit) to the uninterrupted
  run's model within CKKS error; the checkpoint holds no secret key and nothing that decrypts
  ``[[V]]``; a damaged ``[[V]]``, one under other keys and one of another run are refused by name
  before any node is asked (on the in-process grid of ``tests/test_claims_flower.py``).
"""

from __future__ import annotations

import contextlib
import json
import shutil

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_claims_flower import DirectGrid

from securefed import SeedTree
from securefed.crypto.ckks import ContextMismatchError, load_public_context, load_secret_context
from securefed.errors import AggregationError, CheckpointError, UnsupportedTransport
from securefed.flower import make_client_app
from securefed.flower import records as rec
from securefed.flower.ckks import NodeKeys, arrays_to_ciphertexts, provision_keys
from securefed.flower.client import NODE_STATE
from securefed.flower.journal import STATE_DIR_KEY
from securefed.flower.server import CKKS_ENCRYPT_STATE, _Run, run_federation
from securefed.flower.state_checkpoint import PREFIX
from securefed.integrity import write_sealed_json
from securefed.runtime import Checkpoints
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


# ----------------------------------------------------------------------------- checkpoints
# A ServerApp that dies after round 0 (its checkpoint written) and one started again with the same
# run config and directory, on the in-process grid (Flower's messages and records, the real
# ClientApps, no Ray); the nodes journal their users' vectors in a state dir, as in
# tests/test_flower_resume.py. CKKS encryption noise is fresh on every node (TenSEAL's own
# randomness), so two runs agree within CKKS error, not bit for bit.
N_NODES = 3
ROUNDS = 3


class Crash(Exception):
    """The ServerApp dying after a round (its checkpoint written)."""


@pytest.fixture(scope="module")
def _identity():
    """The identity Flower's runtime gives a ServerApp process (``task_identity``, module-wide)."""
    from flwr.supercore.task_identity import TaskIdentity

    with pytest.MonkeyPatch.context() as patch:
        for name in ("_run_id", "_task_id", "_node_id"):
            patch.setattr(TaskIdentity, name, 1)
        yield


def _ckpt_app(example, keys, directory, **fields):
    values = {"rounds": ROUNDS, "timeout": 30.0, "checkpoint_dir": str(directory)}
    values["synthetic_users"] = 30  # 10 per node: the cost is one encryption per user and round
    return _app(example, keys, **(values | fields))


def _direct(example, app, state_dir, *, crash_after=None):
    """One run (a fresh server and fresh node Contexts); the nodes journal in ``state_dir``."""
    setup = example.server_setup(app)
    if crash_after is not None:

        def on_round(round_id, metrics):
            if round_id == crash_after:
                raise Crash(round_id)

        setup.on_round = on_round
    client = make_client_app(lambda context: example.client_setup(app, context))
    grid = DirectGrid(client, N_NODES)
    for context in grid.contexts.values():
        context.node_config[STATE_DIR_KEY] = str(state_dir)
    setup.result = None
    with contextlib.suppress(Crash):
        setup.result = run_federation(grid, setup)
    return setup, grid


def _decrypted(setup, keys) -> np.ndarray:
    state = setup.algorithm.encrypted_state
    return state_from_arrays(state.to_arrays("V"), "V", load_secret_context(keys[0]))


def _node_vectors(grid, shape) -> np.ndarray:
    U = np.full(shape, np.nan)
    for node, context in grid.contexts.items():
        users = np.array_split(np.arange(shape[0]), N_NODES)[node - 100]
        U[users] = rec.record_arrays(context.state[NODE_STATE])["U"]
    return U


@pytest.fixture(scope="module")
def runs(example, keys, tmp_path_factory, _identity):
    """The uninterrupted run, a run cut after round 0 (its checkpoint kept aside, and the
    ciphertexts its server held), a twin cut run of the same configuration, and the resumed run."""
    root = tmp_path_factory.mktemp("encrypted-checkpoints")
    whole, whole_grid = _direct(example, _ckpt_app(example, keys, root / "whole"), root / "wn")
    app = _ckpt_app(example, keys, root / "cut")
    crashed, _ = _direct(example, app, root / "nodes", crash_after=0)
    shutil.copytree(root / "cut", root / "cut-at-1")  # what the crash left, for the refusals
    _direct(example, _ckpt_app(example, keys, root / "twin"), root / "tn", crash_after=0)
    resumed, grid = _direct(example, app, root / "nodes")
    return {
        "root": root,
        "app": app,
        "whole": whole,
        "whole_grid": whole_grid,
        "crashed": crashed,
        "crashed_bytes": [c.data for c in crashed.algorithm.encrypted_state.ciphertexts()],
        "twin": root / "twin",
        "resumed": resumed,
        "grid": grid,
    }


def _cut_copy(runs, name) -> str:
    """A fresh copy of the checkpoint the crash after round 0 left."""
    target = runs["root"] / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(runs["root"] / "cut-at-1", target)
    return str(target)


def test_a_resumed_encrypted_state_run_equals_the_uninterrupted_run(example, keys, runs):
    """Cut after round 0 and resumed: the restored [[V]] is, bit for bit, the ciphertexts the
    crashed server held; the resumed run asks no node to encrypt a state again and ends with the
    uninterrupted run's model (V decrypted with the test's key, every user vector, the per-round
    RMSE, the held-out RMSE) within CKKS error."""
    restored = example.server_setup(_ckpt_app(example, keys, _cut_copy(runs, "restore-only")))
    run = _Run(None, restored)
    run._checkpoints()
    assert run.resumed_from == 1
    state = restored.algorithm.encrypted_state
    assert [c.data for c in state.ciphertexts()] == runs["crashed_bytes"]  # bit for bit
    assert state.updates == 1 and not state.can_reveal and np.isnan(restored.algorithm.V).all()

    whole, resumed, grid = runs["whole"], runs["resumed"], runs["grid"]
    V, reference = _decrypted(resumed, keys), _decrypted(whole, keys)
    np.testing.assert_allclose(V, reference, rtol=0, atol=TOLERANCE)
    shape = whole.algorithm.U.shape
    np.testing.assert_allclose(
        _node_vectors(grid, shape), _node_vectors(runs["whole_grid"], shape), rtol=0, atol=TOLERANCE
    )
    rmse = [[r["train_rmse"] for r in s.result.rounds] for s in (resumed, whole)]
    np.testing.assert_allclose(*rmse, rtol=1e-6)
    held_out = [s.result.evaluations[-1]["rmse"] for s in (resumed, whole)]
    assert held_out[0] == pytest.approx(held_out[1], abs=1e-4)
    assert resumed.algorithm.encrypted_state.updates == ROUNDS
    assert resumed.transport.privacy_ledgers() == ()  # ckks+dp is refused with [[V]]: no ledger
    kinds = [(kind, rec.message_config(m)) for kind, _, m, _ in grid.log]
    assert CKKS_ENCRYPT_STATE not in {kind for kind, _ in kinds}
    assert {int(c["round"]) for kind, c in kinds if kind != "evaluate"} == {1, 2}
    assert {int(c["resumed_from"]) for _, c in kinds} == {1}
    assert [r.round_id for r in resumed.transport.view.rounds] == [0, 1, 2]


def _secret_windows(secret_path, width=32) -> set[bytes]:
    """The secret context's TenSEAL serialization (the secret key: 8192 x 3 x 8 bytes and a
    header) cut into ``width``-byte windows."""
    from securefed.crypto.ckks import SECRET_FILE_MAGIC, _read_key_file

    _, payload = _read_key_file(secret_path, SECRET_FILE_MAGIC)
    return {payload[i : i + width] for i in range(0, len(payload) - width + 1, width)}


def _holds_any(data: bytes, windows: set[bytes], width=32) -> bool:
    return any(data[i : i + width] in windows for i in range(len(data) - width + 1))


def test_the_checkpoint_holds_no_secret_key_and_does_not_decrypt(example, keys, runs):
    """Every byte of the checkpoint directory (and every array of its state file) is searched,
    at every offset, for any 32-byte window of the secret-key serialization: none (the same
    search finds it in the key file). Loaded with what the server has (the public context),
    [[V]] cannot be revealed, and TenSEAL itself refuses to decrypt its ciphertexts."""
    import tenseal as ts

    from securefed.crypto.ckks import PUBLIC_FILE_MAGIC, _read_key_file

    windows = _secret_windows(keys[0])
    directory = runs["root"] / "cut-at-1"
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"checkpoint.json", "state.npz"}
    blobs = [p.read_bytes() for p in files]
    with np.load(directory / "latest" / "state.npz") as saved:
        assert f"{PREFIX}ct_bytes" in saved.files
        blobs += [saved[name].tobytes() for name in saved.files]
    assert not any(_holds_any(blob, windows) for blob in blobs)
    assert _holds_any(keys[0].read_bytes(), windows)  # the search does find the key
    text = (directory / "latest" / "checkpoint.json").read_text()
    assert "secret" not in text.lower()

    setup = example.server_setup(_ckpt_app(example, keys, _cut_copy(runs, "public-only")))
    _Run(None, setup)._checkpoints()
    assert setup.transport.key_holder is None and _holds_secret_key(setup) == []
    state = setup.algorithm.encrypted_state
    with pytest.raises(AggregationError, match="holds only the public context"):
        state.reveal()
    _, public = _read_key_file(keys[1], PUBLIC_FILE_MAGIC)
    context = ts.context_from(public)
    assert not context.has_secret_key()
    vector = ts.ckks_vector_from(context, state.ciphertexts()[0].data)
    with pytest.raises(ValueError, match="doesn't hold a secret_key"):
        vector.decrypt()


def _reseal(directory) -> None:
    """Write checkpoint.json's digest again over the files as they now are (what an unkeyed
    checkpoint's writer, or anyone with the disk, can do)."""
    path = directory / "latest" / "checkpoint.json"
    meta = json.loads(path.read_text())
    write_sealed_json(path, meta, Checkpoints(directory)._digest_files())


def _edit_state(directory, edit) -> None:
    path = directory / "latest" / "state.npz"
    with np.load(path) as saved:
        arrays = {name: saved[name] for name in saved.files}
    edit(arrays)
    np.savez(path, **arrays)


def _flip_coefficient(arrays) -> None:
    data = arrays[f"{PREFIX}ct_bytes"].copy()
    offsets = arrays[f"{PREFIX}ct_offsets"]
    data[(offsets[0] + offsets[1]) // 2] ^= 0x10  # in the coefficients: it still parses
    arrays[f"{PREFIX}ct_bytes"] = data


def _truncate_last(arrays, *, digest: bool) -> None:
    """Cut the last ciphertext in half, the offsets made to fit (and its digest, if ``digest``)."""
    import hashlib

    offsets = arrays[f"{PREFIX}ct_offsets"].copy()
    cut = int(offsets[-1] - offsets[-2]) // 2
    data = arrays[f"{PREFIX}ct_bytes"][: len(arrays[f"{PREFIX}ct_bytes"]) - cut]
    offsets[-1] -= cut
    arrays[f"{PREFIX}ct_bytes"], arrays[f"{PREFIX}ct_offsets"] = data, offsets
    if digest:
        digests = arrays[f"{PREFIX}ct_sha256"].copy()
        last = data[int(offsets[-2]) :].tobytes()
        digests[-1] = np.frombuffer(hashlib.sha256(last).digest(), np.uint8)
        arrays[f"{PREFIX}ct_sha256"] = digests


def _drop_bytes_tail(arrays) -> None:
    arrays[f"{PREFIX}ct_bytes"] = arrays[f"{PREFIX}ct_bytes"][:-1000]  # offsets left as they were


def _drop_encrypted_state(arrays) -> None:
    for name in [n for n in arrays if n.startswith(PREFIX)]:
        del arrays[name]


DAMAGE = {
    # a flipped bit in [[V]]'s coefficients: the file digest refuses it ...
    "flipped": (_flip_coefficient, False, r"state\.npz: digest mismatch"),
    # ... and with the file digest written again around it, [[V]]'s own digests do
    "flipped, file digest rewritten": (
        _flip_coefficient,
        True,
        r"\[\[V\]\]: ciphertext 0 is corrupt",
    ),
    "truncated": (lambda a: _truncate_last(a, digest=False), False, r"state\.npz: digest mismatch"),
    "truncated, digests rewritten": (
        lambda a: _truncate_last(a, digest=True),
        True,
        r"\[\[V\]\] does not parse under the run's public context",
    ),
    "bytes cut, offsets kept": (_drop_bytes_tail, True, r"\[\[V\]\] is malformed or truncated"),
    "no [[V]]": (_drop_encrypted_state, True, r"holds no complete encrypted state \[\[V\]\]"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_encrypted_state_in_the_checkpoint_is_refused_by_name(
    example, keys, runs, damage
):
    """Before any node is asked (``_Run(None, ...)``: no grid to ask)."""
    edit, reseal, match = DAMAGE[damage]
    directory = runs["root"] / "damaged"
    _cut_copy(runs, "damaged")
    _edit_state(directory, edit)
    if reseal:
        _reseal(directory)
    setup = example.server_setup(_ckpt_app(example, keys, directory))
    with pytest.raises(CheckpointError, match=match):
        _Run(None, setup)._checkpoints()
    assert setup.algorithm.encrypted_state is None


def test_a_checkpoint_under_other_keys_is_refused_by_name(example, keys, runs, tmp_path):
    """The fingerprint leaves the key paths out: a run given other CKKS keys (another
    provisioning) would otherwise resume from ciphertexts its nodes cannot decrypt."""
    other = provision_keys(tmp_path / "other-keys", CKKSConfig())
    app = _ckpt_app(
        example,
        keys,
        _cut_copy(runs, "other-keys"),
        ckks_secret_path=str(other[0]),
        ckks_public_path=str(other[1]),
    )
    setup = example.server_setup(app)
    with pytest.raises(CheckpointError, match=r"\[\[V\]\] is under another CKKS context"):
        _Run(None, setup)._checkpoints()


def test_a_checkpoint_or_an_encrypted_state_of_another_run_is_refused_by_name(example, keys, runs):
    """A twin run (same configuration and seed, cut after the same round): its [[V]] grafted
    into this run's checkpoint (the file digest written again) is refused by its binding; a
    checkpoint of another configuration is refused by the fingerprint, as for every run."""
    directory = runs["root"] / "grafted"
    _cut_copy(runs, "grafted")
    with np.load(runs["twin"] / "latest" / "state.npz") as twin:
        grafted = {name: twin[name] for name in twin.files if name.startswith(PREFIX)}
    _edit_state(directory, lambda arrays: arrays.update(grafted))
    _reseal(directory)
    setup = example.server_setup(_ckpt_app(example, keys, directory))
    with pytest.raises(CheckpointError, match=r"\[\[V\]\] belongs to another run"):
        _Run(None, setup)._checkpoints()
    setup = example.server_setup(_ckpt_app(example, keys, _cut_copy(runs, "other-config"), lr=0.2))
    with pytest.raises(CheckpointError, match=r"differs in \['lr'\]"):
        _Run(None, setup)._checkpoints()


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


def test_a_secure_mode_encrypted_state_run_resumes_under_its_checkpoint_key(
    example, keys, tmp_path, _identity
):
    """Unseeded (secure mode) with a checkpoint key: [[V]] sits in the sealed state file
    (AES-256-GCM), the run resumes from it, and another checkpoint key is refused."""
    import os

    key = tmp_path / "checkpoint.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    app = _ckpt_app(example, keys, tmp_path / "ck", seed=-1, rounds=2, checkpoint_key_file=str(key))
    crashed, _ = _direct(example, app, tmp_path / "nodes", crash_after=0)
    latest = tmp_path / "ck" / "latest"
    assert (latest / "state.npz.sealed").is_file() and not (latest / "state.npz").exists()
    windows = _secret_windows(keys[0])
    assert not any(_holds_any(p.read_bytes(), windows) for p in latest.rglob("*") if p.is_file())
    held = [c.data for c in crashed.algorithm.encrypted_state.ciphertexts()]
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    setup = example.server_setup(
        _ckpt_app(example, keys, tmp_path / "ck", seed=-1, rounds=2, checkpoint_key_file=str(other))
    )
    with pytest.raises(CheckpointError):
        _Run(None, setup)._checkpoints()
    setup = example.server_setup(app)
    run = _Run(None, setup)
    run._checkpoints()
    assert [c.data for c in setup.algorithm.encrypted_state.ciphertexts()] == held
    resumed, grid = _direct(example, app, tmp_path / "nodes")
    assert resumed.result.resumed_from == 1 and resumed.algorithm.encrypted_state.updates == 2
    assert CKKS_ENCRYPT_STATE not in {kind for kind, _, _, _ in grid.log}
