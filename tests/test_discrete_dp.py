"""Distributed DP in integers: exact samplers, the accountant, rotation, rounding, wrap, refusals.

Each claim is tested against an independent computation or by trying to break it: the sampler
against its probability mass function (chi-square, fixed generator, significance 0.001, with a
wrong-variance control that the same test rejects); the accountant against the exact Rényi
divergence of the sum of discrete Gaussians (and of Skellam), computed by convolving the PMFs in
log space; the wrap bound against simulated sums; the minimum-contributors rule by dropping
clients; the ledger's figure against the accountant's, recomputed from the round's public record.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from securefed import PlaintextTransport, SeedTree
from securefed.errors import AggregationError, InsecureParameterError, PrivacyBudgetExceeded
from securefed.privacy.discrete import (
    DiscreteRelease,
    bernoulli_exp_neg,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_sum_rdp,
    discrete_laplace,
    integer_l1_bound,
    rounded_l2_bound,
    skellam,
    skellam_rdp,
)
from securefed.privacy.ledger import PrivacyLedger, epsilon_of_history, epsilon_with_discrete
from securefed.transport.ddp import (
    DistributedIntegerMechanism,
    conditional_round,
    hadamard,
    noise_for_integer_target,
    padded_dim,
    plan_mechanism,
    rotate,
    rotation_signs,
    unrotate,
    wrap_probability_bound,
)
from securefed.transport.dp import DPTransport
from securefed.transport.registry import build_transport
from securefed.transport.secagg import SecAggConfig, SecAggTransport

ORDERS = [1.5, 2, 4, 8, 16, 32]
SIGNIFICANCE = 1e-3


# ----------------------------------------------------------------------------- samplers
def _chi_square_p(draws: np.ndarray, sigma2: float, reach: int) -> float:
    """p-value of ``draws`` against N_Z(0, sigma2), cells -reach..reach and the two tails."""
    support = np.arange(-reach, reach + 1)
    probs = discrete_gaussian_pmf(sigma2, support)
    tail = (1 - probs.sum()) / 2
    expected = np.concatenate([[tail], probs, [tail]]) * draws.size
    clipped = np.clip(draws, -reach - 1, reach + 1) + reach + 1
    observed = np.bincount(clipped, minlength=2 * reach + 3)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("sigma2", [1, 4, 30])
def test_discrete_gaussian_matches_its_pmf(sigma2):
    rng = np.random.default_rng(20240601)
    draws = discrete_gaussian(sigma2, 40_000, rng)
    reach = int(3 * math.sqrt(sigma2))
    assert _chi_square_p(draws, sigma2, reach) > SIGNIFICANCE
    # The same test rejects the law of a slightly wrong variance: it can fail.
    assert _chi_square_p(draws, sigma2 * 1.15, reach) < SIGNIFICANCE


def test_discrete_gaussian_large_variance_moments():
    rng = np.random.default_rng(7)
    draws = discrete_gaussian(275_638, 200_000, rng)
    assert abs(draws.mean()) < 5 * math.sqrt(275_638 / draws.size)
    assert draws.var() == pytest.approx(275_638, rel=0.02)


@pytest.mark.parametrize("num,den", [(3, 10), (5, 2), (0, 1), (7, 1)])
def test_bernoulli_exp_neg_frequency(num, den):
    rng = np.random.default_rng(11)
    n = 100_000
    hits = bernoulli_exp_neg(np.full(n, num), np.full(n, den), rng).mean()
    p = math.exp(-num / den)
    assert abs(hits - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_discrete_laplace_matches_its_pmf():
    rng = np.random.default_rng(3)
    t, reach = 3, 8
    draws = discrete_laplace(t, 40_000, rng)
    support = np.arange(-reach, reach + 1)
    weights = np.exp(-np.abs(support) / t)
    norm = (1 + math.exp(-1 / t)) / (1 - math.exp(-1 / t))
    probs = weights / norm
    tail = (1 - probs.sum()) / 2
    expected = np.concatenate([[tail], probs, [tail]]) * draws.size
    observed = np.bincount(np.clip(draws, -reach - 1, reach + 1) + reach + 1)
    assert stats.chisquare(observed, expected).pvalue > SIGNIFICANCE


def test_sampler_refuses_non_integer_variance_and_global_rng():
    with pytest.raises(ValueError, match="integer"):
        discrete_gaussian(2.5, 10, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        discrete_gaussian(4, 10, np.random)


def test_skellam_moments():
    draws = skellam(50.0, 100_000, np.random.default_rng(5))
    assert draws.var() == pytest.approx(100.0, rel=0.03)


# ----------------------------------------------------------------------------- accountant
def _log_sum_pmf(sigma2: float, n: int, reach: int) -> np.ndarray:
    """log PMF of the sum of n N_Z(0, sigma2), on -n*reach..n*reach (log-space convolution)."""
    k = np.arange(-reach, reach + 1)
    wide = np.arange(-40 * reach, 40 * reach + 1)
    one = -(k * k) / (2 * sigma2) - logsumexp(-(wide * wide) / (2 * sigma2))
    out = one
    for _ in range(n - 1):
        conv = np.full(out.size + one.size - 1, -np.inf)
        for i, value in enumerate(out):
            conv[i : i + one.size] = np.logaddexp(conv[i : i + one.size], value + one)
        out = conv
    return out


def _renyi(log_p: np.ndarray, log_q: np.ndarray, alpha: float) -> float:
    """D_alpha(P || Q) from log PMFs on a common support."""
    return float(logsumexp(alpha * log_p + (1 - alpha) * log_q) / (alpha - 1))


@pytest.mark.parametrize(
    "sigma2,n,shift", [(0.3, 3, 1), (0.5, 4, 1), (1.0, 5, 2), (0.26, 8, 1), (2.0, 3, 3)]
)
def test_sum_of_discrete_gaussians_bound_holds_against_exact_divergence(sigma2, n, shift):
    log_p = _log_sum_pmf(sigma2, n, 60)
    log_q = np.concatenate([np.full(shift, -np.inf), log_p[:-shift]])  # the sum shifted
    inner = slice(shift, -shift)
    exact = np.array([_renyi(log_q[inner], log_p[inner], a) for a in ORDERS])
    bound = discrete_gaussian_sum_rdp(ORDERS, sigma2, n, shift, shift, 1)
    assert np.all(bound >= exact - 1e-9)
    # Where tau is negligible the bound is the Gaussian figure and the exact divergence meets it.
    if sigma2 >= 1:
        np.testing.assert_allclose(bound, exact, rtol=2e-3)


def test_sum_bound_is_the_gaussian_rdp_for_large_variance():
    """Independent figure: with tau ~ 0 the sum's RDP is alpha l2^2 / (2 n sigma^2), so its
    epsilon is Opacus's for the Gaussian of multiplier sqrt(n sigma^2) / l2."""
    sigma2, n, l2 = 10_000.0, 100, 350.0
    release = DiscreteRelease("discrete_gaussian", sigma2, n, l2, integer_l1_bound(l2, 64), 64)
    ours = epsilon_with_discrete([], [(release, 10)], 1e-5)
    opacus = epsilon_of_history([(math.sqrt(n * sigma2) / l2, 1.0, 10)], 1e-5)
    assert ours == pytest.approx(opacus, rel=1e-9)


@pytest.mark.parametrize("mu,shift", [(2.0, 1), (5.0, 1), (20.0, 2), (100.0, 3)])
def test_skellam_bound_holds_against_exact_divergence(mu, shift):
    k = np.arange(-3000, 3001)
    log_p = stats.skellam.logpmf(k, mu, mu)
    log_q = stats.skellam.logpmf(k - shift, mu, mu)
    finite = np.isfinite(log_p) & np.isfinite(log_q)
    exact = np.array([_renyi(log_q[finite], log_p[finite], a) for a in ORDERS])
    assert np.all(skellam_rdp(ORDERS, mu, shift, shift) >= exact - 1e-9)


def test_rounded_norm_bound_and_l1():
    assert rounded_l2_bound(1.0, 0.01, 64, 0.0) == pytest.approx(1.0 + 0.01 * 8)
    assert rounded_l2_bound(1.0, 0.01, 64, math.exp(-0.5)) < 1.0 + 0.01 * 8
    assert integer_l1_bound(3.0, 100) == 9.0  # |v_j| <= v_j^2 for integers
    assert integer_l1_bound(30.0, 4) == 60.0


# ----------------------------------------------------------------------------- rotation, rounding
def test_rotation_is_orthogonal_and_invertible():
    length = 64
    matrix = hadamard(np.eye(length))
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(length), atol=1e-12)
    signs = rotation_signs(b"public seed of the round, 32 b.", length)
    x = np.random.default_rng(0).normal(size=(3, length))
    y = rotate(x, signs)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1))
    np.testing.assert_allclose(unrotate(y, signs), x, atol=1e-12)
    assert padded_dim(1000) == 1024 and padded_dim(1024) == 1024
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(np.ones(12))


def test_rotation_flattens_a_spike():
    signs = rotation_signs(b"another public seed of 32 bytes", 4096)
    spike = np.zeros(4096)
    spike[17] = 1.0
    assert np.abs(rotate(spike, signs)).max() == pytest.approx(1 / 64)


def test_conditional_rounding_keeps_its_norm_bound():
    rng = np.random.default_rng(1)
    scaled = rng.normal(size=(200, 256))
    scaled *= 40 / np.linalg.norm(scaled, axis=1, keepdims=True)
    bound = rounded_l2_bound(40.0, 1.0, 256, math.exp(-0.5))
    rounded = conditional_round(scaled, bound, rng)
    assert np.all(np.einsum("ij,ij->i", rounded, rounded) <= math.floor(bound**2))
    assert np.all(np.abs(rounded - scaled) < 1)
    with pytest.raises(ValueError, match="not clipped"):
        conditional_round(scaled * 3, bound, rng, max_tries=3)


# ----------------------------------------------------------------------------- modular wrap
def _wrap_frequency(mechanism: DistributedIntegerMechanism, n: int, trials: int) -> float:
    """How often the integer sum of n aligned clipped updates leaves [-m/2, m/2).

    Every client sends ``clip`` along the first axis (the worst signal). The rotation of such a
    spike is ``+-clip / sqrt(D)`` in every coordinate whatever the signs, so one sign vector
    serves all trials, encoded in one call (trials x n rows).
    """
    rng = np.random.default_rng(9)
    half = mechanism.modulus // 2
    x = np.zeros((trials * n, mechanism.dim))
    x[:, 0] = mechanism.clip
    signs = rotation_signs(b"the wrap test's public seed 32 b", mechanism.padded)
    totals = mechanism.encode(x, signs, rng).reshape(trials, n, -1).sum(axis=1)
    return float(np.mean(np.any((totals < -half) | (totals >= half), axis=1)))


def test_wrap_frequency_stays_under_the_bound():
    mechanism = plan_mechanism(
        "discrete_gaussian",
        bits=8,
        clip=1.0,
        noise_std=2.0,
        n_clients=6,
        dim=16,
        min_contributors=6,
        wrap_target=0.2,
    )
    bound = mechanism.wrap_bound(6)
    assert bound == pytest.approx(0.2, rel=0.05)
    frequency = _wrap_frequency(mechanism, 6, 2000)
    assert frequency <= bound + 3 * math.sqrt(bound * (1 - bound) / 2000)
    # Twice as coarse a modulus for the same granularity wraps far more than its bound allows
    # the planned one: the bound is not vacuous.
    squeezed = DistributedIntegerMechanism(
        "discrete_gaussian", 5, 1.0, mechanism.gamma, 16, mechanism.beta, mechanism.noise, 6
    )
    assert _wrap_frequency(squeezed, 6, 500) > 0.5


def test_wrap_bound_formula():
    m = 1 << 10
    v = 4 * 4 * 1.0 / (0.1**2 * 16) + 4 / 4 + 50.0
    expected = 2 * 16 * math.exp(-(m * m) / (8 * v))
    assert wrap_probability_bound(10, 4, 1.0, 0.1, 16, 50.0) == pytest.approx(expected)


# ----------------------------------------------------------------------------- the transport
def _integer_secagg() -> SecAggTransport:
    return SecAggTransport(SecAggConfig(bits=32, scale=1.0, clip=2.0**21))


def _updates(n: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, shape[0] * shape[1]))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * 0.8


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_secagg_sums_the_integers_exactly(mechanism):
    """The same clients' integers through secure aggregation and in the clear decode to the
    same sum bit for bit: the ring carries the integers exactly (no float noise, no rounding)."""
    shape, n = (12, 5), 8
    x = _updates(n, shape)
    totals = []
    for inner in (_integer_secagg(), PlaintextTransport()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # distributed DP over plaintext warns (a stand-in)
            dp = DPTransport(
                inner,
                clip=1.0,
                noise_multiplier=0.5,
                placement="distributed",
                mechanism=mechanism,
                modulus_bits=16,
                delta=1e-5,
            )
        rnd = dp.open_round(0, range(n), shape=shape, seeds=SeedTree(4))
        for c in range(n):
            rnd.submit(c, x[c])
        totals.append(rnd.result().total)
    np.testing.assert_array_equal(totals[0], totals[1])
    error = totals[0].ravel() - x.sum(axis=0)
    assert abs(error.std() - 0.5) < 0.15  # sigma * clip on the sum


def test_fewer_contributors_than_the_minimum_are_refused():
    dp = DPTransport(
        _integer_secagg(),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        mechanism="discrete_gaussian",
        min_contributors=5,
        delta=1e-5,
    )
    x = _updates(6, (4, 4))
    rnd = dp.open_round(0, range(6), shape=(4, 4), seeds=SeedTree(0))
    for c in range(4):
        rnd.submit(c, x[c])
    rnd.drop(4)
    rnd.drop(5)
    with pytest.raises(AggregationError, match="fewer than the minimum of 5"):
        rnd.result()
    with pytest.raises(AggregationError):
        rnd.inner.result()  # the inner round is sealed behind the rule too
    assert dp.ledger.steps == 0
    with pytest.raises(AggregationError, match="fewer than the minimum"):
        dp.open_round(1, range(4), shape=(4, 4), seeds=SeedTree(0))


def test_ledger_charges_the_integer_accountant():
    ledger = PrivacyLedger(budget=(50.0, 1e-5))
    n, shape = 6, (8, 4)
    dp = DPTransport(
        _integer_secagg(),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        ledger=ledger,
        mechanism="discrete_gaussian",
        modulus_bits=16,
        min_contributors=n - 1,
    )
    x = _updates(n, shape)
    rnd = dp.open_round(0, range(n), shape=shape, seeds=SeedTree(2))
    for c in range(n - 1):
        rnd.submit(c, x[c])
    rnd.drop(n - 1)
    rnd.result()
    public = rnd.view.public
    # The release recomputed from the round's public record alone, with n - 1 contributors
    # (the noise that is in the sum, not the n planned).
    gamma, dim = public["ddp_gamma"], public["ddp_padded_dim"]
    l2 = rounded_l2_bound(1.0, gamma, dim, public["ddp_beta"]) / gamma
    release = DiscreteRelease(
        "discrete_gaussian", public["ddp_noise"], n - 1, l2, integer_l1_bound(l2, dim), dim
    )
    assert ledger.epsilon() == pytest.approx(epsilon_with_discrete([], [(release, 1)], 1e-5))
    assert ledger.epsilon(against="server") == pytest.approx(ledger.epsilon())
    assert public["dp_contributors"] == n - 1
    planned = DiscreteRelease("discrete_gaussian", release.noise, n, l2, release.l1, dim)
    assert ledger.epsilon() > epsilon_with_discrete([], [(planned, 1)], 1e-5)
    # No Gaussian charge was made: the integer accountant's is the only one.
    assert ledger.history == [] and ledger.discrete_history == [(release, 1)]


def test_budget_stops_integer_rounds_and_calibration_meets_the_target():
    dp = build_transport(
        "secagg+dp:mechanism=discrete_gaussian,epsilon=3,dp.clip=1.0",
        n_clients=10,
        total_rounds=2,
        sample_rate=1.0,
    )
    x = _updates(10, (6, 2))
    for round_id in range(2):
        rnd = dp.open_round(round_id, range(10), shape=(6, 2), seeds=SeedTree(0))
        for c in range(10):
            rnd.submit(c, x[c])
        rnd.result()
    assert 2.9 < dp.epsilon() <= 3.0
    sigma = noise_for_integer_target(
        "discrete_gaussian",
        3.0,
        1e-5,
        2,
        bits=20,
        clip=1.0,
        n_clients=10,
        dim=12,
        min_contributors=10,
    )
    assert dp.config.noise_multiplier == sigma
    with pytest.raises(PrivacyBudgetExceeded):
        dp.open_round(2, range(10), shape=(6, 2), seeds=SeedTree(0))


def test_ledger_state_round_trips_discrete_history(tmp_path):
    ledger = PrivacyLedger(budget=(10.0, 1e-5))
    release = DiscreteRelease("skellam", 40.0, 12, 30.0, 200.0, 64)
    ledger.charge_discrete(release, server=release, steps=3)
    path = ledger.save(tmp_path / "ledger.json")
    loaded = PrivacyLedger.load(path)
    assert loaded.discrete_history == [(release, 3)]
    assert loaded.epsilon() == ledger.epsilon()
    assert PrivacyLedger(budget=(10.0, 1e-5)).resume_conflicts(ledger.state_dict()) == []
    with pytest.raises(ValueError, match="rdp"):
        PrivacyLedger("prv").charge_discrete(release, server=release)


def test_integer_mechanisms_refuse_what_does_not_apply():
    with pytest.raises(InsecureParameterError, match="distributed placement"):
        DPTransport(PlaintextTransport(), clip=1.0, noise_multiplier=1.0, mechanism="skellam")
    with pytest.raises(InsecureParameterError, match="scale 1"):
        DPTransport(
            SecAggTransport(SecAggConfig(scale=2.0**16)),
            clip=1.0,
            noise_multiplier=1.0,
            placement="distributed",
            mechanism="discrete_gaussian",
        )
    with pytest.raises(InsecureParameterError, match="remote"):
        DPTransport(
            SecAggTransport(SecAggConfig(bits=32, scale=1.0, clip=2.0**21), remote_clients=True),
            clip=1.0,
            noise_multiplier=1.0,
            placement="distributed",
            mechanism="discrete_gaussian",
        )
    with pytest.raises(InsecureParameterError, match="cryptographic"):
        DPTransport(
            _integer_secagg(),
            clip=1.0,
            noise_multiplier=1.0,
            placement="distributed",
            mechanism="discrete_gaussian",
            secure=True,
        )
    with pytest.raises(ValueError, match="secagg"):
        build_transport("dp:mechanism=discrete_gaussian,noise_multiplier=1")
    with pytest.raises(ValueError, match="ring itself"):
        build_transport("secagg+dp:mechanism=skellam,noise_multiplier=1,secagg.scale=2**16")
    dp = DPTransport(
        _integer_secagg(),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        mechanism="discrete_gaussian",
        delta=1e-5,
    )
    rnd = dp.open_round(0, range(3), shape=(2, 2), seeds=SeedTree(0))
    with pytest.raises(InsecureParameterError, match="unweighted"):
        rnd.submit(0, np.full(4, 0.1), weight=0.5)


def test_audit_flags_float_noise_under_secagg_and_not_integers():
    from securefed.audit import audit

    base = {"transport": "secagg+dp", "placement": "distributed", "epsilon": 4.0}
    assert "distributed-dp-inexact" in audit(base).codes
    exact = audit(base | {"dp_mechanism": "discrete_gaussian", "ddp_wrap_bound": 1e-6})
    assert "distributed-dp-inexact" not in exact.codes
    assert "distributed-dp-wrap" in audit(base | {"ddp_wrap_bound": 0.01}).codes
