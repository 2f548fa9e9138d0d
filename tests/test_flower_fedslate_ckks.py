"""FedSlate on Flower under ``fusion="ckks"`` (the monomial circuit): each platform node holds its
own CKKS key pair (its secret key only in its node state), the ServerApp holds only public
contexts built from the bytes the platforms sent, every row, fused value, gradient and masked
product crosses as serialized ciphertexts in the messages (securefed.rl.flower_fedslate,
CKKSModuleFusionChannel.serve_forward / serve_backward / finish_backward).

Attacks first: no secret key in the server's state or in any message; a substituted or
relabelled public context is refused by the platform (signed by its owner's relay identity);
ciphertexts labelled for another platform's key are refused; the server cannot ask a platform
for more releases than the circuit's. Then the equality with the in-process ckks run (the same
rewards, server weights within the CKKS error), directly and on the simulation engine (slow)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ts = pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")
pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import InsecureParameterError  # noqa: E402
from securefed.fusion.ckks_module import CKKSModuleFusionChannel  # noqa: E402
from securefed.rl import flower_fedslate as ffs  # noqa: E402
from securefed.rl.fedslate import FedSlateConfig, ckks_config, run_fedslate, server_network  # noqa: E402
from securefed.rl.flower_fedslate import (  # noqa: E402
    FedSlateFlowerRun,
    build_apps,
    drive_in_process,
    flower_refusal,
    handle,
    node_results,
)
from securefed.transport.secagg.signatures import SignatureError  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Two platforms (A with rewards, B without), 2 members; two hidden server layers with the
# quadratic activation: degree 4, the monomial circuit (ring 16384). One learning step at the
# end of the episode (targets, Algorithm 1, Algorithm 2).
SMALL = {
    "num_candidates": 4, "slate_size": 2, "steps_per_platform": 4, "episodes": 1, "members": 2,
    "burn_in": 3, "learn_every": 4, "buffer_size": 8, "batch_size": 2, "local_hidden": (4,),
    "server_hidden": (2, 2), "activation": "polynomial", "fusion": "ckks", "seed": 0,
}  # fmt: skip
ACTING_ONLY = SMALL | {"steps_per_platform": 2, "burn_in": 50}
SIMULATION_BACKEND = {
    "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


def _contexts_in(blob: np.ndarray):
    """A TenSEAL context if the message array parses as one (else None)."""
    try:
        return ts.context_from(np.asarray(blob, np.uint8).tobytes())
    except Exception:
        return None


def _tapped(config):
    messages = []

    def tap(op, role, sent, reply):
        messages.append((op, role, dict(sent), dict(reply)))

    outcome = drive_in_process(FedSlateFlowerRun(config), tap=tap)
    return outcome, messages


@pytest.fixture(scope="module")
def acting_run(torch_one_thread):
    return _tapped(FedSlateConfig(**ACTING_ONLY))


def test_no_secret_key_crosses_and_the_server_holds_none(acting_run):
    """Attack: look for a secret key in every array of every message (both ways) and in every
    context the ServerApp's channel holds; try to decrypt what the server holds."""
    outcome, messages = acting_run
    found = 0
    for _op, _role, sent, reply in messages:
        for array in [*sent.values(), *reply.values()]:
            if array.dtype != np.uint8 or array.size < 1024:
                continue
            context = _contexts_in(array)
            if context is not None:
                found += 1
                assert not context.has_secret_key() and not context.is_private()
    assert found >= 2  # the platforms' public contexts (hello) and the relayed ones (keys)
    channel = outcome.channel
    assert isinstance(channel, CKKSModuleFusionChannel) and channel.remote
    assert channel.keys == {}  # no key party on the server
    for context in channel.server_contexts.values():
        assert not context.tenseal.has_secret_key() and not context.tenseal.is_private()
    # A ciphertext the server served (the acting forward's output under A's key): undecryptable.
    served = next(r for op, role, r, _ in messages if op == "choose" and role == 1)
    vector = ts.ckks_vector_from(channel.server_contexts["A"].tenseal, served["fused.0"].tobytes())
    with pytest.raises(ValueError, match="secret_key"):
        vector.decrypt()
    # No row in the clear: what the platforms send under ckks is bytes (ciphertexts, sealed
    # blobs, keys) and the public shapes.
    for op, role, _sent, reply in messages:
        for name, array in reply.items():
            assert array.dtype == np.uint8 or name.endswith(".shape"), (op, role, name)


def test_the_server_half_refuses_a_secret_key_in_what_a_platform_sends(torch_one_thread):
    """Attack: a platform's hello carries its secret key; the server half refuses the bytes."""
    config = FedSlateConfig(**SMALL)
    kwargs = ffs._ckks_setup(config)[2]
    from securefed.crypto.ckks import ckks_context

    secret = ckks_context(**kwargs)
    leaked = secret.serialize_secret()
    net = server_network(config)
    with pytest.raises(InsecureParameterError, match="secret key"):
        CKKSModuleFusionChannel(
            ("A", "B"), net, torch.optim.Adam(net.parameters()), members=2, seeds=SeedTree(0),
            config=ckks_config(config), public_contexts={"A": leaked, "B": leaked},
        )  # fmt: skip


def _hellos(run, stores):
    """The set-up's first two message rounds, honestly relayed: every node's nonce, then every
    node's signed keys over them."""
    nonces = {
        f"nonce.{r}": handle(run, r, stores[r], {"op": "nonce"}, {})[0]["nonce"] for r in stores
    }
    return {r: handle(run, r, stores[r], {"op": "hello"}, nonces)[0] for r in stores}


def _keys_message(hellos):
    public = {f"peer.{r}": hellos[r]["public"] for r in hellos}
    public |= {f"sig.{r}": hellos[r]["signature"] for r in hellos}
    for r in (1, 2):
        public |= {
            f"ckks.{r}": hellos[r]["ckks.public"],
            f"ckks.sig.{r}": hellos[r]["ckks.signature"],
        }
    return public


@pytest.fixture(scope="module")
def hellos(torch_one_thread):
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))
    stores = {r: {} for r in range(run.nodes)}
    return run, stores, _hellos(run, stores)


def test_a_substituted_or_relabelled_public_context_is_refused(hellos, torch_one_thread):
    """Attack: the server hands platform A (role 1) a CKKS public context of its own for B (so
    that A would encrypt its rows for B under a key the server holds), or B's context relabelled
    with A's signature, or A's own as B's: refused (each context is signed by its owner's relay
    identity, checked against the pinned registry)."""
    run, stores, hello = hellos
    _, _, kwargs, _ = ffs._ckks_setup(run.config)
    from securefed.crypto.ckks import ckks_context

    own = ckks_context(**kwargs).serialize_public()
    honest = _keys_message(hello)
    attacks = {
        "server's own key": honest | {"ckks.2": np.frombuffer(own, np.uint8).copy()},
        "A's context as B's": honest
        | {"ckks.2": hello[1]["ckks.public"], "ckks.sig.2": hello[1]["ckks.signature"]},
        "B's signature dropped": {k: v for k, v in honest.items() if k != "ckks.sig.2"},
    }
    for what, message in attacks.items():
        store = {k: dict(v) for k, v in stores[1].items()}
        with pytest.raises(SignatureError, match="CKKS public context"):
            handle(run, 1, store, {"op": "keys"}, message)
        assert not any(k.startswith("ckks.peer.") for k in store.get("arrays", {})), what
    store = {k: dict(v) for k, v in stores[1].items()}
    handle(run, 1, store, {"op": "keys"}, honest)  # the honest relay is taken
    assert "ckks.peer.2" in store["arrays"]


def test_without_the_signature_check_the_substituted_context_is_taken(
    hellos, monkeypatch, torch_one_thread
):
    """Control: with the registry's verification disabled, the server's own context is taken
    as B's, so platform A would encrypt its rows for B under the server's key."""
    from securefed.transport.secagg.signatures import KeyRegistry

    run, stores, hello = hellos
    _, _, kwargs, _ = ffs._ckks_setup(run.config)
    from securefed.crypto.ckks import ckks_context

    attacker = ckks_context(**kwargs)
    message = _keys_message(hello) | {
        "ckks.2": np.frombuffer(attacker.serialize_public(), np.uint8).copy()
    }
    monkeypatch.setattr(KeyRegistry, "verify", lambda *args, **kwargs: None)
    store = {k: dict(v) for k, v in stores[1].items()}
    handle(run, 1, store, {"op": "keys"}, message)
    party = ffs.CKKSPlatform(run.config, 0, SeedTree(0), store["arrays"], store["meta"])
    shape = (run.config.members, 1, run.config.num_candidates)
    rows = party.encrypt_rows("act", np.full(shape, 0.5), [1])
    stolen = ts.ckks_vector_from(attacker.tenseal, rows["act.1.0"].tobytes())
    np.testing.assert_allclose(np.array(stolen.decrypt())[: int(np.prod(shape))], 0.5, atol=1e-3)


def test_ciphertexts_labelled_for_another_key_and_extra_releases_are_refused(hellos):
    """Attack: the server hands A ciphertexts labelled for B's key (misrouted), or asks A to
    release more masked sums than the circuit's monomials (each would decrypt one more sum of
    the server's choosing): refused, naming why. (A relabelled label is not detected: CKKS
    ciphertexts carry no key identity, see docs/flower.md.)"""
    run, stores, _ = hellos
    cfg = run.config
    party_a = ffs.CKKSPlatform(
        cfg, 0, SeedTree(0), dict(stores[1]["arrays"]), dict(stores[1]["meta"])
    )
    party_b = ffs.CKKSPlatform(
        cfg, 1, SeedTree(0), dict(stores[2]["arrays"]), dict(stores[2]["meta"])
    )
    shape = (cfg.members, 1, cfg.num_candidates)
    rows = party_a.encrypt_rows("act", np.ones(shape, np.float32), [0])
    message = {"fused.0": rows["act.0.0"]}
    assert np.allclose(party_a.decrypt(message, {"ckks.key": party_a.key_id}, "fused", shape), 1)
    with pytest.raises(ValueError, match="misrouted"):
        party_a.decrypt(message, {"ckks.key": party_b.key_id}, "fused", shape)
    with pytest.raises(ValueError, match="above the CKKS channel's public bound"):
        party_a.encrypt_rows("act", np.full(shape, 1e3), [0])
    due = len(ffs.monomials(cfg.num_platforms, party_a.degree))
    extra = {f"masked.0.{k}": rows["act.0.0"] for k in range(due + 1)}
    with pytest.raises(ValueError, match="refusing"):
        party_a.release(extra, {"ckks.key": party_a.key_id}, shape)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"alignment": "item"}, "alignment 'item'"),
    ],
)
def test_what_the_ckks_wiring_does_not_carry_is_refused_by_name(changes, named):
    config = FedSlateConfig(**(SMALL | changes))
    assert named in flower_refusal(config)
    with pytest.raises(ValueError, match=named.replace("+", "\\+")):
        FedSlateFlowerRun(config)
    assert flower_refusal(FedSlateConfig(**SMALL)) is None


def _assert_equal_within_ckks(results, outcome, reference) -> None:
    """The same decisions (rewards exactly), the server's weights within the CKKS error (the
    tolerance of tests/test_fusion_ckks_fedslate.py against plaintext after one learning step:
    the nodes' flooding streams are their own, not the in-process channel's one stream)."""
    np.testing.assert_array_equal(results["simulator"]["rewards"], reference.episode_rewards)
    final = outcome.channel.module.state_dict()
    for name, value in reference.networks["server"].state_dict().items():
        np.testing.assert_allclose(final[name].numpy(), value.numpy(), atol=0.05, err_msg=name)
    assert outcome.learn_steps == reference.learn_steps == 1
    for platform in ("A", "B"):
        assert int(results[platform]["updates"]) == reference.updates[f"local_{platform}"]


@pytest.mark.slow
def test_ckks_on_flower_decides_as_the_in_process_ckks_run(tmp_path):
    """Acting, targets, Algorithms 1 and 2 through the message flow (about 6 s of CPU; slow:
    several times that in wall time on a loaded machine)."""
    config = FedSlateConfig(**SMALL)
    reference = run_fedslate(config)
    outcome = drive_in_process(FedSlateFlowerRun(config, output_dir=str(tmp_path)))
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)
    assert outcome.channel.handed_bytes["to_server"] > 0
    assert outcome.channel.handed_bytes["to_parties"] > 0


@pytest.mark.slow
def test_ckks_on_the_simulation_engine_decides_as_in_process(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from securefed.flower.simulation import run_in_simulation

    config = FedSlateConfig(**SMALL)
    reference = run_fedslate(config)
    run = FedSlateFlowerRun(config, output_dir=str(tmp_path))
    outcome = run_in_simulation(build_apps(run), run.nodes, SIMULATION_BACKEND)
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)
    assert outcome.message_bytes["down"] > 0 and outcome.message_bytes["up"] > 0


def _earlier_hellos(run, monkeypatch):
    """The set-up of an earlier run under the same enrolment: other nonces, other keys."""
    with monkeypatch.context() as patch:
        patch.setattr(ffs, "relay_nonce", lambda config, role, tree: bytes([role + 1]) * 32)
        return _hellos(run, {r: {} for r in range(run.nodes)})


def test_a_ckks_public_context_signed_in_an_earlier_run_is_refused(
    hellos, monkeypatch, torch_one_thread
):
    """Attack: the server kept platform B's signed CKKS public context (and, by a leaked
    ``Context.state``, its secret key) from an earlier run and hands it to A in a new run, so
    that A would encrypt for a key the server can open: refused, since each context is signed
    over the run's set-up nonces. Control: with the nonces left out of the signed message, the
    earlier run's context is taken."""
    run, stores, hello = hellos
    earlier = _earlier_hellos(run, monkeypatch)
    replayed = _keys_message(hello) | {
        "ckks.2": earlier[2]["ckks.public"],
        "ckks.sig.2": earlier[2]["ckks.signature"],
    }
    store = {k: dict(v) for k, v in stores[1].items()}
    with pytest.raises(SignatureError, match="CKKS public context"):
        handle(run, 1, store, {"op": "keys"}, replayed)
    assert not any(k.startswith("ckks.peer.") for k in store.get("arrays", {}))

    unbound = ffs.ckks_key_message
    monkeypatch.setattr(
        ffs, "ckks_key_message", lambda digest, role, public, transcript: unbound(
            digest, role, public, b""
        )
    )  # fmt: skip
    earlier = _earlier_hellos(run, monkeypatch)
    current = {r: {k: dict(v) for k, v in stores[r].items()} for r in stores}
    for r in current:  # this run's set-up signed again without the nonces
        current[r]["meta"].pop("transcript", None)
    nonces = {f"nonce.{r}": np.frombuffer(bytes.fromhex(current[r]["meta"]["nonce"]), np.uint8)
              for r in current}  # fmt: skip
    now = {r: handle(run, r, current[r], {"op": "hello"}, nonces)[0] for r in current}
    replayed = _keys_message(now) | {
        "ckks.2": earlier[2]["ckks.public"],
        "ckks.sig.2": earlier[2]["ckks.signature"],
    }
    handle(run, 1, current[1], {"op": "keys"}, replayed)
    assert "ckks.peer.2" in current[1]["arrays"]


def test_a_batch_other_than_the_runs_is_refused(hellos, torch_one_thread):
    """Attack: the server asks a platform for its rows of a one-state batch (its released sums
    would then be single rows): refused before any row is computed, naming the run's shape."""
    run, stores, hello = hellos
    store = {k: dict(v) for k, v in stores[1].items()}
    handle(run, 1, store, {"op": "keys"}, _keys_message(hello))
    cfg = run.config
    for shape in ((cfg.members, 1), (1, cfg.batch_size)):
        idx = np.zeros(shape, np.int64)
        request = {"op": "learn_rows", "updating": 0, "select": False}
        with pytest.raises(InsecureParameterError, match="not the run's"):
            handle(run, 1, {k: dict(v) for k, v in store.items()}, request, {"idx": idx})
