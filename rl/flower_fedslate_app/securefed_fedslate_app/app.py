"""FedSlate (``securefed.rl.fedslate``) on Flower, as ``flwr run`` submits it.

The server (``server``) holds the server network behind the fusion channel and the replay's
public schedule; the SuperNodes (``client``) are the roles by ``partition-id``: ``0`` the user
simulator, ``p + 1`` platform ``p``, each keeping its state in its Flower Context between
messages. Configuration: the ``[tool.flwr.app.config]`` section of ``pyproject.toml`` (run
config), read by :func:`securefed.rl.flower_fedslate.run_from_config`; ``seed = -1`` (the
default) is secure mode. The halves themselves are :mod:`securefed.rl.flower_fedslate`.
Start the SuperLink and SuperNodes with ``OMP_NUM_THREADS=1`` (torch on one thread, as the
in-process run) for a seeded run bit-identical to ``run_fedslate``.
"""

from __future__ import annotations

from securefed.rl.flower_fedslate import app_components

# What `flwr run` loads (pyproject.toml [tool.flwr.app.components]).
_apps = app_components()
server = _apps.server
client = _apps.client

__all__ = ["client", "server"]
