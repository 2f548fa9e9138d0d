"""Server optimisers (FedOpt, Reddi et al. 2021, Alg. 2): rules, sparse rows, state, refusals."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from securefed.errors import CheckpointError
from securefed.server_optim import SERVER_OPTIMISERS, ServerOptimiser, ServerOptimiserConfig


def _scalar_reference(config: ServerOptimiserConfig, x: float, deltas: list[float]) -> float:
    """One element's trajectory written out with Python floats, independently of the module."""
    m = v = 0.0
    for d in deltas:
        if config.name == "sgd":
            x = x + config.lr * d
            continue
        if config.name == "momentum":
            m = config.momentum * m + d
            x = x + config.lr * m
            continue
        m = config.beta1 * m + (1 - config.beta1) * d
        if config.name == "adam":
            v = config.beta2 * v + (1 - config.beta2) * d * d
        elif config.name == "adagrad":
            v = v + d * d
        else:
            v = v - (1 - config.beta2) * d * d * math.copysign(1.0, v - d * d) * (v != d * d)
        x = x + config.lr * m / (math.sqrt(v) + config.tau)
    return x


@pytest.mark.parametrize("rule", SERVER_OPTIMISERS)
def test_each_rule_matches_its_equation_elementwise(rule):
    config = ServerOptimiserConfig(name=rule, lr=0.3, momentum=0.8, beta1=0.7, beta2=0.95)
    rng = np.random.default_rng(1)
    start = rng.normal(size=(4, 3))
    deltas = rng.normal(size=(5, 4, 3))
    optimiser = ServerOptimiser(config)
    params = start
    for delta in deltas:
        params = optimiser.step("items", params, delta)
    for i, j in np.ndindex(start.shape):
        expected = _scalar_reference(config, float(start[i, j]), list(deltas[:, i, j]))
        assert params[i, j] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_sgd_at_lr_one_is_fedavg_and_leaves_inputs_alone():
    params, update = np.arange(6.0).reshape(2, 3), np.full((2, 3), 0.5)
    before = params.copy()
    result = ServerOptimiser(ServerOptimiserConfig()).step("w", params, update)
    assert np.array_equal(result, before + update)
    assert np.array_equal(params, before)
    assert result.dtype == np.float64


def test_adam_first_step_is_a_normalised_move():
    # m = 0.1 d, sqrt(v) = 0.1 |d|: the first move is lr * d / (|d| + 10 tau), near lr * sign(d).
    config = ServerOptimiserConfig(name="adam", lr=0.01)
    delta = np.array([1e-4, -3.0, 50.0])
    step = ServerOptimiser(config).step("b", np.zeros(3), delta)
    assert np.allclose(step, 0.01 * delta / (np.abs(delta) + 10 * config.tau))


@pytest.mark.parametrize(("rule", "lr"), [("momentum", 1.0), ("adam", 0.1), ("yogi", 0.1)])
def test_momentum_rules_beat_sgd_on_an_ill_conditioned_quadratic(rule, lr):
    target = np.array([[3.0, -2.0], [0.5, 1.0]])
    curvature = np.array([[1e-2, 0.5], [2e-2, 0.3]])

    def loss_after(config: ServerOptimiserConfig, rounds: int) -> float:
        optimiser, x = ServerOptimiser(config), np.zeros_like(target)
        for _ in range(rounds):
            x = optimiser.step("x", x, curvature * (target - x))  # minus the gradient
        return float(np.sum(curvature * (x - target) ** 2))

    sgd_loss = loss_after(ServerOptimiserConfig(), 100)
    assert loss_after(ServerOptimiserConfig(name=rule, lr=lr), 100) < 0.01 * sgd_loss


@pytest.mark.parametrize("rule", SERVER_OPTIMISERS)
def test_rows_step_moves_only_those_rows_and_their_moments(rule):
    config = ServerOptimiserConfig(name=rule, lr=0.2)
    rng = np.random.default_rng(2)
    params, rows = rng.normal(size=(6, 2)), np.array([4, 1])
    sparse, dense = ServerOptimiser(config), ServerOptimiser(config)
    x_sparse, x_dense = params, params[rows]
    for _ in range(4):
        delta = rng.normal(size=(6, 2))
        x_sparse = sparse.step("items", x_sparse, delta, rows=rows)
        x_dense = dense.step("items", x_dense, delta[rows])
    others = np.setdiff1d(np.arange(6), rows)
    assert np.array_equal(x_sparse[others], params[others])
    assert np.array_equal(x_sparse[rows], x_dense)
    for key, value in sparse.state_dict().items():
        if key != "__optimiser__":
            assert not value[others].any()  # untouched rows' moments are still zero
            assert np.array_equal(value[rows], dense.state_dict()[key])


@pytest.mark.parametrize("rule", SERVER_OPTIMISERS)
def test_state_round_trip_resumes_bit_for_bit_through_npz(rule):
    config = ServerOptimiserConfig(name=rule, lr=0.05)
    rng = np.random.default_rng(3)
    deltas = rng.normal(size=(6, 5, 3))
    row_sets = [None, np.array([0, 2]), None, np.array([4]), np.array([1, 3, 0]), None]

    def run(optimiser, x, start, stop):
        for t in range(start, stop):
            x = optimiser.step("items", x, deltas[t], rows=row_sets[t])
            x_bias = optimiser.step("bias", x[:, 0], deltas[t][:, 1])
            x[:, 0] = x_bias
        return x

    whole = run(ServerOptimiser(config), np.ones((5, 3)), 0, 6)
    first = ServerOptimiser(config)
    half = run(first, np.ones((5, 3)), 0, 3)
    buffer = io.BytesIO()
    np.savez(buffer, **first.state_dict())
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as saved:
        resumed = ServerOptimiser(config)
        resumed.load_state_dict(dict(saved))
    assert np.array_equal(run(resumed, half, 3, 6), whole)


def test_load_refuses_state_of_another_rule_or_shape():
    adam = ServerOptimiser(ServerOptimiserConfig(name="adam"))
    adam.step("items", np.zeros((2, 2)), np.ones((2, 2)))
    state = adam.state_dict()
    with pytest.raises(CheckpointError, match="is for 'adam'"):
        ServerOptimiser(ServerOptimiserConfig(name="yogi")).load_state_dict(state)
    momentum_state = {"__optimiser__": np.array("momentum"), "items/v": np.zeros((2, 2))}
    with pytest.raises(CheckpointError, match="not a moment"):
        ServerOptimiser(ServerOptimiserConfig(name="momentum")).load_state_dict(momentum_state)
    lopsided = dict(state, **{"items/v": np.zeros((3, 2))})
    with pytest.raises(CheckpointError, match="shapes"):
        ServerOptimiser(ServerOptimiserConfig(name="adam")).load_state_dict(lopsided)
    with pytest.raises(CheckpointError, match="lacks"):
        ServerOptimiser(ServerOptimiserConfig(name="adam")).load_state_dict({})
    with pytest.raises(CheckpointError, match="finite"):
        bad = dict(state, **{"items/m": np.full((2, 2), np.nan)})
        ServerOptimiser(ServerOptimiserConfig(name="adam")).load_state_dict(bad)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("name", "lamb", "unknown server optimiser"),
        ("lr", 0.0, "lr"),
        ("lr", float("nan"), "lr"),
        ("momentum", 1.0, "momentum"),
        ("beta1", -0.1, "beta1"),
        ("beta2", 1.0, "beta2"),
        ("tau", 0.0, "tau"),
    ],
)
def test_config_refuses_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        ServerOptimiserConfig(**{field: value})


def test_step_refuses_bad_input():
    optimiser = ServerOptimiser(ServerOptimiserConfig(name="momentum"))
    params = np.zeros((3, 2))
    with pytest.raises(ValueError, match="shape"):
        optimiser.step("w", params, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="only finite"):
        optimiser.step("w", params, np.array([[0, 0], [np.inf, 0], [0, 0]]))
    with pytest.raises(ValueError, match="repeat"):
        optimiser.step("w", params, params, rows=np.array([1, 1]))
    with pytest.raises(ValueError, match="outside"):
        optimiser.step("w", params, params, rows=np.array([3]))
    with pytest.raises(ValueError, match="integer"):
        optimiser.step("w", params, params, rows=np.array([0.5]))
    with pytest.raises(ValueError, match="name"):
        optimiser.step("a/b", params, params)
    optimiser.step("w", params, params)
    with pytest.raises(ValueError, match="optimiser state"):
        optimiser.step("w", np.zeros((4, 2)), np.zeros((4, 2)))
    with pytest.raises(TypeError, match="ServerOptimiserConfig"):
        ServerOptimiser("adam")
