"""Tests of the CKKS contexts and the CKKS aggregation transport (TenSEAL, real encryption)."""

from __future__ import annotations

import numpy as np
import pytest

ts = pytest.importorskip("tenseal")

from securefed import (  # noqa: E402
    ALL_PAYLOADS,
    AggregationError,
    InsecureParameterError,
    PlaintextTransport,
    RowUpdates,
    SeedTree,
)
from securefed.crypto.ckks import (  # noqa: E402
    MAX_COEFF_BITS,
    AggregationCircuit,
    CKKSParameters,
    ContextMismatchError,
    Flooding,
    FusionCircuit,
    PublicContext,
    SecretContext,
    check_security,
    chunk_count,
    ckks_context,
    load_public_context,
    parameters_for,
    save_public_context,
)
from securefed.transport.ckks import (  # noqa: E402
    AggregatingServer,
    CKKSConfig,
    CKKSTransport,
    pack_update,
)


@pytest.fixture(scope="module")
def shared_keys() -> SecretContext:
    """One shared-key (symmetric) context for the module: key generation is the slow part."""
    return CKKSConfig().make_keys()


def _transport(keys, **config) -> CKKSTransport:
    keep = config.pop("keep", ALL_PAYLOADS)
    return CKKSTransport(CKKSConfig(**config), secret=keys, keep_payloads=keep)


def _relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


# ----------------------------------------------------------------------------- parameters
def test_security_table_is_the_he_standard():
    assert MAX_COEFF_BITS == {4096: 109, 8192: 218, 16384: 438, 32768: 881}
    check_security(8192, [60, 40, 40, 60])  # 200 bits: fine
    check_security(16384, [60] + [40] * 7 + [60])  # 400 bits


@pytest.mark.parametrize(
    ("degree", "chain", "numbers"),
    [
        (8192, [60, 40, 40, 40, 60], ("240", "218", "8192")),
        (4096, [40, 30, 40], ("110", "109", "4096")),
        (16384, [60] + [40] * 9 + [60], ("480", "438")),
        (2048, [27, 27], ("2048",)),
    ],
)
def test_insecure_parameters_are_refused_naming_the_numbers(degree, chain, numbers):
    with pytest.raises(InsecureParameterError) as error:
        ckks_context(poly_modulus_degree=degree, coeff_mod_bit_sizes=chain)
    for number in numbers:
        assert number in str(error.value)


@pytest.mark.parametrize(
    ("chain", "scale", "match"),
    [
        ([60], 40, "special prime"),
        ([60, 30, 40, 60], 40, "rescaling primes"),
        ([60, 40, 40], 40, None),  # special prime 40 < 60: refused
        ([40, 60], 40, "first prime"),
        ([61, 61], 40, "60"),
    ],
)
def test_malformed_chains_are_refused(chain, scale, match):
    with pytest.raises(ValueError, match=match):
        CKKSParameters(8192, tuple(chain), scale)


def test_parameters_are_picked_for_the_circuit():
    aggregation = parameters_for("aggregation")
    assert (aggregation.poly_modulus_degree, aggregation.coeff_mod_bit_sizes) == (
        8192,
        (60, 60, 60),
    )
    assert aggregation.scale_bits == 50 and aggregation.levels == 0  # two data primes, no rescale
    assert aggregation.slots == 4096
    # The data primes hold |sum| x scale: 2^68 against the 2^26 (+2 bits) the defaults need.
    assert aggregation.max_abs_value() == 2.0**68
    assert AggregationCircuit().headroom_bits == 28
    fused = parameters_for(FusionCircuit(2, 2))
    assert fused.poly_modulus_degree == 8192 and fused.levels == 3
    assert fused.total_bits <= 218
    deeper = parameters_for(FusionCircuit(2, 3))
    assert deeper.poly_modulus_degree == 16384 and deeper.levels == 4
    with pytest.raises(ValueError, match="level"):
        parameters_for(FusionCircuit(2, 2), coeff_mod_bit_sizes=[60, 40, 60])
    with pytest.raises(ValueError, match="clients"):
        parameters_for(AggregationCircuit(2**20, 2.0**50), scale_bits=50)
    assert chunk_count(35_364, 4095) == 9  # a FedMF ML-100K block at degree 8192


def test_a_large_fusion_scale_keeps_room_at_the_deepest_level(tmp_path):
    """Above 40 bits the scale leaves q_0 alone too little room for the masked exchange's
    values and masks: one more prime of the scale's size stays below the deepest level."""
    circuit = FusionCircuit(depth=2, activation_degree=1, training=False)  # 2 levels
    default = parameters_for(circuit)
    assert default.coeff_mod_bit_sizes == (60, 40, 40, 60) and default.data_primes == 1
    assert default.mask_bits == 16  # 2^(60 - 40 - 2) at the deepest level, two bits below
    # A given scale picks the smallest degree that holds the chain (not the first one tried).
    assert parameters_for(circuit, scale_bits=40) == default
    fine = parameters_for(circuit, scale_bits=55)
    assert fine.poly_modulus_degree == 16384
    assert fine.coeff_mod_bit_sizes == (60, 55, 55, 55, 60)
    assert (fine.levels, fine.data_primes) == (2, 2)
    assert fine.max_abs_value(fine.levels) == 2.0 ** (60 + 55 - 55 - 2)
    # Without the spare prime the deepest level would hold 2^3; the masks stay at 2^16,
    # as large as double-precision decoding of value + mask allows.
    assert fine.mask_bits == 16
    assert fine.public()["data_primes"] == 2
    # The key files carry it (a context read back has the same levels).
    secret = ckks_context(circuit, scale_bits=55)
    path = save_public_context(secret, tmp_path / "fine.public")
    assert load_public_context(path).params == fine
    for bad in (0, 5, True):
        with pytest.raises(ValueError, match="data_primes"):
            CKKSParameters(16384, (60, 55, 55, 55, 60), 55, data_primes=bad)
    with pytest.raises(ValueError, match="rescaling chains only"):
        CKKSParameters(8192, (60, 60, 60), 50, rescaling=False, data_primes=2)


# ----------------------------------------------------------------------------- contexts
def test_public_context_cannot_decrypt(shared_keys):
    public = shared_keys.public()
    assert isinstance(public, PublicContext) and not isinstance(public, SecretContext)
    assert not public.tenseal.has_secret_key() and not public.tenseal.is_private()
    assert not hasattr(public, "decrypt")
    [ciphertext] = shared_keys.encrypt(np.array([1.5, -2.0, 3.25]))
    vector = public.load(ciphertext)
    with pytest.raises(ValueError, match="secret"):  # TenSEAL itself refuses
        vector.decrypt()
    # Its serialization never held one either, and it cannot be built from one that does.
    assert not ts.context_from(public.serialized).has_secret_key()
    with_secret = shared_keys.tenseal.serialize(save_public_key=False, save_secret_key=True)
    with pytest.raises(InsecureParameterError, match="secret key"):
        PublicContext(with_secret, key_id=shared_keys.key_id, params=shared_keys.params)
    # Symmetric keys: the server's context holds no key at all and cannot encrypt either.
    assert public.nbytes < 1000 and not public.can_encrypt
    with pytest.raises(ValueError, match="key holders"):
        public.encrypt(np.ones(3))
    np.testing.assert_allclose(shared_keys.decrypt(ciphertext), [1.5, -2.0, 3.25], atol=1e-5)


def test_ciphertexts_of_another_context_are_refused(shared_keys):
    other = ckks_context("aggregation", encryption="symmetric")
    [theirs] = other.encrypt(np.ones(4))
    with pytest.raises(ContextMismatchError, match=r"another|other|key"):
        shared_keys.decrypt(theirs)
    with pytest.raises(ContextMismatchError):
        shared_keys.public().load(theirs)
    server = AggregatingServer(shared_keys.public(), 1)
    with pytest.raises(ContextMismatchError):
        server.receive([theirs])
    # Same key id but bytes of other parameters (forged envelope): refused, not garbage.
    deep = ckks_context(FusionCircuit(1, 2))
    [foreign] = deep.encrypt(np.ones(2))
    forged = type(foreign)(shared_keys.key_id, foreign.data, 2)
    with pytest.raises(ContextMismatchError, match="parse"):
        shared_keys.decrypt(forged)
    with pytest.raises(ValueError, match=r"2 ciphertexts|ciphertexts"):
        AggregatingServer(shared_keys.public(), 2).receive(shared_keys.encrypt(np.ones(3)))


def test_encryption_fills_slots_and_round_trips(shared_keys):
    # Every slot but the last, which holds the check value (0) that authenticates the key.
    assert shared_keys.data_slots == shared_keys.public().data_slots == 4095
    values = np.random.default_rng(0).normal(size=4095 * 2 + 5)
    ciphertexts = shared_keys.encrypt(values)
    assert [c.length for c in ciphertexts] == [4095, 4095, 5]
    np.testing.assert_allclose(shared_keys.decrypt(ciphertexts), values, atol=1e-4)
    with pytest.raises(ValueError, match=r"NaN|nan"):
        shared_keys.encrypt(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="1-D"):
        shared_keys.encrypt(np.ones((2, 2)))


def test_flooding_rounds_and_adds_noise():
    rng = np.random.default_rng(0)
    exact = Flooding.unsafe_for_tests().apply(np.array([0.123456789]), rng, error_bound=1e-9)
    assert exact[0] == 0.123456789
    rounded = Flooding.unsafe_for_tests(0.0, 2.0**-4).apply(
        np.array([0.3, -0.3]), rng, error_bound=1e-9
    )
    np.testing.assert_array_equal(rounded, [0.3125, -0.3125])
    from securefed.privacy.noise import SeededGaussian

    noisy = Flooding(1e-3, 0.0).apply(np.zeros(20_000), SeededGaussian(rng), error_bound=1e-9)
    assert 0.9e-3 < noisy.std() < 1.1e-3
    # The floor: error x 2^((s - 1) / 2); None takes it, a smaller std is refused.
    floor = Flooding(security_bits=41).std_for(1e-9)
    assert floor == pytest.approx(1e-9 * 2.0**20)
    with pytest.raises(InsecureParameterError, match="below the floor"):
        Flooding(1e-4, security_bits=41).apply(np.zeros(3), rng, error_bound=1e-9)
    with pytest.raises(ValueError):
        Flooding(-1.0)


# ----------------------------------------------------------------------------- the transport
def test_sum_matches_plaintext(shared_keys):
    n, shape = 12, (300, 21)  # 6300 values: two ciphertexts per client
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (n, shape[0] * shape[1]))
    seeds = SeedTree(0)
    ours = _transport(shared_keys).open_round(0, range(n), shape=shape, seeds=seeds)
    plain = PlaintextTransport().open_round(0, range(n), shape=shape, seeds=seeds)
    for rnd in (ours, plain):
        for c in range(n):
            rnd.submit(c, x[c])
    aggregate, reference = ours.result(), plain.result()
    assert ours.n_ciphertexts == 2
    assert _relative_error(aggregate.total, reference.total) < 1e-4
    assert np.max(np.abs(aggregate.total - reference.total)) < ours.error_bound()
    assert aggregate.weight == n
    np.testing.assert_array_equal(aggregate.contributors, np.arange(n))
    # The server object of the round holds the public context only.
    assert isinstance(ours.server.context, PublicContext)


def test_weights_are_applied_client_side(shared_keys):
    n, d = 9, 7
    rng = np.random.default_rng(2)
    x, w = rng.uniform(-1, 1, (n, d)), rng.uniform(0, 2, n)
    rnd = _transport(shared_keys).open_round(0, range(n), shape=(1, d), seeds=SeedTree(0))
    for c in range(n):
        rnd.submit(c, x[c], weight=w[c])
    aggregate = rnd.result()
    expected = (w[:, None] * x).sum(0)
    assert _relative_error(aggregate.total.ravel(), expected) < 1e-4
    assert abs(aggregate.weight - w.sum()) < 1e-4
    np.testing.assert_allclose(pack_update(x[0], w[0]), np.append(w[0] * x[0], w[0]))
    # Mixed weighted and unweighted submissions are refused.
    rnd = _transport(shared_keys).open_round(1, range(2), shape=(1, d), seeds=SeedTree(0))
    rnd.submit(0, x[0], weight=1.0)
    with pytest.raises(ValueError, match="weight"):
        rnd.submit(1, x[1])


def test_dropped_clients_contribute_nothing(shared_keys):
    n, d = 8, 5
    x = np.random.default_rng(3).normal(size=(n, d))
    rnd = _transport(shared_keys).open_round(0, range(n), shape=(1, d), seeds=SeedTree(0))
    rnd.drop(2)
    rnd.drop(5)
    survivors = [c for c in range(n) if c not in (2, 5)]
    for c in survivors:
        rnd.submit(c, x[c])
    with pytest.raises(AggregationError, match="dropped"):
        rnd.submit(2, x[2])
    aggregate = rnd.result()
    expected = x[survivors].sum(0)
    assert _relative_error(aggregate.total.ravel(), expected) < 1e-4
    assert aggregate.weight == len(survivors)
    np.testing.assert_array_equal(aggregate.contributors, survivors)
    view = rnd.view
    assert view.bytes_up[2] == view.bytes_up[5] == 0
    with pytest.raises(KeyError):
        view.payload(2)
    assert rnd.decryptor == 0 and view.public["ckks_decryptor"] == 0


def test_a_round_nobody_submitted_to_is_empty(shared_keys):
    rnd = _transport(shared_keys).open_round(0, range(3), shape=(1, 2), seeds=SeedTree(0))
    for c in range(3):
        rnd.drop(c)
    aggregate = rnd.result()
    assert aggregate.weight == 0 and not aggregate.total.any()


def test_wrong_shapes_and_bounds_give_clear_errors(shared_keys):
    transport = _transport(shared_keys, value_bound=10.0, max_clients=4)
    rnd = transport.open_round(0, range(3), shape=(2, 3), seeds=SeedTree(0))
    with pytest.raises(ValueError, match=r"\(6,\)"):
        rnd.submit(0, np.ones(5))
    with pytest.raises(ValueError, match=r"client 1.*value_bound"):
        rnd.submit(1, np.full(6, 11.0))
    with pytest.raises(ValueError, match=r"NaN|nan"):
        rnd.submit(0, np.array([1, 2, 3, 4, 5, np.nan]))
    with pytest.raises(AggregationError, match="at most 4"):
        transport.open_round(1, range(5), shape=(2, 3), seeds=SeedTree(0))
    with pytest.raises(ValueError, match="key_model"):
        CKKSConfig(key_model="everyone")
    with pytest.raises(ValueError, match=r"symmetric|public-key"):
        CKKSTransport(CKKSConfig(key_model="committee"), secret=shared_keys)


def test_view_records_ciphertexts_and_bytes(shared_keys, tmp_path):
    n, shape = 4, (10, 3)
    transport = _transport(shared_keys, keep_ciphertext_bytes=True)
    rnd = transport.open_round(0, range(n), shape=shape, seeds=SeedTree(0))
    updates = RowUpdates(
        clients=np.arange(n),
        indptr=np.array([0, 1, 3, 3, 4]),
        rows=np.array([0, 1, 9, 2]),
        values=np.random.default_rng(4).normal(size=(4, 3)),
        n_rows=shape[0],
    )
    rnd.submit_batch(updates)  # sparse rows are densified: every client uploads one ciphertext
    aggregate = rnd.result()
    assert _relative_error(aggregate.total, updates.weighted_sum()) < 1e-4
    view = rnd.view
    for c in range(n):
        payload = view.payload(c)
        assert payload["ciphertext_sizes"].shape == (1,)
        assert payload["ciphertext_sha256"].shape == (1, 32)
        size = int(payload["ciphertext_sizes"].sum())
        assert payload["ciphertexts"].dtype == np.uint8 and payload["ciphertexts"].size == size
        extra = 0 if c != rnd.decryptor else 3 * 10 * 8  # the decrypted aggregate goes back up
        assert view.bytes_up[c] == size + extra
        # What the server kept is a ciphertext it can load but not read.
        vector = ts.ckks_vector_from(
            transport.server_context.tenseal, payload["ciphertexts"].tobytes()
        )
        with pytest.raises(ValueError):
            vector.decrypt()
    assert view.bytes_down[rnd.decryptor] > 0
    assert "summed_ciphertext_sha256" in view.aggregate
    assert transport.view.public["server_context_bytes"] == transport.server_context.nbytes
    assert transport.timings["encrypt"] > 0
    from securefed import ServerView

    loaded = ServerView.load(transport.view.save(tmp_path / "view"))
    np.testing.assert_array_equal(
        loaded.round(0).payload(1)["ciphertext_sha256"], view.payload(1)["ciphertext_sha256"]
    )


def test_committee_model_sends_the_public_context_once():
    transport = CKKSTransport(CKKSConfig(key_model="committee"), keep_payloads=ALL_PAYLOADS)
    public = transport.server_context
    assert public.can_encrypt and public.params.encryption == "public-key"
    x = np.random.default_rng(5).normal(size=(4, 6))
    for round_id in range(2):
        rnd = transport.open_round(round_id, range(4), shape=(2, 3), seeds=SeedTree(0))
        for c in range(4):
            rnd.submit(c, x[c])
        # Public-key encryption errs more than symmetric: a higher bound, a higher flooding floor.
        assert np.max(np.abs(rnd.result().total.ravel() - x.sum(0))) < rnd.error_bound() < 0.02
        expected = public.nbytes if round_id == 0 else 0
        np.testing.assert_array_equal(rnd.view.bytes_down, expected)
        assert rnd.decryptor is None


def test_registered_for_the_command_line():
    from securefed.transport import build_transport

    transport = build_transport("ckks", n_clients=943)
    assert isinstance(transport, CKKSTransport)
    assert transport.config.max_clients >= 943
    assert transport.view.public["ckks_poly_modulus_degree"] == 8192
    from securefed.audit.findings import check_ckks

    assert check_ckks(transport.view.public) == []  # the audit reads the same keys


def test_fedmf_trains_the_same_under_ckks(small_split):
    from securefed.bench.experiment import FedMFRun, run_fedmf
    from securefed.recsys.fedmf import FedMFConfig

    config = FedMFConfig(rounds=3, upload="full")
    records = {
        name: run_fedmf(
            small_split, FedMFRun(config=config, transport=name, seed=0, progress=False)
        )[0]
        for name in ("plaintext", "ckks")
    }
    assert abs(records["ckks"]["rmse"] - records["plaintext"]["rmse"]) < 1e-3
    # 82 x 21 = 1722 values: one ciphertext of 262 KB (two data primes) per client and round.
    assert 200_000 < records["ckks"]["bytes_up_per_client"] < 300_000


def test_encrypted_state_is_updated_without_decryption(shared_keys):
    """Chai et al.'s variant: [[V]] stays at the server, clients upload [[-eta g]]."""
    from securefed.transport.ckks import EncryptedState

    transport = _transport(shared_keys)
    rng = np.random.default_rng(6)
    shape, n, eta = (200, 21), 5, 0.1  # 4200 values: two ciphertexts
    v = rng.normal(size=shape)
    state = EncryptedState(transport, v)
    for round_id in range(3):
        rnd = transport.open_round(round_id, range(n), shape=shape, seeds=SeedTree(0))
        seen = state.download(rnd)  # every client decrypts [[V]]
        assert np.max(np.abs(seen - v)) < 1e-4
        assert np.all(rnd.view.bytes_down == sum(c.nbytes for c in state.ciphertexts()))
        grads = rng.normal(size=(n, *shape))
        for c in range(n):
            rnd.submit(c, (-eta * grads[c]).ravel())
        rnd.fold_into(state)
        with pytest.raises(AggregationError, match="folded"):
            rnd.result()
        assert "total" not in rnd.view.aggregate
        v = v - eta * grads.sum(0)
    assert state.updates == 3
    assert np.max(np.abs(state.reveal() - v)) < 1e-4
    wrong = transport.open_round(9, range(2), shape=(3, 3), seeds=SeedTree(0))
    wrong.submit(0, np.ones(9))
    with pytest.raises(AggregationError, match="shape"):
        wrong.fold_into(state)


def test_transport_pickles_for_process_parallel_runs(shared_keys):
    import pickle

    transport = pickle.loads(pickle.dumps(_transport(shared_keys)))
    assert transport.server_context.key_id == shared_keys.key_id
    assert not transport.server_context.tenseal.has_secret_key()
    rnd = transport.open_round(0, range(2), shape=(1, 2), seeds=SeedTree(0))
    for c in range(2):
        rnd.submit(c, np.array([0.25, -1.0]))
    np.testing.assert_allclose(rnd.result().total, [[0.5, -2.0]], atol=1e-4)
    # The public context pickles as its own serialization: no secret key inside.
    assert len(pickle.dumps(shared_keys.public())) < 2000


def test_batch_bound_check_names_the_client_without_densifying():
    from securefed.transport.ckks import check_batch_bound

    updates = RowUpdates(
        clients=np.array([7, 8, 9]),
        indptr=np.array([0, 1, 1, 3]),
        rows=np.array([0, 1, 2]),
        values=np.array([[1.0, -2.0], [0.5, 0.5], [3.0, -40.0]]),
        n_rows=4,
    )
    check_batch_bound(updates, 40.0)
    with pytest.raises(ValueError, match=r"client 9's .*-40"):
        check_batch_bound(updates, 39.0)
    weighted = RowUpdates(
        updates.clients, updates.indptr, updates.rows, updates.values, 4, weights=[30.0, 50.0, 0.1]
    )
    with pytest.raises(ValueError, match="client 7"):  # 30 * 2 = 60 > 45
        check_batch_bound(weighted, 45.0)
    heavy = RowUpdates(
        updates.clients, updates.indptr, updates.rows, updates.values, 4, weights=[0.1, 50.0, 0.1]
    )
    with pytest.raises(ValueError, match="client 8"):  # the weight itself travels: 50 > 45
        check_batch_bound(heavy, 45.0)


def test_fedmf_with_the_item_matrix_encrypted_on_the_server(small_split):
    """Chai et al.'s variant: [[V]] never leaves encryption at the server; same model as the
    plaintext run of the same (sum-aggregated) protocol."""
    from securefed import PlaintextTransport, RunOptions, SeedTree, run_rounds
    from securefed.recsys.fedmf import FedMF, FedMFConfig
    from securefed.transport.ckks import CKKSTransport

    base = {"dim": 4, "rounds": 3, "aggregation": "sum", "lr": 0.05, "server_lr": 0.01}
    plain = FedMF(small_split.train, FedMFConfig(**base), SeedTree(0))
    run_rounds(plain, PlaintextTransport(), SeedTree(0), RunOptions(rounds=3, progress=False))
    encrypted = FedMF(small_split.train, FedMFConfig(**base, server_state="encrypted"), SeedTree(0))
    transport = CKKSTransport()
    run_rounds(encrypted, transport, SeedTree(0), RunOptions(rounds=3, progress=False))
    np.testing.assert_allclose(encrypted.V, plain.V, atol=1e-4)
    assert transport.view.public.get("ckks_folded_into_state") or any(
        r.public.get("ckks_folded_into_state") for r in transport.view
    )
    assert all("total" not in r.aggregate for r in transport.view)  # no aggregate decrypted
    with pytest.raises(ValueError, match="server_state='encrypted' needs a transport with encr"):
        other = FedMF(small_split.train, FedMFConfig(**base, server_state="encrypted"), SeedTree(0))
        other.run_round(0, np.arange(5), PlaintextTransport(), SeedTree(0))
    with pytest.raises(ValueError, match="aggregation='sum'"):
        FedMFConfig(server_state="encrypted")
