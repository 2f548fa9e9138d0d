"""FedSlate on Flower: each signed relay key bound to its run (``securefed.rl.flower_fedslate``).

The attack: a node's signature binds its X25519 relay key to the pinned registry and its role.
A server that holds an earlier run's X25519 *private* key of node X (a leaked ``Context.state``)
keeps that run's signed key of X and, in a new run, hands it to the peers in place of the key X
signs now: the signature verifies, the peers seal for the old key, and the server opens what they
seal for X. The defence: every node contributes a fresh nonce (OS entropy in secure mode, the
seed tree in seeded mode) in a first set-up message round, every node signs its key over the
digest of all the nonces, and each node takes a peer's key only when it is signed over the
transcript that holds its own nonce in its own place. Each test runs the attack against the
check, then with the check disabled, where the attack succeeds (so the test can fail).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)


from securefed.rl import flower_fedslate as ffs
from securefed.rl.fedslate import FedSlateConfig
from securefed.rl.flower_fedslate import FedSlateFlowerRun
from securefed.rl.slateq import features
from securefed.transport.secagg.signatures import SignatureError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Secure mode (seed None); one episode of 6 rounds, one learning step.
TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 6, "episodes": 1, "members": 2,
    "burn_in": 5, "learn_every": 2, "target_sync": 7, "buffer_size": 16, "batch_size": 4,
    "local_hidden": (8,), "server_hidden": (4,), "seed": None,
}  # fmt: skip
X = 1  # the node whose earlier state leaked: platform A


def _earlier_run(run, enrolment, nonces=None):
    """An honest earlier run; what the server keeps of it: X's signed relay key (it relayed it)
    and X's X25519 key pair (X's leaked ``Context.state``: its secret entropy); in ``nonces``
    the set-up nonces it relayed."""
    stores, signed = {}, {}
    honest = ffs.in_process_exchange(run, stores, enrolment)

    def keeping(op, requests):
        if op == "hello" and nonces is not None:
            nonces.update(
                {k: v.copy() for k, v in requests[X][0].items() if k.startswith("nonce.")}
            )
        replies = honest(op, requests)
        if op == "hello":
            arrays = replies[X][0]
            signed.update(public=arrays["public"].copy(), signature=arrays["signature"].copy())
        return replies

    ffs.run_server(run, keeping)
    leaked = ffs._keys(X, ffs._node_tree(run.config, dict(stores[X]["meta"])), {}).pair
    assert leaked.public == signed["public"].tobytes()
    return signed, leaked


class ReplayingServer:
    """The new run with X's signed key of the earlier run in place of the one X signs now; keeps
    (and opens with the leaked private key) the first observation the simulator seals for X."""

    def __init__(self, run, enrolment, signed, leaked, old_nonces=None):
        self.run, self.stores, self.signed, self.leaked = run, {}, signed, leaked
        self.honest = ffs.in_process_exchange(run, self.stores, enrolment)
        self.simulator_public = b""
        self.read: list[dict] = []
        self.old_nonces = old_nonces

    def exchange(self, op, requests):
        if op == "hello" and self.old_nonces is not None:
            # Every node handed the earlier run's nonces: X's old signature would verify.
            requests = {r: (a | self.old_nonces, c) for r, (a, c) in requests.items()}
        replies = self.honest(op, requests)
        if op == "hello":
            self.simulator_public = replies[ffs.SIMULATOR][0]["public"].tobytes()
            arrays, config = replies[X]
            replies[X] = (arrays | self.signed, config)
        if op == "reset":
            blob = replies[ffs.SIMULATOR][0][f"sealed.{X - 1}"]
            mine = ffs._Keys(X, self.leaked, {ffs.SIMULATOR: self.simulator_public})
            self.read.append(mine.open("reset", 0, ffs.SIMULATOR, blob))
            raise RuntimeError("the server read what the simulator sealed for X")
        return replies

    def first_observation(self) -> np.ndarray:
        """What the simulator of the new run sealed for X (from the simulator's own state)."""
        store = self.stores[ffs.SIMULATOR]
        simulator = ffs.SimulatorNode(
            self.run.config, ffs._node_tree(self.run.config, dict(store["meta"]))
        )
        simulator.load(store["arrays"], store["meta"]["node"])
        return features(simulator.env.observation(X - 1), self.run.config)


def test_a_relay_key_replayed_from_an_earlier_run_is_refused(enrolment, monkeypatch):
    run = FedSlateFlowerRun(FedSlateConfig(**TINY))
    signed, leaked = _earlier_run(run, enrolment)
    server = ReplayingServer(run, enrolment, signed, leaked)
    with pytest.raises(SignatureError, match="replayed from another run"):
        ffs.run_server(run, server.exchange)
    assert server.read == []
    # The run binding disabled (every signature over one fixed transcript, as before the
    # nonces): the peers take X's old key and the server opens X's first observation.
    monkeypatch.setattr(ffs, "nonce_transcript", lambda *args, **kwargs: b"\0" * 32)
    signed, leaked = _earlier_run(run, enrolment)
    server = ReplayingServer(run, enrolment, signed, leaked)
    with pytest.raises(RuntimeError, match="the server read"):
        ffs.run_server(run, server.exchange)
    np.testing.assert_array_equal(server.read[0]["x"], server.first_observation())


def test_the_earlier_runs_nonces_replayed_with_its_key_are_refused(enrolment, monkeypatch):
    """The server hands every node the earlier run's nonces too, so that X's old signature is
    over the transcript the peers sign: each node refuses a transcript without its own nonce."""
    run = FedSlateFlowerRun(FedSlateConfig(**TINY))
    old_nonces = {}
    signed, leaked = _earlier_run(run, enrolment, old_nonces)
    server = ReplayingServer(run, enrolment, signed, leaked, old_nonces)
    with pytest.raises(SignatureError, match="does not find its own set-up nonce in its place"):
        ffs.run_server(run, server.exchange)
    assert server.read == []
    # The own-nonce check disabled: every node signs over the earlier run's transcript, the
    # peers take X's old key and the server opens X's first observation.
    monkeypatch.setattr(
        ffs,
        "_checked_transcript",
        lambda me, roles, own, arrays: ffs.nonce_transcript(
            {r: arrays[f"nonce.{r}"].tobytes() for r in range(roles)}
        ),
    )
    server = ReplayingServer(run, enrolment, signed, leaked, old_nonces)
    with pytest.raises(RuntimeError, match="the server read"):
        ffs.run_server(run, server.exchange)
    np.testing.assert_array_equal(server.read[0]["x"], server.first_observation())


def _swap(arrays, a, b):
    return arrays | {f"nonce.{a}": arrays[f"nonce.{b}"], f"nonce.{b}": arrays[f"nonce.{a}"]}


def _drop(arrays, role):
    return {k: v for k, v in arrays.items() if k != f"nonce.{role}"}


def _other(arrays, role):
    return arrays | {f"nonce.{role}": np.frombuffer(bytes(range(32)), np.uint8).copy()}


# (which nodes get the tampered nonces, the tampering, the refusal)
TAMPERED = {
    "dropped": ((0,), lambda a: _drop(a, 2), "a nonce dropped or added"),
    "added": ((0,), lambda a: a | {"nonce.3": a["nonce.1"]}, "a nonce dropped or added"),
    "truncated": ((0,), lambda a: a | {"nonce.2": a["nonce.2"][:16]}, "not 32 bytes"),
    "reordered": ((0, 1, 2), lambda a: _swap(a, 1, 2), "its own set-up nonce in its place"),
    "own-substituted": ((1,), lambda a: _other(a, 1), "its own set-up nonce in its place"),
    "copied": ((0,), lambda a: a | {"nonce.2": a["nonce.1"]}, "repeat"),
    # Node 0 alone sees other nonces (which it cannot tell): it signs over another transcript
    # than its peers, and their signatures do not verify over its own.
    "others-substituted": ((0,), lambda a: _other(a, 2), "other nonces handed to role"),
    "others-reordered": ((0,), lambda a: _swap(a, 1, 2), "other nonces handed to role"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_dropped_reordered_or_substituted_nonces_are_refused(enrolment, case):
    nodes, tamper, refusal = TAMPERED[case]
    run = FedSlateFlowerRun(FedSlateConfig(**TINY))
    honest = ffs.in_process_exchange(run, {}, enrolment)
    ops = []

    def tampering(op, requests):
        ops.append(op)
        if op == "hello":
            requests = {
                r: (tamper(dict(a)) if r in nodes else a, c) for r, (a, c) in requests.items()
            }
        return honest(op, requests)

    with pytest.raises(SignatureError, match=refusal):
        ffs.run_server(run, tampering)
    assert "reset" not in ops  # refused in the set-up, before any sealed blob


def test_a_node_refuses_a_second_nonce_or_hello_and_keys_out_of_order(enrolment):
    run = FedSlateFlowerRun(FedSlateConfig(**TINY))
    store = {}
    nonce, _ = ffs.handle(run, X, store, {"op": "nonce"}, {}, node_config=enrolment[X])
    with pytest.raises(SignatureError, match="already gave this run's set-up its nonce"):
        ffs.handle(run, X, store, {"op": "nonce"}, {}, node_config=enrolment[X])
    fresh = {}
    with pytest.raises(SignatureError, match="before giving its set-up nonce"):
        ffs.handle(run, X, fresh, {"op": "hello"}, {}, node_config=enrolment[X])
    with pytest.raises(SignatureError, match="before signing its own"):
        ffs.handle(run, X, fresh, {"op": "keys"}, {}, node_config=enrolment[X])
    nonces = {f"nonce.{r}": np.full(32, r, np.uint8) for r in range(3)} | {
        f"nonce.{X}": nonce["nonce"]
    }
    ffs.handle(run, X, store, {"op": "hello"}, nonces, node_config=enrolment[X])
    with pytest.raises(SignatureError, match="already signed its relay key over other"):
        ffs.handle(run, X, store, {"op": "hello"}, _other(nonces, 2), node_config=enrolment[X])


def test_secure_nonces_are_fresh_and_seeded_nonces_reproducible():
    secure = FedSlateConfig(**TINY)
    seeded = FedSlateConfig(**TINY | {"seed": 3})
    tree = ffs.SeedTree(3)
    assert ffs.relay_nonce(secure, 1, tree) != ffs.relay_nonce(secure, 1, tree)
    assert ffs.relay_nonce(seeded, 1, tree) == ffs.relay_nonce(seeded, 1, ffs.SeedTree(3))
    assert ffs.relay_nonce(seeded, 1, tree) != ffs.relay_nonce(seeded, 2, tree)
    assert len(ffs.relay_nonce(secure, 0, tree)) == ffs.NONCE_BYTES
