"""The privacy layer's core: seeds, ServerView, plaintext rounds, the round loop, checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from securefed import (
    AggregationError,
    CheckpointError,
    ClientSampling,
    FactoredRows,
    PlaintextTransport,
    RoundSelection,
    RowUpdates,
    RunOptions,
    SeedTree,
    ServerView,
    ViewFormatError,
    run_rounds,
)


def test_seed_tree_is_deterministic_and_independent_of_request_order():
    a, b = SeedTree(5), SeedTree(5)
    first = a.generator("client", 3, 7).normal(size=4)
    b.generator("other", 1).normal(size=100)
    assert np.array_equal(first, b.generator("client", 3, 7).normal(size=4))
    assert not np.array_equal(first, SeedTree(6).generator("client", 3, 7).normal(size=4))
    assert not np.array_equal(first, a.generator("client", 3, 8).normal(size=4))


def test_seed_tree_streams_are_spawn_children():
    tree = SeedTree(11)
    child = np.random.SeedSequence(11).spawn(3)[2]
    assert tree.sequence(2).generate_state(4).tolist() == child.generate_state(4).tolist()


def test_secure_mode_refuses_a_seed():
    with pytest.raises(ValueError, match="refuses a seed"):
        SeedTree.secure_mode(3)
    assert SeedTree.secure_mode().secure
    with pytest.raises(ValueError, match="non-negative"):
        SeedTree(-1)


def test_round_selection_parse():
    selection = RoundSelection.parse("0,1,5-6,last:2")
    assert [r for r in range(10) if selection.keeps(r, 10)] == [0, 1, 5, 6, 8, 9]
    assert RoundSelection.parse("all").keeps(123)
    assert not RoundSelection.parse("none").keeps(0, 1)
    with pytest.raises(ValueError, match="cannot parse"):
        RoundSelection.parse("first:3")


def _batch(clients, rows_per_client, width=3, n_rows=6, seed=0, dense=False, weights=None):
    rng = np.random.default_rng(seed)
    rows = [rng.choice(n_rows, k, replace=False) for k in rows_per_client]
    indptr = np.concatenate([[0], np.cumsum(rows_per_client)])
    values = rng.normal(size=(indptr[-1], width))
    return RowUpdates(
        np.array(clients), indptr, np.concatenate(rows), values, n_rows, dense, weights
    )


def test_plaintext_round_sums_weighted_rows_and_counts_bytes():
    transport = PlaintextTransport(keep_payloads=RoundSelection.parse("all"))
    rnd = transport.open_round(0, [0, 1, 2], shape=(6, 3), seeds=SeedTree(0))
    batch = _batch([0, 2], [2, 3], weights=np.array([0.5, 2.0]))
    rnd.submit_batch(batch)
    single = np.arange(18.0)
    rnd.submit(1, single, weight=1.0)
    expected = 0.5 * batch.client_block(0) + 2.0 * batch.client_block(1) + single.reshape(6, 3)
    result = rnd.result()
    assert np.allclose(result.total, expected)
    assert result.weight == pytest.approx(3.5)
    assert result.contributors.tolist() == [0, 1, 2]
    # Part upload: 4-byte index + 3 doubles per row + the weight; dense: the whole block.
    assert rnd.view.bytes_up.tolist() == [2 * 28 + 8, 18 * 8 + 8, 3 * 28 + 8]
    assert np.array_equal(rnd.view.payload(2)["rows"], batch.client_rows(1)[0])


def _factored(seed=0, n_rows=7, width=4, weighted=True):
    """Three clients' factored rows, with client scales and explicit statistics entries."""
    rng = np.random.default_rng(seed)
    counts = np.array([3, 0, 4])
    rows = np.concatenate([rng.choice(n_rows - 1, k, replace=False) for k in counts])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    scale = rng.uniform(0.5, 2, len(rows)) if weighted else None
    explicit_at = np.array([1, 5])
    rows[explicit_at] = n_rows - 1  # a statistics row written explicitly
    factors = FactoredRows(
        rng.normal(size=len(rows)),
        rng.normal(size=(3, width)),
        rng.normal(size=(n_rows, width)),
        scale,
        explicit_at,
        rng.normal(size=(2, width)),
    )
    return indptr, rows, factors


@pytest.mark.parametrize("weighted", [True, False])
def test_factored_rows_sum_and_materialise_to_the_same_numbers(weighted):
    indptr, rows, factors = _factored(weighted=weighted)
    owner = np.repeat(np.arange(3), np.diff(indptr))
    expected = factors.coef[:, None] * factors.left[owner] + (
        (1.0 if factors.scale is None else factors.scale[:, None]) * factors.right[rows]
    )
    expected[factors.explicit_at] = factors.explicit
    weights = np.array([0.5, 3.0, 2.0])
    lazy = RowUpdates(np.array([4, 9, 2]), indptr, rows, factors, 7, weights=weights)
    plain = RowUpdates(np.array([4, 9, 2]), indptr, rows, expected, 7, weights=weights)
    # The sum straight from the factors, before anything materialised the values.
    assert lazy.width == 4 and lazy.shape == (7, 4)
    assert np.allclose(lazy.weighted_sum(), plain.weighted_sum(), atol=1e-12)
    assert np.allclose(lazy.values, expected, atol=1e-12)
    assert np.allclose(lazy.client_block(2), plain.client_block(2), atol=1e-12)
    with pytest.raises(AttributeError, match="immutable"):
        lazy.rows = rows


def test_factored_rows_refuse_bad_factors():
    indptr, rows, factors = _factored()
    with pytest.raises(ValueError, match="only finite"):
        FactoredRows(np.array([np.nan]), np.zeros((1, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="one width"):
        FactoredRows(np.zeros(2), np.zeros((1, 2)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="explicit values"):
        FactoredRows(np.zeros(2), np.zeros((1, 2)), np.zeros((3, 2)), None, [0], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="client rows"):
        RowUpdates(np.array([0, 1]), indptr[:3], rows[: indptr[2]], factors, 7)


def test_round_refuses_bad_input():
    transport = PlaintextTransport()
    rnd = transport.open_round(0, [0, 1], shape=(6, 3), seeds=SeedTree(0))
    with pytest.raises(ValueError, match="expects"):
        rnd.submit(0, np.zeros(5))
    with pytest.raises(ValueError, match="only finite"):
        rnd.submit(0, np.full(18, np.nan))
    with pytest.raises(ValueError, match="not part of round"):
        rnd.submit(7, np.zeros(18))
    rnd.submit(0, np.zeros(18))
    with pytest.raises(AggregationError, match="already submitted"):
        rnd.submit(0, np.zeros(18))
    rnd.drop(1)
    with pytest.raises(AggregationError, match="dropped out"):
        rnd.submit(1, np.zeros(18))
    rnd.result()
    with pytest.raises(AggregationError, match="finished"):
        rnd.submit(1, np.zeros(18))


def test_server_view_round_trip(tmp_path):
    transport = PlaintextTransport(keep_payloads=RoundSelection.parse("1"))
    for round_id in range(3):
        rnd = transport.open_round(round_id, [0, 1, 2], shape=(6, 3), seeds=SeedTree(0))
        rnd.view.public["lr"] = 0.1
        rnd.broadcast("V", np.full((4, 2), round_id))
        rnd.submit_batch(_batch([0, 1], [1, 2], seed=round_id, weights=np.array([1.0, 0.5])))
        rnd.drop(2)
        rnd.result()
    view = transport.view
    view.save(tmp_path / "view")
    loaded = ServerView.load(tmp_path / "view")
    assert loaded.transport == "plaintext"
    assert loaded.rounds_with_payloads() == [1]
    for original, copy in zip(view, loaded, strict=True):
        assert np.array_equal(original.bytes_up, copy.bytes_up)
        assert np.array_equal(original.bytes_down, copy.bytes_down)
        assert original.dropped == copy.dropped == [2]
        assert copy.public == {"lr": 0.1}
    # Aggregates follow the payloads: only round 1 keeps its own; the others keep the bytes.
    assert np.array_equal(view.round(1).aggregate["total"], loaded.round(1).aggregate["total"])
    assert [sorted(r.aggregate) for r in loaded] == [[], ["total", "weight"], []]
    assert np.array_equal(loaded.round(1).broadcast["V"], np.full((4, 2), 1))
    for client in (0, 1):
        for field in ("rows", "values", "weight"):
            assert np.array_equal(
                view.round(1).payload(client)[field], loaded.round(1).payload(client)[field]
            )
    with pytest.raises(KeyError, match="kept no payloads"):
        loaded.round(0).payload(0)
    manifest = json.loads((tmp_path / "view" / "manifest.json").read_text())
    assert manifest["format"] == "securefed.server_view" and manifest["version"] == 3


def test_server_view_load_names_what_is_wrong(tmp_path):
    with pytest.raises(ViewFormatError, match=r"manifest\.json is missing"):
        ServerView.load(tmp_path)
    PlaintextTransport().view.save(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ViewFormatError, match="unsupported version"):
        ServerView.load(tmp_path)


def test_client_sampling():
    rng = np.random.default_rng(0)
    assert ClientSampling().sample(5, rng).tolist() == [0, 1, 2, 3, 4]
    fixed = ClientSampling("fixed", 3).sample(10, rng)
    assert len(fixed) == 3 and np.all(np.diff(fixed) > 0)
    sizes = [len(ClientSampling("poisson", 20).sample(100, rng)) for _ in range(300)]
    assert abs(np.mean(sizes) - 20) < 1.0 and np.std(sizes) > 2
    with pytest.raises(ValueError, match="clients_per_round"):
        ClientSampling("poisson")


class _Averager:
    """A tiny algorithm: clients send noisy copies of a target; the server moves to the mean."""

    n_clients = 8

    def __init__(self):
        self.state = np.zeros(4)

    def run_round(self, round_id, clients, transport, seeds):
        rnd = transport.open_round(round_id, clients, shape=(1, 4), seeds=seeds)
        rnd.broadcast("state", self.state)
        for client in clients:
            noise = seeds.generator("client", round_id, int(client)).normal(size=4)
            rnd.submit(int(client), 1.0 + noise - self.state)
        aggregate = rnd.result()
        if aggregate.weight:
            self.state = self.state + 0.5 * aggregate.mean().ravel()
        return {"norm": float(np.linalg.norm(self.state))}

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, state):
        self.state = np.array(state["state"])


def _run(tmp_path, rounds, resume=True, fingerprint=None):
    algorithm, transport = _Averager(), PlaintextTransport()
    history = run_rounds(
        algorithm,
        transport,
        SeedTree(1),
        RunOptions(
            rounds=rounds,
            sampling=ClientSampling("poisson", 4),
            checkpoint_dir=tmp_path,
            checkpoint_every=3,
            resume=resume,
            fingerprint=fingerprint or {"lr": 0.5},
        ),
    )
    return algorithm, transport, history


def test_resume_gives_the_identical_result(tmp_path):
    reference, reference_transport, _ = _run(tmp_path / "a", 10)
    _run(tmp_path / "b", 6)  # interrupted after 6 rounds
    resumed, transport, history = _run(tmp_path / "b", 10)
    assert history.resumed_from == 6
    assert np.array_equal(resumed.state, reference.state)
    assert len(history.rounds) == 10
    assert [r.round_id for r in transport.view] == list(range(10))
    for a, b in zip(reference_transport.view, transport.view, strict=True):
        assert np.array_equal(a.bytes_up, b.bytes_up)


def test_a_checkpoint_swap_cut_short_resumes_from_the_previous_checkpoint(tmp_path):
    reference, _, _ = _run(tmp_path / "a", 10)
    _run(tmp_path / "b", 6)
    # The crash struck after latest/ was moved aside and before the new one was moved in.
    (tmp_path / "b" / "latest").rename(tmp_path / "b" / "previous")
    resumed, _, history = _run(tmp_path / "b", 10)
    assert history.resumed_from == 6
    assert np.array_equal(resumed.state, reference.state)
    assert not (tmp_path / "b" / "previous").exists()


def test_resume_refuses_another_configuration(tmp_path):
    _run(tmp_path, 3)
    with pytest.raises(CheckpointError, match="different configuration"):
        _run(tmp_path, 6, fingerprint={"lr": 0.1})


def test_a_run_continued_on_another_transport_equals_one_run():
    """``first_round``: rounds 0-3 on one transport, 4-7 on another, the same as 0-7 on one."""
    options = {"sampling": ClientSampling("poisson", 4), "progress": False}
    whole = _Averager()
    run_rounds(whole, PlaintextTransport(), SeedTree(2), RunOptions(rounds=8, **options))
    split, second = _Averager(), PlaintextTransport()
    run_rounds(split, PlaintextTransport(), SeedTree(2), RunOptions(rounds=4, **options))
    run_rounds(split, second, SeedTree(2), RunOptions(rounds=8, first_round=4, **options))
    assert np.array_equal(split.state, whole.state)
    assert [r.round_id for r in second.view] == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="first_round"):
        RunOptions(rounds=3, first_round=4)
