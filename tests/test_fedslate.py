"""FedSlate, SlateQ and the multi-platform choc-vs-kale simulator (fast: a few seconds each)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from securefed import ALL_PAYLOADS, CheckpointError, RoundSelection, SeedTree
from securefed.bench import bench_fedslate
from securefed.bench.cli_fedslate import _config as cli_config
from securefed.bench.cli_fedslate import main as fedslate_main
from securefed.bench.cli_fedslate import register as register_cli
from securefed.fusion import ModuleFusionChannel
from securefed.rl.checkpoint import EpisodeCheckpoints
from securefed.rl.envs import (
    ChocKaleBatch,
    ChocKaleConfig,
    ChocKaleEnv,
    EnvStreams,
    choice_probabilities,
    distinct_mask,
    expected_engagement,
)
from securefed.rl.fedslate import (
    FedSlateConfig,
    ServerNetwork,
    etror,
    moving_average,
    on_candidates_of,
    optimal_reward,
    run_fedslate,
    run_reference,
)
from securefed.rl.slateq import (
    LocalQNetwork,
    PaperCodeChoiceModel,
    ReplayBuffer,
    SlateQConfig,
    TrueChoiceModel,
    brute_force_slate,
    greedy_slates,
    local_network,
    lp_slate,
    run_slateq,
    slate_values,
    topk_slates,
    torch_generator,
)

# The runs set no global state; torch's threads are the caller's (here: one, as the CLI's).
pytestmark = pytest.mark.usefixtures("torch_one_thread")

# ---------------------------------------------------------------------------------- simulator


def _batch(config: ChocKaleConfig, users: int, seed: int = 0) -> ChocKaleBatch:
    streams = EnvStreams.from_tree(SeedTree(seed), config.num_platforms, "env")
    return ChocKaleBatch(config, users, streams)


@pytest.mark.parametrize("platforms", [2, 3])
def test_gymnasium_env_checker(platforms):
    env = ChocKaleEnv(ChocKaleConfig(num_platforms=platforms, num_candidates=6, slate_size=2))
    check_env(env, skip_render_check=True)


def test_gym_env_turns_budget_and_feedback():
    env = ChocKaleEnv(ChocKaleConfig())
    obs, _ = env.reset(seed=3)
    steps, turns = 0, []
    terminated = False
    while not terminated:
        turns.append(obs["platform"])
        obs, reward, terminated, truncated, info = env.step(np.array([0, 1, 2]))
        assert reward > 0 and not truncated
        if info["platform"] == 1:  # B has no feedback: it observes nothing of the click
            assert info["clicked"] == -1 and math.isnan(info["feedback"])
            assert not obs["engagement"].any() or obs["platform"] == 0
        steps += 1
    assert steps == 122 and turns[:4] == [0, 1, 0, 1]


def _episode_means(config: ChocKaleConfig, policy: str, users: int) -> tuple[np.ndarray, ...]:
    env = _batch(config, users, seed=11)
    rng = np.random.default_rng(5)
    totals = np.zeros((users, config.num_platforms))
    env.reset()
    n = config.slate_size
    while env.remaining:
        p = env.turn
        docs = env.observation(p).docs
        if policy == "random":
            slates = np.argsort(rng.random(docs.shape), axis=1)[:, :n]
        elif policy == "highest_k":
            slates = np.argsort(-docs, axis=1)[:, :n]
        else:
            slates = np.argsort(docs, axis=1)[:, :n]
        totals[:, p] += env.step(p, slates).engagement
    return totals.mean(axis=0), totals.std(axis=0, ddof=1)


@pytest.mark.parametrize(
    ("setting", "policy", "spec"),
    [
        ((10, 3), "random", (935, 920)),
        ((10, 3), "highest_k", (1033, 1009)),
        ((10, 3), "lowest_k", (858, 837)),
        ((100, 10), "random", (928, 910)),
        ((100, 10), "highest_k", (1069, 1044)),
    ],
)
def test_magnitudes_match_spec_section_1(setting, policy, spec):
    """Per-platform episode rewards match the paper code's measurements (30 episodes each)."""
    config = ChocKaleConfig(num_candidates=setting[0], slate_size=setting[1])
    users = 600
    means, stds = _episode_means(config, policy, users)
    for p in range(2):
        # The spec's figure is a mean of 30 episodes: its standard error dominates ours.
        error = math.sqrt(stds[p] ** 2 / 30 + stds[p] ** 2 / users)
        assert abs(means[p] - spec[p]) < 3 * error, (policy, p, means[p], spec[p], error)


def test_click_frequencies_follow_the_choice_model():
    config = ChocKaleConfig(num_candidates=5, slate_size=4)
    users = 40_000
    env = _batch(config, users)
    env.reset()
    docs = np.tile([0.0, 0.3, 0.6, 0.9, 0.5], (users, 1))
    env.docs[:, 0] = docs
    slates = np.tile([0, 1, 3, 1], (users, 1))  # a repeated document is shown once
    out = env.step(0, slates)
    shown = np.array([0.0, 0.3, 0.9])
    expected = np.exp(1 - shown) / np.exp(1 - shown).sum()
    freq = np.array([(out.clicked == d).mean() for d in (0, 1, 3)])
    assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected * (1 - expected) / users))
    assert (out.position != 3).all()  # the duplicate position is never clicked
    probs = choice_probabilities(np.array([[0.0, 0.3, 0.9, 0.3]]), distinct_mask(slates[:1]))
    np.testing.assert_allclose(probs[0, :3], expected)
    assert probs[0, 3] == 0


def test_engagement_and_transition_follow_the_user_model():
    config = ChocKaleConfig(num_candidates=3, slate_size=1, innovation_stddev=0.0)
    users = 40_000
    env = _batch(config, users)
    env.reset()
    env.docs[:, 0] = 0.8
    nke, sat = env.nke.copy(), env.sat.copy()
    out = env.step(0, np.zeros((users, 1), np.int64))
    np.testing.assert_allclose(env.nke, 0.9 * nke - 2 * (0.8 - 0.5))
    loc = (0.8 * 5.0 + 0.2 * 4.0) * sat
    np.testing.assert_allclose(np.log(out.engagement).mean(), loc.mean(), atol=0.02)
    np.testing.assert_allclose(np.log(out.engagement).std(), 1.0, atol=0.02)
    np.testing.assert_allclose(
        out.engagement.mean(), expected_engagement(0.8, sat, config).mean(), rtol=0.05
    )
    assert np.all(np.abs(env.obs_sat[:, 0] - env.sat) <= 1.0)


def test_observations_are_frozen_and_feedback_is_private():
    config = ChocKaleConfig(feedback_prob=1.0)
    env = _batch(config, 4)
    env.reset()
    b_before = env.observation(1)
    out_a = env.step(0, np.tile([0, 1, 2], (4, 1)))
    b_after = env.observation(1)
    np.testing.assert_array_equal(b_before.sat, b_after.sat)  # frozen while the user is on A
    np.testing.assert_array_equal(b_before.docs, b_after.docs)
    assert b_after.history is None and out_a.revealed.all()
    out_b = env.step(1, np.tile([0, 1, 2], (4, 1)))
    assert np.isnan(out_b.feedback).all() and not out_b.revealed.any()
    assert env.observation(0).history[:, -1].sum(axis=1) == pytest.approx(out_a.engagement)
    with pytest.raises(ValueError, match="turn"):
        env.step(1, np.tile([0, 1, 2], (4, 1)))
    with pytest.raises(ValueError, match="shape"):
        env.step(0, np.zeros((4, 2), np.int64))


def test_shared_corpus_flag_reproduces_identical_corpora():
    config = ChocKaleConfig(shared_corpus=True)
    streams = EnvStreams.from_tree(SeedTree(1), 2, "env", shared_corpus=True)
    env = ChocKaleBatch(config, 3, streams)
    env.reset()
    np.testing.assert_array_equal(env.docs[:, 0], env.docs[:, 1])
    separate = _batch(ChocKaleConfig(), 3)
    separate.reset()
    assert not np.array_equal(separate.docs[:, 0], separate.docs[:, 1])


def test_config_validation():
    with pytest.raises(ValueError, match="slate_size"):
        ChocKaleConfig(num_candidates=3, slate_size=4)
    with pytest.raises(ValueError, match="feedback has"):
        ChocKaleConfig(feedback=(True,))
    with pytest.raises(ValueError, match="feedback_prob"):
        ChocKaleConfig(feedback_prob=0.0)
    with pytest.raises(ValueError, match="variant"):
        FedSlateConfig(variant="nope")
    with pytest.raises(ValueError, match="at least one platform with feedback"):
        FedSlateConfig(feedback=(False, False))
    with pytest.raises(ValueError, match="choice model"):
        SlateQConfig(choice_model="softmax")
    assert FedSlateConfig(variant="extended").feedback == (True, True)


# ---------------------------------------------------------------------------- slate selection


def _instance(rng, n_cand, null=False, negative=False):
    q = rng.normal(1.0, 0.5, n_cand) if negative else rng.random(n_cand) + 0.1
    docs = rng.random(n_cand)
    model = PaperCodeChoiceModel() if null else TrueChoiceModel()
    v, v_null = model.weights(np.array(rng.random()), docs)
    return q, v, float(v_null)


@pytest.mark.parametrize(("null", "negative"), [(False, False), (True, False), (True, True)])
def test_lp_slate_equals_brute_force(null, negative):
    rng = np.random.default_rng(7)
    for _ in range(15):
        n_cand = int(rng.integers(4, 9))
        n = int(rng.integers(1, n_cand))
        q, v, v_null = _instance(rng, n_cand, null, negative)
        slate, value = lp_slate(q, v, v_null, n)
        _, best = brute_force_slate(q, v, v_null, n)
        assert len(set(slate.tolist())) == n
        assert value == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_greedy_and_topk_against_the_lp():
    rng = np.random.default_rng(3)
    gaps = []
    for _ in range(60):
        q, v, v_null = _instance(rng, 12, null=bool(rng.integers(2)))
        _, best = lp_slate(q, v, v_null, 4)
        g = slate_values(
            q[None],
            v[None],
            np.array([v_null]),
            greedy_slates(q[None], v[None], np.array([v_null]), 4),
        )[0]
        t = slate_values(q[None], v[None], np.array([v_null]), topk_slates(q[None], v[None], 4))[0]
        assert g <= best + 1e-12 and t <= best + 1e-12
        gaps.append((best - g) / abs(best))
    assert np.mean(gaps) < 0.01 and np.max(gaps) < 0.05
    # Without a null item the greedy slate starts from the item of largest q.
    q = np.array([[0.2, 0.9, 0.5, 0.1]])
    assert greedy_slates(q, np.ones_like(q), np.zeros(1), 2)[0, 0] == 1


# ------------------------------------------------------------------------------- learning


def _tiny(**changes) -> FedSlateConfig:
    base = {
        "num_candidates": 6,
        "slate_size": 2,
        "steps_per_platform": 12,
        "episodes": 1,
        "members": 2,
        "burn_in": 11,
        "learn_every": 12,
        "buffer_size": 16,
        "batch_size": 4,
        "local_hidden": (8,),
        "server_hidden": (4,),
        "seed": 0,  # seeded: the tests compare runs
    }
    return FedSlateConfig(**(base | changes))


def _initial(config: FedSlateConfig) -> dict[str, dict[str, torch.Tensor]]:
    tree = SeedTree(config.seed)
    env = config.env_config()
    nets = {
        f"local_{'ABCDE'[p]}": local_network(
            config, env.state_dim(p), torch_generator(tree, "init", "local", p)
        )
        for p in range(config.num_platforms)
    }
    nets["server"] = ServerNetwork(
        config.members,
        config.num_platforms,
        config.num_candidates,
        config.server_hidden,
        generator=torch_generator(tree, "init", "server"),
    )
    return {name: {k: v.clone() for k, v in net.state_dict().items()} for name, net in nets.items()}


def _changed(result, initial) -> set[str]:
    return {
        name
        for name, state in initial.items()
        if any(not torch.equal(state[k], v) for k, v in result.networks[name].state_dict().items())
    }


def test_one_learning_step_updates_each_local_once_and_the_server_twice():
    config = _tiny()
    initial = _initial(config)
    result = run_fedslate(config)  # 12 rounds: exactly one learning step (round 12)
    assert result.learn_steps == 1
    assert result.updates == {"local_A": 1, "local_B": 1, "server": 2}
    assert _changed(result, initial) == {"local_A", "local_B", "server"}


def test_learning_step_variants():
    ext = run_fedslate(_tiny(variant="extended"))
    assert ext.updates == {"local_A": 1, "local_B": 1, "server": 2}
    five = run_fedslate(_tiny(num_platforms=5, feedback=(True, True, True, False, False)))
    assert five.updates == {f"local_{p}": 1 for p in "ABCDE"} | {"server": 5}
    slateq = run_slateq(
        SlateQConfig(
            **{k: v for k, v in _tiny().to_dict().items() if k in SlateQConfig.__dataclass_fields__}
        )
    )
    assert slateq.updates == {"local_A": 1} and set(slateq.networks) == {"local_A"}


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("algorithm", ["fedslate", "fedslate_dp", "slateq"])
def test_an_interrupted_run_resumes_from_its_checkpoint_number_for_number(
    tmp_path, monkeypatch, algorithm
):
    """Killed mid-episode after a checkpoint, the rerun resumes and equals the unbroken run
    (under DP too: the noise streams, the local DP-SGD's and the replay's units are state)."""
    config = _tiny(episodes=5, learn_every=3, target_sync=7, variant="fedslate")
    if algorithm == "fedslate_dp":
        config = dataclasses.replace(config, fusion="dp", dp_epsilon=8.0)
    if algorithm == "slateq":
        config = SlateQConfig(
            **{
                k: v
                for k, v in config.to_dict().items()
                if k
                in (
                    "num_candidates",
                    "slate_size",
                    "steps_per_platform",
                    "episodes",
                    "members",
                    "burn_in",
                    "learn_every",
                    "buffer_size",
                    "batch_size",
                    "local_hidden",
                    "target_sync",
                    "seed",
                )
            }
        )
    train = run_slateq if algorithm == "slateq" else run_fedslate
    unbroken = train(config)

    path = tmp_path / "run.pt"
    checkpoints = EpisodeCheckpoints(path, every=2)
    steps = {"n": 0}
    real_step = ChocKaleBatch.step

    def step_then_fail(self, platform, slates):
        steps["n"] += 1
        if steps["n"] == 3 * 24 + 5:  # in episode 4, after the checkpoint of episode 2
            raise _Interrupted
        return real_step(self, platform, slates)

    monkeypatch.setattr(ChocKaleBatch, "step", step_then_fail)
    with pytest.raises(_Interrupted):
        train(config, checkpoints=checkpoints)
    monkeypatch.setattr(ChocKaleBatch, "step", real_step)
    assert path.is_file()
    resumed = train(config, checkpoints=checkpoints)

    np.testing.assert_array_equal(resumed.episode_rewards, unbroken.episode_rewards)
    assert resumed.learn_steps == unbroken.learn_steps and resumed.updates == unbroken.updates
    for name, net in unbroken.networks.items():
        for a, b in zip(net.parameters(), resumed.networks[name].parameters(), strict=True):
            assert torch.equal(a, b), name
    # Finished: the checkpoint now holds the end state; another configuration is refused.
    again = train(config, checkpoints=checkpoints)
    np.testing.assert_array_equal(again.episode_rewards, unbroken.episode_rewards)
    other = dataclasses.replace(config, seed=1)
    with pytest.raises(CheckpointError, match="seed"):
        train(other, checkpoints=checkpoints)
    with pytest.raises(ValueError, match="every"):
        EpisodeCheckpoints(path, every=0)


def test_a_resumed_run_has_the_fusion_view_of_the_unbroken_run(tmp_path, monkeypatch):
    """The channel's record of what the server saw is part of the checkpoint."""
    config = _tiny(episodes=3, learn_every=3, target_sync=7)
    keep = RoundSelection(rounds=frozenset({3}), last=20)  # spans the checkpoint
    unbroken = run_fedslate(config, keep_payloads=keep).fusion_view
    checkpoints = EpisodeCheckpoints(tmp_path / "run.pt", every=1)
    steps = {"n": 0}
    real_step = ChocKaleBatch.step

    def step_then_fail(self, platform, slates):
        steps["n"] += 1
        if steps["n"] == 2 * 24 + 5:  # in episode 3, after the checkpoint of episode 2
            raise _Interrupted
        return real_step(self, platform, slates)

    monkeypatch.setattr(ChocKaleBatch, "step", step_then_fail)
    with pytest.raises(_Interrupted):
        run_fedslate(config, checkpoints=checkpoints, keep_payloads=keep)
    monkeypatch.setattr(ChocKaleBatch, "step", real_step)
    resumed = run_fedslate(config, checkpoints=checkpoints, keep_payloads=keep).fusion_view
    assert resumed.counts == unbroken.counts and resumed.steps == unbroken.steps
    for name, array in unbroken.ledger().items():
        np.testing.assert_array_equal(resumed.ledger()[name], array)
    assert resumed.rounds_with_payloads() == [3, *range(16, 36)]
    assert [e.step for e in resumed.exchanges] == [e.step for e in unbroken.exchanges]
    for mine, theirs in zip(resumed.exchanges, unbroken.exchanges, strict=True):
        assert mine.payloads.keys() == theirs.payloads.keys()
        for party, fields in theirs.payloads.items():
            for field, value in fields.items():
                np.testing.assert_array_equal(mine.payloads[party][field], value)
    with pytest.raises(CheckpointError, match="keeps payloads"):
        run_fedslate(config, checkpoints=checkpoints, keep_payloads=ALL_PAYLOADS)


def test_item_alignment_fuses_every_platforms_value_of_the_same_documents():
    rng = np.random.default_rng(0)
    x_a, x_b = rng.random((2, 3, 1 + 4 + 6)), rng.random((2, 3, 1 + 4))
    seen = on_candidates_of(x_a, x_b, 4)  # A's user features, B's candidates
    np.testing.assert_array_equal(seen[..., :1], x_a[..., :1])
    np.testing.assert_array_equal(seen[..., 1:5], x_b[..., 1:5])
    np.testing.assert_array_equal(seen[..., 5:], x_a[..., 5:])
    as_torch = on_candidates_of(torch.from_numpy(x_a), torch.from_numpy(x_b), 4)
    np.testing.assert_array_equal(as_torch.numpy(), seen)
    # Acting asks the server once per platform (each on its own candidates), not once for all:
    # the channel's view records every acting inquiry (tag "act") with the parties it answered.
    aligned = run_fedslate(_tiny(alignment="item"), keep_payloads=ALL_PAYLOADS)
    acting_outputs = [e.outputs for e in aligned.fusion_view.exchanges_of(tag="act")]
    assert aligned.updates == {"local_A": 1, "local_B": 1, "server": 2}
    assert set(acting_outputs) >= {("A",), ("B",)} and ("A", "B") not in acting_outputs
    acting_outputs.clear()
    position = run_fedslate(_tiny(), keep_payloads=ALL_PAYLOADS)
    acting_outputs += [e.outputs for e in position.fusion_view.exchanges_of(tag="act")]
    assert ("A", "B") in acting_outputs
    with pytest.raises(ValueError, match="alignment"):
        _tiny(alignment="nearest")


def test_no_feedback_platform_does_not_learn_from_its_rewards(monkeypatch):
    """Scaling B's engagements by 10 changes B's reward totals and nothing that is learned."""
    config = _tiny(episodes=2, learn_every=3)
    plain = run_fedslate(config)
    original = ChocKaleBatch.step

    def louder_b(self, platform, slates):
        out = original(self, platform, slates)
        if platform == 1:
            out.engagement = out.engagement * 10
        return out

    monkeypatch.setattr(ChocKaleBatch, "step", louder_b)
    louder = run_fedslate(config)
    np.testing.assert_allclose(louder.episode_rewards[..., 1], 10 * plain.episode_rewards[..., 1])
    np.testing.assert_array_equal(louder.episode_rewards[..., 0], plain.episode_rewards[..., 0])
    for name, net in plain.networks.items():
        for a, b in zip(net.parameters(), louder.networks[name].parameters(), strict=True):
            assert torch.equal(a, b), name


def test_split_fusion_gradients_equal_direct_autograd():
    torch.manual_seed(0)
    net = ServerNetwork(2, 2, 5, (4,), generator=torch.Generator().manual_seed(1))
    # The server's optimiser steps by 0, so that the direct pass below sees the same weights.
    frozen = torch.optim.SGD(net.parameters(), lr=0.0)
    fusion = ModuleFusionChannel(("A", "B"), net, frozen, members=2)
    qa = torch.randn(2, 3, 5, requires_grad=True)
    qb = torch.randn(2, 3, 5, requires_grad=True)
    pos = torch.tensor([[[0], [2], [4]], [[1], [1], [3]]])
    fused = fusion.forward({"A": qa, "B": qb}, outputs=["A"], positions={"A": pos})["A"]
    fused = fused.requires_grad_(True)
    (fused**2).sum().backward()
    grads = fusion.backward({"A": fused.grad})
    split_server = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    direct = torch.gather(net([qa, qb]), 2, pos)
    (direct**2).sum().backward()
    torch.testing.assert_close(grads["A"], qa.grad)
    torch.testing.assert_close(grads["B"], qb.grad)
    for a, b in zip(split_server, net.parameters(), strict=True):
        torch.testing.assert_close(a, b.grad)
    # FedQ's server sees zeros for the other platform.
    fedq = ModuleFusionChannel(("A", "B"), net, frozen, members=2, cross=False)
    with torch.no_grad():
        one = fedq.forward({"A": qa, "B": qb}, outputs=["A"], train=False)["A"]
        two = fedq.forward({"A": qa, "B": qb * 7}, outputs=["A"], train=False)["A"]
    torch.testing.assert_close(one, two)


def test_numpy_acting_path_equals_torch():
    net = LocalQNetwork(2, 1 + 7 + 6, 7, (5, 5), generator=torch.Generator().manual_seed(2))
    x = np.random.default_rng(0).random((2, 3, 14)).astype(np.float32)
    np.testing.assert_allclose(net.numpy_forward(x), net(torch.from_numpy(x)).detach(), atol=1e-5)
    server = ServerNetwork(2, 3, 7, (4, 4), generator=torch.Generator().manual_seed(3))
    qs = [np.random.default_rng(i).random((2, 3, 7)).astype(np.float32) for i in range(3)]
    np.testing.assert_allclose(
        server.numpy_forward(qs),
        server([torch.from_numpy(q) for q in qs]).detach(),
        atol=1e-5,
    )


def test_runs_are_deterministic_for_a_seed():
    config = _tiny(episodes=3, learn_every=3)
    one, two = run_fedslate(config), run_fedslate(config)
    np.testing.assert_array_equal(one.episode_rewards, two.episode_rewards)
    for name, net in one.networks.items():
        for a, b in zip(net.parameters(), two.networks[name].parameters(), strict=True):
            assert torch.equal(a, b)
    other = run_fedslate(_tiny(episodes=3, learn_every=3, seed=1))
    assert not np.array_equal(one.episode_rewards, other.episode_rewards)


def test_replay_buffer_aligns_platforms_and_sarsa_next_slates():
    buf = ReplayBuffer(4, 1, [3, 2], 2)
    for t in range(5):
        for p, d in enumerate((3, 2)):
            buf.add(
                p,
                np.full((1, d), t),
                np.full((1, 2), t),
                np.array([t]),
                np.array([t]),
                np.zeros((1, d)),
            )
        buf.commit(done=t == 2)
    assert buf.size == 4
    rows = {int(buf.x[0][r, 0, 0]): r for r in range(4)}
    assert buf.next_slate[0][rows[1], 0, 0] == 2  # SARSA: the slate taken in the next round
    idx = buf.sample(np.random.default_rng(0), 50, sarsa=True)
    assert rows[4] not in set(idx.ravel().tolist())  # newest row's next slate is unknown
    assert np.array_equal(buf.gather(buf.x, 0, idx)[..., 0], buf.gather(buf.x, 1, idx)[..., 0])


def test_metrics():
    series = np.concatenate(
        [np.full(200, 900.0), np.linspace(900, 1100, 300), np.full(500, 1100.0)]
    )
    ma = moving_average(series, 100)
    assert len(ma) == len(series) - 99 and ma[0] == 900
    assert optimal_reward(series) == pytest.approx(1100)
    first = etror(series)
    assert moving_average(series)[first - 100] >= 0.99 * 1100 > moving_average(series)[first - 101]
    config = SlateQConfig(episodes=2, num_candidates=6, slate_size=2, seed=0)
    ref = run_reference(config, "random", users=3)
    assert ref.episode_rewards.shape == (2, 3, 2)


def test_reference_episodes_side_by_side_draw_the_same_distribution():
    """Fixed-policy episodes are independent: batching them keeps the reward distribution."""
    config = SlateQConfig(episodes=30, num_candidates=10, slate_size=3, seed=0)
    one_by_one = run_reference(config, "highest_k", users=20).episode_rewards
    batched = run_reference(config, "highest_k", users=20, episodes_at_once=7).episode_rewards
    assert batched.shape == one_by_one.shape == (30, 20, 2)
    assert len(np.unique(batched[:7, 0, 0])) == 7  # side-by-side episodes are distinct draws
    # 600 episodes each, per-episode s.d. about 170: the means agree within 4 s.e. of the gap.
    se = np.hypot(one_by_one.std() / np.sqrt(600), batched.std() / np.sqrt(600))
    assert abs(one_by_one.mean() - batched.mean()) < 4 * se
    with pytest.raises(ValueError, match="episodes_at_once"):
        run_reference(config, "random", users=2, episodes_at_once=0)


# -------------------------------------------------------------------------- CLI and benchmark


def test_cli_one_run_writes_json_and_curve(tmp_path, capsys):
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    code = fedslate_main(
        [
            "--candidates",
            "6",
            "--slate",
            "2",
            "--episodes",
            "3",
            "--burn-in",
            "60",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert code == 0 and png.stat().st_size > 0
    record = json.loads(out.read_text())
    assert record["updates"]["server"] == 2 * record["learn_steps"] > 0
    assert set(record["metrics"]) == {"A", "B"}
    assert fedslate_main(["--candidates", "2", "--slate", "3"]) == 2
    assert "slate_size" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["fedslate", "--platforms", "5", "--feedback", "1,1,1,0,0"])
    assert args.feedback == (True, True, True, False, False)
    args = parser.parse_args(["fedslate", "--alignment", "item"])
    assert cli_config(args).alignment == "item"


def test_bench_registers_and_reports(tmp_path):
    parser = argparse.ArgumentParser()
    bench_fedslate.register(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(
        [
            "fedslate",
            "--out",
            str(tmp_path),
            "--episodes",
            "2",
            "--members",
            "2",
            "--settings",
            "6x2",
            "--experiments",
            "table",
        ]
    )
    args = bench_fedslate._finish(args)
    results = bench_fedslate.run(args)
    row = results["table"]["N6_n2"]
    assert {"random", "highest_k", "slateq", "fedslate", "A_highest_k+B_lowest_k"} <= set(
        row["cells"]
    )
    assert (tmp_path / "fedslate.md").exists() and (tmp_path / "fedslate_curves.png").exists()
    saved = json.loads((tmp_path / "fedslate.json").read_text())
    assert saved["checks"] and "N6_n2" in saved["results"]["table"]
    cached = bench_fedslate.run_cell(
        bench_fedslate.Cell(
            "N6_n2_random",
            "random",
            SlateQConfig(num_candidates=6, slate_size=2, episodes=2, members=2, seed=0),
        ),
        tmp_path,
    )
    assert cached["rewards"] == row["records"]["random"]["rewards"]
    assert saved["meta"]["runs_executed"] == 6 and saved["meta"]["runs_cached"] == 0
    assert not list((tmp_path / "runs" / "partial").glob("*"))  # checkpoints gone with the run
    flat_out = str(tmp_path / "flat")
    flat_args = parser.parse_args(
        [
            *("fedslate", "--out", flat_out, "--episodes", "2", "--members", "2"),
            *("--experiments", "ablation_flat", "--ablation-setting", "6x2"),
        ]
    )
    flat = bench_fedslate.run(bench_fedslate._finish(flat_args))["ablation_flat"]
    assert flat["records"]["linear_flat"]["config"]["server_arch"] == "flat"
    assert flat["records"]["linear_flat"]["config"]["variant"] == "linear"
    checks = bench_fedslate.checks({"ablation_flat": flat})
    assert len(checks) == 2 and all("linear_flat final" in line for line in checks)
    # A run recorded before a configuration field existed matches that field's default only.
    config = FedSlateConfig(num_candidates=6, slate_size=2, episodes=2, members=2)
    older = json.loads(bench_fedslate._config_key(config, "fedslate"))
    older.pop("alignment")
    older_key = json.dumps(older, sort_keys=True)
    assert bench_fedslate._same_configuration(older_key, config, "fedslate")
    item = FedSlateConfig(num_candidates=6, slate_size=2, episodes=2, members=2, alignment="item")
    assert not bench_fedslate._same_configuration(older_key, item, "fedslate")
    assert not bench_fedslate._same_configuration(older_key, config, "slateq")


def test_bench_runs_only_the_named_runs_and_checks_the_five_platform_claim(tmp_path):
    parser = argparse.ArgumentParser()
    bench_fedslate.register(parser.add_subparsers(dest="bench"))
    common = [*("fedslate", "--out", str(tmp_path), "--members", "2", "--platform-episodes", "2")]
    common += [*("--experiments", "platforms", "--ablation-setting", "6x2")]
    args = bench_fedslate._finish(
        parser.parse_args([*common, "--runs", "slateq_all,fedslate_two_without_item"])
    )
    results = bench_fedslate.run(args)
    assert set(results["platforms"]["cells"]) == {"slateq_all", "fedslate_two_without_item"}
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2
    lines = [line for line in bench_fedslate.checks(results) if "platforms:" in line]
    assert [line.split()[4] for line in lines] == ["D", "E"]  # only the two without feedback
    assert all(line.startswith(("PASS", "FAIL")) for line in lines)
    with pytest.raises(ValueError, match="linear"):
        bench_fedslate._finish(parser.parse_args([*common, "--runs", "slateq_all,linear"]))
    # An experiment none of whose runs is named drops out (ablation has no slateq_all).
    both = [*common, "--experiments", "ablation,platforms", "--runs", "slateq_all"]
    assert bench_fedslate._finish(parser.parse_args(both)).experiments == ("platforms",)


def test_bench_worker_processes_reproduce_the_single_process_runs(tmp_path):
    """--jobs 2 runs the uncached cells in spawned workers: the same numbers, then the cache."""
    parser = argparse.ArgumentParser()
    bench_fedslate.register(parser.add_subparsers(dest="bench"))
    common = ["--episodes", "3", "--members", "2", "--settings", "6x2", "--experiments", "table"]
    records = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        args = parser.parse_args(["fedslate", "--out", str(out), "--jobs", str(jobs), *common])
        results = bench_fedslate.run(bench_fedslate._finish(args))
        records[jobs] = results["table"]["N6_n2"]["records"]
        meta = json.loads((out / "fedslate.json").read_text())["meta"]
        assert meta["jobs"] == jobs and meta["runs_executed"] == 6
    for name in ("fedslate", "slateq", "random", "A_highest_k+B_lowest_k"):
        assert records[1][name]["rewards"] == records[2][name]["rewards"], name
    args = parser.parse_args(["fedslate", "--out", str(out), "--jobs", "2", *common])
    again = bench_fedslate.run(bench_fedslate._finish(args))  # the jobs-2 directory, cached
    assert (
        again["table"]["N6_n2"]["records"]["fedslate"]["rewards"]
        == records[2]["fedslate"]["rewards"]
    )
    assert json.loads((out / "fedslate.json").read_text())["meta"]["runs_executed"] == 0


def test_platforms_are_coupled_through_the_shared_user():
    """B's kale slates raise A's reward: the team target rewards B for showing kale."""
    config = SlateQConfig(episodes=1, num_candidates=10, slate_size=3, seed=0)
    both_high = run_reference(config, "highest_k", users=300).episode_rewards.mean(axis=(0, 1))
    b_low = run_reference(config, "highest_k+lowest_k", users=300).episode_rewards.mean(axis=(0, 1))
    assert b_low[0] > both_high[0] + 40 and b_low[1] < both_high[1] - 150
    with pytest.raises(ValueError, match="policy"):
        run_reference(config, "highest_k+best", users=2)
