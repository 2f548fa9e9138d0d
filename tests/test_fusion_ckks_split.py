"""The CKKS channels split into a platform half (securefed.fusion.ckks_module.ModuleKeyParty,
ckks_packed.PackedKeyParty: keys, the party's own regions, encryption, decryption, releases) and
the server half (public contexts built from the bytes the parties send, the encrypted
evaluation): ciphertexts crossing as serialized bytes (``serialize_handovers``), as a Flower
message would carry them, give the in-process results within the stated CKKS error."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ts = pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import Flooding, InsecureParameterError  # noqa: E402
from securefed.fusion import ModuleFusionChannel  # noqa: E402
from securefed.fusion.ckks_module import (  # noqa: E402
    CKKSModuleConfig,
    CKKSModuleFusionChannel,
    ModuleKeyParty,
)
from securefed.fusion.ckks_packed import PackedCKKSModuleFusionChannel  # noqa: E402
from securefed.rl.fedslate import ServerNetwork  # noqa: E402

S, B, N = 3, 32, 10
EXACT = Flooding.unsafe_for_tests(0.0, 0.0)


def _net(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return ServerNetwork(S, 2, N, (16,), activation="polynomial", generator=generator)


def _packed(serialize: bool, net=None):
    net = _net() if net is None else net
    return PackedCKKSModuleFusionChannel(
        ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0),
        target=copy.deepcopy(net), members=S, seeds=SeedTree(3),
        config=CKKSModuleConfig(flooding=EXACT, circuit="packed", serialize_handovers=serialize),
    )  # fmt: skip


def _monomial(serialize: bool):
    net = _net()
    return CKKSModuleFusionChannel(
        ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0),
        target=copy.deepcopy(net), members=S, seeds=SeedTree(3),
        config=CKKSModuleConfig(flooding=EXACT, scale_bits=55, serialize_handovers=serialize),
    )  # fmt: skip


def _plain():
    net = _net()
    return ModuleFusionChannel(
        ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0),
        target=copy.deepcopy(net), members=S,
    )  # fmt: skip


def _q(rng):
    return {p: torch.from_numpy(rng.normal(0, 1, (S, B, N)).astype(np.float32)) for p in "AB"}


def _server_half(channel):
    """Every TenSEAL context the channel holds outside its parties' halves (``keys``)."""
    found = []
    for name, value in vars(channel).items():
        if name == "keys":
            continue
        values = value.values() if isinstance(value, dict) else [value]
        for v in values:
            context = getattr(v, "tenseal", v)
            if isinstance(context, ts.Context):
                found.append((name, context))
    return found


@pytest.mark.parametrize("build", [_packed, _monomial], ids=["packed", "monomials"])
def test_the_server_half_holds_no_secret_key(build, torch_one_thread):
    channel = build(True)
    held = _server_half(channel)
    assert {name for name, _ in held} == {"server_contexts"} and len(held) == 2
    for _, context in held:
        assert not context.is_private() and not context.has_secret_key()
    # The server's contexts are the parties' bytes, which hold no secret key.
    for name, party in channel.keys.items():
        assert channel.server_contexts[name].serialized == party.public_bytes()
        assert not ts.context_from(party.public_bytes()).is_private()


def test_a_party_whose_message_carries_its_secret_key_is_refused(monkeypatch, torch_one_thread):
    """Attack: a (buggy or tricked) platform puts its secret key into what it sends the
    server. The server half builds its context from those bytes and refuses them."""

    def leaking(self):
        return self._secret.tenseal.serialize(save_secret_key=True)

    monkeypatch.setattr(ModuleKeyParty, "public_bytes", leaking)
    with pytest.raises(InsecureParameterError, match="secret key"):
        _packed(True)


def test_the_server_cannot_decrypt_what_it_is_sent(torch_one_thread):
    """Attack: the server tries to decrypt the ciphertexts the parties hand it (bytes
    deserialized under its public context) and what it hands back."""
    channel = _packed(True)
    received, sent = [], []
    to_server, to_party = channel._to_server, channel._to_party
    channel._to_server = lambda v, p: received.append(to_server(v, p)) or received[-1]
    channel._to_party = lambda v, p: sent.append(to_party(v, p)) or sent[-1]
    channel.forward(_q(np.random.default_rng(1)), outputs=["A"], train=False)
    assert len(received) == 2 and len(sent) == 1 and isinstance(sent[0], bytes)
    for vector in received:
        with pytest.raises(ValueError, match="secret_key"):
            vector.decrypt()
    returned = ts.ckks_vector_from(channel.server_contexts["A"].tenseal, sent[0])
    with pytest.raises(ValueError, match="secret_key"):
        returned.decrypt()


@pytest.mark.parametrize("build", [_packed, _monomial], ids=["packed", "monomials"])
def test_serialized_handovers_equal_plaintext_within_the_stated_error(build, torch_one_thread):
    """Forward, backward and the optimiser step with every crossing serialized, against the
    plaintext channel (stated bounds, as tests/test_fusion_ckks_packed.py compares) and against
    the in-memory handovers (CKKS noise is not seeded: twice the stated bound)."""
    plain, wire, memory = _plain(), build(True), build(False)
    rng = np.random.default_rng(4)
    q = _q(rng)
    positions = {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    grad = torch.from_numpy(rng.uniform(-1, 1, (S, B, 3)).astype(np.float32)) / B
    bounds = wire.error_bounds()
    out = {}
    for name, channel in (("plain", plain), ("wire", wire), ("memory", memory)):
        fused = channel.forward(q, outputs=["B"], positions=positions)["B"].detach().numpy()
        dx = channel.backward({"B": grad}, recipients=["B"])["B"].numpy()
        out[name] = (fused, dx)
    for index, bound in ((0, bounds["output"]), (1, bounds["input_gradient"])):
        gap = np.abs(out["wire"][index] - out["plain"][index]).max(axis=(1, 2))
        assert np.all(gap <= bound)
        gap = np.abs(out["wire"][index] - out["memory"][index]).max(axis=(1, 2))
        assert np.all(gap <= 2 * bound)
    for w_plain, w_wire in zip(plain.module.parameters(), wire.module.parameters(), strict=True):
        np.testing.assert_allclose(w_wire.detach().numpy(), w_plain.detach().numpy(), atol=1e-5)
    # The bytes crossed: every ciphertext up and down, none in memory.
    assert wire.handed_bytes["to_server"] > 0 and wire.handed_bytes["to_parties"] > 0
    assert not memory.handed_bytes
    assert dict(wire.counts) == dict(memory.counts)


TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 1, "members": 2,
    "burn_in": 11, "learn_every": 12, "buffer_size": 16, "batch_size": 4, "local_hidden": (8,),
    "server_hidden": (4,), "seed": 0,  # seeded: the tests compare runs
}  # fmt: skip


def test_fedslate_with_serialized_handovers_decides_as_plaintext(monkeypatch, torch_one_thread):
    """A FedSlate run whose every ciphertext crosses as bytes (what Flower messages would carry)
    makes the plaintext run's decisions (equal rewards) and ends within the tolerance of
    tests/test_fusion_ckks_fedslate.py (server weights within 0.05 after one learning step)."""
    import dataclasses

    from securefed.rl import fedslate

    built = []
    config_of = fedslate.ckks_config

    def serialized(config):
        chosen = config_of(config)
        if chosen is None:  # the plaintext run
            return None
        built.append(dataclasses.replace(chosen, serialize_handovers=True))
        return built[-1]

    monkeypatch.setattr(fedslate, "ckks_config", serialized)
    config = fedslate.FedSlateConfig(**TINY, fusion="ckks", activation="polynomial")
    result = fedslate.run_fedslate(config)
    assert built and built[0].circuit == "packed"
    plain = fedslate.run_fedslate(fedslate.FedSlateConfig(**TINY, activation="polynomial"))
    np.testing.assert_allclose(result.episode_rewards, plain.episode_rewards)
    final = {n: p.detach() for n, p in result.networks["server"].named_parameters()}
    for name, value in plain.networks["server"].named_parameters():
        np.testing.assert_allclose(final[name].numpy(), value.detach().numpy(), atol=0.05)
