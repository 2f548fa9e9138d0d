"""FedSlate on Flower: the relay keys pinned out of band (``securefed.rl.flower_fedslate``).

The attack: a malicious server that collects and hands out the nodes' X25519 public keys puts its
own key in every peer's place (a man in the middle), opens every sealed blob (the observations,
clicks and feedback the simulator tells a platform), seals it again for its recipient, and the
run goes on as if nothing happened. The defence: every role's Ed25519 identity provisioned out of
band (``provision_relay_identities``: a registry whose digest each node pins from its node
config); a node signs its X25519 relay key with it and takes a peer's key only with that role's
signature under the pinned registry. Each test runs the attack against the check, then with the
check disabled, where the attack succeeds (so the test can fail).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)


from securefed.crypto import keys as kx
from securefed.crypto.keys import ShareDecryptionError
from securefed.errors import InsecureParameterError
from securefed.flower import identity as ident
from securefed.rl import flower_fedslate as ffs
from securefed.rl.fedslate import FedSlateConfig
from securefed.rl.flower_fedslate import FedSlateFlowerRun
from securefed.rl.slateq import features
from securefed.transport.secagg.signatures import KeyRegistry, SignatureError, SigningKey

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Secure mode (seed None); one episode of 6 rounds, one learning step (A's targets sealed for B).
TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 6, "episodes": 1, "members": 2,
    "burn_in": 5, "learn_every": 2, "target_sync": 7, "buffer_size": 16, "batch_size": 4,
    "local_hidden": (8,), "server_hidden": (4,), "seed": None,
}  # fmt: skip


def tiny(**changes) -> FedSlateConfig:
    return FedSlateConfig(**(TINY | changes))


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
    sealed blob opened (kept in ``read``) and sealed again for its recipient.

    ``forge(recipient, role, public, transcript)``: a signature of ``public`` as ``role`` for
    the node ``recipient`` over the run's nonces (their digest ``transcript``, which the server
    relayed); None: the honest signatures are relayed beside the substituted keys.
    """

    def __init__(self, run, node_configs, forge=None):
        self.run, self.stores, self.read = run, {}, []
        self.honest = ffs.in_process_exchange(run, self.stores, node_configs)
        self.mine = kx.keypair_from_seed(b"the server's own key, 32 bytes!!")
        self.public: dict[int, bytes] = {}
        self.forge = forge
        self.transcript = b""

    def _as(self, role: int, peer: int) -> ffs._Keys:
        return ffs._Keys(role, self.mine, {peer: self.public[peer]})

    def exchange(self, op, requests):
        if op == "hello":
            arrays = next(iter(requests.values()))[0]
            self.transcript = ffs.nonce_transcript(
                {int(k.split(".")[1]): v.tobytes() for k, v in arrays.items() if "nonce." in k}
            )
        if op == "keys":
            mine = np.frombuffer(self.mine.public, np.uint8).copy()
            forged = {}
            for r, (arrays, config) in requests.items():
                arrays = dict(arrays) | {f"peer.{q}": mine for q in range(self.run.nodes)}
                if self.forge is not None:
                    arrays |= {
                        f"sig.{q}": self.forge(r, q, self.mine.public, self.transcript)
                        for q in range(self.run.nodes)
                    }
                forged[r] = (arrays, config)
            requests = forged
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
    """Every platform's observation rows, from its own replay (its private data)."""
    rows = []
    for role in (1, 2):
        x = stores[role]["arrays"]["replay.x.0"]
        rows.extend(row.tobytes() for row in x.reshape(-1, x.shape[-1]) if np.any(row))
    return rows


def _reads_every_row(server) -> None:
    """The server opened every observation row the platforms hold and all of A's feedback."""
    read, feedback = set(), []
    for kind, recipient, data in server.read:
        for key in ("x", "x_next"):
            if kind in ("reset", "outcome") and key in data:
                read.update(r.tobytes() for r in data[key].reshape(-1, data[key].shape[-1]))
        if kind == "outcome" and recipient == 1:
            feedback.append(data["feedback"])
    rows = _observations(server.stores)
    assert rows and all(row in read for row in rows)
    # Platform A's feedback (it has rewards), every round of the run (the replay holds them all).
    config = server.run.config
    assert len(feedback) == config.episodes * config.steps_per_platform
    kept = server.stores[1]["arrays"]["replay.feedback.0"][: len(feedback)]
    np.testing.assert_array_equal(np.stack(feedback).astype(kept.dtype).reshape(kept.shape), kept)


def test_a_substituted_relay_key_is_refused(enrolment, monkeypatch):
    run = FedSlateFlowerRun(tiny())
    server = KeySubstitutingServer(run, enrolment)
    with pytest.raises(SignatureError, match="refuses the X25519 relay key the server handed it"):
        ffs.run_server(run, server.exchange)
    assert server.read == []
    # The check disabled: every node takes the server's key, the server reads every row.
    monkeypatch.setattr(ffs, "_verify_relay_key", lambda *args: None)
    server = KeySubstitutingServer(run, enrolment)
    ffs.run_server(run, server.exchange)
    _reads_every_row(server)


def _forged_registries(enrolment, directory):
    """For each node a registry with its own genuine key and the attacker's for every other
    role (what whoever hands out the registry could give it), and the attacker's signer."""
    directory.mkdir()
    genuine = ident.load_registry(enrolment[0][ffs.REGISTRY_PATH])
    attacker = {role: SigningKey.generate() for role in range(3)}
    configs, digests = {}, {}
    for node in range(3):
        keys = {r: genuine.keys[r] if r == node else attacker[r].public for r in range(3)}
        body = np.arange(3, dtype=">i8").tobytes() + b"".join(keys[r] for r in range(3))
        header = {"users": 3, "sha256": hashlib.sha256(body).hexdigest()}
        path = directory / f"registry-{node}.bin"
        path.write_bytes(ident._header(ident.REGISTRY_MAGIC, header, body))
        configs[node] = enrolment[node] | {ffs.REGISTRY_PATH: str(path)}
        digests[node] = KeyRegistry(keys).digest

    def forge(recipient, role, public, transcript):
        message = ffs.relay_key_message(digests[recipient], role, public, transcript)
        return np.frombuffer(attacker[role].sign(message), np.uint8).copy()

    return configs, forge


def test_a_forged_registry_is_refused(enrolment, tmp_path, monkeypatch):
    configs, forge = _forged_registries(enrolment, tmp_path / "attacker")
    run = FedSlateFlowerRun(tiny())
    server = KeySubstitutingServer(run, configs, forge)
    with pytest.raises(SignatureError, match="does not match the digest this node pinned"):
        ffs.run_server(run, server.exchange)
    assert server.read == []
    # The digest check disabled (a node takes whatever registry it is handed): the attacker's
    # signatures verify under the forged registries, the server reads every row.
    pinned = ident._pinned
    monkeypatch.setattr(
        ident, "_pinned", lambda keys, registry, digest: pinned(keys, registry, registry.digest)
    )
    server = KeySubstitutingServer(run, configs, forge)
    ffs.run_server(run, server.exchange)
    _reads_every_row(server)


def _any_role(registry, me, role, public, signature, transcript):
    """A check without the role binding: a key any registered role signed passes."""
    for other in registry.keys:
        message = ffs.relay_key_message(registry.digest, other, public, transcript)
        try:
            return registry.verify(other, message, signature, what="relay key")
        except SignatureError:
            continue
    raise SignatureError("signed by no registered role")


def test_a_key_relabelled_to_another_role_is_refused(enrolment, monkeypatch):
    """The server hands the simulator platform A's own signed key as platform B's: the
    simulator would seal B's observations for A (a platform colluding with the server)."""
    run = FedSlateFlowerRun(tiny())
    stores, captured = {}, {}
    honest = ffs.in_process_exchange(run, stores, enrolment)

    def relabelling(op, requests):
        if op == "keys":
            arrays, config = requests[ffs.SIMULATOR]
            arrays = dict(arrays) | {"peer.2": arrays["peer.1"], "sig.2": arrays["sig.1"]}
            requests = dict(requests) | {ffs.SIMULATOR: (arrays, config)}
        replies = honest(op, requests)
        if op == "reset":
            captured["for B"] = replies[ffs.SIMULATOR][0]["sealed.1"].copy()
        return replies

    with pytest.raises(SignatureError, match="handed it as role 2's"):
        ffs.run_server(run, relabelling)
    assert not captured
    # The role binding disabled: the simulator seals B's first observation for A's key, and the
    # corrupt A opens it (B, which cannot, ends the run).
    monkeypatch.setattr(ffs, "_verify_relay_key", _any_role)
    stores.clear()
    with pytest.raises(ShareDecryptionError):
        ffs.run_server(run, relabelling)
    corrupt_a = ffs._keys(1, ffs._node_tree(run.config, dict(stores[1]["meta"])), {}).pair
    sim_tree = ffs._node_tree(run.config, dict(stores[0]["meta"]))
    sim_public = ffs._keys(0, sim_tree, {}).pair.public
    opened = ffs._Keys(2, corrupt_a, {0: sim_public}).open("reset", 0, 0, captured["for B"])
    simulator = ffs.SimulatorNode(run.config, sim_tree)
    simulator.load(stores[0]["arrays"], stores[0]["meta"]["node"])
    np.testing.assert_array_equal(opened["x"], features(simulator.env.observation(1), run.config))


def _reflecting(run, stores, enrolment):
    """An exchange relaying A's team targets for B back to A, as if B had sealed them."""
    honest, pending = ffs.in_process_exchange(run, stores, enrolment), []

    def exchange(op, requests):
        if pending and 1 in requests:
            arrays, config = requests[1]
            i = int(config["inbox"])
            kind, counter, blob = pending.pop()
            arrays = dict(arrays) | {f"inbox.{i}": blob}
            config = dict(config) | {
                "inbox": i + 1,
                f"inbox.{i}.kind": kind,
                f"inbox.{i}.counter": counter,
                f"inbox.{i}.from": 2,
            }
            requests = dict(requests) | {1: (arrays, config)}
        replies = honest(op, requests)
        if op == "targets" and 1 in replies:
            blob = replies[1][0]["sealed.1"].copy()
            pending.append(("targets", int(requests[1][1]["learn_step"]), blob))
        return replies

    return exchange


def test_a_blob_relayed_to_the_wrong_recipient_is_refused(enrolment, monkeypatch):
    """A's team targets for B relayed back to A as B's (a reflection), and the simulator's
    outcome for A relayed to B: each recipient refuses the blob."""
    run = FedSlateFlowerRun(tiny())
    with pytest.raises(ShareDecryptionError):
        ffs.run_server(run, _reflecting(run, {}, enrolment))
    honest = ffs.in_process_exchange(run, {}, enrolment)

    def misrouting(op, requests):
        replies = honest(op, requests)
        if op == "step":
            arrays = replies[ffs.SIMULATOR][0]
            arrays["sealed.0"], arrays["sealed.1"] = arrays["sealed.1"], arrays["sealed.0"]
        return replies

    with pytest.raises(ShareDecryptionError):
        ffs.run_server(run, misrouting)
    # The associated data's ordered pair disabled (sender and recipient unordered; the pair key
    # is symmetric): A takes its own targets back as B's.
    aad = ffs._Keys._aad
    monkeypatch.setattr(
        ffs._Keys,
        "_aad",
        staticmethod(lambda kind, counter, s, r: aad(kind, counter, min(s, r), max(s, r))),
    )
    stores = {}
    ffs.run_server(run, _reflecting(run, stores, enrolment))
    kept = stores[1]["arrays"]
    np.testing.assert_array_equal(kept["work.y.1"], kept["work.y"])


def test_secure_mode_without_a_provisioned_identity_is_refused(enrolment):
    run = FedSlateFlowerRun(tiny())
    with pytest.raises(InsecureParameterError, match=ffs.IDENTITY_PATH):
        ffs.run_server(run, ffs.in_process_exchange(run, {}, {}))
    with pytest.raises(ValueError, match=ffs.REGISTRY_DIGEST):  # no digest pinned
        ffs.relay_identity(run, 1, enrolment[1] | {ffs.REGISTRY_DIGEST: ""})
    with pytest.raises(SignatureError, match="another node's file"):
        ffs.relay_identity(run, 1, enrolment[2])
    three = FedSlateFlowerRun(tiny(num_platforms=3, feedback=(True, False, False)))
    with pytest.raises(SignatureError, match="another run"):
        ffs.relay_identity(three, 1, enrolment[1])
    # Seeded mode derives every identity from the seed (the server knows it: not private).
    seeded = FedSlateFlowerRun(tiny(seed=0))
    assert ffs.relay_identity(seeded, 1, {}).registry == ffs.relay_identity(seeded, 2, {}).registry


@pytest.mark.slow
def test_secure_mode_on_the_simulation_engine_runs_with_provisioned_identities(enrolment, tmp_path):
    """The engine gives a node only its partition-id: the ClientApp adds the node configs."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from securefed.flower.simulation import run_in_simulation
    from securefed.rl.flower_fedslate import build_apps, node_results

    backend = {
        "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
    }
    config = tiny()
    run = FedSlateFlowerRun(config, output_dir=str(tmp_path / "out"))
    outcome = run_in_simulation(build_apps(run, node_configs=enrolment), run.nodes, backend)
    rewards = node_results(tmp_path / "out", config)["simulator"]["rewards"]
    assert rewards.shape == (1, 2, 2) and outcome.learn_steps == 1
