"""securefed.torch: parameter vectors, FedAvg / FedOpt and DP-FedAvg with adaptive clipping."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from securefed import (  # noqa: E402
    ClientSampling,
    InsecureParameterError,
    PlaintextTransport,
    RunOptions,
    SeedTree,
    build_transport,
    run_rounds,
)
from securefed.server_optim import ServerOptimiser, ServerOptimiserConfig  # noqa: E402
from securefed.torch import (  # noqa: E402
    AdaptiveClipping,
    FedAvg,
    FedAvgConfig,
    arrays_to_vector,
    geometric_clip_update,
    module_to_vector,
    quantile_split,
    update_noise_multiplier,
    vector_to_arrays,
    vector_to_module,
)


def _linear() -> torch.nn.Module:
    model = torch.nn.Linear(3, 1, bias=True).double()
    vector_to_module(np.array([0.2, -0.1, 0.4, 0.05]), model)
    return model


def _mse(model, batch):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def _clients(sizes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        x = rng.normal(size=(n, 3))
        y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 + 0.1 * rng.normal(size=n)
        out.append((torch.from_numpy(x), torch.from_numpy(y)))
    return out


def _hand_delta(params, x, y, lr):
    """One full-batch SGD step of the MSE on a linear model, by hand: -lr * gradient."""
    w, b = params[:3], params[3]
    residual = x @ w + b - y
    grad = np.concatenate([2 * x.T @ residual / len(y), [2 * residual.mean()]])
    return -lr * grad


def test_vectors_round_trip_a_module_and_a_list_of_arrays():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    vector = module_to_vector(model)
    assert vector.dtype == np.float64 and vector.shape == (4 * 3 + 3 + 3 * 2 + 2,)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    vector_to_module(vector, other)
    assert np.array_equal(module_to_vector(other), vector)
    with pytest.raises(ValueError, match="does not fit"):
        vector_to_module(vector[:-1], other)
    arrays = [np.arange(6.0).reshape(2, 3), np.array(7.0), np.ones((1, 2, 2))]
    back = vector_to_arrays(arrays_to_vector(arrays), arrays)
    for original, restored in zip(arrays, back, strict=True):
        assert restored.shape == original.shape and np.array_equal(restored, original)
    with pytest.raises(ValueError, match="does not fit"):
        vector_to_arrays(np.zeros(3), arrays)


@pytest.mark.parametrize("weighting", ["examples", "uniform"])
def test_fedavg_is_the_hand_computed_weighted_mean_of_the_local_deltas(weighting):
    sizes, lr = [5, 9, 2], 0.05
    clients = _clients(sizes)
    start = module_to_vector(_linear())
    config = FedAvgConfig(client_lr=lr, batch_size=64, weighting=weighting)
    algorithm = FedAvg(_linear(), clients, _mse, config)
    run_rounds(algorithm, PlaintextTransport(), SeedTree(0), RunOptions(rounds=1))
    deltas = np.array([_hand_delta(start, x.numpy(), y.numpy(), lr) for x, y in clients])
    weights = np.array(sizes, float) if weighting == "examples" else np.ones(3)
    expected = start + (weights @ deltas) / weights.sum()
    np.testing.assert_allclose(algorithm.params, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(module_to_vector(algorithm.model), expected, atol=1e-14)


@pytest.mark.parametrize("name", ["momentum", "adam", "yogi"])
def test_the_server_optimiser_steps_with_the_mean_delta(name):
    clients = _clients([4, 6])
    server = ServerOptimiserConfig(name=name, lr=0.3)
    config = FedAvgConfig(client_lr=0.05, batch_size=64, server=server)
    algorithm = FedAvg(_linear(), clients, _mse, config)
    start = algorithm.params.copy()
    reference = ServerOptimiser(server)
    params = {"weight": start[:3].reshape(1, 3), "bias": start[3:]}
    transport = PlaintextTransport()
    for round_id in range(3):
        current = np.concatenate([params["weight"].ravel(), params["bias"]])
        deltas = np.array([_hand_delta(current, x.numpy(), y.numpy(), 0.05) for x, y in clients])
        mean = np.array([4.0, 6.0]) @ deltas / 10.0
        params["weight"] = reference.step("weight", params["weight"], mean[:3].reshape(1, 3))
        params["bias"] = reference.step("bias", params["bias"], mean[3:])
        algorithm.run_round(round_id, np.arange(2), transport, SeedTree(0))
        expected = np.concatenate([params["weight"].ravel(), params["bias"]])
        np.testing.assert_allclose(algorithm.params, expected, rtol=1e-10, atol=1e-13)
    plain = FedAvg(_linear(), clients, _mse, FedAvgConfig(client_lr=0.05, batch_size=64))
    for round_id in range(3):
        plain.run_round(round_id, np.arange(2), PlaintextTransport(), SeedTree(0))
    assert not np.allclose(plain.params, algorithm.params)  # the rule is really used


def test_state_dict_resumes_bit_for_bit():
    clients = _clients([4, 6, 3])
    config = FedAvgConfig(client_lr=0.05, server=ServerOptimiserConfig(name="adam", lr=0.1))
    whole = FedAvg(_linear(), clients, _mse, config)
    run_rounds(whole, PlaintextTransport(), SeedTree(1), RunOptions(rounds=4))
    first = FedAvg(_linear(), clients, _mse, config)
    run_rounds(first, PlaintextTransport(), SeedTree(1), RunOptions(rounds=2))
    second = FedAvg(_linear(), clients, _mse, config)
    second.load_state_dict(first.state_dict())
    run_rounds(second, PlaintextTransport(), SeedTree(1), RunOptions(rounds=4, first_round=2))
    assert np.array_equal(second.params, whole.params)


def test_andrew_split_and_geometric_update():
    a, b = quantile_split(1.0, 2.0, clip=3.0)
    assert a * a + b * b == pytest.approx(9.0)
    # the update's multiplier sigma C / A is Theorem 1's (z^-2 - (2 sigma_b)^-2)^(-1/2)
    assert 1.0 * 3.0 / a == pytest.approx(update_noise_multiplier(1.0, 2.0))
    with pytest.raises(InsecureParameterError, match="count noise"):
        quantile_split(4.0, 2.0, clip=1.0)
    assert geometric_clip_update(1.0, 0.9, 0.5, 0.2) == pytest.approx(np.exp(-0.08))
    assert geometric_clip_update(1.0, 0.1, 0.5, 0.2) > 1.0


def _dp_run(adaptive: AdaptiveClipping | None, noise: float, rounds: int, *, n=40, seed=0):
    sampling = ClientSampling("poisson", 20)
    clients = _clients([6] * n, seed=3)
    transport = build_transport(
        "dp", {"dp.noise_multiplier": noise, "dp.clip": 1.0}, n_clients=n, sample_rate=0.5
    )
    config = FedAvgConfig(client_lr=0.05, sampling=sampling, adaptive_clipping=adaptive)
    algorithm = FedAvg(_linear(), clients, _mse, config)
    history = run_rounds(
        algorithm, transport, SeedTree(seed), RunOptions(rounds=rounds, sampling=sampling)
    )
    return algorithm, transport, history


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")
def test_adaptive_clip_moves_toward_the_target_quantile():
    # a clip far above every update norm falls geometrically, then follows their median
    high = AdaptiveClipping(initial_clip=5.0, target_quantile=0.5, clip_lr=1.0, count_noise=1)
    falling, _, history = _dp_run(high, noise=0.1, rounds=30)
    norms = np.array([r["update_norm_median"] for r in history.rounds])
    clips = np.array(falling.clip_history)
    assert clips[0] == 5.0 and np.all(np.diff(clips[:6]) < 0)
    assert [r["clip"] for r in history.rounds] == falling.clip_history
    ratio = clips[-10:] / norms[-10:]
    assert 0.5 < np.median(ratio) < 2.0  # at the median norm, within a factor of 2
    low = AdaptiveClipping(initial_clip=1e-4, target_quantile=0.5, clip_lr=1.0, count_noise=1)
    rising, _, history = _dp_run(low, noise=0.1, rounds=30)
    assert np.all(np.diff(rising.clip_history[:6]) > 0)
    norms = np.array([r["update_norm_median"] for r in history.rounds])
    assert 0.5 < np.median(np.array(rising.clip_history[-10:]) / norms[-10:]) < 2.0
    # a higher target quantile keeps a higher clip
    upper = AdaptiveClipping(initial_clip=5.0, target_quantile=0.9, clip_lr=1.0, count_noise=1)
    above, _, _ = _dp_run(upper, noise=0.1, rounds=30)
    assert np.median(above.clip_history[-10:]) > np.median(clips[-10:])


def test_the_quantile_noise_is_charged_to_the_same_ledger():
    """At the same noise on the update, adaptive clipping spends more epsilon than fixed."""
    sigma, count_noise = 1.0, 1.0
    adaptive = AdaptiveClipping(initial_clip=1.0, count_noise=count_noise)
    _, with_quantile, _ = _dp_run(adaptive, noise=sigma, rounds=5)
    _, fixed, _ = _dp_run(None, noise=update_noise_multiplier(sigma, count_noise), rounds=5)
    assert with_quantile.ledger.steps == fixed.ledger.steps == 5  # one charge per round
    assert with_quantile.epsilon() > fixed.epsilon() * 1.05


def test_dp_refuses_a_sampling_rate_other_than_the_accountants():
    clients = _clients([6] * 10)
    transport = build_transport("dp", {"dp.noise_multiplier": 1.0}, n_clients=10, sample_rate=0.5)
    algorithm = FedAvg(_linear(), clients, _mse, FedAvgConfig())  # sampling: all, q = 1
    with pytest.raises(InsecureParameterError, match="sampling rate"):
        run_rounds(
            algorithm,
            transport,
            SeedTree(0),
            RunOptions(rounds=1, sampling=ClientSampling("poisson", 5)),
        )


def test_adaptive_clipping_without_dp_is_refused():
    config = FedAvgConfig(adaptive_clipping=AdaptiveClipping())
    algorithm = FedAvg(_linear(), _clients([3, 3]), _mse, config)
    with pytest.raises(InsecureParameterError, match="adaptive_clipping applies to DP"):
        run_rounds(algorithm, PlaintextTransport(), SeedTree(0), RunOptions(rounds=1))


def test_secagg_carries_the_same_mean_as_plaintext():
    clients = _clients([5, 8, 3, 4])
    plain = FedAvg(_linear(), clients, _mse, FedAvgConfig(client_lr=0.05))
    run_rounds(plain, PlaintextTransport(), SeedTree(0), RunOptions(rounds=2))
    masked = FedAvg(_linear(), clients, _mse, FedAvgConfig(client_lr=0.05))
    secagg = build_transport("secagg", n_clients=4, total_rounds=2)
    run_rounds(masked, secagg, SeedTree(0), RunOptions(rounds=2))
    np.testing.assert_allclose(masked.params, plain.params, atol=1e-5)


def test_the_guides_twenty_lines_run(capsys):
    """docs/byom.md's first code block, as written (secure aggregation, 5 rounds)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "byom.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 20
    namespace: dict = {}
    exec(compile(code, "docs/byom.md", "exec"), namespace)
    history = namespace["history"]
    assert history.completed and len(history.rounds) == 5
    assert namespace["transport"].view.transport == "secagg"
    assert "update_norm_median" in capsys.readouterr().out


def test_a_dp_round_that_sampled_no_client_is_refused():
    from securefed import AggregationError

    transport = build_transport("dp", {"dp.noise_multiplier": 1.0}, n_clients=3)
    algorithm = FedAvg(_linear(), _clients([3, 3, 3]), _mse, FedAvgConfig())
    with pytest.raises(AggregationError, match="sampled no client"):
        algorithm.run_round(0, np.zeros(0, np.int64), transport, SeedTree(0))
