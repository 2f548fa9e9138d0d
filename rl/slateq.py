"""SlateQ (Ie et al., IJCAI 2019) on the multi-platform choc-vs-kale simulator.

SlateQ decomposes the value of a slate into item values weighted by the user's choice model
(specs/fedslate.md section 3)::

    Q(s, A) = sum_{i in A} P(i | s, A) Qbar(s, i),   P(i | s, A) = v_i / (v_null + sum_{j in A} v_j)

and learns ``Qbar`` on the clicked item only, with the target ``r + gamma X (1 - done)`` where
``X`` is the value of the next slate: the slate actually taken (SARSA) or the best slate on the
target network (Q-learning). This module holds the pieces FedSlate builds on as well:

* choice models as parameters (:class:`TrueChoiceModel`, the environment's own
  ``exp(1 - k)`` without a null item, the default; :class:`PaperCodeChoiceModel`, the FedSlate
  code's ``softmax([sat k_1 .. sat k_N, 1])`` with a null item);
* slate selection over a fixed slate size ``n`` (the simulator always shows ``n`` documents):
  top-k by ``v_i Qbar_i``, greedy (add the item maximising the slate value, Ie et al. section
  5.2) and the exact linear program (Charnes-Cooper transformation of the fractional program,
  Ie et al. section 5.1, solved with ``scipy.optimize.linprog``; the size constraint is an
  equality here because the slate must hold ``n`` documents);
* :class:`EnsembleMLP`, ``S`` independent networks of one architecture evaluated with batched
  matrix products (``S`` independent runs advance together; the loss is a sum over members, so
  every member's gradients and Adam states are its own);
* :class:`ReplayBuffer` with rounds aligned over platforms (one row per round, the same row
  indices sampled for every platform);
* :func:`run_slateq`, independent SlateQ agents on the platforms with feedback, random slates on
  the others: the single-platform baseline of FedSlate's table.

Hyper-parameters default to what FedSlate's code used (spec section 2): Adam, Huber loss,
gamma 0.9, replay 2000, batch 32, burn-in 5000 rounds, learning every 3 rounds, target sync
every 500 rounds, epsilon 1 decayed by 0.99995 per round and set to 0 below 0.1. Rewards are
scaled by ``reward_scale`` (0.01) and the output layer is linear (the code's Tanh output could not
represent returns near 150: a defect not copied).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import torch
from scipy.optimize import linprog
from torch import nn
from torch.nn import functional as F

from securefed import SeedTree
from securefed.fusion.base import RELU_FIT
from securefed.ranking import top_n
from securefed.rl.checkpoint import EpisodeCheckpoints, TrainingState
from securefed.rl.choices import CHOICE_MODEL_NAMES, LOCAL_ARCHS, PLATFORM_LETTERS, SLATE_METHODS
from securefed.rl.envs.choc_kale import (
    ChocKaleBatch,
    ChocKaleConfig,
    EnvStreams,
    PlatformObservation,
)
from securefed.views import FusionView

__all__ = [
    "CHOICE_MODELS",
    "SLATE_METHODS",
    "ChoiceModel",
    "EnsembleMLP",
    "PaperCodeChoiceModel",
    "ReplayBuffer",
    "RunResult",
    "SlateQConfig",
    "TrueChoiceModel",
    "brute_force_slate",
    "explore",
    "greedy_slates",
    "lp_slate",
    "lp_slates",
    "make_choice_model",
    "masked_huber",
    "run_slateq",
    "select_slates",
    "slate_probabilities",
    "slate_values",
    "slate_values_torch",
    "topk_slates",
    "torch_generator",
]

TARGETS = ("qlearning", "sarsa")
ACTIVATIONS = ("silu", "mish", "relu", "tanh", "identity", "polynomial")
"""``"polynomial"``: the least-squares degree-2 fit of ReLU on [-4, 4],
:data:`securefed.fusion.RELU_FIT` (what a CKKS evaluation computes exactly)."""


# --------------------------------------------------------------------------------------------
# Choice models


class ChoiceModel(Protocol):
    """A multinomial-logit choice model with an optional null item (spec section 3).

    Attributes:
        name: short name recorded in results.
    """

    name: str

    def weights(self, sat: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Item weights ``v`` ``(..., N)`` and null weight ``v_null`` ``(...)``.

        Args:
            sat: ``(...)`` observed satisfaction.
            docs: ``(..., N)`` kaleness of the candidates.
        """


@dataclass(frozen=True)
class TrueChoiceModel:
    """The simulator's own model: ``v_i = exp(1 - k_i)``, no null item (spec section 1)."""

    name: str = "true"

    def weights(self, sat: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        docs = np.asarray(docs, dtype=np.float64)
        return np.exp(1.0 - docs), np.zeros(docs.shape[:-1])


@dataclass(frozen=True)
class PaperCodeChoiceModel:
    """FedSlate code's model: ``softmax([sat k_1 .. sat k_N, 1.0])`` (null item score 1).

    Not the environment's model (spec section 2); kept to measure what it costs.
    """

    name: str = "paper_code"

    def weights(self, sat: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        docs = np.asarray(docs, dtype=np.float64)
        sat = np.asarray(sat, dtype=np.float64)
        return np.exp(sat[..., None] * docs), np.full(docs.shape[:-1], math.e)


CHOICE_MODELS: dict[str, Callable[[], ChoiceModel]] = dict(
    zip(CHOICE_MODEL_NAMES, (TrueChoiceModel, PaperCodeChoiceModel), strict=True)
)


def make_choice_model(name: str) -> ChoiceModel:
    """The choice model called ``name`` (one of :data:`CHOICE_MODELS`)."""
    if name not in CHOICE_MODELS:
        raise ValueError(f"unknown choice model {name!r}; choose from {sorted(CHOICE_MODELS)}")
    return CHOICE_MODELS[name]()


def slate_probabilities(v: np.ndarray, v_null: np.ndarray, slates: np.ndarray) -> np.ndarray:
    """``(M, n)`` click probabilities ``v_i / (v_null + sum_{j in A} v_j)`` of each slate item."""
    chosen = np.take_along_axis(v, slates, axis=-1)
    return chosen / (np.asarray(v_null)[..., None] + chosen.sum(axis=-1, keepdims=True))


def slate_values(
    q: np.ndarray, v: np.ndarray, v_null: np.ndarray, slates: np.ndarray
) -> np.ndarray:
    """``(M,)`` SlateQ value ``sum_{i in A} P(i | A) q_i`` of each slate."""
    probs = slate_probabilities(v, v_null, slates)
    return (probs * np.take_along_axis(q, slates, axis=-1)).sum(axis=-1)


def slate_values_torch(
    q: torch.Tensor, v: torch.Tensor, v_null: torch.Tensor, slates: torch.Tensor
) -> torch.Tensor:
    """Differentiable :func:`slate_values` (gradients flow into ``q``)."""
    chosen_v = torch.gather(v, -1, slates)
    probs = chosen_v / (v_null.unsqueeze(-1) + chosen_v.sum(dim=-1, keepdim=True))
    return (probs * torch.gather(q, -1, slates)).sum(dim=-1)


# --------------------------------------------------------------------------------------------
# Slate selection (fixed slate size n)


def _check_selection(q: np.ndarray, v: np.ndarray, n: int) -> None:
    if q.shape != v.shape:
        raise ValueError(f"q and v must have the same shape, got {q.shape} and {v.shape}")
    if not 1 <= n <= q.shape[-1]:
        raise ValueError(f"slate size must lie in [1, {q.shape[-1]}], got {n}")
    if np.any(v <= 0):
        raise ValueError("item weights v must be > 0")


def topk_slates(q: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """``(M, n)`` the ``n`` items of largest ``v_i q_i`` (Ie et al.'s top-k), best first.

    Ties go to the lower item index (:func:`securefed.ranking.top_n`).
    """
    _check_selection(q, v, n)
    return top_n(v * q, n)


def greedy_slates(q: np.ndarray, v: np.ndarray, v_null: np.ndarray, n: int) -> np.ndarray:
    """``(M, n)`` greedy slates: add the item that maximises the slate value, ``n`` times.

    Step ``t`` adds ``argmax_i (sum_{l in A'} v_l q_l + v_i q_i) / (v_null + sum_{l in A'} v_l
    + v_i)`` over items not yet in ``A'`` (spec section 3); with ``v_null = 0`` the first item is
    the one of largest ``q``.
    """
    q = np.asarray(q, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    _check_selection(q, v, n)
    rows = np.arange(q.shape[0])
    vq = v * q
    open_vq = vq.copy()  # -inf marks items already in the slate
    num = np.zeros(q.shape[0])
    den = np.broadcast_to(np.asarray(v_null, dtype=np.float64), (q.shape[0],)).copy()
    slates = np.empty((q.shape[0], n), dtype=np.int64)
    for t in range(n):
        best = ((num[:, None] + open_vq) / (den[:, None] + v)).argmax(axis=1)
        slates[:, t] = best
        num += vq[rows, best]
        den += v[rows, best]
        open_vq[rows, best] = -np.inf
    return slates


def lp_slate(q: np.ndarray, v: np.ndarray, v_null: float, n: int) -> tuple[np.ndarray, float]:
    """The optimal slate of one state by the Charnes-Cooper linear program (Ie et al. 5.1).

    ``max sum_i y_i v_i q_i  s.t.  t v_null + sum_i y_i v_i = 1,  sum_i y_i = n t,
    0 <= y_i <= t``; then ``x = y / t``. The constraint matrix maps vertices of the LP onto
    vertices of ``{x in [0, 1]^N : sum x = n}``, which are integral, and HiGHS's dual simplex
    returns a vertex, so ``x`` is a 0/1 slate (checked; a tie-broken fractional optimum is
    rounded to its ``n`` largest entries).

    Returns:
        ``(slate, value)``: the ``n`` item indices (by decreasing ``x``) and the slate value.
    """
    q = np.asarray(q, dtype=np.float64).ravel()
    v = np.asarray(v, dtype=np.float64).ravel()
    _check_selection(q[None], v[None], n)
    m = q.size
    # Variables: y_1..y_m, t. linprog minimises, so negate the objective.
    c = np.concatenate([-(v * q), [0.0]])
    a_eq = np.zeros((2, m + 1))
    a_eq[0, :m], a_eq[0, m] = v, v_null
    a_eq[1, :m], a_eq[1, m] = 1.0, -float(n)
    b_eq = np.array([1.0, 0.0])
    a_ub = np.zeros((m, m + 1))
    a_ub[np.arange(m), np.arange(m)] = 1.0
    a_ub[:, m] = -1.0
    result = linprog(
        c,
        A_ub=a_ub,
        b_ub=np.zeros(m),
        A_eq=a_eq,
        b_eq=b_eq,
        bounds=[(0, None)] * (m + 1),
        method="highs-ds",
    )
    if result.status != 0:
        raise RuntimeError(f"slate LP failed: {result.message}")
    y, t = result.x[:m], result.x[m]
    if t <= 0:
        raise RuntimeError("slate LP returned t <= 0 (degenerate program)")
    x = y / t
    slate = np.argsort(-x, kind="stable")[:n]
    value = float(slate_values(q[None], v[None], np.array([v_null]), slate[None])[0])
    return slate.astype(np.int64), value


def lp_slates(q: np.ndarray, v: np.ndarray, v_null: np.ndarray, n: int) -> np.ndarray:
    """:func:`lp_slate` for each row of ``(M, N)`` arrays (one LP per row: slow)."""
    v_null = np.broadcast_to(np.asarray(v_null, dtype=np.float64), (q.shape[0],))
    return np.stack([lp_slate(q[i], v[i], float(v_null[i]), n)[0] for i in range(q.shape[0])])


def brute_force_slate(
    q: np.ndarray, v: np.ndarray, v_null: float, n: int, *, limit: int = 200_000
) -> tuple[np.ndarray, float]:
    """The best slate by enumerating all ``C(N, n)`` subsets (tests and small cases only).

    Raises:
        ValueError: if there are more than ``limit`` subsets.
    """
    q = np.asarray(q, dtype=np.float64).ravel()
    v = np.asarray(v, dtype=np.float64).ravel()
    if math.comb(q.size, n) > limit:
        raise ValueError(f"C({q.size}, {n}) subsets exceed the limit of {limit}")
    subsets = np.array(list(itertools.combinations(range(q.size), n)), dtype=np.int64)
    values = slate_values(
        np.broadcast_to(q, (len(subsets), q.size)),
        np.broadcast_to(v, (len(subsets), q.size)),
        np.full(len(subsets), v_null),
        subsets,
    )
    best = int(values.argmax())
    return subsets[best], float(values[best])


def select_slates(
    method: str, q: np.ndarray, v: np.ndarray, v_null: np.ndarray, n: int
) -> np.ndarray:
    """``(M, n)`` slates by ``method`` in :data:`SLATE_METHODS` (top-k, greedy or exact LP)."""
    if method == "greedy":
        return greedy_slates(q, v, v_null, n)
    if method == "topk":
        return topk_slates(q, v, n)
    if method == "lp":
        return lp_slates(q, v, v_null, n)
    raise ValueError(f"unknown slate method {method!r}; choose from {SLATE_METHODS}")


def explore(
    slates: np.ndarray, epsilon: float, rng: np.random.Generator, num_candidates: int
) -> np.ndarray:
    """Epsilon-greedy over slates: each row is replaced, with probability ``epsilon``, by a
    uniformly random slate of ``n`` distinct candidates."""
    if epsilon <= 0.0:
        return slates
    rows = np.flatnonzero(rng.random(len(slates)) < epsilon)
    if rows.size == 0:
        return slates
    n = slates.shape[1]
    out = slates.copy()
    # the n smallest of uniform keys: a uniformly random slate, its order fixed by the keys
    out[rows] = top_n(-rng.random((rows.size, num_candidates)), n, axis=1)
    return out


# --------------------------------------------------------------------------------------------
# Networks


def torch_generator(tree: SeedTree, *path: int | str) -> torch.Generator:
    """A torch Generator seeded from the SeedTree stream at ``path``."""
    seed = int(tree.generator(*path).integers(0, 2**63 - 1))
    return torch.Generator().manual_seed(seed)


def _np_activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    if name == "silu":

        def silu(x: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives the limit 0
                return x / (1.0 + np.exp(-x))

        return silu
    if name == "mish":
        return lambda x: x * np.tanh(np.logaddexp(0.0, x))
    if name == "relu":
        return lambda x: np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh
    if name == "identity":
        return lambda x: x
    if name == "polynomial":
        return _relu_fit
    raise ValueError(f"unknown activation {name!r}; choose from {ACTIVATIONS}")


def _relu_fit(x):
    """``c_0 + c_1 x + c_2 x^2`` (:data:`securefed.fusion.RELU_FIT`) by Horner's rule, for numpy
    arrays and torch tensors alike."""
    c0, c1, c2 = RELU_FIT
    return (x * c2 + c1) * x + c0


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return F.silu
    if name == "mish":
        return F.mish
    if name == "relu":
        return F.relu
    if name == "tanh":
        return torch.tanh
    if name == "identity":
        return lambda x: x
    if name == "polynomial":
        return _relu_fit
    raise ValueError(f"unknown activation {name!r}; choose from {ACTIVATIONS}")


class EnsembleMLP(nn.Module):
    """``members`` independent MLPs of one architecture, run with batched matrix products.

    Args:
        members: ``S``, independent copies.
        sizes: layer widths ``[in, hidden..., out]``.
        activation: hidden activation (``"identity"`` makes the network linear).
        output_activation: ``"identity"`` (default) or ``"tanh"`` (the paper code's output).
        generator: torch Generator for the initial weights (PyTorch's ``nn.Linear`` rule:
            ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights and biases).

    Shapes: input ``(S, B, in)``, output ``(S, B, out)``.
    """

    def __init__(
        self,
        members: int,
        sizes: Sequence[int],
        *,
        activation: str = "mish",
        output_activation: str = "identity",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        if len(sizes) < 2 or any(int(w) < 1 for w in sizes):
            raise ValueError(f"sizes must list >= 2 positive widths, got {list(sizes)}")
        self.sizes = [int(w) for w in sizes]
        self.members = members
        self.activation = _activation(activation)
        self.output_activation = _activation(output_activation)
        self._np_act = _np_activation(activation)
        self._np_out = _np_activation(output_activation)
        self._views: list[tuple[np.ndarray, np.ndarray]] | None = None
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(self.sizes):
            bound = 1.0 / math.sqrt(fan_in)
            w = torch.empty(members, fan_in, fan_out).uniform_(-bound, bound, generator=generator)
            b = torch.empty(members, 1, fan_out).uniform_(-bound, bound, generator=generator)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[0] != self.members or x.shape[2] != self.sizes[0]:
            raise ValueError(
                f"input must have shape ({self.members}, batch, {self.sizes[0]}), "
                f"got {tuple(x.shape)}"
            )
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            x = self.activation(x) if i < last else self.output_activation(x)
        return x

    def numpy_forward(self, x: np.ndarray) -> np.ndarray:
        """:meth:`forward` in numpy on views of the parameters (acting: no autograd overhead).

        The views share memory with the parameters, so they follow in-place optimiser steps
        and ``load_state_dict``.
        """
        if self._views is None:
            self._views = [
                (w.detach().numpy(), b.detach().numpy())
                for w, b in zip(self.weights, self.biases, strict=True)
            ]
        last = len(self._views) - 1
        for i, (w, b) in enumerate(self._views):
            x = np.matmul(x, w) + b
            x = self._np_act(x) if i < last else self._np_out(x)
        return x


class LocalQNetwork(nn.Module):
    """A platform's Q-network: ``Qbar(s, i)`` for its ``N`` candidates, for ``S`` members.

    The state is ``[sat, k_1..k_N, history]`` (spec section 2). Two architectures:

    * ``"item"`` (default): SlateQ's per-item value (Ie et al.; RecSim's per-item network on
      ``(user, document)``) in a form whose cost does not grow with hidden width times ``N``:
      an MLP of the user features ``[sat, history]`` outputs the coefficients ``c_0..c_d`` of a
      polynomial in the item's feature, ``Qbar(s, i) = sum_m c_m(s) k_i^m``. The weights are
      shared over candidates, so every click informs every candidate's value.
    * ``"flat"``: the paper's MLP from the whole state to ``N`` outputs (one head per candidate
      position, nothing shared); docs/fedslate.md shows that small widths of it rank poorly.

    Args:
        members: ``S``.
        state_dim: ``1 + N (+ H n)``.
        num_candidates: ``N``.
        hidden: hidden widths of the MLP.
        arch: ``"item"`` or ``"flat"``.
        activation, output_activation: see :class:`EnsembleMLP` (the output activation is
            applied to ``Qbar``).
        degree: polynomial degree of the ``"item"`` architecture.
        generator: for the initial weights.
    """

    def __init__(
        self,
        members: int,
        state_dim: int,
        num_candidates: int,
        hidden: Sequence[int],
        *,
        arch: str = "item",
        activation: str = "silu",
        output_activation: str = "identity",
        degree: int = 3,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if arch not in LOCAL_ARCHS:
            raise ValueError(f"arch must be one of {LOCAL_ARCHS}, got {arch!r}")
        if state_dim < 1 + num_candidates:
            raise ValueError(f"state_dim {state_dim} < 1 + num_candidates {num_candidates}")
        if degree < 1:
            raise ValueError(f"degree must be >= 1, got {degree}")
        self.arch, self.num_candidates, self.degree = arch, num_candidates, degree
        self.output_activation = _activation(output_activation)
        self._np_out = _np_activation(output_activation)
        if arch == "item":
            user_dim = state_dim - num_candidates
            sizes = [user_dim, *hidden, degree + 1]
        else:
            sizes = [state_dim, *hidden, num_candidates]
        self.mlp = EnsembleMLP(members, sizes, activation=activation, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(S, B, state_dim)`` states to ``(S, B, N)`` item values."""
        n_cand = self.num_candidates
        if self.arch == "flat":
            return self.output_activation(self.mlp(x))
        user = torch.cat([x[..., :1], x[..., 1 + n_cand :]], dim=-1)
        coef = self.mlp(user)
        k = x[..., 1 : 1 + n_cand]
        q = coef[..., -1:].expand_as(k)
        for m in range(self.degree - 1, -1, -1):  # Horner's rule
            q = torch.addcmul(coef[..., m : m + 1], q, k)
        return self.output_activation(q)

    def numpy_forward(self, x: np.ndarray) -> np.ndarray:
        """:meth:`forward` in numpy (acting)."""
        n_cand = self.num_candidates
        if self.arch == "flat":
            return self._np_out(self.mlp.numpy_forward(x))
        user = np.concatenate([x[..., :1], x[..., 1 + n_cand :]], axis=-1)
        coef = self.mlp.numpy_forward(user)
        k = x[..., 1 : 1 + n_cand]
        q = np.broadcast_to(coef[..., -1:], k.shape)
        for m in range(self.degree - 1, -1, -1):  # Horner's rule
            q = q * k + coef[..., m : m + 1]
        return self._np_out(q)


def masked_huber(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, delta: float
) -> torch.Tensor:
    """Sum over members of the mean Huber loss over each member's unmasked rows.

    ``pred``, ``target``, ``mask``: ``(S, B)``. A member without unmasked rows contributes 0.
    """
    loss = F.huber_loss(
        pred, torch.where(mask, target, pred.detach()), reduction="none", delta=delta
    )
    count = mask.sum(dim=1).clamp(min=1)
    return ((loss * mask).sum(dim=1) / count).sum()


# --------------------------------------------------------------------------------------------
# Replay


class ReplayBuffer:
    """Ring buffer of rounds, aligned over platforms (spec section 2: same batch indices).

    One row per round holds, for every platform, the state features, the slate, the clicked
    candidate, the observed feedback (NaN where the platform observed nothing), the next state
    and the next slate taken (for SARSA), for each of the ``S`` members.

    Args:
        capacity: rows kept (2000 in FedSlate's code).
        members: ``S``.
        state_dims: per platform, the feature length.
        slate_size: ``n``.
    """

    def __init__(
        self, capacity: int, members: int, state_dims: Sequence[int], slate_size: int
    ) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2, got {capacity}")
        self.capacity, self.members, self.size, self.head = capacity, members, 0, 0
        shape = (capacity, members)
        self.x = [np.zeros((*shape, d), np.float32) for d in state_dims]
        self.x_next = [np.zeros((*shape, d), np.float32) for d in state_dims]
        self.slate = [np.zeros((*shape, slate_size), np.int64) for _ in state_dims]
        self.next_slate = [np.zeros((*shape, slate_size), np.int64) for _ in state_dims]
        self.clicked = [np.zeros(shape, np.int64) for _ in state_dims]
        self.feedback = [np.full(shape, np.nan, np.float32) for _ in state_dims]
        self.done = np.zeros(capacity, dtype=bool)
        self._last: int | None = None

    def add(
        self,
        platform: int,
        x: np.ndarray,
        slate: np.ndarray,
        clicked: np.ndarray,
        feedback: np.ndarray,
        x_next: np.ndarray,
    ) -> None:
        """Write ``platform``'s part of the round being assembled (row ``head``)."""
        row = self.head
        self.x[platform][row] = x
        self.slate[platform][row] = slate
        self.clicked[platform][row] = clicked
        self.feedback[platform][row] = feedback
        self.x_next[platform][row] = x_next
        if self._last is not None and not self.done[self._last]:
            self.next_slate[platform][self._last] = slate

    def commit(self, done: bool) -> None:
        """Close the round being assembled; ``done`` marks the episode's last round."""
        self.done[self.head] = done
        self._last = self.head
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    _FIELDS = ("x", "x_next", "slate", "next_slate", "clicked", "feedback")

    def state_dict(self) -> dict[str, object]:
        """Contents and position, as tensors sharing memory with the buffer (checkpoints)."""
        state: dict[str, object] = {
            f"{name}.{p}": torch.from_numpy(array)
            for name in self._FIELDS
            for p, array in enumerate(getattr(self, name))
        }
        last = -1 if self._last is None else self._last
        state["done"] = torch.from_numpy(self.done)
        return state | {"position": [self.size, self.head, last]}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (same capacity, members and shapes)."""
        for name in self._FIELDS:
            for p, array in enumerate(getattr(self, name)):
                saved = state[f"{name}.{p}"]
                if tuple(saved.shape) != array.shape:
                    raise ValueError(
                        f"replay {name}.{p}: saved {tuple(saved.shape)}, buffer {array.shape}"
                    )
                array[...] = saved.numpy()
        self.done[...] = state["done"].numpy()
        self.size, self.head, last = (int(v) for v in state["position"])
        self._last = None if last < 0 else last

    def sample(self, rng: np.random.Generator, batch: int, sarsa: bool) -> np.ndarray:
        """``(S, batch)`` row indices drawn with replacement, independently per member.

        For SARSA the newest row is left out unless it ends an episode (its next slate is not
        known yet).
        """
        exclude = sarsa and self._last is not None and not self.done[self._last]
        span = self.size - (1 if exclude else 0)
        if span < 1:
            raise ValueError("the replay buffer holds no sampleable row")
        idx = rng.integers(0, span, (self.members, batch))
        if exclude and self.size == self.capacity:
            # Map [0, span) onto the valid rows, skipping the newest one.
            idx = np.where(idx >= self._last, idx + 1, idx)
        return idx

    def gather(self, field_list: list[np.ndarray], platform: int, idx: np.ndarray) -> np.ndarray:
        """``field_list[platform]`` at rows ``idx`` ``(S, B)``: shape ``(S, B, ...)``."""
        members = np.arange(self.members)[:, None]
        return field_list[platform][idx, members]


# --------------------------------------------------------------------------------------------
# Configuration and results


@dataclass(frozen=True)
class SlateQConfig:
    """Hyper-parameters of one SlateQ run (and the shared part of FedSlate's).

    Environment: ``num_candidates`` (N), ``slate_size`` (n), ``num_platforms`` (K),
    ``feedback`` (per platform; default the first only), ``feedback_prob``, ``shared_corpus``,
    ``steps_per_platform``: see :class:`~securefed.rl.envs.choc_kale.ChocKaleConfig`.

    Learning (defaults: FedSlate's code, spec section 2): ``episodes``, ``members`` (independent
    runs advanced together, each its own network, replay and streams), ``seed`` (``None``, the
    default: secure mode, every stream from OS entropy; an int: the seeded, reproducible run,
    not private),
    ``local_hidden`` (hidden widths of each platform's Q-network; the code used five layers of
    4096, see docs/fedslate.md for the choice), ``local_arch`` and ``item_degree`` (see
    :class:`LocalQNetwork`), ``activation`` (SiLU by default: the paper's Mish has the same
    self-gated shape, and torch's CPU Mish kernel is several times slower, measured in
    docs/fedslate.md), ``output_activation``,
    ``reward_scale``, ``history_scale`` (factor on the engagement history features), ``lr``,
    ``gamma``, ``huber_delta``, ``buffer_size``, ``batch_size``, ``burn_in`` (rounds before
    learning), ``learn_every`` (rounds), ``target_sync`` (rounds), ``eps_start``, ``eps_decay``
    (factor per round), ``eps_floor`` (epsilon is 0 below it), ``slate_method`` (acting and
    targets), ``target`` (``"qlearning"`` or ``"sarsa"``), ``choice_model`` (the agents'),
    ``threads`` (torch threads the caller should use: the runs set no global state, the CLI and
    the benchmarks apply it with ``torch.set_num_threads``), ``log_every`` (episodes between
    progress lines; 0: silent).
    """

    num_candidates: int = 10
    slate_size: int = 3
    num_platforms: int = 2
    feedback: tuple[bool, ...] | None = None
    feedback_prob: float = 1.0
    shared_corpus: bool = False
    steps_per_platform: int = 61
    episodes: int = 5000
    members: int = 1
    seed: int | None = None
    local_hidden: tuple[int, ...] = (64, 64)
    local_arch: str = "item"
    item_degree: int = 3
    activation: str = "silu"
    output_activation: str = "identity"
    reward_scale: float = 0.01
    history_scale: float = 0.05
    lr: float = 1e-3
    gamma: float = 0.9
    huber_delta: float = 1.0
    buffer_size: int = 2000
    batch_size: int = 32
    burn_in: int = 5000
    learn_every: int = 3
    target_sync: int = 500
    eps_start: float = 1.0
    eps_decay: float = 0.99995
    eps_floor: float = 0.1
    slate_method: str = "greedy"
    target: str = "qlearning"
    choice_model: str = "true"
    threads: int = 1
    log_every: int = 0

    def __post_init__(self) -> None:
        # The environment validates its own part.
        object.__setattr__(self, "feedback", self.env_config().feedback)
        object.__setattr__(self, "local_hidden", tuple(int(w) for w in self.local_hidden))
        for name in (
            "episodes",
            "members",
            "batch_size",
            "learn_every",
            "target_sync",
            "threads",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or self.seed < 0):
            raise ValueError(f"seed must be None (secure mode) or an int >= 0, got {self.seed}")
        if self.buffer_size < 2:
            raise ValueError(f"buffer_size must be >= 2, got {self.buffer_size}")
        if self.burn_in < 0 or self.log_every < 0:
            raise ValueError("burn_in and log_every must be >= 0")
        if any(w < 1 for w in self.local_hidden):
            raise ValueError(f"local_hidden widths must be >= 1, got {self.local_hidden}")
        if self.local_arch not in LOCAL_ARCHS:
            raise ValueError(f"local_arch must be one of {LOCAL_ARCHS}, got {self.local_arch!r}")
        if self.item_degree < 1:
            raise ValueError(f"item_degree must be >= 1, got {self.item_degree}")
        for name in ("activation", "output_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise ValueError(
                    f"{name} must be one of {ACTIVATIONS}, got {getattr(self, name)!r}"
                )
        for name in ("reward_scale", "history_scale", "lr", "huber_delta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"gamma must lie in [0, 1), got {self.gamma}")
        if not (0.0 <= self.eps_floor <= self.eps_start <= 1.0 and 0.0 < self.eps_decay <= 1.0):
            raise ValueError("need 0 <= eps_floor <= eps_start <= 1 and 0 < eps_decay <= 1")
        if self.slate_method not in SLATE_METHODS:
            raise ValueError(f"slate_method must be one of {SLATE_METHODS}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        make_choice_model(self.choice_model)

    def env_config(self) -> ChocKaleConfig:
        """The simulator's configuration."""
        return ChocKaleConfig(
            num_candidates=self.num_candidates,
            slate_size=self.slate_size,
            num_platforms=self.num_platforms,
            steps_per_platform=self.steps_per_platform,
            feedback=self.feedback,
            feedback_prob=self.feedback_prob,
            shared_corpus=self.shared_corpus,
        )

    def epsilon(self, rounds: int) -> float:
        """Exploration rate after ``rounds`` rounds (0 once below ``eps_floor``)."""
        eps = self.eps_start * self.eps_decay**rounds
        return 0.0 if eps < self.eps_floor else eps

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class RunResult:
    """What a run produced.

    Attributes:
        algorithm: e.g. ``"slateq"``, ``"fedslate"``.
        config: the configuration as a dict.
        episode_rewards: ``(episodes, members, platforms)`` per-platform episode rewards (sum of
            engagements of that platform's steps in the episode; ground truth).
        seconds: wall-clock time of the run.
        rounds: rounds played per member.
        learn_steps: learning steps taken.
        updates: per network name, optimiser steps taken.
        timings: seconds spent acting (inquiry, slates, environment) and learning.
        networks: the trained online networks by name (``local_A``, ..., ``server``); not
            serialised with the result.
        fusion_view: FedSlate's fusion channel's record of what the server saw
            (:class:`~securefed.views.FusionView`); ``None`` for runs without a server. Not
            serialised with the result (save it with ``fusion_view.save(directory)``).
        fusion_clean: under a DP transport asked to keep them, the acting inquiries' Q-values
            before clipping and noise, ``(round, {party: rows})`` each (the scorer's truth,
            never the server's view); ``None`` otherwise. Not serialised.
    """

    algorithm: str
    config: dict[str, object]
    episode_rewards: np.ndarray
    seconds: float
    rounds: int
    learn_steps: int
    updates: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    networks: dict[str, nn.Module] = field(default_factory=dict, repr=False)
    fusion_view: FusionView | None = field(default=None, repr=False)
    fusion_clean: list | None = field(default=None, repr=False)

    @property
    def episodes_per_second(self) -> float:
        """Episodes per second of one member (all members advance together)."""
        return self.episode_rewards.shape[0] / max(self.seconds, 1e-9)

    def to_record(self) -> dict[str, object]:
        """The JSON-serialisable fields (networks left out, rewards rounded to 0.01)."""
        return {
            "algorithm": self.algorithm,
            "config": self.config,
            "seconds": self.seconds,
            "episodes_per_second": self.episodes_per_second,
            "timings": self.timings,
            "learn_steps": self.learn_steps,
            "updates": self.updates,
            "rewards": np.round(self.episode_rewards, 2).tolist(),
        }


def local_network(
    config: SlateQConfig, state_dim: int, generator: torch.Generator | None = None
) -> LocalQNetwork:
    """A platform's :class:`LocalQNetwork` as ``config`` describes it."""
    return LocalQNetwork(
        config.members,
        state_dim,
        config.num_candidates,
        config.local_hidden,
        arch=config.local_arch,
        activation=config.activation,
        output_activation=config.output_activation,
        degree=config.item_degree,
        generator=generator,
    )


def features(obs: PlatformObservation, config: SlateQConfig) -> np.ndarray:
    """``(U, d)`` state features of a platform's observation (spec section 2's states)."""
    return obs.features(config.history_scale)


def choice_weights(
    choice: ChoiceModel, x: np.ndarray, num_candidates: int
) -> tuple[np.ndarray, np.ndarray]:
    """Choice weights from state features ``x`` (``[..., 0]`` sat, ``[..., 1:1+N]`` docs)."""
    return choice.weights(x[..., 0], x[..., 1 : 1 + num_candidates])


def next_values(
    config: SlateQConfig,
    choice: ChoiceModel,
    q_next: np.ndarray,
    x_next: np.ndarray,
    next_slates: np.ndarray | None,
) -> np.ndarray:
    """``X`` of the TD target: value of the next slate under the target network's ``q_next``.

    Q-learning: the ``slate_method`` slate on ``q_next``; SARSA: the slate actually taken next.
    Shapes: ``q_next`` ``(S, B, N)``; returns ``(S, B)``.
    """
    s, b, n_cand = q_next.shape
    v, v_null = choice_weights(choice, x_next.reshape(s * b, -1), n_cand)
    q_flat = q_next.reshape(s * b, n_cand)
    if config.target == "sarsa":
        slates = next_slates.reshape(s * b, -1)
    else:
        slates = select_slates(config.slate_method, q_flat, v, v_null, config.slate_size)
    return slate_values(q_flat, v, v_null, slates).reshape(s, b)


# --------------------------------------------------------------------------------------------
# The SlateQ run


def run_fingerprint(algorithm: str, config: SlateQConfig) -> dict[str, object]:
    """What a checkpoint must match to be resumed: the algorithm and the configuration."""
    fields = config.to_dict()
    fields.pop("log_every", None)
    return {"algorithm": algorithm} | fields


def resume_counters(
    state: TrainingState,
    checkpoints: EpisodeCheckpoints | None,
    algorithm: str,
    config: SlateQConfig,
) -> dict[str, object]:
    """Restore ``state`` from ``checkpoints`` when there is one to resume; the loop's counters
    (``episodes`` done, ``rounds``, ``learn`` steps, ``updates``, ``timings``, ``seconds``)."""
    fresh = {"episodes": 0, "rounds": 0, "learn": 0, "updates": {}, "timings": {}, "seconds": 0.0}
    if checkpoints is not None and config.seed is None:
        raise ValueError(
            "a secure-mode run (seed=None) keeps its random streams secret, and an episode "
            "checkpoint would store their states in the clear: give a seed (--seed) to "
            "checkpoint a run, or no checkpoint"
        )
    if checkpoints is None or not checkpoints.should_resume():
        return fresh
    return fresh | state.restore(checkpoints.path, run_fingerprint(algorithm, config))


def checkpoint_if_due(
    state: TrainingState,
    checkpoints: EpisodeCheckpoints | None,
    algorithm: str,
    config: SlateQConfig,
    counters: Mapping[str, object],
) -> None:
    """Save ``state`` with the loop's ``counters`` (as :func:`resume_counters` reads them) when
    ``counters["episodes"]`` is a checkpoint episode."""
    if checkpoints is not None and checkpoints.due(counters["episodes"], config.episodes):
        state.save(checkpoints.path, counters, run_fingerprint(algorithm, config))


def run_slateq(config: SlateQConfig, checkpoints: EpisodeCheckpoints | None = None) -> RunResult:
    """Train independent SlateQ agents on the platforms with feedback (others random).

    Acting: every round each platform (in turn) observes, the feedback platforms pick the
    ``slate_method`` slate on their online Q (epsilon-greedy), the others a random slate.
    Learning (every ``learn_every`` rounds after ``burn_in``): for each feedback platform,
    ``Huber(Q(s, clicked), r + gamma X(s') (1 - done))`` on a replay batch of rounds where it
    observed its feedback. Returns the per-platform episode rewards.

    Sets no global state: callers choose torch's threads (``config.threads``).

    Args:
        config: the run's configuration.
        checkpoints: save the run's state at episode boundaries and resume from it
            (:mod:`securefed.rl.checkpoint`); ``None``: no checkpoints.
    """
    cfg_env = config.env_config()
    tree = SeedTree(config.seed)
    members, k_plat, n_cand, n = (
        config.members,
        config.num_platforms,
        config.num_candidates,
        config.slate_size,
    )
    choice = make_choice_model(config.choice_model)
    env = ChocKaleBatch(
        cfg_env,
        members,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )
    learners = [p for p in range(k_plat) if cfg_env.feedback[p]]
    dims = [cfg_env.state_dim(p) for p in range(k_plat)]
    nets, targets, optims = {}, {}, {}
    for p in learners:
        nets[p] = local_network(config, dims[p], torch_generator(tree, "init", "local", p))
        targets[p] = local_network(config, dims[p])
        targets[p].load_state_dict(nets[p].state_dict())
        targets[p].requires_grad_(False)
        optims[p] = torch.optim.Adam(nets[p].parameters(), lr=config.lr, fused=True)
    act_rng = tree.generator("agent", "explore")
    random_rng = tree.generator("agent", "random-slates")
    replay_rng = tree.generator("agent", "replay")
    replay = ReplayBuffer(config.buffer_size, members, dims, n)
    rewards = np.zeros((config.episodes, members, k_plat))
    updates = {f"local_{PLATFORM_LETTERS[p]}": 0 for p in learners}
    sarsa = config.target == "sarsa"
    state = TrainingState(
        stateful={f"net.{p}": nets[p] for p in learners}
        | {f"target.{p}": targets[p] for p in learners}
        | {f"optim.{p}": optims[p] for p in learners}
        | {"replay": replay},
        generators={"explore": act_rng, "random-slates": random_rng, "replay": replay_rng}
        | {f"env.{k}": g for k, g in env.streams.named().items()},
        arrays={"rewards": rewards},
    )
    resumed = resume_counters(state, checkpoints, "slateq", config)
    first_episode, rounds, learn_steps = (resumed[k] for k in ("episodes", "rounds", "learn"))
    updates |= resumed["updates"]
    start = time.perf_counter() - resumed["seconds"]

    def learn() -> None:
        idx = replay.sample(replay_rng, config.batch_size, sarsa)
        for p in learners:
            x = replay.gather(replay.x, p, idx)
            x_next = replay.gather(replay.x_next, p, idx)
            fb = replay.gather(replay.feedback, p, idx)
            clicked = replay.gather(replay.clicked, p, idx)
            done = replay.done[idx]
            with torch.no_grad():
                q_next = targets[p](torch.from_numpy(x_next)).numpy()
            nxt = replay.gather(replay.next_slate, p, idx) if sarsa else None
            x_val = next_values(config, choice, q_next, x_next, nxt)
            valid = ~np.isnan(fb)
            y = np.where(valid, fb, 0.0) * config.reward_scale + config.gamma * x_val * ~done
            q = nets[p](torch.from_numpy(x))
            pred = torch.gather(q, 2, torch.from_numpy(clicked)[..., None])[..., 0]
            loss = masked_huber(
                pred,
                torch.from_numpy(y.astype(np.float32)),
                torch.from_numpy(valid),
                config.huber_delta,
            )
            optims[p].zero_grad(set_to_none=True)
            loss.backward()
            optims[p].step()
            updates[f"local_{PLATFORM_LETTERS[p]}"] += 1

    for episode in range(first_episode, config.episodes):
        env.reset()
        x = [features(env.observation(p), config) for p in range(k_plat)]
        done = False
        while not done:
            eps = config.epsilon(rounds)
            for p in range(k_plat):
                if p in nets:
                    q = nets[p].numpy_forward(x[p][:, None, :])[:, 0]
                    v, v_null = choice_weights(choice, x[p], n_cand)
                    slates = select_slates(config.slate_method, q, v, v_null, n)
                    slates = explore(slates, eps, act_rng, n_cand)
                else:
                    slates = explore(np.zeros((members, n), np.int64), 1.0, random_rng, n_cand)
                out = env.step(p, slates)
                rewards[episode, :, p] += out.engagement
                x_next = features(env.observation(p), config)
                replay.add(p, x[p], slates, out.clicked, out.feedback, x_next)
                x[p] = x_next
                done = out.done
            replay.commit(done)
            rounds += 1
            if learners and rounds > config.burn_in and rounds % config.learn_every == 0:
                learn()
                learn_steps += 1
            if rounds % config.target_sync == 0:
                for p in learners:
                    targets[p].load_state_dict(nets[p].state_dict())
        if config.log_every and (episode + 1) % config.log_every == 0:
            recent = rewards[max(0, episode - config.log_every + 1) : episode + 1].mean(axis=(0, 1))
            print(
                f"slateq episode {episode + 1}: mean reward per platform {np.round(recent, 1)}, "
                f"eps {config.epsilon(rounds):.3f}, {time.perf_counter() - start:.0f}s",
                flush=True,
            )
        counters = {"episodes": episode + 1, "rounds": rounds, "learn": learn_steps}
        counters |= {"updates": updates, "seconds": time.perf_counter() - start}
        checkpoint_if_due(state, checkpoints, "slateq", config, counters)
    return RunResult(
        algorithm="slateq",
        config=config.to_dict(),
        episode_rewards=rewards,
        seconds=time.perf_counter() - start,
        rounds=rounds,
        learn_steps=learn_steps,
        updates=updates,
        networks={f"local_{PLATFORM_LETTERS[p]}": nets[p] for p in learners},
    )
