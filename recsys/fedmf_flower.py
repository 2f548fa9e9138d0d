"""FedMF's Flower app: where it lives, and a copy with a run configuration.

The app itself (``flower_app/``: a ``pyproject.toml`` with ``[tool.flwr.app]`` and the package
``securefed_fedmf_app``) is what ``flwr run`` ships to the SuperLink; it imports
:mod:`securefed.recsys.fedmf` on every host, so securefed must be installed there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_DIR = Path(__file__).resolve().parent / "flower_app"
"""The FedMF example app: ``pyproject.toml`` and the package ``securefed_fedmf_app``."""

PRELOAD = (
    "securefed.flower",
    "securefed.flower.client",
    "securefed.integrity",
    "securefed.privacy.ledger",
    "securefed.recsys.data",
    "securefed.recsys.fedmf",
    "securefed.runtime",
    "securefed.transport",
    "securefed.transport.registry",
)
"""What the app's module imports (not the app itself, which each ClientApp loads from its FAB):
the modules a :mod:`securefed.flower.warm` executor imports once for every message."""


def write_fedmf_app(
    dest: str | os.PathLike, run_config: Mapping[str, object] | None = None
) -> Path:
    """Copy the FedMF app to ``dest`` with ``run_config`` in its ``[tool.flwr.app.config]``."""
    from securefed.flower.loopback import write_app

    return write_app(APP_DIR, dest, run_config)
