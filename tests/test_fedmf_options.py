"""FedMF's item damping and item-bias upload scale, and the faster filling's equalities: the
server step against its formula, refusals, the clip's sensitivity with a scaled bias column, and
the factored statistics and first-draw masks against direct computations."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from securefed import PlaintextTransport, RunOptions, SeedTree, run_rounds
from securefed.recsys.fedmf import (
    FedMF,
    FedMFConfig,
    _RoundData,
    biased_config,
    dp_biased_config,
    user_level_dp_config,
)
from securefed.recsys.filling import _first_occurrences
from securefed.transport.dp import clip_row_updates


def _warm(split, cfg: FedMFConfig, rounds: int = 2) -> FedMF:
    seeds = SeedTree(4)
    model = FedMF(split.train, cfg, seeds)
    run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=rounds, progress=False))
    return model


def _next_round(split, state: FedMF, cfg: FedMFConfig) -> FedMF:
    """A model with ``cfg`` that starts from ``state``'s parameters and runs one more round."""
    model = FedMF(split.train, cfg, SeedTree(4))
    model.load_state_dict(state.state_dict())
    model.run_round(2, np.arange(model.n_clients), PlaintextTransport(), SeedTree(5))
    return model


def test_item_damping_steps_each_item_with_k_more_rows_of_zero_error(small_split):
    # From one state, the undamped round gives each item's summed gradient G_i (sgd: V' = V -
    # eta G_i / n_i); the damped one must step (G_i + 2 mu k V_i) / (n_i + k), b_i likewise.
    common = {"dim": 3, "rounds": 5, "biases": True, "reg_bias": 0.03, "offset": "user_mean"}
    k = 7.0
    before = _warm(small_split, FedMFConfig(**common))
    plain = _next_round(small_split, before, FedMFConfig(**common))
    damped = _next_round(small_split, before, FedMFConfig(**common, item_damping=k))
    cfg, eta = plain.config, plain.config.server_lr
    n = np.bincount(before.items, minlength=before.n_items).astype(float)
    rated = n > 0
    G = (before.V - plain.V) * n[:, None] / eta
    G_b = (before.item_bias - plain.item_bias) * n / eta
    expected_V = before.V - eta * (G + 2 * cfg.reg_item * k * before.V) / (n + k)[:, None]
    expected_b = before.item_bias - eta * (G_b + 2 * cfg.reg_bias * k * before.item_bias) / (n + k)
    np.testing.assert_allclose(damped.V[rated], expected_V[rated], rtol=0, atol=1e-10)
    np.testing.assert_allclose(damped.item_bias[rated], expected_b[rated], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(damped.V[~rated], before.V[~rated])  # untouched items stay
    # and the damping does change the step (the equalities above are not met by accident)
    assert not np.allclose(damped.V[rated], plain.V[rated])


def test_user_damping_regularises_a_user_as_if_it_had_k_more_ratings(small_split):
    # U'_k = U'_0 - gamma 2 lambda (k / n_u) U for the vector and b_u alike, from one state.
    common = {"dim": 3, "rounds": 5, "biases": True, "reg_bias": 0.03, "offset": "user_mean"}
    k = 9.0
    before = _warm(small_split, FedMFConfig(**common))
    plain = _next_round(small_split, before, FedMFConfig(**common))
    damped = _next_round(small_split, before, FedMFConfig(**common, user_damping=k))
    cfg = plain.config
    n = np.maximum(np.diff(before.indptr), 1).astype(float)
    expected_U = plain.U - cfg.lr * 2 * cfg.reg_user * (k / n)[:, None] * before.U
    expected_b = plain.user_bias - cfg.lr * 2 * cfg.reg_bias * (k / n) * before.user_bias
    np.testing.assert_allclose(damped.U, expected_U, rtol=0, atol=1e-12)
    np.testing.assert_allclose(damped.user_bias, expected_b, rtol=0, atol=1e-12)
    assert np.abs(damped.U - plain.U).max() > 1e-6


def test_the_dp_biased_preset_is_the_dp_preset_with_a_scaled_bias_column():
    cfg = dp_biased_config()
    assert cfg.biases and cfg.bias_upload_scale == 0.3 and cfg.offset == "user_mean"
    assert replace(cfg, biases=False, bias_upload_scale=1.0) == user_level_dp_config()


def test_bias_upload_scale_changes_nothing_without_dp(small_split):
    cfg = FedMFConfig(dim=3, rounds=4, biases=True, reg_bias=0.03, offset="user_mean")
    runs = []
    for scale in (1.0, 0.25):
        seeds = SeedTree(1)
        model = FedMF(
            small_split.train, FedMFConfig(**{**cfg.__dict__, "bias_upload_scale": scale}), seeds
        )
        run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=4, progress=False))
        runs.append(model)
    np.testing.assert_allclose(runs[1].V, runs[0].V, rtol=0, atol=1e-9)
    np.testing.assert_allclose(runs[1].item_bias, runs[0].item_bias, rtol=0, atol=1e-9)
    assert np.abs(runs[0].item_bias).max() > 1e-3


def _uploads(split, scale: float, aggregation: str = "fixed"):
    cfg = FedMFConfig(
        dim=3,
        rounds=3,
        biases=True,
        offset="user_mean",
        aggregation=aggregation,
        bias_upload_scale=scale,
    )
    seeds = SeedTree(2)
    model = FedMF(split.train, cfg, seeds)
    batches = []
    model.client_step(0, np.arange(model.n_clients), seeds, batches.append)
    (batch,) = batches
    return batch, cfg


def test_the_scaled_bias_column_is_s_times_the_gradient(small_split):
    one, cfg = _uploads(small_split, 1.0)
    scaled, _ = _uploads(small_split, 0.3)
    d = cfg.dim
    np.testing.assert_array_equal(scaled.rows, one.rows)
    np.testing.assert_allclose(scaled.values[:, :d], one.values[:, :d], rtol=0, atol=1e-15)
    np.testing.assert_allclose(scaled.values[:, d], 0.3 * one.values[:, d], rtol=1e-12, atol=0)


@pytest.mark.parametrize("scale", [0.05, 1.0, 20.0])
def test_one_user_moves_the_clipped_sum_by_at_most_the_clip_whatever_the_bias_scale(
    small_split, scale
):
    # The DP claim of bias_upload_scale: the transport clips the whole block [g, s g_b], so
    # adding or removing one user changes the summed block by at most C in L2 norm.
    clip = 0.5
    batch, _ = _uploads(small_split, scale)
    clipped, norms = clip_row_updates(batch, clip)
    assert norms.max() > clip  # the clip is active: the bound is not met by accident
    for k in range(len(clipped.clients)):
        assert np.linalg.norm(clipped.client_block(k)) <= clip * (1 + 1e-12)
    total = clipped.weighted_sum()
    without_first = total - clipped.client_block(0)
    assert np.linalg.norm(total - without_first) <= clip * (1 + 1e-12)


def test_a_smaller_bias_scale_leaves_more_of_the_clip_to_the_factors(small_split):
    shares = []
    for scale in (1.0, 0.2):
        batch, cfg = _uploads(small_split, scale)
        clipped, _ = clip_row_updates(batch, 0.5)
        factor = np.linalg.norm(clipped.values[:, : cfg.dim])
        shares.append(factor / np.linalg.norm(clipped.values))
    assert shares[1] > shares[0] + 0.05


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"item_damping": -1.0}, "item_damping must be finite"),
        ({"item_damping": 5.0, "aggregation": "fixed"}, "only aggregation='mean'"),
        ({"item_damping": 5.0, "aggregation": "sum"}, "only aggregation='mean'"),
        ({"user_damping": -2.0}, "user_damping must be finite"),
        ({"user_damping": 5.0, "user_step": "sum"}, "use user_step='mean'"),
        ({"bias_upload_scale": 0.5}, "without biases"),
        ({"bias_upload_scale": 0.0, "biases": True}, "bias_upload_scale must be finite"),
        ({"bias_upload_scale": float("inf"), "biases": True}, "bias_upload_scale must be finite"),
    ],
)
def test_the_new_options_refuse(overrides, match):
    with pytest.raises(ValueError, match=match):
        FedMFConfig(**overrides)


def test_the_factored_wasserstein_moments_equal_the_materialised_gradients(small_split):
    cfg = biased_config(variant="fedrec+", dim=4, rounds=3)
    model = FedMF(small_split.train, cfg, SeedTree(0))
    rng = np.random.default_rng(3)
    model.V = rng.normal(size=model.V.shape)
    indptr = np.array([0, 3, 3, 7])
    items = np.array([1, 4, 9, 0, 2, 5, 70])
    data = _RoundData(indptr, items, rng.normal(size=7), np.diff(indptr))
    users = rng.normal(size=(3, cfg.dim))
    got_sum, got_sq = model._gradient_moments(data, users)
    mu = cfg.row_reg_item
    for u in range(3):
        rows = slice(indptr[u], indptr[u + 1])
        g = -2 * data.errors[rows, None] * users[u] + 2 * mu * model.V[items[rows]]
        np.testing.assert_allclose(got_sum[u], g.sum(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_sq[u], (g**2).sum(axis=0), rtol=1e-12, atol=1e-12)


def test_first_occurrences_keep_the_first_draw_of_every_key():
    keys = np.random.default_rng(0).integers(0, 40, 300)
    _, first_index = np.unique(keys, return_index=True)
    expected = np.zeros(len(keys), dtype=bool)
    expected[first_index] = True
    np.testing.assert_array_equal(_first_occurrences(keys), expected)
    assert _first_occurrences(np.zeros(0, dtype=np.int64)).shape == (0,)


def test_a_node_loading_the_broadcast_of_a_biased_model_gets_its_item_biases(small_split):
    # A node holding some users (Flower) learns b_i only from the broadcast: without it, its
    # errors would use its own initial (zero) biases while the server's moved.
    cfg = FedMFConfig(dim=3, rounds=5, biases=True, reg_bias=0.03, offset="user_mean")
    server = _warm(small_split, cfg)
    assert np.abs(server.item_bias).max() > 0
    node = FedMF(small_split.train, cfg, SeedTree(9))
    node.load_broadcast(server.broadcast_state())
    np.testing.assert_array_equal(node.item_bias, server.item_bias)
    with pytest.raises(ValueError, match="item_bias"):
        node.load_broadcast({"V": server.V})
