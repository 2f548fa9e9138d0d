"""The packed CKKS circuit (securefed.fusion.ckks_packed): the same function, training step and
views as the monomial circuit and plaintext, within the stated CKKS error, at fewer operations."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ts = pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import (  # noqa: E402
    Flooding,
    decryption_error_bound,
    symmetric_twin,
)
from securefed.fusion import ModuleFusionChannel, build_fusion_channel  # noqa: E402
from securefed.fusion.ckks_module import CKKSModuleConfig, CKKSModuleFusionChannel  # noqa: E402
from securefed.fusion.ckks_packed import (  # noqa: E402
    PackedCKKSModuleFusionChannel,
    packed_sum_error_bound,
)
from securefed.fusion.expansion import monomials  # noqa: E402
from securefed.fusion.registry import FusionNeeds  # noqa: E402
from securefed.rl.fedslate import ServerNetwork  # noqa: E402

S, B, N = 3, 32, 10  # FedSlate's (10, 3) learning batch: 3 members, 32 rows, 10 candidates
EXACT = Flooding.unsafe_for_tests(0.0, 0.0)


def _server(hidden=(16,), seed=0, parties=2):
    generator = torch.Generator().manual_seed(seed)
    return ServerNetwork(S, parties, N, hidden, activation="polynomial", generator=generator)


def _channels(flooding=EXACT, hidden=(16,)):
    """The same server behind plaintext, the monomial and the packed circuit (SGD, lr 1)."""
    nets = [_server(hidden) for _ in range(3)]
    plain = ModuleFusionChannel(
        ("A", "B"), nets[0], torch.optim.SGD(nets[0].parameters(), lr=1.0),
        target=copy.deepcopy(nets[0]), members=S,
    )  # fmt: skip
    monomial = CKKSModuleFusionChannel(
        ("A", "B"), nets[1], torch.optim.SGD(nets[1].parameters(), lr=1.0),
        target=copy.deepcopy(nets[1]), members=S, seeds=SeedTree(3),
        config=CKKSModuleConfig(flooding=flooding, scale_bits=55),
    )  # fmt: skip
    packed = PackedCKKSModuleFusionChannel(
        ("A", "B"), nets[2], torch.optim.SGD(nets[2].parameters(), lr=1.0),
        target=copy.deepcopy(nets[2]), members=S, seeds=SeedTree(3),
        config=CKKSModuleConfig(flooding=flooding, circuit="packed"),
    )  # fmt: skip
    return plain, monomial, packed


@pytest.fixture(scope="module")
def channels(torch_one_thread):
    return _channels()


def _q(rng, scale=1.0):
    return {p: torch.from_numpy(rng.normal(0, scale, (S, B, N)).astype(np.float32)) for p in "AB"}


def _exact_sums(q, positions, grad, owner="B", other="A"):
    full = np.zeros((S, B, N))
    np.add.at(full, (np.arange(S)[:, None, None], np.arange(B)[None, :, None],
                     positions.numpy()), grad.numpy().astype(np.float64))  # fmt: skip
    x = np.stack([q[owner].numpy(), q[other].numpy()], axis=-1).astype(np.float64)
    return np.stack(
        [(full * np.prod(x ** np.array(m), axis=-1)).sum(axis=(1, 2)) for m in monomials(2, 2)],
        axis=1,
    )


def test_the_symmetric_twin_encrypts_under_the_same_key_with_a_smaller_error(channels):
    _, _, packed = channels
    key = packed.keys["A"]._secret
    twin = symmetric_twin(key)
    values = np.random.default_rng(0).uniform(-1, 1, 2000)
    fresh = ts.CKKSVector(data=ts._ts_cpp.CKKSVector(twin.data, values.tolist()))
    own_error = np.abs(key.decrypt_vector(fresh, len(values)) - values).max()
    public_error = np.abs(key.decrypt_vector(key.encrypt_vector(values), len(values)) - values)
    # Both within their stated bounds; the secret-key error bound is far below the public one.
    assert own_error <= packed.fresh_own and public_error.max() <= packed.fresh_public
    assert packed.fresh_own < packed.fresh_public / 20
    assert packed.fresh_own == decryption_error_bound(
        type(packed.params)(8192, (60, 49, 49, 60), 49, "symmetric"), 1
    )
    # What the server holds cannot decrypt the owner's ciphertext.
    fresh.link_context(packed.server_contexts["A"].tenseal)
    with pytest.raises(ValueError, match="secret_key"):
        fresh.decrypt()
    with pytest.raises(ValueError, match="symmetric"):
        symmetric_twin(type(key)(type(packed.params)(8192, (60, 40, 40, 60), 40, "symmetric")))


def test_the_packed_forward_equals_plaintext_and_the_monomial_circuit(channels):
    """The stated bound is the error model of ckks_packed (each fresh encryption, encoding,
    rescaling adding its own bound at 2^49, the re-randomizing noise its 2^-40 tail): the
    measured gap must stay within it, and the bound itself must be small (< 1e-4)."""
    plain, monomial, packed = channels
    assert packed.params.coeff_mod_bit_sizes == (60, 49, 49, 60)
    assert packed.params.poly_modulus_degree == 8192
    rng = np.random.default_rng(2)
    q = _q(rng)
    bounds = packed.error_bounds()
    assert bounds["output"].max() < 1e-4
    clear = plain.forward(q, outputs=["A", "B"], train=False)
    before = dict(packed.counts)
    encrypted = packed.forward(q, outputs=["A", "B"], train=False)
    other = monomial.forward(q, outputs=["A", "B"], train=False)
    for p in "AB":
        gap = np.abs(encrypted[p].numpy() - clear[p].numpy()).max(axis=(1, 2))
        assert np.all(gap <= bounds["output"])
        np.testing.assert_allclose(encrypted[p].numpy(), other[p].numpy(), atol=1e-4)
    # Two products and three plaintext products per output, one ciphertext per party.
    done = {k: packed.counts[k] - before.get(k, 0) for k in packed.counts}
    assert done["cipher_mul"] == 4 and done["plain_mul"] == 6 and done["encrypt"] == 2
    assert done["encrypt_own"] == 2 and done["rerandomize"] == 2
    acting = packed.forward({p: v.numpy()[:, :1] for p, v in q.items()}, train=False)
    assert isinstance(acting["A"], np.ndarray) and acting["A"].shape == (S, 1, N)


def test_the_packed_training_step_equals_plaintext_within_the_stated_error(torch_one_thread):
    plain, monomial, packed = _channels()
    rng = np.random.default_rng(4)
    q = _q(rng)
    positions = {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    grad = torch.from_numpy(rng.uniform(-1, 1, (S, B, 3)).astype(np.float32)) / B
    bounds = packed.error_bounds()
    for channel in (plain, monomial, packed):
        channel.forward(q, outputs=["B"], positions=positions)
    dx = {
        name: channel.backward({"B": grad}, recipients=["B"])["B"].numpy()
        for name, channel in (("plain", plain), ("monomial", monomial), ("packed", packed))
    }
    gap = np.abs(dx["packed"] - dx["plain"]).max(axis=(1, 2))
    assert np.all(gap <= bounds["input_gradient"])
    np.testing.assert_allclose(dx["packed"], dx["monomial"], atol=1e-5)
    # One masked exchange released the three sums that involve A; B released the others.
    assert packed.counts["exchange"] == 1 and monomial.counts["exchange"] == 6
    exact = _exact_sums(q, positions["B"], grad)
    bound = packed_sum_error_bound(packed.fresh_own, packed.fresh_public, 8.0, 1.0, B * N)
    assert np.abs(packed.last_sums - exact).max() <= bound
    np.testing.assert_allclose(packed.last_sums, monomial.last_sums, atol=1e-6)
    for w_plain, w_packed in zip(
        plain.module.parameters(), packed.module.parameters(), strict=True
    ):
        np.testing.assert_allclose(w_packed.detach().numpy(), w_plain.detach().numpy(), atol=1e-5)


def test_the_packed_flooding_is_below_the_2_55_monomial_one_and_refuses_less(torch_one_thread):
    """At FedSlate's Q-value bound (64) the error of a released sum is dominated by
    ``|x_1^2| <= 4096`` times the owner's fresh error: encrypted with its secret key, that is
    about 40 times below the public-key error, so at ring 8192 and 2^49 the flooding std is below
    the monomial circuit's at ring 16384 and 2^55 (at a bound of 8 it is about 4 times above)."""
    monomial = _channels(flooding=Flooding(std=None, security_bits=20))[1]
    net = _server()
    packed = PackedCKKSModuleFusionChannel(
        ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0), members=S,
        seeds=SeedTree(3), config=CKKSModuleConfig(value_bound=64.0, circuit="packed"),
    )  # fmt: skip
    bound, std = packed.flooding_std(B * N)
    assert std == pytest.approx(bound * 2 ** ((20 - 1) / 2))
    assert bound == packed_sum_error_bound(packed.fresh_own, packed.fresh_public, 64.0, 1.0, B * N)
    wide = CKKSModuleFusionChannel(
        ("A", "B"), _server(), torch.optim.SGD(_server().parameters(), lr=1.0), members=S,
        seeds=SeedTree(3), config=CKKSModuleConfig(value_bound=64.0, scale_bits=55),
    )  # fmt: skip
    assert std < wide.flooding_std(B * N)[1]
    assert monomial.flooding_std(B * N)[1] < packed.flooding_std(B * N)[1]
    with pytest.raises(Exception, match="below the floor"):
        _channels(flooding=Flooding(std=1e-12))[2].flooding_std(B * N)
    assert packed.masks.bound == 2.0**16


def test_a_repeated_training_inquiry_reuses_its_ciphertexts_until_the_weights_move(channels):
    _, _, packed = channels
    rng = np.random.default_rng(6)
    q = _q(rng)
    select = packed.forward(q, outputs=["B"], train=False, tag="select")["B"]
    before = dict(packed.counts)
    positions = {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    learn = packed.forward(q, outputs=["B"], positions=positions, tag="learn")["B"]
    np.testing.assert_array_equal(
        learn.numpy(), np.take_along_axis(select.numpy(), positions["B"].numpy(), axis=-1)
    )
    assert packed.counts["repeat"] == before.get("repeat", 0) + 1
    assert packed.counts["encrypt"] == before["encrypt"]
    packed.backward({"B": torch.zeros(S, B, 3) + 1e-3}, recipients=["B"])
    # The weights moved: the same vectors are encrypted and evaluated afresh.
    packed.forward(q, outputs=["B"], positions=positions)
    assert packed.counts["repeat"] == before.get("repeat", 0) + 1
    assert packed.counts["encrypt"] == before["encrypt"] + 1
    packed.backward({"B": torch.zeros(S, B, 3) + 1e-3}, recipients=["B"])
    # Changed vectors are never a repeat.
    packed.forward(q, outputs=["B"], train=False)
    q["A"] = q["A"] + 1e-3
    packed.forward(q, outputs=["B"], positions=positions)
    assert packed.counts["repeat"] == before.get("repeat", 0) + 1
    packed.backward({"B": torch.zeros(S, B, 3)}, recipients=["B"])


def test_what_the_packed_circuit_cannot_serve_is_refused(torch_one_thread):
    deep = _server(hidden=(4, 4))
    with pytest.raises(ValueError, match="degree <= 2"):
        PackedCKKSModuleFusionChannel(
            ("A", "B"), deep, torch.optim.SGD(deep.parameters(), lr=1.0), members=S,
            seeds=SeedTree(0), config=CKKSModuleConfig(circuit="packed"),
        )  # fmt: skip
    three = _server(parties=3)
    with pytest.raises(ValueError, match="two parties"):
        PackedCKKSModuleFusionChannel(
            ("A", "B", "C"), three, torch.optim.SGD(three.parameters(), lr=1.0), members=S,
            seeds=SeedTree(0), config=CKKSModuleConfig(circuit="packed"),
        )  # fmt: skip
    with pytest.raises(ValueError, match="circuit must be one of"):
        CKKSModuleConfig(circuit="diagonal")
    # The registry builds the packed circuit when the config names it.
    net = _server()
    needs = FusionNeeds(members=S, activation="polynomial", optimiser="sgd", elementwise=True)
    channel = build_fusion_channel(
        "ckks", ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0), needs,
        seeds=SeedTree(0), ckks_config=CKKSModuleConfig(circuit="packed"),
    )  # fmt: skip
    assert isinstance(channel, PackedCKKSModuleFusionChannel)
    assert channel.view.public["circuit"] == "packed"


def test_outputs_beyond_the_deepest_level_are_refused_before_evaluation(torch_one_thread):
    net = _server()
    with torch.no_grad():
        net.mlp.weights[0].mul_(40.0)  # quadratic coefficients x 1600
    packed = PackedCKKSModuleFusionChannel(
        ("A", "B"), net, torch.optim.SGD(net.parameters(), lr=1.0), members=S,
        seeds=SeedTree(0), config=CKKSModuleConfig(circuit="packed", output_shift_bits=0),
    )  # fmt: skip
    q = _q(np.random.default_rng(7))
    with pytest.raises(ValueError, match="raise output_shift_bits"):
        packed.forward(q, outputs=["A"], train=False)
    assert packed.counts["encrypt"] == 0


def test_an_announced_training_forward_joins_the_target_forward_in_one_ciphertext(
    torch_one_thread,
):
    """FedSlate's learning step sends A's training Q-values ahead of the targets' forward:
    both evaluate in one ciphertext (regions 0-2 the training forward, region 3 the target's),
    the training forward repeats it, and everything stays within the stated bounds of the
    separate forwards. What the owner does not read of a returned ciphertext (regions 1-2 of
    a forward: rounding errors; region 3 of the joined input gradient: its own fresh error
    times the target's derivative) is flooded by the re-randomizing noise's hiding std."""
    plain, _, packed = _channels()
    rng = np.random.default_rng(8)
    grad = torch.from_numpy(rng.uniform(-1, 1, (S, B, 3)).astype(np.float32)) / B
    q0, positions = _q(rng), {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    for channel in (plain, packed):  # one step, so that online and target differ
        channel.forward(q0, outputs=["B"], positions=positions)
        channel.backward({"B": grad}, recipients=["B"])
    q, q_next = _q(rng), _q(rng)
    target_bound, online_bound = packed.error_bounds("target"), packed.error_bounds()
    handed = []
    to_party = packed._to_party
    packed._to_party = lambda vector, party: handed.append(vector) or to_party(vector, party)
    before = dict(packed.counts)
    packed.announce(q, outputs=["B"])
    target = packed.forward(q_next, outputs=["B"], network="target", train=False)["B"]
    clear = plain.forward(q_next, outputs=["B"], network="target", train=False)["B"]
    gap = np.abs(target.numpy() - clear.numpy()).max(axis=(1, 2))
    assert np.all(gap <= target_bound["output"])
    learn = packed.forward(q, outputs=["B"], positions=positions)["B"]
    clear = plain.forward(q, outputs=["B"], positions=positions)["B"]
    gap = np.abs(learn.numpy() - clear.numpy()).max(axis=(1, 2))
    assert np.all(gap <= online_bound["output"])
    done = {k: packed.counts[k] - before.get(k, 0) for k in packed.counts}
    assert done["joined"] == 1 and done["repeat"] == 1
    assert done["encrypt"] == 1 and done["encrypt_own"] == 1 and done["rerandomize"] == 1
    dx = packed.backward({"B": grad}, recipients=["B"])["B"].numpy()
    del packed._to_party
    dx_clear = plain.backward({"B": grad}, recipients=["B"])["B"].numpy()
    assert np.all(np.abs(dx - dx_clear).max(axis=(1, 2)) <= online_bound["input_gradient"])
    bound = packed_sum_error_bound(packed.fresh_own, packed.fresh_public, 8.0, 1.0, B * N)
    assert np.abs(packed.last_sums - _exact_sums(q, positions["B"], grad)).max() <= bound
    for w_plain, w_packed in zip(
        plain.module.parameters(), packed.module.parameters(), strict=True
    ):
        np.testing.assert_allclose(w_packed.detach().numpy(), w_plain.detach().numpy(), atol=1e-5)
    # Handed to B: the joined forward, the masked exchange, the input gradient.
    n, hiding = S * B * N, packed._hiding_std()
    assert hiding == 2.0**-4
    forward, _, gradient = (packed.keys["B"].decrypt_returned(v)[: 4 * n] for v in handed)
    for values, unread in ((forward, slice(n, 3 * n)), (gradient, slice(n, 4 * n))):
        assert 0.9 * hiding < values[unread].std() < 1.1 * hiding
    np.testing.assert_allclose(gradient[:n] * 2**packed.shift, dx.reshape(-1), rtol=1e-5, atol=1e-9)


def test_an_announcement_that_does_not_fit_is_dropped(channels):
    _, _, packed = channels
    rng = np.random.default_rng(9)
    q, other = _q(rng), _q(rng)
    before = dict(packed.counts)
    # A training forward next: nothing to join; the announcement is gone afterwards.
    packed.announce(q, outputs=["B"])
    packed.forward(q, outputs=["B"])
    packed.backward({"B": torch.zeros(S, B, N)}, recipients=["B"])
    packed.forward(q, outputs=["A"], network="target", train=False)
    assert packed.counts["joined"] == before.get("joined", 0)
    # Joined, but the training forward brings other vectors: evaluated afresh.
    packed.announce(q, outputs=["B"])
    packed.forward(q, outputs=["B"], network="target", train=False)
    assert packed.counts["joined"] == before.get("joined", 0) + 1
    encrypted = packed.counts["encrypt"]
    packed.forward(other, outputs=["B"])
    assert packed.counts["encrypt"] == encrypted + 1
    packed.backward({"B": torch.zeros(S, B, N)}, recipients=["B"])
    with pytest.raises(ValueError, match="outputs must name"):
        packed.announce(q, outputs=["C"])


def test_every_returned_ciphertext_is_relinearized_so_re_randomization_covers_it_whole(
    torch_one_thread,
):
    """Attack on circuit privacy: a size-3 product's third component (the inputs' ``c1``
    components times the server's coefficients) is not touched by adding a fresh size-2
    re-randomizer, so the key holder, who knows its own encryption randomness, would receive
    it as the server computed it. Every ciphertext the server hands a party must have two
    components; a server context that skips relinearization is refused at the handover."""
    _, _, packed = _channels()
    handed = []
    to_party = packed._to_party

    def watch(vector, party):
        handed.append(_components(vector))
        return to_party(vector, party)

    packed._to_party = watch
    rng = np.random.default_rng(5)
    q = _q(rng)
    packed.forward(q, outputs=["A", "B"], train=False)
    assert handed and set(handed) == {2}
    # One relinearization per output: the two products are summed first.
    assert packed.counts["relinearize"] == 2 and packed.counts["cipher_mul"] == 4

    def skipped(self, seal, ct):  # what the circuit did before 2026-12-02: no relinearization
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PackedCKKSModuleFusionChannel, "_relinearize", skipped)
        _, _, skipping = _channels()
        with pytest.raises(RuntimeError, match="3 components"):
            skipping.forward(_q(rng), outputs=["A", "B"], train=False)
        # The masked exchange's product E = G Q is refused the same way.
        with pytest.raises(RuntimeError, match="3 components"):
            skipping._masked_regions(
                _returned_product(skipping, _q(rng)), "B", [(0, B * N)], 0, S * B * N, B * N
            )


def _returned_product(channel, q):
    """``E = G Q`` for owner B as the backward computes it, not relinearized."""
    from securefed.fusion.ckks_packed import _Returned

    seal = channel._seal("B")
    x = {p: v.numpy().astype(np.float64).reshape(-1) for p, v in q.items()}
    g = channel.keys["B"].encrypt_gradient_regions(np.ones_like(x["B"]), x["B"], 3)
    other = channel.keys["A"].encrypt_other_regions(x["A"], channel.keys["B"].public)
    product = seal.rescaled(seal.times(g.data.ciphertext()[0], other.data.ciphertext()[0]))
    return _Returned(product, g.size())


def _components(handed) -> int:
    """The component count of a ciphertext the server hands a party (TenSEAL's or SEAL's)."""
    if isinstance(handed, ts.CKKSVector):
        return handed.data.ciphertext()[0].size()
    return handed.ciphertext.size()


def test_kept_encodings_follow_the_weights(torch_one_thread):
    """The server keeps its coefficient encodings between inquiries (issue 34, acting): a
    second acting inquiry on the same weights encodes only its re-randomizers' noise; after the
    weights move, the next one encodes anew and still equals plaintext on the new weights
    within the stated bound (a stale encoding would give the old weights' outputs)."""
    plain, _, packed = _channels()
    rng = np.random.default_rng(11)

    def acting(q):
        return {p: v.numpy()[:, :1] for p, v in q.items()}

    def encodings():
        return sum(e.encodings for e in packed._evaluators.values())

    packed.forward(acting(_q(rng)), train=False)
    before = encodings()
    packed.forward(acting(_q(rng)), train=False)
    assert encodings() - before == 2  # the two re-randomizers' noise, nothing else
    q = acting(_q(rng))
    old = {p: np.asarray(v) for p, v in plain.forward(q, train=False).items()}
    with torch.no_grad():
        for channel in (plain, packed):
            for parameter in channel.module.parameters():
                parameter.mul_(0.5)
    before = encodings()
    encrypted = packed.forward(q, train=False)
    assert encodings() - before > 2
    clear = plain.forward(q, train=False)
    bounds = packed.error_bounds()["output"]
    for p in "AB":
        new, fused = np.asarray(clear[p]), np.asarray(encrypted[p])
        assert np.all(np.abs(fused - new).max(axis=(1, 2)) <= bounds)
        # What stale encodings would give (the old weights' outputs) is far outside the bound.
        assert np.all(np.abs(old[p] - new).max(axis=(1, 2)) > 100 * bounds)
