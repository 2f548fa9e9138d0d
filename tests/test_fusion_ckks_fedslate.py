"""FedSlate's server network under CKKS: one key per platform, members packed, Adam through the
masked exchange (securefed.fusion.ckks_module, securefed.fusion.expansion)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ts = pytest.importorskip("tenseal")
pytest.importorskip("gymnasium")

from securefed import SeedTree  # noqa: E402
from securefed.crypto.ckks import Flooding, PublicContext  # noqa: E402
from securefed.fusion import FusionNotApplicable, ModuleFusionChannel, fusion_refusal  # noqa: E402
from securefed.fusion.ckks_module import (  # noqa: E402
    CKKSModuleConfig,
    CKKSModuleFusionChannel,
    masked_sum_error_bound,
)
from securefed.fusion.expansion import (  # noqa: E402
    PolynomialNetwork,
    evaluate_numpy,
    expand,
    monomials,
)
from securefed.rl.fedslate import (  # noqa: E402
    CKKS_SCALE_BITS,
    LEARN,
    FedSlateConfig,
    ServerNetwork,
    ckks_config,
    run_fedslate,
    start_run,
)

S, B, N = 3, 32, 10  # FedSlate's (10, 3) learning batch: 3 members, 32 rows, 10 candidates
EXACT = CKKSModuleConfig(flooding=Flooding.unsafe_for_tests(0.0, 0.0))


def _server(hidden=(16,), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return ServerNetwork(S, 2, N, hidden, activation="polynomial", generator=generator)


def _pair(config=EXACT, hidden=(16,)):
    """The same server behind the plaintext and the CKKS channel (SGD, lr 1: the step is the
    gradient)."""
    plain_net, ckks_net = _server(hidden), _server(hidden)
    plain = ModuleFusionChannel(
        ("A", "B"), plain_net, torch.optim.SGD(plain_net.parameters(), lr=1.0),
        target=copy.deepcopy(plain_net), members=S,
    )  # fmt: skip
    ckks = CKKSModuleFusionChannel(
        ("A", "B"), ckks_net, torch.optim.SGD(ckks_net.parameters(), lr=1.0),
        target=copy.deepcopy(ckks_net), members=S, seeds=SeedTree(3), config=config,
    )  # fmt: skip
    return plain, ckks


@pytest.fixture(scope="module")
def pair(torch_one_thread):
    return _pair()


def _q(rng, scale=1.0):
    return {p: torch.from_numpy(rng.normal(0, scale, (S, B, N)).astype(np.float32)) for p in "AB"}


def test_the_expansion_is_the_network(torch_one_thread):
    rng = np.random.default_rng(0)
    for hidden in ((16,), (16, 16), (4, 3, 2)):
        net = _server(hidden).double()
        coefficients = expand(net.polynomial_network()).detach().numpy()
        assert coefficients.shape == (S, len(monomials(2, 2 ** len(hidden))))
        x = rng.normal(size=(S, B, N, 2))
        ours = evaluate_numpy(coefficients, x.reshape(S, B * N, 2)).reshape(S, B, N)
        theirs = net([torch.from_numpy(x[..., 0]), torch.from_numpy(x[..., 1])])
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="it must have 1"):
        PolynomialNetwork([(torch.zeros(1, 2, 3), torch.zeros(1, 1, 3))], (0.0, 1.0))


def test_the_server_context_cannot_decrypt_a_q_value_ciphertext(pair):
    _, ckks = pair
    q = np.random.default_rng(1).normal(size=S * B * N)
    [ciphertext] = ckks.keys["A"].encrypt_for(q, ckks.keys["A"])
    server = ckks.server_contexts["A"]
    assert isinstance(server, PublicContext) and not hasattr(server, "decrypt")
    assert not server.tenseal.has_secret_key()
    ciphertext.link_context(server.tenseal)  # what the server holds
    with pytest.raises(ValueError, match="secret_key"):
        ciphertext.decrypt()
    with pytest.raises(ValueError):
        server.tenseal.secret_key()
    # The other platform's key opens nothing of A's: its decryption is garbage, not A's values.
    ckks._to_party(ciphertext, "B")
    garbage = ckks.keys["B"].decrypt([ciphertext], len(q))
    assert np.abs(garbage - q).min() > 1e3
    # What B receives in a fusion for B are its fused values: never a ciphertext of Q_A alone.
    assert set(ckks.view.parties) == {"A", "B"}


def test_ckks_fusion_equals_plaintext_within_the_stated_error(pair):
    plain, ckks = pair
    rng = np.random.default_rng(2)
    q = _q(rng)
    bounds = ckks.error_bounds()
    clear = plain.forward(q, outputs=["A", "B"], train=False)
    encrypted = ckks.forward(q, outputs=["A", "B"], train=False)
    for p in "AB":
        gap = np.abs(encrypted[p].numpy() - clear[p].numpy()).max(axis=(1, 2))
        assert np.all(gap <= bounds["output"]) and gap.max() < 1e-3
    # Numpy in, numpy out (acting); target network = online before any step.
    acting = ckks.forward({p: v.numpy()[:, :1] for p, v in q.items()}, train=False)
    assert isinstance(acting["A"], np.ndarray) and acting["A"].shape == (S, 1, N)
    target = ckks.forward(q, outputs=["B"], network="target", train=False)["B"]
    assert target.dtype == torch.float32
    np.testing.assert_allclose(target.numpy(), clear["B"].numpy(), atol=1e-3)


def test_the_training_update_equals_plaintext_within_the_stated_error(torch_one_thread):
    plain, ckks = _pair()
    rng = np.random.default_rng(4)
    q = _q(rng)
    positions = {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    grad = torch.from_numpy(rng.uniform(-1, 1, (S, B, 3)).astype(np.float32)) / B
    before = [p.detach().clone() for p in ckks.module.parameters()]
    bounds = ckks.error_bounds()
    out_plain = plain.forward(q, outputs=["B"], positions=positions)["B"]
    out_ckks = ckks.forward(q, outputs=["B"], positions=positions)["B"]
    assert out_ckks.shape == (S, B, 3)
    assert np.abs(out_plain.numpy() - out_ckks.numpy()).max() < 1e-3
    dx_plain = plain.backward({"B": grad}, recipients=["B"])["B"]
    dx_ckks = ckks.backward({"B": grad}, recipients=["B"])["B"]
    gap = np.abs(dx_plain.numpy() - dx_ckks.numpy()).max(axis=(1, 2))
    assert np.all(gap <= bounds["input_gradient"]) and gap.max() < 1e-4
    # The released batch sums against the exact ones: within the masked-sum bound.
    full = np.zeros((S, B, N))
    np.add.at(full, (np.arange(S)[:, None, None], np.arange(B)[None, :, None],
                     positions["B"].numpy()), grad.numpy().astype(np.float64))  # fmt: skip
    x = np.stack([q["B"].numpy(), q["A"].numpy()], axis=-1).astype(np.float64)
    basis = monomials(2, 2)
    exact = np.stack(
        [(full * np.prod(x ** np.array(m), axis=-1)).sum(axis=(1, 2)) for m in basis], axis=1
    )
    bound = masked_sum_error_bound(ckks.base_error, 2, 8.0, 1.0, B * N)
    assert np.abs(ckks.last_sums - exact).max() <= bound
    # The update (SGD, lr 1: minus the gradient) equals back-propagation through the network.
    for weight_plain, weight_ckks, start in zip(
        plain.module.parameters(), ckks.module.parameters(), before, strict=True
    ):
        np.testing.assert_allclose(
            weight_ckks.detach().numpy(), weight_plain.detach().numpy(), atol=1e-5
        )
        assert not torch.equal(weight_ckks.detach(), start)


def test_flooding_follows_the_stated_bound_and_refuses_less(torch_one_thread):
    _, ckks = _pair(config=CKKSModuleConfig())
    bound, std = ckks.flooding_std(B * N)
    assert bound == masked_sum_error_bound(ckks.base_error, 2, 8.0, 1.0, B * N)
    assert std == pytest.approx(bound * 2 ** ((20 - 1) / 2))
    with pytest.raises(Exception, match="below the floor"):
        _pair(config=CKKSModuleConfig(flooding=Flooding(std=1e-9)))[1].flooding_std(B * N)


def test_a_larger_scale_shrinks_the_flooding_and_the_released_sums_error(torch_one_thread):
    """At 2^55 (ring 16384, one spare prime) every operation errs about 2^15 times less, so the
    flooding that hides the error shrinks with it, at the same 20-bit level: the server's
    released batch sums then carry noise far below their size (FedSlate's server trains on
    nearly exact gradients; docs/fedslate.md section 7)."""
    _, coarse = _pair(config=CKKSModuleConfig())
    plain, fine = _pair(config=CKKSModuleConfig(scale_bits=55))
    assert fine.params.coeff_mod_bit_sizes == (60, 55, 55, 55, 60)
    assert fine.masks.bound == 2.0**16  # the spare prime keeps the masks' room
    _, coarse_std = coarse.flooding_std(B * N)
    bound, fine_std = fine.flooding_std(B * N)
    assert fine_std == pytest.approx(bound * 2 ** ((20 - 1) / 2))
    assert fine_std < coarse_std / 5000
    rng = np.random.default_rng(4)
    q = _q(rng)
    positions = {"B": torch.from_numpy(rng.integers(0, N, (S, B, 3)))}
    grad = torch.from_numpy(rng.uniform(-1, 1, (S, B, 3)).astype(np.float32)) / B
    plain.forward(q, outputs=["B"], positions=positions)
    fine.forward(q, outputs=["B"], positions=positions)
    plain.backward({"B": grad}, recipients=["B"])
    fine.backward({"B": grad}, recipients=["B"])
    full = np.zeros((S, B, N))
    np.add.at(full, (np.arange(S)[:, None, None], np.arange(B)[None, :, None],
                     positions["B"].numpy()), grad.numpy().astype(np.float64))  # fmt: skip
    x = np.stack([q["B"].numpy(), q["A"].numpy()], axis=-1).astype(np.float64)
    exact = np.stack(
        [(full * np.prod(x ** np.array(m), axis=-1)).sum(axis=(1, 2)) for m in monomials(2, 2)],
        axis=1,
    )
    gap = np.abs(fine.last_sums - exact)
    assert gap.max() < 6 * fine_std + bound and 0 < gap.max() < 1e-2
    for weight_plain, weight_fine in zip(
        plain.module.parameters(), fine.module.parameters(), strict=True
    ):
        np.testing.assert_allclose(
            weight_fine.detach().numpy(), weight_plain.detach().numpy(), atol=0.05
        )


def test_values_outside_the_public_bounds_are_refused(pair):
    _, ckks = pair
    rng = np.random.default_rng(5)
    q = _q(rng)
    q["A"][0, 0, 0] = 9.0
    with pytest.raises(ValueError, match=r"party 'A' input reaches .* bound 8"):
        ckks.forward(q, outputs=["A"], train=False)
    q = _q(rng)
    ckks.forward(q, outputs=["A"], positions={"A": torch.zeros(S, B, 1, dtype=torch.long)})
    with pytest.raises(ValueError, match="another party's key"):
        ckks.backward({"A": torch.zeros(S, B, 1)}, recipients=["B"])
    with pytest.raises(ValueError, match="output gradient reaches"):
        ckks.backward({"A": torch.full((S, B, 1), 2.0)}, recipients=["A"])


# ----------------------------------------------------------------------------- FedSlate
TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 1, "members": 2,
    "burn_in": 11, "learn_every": 12, "buffer_size": 16, "batch_size": 4, "local_hidden": (8,),
    "server_hidden": (4,), "seed": 0,  # seeded: the tests compare runs
}  # fmt: skip


def test_fedslate_refuses_ckks_with_a_non_polynomial_activation():
    for activation in ("silu", "relu"):
        config = FedSlateConfig(**TINY, fusion="ckks", activation=activation)
        with pytest.raises(FusionNotApplicable, match=f"'{activation}'"):
            start_run(config)
    flat = FedSlateConfig(**TINY, fusion="ckks", activation="polynomial", server_arch="flat")
    assert "position by position" in fusion_refusal("ckks", flat.fusion_needs())
    tanh = FedSlateConfig(
        **TINY, fusion="ckks", server_activation="polynomial", output_activation="tanh"
    )
    with pytest.raises(FusionNotApplicable, match="output activation 'tanh'"):
        start_run(tanh)


def test_fedslate_takes_the_ckks_scale_on_encrypted_transports_only():
    default = FedSlateConfig(**TINY, fusion="ckks", activation="polynomial")
    assert ckks_config(default).scale_bits == CKKS_SCALE_BITS == 49
    assert ckks_config(default).circuit == "packed"
    fast = FedSlateConfig(**TINY, fusion="ckks", activation="polynomial", ckks_scale_bits=40)
    assert ckks_config(fast).scale_bits == 40
    with pytest.raises(ValueError, match="encrypted transports"):
        FedSlateConfig(**TINY, ckks_scale_bits=55)
    with pytest.raises(ValueError, match="encrypted transports"):
        FedSlateConfig(**TINY, fusion="dp", dp_epsilon=4.0, ckks_scale_bits=55)
    for bad in (29, 60, True, 55.0):
        with pytest.raises(ValueError, match=r"\[30, 59\]"):
            FedSlateConfig(**TINY, fusion="ckks", activation="polynomial", ckks_scale_bits=bad)


def test_fedslate_acts_targets_and_learns_through_the_ckks_channel(torch_one_thread):
    config = FedSlateConfig(**TINY, fusion="ckks", activation="polynomial")
    result = run_fedslate(config)
    view = result.fusion_view
    assert view.channel == "ckks" and view.public["keys"].startswith("one key pair per party")
    assert result.updates == {"local_A": 1, "local_B": 1, "server": 2}
    assert view.count(tag="act") == 12 and view.count(tag="target") == 1
    assert view.count(tag="select") == 1 and view.count(tag=LEARN, kind="backward") == 2
    plain = run_fedslate(FedSlateConfig(**TINY, activation="polynomial"))
    # One learning step at the end of the only episode: the same slates, so the same rewards.
    np.testing.assert_allclose(result.episode_rewards, plain.episode_rewards)
    final = {n: p.detach() for n, p in result.networks["server"].named_parameters()}
    for name, value in plain.networks["server"].named_parameters():
        np.testing.assert_allclose(final[name].numpy(), value.detach().numpy(), atol=0.05)
