"""The fast learner's hand-written kernels (rl/fast.py, ``kernels="fast"``) against torch's:
gradients of the distillation and REINFORCE losses against autograd through ``torch.tanh`` and
the last-axis softmax (float32 rounding apart), the two-action sampler bit for bit against the
general one, and a short run of each kernel set."""

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
from securefed.rl.fedhpd import TASKS, FedHPDConfig, RunSpec, kl_categorical
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
