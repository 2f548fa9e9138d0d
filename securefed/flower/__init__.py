"""securefed on Flower: the same federations across processes and machines (optional extra).

``pip install securefed[flower]`` (Flower >= 1.42, its Message API). A securefed algorithm split
into a server half (:class:`~securefed.flower.protocol.ServerAlgorithm`, e.g.
``securefed.recsys.fedmf.FedMF``) and a client half per node
(:class:`~securefed.flower.protocol.ClientNode`) becomes a Flower ``ServerApp``
(:func:`make_server_app`) and ``ClientApp`` (:func:`make_client_app`), which run in Flower's
simulation engine (``flwr.simulation.run_simulation``) or as real SuperLink / SuperNode processes
(:mod:`securefed.flower.loopback` starts them on one machine; docs/flower.md across machines).

Transports carried over Flower messages: plaintext; ``DPTransport`` (central noise on the
server; local and distributed noise added on the node before its update leaves, the exact
integer mechanisms included: :mod:`securefed.flower.dp`); securefed's own secure aggregation
(``SecAggTransport(remote_clients=True)``: one Flower message round per stage, the clients' side
on the nodes, the server's side in the ServerApp; the malicious-server variant by default, with
the nodes' long-term identities of :mod:`securefed.flower.identity`); their compositions; CKKS
(``CKKSTransport(public=...)``: the nodes encrypt with keys provisioned out of band, the server
adds ciphertexts under the public context, a key-holder node decrypts the sum;
:mod:`securefed.flower.ckks`), and DP around it. Every node refuses a round weaker than its own
floors (:class:`~securefed.flower.floors.NodeFloors`). Not carried: FedMF's encrypted server
state, MAC authentication (docs/flower.md, "Limits").

The worked example, FedMF on a SuperLink and SuperNodes, is the app in ``recsys/flower_app``
(:mod:`securefed.recsys.fedmf_flower`; copied by :func:`securefed.flower.loopback.write_app`).
FedHPD's halves
(agents on the nodes, the consensus on the server) are ``rl/flower_fedhpd.py``, its app
``rl/flower_app``; FedSlate's (the user simulator and each platform a node, the server network in
the ServerApp, over this package's messenger and records) are ``rl/flower_fedslate.py``.
Transport credentials of a deployment (a TLS CA, the SuperLink's certificate, the SuperNodes'
authentication keys): :mod:`securefed.flower.credentials`. Fault
drills (a node that hangs or answers garbage): :mod:`securefed.flower.faults`.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("flwr") is None:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "securefed.flower needs Flower: install the optional extra with "
        "`pip install securefed[flower]` (flwr[simulation] >= 1.42)",
        name="flwr",
    )

from securefed.flower.client import ClientSetup, make_client_app
from securefed.flower.floors import NodeFloors
from securefed.flower.identity import NodeIdentity, provision_identities
from securefed.flower.protocol import (
    ClientNode,
    FlowerRunOptions,
    FlowerRunResult,
    ServerAlgorithm,
    partition_users,
)
from securefed.flower.server import (
    ServerSetup,
    describe_transport,
    make_server_app,
    run_federation,
)

__all__ = [
    "ClientNode",
    "ClientSetup",
    "FlowerRunOptions",
    "FlowerRunResult",
    "NodeFloors",
    "NodeIdentity",
    "ServerAlgorithm",
    "ServerSetup",
    "describe_transport",
    "make_client_app",
    "make_server_app",
    "partition_users",
    "provision_identities",
    "run_federation",
]
