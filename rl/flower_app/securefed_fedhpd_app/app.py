"""FedHPD (``securefed.rl.fedhpd``) on Flower, as ``flwr run`` submits it.

The server (``server``) holds ``S_p`` and the consensus; each SuperNode (``client``) the agents
``partition_users(n_agents, num-partitions, partition-id)``, their optimisers and environments,
kept in its Flower Context between messages. Configuration: the ``[tool.flwr.app.config]``
section of ``pyproject.toml`` (run config), read by
:meth:`securefed.rl.flower_fedhpd.FedHPDApp.from_run_config`; ``seed = -1`` (the default) is
secure mode. The halves themselves are :mod:`securefed.rl.flower_fedhpd`.
"""

from __future__ import annotations

from securefed.flower import make_client_app, make_server_app
from securefed.rl.flower_fedhpd import app_client_setup, app_server_setup

# What `flwr run` loads (pyproject.toml [tool.flwr.app.components]).
server = make_server_app(app_server_setup)
client = make_client_app(app_client_setup)

__all__ = ["client", "server"]
