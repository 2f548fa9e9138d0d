"""A plaintext fusion channel around any torch server module (the ``"per_party"`` layout).

The server holds a torch module ``S``, its optimiser and, optionally, a frozen copy ``S'`` (the
target network). For each party ``p`` that asks, it evaluates ``S`` on the parties' vectors
ordered with ``p``'s first, ``y_p = S([x_p, x_others in party order], positions_p)``: one shared
network in which each party's own vector takes the first slot. Vectors are
``(members, batch, width)`` tensors: ``members`` independent copies of the deployment side by
side (an ensemble whose module keeps one set of weights per member).

The module's contract (duck-typed, nothing to subclass):

* ``module(ordered, positions)``: ``ordered`` a list of one ``(members, batch, width)`` tensor per
  party; ``positions`` ``None`` or a ``(members, batch, m)`` long tensor of the output entries to
  evaluate; returns ``(members, batch, width_out)`` (or ``(members, batch, m)``);
* optionally ``module.numpy_forward(ordered)``: the same function on numpy arrays, all entries,
  without autograd. The channel uses it for evaluation-only forwards of numpy inputs (its result
  is the module's responsibility: it must compute the same function).

What the server sees, recorded in :attr:`ModuleFusionChannel.view` (a
:class:`~securefed.views.FusionView`): every party's vector in each forward (``"input"``), the
positions a party asked for, the outputs it sent back, the output gradients it received and the
input gradients it returned, each with its bytes. In the clear: this channel hides nothing from
the server (``cross=False`` only stops it from mixing the parties' vectors).

torch is imported when a channel is built, not with this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from securefed.fusion.base import (
    FusionChannelBase,
    Inquiry,
    check_input_parties,
    check_parties_named,
    check_positions,
    numpy_view,
    pick,
    record_backward,
    record_forward,
)
from securefed.views import NO_PAYLOADS, FusionView, RoundSelection, check_party_names

__all__ = ["ModuleFusionChannel", "TorchServerChannel"]


class TorchServerChannel(FusionChannelBase):
    """What every fusion channel around a torch server module shares: the module, optimiser
    and target copy, their public description in the view, ``sync_target`` (the seam's
    signatures and checks: :class:`~securefed.fusion.base.FusionChannelBase`). Subclasses set
    ``name`` and ``view``."""

    view: FusionView

    def _adopt(
        self,
        parties: Sequence[str],
        module: Any,
        optimiser: Any,
        target: Any,
        members: int,
        cross: bool,
    ) -> tuple[str, ...]:
        """Check and keep the server's parts; the target gets the module's weights, frozen.

        Raises:
            ValueError: bad party names, ``members < 1``, or the target being the module itself.
        """
        names = check_party_names(parties)
        if isinstance(members, bool) or int(members) != members or members < 1:
            raise ValueError(f"members must be an integer >= 1, got {members!r}")
        if target is module:
            raise ValueError("the target network must be a separate module (a frozen copy)")
        if target is not None:
            target.load_state_dict(module.state_dict())
            target.requires_grad_(False)
        self._parties = names
        self.module, self.optimiser, self.target = module, optimiser, target
        self.members, self.cross = int(members), bool(cross)
        return names

    def _module_public(self) -> dict[str, object]:
        """The view's public description of the server module (layout, members, optimiser)."""
        return {
            "layout": "per_party",
            "members": self.members,
            "cross": self.cross,
            "module": type(self.module).__name__,
            "parameters": int(sum(p.numel() for p in self.module.parameters())),
            "optimiser": type(self.optimiser).__name__.lower(),
            "target_network": self.target is not None,
        }

    def sync_target(self) -> None:
        """Copy the online weights into the target network.

        Raises:
            RuntimeError: if the channel was built without a target network.
        """
        if self.target is None:
            raise RuntimeError("this channel has no target network (built with target=None)")
        self.target.load_state_dict(self.module.state_dict())


class ModuleFusionChannel(TorchServerChannel):
    """Plaintext fusion through a torch module, with its optimiser and a target copy.

    Args:
        parties: party names; the others' vectors follow the output party's in this order.
        module: the server's function (module docstring for its contract).
        optimiser: steps ``module``'s parameters after each backward (the server's own).
        target: a module of the same architecture for the frozen copy (its weights are
            overwritten with ``module``'s and its gradients disabled); ``None``: no target network.
        members: the leading axis of every vector (independent copies side by side).
        cross: ``False`` replaces the other parties' vectors by zeros in each party's evaluation
            (nothing crosses parties at the server; they are still received).
        keep_payloads: which rounds of the view keep full payloads.
        total_rounds: the run's length (for ``keep_payloads``' ``last:K``).
        public: extra public parameters for the view (JSON-serialisable).

    Raises:
        ValueError: bad party names, ``members < 1``, or the target being the module itself.
    """

    name = "plaintext"

    def __init__(
        self,
        parties: Sequence[str],
        module: Any,
        optimiser: Any,
        *,
        target: Any = None,
        members: int = 1,
        cross: bool = True,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        public: Mapping[str, object] | None = None,
    ) -> None:
        import torch

        self._torch = torch
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(optimiser, torch.optim.Optimizer):
            raise TypeError(
                f"optimiser must be a torch.optim.Optimizer, got {type(optimiser).__name__}"
            )
        names = self._adopt(parties, module, optimiser, target, members, cross)
        self._numpy = getattr(module, "numpy_forward", None)
        self._pending: tuple | None = None
        self.view = FusionView(
            self.name,
            names,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            public=self._module_public() | dict(public or {}),
        )

    # ------------------------------------------------------------------ validation
    def _check_inputs(self, inputs: Mapping[str, Any]) -> tuple[int, int]:
        """Every party's ``(members, batch, width)`` vector, finite; returns the leading shape."""
        check_input_parties(self._parties, inputs)
        leading = None
        for party in self._parties:
            value = inputs[party]
            if not isinstance(value, (np.ndarray, self._torch.Tensor)):
                raise TypeError(
                    f"party {party!r} input must be a numpy array or a torch tensor, got "
                    f"{type(value).__name__}"
                )
            shape = tuple(value.shape)
            if len(shape) != 3 or shape[0] != self.members:
                raise ValueError(
                    f"party {party!r} input has shape {shape}; expected ({self.members}, "
                    "batch, width)"
                )
            if leading is None:
                leading = shape[:2]
            elif shape[:2] != leading:
                raise ValueError(
                    f"party {party!r} input has leading shape {shape[:2]}, expected {leading} "
                    "(every party sends the same users, in the same order)"
                )
            finite = (
                np.isfinite(value).all()
                if isinstance(value, np.ndarray)
                else bool(self._torch.isfinite(value.detach()).all())
            )
            if not finite:
                raise ValueError(f"party {party!r} input contains NaN or infinity")
        return leading  # type: ignore[return-value]

    def _ordered(self, inputs: Mapping[str, Any], party: str, zeros) -> list:
        """The vectors as ``party``'s evaluation sees them: its own first, then the others."""
        others = [
            inputs[q] if self.cross else zeros(inputs[q]) for q in self._parties if q != party
        ]
        return [inputs[party], *others]

    # ------------------------------------------------------------------ the exchanges
    def _forward(self, inquiry: Inquiry) -> dict[str, Any]:
        """Each party in ``outputs`` gets ``S`` evaluated with its vector first.

        The inquiry's fields (:meth:`~securefed.fusion.base.FusionChannelBase.forward`):
            inputs: every party's ``(members, batch, width)`` array or tensor.
            outputs: who gets an output (default: every party).
            positions: per output party, ``(members, batch, m)`` indices of the output entries
                to evaluate (default: all).
            network: ``"online"`` or ``"target"`` (the frozen copy; evaluation only).
            train: keep what :meth:`backward` needs (the inputs become autograd leaves);
                ``False``: evaluate without autograd.
            tag: the caller's name for this protocol step (recorded).

        Returns:
            Per output party, its output: a numpy array for numpy inputs evaluated without
            training, else a tensor detached from the server's graph.
        """
        torch = self._torch
        inputs, outputs, network, train, tag = (
            inquiry.inputs, inquiry.outputs, inquiry.network, inquiry.train, inquiry.tag
        )  # fmt: skip
        leading = self._check_inputs(inputs)
        positions = inquiry.positions
        chosen = check_positions(positions, outputs, leading)
        if network == "target" and self.target is None:
            raise RuntimeError("this channel has no target network (built with target=None)")
        module = self.module if network == "online" else self.target
        as_numpy = all(isinstance(v, np.ndarray) for v in inputs.values())
        if train:
            tensors = {
                q: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                for q, v in inputs.items()
            }
            # What the server received: leaves, so that backward can return dL/dx per party.
            leaves = {q: tensors[q].detach().requires_grad_(True) for q in self._parties}
            index = {p: _as_tensor(torch, chosen[p]) for p in chosen}
            kept = {
                p: module(self._ordered(leaves, p, torch.zeros_like), index.get(p)) for p in outputs
            }
            self._pending = (leaves, kept, tag)
            result = {p: out.detach() for p, out in kept.items()}
        elif as_numpy and self._numpy is not None and network == "online":
            result = {
                p: pick(
                    self._numpy(self._ordered(inputs, p, np.zeros_like)), numpy_view(chosen.get(p))
                )
                for p in outputs
            }
        else:
            tensors = {
                q: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                for q, v in inputs.items()
            }
            index = {p: _as_tensor(torch, chosen[p]) for p in chosen}
            with torch.no_grad():
                result = {
                    p: module(self._ordered(tensors, p, torch.zeros_like), index.get(p))
                    for p in outputs
                }
            if as_numpy:
                result = {p: out.numpy() for p, out in result.items()}
        record_forward(self.view, inputs, result, chosen, network=network, tag=tag, train=train)
        return result

    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, Any]:
        """Back-propagate the parties' output gradients, step the server, return input gradients.

        Args:
            grads: per party of the last training forward, ``dL/d(its output)`` (its shape).
            recipients: who gets ``dL/d(its input)`` (default: every party; a party whose
                vector did not reach an output gets zeros).

        Returns:
            Per recipient, a tensor of its input's shape.

        Raises:
            RuntimeError: without a training forward since the last backward.
            ValueError: a gradient of a party that got no output, of the wrong shape, or not
                finite.
        """
        torch = self._torch
        if self._pending is None:
            raise RuntimeError("backward() needs a forward(train=True) first (once per forward)")
        recipients = check_parties_named("recipients", self._parties, recipients)
        leaves, kept, tag = self._pending
        unknown = set(grads) - set(kept)
        if unknown:
            raise ValueError(f"no forward output for parties {sorted(unknown)}")
        names = list(grads)
        received = {}
        for p in names:
            g = grads[p]
            g = torch.from_numpy(g) if isinstance(g, np.ndarray) else g
            if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(kept[p].shape):
                raise ValueError(
                    f"party {p!r} output gradient must be a tensor of shape "
                    f"{tuple(kept[p].shape)}, got {getattr(g, 'shape', type(g).__name__)}"
                )
            if not bool(torch.isfinite(g).all()):
                raise ValueError(f"party {p!r} output gradient contains NaN or infinity")
            received[p] = g
        self.optimiser.zero_grad(set_to_none=True)
        torch.autograd.backward([kept[p] for p in names], [received[p] for p in names])
        result = {
            q: (leaves[q].grad if leaves[q].grad is not None else torch.zeros_like(leaves[q]))
            for q in recipients
        }
        self.optimiser.step()
        self._pending = None
        record_backward(self.view, received, result, tag=tag)
        return result


def _as_tensor(torch, value):
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value
