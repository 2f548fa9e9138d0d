"""The attack on FedSlate's DP accounting: change one unit's data, fix all randomness, and check
that every released quantity moves only within what the ledgers charged.

The unit of privacy is one user's episode (docs/fedslate.md section 9). Two seeded runs differ
in one user's episode only (member 0's user of episode 1 gets another initial state and another
observation of it). The runs are *coupled* at every Gaussian mechanism: the second run releases
exactly what the first released there (its noise shifted by the difference of the pre-noise
values; the mechanism's output distribution is the same, so this is a valid coupling of the two
neighbouring runs), and records that difference. If everything the parties do after a release is
post-processing of the releases and of each party's own data, the two runs then agree on every
quantity the server sees, and the only mechanism inputs that differ are the unit's: at most the
ledger's count of them per platform, each within the sensitivity the noise was calibrated to.

On the code before issue 34 this fails twice over: each platform trained its local Q-network on
the unit's raw data, so the Q-value rows of the same member's *later users* differ (rows the
ledger never charged), and the clicked positions of the unit's replayed rounds reached the
server in the clear.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("gymnasium")

from securefed import ALL_PAYLOADS  # noqa: E402
from securefed.fusion import dp as fusion_dp  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

UNIT_EPISODE, UNIT_MEMBER = 1, 0


class Coupling:
    """Records a run's mechanism outputs (``reference is None``) or replays them.

    Each entry: ``(mechanism, party, key, round, output)``. In a replaying run the mechanism is
    called as usual (same noise stream, so the same draws), the difference from the reference's
    output is the difference of the pre-noise values, and the reference's output is returned.
    """

    def __init__(self, reference: list | None = None) -> None:
        self.reference = reference
        self.calls: list[tuple[str, str, str, int | None, np.ndarray]] = []
        self.differences: list[tuple[str, str, str, int | None, np.ndarray]] = []

    def couple(self, mechanism: str, party: str, key: str, round_id, output: np.ndarray):
        index = len(self.calls)
        self.calls.append((mechanism, party, key, round_id, output))
        if self.reference is None:
            return output
        ref = self.reference[index]
        if ref[:4] != (mechanism, party, key, round_id) or ref[4].shape != output.shape:
            raise AssertionError(
                f"mechanism call {index} differs in kind: {ref[:4]} vs "
                f"{(mechanism, party, key, round_id)}: the release schedule depends on the data"
            )
        self.differences.append(
            (mechanism, party, key, round_id, output.astype(np.float64) - ref[4])
        )
        return ref[4].astype(output.dtype)


def _patch_mechanisms(monkeypatch, coupling: Coupling) -> None:
    original_rows = fusion_dp.DPFusionChannel._release

    def coupled_rows(self, party, value, clip, key, kind):
        noised, factors = original_rows(self, party, value, clip, key, kind)
        is_tensor = hasattr(noised, "detach")
        array = noised.detach().numpy() if is_tensor else np.asarray(noised)
        array = coupling.couple("rows", party, key, self.view.current_round, array)
        return (torch.from_numpy(array) if is_tensor else array), factors

    monkeypatch.setattr(fusion_dp.DPFusionChannel, "_release", coupled_rows)
    from securefed.rl import fedslate

    local_dp = getattr(fedslate, "LocalDPSGD", None)
    if local_dp is not None:  # the platforms' DP-SGD of their local networks (issue 34)
        original_sum = local_dp.release

        def coupled_sum(self, unit_gradients):
            out = original_sum(self, unit_gradients)
            return coupling.couple("local_sgd", self.party, "local", None, out)

        monkeypatch.setattr(local_dp, "release", coupled_sum)


def _perturb_one_user(monkeypatch) -> None:
    """Member ``UNIT_MEMBER``'s user of episode ``UNIT_EPISODE`` is another user: another
    initial state, another observation of it, and on platform A other clicks (the next position
    of each slate shown): the neighbouring dataset (one unit changed, nothing else)."""
    from securefed.rl.envs.choc_kale import ChocKaleBatch

    original_reset, original_step = ChocKaleBatch.reset, ChocKaleBatch.step
    episode = {"n": -1}

    def reset(self):
        original_reset(self)
        episode["n"] += 1
        if episode["n"] == UNIT_EPISODE:
            self.nke[UNIT_MEMBER] = -self.nke[UNIT_MEMBER] + 3.0
            self.obs_sat[UNIT_MEMBER] += 0.7

    def step(self, platform, slates):
        out = original_step(self, platform, slates)
        if episode["n"] == UNIT_EPISODE and platform == 0:
            position = (out.position[UNIT_MEMBER] + 1) % slates.shape[1]
            out.position[UNIT_MEMBER] = position
            out.clicked[UNIT_MEMBER] = slates[UNIT_MEMBER, position]
        return out

    monkeypatch.setattr(ChocKaleBatch, "reset", reset)
    monkeypatch.setattr(ChocKaleBatch, "step", step)


def _run(monkeypatch, coupling: Coupling, *, perturb: bool, config):
    from securefed.rl.fedslate import run_fedslate

    with monkeypatch.context() as patch:
        _patch_mechanisms(patch, coupling)
        if perturb:
            _perturb_one_user(patch)
        return run_fedslate(config, keep_payloads=ALL_PAYLOADS)


def _view_arrays(view) -> list[tuple[str, str, str, np.ndarray]]:
    out = []
    for i, exchange in enumerate(view.exchanges):
        for party, fields in sorted(exchange.payloads.items()):
            for name, value in sorted(fields.items()):
                out.append((f"{i}:{exchange.tag}:{exchange.kind}", party, name, np.asarray(value)))
    return out


def _coupled_pair(monkeypatch, config):
    first = Coupling()
    base = _run(monkeypatch, first, perturb=False, config=config)
    second = Coupling(reference=first.calls)
    neighbour = _run(monkeypatch, second, perturb=True, config=config)
    return base, neighbour, second


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"alignment": "item"},
        {"variant": "extended"},
        {"dp_acting": "own"},
        {"dp_acting": "own", "dp_learning": "sums"},
        {"dp_acting": "own", "dp_learning": "sums", "variant": "extended"},
        {
            "dp_acting": "own",
            "dp_learning": "sums",
            "dp_sampling": "poisson",
            "dp_sample_rate": 0.5,
        },
        {"dp_acting": "own", "dp_learning": "sums", "dp_server_clip": 0.7},
    ],
    ids=["paper", "item", "ext", "joint", "sums", "sums-ext", "sums-sampled", "sums-split"],
)
def test_one_user_episode_moves_only_what_the_ledgers_charged(monkeypatch, fedslate_small, variant):
    from securefed.rl.fedslate import FedSlateConfig

    shape = fedslate_small | {"episodes": 4} | variant
    config = FedSlateConfig(**shape, fusion="dp", dp_epsilon=8.0)
    base, neighbour, coupling = _coupled_pair(monkeypatch, config)
    assert base.learn_steps > 10 and coupling.differences

    # 1. Everything the server saw is the same in both runs: the noised rows (by the coupling)
    # and everything else it received (positions, fused outputs, input gradients).
    seen, seen_neighbour = _view_arrays(base.fusion_view), _view_arrays(neighbour.fusion_view)
    assert [s[:3] for s in seen] == [s[:3] for s in seen_neighbour]
    moved = [
        s[:3] for s, t in zip(seen, seen_neighbour, strict=True) if not np.array_equal(s[3], t[3])
    ]
    assert not moved, f"released in the clear and moved by one user's episode: {moved[:4]}"

    # 2. The mechanism inputs that moved: only the unit's, within the charged sensitivity and
    # count, per platform.
    public = neighbour.fusion_view.public["dp"]
    options = config.dp_options()
    sensitivity = {"input": 2 * options.clip, "grad": 2 * options.grad_clip}
    steps_per_episode = config.steps_per_platform
    unit_rounds = range(UNIT_EPISODE * steps_per_episode, (UNIT_EPISODE + 1) * steps_per_episode)
    moved_rows: dict[str, int] = {}
    moved_steps: dict[str, int] = {}
    for mechanism, party, key, round_id, diff in coupling.differences:
        if mechanism == "rows":
            norms = np.linalg.norm(diff, axis=-1)  # (S, B): one per row
            kind = key.rsplit(":", 1)[1]
            assert norms.max() <= sensitivity[kind] * (1 + 1e-4) + 1e-4, (key, norms.max())
            if key.startswith("act:"):
                members, _ = np.nonzero(norms)
                assert round_id in unit_rounds or not members.size, (
                    f"platform {party}'s acting row of round {round_id} (not the unit's episode) "
                    "moved: its local network carries the unit's data into a later user's rows"
                )
                assert set(members.tolist()) <= {UNIT_MEMBER}
            moved_rows[party] = moved_rows.get(party, 0) + int(np.count_nonzero(norms))
        else:
            norm = float(np.linalg.norm(diff))
            assert norm <= public["local_sgd"]["sensitivity"] * (1 + 1e-4) + 1e-5
            moved_steps[party] = moved_steps.get(party, 0) + int(norm > 0)
    for party in ("A", "B"):
        if options.releases_per_unit:
            assert 0 < moved_rows.get(party, 0) <= options.releases_per_unit, (party, moved_rows)
        else:  # per-step sums (dp_learning="sums"): no row is released, none is charged
            assert not moved_rows and not base.fusion_view.exchanges, moved_rows
    # The local networks are charged in the same ledger: its count bounds the steps that moved.
    assert "local_sgd" in public, "the ledger charges the fusion rows only, not the local training"
    for party in ("A", "B"):
        # The unit's rounds were replayed, so some of the platform's DP-SGD steps moved with it.
        assert 0 < moved_steps.get(party, 0) <= public["local_sgd"]["steps_per_unit"], moved_steps
    # 3. Every network (the local ones and the server's) is a function of the releases only.
    _assert_same_networks(base, neighbour)


def _assert_same_networks(base, neighbour) -> None:
    """The trained networks of the coupled runs agree weight for weight: post-processing."""
    assert set(base.networks) == set(neighbour.networks)
    for name, net in base.networks.items():
        other = neighbour.networks[name].state_dict()
        for key, value in net.state_dict().items():
            assert torch.equal(value, other[key]), f"{name}.{key} moved with one user's episode"


def test_the_weights_check_catches_a_server_step_off_the_releases(monkeypatch, fedslate_small):
    """The control of check 3's power, under per-step sums: a server that also steps on the
    platforms' clean gradient (here: one more step on the un-noised batch gradient of A's
    Algorithm-1 loss) ends with weights that move with the unit."""
    from securefed.rl import fedslate

    config = fedslate.FedSlateConfig(
        **fedslate_small | {"episodes": 4},
        fusion="dp",
        dp_epsilon=8.0,
        dp_acting="own",
        dp_learning="sums",
    )
    original = fedslate.LocalDPSGD.step_joint

    def leaky(self, run, p, row_loss, x, extras, units):
        original(self, run, p, row_loss, x, extras, units)
        server = run.channel.module
        q = run.local[p](x).detach()
        fused = server([q] + [torch.zeros_like(q)] * (run.config.num_platforms - 1))
        run.channel.optimiser.zero_grad(set_to_none=True)
        row_loss(fused, *extras).backward()  # the batch's raw gradient, no clip, no noise
        run.channel.optimiser.step()

    monkeypatch.setattr(fedslate.LocalDPSGD, "step_joint", leaky)
    base, neighbour, _ = _coupled_pair(monkeypatch, config)
    with pytest.raises(AssertionError, match="server"):
        _assert_same_networks(base, neighbour)


def _coupled_acting_values(monkeypatch, config) -> tuple[np.ndarray, np.ndarray]:
    """The values every slate was built from, ``(rounds, K, S, N)`` (what ``choose_slates``
    got), in the base run and in its coupled neighbour, the unit's own (member
    ``UNIT_MEMBER`` during episode ``UNIT_EPISODE``) masked to NaN: what every *other* user's
    slate is a function of, besides that user's own features and the exploration stream."""
    from securefed.rl import fedslate

    original = fedslate.choose_slates
    steps = config.steps_per_platform
    unit = range(UNIT_EPISODE * steps, (UNIT_EPISODE + 1) * steps)
    runs = []
    for reference in (None, True):
        seen: list[np.ndarray] = []

        def recording(run, x, qf, eps, seen=seen):
            values = np.stack([np.array(qf[name], dtype=np.float64) for name in run.names])
            if run.rounds in unit:
                values[:, UNIT_MEMBER] = np.nan
            seen.append(values)
            return original(run, x, qf, eps)

        coupling = Coupling(reference=runs[0][1].calls if reference else None)
        with monkeypatch.context() as patch:
            patch.setattr(fedslate, "choose_slates", recording)
            result = _run(patch, coupling, perturb=bool(reference), config=config)
        assert result.learn_steps > 10
        runs.append((np.stack(seen), coupling))
    return runs[0][0], runs[1][0]


@pytest.mark.parametrize("learning", ["rows", "sums"])
def test_joint_dp_acting_sends_nothing_and_other_users_slates_do_not_move(
    monkeypatch, fedslate_small, learning
):
    """Joint DP (``dp_acting="own"``): a platform acts on its own clean values through the
    server network's weights, so (1) no acting exchange reaches the server and the ledger
    charges no acting row, and (2) under the coupling, every slate any *other* user is shown
    is built from the same values in both neighbouring runs (a function of the releases and
    of that user's own data): the joint-DP guarantee. The unit's own slates may move (they are
    its own outputs)."""
    from securefed.rl.fedslate import FedSlateConfig, dp_unit_releases

    config = FedSlateConfig(
        **fedslate_small | {"episodes": 4},
        fusion="dp",
        dp_epsilon=8.0,
        dp_acting="own",
        dp_learning=learning,
    )
    released = FedSlateConfig(**fedslate_small | {"episodes": 4}, fusion="dp", dp_epsilon=8.0)
    assert dp_unit_releases(config)["acting"] == 0
    rows = dp_unit_releases(released)["releases"] - config.steps_per_platform
    assert dp_unit_releases(config)["releases"] == (rows if learning == "rows" else 0)
    assert dp_unit_releases(config)["local_steps"] == dp_unit_releases(released)["local_steps"]
    base, neighbour = _coupled_acting_values(monkeypatch, config)
    assert base.shape == neighbour.shape and np.isnan(base).any()
    moved = np.argwhere(np.any((base != neighbour) & ~np.isnan(base), axis=-1))
    assert not moved.size, f"another user's slate values moved: (round, K, S) {moved[:4]}"


def test_the_acting_check_catches_non_private_local_training(monkeypatch, fedslate_small):
    """The control of the acting check's power, and why joint acting refuses raw local
    training: with the refusal bypassed, a platform acting on its own network trained on raw
    data builds a later user's slate from values that move with the unit."""
    from securefed.rl.fedslate import FedSlateConfig

    config = FedSlateConfig(
        **fedslate_small | {"episodes": 4}, fusion="dp", dp_epsilon=8.0, dp_acting="own"
    )
    object.__setattr__(config, "dp_local_training", "none")  # what __post_init__ refuses
    base, neighbour = _coupled_acting_values(monkeypatch, config)
    moved = (base != neighbour) & ~np.isnan(base)
    assert moved.any(), "no other user's slate values moved: the check has no power"


def test_joint_dp_acting_fails_closed():
    from securefed.rl.fedslate import FedSlateConfig

    with pytest.raises(ValueError, match="dp_acting"):
        FedSlateConfig(fusion="ckks+dp", dp_epsilon=8.0, dp_acting="own", activation="polynomial")
    with pytest.raises(ValueError, match="dp_acting"):
        FedSlateConfig(fusion="dp", dp_epsilon=8.0, dp_acting="own", dp_local_training="none")
    with pytest.raises(ValueError, match="dp_acting"):
        FedSlateConfig(dp_acting="own")
    with pytest.raises(ValueError, match="dp_acting"):
        FedSlateConfig(fusion="dp", dp_epsilon=8.0, dp_acting="clean")


def test_per_step_sums_and_diagnostics_fail_closed():
    """``dp_learning="sums"`` only under joint DP; a channel that charged no row refuses every
    exchange; the noiseless diagnostics carry no epsilon and are refused where they cannot
    apply."""
    from securefed.fusion.dp import DPFusionOptions
    from securefed.rl.fedslate import FedSlateConfig

    with pytest.raises(ValueError, match="dp_learning='sums' needs joint DP"):
        FedSlateConfig(fusion="dp", dp_epsilon=8.0, dp_learning="sums")
    with pytest.raises(ValueError, match="dp_learning='sums'"):
        FedSlateConfig(
            fusion="dp", dp_epsilon=8.0, dp_acting="own", dp_learning="sums", dp_local_noise=50.0
        )
    with pytest.raises(ValueError, match="dp_learning must be one of"):
        FedSlateConfig(fusion="dp", dp_epsilon=8.0, dp_acting="own", dp_learning="batch")
    with pytest.raises(ValueError, match=r"needs tags=\(\)"):
        DPFusionOptions(epsilon=8.0, releases_per_unit=0)
    with pytest.raises(ValueError, match="non-empty"):
        DPFusionOptions(epsilon=8.0, releases_per_unit=5, tags=())
    with pytest.raises(ValueError, match="dp_diagnostic"):
        FedSlateConfig(dp_diagnostic="noiseless-rows")
    with pytest.raises(ValueError, match="dp_diagnostic"):
        FedSlateConfig(
            fusion="dp", dp_epsilon=8.0, dp_local_training="none", dp_diagnostic="noiseless-rows"
        )
    with pytest.raises(ValueError, match="dp_learning='sums'"):
        FedSlateConfig(
            fusion="dp",
            dp_epsilon=8.0,
            dp_acting="own",
            dp_learning="sums",
            dp_diagnostic="noiseless-rows",
        )


def test_per_step_sums_channel_refuses_every_exchange(fedslate_small):
    """Under ``dp_learning="sums"`` the fusion channel charged no row, so a row sent through it
    (an exchange the accounting did not count) is refused before it leaves."""
    from securefed.rl.fedslate import LEARN, FedSlateConfig, start_run

    config = FedSlateConfig(
        **fedslate_small, fusion="dp", dp_epsilon=8.0, dp_acting="own", dp_learning="sums"
    )
    run = start_run(config)
    assert run.channel.options.releases_per_unit == 0
    rows = {name: np.zeros((config.members, 1, config.num_candidates)) for name in run.names}
    with pytest.raises(ValueError, match="counted no exchange"):
        run.channel.forward(rows, outputs=["A"], train=False, tag=LEARN)


def test_noiseless_diagnostic_records_no_epsilon(fedslate_small):
    """A diagnostic run (one mechanism without noise) is flagged: no epsilon in its record."""
    from securefed.rl.fedslate import FedSlateConfig, start_run

    for diagnostic in ("noiseless-rows", "noiseless-local"):
        config = FedSlateConfig(
            **fedslate_small,
            fusion="dp",
            dp_epsilon=8.0,
            dp_acting="own",
            dp_diagnostic=diagnostic,
        )
        public = start_run(config).channel.view.public["dp"]
        assert public["epsilon_spent"] == {"A": None, "B": None}
        assert diagnostic in public["diagnostic"] and public["epsilon_if_noised"]["A"] > 7


def test_the_attack_catches_non_private_local_training(monkeypatch, fedslate_small):
    """The control: with the old local training (flagged, no epsilon) the positions are local
    now, so the server's view still agrees, but a later user's acting rows move with the unit:
    the attack's second check has the power to see the local networks' leak by itself."""
    from securefed.rl.fedslate import FedSlateConfig

    config = FedSlateConfig(
        **fedslate_small | {"episodes": 4}, fusion="dp", dp_epsilon=8.0, dp_local_training="none"
    )
    _, _, coupling = _coupled_pair(monkeypatch, config)
    unit_end = (UNIT_EPISODE + 1) * config.steps_per_platform
    later = [
        (party, round_id)
        for mechanism, party, key, round_id, diff in coupling.differences
        if key.startswith("act:") and round_id >= unit_end and np.abs(diff).max() > 0
    ]
    assert later, "no later user's row moved: the control found nothing to catch"


# -- per-part clipping of the sums (dp_server_clip, issue 34) ---------------------------------


def _split_config(fedslate_small):
    """Per-step sums with a clip small enough to bind, nearly all of it the server part's: in
    this small run a unit's local part is the larger one, so its small share binds."""
    from securefed.rl.fedslate import FedSlateConfig

    return FedSlateConfig(
        **fedslate_small | {"episodes": 4},
        fusion="dp",
        dp_epsilon=8.0,
        dp_acting="own",
        dp_learning="sums",
        dp_local_clip=2e-5,
        dp_server_clip=1.98e-5,
    )


def _part_moves(monkeypatch, config) -> tuple[list[tuple[float, float]], object]:
    """The coupled pair's moved DP-SGD sums, as ``(local part's norm, server part's norm)``
    (the local part: the platform's local weights, first in the release), and the
    neighbour's result."""
    from securefed.rl import fedslate

    sizes: dict[str, int] = {}
    original = fedslate.LocalDPSGD.step_joint

    def recording(self, run, p, *args):
        sizes[self.party] = sum(w[0].numel() for w in self.network.parameters())
        return original(self, run, p, *args)

    monkeypatch.setattr(fedslate.LocalDPSGD, "step_joint", recording)
    base, neighbour, coupling = _coupled_pair(monkeypatch, config)
    assert base.learn_steps > 10 and set(sizes) == {"A", "B"}
    moves = []
    for mechanism, party, _key, _round, diff in coupling.differences:
        assert mechanism == "local_sgd" and not base.fusion_view.exchanges
        if np.linalg.norm(diff) > 0:
            width = sizes[party]
            local, server = diff[..., :width], diff[..., width:]
            moves.append((float(np.linalg.norm(local)), float(np.linalg.norm(server))))
    _assert_same_networks(base, neighbour)
    return moves, neighbour


def test_per_part_clip_moves_each_part_within_its_share(monkeypatch, fedslate_small):
    """Under ``dp_server_clip`` one user's episode moves a released sum's server part by at
    most ``2 C_s`` and its local part by at most ``2 sqrt(C^2 - C_s^2)`` (so the whole by at
    most ``2 C``, the ledger's sensitivity, unchanged), in at most the ledger's steps, and every
    network stays a function of the releases (coupled runs, as above)."""
    config = _split_config(fedslate_small)
    moves, neighbour = _part_moves(monkeypatch, config)
    local_sgd = neighbour.fusion_view.public["dp"]["local_sgd"]
    clip, server_clip = config.dp_local_clip, config.dp_server_clip
    local_clip = np.sqrt(clip**2 - server_clip**2)
    assert local_sgd["server_clip"] == server_clip
    assert local_sgd["local_part_clip"] == pytest.approx(local_clip)
    assert local_sgd["sensitivity"] == pytest.approx(2 * clip)  # the ledger's, unchanged
    assert 0 < len(moves) <= 2 * local_sgd["steps_per_unit"]
    slack = 1 + 1e-6
    for local, server in moves:
        assert local <= 2 * local_clip * slack and server <= 2 * server_clip * slack, (
            local,
            server,
        )
    # The local part's clip is exercised: some moved sum's local part is of the order of its
    # bound (half of it at least; the control below shows it leaves the bound without the split).
    assert max(local for local, _ in moves) > 0.5 * local_clip


def test_the_part_check_catches_a_split_that_overspends(monkeypatch, fedslate_small):
    """The control: a split that clips the local part to the whole clip ``C`` (not the rest of
    it) lets the release's final clip to ``C`` rescale both parts, and the local part of some
    moved sum leaves its share ``2 sqrt(C^2 - C_s^2)``: the check above would see it."""
    from securefed.rl import fedslate

    config = _split_config(fedslate_small)

    def overspending(self, unit_gradients, local_size):
        local, _ = fusion_dp.clip_rows_last_axis(unit_gradients[..., :local_size], self.clip)
        server, _ = fusion_dp.clip_rows_last_axis(
            unit_gradients[..., local_size:], self.server_clip
        )
        return np.concatenate([local, server], axis=-1)

    monkeypatch.setattr(fedslate.LocalDPSGD, "split_clipped", overspending)
    moves, _ = _part_moves(monkeypatch, config)
    local_clip = np.sqrt(config.dp_local_clip**2 - config.dp_server_clip**2)
    assert max(local for local, _ in moves) > 2 * local_clip * (1 + 1e-6)


def test_per_part_clip_fails_closed():
    """``dp_server_clip`` only under per-step sums, strictly inside the whole clip."""
    from securefed.rl.fedslate import FedSlateConfig

    joint = {"fusion": "dp", "dp_epsilon": 8.0, "dp_acting": "own", "dp_local_clip": 0.1}
    with pytest.raises(ValueError, match="dp_server_clip needs dp_learning='sums'"):
        FedSlateConfig(**joint, dp_server_clip=0.05)
    for bad in (0.0, 0.1, 0.2, -0.01, float("nan"), True):
        with pytest.raises(ValueError, match="dp_server_clip"):
            FedSlateConfig(**joint, dp_learning="sums", dp_server_clip=bad)
    with pytest.raises(ValueError, match="dp_server_clip"):
        FedSlateConfig(dp_server_clip=0.05)
