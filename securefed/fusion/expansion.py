"""A per-position MLP with a polynomial activation, as the polynomial it is (pure math).

A network ``f`` of ``K`` inputs and one output, ``depth`` linear layers with the activation
``a(z) = sum_j c_j z^j`` (degree ``d``) between them, is a polynomial of total degree
``D = d^(depth - 1)`` in its inputs: ``f(x) = sum_m C_m(theta) x^m`` over the monomials ``x^m``
(exponent vectors ``m`` with ``|m| <= D``). The coefficients ``C_m`` are polynomials in the
weights ``theta``; :func:`expand` computes them in torch, differentiably, so that

* the network's value at ``x`` is ``sum_m C_m x^m`` (the same function, term by term: what a
  CKKS evaluation computes on ciphertexts of ``x``), and
* its weight gradient for output gradients ``g_b`` is ``sum_m dC_m/dtheta * S_m`` with the batch
  sums ``S_m = sum_b g_b x_b^m``: the only values the server needs in the clear to train it
  (``surrogate = sum_m C_m(theta) S_m``; ``surrogate.backward()`` gives exactly the gradient that
  back-propagation through the network would).

``members`` independent networks side by side (weights ``(S, in, out)``, biases
``(S, 1, out)``) give coefficients ``(S, M)``. Importing this module imports torch only when
:func:`expand` runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = [
    "PolynomialNetwork",
    "derivative",
    "evaluate_numpy",
    "expand",
    "monomial_level",
    "monomials",
    "network_degree",
    "split_monomial",
]


@dataclass(frozen=True, eq=False)
class PolynomialNetwork:
    """What a server module exposes to be evaluated as a polynomial.

    Attributes:
        layers: per linear layer ``(W, b)``: torch tensors ``(S, in, out)`` and ``(S, 1, out)``
            (the module's own parameters, so that gradients reach its optimiser); the first
            layer's ``in`` is the number of inputs ``K``, the last layer's ``out`` is 1.
        activation: the hidden activation's coefficients ``(c_0, .., c_d)``, lowest first.
    """

    layers: Sequence[tuple[Any, Any]]
    activation: tuple[float, ...]

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not layers:
            raise ValueError("a polynomial network needs at least one linear layer")
        activation = tuple(float(c) for c in self.activation)
        if len(activation) < 2 or activation[-1] == 0 or not all(map(math.isfinite, activation)):
            raise ValueError(
                f"activation must be finite coefficients (c_0, .., c_d), d >= 1, c_d != 0; got "
                f"{list(self.activation)}"
            )
        for index, (weight, bias) in enumerate(layers):
            if weight.dim() != 3 or bias.dim() != 3 or bias.shape[1] != 1:
                raise ValueError(
                    f"layer {index}: weight must be (S, in, out) and bias (S, 1, out), got "
                    f"{tuple(weight.shape)} and {tuple(bias.shape)}"
                )
            if index and weight.shape[1] != layers[index - 1][0].shape[2]:
                raise ValueError(f"layer {index} takes {weight.shape[1]} inputs, the layer "
                                 f"before gives {layers[index - 1][0].shape[2]}")  # fmt: skip
        if layers[-1][0].shape[2] != 1:
            raise ValueError(f"the network has {layers[-1][0].shape[2]} outputs; it must have 1")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "activation", activation)

    @property
    def inputs(self) -> int:
        return int(self.layers[0][0].shape[1])

    @property
    def members(self) -> int:
        return int(self.layers[0][0].shape[0])

    @property
    def depth(self) -> int:
        return len(self.layers)

    @property
    def degree(self) -> int:
        """Total degree ``D`` of the network's polynomial."""
        return network_degree(self.depth, len(self.activation) - 1)


def network_degree(depth: int, activation_degree: int) -> int:
    """``D = d^(depth - 1)``: the total degree of an MLP with a degree-``d`` activation."""
    if depth < 1 or activation_degree < 1:
        raise ValueError(f"depth and degree must be >= 1, got {depth}, {activation_degree}")
    return activation_degree ** (depth - 1)


@lru_cache(maxsize=64)
def monomials(inputs: int, degree: int) -> tuple[tuple[int, ...], ...]:
    """Exponent vectors of the monomials of ``inputs`` variables up to total ``degree``, by
    degree (the constant first, then ``x_0 .. x_{K-1}``, then degree 2, ...)."""
    if inputs < 1 or degree < 0:
        raise ValueError(f"need inputs >= 1 and degree >= 0, got {inputs}, {degree}")
    out = []
    for total in range(degree + 1):
        for combo in itertools.combinations_with_replacement(range(inputs), total):
            exponent = [0] * inputs
            for variable in combo:
                exponent[variable] += 1
            out.append(tuple(exponent))
    return tuple(out)


def split_monomial(exponent: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``x^m = x^a x^b`` with ``|a| = ceil(|m| / 2)``, ``|b| = floor(|m| / 2)`` (``|m| >= 2``):
    binary powering, so ``x^m`` sits :func:`monomial_level` levels below fresh inputs."""
    total = sum(exponent)
    if total < 2:
        raise ValueError(f"only monomials of degree >= 2 are split, got {exponent}")
    variables = [v for v, power in enumerate(exponent) for _ in range(power)]
    first = [0] * len(exponent)
    for v in variables[: (total + 1) // 2]:
        first[v] += 1
    second = tuple(p - q for p, q in zip(exponent, first, strict=True))
    return tuple(first), second


def monomial_level(total_degree: int) -> int:
    """Multiplicative levels of a monomial of ``total_degree`` (0 for degree <= 1)."""
    return 0 if total_degree <= 1 else math.ceil(math.log2(total_degree))


@lru_cache(maxsize=64)
def _product_table(inputs: int, degree: int) -> np.ndarray:
    """``T[i, j, k] = 1`` where monomial i times monomial j is monomial k (degree <= D)."""
    basis = monomials(inputs, degree)
    index = {m: k for k, m in enumerate(basis)}
    table = np.zeros((len(basis),) * 3)
    for i, a in enumerate(basis):
        for j, b in enumerate(basis):
            product = tuple(p + q for p, q in zip(a, b, strict=True))
            if product in index:
                table[i, j, index[product]] = 1.0
    return table


def expand(network: PolynomialNetwork, *, zero_inputs: Sequence[int] = ()):
    """The coefficients ``C`` ``(S, M)`` (float64 torch, differentiable in the weights) of the
    network's polynomial over :func:`monomials` ``(K, D)``.

    Args:
        network: the layers and the activation.
        zero_inputs: inputs fixed at 0 (their monomials get coefficient 0): the network on
            ``x`` with those entries replaced by zeros.
    """
    import torch

    inputs, degree = network.inputs, network.degree
    basis = monomials(inputs, degree)
    table = torch.from_numpy(_product_table(inputs, degree))
    size = len(basis)
    # The inputs as polynomials: x_i is the monomial e_i (row i + 1 of the basis).
    current = torch.zeros(network.members, inputs, size, dtype=torch.float64)
    for variable in range(inputs):
        if variable not in zero_inputs:
            current[:, variable, 1 + variable] = 1.0
    constant = torch.zeros(size, dtype=torch.float64)
    constant[0] = 1.0
    last = network.depth - 1
    for index, (weight, bias) in enumerate(network.layers):
        weight, bias = weight.double(), bias.double()
        # unit u = sum_h W[h, u] poly_h + b_u
        current = torch.einsum("shm,shu->sum", current, weight) + bias[:, 0, :, None] * constant
        if index < last:
            power = current
            activated = network.activation[0] * constant + network.activation[1] * current
            for c in network.activation[2:]:
                # Two operands at a time: a three-operand einsum sends torch to opt_einsum's
                # path search on every call (milliseconds for these few coefficients).
                outer = power[..., :, None] * current[..., None, :]
                power = torch.einsum("suij,ijk->suk", outer, table)
                activated = activated + c * power
            current = activated
    return current[:, 0, :]


def derivative(inputs: int, degree: int, variable: int) -> tuple[np.ndarray, np.ndarray]:
    """``d/dx_variable`` on the basis: ``(source, factor)`` with ``d x^m / dx_v = factor[m] *
    x^(basis[source[m]])`` for the monomials of degree ``<= D - 1`` (index ``m`` of that smaller
    basis): the derivative's coefficient on ``x^m`` is ``C[source[m]] * factor[m]``."""
    basis = monomials(inputs, degree)
    index = {m: k for k, m in enumerate(basis)}
    smaller = monomials(inputs, max(degree - 1, 0))
    source = np.zeros(len(smaller), np.int64)
    factor = np.zeros(len(smaller))
    for k, m in enumerate(smaller):
        raised = list(m)
        raised[variable] += 1
        source[k] = index[tuple(raised)]
        factor[k] = raised[variable]
    return source, factor


def evaluate_numpy(coefficients: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``sum_m C[s, m] x^m`` for ``x`` ``(S, n, K)`` and ``C`` ``(S, M)`` (reference)."""
    inputs = x.shape[-1]
    degree = 0
    while len(monomials(inputs, degree)) < coefficients.shape[-1]:
        degree += 1
    basis = monomials(inputs, degree)
    if len(basis) != coefficients.shape[-1]:
        raise ValueError(f"{coefficients.shape[-1]} coefficients fit no basis of {inputs} inputs")
    powers = np.stack([np.prod(x ** np.array(m), axis=-1) for m in basis], axis=-1)
    return np.einsum("snm,sm->sn", powers, coefficients)
