"""FedMF with biases and server optimisers: the round against loops, the upload layout, the
global-mean round, resume, refusals, and the defaults against the damped-biases baseline."""

from __future__ import annotations

import numpy as np
import pytest

from securefed import PlaintextTransport, RoundSelection, RunOptions, SeedTree, run_rounds
from securefed.errors import InsecureParameterError, UnsupportedTransport
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.data import RatingScale, random_split, synthetic_ratings
from securefed.recsys.fedmf import RATING_MEAN_ROUND, FedMF, FedMFConfig, biased_config
from securefed.recsys.metrics import rmse
from securefed.recsys.validation import EarlyStopping, best_round, holdout_split
from securefed.transport import build_transport


def _loop_round(model: FedMF, clients: np.ndarray):
    """One biased vanilla round with plain loops (``mean`` aggregation, sgd, one local step)."""
    cfg = model.config
    U, V, bu, bi = model.U.copy(), model.V.copy(), model.user_bias.copy(), model.item_bias.copy()
    base = model.offsets
    grad_sum = np.zeros((model.n_items, cfg.dim + 1))
    count = np.zeros(model.n_items)
    new_U, new_bu = U.copy(), bu.copy()
    for u in clients:
        lo, hi = model.indptr[u], model.indptr[u + 1]
        items, ratings = model.items[lo:hi], model.ratings[lo:hi]
        errors = np.array(
            [r - base[u] - bu[u] - bi[i] - U[u] @ V[i] for i, r in zip(items, ratings, strict=True)]
        )
        n = max(len(items), 1)
        pull = sum((e * V[i] for e, i in zip(errors, items, strict=True)), np.zeros(cfg.dim))
        new_U[u] = U[u] - cfg.lr * (-2 * pull / n + 2 * cfg.reg_user * U[u])
        new_bu[u] = bu[u] - cfg.lr * (-2 * errors.sum() / n + 2 * cfg.reg_bias * bu[u])
        for e, i in zip(errors, items, strict=True):
            grad_sum[i, : cfg.dim] += -2 * e * U[u] + 2 * cfg.reg_item * V[i]
            grad_sum[i, cfg.dim] += -2 * e + 2 * cfg.reg_bias * bi[i]
            count[i] += 1
    touched = count > 0
    step = np.zeros_like(grad_sum)
    step[touched] = grad_sum[touched] / count[touched, None]
    return new_U, new_bu, V - cfg.server_lr * step[:, :-1], bi - cfg.server_lr * step[:, -1]


@pytest.mark.parametrize("offset", ["none", "user_mean"])
def test_biased_round_equals_per_client_loop(small_split, offset):
    cfg = FedMFConfig(dim=4, rounds=3, biases=True, reg_bias=0.05, offset=offset)
    seeds = SeedTree(2)
    model = FedMF(small_split.train, cfg, seeds)
    transport = PlaintextTransport()
    for round_id in range(2):  # the second round starts from non-zero biases
        clients = np.sort(seeds.generator("pick", round_id).choice(model.n_clients, 60, False))
        if model.needs_rating_mean:
            model.rating_mean_round(transport, seeds)
        U, bu, V, bi = _loop_round(model, clients)
        model.run_round(round_id, clients, transport, seeds)
        for got, expected in ((model.U, U), (model.user_bias, bu), (model.V, V)):
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(model.item_bias, bi, rtol=0, atol=1e-10)
    assert np.abs(model.item_bias).max() > 0 and np.abs(model.user_bias).max() > 0


@pytest.mark.parametrize("variant", ["fedmf", "fedrec", "fedrec+"])
def test_the_item_bias_gradient_is_the_last_column_of_every_uploaded_row(small_split, variant):
    # The layout h6's attack reads: row i = [-2 e U + 2 mu V_i, -2 e + 2 mu_b b_i, count].
    cfg = FedMFConfig(variant=variant, dim=4, rounds=3, biases=True, reg_bias=0.05)
    seeds = SeedTree(5)
    model = FedMF(small_split.train, cfg, seeds)
    run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=2, progress=False))
    uploads = []
    clients = np.arange(20)
    user_before = model.U[clients].copy()
    model.client_step(2, clients, seeds, uploads.append)
    (batch,) = uploads
    assert batch.width == cfg.dim + 2
    mu, mu_b = cfg.row_reg_item, cfg.row_reg_bias
    for k, u in enumerate(clients):
        rows, values = batch.client_rows(k)
        item = rows < model.n_items
        rows, values = rows[item], values[item]
        weight = values[:, -1:]  # p_u on every row (1 unless FedRec+'s Wasserstein weights)
        assert np.all(weight == weight[0]) and weight[0, 0] > 0
        values = values / weight
        errors = -(values[:, cfg.dim] - 2 * mu_b * model.item_bias[rows]) / 2
        expected = -2 * errors[:, None] * user_before[k] + 2 * mu * model.V[rows]
        np.testing.assert_allclose(values[:, : cfg.dim], expected, rtol=0, atol=1e-10)
        if variant != "fedmf":  # pseudo rows carry a bias column of the same form
            assert item.sum() > model.indptr[u + 1] - model.indptr[u]


def _capture_rounds(transport):
    """Keep every round ``transport`` opens (the view forgets the global-mean round's record)."""
    opened, open_round = [], transport.open_round

    def capture(*args, **kwargs):
        opened.append(open_round(*args, **kwargs))
        return opened[-1]

    transport.open_round = capture
    return opened


def _user_totals(model: FedMF) -> np.ndarray:
    sums = [
        model.ratings[model.indptr[u] : model.indptr[u + 1]].sum() for u in range(model.n_clients)
    ]
    return np.column_stack([sums, np.diff(model.indptr)])


def test_the_global_mean_round_is_one_sum_of_two_totals(small_split):
    cfg = FedMFConfig(dim=3, rounds=2, biases=True)
    seeds = SeedTree(1)
    model = FedMF(small_split.train, cfg, seeds)
    transport = PlaintextTransport(keep_payloads=RoundSelection.parse("all"))
    opened = _capture_rounds(transport)
    with pytest.raises(ValueError, match="no prediction before round 0"):
        model.predict(np.array([0]), np.array([0]))
    run_rounds(model, transport, seeds, RunOptions(rounds=2, progress=False))
    assert model.rating_mean == pytest.approx(np.mean(small_split.train.ratings), abs=1e-12)
    assert transport.view.public["rating_mean"] == model.rating_mean
    assert [r.round_id for r in opened] == [RATING_MEAN_ROUND, 0, 1]
    assert [r.round_id for r in transport.view] == [0, 1]
    # In plaintext the server sees each user's two totals (as it sees every gradient).
    np.testing.assert_allclose(
        opened[0].view.payload(7)["values"], _user_totals(model)[7:8], rtol=0, atol=1e-9
    )


def test_under_secure_aggregation_the_mean_round_hides_each_users_totals(small_split):
    n_users = small_split.train.n_users
    transport = build_transport(
        "secagg:keep_masked=true",
        keep_payloads=RoundSelection.parse("all"),
        n_clients=n_users,
        total_rounds=1,
    )
    opened = _capture_rounds(transport)
    seeds = SeedTree(1)
    model = FedMF(small_split.train, FedMFConfig(dim=3, rounds=1, biases=True), seeds)
    mean = model.rating_mean_round(transport, seeds)
    assert mean == pytest.approx(np.mean(small_split.train.ratings), abs=1e-6)
    (setup,) = opened
    totals = _user_totals(model)
    # Only masked words reach the server: no upload equals, or scales to, any user's totals.
    for u in range(0, n_users, 10):
        payload = setup.view.payload(u)
        assert "values" not in payload
        masked = np.asarray(payload["masked"], dtype=np.float64).ravel()
        for scale in (1.0, 2.0**16, 2.0**20, 2.0**24):
            assert not np.any(np.all(np.isclose(masked[None, :2], scale * totals), axis=1))


def test_dp_transports_refuse_the_global_mean_round_and_accept_the_user_mean(small_split):
    n_users = small_split.train.n_users
    options = {"dp.noise_multiplier": 1.0, "dp.clip": 1.0}
    seeds = SeedTree(0)

    def dp_transport():
        from securefed.transport import parse_transport_spec, resolve_options

        groups = resolve_options(parse_transport_spec("dp"), options)
        return build_transport("dp", groups, n_clients=n_users, total_rounds=1, sample_rate=1.0)

    pytest.importorskip("opacus")
    model = FedMF(small_split.train, FedMFConfig(dim=3, rounds=1, biases=True), seeds)
    with pytest.raises(UnsupportedTransport, match="offset='user_mean'"):
        model.run_round(0, np.arange(n_users), dp_transport(), seeds)
    cfg = FedMFConfig(dim=3, rounds=1, biases=True, offset="user_mean", aggregation="fixed")
    cfg = FedMFConfig(**{**cfg.__dict__, "expected_clients": float(n_users)})
    model = FedMF(small_split.train, cfg, seeds)
    model.run_round(0, np.arange(n_users), dp_transport(), seeds)
    assert model.rating_mean is None and np.abs(model.item_bias).max() > 0


class _Interrupt(Exception):
    pass


def _checkpointed(split, cfg, directory, stop_after=None):
    seeds = SeedTree(3)
    model, transport = FedMF(split.train, cfg, seeds), PlaintextTransport()

    def maybe_stop(round_id, metrics):
        if stop_after is not None and round_id == stop_after:
            raise _Interrupt

    options = RunOptions(
        rounds=cfg.rounds, checkpoint_dir=directory, checkpoint_every=3, progress=False
    )
    history = run_rounds(model, transport, seeds, options, on_round=maybe_stop)
    return model, history


@pytest.mark.parametrize(
    ("variant", "optimiser"), [("fedmf", "adam"), ("fedrec", "momentum"), ("fedrec+", "yogi")]
)
def test_resume_with_biases_and_a_server_optimiser_is_bit_for_bit(
    small_split, tmp_path, variant, optimiser
):
    cfg = FedMFConfig(
        variant=variant,
        dim=4,
        rounds=7,
        biases=True,
        server_optimiser=optimiser,
        server_lr=0.05,
        warmup_rounds=2,
    )
    reference, _ = _checkpointed(small_split, cfg, tmp_path / "a")
    with pytest.raises(_Interrupt):
        _checkpointed(small_split, cfg, tmp_path / "b", stop_after=4)  # checkpoint after 3
    model, history = _checkpointed(small_split, cfg, tmp_path / "b")
    assert history.resumed_from == 3
    for name in ("U", "V", "user_bias", "item_bias"):
        assert np.array_equal(getattr(model, name), getattr(reference, name)), name
    assert model.rating_mean == reference.rating_mean
    saved, expected = model.server_optimiser.state_dict(), reference.server_optimiser.state_dict()
    assert saved.keys() == expected.keys() and len(saved) > 1
    assert all(np.array_equal(saved[k], expected[k]) for k in saved)


def test_without_biases_and_with_sgd_the_state_is_todays(small_split):
    model = FedMF(small_split.train, FedMFConfig(dim=3, rounds=1), SeedTree(0))
    state = model.state_dict()
    assert set(state) == {
        "U",
        "V",
        "pseudo_chosen",
        "pseudo_indptr",
        "pseudo_items",
        "server_optimiser.__optimiser__",
    }
    assert model.public_parameters()["block_columns"] == 4


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"biases": True, "server_state": "encrypted", "aggregation": "sum"}, "nowhere to go"),
        (
            {"server_optimiser": "adam", "server_state": "encrypted", "aggregation": "sum"},
            "cannot keep moments",
        ),
        ({"server_optimiser": "rmsprop"}, "unknown server optimiser"),
        ({"server_beta2": 1.0}, "beta2"),
        ({"reg_bias": -1.0}, "reg_bias"),
        ({"biases": 1}, "biases must be True or False"),
    ],
)
def test_config_refuses(overrides, match):
    with pytest.raises(ValueError, match=match):
        FedMFConfig(**overrides)


def test_the_biased_preset_needs_a_third_of_the_rounds_of_plain_server_steps(small_split):
    def test_rmse(cfg):
        seeds = SeedTree(0)
        model = FedMF(small_split.train, cfg, seeds)
        run_rounds(
            model, PlaintextTransport(), seeds, RunOptions(rounds=cfg.rounds, progress=False)
        )
        predictions = model.predict(small_split.test.users, small_split.test.items)
        return rmse(predictions, small_split.test.ratings)

    # The same model (the preset's regularisation and dampings) with plain server steps.
    sgd = {"server_optimiser": "sgd", "server_lr": 0.3}
    plain = test_rmse(biased_config(dim=4, rounds=180, **sgd))
    assert test_rmse(biased_config(dim=4, rounds=60)) <= plain + 0.002
    # the server rule is what carries it: the same preset with sgd at 60 rounds is far behind
    assert test_rmse(biased_config(dim=4, rounds=60, **sgd)) > plain + 0.02


def test_holdout_keeps_every_user_training_and_is_disjoint(small_split):
    train = small_split.train
    parts = holdout_split(train, 0.2, np.random.default_rng(0))
    assert len(parts.train) + len(parts.test) == len(train)
    keys = lambda r: set(zip(r.users.tolist(), r.items.tolist(), strict=True))  # noqa: E731
    assert not keys(parts.train) & keys(parts.test)
    before = np.bincount(train.users, minlength=train.n_users)
    after = np.bincount(parts.train.users, minlength=train.n_users)
    assert np.all(after[before > 0] >= 1)
    assert 0.17 < len(parts.test) / len(train) < 0.23
    with pytest.raises(ValueError, match=r"\(0, 0.5\]"):
        holdout_split(train, 0.6, np.random.default_rng(0))


def test_best_round_and_patience():
    stopping = EarlyStopping(patience=2, every=5, min_delta=0.001)
    curve = [(5, 1.0), (10, 0.9), (15, 0.8995), (20, 0.95)]
    assert best_round(curve, stopping) == (10, True)
    assert best_round(curve[:3], stopping) == (10, False)
    with pytest.raises(ValueError, match="empty"):
        best_round([], stopping)
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)


def test_validation_chooses_the_rounds_and_refuses_dp(small_split):
    from securefed.bench.experiment import FedMFRun, run_fedmf

    run = FedMFRun(
        config=biased_config(dim=4, rounds=60),
        seed=0,
        progress=False,
        validation=0.2,
        early_stopping=EarlyStopping(patience=2, every=5),
    )
    record, _, _ = run_fedmf(small_split, run)
    chosen = record["validation"]["rounds"]
    assert record["rounds"] == chosen and chosen % 5 == 0 and chosen <= 60
    assert (
        min(v for _, v in record["validation"]["curve"])
        == dict(map(tuple, record["validation"]["curve"]))[chosen]
    )
    with pytest.raises(InsecureParameterError, match="DP ledger"):
        run_fedmf(
            small_split,
            FedMFRun(config=biased_config(rounds=5), transport="dp", seed=0, validation=0.1),
        )


def _biased_against_baseline(split, cfg) -> tuple[float, float]:
    seeds = SeedTree(0)
    model = FedMF(split.train, cfg, seeds)
    run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=cfg.rounds, progress=False))
    fedmf = rmse(model.predict(split.test.users, split.test.items), split.test.ratings)
    baseline = damped_baseline(split.train).predict(split.test.users, split.test.items)
    return fedmf, rmse(baseline, split.test.ratings)


def test_defaults_beat_the_damped_baseline_on_a_shifted_scale():
    # A half-star 0.5..10 scale with its mean far from MovieLens's: what sank unbiased FedMF.
    scale = RatingScale(0.5, 10.0, 0.5)
    ratings = synthetic_ratings(300, 200, 9000, rank=5, noise=0.8, scale=scale, seed=11)
    split = random_split(ratings, 0.2, np.random.default_rng(1))
    fedmf, baseline = _biased_against_baseline(split, biased_config())
    assert fedmf < baseline - 0.02


def test_defaults_beat_the_damped_baseline_on_ml_latest_small_in_a_third_of_their_rounds():
    from securefed.bench import datasets

    split = datasets.load("ml-latest-small", None, seed=0)
    fedmf, baseline = _biased_against_baseline(split, biased_config(rounds=30))
    assert fedmf < baseline - 0.01  # measured: 0.9032 for the baseline


@pytest.mark.slow
def test_defaults_beat_the_damped_baseline_on_ml_latest_small():
    from securefed.bench import datasets

    split = datasets.load("ml-latest-small", None, seed=0)
    fedmf, baseline = _biased_against_baseline(split, biased_config())
    assert fedmf < baseline - 0.02  # measured: 0.8737 against 0.9032


def test_users_without_training_ratings_keep_zero_bias(small_split):
    train = small_split.train
    last = train.n_users - 1
    train = train.subset((train.users != last) & (train.users != 0))  # first and last: empty
    cfg = FedMFConfig(dim=3, rounds=2, biases=True, reg_bias=0.0)
    seeds = SeedTree(0)
    model = FedMF(train, cfg, seeds)
    run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=2, progress=False))
    assert model.user_bias[0] == 0.0 and model.user_bias[last] == 0.0
    assert np.count_nonzero(model.user_bias) == train.n_users - 2
