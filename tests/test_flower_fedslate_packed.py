"""FedSlate on Flower under ``fusion="ckks"`` in the packed circuit (one hidden server layer, or
the linear variant): the owner's regions ``P`` (encrypted with its secret key), the other
platform's ``Q`` under the owner's public key, the owner's ``G`` and its clear releases cross as
messages (securefed.rl.flower_fedslate, PackedCKKSModuleFusionChannel.serve_forward /
serve_backward / finish_backward).

Attacks first: the server refuses a platform's public context that holds a secret key or is
weaker than the configuration (ring, modulus chain, scale), naming the platform, and so does a
platform for a peer's signed context; a platform refuses to release more masked products than
the packed circuit's or to release twice; no secret key crosses. Then the equality with the
in-process packed run (the same rewards, the weights within the CKKS error)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ts = pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")
pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_flower_fedslate_ckks import _hellos, _keys_message  # noqa: E402

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import InsecureParameterError, ckks_context  # noqa: E402
from securefed.fusion.ckks_module import CKKSModuleFusionChannel  # noqa: E402
from securefed.fusion.ckks_packed import PackedCKKSModuleFusionChannel  # noqa: E402
from securefed.rl import flower_fedslate as ffs  # noqa: E402
from securefed.rl.fedslate import FedSlateConfig, ckks_config, run_fedslate, server_network  # noqa: E402
from securefed.rl.flower_fedslate import (  # noqa: E402
    FedSlateFlowerRun,
    drive_in_process,
    flower_refusal,
    handle,
    in_process_exchange,
    node_results,
    run_server,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Two platforms (A with rewards, B without), 2 members; one hidden server layer with the
# quadratic activation: degree 2, the packed circuit (ring 8192, chain [60, 49, 49, 60]). One
# learning step at the end of the episode (targets, Algorithm 1, Algorithm 2).
SMALL = {
    "num_candidates": 4, "slate_size": 2, "steps_per_platform": 4, "episodes": 1, "members": 2,
    "burn_in": 3, "learn_every": 4, "buffer_size": 8, "batch_size": 2, "local_hidden": (4,),
    "server_hidden": (2,), "activation": "polynomial", "fusion": "ckks", "seed": 0,
}  # fmt: skip


def _context(degree: int, chain, scale_bits: int, *, secret: bool = False) -> bytes:
    context = ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=list(chain))
    context.global_scale = 2.0**scale_bits
    context.generate_relin_keys()
    return context.serialize(save_secret_key=secret)


# What a platform might send instead of the configured public context (ring 8192, chain
# [60, 49, 49, 60], scale 2^49, public and relinearization keys), and the parameter named.
WEAK = {
    "its secret key": (lambda: _context(8192, (60, 49, 49, 60), 49, secret=True), "secret key"),
    "a smaller ring": (lambda: _context(4096, (40, 20, 20, 29), 20), "poly modulus degree 4096"),
    "a shorter chain": (lambda: _context(8192, (60, 40, 60), 40), "coefficient moduli"),
    "smaller primes": (lambda: _context(8192, (60, 40, 40, 60), 49), "coefficient moduli"),
    "a smaller scale": (lambda: _context(8192, (60, 49, 49, 60), 40), "scale"),
}


DP = {"fusion": "ckks+dp", "dp_epsilon": 8.0}


def test_the_packed_circuit_and_ckks_dp_are_carried_on_flower():
    for changes in (
        {},
        {"variant": "linear", "server_hidden": (2, 2)},
        {"variant": "fedq"},
        DP,
        DP | {"server_hidden": (2, 2)},
    ):
        config = FedSlateConfig(**(SMALL | changes))
        assert flower_refusal(config) is None
        FedSlateFlowerRun(config)
    assert ckks_config(FedSlateConfig(**SMALL)).circuit == "packed"


@pytest.mark.parametrize("what", sorted(WEAK))
def test_the_server_refuses_a_weaker_public_context_by_name(what, torch_one_thread):
    """Attack: platform B's hello carries a public context with its secret key, or weaker than
    the configuration fixes (a smaller ring, a shorter chain or smaller primes, a smaller
    scale); the ServerApp refuses it before building its channel, naming B and the parameter."""
    make, named = WEAK[what]
    weak = np.frombuffer(make(), np.uint8).copy()
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))
    honest = in_process_exchange(run, {}, {})

    def tampering(op, requests):
        replies = honest(op, requests)
        if op == "hello":
            arrays, config = replies[2]
            replies[2] = (arrays | {"ckks.public": weak}, config)
        return replies

    with pytest.raises(InsecureParameterError, match=f"party 'B'.*{named}"):
        run_server(run, tampering)


def test_the_monomial_server_half_refuses_a_weaker_context_too(torch_one_thread):
    """Attack on the monomial circuit's server half (ring 16384 configured): a context at ring
    8192 is refused, naming the party."""
    config = FedSlateConfig(**(SMALL | {"server_hidden": (2, 2)}))
    _, _, kwargs, params = ffs._ckks_setup(config)
    honest = ckks_context(**kwargs).public().serialized
    weak = _context(8192, (60, 49, 49, 60), 49)
    net = server_network(config)
    with pytest.raises(InsecureParameterError, match=r"party 'B'.*poly modulus degree 8192"):
        CKKSModuleFusionChannel(
            ("A", "B"), net, torch.optim.Adam(net.parameters()), members=2, seeds=SeedTree(0),
            config=ckks_config(config), public_contexts={"A": honest, "B": weak},
        )  # fmt: skip
    assert params.poly_modulus_degree == 16384


@pytest.fixture(scope="module")
def keyed(torch_one_thread):
    """The set-up honestly relayed: every node holds its peers' keys."""
    run = FedSlateFlowerRun(FedSlateConfig(**SMALL))
    stores = {r: {} for r in range(run.nodes)}
    hellos = _hellos(run, stores)
    message = _keys_message(hellos)
    before = {r: {k: dict(v) for k, v in stores[r].items()} for r in stores}
    for r in stores:
        handle(run, r, stores[r], {"op": "keys"}, message)
    return run, stores, before, hellos


def test_a_platform_refuses_a_signed_but_weaker_peer_context(keyed, torch_one_thread):
    """Attack: platform B signs (with its own relay identity: the signature verifies) a context
    at a smaller ring; A refuses it by name instead of encrypting its rows for B under it."""
    run, _, before, hellos = keyed
    keys, registry = ffs._seeded_relay_keys(int(run.config.seed), run.nodes)
    store = {k: dict(v) for k, v in before[1].items()}
    transcript = bytes.fromhex(store["meta"]["transcript"])
    weak = _context(4096, (40, 20, 20, 29), 20)
    signature = keys[2].sign(ffs.ckks_key_message(registry.digest, 2, weak, transcript))
    message = _keys_message(hellos) | {
        "ckks.2": np.frombuffer(weak, np.uint8).copy(),
        "ckks.sig.2": np.frombuffer(signature, np.uint8).copy(),
    }
    with pytest.raises(InsecureParameterError, match=r"platform 1.*poly modulus degree 4096"):
        handle(run, 1, store, {"op": "keys"}, message)


def _platform(run, stores, role):
    store = stores[role]
    return ffs.CKKSPlatform(
        run.config, role - 1, SeedTree(0), dict(store["arrays"]), dict(store["meta"])
    )


def test_a_platform_releases_only_the_packed_circuits_sums_once(keyed, torch_one_thread):
    """Attack: the server hands A two masked products of a chunk to release (each would decrypt
    one more sum of its choosing), or asks for a packed release without a loss since the last
    one (a second flooded release of the same sums averages the flooding away): refused."""
    run, stores, _, _ = keyed
    cfg = run.config
    party = _platform(run, stores, 1)
    shape = (cfg.members, cfg.batch_size, cfg.num_candidates)
    g, x0 = np.full(shape, 0.1), np.full(shape, 0.5)
    product = party.encrypt_gradient(g, x0)["grad.0"]
    label = {"ckks.key": party.key_id}
    out = party.release_packed({"masked.0.0": product}, label, g, x0)
    assert sorted(out) == ["own.0.0", "own.0.1", "own.0.2", "released.0.0"]
    per_member = cfg.batch_size * cfg.num_candidates
    # The sums of g and g x0 per member, flooded: near 0.1 * 8 and 0.05 * 8.
    np.testing.assert_allclose(out["own.0.0"], 0.1 * per_member, atol=0.1)
    np.testing.assert_allclose(out["own.0.1"], 0.05 * per_member, atol=0.1)
    extra = {"masked.0.0": product, "masked.0.1": product}
    with pytest.raises(ValueError, match="packed circuit has 1: refusing"):
        party.release_packed(extra, label, g, x0)
    with pytest.raises(ValueError, match="misrouted"):
        party.release_packed({"masked.0.0": product}, {"ckks.key": "0" * 16}, g, x0)
    request = {"op": "local_step"}
    with pytest.raises(ValueError, match="without a loss"):
        handle(run, 1, {k: dict(v) for k, v in stores[1].items()}, request, label)


def _contexts_in(blob: np.ndarray):
    try:
        return ts.context_from(np.asarray(blob, np.uint8).tobytes())
    except Exception:
        return None


def _assert_equal_within_ckks(results, outcome, reference) -> None:
    """The same decisions (rewards exactly), the weights within the CKKS error (the tolerance
    of tests/test_flower_fedslate_ckks.py: the nodes' flooding streams are their own, so the
    noise draws differ)."""
    np.testing.assert_array_equal(results["simulator"]["rewards"], reference.episode_rewards)
    final = outcome.channel.module.state_dict()
    for name, value in reference.networks["server"].state_dict().items():
        np.testing.assert_allclose(final[name].numpy(), value.numpy(), atol=0.05, err_msg=name)
    assert outcome.learn_steps == reference.learn_steps == 1
    for platform in ("A", "B"):
        assert int(results[platform]["updates"]) == reference.updates[f"local_{platform}"]
        local = reference.networks[f"local_{platform}"].state_dict()
        for name, value in local.items():
            np.testing.assert_allclose(
                results[platform][f"local.{name}"], value.numpy(), atol=0.05, err_msg=name
            )


def _run(config, tmp_path):
    messages = []

    def tap(op, role, sent, reply):
        messages.append((op, role, dict(sent), dict(reply)))

    outcome = drive_in_process(FedSlateFlowerRun(config, output_dir=str(tmp_path)), tap=tap)
    return outcome, messages


def test_packed_ckks_on_flower_decides_as_the_in_process_run(tmp_path):
    """Acting, targets, Algorithms 1 and 2 in the packed circuit through the message flow
    (about 6 s of CPU each way), and what crossed: no secret key, no row in the clear, the
    server's channel without a key party."""
    config = FedSlateConfig(**SMALL)
    reference = run_fedslate(config)
    outcome, messages = _run(config, tmp_path)
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)
    channel = outcome.channel
    assert isinstance(channel, PackedCKKSModuleFusionChannel) and channel.remote
    assert channel.keys == {}
    assert channel.handed_bytes["to_server"] > 0 and channel.handed_bytes["to_parties"] > 0
    found = 0
    for op, role, sent, reply in messages:
        for array in [*sent.values(), *reply.values()]:
            if array.dtype == np.uint8 and array.size >= 1024:
                context = _contexts_in(array)
                if context is not None:
                    found += 1
                    assert not context.has_secret_key() and not context.is_private()
        for name, array in reply.items():
            assert (
                array.dtype == np.uint8
                or name.endswith(".shape")
                or name.startswith(("own.", "released."))
            ), (op, role, name)
    assert found >= 2
    # The only numbers a platform releases: one per member segment and monomial, flooded.
    releases = [r for op, _, _, r in messages if op == "local_step" and r]
    assert len(releases) == 2  # A's Algorithm 1, B's Algorithm 2
    for reply in releases:
        assert sorted(reply) == ["own.0.0", "own.0.1", "own.0.2", "released.0.0"]
        assert reply["released.0.0"].shape == (3 * config.members,)


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes", [{"variant": "linear", "server_hidden": (2, 2)}, {"variant": "fedq"}]
)
def test_the_linear_and_fedq_variants_decide_as_in_process(changes, tmp_path):
    """The linear ablation (degree 1: no squares) and FedQ (no cross terms: no masked exchange,
    the owner's own sums only), about 10 s each."""
    config = FedSlateConfig(**(SMALL | changes))
    reference = run_fedslate(config)
    outcome, _ = _run(config, tmp_path)
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)


@pytest.mark.slow
def test_packed_ckks_on_the_simulation_engine_decides_as_in_process(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    from securefed.flower.simulation import run_in_simulation

    config = FedSlateConfig(**SMALL)
    reference = run_fedslate(config)
    run = FedSlateFlowerRun(config, output_dir=str(tmp_path))
    backend = {
        "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
    }
    outcome = run_in_simulation(ffs.build_apps(run), run.nodes, backend)
    _assert_equal_within_ckks(node_results(tmp_path, config), outcome, reference)


def test_under_ckks_dp_every_row_is_noised_and_clamped_before_it_is_encrypted(
    monkeypatch, torch_one_thread
):
    """Attack (what the server could decrypt if it held a key): under ckks+dp every value a
    platform encrypts is its released row (clipped and noised, every entry clamped to the
    public bound and divided by it: within [-1, 1]), counted in its ledger, never the raw
    Q-values; the server's channel is built with the clamp's bounds, as in process."""
    config = FedSlateConfig(**(SMALL | DP | {"steps_per_platform": 2, "burn_in": 50}))
    encrypted, raw = [], []
    encrypt = ffs.CKKSPlatform.encrypt_rows
    act = ffs.PlatformNode.act

    def spy(self, prefix, values, outputs):
        encrypted.append(np.array(values, np.float64))
        return encrypt(self, prefix, values, outputs)

    def raw_act(self):
        raw.append(self.local.numpy_forward(self.x[:, None, :]))
        return act(self)

    monkeypatch.setattr(ffs.CKKSPlatform, "encrypt_rows", spy)
    monkeypatch.setattr(ffs.PlatformNode, "act", raw_act)
    stores = {}
    outcome = drive_in_process(FedSlateFlowerRun(config), stores=stores)
    rounds = config.episodes * config.steps_per_platform
    assert len(encrypted) == len(raw) == rounds * config.num_platforms
    for value, clean in zip(encrypted, raw, strict=True):
        assert np.abs(value).max() <= 1.0
        assert not np.allclose(value, clean / np.abs(clean).max(), atol=1e-3)
    for role in (1, 2):
        released = stores[role]["meta"]["node"]["released"]
        assert released == {"act:input": config.members * rounds}
    channel = outcome.channel
    assert channel.config.value_bound == 1.0 and channel.view.channel == "ckks+dp"


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [(2,), (2, 2)], ids=["packed", "monomials"])
def test_ckks_dp_on_flower_decides_and_spends_as_in_process(hidden, tmp_path):
    """ckks+dp through the message flow against the in-process run, both circuits (about
    25 s each): the same rewards, the weights within the CKKS error, and each platform's
    ledger (on its node) spent what the in-process ledger spent."""
    config = FedSlateConfig(**(SMALL | DP | {"server_hidden": hidden}))
    reference = run_fedslate(config)
    outcome, _ = _run(config, tmp_path)
    results = node_results(tmp_path, config)
    _assert_equal_within_ckks(results, outcome, reference)
    spent = reference.fusion_view.public["dp"]["epsilon_spent"]
    for platform in ("A", "B"):
        assert float(results[platform]["epsilon"]) == pytest.approx(spent[platform])
        assert float(results[platform]["epsilon"]) <= DP["dp_epsilon"]
    assert outcome.channel.view.channel == "ckks+dp"
