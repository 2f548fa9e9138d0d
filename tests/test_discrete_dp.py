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
    GeneratorIntegers,
    SecureIntegers,
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
    granularity_for,
    hadamard,
    noise_for_integer_target,
    padded_dim,
    plan_mechanism,
    rotate,
    rotation_chunks,
    rotation_signs,
    unrotate,
    wrap_probability_bound,
)
from securefed.transport.dp import DPTransport
from securefed.transport.registry import build_transport, clients_per_round_bound
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


def test_the_ring_is_sized_for_a_sampled_round_not_the_population():
    """A million users sampling ten a round: the ring holds a round's clients (a Poisson tail
    bound), so a DP target is met; sized by the population its clip (2147 integers) was below
    the mechanism's per-client bound and every target was refused."""
    dp = build_transport(
        "secagg+dp:mechanism=discrete_gaussian,epsilon=8,dp.clip=1.0",
        n_clients=10**6,
        total_rounds=2,
        sample_rate=1e-5,
    )
    assert clients_per_round_bound(10**6, 1e-5) == 10 + math.ceil(8 * math.sqrt(10)) + 8
    assert clients_per_round_bound(50, 1.0) == 50 and clients_per_round_bound(None, 0.5) == 0
    assert dp.inner.config.clip == ((1 << 31) - 1) // 1024
    x = _updates(10, (6, 2))
    rnd = dp.open_round(0, range(10), shape=(6, 2), seeds=SeedTree(0))
    for c in range(10):
        rnd.submit(c, x[c])
    total = np.asarray(rnd.result().total)
    assert total.shape == (6, 2) and np.all(np.isfinite(total))
    assert 0 < dp.epsilon() <= 8.0


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
    # Remote (Flower) clients encode the integers on their nodes (securefed.flower.dp): built.
    remote = DPTransport(
        SecAggTransport(SecAggConfig(bits=32, scale=1.0, clip=2.0**21), remote_clients=True),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        mechanism="discrete_gaussian",
    )
    assert remote.inner.remote_clients
    with pytest.raises(InsecureParameterError, match="cryptographic"):
        DPTransport(
            _integer_secagg(),
            clip=1.0,
            noise_multiplier=1.0,
            placement="distributed",
            mechanism="skellam",
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


# ----------------------------------------------------------------------------- the fast sampler
def test_sampler_pinned_distribution_for_a_fixed_generator():
    """The block sampler's output for a fixed generator at the DP schedule's variances: its
    chi-square against the PMF (on cells of one std), mean and variance, pinned to tolerances
    that a wrong law (a variance 3% off) fails."""
    for sigma2, seed in ((331_403, 20261201), (1_440, 5)):
        draws = discrete_gaussian(sigma2, 300_000, np.random.default_rng(seed))
        assert draws.dtype == np.int64 and draws.size == 300_000
        std = math.sqrt(sigma2)
        assert abs(draws.mean()) < 4 * std / math.sqrt(draws.size)
        assert abs(draws.var() / sigma2 - 1) < 0.012
        edges = np.arange(-4, 5) * std
        cells = np.searchsorted(edges, draws, side="right")
        observed = np.bincount(cells, minlength=10)
        support = np.arange(-int(8 * std), int(8 * std) + 1)
        pmf = discrete_gaussian_pmf(sigma2, support)
        expected = np.bincount(np.searchsorted(edges, support, side="right"), pmf, minlength=10)
        expected = expected / expected.sum() * draws.size
        assert stats.chisquare(observed, expected).pvalue > SIGNIFICANCE
        wrong = discrete_gaussian_pmf(sigma2 * 1.03, support)
        wrong = np.bincount(np.searchsorted(edges, support, side="right"), wrong, minlength=10)
        assert stats.chisquare(observed, wrong / wrong.sum() * draws.size).pvalue < SIGNIFICANCE


def test_bernoulli_exp_minus_one_from_one_uniform_and_its_continuation():
    from securefed.privacy import discrete

    n = 200_000
    hits = discrete._bernoulli_exp_minus_one(n, GeneratorIntegers(np.random.default_rng(2)))
    p = math.exp(-1)
    assert abs(hits.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n)

    class ZeroFirst:
        """An integer source whose 20!-range draws are all 0 (probability 1/20! each):
        Algorithm 1 must continue at K = 21 with fresh draws."""

        def __init__(self):
            self.rng = np.random.default_rng(3)
            self.bounds = []

        def below(self, high, size):
            self.bounds.append(high)
            if high == math.factorial(20):
                return np.zeros(size, np.int64)
            return self.rng.integers(0, high, size)

    source = ZeroFirst()
    continued = discrete._bernoulli_exp_minus_one(20_000, source)
    # From K = 21 the walk stops at once w.p. 20/21 (K = 21, odd: answers 1).
    assert source.bounds[:2] == [math.factorial(20), 21]
    assert abs(continued.mean() - (20 / 21 + 1 / 21 * 1 / 22)) < 0.01


def test_sampler_works_in_few_large_passes():
    """The sampler's cost, counted (not timed): 600 000 draws take one 62-bit uniform word each,
    in three vectorised calls (blocks of 2^18; a tie, chance below 2^-40 here, would add a few).
    The CKS rejection sampler before it took about 13 integers a draw in a few dozen calls; the
    per-element sampler before that about 10 500 calls for one round of 943 clients."""

    class Counting(GeneratorIntegers):
        calls = values = 0

        def below(self, high, size):
            self.calls += 1
            self.values += size
            return super().below(high, size)

    source = Counting(np.random.default_rng(0))
    draws = discrete_gaussian(331_403, 600_000, source)
    assert draws.size == 600_000
    assert source.calls == 3 and source.values == draws.size


# ----------------------------------------------------------------------------- chunked rotation
def test_rotation_chunks_cut_the_padding():
    assert rotation_chunks(18_524) == (16_384, 2_048, 128) and padded_dim(18_524) == 18_560
    assert rotation_chunks(100) == (128,) and rotation_chunks(1) == (1,)
    assert rotation_chunks(4_200) == (4_096, 128) and padded_dim(4_096) == 4_096
    chunks = rotation_chunks(300)
    signs = rotation_signs(b"public seed of the round, 32 b.", sum(chunks))
    x = np.random.default_rng(0).normal(size=(3, sum(chunks)))
    y = rotate(x, signs, chunks)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1))
    np.testing.assert_allclose(unrotate(y, signs, chunks), x, atol=1e-12)
    with pytest.raises(ValueError, match="cover"):
        rotate(x, signs[:-1] if False else signs, (256,))


def _spike_wraps(mechanism: DistributedIntegerMechanism, n: int, trials: int) -> float:
    """How often n clients' aligned spikes in the *last* (smallest) chunk wrap the modulus."""
    rng = np.random.default_rng(9)
    half = mechanism.modulus // 2
    x = np.zeros((trials * n, mechanism.dim))
    x[:, -1] = mechanism.clip
    signs = rotation_signs(b"the wrap test's public seed 32 b", mechanism.padded)
    totals = mechanism.encode(x, signs, rng).reshape(trials, n, -1).sum(axis=1)
    return float(np.mean(np.any((totals < -half) | (totals >= half), axis=1)))


def test_chunked_wrap_bound_holds_for_a_spike_in_the_smallest_chunk():
    """The granularity is planned with the smallest chunk's flattening: a spike there stays
    under the bound. Planned as if one rotation flattened all 4224 values (the paper's D), the
    same spike wraps almost always (97 of 100 trials when measured): the per-chunk argument
    is needed, and this test sees it."""
    n, noise_std, dim = 6, 0.1, 4_200
    mechanism = plan_mechanism(
        "discrete_gaussian",
        bits=8,
        clip=1.0,
        noise_std=noise_std,
        n_clients=n,
        dim=dim,
        min_contributors=n,
        wrap_target=0.01,
    )
    assert mechanism.chunks == (4_096, 128)
    bound = mechanism.wrap_bound(n)
    assert _spike_wraps(mechanism, n, 40) <= bound + 3 * math.sqrt(bound / 40)
    whole = granularity_for(8, n, 1.0, mechanism.padded, noise_std, 0.01)  # flat over all D
    naive = DistributedIntegerMechanism(
        "discrete_gaussian",
        8,
        1.0,
        whole,
        dim,
        mechanism.beta,
        float(math.ceil(noise_std**2 / (n * whole * whole))),
        n,
    )
    claimed = wrap_probability_bound(
        8, n, 1.0, whole, mechanism.padded, naive.noise_std_units(n) ** 2
    )
    assert claimed < 0.02 and _spike_wraps(naive, n, 40) > 0.5


# ----------------------------------------------------------------------------- secure mode
def test_secure_integers_are_unbiased_and_unpredictable():
    source = SecureIntegers()
    for high in (5, 7, 12):  # 3, 3 and 4 bits: rejection, not reduction modulo high
        draws = source.below(high, 120_000)
        assert draws.min() >= 0 and draws.max() < high
        observed = np.bincount(draws, minlength=high)
        assert stats.chisquare(observed).pvalue > SIGNIFICANCE
    # A reduction modulo 5 of 3-bit words would give 0..2 twice the mass of 3..4: the same
    # test rejects that law.
    biased = np.bincount(np.random.default_rng(0).integers(0, 8, 120_000) % 5, minlength=5)
    assert stats.chisquare(biased).pvalue < SIGNIFICANCE
    assert not np.array_equal(
        SecureIntegers().below(1 << 40, 64), SecureIntegers().below(1 << 40, 64)
    )
    draws = discrete_gaussian(30, 40_000, SecureIntegers())
    assert _chi_square_p(draws, 30, int(3 * math.sqrt(30))) > SIGNIFICANCE
    with pytest.raises(ValueError, match="2\\^62"):
        source.below(0, 3)


def test_secure_mode_runs_the_integer_mechanism_and_two_runs_differ():
    # OS entropy: the noise differs each run, so the std check needs enough coordinates to be
    # safe on every draw (600 values: the sample std's spread is 0.5 / sqrt(1200) = 0.014, the
    # tolerance 0.1 about 7 of them; 24 values failed about 1 run in 100).
    shape, n = (30, 20), 8
    x = _updates(n, shape)
    totals = []
    for _ in range(2):
        dp = DPTransport(
            _integer_secagg(),
            clip=1.0,
            noise_multiplier=0.5,
            placement="distributed",
            mechanism="discrete_gaussian",
            modulus_bits=16,
            delta=1e-5,
            secure=True,
        )
        rnd = dp.open_round(0, range(n), shape=shape, seeds=SeedTree.secure_mode())
        for c in range(n):
            rnd.submit(c, x[c])
        totals.append(rnd.result().total)
        assert rnd.view.public["dp_noise"].startswith("exact discrete_gaussian (aes-256-ctr")
        assert dp.view.public["secure"] is True
    assert not np.array_equal(totals[0], totals[1])
    for total in totals:
        assert abs((total.ravel() - x.sum(axis=0)).std() - 0.5) < 0.1
    with pytest.raises(InsecureParameterError, match="seed"):
        DPTransport(
            _integer_secagg(),
            clip=1.0,
            noise_multiplier=0.5,
            placement="distributed",
            mechanism="discrete_gaussian",
            secure=True,
        ).open_round(0, range(n), shape=shape, seeds=SeedTree(0))


# ----------------------------------------------------------------------------- warm start
def test_plaintext_stand_in_releases_the_secagg_sums_bit_for_bit():
    """The benchmark's warm start for an integer mechanism: over plaintext, the same ledger,
    the server charged as under secure aggregation, and the same released sums."""
    from securefed.bench.experiment import warm_start_transport
    from securefed.transport import parse_transport_spec, resolve_options

    spec = parse_transport_spec("secagg+dp:mechanism=discrete_gaussian,epsilon=3,dp.clip=1.0")
    groups = resolve_options(spec, {})
    context = {"total_rounds": 2, "n_clients": 10, "dropout": 0.0, "sample_rate": 1.0}
    x = _updates(10, (6, 2))
    deployed = build_transport(spec.name, groups, **context)
    standin = warm_start_transport(spec.name, groups, context, deployed)
    assert standin.inner.name == "plaintext" and standin.ledger is deployed.ledger
    reference = build_transport(spec.name, groups, **context)
    totals = {}
    for name, first, second in (("mixed", standin, deployed), ("secagg", reference, reference)):
        out = []
        for round_id, transport in enumerate((first, second)):
            rnd = transport.open_round(round_id, range(10), shape=(6, 2), seeds=SeedTree(0))
            for c in range(10):
                rnd.submit(c, x[c])
            out.append(rnd.result().total)
        totals[name] = out
    for a, b in zip(totals["mixed"], totals["secagg"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert deployed.epsilon() == pytest.approx(reference.epsilon())
    assert deployed.epsilon(against="server") == pytest.approx(reference.epsilon(against="server"))


# ----------------------------------------------------------------------------- the default
def test_distributed_placement_defaults_to_the_exact_mechanism_and_refuses_to_guess():
    exact = build_transport("secagg+dp", {"noise_multiplier": 1.0, "dp.clip": 1.0}, n_clients=4)
    assert exact.config.mechanism == "discrete_gaussian" and exact.inner.config.scale == 1.0
    assert build_transport("secagg+dp:mechanism=gaussian,noise_multiplier=1").config.mechanism == (
        "gaussian"
    )
    assert build_transport("dp:noise_multiplier=1").config.mechanism == "gaussian"
    assert build_transport("dp-local:noise_multiplier=1").config.mechanism == "gaussian"
    # Remote (Flower) clients run the exact default too; where it cannot run, it is refused.
    remote = build_transport("secagg+dp:noise_multiplier=1,remote_clients=true")
    assert remote.config.mechanism == "discrete_gaussian" and remote.inner.remote_clients
    with pytest.raises(ValueError, match="or set mechanism=gaussian"):
        build_transport("secagg+dp:noise_multiplier=1,secagg.scale=2**16")
    assert "ckks+dp" in registry_refusal_names()
    # A chosen float mechanism still runs where it did, flagged inexact by the audit.
    float_dp = build_transport(
        "secagg+dp:mechanism=gaussian,noise_multiplier=1,remote_clients=true"
    )
    assert float_dp.config.mechanism == "gaussian"


def registry_refusal_names() -> list[str]:
    """The DP transports whose unset mechanism is refused (the registry's rule, no tenseal)."""
    from securefed.transport.registry import DPOptions, default_mechanism

    refused = []
    for name in ("ckks+dp", "secagg+dp"):
        try:
            default_mechanism(name, {"dp": DPOptions(noise_multiplier=1.0)}, "distributed")
        except InsecureParameterError as error:
            assert "mechanism=gaussian" in str(error)
            refused.append(name)
    return refused


# ----------------------------------------------------------------------------- threshold sampler
def _floor_exp_neg(a: int, b: int, bits: int) -> int:
    """``floor(exp(-a / b) 2^bits)`` by mpmath at 600 bits (an independent computation)."""
    import mpmath

    with mpmath.workprec(600):
        return int(mpmath.floor(mpmath.exp(-mpmath.mpf(a) / b) * mpmath.mpf(2) ** bits))


@pytest.mark.parametrize(
    "a,b", [(1, 1), (3, 7), (42, 1), (43, 1), (5, 339), (338, 339), (1, 16385)]
)
def test_exact_thresholds_are_the_true_floors(a, b):
    """The integer-only interval computation of ``exp(-a/b)`` gives its exact 62-bit digits."""
    from securefed.privacy import discrete

    for bits in (62, 124, 186):
        assert discrete._exp_neg_floor(a, b, bits) == _floor_exp_neg(a, b, bits)


def test_threshold_tables_are_exact():
    from securefed.privacy import discrete

    table = discrete._exp_neg_over_t_thresholds(339).tolist()
    assert table == [_floor_exp_neg(u, 339, 62) for u in range(339)]
    integers = discrete._exp_neg_integer_thresholds().tolist()
    assert integers == [_floor_exp_neg(k, 1, 62) for k in range(44)]


def _two_sample_p(first: np.ndarray, second: np.ndarray, cells: int = 40) -> float:
    """Chi-square homogeneity p-value of two samples on ``cells`` equal-count cells of both."""
    edges = np.unique(np.quantile(np.concatenate([first, second]), np.linspace(0, 1, cells + 1)))
    table = np.stack(
        [
            np.bincount(np.searchsorted(edges[1:-1], x, side="right"), minlength=edges.size - 1)
            for x in (first, second)
        ]
    )
    return float(stats.chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue)


@pytest.mark.parametrize("sigma2", [1, 7, 30, 114_119, 1_149_558])
def test_threshold_sampler_matches_pmf_and_the_chain_sampler(sigma2):
    """10^6 draws of the threshold sampler against the exact PMF (cells of one integer within
    3 sigma, at most 100 wide so each holds >= ~40 expected draws, and the tails), and against
    10^6 draws of the Algorithm-1 chain sampler it replaced (homogeneity on 40 quantile cells).
    Significance 0.001 each; the controls show each test rejects a variance 5% off (one-integer
    cells) or 2% off (the std / 10 cells; at 1% off its power is marginal: with 10^6 draws the
    sample variance's own spread is 0.14%) and the chain sampler at 1.1 sigma2 (the two-sample
    test). Also homogeneous with 10^6 draws of the CKS rejection sampler."""
    from securefed.privacy.discrete import discrete_gaussian_chain, discrete_gaussian_rejection

    rng = np.random.default_rng(20261202 + sigma2)
    new = discrete_gaussian(sigma2, 1_000_000, rng)
    old = discrete_gaussian_chain(sigma2, 1_000_000, rng)
    assert _two_sample_p(new, discrete_gaussian_rejection(sigma2, 1_000_000, rng)) > SIGNIFICANCE
    std = math.sqrt(sigma2)
    if sigma2 <= 30:
        reach = int(3 * std) + 1
        assert _chi_square_p(new, sigma2, reach) > SIGNIFICANCE
        assert _chi_square_p(new, sigma2 * 1.05, reach) < SIGNIFICANCE
    else:  # one-integer cells would hold too few draws: cells of std / 10
        width = max(1, int(std / 10))
        edges = np.arange(-30, 31) * width
        support = np.arange(-int(10 * std), int(10 * std) + 1)
        observed = np.bincount(np.searchsorted(edges, new, side="right"), minlength=62)

        def expected(variance):
            pmf = discrete_gaussian_pmf(variance, support)
            cells = np.bincount(np.searchsorted(edges, support, side="right"), pmf, minlength=62)
            return cells / cells.sum() * new.size

        assert stats.chisquare(observed, expected(sigma2)).pvalue > SIGNIFICANCE
        assert stats.chisquare(observed, expected(sigma2 * 1.02)).pvalue < SIGNIFICANCE
    assert _two_sample_p(new, old) > SIGNIFICANCE
    wider = discrete_gaussian_chain(max(2, round(sigma2 * 1.1)), 1_000_000, rng)
    assert _two_sample_p(new, wider) < SIGNIFICANCE


def test_threshold_ties_continue_with_further_digits():
    """A first word equal to a threshold (chance 2^-62, forced here) is resolved by the next
    words: the conditional acceptance rate is the fractional part of ``exp(-x) 2^62``, and the
    geometric's all-zero first word continues past v = 43 at rate ``exp(-43) 2^62``."""
    from securefed.privacy import discrete

    source = GeneratorIntegers(np.random.default_rng(11))
    n = 4000
    for a, b in ((1, 1), (5, 339)):
        fraction = (_floor_exp_neg(a, b, 124) % (1 << 62)) / 2.0**62
        hits = np.mean([discrete._resolve_tie(a, b, source) for _ in range(n)])
        assert abs(hits - fraction) <= 5 * math.sqrt(fraction * (1 - fraction) / n)
    counts = np.array([discrete._geometric_tie(0, source) for _ in range(n)])
    assert counts.min() >= 42
    rate = _floor_exp_neg(43, 1, 124) / 2.0**62
    assert abs(np.mean(counts >= 43) - rate) <= 5 * math.sqrt(rate * (1 - rate) / n)


def test_threshold_sampler_from_the_secure_source():
    draws = discrete_gaussian(114_119, 200_000, SecureIntegers())
    assert abs(draws.var() / 114_119 - 1) < 0.02


# ----------------------------------------------------------------------------- inversion sampler
def _cdf_floors_mpmath(sigma2: int, ys: range, bits: int) -> list[int]:
    """``floor(F(y) 2^bits)`` of ``N_Z(0, sigma2)`` by mpmath (an independent computation; the
    terms beyond ``40 sigma + 40`` are below ``exp(-800)``, far under ``2^-bits``)."""
    import mpmath

    with mpmath.workprec(bits + 200):
        reach = int(40 * math.sqrt(sigma2)) + 40
        weights = [mpmath.exp(-mpmath.mpf(k * k) / (2 * sigma2)) for k in range(-reach, reach + 1)]
        total = mpmath.fsum(weights)
        partial, running, out = {}, mpmath.mpf(0), []
        for k, weight in zip(range(-reach, reach + 1), weights, strict=True):
            running += weight
            partial[k] = running
        scale = mpmath.mpf(2) ** bits
        for y in ys:
            value = partial[y] if y >= -reach else mpmath.mpf(0)
            out.append(int(mpmath.floor(value / total * scale)))
    return out


@pytest.mark.parametrize("sigma2", [1, 2, 7, 30, 1_440])
def test_inversion_table_is_the_exact_cdf_floor(sigma2):
    """The sampler's table is ``floor(F(y) 2^62)`` exactly (against mpmath), closed at both ends,
    and the further digits the ties use are exact too. So the law the sampler draws is exactly
    ``F(y) - F(y - 1)``: the table's own probabilities ``(cdf[i] - cdf[i - 1]) 2^-62`` are within
    ``2^-62`` of the PMF (the rest is the tie mass, resolved by further digits)."""
    from securefed.privacy import discrete

    k_max, cdf, _ = discrete._inversion_table(sigma2)
    assert cdf.tolist() == _cdf_floors_mpmath(sigma2, range(-k_max, k_max + 1), 62)
    assert cdf[0] == 0 and cdf[-1] == (1 << 62) - 1
    ys = range(-k_max - 5, k_max + 6, max(1, k_max // 20))
    for bits in (124, 186):
        assert [discrete._cdf_floor(sigma2, y, bits) for y in ys] == _cdf_floors_mpmath(
            sigma2, ys, bits
        )
    implied = np.diff(cdf.astype(object)).astype(np.float64) / 2.0**62
    pmf = discrete_gaussian_pmf(sigma2, np.arange(-k_max + 1, k_max + 1))
    assert np.max(np.abs(implied - pmf)) <= 2.0**-61 + 1e-15 * pmf.max()


class _Scripted(GeneratorIntegers):
    """An integer source whose first 62-bit words are given (chance ``2^-62`` each, forced
    here), then a seeded generator's; it records every 62-bit word it hands out."""

    def __init__(self, first: list[int], seed: int) -> None:
        super().__init__(np.random.default_rng(seed))
        self.first, self.words = list(first), []

    def below(self, high, size):
        out = super().below(high, size)
        if high == 1 << 62:
            take = min(size, len(self.first))
            out[:take] = self.first[:take]
            del self.first[:take]
            self.words.extend(out.tolist())
        return out


def _check_inversion(sigma2: int, draw: int, words: list[int]) -> None:
    """``F(draw - 1) <= X < F(draw)`` for every ``X`` with the given leading words (mpmath)."""
    bits = 62 * len(words)
    prefix = 0
    for word in words:
        prefix = (prefix << 62) | word
    below, at = _cdf_floors_mpmath(sigma2, range(draw - 1, draw + 1), bits)
    assert below <= prefix < at


def test_inversion_ties_continue_with_further_digits():
    """A first word equal to a table entry is decided by the next words: the conditional chance
    of the lower answer is the fractional part of ``F(y) 2^62``; the all-zero and all-one first
    words (the runs of equal entries in the tails, which continue past the table) give draws in
    the far tails with the conditional law ``F(y) 2^62``. Each answer is checked against mpmath
    for the words it read."""
    from securefed.privacy import discrete

    sigma2, n = 30, 3000
    k_max, cdf, _ = discrete._inversion_table(sigma2)
    middle = k_max + 2  # y = 2
    fraction = (_cdf_floors_mpmath(sigma2, [2], 124)[0] % (1 << 62)) / 2.0**62
    source = _Scripted([], 5)
    lower = 0
    for _ in range(n):
        source.words = [int(cdf[middle])]
        draw = discrete._resolve_inversion(sigma2, int(cdf[middle]), source)
        assert draw in (2, 3)
        lower += draw == 2
    assert abs(lower / n - fraction) <= 5 * math.sqrt(fraction * (1 - fraction) / n)

    cut = -50  # F(-50) 2^62 for sigma2 = 30, about 0.33
    rate = _cdf_floors_mpmath(sigma2, [cut], 124)[0] / 2.0**62
    assert cdf[k_max + cut] == 0 and 0.05 < rate < 0.95
    tails = []
    for first, seed in ((0, 6), ((1 << 62) - 1, 7)):
        draws = []
        for i in range(n // 3):
            source = _Scripted([first], seed * 100_000 + i)
            draws.append(int(discrete.discrete_gaussian(sigma2, 1, source)[0]))
            if i < 20:
                _check_inversion(sigma2, draws[-1], source.words)
        tails.append(np.array(draws))
    share = float(np.mean(tails[0] <= cut))
    assert abs(share - rate) <= 5 * math.sqrt(rate * (1 - rate) / (n // 3))
    share = float(np.mean(tails[1] > -cut - 1))  # symmetric: P(y >= 50 | X >= 1 - 2^-62)
    assert abs(share - rate) <= 5 * math.sqrt(rate * (1 - rate) / (n // 3))
    assert tails[0].max() < -k_max / 2 and tails[1].min() > k_max / 2

    source = _Scripted([0, 0, 0, 0], 8)  # X < 2^-248: beyond the table's end at -K
    draw = int(discrete.discrete_gaussian(sigma2, 1, source)[0])
    assert draw < -k_max
    _check_inversion(sigma2, draw, source.words)


@pytest.mark.parametrize("sigma2", [3, 114_119])
def test_inversion_sampler_equals_the_rejection_sampler(sigma2):
    """The inversion sampler against the CKS rejection sampler it replaced, 10^6 draws each:
    chi-square homogeneity on 40 quantile cells and the two-sample Kolmogorov-Smirnov test
    (conservative for integers), each at significance 0.001; the control shows the same tests
    reject the rejection sampler at 1.02 sigma2."""
    from securefed.privacy.discrete import discrete_gaussian_rejection

    rng = np.random.default_rng(4242 + sigma2)
    new = discrete_gaussian(sigma2, 1_000_000, rng)
    old = discrete_gaussian_rejection(sigma2, 1_000_000, rng)
    assert _two_sample_p(new, old) > SIGNIFICANCE
    assert stats.ks_2samp(new, old).pvalue > SIGNIFICANCE
    if sigma2 > 100:
        wider = discrete_gaussian_rejection(round(sigma2 * 1.02), 1_000_000, rng)
        assert _two_sample_p(new, wider) < SIGNIFICANCE
        assert stats.ks_2samp(new, wider).pvalue < SIGNIFICANCE
