"""The DP fusion channel: clipping, calibrated noise, the ledger's refusal, FedSlate behind it,
the leak measures and the command lines."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from securefed import ALL_PAYLOADS, SeedTree  # noqa: E402
from securefed.errors import PrivacyBudgetExceeded  # noqa: E402
from securefed.fusion import (  # noqa: E402
    DP_CHANNELS,
    FUSION_CHANNELS,
    DPFusionChannel,
    DPFusionOptions,
    FusionNeeds,
    FusionNotApplicable,
    ModuleFusionChannel,
    build_fusion_channel,
    fusion_refusal,
)
from securefed.fusion.dp import REPLACEMENT_SENSITIVITY, clip_rows_last_axis  # noqa: E402
from securefed.privacy import epsilon_for_schedule, noise_for_target  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PARTIES = ("a", "b")


class FirstSlot(torch.nn.Module):
    """``S(ordered) = w * ordered[0] + v * ordered[1]`` per entry: the simplest server."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
        self.v = torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64))

    def forward(self, ordered, positions=None):
        out = self.w * ordered[0] + self.v * ordered[1]
        return out if positions is None else torch.gather(out, 2, positions)


class ZeroNoise:
    """A noise source that adds nothing: isolates the clipping (tests only)."""

    secure = False
    name = "zero"

    def normal(self, std, shape):
        return np.zeros(shape)


def _channel(options: DPFusionOptions, noise=None) -> DPFusionChannel:
    server = FirstSlot()
    inner = ModuleFusionChannel(
        PARTIES, server, torch.optim.SGD(server.parameters(), lr=0.1), keep_payloads=ALL_PAYLOADS
    )
    tree = SeedTree(5)
    noise = noise or {p: tree.generator("noise", p) for p in PARTIES}
    return DPFusionChannel(inner, options, noise=noise)


def _big_budget(sigma: float, releases: int = 1) -> DPFusionOptions:
    epsilon = epsilon_for_schedule(sigma, 1.0, releases, 1e-5) * 1.01
    return DPFusionOptions(
        epsilon=epsilon, clip=2.0, grad_clip=0.5, releases_per_unit=releases, noise_multiplier=sigma
    )


def test_a_huge_q_value_leaves_clipped_to_the_bound():
    channel = _channel(_big_budget(0.5), noise={p: ZeroNoise() for p in PARTIES})
    x = np.ones((1, 3, 4))
    x[0, 1, 2] = 1e9  # one row with a huge value
    channel.forward({"a": x, "b": np.ones((1, 3, 4))}, outputs=["a"], train=False, tag="act")
    seen = channel.view.exchanges_of(tag="act")[0].payloads["a"]["input"]
    norms = np.linalg.norm(seen, axis=-1)
    np.testing.assert_allclose(norms, [[2.0, 2.0, 2.0]])  # every row at the bound (||1_4|| = 2)
    np.testing.assert_allclose(seen[0, 1], [0, 0, 2.0, 0], atol=1e-8)  # direction kept
    clipped, factors = clip_rows_last_axis(np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]]), 1.0)
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    np.testing.assert_allclose(factors[:, 0], [0.2, 1.0, 1.0])


def test_the_noise_has_the_calibrated_scale_on_inputs_and_gradients():
    options = DPFusionOptions(epsilon=4.0, clip=2.0, grad_clip=0.5, releases_per_unit=50)
    sigma = noise_for_target(4.0, 1e-5, 1.0, 50)
    channel = _channel(options)
    assert channel.noise_multiplier == sigma
    assert channel.epsilon("a") <= 4.0 and channel.epsilon("a") > 3.95
    x = np.zeros((1, 1000, 8))
    x[..., 0] = 1.0  # norm 1 < clip: no clipping, the noise alone
    out = channel.forward(
        {"a": x, "b": x.copy()}, outputs=["a"], positions={"a": np.zeros((1, 1000, 1), np.int64)},
        tag="learn",
    )  # fmt: skip
    seen = channel.view.exchanges_of(tag="learn")[0].payloads["a"]["input"]
    expected = sigma * REPLACEMENT_SENSITIVITY * 2.0
    assert np.std(seen - x) == pytest.approx(expected, rel=0.03)
    assert channel.view.public["dp"]["noise_std_input"] == pytest.approx(expected)
    grads = channel.backward({"a": torch.zeros_like(out["a"])}, recipients=["a"])
    sent = channel.view.exchanges_of(kind="backward")[0].payloads["a"]["output_grad"]
    assert np.std(sent) == pytest.approx(sigma * REPLACEMENT_SENSITIVITY * 0.5, rel=0.05)
    assert grads["a"].shape == (1, 1000, 8)
    assert channel.releases() == {
        "a": {"learn:input": 1000, "learn:grad": 1000}, "b": {"learn:input": 1000}
    }  # fmt: skip


def test_the_ledger_refuses_a_schedule_over_budget_before_anything_leaves():
    server = FirstSlot()
    needs = FusionNeeds(members=1, activation="identity", optimiser="sgd")
    over = DPFusionOptions(epsilon=1.0, releases_per_unit=100, noise_multiplier=2.0)
    assert epsilon_for_schedule(2.0, 1.0, 100, 1e-5) > 1.0
    noise = {p: np.random.default_rng(0) for p in PARTIES}
    sgd = torch.optim.SGD(server.parameters(), lr=0.1)
    with pytest.raises(PrivacyBudgetExceeded, match="budget exceeded"):
        build_fusion_channel("dp", PARTIES, server, sgd, needs, dp=over, noise=noise)
    # The same schedule with the calibrated noise fits; one more unit release does not.
    fits = DPFusionOptions(epsilon=1.0, releases_per_unit=100)
    channel = build_fusion_channel("dp", PARTIES, server, sgd, needs, dp=fits, noise=noise)
    assert channel.name == "dp" and channel.view.channel == "dp"
    assert 0.99 <= channel.epsilon("a") <= 1.0
    with pytest.raises(PrivacyBudgetExceeded):
        channel.ledgers["a"].charge(channel.noise_multiplier, 1.0, server=(1.0, 1.0))


def test_an_exchange_the_accounting_did_not_count_is_refused():
    options = _big_budget(1.0)
    counted = DPFusionOptions(**{**options.__dict__, "tags": ("act",)})
    channel = _channel(counted)
    x = {"a": np.ones((1, 2, 3)), "b": np.ones((1, 2, 3))}
    channel.forward(x, train=False, tag="act")
    with pytest.raises(ValueError, match="counted no exchange tagged 'learn'"):
        channel.forward(x, tag="learn")
    assert channel.view.count(tag="learn") == 0


def test_dp_names_in_the_registry_and_options_that_do_not_apply():
    assert FUSION_CHANNELS == ("plaintext", "ckks", "dp", "ckks+dp", "secagg")
    assert DP_CHANNELS == {"dp": "plaintext", "ckks+dp": "ckks"}
    per_party = FusionNeeds(members=3, activation="relu", optimiser="adam")
    assert fusion_refusal("dp", per_party) is None
    assert fusion_refusal("ckks+dp", per_party) == (
        "the ckks+dp fusion channel wraps " + fusion_refusal("ckks", per_party)
    )
    server = FirstSlot()
    adam = torch.optim.Adam(server.parameters())
    needs = FusionNeeds(members=1, activation="identity", optimiser="adam")
    noise = {p: np.random.default_rng(0) for p in PARTIES}
    with pytest.raises(FusionNotApplicable, match="wraps the ckks fusion channel cannot serve"):
        build_fusion_channel("ckks+dp", PARTIES, server, adam, needs, dp=_big_budget(1.0),
                             noise=noise)  # fmt: skip
    with pytest.raises(ValueError, match="needs DP options"):
        build_fusion_channel("dp", PARTIES, server, adam, needs)
    with pytest.raises(ValueError, match="apply only to the DP fusion channels"):
        build_fusion_channel("plaintext", PARTIES, server, adam, needs, dp=_big_budget(1.0))
    with pytest.raises(ValueError, match="releases_per_unit"):
        DPFusionOptions(epsilon=1.0, releases_per_unit=0)
    with pytest.raises(ValueError, match="tail_delta"):
        DPFusionOptions(epsilon=1.0, delta=1e-5, tail_delta=1e-5)


# ----------------------------------------------------------------------------- FedSlate
TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 2, "members": 2,
    "burn_in": 11, "learn_every": 6, "buffer_size": 16, "batch_size": 4, "local_hidden": (8,),
    "server_hidden": (4,), "seed": 0,  # seeded: the tests compare runs
}  # fmt: skip


def test_fedslate_under_dp_releases_what_its_accounting_counts():
    pytest.importorskip("gymnasium")
    from securefed.rl.fedslate import FedSlateConfig, dp_unit_releases, run_fedslate

    config = FedSlateConfig(**TINY, fusion="dp", dp_epsilon=8.0)
    bound = dp_unit_releases(config)
    result = run_fedslate(config, keep_payloads=ALL_PAYLOADS, keep_clean=True)
    public = result.fusion_view.public["dp"]
    assert result.fusion_view.channel == "dp" and public["unit_releases"] == bound["releases"]
    assert max(public["epsilon_spent"].values()) <= 8.0
    # Count the rows each platform sent: acting, one row per round and member; learning,
    # rows_per_drawn_round rows per drawn round (batch x members per learning step).
    counts = {p: {} for p in "AB"}
    for exchange in result.fusion_view.exchanges:
        for party, fields in exchange.payloads.items():
            for name in ("input", "output_grad"):
                if name in fields:
                    key = "act" if exchange.tag == "act" else "learning"
                    rows = int(np.prod(fields[name].shape[:-1]))
                    counts[party][key] = counts[party].get(key, 0) + rows
    rounds = config.episodes * config.steps_per_platform
    drawn = result.learn_steps * config.batch_size * config.members
    assert result.learn_steps > 0
    for party in "AB":
        assert counts[party]["act"] == rounds * config.members
        assert counts[party]["learning"] == drawn * bound["rows_per_drawn_round"]
    assert bound["acting"] == config.steps_per_platform
    # The clean tap holds what the platforms computed; the view only their noised rows.
    first_round, clean = result.fusion_clean[0]
    seen = result.fusion_view.exchanges_of(tag="act", round_id=first_round)[0]
    assert not np.allclose(clean["A"], seen.payloads["A"]["input"])


def test_fedslate_dp_options_are_required_or_refused():
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    with pytest.raises(ValueError, match="dp_epsilon is required"):
        FedSlateConfig(**TINY, fusion="dp")
    with pytest.raises(ValueError, match="applies to no other"):
        FedSlateConfig(**TINY, dp_epsilon=1.0)
    with pytest.raises(ValueError, match="keep_clean applies to the DP and encrypted transports"):
        run_fedslate(FedSlateConfig(**TINY), keep_clean=True)


def test_the_ranking_attack_beats_chance_in_the_clear_and_not_under_strong_dp():
    pytest.importorskip("gymnasium")
    from securefed.attacks.fedslate_leak import measure_fedslate_leak, slate_overlap, top_n
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    assert slate_overlap(np.array([[0, 1]]), np.array([[1, 3]])) == 0.5
    np.testing.assert_array_equal(np.sort(top_n(np.array([0.1, 0.9, 0.5, 0.7]), 2)), [1, 3])
    small = TINY | {"episodes": 6, "members": 3}
    plain = FedSlateConfig(**small)
    leak = measure_fedslate_leak(plain, run_fedslate(plain, keep_payloads=ALL_PAYLOADS))
    strong = FedSlateConfig(**small, fusion="dp", dp_epsilon=1.0)
    result = run_fedslate(strong, keep_payloads=ALL_PAYLOADS, keep_clean=True)
    noised = measure_fedslate_leak(strong, result)
    chance = small["slate_size"] / small["num_candidates"]
    for platform in "AB":
        assert leak["server_slate"][platform]["chance"] == chance
        assert leak["server_slate"][platform]["attack"] == 1.0  # the server sees the ranking
        # 6 x 12 x 3 = 216 inquiries: chance +- 3 standard errors of a hypergeometric overlap.
        assert abs(noised["server_slate"][platform]["attack"] - chance) < 0.08
    assert set(noised["other_platform"]) >= {"attack", "own", "chance"}


# ----------------------------------------------------------------------------- command lines
JOINT_ARGV = ["--transport", "dp", "--epsilon", "8", "--dp-acting", "own"]
SUMS_CLIP = ["--dp-learning", "sums", "--dp-local-clip", "0.1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--transport", "he"], "invalid choice: 'he'"),
        (["--epsilon", "4"], "--epsilon apply only to the DP transports"),
        (["--dp-clip", "3"], "--dp-clip apply only to the DP transports"),
        (["--dp-acting", "own"], "--dp-acting apply only to the DP transports"),
        (["--dp-local-clip", "0.1"], "--dp-local-clip apply only to the DP transports"),
        (["--dp-learning", "sums"], "--dp-learning apply only to the DP transports"),
        (["--dp-sample-rate", "0.5"], "--dp-sample-rate apply only to the DP transports"),
        (["--dp-server-clip", "0.07"], "--dp-server-clip apply only to the DP transports"),
        (
            [*JOINT_ARGV, "--dp-server-clip", "0.07"],
            "--dp-server-clip needs --dp-learning sums (with --dp-acting own): only the per-step "
            "sums hold a server part to clip; got --dp-learning rows",
        ),
        (
            [*JOINT_ARGV, *SUMS_CLIP, "--dp-server-clip", "0.1"],
            "--dp-server-clip must lie in (0, --dp-local-clip 0.1)",
        ),
        (
            [*JOINT_ARGV, "--dp-learning", "sums", "--dp-server-clip", "1"],
            "--dp-server-clip must lie in (0, --dp-local-clip 1)",  # the default local clip
        ),
        ([*JOINT_ARGV, *SUMS_CLIP, "--dp-server-clip", "nan"], "--dp-server-clip must lie in"),
        (
            [*JOINT_ARGV, *SUMS_CLIP, "--dp-server-clip", "0,07"],
            "argument --dp-server-clip: invalid float value: '0,07'",
        ),
        (
            [*JOINT_ARGV, *SUMS_CLIP, "--dp-servr-clip", "0.07"],  # misspelt: never ignored
            "unrecognized arguments: --dp-servr-clip 0.07",
        ),
        (
            [
                "--transport",
                "dp",
                "--epsilon",
                "4",
                "--dp-acting",
                "own",
                "--dp-learning",
                "sums",
                "--dp-sampling",
                "poisson",
            ],
            "dp_sample_rate is required",
        ),
        (
            [
                *["--transport", "dp", "--epsilon", "4", "--dp-acting", "own"],
                *["--dp-sampling", "poisson", "--dp-sample-rate", "0.5"],
            ],
            "fusion rows of the drawn rounds show the server",
        ),
        (
            ["--transport", "dp", "--epsilon", "4", "--dp-learning", "sums"],
            "dp_learning='sums' needs joint DP",
        ),
        (
            [
                "--transport",
                "ckks+dp",
                "--server-activation",
                "polynomial",
                "--epsilon",
                "4",
                "--dp-acting",
                "own",
            ],
            "dp_acting='own' needs the 'dp' transport",
        ),
        (["--transport", "dp", "--epsilon", "4", "--dp-local-clip", "0"], "dp_local_clip must"),
        (["--transport", "dp"], "needs --epsilon"),
        (["--transport", "dp", "--epsilon", "4", "--algorithm", "slateq"], "FedSlate's fusion"),
        (["--transport", "ckks+dp", "--epsilon", "4"], "wraps the ckks fusion channel"),
        (["--ckks-scale-bits", "55"], "ckks_scale_bits applies to the encrypted transports"),
        (
            ["--transport", "ckks", "--server-activation", "polynomial", "--ckks-scale-bits", "61"],
            "ckks_scale_bits must be an integer in [30, 59]",
        ),
        (["--server-activation", "polynomial", "--algorithm", "slateq"], "FedSlate's fusion"),
    ],
)
def test_cli_usage_errors_exit_2(argv, message, capsys):
    pytest.importorskip("gymnasium")
    from securefed.bench.cli_fedslate import main

    base = ["--candidates", "6", "--slate", "2", "--episodes", "1"]
    try:
        code = main([*base, *argv])
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_dp_local_options_reach_the_config():
    pytest.importorskip("gymnasium")
    import argparse

    from securefed.bench.cli_fedslate import _config, register

    parser = argparse.ArgumentParser(prog="securefed")
    register(parser.add_subparsers(dest="command", required=True))
    argv = ["fedslate", "--transport", "dp", "--epsilon", "8", "--dp-acting", "own"]
    config = _config(parser.parse_args([*argv, "--dp-local-clip", "0.1"]))
    assert (config.dp_acting, config.dp_local_clip, config.dp_epsilon) == ("own", 0.1, 8.0)
    defaults = _config(parser.parse_args(argv[:5]))
    assert (defaults.dp_acting, defaults.dp_local_clip) == ("released", 1.0)
    assert defaults.dp_learning == "rows"
    sums = _config(parser.parse_args([*argv, "--dp-learning", "sums"]))
    assert (sums.dp_acting, sums.dp_learning) == ("own", "sums")
    sampled = ["--dp-learning", "sums", "--dp-sampling", "poisson", "--dp-sample-rate", "0.25"]
    sampled = _config(parser.parse_args([*argv, *sampled]))
    assert (sampled.dp_sampling, sampled.dp_sample_rate) == ("poisson", 0.25)
    assert defaults.dp_sampling is None and defaults.dp_sample_rate is None
    split = [*SUMS_CLIP, "--dp-server-clip", "0.07"]
    split = _config(parser.parse_args([*argv, *split]))
    assert (split.dp_learning, split.dp_local_clip, split.dp_server_clip) == ("sums", 0.1, 0.07)
    assert sums.dp_server_clip is None and defaults.dp_server_clip is None


def test_bench_fedslate_takes_the_transport_and_names_its_cells(tmp_path):
    pytest.importorskip("gymnasium")
    import argparse

    from securefed.bench import bench_fedslate

    parser = argparse.ArgumentParser()
    bench_fedslate.add_arguments(parser)
    args = bench_fedslate._finish(
        parser.parse_args(["--transport", "dp", "--epsilon", "4", "--settings", "10x3"])
    )
    cell = bench_fedslate.table_cells(args)["N10_n3"][1]["fedslate"]
    assert cell.name == "N10_n3_fedslate_dp_eps4" and cell.config.fusion == "dp"
    assert cell.config.dp_epsilon == 4.0
    assert bench_fedslate.table_cells(args)["N10_n3"][1]["slateq"].name == "N10_n3_slateq"
    with pytest.raises(ValueError, match="needs --epsilon"):
        bench_fedslate._finish(parser.parse_args(["--transport", "dp"]))
