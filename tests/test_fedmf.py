"""The FedMF family: the vectorised round against a per-client loop, determinism, resume."""

from __future__ import annotations

import numpy as np
import pytest

from securefed import PlaintextTransport, RoundSelection, RunOptions, SeedTree, run_rounds
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.recsys.weights import client_weights


def reference_round(model: FedMF, round_id: int, clients, pseudo=None, virtual=None):
    """One round computed client by client with plain loops (the spec's equations, section 1).

    ``pseudo[u]`` / ``virtual[u]`` give user u's pseudo items and virtual ratings (taken from the
    model under test: their choice is random, their use is what this checks).
    """
    cfg = model.config
    U, V = model.U.copy(), model.V.copy()
    d, n_items = cfg.dim, model.n_items
    blocks, new_users = {}, {}
    rows_sum = np.zeros((len(clients), d))
    rows_sq = np.zeros((len(clients), d))
    counts = np.zeros(len(clients))
    per_client_rows = {}
    for k, u in enumerate(clients):
        lo, hi = model.indptr[u], model.indptr[u + 1]
        items, ratings = model.items[lo:hi], model.ratings[lo:hi] - model.offsets[u]
        user = U[u].copy()
        errors_before = np.array([r - user @ V[i] for i, r in zip(items, ratings, strict=True)])
        for step in range(cfg.local_steps):
            errors = (
                errors_before
                if step == 0
                else np.array([r - user @ V[i] for i, r in zip(items, ratings, strict=True)])
            )
            pull = sum(e * V[i] for e, i in zip(errors, items, strict=True))
            if cfg.user_step == "mean":
                pull = pull / max(len(items), 1)
            user = user - cfg.lr * (-2 * pull + 2 * cfg.reg_user * user)
        new_users[u] = user
        grad_user = U[u] if cfg.gradient_user_vector == "before" else user
        all_items = list(items) + (list(pseudo[u]) if pseudo is not None else [])
        all_ratings = list(ratings) + (
            list(virtual[u] - model.offsets[u]) if pseudo is not None else []
        )
        fixed = cfg.aggregation == "fixed"
        # Filling spreads mu over the rated and pseudo rows unless asked for mu per row.
        spread = pseudo is not None and cfg.filling_regularisation == "per_rating"
        rho = cfg.rho if cfg.rho is not None else (0.5 if cfg.variant == "fedrec+" else 1.0)
        row_mu = cfg.reg_item / (1 + rho) if spread else cfg.reg_item
        rows = {}
        for i, r in zip(all_items, all_ratings, strict=True):
            e = r - grad_user @ V[i]
            rows[i] = -2 * e * grad_user + (0 if fixed else 2 * row_mu * V[i])
        per_client_rows[u] = rows
        grads = np.array(list(rows.values()))
        rows_sum[k], rows_sq[k], counts[k] = grads.sum(0), (grads**2).sum(0), len(rows)
    weights = client_weights(
        cfg.client_weighting,
        counts,
        rows_sum,
        rows_sq,
        model.global_mean,
        model.global_std,
        cfg.tau,
        cfg.count_cap,
    )
    for k, u in enumerate(clients):
        block = np.zeros((n_items + 2, d + 1))
        for i, g in per_client_rows[u].items():
            block[i, :d], block[i, d] = weights[k] * g, 0 if fixed else weights[k]
        wasserstein = cfg.client_weighting == "wasserstein"
        if not fixed:  # "fixed" uploads gradient rows only
            block[n_items] = np.append(rows_sum[k] if wasserstein else np.zeros(d), counts[k])
            block[n_items + 1] = np.append(rows_sq[k] if wasserstein else np.zeros(d), weights[k])
        blocks[u] = block
    total = sum(blocks.values())
    if cfg.aggregation == "mean":
        grad = np.array(
            [total[i, :d] / total[i, d] if total[i, d] > 0 else np.zeros(d) for i in range(n_items)]
        )
    elif cfg.aggregation == "fixed":
        grad = total[:n_items, :d] / model.expected_clients + 2 * cfg.reg_item * V
    else:
        grad = total[:n_items, :d] * len(clients) / total[n_items + 1, d]
    V_new = V - cfg.server_lr * grad
    for u, user in new_users.items():
        U[u] = user
    return U, V_new, blocks


CASES = [
    {},
    {"user_step": "sum", "lr": 0.01, "aggregation": "sum"},
    {"gradient_user_vector": "after", "local_steps": 2},
    {"upload": "full", "weighting": "count"},
    {"aggregation": "fixed", "offset": "user_mean", "expected_clients": 40.0},
    {"aggregation": "fixed", "upload": "full"},
]


@pytest.mark.parametrize("overrides", CASES)
def test_vectorised_round_equals_per_client_loop(small_split, overrides):
    cfg = FedMFConfig(dim=5, rounds=3, **overrides)
    seeds = SeedTree(4)
    model = FedMF(small_split.train, cfg, seeds)
    transport = PlaintextTransport(keep_payloads=RoundSelection.parse("all"))
    for round_id in range(2):  # the second round exercises non-initial state
        clients = np.sort(seeds.generator("pick", round_id).choice(model.n_clients, 50, False))
        U_ref, V_ref, blocks = reference_round(model, round_id, clients)
        model.run_round(round_id, clients, transport, seeds)
        np.testing.assert_allclose(model.V, V_ref, rtol=0, atol=1e-10)
        np.testing.assert_allclose(model.U, U_ref, rtol=0, atol=1e-10)
        view = transport.view.round(round_id)
        for u in clients[:5]:
            payload = view.payload(int(u))
            block = np.zeros_like(blocks[u])
            block[payload["rows"]] = payload["values"]
            np.testing.assert_allclose(block, blocks[u], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "variant, overrides",
    [
        ("fedrec", {}),
        ("fedrec+", {}),
        ("fedrec", {"filling_regularisation": "per_row"}),
        ("fedrec", {"offset": "user_mean", "aggregation": "fixed"}),
    ],
)
def test_filling_round_equals_per_client_loop(small_split, variant, overrides):
    cfg = FedMFConfig(variant=variant, dim=5, rounds=4, warmup_rounds=1, **overrides)
    seeds = SeedTree(2)
    model = FedMF(small_split.train, cfg, seeds)
    transport = PlaintextTransport(keep_payloads=RoundSelection.parse("all"))
    clients = np.arange(model.n_clients)
    first_sets = None
    for round_id in range(3):
        before = FedMF(small_split.train, cfg, seeds)
        before.load_state_dict(model.state_dict())
        model.run_round(round_id, clients, transport, seeds)
        view = transport.view.round(round_id)
        pseudo, virtual = {}, {}
        for u in clients:
            payload = view.payload(int(u))
            lo, hi = model.indptr[u], model.indptr[u + 1]
            rated = set(model.items[lo:hi].tolist())
            rows = [r for r in payload["rows"].tolist() if r < model.n_items and r not in rated]
            pseudo[u] = rows
            virtual[u] = _reference_virtual(before, round_id, u, rows)
        # The pseudo rows the model used must be unrated, rho per rated item, and (FedRec+) stable.
        for u in clients[:10]:
            rated = model.indptr[u + 1] - model.indptr[u]
            padded = cfg.dim + 1 - rated if variant == "fedrec+" else 0
            wanted = round((0.5 if variant == "fedrec+" else 1.0) * rated)  # default rho
            assert len(pseudo[u]) == min(max(wanted, padded), model.n_items - rated)
        U_ref, V_ref, _ = reference_round(before, round_id, clients, pseudo, virtual)
        np.testing.assert_allclose(model.V, V_ref, rtol=0, atol=1e-10)
        np.testing.assert_allclose(model.U, U_ref, rtol=0, atol=1e-10)
        if first_sets is None:
            first_sets = pseudo
        elif variant == "fedrec+":  # stable pseudo sets
            assert all(first_sets[u] == pseudo[u] for u in clients)


def _reference_virtual(model: FedMF, round_id: int, u: int, items) -> list[float]:
    """Virtual ratings per the docstrings of securefed.recsys.filling, one pair at a time."""
    cfg, scale = model.config, model.scale
    lo, hi = model.indptr[u], model.indptr[u + 1]
    rated, ratings = model.items[lo:hi], model.ratings[lo:hi]
    out = []
    for j in items:
        if cfg.variant == "fedrec+":
            vj = model.V[j] / np.linalg.norm(model.V[j])
            weights = [(1 + vj @ (model.V[i] / np.linalg.norm(model.V[i]))) / 2 for i in rated]
            value = np.dot(weights, ratings) / np.sum(weights)
        elif round_id >= cfg.warmup_rounds:
            value = model.offsets[u] + model.U[u] @ model.V[j]
        else:
            value = ratings.mean()
        value = scale.clip(np.array(value))
        out.append(float(scale.snap(value) if cfg.virtual_snapped else value))
    return out


def _train(split, seed, rounds=5, **overrides):
    cfg = FedMFConfig(dim=6, rounds=rounds, **overrides)
    seeds = SeedTree(seed)
    model = FedMF(split.train, cfg, seeds)
    run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=rounds, progress=False))
    return model


@pytest.mark.parametrize("variant", ["fedmf", "fedrec", "fedrec+"])
def test_same_seed_same_numbers_different_seed_different(small_split, variant):
    a = _train(small_split, 1, variant=variant)
    b = _train(small_split, 1, variant=variant)
    c = _train(small_split, 2, variant=variant)
    assert np.array_equal(a.V, b.V) and np.array_equal(a.U, b.U)
    assert not np.allclose(a.V, c.V)


class _Interrupt(Exception):
    pass


def _run_with_checkpoints(split, cfg, directory, stop_after=None):
    seeds = SeedTree(3)
    model, transport = FedMF(split.train, cfg, seeds), PlaintextTransport()

    def maybe_stop(round_id, metrics):
        if stop_after is not None and round_id == stop_after:
            raise _Interrupt

    options = RunOptions(
        rounds=cfg.rounds,
        checkpoint_dir=directory,
        checkpoint_every=3,
        progress=False,
        fingerprint={"cfg": repr(cfg)},
    )
    history = run_rounds(model, transport, seeds, options, on_round=maybe_stop)
    return model, transport, history


@pytest.mark.parametrize("variant", ["fedmf", "fedrec", "fedrec+"])
def test_resume_after_checkpoint_gives_identical_model(small_split, tmp_path, variant):
    cfg = FedMFConfig(variant=variant, dim=4, rounds=8, warmup_rounds=2, weighting="wasserstein")
    reference, reference_transport, _ = _run_with_checkpoints(small_split, cfg, tmp_path / "a")
    with pytest.raises(_Interrupt):
        _run_with_checkpoints(small_split, cfg, tmp_path / "b", stop_after=4)  # checkpoint at 3
    model, transport, history = _run_with_checkpoints(small_split, cfg, tmp_path / "b")
    assert history.resumed_from == 3
    assert np.array_equal(model.V, reference.V) and np.array_equal(model.U, reference.U)
    assert transport.view.total_bytes() == reference_transport.view.total_bytes()


def test_config_validation():
    with pytest.raises(ValueError, match="variant"):
        FedMFConfig(variant="svd")
    with pytest.raises(ValueError, match="lr"):
        FedMFConfig(lr=0)
    with pytest.raises(ValueError, match="dropout"):
        FedMFConfig(dropout=1.0)
    with pytest.raises(ValueError, match="statistics rows"):
        FedMFConfig(variant="fedrec+", aggregation="fixed")
    with pytest.raises(ValueError, match="expected_clients"):
        FedMFConfig(aggregation="fixed", expected_clients=0.0)
    with pytest.raises(ValueError, match="offset"):
        FedMFConfig(offset="global")


def test_user_mean_offset_predicts_the_users_mean_when_factors_vanish(small_split):
    model = FedMF(small_split.train, FedMFConfig(offset="user_mean"), SeedTree(0))
    model.U[:] = 0.0
    users = np.arange(model.n_clients)
    lo, hi = model.indptr[:-1], model.indptr[1:]
    means = np.array([model.ratings[a:b].mean() for a, b in zip(lo, hi, strict=True)])
    np.testing.assert_allclose(model.predict(users, np.zeros_like(users)), means)


def test_user_level_dp_fedmf_learns_under_noise(small_split):
    """Central DP at epsilon 8: the DP settings stay finite and beat the users' mean alone."""
    from securefed.bench.bench_fedmf import user_mean_rmse
    from securefed.privacy import PrivacyLedger
    from securefed.privacy.calibration import noise_for_target
    from securefed.recsys.fedmf import user_level_dp_config
    from securefed.recsys.metrics import rmse
    from securefed.transport.dp import DPTransport

    cfg = user_level_dp_config(rounds=40, dim=4, server_lr=2.0)
    sigma = noise_for_target(8.0, 1e-5, 1.0, cfg.rounds)
    transport = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=sigma, ledger=PrivacyLedger(), delta=1e-5
    )
    seeds = SeedTree(1)
    model = FedMF(small_split.train, cfg, seeds)
    run_rounds(model, transport, seeds, RunOptions(rounds=cfg.rounds, progress=False))
    test = small_split.test
    private = rmse(model.predict(test.users, test.items), test.ratings)
    assert transport.epsilon() == pytest.approx(8.0, rel=0.01)
    assert private < user_mean_rmse(small_split) - 0.02


def test_client_groups_do_not_change_the_result(small_split):
    whole = _train(small_split, 5, variant="fedrec+")
    grouped = _train(small_split, 5, variant="fedrec+", chunk_ratings=97)
    np.testing.assert_allclose(grouped.V, whole.V, rtol=0, atol=1e-12)
    np.testing.assert_allclose(grouped.U, whole.U, rtol=0, atol=1e-12)


def test_divergence_is_reported_with_its_cause(small_split):
    with pytest.raises(FloatingPointError, match="diverged by round"):
        _train(small_split, 0, rounds=30, lr=50.0, server_lr=50.0)
