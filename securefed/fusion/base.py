"""The fusion shape (vertical FL): a server function of the parties' vectors, trained through them.

A few parties hold different vectors for the same users. The server applies a network to them
and hands each party its own output; training sends each party's output gradient back and
returns to each party the gradient of its own input (so it can train whatever produced that
input) while the server steps its weights with its own optimiser (DESIGN.md, "The two shapes of
communication")::

    channel.open_round(0)
    outputs = channel.forward({"a": x_a, "b": x_b})     # {"a": y_a, "b": y_b}
    input_grads = channel.backward({"a": dL_dy_a, "b": dL_dy_b})  # {"a": dL_dx_a, ...}
    channel.view                                          # a FusionView: what the server saw

:class:`FusionChannel` is the seam (forward with ``outputs``, ``positions``, ``network`` and
``train``; backward with ``recipients``; ``sync_target``). Two layouts implement it:

* ``"concatenated"`` (this module, :mod:`securefed.fusion.ckks`): a :class:`FusionSpec` MLP on
  the concatenation of the parties' ``(batch, width)`` matrices, each party's output a slice of
  its output; ``depth = len(hidden) + 1`` linear layers with the polynomial activation
  ``sum_i c_i z^i`` between them (``activation = (c_0, .., c_d)``), so that the plaintext
  channel here and the CKKS channel compute the same function and train the same way (SGD
  ``W <- W - lr * dL/dW``, ``dL/dW`` summed over the batch: put any ``1/batch`` of the loss into
  the gradients you send). The default activation is the least-squares fit of ReLU on
  ``[-4, 4]``: ``0.375 + 0.5 z + 0.1171875 z^2``. These channels take numpy arrays or torch
  tensors (detached; float64 internally) and return numpy float64 arrays.
* ``"per_party"`` (:mod:`securefed.fusion.module`): any torch module, evaluated once per output
  party on the parties' vectors ordered with that party's first, ``(members, batch, width)``
  tensors for several independent copies side by side, stepped by any torch optimiser.

Channels by name for a torch server module: :mod:`securefed.fusion.registry`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from securefed._checks import finite_array
from securefed.views import NO_PAYLOADS, FusionView, RoundSelection

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
def as_numpy(value: Any) -> np.ndarray:
    """A numpy array from an array, a torch tensor (detached, on the CPU) or a sequence."""
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def check_input_parties(parties: tuple[str, ...], inputs: Mapping[str, Any]) -> None:
    """Every party's vector and only theirs.

    Raises:
        ValueError: naming the missing and the unknown parties.
    """
    missing = set(parties) - set(inputs)
    unknown = set(inputs) - set(parties)
    if missing or unknown:
        raise ValueError(
            f"fusion needs every party's vector and only theirs: missing {sorted(missing)}, "
            f"unknown {sorted(unknown)}"
        )


def scatter_positions(values: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """``values`` ``(..., m)`` added into zeros ``(..., width)`` at ``positions`` ``(..., m)``
    (a party's gradient of the entries it asked for; repeated positions add up)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros((*values.shape[:-1], width))
    leading = np.indices(values.shape[:-1], sparse=True)
    index = (*(axis[..., None] for axis in leading), np.asarray(positions))
    np.add.at(out, index, values)
    return out


def as_matrix(name: str, value: Any) -> np.ndarray:
    """A numpy float64 matrix from an array or a torch tensor (detached)."""
    array = finite_array(name, as_numpy(value))
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


def check_spec_inquiry(spec: FusionSpec, inquiry: Inquiry):
    """A FusionSpec network's forward inputs checked: ``(matrices, batch, positions)``, one
    ``(batch, width)`` float64 matrix per party and the int64 positions of each output party."""
    matrices = check_party_matrices(spec, inquiry.inputs, kind="input")
    batch = next(iter(matrices.values())).shape[0]
    chosen = {
        p: np.asarray(v, np.int64)
        for p, v in check_positions(inquiry.positions, inquiry.outputs, (batch,)).items()
    }
    return matrices, batch, chosen


def concatenate(spec: FusionSpec, matrices: Mapping[str, np.ndarray]) -> np.ndarray:
    """The parties' matrices side by side, in spec order."""
    return np.concatenate([matrices[name] for name in spec.names], axis=1)


def split(spec: FusionSpec, matrix: np.ndarray, *, kind: str) -> dict[str, np.ndarray]:
    """Split a ``(batch, total width)`` matrix back per party (``kind`` input or output)."""
    slices = spec.input_slices() if kind == "input" else spec.output_slices()
    return {name: np.ascontiguousarray(matrix[:, cut]) for name, cut in slices.items()}


# ----------------------------------------------------------------------------- the seam
NETWORKS = ("online", "target")
"""The server's networks: the one it trains and its frozen copy (synced by ``sync_target``)."""


@runtime_checkable
class FusionChannel(Protocol):
    """The vertical shape: per-party vectors in, per-party outputs out, gradients back.

    Stages, each an exchange the channel records in its :attr:`view` (a
    :class:`~securefed.views.FusionView`, under the round opened last):

    1. :meth:`open_round`: the caller numbers its rounds (the view keeps payloads by round).
    2. :meth:`forward`: every party sends its vector; the server evaluates its function and
       returns to each party in ``outputs`` its own output, or only the entries ``positions[p]``
       of it. ``train=False`` evaluates only (nothing is kept for a backward: acting, targets);
       ``network="target"`` evaluates the frozen copy of the server's function.
    3. :meth:`backward`: the parties of the last training forward send the gradient of their
       loss with respect to what they received; the server back-propagates, steps its own
       weights with its own optimiser, and returns to each of ``recipients`` the gradient with
       respect to its input (so it can train whatever produced that input).
    4. :meth:`sync_target`: the frozen copy takes the online weights (the caller's schedule).

    Shapes: a channel takes ``(batch, width)`` matrices, or ``(members, batch, width)`` where it
    serves several independent copies side by side
    (:class:`~securefed.fusion.module.ModuleFusionChannel`); ``positions[p]`` has the leading
    shape of the input and indexes the last axis of ``p``'s output.
    """

    name: str
    view: Any

    @property
    def parties(self) -> tuple[str, ...]:
        """Party names, in the channel's order."""

    def open_round(self, round_id: int) -> None:
        """Record the following exchanges under round ``round_id`` (ids increase)."""

    def forward(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        positions: Mapping[str, Any] | None = None,
        network: str = "online",
        train: bool = True,
        tag: str = "",
    ) -> dict[str, Any]:
        """Each party in ``outputs`` (default: every party) gets its output (at ``positions``)."""

    def backward(
        self, grads: Mapping[str, Any], *, recipients: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Take ``dL/d(output)`` per party, step the server's weights, return ``dL/d(input)``."""

    def sync_target(self) -> None:
        """Copy the online weights into the target network."""


@dataclass(frozen=True)
class Inquiry:
    """A forward's arguments after the checks every channel makes (:class:`FusionChannelBase`):
    ``outputs`` named parties, ``network`` known (the target only without training), ``tag``
    without ``/``; ``inputs`` and ``positions`` as the caller gave them."""

    inputs: Mapping[str, Any]
    outputs: tuple[str, ...]
    positions: Mapping[str, Any] | None
    network: str
    train: bool
    tag: str


class FusionChannelBase:
    """What every fusion channel does the same way: the seam's signatures and the checks of
    their arguments, the party names, the rounds of the view. A channel is its mechanism and
    nothing else: it sets ``name``, ``view`` and ``_parties`` and implements
    :meth:`_forward` (on a checked :class:`Inquiry`), :meth:`_backward` and ``sync_target``.
    (:class:`~securefed.fusion.dp.DPFusionChannel` wraps a channel instead and forwards the
    same signatures to it.)"""

    name = ""
    view: Any
    _parties: tuple[str, ...]

    @property
    def parties(self) -> tuple[str, ...]:
        return self._parties

    def open_round(self, round_id: int) -> None:
        self.view.open_round(round_id)

    def forward(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        positions: Mapping[str, Any] | None = None,
        network: str = "online",
        train: bool = True,
        tag: str = "",
    ) -> dict[str, Any]:
        """Each party in ``outputs`` (default: every party) gets its output (at ``positions``):
        :class:`FusionChannel`'s stage 1 and 2; the channel's :meth:`_forward` computes it."""
        outputs = check_parties_named("outputs", self.parties, outputs)
        check_network(network, train)
        check_tag(tag)
        return self._forward(Inquiry(inputs, outputs, positions, network, train, tag))

    announces = False
    """Whether :meth:`announce` can save this channel work (a caller skips computing the
    announced inputs otherwise)."""

    def announce(self, inputs: Mapping[str, Any], *, outputs: Sequence[str]) -> None:
        """The inputs of the next training forward of the online network, sent ahead of the
        forward that comes before it: a channel may evaluate both in one go (the packed CKKS
        circuit); what each party receives is unchanged. Default: nothing (the training
        forward is evaluated when it comes)."""
        check_parties_named("outputs", self.parties, outputs)

    def backward(
        self, grads: Mapping[str, Any], *, recipients: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Take ``dL/d(output)`` per party, step the server, return ``dL/d(input)`` to
        ``recipients`` (the channel's :meth:`_backward`)."""
        return self._backward(grads, recipients)

    def _forward(self, inquiry: Inquiry) -> dict[str, Any]:
        raise NotImplementedError

    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, Any]:
        raise NotImplementedError


def check_parties_named(what: str, parties: tuple[str, ...], names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of distinct parties (``None``: every party).

    Raises:
        ValueError: an unknown or repeated party, none at all, or a bare string.
    """
    if names is None:
        return parties
    if isinstance(names, str):
        raise ValueError(f"{what} is a sequence of party names, got the string {names!r}")
    names = tuple(names)
    unknown = [n for n in names if n not in parties]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"{what} must name distinct parties of {list(parties)}, got {list(names)}")
    return names


def check_network(network: str, train: bool) -> None:
    """Refuse an unknown network, and training through the frozen target copy."""
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {NETWORKS}, got {network!r}")
    if network == "target" and train:
        raise ValueError(
            "the target network is frozen: forward(network='target') needs train=False"
        )


def check_positions(
    positions: Mapping[str, Any] | None, outputs: tuple[str, ...], leading: tuple[int, ...]
) -> dict[str, Any]:
    """Validate ``positions``: only for parties in ``outputs``, integer indices >= 0 whose
    leading axes are ``leading`` (numpy arrays or torch tensors, returned as given).

    Raises:
        ValueError: naming the party and the problem.
    """
    if not positions:
        return {}
    unknown = set(positions) - set(outputs)
    if unknown:
        raise ValueError(f"positions for parties {sorted(unknown)} that get no output")
    for party, index in positions.items():
        dtype = str(getattr(index, "dtype", ""))
        if "int" not in dtype:
            raise ValueError(f"party {party!r} positions must be integer indices, got {dtype!r}")
        shape = tuple(index.shape)
        if len(shape) != len(leading) + 1 or shape[:-1] != leading:
            raise ValueError(
                f"party {party!r} positions have shape {shape}; expected {(*leading, 'm')}"
            )
        if shape[-1] and int(index.min()) < 0:
            raise ValueError(f"party {party!r} positions must be >= 0")
    return dict(positions)


def check_tag(tag: str) -> str:
    """A protocol step's label: a string without ``/``."""
    if not isinstance(tag, str) or "/" in tag:
        raise ValueError(f"tag must be a string without '/', got {tag!r}")
    return tag


def output_gradient(
    spec: FusionSpec,
    grads: Mapping[str, Any],
    outputs: tuple[str, ...],
    positions: Mapping[str, np.ndarray],
    batch: int,
) -> np.ndarray:
    """The ``(batch, output_dim)`` gradient of the server's output from the parties' ``grads``.

    A party that received only ``positions`` sends ``(batch, m)`` (added at those entries); a
    party of ``outputs`` that sends nothing contributes zeros.

    Raises:
        ValueError: a gradient of a party that got no output, a wrong width or row count.
    """
    unknown = set(grads) - set(outputs)
    if unknown:
        raise ValueError(
            f"output gradients of parties {sorted(unknown)} that received no output in the "
            "last forward"
        )
    full = np.zeros((batch, spec.output_dim))
    slices = spec.output_slices()
    for party in spec.parties:
        if party.name not in grads:
            continue
        g = as_matrix(f"party {party.name!r} output gradient", grads[party.name])
        chosen = positions.get(party.name)
        width = party.output_dim if chosen is None else chosen.shape[1]
        if g.shape[0] != batch:
            raise ValueError(
                f"party {party.name!r} output gradient has {g.shape[0]} rows, expected {batch} "
                "(every party sends the same users, in the same order)"
            )
        if g.shape[1] != width:
            raise ValueError(
                f"party {party.name!r} output gradient has width {g.shape[1]}, expected {width}"
            )
        if chosen is None:
            full[:, slices[party.name]] = g
        else:
            full[:, slices[party.name]] = scatter_positions(g, chosen, party.output_dim)
    return full


def pick(values: np.ndarray, positions: np.ndarray | None) -> np.ndarray:
    """``values`` at ``positions`` along the last axis (all of it for ``None``).

    Raises:
        ValueError: a position beyond the output's width.
    """
    if positions is None:
        return values
    if positions.shape[-1] and int(positions.max()) >= values.shape[-1]:
        raise ValueError(
            f"positions up to {int(positions.max())} for an output of width {values.shape[-1]}"
        )
    return np.take_along_axis(values, np.asarray(positions), axis=-1)


def record_forward(
    view,
    inputs: Mapping[str, Any],
    result: Mapping[str, Any],
    chosen: Mapping[str, Any],
    *,
    network: str,
    tag: str,
    train: bool,
) -> None:
    """Record a forward exchange in ``view`` (a :class:`~securefed.views.FusionView`).

    What each party sent (its input, and the positions it asked for) and got back (its output),
    as bytes on the wire; the arrays themselves only in rounds whose payloads the view keeps.
    Arrays may be numpy arrays or torch tensors.
    """
    payloads = None
    if view.keeps_current:
        payloads = {p: {"input": numpy_view(v)} for p, v in inputs.items()}
        for p, value in result.items():
            payloads[p]["output"] = numpy_view(value)
            if p in chosen:
                payloads[p]["positions"] = numpy_view(chosen[p])
    view.record(
        "forward",
        network=network,
        tag=tag,
        train=train,
        outputs=list(result),
        bytes_up=merge_bytes(array_bytes(inputs), array_bytes(chosen)),
        bytes_down=array_bytes(result),
        payloads=payloads,
    )


def record_backward(
    view, received: Mapping[str, Any], result: Mapping[str, Any], *, tag: str
) -> None:
    """Record a backward exchange: the output gradients the parties sent, the input gradients
    the server returned (arrays only in rounds whose payloads the view keeps)."""
    payloads = None
    if view.keeps_current:
        payloads = {p: {"output_grad": numpy_view(g)} for p, g in received.items()}
        for q, value in result.items():
            payloads.setdefault(q, {})["input_grad"] = numpy_view(value)
    view.record(
        "backward",
        network="online",
        tag=tag,
        train=True,
        outputs=list(result),
        bytes_up=array_bytes(received),
        bytes_down=array_bytes(result),
        payloads=payloads,
    )


def numpy_view(value) -> np.ndarray | None:
    """A numpy copy-free view of an array or a (detached) tensor; ``None`` stays ``None``."""
    if value is None or isinstance(value, np.ndarray):
        return value
    return value.detach().numpy()


def array_bytes(values: Mapping[str, Any]) -> dict[str, int]:
    """Bytes on the wire of each party's array or tensor (its dtype's width times its size)."""
    out = {}
    for party, value in values.items():
        if hasattr(value, "element_size"):
            out[party] = int(value.element_size() * value.nelement())
        else:
            out[party] = int(np.asarray(value).nbytes)
    return out


def merge_bytes(*parts: Mapping[str, int]) -> dict[str, int]:
    """Per-party sums of several byte counts."""
    total: dict[str, int] = {}
    for part in parts:
        for party, nbytes in part.items():
            total[party] = total.get(party, 0) + int(nbytes)
    return total


# ----------------------------------------------------------------------------- plaintext
class PlaintextFusionChannel(FusionChannelBase):
    """The fused MLP in torch (float64), in the clear: the reference the CKKS channel must match.

    One network on the parties' concatenated vectors, each party's output a slice of its
    output (``view.public["layout"] == "concatenated"``); ``(batch, width)`` matrices, one
    member. The target network is a frozen copy of the weights.

    Args:
        spec: the network.
        weights: initial weights (copied).
        lr: SGD step size of the server's weights.
        keep_payloads: which rounds of the view keep full payloads.
        total_rounds: the run's length (for ``keep_payloads``' ``last:K``).
    """

    name = "plaintext"

    def __init__(
        self,
        spec: FusionSpec,
        weights: FusionWeights,
        *,
        lr: float = 0.01,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
    ) -> None:
        import torch

        if not np.isfinite(lr) or lr <= 0:
            raise ValueError(f"lr must be finite and > 0, got {lr!r}")
        self._torch = torch
        self.spec = spec
        self._parties = spec.names
        self.lr = float(lr)
        checked = weights.check(spec)
        self._params = [
            (
                torch.tensor(w, dtype=torch.float64, requires_grad=True),
                torch.tensor(b, dtype=torch.float64, requires_grad=True),
            )
            for w, b in checked.layers
        ]
        self._target = [(w.detach().clone(), b.detach().clone()) for w, b in self._params]
        self._pending = None
        self.view = FusionView(
            self.name,
            spec.names,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            public=spec_public(spec) | {"optimiser": "sgd", "lr": self.lr},
        )

    @property
    def weights(self) -> FusionWeights:
        return FusionWeights(
            [(w.detach().numpy().copy(), b.detach().numpy().copy()) for w, b in self._params]
        )

    def sync_target(self) -> None:
        self._target = [(w.detach().clone(), b.detach().clone()) for w, b in self._params]

    def _network(self, x, params):
        h = x
        for index, (weight, bias) in enumerate(params):
            h = h @ weight + bias
            if index < len(params) - 1:
                out = self._torch.full_like(h, self.spec.activation[-1])
                for c in reversed(self.spec.activation[:-1]):
                    out = out * h + c
                h = out
        return h

    def _forward(self, inquiry: Inquiry) -> dict[str, np.ndarray]:
        outputs, network, train, tag = inquiry.outputs, inquiry.network, inquiry.train, inquiry.tag
        matrices, _, chosen = check_spec_inquiry(self.spec, inquiry)
        params = self._params if network == "online" else self._target
        if train:
            x = self._torch.tensor(concatenate(self.spec, matrices), requires_grad=True)
            y = self._network(x, params)
            self._pending = (x, y, outputs, chosen, tag)
            values = y.detach().numpy()
        else:
            with self._torch.no_grad():
                x = self._torch.tensor(concatenate(self.spec, matrices))
                values = self._network(x, params).numpy()
        full = split(self.spec, values, kind="output")
        result = {p: pick(full[p], chosen.get(p)) for p in outputs}
        record_forward(self.view, matrices, result, chosen, network=network, tag=tag, train=train)
        return result

    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        if self._pending is None:
            raise RuntimeError("backward() needs a forward() first (once per forward)")
        recipients = check_parties_named("recipients", self.spec.names, recipients)
        x, y, outputs, chosen, tag = self._pending
        g = output_gradient(self.spec, grads, outputs, chosen, batch=y.shape[0])
        y.backward(self._torch.tensor(g))
        with self._torch.no_grad():
            for weight, bias in self._params:
                weight -= self.lr * weight.grad
                bias -= self.lr * bias.grad
                weight.grad = None
                bias.grad = None
        dx = split(self.spec, x.grad.numpy().copy(), kind="input")
        self._pending = None
        result = {q: dx[q] for q in recipients}
        received = {p: as_matrix(f"party {p!r} output gradient", v) for p, v in grads.items()}
        record_backward(self.view, received, result, tag=tag)
        return result


def spec_public(spec: FusionSpec) -> dict[str, object]:
    """The public description of a FusionSpec network, as its channels' views record it."""
    return {
        "layout": "concatenated",
        "members": 1,
        "layer_sizes": list(spec.layer_sizes),
        "activation": list(spec.activation),
        "input_dims": {p.name: p.input_dim for p in spec.parties},
        "output_dims": {p.name: p.output_dim for p in spec.parties},
    }
