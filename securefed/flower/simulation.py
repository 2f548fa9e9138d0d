"""Run a securefed federation on Flower's simulation engine (``flwr[simulation]``, Ray)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def run_in_simulation(apps, nodes: int, backend_config: Mapping[str, object]):
    """``flwr.simulation.run_simulation`` for ``apps`` on ``nodes`` SuperNodes; their outcome.

    ``apps`` has ``server``, ``client`` and ``outcome`` (what the example apps' ``build_apps``
    returns). Flower's Ray backend exports this process's ``sys.path`` as ``PYTHONPATH``; the
    variable is restored afterwards so that later subprocesses see the caller's environment.
    """
    from flwr.simulation import run_simulation

    pythonpath = os.environ.get("PYTHONPATH")
    try:
        run_simulation(
            server_app=apps.server,
            client_app=apps.client,
            num_supernodes=nodes,
            backend_config=dict(backend_config),
        )
    finally:
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath
    return apps.outcome
