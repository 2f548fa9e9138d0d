"""securefed.torch: parameter vectors, FedAvg / FedOpt and DP-FedAvg with adaptive clipping."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from securefed import (  # noqa: E402
    ALL_PAYLOADS,
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
    Client,
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
    stated = FedAvgConfig(sampling=ClientSampling())  # sampling: all, q = 1
    algorithm = FedAvg(_linear(), clients, _mse, stated)
    with pytest.raises(InsecureParameterError, match="sampling"):
        run_rounds(
            algorithm,
            transport,
            SeedTree(0),
            RunOptions(rounds=1, sampling=ClientSampling("poisson", 5)),
        )
    # a transport charging another rate than the run samples at is refused too
    transport = build_transport("dp", {"dp.noise_multiplier": 1.0}, n_clients=10, sample_rate=0.8)
    algorithm = FedAvg(_linear(), clients, _mse, FedAvgConfig())
    with pytest.raises(InsecureParameterError, match=r"sampling rate 0\.5"):
        run_rounds(
            algorithm,
            transport,
            SeedTree(0),
            RunOptions(rounds=1, sampling=ClientSampling("poisson", 5)),
        )


def test_the_sampling_is_stated_once_in_run_options():
    """FedAvgConfig.sampling left None: the fixed denominator uses the run's rate, and equals
    the run where it is stated twice."""
    clients = _clients([6] * 10)
    sampling = ClientSampling("poisson", 5)
    params = []
    for config in (FedAvgConfig(), FedAvgConfig(sampling=sampling)):
        transport = build_transport(
            "dp", {"dp.noise_multiplier": 1.0}, n_clients=10, sample_rate=0.5
        )
        algorithm = FedAvg(_linear(), clients, _mse, config)
        run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=2, sampling=sampling))
        params.append(algorithm.params)
    assert np.array_equal(params[0], params[1])


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


# ------------------------------------------------------------------------------ private parameters
class _PerUser(torch.nn.Module):
    """NCF/FedMF in small: ``r_ui = p_u . q_i + b_i``, ``p_u`` the device's own user vector."""

    def __init__(self, n_items: int, dim: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.user = torch.nn.Parameter(torch.randn(dim, generator=g, dtype=torch.float64) * 0.5)
        self.item = torch.nn.Parameter(
            torch.randn(n_items, dim, generator=g, dtype=torch.float64) * 0.5
        )
        self.item_bias = torch.nn.Parameter(torch.zeros(n_items, dtype=torch.float64))

    def forward(self, items):
        return self.item[items] @ self.user + self.item_bias[items]


def _rating_loss(model, batch):
    items, ratings = batch
    return ((model(items) - ratings) ** 2).mean()


def _rating_clients(n_clients=6, n_items=10, seed=0, dim=3, private=True):
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(n_clients):
        items = rng.choice(n_items, size=int(rng.integers(3, 7)), replace=False)
        ratings = rng.normal(3.0, 1.0, size=len(items))
        own = torch.from_numpy(rng.normal(0.0, 0.5, size=dim))
        examples = (torch.from_numpy(items), torch.from_numpy(ratings))
        clients.append(Client(examples, private={"user": own} if private else {}))
    return clients


def _private_config(**more):
    return FedAvgConfig(client_lr=0.1, batch_size=64, private_parameters=("user",), **more)


def _payload_values(view):
    for round_id in view.rounds_with_payloads():
        round_view = view.round(round_id)
        for client in round_view.clients.tolist():
            yield round_id, client, np.asarray(round_view.payload(client)["values"]).reshape(-1)


@pytest.mark.parametrize("mark_private", [True, False])
def test_the_server_sees_no_element_of_a_private_user_embedding(mark_private):
    """The attack: search every payload the server kept for the user vector's update."""
    n_items, dim = 10, 3
    clients = _rating_clients(n_items=n_items, dim=dim, private=mark_private)
    config = _private_config() if mark_private else FedAvgConfig(client_lr=0.1, batch_size=64)
    algorithm = FedAvg(_PerUser(n_items, dim), clients, _rating_loss, config)
    transport = PlaintextTransport(keep_payloads=ALL_PAYLOADS)
    before = [s["user"].clone() for s in algorithm.private_state] if mark_private else None
    run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=1))
    shared = n_items * dim + n_items
    payloads = list(_payload_values(transport.view))
    assert len(payloads) == len(clients)
    found = 0
    for _, client, values in payloads:
        if not mark_private:  # everything uploaded: the user vector's delta is right there
            assert values.size == shared + dim
            found += int(np.abs(values[:dim]).min() > 0)  # the user's own update, readable
            continue
        assert values.size == shared  # only q and b travel
        moved = (algorithm.private_state[client]["user"] - before[client]).numpy()
        assert np.abs(moved).max() > 0  # the private vector was trained on the device
        assert not np.isin(moved, values).any()
        assert not np.isin(algorithm.private_state[client]["user"].numpy(), values).any()
    if not mark_private:
        assert found == len(clients)  # the search does find it when it is uploaded


def test_perturbing_one_clients_private_embedding_changes_nothing_else_the_server_sees():
    n_items, dim = 10, 3
    views = []
    for shift in (0.0, 1.0):
        clients = _rating_clients(n_items=n_items, dim=dim)
        clients[0].private["user"].add_(shift)
        algorithm = FedAvg(_PerUser(n_items, dim), clients, _rating_loss, _private_config())
        transport = PlaintextTransport(keep_payloads=ALL_PAYLOADS)
        run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=1))
        views.append({c: v for _, c, v in _payload_values(transport.view)})
    assert views[0].keys() == views[1].keys()
    for client in views[0]:
        assert views[0][client].size == views[1][client].size == n_items * dim + n_items
        if client != 0:  # another client's upload does not depend on client 0's vector
            assert np.array_equal(views[0][client], views[1][client])
    assert not np.array_equal(views[0][0], views[1][0])  # client 0 trained with its own


def test_dp_clips_and_charges_exactly_the_uploaded_part():
    n_items, dim, clip = 10, 3, 0.05
    clients = _rating_clients(n_items=n_items, dim=dim)
    algorithm = FedAvg(_PerUser(n_items, dim), clients, _rating_loss, _private_config())
    start = algorithm.params.copy()
    starts = [s["user"].clone() for s in algorithm.private_state]
    deltas = []
    for k in range(len(clients)):  # each client's own shared delta, by the same local training
        deltas.append(algorithm.local_delta(k, SeedTree(0).generator("fedavg", 0, k)))
        algorithm.private_state[k]["user"] = starts[k].clone()
        assert np.array_equal(algorithm.params, start)
    transport = build_transport(
        "dp",
        {"dp.noise_multiplier": 1.0, "dp.clip": clip},
        n_clients=len(clients),
        keep_payloads=ALL_PAYLOADS,
    )
    run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=1))
    for _, client, values in _payload_values(transport.view):
        assert values.size == n_items * dim + n_items
        norm = np.linalg.norm(deltas[client])
        assert norm > clip  # the clip is active, on the shared part's own norm
        np.testing.assert_allclose(values, deltas[client] * clip / norm, rtol=1e-9, atol=1e-15)
    assert transport.ledger.steps == 1  # one charge for the round, at (sigma 1, q 1)
    round_view = transport.view.round(0)
    assert round_view.public["dp_clip"] == clip and round_view.public["dp_sigma"] == 1.0
    total = np.asarray(round_view.aggregate["dp_total"]).reshape(-1)  # the released sum
    assert total.size == n_items * dim + n_items  # noise on the uploaded part alone
    noise = total - sum(values for _, _, values in _payload_values(transport.view))
    # 40 Gaussian draws of std sigma * clip: the sample std is within 0.5..1.6x (over 4 sd)
    assert 0.5 * clip < noise.std() < 1.6 * clip


def test_private_parameters_resume_bit_for_bit_from_a_checkpoint(tmp_path):
    n_items, dim = 10, 3
    config = _private_config(server=ServerOptimiserConfig(name="adam", lr=0.05))
    options = RunOptions(rounds=4, sampling=ClientSampling("fixed", 3))

    def fresh():
        return FedAvg(_PerUser(n_items, dim), _rating_clients(), _rating_loss, config)

    whole = fresh()
    run_rounds(whole, PlaintextTransport(), SeedTree(1), options)
    first = fresh()
    half = RunOptions(rounds=2, sampling=options.sampling, checkpoint_dir=tmp_path)
    run_rounds(first, PlaintextTransport(), SeedTree(1), half)
    second = fresh()
    resumed = RunOptions(rounds=4, sampling=options.sampling, checkpoint_dir=tmp_path)
    run_rounds(second, PlaintextTransport(), SeedTree(1), resumed)
    assert np.array_equal(second.params, whole.params)
    for ours, theirs in zip(second.private_state, whole.private_state, strict=True):
        assert torch.equal(ours["user"], theirs["user"])
    assert not torch.equal(whole.private_state[0]["user"], _rating_clients()[0].private["user"])
    state = whole.state_dict()
    assert state["client/0/user"].shape == (dim,)
    assert np.array_equal(whole.client_model(0).user.detach().numpy(), state["client/0/user"])


def test_private_and_shared_sets_are_checked():
    model = _PerUser(10, 3)
    with pytest.raises(ValueError, match=r"\['user'\] are marked private and also listed"):
        FedAvgConfig(private_parameters=("user",), shared_parameters=("user", "item"))
    config = FedAvgConfig(private_parameters=("user",), shared_parameters=("item",))
    with pytest.raises(ValueError, match=r"\['item_bias'\] are neither shared nor private"):
        FedAvg(model, _rating_clients(), _rating_loss, config)
    with pytest.raises(ValueError, match="no trainable parameter \\['users'\\]"):
        FedAvg(model, _rating_clients(), _rating_loss, FedAvgConfig(private_parameters=("users",)))
    clients = _rating_clients()
    clients[2] = Client(clients[2].examples, private={"user": torch.zeros(4, dtype=torch.float64)})
    with pytest.raises(ValueError, match="client 2's private user has shape"):
        FedAvg(model, clients, _rating_loss, _private_config())
    every = ("user", "item", "item_bias")
    with pytest.raises(ValueError, match="nothing to federate"):
        FedAvg(model, clients, _rating_loss, FedAvgConfig(private_parameters=every))


def test_a_clients_context_comes_whole_with_every_minibatch():
    seen = []

    def loss(model, batch):
        x, y, history = batch
        seen.append((len(x), len(history)))
        return ((model(x).squeeze(-1) - y) ** 2).mean() + 0 * history.sum()

    x, y = _clients([7])[0]
    client = Client((x, y), context=(torch.arange(11.0),))
    algorithm = FedAvg(_linear(), [client], loss, FedAvgConfig(batch_size=3))
    run_rounds(algorithm, PlaintextTransport(), SeedTree(0), RunOptions(rounds=1))
    assert seen == [(3, 11), (3, 11), (1, 11)]
