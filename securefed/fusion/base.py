"""The fusion shape (vertical FL): a server network on the concatenation of the parties' vectors.

A few parties (FedSlate's platforms) hold different vectors for the same users. The server applies
an MLP to their concatenation and hands each party its own slice of the output; training sends each
party's output gradient back and returns to each party the gradient of its own input (so it can
train whatever produced that input) while the server steps its weights (DESIGN.md, "The two shapes
of communication")::

    outputs = channel.forward({"a": x_a, "b": x_b})     # {"a": y_a, "b": y_b}
    input_grads = channel.backward({"a": dL_dy_a, "b": dL_dy_b})  # {"a": dL_dx_a, ...}

The network: ``depth = len(hidden) + 1`` linear layers with the polynomial activation
``sum_i c_i z^i`` between them (``activation = (c_0, .., c_d)``), so that the plaintext channel
here and the CKKS channel (:mod:`securefed.fusion.ckks`) compute the same function and train the
same way. The default activation is the least-squares fit of ReLU on ``[-4, 4]``:
``0.375 + 0.5 z + 0.1171875 z^2``.

Channels take numpy arrays or torch tensors (detached; float64 internally) and always return numpy
float64 arrays. ``backward`` applies one SGD step ``W <- W - lr * dL/dW`` to the server's weights,
with ``dL/dW`` summed over the batch (put any ``1/batch`` of the loss into the gradients you send).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from securefed._checks import finite_array

RELU_FIT = (0.375, 0.5, 0.1171875)
"""Least-squares degree-2 fit of ReLU on [-4, 4] (3/8 + z/2 + 15 z^2 / 128)."""


# ----------------------------------------------------------------------------- the network's shape
@dataclass(frozen=True)
class Party:
    """One party of a fusion channel: its name, input width and output width."""

    name: str
    input_dim: int
    output_dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a party name is a non-empty string, got {self.name!r}")
        for field_name in ("input_dim", "output_dim"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"party {self.name!r}: {field_name} must be >= 1, got {value!r}")


@dataclass(frozen=True)
class FusionSpec:
    """The fused network: parties (in concatenation order), hidden widths, activation.

    Attributes:
        parties: the parties, in the order their inputs are concatenated and outputs split.
        hidden: widths of the hidden layers (``()`` is a single linear layer).
        activation: polynomial coefficients ``(c_0, .., c_d)``, lowest degree first, ``c_d != 0``.
    """

    parties: tuple[Party, ...]
    hidden: tuple[int, ...] = (16,)
    activation: tuple[float, ...] = RELU_FIT

    def __post_init__(self) -> None:
        parties = tuple(self.parties)
        if not parties or not all(isinstance(p, Party) for p in parties):
            raise ValueError("a fusion spec needs at least one Party")
        names = [p.name for p in parties]
        if len(set(names)) != len(names):
            raise ValueError(f"party names must be distinct, got {names}")
        hidden = tuple(int(h) for h in self.hidden)
        if any(h < 1 for h in hidden):
            raise ValueError(f"hidden widths must be >= 1, got {list(self.hidden)}")
        activation = tuple(float(c) for c in self.activation)
        if len(activation) < 2 or not np.all(np.isfinite(activation)) or activation[-1] == 0:
            raise ValueError(
                "activation must be finite polynomial coefficients (c_0, .., c_d) with d >= 1 "
                f"and c_d != 0, got {list(self.activation)}"
            )
        object.__setattr__(self, "parties", parties)
        object.__setattr__(self, "hidden", hidden)
        object.__setattr__(self, "activation", activation)

    @classmethod
    def of(
        cls,
        inputs: Mapping[str, int],
        outputs: Mapping[str, int],
        *,
        hidden: tuple[int, ...] = (16,),
        activation: tuple[float, ...] = RELU_FIT,
    ) -> FusionSpec:
        """Build from ``{party: input width}`` and ``{party: output width}`` (same parties)."""
        if set(inputs) != set(outputs):
            raise ValueError(
                f"inputs and outputs must name the same parties: {sorted(inputs)} vs "
                f"{sorted(outputs)}"
            )
        parties = tuple(Party(name, inputs[name], outputs[name]) for name in inputs)
        return cls(parties, hidden, activation)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parties)

    @property
    def input_dim(self) -> int:
        return sum(p.input_dim for p in self.parties)

    @property
    def output_dim(self) -> int:
        return sum(p.output_dim for p in self.parties)

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return (self.input_dim, *self.hidden, self.output_dim)

    @property
    def depth(self) -> int:
        """Number of linear layers."""
        return len(self.hidden) + 1

    @property
    def degree(self) -> int:
        return len(self.activation) - 1

    def circuit(self, *, training: bool = True):
        """The CKKS :class:`~securefed.crypto.ckks.FusionCircuit` this network needs."""
        from securefed.crypto.ckks import FusionCircuit  # local: tenseal is an optional extra

        return FusionCircuit(self.depth, self.degree, training)

    def input_slices(self) -> dict[str, slice]:
        return _slices([(p.name, p.input_dim) for p in self.parties])

    def output_slices(self) -> dict[str, slice]:
        return _slices([(p.name, p.output_dim) for p in self.parties])


def _slices(widths: list[tuple[str, int]]) -> dict[str, slice]:
    out, start = {}, 0
    for name, width in widths:
        out[name] = slice(start, start + width)
        start += width
    return out


# ----------------------------------------------------------------------------- weights
@dataclass(eq=False)
class FusionWeights:
    """The server network's parameters: per layer ``W`` ``(in, out)`` and ``b`` ``(out,)``."""

    layers: list[tuple[np.ndarray, np.ndarray]]

    def check(self, spec: FusionSpec) -> FusionWeights:
        """Validate against ``spec`` and return float64 copies.

        Raises:
            ValueError: a wrong number of layers, a wrong shape, or a non-finite entry.
        """
        sizes = spec.layer_sizes
        if len(self.layers) != len(sizes) - 1:
            raise ValueError(
                f"the spec has {len(sizes) - 1} layers, the weights {len(self.layers)}"
            )
        layers = []
        for index, (weight, bias) in enumerate(self.layers):
            weight = finite_array(f"layer {index} weight", weight)
            bias = finite_array(f"layer {index} bias", bias)
            expected = (sizes[index], sizes[index + 1])
            if weight.shape != expected or bias.shape != (expected[1],):
                raise ValueError(
                    f"layer {index} has weight {weight.shape} and bias {bias.shape}; the spec "
                    f"needs {expected} and ({expected[1]},)"
                )
            layers.append((weight.copy(), bias.copy()))
        return FusionWeights(layers)

    def copy(self) -> FusionWeights:
        return FusionWeights([(w.copy(), b.copy()) for w, b in self.layers])

    def max_abs_difference(self, other: FusionWeights) -> float:
        return max(
            float(max(np.abs(w - v).max(), np.abs(b - c).max()))
            for (w, b), (v, c) in zip(self.layers, other.layers, strict=True)
        )


def init_weights(spec: FusionSpec, rng: np.random.Generator) -> FusionWeights:
    """``U(-1/sqrt(in), 1/sqrt(in))`` weights and biases per layer (torch.nn.Linear's default)."""
    sizes = spec.layer_sizes
    layers = []
    for n_in, n_out in itertools.pairwise(sizes):
        bound = 1.0 / np.sqrt(n_in)
        layers.append(
            (rng.uniform(-bound, bound, (n_in, n_out)), rng.uniform(-bound, bound, n_out))
        )
    return FusionWeights(layers)


def polynomial(coefficients: tuple[float, ...], z: np.ndarray) -> np.ndarray:
    """``sum_i c_i z^i`` by Horner's rule."""
    out = np.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = out * z + c
    return out


def forward_numpy(spec: FusionSpec, weights: FusionWeights, x: np.ndarray) -> np.ndarray:
    """The network on a ``(batch, input_dim)`` matrix in plain numpy (reference)."""
    h = x
    for index, (weight, bias) in enumerate(weights.layers):
        h = h @ weight + bias
        if index < len(weights.layers) - 1:
            h = polynomial(spec.activation, h)
    return h


# ----------------------------------------------------------------------------- validation
def as_matrix(name: str, value: Any) -> np.ndarray:
    """A numpy float64 matrix from an array or a torch tensor (detached)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    array = finite_array(name, value)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a (batch, width) matrix, got shape {array.shape}")
    return array


def check_party_matrices(
    spec: FusionSpec, values: Mapping[str, Any], *, kind: str, batch: int | None = None
) -> dict[str, np.ndarray]:
    """Validate one matrix per party (``kind`` ``"input"`` or ``"output"`` widths).

    Raises:
        ValueError: a missing or unknown party, a wrong width, or batches that differ.
    """
    if set(values) != set(spec.names):
        raise ValueError(
            f"expected a {kind} for each party {sorted(spec.names)}, got {sorted(values)}"
        )
    out = {}
    for party in spec.parties:
        width = party.input_dim if kind == "input" else party.output_dim
        matrix = as_matrix(f"party {party.name!r} {kind}", values[party.name])
        if matrix.shape[1] != width:
            raise ValueError(
                f"party {party.name!r} {kind} has width {matrix.shape[1]}, the spec says {width}"
            )
        if batch is None:
            batch = matrix.shape[0]
        if matrix.shape[0] != batch or batch < 1:
            raise ValueError(
                f"party {party.name!r} {kind} has {matrix.shape[0]} rows, expected {batch} "
                "(every party sends the same users, in the same order)"
            )
        out[party.name] = matrix
    return out


def concatenate(spec: FusionSpec, matrices: Mapping[str, np.ndarray]) -> np.ndarray:
    """The parties' matrices side by side, in spec order."""
    return np.concatenate([matrices[name] for name in spec.names], axis=1)


def split(spec: FusionSpec, matrix: np.ndarray, *, kind: str) -> dict[str, np.ndarray]:
    """Split a ``(batch, total width)`` matrix back per party (``kind`` input or output)."""
    slices = spec.input_slices() if kind == "input" else spec.output_slices()
    return {name: np.ascontiguousarray(matrix[:, cut]) for name, cut in slices.items()}


# ----------------------------------------------------------------------------- the seam
@runtime_checkable
class FusionChannel(Protocol):
    """The vertical shape: per-party inputs in, per-party outputs out, gradients back."""

    spec: FusionSpec

    def forward(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Each party's slice of the fused network's output on the concatenated inputs."""

    def backward(self, grads: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Take ``dL/d(output)`` per party, step the server's weights, return ``dL/d(input)``."""


# ----------------------------------------------------------------------------- plaintext
class PlaintextFusionChannel:
    """The fused MLP in torch (float64), in the clear: the reference the CKKS channel must match.

    Args:
        spec: the network.
        weights: initial weights (copied).
        lr: SGD step size of the server's weights.
    """

    def __init__(self, spec: FusionSpec, weights: FusionWeights, *, lr: float = 0.01) -> None:
        import torch

        if not np.isfinite(lr) or lr <= 0:
            raise ValueError(f"lr must be finite and > 0, got {lr!r}")
        self._torch = torch
        self.spec = spec
        self.lr = float(lr)
        checked = weights.check(spec)
        self._params = [
            (
                torch.tensor(w, dtype=torch.float64, requires_grad=True),
                torch.tensor(b, dtype=torch.float64, requires_grad=True),
            )
            for w, b in checked.layers
        ]
        self._inputs = None
        self._outputs = None

    @property
    def weights(self) -> FusionWeights:
        return FusionWeights(
            [(w.detach().numpy().copy(), b.detach().numpy().copy()) for w, b in self._params]
        )

    def _network(self, x):
        h = x
        for index, (weight, bias) in enumerate(self._params):
            h = h @ weight + bias
            if index < len(self._params) - 1:
                out = self._torch.full_like(h, self.spec.activation[-1])
                for c in reversed(self.spec.activation[:-1]):
                    out = out * h + c
                h = out
        return h

    def forward(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        matrices = check_party_matrices(self.spec, inputs, kind="input")
        x = self._torch.tensor(concatenate(self.spec, matrices), requires_grad=True)
        y = self._network(x)
        self._inputs, self._outputs = x, y
        return split(self.spec, y.detach().numpy(), kind="output")

    def backward(self, grads: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if self._outputs is None:
            raise RuntimeError("backward() needs a forward() first (once per forward)")
        batch = self._outputs.shape[0]
        matrices = check_party_matrices(self.spec, grads, kind="output", batch=batch)
        g = self._torch.tensor(concatenate(self.spec, matrices))
        self._outputs.backward(g)
        with self._torch.no_grad():
            for weight, bias in self._params:
                weight -= self.lr * weight.grad
                bias -= self.lr * bias.grad
                weight.grad = None
                bias.grad = None
        dx = self._inputs.grad.numpy().copy()
        self._inputs = self._outputs = None
        return split(self.spec, dx, kind="input")
