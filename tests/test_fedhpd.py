"""FedHPD (rl/): the learner's mathematics, the fast learner against the step-by-step reference,
the transport path of the uploads, the metric, the command line; tiny schedules throughout."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from securefed import PlaintextTransport, SeedTree
from securefed.rl.fast import (
    CartPoleBatch,
    Population,
    _Group,
    make_public_states,
    train,
    train_population,
)
from securefed.rl.fedhpd import (
    TASKS,
    FedHPDConfig,
    MissingExtra,
    ReferenceRun,
    RunSpec,
    aggregate_uploads,
    consensus,
    discounted_returns,
    kl_categorical,
    kl_gaussian,
    plot_agents,
    plot_system,
    require_task,
    system_average_reward,
    system_curve,
)
from securefed.rl.policies import AGENTS, AgentSpec, make_policy

CARTPOLE = AGENTS["cartpole"]
# Four agents, three architectures: two relu depths, one tanh, and a shared one across runs.
SMALL_AGENTS = (CARTPOLE[0], CARTPOLE[2], CARTPOLE[5], CARTPOLE[9])


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def tiny(algorithm="fedhpd", *, task="cartpole", agents=SMALL_AGENTS, **overrides):
    settings = {
        "task": task,
        "algorithm": algorithm,
        "d": 1 if algorithm == "dpa" else 2,
        "rounds": 6,
        "agent_specs": agents,
        "public_size": 300,
        "part_size": 100,
        "distill_loops": 2,
        "virtual_rounds": 8,
    } | overrides
    return FedHPDConfig(**settings)


def reference_kernels(runs):
    """The fast learner on the reference learner's float kernels (``torch.tanh``, last-axis
    softmax): runs compared with the reference for equal returns use these, so no action draw
    can flip on one CPU's tanh against another's (the default kernels differ from torch's by an
    ulp; tests/test_fedhpd_fast_kernels.py compares the two within float32 rounding)."""
    return Population(runs, kernels="torch").run()


def assert_same_run(reference, fast, atol=1e-5):
    np.testing.assert_array_equal(reference.returns, fast.returns)
    for a, b in zip(reference.params, fast.params, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


# -- configuration --------------------------------------------------------------------------------
def test_config_fills_task_defaults_and_refuses_bad_input():
    config = FedHPDConfig()
    assert (config.rounds, config.public_size, config.n_agents) == (2000, 5000, 10)
    assert config.direction == "mean_to_local"
    assert FedHPDConfig(task="invertedpendulum").direction == "local_to_mean"
    assert FedHPDConfig(d=5).aggregation_rounds() == 400 * 5 * 2
    with pytest.raises(ValueError, match="unknown task"):
        FedHPDConfig(task="pong")
    with pytest.raises(ValueError, match="d must be"):
        FedHPDConfig(d=0)
    with pytest.raises(ValueError, match="discrete tasks only"):
        FedHPDConfig(task="invertedpendulum", algorithm="dpa")
    with pytest.raises(ValueError, match="activations"):
        AgentSpec((8, 8), ("relu",), 1e-3)


def test_agent_tables_follow_the_spec():
    assert all(len(agents) == 10 for agents in AGENTS.values())
    assert CARTPOLE[2].hidden == (16, 16, 32) and CARTPOLE[2].activations == ("tanh",) * 3
    assert AGENTS["invertedpendulum"][2].activations == ("tanh", "relu")
    assert AGENTS["lunarlander"][9].hidden == (1024,) and AGENTS["lunarlander"][9].lr == 1e-4


# -- REINFORCE pieces -----------------------------------------------------------------------------
def test_discounted_returns_and_normalisation():
    g = discounted_returns(np.array([1.0, 1.0, 1.0]), 0.5, normalise=False)
    np.testing.assert_allclose(g, [1.75, 1.5, 1.0])
    n = discounted_returns(np.array([1.0, 1.0, 1.0]), 0.5, normalise=True)
    np.testing.assert_allclose(n, (g - g.mean()) / (g.std(ddof=1) + 1e-5))
    assert discounted_returns(np.array([3.0]), 0.99, normalise=True).tolist() == [0.0]


def test_cartpole_batch_matches_gymnasium_bit_for_bit():
    import gymnasium as gym

    envs = [gym.make("CartPole-v1") for _ in range(6)]
    batch = CartPoleBatch(6, 500)
    seeds = list(range(6))
    first = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)])
    np.testing.assert_array_equal(first, batch.reset(np.arange(6), seeds))
    rng = np.random.default_rng(1)
    alive = np.ones(6, dtype=bool)
    for _ in range(200):
        actions = rng.integers(0, 2, 6)
        obs, _, done = batch.step(actions, alive)
        for i in np.flatnonzero(alive):
            o, _, terminated, truncated, _ = envs[i].step(int(actions[i]))
            np.testing.assert_array_equal(o, obs[i])
            assert (terminated or truncated) == done[i]
        alive &= ~done
        if not alive.any():
            break


@pytest.mark.parametrize("task", ["cartpole", "invertedpendulum"])
def test_stacked_adam_is_torch_adam_bit_for_bit(task):
    spec = TASKS[task]
    agent = AGENTS[task][1]
    policies = [
        make_policy(agent, spec.kind, spec.obs_dim, spec.act_dim, torch.Generator().manual_seed(i))
        for i in range(3)
    ]
    twins = [copy.deepcopy(p) for p in policies]
    optimizer = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.Adam
    optimizers = [optimizer(p.parameters(), lr=1e-3 * (i + 1)) for i, p in enumerate(twins)]
    group = _Group(policies, [1e-3 * (i + 1) for i in range(3)], spec)
    n = group.flat.shape[1]
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        rows = np.array([0, 2]) if step % 2 else np.arange(3)  # copy 1 sits some steps out
        grads = torch.randn(len(rows), n, generator=gen)
        for grad, i in zip(grads, rows.tolist(), strict=True):
            offset = 0
            for p in twins[i].parameters():
                p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizers[i].step()
        group.adam_step(rows, grads, schedule=False)
    for i, twin in enumerate(twins):
        expected = torch.nn.utils.parameters_to_vector(twin.parameters()).detach()
        assert torch.equal(expected, group.flat[i])


# -- the distillation step on a tiny example ------------------------------------------------------
def test_categorical_kl_both_directions_and_gradient():
    p_k = torch.tensor([[[0.7, 0.3], [0.2, 0.8]]])
    p_mean = torch.tensor([[0.5, 0.5], [0.4, 0.6]])
    logits = p_k.log().clone().requires_grad_(True)
    log_p = torch.log_softmax(logits, -1)
    code = kl_categorical(log_p, p_mean, "mean_to_local")
    expected = (p_mean * (p_mean / p_k[0]).log()).sum() / 2
    torch.testing.assert_close(code, expected.reshape(1))
    (grad,) = torch.autograd.grad(code.sum(), logits)
    torch.testing.assert_close(grad[0], (p_k[0] - p_mean) / 2)  # d KL(m||p) / d logits
    paper = kl_categorical(p_k.log(), p_mean, "local_to_mean")
    torch.testing.assert_close(paper, ((p_k[0] * (p_k[0] / p_mean).log()).sum() / 2).reshape(1))
    assert kl_categorical(p_mean.log()[None], p_mean, "mean_to_local").abs().item() < 1e-7


def test_gaussian_kl_matches_torch_distributions():
    from torch.distributions import Normal, kl_divergence

    mean, std = torch.tensor([[[0.1], [-0.4]]]), torch.tensor([[[0.5], [1.2]]])
    target = torch.tensor([[0.3, 0.7], [0.0, 1.0]])  # [mean of means, mean of stds]
    local = Normal(mean[0], std[0])
    global_ = Normal(target[:, :1], target[:, 1:])
    torch.testing.assert_close(
        kl_gaussian(mean, std, target, "local_to_mean")[0], kl_divergence(local, global_).mean()
    )
    torch.testing.assert_close(
        kl_gaussian(mean, std, target, "mean_to_local")[0], kl_divergence(global_, local).mean()
    )


def test_distillation_event_pulls_agents_to_the_consensus():
    config = tiny(rounds=1, d=1, distill_loops=3, part_size=300)
    public = np.random.default_rng(0).normal(0, 0.1, (300, 4)).astype(np.float32)
    run = ReferenceRun(RunSpec(config, 20, public_states=public))
    states = torch.as_tensor(public)

    def spread():
        with torch.no_grad():
            probs = torch.stack([a.policy.distribution(states) for a in run.agents])
        return float(kl_categorical(probs.log(), probs.mean(0), "mean_to_local").mean())

    before = spread()
    run.distill()
    assert spread() < before
    assert run.aggregations == 3  # one transport round per part and loop


# -- the transport path ---------------------------------------------------------------------------
def test_uploads_reach_the_server_only_as_their_mean():
    uploads = np.random.default_rng(0).dirichlet([1, 1], size=(4, 50))
    transport = PlaintextTransport()
    mean = aggregate_uploads(transport, 0, uploads, SeedTree(0))
    np.testing.assert_allclose(mean, uploads.mean(0), rtol=0, atol=1e-15)
    assert transport.view.rounds[0].clients.tolist() == [0, 1, 2, 3]


def test_secure_aggregation_gives_the_same_mean():
    from securefed.transport import build_transport

    uploads = np.random.default_rng(0).dirichlet([1, 1, 1], size=(5, 40))
    transport = build_transport("secagg", n_clients=5)
    mean = aggregate_uploads(transport, 0, uploads, SeedTree(0))
    np.testing.assert_allclose(mean, uploads.mean(0), rtol=0, atol=1e-5)
    assert (consensus(mean, "categorical", 3) >= 0).all()


# -- the fast learner against the reference -------------------------------------------------------
@pytest.fixture(scope="module")
def public_states():
    return make_public_states(tiny())


def test_public_state_set_is_drawn_per_cluster(public_states):
    assert public_states.shape == (300, 4) and public_states.dtype == np.float32
    np.testing.assert_array_equal(public_states, make_public_states(tiny()))


@pytest.mark.parametrize("algorithm", ["fedhpd", "nofed", "dpa"])
def test_fast_learner_equals_the_step_by_step_reference(algorithm, public_states):
    config = tiny(algorithm)
    public = public_states if algorithm == "fedhpd" else None
    reference = ReferenceRun(RunSpec(config, 20, public_states=public)).run()
    (fast,) = reference_kernels([RunSpec(config, 20, public_states=public)])
    assert_same_run(reference, fast)
    assert fast.returns.shape == (6, 4) and fast.returns.min() >= 8


def test_the_reference_learner_refuses_a_fedhpd_run_without_its_public_states():
    with pytest.raises(ValueError, match="needs its public state set"):
        ReferenceRun(RunSpec(tiny(), 20))
    ReferenceRun(RunSpec(tiny("nofed"), 20))  # NoFed distils nothing: no S_p needed


def test_train_makes_the_public_states_for_either_learner(public_states):
    config = tiny(rounds=3)
    fast = train(config, 20)  # S_p from make_public_states(config), cached per process
    reference = train(config, 20, learner="reference")
    (same_kernels,) = reference_kernels([RunSpec(config, 20, public_states=public_states)])
    assert_same_run(reference, same_kernels)
    explicit = train(config, 20, public_states=public_states)
    np.testing.assert_array_equal(explicit.returns, fast.returns)
    with pytest.raises(ValueError, match="learner must be fast or reference"):
        train(config, 20, learner="vectorised")


def test_population_of_settings_equals_separate_runs(public_states):
    runs = [
        RunSpec(tiny("fedhpd"), 20, public_states=public_states),
        RunSpec(tiny("nofed"), 25),
        RunSpec(tiny("fedhpd", d=3), 25, public_states=public_states),
    ]
    together = train_population(runs)
    for run, result in zip(runs, together, strict=True):
        (alone,) = train_population([run])
        assert_same_run(alone, result, atol=1e-6)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_learner_leaves_torch_threads_to_its_caller(workers, monkeypatch):
    from securefed.rl.fast import train_parallel

    monkeypatch.setattr(torch, "set_num_threads", _refuse_global_setting)  # forked workers too
    runs = [RunSpec(tiny("nofed", rounds=2), seed) for seed in (20, 25)]
    results = train_parallel(runs, workers)
    assert [r.seed for r in results] == [20, 25]


def test_a_seed_determines_the_run(public_states):
    config = tiny()
    a, b = (train_population([RunSpec(config, 30, public_states=public_states)])[0] for _ in "ab")
    np.testing.assert_array_equal(a.returns, b.returns)
    for x, y in zip(a.params, b.params, strict=True):
        np.testing.assert_array_equal(x, y)
    (other,) = train_population([RunSpec(config, 31, public_states=public_states)])
    assert not np.array_equal(a.returns, other.returns)


def test_training_under_secure_aggregation_matches_plaintext(public_states):
    from securefed.transport import build_transport

    config = tiny(rounds=4, distill_loops=1)
    secure = build_transport("secagg", n_clients=config.n_agents)
    plain = PlaintextTransport()
    runs = [RunSpec(config, 20, t, public_states) for t in (plain, secure)]
    a, b = train_population(runs)
    np.testing.assert_array_equal(a.returns, b.returns)
    for x, y in zip(a.params, b.params, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4)
    assert b.transport == "secagg" and b.bytes_up > a.bytes_up > 0


# -- other tasks, end to end ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("task", "agents"),
    [
        ("lunarlander", (AGENTS["lunarlander"][7], AGENTS["lunarlander"][1])),
        ("invertedpendulum", (AGENTS["invertedpendulum"][0], AGENTS["invertedpendulum"][1])),
    ],
)
def test_other_tasks_end_to_end(task, agents):
    try:
        require_task(task)
    except MissingExtra as error:
        pytest.skip(str(error))
    config = tiny(
        task=task, agents=agents, rounds=2, d=1, distill_loops=1, public_size=100, part_size=50,
        virtual_rounds=2,
    )  # fmt: skip
    public = make_public_states(config)
    assert public.shape == (100, TASKS[task].obs_dim)
    reference = ReferenceRun(RunSpec(config, 20, public_states=public)).run()
    (fast,) = reference_kernels([RunSpec(config, 20, public_states=public)])
    assert_same_run(reference, fast, atol=1e-4)


# -- the metric, plots, command line --------------------------------------------------------------
def test_system_average_reward_is_the_moving_average_mean():
    rng = np.random.default_rng(0)
    returns = rng.uniform(0, 500, (5, 120, 10))
    per_round = returns.mean(axis=(0, 2))
    expected = np.mean([per_round[i : i + 50].mean() for i in range(71)])
    assert math.isclose(system_average_reward(returns), expected, rel_tol=1e-12)
    assert system_curve(returns).shape == (71,)
    with pytest.raises(ValueError, match="seeds, rounds, agents"):
        system_average_reward(returns[0])


def _refuse_global_setting(*args, **kwargs):
    raise AssertionError("library code changed a process-wide setting")


def test_plots_are_written_without_choosing_a_backend(tmp_path, monkeypatch):
    import matplotlib

    monkeypatch.setattr(matplotlib, "use", _refuse_global_setting)
    returns = {"NoFed": np.random.default_rng(0).uniform(0, 50, (2, 60, 3))}
    assert plot_system(returns, tmp_path / "s.png").stat().st_size > 1000
    assert plot_agents(returns, tmp_path / "a.png").stat().st_size > 1000


def test_command_line_runs_and_reports(tmp_path, capsys):
    from securefed.bench.cli_fedhpd import main

    code = main(
        ["fedhpd", "--rounds", "3", "--seeds", "20", "--public-size", "200", "--virtual-rounds",
         "5", "--workers", "1", "--d", "1", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["setting"] == "FedHPD (d=1)" and record["paper"] is None
    assert record["bytes_up_per_run"] > 0
    assert json.loads((tmp_path / "fedhpd.json").read_text())["rounds"] == 3
    assert main(["fedhpd", "--task", "pong"]) == 2
    assert main(["fedhpd", "--transport", "carrier-pigeon", "--rounds", "1"]) == 2


def test_bench_commands_are_registered():
    import argparse

    from securefed.bench.bench_fedhpd import parse_settings, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["fedhpd", "--settings", "nofed,5,dpa", "--seeds", "20"])
    assert parse_settings(args.settings) == [("nofed", 1), ("fedhpd", 5), ("dpa", 1)]
    assert parser.parse_args(["fedhpd-speed", "--rounds", "3"]).rounds == 3


def test_a_short_runs_curve_is_drawn_as_points(tmp_path, monkeypatch):
    """Two rounds at a two-round window leave one point: a line of one point shows nothing."""
    from matplotlib.axes import Axes

    from securefed.rl.fedhpd import plot_agents, plot_system

    markers = []
    draw = Axes.plot

    def record(self, *args, **options):
        markers.append(options.get("marker"))
        return draw(self, *args, **options)

    monkeypatch.setattr(Axes, "plot", record)
    returns = np.arange(2 * 2 * 3, dtype=float).reshape(2, 2, 3)  # (seeds, rounds, agents)
    plot_system({"short": returns}, tmp_path / "s.png", window=2)
    plot_agents({"short": returns}, tmp_path / "a.png", window=2)
    assert markers and all(m == "o" for m in markers)
    markers.clear()
    plot_system({"long": np.zeros((1, 80, 3))}, tmp_path / "l.png", window=10)
    assert markers == [None]  # a real curve stays a line


# -- the column's split over workers and the distillation's loss ---------------------------------
def _paper_column_runs():
    from securefed.rl.fedhpd import SEEDS

    settings = [("nofed", 1), ("fedhpd", 5), ("fedhpd", 10), ("fedhpd", 20)]
    return [RunSpec(FedHPDConfig(algorithm=a, d=d), s) for a, d in settings for s in SEEDS]


def test_run_cost_counts_rounds_and_distillation_steps():
    from securefed.rl.fast import DISTILL_STEP_ROUNDS, run_cost

    nofed, d5, d10 = (FedHPDConfig(algorithm=a, d=d) for a, d in (("nofed", 1), ("fedhpd", 5),
                                                                   ("fedhpd", 10)))  # fmt: skip
    assert run_cost(nofed) == 2000
    # 400 events x 5 loops x 2 parts of 2500 states.
    assert run_cost(d5) == 2000 + DISTILL_STEP_ROUNDS * 4000
    assert run_cost(d5) > run_cost(d10) > run_cost(nofed)
    assert run_cost(FedHPDConfig(d=5, distill_loops=1)) < run_cost(d5)
    assert run_cost(FedHPDConfig(algorithm="dpa")) == run_cost(nofed)


def test_the_paper_column_splits_within_one_nofed_run_and_beats_round_robin():
    from securefed.rl.fast import balanced_chunks, run_cost

    runs = _paper_column_runs()
    chunks = balanced_chunks(runs, 2)
    assert sorted(i for c in chunks for i in c) == list(range(len(runs)))
    loads = [sum(run_cost(runs[i].config) for i in c) for c in chunks]
    assert max(loads) - min(loads) <= run_cost(runs[0].config)  # a NoFed run: 2000 rounds
    order = sorted(range(len(runs)), key=lambda i: (runs[i].config.label(), runs[i].seed))
    round_robin = [sum(run_cost(runs[i].config) for i in order[w::2]) for w in range(2)]
    assert max(loads) < max(round_robin)
    assert balanced_chunks(runs, 2) == chunks  # deterministic
    assert balanced_chunks(runs[:1], 2) == [[0]]  # no empty worker


def _masked_loss(out, target, directions):
    """The split by boolean masks that the fast learner used for every distillation step."""
    from securefed.rl.fedhpd import distill_loss

    directions = np.asarray(directions)
    loss = 0.0
    for direction in np.unique(directions).tolist():
        mask = torch.as_tensor(directions == direction)
        loss = loss + distill_loss(out[mask], None, target[mask], direction).sum()
    return loss


@pytest.mark.parametrize(
    "directions",
    [["mean_to_local"] * 3, ["local_to_mean"] * 3, ["mean_to_local", "local_to_mean"] * 2],
)
def test_the_distillation_loss_without_masks_is_bit_identical(directions):
    from securefed.rl.fast import distill_loss_by_direction

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(len(directions), 50, 2, generator=g, dtype=torch.float32)
    target = torch.softmax(torch.randn(len(directions), 50, 2, generator=g), -1)
    grads = []
    for loss_of in (lambda o: distill_loss_by_direction(o, None, target, directions),
                    lambda o: _masked_loss(o, target, directions)):  # fmt: skip
        out = logits.clone().requires_grad_(True)
        loss = loss_of(out)
        grads.append((loss.detach(), torch.autograd.grad(loss, out)[0]))
    # Equal to the last bit: the same operations on the same values, in the same order.
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])
