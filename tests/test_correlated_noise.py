"""Correlated noise across rounds (DP-FTRL tree, banded matrix mechanism): accounting, noise
covariance, refusals (securefed.privacy.correlated, securefed.transport.correlated)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from securefed.errors import InsecureParameterError, PrivacyBudgetExceeded
from securefed.privacy.accounting import RDP_ORDERS
from securefed.privacy.correlated import (
    BandedNoise,
    CyclicParticipation,
    IndependentNoise,
    TreeNoise,
    prefix_noise_covariance,
    total_sensitivity_sq,
)
from securefed.privacy.ledger import PrivacyLedger
from securefed.randomness import SeedTree
from securefed.runtime import ClientSampling
from securefed.transport import PlaintextTransport, build_transport
from securefed.transport.correlated import CorrelatedDPTransport
from securefed.transport.dp import DPTransport


# ----------------------------------------------------------------------------- helpers
def epsilon_from_zcdp_rdp(rho: float, delta: float) -> float:
    """Epsilon of a rho-zCDP mechanism (RDP alpha rho at every order), converted at ``delta`` by
    Balle et al. 2020, Theorem 21, over the ledger's orders (written here, apart from the
    ledger): ``min_alpha alpha rho + log((alpha - 1) / alpha) - (log delta + log alpha) /
    (alpha - 1)``."""
    best = math.inf
    for alpha in RDP_ORDERS:
        if alpha <= 1.01:
            continue
        value = (
            alpha * rho
            + math.log((alpha - 1) / alpha)
            - (math.log(delta) + math.log(alpha)) / (alpha - 1)
        )
        best = min(best, value)
    return max(best, 0.0)


def central(correlation, *, sigma, groups, rounds, ledger=None, clip=1.0):
    """A :class:`CorrelatedDPTransport` over plaintext."""
    return CorrelatedDPTransport(
        PlaintextTransport(),
        clip=clip,
        noise_multiplier=sigma,
        correlation=correlation,
        groups=groups,
        total_rounds=rounds,
        ledger=ledger,
    )


def drive(transport: CorrelatedDPTransport, rounds: int, n_clients: int, shape, seed=0):
    """Run ``rounds`` rounds of zero updates from the schedule's clients; the released sums."""
    seeds = SeedTree(seed)
    released = []
    for t in range(rounds):
        clients = transport.participation.members(t, n_clients)
        rnd = transport.open_round(t, clients, shape=shape, seeds=seeds)
        for c in clients.tolist():
            rnd.submit(c, np.zeros(shape[0] * shape[1]))
        released.append(rnd.result().total.reshape(-1))
    return np.stack(released)


def tree_prefix_nodes(t: int, restart: int) -> set[tuple[int, int, int]]:
    """The tree nodes (tree, level, start) whose noise the prefix sum of rounds 0..t carries:
    every earlier tree's decomposition of its whole length, and this tree's of ``t % restart +
    1`` leaves (Kairouz et al. 2021, Algorithm 1 with restarts). Written apart from the code."""
    nodes = set()
    for tree in range(t // restart + 1):
        count = restart if tree < t // restart else t % restart + 1
        start = 0
        for level in reversed(range(count.bit_length())):
            if count & (1 << level):
                nodes.add((tree, level, start))
                start += 1 << level
    return nodes


def honaker_prefix_covariance(restart: int, rounds: int) -> np.ndarray:
    """Covariance of the prefix sums read with the best linear unbiased estimate of each node of
    their decomposition from every released node of its subtree (generalised least squares with
    i.i.d. unit node noise: ``a^T (Q^T Q)^-1 Q^T``, ``Q`` the subtree's node-by-leaf matrix, ``a``
    its leaves), which Honaker's bottom-up recursion computes (Honaker 2015). Written apart."""
    index: dict[tuple[int, int, int], int] = {}
    rows = []
    for t in range(rounds):
        coefficients: dict[int, float] = {}
        for tree, level, start in tree_prefix_nodes(t, restart):
            nodes = [
                (tree, lv, st)
                for lv in range(level + 1)
                for st in range(start, start + (1 << level), 1 << lv)
            ]
            leaves = 1 << level
            query = np.zeros((len(nodes), leaves))
            for row, (_, lv, st) in enumerate(nodes):
                query[row, st - start : st - start + (1 << lv)] = 1.0
            gls = np.ones(leaves) @ np.linalg.solve(query.T @ query, query.T)
            for node, weight in zip(nodes, gls, strict=True):
                column = index.setdefault(node, len(index))
                coefficients[column] = coefficients.get(column, 0.0) + weight
        rows.append(coefficients)
    matrix = np.zeros((rounds, len(index)))
    for t, coefficients in enumerate(rows):
        for column, weight in coefficients.items():
            matrix[t, column] = weight
    return matrix @ matrix.T


def banded_prefix_covariance(coefficients: list[float], rounds: int) -> np.ndarray:
    """``B B^T`` with ``B = A C^-1``: the prefix-sum matrix ``A`` times the inverse of the
    banded Toeplitz ``C`` (Choquette-Choo et al. 2023), built here from the coefficients."""
    strategy = np.zeros((rounds, rounds))
    for lag, c in enumerate(coefficients):
        strategy += c * np.eye(rounds, k=-lag)
    workload = np.tril(np.ones((rounds, rounds)))
    decoder = workload @ np.linalg.inv(strategy)
    return decoder @ decoder.T


# ----------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("sigma", [2.0, 7.5])
def test_tree_ledger_epsilon_matches_the_papers_formula(sigma):
    # Kairouz et al. 2021, Appendix D (tf_privacy.compute_rdp_tree_restart): a tree restarted
    # every epoch, each client once per epoch: RDP(alpha) = alpha * sum over epochs of
    # ceil(log2(steps + 1)) / (2 sigma^2). Here 5 epochs of 8 steps: 5 * 4 = 20.
    groups, epochs = 8, 5
    depth_sum = epochs * math.ceil(math.log2(groups + 1))
    ledger = PrivacyLedger()
    transport = central("tree", sigma=sigma, groups=groups, rounds=groups * epochs, ledger=ledger)
    drive(transport, groups * epochs, n_clients=16, shape=(1, 2))
    rho = depth_sum / (2 * sigma**2)
    expected = epsilon_from_zcdp_rdp(rho, 1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    assert ledger.epsilon(1e-5) <= rho + 2 * math.sqrt(rho * math.log(1e5))  # Bun-Steinke bound
    assert math.isinf(ledger.epsilon(1e-5, against="server"))  # central: the server sees it


@pytest.mark.parametrize("groups, rounds", [(4, 32), (2, 16), (8, 64)])
def test_single_tree_without_restart_counts_every_node_a_client_reaches(groups, rounds):
    # One tree over all the rounds (no restart), client in every groups-th leaf (both powers of
    # 2, k = rounds / groups participations): a node of level l < log2(groups) holds at most one
    # of its leaves (rounds / groups such nodes), a node of level l >= log2(groups) holds 2^l /
    # groups (rounds / 2^l nodes). Delta^2 = k log2(groups) + sum_l (rounds / 2^l)(2^l / groups)^2
    # = k (log2(groups) + 2k - 1): the price of no restart, against k ceil(log2(groups + 1)).
    k, sigma = rounds // groups, 20.0
    delta_sq = k * (math.log2(groups) + 2 * k - 1)
    ledger = PrivacyLedger()
    transport = build_transport(
        "dp",
        {"noise_multiplier": sigma, "correlation": "tree", "groups": groups, "restart": rounds},
        total_rounds=rounds,
        n_clients=2 * groups,
        ledger=ledger,
    )
    drive(transport, rounds, n_clients=2 * groups, shape=(1, 1))
    assert transport.tracker.squared == pytest.approx(delta_sq)
    expected = epsilon_from_zcdp_rdp(delta_sq / (2 * sigma**2), 1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    restarted = central("tree", sigma=sigma, groups=groups, rounds=rounds)
    drive(restarted, rounds, n_clients=2 * groups, shape=(1, 1))
    assert restarted.tracker.squared == k * math.ceil(math.log2(groups + 1)) < delta_sq


@pytest.mark.parametrize("bands", [1, 3, 6])
def test_banded_and_independent_ledger_epsilon_match_the_column_norm_formula(bands):
    # Choquette-Choo et al. 2023, Theorem 2: with b-min-separation and at most b bands the
    # columns a client touches have disjoint supports, so Delta^2 = k * ||c||^2 (k its
    # participations); the independent noise is the one-band case, Delta^2 = k.
    groups, k, sigma = 6, 7, 3.0
    coefficients = [math.comb(2 * j, j) / 4**j for j in range(bands)]
    for correlation, norm_sq in (
        (BandedNoise(tuple(coefficients)), sum(c * c for c in coefficients)),
        (IndependentNoise(), 1.0),
    ):
        ledger = PrivacyLedger()
        transport = central(
            correlation, sigma=sigma, groups=groups, rounds=groups * k, ledger=ledger
        )
        drive(transport, groups * k, n_clients=12, shape=(1, 1))
        expected = epsilon_from_zcdp_rdp(k * norm_sq / (2 * sigma**2), 1e-5)
        assert ledger.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)


def test_sensitivity_grows_with_tree_height_and_falls_with_separation():
    # The tree's Delta^2 per pass is its depth; one client in every round (groups=1) of a
    # single 16-leaf tree is in sum_l 16 / 2^l nodes of 2^l of its rounds each.
    one_pass = [total_sensitivity_sq(TreeNoise(b), CyclicParticipation(b), b) for b in (1, 3, 8)]
    assert one_pass == [1.0, 2.0, 4.0]
    every_round = total_sensitivity_sq(TreeNoise(16), CyclicParticipation(1), 16)
    assert every_round == sum((16 >> level) * (1 << level) ** 2 for level in range(5))


def test_calibration_meets_the_target_through_the_registry():
    transport = build_transport(
        "dp",
        {"epsilon": 2.0, "correlation": "banded", "groups": 4},
        total_rounds=24,
        n_clients=8,
        sample_rate=0.25,
    )
    assert isinstance(transport, CorrelatedDPTransport)
    drive(transport, 24, n_clients=8, shape=(1, 3))
    spent = transport.ledger.epsilon(1e-5)
    assert 2.0 - 0.01 <= spent <= 2.0  # noise_for_target stops within 0.01 under the target


# ----------------------------------------------------------------------------- covariance
@pytest.mark.parametrize(
    "correlation, rounds",
    [
        (TreeNoise(8), 13),
        (TreeNoise(8, "honaker"), 13),
        (BandedNoise.sqrt_prefix(4), 10),
        (IndependentNoise(), 6),
    ],
)
def test_released_prefix_sums_carry_the_stated_noise_covariance(correlation, rounds):
    sigma, clip, shape = 1.5, 2.0, (250, 80)  # 20000 coordinates: independent samples
    transport = central(correlation, sigma=sigma, groups=4, rounds=rounds, clip=clip)
    released = drive(transport, rounds, n_clients=4, shape=shape, seed=11)
    prefix = np.cumsum(released, axis=0) / (sigma * clip)
    n = prefix.shape[1]
    empirical = prefix @ prefix.T / n
    if isinstance(correlation, TreeNoise) and correlation.estimator == "honaker":
        stated = honaker_prefix_covariance(correlation.restart, rounds)
    elif isinstance(correlation, TreeNoise):
        sets = [tree_prefix_nodes(t, correlation.restart) for t in range(rounds)]
        stated = np.array([[len(a & b) for b in sets] for a in sets], dtype=float)
    elif isinstance(correlation, BandedNoise):
        stated = banded_prefix_covariance(list(correlation.coefficients), rounds)
    else:
        stated = np.minimum.outer(np.arange(rounds), np.arange(rounds)) + 1.0
    np.testing.assert_allclose(prefix_noise_covariance(correlation, rounds), stated, atol=1e-9)
    # Each entry of a Gaussian sample covariance from n independent coordinates has standard
    # error sqrt((S_ss S_tt + S_st^2) / n); 6 of them bounds every one of the <= 169 entries
    # (a false alarm has probability under 1e-6; the seed fixes it).
    standard_error = np.sqrt((np.outer(np.diag(stated), np.diag(stated)) + stated**2) / n)
    assert np.all(np.abs(empirical - stated) <= 6 * standard_error)
    # And the test can fail: i.i.d. noise is far from the tree's or the banded covariance.
    if not isinstance(correlation, IndependentNoise):
        iid = np.minimum.outer(np.arange(rounds), np.arange(rounds)) + 1.0
        assert np.any(np.abs(empirical - iid) > 6 * standard_error)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["secagg+dp", "dp-local", "ckks+dp"])
def test_correlated_noise_is_refused_outside_central_dp(name):
    with pytest.raises(InsecureParameterError, match="central"):
        build_transport(
            name,
            {"epsilon": 1.0, "correlation": "tree", "groups": 4, "mechanism": "gaussian"},
            total_rounds=8,
            n_clients=8,
        )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"correlation": "tree"}, "needs groups"),
        ({"correlation": "fourier", "groups": 2}, "correlation must be one of"),
        ({"groups": 2}, "belong to correlated noise"),
        ({"correlation": "tree", "groups": 2, "bands": 2}, "applies to correlation 'banded'"),
        ({"correlation": "banded", "groups": 2, "restart": 4}, "applies to correlation 'tree'"),
        ({"correlation": "tree", "groups": 2, "mechanism": "skellam"}, "central Gaussian"),
        ({"correlation": "banded", "groups": 2, "colluders": 1}, "central Gaussian"),
    ],
)
def test_options_that_do_not_apply_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_transport("dp", {"epsilon": 1.0} | options, total_rounds=8, n_clients=8)


def test_schedule_violations_are_refused_before_anything_is_released():
    ledger = PrivacyLedger()
    transport = central("tree", sigma=4.0, groups=2, rounds=3, ledger=ledger)
    seeds = SeedTree(0)
    with pytest.raises(InsecureParameterError, match="outside its group"):
        transport.open_round(0, [0, 1], shape=(1, 1), seeds=seeds)  # client 1 is group 1
    with pytest.raises(ValueError, match="round after round"):
        transport.open_round(1, [1], shape=(1, 1), seeds=seeds)  # round 0 first
    drive(transport, 3, n_clients=4, shape=(1, 1))
    assert ledger.steps > 0
    with pytest.raises(ValueError, match="calibrated for"):
        transport.open_round(3, [1, 3], shape=(1, 1), seeds=seeds)


def test_a_spent_budget_releases_nothing_and_keeps_the_stream():
    ledger = PrivacyLedger(budget=(1.0, 1e-5))
    transport = central("banded", sigma=3.0, groups=1, rounds=50, ledger=ledger)
    with pytest.raises(PrivacyBudgetExceeded):
        drive(transport, 50, n_clients=2, shape=(1, 1))
    assert ledger.epsilon() <= 1.0
    assert transport.stream_round == ledger.steps  # the refused round moved nothing


def test_cyclic_sampling_claims_no_amplification():
    sampling = ClientSampling("cyclic", groups=3)
    assert sampling.sample(7, np.random.default_rng(0), round_id=4).tolist() == [1, 4]
    with pytest.raises(ValueError, match="round id"):
        sampling.sample(7, np.random.default_rng(0))
    with pytest.raises(ValueError, match="groups"):
        ClientSampling("cyclic")
    ledger = PrivacyLedger(sampling="cyclic")
    # Plain DP-FedAvg charged at the schedule's rate 1/3 would claim random sampling.
    with pytest.raises(InsecureParameterError, match="cyclic schedule"):
        DPTransport(
            PlaintextTransport(), clip=1.0, noise_multiplier=1.0, sample_rate=1 / 3, ledger=ledger
        )


def test_fedmf_runs_on_the_cyclic_schedule_within_its_target(small_split):
    from securefed.audit import audit
    from securefed.bench.experiment import FedMFRun, run_fedmf
    from securefed.recsys.fedmf import dp_biased_config

    run = FedMFRun(
        config=dp_biased_config(rounds=12),
        transport="dp",
        seed=0,
        progress=False,
        sampling=ClientSampling("cyclic", groups=3),
        transport_options={"epsilon": 4.0, "correlation": "tree", "groups": 3},
    )
    record, _, transport = run_fedmf(small_split, run)
    assert 4.0 - 0.01 <= record["epsilon"] <= 4.0
    assert math.isinf(record["epsilon_server"])
    public = {k: v for k, v in transport.view.public.items() if k != "privacy_ledger"}
    assert "unknown-key" not in audit(public).codes
    # Every user took part in 4 of the 12 rounds (its group's), none in another's.
    for round_view in transport.view:
        assert set((np.asarray(round_view.clients) % 3).tolist()) == {round_view.round_id % 3}


def test_honaker_reads_the_same_release_so_it_costs_the_same():
    schedule = CyclicParticipation(4)
    plain = total_sensitivity_sq(TreeNoise(4), schedule, 24)
    assert total_sensitivity_sq(TreeNoise(4, "honaker"), schedule, 24) == plain
    # ... and carries less noise on every prefix of two or more leaves of a tree.
    less = np.diag(prefix_noise_covariance(TreeNoise(4, "honaker"), 8))
    more = np.diag(prefix_noise_covariance(TreeNoise(4), 8))
    assert np.all(less <= more + 1e-12) and less[1] < more[1]


def test_the_command_line_runs_the_banded_mechanism_on_the_cyclic_schedule(tmp_path, capsys):
    import json

    from securefed.bench.cli import main

    out = tmp_path / "run.json"
    argv = ["fedmf", "--preset", "dp-biased", "--rounds", "4", "--seed", "0", "--no-progress"]
    transport = ["--transport", "dp:correlation=banded,groups=2", "--epsilon", "4"]
    code = main([*argv, *transport, "--cyclic-groups", "2", "--json", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert 3.99 <= record["epsilon"] <= 4.0
    assert record["sampling"] == {"mode": "cyclic", "clients_per_round": None, "groups": 2}
    # Without the schedule the transport refuses the first round (everyone asked).
    capsys.readouterr()
    assert main([*argv, *transport, "--json", str(out)]) == 2
    assert "outside its group" in capsys.readouterr().err
