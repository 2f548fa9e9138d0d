"""The heterogeneous agents of FedHPD: ten policy networks per task, categorical and Gaussian heads.

Facts from specs/fedhpd.md section 5 (the paper's Tables 4-6): every agent of a task differs in its
hidden layers, activations and learning rate. Discrete tasks (CartPole, LunarLander) use a
categorical softmax MLP; InvertedPendulum uses a Gaussian MLP with a linear mean head and a
softplus standard-deviation head (spec section 2).

Both learners (the step-by-step reference in :mod:`securefed.rl.fedhpd` and the vectorised one in
:mod:`securefed.rl.fast`) build every agent with :func:`make_policy` from a ``torch.Generator`` of
the run's
seed tree, and sample actions with the numpy functions at the end of this module, so that the two
draw the same actions from the same numbers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = ("relu", "tanh")
Kind = Literal["categorical", "gaussian"]
KINDS: tuple[str, ...] = ("categorical", "gaussian")
MIN_STD = 1e-6
"""Added to the softplus standard deviation (the authors' code adds 1e-6 when sampling)."""


@dataclass(frozen=True)
class AgentSpec:
    """One agent's network and optimiser setting.

    Attributes:
        hidden: widths of the hidden layers.
        activations: one activation per hidden layer (``"relu"`` or ``"tanh"``).
        lr: the agent's learning rate ``lr_k``.
    """

    hidden: tuple[int, ...]
    activations: tuple[str, ...]
    lr: float

    def __post_init__(self) -> None:
        if not self.hidden or any(int(w) != w or w < 1 for w in self.hidden):
            raise ValueError(f"hidden must be one or more positive widths, got {self.hidden}")
        if len(self.activations) != len(self.hidden):
            raise ValueError(
                f"{len(self.hidden)} hidden layers need as many activations, got {self.activations}"
            )
        unknown = set(self.activations) - set(ACTIVATIONS)
        if unknown:
            raise ValueError(f"unknown activation(s) {sorted(unknown)}; known: {ACTIVATIONS}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr}")

    @property
    def architecture(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """What agents must share to be stacked: widths and activations (not the lr)."""
        return (self.hidden, self.activations)

    def describe(self) -> str:
        """E.g. ``16x16x32 (tanh) lr=4e-3``."""
        acts = sorted(set(self.activations))
        act = acts[0] if len(acts) == 1 else ",".join(self.activations)
        return f"{'x'.join(map(str, self.hidden))} ({act}) lr={self.lr:g}"


def _same(hidden: tuple[int, ...], activation: str, lr: float) -> AgentSpec:
    return AgentSpec(hidden, (activation,) * len(hidden), lr)


# Spec section 5, CartPole column (the paper's Table 4).
CARTPOLE_AGENTS: tuple[AgentSpec, ...] = (
    _same((128,), "relu", 1e-3),
    _same((32, 32), "relu", 2e-3),
    _same((16, 16, 32), "tanh", 4e-3),
    _same((8, 8, 8), "relu", 5e-4),
    _same((32, 32, 32), "tanh", 3e-3),
    _same((8, 8), "relu", 7e-4),
    _same((64, 64), "tanh", 1e-3),
    _same((16, 16), "relu", 5e-4),
    _same((16, 32, 16), "tanh", 5e-4),
    _same((32,), "relu", 8e-4),
)

# Spec section 5, LunarLander column (the paper's Table 5).
LUNARLANDER_AGENTS: tuple[AgentSpec, ...] = (
    _same((128, 128, 256), "relu", 5e-4),
    _same((64, 64), "relu", 1e-3),
    _same((128, 128), "tanh", 4e-4),
    _same((128, 256), "relu", 6e-4),
    _same((256, 256), "tanh", 3e-4),
    _same((512,), "relu", 4e-4),
    _same((64, 128, 64), "tanh", 5e-4),
    _same((32, 32), "relu", 1e-3),
    _same((512, 512), "tanh", 2e-4),
    _same((1024,), "relu", 1e-4),
)

# Spec section 5, InvertedPendulum column (the paper's Table 6), per-layer activations.
INVERTEDPENDULUM_AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec((16, 32), ("tanh", "tanh"), 1e-4),
    AgentSpec((32, 32), ("relu", "relu"), 1e-4),
    AgentSpec((64, 128), ("tanh", "relu"), 6e-5),
    AgentSpec((128, 256), ("relu", "relu"), 1e-5),
    AgentSpec((32, 64), ("relu", "tanh"), 1e-4),
    AgentSpec((64, 64), ("tanh", "tanh"), 8e-5),
    AgentSpec((128, 128), ("relu", "relu"), 4e-5),
    AgentSpec((64, 32), ("tanh", "relu"), 7e-5),
    AgentSpec((256, 128), ("tanh", "tanh"), 2e-5),
    AgentSpec((32, 128), ("relu", "relu"), 5e-5),
)

AGENTS: dict[str, tuple[AgentSpec, ...]] = {
    "cartpole": CARTPOLE_AGENTS,
    "lunarlander": LUNARLANDER_AGENTS,
    "invertedpendulum": INVERTEDPENDULUM_AGENTS,
}

# The server's "virtual agent" that generates the public state set (spec section 3). CartPole and
# LunarLander use the authors' choices (128 relu, lr 1e-3; 256x256 tanh); the learning rates of
# the LunarLander and InvertedPendulum virtual agents are not in the spec and are ours.
VIRTUAL_AGENTS: dict[str, AgentSpec] = {
    "cartpole": _same((128,), "relu", 1e-3),
    "lunarlander": _same((256, 256), "tanh", 5e-4),
    "invertedpendulum": AgentSpec((64, 64), ("tanh", "tanh"), 1e-4),
}


class MLPPolicy(nn.Module):
    """An MLP policy: hidden layers, then a categorical or a Gaussian head.

    Parameters, in :meth:`parameters` order (the flat layout :mod:`securefed.rl.fast` stacks):
    ``layers.i.weight, layers.i.bias`` for each hidden layer, then ``head.weight, head.bias``
    (logits, or the Gaussian mean), then for Gaussian ``std_head.weight, std_head.bias``.

    Args:
        spec: widths and activations.
        kind: ``"categorical"`` (softmax over ``act_dim`` actions) or ``"gaussian"`` (diagonal
            Normal over ``act_dim`` dimensions, std ``softplus(.) + MIN_STD``).
        obs_dim: observation size.
        act_dim: number of actions (categorical) or action dimensions (Gaussian).
    """

    def __init__(self, spec: AgentSpec, kind: Kind, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if obs_dim < 1 or act_dim < 1:
            raise ValueError(f"obs_dim and act_dim must be >= 1, got {obs_dim}, {act_dim}")
        self.spec, self.kind, self.obs_dim, self.act_dim = spec, kind, obs_dim, act_dim
        widths = (obs_dim, *spec.hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], act_dim)
        self.std_head = nn.Linear(widths[-1], act_dim) if kind == "gaussian" else None

    def trunk(self, obs: torch.Tensor) -> torch.Tensor:
        h = obs
        for layer, activation in zip(self.layers, self.spec.activations, strict=True):
            h = layer(h)
            h = torch.relu(h) if activation == "relu" else torch.tanh(h)
        return h

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(logits, None)`` for categorical, ``(mean, std)`` for Gaussian."""
        h = self.trunk(obs)
        if self.std_head is None:
            return self.head(h), None
        return self.head(h), F.softplus(self.std_head(h)) + MIN_STD

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) per row (Gaussian: mean over action dimensions, as the authors' code)."""
        first, std = self(obs)
        if std is None:
            return F.log_softmax(first, dim=-1).gather(-1, actions.long().unsqueeze(-1))[..., 0]
        return gaussian_log_prob(first, std, actions).mean(-1)

    def distribution(self, obs: torch.Tensor) -> torch.Tensor:
        """An agent's upload per state: probabilities ``(B, A)`` or ``[mean, std]`` ``(B, 2A)``."""
        first, std = self(obs)
        if std is None:
            return torch.softmax(first, dim=-1)
        return torch.cat([first, std], dim=-1)


def gaussian_log_prob(mean: torch.Tensor, std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2) (the formula of ``torch.distributions.Normal``)."""
    return -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))


def init_linear_(layer: nn.Linear, generator: torch.Generator) -> None:
    """``nn.Linear``'s default initialisation, drawn from ``generator`` (no global RNG)."""
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        bound = 1.0 / math.sqrt(layer.in_features)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


def make_policy(
    spec: AgentSpec,
    kind: Kind,
    obs_dim: int,
    act_dim: int,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> MLPPolicy:
    """A freshly initialised policy; every weight comes from ``generator`` in parameter order."""
    policy = MLPPolicy(spec, kind, obs_dim, act_dim)
    for module in policy.modules():
        if isinstance(module, nn.Linear):
            init_linear_(module, generator)
    return policy.to(dtype)


def policy_vector(policy: nn.Module) -> np.ndarray:
    """All parameters of ``policy`` as one flat numpy vector, in :meth:`parameters` order."""
    return torch.nn.utils.parameters_to_vector(policy.parameters()).detach().numpy().copy()


def load_vector(policy: nn.Module, vector: np.ndarray) -> nn.Module:
    """Write a flat vector (from :func:`policy_vector` or :mod:`securefed.rl.fast`) into
    ``policy``."""
    reference = next(policy.parameters())
    flat = torch.as_tensor(np.asarray(vector), dtype=reference.dtype)
    n = sum(p.numel() for p in policy.parameters())
    if flat.shape != (n,):
        raise ValueError(
            f"this policy has {n} parameters, the vector has shape {tuple(flat.shape)}"
        )
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat, policy.parameters())
    return policy


# -- sampling, shared by both learners (numpy, no autograd) -----------------------------------
def softmax_np(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in the logits' dtype."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def sample_categorical(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: row ``i`` takes the first action whose cumulative probability exceeds
    ``u[i]`` (``u`` uniform on [0, 1)); the last action takes whatever rounding leaves."""
    cdf = np.cumsum(probs, axis=-1)
    return (cdf[:, :-1] <= u[:, None]).sum(axis=-1)


def softplus_np(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.softplus`` (beta 1, threshold 20) in numpy."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def sample_gaussian(mean: np.ndarray, std: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``mean + std * z`` with ``z`` standard normal (same dtype as ``mean``)."""
    return mean + std * z.astype(mean.dtype)
