"""The fast FedHPD learner: the mathematics of :mod:`securefed.rl.fedhpd`, vectorised.

Where the time goes in the step-by-step learner is per-step framework overhead of many tiny
networks (spec section 7), so this learner removes overhead without touching the mathematics:

* Populations. Any number of runs (settings x seeds) of one task advance round by round together.
  Their agents are grouped by architecture (widths and activations) across runs: each group's
  parameters are stacked (``torch.func.stack_module_state``) into one ``(copies, n_params)``
  tensor, so one batched matrix product serves every copy (what ``vmap`` over the stacked modules
  computes, written as ``baddbmm`` to skip vmap's per-call overhead).
* Rollouts without autograd (spec section 2). Every environment of the population steps as one
  batch (:class:`CartPoleBatch` integrates CartPole-v1's equations for all copies at once with
  numpy; other tasks step a list of gymnasium environments); the policies act through numpy views
  of the stacked parameters. Actions are drawn by the same inverse-CDF / ``mean + std * z`` rule
  from the same noise as the reference learner.
* One batched recompute per round: each group recomputes the log-probabilities of all its copies'
  episodes in one padded batch (zero returns past an episode's end) and takes one gradient. Same
  parameters, same actions, so the same gradient as the graph kept step by step.
* Adam / AdamW per copy on the stacked tensor: the element-wise formulas of ``torch.optim.Adam``
  (single-tensor path) with a per-copy step count and learning rate (StepLR per copy), so copies
  that skip a step (a NoFed run while a FedHPD run distils) keep their state untouched.
* Distillation and DPA queries batch the copies of the runs that distil this round; every run
  still sends its own uploads through its own transport.
* Categorical policies learn through hand-written passes (``kernels="fast"``, the default):
  no autograd graph, ``tanh`` by numpy, the logits actions-major so the softmax over a few
  actions vectorises over states, the loss gradient on the logits written out
  (:func:`kl_grad_t`), each weight gradient in its faster orientation
  (:meth:`_Group.backward_t`). Same functions, float32 rounding apart (``kernels="torch"``
  keeps the autograd path; tests/test_fedhpd_fast_kernels.py compares them).

The public state set ``S_p`` (:mod:`securefed.rl.fedhpd` section 4) is made here,
:func:`make_public_states`, because its virtual agent trains with this learner; :func:`train` runs
one run with either learner. This module builds on :mod:`securefed.rl.fedhpd`, never the other way
round. torch's thread count is the caller's: the learner is built for one thread
(``torch.set_num_threads(1)``, as the command line and the benchmarks set), and never sets it.

Results equal the reference learner's up to floating-point summation order (batched products add
in another order): the same episode returns on short schedules and parameters equal to about
1e-6; ``securefed bench fedhpd-speed`` and tests/test_fedhpd.py check it.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch.nn import functional as F

from securefed import PlaintextTransport, SeedTree, Transport
from securefed.rl.fedhpd import (
    ADAM_BETAS,
    ADAM_EPS,
    ADAMW_WEIGHT_DECAY,
    TASKS,
    FedHPDConfig,
    ReferenceRun,
    RunResult,
    RunSpec,
    TaskSpec,
    aggregate_uploads,
    consensus,
    discounted_returns,
    distill_loss,
    dpa_loss,
    dpa_server_step,
    initial_policies,
    kl_categorical,
    make_env,
    parts,
    round_noise,
    stream_seed,
)
from securefed.rl.policies import (
    MIN_STD,
    VIRTUAL_AGENTS,
    MLPPolicy,
    gaussian_log_prob,
    load_vector,
    make_policy,
    sample_categorical,
    sample_gaussian,
    softmax_np,
    softplus_np,
)


# == Vectorised environments ==================================================================
class CartPoleBatch:
    """``n`` CartPole-v1 environments integrated together (gymnasium 1.x dynamics, float64 state,
    Euler integration, reward 1 per step including the terminating one, truncation at ``cap``).

    Each copy keeps its own ``numpy`` Generator made like gymnasium's ``reset(seed=s)``
    (``gymnasium.utils.seeding.np_random``), so a copy reset with seed ``s`` and then without a
    seed starts every episode where ``gym.make("CartPole-v1")`` would.
    """

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, n: int, cap: int) -> None:
        self.n, self.cap = n, cap
        self.state = np.zeros((n, 4))
        self.steps = np.zeros(n, dtype=np.int64)
        self.rngs: list[np.random.Generator | None] = [None] * n
        self._new = np.zeros((n, 4))
        self._ones = np.ones(n)

    def reset(self, which: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        from gymnasium.utils import seeding

        for i, seed in zip(np.asarray(which).tolist(), seeds, strict=True):
            if seed is not None:
                self.rngs[i] = seeding.np_random(int(seed))[0]
            elif self.rngs[i] is None:
                raise ValueError(f"environment {i} was never seeded")
            self.state[i] = self.rngs[i].uniform(low=-0.05, high=0.05, size=(4,))
            self.steps[i] = 0
        return self.state.astype(np.float32)

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        state, new = self.state, self._new
        x, x_dot, theta, theta_dot = state[:, 0], state[:, 1], state[:, 2], state[:, 3]
        force = np.where(np.asarray(actions) == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        np.add(x, self.tau * x_dot, out=new[:, 0])
        np.add(x_dot, self.tau * xacc, out=new[:, 1])
        np.add(theta, self.tau * theta_dot, out=new[:, 2])
        np.add(theta_dot, self.tau * thetaacc, out=new[:, 3])
        np.copyto(state, new, where=active[:, None])
        self.steps += active
        x, theta = state[:, 0], state[:, 2]
        done = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        done |= self.steps >= self.cap
        return state.astype(np.float32), self._ones, done

    def close(self) -> None:
        """Nothing to release."""


class GymBatch:
    """``n`` gymnasium environments of a task stepped in a loop (Box2D and MuJoCo tasks)."""

    def __init__(self, spec: TaskSpec, n: int) -> None:
        self.spec = spec
        self.envs = [make_env(spec) for _ in range(n)]
        self.obs = np.zeros((n, spec.obs_dim), dtype=np.float32)
        self.reward = np.zeros(n)
        self.done = np.zeros(n, dtype=bool)

    def reset(self, which: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        for i, seed in zip(np.asarray(which).tolist(), seeds, strict=True):
            obs, _ = self.envs[i].reset(seed=None if seed is None else int(seed))
            self.obs[i] = obs
        return self.obs.copy()

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        discrete = self.spec.kind == "categorical"
        self.reward[:] = 0.0
        for i in np.flatnonzero(active).tolist():
            action = int(actions[i]) if discrete else actions[i]
            obs, reward, terminated, truncated, _ = self.envs[i].step(action)
            self.obs[i], self.reward[i], self.done[i] = obs, reward, terminated or truncated
        return self.obs.copy(), self.reward.copy(), self.done.copy()

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_env_batch(spec: TaskSpec, n: int) -> CartPoleBatch | GymBatch:
    """A batch of ``n`` environments of ``spec``: vectorised for CartPole, a list otherwise."""
    if spec.name == "cartpole":
        return CartPoleBatch(n, spec.episode_cap)
    return GymBatch(spec, n)


# == Kernels ==================================================================================
KERNELS = ("fast", "torch")
"""``fast`` (the default): ``tanh`` by numpy and the categorical (log-)softmax over the actions
on a transposed layout (:class:`NumpyTanh`, :func:`softmax_actions`, :func:`log_softmax_actions`);
``torch``: ``torch.tanh`` and the softmax kernels on the last axis, as the reference learner."""


class NumpyTanh(torch.autograd.Function):
    """``tanh`` computed by numpy, its backward ``grad * (1 - y^2)`` by torch's ``tanh_backward``.

    Same function, another implementation: on this machine torch 2.13's float32 ``tanh`` takes
    about 2 ns an element on one thread, numpy's SIMD one about 0.2 ns (13x), and it was the
    largest single kernel of a distillation step (15%). Both are within an ulp of the true value;
    they agree on about 68% of float32 entries and differ by one ulp elsewhere (the rollout,
    :class:`_ActGroup`, has always used numpy's). The backward is torch's own formula on the
    saved output, so it is bit-identical to ``torch.tanh``'s given the same output.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def softmax_actions(logits: torch.Tensor) -> torch.Tensor:
    """``softmax(logits, -1)`` for ``(C, n, A)`` logits, computed along a transposed contiguous
    layout (``(C, A, n)``, reduced over ``A`` with the states as the vectorised axis).

    torch's last-axis kernel pays a per-row cost that dominates for A = 2 (about 23 ns an entry
    here, against about 1 ns transposed, 8-20x). Same formula (max, exp, sum, divide), another
    kernel: the last bit differs in a few per cent of entries. Returns a ``(C, n, A)`` view.
    """
    return torch.softmax(logits.transpose(-1, -2).contiguous(), -2).transpose(-1, -2)


def log_softmax_actions(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` on the transposed layout of :func:`softmax_actions`."""
    return F.log_softmax(logits.transpose(-1, -2).contiguous(), -2).transpose(-1, -2)


def kl_grad_t(
    logits_t: torch.Tensor,
    probs_t: torch.Tensor,
    target_t: torch.Tensor,
    directions: Sequence[str],
) -> torch.Tensor:
    """The gradient on the logits of ``sum_c KL_c`` (:func:`securefed.rl.fedhpd.kl_categorical`,
    batchmean over the ``n`` states), all actions-major ``(C, A, n)``.

    With ``d = dKL/dlog p``, the log-softmax backward gives ``d - p * sum_a d``; KL(P_mean || P_k)
    has ``d = -t / n``, KL(P_k || P_mean) (``sum p (log p - log t)``) has
    ``d = p (log p - log t + 1) / n``. Copy ``c`` takes direction ``directions[c]``.
    """
    n = logits_t.shape[-1]
    unique = set(directions)
    out = None
    if "mean_to_local" in unique:
        d = target_t / -n
        out = d - probs_t * d.sum(1, keepdim=True)
    if "local_to_mean" in unique:
        log_p = F.log_softmax(logits_t, 1)
        log_t = torch.log(target_t.clamp_min(torch.finfo(target_t.dtype).tiny))
        d = probs_t * (log_p - log_t + 1) / n
        other = d - probs_t * d.sum(1, keepdim=True)
        if out is None:
            out = other
        else:
            local = torch.as_tensor(np.asarray(directions) == "local_to_mean").view(-1, 1, 1)
            out = torch.where(local, other, out)
    unknown = unique - {"mean_to_local", "local_to_mean"}
    if unknown:
        raise ValueError(f"unknown KL direction {sorted(unknown)[0]!r}")
    return out


def sample_two_actions(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``sample_categorical(softmax_np(logits), u)`` for two actions, in five array operations:
    ``p_0 = e_0 / (e_0 + e_1)`` with ``e_a = exp(z_a - max z)``, action ``1`` iff ``p_0 <= u``.

    The same operations on the same values as :func:`securefed.rl.policies.softmax_np` (a sum of
    two terms is one addition) and the inverse-CDF rule (the first cumulative probability is
    ``p_0``), so the same draws bit for bit (tests/test_fedhpd_fast_kernels.py), without the
    reductions along a last axis of two (about 4x less time a rollout step here).
    """
    z0, z1 = logits[:, 0], logits[:, 1]
    top = np.maximum(z0, z1)
    e0, e1 = np.exp(z0 - top), np.exp(z1 - top)
    return (e0 / (e0 + e1) <= u).astype(np.int64)


# == Stacked agents ===========================================================================
class _Group:
    """The copies of one architecture across the population, stacked, with their Adam state.

    Args:
        policies: the copies' initial policies (same architecture).
        lrs: each copy's learning rate.
        spec: the task.
    """

    def __init__(self, policies: Sequence[MLPPolicy], lrs: Sequence[float], spec: TaskSpec):
        first = policies[0]
        self.kind, self.activations, self.spec = first.kind, first.spec.activations, spec
        self.size = len(policies)
        params, _ = torch.func.stack_module_state(list(policies))
        names = [name for name, _ in first.named_parameters()]
        self.flat = torch.cat([params[n].detach().reshape(self.size, -1) for n in names], 1)
        self.flat = self.flat.contiguous()
        self.dtype = self.flat.dtype
        offsets, start = {}, 0
        for name, param in first.named_parameters():
            offsets[name] = (slice(start, start + param.numel()), tuple(param.shape))
            start += param.numel()
        n_layers = len(first.layers)
        self.layers = [self._linear(offsets, f"layers.{i}") for i in range(n_layers)]
        self.head = self._linear(offsets, "head")
        self.std_head = self._linear(offsets, "std_head") if self.kind == "gaussian" else None
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.steps = [0] * self.size
        self.lr = [float(lr) for lr in lrs]
        self.schedule_steps = [0] * self.size
        self.on_change = None

    @staticmethod
    def _linear(offsets, prefix):
        (w, (out, inp)), (b, _) = offsets[f"{prefix}.weight"], offsets[f"{prefix}.bias"]
        return w, b, out, inp

    # -- forward passes ---------------------------------------------------------------------
    def forward(
        self, params: torch.Tensor, x: torch.Tensor, kernels: str = "fast"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Stacked forward: ``params (C, P)``, ``x (C, B, in)`` -> logits or ``(mean, std)``;
        ``kernels`` picks the ``tanh`` (:data:`KERNELS`)."""
        c = params.shape[0]
        tanh = NumpyTanh.apply if kernels == "fast" else torch.tanh

        def linear(layer, h, contiguous=False):
            w, b, out, inp = layer
            weight = params[:, w].view(c, out, inp).transpose(1, 2)
            if contiguous:
                weight = weight.contiguous()
            return torch.baddbmm(params[:, b].view(c, 1, out), h, weight)

        h = x
        for i, (layer, activation) in enumerate(zip(self.layers, self.activations, strict=True)):
            h = linear(layer, h, contiguous=i == 0)
            h = torch.relu(h) if activation == "relu" else tanh(h)
        if self.std_head is None:
            return linear(self.head, h), None
        return linear(self.head, h), F.softplus(linear(self.std_head, h)) + MIN_STD

    # -- hand-written categorical passes (kernels="fast") ------------------------------------
    def logits_t(
        self, params: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Categorical forward without autograd, keeping what :meth:`backward_t` needs.

        ``params (C, P)``, ``x (C, n, in)`` -> ``(logits^T (C, A, n), [x, h_1, ..., h_L])``: the
        hidden layers as :meth:`forward` computes them (``tanh`` by numpy), the head written as
        ``W h^T + b`` so the logits come out actions-major, the layout every later step
        (softmax over the actions, the loss gradient, the head's weight gradient) is fast in.
        """
        c = params.shape[0]
        kept = [x]
        h = x
        for i, (layer, activation) in enumerate(zip(self.layers, self.activations, strict=True)):
            w, b, n_out, n_in = layer
            weight = params[:, w].view(c, n_out, n_in).transpose(1, 2)
            if i == 0:
                weight = weight.contiguous()
            h = torch.baddbmm(params[:, b].view(c, 1, n_out), h, weight)
            if activation == "relu":
                h.relu_()
            else:
                values = h.numpy()
                np.tanh(values, out=values)
            kept.append(h)
        w, b, n_out, n_in = self.head
        logits_t = torch.baddbmm(
            params[:, b].view(c, n_out, 1), params[:, w].view(c, n_out, n_in), h.transpose(1, 2)
        )
        return logits_t, kept

    def backward_t(
        self, params: torch.Tensor, kept: list[torch.Tensor], grad_logits_t: torch.Tensor
    ) -> torch.Tensor:
        """The gradient ``(C, P)`` of a loss whose gradient on :meth:`logits_t`'s logits is
        ``grad_logits_t (C, A, n)``: back-propagation written out, layer by layer.

        Each weight gradient is one batched product in whichever orientation is faster here
        (``g^T h`` when the layer narrows, ``(h^T g)^T`` otherwise: the head's, with two
        outputs, runs about 10x faster as ``g^T h``); relu and tanh backward are torch's own
        ``threshold_backward`` / ``tanh_backward`` on the kept outputs.
        """
        c = params.shape[0]
        grad = torch.empty_like(params)
        w, b, n_out, n_in = self.head
        g_t = grad_logits_t
        grad[:, w] = torch.bmm(g_t, kept[-1]).view(c, -1)
        grad[:, b] = g_t.sum(-1)
        g = torch.bmm(g_t.transpose(1, 2), params[:, w].view(c, n_out, n_in))
        for i in range(len(self.layers) - 1, -1, -1):
            w, b, n_out, n_in = self.layers[i]
            y = kept[i + 1]
            if self.activations[i] == "relu":
                g = torch.ops.aten.threshold_backward(g, y, 0)
            else:
                g = torch.ops.aten.tanh_backward(g, y)
            h = kept[i]
            if n_out <= n_in:
                grad[:, w] = torch.bmm(g.transpose(1, 2).contiguous(), h).view(c, -1)
            else:
                grad[:, w] = torch.bmm(h.transpose(1, 2), g).transpose(1, 2).reshape(c, -1)
            grad[:, b] = g.sum(1)
            if i:
                g = torch.bmm(g, params[:, w].view(c, n_out, n_in))
        return grad

    def weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(W^T (C, in, out), b (C, out))`` per layer (hidden layers, head, std head), numpy."""
        flat = self.flat.numpy()
        out = []
        for w, b, n_out, n_in in [
            *self.layers,
            self.head,
            *([self.std_head] * bool(self.std_head)),
        ]:
            weight = flat[:, w].reshape(self.size, n_out, n_in).transpose(0, 2, 1)
            out.append((weight, flat[:, b]))
        return out

    def refresh(self) -> None:
        """Tell the rollout side that the parameters changed."""
        if self.on_change is not None:
            self.on_change(self)

    def rows(self, rows: np.ndarray) -> torch.Tensor:
        """The parameters of copies ``rows``, detached: the stacked tensor itself when every
        copy is asked for (no gather, no copy), else a gathered copy."""
        if len(rows) == self.size:
            return self.flat.detach()
        return self.flat[torch.as_tensor(rows, dtype=torch.long)]

    # -- the optimiser ----------------------------------------------------------------------
    def adam_step(self, rows: np.ndarray, grad: torch.Tensor, *, schedule: bool) -> None:
        """``torch.optim.Adam`` / ``AdamW`` (single-tensor formulas) on the copies ``rows``."""
        beta1, beta2 = ADAM_BETAS
        rows_list = rows.tolist()
        index = torch.as_tensor(rows, dtype=torch.long)
        every = len(rows_list) == self.size
        param = self.flat if every else self.flat[index]
        exp_avg = self.exp_avg if every else self.exp_avg[index]
        exp_avg_sq = self.exp_avg_sq if every else self.exp_avg_sq[index]

        def column(values):
            return torch.tensor(values, dtype=self.dtype).view(-1, 1)

        for r in rows_list:
            self.steps[r] += 1
        lrs = [self.lr[r] for r in rows_list]
        steps = [float(self.steps[r]) for r in rows_list]
        if self.spec.optimizer == "adamw":
            param.mul_(column([1 - lr * ADAMW_WEIGHT_DECAY for lr in lrs]))
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = [lr / (1 - beta1**s) for lr, s in zip(lrs, steps, strict=True)]
        bias_correction2_sqrt = [(1 - beta2**s) ** 0.5 for s in steps]
        denom = (exp_avg_sq.sqrt() / column(bias_correction2_sqrt)).add_(ADAM_EPS)
        param.add_(column([-s for s in step_size]) * exp_avg / denom)
        if not every:
            self.flat[index], self.exp_avg[index], self.exp_avg_sq[index] = (
                param,
                exp_avg,
                exp_avg_sq,
            )
        if schedule and self.spec.lr_decay is not None:
            for r in rows_list:
                self.schedule_steps[r] += 1
                if self.schedule_steps[r] % self.spec.lr_decay_every == 0:
                    self.lr[r] *= self.spec.lr_decay
        self.refresh()


class _ActGroup:
    """Rollout-side copies of one depth and activation pattern, zero-padded to common widths.

    Padding is exact: a padded unit has zero weights in and out, so it outputs ``act(0) = 0``
    (relu and tanh) and adds nothing. Merging several architectures into one batched forward
    cuts the per-step numpy calls, which dominate rollouts of tiny networks.

    Args:
        groups: parameter groups sharing depth and activations, in global order.
        kind: ``categorical`` or ``gaussian``.
        obs_dim, act_dim: input and output sizes.
        dtype: numpy dtype of the parameters.
    """

    def __init__(self, groups: Sequence[_Group], obs_dim: int, act_dim: int, dtype) -> None:
        self.activations = groups[0].activations
        self.gaussian = groups[0].std_head is not None
        widths = [max(g.layers[i][2] for g in groups) for i in range(len(self.activations))]
        sizes = list(zip([obs_dim, *widths], [*widths, act_dim], strict=True))
        if self.gaussian:
            sizes.append((widths[-1], act_dim))
        total = sum(g.size for g in groups)
        self.arrays = [
            (np.zeros((total, n_in, n_out), dtype), np.zeros((total, 1, n_out), dtype))
            for n_in, n_out in sizes
        ]
        self.offset = {}
        start = 0
        for group in groups:
            self.offset[id(group)] = start
            start += group.size
            group.on_change = self.load
            self.load(group)

    def load(self, group: _Group) -> None:
        s = self.offset[id(group)]
        e = s + group.size
        for (weight, bias), (w, b) in zip(self.arrays, group.weights(), strict=True):
            n_in, n_out = w.shape[1:]
            weight[s:e, :n_in, :n_out] = w
            bias[s:e, 0, :n_out] = b

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rollout forward without autograd: ``obs (C, in)`` -> ``(C, A)`` logits or means."""
        h = obs[:, None, :]
        n_hidden = len(self.activations)
        for (weight, bias), activation in zip(
            self.arrays[:n_hidden], self.activations, strict=True
        ):
            h = np.matmul(h, weight)
            h += bias
            if activation == "relu":
                np.maximum(h, 0, out=h)
            else:
                np.tanh(h, out=h)
        weight, bias = self.arrays[n_hidden]
        first = np.matmul(h, weight) + bias
        if not self.gaussian:
            return first[:, 0], None
        weight, bias = self.arrays[n_hidden + 1]
        std = softplus_np(np.matmul(h, weight) + bias) + np.asarray(MIN_STD, weight.dtype)
        return first[:, 0], std[:, 0]


def act_buckets(
    groups: Sequence[_Group], small: int = 20_000, ratio: float = 4.0
) -> list[list[int]]:
    """Which parameter groups share a padded rollout forward.

    Groups of the same depth and activations join the bucket of the largest one when padding
    costs little: the padded network has at most ``small`` parameters (tiny networks, where
    per-call overhead dominates) or at most ``ratio`` times the group's own.
    """
    classes: dict[tuple, list[int]] = {}
    for i, group in enumerate(groups):
        classes.setdefault(group.activations, []).append(i)
    buckets = []
    for members in classes.values():
        members = sorted(members, key=lambda i: -groups[i].flat.shape[1])
        open_buckets: list[list[int]] = []
        for i in members:
            size = groups[i].flat.shape[1]
            for bucket in open_buckets:
                lead = groups[bucket[0]].flat.shape[1]
                if lead <= max(small, ratio * size):
                    bucket.append(i)
                    break
            else:
                open_buckets.append([i])
        buckets.extend(open_buckets)
    return buckets


def distill_loss_by_direction(
    out: torch.Tensor,
    std: torch.Tensor | None,
    target: torch.Tensor,
    directions: Sequence[str],
    log_softmax=None,
) -> torch.Tensor:
    """The summed KL terms of stacked copies, copy ``c`` in KL direction ``directions[c]``.

    ``log_softmax`` (categorical tasks): how the logits become log-probabilities (default
    ``F.log_softmax(out, -1)``, :func:`securefed.rl.fedhpd.distill_loss`'s;
    :func:`log_softmax_actions` is the fast kernel).

    When every copy shares one direction (every run of a column does) the copies are not split
    by a boolean mask: indexing copies the outputs and its backward is an accumulating
    ``index_put`` (about a seventh of a distillation step), while the values and gradients are
    the same (a gather of every row is a copy, its backward adds each gradient to a zero).
    """
    unique = sorted(set(directions))
    if std is None and log_softmax is not None:
        log_p = log_softmax(out)
        if len(unique) == 1:
            return kl_categorical(log_p, target, unique[0]).sum()
        directions = np.asarray(directions)
        loss = 0.0
        for direction in unique:
            mask = torch.as_tensor(directions == direction)
            loss = loss + kl_categorical(log_p[mask], target[mask], direction).sum()
        return loss
    if len(unique) == 1:
        return distill_loss(out, std, target, unique[0]).sum()
    directions = np.asarray(directions)
    loss = 0.0
    for direction in unique:
        mask = torch.as_tensor(directions == direction)
        loss = (
            loss
            + distill_loss(
                out[mask], None if std is None else std[mask], target[mask], direction
            ).sum()
        )
    return loss


# == The population learner ===================================================================
class Population:
    """Runs of one task trained together, round by round (see the module docstring).

    Args:
        runs: the runs; all must share the task, the number of rounds and the dtype.
        kernels: ``fast`` (default) or ``torch``: which ``tanh`` and categorical softmax the
            learning side uses (:data:`KERNELS`; the same functions, the last bits differ).
    """

    def __init__(self, runs: Sequence[RunSpec], kernels: str = "fast") -> None:
        if not runs:
            raise ValueError("a population needs at least one run")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        self.kernels = kernels
        fast = kernels == "fast"
        self._manual = fast and runs[0].config.spec.kind == "categorical"
        self._softmax = softmax_actions if fast else functools.partial(torch.softmax, dim=-1)
        self._log_softmax = (
            log_softmax_actions if fast else functools.partial(F.log_softmax, dim=-1)
        )
        first = runs[0].config
        for run in runs:
            if (run.config.task, run.config.rounds, run.config.dtype) != (
                first.task,
                first.rounds,
                first.dtype,
            ):
                raise ValueError("runs of one population must share task, rounds and dtype")
        self.spec = spec = first.spec
        self.rounds, self.cap = first.rounds, spec.episode_cap
        self.np_dtype = np.float32 if first.dtype == "float32" else np.float64
        self.configs = [run.config for run in runs]
        self.seeds = [run.seed for run in runs]
        self.trees = [SeedTree(run.seed) for run in runs]
        self.transports = [run.transport or PlaintextTransport() for run in runs]
        self.aggregations = [0] * len(runs)
        self.snapshot_rounds = [set(run.snapshot_rounds) for run in runs]
        self.public = [
            None
            if run.config.algorithm != "fedhpd"
            else np.asarray(
                make_public_states(run.config) if run.public_states is None else run.public_states,
                dtype=self.np_dtype,
            )
            for run in runs
        ]
        # Agents grouped by architecture; global index order is group by group.
        by_arch: dict[tuple, list[tuple[int, int, MLPPolicy]]] = {}
        for r, (config, tree) in enumerate(zip(self.configs, self.trees, strict=True)):
            for k, (policy, agent) in enumerate(
                zip(initial_policies(config, tree), config.agent_specs, strict=True)
            ):
                by_arch.setdefault(agent.architecture, []).append((r, k, policy))
        built = []
        for members in by_arch.values():
            lrs = [self.configs[r].agent_specs[k].lr for r, k, _ in members]
            built.append((_Group([p for _, _, p in members], lrs, spec), members))
        buckets = act_buckets([group for group, _ in built])
        self.groups: list[_Group] = []
        self.bounds: list[tuple[int, int]] = []
        self.members: list[list[tuple[int, int]]] = []
        self.position: list[dict[int, int]] = [{} for _ in runs]
        self.act_groups: list[tuple[_ActGroup, int, int]] = []
        start = 0
        for bucket in buckets:
            bucket_start = start
            for index in bucket:
                group, members = built[index]
                self.groups.append(group)
                self.bounds.append((start, start + group.size))
                self.members.append([(r, k) for r, k, _ in members])
                for i, (r, k, _) in enumerate(members):
                    self.position[r][k] = start + i
                start += group.size
            act = _ActGroup(
                [built[i][0] for i in bucket], spec.obs_dim, spec.act_dim, self.np_dtype
            )
            self.act_groups.append((act, bucket_start, start))
        self.n = start
        self.envs = make_env_batch(spec, self.n)
        self.env_seeds = [0] * self.n
        for r, tree in enumerate(self.trees):
            for k, i in self.position[r].items():
                self.env_seeds[i] = stream_seed(tree, "env", k)
        shape = (self.n, self.cap)
        self.obs_buf = np.zeros((*shape, spec.obs_dim), dtype=self.np_dtype)
        if spec.kind == "categorical":
            self.act_buf = np.zeros(shape, dtype=np.int64)
        else:
            self.act_buf = np.zeros((*shape, spec.act_dim), dtype=self.np_dtype)
        self.rew_buf = np.zeros(shape)
        self.server_envs: dict[int, object] = {}
        self.server_obs: dict[int, np.ndarray] = {}
        for r, config in enumerate(self.configs):
            if config.algorithm == "dpa":
                self.server_envs[r] = make_env(spec)
                self.server_obs[r], _ = self.server_envs[r].reset(
                    seed=stream_seed(self.trees[r], "server_env")
                )

    # -- one round ------------------------------------------------------------------------------
    def _noise(self, round_id: int) -> np.ndarray:
        shape = (self.n, self.cap) if self.spec.kind == "categorical" else (
            self.n, self.cap, self.spec.act_dim
        )  # fmt: skip
        noise = np.empty(shape)
        for r, (config, tree) in enumerate(zip(self.configs, self.trees, strict=True)):
            rows = [self.position[r][k] for k in range(config.n_agents)]
            noise[rows] = round_noise(tree, round_id, config)
        return noise

    def play(self, round_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Every agent plays one episode (no autograd); returns ``(returns, lengths)``."""
        noise = self._noise(round_id)
        seeds = self.env_seeds if round_id == 0 else [None] * self.n
        obs = self.envs.reset(np.arange(self.n), seeds).astype(self.np_dtype)
        alive = np.ones(self.n, dtype=bool)
        lengths = np.zeros(self.n, dtype=np.int64)
        discrete = self.spec.kind == "categorical"
        two_actions = discrete and self.spec.act_dim == 2
        first = np.zeros((self.n, self.spec.act_dim), dtype=self.np_dtype)
        std = np.zeros_like(first)
        for t in range(self.cap):
            self.obs_buf[:, t] = obs
            for group, s, e in self.act_groups:
                out, out_std = group.act(obs[s:e])
                first[s:e] = out
                if out_std is not None:
                    std[s:e] = out_std
            if two_actions:
                actions = sample_two_actions(first, noise[:, t])
            elif discrete:
                actions = sample_categorical(softmax_np(first), noise[:, t])
            else:
                actions = sample_gaussian(first, std, noise[:, t])
            self.act_buf[:, t] = actions
            obs, reward, done = self.envs.step(actions, alive)
            obs = obs.astype(self.np_dtype)
            self.rew_buf[:, t] = np.where(alive, reward, 0.0)
            lengths += alive
            alive &= ~done
            if not alive.any():
                break
        returns = np.array([np.sum(self.rew_buf[i, :n]) for i, n in enumerate(lengths.tolist())])
        return returns, lengths

    def learn(self, lengths: np.ndarray) -> None:
        """One REINFORCE step per agent: each group recomputes its episodes' log-probs at once."""
        for group, (s, e), members in zip(self.groups, self.bounds, self.members, strict=True):
            horizon = int(lengths[s:e].max())
            g = np.zeros((e - s, horizon))
            for c, (r, _) in enumerate(members):
                n = int(lengths[s + c])
                g[c, :n] = discounted_returns(
                    self.rew_buf[s + c, :n], self.configs[r].gamma, self.spec.normalise_returns
                )
            x = torch.from_numpy(self.obs_buf[s:e, :horizon])
            actions = torch.from_numpy(self.act_buf[s:e, :horizon])
            if self._manual:
                params = group.flat.detach()
                logits_t, kept = group.logits_t(params, x)
                returns_t = torch.as_tensor(g, dtype=group.dtype).unsqueeze(1)
                grad_t = torch.softmax(logits_t, 1).mul_(returns_t)
                grad_t.scatter_add_(1, actions.unsqueeze(1), -returns_t)
                grad = group.backward_t(params, kept, grad_t)
                group.adam_step(np.arange(e - s), grad, schedule=True)
                continue
            params = group.flat.detach().requires_grad_(True)
            out, std = group.forward(params, x, self.kernels)
            if std is None:
                log_p = self._log_softmax(out).gather(-1, actions.unsqueeze(-1))[..., 0]
            else:
                log_p = gaussian_log_prob(out, std, actions).mean(-1)
            loss = -(log_p * torch.as_tensor(g, dtype=group.dtype)).sum()
            (grad,) = torch.autograd.grad(loss, params)
            group.adam_step(np.arange(e - s), grad, schedule=True)

    def _consensus(self, r: int, uploads: np.ndarray) -> np.ndarray:
        mean = aggregate_uploads(self.transports[r], self.aggregations[r], uploads, self.trees[r])
        self.aggregations[r] += 1
        return consensus(mean, self.spec.kind, self.spec.act_dim)

    def _rows(self, runs: set[int]) -> list[np.ndarray]:
        return [
            np.array([c for c, (r, _) in enumerate(m) if r in runs], dtype=np.int64)
            for m in self.members
        ]

    def distill(self, runs: list[int]) -> None:
        """One distillation event for ``runs`` (all share loops and part sizes)."""
        config = self.configs[runs[0]]
        if any(
            (self.configs[r].distill_loops, self.configs[r].part_size)
            != (config.distill_loops, config.part_size)
            for r in runs
        ):
            raise ValueError("runs distilling together must share distill_loops and part_size")
        rows = self._rows(set(runs))
        split = {r: parts(self.public[r], config.part_size) for r in runs}
        width = self.spec.act_dim * (1 if self.spec.kind == "categorical" else 2)
        for _ in range(config.distill_loops):
            for j in range(len(split[runs[0]])):
                n_states = len(split[runs[0]][j])
                uploads = {r: np.empty((self.configs[r].n_agents, n_states, width)) for r in runs}
                outputs = []
                for group, members, group_rows in zip(self.groups, self.members, rows, strict=True):
                    if not len(group_rows):
                        outputs.append(None)
                        continue
                    owners = [members[c] for c in group_rows.tolist()]
                    x = torch.from_numpy(np.stack([split[r][j] for r, _ in owners]))
                    if self._manual:
                        params = group.rows(group_rows)
                        logits_t, kept = group.logits_t(params, x)
                        probs_t = torch.softmax(logits_t, 1)
                        for (r, k), d in zip(owners, probs_t.transpose(1, 2).numpy(), strict=True):
                            uploads[r][k] = d
                        outputs.append((params, (logits_t, probs_t, kept), None, owners))
                        continue
                    params = group.rows(group_rows).requires_grad_(True)
                    out, std = group.forward(params, x, self.kernels)
                    with torch.no_grad():
                        dist = self._softmax(out) if std is None else torch.cat([out, std], -1)
                    for (r, k), d in zip(owners, dist.numpy(), strict=True):
                        uploads[r][k] = d
                    outputs.append((params, out, std, owners))
                targets = {r: self._consensus(r, uploads[r]) for r in runs}
                for group, group_rows, output in zip(self.groups, rows, outputs, strict=True):
                    if output is None:
                        continue
                    params, out, std, owners = output
                    target = torch.as_tensor(
                        np.stack([targets[r] for r, _ in owners]), dtype=group.dtype
                    )
                    directions = [self.configs[r].direction for r, _ in owners]
                    if self._manual:
                        logits_t, probs_t, kept = out
                        grad_t = kl_grad_t(
                            logits_t, probs_t, target.transpose(1, 2).contiguous(), directions
                        )
                        grad = group.backward_t(params, kept, grad_t)
                        group.adam_step(group_rows, grad, schedule=False)
                        continue
                    (grad,) = torch.autograd.grad(
                        distill_loss_by_direction(out, std, target, directions, self._log_softmax),
                        params,
                    )
                    group.adam_step(group_rows, grad, schedule=False)

    def dpa_query(self, runs: list[int], round_id: int) -> None:
        """One DPA-FedRL query for ``runs``: consensus at each server's state, one step each."""
        rows = self._rows(set(runs))
        uploads = {r: np.empty((self.configs[r].n_agents, 1, self.spec.act_dim)) for r in runs}
        outputs = []
        for group, members, group_rows in zip(self.groups, self.members, rows, strict=True):
            if not len(group_rows):
                outputs.append(None)
                continue
            owners = [members[c] for c in group_rows.tolist()]
            x = np.stack([self.server_obs[r][None] for r, _ in owners]).astype(self.np_dtype)
            params = group.flat[torch.as_tensor(group_rows)].requires_grad_(True)
            out, _ = group.forward(params, torch.from_numpy(x))
            probs = torch.softmax(out, -1)
            for (r, k), p in zip(owners, probs.detach().numpy(), strict=True):
                uploads[r][k] = p
            outputs.append((params, probs, owners))
        means = {r: self._consensus(r, uploads[r]) for r in runs}
        for group, group_rows, output in zip(self.groups, rows, outputs, strict=True):
            if output is None:
                continue
            params, probs, owners = output
            target = torch.as_tensor(np.stack([means[r] for r, _ in owners]), dtype=group.dtype)
            (grad,) = torch.autograd.grad(dpa_loss(probs, target).sum(), params)
            schedule = [self.configs[r].dpa_schedule_step for r, _ in owners]
            if all(schedule) or not any(schedule):
                group.adam_step(group_rows, grad, schedule=schedule[0])
            else:
                for flag in (True, False):
                    pick = np.array([s == flag for s in schedule])
                    group.adam_step(group_rows[pick], grad[torch.as_tensor(pick)], schedule=flag)
        for r in runs:
            self.server_obs[r] = dpa_server_step(
                self.server_envs[r], means[r], self.trees[r], round_id
            )

    # -- the whole run --------------------------------------------------------------------------
    def vectors(self, r: int) -> list[np.ndarray]:
        """Run ``r``'s agents' parameters, flat, in agent order."""
        out = []
        for k in range(self.configs[r].n_agents):
            i = self.position[r][k]
            g = next(j for j, (s, e) in enumerate(self.bounds) if s <= i < e)
            out.append(self.groups[g].flat[i - self.bounds[g][0]].numpy().copy())
        return out

    def run(self, log_every: int = 0, progress: str | None = None) -> list[RunResult]:
        """Train every run to the end.

        Args:
            log_every: print progress to stderr every this many rounds (0: never).
            progress: also save the returns so far to this ``.npz`` file then.
        """
        returns = [np.zeros((self.rounds, c.n_agents)) for c in self.configs]
        snapshots: list[dict[int, list[np.ndarray]]] = [{} for _ in self.configs]
        start, cpu = time.perf_counter(), time.process_time()
        for round_id in range(self.rounds):
            episode_returns, lengths = self.play(round_id)
            self.learn(lengths)
            for r, config in enumerate(self.configs):
                rows = [self.position[r][k] for k in range(config.n_agents)]
                returns[r][round_id] = episode_returns[rows]
            due = [r for r, c in enumerate(self.configs) if c.distills(round_id)]
            distilling = [r for r in due if self.configs[r].algorithm == "fedhpd"]
            querying = [r for r in due if self.configs[r].algorithm == "dpa"]
            if distilling:
                self.distill(distilling)
            if querying:
                self.dpa_query(querying, round_id)
            for r, wanted in enumerate(self.snapshot_rounds):
                if round_id + 1 in wanted:
                    snapshots[r][round_id + 1] = self.vectors(r)
            if log_every and (round_id + 1) % log_every == 0:
                elapsed = time.perf_counter() - start
                recent = float(
                    np.mean([ret[max(0, round_id - 49) : round_id + 1] for ret in returns])
                )
                print(
                    f"[fedhpd pid {os.getpid()}] round {round_id + 1}/{self.rounds}, "
                    f"{len(self.configs)} runs, {elapsed:.0f} s, "
                    f"mean return (last 50 rounds) {recent:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
                if progress:
                    np.savez(
                        progress,
                        rounds_done=round_id + 1,
                        labels=np.array([c.label() for c in self.configs]),
                        seeds=np.array(self.seeds),
                        cpu_seconds=time.process_time() - cpu,
                        **{f"run{r}": ret[: round_id + 1] for r, ret in enumerate(returns)},
                    )
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        self.envs.close()
        for env in self.server_envs.values():
            env.close()
        results = []
        for r, (config, transport) in enumerate(zip(self.configs, self.transports, strict=True)):
            up, down = transport.view.total_bytes()
            results.append(
                RunResult(
                    config,
                    self.seeds[r],
                    "fast",
                    transport.name,
                    returns[r],
                    self.vectors(r),
                    seconds,
                    up,
                    down,
                    snapshots[r],
                    cpu,
                )
            )
        return results


def train_population(
    runs: Sequence[RunSpec], log_every: int = 0, progress: str | None = None
) -> list[RunResult]:
    """Train ``runs`` (one task, same rounds) together in this process; results in run order.

    Call ``torch.set_num_threads(1)`` first for the speed this module is built for (tiny
    networks run slower with more threads): the thread count is the caller's to set, this module
    never changes it.

    Raises:
        ValueError: a run with absent agents (``RunSpec.absent``: the reference learner's).
    """
    lost = [k for k, run in enumerate(runs) if run.absent]
    if lost:
        raise ValueError(
            f"runs {lost[:5]} leave agents out of aggregation rounds (RunSpec.absent); the fast "
            "learner aggregates every agent of a run together: use ReferenceRun"
        )
    return Population(runs).run(log_every, progress)


# == The public state set (securefed.rl.fedhpd section 4) =====================================
def greedy_states(
    spec: TaskSpec, policy: MLPPolicy, episodes: int, tree: SeedTree, *path: int | str
) -> np.ndarray:
    """States visited by ``policy`` acting greedily (argmax / mean) for ``episodes`` episodes."""
    envs = make_env_batch(spec, episodes)
    dtype = next(policy.parameters()).dtype
    obs = envs.reset(np.arange(episodes), [stream_seed(tree, *path, e) for e in range(episodes)])
    alive = np.ones(episodes, dtype=bool)
    visited = []
    for _ in range(spec.episode_cap):
        visited.append(obs[alive].copy())
        with torch.no_grad():
            first, _ = policy(torch.as_tensor(obs, dtype=dtype))
        actions = first.argmax(-1).numpy() if spec.kind == "categorical" else first.numpy()
        obs, _, done = envs.step(actions, alive)
        alive &= ~done
        if not alive.any():
            break
    envs.close()
    return np.concatenate(visited).astype(np.float32)


def select_public_states(
    states: np.ndarray, size: int, spec: TaskSpec, tree: SeedTree
) -> np.ndarray:
    """StandardScaler -> PCA -> KMeans, then ``size`` states drawn equally per cluster.

    Draws are without replacement, with replacement from a cluster smaller than its share; the
    set is ordered cluster by cluster (as the authors' file, which their parts split in order).
    """
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    if len(states) < spec.clusters:
        raise ValueError(f"{len(states)} states cannot make {spec.clusters} clusters")
    scaled = StandardScaler().fit_transform(states)
    embedded = PCA(n_components=min(spec.pca_components, states.shape[1])).fit_transform(scaled)
    kmeans = KMeans(n_clusters=spec.clusters, n_init=10, random_state=stream_seed(tree, "kmeans"))
    labels = kmeans.fit_predict(embedded)
    rng = tree.generator("public", "draw")
    shares = np.full(spec.clusters, size // spec.clusters)
    shares[: size % spec.clusters] += 1
    chosen = []
    for cluster, share in enumerate(shares):
        members = np.flatnonzero(labels == cluster)
        chosen.append(rng.choice(members, share, replace=len(members) < share))
    return states[np.concatenate(chosen)].astype(np.float32)


def make_public_states(config: FedHPDConfig) -> np.ndarray:
    """``S_p`` for ``config``'s task: made once by the server's virtual agent (spec section 3).

    The virtual agent (``VIRTUAL_AGENTS[task]``) trains with REINFORCE on the server's own copy
    of the environment for ``virtual_rounds`` rounds; each checkpoint plays
    ``rollouts_per_checkpoint`` greedy episodes; their states are clustered and drawn from.
    Cached per process for equal parameters.
    """
    return _public_states(
        config.task, config.public_size, config.public_seed, config.virtual_rounds,
        config.checkpoints, config.dtype,
    ).copy()  # fmt: skip


@functools.lru_cache(maxsize=8)
def _public_states(
    task: str, size: int, seed: int, rounds: int, checkpoints: tuple[int, ...], dtype: str
) -> np.ndarray:
    spec = TASKS[task]
    virtual = FedHPDConfig(
        task=task, algorithm="nofed", rounds=rounds, agent_specs=(VIRTUAL_AGENTS[task],),
        public_size=size, virtual_rounds=rounds, checkpoints=checkpoints, dtype=dtype,
    )  # fmt: skip
    tree = SeedTree(seed)
    (result,) = train_population([RunSpec(virtual, seed, snapshot_rounds=checkpoints)])
    visited = []
    for checkpoint in checkpoints:
        policy = make_policy(
            VIRTUAL_AGENTS[task], spec.kind, spec.obs_dim, spec.act_dim,
            torch.Generator(), virtual.torch_dtype,
        )  # fmt: skip
        load_vector(policy, result.snapshots[checkpoint][0])
        visited.append(
            greedy_states(spec, policy, spec.rollouts_per_checkpoint, tree, "public", checkpoint)
        )
    return select_public_states(np.concatenate(visited), size, spec, tree)


# == One run, either learner ==================================================================
def train(
    config: FedHPDConfig,
    seed: int,
    *,
    transport: Transport | None = None,
    public_states: np.ndarray | None = None,
    learner: Literal["fast", "reference"] = "fast",
) -> RunResult:
    """Train one run (10 agents of ``config.task``) and return its returns and parameters.

    Args:
        config: the run's configuration.
        seed: the run's seed.
        transport: the aggregation transport (default: a fresh plaintext one).
        public_states: ``S_p`` for a FedHPD run (default: :func:`make_public_states`).
        learner: ``fast`` (this module) or ``reference`` (the step-by-step
            :class:`securefed.rl.fedhpd.ReferenceRun`).

    Raises:
        ValueError: an unknown learner.
    """
    if learner not in ("fast", "reference"):
        raise ValueError(f"learner must be fast or reference, got {learner!r}")
    if public_states is None and config.algorithm == "fedhpd":
        public_states = make_public_states(config)
    run = RunSpec(config, seed, transport, public_states)
    if learner == "reference":
        return ReferenceRun(run).run()
    return train_population([run])[0]


# == Processes ================================================================================
def _worker(runs: Sequence[RunSpec], connection, log_every: int, progress: str | None) -> None:
    try:
        connection.send(("ok", train_population(runs, log_every, progress)))
    except BaseException as error:  # report, never hang the parent
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def _progress_file(directory: str | os.PathLike | None, worker: int) -> str | None:
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    return os.path.join(os.fspath(directory), f"progress_{worker}.npz")


DISTILL_STEP_ROUNDS = 1.0
"""What one distillation step of a run (one part of ``S_p``: forward, upload, KL step) costs, in
rounds of play and REINFORCE of that run. Fitted on CartPole (2-core dev box, one thread a
worker): with it, the old round-robin split of the paper's column predicts its two workers' CPU
ratio as 40000 / 35000 = 1.143, and the recorded workers took 1054 / 922 s = 1.142
(benchmarks/results/fedhpd/README.md)."""


def run_cost(config: FedHPDConfig) -> float:
    """A run's predicted CPU cost, in rounds of play and learning: its rounds plus its
    distillation steps (events x loops x parts), each weighted by :data:`DISTILL_STEP_ROUNDS` and
    its part's size against 2500 states. DPA's one-state queries count as nothing."""
    steps = 0.0
    if config.algorithm == "fedhpd":
        part = min(config.part_size, config.public_size) / 2500
        steps = (config.rounds // config.d) * config.distill_loops * config.n_parts() * part
    return config.rounds + DISTILL_STEP_ROUNDS * steps


def balanced_chunks(runs: Sequence[RunSpec], workers: int) -> list[list[int]]:
    """Indices of ``runs`` in up to ``workers`` chunks of about equal predicted cost.

    Longest processing time first: runs sorted by :func:`run_cost` (largest first; ties by label,
    then seed, so the split is deterministic) each go to the chunk with the least cost so far
    (ties to the lower chunk). A chunk's indices are in run order.
    """
    order = sorted(
        range(len(runs)),
        key=lambda i: (-run_cost(runs[i].config), runs[i].config.label(), runs[i].seed),
    )
    loads = [0.0] * workers
    chunks: list[list[int]] = [[] for _ in range(workers)]
    for i in order:
        w = min(range(workers), key=lambda j: (loads[j], j))
        chunks[w].append(i)
        loads[w] += run_cost(runs[i].config)
    return [sorted(c) for c in chunks if c]


def train_parallel(
    runs: Sequence[RunSpec],
    workers: int = 2,
    log_every: int = 0,
    progress_dir: str | os.PathLike | None = None,
) -> list[RunResult]:
    """Train ``runs`` in up to ``workers`` forked processes, one population each.

    Transports and public states travel into the children by ``fork``; results come back through
    pipes. ``workers=1`` trains in this process. The children inherit this process's torch
    thread count: call ``torch.set_num_threads(1)`` first (the command line and the benchmarks
    do), one thread per worker being what this learner is built for. With ``progress_dir``,
    each population saves its returns so far to ``progress_<i>.npz`` there every ``log_every``
    rounds.

    Raises:
        RuntimeError: naming the error a worker reported.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    chunks = balanced_chunks(runs, workers)
    if len(chunks) <= 1:
        return train_population(runs, log_every, _progress_file(progress_dir, 0))
    context = multiprocessing.get_context("fork")
    pending = []
    for w, chunk in enumerate(chunks):
        receive, send = context.Pipe(duplex=False)
        args = ([runs[i] for i in chunk], send, log_every, _progress_file(progress_dir, w))
        process = context.Process(target=_worker, args=args)
        process.start()
        send.close()
        pending.append((chunk, receive, process))
    results: list[RunResult | None] = [None] * len(runs)
    errors = []
    for chunk, receive, process in pending:
        try:
            status, payload = receive.recv()
        except EOFError:
            status, payload = "error", f"worker exited with code {process.exitcode}"
        process.join()
        if status != "ok":
            errors.append(payload)
            continue
        for i, result in zip(chunk, payload, strict=True):
            results[i] = result
    if errors:
        raise RuntimeError("FedHPD worker failed: " + "; ".join(errors))
    return results  # type: ignore[return-value]
