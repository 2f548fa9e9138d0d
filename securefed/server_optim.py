"""Server optimisers for federated rounds (FedOpt; Reddi et al. 2021, "Adaptive Federated
Optimization", Algorithm 2).

The server treats the aggregated client update as a pseudo-gradient and moves its parameters with a
first-order optimiser. Every rule takes ``update`` with FedOpt's sign: the direction to move (the
mean client delta, i.e. minus the gradient), so ``sgd`` with ``lr=1`` is plain FedAvg.

With ``delta`` the update, ``m`` the first and ``v`` the second moment (all elementwise):

- ``sgd``: ``x + lr * delta``.
- ``momentum`` (heavy ball): ``m = momentum * m + delta``; ``x + lr * m``.
- ``adam`` (FedAdam): ``m = beta1 * m + (1 - beta1) * delta``;
  ``v = beta2 * v + (1 - beta2) * delta**2``; ``x + lr * m / (sqrt(v) + tau)``.
- ``adagrad`` (FedAdagrad): ``m`` as for adam; ``v = v + delta**2``.
- ``yogi`` (FedYogi): ``m`` as for adam; ``v = v - (1 - beta2) * delta**2 * sign(v - delta**2)``.

As in Reddi et al.'s Algorithm 2 there is no bias correction and ``v`` starts at zero (their
``tau**2`` start changes nothing measurable at ``tau = 1e-3``; zero keeps a fresh state trivial).
Parameter blocks are named, so one optimiser serves several blocks (an item matrix, item biases).
A step may be restricted to some rows of a block (sparse item updates): only those rows move and
only their moments advance; the moments of the other rows are left as they are.

Pure numpy and float64 throughout; ``state_dict`` / ``load_state_dict`` round-trip the moments
exactly, so a run resumed from a checkpoint continues bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from securefed._checks import finite_array, positive
from securefed.errors import CheckpointError

SERVER_OPTIMISERS = ("sgd", "momentum", "adam", "adagrad", "yogi")

# Moments each rule keeps per parameter block ("m": first moment / velocity, "v": second moment).
_MOMENTS = {
    "sgd": (),
    "momentum": ("m",),
    "adam": ("m", "v"),
    "adagrad": ("m", "v"),
    "yogi": ("m", "v"),
}
_NAME_KEY = "__optimiser__"
_SEPARATOR = "/"


@dataclass(frozen=True)
class ServerOptimiserConfig:
    """Which server rule to use and its hyperparameters.

    Attributes:
        name: one of ``SERVER_OPTIMISERS``.
        lr: server learning rate (``eta`` in Reddi et al.), finite and > 0.
        momentum: heavy-ball coefficient of ``momentum``, in [0, 1).
        beta1: first-moment decay of ``adam``, ``adagrad`` and ``yogi``, in [0, 1).
        beta2: second-moment decay of ``adam`` and ``yogi``, in [0, 1).
        tau: adaptivity floor added to ``sqrt(v)``, finite and > 0.
    """

    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.name not in SERVER_OPTIMISERS:
            raise ValueError(
                f"unknown server optimiser {self.name!r}; choose one of {SERVER_OPTIMISERS}"
            )
        positive("server optimiser lr", self.lr)
        positive("server optimiser tau", self.tau)
        for field, value in (
            ("momentum", self.momentum),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
        ):
            if not (np.isfinite(value) and 0.0 <= value < 1.0):
                raise ValueError(f"server optimiser {field} must lie in [0, 1), got {value!r}")


def _moment_step(
    rule: str, config: ServerOptimiserConfig, delta: np.ndarray, moments: dict[str, np.ndarray]
) -> np.ndarray:
    """Advance ``moments`` (in place) by one step of ``rule``; return the parameter increment."""
    if rule == "sgd":
        return config.lr * delta
    if rule == "momentum":
        m = config.momentum * moments["m"] + delta
        moments["m"] = m
        return config.lr * m
    m = config.beta1 * moments["m"] + (1.0 - config.beta1) * delta
    squared = delta * delta
    v = moments["v"]
    if rule == "adam":
        v = config.beta2 * v + (1.0 - config.beta2) * squared
    elif rule == "adagrad":
        v = v + squared
    else:  # yogi
        v = v - (1.0 - config.beta2) * squared * np.sign(v - squared)
    moments["m"], moments["v"] = m, v
    return config.lr * m / (np.sqrt(v) + config.tau)


class ServerOptimiser:
    """Stateful server optimiser over named float64 parameter blocks (see the module docstring)."""

    def __init__(self, config: ServerOptimiserConfig) -> None:
        if not isinstance(config, ServerOptimiserConfig):
            raise TypeError(f"config must be a ServerOptimiserConfig, got {type(config).__name__}")
        self.config = config
        self._state: dict[str, dict[str, np.ndarray]] = {}

    def step(
        self,
        name: str,
        params: np.ndarray,
        update: np.ndarray,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return the new value of parameter block ``name`` (float64; ``params`` is not modified).

        Args:
            name: the block's name (non-empty, without ``/``); its moments are kept under it.
            params: current value of the block.
            update: direction to move, FedOpt's pseudo-gradient sign (mean client delta, i.e. minus
                the gradient); the same shape as ``params``.
            rows: optional distinct indices into the first axis of ``params``: only these rows
                move and only their moments advance (sparse item updates); ``update``'s other rows
                are ignored.

        Raises:
            ValueError: a malformed name, a shape differing from ``params`` or from the block's
                earlier steps, a non-finite value, or repeated or out-of-range ``rows``.
        """
        if not isinstance(name, str) or not name or _SEPARATOR in name or name == _NAME_KEY:
            raise ValueError(f"parameter block name must be non-empty without '/', got {name!r}")
        current = finite_array(f"parameters of block {name!r}", params)
        delta = finite_array(f"update of block {name!r}", update)
        if delta.shape != current.shape:
            raise ValueError(
                f"update of block {name!r} has shape {delta.shape}, parameters {current.shape}"
            )
        moments = self._moments_for(name, current.shape)
        if rows is None:
            increment = _moment_step(self.config.name, self.config, delta, moments)
            return current + increment
        index = self._checked_rows(name, rows, current)
        sub_moments = {key: value[index] for key, value in moments.items()}
        increment = _moment_step(self.config.name, self.config, delta[index], sub_moments)
        for key, value in sub_moments.items():
            moments[key][index] = value
        result = current.copy()
        result[index] += increment
        return result

    def state_dict(self) -> dict[str, np.ndarray]:
        """The optimiser's state as flat arrays (keys ``block/moment``), copies, for checkpoints."""
        state = {_NAME_KEY: np.array(self.config.name)}
        for block, moments in self._state.items():
            for key, value in moments.items():
                state[f"{block}{_SEPARATOR}{key}"] = value.copy()
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the state with one from ``state_dict`` (of an optimiser with the same rule).

        Raises:
            CheckpointError: the state belongs to another rule, lacks or adds a moment, or holds
                non-finite or mismatched arrays.
        """
        if _NAME_KEY not in state:
            raise CheckpointError(f"server optimiser state lacks its {_NAME_KEY!r} entry")
        saved_rule = str(np.asarray(state[_NAME_KEY]))
        if saved_rule != self.config.name:
            raise CheckpointError(
                f"server optimiser state is for {saved_rule!r}, this run uses {self.config.name!r}"
            )
        expected = set(_MOMENTS[self.config.name])
        blocks: dict[str, dict[str, np.ndarray]] = {}
        for key, value in state.items():
            if key == _NAME_KEY:
                continue
            block, _, moment = key.rpartition(_SEPARATOR)
            if not block or moment not in expected:
                raise CheckpointError(
                    f"server optimiser state entry {key!r} is not a moment of {self.config.name!r}"
                )
            array = np.asarray(value)
            if array.dtype != np.float64 or not np.isfinite(array).all():
                raise CheckpointError(f"server optimiser state entry {key!r} is not finite float64")
            blocks.setdefault(block, {})[moment] = array.copy()
        for block, moments in blocks.items():
            shapes = {value.shape for value in moments.values()}
            if set(moments) != expected or len(shapes) != 1:
                raise CheckpointError(
                    f"server optimiser state of block {block!r} has moments {sorted(moments)} "
                    f"with shapes {sorted(shapes)}; {self.config.name!r} needs {sorted(expected)}"
                )
        self._state = blocks

    def _moments_for(self, name: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        moments = self._state.get(name)
        if moments is None:
            moments = {key: np.zeros(shape) for key in _MOMENTS[self.config.name]}
            self._state[name] = moments
        for value in moments.values():
            if value.shape != shape:
                raise ValueError(
                    f"block {name!r} has shape {shape}, its optimiser state {value.shape}"
                )
        return moments

    @staticmethod
    def _checked_rows(name: str, rows: np.ndarray, params: np.ndarray) -> np.ndarray:
        if params.ndim == 0:
            raise ValueError(f"rows given for block {name!r}, which is a scalar")
        index = np.asarray(rows)
        if index.ndim != 1 or (index.size and not np.issubdtype(index.dtype, np.integer)):
            raise ValueError(f"rows of block {name!r} must be a 1-D integer array")
        index = index.astype(np.intp)
        if index.size and (index.min() < 0 or index.max() >= params.shape[0]):
            raise ValueError(f"rows of block {name!r} fall outside [0, {params.shape[0]})")
        if np.unique(index).size != index.size:
            raise ValueError(f"rows of block {name!r} repeat an index")
        return index
