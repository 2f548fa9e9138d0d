"""Fault drills for a Flower federation: a ClientApp that hangs or answers garbage on cue.

:class:`FaultyClientApp` wraps a real ``ClientApp`` and, on the nodes and messages a
:class:`Fault` names, either **hangs** (writes a marker file, then never answers, so that a drill
can kill the SuperNode at a known point of a protocol) or answers **garbage** (every float array
of its real reply turned to NaN and every unsigned-integer array cut by one element: what a
broken or hostile node may send). :func:`write_faulty_app` turns a copied app directory (e.g.
``securefed.recsys.fedmf_flower.write_fedmf_app``'s) into one whose ClientApp is so wrapped, for
``flwr run`` on real processes (``tests/test_flower_faults.py``).

What the server must do: a node that stops answering counts as dropped (secure aggregation
recovers it as the protocol allows); a garbage reply refuses the round naming the node
(``securefed.flower.server``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from securefed.flower import records as rec

FAULT_KINDS = ("hang", "garbage")


@dataclass(frozen=True)
class Fault:
    """One fault: which node, which message, what it does.

    Attributes:
        partition: the node's ``partition-id``.
        message_type: the Flower message type (``securefed.flower.server.TRAIN``, ``MASK``, ...).
        kind: ``"hang"`` or ``"garbage"`` (module docstring).
        round_id: the round (the message's group id); ``-1``: every round.
        marker: a file the node writes (its process id) when the fault fires (``""``: none).
        hang_seconds: how long a hanging node sleeps before it gives up (and raises).
    """

    partition: int
    message_type: str
    kind: str
    round_id: int = -1
    marker: str = ""
    hang_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if self.partition < 0 or self.round_id < -1:
            raise ValueError(f"partition >= 0 and round_id >= -1, got {self}")
        if not self.hang_seconds > 0:
            raise ValueError(f"hang_seconds must be > 0, got {self.hang_seconds}")

    def fires(self, message: Message, context: Context) -> bool:
        return (
            int(context.node_config.get("partition-id", -1)) == self.partition
            and message.metadata.message_type == self.message_type
            and self.round_id in (-1, int(message.metadata.group_id))
        )


def garbage(reply: Message, request: Message) -> Message:
    """The reply with every float array NaN and every unsigned-integer array one element short."""
    arrays = {}
    for name, value in rec.message_arrays(reply).items():
        if value.dtype.kind == "f":
            value = np.full_like(value, np.nan)
        elif value.dtype.kind == "u" and value.size:
            value = value.reshape(-1)[:-1]
        arrays[name] = value
    return Message(rec.content(arrays, dict(rec.message_config(reply))), reply_to=request)


class FaultyClientApp(ClientApp):
    """``app`` with ``faults`` applied (the first that fires on a message)."""

    def __init__(self, app: ClientApp, faults: tuple[Fault, ...]) -> None:
        super().__init__()
        self.app = app
        self.faults = tuple(faults)

    def __call__(self, message: Message, context: Context) -> Message:
        fault = next((f for f in self.faults if f.fires(message, context)), None)
        if fault is not None and fault.marker:
            Path(fault.marker).write_text(str(os.getpid()))
        if fault is not None and fault.kind == "hang":
            time.sleep(fault.hang_seconds)
            raise TimeoutError(f"fault drill: the node hung on {fault.message_type}")
        reply = self.app(message, context)
        if fault is not None and not reply.has_error():
            reply = garbage(reply, message)
        return reply


_MODULE = '''"""A fault drill written by securefed.flower.faults.write_faulty_app."""

from securefed.flower.faults import Fault, FaultyClientApp
from {module} import {attribute} as _app

client = FaultyClientApp(_app, tuple(Fault(**f) for f in {faults!r}))
'''


def write_faulty_app(app_dir: str | os.PathLike, faults: tuple[Fault, ...]) -> Path:
    """Make the app in ``app_dir`` (a copy: it is changed in place) run its ClientApp wrapped.

    Writes ``securefed_faults.py`` into the app's package and points
    ``[tool.flwr.app.components] clientapp`` at it.

    Raises:
        ValueError: the app's ``pyproject.toml`` names no ``package.module:attribute``
            clientapp.
    """
    app_dir = Path(app_dir)
    pyproject = app_dir / "pyproject.toml"
    lines = pyproject.read_text().splitlines()
    [index] = [i for i, line in enumerate(lines) if line.replace(" ", "").startswith("clientapp=")]
    target = json.loads(lines[index].split("=", 1)[1].strip())
    module, _, attribute = target.partition(":")
    package = module.split(".")[0]
    if not attribute or package == module:
        raise ValueError(f"{pyproject}: clientapp must be 'package.module:attribute', got {target}")
    source = _MODULE.format(module=module, attribute=attribute, faults=[asdict(f) for f in faults])
    (app_dir / package / "securefed_faults.py").write_text(source)
    lines[index] = f'clientapp = "{package}.securefed_faults:client"'
    pyproject.write_text("\n".join(lines) + "\n")
    return app_dir
