"""FedSlate on Flower: the relay keys pinned out of band (``securefed.rl.flower_fedslate``).

The attack: a malicious server that collects and hands out the nodes' X25519 public keys puts its
own key in every peer's place (a man in the middle), opens every sealed blob (the observations,
clicks and feedback the simulator tells a platform), seals it again for its recipient, and the
run goes on as if nothing happened.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed.crypto import keys as kx
from securefed.flower import records as rec
from securefed.rl import flower_fedslate as ffs
from securefed.rl.fedslate import FedSlateConfig
from securefed.rl.flower_fedslate import FedSlateFlowerRun

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 6, "episodes": 2, "members": 2,
    "burn_in": 5, "learn_every": 2, "target_sync": 7, "buffer_size": 16, "batch_size": 4,
    "local_hidden": (8,), "server_hidden": (4,), "seed": None,
}  # fmt: skip


def tiny(**changes) -> FedSlateConfig:
    return FedSlateConfig(**(TINY | changes))


def _honest(run, stores, node_configs):
    """One message round handled by the nodes (their state round-tripped as Flower keeps it)."""

    def exchange(op, requests):
        replies = {}
        for role, (arrays, config) in requests.items():
            body = rec.content(arrays, config)
            records = body.array_records
            sent = rec.record_arrays(records[rec.ARRAYS]) if rec.ARRAYS in records else {}
            store = stores.setdefault(role, {})
            replies[role] = ffs.handle(
                run, role, store, dict(body.config_records[rec.CONFIG]), sent, **node_configs(role)
            )
        return replies

    return exchange


def _sealed_in(op, role, request_config, arrays):
    """``(name, kind, counter, sender, recipient)`` of every sealed blob in a node's reply."""
    if op == "reset":
        kind, counter = "reset", int(request_config["episode"])
    elif op == "step":
        kind, counter = "outcome", int(request_config["round"])
    elif op == "choose":
        return [("sealed", "slate", int(request_config["round"]), role, ffs.SIMULATOR)]
    elif op == "targets":
        kind, counter = "targets", int(request_config["learn_step"])
    else:
        return []
    return [(n, kind, counter, role, int(n.split(".")[1]) + 1) for n in arrays if "sealed." in n]


class KeySubstitutingServer:
    """The man in the middle: every relayed public key replaced by the server's own; every
    sealed blob opened (kept in ``read``) and sealed again for its recipient."""

    def __init__(self, run, node_configs=lambda role: {}):
        self.run, self.stores, self.read = run, {}, []
        self.honest = _honest(run, self.stores, node_configs)
        self.mine = kx.keypair_from_seed(b"the server's own key, 32 bytes!!")
        self.public: dict[int, bytes] = {}

    def _as(self, role: int, peer: int) -> ffs._Keys:
        return ffs._Keys(role, self.mine, {peer: self.public[peer]})

    def exchange(self, op, requests):
        if op == "keys":
            requests = {
                r: (
                    {k: v for k, v in arrays.items() if not k.startswith("peer.")}
                    | {
                        k: np.frombuffer(self.mine.public, np.uint8).copy()
                        for k in arrays
                        if k.startswith("peer.")
                    },
                    config,
                )
                for r, (arrays, config) in requests.items()
            }
        replies = self.honest(op, requests)
        if op == "hello":
            self.public = {r: a["public"].tobytes() for r, (a, _) in replies.items()}
        for role, (arrays, _) in replies.items():
            for name, kind, counter, sender, recipient in _sealed_in(
                op, role, requests[role][1], arrays
            ):
                data = self._as(recipient, sender).open(kind, counter, sender, arrays[name])
                self.read.append((kind, recipient, data))
                arrays[name] = self._as(sender, recipient).seal(kind, counter, recipient, data)
        return replies


def _observations(stores) -> list[bytes]:
    rows = []
    for role in (1, 2):
        x = stores[role]["arrays"]["replay.x.0"]
        rows.extend(row.tobytes() for row in x.reshape(-1, x.shape[-1]) if np.any(row))
    return rows


def _what_the_server_read(server) -> tuple[set[bytes], list[np.ndarray]]:
    """The observation rows (first ones and next ones) and the feedback it opened."""
    rows, feedback = set(), []
    for kind, recipient, data in server.read:
        for key in ("x", "x_next"):
            if kind in ("reset", "outcome") and key in data:
                rows.update(r.tobytes() for r in data[key].reshape(-1, data[key].shape[-1]))
        if kind == "outcome" and recipient == 1:
            feedback.append(data["feedback"])
    return rows, feedback


def test_a_key_substituting_server_reads_every_sealed_observation_without_pinning():
    run = FedSlateFlowerRun(tiny())
    server = KeySubstitutingServer(run)
    ffs.run_server(run, server.exchange)
    read, feedback = _what_the_server_read(server)
    rows = _observations(server.stores)
    assert rows and all(row in read for row in rows)
    # Platform A's feedback (it has rewards), every round of the run (the replay holds them all).
    kept = server.stores[1]["arrays"]["replay.feedback.0"][: len(feedback)]
    assert len(feedback) == run.config.episodes * run.config.steps_per_platform
    np.testing.assert_array_equal(np.stack(feedback).astype(kept.dtype).reshape(kept.shape), kept)
