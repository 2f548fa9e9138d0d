"""FedSlate's per-step sums with secret Poisson sampling (``dp_sampling="poisson"``, issue 34).

Each platform keeps each unit of its learning batch in its DP-SGD sum with probability ``q``,
drawn from its own secret generator, and its ledger charges each of the unit's steps as a
Poisson-subsampled Gaussian under replacement adjacency. The attacks: (a) one unit's changed
data moves each released sum by at most the charged sensitivity (the coupled runs of
``test_fedslate_dp_sensitivity.py``, its ``sums-sampled`` case, and here the control that the
check sees a sample rescaled before the release); (b) the ledger's epsilon is the accountant's
for ``(sigma, q, steps)``, below the unsampled one at the same sigma and never below the exact
unsampled epsilon at ``q = 1``; (c) what the server receives does not depend on the sample.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("gymnasium")
dp_accounting = pytest.importorskip("dp_accounting")

from test_fedslate_dp_sensitivity import _assert_same_networks, _coupled_pair  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SAMPLED = {"dp_acting": "own", "dp_learning": "sums", "dp_sampling": "poisson"}


CLIP = 0.002
"""A clip the tiny run's unit gradients exceed, so the sensitivity checks see it bind."""


def _config(fedslate_small, rate=0.5, episodes=4):
    from securefed.rl.fedslate import FedSlateConfig

    return FedSlateConfig(
        **fedslate_small | {"episodes": episodes},
        fusion="dp",
        dp_epsilon=8.0,
        dp_local_clip=CLIP,
        **SAMPLED,
        dp_sample_rate=rate,
    )


def _moved_sum_norms(coupling) -> list[float]:
    return [
        float(np.linalg.norm(diff))
        for mechanism, *_, diff in coupling.differences
        if mechanism == "local_sgd"
    ]


def _worst_replacement(release_of, clip: float, rate: float, seed: int) -> float:
    """The largest move of a released sum when one unit's gradient is replaced by its opposite
    at 100 times the clip, the noise and the sample fixed (the same generators' states in both
    runs): over 40 steps of 8 members x 6 units, every unit in turn the replaced one."""
    from securefed.privacy.noise import as_noise_source
    from securefed.rl.fedslate import LocalDPSGD

    def platform():
        return LocalDPSGD(
            "A",
            torch.nn.Linear(1, 1),
            clip,
            3.0,
            as_noise_source(np.random.default_rng(seed)),
            sample_rate=rate,
            sampler=np.random.default_rng(seed + 1),
        )

    data = np.random.default_rng(seed + 2)
    first, second, worst = platform(), platform(), 0.0
    for step in range(40):
        units = data.normal(size=(8, 6, 5))
        other = units.copy()
        unit = step % 6
        other[:, unit] = (
            -100 * clip * units[:, unit] / np.linalg.norm(units[:, unit], axis=-1)[:, None]
        )
        moved = release_of(first, units) - release_of(second, other)
        worst = max(worst, float(np.linalg.norm(moved, axis=-1).max()))
    return worst


def test_one_replaced_unit_moves_a_sampled_sum_by_at_most_twice_the_clip():
    """(a) at the mechanism, with all randomness fixed: a unit replaced by the worst one moves
    each released sum by at most ``2 C`` (the sensitivity the noise is calibrated to)."""
    from securefed.fusion.dp import REPLACEMENT_SENSITIVITY
    from securefed.rl.fedslate import LocalDPSGD

    clip = 0.1
    worst = _worst_replacement(LocalDPSGD.release_sampled, clip, 0.5, seed=3)
    assert (
        REPLACEMENT_SENSITIVITY * clip * 0.9 < worst <= REPLACEMENT_SENSITIVITY * clip * (1 + 1e-9)
    )


def test_the_sensitivity_check_catches_a_sample_rescaled_before_the_noise():
    """The control of (a)'s power: a platform that rescales its kept units' clipped sum by
    ``1 / q`` before the noise (the "unbiased" sample, scaled on the wrong side of the
    release) moves a sum by up to ``2 C / q``, over the charged ``2 C``."""
    from securefed.fusion import dp as fusion_dp
    from securefed.rl.fedslate import LocalDPSGD

    def rescaled(self, unit_gradients):
        clipped, _ = fusion_dp.clip_rows_last_axis(self.sampled_units(unit_gradients), self.clip)
        std = self.noise_multiplier * 2 * self.clip
        total = clipped.sum(axis=-2) / self.sample_rate
        return total + self.noise.normal(std, total.shape)

    assert LocalDPSGD.release_sampled is not rescaled
    assert _worst_replacement(rescaled, 0.1, 0.5, seed=3) > 2 * 0.1 * 1.5


def test_sampled_sum_moves_within_the_clip_and_only_where_the_unit_was_kept(
    monkeypatch, fedslate_small
):
    """(a) end to end, coupled runs: every released sum moves by at most ``2 C``, the networks
    are functions of the releases, and fewer sums move than without sampling (the unit's steps
    where the platform left it out do not move)."""
    from securefed.rl.fedslate import FedSlateConfig

    sampled = _config(fedslate_small, rate=0.25)
    base, neighbour, coupling = _coupled_pair(monkeypatch, sampled)
    bound = neighbour.fusion_view.public["dp"]["local_sgd"]["sensitivity"]
    norms = _moved_sum_norms(coupling)
    assert max(norms) <= bound * (1 + 1e-4) + 1e-9
    _assert_same_networks(base, neighbour)
    full = FedSlateConfig(
        **fedslate_small | {"episodes": 4},
        fusion="dp",
        dp_epsilon=8.0,
        dp_acting="own",
        dp_learning="sums",
        dp_local_clip=CLIP,
    )
    _, _, unsampled = _coupled_pair(monkeypatch, full)
    moved = sum(n > 0 for n in norms)
    moved_unsampled = sum(n > 0 for n in _moved_sum_norms(unsampled))
    assert 0 < moved < moved_unsampled, (moved, moved_unsampled)


def _accountant_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """The weak-triangle bound recomputed from dp-accounting's add/remove sampled Gaussian at
    ``z = 2 sigma`` (Mironov 2017, Proposition 11), independently of the package's code."""
    from securefed.privacy.accounting import RDP_ORDERS

    alphas = np.asarray(RDP_ORDERS)

    def curve(orders):
        accountant = dp_accounting.rdp.RdpAccountant(list(orders))
        gaussian = dp_accounting.GaussianDpEvent(2 * sigma)
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, gaussian))
        return np.array(accountant._rdp)

    rdp = steps * ((alphas - 0.5) / (alphas - 1) * curve(2 * alphas) + curve(2 * alphas - 1))
    return dp_accounting.rdp.compute_epsilon(list(alphas), list(rdp), delta)[0]


def test_ledger_charges_the_sampled_accountant_and_it_is_below_unsampled(fedslate_small):
    """(b): the run's epsilon per platform is the accountant's for (sigma, q, steps), within the
    budget, below the unsampled epsilon at the same sigma, and its sigma below the unsampled
    run's; at ``q = 1`` the bound is never below the exact replacement epsilon."""
    from securefed.privacy import epsilon_of_history
    from securefed.rl.fedslate import FedSlateConfig, dp_unit_releases, start_run

    config = _config(fedslate_small, rate=0.25)
    public = start_run(config).channel.view.public["dp"]
    sigma, steps = public["local_sgd"]["noise_multiplier"], public["local_sgd"]["steps_per_unit"]
    delta = config.dp_delta - dp_unit_releases(config)["tail_delta"]
    expected = _accountant_epsilon(sigma, 0.25, steps, delta)
    for party in ("A", "B"):
        assert public["epsilon_spent"][party] == pytest.approx(expected, rel=1e-6)
        assert public["epsilon_spent"][party] <= 8.0
    assert expected < epsilon_of_history([(sigma, 1.0, steps)], delta)
    unsampled = FedSlateConfig(
        **fedslate_small, fusion="dp", dp_epsilon=8.0, dp_acting="own", dp_learning="sums"
    )
    full = start_run(unsampled).channel.view.public["dp"]["local_sgd"]["noise_multiplier"]
    assert sigma < 0.5 * full
    # The bound's soundness at q = 1: not below the Gaussian's own (exact) replacement epsilon.
    for s in (2.0, 16.0):
        exact = epsilon_of_history([(s, 1.0, 687)], 0.9e-5)
        assert _accountant_epsilon(s, 1.0, 687, 0.9e-5) >= exact


def test_poisson_sampling_is_not_charged_as_add_remove_replace_one():
    """Why the bound and not dp-accounting's curve: its ``REPLACE_ONE`` relation refuses
    Poisson sampling (the unit of privacy here is replaced, not removed)."""
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    event = dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(4.0))
    assert not accountant.supports(event)


def _with_other_sample(monkeypatch, seed: int) -> None:
    """The platforms' secret samplers drawn from another seed (nothing else changes)."""
    from securefed.rl import fedslate

    original = fedslate.start_local_dp

    def other(config, channel, local, noise, samplers=None):
        fresh = {name: np.random.default_rng([seed, i]) for i, name in enumerate(samplers)}
        return original(config, channel, local, noise, fresh)

    monkeypatch.setattr(fedslate, "start_local_dp", other)


def _server_view_of_two_samples(monkeypatch, fedslate_small, seed: int):
    """Two runs coupled at every release, the second with other secret samples: returns both
    results and the second run's kept-unit counts (to check that the sample did differ)."""
    from securefed.rl import fedslate

    kept: list[list[int]] = [[], []]
    original = fedslate.LocalDPSGD.sampled_units
    which = {"run": 0}

    def counting(self, unit_gradients):
        out = original(self, unit_gradients)
        kept[which["run"]].append(int(np.count_nonzero(np.abs(out).sum(-1))))
        return out

    monkeypatch.setattr(fedslate.LocalDPSGD, "sampled_units", counting)
    from test_fedslate_dp_sensitivity import Coupling, _run

    config = _config(fedslate_small)
    first = Coupling()
    base = _run(monkeypatch, first, perturb=False, config=config)
    which["run"] = 1
    with monkeypatch.context() as patch:
        _with_other_sample(patch, seed)
        other = _run(patch, Coupling(reference=first.calls), perturb=False, config=config)
    return base, other, kept


def _server_view(result) -> tuple:
    view = result.fusion_view
    return (
        repr(sorted(view.public.items())),
        [(e.tag, e.kind, sorted(e.payloads)) for e in view.exchanges],
        result.updates,
        result.fusion_bytes if hasattr(result, "fusion_bytes") else None,
    )


def test_the_server_view_carries_nothing_of_the_sample(monkeypatch, fedslate_small):
    """(c): two runs with other secret samples, coupled at the releases: the samples differ,
    yet the server receives the same messages (count, shape, values) and ends with the same
    network, and its view (public record, exchanges, update counts) is the same."""
    base, other, kept = _server_view_of_two_samples(monkeypatch, fedslate_small, seed=99)
    assert kept[0] != kept[1], "the two runs drew the same sample: the check cannot see it"
    assert _server_view(base) == _server_view(other)
    _assert_same_networks(base, other)


def test_the_view_check_catches_a_step_scaled_by_the_sample_size(monkeypatch, fedslate_small):
    """The control of (c)'s power: a platform that averages its sum over the units it kept
    (a data-independent but secret count) sends the server a step that reveals the count."""
    from securefed.rl import fedslate

    def by_count(self, unit_gradients):
        kept = self.sampled_units(unit_gradients)
        count = max(1, int(np.count_nonzero(np.abs(kept).sum(-1))))
        batch = unit_gradients.shape[-2]
        return self.release(kept) * batch * self.sample_rate / count

    monkeypatch.setattr(fedslate.LocalDPSGD, "release_sampled", by_count)
    base, other, kept = _server_view_of_two_samples(monkeypatch, fedslate_small, seed=99)
    assert kept[0] != kept[1]
    server, moved = base.networks["server"].state_dict(), other.networks["server"].state_dict()
    assert any(not torch.equal(value, moved[key]) for key, value in server.items())


def test_secret_sampling_fails_closed():
    """Sampling only under per-step sums (under rows the server sees which units a step
    used), with a rate in (0, 1), and the rate only with sampling."""
    from securefed.rl.fedslate import FedSlateConfig

    joint = {"fusion": "dp", "dp_epsilon": 8.0, "dp_acting": "own"}
    with pytest.raises(ValueError, match="fusion rows of the drawn rounds show the server"):
        FedSlateConfig(**joint, dp_sampling="poisson", dp_sample_rate=0.5)
    with pytest.raises(ValueError, match="without a diagnostic"):
        FedSlateConfig(
            **joint,
            dp_learning="sums",
            dp_diagnostic="noiseless-local",
            dp_sampling="poisson",
            dp_sample_rate=0.5,
        )
    for rate in (0.0, 1.0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="dp_sample_rate must lie in"):
            FedSlateConfig(**joint, dp_learning="sums", dp_sampling="poisson", dp_sample_rate=rate)
    with pytest.raises(ValueError, match="dp_sample_rate is required"):
        FedSlateConfig(**joint, dp_learning="sums", dp_sampling="poisson")
    with pytest.raises(ValueError, match="dp_sample_rate is required"):
        FedSlateConfig(**joint, dp_learning="sums", dp_sample_rate=0.5)
    with pytest.raises(ValueError, match="dp_sampling must be one of"):
        FedSlateConfig(**joint, dp_learning="sums", dp_sampling="fixed", dp_sample_rate=0.5)
    with pytest.raises(ValueError, match="dp_sampling needs"):
        FedSlateConfig(dp_sampling="poisson", dp_sample_rate=0.5)
