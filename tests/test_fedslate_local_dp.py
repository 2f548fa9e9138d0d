"""FedSlate's local DP-SGD (issue 34): the mechanism's arithmetic, the one ledger per platform
that charges it beside the fusion rows, the refusals, the flag for non-private local training,
and the bench's rows of the old mechanism (a resumed DP run: tests/test_fedslate.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from securefed import SeedTree  # noqa: E402
from securefed.errors import PrivacyBudgetExceeded  # noqa: E402
from securefed.fusion.dp import gaussian_sum  # noqa: E402
from securefed.privacy import epsilon_of_history  # noqa: E402
from securefed.privacy.noise import as_noise_source  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class ZeroNoise:
    secure = False
    name = "zero"

    def normal(self, std, shape):
        return np.zeros(shape)


def test_gaussian_sum_clips_each_unit_then_noises_the_sum_at_the_calibrated_scale():
    rows = np.array([[[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]]])  # norms 5, 0.5, 0 (an empty slot)
    np.testing.assert_allclose(gaussian_sum(rows, 1.0, 2.0, ZeroNoise()), [[0.9, 1.2]])
    noise = as_noise_source(SeedTree(1).generator("n"))
    draws = gaussian_sum(np.zeros((1, 2, 20000)), 0.5, 3.0, noise)
    # std = sigma * 2 * clip = 3; 20000 draws: the sample std is within 2% (about 4 s.e.).
    assert abs(draws.std() - 3.0) < 0.06


def test_unit_sums_group_a_members_rows_by_unit_and_row_gradients_match_autograd():
    from securefed.rl.fedslate import LocalDPSGD, unit_sums
    from securefed.rl.slateq import LocalQNetwork

    rows = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    units = np.array([[5, 2, 5, 7], [1, 1, 1, 1]])
    sums = unit_sums(torch.from_numpy(rows), units).numpy()
    np.testing.assert_array_equal(sums[0, 0], rows[0, 1])  # unit 2
    np.testing.assert_array_equal(sums[0, 1], rows[0, 0] + rows[0, 2])  # unit 5
    np.testing.assert_array_equal(sums[0, 2], rows[0, 3])
    np.testing.assert_array_equal(sums[1, 0], rows[1].sum(axis=0))
    assert not sums[1, 1:].any() and not sums[0, 3].any()

    gen = torch.Generator().manual_seed(0)
    net = LocalQNetwork(2, 1 + 6 + 4, 6, (5,), generator=gen)
    x = torch.randn(2, 3, 11, generator=gen)
    g = torch.randn(2, 3, 6, generator=gen)
    trainer = LocalDPSGD("A", net, 1.0, 1.0, ZeroNoise())
    per_row = trainer.row_gradients(x, g)
    for s in range(2):
        for b in range(3):
            net.zero_grad()
            (net(x)[s, b] * g[s, b]).sum().backward()
            expected = torch.cat([p.grad[s].reshape(-1) for p in net.parameters()])
            # float32 autograd against torch.func's vmap: the same products, summed in another
            # order (a few ulps of float32 at these magnitudes).
            torch.testing.assert_close(per_row[s, b], expected, rtol=1e-5, atol=1e-6)


def test_one_ledger_per_platform_charges_the_fusion_rows_and_the_local_steps(fedslate_small):
    from securefed.rl.fedslate import FedSlateConfig, dp_unit_releases, run_fedslate

    config = FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0)
    bound = dp_unit_releases(config)
    assert 0 < bound["local_steps"] <= bound["learning_steps"]
    result = run_fedslate(config)
    public = result.fusion_view.public["dp"]
    sigma = public["noise_multiplier"]
    assert public["local_training"] == "dp-sgd"
    assert public["local_sgd"]["noise_multiplier"] == sigma  # calibrated together
    assert public["local_sgd"]["steps_per_unit"] == bound["local_steps"]
    history = [(sigma, 1.0, bound["releases"] + bound["local_steps"])]
    composed = epsilon_of_history(history, config.dp_delta - bound["tail_delta"])
    for party in ("A", "B"):
        assert public["epsilon_spent"][party] == pytest.approx(composed, rel=1e-9)
        assert composed <= 8.0
    both = epsilon_of_history(history * 2, config.dp_delta - bound["tail_delta"])
    assert public["epsilon_user_all_platforms"] == pytest.approx(both, rel=1e-9)
    assert both > composed  # a user's episode is a unit on both platforms
    # The fusion rows alone would have spent less: the local training is charged.
    rows_only = epsilon_of_history([(sigma, 1.0, bound["releases"])], config.dp_delta)
    assert rows_only < composed
    assert result.updates["local_A"] == result.learn_steps > 0


def test_a_given_local_noise_leaves_the_rest_to_the_fusion_rows_or_is_refused(fedslate_small):
    from securefed.rl.fedslate import FedSlateConfig, dp_unit_releases, start_run

    base = FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0)
    louder = dataclasses.replace(base, dp_local_noise=50.0)
    assert louder.dp_options().sigma() < base.dp_options().sigma()  # more room for the rows
    run = start_run(louder)
    bound = dp_unit_releases(louder)
    assert run.channel.epsilon("A") <= 8.0
    assert run.local_dp[0].noise_multiplier == 50.0 and bound["local_steps"] > 0
    with pytest.raises(ValueError, match="leaves no room for the fusion rows"):
        dataclasses.replace(base, dp_local_noise=0.05)
    # An explicit fusion schedule that does not fit beside the local steps is refused too.
    with pytest.raises(PrivacyBudgetExceeded):
        run.channel.ledgers["A"].charge(0.3, 1.0, steps=100, server=(0.3, 1.0))


def test_local_dp_options_are_refused_where_they_do_not_apply(fedslate_small):
    from securefed.rl.fedslate import FedSlateConfig

    for option in ({"dp_local_training": "dp-sgd"}, {"dp_local_clip": 2.0}):
        with pytest.raises(ValueError, match="apply to the DP transports"):
            FedSlateConfig(**fedslate_small, **option)
    with pytest.raises(ValueError, match="dp_local_training must be one of"):
        FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0, dp_local_training="opacus")
    with pytest.raises(ValueError, match="dp_local_noise applies to dp_local_training='dp-sgd'"):
        FedSlateConfig(
            **fedslate_small,
            fusion="dp",
            dp_epsilon=8.0,
            dp_local_training="none",
            dp_local_noise=5.0,
        )
    with pytest.raises(ValueError, match="the DP transports need feedback_prob 1"):
        FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0, feedback_prob=0.5)
    with pytest.raises(ValueError, match="dp_local_clip must be finite"):
        FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0, dp_local_clip=0.0)


def test_non_private_local_training_is_flagged_and_carries_no_epsilon(fedslate_small):
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    config = FedSlateConfig(**fedslate_small, fusion="dp", dp_epsilon=8.0, dp_local_training="none")
    public = run_fedslate(config).fusion_view.public["dp"]
    assert public["epsilon_spent"] == {"A": None, "B": None}
    assert "not established" in public["local_training"]
    assert max(public["epsilon_fusion_rows_only"].values()) <= 8.0


def test_the_bench_puts_the_old_mechanism_beside_the_new_one_flagged():
    pytest.importorskip("gymnasium")
    import argparse

    from securefed.bench.bench_fedslate_leak import add_arguments, markdown, reward_cells

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--settings", "10x3", "--epsilons", "8", "--old-dp-epsilons", "8", "--episodes", "3"]
    )
    cells = reward_cells(args)["N10_n3"][1]
    new, old = cells["dp eps=8"][0].config, cells["dp eps=8, non-private local networks (old)"][0]
    assert new.local_dp and new.dp_local_training is None
    assert old.config.dp_local_training == "none" and not old.config.local_dp
    assert old.name != cells["dp eps=8"][0].name  # cached apart
    # The table shows the old row's epsilon as not established, with the rows-only figure.
    dp = {"epsilon_spent": {"A": None}, "epsilon_fusion_rows_only": {"A": 7.99}}
    row: dict[str, object] = {"dp": dp}
    stats = {"mean": 1.0, "std": 0.0}
    for p in "AB":
        row[p] = {k: stats for k in ("mean", "optimal_reward", "etror", "final")}
    row |= {"seconds_per_learning_step": 0.01, "bytes_per_learning_step": 1024}
    meta = {"machine": "test", "seconds": 0.0, "schedule": "test"}
    record = {"meta": meta, "rewards": {"N10_n3": {"setting": [10, 3], "rows": {"old": row}}}}
    assert "not established (rows only: 7.99)" in markdown(record)
