"""The fast learner's hand-written kernels (rl/fast.py, ``kernels="fast"``) against torch's:
gradients of the distillation and REINFORCE losses against autograd through ``torch.tanh`` and
the last-axis softmax (float32 rounding apart), the two-action sampler bit for bit against the
general one, a short run of each kernel set, and the whole passes of a ``Population`` that NoFed
and FedHPD run (REINFORCE on the discounted, normalised returns; the distillation event's
uploads and KD loss), each kernel set's gradient handed to Adam against float64, block by block,
with the same rows, schedule and learning rates (issue 32: the fast kernels are no learning-rate,
loss or gradient-scale change)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from securefed.rl.fast import (
    NumpyTanh,
    Population,
    _Group,
    kl_grad_t,
    log_softmax_actions,
    sample_two_actions,
    softmax_actions,
)
from securefed.rl.fedhpd import (
    TASKS,
    FedHPDConfig,
    RunSpec,
    discounted_returns,
    kl_categorical,
)
from securefed.rl.policies import AGENTS, make_policy, sample_categorical, softmax_np

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# float32 products summed in another order, numpy's tanh against torch's: relative to the
# largest entry, measured errors are below 4e-7.
RTOL = 1e-5


def group_of(task: str, k: int, copies: int = 3) -> _Group:
    spec = TASKS[task]
    agent = AGENTS[task][k]
    policies = [
        make_policy(agent, spec.kind, spec.obs_dim, spec.act_dim, torch.Generator().manual_seed(c))
        for c in range(copies)
    ]
    return _Group(policies, [agent.lr] * copies, spec)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= RTOL * float(b.abs().max())


CASES = [("cartpole", k) for k in range(10)] + [("lunarlander", 0), ("lunarlander", 2)]


@pytest.mark.parametrize(("task", "k"), CASES)
@pytest.mark.parametrize(
    "directions",
    [
        ["mean_to_local"] * 3,
        ["local_to_mean"] * 3,
        ["mean_to_local", "local_to_mean", "mean_to_local"],
    ],
)
def test_the_hand_written_distillation_gradient_is_autograds(task, k, directions):
    group = group_of(task, k)
    g = torch.Generator().manual_seed(k)
    spec = TASKS[task]
    x = torch.randn(3, 200, spec.obs_dim, generator=g)
    target = torch.softmax(torch.randn(3, 200, spec.act_dim, generator=g), -1)
    params = group.flat.detach()
    reference = params.clone().requires_grad_(True)
    out, _ = group.forward(reference, x, "torch")
    log_p = F.log_softmax(out, -1)
    loss = sum(kl_categorical(log_p[c], target[c], d) for c, d in enumerate(directions))
    (expected,) = torch.autograd.grad(loss, reference)

    logits_t, kept = group.logits_t(params, x)
    assert close(logits_t.transpose(1, 2), out.detach())
    probs_t = torch.softmax(logits_t, 1)
    grad = group.backward_t(
        params, kept, kl_grad_t(logits_t, probs_t, target.transpose(1, 2).contiguous(), directions)
    )
    assert close(grad, expected)


@pytest.mark.parametrize(("task", "k"), CASES)
def test_the_hand_written_reinforce_gradient_is_autograds(task, k):
    group = group_of(task, k)
    g = torch.Generator().manual_seed(100 + k)
    spec = TASKS[task]
    x = torch.randn(3, 60, spec.obs_dim, generator=g)
    actions = torch.randint(spec.act_dim, (3, 60), generator=g)
    returns = torch.randn(3, 60, generator=g)
    returns[1, 40:] = 0.0  # a shorter episode, zero-padded as in Population.learn
    params = group.flat.detach()
    reference = params.clone().requires_grad_(True)
    out, _ = group.forward(reference, x, "torch")
    log_p = F.log_softmax(out, -1).gather(-1, actions.unsqueeze(-1))[..., 0]
    (expected,) = torch.autograd.grad(-(log_p * returns).sum(), reference)

    logits_t, kept = group.logits_t(params, x)
    grad_t = torch.softmax(logits_t, 1).mul_(returns.unsqueeze(1))
    grad_t.scatter_add_(1, actions.unsqueeze(1), -returns.unsqueeze(1))
    assert close(group.backward_t(params, kept, grad_t), expected)


def test_the_fast_elementwise_kernels_are_the_same_functions():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 500, 32, generator=g) * 3
    y = NumpyTanh.apply(x)
    # Within one float32 ulp of torch's tanh.
    assert float((y - torch.tanh(x)).abs().max()) <= float(torch.finfo(torch.float32).eps)
    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad((NumpyTanh.apply(z) * x).sum(), z)
    assert torch.equal(grad, torch.ops.aten.tanh_backward(x, y))
    logits = torch.randn(4, 500, 2, generator=g) * 5
    assert close(softmax_actions(logits), torch.softmax(logits, -1))
    assert close(log_softmax_actions(logits), F.log_softmax(logits, -1))


def test_the_two_action_sampler_draws_what_the_general_one_does():
    rng = np.random.default_rng(5)
    for scale in (0.01, 1.0, 10.0, 40.0):
        logits = (rng.standard_normal((4000, 2)) * scale).astype(np.float32)
        u = rng.random(4000)
        np.testing.assert_array_equal(
            sample_two_actions(logits, u), sample_categorical(softmax_np(logits), u)
        )
    # Ties at the boundary: p_0 exactly equal to u takes action 1, as the inverse CDF does.
    logits = np.zeros((3, 2), np.float32)
    np.testing.assert_array_equal(
        sample_two_actions(logits, np.array([0.5, 0.49, 0.51])), [1, 0, 1]
    )


def test_fast_and_torch_kernels_train_the_same_short_run():
    config = FedHPDConfig(
        algorithm="fedhpd", d=2, rounds=6, public_size=300, part_size=100, distill_loops=2
    )
    public = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32) * 0.1
    runs = [
        RunSpec(config, 20, None, public),
        RunSpec(FedHPDConfig(rounds=6, algorithm="nofed"), 25),
    ]
    # Equal returns hold while no action draw u falls within the kernels' probability gap of
    # p_0 (an ulp of tanh: ~1e-8 to 1e-7 after six rounds): a chance of about 1e-7 a draw, so
    # ~1e-3 over these untrained episodes' few thousand draws on any CPU's kernels.
    fast, slow = (Population(runs, kernels=k).run() for k in ("fast", "torch"))
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a.returns, b.returns)
        for x, y in zip(a.params, b.params, strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(1.0, np.abs(y).max()))


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match="kernels must be one of"):
        Population([RunSpec(FedHPDConfig(rounds=2, algorithm="nofed"), 20)], kernels="blas")
    with pytest.raises(ValueError, match="unknown KL direction"):
        t = torch.full((1, 2, 3), 0.5)
        kl_grad_t(t, t, t, ["sideways"])


# -- whole passes of Population: what each kernel set feeds the optimiser ---------------------
def blocks_close(group: _Group, fast: torch.Tensor, slow: torch.Tensor, exact: torch.Tensor):
    """The float32 gradients ``fast`` and ``slow`` (torch kernels) against ``exact`` (the same
    loss in float64), block by block (each weight and bias of each copy): Adam normalises every
    parameter's step, so a block of small gradients matters as much as a large one.

    A block passes when the fast kernels' error is within ``4 RTOL`` of the block's largest
    entry or within 8x the torch kernels' own float32 error: a gradient is a sum over states
    with cancellation (the normalised returns sum to zero, a KL gradient nearly so at the
    consensus), so its rounding is relative to the terms, not to the sum (measured: up to
    1.1e-5 of a small block's largest entry, 4.6x the torch kernels' error). A scale, learning
    rate or loss-term bug is off by 1e-3 or more."""
    for c in range(exact.shape[0]):
        for w, b, _, _ in [*group.layers, group.head]:
            for part in (w, b):
                truth = exact[c, part]
                err_fast = float((fast[c, part].double() - truth).abs().max())
                err_slow = float((slow[c, part].double() - truth).abs().max())
                scale = float(truth.abs().max())
                assert err_fast <= max(4 * RTOL * scale, 8 * err_slow), (
                    c,
                    part,
                    err_fast,
                    err_slow,
                )


def recording(population: Population) -> list:
    """Record every ``adam_step`` of ``population``: group, rows, parameters before the step,
    gradient, schedule flag."""
    calls = []
    for group in population.groups:
        step = group.adam_step

        def record(rows, grad, *, schedule, group=group, step=step):
            before = group.flat[torch.as_tensor(rows, dtype=torch.long)].clone()
            calls.append((group, np.array(rows), before, grad.detach().clone(), schedule))
            step(rows, grad, schedule=schedule)

        group.adam_step = record
    return calls


def twin_populations(runs, rounds_before: int):
    """A fast and a torch population in the same state: the fast one trained ``rounds_before``
    rounds, its parameters, Adam moments and schedules copied into the torch one."""
    fast, slow = Population(runs, kernels="fast"), Population(runs, kernels="torch")
    for round_id in range(rounds_before):
        _, lengths = fast.play(round_id)
        fast.learn(lengths)
    for a, b in zip(fast.groups, slow.groups, strict=True):
        b.flat.copy_(a.flat)
        b.exp_avg.copy_(a.exp_avg)
        b.exp_avg_sq.copy_(a.exp_avg_sq)
        b.steps, b.lr, b.schedule_steps = list(a.steps), list(a.lr), list(a.schedule_steps)
        b.refresh()
    return fast, slow


def float64_gradient(group: _Group, params: torch.Tensor, x: torch.Tensor, loss_of) -> torch.Tensor:
    """The gradient of ``loss_of(log_p)`` at ``params`` in float64, by autograd through
    ``torch.tanh`` and the last-axis log-softmax (the reference: no float32 rounding to speak
    of, no hand-written pass)."""
    reference = params.double().requires_grad_(True)
    out, _ = group.forward(reference, x.double(), "torch")
    (grad,) = torch.autograd.grad(loss_of(F.log_softmax(out, -1)), reference)
    return grad


@pytest.mark.parametrize("rounds_before", [0, 12])
def test_the_reinforce_step_feeds_the_optimiser_what_the_torch_kernels_do(rounds_before):
    """Population.learn (NoFed's and FedHPD's every round: discounted, normalised returns as the
    weights, zero-padded to the group's longest episode) with ``kernels="fast"`` gives Adam the
    gradient of the REINFORCE loss as the autograd path does (both against float64), block by
    block, with the same rows, schedule and learning rates."""
    runs = [RunSpec(FedHPDConfig(rounds=20, algorithm="nofed"), s) for s in (3, 4)]
    fast, slow = twin_populations(runs, rounds_before)
    _, lengths = fast.play(rounds_before)
    assert len(set(lengths.tolist())) > 1  # padding is exercised
    for name in ("obs_buf", "act_buf", "rew_buf"):
        setattr(slow, name, getattr(fast, name).copy())
    calls_fast, calls_slow = recording(fast), recording(slow)
    fast.learn(lengths)
    slow.learn(lengths)
    assert len(calls_fast) == len(calls_slow) == len(fast.groups)
    for call_fast, call_slow, (s, e), members in zip(
        calls_fast, calls_slow, fast.bounds, fast.members, strict=True
    ):
        group, rows, before, g_fast, s_fast = call_fast
        _, rows_slow, before_slow, g_slow, s_slow = call_slow
        np.testing.assert_array_equal(rows, rows_slow)
        assert torch.equal(before, before_slow)
        assert s_fast is s_slow is True
        horizon = int(lengths[s:e].max())
        weights = np.zeros((e - s, horizon))
        for c, (r, _) in enumerate(members):
            n = int(lengths[s + c])
            weights[c, :n] = discounted_returns(
                fast.rew_buf[s + c, :n], fast.configs[r].gamma, fast.spec.normalise_returns
            )
        actions = torch.from_numpy(fast.act_buf[s:e, :horizon]).unsqueeze(-1)
        exact = float64_gradient(
            group,
            before,
            torch.from_numpy(fast.obs_buf[s:e, :horizon]),
            lambda log_p, a=actions, w=weights: (
                -(log_p.gather(-1, a)[..., 0] * torch.from_numpy(w)).sum()
            ),
        )
        blocks_close(group, g_fast, g_slow, exact)
    for a, b in zip(fast.groups, slow.groups, strict=True):
        assert (a.steps, a.lr, a.schedule_steps) == (b.steps, b.lr, b.schedule_steps)


@pytest.mark.parametrize("direction", ["mean_to_local", "local_to_mean"])
@pytest.mark.parametrize("rounds_before", [0, 12])
def test_the_distillation_event_uploads_and_steps_as_the_torch_kernels_do(direction, rounds_before):
    """Population.distill (FedHPD's every d rounds: uploads, consensus, the KD loss, Adam
    without the schedule) with ``kernels="fast"``: the same uploads, and the gradient of the KD
    loss on each kernel set's own consensus as the autograd path gives it (against float64)."""
    public = np.random.default_rng(1).normal(size=(100, 4)).astype(np.float32) * 0.1
    config = FedHPDConfig(
        algorithm="fedhpd",
        d=2,
        rounds=20,
        public_size=100,
        part_size=100,
        distill_loops=1,
        kl_direction=direction,
    )
    runs = [RunSpec(config, 7, None, public), RunSpec(config, 8, None, public)]
    fast, slow = twin_populations(runs, rounds_before)
    uploads = {"fast": {}, "torch": {}}
    targets = {"fast": {}, "torch": {}}
    for name, population in (("fast", fast), ("torch", slow)):
        consensus_of = population._consensus

        def spy(r, up, consensus_of=consensus_of, name=name):
            uploads[name][r] = up.copy()
            targets[name][r] = consensus_of(r, up)
            return targets[name][r]

        population._consensus = spy
    calls = {"fast": recording(fast), "torch": recording(slow)}
    fast.distill([0, 1])
    slow.distill([0, 1])
    for r in (0, 1):  # (10 agents, 100 states, 2 actions) each
        np.testing.assert_allclose(uploads["fast"][r], uploads["torch"][r], rtol=0, atol=1e-6)
        np.testing.assert_allclose(uploads["fast"][r].sum(-1), 1.0, atol=1e-5)
    assert len(calls["fast"]) == len(calls["torch"]) == len(fast.groups)
    x = torch.from_numpy(public)
    for call_fast, call_slow, members in zip(
        calls["fast"], calls["torch"], fast.members, strict=True
    ):
        group, rows, before, g_fast, s_fast = call_fast
        _, rows_slow, before_slow, g_slow, s_slow = call_slow
        np.testing.assert_array_equal(rows, rows_slow)
        assert torch.equal(before, before_slow)
        assert s_fast is s_slow is False
        owners = [members[c][0] for c in rows.tolist()]
        inputs = x.expand(len(owners), *x.shape)
        exact = {}
        for name in ("fast", "torch"):
            target = torch.from_numpy(np.stack([targets[name][r] for r in owners]))
            exact[name] = float64_gradient(
                group,
                before,
                inputs,
                lambda log_p, t=target: kl_categorical(log_p, t, direction).sum(),
            )
        # Each kernel set against the float64 gradient at its own consensus; the two
        # consensuses differ by upload rounding, which moves both exact gradients alike.
        blocks_close(group, g_fast, g_slow + (exact["fast"] - exact["torch"]), exact["fast"])
